"""Planner speed: cold CLI, cold import + estimate, warm in-process plan — measured side by side.

    python -m tools.bench.bench_plan [--runs 7]

Prints one table: median and best wall time of each, its goal, and median / goal (<= 1.00 meets it).
Subprocesses run with bytecode caching on (as an installed package has it; the first, unmeasured run
writes the .pyc files), whatever PYTHONDONTWRITEBYTECODE says in this shell.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import os
import time

ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
REQUEST = "qlora llama-3.1-8b on 3090"
IMPORT_ESTIMATE = (
    "import time; t=time.perf_counter(); import aegis; "
    "aegis.estimate_memory('llama-3.1-8b', method='qlora', micro_batch_size=4, seq_len=1024); "
    "print(time.perf_counter()-t)"
)

# What any pydantic program pays before its first model validates: the import, and the plugin scan of every
# installed distribution's entry points (pydantic runs it when it builds its first validator). Not Aegis's code:
# the row above minus this one is Aegis's share.
PYDANTIC_FLOOR = (
    "import time; t=time.perf_counter(); from pydantic import BaseModel\n"
    "class M(BaseModel):\n    x: int\n"
    "M(x=1); print(time.perf_counter()-t)"
)


DETECT = (
    "import aegis.planning.stack as s, time; t=time.perf_counter(); s.detect_stack(); print(time.perf_counter()-t)"
)


def _cold_detect() -> float:
    """Stack detection from package metadata in a fresh process (importlib.metadata included)."""
    out = subprocess.run([sys.executable, "-c", DETECT], check=True, capture_output=True, text=True, env=ENV).stdout
    return float(out)


def _pydantic_floor() -> float:
    out = subprocess.run([sys.executable, "-c", PYDANTIC_FLOOR], check=True, capture_output=True, text=True, env=ENV).stdout
    return float(out)


def _cold_cli() -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "aegis.cli", "plan", REQUEST], check=True, capture_output=True, env=ENV)
    return time.perf_counter() - start


def _cold_import_estimate() -> float:
    out = subprocess.run([sys.executable, "-c", IMPORT_ESTIMATE], check=True, capture_output=True, text=True, env=ENV).stdout
    return float(out)


def _warm_plan() -> float:
    import aegis

    start = time.perf_counter()
    aegis.plan(REQUEST)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args(argv)
    import aegis

    aegis.plan(REQUEST)  # warm caches for the in-process row
    cases = [
        (f"cold CLI: aegis plan \"{REQUEST}\"", _cold_cli, 0.5),  # issue 13 bars: 0.5 s cold, 30 ms in-process
        ("cold: import aegis + estimate_memory", _cold_import_estimate, 0.3),
        ("  of which pydantic alone (import + first validator)", _pydantic_floor, None),
        ("cold: stack detection (package metadata, part of plan)", _cold_detect, 0.020),
        (f"warm in-process: aegis.plan(\"{REQUEST}\")", _warm_plan, 0.030),
    ]
    print(f"{'case':<58} {'median s':>9} {'best s':>8} {'goal s':>7} {'median/goal':>12}")
    for name, fn, goal in cases:
        fn()  # warm-up: writes bytecode caches, fills the OS page cache
        times = [fn() for _ in range(args.runs)]
        med = statistics.median(times)
        if goal is None:
            print(f"{name:<58} {med:>9.3f} {min(times):>8.3f} {'-':>7} {'-':>12}")
        else:
            print(f"{name:<58} {med:>9.3f} {min(times):>8.3f} {goal:>7.3f} {med / goal:>12.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
