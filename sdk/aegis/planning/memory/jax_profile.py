"""The planner's ``jax`` framework profile: peak memory of Aegis' JAX train step as XLA lays it out.

`aegis.train.step.make_train_step` compiles one XLA program per configuration; its peak is what
``compiled.memory_analysis()`` reports (`aegis.train.benchmark.jax_step_memory`): arguments +
outputs - donated (aliased) state + temporaries. This module predicts that number from shapes alone,
component by component, without importing JAX:

- **static arguments**, exact from the engine's parameter tree: the frozen base (bf16/fp32, or NF4
  packed codes + uint8 absmax + fp32 absmax scales per layer slice for QLoRA, `train/nf4.py`), the
  trainable tree, optimizer state (AdamW moments in fp32 via ``_fp32_update``; SGD momentum and
  Adafactor's factored moments in the param dtype; ``inject_hyperparams`` scalars) and the batch
  (five int32/float32 ``[accum, b, s]`` arrays). The new state is written into the donated buffers,
  so it costs nothing extra.
- **gradients**: the backward dots' float32 weight gradients (each leaf is cast to the param dtype
  into memory its float32 gradient frees), float32 accumulators with gradient accumulation, and for a
  tied head its dot gradient beside the embedding's scatter gradient. At the loss only those allocated
  before it are live: the scan's stacked layer gradients (allocated before its backward loop; unrolled
  layers make theirs in their own backward) and, for full fine-tuning, the embedding's scatter-add
  gradient; the head's comes after the logits are freed.
- **activations**: what the backward pass reads, per layer and token, as XLA keeps it (its memory
  report of the compiled step, for the engine's `train/models/layers.py` computation): the float32
  masked attention scores per head (the engine's ``xla`` attention materialises them one query block
  at a time against the keys up to the block's end: `aegis.models.shapes.causal_key_span` keys per
  query, 53% of the square at 2,048 tokens; on a GPU where the engine runs cuDNN flash attention, only its float32 softmax statistics
  per head and token), hidden-wide tensors (RMSNorm float32 inputs, normed outputs, residual stream, projection
  inputs), q/k/v, six [b, s, intermediate] MLP tensors, LoRA ``x @ A``. Under remat (scanned
  layers) each layer keeps only its input and one layer is recomputed in the backward pass.
- **logits**: float32 [b, s, vocab] logits and their gradient; the softmax, the one-hot target
  select and the loss fuse into them; with a trained head XLA:CPU also writes the gradient transposed
  for the head-gradient dot (chunked cross-entropy: one chunk).
- **backward temporaries**: one layer's gradient working set, and for QLoRA one layer's
  dequantised weights (rematerialised in the backward pass). Unrolled layers free their residuals
  as their backward consumes them, so only the working set beyond them counts.

- **the optimizer state's copies**: the non-finite skip guard selects, leaf by leaf, between the
  updated and the kept state (``jnp.where(skip, old, new)``, `train/step.py`). Writing the new moments
  into the donated buffers while the select still reads the old ones, XLA copies every optimizer-state
  leaf at the start of the step (before the forward pass) and holds the copies until that leaf's update;
  the parameters are updated in place, uncopied. The vacated donated buffers are free until the update
  writes the new state into them: the residuals, logits and float32 weight copies made after the copies
  are placed there, and cost only what exceeds the optimizer state (its buffer assignment, one device
  and {fsdp: 4}; the gradients, read by the update, stay in temporaries).
- **weight slices** (XLA:CPU, full fine-tuning, unrolled layers in the parameter dtype): each layer's
  trained matrices are sliced out of their stacks into their own buffers before the forward pass, each
  freed at that layer's weight-gradient dot, where its gradient (as large) is made.

The peak is the largest of three moments: the loss and head backward (all residuals, the logits, the
head, the weight slices), the backward of the layers (all residuals, one layer's working set, all
gradients) and the optimizer update (the optimizer state's copies beside every gradient: where
parameters and optimizer states dominate, as in full fine-tuning of a small model).

**Sharded runs** (``fsdp_shards`` / ``tensor_shards``, the run's ``parallel`` mesh): every array is
split by the engine's own rules (`aegis.models.shapes`: logical axes from the architecture registry,
:data:`~aegis.models.shapes.LOGICAL_AXIS_RULES`, an axis no mesh axis divides stays whole), so
parameters, LoRA adapters, NF4 codes and absmax, optimizer states and gradients are one device's
blocks; the batch is one rank's micro batch. A dot whose weight is split on its contracting ``embed``
axis runs on whichever operand GSPMD gathers more cheaply: the weight (one layer at a time) or the
fsdp group's batch, whose output (the MLP's intermediates, the logits) is then made for the whole
group on every device (`_gathered_tokens`). Measured against XLA's per-device analysis on 4 forced
host devices: full fine-tuning, fp32, hidden 512, 2 layers, {fsdp: 4}: 53.49 MB planned vs 55.99 MB compiled
(-4.5%: XLA's peak is at the top layer's backward, its gathered MLP gradients beside every layer's weight slices;
one device: 213.97 vs 205.71 MB, +4.0%: XLA also parks the embedding's scatter gradient and one moment copy in
vacated buffers) (tests/planning/memory/test_jax_fsdp_memory.py).

XLA:CPU has no native bf16 arithmetic: it upcasts bf16 operands to float32, so on CPU the residuals
and the weights the backward dots read get float32 copies (``platform="cpu"``); XLA:GPU computes in
bf16 (``platform="gpu"``). ``estimate_jax`` models the GPU layout when a GPU is named and XLA:CPU
(what `jax_step_memory` measures on a machine without one) otherwise.

    from aegis.planning.memory.jax_profile import estimate_jax
    est = estimate_jax(profile, TrainConfig(method="lora", micro_batch_size=2, seq_len=512))
    est.framework, est.tensor_bytes, [(c.key, c.bytes) for c in est.components]
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from aegis.errors import InvalidConfigError
from aegis.models.families import get_family
from aegis.models.families.base import Family, LayerShape
from aegis.planning.hardware import cudnn_flash_attention, find_gpu
from aegis.planning.memory.components import check_lora_targets
from aegis.planning.memory.jax_state import (  # noqa: F401 - Leaf, engine_leaves, ... stay importable from here
    ADAFACTOR_MIN_DIM,
    ADAM8BIT_BLOCK,
    ADAM8BIT_MIN_SIZE,
    ENGINE_NF4_SKIP,
    NF4_BLOCK,
    NF4_BLOCK2,
    Leaf,
    _layer_stacks,
    _lora_leaves,
    _lora_local,
    _spec,
    engine_leaves,
    local_shape,
    nf4_leaf_bytes,
    optimizer_state_bytes,
)
from aegis.schema import GPU, MemoryComponent, MemoryEstimate, ModelProfile, TrainConfig
from aegis.models.shapes import causal_key_span

__all__ = ["Platform", "Leaf", "engine_leaves", "nf4_leaf_bytes", "optimizer_state_bytes", "estimate_jax", "remat_layers_for", "UNROLL_MAX_LAYERS"]

Platform = Literal["cpu", "gpu"]
"""XLA backend whose buffer layout is modelled: ``cpu`` upcasts bf16 to float32, ``gpu`` does not."""

UNROLL_MAX_LAYERS = 8
"""The engine unrolls models this shallow and scans deeper ones, NF4 bases and rematerialised
layers (`train/models/decoder.py` ``Model.scans_layers``)."""

BATCH_ARRAYS = 5
"""input_ids, targets, loss_mask, segment_ids, positions: 4 bytes per token each."""
STATE_SCALAR_BYTES = 4 + 8 + 4 + 4 + 4 + 4
"""TrainState.step (int32), rng (uint32[2]), peak_lr, clip_norm, loss_scale (float32), good_steps (int32)."""
METRIC_BYTES = 8 * 4
"""The step's eight scalar metrics (outputs that alias nothing)."""
CE_CHUNK_TOKENS = 1024
"""Tokens per chunk of chunked cross-entropy (`step.OptimizerSettings.ce_chunk_tokens` default)."""
_FP32 = 4

_DEFAULT_OVERHEAD = 1 << 30
_DYNAMIC_FRACTION = 0.04
_DYNAMIC_FLOOR = 256 << 20


def _gathered_tokens(tokens: int, fsdp: int, width: int) -> int:
    """Tokens one device computes a ``[tokens, width]`` dot output for under fsdp. The weight ``[width, hidden]``
    is split on its contracting ``embed`` axis; GSPMD moves the smaller operand: the weight (all-gathered, the
    output stays at the device's own tokens) or the batch (all-gathered over fsdp: the output is made for the
    whole fsdp group's tokens, the partial sums all-reduced, on every device)."""
    return tokens * fsdp if fsdp > 1 and tokens * fsdp < width else tokens


def _widths(cfg: TrainConfig) -> tuple[int, int, int]:
    """(compute, frozen/full param, adapter) element bytes per precision (`step.precision_dtypes`)."""
    if cfg.precision == "fp32":
        return 4, 4, 4
    if cfg.precision == "bf16":
        return 2, 2, 4  # bf16 base and compute, fp32 adapters (PEFT's autocast_adapter_dtype)
    return 2, 4, 4  # bf16_mixed / fp16_mixed: fp32 master params and adapters, 16-bit compute


@dataclass(frozen=True)
class _Shapes:
    fam: Family
    layers: list[LayerShape]
    n: int
    d: int
    heads: int
    kv: int
    head_dim: int
    inter: int
    vocab: int

    @property
    def q(self) -> int:
        return self.heads * self.head_dim

    @property
    def kvd(self) -> int:
        return self.kv * self.head_dim


def _shapes(profile: ModelProfile) -> _Shapes:
    fam = get_family(profile.config)
    c = profile.config
    layers = fam.layers(c)
    layer = layers[0]
    inter = layer.mlp_intermediate * max(1, layer.experts_per_tok) + layer.shared_expert_intermediate
    return _Shapes(fam, layers, len(layers), fam.hidden(c), fam.heads(c), fam.kv_heads(c), fam.head_dim(c), inter, fam.vocab(c))


def _layer_residual_per_token(
    sh: _Shapes, seq: int, r: int, lora_ranks: int, scanned: bool, flash: bool = False,
    cpu_unrolled_bf16: bool = False, full: bool = False,
) -> dict[str, int]:
    """Bytes per token one layer keeps for its backward pass, by kind (r: float width of the kept copies).

    From the buffers XLA keeps per layer (its memory-usage report of the compiled step): the float32
    masked attention scores per head (scanned: probabilities are recomputed from them; unrolled: a
    float32 transposed copy of the probabilities for the value gradient stays too), float32 RMSNorm
    inputs and eight more hidden-wide tensors (normed outputs, residual stream, attention output,
    projection inputs), q/k/v after rope, the six [b, s, intermediate] MLP tensors (gate, up,
    act(gate), its derivative pieces, down-proj input) plus a compute-dtype original, LoRA x @ A.
    ``flash``: cuDNN flash attention keeps no scores, only the float32 softmax statistics per head.
    """
    layer = sh.layers[0]
    # fc2(act(fc1(x))) (Phi) with frozen weights: XLA keeps two fewer intermediate-wide tensors than for the gated
    # MLP (measured, hidden 256 / MLP 768 and 1536: 20.5 B per MLP element and token scanned, 6.0 unrolled, against
    # the gated MLP's 28.7 and 17.5); full fine-tuning keeps as many as the gated MLP (46.0 vs 53.9 B per element
    # and token with a third fewer MLP weights)
    plain = sh.fam.plain_mlp and not full
    # the engine scores each query block against the keys up to its end (`aegis.models.shapes.query_blocks`)
    scores = round((1 if scanned else 2) * _FP32 * sh.heads * causal_key_span(seq)) + 2 * _FP32 * sh.heads
    terms = {
        "attention " + ("softmax stats" if flash else "scores"): _FP32 * sh.heads if flash else scores,
        "hidden": 9 * r * sh.d,
        "q/k/v": r * (sh.q + 2 * sh.kvd),
        "mlp": ((4 if plain else 6) * r + 4) * sh.inter,
        "lora": r * lora_ranks,
    }
    if cpu_unrolled_bf16:
        # XLA:CPU, bf16 compute, unrolled layers (its buffer assignment of the compiled step): the dots run on
        # float32 operands, so the grouped q, the transposed k and v and LoRA's x @ A are kept as float32;
        # five float32 hidden-wide tensors (two RMSNorm inputs, the two residual adds, the attention output),
        # plus for full fine-tuning the two bf16 normed inputs the weight-gradient dots read; the MLP keeps
        # act(gate) * up in float32 and four bf16 tensors (gate, up, and act's two derivative pieces)
        terms["hidden"] = 5 * _FP32 * sh.d + (2 * 2 * sh.d if full else 0)
        terms["q/k/v"] = _FP32 * (sh.q + 2 * sh.kvd)
        terms["mlp"] = (_FP32 + (1 if plain else 4) * 2) * sh.inter
        terms["lora"] = _FP32 * lora_ranks
    if layer.num_experts:
        terms["router"] = 3 * _FP32 * layer.num_experts
    return terms


def _vacated(transients: dict[str, int], capacity: int) -> dict[str, int]:
    """What ``transients`` (buffers made after the optimizer state's copies and freed before the update) cost beyond
    the ``capacity`` bytes of donated buffers the copies vacate: XLA places them there first, in this order."""
    out = {}
    for key, size in transients.items():
        placed = min(size, capacity)
        capacity -= placed
        out[key] = size - placed
    return out


def estimate_jax(
    profile: ModelProfile,
    cfg: TrainConfig,
    *,
    gpu: str | GPU | None = None,
    platform: Platform | None = None,
    eval_seq_len: int | None = None,
    eval_batch_size: int | None = None,
    fsdp_shards: int = 1,
    tensor_shards: int = 1,
) -> MemoryEstimate:
    """Predicted peak of the JAX engine's compiled train step for one configuration, per device.

    ``platform`` defaults to ``gpu`` when a GPU is named and ``cpu`` (XLA:CPU, what
    `jax_step_memory` measures here) otherwise. ``fsdp_shards`` / ``tensor_shards``: the run's mesh
    (`aegis.train.parallel.ParallelConfig` ``fsdp`` / ``tensor``; ``data`` ranks hold what one device holds).
    Parameters, adapters, NF4 blocks, optimizer states and gradients are split by the engine's own sharding
    rules (`aegis.models.shapes.mesh_axes_of`: an axis no mesh axis divides stays whole), the batch is the
    micro batch of one rank, and the dots GSPMD runs on a gathered batch (see `_gathered_tokens`) keep
    their outputs for the global batch.
    """
    if fsdp_shards < 1 or tensor_shards < 1:
        raise InvalidConfigError(f"fsdp_shards and tensor_shards must be >= 1, got {fsdp_shards} and {tensor_shards}")
    mesh = {"data": 1, "fsdp": fsdp_shards, "tensor": tensor_shards}
    gpu_obj = find_gpu(gpu) if isinstance(gpu, str) else gpu
    plat: Platform = platform or ("gpu" if gpu_obj is not None else "cpu")
    comp, pw, aw = _widths(cfg)
    sh = _shapes(profile)
    scanned = cfg.method == "qlora" or cfg.gradient_checkpointing or sh.n > UNROLL_MAX_LAYERS
    # XLA:CPU computes bf16 in float32: the weights the backward dots read get float32 copies, and so do
    # the scanned layers' stacked residuals (converted whole before the backward loop); unrolled layers
    # convert inside their fusions
    upcast = plat == "cpu" and comp == 2
    r = _FP32 if plat == "cpu" and scanned else comp
    b, s, accum = cfg.micro_batch_size, cfg.seq_len, cfg.gradient_accumulation_steps
    tokens = b * s
    leaves = engine_leaves(profile)
    local_params = sum(x.local_size(mesh) for x in leaves)  # one device's share (all of it on one device)
    matrices = [x for x in leaves if x.matrix]
    layer_matrix_params = sum(x.local_size(mesh) for x in matrices if x.stacked)
    head_leaf = next((x for x in leaves if x.path in ("lm_head.weight", "model.embed_tokens.weight")), None)
    head_params = head_leaf.local_size(mesh) if head_leaf is not None else sh.vocab * sh.d

    # ----- static arguments -------------------------------------------------------------------
    if cfg.method == "full":
        trainable_shapes = [x.local_shape(mesh) for x in leaves]
        trainable_stacked = [x.stacked for x in leaves]
        weights, weights_formula = local_params * pw, f"{local_params:,} params x {pw} B"
        adapters = adapter_params = 0
        trainable_params, tw = local_params, pw
    else:
        check_lora_targets(profile, cfg.lora_config)
        trainable_shapes = [_lora_local(x, sh.d, mesh) for x in _lora_leaves(profile, cfg)]
        trainable_stacked = [True] * len(trainable_shapes)
        adapter_params = sum(math.prod(x) for x in trainable_shapes)
        adapters, trainable_params, tw = adapter_params * aw, adapter_params, aw
        if cfg.method == "lora":
            weights, weights_formula = local_params * pw, f"{local_params:,} params x {pw} B (frozen)"
        else:
            quant = [x for x in leaves if x.quantizable]
            q_params = sum(x.size for x in quant)
            nf4 = sum(nf4_leaf_bytes(x, mesh) for x in quant)
            unquantised = sum(x.local_size(mesh) for x in leaves if not x.quantizable)
            weights = nf4 + unquantised * pw
            weights_formula = (
                f"NF4 {q_params:,} x (0.5 B + 1 B/64 uint8 absmax + 4 B/16,384 scales) per layer slice; "
                f"{unquantised:,} unquantised (embeddings, head, norms) x {pw} B"
            )
    optimizer, optimizer_formula = optimizer_state_bytes(cfg, trainable_shapes, tw, trainable_stacked)
    batch = accum * tokens * BATCH_ARRAYS * 4
    scalars = STATE_SCALAR_BYTES + METRIC_BYTES

    # ----- gradients --------------------------------------------------------------------------
    # the backward dots emit float32 weight gradients (XLA:GPU: the param dtype); each leaf is cast to the
    # param dtype once complete, into memory its float32 gradient frees, so the cast adds no peak. At the end
    # of backward every leaf's gradient is live, the head's (its dot gradient) once.
    grad_width = _FP32 if plat == "cpu" else tw
    accumulators = trainable_params * _FP32 if accum > 1 else 0
    gradients = trainable_params * grad_width + accumulators
    grad_formula = f"{trainable_params:,} trainable x {grad_width} B"
    if accumulators:
        grad_formula += f" + fp32 accumulators {trainable_params:,} x 4 B (accum {accum})"
    if cfg.method == "full" and sh.fam.tied(profile.config):
        # a tied embedding gets two gradients, the head dot's and the lookup's scatter-add, summed at the end
        gradients += head_params * _FP32
        grad_formula += f" + tied head's dot gradient {head_params:,} x 4 B"
    # At the loss only the gradients allocated before it are live: the scan's stacked layer gradients
    # (allocated before its backward loop; unrolled layers make theirs during their own backward) and,
    # for full fine-tuning, the embedding's float32 scatter-add gradient (zeros broadcast early, added into
    # at the end). The head's dot gradient is made after the logits' buffers are freed.
    stacked_trainable = sum(math.prod(x) for x, st in zip(trainable_shapes, trainable_stacked, strict=True) if st)
    embed_grad = head_params * grad_width if cfg.method == "full" else 0
    loss_gradients = (stacked_trainable * grad_width if scanned else 0) + embed_grad + accumulators

    # ----- activations ------------------------------------------------------------------------
    lora_ranks = 0
    if cfg.method != "full":
        lora_ranks = cfg.lora_config.rank * (len(trainable_shapes) // 2)
    # the engine's attention="auto" (any planned attention but eager) runs cuDNN flash attention where it applies;
    # a model with attention dropout trains on the explicit scores (the fused kernels take no dropout)
    flash = (
        plat == "gpu"
        and gpu_obj is not None
        and cfg.attention != "eager"
        and sh.fam.attention_dropout(profile.config) == 0.0
        and cudnn_flash_attention(
            gpu_obj.compute_capability,
            head_dim=sh.head_dim,
            soft_capped=sh.fam.attention_softcap(profile.config) is not None,
            half_precision=comp == 2,
        )
    )
    cpu_unrolled_bf16 = upcast and not scanned
    terms = _layer_residual_per_token(sh, s, r, lora_ranks, scanned, flash, cpu_unrolled_bf16, cfg.method == "full")
    per_layer = sum(terms.values())
    remat = cfg.gradient_checkpointing  # always under the scan: one layer recomputed at a time
    # Model.remat_count: the first ``remat_layers`` layers are recomputed (all without it), the others keep their
    # residuals in a second scan
    n_remat = (sh.n if cfg.remat_layers is None else min(cfg.remat_layers, sh.n)) if remat else 0
    n_saved = sh.n - n_remat
    kept_width = comp + (r if upcast else 0)  # a recomputed layer's input (and XLA:CPU's float32 copy of it)
    inputs = n_remat * tokens * kept_width * sh.d
    recompute = tokens * per_layer if n_remat else 0
    mlp_tokens = _gathered_tokens(tokens, fsdp_shards, sh.inter)
    saved = n_saved * (tokens * per_layer + (mlp_tokens - tokens) * terms["mlp"])
    activations = inputs + saved
    parts_formula = []
    if n_remat:
        parts_formula.append(f"remat: {n_remat} layer inputs x {tokens:,} tokens x {sh.d:,} x {kept_width} B")
    if n_saved:
        detail = ", ".join(f"{k} {v:,}" for k, v in terms.items())
        kept = f"{n_saved} layers x {tokens:,} tokens x {per_layer:,} B ({detail})"
        parts_formula.append(kept if not n_remat else f"{kept} kept by the other {n_saved} layers")
        if mlp_tokens != tokens:
            parts_formula.append(f"the MLP's for the gathered batch ({mlp_tokens:,} tokens)")
    act_formula = "; ".join(parts_formula)
    if not remat and cpu_unrolled_bf16 and cfg.method == "full":
        # outside the layers: the embedding lookup's bf16 output and its float32 copy (the first norm's
        # input), and the final norm's float32 output the head-gradient dot reads
        outer = tokens * (2 + 2 * _FP32) * sh.d
        activations += outer
        act_formula += f" + embedding and final-norm outputs {tokens:,} x {(2 + 2 * _FP32) * sh.d:,} B"

    # ----- logits -----------------------------------------------------------------------------
    # float32 logits (exp(logits - max) in place) and their gradient; the softmax, the one-hot target select
    # and the loss fuse into them. When the head is trained XLA:CPU emits the logits gradient a second time
    # in the transposed [vocab, tokens] layout its head-gradient dot reads (a GPU GEMM takes the transpose).
    logit_buffers = 2 + (1 if cfg.method == "full" and plat == "cpu" else 0)
    # Granite's and Cohere's scaled logits: the unscaled float32 product stays beside them (measured, XLA:CPU)
    scaled = 1 if sh.fam.logits_scaling(profile.config) else 0
    logit_buffers += scaled
    logit_width = logit_buffers * _FP32
    logit_tokens = _gathered_tokens(tokens, fsdp_shards, sh.vocab)  # the head: weight split on embed, like the MLP's
    if cfg.chunked_cross_entropy:
        # step._chunked_nll_sum: OptimizerSettings.ce_chunk_tokens per chunk under lax.map, which also
        # materialises the transposed float32 head weight it reads
        logit_width = (2 + scaled) * _FP32
        chunk = min(CE_CHUNK_TOKENS, tokens)
        logits = chunk * sh.vocab * logit_width + tokens * sh.d * _FP32 + head_params * _FP32
        logits_formula = (f"chunked: {chunk:,}-token chunk x {sh.vocab:,} vocab x {logit_width} B + fp32 hidden grads "
                          f"+ transposed fp32 head {head_params:,} x 4 B")
    else:
        logits = logit_tokens * sh.vocab * logit_width
        logits_formula = (f"{logit_tokens:,} tokens x {sh.vocab:,} vocab x {logit_width} B (fp32 logits, their gradient"
                          + (", its transposed copy" if cfg.method == "full" and plat == "cpu" else "")
                          + (", the scaled logits" if scaled else "") + ")")

    # ----- copies and backward temporaries ----------------------------------------------------
    # one layer's backward: the float32 score gradient, plus (a layer that kept its residuals) MLP and hidden
    # gradients; a recomputed layer's residuals are freed as its MLP gradients are made. The kept layers run
    # last, so their backward comes first, beside every activation; the recomputed ones' after those are freed.
    bwd_per_token = round(sh.heads * causal_key_span(s) * _FP32)
    saved_bwd_per_token = bwd_per_token + 3 * _FP32 * sh.inter + 4 * _FP32 * sh.d
    backward = tokens * saved_bwd_per_token if n_saved else 0
    remat_backward = tokens * bwd_per_token + recompute if n_remat else 0
    if not scanned:
        # unrolled layers keep their residuals in separate buffers, each freed at its last use in that layer's
        # backward: the working set of the last layer reuses the memory its own residuals free as it goes
        backward = max(0, tokens * (saved_bwd_per_token - per_layer))
    head_copy = head_params * _FP32 if upcast else 0  # XLA:CPU float32 copy of the bf16 head for its two dots
    layer_copies = layer_matrix_params * _FP32 if upcast and cfg.method != "qlora" else 0
    # A LoRA split between the two layer loops (Model.remat_count) keeps no copy of the frozen matrices: the
    # recomputed layers index the layer stack inside their checkpoint, so the scan's residual is the stack itself,
    # held once (indexed outside it, the scan stacked a [recomputed, ...] copy: 27 MB of a 125 MB float32 step at 9
    # of 10 layers)
    # XLA:CPU, unrolled layers, trained in their own dtype: each layer's matrices are sliced out of the stacks
    # before the forward pass and freed at that layer's weight gradient (measured: the slices of every layer's
    # matrices live at the loss, none once the backward has made those layers' gradients; frozen LoRA bases are
    # read in place). In the backward of the layers each slice has become a gradient the gradients term counts.
    weight_slices = layer_matrix_params * pw if plat == "cpu" and cfg.method == "full" and not scanned and not upcast else 0
    dequant = (layer_matrix_params // sh.n) * (_FP32 + comp) if cfg.method == "qlora" else 0  # one layer's dense weights

    # The non-finite skip guard keeps the old state with a select (`step.make_train_step`: ``jnp.where(skip, old,
    # new)`` per leaf): XLA copies every optimizer-state leaf before the forward pass and holds the copies until
    # the update, which writes the new state into the donated buffers and the new parameters in place (the
    # parameters are not copied). Until then the vacated buffers hold what is made after the copies and freed
    # before the update (residuals, logits, float32 weight copies; `_vacated`), so those cost only what exceeds the
    # optimizer state; the weight slices, made before the copies, do not fit there. When parameters and optimizer
    # states dominate (full fine-tuning of a small model) the update is the peak: the copies beside every gradient
    # (measured, the buffer assignment of the compiled step: one device, and per device of {fsdp: 4}).
    guard_copies = optimizer
    static = {"weights": weights, "adapters": adapters, "optimizer": optimizer, "batch": batch + scalars}
    transients = {"activations": activations, "logits": logits, "head copy": head_copy, "weight copies": layer_copies}
    moments = {
        "loss and head backward": {
            **static, "update copies": guard_copies, **_vacated(transients, guard_copies),
            "weight slices": weight_slices, "gradients": loss_gradients,
        },
        "backward of the layers": {
            **static, "update copies": guard_copies,
            **_vacated({"activations": activations if n_saved else inputs,
                        "backward temporaries": (backward if n_saved else remat_backward) + dequant,
                        "weight copies": layer_copies}, guard_copies),
            "gradients": gradients,
        },
        "backward of the recomputed layers": {
            **static, "update copies": guard_copies,
            **_vacated({"activations": inputs, "backward temporaries": remat_backward + dequant,
                        "weight copies": layer_copies}, guard_copies),
            "gradients": gradients,
        } if n_remat and n_saved else {},
        "optimizer update": {**static, "update copies": guard_copies, "gradients": gradients},
    }
    peak_name, parts = max(moments.items(), key=lambda kv: sum(kv[1].values()))
    tensor = sum(parts.values())
    labels = {
        "weights": ("Base model" + (" (NF4)" if cfg.method == "qlora" else f" ({'bf16' if pw == 2 else 'fp32'})"),
                    weights_formula, "frozen argument" if cfg.method != "full" else "trained; the update reuses its buffers"),
        "adapters": (f"LoRA adapters ({'bf16' if aw == 2 else 'fp32'})",
                     f"{adapter_params:,} params (rank {cfg.lora_config.rank}) x {aw} B", "donated: the update reuses them"),
        "optimizer": (f"Optimizer state ({cfg.optimizer})", optimizer_formula, "donated: the update reuses them"),
        "batch": ("Batch + state scalars", f"{accum} x {tokens:,} tokens x {BATCH_ARRAYS} arrays x 4 B",
                  "input_ids, targets, loss_mask, segment_ids, positions"),
        "gradients": ("Gradients", grad_formula, "all layers' gradients live at the end of backward")
        if peak_name in ("backward of the layers", "optimizer update") else
        ("Gradients", ("scanned layers' stacked gradients" if scanned and stacked_trainable else "")
         + (" + " if scanned and stacked_trainable and embed_grad else "")
         + (f"embedding scatter gradient {sh.vocab * sh.d:,} x {grad_width} B" if embed_grad else "")
         + (f" + fp32 accumulators {trainable_params:,} x 4 B" if accumulators else ""),
         "the gradients allocated before the loss"),
        "activations": ("Activations" + ((" (remat)" if not n_saved else f" (remat {n_remat} of {sh.n} layers)")
                                         if remat else ""),
                        act_formula + (f"; beyond the {guard_copies:,} B of donated buffers the optimizer state's copies "
                                       "vacate (activations, then logits and weight copies, are placed there first)"
                                       if guard_copies else ""),
                        f"micro batch {b} x seq {s:,}; {'scanned' if scanned else 'unrolled'} layers"),
        "logits": ("Logits + loss buffers" + (" (chunked CE)" if cfg.chunked_cross_entropy else ""), logits_formula,
                   f"{sh.vocab:,}-token vocabulary, float32"),
        "backward temporaries": ("Backward temporaries", f"{tokens:,} tokens x "
                                 + (f"{saved_bwd_per_token:,} B" if n_saved and peak_name == "backward of the layers"
                                    else f"{bwd_per_token:,} B"
                                    + (f" + one layer recomputed ({tokens:,} x {per_layer:,} B)" if recompute else ""))
                                 + (f" + one layer dequantised ({layer_matrix_params // sh.n:,} x {_FP32 + comp} B)" if dequant else ""),
                                 "one layer's score, MLP and hidden gradients"),
        "weight copies": ("Weight copies (fp32)", f"{layer_matrix_params:,} layer weights x 4 B", "XLA:CPU upcasts "
                          "the bf16 weights the dots read"),
        "head copy": ("Head weight copy (fp32)", f"{head_params:,} x 4 B", "XLA:CPU upcasts the bf16 head for its two dots"),
        "update copies": ("Optimizer state copies", f"{cfg.optimizer} state copied once ({optimizer:,} B)",
                          ("the skip guard's select keeps the old state: copied before the forward pass, its "
                           "donated buffers hold residuals until the update writes the new state there")),
        "weight slices": ("Per-layer weight slices", f"{layer_matrix_params:,} layer weights x {pw} B",
                          "XLA:CPU slices each unrolled layer's trained matrices out of their stacks"),
    }
    components = tuple(
        MemoryComponent(name=labels[k][0], key=k, bytes=int(v), formula=labels[k][1], note=labels[k][2])
        for k, v in parts.items()
        if v or k in ("weights", "optimizer")
    )
    overhead = gpu_obj.overhead_bytes if gpu_obj else _DEFAULT_OVERHEAD
    dynamic = int(_DYNAMIC_FRACTION * tensor + _DYNAMIC_FLOOR)
    total = tensor + overhead
    eval_tokens = (eval_batch_size or b) * (eval_seq_len or s)
    eval_seq = eval_seq_len or s
    eval_peak = (weights + adapters + optimizer + eval_tokens * (sh.vocab * 2 * _FP32 + round(sh.heads * causal_key_span(eval_seq) * (_FP32 + r))
                                                                  + 3 * r * sh.inter + 4 * r * sh.d)) + overhead
    notes = (f"JAX engine on XLA:{plat.upper()}: peak at the {peak_name}",)
    if upcast:
        notes += ("XLA:CPU upcasts bf16 to float32: residuals and weight copies are float32 (smaller on a GPU)",)
    return MemoryEstimate(
        model_id=profile.model_id, config=cfg, framework="jax", components=components, tensor_bytes=tensor,
        overhead_bytes=overhead, dynamic_margin_bytes=dynamic, total_bytes=total, low_bytes=total - dynamic,
        high_bytes=total + dynamic, eval_peak_bytes=eval_peak, peak_phase=peak_name, notes=notes,
    )


def remat_layers_for(
    profile: ModelProfile,
    cfg: TrainConfig,
    budget_bytes: int,
    **estimate_kwargs: Any,
) -> int | None:
    """The fewest layers the engine must recompute (`TrainConfig.remat_layers`, the first ones) for ``cfg``'s step
    to fit ``budget_bytes`` per device: its planned peak, tensors plus the dynamic margin (`estimate_jax` with
    ``estimate_kwargs``: ``gpu``, ``platform``, ``fsdp_shards``, ``tensor_shards``), at most the budget. 0 when the
    step fits without recomputing anything; None when even recomputing every layer does not fit. Full fine-tuning
    recomputes all layers or none (see `TrainConfig.remat_layers`): 0 or the layer count.

    Each recomputed layer keeps only its input instead of its residuals, so the peak falls as layers are added
    (the search is a bisection over that order) and the step's compute rises by that share of a forward
    (`aegis.planning.throughput.recomputed_share`): save what fits, recompute the rest."""
    n = _shapes(profile).n

    def peak(k: int) -> int:
        if cfg.method == "full":
            trial = cfg.model_copy(update={"gradient_checkpointing": k > 0, "remat_layers": None})
        else:
            trial = cfg.model_copy(update={"gradient_checkpointing": True, "remat_layers": k})
        est = estimate_jax(profile, trial, **estimate_kwargs)
        return est.tensor_bytes + est.dynamic_margin_bytes

    if peak(0) <= budget_bytes:
        return 0
    if peak(n) > budget_bytes:
        return None
    if cfg.method == "full":
        return n
    lo, hi = 0, n  # peak(lo) over the budget, peak(hi) within it
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if peak(mid) <= budget_bytes:
            hi = mid
        else:
            lo = mid
    return hi
