"""The Hugging Face Hub side of model resolution: a repo's config.json from the local Hub cache, else downloaded.

    cached_config("Qwen/Qwen3-8B")      # path of the cached config.json, or None; disk only
    cached_repos()                      # model repos whose config.json is cached
    config, where = fetch_config("acme/tiny-llama")   # where: "cache" or "hub"

`aegis.models.resolve` decides what a name means and calls these; `huggingface_hub` is imported inside each function, so
importing this module stays cheap. No network is one fast `OfflineError` (one HEAD request, no retries).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from aegis.errors import OfflineError, UnknownModelError

__all__ = ["cached_config", "cached_repos", "fetch_config"]


def cached_config(repo_id: str) -> str | None:
    """The path of ``repo_id``'s config.json in the local Hub cache, or None (not cached, or an id the Hub would
    refuse). Reads the disk only."""
    from huggingface_hub import try_to_load_from_cache

    try:
        found = try_to_load_from_cache(repo_id, "config.json")
    except (ValueError, OSError):  # an id the Hub would refuse
        return None
    return found if isinstance(found, str) and os.path.isfile(found) else None


def cached_repos() -> list[str]:
    """Model repos with a cached config.json (names read from the cache's ``models--org--name`` folders)."""
    from huggingface_hub import constants

    try:
        folders = os.listdir(constants.HF_HUB_CACHE)
    except OSError:
        return []
    repos = [f.removeprefix("models--").replace("--", "/", 1) for f in folders if f.startswith("models--")]
    return sorted(r for r in repos if "/" in r and cached_config(r))


def fetch_config(repo_id: str, *, suggest: Callable[[str], Sequence[str]] | None = None) -> tuple[dict[str, Any], str]:
    """``repo_id``'s config.json and where it came from: ``"cache"`` (the local Hub cache), else ``"hub"`` (downloaded,
    and cached). The Hub's refusals are `UnknownModelError`, no network is `OfflineError`; ``suggest(repo_id)``
    (close bundled ids) is asked on a cache miss, for those messages."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub import errors as hf_errors

    cached = cached_config(repo_id)
    if cached:
        return json.loads(Path(cached).read_text(encoding="utf-8")), "cache"
    close = suggest(repo_id) if suggest is not None else ()
    hint = f"; close bundled models: {', '.join(close)}" if close else ""
    try:
        _reach_hub(repo_id)
        file = hf_hub_download(repo_id, "config.json", etag_timeout=5)
    except hf_errors.GatedRepoError as err:
        raise UnknownModelError(
            f"{repo_id} is gated: accept its licence on the Hub and log in (`hf auth login`), "
            "or pass the path of its config.json"
        ) from err
    except hf_errors.RepositoryNotFoundError as err:
        raise UnknownModelError(
            f"unknown model {repo_id!r}: no such model on the Hugging Face Hub{hint}; check the id, or pass the path "
            "of its config.json (`--model ./path/config.json`)"
        ) from err
    except (hf_errors.OfflineModeIsEnabled, hf_errors.LocalEntryNotFoundError) as err:  # before its base class
        raise OfflineError(_offline_message(repo_id, hint)) from err
    except hf_errors.EntryNotFoundError as err:
        raise UnknownModelError(f"{repo_id} has no config.json on the Hub: pass a local config.json path") from err
    except OSError as err:
        raise OfflineError(_offline_message(repo_id, hint)) from err
    return json.loads(Path(file).read_text(encoding="utf-8")), "hub"


def _network_errors() -> tuple[type[Exception], ...]:
    """What the Hub client raises when it cannot connect: httpx2's transport errors (huggingface_hub 2.x) and
    httpx's (1.x)."""
    import importlib

    found = []
    for name in ("httpx2", "httpx"):
        try:
            found.append(importlib.import_module(name).TransportError)
        except (ImportError, AttributeError):
            continue
    return tuple(found)


def _reach_hub(repo_id: str) -> None:
    """One HEAD request for the config, without retries: with no network it fails in about a second (an
    `OSError` for `fetch_config`) where `hf_hub_download` would retry for ~25 s (1+2+4+8+8 s of backoff, a logged
    warning each time). The Hub's answers (unknown repo, gated, no such file) raise as `hf_hub_download`'s do."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    try:
        get_hf_file_metadata(hf_hub_url(repo_id, "config.json"), timeout=5)
    except _network_errors() as err:
        raise ConnectionError(f"Hugging Face Hub unreachable: {err}") from err


def _offline_message(repo_id: str, hint: str) -> str:
    return (f"cannot reach the Hugging Face Hub for {repo_id} and it is not cached: connect once (it is fetched and "
            f"cached), or pass the path of its config.json (`--model ./path/config.json`){hint}")
