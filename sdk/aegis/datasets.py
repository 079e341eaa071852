"""Dataset analysis: read a dataset, detect its format, render rows through the model's chat
template, tokenize a seeded sample and summarise lengths at a sequence length.

    from aegis.datasets import analyze_dataset
    profile = analyze_dataset("./data/support.jsonl", model="llama-3.1-8b")
    profile.tokens.p95, profile.seq_len, profile.seq_len_reason, profile.packing_efficiency

Sources: local JSONL / JSON (a list, or ``{"data": [...]}``) / CSV / Parquet read without the
``datasets`` library, and Hub dataset ids (or local dataset folders) through
``datasets.load_dataset`` (cached; offline-aware). Formats: alpaca (instruction/input/output),
sharegpt (conversations of from/value), messages (role/content), prompt_completion, text.
Which tokenizer counts the tokens is decided in ``aegis._tokenizers`` and reported in the profile.
"""

from __future__ import annotations

import csv
import json
import math
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Literal, Sequence

from aegis.errors import DatasetError, OfflineError
from aegis.schema import DatasetProfile, ModelProfile, TokenStats

__all__ = [
    "analyze_dataset",
    "read_rows",
    "detect_format",
    "to_conversation",
    "token_stats",
    "choose_seq_len",
    "truncated_share",
    "padding_waste",
    "packing_efficiency",
    "FORMATS",
    "Rows",
    "example_dataset",
]

Format = Literal["alpaca", "sharegpt", "messages", "prompt_completion", "text"]

FORMATS: dict[str, str] = {
    "alpaca": "instruction, input (optional), output",
    "sharegpt": "conversations: [{from, value}]",
    "messages": "messages: [{role, content}]",
    "prompt_completion": "prompt, completion",
    "text": "text",
}
"""Accepted formats and the columns each needs."""

SEQ_LEN_MULTIPLE = 64
_LOCAL_SUFFIXES = {".jsonl", ".ndjson", ".json", ".csv", ".parquet", ".pq"}
_SHAREGPT_ROLES = {
    "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant",
    "bard": "assistant", "bing": "assistant", "model": "assistant", "system": "system",
    "tool": "tool", "function": "tool", "function_response": "tool", "observation": "tool", "ipython": "tool",
}


@dataclass
class Rows:
    """What a reader found: every row counted, the sampled ones in hand."""

    num_rows: int
    sample: list[dict[str, Any]]
    columns: tuple[str, ...]
    bad_lines: tuple[int, ...] = ()
    notes: list[str] = field(default_factory=list)
    sample_lines: tuple[int, ...] = ()  # JSON Lines: the 1-based line of each sampled row (errors cite it)


# ---------------------------------------------------------------------------------------- reading


def example_dataset(name: str = "support.jsonl") -> Path:
    """Path of a dataset bundled in ``aegis/examples`` (``support.jsonl``: ShareGPT support chats)."""
    from importlib import resources

    path = Path(str(resources.files("aegis").joinpath("examples", name)))
    if not path.is_file():
        have = sorted(p.name for p in path.parent.iterdir() if p.suffix in _LOCAL_SUFFIXES)
        raise DatasetError(f"no bundled example {name!r}; bundled: {', '.join(have)}")
    return path


def _sample_indices(n: int, k: int, seed: int) -> list[int]:
    return list(range(n)) if n <= k else sorted(random.Random(seed).sample(range(n), k))


def _columns(rows: Iterable[dict[str, Any]]) -> tuple[str, ...]:
    seen: dict[str, None] = {}
    for row in rows:
        seen.update(dict.fromkeys(row))
    return tuple(seen)


def _read_jsonl(path: Path, k: int, seed: int, on_bytes: Callable[[int], None] | None = None) -> Rows:
    rows: list[dict[str, Any]] = []
    lines: list[int] = []
    bad: list[int] = []
    done = 0
    with path.open("r", encoding="utf-8", errors="replace") as fh:
        for lineno, line in enumerate(fh, start=1):
            if on_bytes is not None:
                done += len(line)
                if lineno % 8192 == 0:
                    on_bytes(done)
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                bad.append(lineno)
                continue
            if isinstance(obj, dict):
                rows.append(obj)
                lines.append(lineno)
            else:
                bad.append(lineno)
    if not rows and bad:
        shown = ", ".join(map(str, bad[:10])) + (" …" if len(bad) > 10 else "")
        raise DatasetError(f"{path}: none of its {len(bad)} lines is a JSON object (bad lines {shown}); "
                           "each line must be one JSON object such as {\"text\": \"…\"}")
    picked = _sample_indices(len(rows), k, seed)
    sample = [rows[i] for i in picked]
    return Rows(len(rows), sample, _columns(sample), tuple(bad), sample_lines=tuple(lines[i] for i in picked))


def _read_json(path: Path, k: int, seed: int) -> Rows:
    try:
        data = json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except json.JSONDecodeError as err:
        if path.suffix == ".json" and "\n{" in path.read_text(encoding="utf-8", errors="replace")[:100_000]:
            return _read_jsonl(path, k, seed)  # JSON Lines saved as .json
        raise DatasetError(f"{path}: invalid JSON at line {err.lineno}, column {err.colno} ({err.msg}); "
                           "fix the file or save it as JSON Lines (one object per line)") from err
    if isinstance(data, dict):
        lists = [key for key, value in data.items() if isinstance(value, list)]
        key = "data" if "data" in lists else (lists[0] if len(lists) == 1 else None)
        if key is None:
            raise DatasetError(f"{path}: a JSON object must hold the rows under \"data\": {{\"data\": [{{…}}, …]}}; "
                               f"found keys {', '.join(map(str, data)) or '(none)'}")
        data = data[key]
    if not isinstance(data, list):
        raise DatasetError(f"{path}: expected a JSON list of row objects or {{\"data\": [...]}}")
    rows = [r for r in data if isinstance(r, dict)]
    notes = [f"{len(data) - len(rows)} list items are not JSON objects and were skipped"] if len(rows) < len(data) else []
    sample = [rows[i] for i in _sample_indices(len(rows), k, seed)]
    return Rows(len(rows), sample, _columns(sample), notes=notes)


def _read_csv(path: Path, k: int, seed: int) -> Rows:
    csv.field_size_limit(max(csv.field_size_limit(), 2**31 - 1))  # long chats exceed the 128 KiB default
    with path.open("r", encoding="utf-8", errors="replace", newline="") as fh:
        reader = csv.DictReader(fh)
        try:
            rows = [dict(r) for r in reader]
        except csv.Error as err:
            raise DatasetError(f"{path}: malformed CSV at line {reader.line_num} ({err}); fix the quoting "
                               "or save the data as JSON Lines") from err
        columns = tuple(reader.fieldnames or ())
    sample = [rows[i] for i in _sample_indices(len(rows), k, seed)]
    return Rows(len(rows), sample, columns)


def _read_parquet(path: Path, k: int, seed: int) -> Rows:
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except Exception as err:  # pyarrow raises ArrowInvalid / OSError for non-parquet bytes
        raise DatasetError(f"{path}: not a readable Parquet file ({err}); check the file or its extension") from err
    n = pf.metadata.num_rows
    table = pf.read()
    idx = _sample_indices(n, k, seed)
    sample = table.take(idx).to_pylist() if idx else []
    return Rows(n, sample, tuple(table.column_names))


def _looks_like_hub_id(source: str) -> bool:
    return bool(re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", source)) and Path(source).suffix not in _LOCAL_SUFFIXES


def _read_with_datasets(source: str, k: int, seed: int) -> Rows:
    """A Hub dataset id or a local dataset folder, through ``datasets.load_dataset`` (cached)."""
    import datasets
    from huggingface_hub import constants

    offline = constants.HF_HUB_OFFLINE or datasets.config.HF_HUB_OFFLINE
    try:
        loaded = datasets.load_dataset(source)
    except ConnectionError as err:
        raise OfflineError(
            f"dataset {source!r} is not in the local cache and the Hub is unreachable"
            f"{' (HF_HUB_OFFLINE=1)' if offline else ''}: run once with network access to cache it, "
            "or pass a local .jsonl/.json/.csv/.parquet file"
        ) from err
    except Exception as err:  # DatasetNotFoundError, DatasetGenerationError, ValueError …: one message
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise DatasetError(f"cannot load dataset {source!r} ({first}); check the Hub id or folder, "
                           "or pass a local .jsonl/.json/.csv/.parquet file") from err
    if isinstance(loaded, datasets.DatasetDict):
        split = "train" if "train" in loaded else next(iter(loaded))
        ds = loaded[split]
        notes = [f"split {split!r} of {', '.join(loaded)}"]
    else:
        ds, notes = loaded, []
    idx = _sample_indices(len(ds), k, seed)
    sample = ds.select(idx).to_list() if idx else []
    return Rows(len(ds), sample, tuple(ds.column_names), notes=notes)


def read_rows(source: str, *, sample_rows: int = 1000, seed: int = 0,
              on_bytes: Callable[[int], None] | None = None) -> Rows:
    """Count every row of a dataset and return a seeded sample of ``sample_rows`` of them.

    ``on_bytes`` (JSON Lines only) is called now and then with the characters read so far."""
    path = Path(source).expanduser()
    if path.is_dir():
        return _read_with_datasets(str(path), sample_rows, seed)
    if not path.exists():
        if _looks_like_hub_id(source):
            return _read_with_datasets(source, sample_rows, seed)
        raise DatasetError(f"no such file: {source} (looked in {Path.cwd()}); check the path, "
                           "or pass a Hub dataset id as org/name")
    if path.stat().st_size == 0 or not path.read_bytes()[:65536].strip():
        raise DatasetError(f"{source} is empty: it needs at least one row")
    suffix = path.suffix.lower()
    readers = {".jsonl": _read_jsonl, ".ndjson": _read_jsonl, ".json": _read_json, ".csv": _read_csv,
               ".parquet": _read_parquet, ".pq": _read_parquet}
    if suffix not in readers:
        raise DatasetError(f"{source}: unsupported file type {suffix or '(none)'}; "
                           "use .jsonl, .json, .csv or .parquet")
    if readers[suffix] is _read_jsonl:
        rows = _read_jsonl(path, sample_rows, seed, on_bytes)
    else:
        rows = readers[suffix](path, sample_rows, seed)
    if rows.num_rows == 0:
        raise DatasetError(f"{source} has no rows: it needs at least one")
    return rows


# ---------------------------------------------------------------------------------------- formats


def _as_list(value: Any) -> Any:
    """Conversation columns from CSV arrive as JSON strings."""
    if isinstance(value, str) and value.lstrip()[:1] == "[":
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def _turn_keys(rows: Sequence[dict[str, Any]], column: str) -> set[str]:
    keys: set[str] = set()
    for row in rows[:50]:
        turns = _as_list(row.get(column))
        if isinstance(turns, list):
            for turn in turns[:4]:
                if isinstance(turn, dict):
                    keys.update(turn)
    return keys


def detect_format(columns: Sequence[str], rows: Sequence[dict[str, Any]] = ()) -> tuple[Format, str | None]:
    """(format, conversation column) from the columns (and, for chat columns, the turn keys)."""
    cols = set(columns)
    for column in ("messages", "conversations", "conversation", "chat"):
        if column in cols:
            keys = _turn_keys(rows, column)
            if {"from", "value"} <= keys:
                return "sharegpt", column
            if {"role", "content"} <= keys:
                return "messages", column
    if {"instruction", "output"} <= cols:
        return "alpaca", None
    if {"prompt", "completion"} <= cols:
        return "prompt_completion", None
    if "text" in cols:
        return "text", None
    accepted = "; ".join(f"{name} ({need})" for name, need in FORMATS.items())
    found = ", ".join(columns) if columns else "(none)"
    raise DatasetError(f"cannot detect the dataset format: columns found: {found}. Accepted formats: {accepted}")


def _content(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # multimodal content parts: keep the text
        return "".join(p.get("text") or "" if isinstance(p, dict) else str(p) for p in value)
    return str(value)


def to_conversation(row: dict[str, Any], fmt: Format, column: str | None = None) -> list[tuple[str, str]] | str:
    """One row as (role, content) turns — or, for the text format, the text. ValueError when malformed."""
    if fmt == "text":
        text = row.get("text")
        if not isinstance(text, str):
            raise ValueError("'text' is not a string")
        return text
    if fmt == "alpaca":
        instruction, extra = _content(row.get("instruction")), _content(row.get("input"))
        user = f"{instruction}\n\n{extra}" if extra.strip() else instruction
        turns = [("user", user), ("assistant", _content(row.get("output")))]
        if isinstance(row.get("system"), str) and row["system"].strip():
            turns.insert(0, ("system", row["system"]))
        return turns
    if fmt == "prompt_completion":
        prompt, completion = _as_list(row.get("prompt")), _as_list(row.get("completion"))
        if isinstance(prompt, list) or isinstance(completion, list):  # conversational prompt/completion
            return [*_messages(prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]),
                    *_messages(completion if isinstance(completion, list) else
                               [{"role": "assistant", "content": completion}])]
        return [("user", _content(prompt)), ("assistant", _content(completion))]
    turns = _as_list(row.get(column or ""))
    if not isinstance(turns, list) or not turns:
        raise ValueError(f"{column!r} is not a non-empty list of turns")
    if fmt == "sharegpt":
        out = []
        for turn in turns:
            if not isinstance(turn, dict) or "value" not in turn:
                raise ValueError("a turn lacks 'from'/'value'")
            out.append((_SHAREGPT_ROLES.get(str(turn.get("from", "")).lower(), "user"), _content(turn["value"])))
        return out
    return _messages(turns)


def _messages(turns: list[Any]) -> list[tuple[str, str]]:
    out = []
    for turn in turns:
        if not isinstance(turn, dict) or "role" not in turn:
            raise ValueError("a message lacks 'role'/'content'")
        role = str(turn["role"]).lower()
        out.append((_SHAREGPT_ROLES.get(role, "user"), _content(turn.get("content"))))
    return out


# ------------------------------------------------------------------------------------- statistics


def _percentile(sorted_lengths: Sequence[int], q: float) -> int:
    """Value at rank ceil(q/100 * (n-1)): numpy's ``method="higher"``, always a real row length."""
    return sorted_lengths[math.ceil(q / 100 * (len(sorted_lengths) - 1))]


def token_stats(lengths: Sequence[int]) -> TokenStats:
    """min / mean / p50 / p95 / p99 / max of token lengths (percentiles: numpy ``method="higher"``)."""
    if not lengths:
        raise DatasetError("no rows to measure: the sample is empty")
    s = sorted(lengths)
    return TokenStats(min=s[0], mean=sum(s) / len(s), p50=_percentile(s, 50), p95=_percentile(s, 95),
                      p99=_percentile(s, 99), max=s[-1])


def _round_up(n: int, multiple: int = SEQ_LEN_MULTIPLE) -> int:
    return max(multiple, -(-n // multiple) * multiple)


def truncated_share(lengths: Sequence[int], seq_len: int) -> float:
    """Share of rows longer than ``seq_len`` (they lose tokens)."""
    return sum(1 for n in lengths if n > seq_len) / len(lengths)


def padding_waste(lengths: Sequence[int], seq_len: int) -> float:
    """Share of pad tokens when every row is padded (or truncated) to ``seq_len``."""
    return 1.0 - sum(min(n, seq_len) for n in lengths) / (len(lengths) * seq_len)


def packing_efficiency(lengths: Sequence[int], seq_len: int) -> float:
    """Share of real tokens when rows (truncated to ``seq_len``) are packed into ``seq_len`` blocks
    by greedy first-fit in sample order. First-fit runs on a max segment tree: O(n log n)."""
    items = [min(n, seq_len) for n in lengths if n > 0]
    if not items:
        return 0.0
    size = 1
    while size < len(items):
        size *= 2
    tree = [0] * (2 * size)  # max remaining capacity per subtree; leaves are bins, opened left to right
    opened = 0
    for item in items:
        if tree[1] >= item:
            node = 1
            while node < size:  # leftmost bin with room
                node = 2 * node if tree[2 * node] >= item else 2 * node + 1
        else:
            node = size + opened
            opened += 1
            tree[node] = seq_len
        tree[node] -= item
        node //= 2
        while node:
            tree[node] = max(tree[2 * node], tree[2 * node + 1])
            node //= 2
    return sum(items) / (opened * seq_len)


def choose_seq_len(stats: TokenStats, lengths: Sequence[int], *, given: int | None = None,
                   max_positions: int | None = None) -> tuple[int, str]:
    """(seq_len, reason): the given one, or p95 rounded up to a multiple of 64 (capped at the model's
    maximum), with why — what padding to the longest row instead would waste."""
    if given is not None:
        if given < 1:
            raise DatasetError(f"seq_len must be a positive number of tokens, got {given}")
        cut = truncated_share(lengths, given)
        reason = f"given ({given:,}); {cut:.0%} of sampled rows are longer and would be truncated"
        if max_positions is not None and given > max_positions:
            reason += f"; above the model's max_position_embeddings ({max_positions:,})"
        return given, reason
    seq_len = _round_up(stats.p95)
    capped = max_positions is not None and seq_len > max_positions
    if capped:
        seq_len = max_positions
        return seq_len, (f"p95 ({stats.p95:,}) capped at the model's max_position_embeddings ({max_positions:,}); "
                         f"{truncated_share(lengths, seq_len):.0%} of rows are truncated")
    if stats.max <= seq_len:
        return seq_len, (f"p95 ({stats.p95:,}) rounded up to a multiple of {SEQ_LEN_MULTIPLE}: "
                         f"covers every sampled row (max {stats.max:,})")
    at_max = _round_up(stats.max)
    if max_positions is not None:
        at_max = min(at_max, max_positions)
    waste = padding_waste(lengths, at_max)
    return seq_len, (f"p95 ({stats.p95:,}) chosen over max ({stats.max:,}): padding to max would waste "
                     f"{waste:.0%} of tokens; {truncated_share(lengths, seq_len):.0%} of rows are truncated "
                     f"at {seq_len:,}")


# --------------------------------------------------------------------------------------- analysis


def _progress(enabled: bool):
    if not enabled:
        return None
    from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(), TimeElapsedColumn(),
                    transient=True)


def analyze_dataset(
    source: str,
    *,
    model: str | ModelProfile | None = None,
    seq_len: int | None = None,
    sample_rows: int = 1000,
    seed: int = 0,
    progress: bool = False,
) -> DatasetProfile:
    """Profile a dataset as the model will see it: rendered through its chat template, tokenized.

    All rows are counted; a seeded sample of ``sample_rows`` is tokenized. ``seq_len`` defaults to
    the sample's p95 rounded up to a multiple of 64 (capped at the model's maximum). Raises
    ``DatasetError`` (unreadable, empty, unknown columns) or ``OfflineError`` (hub id, nothing cached).
    """
    from aegis._tokenizers import load_tokenizer, resolve_profile

    if sample_rows < 1:
        raise DatasetError(f"sample_rows must be at least 1, got {sample_rows}")
    bar = _progress(progress)
    if bar is not None:
        bar.start()
    try:
        if bar is not None:
            size = Path(source).stat().st_size if Path(source).is_file() else None
            reading = bar.add_task(f"Reading {source}", total=size)
        rows = read_rows(str(source), sample_rows=sample_rows, seed=seed,
                         on_bytes=None if bar is None else (lambda n: bar.update(reading, completed=n)))
        if bar is not None:
            bar.update(reading, total=1, completed=1)
        fmt, column = detect_format(rows.columns, rows.sample)
        items: list[Any] = []
        malformed = 0
        for row in rows.sample:
            try:
                items.append(to_conversation(row, fmt, column))
            except ValueError:
                malformed += 1
        if not items:
            raise DatasetError(f"{source}: none of the {len(rows.sample)} sampled rows is a valid {fmt} row "
                               f"({FORMATS[fmt]}); check the file")
        profile = resolve_profile(model)
        if bar is not None:
            loading = bar.add_task("Loading tokenizer", total=None)
        counter = load_tokenizer(profile)
        if bar is not None:
            bar.update(loading, total=1, completed=1)
            tokenizing = bar.add_task(f"Tokenizing {len(items):,} rows", total=len(items))
        full: list[int] = []
        content: list[int] = []
        batch = 256
        for start in range(0, len(items), batch):
            chunk = items[start:start + batch]
            f, c = counter.count_texts(chunk) if fmt == "text" else counter.count_conversations(chunk)
            full += f
            content += c
            if bar is not None:
                bar.advance(tokenizing, len(chunk))
    finally:
        if bar is not None:
            bar.stop()

    stats = token_stats(full)
    max_positions = profile.max_position_embeddings if isinstance(profile, ModelProfile) else None
    chosen, reason = choose_seq_len(stats, full, given=seq_len, max_positions=max_positions)
    notes = [*rows.notes]
    if len(items) < rows.num_rows:
        notes.append(f"statistics from a seeded sample of {len(rows.sample):,} of {rows.num_rows:,} rows (seed {seed})")
    if rows.bad_lines:
        shown = ", ".join(map(str, rows.bad_lines[:10])) + (" …" if len(rows.bad_lines) > 10 else "")
        notes.append(f"{len(rows.bad_lines)} lines are not valid JSON objects and were skipped (lines {shown})")
    if malformed:
        notes.append(f"{malformed} sampled rows do not fit the {fmt} format ({FORMATS[fmt]}) and were skipped")
    if fmt == "text":
        notes.append("raw text rows with begin/end-of-text tokens (no chat template)")
    elif fmt in ("alpaca", "prompt_completion"):
        notes.append(f"{fmt} rows rendered as a user turn and an assistant turn with {counter.template_name}")
    else:
        notes.append(f"rendered with {counter.template_name}")
    notes.extend(counter.notes)
    if counter.rejected:
        notes.append(f"{len(counter.rejected)} rows were not accepted by the chat template ({counter.rejected[0]}); "
                     "they were counted with a plain rendering of the same turns")
    return DatasetProfile(
        source=str(source),
        format=fmt,
        num_rows=rows.num_rows,
        sampled_rows=len(items),
        tokenizer=counter.name,
        tokenizer_exact=counter.exact,
        tokens=stats,
        template_overhead_tokens=sum(f - c for f, c in zip(full, content)) / len(full),
        seq_len=chosen,
        seq_len_reason=reason,
        truncated_share=truncated_share(full, chosen),
        padding_waste=padding_waste(full, chosen),
        packing_efficiency=packing_efficiency(full, chosen),
        bad_lines=rows.bad_lines,
        notes=tuple(notes),
        row_lengths=tuple(full),
    )

