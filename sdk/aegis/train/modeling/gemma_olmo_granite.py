"""Llama-shaped decoders that differ from Llama in a few places: Gemma 1, OLMo 2, Granite (3.x).

Their specs (`aegis.models.arch_spec`, JAX-free) start from the Llama family's :class:`ArchSpec` for the same
config.json and change what its transformers ``modeling_*.py`` changes; OLMo 2 and Granite also have their own
decoder layer, here. The registry (``families.FAMILIES``) lists them.

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

from typing import Any

import jax

from aegis.train.modeling.layers import Ctx, attention_block, mlp_block, moe_block, rms_norm
from aegis.models.shapes import ArchSpec

__all__ = ["granitemoe_recipe", "olmo2_layer", "granite_layer"]


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


def granitemoe_recipe(name: str, spec: ArchSpec) -> Any:
    """In-memory names -> Granite MoE checkpoints: ``block_sparse_moe`` with the experts already fused
    (``input_linear`` [E, 2I, d] = gate_up_proj, gate first; ``output_linear`` [E, d, I]) and ``router.layer``."""
    from aegis.train.modeling.families import Recipe  # the registry imports this module

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
