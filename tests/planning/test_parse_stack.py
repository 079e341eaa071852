"""The stack said in free text: trainer, transformers version, k-bit preparation, Liger, checkpointing mode, LoRA
dropout — read into the same PlanRequest fields the CLI flags set; explicit fields win over the text."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import aegis
from aegis.planning.parse import parse_request_lenient

BASE = "qlora llama-3.1-8b on a100 80gb"

PHRASES = [
    ("with trl", {"trainer": "trl"}),
    ("using TRL's SFTTrainer", {"trainer": "trl"}),
    ("using axolotl", {"trainer": "axolotl"}),
    ("with unsloth", {"trainer": "unsloth"}),
    ("with the HF Trainer", {"trainer": "hf"}),
    ("in a plain peft loop", {"trainer": "peft"}),
    ("peft only", {"trainer": "peft"}),
    ("transformers 4.48", {"transformers_version": "4.48"}),
    ("on transformers v4", {"transformers_version": "4"}),
    ("transformers 4.48.1", {"transformers_version": "4.48.1"}),
    ("transformers==4.48.1", {"transformers_version": "4.48.1"}),
    ("transformers: 5", {"transformers_version": "5"}),
    ("transformers version 4.57", {"transformers_version": "4.57"}),
    ("without kbit prep", {"kbit_prep": False}),
    ("no prepare_model_for_kbit_training", {"kbit_prep": False}),
    ("with k-bit preparation", {"kbit_prep": True}),
    ("with liger kernels", {"liger": True}),
    ("no liger", {"liger": False}),
    ("non-reentrant checkpointing", {"checkpointing_mode": "non_reentrant", "gradient_checkpointing": True}),
    ("reentrant gradient checkpointing", {"checkpointing_mode": "reentrant", "gradient_checkpointing": True}),
    ("unsloth offloaded checkpointing", {"checkpointing_mode": "offload", "gradient_checkpointing": True, "trainer": "unsloth"}),
    ("cpu-offloaded checkpointing", {"checkpointing_mode": "offload", "gradient_checkpointing": True}),
    ("lora dropout 0.1", {"lora_dropout": 0.1}),
    ("dropout=0.05", {"lora_dropout": 0.05}),
]
STACK_FIELDS = ("trainer", "transformers_version", "kbit_prep", "liger", "checkpointing_mode", "lora_dropout")


@pytest.mark.parametrize(("phrase", "expected"), PHRASES, ids=[p for p, _ in PHRASES])
def test_each_phrase_sets_its_fields_and_nothing_else(phrase, expected):
    plain = parse_request_lenient(BASE)
    said = parse_request_lenient(f"{BASE} {phrase}")
    assert said.ok and not said.unparsed, (said.issues, said.unparsed)
    got = said.request.model_dump(exclude_none=True)
    assert {k: got.get(k) for k in expected} == expected
    assert {k: v for k, v in got.items() if k not in expected} == plain.request.model_dump(exclude_none=True)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(PHRASES), min_size=1, max_size=4, unique_by=lambda p: tuple(p[1])), st.randoms())
def test_phrases_combine_in_any_order(picked, rnd):
    fields: dict = {}
    for _, expected in picked:
        fields.update(expected)
    if len({tuple(sorted(e.items())) for _, e in picked}) != len(picked) or any(
        sum(1 for _, e in picked if k in e) > 1 for k in fields
    ):
        return  # two phrases for one field: a contradiction, covered below
    order = [p for p, _ in picked]
    rnd.shuffle(order)
    said = parse_request_lenient(f"{BASE} " + " and ".join(order))
    assert said.ok, said.issues
    got = said.request.model_dump(exclude_none=True)
    assert {k: got.get(k) for k in fields} == fields


def test_contradictions_are_issues_and_unknown_words_change_nothing():
    two = parse_request_lenient(f"{BASE} with trl and axolotl")
    assert not two.ok and "two trainers" in two.issues[0].message
    odd = parse_request_lenient(f"{BASE} with my own trainer framework")
    assert all(getattr(odd.request, f) is None for f in STACK_FIELDS)
    bare = parse_request_lenient("peft llama-3.1-8b on 3090")  # a bare "peft" is the LoRA method, not a trainer
    assert bare.request.method == "lora" and bare.request.trainer is None


def test_the_plan_reports_the_stack_said_and_explicit_fields_win():
    report = aegis.plan(f"{BASE} with trl transformers 4.48 lora dropout 0.1", detect_stack=False)
    stack = report.train_config.stack if hasattr(report, "train_config") else report.recommended.config.stack
    assert stack.trainer == "trl" and stack.transformers_version == "4.48"
    override = aegis.plan(f"{BASE} with trl transformers 4.48", transformers_version="5", detect_stack=False)
    stack = override.train_config.stack if hasattr(override, "train_config") else override.recommended.config.stack
    assert stack.transformers_version == "5" and stack.trainer == "trl"


@pytest.mark.parametrize("text", ["and with lora dropout 0.1", "lora rank 32", "lora alpha 64 please", "LoRA r=1"])
def test_lora_naming_a_setting_implies_the_method(text):
    """On its own "lora rank 32" is a LoRA request; the method is marked implied, so a chat follow-up keeps the
    method it had (tests/agent/test_understand.py: a QLoRA plan stays QLoRA)."""
    parsed = parse_request_lenient(text)
    assert parsed.request.method == "lora" and parsed.implied == ("method",)


def test_lora_naming_a_setting_in_a_whole_request_is_the_method():
    assert parse_request_lenient("lora r=32 qwen2.5-7b on h100").request.method == "lora"
    assert parse_request_lenient("use lora with rank 8").implied == ()
    assert parse_request_lenient("qlora llama-3.1-8b on 3090 lora dropout 0.1").request.method == "qlora"
