"""The memory model against a real GPU: truth rows run on an H100 and an H200 by `tools/truth/cuda.py`.

`tests/data/gpu_truth.json` holds what CUDA's caching allocator reported (`max_memory_allocated`,
`max_memory_reserved`) for the truth rows' training steps, run with real tensors and random weights
(torch 2.11 + cu130, transformers 5.24, bitsandbytes 0.50.2). No one here wrote these numbers; they check
the three layers the planner stands on:

- the fake-tensor trace (`tools/truth/trace.py`): what it calls the peak is what the GPU allocated;
- the allocator model (`aegis.planning.memory.allocator`): the traced stream, replayed, gives the GPU's reserved peak;
- the planner (`aegis.planning.memory.device`): its allocated and reserved peaks against the GPU's.

`tests/data/gpu_truth_h200.json` holds 35 more rows run on a lent H200 (same torch, transformers and
bitsandbytes): rows the H100 run did not reach, chosen for multi-query and fused-qkv attention (GPTBigCode,
Falcon), 7-8B LoRA and QLoRA and GPT-2. Eight of them are open findings (`H200_OPEN`): the planner is under by
4-17% there, and they are marked as such rather than loosened into a bound.

QLoRA rows are left out of the reserved checks. The trace's preparation builds the bf16 model, then
quantises it (`tools/truth/model.py`), so the GPU's reserved peak includes that bf16 model's cached
segments. A real QLoRA load quantises layer by layer and never holds it.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from tools.truth.cuda import compare

DATA = Path(__file__).resolve().parents[2] / "data" / "gpu_truth.json"
MEASURED = json.loads(DATA.read_text(encoding="utf-8"))
RESULTS = compare(MEASURED)
BY_KEY = {r["key"]: r for r in MEASURED["rows"]}


def _err(a: float, b: float) -> float:
    return a / b - 1


def test_the_measurements_cover_the_table():
    assert MEASURED["device"].startswith("NVIDIA H100")
    assert len(RESULTS) >= 60
    assert {r["method"] for r in RESULTS} == {"full", "lora", "qlora"}
    assert {r["attention"] for r in RESULTS} == {"sdpa", "eager"}
    assert {r["gc"] for r in RESULTS} == {True, False}
    assert len({r["model_id"] for r in RESULTS}) >= 20


def test_traced_peak_is_what_the_gpu_allocates():
    errors = {r["key"]: _err(r["traced"], r["gpu_allocated"]) for r in RESULTS}
    assert max(abs(e) for e in errors.values()) <= 0.025, errors
    assert statistics.median(abs(e) for e in errors.values()) <= 0.002


def test_fp32_grouped_query_attention_runs_the_math_kernel():
    """A k-bit-prepared model without autocast hands SDPA float32 q, k, v with fewer key/value heads: CUDA runs its
    math kernel (flash and cuDNN take bf16/fp16 only, the memory-efficient kernel no grouped heads)."""
    key = ("meta-llama/Llama-3.2-1B|qlora|bf16|adamw_foreach|b2|s1024|gc0|sdpa|r16a32|"
           "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj")
    row = next(r for r in RESULTS if r["key"] == key)
    # 16 layers x [2, 32, 1024, 1024] float32 probabilities = 4 GiB above the flash layout, on the GPU and in both models
    assert row["gpu_allocated"] > 14 * 2**30
    assert abs(_err(row["traced"], row["gpu_allocated"])) < 0.005
    assert abs(_err(row["planned_allocated"], row["gpu_allocated"])) < 0.01


def test_planner_allocated_matches_the_gpu():
    errors = {r["key"]: _err(r["planned_allocated"], r["gpu_allocated"]) for r in RESULTS}
    assert max(abs(e) for e in errors.values()) <= 0.03, errors
    assert statistics.median(abs(e) for e in errors.values()) <= 0.01


def test_allocator_model_replays_the_gpu_reserved_peak():
    rows = [r for r in RESULTS if r["replayed_reserved"] and r["method"] != "qlora"]
    assert len(rows) >= 15
    errors = {r["key"]: _err(r["replayed_reserved"], r["gpu_reserved"]) for r in rows}
    assert max(abs(e) for e in errors.values()) <= 0.02, errors


def test_the_gpus_reserved_outlier_is_the_builds_freed_head():
    """gemma-3-1b, checkpointed: the GPU reserved 11% less than the plan. The GPU built the model as the trace does,
    with ``from_config``, which allocates the tied head's weight (576 MiB) and frees it when the weights are tied;
    the steps' tensors are then carved out of that cached block. ``from_pretrained`` never allocates it. The same
    traced stream replayed as traced gives the GPU's figure, replayed as loaded (`tools.truth.stream.as_loaded`)
    the plan's."""
    key = "google/gemma-3-1b-pt|full|bf16|adamw_foreach|b2|s1024|gc1|sdpa"
    row = next(r for r in RESULTS if r["key"] == key)
    assert _err(row["planned_reserved"], row["gpu_reserved"]) > 0.10
    assert abs(_err(row["replayed_reserved"], row["gpu_reserved"])) < 0.01
    assert abs(_err(row["planned_reserved"], row["replayed_reserved_as_loaded"])) < 0.01


def test_planner_reserved_against_the_gpu_rows_traced_streams_as_loaded():
    """Every GPU row with a fake-tensor traced stream of the same step: the plan against that stream replayed as loaded."""
    rows = [r for r in RESULTS if r["replayed_reserved_as_loaded"] and r["method"] != "qlora"]
    assert len(rows) >= 15
    errors = {r["key"]: _err(r["planned_reserved"], r["replayed_reserved_as_loaded"]) for r in rows}
    assert max(abs(e) for e in errors.values()) <= 0.04, errors
    assert statistics.median(abs(e) for e in errors.values()) <= 0.01


def test_planner_reserved_against_the_gpu():
    rows = [r for r in RESULTS if r["method"] != "qlora"]
    errors = {r["key"]: _err(r["planned_reserved"], r["gpu_reserved"]) for r in rows}
    assert statistics.median(abs(e) for e in errors.values()) <= 0.02
    assert max(abs(e) for e in errors.values()) <= 0.15, errors
    # the reserved peak is above the allocated one on the GPU, and the planner says so
    assert all(r["gpu_reserved"] > r["gpu_allocated"] and r["planned_reserved"] > r["planned_allocated"] for r in rows)


@pytest.mark.parametrize("key", [k for k, m in BY_KEY.items() if "error" in m])
def test_rows_that_could_not_run_are_explained(key):
    """QLoRA rows whose bf16 and NF4 weights, both held while the trace quantises, fill the GPU: `cuda.py` now skips
    them."""
    from tools.memory_table import load_rows
    from tools.truth.cuda import GIB, _skip_reason

    row = next(r for r in load_rows() if r["key"] == key)
    assert "OutOfMemoryError" in BY_KEY[key]["error"]
    reason = _skip_reason(row, MEASURED["total_bytes"], MEASURED["versions"], has_bnb=True)
    assert reason is not None and "bf16" in reason, (reason, row["param_count_total"] * 2 / GIB)


def test_fused_adamw_keeps_no_temporaries_on_the_gpu():
    """The fused row's reserved peak is the plan's once the plan drops foreach's sqrt(v) copies (it was +11.5%)."""
    key = "meta-llama/Llama-3.2-1B|full|bf16|adamw_fused|b2|s1024|gc0|sdpa"
    row = next(r for r in RESULTS if r["key"] == key)
    assert abs(_err(row["planned_reserved"], row["gpu_reserved"])) < 0.02


H200 = json.loads((DATA.parent / "gpu_truth_h200.json").read_text(encoding="utf-8"))
H200_RESULTS = compare(H200)
H200_OPEN = {
    # attention dropout 0.1 under autocast, SDPA, no checkpointing: the GPU's own tracker sees what the GPU allocated
    # (within 0.35%), the CPU trace (flash-style SDPA with dropout in the kernel) does not: 1.75-2.0 B per element of
    # a [b, heads, s, s] score tensor per layer on GPT-2, 0.5 on GPTBigCode's multi-query attention. Which kernel
    # CUDA ran there was not recorded.
    "bigcode/gpt_bigcode-santacoder|full|bf16|adamw_fused|b2|s1024|gc0|sdpa|autocast": -0.0394,
    "bigcode/gpt_bigcode-santacoder|lora|bf16|adamw_fused|b4|s1024|gc0|sdpa|r16a32|c_attn,c_proj,c_fc|autocast": -0.0664,
    "openai-community/gpt2-xl|full|bf16|adamw_fused|b1|s1024|gc0|sdpa|autocast": -0.1483,
    "openai-community/gpt2|lora|bf16|adamw_fused|b8|s1024|gc0|sdpa|r16a32|c_attn,c_proj,c_fc|autocast": -0.1780,
    # QLoRA without autocast (float32 hidden states; grouped-query attention runs the math kernel), checkpointed, at
    # 2,048-4,096 tokens: the GPU allocated 6-11% the GPU's own tracker did not see (Llama: the tracker -11.08% too)
    "bigcode/starcoder2-3b|qlora|bf16|adamw_foreach|b2|s2048|gc1|sdpa|r16a32|q_proj,k_proj,v_proj,o_proj,c_fc,c_proj":
        -0.1084,
    "meta-llama/Llama-3.1-8B|qlora|bf16|adamw_foreach|b1|s4096|gc1|sdpa|r16a32|q_proj,k_proj,v_proj,o_proj,gate_proj,"
    "up_proj,down_proj": -0.1108,
    "meta-llama/Llama-3.1-8B|qlora|bf16|adamw_foreach|b1|s4096|gc1|sdpa|r16a32|q_proj,k_proj,v_proj,o_proj,gate_proj,"
    "up_proj,down_proj|reentrant": -0.1100,
    # over by 3%: bitsandbytes under autocast
    "bigcode/starcoder2-3b|qlora|bf16|adamw_foreach|b2|s1024|gc0|sdpa|r16a32|q_proj,k_proj,v_proj,o_proj,c_fc,c_proj|"
    "autocast": 0.0297,
}


def test_h200_rows_cover_new_layouts():
    assert H200["device"] == "NVIDIA H200" and len(H200_RESULTS) == 35
    assert not {r["key"] for r in H200_RESULTS} & set(BY_KEY)  # none of them was measured on the H100
    families = {r["model_id"] for r in H200_RESULTS}
    assert {"bigcode/gpt_bigcode-santacoder", "tiiuae/falcon-7b", "meta-llama/Llama-3.1-8B"} <= families


def test_h200_traced_and_planned_allocated_match_the_gpu():
    rows = [r for r in H200_RESULTS if r["key"] not in H200_OPEN]
    assert len(rows) >= 25
    traced = {r["key"]: _err(r["traced"], r["gpu_allocated"]) for r in rows}
    planned = {r["key"]: _err(r["planned_allocated"], r["gpu_allocated"]) for r in rows}
    assert max(abs(e) for e in traced.values()) <= 0.025, traced
    assert max(abs(e) for e in planned.values()) <= 0.03, planned
    assert statistics.median(abs(e) for e in planned.values()) <= 0.005


@pytest.mark.parametrize("key", sorted(H200_OPEN))
def test_h200_open_findings_are_what_was_measured(key):
    """The open rows' traced error is the one recorded above: a change to the trace that moves them (a fix) shows here
    and must update the list."""
    row = next(r for r in H200_RESULTS if r["key"] == key)
    assert _err(row["traced"], row["gpu_allocated"]) == pytest.approx(H200_OPEN[key], abs=5e-4)
