"""The one naming rule of the model catalog: which names people type resolve to which entry.

Aliases are derived, never written per entry. From each entry's Hub ids and its structured fields
(``family``, ``size``, ``variant``) the rule makes, in this order of claim:

1. exact names, always owned: every Hub id (``org/name``), its ``name`` and the lower-case name;
2. stems: the lower-case name with a trailing variant or context marker removed, one at a time
   (``Phi-3-mini-4k-instruct`` → ``phi-3-mini-4k`` → ``phi-3-mini``; ``gemma-2-9b-it`` → ``gemma-2-9b``),
   written with each spelling of the family (``phi3-mini``), and Ollama-style ``family:rest`` when the
   rest is one word (``phi3:mini``);
3. family and size, for the first entry listed with that family line and size: ``llama-3.1-8b``,
   ``llama3.1-8b``, Ollama-style ``llama3.1:8b``; a MoE size also by its total (``qwen3:30b``);
   a specialised line carries its variant (``qwen2.5-coder:7b``), and a family that is only that line is also
   named without it (``mathstral-7b``: every Mathstral is a math model); in a release that also has a ``-moe``
   line, the dense line is named ``-dense`` too, as Ollama names it (``granite3.1-dense:8b``);
4. the line alone (``mistral-nemo``, ``tinyllama``), for an entry whose catalog row cites that the line was
   released in this one size (``sole_size``); a line with sizes the catalog lacks is never named without its size;

A name without the release (``llama-8b``, ``qwen-7b``, ``gemma-2b``) is not an alias: several releases of a
series share sizes with different configs (Gemma 1 2B is not Gemma 2 2B; Llama 3 8B is not Llama 3.1 8B), so
such a name is refused with the candidates rather than matched to the newest.

A generic name (2–4) goes to the first entry in catalog order that claims it; names are compared
by their token key (case, separators and ``.`` between words ignored), so no two entries ever share
a key. A family with a version has two spellings: ``llama-3.1``/``llama3.1``, ``qwen2.5``/``qwen-2.5``.

    owners = alias_owners(entries)     # entry id -> its names
    key("Llama 3.1 8B") == key("llama3.1:8b")
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import Protocol

__all__ = ["key", "family_spellings", "plain_version", "series_version", "size_forms", "alias_owners", "LINE_VARIANTS"]

_TOKEN = re.compile(r"\d+(?:\.\d+)*|[a-z]+")
_FAMILY = re.compile(r"^([a-z][a-z-]*[a-z]{2})-?(\d+(?:\.\d+)?)$")
_MARKER = re.compile(r"-(?:instruct|it|pt|hf|chat|base|\d+k)$")

LINE_VARIANTS = frozenset({"coder", "math", "python"})
"""Variants that are their own line of models (``qwen2.5-coder:7b``); others share the family's names."""


class _Entry(Protocol):
    id: str
    family: str
    size: str
    variant: str
    sole_size: str

    @property
    def ids(self) -> tuple[str, ...]: ...


@lru_cache(maxsize=8192)
def key(name: str) -> tuple[str, ...]:
    """Case- and separator-insensitive key: 'Llama-3.1-8B', 'llama 3.1 8b' and 'llama3.1:8b' agree (cached: the
    catalog's names are keyed by the naming rule, the name index and the matcher alike)."""
    return tuple(_TOKEN.findall(name.lower()))


def series_version(family: str) -> tuple[str, tuple[int, ...]] | None:
    """('llama', (3, 1)) for 'llama-3.1'; None for a family without a version ('mistral', 'deepseek-r1')."""
    match = _FAMILY.match(family)
    if not match:
        return None
    return match.group(1).rstrip("-"), tuple(int(p) for p in match.group(2).split("."))


def family_spellings(family: str) -> tuple[str, ...]:
    """Joined spelling first ('llama3.1', 'llama-3.1'); a family without a version has one. A release ``X.0`` is
    also release ``X`` ('granite3', 'granite-3' for granite-3.0: Ollama's ``granite3-dense:8b``)."""
    match = _FAMILY.match(family)
    if not match:
        return (family,)
    series, version = match.group(1).rstrip("-"), match.group(2)
    forms = (f"{series}{version}", f"{series}-{version}")
    whole = plain_version(version)
    return forms + ((f"{series}{whole}", f"{series}-{whole}") if whole != version else ())


def plain_version(version: str) -> str:
    """A version number without its trailing ``.0`` parts: '3.0' → '3', '2.5' and '3' as they are."""
    return re.sub(r"(?:\.0+)+$", "", version) or version


def size_forms(size: str) -> tuple[str, ...]:
    """The size and, for a MoE size '30b-a3b', its total alone ('30b')."""
    total = size.split("-a", 1)[0]
    return (size, total) if total != size else (size,)


def _line(entry: _Entry, *, plain: bool = False) -> tuple[str, ...]:
    """Spellings of the entry's line: its family, plus the variant for a specialised line (unless ``plain``)."""
    suffix = f"-{entry.variant}" if entry.variant in LINE_VARIANTS and not plain else ""
    return tuple(s + suffix for s in family_spellings(entry.family))


def _stems(name: str) -> list[str]:
    stems, stem = [], name.lower()
    while (cut := _MARKER.sub("", stem)) != stem and cut:
        stems.append(cut)
        stem = cut
    return stems


def _stem_forms(entry: _Entry, stem: str) -> list[str]:
    """A stem, re-spelled with every spelling of the family, and as 'family:rest' when rest is one word."""
    spellings = family_spellings(entry.family)
    for spelling in spellings:
        if stem.startswith(spelling) and stem[len(spelling):len(spelling) + 1] in ("-", ""):
            rest = stem[len(spelling):].lstrip("-")
            forms = [f"{s}-{rest}" if rest else s for s in spellings]
            if rest and "-" not in rest:
                forms.append(f"{spellings[0]}:{rest}")
            return forms
    return [stem]


def _exact(entry: _Entry) -> list[str]:
    names: list[str] = []
    for hub_id in entry.ids:
        name = hub_id.split("/", 1)[-1]
        names += [hub_id, name, name.lower()]
    return names


def alias_owners(entries: Sequence[_Entry]) -> dict[str, tuple[str, ...]]:
    """Entry id → the names it owns under the rule (exact names first). ValueError when two entries
    share an exact name."""
    owner: dict[tuple[str, ...], str] = {}
    names: dict[str, list[str]] = {e.id: [] for e in entries}

    def claim(entry_id: str, candidates: Iterable[str], *, exact: bool = False) -> None:
        for name in candidates:
            k = key(name)
            if not k:
                continue
            holder = owner.setdefault(k, entry_id)
            if holder != entry_id:
                if exact:
                    raise ValueError(f"catalog name {name!r} of {entry_id} is also a name of {holder}")
                continue
            if name not in names[entry_id]:
                names[entry_id].append(name)

    for entry in entries:
        claim(entry.id, _exact(entry), exact=True)
    for entry in entries:
        for hub_id in entry.ids:
            for stem in _stems(hub_id.split("/", 1)[-1]):
                claim(entry.id, _stem_forms(entry, stem))
    variants: dict[str, set[str]] = {}
    for entry in entries:
        variants.setdefault(entry.family, set()).add(entry.variant)
    seen: set[tuple[str, str]] = set()
    for entry in entries:
        lines = [_line(entry)]
        if entry.variant in LINE_VARIANTS and variants[entry.family] == {entry.variant}:
            lines.append(_line(entry, plain=True))  # the family is only this line
        if f"{entry.family}-moe" in variants:  # a release with MoE lines too: its dense line says so
            lines.append(tuple(f"{s}-dense" for s in _line(entry)))
        for line in lines:
            if (line[0], entry.size) in seen:
                continue
            seen.add((line[0], entry.size))
            for size in size_forms(entry.size):
                claim(entry.id, [*(f"{s}-{size}" for s in line), f"{line[0]}:{size}"])
    for entry in entries:
        if entry.sole_size:
            claim(entry.id, _line(entry))
    return {entry_id: tuple(found) for entry_id, found in names.items()}
