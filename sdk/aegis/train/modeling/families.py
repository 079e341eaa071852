"""The engine's family table, built from the architecture registry (`aegis.models.architectures.registry`): for each
config.json ``model_type`` its entry names the :class:`ArchSpec` builder, the layer function and how checkpoint
tensor names map to the parameter tree (per-expert Hub names, as data).

Each spec builder mirrors its transformers ``Config.__post_init__`` (derived layer types, rope defaults)
and ``modeling_*.py`` (biases, norms, routing); the layout (fused projections, q/k norm) and every default
come from the registry. Adding an architecture whose layer the engine already runs is one JSON file; a new
kind of layer adds a spec builder / layer function here and names it in ``engine``.

    family = engine_family("qwen2")            # UnsupportedArchitectureError lists the valid names
    spec = family.build_spec(config_dict)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from aegis.models.architectures import registry
from aegis.errors import UnsupportedArchitectureError
from aegis.models.arch_spec import SPECS
from aegis.train.modeling.decoder import LayerFn, parallel_layer, standard_layer
from aegis.train.modeling.deepseek import deepseek_layer
from aegis.train.modeling.gemma_olmo_granite import (
    granite_layer,
    granitemoe_recipe,
    olmo2_layer,
)
from aegis.train.modeling.gpt_oss_phimoe import (
    gpt_oss_layer,
    gpt_oss_recipe,
    phimoe_layer,
    phimoe_recipe,
)
from aegis.models.shapes import ArchSpec, CheckpointNames
from aegis.models.shapes import checkpoint_names as _checkpoint_names

__all__ = ["EngineFamily", "Recipe", "CheckpointNames", "ENGINE_FAMILIES", "engine_family", "engine_model_types"]


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
class EngineFamily:
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


def _family(entry: registry.Architecture) -> EngineFamily:
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
    return EngineFamily(
        entry.model_type if entry.model_type != "gemma3_text" else "gemma3",
        (entry.model_type,),
        entry.hf_architectures,
        SPECS[entry.engine.spec],
        layer_fn=_LAYERS[entry.engine.layer],
        recipe=recipe,
        names=names,
    )


ENGINE_FAMILIES: dict[str, EngineFamily] = {e.model_type: _family(e) for e in registry.all_entries()}
"""model_type -> EngineFamily. One entry per architecture; keys are config.json ``model_type`` values."""


def engine_model_types() -> list[str]:
    return sorted(ENGINE_FAMILIES)


def engine_family(model_type: str | None) -> EngineFamily:
    """The family serving ``model_type``, or an :class:`UnsupportedArchitectureError` listing the supported ones."""
    if model_type in ENGINE_FAMILIES:
        return ENGINE_FAMILIES[model_type]
    hint = ""
    if model_type == "gemma3":
        hint = " For multimodal Gemma 3 checkpoints pass the text_config (model_type 'gemma3_text')."
    raise UnsupportedArchitectureError(
        f"model_type {model_type!r} has no JAX family; supported: {', '.join(engine_model_types())}.{hint}"
    )
