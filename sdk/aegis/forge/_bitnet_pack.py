"""BitNet b1.58 numerics: absmean ternary weights, absmax int8 activations, 2-bit packing, the STE quantiser.

The formulas are those of *The Era of 1-bit LLMs* (Ma et al. 2024, eqs. 1-3) and *BitNet* (Wang et al. 2023):

* weights: ``W_q = RoundClip(W / (gamma + eps), -1, 1)``, ``gamma = mean(|W|)``, ``RoundClip(x, a, b) =
  max(a, min(b, round(x)))``; ``gamma`` is kept as the scale, ``W ~ gamma * W_q``. ``gamma`` is one number per
  tensor (the paper), or one per output channel (per row of an ``[out, in]`` weight) as an option.
  ``round`` rounds half to even, as ``torch.round`` in the reference code does: ``+-0.5 -> 0``, ``+-1.5 -> +-2
  -> +-1`` after the clip.
* activations, per token (last axis): ``Q(x) = Clip(round(x * 127 / max|x|), -128, 127)``, scale
  ``max|x| / 127``; an all-zero token has ``max|x|`` clamped to ``eps`` and quantises to zeros.

Packing: 2 bits per weight, 4 weights per byte, along the last axis (each row padded to a multiple of 4 with
the code of 0). Codes: ``-1 -> 0``, ``0 -> 1``, ``+1 -> 2`` (3 is never written). Weight ``4k + j`` of a row
sits in bits ``2j .. 2j+1`` of byte ``k`` (least significant bits first).

    codes, scale = absmean_ternary(w)                  # int8 in {-1, 0, 1}, float32 scale (shape w.ndim - 1)
    packed = pack_ternary(codes)                       # uint8 [..., ceil(n / 4)]
    assert (unpack_ternary(packed, w.shape[-1]) == codes).all()
    w_hat = unpack_ternary_jax(packed, n) * scale[..., None]   # in JAX, inside jit
    q, s = absmax_int8(x)                              # per-token int8 activations
    loss = f(ternary_ste(w))                           # forward ternary, gradient identity

Numpy for the host-side packing, JAX for what runs in a model.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "EPS",
    "CODE_OF",
    "round_clip",
    "absmean_ternary",
    "absmax_int8",
    "pack_ternary",
    "unpack_ternary",
    "unpack_ternary_jax",
    "ternary_ste",
]

EPS = 1e-5
"""The paper's epsilon (the reference code's clamp floor)."""
CODE_OF = {-1: 0, 0: 1, 1: 2}
"""Ternary value -> 2-bit code."""
_ZERO_CODE = CODE_OF[0]


def round_clip(x: Any, lo: float, hi: float) -> Any:
    """``max(lo, min(hi, round(x)))`` with round half to even (numpy or JAX arrays)."""
    xp = jnp if isinstance(x, jax.Array) else np
    return xp.clip(xp.round(x), lo, hi)


def _absmean(w: Any, per_channel: bool, xp: Any) -> Any:
    """gamma with ``w.ndim - 1`` dims: the mean of |w| per row, or of the whole tensor (all dims 1)."""
    a = xp.abs(w)
    if per_channel:
        return xp.mean(a, axis=-1)
    return xp.mean(a).reshape((1,) * (w.ndim - 1))


def absmean_ternary(w: np.ndarray, *, per_channel: bool = False, eps: float = EPS) -> tuple[np.ndarray, np.ndarray]:
    """Ternary codes (int8 in {-1, 0, 1}) and the float32 scale ``gamma`` of a weight (numpy, float32 maths).

    ``scale`` has ``w.ndim - 1`` dims: ``w.shape[:-1]`` per channel, all ones per tensor, so that
    ``codes * scale[..., None]`` is the dequantised weight.
    """
    w = np.asarray(w, dtype=np.float32)
    if w.ndim < 2:
        raise ValueError(f"absmean_ternary quantises matrices (a weight of 2 or more dims), got shape {w.shape}")
    gamma = _absmean(w, per_channel, np).astype(np.float32)
    codes = round_clip(w / (gamma[..., None] + np.float32(eps)), -1, 1).astype(np.int8)
    return codes, gamma


def absmax_int8(x: Any, *, eps: float = EPS) -> tuple[jax.Array, jax.Array]:
    """Per-token int8 activations: ``Clip(round(x * 127 / max|x|), -128, 127)`` over the last axis.

    Returns ``(q int8, scale float32 [..., 1])`` with ``x ~ q * scale``, ``scale = max|x| / 127``.
    """
    x = jnp.asarray(x, jnp.float32)
    gamma = jnp.maximum(jnp.max(jnp.abs(x), axis=-1, keepdims=True), eps)
    q = jnp.clip(jnp.round(x * (127.0 / gamma)), -128, 127).astype(jnp.int8)
    return q, gamma / 127.0


def pack_ternary(codes: np.ndarray) -> np.ndarray:
    """int8 ternary values ``[..., n]`` -> uint8 ``[..., ceil(n / 4)]`` (codes and bit order: module doc)."""
    codes = np.asarray(codes)
    n = codes.shape[-1]
    pad = -n % 4
    c = (codes.astype(np.int16) + 1).astype(np.uint8)  # -1, 0, 1 -> 0, 1, 2
    if pad:
        c = np.concatenate([c, np.full((*c.shape[:-1], pad), _ZERO_CODE, np.uint8)], axis=-1)
    c = c.reshape(*c.shape[:-1], -1, 4)
    return (c[..., 0] | (c[..., 1] << 2) | (c[..., 2] << 4) | (c[..., 3] << 6)).astype(np.uint8)


def unpack_ternary(packed: np.ndarray, n: int) -> np.ndarray:
    """uint8 ``[..., ceil(n / 4)]`` -> int8 ternary values ``[..., n]`` (numpy)."""
    packed = np.asarray(packed, np.uint8)
    shifts = np.array([0, 2, 4, 6], np.uint8)
    c = (packed[..., None] >> shifts) & np.uint8(3)
    c = c.reshape(*packed.shape[:-1], -1)[..., :n]
    return c.astype(np.int8) - np.int8(1)


def unpack_ternary_jax(packed: jax.Array, n: int) -> jax.Array:
    """JAX twin of :func:`unpack_ternary` (int8 ``[..., n]``), for unpacking inside a jitted forward."""
    shifts = jnp.array([0, 2, 4, 6], jnp.uint8)
    c = (packed[..., None] >> shifts) & jnp.uint8(3)
    c = c.reshape(*packed.shape[:-1], -1)[..., :n]
    return c.astype(jnp.int8) - jnp.int8(1)


def ternary_ste(w: jax.Array, *, per_channel: bool = False, eps: float = EPS) -> jax.Array:
    """Straight-through ternary weight for quantisation-aware training: the forward value is
    ``RoundClip(w / (gamma + eps), -1, 1) * gamma``, the gradient with respect to ``w`` is the identity
    (``w + stop_gradient(q(w) - w)``, as the BitNet training code does)."""
    gamma = _absmean(w.astype(jnp.float32), per_channel, jnp)[..., None]
    q = round_clip(w / (gamma + eps), -1, 1) * gamma
    return w + jax.lax.stop_gradient(q.astype(w.dtype) - w)
