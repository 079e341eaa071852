"""NF4 block-wise 4-bit quantisation with double quantisation, in JAX (QLoRA, Dettmers et al. 2023).

The definition followed is bitsandbytes' ``quantize_4bit(quant_type="nf4", compress_statistics=True)``:

1. flatten the weight, split it into blocks of ``block_size`` (64) values, ``absmax`` per block;
2. each value divided by its block's absmax is rounded to the nearest of the 16 NF4 code values
   (normal-distribution quantiles, :data:`NF4_CODE`); two 4-bit indices are packed per byte, the
   first in the high nibble;
3. double quantisation: ``offset = mean(absmax)``; ``absmax - offset`` is quantised block-wise
   (blocks of 256) to 8 bits with the signed dynamic map (:func:`dynamic_map`), with one float32
   scale per 256-block.

Dequantisation reverses this: ``code[idx] * (dynamic[absmax_q] * scale + offset)``.

    q = quantize(w)                 # NF4Tensor pytree (uint8 codes + statistics)
    w_hat = dequantize(q, jnp.bfloat16)
    qparams = quantize_params(model, params)   # linear weights -> NF4Tensor; embeddings, head, norms kept

A leading batch axis (stacked decoder layers) is quantised per slice, so ``jax.lax.scan`` over
layers hands each layer its own :class:`NF4Tensor`. Models dequantise on the fly
(:func:`maybe_dequantize`), so the bf16 copy of a weight lives only inside its layer's step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache, partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "NF4_CODE",
    "NF4Tensor",
    "dynamic_map",
    "quantize",
    "dequantize",
    "maybe_dequantize",
    "quantize_params",
    "quantize_leaf",
    "DEFAULT_SKIP",
]

# The 16 NF4 values: quantiles of N(0, 1) normalised to [-1, 1] with an exact zero (QLoRA paper,
# appendix E; bitsandbytes ``get_4bit_type("nf4")``). They are the definition of the format.
NF4_CODE = np.array(
    [
        -1.0,
        -0.6961928009986877,
        -0.5250730514526367,
        -0.39491748809814453,
        -0.28444138169288635,
        -0.18477343022823334,
        -0.09105003625154495,
        0.0,
        0.07958029955625534,
        0.16093020141124725,
        0.24611230194568634,
        0.33791524171829224,
        0.44070982933044434,
        0.5626170039176941,
        0.7229568362236023,
        1.0,
    ],
    dtype=np.float32,
)

DEFAULT_SKIP = ("embed_tokens", "embed_positions", "lm_head", "gate", "router", "shared_expert_gate")
"""Module names whose weights stay unquantised: embeddings, head, MoE routers (norms and biases always stay)."""


@lru_cache(maxsize=1)
def dynamic_map() -> np.ndarray:
    """The signed 8-bit dynamic quantisation map (bitsandbytes ``create_dynamic_map()``), 256 sorted values."""
    # 7 exponent bits over 7 value bits: fraction_items = 2**i + 1 per exponent, no extra linear items.
    max_exponent_bits = 7
    data: list[float] = []
    for i in range(max_exponent_bits):
        boundaries = np.linspace(0.1, 1, 2**i + 1, dtype=np.float32)
        means = (boundaries[:-1] + boundaries[1:]) / np.float32(2.0)
        scale = np.float32(10 ** (-(max_exponent_bits - 1) + i))
        data += (scale * means).tolist()
        data += (-scale * means).tolist()
    data += [0.0, 1.0]
    data.sort()
    return np.asarray(data, dtype=np.float32)


@jax.tree_util.register_pytree_node_class
@dataclass(frozen=True)
class NF4Tensor:
    """A weight quantised to NF4: packed 4-bit codes and (double-quantised) per-block absmax.

    Array fields may carry leading batch axes (stacked layers); ``shape`` is one slice's shape.
    """

    packed: jax.Array  # uint8 [..., ceil(n/2)]
    absmax: jax.Array  # double_quant: uint8 [..., n_blocks] else float32 [..., n_blocks]
    absmax_scale: jax.Array | None  # float32 [..., ceil(n_blocks/256)] (double_quant only)
    absmax_offset: jax.Array | None  # float32 [...] (double_quant only)
    shape: tuple[int, ...]
    block_size: int
    dtype: str  # dtype of the original weight, e.g. "bfloat16"

    def tree_flatten(self) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        return (self.packed, self.absmax, self.absmax_scale, self.absmax_offset), (
            self.shape,
            self.block_size,
            self.dtype,
        )

    @classmethod
    def tree_unflatten(cls, aux: tuple[Any, ...], children: tuple[Any, ...]) -> NF4Tensor:
        return cls(*children, *aux)

    @property
    def double_quant(self) -> bool:
        return self.absmax_scale is not None

    @property
    def nbytes(self) -> int:
        """Storage bytes of the quantised representation."""
        return sum(
            int(x.size) * x.dtype.itemsize
            for x in (self.packed, self.absmax, self.absmax_scale, self.absmax_offset)
            if x is not None
        )


def _blockwise_absmax(flat: jax.Array, block: int) -> tuple[jax.Array, jax.Array]:
    """Pad ``flat`` to whole blocks; return blocks ``[nb, block]`` and per-block absmax (padding is 0)."""
    n = flat.shape[0]
    nb = -(-n // block)
    padded = jnp.pad(flat, (0, nb * block - n))
    blocks = padded.reshape(nb, block)
    return blocks, jnp.max(jnp.abs(blocks), axis=-1)


def _nearest(scaled: jax.Array, code: np.ndarray) -> jax.Array:
    """Index of the nearest code value: bucketize against midpoints (ties go to the upper value, as torch does).

    The index is the number of midpoints below the value (``searchsorted(side="left")``). For NF4's 15 midpoints it is
    summed from one comparison per midpoint, an elementwise expression: ``searchsorted(method="compare_all")``, a
    reduction over a broadcast ``[n, 15]`` comparison, took XLA:GPU minutes to compile for a 1B model's stacked
    weights (H200, jax 0.11.2). The 255 midpoints of the double quantisation's dynamic map take a binary search."""
    mids = (code[:-1] + code[1:]) / 2
    if len(mids) > 16:
        return jnp.searchsorted(jnp.asarray(mids), scaled, side="left", method="scan_unrolled").astype(jnp.uint8)
    idx = jnp.zeros(scaled.shape, jnp.uint8)
    for m in mids:
        idx = idx + (scaled > np.float32(m)).astype(jnp.uint8)
    return idx


def _quantize_one(w: jax.Array, block_size: int, double_quant: bool) -> tuple[jax.Array, ...]:
    flat = w.reshape(-1).astype(jnp.float32)
    n = flat.shape[0]
    blocks, absmax = _blockwise_absmax(flat, block_size)
    scaled = jnp.clip(blocks * (1.0 / jnp.maximum(absmax, 1e-38))[:, None], -1, 1).reshape(-1)[:n]
    idx = _nearest(scaled, NF4_CODE)
    if n % 2:
        idx = jnp.pad(idx, (0, 1))
    packed = (idx[0::2] << 4) | idx[1::2]
    if not double_quant:
        return packed, absmax, None, None
    offset = jnp.mean(absmax)
    centred = absmax - offset
    nb = absmax.shape[0]
    blocks2, scale2 = _blockwise_absmax(centred, 256)
    scaled2 = jnp.clip(blocks2 * (1.0 / jnp.maximum(scale2, 1e-38))[:, None], -1, 1).reshape(-1)[:nb]
    q_absmax = _nearest(scaled2, dynamic_map())
    return packed, q_absmax, scale2, offset


@partial(jax.jit, static_argnums=(1, 2, 3))
def _quantize_batched(w: jax.Array, block_size: int, double_quant: bool, batch_dims: int) -> tuple[jax.Array, ...]:
    fn = lambda x: _quantize_one(x, block_size, double_quant)  # noqa: E731
    for _ in range(batch_dims):
        fn = jax.vmap(fn)
    return fn(w)


def quantize(w: jax.Array, block_size: int = 64, double_quant: bool = True, *, batch_dims: int = 0) -> NF4Tensor:
    """Quantise ``w`` to NF4 (per slice over the first ``batch_dims`` axes)."""
    packed, absmax, scale, offset = _quantize_batched(jnp.asarray(w), block_size, double_quant, batch_dims)
    return NF4Tensor(
        packed=packed,
        absmax=absmax,
        absmax_scale=scale,
        absmax_offset=offset,
        shape=tuple(w.shape[batch_dims:]),
        block_size=block_size,
        dtype=jnp.dtype(w.dtype).name,
    )


def _absmax_values(q: NF4Tensor) -> jax.Array:
    if not q.double_quant:
        return q.absmax.astype(jnp.float32)
    nb = q.absmax.shape[-1]
    vals = jnp.asarray(dynamic_map())[q.absmax.astype(jnp.int32)]
    scale = jnp.repeat(q.absmax_scale, 256, axis=-1)[..., :nb]
    return vals * scale + q.absmax_offset[..., None]


def dequantize(q: NF4Tensor, dtype: Any = None) -> jax.Array:
    """Reconstruct the weight (in ``dtype``, default the original dtype); any leading batch axes are kept."""
    return _dequantize(q, jnp.dtype(dtype or q.dtype))


@partial(jax.jit, static_argnums=(1,))
def _dequantize(q: NF4Tensor, dtype: Any) -> jax.Array:
    batch = q.packed.shape[:-1]
    n = math.prod(q.shape)
    hi = (q.packed >> 4).astype(jnp.int32)
    lo = (q.packed & 0xF).astype(jnp.int32)
    idx = jnp.stack([hi, lo], axis=-1).reshape(*batch, -1)[..., :n]
    vals = jnp.asarray(NF4_CODE)[idx]
    absmax = _absmax_values(q)
    nb = absmax.shape[-1]
    vals = jnp.pad(vals, [(0, 0)] * len(batch) + [(0, nb * q.block_size - n)])
    out = (vals.reshape(*batch, nb, q.block_size) * absmax[..., None]).reshape(*batch, -1)[..., :n]
    return out.reshape(*batch, *q.shape).astype(dtype)


def maybe_dequantize(w: Any, dtype: Any) -> jax.Array:
    """``w`` cast to ``dtype``, dequantising it first when it is an :class:`NF4Tensor`."""
    if isinstance(w, NF4Tensor):
        return dequantize(w, dtype)
    return w.astype(dtype)


def quantize_params(
    model: Any,
    params: dict[str, Any],
    *,
    block_size: int = 64,
    double_quant: bool = True,
    skip: tuple[str, ...] = DEFAULT_SKIP,
) -> dict[str, Any]:
    """Replace every linear ``weight`` (2-D per layer, incl. MoE expert stacks) by an :class:`NF4Tensor`.

    A weight is skipped when a component of its path is one of ``skip`` (embeddings, head, routers)
    or ends in ``norm``; biases are never quantised. Stacked decoder layers (under ``model.layers``)
    are quantised per layer.
    """

    def visit(node: Any, path: tuple[str, ...]) -> Any:
        if isinstance(node, dict):
            return {k: visit(v, path + (k,)) for k, v in node.items()}
        return quantize_leaf(path, node, block_size=block_size, double_quant=double_quant, skip=skip)

    return visit(params, ())


def quantize_leaf(
    path: tuple[str, ...],
    node: Any,
    *,
    block_size: int = 64,
    double_quant: bool = True,
    skip: tuple[str, ...] = DEFAULT_SKIP,
) -> Any:
    """One params leaf as QLoRA keeps it: an :class:`NF4Tensor` for a linear weight, else unchanged
    (the rule of :func:`quantize_params`, applied while a checkpoint streams in)."""
    if isinstance(node, NF4Tensor):
        return node
    if path[-1] not in ("weight", "gate_up_proj", "down_proj") or any(p in skip or p.endswith("norm") for p in path):
        return node
    batch_dims = 1 if "layers" in path or "dense_layers" in path else 0  # stacked (DeepSeek: two stacks)
    if node.ndim - batch_dims < 2:
        return node
    return quantize(node, block_size, double_quant, batch_dims=batch_dims)
