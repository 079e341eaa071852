"""Muon x Grokfast with QK-clip: the forge's optimizer, as optax transformations over the engine's params.

    from aegis.forge.optim import muon_grokfast, qk_clip, preset
    tx = muon_grokfast("pretrain")                # grokfast_ema -> Muon (matrices) | AdamW (the rest)
    state = tx.init(params)
    updates, state = tx.update(grads, state, params)
    params = optax.apply_updates(params, updates)
    params = qk_clip(params, max_logits, tau=preset("pretrain").qk_clip_tau, spec=model.spec)   # MuonClip

Pieces, each checked against its reference in ``tests/forge/test_optim.py``:

- :func:`grokfast_ema` -- Grokfast's ``gradfilter_ema`` (Lee et al., 2024): ``ema <- alpha*ema + (1-alpha)*g``
  (the first gradient seeds the average), update ``g + lamb*ema``.
- :func:`scale_by_muon` -- Muon (Jordan et al., 2024; Liu et al., "Muon is Scalable", 2025): momentum
  (Nesterov by default) orthogonalised by the quintic Newton-Schulz iteration, batched over leading axes (the
  engine stacks decoder layers on axis 0), scaled ``0.2*sqrt(max(m, n))`` so AdamW's learning rate fits it
  (Moonlight's consistent RMS) or by ``sqrt(max(1, out/in))``.
- :func:`muon` -- Muon for matrices, AdamW for embeddings, the LM head, norms and biases, as Muon is used.
- :func:`qk_clip` -- Kimi K2's MuonClip: after a step, each head whose largest pre-softmax logit exceeds
  ``tau`` has its query and key projections rescaled so that logit becomes ``tau`` (``sqrt(tau/max)`` each;
  with grouped keys the shared key takes the group's smallest factor and each query the rest).
- :func:`muon_grokfast` -- the seed's three settings (:data:`PRESETS`: pretrain, bake, rl).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Literal, NamedTuple

import jax
import jax.numpy as jnp
import optax

__all__ = [
    "GrokfastState", "MuonState", "MuonGrokfastPreset", "PRESETS", "NS_COEFFS", "grokfast_ema", "newton_schulz",
    "scale_by_muon", "muon", "muon_labels", "muon_grokfast", "preset", "qk_clip", "qk_clip_heads",
    "max_attention_logits",
]

NS_COEFFS = (3.4445, -4.7750, 2.0315)
"""Keller Jordan's quintic Newton-Schulz coefficients (optax.contrib's default)."""


# ----- Grokfast ---------------------------------------------------------------------------------------------


class GrokfastState(NamedTuple):
    count: jax.Array
    ema: Any


def grokfast_ema(alpha: float = 0.98, lamb: float = 2.0) -> optax.GradientTransformation:
    """Grokfast-EMA: amplify the slow component of the gradients.

    ``ema <- alpha*ema + (1-alpha)*g`` (the first call starts from ``ema = g``, as ``gradfilter_ema`` does),
    returns ``g + lamb*ema``. Chain it before the optimizer that consumes gradients.
    """
    if not 0.0 <= alpha < 1.0:
        raise ValueError(f"grokfast alpha must be in [0, 1), got {alpha}")

    def init_fn(params: Any) -> GrokfastState:
        return GrokfastState(count=jnp.zeros([], jnp.int32), ema=jax.tree.map(jnp.zeros_like, params))

    def update_fn(updates: Any, state: GrokfastState, params: Any = None) -> tuple[Any, GrokfastState]:
        del params
        first = state.count == 0
        ema = jax.tree.map(lambda e, g: jnp.where(first, g, alpha * e + (1.0 - alpha) * g), state.ema, updates)
        out = jax.tree.map(lambda g, e: g + lamb * e, updates, ema)
        return out, GrokfastState(count=optax.safe_increment(state.count), ema=ema)

    return optax.GradientTransformation(init_fn, update_fn)


# ----- Muon -------------------------------------------------------------------------------------------------


def newton_schulz(x: jax.Array, steps: int = 5, coeffs: tuple[float, float, float] = NS_COEFFS,
                  eps: float = 1e-8) -> jax.Array:
    """Approximately orthogonalise the last two axes of ``x`` (``U S V^T -> U S' V^T``, ``S'`` near 1).

    ``X <- a X + (b A + c A^2) X`` with ``A = X X^T`` after scaling ``X`` to unit Frobenius norm; a tall matrix
    is iterated transposed (the map commutes with transposition)."""
    a, b, c = coeffs
    tall = x.shape[-2] > x.shape[-1]
    if tall:
        x = jnp.swapaxes(x, -1, -2)
    x = x / (jnp.linalg.norm(x, axis=(-2, -1), keepdims=True) + eps)
    for _ in range(steps):
        A = x @ jnp.swapaxes(x, -1, -2)
        x = a * x + (b * A + c * A @ A) @ x
    return jnp.swapaxes(x, -1, -2) if tall else x


class MuonState(NamedTuple):
    count: jax.Array
    mu: Any


def scale_by_muon(beta: float = 0.95, *, nesterov: bool = True, ns_steps: int = 5, eps: float = 1e-8,
                  consistent_rms: float | None = 0.2) -> optax.GradientTransformation:
    """Muon's direction for matrices (leaves of 2+ axes; leading axes are a batch, e.g. stacked layers).

    ``mu <- beta*mu + (1-beta)*g``; the direction is ``NS(beta*mu_hat' + (1-beta)*g_hat)`` (Nesterov, the
    bias-corrected terms) or ``NS(mu_hat)``; scaled by ``consistent_rms*sqrt(max(m, n))`` or, with None, by
    ``sqrt(max(1, m/n))`` for an ``[out=m, in=n]`` weight."""

    def init_fn(params: Any) -> MuonState:
        return MuonState(count=jnp.zeros([], jnp.int32), mu=jax.tree.map(jnp.zeros_like, params))

    def update_fn(updates: Any, state: MuonState, params: Any = None) -> tuple[Any, MuonState]:
        del params
        mu = jax.tree.map(lambda m, g: beta * m + (1.0 - beta) * g, state.mu, updates)
        count = optax.safe_increment(state.count)
        if nesterov:
            c1 = 1.0 - beta ** (count + 1).astype(jnp.float32)
            c0 = 1.0 - beta ** count.astype(jnp.float32)
            mu_hat = jax.tree.map(lambda m, g: beta * m / c1 + (1.0 - beta) * g / c0, mu, updates)
        else:
            c0 = 1.0 - beta ** count.astype(jnp.float32)
            mu_hat = jax.tree.map(lambda m: m / c0, mu)

        def direction(m: jax.Array) -> jax.Array:
            o = newton_schulz(m, ns_steps, eps=eps)
            rows, cols = m.shape[-2], m.shape[-1]
            if consistent_rms is not None:
                return o * (consistent_rms * max(rows, cols) ** 0.5)
            return o * max(1.0, rows / cols) ** 0.5

        return jax.tree.map(direction, mu_hat), MuonState(count=count, mu=mu)

    return optax.GradientTransformation(init_fn, update_fn)


def muon_labels(params: Any) -> Any:
    """'muon' for weight matrices (2+ axes; the engine stacks layers on axis 0) outside the embeddings, the LM head,
    norms and biases; 'adam' for the rest."""

    def label(path: tuple, leaf: Any) -> str:
        names = "/".join(str(getattr(k, "key", getattr(k, "name", k))) for k in path)
        skip = any(s in names for s in ("embed", "lm_head", "wte", "wpe", "norm", "bias"))
        return "muon" if getattr(leaf, "ndim", 0) >= 2 and not skip else "adam"

    return jax.tree_util.tree_map_with_path(label, params)


def muon(
    learning_rate: float | optax.Schedule,
    *,
    beta: float = 0.95,
    nesterov: bool = True,
    ns_steps: int = 5,
    weight_decay: float = 0.0,
    consistent_rms: float | None = 0.2,
    adam_b1: float = 0.9,
    adam_b2: float = 0.999,
    eps: float = 1e-8,
    labels: Callable[[Any], Any] | None = None,
) -> optax.GradientTransformation:
    """Muon for matrices (:func:`muon_labels`, or ``labels``), AdamW (same learning rate) for the rest."""
    muon_tx = optax.chain(
        scale_by_muon(beta, nesterov=nesterov, ns_steps=ns_steps, eps=eps, consistent_rms=consistent_rms),
        optax.add_decayed_weights(weight_decay),
        optax.scale_by_learning_rate(learning_rate),
    )
    adam_tx = optax.adamw(learning_rate, b1=adam_b1, b2=adam_b2, eps=eps, weight_decay=weight_decay,
                          nesterov=nesterov)
    return optax.multi_transform({"muon": muon_tx, "adam": adam_tx}, labels or muon_labels)


# ----- QK-clip (MuonClip) -----------------------------------------------------------------------------------


def max_attention_logits(q: jax.Array, k: jax.Array, *, causal: bool = True, scale: float | None = None) -> jax.Array:
    """The largest pre-softmax logit of each head: ``q [b, s, H, d]``, ``k [b, s, K, d]`` (K divides H) -> ``[H]``."""
    h, kv, d = q.shape[2], k.shape[2], q.shape[3]
    k = jnp.repeat(k, h // kv, axis=2)
    logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) * (d ** -0.5 if scale is None else scale)
    if causal:
        s = q.shape[1]
        logits = jnp.where(jnp.tril(jnp.ones((s, s), bool)), logits, -jnp.inf)
    return logits.max(axis=(0, 2, 3))


def qk_clip_heads(max_logits: jax.Array, tau: float, num_kv_heads: int) -> tuple[jax.Array, jax.Array]:
    """Per-head factors ``(query [H], key [K])`` whose product is ``gamma_h = min(1, tau/max_h)`` for each head.

    One head per key (MHA): ``sqrt(gamma)`` each, as Kimi K2. Grouped keys: the key takes
    ``sqrt(min gamma)`` over its group, each query ``gamma_h / that``, so unclipped heads keep their logits."""
    gamma = jnp.minimum(1.0, tau / jnp.maximum(max_logits, 1e-30))
    group = gamma.shape[-1] // num_kv_heads
    k_scale = jnp.sqrt(gamma.reshape(*gamma.shape[:-1], num_kv_heads, group).min(axis=-1))
    q_scale = gamma / jnp.repeat(k_scale, group, axis=-1)
    return q_scale, k_scale


def qk_clip(params: dict[str, Any], max_logits: jax.Array, tau: float, *, num_heads: int, num_kv_heads: int,
            head_dim: int, attn_path: tuple[str, ...] = ("model", "layers", "self_attn")) -> dict[str, Any]:
    """Rescale ``q_proj`` / ``k_proj`` (weights ``[L, H*d, in]`` in HF layout, biases too) of the heads whose
    largest logit ``max_logits [L, H]`` exceeds ``tau``; the other heads' logits are unchanged."""
    q_s, k_s = qk_clip_heads(jnp.asarray(max_logits, jnp.float32), tau, num_kv_heads)
    q_rows = jnp.repeat(q_s, head_dim, axis=-1)  # [L, H*d]
    k_rows = jnp.repeat(k_s, head_dim, axis=-1)
    out = jax.tree.map(lambda x: x, params)
    node = out
    for key in attn_path:
        node = node[key]
    for proj, rows in (("q_proj", q_rows), ("k_proj", k_rows)):
        p = dict(node[proj])
        p["weight"] = (p["weight"] * rows[..., None].astype(p["weight"].dtype))
        if "bias" in p:
            p["bias"] = p["bias"] * rows.astype(p["bias"].dtype)
        node[proj] = p
    return out


# ----- the seed's settings ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class MuonGrokfastPreset:
    """One phase's optimizer setting (seed: Phase 1 pretrain, Phase 3 baking, Phase 3 RL)."""

    lr: float
    grokfast_lambda: float
    qk_clip_tau: float
    kl_coefficient: float
    grokfast_alpha: float = 0.98


PRESETS: dict[str, MuonGrokfastPreset] = {
    "pretrain": MuonGrokfastPreset(lr=1e-3, grokfast_lambda=0.3, qk_clip_tau=30.0, kl_coefficient=0.0),
    "bake": MuonGrokfastPreset(lr=1e-4, grokfast_lambda=0.2, qk_clip_tau=30.0, kl_coefficient=0.0),
    "rl": MuonGrokfastPreset(lr=5e-4, grokfast_lambda=0.1, qk_clip_tau=25.0, kl_coefficient=0.1),
}


def preset(name: str) -> MuonGrokfastPreset:
    """The preset called ``name``; an unknown name raises an error listing the three."""
    from aegis.errors import InvalidConfigError

    if name not in PRESETS:
        raise InvalidConfigError(f"unknown Muon x Grokfast preset {name!r}; use one of {', '.join(PRESETS)}")
    return PRESETS[name]


def muon_grokfast(
    preset_name: Literal["pretrain", "bake", "rl"] = "pretrain",
    *,
    lr: float | optax.Schedule | None = None,
    grokfast_lambda: float | None = None,
    grokfast_alpha: float | None = None,
    clip_norm: float | None = 1.0,
    weight_decay: float = 0.0,
    labels: Callable[[Any], Any] | None = None,
) -> optax.GradientTransformation:
    """``clip_by_global_norm -> grokfast_ema -> muon`` with a preset's learning rate and Grokfast lambda
    (each overridable). QK-clip needs the step's attention logits: call :func:`qk_clip` with
    ``preset(name).qk_clip_tau`` after applying the updates; the KL coefficient is the RL loss's."""
    p = preset(preset_name)
    parts = [optax.clip_by_global_norm(clip_norm)] if clip_norm else []
    lam = p.grokfast_lambda if grokfast_lambda is None else grokfast_lambda
    if lam > 0:
        parts.append(grokfast_ema(p.grokfast_alpha if grokfast_alpha is None else grokfast_alpha, lam))
    parts.append(muon(p.lr if lr is None else lr, weight_decay=weight_decay, labels=labels))
    return optax.chain(*parts)
