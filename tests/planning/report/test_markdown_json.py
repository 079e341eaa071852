"""Markdown for chat/Slack and JSON (+ JSON Schema): same content, valid structure, lossless JSON."""

from __future__ import annotations

import json

import jsonschema

from aegis.planning.report import render_json, render_markdown, report_json_schema
from aegis.schema import PlanReport


def test_markdown_has_sections_lists_and_verdict(example_report):
    md = render_markdown(example_report)
    assert md.splitlines()[2].startswith("**Fits.**")
    for title in ("Model", "Dataset", "Hardware", "What you're training", "VRAM Breakdown", "Recommended Config",
                  "Aggressive Config", "Estimates", "Risks", "Fallbacks"):
        assert f"#### {title}" in md
    assert not any(line.startswith("|") for line in md.splitlines()), "chat Markdown has no tables"
    for c in example_report.recommended.memory.components:
        assert f"- {c.name.split(' (')[0]}" in md and f": {c.bytes / 2**30:.2f} GiB" in md, c.name
        assert c.formula not in md
    fallbacks = md.split("#### Fallbacks")[1].split("####")[0]
    assert [line.split(".")[0] for line in fallbacks.splitlines() if line[:1].isdigit()] == [
        str(i) for i in range(1, len(example_report.fallbacks) + 1)
    ]


def test_markdown_explain_has_every_formula(example_report):
    md = render_markdown(example_report, explain=True)
    for c in example_report.recommended.memory.components:
        assert " ".join(c.formula.split()).replace("*", "\\*") in md, c.key
    assert example_report.dataset.seq_len_reason in md


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
