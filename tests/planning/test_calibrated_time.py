"""The planner's time from the JAX engine's measured efficiency: a record that a real `aegis benchmark` run stored
(CPU, filed under a catalog GPU with --gpu) gives an MFU through the one FLOPs count, and the plan applies that MFU to
its own batch, length and precision; without a record the documented estimate stands, and the report says which."""

from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

from aegis.data import tiny_llama_path
from aegis.models.resolve import resolve_model
from aegis.planning.calibration import CalibrationRecord, CalibrationStore
from aegis.planning.hardware import find_gpu
from aegis.planning.throughput import MEASURED_SPREAD, MFU_RANGE, token_flops, tokens_per_s_range
from aegis.schema import PlanRequest, TrainConfig

GPU = "rtx-4090"


@pytest.fixture
def setup(tmp_path, monkeypatch):
    """A tiny model folder, a 24-row chat file and an empty $AEGIS_HOME."""
    monkeypatch.setenv("AEGIS_HOME", str(tmp_path / "home"))
    folder = tmp_path / "tiny"
    shutil.copytree(tiny_llama_path(), folder)
    rows = [{"messages": [{"role": "user", "content": "word " * (3 + i % 7)},
                          {"role": "assistant", "content": "answer " * (5 + 3 * i)}]} for i in range(24)]
    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder, data


def _plan(folder, data):
    from aegis.planning.planner import plan

    return plan(PlanRequest(model=str(folder), method="lora", gpu=GPU, dataset=str(data)), detect_stack=False)


@pytest.mark.slow
def test_a_benchmark_record_sets_the_plans_time_by_its_measured_mfu(setup):
    from aegis.cli import app
    from aegis.planning.report import render_text

    folder, data = setup
    before = _plan(folder, data)
    assert before.throughput.source == "estimated"
    assert before.throughput.basis.startswith("estimated from the documented efficiency")

    out = CliRunner().invoke(app, ["benchmark", str(folder), "--method", "lora", "--batch", "1", "--seq", "16",
                                   "--steps", "1", "--precision", "fp32", "--gpu", GPU, "--json"])
    assert out.exit_code == 0, out.output
    rec = CalibrationRecord.model_validate(json.loads(out.output)["record"])
    assert CalibrationStore().lookup(GPU, str(folder), "lora") == rec  # filed under the id the planner resolves

    after = _plan(folder, data)
    cfg = after.recommended.config
    assert cfg == before.recommended.config and (cfg.micro_batch_size, cfg.seq_len, cfg.precision) != (1, 16, "fp32")
    # the MFU the benchmark measured (its tokens/s x the model's FLOPs at seq 16 over the card's fp32-rate peak),
    # applied to the plan's FLOPs per token at its own length and precision, written out here from the formula
    profile, gpu = resolve_model(str(folder)), find_gpu(GPU)
    # (the benchmark trains the default adapters, rank 16 on every linear: their matmuls count)
    bench_flops = token_flops(profile, "lora", 16, lora=TrainConfig(method="lora").lora_config).training
    measured = rec.tokens_per_s * bench_flops / (gpu.tflops("fp32") * 1e12)
    assert rec.mfu == pytest.approx(measured)
    rate = measured * gpu.tflops(cfg.precision) * 1e12 / token_flops(
        profile, "lora", cfg.seq_len, recompute=cfg.gradient_checkpointing, lora=cfg.lora_config).training
    tp, tp0 = after.throughput, before.throughput
    assert tp.source == "measured"
    assert tp.tokens_per_s_low == pytest.approx(rate * (1 - MEASURED_SPREAD))
    assert tp.tokens_per_s_high == pytest.approx(rate * (1 + MEASURED_SPREAD))
    # the time moves by exactly the ratio of the rates: the token count is the plan's, not the benchmark's
    assert tp.total_hours_high / tp0.total_hours_high == pytest.approx(tp0.tokens_per_s_low / tp.tokens_per_s_low)
    assert tp.total_hours_low / tp0.total_hours_low == pytest.approx(tp0.tokens_per_s_high / tp.tokens_per_s_high)
    day = rec.measured_at[:10]
    assert tp.basis.startswith(f"measured by `aegis benchmark` on {day}: {rec.tokens_per_s:,.0f} tokens/s, MFU ")
    assert "applied to this plan's" in tp.basis and f"seq {cfg.seq_len}" in tp.basis
    text = " ".join(render_text(after).split())
    assert f"(measured by `aegis benchmark` on {day}; --explain shows how)" in text
    assert "MFU" in " ".join(render_text(after, explain=True).split())


def test_without_a_record_for_this_gpu_model_and_method_the_estimate_is_unchanged(setup):
    folder, data = setup
    profile, gpu = resolve_model(str(folder)), find_gpu(GPU)
    cfg = TrainConfig(method="lora", micro_batch_size=4, seq_len=64)
    empty = tokens_per_s_range(profile, cfg, gpu)
    store = CalibrationStore()
    base = dict(model_id=str(folder), tokens_per_s=1e3, peak_memory_bytes=1, device="x", micro_batch_size=1, seq_len=16)
    store.record(CalibrationRecord(gpu_id="a100-80gb", method="lora", **base))  # another GPU
    store.record(CalibrationRecord(gpu_id=GPU, method="full", **base))  # another method
    assert tokens_per_s_range(profile, cfg, gpu) == empty and empty[3] == "estimated"
    assert f"{MFU_RANGE['lora'][0]:.0%}-{MFU_RANGE['lora'][1]:.0%}" in empty[2]
    # a record of the same configuration reads back its own tokens/s; one of another engine is not used
    store.record(CalibrationRecord(gpu_id=GPU, method="lora", **base | dict(micro_batch_size=4, seq_len=64,
                                                                               precision="bf16")))
    low, high, basis, source = tokens_per_s_range(profile, cfg, gpu)
    assert source == "measured" and (low, high) == pytest.approx((1e3 * 0.9, 1e3 * 1.1)) and "applied" not in basis
    assert tokens_per_s_range(profile, cfg, gpu, framework="hf") == empty


@pytest.mark.parametrize("method", ["full", "lora"])
def test_the_documented_estimate_contains_the_engines_rate_measured_on_an_h200(method, tmp_path):
    """tests/data/gpu_speed.json: the JAX engine's tokens/s on a lent H200 (Llama-3.2-1B-shaped, bf16, b4 x 2,048)
    lies inside the planner's estimated range for the same configuration (no benchmark record), and so does HF Trainer's
    full fine-tuning. HF + PEFT's LoRA (35,167 tokens/s, 19.2% MFU) was below it: the range is the engine's."""
    from pathlib import Path

    from aegis.models.profiles import profile_from_config
    from aegis.schema import LoRAConfig

    data = json.loads((Path(__file__).resolve().parents[1] / "data" / "gpu_speed.json").read_text(encoding="utf-8"))
    run = data["runs"][0]
    assert run["device"] == "NVIDIA H200" and run["batch"] == 4 and run["seq"] == 2048 and run["precision"] == "bf16"
    row = next(r for r in run["rows"] if r["method"] == method)
    profile = profile_from_config(run["model_config"], model_id="bench-llama-1b", source="path")
    tc = TrainConfig(method=method, micro_batch_size=4, seq_len=2048, precision="bf16",
                     lora=LoRAConfig(rank=16, alpha=32, dropout=0.0) if method != "full" else None)
    low, high, _, source = tokens_per_s_range(profile, tc, find_gpu("h200"), store=CalibrationStore(tmp_path / "c.json"))
    assert source == "estimated"
    assert low <= row["engine_tokens_per_s"] <= high, (low, row["engine_tokens_per_s"], high)
    if method == "full":
        assert low <= row["torch_tokens_per_s"] <= high
    else:
        assert row["torch_tokens_per_s"] < low
