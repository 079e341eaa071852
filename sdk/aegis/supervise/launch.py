"""``aegis launch``: N local processes of one multi-process run, started, watched and ended together.

    aegis launch --nproc 2 --cpu-devices 2 -- run --config run.yaml --run-id r1
    aegis launch --nproc 2 --cpu-devices 2 -- resume --run-id r1     # after a crash: the same command

Each process runs ``aegis <args> --coordinator 127.0.0.1:PORT --num-processes N --process-id I`` (a free port is
picked unless ``--port``). Process 0's output is this command's; the others' error lines are shown prefixed with
their index. SIGINT and SIGTERM are passed on to every process. When a process fails, the others end within
seconds (their watchdog, :mod:`aegis.train.watchdog`), and ``launch`` exits non-zero with the failing process's
one-line reason. All processes paused for a human: exit 3, as ``aegis run``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aegis.errors import InvalidConfigError

__all__ = ["LaunchResult", "child_command", "launch", "mesh_lines"]

GRACE_S = 90.0
"""How long the other processes get to end on their own after one failed, before they are terminated."""
_OWN_FLAGS = ("--coordinator", "--num-processes", "--process-id")


@dataclass
class LaunchResult:
    """How the processes ended."""

    returncodes: list[int]
    failed: int | None = None
    """Index of the process that failed first (None when none failed)."""
    reason: str | None = None
    """Its one-line reason."""
    lines: dict[int, list[str]] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        if self.failed is not None:
            code = self.returncodes[self.failed]
            return code if code > 0 else 1
        return 3 if self.returncodes and all(c == 3 for c in self.returncodes) else 0


def child_command(args: Sequence[str], nproc: int, process_id: int, port: int) -> list[str]:
    """The command line of process ``process_id``."""
    return [sys.executable, "-c", "from aegis.cli import main; main()", *args,
            "--coordinator", f"127.0.0.1:{port}", "--num-processes", str(nproc), "--process-id", str(process_id)]


def _check_args(args: Sequence[str], nproc: int) -> None:
    if nproc < 1:
        raise InvalidConfigError(f"--nproc must be 1 or more, got {nproc}")
    if not args or args[0] not in ("run", "resume"):
        got = f"'{args[0]}'" if args else "nothing"
        raise InvalidConfigError(f"aegis launch starts `run` or `resume` processes, got {got}: "
                                 "e.g. `aegis launch --nproc 2 -- run --config run.yaml --run-id r1`")
    given = [a for a in args if a.split("=")[0] in _OWN_FLAGS]
    if given:
        raise InvalidConfigError(f"aegis launch sets {', '.join(_OWN_FLAGS)} itself; leave out {given[0]}")
    if "--run-id" not in args and not any(a.startswith("--run-id=") for a in args):
        raise InvalidConfigError("aegis launch needs --run-id (the same run folder for every process, and for a resume)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _why(code: int, last_error: str | None) -> str:
    if last_error:
        return last_error
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"killed by {name}"
    return f"exited with status {code}"


def launch(
    args: Sequence[str], nproc: int, *, port: int | None = None, cpu_devices: int | None = None,
    env: dict[str, str] | None = None, grace_s: float = GRACE_S, echo: bool = True,
) -> LaunchResult:
    """Start ``nproc`` processes of ``aegis <args>`` on this host and wait for all of them (see the module)."""
    _check_args(args, nproc)
    port = port or _free_port()
    base = dict(os.environ if env is None else env, PYTHONUNBUFFERED="1")
    if cpu_devices is not None:
        flags = [f for f in base.get("XLA_FLAGS", "").split() if "force_host_platform_device_count" not in f]
        base.update(JAX_PLATFORMS="cpu", XLA_FLAGS=" ".join([*flags, f"--xla_force_host_platform_device_count={cpu_devices}"]))
    procs: list[subprocess.Popen[str]] = []
    last_error: dict[int, str] = {}
    lines: dict[int, list[str]] = {i: [] for i in range(nproc)}

    def pump(i: int, stream: object) -> None:
        for line in stream:  # type: ignore[attr-defined]
            line = line.rstrip("\n")
            lines[i].append(line)
            if line.startswith("error: "):
                last_error[i] = line[len("error: "):]
            if echo:
                sys.stderr.write((line if i == 0 else f"[process {i}] {line}") + "\n")
                sys.stderr.flush()

    pumps = []
    for i in range(nproc):
        p = subprocess.Popen(
            child_command(args, nproc, i, port), env=base, text=True, start_new_session=True,
            stdout=None if (i == 0 and echo) else subprocess.DEVNULL, stderr=subprocess.PIPE,
        )
        procs.append(p)
        t = threading.Thread(target=pump, args=(i, p.stderr), daemon=True)
        t.start()
        pumps.append(t)

    def forward(signum: int, _frame: object) -> None:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    old = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            old[sig] = signal.signal(sig, forward)
    failed: int | None = None
    deadline: float | None = None
    try:
        while any(p.poll() is None for p in procs):
            if failed is None:
                bad = [i for i, p in enumerate(procs) if p.returncode is not None and p.returncode not in (0, 3)]
                if bad:
                    failed = min(bad, key=lambda i: (procs[i].returncode >= 0, i))  # a killed one first
                    deadline = time.monotonic() + grace_s
            if deadline is not None and time.monotonic() > deadline:
                for p in procs:
                    if p.poll() is None:
                        p.kill()
            time.sleep(0.1)
        if failed is None:
            bad = [i for i, p in enumerate(procs) if p.returncode not in (0, 3)]
            failed = min(bad, key=lambda i: (procs[i].returncode >= 0, i)) if bad else None
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for t in pumps:
            t.join(timeout=5)
    codes = [int(p.returncode) for p in procs]
    reason = None if failed is None else _why(codes[failed], last_error.get(failed))
    return LaunchResult(codes, failed, reason, lines)


def _mib(n: float) -> str:
    return f"{n / 2**20:,.1f} MiB" if n < 2**30 else f"{n / 2**30:,.2f} GiB"


def _process_line(i: int, rec: dict[str, Any], now: float, host: str) -> str:
    from aegis.train.watchdog import CLEAN_EXITS, STALE_S, _pid_gone

    where = f"pid {rec.get('pid')} on {rec.get('host')}"
    at = f", step {rec['step']}" if rec.get("step") is not None else ""
    code = rec.get("exit")
    if code is not None:
        state = ("finished" if code == 0 else "paused") if code in CLEAN_EXITS else f"failed: {rec.get('reason') or code}"
    elif rec.get("host") == host and _pid_gone(int(rec.get("pid", -1))):
        state = "gone (killed or crashed)"
    elif now - float(rec.get("time", 0)) > STALE_S:
        state = f"silent for {now - float(rec.get('time', 0)):.0f} s"
    else:
        state = "running"
    mem = ""
    devices = rec.get("devices") or []
    if devices:
        parts = []
        for d in devices:
            used = f"{_mib(d['bytes_in_use'])}"
            if d.get("peak_bytes"):
                used += f" (peak {_mib(d['peak_bytes'])}" + (f" of {_mib(d['limit_bytes'])})" if d.get("limit_bytes") else ")")
            parts.append(f"device {d['device']} {used}")
        mem = "; " + ", ".join(parts)
    return f"process {i}: {where} — {state}{at}{mem}"


def mesh_lines(run_dir: str | Path) -> list[str]:
    """What `aegis status` adds for a run on several devices or processes: its mesh, and each process of the last
    launch (alive or how it ended, its step, its devices' memory in use). Empty for a one-device run."""
    import socket
    import time

    from aegis.supervise.events import read_jsonl

    run = Path(run_dir)
    events = read_jsonl(run / "events.jsonl")
    mesh = next((e.get("data", {}) for e in reversed(events) if e.get("kind") == "mesh"), None)
    peak = next((e.get("data", {}) for e in reversed(events)
                 if e.get("kind") == "memory_check" and "compiled_peak_bytes" in e.get("data", {})), None)
    records: dict[int, dict[str, Any]] = {}
    folder = run / "processes"
    if folder.is_dir():
        for f in folder.glob("*.json"):
            try:
                records[int(f.stem)] = json.loads(f.read_text())
            except (ValueError, OSError):
                continue
    session = records.get(0, {}).get("session")
    records = {i: r for i, r in records.items() if r.get("session") == session}
    if not records and (mesh is None or int(mesh.get("devices", 1)) <= 1):
        return []
    out = []
    if mesh is not None:
        axes = " x ".join(f"{a} {mesh.get(a, 1)}" for a in ("data", "fsdp", "tensor"))
        out.append(f"mesh: {axes} = {mesh.get('devices')} devices over {max(len(records), 1)} process(es); "
                   f"global batch {mesh.get('global_batch_size')}")
    if peak is not None:
        out.append(f"compiled step peak: {_mib(int(peak['compiled_peak_bytes']))} per device")
    now, host = time.time(), socket.gethostname()
    out += [_process_line(i, records[i], now, host) for i in sorted(records)]
    return out
