"""Names in a free-text plan request: ASCII tokens and separator-free keys, the catalog's models and GPUs as tables
of token keys, and matching the longest catalog name at a token. Used by `aegis.planning.parse`, which reads the
request; this module only knows how names are spelled and where one starts and ends.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from functools import lru_cache

from aegis.planning._parse_vocab import _WORDS

_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
_MASK = "\x00"
_TOKEN = re.compile(r"\d+(?:\.\d+)*|(?<=\d)x(?=[a-z])|[a-z]+", re.ASCII)  # '8xh100' → 8 x h 100
_GAP = re.compile(r"[\s\-_./:]*", re.ASCII)


def _lower(text: str) -> str:
    """ASCII lower case, length-preserving (offsets stay valid against the original)."""
    return text.translate(_LOWER)


def _tokens(text: str) -> list[tuple[str, int, int]]:
    return [(m.group(), m.start(), m.end()) for m in _TOKEN.finditer(text)]


def _key(name: str) -> tuple[str, ...]:
    """Separator- and case-insensitive key: 'Llama-3.1-8B' and 'llama 3.1 8b' → ('llama', '3.1', '8', 'b')."""
    return tuple(_TOKEN.findall(_lower(name)))


def _count(word: str) -> float:
    """A GPU count as typed: 'two' -> 2, '-2' -> -2, '1.5' -> 1.5 (`_settle` refuses what is not a count)."""
    if word in _WORDS:
        return _WORDS[word]
    value = float(word.replace("\u2212", "-"))
    return int(value) if value.is_integer() else value


def _mask(work: str, start: int, end: int) -> str:
    return work[:start] + _MASK * (end - start) + work[end:]


@dataclass(frozen=True)
class _Table:
    """Keys (token tuples) → catalog ids; a key shared by several ids maps to all of them."""

    exact: dict[tuple[str, ...], frozenset[str]]
    prefixes: dict[tuple[str, ...], frozenset[str]]
    longest: int
    names: dict[str, str] = field(default_factory=dict)  # key without separators → id, for suggestions

    @classmethod
    def build(cls, entries: list[tuple[str, list[str]]]) -> "_Table":
        exact: dict[tuple[str, ...], set[str]] = {}
        prefixes: dict[tuple[str, ...], set[str]] = {}
        names: dict[str, str] = {}
        for ident, aliases in entries:
            for alias in aliases:
                key = _key(alias)
                if not key:
                    continue
                exact.setdefault(key, set()).add(ident)
                names.setdefault("".join(key), ident)
                for n in range(1, len(key)):
                    prefixes.setdefault(key[:n], set()).add(ident)
        return cls(
            exact={k: frozenset(v) for k, v in exact.items()},
            prefixes={k: frozenset(v) for k, v in prefixes.items()},
            longest=max((len(k) for k in exact), default=0),
            names=names,
        )

    def suggest(self, phrase: str, n: int = 3) -> tuple[str, ...]:
        close = difflib.get_close_matches("".join(_key(phrase)), list(self.names), n=8, cutoff=0.5)
        ids: list[str] = []
        for name in close:
            if self.names[name] not in ids:
                ids.append(self.names[name])
        return tuple(ids[:n])


_NAME_WORD = re.compile(
    r"(?:\d+x)?\d+(?:\.\d+)?[bm]|a\d+(?:\.\d+)?b|v\d+(?:\.\d+)*"
    r"|instruct|it|pt|chat|base|hf|coder|math|vl|vision|moe|distill|preview"
    r"|small|medium|mini|large|nano|nemo|tiny", re.ASCII)
"""A space-separated word that goes on a model name ('gemma 3 27b', 'mistral small', 'llama 8b instruct');
glued words ('qwen2.5-coder-32b', 'qwen3:14b') always do. Name words other than sizes, versions and
instruct/base suffixes only go on before a size ('mistral small 24b', not 'llama 8b small batch')."""
_SIZED = re.compile(r"(?:\d+x)?\d+(?:\.\d+)?[bm]", re.ASCII)
_SUFFIX = re.compile(r"(?:\d+x)?\d+(?:\.\d+)?[bm]|a\d+(?:\.\d+)?b|v\d+(?:\.\d+)*|instruct|it|pt|chat|base|hf", re.ASCII)
_VENDOR_WORDS = ("nvidia", "geforce", "amd", "tesla", "instinct")


@lru_cache(maxsize=1)
def _models() -> _Table:
    from aegis.models import catalog

    return _Table.build([(m.id, [m.id, m.id.split("/", 1)[-1], *m.aliases]) for m in catalog.names()])


@lru_cache(maxsize=1)
def _family_words() -> frozenset[str]:
    """First word of each bundled model's name ('llama', 'qwen', 'gemma', ...): marks a model mention."""
    from aegis.models import catalog

    keys = (_key(m.id.split("/", 1)[-1]) for m in catalog.names())
    return frozenset(k[0] for k in keys if k and k[0].isalpha() and len(k[0]) >= 3)


@lru_cache(maxsize=1)
def _other_families() -> frozenset[str]:
    """Families Aegis bundles nothing of ('deepseek', 'falcon', ...): with a version or size they name a model."""
    from aegis.models.resolve import OTHER_FAMILIES

    return OTHER_FAMILIES - _family_words()


@lru_cache(maxsize=1)
def _gpus() -> _Table:
    from aegis.planning.hardware import list_gpus

    entries = []
    for gpu in list_gpus():
        names = [gpu.id, gpu.name, *gpu.aliases]
        stripped = [" ".join(t for t in _key(n) if t not in _VENDOR_WORDS) for n in names]
        entries.append((gpu.id, names + [s for s in stripped if s]))
    return _Table.build(entries)


def _name_start(work: str, toks: list[tuple[str, int, int]], i: int) -> int:
    """Index of the first token of the name whose bundled part starts at token ``i``: words glued before it by
    '-' or '_' belong to it ('dolphin-mistral', 'openhermes-2.5-mistral')."""
    while i > 0 and work[toks[i - 1][2]:toks[i][1]] in ("-", "_") and toks[i - 1][0][:1].isalnum():
        i -= 1
    return i


def _name_end(work: str, toks: list[tuple[str, int, int]], i: int, j: int) -> int:
    """Index of the first token after the model name that starts at token ``i`` and has read up to ``j``:
    glued tokens go on it, a space-separated word only if it is a name word (see `_NAME_WORD`)."""
    while j < len(toks) and _adjacent(work, toks[j - 1], toks[j], False):
        if not any(c.isspace() for c in work[toks[j - 1][2]:toks[j][1]]):
            j += 1
            continue
        k = j + 1
        while k < len(toks) and work[toks[k - 1][2]:toks[k][1]] == "":
            k += 1
        sized = any(_SIZED.fullmatch(w) for w in re.split(r"[\s_:-]+", work[toks[i][1]:toks[j - 1][2]]))
        if not (_SUFFIX if sized else _NAME_WORD).fullmatch(work[toks[j][1]:toks[k - 1][2]]):
            break
        j = k
    return j


def _match_at(work: str, toks: list[tuple[str, int, int]], i: int, table: _Table, *, strict_letters: bool):
    """Longest n such that toks[i:i+n] are adjacent and form a key of `table`: (n, ids), or None."""
    n_max = 1
    while n_max < table.longest and i + n_max < len(toks) and _adjacent(work, toks[i + n_max - 1], toks[i + n_max], strict_letters):
        n_max += 1
    for n in range(n_max, 0, -1):
        key = tuple(t for t, _, _ in toks[i:i + n])
        ids = table.exact.get(key)
        if ids:
            return n, ids
        if any(t[0].isdigit() for t in key) and not key[-1].isalpha() and len(key) > 1:
            ids = table.prefixes.get(key, frozenset())
            if len(ids) > 1:
                return n, ids
    return None


def _adjacent(work: str, a: tuple[str, int, int], b: tuple[str, int, int], strict_letters: bool) -> bool:
    gap = work[a[2]:b[1]]
    starts_word = a[1] == 0 or not work[a[1] - 1].isalnum()
    if strict_letters and b[0] == "x" and gap:  # 'mi300 x1': a count, not 'mi300x'
        return False
    if strict_letters and len(a[0]) == 1 and a[0].isalpha() and starts_word and b[0][0].isdigit():  # 'a100', not 'a 100'
        return gap in ("", "-")
    return _GAP.fullmatch(gap) is not None
