"""The planner's reserved memory for FSDP plans against rank 0's traced allocation stream (tests/data/sharded_truth.json).

`tools.truth.sharded` records each traced FSDP step's allocation stream on rank 0 (every storage's allocation and
free, FSDP's storage resizes included, each allocation tagged with the stream FSDP made it on) and replays it through
the allocator model (`aegis.planning.memory.allocator`, per-stream pools): ``traced_max_reserved_bytes``. The planner
writes the same step from the estimate's components (`aegis.planning.memory.device.allocation_stream` with
`Sharding`: FSDP1 as the HF Trainer wraps it) and replays it through the same model. Both sides share the allocator
model, so this measures the planner's stream (which tensors, on which stream, in which order).

Bar (issue 33): within 5% of the traced replay on FSDP1 rows (FULL_SHARD and SHARD_GRAD_OP, 2 and 8 GPUs, full, LoRA
and QLoRA), and never under the allocated peak. FSDP2 rows (``fully_shard``, which gathers through a copy-in stream
and copies out on the default stream) are compared with ``Sharding(version=2)``'s stream: FSDP2_OPEN lists those more than 5%
under or over, with their errors.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from aegis.models.profiles import profile_from_config
from aegis.planning.memory.allocator import replay
from aegis.planning.memory.device import allocation_stream
from aegis.planning.memory.sharded_step import Sharding
from aegis.planning.memory.estimate import estimate_memory
from aegis.schema import LoRAConfig, StackProfile

DATA = Path(__file__).resolve().parents[2] / "data"
TABLE = json.loads((DATA / "sharded_truth.json").read_text(encoding="utf-8"))
CONFIGS = json.loads((DATA / "sharded_configs.json").read_text(encoding="utf-8"))
ROWS = [r for r in TABLE["rows"] if r["fsdp"] != "none" and "traced_max_reserved_bytes" in r]
FSDP1 = [r for r in ROWS if r["fsdp"] == "fsdp1"]
FSDP2 = [r for r in ROWS if r["fsdp"] == "fsdp2"]
BAR = 0.05

# FSDP2 rows the version-2 stream misses by more than 5% (planned / traced reserved - 1), pinned rather than loosened.
# The Trainer's default is FSDP1, which the planner plans; the FSDP2 stream is a first model: one 2 MiB small-pool
# segment short on Llama/Qwen2/Mistral QLoRA at 2 GPUs, one to three too many on full fine-tuning at 8 GPUs.
FSDP2_OPEN: dict[tuple[str, str, int], float] = {
    ("llama", "qlora", 2): -0.0588, ("qwen2", "qlora", 2): -0.0588,
    ("llama", "full", 8): +0.0625, ("qwen2", "full", 8): +0.0625, ("phi3", "full", 8): +0.0909,
    ("gpt_neox", "full", 8): +0.0667, ("mistral", "full", 8): +0.0625, ("mistral", "qlora", 2): -0.0588,
}


def _id(row: dict) -> str:
    return f"{row['family']}-{row['method']}-{row['fsdp']}-{row['strategy']}-ws{row['world_size']}"


def _planned(row: dict) -> tuple[int, int, int]:
    """(estimate's tensor peak, planner's replayed allocated, planner's replayed reserved) for a row."""
    profile = profile_from_config(CONFIGS[row["family"]], model_id=f"tiny-{row['family']}", source="path")
    lora = None
    if row["method"] != "full":
        lora = LoRAConfig(rank=row["lora_rank"], alpha=2 * row["lora_rank"], target_modules=tuple(row["lora_targets"]))
    reshard = row["strategy"] == "FULL_SHARD"
    est = estimate_memory(profile, method=row["method"], micro_batch_size=row["micro_batch_size"], seq_len=row["seq_len"],
                          precision="bf16", lora=lora, fsdp_shards=row["world_size"], fsdp_reshard=reshard,
                          autocast=row["method"] != "full",
                          stack=StackProfile(kbit_prep=False) if row["method"] == "qlora" else None)
    version = 2 if row["fsdp"] == "fsdp2" else 1
    stats = replay(allocation_stream(profile, est.config, sharding=Sharding(row["world_size"], reshard, version)))
    return est.tensor_bytes, stats.max_allocated_bytes, stats.max_reserved_bytes


def test_traced_rows_cover_four_families_both_world_sizes_every_method():
    assert len({r["family"] for r in FSDP1}) >= 4
    assert {r["world_size"] for r in FSDP1} == {2, 8}
    assert {r["method"] for r in FSDP1} == {"full", "lora", "qlora"}
    assert {r["strategy"] for r in FSDP1} == {"FULL_SHARD", "SHARD_GRAD_OP"}


@pytest.mark.parametrize("row", ROWS, ids=_id)
def test_traced_replay_is_consistent(row):
    """The traced stream's allocated peak is the tracer's own peak; FSDP's side streams (all-gather, reduce-scatter,
    mixed precision: 3 or 4 in all) only add reserved memory (their blocks cannot serve the default stream)."""
    assert row["traced_max_allocated_bytes"] == row["peak_bytes"]
    assert row["traced_streams"] >= 3
    assert row["traced_max_reserved_bytes"] >= row["traced_max_reserved_one_stream_bytes"] >= row["peak_bytes"]


@pytest.mark.parametrize("row", FSDP1, ids=_id)
def test_planned_reserved_follows_the_traced_replay(row):
    estimated, allocated, reserved = _planned(row)
    error = reserved / row["traced_max_reserved_bytes"] - 1
    assert abs(error) <= BAR, f"{error:+.2%}"
    assert reserved >= max(estimated, allocated)


@pytest.mark.parametrize("row", FSDP2, ids=_id)
def test_fsdp2_rows_against_the_fsdp2_stream(row):
    _, _, reserved = _planned(row)
    error = reserved / row["traced_max_reserved_bytes"] - 1
    key = (row["family"], row["method"], row["world_size"])
    if key in FSDP2_OPEN:
        assert error == pytest.approx(FSDP2_OPEN[key], abs=0.005)
    else:
        assert abs(error) <= BAR, f"{error:+.2%}"


def test_side_streams_are_what_the_planned_reserve_needs():
    """Without FSDP's streams (every allocation on the default stream) the planner's replay would be under the traced
    reserved by far more than the bar: the per-stream pools are what close it."""
    row = next(r for r in FSDP1 if (r["family"], r["method"], r["world_size"], r["strategy"])
               == ("llama", "full", 2, "FULL_SHARD"))
    profile = profile_from_config(CONFIGS["llama"], model_id="tiny-llama", source="path")
    est = estimate_memory(profile, method="full", seq_len=row["seq_len"], precision="bf16", fsdp_shards=2)
    events = allocation_stream(profile, est.config, sharding=Sharding(2))
    one = replay([e for e in events if e[0] != "stream"]).max_reserved_bytes
    assert one / row["traced_max_reserved_bytes"] - 1 < -0.3
    assert abs(replay(events).max_reserved_bytes / row["traced_max_reserved_bytes"] - 1) <= BAR
