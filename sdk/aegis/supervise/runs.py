"""Run folders: where every file of a run lives, how runs are found by id, and the live-run lock.

::

    runs/<run_id>/
      config.json          the RunConfig the run was started with
      samples.json         every sample id of the dataset (commands validate ids against it)
      supervisor.sqlite    LangGraph checkpoints of the supervisor state
      events.jsonl         anomalies, diagnoses, repairs, commands (fsync'd)
      metrics.jsonl        one line per optimizer step
      inbox.jsonl          validated commands waiting to be applied
      checkpoints/         Orbax checkpoints (step folders)
      diagnoses/           one JSON report per diagnosis
      blacklist.json       blacklisted sample ids, exported for offline cleanup
      lock                 held (flock) by the process running the run: its pid, host and process
                           start time inside, its mtime a heartbeat touched every few seconds

    paths = open_run("runs", "demo-1")       # RunError listing known runs if unknown
    liveness(paths)                          # Liveness(live=False, owner=..., detail="process 4242 ... is gone")

Whether a run is live is the kernel's word where it can give it: the lock is an ``flock``, released
when its process dies (``kill -9`` included), so a recycled pid never looks alive. The owner's pid,
host and start time say who held it; a run on another host (a shared folder, where ``flock`` may
not reach) counts as live while its heartbeat is fresh.
"""

from __future__ import annotations

import contextlib
import difflib
import fcntl
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from aegis.errors import RunError

__all__ = [
    "RunPaths",
    "LockOwner",
    "Liveness",
    "open_run",
    "list_runs",
    "run_lock",
    "is_live",
    "liveness",
    "truncate_metrics",
    "write_json_atomic",
]

HEARTBEAT_S = 5.0
"""How often the running process touches its lock file."""
STALE_AFTER_S = 60.0
"""A heartbeat older than this means the owner on another host is gone."""


@dataclass(frozen=True)
class RunPaths:
    """The files of one run folder."""

    root: Path

    @property
    def run_id(self) -> str:
        return self.root.name

    @property
    def config(self) -> Path:
        return self.root / "config.json"

    @property
    def samples(self) -> Path:
        return self.root / "samples.json"

    @property
    def sqlite(self) -> Path:
        return self.root / "supervisor.sqlite"

    @property
    def events(self) -> Path:
        return self.root / "events.jsonl"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def inbox(self) -> Path:
        return self.root / "inbox.jsonl"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def diagnoses(self) -> Path:
        return self.root / "diagnoses"

    @property
    def blacklist(self) -> Path:
        return self.root / "blacklist.json"

    @property
    def lock(self) -> Path:
        return self.root / "lock"

    @property
    def source(self) -> Path:
        """The model and data the run trains: folder, Hub id, weights fingerprint, data counts."""
        return self.root / "source.json"

    @property
    def export(self) -> Path:
        """Where the finished run's PEFT adapter or HF model folder is written."""
        return self.root / "export"

    @property
    def logs(self) -> Path:
        """Metric loggers' files (TensorBoard events, MLflow store)."""
        return self.root / "logs"

    def exists(self) -> bool:
        return self.config.is_file()


def list_runs(runs_dir: str | Path) -> list[str]:
    """Ids of the runs in ``runs_dir`` (folders with a config.json), sorted."""
    d = Path(runs_dir)
    if not d.is_dir():
        return []
    return sorted(p.name for p in d.iterdir() if (p / "config.json").is_file())


def open_run(runs_dir: str | Path, run_id: str) -> RunPaths:
    """The folder of an existing run; RunError naming the known runs otherwise."""
    paths = RunPaths(Path(runs_dir) / run_id)
    if "/" in run_id or not run_id or not paths.exists():
        known = list_runs(runs_dir)
        close = difflib.get_close_matches(run_id, known, n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        listing = ", ".join(known[:10]) if known else "none yet; start one with `aegis run`"
        raise RunError(f"unknown run id '{run_id}' in {runs_dir}: {hint}known runs: {listing}")
    return paths


@dataclass(frozen=True)
class LockOwner:
    """Who holds (or last held) a run's lock: written into the lock file when it is taken."""

    pid: int
    host: str | None = None
    proc_start: str | None = None  # the kernel's start time of the process (guards against a recycled pid)
    started_at: float | None = None  # unix time the lock was taken
    heartbeat: float | None = None  # unix time of the last heartbeat (the lock file's mtime)

    def describe(self) -> str:
        where = f" on {self.host}" if self.host and self.host != socket.gethostname() else ""
        return f"process {self.pid}{where}"


@dataclass(frozen=True)
class Liveness:
    """Whether a process is running the run now, who it is or was, and why we think so."""

    live: bool
    owner: LockOwner | None = None
    detail: str | None = None  # why a run whose state says running is not live (None when live or never locked)


def _proc_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux ``/proc/<pid>/stat`` field 22); None elsewhere."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # the command name may hold spaces and parentheses
    return fields[19] if len(fields) > 19 else None


def _pid_alive(pid: int, proc_start: str | None) -> bool:
    """The process ``pid`` exists and, where the start time is known, is the same process."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    if proc_start is None:
        return True
    now = _proc_start(pid)
    return now is None or now == proc_start


def _read_owner(paths: RunPaths) -> LockOwner | None:
    try:
        text = paths.lock.read_text().strip()
        mtime = paths.lock.stat().st_mtime
    except OSError:
        return None
    try:
        raw = json.loads(text) if text else None
    except ValueError:
        return None
    if isinstance(raw, int):  # the lock of an older version: the pid alone
        return LockOwner(pid=raw, heartbeat=mtime)
    if not isinstance(raw, dict) or not isinstance(raw.get("pid"), int):
        return None
    return LockOwner(
        pid=raw["pid"], host=raw.get("host"), proc_start=raw.get("proc_start"), started_at=raw.get("started_at"),
        heartbeat=mtime,
    )


def _ago(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min ago"
    return f"{seconds / 3600:.1f} h ago"


def liveness(paths: RunPaths) -> Liveness:
    """Whether a process runs the run now: the lock is held (this host), or the owner on another host
    still beats. A run killed with -9 holds no lock; its owner's pid and last heartbeat say who died when."""
    if not paths.lock.exists():
        return Liveness(False)
    owner = _read_owner(paths)
    held: bool | None
    try:
        with open(paths.lock, "a+") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                held = True
            else:
                fcntl.flock(f, fcntl.LOCK_UN)
                held = False
    except OSError:  # a filesystem without flock
        held = None
    if owner is None:
        return Liveness(bool(held))
    here = owner.host is None or owner.host == socket.gethostname()
    age = time.time() - owner.heartbeat if owner.heartbeat is not None else None
    if here and held is not None:
        live = held
    elif here:
        live = _pid_alive(owner.pid, owner.proc_start)
    else:  # another host: its flock may not reach us, its heartbeat does
        live = bool(held) or (age is not None and age < STALE_AFTER_S)
    if live:
        return Liveness(True, owner)
    beat = f", last heartbeat {_ago(age)}" if age is not None else ""
    return Liveness(False, owner, f"{owner.describe()} that ran it is gone{beat}")


def is_live(paths: RunPaths) -> bool:
    """True while a process runs the run (a run killed with -9 holds no lock); see :func:`liveness`."""
    return liveness(paths).live


class _Heartbeat(threading.Thread):
    """Touches the lock file every ``HEARTBEAT_S`` while the run holds it."""

    def __init__(self, path: Path) -> None:
        super().__init__(name=f"aegis-heartbeat-{path.parent.name}", daemon=True)
        self.path = path
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(HEARTBEAT_S):
            with contextlib.suppress(OSError):
                os.utime(self.path)


@contextlib.contextmanager
def run_lock(paths: RunPaths) -> Iterator[None]:
    """Hold the run's lock (pid, host and start time inside, a heartbeat on its mtime); RunError if another
    process is running it."""
    paths.root.mkdir(parents=True, exist_ok=True)
    f = open(paths.lock, "a+")
    beat: _Heartbeat | None = None
    try:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunError(
                f"run '{paths.run_id}' is being run by another process; use `aegis command {paths.run_id} ...` "
                "to steer it or `aegis status` to watch it"
            ) from None
        pid = os.getpid()
        owner = {"pid": pid, "host": socket.gethostname(), "proc_start": _proc_start(pid), "started_at": time.time()}
        f.seek(0)
        f.truncate()
        f.write(json.dumps(owner))
        f.flush()
        beat = _Heartbeat(paths.lock)
        beat.start()
        yield
    finally:
        if beat is not None:
            beat.done.set()
        with contextlib.suppress(OSError):
            fcntl.flock(f, fcntl.LOCK_UN)
        f.close()


def truncate_metrics(paths: RunPaths, upto_step: int) -> int:
    """Drop the metrics lines of steps after ``upto_step`` (a future that a crash or a rollback discarded),
    so each step is logged once when training continues from ``upto_step``; returns how many were dropped.

    Cheap when there is nothing to drop: the log's steps only increase, so its last line decides."""
    path = paths.metrics
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return 0
    with open(path, "rb") as f:
        f.seek(max(0, size - 65536))
        tail = f.read().splitlines()
    last = None
    for raw in reversed(tail):
        try:
            rec = json.loads(raw)
        except ValueError:
            continue  # a torn last line (kill -9 mid-write) or the cut start of the window
        if isinstance(rec, dict) and isinstance(rec.get("step"), int):
            last = rec["step"]
            break
    if last is not None and last <= upto_step and tail and tail[-1].strip() and _is_json(tail[-1]):
        return 0
    kept, dropped = [], 0
    with open(path, "rb") as f:
        for raw in f:
            try:
                rec = json.loads(raw)
            except ValueError:
                continue
            if isinstance(rec, dict) and isinstance(rec.get("step"), int) and rec["step"] > upto_step:
                dropped += 1
                continue
            kept.append(raw if raw.endswith(b"\n") else raw + b"\n")
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "wb") as f:
        f.writelines(kept)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return dropped


def _is_json(raw: bytes) -> bool:
    try:
        json.loads(raw)
    except ValueError:
        return False
    return True


def write_json_atomic(path: Path, data: object) -> None:
    """Write JSON via a temporary file, fsync and rename, so readers never see half a file."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
