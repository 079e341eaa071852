"""Where a model to train lives: a local Hugging Face folder, or a Hub id in the huggingface_hub cache.

A run's ``model:`` (YAML, ``--plan``, chat, Slack) names a model folder (config.json, ``*.safetensors``
single or sharded with their index, tokenizer files), a config.json inside one, a Hub id, or a bundled
catalog alias (resolved to its Hub id). :func:`locate_model` finds the folder without touching the
network when the files are cached (``local_files_only``) and downloads them only when asked and online
(``HF_TOKEN`` for gated repos, huggingface_hub's progress bars). Nothing here imports JAX or torch.

    src = locate_model("./my-model")              # ModelSource; WeightsNotFoundError names the fix
    src.folder, src.weight_files, src.fingerprint  # fingerprint: shard names, sizes, safetensors headers

The fingerprint lets a resumed run refuse a base model that changed between kill and resume.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
from pathlib import Path

from pydantic import Field

from aegis.errors import InvalidConfigError, OfflineError, UnknownModelError, WeightsNotFoundError
from aegis.schema import Frozen

__all__ = ["ModelSource", "locate_model", "weights_fingerprint", "TOKENIZER_FILES"]

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
INDEX_FILE = "model.safetensors.index.json"
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
)
"""Files of a tokenizer folder, copied into exports so the result loads on its own."""
_DOWNLOAD_PATTERNS = ["*.json", "*.safetensors", "*.jinja", "tokenizer.model", "*.txt"]


class ModelSource(Frozen):
    """A model folder on this machine that holds weights."""

    spec: str = Field(description="What the user wrote: a folder, a config.json, a Hub id or an alias.")
    folder: Path = Field(description="The folder holding config.json, the weights and the tokenizer.")
    hub_id: str | None = Field(default=None, description="The Hub id when the folder is a cached snapshot.")
    weight_files: tuple[str, ...] = Field(description="Safetensors files (names relative to the folder).")
    fingerprint: str = Field(description="sha256 of the shard names, sizes and safetensors headers.")

    @property
    def config_path(self) -> Path:
        return self.folder / "config.json"

    def config(self) -> dict:
        """The folder's config.json."""
        try:
            return json.loads(self.config_path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as err:
            raise InvalidConfigError(f"{self.config_path} is not a readable config.json ({err}); re-download it") from err

    @property
    def display(self) -> str:
        return self.hub_id or str(self.folder)


def _weight_files(folder: Path) -> tuple[str, ...]:
    index = folder / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise WeightsNotFoundError(f"{index} is not a valid safetensors index (no weight_map); re-download it") from err
        files = sorted(set(weight_map.values()))
        missing = [f for f in files if not (folder / f).is_file()]
        if missing:
            raise WeightsNotFoundError(
                f"{folder} lacks shard {missing[0]!r} listed in {INDEX_FILE} ({len(missing)} of {len(files)} missing); "
                "finish the download"
            )
        return tuple(files)
    return tuple(sorted(p.name for p in folder.glob("*.safetensors") if not p.name.startswith("adapter_")))


def weights_fingerprint(folder: Path, files: tuple[str, ...]) -> str:
    """sha256 over each shard's name, size and safetensors header: cheap (no tensor data read), and any
    re-save with other shapes, dtypes or values in a different layout changes it."""
    h = hashlib.sha256()
    for name in files:
        p = folder / name
        size = p.stat().st_size
        with open(p, "rb") as fh:
            raw = fh.read(8)
            n = struct.unpack("<Q", raw)[0] if len(raw) == 8 else 0
            header = fh.read(min(n, 100_000_000)) if n else b""
        h.update(f"{name}\0{size}\0".encode())
        h.update(header)
    return h.hexdigest()


def _download_hint(hub_id: str | None, folder: Path | None = None) -> str:
    if hub_id:
        where = f" --local-dir {folder}" if folder is not None else ""
        return f"`hf download {hub_id}{where}`"
    return "`hf download <org/name> --local-dir <folder>`"


def _from_folder(spec: str, folder: Path, hub_id: str | None = None) -> ModelSource:
    if not (folder / "config.json").is_file():
        raise WeightsNotFoundError(
            f"{folder} has no config.json: point `model:` at a Hugging Face model folder "
            f"(config.json, *.safetensors, tokenizer files), e.g. one written by {_download_hint(hub_id, folder)}"
        )
    files = _weight_files(folder)
    if not files:
        bins = sorted(p.name for p in folder.glob("*.bin"))
        extra = f" (it holds {bins[0]}: convert it to safetensors)" if bins else ""
        raise WeightsNotFoundError(
            f"{folder} holds no *.safetensors weights{extra}; download them with {_download_hint(hub_id, folder)}, "
            "or set `init: random` to train from scratch"
        )
    return ModelSource(
        spec=spec, folder=folder, hub_id=hub_id, weight_files=files, fingerprint=weights_fingerprint(folder, files)
    )


def _hub_snapshot(spec: str, hub_id: str, *, download: bool) -> ModelSource:
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub import errors as hf_errors

    try:
        folder = Path(snapshot_download(hub_id, local_files_only=True))
        return _from_folder(spec, folder, hub_id)
    except (hf_errors.LocalEntryNotFoundError, WeightsNotFoundError, FileNotFoundError, OSError) as err:
        if not download or constants.HF_HUB_OFFLINE:
            raise WeightsNotFoundError(
                f"the weights of {hub_id} are not on this machine; download them with {_download_hint(hub_id)} "
                "(or pass a local model folder)"
            ) from err
    try:
        folder = Path(snapshot_download(hub_id, allow_patterns=_DOWNLOAD_PATTERNS))
    except hf_errors.GatedRepoError as err:
        raise WeightsNotFoundError(
            f"{hub_id} is gated: accept its licence on the Hub and set HF_TOKEN (or `hf auth login`)"
        ) from err
    except hf_errors.RepositoryNotFoundError as err:
        raise UnknownModelError(f"{hub_id} is not a model on the Hub; check the id or pass a local folder") from err
    except (hf_errors.HfHubHTTPError, OSError) as err:
        raise OfflineError(f"cannot download {hub_id} ({type(err).__name__}); retry, or pass a local folder") from err
    return _from_folder(spec, folder, hub_id)


def locate_model(spec: str, *, download: bool = False) -> ModelSource:
    """The folder of ``spec``'s weights on this machine (downloading from the Hub only when ``download``).

    Raises WeightsNotFoundError (no weights here: the message gives the download command),
    UnknownModelError (neither a path, a Hub id nor a bundled alias).
    """
    if not isinstance(spec, str) or not spec.strip():
        raise UnknownModelError("empty model: pass a model folder, a Hub id (org/name) or a bundled alias")
    spec = spec.strip()
    path = Path(spec).expanduser()
    if path.is_file() and path.name == "config.json":
        return _from_folder(spec, path.parent.resolve())
    if path.is_dir():
        return _from_folder(spec, path.resolve())
    if spec.startswith((".", "/", "~")) or spec.endswith(".json"):
        raise WeightsNotFoundError(f"model folder {spec} does not exist; check the path")
    if _HUB_ID.match(spec):
        return _hub_snapshot(spec, spec, download=download)
    from aegis.models.resolve import match_model

    # the repository the name means: an -Instruct name sharing its base's config still trains its own weights
    return _hub_snapshot(spec, match_model(spec).weights_id, download=download)
