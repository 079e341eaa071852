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
4. **optimizer step**: per parameter group (HF's weight-decay group, then the rest, each in module order): on the
   first step the group's AdamW states (two per trainable tensor); the foreach temporary (one state-sized buffer
   per tensor of the group, freed together); then
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

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from aegis.models.families import get_family, layer_shapes
from aegis.planning.memory._dtypes import placement
from aegis.planning.memory.activations import (
    MATH_KERNEL_LABEL, fixed_saved_by_layer, head_saved_bytes_per_token, parts_by_layer,
)
from aegis.planning.memory.allocator import AllocatorOutOfMemoryError, CachingAllocator, EventStream, gc_paused
from aegis.planning.memory.components import NF4_BLOCK, NF4_BLOCK2, sizes
from aegis.planning.memory.sharded_step import Sharding, fsdp_step
from aegis.errors import InvalidConfigError
from aegis.schema import GPU, DeviceLevelMemory, MemoryEstimate, ModelProfile, Tier, TrainConfig, lora_selects, lora_target_names

__all__ = ["DeviceMemory", "RunMemory", "device_memory", "allocation_stream", "with_device_memory", "device_check",
           "run_lengths", "run_memory"]

STEPS = 2
"""Training steps written: the second runs with the optimizer states in place and a warm cache."""
RUN_STEPS = 16
"""Steps of a run over real data (`run_lengths`): drawn from the dataset's row lengths, then one at the longest."""
RUN_SEED = 0
"""Seed of `run_lengths`' draws: a plan is the same every time it is made."""
EXPANDABLE_HELPS_FRACTION = 0.05
"""`device_check` recommends expandable segments when they lower the run's reserved peak by at least this share, or
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
    from aegis.planning.memory.estimate import full_autocast_casts, step_setting  # estimate imports this lazily

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
    st = EventStream()
    pst = st if sharding is None else EventStream()  # sharded: FSDP's units replace the parameters (`_FsdpStep.setup`)
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
    shapes: dict[int, tuple[int, list[list[float]], int, list[int | None]]] = {}

    def step_shape(seq: int) -> tuple[int, list[list[float]], int, list[int | None]]:
        """Tokens, per-layer saved tensors (bytes per token), mask bytes of a step of ``seq``-token rows, and per
        layer the index of the math kernel's probabilities among its saved tensors (None: not that kernel)."""
        if seq not in shapes:
            at = setting if seq == cfg.seq_len else setting._replace(seq_len=seq)
            # each saved tensor its own allocation, as PyTorch makes them (a label's parts: gate, up, act, ...)
            per_layer: list[list[float]] = []
            scores_at: list[int | None] = []
            for by_label in parts_by_layer(fam, c, layers, at):
                flat: list[float] = []
                probs = None
                for label, values in by_label.items():
                    flat += values
                    if label == MATH_KERNEL_LABEL:
                        probs = len(flat) - 1  # the label's last part
                per_layer.append(flat)
                scores_at.append(probs)
            n = cfg.micro_batch_size * seq
            mask_bytes = 0
            if setting.eager:
                mask_bytes = n * seq * stream_b
            elif cfg.attention == "sdpa" and any(layer.sliding_window and layer.sliding_window < seq for layer in layers):
                mask_bytes = n * seq
            shapes[seq] = (n, per_layer, mask_bytes, scores_at)
        return shapes[seq]

    def saved_parts(tokens: int, values: list[float], probs: int | None) -> list[int]:
        """Allocate a layer's saved tensors; the math kernel's float32 scores live until its probabilities exist.

        Only where the forward saves (no checkpointing): a checkpointed layer's forward and recomputation hold all
        of its parts at once here, freed together, where PyTorch frees each as its consumer finishes, which already
        covers the scores' moment (measured on the reserved truth rows: Qwen2.5-1.5B QLoRA b2 -5.8% -> +0.1% with
        the scores; Llama-3.2-1B QLoRA b4 checkpointed -0.1% without, +6.2% with them)."""
        out = []
        for j, v in enumerate(values):
            scores = st.alloc(tokens * v) if j == probs else None
            out.append(st.alloc(tokens * v))
            if scores is not None:
                st.free(scores)
        return out

    # PEFT's merged W + B@A of adapted fused experts, saved once per layer whatever the token count
    fixed = fixed_saved_by_layer(layers, setting) if cfg.method != "full" else [0] * len(layers)
    head_saved = head_saved_bytes_per_token(fam, c, setting)
    d_l = 2 if place.autocast else setting.lm_head_bytes  # the estimate's logits dtype (TRL QLoRA: bf16 head)
    stream_b = place.stream_bytes
    d = 2 if place.autocast else stream_b
    width = backward_width(layers, cfg)  # as the estimate (4.x MoE: one expert's rows at a time)
    gb = sz.trainable_bytes_per_param
    state_b = place.state_bytes
    # the optimizer's parameter groups as HF's Trainer builds them: the weight-decay group, then the rest, each in
    # module order (the embedding first; the final norm and an untied head last)
    in_module_order = head_trainable[:1] + [t for own in trainable for t in own] + head_trainable[1:]
    skip = Counter(no_decay)  # only sizes are allocated: equal-sized tensors are interchangeable
    decay: list[int] = []
    rest: list[int] = []
    for t in in_module_order:
        if skip[t]:
            skip[t] -= 1
            rest.append(t)
        else:
            decay.append(t)
    groups = [g for g in (decay, rest) if g]
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
    elif cfg.autocast_effective and cfg.method == "full" and sharding is None and gb == 4:
        # fp32 weights under autocast: every matmul weight's copy, cached until the forward's autocast exits
        cast_per_layer = full_autocast_casts(layers)
        cast_head = [(profile.lm_head_params or profile.embedding_params) * 2]
    cached_casts = cfg.method == "full" and cfg.gradient_checkpointing  # held by autocast's cache, not by backward

    fs = None
    if sharding is not None:
        fs = fsdp_step(st, sharding, profile, cfg, place, trainable, unit_params, unit_decay, quant_state)
        fs.setup()
        gb = fs.grad_bytes
    for seq in lengths if lengths is not None else [cfg.seq_len] * steps:
        tokens, parts, masks, probs_at = step_shape(seq)
        mask = st.alloc(masks) if masks else None
        # -- forward ----------------------------------------------------------------------------------
        if fs:
            fs.gather_root()
        x = st.alloc(tokens * hidden * stream_b)  # embedding output
        saved: list[list[int]] = []
        in_cache: list[int] = []
        for i in range(len(layers)):
            if fs:
                fs.gather_layer(i)
            if cfg.gradient_checkpointing:
                if cached_casts:
                    in_cache += [st.alloc(v) for v in cast_per_layer[i]]
                inner = saved_parts(tokens, parts[i], None) + ([st.alloc(fixed[i])] if fixed[i] else [])
                out = st.alloc(tokens * hidden * stream_b)
                st.free(*inner)
                if keeps_inputs:
                    saved.append([x])  # the layer input stays for recomputation
                else:
                    st.free(x)  # offloaded to the host: brought back for the layer's backward
                    saved.append([])
            else:
                own = [st.alloc(v) for v in cast_per_layer[i]] + saved_parts(tokens, parts[i], probs_at[i])
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
            st.free(buf, *in_cache)
            in_cache = []
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
            st.free(*in_cache)  # the forward's autocast exits with the loss: its cache goes
            in_cache = []
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
            recompute = [st.alloc(v) for v in cast_per_layer[i]] if cached_casts else []
            recompute += saved_parts(tokens, parts[i], None) if cfg.gradient_checkpointing else []
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
        first = not states
        for group in groups:  # torch steps one group at a time, making its states on the first step
            if first and cfg.optimizer == "adamw":
                states += [st.alloc(t * state_b) for t in group for _ in range(2)]
            elif first and cfg.optimizer in ("adamw_8bit", "paged_adamw_8bit"):
                states += [st.alloc(t * (1 + 4 / 2048)) for t in group for _ in range(2)]
            if cfg.optimizer == "adamw" and not cfg.stack.adamw_fused:
                temps = [st.alloc(t * state_b) for t in group]  # foreach: sqrt(v), one per tensor of the group
                st.free(*temps)
        st.free(*grads)  # zero_grad(set_to_none=True)
    return st.events


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
