"""DeepSeek-V2 and DeepSeek-V3 (R1, V3-0324) in JAX: multi-head latent attention and DeepSeek's MoE.

Mirrors transformers 5.23's ``modeling_deepseek_v2.py`` / ``modeling_deepseek_v3.py``:

- **MLA**: ``q = q_proj(x)`` (no ``q_lora_rank``) or ``q_b_proj(q_a_layernorm(q_a_proj(x)))``, split per head
  into a pass-through part (``qk_nope_head_dim``) and a rotated part (``qk_rope_head_dim``);
  ``kv_a_proj_with_mqa(x)`` gives the latent (``kv_lora_rank``, normed by ``kv_a_layernorm``) and one rotated
  key shared by all heads; ``kv_b_proj(latent)`` gives each head's un-rotated key and its value
  (``v_head_dim``). The two latent norms use RMSNorm's default eps 1e-6 (not ``rms_norm_eps``). The
  rotated dims are interleaved pairs (V2's complex multiply; V3 when ``rope_interleave``): rotating the
  de-interleaved vector ``[x0, x2, ..., x1, x3, ...]`` half-wise is what V3 computes, and gives V2's q.k.
  Softmax scale ``(nope + rope)**-0.5``, times ``mscale**2`` under yarn with ``mscale_all_dim``.
- **MoE** from layer ``first_k_dense_replace`` on (the leading dense layers are the ``model.dense_layers``
  stack, see ``aegis.models.shapes.layer_stacks``): V2 routes by softmax (``greedy`` top-k, or ``group_limited_greedy``:
  the ``topk_group`` groups with the best expert), weights not renormalised; V3 by sigmoid, choosing
  with ``scores + e_score_correction_bias`` among the ``topk_group`` groups whose best two sum highest,
  weighting by the plain scores (renormalised when ``norm_topk_prob``). Both scale the weights by
  ``routed_scaling_factor`` and add the ungated ``shared_experts`` MLP.
- MTP layers (``num_nextn_predict_layers``) are not part of transformers' model and are not built.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from aegis.train.modeling.layers import (
    Ctx, _expert_matmul, _sub, activation, eager_attention, linear, mlp_block, rms_norm,
)
from aegis.train.modeling.rope import apply_rope, deinterleave
from aegis.models.shapes import ArchSpec, MoESpec

__all__ = ["deepseek_layer", "mla_attention", "deepseek_moe"]

_LATENT_NORM_EPS = 1e-6
"""``DeepseekV2RMSNorm(q_lora_rank)`` / ``(kv_lora_rank)``: constructed without ``rms_norm_eps``."""


def mla_attention(
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
    """Multi-head latent attention (training form: keys and values expanded per head), eager maths."""
    m = spec.mla
    b, s, _ = x.shape
    heads, nope, rope, v_dim = spec.num_heads, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim
    if m.q_lora_rank is None:
        q = linear(p["q_proj"], x, ctx, _sub(lora, "q_proj"), "q_proj")
    else:
        q = linear(p["q_a_proj"], x, ctx, _sub(lora, "q_a_proj"), "q_a_proj")
        q = rms_norm(q, p["q_a_layernorm"]["weight"], _LATENT_NORM_EPS)
        q = linear(p["q_b_proj"], q, ctx, _sub(lora, "q_b_proj"), "q_b_proj")
    q = q.reshape(b, s, heads, m.qk_head_dim)
    q_pass, q_rot = q[..., :nope], q[..., nope:]
    ckv = linear(p["kv_a_proj_with_mqa"], x, ctx, _sub(lora, "kv_a_proj_with_mqa"), "kv_a_proj_with_mqa")
    latent, k_rot = ckv[..., : m.kv_lora_rank], ckv[..., m.kv_lora_rank :]
    latent = rms_norm(latent, p["kv_a_layernorm"]["weight"], _LATENT_NORM_EPS)
    k_rot = k_rot.reshape(b, s, 1, rope)
    if spec.rope_interleave:
        q_rot, k_rot = deinterleave(q_rot), deinterleave(k_rot)
    q_rot = apply_rope(q_rot, cos, sin)
    k_rot = apply_rope(k_rot, cos, sin)
    kv = linear(p["kv_b_proj"], latent, ctx, _sub(lora, "kv_b_proj"), "kv_b_proj").reshape(b, s, heads, nope + v_dim)
    k_pass, v = kv[..., :nope], kv[..., nope:]
    query = jnp.concatenate([q_pass, q_rot], axis=-1)
    key = jnp.concatenate([k_pass, jnp.broadcast_to(k_rot, (b, s, heads, rope))], axis=-1)
    if mask is None:  # fused-kernel callers pass no mask: plain causal attention (MLA runs the eager maths)
        idx = jnp.arange(s)
        mask = jnp.broadcast_to((idx[:, None] >= idx[None, :])[None], (b, s, s))
    qt, kt, vt = (t.transpose(0, 2, 1, 3) for t in (query, key, v))  # [b, heads, s, d]
    drop_key = ctx.train_rng("attention_dropout") if spec.attention_dropout > 0.0 else None
    out = eager_attention(qt, kt, vt, mask, drop_key, spec.attn_scale, None, 1, spec.attention_dropout)  # [b, h, s, v]
    out = out.transpose(0, 2, 1, 3).reshape(b, s, heads * v_dim)
    return linear(p["o_proj"], out, ctx, _sub(lora, "o_proj"), "o_proj")


def _route(m: MoESpec, logits: jax.Array, score_bias: jax.Array | None) -> tuple[jax.Array, jax.Array]:
    """Top-k weights and expert indices ``[t, k]`` from float32 router logits ``[t, E]``."""
    scores = jax.nn.sigmoid(logits) if m.router == "sigmoid" else jax.nn.softmax(logits, axis=-1)
    choice = scores if score_bias is None else scores + score_bias.astype(jnp.float32)
    if m.n_group > 1 or m.router == "sigmoid":
        t = logits.shape[0]
        grouped = choice.reshape(t, m.n_group, m.num_experts // m.n_group)
        if m.group_score == "top2":
            group_scores = jnp.sum(jax.lax.top_k(grouped, 2)[0], axis=-1)
        else:
            group_scores = jnp.max(grouped, axis=-1)
        _, keep = jax.lax.top_k(group_scores, m.topk_group)
        group_mask = jnp.zeros_like(group_scores).at[jnp.arange(t)[:, None], keep].set(1.0)
        expert_mask = jnp.repeat(group_mask, m.num_experts // m.n_group, axis=-1) > 0
        # V3 masks the left-out groups with -inf, V2 with 0 (its scores are softmax probabilities)
        choice = jnp.where(expert_mask, choice, -jnp.inf if m.router == "sigmoid" else 0.0)
    _, idx = jax.lax.top_k(choice, m.top_k)
    weights = jnp.take_along_axis(scores, idx, axis=-1)
    if m.norm_topk_prob:
        weights = weights / (jnp.sum(weights, axis=-1, keepdims=True) + 1e-20)
    return weights * m.routed_scaling_factor, idx


def deepseek_moe(
    spec: ArchSpec, p: dict[str, Any], x: jax.Array, ctx: Ctx, lora: dict[str, Any] | None = None
) -> jax.Array:
    """Routed experts (grouped matmuls, as ``layers.moe_block``) plus the ungated shared experts."""
    m = spec.moe
    b, s, d = x.shape
    xf = x.reshape(b * s, d)
    gate = p["gate"]
    # the router runs in float32 (F.linear on float32 copies of the input and the weight)
    logits = linear({"weight": gate["weight"]}, xf.astype(jnp.float32), dataclasses.replace(ctx, dtype=jnp.float32),
                    _sub(lora, "gate"), "gate")
    top_w, top_i = _route(m, logits, gate.get("e_score_correction_bias"))
    flat_e = top_i.reshape(-1)
    order = jnp.argsort(flat_e, stable=True)
    token = order // m.top_k
    group_sizes = jnp.bincount(flat_e, length=m.num_experts).astype(jnp.int32)
    experts_lora = _sub(lora, "experts") or {}
    h = _expert_matmul(xf[token], p["experts"]["gate_up_proj"], group_sizes, ctx, experts_lora.get("gate_up_proj"),
                       m.num_experts)
    g, u = jnp.split(h, 2, axis=-1)
    h = activation(spec.hidden_act)(g) * u
    out = _expert_matmul(h, p["experts"]["down_proj"], group_sizes, ctx, experts_lora.get("down_proj"), m.num_experts)
    out = (out.astype(jnp.float32) * top_w.reshape(-1)[order][:, None]).astype(ctx.dtype)
    y = jnp.zeros((b * s, d), ctx.dtype).at[token].add(out)
    if "shared_experts" in p:
        y = y + mlp_block(spec, p["shared_experts"], xf, ctx, _sub(lora, "shared_experts"), prefix="shared_experts.")
    return y.reshape(b, s, d)


def deepseek_layer(
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
    """Pre-norm residual layer: MLA, then the dense MLP (``spec.moe`` None: a dense-stack layer) or the MoE."""
    lora = lora or {}
    eps = spec.rms_norm_eps
    h = rms_norm(x, p["input_layernorm"]["weight"], eps)
    x = x + mla_attention(spec, p["self_attn"], h, cos=cos, sin=sin, mask=mask, ctx=ctx, lora=lora.get("self_attn"))
    h = rms_norm(x, p["post_attention_layernorm"]["weight"], eps)
    ff = deepseek_moe if spec.moe is not None else mlp_block
    return x + ff(spec, p["mlp"], h, ctx, lora.get("mlp"))
