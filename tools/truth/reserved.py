"""Reserved memory: the planner's allocation stream against the traced one, both through the allocator model.

    python -m tools.truth.reserved --model Llama-3.2-1B          # trace + replay these truth rows, store them
                                                                  # (rows stored as traced are traced again)
    python -m tools.truth.reserved --show                         # the comparison table

For a truth row (tests/data/memory_truth.json) this traces the same two training steps as `build.py`
with the allocation stream recorded (`tools.truth.stream`), replays the stream as loaded
(`tools.truth.stream.as_loaded`: without the from_config build's freed blocks, which ``from_pretrained`` never
makes; ``max_reserved_from_config_bytes`` keeps the replay as traced) through
`aegis.planning.memory.allocator` (with and without ``expandable_segments``) and stores the replayed peaks in
`tests/data/reserved_truth.json`. `compare` puts beside them what the planner predicts from its own
stream (`aegis.planning.memory.device.device_memory`). Both sides use the same allocator model, so the table
measures the planner's stream (which tensors, in which order), not the allocator model; the allocator
model itself is checked against hand-worked sequences in tests/planning/memory/test_allocator.py.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
TABLE = REPO / "tests" / "data" / "reserved_truth.json"
GIB = 1 << 30


def setup_of(row: dict[str, Any]):
    """The TraceSetup a truth row traced."""
    from tools.truth.build import row_key
    from tools.truth.setup import TraceSetup

    lora = row["method"] != "full"
    kw: dict[str, Any] = dict(
        method=row["method"], precision=row["precision"], optimizer=row["optimizer"],
        micro_batch_size=row["micro_batch_size"], seq_len=row["seq_len"],
        gradient_checkpointing=row["gradient_checkpointing"], attention=row["attention"],
        autocast=bool(row.get("autocast")) and row["precision"] == "bf16", steps=row["steps"],
        max_grad_norm=row["max_grad_norm"],
    )
    if lora:
        kw.update(lora_rank=row["lora_rank"], lora_alpha=row["lora_alpha"], lora_targets=tuple(row["lora_targets"]),
                  lora_dropout=row.get("lora_dropout") or 0.0)
    for field in ("kbit_prep", "checkpointing", "trainer"):
        if row.get(field) is not None:
            kw[field] = row[field]
    kw["transformers"] = row.get("transformers_pinned")
    setup = TraceSetup(**kw)
    if row_key(row["model_id"], setup) != row["key"]:
        raise ValueError(f"truth row {row['key']!r} does not round-trip to its setup ({row_key(row['model_id'], setup)!r})")
    return setup


def trace_reserved(row: dict[str, Any]) -> dict[str, Any]:
    """Trace ``row`` with its allocation stream and replay it (plain and expandable segments)."""
    import warnings

    from aegis.planning.memory.allocator import replay
    from tools.truth.build import config_path
    from tools.truth.stream import as_loaded, trace_stream

    warnings.filterwarnings("ignore")
    result, tracker = trace_stream(str(config_path(row["model_id"])), setup_of(row))
    events = as_loaded(tracker.events, tracker.reset_at)
    plain = replay(events)
    expandable = replay(events, expandable_segments=True)
    return {
        "key": row["key"],
        "traced_peak_bytes": result.peak_bytes,
        "max_allocated_bytes": plain.max_allocated_bytes,
        "max_reserved_bytes": plain.max_reserved_bytes,
        "max_reserved_expandable_bytes": expandable.max_reserved_bytes,
        "max_reserved_from_config_bytes": replay(tracker.events).max_reserved_bytes,
        "replay": "as-loaded",
        "events": len(events),
        "date": dt.date.today().isoformat(),
    }


def load(path: Path = TABLE) -> dict[str, dict[str, Any]]:
    if not path.exists():
        return {}
    return {r["key"]: r for r in json.loads(path.read_text(encoding="utf-8"))["rows"]}


def compare(truth_rows: list[dict[str, Any]] | None = None, stored: dict[str, dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Per stored row: traced-then-replayed reserved beside the planner's predicted reserved."""
    from aegis.planning.memory.device import device_memory
    from tools.memory_table import config_of, load_rows, profile_of

    truth = {r["key"]: r for r in (truth_rows if truth_rows is not None else load_rows())}
    stored = load() if stored is None else stored
    out = []
    for key, s in stored.items():
        row = truth.get(key)
        if row is None:
            continue
        profile = profile_of(row)
        cfg = config_of(row)
        plain = device_memory(profile, cfg)
        expandable = device_memory(profile, cfg, expandable_segments=True)
        out.append({
            "key": key, "model_id": row["model_id"], "method": row["method"], "b": row["micro_batch_size"],
            "s": row["seq_len"], "gc": row["gradient_checkpointing"],
            "traced_allocated": s["max_allocated_bytes"], "traced_reserved": s["max_reserved_bytes"],
            "traced_reserved_expandable": s["max_reserved_expandable_bytes"],
            "predicted_allocated": plain.max_allocated_bytes, "predicted_reserved": plain.max_reserved_bytes,
            "predicted_reserved_expandable": expandable.max_reserved_bytes,
            "error": plain.max_reserved_bytes / s["max_reserved_bytes"] - 1,
            "error_expandable": expandable.max_reserved_bytes / s["max_reserved_expandable_bytes"] - 1,
        })
    return out


def render(results: list[dict[str, Any]]) -> str:
    head = (f"{'model':<26} {'method':<6} {'b':>2} {'s':>5} {'gc':>2} | {'traced alloc':>12} {'reserved':>9} "
            f"{'res/alloc':>9} | {'predicted':>9} {'err':>7} | {'expandable: traced':>18} {'pred':>7} {'err':>7}")
    lines = [head, "-" * len(head)]
    for r in results:
        lines.append(
            f"{r['model_id'].split('/')[-1][:26]:<26} {r['method']:<6} {r['b']:>2} {r['s']:>5} {int(r['gc']):>2} | "
            f"{r['traced_allocated'] / GIB:>12.2f} {r['traced_reserved'] / GIB:>9.2f} "
            f"{r['traced_reserved'] / r['traced_allocated']:>9.3f} | {r['predicted_reserved'] / GIB:>9.2f} "
            f"{r['error']:>+7.2%} | {r['traced_reserved_expandable'] / GIB:>18.2f} "
            f"{r['predicted_reserved_expandable'] / GIB:>7.2f} {r['error_expandable']:>+7.2%}"
        )
    if results:
        errs = [abs(r["error"]) for r in results]
        lines.append(f"{len(results)} rows: median |error| {statistics.median(errs):.2%}, worst {max(errs):.2%}; "
                     f"expandable median {statistics.median(abs(r['error_expandable']) for r in results):.2%}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from tools.memory_table import load_rows

    parser = argparse.ArgumentParser(prog="python -m tools.truth.reserved", description=__doc__.split("\n")[0])
    parser.add_argument("--model", action="append", default=[], help="model id substring of truth rows to trace")
    parser.add_argument("--max-gib", type=float, default=40.0, help="skip rows whose traced peak is above this")
    parser.add_argument("--show", action="store_true", help="print the comparison and exit")
    args = parser.parse_args(argv)
    if args.show:
        print(render(compare()))
        return 0
    stored = load()
    for row in load_rows():
        if args.model and not any(m.lower() in row["model_id"].lower() for m in args.model):
            continue
        if not args.model and row["key"] not in stored:
            continue  # without --model: the stored rows, traced again where they were replayed as traced
        if stored.get(row["key"], {}).get("replay") == "as-loaded":
            continue
        if row["peak_bytes"] > args.max_gib * GIB or row.get("transformers_pinned"):
            continue  # pinned rows trace under their own transformers (see tools/truth/__init__.py)
        stored[row["key"]] = trace_reserved(row)
        TABLE.write_text(json.dumps({"description": __doc__.split("\n")[0], "rows": list(stored.values())}, indent=1) + "\n",
                         encoding="utf-8")
        print(row["key"], file=sys.stderr)
    print(render(compare(stored=stored)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
