"""Architecture families keyed by config.json ``model_type``, each built from its registry entry
(`aegis.models.architectures.registry`): adding a family whose layers reuse known parameter kinds is one JSON file.

    from aegis.models.families import get_family
    family = get_family(config)          # config.json dict
    shapes = family.layers(config)
"""

from __future__ import annotations

from typing import Any

from aegis.models.architectures import registry
from aegis.errors import UnsupportedArchitectureError
from aegis.models.families.base import Family, LayerShape, Linear

__all__ = ["Family", "LayerShape", "Linear", "get_family", "supported_model_types", "layer_shapes"]

_FAMILIES: dict[str, Family] = {}


def _family(model_type: str) -> Family | None:
    entry = registry.find(model_type)
    if entry is None:
        return None
    family = _FAMILIES.get(entry.model_type)
    if family is None:
        family = _FAMILIES[entry.model_type] = Family(entry)
    return family


def supported_model_types() -> list[str]:
    return registry.model_types()


def get_family(config: dict[str, Any]) -> Family:
    """The family serving this config.json, or an error naming the supported ones."""
    model_type = config.get("model_type")
    family = _family(model_type or "")
    if family is None:
        arch = (config.get("architectures") or ["?"])[0]
        raise UnsupportedArchitectureError(
            f"unsupported architecture {arch} (model_type {model_type!r}); supported model_types: "
            f"{', '.join(supported_model_types())}. Pass a config.json of one of these, or describe the "
            "architecture in aegis/models/architectures/_data/<model_type>.json (see aegis.models.architectures.registry)"
        )
    family.entry.check_supported(config)
    return family


_SHAPES: dict[tuple[str, str, int], tuple[LayerShape, ...]] = {}


def layer_shapes(family: Family, config: dict[str, Any], transformers_major: int = 5) -> tuple[LayerShape, ...]:
    """``family.layers_for(config, transformers_major)``, computed once per config (the solver sizes one model many
    times); equal layers are the same object, so per-layer work can be shared by identity."""
    import json

    key = (family.name, json.dumps(config, sort_keys=True, default=str), transformers_major)
    cached = _SHAPES.get(key)
    if cached is None:
        unique: list[LayerShape] = []
        out = []
        for layer in family.layers_for(config, transformers_major):
            same = next((u for u in unique if u == layer), None)
            if same is None:
                unique.append(layer)
                same = layer
            out.append(same)
        cached = _SHAPES[key] = tuple(out)
        if len(_SHAPES) > 256:
            _SHAPES.pop(next(iter(_SHAPES)))
    return cached
