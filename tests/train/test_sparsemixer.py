"""Phi-MoE's sparsemixer routing in training mode, against transformers' own function with the same draws.

transformers samples with ``Tensor.exponential_`` (Gumbel: ``masked - log(E)``) and ``torch.rand_like`` /
``Tensor.uniform_`` (Heun's midpoint mask). The test feeds both implementations the same numbers: the engine
takes Gumbel noise ``-log(E)`` and the uniforms; transformers' draws are replaced by those E and uniforms.
Weights, chosen experts and the gradient of a weighted sum of the weights with respect to the router logits
(transformers' ``PhimoeMultiplier.backward``) must agree.
"""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from aegis.train.modeling.gpt_oss_phimoe import sparsemixer_noise, sparsemixer_top2


@contextlib.contextmanager
def _draws(exponentials: list[np.ndarray], uniforms: list[np.ndarray]):
    """transformers' sparsemixer draws, in its order: ``exponential_`` then ``rand_like`` for the first expert;
    ``exponential_``, then ``rand_like(...).uniform_()`` for the second (the uniform_ value is the one used)."""
    exp_queue, calls = list(exponentials), []
    original = (torch.Tensor.exponential_, torch.rand_like, torch.Tensor.uniform_)

    def exponential_(self, *args, **kwargs):
        return self.copy_(torch.from_numpy(exp_queue.pop(0)).reshape(self.shape))

    def rand_like(t, *args, **kwargs):
        calls.append(t)
        return torch.from_numpy(uniforms[min(len(calls), 2) - 1]).reshape(t.shape).to(t.dtype).clone()

    def uniform_(self, *args, **kwargs):
        return self.copy_(torch.from_numpy(uniforms[1]).reshape(self.shape))

    torch.Tensor.exponential_, torch.rand_like, torch.Tensor.uniform_ = exponential_, rand_like, uniform_
    try:
        yield
    finally:
        torch.Tensor.exponential_, torch.rand_like, torch.Tensor.uniform_ = original
    assert not exp_queue and len(calls) == 2


def _transformers(scores: np.ndarray, upstream: np.ndarray, eps: float, exps, unis):
    from transformers.models.phimoe.modeling_phimoe import sparsemixer

    s = torch.tensor(scores, requires_grad=True)
    with _draws(exps, unis):
        weights, experts = sparsemixer(s, jitter_eps=eps, training=True, top_k=2)
    (weights * torch.from_numpy(upstream)).sum().backward()
    return weights.detach().numpy(), experts.numpy(), s.grad.numpy()


def _engine(scores: np.ndarray, upstream: np.ndarray, eps: float, gumbels, unis):
    noise = tuple((jnp.asarray(g), jnp.asarray(u)) for g, u in zip(gumbels, unis))

    def total(s):
        w, _ = sparsemixer_top2(s, eps, noise)
        return jnp.sum(w * upstream)

    weights, experts = sparsemixer_top2(jnp.asarray(scores), eps, noise)
    grad = jax.grad(total)(jnp.asarray(scores))
    return np.asarray(weights), np.asarray(experts), np.asarray(grad)


@pytest.mark.parametrize("eps", [0.01, 0.5])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_training_mode_matches_transformers_with_the_same_draws(eps: float, seed: int) -> None:
    rng = np.random.default_rng(seed)
    tokens, experts = 96, 8
    scores = (rng.standard_normal((tokens, experts)) * 2).astype(np.float32)
    upstream = rng.standard_normal((tokens, 2)).astype(np.float32)
    exps = [rng.exponential(size=(tokens, experts)).astype(np.float32) for _ in range(2)]
    unis = [rng.uniform(size=(tokens,)).astype(np.float32) for _ in range(2)]
    gumbels = [-np.log(e) for e in exps]

    tw, te, tg = _transformers(scores, upstream, eps, exps, [u.reshape(tokens, 1) for u in unis])
    ew, ee, eg = _engine(scores, upstream, eps, gumbels, unis)

    np.testing.assert_array_equal(ee, te)
    np.testing.assert_allclose(ew, tw, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(eg, tg, rtol=1e-5, atol=1e-6)
    if eps >= 0.5:  # the draws matter: a sampled expert is not the arg-max, and Heun's mask scales a weight
        assert (te[:, 0] != scores.argmax(-1)).any()
        unmasked = _engine(scores, upstream, eps, gumbels, [np.ones(tokens, np.float32)] * 2)[0]
        assert np.isclose(tw, np.float32(0.3333) * unmasked).any()


def test_eval_mode_is_the_arg_max_and_training_draws_come_from_the_key() -> None:
    scores = jax.random.normal(jax.random.key(0), (32, 8)) * 3
    w, e = sparsemixer_top2(scores, 0.01)
    assert (np.asarray(e[:, 0]) == np.asarray(jnp.argmax(scores, -1))).all()
    a = sparsemixer_top2(scores, 0.5, sparsemixer_noise(jax.random.key(1), 32, 8))
    b = sparsemixer_top2(scores, 0.5, sparsemixer_noise(jax.random.key(1), 32, 8))
    c = sparsemixer_top2(scores, 0.5, sparsemixer_noise(jax.random.key(2), 32, 8))
    np.testing.assert_array_equal(np.asarray(a[1]), np.asarray(b[1]))
    assert not np.array_equal(np.asarray(a[1]), np.asarray(c[1])) or not np.array_equal(
        np.asarray(a[0]), np.asarray(c[0]))


def test_a_training_call_samples_its_routes_and_eval_stays_the_arg_max() -> None:
    """A Phi-MoE model called with a step's ``rng`` routes by sampling (the logits change with the key, and
    not without one); ``input_jitter_noise`` scales the input only then. A family without random ops gives
    the same logits with or without the key."""
    from conftest import tiny_config

    from aegis.train.modeling import build_model

    ids = jnp.asarray(np.random.default_rng(0).integers(0, 256, (2, 16)), jnp.int32)
    for jitter in (0.0, 0.01):
        model = build_model({**tiny_config("phimoe"), "router_jitter_noise": 0.5, "input_jitter_noise": jitter})
        params = model.init(jax.random.key(0))
        run = jax.jit(model.apply)
        plain = np.asarray(run(params, ids))
        np.testing.assert_array_equal(plain, np.asarray(run(params, ids)))
        a, b = np.asarray(run(params, ids, rng=jax.random.key(1))), np.asarray(run(params, ids, rng=jax.random.key(1)))
        np.testing.assert_array_equal(a, b)
        assert not np.allclose(a, plain)
        assert not np.allclose(a, np.asarray(run(params, ids, rng=jax.random.key(2))))
    llama = build_model(tiny_config("llama"))
    params = llama.init(jax.random.key(0))
    np.testing.assert_array_equal(np.asarray(llama.apply(params, ids)),
                                  np.asarray(llama.apply(params, ids, rng=jax.random.key(1))))
