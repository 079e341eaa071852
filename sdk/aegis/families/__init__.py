"""Architecture families: a registry keyed by config.json ``model_type``.

Adding a family touches one module (a `Family` subclass) and this list.

    from aegis.families import get_family
    family = get_family(config)          # config.json dict
    shapes = family.layers(config)
"""

from __future__ import annotations

from typing import Any

from aegis.errors import UnsupportedArchitectureError
from aegis.families.base import Family, LayerShape, Linear
from aegis.families.dense import LlamaFamily, Phi3Family, Qwen2Family, Qwen3Family
from aegis.families.gemma import Gemma2Family, Gemma3Family
from aegis.families.llama_variants import GemmaFamily, GraniteFamily, Olmo2Family
from aegis.families.moe import MixtralFamily, Qwen2MoeFamily, Qwen3MoeFamily

__all__ = ["Family", "LayerShape", "Linear", "FAMILIES", "get_family", "supported_model_types"]

_ALL: list[Family] = [
    LlamaFamily(),
    Qwen2Family(),
    Qwen3Family(),
    Phi3Family(),
    Gemma2Family(),
    Gemma3Family(),
    GemmaFamily(),
    Olmo2Family(),
    GraniteFamily(),
    MixtralFamily(),
    Qwen2MoeFamily(),
    Qwen3MoeFamily(),
]
FAMILIES: dict[str, Family] = {t: f for f in _ALL for t in f.model_types}


def supported_model_types() -> list[str]:
    return sorted(FAMILIES)


def get_family(config: dict[str, Any]) -> Family:
    """The family serving this config.json, or an error naming the supported ones."""
    model_type = config.get("model_type")
    family = FAMILIES.get(model_type or "")
    if family is None:
        arch = (config.get("architectures") or ["?"])[0]
        raise UnsupportedArchitectureError(
            f"unsupported architecture {arch} (model_type {model_type!r}); supported model_types: "
            f"{', '.join(supported_model_types())}. To add one, write a Family subclass in aegis/families/ "
            "and list it in aegis.families._ALL"
        )
    return family
