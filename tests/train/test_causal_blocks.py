"""The engine's explicit-scores attention in query blocks (`eager_attention`) against the full-width maths.

Reference: JAX's own autodiff of the eager maths over the whole ``[s, s]`` score matrix (``_eager_forward`` with
every query at once; transformers' eager attention is the reference for that in ``test_parity.py``). Skipping the
key blocks above the diagonal must change nothing a causal mask allows: outputs and gradients agree to float32
rounding for plain causal, packed-segment and sliding-window masks, grouped queries, soft-capping and an uneven last
block; XLA's cost analysis of the compiled attention shows the skipped FLOPs, and its memory analysis that the
kept scores shrink.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from aegis.models.shapes import causal_key_span, query_blocks
from aegis.train.modeling import layers
from aegis.train.modeling.decoder import attention_mask
from aegis.train.modeling.layers import _eager_forward, eager_attention


def _inputs(seed: int, b: int, hkv: int, groups: int, s: int, hd: int):
    rng = np.random.default_rng(seed)
    q = jnp.asarray(rng.standard_normal((b, hkv, groups * s, hd)), jnp.float32)
    k = jnp.asarray(rng.standard_normal((b, hkv, s, hd)), jnp.float32)
    v = jnp.asarray(rng.standard_normal((b, hkv, s, hd)), jnp.float32)
    g = jnp.asarray(rng.standard_normal((b, hkv, groups * s, hd)), jnp.float32)
    return q, k, v, g


def _masks(b: int, s: int) -> dict[str, jax.Array]:
    idx = np.arange(s)
    causal = np.broadcast_to(idx[:, None] >= idx[None, :], (b, s, s))
    segments = np.stack([np.repeat(np.arange(5), -(-s // 5))[:s], np.repeat(np.arange(2), -(-s // 2))[:s]])[:b] + 1
    dist = idx[:, None] - idx[None, :]
    return {
        "causal": jnp.asarray(causal),
        "packed": attention_mask(jnp.asarray(segments, jnp.int32)),
        "window": jnp.asarray(causal & (dist < 100)[None]),
    }


@pytest.mark.parametrize(("s", "mask_kind", "groups", "softcap"), [
    (300, "causal", 1, None), (300, "packed", 3, 20.0), (300, "window", 3, None), (512, "packed", 1, 20.0),
])
def test_blocked_attention_equals_the_full_width_maths(s, mask_kind, groups, softcap) -> None:
    b, hkv, hd = 2, 2, 16
    q, k, v, g = _inputs(s + groups, b, hkv, groups, s, hd)
    mask = _masks(b, s)[mask_kind]

    def full_width(q, k, v, mask, key, scale, softcap, groups):
        return _eager_forward(q, k, v, mask, key, scale, softcap, groups, 0.0)[0]

    def loss(fn):
        return lambda q, k, v: jnp.sum(fn(q, k, v, mask, None, 0.25, softcap, groups) * g)

    def outputs_and_grads(fn):  # one compiled program each (op by op, the blocks' many small ops compile one by one)
        return jax.jit(lambda q, k, v: (fn(q, k, v, mask, None, 0.25, softcap, groups),
                                        jax.grad(loss(fn), argnums=(0, 1, 2))(q, k, v)))(q, k, v)

    assert len(query_blocks(s)) > 1
    full, grads_full = outputs_and_grads(full_width)
    blocked, grads_blocked = outputs_and_grads(eager_attention)
    np.testing.assert_allclose(np.asarray(blocked), np.asarray(full), rtol=2e-5, atol=2e-5)
    for a, e in zip(grads_blocked, grads_full, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(e), rtol=2e-4, atol=2e-4)


def test_blocks_cover_the_sequence_once_and_the_span_is_the_scored_fraction() -> None:
    for s in [2, 127, 128, 255, 256, 300, 511, 2048, 5000, 8192]:
        blocks = query_blocks(s)
        assert blocks[0][0] == 0 and blocks[-1][1] == s
        assert all(a[1] == b[0] for a, b in itertools.pairwise(blocks))
        assert 1 <= len(blocks) <= 16
        scored = sum((e - st) * e for st, e in blocks)
        assert causal_key_span(s) * s == pytest.approx(scored)
    assert len(query_blocks(64)) == 1 and causal_key_span(64) == 64
    # a longer sequence never scores fewer keys (the planner's memory stays monotonic in the length)
    areas = [causal_key_span(s) * s for s in range(1, 5000)]
    assert all(b >= a for a, b in itertools.pairwise(areas))
    # n equal blocks score (n + 1) / 2n of the square
    assert causal_key_span(2048) / 2048 == pytest.approx(17 / 32)


def test_the_compiled_attention_skips_the_blocks_above_the_diagonal(monkeypatch) -> None:
    b, hkv, groups, s, hd = 1, 2, 1, 2048, 32
    q, k, v, g = _inputs(0, b, hkv, groups, s, hd)
    mask = _masks(b, s)["causal"][:1]

    def compiled(one_block: bool):
        monkeypatch.setattr(layers, "query_blocks", (lambda n: ((0, n),)) if one_block else query_blocks)
        step = jax.jit(jax.grad(lambda q, k, v: jnp.sum(eager_attention(q, k, v, mask, None, 0.2, None, groups) * g),
                                argnums=(0, 1, 2)))
        return step.lower(q, k, v).compile()

    def flops(c) -> float:
        cost = c.cost_analysis()
        return float((cost[0] if isinstance(cost, list) else cost)["flops"])

    full, blocked = compiled(True), compiled(False)
    # the gradient needs five score-sized GEMMs of 2*s*s*hd each (q k^T, then dv, dp, dq, dk; the forward's p v is
    # dead under grad); the softmax and its backward are score-sized too: all of it shrinks to the scored fraction
    assert flops(full) >= 5 * 2 * b * hkv * groups * s * s * hd
    assert flops(blocked) / flops(full) == pytest.approx(causal_key_span(s) / s, abs=0.02)
    # the float32 probabilities kept for the backward shrink with the scores (XLA:CPU's concurrency-optimized
    # scheduler keeps several blocks' working sets side by side, so the temporaries land between the scored
    # fraction and the square: 46.0 vs 67.1 MB measured; a prefix copy of k and v per block would add more)
    scores_bytes = 4 * b * hkv * groups * s * s
    full_temp, blocked_temp = full.memory_analysis().temp_size_in_bytes, blocked.memory_analysis().temp_size_in_bytes
    assert full_temp >= scores_bytes
    assert scores_bytes * causal_key_span(s) / s <= blocked_temp < 0.8 * full_temp
