"""Compact Markdown rendering of a `PlanReport` for chat (Gradio) and Slack's markdown block.

A verdict line first, then the same sections as the terminal report as short bullet lists: no
tables, so nothing is squeezed in a narrow chat column (the breakdown and the fallbacks are lists).
With ``explain=True`` each figure carries its formula or reason in italics.

    from aegis.planning.report import render_markdown
    md = render_markdown(report)                 # compact, for chat
    md = render_markdown(report, explain=True)   # with formulas and reasons
"""

from __future__ import annotations

from aegis.planning.report._facts import plan_facts
from aegis.planning.report._layout import Line, Section, Table
from aegis.planning.report._sections import build_sections
from aegis.planning.report.format import (
    RISK_MARKERS,
    format_bytes,
    format_int,
    method_short,
)
from aegis.schema import PlanReport

__all__ = ["render_markdown", "verdict_line"]

def _inline(text: str) -> str:
    return text.replace("*", "\\*").replace("\n", " ")


def verdict_line(report: PlanReport) -> str:
    """One line saying whether the job fits and with what (used as a chat message's first line)."""
    rec = report.recommended
    if rec is None:
        return f"**Does not fit.** {_inline(report.nothing_fits or 'No configuration fits this GPU.')}"
    facts = plan_facts(report)
    cfg, b, f = rec.config, facts.batch, facts.memory
    assert b is not None and f is not None
    return (
        f"**Fits.** Recommended: micro batch {b.micro} x grad accum {b.accum} (effective {b.effective}), "
        f"seq {format_int(cfg.seq_len)}, grad ckpt {'ON' if cfg.gradient_checkpointing else 'OFF'} -> "
        f"{format_bytes(f.total_bytes)} predicted, {format_bytes(f.headroom_bytes, 1)} headroom ({f.verdict})."
    )


def _line(line: Line, risk: bool) -> str:
    if risk:
        head = f"`{RISK_MARKERS.get(line.level or 'ok', '[ok]')}` **{_inline(line.label)}:** "
    elif line.label.endswith("."):
        head = f"{line.label} "
    elif line.label:
        head = f"**{_inline(line.label)}:** "
    else:
        head = ""
    text = head + _inline(line.value)
    if line.reason:
        text += f" — _{_inline(line.reason)}_"
    return f"{line.label} {text[len(head):]}" if line.label.endswith(".") else "- " + text


def _rows(table: Table, explain: bool) -> list[str]:
    """The breakdown as a list (a chat column is too narrow for a three-column table)."""
    out = []
    for row in table.rows:
        amount = f"**{_inline(row.amount)}**" if row.emphasis else _inline(row.amount)
        text = f"- {_inline(row.name)}: {amount}"
        if row.how and (explain or row.emphasis or row.name == "Predicted range"):
            text += f" — _{_inline(row.how)}_"
        out.append(text)
    return out


def _section(section: Section, explain: bool) -> list[str]:
    title = section.title + (f": {section.subtitle}" if section.subtitle and section.key in {"model", "dataset", "hardware"}
                             else (f" {section.subtitle}" if section.subtitle else ""))
    out = [f"#### {_inline(title)}"]
    risk = section.key == "risks"
    for item in section.items:
        if isinstance(item, Table):
            out += _rows(item, explain)
        else:
            out.append(_line(item, risk))
    return out


def render_markdown(report: PlanReport, *, explain: bool = False) -> str:
    """The report as GitHub-flavoured Markdown: headings and bullet lists only (no wide tables), compact
    unless ``explain`` (then every formula and reason)."""
    title = f"### Aegis plan: {method_short(report.method)} {report.model.model_id} on {report.gpu.name}"
    if report.gpu_count > 1:
        title += f" x {report.gpu_count}"
    out = [title, "", verdict_line(report), ""]
    for section in build_sections(report, explain=explain):
        out += _section(section, explain)
        out.append("")
    return "\n".join(out).rstrip() + "\n"
