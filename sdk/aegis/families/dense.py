"""Dense llama-like decoders: Llama, Mistral, Qwen2/2.5 (qkv bias), Qwen3 (q/k norm), Phi-3 (fused projections).

Biases, head_dim, kv heads and sliding windows are read with transformers' defaults by the base `Family`
(`aegis.architectures.config`); these classes only add what differs in shape."""

from __future__ import annotations

from typing import Any

from aegis.families.base import Family, Linear

__all__ = ["LlamaFamily", "Qwen2Family", "Qwen3Family", "Phi3Family"]


class LlamaFamily(Family):
    name = "llama"
    description = "dense decoder"
    model_types = ("llama", "mistral")


class Qwen2Family(Family):
    """Qwen2/2.5: bias on q, k and v (not o); layers from ``max_window_layers`` on slide when
    ``use_sliding_window``."""

    name = "qwen2"
    model_types = ("qwen2",)


class Qwen3Family(Family):
    """Qwen3 dense: RMSNorm on q and k per head."""

    name = "qwen3"
    qk_norm = True
    model_types = ("qwen3",)

    def layer_norm_params(self, c: dict[str, Any]) -> int:
        return 2 * self.hidden(c) + 2 * self.head_dim(c)


class Phi3Family(Family):
    """Phi-3: fused qkv_proj and gate_up_proj. PEFT targets them by those names only: q_proj or gate_proj
    select nothing in a Phi-3 model."""

    name = "phi3"
    model_types = ("phi3",)

    def attention_linears(self, c: dict[str, Any], layer: int) -> list[Linear]:
        h, hd = self.hidden(c), self.head_dim(c)
        q, kv = self.heads(c) * hd, self.kv_heads(c) * hd
        return [
            Linear("qkv_proj", h, q + 2 * kv, matched_by=("qkv_proj",)),
            Linear("o_proj", q, h, matched_by=("o_proj",)),
        ]

    def mlp_linears(self, c: dict[str, Any], width: int, prefix: str = "", count: int = 1) -> list[Linear]:
        h = self.hidden(c)
        return [
            Linear("gate_up_proj", h, 2 * width, matched_by=("gate_up_proj",)),
            Linear("down_proj", width, h, matched_by=("down_proj",)),
        ]
