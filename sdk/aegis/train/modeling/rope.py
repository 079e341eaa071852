"""Rotary position embeddings as transformers computes them (``modeling_rope_utils``).

A :class:`RopeSpec` is read from a config.json's rope settings (``rope_parameters`` in the
transformers 5 layout, or the older ``rope_theta`` + ``rope_scaling`` pair); :func:`inv_freq`
gives the inverse frequencies and :func:`cos_sin` the tables for given positions, which
:func:`apply_rope` applies with ``rotate_half`` over the first ``rotary_dim`` channels.

    spec = RopeSpec.from_params({"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, ...}, head_dim=64,
                                max_position_embeddings=131072)
    cos, sin = cos_sin(spec, positions, seq_len=positions.shape[-1])   # [b, s, rotary_dim] float32
    q = apply_rope(q, cos, sin)                                         # q: [b, s, heads, head_dim]
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from aegis.models.shapes import SUPPORTED_ROPE_TYPES, RopeSpec

__all__ = ["RopeSpec", "inv_freq", "cos_sin", "apply_rope", "SUPPORTED_ROPE_TYPES"]

def _default_inv_freq(spec: RopeSpec) -> np.ndarray:
    dim = spec.rotary_dim
    exponent = np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / np.float32(dim)
    return (1.0 / (np.float32(spec.theta) ** exponent)).astype(np.float32)


def _llama3(spec: RopeSpec) -> np.ndarray:
    inv = _default_inv_freq(spec)
    factor, low, high = spec.factor, spec.low_freq_factor, spec.high_freq_factor
    old_len = spec.original_max_position_embeddings
    low_wavelen = old_len / low
    high_wavelen = old_len / high
    wavelen = (2 * math.pi / inv).astype(np.float32)
    inv_llama = np.where(wavelen > low_wavelen, inv / factor, inv).astype(np.float32)
    smooth = ((old_len / wavelen - low) / (high - low)).astype(np.float32)
    smoothed = ((1 - smooth) * inv_llama / factor + smooth * inv_llama).astype(np.float32)
    is_medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(is_medium, smoothed, inv_llama).astype(np.float32)


def _yarn(spec: RopeSpec) -> tuple[np.ndarray, float]:
    dim, base = spec.rotary_dim, spec.theta
    orig = spec.original_max_position_embeddings
    factor = spec.factor if spec.factor is not None else spec.max_position_embeddings / orig

    def get_mscale(scale: float, mscale: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0

    attention_factor = spec.attention_factor
    if attention_factor is None:
        if spec.mscale and spec.mscale_all_dim:
            attention_factor = float(get_mscale(factor, spec.mscale) / get_mscale(factor, spec.mscale_all_dim))
        else:
            attention_factor = get_mscale(factor)
    beta_fast = spec.beta_fast or 32
    beta_slow = spec.beta_slow or 1

    def correction_dim(rot: float) -> float:
        return (dim * math.log(orig / (rot * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if spec.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    pos_freqs = np.float32(base) ** (np.arange(0, dim, 2).astype(np.float32) / np.float32(dim))
    extrapolation = 1.0 / pos_freqs
    interpolation = 1.0 / (factor * pos_freqs)
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - low) / (high - low), 0, 1)
    extra_factor = 1 - ramp
    inv = interpolation * (1 - extra_factor) + extrapolation * extra_factor
    return inv.astype(np.float32), float(attention_factor)


def _longrope(spec: RopeSpec, seq_len: int) -> tuple[np.ndarray, float]:
    orig = spec.original_max_position_embeddings
    factor = spec.factor if spec.factor is not None else spec.max_position_embeddings / orig
    attention_factor = spec.attention_factor
    if attention_factor is None:
        attention_factor = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(orig))
    ext = np.asarray(spec.long_factor if seq_len > orig else spec.short_factor, dtype=np.float32)
    shape = np.arange(0, spec.rotary_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(spec.rotary_dim)
    inv = 1.0 / (ext * np.float32(spec.theta) ** shape)
    return inv.astype(np.float32), float(attention_factor)


def inv_freq(spec: RopeSpec, seq_len: int) -> tuple[np.ndarray, float]:
    """Inverse frequencies ``[rotary_dim // 2]`` and the cos/sin scaling factor, as transformers computes them."""
    if spec.rope_type == "default":
        return _default_inv_freq(spec), 1.0
    if spec.rope_type == "none":  # NoPE layers (SmolLM3): zero angles, cos 1 and sin 0, the identity rotation
        return np.zeros(spec.rotary_dim // 2, np.float32), 1.0
    if spec.rope_type == "linear":
        return (_default_inv_freq(spec) / np.float32(spec.factor)).astype(np.float32), 1.0
    if spec.rope_type == "llama3":
        return _llama3(spec), 1.0
    if spec.rope_type == "yarn":
        return _yarn(spec)
    return _longrope(spec, seq_len)


def cos_sin(spec: RopeSpec, positions: jnp.ndarray, *, seq_len: int) -> tuple[jnp.ndarray, jnp.ndarray]:
    """cos and sin tables ``[b, s, rotary_dim]`` (float32) for integer positions ``[b, s]``."""
    inv, scaling = inv_freq(spec, seq_len)
    freqs = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv)[None, None, :]
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb) * scaling, jnp.sin(emb) * scaling


def _rotate_half(x: jnp.ndarray) -> jnp.ndarray:
    half = x.shape[-1] // 2
    return jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def deinterleave(x: jnp.ndarray, rot: int | None = None) -> jnp.ndarray:
    """``[x0, x1, x2, x3, ...] -> [x0, x2, ..., x1, x3, ...]`` on the last axis: rotating adjacent pairs (DeepSeek's
    ``rope_interleave``, Cohere) is `apply_rope` on the permuted vector. With ``rot`` only the first ``rot`` dims are
    permuted, the rest kept in place (GPT-J rotates adjacent pairs of its first ``rotary_dim`` dims)."""
    if rot is not None and rot < x.shape[-1]:
        return jnp.concatenate([deinterleave(x[..., :rot]), x[..., rot:]], axis=-1)
    return jnp.concatenate([x[..., 0::2], x[..., 1::2]], axis=-1)


def apply_rope(x: jnp.ndarray, cos: jnp.ndarray, sin: jnp.ndarray) -> jnp.ndarray:
    """Rotate ``x`` ``[b, s, heads, head_dim]`` by tables ``[b, s, rotary_dim]`` (cast to x's dtype, as HF does)."""
    cos = cos.astype(x.dtype)[:, :, None, :]
    sin = sin.astype(x.dtype)[:, :, None, :]
    rot = cos.shape[-1]
    if rot == x.shape[-1]:
        return x * cos + _rotate_half(x) * sin
    x_rot, x_pass = x[..., :rot], x[..., rot:]
    return jnp.concatenate([x_rot * cos + _rotate_half(x_rot) * sin, x_pass], axis=-1)
