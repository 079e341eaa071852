"""The planner's FSDP memory at real size against rank 0's traced steps (tests/data/sharded_truth_large.json).

`tools.truth.sharded --large` traces FSDP1 FULL_SHARD steps of catalog models at their real sizes (Llama-3.1-8B full
and LoRA, Mistral-7B and Qwen2.5-7B full, LoRA and QLoRA, Llama-2-70B and Llama-3.1-70B QLoRA; 2 and 8 GPUs;
checkpointing on and off; fused AdamW, and foreach where its temporaries matter) on fake tensors
and a fake process group, as the Trainer wraps them, and replays rank 0's allocation stream through the allocator
model. The tiny rows (`test_fsdp_reserved.py`) move reserved memory in 2 and 20 MiB segments; these rows move it in
GiB, where the planner's stream (which tensors, on which stream, in which order) decides the figure.

The planner's two levels, as a multi-GPU plan reports them (`aegis.planning.memory.multi_gpu.multi_gpu_device_level`):
allocated = the estimate's tensor peak; reserved = the replay of rank 0's modelled stream, never below allocated.
Bar: both within 5% of the trace; LARGE_OPEN pins rows that miss, with their errors.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tools.truth.sharded import catalog_config, planned_levels

DATA = Path(__file__).resolve().parents[2] / "data"
ROWS = json.loads((DATA / "sharded_truth_large.json").read_text(encoding="utf-8"))["rows"]
BAR = 0.05

# Rows the planner misses by more than 5% (allocated error, reserved error), pinned rather than loosened.
LARGE_OPEN: dict[tuple, tuple[float, float]] = {}


def _key(row: dict) -> tuple:
    return (row["model"], row["method"], row["world_size"], row["seq_len"], row["micro_batch_size"],
            row["gradient_checkpointing"], row["optimizer"])


def _id(row: dict) -> str:
    return (f"{row['model'].split('/')[-1]}-{row['method']}-ws{row['world_size']}-s{row['seq_len']}-"
            f"b{row['micro_batch_size']}-gc{int(row['gradient_checkpointing'])}-{row['optimizer']}")


def test_rows_cover_real_sizes():
    assert {r["world_size"] for r in ROWS} == {2, 8}
    assert {r["method"] for r in ROWS} == {"full", "lora", "qlora"}
    assert {r["gradient_checkpointing"] for r in ROWS} == {True, False}
    assert len({r["family"] for r in ROWS}) >= 3
    assert any("70b" in r["model"].lower() for r in ROWS)
    assert all(r["traced_max_allocated_bytes"] > 4 << 30 for r in ROWS)  # GiB-sized: not the tiny rows' regime


@pytest.mark.parametrize("row", ROWS, ids=_id)
def test_traced_replay_is_consistent(row):
    """The replay's allocated peak is the allocator's (`torch.cuda.max_memory_allocated`'s): each block's size, so a
    large-pool block not split because less than 1 MiB would remain counts that slack; it is the tracker's tensor
    count on most rows and at most 0.6% above it here (84 MB over 14 GiB on Llama-2-70B QLoRA at 8 GPUs). Reserved is
    at least allocated; with FSDP's streams apart it is not always above the one-stream replay (Llama-3.1-70B QLoRA:
    2.2% below: best fits fall differently)."""
    assert row["peak_bytes"] <= row["traced_max_allocated_bytes"] <= 1.01 * row["peak_bytes"]
    assert row["traced_streams"] >= 3
    assert row["traced_max_reserved_bytes"] >= row["traced_max_allocated_bytes"]
    assert row["traced_max_reserved_one_stream_bytes"] >= row["traced_max_allocated_bytes"]


@pytest.mark.parametrize("row", ROWS, ids=_id)
def test_planned_allocated_and_reserved_follow_the_trace(row):
    estimated, _, replayed = planned_levels(row, catalog_config(row["model"]))
    reserved = max(replayed, estimated)  # as multi_gpu_device_level reports it
    allocated_error = estimated / row["traced_max_allocated_bytes"] - 1
    reserved_error = reserved / row["traced_max_reserved_bytes"] - 1
    if _key(row) in LARGE_OPEN:
        pinned = LARGE_OPEN[_key(row)]
        assert (allocated_error, reserved_error) == pytest.approx(pinned, abs=0.005)
    else:
        assert abs(allocated_error) <= BAR, f"allocated {allocated_error:+.2%}"
        assert abs(reserved_error) <= BAR, f"reserved {reserved_error:+.2%}"


def test_foreach_adamw_temporaries_hold_the_peak_at_two_gpus():
    """Checkpointed full fine-tuning on 2 GPUs: with foreach AdamW (transformers 4's default) the step's state-sized
    temporaries make the optimizer step the peak, above backward's; fused AdamW (transformers 5's) has none. The
    planner follows both only when told which the stack runs."""
    pair = {r["optimizer"]: r for r in ROWS if (r["model"], r["method"], r["world_size"], r["gradient_checkpointing"],
                                                 r["micro_batch_size"]) == ("meta-llama/Llama-3.1-8B", "full", 2, True, 2)}
    foreach, fused = pair["adamw_foreach"], pair["adamw_fused"]
    assert foreach["peak_phase"] == "optimizer" and fused["peak_phase"] == "backward"
    assert foreach["traced_max_allocated_bytes"] > 1.05 * fused["traced_max_allocated_bytes"]
    config = catalog_config(foreach["model"])
    planned_foreach = planned_levels(foreach, config)[0]
    planned_fused = planned_levels(fused, config)[0]
    assert planned_foreach / foreach["traced_max_allocated_bytes"] - 1 == pytest.approx(0, abs=0.01)
    # the default stack (transformers 5: fused) planned against the foreach trace misses by more than the bar
    assert planned_fused / foreach["traced_max_allocated_bytes"] - 1 < -BAR


def test_full_fine_tuning_allocated_within_one_percent():
    """Full fine-tuning at real size: the estimate's peak within 1% of the trace, the checkpointed 2-GPU rows too,
    whose peak is FSDP's root post-backward (the root's unsharded gradients and their flat copy; without that moment
    the estimate was 2.9% under on Llama-3.1-8B and 4.7% on Qwen2.5-7B)."""
    full = [r for r in ROWS if r["method"] == "full"]
    assert any(r["gradient_checkpointing"] and r["world_size"] == 2 for r in full)
    for row in full:
        estimated = planned_levels(row, catalog_config(row["model"]))[0]
        assert abs(estimated / row["traced_max_allocated_bytes"] - 1) <= 0.01, _id(row)
