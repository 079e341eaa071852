"""Rendering a `PlanReport`: terminal text (rich), Markdown, JSON (+ JSON Schema), Slack Block Kit, trainer configs.

Every renderer draws the same sections with the same reasons (`aegis.planning.report._sections`); numbers
are formatted in one place (`aegis.planning.report.format`). Names are imported on first use, so
``aegis.planning.report.json`` costs no rich import and jinja2 loads only when a config is emitted.

    from aegis import plan
    from aegis.planning.report import render_text, render_markdown, render_json, render_blocks, emit
    report = plan("qlora llama-3.1-8b on 3090")
    print(render_text(report))            # plain text for pipes; print_report(report) for colour
    yaml_text = emit(report, "axolotl")   # or "hf", "unsloth"
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

# Bound eagerly: the submodule `emit` shares the function's name, and a lazily bound function would
# lose to the submodule attribute Python sets on the package when `aegis.planning.report.emit` is imported.
# (emit imports jinja2 only when called.)
from aegis.planning.report.emit import EMIT_KINDS, emit

if TYPE_CHECKING:
    from aegis.planning.report.blocks import render_blocks
    from aegis.planning.report.json import render_json, report_json_schema
    from aegis.planning.report.markdown import render_markdown
    from aegis.planning.report.text import print_report, render_text

_EXPORTS = {
    "render_text": "aegis.planning.report.text",
    "print_report": "aegis.planning.report.text",
    "render_markdown": "aegis.planning.report.markdown",
    "render_json": "aegis.planning.report.json",
    "report_json_schema": "aegis.planning.report.json",
    "render_blocks": "aegis.planning.report.blocks",
}

__all__ = [*_EXPORTS, "emit", "EMIT_KINDS"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'aegis.planning.report' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
