"""A multi-GPU plan's device-level memory (`aegis.planning.memory.multi_gpu.multi_gpu_device_level`): what each GPU shows
includes NCCL's buffers for the world size, sized by NCCL's own formula, printed by ``--explain`` and in the JSON."""

from __future__ import annotations

import json

import pytest

from aegis.planning.planner import plan
from aegis.planning.report import render_json, render_text

MIB = 1 << 20


def _nccl_formula(channels: int = 32) -> int:
    """NCCL's buffers on one rank of a ring (NCCL src/init.cc and src/include/device.h defaults): per channel one
    connection, whose Simple FIFO is ``NCCL_BUFFSIZE`` (4 MiB), LL ``NCCL_LL_LINES_PER_THREAD (8) x
    NCCL_LL_MAX_NTHREADS (512) x NCCL_STEPS (8) x sizeof(ncclLLFifoLine) (16)`` and LL128
    ``NCCL_LL128_ELEMS_PER_THREAD (120) x NCCL_LL128_MAX_NTHREADS (640) x NCCL_STEPS (8) x sizeof(uint64_t) (8)``;
    ``MAXCHANNELS`` 32 at most."""
    return channels * (4 * MIB + 8 * 512 * 8 * 16 + 120 * 640 * 8 * 8)


@pytest.mark.parametrize(("request_text", "strategy"), [
    ("lora llama 3.2 1b on 2x h100", "ddp"), ("full llama 3.2 1b on 8x h100", "ddp"),
    ("full llama 3.1 8b on 2x h100", "fsdp")])
def test_a_multi_gpu_plan_counts_nccl_buffers_on_each_gpu(request_text, strategy):
    report = plan(request_text)
    assert report.gpu_count > 1 and report.multi_gpu is not None and report.multi_gpu.assumed == strategy
    level = report.recommended.memory.device_level
    assert level is not None
    assert level.nccl_bytes == _nccl_formula() == 308_281_344
    assert level.allocated_bytes == report.recommended.memory.tensor_bytes  # the sharded (or DDP) per-GPU peak
    assert level.device_bytes == (level.reserved_bytes + level.context_bytes + level.cublas_workspace_bytes
                                  + level.nccl_bytes)
    text = " ".join(render_text(report, explain=True).split())
    assert "Device (nvidia-smi)" in text and "NCCL buffers 0.29 GiB" in text
    if strategy == "ddp":  # the one-GPU step with DDP's buckets replayed (tests/planning/memory/test_ddp_reserved.py)
        assert level.replay.startswith("two steps of") and "DDP rank on" in level.replay
        assert level.reserved_bytes >= level.allocated_bytes
        assert "a multi-GPU step is not replayed" not in text
    else:  # rank 0's sharded step replayed through the allocator model, FSDP's side streams apart
        assert level.replay.startswith("two steps of") and "FSDP FULL_SHARD on 2 GPUs" in level.replay
        assert level.reserved_bytes > level.allocated_bytes
        assert "a multi-GPU step is not replayed" not in text and "the caching allocator keeps cached" in text
    data = json.loads(render_json(report))
    assert data["recommended"]["memory"]["device_level"]["nccl_bytes"] == _nccl_formula()


def test_one_gpu_keeps_its_replay_and_no_nccl():
    report = plan("lora llama 3.2 1b on h100")
    level = report.recommended.memory.device_level
    assert level is not None and level.nccl_bytes == 0 and level.replay.startswith("two steps of")
    assert "NCCL" not in render_text(report, explain=True)
