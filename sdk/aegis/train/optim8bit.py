"""8-bit AdamW in JAX: Adam's two moments kept block-wise quantised to 8 bits, as bitsandbytes does.

The definition followed is bitsandbytes' blockwise 8-bit optimizers (``bnb.optim.AdamW8bit``,
``Optimizer2State`` with ``optim_bits=8``; Dettmers et al. 2022, "8-bit Optimizers via Block-wise
Quantization"):

- each moment of a parameter with at least ``min_8bit_size`` (4096) elements is stored as one
  ``uint8`` code per element plus one float32 ``absmax`` per block of 256 elements; smaller
  parameters (norms, biases) keep float32 moments;
- the first moment uses the signed dynamic map, the second (never negative) the unsigned one
  (:func:`dynamic_map`, bitsandbytes ``create_dynamic_map(signed)``: 7 exponent bits, 256 values);
- quantising a block divides it by its absmax and takes the nearest code value (ties to the lower);
- each step dequantises, does the AdamW update in float32 (``m = b1 m + (1-b1) g``,
  ``v = b2 v + (1-b2) g^2``, ``p -= lr (m / c1) / (sqrt(v) / sqrt(c2) + eps)``, decoupled weight
  decay), and requantises the new moments with their new per-block absmax. The update itself uses
  the float32 moments of this step, so quantisation only affects later steps.

State: 2 bytes per parameter (+ 8 bytes of absmax per 256) instead of fp32 Adam's 8.

Paged 8-bit AdamW (``paged_adamw_8bit``) is the same arithmetic; "paged" only means bitsandbytes
allocates the state in CUDA unified memory so the driver can evict it to host RAM under memory
pressure. XLA has no unified memory, so the JAX engine runs both names with this optimizer.

    tx = adamw_8bit(learning_rate=2e-4, weight_decay=0.01)
    state = tx.init(params)                  # ScaleByAdam8bitState inside an optax chain
    updates, state = tx.update(grads, state, params)
    optimizer_state_bytes(state)             # bytes the state occupies

Rounding versus bitsandbytes' CPU kernel: this module rounds to the exact nearest code value;
bitsandbytes' CPU ``quantize_blockwise`` uses an approximate binary search that sometimes lands a
few codes away among the densely spaced small values (measured in ``tests/train/test_optim8bit.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

__all__ = [
    "BLOCK_SIZE",
    "MIN_8BIT_SIZE",
    "QuantizedArray",
    "ScaleByAdam8bitState",
    "dynamic_map",
    "quantize_blockwise",
    "dequantize_blockwise",
    "scale_by_adam_8bit",
    "adamw_8bit",
    "optimizer_state_bytes",
    "dequantize_moments",
    "quantize_moments",
]

BLOCK_SIZE = 256
"""Elements per absmax block of the optimizer states (bitsandbytes' blockwise 8-bit optimizers)."""

MIN_8BIT_SIZE = 4096
"""Parameters with fewer elements keep float32 moments (bitsandbytes ``min_8bit_size``)."""


@lru_cache(maxsize=2)
def dynamic_map(signed: bool = True) -> np.ndarray:
    """The 8-bit dynamic quantisation map (bitsandbytes ``create_dynamic_map(signed)``): 256 sorted float32 values.

    Exponent ``i`` of 7 contributes ``2**i`` (signed, each with its negative) or ``2**(i+1)``
    (unsigned) linearly spaced fractions of ``10**(i-6)``; then 0 and 1. Some values can differ from
    bitsandbytes' by one float32 ulp: torch's float32 ``linspace`` accumulates its step in float32
    (how, depends on the CPU's vector width) where numpy rounds a float64 result once.
    """
    data: list[float] = []
    for i in range(7):
        items = 2**i + 1 if signed else 2 ** (i + 1) + 1
        bounds = np.linspace(0.1, 1.0, items, dtype=np.float32)
        means = (bounds[:-1] + bounds[1:]) / np.float32(2.0)
        scale = np.float32(10.0 ** (i - 6))
        data += (scale * means).tolist()
        if signed:
            data += (-scale * means).tolist()
    data += [0.0, 1.0]
    data.sort()
    out = np.asarray(data, dtype=np.float32)
    out.flags.writeable = False
    return out


class QuantizedArray(NamedTuple):
    """An array stored as 8-bit codes into a dynamic map, with one float32 absmax per block."""

    codes: jax.Array  # uint8, the original shape
    absmax: jax.Array  # float32 [ceil(size / block_size)]


_CELL_BITS = 8
"""Mantissa bits of a float32 that, with its sign and exponent, pick a cell of the rounding table."""


@lru_cache(maxsize=8)
def _rounding_table(code_bytes: bytes) -> tuple[np.ndarray, np.ndarray] | None:
    """Nearest-code lookup by float32 bit pattern: for every cell of floats sharing sign, exponent and the
    top ``_CELL_BITS`` mantissa bits, the number of midpoints below the cell and the one midpoint inside
    it (+inf if none). None when a cell would hold two midpoints (a code too dense for the table)."""
    code = np.frombuffer(code_bytes, dtype=np.float32)
    mid = ((code[:-1] + code[1:]) / np.float32(2.0)).astype(np.float32)
    shift = 23 - _CELL_BITS
    cells = np.arange(1 << (9 + _CELL_BITS), dtype=np.uint32) << shift
    ends = (cells[:, None] | np.array([0, (1 << shift) - 1], dtype=np.uint32)).view(np.float32)
    lo, hi = ends.min(axis=1), ends.max(axis=1)
    finite = np.isfinite(lo) & np.isfinite(hi)
    lo, hi = np.where(finite, lo, 0.0), np.where(finite, hi, 0.0)
    below = np.searchsorted(mid, lo, side="left")
    inside = np.searchsorted(mid, hi, side="right") - below
    if inside.max() > 1:
        return None
    first_inside = np.where(inside > 0, mid[np.minimum(below, len(mid) - 1)], np.inf).astype(np.float32)
    return below.astype(np.int32), first_inside


def _nearest_code(normed: jax.Array, code: np.ndarray) -> jax.Array:
    """Index of the nearest value of the sorted ``code`` (ties to the lower): the number of midpoints
    strictly below ``normed``, as ``searchsorted(midpoints, normed, side="left")``, read from a table
    indexed by the float's bit pattern (two gathers and a compare instead of an 8-step binary search)."""
    code = np.ascontiguousarray(code, dtype=np.float32)
    table = _rounding_table(code.tobytes())
    if table is None:
        midpoints = jnp.asarray((code[:-1] + code[1:]) / np.float32(2.0))
        return jnp.searchsorted(midpoints, normed, side="left", method="scan_unrolled")
    below, first_inside = table
    cell = jax.lax.bitcast_convert_type(normed.astype(jnp.float32), jnp.uint32) >> (23 - _CELL_BITS)
    return jnp.asarray(below)[cell] + (jnp.asarray(first_inside)[cell] < normed).astype(jnp.int32)


def quantize_blockwise(x: jax.Array, code: np.ndarray, block_size: int = BLOCK_SIZE) -> QuantizedArray:
    """Quantise ``x``: per block of ``block_size`` flat elements, ``x / absmax`` to the nearest value of ``code``.

    ``code`` is a sorted map (:func:`dynamic_map`); ties between two code values go to the lower
    one. A block of zeros has absmax 0 and the code of 0.
    """
    flat = jnp.ravel(x).astype(jnp.float32)
    n = flat.shape[0]
    blocks = -(-n // block_size)
    padded = jnp.pad(flat, (0, blocks * block_size - n)).reshape(blocks, block_size)
    absmax = jnp.max(jnp.abs(padded), axis=1)
    safe = jnp.where(absmax > 0, absmax, 1.0)
    normed = (padded / safe[:, None]).reshape(-1)[:n]
    idx = _nearest_code(normed, code)
    return QuantizedArray(codes=idx.astype(jnp.uint8).reshape(x.shape), absmax=absmax)


def dequantize_blockwise(q: QuantizedArray, code: np.ndarray, block_size: int = BLOCK_SIZE) -> jax.Array:
    """Float32 values of a :class:`QuantizedArray`: ``code[codes] * absmax`` of each element's block."""
    shape = q.codes.shape
    n = int(np.prod(shape))
    blocks = q.absmax.shape[0]
    vals = jnp.asarray(code)[jnp.ravel(q.codes).astype(jnp.int32)]
    vals = jnp.pad(vals, (0, blocks * block_size - n)).reshape(blocks, block_size)
    return (vals * q.absmax[:, None]).reshape(-1)[:n].reshape(shape)


class ScaleByAdam8bitState(NamedTuple):
    """Adam's step count and moments; a moment leaf is a :class:`QuantizedArray` or a float32 array."""

    count: jax.Array  # int32 scalar
    mu: Any
    nu: Any


def _slice_size(p: Any, batch_dims: int) -> int:
    return int(np.prod(p.shape[batch_dims:]))


def _per_slice(fn: Callable[..., Any], batch_dims: int) -> Callable[..., Any]:
    for _ in range(batch_dims):
        fn = jax.vmap(fn)
    return fn


def scale_by_adam_8bit(
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    *,
    block_size: int = BLOCK_SIZE,
    min_8bit_size: int = MIN_8BIT_SIZE,
    batch_dims: Callable[[Any], Any] | None = None,
) -> optax.GradientTransformation:
    """Adam's bias-corrected ``m / (sqrt(v) + eps)`` with block-wise 8-bit moments (see the module docstring).

    ``b1``, ``b2`` and ``eps`` may be traced (``optax.inject_hyperparams``); the block size and
    the 8-bit threshold are static. ``batch_dims(params)`` gives, per leaf, how many leading axes
    stack separate parameters (decoder layers stacked for ``lax.scan``): each slice is then a
    parameter of its own, as bitsandbytes sees one ``nn.Linear`` per layer (its own blocks, and
    the ``min_8bit_size`` threshold applied to its size). None: every leaf is one parameter.
    """
    signed, unsigned = dynamic_map(True), dynamic_map(False)

    def dims(tree: Any) -> list[int]:
        leaves = jax.tree.leaves(tree)
        return [0] * len(leaves) if batch_dims is None else [int(d) for d in jax.tree.leaves(batch_dims(tree))]

    def zeros(p: Any, code: np.ndarray, nb: int) -> Any:
        if _slice_size(p, nb) < min_8bit_size:
            return jnp.zeros(p.shape, jnp.float32)
        blocks = -(-_slice_size(p, nb) // block_size)
        zero_code = int(np.flatnonzero(code == 0.0)[0])
        return QuantizedArray(
            codes=jnp.full(p.shape, zero_code, jnp.uint8), absmax=jnp.zeros((*p.shape[:nb], blocks), jnp.float32)
        )

    def init(params: Any) -> ScaleByAdam8bitState:
        leaves, treedef = jax.tree.flatten(params)
        nbs = dims(params)
        return ScaleByAdam8bitState(
            count=jnp.zeros((), jnp.int32),
            mu=treedef.unflatten([zeros(p, signed, nb) for p, nb in zip(leaves, nbs)]),
            nu=treedef.unflatten([zeros(p, unsigned, nb) for p, nb in zip(leaves, nbs)]),
        )

    def update(grads: Any, state: ScaleByAdam8bitState, params: Any = None) -> tuple[Any, ScaleByAdam8bitState]:
        del params
        count = optax.safe_increment(state.count)
        t = count.astype(jnp.float32)
        c1 = 1.0 - jnp.asarray(b1, jnp.float32) ** t
        c2 = jnp.sqrt(1.0 - jnp.asarray(b2, jnp.float32) ** t)

        def moments(g: jax.Array, m: jax.Array, v: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
            m = b1 * m + (1.0 - b1) * g
            v = b2 * v + (1.0 - b2) * g * g
            return (m / c1) / (jnp.sqrt(v) / c2 + eps), m, v

        def quantized(g: jax.Array, mu: QuantizedArray, nu: QuantizedArray) -> tuple[Any, ...]:
            m = dequantize_blockwise(mu, signed, block_size)
            v = dequantize_blockwise(nu, unsigned, block_size)
            step, m, v = moments(g, m, v)
            m, v = jax.lax.optimization_barrier((m, v))  # XLA:CPU would recompute them inside each lookup
            return step, quantize_blockwise(m, signed, block_size), quantize_blockwise(v, unsigned, block_size)

        g_leaves, treedef = jax.tree.flatten(grads)
        mu_leaves = treedef.flatten_up_to(state.mu)
        nu_leaves = treedef.flatten_up_to(state.nu)
        out = []
        for g, mu, nu, nb in zip(g_leaves, mu_leaves, nu_leaves, dims(grads)):
            g = g.astype(jnp.float32)
            out.append(_per_slice(quantized, nb)(g, mu, nu) if isinstance(mu, QuantizedArray) else moments(g, mu, nu))
        updates = treedef.unflatten([o[0] for o in out])
        mu = treedef.unflatten([o[1] for o in out])
        nu = treedef.unflatten([o[2] for o in out])
        return updates, ScaleByAdam8bitState(count=count, mu=mu, nu=nu)

    return optax.GradientTransformation(init, update)


def adamw_8bit(
    learning_rate: optax.ScalarOrSchedule = 1e-3,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    weight_decay: float = 1e-2,
    mask: Any = None,
    *,
    block_size: int = BLOCK_SIZE,
    min_8bit_size: int = MIN_8BIT_SIZE,
    batch_dims: Callable[[Any], Any] | None = None,
) -> optax.GradientTransformation:
    """AdamW with 8-bit block-wise moments: ``bnb.optim.AdamW8bit`` (and ``PagedAdamW8bit``) as an optax chain.

    Built like ``optax.adamw``: the Adam direction, decoupled weight decay on the leaves ``mask``
    selects (all when None), then ``-learning_rate``. Defaults are bitsandbytes' (weight decay 0.01).
    ``batch_dims``: see :func:`scale_by_adam_8bit`.
    """
    return optax.chain(
        scale_by_adam_8bit(b1, b2, eps, block_size=block_size, min_8bit_size=min_8bit_size, batch_dims=batch_dims),
        optax.add_decayed_weights(weight_decay, mask),
        optax.scale_by_learning_rate(learning_rate),
    )


def _leaf_batch_dims(q: QuantizedArray) -> int:
    return q.absmax.ndim - 1  # absmax is [*stacked axes, blocks]


def dequantize_moments(state: ScaleByAdam8bitState, block_size: int = BLOCK_SIZE) -> tuple[Any, Any]:
    """Adam's ``(mu, nu)`` as float32 arrays (e.g. to hand them to ``optax.adamw`` after a config change)."""

    def one(x: Any, code: np.ndarray) -> jax.Array:
        if not isinstance(x, QuantizedArray):
            return x
        return _per_slice(lambda q: dequantize_blockwise(q, code, block_size), _leaf_batch_dims(x))(x)

    is_q = lambda x: isinstance(x, QuantizedArray)  # noqa: E731
    mu = jax.tree.map(lambda x: one(x, dynamic_map(True)), state.mu, is_leaf=is_q)
    nu = jax.tree.map(lambda x: one(x, dynamic_map(False)), state.nu, is_leaf=is_q)
    return mu, nu


def quantize_moments(mu: Any, nu: Any, like: ScaleByAdam8bitState, block_size: int = BLOCK_SIZE) -> tuple[Any, Any]:
    """Float32 ``(mu, nu)`` in the layout of ``like`` (a fresh 8-bit state of the same params): the
    leaves ``like`` quantises are quantised (per stacked slice), the others kept in float32."""

    def one(x: jax.Array, template: Any, code: np.ndarray) -> Any:
        x = jnp.asarray(x, jnp.float32)
        if not isinstance(template, QuantizedArray):
            return x
        return _per_slice(lambda a: quantize_blockwise(a, code, block_size), _leaf_batch_dims(template))(x)

    is_q = lambda x: isinstance(x, QuantizedArray)  # noqa: E731
    mu_q = jax.tree.map(lambda t, x: one(x, t, dynamic_map(True)), like.mu, mu, is_leaf=is_q)
    nu_q = jax.tree.map(lambda t, x: one(x, t, dynamic_map(False)), like.nu, nu, is_leaf=is_q)
    return mu_q, nu_q


def optimizer_state_bytes(opt_state: Any) -> int:
    """Bytes of all array leaves of an optimizer state (codes, absmax, moments, counters, hyper-parameters)."""
    leaves = [x for x in jax.tree.leaves(opt_state) if hasattr(x, "dtype")]
    return sum(int(np.prod(x.shape)) * jnp.dtype(x.dtype).itemsize for x in leaves)
