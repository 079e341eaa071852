"""XLA's memory analysis of the JAX engine's compiled train step, as a table.

For each configuration the train step is lowered and compiled from shapes only (nothing is
allocated, so 8B models are fine on a laptop), and ``compiled.memory_analysis()`` is read:
peak = arguments + outputs - aliased (the donated state) + temporaries. On XLA:CPU
``peak_memory_in_bytes`` leaves temporaries out, hence the sum. The numbers come from
:func:`aegis.train.benchmark.jax_step_memory`, which the planner's ``jax`` profile is checked
against.

    python tools/jax_memory.py                                  # tiny llama, every method
    python tools/jax_memory.py --model meta-llama/Llama-3.2-1B --method qlora --mbs 1 --seq 1024 --gc
"""

from __future__ import annotations

import argparse
import time

from aegis.schema import TrainConfig


UNITS = {"GiB": 2**30, "MiB": 2**20}


def main(argv: list[str] | None = None) -> None:
    from aegis.train.benchmark import jax_step_memory, resolve_config

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="model id, config.json path (default: the bundled tiny llama)")
    ap.add_argument("--method", action="append", choices=["full", "lora", "qlora"], help="repeatable")
    ap.add_argument("--mbs", type=int, default=1, help="micro batch size")
    ap.add_argument("--seq", type=int, default=512, help="sequence length")
    ap.add_argument("--accum", type=int, default=1, help="gradient accumulation steps")
    ap.add_argument("--precision", default="bf16", choices=["bf16", "bf16_mixed", "fp32"])
    ap.add_argument("--optimizer", default="adamw", choices=["adamw", "sgd", "adafactor"])
    ap.add_argument("--gc", action="store_true", help="gradient checkpointing")
    ap.add_argument("--chunked-ce", action="store_true", help="chunked cross-entropy")
    args = ap.parse_args(argv)

    if args.model is None:
        from aegis.data import tiny_llama_config

        config, model_id = tiny_llama_config(), "aegis tiny llama"
    else:
        config, model_id = resolve_config(args.model)
    methods = args.method or ["full", "lora", "qlora"]
    print(
        f"model {model_id}   mbs {args.mbs}  seq {args.seq}  accum {args.accum}  {args.precision}  {args.optimizer}"
        f"  gc={args.gc}  chunked_ce={args.chunked_ce}"
    )
    rows: list[tuple[str, list[int], float]] = []
    head = ("method", "frozen", "trainable", "opt", "batch", "args", "outputs", "aliased", "temp", "peak", "compile s")
    for method in methods:
        tc = TrainConfig(
            method=method,
            micro_batch_size=args.mbs,
            seq_len=args.seq,
            gradient_accumulation_steps=args.accum,
            gradient_checkpointing=args.gc,
            chunked_cross_entropy=args.chunked_ce,
            precision=args.precision,
            optimizer=args.optimizer,
        )
        t0 = time.perf_counter()
        m = jax_step_memory(config, tc)
        dt = time.perf_counter() - t0
        cols = [
            m["frozen_bytes"], m["trainable_bytes"], m["opt_state_bytes"], m["batch_bytes"], m["argument_bytes"],
            m["output_bytes"], m["alias_bytes"], m["temp_bytes"], m["peak_bytes"],
        ]
        rows.append((method, cols, dt))
    unit = "GiB" if max(c for _, cols, _ in rows for c in cols) >= 2**30 else "MiB"
    print(f"{head[0]:<7}" + "".join(f"{h:>10}" for h in head[1:]) + f"   ({unit})")
    for method, cols, dt in rows:
        print(f"{method:<7}" + "".join(f"{c / UNITS[unit]:>10.3f}" for c in cols) + f"{dt:>10.1f}")


if __name__ == "__main__":
    main()
