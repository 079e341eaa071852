"""A dataset as the model will see it: rows read by :mod:`aegis.data.reading`, rendered and tokenized by the
model's tokenizer (:mod:`aegis.data.tokenizers`, :mod:`aegis.data.render`), summarised as token statistics and a
sequence length. What a plan reports about its data (:class:`aegis.schema.DatasetProfile`).

    from aegis.data.profile import analyze_dataset
    profile = analyze_dataset("./data/support.jsonl", model="llama-3.1-8b")
    profile.tokens.p95, profile.seq_len, profile.seq_len_reason, profile.packing_efficiency

The statistics are pure functions of row lengths: ``token_stats`` (min / mean / percentiles),
``choose_seq_len`` (p95 rounded up to a multiple of 64, or the given one, with why), ``truncated_share``,
``padding_waste`` and ``packing_efficiency`` (greedy first-fit).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal, Sequence

from aegis.data.reading import PROBLEM_ACTIONS, RowProblem, problem_groups, read_rows
from aegis.errors import DatasetError
from aegis.schema import DataProblem, DatasetProfile, ModelProfile, TokenStats

__all__ = [
    "analyze_dataset",
    "token_stats",
    "choose_seq_len",
    "truncated_share",
    "padding_waste",
    "packing_efficiency",
    "SEQ_LEN_MULTIPLE",
]

SEQ_LEN_MULTIPLE = 64


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
    from aegis.data.tokenizers import load_tokenizer, resolve_profile

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
    from aegis.data.render import fit_to_seq_len, overlong_reason

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
