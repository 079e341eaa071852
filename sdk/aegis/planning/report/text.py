"""Terminal rendering of a `PlanReport`: coloured with rich for a terminal, plain for pipes and files (the
plain text is laid out as rich lays it out, without importing rich, so `aegis plan` starts faster).

By default the report is compact (about 60 lines at 100 columns: every decision and number); with
``explain=True`` each figure prints its reason (dimmed) and the memory breakdown each component's
formula. Risks print with ``[ok]``/``[!!]``/``[XX]``
markers that survive a terminal without colour.

    from aegis.planning.report import render_text, print_report
    print(render_text(report))                 # plain text, no ANSI codes (what the CLI pipes)
    render_text(report, color=True)            # with ANSI styles
    render_text(report, explain=True)          # every formula and reason (`aegis plan --explain`)
    print_report(report)                       # to a rich Console (auto-detects the terminal)
"""

from __future__ import annotations

import io
import re
from typing import TYPE_CHECKING

from aegis.planning.report._layout import Line, Section, Table
from aegis.planning.report._sections import build_sections
from aegis.planning.report.format import RISK_MARKERS
from aegis.schema import PlanReport

if TYPE_CHECKING:
    from rich.console import Console, RenderableType
    from rich.table import Table as RichTable
    from rich.text import Text

__all__ = ["render_text", "print_report", "report_renderable"]

_LEVEL_STYLES = {"": "", "ok": "green", "warn": "yellow", "danger": "bold red"}
_INDENT = 2
_NAMED_SECTIONS = {"model", "dataset", "hardware"}
"""Sections whose subtitle is the thing itself ("Model: meta-llama/Llama-3.1-8B")."""
_PLAN_STARTS = {"nothing_fits", "memory"}
"""The compact report leaves a blank line only before these: the job above, the plan below."""


Parts = tuple[tuple[str, str], ...]
"""A cell as (text, rich style) runs: the rich renderer styles them, the plain one joins them."""


def _title_parts(section: Section) -> Parts:
    style = "bold red" if section.level == "danger" else "bold cyan"
    if section.key in _NAMED_SECTIONS and section.subtitle:
        return (section.title, style), (": ", style), (section.subtitle, "bold")
    if section.subtitle:
        return (section.title, style), (" " + section.subtitle, "bold"), (":", style)
    return (section.title, style), (":", style)


def _value_parts(line: Line) -> Parts:
    value = (line.value, _LEVEL_STYLES[line.level] if line.level == "danger" else "")
    return (value, (f"  ({line.reason})", "dim")) if line.reason else (value,)


def _label_parts(line: Line, risk: bool) -> Parts:
    if risk:
        marker = RISK_MARKERS.get(line.level or "ok", "[ok]")
        return (marker, _LEVEL_STYLES[line.level or "ok"]), (f" {line.label}:", "")
    if not line.label:
        return (("", ""),)
    if line.label.endswith("."):
        return ((line.label, _LEVEL_STYLES[line.level] if line.level == "danger" else ""),)
    return ((f"{line.label}:", ""),)


def _text(parts: Parts) -> Text:
    from rich.text import Text

    (first, style), *rest = parts
    text = Text(first, style=style)
    for part, part_style in rest:
        text.append(part, style=part_style)
    return text


def _title(section: Section) -> Text:
    return _text(_title_parts(section))


def _value_cell(line: Line) -> Text:
    return _text(_value_parts(line))


def _label_cell(line: Line, risk: bool) -> Text:
    return _text(_label_parts(line, risk))


def _lines_grid(lines: list[Line], risk: bool) -> RichTable:
    from rich.table import Table as RichTable

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
    from rich.table import Table as RichTable
    from rich.text import Text

    out = RichTable(box=None, show_header=False, padding=(0, 1), pad_edge=False)
    out.add_column(no_wrap=True)
    out.add_column(justify="right", no_wrap=True)
    out.add_column(style="dim", overflow="fold")
    for row in table.rows:
        style = "bold" if row.emphasis else ""
        out.add_row(Text(row.name, style=style), Text(row.amount, style=style), Text(row.how))
    return out


def _section(section: Section) -> RenderableType:
    from rich.console import Group
    from rich.padding import Padding

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
    return _renderable(build_sections(report, explain=explain), explain)


def _renderable(sections: list[Section], explain: bool) -> RenderableType:
    from rich.console import Group
    from rich.text import Text

    blocks: list[RenderableType] = []
    for i, section in enumerate(sections):
        if i and (explain or section.key in _PLAN_STARTS):
            blocks.append(Text(""))
        blocks.append(_section(section))
    return Group(*blocks)


def render_text(report: PlanReport, *, width: int = 100, color: bool = False, explain: bool = False) -> str:
    """The report as text ``width`` columns wide: plain (no ANSI codes) unless ``color``; every formula and
    reason with ``explain``.

    Plain text is laid out here as rich lays out the same renderable (`aegis plan` need not import rich);
    anything this layout does not cover (text wider than a cell can hold, characters other than
    printable ASCII) goes through rich. ``tests/planning/report/test_text.py`` compares the two."""
    sections = build_sections(report, explain=explain)
    if not color:
        lines = _plain_lines(sections, width, explain)
        if lines is not None:
            return "\n".join(lines) + "\n"
    return _rich_text(sections, width=width, color=color, explain=explain)


def _rich_text(sections: list[Section], *, width: int, color: bool, explain: bool) -> str:
    from rich.console import Console

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
    console.print(_renderable(sections, explain))
    return "\n".join(line.rstrip() for line in buffer.getvalue().splitlines()) + "\n"


def print_report(report: PlanReport, console: Console | None = None, *, explain: bool = False) -> None:
    """Print the report to ``console`` (a default rich Console: colour when it is a terminal)."""
    from rich.console import Console

    console = console or Console(highlight=False, emoji=False)
    console.print(report_renderable(report, explain=explain))


# -- plain text without rich: the layout rich gives the renderable above -----------------------------------
# A rich table measures each column (its widest cell plus padding), shrinks the one wrappable column
# (value, or the breakdown's "how") when the total is wider than the space, wraps that column's cells at
# word boundaries (words longer than a line are folded) and pads the rest; `_renderable` puts each table
# under its title, two columns in.

_WORD = re.compile(r"\s*\S+\s*")
"""rich's word: leading spaces, the word, the spaces after it (rich._wrap.re_word)."""


def _plain_ok(text: str) -> bool:
    """One character per terminal cell and no line breaks or tabs: what this layout covers."""
    return text.isascii() and text.isprintable()


def _wrap(text: str, width: int) -> list[str]:
    """``text`` cut into lines of at most ``width`` characters as rich wraps it (divide_line with fold);
    trailing spaces are left for the caller's rstrip."""
    breaks: list[int] = []
    offset = 0
    for match in _WORD.finditer(text):
        start, word = match.start(), match.group()
        length = len(word.rstrip())
        if width - offset >= length:
            offset += len(word)
        elif length > width:  # longer than a line: folded into width-sized pieces
            pieces = [word[i:i + width] for i in range(0, len(word), width)]
            for i, piece in enumerate(pieces):
                if start:
                    breaks.append(start)
                if i == len(pieces) - 1:
                    offset = len(piece)
                else:
                    start += len(piece)
        elif offset and start:
            breaks.append(start)
            offset = len(word)
    bounds = [0, *breaks, len(text)]
    return [text[a:b] for a, b in zip(bounds, bounds[1:])]


def _plain_table(
    rows: list[tuple[str, ...]], pads: list[tuple[int, int]], right: set[int], width: int
) -> list[str] | None:
    """Rows of a rich table without borders whose last column alone wraps: ``pads`` are each column's
    (left, right) padding, ``right`` the right-justified columns. None when the layout needs more than
    shrinking the last column (rich truncates or squeezes every column then)."""
    columns = len(pads)
    widths = []
    for c, (left, right_pad) in enumerate(pads):
        extra = left + right_pad
        if width - extra < 1:
            return None
        cell_max = max(min(len(row[c]), width - extra) + extra if row[c] else extra for row in rows)
        widths.append(min(cell_max, width) or 1)
    excess = sum(widths) - width
    if excess > 0:
        if excess >= widths[-1] or widths[-1] - excess - sum(pads[-1]) < 1:
            return None
        widths[-1] -= excess
    for c in range(columns - 1):  # the no-wrap columns must hold their widest cell
        if max(len(row[c]) for row in rows) > widths[c] - sum(pads[c]):
            return None
    out = []
    inner_last = widths[-1] - sum(pads[-1])
    for row in rows:
        head = []
        for c in range(columns - 1):
            left, right_pad = pads[c]
            inner = widths[c] - left - right_pad
            cell = row[c].rstrip().rjust(inner) if c in right else row[c].ljust(inner)
            head.append(" " * left + cell + " " * right_pad)
        lead = "".join(head) + " " * pads[-1][0]
        for i, piece in enumerate(_wrap(row[-1], inner_last)):
            out.append((lead if i == 0 else " " * len(lead)) + piece)
    return out


def _plain_lines(sections: list[Section], width: int, explain: bool) -> list[str] | None:
    """The report's lines (right-stripped) as rich would print them, or None where rich must lay them out."""
    inner = width - _INDENT
    out: list[str] = []
    for i, section in enumerate(sections):
        if i and (explain or section.key in _PLAN_STARTS):
            out.append("")
        title = "".join(part for part, _ in _title_parts(section))
        if not _plain_ok(title) or width < 1:
            return None
        out += [line.rstrip() for line in _wrap(title, width)]
        blocks: list[list[tuple[str, ...]]] = []
        pads: list[list[tuple[int, int]]] = []
        risk = section.key == "risks"
        pending: list[Line] = []

        def flush() -> None:
            if not pending:
                return
            values = ["".join(part for part, _ in _value_parts(line)) for line in pending]
            if risk or any(line.label for line in pending):  # grid: label, one space, value
                labels = ["".join(part for part, _ in _label_parts(line, risk)) for line in pending]
                blocks.append(list(zip(labels, values)))
                pads.append([(0, 1), (0, 0)])
            else:
                blocks.append([(v,) for v in values])
                pads.append([(0, 0)])
            pending.clear()

        for item in section.items:
            if isinstance(item, Table):
                flush()
                blocks.append([(row.name, row.amount, row.how) for row in item.rows])
                pads.append([(0, 1), (1, 1), (1, 0)])  # padding (0, 1), no padding at the edges
            else:
                pending.append(item)
        flush()
        for rows, block_pads in zip(blocks, pads):
            if not rows:
                continue
            if not all(_plain_ok(cell) for row in rows for cell in row):
                return None
            lines = _plain_table(rows, block_pads, {1} if len(block_pads) == 3 else set(), inner)
            if lines is None:
                return None
            out += [(" " * _INDENT + line).rstrip() for line in lines]
    return out
