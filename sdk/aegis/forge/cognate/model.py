"""Cognate in JAX: Titans-MAG layers inside a Tiny-Recursive-Model loop with ACT halting. Pure functions over a dict.

    params = init_params(cfg, jax.random.key(0))
    out = forward(params, cfg, ids)          # ids (B, T) int32
    out["logits"], out["pass_logits"], out["steps"], out["ponder"], out["memory_usage"]
    loss, metrics = lm_loss(params, cfg, ids)

One layer (Behrouz et al., *Titans*, 2024, the MAG variant), on x~ = [persistent tokens p_1..p_Np || x]:

    y = SW-Attn*(x~)                   causal attention over the persistent tokens and the last ``window`` inputs
    m = M_{n-1}(q_t)                   retrieval from the neural memory as it stood before the token's chunk
    o = g * y^ + (1 - g) * m^,  g = sigmoid(u_a * y^ + u_m * m^ + b)   y^ = RMSNorm_a(y), m^ = RMSNorm_m(m)

The neural long-term memory is an MLP M(x) = silu(x W1) W2 (``ltm_slots`` hidden units) whose weights learn at
test time, one chunk of ``memory_chunk`` tokens at a time (:func:`memory_scan`):

    l(M; x_t) = theta_t * ||M(k_t) - v_t||^2            the associative loss, theta_t the token's inner lr
    S_n = eta_n * S_{n-1} - grad_M sum_{t in n} l(M_{n-1}; x_t)     momentum: the "surprise"
    M_n = (1 - alpha_n) * M_{n-1} + S_n                            the forgetting gate

The recursive loop (Jolicoeur-Martineau, *Less is More: Recursive Reasoning with Tiny Networks*, 2025) keeps an
answer latent y and a reasoning latent z (both start at zero); every pass runs the backbone, z = f(x + y + z), y = y + RMSNorm(z) W_y,
and reads out logits_k = RMSNorm(y) E^T and a halting probability h_k = sigmoid(w . RMSNorm(y) + b). Latents are
detached between passes (deep supervision: each pass has its own loss). ACT (Graves, 2016) mixes the passes:
N = min{n : sum_{k<=n} h_k >= threshold} (at most ``max_passes``), R = 1 - sum_{k<N} h_k, weights h_1..h_{N-1}, R,
ponder cost N + R. Parameters use the exported names and torch's layout (a linear weight is (out, in)).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from aegis.forge.cognate.hyperparams import CognateConfig, param_shapes

__all__ = ["init_params", "forward", "lm_loss", "memory_scan", "mag_gate", "act_weights", "to_flat", "from_flat"]

_LAYER = "model.layers."
_UNROLL_UP_TO = 8


def _unroll(n: int) -> int:
    """Loops of at most :data:`_UNROLL_UP_TO` iterations (the passes, a small model's layers and chunks) are unrolled:
    XLA:CPU runs the backward of a rolled ``scan`` ~3x slower here (the tiny bake step: 0.72 -> 0.24 s of CPU),
    and longer loops stay rolled so a real-scale program compiles in bounded time."""
    return n if n <= _UNROLL_UP_TO else 1


def _layer_names(cfg: CognateConfig) -> list[str]:
    return [k[len(_LAYER) + 2:] for k in param_shapes(cfg) if k.startswith(_LAYER + "0.")]


def init_params(cfg: CognateConfig, key: jax.Array) -> dict[str, Any]:
    """Random parameters: normal(0, initializer_range) matrices, ones for norms, the gates' biases set so the
    memory starts slow (theta ~ 0.12 max_lr), remembering (alpha ~ 0.05) and with momentum ~0.9."""
    shapes = param_shapes(cfg)
    std = cfg.initializer_range
    consts = {"norm.weight": 1.0, "attn_weight": 1.0, "mem_weight": 1.0, "gate.bias": 0.0, "lr_proj.bias": -2.0,
              "momentum_proj.bias": 2.0, "decay_proj.bias": -3.0, "halt_proj.bias": -1.0}
    flat = {}
    keys = jax.random.split(key, len(shapes))
    for k, (name, shape) in zip(keys, shapes.items()):
        const = next((v for suffix, v in consts.items() if name.endswith(suffix)), None)
        if const is not None:
            flat[name] = jnp.full(shape, const, jnp.float32)
        elif name.endswith(("memory.w1", "memory.w2")):
            flat[name] = jax.random.normal(k, shape, jnp.float32) * (1.0 / shape[0]) ** 0.5
        else:
            flat[name] = jax.random.normal(k, shape, jnp.float32) * std
    return from_flat(flat, cfg)


def from_flat(flat: dict[str, Any], cfg: CognateConfig) -> dict[str, Any]:
    """Exported names -> the engine's tree (layer tensors stacked on a leading axis under ``"layers"``)."""
    tree = {k: jnp.asarray(v) for k, v in flat.items() if not k.startswith(_LAYER)}
    tree["layers"] = {n: jnp.stack([jnp.asarray(flat[f"{_LAYER}{i}.{n}"]) for i in range(cfg.num_layers)])
                      for n in _layer_names(cfg)}
    return tree


def to_flat(params: dict[str, Any]) -> dict[str, Any]:
    """The engine's tree -> exported names (inverse of :func:`from_flat`)."""
    flat = {k: v for k, v in params.items() if k != "layers"}
    for n, stacked in params["layers"].items():
        for i in range(stacked.shape[0]):
            flat[f"{_LAYER}{i}.{n}"] = stacked[i]
    return flat


def _rms(x: jax.Array, w: jax.Array, eps: float) -> jax.Array:
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _l2norm(x: jax.Array) -> jax.Array:
    return x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), 1e-6)


def _rope(length: int, dim: int, theta: float) -> tuple[jax.Array, jax.Array]:
    inv = 1.0 / theta ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim)
    freqs = jnp.arange(length, dtype=jnp.float32)[:, None] * inv[None, :]
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb), jnp.sin(emb)


def _rotate(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    half = x.shape[-1] // 2
    rot = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rot * sin


def attention_mask(num_persistent: int, length: int, window: int) -> jax.Array:
    """(P+T, P+T) boolean: every position sees the persistent tokens, and itself and the ``window - 1`` before it."""
    i = jnp.arange(num_persistent + length)[:, None]
    j = jnp.arange(num_persistent + length)[None, :]
    return (j < num_persistent) | ((j <= i) & (i - j < window))


def memory_scan(w1, w2, q, k, v, theta, eta, alpha):
    """The neural memory over a sequence of chunks (batch-free; ``jax.vmap`` it over the batch).

    w1 (m, s), w2 (s, m): M_0; q, k, v (n, c, m): per chunk; theta (n, c): inner lr per token (0 on padding);
    eta, alpha (n,): momentum and forgetting per chunk. Returns the retrievals (n, c, m), read from M_{n-1}, and
    the final (W1, W2, S1, S2). The gradient of sum_t theta_t ||M(k_t) - v_t||^2 is written out (a 2-layer MLP
    with SiLU), so the test can check it against autograd."""

    def step(carry, xs):
        W1, W2, S1, S2 = carry
        qc, kc, vc, th, et, al = xs
        out = jax.nn.silu(qc @ W1) @ W2
        h = kc @ W1
        a = jax.nn.silu(h)
        r = a @ W2 - vc
        dp = 2.0 * th[:, None] * r
        g2 = a.T @ dp
        sig = jax.nn.sigmoid(h)
        dh = (dp @ W2.T) * (sig * (1.0 + h * (1.0 - sig)))
        g1 = kc.T @ dh
        S1 = et * S1 - g1
        S2 = et * S2 - g2
        W1 = (1.0 - al) * W1 + S1
        W2 = (1.0 - al) * W2 + S2
        return (W1, W2, S1, S2), out

    init = (w1, w2, jnp.zeros_like(w1), jnp.zeros_like(w2))
    final, outs = jax.lax.scan(step, init, (q, k, v, theta, eta, alpha), unroll=_unroll(q.shape[0]))
    return outs, final


def _memory(lp: dict[str, Any], xn: jax.Array, cfg: CognateConfig) -> jax.Array:
    """The memory branch of one layer: (B, L, D) -> (B, L, D)."""
    b, length, _ = xn.shape
    c = cfg.memory_chunk
    n = -(-length // c)
    pad = n * c - length
    q = _l2norm(jax.nn.silu(xn @ lp["memory.q_proj.weight"].T))
    k = _l2norm(jax.nn.silu(xn @ lp["memory.k_proj.weight"].T))
    v = jax.nn.silu(xn @ lp["memory.v_proj.weight"].T)
    theta = cfg.memory_max_lr * jax.nn.sigmoid(xn @ lp["memory.lr_proj.weight"][0] + lp["memory.lr_proj.bias"][0])
    real = jnp.ones((b, length), xn.dtype)

    def chunks(t):
        t = jnp.pad(t, [(0, 0), (0, pad)] + [(0, 0)] * (t.ndim - 2))
        return t.reshape(b, n, c, *t.shape[2:])

    q, k, v, theta, real, xc = map(chunks, (q, k, v, theta, real, xn))
    mean = jnp.sum(xc, axis=2) / jnp.sum(real, axis=2)[..., None]
    eta = jax.nn.sigmoid(mean @ lp["memory.momentum_proj.weight"][0] + lp["memory.momentum_proj.bias"][0])
    alpha = jax.nn.sigmoid(mean @ lp["memory.decay_proj.weight"][0] + lp["memory.decay_proj.bias"][0])
    outs, _ = jax.vmap(memory_scan, in_axes=(None, None, 0, 0, 0, 0, 0, 0))(
        lp["memory.w1"], lp["memory.w2"], q, k, v, theta, eta, alpha)
    outs = outs.reshape(b, n * c, -1)[:, :length]
    return outs @ lp["memory.o_proj.weight"].T


def mag_gate(y: jax.Array, m: jax.Array, lp: dict[str, Any], eps: float) -> tuple[jax.Array, jax.Array]:
    """The MAG gate: o = g * y^ + (1 - g) * m^, g = sigmoid(u_a * y^ + u_m * m^ + b); returns (o, g)."""
    yn = _rms(y, lp["gate.attn_norm.weight"], eps)
    mn = _rms(m, lp["gate.mem_norm.weight"], eps)
    g = jax.nn.sigmoid(yn * lp["gate.attn_weight"] + mn * lp["gate.mem_weight"] + lp["gate.bias"])
    return g * yn + (1.0 - g) * mn, g


def _layer(h, lp, cfg: CognateConfig, cos, sin, mask):
    b, length, d = h.shape
    nh, hd = cfg.num_heads, cfg.head_dim
    xn = _rms(h, lp["attn_norm.weight"], cfg.rms_norm_eps)
    q = (xn @ lp["q_proj.weight"].T).reshape(b, length, nh, hd)
    k = (xn @ lp["k_proj.weight"].T).reshape(b, length, nh, hd)
    v = (xn @ lp["v_proj.weight"].T).reshape(b, length, nh, hd)
    q, k = _rotate(q, cos[:, None], sin[:, None]), _rotate(k, cos[:, None], sin[:, None])
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(jnp.float32(hd))
    scores = jnp.where(mask[None, None], scores, jnp.finfo(scores.dtype).min)
    max_logit = jax.lax.stop_gradient(scores.max(axis=(0, 2, 3)))  # (H,): QK-clip's statistic (masked: finfo.min)
    att = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v).reshape(b, length, d)
    y = att @ lp["o_proj.weight"].T
    m = _memory(lp, xn, cfg)
    o, g = mag_gate(y, m, lp, cfg.rms_norm_eps)
    h = h + o
    xn = _rms(h, lp["mlp_norm.weight"], cfg.rms_norm_eps)
    h = h + (jax.nn.silu(xn @ lp["gate_proj.weight"].T) * (xn @ lp["up_proj.weight"].T)) @ lp["down_proj.weight"].T
    return h, g, max_logit


def _backbone(params, cfg: CognateConfig, x):
    """Titans-MAG stack over [persistent || x]; returns the input positions' states, the mean memory share and
    each layer's largest pre-softmax attention logit per head (L, H)."""
    b, t, d = x.shape
    p = cfg.num_persistent
    h = jnp.concatenate([jnp.broadcast_to(params["model.persistent"], (b, p, d)), x], axis=1) if p else x
    cos, sin = _rope(p + t, cfg.head_dim, cfg.rope_theta)
    mask = attention_mask(p, t, cfg.window)

    def body(h, lp):
        h, g, max_logit = _layer(h, lp, cfg, cos, sin, mask)
        return h, (jnp.mean(1.0 - g[:, p:], axis=-1), max_logit)

    h, (usage, max_logits) = jax.lax.scan(body, h, params["layers"], unroll=_unroll(cfg.num_layers))
    return h[:, p:], jnp.mean(usage, axis=0), max_logits


def act_weights(halt: jax.Array, threshold: float) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Graves' ACT over passes: halt (K, ...) probabilities -> (weights (K, ...), N, R). N is the first pass whose
    running sum reaches ``threshold`` (the last pass at most); the weights are h_1..h_{N-1}, R = 1 - sum_{k<N} h_k."""
    kmax = halt.shape[0]
    cum = jnp.cumsum(halt, axis=0)
    before = jnp.concatenate([jnp.zeros_like(halt[:1]), cum[:-1]], axis=0)
    running = before < threshold
    last = jnp.arange(kmax).reshape((kmax,) + (1,) * (halt.ndim - 1)) == kmax - 1
    stops = running & ((cum >= threshold) | last)
    weights = jnp.where(stops, 1.0 - before, jnp.where(running, halt, 0.0))
    steps = jnp.sum(running, axis=0).astype(halt.dtype)
    remainder = jnp.sum(jnp.where(stops, 1.0 - before, 0.0), axis=0)
    return weights, steps, remainder


def forward(params: dict[str, Any], cfg: CognateConfig, ids: jax.Array, threshold: Any = None) -> dict[str, jax.Array]:
    """Logits (B, T, V) of the ACT mixture and the per-pass pieces: pass_logits (K, B, T, V), halt (K, B, T),
    weights (K, B, T), steps N (B, T), ponder N + R (B, T), memory_usage (B, T): the memory branch's share 1 - g
    of the MAG outputs (mean over layers and channels, mixed over passes by the ACT weights); hidden (B, T, D): the
    ACT mixture of the passes' normalised answer latents, so logits = hidden @ E^T (the head is tied and linear);
    max_logits (L, H): each layer's largest pre-softmax attention logit per head over the batch, positions and
    passes (no gradient), the statistic of QK-clip (:func:`aegis.forge.optim.qk_clip_heads`)."""
    eps = cfg.rms_norm_eps
    emb = params["model.embed_tokens.weight"]
    x = emb[ids]

    def one_pass(carry, _):
        y, z = jax.lax.stop_gradient(carry)  # deep supervision: each pass learns from its own loss
        z, usage, max_logits = _backbone(params, cfg, x + y + z)
        y = y + _rms(z, params["model.latent_norm.weight"], eps) @ params["model.y_proj.weight"].T
        yf = _rms(y, params["model.norm.weight"], eps)
        halt = jax.nn.sigmoid(yf @ params["model.halt_proj.weight"][0] + params["model.halt_proj.bias"][0])
        return (y, z), (yf @ emb.T, yf, halt, usage, max_logits)

    zeros = jnp.zeros_like(x)
    _, (pass_logits, states, halt, usage, max_logits) = jax.lax.scan(one_pass, (zeros, zeros), None,
                                                                     length=cfg.max_passes,
                                                                     unroll=_unroll(cfg.max_passes))
    weights, steps, remainder = act_weights(halt, cfg.act_threshold if threshold is None else threshold)
    mixed = jnp.einsum("kbt,kbtv->btv", weights, pass_logits)
    return {"logits": mixed, "pass_logits": pass_logits, "halt": halt, "weights": weights, "steps": steps,
            "ponder": steps + remainder, "memory_usage": jnp.sum(weights * usage, axis=0),
            "hidden": jnp.einsum("kbt,kbtd->btd", weights, states), "max_logits": jnp.max(max_logits, axis=0)}


def _ce(logits: jax.Array, ids: jax.Array) -> jax.Array:
    logp = jax.nn.log_softmax(logits[:, :-1], axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, ids[:, 1:, None], axis=-1))


def lm_loss(params: dict[str, Any], cfg: CognateConfig, ids: jax.Array,
            threshold: Any = None) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Next-token cross-entropy of the ACT mixture + ``deep_supervision`` x the passes' mean CE + ``ponder_weight``
    x the mean ponder cost; metrics: loss, ce, pass_ce (K,), ponder, steps, max_logits (L, H)."""
    out = forward(params, cfg, ids, threshold)
    ce = _ce(out["logits"], ids)
    pass_ce = jnp.stack([_ce(lg, ids) for lg in out["pass_logits"]])
    ponder = jnp.mean(out["ponder"][:, :-1])
    loss = ce + cfg.deep_supervision * jnp.mean(pass_ce) + cfg.ponder_weight * ponder
    return loss, {"loss": loss, "ce": ce, "pass_ce": pass_ce, "ponder": ponder, "steps": jnp.mean(out["steps"]),
                  "max_logits": out["max_logits"]}
