"""Explain a traced peak: which ops allocated the tensors live at the peak.

    python -m tools.truth.explain meta-llama/Llama-3.2-1B --method lora -b 2 -s 1024
    python -m tools.truth.explain Qwen/Qwen2.5-0.5B --method full --gc --top 40

Groups the storages live at the overall peak by category (params / grads / optimizer_state
/ other), and the "other" ones (activations saved for backward, temporaries) by the phase
and ATen op that allocated them, their dtype and shape. This is what a memory model has
to reproduce term by term.
"""

from __future__ import annotations

import argparse
import warnings
from collections import defaultdict
from typing import Any

from tools.truth.alloc import LiveBytes
from tools.truth.setup import TraceSetup

GIB = 2**30


def peak_allocations(tracker: LiveBytes) -> list[dict[str, Any]]:
    """Storages live at the peak that are not params/grads/optimizer state, grouped."""
    known: set[int] = set()
    for keys in tracker.peak_groups.values():
        known |= keys
    groups: dict[tuple, list[int]] = defaultdict(list)
    for key, size in tracker.peak_snapshot.items():
        if key in known:
            continue
        phase, op, shape, dtype = tracker.peak_origin.get(key, ("?", "?", (), "?"))
        groups[(phase, op, dtype, shape)].append(size)
    rows = [
        {"phase": k[0], "op": k[1], "dtype": k[2], "shape": list(k[3]), "count": len(v), "bytes": sum(v)}
        for k, v in groups.items()
    ]
    rows.sort(key=lambda r: -r["bytes"])
    return rows


def main(argv: list[str] | None = None) -> int:
    from tools.truth.build import config_path
    from tools.truth.trace import trace_with_tracker

    parser = argparse.ArgumentParser(prog="python -m tools.truth.explain", description=__doc__.split("\n")[0])
    parser.add_argument("model_id", help="bundled model id, e.g. meta-llama/Llama-3.2-1B")
    parser.add_argument("--method", choices=["full", "lora", "qlora"], default="lora")
    parser.add_argument("--precision", choices=["bf16", "bf16_mixed", "fp32"], default="bf16")
    parser.add_argument("--optimizer", choices=["adamw_foreach", "adamw_fused"], default="adamw_foreach")
    parser.add_argument("-b", "--micro-batch-size", type=int, default=1)
    parser.add_argument("-s", "--seq-len", type=int, default=512)
    parser.add_argument("--gc", action="store_true", help="gradient checkpointing")
    parser.add_argument("--attention", choices=["sdpa", "eager"], default="sdpa")
    parser.add_argument("--autocast", action="store_true", help="torch.autocast(bf16), HF bf16=True")
    parser.add_argument("--targets", help="LoRA target names, comma-separated (default: the trace's)")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    setup = TraceSetup(
        method=args.method,
        precision=args.precision,
        optimizer=args.optimizer,
        micro_batch_size=args.micro_batch_size,
        seq_len=args.seq_len,
        gradient_checkpointing=args.gc,
        attention=args.attention,
        autocast=args.autocast,
        **({"lora_targets": tuple(args.targets.split(","))} if args.targets else {}),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result, tracker = trace_with_tracker(str(config_path(args.model_id)), setup, record_origin=True)
    print(f"peak {result.peak_bytes / GIB:.3f} GiB in {result.peak_phase} (step {result.peak_step})")
    for name, value in result.peak_breakdown_bytes.items():
        print(f"  {name:<16} {value / GIB:9.3f} GiB")
    print(f"\n'other' at the peak by allocating op (top {args.top}):")
    print(f"{'GiB':>9} {'count':>5}  {'phase':<9} {'op':<40} {'dtype':<9} shape")
    for row in peak_allocations(tracker)[: args.top]:
        print(
            f"{row['bytes'] / GIB:9.4f} {row['count']:>5}  {row['phase']:<9} {row['op']:<40} {row['dtype']:<9} "
            f"{tuple(row['shape'])}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
