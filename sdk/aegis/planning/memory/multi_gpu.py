"""A plan on several GPUs, each GPU's memory beyond its live tensors: one DDP rank's allocation stream (the one-GPU
step with DDP's broadcast chunks and gradient buckets) and rank 0 of an FSDP step (`aegis.planning.memory.sharded_step`)
replayed through the caching-allocator model, plus what lives outside the allocator on every GPU.

    from aegis.planning.memory.multi_gpu import multi_gpu_device_level
    tier = multi_gpu_device_level(gpu, tier, 8, profile=profile, strategy="fsdp")   # tier.memory.device_level
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from aegis.planning.memory._dtypes import placement
from aegis.planning.memory.allocator import CachingAllocator, gc_paused
from aegis.planning.memory.components import sizes
from aegis.planning.memory.device import STEPS, allocation_stream
from aegis.planning.memory.sharded_step import Sharding
from aegis.schema import GPU, ModelProfile, Tier, TrainConfig

__all__ = ["multi_gpu_device_level", "ddp_allocation_stream", "NOT_REPLAYED", "DDP_FIRST_BUCKET_BYTES",
           "DDP_BUCKET_BYTES", "DDP_BROADCAST_BYTES"]


DDP_FIRST_BUCKET_BYTES = 1 << 20
"""DDP's first gradient bucket cap (``torch.distributed._DEFAULT_FIRST_BUCKET_BYTES``)."""
DDP_BUCKET_BYTES = 25 << 20
"""DDP's default ``bucket_cap_mb`` (25 MiB): every later bucket's cap."""
DDP_BROADCAST_BYTES = 250 << 20
"""``DistributedDataParallel.broadcast_bucket_size``: the flat chunks DDP broadcasts the module's states in at wrap."""


def _ddp_buckets(tensors: Sequence[int], first_cap: int = DDP_FIRST_BUCKET_BYTES,
                 cap: int = DDP_BUCKET_BYTES) -> list[int]:
    """Bucket bytes of ``tensors`` (bytes each, in order) as torch's ``_compute_bucket_assignment_by_size`` closes them:
    a bucket closes once it reaches its cap (the first ``first_cap``, the rest ``cap``)."""
    out, size = [], 0
    for t in tensors:
        size += t
        if size >= (first_cap if not out else cap):
            out.append(size)
            size = 0
    return out + ([size] if size else [])


def ddp_allocation_stream(profile: ModelProfile, cfg: TrainConfig, steps: int = STEPS) -> list[tuple[str, int, int]]:
    """One rank of a DDP run as the HF Trainer wraps it (``gradient_as_bucket_view`` off, default bucket caps): the
    single-GPU stream (`allocation_stream`) with DDP's allocations at the moments torch makes them (traced on CPU in
    `tools.truth.ddp`): at wrap, the module's parameters broadcast in flat chunks of up to 250 MiB (two in flight,
    then freed), then the gradient buckets, flat buffers alive for the run. The Trainer's ``find_unused_parameters``
    is True unless a `PreTrainedModel` (full fine-tuning) checkpoints; with it the buckets are capped (the first
    1 MiB, then 25 MiB, parameters in module order, allocated last bucket first); without it DDP starts with one bucket
    of every gradient and, before the second step's forward, frees it and rebuilds capped buckets in the order the
    gradients became ready (the head first). The all-reduce is in place on the bucket and the result is copied into the
    existing ``.grad``: no allocation on NCCL's or any other stream."""
    setup = allocation_stream(profile, cfg, steps=0)
    events = allocation_stream(profile, cfg, steps=steps)
    params = [n for kind, _, n in setup if kind == "alloc"]  # load order: module order
    place = placement(cfg)
    sz = sizes(profile, cfg, place)
    gb = sz.trainable_bytes_per_param
    if cfg.method == "full":
        trainable = [n * gb // (place.base_bytes or gb) for n in params]
    else:  # the adapters are the last tensors set up (module order), as large as their gradients
        trainable, total = [], sz.trainable_params * gb
        for n in reversed(params):
            if sum(trainable) >= total:
                break
            trainable.insert(0, n)
    ids = itertools.count(max((h for _, h, _ in events), default=0) + 1)
    wrap: list[tuple[str, int, int]] = []
    in_flight: list[int] = []
    frozen = params[:len(params) - len(trainable)] if cfg.method != "full" else params  # adapters: their own dtype
    chunks = [_ddp_buckets(group, DDP_BROADCAST_BYTES, DDP_BROADCAST_BYTES) for group in (frozen, trainable)]
    for chunk in chunks[0] + (chunks[1] if cfg.method != "full" else []):
        if len(in_flight) == 2:
            wrap.append(("free", in_flight.pop(0), 0))
        in_flight.append(next(ids))
        wrap.append(("alloc", in_flight[-1], chunk))
    wrap += [("free", h, 0) for h in in_flight]
    find_unused = cfg.method != "full" or not cfg.gradient_checkpointing
    first = _ddp_buckets(trainable)[::-1] if find_unused else [sum(trainable)]
    handles = [next(ids) for _ in first]
    wrap += [("alloc", h, n) for h, n in zip(handles, first, strict=True)]
    if find_unused:  # the reducer's map of the parameters used (an int32 each) on the device
        wrap.append(("alloc", next(ids), 4 * len(trainable)))
    out = events[:len(setup)] + wrap
    rest = events[len(setup):]
    if not find_unused and steps > 1:  # the second step's pre-forward rebuilds the buckets
        step_len = len(allocation_stream(profile, cfg, steps=1)) - len(setup)
        rebuilt = _ddp_buckets(trainable[::-1])
        rebuild = [("free", h, 0) for h in handles] + [("alloc", next(ids), n) for n in rebuilt]
        rest = rest[:step_len] + rebuild + rest[step_len:]
    return out + rest


NOT_REPLAYED = ""
"""`DeviceLevelMemory.replay` of a multi-GPU plan whose step is not replayed (see `multi_gpu_device_level`)."""


def multi_gpu_device_level(gpu: GPU, tier: Tier | None, world_size: int, *, profile: ModelProfile | None = None,
                           strategy: str | None = None) -> Tier | None:
    """``tier`` of a plan on ``world_size`` GPUs with its device-level memory on each GPU (rank 0's view).

    An FSDP plan (``strategy="fsdp"``, FULL_SHARD, with the ``profile`` it was planned for) is replayed: rank 0's
    allocation stream of two sharded steps (`allocation_stream` with `Sharding`), FSDP's all-gather, reduce-scatter
    and mixed-precision streams each in their own pools as PyTorch's allocator keeps them, gives the reserved peak;
    the allocated level stays the estimate's per-GPU tensor peak (checked against traced FSDP steps), and reserved is
    never put below it. A DDP plan (``strategy="ddp"``) is replayed the same way from `ddp_allocation_stream` (the
    one-GPU step with DDP's broadcast chunks and gradient buckets), never below its allocated peak. A DeepSpeed step is
    not replayed: its reserved figure is its allocated peak, a lower bound (``replay`` is `NOT_REPLAYED`). On top, what
    lives outside the allocator on every GPU (`aegis.planning.memory.runtime.device_level`): the CUDA context, the
    cuBLAS workspace and NCCL's buffers for ``world_size`` ranks (`aegis.planning.memory.runtime.nccl_buffer_bytes`:
    ``NCCL_MAX_CHANNELS`` channels x one connection's Simple, LL and LL128 buffers, NCCL's defaults). The tier's fit
    and headroom are left as the estimate judged them; a note says when the replayed reserved peak and the overhead
    pass the GPU's memory."""
    from aegis.planning.memory.runtime import device_level

    if tier is None or world_size < 2:
        return tier
    peak = tier.memory.tensor_bytes
    reserved, replay, notes = peak, NOT_REPLAYED, ()
    if strategy in ("fsdp", "ddp") and profile is not None:
        cfg = tier.memory.config
        if strategy == "fsdp":
            events = allocation_stream(profile, cfg, sharding=Sharding(world_size))
            replay = (f"two steps of {cfg.seq_len} tokens of rank 0 under FSDP FULL_SHARD on {world_size} GPUs "
                      "(its all-gather and reduce-scatter streams' blocks apart)")
        else:
            events = ddp_allocation_stream(profile, cfg)
            replay = f"two steps of {cfg.seq_len} tokens of one DDP rank on {world_size} GPUs, with DDP's gradient buckets"
        with gc_paused():
            reserved = max(CachingAllocator().replay(events).max_reserved_bytes, peak)
        if reserved + tier.memory.overhead_bytes > gpu.memory_bytes:
            gib = 1 << 30
            notes = (f"{strategy.upper()}'s caching allocator reserves {reserved / gib:.2f} GiB per GPU for a "
                     f"{peak / gib:.2f} GiB live peak ({(reserved - peak) / gib:.2f} GiB cached in freed and split "
                     f"blocks): with the overhead, more than the {gpu.name}'s memory; "
                     "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True or a smaller micro batch may be needed",)
    level = device_level(gpu, allocated_bytes=peak, reserved_bytes=reserved, world_size=world_size, replay=replay)
    update = {"device_level": level, "notes": tier.memory.notes + notes}
    return tier.model_copy(update={"memory": tier.memory.model_copy(update=update)})
