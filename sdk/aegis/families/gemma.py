"""Gemma 2 and Gemma 3 (text): explicit head_dim, four norms per layer, tied 256k embeddings,
soft-capping (Gemma 2), sliding-window layers, q/k norm (Gemma 3)."""

from __future__ import annotations

from typing import Any

from aegis.architectures import config as arch
from aegis.families.base import Family

__all__ = ["Gemma2Family", "Gemma3Family"]


class Gemma2Family(Family):
    name = "gemma2"
    description = "dense decoder, sliding-window + global attention"
    model_types = ("gemma2",)

    def layer_norm_params(self, c: dict[str, Any]) -> int:
        return 4 * self.hidden(c)

    sdpa_supported = False  # transformers 5: Gemma2 runs eager (soft-capped attention scores)
    gemma_norm = True
    post_norms = True

    def logit_softcap(self, c: dict[str, Any]) -> float | None:
        return arch.value(c, "final_logit_softcapping")  # Gemma 2 default 30.0, Gemma 3 None

    def attention_softcap(self, c: dict[str, Any]) -> float | None:
        return arch.value(c, "attn_logit_softcapping")  # Gemma 2 default 50.0, Gemma 3 None


class Gemma3Family(Gemma2Family):
    name = "gemma3"
    qk_norm = True
    model_types = ("gemma3_text", "gemma3")
    sdpa_supported = True

    def layer_norm_params(self, c: dict[str, Any]) -> int:
        return 4 * self.hidden(c) + 2 * self.head_dim(c)
