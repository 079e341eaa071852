"""JSON rendering of a `PlanReport` and the JSON Schema it follows (for other tools and front ends).

The JSON is pydantic's own serialisation, so it round-trips: ``PlanReport.model_validate_json``
reads back an equal report. All memory figures stay in bytes (``*_bytes``).

    from aegis.planning.report import render_json, report_json_schema
    text = render_json(report)                        # indented JSON
    schema = report_json_schema()                     # dict, JSON Schema draft 2020-12
"""

from __future__ import annotations

from typing import Any

from aegis.schema import PlanReport

__all__ = ["render_json", "report_json_schema", "SCHEMA_ID"]

SCHEMA_ID = "https://aegis.dev/schema/plan-report.json"
"""``$id`` of the exported schema."""


def render_json(report: PlanReport, *, indent: int | None = 2) -> str:
    """The report as JSON (``indent=None`` for one line)."""
    return report.model_dump_json(indent=indent)


def report_json_schema() -> dict[str, Any]:
    """JSON Schema (draft 2020-12) of `PlanReport`, as it serialises."""
    schema = PlanReport.model_json_schema(mode="serialization")
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": SCHEMA_ID, **schema}
