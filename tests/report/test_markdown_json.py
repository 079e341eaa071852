"""Markdown for chat/Slack and JSON (+ JSON Schema): same content, valid structure, lossless JSON."""

from __future__ import annotations

import json

import jsonschema

from aegis.report import render_json, render_markdown, report_json_schema
from aegis.report._sections import tiers
from aegis.schema import PlanReport


def _table_rows(md: str, header_start: str) -> list[str]:
    lines = md.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append(line)
    return rows


def _cells(row: str) -> int:
    return len(row.replace("\\|", "").strip("|").split("|"))


def test_markdown_has_sections_tables_and_verdict(example_report):
    md = render_markdown(example_report)
    assert md.splitlines()[2].startswith("**Fits.**")
    for title in ("Model", "Dataset", "Hardware", "What you're training", "VRAM Breakdown", "Recommended Config",
                  "Aggressive Config", "Estimates", "Risks", "Fallbacks"):
        assert f"#### {title}" in md
    breakdown = _table_rows(md, "| Component | Memory | How |")
    for c in example_report.recommended.memory.components:
        assert any(row.startswith(f"| {c.name} | {c.bytes / 2**30:.2f} GiB |") for row in breakdown), c.name
    tier_rows = _table_rows(md, "| Tier |")
    assert len(tier_rows) == len(tiers(example_report))
    assert len({_cells(r) for r in tier_rows}) == 1


def test_markdown_escapes_pipes_in_cells(example_report):
    rec = example_report.recommended.model_copy(update={"summary": "a | b | c"})
    md = render_markdown(example_report.model_copy(update={"recommended": rec}))
    row = next(r for r in _table_rows(md, "| Tier |") if r.startswith("| recommended"))
    assert "a \\| b \\| c" in row and _cells(row) == 12


def test_markdown_nothing_fits(nothing_fits_report):
    md = render_markdown(nothing_fits_report)
    assert "**Does not fit.**" in md and "#### Nothing fits" in md and "| Tier |" not in md


def test_json_round_trips(example_report, nothing_fits_report, multi_gpu_report):
    for report in (example_report, nothing_fits_report, multi_gpu_report):
        text = render_json(report)
        assert PlanReport.model_validate_json(text) == report
        assert "\n" not in render_json(report, indent=None)


def test_json_validates_against_the_exported_schema(example_report, nothing_fits_report):
    schema = report_json_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    for report in (example_report, nothing_fits_report):
        jsonschema.validate(json.loads(render_json(report)), schema)
    bad = json.loads(render_json(example_report))
    bad["recommended"]["config"]["micro_batch_size"] = "four"
    try:
        jsonschema.validate(bad, schema)
    except jsonschema.ValidationError:
        pass
    else:
        raise AssertionError("schema accepted a string micro batch")


def test_schema_describes_the_report():
    schema = report_json_schema()
    assert schema["title"] == "PlanReport"
    assert set(PlanReport.model_fields) == set(schema["properties"])
    assert "Tier" in schema["$defs"] and "MemoryComponent" in schema["$defs"]
