"""What `nvidia-smi` shows for a training process: the allocator's reserved memory plus what lives outside it.

Three levels of memory, each a different number a user can read:

- **allocated** (`torch.cuda.max_memory_allocated`): the live tensors' blocks at the step's peak;
- **reserved** (`torch.cuda.max_memory_reserved`): the segments the caching allocator holds, allocated plus
  its cache (freed blocks kept for reuse, split remainders); `aegis.planning.memory.device` replays it;
- **device** (`nvidia-smi`'s per-process "GPU Memory Usage"): reserved plus what never goes through the
  caching allocator: the CUDA context, and NCCL's communication buffers when several GPUs train together.
  The cuBLAS workspace does go through the allocator, but not through the replayed stream, so it is added.

    from aegis.planning.memory.runtime import device_level
    level = device_level(gpu, allocated_bytes=a, reserved_bytes=r, world_size=2)
    level.device_bytes          # reserved + context + cuBLAS workspace + NCCL buffers

Every figure below is a published constant of the library that allocates it, or a published or our own
measurement, named where it is defined (no figure is fitted to a run). What is not modelled: cuDNN
workspaces (per-call, through the caching allocator, in the step's stream only where the truth traced them),
NCCL's proxy and network (InfiniBand) buffers across nodes, CUDA graphs' private pools, other processes
on the GPU, and the driver's own reservation that newer drivers list as "Reserved" (`aegis/models/catalog/GPUS.md`).
"""

from __future__ import annotations

from aegis.schema import GPU, DeviceLevelMemory

__all__ = [
    "CONTEXT_LAZY_BYTES",
    "CONTEXT_EAGER_BYTES",
    "CUBLAS_WORKSPACE_BYTES",
    "CUBLAS_WORKSPACE_HOPPER_BYTES",
    "NCCL_CONNECTION_BYTES",
    "NCCL_MAX_CHANNELS",
    "context_bytes",
    "cublas_workspace_bytes",
    "nccl_buffer_bytes",
    "device_level",
]

CONTEXT_LAZY_BYTES = 287_047_680
"""The CUDA context of a PyTorch process with ``CUDA_MODULE_LOADING=LAZY``: 287,047,680 B as measured in
PyTorch PR #86509 ("Sets CUDA_MODULE_LOADING to LAZY when not set by the user", PyTorch 1.13; the PR does not
name its GPU). PyTorch >= 1.13 sets LAZY when the user has not, and CUDA makes it the default on Linux from 12.2
(CUDA Programming Guide, "Lazy Loading", change history). A published measurement, not ours: our H100 rows
(tests/data/gpu_truth.json) record the allocator's counters and the device total, not the device's used memory.
The context grows with the kernels a run loads, so a real run's context is at least this."""
CONTEXT_EAGER_BYTES = 666_632_192
"""The same process with ``CUDA_MODULE_LOADING=EAGER`` (every module loaded at start): 666,632,192 B, same
source (PyTorch PR #86509)."""
CUBLAS_WORKSPACE_BYTES = 4096 * 1024 * 2 + 16 * 1024 * 8
"""PyTorch's default cuBLAS workspace before Hopper, ``CUBLAS_WORKSPACE_CONFIG`` default ``:4096:2:16:8`` (two
4 MiB chunks and eight 16 KiB ones = 8,519,680 B; aten/src/ATen/cuda/CublasHandlePool.cpp,
``getChosenWorkspaceSize``)."""
CUBLAS_WORKSPACE_HOPPER_BYTES = 32 * 1024 * 1024
"""The default on compute capability 9.0 and later: ``:4096:8`` = 32 MiB (same file). Our H100 run measured it:
tests/data/gpu_truth.json ``cublas_workspace_bytes`` 33,423,360 is the allocated bytes after one bf16 256 x 256
matmul less two operands' 131,072 B, of which one (the result) had been freed: 33,423,360 + 131,072 = 32 MiB."""
NCCL_SIMPLE_BUFFER_BYTES = 1 << 22
"""``NCCL_BUFFSIZE`` default, the Simple protocol's FIFO per connection: 4,194,304 B (4 MiB) (NCCL user guide,
"Environment Variables", NCCL_BUFFSIZE; src/init.cc ``DEFAULT_BUFFSIZE``)."""
NCCL_LL_BUFFER_BYTES = 8 * 512 * 8 * 16
"""The LL protocol's buffer per connection: lines per thread 8 x 512 threads x 8 steps x 16 B = 524,288 B
(src/init.cc ``DEFAULT_LL_BUFFSIZE``)."""
NCCL_LL128_BUFFER_BYTES = 120 * 640 * 8 * 8
"""The LL128 protocol's buffer per connection: 120 elements per thread x 640 threads x 8 steps x 8 B = 4,915,200 B
(src/init.cc ``DEFAULT_LL128_BUFFSIZE``)."""
NCCL_CONNECTION_BYTES = NCCL_SIMPLE_BUFFER_BYTES + NCCL_LL_BUFFER_BYTES + NCCL_LL128_BUFFER_BYTES
"""One connection's buffers for the three protocols: 9,633,792 B."""
NCCL_MAX_CHANNELS = 32
"""NCCL's channel limit (src/include/device.h ``MAXCHANNELS``). NCCL picks fewer on slower links (a few over
PCIe, up to this over NVLink/NVSwitch), so this gives the high end. "Each channel has its own buffer for
collective operations" and a ring "only has 2 connections regardless of the scale" (NCCL maintainers,
NVIDIA/nccl#1450 and #986): per channel one connection's buffers on each GPU (the other end's are on its peer)."""


def context_bytes(lazy: bool = True) -> int:
    """The CUDA context: lazy module loading (PyTorch's and CUDA >= 12.2's default) or eager."""
    return CONTEXT_LAZY_BYTES if lazy else CONTEXT_EAGER_BYTES


def cublas_workspace_bytes(gpu: GPU, streams: int = 1) -> int:
    """PyTorch's default cuBLAS workspace, one per (handle, stream) pair: a training step on one stream has one.
    AMD GPUs (hipBLASLt) are not modelled: 0."""
    if gpu.vendor != "nvidia" or gpu.compute_capability is None:
        return 0
    major = int(gpu.compute_capability.split(".")[0])
    return streams * (CUBLAS_WORKSPACE_HOPPER_BYTES if major >= 9 else CUBLAS_WORKSPACE_BYTES)


def nccl_buffer_bytes(world_size: int, channels: int = NCCL_MAX_CHANNELS) -> int:
    """NCCL's ring buffers on one GPU of ``world_size``: ``channels`` x one connection's Simple, LL and LL128
    buffers; none on one GPU (no communicator). The same at any world size: a ring has two neighbours."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    return 0 if world_size == 1 else channels * NCCL_CONNECTION_BYTES


def device_level(
    gpu: GPU, *, allocated_bytes: int, reserved_bytes: int, world_size: int = 1, replay: str = "",
    lazy_loading: bool = True,
) -> DeviceLevelMemory:
    """The device-level memory (`aegis.schema.DeviceLevelMemory`) of a step whose replay peaked at ``allocated_bytes``
    / ``reserved_bytes``."""
    context = context_bytes(lazy_loading)
    cublas = cublas_workspace_bytes(gpu)
    nccl = nccl_buffer_bytes(world_size)
    return DeviceLevelMemory(
        allocated_bytes=allocated_bytes, reserved_bytes=reserved_bytes, cache_bytes=reserved_bytes - allocated_bytes,
        context_bytes=context, cublas_workspace_bytes=cublas, nccl_bytes=nccl,
        device_bytes=reserved_bytes + context + cublas + nccl, replay=replay,
    )
