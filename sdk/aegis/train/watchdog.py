"""Liveness of a multi-process run's processes: a lost process stops the others within seconds, with one line.

Every process of a run writes a small heartbeat file every second into the run's ``processes/`` folder (on the
shared file system the run's checkpoints already need) and reads the others'. A peer is lost when its heartbeat says
it failed, when its process is gone (same host: its pid no longer runs), or when its heartbeat is older than
:data:`STALE_S` (another host). The watchdog then prints ``error: <reason>`` and ends this process with
:data:`EXIT_PEER_LOST` — it does not wait in a collective that can no longer complete (gloo would wait for ever, JAX's
own heartbeat only after minutes).

    dog = Watchdog(run_root / "processes", process_id=1, num_processes=2, session=token).start()
    dog.note_step(12)              # shown in the reason the other processes print
    dog.exit(0)                    # a clean end: the others do not take this process's exit for a loss

Heartbeats of an earlier launch (a resume) carry another ``session`` and are ignored.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["Watchdog", "STALE_S", "EXIT_PEER_LOST", "CLEAN_EXITS", "current", "lost_peer"]

BEAT_S = 1.0
"""Seconds between heartbeats (and checks of the peers)."""
STALE_S = 30.0
"""A peer on another host whose heartbeat is this old is lost."""
NEVER_S = 120.0
"""A peer with no heartbeat of this launch this long after the watchdog started is lost."""
MEMORY_EVERY_S = 5.0
"""How often :meth:`Watchdog.note_step` samples the devices' memory."""
EXIT_PEER_LOST = 2
"""Exit status of a process ended because another was lost (the CLI's status for an error Aegis explains)."""
CLEAN_EXITS = (0, 3)
"""Exit statuses that end a process without ending the run's others: done, or paused for a human."""

_CURRENT: Watchdog | None = None


def current() -> Watchdog | None:
    """This process's started watchdog, or None in a one-process run."""
    return _CURRENT


def _pid_gone(pid: int) -> bool:
    """The process ``pid`` on this host no longer runs (or is a zombie waiting to be reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False
    return stat.rpartition(")")[2].split()[:1] == ["Z"]


class Watchdog(threading.Thread):
    """Writes this process's heartbeat and ends it (``os._exit``) when a peer is lost."""

    def __init__(self, folder: Path, process_id: int, num_processes: int, session: str, *,
                 resume_hint: str = "resume every process with the same command") -> None:
        super().__init__(name="aegis-watchdog", daemon=True)
        self.folder = Path(folder)
        self.process_id = process_id
        self.num_processes = num_processes
        self.session = session
        self.resume_hint = resume_hint
        self.started = time.time()
        self.host = socket.gethostname()
        self.step: int | None = None
        self.devices: list[dict[str, Any]] | None = None
        self._memory_at = -MEMORY_EVERY_S
        self._exit: tuple[int, str | None] | None = None
        self._lock = threading.Lock()
        self._stopped = threading.Event()

    # ------------------------------------------------------------------ this process

    def start(self) -> Watchdog:  # type: ignore[override]
        global _CURRENT
        self.folder.mkdir(parents=True, exist_ok=True)
        self._beat()
        super().start()
        _CURRENT = self
        return self

    def note_step(self, step: int, devices: Any = None) -> None:
        """The step this process has trained; ``devices``: a callable giving its devices' memory (sampled every
        :data:`MEMORY_EVERY_S`, in the caller's thread), for `aegis status`."""
        self.step = step
        now = time.monotonic()
        if devices is not None and now - self._memory_at >= MEMORY_EVERY_S:
            self._memory_at = now
            try:
                self.devices = devices()
            except Exception:  # memory is for display only
                self.devices = None

    def exit(self, code: int, reason: str | None = None) -> None:
        """Record how this process ends (before it exits): a clean code is not a loss for the others."""
        with self._lock:
            self._exit = (code, reason)
        self._beat()
        if code in CLEAN_EXITS:
            self._stopped.set()  # a finished process does not judge the others (they may finish a moment later)

    def _path(self, process_id: int) -> Path:
        return self.folder / f"{process_id}.json"

    def _beat(self) -> None:
        code, reason = self._exit if self._exit is not None else (None, None)
        record = {"pid": os.getpid(), "host": self.host, "session": self.session, "time": time.time(),
                  "step": self.step, "exit": code, "reason": reason, "devices": self.devices}
        path = self._path(self.process_id)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        try:
            tmp.write_text(json.dumps(record))
            os.replace(tmp, path)
        except OSError:
            pass  # a full or vanished folder: the peers see a stale heartbeat and say so

    # ------------------------------------------------------------------ the peers

    def lost(self) -> str | None:
        """Why a peer counts as lost now (one line), or None while all are alive."""
        now = time.time()
        for j in range(self.num_processes):
            if j == self.process_id:
                continue
            try:
                rec: dict[str, Any] = json.loads(self._path(j).read_text())
            except (OSError, ValueError):
                rec = {}
            who = f"process {j} of {self.num_processes}"
            if rec.get("session") != self.session:
                if now - self.started > NEVER_S:
                    return f"{who} never reported (no heartbeat in {self.folder} for {NEVER_S:.0f} s)"
                continue
            at = f" after step {rec['step']}" if rec.get("step") is not None else ""
            code = rec.get("exit")
            if code is not None:
                if code in CLEAN_EXITS:
                    continue
                return f"{who} failed{at}: {rec.get('reason') or f'exit status {code}'}"
            if rec.get("host") == self.host and _pid_gone(int(rec.get("pid", -1))):
                return f"{who} (pid {rec.get('pid')}) died{at} without a word (killed, or crashed)"
            age = now - float(rec.get("time", 0))
            if age > STALE_S:
                return f"{who} (host {rec.get('host')}) stopped responding{at} ({age:.0f} s since its last heartbeat)"
        return None

    def run(self) -> None:
        while not self._stopped.wait(BEAT_S):
            self._beat()
            reason = self.lost()
            if reason is not None and not self._stopped.is_set():
                self.die(reason)

    def die(self, reason: str) -> None:
        """End this process now with ``reason`` (no collective, no atexit: they could wait for the lost peer)."""
        at = f" at step {self.step}" if self.step is not None else ""
        line = f"{reason}; process {self.process_id} stops too{at} — {self.resume_hint}"
        with self._lock:
            self._exit = (EXIT_PEER_LOST, line)
        self._beat()
        try:
            sys.stdout.flush()
            sys.stderr.write(f"error: {line}\n")
            sys.stderr.flush()
        finally:
            os._exit(EXIT_PEER_LOST)


def lost_peer(wait_s: float = 5.0) -> str | None:
    """After an error in a multi-process run: why a peer is lost, if one is (waits up to ``wait_s`` for a dying
    peer's process to vanish), or None (a one-process run, or the error is this process's own)."""
    dog = _CURRENT
    if dog is None:
        return None
    deadline = time.monotonic() + wait_s
    while True:
        reason = dog.lost()
        if reason is not None or time.monotonic() >= deadline:
            return reason
        time.sleep(0.25)
