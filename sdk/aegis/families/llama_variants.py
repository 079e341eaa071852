"""Llama-shaped decoders that differ from Llama in a few places: Gemma 1, OLMo 2, Granite (3.x).

Shapes are Llama's (q/k/v/o, gated MLP); keys a config.json may omit (Gemma's head_dim 256 and tied
embeddings, OLMo 2's eps) are read with transformers' defaults by the base `Family`
(`aegis.architectures.config`). What differs:

- **Gemma**: ``(1 + w)`` RMSNorm (two per layer), embeddings scaled by ``sqrt(hidden_size)``, GeGLU.
- **OLMo 2**: no pre-norms; a norm on the attention and on the MLP output before the residual add,
  and q_norm/k_norm over the whole q and k projection widths.
- **Granite**: embedding, residual and attention multipliers (no parameters), logits divided by
  ``logits_scaling`` before the loss.
"""

from __future__ import annotations

from typing import Any

from aegis.architectures import config as arch
from aegis.families.base import Family

__all__ = ["GemmaFamily", "Olmo2Family", "GraniteFamily"]


class GemmaFamily(Family):
    name = "gemma"
    description = "dense decoder (Gemma 1)"
    model_types = ("gemma",)
    gemma_norm = True


class Olmo2Family(Family):
    name = "olmo2"
    description = "dense decoder, post-sublayer norms"
    model_types = ("olmo2",)
    pre_norms = False
    post_norms = True
    qk_norm = True

    def layer_norm_params(self, c: dict[str, Any]) -> int:
        """post_attention_layernorm and post_feedforward_layernorm, q_norm and k_norm (full widths)."""
        hd = self.head_dim(c)
        return 2 * self.hidden(c) + (self.heads(c) + self.kv_heads(c)) * hd


class GraniteFamily(Family):
    name = "granite"
    description = "dense decoder (Granite)"
    model_types = ("granite",)

    def logits_scaling(self, c: dict[str, Any]) -> float | None:
        scale = arch.value(c, "logits_scaling")
        return None if scale in (None, 1, 1.0) else float(scale)
