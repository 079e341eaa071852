"""Bundled data: model config.json copies (with where each came from), the GPU catalog, chat templates.

Everything here is a data file shipped in the package and validated by pydantic on first use; loaders
are cached, so the cost is paid once per process and only by a process that asks.

    from aegis.models import catalog
    entry = catalog.find_model("llama3.1:8b")       # any id, name or alias → CatalogModel
    entry.family, entry.size, entry.variant, str(entry.source)
    config = catalog.read_model_config(entry)
    catalog.search("qwen", size="7b")                # what `aegis models` lists
    gpus = catalog.gpus()

``models.json`` is written by ``tools/import_catalog.py``; the names an entry answers to come from one
rule (`aegis.models.catalog._aliases`), not from the file. ``names.json`` stores that rule's output for the committed
``models.json`` (keyed by its CRC-32), so a lookup does not re-derive 1,000+ names per process; a file that does not
match is ignored and the names are derived (``python -m tools.import_catalog --names`` rewrites it).
"""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache, lru_cache
from importlib import resources
from typing import Any, Literal

from pydantic import Field, TypeAdapter

from aegis.models.catalog import _aliases
from aegis.schema import GPU, Frozen

__all__ = [
    "CatalogModel",
    "ConfigSource",
    "PublishedCount",
    "models",
    "names",
    "ModelNames",
    "model_entry",
    "find_model",
    "search",
    "read_model_config",
    "gpus",
    "name_index",
    "name_keys",
]

Variant = Literal["base", "instruct", "coder", "math", "python", "reasoning", "distill"]

_FIGURE = re.compile(r"^(?P<num>\d[\d,]*(?:\.(?P<frac>\d+))?)(?P<unit>[KMBT]?)$")
_UNITS = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "T": 10**12}


class ConfigSource(Frozen):
    """Where a bundled config.json came from."""

    library: str = Field(description="'hub' for a Hugging Face Hub file kept as published, else the library whose "
                                     "model table it was converted from ('litgpt', 'torchtune').")
    version: str = Field(default="", description="The library's version; empty for a Hub file.")
    entry: str = Field(description="What was read: a litgpt config name, a torchtune builder, 'org/name/config.json'.")
    overrides: dict[str, str] = Field(
        default_factory=dict, description="config.json keys not taken from the entry → where their value came from.")

    def __str__(self) -> str:
        more = f" (+{len(self.overrides)} set)" if self.overrides else ""
        return " ".join(p for p in (self.library, self.version, self.entry) if p) + more


class PublishedCount(Frozen):
    """A parameter count as its authors or the Hub publish it, at the precision they give."""

    value: str = Field(description="As published: '8.03B', '494M', or an exact '8,030,261,248'.")
    counts: Literal["total", "non_embedding", "active"] = Field(
        default="total", description="What the figure counts: all parameters, all but embedding and LM head, "
        "or those one token uses (MoE).")
    where: str = Field(description="Where it is published (model card, paper table, Hub safetensors total).")
    disagrees: str = Field(default="", description="Why the figure is known not to match the weights (empty: it must).")

    @property
    def params(self) -> int:
        """The figure as a parameter count."""
        match = _FIGURE.match(self.value)
        if match is None:
            raise ValueError(f"unreadable published count {self.value!r}")
        number = match.group("num").replace(",", "")
        unit = _UNITS[match.group("unit")]
        whole, _, frac = number.partition(".")
        return int(whole) * unit + (int(frac) * unit // 10 ** len(frac) if frac else 0)

    @property
    def tolerance(self) -> int:
        """One unit in the figure's last significant digit: '7.61B' ±0.01B, '13B' ±1B, '300M' ±100M (trailing zeros
        of a whole number are not significant); an exact count ('8,030,261,248', no unit) ±0. Rounding and
        truncation of the true count both agree."""
        match = _FIGURE.match(self.value)
        if match is None:
            raise ValueError(f"unreadable published count {self.value!r}")
        unit = _UNITS[match.group("unit")]
        if unit == 1:
            return 0
        if match.group("frac"):
            return unit // 10 ** len(match.group("frac"))
        digits = match.group("num").replace(",", "")
        return unit * 10 ** (len(digits) - len(digits.rstrip("0")))

    def agrees(self, params: int) -> bool:
        return abs(params - self.params) <= self.tolerance


class _Named:
    """``ids`` and ``aliases`` of an entry (a validated `CatalogModel` or its unvalidated `ModelNames`)."""

    @property
    def ids(self) -> tuple[str, ...]:
        """Every Hub id this config serves, canonical first."""
        return (self.id, *self.also_ids)  # type: ignore[attr-defined]

    @property
    def aliases(self) -> tuple[str, ...]:
        """Every name this entry answers to under the catalog's naming rule, canonical id excluded."""
        return tuple(n for n in _owners()[self.id] if n != self.id)  # type: ignore[attr-defined]


class CatalogModel(_Named, Frozen):
    """One bundled config.json: the Hub ids it serves, what it is, where it came from, what is published."""

    id: str = Field(description="Canonical Hugging Face id.")
    also_ids: tuple[str, ...] = Field(
        default=(), description="Other Hub ids whose config (every key written here) is the same (e.g. the -Instruct).")
    file: str = Field(description="File name under catalog/models/.")
    family: str = Field(description="Release line, lower case: 'llama-3.1', 'qwen2.5', 'gemma-3', 'mistral'.")
    size: str = Field(description="Size as named: '8b', '0.5b', '8x7b', '30b-a3b', '135m', '3.8b'.")
    variant: Variant = Field(description="What the canonical checkpoint is: base, instruct, coder, math, ...")
    source: ConfigSource
    published: tuple[PublishedCount, ...] = Field(default=(), description="Published parameter counts.")
    note: str = Field(default="", description="Anything a user should know (e.g. text config of a multimodal model).")
    sole_size: str = Field(default="", description="Where it is published that the release line came in this one size "
                           "only (then the line's name alone names it: 'mistral-nemo'); empty when not known.")


def _read_text(*parts: str) -> str:
    return resources.files("aegis.models.catalog").joinpath(*parts).read_text(encoding="utf-8")


def _read_json(*parts: str) -> Any:
    return json.loads(_read_text(*parts))


@dataclass(frozen=True)
class ModelNames(_Named):
    """What the naming rule reads of an entry, straight from ``models.json``: a name is looked up without
    validating the whole catalog (only the entry it names is validated, by `model_entry`)."""

    id: str
    also_ids: tuple[str, ...]
    family: str
    size: str
    variant: str
    sole_size: str


@lru_cache(maxsize=1)
def _models_text() -> str:
    return _read_text("models.json")


@lru_cache(maxsize=1)
def _rows() -> tuple[dict[str, Any], ...]:
    return tuple(json.loads(_models_text()))


def _names_of(rows: Iterable[dict[str, Any]]) -> tuple[ModelNames, ...]:
    return tuple(ModelNames(r["id"], tuple(r.get("also_ids", ())), r["family"], r["size"], r["variant"],
                            r.get("sole_size", "")) for r in rows)


@lru_cache(maxsize=1)
def names() -> tuple[ModelNames, ...]:
    """Every entry's naming fields, in catalog order (unvalidated; `models` validates)."""
    return _names_of(_rows())


@cache
def _entry(index: int) -> CatalogModel:
    return CatalogModel.model_validate(_rows()[index])


@lru_cache(maxsize=1)
def models() -> tuple[CatalogModel, ...]:
    """All bundled models, validated, in catalog order."""
    return tuple(_entry(i) for i in range(len(_rows())))


def _checksum(text: str) -> str:
    """CRC-32 of a ``models.json`` text: enough to tell a stale ``names.json`` (not a security check), and it needs
    no ``hashlib`` (whose OpenSSL import costs more than the rest of a name lookup)."""
    return f"{zlib.crc32(text.encode('utf-8')):08x}"


def name_index(models_text: str | None = None) -> str:
    """``names.json`` for a ``models.json`` text (default: the bundled one): its CRC-32, the naming rule's names of
    every entry, and each name's token key (space-joined) with its entry."""
    text = _models_text() if models_text is None else models_text
    owners = _aliases.alias_owners(_names_of(json.loads(text)))
    keys = {" ".join(_aliases.key(name)): owner for owner, found in owners.items() for name in found}
    return json.dumps({"models_crc32": _checksum(text), "names": owners, "keys": keys}, indent=1,
                      ensure_ascii=False) + "\n"


@lru_cache(maxsize=1)
def _stored_index() -> dict[str, Any] | None:
    """``names.json`` when it was written for this ``models.json``, else None."""
    try:
        stored = _read_json("names.json")
    except (OSError, ValueError):
        return None
    if (isinstance(stored, dict) and stored.get("models_crc32") == _checksum(_models_text())
            and isinstance(stored.get("names"), dict) and isinstance(stored.get("keys"), dict)):
        return stored
    return None


@lru_cache(maxsize=1)
def _owners() -> dict[str, tuple[str, ...]]:
    """Entry id → the names it answers to (stored in ``names.json``, or derived when that is stale)."""
    stored = _stored_index()
    if stored is not None:
        return {owner: tuple(found) for owner, found in stored["names"].items()}
    return _aliases.alias_owners(names())


@lru_cache(maxsize=1)
def name_keys() -> dict[tuple[str, ...], str]:
    """Token key of every id and alias → the entry it names (each key has one owner: `_aliases.alias_owners`)."""
    stored = _stored_index()
    if stored is not None:
        return {tuple(k.split(" ")): owner for k, owner in stored["keys"].items()}
    return {_aliases.key(name): owner for owner, found in _owners().items() for name in found}


@lru_cache(maxsize=1)
def _by_id() -> dict[str, int]:
    return {hub_id.lower(): i for i, m in enumerate(names()) for hub_id in m.ids}


def model_entry(model_id: str) -> CatalogModel | None:
    """The bundled entry serving Hub id ``model_id`` (case-insensitive), or None."""
    index = _by_id().get(model_id.lower())
    return None if index is None else _entry(index)


def find_model(name: str) -> CatalogModel | None:
    """The entry a Hub id, name or alias names ('llama3.1:8b', 'Qwen2.5-7B-Instruct'), or None."""
    owner = name_keys().get(_aliases.key(name))
    return model_entry(name) or (model_entry(owner) if owner else None)


def _matches(query: tuple[str, ...], name: str) -> bool:
    """Whether the tokens of ``query`` run in ``name``'s tokens: all equal, the last one a prefix
    ('llama-3' finds Llama-3-8B and Llama-3.1-8B, not CodeLlama-34b; 'smol' finds SmolLM2)."""
    tokens = _aliases.key(name)
    *head, last = query
    return any(tokens[i:i + len(head)] == tuple(head) and tokens[i + len(head)].startswith(last)
               for i in range(len(tokens) - len(head)))


def search(query: str | None = None, *, family: str | None = None, size: str | None = None,
           variant: str | None = None) -> list[CatalogModel]:
    """Entries matching every filter given, in catalog order. ``query`` is found in an id, alias or family
    by tokens (case and separators ignored; the last word may be cut short); ``family`` is a family or a
    series ('llama' is every Llama line, 'llama3.1' one); ``size`` is a size or a MoE total ('30b' finds
    '30b-a3b')."""
    wanted_q = _aliases.key(query) if query else ()
    wanted_f = "".join(_aliases.key(family)) if family else ""
    wanted_s = size.lower() if size else ""
    found = []
    for m in models():
        if wanted_q and not any(_matches(wanted_q, n) for n in (*m.ids, *m.aliases, m.family)):
            continue
        if wanted_f:
            parsed = _aliases.series_version(m.family)
            names = {m.family, parsed[0]} if parsed else {m.family}
            if wanted_f not in {"".join(_aliases.key(n)) for n in names}:
                continue
        if wanted_s and wanted_s not in _aliases.size_forms(m.size):
            continue
        if variant and m.variant != variant:
            continue
        found.append(m)
    return found


def read_model_config(entry: CatalogModel) -> dict[str, Any]:
    """The bundled config.json of a catalog model."""
    return _read_json("models", entry.file)


@lru_cache(maxsize=1)
def gpus() -> tuple[GPU, ...]:
    """The GPU catalog, validated."""
    return tuple(TypeAdapter(list[GPU]).validate_python(_read_json("gpus.json")))
