"""Muon x Grokfast with QK-clip against its references: Grokfast's formula and grokfast-pytorch, optax.contrib.muon,
the SVD (Newton-Schulz), and the attention logits themselves (QK-clip)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from aegis.forge import optim


def _grads(seed: int, n: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"w": rng.normal(size=(5, 3)).astype(np.float32), "b": rng.normal(size=(3,)).astype(np.float32)}
            for _ in range(n)]


def test_grokfast_ema_is_gradfilter_ema_on_random_gradients():
    alpha, lamb = 0.9, 2.5
    tx = optim.grokfast_ema(alpha, lamb)
    state = tx.init({"w": jnp.zeros((5, 3)), "b": jnp.zeros(3)})
    ema = None
    for g in _grads(0, 12):
        out, state = tx.update(jax.tree.map(jnp.asarray, g), state)
        # Grokfast's gradfilter_ema (Lee et al. 2024, grokfast.py): first call stores the gradient itself
        ema = dict(g) if ema is None else {k: ema[k] * alpha + g[k] * (1 - alpha) for k in g}
        for k in g:
            np.testing.assert_allclose(out[k], g[k] + lamb * ema[k], rtol=1e-6, atol=1e-6)


def test_grokfast_ema_then_adam_matches_grokfast_pytorch():
    torch = pytest.importorskip("torch")
    gp = pytest.importorskip("grokfast_pytorch")
    alpha, lamb, lr = 0.95, 1.5, 1e-2
    w0 = np.random.default_rng(1).normal(size=(4, 6)).astype(np.float32)
    p = torch.nn.Parameter(torch.tensor(w0.copy()))
    opt = gp.GrokFastAdamW([p], lr=lr, betas=(0.9, 0.99), eps=1e-8, grokfast_alpha=alpha, grokfast_lamb=lamb)
    # GrokFastAdamW divides lr by (1 + lamb) and clamps sqrt(v_hat) at eps instead of adding it
    tx = optax.chain(optim.grokfast_ema(alpha, lamb), optax.scale_by_adam(0.9, 0.99, eps=0.0),
                     optax.scale(-lr / (1 + lamb)))
    w = jnp.asarray(w0)
    state = tx.init(w)
    for g in np.random.default_rng(2).normal(size=(15, 4, 6)).astype(np.float32):
        p.grad = torch.tensor(g.copy())
        opt.step()
        u, state = tx.update(jnp.asarray(g), state, w)
        w = optax.apply_updates(w, u)
    np.testing.assert_allclose(np.asarray(w), p.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_newton_schulz_keeps_singular_vectors_and_flattens_values():
    x = jax.random.normal(jax.random.key(0), (2, 16, 8))  # a stack of two tall matrices
    o = optim.newton_schulz(x)
    for i in range(2):
        u, s, vt = np.linalg.svd(np.asarray(x[i]), full_matrices=False)
        m = u.T @ np.asarray(o[i]) @ vt.T  # O = U S' V^T: diagonal in x's singular bases, S' near 1 (Jordan's quintic)
        np.testing.assert_allclose(m - np.diag(np.diag(m)), 0.0, atol=1e-4)
        assert 0.5 < np.diag(m).min() and np.diag(m).max() < 1.25
    ref = optax.contrib._muon.orthogonalize_via_newton_schulz(x[0], jnp.asarray(optim.NS_COEFFS))
    np.testing.assert_allclose(o[0], ref, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("consistent_rms", [0.2, None])
def test_muon_equals_optax_contrib_muon(consistent_rms):
    rng = np.random.default_rng(3)
    params = {"w": jnp.asarray(rng.normal(size=(6, 4)), jnp.float32), "b": jnp.asarray(rng.normal(size=(4,)), jnp.float32)}
    labels = lambda p: jax.tree.map(lambda x: "muon" if x.ndim == 2 else "adam", p)  # noqa: E731
    ours = optim.muon(1e-2, labels=labels, consistent_rms=consistent_rms, weight_decay=0.0)
    # optax treats a 2-D weight as [in, out]; ours as HF's [out, in]: give optax the transpose
    ref = optax.contrib.muon(1e-2, consistent_rms=consistent_rms)
    tr = lambda t: {"w": t["w"].T, "b": t["b"]}  # noqa: E731
    p_o, p_r = params, tr(params)
    s_o, s_r = ours.init(p_o), ref.init(p_r)
    for _ in range(6):
        g = {"w": jnp.asarray(rng.normal(size=(6, 4)), jnp.float32), "b": jnp.asarray(rng.normal(size=(4,)), jnp.float32)}
        u_o, s_o = ours.update(g, s_o, p_o)
        u_r, s_r = ref.update(tr(g), s_r, p_r)
        p_o, p_r = optax.apply_updates(p_o, u_o), optax.apply_updates(p_r, u_r)
    np.testing.assert_allclose(p_o["w"], p_r["w"].T, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(p_o["b"], p_r["b"], rtol=1e-5, atol=1e-6)


def test_muon_labels_send_embeddings_head_and_vectors_to_adam():
    params = {"lm_head": {"weight": jnp.zeros((8, 4))}, "model": {"embed_tokens": {"weight": jnp.zeros((8, 4))},
              "layers": {"q_proj": {"weight": jnp.zeros((2, 4, 4))}, "norm": {"weight": jnp.zeros((2, 4))}}}}
    labels = optim.muon_labels(params)
    assert labels["lm_head"]["weight"] == "adam" and labels["model"]["embed_tokens"]["weight"] == "adam"
    assert labels["model"]["layers"]["q_proj"]["weight"] == "muon"
    assert labels["model"]["layers"]["norm"]["weight"] == "adam"  # [layers, d]: stacked vectors, not matrices
    assert optim.muon_labels({"x": jnp.zeros(3)})["x"] == "adam"


@pytest.mark.parametrize("heads,kv", [(4, 4), (4, 2)])
def test_qk_clip_caps_each_heads_largest_logit_at_tau(heads, kv):
    d_model, hd, s = 16, 4, 7
    k0, k1, k2 = jax.random.split(jax.random.key(1), 3)
    x = jax.random.normal(k0, (2, s, d_model))
    wq = jax.random.normal(k1, (1, heads * hd, d_model)) * jnp.repeat(jnp.array([3.0, 0.2, 2.0, 0.1])[:heads], hd)[:, None]
    wk = jax.random.normal(k2, (1, kv * hd, d_model))

    def logits(wq, wk):
        q = (x @ wq[0].T).reshape(2, s, heads, hd)
        k = (x @ wk[0].T).reshape(2, s, kv, hd)
        return optim.max_attention_logits(q, k)

    before = logits(wq, wk)
    tau = float(np.median(np.asarray(before)))
    params = {"model": {"layers": {"self_attn": {"q_proj": {"weight": wq}, "k_proj": {"weight": wk}}}}}
    out = optim.qk_clip(params, before[None], tau, num_heads=heads, num_kv_heads=kv, head_dim=hd)
    attn = out["model"]["layers"]["self_attn"]
    after = logits(attn["q_proj"]["weight"], attn["k_proj"]["weight"])
    expect = np.minimum(np.asarray(before), tau)
    np.testing.assert_allclose(after, expect, rtol=1e-5)  # clipped heads at tau, the others unchanged
    if heads == kv:  # Kimi K2: sqrt(tau / max) on both projections of a clipped head
        gamma = np.minimum(1.0, tau / np.asarray(before))
        np.testing.assert_allclose(attn["q_proj"]["weight"][0].reshape(heads, hd, -1),
                                   np.asarray(wq[0]).reshape(heads, hd, -1) * np.sqrt(gamma)[:, None, None], rtol=1e-6)


@pytest.mark.slow
def test_presets_are_the_seeds_three_settings_and_the_chain_trains():
    assert optim.preset("pretrain") == optim.MuonGrokfastPreset(1e-3, 0.3, 30.0, 0.0)
    assert optim.preset("bake") == optim.MuonGrokfastPreset(1e-4, 0.2, 30.0, 0.0)
    assert optim.preset("rl") == optim.MuonGrokfastPreset(5e-4, 0.1, 25.0, 0.1)
    from aegis.errors import AegisError

    with pytest.raises(AegisError, match="pretrain, bake, rl"):
        optim.preset("warmup")
    # least squares: loss falls under the pretrain chain (clip -> grokfast -> muon/adamw)
    k0, k1 = jax.random.split(jax.random.key(0))
    a, y = jax.random.normal(k0, (32, 8)), jax.random.normal(k1, (32, 4))
    params = {"w": jnp.zeros((4, 8)), "b": jnp.zeros(4)}
    loss = lambda p: jnp.mean((a @ p["w"].T + p["b"] - y) ** 2)  # noqa: E731
    tx = optim.muon_grokfast("pretrain", lr=3e-2)
    state = tx.init(params)
    first = float(loss(params))
    for _ in range(30):
        u, state = tx.update(jax.grad(loss)(params), state, params)
        params = optax.apply_updates(params, u)
    assert float(loss(params)) < 0.8 * first
