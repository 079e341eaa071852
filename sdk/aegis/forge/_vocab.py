"""The output vocabulary of a merge with ``tokenizer_source``, and every model's embedding rows for it, as mergekit builds them.

    vocab = build_vocab("union", base_key, keys, folders, vocab_sizes, labels)   # OutputVocab
    rows = remap_rows(arrays, keys, vocab.rows, base_key)                       # one (V_out, ...) array per model

mergekit (``mergekit/tokenizer/build.py`` and ``embed.py``) reads each model's tokenizer, builds the output
tokenizer (``base``: the base model's; ``union``: the base model's plus every other model's tokens it lacks; a
model: that model's), and gives each model, for each output token, the row of that token in its own
embedding and head. A model lacking a token gets a default row: the row of the one model that has it, else the
base model's row, else the mean of the rows of the models that have it (zeros if none has it). The output has one
row per output token, and ``vocab_size`` in the config becomes the output tokenizer's length.

A union keeps the base's ids and appends the tokens it lacks model by model (base first, then the YAML's order),
each model's in the order of its own ids. mergekit appends them in the iteration order of a Python set of models and
of ``get_vocab()``, a Rust hash map whose order changes from run to run, so its ids for appended tokens vary between
its own runs; every token still gets the same rows. Where mergekit's base tokenizer itself is a set's pick
(``tokenizer_source: base`` or ``union`` without a ``base_model`` over differing vocabularies), or a tokenizer has
tokens past its model's ``vocab_size`` (which mergekit strips for the base and trips over for the others), the merge
is refused with one line saying what to change.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from aegis.errors import InvalidConfigError

__all__ = ["OutputVocab", "build_vocab", "remap_rows"]


@dataclass(frozen=True)
class OutputVocab:
    """The output tokenizer and, per model key, the source row of each output token (-1: the model lacks it)."""

    tokenizer: Any
    size: int
    rows: dict[str, np.ndarray]
    identity: bool


def _load(folder: Path) -> Any:
    from transformers import AutoTokenizer

    # the tokenizer alone: a Cognate folder's config.json has an auto_map, which would otherwise prompt
    return AutoTokenizer.from_pretrained(str(folder), use_fast=True, trust_remote_code=False)


def build_vocab(
    source: str,
    base_key: str | None,
    keys: list[str],
    folders: dict[str, Path],
    vocab_sizes: dict[str, int],
    labels: dict[str, str],
    *,
    source_key: str | None = None,
) -> tuple[OutputVocab, list[str]]:
    """The output vocabulary for ``tokenizer_source`` ``source`` ('base', 'union' or a model, located as ``source_key``).

    ``keys`` are the merged models (the base among them when given), ``vocab_sizes`` their embedding rows.
    Returns the vocabulary and warnings (one line each).
    """
    warnings: list[str] = []
    toks: dict[str, Any] = {}
    for key in keys:
        try:
            toks[key] = _load(folders[key])
        except Exception as err:  # transformers raises OSError, ValueError, ... for a missing or broken tokenizer
            if key == base_key or base_key is None:
                raise InvalidConfigError(
                    f"tokenizer_source: cannot read the tokenizer of {labels[key]} ({type(err).__name__}); "
                    "tokenizer_source needs the base model's tokenizer files"
                ) from err
            warnings.append(f"{labels[key]} has no readable tokenizer; its vocabulary is taken to be the base model's (as mergekit does)")
    vocabs = {k: t.get_vocab() for k, t in toks.items()}
    for key, vocab in vocabs.items():
        past = [tok for tok, i in vocab.items() if i >= vocab_sizes[key]]
        if past:
            raise InvalidConfigError(
                f"tokenizer_source: the tokenizer of {labels[key]} has {len(past)} token(s) past its {vocab_sizes[key]} "
                f"embedding rows (e.g. {past[0]!r}); resize its embeddings to the tokenizer first"
            )
    differ = len({frozenset(v.items()) for v in vocabs.values()}) > 1
    if base_key is None and differ and source in ("base", "union"):
        raise InvalidConfigError(
            f"tokenizer_source: {source} without base_model over models whose vocabularies differ: mergekit picks the "
            "base tokenizer in set order; set base_model, or name the model whose tokenizer to use"
        )
    base = base_key if base_key is not None else keys[0]
    if source == "base":
        out = toks[base]
    elif source == "union":
        out = _union(base, toks, vocabs)
    else:
        assert source_key is not None
        out = toks[source_key] if source_key in toks else _source_tokenizer(folders[source_key], labels[source_key])
    out_vocab = out.get_vocab()
    ids = np.fromiter(out_vocab.values(), dtype=np.int64, count=len(out_vocab))
    if len(out_vocab) and (ids.min() < 0 or ids.max() >= len(out_vocab) or len(set(ids.tolist())) != len(ids)):
        raise InvalidConfigError(f"tokenizer_source: the output tokenizer's ids are not 0..{len(out_vocab) - 1}; pick another tokenizer_source")
    tokens = [""] * len(out_vocab)
    for tok, i in out_vocab.items():
        tokens[i] = tok
    rows: dict[str, np.ndarray] = {}
    for key in keys:
        vocab = vocabs.get(key, vocabs[base])
        rows[key] = np.array([vocab.get(tok, -1) for tok in tokens], dtype=np.int64)
    identity = all(
        len(r) == vocab_sizes[k] and np.array_equal(r, np.arange(len(r))) for k, r in rows.items()
    )
    return OutputVocab(tokenizer=out, size=len(out_vocab), rows=rows, identity=identity), warnings


def _source_tokenizer(folder: Path, label: str) -> Any:
    try:
        return _load(folder)
    except Exception as err:  # transformers raises OSError, ValueError, ... for a missing or broken tokenizer
        raise InvalidConfigError(f"tokenizer_source: cannot read the tokenizer of {label} ({type(err).__name__})") from err


def _union(base: str, toks: dict[str, Any], vocabs: dict[str, dict[str, int]]) -> Any:
    """mergekit's ``build_union_tokenizer``: the base tokenizer, plus the other models' tokens it lacks, in id order."""
    import tempfile

    from transformers import AutoTokenizer

    base_vocab = vocabs[base]
    out_vocab: dict[str, int] = {}
    added: dict[str, Any] = {}
    for key in [base, *(k for k in toks if k != base)]:
        tok = toks[key]
        decoder = tok.added_tokens_decoder
        added_names = {info.content for info in decoder.values()}
        for name in sorted(vocabs[key], key=vocabs[key].__getitem__):
            if name not in added_names:
                out_vocab.setdefault(name, len(out_vocab))
        for info in decoder.values():
            added.setdefault(info.content, info)
    with tempfile.TemporaryDirectory() as tmp:  # a fresh copy, as mergekit reloads the base tokenizer
        toks[base].save_pretrained(tmp)
        res = AutoTokenizer.from_pretrained(tmp, use_fast=True)
    for name in out_vocab:
        if name not in added and name not in base_vocab:
            res.add_tokens(name)
    for info in added.values():
        res.add_tokens(info)
    return res


def remap_rows(arrays: list[np.ndarray], keys: list[str], rows: dict[str, np.ndarray], base_key: str | None) -> list[np.ndarray]:
    """Each model's (V_out, ...) rows for the output tokens, with mergekit's default rows where a model lacks a token.

    ``arrays`` are the models' token-indexed tensors (vocabulary first), cast to one dtype.
    """
    perms = [rows[k] for k in keys]
    present = np.stack([p >= 0 for p in perms])  # (models, V_out)
    count = present.sum(axis=0)
    dtype = arrays[0].dtype
    size = len(perms[0])
    default = np.zeros((size, *arrays[0].shape[1:]), dtype=dtype)
    # one model has the token: its row; the base has it: the base's; several others: their mean; none: zeros
    missing = np.flatnonzero(~present.all(axis=0))
    base_i = keys.index(base_key) if base_key in keys else None
    donor = np.full(size, -1, dtype=np.int64)
    single = count == 1
    donor[single] = present[:, single].argmax(axis=0)
    if base_i is not None:
        use_base = (count > 1) & present[base_i]
        donor[use_base] = base_i
    for i, (arr, p) in enumerate(zip(arrays, perms, strict=True)):
        take = missing[donor[missing] == i]
        default[take] = arr[p[take]]
    average = missing[(donor[missing] < 0) & (count[missing] > 0)]
    if len(average):
        acc = np.zeros((len(average), *arrays[0].shape[1:]), dtype=dtype)
        for arr, p in zip(arrays, perms, strict=True):
            has = p[average] >= 0
            acc[has] = acc[has] + arr[p[average][has]]
        shape = (len(average),) + (1,) * (acc.ndim - 1)
        default[average] = acc / count[average].astype(dtype).reshape(shape)
    out = []
    for arr, p in zip(arrays, perms, strict=True):
        rows_out = default.copy()
        has = p >= 0
        rows_out[has] = arr[p[has]]
        out.append(rows_out)
    return out
