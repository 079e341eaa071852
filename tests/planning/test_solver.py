"""Solver and planner: tiers fit, fallbacks shrink and fit, nothing-fits explains, multi-GPU."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import aegis
from aegis.planning.memory.estimate import estimate
from aegis.schema import LoRAConfig, TrainConfig
from aegis.planning.solver import AGGRESSIVE_HEADROOM_BYTES, comfort_bytes, solve

GPUS = ["rtx-3060-12gb", "rtx-3090", "rtx-4090", "l4", "a100-40gb", "a100-80gb", "h100-sxm"]
MODELS = ["llama-3.2-1b", "qwen2.5-0.5b", "llama-3.1-8b", "gemma-2-2b", "mistral-7b", "qwen1.5-moe-a2.7b", "phi-3-mini"]


@settings(max_examples=40, deadline=None)
@given(
    model=st.sampled_from(MODELS),
    gpu=st.sampled_from(GPUS),
    method=st.sampled_from(["full", "lora", "qlora"]),
    seq=st.sampled_from([256, 512, 1024, 2048, 4096]),
    eff=st.sampled_from([8, 16, 32]),
)
def test_every_tier_fits_its_budget(model, gpu, method, seq, eff):
    profile, card = aegis.resolve_model(model), aegis.find_gpu(gpu)
    sol = solve(profile, card, method=method, seq_len=seq, effective_batch_size=eff)
    previous = None
    for tier in sol.fallbacks:
        again = estimate(profile, tier.config, gpu=card)  # re-checked independently of the solver's cache
        assert again.high_bytes <= card.memory_bytes
        assert tier.config.effective_batch_size >= eff
        if previous is not None:
            assert again.total_bytes < previous
        previous = again.total_bytes
    if sol.recommended:
        assert sol.recommended.config.effective_batch_size >= eff
        if sol.recommended.headroom_bytes < comfort_bytes(card):  # tight only when no config keeps the comfort
            assert sol.recommended.headroom_bytes >= 0 and sol.recommended.summary.startswith("tight")
            assert sol.smallest.headroom_bytes < comfort_bytes(card)
    else:  # nothing recommended: not even the smallest configuration fits
        assert not sol.fallbacks and sol.smallest.headroom_bytes < 0
    if sol.aggressive:
        assert 0 <= sol.aggressive.headroom_bytes
        assert sol.aggressive.relative_speed > sol.recommended.relative_speed if sol.recommended else True


def test_seed_request_plans_with_fallbacks():
    report = aegis.plan("qlora llama-3.1-8b on 3090")
    assert report.recommended is not None and report.recommended.fits
    assert report.method == "qlora" and report.gpu.id == "rtx-3090"
    assert report.fallbacks and all(t.fits for t in report.fallbacks)
    assert {r.title for r in report.risks} >= {"VRAM", "Eval spike"}


def test_flags_win_over_text():
    report = aegis.plan("qlora llama-3.1-8b on 3090", gpu="a100-80gb", lora_rank=32)
    assert report.gpu.id == "a100-80gb" and report.lora.rank == 32


@pytest.mark.parametrize("model", ["phi-3.5-moe", "mixtral-8x7b"])
def test_nothing_fits_under_transformers_5_points_to_the_4x_expert_layout(model):
    """transformers 5 leaves fused experts unquantised under QLoRA; the 4.x layout quantises them: the report
    says so, and the plan it points to fits."""
    report = aegis.plan(f"qlora {model} on an h100 seq 4096", transformers_version="5.23.0", detect_stack=False)
    assert report.recommended is None and "--transformers 4.57" in report.nothing_fits
    v4 = aegis.plan(f"qlora {model} on an h100 seq 4096", transformers_version="4.57", detect_stack=False)
    assert v4.recommended is not None


def test_the_4x_expert_layout_hint_counts_the_gpus_asked_for():
    """On several GPUs the 4.x layout is tried sharded over them (FSDP), as the plan it points to runs."""
    ask = "qlora mixtral-8x22b on 2x a100 80gb"
    report = aegis.plan(ask, transformers_version="5.23.0", detect_stack=False)
    assert report.recommended is None and "FSDP over the 2 GPUs (--transformers 4.57)" in report.nothing_fits
    v4 = aegis.plan(ask, transformers_version="4.57", detect_stack=False)
    assert v4.recommended is not None and v4.multi_gpu is not None and v4.multi_gpu.assumed == "fsdp"


def test_nothing_fits_says_what_would():
    report = aegis.plan("full finetune llama-3.1-8b on 3060")
    assert report.recommended is None
    assert "What would fit" in report.nothing_fits and "QLoRA" in report.nothing_fits
    assert any(r.level == "danger" for r in report.risks)


def test_multi_gpu_reports_ddp_and_fsdp():
    report = aegis.plan("full finetune qwen2.5-7b on 2x a100 80gb, seq 4096")
    mg = report.multi_gpu
    assert mg is not None and mg.gpu_count == 2
    assert mg.fsdp_bytes < mg.ddp_bytes
    assert mg.assumed == "fsdp"  # weights + grads + AdamW states of 7.6B do not fit replicated
    assert report.recommended is not None


def test_plan_missing_gpu_is_a_clear_error():
    with pytest.raises(aegis.RequestParseError, match="no GPU named"):
        aegis.plan("lora llama-3.1-8b")


def test_a_job_that_fits_only_with_memory_savings_is_planned_with_them():
    """No micro batch of QLoRA Gemma 2 27B fits a 24 GB card as asked (AdamW, rank 16, full loss), but with the
    fallbacks' savings it does: the plan recommends that config and says why, instead of 'nothing fits'."""
    report = aegis.plan("qlora gemma-2-27b on rtx 3090", detect_stack=False)
    for ckpt in (False, True):  # as asked, not even micro batch 1 fits
        asked = TrainConfig(method="qlora", micro_batch_size=1, seq_len=1024, gradient_checkpointing=ckpt,
                            lora=LoRAConfig(), stack=report.stack)
        assert estimate(aegis.resolve_model("gemma-2-27b"), asked, gpu=report.gpu).high_bytes > report.gpu.memory_bytes
    rec = report.recommended
    assert rec is not None and rec.fits and report.nothing_fits is None
    assert (rec.config.optimizer, rec.config.chunked_cross_entropy, rec.config.lora_config.rank) != ("adamw", False, 16)
    assert rec.summary.startswith(("no micro batch fits as asked", "tight"))


@pytest.mark.parametrize("request_text", [
    "lora stablelm-zephyr-3b on a T4",  # micro batch 8 keeps 0.4 GiB once reserved segments are counted
    "lora llama-3.2-3b on a T4", "qlora qwen2.5-7b on a 4090", "lora qwen2.5-1.5b on an a10g seq 2048",
    "qlora llama-3.1-8b on 3090",
])
def test_the_recommended_tier_keeps_the_comfortable_headroom_on_the_device(request_text):
    """The report's headroom is judged on the device (reserved segments + context). A recommended tier that keeps the
    comfortable headroom only before that gives way to the first fallback that keeps it at the device level; the
    faster config becomes the aggressive tier when it keeps under 1 GiB; no fallback repeats the recommended one."""
    report = aegis.plan(request_text)
    rec, comfort = report.recommended, comfort_bytes(report.gpu)
    assert rec is not None and rec.memory.reserved_bytes is not None
    if rec.summary.startswith("fastest config with >="):
        assert rec.headroom_bytes >= comfort, (rec.summary, rec.headroom_bytes)
    assert all(fb.config != rec.config for fb in report.fallbacks)
    assert all(fb.memory.tensor_bytes < rec.memory.tensor_bytes for fb in report.fallbacks)
    if report.aggressive is not None:
        assert report.aggressive.relative_speed > rec.relative_speed
        assert report.aggressive.fits


def test_a_recommended_tier_the_allocator_makes_tight_gives_way_and_says_why():
    report = aegis.plan("lora stablelm-zephyr-3b on a T4")
    assert report.recommended.config.micro_batch_size == 4 and report.aggressive.config.micro_batch_size == 8
    assert 0 <= report.aggressive.headroom_bytes < AGGRESSIVE_HEADROOM_BYTES
    assert any("micro batch 8 keeps only" in n and "planned micro batch 4" in n for n in report.notes)
    assert not any(n.startswith("aggressive tier omitted") for n in report.notes)
