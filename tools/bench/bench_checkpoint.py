"""Cost of Orbax checkpointing relative to step time, at a save interval of 100 steps.

For each model size, trains the same number of steps three ways in one process — no
checkpoints, async checkpoints every ``--interval`` steps, blocking checkpoints every
``--interval`` steps — through the supervisor's own path (``Engine.checkpoint`` →
``CheckpointStore``), and prints the mean wall time per step and the overhead against the run
without checkpoints. Goal: async overhead <= 5 % at interval 100.

    python tools/bench/bench_checkpoint.py                 # CPU, tiny and small llama
    python tools/bench/bench_checkpoint.py --steps 300 --interval 100 --sizes small
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

MODELS = {
    "tiny": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "head_dim": 16},
    "small": {"hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 4, "num_attention_heads": 8,
              "num_key_value_heads": 4, "head_dim": 64},
}


def _engine(size: str, seed: int = 0):
    from aegis.data import tiny_llama_config
    from aegis.supervise.config import parse_run_config
    from aegis.supervise.engine import Engine, load_examples

    model = {**tiny_llama_config(), **MODELS[size]}
    cfg = parse_run_config(
        {
            "model": model,
            "data": "toy",
            "train_config": {"method": "full", "micro_batch_size": 8, "seq_len": 64, "precision": "fp32"},
            "training": {"lr": 1e-3, "min_lr_ratio": 1.0, "seed": seed},
        }
    )
    return cfg, Engine.build(cfg, model, load_examples("toy"), tier=0)


def _run(size: str, steps: int, interval: int, mode: str) -> tuple[float, int, int]:
    """Mean seconds per step (first `interval` steps excluded: compilation), params, checkpoints."""
    import jax

    from aegis.supervise.checkpoints import CheckpointStore
    from aegis.supervise.state import RunState

    cfg, engine = _engine(size)
    state = RunState.new("bench", lr=1e-3, grad_clip=1.0, weights={})
    n_params = sum(x.size for x in jax.tree.leaves(engine.trainer.state.trainable))
    with tempfile.TemporaryDirectory() as tmp:
        store = CheckpointStore(Path(tmp) / "checkpoints", interval=interval, keep_last_n=2, async_save=(mode == "async"))
        for _ in engine.trainer.train(5):  # compile outside the timing
            pass
        saves = 0
        t0 = time.perf_counter()
        for info in engine.trainer.train(steps):
            if mode != "none" and store.due(info.step):
                engine.checkpoint(store, info.step, state)
                saves += 1
        jax.block_until_ready(engine.trainer.state)
        store.wait()
        elapsed = time.perf_counter() - t0
        store.close()
    return elapsed / steps, n_params, saves


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--interval", type=int, default=100)
    parser.add_argument("--sizes", nargs="+", default=["tiny", "small"], choices=sorted(MODELS))
    args = parser.parse_args()
    import jax

    rows = []
    for size in args.sizes:
        base, n_params, _ = _run(size, args.steps, args.interval, "none")
        asyn, _, saves = _run(size, args.steps, args.interval, "async")
        sync, _, _ = _run(size, args.steps, args.interval, "sync")
        rows.append((size, n_params, saves, base, asyn, sync))
    print(f"device: {jax.devices()[0].platform}, {args.steps} steps, checkpoint every {args.interval} steps")
    head = f"{'model':<6} {'params':>11} {'saves':>5} {'ms/step none':>12} {'ms/step async':>13} {'ms/step sync':>12} {'async/none':>10} {'sync/none':>9}"
    print(head)
    print("-" * len(head))
    for size, n, saves, base, asyn, sync in rows:
        print(
            f"{size:<6} {n:>11,} {saves:>5} {base * 1e3:>12.2f} {asyn * 1e3:>13.2f} {sync * 1e3:>12.2f} "
            f"{asyn / base:>10.3f} {sync / base:>9.3f}"
        )
    print("goal: async/none <= 1.05 at interval 100")


if __name__ == "__main__":
    main()
