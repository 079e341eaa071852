"""Bundled data: model config.json copies, the GPU catalog, chat templates.

Everything here is a data file shipped in the package and validated by pydantic on load;
loaders are cached, so the cost is paid once per process.

    from aegis import catalog
    entry = catalog.model_entry("meta-llama/Llama-3.1-8B")
    config = catalog.read_model_config(entry)
    gpus = catalog.gpus()
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from typing import Any

from pydantic import Field, TypeAdapter

from aegis.schema import GPU, Frozen

__all__ = ["CatalogModel", "models", "model_entry", "read_model_config", "gpus"]


class CatalogModel(Frozen):
    """One bundled model: its hub id, the config.json copy and the short names people type."""

    id: str = Field(description="Canonical Hugging Face id.")
    file: str = Field(description="File name under catalog/models/.")
    aliases: tuple[str, ...] = Field(default=(), description="Short lower-case names.")
    note: str = Field(default="", description="Anything a user should know (e.g. text config of a multimodal model).")


def _read_json(*parts: str) -> Any:
    return json.loads(resources.files("aegis.catalog").joinpath(*parts).read_text(encoding="utf-8"))


@lru_cache(maxsize=1)
def models() -> tuple[CatalogModel, ...]:
    """All bundled models, validated."""
    return tuple(TypeAdapter(list[CatalogModel]).validate_python(_read_json("models.json")))


def model_entry(model_id: str) -> CatalogModel | None:
    """The bundled entry whose id equals ``model_id`` (case-insensitive), or None."""
    wanted = model_id.lower()
    return next((m for m in models() if m.id.lower() == wanted), None)


def read_model_config(entry: CatalogModel) -> dict[str, Any]:
    """The bundled config.json of a catalog model."""
    return _read_json("models", entry.file)


@lru_cache(maxsize=1)
def gpus() -> tuple[GPU, ...]:
    """The GPU catalog, validated."""
    return tuple(TypeAdapter(list[GPU]).validate_python(_read_json("gpus.json")))
