"""What nvidia-smi shows: allocated, reserved and device-level memory (aegis.planning.memory.runtime), each figure against
the source it is taken from (PyTorch's and NCCL's defaults, our H100 measurement), and the report's three lines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from aegis.planning.hardware import find_gpu
from aegis.models.resolve import resolve_model
from aegis.planning.memory.device import device_check
from aegis.planning.memory.estimate import estimate_memory
from aegis.planning.memory.runtime import (
    CONTEXT_EAGER_BYTES,
    CONTEXT_LAZY_BYTES,
    NCCL_CONNECTION_BYTES,
    NCCL_MAX_CHANNELS,
    context_bytes,
    cublas_workspace_bytes,
    device_level,
    nccl_buffer_bytes,
)
from aegis.schema import Tier

GPU_TRUTH = Path(__file__).resolve().parents[2] / "data" / "gpu_truth.json"


def _workspace(config: str) -> int:
    """Bytes of a ``CUBLAS_WORKSPACE_CONFIG`` string ``:SIZE_KiB:COUNT[:SIZE_KiB:COUNT...]``, as PyTorch parses it."""
    numbers = [int(x) for x in config.strip(":").split(":")]
    return sum(size * 1024 * count for size, count in zip(numbers[::2], numbers[1::2], strict=True))


def test_cublas_workspace_is_pytorchs_default_and_our_h100_measurement():
    # PyTorch's defaults (CublasHandlePool.cpp): ":4096:2:16:8" before Hopper, ":4096:8" on sm90+
    assert cublas_workspace_bytes(find_gpu("a100-80gb")) == _workspace(":4096:2:16:8") == 8_519_680
    assert cublas_workspace_bytes(find_gpu("rtx-4090")) == _workspace(":4096:2:16:8")
    hopper = cublas_workspace_bytes(find_gpu("h100-sxm"))
    assert hopper == _workspace(":4096:8")
    # measured on a lent H100 (tools/truth/cuda.py): allocated after one bf16 256x256 matmul, less 2 x 131,072 B
    # operand bytes of which only one (the input) was still live
    measured = {r.get("cublas_workspace_bytes") for r in json.loads(GPU_TRUTH.read_text())["rows"]} - {None}
    assert measured == {hopper - 256 * 256 * 2}
    assert cublas_workspace_bytes(find_gpu("mi300x")) == 0  # hipBLASLt not modelled
    assert cublas_workspace_bytes(find_gpu("h100-sxm"), streams=2) == 2 * hopper


def test_nccl_buffers_follow_ncclss_defaults_and_do_not_grow_with_a_ring():
    # NCCL_BUFFSIZE 4 MiB (Simple) + LL 8*512*8*16 + LL128 120*640*8*8 per connection (NCCL src/init.cc)
    assert NCCL_CONNECTION_BYTES == 4 * 2**20 + 524_288 + 4_915_200
    assert nccl_buffer_bytes(1) == 0
    assert nccl_buffer_bytes(2) == nccl_buffer_bytes(8) == NCCL_MAX_CHANNELS * NCCL_CONNECTION_BYTES
    assert nccl_buffer_bytes(2, channels=4) == 4 * NCCL_CONNECTION_BYTES
    with pytest.raises(ValueError):
        nccl_buffer_bytes(0)


def test_device_level_adds_what_lives_outside_the_replayed_allocator():
    gpu = find_gpu("h100-sxm")
    one = device_level(gpu, allocated_bytes=10 << 30, reserved_bytes=11 << 30, replay="two steps of 512 tokens")
    assert one.cache_bytes == 1 << 30
    assert one.device_bytes == (11 << 30) + CONTEXT_LAZY_BYTES + cublas_workspace_bytes(gpu)
    two = device_level(gpu, allocated_bytes=10 << 30, reserved_bytes=11 << 30, world_size=2)
    assert two.device_bytes - one.device_bytes == nccl_buffer_bytes(2) > 0
    assert context_bytes(lazy=False) == CONTEXT_EAGER_BYTES > context_bytes()
    assert one.allocated_bytes <= one.reserved_bytes <= one.device_bytes


def _tier(profile, gpu, **kw) -> Tier:
    est = estimate_memory(profile, gpu=gpu.id, **kw)
    return Tier(name="recommended", config=est.config, memory=est, headroom_bytes=gpu.memory_bytes - est.high_bytes,
                fits=True, summary="")


def test_device_check_records_the_levels_and_the_replay_they_came_from():
    profile = resolve_model("Qwen/Qwen2.5-0.5B")
    gpu = find_gpu("a100-80gb")
    tier = _tier(profile, gpu, method="lora", seq_len=512)
    fixed = device_check(profile, gpu, tier).memory
    level = fixed.device_level
    assert level is not None and level.replay == "two steps of 512 tokens"
    assert level.reserved_bytes == fixed.reserved_bytes and level.allocated_bytes <= level.reserved_bytes
    assert level.nccl_bytes == 0 and level.device_bytes > level.reserved_bytes
    run = device_check(profile, gpu, tier, [100, 300, 700, 40]).memory.device_level
    assert run is not None and run.replay == "16 steps of the dataset's lengths, then one of 512 tokens"


def test_report_prints_the_three_levels_with_their_meaning():
    from aegis.planning.planner import plan
    from aegis.planning.report import render_json, render_markdown, render_text

    report = plan("lora qwen2.5-0.5b on a100 80gb")
    level = report.recommended.memory.device_level
    assert level is not None
    # --explain's breakdown (the compact report keeps its ~60 lines: its range line names the reserved peak)
    text, md = render_text(report, explain=True), render_markdown(report, explain=True)
    assert "Device (nvidia-smi)" not in render_text(report)
    for out in (text, md):
        assert "Allocated (peak)" in out and "max_memory_allocated" in out
        assert "Reserved (peak)" in out and "max_memory_reserved" in out
        assert "Device (nvidia-smi)" in out and "CUDA context" in out
        assert f"two steps of {report.recommended.config.seq_len} tokens" in " ".join(out.split())
    data = json.loads(render_json(report))
    assert data["recommended"]["memory"]["device_level"]["device_bytes"] == level.device_bytes
