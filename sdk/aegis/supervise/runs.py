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
      lock                 held (flock) by the process running the run

    paths = open_run("runs", "demo-1")       # RunError listing known runs if unknown
"""

from __future__ import annotations

import contextlib
import difflib
import fcntl
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from aegis.errors import RunError

__all__ = ["RunPaths", "open_run", "list_runs", "run_lock", "is_live", "write_json_atomic"]


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


def is_live(paths: RunPaths) -> bool:
    """True while another process holds the run's lock (a run killed with -9 holds none)."""
    if not paths.lock.exists():
        return False
    with open(paths.lock, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
    return False


@contextlib.contextmanager
def run_lock(paths: RunPaths) -> Iterator[None]:
    """Hold the run's lock; RunError if another process is running it."""
    paths.root.mkdir(parents=True, exist_ok=True)
    f = open(paths.lock, "a+")
    try:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunError(
                f"run '{paths.run_id}' is being run by another process; use `aegis command {paths.run_id} ...` "
                "to steer it or `aegis status` to watch it"
            ) from None
        f.seek(0)
        f.truncate()
        f.write(str(os.getpid()))
        f.flush()
        yield
    finally:
        with contextlib.suppress(OSError):
            fcntl.flock(f, fcntl.LOCK_UN)
        f.close()


def write_json_atomic(path: Path, data: object) -> None:
    """Write JSON via a temporary file, fsync and rename, so readers never see half a file."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
