"""Benchmark BitNet b1.58 compression side by side in one run, on tiny llama folders trained here briefly.

For each size: compression ratio (linear weights and whole model), sparsity (share of ternary zeros),
perplexity and next-token accuracy on held-out text (rendered by the project's render layer with the model's
tokenizer) for the original model, the ternary model right after quantisation and after straight-through
fine-tuning (a supervised run, :mod:`aegis.forge.bitnet_pipeline`), and forward tokens/s of the JAX engine
on the original params vs from the packed form with int8 activations (A8) and without (A16).

    python tools/bench/bench_bitnet.py [--steps 150] [--ste-steps 100] [--rounds 5] [--batch 8] [--seq 64]

Models: transformers llama with a BPE tokenizer trained on a small word corpus (tools/hf_folders.py), trained
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

    from tools.hf_folders import corpus

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

    from tools.hf_folders import corpus

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


def _write_rows(path: Path, texts: list[str]) -> str:
    import json

    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return str(path)


def bench(size: str, args: argparse.Namespace, root: Path) -> dict[str, float | str]:
    import json

    import jax
    import jax.numpy as jnp

    from aegis.forge.bitnet import load_packed
    from aegis.forge.bitnet_pipeline import FinetuneSettings, compress_calibrated
    from aegis.train.modeling import build_model
    from aegis.train.weights import load_checkpoint
    from tools.hf_folders import corpus, make_model_folder

    src = make_model_folder(root / size, **SIZES[size])
    _train(src, args.steps, args.seq)
    heldout = _write_rows(root / f"{size}-heldout.jsonl", corpus(args.calib_rows, seed=1))
    train = _write_rows(root / f"{size}-train.jsonl", corpus(2000, seed=0))
    ft = None
    if args.ste_steps:
        ft = FinetuneSettings(data=train, steps=args.ste_steps, lr=args.ste_lr, micro_batch_size=16, seq_len=args.seq,
                              lambda_warmup_steps=args.lambda_warmup, steps_per_window=max(args.ste_steps // 2, 1))
    rep = compress_calibrated(src, root / f"{size}-bitnet", data=heldout, samples=args.calib_rows, seq_len=args.seq,
                              finetune=ft, runs_dir=root / "runs", revert=False)
    result = rep.compression
    ids = jnp.asarray(_heldout(src, args.batch, args.seq))
    model = build_model(json.loads((src / "config.json").read_text()))
    params = load_checkpoint(model, src)
    packed = load_packed(root / f"{size}-bitnet")
    packed16 = load_packed(root / f"{size}-bitnet", activations="none")
    forward = jax.jit(model.apply)
    t_orig, t_a8, t_a16 = _time(
        [lambda: forward(params, ids), lambda: packed.apply(ids), lambda: packed16.apply(ids)], args.rounds
    )
    tokens = args.batch * args.seq
    st = rep.stages
    ste = st.get("after_ste")
    return {
        "size": f"{size} ({result.total_params / 1e6:.2f}M, {result.size_category})",
        "linear_x": result.linear_compression,
        "total_x": result.total_compression,
        "target_x": result.target_compression,
        "sparsity": result.sparsity,
        "ppl_orig": st["full_precision"].perplexity,
        "ppl_tern": st["quantized"].perplexity,
        "ppl_ste": ste.perplexity if ste else math.nan,
        "acc_orig": st["full_precision"].accuracy,
        "acc_tern": st["quantized"].accuracy,
        "acc_ste": ste.accuracy if ste else math.nan,
        "drop_tern": rep.drops["quantized"],
        "drop_ste": rep.drops.get("after_ste", math.nan),
        "tps_orig": tokens / t_orig,
        "tps_a8": tokens / t_a8,
        "tps_a16": tokens / t_a16,
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=150, help="torch training steps of the full-precision model")
    p.add_argument("--ste-steps", type=int, default=100, help="STE fine-tuning steps (a supervised run); 0: none")
    p.add_argument("--ste-lr", type=float, default=1e-3)
    p.add_argument("--lambda-warmup", type=int, default=0, help="quantisation warm-up steps of the STE run")
    p.add_argument("--calib-rows", type=int, default=200, help="held-out rows of the calibration eval")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    args = p.parse_args(argv)
    import jax

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes:
            rows.append(bench(size, args, Path(tmp)))
            print(f"{size}: {rows[-1]}", file=sys.stderr, flush=True)  # partial results of a long run
    print(f"BitNet b1.58 (absmean per tensor, int8 activations) on {jax.devices()[0].platform}; {args.steps} torch "
          f"training steps; STE {args.ste_steps} steps at lr {args.ste_lr} (lambda warm-up {args.lambda_warmup}); "
          f"eval on {args.calib_rows} held-out rows; forward batch {args.batch} x {args.seq}")
    head = (f"{'model':<22} {'linear x':>8} {'model x':>7} {'target':>6} {'zeros':>6} "
            f"{'PPL fp':>7} {'PPL tern':>8} {'PPL STE':>7} {'acc fp':>6} {'acc tern':>8} {'acc STE':>7} "
            f"{'drop tern':>9} {'drop STE':>8} {'tok/s fp':>9} {'tok/s A8':>9} {'tok/s A16':>9} {'A8/fp':>6}")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['size']:<22} {r['linear_x']:>8.2f} {r['total_x']:>7.2f} {r['target_x']:>6.1f} {r['sparsity']:>6.1%} "
              f"{r['ppl_orig']:>7.2f} {r['ppl_tern']:>8.2f} {r['ppl_ste']:>7.2f} {r['acc_orig']:>6.3f} "
              f"{r['acc_tern']:>8.3f} {r['acc_ste']:>7.3f} {r['drop_tern']:>9.1%} {r['drop_ste']:>8.1%} "
              f"{r['tps_orig']:>9.0f} {r['tps_a8']:>9.0f} {r['tps_a16']:>9.0f} {r['tps_a8'] / r['tps_orig']:>6.2f}")
    print("drop: relative next-token accuracy drop vs full precision (the Agent Forge plan's formula); A8: packed "
          "codes unpacked inside the jitted forward, int8 x ternary in int32 (no dedicated ternary kernel); A16: "
          "packed weights, activations unquantised")


if __name__ == "__main__":
    main()
