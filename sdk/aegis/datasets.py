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
from typing import Any, Callable, Iterable, Iterator, Literal, Sequence

from aegis.errors import DatasetError, OfflineError
from aegis.schema import DataProblem, DatasetProfile, ModelProfile, TokenStats

__all__ = [
    "analyze_dataset",
    "read_rows",
    "row_item",
    "RowProblem",
    "RowIssue",
    "describe_problem",
    "problem_groups",
    "PROBLEM_ACTIONS",
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


ProblemKind = Literal["corrupt", "no_format", "empty", "no_assistant", "refused", "overlong", "truncated", "no_targets"]

PROBLEM_ACTIONS: dict[str, str] = {
    "corrupt": "skipped", "no_format": "skipped", "empty": "skipped", "no_assistant": "skipped",
    "refused": "skipped", "overlong": "dropped", "truncated": "truncated", "no_targets": "dropped",
}
"""What planning and training do with a row of each problem kind (``truncated`` rows are kept, cut)."""

SHOWN_LINES = 10
"""How many line numbers a message lists before "and K more"."""

DETECT_ROWS = 1000
"""Rows (a seeded sample) whose columns and turn keys decide the format, whatever the sample size."""


@dataclass(frozen=True)
class RowProblem:
    """One row a run skips, drops or truncates: where it is (a 1-based file line for JSON Lines and CSV,
    the row number otherwise), what kind of problem, and why."""

    line: int
    kind: ProblemKind
    reason: str = ""


class RowIssue(ValueError):
    """A row that cannot be trained on, and why (raised by :func:`row_item`)."""

    def __init__(self, kind: ProblemKind, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind


@dataclass
class Rows:
    """What the reader found: every row read and checked against the detected format, the sampled ones
    in hand. Planning (:func:`analyze_dataset`) and training (:func:`aegis.render.load_examples`) both
    read through :func:`read_rows`, so they count the same rows and cite the same lines."""

    num_rows: int  # rows that fit the format: what goes on to the tokenizer
    sample: list[dict[str, Any]]
    columns: tuple[str, ...]
    bad_lines: tuple[int, ...] = ()  # corrupt lines / rows (not JSON objects, unparseable CSV records)
    notes: list[str] = field(default_factory=list)
    sample_lines: tuple[int, ...] = ()  # the line (or row number) of each sampled row
    format: Format = "text"
    column: str | None = None
    items: list[Any] = field(default_factory=list)  # each sampled row as turns or a raw text (row_item)
    problems: list[RowProblem] = field(default_factory=list)  # every row skipped, in line order
    unit: Literal["line", "row"] = "line"
    records: int = 0  # rows parsed (JSON objects, CSV records), before the format check


def describe_problem(kind: str, count: int, lines: Sequence[int], *, unit: str = "line", reason: str = "",
                     fmt: str | None = None, of_sample: int | None = None, action: bool = True) -> str:
    """One line about rows of one problem kind: how many, what happens to them (``action``), where (the
    first ``SHOWN_LINES``, then "and K more"), and why the first one is a problem."""
    one = count == 1
    row = "row" if one else "rows"
    label = {
        "corrupt": f"corrupt {('line' if one else 'lines') if unit == 'line' else row}",
        "no_format": f"{row} without the {fmt or 'detected'} format's fields ({FORMATS.get(fmt or '', 'see FORMATS')})",
        "empty": f"empty {row}",
        "no_assistant": f"{row} without an assistant turn",
        "refused": f"{row} the chat template refused",
        "overlong": f"{row} longer than seq_len (overlong: drop)",
        "truncated": f"{row} longer than seq_len",
        "no_targets": f"{row} with no assistant token within seq_len",
    }[kind]
    shown = ", ".join(str(n) for n in lines[:SHOWN_LINES])
    more = count - min(len(lines), SHOWN_LINES)
    where = f"{unit}{'' if one else 's'} {shown}" + (f" and {more:,} more" if more > 0 else "")
    sample = f" (in {of_sample:,} tokenized rows)" if of_sample is not None else ""
    why = f" (first: {reason})" if reason else ""
    return f"{count:,} {label}{' ' + PROBLEM_ACTIONS[kind] if action else ''}{sample}: {where}{why}"


def problem_groups(problems: Iterable[RowProblem]) -> dict[str, list[RowProblem]]:
    """Problems by kind (in the order of ``PROBLEM_ACTIONS``), each in line order."""
    groups: dict[str, list[RowProblem]] = {}
    for p in problems:
        groups.setdefault(p.kind, []).append(p)
    return {k: sorted(groups[k], key=lambda p: p.line) for k in PROBLEM_ACTIONS if k in groups}


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


@dataclass
class _Table:
    """Parsed records of a source: their count, where each is, the corrupt ones, and two ways to read them."""

    n: int
    columns: tuple[str, ...] | None  # None: the union of the rows' keys (JSON)
    batches: Callable[[], Iterator[list[dict[str, Any]]]]  # every record, in order
    take: Callable[[list[int]], list[dict[str, Any]]]  # records by index
    lines: list[int] | None = None  # line of each record; None: record i is row i + 1
    unit: Literal["line", "row"] = "row"
    corrupt: list[RowProblem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def line(self, i: int) -> int:
        return self.lines[i] if self.lines is not None else i + 1


def _in_memory(rows: list[dict[str, Any]], **kw: Any) -> _Table:
    return _Table(len(rows), batches=lambda: iter([rows]), take=lambda idx: [rows[i] for i in idx], **kw)


def _read_jsonl(path: Path, on_bytes: Callable[[int], None] | None = None) -> _Table:
    rows: list[dict[str, Any]] = []
    lines: list[int] = []
    bad: list[RowProblem] = []
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
            except json.JSONDecodeError as err:
                why = ("the line ends before the JSON object does" if err.pos >= len(line.rstrip())
                       else f"{err.msg.removesuffix(' at')} at column {err.colno}")
                bad.append(RowProblem(lineno, "corrupt", f"invalid JSON: {why}"))
                continue
            if isinstance(obj, dict):
                rows.append(obj)
                lines.append(lineno)
            else:
                bad.append(RowProblem(lineno, "corrupt", f"a JSON {type(obj).__name__}, not an object"))
    if not rows and bad:
        shown = ", ".join(str(p.line) for p in bad[:10]) + (" …" if len(bad) > 10 else "")
        raise DatasetError(f"{path}: none of its {len(bad)} lines is a JSON object (bad lines {shown}); "
                           "each line must be one JSON object such as {\"text\": \"…\"}")
    return _in_memory(rows, columns=None, lines=lines, unit="line", corrupt=bad)


def _read_json(path: Path) -> _Table:
    try:
        data = json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except json.JSONDecodeError as err:
        if path.suffix == ".json" and "\n{" in path.read_text(encoding="utf-8", errors="replace")[:100_000]:
            return _read_jsonl(path)  # JSON Lines saved as .json
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
    numbers = [i for i, r in enumerate(data, start=1) if isinstance(r, dict)]
    bad = [RowProblem(i, "corrupt", f"a JSON {type(r).__name__}, not an object")
           for i, r in enumerate(data, start=1) if not isinstance(r, dict)]
    return _in_memory(rows, columns=None, lines=numbers, unit="row", corrupt=bad)


def _csv_records(lines: list[str]) -> Iterator[tuple[int, list[str] | None, str]]:
    """(first line, fields, why) per CSV record, the header first; fields is None for a record that
    cannot be trained on (the csv module cannot parse it, or its field count is not the header's). A bad
    record whose quotes ran on over several lines is reported at its first line and the lines after it
    are read again, so one stray quote does not swallow the rest of the file."""
    width: int | None = None
    pos = 0  # 0-based index of the line the current reader starts at
    while pos < len(lines):
        reader = csv.reader(lines[i] for i in range(pos, len(lines)))
        consumed = 0
        restart = None
        while True:
            first = pos + consumed + 1
            try:
                fields = next(reader)
            except StopIteration:
                break
            except csv.Error as err:
                yield first, None, f"unparseable CSV ({err})"
                restart = first
                break
            span, consumed = reader.line_num - consumed, reader.line_num
            if not fields:  # a blank line
                continue
            if width is None:
                width = len(fields)
                yield first, fields, ""
                continue
            if len(fields) < width or any(f.strip() for f in fields[width:]):  # trailing empty fields are fine
                why = f"{len(fields)} field{'s' if len(fields) != 1 else ''} where the header has {width}"
                if span > 1:
                    yield first, None, f"{why}; a quote left open ran over lines {first}-{first + span - 1}"
                    restart = first
                    break
                yield first, None, why
                continue
            if span > 1 and _rows_alone(lines[first:first + span - 1], width):
                yield first, None, (f"a quote left open at line {first} ran over lines {first + 1}-{first + span - 1}, "
                                    "which read as rows on their own")
                restart = first
                break
            yield first, fields[:width], ""
        if restart is None:
            return
        pos = restart


def _rows_alone(lines: list[str], width: int) -> bool:
    """Whether each of these lines is a whole CSV record of ``width`` fields on its own (balanced quotes):
    then the quote that joined them to the line before was a stray one, not a cell with line breaks, whose
    last line holds the closing quote."""
    for line in lines:
        if line.count('"') % 2:
            return False
        try:
            parsed = list(csv.reader([line], strict=True))
        except csv.Error:
            return False
        if len(parsed) != 1 or len(parsed[0]) < width or any(f.strip() for f in parsed[0][width:]):
            return False
    return True


def _read_csv(path: Path) -> _Table:
    csv.field_size_limit(max(csv.field_size_limit(), 2**31 - 1))  # long chats exceed the 128 KiB default
    with path.open("r", encoding="utf-8", errors="replace", newline="") as fh:
        lines = fh.readlines()
    header: list[str] | None = None
    rows: list[dict[str, Any]] = []
    numbers: list[int] = []
    bad: list[RowProblem] = []
    for first, fields, why in _csv_records(lines):
        if fields is None:
            bad.append(RowProblem(first, "corrupt", why))
        elif header is None:
            header = fields
        else:
            rows.append(dict(zip(header, fields)))
            numbers.append(first)
    return _in_memory(rows, columns=tuple(header or ()), lines=numbers, unit="line", corrupt=bad)


def _read_parquet(path: Path) -> _Table:
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except Exception as err:  # pyarrow raises ArrowInvalid / OSError for non-parquet bytes
        raise DatasetError(f"{path}: not a readable Parquet file ({err}); check the file or its extension") from err

    def batches() -> Iterator[list[dict[str, Any]]]:
        for batch in pf.iter_batches(batch_size=4096):
            yield batch.to_pylist()

    whole: list[Any] = []

    def take(idx: list[int]) -> list[dict[str, Any]]:
        if not idx:
            return []
        if not whole:
            whole.append(pf.read())
        return whole[0].take(idx).to_pylist()

    return _Table(pf.metadata.num_rows, tuple(pf.schema_arrow.names), batches, take)


def _looks_like_hub_id(source: str) -> bool:
    return bool(re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", source)) and Path(source).suffix not in _LOCAL_SUFFIXES


def _read_with_datasets(source: str) -> _Table:
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

    def batches() -> Iterator[list[dict[str, Any]]]:
        for start in range(0, len(ds), 4096):
            yield ds.select(range(start, min(start + 4096, len(ds)))).to_list()

    def take(idx: list[int]) -> list[dict[str, Any]]:
        return ds.select(idx).to_list() if idx else []

    return _Table(len(ds), tuple(ds.column_names), batches, take, notes=notes)


def _open(source: str, on_bytes: Callable[[int], None] | None) -> _Table:
    path = Path(source).expanduser()
    if path.is_dir():
        return _read_with_datasets(str(path))
    if not path.exists():
        if _looks_like_hub_id(source):
            return _read_with_datasets(source)
        raise DatasetError(f"no such file: {source} (looked in {Path.cwd()}); check the path, "
                           "or pass a Hub dataset id as org/name")
    if path.stat().st_size == 0 or not path.read_bytes()[:65536].strip():
        raise DatasetError(f"{source} is empty: it needs at least one row")
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson"):
        return _read_jsonl(path, on_bytes)
    readers = {".json": _read_json, ".csv": _read_csv, ".parquet": _read_parquet, ".pq": _read_parquet}
    if suffix not in readers:
        raise DatasetError(f"{source}: unsupported file type {suffix or '(none)'}; "
                           "use .jsonl, .json, .csv or .parquet")
    return readers[suffix](path)


def read_rows(source: str, *, sample_rows: int = 1000, seed: int = 0,
              on_bytes: Callable[[int], None] | None = None) -> Rows:
    """Read every row of a dataset, detect its format, check every row against it (:func:`row_item`),
    and return a seeded sample of ``sample_rows`` of the rows that fit, with the problems of the others.

    The one reader of rows: the planner samples it, training takes every row (``sample_rows=2**62``).
    The format is decided on a fixed seeded sample of ``DETECT_ROWS`` rows, so both detect the same one.
    ``on_bytes`` (JSON Lines only) is called now and then with the characters read so far."""
    table = _open(source, on_bytes)
    if table.n == 0:
        raise DatasetError(f"{source} has no rows: it needs at least one")
    probe = table.take(_sample_indices(table.n, DETECT_ROWS, 0))
    columns = table.columns if table.columns is not None else _columns(probe)
    fmt, column = detect_format(columns, probe)
    problems = list(table.corrupt)
    usable: list[int] = []
    i = 0
    for batch in table.batches():
        for row in batch:
            try:
                row_item(row, fmt, column)
                usable.append(i)
            except RowIssue as issue:
                problems.append(RowProblem(table.line(i), issue.kind, str(issue)))
            i += 1
    problems.sort(key=lambda p: p.line)
    if not usable:
        first = problems[0]
        raise DatasetError(f"{source}: none of its {table.n:,} rows is a valid {fmt} row ({FORMATS[fmt]}); "
                           f"{table.unit} {first.line}: {first.reason}")
    picked = [usable[j] for j in _sample_indices(len(usable), sample_rows, seed)]
    sample = table.take(picked)
    return Rows(
        num_rows=len(usable), sample=sample, columns=tuple(columns),
        bad_lines=tuple(p.line for p in table.corrupt), notes=list(table.notes),
        sample_lines=tuple(table.line(i) for i in picked), format=fmt, column=column,
        items=[row_item(row, fmt, column) for row in sample], problems=problems, unit=table.unit, records=table.n,
    )


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


_REQUIRED: dict[str, tuple[str, ...]] = {"alpaca": ("instruction", "output"), "prompt_completion": ("prompt", "completion")}


def _blank(value: Any) -> bool:
    return value is None or (isinstance(value, (str, list, dict)) and not (value.strip() if isinstance(value, str) else value))


def row_item(row: dict[str, Any], fmt: Format, column: str | None = None) -> Any:
    """A row as training sees it: (role, content) turns, or a raw text — a raw-text row in a chat file
    stays text. :class:`RowIssue` (a ValueError) says why a row cannot be trained on: it lacks the
    format's fields (``no_format``), it is empty (``empty``), or no assistant turn has text
    (``no_assistant``)."""
    if not row or all(_blank(v) for v in row.values()):
        raise RowIssue("empty", "no field has a value")
    if column is not None and isinstance(row.get("text"), str) and _blank(row.get(column)):
        item: Any = row["text"]  # a raw-text row in a mixed file
    else:
        missing = [key for key in _REQUIRED.get(fmt, ()) if key not in row]
        if missing:
            raise RowIssue("no_format", f"no {', '.join(map(repr, missing))} field")
        if column is not None and column not in row:
            raise RowIssue("no_format", f"no {column!r} field")
        if column is not None and _as_list(row.get(column)) == []:
            raise RowIssue("empty", f"{column!r} is an empty list")
        try:
            item = to_conversation(row, fmt, column)
        except ValueError as err:
            raise RowIssue("no_format", str(err)) from None
    if isinstance(item, str):
        if not item.strip():
            raise RowIssue("empty", "the text is empty")
        return item
    if not any(content.strip() for _, content in item):
        raise RowIssue("empty", "every turn is empty")
    if not any(role == "assistant" and content.strip() for role, content in item):
        raise RowIssue("no_assistant", "no assistant turn with text")
    return item


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


def _count(counter: Any, items: Sequence[Any]) -> tuple[list[int], list[int], dict[int, str]]:
    """Token counts of items (texts and chats mixed), and the positions the chat template refused."""
    full, content = [0] * len(items), [0] * len(items)
    refused: dict[int, str] = {}
    texts = [i for i, it in enumerate(items) if isinstance(it, str)]
    chats = [i for i, it in enumerate(items) if not isinstance(it, str)]
    for idx, count in ((texts, counter.count_texts), (chats, counter.count_conversations)):
        if not idx:
            continue
        f, c = count([items[i] for i in idx])
        for k, i in enumerate(idx):
            full[i], content[i] = f[k], c[k]
        if count == counter.count_conversations:
            refused.update({idx[k]: why for k, why in counter.refused})
    return full, content, refused


def _data_problems(problems: Sequence[RowProblem], unit: str, *, sampled: bool) -> list[DataProblem]:
    return [
        DataProblem(kind=kind, count=len(group), lines=tuple(p.line for p in group[:_STORED_LINES]), unit=unit,
                    action=PROBLEM_ACTIONS[kind], reason=group[0].reason, sampled=sampled and kind not in _READ_KINDS)
        for kind, group in problem_groups(problems).items()
    ]


_STORED_LINES = 100
_READ_KINDS = ("corrupt", "no_format", "empty", "no_assistant")  # found by the reader on every row


def analyze_dataset(
    source: str,
    *,
    model: str | ModelProfile | None = None,
    seq_len: int | None = None,
    sample_rows: int = 1000,
    seed: int = 0,
    progress: bool = False,
    chat_template: str | None = None,
    overlong: Literal["truncate", "drop"] = "truncate",
) -> DatasetProfile:
    """Profile a dataset as the model will see it: rendered through its chat template, tokenized.

    All rows are read and checked (corrupt lines, rows without the format's fields, empty rows, rows
    without an assistant turn: each counted and cited by line, as training counts them); a seeded sample
    of ``sample_rows`` of the rest is tokenized, where the rows the template refuses and the rows longer
    than ``seq_len`` (truncated, or dropped with ``overlong="drop"``) are found. ``seq_len`` defaults to
    the sample's p95 rounded up to a multiple of 64 (capped at the model's maximum). ``chat_template``
    (a .jinja path or the text), as the run config's ``chat_template:``, serves a tokenizer without one.
    Raises ``DatasetError`` (unreadable, empty, unknown columns, chats for a tokenizer without a chat
    template) or ``OfflineError`` (hub id, nothing cached).
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
        fmt, items, lines = rows.format, rows.items, rows.sample_lines
        profile = resolve_profile(model)
        if bar is not None:
            loading = bar.add_task("Loading tokenizer", total=None)
        counter = load_tokenizer(profile, chat_template=chat_template)
        if chat_template and getattr(counter, "renderer", None) is None:
            counter.notes = (*counter.notes, "the given chat_template renders with the model's own tokenizer, which "
                             f"is not available here: counts use {counter.template_name} (approximate)")
        if any(not isinstance(it, str) for it in items):
            counter.check_chats()  # a tokenizer without a chat template: the run's refusal, here
        if bar is not None:
            bar.update(loading, total=1, completed=1)
            tokenizing = bar.add_task(f"Tokenizing {len(items):,} rows", total=len(items))
        full: list[int] = []
        content: list[int] = []
        kept: list[int] = []  # positions in items of the rows the template accepted
        found: list[RowProblem] = []
        batch = 256
        for start in range(0, len(items), batch):
            f, c, refused = _count(counter, items[start:start + batch])
            for k in range(len(f)):
                if k in refused:
                    found.append(RowProblem(lines[start + k], "refused", refused[k]))
                    continue
                full.append(f[k])
                content.append(c[k])
                kept.append(start + k)
            if bar is not None:
                bar.advance(tokenizing, len(f))
    finally:
        if bar is not None:
            bar.stop()
    if not full:
        raise DatasetError(f"{source}: the chat template refused every sampled row ({found[0].reason}); "
                           "check the roles of the rows or give another `chat_template:`")

    stats = token_stats(full)
    max_positions = profile.max_position_embeddings if isinstance(profile, ModelProfile) else None
    chosen, reason = choose_seq_len(stats, full, given=seq_len, max_positions=max_positions)
    renderer = getattr(counter, "renderer", None)  # the run's own renderer: which truncated rows keep a target
    from aegis.render import fit_to_seq_len, overlong_reason

    for n, i in zip(full, kept):
        if n > chosen:
            ids, mask = renderer.render(items[i]) if renderer is not None else (list(range(n)), None)
            found += [RowProblem(lines[i], kind, overlong_reason(kind, n, chosen))
                      for kind in fit_to_seq_len(ids, mask, chosen, overlong)[2]]
    sampled = len(items) < rows.num_rows
    dropped = {p.line for p in found if PROBLEM_ACTIONS[p.kind] != "truncated"}
    usable = rows.num_rows - (round(len(dropped) * rows.num_rows / len(items)) if sampled else len(dropped))
    notes = [*rows.notes]
    if sampled:
        notes.append(f"statistics from a seeded sample of {len(items):,} of {rows.num_rows:,} rows (seed {seed}); "
                     "the rows refused or dropped after tokenizing are counted in that sample")
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
        num_rows=usable,
        sampled_rows=len(full),
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
        rows_read=rows.records + len(rows.bad_lines),
        problems=tuple(_data_problems([*rows.problems, *found], rows.unit, sampled=sampled)),
    )
