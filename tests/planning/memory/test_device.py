"""Device-level memory: the planner's allocation stream, its reserved peak, and how plans are judged on it.

The reference for the reserved peak is the allocation stream of real (fake-tensor traced) HF training steps,
replayed through the same allocator model (`tests/data/reserved_truth.json`, built by `tools/truth/reserved.py`);
the allocator model itself is checked against hand-worked sequences in test_allocator.py.
"""

from __future__ import annotations

import statistics

import pytest

from aegis.planning import hardware
from aegis.models.resolve import resolve_model
from aegis.planning.memory.allocator import replay
from aegis.planning.memory.device import allocation_stream, device_check, device_memory
from aegis.planning.memory.estimate import estimate
from aegis.schema import LoRAConfig, Tier, TrainConfig
from tools.memory_table import config_of, load_rows, profile_of
from tools.truth.reserved import compare, load

ROWS = [r for r in load_rows() if r["peak_bytes"] <= 60 * 2**30]

# Measured on the stored rows (see the table `python -m tools.truth.reserved --show` prints).
RESERVED_MEDIAN_BAR = 0.01
RESERVED_WORST_BAR = 0.04


@pytest.mark.parametrize("row", ROWS, ids=[r["key"].split("|q_proj")[0] for r in ROWS])
def test_stream_carries_the_estimates_tensors(row):
    """The stream is written from the estimate's own tensors: its live peak is the estimate's tensor peak."""
    profile, cfg = profile_of(row), config_of(row)
    events = allocation_stream(profile, cfg)
    stats = replay(events)
    # requested bytes: the allocator's `allocated` also counts whole cached blocks handed out unsplit
    assert stats.max_requested_bytes == pytest.approx(estimate(profile, cfg).tensor_bytes, rel=0.01)
    assert stats.max_reserved_bytes >= stats.max_allocated_bytes >= stats.max_requested_bytes
    # well formed: every id allocated once and freed at most once, after its allocation
    seen: set[int] = set()
    freed: set[int] = set()
    for kind, ident, _ in events:
        if kind == "alloc":
            assert ident not in seen
            seen.add(ident)
        else:
            assert ident in seen and ident not in freed
            freed.add(ident)


def test_reserved_matches_traced_streams():
    """Predicted reserved peak vs the traced step's own allocation stream through the same allocator."""
    results = compare()
    assert len(results) >= 12
    assert len({r["model_id"] for r in results}) >= 3 and {r["method"] for r in results} == {"full", "lora", "qlora"}
    errors = [abs(r["error"]) for r in results]
    assert statistics.median(errors) <= RESERVED_MEDIAN_BAR, errors
    assert max(errors) <= RESERVED_WORST_BAR, [(r["key"], r["error"]) for r in results]
    # better than taking the live peak for what the device shows
    naive = [abs(r["traced_allocated"] / r["traced_reserved"] - 1) for r in results]
    assert statistics.median(errors) < statistics.median(naive) / 2, (statistics.median(errors), statistics.median(naive))
    # the traced streams do fragment: reserved above allocated on every row
    assert all(r["traced_reserved"] > r["traced_allocated"] for r in results)
    # and the prediction says so too, not a copy of the live peak
    assert all(r["predicted_reserved"] > r["predicted_allocated"] for r in results)


def test_reserved_table_rows_are_truth_rows():
    truth = {r["key"] for r in load_rows()}
    stored = load()
    assert stored and set(stored) <= truth


def _tier(profile, cfg, gpu) -> Tier:
    est = estimate(profile, cfg, gpu=gpu)
    headroom = gpu.memory_bytes - est.high_bytes
    return Tier(name="recommended", config=cfg, memory=est, headroom_bytes=headroom, fits=headroom >= 0, summary="")


def test_device_check_judges_headroom_on_reserved():
    gpu = hardware.find_gpu("a100 80gb")
    profile = resolve_model("meta-llama/Llama-3.2-1B")
    cfg = TrainConfig(method="lora", micro_batch_size=2, seq_len=1024, lora=LoRAConfig())
    tier = _tier(profile, cfg, gpu)
    checked = device_check(profile, gpu, tier)
    dev = device_memory(profile, cfg)
    assert checked.memory.reserved_bytes == dev.max_reserved_bytes > checked.memory.tensor_bytes
    assert checked.memory.device_bytes == dev.max_reserved_bytes + tier.memory.overhead_bytes
    assert checked.memory.high_bytes == max(tier.memory.high_bytes, checked.memory.device_bytes)
    assert checked.headroom_bytes == gpu.memory_bytes - checked.memory.high_bytes
    assert checked.fits


def test_a_tier_whose_segments_do_not_fit_is_flushed_or_refused():
    """Reserved above the card: the allocator flushes its cache and retries (fits, headroom 0) unless an
    allocation fails even then (does not fit) -- as PyTorch's allocator does."""
    profile = resolve_model("Qwen/Qwen2.5-1.5B")  # full fine-tuning with checkpointing fragments (~20%)
    cfg = TrainConfig(method="full", micro_batch_size=2, seq_len=1024, gradient_checkpointing=True)
    unlimited = device_memory(profile, cfg)
    base = hardware.find_gpu("a100 80gb")
    est = estimate(profile, cfg, gpu=base)
    assert unlimited.max_reserved_bytes + est.overhead_bytes > est.high_bytes  # the margin does not cover it
    # a card on which the tensor-level range fits but the unlimited reserved peak does not
    gpu = base.model_copy(update={"memory_bytes": est.high_bytes})
    tier = _tier(profile, cfg, gpu)
    assert tier.fits
    capped = device_memory(profile, cfg, capacity_bytes=gpu.memory_bytes - est.overhead_bytes)
    assert capped.alloc_retries > 0 or capped.out_of_memory
    checked = device_check(profile, gpu, tier)
    if capped.out_of_memory:
        expandable = device_memory(profile, cfg, expandable_segments=True, capacity_bytes=gpu.memory_bytes - est.overhead_bytes)
        assert checked.fits == (not expandable.out_of_memory)
    else:
        assert checked.fits and checked.headroom_bytes == 0
        assert checked.memory.reserved_bytes <= gpu.memory_bytes - est.overhead_bytes
    # below the live peak nothing fits
    assert device_memory(profile, cfg, capacity_bytes=unlimited.max_requested_bytes // 2).out_of_memory


def test_plan_reports_reserved_beside_allocated():
    from aegis import plan
    from aegis.planning.report import render_text

    report = plan("lora llama-3.2-1b on a100 80gb")
    mem = report.recommended.memory
    assert mem.reserved_bytes is not None and mem.reserved_bytes >= mem.tensor_bytes
    text = " ".join(render_text(report).split())
    assert f"{mem.reserved_bytes / 2**30:.2f} GiB reserved" in text
    assert f"Total {mem.total_bytes / 2**30:.2f} GiB" in text  # allocated (live + overhead) beside it
    explained = " ".join(render_text(report, explain=True).split())
    assert "Reserved (peak)" in explained and "Device (nvidia-smi)" in explained  # which replay: two fixed steps
    assert f"two steps of {report.recommended.config.seq_len} tokens replayed" in explained


def test_emitted_configs_set_expandable_segments_when_the_plan_needs_them():
    from aegis import plan
    from aegis.planning.report import emit

    report = plan("lora llama-3.2-1b on a100 80gb")
    assert "expandable_segments" not in emit(report, "hf")
    rec = report.recommended
    needs = report.model_copy(update={"recommended": rec.model_copy(
        update={"memory": rec.memory.model_copy(update={"expandable_segments": True})})})
    script = emit(needs, "hf")
    compile(script, "train_hf.py", "exec")
    assert script.index('os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")') < script.index("import torch")
    assert "# Run: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True axolotl train" in emit(needs, "axolotl")
    assert f"{rec.memory.reserved_bytes / 2**30:.2f} GiB reserved by the allocator" in script
