"""The family registry: config.json ``model_type`` -> how to build the :class:`ArchSpec`, the layer
function, and how checkpoint tensor names map to the parameter tree.

Each family mirrors its transformers ``Config.__post_init__`` (derived layer types, rope defaults)
and ``modeling_*.py`` (biases, norms, routing). Adding an architecture means writing one
``_spec_*`` function (and, if its layer differs, a layer function built from ``layers``) and one
entry in :data:`FAMILIES`.

    family = get_family("qwen2")            # UnsupportedArchitectureError lists the valid names
    spec = family.build_spec(config_dict)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from aegis.errors import UnsupportedArchitectureError
from aegis.train.models.decoder import LayerFn, standard_layer
from aegis.train.models.spec import (
    FULL_WINDOW,
    ArchSpec,
    MoESpec,
    check_layer_types,
    require,
    rope_for_layer_types,
    rope_single,
)

__all__ = ["Family", "Recipe", "FAMILIES", "get_family", "supported_model_types"]


def _first(xs: list[np.ndarray]) -> np.ndarray:
    return xs[0]


def _single(x: np.ndarray) -> list[np.ndarray]:
    return [x]


@dataclass(frozen=True)
class Recipe:
    """How one in-memory tensor is stored on disk: the checkpoint keys, and how to join / split them."""

    keys: tuple[str, ...]
    join: Callable[[list[np.ndarray]], np.ndarray] = _first
    split: Callable[[np.ndarray], list[np.ndarray]] = _single

    @property
    def stored_as_kept(self) -> bool:
        """One checkpoint tensor, kept as is (a loader may read it straight into place)."""
        return len(self.keys) == 1 and self.join is _first


def _identity_recipe(name: str, spec: ArchSpec) -> Recipe:
    return Recipe((name,))


@dataclass(frozen=True)
class Family:
    """One architecture family: the model types it serves and how to build and load them."""

    name: str
    model_types: tuple[str, ...]
    architectures: tuple[str, ...]
    build_spec: Callable[[dict[str, Any]], ArchSpec]
    layer_fn: LayerFn = standard_layer
    recipe: Callable[[str, ArchSpec], Recipe] = field(default=_identity_recipe)


# ----- shared config readers ------------------------------------------------------------------


def _head_dim(config: dict[str, Any], default: int | None = None) -> int:
    hidden, heads = require(config, "hidden_size"), require(config, "num_attention_heads")
    return int(config.get("head_dim") or default or hidden // heads)


def _base(config: dict[str, Any], head_dim: int, **kw: Any) -> dict[str, Any]:
    heads = require(config, "num_attention_heads")
    kv = config.get("num_key_value_heads") or heads
    if heads % kv:
        raise UnsupportedArchitectureError(
            f"num_attention_heads={heads} is not a multiple of num_key_value_heads={kv}."
        )
    return dict(
        model_type=config["model_type"],
        vocab_size=require(config, "vocab_size"),
        hidden_size=require(config, "hidden_size"),
        num_layers=require(config, "num_hidden_layers"),
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=head_dim,
        intermediate_size=config.get("intermediate_size") or 0,
        rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
        hidden_act=config.get("hidden_act") or config.get("hidden_activation") or "silu",
        initializer_range=float(config.get("initializer_range", 0.02)),
        attn_scale=head_dim**-0.5,
        **kw,
    )


def _uniform_window(config: dict[str, Any], n: int, *, enabled: bool = True) -> tuple[int, ...]:
    window = config.get("sliding_window")
    if not enabled or not window:
        return (FULL_WINDOW,) * n
    return (int(window),) * n


def _typed_windows(config: dict[str, Any], layer_types: list[str]) -> tuple[int, ...]:
    window = config.get("sliding_window")
    return tuple(int(window) if t == "sliding_attention" and window else FULL_WINDOW for t in layer_types)


def _qwen_layer_types(config: dict[str, Any]) -> list[str]:
    """Qwen2/Qwen3: layers ``i >= max_window_layers`` slide, when ``use_sliding_window``."""
    n = require(config, "num_hidden_layers")
    if config.get("layer_types"):
        return check_layer_types(config, list(config["layer_types"]))
    sliding = config.get("use_sliding_window", False) and config.get("sliding_window") is not None
    mwl = config.get("max_window_layers", 28)
    return ["sliding_attention" if sliding and i >= mwl else "full_attention" for i in range(n)]


def _single_rope_fields(config: dict[str, Any], head_dim: int, default_theta: float = 10_000.0) -> dict[str, Any]:
    n = require(config, "num_hidden_layers")
    return dict(ropes=(rope_single(config, head_dim, default_theta=default_theta),), layer_rope=(0,) * n)


# ----- dense llama-like -------------------------------------------------------------------------


def _spec_llama(config: dict[str, Any]) -> ArchSpec:
    hd = _head_dim(config)
    bias = bool(config.get("attention_bias", False))
    n = require(config, "num_hidden_layers")
    return ArchSpec(
        **_base(config, hd, qkv_bias=bias, o_bias=bias, mlp_bias=bool(config.get("mlp_bias", False))),
        tie_embeddings=bool(config.get("tie_word_embeddings", False)),
        layer_window=(FULL_WINDOW,) * n,
        **_single_rope_fields(config, hd),
    )


def _spec_mistral(config: dict[str, Any]) -> ArchSpec:
    hd = _head_dim(config)
    n = require(config, "num_hidden_layers")
    return ArchSpec(
        **_base(config, hd),
        tie_embeddings=bool(config.get("tie_word_embeddings", False)),
        layer_window=_uniform_window(config, n),
        **_single_rope_fields(config, hd),
    )


def _spec_qwen2(config: dict[str, Any]) -> ArchSpec:
    hd = _head_dim(config)
    return ArchSpec(
        **_base(config, hd, qkv_bias=True),
        tie_embeddings=bool(config.get("tie_word_embeddings", False)),
        layer_window=_typed_windows(config, _qwen_layer_types(config)),
        **_single_rope_fields(config, hd),
    )


def _spec_qwen3(config: dict[str, Any]) -> ArchSpec:
    hd = _head_dim(config, default=128)
    bias = bool(config.get("attention_bias", False))
    return ArchSpec(
        **_base(config, hd, qkv_bias=bias, o_bias=bias, qk_norm=True),
        tie_embeddings=bool(config.get("tie_word_embeddings", False)),
        layer_window=_typed_windows(config, _qwen_layer_types(config)),
        **_single_rope_fields(config, hd),
    )


def _spec_phi3(config: dict[str, Any]) -> ArchSpec:
    hd = _head_dim(config)
    n = require(config, "num_hidden_layers")
    return ArchSpec(
        **_base(config, hd, fused_qkv=True, fused_gate_up=True),
        tie_embeddings=bool(config.get("tie_word_embeddings", False)),
        layer_window=_uniform_window(config, n),
        **_single_rope_fields(config, hd),
    )


# ----- Gemma ----------------------------------------------------------------------------------------


def _gemma_common(config: dict[str, Any], hd: int) -> dict[str, Any]:
    if config.get("use_bidirectional_attention"):
        raise UnsupportedArchitectureError(
            "use_bidirectional_attention=True (an encoder variant) is not supported; train a causal Gemma."
        )
    kw = _base(config, hd, gemma_norm=True, sandwich_norms=True)
    bias = bool(config.get("attention_bias", False))
    kw.update(qkv_bias=bias, o_bias=bias)
    kw["hidden_act"] = config.get("hidden_activation") or config.get("hidden_act") or "gelu_pytorch_tanh"
    kw["attn_scale"] = float(config.get("query_pre_attn_scalar", 256)) ** -0.5
    kw["embed_scale"] = math.sqrt(kw["hidden_size"])
    return kw


def _spec_gemma2(config: dict[str, Any]) -> ArchSpec:
    hd = _head_dim(config, default=256)
    n = require(config, "num_hidden_layers")
    types = config.get("layer_types") or ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n)]
    return ArchSpec(
        **_gemma_common(config, hd),
        attn_softcap=config.get("attn_logit_softcapping", 50.0),
        final_softcap=config.get("final_logit_softcapping", 30.0),
        tie_embeddings=bool(config.get("tie_word_embeddings", True)),
        layer_window=_typed_windows(config, check_layer_types(config, list(types))),
        **_single_rope_fields(config, hd),
    )


def _spec_gemma3(config: dict[str, Any]) -> ArchSpec:
    hd = _head_dim(config, default=256)
    n = require(config, "num_hidden_layers")
    pattern = config.get("sliding_window_pattern") or config.get("_sliding_window_pattern") or 6
    types = check_layer_types(
        config,
        list(
            config.get("layer_types")
            or ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n)]
        ),
    )
    ropes = rope_for_layer_types(config, hd, global_theta=1_000_000.0, local_theta=10_000.0)
    order = ("full_attention", "sliding_attention")
    return ArchSpec(
        **_gemma_common(config, hd),
        qk_norm=True,
        attn_softcap=config.get("attn_logit_softcapping"),
        final_softcap=config.get("final_logit_softcapping"),
        tie_embeddings=bool(config.get("tie_word_embeddings", True)),
        layer_window=_typed_windows(config, types),
        ropes=tuple(ropes[t] for t in order),
        layer_rope=tuple(order.index(t) for t in types),
    )


# ----- MoE --------------------------------------------------------------------------------------------


def _num_experts(config: dict[str, Any]) -> int:
    """``num_experts`` (Qwen config.json) or ``num_local_experts`` (Mixtral; transformers' Qwen3-MoE to_dict)."""
    n = config.get("num_experts") or config.get("num_local_experts")
    if not n:
        raise UnsupportedArchitectureError("MoE config.json has neither num_experts nor num_local_experts.")
    return int(n)


def _check_all_sparse(config: dict[str, Any]) -> None:
    if config.get("mlp_only_layers") or int(config.get("decoder_sparse_step", 1)) != 1:
        raise UnsupportedArchitectureError(
            "MoE configs with dense layers (mlp_only_layers / decoder_sparse_step > 1) are not supported by the "
            "JAX engine; every layer must be sparse."
        )


def _spec_mixtral(config: dict[str, Any]) -> ArchSpec:
    hd = _head_dim(config)
    n = require(config, "num_hidden_layers")
    moe = MoESpec(
        num_experts=_num_experts(config),
        top_k=require(config, "num_experts_per_tok"),
        expert_intermediate_size=require(config, "intermediate_size"),
        norm_topk_prob=True,
    )
    return ArchSpec(
        **_base(config, hd),
        tie_embeddings=bool(config.get("tie_word_embeddings", False)),
        layer_window=_uniform_window(config, n),
        moe=moe,
        **_single_rope_fields(config, hd, default_theta=1_000_000.0),
    )


def _spec_qwen2_moe(config: dict[str, Any]) -> ArchSpec:
    _check_all_sparse(config)
    hd = _head_dim(config)
    n = require(config, "num_hidden_layers")
    if config.get("layer_types"):
        types = check_layer_types(config, list(config["layer_types"]))
    else:
        use = bool(config.get("use_sliding_window", False))
        mwl = config.get("max_window_layers", 28)
        types = ["sliding_attention" if use and (i + 1) % 2 and i < mwl else "full_attention" for i in range(n)]
    moe = MoESpec(
        num_experts=_num_experts(config),
        top_k=require(config, "num_experts_per_tok"),
        expert_intermediate_size=require(config, "moe_intermediate_size"),
        norm_topk_prob=bool(config.get("norm_topk_prob", False)),
        shared_expert_intermediate_size=config.get("shared_expert_intermediate_size"),
    )
    return ArchSpec(
        **_base(config, hd, qkv_bias=bool(config.get("qkv_bias", True))),
        tie_embeddings=bool(config.get("tie_word_embeddings", False)),
        layer_window=_typed_windows(config, types) if config.get("use_sliding_window") else (FULL_WINDOW,) * n,
        moe=moe,
        **_single_rope_fields(config, hd),
    )


def _spec_qwen3_moe(config: dict[str, Any]) -> ArchSpec:
    _check_all_sparse(config)
    hd = _head_dim(config, default=128)
    n = require(config, "num_hidden_layers")
    bias = bool(config.get("attention_bias", False))
    moe = MoESpec(
        num_experts=_num_experts(config),
        top_k=require(config, "num_experts_per_tok"),
        expert_intermediate_size=require(config, "moe_intermediate_size"),
        norm_topk_prob=bool(config.get("norm_topk_prob", False)),
    )
    return ArchSpec(
        **_base(config, hd, qkv_bias=bias, o_bias=bias, qk_norm=True),
        tie_embeddings=bool(config.get("tie_word_embeddings", False)),
        layer_window=_uniform_window(config, n, enabled=bool(config.get("use_sliding_window", False))),
        moe=moe,
        **_single_rope_fields(config, hd),
    )


# ----- checkpoint names for MoE experts ------------------------------------------------------------


def _expert_recipe(
    gate: str, up: str, down: str, rename: tuple[str, str] | None = None
) -> Callable[[str, ArchSpec], Recipe]:
    """Checkpoints store experts one by one (``experts.{e}.<gate>.weight``); memory holds them fused
    ``experts.gate_up_proj [E, 2I, d]`` / ``experts.down_proj [E, d, I]`` as transformers 5 does."""

    def recipe(name: str, spec: ArchSpec) -> Recipe:
        disk = name if rename is None else name.replace(rename[0], rename[1])
        n_exp = spec.moe.num_experts if spec.moe else 0
        if name.endswith(".experts.gate_up_proj"):
            base = disk[: -len("gate_up_proj")]
            keys = tuple(f"{base}{e}.{w}.weight" for e in range(n_exp) for w in (gate, up))

            def join(xs: list[np.ndarray]) -> np.ndarray:
                return np.stack([np.concatenate([xs[2 * e], xs[2 * e + 1]], axis=0) for e in range(n_exp)])

            def split(x: np.ndarray) -> list[np.ndarray]:
                half = x.shape[1] // 2
                return [part for e in range(n_exp) for part in (x[e, :half], x[e, half:])]

            return Recipe(keys, join, split)
        if name.endswith(".experts.down_proj"):
            base = disk[: -len("down_proj")]
            keys = tuple(f"{base}{e}.{down}.weight" for e in range(n_exp))
            return Recipe(keys, lambda xs: np.stack(xs), lambda x: [x[e] for e in range(n_exp)])
        return Recipe((disk,))

    return recipe


FAMILIES: dict[str, Family] = {
    f.model_types[0]: f
    for f in [
        Family("llama", ("llama",), ("LlamaForCausalLM",), _spec_llama),
        Family("mistral", ("mistral",), ("MistralForCausalLM",), _spec_mistral),
        Family("qwen2", ("qwen2",), ("Qwen2ForCausalLM",), _spec_qwen2),
        Family("qwen3", ("qwen3",), ("Qwen3ForCausalLM",), _spec_qwen3),
        Family("phi3", ("phi3",), ("Phi3ForCausalLM",), _spec_phi3),
        Family("gemma2", ("gemma2",), ("Gemma2ForCausalLM",), _spec_gemma2),
        Family("gemma3", ("gemma3_text",), ("Gemma3ForCausalLM",), _spec_gemma3),
        Family(
            "mixtral",
            ("mixtral",),
            ("MixtralForCausalLM",),
            _spec_mixtral,
            recipe=_expert_recipe("w1", "w3", "w2", rename=(".mlp.", ".block_sparse_moe.")),
        ),
        Family(
            "qwen2_moe",
            ("qwen2_moe",),
            ("Qwen2MoeForCausalLM",),
            _spec_qwen2_moe,
            recipe=_expert_recipe("gate_proj", "up_proj", "down_proj"),
        ),
        Family(
            "qwen3_moe",
            ("qwen3_moe",),
            ("Qwen3MoeForCausalLM",),
            _spec_qwen3_moe,
            recipe=_expert_recipe("gate_proj", "up_proj", "down_proj"),
        ),
    ]
}
"""model_type -> Family. One entry per architecture; keys are config.json ``model_type`` values."""


def supported_model_types() -> list[str]:
    return sorted(FAMILIES)


def get_family(model_type: str | None) -> Family:
    """The family serving ``model_type``, or an :class:`UnsupportedArchitectureError` listing the supported ones."""
    if model_type in FAMILIES:
        return FAMILIES[model_type]
    hint = ""
    if model_type == "gemma3":
        hint = " For multimodal Gemma 3 checkpoints pass the text_config (model_type 'gemma3_text')."
    raise UnsupportedArchitectureError(
        f"model_type {model_type!r} has no JAX family; supported: {', '.join(supported_model_types())}.{hint}"
    )
