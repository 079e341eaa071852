"""The optional LLM path: pydantic-ai TestModel / FunctionModel stand in for a real model (no network)."""

from __future__ import annotations

from pathlib import Path

from aegis.schema import PlanRequest
from aegis_agent import AgentSettings, ChatAgent, RequestExtractor, understand
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, UserPromptPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel

FREE_FORM = "I'd like to teach a small qwen to write SQL on my gaming card"


def _prompts(messages: list[ModelMessage]) -> list[str]:
    return [p.content for m in messages for p in getattr(m, "parts", []) if isinstance(p, UserPromptPart)]


def test_llm_is_asked_only_when_the_parser_reads_nothing(tmp_path: Path) -> None:
    seen: list[str] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.extend(_prompts(messages))
        args = {"model": "qwen2.5-0.5b", "method": "lora", "gpu": "rtx-4090"}
        return ModelResponse(parts=[ToolCallPart(info.output_tools[0].name, args)])

    extractor = RequestExtractor(FunctionModel(model))
    with ChatAgent(AgentSettings(runs_dir=str(tmp_path)), extractor=extractor) as agent:
        parsed = agent.reply("qlora llama-3.1-8b on 3090", "c")
        assert parsed.understood_by == "parser" and seen == []
        reply = agent.reply(FREE_FORM, "c")
    assert seen == [f"Current request: {parsed.request.model_dump_json(exclude_none=True)}\nMessage: {FREE_FORM}"]
    assert reply.understood_by == "llm"
    assert [c.name for c in reply.tool_calls] == ["plan_finetune"]
    assert reply.report is not None and reply.report.model.model_id == "Qwen/Qwen2.5-0.5B"
    assert reply.report.gpu.id == "rtx-4090" and reply.report.method == "lora"
    assert "Aegis plan" in reply.text


def test_llm_answer_is_a_follow_up_of_the_current_request() -> None:
    extractor = RequestExtractor(TestModel(custom_output_args={"lora_rank": 64}))
    current = PlanRequest(model="meta-llama/Llama-3.1-8B", method="qlora", gpu="rtx-3090")
    u = understand("could the adapters be a good deal bigger, say sixty-four", request=current, extractor=extractor)
    assert u.source == "llm" and u.call is not None
    assert u.call.args == {**current.model_dump(exclude_none=True), "lora_rank": 64}


def test_llm_retries_a_malformed_answer() -> None:
    calls = {"n": 0}

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        calls["n"] += 1
        if calls["n"] == 1:  # a method that does not exist: pydantic-ai sends the validation error back
            return ModelResponse(parts=[ToolCallPart(info.output_tools[0].name, {"method": "dora", "gpu": "h100"})])
        return ModelResponse(parts=[ToolCallPart(info.output_tools[0].name, {"method": "lora", "gpu": "h100"})])

    req = RequestExtractor(FunctionModel(model)).extract("dora on an h100 please")
    assert calls["n"] == 2 and req == PlanRequest(method="lora", gpu="h100")


def test_without_llm_free_form_gets_help_not_an_error(tmp_path: Path) -> None:
    with ChatAgent(AgentSettings(runs_dir=str(tmp_path))) as agent:
        assert agent.extractor is None
        reply = agent.reply(FREE_FORM, "c")
    assert reply.tool_calls == () and "unknown model" in reply.text


def test_settings_without_llm_model_build_no_extractor() -> None:
    assert RequestExtractor.from_settings(AgentSettings()) is None


def test_text_answer_from_model_is_not_accepted_as_a_request() -> None:
    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if len(messages) == 1:
            return ModelResponse(parts=[TextPart("sure, a 4090 would do")])
        return ModelResponse(parts=[ToolCallPart(info.output_tools[0].name, {"gpu": "rtx-4090"})])

    assert RequestExtractor(FunctionModel(model)).extract("what card?") == PlanRequest(gpu="rtx-4090")
