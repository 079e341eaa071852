"""Deterministic understanding: intents, follow-ups carried over the conversation, helpful failures."""

from __future__ import annotations

import pytest
from aegis.planning.parse import parse_request
from aegis.schema import PlanRequest
from aegis_agent.understand import carry_over, understand

BASE = parse_request("qlora llama-3.1-8b on 3090")


def test_first_request_goes_to_the_planner() -> None:
    u = understand("qlora llama-3.1-8b on 3090")
    assert u.call is not None and u.call.name == "plan_finetune"
    assert u.call.args == {"model": "meta-llama/Llama-3.1-8B", "method": "qlora", "gpu": "rtx-3090"}


@pytest.mark.parametrize(
    ("text", "changed"),
    [
        ("on a 4090 instead", {"gpu": "rtx-4090"}),
        ("what about a 4090?", {"gpu": "rtx-4090"}),
        ("rank 32", {"lora_rank": 32}),
        ("make it rank 32", {"lora_rank": 32}),
        ("with 8-bit adam", {"optimizer": "adamw_8bit"}),
        ("seq 2048", {"seq_len": 2048}),
        ("and with lora dropout 0.1", {"lora_dropout": 0.1}),  # 'lora' of a setting keeps QLoRA
        ("lora rank 32", {"lora_rank": 32}),
    ],
)
def test_follow_ups_change_one_field_and_keep_the_rest(text: str, changed: dict) -> None:
    u = understand(text, request=BASE)
    assert u.call is not None and u.call.name == "plan_finetune"
    assert u.call.args == {**BASE.model_dump(exclude_none=True), **changed}


def test_a_follow_up_that_says_lora_switches_the_method() -> None:
    u = understand("use lora instead", request=BASE)
    assert u.call is not None and u.call.args["method"] == "lora"


def test_a_new_model_keeps_method_gpu_dataset_but_not_tuning() -> None:
    prev = PlanRequest(
        model="meta-llama/Llama-3.1-8B", method="qlora", gpu="rtx-3090", dataset="./d.jsonl", lora_rank=64
    )
    new = carry_over(prev, parse_request("qwen2.5-7b"))
    assert new.model_dump(exclude_none=True) == {
        "model": "Qwen/Qwen2.5-7B",
        "method": "qlora",
        "gpu": "rtx-3090",
        "dataset": "./d.jsonl",
    }


def test_switching_gpu_drops_a_count_not_said_again() -> None:
    prev = parse_request("lora qwen2.5-7b on 2x a100 80gb")
    assert carry_over(prev, parse_request("on a 4090 instead")).gpu_count is None
    assert carry_over(prev, parse_request("on 4x h100")).gpu_count == 4


@pytest.mark.parametrize(
    ("text", "tool", "args"),
    [
        ("set_lr 1e-5", "send_run_command", {"command": "set_lr 1e-05", "run_id": "run-1"}),
        ("blacklist_samples 12 40", "send_run_command", {"command": "blacklist_samples 12 40", "run_id": "run-1"}),
        ("resume", "send_run_command", {"command": "resume", "run_id": "run-1"}),
        ("interrupt", "send_run_command", {"command": "interrupt", "run_id": "run-1"}),
        (
            "stop chat-20260101-000000-ab12",
            "send_run_command",
            {"command": "stop", "run_id": "chat-20260101-000000-ab12"},
        ),
        ("status", "run_status", {"run_id": "run-1"}),
        ("how is the run going?", "run_status", {"run_id": "run-1"}),
        ("start the run", "start_run", {"request": BASE.model_dump(exclude_none=True)}),
        ("compare gpus", "compare_gpus", BASE.model_dump(exclude_none=True)),
        ("list models", "list_models", {}),
        ("list gpus", "list_gpus", {}),
        (
            "explain the optimizer states",
            "explain_memory_component",
            {"component": "optimizer states", "request": BASE.model_dump(exclude_none=True)},
        ),
        (
            "why are the logits so big?",
            "explain_memory_component",
            {"component": "logits", "request": BASE.model_dump(exclude_none=True)},
        ),
    ],
)
def test_intents(text: str, tool: str, args: dict) -> None:
    u = understand(text, request=BASE, run_id="run-1")
    assert u.call is not None, u.reply
    assert (u.call.name, u.call.args) == (tool, args)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("what about a 3900?", "did you mean"),
        ("lora lama-8b on 3090", "unknown model 'lama-8b'"),
        ("set_lr abc", "set_lr needs a number"),
        ("please paint my fence", "I did not find a request"),
        ("help", "qlora llama-3.1-8b on 3090"),
    ],
)
def test_expected_failures_are_replies(text: str, expected: str) -> None:
    u = understand(text, request=BASE)
    assert u.call is None and expected in (u.reply or "")
