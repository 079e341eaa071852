"""A config.json read into the engine's :class:`~aegis.models.shapes.ArchSpec`, without JAX.

:func:`arch_spec` builds the spec the JAX decoder computes and the planner's JAX profile sizes: one builder per
registry ``engine.spec`` name (:data:`SPECS`), mirroring what each transformers ``Config.__post_init__`` derives
(layer types, rope defaults, windows, MoE routing). Keys a config.json may omit are read with transformers' defaults
by `aegis.models.architectures.config_keys`, the readers the planner's families use too; this module only turns them into an
ArchSpec. The engine's families (`aegis.train.modeling.families`) take their ``build_spec`` from :data:`SPECS`.

    from aegis.models.arch_spec import arch_spec
    from aegis.models.shapes import param_shapes
    spec = arch_spec(json.load(open("config.json")))      # UnsupportedArchitectureError for an unknown model_type
    param_shapes(spec)["model"]["layers"]["mlp"]["up_proj"]["weight"]   # (layers, intermediate, hidden)

Builders by family: the dense llama-like decoders and their laid-out variants (Qwen3, Phi, StarCoder2, GPT-NeoX,
Falcon, StableLM, Cohere, OLMo, GPT-J, GPT-2/OPT); Gemma 1/2/3; OLMo 2/3 and Granite (Llama-shaped, a few changes);
Mixtral, Qwen2/3-MoE, Granite MoE, GPT-OSS, Phi-MoE; DeepSeek-V2/V3 (multi-head latent attention, leading dense
layers as a second stack).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

from aegis.models.architectures import config_keys as arch
from aegis.models.architectures import registry
from aegis.errors import InvalidConfigError, UnsupportedArchitectureError
from aegis.models.shapes import FULL_WINDOW, ArchSpec, MoESpec, RopeSpec, checkpoint_names

__all__ = ["arch_spec", "SPECS", "require", "rope_single", "rope_for_layer_types", "check_layer_types", "GPT_OSS_DEFAULT_ROPE"]


def require(config: dict[str, Any], key: str) -> Any:
    """``config[key]`` or an :class:`InvalidConfigError` naming the missing key."""
    if config.get(key) is None:
        raise InvalidConfigError(
            f"config.json ({config.get('model_type', '?')}) has no {key!r}; pass the model's complete config.json."
        )
    return config[key]


def _legacy_rope(config: dict[str, Any], default_theta: float) -> dict[str, Any]:
    """The flat rope-parameters dict from either layout (``rope_scaling`` wins over ``rope_parameters``)."""
    params = dict(config.get("rope_scaling") or config.get("rope_parameters") or {})
    theta = arch.value(config, "rope_theta")  # the config's (GPT-NeoX: rotary_emb_base), else the family's default
    params.setdefault("rope_theta", default_theta if theta is None else theta)
    partial = arch.partial_rotary_factor(config)  # the config's, the family's default (Phi: 0.5), GPT-J's rotary_dim
    if partial is not None:
        params.setdefault("partial_rotary_factor", partial)
    return params


def rope_single(config: dict[str, Any], head_dim: int, *, default_theta: float = 10_000.0) -> RopeSpec:
    """One RoPE for every layer (Llama, Qwen, Mistral, Phi-3, MoE families)."""
    params = _legacy_rope(config, default_theta)
    if "full_attention" in params and isinstance(params["full_attention"], dict):
        params = dict(params["full_attention"])
        params.setdefault("rope_theta", config.get("rope_theta", default_theta))
    return RopeSpec.from_params(
        params,
        head_dim=head_dim,
        max_position_embeddings=arch.value(config, "max_position_embeddings"),
        original_max_position_embeddings=arch.value(config, "original_max_position_embeddings"),
    )


def rope_for_layer_types(
    config: dict[str, Any], head_dim: int, *, global_theta: float, local_theta: float
) -> dict[str, RopeSpec]:
    """Gemma 3: separate RoPE for ``full_attention`` (scaled) and ``sliding_attention`` (local base) layers."""
    rp = config.get("rope_parameters") or {}
    nested = isinstance(rp.get("full_attention"), dict) or isinstance(rp.get("sliding_attention"), dict)
    full = dict(rp.get("full_attention") or {}) if nested else {"rope_type": "default"}
    local = dict(rp.get("sliding_attention") or {}) if nested else {"rope_type": "default"}
    if not nested and rp:
        full.update(rp)
    if config.get("rope_scaling"):
        full.update(config["rope_scaling"])
    full.setdefault("rope_theta", config.get("rope_theta", global_theta))
    local.setdefault("rope_theta", config.get("rope_local_base_freq", local_theta))
    mpe = arch.value(config, "max_position_embeddings")
    return {
        "full_attention": RopeSpec.from_params(full, head_dim=head_dim, max_position_embeddings=mpe),
        "sliding_attention": RopeSpec.from_params(local, head_dim=head_dim, max_position_embeddings=mpe),
    }


def check_layer_types(config: dict[str, Any], layer_types: list[str]) -> list[str]:
    """Validate an explicit or derived ``layer_types`` list."""
    n = require(config, "num_hidden_layers")
    if len(layer_types) != n or any(t not in ("full_attention", "sliding_attention") for t in layer_types):
        raise UnsupportedArchitectureError(
            f"layer_types must list {n} entries of 'full_attention'/'sliding_attention'; got {layer_types!r}."
        )
    return layer_types


# ----- shared config readers ------------------------------------------------------------------


def _base(config: dict[str, Any], **kw: Any) -> dict[str, Any]:
    entry = registry.get(arch.model_type(config))
    entry.check_supported(config)
    heads = require(config, "num_attention_heads")
    require(config, "hidden_size")
    head_dim = arch.head_dim(config)
    kv = arch.num_kv_heads(config)
    if not kv or heads % kv:
        raise UnsupportedArchitectureError(
            f"num_attention_heads={heads} is not a multiple of num_key_value_heads={kv}."
        )
    qkv_bias, o_bias = arch.attention_biases(config)
    return dict(
        model_type=config["model_type"],
        vocab_size=require(config, "vocab_size"),
        hidden_size=require(config, "hidden_size"),
        num_layers=require(config, "num_hidden_layers"),
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=head_dim,
        # Falcon: ffn_hidden_size, else 4 x hidden (the registry's derivation)
        intermediate_size=(int(entry.names(config)["intermediate"]) if "intermediate" in entry.vars
                           else config.get("intermediate_size") or 0),
        rms_norm_eps=arch.rms_norm_eps(config),
        hidden_act=config.get("hidden_act") or config.get("hidden_activation") or arch.value(config, "hidden_act") or "silu",
        initializer_range=float(arch.value(config, "initializer_range") or 0.02),
        attn_scale=head_dim**-0.5,
        qkv_bias=qkv_bias,
        o_bias=o_bias,
        mlp_bias=arch.mlp_bias(config),
        tie_embeddings=arch.tie_word_embeddings(config),
        attention_dropout=arch.attention_dropout(config),
        residual_dropout=arch.residual_dropout(config),
        residual_dropout_on=entry.residual_dropout_on,
        embedding_dropout=arch.embedding_dropout(config),
        **kw,
    )


def _windows(config: dict[str, Any]) -> tuple[int, ...]:
    """Per layer: its sliding window, or FULL_WINDOW (`aegis.models.architectures.config_keys.layer_windows`)."""
    check_layer_types(config, arch.layer_types(config))  # an explicit list may be malformed
    return tuple(FULL_WINDOW if w is None else int(w) for w in arch.layer_windows(config))


def _single_rope_fields(config: dict[str, Any], head_dim: int, default_theta: float = 10_000.0) -> dict[str, Any]:
    """One rope for every layer, and the identity rotation (NoPE) on the layers `arch.rope_layers` leaves without
    one (SmolLM3's every fourth, Cohere 2's global layers)."""
    rope = rope_single(config, head_dim, default_theta=default_theta)
    uses = arch.rope_layers(config)
    if all(uses):
        return dict(ropes=(rope,), layer_rope=(0,) * len(uses))
    nope = dataclasses.replace(rope, rope_type="none")
    return dict(ropes=(rope, nope), layer_rope=tuple(0 if u else 1 for u in uses))


# ----- dense llama-like -------------------------------------------------------------------------
# Llama, Mistral, Qwen2/2.5 (q/k/v bias), Qwen3 (q/k norm), Phi-3 (fused projections)


def _layout(config: dict[str, Any]) -> dict[str, Any]:
    """What the registry says about the layer's layout: fused q/k/v and gate/up projections, q/k norms, LayerNorms,
    the parallel block and the plain MLP with their names, the output projection's name, an lm_head bias."""
    entry = registry.get(arch.model_type(config))
    names = {p.short_name for p in (*entry.attention, *entry.mlp)}
    plain = entry.mlp_kind == "plain"
    qkv = entry.fused_qkv
    parallel = entry.is_parallel(config)
    return dict(
        fused_qkv=qkv is not None, **({"qkv_name": qkv, "qkv_grouped": entry.qkv_grouped} if qkv else {}),
        fused_gate_up="gate_up_proj" in names, qk_norm=entry.has_qk_norm(config),
        layer_norm=entry.layer_norm, layer_norm_bias=entry.layer_norm_bias, norm_affine=bool(entry.norms),
        parallel_block=parallel, parallel_mlp_norm=entry.has_parallel_mlp_norm(config),
        plain_mlp=plain,
        **({"plain_mlp_names": entry.plain_mlp_names} if plain else {}), o_name=entry.output_projection,
        lm_head_bias=arch.lm_head_bias(config),
    )


def _spec_dense(config: dict[str, Any], **kw: Any) -> ArchSpec:
    return ArchSpec(
        **_base(config, **kw),
        layer_window=_windows(config),
        **_single_rope_fields(config, arch.head_dim(config)),
    )


def _spec_llama(config: dict[str, Any]) -> ArchSpec:
    return _spec_dense(config)


def _spec_mistral(config: dict[str, Any]) -> ArchSpec:
    return _spec_dense(config)


def _spec_qwen2(config: dict[str, Any]) -> ArchSpec:
    return _spec_dense(config)


def _spec_laid_out(config: dict[str, Any]) -> ArchSpec:
    """A dense decoder whose layout the registry entry spells out (`_layout`): Qwen3 (q/k norm), Phi-3 (fused
    projections), Phi-1/1.5/2 (LayerNorms, attention and the plain fc1/fc2 MLP in parallel, ``dense``, lm_head bias,
    partial RoPE), StarCoder2 (LayerNorms, plain c_fc/c_proj MLP, biases per use_bias), StableLM, GPT-NeoX (q/k/v
    grouped by head in one ``query_key_value``, two LayerNorms in the parallel block)."""
    spec = _spec_dense(config, **_layout(config))
    entry = registry.get(arch.model_type(config))
    names = checkpoint_names(entry, config)
    if names != checkpoint_names(entry):  # norms named per config (Falcon's ln_attn / ln_mlp): the recipe reads them
        spec = dataclasses.replace(spec, extra={**spec.extra, "checkpoint_names": names})
    return spec


def _spec_cohere(config: dict[str, Any]) -> ArchSpec:
    """Cohere (Command R, Aya 23): the laid-out parallel block on weight-only LayerNorms, RoPE over adjacent pairs,
    q/k LayerNorms with a weight per head (``use_qk_norm``), logits times ``logit_scale``; Cohere 2 (Command R7B,
    Command A) adds sliding-window layers, and its global layers use no positions."""
    spec = _spec_laid_out(config)
    return dataclasses.replace(spec, rope_interleave=True, qk_norm_head_weights=spec.qk_norm,
                               logits_scale=float(arch.value(config, "logit_scale")))


def _spec_olmo(config: dict[str, Any]) -> ArchSpec:
    """OLMo 1: the laid-out dense decoder on LayerNorms without weight or bias (eps fixed at 1e-5), q, k and v
    clamped to ``clip_qkv`` where the config sets it (OLMo 1.7 / 0424 / 0724)."""
    return dataclasses.replace(_spec_laid_out(config), clip_qkv=arch.clip_qkv(config))


def _spec_gptj(config: dict[str, Any]) -> ArchSpec:
    """GPT-J: the laid-out parallel block on one LayerNorm (biases on the MLP, none on attention, an lm_head bias),
    RoPE over adjacent pairs of the first ``rotary_dim`` dims of each head."""
    return dataclasses.replace(_spec_laid_out(arch.canonical(config)), rope_interleave=True)


def _spec_learned_positions(config: dict[str, Any]) -> ArchSpec:
    """GPT-2 and OPT: the laid-out dense decoder (LayerNorms, biases, a plain MLP) with learned absolute positions
    (GPT-2's ``wpe``; OPT's ``embed_positions``, offset by 2) in place of RoPE; GPT-2's linears stored as ``Conv1D``."""
    entry = registry.get(arch.model_type(config))
    config = arch.canonical(config)  # GPT-2's n_embd, n_layer, n_head, n_positions as the shared readers name them
    spec = _spec_laid_out(config)
    assert entry.position_embedding is not None and entry.position_embedding.matrix is not None
    rows = int(registry.evaluate(entry.position_embedding.matrix[0], entry.names(config)))
    nope = dataclasses.replace(spec.ropes[0], rope_type="none")
    conv1d = any(p.conv1d for p in (*entry.attention, *entry.mlp))
    return dataclasses.replace(spec, ropes=(nope,), position_embeddings=rows, position_offset=entry.position_offset,
                               conv1d=conv1d)


# ----- Gemma ----------------------------------------------------------------------------------------


def _gemma_common(config: dict[str, Any]) -> dict[str, Any]:
    if config.get("use_bidirectional_attention"):
        raise UnsupportedArchitectureError(
            "use_bidirectional_attention=True (an encoder variant) is not supported; train a causal Gemma."
        )
    kw = _base(config, gemma_norm=True, sandwich_norms=True)
    kw["hidden_act"] = config.get("hidden_activation") or config.get("hidden_act") or "gelu_pytorch_tanh"
    kw["attn_scale"] = float(arch.value(config, "query_pre_attn_scalar")) ** -0.5
    kw["embed_scale"] = math.sqrt(kw["hidden_size"])
    kw["attn_softcap"] = arch.value(config, "attn_logit_softcapping")
    kw["final_softcap"] = arch.value(config, "final_logit_softcapping")
    return kw


def _spec_gemma2(config: dict[str, Any]) -> ArchSpec:
    return ArchSpec(
        **_gemma_common(config),
        layer_window=_windows(config),
        **_single_rope_fields(config, arch.head_dim(config)),
    )


def _spec_gemma3(config: dict[str, Any]) -> ArchSpec:
    hd = arch.head_dim(config)
    windows = _windows(config)
    types = arch.layer_types(config)
    ropes = rope_for_layer_types(config, hd, global_theta=1_000_000.0, local_theta=10_000.0)
    order = ("full_attention", "sliding_attention")
    return ArchSpec(
        **_gemma_common(config),
        qk_norm=registry.get("gemma3_text").qk_norm,
        layer_window=windows,
        ropes=tuple(ropes[t] for t in order),
        layer_rope=tuple(order.index(t) for t in types),
    )


# ----- MoE --------------------------------------------------------------------------------------------


def _check_all_sparse(config: dict[str, Any]) -> None:
    n = require(config, "num_hidden_layers")
    if not all(arch.is_sparse_layer(config, i) for i in range(n)):
        raise UnsupportedArchitectureError(
            "MoE configs with dense layers (mlp_only_layers / decoder_sparse_step > 1) are not supported by the "
            "JAX engine; every layer must be sparse."
        )


def _moe(config: dict[str, Any], *, norm_topk_prob: bool) -> MoESpec:
    return MoESpec(
        num_experts=arch.num_experts(config),
        top_k=arch.experts_per_tok(config),
        expert_intermediate_size=arch.moe_intermediate_size(config),
        norm_topk_prob=norm_topk_prob,
        shared_expert_intermediate_size=arch.shared_expert_intermediate_size(config) or None,
    )


def _spec_mixtral(config: dict[str, Any]) -> ArchSpec:
    return ArchSpec(
        **_base(config),
        layer_window=_windows(config),
        moe=_moe(config, norm_topk_prob=True),
        **_single_rope_fields(config, arch.head_dim(config), default_theta=1_000_000.0),
    )


def _spec_qwen2_moe(config: dict[str, Any]) -> ArchSpec:
    _check_all_sparse(config)
    return ArchSpec(
        **_base(config),
        layer_window=_windows(config),
        moe=_moe(config, norm_topk_prob=bool(arch.value(config, "norm_topk_prob"))),
        **_single_rope_fields(config, arch.head_dim(config)),
    )


def _spec_qwen3_moe(config: dict[str, Any]) -> ArchSpec:
    _check_all_sparse(config)
    return ArchSpec(
        **_base(config, **_layout(config)),
        layer_window=_windows(config),
        moe=_moe(config, norm_topk_prob=bool(arch.value(config, "norm_topk_prob"))),
        **_single_rope_fields(config, arch.head_dim(config)),
    )


# ----- Llama-shaped variants: Gemma 1, OLMo 2/3, Granite ------------------------------------------


def spec_gemma(config: dict[str, Any]) -> ArchSpec:
    """Gemma 1 (``GemmaConfig``: head_dim 256, gelu_pytorch_tanh, eps 1e-6, tied, rope theta 1e4)."""
    if arch.value(config, "use_bidirectional_attention"):
        raise UnsupportedArchitectureError(
            "use_bidirectional_attention=True (an encoder variant) is not supported; train a causal Gemma."
        )
    spec = _spec_llama({**config, "head_dim": arch.head_dim(config)})
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
        _spec_llama(config),
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
        _spec_llama(config),
        rms_norm_eps=arch.rms_norm_eps(config),
        tie_embeddings=arch.tie_word_embeddings(config),
        attn_scale=float(arch.value(config, "attention_multiplier")),
        embed_scale=float(arch.value(config, "embedding_multiplier")),
        residual_scale=float(arch.value(config, "residual_multiplier")),
        logits_divisor=float(arch.value(config, "logits_scaling")),
    )


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


# ----- GPT-OSS and Phi-MoE ----------------------------------------------------------------------------

GPT_OSS_DEFAULT_ROPE = {
    "rope_type": "yarn",
    "factor": 32.0,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": False,
    "original_max_position_embeddings": 4096,
}
"""``GptOssConfig.__post_init__``'s rope parameters when a config.json gives none."""


def _moe_unnormalised(config: dict[str, Any]) -> MoESpec:
    return MoESpec(
        num_experts=arch.num_experts(config),
        top_k=arch.experts_per_tok(config),
        expert_intermediate_size=arch.moe_intermediate_size(config),
        norm_topk_prob=False,
    )


def _rope_params(config: dict[str, Any], default: dict[str, Any] | None, theta: float) -> dict[str, Any]:
    params = dict(config.get("rope_scaling") or config.get("rope_parameters") or default or {})
    params.setdefault("rope_theta", config.get("rope_theta", theta))
    return params


def spec_gpt_oss(config: dict[str, Any]) -> ArchSpec:
    """GPT-OSS (``GptOssConfig``: head_dim 64, 8 kv heads, eps 1e-5, window 128, biases, 128 experts top-4)."""
    spec = _spec_llama({**config, "head_dim": arch.head_dim(config)})
    params = _rope_params(config, GPT_OSS_DEFAULT_ROPE, 150_000.0)
    rope = RopeSpec.from_params(
        params, head_dim=spec.head_dim, max_position_embeddings=arch.value(config, "max_position_embeddings")
    )
    quant = config.get("quantization_config") or {}
    return dataclasses.replace(
        spec,
        rms_norm_eps=arch.rms_norm_eps(config),
        tie_embeddings=arch.tie_word_embeddings(config),
        norm_weight_fp32=registry.get(arch.model_type(config)).norm_weight_float32,
        mlp_bias=False,
        moe=_moe_unnormalised(config),
        attn_sinks=True,
        router_bias=True,
        expert_bias=True,
        ropes=(rope,),
        extra={
            "swiglu_alpha": float(arch.value(config, "swiglu_alpha")),
            "swiglu_limit": float(arch.value(config, "swiglu_limit")),
            "mxfp4": quant.get("quant_method") == "mxfp4" and not quant.get("dequantize", False),
        },
    )


def spec_phimoe(config: dict[str, Any]) -> ArchSpec:
    """Phi-3.5-MoE (``PhimoeConfig``: 16 experts top-2, eps 1e-5, rope theta 1e6, untied)."""
    if arch.experts_per_tok(config) != 2:
        raise UnsupportedArchitectureError(
            f"phimoe routes with sparsemixer, which picks exactly 2 experts; num_experts_per_tok="
            f"{arch.experts_per_tok(config)} is not supported: set it to 2."
        )
    spec = _spec_llama(config)
    params = _rope_params(config, None, 1_000_000.0)
    if params.get("rope_type", params.get("type", "default")) not in ("default", None):
        short, long = params.get("short_mscale"), params.get("long_mscale")
        if short is None or long is None or float(short) != float(long):
            raise UnsupportedArchitectureError(
                f"phimoe LongRoPE with short_mscale={short} and long_mscale={long}: the engine needs both set and "
                "equal (as in Phi-3.5-MoE's config.json); set them equal or drop rope_scaling."
            )
        # transformers' Phi-MoE computes the frequencies without a sequence length: always the short factors
        params = {**params, "long_factor": params.get("short_factor"), "attention_factor": float(short)}
    rope = RopeSpec.from_params(
        params,
        head_dim=spec.head_dim,
        max_position_embeddings=arch.value(config, "max_position_embeddings"),
        original_max_position_embeddings=params.get("original_max_position_embeddings"),
    )
    return dataclasses.replace(
        spec,
        rms_norm_eps=arch.rms_norm_eps(config),
        tie_embeddings=arch.tie_word_embeddings(config),
        mlp_bias=False,
        moe=_moe_unnormalised(config),
        router_name="router",
        layer_norm=True,
        lm_head_bias=arch.lm_head_bias(config),
        ropes=(rope,),
        extra={"router_jitter_noise": float(arch.value(config, "router_jitter_noise")),
               "input_jitter_noise": float(arch.value(config, "input_jitter_noise"))},
    )


# ----- DeepSeek-V2 / V3 ------------------------------------------------------------------------------


def _yarn_mscale(scale: float, mscale: float) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def spec_deepseek(config: dict[str, Any]) -> ArchSpec:
    """The ArchSpec of a DeepSeek-V2 / V3 config.json (transformers' class defaults for missing keys)."""
    mt = config["model_type"]
    m = arch.mla(config)
    heads = require(config, "num_attention_heads")
    raw = arch.value(config, "num_key_value_heads")  # the key itself: the registry derives kv_heads = heads for MLA
    kv = heads if raw is None else raw
    if kv != heads:
        raise UnsupportedArchitectureError(
            f"{mt}: num_key_value_heads={kv} differs from num_attention_heads={heads}; MLA expands keys and values "
            "for every head, so DeepSeek checkpoints set them equal (fix config.json)."
        )
    n = require(config, "num_hidden_layers")
    rope = rope_single(config, m.qk_rope_head_dim)
    scale = m.qk_head_dim**-0.5
    params = dict(config.get("rope_scaling") or config.get("rope_parameters") or {})
    if params.get("rope_type", params.get("type", "default")) != "default" and params.get("mscale_all_dim"):
        ms = _yarn_mscale(float(params["factor"]), float(params["mscale_all_dim"]))
        scale = scale * ms * ms
    if mt == "deepseek_v3":
        if arch.value(config, "n_group") is None or arch.value(config, "topk_group") is None:
            raise UnsupportedArchitectureError("deepseek_v3 routing needs n_group and topk_group in config.json.")
        routing = dict(
            router="sigmoid", n_group=arch.value(config, "n_group"), topk_group=arch.value(config, "topk_group"),
            group_score="top2", norm_topk_prob=bool(arch.value(config, "norm_topk_prob")),
        )
        interleave = bool(arch.value(config, "rope_interleave"))
    else:
        method = arch.value(config, "topk_method")
        if method == "greedy":
            routing = dict(n_group=1, topk_group=1)
        elif method == "group_limited_greedy":
            routing = dict(n_group=arch.value(config, "n_group"), topk_group=arch.value(config, "topk_group"))
        else:
            raise UnsupportedArchitectureError(
                f"deepseek_v2 topk_method {method!r} is not one transformers implements; use 'greedy' or "
                "'group_limited_greedy'."
            )
        routing.update(router="softmax", group_score="max", norm_topk_prob=False)  # V2 never renormalises
        interleave = True  # view_as_complex pairs adjacent dims
    moe = MoESpec(
        num_experts=arch.num_experts(config),
        top_k=arch.experts_per_tok(config),
        expert_intermediate_size=arch.moe_intermediate_size(config),
        shared_expert_intermediate_size=arch.shared_expert_intermediate_size(config) or None,
        shared_gate=False,
        routed_scaling_factor=float(arch.value(config, "routed_scaling_factor")),
        **routing,
    )
    if moe.n_group < 1 or moe.num_experts % moe.n_group:
        raise UnsupportedArchitectureError(
            f"{mt}: n_routed_experts={moe.num_experts} is not a multiple of n_group={moe.n_group}; fix config.json."
        )
    bias = bool(arch.value(config, "attention_bias"))
    return ArchSpec(
        model_type=mt,
        vocab_size=require(config, "vocab_size"),
        hidden_size=require(config, "hidden_size"),
        num_layers=n,
        num_heads=heads,
        num_kv_heads=heads,
        head_dim=m.qk_head_dim,
        intermediate_size=arch.mla_dense_intermediate_size(config),
        rms_norm_eps=arch.rms_norm_eps(config),
        hidden_act=config.get("hidden_act") or "silu",
        initializer_range=float(arch.value(config, "initializer_range") or 0.02),
        attn_scale=scale,
        o_bias=bias,  # q_a_proj, kv_a_proj_with_mqa and o_proj
        mlp_bias=arch.mlp_bias(config),
        tie_embeddings=arch.tie_word_embeddings(config),
        ropes=(rope,),
        layer_rope=(0,) * n,
        layer_window=(FULL_WINDOW,) * n,
        moe=moe,
        mla=m,
        dense_layers=int(arch.value(config, "first_k_dense_replace") or 0),
        rope_interleave=interleave,
    )


SPECS: dict[str, Callable[[dict[str, Any]], ArchSpec]] = {
    "llama": _spec_llama, "mistral": _spec_mistral, "qwen2": _spec_qwen2, "qwen3": _spec_laid_out, "phi3": _spec_laid_out,
    "gemma2": _spec_gemma2, "gemma3": _spec_gemma3, "gemma": spec_gemma, "olmo2": spec_olmo2, "olmo3": spec_olmo3,
    "granite": spec_granite, "granitemoe": spec_granitemoe, "mixtral": _spec_mixtral, "qwen2_moe": _spec_qwen2_moe, "qwen3_moe": _spec_qwen3_moe,
    "deepseek": spec_deepseek, "gpt_oss": spec_gpt_oss, "phimoe": spec_phimoe, "phi": _spec_laid_out,
    "starcoder2": _spec_laid_out, "stablelm": _spec_laid_out, "gpt_neox": _spec_laid_out, "falcon": _spec_laid_out,
    "learned_positions": _spec_learned_positions, "cohere": _spec_cohere, "olmo": _spec_olmo, "gptj": _spec_gptj,
}
"""The registry's ``engine.spec`` names -> the spec builders."""


def arch_spec(config: dict[str, Any]) -> ArchSpec:
    """The engine's ArchSpec of a config.json dict (`aegis.train.modeling.build_model` builds its model on it).
    Raises :class:`~aegis.errors.UnsupportedArchitectureError` for a model_type the engine has no family for."""
    model_type = config.get("model_type") if isinstance(config, dict) else None
    if model_type not in registry.model_types():
        raise UnsupportedArchitectureError(
            f"model_type {model_type!r} has no JAX family; supported: {', '.join(sorted(registry.model_types()))}."
        )
    return SPECS[registry.get(model_type).engine.spec](config)
