"""Free-text planning requests → `PlanRequest`.

    from aegis.planning.parse import parse_request, parse_request_lenient
    req = parse_request("qlora llama-3.1-8b on 2x a100 80gb with ./data/support.jsonl, seq 4k, 3 epochs")
    req.model, req.gpu, req.gpu_count        # 'meta-llama/Llama-3.1-8B', 'a100-80gb', 2

    res = parse_request_lenient("lora lama-8b on 3900")   # never raises
    res.request                                # what could be read (unknown parts left None)
    res.issues                                 # one `ParseIssue` per unknown/ambiguous part, with close matches
    res.notes, res.unparsed                    # assumptions made, words that meant nothing

`parse_request` raises `RequestParseError` naming every unknown or ambiguous part (its message lists
the close matches); `parse_request_lenient` returns the same findings as data, for the chat agent to
ask back. Neither raises anything else, whatever the text. Fields the text does not mention are None.

Spelling and catalog tables of names (tokens, keys, the longest catalog name at a token) are in
`aegis.planning._parse_names`; the vocabulary of methods, settings and the stack in `aegis.planning._parse_vocab`.

How it reads a request, in order (each stage masks what it consumed so later stages cannot reuse it):

1. whitespace-separated *items*: local paths (``./x.jsonl``, ``/abs``, ``~/x``, ``data/x.csv``,
   ``.../config.json``), Hub ids ``org/name`` and huggingface.co URLs;
2. keywords: method (``qlora``, ``4-bit lora``, ``lora``, ``full fine-tune``, ``fft``), optimizer,
   precision, gradient checkpointing on/off;
3. the model: a run of tokens that starts with a catalog id or alias (``aegis.models.catalog.models``; tokens split
   letters from digits but keep decimals, so ``Llama 3.1 8B``, ``llama3.1-8b`` and ``llama-3.1-8b`` are one
   key) and goes on over what still belongs to the name (``-27b``, ``:14b``, `` small``, ``-Instruct``,
   ``-v0.3``), and back over words glued before it (``dolphin-mistral:7b`` is one name, never ``mistral:7b``):
   ``gemma-3-27b`` is one name, never ``gemma-3`` and a stray ``27b``. What the name means is
   decided by `aegis.models.resolve.match_model`, the function `aegis.resolve_model` uses: an unbundled size or variant is
   an issue naming the close bundled models, never another model;
4. numbers: effective batch, gradient accumulation, micro batch, LoRA rank, sequence length, epochs
   (settings the planner does not use, such as ``lr 2e-4`` or ``eval batch size 8``, are set aside first
   and listed in ``notes`` so their numbers are not misread);
5. the GPU (catalog ids, names and aliases through `aegis.planning.hardware`) with its count
   (``2x a100 80gb``, ``8 x H100``, ``4 h100s``, ``two 4090s``, ``h100 x8``) and bare counts (``on 2 gpus``);
6. ``dataset NAME``; then the items are assigned: a catalog model, a dataset after
   ``with``/``using``/``on``/``dataset``, the first other Hub id a model when none was named;
7. what is left: a GPU-like word after ``on``/``2x``/``gpu`` is looked up with `aegis.planning.hardware.find_gpu`, a
   model-like phrase (a family word such as ``llama`` or ``deepseek-v3``, a family Aegis knows of alone when
   nothing else named a model, ``jamba``, or a size such as ``13b``) with
   `aegis.models.resolve.match_model`; their errors (with close matches) become issues.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from pydantic import Field, ValidationError

from aegis.errors import AegisError, RequestParseError
from aegis.planning._parse_names import (
    _MASK,
    _NAME_WORD,
    _adjacent,
    _count,
    _family_words,
    _gpus,
    _key,
    _lower,
    _mask,
    _match_at,
    _models,
    _name_end,
    _name_start,
    _other_families,
    _tokens,
)
from aegis.planning._parse_vocab import (
    _B,
    _BOUNDS,
    _CHECKPOINTING,
    _CKPT_MODES,
    _COUNT,
    _E,
    _IGNORED,
    _INTEGER_SETTINGS,
    _KBIT_PREP,
    _LIGER,
    _METHODS,
    _OPTIMIZERS,
    _PRECISIONS,
    _SETTINGS,
    _SHARDING,
    _TARGETS,
    _TRAINERS,
    _TRANSFORMERS_VERSION,
    _WORDS,
    _rx,
    _word,
)
from aegis.schema import Frozen, PlanRequest

__all__ = ["ParseIssue", "ParsedRequest", "parse_request", "parse_request_lenient", "MAX_REQUEST_CHARS",
           "transformers_version_problem"]

MAX_REQUEST_CHARS = 4000
"""Longer texts are not parsed (one issue says so): a request is a sentence or two."""

Part = Literal[
    "request", "model", "method", "gpu", "gpu_count", "dataset", "lora_rank", "lora_targets", "micro_batch_size",
    "effective_batch_size", "seq_len", "epochs", "optimizer", "gradient_checkpointing", "precision",
]


class ParseIssue(Frozen):
    """One part of a request that names something unknown, or says two different things."""

    part: Part = Field(description="The PlanRequest field concerned ('request' for the text as a whole).")
    text: str = Field(description="The words of the request this is about.")
    message: str = Field(description="One line for the user: what is wrong and what to write instead.")
    suggestions: tuple[str, ...] = Field(default=(), description="Close catalog ids, best first.")


class ParsedRequest(Frozen):
    """Everything read from a free-text request, including what could not be read."""

    request: PlanRequest = Field(description="The fields read; unknown or contradictory ones are left None.")
    issues: tuple[ParseIssue, ...] = Field(default=(), description="Unknown or ambiguous parts; empty when clean.")
    notes: tuple[str, ...] = Field(default=(), description="Assumptions made while reading (e.g. 'mixed precision' → bf16_mixed).")
    unparsed: tuple[str, ...] = Field(default=(), description="Words that meant nothing to the parser, in order.")
    implied: tuple[str, ...] = Field(default=(), description="Fields read from another field's words, not said "
                                     "(the method LoRA from 'lora dropout 0.1'): a follow-up keeps its previous value.")

    @property
    def ok(self) -> bool:
        return not self.issues

    def strict(self) -> PlanRequest:
        """The request; RequestParseError naming each unknown or ambiguous part when there is one."""
        if self.issues:
            raise RequestParseError("; ".join(issue.message for issue in self.issues))
        return self.request


# -------------------------------------------------------------------------------------- the patterns


_COUNT_BEFORE = _rx(r"(?<![a-z0-9.])" + _COUNT + r"\s*(?:of\s+)?(?:[x×*]\s*)?$")
_COUNT_AFTER = _rx(r"(?:s(?![a-z0-9]))?(?:\s*[x×*]\s*(\d+(?:\.\d+)?)(?![\d.a-z]))?")
_COUNT_ONLY = [
    _rx(r"(?<![a-z0-9.])" + _COUNT + r"\s*(?:[x×*]\s*)?(?:gpus?|cards?|devices?|accelerators?)" + _E),
    _word(r"(?:num~gpus|n~gpus|gpu~count|gpus|world~size|nproc~per~node)~(?:=|:)\s*" + _COUNT),
]
_DATASET_NAME = r"([a-z0-9][a-z0-9_.-]*[a-z0-9])"
_ZERO = r"(?:(?:deep~?speed|ds)~)?(?:zero|ze~ro)~(?:stage~)?"
_ZERO_STAGES: list[tuple[int, re.Pattern[str]]] = [
    (stage, _word(_ZERO + str(stage) + r"(?![\d.])|deep~?speed~(?:zero~)?stage~" + str(stage) + r"(?![\d.])"))
    for stage in (1, 2, 3)
]
"""DeepSpeed ZeRO, said with its stage: 'zero3', 'ZeRO-3', 'ZeRO stage 3', 'deepspeed zero2', 'deepspeed stage 3'."""
_DEEPSPEED = _word(r"deep~?speed(?:~zero)?")
"""DeepSpeed (or ZeRO) without a stage: the request must say which."""

_DATASET_WORD = _word(r"(?:dataset|data~set)~(?:=|:|is|called|named)?~" + _DATASET_NAME)
_DATASET_ASSIGN = _word(r"data~(?:=|:)~" + _DATASET_NAME)

_DATA_EXT = re.compile(r"\.(?:jsonl|json|csv|tsv|parquet|arrow|txt)(?:\.gz|\.zst|\.bz2)?$", re.IGNORECASE | re.ASCII)
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]+/[\w.-]*\w$", re.ASCII)
_URL = re.compile(r"^https?://(?:www\.)?(?:huggingface\.co|hf\.co)/(datasets/)?([\w.-]+/[\w.-]+)", re.IGNORECASE | re.ASCII)
_STRIP_LEAD = "([{<\"'`"
_STRIP_TRAIL = ")]}>\"'`,;:!?."
_DATA_CUE = _rx(r"(?:with|using|use|on|from|dataset|data|w/)\s*(?:the\s+|my\s+|our\s+)?(?:data(?:set)?\s*)?[:=]?\s*$")
_MODEL_CUE = _rx(r"(?:model|base|checkpoint|tune|tuning|finetune|train|training|lora|qlora|fft|ft)\s*[:=]?\s*$")
_NOT_HUB = frozenset({"and/or", "either/or", "on/off", "yes/no", "true/false", "input/output", "and/then"})
_SIZE = _rx(r"^\d+(?:\.\d+)?$")
_STOP = frozenset(
    "a an the on with using use for to of in at by from and or my our your this that it is are be can will "
    "i we you me want need would like please how much many what which if does do fit fits run plan "
    "fine tune tuned tuning finetune finetuning train training ft sft model models gpu gpus card cards "
    "dataset data set sets base instruct chat size batch seq epoch epochs rank x nvidia geforce amd".split()
)
_UNITS = frozenset("samples sample rows row examples example steps step tokens token sequences gb mb tb params parameters".split())
_BREAK = _STOP | _UNITS
_COUNT_CUE = _rx(r"(?<![a-z0-9.])\d{1,4}\s*[x×*]\s*$")
_GPU_BRANDS = frozenset({"rtx", "gtx", "tesla", "radeon", "instinct", "quadro"})
_MAX_LOOKUPS = 4
"""Unknown-name lookups per request (each computes close matches): enough for any real request."""
_GPU_CUE = _rx(_B + r"(?:on|gpus?|using|rent(?:ing)?)\s*[:=]?\s*(?:(?:a|an|the|my|our|one|single|some)\s+)?$")
"""Words right before a GPU name ('on a 3900', 'gpu: h300'); masked text in between breaks the cue."""
_NAME_TOKENS = 6
"""A leftover run longer than this is not a model or GPU name (names are 'deepseek 7b', 'rtx 3080')."""


# --------------------------------------------------------------------------------------- the reader


@dataclass
class _Reader:
    text: str
    work: str
    values: dict[str, list[tuple[Any, str]]] = field(default_factory=dict)
    issues: list[ParseIssue] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    items: list[tuple[str, str, int]] = field(default_factory=list)  # (kind, value as typed, start)
    implied: list[str] = field(default_factory=list)  # fields inferred from other words (ParsedRequest.implied)

    def put(self, part: str, value: Any, said: str) -> None:
        self.values.setdefault(part, []).append((value, said.strip(_MASK + " ")))

    def consume(self, start: int, end: int) -> None:
        self.work = _mask(self.work, start, end)

    def scan(self, part: str, patterns: list[tuple[Any, re.Pattern[str]]]) -> None:
        for value, pattern in patterns:
            for m in list(pattern.finditer(self.work)):
                if _MASK in m.group():
                    continue
                self.put(part, value, self.text[m.start():m.end()])
                self.consume(m.start(), m.end())


def _read_items(r: _Reader) -> None:
    """Paths, Hub ids and URLs, read from the original text so their case is kept."""
    for m in re.finditer(r"\S+", r.text):
        raw, start = m.group(), m.start()
        lead = len(raw) - len(raw.lstrip(_STRIP_LEAD))
        item = raw[lead:].rstrip(_STRIP_TRAIL)
        if not item.isascii() or not item.isprintable():
            continue
        start += lead
        kind = _item_kind(item)
        if kind is None:
            continue
        url = _URL.match(item)
        if url:
            kind, item = ("dataset" if url.group(1) else "hub"), url.group(2).rstrip(".")
        elif kind == "url":
            r.notes.append(f"ignored the link {item}")
        if kind != "url":
            r.items.append((kind, item, start))
        r.consume(start, start + len(raw) - lead)


def _item_kind(item: str) -> str | None:
    if not item.strip("/\\.~"):
        return None  # a lone separator ('rank 64 / an a100') names no path, even though '/' exists
    low = item.lower()
    if "://" in item:
        return "url" if low.startswith(("http://", "https://")) else "path"
    if low.endswith("config.json"):
        return "model_path" if ("/" in item or "\\" in item or low == "config.json") else None
    is_path = item.startswith(("./", "../", "/", "~/", ".\\", "..\\")) or bool(re.match(r"^[A-Za-z]:[\\/]", item))
    if _DATA_EXT.search(item) and (is_path or "/" in item or re.match(r"^[\w.-]+$", item, re.ASCII)):
        return "data_path"
    if is_path or re.match(r"^[\w.-]+/$", item, re.ASCII):
        return "path"
    if _HUB_ID.match(item) and low not in _NOT_HUB:
        org, name = low.split("/", 1)
        if len(org) >= 2 and len(name) >= 2 and not (_is_keyword(org) and _is_keyword(name)):
            return "path" if _exists(item) else "hub"
    return None


def _is_keyword(word: str) -> bool:
    return any(p.fullmatch(word) for _, p in (*_METHODS, *_OPTIMIZERS, *_PRECISIONS))


def _exists(path: str) -> bool:
    try:
        return os.path.exists(os.path.expanduser(path))
    except (OSError, ValueError):
        return False


def _is_model_dir(path: str) -> bool:
    try:
        return os.path.isfile(os.path.join(os.path.expanduser(path), "config.json"))
    except (OSError, ValueError):
        return False


def _read_model(r: _Reader) -> None:
    table = _models()
    toks = _tokens(r.work)
    i = 0
    while i < len(toks):
        hit = _match_at(r.work, toks, i, table, strict_letters=False)
        if hit is None:
            i += 1
            continue
        n, ids = hit
        m = _name_end(r.work, toks, i, i + n)
        first = _name_start(r.work, toks, i)
        start, end = toks[first][1], toks[m - 1][2]
        said = r.text[start:end]
        if first < i:  # 'dolphin-mistral:7b' is not 'mistral:7b': the whole name is asked about
            _model_name(r, said)
        elif len(ids) > 1 and m == i + n and not _one_model(said):
            r.issues.append(_ambiguous("model", said, sorted(ids), "`aegis models` lists them"))
        else:
            _model_name(r, said)
        r.consume(start, end)
        i = m


def _one_model(said: str) -> bool:
    from aegis.models.resolve import names_one_model

    return names_one_model(said)


def _model_name(r: _Reader, said: str) -> None:
    """The model ``said`` names, as `aegis.models.resolve.match_model` decides (the loader's decision too), or an issue."""
    from aegis.models.resolve import match_model, suggest_models

    try:
        found = match_model(said)
    except AegisError as err:
        r.issues.append(ParseIssue(part="model", text=said, message=str(err), suggestions=suggest_models(said)))
        return
    r.put("model", found.weights_id, said)
    if found.note:
        r.notes.append(found.note)


def transformers_version_problem(version: str) -> str | None:
    """None when ``version`` names a transformers release Aegis models (4.x or 5.x: '4', '4.48', '4.48.1', '5.0.0rc1'),
    else one line saying what is accepted."""
    text = str(version).strip().removeprefix("v")
    m = re.fullmatch(r"(\d{1,3})(?:\.\d{1,4}){0,2}(?:\.x)?(?:(?:\.?(?:dev|rc|a|b|post)\d*)|\+[\w.]+)?", text, re.ASCII)
    if m is not None and int(m.group(1)) in (4, 5):
        return None
    return (f"transformers version {str(version).strip()!r} is not one Aegis models: give a 4.x or 5.x release, "
            "e.g. 4.48, 4.57.1 or 5")


def _read_stack(r: _Reader) -> None:
    """The stack the run uses, in words: k-bit preparation, Liger, the transformers version (a mode of gradient
    checkpointing, read earlier, also turns checkpointing on)."""
    r.scan("kbit_prep", _KBIT_PREP)
    r.scan("liger", _LIGER)
    for m in list(_TRANSFORMERS_VERSION.finditer(r.work)):
        if _MASK not in m.group():
            said = r.text[m.start():m.end()]
            problem = transformers_version_problem(m.group(1))
            if problem is None:
                r.put("transformers_version", m.group(1), said)
            else:
                r.issues.append(ParseIssue(part="request", text=said, message=f"{problem} (in {said!r})"))
            r.consume(m.start(), m.end())
    for _, said in r.values.get("checkpointing_mode", []):
        r.put("gradient_checkpointing", True, said)


def _read_zero(r: _Reader) -> None:
    """DeepSpeed ZeRO and its stage (``zero_stage``; the planner refuses a stage it does not model); DeepSpeed named
    without a stage is an issue that asks for it."""
    r.scan("zero_stage", _ZERO_STAGES)
    for m in list(_DEEPSPEED.finditer(r.work)):
        if _MASK in m.group():
            continue
        said = r.text[m.start():m.end()]
        r.issues.append(ParseIssue(part="request", text=said, message=(
            f"{said!r} names no ZeRO stage: say 'deepspeed zero2' or 'deepspeed zero3' (Aegis plans those two)")))
        r.consume(m.start(), m.end())


def _read_settings(r: _Reader) -> None:
    ignored = [m for m in _IGNORED.finditer(r.work) if _MASK not in m.group()]
    for m in ignored:
        r.consume(m.start(), m.end())
    if ignored:
        said = ", ".join(repr(r.text[m.start():m.end()]) for m in ignored)
        r.notes.append(f"not used for planning: {said}")
    for part, pattern in _SETTINGS:
        for m in list(pattern.finditer(r.work)):
            if _MASK in m.group():
                continue
            said = r.text[m.start():m.end()]
            value, problem = _setting_value(part, m.group(1), said)
            if problem is not None:
                r.issues.append(ParseIssue(part=_issue_part(part), text=said, message=problem))
            else:
                r.put(part, value, said)
            r.consume(m.start(), m.end())


_SEQ_UNITS = {"": 1, "k": 1024, "m": 1024 * 1024, "tok": 1, "toks": 1, "token": 1, "tokens": 1}
_NUMBER_AT = re.compile(r"[-+]?\d+(?:\.\d+)?(?:e[+-]?\d+)?", re.ASCII)


def _num(x: float) -> str:
    """A number as a reader expects it: 16777216 and 0.5, not 1.67772e+07."""
    return f"{int(x)}" if float(x).is_integer() and abs(x) < 1e18 else f"{x:g}"


def _short(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _setting_value(part: str, raw: str, said: str) -> tuple[Any, str | None]:
    """The value of a numeric setting as typed ('-2', '4k', '1,024', '2.5', 'three'), or None and one line saying
    why it cannot be one (a unit the setting has not, a fraction of a count). Ranges are checked in `_settle`."""
    low, high, label = _BOUNDS[part]
    shown, said = _short(raw.strip()), _short(said)
    accepted = f"use {'a whole number' if part in _INTEGER_SETTINGS else 'a value'} from {_num(low)} to {_num(high)}"
    text = raw.strip().replace("\u2212", "-").replace(",", "")
    if text in _WORDS:
        return _WORDS[text], None
    m = _NUMBER_AT.match(text)
    if m is None:  # the patterns only capture numbers; this guards the promise never to raise
        return None, f"{label} {shown!r} in {said!r} is not a number: {accepted}"
    unit = text[m.end():].strip(" _-")
    value = float(m.group())
    if part == "seq_len" and unit in _SEQ_UNITS:
        value *= _SEQ_UNITS[unit]
        if unit in ("k", "m"):
            value = float(round(value))
    elif unit:
        units = " (tokens, or k = 1024 tokens: 4k)" if part == "seq_len" else ""
        return None, f"{label} {shown!r} in {said!r} has a unit {_short(unit, 12)!r} it cannot take{units}: {accepted}"
    if not math.isfinite(value) or abs(value) >= 1e18:
        return None, f"{label} {shown!r} in {said!r} is out of range: {accepted}"
    if part in _INTEGER_SETTINGS:
        if not value.is_integer():
            return None, f"{label} {shown} in {said!r} is not a whole number: {accepted}"
        return int(value), None
    return value, None


def _read_gpus(r: _Reader) -> None:
    table = _gpus()
    toks = _tokens(r.work)
    i = 0
    while i < len(toks):
        if toks[i][0] in _UNITS:
            i += 1
            continue
        hit = _match_at(r.work, toks, i, table, strict_letters=True)
        if hit is None:
            i += 1
            continue
        n, ids = hit
        start, end = toks[i][1], toks[i + n - 1][2]
        before = _COUNT_BEFORE.search(r.work, 0, start)
        after = _COUNT_AFTER.match(r.work, end)
        said_start = before.start() if before else start
        said_end = after.end() if after else end
        said = r.text[said_start:said_end]
        size = _GPU_MEMORY_AFTER.match(r.work, said_end)
        if size is not None and _MASK not in size.group() and len(ids) == 1:  # 'a100 100gb': no such A100
            problem = _memory_mismatch(next(iter(ids)), int(size.group(1)), r.text[start:size.end()].strip())
            said_end = size.end()
            if problem is not None:
                r.issues.append(problem)
                r.consume(said_start, said_end)
                i += n
                while i < len(toks) and toks[i][1] < said_end:
                    i += 1
                continue
        if len(ids) == 1:
            r.put("gpu", next(iter(ids)), said)
        else:
            r.issues.append(_ambiguous("gpu", r.text[start:end], sorted(ids), "`aegis gpus` lists all"))
        if before:
            r.put("gpu_count", _count(before.group(1)), said)
        if after and after.group(1):
            r.put("gpu_count", _count(after.group(1)), said)
        r.consume(said_start, said_end)
        i += n
        while i < len(toks) and toks[i][1] < said_end:
            i += 1
    for pattern in _COUNT_ONLY:
        for m in list(pattern.finditer(r.work)):
            if _MASK not in m.group():
                r.put("gpu_count", _count(m.group(1)), r.text[m.start():m.end()])
                r.consume(m.start(), m.end())


_GPU_MEMORY_AFTER = _rx(r"[\s,]*(\d{1,5})\s*(?:gb|gib|g)(?![a-z0-9])")
"""A memory size said after a GPU name ('a100 100gb'): it must be the named card's."""


def _memory_mismatch(gpu_id: str, gb: int, said: str) -> ParseIssue | None:
    """None when the catalog GPU ``gpu_id`` has ``gb`` GB of memory (GiB or GB), else the issue naming the cards."""
    from aegis.planning.hardware import find_gpu, list_gpus

    gpu = find_gpu(gpu_id)
    if gb in (round(gpu.memory_bytes / 2**30), round(gpu.memory_bytes / 1e9)):
        return None
    family = _key(gpu.id)[:2]
    close = [g.id for g in list_gpus() if _key(g.id)[:2] == family] or [gpu.id]
    sizes = ", ".join(f"{g} ({round(find_gpu(g).memory_bytes / 2**30)} GB)" for g in close)
    return ParseIssue(part="gpu", text=said, suggestions=tuple(close),
                      message=f"GPU {said!r}: the catalog has no such card ({sizes}); name one, `aegis gpus` lists all")


def _read_dataset_words(r: _Reader) -> None:
    for pattern in (_DATASET_WORD, _DATASET_ASSIGN):
        for m in list(pattern.finditer(r.work)):
            if _MASK in m.group() or m.group(1) in _STOP:
                continue
            r.put("dataset", r.text[m.start(1):m.end(1)], r.text[m.start():m.end()])
            r.consume(m.start(), m.end())


def _assign_items(r: _Reader) -> None:
    """Paths and Hub ids → model or dataset (see the module docstring)."""
    pending: list[tuple[str, int]] = []
    for kind, item, start in r.items:
        before = _lower(r.text[max(0, start - 40):start])
        data_cue = bool(_DATA_CUE.search(before))
        if kind == "model_path":
            r.put("model", item, item)
        elif kind in ("data_path", "dataset"):
            r.put("dataset", item, item)
        elif kind == "path":
            if _is_model_dir(item):
                r.put("model", item, item)
            elif data_cue or _exists(item):
                r.put("dataset", item, item)
            elif _MODEL_CUE.search(before) and not r.values.get("model"):
                r.put("model", item, item)
            else:
                pending.append((item, start))
        else:  # a Hub id
            found = _bundled_or_cached(item)
            if found is not None:
                r.put("model", found.weights_id, item)
                if found.note:
                    r.notes.append(found.note)
            elif data_cue:
                r.put("dataset", item, item)
            else:
                pending.append((item, start))
    for item, _ in pending:
        r.put("dataset" if r.values.get("model") else "model", item, item)


def _bundled_or_cached(repo_id: str) -> Any:
    """`aegis.models.resolve.match_model` of a Hub id when it is a bundled model or a cached model repo, else None
    (an id to fetch may as well be a dataset: the cues around it decide)."""
    from aegis.models.resolve import match_model

    try:
        found = match_model(repo_id)
    except AegisError:
        return None
    return found if found.source in ("catalog", "cache") else None


_ENGLISH_FAMILY_WORDS = frozenset({"command", "solar", "orion", "arctic", "sailor", "hermes", "aya", "grok", "mpt"})
"""Other-family words that are also English words: they name a model only glued to more ('command-r') or with a
number ('solar 10.7b'), not alone or before another word ('command line')."""


def _read_leftovers(r: _Reader) -> list[str]:
    """Unknown GPU- and model-like words become issues; returns the words that meant nothing."""
    toks = _tokens(r.work)
    runs: list[list[tuple[str, int, int]]] = []
    for tok in toks:
        glued = runs and r.work[runs[-1][-1][2]:tok[1]] in ("-", "_", ":", ".")  # 'yi:34b-chat-v1.5': one name
        if runs and _adjacent(r.work, runs[-1][-1], tok, False) and (glued or not ({tok[0], runs[-1][-1][0]} & _BREAK)):
            runs[-1].append(tok)
        else:
            runs.append([tok])
    unparsed: list[str] = []
    families = _family_words()
    lookups = 0
    for run in runs:
        words = [t for t, _, _ in run]
        lead = next((j for j, w in enumerate(words) if w in families or w in _other_families()), 0)
        spaced = lead and any(c.isspace() for c in r.work[run[lead - 1][2]:run[lead][1]])  # 'dolphin-mistral' stays
        if spaced and all(w.isalpha() and not _NAME_WORD.fullmatch(w) for w in words[:lead]):  # 'what about X':
            unparsed.extend(w for w in words[:lead] if w not in _STOP and len(w) > 1)  # the name starts at its family
            run, words = run[lead:], words[lead:]
        start, end = run[0][1], run[-1][2]
        said = r.text[start:end]
        sized = any(_SIZE.match(a) and b in ("b", "m") for a, b in zip(words, words[1:]))
        if words[0] in _ENGLISH_FAMILY_WORDS:  # 'command-r', 'solar-10.7b' name a model; 'command line' does not
            other = len(words) > 1 and (any(c.isdigit() for c in said) or not any(c.isspace() for c in said))
        else:  # 'falcon 40b', 'jamba' (alone when nothing else named a model)
            other = words[0] in _other_families() and (
                len(words) > 1 or (len(words[0]) >= 4 and not r.values.get("model")))
        family = any(w in families for w in words) or other
        cued = _GPU_CUE.search(r.work, max(0, start - 30), start) or _COUNT_CUE.search(r.work, max(0, start - 8), start)
        gpu_like = any(c.isdigit() for c in said) and cued is not None
        vendor = words[0] in _GPU_BRANDS
        nxt = r.work[end:end + 20].split()
        followed_by_unit = bool(nxt) and nxt[0].strip(",.;") in _UNITS
        if len(words) == 1 and words[0].isdigit() and re.match(r"\s*[x×*]", r.work[end:end + 3]):
            continue  # '2x <unknown>': the count of the GPU that follows
        longest = 2 * _NAME_TOKENS if words[0] in families or words[0] in _other_families() else _NAME_TOKENS
        if lookups >= _MAX_LOOKUPS or followed_by_unit or len(words) > longest:  # 'stablelm-3b-4e1t': 7 tokens
            unparsed.extend(w for w in words if w.isalpha() and w not in _STOP and len(w) > 1)
        elif family or (sized and not r.values.get("model")):
            lookups += 1
            _model_name(r, said)
        elif (gpu_like or vendor) and words[0] not in _STOP:
            lookups += 1
            _unknown_gpu(r, said)
        else:
            unparsed.extend(w for w in words if w.isalpha() and w not in _STOP and len(w) > 1)
    return unparsed


def _unknown_gpu(r: _Reader, said: str) -> None:
    from aegis.planning.hardware import find_gpu

    try:
        r.put("gpu", find_gpu(said).id, said)
    except AegisError as err:
        r.issues.append(ParseIssue(part="gpu", text=said, message=str(err), suggestions=_gpus().suggest(said)))


def _ambiguous(part: Part, said: str, ids: list[str], where: str) -> ParseIssue:
    return ParseIssue(
        part=part, text=said, suggestions=tuple(ids),
        message=f"{part} {said!r} is ambiguous: it could be {', '.join(ids)}; name one ({where})",
    )


# ------------------------------------------------------------------------------------------ results

_LABELS = {"model": "models", "gpu": "GPUs", "dataset": "datasets", "method": "methods", "optimizer": "optimizers",
           "precision": "precisions", "gradient_checkpointing": "gradient checkpointing settings",
           "lora_targets": "LoRA target sets", "trainer": "trainers", "transformers_version": "transformers versions",
           "kbit_prep": "k-bit preparation settings", "liger": "Liger settings", "checkpointing_mode": "checkpointing modes",
           "zero_stage": "DeepSpeed ZeRO stages", "sharding": "multi-GPU strategies"}


def _issue_part(part: str) -> Part:
    """The request field an issue names: the field itself, or "request" for the stack and accumulation."""
    return part if part in get_args(Part) else "request"  # type: ignore[return-value]


def _settle(r: _Reader) -> dict[str, Any]:
    """One value per field; contradictions and out-of-range numbers become issues."""
    out: dict[str, Any] = {}
    methods = {v for v, _ in r.values.get("method", [])}
    if "lora?" in methods:  # "lora" before one of its settings: LoRA, implied, unless another method is said
        if methods == {"lora?"}:
            r.implied.append("method")
        r.values["method"] = [("lora", said) if v == "lora?" else (v, said) for v, said in r.values["method"]
                              if v != "lora?" or methods == {"lora?"}]
        methods = {v for v, _ in r.values.get("method", [])}
    if methods == {"qlora", "lora"}:  # "qlora ... lora rank 64" names one method
        r.values["method"] = [x for x in r.values["method"] if x[0] == "qlora"]
    for part, found in r.values.items():
        distinct = list(dict.fromkeys(v for v, _ in found))
        said = " / ".join(dict.fromkeys(s for _, s in found))
        if part == "precision" and "bf16_mixed?" in distinct:  # bare 'mixed precision': bf16 unless fp16 is said
            rest = [v for v in distinct if v != "bf16_mixed?"]
            if not rest:
                r.notes.append("'mixed precision' read as bf16_mixed (fp32 master weights, bf16 compute)")
            distinct = ["bf16_mixed"] if rest in ([], ["bf16"], ["bf16_mixed"]) else rest if rest == ["fp16_mixed"] else ["mixed precision", *rest]
        if len(distinct) > 1:
            label = _LABELS.get(part, _BOUNDS.get(part, (0, 0, part))[2] + " values")
            listed = ", ".join(str(v) for v in distinct)
            r.issues.append(ParseIssue(
                part=_issue_part(part), text=said,
                message=f"the request names two {label} ({listed}) in {said!r}: keep one",
                suggestions=tuple(str(v) for v in distinct) if part in ("model", "gpu") else (),
            ))
            continue
        value = distinct[0]
        if part in _BOUNDS:
            low, high, label = _BOUNDS[part]
            said = _short(said)
            if part in _INTEGER_SETTINGS and not float(value).is_integer():
                r.issues.append(ParseIssue(
                    part=_issue_part(part), text=said,
                    message=f"{label} {_num(value)} in {said!r} is not a whole number: "
                            f"use one from {_num(low)} to {_num(high)}",
                ))
                continue
            if not low <= value <= high:
                whole = "a whole number" if part in _INTEGER_SETTINGS else "a value"
                r.issues.append(ParseIssue(
                    part=_issue_part(part), text=said,
                    message=f"{label} {_num(value)} in {said!r} is out of range: use {whole} from {_num(low)} to {_num(high)}",
                ))
                continue
        out[part] = value
    accum = out.pop("grad_accum", None)
    if accum is not None:
        if "micro_batch_size" in out and "effective_batch_size" not in out:
            out["effective_batch_size"] = out["micro_batch_size"] * accum
            r.notes.append(f"effective batch {out['effective_batch_size']} = micro batch {out['micro_batch_size']} x {accum} accumulation steps")
        elif "micro_batch_size" in out and out["micro_batch_size"] * accum != out["effective_batch_size"]:
            r.issues.append(ParseIssue(
                part="effective_batch_size", text=f"{accum} accumulation steps",
                message=(f"micro batch {out['micro_batch_size']} x {accum} accumulation steps is "
                         f"{out['micro_batch_size'] * accum}, not the effective batch {out['effective_batch_size']}: keep two of the three"),
            ))
            del out["effective_batch_size"]
        elif "micro_batch_size" not in out:
            r.notes.append(f"{accum} gradient accumulation steps ignored: give a micro batch size too (the solver picks accumulation)")
    return out


def parse_request_lenient(text: str) -> ParsedRequest:
    """Read what a free-text request says; never raises. Unknown or ambiguous parts are `issues`."""
    if not isinstance(text, str):
        text = str(text)
    if len(text) > MAX_REQUEST_CHARS:
        issue = ParseIssue(part="request", text=text[:40] + "…",
                           message=f"the request is {len(text)} characters long: say it in under {MAX_REQUEST_CHARS}")
        return ParsedRequest(request=PlanRequest(), issues=(issue,))
    r = _Reader(text=text, work=_lower(text))
    _read_items(r)
    _read_zero(r)
    r.scan("sharding", _SHARDING)
    r.scan("checkpointing_mode", _CKPT_MODES)
    r.scan("trainer", _TRAINERS)  # before the methods: "plain peft loop" is a trainer, a bare "peft" LoRA
    r.scan("method", _METHODS)
    r.scan("optimizer", _OPTIMIZERS)
    r.scan("precision", _PRECISIONS)
    _read_stack(r)
    r.scan("gradient_checkpointing", _CHECKPOINTING)
    r.scan("lora_targets", _TARGETS)
    _read_model(r)
    _read_settings(r)
    _read_gpus(r)
    _read_dataset_words(r)
    _assign_items(r)
    unparsed = _read_leftovers(r)
    fields = _settle(r)
    try:
        request = PlanRequest(**fields)
    except ValidationError as err:  # _settle keeps values in range; this guards the promise never to raise
        problem = err.errors()[0]
        issue = ParseIssue(part="request", text=text[:80], message=f"could not read the request: {problem['msg']}")
        return ParsedRequest(request=PlanRequest(), issues=(*r.issues, issue), notes=tuple(r.notes))
    return ParsedRequest(request=request, issues=tuple(r.issues), notes=tuple(r.notes), unparsed=tuple(unparsed),
                         implied=tuple(r.implied))


def parse_request(text: str) -> PlanRequest:
    """The `PlanRequest` a free-text request describes; RequestParseError naming each unknown/ambiguous part."""
    return parse_request_lenient(text).strict()
