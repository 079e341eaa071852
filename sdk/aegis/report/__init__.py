"""Rendering a `PlanReport`: terminal text (rich), Markdown, JSON (+ JSON Schema), Slack Block Kit, trainer configs.

Every renderer draws the same sections with the same reasons (`aegis.report._sections`); numbers
are formatted in one place (`aegis.report.format`). Importing this package pulls in rich and
pydantic only; jinja2 is imported when a trainer config is emitted.

    from aegis import plan
    from aegis.report import render_text, render_markdown, render_json, render_blocks, emit
    report = plan("qlora llama-3.1-8b on 3090")
    print(render_text(report))            # plain text for pipes; print_report(report) for colour
    yaml_text = emit(report, "axolotl")   # or "hf", "unsloth"
"""

from aegis.report.blocks import render_blocks
from aegis.report.emit import EMIT_KINDS, emit
from aegis.report.json import render_json, report_json_schema
from aegis.report.markdown import render_markdown
from aegis.report.text import print_report, render_text

__all__ = [
    "render_text",
    "print_report",
    "render_markdown",
    "render_json",
    "report_json_schema",
    "render_blocks",
    "emit",
    "EMIT_KINDS",
]
