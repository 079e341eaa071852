"""Truth rows on a real CUDA GPU: the caching allocator's peaks beside the traced, replayed and planned ones.

    python -m tools.truth.cuda --out gpu.json [--model Llama] [--budget-s 240]   # on a machine with a GPU
    python -m tools.truth.cuda --out gpu2.json --resume gpu.json                  # more rows, after an earlier run
    python -m tools.truth.cuda --out gpu3.json --key 'openai-community/gpt2|lora|...'   # chosen rows (exact keys)
    python -m tools.truth.cuda --show gpu.json                                   # the comparison, anywhere

The truth table (tests/data/memory_truth.json) is traced on fake CPU tensors as the CUDA caching allocator
would count them. This runs the same rows' step loop (`trace._run`, the same code: model preparation, two
HF-Trainer-like steps) on a GPU with real tensors and random weights, and records what the allocator saw:

- ``max_allocated_bytes``: `torch.cuda.max_memory_allocated` over the steps, less what was allocated before
  the model was built (the cuBLAS workspace of an earlier matmul). The traced ``peak_bytes`` claims this.
- ``max_reserved_bytes``: `torch.cuda.max_memory_reserved` from the model's construction to the end, the
  figure the planner's allocator model (`aegis.planning.memory.allocator`, replayed in tests/data/reserved_truth.json)
  and its device-level headroom claim.
- ``gpu_traced_peak_bytes``: the tracker's own count on the GPU, which separates "the CUDA kernels allocate
  what the fake trace assumed" from "the allocator counts what the tracker counts".
- ``cublas_workspace_bytes``: what one bf16 matmul left allocated before any row ran.
- ``sdpa``: each distinct `F.scaled_dot_product_attention` call of the row, with the backend PyTorch's dispatcher
  picks for it (`torch._fused_sdp_choice` on the call's own arguments, cast to the autocast dtype as CUDA's autocast
  does) and how many times it ran: which kernel the GPU ran, beside what the fake trace assumed.
- ``gpu_peak_top``: the largest groups of the tensors live at the GPU's peak that are not parameters, gradients or
  optimizer state, by the phase and ATen op that allocated them, dtype and shape (`tools.truth.explain`'s grouping):
  a row that disagrees with its trace says where, without another GPU run.

Rows run in this order until ``--budget-s`` is spent: rows with a replayed reserved figure first, then one row
per model, then the rest. A row runs only if its traced peak fits the GPU with 2 GiB to spare, its pinned
transformers version (if any) is the installed one, and bitsandbytes imports where it quantises. The JSON is
rewritten after every row, so a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import gc
import json
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

GIB = 1 << 30


def _order(rows: list[dict[str, Any]], replayed: set[str]) -> list[dict[str, Any]]:
    first = [r for r in rows if r["key"] in replayed]
    seen = {r["model_id"] for r in first}
    per_model = []
    for r in rows:
        if r["key"] not in replayed and r["model_id"] not in seen:
            seen.add(r["model_id"])
            per_model.append(r)
    taken = {r["key"] for r in first + per_model}
    return first + per_model + [r for r in rows if r["key"] not in taken]


def _skip_reason(row: dict[str, Any], free: int, versions: dict[str, str], has_bnb: bool) -> str | None:
    if row["peak_bytes"] > free - 2 * GIB:
        return f"traced peak {row['peak_bytes'] / GIB:.1f} GiB does not fit"
    pinned = row.get("transformers_pinned")
    if pinned and pinned != versions["transformers"]:
        return f"pinned to transformers {pinned}"
    if row["method"] == "qlora" and not has_bnb:
        return "no bitsandbytes"
    if row["method"] == "qlora" and (2 + 0.52) * row["param_count_total"] > free - 2 * GIB:
        # the trace's preparation builds the bf16 model and keeps every bf16 Linear until all are quantised
        # (tools/truth/model.py): bf16 and NF4 (0.5 B/param + 1/64 B of absmax) weights at once
        return "its bf16 and NF4 weights, both held while quantising, do not fit"
    return None


@contextlib.contextmanager
def sdpa_backends(record: collections.Counter) -> Any:
    """Count each `F.scaled_dot_product_attention` call by the backend PyTorch's dispatcher picks for it (run unchanged)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend

    from tools.truth.patches import autocast_sdpa_inputs, sdpa_arguments

    original = F.scaled_dot_product_attention

    def sdpa(*args: Any, **kwargs: Any) -> Any:
        try:
            bound = sdpa_arguments(*autocast_sdpa_inputs(args, kwargs))
            q, k, v = bound["query"], bound["key"], bound["value"]
            mask, dropout = bound.get("attn_mask"), float(bound.get("dropout_p", 0.0))
            causal, gqa = bool(bound.get("is_causal", False)), bool(bound.get("enable_gqa", False))
            choice = torch._fused_sdp_choice(q, k, v, mask, dropout, causal, scale=bound.get("scale"), enable_gqa=gqa)
            record[(f"{SDPBackend(choice).name} {str(q.dtype).removeprefix('torch.')} q{tuple(q.shape)} "
                    f"k{tuple(k.shape)} dropout {dropout:g} mask {None if mask is None else tuple(mask.shape)} "
                    f"causal {causal} gqa {gqa}")] += 1
        except Exception as err:  # noqa: BLE001 - recording must never change the row
            record[f"not recorded: {type(err).__name__}: {str(err)[:120]}"] += 1
        return original(*args, **kwargs)

    F.scaled_dot_product_attention = sdpa
    try:
        yield record
    finally:
        F.scaled_dot_product_attention = original


def measure_row(row: dict[str, Any], workspace: int) -> dict[str, Any]:
    """Run one truth row on the GPU and read the allocator's peaks."""
    import torch

    from tools.truth.build import config_path
    from tools.truth.reserved import setup_of
    from tools.truth.trace import _run

    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    marks: dict[str, int] = {}

    def on_setup() -> None:
        torch.cuda.synchronize()
        marks["after_setup"] = torch.cuda.memory_allocated() - base
        marks["setup_reserved"] = torch.cuda.max_memory_reserved()
        torch.cuda.reset_peak_memory_stats()

    from tools.truth.explain import peak_allocations

    start = time.perf_counter()
    calls: collections.Counter = collections.Counter()
    with torch.device("cuda"), sdpa_backends(calls):
        result, tracker = _run(str(config_path(row["model_id"])), setup_of(row), record_origin=True, on_setup=on_setup)
    torch.cuda.synchronize()
    out = {
        "key": row["key"],
        "max_allocated_bytes": torch.cuda.max_memory_allocated() - base,
        "max_reserved_bytes": max(marks["setup_reserved"], torch.cuda.max_memory_reserved()),
        "step_reserved_bytes": torch.cuda.max_memory_reserved(),
        "after_setup_bytes": marks["after_setup"],
        "gpu_traced_peak_bytes": result.peak_bytes,
        "gpu_traced_peak_phase": result.peak_phase,
        "cublas_workspace_bytes": workspace,
        "seconds": round(time.perf_counter() - start, 1),
        "sdpa": dict(calls),
        "gpu_peak_top": peak_allocations(tracker)[:12],
    }
    del result, tracker
    return out


def measure(rows: list[dict[str, Any]], out_path: Path, budget_s: float,
            done: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Measure ``rows`` in `_order` until ``budget_s`` is spent, after the ``done`` rows of an earlier run (kept
    in the output, not run again)."""
    import torch
    import transformers

    from tools.truth.reserved import load as load_replayed

    try:
        import bitsandbytes  # noqa: F401
        has_bnb = True
    except Exception:  # noqa: BLE001 - any import failure means QLoRA rows cannot run here
        has_bnb = False
    a = torch.ones(256, 256, dtype=torch.bfloat16, device="cuda")
    (a @ a).sum().item()
    workspace = torch.cuda.memory_allocated() - 2 * a.nbytes
    del a
    free, total = torch.cuda.mem_get_info()
    versions = {"torch": torch.__version__, "transformers": transformers.__version__}
    header = {"device": torch.cuda.get_device_name(), "total_bytes": total, "versions": versions,
              "date": time.strftime("%Y-%m-%d")}
    results: list[dict[str, Any]] = list(done or [])
    skip = {r["key"] for r in results if "error" not in r}
    start = time.perf_counter()
    for row in _order([r for r in rows if r["key"] not in skip], set(load_replayed())):
        if time.perf_counter() - start > budget_s:
            break
        reason = _skip_reason(row, free, versions, has_bnb)
        if reason:
            continue
        try:
            rec = measure_row(row, workspace)
        except Exception as err:  # noqa: BLE001 - keep measuring the other rows, record why this one failed
            rec = {"key": row["key"], "error": f"{type(err).__name__}: {str(err)[:300]}"}
            traceback.print_exc()
        results.append(rec)
        print(json.dumps(rec), file=sys.stderr, flush=True)
        out_path.write_text(json.dumps({**header, "rows": results}, indent=1) + "\n", encoding="utf-8")
    return results


def compare(measured: dict[str, Any]) -> list[dict[str, Any]]:
    """Per measured row: traced, replayed and planned figures beside the GPU's."""
    from aegis.planning.memory.device import device_memory
    from tools.memory_table import config_of, load_rows, profile_of
    from tools.truth.reserved import load as load_replayed

    truth = {r["key"]: r for r in load_rows()}
    replayed = load_replayed()
    out = []
    for m in measured["rows"]:
        row = truth.get(m["key"])
        if row is None or "error" in m:
            continue
        planned = device_memory(profile_of(row), config_of(row))
        rep = replayed.get(m["key"], {})
        out.append({
            "key": m["key"], "model_id": row["model_id"], "method": row["method"], "b": row["micro_batch_size"], "s": row["seq_len"],
            "gc": row["gradient_checkpointing"], "attention": row["attention"],
            "gpu_allocated": m["max_allocated_bytes"], "gpu_reserved": m["max_reserved_bytes"],
            "traced": row["peak_bytes"], "gpu_traced": m["gpu_traced_peak_bytes"],
            # the GPU built the model as the trace does (from_config): the stream replayed as traced is its peer;
            # as loaded (`tools.truth.stream.as_loaded`) is what a from_pretrained run reserves, and the planner's
            "replayed_reserved": rep.get("max_reserved_from_config_bytes"),
            "replayed_reserved_as_loaded": rep.get("max_reserved_bytes"),
            "planned_allocated": planned.max_allocated_bytes, "planned_reserved": planned.max_reserved_bytes,
        })
    return out


def _err(pred: int | None, real: int) -> str:
    return f"{pred / real - 1:>+8.2%}" if pred else f"{'-':>8}"


def render(measured: dict[str, Any], results: list[dict[str, Any]]) -> str:
    v = measured.get("versions", {})
    lines = [
        f"{measured.get('device', '?')}, torch {v.get('torch')}, transformers {v.get('transformers')} "
        f"({measured.get('date', '?')}); errors are (figure / GPU) - 1",
        f"{'model':<24} {'method':<5} {'b':>2} {'s':>5} {'gc':>2} {'attn':<5}| {'GPU alloc':>9} {'traced':>8} "
        f"{'on GPU':>8} {'planned':>8} | {'GPU resv':>9} {'replayed':>8} {'planned':>8}",
    ]
    for r in results:
        lines.append(
            f"{r['model_id'].split('/')[-1][:24]:<24} {r['method']:<5} {r['b']:>2} {r['s']:>5} {int(r['gc']):>2} "
            f"{r['attention']:<5}| {r['gpu_allocated'] / GIB:>9.2f} {_err(r['traced'], r['gpu_allocated'])} "
            f"{_err(r['gpu_traced'], r['gpu_allocated'])} {_err(r['planned_allocated'], r['gpu_allocated'])} | "
            f"{r['gpu_reserved'] / GIB:>9.2f} {_err(r['replayed_reserved'], r['gpu_reserved'])} "
            f"{_err(r['planned_reserved'], r['gpu_reserved'])}"
        )
    if results:
        for name, key, real in (("traced allocated", "traced", "gpu_allocated"),
                                ("planned allocated", "planned_allocated", "gpu_allocated"),
                                ("planned reserved", "planned_reserved", "gpu_reserved")):
            errs = [abs(r[key] / r[real] - 1) for r in results]
            lines.append(f"{name}: {len(errs)} rows, median |error| {statistics.median(errs):.2%}, "
                         f"worst {max(errs):.2%}")
    errors = [m for m in measured["rows"] if "error" in m]
    lines += [f"failed: {m['key']}: {m['error']}" for m in errors]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.truth.cuda", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, help="measure on this machine's GPU and write the rows here")
    parser.add_argument("--show", type=Path, help="compare a measured file with the traced and planned figures")
    parser.add_argument("--model", action="append", default=[], help="model id substring of truth rows to run")
    parser.add_argument("--key", action="append", default=[], help="a truth row's exact key (repeatable)")
    parser.add_argument("--budget-s", type=float, default=240.0, help="start no new row after this many seconds")
    parser.add_argument("--resume", type=Path, help="an earlier run's file: keep its rows, measure the others")
    args = parser.parse_args(argv)
    if args.show:
        measured = json.loads(args.show.read_text(encoding="utf-8"))
        print(render(measured, compare(measured)))
        return 0
    if not args.out:
        parser.error("give --out FILE (on a GPU machine) or --show FILE")
    import warnings

    from tools.memory_table import load_rows

    warnings.filterwarnings("ignore")
    rows = [r for r in load_rows() if not args.model or any(m.lower() in r["model_id"].lower() for m in args.model)]
    if args.key:
        unknown = set(args.key) - {r["key"] for r in rows}
        if unknown:
            parser.error(f"no truth row has the key {sorted(unknown)[0]!r} (tests/data/memory_truth.json)")
        rows = [r for r in rows if r["key"] in set(args.key)]
    done = json.loads(args.resume.read_text(encoding="utf-8"))["rows"] if args.resume else None
    measure(rows, args.out, args.budget_s, done)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
