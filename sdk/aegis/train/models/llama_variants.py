"""Llama-shaped decoders that differ from Llama in a few places: Gemma 1, OLMo 2, Granite (3.x).

Each spec builder starts from the Llama family's :class:`ArchSpec` for the same config.json (same
projections, rope and windows) and changes what its transformers ``modeling_*.py`` changes; keys a
config.json may omit are read with transformers' defaults (`aegis.architectures.config`). OLMo 2 and
Granite also have their own decoder layer. The registry (``families.FAMILIES``) lists them.

- **Gemma** (``modeling_gemma.py``): ``(1 + w)`` RMSNorm in float32, embeddings times
  ``sqrt(hidden_size)``, GeGLU (``gelu_pytorch_tanh``; the legacy ``hidden_act="gelu"`` of the
  published configs means the same), head_dim 256 and tied embeddings by default.
- **OLMo 2** (``modeling_olmo2.py``): no pre-norms; RMSNorm on the attention and MLP outputs before
  the residual add (``post_attention_layernorm``, ``post_feedforward_layernorm``); q_norm/k_norm
  over the whole projection width; ``(w * norm(x)).to(dtype)``; eps 1e-5 by default.
- **Granite** (``modeling_granite.py``): embeddings times ``embedding_multiplier``, sublayer outputs
  times ``residual_multiplier``, attention scale ``attention_multiplier`` (not ``head_dim**-0.5``),
  logits divided by ``logits_scaling``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax

from aegis.architectures import config as arch
from aegis.architectures import registry
from aegis.errors import UnsupportedArchitectureError
from aegis.train.models.layers import Ctx, attention_block, mlp_block, moe_block, rms_norm
from aegis.train.models.spec import ArchSpec, MoESpec, rope_for_layer_types

__all__ = ["spec_gemma", "spec_olmo2", "spec_granite", "spec_granitemoe", "granitemoe_recipe", "olmo2_layer",
           "granite_layer"]


def _llama_spec(config: dict[str, Any]) -> ArchSpec:
    from aegis.train.models.families import FAMILIES  # the registry imports this module

    return FAMILIES["llama"].build_spec(config)


def spec_gemma(config: dict[str, Any]) -> ArchSpec:
    """Gemma 1 (``GemmaConfig``: head_dim 256, gelu_pytorch_tanh, eps 1e-6, tied, rope theta 1e4)."""
    if arch.value(config, "use_bidirectional_attention"):
        raise UnsupportedArchitectureError(
            "use_bidirectional_attention=True (an encoder variant) is not supported; train a causal Gemma."
        )
    spec = _llama_spec({**config, "head_dim": arch.head_dim(config)})
    act = config.get("hidden_act") or "gelu_pytorch_tanh"
    return dataclasses.replace(
        spec,
        hidden_act="gelu_pytorch_tanh" if act == "gelu" else act,  # GemmaConfig.__post_init__
        gemma_norm=True,
        mlp_bias=False,
        rms_norm_eps=arch.rms_norm_eps(config),
        embed_scale=math.sqrt(spec.hidden_size),
        tie_embeddings=arch.tie_word_embeddings(config),
    )


def spec_olmo2(config: dict[str, Any]) -> ArchSpec:
    """OLMo 2 (``Olmo2Config``: eps 1e-5, silu, untied, no MLP bias)."""
    return dataclasses.replace(
        _llama_spec(config),
        rms_norm_eps=arch.rms_norm_eps(config),
        mlp_bias=False,
        tie_embeddings=arch.tie_word_embeddings(config),
        qk_norm_full=True,
        post_norms_only=True,
        norm_weight_fp32=registry.get(arch.model_type(config)).norm_weight_float32,
    )


def spec_olmo3(config: dict[str, Any]) -> ArchSpec:
    """OLMo 3: OLMo 2 with sliding-window layers (every 4th full) and a RoPE per layer type. ``Olmo3Config`` gives
    full-attention layers ``rope_theta`` and ``rope_scaling``, sliding layers the class default theta (500000)
    unscaled."""
    spec = spec_olmo2(config)
    ropes = rope_for_layer_types(config, spec.head_dim, global_theta=500_000.0, local_theta=500_000.0)
    order = ("full_attention", "sliding_attention")
    return dataclasses.replace(
        spec,
        ropes=tuple(ropes[t] for t in order),
        layer_rope=tuple(order.index(t) for t in arch.layer_types(config)),
    )


def spec_granite(config: dict[str, Any]) -> ArchSpec:
    """Granite (``GraniteConfig``: the four multipliers default to 1)."""
    return dataclasses.replace(
        _llama_spec(config),
        rms_norm_eps=arch.rms_norm_eps(config),
        tie_embeddings=arch.tie_word_embeddings(config),
        attn_scale=float(arch.value(config, "attention_multiplier")),
        embed_scale=float(arch.value(config, "embedding_multiplier")),
        residual_scale=float(arch.value(config, "residual_multiplier")),
        logits_divisor=float(arch.value(config, "logits_scaling")),
    )


def olmo2_layer(
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
    """``x + norm(attn(x))``, then ``x + norm(mlp(x))``: OLMo 2's norms sit after each sublayer."""
    lora = lora or {}
    eps = spec.rms_norm_eps
    h = attention_block(spec, p["self_attn"], x, cos=cos, sin=sin, mask=mask, ctx=ctx, lora=lora.get("self_attn"))
    x = x + rms_norm(h, p["post_attention_layernorm"]["weight"], eps, weight_fp32=spec.norm_weight_fp32)
    h = mlp_block(spec, p["mlp"], x, ctx, lora.get("mlp"))
    return x + rms_norm(h, p["post_feedforward_layernorm"]["weight"], eps, weight_fp32=spec.norm_weight_fp32)


def spec_granitemoe(config: dict[str, Any]) -> ArchSpec:
    """Granite 3 MoE (``GraniteMoeConfig``): Granite's multipliers, every layer's MLP a routed expert block. Its
    router takes the softmax of the top-k logits, which equals Mixtral's softmax over all experts renormalised
    over the top k."""
    return dataclasses.replace(
        spec_granite(config),
        intermediate_size=0,
        moe=MoESpec(num_experts=arch.num_experts(config), top_k=arch.experts_per_tok(config),
                    expert_intermediate_size=arch.moe_intermediate_size(config), norm_topk_prob=True),
    )


def granitemoe_recipe(name: str, spec: ArchSpec) -> Any:
    """In-memory names -> Granite MoE checkpoints: ``block_sparse_moe`` with the experts already fused
    (``input_linear`` [E, 2I, d] = gate_up_proj, gate first; ``output_linear`` [E, d, I]) and ``router.layer``."""
    from aegis.train.models.families import Recipe  # the registry imports this module

    for ours, theirs in ((".mlp.gate.weight", ".block_sparse_moe.router.layer.weight"),
                         (".mlp.experts.gate_up_proj", ".block_sparse_moe.input_linear.weight"),
                         (".mlp.experts.down_proj", ".block_sparse_moe.output_linear.weight")):
        if name.endswith(ours):
            return Recipe((name[: -len(ours)] + theirs,))
    return Recipe((name,))


def granite_layer(
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
    """Llama's pre-norm layer with each sublayer output times ``residual_multiplier`` before the add."""
    lora = lora or {}
    eps = spec.rms_norm_eps
    h = rms_norm(x, p["input_layernorm"]["weight"], eps)
    h = attention_block(spec, p["self_attn"], h, cos=cos, sin=sin, mask=mask, ctx=ctx, lora=lora.get("self_attn"))
    x = x + h * spec.residual_scale
    h = rms_norm(x, p["post_attention_layernorm"]["weight"], eps)
    ff = moe_block if spec.moe is not None else mlp_block  # Granite MoE: the routed experts
    return x + ff(spec, p["mlp"], h, ctx, lora.get("mlp")) * spec.residual_scale
