"""GPT-OSS and Phi-3.5-MoE (``phimoe``) for the JAX engine: decoder layers and checkpoint names
(their specs: `aegis.models.arch_spec`).

Each mirrors transformers 5's ``modeling_gpt_oss.py`` / ``modeling_phimoe.py``; the registry
(``families.FAMILIES``) lists them. The parameter tree follows the engine's conventions (fused experts
``gate_up_proj [E, 2I, d]`` with the gate half first, ``down_proj [E, d, I]``) and :func:`gpt_oss_recipe` /
:func:`phimoe_recipe` map it to the names and layouts transformers saves.

- **GPT-OSS**: q/k/v/o with biases; a learned per-head sink logit joins every attention softmax
  (``self_attn.sinks``, the column is dropped after the softmax); layers alternate sliding (window 128) and
  full attention; yarn RoPE (theta 150000, factor 32 over 4096 positions by default); RMSNorm as
  ``(w * norm(x)).to(dtype)``. The router (``mlp.router``, kept as ``mlp.gate`` in memory like the other
  MoEs' non-Linear routers: PEFT does not wrap it) has a bias; top-k on its logits, softmax over the k
  values. Experts carry biases; on disk ``gate_up_proj`` is ``[E, d, 2I]`` with gate and up *interleaved*
  (``[..., ::2]`` / ``[..., 1::2]``) and ``down_proj`` is ``[E, I, d]``; the activation is the clamped SwiGLU
  ``(clamp(up, -l, l) + 1) * g * sigmoid(alpha * g)``, ``g = clamp(gate, max=l)`` (alpha 1.702, l 7).
  **MXFP4**: the published gpt-oss-20b/120b checkpoints store the experts as MXFP4 blocks + scales
  (``quantization_config.quant_method = "mxfp4"``). The engine trains bf16 weights: the loader dequantises
  ``*_blocks`` / ``*_scales`` as it reads them (:func:`mxfp4_dequantize`, bit-equal to transformers'
  ``convert_moe_packed_tensors``) and a saved folder holds the bf16 experts without the quantization_config.
- **Phi-3.5-MoE**: LayerNorm (weight and bias) everywhere RMSNorm would be; attention biases per
  ``attention_bias``; ``lm_head`` bias per ``lm_head_bias``; the router is an ``nn.Linear`` named
  ``router`` (PEFT's ``"all-linear"`` wraps it, so the engine's LoRA does too); routing is sparsemixer's
  top-2: in eval the first expert is the arg-max, its weight the softmax over the logits within
  ``2 * router_jitter_noise`` (relative) of the max; the second the same over the rest. A training step
  (the model called with ``rng``) runs sparsemixer's training mode as transformers does: Gumbel-sampled
  experts, Heun's midpoint mask on their weights with the softmax's own gradient
  (:func:`sparsemixer_top2`), and the input scaled by ``U(1 - input_jitter_noise, 1 + input_jitter_noise)``
  once before router and experts (the authors' modeling code and transformers 4; transformers 5 applies it
  twice in place, in the block and again in the router). LongRoPE:
  transformers' Phi-MoE always uses the ``short_factor`` frequencies and scales cos/sin by
  ``short_mscale`` (``long_mscale`` past ``original_max_position_embeddings``); the engine takes both
  mscales equal (as the published config has them) and refuses a config where they differ.
  On disk the experts are Mixtral-style (``block_sparse_moe.experts.{e}.w1/w3/w2``, router ``gate``).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from aegis.errors import CheckpointError
from aegis.train.modeling.layers import (
    Ctx,
    _grouped_matmul,
    _sub,
    activation,
    attention_block,
    layer_norm,
    linear,
    rms_norm,
)
from aegis.train.modeling.rope import apply_rope
from aegis.models.shapes import ArchSpec

__all__ = [
    "gpt_oss_layer",
    "phimoe_layer",
    "gpt_oss_recipe",
    "phimoe_recipe",
    "layer_norm",
    "sparsemixer_top2",
]

# ----- blocks -------------------------------------------------------------------------------------------


def sink_attention(
    spec: ArchSpec,
    p: dict[str, Any],
    x: jax.Array,
    *,
    cos: jax.Array,
    sin: jax.Array,
    mask: jax.Array | None,
    ctx: Ctx,
    lora: dict[str, Any] | None = None,
) -> jax.Array:
    """GPT-OSS attention: eager scores with one learned sink logit per head appended to each softmax row
    (shifted by the row max, as transformers does), the sink's column dropped before the value matmul."""
    b, s, _ = x.shape
    q = linear(p["q_proj"], x, ctx, _sub(lora, "q_proj"), "q_proj").reshape(b, s, spec.num_heads, spec.head_dim)
    k = linear(p["k_proj"], x, ctx, _sub(lora, "k_proj"), "k_proj").reshape(b, s, spec.num_kv_heads, spec.head_dim)
    v = linear(p["v_proj"], x, ctx, _sub(lora, "v_proj"), "v_proj").reshape(b, s, spec.num_kv_heads, spec.head_dim)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    if mask is None:  # plain causal attention within ctx.window
        idx = jnp.arange(s)
        dist = idx[:, None] - idx[None, :]
        window = ctx.window if ctx.window is not None else s + 1
        mask = jnp.broadcast_to(((dist >= 0) & (dist < window))[None], (b, s, s))
    groups = spec.num_heads // spec.num_kv_heads
    qg = q.reshape(b, s, spec.num_kv_heads, groups, spec.head_dim)
    scores = jnp.einsum("bqhgd,bkhd->bhgqk", qg, k) * jnp.asarray(spec.attn_scale, q.dtype)
    scores = jnp.where(mask[:, None, None], scores.astype(jnp.float32), jnp.finfo(jnp.float32).min)
    sinks = p["sinks"].astype(jnp.float32).reshape(1, spec.num_kv_heads, groups, 1, 1)
    combined = jnp.concatenate([scores, jnp.broadcast_to(sinks, (*scores.shape[:-1], 1))], axis=-1)
    combined = combined - jax.lax.stop_gradient(jnp.max(combined, axis=-1, keepdims=True))
    probs = jax.nn.softmax(combined, axis=-1)[..., :-1].astype(v.dtype)
    out = jnp.einsum("bhgqk,bkhd->bqhgd", probs, v).reshape(b, s, spec.q_size)
    return linear(p["o_proj"], out, ctx, _sub(lora, "o_proj"), "o_proj")


def _route_to_experts(
    xf: jax.Array, top_w: jax.Array, top_i: jax.Array, num_experts: int
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array, jax.Array]:
    """Rows sorted by expert: (gathered inputs, token of each row, expert of each row, weight, group sizes)."""
    k = top_i.shape[-1]
    flat_e = top_i.reshape(-1)
    order = jnp.argsort(flat_e, stable=True)
    token = order // k
    group_sizes = jnp.bincount(flat_e, length=num_experts).astype(jnp.int32)
    return xf[token], token, flat_e[order], top_w.reshape(-1)[order], group_sizes


def _combine(out: jax.Array, weights: jax.Array, token: jax.Array, n_tokens: int, ctx: Ctx) -> jax.Array:
    out = (out.astype(jnp.float32) * weights[:, None].astype(jnp.float32)).astype(ctx.dtype)
    return jnp.zeros((n_tokens, out.shape[-1]), ctx.dtype).at[token].add(out)


def gpt_oss_moe(spec: ArchSpec, p: dict[str, Any], x: jax.Array, ctx: Ctx) -> jax.Array:
    """Router (with bias) -> top-k logits -> softmax over the k; experts with biases and the clamped SwiGLU."""
    m = spec.moe
    b, s, d = x.shape
    xf = x.reshape(b * s, d)
    logits = linear(p["gate"], xf, ctx)  # [t, E]
    top_v, top_i = jax.lax.top_k(logits, m.top_k)
    top_w = jax.nn.softmax(top_v.astype(jnp.float32), axis=-1).astype(logits.dtype)
    xs, token, expert, weights, sizes = _route_to_experts(xf, top_w, top_i, m.num_experts)
    e = p["experts"]
    h = _grouped_matmul(xs, e["gate_up_proj"], sizes, ctx.dtype) + e["gate_up_proj_bias"].astype(ctx.dtype)[expert]
    gate, up = jnp.split(h, 2, axis=-1)
    alpha, limit = spec.extra["swiglu_alpha"], spec.extra["swiglu_limit"]
    gate = jnp.minimum(gate, limit)
    up = jnp.clip(up, -limit, limit)
    h = (up + 1) * (gate * jax.nn.sigmoid(gate * alpha))
    out = _grouped_matmul(h, e["down_proj"], sizes, ctx.dtype) + e["down_proj_bias"].astype(ctx.dtype)[expert]
    return _combine(out, weights, token, b * s, ctx).reshape(b, s, d)


def sparsemixer_top2(
    scores: jax.Array, jitter_eps: float, noise: tuple[tuple[jax.Array, jax.Array], ...] | None = None
) -> tuple[jax.Array, jax.Array]:
    """transformers' ``sparsemixer``: ``(weights [t, 2], experts [t, 2])``.

    Eval (``noise`` None): expert 1 is the arg-max; its weight is its softmax probability over the logits whose
    relative gap to the max, ``(max - s) / max(|s|, max)``, is at most ``2 * jitter_eps`` (the rest masked to
    -inf). Expert 2 is the same over the logits with expert 1 removed.

    Training (``noise``: for each pick, Gumbel noise ``[t, E]`` and uniforms ``[t]``): each expert is sampled,
    the arg-max of the masked logits plus the Gumbel noise (transformers: ``masked - log(Exp(1))``), and its
    weight is multiplied by Heun's midpoint mask, 1 where the sample is the arg-max or the uniform exceeds 0.75,
    else 0.3333 (``0.3333 + 0.6667 * mask``); the gradient is the softmax probability's own
    (``PhimoeMultiplier.backward``: ``g * p_i * (onehot_i - p)``), the mask a constant in the value only."""
    neg_inf = jnp.asarray(-jnp.inf, scores.dtype)
    sg = jax.lax.stop_gradient(scores)

    def pick(masked: jax.Array, draw: tuple[jax.Array, jax.Array] | None) -> tuple[jax.Array, jax.Array]:
        top = jax.lax.stop_gradient(jnp.max(masked, axis=-1, keepdims=True))
        factor = jnp.maximum(jnp.abs(sg), top)
        drop = ((top - sg) / factor) > 2 * jitter_eps
        logits = jnp.where(drop, neg_inf, masked)
        gates = jax.nn.softmax(logits, axis=-1)
        if draw is None:
            idx = jnp.argmax(masked, axis=-1)
            return jnp.take_along_axis(gates, idx[:, None], axis=-1)[:, 0], idx
        gumbel, uniform = draw
        idx = jnp.argmax(jax.lax.stop_gradient(logits) + gumbel.astype(logits.dtype), axis=-1)
        weight = jnp.take_along_axis(gates, idx[:, None], axis=-1)[:, 0]
        one = (idx == jnp.argmax(jax.lax.stop_gradient(gates), axis=-1)) | (uniform > 0.75)
        mid = (jnp.float32(0.3333) + jnp.float32(0.6667) * one.astype(jnp.float32)).astype(weight.dtype)
        return weight + jax.lax.stop_gradient(weight * mid - weight), idx

    w1, i1 = pick(scores, None if noise is None else noise[0])
    first = jax.nn.one_hot(i1, scores.shape[-1], dtype=bool)
    w2, i2 = pick(jnp.where(first, neg_inf, scores), None if noise is None else noise[1])
    return jnp.stack([w1, w2], axis=-1), jnp.stack([i1, i2], axis=-1)


def sparsemixer_noise(key: jax.Array, tokens: int, experts: int) -> tuple[tuple[jax.Array, jax.Array], ...]:
    """The draws of one training-mode `sparsemixer_top2`: per pick, Gumbel ``[t, E]`` and uniform ``[t]``."""
    keys = jax.random.split(key, 4)
    return tuple((jax.random.gumbel(keys[2 * k], (tokens, experts), jnp.float32),
                  jax.random.uniform(keys[2 * k + 1], (tokens,), jnp.float32)) for k in range(2))


def phimoe_moe(spec: ArchSpec, p: dict[str, Any], x: jax.Array, ctx: Ctx, lora: dict[str, Any] | None) -> jax.Array:
    """Router (nn.Linear, LoRA-wrappable) -> sparsemixer top-2 -> SwiGLU experts (no biases)."""
    m = spec.moe
    b, s, d = x.shape
    xf = x.reshape(b * s, d)
    key = ctx.train_rng("sparsemixer")
    jitter = spec.extra.get("input_jitter_noise", 0.0)
    if key is not None and jitter > 0:  # training: router and experts both read the jittered input
        key, sub = jax.random.split(key)
        xf = xf * jax.random.uniform(sub, xf.shape, jnp.float32, 1.0 - jitter, 1.0 + jitter).astype(xf.dtype)
    logits = linear(p["router"], xf, ctx, _sub(lora, "router"), "router")
    noise = None if key is None else sparsemixer_noise(key, b * s, m.num_experts)
    top_w, top_i = sparsemixer_top2(logits, spec.extra["router_jitter_noise"], noise)
    xs, token, _, weights, sizes = _route_to_experts(xf, top_w, top_i, m.num_experts)
    h = _grouped_matmul(xs, p["experts"]["gate_up_proj"], sizes, ctx.dtype)
    gate, up = jnp.split(h, 2, axis=-1)
    out = _grouped_matmul(activation(spec.hidden_act)(gate) * up, p["experts"]["down_proj"], sizes, ctx.dtype)
    return _combine(out, weights, token, b * s, ctx).reshape(b, s, d)


def gpt_oss_layer(
    spec: ArchSpec,
    p: dict[str, Any],
    x: jax.Array,
    *,
    cos: jax.Array,
    sin: jax.Array,
    mask: jax.Array,
    ctx: Ctx,
    lora: dict[str, Any] | None = None,
) -> jax.Array:
    """Pre-norm layer: sink attention, then the GPT-OSS MoE."""
    lora = lora or {}
    eps = spec.rms_norm_eps
    h = rms_norm(x, p["input_layernorm"]["weight"], eps, weight_fp32=spec.norm_weight_fp32)
    x = x + sink_attention(spec, p["self_attn"], h, cos=cos, sin=sin, mask=mask, ctx=ctx, lora=lora.get("self_attn"))
    h = rms_norm(x, p["post_attention_layernorm"]["weight"], eps, weight_fp32=spec.norm_weight_fp32)
    return x + gpt_oss_moe(spec, p["mlp"], h, ctx)


def phimoe_layer(
    spec: ArchSpec,
    p: dict[str, Any],
    x: jax.Array,
    *,
    cos: jax.Array,
    sin: jax.Array,
    mask: jax.Array,
    ctx: Ctx,
    lora: dict[str, Any] | None = None,
) -> jax.Array:
    """Pre-LayerNorm layer: attention, then the sparsemixer MoE."""
    lora = lora or {}
    eps = spec.rms_norm_eps
    h = layer_norm(x, p["input_layernorm"], eps)
    x = x + attention_block(spec, p["self_attn"], h, cos=cos, sin=sin, mask=mask, ctx=ctx, lora=lora.get("self_attn"))
    h = layer_norm(x, p["post_attention_layernorm"], eps)
    return x + phimoe_moe(spec, p["mlp"], h, ctx, lora.get("mlp"))


# ----- checkpoint names ------------------------------------------------------------------------------------


def _deinterleave(x: np.ndarray, axis: int) -> np.ndarray:
    """``[..., g0, u0, g1, u1, ...]`` -> ``[..., g0, g1, ..., u0, u1, ...]`` along ``axis``."""
    n = x.shape[axis]
    return np.concatenate([np.take(x, np.arange(0, n, 2), axis), np.take(x, np.arange(1, n, 2), axis)], axis=axis)


def _interleave(x: np.ndarray, axis: int) -> np.ndarray:
    half = x.shape[axis] // 2
    order = np.empty(x.shape[axis], dtype=np.int64)
    order[0::2] = np.arange(half)
    order[1::2] = np.arange(half, 2 * half)
    return np.take(x, order, axis)


FP4_E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], np.float32)
"""The 16 values of an FP4 (E2M1) code, OCP Microscaling spec v1.0 §5.3.3 (bit 3 the sign)."""


def mxfp4_dequantize(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """OCP MXFP4 as the GPT-OSS checkpoints store it: ``blocks`` ``uint8 [E, R, G, 16]`` (two FP4 E2M1 codes per
    byte, the low nibble first), ``scales`` ``uint8 [E, R, G]`` (E8M0: ``2 ** (s - 127)``, one per 32-value block).
    Returns float32 ``[E, G * 32, R]`` (transposed, the layout of the bf16 checkpoints' expert tensors); every
    value is an FP4 value times a power of two, exact in float32 and in bf16."""
    blocks = np.asarray(blocks, np.uint8)
    scales = np.asarray(scales, np.uint8)
    if blocks.ndim < 2 or blocks.shape[:-1] != scales.shape:
        raise CheckpointError(
            f"MXFP4 blocks {blocks.shape} and scales {scales.shape} do not match ([..., G, 16] and [..., G]); "
            "the checkpoint is damaged or not MXFP4."
        )
    out = np.empty((*blocks.shape[:-1], blocks.shape[-1] * 2), np.float32)
    out[..., 0::2] = FP4_E2M1[blocks & 0x0F]
    out[..., 1::2] = FP4_E2M1[blocks >> 4]
    out = np.ldexp(out, (scales.astype(np.int32) - 127)[..., None])
    out = out.reshape(*blocks.shape[:-2], blocks.shape[-2] * blocks.shape[-1] * 2)
    return np.swapaxes(out, 1, 2) if out.ndim == 3 else out


def gpt_oss_recipe(name: str, spec: ArchSpec) -> Any:
    """In-memory names -> transformers' GPT-OSS checkpoint: router ``mlp.router``, experts transposed with
    gate/up interleaved (see the module docstring)."""
    from aegis.train.modeling.families import Recipe  # the registry imports this module

    if ".mlp.gate." in name:
        return Recipe((name.replace(".mlp.gate.", ".mlp.router."),))
    mxfp4 = bool(spec.extra.get("mxfp4")) and name.endswith((".experts.gate_up_proj", ".experts.down_proj"))
    if mxfp4 and name.endswith(".experts.gate_up_proj"):  # MXFP4 blocks + scales -> disk [E, d, 2I] -> memory
        return Recipe(
            (f"{name}_blocks", f"{name}_scales"),
            lambda xs: _deinterleave(np.swapaxes(mxfp4_dequantize(xs[0], xs[1]), 1, 2), 1),
            lambda x: [np.swapaxes(_interleave(x, 1), 1, 2)],
            save_keys=(name,),
            packed=True,
        )
    if mxfp4:  # down_proj: MXFP4 -> disk [E, I, d] -> memory [E, d, I]
        return Recipe(
            (f"{name}_blocks", f"{name}_scales"),
            lambda xs: np.swapaxes(mxfp4_dequantize(xs[0], xs[1]), 1, 2),
            lambda x: [np.swapaxes(x, 1, 2)],
            save_keys=(name,),
            packed=True,
        )
    if name.endswith(".experts.gate_up_proj"):  # disk [E, d, 2I] interleaved <-> memory [E, 2I, d] halves
        return Recipe(
            (name,),
            lambda xs: _deinterleave(np.swapaxes(xs[0], 1, 2), 1),
            lambda x: [np.swapaxes(_interleave(x, 1), 1, 2)],
        )
    if name.endswith(".experts.gate_up_proj_bias"):
        return Recipe((name,), lambda xs: _deinterleave(xs[0], 1), lambda x: [_interleave(x, 1)])
    if name.endswith(".experts.down_proj"):  # disk [E, I, d] <-> memory [E, d, I]
        return Recipe((name,), lambda xs: np.swapaxes(xs[0], 1, 2), lambda x: [np.swapaxes(x, 1, 2)])
    return Recipe((name,))


def phimoe_recipe(name: str, spec: ArchSpec) -> Any:
    """In-memory names -> Phi-MoE's checkpoint: ``block_sparse_moe`` with per-expert w1/w3/w2 and router ``gate``."""
    from aegis.train.modeling.families import Recipe, _expert_recipe  # the registry imports this module

    if ".mlp.router." in name:
        return Recipe((name.replace(".mlp.router.", ".block_sparse_moe.gate."),))
    return _expert_recipe("w1", "w3", "w2", rename=(".mlp.", ".block_sparse_moe."))(name, spec)
