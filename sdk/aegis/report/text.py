"""Terminal rendering of a `PlanReport` with rich: coloured for a terminal, plain for pipes and files.

By default the report is compact (about 60 lines at 100 columns: every decision and number); with
``explain=True`` each figure prints its reason (dimmed) and the memory breakdown each component's
formula. Risks print with ``[ok]``/``[!!]``/``[XX]``
markers that survive a terminal without colour.

    from aegis.report import render_text, print_report
    print(render_text(report))                 # plain text, no ANSI codes (what the CLI pipes)
    render_text(report, color=True)            # with ANSI styles
    render_text(report, explain=True)          # every formula and reason (`aegis plan --explain`)
    print_report(report)                       # to a rich Console (auto-detects the terminal)
"""

from __future__ import annotations

import io

from rich.console import Console, Group, RenderableType
from rich.padding import Padding
from rich.table import Table as RichTable
from rich.text import Text

from aegis.report._sections import Line, Section, Table, build_sections
from aegis.report.format import RISK_MARKERS
from aegis.schema import PlanReport

__all__ = ["render_text", "print_report", "report_renderable"]

_LEVEL_STYLES = {"": "", "ok": "green", "warn": "yellow", "danger": "bold red"}
_INDENT = 2
_NAMED_SECTIONS = {"model", "dataset", "hardware"}
"""Sections whose subtitle is the thing itself ("Model: meta-llama/Llama-3.1-8B")."""
_PLAN_STARTS = {"nothing_fits", "memory"}
"""The compact report leaves a blank line only before these: the job above, the plan below."""


def _title(section: Section) -> Text:
    style = "bold red" if section.level == "danger" else "bold cyan"
    text = Text(section.title, style=style)
    if section.key in _NAMED_SECTIONS and section.subtitle:
        text.append(": ", style=style)
        text.append(section.subtitle, style="bold")
        return text
    if section.subtitle:
        text.append(" " + section.subtitle, style="bold")
    text.append(":", style=style)
    return text


def _value_cell(line: Line) -> Text:
    text = Text(line.value, style=_LEVEL_STYLES[line.level] if line.level == "danger" else "")
    if line.reason:
        text.append(f"  ({line.reason})", style="dim")
    return text


def _label_cell(line: Line, risk: bool) -> Text:
    if risk:
        marker = RISK_MARKERS.get(line.level or "ok", "[ok]")
        text = Text(marker, style=_LEVEL_STYLES[line.level or "ok"])
        text.append(f" {line.label}:")
        return text
    if not line.label:
        return Text("")
    if line.label.endswith("."):
        return Text(line.label, style=_LEVEL_STYLES[line.level] if line.level == "danger" else "")
    return Text(f"{line.label}:")


def _lines_grid(lines: list[Line], risk: bool) -> RichTable:
    grid = RichTable.grid(padding=(0, 1))
    labelled = risk or any(line.label for line in lines)
    if labelled:
        grid.add_column(no_wrap=True)
    grid.add_column(overflow="fold")
    for line in lines:
        cells = (_label_cell(line, risk), _value_cell(line)) if labelled else (_value_cell(line),)
        grid.add_row(*cells)
    return grid


def _breakdown(table: Table) -> RichTable:
    out = RichTable(box=None, show_header=False, padding=(0, 1), pad_edge=False)
    out.add_column(no_wrap=True)
    out.add_column(justify="right", no_wrap=True)
    out.add_column(style="dim", overflow="fold")
    for row in table.rows:
        style = "bold" if row.emphasis else ""
        out.add_row(Text(row.name, style=style), Text(row.amount, style=style), Text(row.how))
    return out


def _section(section: Section) -> RenderableType:
    parts: list[RenderableType] = [_title(section)]
    pending: list[Line] = []
    risk = section.key == "risks"

    def flush() -> None:
        if pending:
            parts.append(Padding(_lines_grid(list(pending), risk), (0, 0, 0, _INDENT)))
            pending.clear()

    for item in section.items:
        if isinstance(item, Table):
            flush()
            parts.append(Padding(_breakdown(item), (0, 0, 0, _INDENT)))
        else:
            pending.append(item)
    flush()
    return Group(*parts)


def report_renderable(report: PlanReport, *, explain: bool = False) -> RenderableType:
    """The whole report as one rich renderable: compact (sections back to back, the job's inputs apart
    from the plan), or with every formula and reason and blank lines between sections when ``explain``."""
    blocks: list[RenderableType] = []
    for i, section in enumerate(build_sections(report, explain=explain)):
        if i and (explain or section.key in _PLAN_STARTS):
            blocks.append(Text(""))
        blocks.append(_section(section))
    return Group(*blocks)


def render_text(report: PlanReport, *, width: int = 100, color: bool = False, explain: bool = False) -> str:
    """The report as text ``width`` columns wide: plain (no ANSI codes) unless ``color``; every formula and
    reason with ``explain``."""
    buffer = io.StringIO()
    console = Console(
        file=buffer,
        width=width,
        force_terminal=color,
        no_color=not color,
        color_system="truecolor" if color else None,
        highlight=False,
        emoji=False,
        markup=False,
        legacy_windows=False,
    )
    console.print(report_renderable(report, explain=explain))
    return "\n".join(line.rstrip() for line in buffer.getvalue().splitlines()) + "\n"


def print_report(report: PlanReport, console: Console | None = None, *, explain: bool = False) -> None:
    """Print the report to ``console`` (a default rich Console: colour when it is a terminal)."""
    console = console or Console(highlight=False, emoji=False)
    console.print(report_renderable(report, explain=explain))
