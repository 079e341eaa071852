"""Gemma 2 and Gemma 3 (text): explicit head_dim, four norms per layer, tied 256k embeddings,
soft-capping (Gemma 2), sliding-window layers, q/k norm (Gemma 3)."""

from __future__ import annotations

from typing import Any

from aegis.families.base import Family

__all__ = ["Gemma2Family", "Gemma3Family"]


class Gemma2Family(Family):
    name = "gemma2"
    description = "dense decoder, sliding-window + global attention"
    model_types = ("gemma2",)

    def tied(self, c: dict[str, Any]) -> bool:
        return bool(c.get("tie_word_embeddings", True))

    def layer_norm_params(self, c: dict[str, Any]) -> int:
        return 4 * self.hidden(c)

    def sliding_window(self, c: dict[str, Any], layer: int) -> int | None:
        types = c.get("layer_types")
        if types:
            return c.get("sliding_window") if types[layer] == "sliding_attention" else None
        return c.get("sliding_window") if layer % 2 == 0 else None

    sdpa_supported = False  # transformers 5: Gemma2 runs eager (soft-capped attention scores)

    def logit_softcap(self, c: dict[str, Any]) -> float | None:
        return c.get("final_logit_softcapping")

    def attention_softcap(self, c: dict[str, Any]) -> float | None:
        return c.get("attn_logit_softcapping")


class Gemma3Family(Gemma2Family):
    name = "gemma3"
    model_types = ("gemma3_text", "gemma3")
    sdpa_supported = True

    def layer_norm_params(self, c: dict[str, Any]) -> int:
        return 4 * self.hidden(c) + 2 * self.head_dim(c)

    def sliding_window(self, c: dict[str, Any], layer: int) -> int | None:
        types = c.get("layer_types")
        if types:
            return c.get("sliding_window") if types[layer] == "sliding_attention" else None
        pattern = c.get("sliding_window_pattern", 6)
        return c.get("sliding_window") if (layer + 1) % pattern else None
