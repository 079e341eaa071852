"""Reading datasets: every row of a file or a Hub dataset read, its format detected, each row checked
and turned into (role, content) turns or a raw text; the rows a run cannot train on, by line.

    from aegis.data.reading import read_rows
    rows = read_rows("./data/support.jsonl", sample_rows=1000)
    rows.format, rows.num_rows, rows.items[0], rows.problems

Sources: local JSONL / JSON (a list, or ``{"data": [...]}``) / CSV / Parquet read without the
``datasets`` library, and Hub dataset ids (or local dataset folders) through
``datasets.load_dataset`` (cached; offline-aware). Formats: alpaca (instruction/input/output),
sharegpt (conversations of from/value), messages (role/content), prompt_completion, text.
The bottom of the data layer: rendering (:mod:`aegis.data.render`), token statistics for plans
(:mod:`aegis.data.profile`) and training examples (:mod:`aegis.train.data`) read through it.
"""

from __future__ import annotations

import csv
import json
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Literal, Sequence

from aegis.errors import DatasetError, OfflineError

__all__ = [
    "iter_records",
    "read_rows",
    "row_item",
    "RowProblem",
    "RowIssue",
    "describe_problem",
    "problem_groups",
    "PROBLEM_ACTIONS",
    "detect_format",
    "to_conversation",
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
    in hand. Planning (:func:`aegis.data.profile.analyze_dataset`) and training
    (:func:`aegis.train.data.load_examples`) both read through :func:`read_rows`, so they count the same rows
    and cite the same lines."""

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
    """Path of a dataset bundled in ``aegis/data/examples`` (``support.jsonl``: ShareGPT support chats)."""
    from importlib import resources

    path = Path(str(resources.files("aegis.data").joinpath("examples", name)))
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


def iter_records(source: str) -> Iterator[dict[str, Any]]:
    """Every record of a dataset as it is stored, no format applied: a local .jsonl / .json / .csv / .parquet file,
    a local dataset folder or a Hub dataset id (through ``datasets.load_dataset``: its cache, offline-aware). The
    reader :func:`read_rows` builds on, for callers that take free text (the Forge's phase-1 corpus). Corrupt JSON
    lines raise :class:`~aegis.errors.DatasetError` naming the first."""
    table = _open(source, None)
    if table.corrupt:
        first = table.corrupt[0]
        raise DatasetError(f"{source} line {first.line} is not a JSON object ({first.reason}); one JSON object per line")
    for batch in table.batches():
        yield from batch


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
