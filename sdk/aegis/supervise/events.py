"""Append-only JSONL logs of a run (events, metrics, command inbox), fsync'd line by line.

Each record is one ``write()`` of one line to a file opened with ``O_APPEND``, followed by
``fsync``, so two processes (the live run and `aegis command`) can append to the same log and a
``kill -9`` loses at most the line being written. Readers skip a torn last line.

    log = EventLog(run_dir / "events.jsonl")
    log.append("repair", step=120, strategy="blacklist", samples=["toy-17"])
    [e.kind for e in log.read()]
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import Field

from aegis.schema import Frozen

__all__ = ["Event", "EventLog", "append_jsonl", "read_jsonl"]


def append_jsonl(path: Path, record: dict[str, Any]) -> None:
    """Append one JSON line durably (single O_APPEND write, then fsync)."""
    line = (json.dumps(record, separators=(",", ":"), allow_nan=True) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        _heal_torn_tail(fd, path)
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


def _heal_torn_tail(fd: int, path: Path) -> None:
    """If a crash left a partial last line, end it so the next record starts on its own line."""
    size = os.fstat(fd).st_size
    if size == 0:
        return
    with open(path, "rb") as f:
        f.seek(size - 1)
        if f.read(1) != b"\n":
            os.write(fd, b"\n")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every complete, parseable line of a JSONL file (a torn or corrupt line is skipped)."""
    if not path.exists():
        return []
    out = []
    with open(path, "rb") as f:
        for raw in f:
            if not raw.endswith(b"\n"):
                break
            try:
                rec = json.loads(raw)
            except json.JSONDecodeError:
                continue
            if isinstance(rec, dict):
                out.append(rec)
    return out


class Event(Frozen):
    """One line of the event log."""

    time: float = Field(description="Unix time of the event.")
    kind: str = Field(description="anomaly, diagnosis, repair, command, rollback, checkpoint_corrupt, ...")
    step: int | None = Field(default=None, description="Training step it refers to.")
    data: dict[str, Any] = Field(default_factory=dict, description="Small details: ids, numbers, reasons.")


class EventLog:
    """The run's audit trail: anomalies, diagnoses, repairs, commands, rollbacks."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def append(self, kind: str, step: int | None = None, **data: Any) -> Event:
        event = Event(time=time.time(), kind=kind, step=step, data=data)
        append_jsonl(self.path, event.model_dump(mode="json"))
        return event

    def read(self) -> list[Event]:
        return [Event.model_validate(r) for r in read_jsonl(self.path)]

    def __iter__(self) -> Iterator[Event]:
        return iter(self.read())

    def kinds(self) -> list[str]:
        return [e.kind for e in self.read()]
