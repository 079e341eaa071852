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

    settings = OptimizerSettings(learning_rate=3e-4, warmup_steps=10, total_steps=200)
    tx = make_optimizer(train_config, settings)
    state = init_state(trainable, tx, settings, rng)
    step_fn = jax.jit(make_train_step(model, tx, settings, lora=True), donate_argnums=0)
    state, metrics = step_fn(state, frozen, batch_arrays)   # arrays [accum, micro_batch, seq]
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
from aegis.schema import Frozen, Precision, TrainConfig

__all__ = [
    "OptimizerSettings",
    "TrainState",
    "Dtypes",
    "precision_dtypes",
    "make_optimizer",
    "init_state",
    "lr_schedule",
    "split_inputs",
    "token_loss_sum",
    "make_train_step",
    "make_eval_step",
]

Batch = dict[str, jax.Array]


class OptimizerSettings(Frozen):
    """Optimizer and schedule settings that ``TrainConfig`` (what the planner sizes) does not hold."""

    learning_rate: float = Field(default=2e-4, gt=0, description="Peak learning rate.")
    warmup_steps: int = Field(default=0, ge=0, description="Linear warmup from 0 to the peak.")
    total_steps: int = Field(default=1000, ge=1, description="Steps over which the cosine decays.")
    min_lr_ratio: float = Field(default=0.1, ge=0, le=1, description="Final LR as a share of the peak.")
    weight_decay: float = Field(default=0.0, ge=0, description="Decoupled weight decay (matrices only).")
    b1: float = Field(default=0.9, ge=0, lt=1, description="Adam beta1 / SGD momentum.")
    b2: float = Field(default=0.999, ge=0, lt=1, description="Adam beta2.")
    eps: float = Field(default=1e-8, gt=0, description="Adam epsilon.")
    clip_norm: float = Field(default=1.0, ge=0, description="Global gradient-norm clip; 0 disables clipping.")
    ce_chunk_tokens: int = Field(default=1024, ge=1, description="Tokens per chunk of chunked cross-entropy.")
    skip_nonfinite: bool = Field(
        default=True, description="Skip the update (keep params and optimizer state) when loss or grads are NaN/Inf."
    )


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


@dataclasses.dataclass(frozen=True)
class Dtypes:
    """Dtypes of one precision mode: model compute, base params, trainable adapters."""

    compute: Any
    params: Any
    lora: Any


def precision_dtypes(precision: Precision) -> Dtypes:
    """Map the planner's precision modes onto JAX dtypes."""
    if precision == "fp32":
        return Dtypes(jnp.float32, jnp.float32, jnp.float32)
    if precision == "bf16":
        return Dtypes(jnp.bfloat16, jnp.bfloat16, jnp.bfloat16)
    if precision == "bf16_mixed":
        return Dtypes(jnp.bfloat16, jnp.float32, jnp.float32)
    raise InvalidConfigError(
        f"precision {precision!r} is not supported by the JAX engine (fp16 needs loss scaling, which it does "
        "not implement); use bf16_mixed, bf16 or fp32"
    )


def _decay_mask(tree: Any) -> Any:
    return jax.tree.map(lambda x: getattr(x, "ndim", 0) >= 2, tree)


def _fp32_update(tx: optax.GradientTransformation) -> optax.GradientTransformation:
    """Keep Adam's moments and do its arithmetic in fp32 for low-precision params: in bf16, b2 = 0.999
    rounds to 1.0, so the second moment never grows and the bias correction divides by zero."""

    def up(tree: Any) -> Any:
        return jax.tree.map(lambda x: x.astype(jnp.float32) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree)

    def init(params: Any) -> Any:
        return tx.init(up(params))

    def update(grads: Any, state: Any, params: Any = None) -> tuple[Any, Any]:
        return tx.update(up(grads), state, None if params is None else up(params))

    return optax.GradientTransformation(init, update)


def make_optimizer(train_config: TrainConfig, settings: OptimizerSettings) -> optax.GradientTransformation:
    """The optax optimizer for ``train_config.optimizer``, its learning rate injectable (set every step)."""
    name = train_config.optimizer
    if name == "adamw":
        # static: inject_hyperparams would otherwise call the mask like a schedule, with the step count
        return _fp32_update(optax.inject_hyperparams(optax.adamw, static_args=("mask",))(
            learning_rate=settings.learning_rate,
            b1=settings.b1,
            b2=settings.b2,
            eps=settings.eps,
            weight_decay=settings.weight_decay,
            mask=_decay_mask,
        ))
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
        f"optimizer {name!r} has no faithful optax implementation (optax has no 8-bit-state Adam); "
        "use adamw, adafactor or sgd with the JAX engine"
    )


def init_state(trainable: Any, tx: optax.GradientTransformation, settings: OptimizerSettings, rng: jax.Array) -> TrainState:
    """A fresh state at step 0."""
    return TrainState(
        step=jnp.zeros((), jnp.int32),
        trainable=trainable,
        opt_state=tx.init(trainable),
        rng=rng,
        peak_lr=jnp.asarray(settings.learning_rate, jnp.float32),
        clip_norm=jnp.asarray(settings.clip_norm, jnp.float32),
    )


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


def _target_logit(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """``logits[..., targets]`` as a one-hot reduction: its gradient is an elementwise select that fuses
    with the softmax gradient, where ``take_along_axis``'s is a scatter-add over the logits."""
    hit = jnp.arange(logits.shape[-1], dtype=targets.dtype) == targets[..., None]
    return jnp.sum(jnp.where(hit, logits, 0.0), axis=-1)


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
        logits = to_logits(hc, w) if to_logits is not None else hc @ w
        logits = logits.astype(jnp.float32)
        logz = jax.nn.logsumexp(logits, axis=-1)
        return jnp.sum((logz - _target_logit(logits, tc)) * mc)

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

    ``rng`` drives LoRA dropout (none when None: eval and forensics are deterministic).
    """
    params, lora = split_inputs(trainable, frozen)
    kwargs: dict[str, Any] = dict(positions=batch["positions"], segment_ids=batch["segment_ids"], lora=lora)
    if lora is not None and rng is not None:
        kwargs["lora_rng"] = rng
    mask = batch["loss_mask"].astype(jnp.float32)
    if chunked:
        h = model.hidden(params, batch["input_ids"], **kwargs)
        total = _chunked_nll_sum(model, params, h, batch, chunk_tokens)
    else:
        logits = model.apply(params, batch["input_ids"], **kwargs).astype(jnp.float32)
        logz = jax.nn.logsumexp(logits, axis=-1)
        total = jnp.sum((logz - _target_logit(logits, batch["targets"])) * mask)
    return total, jnp.sum(mask)


def _all_finite(tree: Any) -> jax.Array:
    leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact)]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.array(True)


def make_train_step(
    model: Any,
    tx: optax.GradientTransformation,
    settings: OptimizerSettings,
    *,
    chunked_cross_entropy: bool = False,
) -> Callable[[TrainState, Any, Batch], tuple[TrainState, dict[str, jax.Array]]]:
    """The (unjitted) train step ``(state, frozen, batch) -> (state, metrics)``.

    ``batch`` arrays are ``[accum, micro_batch, seq]``; gradients are summed over the micro
    batches with ``lax.scan`` (in float32) and divided by the step's total target tokens.
    Metrics: loss, grad_norm (before clipping), lr, tokens, loss_finite, grads_finite,
    params_finite, skipped.
    """

    def loss_sum(trainable: Any, frozen: Any, mb: Batch, rng: jax.Array) -> tuple[jax.Array, jax.Array]:
        return token_loss_sum(
            model, trainable, frozen, mb, chunked=chunked_cross_entropy, chunk_tokens=settings.ce_chunk_tokens, rng=rng
        )

    grad_fn = jax.value_and_grad(loss_sum, has_aux=True)

    def step(state: TrainState, frozen: Any, batch: Batch) -> tuple[TrainState, dict[str, jax.Array]]:
        accum = batch["input_ids"].shape[0]
        rng, step_rng = jax.random.split(state.rng)
        if accum == 1:
            (total, count), grads = grad_fn(state.trainable, frozen, jax.tree.map(lambda x: x[0], batch), step_rng)
        else:

            def body(carry: tuple, xs: tuple[Batch, jax.Array]) -> tuple[tuple, None]:
                g_acc, t_acc, c_acc = carry
                mb, i = xs
                (t, c), g = grad_fn(state.trainable, frozen, mb, jax.random.fold_in(step_rng, i))
                g_acc = jax.tree.map(lambda a, b: a + b.astype(jnp.float32), g_acc, g)
                return (g_acc, t_acc + t, c_acc + c), None

            zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), state.trainable)
            init = (zeros, jnp.zeros(()), jnp.zeros(()))
            (grads, total, count), _ = jax.lax.scan(body, init, (batch, jnp.arange(accum)))
        denom = jnp.maximum(count, 1.0)
        loss = total / denom
        grads = jax.tree.map(lambda g, p: (g / denom).astype(p.dtype), grads, state.trainable)
        grad_norm = optax.global_norm(grads)
        clip = state.clip_norm
        scale = jnp.where((clip > 0) & (grad_norm > clip), clip / jnp.maximum(grad_norm, 1e-12), 1.0)
        grads = jax.tree.map(lambda g: (g * scale).astype(g.dtype), grads)

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
        keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(skip, b, a), new, old)  # noqa: E731
        new_trainable = keep(new_trainable, state.trainable)
        new_opt = keep(new_opt, opt_state)
        new_state = dataclasses.replace(
            state, step=state.step + 1, trainable=new_trainable, opt_state=new_opt, rng=rng
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
        }
        return new_state, metrics

    return step


def make_eval_step(
    model: Any, *, chunked_cross_entropy: bool = False, chunk_tokens: int = 1024
) -> Callable[[Any, Any, Batch], tuple[jax.Array, jax.Array]]:
    """The (unjitted) eval step ``(trainable, frozen, batch[b, s]) -> (loss sum, target tokens)``."""

    def step(trainable: Any, frozen: Any, batch: Batch) -> tuple[jax.Array, jax.Array]:
        return token_loss_sum(model, trainable, frozen, batch, chunked=chunked_cross_entropy, chunk_tokens=chunk_tokens)

    return step
