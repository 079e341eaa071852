"""How model names people type are read, offline: the parser's model, the resolver's, and whether either is wrong.

For each name of a list (``tests/data/model_names.txt`` by default) it asks the parser (``parse_request_lenient(
"lora NAME on h100")``) and the resolver (``resolve_model(NAME)``), with the Hub offline and, by default, an empty
Hub cache (what a new machine knows), and prints per name: the parser's model, the resolver's, whether they are
the same, whether the name resolved offline (a bundled config), is a Hub id to fetch online, or was refused (with
the message), and the verdict below. The summary gives the share resolved offline (over the list's ``[in-scope]``
names, the families issue 12 names, and over all), the wrong answers and the disagreements.

A **wrong** answer is a model that is not the one the name names. The check is written from the name alone, not
from how `aegis.models.resolve` reads names; the resolved model is described by its Hub id, the checkpoint the match names
(an -Instruct sibling) and its catalog entry's ``family``, ``size`` and ``variant``:

- *family*: the name's family word (``llama``, ``qwen``, ``gemma``, ... ; ``Meta-`` dropped) is the resolved model's,
  or a misspelling of it (edit distance 1, 2 for words of six letters or more);
- *version*: a version the name gives after the family word (``3.1`` in ``llama3.1:8b``, ``2.5``, ``3``) is the
  resolved model's own (``llama3:8b`` is not Llama 3.1);
- *size*: a size the name gives (``8b``, ``500m`` = ``0.5b``, ``8x7b``, ``30b``/``a3b`` of a MoE) is one of the
  resolved model's, compared as numbers within 1%;
- *words*: every other word of the name (``coder``, ``mini``, ``nemo``, ``v0.3``, ``128k``, ``2407``, ...) is a
  word of the resolved model's ids (instruct/base suffixes, packaging tags like ``q4_K_M`` and ``dense`` aside), and
  the resolved model has no line word (``coder``, ``math``, ``python``, ``vision``, ``moe``, ``1m``, ...) the name
  lacks (``qwen2.5-7b`` is not Qwen2.5-Coder-7B);
- *variant*: a name that says instruct (``-instruct``, ``-it``, ``-chat``) or base (``-base``, ``-pt``) planned
  with the other kind's config must say so (the match names the config used); unsaid, it is wrong.

Both answers are checked: the resolver's, and the parser's where it names a model the resolver did not. A refusal
is never wrong. A **disagreement** is the parser and the resolver answering differently: another model, or one
answering and the other not. The parser's model may be the Hub id of the sibling whose weights the name means when
the resolver plans it with that sibling's bundled config (``ModelMatch.weights_id``: the same decision); a Hub id
neither bundled nor cached is read as itself by both and fetched when online (not a disagreement either).

    python -m tools.name_coverage                         # table and summary
    python -m tools.name_coverage --only refused          # rows by status: offline | online | refused | wrong
    python -m tools.name_coverage names.txt --use-cache   # another list; keep the local Hub cache
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import dataclasses
from dataclasses import dataclass
from pathlib import Path

NAMES = Path(__file__).resolve().parents[1] / "tests" / "data" / "model_names.txt"

_SPLIT = re.compile(r"[\s_:/-]+")
_SIZE = re.compile(r"^(?:(\d{1,3})x)?(\d+(?:\.\d+)?)([bm])$")
_ACTIVE = re.compile(r"^a(\d+(?:\.\d+)?)([bm])$")
_NUMBER = re.compile(r"^\d+(?:\.\d+)?$")
_HEAD = re.compile(r"^([a-z]+)(\d+(?:\.\d+)?)$")
_TAG = re.compile(r"[-_:](?:i?q\d(?:_[a-z0-9]+)*|f16|fp16|bf16|fp8|qat|gguf|awq|gptq|int4|int8|bnb-4bit|4bit|latest)$")
"""A packaging of the same weights (Ollama/GGUF quantisation tags, ``:latest``), cut from the end of a name."""
INSTRUCT = frozenset({"instruct", "it", "chat"})
BASE = frozenset({"base", "pt"})
NEUTRAL = frozenset({"hf", "dense", "v1"})
LINE_WORDS = frozenset({"coder", "code", "math", "python", "vision", "vl", "moe", "guard", "1m", "distill"})
"""Words that make another line of models: a resolved model that has one the name lacks is another model."""
_SAME_LINE_IN = {"distill": "r1"}  # deepseek-r1:7b is the R1 distill (there is no other R1 of that size)


@dataclass(frozen=True)
class Parts:
    """A name cut into what names the model."""

    family: str | None
    version: str | None
    sizes: tuple[tuple[int | None, float], ...]  # (experts, total)
    active: tuple[float, ...]
    words: frozenset[str]
    kind: str | None  # instruct | base | None

    @property
    def every_word(self) -> frozenset[str]:
        return self.words | ({self.family} if self.family else set()) | ({self.version} if self.version else set())


def _params(value: str, unit: str) -> float:
    return float(value) * (1e9 if unit == "b" else 1e6)


def parts(name: str) -> Parts:
    """Family, version, sizes, words and instruct/base kind of a model name or Hub id (its org dropped)."""
    text = name.strip().lower().split("/", 1)[-1]
    while (cut := _TAG.sub("", text)) != text:
        text = cut
    head, colon, tag = text.partition(":")
    if colon:  # Ollama's tag 'text' is the pre-trained model ('llama3:8b-text', 'gemma2:9b-text')
        text = head + colon + re.sub(r"(^|-)text(?=-|$)", r"\1base", tag)
    tokens = [t for t in _SPLIT.split(text) if t]
    if len(tokens) > 1 and tokens[0] == "meta" and tokens[1].startswith("llama"):
        tokens = tokens[1:]
    family = version = kind = None
    sizes: list[tuple[int | None, float]] = []
    active: list[float] = []
    words: set[str] = set()
    for i, tok in enumerate(tokens):
        size, act = _SIZE.match(tok), _ACTIVE.match(tok)
        if size and sizes and _params(size.group(2), size.group(3)) < 0.01 * sizes[0][1]:
            size = None  # '1m' after '7b' is a context length (Qwen2.5-7B-Instruct-1M), not a size
        if family is None and not size and tok[0].isalpha():
            head = _HEAD.match(tok)
            family, version = (head.group(1), head.group(2)) if head else (tok, None)
            continue
        if size:
            sizes.append((int(size.group(1)) if size.group(1) else None, _params(size.group(2), size.group(3))))
        elif act:
            active.append(_params(act.group(1), act.group(2)))
        elif family is not None and version is None and _NUMBER.match(tok) and i > 0 and (
                tokens[i - 1] == _family_token(tokens, family)):
            version = tok  # the number right after the family word: 'llama-3.1-8b', 'gemma 2 9b'
        elif tok in INSTRUCT:
            kind = kind or "instruct"
        elif tok in BASE:
            kind = kind or "base"
        elif tok not in NEUTRAL:
            glued = _HEAD.match(tok)  # a sub-line's own version glued to it (Ollama 'mistral-small3.1')
            words.update((glued.group(1), glued.group(2)) if glued and len(glued.group(1)) >= 4 else (tok,))
    return Parts(family, version, tuple(sizes), tuple(active), frozenset(words), kind)


def _family_token(tokens: list[str], family: str) -> str:
    return next(t for t in tokens if t == family or _HEAD.match(t) and _HEAD.match(t).group(1) == family)


def _distance(a: str, b: str) -> int:
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, cb in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (ca != cb))
    return row[-1]


def _swapped(a: str, b: str) -> bool:
    """``a`` is ``b`` with two neighbouring letters swapped ('instrcut')."""
    diff = [i for i in range(len(a)) if len(a) == len(b) and a[i] != b[i]]
    return len(diff) == 2 and diff[1] == diff[0] + 1 and a[diff[0]] == b[diff[1]] and a[diff[1]] == b[diff[0]]


def _same_family(asked: str, theirs: str) -> bool:
    return asked == theirs or _distance(asked, theirs) <= (2 if min(len(asked), len(theirs)) >= 6 else 1)


def _same_version(a: str | None, b: str | None) -> bool:
    """Equal version numbers: '3' is '3.0' (Ollama's granite3 is Granite 3.0), '3.1' is not '3'."""
    if a is None or b is None:
        return a == b
    return _plain(a) == _plain(b)


def _plain(version: str) -> tuple[int, ...]:
    parts = [int(p) for p in version.split(".")]
    while len(parts) > 1 and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 0.01 * max(a, b)


def wrong_reason(name: str, ids: tuple[str, ...], *, family: str = "", size: str = "", variant: str = "",
                 note: str = "") -> str:
    """Why the model described by ``ids`` (its Hub id and the checkpoint named; first is the weights the name means)
    and its catalog fields is not the model ``name`` names; empty when it is that model."""
    asked = parts(name)
    theirs = [parts(i) for i in ids]
    fields = parts(f"{family}-{size}") if family else None
    known = theirs + ([fields] if fields else [])
    if asked.family and not any(t.family and _same_family(asked.family, t.family) for t in known):
        return f"family: {asked.family!r} is not {theirs[0].family!r}"
    if asked.version and not any(_same_version(t.version, asked.version) for t in known if t.family and asked.family and
                                 _same_family(asked.family, t.family)):
        return f"version: {asked.family} {asked.version} is not {theirs[0].family} {theirs[0].version}"
    have_sizes = [s for t in known for s in t.sizes]
    for experts, total in asked.sizes:
        if not any(e == experts and _close(total, t) for e, t in have_sizes):
            return f"size: {experts or ''}{'x' if experts else ''}{total / 1e9:g}B is not " + (
                ", ".join(f"{t / 1e9:g}B" for _, t in have_sizes) or "sized")
    have_active = [a for t in known for a in t.active]
    for act in asked.active:
        if not any(_close(act, a) for a in have_active):
            return f"size: active {act / 1e9:g}B is not the resolved model's"
    words = frozenset().union(*(t.every_word for t in known))
    versions = {t.version for t in known if t.version}
    slip = {w for w in asked.words if len(w) >= 6 and (_distance(w, "instruct") == 1 or _swapped(w, "instruct"))}
    tags = {w for w in asked.words if w[:1] == "v" and w[1:] in versions}  # Ollama 'yi:34b-v1.5': the version
    if slip:  # a slip of 'instruct' asks for the instruct kind, as the word itself does
        asked = dataclasses.replace(asked, kind=asked.kind or "instruct")
    missing = sorted(w for w in asked.words - slip - tags if w not in words)
    if missing:
        return f"words: {', '.join(missing)} not in {ids[0]}"
    extra = sorted(w for w in LINE_WORDS & frozenset().union(*(t.words for t in theirs[:1]))
                   if w not in asked.words and _SAME_LINE_IN.get(w) not in asked.every_word)
    if extra:
        return f"words: {ids[0]} is a {', '.join(extra)} model; the name is not"
    kind = theirs[0].kind or ({"instruct": "instruct", "base": "base"}.get(variant) if variant else None)
    if asked.kind and kind and asked.kind != kind and "config used for" not in note:
        return f"variant: {asked.kind} planned with the {kind} config without saying so"
    return ""


# ----------------------------------------------------------------------------------------------- running


@dataclass(frozen=True)
class Row:
    """One name: what the parser and the resolver made of it."""

    name: str
    scope: str
    parsed: str | None
    resolved: str | None
    status: str  # offline | online | refused
    message: str  # the refusal, or the note naming the config used
    wrong: str  # why the answer is another model; empty when it is not
    agree: bool


def read_names(path: Path = NAMES) -> list[tuple[str, str]]:
    """(name, scope) of every name in a list file: ``[scope]`` headers, ``#`` comments, one name a line."""
    scope, out = "in-scope", []
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            scope = line[1:-1]
            continue
        out.append((line, scope))
    return out


def check(name: str, scope: str = "in-scope") -> Row:
    from aegis.models import catalog
    from aegis.errors import OfflineError, UnknownModelError
    from aegis.models.resolve import match_model, resolve_model
    from aegis.planning.parse import parse_request_lenient

    result = parse_request_lenient(f"lora {name} on h100")
    parsed = result.request.model
    issue = next((i.message for i in result.issues if i.part == "model"), None)
    parser_wrong = _parser_wrong(name, parsed, result.notes)
    try:
        match = match_model(name)
        resolved = resolve_model(name).model_id
    except OfflineError as err:
        agree = parsed == name == match.model_id and issue is None
        return Row(name, scope, parsed, None, "online", str(err), parser_wrong, agree)
    except UnknownModelError as err:
        return Row(name, scope, parsed, None, "refused", str(err), parser_wrong, parsed is None and issue == str(err))
    entry = catalog.model_entry(match.model_id) if match.source == "catalog" else None
    ids = tuple(dict.fromkeys((match.weights_id, match.model_id)))
    wrong = wrong_reason(name, ids, family=entry.family if entry else "", size=entry.size if entry else "",
                         variant=entry.variant if entry else "", note=match.note)
    agree = parsed in (resolved, match.weights_id) and issue is None
    return Row(name, scope, parsed, resolved, "offline", match.note, wrong or parser_wrong, agree)


def _parser_wrong(name: str, parsed: str | None, notes: tuple[str, ...]) -> str:
    """Why the parser's model is not the one ``name`` names (its catalog entry's fields when bundled)."""
    from aegis.models import catalog

    if parsed is None:
        return ""
    entry = catalog.model_entry(parsed)
    why = wrong_reason(name, (parsed,), family=entry.family if entry else "", size=entry.size if entry else "",
                       variant=entry.variant if entry else "", note=" ".join(notes))
    return f"parser: {why}" if why else ""


def run(names: list[tuple[str, str]]) -> list[Row]:
    return [check(name, scope) for name, scope in names]


def summary(rows: list[Row]) -> dict[str, dict[str, float]]:
    """Per scope and over all: names, resolved offline (count and share), wrong, disagreements."""
    out = {}
    for scope in [*dict.fromkeys(r.scope for r in rows), "all"]:
        some = [r for r in rows if scope in ("all", r.scope)]
        offline = sum(r.status == "offline" for r in some)
        out[scope] = {"names": len(some), "offline": offline, "offline_share": offline / len(some) if some else 0.0,
                      "online": sum(r.status == "online" for r in some),
                      "refused": sum(r.status == "refused" for r in some),
                      "wrong": sum(bool(r.wrong) for r in some), "disagree": sum(not r.agree for r in some)}
    return out


def render(rows: list[Row], only: str | None = None) -> str:
    head = f"{'name':44} {'scope':8} {'status':7} {'same':4} {'model (parser = resolver)':44} verdict / message"
    lines = [head, "-" * len(head)]
    for r in rows:
        verdict = "WRONG " + r.wrong if r.wrong else ""
        if only and only != r.status and not (only == "wrong" and r.wrong):
            continue
        model = r.resolved or r.parsed or "-"
        same = "yes" if r.agree else "NO"
        said = verdict or r.message.split(";")[0]
        lines.append(f"{r.name:44} {r.scope[:8]:8} {r.status:7} {same:4} {model:44} {said[:110]}")
    lines.append("")
    for scope, s in summary(rows).items():
        lines.append(f"{scope:9} {s['names']:4.0f} names: {s['offline']:.0f} resolved offline "
                     f"({100 * s['offline_share']:.1f}%), {s['online']:.0f} Hub ids read online only, "
                     f"{s['refused']:.0f} refused; {s['wrong']:.0f} wrong, {s['disagree']:.0f} parser/resolver "
                     "disagreements")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="?", type=Path, default=NAMES, help="a list file (default: %(default)s)")
    parser.add_argument("--only", choices=("offline", "online", "refused", "wrong"), help="rows of one status")
    parser.add_argument("--use-cache", action="store_true", help="keep the local Hub cache (default: an empty one)")
    args = parser.parse_args(argv)
    os.environ["HF_HUB_OFFLINE"] = "1"
    with tempfile.TemporaryDirectory() as empty:
        from huggingface_hub import constants

        constants.HF_HUB_OFFLINE = True
        if not args.use_cache:
            constants.HF_HUB_CACHE = empty
        rows = run(read_names(args.names))
    print(render(rows, args.only))
    return 1 if any(r.wrong or not r.agree for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
