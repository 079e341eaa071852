"""Train and eval steps of the JAX engine: pure functions over a small :class:`TrainState` pytree.

The loss is the masked next-token cross-entropy, averaged over the real target tokens of the
whole optimizer step (all micro batches together). Optionally it is computed in sequence
chunks (``chunked_cross_entropy``): the hidden states are multiplied by the output head one
chunk at a time under ``jax.checkpoint``, so no full ``[batch, seq, vocab]`` fp32 logits exist,
not even for the backward pass.

What is trained: full fine-tuning trains ``params`` (``frozen`` is None); LoRA / QLoRA trains
the adapter pytree and passes the base (bf16, or NF4 for QLoRA) as ``frozen``. The learning
rate is ``peak_lr * schedule(step)`` (linear warmup, cosine decay to ``min_lr_ratio``) and
``peak_lr`` and the clip norm live in the state as scalars: the supervisor changes them
between windows with ``dataclasses.replace`` and nothing recompiles.

Precision modes (:func:`precision_dtypes`): ``fp32``, ``bf16`` (bf16 weights and compute; LoRA/QLoRA
adapters kept and updated in fp32 as PEFT keeps them, ``autocast_adapter_dtype=True``; Adam's moments
in fp32), ``bf16_mixed`` (fp32 master params and adapters, bf16 compute) and ``fp16_mixed`` (fp32 master
params, fp16 compute, dynamic loss scaling exactly as ``torch.amp.GradScaler``: the loss is
multiplied by ``TrainState.loss_scale`` before the backward pass, the gradients divided by it
after; a step whose gradients overflow is skipped and halves the scale, 2000 finite steps in a
row double it; :class:`LossScaleSettings`, :func:`update_loss_scale`).

Optimizers (:func:`make_optimizer`): ``adamw``, ``adamw_8bit`` and ``paged_adamw_8bit`` (block-wise
8-bit moments, :mod:`aegis.train.optim8bit`), ``sgd``, ``adafactor``. A state saved under one
configuration continues under another (an OOM fallback tier): :func:`abstract_state` is the
restore target, :func:`convert_state` carries it over.

    settings = OptimizerSettings(learning_rate=3e-4, warmup_steps=10, total_steps=200)
    tx = make_optimizer(train_config, settings)
    state = init_state(trainable, tx, settings, rng)
    step_fn = jax.jit(make_train_step(model, tx, settings), donate_argnums=0)
    state, metrics = step_fn(state, frozen, batch_arrays)   # arrays [accum, micro_batch, seq]

    # fp16_mixed: the state carries the loss scale, the step applies it
    scaler = LossScaleSettings() if precision_dtypes("fp16_mixed").loss_scaling else None
    state = init_state(trainable, tx, settings, rng, loss_scale=scaler)
    step_fn = jax.jit(make_train_step(model, tx, settings, loss_scale=scaler), donate_argnums=0)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from pydantic import Field

from aegis.errors import InvalidConfigError
from aegis.recipe import recipe
from aegis.schema import Frozen, Precision, TrainConfig

__all__ = [
    "OptimizerSettings",
    "LossScaleSettings",
    "TrainState",
    "Dtypes",
    "precision_dtypes",
    "make_optimizer",
    "init_state",
    "abstract_state",
    "convert_state",
    "update_loss_scale",
    "lr_schedule",
    "split_inputs",
    "token_loss_sum",
    "make_train_step",
    "build_train_step",
    "make_eval_step",
    "reuse_host_memory",
]

Batch = dict[str, jax.Array]


class OptimizerSettings(Frozen):
    """Optimizer and schedule settings that ``TrainConfig`` (what the planner sizes) does not hold."""

    learning_rate: float = Field(default=recipe().lr("lora"), gt=0, description="Peak learning rate (the recipe's LoRA rate).")
    warmup_steps: int = Field(default=0, ge=0, description="Linear warmup from 0 to the peak.")
    total_steps: int = Field(default=1000, ge=1, description="Steps over which the cosine decays.")
    min_lr_ratio: float = Field(default=recipe().min_lr_ratio, ge=0, le=1,
                                description="Final LR as a share of the peak (the recipe's).")
    weight_decay: float = Field(default=0.0, ge=0, description="Decoupled weight decay (matrices only).")
    b1: float = Field(default=0.9, ge=0, lt=1, description="Adam beta1 / SGD momentum.")
    b2: float = Field(default=0.999, ge=0, lt=1, description="Adam beta2.")
    eps: float = Field(default=1e-8, gt=0, description="Adam epsilon.")
    clip_norm: float = Field(default=recipe().max_grad_norm, ge=0,
                             description="Global gradient-norm clip (the recipe's); 0 disables clipping.")
    ce_chunk_tokens: int = Field(default=1024, ge=1, description="Tokens per chunk of chunked cross-entropy.")
    skip_nonfinite: bool = Field(
        default=True, description="Skip the update (keep params and optimizer state) when loss or grads are NaN/Inf."
    )


class LossScaleSettings(Frozen):
    """Dynamic loss scaling for fp16 compute; the defaults are ``torch.amp.GradScaler``'s."""

    init_scale: float = Field(default=2.0**16, gt=0, description="Loss scale of the first step.")
    growth_factor: float = Field(default=2.0, gt=1, description="Scale multiplier after growth_interval finite steps.")
    backoff_factor: float = Field(default=0.5, gt=0, lt=1, description="Scale multiplier after a step that overflowed.")
    growth_interval: int = Field(default=2000, ge=1, description="Consecutive finite steps before the scale grows.")


_MALLOPT = {"trim_threshold": -1, "mmap_max": -4, "arena_max": -8}  # glibc's M_* parameter numbers
_HOST_KEEP_BYTES = 2**31 - 1  # mallopt takes an int: freed heap memory up to 2 GB stays with the process


def reuse_host_memory() -> bool:
    """Let XLA:CPU reuse one step's temporary buffers in the next step instead of page-faulting them in again.

    XLA:CPU allocates a compiled step's temporaries as one block per execution (578 MB for the 25M bench's full
    fine-tuning step) on one of its worker threads. glibc serves a block that large with ``mmap`` in that thread's
    arena and unmaps it when the step ends, so every step faults the whole block in again: 141k page faults and
    ~250 ms of kernel time per ~1.7 s step of CPU time (torch, whose allocator keeps its blocks: ~1k faults). With
    one malloc arena, no ``mmap`` and a 2 GB trim threshold the block stays in the heap and is reused (0 faults).

    Call it before JAX starts its backends (XLA's threads bind to an arena at their first allocation; later it
    changes nothing and this does nothing). It applies only where CPU is JAX's platform (no GPU/TPU plugin
    installed, or ``JAX_PLATFORMS`` starting with ``cpu``) and the C library is glibc. Process-wide: freed host
    memory up to 2 GB is kept by the process for reuse. Returns whether the settings were applied.
    """
    import ctypes
    import importlib.util
    import os
    import platform
    import sys

    from jax._src import xla_bridge

    if sys.platform != "linux" or platform.libc_ver()[0] != "glibc" or xla_bridge.backends_are_initialized():
        return False
    platforms = (jax.config.jax_platforms or os.environ.get("JAX_PLATFORMS") or "").strip()
    if platforms:
        if platforms.split(",")[0].strip() != "cpu":
            return False
    elif any(importlib.util.find_spec(name) is not None for name in ("jax_plugins", "libtpu")):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    settings = (("arena_max", 1), ("mmap_max", 0), ("trim_threshold", _HOST_KEEP_BYTES))
    return all(mallopt(_MALLOPT[name], value) == 1 for name, value in settings)


def _scalar(value: float, dtype: Any) -> Callable[[], jax.Array]:
    return lambda: jnp.asarray(value, dtype)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TrainState:
    """Everything a step changes: a pytree of arrays (checkpointed as-is)."""

    step: jax.Array  # int32 scalar: optimizer steps taken
    trainable: Any  # params (full FT) or the LoRA pytree
    opt_state: Any
    rng: jax.Array  # uint32 [2] PRNG key
    peak_lr: jax.Array  # float32 scalar, settable between windows
    clip_norm: jax.Array  # float32 scalar, 0 = no clipping
    # float32 scalar: the dynamic loss scale (fp16_mixed); 1 and unused without loss scaling
    loss_scale: jax.Array = dataclasses.field(default_factory=_scalar(1.0, jnp.float32))
    # int32 scalar: consecutive finite steps since the scale last changed (GradScaler's growth tracker)
    good_steps: jax.Array = dataclasses.field(default_factory=_scalar(0, jnp.int32))


@dataclasses.dataclass(frozen=True)
class Dtypes:
    """Dtypes of one precision mode: model compute, base params, trainable adapters; and whether
    the mode needs dynamic loss scaling (fp16 compute). Adapters are fp32 in every mode (PEFT's
    ``autocast_adapter_dtype=True``: 16-bit adapters lose updates smaller than their rounding step)."""

    compute: Any
    params: Any
    lora: Any
    loss_scaling: bool = False


_PRECISIONS: dict[str, Dtypes] = {
    "fp32": Dtypes(jnp.float32, jnp.float32, jnp.float32),
    "bf16": Dtypes(jnp.bfloat16, jnp.bfloat16, jnp.float32),
    "bf16_mixed": Dtypes(jnp.bfloat16, jnp.float32, jnp.float32),
    "fp16_mixed": Dtypes(jnp.float16, jnp.float32, jnp.float32, loss_scaling=True),
}


def precision_dtypes(precision: Precision) -> Dtypes:
    """Map the planner's precision modes onto JAX dtypes.

    ``fp32``: everything fp32. ``bf16``: params and compute in bf16, adapters fp32 (PEFT: a bf16 base
    with fp32 adapters; the adapter math casts the input to fp32 and the sum back, see
    ``aegis.train.modeling.layers.linear``); full fine-tuning trains the bf16 params themselves (the
    optimizers keep their moments in fp32). ``bf16_mixed``: fp32 master params/adapters, bf16 compute.
    ``fp16_mixed``: fp32 master params/adapters, fp16 compute, ``loss_scaling`` on (pass
    :class:`LossScaleSettings` to :func:`init_state` and :func:`make_train_step`).
    """
    try:
        return _PRECISIONS[precision]
    except KeyError:
        raise InvalidConfigError(
            f"unknown precision {precision!r}; the JAX engine runs {', '.join(_PRECISIONS)}"
        ) from None


def _decay_mask(tree: Any) -> Any:
    return jax.tree.map(lambda x: getattr(x, "ndim", 0) >= 2, tree)


def _layer_axes(tree: Any) -> Any:
    """1 for leaves stacked over decoder layers (under a ``layers`` key), else 0."""

    def axes(path: tuple, x: Any) -> int:
        keys = {getattr(k, "key", None) for k in path}
        stacked = "layers" in keys or "dense_layers" in keys  # DeepSeek: dense_layers, then layers
        return 1 if stacked and getattr(x, "ndim", 0) >= 1 else 0

    return jax.tree_util.tree_map_with_path(axes, tree)


def _cast_floating(tree: Any, dtype: Any) -> Any:
    return jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree)


def _fp32_update(tx: optax.GradientTransformation) -> optax.GradientTransformation:
    """Keep Adam's moments and do its arithmetic in fp32 for low-precision params: in bf16, b2 = 0.999
    rounds to 1.0, so the second moment never grows and the bias correction divides by zero."""

    def up(tree: Any) -> Any:
        return _cast_floating(tree, jnp.float32)

    def init(params: Any) -> Any:
        return tx.init(up(params))

    def update(grads: Any, state: Any, params: Any = None) -> tuple[Any, Any]:
        return tx.update(up(grads), state, None if params is None else up(params))

    return optax.GradientTransformation(init, update)


def make_optimizer(train_config: TrainConfig, settings: OptimizerSettings) -> optax.GradientTransformation:
    """The optax optimizer for ``train_config.optimizer``, its learning rate injectable (set every step).

    ``adamw``: ``optax.adamw`` (torch AdamW). ``adamw_8bit`` and ``paged_adamw_8bit``: the same
    update with block-wise 8-bit moments (:func:`aegis.train.optim8bit.adamw_8bit`, bitsandbytes'
    AdamW8bit; "paged" is a CUDA unified-memory placement of the same state, which XLA does not
    have, so both names run this optimizer). ``sgd``: SGD with momentum ``b1``. ``adafactor``:
    ``optax.adafactor``. Adam's arithmetic and moments are fp32 whatever the params' dtype; weight
    decay applies to matrices only.
    """
    name = train_config.optimizer
    adam_args = dict(
        learning_rate=settings.learning_rate,
        b1=settings.b1,
        b2=settings.b2,
        eps=settings.eps,
        weight_decay=settings.weight_decay,
        mask=_decay_mask,
    )
    if name == "adamw":
        # static: inject_hyperparams would otherwise call the mask like a schedule, with the step count
        return _fp32_update(optax.inject_hyperparams(optax.adamw, static_args=("mask",))(**adam_args))
    if name in ("adamw_8bit", "paged_adamw_8bit"):
        from aegis.train.optim8bit import adamw_8bit

        static = ("mask", "block_size", "min_8bit_size", "batch_dims")
        # per-layer parameters, as bitsandbytes sees them: stacked layers are quantised slice by slice
        tx = optax.inject_hyperparams(adamw_8bit, static_args=static)(**adam_args, batch_dims=_layer_axes)
        return _fp32_update(tx)
    if name == "sgd":
        return optax.inject_hyperparams(optax.sgd)(learning_rate=settings.learning_rate, momentum=settings.b1)
    if name == "adafactor":
        return optax.inject_hyperparams(
            optax.adafactor,
            static_args=("weight_decay_mask", "min_dim_size_to_factor", "factored", "multiply_by_parameter_scale"),
        )(
            learning_rate=settings.learning_rate,
            weight_decay_rate=settings.weight_decay or None,
            weight_decay_mask=_decay_mask if settings.weight_decay else None,
        )
    raise InvalidConfigError(
        f"unknown optimizer {name!r}; the JAX engine runs adamw, adamw_8bit, paged_adamw_8bit, sgd and adafactor"
    )


def init_state(
    trainable: Any,
    tx: optax.GradientTransformation,
    settings: OptimizerSettings,
    rng: jax.Array,
    *,
    loss_scale: LossScaleSettings | None = None,
) -> TrainState:
    """A fresh state at step 0 (loss scale ``loss_scale.init_scale``, or 1 without loss scaling)."""
    return TrainState(
        step=jnp.zeros((), jnp.int32),
        trainable=trainable,
        opt_state=tx.init(trainable),
        rng=rng,
        peak_lr=jnp.asarray(settings.learning_rate, jnp.float32),
        clip_norm=jnp.asarray(settings.clip_norm, jnp.float32),
        loss_scale=jnp.asarray(loss_scale.init_scale if loss_scale else 1.0, jnp.float32),
        good_steps=jnp.zeros((), jnp.int32),
    )


def _trainable_dtype(train_config: TrainConfig) -> Any:
    dtypes = precision_dtypes(train_config.precision)
    return dtypes.params if train_config.method == "full" else dtypes.lora


def abstract_state(trainable: Any, train_config: TrainConfig, settings: OptimizerSettings) -> TrainState:
    """Shapes and dtypes (``jax.ShapeDtypeStruct`` leaves) of the state a run with ``train_config``
    keeps for a trainable of this structure (whatever its dtype): the restore target of a
    checkpoint that configuration wrote (e.g. an earlier fallback tier). Nothing is allocated."""
    dtype = _trainable_dtype(train_config)
    tx = make_optimizer(train_config, settings)
    scaler = LossScaleSettings() if precision_dtypes(train_config.precision).loss_scaling else None

    def build() -> TrainState:
        zeros = lambda x: jnp.zeros(x.shape, dtype if jnp.issubdtype(x.dtype, jnp.floating) else x.dtype)  # noqa: E731
        t = jax.tree.map(zeros, trainable)
        return init_state(t, tx, settings, jax.random.PRNGKey(0), loss_scale=scaler)

    return jax.eval_shape(build)


def _adam_part(opt_state: Any) -> tuple[int, Any] | None:
    """Index and state of the Adam transformation inside an (inject_hyperparams) optax chain state."""
    from aegis.train.optim8bit import ScaleByAdam8bitState

    inner = getattr(opt_state, "inner_state", None)
    if not isinstance(inner, tuple):
        return None
    for i, part in enumerate(inner):
        if isinstance(part, (optax.ScaleByAdamState, ScaleByAdam8bitState)):
            return i, part
    return None


def convert_state(
    state: TrainState, old_config: TrainConfig, train_config: TrainConfig, tx: optax.GradientTransformation
) -> TrainState:
    """Carry a state written under ``old_config`` (an earlier fallback tier) over to ``train_config``
    and its optimizer ``tx`` (``make_optimizer(train_config, ...)``).

    Kept: step, RNG, peak LR, clip norm, the trainable values (cast to the new precision's dtype).
    Optimizer: the same structure is kept as is; between adamw and (paged_)adamw_8bit Adam's step
    count and moments are carried over (quantised or dequantised, :mod:`aegis.train.optim8bit`);
    any other change starts fresh optimizer state. Loss scale: kept while fp16 loss scaling stays
    on, the initial scale when it starts, 1 when it stops.
    """
    from aegis.train.optim8bit import ScaleByAdam8bitState, dequantize_moments, quantize_moments

    trainable = _cast_floating(state.trainable, _trainable_dtype(train_config))
    fresh = tx.init(trainable)
    old_def, new_def = jax.tree.structure(state.opt_state), jax.tree.structure(fresh)
    old_shapes = [(x.shape, x.dtype) for x in jax.tree.leaves(state.opt_state)]
    new_shapes = [(x.shape, x.dtype) for x in jax.tree.leaves(fresh)]
    if old_def == new_def and old_shapes == new_shapes:
        opt_state = state.opt_state
    else:
        opt_state = fresh
        old, new = _adam_part(state.opt_state), _adam_part(fresh)
        if old is not None and new is not None:
            (_, old_adam), (i, new_adam) = old, new
            if isinstance(old_adam, ScaleByAdam8bitState):
                mu, nu = dequantize_moments(old_adam)
            else:
                mu, nu = old_adam.mu, old_adam.nu
            if isinstance(new_adam, ScaleByAdam8bitState):
                mu, nu = quantize_moments(mu, nu, new_adam)
                carried = new_adam._replace(count=old_adam.count, mu=mu, nu=nu)
            else:
                cast = lambda t, x: jnp.asarray(x, t.dtype)  # noqa: E731
                carried = new_adam._replace(
                    count=old_adam.count, mu=jax.tree.map(cast, new_adam.mu, mu), nu=jax.tree.map(cast, new_adam.nu, nu)
                )
            inner = list(fresh.inner_state)
            inner[i] = carried
            opt_state = fresh._replace(inner_state=tuple(inner))
            if hasattr(opt_state, "count") and hasattr(state.opt_state, "count"):
                opt_state = opt_state._replace(count=state.opt_state.count)
    scaling = precision_dtypes(train_config.precision).loss_scaling
    was_scaling = precision_dtypes(old_config.precision).loss_scaling
    if scaling and not was_scaling:
        scale, good = jnp.float32(LossScaleSettings().init_scale), jnp.int32(0)
    elif scaling:
        scale, good = state.loss_scale, state.good_steps
    else:
        scale, good = jnp.float32(1.0), jnp.int32(0)
    return dataclasses.replace(
        state,
        trainable=trainable,
        opt_state=opt_state,
        loss_scale=jnp.asarray(scale, jnp.float32),
        good_steps=jnp.asarray(good, jnp.int32),
    )


def update_loss_scale(
    scale: jax.Array, good_steps: jax.Array, finite: jax.Array, settings: LossScaleSettings
) -> tuple[jax.Array, jax.Array]:
    """``(scale, good_steps)`` after a step whose gradients were ``finite`` or not: torch's
    ``_amp_update_scale_``. Overflow: scale x backoff, counter 0. Finite: counter + 1; at
    ``growth_interval`` the scale grows by ``growth_factor`` (kept if the result is finite), counter 0."""
    scale = jnp.asarray(scale, jnp.float32)
    good = jnp.asarray(good_steps, jnp.int32) + 1
    grow = good == settings.growth_interval
    grown = scale * jnp.float32(settings.growth_factor)
    grown = jnp.where(jnp.isfinite(grown), grown, scale)
    ok_scale = jnp.where(grow, grown, scale)
    ok_good = jnp.where(grow, 0, good)
    new_scale = jnp.where(finite, ok_scale, scale * jnp.float32(settings.backoff_factor))
    new_good = jnp.where(finite, ok_good, 0).astype(jnp.int32)
    return new_scale, new_good


def lr_schedule(step: jax.Array, peak_lr: jax.Array, settings: OptimizerSettings) -> jax.Array:
    """``peak_lr`` x (linear warmup from 0 over ``warmup_steps``, then cosine to ``min_lr_ratio`` at
    ``total_steps``): ``optax.warmup_cosine_decay_schedule`` with a peak that can change at run time."""
    step = jnp.asarray(step, jnp.float32)
    warm = settings.warmup_steps
    warmup = step / warm if warm else jnp.ones(())
    span = max(settings.total_steps - warm, 1)
    progress = jnp.clip((step - warm) / span, 0.0, 1.0)
    cosine = settings.min_lr_ratio + (1 - settings.min_lr_ratio) * 0.5 * (1 + jnp.cos(jnp.pi * progress))
    return peak_lr * jnp.where(step < warm, warmup, cosine)


def split_inputs(trainable: Any, frozen: Any) -> tuple[Any, Any]:
    """``(params, lora)`` for the model: full FT when ``frozen`` is None, else LoRA over a frozen base."""
    if frozen is None:
        return trainable, None
    return frozen, trainable


@jax.custom_vjp
def nll_sum(logits: jax.Array, targets: jax.Array, mask: jax.Array) -> jax.Array:
    """``sum(mask * (logsumexp(logits) - logits[targets]))`` over float32 ``logits [..., vocab]``.

    Its gradient ``mask * (softmax - onehot)`` is written out once, in the logits' own layout, behind an
    optimization barrier: left to autodiff, XLA fuses the softmax-gradient into both matmuls of the head's
    backward pass, computing it twice, once into a transposing copy (a third of the step's non-matmul
    time on XLA:CPU for a 6k vocabulary)."""
    return _nll_fwd(logits, targets, mask)[0]


def _nll_fwd(logits: jax.Array, targets: jax.Array, mask: jax.Array) -> tuple[jax.Array, tuple]:
    logz = jax.nn.logsumexp(logits, axis=-1)
    target = jnp.take_along_axis(logits, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
    return jnp.sum((logz - target) * mask), (logits, logz, targets, mask)


def _nll_bwd(res: tuple, g: jax.Array) -> tuple[jax.Array, None, None]:
    logits, logz, targets, mask = res
    hit = jnp.arange(logits.shape[-1], dtype=targets.dtype) == targets[..., None]
    probs = jnp.exp(logits - logz[..., None])
    grad = (probs - hit.astype(logits.dtype)) * (mask * g)[..., None]
    return jax.lax.optimization_barrier(grad), None, None


nll_sum.defvjp(_nll_fwd, _nll_bwd)


def _chunked_nll_sum(model: Any, params: Any, h: jax.Array, batch: Batch, chunk: int) -> jax.Array:
    """Sum of masked NLL computed ``chunk`` tokens at a time (logits of one chunk live at once)."""
    w = model.head_weight(params)
    to_logits = getattr(model, "project", None) or getattr(model, "logits_from_hidden", None)
    d = h.shape[-1]
    flat_h = h.reshape(-1, d)
    flat_t = batch["targets"].reshape(-1)
    flat_m = batch["loss_mask"].reshape(-1).astype(jnp.float32)
    n = flat_h.shape[0]
    chunk = min(chunk, n)
    pad = (-n) % chunk
    if pad:
        flat_h = jnp.concatenate([flat_h, jnp.zeros((pad, d), flat_h.dtype)])
        flat_t = jnp.concatenate([flat_t, jnp.zeros((pad,), flat_t.dtype)])
        flat_m = jnp.concatenate([flat_m, jnp.zeros((pad,), flat_m.dtype)])
    k = (n + pad) // chunk

    @jax.checkpoint
    def one(args: tuple[jax.Array, jax.Array, jax.Array]) -> jax.Array:
        hc, tc, mc = args
        logits = to_logits(hc, w) if to_logits is not None else hc @ w.T
        return nll_sum(logits.astype(jnp.float32), tc, mc)

    parts = jax.lax.map(one, (flat_h.reshape(k, chunk, d), flat_t.reshape(k, chunk), flat_m.reshape(k, chunk)))
    return jnp.sum(parts)


def token_loss_sum(
    model: Any,
    trainable: Any,
    frozen: Any,
    batch: Batch,
    *,
    chunked: bool = False,
    chunk_tokens: int = 1024,
    rng: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """``(sum of masked next-token NLL, number of target tokens)`` for one ``[b, s]`` batch.

    ``rng`` is the training step's randomness: LoRA dropout, Phi-MoE's sampled routing (None: eval and
    forensics are deterministic).
    """
    params, lora = split_inputs(trainable, frozen)
    kwargs: dict[str, Any] = dict(positions=batch["positions"], segment_ids=batch["segment_ids"], lora=lora)
    if rng is not None:
        kwargs["rng"] = rng
    mask = batch["loss_mask"].astype(jnp.float32)
    if chunked:
        h = model.hidden(params, batch["input_ids"], **kwargs)
        total = _chunked_nll_sum(model, params, h, batch, chunk_tokens)
    else:
        logits = model.apply(params, batch["input_ids"], **kwargs).astype(jnp.float32)
        total = nll_sum(logits, batch["targets"], mask)
    return total, jnp.sum(mask)


def _all_finite(tree: Any) -> jax.Array:
    leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact)]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.array(True)


def _constrain(tree: Any, shardings: Any) -> Any:
    return tree if shardings is None else jax.lax.with_sharding_constraint(tree, shardings)


def make_train_step(
    model: Any,
    tx: optax.GradientTransformation,
    settings: OptimizerSettings,
    *,
    chunked_cross_entropy: bool = False,
    loss_scale: LossScaleSettings | None = None,
    grad_shardings: Any = None,
) -> Callable[[TrainState, Any, Batch], tuple[TrainState, dict[str, jax.Array]]]:
    """The (unjitted) train step ``(state, frozen, batch) -> (state, metrics)``.

    ``grad_shardings`` (shardings shaped like the trainable tree, :mod:`aegis.train.sharding`): the gradient
    accumulator and the gradients are constrained to them, so a sharded run keeps its gradients sharded as its params.

    ``batch`` arrays are ``[accum, micro_batch, seq]``; gradients are summed over the micro
    batches with ``lax.scan`` (in float32) and divided by the step's total target tokens.

    With ``loss_scale`` (fp16 compute) each micro batch differentiates its token-loss sum times
    ``state.loss_scale / step tokens`` (the scaled mean loss, as GradScaler scales a mean loss), the
    summed gradients are divided by the scale, a step whose gradients are not finite is always
    skipped, and the scale and its counter move as :func:`update_loss_scale` says.

    Metrics: loss, grad_norm (before clipping), lr, tokens, loss_finite, grads_finite,
    params_finite, skipped, loss_scale (the scale this step used; 1 without loss scaling) and
    overflow (loss scaling on, loss finite, gradients not finite at a scale above 1: the
    scaler's routine overflow, handled by skipping and backing off, not a divergence).
    """

    def loss_sum(trainable: Any, frozen: Any, mb: Batch, rng: jax.Array, step: jax.Array) -> tuple[jax.Array, jax.Array]:
        # a model with ``at_step`` changes with the step number (BitNet's quantisation warm-up, aegis.forge)
        m = model.at_step(step) if hasattr(model, "at_step") else model
        return token_loss_sum(
            m, trainable, frozen, mb, chunked=chunked_cross_entropy, chunk_tokens=settings.ce_chunk_tokens, rng=rng
        )

    def scaled_loss_sum(
        trainable: Any, frozen: Any, mb: Batch, rng: jax.Array, factor: jax.Array, step: jax.Array
    ) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
        total, count = loss_sum(trainable, frozen, mb, rng, step)
        return total * factor, (total, count)

    grad_fn = jax.grad(scaled_loss_sum, has_aux=True)

    def step(state: TrainState, frozen: Any, batch: Batch) -> tuple[TrainState, dict[str, jax.Array]]:
        accum = batch["input_ids"].shape[0]
        rng, step_rng = jax.random.split(state.rng)
        if loss_scale is not None:  # differentiate scale x mean loss: the step's token count is known up front
            scale = state.loss_scale
            factor = scale / jnp.maximum(jnp.sum(batch["loss_mask"].astype(jnp.float32)), 1.0)
        else:
            scale = jnp.ones((), jnp.float32)
            factor = jnp.ones((), jnp.float32)
        if accum == 1:
            grads, (total, count) = grad_fn(
                state.trainable, frozen, jax.tree.map(lambda x: x[0], batch), step_rng, factor, state.step
            )
        else:

            def body(carry: tuple, xs: tuple[Batch, jax.Array]) -> tuple[tuple, None]:
                g_acc, t_acc, c_acc = carry
                mb, i = xs
                g, (t, c) = grad_fn(state.trainable, frozen, mb, jax.random.fold_in(step_rng, i), factor, state.step)
                g_acc = jax.tree.map(lambda a, b: a + b.astype(jnp.float32), g_acc, g)
                return (g_acc, t_acc + t, c_acc + c), None

            zeros = _constrain(jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), state.trainable), grad_shardings)
            init = (zeros, jnp.zeros(()), jnp.zeros(()))
            (grads, total, count), _ = jax.lax.scan(body, init, (batch, jnp.arange(accum)))
        denom = jnp.maximum(count, 1.0)
        loss = total / denom
        if loss_scale is not None:
            grads = jax.tree.map(lambda g, p: (g.astype(jnp.float32) / scale).astype(p.dtype), grads, state.trainable)
        else:
            grads = jax.tree.map(lambda g, p: (g / denom).astype(p.dtype), grads, state.trainable)
        grads = _constrain(grads, grad_shardings)
        grad_norm = optax.global_norm(grads)
        clip = state.clip_norm
        clip_scale = jnp.where((clip > 0) & (grad_norm > clip), clip / jnp.maximum(grad_norm, 1e-12), 1.0)
        grads = jax.tree.map(lambda g: (g * clip_scale).astype(g.dtype), grads)

        lr = lr_schedule(state.step, state.peak_lr, settings)
        hp = state.opt_state.hyperparams
        opt_state = state.opt_state._replace(
            hyperparams={**hp, "learning_rate": lr.astype(jnp.asarray(hp["learning_rate"]).dtype)}
        )
        updates, new_opt = tx.update(grads, opt_state, state.trainable)
        new_trainable = optax.apply_updates(state.trainable, updates)

        loss_finite = jnp.isfinite(loss)
        grads_finite = jnp.isfinite(grad_norm)
        skip = jnp.logical_not(loss_finite & grads_finite) if settings.skip_nonfinite else jnp.array(False)
        if loss_scale is not None:
            skip = skip | jnp.logical_not(grads_finite)
            new_scale, new_good = update_loss_scale(scale, state.good_steps, grads_finite, loss_scale)
            overflow = loss_finite & jnp.logical_not(grads_finite) & (scale > 1.0)
        else:
            new_scale, new_good, overflow = state.loss_scale, state.good_steps, jnp.array(False)
        keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(skip, b, a), new, old)  # noqa: E731
        new_trainable = keep(new_trainable, state.trainable)
        new_opt = keep(new_opt, opt_state)
        new_state = dataclasses.replace(
            state,
            step=state.step + 1,
            trainable=new_trainable,
            opt_state=new_opt,
            rng=rng,
            loss_scale=new_scale,
            good_steps=new_good,
        )
        metrics = {
            "loss": loss,
            "grad_norm": grad_norm,
            "lr": lr,
            "tokens": count,
            "loss_finite": loss_finite,
            "grads_finite": grads_finite,
            "params_finite": _all_finite(new_trainable),
            "skipped": skip,
            "loss_scale": scale,
            "overflow": overflow,
        }
        return new_state, metrics

    return step


def build_train_step(
    model: Any,
    train_config: TrainConfig,
    settings: OptimizerSettings,
    *,
    state_shardings: Any = None,
    metrics_sharding: Any = None,
    shard_grads: bool = False,
) -> Callable[[TrainState, Any, Batch], tuple[TrainState, dict[str, jax.Array]]]:
    """The jitted train step of a run: the one builder the :class:`~aegis.train.loop.Trainer` and
    :mod:`aegis.train.benchmark` use, so a benchmark measures the step a run takes.

    The optimizer (:func:`make_optimizer`), loss scaling (fp16) and chunked cross-entropy follow
    ``train_config``; the state is donated (its buffers are reused for the new state). With
    ``state_shardings`` (the state's shardings, :mod:`aegis.train.sharding`) the new state comes out
    sharded as it went in and the metrics as ``metrics_sharding``; ``shard_grads`` keeps the gradients
    sharded as the trainable params (an fsdp or tensor mesh).
    """
    scaler = LossScaleSettings() if precision_dtypes(train_config.precision).loss_scaling else None
    tx = make_optimizer(train_config, settings)
    grad_shardings = state_shardings.trainable if shard_grads and state_shardings is not None else None
    step = make_train_step(
        model,
        tx,
        settings,
        chunked_cross_entropy=train_config.chunked_cross_entropy,
        loss_scale=scaler,
        grad_shardings=grad_shardings,
    )
    if state_shardings is None:
        return jax.jit(step, donate_argnums=0)
    return jax.jit(step, donate_argnums=0, out_shardings=(state_shardings, metrics_sharding))


def make_eval_step(
    model: Any, *, chunked_cross_entropy: bool = False, chunk_tokens: int = 1024
) -> Callable[[Any, Any, Batch], tuple[jax.Array, jax.Array]]:
    """The (unjitted) eval step ``(trainable, frozen, batch[b, s]) -> (loss sum, target tokens)``."""

    def step(trainable: Any, frozen: Any, batch: Batch) -> tuple[jax.Array, jax.Array]:
        return token_loss_sum(model, trainable, frozen, batch, chunked=chunked_cross_entropy, chunk_tokens=chunk_tokens)

    return step
