"""Questions about the last plan, answered from the plan itself; the same questions through the optional LLM path
(pydantic-ai FunctionModel, no network)."""

from __future__ import annotations

from pathlib import Path

import aegis
import pytest
from aegis.planning.planner import plan_request
from aegis.planning.report.format import format_bytes
from aegis.schema import PlanRequest
from aegis_agent import AgentSettings, ChatAgent, RequestExtractor, understand
from aegis_agent.questions import PlanQuestion, answer, classify
from pydantic_ai.messages import ModelMessage, ModelResponse, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

CURRENT = PlanRequest(model="meta-llama/Llama-3.1-8B", method="qlora", gpu="rtx-3090")

ASKED = {
    "what eats the most memory?": "largest_component",
    "which component is largest?": "largest_component",
    "Where does all the memory go?": "largest_component",
    "what's the biggest part": "largest_component",
    "why checkpointing?": "why_checkpointing",
    "why is gradient checkpointing on?": "why_checkpointing",
    "do I need checkpointing?": "why_checkpointing",
    "how long will it take?": "time_and_cost",
    "how much will it cost?": "time_and_cost",
}


@pytest.mark.parametrize("text,kind", ASKED.items())
def test_questions_about_the_plan_are_understood_without_an_llm(text: str, kind: str) -> None:
    assert classify(text) == kind
    u = understand(text, request=CURRENT)
    assert u.call is not None and u.call.name == "answer_plan_question", u
    assert u.call.args == {"kind": kind, "request": CURRENT.model_dump(exclude_none=True)}
    assert understand(text).call is None and "Plan something first" in understand(text).reply  # no plan yet


@pytest.mark.parametrize("text,change", [
    ("what if I use rank 64?", {"lora_rank": 64}),
    ("what if I use an A100?", {"gpu": "a100-80gb"}),
    ("how long would it take on an h100?", {"gpu": "h100-sxm"}),
])
def test_what_if_is_a_follow_up_plan(text: str, change: dict) -> None:
    u = understand(text, request=CURRENT)
    assert u.call is not None and u.call.name == "plan_finetune"
    assert u.call.args == {**CURRENT.model_dump(exclude_none=True), **change}


@pytest.mark.parametrize("text", ["qlora llama-3.1-8b on 3090", "full llama-3.2-1b on a100 80gb",
                                  "lora qwen2.5-7b on 2x a100 40gb"])
def test_largest_component_is_the_largest_line_of_the_breakdown(text: str) -> None:
    report = aegis.plan(text)
    mem = report.recommended.memory
    lines = [(c.name, c.bytes) for c in mem.components if c.in_peak] + [("Runtime overhead", mem.overhead_bytes)]
    name, size = max(lines, key=lambda x: x[1])
    reply = answer(report, "largest_component")
    assert reply.startswith(f"**{name}") and f"**{format_bytes(size)}**" in reply
    assert f"{size / mem.total_bytes:.0%} of the {format_bytes(mem.total_bytes)}" in reply
    for n, b in lines:  # every line of the breakdown, with its size
        assert n in reply and format_bytes(b) in reply


def test_why_checkpointing_compares_with_the_same_job_planned_the_other_way() -> None:
    report = plan_request(CURRENT)
    rec = report.recommended
    other = plan_request(CURRENT.model_copy(update={"gradient_checkpointing": not rec.config.gradient_checkpointing}))
    reply = answer(report, "why_checkpointing", replan=plan_request)
    state = "ON" if rec.config.gradient_checkpointing else "OFF"
    assert f"Gradient checkpointing is **{state}**" in reply
    alt = other.recommended
    if alt is None:
        assert "nothing fits" in reply
    else:
        assert f"micro batch {alt.config.micro_batch_size} at {format_bytes(alt.memory.total_bytes)}" in reply
        assert f"{rec.relative_speed / alt.relative_speed:.2f}x" in reply
    forced = plan_request(CURRENT.model_copy(update={"gradient_checkpointing": True}))
    assert "You asked for it on" in answer(forced, "why_checkpointing", replan=plan_request)


def test_time_and_cost_quote_the_report(tmp_path: Path) -> None:
    data = Path(aegis.__file__).parent / "data" / "examples" / "support.jsonl"
    report = plan_request(CURRENT.model_copy(update={"dataset": str(data)}))
    tp = report.throughput
    reply = answer(report, "time_and_cost")
    assert f"{tp.tokens_per_s_low:,.0f} - {tp.tokens_per_s_high:,.0f} tokens/s" in reply
    assert f"{report.num_rows:,} rows" in reply and f"{report.steps_per_epoch:,} steps per epoch" in reply
    for c in report.costs[:4]:
        assert f"{c.provider} ({c.gpu_id})" in reply
    without = answer(plan_request(CURRENT), "time_and_cost")
    assert "need the dataset's size" in without


def _question_model(kind: str, seen: list[str]) -> FunctionModel:
    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.append(info.output_tools[-1].name)
        tool = next(t for t in info.output_tools if "PlanQuestion" in t.name)
        return ModelResponse(parts=[ToolCallPart(tool.name, {"kind": kind})])

    return FunctionModel(model)


def test_llm_reads_a_question_the_rules_miss() -> None:
    seen: list[str] = []
    odd = "which bit of the vram is hogging everything"
    assert classify(odd) is None and understand(odd, request=CURRENT).call is None
    extractor = RequestExtractor(_question_model("largest_component", seen))
    assert extractor.extract(odd, current=CURRENT) == PlanQuestion(kind="largest_component")
    u = understand(odd, request=CURRENT, extractor=extractor)
    assert u.source == "llm" and u.call is not None and u.call.name == "answer_plan_question"
    assert u.call.args["kind"] == "largest_component"


@pytest.mark.parametrize("kind,odd", [
    ("largest_component", "which bit of the vram is hogging everything"),
    ("why_checkpointing", "is all that recomputing really necessary"),
    ("time_and_cost", "will this be done by tonight"),
])
def test_the_chat_answers_the_llms_question_from_the_plan(tmp_path: Path, kind: str, odd: str) -> None:
    seen: list[str] = []
    assert classify(odd) is None and understand(odd, request=CURRENT).call is None  # the rules miss it
    extractor = RequestExtractor(_question_model(kind, seen))
    with ChatAgent(AgentSettings(runs_dir=str(tmp_path)), extractor=extractor) as agent:
        planned = agent.reply("qlora llama-3.1-8b on 3090", "c")
        assert seen == []  # the parser read the plan
        reply = agent.reply(odd, "c")
        direct = agent.reply({"largest_component": "what eats the most memory?",
                              "why_checkpointing": "why checkpointing?",
                              "time_and_cost": "how long will it take?"}[kind], "c")
    assert reply.understood_by == "llm" and [c.name for c in reply.tool_calls] == ["answer_plan_question"]
    assert direct.understood_by == "rules" and reply.text == direct.text  # one answer, whichever understood it
    assert reply.request == planned.request  # a question does not change the plan
