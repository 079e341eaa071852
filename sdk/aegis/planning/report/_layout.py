"""The report's layout: sections of labelled lines and the memory breakdown table, what every renderer draws.

`aegis.planning.report._sections` decides what a plan says in these terms; the text, Markdown and Slack renderers
only style them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

__all__ = ["Level", "Line", "Row", "Section", "Table"]

Level = Literal["", "ok", "warn", "danger"]


@dataclass(frozen=True)
class Line:
    """One labelled figure and why it is what it is."""

    label: str
    value: str
    reason: str = ""
    level: Level = ""
    key_reason: bool = False
    """The reason carries a decision or a number: the compact report keeps it."""


@dataclass(frozen=True)
class Row:
    """One row of the memory breakdown: name, amount and how it was computed."""

    name: str
    amount: str
    how: str = ""
    emphasis: bool = False


@dataclass(frozen=True)
class Table:
    """The memory breakdown table."""

    columns: tuple[str, str, str]
    rows: tuple[Row, ...]


@dataclass(frozen=True)
class Section:
    """A titled block of the report. ``key`` is stable ('model', 'memory', 'fallbacks', ...)."""

    key: str
    title: str
    subtitle: str = ""
    items: tuple[Line | Table, ...] = field(default_factory=tuple)
    level: Level = ""
