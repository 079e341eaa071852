"""Plans for DeepSpeed ZeRO-2/3 from a request: the text or ``aegis.plan(..., zero_stage=N)`` asks for the stage, the
plan's memory is the ZeRO model's (`aegis.planning.memory.zero_stages`, checked against traced steps in
tests/planning/memory/test_zero_truth.py), the report says which stack it planned, and ``--emit hf`` writes the
Trainer's ``deepspeed=`` dict with the buckets the plan was sized for: HF's documented ZeRO config with its "auto"
values resolved, the config tools/truth/zero.py traced (`tools.truth.zero.zero_config`)."""

from __future__ import annotations

import ast
import math

import pytest

import aegis
from aegis.cli import main
from aegis.errors import InvalidConfigError, RequestParseError
from aegis.models.resolve import resolve_model
from aegis.planning.memory.estimate import estimate
from aegis.planning.parse import parse_request
from aegis.planning.report import emit
from aegis.planning.report import render_text
from tools.truth.zero import zero_config

FULL_ZERO3 = "full llama 3.1 8b on 8x a100 with deepspeed zero3"


@pytest.fixture(scope="module")
def full_zero3():
    return aegis.plan(FULL_ZERO3, detect_stack=False)


@pytest.mark.parametrize("text, stage", [
    (FULL_ZERO3, 3), ("lora llama 3.1 8b on 4x a100 zero2", 2), ("full llama 3.1 8b on 8x a100 with zero-3", 3),
    ("full llama 3.1 8b on 8x a100, ZeRO stage 3", 3), ("qlora qwen2.5 7b on 2x 3090 with DeepSpeed ZeRO-2, bs 4", 2),
    ("full llama 3.1 8b on 8x a100 deepspeed stage 2", 2), ("full llama 3.1 8b on 8x a100", None),
])
def test_requests_name_the_zero_stage(text, stage):
    request = parse_request(text)
    assert request.zero_stage == stage
    assert request.gpu_count in (2, 4, 8)


@pytest.mark.parametrize("text, words", [
    ("full llama 3.1 8b on 8x a100 with deepspeed", "names no ZeRO stage"),
    ("full llama 3.1 8b on 8x a100 zero2 then zero3", "two DeepSpeed ZeRO stages"),
])
def test_a_request_without_one_stage_is_one_line(text, words):
    with pytest.raises(RequestParseError, match=words) as err:
        parse_request(text)
    assert "\n" not in str(err.value)


def test_the_plan_is_the_zero3_model_and_its_json_carries_the_stage_and_terms(full_zero3):
    mg, rec = full_zero3.multi_gpu, full_zero3.recommended
    assert mg is not None and mg.assumed == "deepspeed" and mg.zero_stage == 3 and full_zero3.gpu_count == 8
    profile = resolve_model("meta-llama/Llama-3.1-8B")
    zero = estimate(profile, rec.config, gpu=full_zero3.gpu, fsdp_shards=8, zero_stage=3)
    assert rec.memory.tensor_bytes == zero.tensor_bytes
    assert mg.zero_bytes == zero.total_bytes
    assert not rec.config.autocast_effective  # accelerate leaves DeepSpeed's bf16 to the engine
    terms = {c.key: c.bytes for c in rec.memory.components}
    # DeepSpeed partitions the fp32 master and Adam's two fp32 moments of every parameter over the 8 ranks
    share = math.ceil(profile.total_params / 8)
    assert terms["zero master"] == 4 * share and terms["optimizer"] == 8 * share
    assert {"zero gradient partition", "zero gathered"} <= set(terms)
    dumped = full_zero3.model_dump_json()
    assert '"zero_stage":3' in dumped and '"zero master"' in dumped and '"assumed":"deepspeed"' in dumped


def test_the_report_says_which_stack_it_planned(full_zero3):
    text = render_text(full_zero3)
    assert "DeepSpeed ZeRO-3 (HF's ds_config_zero3.json, 'auto' buckets)" in text
    assert "ZeRO-3:" in text and "<- assumed" in text.split("ZeRO-3:")[1].splitlines()[0]
    assert "Optimizer states (AdamW, fp32)" in text


def _deepspeed_dict(script: str) -> dict:
    line = next(l for l in script.splitlines() if l.strip().startswith("deepspeed="))
    return ast.literal_eval(line.strip().removeprefix("deepspeed=").rstrip(","))


def test_emit_hf_writes_the_deepspeed_config_the_plan_was_sized_for(full_zero3):
    script = emit(full_zero3, "hf")
    ast.parse(script)
    ds = _deepspeed_dict(script)
    traced = zero_config(3, full_zero3.model.hidden_size, world_size=8, micro_batch_size=1)
    assert ds["zero_optimization"] == traced["zero_optimization"]  # HF's config, "auto" buckets as the Trainer fills them
    assert ds == full_zero3.multi_gpu.deepspeed
    assert "bf16=True," in script and "fsdp=" not in script


def test_sdk_zero_stage_2_and_qlora_under_zero():
    report = aegis.plan("qlora llama 3.1 8b on 2x a100", zero_stage=2, detect_stack=False)
    assert report.multi_gpu.assumed == "deepspeed" and report.multi_gpu.zero_stage == 2
    script = emit(report, "hf")
    ds = _deepspeed_dict(script)
    assert ds["zero_optimization"] == zero_config(2, 4096, world_size=2, micro_batch_size=1)["zero_optimization"]
    # sized as TRL shards QLoRA: bf16 quant storage, no k-bit preparation
    assert "bnb_4bit_quant_storage=torch.bfloat16" in script and "prepare_model_for_kbit_training(" not in script


def test_the_solver_searches_checkpointing_under_zero():
    report = aegis.plan("lora llama 3.1 70b on 8x a100 with zero3 seq 4096", detect_stack=False)
    rec = report.recommended
    assert rec is not None and rec.config.gradient_checkpointing
    assert "checkpointing ON" in rec.summary and "zero gathered" in {c.key for c in rec.memory.components}


@pytest.mark.parametrize("args, words", [
    (["plan", "full llama 3.1 8b on a100 with zero3"], "name them ('... on 8x a100 with zero3')"),
    (["plan", "full llama 3.1 8b on 8x a100 with zero1"], "ask for zero2 or zero3"),
    (["plan", "full llama 3.1 8b on 8x a100 with deepspeed"], "say 'deepspeed zero2' or 'deepspeed zero3'"),
])
def test_bad_combinations_are_one_line_that_says_what_to_do(args, words, capsys):
    with pytest.raises(SystemExit) as info:
        main(args)
    assert info.value.code != 0
    captured = capsys.readouterr()
    assert words in captured.err and captured.err.count("\n") == 1 and "Traceback" not in captured.err


@pytest.mark.parametrize("fields, words", [
    ({"zero_stage": 1}, "ZeRO-1 is not modelled"), ({"zero_stage": 4}, "ask for zero2 or zero3"),
    ({"zero_stage": 3, "autocast": True}, "without torch.autocast"),
])
def test_sdk_bad_zero_fields_are_refused(fields, words):
    with pytest.raises(InvalidConfigError, match=words) as err:
        aegis.plan("lora llama 3.1 8b on 4x a100", detect_stack=False, **fields)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("kind", ["axolotl", "unsloth"])
def test_other_emitters_refuse_a_deepspeed_plan_in_one_line(full_zero3, kind):
    with pytest.raises(InvalidConfigError, match="--emit hf") as err:
        emit(full_zero3, kind)
    assert "\n" not in str(err.value)
