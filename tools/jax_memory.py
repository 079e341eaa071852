"""XLA's memory analysis of the JAX engine's compiled train step next to the planner's ``jax`` profile.

For each configuration the train step is lowered and compiled from shapes only (nothing is
allocated, so 8B models are fine on a laptop), and ``compiled.memory_analysis()`` is read:
peak = arguments + outputs - aliased (the donated state) + temporaries. On XLA:CPU
``peak_memory_in_bytes`` leaves temporaries out, hence the sum. The numbers come from
:func:`aegis.train.benchmark.jax_step_memory`; the planner's prediction from
``aegis.estimate_memory(..., framework="jax")`` (XLA:CPU layout: no GPU named), with its error.

    python tools/jax_memory.py                                  # tiny llama, every method
    python tools/jax_memory.py --model meta-llama/Llama-3.2-1B --method qlora --mbs 1 --seq 1024 --gc
    python tools/jax_memory.py --grid                           # small llama + 2 catalog models: median / worst error
    python tools/jax_memory.py --grid --models small-llama-2 small-llama-10   # 2 (unrolled) and 10 (scanned) layers
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from typing import Any

from aegis.schema import ModelProfile, TrainConfig

UNITS = {"GiB": 2**30, "MiB": 2**20}

SMALL_LLAMA = {"hidden_size": 256, "intermediate_size": 768, "num_attention_heads": 8, "num_key_value_heads": 2,
               "head_dim": 32, "vocab_size": 4096}
"""The tiny llama widened to sizes where XLA's per-token buffers, not its fixed ones, make the peak."""

GRID_MODELS = ("small-llama-10", "Qwen/Qwen2.5-0.5B", "meta-llama/Llama-3.2-1B")
GRID_METHODS = ("full", "lora", "qlora")
GRID_SEQS = {"small": (128, 512), "catalog": (1024,)}


def _model(name: str | None) -> tuple[dict[str, Any], str]:
    from aegis.data import tiny_llama_config
    from aegis.train.benchmark import resolve_config

    if name is None:
        return tiny_llama_config(), "aegis tiny llama"
    if name.startswith("small-llama-"):
        layers = int(name.rsplit("-", 1)[1])
        return {**tiny_llama_config(), **SMALL_LLAMA, "num_hidden_layers": layers}, name
    return resolve_config(name)


def _profile(config: dict[str, Any], model_id: str) -> ModelProfile:
    from aegis.models.profiles import profile_from_config

    return profile_from_config(config, model_id=model_id, source="path")


def measure(config: dict[str, Any], model_id: str, tc: TrainConfig) -> tuple[dict[str, int], int, float]:
    """(XLA memory analysis, planner tensor bytes, compile seconds) for one configuration."""
    from aegis.planning.memory import estimate
    from aegis.train.benchmark import jax_step_memory

    t0 = time.perf_counter()
    m = jax_step_memory(config, tc)
    dt = time.perf_counter() - t0
    est = estimate(_profile(config, model_id), tc, framework="jax")
    return m, est.tensor_bytes, dt


def _table(args: argparse.Namespace) -> None:
    config, model_id = _model(args.model)
    methods = args.method or ["full", "lora", "qlora"]
    print(
        f"model {model_id}   mbs {args.mbs}  seq {args.seq}  accum {args.accum}  {args.precision}  {args.optimizer}"
        f"  gc={args.gc}  chunked_ce={args.chunked_ce}"
    )
    rows: list[tuple[str, list[int], float, float]] = []
    head = ("method", "frozen", "trainable", "opt", "batch", "args", "outputs", "aliased", "temp", "XLA peak", "planner")
    for method in methods:
        tc = TrainConfig(
            method=method, micro_batch_size=args.mbs, seq_len=args.seq, gradient_accumulation_steps=args.accum,
            gradient_checkpointing=args.gc, chunked_cross_entropy=args.chunked_ce, precision=args.precision,
            optimizer=args.optimizer,
        )
        m, planned, dt = measure(config, model_id, tc)
        cols = [
            m["frozen_bytes"], m["trainable_bytes"], m["opt_state_bytes"], m["batch_bytes"], m["argument_bytes"],
            m["output_bytes"], m["alias_bytes"], m["temp_bytes"], m["peak_bytes"], planned,
        ]
        rows.append((method, cols, 100 * (planned / m["peak_bytes"] - 1), dt))
    unit = "GiB" if max(c for _, cols, _, _ in rows for c in cols) >= 2**30 else "MiB"
    print(f"{head[0]:<7}" + "".join(f"{h:>10}" for h in head[1:]) + f"{'error %':>9}{'compile s':>10}   ({unit})")
    for method, cols, err, dt in rows:
        print(f"{method:<7}" + "".join(f"{c / UNITS[unit]:>10.3f}" for c in cols) + f"{err:>+9.1f}{dt:>10.1f}")


def grid(models: tuple[str, ...] = GRID_MODELS) -> list[dict[str, Any]]:
    """XLA vs planner over methods x gradient checkpointing x two sequence lengths per model (bf16, batch 1-2)."""
    out = []
    for name in models:
        config, model_id = _model(name)
        small = name.startswith("small")
        for method, gc, seq in itertools.product(GRID_METHODS, (False, True), GRID_SEQS["small" if small else "catalog"]):
            tc = TrainConfig(method=method, micro_batch_size=2 if small else 1, seq_len=seq, gradient_checkpointing=gc)
            m, planned, dt = measure(config, model_id, tc)
            row = dict(model=model_id, method=method, gc=gc, seq=seq, batch=tc.micro_batch_size, xla=m["peak_bytes"],
                       planner=planned, error=planned / m["peak_bytes"] - 1, compile_s=dt)
            out.append(row)
            print(f"{row['model']:<26}{method:<7}{'gc' if gc else '--':<4}{row['batch']:>3}{seq:>6}"
                  f"{m['peak_bytes'] / 2**30:>10.3f}{planned / 2**30:>10.3f}{100 * row['error']:>+9.1f}{dt:>8.1f}", flush=True)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="model id, config.json path, small-llama-N (default: the bundled tiny llama)")
    ap.add_argument("--method", action="append", choices=["full", "lora", "qlora"], help="repeatable")
    ap.add_argument("--mbs", type=int, default=1, help="micro batch size")
    ap.add_argument("--seq", type=int, default=512, help="sequence length")
    ap.add_argument("--accum", type=int, default=1, help="gradient accumulation steps")
    ap.add_argument("--precision", default="bf16", choices=["bf16", "bf16_mixed", "fp32"])
    ap.add_argument("--optimizer", default="adamw", choices=["adamw", "sgd", "adafactor"])
    ap.add_argument("--gc", action="store_true", help="gradient checkpointing")
    ap.add_argument("--chunked-ce", action="store_true", help="chunked cross-entropy")
    ap.add_argument("--grid", action="store_true", help="small llama (10 layers) + Qwen2.5-0.5B + Llama-3.2-1B grid")
    ap.add_argument("--models", nargs="+", default=None, help="models for --grid (default: %(default)s)")
    args = ap.parse_args(argv)
    if not args.grid:
        _table(args)
        return
    print(f"{'model':<26}{'method':<7}{'gc':<4}{'b':>3}{'seq':>6}{'XLA GiB':>10}{'planner':>10}{'error %':>9}{'comp s':>8}")
    rows = grid(tuple(args.models) if args.models else GRID_MODELS)
    errs = [abs(r["error"]) for r in rows]
    print(f"{len(rows)} configurations: median |error| {100 * statistics.median(errs):.1f}%, worst {100 * max(errs):.1f}%")


if __name__ == "__main__":
    main()
