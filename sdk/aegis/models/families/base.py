"""The architecture family: what Aegis must know about a decoder to size it, read from the registry.

A family turns a config.json dict into per-layer shapes: the nn.Linear modules (with the names PEFT
targets), norm and router parameters, and the widths the activation model needs. Every shape is an
expression of the family's registry entry (`aegis.models.architectures.registry`, ``_data/<model_type>.json``)
evaluated on the config; parameter counts in `ModelProfile` are sums over these shapes — never looked up.

    family = get_family(config)
    layers = family.layers(config)
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from aegis.models.architectures import config_keys as arch
from aegis.models.architectures import registry
from aegis.errors import InvalidConfigError

__all__ = ["Linear", "LayerShape", "Family", "cfg_int"]


@dataclass(frozen=True)
class Linear:
    """One weight matrix kind inside a layer. ``count`` > 1 for MoE experts."""

    name: str
    in_features: int
    out_features: int
    count: int = 1
    bias: bool = False
    matched_by: tuple[str, ...] = ()
    """LoRA target names that select this module (its own name, plus e.g. q_proj for a fused qkv_proj)."""
    lora_targetable: bool = True
    quantizable: bool = True
    lora_rank_factor: int = 1
    """LoRA rank multiple PEFT gives this module (2 for a fused gate+up expert tensor)."""

    @property
    def params(self) -> int:
        return self.count * (self.in_features * self.out_features + (self.out_features if self.bias else 0))


@dataclass(frozen=True)
class LayerShape:
    """Everything in one decoder layer that holds parameters or sizes activations."""

    linears: tuple[Linear, ...]
    norm_params: int
    router_params: int = 0
    sliding_window: int | None = None
    num_experts: int = 0
    experts_per_tok: int = 0
    expert_params: int = 0
    """Parameters of one routed expert (MoE layers)."""
    shared_expert_intermediate: int = 0
    mlp_intermediate: int = 0
    """Dense MLP width, or one routed expert's width."""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def params(self) -> int:
        return sum(lin.params for lin in self.linears) + self.norm_params + self.router_params

    @property
    def active_params(self) -> int:
        """Parameters one token touches: all but the experts it is not routed to."""
        return self.params - (self.num_experts - self.experts_per_tok) * self.expert_params


def cfg_int(config: dict[str, Any], *keys: str, default: int | None = None) -> int:
    """First present key of ``config`` as int; an InvalidConfigError naming the key when none is."""
    for key in keys:
        value = config.get(key)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value or value < 0:
                raise InvalidConfigError(f"config.json key {key!r} must be a non-negative integer, got {value!r}")
            return int(value)
    if default is not None:
        return default
    raise InvalidConfigError(f"config.json has no {keys[0]!r}: is this a causal-LM config.json from the Hugging Face Hub?")


class Family:
    """A decoder family as the architecture registry describes it (`aegis.models.architectures.registry`): the config
    readers, the per-layer shapes and the activation model's knobs all come from one ``_data/<model_type>.json``."""

    def __init__(self, entry: registry.Architecture) -> None:
        self.entry = entry
        self.name = entry.family
        self.description = entry.description
        self.model_types = (entry.model_type, *entry.also_model_types)
        moe = entry.moe
        self.sdpa_supported = entry.sdpa
        """False where transformers refuses attn_implementation='sdpa' (it runs eager)."""
        self.gemma_norm = entry.gemma_norm
        """Gemma's ``(1 + w)`` RMSNorm: the product is taken in float32 (it keeps a float32 normalised tensor)."""
        self.norm_product_float32 = entry.gemma_norm or entry.norm_weight_float32
        """The RMSNorm's weight product is taken in float32 and cast back (Gemma; OLMo 2/3 and GPT-OSS's
        ``(weight * x).to(dtype)``): a trained weight keeps the float32 normalised tensor; the output has x's dtype."""
        self.pre_norms = entry.pre_norms
        """A norm before attention and before the MLP (all but OLMo 2)."""
        self.post_norms = entry.post_norms
        """A norm on the attention and MLP outputs before the residual add (Gemma 2/3, OLMo 2)."""
        self.plain_mlp = entry.mlp_kind == "plain"
        """The two-matrix MLP ``out(act(in(x)))`` (Phi, StarCoder2) instead of the gated one."""
        self.shared_expert_gate = bool(moe and moe.shared and moe.shared.gated)
        """A sigmoid gate scales the shared expert's output (Qwen2-MoE); DeepSeek adds it ungated."""
        self.attention_sinks = entry.attention_sinks
        """A learned per-head sink logit joins the eager softmax, which runs in the compute dtype (GPT-OSS)."""
        self.layer_norm: bool | str = ("manual" if entry.layer_norm and entry.manual_layer_norm else
                                       "float32" if entry.layer_norm and entry.float32_layer_norm else entry.layer_norm)
        """LayerNorm (weight and bias; saves its input, mean and rstd) instead of RMSNorm (Phi-MoE); ``"manual"``:
        written out in float32 ops (Cohere's ``CohereLayerNorm``); ``"float32"``: no weight or bias, on a float32
        copy of the input, cast back (``OlmoLayerNorm``)."""
        self.expert_act_saved_widths = moe.act_saved_widths if moe else 3
        """Tensors of one expert's width that its activation saves per routed token (`registry.MoE`)."""

    def __repr__(self) -> str:
        return f"Family({self.name!r})"

    def _names(self, c: dict[str, Any]) -> registry.Vars:
        return self.entry.names(c)

    # -- config readers ---------------------------------------------------------------------------
    def hidden(self, c: dict[str, Any]) -> int:
        return arch.required_int(c, "hidden_size")  # GPT-2's n_embd (the registry's attribute_map)

    def num_layers(self, c: dict[str, Any]) -> int:
        return arch.required_int(c, "num_hidden_layers")

    def heads(self, c: dict[str, Any]) -> int:
        return arch.required_int(c, "num_attention_heads")

    # keys a config.json may omit: read with transformers' defaults (`aegis.models.architectures.config_keys`), or as the
    # registry derives them (DeepSeek: every head has its own keys; q/k heads are nope + rope wide)
    def kv_heads(self, c: dict[str, Any]) -> int:
        return int(self._names(c)["kv_heads"])

    def head_dim(self, c: dict[str, Any]) -> int:
        return int(self._names(c)["head_dim"])

    def intermediate(self, c: dict[str, Any]) -> int:
        return int(self._names(c)["intermediate"])

    def vocab(self, c: dict[str, Any]) -> int:
        return arch.required_int(c, "vocab_size")

    def tied(self, c: dict[str, Any]) -> bool:
        return arch.tie_word_embeddings(c)

    def max_positions(self, c: dict[str, Any]) -> int:
        return arch.max_position_embeddings(c)

    # -- MoE readers ---------------------------------------------------------------------------------
    def num_experts(self, c: dict[str, Any]) -> int:
        return arch.num_experts(c)

    def top_k(self, c: dict[str, Any]) -> int:
        return arch.experts_per_tok(c)

    def expert_width(self, c: dict[str, Any]) -> int:
        return arch.moe_intermediate_size(c)

    def is_sparse(self, c: dict[str, Any], i: int) -> bool:
        return self.entry.is_sparse(c, i)

    # -- shapes ------------------------------------------------------------------------------------
    @staticmethod
    def _linear(p: registry.Param, v: registry.Vars, *, targetable_router: bool = True) -> Linear:
        dims = p.linear if p.linear is not None else p.experts
        assert dims is not None
        i, o = (int(registry.evaluate(x, v)) for x in dims)
        experts = p.experts is not None
        peft = p.peft if p.peft is not None else (p.path.rsplit(".", 1)[-1],)
        quantizable = p.quantizable if p.quantizable is not None else not experts
        return Linear(
            p.short_name, i, o, count=int(v["experts"]) if experts else 1,
            bias=bool(registry.evaluate(p.bias, v)), matched_by=tuple(peft),
            lora_targetable=p.lora and bool(peft) and targetable_router, quantizable=quantizable,
            lora_rank_factor=p.rank_factor,
        )

    def _linears(self, params: tuple[registry.Param, ...], v: registry.Vars) -> list[Linear]:
        return [self._linear(p, v) for p in params if p.kind in ("linear", "experts") and p.present(v)]

    @staticmethod
    def _vector_params(params: tuple[registry.Param, ...], v: registry.Vars) -> int:
        """Elements of the bare (non-linear) parameters: norm vectors, sinks, Cohere's per-head q/k norm matrices."""
        total = 0
        for p in params:
            if p.kind in ("vector", "matrix") and p.present(v):
                total += math.prod(int(registry.evaluate(x, v)) for x in (p.matrix or (p.vector,)))
        return total

    def attention_linears(self, c: dict[str, Any], layer: int) -> list[Linear]:
        return self._linears(self.entry.attention, self._names(c))

    def layer_norm_params(self, c: dict[str, Any]) -> int:
        """Vector parameters of one layer: its norms, q/k norms, MLA's latent norms, attention sinks."""
        return self._layer_vectors(self._names(c))

    def _layer_vectors(self, v: registry.Vars) -> int:
        return self._vector_params(self.entry.attention, v) + self._vector_params(self.entry.norms, v)

    def layers(self, c: dict[str, Any]) -> list[LayerShape]:
        """Every layer's shape. A layer depends on its index only through its sliding window and whether it
        routes, so each (sparse, window) kind is built once and shared (equal layers are the same object)."""
        v = self._names(c)
        windows = arch.layer_windows(c)
        built: dict[tuple[bool, int | None], LayerShape] = {}
        out = []
        for i in range(self.num_layers(c)):
            kind = (self.entry.moe is not None and self.is_sparse(c, i), windows[i])
            if kind not in built:
                built[kind] = self._layer(c, v, sparse=kind[0], window=kind[1])
            out.append(built[kind])
        if out and self._last_parameter_is_a_layers_linear(c, v):
            # transformers' bitsandbytes integration keeps the module of the model's last named parameter unquantised
            # (get_keys_to_not_convert): a tied model's head is the embedding, so with no final-norm parameter it is
            # the last layer's last linear (OLMo-1B: down_proj, traced)
            last = out[-1]
            *rest, lin = last.linears
            out[-1] = dataclasses.replace(last, linears=(*rest, dataclasses.replace(lin, quantizable=False)))
        return out

    def _last_parameter_is_a_layers_linear(self, c: dict[str, Any], v: registry.Vars) -> bool:
        return (self.tied(c) and not self.lm_head_bias(c) and not self.final_norm_params(c)
                and not self._vector_params(self.entry.norms, v) and self.entry.moe is None)

    def _layer(self, c: dict[str, Any], v: registry.Vars, *, sparse: bool, window: int | None) -> LayerShape:
        moe = self.entry.moe
        extra: dict[str, Any] = {}
        if self.entry.mla:
            m = arch.mla(c)
            assert m is not None
            extra["mla"] = {"v_head_dim": m.v_head_dim, "q_lora_rank": m.q_lora_rank, "kv_lora_rank": m.kv_lora_rank,
                            "qk_rope_head_dim": m.qk_rope_head_dim, "qk_nope_head_dim": m.qk_nope_head_dim}
        attention = self._linears(self.entry.attention, v)
        if moe is None or not sparse:
            return LayerShape(
                linears=tuple(attention + self._linears(self.entry.mlp, v)),
                norm_params=self._layer_vectors(v),
                sliding_window=window,
                mlp_intermediate=int(v["intermediate"]),
                extra=extra,
            )
        router = [self._linear(moe.router, v)] if moe.router_is_linear else []
        shared = self._linears(moe.shared.params, v) if moe.shared is not None and v["shared_width"] else []
        return LayerShape(
            linears=tuple(attention + router + self._linears(moe.experts, v) + shared),
            norm_params=self._layer_vectors(v),
            router_params=0 if router else int(registry.evaluate(moe.router_params, v)),
            sliding_window=window,
            num_experts=int(v["experts"]),
            experts_per_tok=int(v["top_k"]),
            expert_params=int(registry.evaluate(moe.expert_params, v)),
            shared_expert_intermediate=int(v["shared_width"]),
            mlp_intermediate=int(v["expert_width"]),
            extra=extra,
        )

    def layers_for(self, c: dict[str, Any], transformers_major: int) -> list[LayerShape]:
        """`layers` as a given transformers major builds the modules. Under transformers 4.x an MoE with a 4.x
        layout in the registry (``moe.v4_experts``) keeps its experts as ``num_experts`` separate gate/up/down
        ``nn.Linear`` (quantisable, LoRA-targetable by their own names at rank r) and the router an ``nn.Linear``
        named ``gate`` (DeepSeek: a bare weight, ``moe.v4_router_is_linear``): bitsandbytes quantises them all under
        QLoRA."""
        layers = self.layers(c)
        moe = self.entry.moe
        if transformers_major >= 5 or moe is None or moe.v4_experts is None:
            return layers
        gate, up, down = moe.v4_experts
        h, e = self.hidden(c), self.num_experts(c)
        out = []
        for layer in layers:
            if not layer.num_experts:
                out.append(layer)
                continue
            w = layer.mlp_intermediate
            # every other nn.Linear is one PEFT wraps by its own name (transformers 5 + PEFT leave DeepSeek's shared
            # experts alone when the routed experts' names are targeted; 4.x has no such mapping)
            kept = [lin if lin.lora_targetable or not lin.quantizable
                    else dataclasses.replace(lin, lora_targetable=True, matched_by=(lin.name.rsplit(".", 1)[-1],))
                    for lin in layer.linears if not lin.name.startswith("experts.") and lin.name != moe.router.name]
            experts = [
                Linear(f"experts.{gate}", h, w, count=e, matched_by=(gate,)),
                Linear(f"experts.{up}", h, w, count=e, matched_by=(up,)),
                Linear(f"experts.{down}", w, h, count=e, matched_by=(down,)),
            ]
            if moe.v4_router_is_linear:
                router, router_params = [Linear("mlp.gate", h, e, matched_by=("gate",))], 0
            else:
                router, router_params = [], int(registry.evaluate(moe.router_params, self._names(c)))
            out.append(dataclasses.replace(layer, linears=tuple(kept + router + experts), router_params=router_params))
        return out

    def position_embedding_params(self, c: dict[str, Any]) -> int:
        """Parameters of a learned absolute position embedding (GPT-2's ``wpe``: positions x hidden), else 0."""
        p = self.entry.position_embedding
        if p is None:
            return 0
        rows, cols = (int(registry.evaluate(x, self._names(c))) for x in p.matrix or ())
        return rows * cols

    def clip_qkv(self, c: dict[str, Any]) -> float | None:
        return arch.clip_qkv(c)

    def final_norm_params(self, c: dict[str, Any]) -> int:
        return self._vector_params(self.entry.final_norm, self._names(c))

    # -- activation-model knobs ----------------------------------------------------------------------
    def qk_norm(self, c: dict[str, Any]) -> bool:
        """A norm on the q and k projections (RMSNorm per head: Qwen3, Gemma 3; over the whole width: OLMo 2;
        Phi's per-head LayerNorm when ``qk_layernorm``)."""
        return self.entry.has_qk_norm(c)

    def hidden_act(self, c: dict[str, Any]) -> str:
        """The MLP activation's ``ACT2FN`` name (``hidden_act``, or Gemma's ``hidden_activation``)."""
        return str(c.get("hidden_activation") or arch.value(c, "hidden_act") or "silu")

    def embedding_dropout(self, c: dict[str, Any]) -> float:
        """Dropout probability on the token embeddings in training (Phi ``embd_pdrop``), else 0."""
        return arch.embedding_dropout(c)

    def logit_softcap(self, c: dict[str, Any]) -> float | None:
        key = self.entry.logit_softcap_key
        return arch.value(c, key) if key else None

    def attention_softcap(self, c: dict[str, Any]) -> float | None:
        key = self.entry.attention_softcap_key
        return arch.value(c, key) if key else None

    def residual_dropout(self, c: dict[str, Any]) -> float:
        """Dropout probability on each sublayer's output before the residual add (Seed-OSS), else 0."""
        return arch.residual_dropout(c)

    def attention_dropout(self, c: dict[str, Any]) -> float:
        """``attention_dropout`` of the config, or its transformers default (the registry lists it for every family)."""
        return arch.attention_dropout(c)

    def kv_cache_elements(self, c: dict[str, Any]) -> int:
        """Elements the KV cache holds per token and layer: keys and values of every kv head (MLA: its latent)."""
        return int(registry.evaluate(self.entry.kv_cache_elements, self._names(c)))

    def logits_scaling(self, c: dict[str, Any]) -> float | None:
        """The factor the logits are multiplied by before the loss (Granite: one over ``logits_scaling``; Cohere:
        ``logit_scale``), or None: a scaled copy of the logits is one more [tokens, vocab] tensor."""
        divisor = arch.value(c, self.entry.logits_scaling_key) if self.entry.logits_scaling_key else None
        factor = arch.value(c, self.entry.logit_scale_key) if self.entry.logit_scale_key else None
        if divisor not in (None, 1, 1.0):
            return 1.0 / float(divisor)
        return None if factor in (None, 1, 1.0) else float(factor)

    def lm_head_bias(self, c: dict[str, Any]) -> bool:
        """Whether the output projection has a bias (Phi-MoE's ``lm_head_bias``)."""
        return arch.lm_head_bias(c)
