"""Trace rank 0 of a sharded (FSDP) training step on CPU: fake tensors, a fake process group.

    from tools.truth.sharded import ShardSetup, trace_sharded
    row = trace_sharded(config_dict, ShardSetup(method="lora", micro_batch_size=1, seq_len=256), world_size=8)

As torchtitan's memory estimation does, the process group is torch's ``fake`` backend (`FakeStore`: every
collective returns at once, rank 0 of ``world_size``) and every tensor a `FakeTensor`; rank 0's live storage bytes
are counted by `tools.truth.alloc.LiveBytes` (512-byte blocks), with two additions sharding needs:

- FSDP frees and re-allocates its unsharded parameters and gradients by resizing their storages
  (``UntypedStorage.resize_``), which no ATen op shows: the resize is patched to update the count;
- a DTensor (FSDP2's parameters, gradients and optimizer states) is counted as its local shard, which DTensor's
  dispatch makes below the counting mode.

What is wrapped, as the HF Trainer (transformers 4.45-5, accelerate) prepares it:

- ``fsdp="fsdp1"``: `FullyShardedDataParallel` over the model, ``auto_wrap_policy`` = the decoder layer class
  (accelerate's ``TRANSFORMER_BASED_WRAP`` from ``_no_split_modules``); for a PEFT model PEFT's
  ``fsdp_auto_wrap_policy`` (each LoRA ``Linear`` its own unit, `transformers.distributed.fsdp.update_fsdp_plugin_peft`);
  ``sharding_strategy`` FULL_SHARD or SHARD_GRAD_OP, ``backward_prefetch=BACKWARD_PRE``, ``use_orig_params=True``,
  ``limit_all_gathers=True``; LoRA/QLoRA under bf16 ``MixedPrecision`` (param, reduce and buffer dtype), as
  accelerate's ``set_mixed_precision("bf16")`` (QLoRA: the bf16 ``quant_storage``, override=True).
  Gradient clipping is FSDP's ``model.clip_grad_norm_(1.0)`` (what accelerate calls).
- ``fsdp="fsdp2"``: ``fully_shard`` on every decoder layer (and, for PEFT, every LoRA ``Linear``), then the root,
  ``reshard_after_forward=True``; LoRA/QLoRA with ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=bf16)``.

Reserved memory: the tracer also records rank 0's allocation stream (`ShardedStreamLiveBytes`: each storage's
allocation and free, FSDP's ``resize_`` frees and re-allocations included, each allocation tagged with the stream FSDP
made it on, read from ``torch.cpu.current_stream()``, which FSDP's device handle switches on a CPU device as it
switches CUDA streams on a GPU) and replays the steps (`replay_from_setup`: a fresh allocator holding what the wrapped
model holds, then the steps) through `aegis.planning.memory.allocator`, whose pools are per stream as PyTorch's:
``traced_max_reserved_bytes`` (``traced_max_reserved_one_stream_bytes``: every allocation on one stream). Assumed,
not traced: a block freed after use on another stream (``record_stream``) is reusable at once, and the model's
unsharded build (on a GPU, loaded on the host and moved unit by unit) leaves no cached segments.

The model: `tools.truth.model.build_model` (full: bf16 weights, grads and AdamW states; LoRA: bf16 base, fp32
adapters; QLoRA: NF4 without k-bit preparation, as TRL/axolotl shard it), QLoRA's packed weights then viewed as bf16
(``bnb_4bit_quant_storage=torch.bfloat16``: one dtype per layer). LoRA/QLoRA steps run under bf16 autocast (the
Trainer's ``bf16=True``). Two steps (forward with labels, backward, clip, AdamW foreach step, zero_grad).

Regenerate the rows (tests/data/sharded_truth.json):

    python -m tools.truth.sharded --write          # every row of GRID; --only llama to filter
    python -m tools.truth.sharded --large --write  # the real-size rows (LARGE) into tests/data/sharded_truth_large.json
    python -m tools.truth.sharded --large --show   # traced allocated / reserved against the planner's
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import time
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict

from tools.truth.alloc import LiveBytes, rounded_bytes
from tools.truth.stream import StreamLiveBytes
from tools.truth.setup import DEFAULT_LORA_TARGETS, TraceSetup

ROOT = Path(__file__).resolve().parents[2]
TABLE = ROOT / "tests" / "data" / "sharded_truth.json"
CONFIGS = ROOT / "tests" / "data" / "sharded_configs.json"


class ShardSetup(BaseModel):
    """One sharded step to trace (rank 0's view)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    method: Literal["full", "lora", "qlora"]
    micro_batch_size: int = 1
    seq_len: int = 256
    fsdp: Literal["fsdp1", "fsdp2", "none"] = "fsdp1"
    """``none``: one GPU, no FSDP (`tools.truth.trace.trace_training` of the same step): the baseline a sharded row's
    error is compared with."""
    strategy: Literal["FULL_SHARD", "SHARD_GRAD_OP"] = "FULL_SHARD"
    lora_rank: int = 16
    lora_targets: tuple[str, ...] = DEFAULT_LORA_TARGETS
    steps: int = 2
    gradient_checkpointing: bool = False
    """Non-reentrant checkpointing of every decoder layer, enabled before wrapping (as the Trainer does with
    ``gradient_checkpointing=True``)."""
    optimizer: Literal["adamw_foreach", "adamw_fused"] = "adamw_foreach"
    """``torch.optim.AdamW(foreach=True)`` (transformers 4's ``adamw_torch``: a state-sized temporary per tensor of a
    group during the step) or ``fused=True`` (transformers 5's default ``adamw_torch_fused``: none)."""


class ShardedLiveBytes(LiveBytes):
    """`LiveBytes` that follows storage resizes (FSDP's free/alloc of unsharded storage) and counts a DTensor as
    its local shard."""

    def _track(self, t: torch.Tensor) -> None:
        from torch.distributed.tensor import DTensor

        if isinstance(t, DTensor):  # its local shard is made inside DTensor's dispatch, below this mode
            t = t._local_tensor
        super()._track(t)

    def _resized(self, key: int, nbytes: int) -> None:
        """A tracked storage now holds ``nbytes`` (its ``resize_`` returned)."""
        old = self.live[key]
        new = rounded_bytes(nbytes)
        if new < old and self._snapshot_stale:
            self._take_snapshot()
        self.live[key] = new
        self.total_bytes += new - old
        if new > old:
            self._note_peak()

    def __enter__(self):
        original = torch.UntypedStorage.resize_
        tracker = self

        def resize_(storage, size):
            key = storage._cdata
            out = original(storage, size)
            if key in tracker.live:
                tracker._resized(key, storage.nbytes())
            return out

        self._original_resize = original
        torch.UntypedStorage.resize_ = resize_
        return super().__enter__()

    def __exit__(self, *exc):
        torch.UntypedStorage.resize_ = self._original_resize
        return super().__exit__(*exc)


class ShardedStreamLiveBytes(ShardedLiveBytes, StreamLiveBytes):
    """`ShardedLiveBytes` that also records rank 0's allocation stream (`tools.truth.stream.StreamLiveBytes`), in the
    format `aegis.planning.memory.allocator.replay` takes, each allocation on the stream current when it is made.

    A storage ``resize_`` (FSDP's free and re-allocation of unsharded flat parameters and gradients) is a new
    allocation of the new size, then the old one's free, as CUDA's ``resize_`` does; to 0 bytes, only the free.
    Streams: FSDP1 and FSDP2 switch streams through their device handle, ``torch.cpu`` for a CPU device, whose
    ``stream(s)`` context sets what ``torch.cpu.current_stream()`` returns, as ``torch.cuda.stream(s)`` sets the stream
    the CUDA caching allocator serves a request from. So the stream current at each allocation is read there:
    0 is the stream current when the tracker starts (the default, compute stream), later ones are numbered as first
    met, and ``("stream", s, 0)`` precedes an allocation on another stream than the last one's."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._stream_objects: list[Any] = [torch.cpu.current_stream()]
        self._stream_now = 0
        self.stream_names: dict[int, str] = {0: "default"}

    def _on_current_stream(self) -> None:
        current = torch.cpu.current_stream()
        for sid, known in enumerate(self._stream_objects):
            if known is current:
                break
        else:
            sid = len(self._stream_objects)
            self._stream_objects.append(current)
        if sid != self._stream_now:
            self._stream_now = sid
            self.events.append(("stream", sid, 0))

    def _track(self, t: torch.Tensor) -> None:
        self._on_current_stream()
        super()._track(t)

    def _resized(self, key: int, nbytes: int) -> None:
        old = self._ids.pop(key, None)
        if nbytes > 0:
            self._on_current_stream()
            self._ids[key] = next(self._counter)
            self.events.append(("alloc", self._ids[key], nbytes))
        if old is not None:
            self.events.append(("free", old, 0))
        super()._resized(key, nbytes)


def replay_from_setup(events: list[tuple[str, int, int]], start: int, **allocator_options):
    """Replay ``events[start:]`` through the allocator model, on a fresh allocator that first holds what is live at
    ``start`` (allocated in the order, and on the streams, they were made): the steps' reserved peak without the
    cache the model's unsharded build left (on a GPU the model is loaded on the host and FSDP moves it unit by unit)."""
    from aegis.planning.memory.allocator import replay

    live: dict[int, tuple[int, int]] = {}
    stream = 0
    for kind, ident, size in events[:start]:
        if kind == "stream":
            stream = ident
        elif kind == "alloc":
            live[ident] = (size, stream)
        else:
            live.pop(ident, None)
    head: list[tuple[str, int, int]] = []
    now = 0
    for ident, (size, s) in live.items():  # dicts keep insertion order: allocation order
        if s != now:
            head.append(("stream", s, 0))
            now = s
        head.append(("alloc", ident, size))
    if now != stream:
        head.append(("stream", stream, 0))
    return replay(head + list(events[start:]), **allocator_options)


def single_stream(events: list[tuple[str, int, int]]) -> list[tuple[str, int, int]]:
    """``events`` with every allocation on one stream (what the replay would say if FSDP used no side streams)."""
    return [e for e in events if e[0] != "stream"]


@contextlib.contextmanager
def _fake_storage_identity():
    """FSDP asks whether storages are allocated and shared by their data pointers, which fake storages do not have
    (always 0): a storage's pointer is its identity while it holds bytes, 0 once freed (what a GPU's would say)."""
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.distributed.fsdp import _flat_param

    original_same, original_storage_ptr = _flat_param._same_storage, torch.UntypedStorage.data_ptr
    original_tensor_ptr = FakeTensor.__dict__.get("data_ptr")

    def storage_ptr(storage):
        return storage._cdata if storage.nbytes() > 0 else 0

    _flat_param._same_storage = lambda a, b: a.untyped_storage()._cdata == b.untyped_storage()._cdata
    torch.UntypedStorage.data_ptr = storage_ptr
    FakeTensor.data_ptr = lambda t: storage_ptr(t.untyped_storage()) and storage_ptr(t.untyped_storage()) + \
        t.storage_offset() * t.element_size()
    try:
        yield
    finally:
        _flat_param._same_storage = original_same
        torch.UntypedStorage.data_ptr = original_storage_ptr
        if original_tensor_ptr is None:
            del FakeTensor.data_ptr
        else:
            FakeTensor.data_ptr = original_tensor_ptr


@contextlib.contextmanager
def _fake_quant_state_recovery():
    """FSDP1's ``use_orig_params`` views (and FSDP2's shards) drop a `Params4bit`'s ``quant_state``; bitsandbytes
    recovers it from the module by re-wrapping the weight in `Params4bit`, which a fake tensor cannot be: set the
    attribute on the view instead (the same state, no new storage)."""
    from bitsandbytes.nn import modules

    original = modules.fix_4bit_weight_quant_state_from_module

    def recover(module):
        if getattr(module.weight, "quant_state", None) is None:
            module.weight.quant_state = module.quant_state

    modules.fix_4bit_weight_quant_state_from_module = recover
    try:
        yield
    finally:
        modules.fix_4bit_weight_quant_state_from_module = original


def _trace_setup(setup: ShardSetup) -> TraceSetup:
    return TraceSetup(method=setup.method, micro_batch_size=setup.micro_batch_size, seq_len=setup.seq_len,
                      lora_rank=setup.lora_rank, lora_alpha=2 * setup.lora_rank, lora_targets=setup.lora_targets,
                      gradient_checkpointing=setup.gradient_checkpointing, kbit_prep=setup.method != "qlora",
                      autocast=setup.method != "full", trainer="peft" if setup.method == "qlora" else "hf")


def _bf16_quant_storage(model: torch.nn.Module) -> None:
    """View every packed NF4 weight as bf16 (``bnb_4bit_quant_storage=torch.bfloat16``)."""
    import bitsandbytes as bnb

    for mod in model.modules():
        if isinstance(mod, bnb.nn.Linear4bit):
            old = mod.weight
            param = torch.nn.Parameter(old.data.reshape(-1).view(torch.bfloat16).reshape(-1, 1), requires_grad=False)
            for attr in ("quant_state", "blocksize", "quant_type", "compress_statistics", "bnb_quantized"):
                setattr(param, attr, getattr(old, attr))
            mod.weight = param


def _layer_classes(model: torch.nn.Module) -> set[type]:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    names = set(base._no_split_modules or ())
    return {type(m) for m in base.modules() if type(m).__name__ in names}


def _wrap_fsdp1(model, setup: ShardSetup, mesh):
    from torch.distributed.fsdp import (
        BackwardPrefetch,
        MixedPrecision,
        ShardingStrategy,
    )
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

    if setup.method == "full":
        policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls=_layer_classes(model))
        mp = None
    else:
        from peft.utils.other import fsdp_auto_wrap_policy

        policy = fsdp_auto_wrap_policy(model)
        mp = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16, buffer_dtype=torch.bfloat16)
    return FSDP(model, sharding_strategy=ShardingStrategy[setup.strategy], auto_wrap_policy=policy,
                backward_prefetch=BackwardPrefetch.BACKWARD_PRE, use_orig_params=True, limit_all_gathers=True,
                forward_prefetch=False, mixed_precision=mp, device_id=torch.device("cpu"), device_mesh=mesh)


def _wrap_fsdp2(model, setup: ShardSetup, mesh):
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    kwargs: dict[str, Any] = {"mesh": mesh, "reshard_after_forward": setup.strategy == "FULL_SHARD"}
    if setup.method != "full":
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)
    layers = _layer_classes(model)
    for mod in reversed(list(model.modules())):  # bottom-up, as accelerate: a LoRA leaf before its layer
        lora_leaf = (setup.method != "full" and not list(mod.children()) and getattr(mod, "weight", None) is not None
                     and mod.weight.requires_grad)
        if isinstance(mod, tuple(layers)) or lora_leaf:
            fully_shard(mod, **kwargs)
    fully_shard(model, **kwargs)
    return model


def _run(config: dict[str, Any], setup: ShardSetup, mesh, record_origin: bool = False) -> dict[str, Any]:
    from tools.truth.model import build_model
    from tools.truth.trace import _param_groups, _state_tensors

    start = time.perf_counter()
    tracker = ShardedStreamLiveBytes(record_origin=record_origin)
    with tracker:
        model = build_model(config, _trace_setup(setup)).model
        if setup.method == "qlora":
            _bf16_quant_storage(model)
        unsharded = tracker.total_bytes
        wrap = _wrap_fsdp1 if setup.fsdp == "fsdp1" else _wrap_fsdp2
        model = wrap(model, setup, mesh)
        fused = setup.optimizer == "adamw_fused"
        optimizer = torch.optim.AdamW(_param_groups(model), lr=5e-5, foreach=not fused, fused=fused or None)
        vocab = model.get_input_embeddings().num_embeddings
        shape = (setup.micro_batch_size, setup.seq_len)
        ids = torch.randint(0, vocab, shape, dtype=torch.long)
        batch = {"input_ids": ids, "attention_mask": torch.ones(shape, dtype=torch.long), "labels": ids.clone()}
        after_setup = tracker.total_bytes
        tracker.reset_peak()
        autocast = (torch.autocast("cpu", dtype=torch.bfloat16) if setup.method != "full"
                    else contextlib.nullcontext())
        trainable = [p for p in model.parameters() if p.requires_grad]
        phase_peaks: dict[str, int] = {}
        for _ in range(setup.steps):
            tracker.phase_peaks = {}
            tracker.phase("forward")
            with autocast:
                loss = model(**batch).loss
            tracker.phase("backward")
            loss.backward()
            del loss
            tracker.phase("clip")
            if setup.fsdp == "fsdp1":
                model.clip_grad_norm_(1.0)
            else:
                torch.nn.utils.clip_grad_norm_(trainable, 1.0, foreach=True)
            tracker.phase("optimizer")
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            tracker.phase("idle")
            for name, value in tracker.phase_peaks.items():
                if name != "idle":
                    phase_peaks[name] = max(phase_peaks.get(name, 0), value)
        states = sum({id(t): rounded_bytes(_local(t).untyped_storage().nbytes())
                      for t in _state_tensors(optimizer)}.values())
    out = {
        "peak_bytes": tracker.peak_bytes, "peak_phase": tracker.peak_phase, "phase_peak_bytes": phase_peaks,
        "unsharded_model_bytes": unsharded, "after_setup_bytes": after_setup, "optimizer_state_bytes": states,
        "trace_seconds": round(time.perf_counter() - start, 2),
        **replayed(tracker),
    }
    if record_origin:  # what was live at the peak: (phase, op, shape, dtype) -> bytes
        live: dict[str, int] = {}
        tracker.peak_breakdown()
        for key, size in tracker.peak_snapshot.items():
            phase, op, shp, dtype = tracker.peak_origin.get(key, ("setup", "?", (), "?"))
            name = f"{phase} {op} {list(shp)} {dtype}"
            live[name] = live.get(name, 0) + size
        out["peak_live"] = dict(sorted(live.items(), key=lambda kv: -kv[1]))
    return out


def replayed(tracker: ShardedStreamLiveBytes) -> dict[str, Any]:
    """The steps' allocation stream (`replay_from_setup`) through the allocator model: per-stream pools as recorded,
    and all on one stream beside it (what the side streams cost)."""
    plain = replay_from_setup(tracker.events, tracker.reset_at)
    one = replay_from_setup(single_stream(tracker.events), tracker.reset_at)
    streams = {e[1] for e in tracker.events[tracker.reset_at:] if e[0] == "stream"} | {0}
    return {"traced_max_allocated_bytes": plain.max_allocated_bytes, "traced_max_reserved_bytes": plain.max_reserved_bytes,
            "traced_max_reserved_one_stream_bytes": one.max_reserved_bytes, "traced_streams": len(streams),
            "traced_events": len(tracker.events) - tracker.reset_at}


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def trace_sharded(config: dict[str, Any], setup: ShardSetup, world_size: int, *, record_origin: bool = False) -> dict[str, Any]:
    """Rank 0's peak (and what it was made of) for ``setup`` on ``world_size`` ranks, under fake tensors."""
    if setup.fsdp == "none":
        from tools.truth.trace import trace_training

        one = trace_training(config, _trace_setup(setup))
        return {"peak_bytes": one.peak_bytes, "peak_phase": one.peak_phase, "phase_peak_bytes": one.phase_peak_bytes,
                "after_setup_bytes": one.after_setup_bytes, "optimizer_state_bytes": one.optimizer_state_bytes,
                "trace_seconds": one.seconds}
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from tools.truth.patches import cuda_dropout, settable_fake_params, unpadded_inputs
    from tools.truth.trace import _import_outside_modes

    _import_outside_modes(config)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        mesh = init_device_mesh("cpu", (world_size,))  # outside the fake mode: the mesh's rank tensors are real
        with unpadded_inputs(), cuda_dropout(), settable_fake_params(), _fake_storage_identity(), _fake_quant_state_recovery(), \
                FakeTensorMode(allow_non_fake_inputs=True):
            return _run(config, setup, mesh, record_origin)
    finally:
        dist.destroy_process_group()


def versions() -> dict[str, str]:
    import accelerate
    import bitsandbytes
    import peft
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__, "peft": peft.__version__,
            "accelerate": accelerate.__version__, "bitsandbytes": bitsandbytes.__version__}


LORA_TARGETS = {  # every linear of the layer, by the family's module names
    "phi3": ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"),
    "gpt_neox": ("query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"),
}

GRID = {
    "families": ("llama", "qwen2", "mistral", "phi3", "gpt_neox"),
    "methods": ("full", "lora", "qlora"),
    "world_sizes": (2, 8),
    "fsdp": (("fsdp1", "FULL_SHARD"), ("fsdp1", "SHARD_GRAD_OP"), ("fsdp2", "FULL_SHARD")),
    "micro_batch_size": 1,
    "seq_len": 256,
}


def row_key(row: dict[str, Any]) -> tuple:
    return (row["family"], row["method"], row["fsdp"], row["strategy"], row["world_size"], row["micro_batch_size"],
            row["seq_len"], row["lora_rank"], tuple(row.get("lora_targets") or DEFAULT_LORA_TARGETS))


def build_rows(only: str | None = None, fsdp: str | None = None, strategy: str | None = None) -> list[dict[str, Any]]:
    configs = json.loads(CONFIGS.read_text(encoding="utf-8"))
    rows = []
    for family in GRID["families"]:
        if only and only not in family:
            continue
        for method in GRID["methods"]:
            if fsdp in (None, "none") and strategy in (None, "FULL_SHARD"):
                setup = ShardSetup(method=method, fsdp="none", lora_targets=LORA_TARGETS.get(family, DEFAULT_LORA_TARGETS),
                                   micro_batch_size=GRID["micro_batch_size"], seq_len=GRID["seq_len"])
                traced = trace_sharded(configs[family], setup, 1)
                rows.append({"family": family, "world_size": 1, **setup.model_dump(), **traced})
                print(f"{family:<8} {method:<6} one GPU: {traced['peak_bytes']:,} B", flush=True)
            for version, how in GRID["fsdp"]:
                if (fsdp and version != fsdp) or (strategy and how != strategy):
                    continue
                for ws in GRID["world_sizes"]:
                    setup = ShardSetup(method=method, fsdp=version, strategy=how,
                                       lora_targets=LORA_TARGETS.get(family, DEFAULT_LORA_TARGETS),
                                       micro_batch_size=GRID["micro_batch_size"], seq_len=GRID["seq_len"])
                    traced = trace_sharded(configs[family], setup, ws)
                    row = {"family": family, "world_size": ws, **setup.model_dump(), **traced}
                    print(f"{family:<8} {method:<6} {version} {how:<13} ws{ws}: {traced['peak_bytes']:,} B "
                          f"({traced['peak_phase']}, {traced['trace_seconds']} s)", flush=True)
                    rows.append(row)
    return rows


def planned_bytes(row: dict[str, Any], configs: dict[str, Any]) -> int:
    """The planner's rank-0 tensor peak for a row (`aegis.estimate_memory` with ``fsdp_shards`` = world size)."""
    from aegis.planning.memory.estimate import estimate_memory
    from aegis.models.profiles import profile_from_config
    from aegis.schema import LoRAConfig, StackProfile

    profile = profile_from_config(configs[row["family"]], model_id=f"tiny-{row['family']}", source="path")
    lora = None
    if row["method"] != "full":
        targets = tuple(row.get("lora_targets") or DEFAULT_LORA_TARGETS)
        lora = LoRAConfig(rank=row["lora_rank"], alpha=2 * row["lora_rank"], target_modules=targets)
    est = estimate_memory(
        profile, method=row["method"], micro_batch_size=row["micro_batch_size"], seq_len=row["seq_len"],
        precision="bf16", lora=lora, fsdp_shards=row["world_size"], fsdp_reshard=row["strategy"] == "FULL_SHARD",
        autocast=row["method"] != "full",
        stack=StackProfile(kbit_prep=False) if row["method"] == "qlora" else None,
    )
    return est.tensor_bytes


TABLE_LARGE = ROOT / "tests" / "data" / "sharded_truth_large.json"

LARGE: tuple[dict[str, Any], ...] = tuple(
    {"model": m, "method": meth, "world_size": ws, "seq_len": seq, "micro_batch_size": b, "gradient_checkpointing": gc,
     "optimizer": opt}
    for m, meth, ws, seq, b, gc in (
        ("meta-llama/Llama-3.1-8B", "full", 2, 2048, 1, False),
        ("meta-llama/Llama-3.1-8B", "full", 2, 2048, 2, False),
        ("meta-llama/Llama-3.1-8B", "full", 2, 2048, 2, True),
        ("meta-llama/Llama-3.1-8B", "full", 2, 1024, 4, False),  # `aegis plan "full llama 3.1 8b on 2x h100"`
        ("meta-llama/Llama-3.1-8B", "full", 8, 2048, 1, False),
        ("meta-llama/Llama-3.1-8B", "full", 8, 2048, 2, True),
        ("meta-llama/Llama-3.1-8B", "lora", 2, 4096, 1, False),
        ("meta-llama/Llama-3.1-8B", "lora", 2, 4096, 1, True),
        ("meta-llama/Llama-3.1-8B", "lora", 8, 4096, 2, True),
        ("mistralai/Mistral-7B-v0.1", "qlora", 2, 2048, 1, False),
        ("mistralai/Mistral-7B-v0.1", "qlora", 2, 4096, 1, True),
        ("Qwen/Qwen2.5-7B", "qlora", 2, 4096, 1, True),
        ("Qwen/Qwen2.5-7B", "full", 2, 2048, 1, True),
        ("meta-llama/Llama-2-70b-hf", "qlora", 2, 4096, 1, True),
        ("meta-llama/Llama-2-70b-hf", "qlora", 8, 4096, 1, True),
        ("meta-llama/Llama-3.1-70B", "qlora", 2, 4096, 1, True),
        ("mistralai/Mistral-7B-v0.1", "full", 2, 4096, 1, True),
        ("Qwen/Qwen2.5-7B", "lora", 8, 2048, 4, False),
    ) for opt in (("adamw_fused", "adamw_foreach") if meth == "full" and ws == 2 else ("adamw_fused",))
)
"""Real-size rows (`--large`): catalog models at the sizes the third parties' FSDP runs used (FSDP1 FULL_SHARD, the
Trainer's default wrap; fake tensors, so a 70B model traces without memory), with the Trainer's default optimizer on
transformers 5 (fused AdamW), and full fine-tuning on 2 GPUs also with transformers 4's foreach AdamW (its step
temporaries can hold the peak there)."""


def catalog_config(model_id: str) -> dict[str, Any]:
    """The planner's own bundled config.json of a catalog model (`aegis.models.catalog`)."""
    from aegis.models.catalog import models, read_model_config

    entry = next((m for m in models() if model_id in m.ids), None)
    if entry is None:
        raise SystemExit(f"{model_id} is not in the bundled catalog")
    return read_model_config(entry)


def large_key(row: dict[str, Any]) -> tuple:
    return (row["model"], row["method"], row["world_size"], row["seq_len"], row["micro_batch_size"],
            row["gradient_checkpointing"], row["optimizer"])


def build_large_rows(only: str | None = None) -> list[dict[str, Any]]:
    rows = []
    for spec in LARGE:
        if only and only.lower() not in spec["model"].lower():
            continue
        config = catalog_config(spec["model"])
        setup = ShardSetup(method=spec["method"], micro_batch_size=spec["micro_batch_size"], seq_len=spec["seq_len"],
                           gradient_checkpointing=spec["gradient_checkpointing"], optimizer=spec["optimizer"])
        traced = trace_sharded(config, setup, spec["world_size"], record_origin=True)
        live = traced.pop("peak_live", {})
        traced["peak_live_top"] = dict(list(live.items())[:12])  # the largest groups live at the peak
        row = {"model": spec["model"], "family": config["model_type"], "world_size": spec["world_size"],
               **setup.model_dump(), **traced}
        print(f"{spec['model']:<28} {spec['method']:<5} ws{spec['world_size']} s{spec['seq_len']} "
              f"b{spec['micro_batch_size']} gc{int(spec['gradient_checkpointing'])} {spec['optimizer']}: "
              f"allocated {traced['traced_max_allocated_bytes'] / 2**30:.2f} GiB, "
              f"reserved {traced['traced_max_reserved_bytes'] / 2**30:.2f} GiB ({traced['trace_seconds']} s)", flush=True)
        rows.append(row)
    return rows


def planned_levels(row: dict[str, Any], config: dict[str, Any]) -> tuple[int, int, int]:
    """The planner's (estimate's tensor peak, replayed allocated, replayed reserved) for a sharded row: the
    estimate with ``fsdp_shards`` = world size, then rank 0's allocation stream (`Sharding`) through the allocator
    model, as `aegis.planning.memory.multi_gpu.multi_gpu_device_level` replays a plan. A row's ``optimizer`` is the
    stack's AdamW (foreach or fused); a row without one is planned with the default stack (the tiny rows' way)."""
    from aegis.models.profiles import profile_from_config
    from aegis.planning.memory.allocator import replay
    from aegis.planning.memory.device import allocation_stream
    from aegis.planning.memory.sharded_step import Sharding
    from aegis.planning.memory.estimate import estimate_memory
    from aegis.schema import LoRAConfig, StackProfile

    profile = profile_from_config(config, model_id=row.get("model") or f"tiny-{row['family']}", source="path")
    lora = None
    if row["method"] != "full":
        targets = tuple(row.get("lora_targets") or DEFAULT_LORA_TARGETS)
        lora = LoRAConfig(rank=row["lora_rank"], alpha=2 * row["lora_rank"], target_modules=targets)
    reshard = row["strategy"] == "FULL_SHARD"
    stack: dict[str, Any] = {"kbit_prep": False} if row["method"] == "qlora" else {}
    if "optimizer" in row:
        stack["adamw"] = row["optimizer"].removeprefix("adamw_")
    est = estimate_memory(
        profile, method=row["method"], micro_batch_size=row["micro_batch_size"], seq_len=row["seq_len"],
        precision="bf16", lora=lora, fsdp_shards=row["world_size"], fsdp_reshard=reshard,
        gradient_checkpointing=row.get("gradient_checkpointing", False), autocast=row["method"] != "full",
        stack=StackProfile(**stack) if stack else None,
    )
    version = 2 if row["fsdp"] == "fsdp2" else 1
    stats = replay(allocation_stream(profile, est.config, sharding=Sharding(row["world_size"], reshard, version)))
    return est.tensor_bytes, stats.max_allocated_bytes, stats.max_reserved_bytes


def show_large() -> str:
    """The real-size rows: traced rank-0 allocated and reserved against the planner's."""
    gib = 1 << 30
    lines = [f"{'model':<28} {'method':<5} {'ws':>2} {'seq':>5} {'b':>2} {'gc':>2} {'adamw':<7} {'trace s':>7} "
             f"{'tr alloc':>8} {'tr resv':>8} {'pl alloc':>8} {'pl resv':>8} {'alloc':>7} {'resv':>7}"]
    for row in json.loads(TABLE_LARGE.read_text(encoding="utf-8"))["rows"]:
        est, _, reserved = planned_levels(row, catalog_config(row["model"]))
        ta, tr = row["traced_max_allocated_bytes"], row["traced_max_reserved_bytes"]
        lines.append(f"{row['model']:<28} {row['method']:<5} {row['world_size']:>2} {row['seq_len']:>5} "
                     f"{row['micro_batch_size']:>2} {int(row['gradient_checkpointing']):>2} "
                     f"{row['optimizer'].removeprefix('adamw_'):<7} {row['trace_seconds']:>7} "
                     f"{ta / gib:>8.2f} {tr / gib:>8.2f} {est / gib:>8.2f} {reserved / gib:>8.2f} "
                     f"{est / ta - 1:>+7.2%} {reserved / tr - 1:>+7.2%}")
    return "\n".join(lines)


def show() -> str:
    """The truth table: traced rank-0 peak against the planner's, per row."""
    configs = json.loads(CONFIGS.read_text(encoding="utf-8"))
    lines = [f"{'family':<8} {'fsdp':<5} {'strategy':<13} {'method':<6} {'ws':>2} {'traced B':>12} {'planned B':>12} {'error':>7}"]
    for row in json.loads(TABLE.read_text(encoding="utf-8"))["rows"]:
        plan = planned_bytes(row, configs)
        lines.append(f"{row['family']:<8} {row['fsdp']:<5} {row['strategy']:<13} {row['method']:<6} {row['world_size']:>2} "
                     f"{row['peak_bytes']:>12,} {plan:>12,} {(plan - row['peak_bytes']) / row['peak_bytes']:>+7.2%}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", help="families whose name contains this")
    parser.add_argument("--fsdp", choices=("fsdp1", "fsdp2", "none"), help="only this FSDP version (none: one GPU)")
    parser.add_argument("--strategy", choices=("FULL_SHARD", "SHARD_GRAD_OP"), help="only this sharding strategy")
    parser.add_argument("--write", action="store_true",
                        help=f"write the rows into {TABLE.relative_to(ROOT)} (replacing rows of the same setup)")
    parser.add_argument("--show", action="store_true", help="print the stored rows against the planner")
    parser.add_argument("--large", action="store_true",
                        help=f"the real-size rows (LARGE; {TABLE_LARGE.relative_to(ROOT)}); --only filters by model")
    args = parser.parse_args(argv)
    if args.large:
        if args.show:
            print(show_large())
            return
        rows = build_large_rows(args.only)
        if args.write:
            write_table(TABLE_LARGE, rows, large_key,
                        "rank 0's traced FSDP1 FULL_SHARD steps of real-size catalog models (tools/truth/sharded.py --large)",
                        versions(), {"rows": [dict(r) for r in LARGE]})
        return
    if args.show:
        print(show())
        return
    rows = build_rows(args.only, args.fsdp, args.strategy)
    if args.write:
        write_table(TABLE, rows, row_key, "rank 0's traced peak of sharded training steps (tools/truth/sharded.py)",
                    versions(), GRID)


def write_table(table: Path, rows: list[dict[str, Any]], key: Any, description: str, stack: dict[str, str],
                grid: dict[str, Any]) -> None:
    """Write ``rows`` into the truth table ``table``, replacing stored rows of the same setup (``key(row)``) where
    they stand (tests may pick the first row of a kind), new setups at the end."""
    if table.exists():
        fresh = {key(r): r for r in rows}
        stored = json.loads(table.read_text(encoding="utf-8"))["rows"]
        kept = {key(r) for r in stored}
        rows = [fresh.get(key(r), r) for r in stored] + [r for r in rows if key(r) not in kept]
    doc = {"description": description, "versions": stack, "grid": grid, "rows": rows}
    table.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
