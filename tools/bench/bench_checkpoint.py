"""Cost of Orbax checkpointing relative to step time, at a save interval of 100 steps.

For each model size, one engine (compiled once) trains ``--steps`` steps three ways, interleaved
and repeated — no checkpoints, async checkpoints every ``--interval`` steps, blocking checkpoints
every ``--interval`` steps — through the supervisor's own path (``Engine.checkpoint`` →
``CheckpointStore``). It prints median wall time per step of each and the median blocking time of
one save call; the async cost is that blocking time spread over the interval (robust to a noisy,
shared CPU, where whole-run ratios wander by several percent). Goal: async cost <= 5 % at 100.

    python tools/bench/bench_checkpoint.py                 # CPU, tiny and small llama
    python tools/bench/bench_checkpoint.py --steps 300 --interval 100 --sizes small
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

MODELS = {
    "tiny": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "head_dim": 16},
    "small": {"hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 4, "num_attention_heads": 8,
              "num_key_value_heads": 4, "head_dim": 32},
}


def _engine(size: str, seed: int = 0):
    from aegis.data import tiny_llama_config, toy_dataset_path
    from aegis.supervise.run_config import parse_run_config
    from aegis.supervise.engine_handle import Engine, load_examples

    model = {**tiny_llama_config(), **MODELS[size]}
    cfg = parse_run_config(
        {
            "model": model,
            "data": str(toy_dataset_path()),
            "train_config": {"method": "full", "micro_batch_size": 8, "seq_len": 64, "precision": "fp32"},
            "training": {"lr": 1e-3, "min_lr_ratio": 1.0, "seed": seed},
        }
    )
    return cfg, Engine.build(cfg, model, load_examples(cfg)[0], tier=0)


def _measure(engine, store, steps: int, mode: str) -> tuple[float, list[float]]:
    """Wall seconds of ``steps`` steps (saves included) and the blocking time of each save call."""
    import jax

    from aegis.supervise.state import RunState

    state = RunState.new("bench", lr=1e-3, grad_clip=1.0, weights={})
    calls: list[float] = []
    start = engine.step
    t0 = time.perf_counter()
    for info in engine.trainer.train(steps):
        if mode != "none" and store.due(info.step - start):
            c0 = time.perf_counter()
            engine.checkpoint(store, info.step, state)
            calls.append(time.perf_counter() - c0)
    jax.block_until_ready(engine.trainer.state)
    elapsed = time.perf_counter() - t0
    if store is not None:
        store.wait()  # not timed: in steady state a save finishes within its interval
    return elapsed, calls


def _bench(size: str, steps: int, interval: int, repeats: int) -> dict:
    """Interleaved none / async / sync runs on one engine (one compilation), medians over repeats."""
    import jax

    from aegis.supervise.checkpoints import CheckpointStore

    _, engine = _engine(size)
    n_params = sum(x.size for x in jax.tree.leaves(engine.trainer.state.trainable))
    for _ in engine.trainer.train(5):  # compile outside the timing
        pass
    out: dict[str, list] = {"none": [], "async": [], "sync": [], "async_calls": [], "sync_calls": []}
    with tempfile.TemporaryDirectory() as tmp:
        stores = {
            m: CheckpointStore(Path(tmp) / m, interval=interval, keep_last_n=2, async_save=(m == "async"))
            for m in ("async", "sync")
        }
        for _ in range(repeats):
            for mode in ("none", "async", "sync"):
                elapsed, calls = _measure(engine, stores.get(mode), steps, mode)
                out[mode].append(elapsed / steps)
                if mode != "none":
                    out[f"{mode}_calls"] += calls
        for st in stores.values():
            st.close()
    med = {k: statistics.median(v) for k, v in out.items() if v}
    med["params"] = n_params
    med["saves"] = len(out["async_calls"])
    return med


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--interval", type=int, default=100)
    parser.add_argument("--sizes", nargs="+", default=["tiny", "small"], choices=sorted(MODELS))
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    import jax

    print(f"device: {jax.devices()[0].platform}, {args.steps} steps x {args.repeats} interleaved repeats, "
          f"checkpoint every {args.interval} steps")
    head = (f"{'model':<6} {'params':>11} {'ms/step none':>12} {'async':>8} {'sync':>8} {'async/none':>10} "
            f"{'sync/none':>9} {'save call async ms':>17} {'sync ms':>8} {'async cost %':>12}")
    print(head)
    print("-" * len(head))
    for size in args.sizes:
        r = _bench(size, args.steps, args.interval, args.repeats)
        cost = r["async_calls"] / (args.interval * r["none"]) * 100
        print(
            f"{size:<6} {r['params']:>11,} {r['none'] * 1e3:>12.2f} {r['async'] * 1e3:>8.2f} {r['sync'] * 1e3:>8.2f} "
            f"{r['async'] / r['none']:>10.3f} {r['sync'] / r['none']:>9.3f} {r['async_calls'] * 1e3:>17.1f} "
            f"{r['sync_calls'] * 1e3:>8.1f} {cost:>12.2f}"
        )
    print("async cost % = median blocking time of an async save call / (interval x median step time); goal <= 5 %")


if __name__ == "__main__":
    main()
