"""Real data's lengths: the planner's run of varied-length steps against traced runs replayed step after step.

Truth: tests/data/varied_truth.json, written by ``python -m tools.truth.varied --build`` (HF-Trainer steps traced on
fake tensors, one per length of `run_lengths`, the allocation stream replayed through the allocator model)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from aegis.errors import InvalidConfigError
from aegis.models.resolve import resolve_model
from aegis.planning.memory.device import RUN_STEPS, device_check, device_memory, run_lengths, run_memory
from aegis.planning.memory.estimate import estimate_memory
from aegis.schema import LoRAConfig, StackProfile, TrainConfig

TABLE = Path(__file__).resolve().parents[2] / "data" / "varied_truth.json"
ROWS = json.loads(TABLE.read_text(encoding="utf-8"))["rows"]


def _config(row) -> TrainConfig:
    """The configuration the trace ran (tools.truth.varied.row_of / tools.memory_table.config_of, inlined)."""
    lora = None if row["method"] == "full" else LoRAConfig(
        rank=16, alpha=32, target_modules=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"))
    return TrainConfig(method=row["method"], micro_batch_size=row["micro_batch_size"], seq_len=row["seq_len"],
                       gradient_checkpointing=bool(row.get("gc")), attention="sdpa", precision="bf16", optimizer="adamw",
                       lora=lora, autocast=True, stack=StackProfile(transformers_version="5.23.0"))


@pytest.mark.parametrize("row", ROWS, ids=[r["key"] for r in ROWS])
def test_run_reserved_peak_against_traced_varied_steps(row):
    """Within 5% of the traced replay, with the default allocator and with expandable segments (what the plan sets
    when they help). The traced stream is replayed as loaded (`tools.truth.stream.as_loaded`): from_pretrained never
    allocates the tied head weight that from_config allocates and frees, whose cached 501 MiB segment the steps
    would otherwise carve their activations and logits out of."""
    run = run_memory(resolve_model(row["model_id"]), _config(row), row["lengths"])
    assert run.run_expandable.max_reserved_bytes == pytest.approx(row["max_reserved_expandable_bytes"], rel=0.05)
    assert run.run.max_reserved_bytes == pytest.approx(row["max_reserved_bytes"], rel=0.05)
    assert run.run.max_allocated_bytes == pytest.approx(row["max_allocated_bytes"], rel=0.02)
    # the run's varied shapes fragment the cache beyond two steps of the longest length, in the trace and the plan
    assert row["max_reserved_bytes"] > run.fixed.max_reserved_bytes
    assert run.run.max_reserved_bytes > run.fixed.max_reserved_bytes


def test_run_lengths_are_seeded_truncated_and_end_at_the_longest():
    rows = [100, 300, 5000, 40, 2500]
    a = run_lengths(rows, 2048, micro_batch_size=2)
    assert a == run_lengths(rows, 2048, micro_batch_size=2)  # deterministic
    assert len(a) == RUN_STEPS + 1 and a[-1] == 2048
    assert all(n <= 2048 for n in a) and set(a[:-1]) <= {100, 300, 2048, 40}  # a batch pads to its longest row
    assert run_lengths(rows, 2048, 2, seed=1) != a
    with pytest.raises(InvalidConfigError):
        run_lengths([], 2048)


def test_one_length_run_is_the_fixed_stream():
    """lengths of cfg.seq_len only replay the same stream as two fixed steps."""
    profile = resolve_model("Qwen/Qwen2.5-0.5B")
    cfg = estimate_memory(profile, method="lora", seq_len=512).config
    assert device_memory(profile, cfg, lengths=[512, 512]) == device_memory(profile, cfg)


def test_plan_with_dataset_lengths_names_expandable_segments_when_they_help():
    from aegis.planning.hardware import find_gpu
    from aegis.schema import Tier

    profile = resolve_model("meta-llama/Llama-3.2-1B")
    row = ROWS[0]
    est = estimate_memory(profile, method="lora", seq_len=row["seq_len"], gpu="a100-80gb")
    gpu = find_gpu("a100-80gb")
    tier = Tier(name="recommended", config=est.config, memory=est, headroom_bytes=gpu.memory_bytes - est.high_bytes,
                fits=True, summary="")
    from tools.truth.varied import length_sample

    checked = device_check(profile, gpu, tier, length_sample())
    note = checked.memory.notes[-1]
    assert "real data's lengths" in note and "expandable_segments:True" in note
    assert checked.memory.expandable_segments == note.endswith("set it for this run")
    plain = device_check(profile, gpu, tier)
    assert plain.memory.notes == est.notes and not plain.memory.expandable_segments


def test_as_loaded_drops_the_builds_freed_blocks_that_the_steps_would_carve_from():
    """The mechanism the as-loaded replay removes: a block the model build frees stays cached, and the step's
    smaller tensors are split out of it instead of mapping segments of their own."""
    from aegis.planning.memory.allocator import replay
    from tools.truth.stream import as_loaded

    mib = 1 << 20
    build = [("alloc", 1, 64 * mib), ("alloc", 2, 501 * mib), ("free", 2, 0), ("alloc", 3, 8 * mib)]
    step = [("alloc", 4, 133 * mib), ("alloc", 5, 266 * mib), ("free", 4, 0), ("free", 5, 0)]
    loaded = as_loaded(build + step, reset_at=len(build))
    assert loaded == [("alloc", 1, 64 * mib), ("alloc", 3, 8 * mib), *step]
    # as traced the 8 MiB parameter and the whole step fit in the freed 501 MiB segment; as loaded they map their own
    assert replay(build + step).max_reserved_bytes == replay(build).max_reserved_bytes == (64 + 502) * mib
    assert replay(loaded).max_reserved_bytes == (64 + 20 + 134 + 266) * mib


@pytest.mark.parametrize("row", [r for r in ROWS if "max_reserved_from_config_bytes" in r], ids=lambda r: r["key"])
def test_traced_build_temporaries_lower_the_default_allocators_peak(row):
    """Stored beside the as-loaded replay: the stream as traced (from_config's freed tied head) reserves less."""
    assert row["max_reserved_from_config_bytes"] <= row["max_reserved_bytes"]
