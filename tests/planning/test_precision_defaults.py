"""Precision by card: bf16 where it has tensor cores, fp16 mixed precision before Ampere (T4, V100)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from aegis import plan
from aegis.planning.hardware import list_gpus
from aegis.planning.planner import default_precision


@pytest.mark.parametrize("gpu", list_gpus(), ids=lambda g: g.id)
def test_bf16_is_native_where_torch_says_so_without_emulation(gpu, monkeypatch) -> None:
    """torch's own rule (`torch.cuda.is_bf16_supported(including_emulation=False)`) on a device of the card's
    compute capability decides; AMD (ROCm) always has bf16."""
    import torch

    if gpu.compute_capability is None:
        monkeypatch.setattr(torch.version, "hip", "6.2")
    else:
        major, minor = (int(x) for x in gpu.compute_capability.split("."))
        monkeypatch.setattr(torch.version, "hip", None)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda _d: SimpleNamespace(major=major, minor=minor))
    native = torch.cuda.is_bf16_supported(including_emulation=False)
    assert gpu.bf16_native is native
    assert default_precision(gpu) == ("bf16" if native else "fp16_mixed")
    assert (gpu.fp16_tflops is not None) is (not native)  # the fp16 rate is listed exactly where it differs


def test_a_t4_plan_is_fp16_and_timed_at_the_fp16_rate() -> None:
    fp16 = plan("qlora llama-3.2-1b on t4")
    asked = plan("qlora llama-3.2-1b bf16 on t4")
    assert fp16.recommended.config.precision == "fp16_mixed" and asked.recommended.config.precision == "bf16"
    assert any("no bf16 tensor cores" in n and "fp16 mixed precision" in n for n in fp16.notes)
    assert not any(r.title == "Precision" for r in fp16.risks)
    [risk] = [r for r in asked.risks if r.title == "Precision"]
    assert risk.level == "warn" and "emulated" in risk.detail and "fp16" in risk.detail
    assert "65 TFLOPS fp16" in fp16.throughput.basis and "8.1 TFLOPS bf16" in asked.throughput.basis
    ratio = fp16.throughput.tokens_per_s_high / asked.throughput.tokens_per_s_high
    assert ratio == pytest.approx(65 / 8.1, rel=0.05)  # same FLOPs per token (same config), other peak
    # LoRA's frozen base is 2 bytes in either half precision: the memory is the same
    assert fp16.recommended.memory.total_bytes == pytest.approx(asked.recommended.memory.total_bytes, rel=0.02)


def test_ampere_and_later_keep_bf16_and_say_nothing() -> None:
    report = plan("lora llama-3.2-1b on a100")
    assert report.recommended.config.precision == "bf16"
    assert not any("tensor cores" in n for n in report.notes) and not any(r.title == "Precision" for r in report.risks)
