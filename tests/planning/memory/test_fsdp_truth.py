"""The planner's ``fsdp_shards`` model against rank 0 of traced FSDP steps (tests/data/sharded_truth.json).

The rows are traced by `tools.truth.sharded` on tiny configs of five families (tests/data/sharded_configs.json): fake
tensors, torch's ``fake`` process group, world sizes 2 and 8; FSDP1 FULL_SHARD and SHARD_GRAD_OP with the Trainer's
transformer-based wrap, BACKWARD_PRE prefetch and ``use_orig_params``, FSDP2 ``fully_shard``; PEFT's wrap policy
and bf16 mixed precision for LoRA/QLoRA, QLoRA's NF4 in bf16 storage; and each family/method on one GPU without
FSDP (``fsdp="none"``), the baseline.

Bars (issue 33): sharding is planned exactly (for one family and method, the planner's error in bytes is the same,
within 0.5% of the peak, across FSDP1/FSDP2, FULL_SHARD/SHARD_GRAD_OP and 2 or 8 GPUs: what is left is the
unsharded step's), and every sharded row is within 2% except KNOWN_GAPS, whose one-GPU row misses the same bytes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tools.truth.sharded import planned_bytes

DATA = Path(__file__).resolve().parents[2] / "data"
TABLE = json.loads((DATA / "sharded_truth.json").read_text(encoding="utf-8"))
CONFIGS = json.loads((DATA / "sharded_configs.json").read_text(encoding="utf-8"))
ROWS = TABLE["rows"]
SHARDED = [r for r in ROWS if r["fsdp"] != "none"]
ONE_GPU = {(r["family"], r["method"]): r for r in ROWS if r["fsdp"] == "none"}
BAR = 0.02
SHARDING_BAR = 0.005

# Rows left out of the 2% bar, each a one-GPU gap (none now: full fine-tuning of the tiny GPT-NeoX and Phi-3 missed
# the copy of SDPA's output their torch.cat-built queries make before the output projection, -1.5% / -1.3% on one GPU,
# -2.9% on 8; `aegis.planning.memory.activations.CAT_ROPE_QUERY` models it).
KNOWN_GAPS: set[tuple[str, str]] = set()


def _id(row: dict) -> str:
    return f"{row['family']}-{row['method']}-{row['fsdp']}-{row['strategy']}-ws{row['world_size']}"


def _error(row: dict) -> int:
    return planned_bytes(row, CONFIGS) - row["peak_bytes"]


def test_rows_cover_five_families_both_world_sizes_every_method_and_strategy():
    assert len({r["family"] for r in SHARDED}) >= 4
    assert {r["world_size"] for r in SHARDED} == {2, 8}
    assert {r["method"] for r in SHARDED} == {"full", "lora", "qlora"}
    assert {(r["fsdp"], r["strategy"]) for r in SHARDED} == {
        ("fsdp1", "FULL_SHARD"), ("fsdp1", "SHARD_GRAD_OP"), ("fsdp2", "FULL_SHARD")}
    assert all((r["family"], r["method"]) in ONE_GPU for r in SHARDED)
    assert set(TABLE["versions"]) >= {"torch", "transformers", "peft", "accelerate", "bitsandbytes"}


def _errors_by_run() -> dict[tuple[str, str], list[tuple[int, dict]]]:
    out: dict[tuple[str, str], list[tuple[int, dict]]] = {}
    for row in SHARDED:
        out.setdefault((row["family"], row["method"]), []).append((_error(row), row))
    return out


ERRORS = _errors_by_run()


@pytest.mark.parametrize("run", sorted(ERRORS), ids="-".join)
def test_sharding_is_planned_exactly(run):
    """Shards (1/2 or 1/8 of parameters, gradients, states), the gathered root and layers (one, two, or all kept
    under SHARD_GRAD_OP), unsharded gradients: whatever FSDP changes on rank 0, the planner's error does not move."""
    errors = [e for e, _ in ERRORS[run]]
    smallest = min(r["peak_bytes"] for _, r in ERRORS[run])
    assert len(errors) == 6  # FSDP1 FULL_SHARD, FSDP1 SHARD_GRAD_OP and FSDP2, each at 2 and 8 GPUs
    assert max(errors) - min(errors) <= SHARDING_BAR * smallest, errors


@pytest.mark.parametrize("row", [r for r in SHARDED if (r["family"], r["method"]) not in KNOWN_GAPS], ids=_id)
def test_planner_follows_the_traced_row(row):
    error = _error(row) / row["peak_bytes"]
    assert abs(error) <= BAR, f"{error:+.2%}"


def test_known_gaps_are_one_gpu_gaps():
    """The rows left out of the 2% bar miss, on one GPU without FSDP, the bytes they miss sharded."""
    for family, method in KNOWN_GAPS:
        one = _error(ONE_GPU[(family, method)])
        assert one < -0.01 * ONE_GPU[(family, method)]["peak_bytes"]
        for error, row in ERRORS[(family, method)]:
            assert abs(error - one) <= SHARDING_BAR * row["peak_bytes"]


@pytest.mark.slow
def test_the_stored_rows_are_what_the_tracer_traces():
    """Regeneration path: tracing stored rows again gives their stored peaks (``python -m tools.truth.sharded
    --write`` rebuilds them all; ``--show`` prints them against the planner)."""
    from tools.truth.sharded import ShardSetup, trace_sharded

    for fsdp, method in (("fsdp1", "qlora"), ("fsdp2", "lora")):
        row = next(r for r in SHARDED if (r["family"], r["method"], r["fsdp"], r["world_size"], r["strategy"])
                   == ("llama", method, fsdp, 8, "FULL_SHARD"))
        setup = ShardSetup(**{k: row[k] for k in ShardSetup.model_fields if k in row})  # older rows: defaults
        assert trace_sharded(CONFIGS["llama"], setup, 8)["peak_bytes"] == row["peak_bytes"]
