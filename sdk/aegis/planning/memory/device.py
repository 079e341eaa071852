"""Device-level memory: what `torch.cuda.max_memory_reserved` (and so `nvidia-smi`) shows, not only live tensors.

The peak estimate (`aegis.planning.memory.estimate`) sizes the live tensors at the worst moment of a step. The
CUDA caching allocator holds whole segments, so the device shows more: blocks are rounded, small
tensors share 2 MiB segments, large freed blocks are split for smaller requests and a later large
request finds no contiguous room and maps a new segment. This module writes the allocation stream of
two training steps from the same tensors the estimate sizes, in the order eager PyTorch allocates
and frees them, and replays it through the allocator model (`aegis.planning.memory.allocator`):

    from aegis.planning.memory.device import device_memory
    dev = device_memory(profile, cfg)            # DeviceMemory(max_allocated_bytes, max_reserved_bytes, ...)

The stream, per tensor (each its own allocation, as PyTorch makes them):

1. **setup** — every parameter tensor in load order (embeddings, per layer its norms and linears —
   an NF4 weight as its five allocations: packed codes, absmax, nested absmax, code book, offset —
   then the final norm and an untied head), then the LoRA adapters (``lora_A``, ``lora_B`` per wrapped
   module, fp32).
2. **forward**, per layer: the tensors the activation model says the layer saves, each its own allocation
   (`aegis.planning.memory.activations.layer_activation_parts`: gate, up and the activation's tensors apart, not one
   block per term), plus the layer's output; under gradient
   checkpointing only the layer input stays and the rest is freed at the end of the layer. Then the
   head's saved input, the logits, their fp32 upcast and the log-softmax output.
3. **backward**: the NLL gradient and the log-softmax gradient, the loss buffers freed; per layer from
   the last: recomputation (checkpointing), the backward temporaries (gradient of the widest intermediate
   and of the residual stream, as the estimate sizes them), the layer's parameter gradients (one per
   trainable tensor), then the layer's saved tensors and temporaries freed.
4. **optimizer step**: on the first step the AdamW states (two per trainable tensor); the foreach
   temporary (one state-sized buffer per tensor of the decay group, freed together); then
   ``zero_grad(set_to_none=True)`` frees every gradient.

Limits: the stream has the sizes and lifetimes of the estimate's tensors, not every small temporary a
kernel makes (reshapes, masks of the loss, per-op scratch), and one tensor per activation term where
PyTorch may make several of the same total; `tools/truth/reserved.py` compares it with the allocation
stream of a traced step replayed through the same allocator model (`tests/data/reserved_truth.json`).
The CUDA context and the libraries' workspaces are outside the allocator: the GPU's catalog overhead
(`GPU.overhead_bytes`) is added on top for the headroom (`with_device_memory`), and `device_check` records the
three levels a user can read (`aegis.schema.DeviceLevelMemory`: allocated, reserved, and what nvidia-smi shows:
reserved + the CUDA context + the cuBLAS workspace, modelled in `aegis.planning.memory.runtime`) with the replay they came
from (two steps of the configured length, or the dataset's lengths).
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from aegis.models.families import get_family, layer_shapes
from aegis.planning.memory._dtypes import placement
from aegis.planning.memory.activations import fixed_saved_by_layer, head_saved_bytes_per_token, parts_by_layer
from aegis.planning.memory.allocator import AllocatorOutOfMemoryError, CachingAllocator, gc_paused
from aegis.planning.memory.components import NF4_BLOCK, NF4_BLOCK2, sizes
from aegis.errors import InvalidConfigError
from aegis.schema import GPU, DeviceLevelMemory, MemoryEstimate, ModelProfile, Tier, TrainConfig, lora_selects, lora_target_names

__all__ = ["DeviceMemory", "RunMemory", "Sharding", "device_memory", "allocation_stream", "with_device_memory",
           "device_check", "run_lengths", "run_memory", "run_check", "multi_gpu_device_level", "ddp_allocation_stream",
           "NOT_REPLAYED"]

STEPS = 2
"""Training steps written: the second runs with the optimizer states in place and a warm cache."""
RUN_STEPS = 16
"""Steps of a run over real data (`run_lengths`): drawn from the dataset's row lengths, then one at the longest."""
RUN_SEED = 0
"""Seed of `run_lengths`' draws: a plan is the same every time it is made."""
EXPANDABLE_HELPS_FRACTION = 0.05
"""`run_check` recommends expandable segments when they lower the run's reserved peak by at least this share, or
when the run fits only with them."""


@dataclass(frozen=True)
class DeviceMemory:
    """The allocator's view of two training steps."""

    max_allocated_bytes: int
    """Peak of live (512 B-rounded) tensor bytes in the written stream."""
    max_reserved_bytes: int
    """Peak of segment bytes the caching allocator holds: what the device shows above the context."""
    max_requested_bytes: int
    """Peak of the bytes asked for (the live tensors, unrounded)."""
    expandable_segments: bool
    events: int
    capacity_bytes: int | None = None
    """The memory the allocator could reserve (GPU memory minus the context), or None for unlimited."""
    alloc_retries: int = 0
    """Times the cache was flushed to retry an allocation (slow steps, but no error)."""
    out_of_memory: bool = False
    """An allocation failed even after flushing the cache: the step would raise CUDA out of memory."""

    @property
    def fragmentation_bytes(self) -> int:
        return self.max_reserved_bytes - self.max_allocated_bytes


class _Stream:
    def __init__(self) -> None:
        self.events: list[tuple[str, int, int]] = []
        self._ids = itertools.count(1)
        self._append = self.events.append  # thousands of events per tier: bound once

    def alloc(self, nbytes: float) -> int:
        ident = next(self._ids)
        n = int(nbytes)
        self._append(("alloc", ident, n if n > 0 else 0))
        return ident

    def free(self, *handles: int) -> None:
        self.events.extend([("free", h, 0) for h in handles])


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
        for e, d in zip(self.params, self.decay):
            if left <= 0:
                break
            out.append((min(e, left), d))
            left -= min(e, left)
        return out


class _FsdpStep:
    """Writes FSDP1's allocations into a `_Stream` at the moments `allocation_stream` names (rank 0's view)."""

    def __init__(self, st: _Stream, sharding: Sharding, root: _Unit, layers: list[_Unit], adapters: list[list[_Unit]],
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
        for layer, adapters in zip(self.layers, self.adapters):
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
            for unit, grad, handles in zip(self.adapters[i], grads, gathered[1:]):
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


def _nf4_parts(elements: int) -> tuple[int, ...]:
    """The allocations of one NF4 weight with double quantisation (`components.nf4_bytes`)."""
    blocks = -(-elements // NF4_BLOCK)
    return (-(-elements // 2), blocks, 4 * -(-blocks // NF4_BLOCK2), 256 * 4, 4)


def allocation_stream(
    profile: ModelProfile, cfg: TrainConfig, steps: int = STEPS, lengths: Sequence[int] | None = None,
    sharding: Sharding | None = None,
) -> list[tuple[str, int, int]]:
    """The ``("alloc", id, nbytes)`` / ``("free", id, 0)`` stream of ``steps`` training steps of ``cfg``; with
    ``lengths``, one step per entry, each of ``micro_batch_size`` rows of that many tokens (a batch padded to its
    longest row), in that order.

    ``sharding``: rank 0 of an FSDP run (`Sharding`): the same activations, loss buffers and backward temporaries,
    with FSDP's units in place of the parameters, gradients and optimizer states, and ``("stream", s, 0)`` events
    where FSDP allocates on its own streams (`_FsdpStep`; the estimate's FSDP terms, allocation by allocation):
    each unit's flat shard; the root gathered from the start of forward to the end of backward; each layer gathered
    for its forward (and, under SHARD_GRAD_OP, kept to its backward), gathered again with the previous layer
    prefetched for its backward (the last one prefetched at the loss); LoRA units gathered in bf16 from their fp32
    shard's bf16 copy; a unit's gradients made flat, reduce-scattered into a shard that lives to ``zero_grad``; the
    optimizer's states per original parameter's share of rank 0's shard. QLoRA as the estimate shards it (bf16
    storage, no k-bit preparation)."""
    from aegis.planning.memory.estimate import step_setting  # estimate imports this module lazily

    from aegis.planning.memory.stack_effects import backward_width, checkpoint_keeps_inputs, fused_loss, profile_for_stack

    profile = profile_for_stack(profile, cfg.stack)  # transformers 4.x: separate expert Linears
    if sharding is not None and cfg.method == "qlora" and cfg.stack.kbit_prep_effective:  # as the estimate shards it
        cfg = cfg.model_copy(update={"stack": cfg.stack.model_copy(update={"kbit_prep": False})})
    fam = get_family(profile.config)
    c = profile.config
    place = placement(cfg)
    sz = sizes(profile, cfg, place)
    setting = step_setting(profile, cfg, fam, place)
    layers = layer_shapes(fam, c, profile.layout_major)
    hidden, vocab = fam.hidden(c), fam.vocab(c)
    full = cfg.method == "full"
    lora = cfg.lora_config
    targets = lora_target_names(lora.target_modules, profile.linear_modules) if not full else frozenset()
    unq = place.unquantized_bytes if cfg.method == "qlora" else place.base_bytes
    st = _Stream()
    pst = st if sharding is None else _Stream()  # sharded: FSDP's units replace the parameters (`_FsdpStep.setup`)
    unit_params: list[list[int]] = []  # per layer, in module order: its parameters' elements as FSDP flattens them
    unit_decay: list[list[bool]] = []
    quant_state: list[int] = []

    # -- setup: parameters in load order, then adapters ------------------------------------------------
    trainable: list[list[int]] = []  # per layer: trainable tensor sizes (elements)
    head_trainable: list[int] = []
    no_decay: list[int] = []  # HF's optimizer groups: biases and norm weights take no weight decay
    embed = vocab * hidden
    pst.alloc(embed * (place.embedding_bytes or unq))
    if full:
        head_trainable.append(embed)
    for layer in layers:
        own: list[int] = []
        flat: list[int] = []
        flat_decay: list[bool] = []
        norm_tensors = max(1, round(layer.norm_params / hidden)) if layer.norm_params else 0
        for _ in range(norm_tensors):
            pst.alloc(layer.norm_params / norm_tensors * unq)
        if full and norm_tensors:
            own += [layer.norm_params // norm_tensors] * norm_tensors
            no_decay += [layer.norm_params // norm_tensors] * norm_tensors
        if layer.router_params:
            pst.alloc(layer.router_params * unq)
            if full:
                own.append(layer.router_params)
        for lin in layer.linears:
            n = lin.count * lin.in_features * lin.out_features
            if cfg.method == "qlora" and lin.quantizable:
                for _ in range(lin.count):
                    packed, *state = _nf4_parts(lin.in_features * lin.out_features)
                    for part in (packed, *state):
                        pst.alloc(part)
                    flat.append(-(-packed // 2))  # bnb_4bit_quant_storage=bfloat16: the packed bytes as bf16
                    flat_decay.append(True)
                    quant_state += state  # not a parameter: whole on every rank
            else:
                pst.alloc(n * (place.base_bytes if cfg.method != "qlora" else unq))
                flat.append(n)
                flat_decay.append(True)
            if lin.bias:
                pst.alloc(lin.count * lin.out_features * unq)
                flat.append(lin.count * lin.out_features)
                flat_decay.append(False)
            if full:
                own.append(n)
                if lin.bias:
                    own.append(lin.count * lin.out_features)
                    no_decay.append(lin.count * lin.out_features)
        trainable.append(own)
        unit_params.append(flat + ([layer.norm_params // norm_tensors] * norm_tensors if norm_tensors else [])
                           + ([layer.router_params] if layer.router_params else []))
        unit_decay.append(flat_decay + [False] * norm_tensors + ([True] if layer.router_params else []))
    pst.alloc(hidden * unq)  # final norm
    if full:
        head_trainable.append(hidden)
        no_decay.append(hidden)
    if not profile.tie_word_embeddings:
        pst.alloc(embed * (place.embedding_bytes or unq))
        if full:
            head_trainable.append(embed)
    if not full:
        for i, layer in enumerate(layers):
            for lin in layer.linears:
                if lora_selects(lin, targets):
                    r = lora.rank * lin.lora_rank_factor
                    for shape in (lin.in_features * r, r * lin.out_features):
                        pst.alloc(lin.count * shape * place.adapter_bytes)
                        trainable[i].append(lin.count * shape)

    # -- the per-step quantities the estimate uses -----------------------------------------------------
    shapes: dict[int, tuple[int, list[list[float]], int]] = {}

    def step_shape(seq: int) -> tuple[int, list[list[float]], int]:
        """Tokens, per-layer saved tensors (bytes per token) and mask bytes of a step of ``seq``-token rows."""
        if seq not in shapes:
            at = setting if seq == cfg.seq_len else setting._replace(seq_len=seq)
            # each saved tensor its own allocation, as PyTorch makes them (a label's parts: gate, up, act, ...)
            per_layer = [[v for label in by_label.values() for v in label] for by_label in parts_by_layer(fam, c, layers, at)]
            n = cfg.micro_batch_size * seq
            mask_bytes = 0
            if setting.eager:
                mask_bytes = n * seq * stream_b
            elif cfg.attention == "sdpa" and any(layer.sliding_window and layer.sliding_window < seq for layer in layers):
                mask_bytes = n * seq
            shapes[seq] = (n, per_layer, mask_bytes)
        return shapes[seq]

    # PEFT's merged W + B@A of adapted fused experts, saved once per layer whatever the token count
    fixed = fixed_saved_by_layer(layers, setting) if cfg.method != "full" else [0] * len(layers)
    head_saved = head_saved_bytes_per_token(fam, c, setting)
    d_l = 2 if place.autocast else setting.lm_head_bytes  # the estimate's logits dtype (TRL QLoRA: bf16 head)
    stream_b = place.stream_bytes
    d = 2 if place.autocast else stream_b
    width = backward_width(layers, cfg)  # as the estimate (4.x MoE: one expert's rows at a time)
    gb = sz.trainable_bytes_per_param
    state_b = place.state_bytes
    all_trainable = [t for own in trainable for t in own] + head_trainable
    skip = Counter(no_decay)  # only sizes are allocated: equal-sized tensors are interchangeable
    decay = []
    for t in all_trainable:
        if skip[t]:
            skip[t] -= 1
        else:
            decay.append(t)
    states: list[int] = []
    chunked = fused_loss(cfg)
    keeps_inputs = checkpoint_keeps_inputs(cfg)  # Unsloth's offloading keeps layer inputs on the host

    # bf16 copies autocast makes of fp32 weights and keeps for backward (the estimate's "casts")
    cast_per_layer: list[list[int]] = [[] for _ in layers]
    cast_head: list[int] = []
    if cfg.autocast_effective and cfg.method == "lora" and sharding is None:  # FSDP gathers the adapters in bf16
        cast_per_layer = [[t * 2 for t in own] for own in trainable]
    elif cfg.autocast_effective and cfg.method == "qlora" and (place.embedding_bytes or place.unquantized_bytes) != 2:
        # an fp32 head (k-bit prep) is cast; a bf16 one (TRL's, or no k-bit prep) is not
        cast_head = [(profile.lm_head_params or profile.embedding_params) * 2]

    fs = None
    if sharding is not None:
        fs = _fsdp_step(st, sharding, profile, cfg, place, trainable, unit_params, unit_decay, quant_state)
        fs.setup()
        gb = fs.grad_bytes
    for seq in lengths if lengths is not None else [cfg.seq_len] * steps:
        tokens, parts, masks = step_shape(seq)
        mask = st.alloc(masks) if masks else None
        # -- forward ----------------------------------------------------------------------------------
        if fs:
            fs.gather_root()
        x = st.alloc(tokens * hidden * stream_b)  # embedding output
        saved: list[list[int]] = []
        for i in range(len(layers)):
            if fs:
                fs.gather_layer(i)
            if cfg.gradient_checkpointing:
                inner = [st.alloc(tokens * v) for v in parts[i]] + ([st.alloc(fixed[i])] if fixed[i] else [])
                out = st.alloc(tokens * hidden * stream_b)
                st.free(*inner)
                if keeps_inputs:
                    saved.append([x])  # the layer input stays for recomputation
                else:
                    st.free(x)  # offloaded to the host: brought back for the layer's backward
                    saved.append([])
            else:
                own = [st.alloc(v) for v in cast_per_layer[i]] + [st.alloc(tokens * v) for v in parts[i]]
                own += [st.alloc(fixed[i])] if fixed[i] else []
                out = st.alloc(tokens * hidden * stream_b)
                st.free(x)  # the residual add needs no input for backward; the norm saved its own copy
                saved.append(own)
            x = out
            if fs:
                fs.forward_done(i)
        head = st.alloc(tokens * head_saved)
        casts = [st.alloc(v) for v in cast_head]
        if chunked:
            chunk = max(1, -(-tokens // -(-vocab // hidden)))
            buf = st.alloc(chunk * vocab * 12)
            hgrad = st.alloc(tokens * hidden * 4)
            st.free(buf)
            loss_live: list[int] = [hgrad]
        else:
            logits = st.alloc(tokens * vocab * d_l)
            extra = [st.alloc(tokens * vocab * d_l)] if fam.logits_scaling(c) else []  # Granite, Cohere: scaled logits
            tanh = [st.alloc(tokens * vocab * d_l)] if fam.logit_softcap(c) else []  # soft-capping, saved
            up = [st.alloc(tokens * vocab * 4)] if d_l != 4 else []
            # transformers <= 4.48: logits[..., :-1, :].contiguous() of the upcast, live while cross-entropy runs
            shift = [st.alloc(tokens * vocab * 4)] if setting.loss_shift_copy else []
            lsm = st.alloc(tokens * vocab * 4)
            st.free(logits, *extra, *up, *shift)
            # -- backward of the loss: NLL grad and log-softmax grad live with the log-softmax output ---
            nll = st.alloc(tokens * vocab * 4)
            glsm = st.alloc(tokens * vocab * 4)
            st.free(lsm, nll)
            glog = st.alloc(tokens * vocab * d_l) if d_l != 4 else None
            st.free(glsm, *tanh)
            loss_live = [glog] if glog is not None else []
        if fs:  # the root's pre-backward prefetches the last layer
            fs.gather_layer(len(layers) - 1)
        # head backward: the gradient flowing into the residual stream; the head's own grads
        g = st.alloc(tokens * hidden * stream_b)
        # the final norm's and an untied head's grads now; the embedding's when its backward runs, last. A tied
        # head's grad of the shared weight comes now, and the embedding's is added to it out of place (traced:
        # head grad, embedding grad, their sum; the first two freed)
        grads = [st.alloc(t * gb) for t in head_trainable[1:]]
        tied_head = st.alloc(embed * gb) if full and profile.tie_word_embeddings else None
        st.free(*loss_live, head, x, *casts)
        root_grads: list[int] = []
        if fs:
            root_grads, grads = grads, []
        # -- backward, layer by layer ------------------------------------------------------------------
        for i in range(len(layers) - 1, -1, -1):
            if fs:  # BACKWARD_PRE: this layer (gathered already) and the one below, prefetched
                fs.gather_layer(i)
                fs.gather_layer(i - 1)
            recompute = [st.alloc(tokens * v) for v in parts[i]] if cfg.gradient_checkpointing else []
            recompute += [st.alloc(fixed[i])] if cfg.gradient_checkpointing and fixed[i] else []
            if cfg.gradient_checkpointing and not keeps_inputs:
                recompute.append(st.alloc(tokens * hidden * stream_b))  # the input, back from the host
            # the widest intermediate's gradients; the residual-width pair the estimate's backward temporaries
            # count (2 x stream x hidden) is the incoming gradient g and the outgoing g_new
            temp_big = st.alloc(tokens * 2 * d * width)
            layer_grads = [st.alloc(t * gb) for t in trainable[i]]
            g_new = st.alloc(tokens * hidden * stream_b)
            st.free(temp_big, g, *recompute, *saved[i])
            g = g_new
            if fs:
                fs.backward_done(i, layer_grads)
            else:
                grads += layer_grads
        if full:  # the embedding's backward
            emb = st.alloc(embed * gb)
            if tied_head is not None:
                total = st.alloc(embed * gb)
                st.free(tied_head, emb)
                emb = total
            grads.append(emb)
        if fs:
            fs.root_done(root_grads + grads)
            grads = []
        st.free(g)
        if mask is not None:
            st.free(mask)
        # -- optimizer step --------------------------------------------------------------------------
        if fs:
            fs.optimizer(cfg.optimizer == "adamw", not cfg.stack.adamw_fused)
            continue
        if not states:
            if cfg.optimizer == "adamw":
                states = [st.alloc(t * state_b) for t in all_trainable for _ in range(2)]
            elif cfg.optimizer in ("adamw_8bit", "paged_adamw_8bit"):
                states = [st.alloc(t * (1 + 4 / 2048)) for t in all_trainable for _ in range(2)]
        if cfg.optimizer == "adamw" and not cfg.stack.adamw_fused:
            temps = [st.alloc(t * state_b) for t in decay]  # foreach sqrt(v) copy of the largest group
            st.free(*temps)
        st.free(*grads)  # zero_grad(set_to_none=True)
    return st.events


def _fsdp_step(st: _Stream, sharding: Sharding, profile: ModelProfile, cfg: TrainConfig, place, trainable: list[list[int]],
               unit_params: list[list[int]], unit_decay: list[list[bool]], quant_state: list[int]) -> _FsdpStep:
    """FSDP's units of ``profile`` (`Sharding`): the root, each layer, and under LoRA each adapter tensor."""
    n = sharding.world_size
    full = cfg.method == "full"
    unq = place.unquantized_bytes if cfg.method == "qlora" else place.base_bytes
    gathered = 2 if place.autocast or not full else unq  # bf16 MixedPrecision for LoRA/QLoRA
    layers = [_Unit(p, d, unq, gathered, full, n) for p, d in zip(unit_params, unit_decay)]
    adapters = [[] if full else [_Unit([t], [True], place.adapter_bytes, 2, True, n) for t in own] for own in trainable]
    head = profile.lm_head_params or 0
    final_norm = profile.total_params - sum(profile.layer_params) - profile.embedding_params - head
    root_params = [profile.embedding_params, final_norm] + ([head] if head else [])
    root = _Unit(root_params, [True, False, True][:len(root_params)], place.embedding_bytes or unq, gathered, full, n)
    grad_bytes = sizes(profile, cfg, place).trainable_bytes_per_param if full else 2
    return _FsdpStep(st, sharding, root, layers, adapters, grad_bytes, place.state_bytes, quant_state)


def device_memory(
    profile: ModelProfile, cfg: TrainConfig, *, expandable_segments: bool = False, capacity_bytes: int | None = None,
    lengths: Sequence[int] | None = None, sharding: Sharding | None = None,
) -> DeviceMemory:
    """Replay `allocation_stream` through the caching allocator model: the reserved peak of ``cfg``. With
    ``capacity_bytes`` the allocator flushes its cache and retries when a new segment does not fit, as
    PyTorch does, and ``out_of_memory`` says whether the step fails anyway. With ``lengths`` (`run_lengths`) the
    stream is one step per length, a run over real data, instead of two steps of ``cfg.seq_len``. With ``sharding``
    the stream is rank 0's of an FSDP run (`allocation_stream`), FSDP's side streams in their own pools."""
    with gc_paused():  # thousands of short-lived tuples and blocks: no collections while they are made
        events = allocation_stream(profile, cfg, lengths=lengths, sharding=sharding)
        allocator = CachingAllocator(expandable_segments=expandable_segments, capacity_bytes=capacity_bytes)
        try:
            stats = allocator.replay(events)
            oom = False
        except AllocatorOutOfMemoryError:
            stats, oom = allocator.stats(), True
    return DeviceMemory(
        max_allocated_bytes=stats.max_allocated_bytes,
        max_reserved_bytes=stats.max_reserved_bytes,
        max_requested_bytes=stats.max_requested_bytes,
        expandable_segments=expandable_segments,
        events=len(events),
        capacity_bytes=capacity_bytes,
        alloc_retries=stats.alloc_retries,
        out_of_memory=oom,
    )


def run_lengths(
    row_lengths: Sequence[int], seq_len: int, micro_batch_size: int = 1, *, steps: int = RUN_STEPS, seed: int = RUN_SEED,
) -> tuple[int, ...]:
    """The padded length of each step of a run over data whose rows have ``row_lengths`` tokens (a dataset profile's
    `row_lengths`, or any stated sample of the distribution): ``steps`` batches of ``micro_batch_size`` rows drawn
    with replacement (a seeded `random.Random`, as the Trainer's seeded sampler shuffles), each row truncated to
    ``seq_len`` and the batch padded to its longest row (HF's collators pad to the longest in the batch), then one
    step of ``seq_len``: the longest batch a run over the whole data reaches, met with the cache the others left."""
    import random

    rows = [min(int(n), seq_len) for n in row_lengths if n > 0]
    if not rows:
        raise InvalidConfigError("run_lengths needs at least one positive row length")
    if steps < 1:
        raise InvalidConfigError(f"steps must be >= 1, got {steps}")
    rng = random.Random(seed)
    drawn = [max(max(rng.choice(rows) for _ in range(micro_batch_size)), 2) for _ in range(steps)]
    return (*drawn, seq_len)


@dataclass(frozen=True)
class RunMemory:
    """The caching allocator over a run of varied lengths (`run_memory`), beside two steps of the longest."""

    lengths: tuple[int, ...]
    """The padded length of each step replayed, in order."""
    run: DeviceMemory
    """The run replayed with the default allocator settings."""
    run_expandable: DeviceMemory
    """The same run with ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``."""
    fixed: DeviceMemory
    """Two steps of the longest length only (what `device_memory` predicts without the data)."""

    @property
    def fragmentation_bytes(self) -> int:
        """Reserved above the live peak over the run: what the cache's segments hold that no tensor uses."""
        return self.run.max_reserved_bytes - self.run.max_allocated_bytes

    @property
    def varied_bytes(self) -> int:
        """What the run's lengths add to the reserved peak of two steps of the longest length."""
        return self.run.max_reserved_bytes - self.fixed.max_reserved_bytes

    @property
    def expandable_saves_bytes(self) -> int:
        return self.run.max_reserved_bytes - self.run_expandable.max_reserved_bytes


def run_memory(profile: ModelProfile, cfg: TrainConfig, lengths: Sequence[int]) -> RunMemory:
    """Replay one step per length (`run_lengths`) through the allocator model, with and without expandable segments,
    and two steps of ``cfg.seq_len`` for comparison."""
    lengths = tuple(int(n) for n in lengths)
    return RunMemory(
        lengths=lengths,
        run=device_memory(profile, cfg, lengths=lengths),
        run_expandable=device_memory(profile, cfg, lengths=lengths, expandable_segments=True),
        fixed=device_memory(profile, cfg),
    )


def with_device_memory(
    est: MemoryEstimate, profile: ModelProfile, *, expandable_segments: bool = False, capacity_bytes: int | None = None,
    lengths: Sequence[int] | None = None,
) -> tuple[MemoryEstimate, DeviceMemory]:
    """``est`` with its predicted reserved peak; the range's high end becomes what the device shows when that is
    more (reserved segments + the CUDA context), so headroom is judged on reserved memory. ``lengths``: the reserved
    peak of a run of those step lengths (`run_lengths`)."""
    dev = device_memory(profile, est.config, expandable_segments=expandable_segments, capacity_bytes=capacity_bytes,
                        lengths=lengths)
    device = dev.max_reserved_bytes + est.overhead_bytes
    return est.model_copy(update={
        "reserved_bytes": dev.max_reserved_bytes,
        "expandable_segments": expandable_segments,
        "high_bytes": max(est.high_bytes, device),
    }), dev


def _device_level(gpu: GPU, dev: DeviceMemory, cfg: TrainConfig, lengths: Sequence[int] | None) -> DeviceLevelMemory:
    """The three levels of memory of ``dev``'s replay on ``gpu`` (one GPU: no NCCL buffers)."""
    from aegis.planning.memory.runtime import device_level

    if lengths is None:
        replay = f"two steps of {cfg.seq_len} tokens"
    else:
        replay = f"{len(lengths) - 1} steps of the dataset's lengths, then one of {lengths[-1]} tokens"
    return device_level(gpu, allocated_bytes=dev.max_allocated_bytes, reserved_bytes=dev.max_reserved_bytes,
                        replay=replay)


def device_check(profile: ModelProfile, gpu: GPU, tier: Tier, row_lengths: Sequence[int] | None = None) -> Tier:
    """``tier`` judged at the device level (headroom = GPU memory - the high end, now at least reserved + context).

    The step is replayed with unlimited memory first. If its reserved peak does not fit the GPU, it is replayed
    with the GPU's capacity, where PyTorch's allocator frees its cached segments and retries before failing:
    the tier fits if no allocation fails (tight: headroom 0, the cache is flushed during the step), else it is
    tried with expandable segments (``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``), else it does not fit.

    ``row_lengths`` (a dataset profile's `row_lengths`): the replay is a run of `RUN_STEPS` steps of the data's lengths
    and one of the longest (`run_lengths`), whose cache fragments over the varied shapes; where expandable segments
    lower that run's reserved peak by `EXPANDABLE_HELPS_FRACTION` or more, the tier is planned with them."""
    lengths = None
    expandable = False
    notes: tuple[str, ...] = ()
    if row_lengths:
        cfg = tier.memory.config
        lengths = run_lengths(row_lengths, cfg.seq_len, cfg.micro_batch_size)
        run = run_memory(profile, cfg, lengths)
        saves = run.expandable_saves_bytes
        expandable = saves >= EXPANDABLE_HELPS_FRACTION * run.run.max_reserved_bytes
        gib = 1 << 30
        notes = (
            f"real data's lengths: {len(lengths) - 1} steps of lengths drawn from the dataset's {len(row_lengths)} rows "
            f"(seed {RUN_SEED}) then one of {cfg.seq_len}, replayed through the caching allocator: the run reserves "
            f"{run.run.max_reserved_bytes / gib:.2f} GiB for a {run.run.max_allocated_bytes / gib:.2f} GiB live peak "
            f"({run.fragmentation_bytes / gib:.2f} GiB of cached segments no tensor uses; "
            f"{run.varied_bytes / gib:+.2f} GiB against steps of one length); with "
            f"PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True it reserves {run.run_expandable.max_reserved_bytes / gib:.2f} GiB"
            + (": set it for this run" if expandable else ""),)
    mem, dev = with_device_memory(tier.memory, profile, lengths=lengths, expandable_segments=expandable)
    capacity = gpu.memory_bytes - tier.memory.overhead_bytes
    fits = tier.fits and gpu.memory_bytes - mem.high_bytes >= 0
    headroom = gpu.memory_bytes - mem.high_bytes
    if tier.fits and not fits:
        for expandable in (False, True):
            capped, capped_dev = with_device_memory(tier.memory, profile, expandable_segments=expandable,
                                                    capacity_bytes=capacity, lengths=lengths)
            if not capped_dev.out_of_memory:
                mem, dev, fits, headroom = capped, capped_dev, True, min(0, gpu.memory_bytes - capped.high_bytes)
                break
    if notes:
        mem = mem.model_copy(update={"notes": mem.notes + notes})
    mem = mem.model_copy(update={"device_level": _device_level(gpu, dev, tier.memory.config, lengths)})
    return tier.model_copy(update={"memory": mem, "headroom_bytes": min(tier.headroom_bytes, headroom), "fits": fits})


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
    wrap += [("alloc", h, n) for h, n in zip(handles, first)]
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
    if strategy == "fsdp" and profile is not None:
        cfg = tier.memory.config
        dev = device_memory(profile, cfg, sharding=Sharding(world_size))
        reserved = max(dev.max_reserved_bytes, peak)
        replay = (f"two steps of {cfg.seq_len} tokens of rank 0 under FSDP FULL_SHARD on {world_size} GPUs "
                  "(its all-gather and reduce-scatter streams' blocks apart)")
        if reserved + tier.memory.overhead_bytes > gpu.memory_bytes:
            gib = 1 << 30
            notes = (f"FSDP's caching allocator reserves {reserved / gib:.2f} GiB per GPU for a {peak / gib:.2f} GiB "
                     f"live peak ({(reserved - peak) / gib:.2f} GiB cached in freed and split blocks, FSDP's side "
                     f"streams' blocks apart): with the overhead, more than the {gpu.name}'s memory; "
                     "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True or a smaller micro batch may be needed",)
    elif strategy == "ddp" and profile is not None:
        cfg = tier.memory.config
        with gc_paused():
            stats = CachingAllocator().replay(ddp_allocation_stream(profile, cfg))
        reserved = max(stats.max_reserved_bytes, peak)
        replay = f"two steps of {cfg.seq_len} tokens of one DDP rank on {world_size} GPUs, with DDP's gradient buckets"
        if reserved + tier.memory.overhead_bytes > gpu.memory_bytes:
            gib = 1 << 30
            notes = (f"DDP's caching allocator reserves {reserved / gib:.2f} GiB per GPU for a {peak / gib:.2f} GiB "
                     f"live peak: with the overhead, more than the {gpu.name}'s memory; "
                     "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True or a smaller micro batch may be needed",)
    level = device_level(gpu, allocated_bytes=peak, reserved_bytes=reserved, world_size=world_size, replay=replay)
    update = {"device_level": level, "notes": tier.memory.notes + notes}
    return tier.model_copy(update={"memory": tier.memory.model_copy(update=update)})
