"""Compact Markdown rendering of a `PlanReport` for chat (Gradio) and Slack's markdown block.

A verdict line first, then the same sections as the terminal report as short bullet lists (each
figure with its reason in italics), the memory breakdown and the tiers as tables.

    from aegis.report import render_markdown
    md = render_markdown(report)
"""

from __future__ import annotations

from aegis.report._sections import Line, Section, Table, build_sections, tiers
from aegis.report.format import RISK_MARKERS, format_bytes, format_int, headroom_verdict, method_short
from aegis.schema import PlanReport, Tier

__all__ = ["render_markdown", "verdict_line"]

def _cell(text: str) -> str:
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", "<br>")


def _inline(text: str) -> str:
    return text.replace("*", "\\*").replace("\n", " ")


def verdict_line(report: PlanReport) -> str:
    """One line saying whether the job fits and with what (used as a chat message's first line)."""
    rec = report.recommended
    if rec is None:
        return f"**Does not fit.** {_inline(report.nothing_fits or 'No configuration fits this GPU.')}"
    cfg = rec.config
    return (
        f"**Fits.** Recommended: micro batch {cfg.micro_batch_size} x grad accum {cfg.gradient_accumulation_steps}, "
        f"seq {format_int(cfg.seq_len)}, grad ckpt {'ON' if cfg.gradient_checkpointing else 'OFF'} -> "
        f"{format_bytes(rec.memory.total_bytes)} predicted, {format_bytes(rec.headroom_bytes, 1)} headroom "
        f"({headroom_verdict(rec.headroom_bytes)})."
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


def _table(table: Table) -> list[str]:
    out = [f"| {' | '.join(table.columns)} |", "|---|--:|---|"]
    for row in table.rows:
        name, amount = (f"**{_cell(row.name)}**", f"**{_cell(row.amount)}**") if row.emphasis else (_cell(row.name), _cell(row.amount))
        out.append(f"| {name} | {amount} | {_cell(row.how)} |")
    return out


def _tier_row(report: PlanReport, tier: Tier) -> str:
    cfg = tier.config
    rank = f"{cfg.lora_config.rank}" if cfg.method != "full" else "-"
    cells = [
        tier.name,
        method_short(cfg.method),
        rank,
        str(cfg.micro_batch_size),
        str(cfg.gradient_accumulation_steps),
        str(cfg.effective_batch_size * report.gpu_count),
        format_int(cfg.seq_len),
        "ON" if cfg.gradient_checkpointing else "OFF",
        cfg.optimizer + (" + chunked CE" if cfg.chunked_cross_entropy else ""),
        format_bytes(tier.memory.high_bytes, 1),
        format_bytes(tier.headroom_bytes, 1) + ("" if tier.fits else " (does not fit)"),
        tier.summary,
    ]
    return "| " + " | ".join(_cell(c) for c in cells) + " |"


def _tiers_table(report: PlanReport) -> list[str]:
    head = ["Tier", "Method", "Rank", "Micro batch", "Grad accum", "Effective", "Seq", "Grad ckpt", "Optimizer",
            "Predicted (high)", "Headroom", "Why"]
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    out += [_tier_row(report, t) for t in tiers(report)]
    return out


def _section(section: Section) -> list[str]:
    title = section.title + (f": {section.subtitle}" if section.subtitle and section.key in {"model", "dataset", "hardware"}
                             else (f" {section.subtitle}" if section.subtitle else ""))
    out = [f"#### {_inline(title)}"]
    risk = section.key == "risks"
    for item in section.items:
        if isinstance(item, Table):
            out += ["", *_table(item), ""]
        else:
            out.append(_line(item, risk))
    return out


def render_markdown(report: PlanReport) -> str:
    """The report as GitHub-flavoured Markdown (headings, bullets, two tables)."""
    title = f"### Aegis plan: {method_short(report.method)} {report.model.model_id} on {report.gpu.name}"
    if report.gpu_count > 1:
        title += f" x {report.gpu_count}"
    out = [title, "", verdict_line(report), ""]
    for section in build_sections(report):
        out += _section(section)
        out.append("")
    if tiers(report):
        out += ["#### All tiers", *_tiers_table(report), ""]
    return "\n".join(out).rstrip() + "\n"
