"""The engine's family table, built from the architecture registry (`aegis.architectures.registry`): for each
config.json ``model_type`` its entry names the :class:`ArchSpec` builder, the layer function and how checkpoint
tensor names map to the parameter tree (per-expert Hub names, as data).

Each spec builder mirrors its transformers ``Config.__post_init__`` (derived layer types, rope defaults)
and ``modeling_*.py`` (biases, norms, routing); the layout (fused projections, q/k norm) and every default
come from the registry. Adding an architecture whose layer the engine already runs is one JSON file; a new
kind of layer adds a spec builder / layer function here and names it in ``engine``.

    family = get_family("qwen2")            # UnsupportedArchitectureError lists the valid names
    spec = family.build_spec(config_dict)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from aegis.architectures import config as arch
from aegis.architectures import registry
from aegis.errors import UnsupportedArchitectureError
from aegis.train.models.decoder import LayerFn, parallel_layer, standard_layer
from aegis.train.models.deepseek import deepseek_layer, spec_deepseek
from aegis.train.models.llama_variants import (
    granite_layer,
    granitemoe_recipe,
    olmo2_layer,
    spec_gemma,
    spec_granite,
    spec_granitemoe,
    spec_olmo2,
    spec_olmo3,
)
from aegis.train.models.moe_more import (
    gpt_oss_layer,
    gpt_oss_recipe,
    phimoe_layer,
    phimoe_recipe,
    spec_gpt_oss,
    spec_phimoe,
)
from aegis.train.models.spec import (
    FULL_WINDOW,
    ArchSpec,
    MoESpec,
    check_layer_types,
    require,
    rope_for_layer_types,
    rope_single,
)

__all__ = ["Family", "Recipe", "CheckpointNames", "FAMILIES", "get_family", "supported_model_types"]


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
    save_keys: tuple[str, ...] | None = None
    """Where ``split`` writes, when the engine saves a tensor under other names than it reads (a quantised
    checkpoint read, a bf16 one written); None: ``keys``."""
    packed: bool = False
    """The keys hold integer codes ``join`` decodes (MXFP4 blocks and scales)."""

    @property
    def written_keys(self) -> tuple[str, ...]:
        return self.keys if self.save_keys is None else self.save_keys

    @property
    def stored_as_kept(self) -> bool:
        """One checkpoint tensor, kept as is (a loader may read it straight into place)."""
        return len(self.keys) == 1 and self.join is _first


def _identity_recipe(name: str, spec: ArchSpec) -> Recipe:
    return Recipe((name,))


@dataclass(frozen=True)
class CheckpointNames:
    """How a family's checkpoint files name the engine's modules (the engine names them as Llama does:
    ``model.embed_tokens``, ``model.layers.{i}.self_attn.*``, ``model.norm``, ``lm_head``), from the registry:
    GPT-NeoX's ``gpt_neox.embed_in``, ``gpt_neox.layers.{i}.attention.*``, ``gpt_neox.final_layer_norm``,
    ``embed_out``. Module paths only; a tensor's leaf (``weight``, ``lora_A.weight``) follows unchanged."""

    layers: str = "model.layers"
    embedding: str = "model.embed_tokens"
    final_norm: str = "model.norm"
    lm_head: str = "lm_head"
    position_embedding: str = "model.embed_positions"
    """GPT-2's ``transformer.wpe``: a learned position embedding, where the family has one."""
    in_layer: tuple[tuple[str, str], ...] = ()
    """(engine module under a layer, the checkpoint's), where they differ (``self_attn.dense``, ``attention.dense``)."""

    @property
    def renames(self) -> bool:
        return self != CheckpointNames()

    def _tops(self) -> tuple[tuple[str, str], ...]:
        return (("model.embed_tokens", self.embedding), ("model.norm", self.final_norm), ("lm_head", self.lm_head),
                ("model.embed_positions", self.position_embedding))

    def checkpoint(self, name: str) -> str:
        """The checkpoint's name of engine tensor or module ``name``."""
        for ours, theirs in self._tops():
            if name == ours or name.startswith(ours + "."):
                return theirs + name[len(ours):]
        if not name.startswith("model.layers."):
            return name
        layer, _, rest = name[len("model.layers."):].partition(".")
        for ours, theirs in self.in_layer:
            if rest == ours or rest.startswith(ours + "."):
                rest = theirs + rest[len(ours):]
                break
        return f"{self.layers}.{layer}.{rest}" if rest else f"{self.layers}.{layer}"

    def engine(self, name: str) -> str | None:
        """The engine's name of checkpoint tensor or module ``name`` (the inverse of `checkpoint`); None when it is
        not one of the family's module paths."""
        for ours, theirs in self._tops():
            if name == theirs or name.startswith(theirs + "."):
                return ours + name[len(theirs):]
        if not name.startswith(self.layers + "."):
            return None
        layer, _, rest = name[len(self.layers) + 1:].partition(".")
        for ours, theirs in self.in_layer:
            if rest == theirs or rest.startswith(theirs + "."):
                rest = ours + rest[len(theirs):]
                break
        return f"model.layers.{layer}.{rest}" if rest else f"model.layers.{layer}"


def _checkpoint_names(entry: registry.Architecture, config: dict[str, Any] | None = None) -> CheckpointNames:
    """The family's checkpoint names; with ``config`` also the norms it renames for that config (Falcon's
    ``ln_attn``/``ln_mlp`` where it has two)."""
    in_layer = []
    for section, params in (("self_attn", entry.attention), ("mlp", entry.mlp)):
        for p in params:
            if p.kind == "linear" and f"{section}.{p.short_name}" != p.path:
                in_layer.append((f"{section}.{p.short_name}", p.path))
    names = entry.names(config) if config is not None else None
    for p in entry.norms:  # renamed norms: always (GPT-2's ln_1 / ln_2), or as this config has them (Falcon)
        unconditional = p.when is None and p.unless is None
        if p.name is not None and p.name != p.path and (unconditional or (names is not None and p.present(names))):
            pair = (p.name.rsplit(".", 1)[0], p.path.rsplit(".", 1)[0])
            if pair not in in_layer:
                in_layer.append(pair)
    wpe = entry.position_embedding
    return CheckpointNames(
        layers=entry.layers_path, embedding=entry.embedding_path,
        final_norm=entry.final_norm[0].path.rsplit(".", 1)[0] if entry.final_norm else "model.norm",
        lm_head=entry.lm_head_saved_as, in_layer=tuple(in_layer),
        **({"position_embedding": wpe.path.rsplit(".", 1)[0]} if wpe is not None else {}),
    )


@dataclass(frozen=True)
class Family:
    """One architecture family: the model types it serves and how to build and load them."""

    name: str
    model_types: tuple[str, ...]
    architectures: tuple[str, ...]
    build_spec: Callable[[dict[str, Any]], ArchSpec]
    layer_fn: LayerFn = standard_layer
    recipe: Callable[[str, ArchSpec], Recipe] = field(default=_identity_recipe)
    names: CheckpointNames = field(default_factory=CheckpointNames)
    """How its checkpoints name the engine's modules (the recipe's keys already carry it; LoRA adapters use it)."""

    def checkpoint_names(self, config: dict[str, Any]) -> CheckpointNames:
        """`names` with what ``config`` adds (Falcon's two-norm blocks name their norms ``ln_attn``/``ln_mlp``)."""
        return _checkpoint_names(registry.get(self.model_types[0]), config)


# ----- shared config readers ------------------------------------------------------------------
# Keys a config.json may omit are read with transformers' defaults by `aegis.architectures.config`, the
# readers the planner's families use too; this module only turns them into an ArchSpec.


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
    """Per layer: its sliding window, or FULL_WINDOW (`aegis.architectures.config.layer_windows`)."""
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
    family = FAMILIES[arch.model_type(config)]
    names = family.checkpoint_names(config)
    if names != family.names:  # norms named per config (Falcon's ln_attn / ln_mlp): the recipe reads them
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


_SPECS: dict[str, Callable[[dict[str, Any]], ArchSpec]] = {
    "llama": _spec_llama, "mistral": _spec_mistral, "qwen2": _spec_qwen2, "qwen3": _spec_laid_out, "phi3": _spec_laid_out,
    "gemma2": _spec_gemma2, "gemma3": _spec_gemma3, "gemma": spec_gemma, "olmo2": spec_olmo2, "olmo3": spec_olmo3,
    "granite": spec_granite, "granitemoe": spec_granitemoe, "mixtral": _spec_mixtral, "qwen2_moe": _spec_qwen2_moe, "qwen3_moe": _spec_qwen3_moe,
    "deepseek": spec_deepseek, "gpt_oss": spec_gpt_oss, "phimoe": spec_phimoe, "phi": _spec_laid_out,
    "starcoder2": _spec_laid_out, "stablelm": _spec_laid_out, "gpt_neox": _spec_laid_out, "falcon": _spec_laid_out,
    "learned_positions": _spec_learned_positions, "cohere": _spec_cohere, "olmo": _spec_olmo, "gptj": _spec_gptj,
}
"""The registry's ``engine.spec`` names -> the spec builders (the forward pass's choices are code)."""
_LAYERS: dict[str, LayerFn] = {
    "standard": standard_layer, "olmo2": olmo2_layer, "granite": granite_layer, "deepseek": deepseek_layer,
    "gpt_oss": gpt_oss_layer, "phimoe": phimoe_layer, "parallel": parallel_layer,
}
_RECIPES: dict[str, Callable[[str, ArchSpec], Recipe]] = {
    "gpt_oss": gpt_oss_recipe, "phimoe": phimoe_recipe, "granitemoe": granitemoe_recipe,
}


def _checkpoint_renamed(recipe: Callable[[str, ArchSpec], Recipe], names: CheckpointNames) -> Callable[[str, ArchSpec], Recipe]:
    """``recipe`` with its checkpoint keys renamed by ``names`` (Phi's ``model.final_layernorm``, GPT-NeoX's
    ``gpt_neox.layers.{i}.attention.*``)."""

    def renamed(name: str, spec: ArchSpec) -> Recipe:
        r = recipe(name, spec)
        own = spec.extra.get("checkpoint_names", names)  # the config's own (Falcon's ln_attn / ln_mlp)
        keys = tuple(own.checkpoint(k) for k in r.keys)
        save = None if r.save_keys is None else tuple(own.checkpoint(k) for k in r.save_keys)
        return dataclasses.replace(r, keys=keys, save_keys=save)

    return renamed


def _transposed_conv1d(recipe: Callable[[str, ArchSpec], Recipe], entry: registry.Architecture) -> Callable[[str, ArchSpec], Recipe]:
    """``recipe`` with the family's ``Conv1D`` weights (GPT-2) transposed: stored [in, out], held [out, in] like
    every other linear."""
    sections = (("self_attn", entry.attention), ("mlp", entry.mlp))
    suffixes = tuple(f".{section}.{p.short_name}.weight" for section, params in sections for p in params if p.conv1d)

    def transposed(name: str, spec: ArchSpec) -> Recipe:
        r = recipe(name, spec)
        if not name.endswith(suffixes):
            return r
        assert r.stored_as_kept, name
        return dataclasses.replace(r, join=lambda xs: np.swapaxes(xs[0], -1, -2), split=lambda x: [np.swapaxes(x, -1, -2)])

    return transposed


def _family(entry: registry.Architecture) -> Family:
    """The engine's family for one registry entry: its spec builder, layer function and checkpoint names."""
    recipe: Callable[[str, ArchSpec], Recipe] = _identity_recipe
    if entry.engine.recipe == "experts":
        moe = entry.moe
        assert moe is not None and moe.checkpoint_experts is not None, entry.model_type
        path = moe.checkpoint_path.rsplit(".experts", 1)[0]
        rename = None if path == "mlp" else (".mlp.", f".{path}.")
        recipe = _expert_recipe(*moe.checkpoint_experts, rename=rename)
    elif entry.engine.recipe != "identity":
        recipe = _RECIPES[entry.engine.recipe]
    if any(p.conv1d for p in (*entry.attention, *entry.mlp)):
        recipe = _transposed_conv1d(recipe, entry)
    names = _checkpoint_names(entry)
    if names.renames:  # Phi's model.final_layernorm; GPT-NeoX's gpt_neox.* and embed_out
        recipe = _checkpoint_renamed(recipe, names)
    return Family(
        entry.model_type if entry.model_type != "gemma3_text" else "gemma3",
        (entry.model_type,),
        entry.hf_architectures,
        _SPECS[entry.engine.spec],
        layer_fn=_LAYERS[entry.engine.layer],
        recipe=recipe,
        names=names,
    )


FAMILIES: dict[str, Family] = {e.model_type: _family(e) for e in registry.all_entries()}
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
