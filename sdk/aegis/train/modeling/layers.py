"""Shared transformer blocks as pure functions: RMSNorm, linear (+LoRA, +NF4), attention, MLP, MoE.

Every block takes its parameter sub-tree (HF names: ``{"weight": [out, in], "bias": [out]}``),
the activations and an :class:`Ctx` (compute dtype, LoRA scale/dropout). Casts follow
transformers: RMSNorm in float32, attention softmax in float32, rope tables cast to the
activation dtype. A family composes these in a decoder layer (see ``decoder.standard_layer``);
a new architecture can reuse them piece by piece.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp

from aegis.errors import UnsupportedArchitectureError
from aegis.train.lora import expert_factors
from aegis.train.modeling.rope import apply_rope, deinterleave
from aegis.models.shapes import ArchSpec, query_blocks
from aegis.train.nf4 import NF4Tensor, dequantize, maybe_dequantize

__all__ = [
    "Ctx",
    "LinearWeight",
    "ATTENTION_IMPLS",
    "ACTIVATIONS",
    "activation",
    "rms_norm",
    "linear",
    "attention_block",
    "mlp_block",
    "moe_block",
]

ACTIVATIONS = {
    "silu": jax.nn.silu,
    "swish": jax.nn.silu,
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
    "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu_new": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu_fast": lambda x: jax.nn.gelu(x, approximate=True),
    "relu": jax.nn.relu,
}


def activation(name: str) -> Any:
    """The activation function transformers' ``ACT2FN[name]`` computes."""
    if name not in ACTIVATIONS:
        raise UnsupportedArchitectureError(
            f"hidden activation {name!r} is not supported; supported: {', '.join(sorted(ACTIVATIONS))}."
        )
    return ACTIVATIONS[name]


ATTENTION_IMPLS = ("xla", "dot_product", "cudnn")
"""``xla``: explicit scores, softmax in float32 as transformers' eager attention (any family).
``dot_product``: ``jax.nn.dot_product_attention`` with XLA; ``cudnn``: the same call with cuDNN
flash attention (NVIDIA GPUs, bf16/fp16 compute). Neither supports attention soft-capping."""


@dataclass(frozen=True)
class Ctx:
    """Per-call settings threaded through the blocks."""

    dtype: Any
    lora_scale: float = 0.0
    lora_dropout: float = 0.0
    rng: jax.Array | None = None  # this layer's training randomness; None = eval (no dropout, no sampling)
    attention: str = "xla"
    # For dot_product/cudnn with mask=None: causal attention with this static left window (None = full).
    window: int | None = None

    def sub_rng(self, name: str) -> jax.Array | None:
        """The LoRA dropout key of one module (None without dropout)."""
        if self.lora_dropout <= 0.0:
            return None
        return self.train_rng(name)

    def train_rng(self, name: str) -> jax.Array | None:
        """A key of its own for one random op of a training step (None in eval)."""
        if self.rng is None:
            return None
        return jax.random.fold_in(self.rng, sum(ord(c) * (i + 1) for i, c in enumerate(name)))


def rms_norm(
    x: jax.Array, weight: jax.Array, eps: float, *, gemma: bool = False, weight_fp32: bool = False
) -> jax.Array:
    """RMSNorm: Llama style ``w * norm(x).to(dtype)``, Gemma style ``(norm(x) * (1 + w)).to(dtype)`` or
    (``weight_fp32``, OLMo 2) ``(w * norm(x)).to(dtype)``."""
    xf = x.astype(jnp.float32)
    normed = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    if weight_fp32 and not gemma:
        return (weight.astype(jnp.float32) * normed).astype(x.dtype)
    if gemma:
        return (normed * (1.0 + weight.astype(jnp.float32))).astype(x.dtype)
    return weight.astype(x.dtype) * normed.astype(x.dtype)


def layer_norm(x: jax.Array, p: dict[str, Any], eps: float) -> jax.Array:
    """``nn.LayerNorm``: mean and variance over the last axis in float32, then weight and bias; without a ``bias``
    (Cohere's ``CohereLayerNorm``) the weight alone, which may hold one row per head (``[heads, head_dim]``); with
    neither (``OlmoLayerNorm``) the normalised input alone."""
    xf = x.astype(jnp.float32)
    mean = jnp.mean(xf, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(xf - mean), axis=-1, keepdims=True)
    normed = (xf - mean) * jax.lax.rsqrt(var + eps)
    if "weight" in p:
        normed = normed * p["weight"].astype(jnp.float32)
    if "bias" in p:
        normed = normed + p["bias"].astype(jnp.float32)
    return normed.astype(x.dtype)


def dropout(x: jax.Array, p: float, key: jax.Array | None) -> jax.Array:
    """``torch.nn.functional.dropout`` in training: each element zeroed with probability ``p``, the rest scaled by
    ``1 / (1 - p)``, in ``x``'s dtype; ``x`` itself without a key (eval) or with ``p`` 0."""
    if key is None or p <= 0.0:
        return x
    keep = jax.random.bernoulli(key, 1.0 - p, x.shape)
    return jnp.where(keep, x / jnp.asarray(1.0 - p, x.dtype), jnp.zeros((), x.dtype))


def _nf4_matmul(x: jax.Array, w: NF4Tensor, dtype: Any) -> jax.Array:
    return jnp.einsum("...i,oi->...o", x, dequantize(w, dtype))


# Dequantise inside a rematerialised region: the backward pass recomputes the dense weight from the
# NF4 codes instead of keeping every layer's dense copy alive as a residual (which would undo QLoRA).
_nf4_matmul_remat = jax.checkpoint(_nf4_matmul, static_argnums=(2,))


class LinearWeight(abc.ABC):
    """A params leaf (a registered pytree) that computes its own ``x @ W.T`` in :func:`linear`, e.g. a
    BitNet b1.58 weight (``aegis.forge``: ternary weights, int8 activations). Its array children carry the
    layer axis like any stacked weight, so the layer scan and the unrolled loop slice them per layer."""

    @abc.abstractmethod
    def matmul(self, x: jax.Array, dtype: Any) -> jax.Array:
        """``x [..., in] @ W.T`` -> ``[..., out]`` in ``dtype``."""


def _matmul(x: jax.Array, w: Any, dtype: Any) -> jax.Array:
    """``x @ w.T`` for a dense, NF4 or :class:`LinearWeight` weight in HF layout ``[out, in]``."""
    if isinstance(w, NF4Tensor):
        return _nf4_matmul_remat(x, w, dtype)
    if isinstance(w, LinearWeight):
        return w.matmul(x, dtype)
    lead = x.shape[:-1]
    y = jax.lax.dot_general(x.reshape(-1, x.shape[-1]), w.astype(dtype), (((1,), (1,)), ((), ())))
    return y.reshape(*lead, y.shape[-1])


def linear(p: dict[str, Any], x: jax.Array, ctx: Ctx, lora: dict[str, Any] | None = None, name: str = "") -> jax.Array:
    """``x @ W.T + b`` with ``W`` in HF layout ``[out, in]`` (NF4 dequantised on the fly) plus a LoRA update.

    The LoRA update runs as PEFT's ``Linear.forward`` does. A base stored in the compute dtype (``bf16``: no
    autocast) with adapters of another dtype (fp32): ``x`` is cast to ``lora_A``'s dtype, ``B A x`` computed
    in it, added to the base output in it and the sum cast back to the base output's dtype. A base stored
    above the compute dtype (mixed precision, autocast): the adapters are cast to the compute dtype at use."""
    w = p["weight"]
    y = _matmul(x, w, ctx.dtype)
    if "bias" in p:
        y = y + p["bias"].astype(ctx.dtype)
    if lora:
        a, b = lora["lora_A"]["weight"], lora["lora_B"]["weight"]  # [r, in], [out, r]
        autocast = jnp.dtype(getattr(w, "dtype", ctx.dtype)) != jnp.dtype(ctx.dtype)
        dt = ctx.dtype if autocast else a.dtype
        xin = dropout(x.astype(dt), ctx.lora_dropout, ctx.sub_rng(name))
        delta = _matmul(_matmul(xin, a, dt), b, dt) * jnp.asarray(ctx.lora_scale, dt)
        y = (y.astype(dt) + delta).astype(y.dtype)
    return y


def _sub(lora: dict[str, Any] | None, key: str) -> dict[str, Any] | None:
    return None if not lora else lora.get(key)


def attention_block(
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
    """Self-attention with GQA, optional q/k-norm, rope, soft-capping.

    ``mask`` is ``[b, s, s]`` bool (True = attend), or None for plain causal attention limited to
    ``ctx.window`` (the fast path of the dot_product/cudnn implementations).
    """
    b, s, _ = x.shape
    if spec.fused_qkv:
        name = spec.qkv_name
        qkv = linear(p[name], x, ctx, _sub(lora, name), name)
        if spec.qkv_grouped:  # GPT-NeoX, Falcon: [q_1 .. q_g, k, v] per kv head (GPT-NeoX: g = 1)
            g, hkv = spec.num_heads // spec.num_kv_heads, spec.num_kv_heads
            t = qkv.reshape(b, s, hkv, g + 2, spec.head_dim)
            q = t[:, :, :, :g].reshape(b, s, spec.q_size)
            k, v = t[:, :, :, g].reshape(b, s, spec.kv_size), t[:, :, :, g + 1].reshape(b, s, spec.kv_size)
        else:
            q, k, v = jnp.split(qkv, [spec.q_size, spec.q_size + spec.kv_size], axis=-1)
    else:
        q = linear(p["q_proj"], x, ctx, _sub(lora, "q_proj"), "q_proj")
        k = linear(p["k_proj"], x, ctx, _sub(lora, "k_proj"), "k_proj")
        v = linear(p["v_proj"], x, ctx, _sub(lora, "v_proj"), "v_proj")
    if spec.clip_qkv is not None:  # OLMo: the projections' outputs (adapters included) clamped to [-clip, clip]
        bound = spec.clip_qkv
        q, k, v = (jnp.clip(t, -bound, bound) for t in (q, k, v))
    hd, hkv = spec.head_dim, spec.num_kv_heads
    if spec.qk_norm_full:  # OLMo 2: one RMSNorm over all heads of the projection
        q = rms_norm(q, p["q_norm"]["weight"], spec.rms_norm_eps, weight_fp32=spec.norm_weight_fp32)
        k = rms_norm(k, p["k_norm"]["weight"], spec.rms_norm_eps, weight_fp32=spec.norm_weight_fp32)
    q = q.reshape(b, s, spec.num_heads, hd)
    k = k.reshape(b, s, hkv, hd)
    v = v.reshape(b, s, hkv, hd)
    if spec.qk_norm and spec.qk_norm_head_weights:  # Cohere: LayerNorm over each head, a weight per head
        q = layer_norm(q, p["q_norm"], spec.rms_norm_eps)
        k = layer_norm(k, p["k_norm"], spec.rms_norm_eps)
    elif spec.qk_norm and spec.layer_norm:  # Phi's qk_layernorm: LayerNorm over each head
        q = layer_norm(q, p["q_layernorm"], spec.rms_norm_eps)
        k = layer_norm(k, p["k_layernorm"], spec.rms_norm_eps)
    elif spec.qk_norm:
        q = rms_norm(q, p["q_norm"]["weight"], spec.rms_norm_eps, gemma=spec.gemma_norm)
        k = rms_norm(k, p["k_norm"]["weight"], spec.rms_norm_eps, gemma=spec.gemma_norm)
    if spec.rope_interleave:  # Cohere, GPT-J: rotating adjacent pairs is rotating the halves of a permuted head (GPT-J:
        # of its rotated dims); q and k permuted alike leave every score q.k as it was
        q, k = deinterleave(q, cos.shape[-1]), deinterleave(k, cos.shape[-1])
    q = apply_rope(q, cos, sin)
    k = apply_rope(k, cos, sin)
    # training with attention dropout: the explicit-scores path (the fused kernels here take no dropout)
    drop_key = ctx.train_rng("attention_dropout") if spec.attention_dropout > 0.0 else None

    if ctx.attention != "xla" and drop_key is None:
        out = jax.nn.dot_product_attention(
            q,
            k,
            v,
            mask=None if mask is None else mask[:, None],
            is_causal=mask is None,
            scale=spec.attn_scale,
            local_window_size=None if mask is not None or ctx.window is None else (ctx.window - 1, 0),
            implementation="cudnn" if ctx.attention == "cudnn" else "xla",
        )
        o = spec.o_name
        return linear(p[o], out.reshape(b, s, spec.q_size), ctx, _sub(lora, o), o)
    if mask is None:
        idx = jnp.arange(s)
        dist = idx[:, None] - idx[None, :]
        window = ctx.window if ctx.window is not None else s + 1
        mask = jnp.broadcast_to(((dist >= 0) & (dist < window))[None], (b, s, s))
    groups = spec.num_heads // hkv
    # Canonical batched matmuls over (batch, kv head): the query heads of a group are stacked along
    # the query axis ([b, hkv, groups*s, hd]), so XLA:CPU runs plain GEMMs without layout copies.
    qg = q.reshape(b, s, hkv, groups, hd).transpose(0, 2, 3, 1, 4).reshape(b, hkv, groups * s, hd)
    kt = k.transpose(0, 2, 1, 3)  # [b, hkv, s, hd]
    vt = v.transpose(0, 2, 1, 3)
    out = eager_attention(qg, kt, vt, mask, drop_key, spec.attn_scale, spec.attn_softcap, groups,
                          spec.attention_dropout)  # [b, hkv, groups*s, hd]
    out = out.reshape(b, hkv, groups, s, hd).transpose(0, 3, 1, 2, 4).reshape(b, s, spec.q_size)
    return linear(p[spec.o_name], out, ctx, _sub(lora, spec.o_name), spec.o_name)


_BATCH_DIMS = ((0, 1), (0, 1))


def _bmm_nt(a: jax.Array, b: jax.Array) -> jax.Array:
    """``a @ b^T`` over the two leading (batch, kv head) axes."""
    return jax.lax.dot_general(a, b, (((3,), (3,)), _BATCH_DIMS))


def _bmm_nn(a: jax.Array, b: jax.Array) -> jax.Array:
    """``a @ b`` over the two leading (batch, kv head) axes."""
    return jax.lax.dot_general(a, b, (((3,), (2,)), _BATCH_DIMS))


def _transposed(x: jax.Array) -> jax.Array:
    """``x`` with its last two axes swapped in memory: the barrier keeps XLA from folding the transpose
    back into the next dot as a transposed operand, which XLA:CPU's fast GEMM path does not take."""
    return jax.lax.optimization_barrier(jnp.swapaxes(x, 2, 3))


def _attention_keep(key: jax.Array, p: float, shape: tuple[int, ...]) -> jax.Array:
    return jax.random.bernoulli(key, 1.0 - p, shape)


def _eager_forward(
    qg: jax.Array, kt: jax.Array, vt: jax.Array, mask: jax.Array, drop_key: jax.Array | None, scale: float,
    softcap: float | None, groups: int, drop: float,
) -> tuple[jax.Array, jax.Array, jax.Array | None]:
    b, h, gs, _ = qg.shape
    s = kt.shape[2]
    scores = _bmm_nt(qg, kt) * jnp.asarray(scale, qg.dtype)
    capped = None
    if softcap is not None:
        capped = jnp.tanh(scores / jnp.asarray(softcap, scores.dtype))
        scores = capped * jnp.asarray(softcap, scores.dtype)
    scores = scores.astype(jnp.float32).reshape(b, h, groups, gs // groups, s)
    scores = jnp.where(mask[:, None, None, :, :], scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).reshape(b, h, gs, s)
    p = probs.astype(vt.dtype)
    if drop_key is not None:
        p = jnp.where(_attention_keep(drop_key, drop, p.shape), p / jnp.asarray(1.0 - drop, p.dtype), 0)
    return _bmm_nn(p, vt), probs, capped


def _block_rows(qg: jax.Array, groups: int, start: int, end: int) -> jax.Array:
    """The grouped queries of sequence positions ``[start, end)``: ``[b, hkv, groups*(end-start), hd]``."""
    b, h, gs, hd = qg.shape
    return qg.reshape(b, h, groups, gs // groups, hd)[:, :, :, start:end].reshape(b, h, groups * (end - start), hd)


def _block_key(drop_key: jax.Array | None, i: int, blocks: int) -> jax.Array | None:
    return drop_key if drop_key is None or blocks == 1 else jax.random.fold_in(drop_key, i)


@partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7, 8))
def eager_attention(
    qg: jax.Array, kt: jax.Array, vt: jax.Array, mask: jax.Array, drop_key: jax.Array | None, scale: float,
    softcap: float | None, groups: int, drop: float = 0.0,
) -> jax.Array:
    """transformers' eager attention on grouped queries ``qg [b, hkv, groups*s, hd]`` and keys/values
    ``[b, hkv, s, hd]`` under a causal mask ``[b, s, s]`` (or any subset of it: packed segments, sliding
    windows): scores in the compute dtype, optional tanh soft-cap, mask, softmax in float32, probabilities
    cast back, then (training, with ``drop_key``) dropped with probability ``drop``, for the value matmul.

    **Query blocks** (`aegis.models.shapes.query_blocks`): the queries ``[start, end)`` are scored against
    the keys ``[0, end)`` only, so the score blocks above the diagonal, which the mask would drop, are never
    computed or kept (at 2,048 tokens 53% of the full scores' FLOPs and bytes). Each block is the same maths on
    its rows, so the result equals one full-width pass. With attention dropout each block draws its mask from
    the key folded with the block's index.

    The backward pass is written out (a custom VJP keeping q, k, v, the mask and each block's float32
    probabilities, as autodiff would) so that its four matmuls per block are plain ``A @ B`` / ``A @ B^T``
    GEMMs on explicitly transposed operands; autodiff's transposed-operand dots run several times slower on
    XLA:CPU. The whole k and v are the residuals (not each block's prefix copy), and the dropout mask is not
    one: the backward draws it again from the key.
    """
    return _blocked_forward(qg, kt, vt, mask, drop_key, scale, softcap, groups, drop)[0]


def _blocked_forward(qg, kt, vt, mask, drop_key, scale, softcap, groups, drop):  # noqa: ANN001, ANN202
    blocks = query_blocks(kt.shape[2])
    outs, probs, capped = [], [], []
    for i, (start, end) in enumerate(blocks):
        o, p, c = _eager_forward(_block_rows(qg, groups, start, end), kt[:, :, :end], vt[:, :, :end],
                                 mask[:, start:end, :end], _block_key(drop_key, i, len(blocks)), scale, softcap,
                                 groups, drop)
        outs.append(o)
        probs.append(p)
        capped.append(c)
    if len(blocks) == 1:
        return outs[0], probs, capped
    b, h, _, _ = qg.shape
    out = jnp.concatenate([o.reshape(b, h, groups, -1, o.shape[-1]) for o in outs], axis=3)
    return out.reshape(b, h, qg.shape[2], vt.shape[-1]), probs, capped


def _eager_fwd(qg, kt, vt, mask, drop_key, scale, softcap, groups, drop):  # noqa: ANN001, ANN202
    out, probs, capped = _blocked_forward(qg, kt, vt, mask, drop_key, scale, softcap, groups, drop)
    return out, (qg, kt, vt, mask, drop_key, probs, capped)


def _eager_bwd(scale, softcap, groups, drop, res, g):  # noqa: ANN001, ANN202
    qg, kt, vt, mask, drop_key, probs, capped = res
    blocks = query_blocks(kt.shape[2])
    if len(blocks) == 1:
        dq, dk, dv = _block_bwd(scale, softcap, groups, drop, qg, kt, vt, mask, drop_key, probs[0], capped[0], g)
        return dq, dk, dv, None, None
    dqs = []
    dk, dv = jnp.zeros(kt.shape, kt.dtype), jnp.zeros(vt.shape, vt.dtype)
    for i, (start, end) in enumerate(blocks):
        dq_i, dk_i, dv_i = _block_bwd(
            scale, softcap, groups, drop, _block_rows(qg, groups, start, end), kt[:, :, :end], vt[:, :, :end],
            mask[:, start:end, :end], _block_key(drop_key, i, len(blocks)), probs[i], capped[i],
            _block_rows(g, groups, start, end),
        )
        dqs.append(dq_i.reshape(*dq_i.shape[:2], groups, end - start, dq_i.shape[-1]))
        dk = dk.at[:, :, :end].add(dk_i)
        dv = dv.at[:, :, :end].add(dv_i)
    dq = jnp.concatenate(dqs, axis=3).reshape(qg.shape)
    return dq, dk, dv, None, None


def _block_bwd(scale, softcap, groups, drop, qg, kt, vt, mask, drop_key, probs, capped, g):  # noqa: ANN001, ANN202
    p = probs.astype(vt.dtype)
    keep = None
    if drop_key is not None:  # the barrier keeps XLA from sharing the forward's mask (alive until here) by CSE
        keep = _attention_keep(jax.lax.optimization_barrier(drop_key), drop, p.shape)
        p = jnp.where(keep, p / jnp.asarray(1.0 - drop, p.dtype), 0)
    # The gradients of k and v are computed transposed, ``dv^T = g^T p`` and ``dk^T = q^T ds``: plain GEMMs whose
    # transposed operands are the thin [s, head_dim] ones, not the [s, s] probabilities (4x the bytes to move)
    dv = jnp.swapaxes(_bmm_nn(_transposed(g.astype(vt.dtype)), p), 2, 3)
    dp = _bmm_nt(g.astype(vt.dtype), vt).astype(jnp.float32)
    if keep is not None:  # through the dropout, in the dtype it ran in
        dp = jnp.where(keep, (dp.astype(vt.dtype) / jnp.asarray(1.0 - drop, vt.dtype)).astype(jnp.float32), 0.0)
    ds = probs * (dp - jnp.sum(dp * probs, axis=-1, keepdims=True))  # softmax backward
    b, h, gs, s = ds.shape
    # masked scores get no gradient (they are constants in the forward), also in rows that attend to nothing
    ds = jnp.where(mask[:, None, None, :, :], ds.reshape(b, h, groups, gs // groups, s), 0.0).reshape(b, h, gs, s)
    ds = ds.astype(qg.dtype)
    if capped is not None:
        ds = ds * (1 - capped * capped)
    ds = ds * jnp.asarray(scale, ds.dtype)
    dq = _bmm_nn(ds, kt)
    dk = jnp.swapaxes(_bmm_nn(_transposed(qg), ds), 2, 3)
    return dq, dk, dv


eager_attention.defvjp(_eager_fwd, _eager_bwd)


def mlp_block(
    spec: ArchSpec,
    p: dict[str, Any],
    x: jax.Array,
    ctx: Ctx,
    lora: dict[str, Any] | None = None,
    *,
    prefix: str = "",
) -> jax.Array:
    """Gated MLP ``down(act(gate(x)) * up(x))``; Phi-3's fused ``gate_up_proj`` is split in halves; the plain
    ``out(act(in(x)))`` of Phi (``fc1``/``fc2``) and StarCoder2 (``c_fc``/``c_proj``)."""
    act = activation(spec.hidden_act)
    if spec.plain_mlp and spec.moe is None:
        fc_in, fc_out = spec.plain_mlp_names
        h = linear(p[fc_in], x, ctx, _sub(lora, fc_in), prefix + fc_in)
        return linear(p[fc_out], act(h), ctx, _sub(lora, fc_out), prefix + fc_out)
    if "gate_up_proj" in p:
        gate, up = jnp.split(
            linear(p["gate_up_proj"], x, ctx, _sub(lora, "gate_up_proj"), prefix + "gate_up_proj"), 2, -1
        )
    else:
        gate = linear(p["gate_proj"], x, ctx, _sub(lora, "gate_proj"), prefix + "gate_proj")
        up = linear(p["up_proj"], x, ctx, _sub(lora, "up_proj"), prefix + "up_proj")
    return linear(p["down_proj"], act(gate) * up, ctx, _sub(lora, "down_proj"), prefix + "down_proj")


def _grouped(x: jax.Array, w: Any, group_sizes: jax.Array, dtype: Any) -> jax.Array:
    return jax.lax.ragged_dot(x, jnp.swapaxes(maybe_dequantize(w, dtype), 1, 2), group_sizes)


_grouped_remat = jax.checkpoint(_grouped, static_argnums=(3,))


def _grouped_matmul(x: jax.Array, w: Any, group_sizes: jax.Array, dtype: Any) -> jax.Array:
    """Rows of ``x`` (sorted by expert) times their expert's ``w[e].T``; NF4 experts dequantised in a remat region."""
    if isinstance(w, NF4Tensor):
        return _grouped_remat(x, w, group_sizes, dtype)
    return _grouped(x, w, group_sizes, dtype)


def _expert_lora(x: jax.Array, lora: dict[str, Any], group_sizes: jax.Array, num_experts: int, ctx: Ctx) -> jax.Array:
    """PEFT's ParamWrapper update ``x @ (scale * B_e @ A_e).T`` in low rank: two grouped matmuls through the
    ``r`` (or ``2r``) columns of each row's expert, never materialising the ``[E, out, in]`` delta."""
    a_e, b_e = expert_factors(lora, num_experts, ctx.dtype)  # [E, r, in], [E, out, r]
    t = jax.lax.ragged_dot(x, jnp.swapaxes(a_e, 1, 2), group_sizes)
    return jax.lax.ragged_dot(t, jnp.swapaxes(b_e, 1, 2), group_sizes) * jnp.asarray(ctx.lora_scale, ctx.dtype)


def _expert_matmul(
    x: jax.Array, w: Any, group_sizes: jax.Array, ctx: Ctx, lora: dict[str, Any] | None, num_experts: int
) -> jax.Array:
    y = _grouped_matmul(x, w, group_sizes, ctx.dtype)
    return y if not lora else y + _expert_lora(x, lora, group_sizes, num_experts, ctx)


def moe_block(
    spec: ArchSpec, p: dict[str, Any], x: jax.Array, ctx: Ctx, lora: dict[str, Any] | None = None
) -> jax.Array:
    """Top-k routed experts (grouped matmuls via ``ragged_dot``) plus an optional gated shared expert.

    Routing as transformers: softmax over all experts in float32, top-k, renormalise when
    ``norm_topk_prob`` (always for Mixtral); expert outputs weighted and summed per token.
    LoRA on the router weight and on the fused expert stacks (PEFT's ParamWrapper, see ``aegis.train.lora``)
    adds ``scale * (x A^T) B^T`` per row, with its expert's factors; ParamWrapper has no dropout.
    """
    m = spec.moe
    b, s, d = x.shape
    xf = x.reshape(b * s, d)
    router_logits = linear(p["gate"], xf, ctx, _sub(lora, "gate"), "gate")  # [t, E], plus the router's LoRA
    probs = jax.nn.softmax(router_logits.astype(jnp.float32), axis=-1)
    top_w, top_i = jax.lax.top_k(probs, m.top_k)
    if m.norm_topk_prob:
        top_w = top_w / jnp.sum(top_w, axis=-1, keepdims=True)

    flat_e = top_i.reshape(-1)
    order = jnp.argsort(flat_e, stable=True)
    token = order // m.top_k
    group_sizes = jnp.bincount(flat_e, length=m.num_experts).astype(jnp.int32)
    xs = xf[token]
    experts_lora = _sub(lora, "experts") or {}
    h = _expert_matmul(  # experts [E, 2I, D]
        xs, p["experts"]["gate_up_proj"], group_sizes, ctx, experts_lora.get("gate_up_proj"), m.num_experts
    )
    gate, up = jnp.split(h, 2, axis=-1)
    h = activation(spec.hidden_act)(gate) * up
    out = _expert_matmul(  # experts [E, D, I]
        h, p["experts"]["down_proj"], group_sizes, ctx, experts_lora.get("down_proj"), m.num_experts
    )
    weights = top_w.reshape(-1)[order]
    out = (out.astype(jnp.float32) * weights[:, None]).astype(ctx.dtype)
    y = jnp.zeros((b * s, d), ctx.dtype).at[token].add(out)

    if "shared_expert" in p:
        shared = mlp_block(spec, p["shared_expert"], xf, ctx, _sub(lora, "shared_expert"), prefix="shared_expert.")
        gate_val = jax.nn.sigmoid(
            linear(p["shared_expert_gate"], xf, ctx, _sub(lora, "shared_expert_gate"), "shared_expert_gate")
        )
        y = y + gate_val * shared
    return y.reshape(b, s, d)
