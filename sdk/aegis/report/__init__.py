"""Rendering a `PlanReport`: terminal text (rich), Markdown, JSON (+ JSON Schema), Slack Block Kit, trainer configs.

Every renderer draws the same sections with the same reasons (`aegis.report._sections`); numbers
are formatted in one place (`aegis.report.format`). Names are imported on first use, so
``aegis.report.json`` costs no rich import and jinja2 loads only when a config is emitted.

    from aegis import plan
    from aegis.report import render_text, render_markdown, render_json, render_blocks, emit
    report = plan("qlora llama-3.1-8b on 3090")
    print(render_text(report))            # plain text for pipes; print_report(report) for colour
    yaml_text = emit(report, "axolotl")   # or "hf", "unsloth"
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

# Bound eagerly: the submodule `emit` shares the function's name, and a lazily bound function would
# lose to the submodule attribute Python sets on the package when `aegis.report.emit` is imported.
# (emit imports jinja2 only when called.)
from aegis.report.emit import EMIT_KINDS, emit

if TYPE_CHECKING:
    from aegis.report.blocks import render_blocks
    from aegis.report.json import render_json, report_json_schema
    from aegis.report.markdown import render_markdown
    from aegis.report.text import print_report, render_text

_EXPORTS = {
    "render_text": "aegis.report.text",
    "print_report": "aegis.report.text",
    "render_markdown": "aegis.report.markdown",
    "render_json": "aegis.report.json",
    "report_json_schema": "aegis.report.json",
    "render_blocks": "aegis.report.blocks",
}

__all__ = [*_EXPORTS, "emit", "EMIT_KINDS"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'aegis.report' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
