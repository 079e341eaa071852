"""Model resolution: an id, alias or path → a `ModelProfile` computed from config.json shapes.

One function decides what a model name means, for the parser and the loader alike: `match_model`. This module owns
names; a config.json from the Hugging Face Hub or its cache comes from `aegis.models.hub_fetch`, and
`aegis.models.profiles.profile_from_config` counts it.

    match_model("llama-3.1-8b-chat")       # ModelMatch(model_id='meta-llama/Llama-3.1-8B-Instruct', source='catalog',
                                           #   note='meta-llama/Llama-3.1-8B-Instruct (config used for llama-3.1-8b-chat)…')
    match_model("qwen3-13b")               # UnknownModelError: no bundled qwen 3 13B (qwen 3 is bundled in …);
                                           #   did you mean Qwen/Qwen3-14B, …? how to pass a config.json
    profile = resolve_model("llama-3.1-8b")           # bundled alias
    profile = resolve_model("./my-model/config.json")  # local file
    profile.total_params, profile.trainable_params("lora")

How a name is read (never a model of another family, version, size or variant):

1. a path (an existing file or folder, ``*.json``, ``./``, ``/``, ``~``) is read as given;
2. a Hub id ``org/name``: the bundled model of that id; else its config.json in the local Hub cache; else the
   bundled model whose repository has that exact name under another organisation (a renamed organisation, or a
   copy such as ``unsloth/Llama-3.2-3B-Instruct``); else a bundled model of the same org whose name differs only
   by an instruct/base suffix (the same config.json); in both, the Hub id stays the checkpoint whose weights a run
   downloads, and the match says which config is used;
   else the Hub id itself, fetched (and cached) when `resolve_model` runs online;
3. any other name is cut into family, version, size (compared as numbers: ``0.5b`` = ``500m``; ``8x7b``;
   ``30b-a3b``), and other words; Ollama's ``name:size[-tag]`` reads as ``name-size[-tag]`` (its tag ``text`` is
   the pre-trained model: ``-base``). It is the bundled
   model whose id or alias has the same tokens (the catalog's naming rule); else the one bundled model whose id or
   versioned alias has the same family, version, size and words, ignoring instruct/base suffixes (``-it``/``-pt``,
   ``-Instruct``, ``-chat``, ``-base``, ``-hf``, Ollama quantisation tags), which share a config.json — the closest
   suffix wins (same suffix, then same kind), and the match says which config is used; else the
   same with the family word's spelling corrected (``lama-3.1-8b``, ``mistrl-7b`` → the entry whose catalog name
   the corrected spelling is), when the name gives a size (or a version and
   a variant word) and its family word is no known family; else a model in the local Hub cache read the same way;
4. anything else is an `UnknownModelError` that lists the close bundled models (same family first) and how to
   pass a config.json. Two or more bundled matches are an error too: a name never picks one of several.
"""

from __future__ import annotations

import json
import math
import re
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, NamedTuple

from pydantic import Field

from aegis.models import catalog
from aegis.models.catalog._aliases import key as _key, plain_version
from aegis.errors import InvalidConfigError, UnknownModelError
from aegis.models.hub_fetch import cached_config, cached_repos, fetch_config
from aegis.models.profiles import profile_from_config
from aegis.schema import Frozen, ModelProfile

__all__ = [
    "ModelMatch", "match_model", "suggest_models", "names_one_model", "resolve_model", "canonical_model_id",
    "list_models",
]

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")

SAME_CONFIG_WORDS = frozenset({"instruct", "it", "pt", "chat", "base", "hf"})
"""Suffixes of instruct/base siblings, which keep each other's layer shapes (their config.json may differ in
generation keys such as eos, context length or norm epsilon)."""
_INSTRUCT_WORDS = frozenset({"instruct", "it", "chat"})
_QUANT_TAG = re.compile(r"[-_:](?:q[2-8](?:_[a-z0-9]+)*|i?q[1-4]_[a-z0-9_]+|f16|fp16|bf16|qat|gguf|latest)$")
"""Ollama/GGUF tags (``-q4_K_M``, ``-qat``, ``:latest``): a packaging of the same model."""
OTHER_FAMILIES = frozenset(
    "deepseek falcon yi olmo olmoe granite starcoder starcoder2 codellama codegemma codeqwen internlm internlm2 "
    "baichuan chatglm glm gpt opt bloom bloomz pythia tinyllama smollm smollm2 smollm3 zephyr vicuna aya jamba dbrx "
    "arctic nemotron minitron exaone hermes openhermes qwq solar stablelm mpt wizardlm mamba rwkv grok kimi ernie "
    "hunyuan magistral devstral codestral ministral pixtral mathstral llava idefics paligemma recurrentgemma "
    "shieldgemma medgemma openchat tulu cohere command minicpm orion xverse seallm sailor".split()
)
"""Model families a user may name besides the catalog's (which come from the catalog): such a name is that
family's model — bundled or not, never a misspelt bundled family ('ministral' is not 'mistral')."""

Source = Literal["catalog", "path", "hub", "cache"]


class ModelMatch(Frozen):
    """What a model name refers to, decided by `match_model`."""

    model_id: str = Field(description="The bundled id, Hub id or path whose config.json is used.")
    source: Source = Field(description="Where that config.json comes from: catalog, path, cache or hub (to fetch).")
    note: str = Field(default="", description="How the name was read when it is not that id: a variant sharing the "
                                              "config, a spelling fixed, a cached repo. Empty when it is the id.")
    checkpoint: str | None = Field(
        default=None,
        description="The Hub id of the weights the name means when it is a sibling listed with that config (e.g. "
        "an -Instruct repo sharing its base's config.json): what a run downloads and trains. None: model_id.",
    )

    @property
    def weights_id(self) -> str:
        """The repository whose weights the name means (the checkpoint, else the config's id)."""
        return self.checkpoint or self.model_id


# ------------------------------------------------------------------------------------------ names


class _Size(NamedTuple):
    total: float | None = None
    experts: int | None = None
    active: float | None = None

    def same(self, other: "_Size") -> bool:
        """``self`` (what was asked) equals ``other`` (a known name); an asked size may leave the active part out."""
        if self.experts != other.experts or not _close(self.total, other.total):
            return False
        return self.active is None or _close(self.active, other.active)

    @property
    def magnitude(self) -> float:
        """Parameters, roughly (for ordering): experts x size, else the total, else the active part."""
        return (self.total or self.active or 1.0) * (self.experts or 1)

    def __str__(self) -> str:
        out = (f"{self.experts}x" if self.experts else "") + (_fmt_params(self.total) if self.total else "")
        return out + (f"-A{_fmt_params(self.active)}" if self.active else "")


def _close(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return abs(a - b) <= 0.01 * max(a, b)


def _fmt_params(n: float) -> str:
    return f"{n / 1e9:g}B" if n >= 1e8 else f"{n / 1e6:g}M"


class _Name(NamedTuple):
    """A model name cut into parts: 'Qwen2.5-7B-Instruct' → family qwen, version 2.5, size 7B, variant instruct."""

    family: str | None
    version: str | None
    size: _Size | None
    words: tuple[str, ...]  # what else names the model (coder, mini, 4k, v0.3, ...), sorted
    variant: tuple[str, ...]  # instruct/base suffixes (SAME_CONFIG_WORDS), sorted
    specific: bool  # names one model, not a family: a size, or a known family word with a version or word after it

    def same_model(self, other: "_Name", family: str | None = None) -> bool:
        """Same family, version, size and words (instruct/base suffixes aside)."""
        sizes = (self.size is None and other.size is None) or (
            self.size is not None and other.size is not None and self.size.same(other.size))
        return ((family or self.family) == other.family and self.version == other.version and sizes
                and self.words == other.words)

    @property
    def group(self) -> str:
        return " ".join(p for p in (self.family, self.version) if p)


_SIZE_RX = re.compile(r"^(?:(\d{1,3})x)?(\d+(?:\.\d+)?)([bm])$")
_ACTIVE_RX = re.compile(r"^a(\d+(?:\.\d+)?)([bm])$")
_NUMBER_RX = re.compile(r"^\d+(?:\.\d+)*$")
_LEAD_RX = re.compile(r"^([a-z]+)(\d.*)?$")


_OLLAMA_TEXT = re.compile(r"(^|-)text(?=-|$)")


def _unit(value: str, unit: str) -> float:
    return float(value) * (1e9 if unit == "b" else 1e6)


def _parse_name(name: str) -> _Name:
    text = name.strip().lower().rsplit("/", 1)[-1]
    while True:  # Ollama/GGUF packaging tags
        stripped = _QUANT_TAG.sub("", text)
        if stripped == text:
            break
        text = stripped
    head, colon, tag = text.partition(":")
    if colon:  # Ollama names the pre-trained model by the tag 'text' ('llama3.1:8b-text', 'gemma2:9b-text-q4_0')
        text = head + colon + _OLLAMA_TEXT.sub(r"\1base", tag)
    text = re.sub(r"(?<=\d)_(?=\d)", ".", text)  # Hub ids write decimals with '_': phi-1_5, Qwen-1_8B, internlm2_5
    chunks = [c for c in re.split(r"[\s_:-]+", text) if c]
    known = _families()
    at = next((i for i, c in enumerate(chunks) if _LEAD_RX.match(c) and _LEAD_RX.match(c).group(1) in known), None)
    if at is None:
        at = next((i for i, c in enumerate(chunks) if _LEAD_RX.match(c)), len(chunks))
    if 0 < at and chunks[at - 1] == "meta" and chunks[at].startswith("llama"):
        del chunks[at - 1]  # Meta-Llama-3-8B
        at -= 1
    family, pieces = None, list(chunks[:at])
    if at < len(chunks):
        lead = _LEAD_RX.match(chunks[at])
        assert lead is not None
        family = lead.group(1)
        pieces += ([lead.group(2)] if lead.group(2) else []) + chunks[at + 1:]
    before = len(chunks[:at])
    version = None
    total = experts = active = None
    words: list[str] = []
    variant: list[str] = []
    for i, piece in enumerate(pieces):
        size, act = _SIZE_RX.match(piece), _ACTIVE_RX.match(piece)
        if size and total is None and i >= before:
            experts = int(size.group(1)) if size.group(1) else None
            total = _unit(size.group(2), size.group(3))
        elif act and active is None and i >= before:
            active = _unit(act.group(1), act.group(2))
        elif _NUMBER_RX.match(piece) and i == before and family is not None:
            version = plain_version(piece)  # the number after the family word: qwen 2.5, gemma-3, phi3 (3.0 is 3)
        elif piece in SAME_CONFIG_WORDS:
            variant.append(piece)
        else:
            words.append(piece)
    sized = _Size(total, experts, active) if (total or active) else None
    specific = sized is not None or (family in known and (version is not None or len(pieces) > before))
    return _Name(family, version, sized, tuple(sorted(words)), tuple(sorted(variant)), specific)


def names_one_model(name: str) -> bool:
    """True when ``name`` names one model ('gemma-3-27b', 'mistral nemo'), not only a family ('a small qwen')."""
    return _parse_name(name).specific


# ---------------------------------------------------------------------------------------- catalog


class _Known(NamedTuple):
    """A bundled model and the names it answers to."""

    id: str
    org: str
    group: str  # its family and version, for "same family first"
    full: tuple[_Name, ...]  # its id (and structured catalog fields): names spelling may be corrected to
    names: tuple[_Name, ...]  # full + the ids and aliases that keep its family and version (a series alias such
    # as 'llama-8b' is the catalog's choice for that exact name, not stretched to 'llama-8b-chat')


def _ids(entry: Any) -> tuple[str, ...]:
    """The Hub ids a bundled config serves: its id, and those the catalog lists as sharing it (``also_ids``)."""
    return (entry.id, *getattr(entry, "also_ids", ()))


def _field(entry: Any, name: str) -> str | None:
    value = getattr(entry, name, None)
    return str(value).strip() or None if value not in (None, "") else None


def _known_of(entry: Any) -> _Known:
    base = _parse_name(entry.id)
    full = [base]
    family, size, variant = _field(entry, "family"), _field(entry, "size"), _field(entry, "variant")
    if family or size:  # structured fields, where the catalog has them: one more full name
        fam = _parse_name(family) if family else base
        fam_word = fam.family if fam.family == base.family or not base.family else base.family
        parts = [fam_word or "", fam.version or base.version or "", size or "", *base.words]
        if variant and variant.lower() in SAME_CONFIG_WORDS:
            parts.append(variant)
        extra = _parse_name("-".join(p for p in parts if p))
        if extra.size is not None and extra != base:
            full.append(extra)
        if family and fam.family and fam.family != base.family and fam.family in base.words:
            # the line's name follows the architecture's in the id (bigcode/gpt_bigcode-santacoder): it answers to it
            line = [fam.family, fam.version or ""]
            full.append(_parse_name("-".join(p for p in (*line, size or "") if p)))
            if _field(entry, "sole_size"):  # released in this one size: the line alone names it
                full.append(_parse_name("-".join(p for p in line if p)))
    aliases = [_parse_name(a) for a in (*(i.split("/", 1)[-1] for i in _ids(entry)), *entry.aliases)]
    kept = [a for a in aliases if (a.family, a.version) == (base.family, base.version)]  # not 'llama-8b', 'gemma-2b'
    group = " ".join(_key(family)) if family else base.group
    return _Known(entry.id, entry.id.split("/", 1)[0].lower(), group, tuple(full), tuple(full + kept))


@lru_cache(maxsize=1)
def _catalog() -> tuple[tuple[_Known, ...], dict[tuple[str, ...], str]]:
    """Every bundled model with the names it answers to (parsed once, when a name is not an exact catalog name)."""
    return tuple(_known_of(e) for e in catalog.names()), catalog.name_keys()


@lru_cache(maxsize=512)
def _known_by_id(model_id: str) -> _Known:
    entry = catalog.model_entry(model_id)
    assert entry is not None
    return _known_of(entry)


@lru_cache(maxsize=1)
def _families() -> frozenset[str]:
    keys = (_key(m.id.split("/", 1)[-1]) for m in catalog.names())
    keys = (k[1:] if k[:2] == ("meta", "llama") else k for k in keys)  # Meta-Llama-3-8B
    bundled = {k[0] for k in keys if k and k[0].isalpha()}
    fields = {_key(f)[0] for m in catalog.names() if (f := _field(m, "family")) and _key(f) and _key(f)[0].isalpha()}
    return frozenset(bundled | fields | OTHER_FAMILIES)


@lru_cache(maxsize=1)
def bundled_families() -> frozenset[str]:
    """First words of the bundled models' names (llama, qwen, gemma, ...)."""
    return frozenset(k.names[0].family for k in _catalog()[0] if k.names[0].family)


# -------------------------------------------------------------------------------------- decision


def match_model(name: str) -> ModelMatch:
    """The model ``name`` refers to (the rules are in this module's docstring); UnknownModelError otherwise.

    The parser and `resolve_model` both ask this function, so they never disagree on a name."""
    if not isinstance(name, str) or not name.strip():
        raise UnknownModelError("empty model name: pass an alias like 'llama-3.1-8b', a Hub id, or a config.json path")
    name = name.strip()
    path = Path(name).expanduser()
    if name.endswith(".json") or name.startswith((".", "/", "~")) or _exists(path):
        return ModelMatch(model_id=name, source="path")
    if _HUB_ID.match(name):
        return _match_hub_id(name)
    owner = catalog.name_keys().get(_key(name))  # the fast path: an id, repository name or alias, no parsing
    asked = _parse_name(name)
    if owner is not None:
        entry = _known_by_id(owner)
        return ModelMatch(model_id=entry.id, source="catalog", note=_variant_note(name, entry, asked),
                          checkpoint=_sibling_id(entry.id, name) or _listed_checkpoint(entry.id, asked))
    if asked.family is None:
        raise UnknownModelError(_unknown_message(name, asked))
    known = _catalog()[0]
    found = _closest_variant(asked, [k for k in known if any(asked.same_model(n) for n in k.names)])
    if len(found) > 1:
        raise UnknownModelError(_ambiguous(name, [k.id for k in found]))
    if found:
        cached = _match_cache(asked, exact_variant=True) if _variant_note(name, found[0], asked) else None
        if cached:
            return cached
        if _is_sibling(asked, found[0]) and (differ := _siblings_differ(found[0].id)):
            raise UnknownModelError(_differ_message(name, found[0].id, differ))
        return ModelMatch(model_id=found[0].id, source="catalog", note=_variant_note(name, found[0], asked),
                          checkpoint=_listed_checkpoint(found[0].id, asked))
    for other, how in _rewrites(name, asked):  # each rewrite removes what triggered it: no loop
        try:
            found_other = match_model(other)
        except UnknownModelError:
            continue
        if found_other.source == "catalog":
            said = f"read {name!r} as {other!r} ({how})"
            return found_other.model_copy(update={"note": said + (f"; {found_other.note}" if found_other.note else "")})
    fixed = _spelling(name, asked, known)
    if len(fixed) == 1:
        note = _variant_note(name, fixed[0], asked)
        return ModelMatch(model_id=fixed[0].id, source="catalog", note=(
            f"read {name!r} as {fixed[0].id} (spelling of {asked.family!r} corrected)" + (f"; {note}" if note else "")))
    if len(fixed) > 1:
        raise UnknownModelError(_ambiguous(name, [k.id for k in fixed]))
    cached = _match_cache(asked, exact_variant=False)
    if cached:
        return cached
    raise UnknownModelError(_unknown_message(name, asked))


def _sibling_id(entry_id: str, name: str) -> str | None:
    """The catalog entry's listed Hub id whose repository name is ``name`` (or which ``name`` is), when it is not
    the entry's own id: the weights an -Instruct name means though it shares its base's config."""
    entry = catalog.model_entry(entry_id)
    want = name.strip().lower()
    for hub_id in getattr(entry, "ids", ()) or ():
        if hub_id.lower() != entry_id.lower() and want in (hub_id.lower(), hub_id.split("/", 1)[-1].lower()):
            return hub_id
    return None


def _listed_checkpoint(entry_id: str, asked: _Name) -> str | None:
    """The Hub id, among those the entry lists as sharing its config, that the asked name is a variant of
    ('deepseek-r1-chat' -> deepseek-ai/DeepSeek-R1, not the entry's DeepSeek-V3): the weights a run trains.
    None when the name is a variant of the entry's own id and no listed id has the suffix asked
    ('olmo-2-1124-7b-instruct' -> OLMo-2-1124-7B-Instruct, listed with the base's config)."""
    own = _parse_name(entry_id)
    if asked.same_model(own) and asked.variant == own.variant:
        return None
    entry = catalog.model_entry(entry_id)
    listed = [i for i in getattr(entry, "ids", ()) or () if i.lower() != entry_id.lower()]
    hits = [i for i in listed if asked.same_model(_parse_name(i))]
    if not hits and asked.variant:  # a suffix asked of this entry, though the name leaves out a word all its ids have
        # ('olmo2:7b-instruct': the release '1124'), or the listed id its size (Mistral-Nemo-Instruct-2407 is the 12B)
        size = next((f.size for f in _known_by_id(entry_id).full if f.size), None)
        hits = [i for i in listed if _is_instruct((n := _parse_name(i)).variant) == _is_instruct(asked.variant)
                and asked._replace(size=asked.size or size,
                                   words=tuple(sorted(set(asked.words) | (set(own.words) & set(n.words))))
                                   ).same_model(n._replace(size=n.size or size))]
    exact = [i for i in hits if _parse_name(i).variant == asked.variant]
    kind = [i for i in hits if _is_instruct(_parse_name(i).variant) == _is_instruct(asked.variant)]
    if asked.same_model(own) and not (exact or (kind and _is_instruct(asked.variant) != _is_instruct(own.variant))):
        return None
    return (exact or kind or hits or [None])[0]


def _is_instruct(variant: tuple[str, ...]) -> bool:
    return bool(set(variant) & _INSTRUCT_WORDS)


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except (OSError, ValueError):
        return False


def _match_hub_id(repo_id: str) -> ModelMatch:
    entry = catalog.model_entry(repo_id)  # its id, or one of the ids it lists as sharing its config
    if entry is not None:
        note = "" if entry.id.lower() == repo_id.lower() else _shared_note(repo_id, entry.id)
        return ModelMatch(model_id=entry.id, source="catalog", note=note, checkpoint=_sibling_id(entry.id, repo_id))
    if cached_config(repo_id):
        return ModelMatch(model_id=repo_id, source="cache")
    org, _, rest = repo_id.partition("/")
    copy = catalog.find_model(rest)
    named = [i for i in (copy.ids if copy is not None else ()) if i.rsplit("/", 1)[-1].lower() == rest.lower()]
    if copy is not None and named:  # the same repository name under another organisation: renamed, or a copy
        return ModelMatch(model_id=copy.id, source="catalog", note=_shared_note(repo_id, named[0], copy.id),
                          checkpoint=repo_id)
    asked = _parse_name(rest)
    same = [k for k in _catalog()[0] if k.org == org.lower() and any(asked.same_model(n) for n in k.full)]
    if len(same) == 1:  # a sibling repo of the bundled config: its own weights, planned with that config
        sibling = repo_id.lower() != same[0].id.lower()  # its own weights, planned with the sibling's shapes
        if sibling and _siblings_differ(same[0].id):  # not in this line: its own config.json, from the Hub
            return ModelMatch(model_id=repo_id, source="hub")
        return ModelMatch(model_id=same[0].id, source="catalog", note=_shared_note(repo_id, same[0].id) if sibling else "",
                          checkpoint=repo_id if sibling else None)
    return ModelMatch(model_id=repo_id, source="hub")


def _closest_variant(asked: _Name, found: list[_Known]) -> list[_Known]:
    """Of bundled siblings that differ only by instruct/base suffix, those closest to the suffix asked: the same
    suffix, else the same kind (instruct, it, chat / base, pt, hf), else one that states none."""
    if len(found) < 2:
        return found

    def distance(k: _Known) -> int:
        theirs = set(k.full[0].variant)
        if theirs == set(asked.variant):
            return 0
        if not theirs or not asked.variant:
            return 2
        return 1 if bool(theirs & _INSTRUCT_WORDS) == bool(set(asked.variant) & _INSTRUCT_WORDS) else 3

    best = min(distance(k) for k in found)
    return [k for k in found if distance(k) == best]


def _variant_note(name: str, known: _Known, asked: _Name) -> str:
    """Said when ``name`` carries an instruct/base suffix the bundled id does not ('gemma-3-4b-it' → -pt), or
    names no suffix and the bundled id is an instruct model ('yi-34b' → Yi-34B-Chat): a run trains those weights."""
    theirs = set(known.full[0].variant)
    if not asked.variant and theirs & _INSTRUCT_WORDS and _key(name) != _key(known.id.split("/", 1)[-1]):
        return (f"{known.id} (config used for {name}): the bundled {' '.join(sorted(theirs))} model of that name; "
                "a run trains its weights; name the base checkpoint's Hub id to train that instead (same layer shapes)")
    if set(asked.variant) <= theirs or not (_is_instruct(asked.variant) or theirs & _INSTRUCT_WORDS):
        return ""  # the suffix it has, or a base asked of a base model ('llama3.1:8b-text' is Llama-3.1-8B itself)
    return _shared_note(name, known.id)


def _is_sibling(asked: _Name, known: _Known) -> bool:
    """Whether ``asked`` names another checkpoint than ``known`` by its instruct/base suffix alone."""
    return bool(set(asked.variant) - set(known.full[0].variant))


_SHAPE_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads",
               "num_key_value_heads")


@lru_cache(maxsize=64)
def _siblings_differ(model_id: str) -> str:
    """Evidence that instruct and base siblings of ``model_id``'s line do not keep each other's layer shapes: a
    bundled pair of the line (same release, same size, one instruct, one base) whose shapes differ ('' when every
    such pair agrees, or there is none). Granite's instruct checkpoints add tokens to the base vocabulary."""
    entry = catalog.model_entry(model_id)
    line = _key(entry.family or model_id.split("/", 1)[-1])[:1] if entry is not None else ()
    groups: dict[tuple[str, str], dict[bool, Any]] = {}
    for other in catalog.names():
        if not other.family or _key(other.family)[:1] != line:
            continue
        parsed = _parse_name(other.id.split("/", 1)[-1])
        instruct = bool(set(parsed.variant) & _INSTRUCT_WORDS) or other.variant == "instruct"
        same = (other.family, other.size, parsed.version, parsed.words)  # one release: v0.2 and v0.3 are two
        groups.setdefault(same, {}).setdefault(instruct, other)
    for pair in groups.values():
        if len(pair) < 2:
            continue
        base, tuned = (catalog.read_model_config(catalog.model_entry(pair[k].id)) for k in (False, True))
        diff = [k for k in _SHAPE_KEYS if base.get(k) != tuned.get(k)]
        if diff:
            k = diff[0]
            return (f"{pair[True].id} has {k} {tuned.get(k):,} where {pair[False].id} has {base.get(k):,}"
                    if isinstance(tuned.get(k), int) and isinstance(base.get(k), int) else
                    f"{pair[True].id} and {pair[False].id} differ in {k}")
    return ""


def _differ_message(name: str, model_id: str, evidence: str) -> str:
    return (f"unknown model {name!r}: not bundled, and its bundled sibling {model_id} does not share its layer shapes "
            f"(instruct and base differ in this line: {evidence}); pass its own config.json (a path), or its Hub id "
            "when online")


def _shared_note(name: str, model_id: str, config_id: str | None = None) -> str:
    """How ``name`` was read as ``model_id``'s config (``config_id``'s file, when the catalog lists ``model_id`` as
    sharing it)."""
    config_id = config_id or model_id
    if name.rsplit("/", 1)[-1].lower() == model_id.rsplit("/", 1)[-1].lower():  # CohereLabs/ for CohereForAI/
        shared = "" if config_id == model_id else f", which shares {config_id}'s config.json"
        return (f"{config_id} (config used for {name}): the same repository as {model_id} under another "
                f"organisation's name (a renamed organisation or a copy){shared}; pass its own config.json if it "
                "differs")
    return (f"{model_id} (config used for {name}): an instruct/base sibling, planned with its layer shapes "
            "(fine-tuned siblings keep them); pass its own config.json if its shapes or vocabulary differ")


_VERSION_TAG = re.compile(r"^v(\d+(?:\.\d+)*)$")


def _rewrites(name: str, asked: _Name) -> list[tuple[str, str]]:
    """Other spellings of a name that names no bundled model as written, each keeping its family and size: an
    instruct suffix with a slip in it ('instuct', 'instrcut' are 'instruct'), and Ollama's version tag after the
    size ('yi:34b-v1.5' is Yi-1.5-34B) when the family word carries no version."""
    out: list[tuple[str, str]] = []
    slips = [w for w in asked.words if len(w) >= 6 and _typos(w, "instruct") == 1]
    if len(slips) == 1:
        fixed = re.sub(re.escape(slips[0]), "instruct", name, count=1, flags=re.IGNORECASE)
        out.append((fixed, f"spelling of {slips[0]!r} corrected"))
    tags = [w for w in asked.words if _VERSION_TAG.match(w)]
    head, colon, tail = name.partition(":")
    if colon and asked.family and asked.version is None and len(tags) == 1:
        rest = re.sub(rf"(^|[-_]){re.escape(tags[0])}(?=$|[-_])", "", tail, count=1, flags=re.IGNORECASE)
        if rest != tail:  # the tag follows the size ('yi:34b-v1.5'); one in the name itself is the model's own
            version = _VERSION_TAG.match(tags[0]).group(1)  # type: ignore[union-attr]
            out.append((f"{head}-{version}:{rest.lstrip('-_')}", f"Ollama's {tags[0]} tag is the version"))
    return out


def _spelling(name: str, asked: _Name, known: tuple[_Known, ...]) -> list[_Known]:
    """Bundled models whose full name is ``name`` with its family word's spelling corrected: the entry the
    corrected name is in the catalog, else those whose id has its family, version, size and words."""
    family = asked.family
    if not family or family in _families() or len(family) < 3 or not asked.specific:
        return []
    if asked.size is None and not (asked.version and asked.words):
        return []
    found: list[_Known] = []
    for fixed in _nearest_families(family):
        full = [k for k in known if any(asked.same_model(n, family=fixed) for n in k.full)]
        key = tuple(fixed if t == family else t for t in _key(name))
        named = [k for k in known if _catalog()[1].get(key) == k.id]  # the corrected name is a catalog name
        found += named if len(named) == 1 else _closest_variant(asked, full)
    return found


def _typos(a: str, b: str) -> int:
    """Edits between two words, a swap of neighbours counting as one (optimal string alignment distance)."""
    prev2: list[int] = []
    prev = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        row = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            row[j] = min(prev[j] + 1, row[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1]))
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                row[j] = min(row[j], prev2[j - 2] + 1)
        prev2, prev = prev, row
    return prev[-1]


def _nearest_families(word: str) -> list[str]:
    """Bundled family words ``word`` is a slip of: the nearest ones, within one edit (two for six letters or more).
    'amthstral' is 'mathstral' (one swap), never 'mistral'."""
    limit = 2 if len(word) >= 6 else 1
    dist = {f: _typos(word, f) for f in bundled_families()}
    best = min(dist.values(), default=limit + 1)
    return sorted(f for f, d in dist.items() if d == best <= limit)


def _match_cache(asked: _Name, *, exact_variant: bool) -> ModelMatch | None:
    repos = [r for r in cached_repos() if asked.same_model(n := _parse_name(r)) and (
        not exact_variant or n.variant == asked.variant)]
    exact = [r for r in repos if _parse_name(r).variant == asked.variant]
    pick = (exact or repos)[:1]
    if not pick:
        return None
    note = "" if exact else f"{pick[0]} from the local Hub cache (an instruct/base sibling, planned with its shapes)"
    return ModelMatch(model_id=pick[0], source="cache", note=note)


# ----------------------------------------------------------------------------------------- errors


def _named_as(known: _Known, families: set[str] | frozenset[str]) -> _Name:
    """The full name of ``known`` in one of ``families`` (SantaCoder's line name, where its id starts 'gpt_bigcode'),
    else its id's."""
    return next((n for n in known.full if n.family in families and n.size), None) or next(
        (n for n in known.full if n.family in families), known.full[0])


def suggest_models(name: str, n: int = 3) -> tuple[str, ...]:
    """Bundled ids close to ``name``, best first: same family and version, then the family, nearest size first."""
    import difflib  # suggestions only: a name that resolves never needs it

    asked = _parse_name(name)
    known = _catalog()[0]
    families = {asked.family} if asked.family else set()
    if asked.family and asked.family not in _families():
        families |= set(difflib.get_close_matches(asked.family, sorted(bundled_families()), n=2, cutoff=0.75))

    def rank(k: _Known) -> tuple[float, ...]:
        mine = _named_as(k, families)
        kin = 0 if mine.family in families and mine.version == asked.version else 1 if mine.family in families else 2
        words = 0 if set(mine.words) == set(asked.words) else 1 if asked.words and set(asked.words) <= set(mine.words) else 2
        gap = 9.0
        if asked.size and mine.size:
            gap = abs(math.log(asked.size.magnitude / mine.size.magnitude))
        return (kin, words, gap, -difflib.SequenceMatcher(None, name.lower(), k.id.lower()).ratio())

    ranked = sorted(known, key=rank)
    kin = [k.id for k in ranked if _named_as(k, families).family in families]
    if kin:
        return tuple(kin[:n])
    low = name.lower().rsplit("/", 1)[-1]
    alike = (k.id for k in ranked if difflib.SequenceMatcher(None, low, k.id.split("/", 1)[-1].lower()).ratio() >= 0.6)
    return tuple(alike)[:n]


def _how_to_pass(asked: _Name) -> str:
    orgs = sorted({k.id.split("/", 1)[0] for k in _catalog()[0] if _named_as(k, {asked.family}).family == asked.family})
    hub = f"{orgs[0]}/<name>" if len(orgs) == 1 else "org/name"
    return (f"pass its config.json (`--model ./path/config.json`) or its Hub id (`--model {hub}`, fetched when "
            "online); `aegis models` lists the bundled ones")


def _unknown_message(name: str, asked: _Name) -> str:
    known = _catalog()[0]
    wider_ids: tuple[str, ...] = ()
    named = [(k, _named_as(k, {asked.family})) for k in known] if asked.family else []
    kin = [(k, n) for k, n in named if n.family == asked.family]
    if asked.family is None or not kin:
        why = f"no bundled {asked.family!r} model" if asked.family else "not a model name Aegis knows"
    elif not asked.specific:
        why = f"which {asked.family}? Say its version and size"
    else:
        same = [(k, n) for k, n in kin if n.version == asked.version]
        parts = (asked.family, asked.version, *asked.words, str(asked.size) if asked.size else "")
        said = " ".join(p for p in parts if p)
        sizes = sorted({n.size for _, n in same if n.size and set(asked.words) <= set(n.words)}, key=lambda z: z.magnitude)
        listed = ", ".join(str(z) for z in sizes)
        wider = [k for k, n in same if set(asked.words) <= set(n.words) and (
            asked.size is None and asked.words
            or asked.size and n.size and asked.size.same(n.size) and set(asked.words) < set(n.words))]
        if wider:  # 'mistral-small-24b', 'gpt-oss': the bundled models of that name carry more words or sizes
            listed = ", ".join(k.id.split("/", 1)[-1] for k in wider)
            why = f"which {said}? Name one of them ({said} is bundled in {listed})"
            wider_ids = tuple(k.id for k in wider)
        elif same and asked.size is None and not asked.words:  # 'phi3.5': a version, several models of it
            kinds = sorted({(n.words, n.size.magnitude if n.size else 0.0,
                             " ".join((*n.words, str(n.size or ""))).strip() or k.id) for k, n in same})
            listed = ", ".join(dict.fromkeys(k[2] for k in kinds))
            why = f"which {asked.group}? Say which one ({asked.group} is bundled in {listed})"
        else:
            line = " ".join(p for p in (asked.family, asked.version, *asked.words) if p)
            why = f"no bundled {said}" + (f" ({line} is bundled in {listed})" if same and sizes else "")
    close = wider_ids or suggest_models(name, n=6 if asked.family and not asked.specific else 3)
    mean = f"; did you mean {', '.join(close)}?" if close else ";"
    return f"unknown model {name!r}: {why}{mean} to plan it, {_how_to_pass(asked)}"


def _ambiguous(name: str, ids: list[str]) -> str:
    return f"model {name!r} is ambiguous: it could be {', '.join(ids)}; name one (`aegis models` lists them)"


# -------------------------------------------------------------------------------------- resolving


def canonical_model_id(name: str) -> str:
    """Bundled model id that ``name`` is read as (see `match_model`); UnknownModelError with close matches."""
    found = match_model(name)
    if found.source == "catalog":
        return found.model_id
    asked = _parse_name(name)
    raise UnknownModelError(f"{name!r} is not a bundled model: {_how_to_pass(asked)}")


def list_models() -> list[ModelProfile]:
    """Profiles of every bundled model."""
    return [resolve_model(entry.id) for entry in catalog.models()]


def resolve_model(id_or_path: str) -> ModelProfile:
    """Resolve a model id, alias, config.json path or model folder to its profile (`match_model` decides which)."""
    if not isinstance(id_or_path, str) or not id_or_path.strip():
        raise UnknownModelError("empty model name: pass an alias like 'llama-3.1-8b', a Hub id, or a config.json path")
    found = match_model(id_or_path)
    return _load(found.model_id, found.source)


@lru_cache(maxsize=256)
def _load(model_id: str, source: Source) -> ModelProfile:
    if source == "path":
        return _from_path(Path(model_id).expanduser())
    if source == "catalog":
        entry = catalog.model_entry(model_id)
        assert entry is not None
        return profile_from_config(catalog.read_model_config(entry), model_id=model_id, source="catalog")
    config, where = fetch_config(model_id, suggest=suggest_models)
    return profile_from_config(config, model_id=model_id, source=where)


def _from_path(path: Path) -> ModelProfile:
    file = path / "config.json" if path.is_dir() else path
    if not file.is_file():
        raise UnknownModelError(f"no config.json at {str(file)!r}: pass a config.json file or a folder that holds one")
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise InvalidConfigError(f"{file} is not valid JSON ({err}); re-download the model's config.json") from err
    return profile_from_config(config, model_id=str(path), source="path")
