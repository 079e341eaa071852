"""Phase 1's data by category (local JSONL / JSON / CSV / Parquet files, local dataset folders, Hub dataset ids from the
``datasets`` cache), a tokenizer, and mixed batches of packed tokens.

    texts = read_categories({"math": ["gsm8k.jsonl"], ...})      # None: the bundled samples (forge/data/cognate)
    tok = train_tokenizer(texts, vocab_size=8192)                  # byte-level BPE trained on the data
    streams = encode_streams(texts, tok)                          # category -> one token stream (EOS-separated)
    batch = sample_batch(streams, {"math": .4, "qa": .6}, rng, batch=8, seq_len=256)

A row's text is its ``text`` field, else its string fields joined by newlines (``question``/``answer``,
``prompt``/``code``, ``goal``/``solution``...). The categories are the seed's: math, code, qa, commonsense, language.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

from aegis.errors import DatasetError

__all__ = ["CATEGORIES", "EOS", "bundled_files", "read_categories", "row_text", "train_tokenizer",
           "load_tokenizer", "encode_streams", "sample_batch"]

CATEGORIES = ("math", "code", "qa", "commonsense", "language")
EOS = "<|endoftext|>"


def bundled_files() -> dict[str, list[Path]]:
    """The small samples shipped with Aegis, one JSONL per category."""
    root = resources.files("aegis.forge").joinpath("data", "cognate")
    return {c: [Path(str(root.joinpath(f"{c}.jsonl")))] for c in CATEGORIES}


def row_text(row: Any) -> str:
    if isinstance(row, str):
        return row
    if isinstance(row, dict):
        if isinstance(row.get("text"), str):
            return row["text"]
        return "\n".join(str(v) for v in row.values() if isinstance(v, (str, int, float)) and str(v).strip())
    return ""


def _read(source: str | Path) -> list[str]:
    """The text rows of one source: a local .jsonl / .json / .csv / .parquet file, a local dataset folder or a Hub
    dataset id from the ``datasets`` cache (`aegis.data.reading.iter_records`, the one dataset reader)."""
    from aegis.data.reading import iter_records

    texts = [t for t in map(row_text, iter_records(str(source))) if t.strip()]
    if not texts:
        raise DatasetError(f"{source} holds no text rows (a 'text' field or string fields)")
    return texts


def _local_or_id(source: str) -> str:
    """``~/x.jsonl`` expanded; a Hub id (org/name, no such local path) as it is."""
    path = Path(source).expanduser()
    return str(path) if path.exists() or source.startswith(("~", "/", ".")) else source


def read_categories(files: dict[str, list[str | Path]] | None) -> dict[str, list[str]]:
    """Category -> texts; ``None`` reads the bundled samples."""
    files = bundled_files() if files is None else files
    out: dict[str, list[str]] = {}
    for cat, paths in files.items():
        if cat not in CATEGORIES:
            raise DatasetError(f"unknown data category {cat!r}; use {', '.join(CATEGORIES)}")
        out[cat] = [t for p in paths for t in _read(p if isinstance(p, Path) else _local_or_id(p))]
    return out


def train_tokenizer(texts: dict[str, list[str]], vocab_size: int) -> Any:
    """A byte-level BPE (``tokenizers``) trained on every text, wrapped as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator((t for ts in texts.values() for t in ts), trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, bos_token=EOS, pad_token=EOS)


def load_tokenizer(path: str | Path) -> Any:
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(Path(path).expanduser()), local_files_only=True)
    except Exception as err:  # noqa: BLE001
        raise DatasetError(f"cannot load the tokenizer at {path} ({type(err).__name__}); give a local tokenizer "
                           "folder, or leave `tokenizer` out to train one on the data") from None
    if tok.eos_token_id is None:
        raise DatasetError(f"tokenizer {path} has no EOS token; phase 1 separates documents with it")
    return tok


def encode_streams(texts: dict[str, list[str]], tok: Any) -> dict[str, Any]:
    """Category -> one int32 array of its texts' tokens, each followed by EOS."""
    import numpy as np

    out = {}
    for cat, ts in texts.items():
        ids: list[int] = []
        for t in ts:
            ids.extend(tok(t, add_special_tokens=False)["input_ids"])
            ids.append(tok.eos_token_id)
        out[cat] = np.asarray(ids, dtype=np.int32)
    return out


def sample_batch(streams: dict[str, Any], weights: dict[str, float], rng: Any, *, batch: int, seq_len: int) -> Any:
    """``batch`` windows of ``seq_len`` tokens; each row's category drawn by ``weights`` (renormalised over the
    categories present), its start uniform in that category's stream (short streams repeat)."""
    import numpy as np

    cats = [c for c, w in weights.items() if w > 0 and c in streams and len(streams[c])]
    if not cats:
        raise DatasetError(f"no data for the categories {sorted(weights)}; add files for one of them")
    p = np.asarray([weights[c] for c in cats], dtype=np.float64)
    rows = []
    for c in rng.choice(len(cats), size=batch, p=p / p.sum()):
        s = streams[cats[c]]
        if len(s) <= seq_len:
            s = np.tile(s, seq_len // len(s) + 2)
        start = int(rng.integers(0, len(s) - seq_len))
        rows.append(s[start:start + seq_len])
    return np.stack(rows)
