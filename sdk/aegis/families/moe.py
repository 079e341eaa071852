"""Mixture-of-experts decoders: Mixtral, Qwen2-MoE (Qwen1.5-MoE, shared expert + gate), Qwen3-MoE.

In transformers 5 the routed experts of a layer are two fused 3-D parameters
(``experts.gate_up_proj`` [E, 2I, H] and ``experts.down_proj`` [E, H, I]), not nn.Linear modules:
PEFT's ``target_modules`` names do not reach them and bitsandbytes does not quantize them. The shapes
here say so (``lora_targetable=False``, ``quantizable=False``) so LoRA and QLoRA are sized as they run.
"""

from __future__ import annotations

from typing import Any

from aegis.families.base import Family, LayerShape, Linear, cfg_int
from aegis.families.dense import with_qkv_bias

__all__ = ["MixtralFamily", "Qwen2MoeFamily", "Qwen3MoeFamily"]


class _MoEFamily(Family):
    description = "mixture of experts"

    def num_experts(self, c: dict[str, Any]) -> int:
        return cfg_int(c, "num_local_experts", "num_experts")

    def top_k(self, c: dict[str, Any]) -> int:
        return cfg_int(c, "num_experts_per_tok")

    def expert_width(self, c: dict[str, Any]) -> int:
        return cfg_int(c, "moe_intermediate_size", "intermediate_size")

    def is_sparse(self, c: dict[str, Any], i: int) -> bool:
        step = cfg_int(c, "decoder_sparse_step", default=1) or 1
        return i not in (c.get("mlp_only_layers") or []) and self.num_experts(c) > 0 and (i + 1) % step == 0

    def experts(self, c: dict[str, Any]) -> list[Linear]:
        h, w, e = self.hidden(c), self.expert_width(c), self.num_experts(c)
        return [
            Linear("experts.gate_up_proj", h, 2 * w, count=e, lora_targetable=False, quantizable=False),
            Linear("experts.down_proj", w, h, count=e, lora_targetable=False, quantizable=False),
        ]

    def shared_linears(self, c: dict[str, Any]) -> list[Linear]:
        return []

    def layer(self, c: dict[str, Any], i: int) -> LayerShape:
        if not self.is_sparse(c, i):
            return super().layer(c, i)
        h, w = self.hidden(c), self.expert_width(c)
        return LayerShape(
            linears=tuple(self.attention_linears(c, i) + self.experts(c) + self.shared_linears(c)),
            norm_params=self.layer_norm_params(c),
            router_params=self.num_experts(c) * h,
            sliding_window=self.sliding_window(c, i),
            num_experts=self.num_experts(c),
            experts_per_tok=self.top_k(c),
            expert_params=3 * h * w,
            shared_expert_intermediate=cfg_int(c, "shared_expert_intermediate_size", default=0),
            mlp_intermediate=w,
        )


class MixtralFamily(_MoEFamily):
    name = "mixtral"
    model_types = ("mixtral",)

    def sliding_window(self, c: dict[str, Any], layer: int) -> int | None:
        return c.get("sliding_window")


class Qwen2MoeFamily(_MoEFamily):
    """Qwen2-MoE / Qwen1.5-MoE: q/k/v bias, a shared expert with a sigmoid gate in every sparse layer."""

    name = "qwen2_moe"
    model_types = ("qwen2_moe",)

    def attention_linears(self, c: dict[str, Any], layer: int) -> list[Linear]:
        linears = super().attention_linears(c, layer)
        return with_qkv_bias(linears) if c.get("qkv_bias", True) else linears

    def shared_linears(self, c: dict[str, Any]) -> list[Linear]:
        width = cfg_int(c, "shared_expert_intermediate_size")
        return [
            *self.mlp_linears(c, width, prefix="shared_expert."),
            Linear("shared_expert_gate", self.hidden(c), 1, matched_by=("shared_expert_gate",)),
        ]


class Qwen3MoeFamily(_MoEFamily):
    """Qwen3-MoE: q/k norm, no shared expert. PEFT (0.21) wraps its fused expert tensors with a
    ParamWrapper when gate/up/down_proj are targeted: rank r per expert on down_proj, 2r on gate_up_proj."""

    name = "qwen3_moe"
    model_types = ("qwen3_moe",)

    def experts(self, c: dict[str, Any]) -> list[Linear]:
        h, w, e = self.hidden(c), self.expert_width(c), self.num_experts(c)
        return [
            Linear("experts.gate_up_proj", h, 2 * w, count=e, quantizable=False, lora_rank_factor=2,
                   matched_by=("gate_proj", "up_proj", "gate_up_proj")),
            Linear("experts.down_proj", w, h, count=e, quantizable=False, matched_by=("down_proj",)),
        ]

    def layer_norm_params(self, c: dict[str, Any]) -> int:
        return 2 * self.hidden(c) + 2 * self.head_dim(c)
