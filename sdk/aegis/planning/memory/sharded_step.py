"""Rank 0 of an FSDP step as allocation events: the units FSDP flattens a model into, gathered, reduced and resharded
on the CUDA streams FSDP1 (and FSDP2) allocate on. `aegis.planning.memory.device.allocation_stream` writes its
sharded steps through `fsdp_step`; `aegis.planning.memory.multi_gpu` replays them for a plan on several GPUs.

    from aegis.planning.memory.device import allocation_stream
    events = allocation_stream(profile, cfg, sharding=Sharding(world_size=8))   # ("stream", s, 0) events included
"""

from __future__ import annotations

from dataclasses import dataclass

from aegis.planning.memory.allocator import EventStream
from aegis.planning.memory.components import sizes
from aegis.schema import ModelProfile, TrainConfig

__all__ = ["Sharding", "fsdp_step", "DEFAULT_STREAM", "UNSHARD_STREAM", "POST_BACKWARD_STREAM", "PRE_UNSHARD_STREAM"]


@dataclass(frozen=True)
class Sharding:
    """Rank 0 of an FSDP run on ``world_size`` GPUs, as the HF Trainer wraps it (FSDP1, accelerate's transformer-based
    wrap: each decoder layer a unit, PEFT's policy making each LoRA Linear its own; the root unit holds the embeddings,
    the final norm and an untied head; ``use_orig_params``, BACKWARD_PRE prefetch, ``limit_all_gathers``; LoRA/QLoRA
    under bf16 ``MixedPrecision``). ``reshard=False`` is SHARD_GRAD_OP."""

    world_size: int
    reshard: bool = True
    version: int = 1
    """2: FSDP2's ``fully_shard`` (per-parameter shards; the all-gather's flat input and output on its copy-in
    stream, each parameter's unsharded tensor copied out on the default stream)."""


DEFAULT_STREAM, UNSHARD_STREAM, POST_BACKWARD_STREAM, PRE_UNSHARD_STREAM = 0, 1, 2, 3
"""The CUDA streams FSDP1 allocates on (``torch/distributed/fsdp/_runtime_utils.py``, ``_init_streams``): the
all-gather destinations on ``_unshard_stream``; the reduce-scatter outputs (and their cast back to the parameter
dtype) on ``_post_backward_stream``; mixed precision's low-precision shard on ``_pre_unshard_stream``; the rest,
unsharded gradients included (autograd makes them), on the default stream."""


class _Unit:
    """One FSDP unit: its parameters (elements, in module order, each padded to 16 bytes as ``use_orig_params``
    aligns them), flattened into one parameter of ``stored`` bytes an element, gathered at ``gathered`` bytes."""

    __slots__ = ("params", "decay", "stored", "gathered", "trainable", "shard", "total", "handle", "mp_cast")

    def __init__(self, params: list[int], decay: list[bool], stored: int, gathered: int, trainable: bool,
                 world_size: int) -> None:
        align = max(1, 16 // stored)
        self.params = params
        self.decay = decay
        self.stored, self.gathered, self.trainable = stored, gathered, trainable
        self.total = sum(-(-e // align) * align for e in params)
        self.shard = -(-self.total // world_size)  # rank 0's chunk of the flat parameter padded to world_size
        self.handle: int | None = None
        self.mp_cast = gathered != stored

    def pieces(self) -> list[tuple[int, bool]]:
        """Rank 0's share of each original parameter (elements, takes weight decay): what ``use_orig_params`` hands
        the optimizer, which keeps its states per piece."""
        out, left = [], self.shard
        for e, d in zip(self.params, self.decay, strict=True):
            if left <= 0:
                break
            out.append((min(e, left), d))
            left -= min(e, left)
        return out


class _FsdpStep:
    """Writes FSDP1's allocations into a `EventStream` at the moments `allocation_stream` names (rank 0's view)."""

    def __init__(self, st: EventStream, sharding: Sharding, root: _Unit, layers: list[_Unit], adapters: list[list[_Unit]],
                 grad_bytes: int, state_bytes: int, quant_state: list[int]) -> None:
        self.st, self.sharding = st, sharding
        self.root, self.layers, self.adapters = root, layers, adapters
        self.grad_bytes, self.state_bytes = grad_bytes, state_bytes
        self.quant_state = quant_state
        self.stream = DEFAULT_STREAM
        self.sharded_grads: list[int] = []
        self.states: list[int] = []
        self.gathered: dict[int, list[list[int]]] = {}
        """Handles of the gathered (unsharded) parameters by unit: -1 the root, else the layer (with its adapters)."""

    def _on(self, stream: int) -> None:
        if stream != self.stream:
            self.st.events.append(("stream", stream, 0))
            self.stream = stream

    def setup(self) -> None:
        """Quantisation states whole, then each unit's shard as FSDP wraps them (bottom-up: a layer's LoRA units,
        the layer, ..., the root last)."""
        for part in self.quant_state:
            self.st.alloc(part)
        for layer, adapters in zip(self.layers, self.adapters, strict=True):
            for unit in adapters:
                unit.handle = self.st.alloc(unit.shard * unit.stored)
            layer.handle = self.st.alloc(layer.shard * layer.stored)
        self.root.handle = self.st.alloc(self.root.shard * self.root.stored)

    def _gather(self, unit: _Unit) -> list[int]:
        if self.sharding.version == 2:  # foreach_all_gather on the copy-in stream, then the copy-out
            self._on(UNSHARD_STREAM)
            flat_in = self.st.alloc(unit.shard * unit.gathered)
            flat_out = self.st.alloc(unit.shard * self.sharding.world_size * unit.gathered)
            self._on(DEFAULT_STREAM)
            params = [self.st.alloc(e * unit.gathered) for e in unit.params]
            self.st.free(flat_in, flat_out)
            return params
        if unit.mp_cast:  # the low-precision copy of the shard, made on the pre-unshard stream
            self._on(PRE_UNSHARD_STREAM)
            low = self.st.alloc(unit.shard * unit.gathered)
        self._on(UNSHARD_STREAM)
        full = self.st.alloc(unit.shard * self.sharding.world_size * unit.gathered)
        if unit.mp_cast:
            self.st.free(low)
        self._on(DEFAULT_STREAM)
        return [full]

    def gather_root(self) -> None:
        if -1 not in self.gathered:
            self.gathered[-1] = [self._gather(self.root)]

    def gather_layer(self, i: int) -> None:
        if i >= 0 and i not in self.gathered:
            self.gathered[i] = [self._gather(self.layers[i])] + [self._gather(u) for u in self.adapters[i]]

    def forward_done(self, i: int) -> None:
        if self.sharding.reshard:
            self.st.free(*[h for unit in self.gathered.pop(i) for h in unit])

    def _reduce(self, unit: _Unit, grads: list[int], gathered: list[int]) -> None:
        """Post-backward: the unit's gradients made flat (a multi-parameter unit's, by the views' backward), the
        unsharded parameter freed, the reduce-scatter's output (and its cast to the parameter dtype) on the
        post-backward stream, the unsharded gradient freed."""
        copied = len(unit.params) > 1 or self.sharding.version == 2  # FSDP2 copies even one into its input
        flat = [self.st.alloc(unit.total * self.grad_bytes)] if copied else grads
        if copied:
            self.st.free(*grads)
        self.st.free(*gathered)
        self._on(POST_BACKWARD_STREAM)
        out = self.st.alloc(unit.shard * self.grad_bytes)
        if unit.stored != self.grad_bytes:
            cast = self.st.alloc(unit.shard * unit.stored)
            self.st.free(out)
            out = cast
        self._on(DEFAULT_STREAM)
        self.st.free(*flat)
        self.sharded_grads.append(out)

    def backward_done(self, i: int, grads: list[int]) -> None:
        """Layer ``i``'s backward is over; ``grads``: its trainable tensors' unsharded gradients (module order)."""
        gathered = self.gathered.pop(i)
        if self.layers[i].trainable:
            self._reduce(self.layers[i], grads, gathered[0])
        else:
            self.st.free(*gathered[0])
            for unit, grad, handles in zip(self.adapters[i], grads, gathered[1:], strict=True):
                self._reduce(unit, [grad], handles)

    def root_done(self, grads: list[int]) -> None:
        gathered = self.gathered.pop(-1)[0]
        if self.root.trainable:
            self._reduce(self.root, grads, gathered)
        else:
            self.st.free(*gathered)

    def optimizer(self, adamw: bool, foreach_temp: bool) -> None:
        units = [u for u in (*self.layers, self.root) if u.trainable] + [u for a in self.adapters for u in a]
        if not self.states and adamw:
            self.states = [self.st.alloc(e * self.state_bytes) for u in units for e, _ in u.pieces() for _ in range(2)]
        if adamw and foreach_temp:
            temps = [self.st.alloc(e * self.state_bytes) for u in units for e, d in u.pieces() if d]
            self.st.free(*temps)
        self.st.free(*self.sharded_grads)  # zero_grad(set_to_none=True)
        self.sharded_grads = []


def fsdp_step(st: EventStream, sharding: Sharding, profile: ModelProfile, cfg: TrainConfig, place, trainable: list[list[int]],
               unit_params: list[list[int]], unit_decay: list[list[bool]], quant_state: list[int]) -> _FsdpStep:
    """FSDP's units of ``profile`` (`Sharding`): the root, each layer, and under LoRA each adapter tensor."""
    n = sharding.world_size
    full = cfg.method == "full"
    unq = place.unquantized_bytes if cfg.method == "qlora" else place.base_bytes
    gathered = 2 if place.autocast or not full else unq  # bf16 MixedPrecision for LoRA/QLoRA
    layers = [_Unit(p, d, unq, gathered, full, n) for p, d in zip(unit_params, unit_decay, strict=True)]
    adapters = [[] if full else [_Unit([t], [True], place.adapter_bytes, 2, True, n) for t in own] for own in trainable]
    head = profile.lm_head_params or 0
    final_norm = profile.total_params - sum(profile.layer_params) - profile.embedding_params - head
    root_params = [profile.embedding_params, final_norm] + ([head] if head else [])
    root = _Unit(root_params, [True, False, True][:len(root_params)], place.embedding_bytes or unq, gathered, full, n)
    grad_bytes = sizes(profile, cfg, place).trainable_bytes_per_param if full else 2
    return _FsdpStep(st, sharding, root, layers, adapters, grad_bytes, place.state_bytes, quant_state)
