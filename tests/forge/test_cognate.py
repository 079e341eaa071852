"""Cognate's mechanisms against their papers' equations, written independently here (torch autograd, numpy loops),
and the Hugging Face export against the engine (transformers with trust_remote_code, fp32)."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
torch = pytest.importorskip("torch")
import jax.numpy as jnp  # noqa: E402

from aegis.forge.cognate.hyperparams import TINY_MODEL, CognateConfig  # noqa: E402
from aegis.forge.cognate.model import act_weights, attention_mask, forward, init_params, mag_gate, memory_scan  # noqa: E402


def _rand(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def _memory_inputs(seed=0, n=3, c=2, m=3, s=5):
    rng = np.random.default_rng(seed)
    return dict(w1=_rand(rng, m, s, scale=0.5), w2=_rand(rng, s, m, scale=0.5), q=_rand(rng, n, c, m),
                k=_rand(rng, n, c, m), v=_rand(rng, n, c, m), theta=rng.uniform(0.05, 0.3, (n, c)).astype(np.float32),
                eta=rng.uniform(0.5, 0.95, n).astype(np.float32), alpha=rng.uniform(0.01, 0.2, n).astype(np.float32))


def _reference_memory(x):
    """Titans eqs. (12)-(14), chunked: l = sum_t theta_t ||M(k_t) - v_t||^2 with M(x) = silu(x W1) W2; the gradient by
    torch autograd; S_n = eta_n S_{n-1} - grad l(M_{n-1}); M_n = (1 - alpha_n) M_{n-1} + S_n; read y = M_{n-1}(q)."""
    W = [torch.tensor(x["w1"], dtype=torch.float64), torch.tensor(x["w2"], dtype=torch.float64)]
    S = [torch.zeros_like(w) for w in W]
    outs = []
    for n in range(x["q"].shape[0]):
        q, k, v = (torch.tensor(x[a][n], dtype=torch.float64) for a in ("q", "k", "v"))
        outs.append((torch.nn.functional.silu(q @ W[0]) @ W[1]).numpy())
        w = [t.clone().requires_grad_(True) for t in W]
        pred = torch.nn.functional.silu(k @ w[0]) @ w[1]
        loss = (torch.tensor(x["theta"][n], dtype=torch.float64)[:, None] * (pred - v) ** 2).sum()
        grads = torch.autograd.grad(loss, w)
        S = [float(x["eta"][n]) * s_ - g for s_, g in zip(S, grads)]
        W = [(1 - float(x["alpha"][n])) * w_ + s_ for w_, s_ in zip(W, S)]
    return np.stack(outs), [t.numpy() for t in W + S]


def _run_scan(x):
    outs, final = memory_scan(*(jnp.asarray(x[a]) for a in ("w1", "w2", "q", "k", "v", "theta", "eta", "alpha")))
    return np.asarray(outs), [np.asarray(f) for f in final]


def test_memory_update_is_the_gradient_of_the_associative_loss_with_momentum_and_forgetting():
    x = _memory_inputs()
    outs, final = _run_scan(x)
    ref_outs, ref_final = _reference_memory(x)
    np.testing.assert_allclose(outs, ref_outs, atol=1e-5, rtol=1e-5)
    for got, want in zip(final, ref_final):  # W1, W2, S1, S2
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)


def test_forgetting_gate_alone_decays_the_memory_geometrically():
    x = _memory_inputs(seed=1)
    x["theta"][:] = 0.0  # no surprise: S stays 0, M_n = (1 - alpha_n) M_{n-1}
    _, (w1, w2, s1, s2) = _run_scan(x)
    decay = np.prod(1 - x["alpha"])
    np.testing.assert_allclose(w1, decay * x["w1"], rtol=1e-6)
    np.testing.assert_allclose(w2, decay * x["w2"], rtol=1e-6)
    assert not s1.any() and not s2.any()


def test_momentum_carries_past_surprise():
    """S_2 = eta_2 S_1 - g_2 with S_1 = -g_1: the first chunk's surprise still moves the memory after it."""
    x = _memory_inputs(seed=2, n=2)
    x["alpha"][:] = 0.0
    _, (w1, _, s1, _) = _run_scan(x)
    no_momentum = dict(x, eta=np.zeros(2, np.float32))
    _, (w1_0, _, s1_0, _) = _run_scan(no_momentum)
    _, ref = _reference_memory(x)
    np.testing.assert_allclose(s1, ref[2], atol=1e-5)
    g1 = -_run_scan(dict(x, q=x["q"][:1], k=x["k"][:1], v=x["v"][:1], theta=x["theta"][:1], eta=x["eta"][:1],
                         alpha=x["alpha"][:1]))[1][2]  # S_1 = -g_1
    np.testing.assert_allclose(s1 - s1_0, -x["eta"][1] * g1, atol=1e-5)  # only the eta_2 S_1 term differs
    assert np.abs(w1 - w1_0).max() > 1e-4


def test_mag_gate_is_a_sigmoid_mix_of_the_normalised_branches():
    rng = np.random.default_rng(3)
    d = 6
    y, m = _rand(rng, 2, 4, d), _rand(rng, 2, 4, d, scale=3.0)
    lp = {"gate.attn_norm.weight": _rand(rng, d), "gate.mem_norm.weight": _rand(rng, d),
          "gate.attn_weight": _rand(rng, d), "gate.mem_weight": _rand(rng, d), "gate.bias": _rand(rng, d)}
    o, g = mag_gate(jnp.asarray(y), jnp.asarray(m), {k: jnp.asarray(v) for k, v in lp.items()}, 1e-6)

    def rms(a, w):
        return a / np.sqrt((a.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-6) * w

    yn, mn = rms(y, lp["gate.attn_norm.weight"]), rms(m, lp["gate.mem_norm.weight"])
    gate = 1 / (1 + np.exp(-(lp["gate.attn_weight"] * yn + lp["gate.mem_weight"] * mn + lp["gate.bias"])))
    np.testing.assert_allclose(np.asarray(g), gate, atol=1e-5)
    np.testing.assert_allclose(np.asarray(o), gate * yn + (1 - gate) * mn, atol=1e-5)


def _graves(h, threshold):
    """ACT (Graves 2016, eqs. 7-12) for one token, a loop: N = min{n : sum_{k<=n} h_k >= threshold} (the last
    pass at most), p_n = h_n (n < N), p_N = R = 1 - sum_{n<N} h_n, ponder = N + R."""
    total = 0.0
    p = np.zeros(len(h))
    for n, hn in enumerate(h, 1):
        if total + hn >= threshold or n == len(h):
            p[n - 1] = 1.0 - total
            return p, n, n + 1.0 - total
        p[n - 1] = hn
        total += hn
    raise AssertionError


@pytest.mark.parametrize("threshold", [0.5, 0.9, 0.99])
def test_act_halting_and_ponder_cost_are_graves(threshold):
    rng = np.random.default_rng(4)
    h = rng.uniform(0, 1, (3, 40)).astype(np.float32)
    h[:, 0] = [0.995, 0.3, 0.3]  # halts at the first pass
    h[:, 1] = [0.01, 0.01, 0.01]  # never reaches the threshold: the last pass takes the remainder
    w, steps, rem = (np.asarray(a) for a in act_weights(jnp.asarray(h), threshold))
    for t in range(h.shape[1]):
        p, n, ponder = _graves(h[:, t], threshold)
        np.testing.assert_allclose(w[:, t], p, atol=1e-6)
        assert steps[t] == n
        np.testing.assert_allclose(steps[t] + rem[t], ponder, atol=1e-6)
    np.testing.assert_allclose(w.sum(0), 1.0, atol=1e-6)


def test_attention_sees_persistent_tokens_and_a_causal_window():
    p, t, window = 3, 9, 4
    mask = np.asarray(attention_mask(p, t, window))
    for i in range(p + t):
        for j in range(p + t):
            assert mask[i, j] == (j < p or (j <= i and i - j < window))


TINY = CognateConfig(**{**TINY_MODEL, "vocab_size": 61, "ltm_slots": 32, "memory_chunk": 4, "window": 6,
                         "num_layers": 2, "act_threshold": 0.9})
_forward = jax.jit(forward, static_argnums=1)  # one compile for the tests below (same config, same shape)


def _noisy_params(cfg, seed=0):
    params = init_params(cfg, jax.random.key(seed))
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(seed + 1), len(leaves))
    return jax.tree.unflatten(tree, [a + 0.2 * jax.random.normal(k, a.shape) for a, k in zip(leaves, keys)])


@pytest.mark.slow
def test_a_token_sees_no_later_token():
    params = _noisy_params(TINY)
    ids = np.random.default_rng(5).integers(0, 61, (2, 19))
    changed = ids.copy()
    changed[0, 9:] = (changed[0, 9:] + 7) % 61
    a = np.asarray(_forward(params, TINY, jnp.asarray(ids))["logits"])
    b = np.asarray(_forward(params, TINY, jnp.asarray(changed))["logits"])
    np.testing.assert_allclose(a[0, :9], b[0, :9], atol=1e-5)
    assert np.abs(a[0, 9:] - b[0, 9:]).max() > 1e-3


def test_default_size_is_the_seeds_25m():
    assert 22e6 < CognateConfig().num_parameters() < 28e6
    cfg = CognateConfig()
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.max_passes) == (8, 512, 8, 3)


def test_export_loads_in_transformers_with_the_engines_logits(tmp_path):
    transformers = pytest.importorskip("transformers")
    from aegis.forge.cognate.hf_folder import load_pretrained, save_pretrained

    cfg = TINY
    params = _noisy_params(cfg)
    ids = np.random.default_rng(6).integers(0, 61, (2, 19))
    out = _forward(params, cfg, jnp.asarray(ids))
    folder = save_pretrained(params, cfg, tmp_path / "cognate")
    config = __import__("json").loads((folder / "config.json").read_text())
    assert config["auto_map"]["AutoModelForCausalLM"] == "modeling_cognate.CognateForCausalLM"
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True, dtype=torch.float32)
    model.eval()
    assert sum(p.numel() for p in model.parameters()) == cfg.num_parameters()
    with torch.no_grad():
        got = model(torch.tensor(ids))
    diff = np.abs(got.logits.numpy() - np.asarray(out["logits"])).max()
    assert diff < 1e-4, diff
    np.testing.assert_allclose(got.steps.numpy(), np.asarray(out["steps"]))
    np.testing.assert_allclose(got.memory_usage.numpy(), np.asarray(out["memory_usage"]), atol=1e-5)
    gen = model.generate(torch.tensor(ids[:1, :5]), max_new_tokens=4, do_sample=False)
    assert gen.shape == (1, 9)
    with torch.no_grad():  # greedy: each new token is the argmax of the full forward on the prefix
        for t in range(5, 9):
            assert int(model(gen[:, :t]).logits[0, -1].argmax()) == int(gen[0, t])
    back, cfg2 = load_pretrained(folder)
    assert cfg2 == cfg
    np.testing.assert_array_equal(np.asarray(_forward(back, cfg2, jnp.asarray(ids))["logits"]),
                                  np.asarray(out["logits"]))
