"""Mixture-of-experts decoders: Mixtral, Qwen2-MoE (Qwen1.5-MoE, shared expert + gate), Qwen3-MoE.

In transformers 5 the routed experts of a layer are two fused 3-D parameters
(``experts.gate_up_proj`` [E, 2I, H] and ``experts.down_proj`` [E, H, I]) and the router a bare
weight (``mlp.gate.weight`` [E, H]), none of them nn.Linear: bitsandbytes does not quantize them
(``quantizable=False``). PEFT 0.21 still adapts them for Mixtral and Qwen3-MoE: it maps the v4 names
(Mixtral's ``w1``/``w3``/``w2``, Qwen3's ``gate_proj``/``up_proj``/``down_proj``, the router ``gate``, all
of them under ``"all-linear"``) to ``target_parameters`` wrapped by ``lora.ParamWrapper``, rank r per
expert (2r on the fused gate+up). Qwen2-MoE's experts and router stay un-adapted
(``lora_targetable=False`` / ``router_params``).
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

    peft_expert_targets: tuple[tuple[str, ...], tuple[str, ...]] | None = None
    """The v4 target names PEFT maps to the fused ``gate_up_proj`` (adapted at rank 2r) and ``down_proj``
    expert tensors; None where PEFT leaves the experts alone."""

    def experts(self, c: dict[str, Any]) -> list[Linear]:
        h, w, e = self.hidden(c), self.expert_width(c), self.num_experts(c)
        if self.peft_expert_targets is None:
            return [
                Linear("experts.gate_up_proj", h, 2 * w, count=e, lora_targetable=False, quantizable=False),
                Linear("experts.down_proj", w, h, count=e, lora_targetable=False, quantizable=False),
            ]
        gate_up, down = self.peft_expert_targets
        return [
            Linear("experts.gate_up_proj", h, 2 * w, count=e, quantizable=False, lora_rank_factor=2, matched_by=gate_up),
            Linear("experts.down_proj", w, h, count=e, quantizable=False, matched_by=down),
        ]

    def shared_linears(self, c: dict[str, Any]) -> list[Linear]:
        return []

    peft_router = False
    """Whether PEFT adapts the router weight (targeted as ``gate``): then it is a LoRA-targetable linear
    here, else plain ``router_params``."""

    def router(self, c: dict[str, Any]) -> list[Linear]:
        if not self.peft_router:
            return []
        return [Linear("mlp.gate", self.hidden(c), self.num_experts(c), quantizable=False, matched_by=("gate",))]

    def layer(self, c: dict[str, Any], i: int) -> LayerShape:
        if not self.is_sparse(c, i):
            return super().layer(c, i)
        h, w = self.hidden(c), self.expert_width(c)
        router = self.router(c)
        return LayerShape(
            linears=tuple(self.attention_linears(c, i) + router + self.experts(c) + self.shared_linears(c)),
            norm_params=self.layer_norm_params(c),
            router_params=0 if router else self.num_experts(c) * h,
            sliding_window=self.sliding_window(c, i),
            num_experts=self.num_experts(c),
            experts_per_tok=self.top_k(c),
            expert_params=3 * h * w,
            shared_expert_intermediate=cfg_int(c, "shared_expert_intermediate_size", default=0),
            mlp_intermediate=w,
        )


class MixtralFamily(_MoEFamily):
    """Mixtral: PEFT (0.21) wraps the fused experts when w1/w3 (gate_up, rank 2r) and w2 (down) are targeted,
    and the router as ``gate``."""

    name = "mixtral"
    model_types = ("mixtral",)
    peft_router = True
    peft_expert_targets = (("w1", "w3"), ("w2",))

    def expert_width(self, c: dict[str, Any]) -> int:
        return cfg_int(c, "intermediate_size")  # MixtralConfig has no moe_intermediate_size

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
    ParamWrapper when gate/up/down_proj are targeted: rank r per expert on down_proj, 2r on gate_up_proj;
    and the router as ``gate``."""

    name = "qwen3_moe"
    model_types = ("qwen3_moe",)
    peft_router = True
    peft_expert_targets = (("gate_proj", "up_proj"), ("down_proj",))

    def layer_norm_params(self, c: dict[str, Any]) -> int:
        return 2 * self.hidden(c) + 2 * self.head_dim(c)
