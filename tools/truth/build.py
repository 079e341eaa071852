"""Regenerate the memory truth table `tests/data/memory_truth.json` by fake-tensor tracing.

    python -m tools.truth.build                        # every row of tools/truth/grid.json not yet in the table
    python -m tools.truth.build --model llama-3.1-8b   # rows whose model id contains this (case-insensitive)
    python -m tools.truth.build --method qlora --max-priority 1 --jobs 2 --force

Each row is traced in its own fresh `python -m tools.truth.build --row` process (`--jobs` at
a time), and the table is rewritten after every finished row, so an interrupted build keeps
what it has. Rows are keyed by
model and setup; `--force` retraces rows already present.

A grid row pinned to a transformers version (`"transformers": "4.48.1"`) other than the one
installed here runs in that version's venv: `$AEGIS_TRUTH_VENVS/tf<major>/bin/python`
(default `/work/venvs/tf4/bin/python`; set up as tools/truth/__init__.py says), or the
interpreter given with `--python 4.48.1=/path/to/python`. The worker refuses to trace under
any other version, and the row records the version it ran under (`transformers_version`).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import subprocess
import time
from importlib import metadata, resources
from pathlib import Path
from typing import Any

from tools.truth.setup import TraceSetup

REPO = Path(__file__).resolve().parents[2]
TABLE = REPO / "tests" / "data" / "memory_truth.json"
GRID = Path(__file__).with_name("grid.json")
VENVS = Path(os.environ.get("AEGIS_TRUTH_VENVS", "/work/venvs"))
HOW = "fake-tensor trace (FakeTensorMode, fake CPU device), live storage bytes rounded up to 512 B, 2 training steps"
STEP = (
    "HF Trainer defaults: forward with labels= (model's own loss), backward, clip_grad_norm_(1.0, foreach), "
    "AdamW(lr 5e-5, wd 0, 2 param groups) step, zero_grad(set_to_none=True); unpadded batch (attention_mask of ones)"
)


REFERENCE = "reference/"
"""Model ids of reference configs (`tools/truth/configs/<name>.json`): a family with no released config available
offline, traced at the widths its transformers configuration class defaults to (grid.json gives each its source)."""


def config_path(model_id: str) -> Path:
    """The bundled config.json copy for a Hub id (`org/name` -> `org--name.json`), or a reference config's file."""
    if model_id.startswith(REFERENCE):
        return Path(__file__).with_name("configs") / (model_id[len(REFERENCE):] + ".json")
    root = resources.files("aegis.models.catalog") / "models"
    return Path(str(root / (model_id.replace("/", "--") + ".json")))


def row_key(model_id: str, setup: TraceSetup) -> str:
    """A stable identity for a (model, setup) row (stack fields appear only when not the default)."""
    lora = f"|r{setup.lora_rank}a{setup.lora_alpha}|{','.join(setup.lora_targets)}" if setup.method != "full" else ""
    stack = "".join(
        part
        for part, on in (
            (f"|drop{setup.lora_dropout:g}", setup.lora_dropout > 0),
            ("|nokbit", not setup.kbit_prep),
            ("|reentrant", setup.gradient_checkpointing and setup.checkpointing == "reentrant"),
            (f"|{setup.trainer}", setup.trainer != "hf"),
            (f"|tf{setup.transformers}", setup.transformers is not None),
        )
        if on
    )
    return (
        f"{model_id}|{setup.method}|{setup.precision}|{setup.optimizer}|b{setup.micro_batch_size}|s{setup.seq_len}"
        f"|gc{int(setup.gradient_checkpointing)}|{setup.attention}{lora}{'|autocast' if setup.autocast else ''}{stack}"
    )


def python_for(version: str | None, overrides: dict[str, str] | None = None) -> str:
    """The interpreter that traces a row pinned to transformers ``version``: this one when it has that
    version (or the row is not pinned), else ``overrides[version]``, else the venv of its major."""
    if version is None or version == metadata.version("transformers"):
        return sys.executable
    if overrides and version in overrides:
        return overrides[version]
    python = VENVS / f"tf{version.split('.')[0]}" / "bin" / "python"
    if not python.exists():
        raise SystemExit(
            f"no interpreter for transformers {version}: create {python.parent.parent} as tools/truth/__init__.py "
            f"says, or pass --python {version}=/path/to/python"
        )
    return str(python)


def versions() -> dict[str, str]:
    """Versions of the libraries whose behaviour the trace records."""
    import bitsandbytes
    import peft
    import torch
    import transformers

    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "peft": peft.__version__,
        "bitsandbytes": bitsandbytes.__version__,
        "python": sys.version.split()[0],
    }


def grid_rows() -> list[tuple[int, str, TraceSetup]]:
    """(priority, model id, setup) for every row of the grid file."""
    data = json.loads(GRID.read_text(encoding="utf-8"))
    out = []
    for entry in data["models"]:
        for row in entry["rows"]:
            out.append((entry["priority"], entry["model"], TraceSetup(**row)))
    return out


def trace_row(model_id: str, setup_json: str) -> dict[str, Any]:
    """Trace one row (runs in a worker process) and return its table entry."""
    import warnings

    from tools.truth.trace import trace_training

    warnings.filterwarnings("ignore")
    setup = TraceSetup.model_validate_json(setup_json)
    path = config_path(model_id)
    result = trace_training(str(path), setup)
    lora = setup.method != "full"
    row: dict[str, Any] = {
        "key": row_key(model_id, setup),
        "model_id": model_id,
        "config_file": path.name,
        "method": setup.method,
        "precision": setup.precision if setup.method == "full" else "bf16",
        "optimizer": setup.optimizer,
        "micro_batch_size": setup.micro_batch_size,
        "seq_len": setup.seq_len,
        "gradient_checkpointing": setup.gradient_checkpointing,
        "attention": setup.attention,
        "autocast": setup.autocast or (setup.method == "full" and setup.precision == "bf16_mixed"),
        "lora_rank": setup.lora_rank if lora else None,
        "lora_alpha": setup.lora_alpha if lora else None,
        "lora_targets": list(setup.lora_targets) if lora else None,
        "lora_dropout": setup.lora_dropout if lora else None,
        "kbit_prep": setup.kbit_prep,
        "checkpointing": setup.checkpointing,
        "trainer": setup.trainer,
        "transformers_pinned": setup.transformers,
        "lora_adapter_dtype": "float32" if lora else None,
        "max_grad_norm": setup.max_grad_norm,
        "steps": setup.steps,
    }
    row.update(result.model_dump())
    row["trace_seconds"] = row.pop("seconds")
    row["peak_gib"] = round(result.peak_bytes / 2**30, 4)
    row["how"] = HOW
    row["step"] = STEP
    row["versions"] = versions()
    row["date"] = dt.date.today().isoformat()
    return row


def load_table(path: Path = TABLE) -> dict[str, Any]:
    """The table file, or an empty table."""
    if path.exists():
        return json.loads(path.read_text(encoding="utf-8"))
    return {"description": "", "rows": []}


def write_table(rows: list[dict[str, Any]], path: Path = TABLE) -> None:
    """Write rows (sorted by model, method, size) atomically."""
    order = {"full": 0, "lora": 1, "qlora": 2}
    for r in rows:  # rows traced before the autocast option existed ran without it, except bf16_mixed
        r.setdefault("autocast", r["method"] == "full" and r["precision"] == "bf16_mixed")
    for r in rows:  # rows traced before stack profiles: HF Trainer, k-bit prep, non-reentrant, transformers 5.23
        r.setdefault("transformers_version", r.get("versions", {}).get("transformers", "5.23.0"))
        r.setdefault("kbit_prep", True)
        r.setdefault("checkpointing", "non_reentrant")
        r.setdefault("trainer", "hf")
    rows = sorted(
        rows,
        key=lambda r: (
            r["model_id"],
            order[r["method"]],
            r["precision"],
            r["micro_batch_size"] * r["seq_len"],
            r["seq_len"],
            r["gradient_checkpointing"],
            r["attention"],
            r["optimizer"],
            r["transformers_version"],
            r["trainer"],
            r["checkpointing"],
            r.get("lora_dropout") or 0.0,
            not r["kbit_prep"],
        ),
    )
    table = {
        "description": (
            "Ground-truth peak tensor memory of HF-Trainer-style fine-tuning steps at real model sizes, "
            "traced by tools/truth (see tools/truth/trace.py). Bytes are live tensor storages rounded up to "
            "512 B as the CUDA caching allocator counts them (torch.cuda.max_memory_allocated-like); no CUDA "
            "context, cuBLAS workspace, kernel-internal scratch or fragmentation. Regenerate with "
            "`python -m tools.truth.build`; print with `python -m tools.truth.show`."
        ),
        "how": HOW,
        "step": STEP,
        "rows": rows,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(table, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.truth.build", description=__doc__.split("\n")[0])
    parser.add_argument("--model", action="append", default=[], help="model id substring (repeatable)")
    parser.add_argument("--method", choices=["full", "lora", "qlora"], action="append", default=[])
    parser.add_argument("--max-priority", type=int, default=99, help="only grid rows with priority <= this")
    parser.add_argument("--min-priority", type=int, default=0, help="only grid rows with priority >= this")
    parser.add_argument("--match", action="append", default=[], help="row key substring, e.g. drop0.1 (repeatable)")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes")
    parser.add_argument("--force", action="store_true", help="retrace rows already in the table")
    parser.add_argument("--limit", type=int, default=0, help="trace at most this many rows")
    parser.add_argument("--dry-run", action="store_true", help="list the rows that would be traced")
    parser.add_argument(
        "--python", action="append", default=[], metavar="VERSION=PATH",
        help="interpreter for rows pinned to this transformers version (default: $AEGIS_TRUTH_VENVS/tf<major>)",
    )
    parser.add_argument("--row", nargs=2, metavar=("MODEL_ID", "SETUP_JSON"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.row:
        print(json.dumps(trace_row(args.row[0], args.row[1])), flush=True)
        return 0

    table = load_table()
    rows = {r["key"]: r for r in table["rows"]}
    todo = []
    for priority, model_id, setup in sorted(grid_rows(), key=lambda x: x[0]):
        if priority > args.max_priority or priority < args.min_priority:
            continue
        if args.model and not any(m.lower() in model_id.lower() for m in args.model):
            continue
        if args.method and setup.method not in args.method:
            continue
        if args.match and not any(m in row_key(model_id, setup) for m in args.match):
            continue
        if row_key(model_id, setup) in rows and not args.force:
            continue
        todo.append((model_id, setup))
    if args.limit:
        todo = todo[: args.limit]
    overrides = dict(item.split("=", 1) for item in args.python)
    pythons = {setup.transformers: python_for(setup.transformers, overrides) for _, setup in todo}
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "sdk"), str(REPO), os.environ.get("PYTHONPATH", "")]))
    for model_id, setup in todo:
        print("todo", row_key(model_id, setup), flush=True)
    if args.dry_run or not todo:
        return 0

    failures = 0
    pending = list(todo)
    running: list[tuple[subprocess.Popen, str, str]] = []
    while pending or running:
        while pending and len(running) < args.jobs:
            model_id, setup = pending.pop(0)
            if not args.force and row_key(model_id, setup) in {r["key"] for r in load_table()["rows"]}:
                continue  # traced by another build meanwhile
            python = pythons[setup.transformers]
            cmd = [python, "-m", "tools.truth.build", "--row", model_id, setup.model_dump_json(exclude_defaults=True)]
            proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            running.append((proc, model_id, row_key(model_id, setup)))
        time.sleep(0.5)
        for item in list(running):
            proc, model_id, key = item
            if proc.poll() is None:
                continue
            running.remove(item)
            out, err = proc.communicate()
            if proc.returncode != 0:
                failures += 1
                tail = err.strip().splitlines()[-1:] if err.strip() else [f"exit {proc.returncode}"]
                print(f"FAILED {key}: {tail[0]}", flush=True)
                continue
            row = json.loads(out.strip().splitlines()[-1])
            rows = {r["key"]: r for r in load_table()["rows"]}
            rows[row["key"]] = row
            write_table(list(rows.values()))
            print(
                f"{row['peak_gib']:9.3f} GiB  {row['peak_phase']:<9} {row['trace_seconds']:6.1f}s  {row['key']}",
                flush=True,
            )
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
