"""The SDK tools: pydantic schemas, docstring descriptions, SDK renderers, expected failures as replies."""

from __future__ import annotations

from pathlib import Path

import aegis
import pytest
from aegis.planning.report import render_markdown
from aegis_agent import TOOL_NAMES, AegisToolkit, AgentSettings, RunManager, explain_component


@pytest.fixture
def toolkit(tmp_path: Path) -> AegisToolkit:
    return AegisToolkit(RunManager(AgentSettings(runs_dir=str(tmp_path / "runs")), compile_cache=False))


def _call(toolkit: AegisToolkit, name: str, args: dict) -> tuple[str, dict]:
    tool = {t.name: t for t in toolkit.tools()}[name]
    msg = tool.invoke({"type": "tool_call", "name": name, "args": args, "id": "c1"})
    return msg.content, msg.artifact


def test_every_tool_has_a_schema_and_a_description(toolkit: AegisToolkit) -> None:
    tools = toolkit.tools()
    assert [t.name for t in tools] == list(TOOL_NAMES)
    for t in tools:
        assert len(t.description) > 30, t.name
        assert t.args_schema.model_json_schema()["type"] == "object"
    plan_schema = tools[0].args_schema.model_json_schema()["properties"]
    assert {"model", "method", "gpu", "lora_rank", "dataset"} <= set(plan_schema)


def test_plan_tool_renders_the_sdk_markdown(toolkit: AegisToolkit) -> None:
    content, artifact = _call(toolkit, "plan_finetune", {"model": "llama-3.1-8b", "method": "qlora", "gpu": "3090"})
    report = aegis.plan("qlora llama-3.1-8b on 3090")
    assert content == render_markdown(report)
    assert artifact == {
        "request": report.request.model_dump(exclude_none=True),
        "fits": True,
        "total_bytes": report.recommended.memory.total_bytes,
    }


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ({"model": "llama-3.1-8b", "method": "qlora", "gpu": "3900"}, "unknown GPU '3900'"),
        ({"model": "lama-8b", "gpu": "3090"}, "unknown model"),
        ({"model": "llama-3.1-8b"}, "no GPU named"),
    ],
)
def test_plan_failures_come_back_as_text(toolkit: AegisToolkit, args: dict, expected: str) -> None:
    content, artifact = _call(toolkit, "plan_finetune", args)
    assert content.startswith("I could not plan that:") and expected in content and "error" in artifact


def test_nothing_fits_says_what_would(toolkit: AegisToolkit) -> None:
    content, artifact = _call(toolkit, "plan_finetune", {"model": "llama-3.1-70b", "method": "full", "gpu": "3090"})
    assert "Does not fit" in content and "What would fit" in content and artifact["fits"] is False
    content, artifact = _call(
        toolkit, "start_run", {"request": {"model": "llama-3.1-70b", "method": "full", "gpu": "3090"}}
    )
    assert content.startswith("Nothing fits") and artifact == {"error": "nothing fits"}


def test_explain_names_size_formula_and_share() -> None:
    report = aegis.plan("qlora llama-3.1-8b on 3090")
    opt = report.recommended.memory.component("optimizer")
    text, comp = explain_component(report, "optimizer states")
    assert comp == opt
    assert f"{opt.bytes / 2**30:.2f} GiB" in text and opt.formula in text and opt.note in text
    assert f"{opt.bytes / report.recommended.memory.total_bytes:.0%}" in text
    for c in report.recommended.memory.components:  # every line can be asked for by its own name
        assert explain_component(report, c.name)[1] == c
    text, comp = explain_component(report, "flux capacitor")
    assert comp is None and "Optimizer states" in text


def test_run_tools_without_runs_are_helpful(toolkit: AegisToolkit) -> None:
    assert _call(toolkit, "run_status", {})[0].startswith("No runs yet")
    content, artifact = _call(toolkit, "send_run_command", {"command": "resume", "run_id": "nope"})
    assert content.startswith("Not sent: unknown run id 'nope'") and "error" in artifact


def test_catalog_listings(toolkit: AegisToolkit) -> None:
    models, _ = _call(toolkit, "list_models", {})
    gpus, _ = _call(toolkit, "list_gpus", {})
    assert "meta-llama/Llama-3.1-8B" in models
    assert all(g.id in gpus for g in aegis.list_gpus())
