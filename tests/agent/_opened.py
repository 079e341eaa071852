"""Which files a block of code opens or lists: a `sys.addaudithook` hook (``open``, ``os.listdir``,
``os.scandir``) — it sees builtins.open, io.open, os.open and pathlib alike, even for root.

    with watch_opens("aegis-secret-") as opened:
        agent.reply("... with /tmp/aegis-secret-1/keys.jsonl")
    assert opened == []
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator

_EVENTS = frozenset({"open", "os.listdir", "os.scandir"})
_lock = threading.Lock()
_watches: list[tuple[tuple[str, ...], list[str]]] = []
_installed = False


def _hook(event: str, args: tuple) -> None:
    if event not in _EVENTS or not _watches or not args:
        return
    path = args[0]
    if not isinstance(path, (str, bytes, os.PathLike)):
        return
    try:
        text = os.fsdecode(path)
    except (TypeError, ValueError):
        return
    for fragments, seen in list(_watches):
        if any(f in text for f in fragments):
            seen.append(text)


@contextlib.contextmanager
def watch_opens(*fragments: str) -> Iterator[list[str]]:
    """Collect every path opened or listed, in any thread, whose text contains one of ``fragments``."""
    global _installed
    with _lock:
        if not _installed:
            sys.addaudithook(_hook)  # hooks cannot be removed: one, idle while nothing is watched
            _installed = True
    seen: list[str] = []
    entry = (fragments, seen)
    _watches.append(entry)
    try:
        yield seen
    finally:
        _watches.remove(entry)
