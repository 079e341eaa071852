"""Model resolution: an id, alias or path → a `ModelProfile` computed from config.json shapes.

Order: a local config.json or model folder; the bundled catalog (offline); the Hugging Face Hub
through ``huggingface_hub`` (cached; served from the cache when offline).

    profile = resolve_model("llama-3.1-8b")           # bundled alias
    profile = resolve_model("./my-model/config.json")  # local file
    profile.total_params, profile.trainable_params("lora")
"""

from __future__ import annotations

import difflib
import json
import os
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

from aegis import catalog
from aegis.errors import InvalidConfigError, OfflineError, UnknownModelError
from aegis.families import get_family
from aegis.schema import LinearModule, ModelProfile

__all__ = ["resolve_model", "canonical_model_id", "profile_from_config", "list_models"]

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def _norm(name: str) -> str:
    """Loose form for matching: lower case, separators and a trailing -hf/-instruct-less."""
    return re.sub(r"[\s_.]+", "-", name.strip().lower())


@lru_cache(maxsize=1)
def _alias_table() -> dict[str, str]:
    table: dict[str, str] = {}
    for entry in catalog.models():
        for name in (entry.id, entry.id.split("/", 1)[1], *entry.aliases):
            table[_norm(name)] = entry.id
    return table


def canonical_model_id(name: str) -> str:
    """Bundled model id for an alias or id (case/separator-insensitive); UnknownModelError with close matches."""
    found = _alias_table().get(_norm(name))
    if found:
        return found
    raise UnknownModelError(_unknown_model_message(name))


def _unknown_model_message(name: str) -> str:
    close = difflib.get_close_matches(_norm(name), list(_alias_table()), n=3, cutoff=0.6)
    hint = f"did you mean {', '.join(repr(c) for c in close)}? " if close else ""
    return (
        f"unknown model {name!r}: {hint}`aegis models` lists the bundled ones; pass a Hub id (org/name) "
        "or the path of a config.json / model folder"
    )


def list_models() -> list[ModelProfile]:
    """Profiles of every bundled model."""
    return [resolve_model(entry.id) for entry in catalog.models()]


@lru_cache(maxsize=256)
def _resolve_cached(key: str) -> ModelProfile:
    path = Path(key).expanduser()
    if path.exists() or key.endswith(".json") or key.startswith((".", "/", "~")):
        return _from_path(path)
    table = _alias_table()
    if _norm(key) in table:
        model_id = table[_norm(key)]
        entry = catalog.model_entry(model_id)
        assert entry is not None
        return profile_from_config(catalog.read_model_config(entry), model_id=model_id, source="catalog")
    if _HUB_ID.match(key):
        config, source = _from_hub(key)
        return profile_from_config(config, model_id=key, source=source)
    raise UnknownModelError(_unknown_model_message(key))


def resolve_model(id_or_path: str) -> ModelProfile:
    """Resolve a model id, alias, config.json path or model folder to its profile."""
    if not isinstance(id_or_path, str) or not id_or_path.strip():
        raise UnknownModelError("empty model name: pass an alias like 'llama-3.1-8b', a Hub id, or a config.json path")
    return _resolve_cached(id_or_path.strip())


def _from_path(path: Path) -> ModelProfile:
    file = path / "config.json" if path.is_dir() else path
    if not file.is_file():
        raise UnknownModelError(f"no config.json at {str(file)!r}: pass a config.json file or a folder that holds one")
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise InvalidConfigError(f"{file} is not valid JSON ({err}); re-download the model's config.json") from err
    return profile_from_config(config, model_id=str(path), source="path")


def _from_hub(repo_id: str) -> tuple[dict[str, Any], str]:
    from huggingface_hub import hf_hub_download, try_to_load_from_cache
    from huggingface_hub import errors as hf_errors

    cached = try_to_load_from_cache(repo_id, "config.json")
    if isinstance(cached, str) and os.path.isfile(cached):
        return json.loads(Path(cached).read_text(encoding="utf-8")), "cache"
    try:
        file = hf_hub_download(repo_id, "config.json", etag_timeout=5)
    except hf_errors.GatedRepoError as err:
        raise UnknownModelError(
            f"{repo_id} is gated: accept its licence on the Hub and log in (`hf auth login`), "
            "or pass the path of its config.json"
        ) from err
    except hf_errors.RepositoryNotFoundError as err:
        raise UnknownModelError(_unknown_model_message(repo_id)) from err
    except hf_errors.EntryNotFoundError as err:
        raise UnknownModelError(f"{repo_id} has no config.json on the Hub: pass a local config.json path") from err
    except (hf_errors.OfflineModeIsEnabled, hf_errors.LocalEntryNotFoundError, OSError) as err:
        raise OfflineError(
            f"cannot reach the Hugging Face Hub for {repo_id} and it is not cached: connect once, "
            "or pass the path of its config.json"
        ) from err
    return json.loads(Path(file).read_text(encoding="utf-8")), "hub"


def profile_from_config(config: Any, *, model_id: str, source: str) -> ModelProfile:
    """Compute a `ModelProfile` from a config.json dict (every count from shapes)."""
    if not isinstance(config, dict):
        raise InvalidConfigError(f"config for {model_id} is not a JSON object: pass a Hugging Face config.json")
    if config.get("model_type") == "gemma3" and isinstance(config.get("text_config"), dict):
        config = {**config["text_config"], "model_type": "gemma3_text", "architectures": ["Gemma3ForCausalLM"]}
    family = get_family(config)
    layers = family.layers(config)
    hidden, vocab = family.hidden(config), family.vocab(config)
    if hidden == 0 or vocab == 0 or not layers or family.heads(config) == 0:
        raise InvalidConfigError(f"config for {model_id} has a zero size (hidden, vocab, layers or heads): check config.json")
    embedding = vocab * hidden
    lm_head = 0 if family.tied(config) else vocab * hidden
    final_norm = family.final_norm_params(config)
    layer_params = tuple(layer.params for layer in layers)
    total = embedding + lm_head + final_norm + sum(layer_params)
    active = embedding + lm_head + final_norm + sum(layer.active_params for layer in layers)
    merged: dict[tuple, int] = {}
    for layer in layers:
        for lin in layer.linears:
            key = (lin.name, lin.in_features, lin.out_features, lin.bias, lin.matched_by, lin.lora_targetable, lin.quantizable,
                   lin.lora_rank_factor)
            merged[key] = merged.get(key, 0) + lin.count
    modules = tuple(
        LinearModule(
            name=name, in_features=i, out_features=o, count=n, bias=b,
            matched_by=mb or (name,), lora_targetable=lt, quantizable=qz, lora_rank_factor=rf,
        )
        for (name, i, o, b, mb, lt, qz, rf), n in merged.items()
    )
    sliding = next((layer.sliding_window for layer in layers if layer.sliding_window), None)
    moe = next((layer for layer in layers if layer.num_experts), None)
    return ModelProfile(
        model_id=model_id,
        source=source,  # type: ignore[arg-type]
        architecture=(config.get("architectures") or [type(family).__name__])[0],
        model_type=config["model_type"],
        family=family.name,
        family_description=family.description,
        num_layers=len(layers),
        hidden_size=hidden,
        intermediate_size=moe.mlp_intermediate if moe else family.intermediate(config),
        num_attention_heads=family.heads(config),
        num_key_value_heads=family.kv_heads(config),
        head_dim=family.head_dim(config),
        vocab_size=vocab,
        tie_word_embeddings=family.tied(config),
        max_position_embeddings=family.max_positions(config),
        num_experts=moe.num_experts if moe else 0,
        num_experts_per_tok=moe.experts_per_tok if moe else 0,
        sliding_window=sliding,
        total_params=total,
        embedding_params=embedding,
        lm_head_params=lm_head,
        layer_params=layer_params,
        norm_params=final_norm + sum(layer.norm_params for layer in layers),
        active_params_per_token=active,
        linear_modules=modules,
        config=config,
    )
