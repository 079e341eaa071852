"""Slack Block Kit output: known block types within Block Kit's limits, and a working Start run button."""

from __future__ import annotations

from aegis.planning.report import render_blocks
from aegis.planning.report.blocks import LIMITS, START_RUN_ACTION_ID
from aegis.schema import PlanRequest

_TYPES = {"header", "section", "divider", "context", "actions"}


def _check(blocks: list[dict]) -> None:
    assert 0 < len(blocks) <= LIMITS["blocks"]
    for block in blocks:
        assert block["type"] in _TYPES
        if block["type"] == "header":
            assert block["text"]["type"] == "plain_text"
            assert 0 < len(block["text"]["text"]) <= LIMITS["header_text"]
        if block["type"] == "section":
            assert "text" in block or "fields" in block
            if "text" in block:
                assert block["text"]["type"] == "mrkdwn"
                assert 0 < len(block["text"]["text"]) <= LIMITS["section_text"]
            for field in block.get("fields", []):
                assert field["type"] == "mrkdwn" and 0 < len(field["text"]) <= LIMITS["field_text"]
            assert len(block.get("fields", [])) <= LIMITS["fields"]
        if block["type"] == "context":
            assert 0 < len(block["elements"]) <= LIMITS["context_elements"]
            assert all(len(e["text"]) <= LIMITS["section_text"] for e in block["elements"])
        if block["type"] == "actions":
            for element in block["elements"]:
                assert element["type"] == "button"
                assert len(element["text"]["text"]) <= LIMITS["button_text"]
                assert len(element["value"]) <= LIMITS["button_value"]
                assert len(element["action_id"]) <= 255


def test_blocks_are_valid_and_start_the_planned_request(example_report):
    blocks = render_blocks(example_report)
    _check(blocks)
    assert blocks[0]["type"] == "header"
    actions = [b for b in blocks if b["type"] == "actions"]
    assert len(actions) == 1
    button = actions[0]["elements"][0]
    assert button["action_id"] == START_RUN_ACTION_ID == "start_run"
    assert PlanRequest.model_validate_json(button["value"]) == example_report.request
    text = "\n".join(b["text"]["text"] for b in blocks if b["type"] == "section" and "text" in b)
    assert "VRAM breakdown" in text and "*Recommended*" in text and "*Risks*" in text
    for c in example_report.recommended.memory.components:
        assert c.name.split(" (")[0] in text


def test_mrkdwn_is_escaped(example_report):
    rec = example_report.recommended.model_copy(update={"summary": "needs <b> & more"})
    blocks = render_blocks(example_report.model_copy(update={"recommended": rec}))
    text = "\n".join(b["text"]["text"] for b in blocks if b["type"] == "section" and "text" in b)
    assert "needs &lt;b&gt; &amp; more" in text and "<b>" not in text


def test_nothing_fits_has_no_start_button(nothing_fits_report):
    blocks = render_blocks(nothing_fits_report)
    _check(blocks)
    assert not [b for b in blocks if b["type"] == "actions"]
    assert "Does not fit" in blocks[1]["text"]["text"]


def test_limits_hold_for_long_reports(example_report):
    long = "x" * 2500
    fallbacks = tuple(t.model_copy(update={"summary": long}) for t in example_report.fallbacks) * 10
    blocks = render_blocks(example_report.model_copy(update={"fallbacks": fallbacks}))
    _check(blocks)
    assert any("more in the full report" in b["text"]["text"] for b in blocks if b["type"] == "section" and "text" in b)
