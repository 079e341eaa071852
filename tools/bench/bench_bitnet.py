"""Benchmark BitNet b1.58 compression side by side in one run, on tiny llama folders trained here briefly.

For each size: compression ratio (linear weights and whole model), sparsity (share of ternary zeros), mean
NLL / perplexity on held-out text for the original vs the ternary model (no fine-tuning), and forward
tokens/s of the JAX engine on the original params vs from the packed form (unpacked inside the jitted
forward).

    python tools/bench/bench_bitnet.py [--steps 150] [--rounds 5] [--batch 8] [--seq 64]

Models: transformers llama with a BPE tokenizer trained on a small word corpus (tests/hf_folders.py), trained
with torch AdamW for ``--steps`` steps so the NLL is that of a model that learnt something.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

SIZES = {"tiny": {"hidden": 64, "layers": 2}, "small": {"hidden": 256, "layers": 4}}


def _train(folder: Path, steps: int, seq: int) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tests.hf_folders import corpus

    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    ids = [i for t in corpus(2000, seed=0) for i in tok(t)["input_ids"] + [tok.eos_token_id]]
    data = torch.tensor(ids[: len(ids) // seq * seq]).view(-1, seq)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(0)
    for _ in range(steps):
        batch = data[torch.randint(0, len(data), (16,), generator=gen)]
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    model.save_pretrained(folder)


def _heldout(folder: Path, batch: int, seq: int) -> np.ndarray:
    from transformers import AutoTokenizer

    from tests.hf_folders import corpus

    tok = AutoTokenizer.from_pretrained(folder)
    ids = [i for t in corpus(400, seed=1) for i in tok(t)["input_ids"] + [tok.eos_token_id]]
    return np.asarray(ids[: batch * seq], np.int32).reshape(batch, seq)


def _nll(logits: np.ndarray, ids: np.ndarray) -> float:
    logits = logits[:, :-1].astype(np.float64)
    logp = logits - logits.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    return float(-np.take_along_axis(logp, ids[:, 1:, None], -1).mean())


def _time(fns: list, rounds: int, per_round: int = 5) -> list[float]:
    for fn in fns:
        fn().block_until_ready()
    samples: list[list[float]] = [[] for _ in fns]
    for _ in range(rounds):
        for k, fn in enumerate(fns):
            t = time.perf_counter()
            for _ in range(per_round):
                fn().block_until_ready()
            samples[k].append((time.perf_counter() - t) / per_round)
    return [statistics.median(s) for s in samples]


def bench(size: str, steps: int, rounds: int, batch: int, seq: int, root: Path) -> dict[str, float | str]:
    import jax
    import jax.numpy as jnp

    from aegis.forge.bitnet import compress_model, load_packed
    from aegis.train.models import build_model
    from aegis.train.weights import load_checkpoint
    from tests.hf_folders import make_model_folder

    import json

    src = make_model_folder(root / size, **SIZES[size])
    _train(src, steps, seq)
    result = compress_model(src, root / f"{size}-bitnet")
    ids = jnp.asarray(_heldout(src, batch, seq))
    model = build_model(json.loads((src / "config.json").read_text()))
    params = load_checkpoint(model, src)
    packed = load_packed(root / f"{size}-bitnet")
    forward = jax.jit(model.apply)
    nll_orig = _nll(np.asarray(forward(params, ids)), np.asarray(ids))
    nll_tern = _nll(np.asarray(packed.apply(ids)), np.asarray(ids))
    t_orig, t_packed = _time([lambda: forward(params, ids), lambda: packed.apply(ids)], rounds)
    tokens = batch * seq
    return {
        "size": f"{size} ({result.total_params / 1e6:.2f}M, {result.size_category})",
        "linear_x": result.linear_compression,
        "total_x": result.total_compression,
        "target_x": result.target_compression,
        "sparsity": result.sparsity,
        "nll_orig": nll_orig,
        "nll_tern": nll_tern,
        "ppl_orig": math.exp(nll_orig),
        "ppl_tern": math.exp(nll_tern),
        "tps_orig": tokens / t_orig,
        "tps_packed": tokens / t_packed,
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    args = p.parse_args(argv)
    import jax

    with tempfile.TemporaryDirectory() as tmp:
        rows = [bench(s, args.steps, args.rounds, args.batch, args.seq, Path(tmp)) for s in args.sizes]
    print(f"BitNet b1.58 (absmean, per tensor, no fine-tuning) on {jax.devices()[0].platform}; "
          f"{args.steps} torch training steps; forward batch {args.batch} x {args.seq}")
    head = (f"{'model':<22} {'linear x':>8} {'model x':>8} {'target x':>8} {'zeros':>6} "
            f"{'NLL orig':>8} {'NLL tern':>8} {'PPL orig':>8} {'PPL tern':>8} {'tok/s orig':>10} {'tok/s packed':>12} {'packed/orig':>11}")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['size']:<22} {r['linear_x']:>8.2f} {r['total_x']:>8.2f} {r['target_x']:>8.1f} {r['sparsity']:>6.1%} "
              f"{r['nll_orig']:>8.3f} {r['nll_tern']:>8.3f} {r['ppl_orig']:>8.2f} {r['ppl_tern']:>8.2f} "
              f"{r['tps_orig']:>10.0f} {r['tps_packed']:>12.0f} {r['tps_packed'] / r['tps_orig']:>11.2f}")


if __name__ == "__main__":
    main()
