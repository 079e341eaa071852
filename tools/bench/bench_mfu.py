"""Model FLOPs utilisation of the JAX engine on the local accelerator, swept over micro batch sizes.

The issue's GPU bar (MFU of a 1B-class model, goal >= 40% on an H100) in one command: real bf16
train steps of a catalog model with random weights (``aegis.train.benchmark.run_benchmark``, not
stored), a row per (micro batch, gradient checkpointing): step time, tokens/s, MFU against the
catalog's dense bf16 peak of the detected GPU, the device's peak memory, and the planner's ``jax``
profile for the same configuration next to it. A configuration that runs out of memory is a row
that says so. On a machine without a GPU, MFU is blank (no peak to divide by).

    python -m tools.bench.bench_mfu                                   # llama-3.2-1b, full, seq 2048
    python -m tools.bench.bench_mfu --model qwen2.5-0.5b --method lora --batches 4 8 16 --remat off
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from typing import Any

REMAT = {"off": (False,), "on": (True,), "both": (False, True)}


def _planned_peak(config: dict[str, Any], model_id: str, gpu_id: str, tc: Any) -> int | None:
    """The planner's ``jax`` profile tensor peak (bytes, no runtime overhead: what the device's allocator
    counts) for this configuration on ``gpu_id`` (None for a GPU the catalog does not know)."""
    from aegis.errors import AegisError
    from aegis.planning.memory.jax_profile import estimate_jax
    from aegis.models.profiles import profile_from_config

    profile = profile_from_config(config, model_id=model_id, source="path")
    try:
        return estimate_jax(profile, tc, gpu=None if gpu_id == "cpu" else gpu_id).tensor_bytes
    except AegisError:  # a GPU the catalog does not know: no layout to size
        return None


def measure(model: str, method: str, seq: int, batch: int, ckpt: bool, steps: int) -> dict[str, Any]:
    """One measured row (in this process: the device's peak counter never goes down, so each row gets its own)."""
    from aegis.schema import LoRAConfig, TrainConfig
    from aegis.train.benchmark import resolve_config, run_benchmark

    config, model_id = resolve_config(model)
    lora = LoRAConfig() if method != "full" else None
    row: dict[str, Any] = {"batch": batch, "remat": ckpt}
    tc = TrainConfig(method=method, micro_batch_size=batch, seq_len=seq, gradient_checkpointing=ckpt,
                     precision="bf16", lora=lora)
    try:
        res = run_benchmark(config, method, batch, seq, steps, model_id=model_id, precision="bf16",
                            gradient_checkpointing=ckpt, lora=lora, record=False)
    except Exception as err:  # noqa: BLE001 - XLA reports OOM as a runtime error; the sweep goes on
        if "RESOURCE_EXHAUSTED" not in str(err) and "out of memory" not in str(err).lower():
            raise
        row["error"] = "OOM"
        return row
    rec = res.record
    row.update(step_ms=rec.step_time_s * 1e3, tokens_per_s=rec.tokens_per_s, mfu=rec.mfu,
               peak=rec.peak_memory_bytes, source=rec.memory_source, device=rec.device,
               planned=_planned_peak(config, model_id, rec.gpu_id, tc))
    return row


def sweep(model: str, method: str, seq: int, batches: list[int], remat: str, steps: int) -> list[dict[str, Any]]:
    """One measured row per (micro batch, checkpointing) configuration, each in a fresh process."""
    rows = []
    for ckpt in REMAT[remat]:
        for batch in batches:
            cmd = [sys.executable, "-m", "tools.bench.bench_mfu", "--one", "--model", model, "--method", method,
                   "--seq", str(seq), "--batches", str(batch), "--remat", "on" if ckpt else "off",
                   "--steps", str(steps)]
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if proc.returncode != 0:  # the worker turns an out-of-memory into a row: anything else is a bug
                tail = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
                raise RuntimeError(f"batch {batch}, remat {'on' if ckpt else 'off'}: {tail}")
            rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return rows


def _table(rows: list[dict[str, Any]]) -> str:
    gib = 1 << 30
    lines = [f"{'batch':>5}{'remat':>7}{'step ms':>10}{'tokens/s':>11}{'MFU':>7}{'peak GiB':>10}{'planned GiB':>13}{'planned/peak':>14}"]
    for r in rows:
        head = f"{r['batch']:>5}{'on' if r['remat'] else 'off':>7}"
        if "error" in r:
            lines.append(f"{head}  {r['error']}")
            continue
        mfu = f"{r['mfu']:.0%}" if r["mfu"] is not None else "-"
        planned = r["planned"]
        ratio = f"{planned / r['peak']:.2f}" if planned else "-"
        planned_s = f"{planned / gib:.2f}" if planned else "-"
        lines.append(f"{head}{r['step_ms']:>10.1f}{r['tokens_per_s']:>11,.0f}{mfu:>7}{r['peak'] / gib:>10.2f}"
                     f"{planned_s:>13}{ratio:>14}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="llama-3.2-1b", help="catalog alias, Hub id or config.json path")
    ap.add_argument("--method", default="full", choices=["full", "lora", "qlora"])
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--remat", choices=sorted(REMAT), default="both", help="gradient checkpointing off, on or both")
    ap.add_argument("--steps", type=int, default=10, help="timed steps per configuration (after 2 warm-up steps)")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a single row as JSON (the sweep's worker)
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(measure(args.model, args.method, args.seq, args.batches[0], args.remat == "on", args.steps)))
        return
    import jax

    rows = sweep(args.model, args.method, args.seq, args.batches, args.remat, args.steps)
    device = next((r["device"] for r in rows if "device" in r), jax.devices()[0].platform)
    source = {"device": "the allocator's peak", "compiled": "XLA's memory analysis"}.get(
        next((r["source"] for r in rows if "source" in r), ""), "-")
    print(f"{args.model} {args.method}, bf16, seq {args.seq}, AdamW, on {device} (jax {jax.__version__}); "
          f"MFU = model FLOPs/token x tokens/s / catalog dense bf16 peak; peak = {source}; "
          "planned = the planner's jax profile (tensors)")
    print(_table(rows))


if __name__ == "__main__":
    main()
