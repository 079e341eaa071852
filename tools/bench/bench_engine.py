"""Benchmark the JAX engine on CPU, side by side in one run.

1. Train-step throughput (tokens/s) of the JAX engine vs transformers + torch on the same llama
   config, the same batch and the same optimizer (AdamW, clip 1.0): full fine-tuning, and LoRA
   (PEFT on the torch side). Goal: JAX / torch >= 1.0.
2. Per-sample gradient norms of a batch of 64: the forensics kernel (vmap under jit, chunked)
   vs a Python loop of jitted single-sample JAX gradients, and vs the PyTorch way without
   functorch (one backward per sample). Goal: >= 10x.

    python tools/bench/bench_engine.py [--steps 10] [--batch 8] [--seq 128] [--config tiny|small] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import numpy as np

SMALL = {"hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 4, "num_attention_heads": 8,
         "num_key_value_heads": 4, "head_dim": 32, "vocab_size": 2048}


def _config(name: str) -> dict[str, Any]:
    from aegis.data import tiny_llama_config

    cfg = tiny_llama_config()
    if name == "small":
        cfg.update(SMALL)
    return cfg


def _timed(fn, steps: int, warmup: int = 2) -> tuple[float, float]:
    """Median (wall seconds, process CPU seconds) per call of ``fn`` (which blocks until its work is done).

    CPU time is the steadier figure on a shared machine: waiting for a core does not count.
    """
    for _ in range(warmup):
        fn()
    walls, cpus = [], []
    for _ in range(steps):
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
    return statistics.median(walls), statistics.median(cpus)


def jax_train_step_s(cfg: dict, method: str, batch: int, seq: int, steps: int) -> tuple[float, float]:
    import jax

    from aegis.schema import LoRAConfig, TrainConfig
    from aegis.train.benchmark import synthetic_batch
    from aegis.train.loop import build_trainable
    from aegis.train.models import build_model
    from aegis.train.step import OptimizerSettings, init_state, make_optimizer, make_train_step

    tc = TrainConfig(method=method, micro_batch_size=batch, seq_len=seq, precision="fp32",
                     lora=LoRAConfig(rank=16, alpha=32) if method != "full" else None)
    settings = OptimizerSettings(learning_rate=1e-4, clip_norm=1.0)
    model = build_model(cfg)
    params = model.init(jax.random.PRNGKey(0))
    trainable, frozen = build_trainable(model, params, tc, jax.random.PRNGKey(1), jax.numpy.float32)
    tx = make_optimizer(tc, settings)
    box = [init_state(trainable, tx, settings, jax.random.PRNGKey(2))]
    data = jax.device_put(synthetic_batch(cfg["vocab_size"], 1, batch, seq))
    step = jax.jit(make_train_step(model, tx, settings), donate_argnums=0)

    def run() -> None:
        box[0], metrics = step(box[0], frozen, data)
        jax.block_until_ready(metrics["loss"])

    return _timed(run, steps)


def torch_train_step_s(cfg: dict, method: str, batch: int, seq: int, steps: int) -> tuple[float, float]:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from aegis.train.benchmark import synthetic_batch

    torch.manual_seed(0)
    hf_cfg = {k: v for k, v in cfg.items() if k not in ("architectures", "model_type", "torch_dtype")}
    model = LlamaForCausalLM(LlamaConfig(**hf_cfg, attn_implementation="sdpa")).float()
    if method != "full":
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", lora_dropout=0.0))
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.0)
    data = synthetic_batch(cfg["vocab_size"], 1, batch, seq)
    ids = torch.from_numpy(np.ascontiguousarray(data["input_ids"][0])).long()
    labels = torch.from_numpy(np.ascontiguousarray(data["targets"][0])).long()

    def run() -> None:
        logits = model(input_ids=ids).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return _timed(run, steps)


def torch_per_sample_loop_s(cfg: dict, n: int, seq: int, repeats: int) -> tuple[float, float]:
    """(wall, cpu) of what PyTorch code does without functorch: one backward per sample, then the grad norm."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from aegis.data import ByteTokenizer, toy_dataset_path
    from aegis.train.data import load_jsonl

    torch.manual_seed(0)
    hf_cfg = {k: v for k, v in cfg.items() if k not in ("architectures", "model_type", "torch_dtype")}
    model = LlamaForCausalLM(LlamaConfig(**hf_cfg, attn_implementation="sdpa")).float()
    params = list(model.parameters())
    rows = []
    for ex in load_jsonl(toy_dataset_path(), ByteTokenizer())[:n]:
        ids = torch.from_numpy(ex.input_ids[:seq].astype(np.int64))[None]
        labels = torch.where(torch.from_numpy(ex.loss_mask[:seq])[None], ids, -100)
        rows.append((ids, labels))

    def looped() -> None:
        for ids, labels in rows:
            model.zero_grad(set_to_none=True)
            model(input_ids=ids, labels=labels).loss.backward()
            torch.sqrt(sum((p.grad.float() ** 2).sum() for p in params if p.grad is not None)).item()

    return _timed(looped, repeats, warmup=1)


def per_sample_grads_s(cfg: dict, n: int, seq: int, repeats: int, chunk: int) -> tuple[tuple, tuple, float]:
    """((wall, cpu) of the vmap kernel, (wall, cpu) of the python loop, max relative difference of the norms)."""
    import jax
    import jax.numpy as jnp
    import optax

    from aegis.data import ByteTokenizer, toy_dataset_path
    from aegis.train.data import load_jsonl, pack_examples
    from aegis.train.forensics import analyze_batch
    from aegis.train.models import build_model
    from aegis.train.step import token_loss_sum

    model = build_model(cfg)
    params = model.init(jax.random.PRNGKey(0))
    examples = load_jsonl(toy_dataset_path(), ByteTokenizer())[:n]
    batch, _ = pack_examples(examples, n, seq, packing=False)

    @jax.jit
    def one(p, arrays):
        def loss(p):
            t, c = token_loss_sum(model, p, None, arrays)
            return t / c

        return optax.global_norm(jax.grad(loss)(p))

    singles = [
        {k: jnp.asarray(v) for k, v in pack_examples([ex], 1, seq, packing=False)[0].arrays().items()}
        for ex in examples
    ]
    box: dict[str, Any] = {}

    def vmapped() -> None:
        box["v"] = analyze_batch(model, params, None, batch, chunk_size=chunk).grad_norms

    def looped() -> None:
        box["l"] = np.array([float(one(params, s)) for s in singles])

    t_v = _timed(vmapped, repeats, warmup=1)
    t_l = _timed(looped, repeats, warmup=1)
    diff = float(np.max(np.abs(box["v"] - box["l"]) / box["l"]))
    return t_v, t_l, diff


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--config", action="append", choices=["tiny", "small"], help="repeatable (default: both)")
    ap.add_argument("--samples", type=int, default=64)
    ap.add_argument("--chunk", type=int, default=8, help="forensics chunk size (samples per vmap)")
    ap.add_argument("--skip-train", action="store_true", help="only the per-sample gradient comparison")
    ap.add_argument("--threads", type=int, default=0, help="1: single-threaded XLA and torch (0: library defaults)")
    args = ap.parse_args(argv)
    if args.threads == 1:  # must happen before JAX initialises its CPU backend
        os.environ["XLA_FLAGS"] = (
            os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
        )
    import jax
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)

    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"CPU ({os.cpu_count()} cores, load average {load}): jax {jax.__version__} ({len(jax.devices())} device), "
          f"torch {torch.__version__} ({torch.get_num_threads()} threads)")
    print(f"batch {args.batch} x seq {args.seq}, AdamW, clip 1.0, fp32; median of {args.steps} steps after 2 warm-up")
    print(f"{'train step':<20}{'JAX ms':>9}{'torch ms':>10}{'JAX tok/s':>11}{'torch tok/s':>12}"
          f"{'JAX/torch wall':>16}{'JAX/torch CPU':>15}")
    tokens = args.batch * args.seq
    for name in [] if args.skip_train else args.config or ["tiny", "small"]:
        cfg = _config(name)
        for method in ("full", "lora"):
            (jw, jc) = jax_train_step_s(cfg, method, args.batch, args.seq, args.steps)
            (tw, tc) = torch_train_step_s(cfg, method, args.batch, args.seq, args.steps)
            label = f"{name} llama {method}"
            print(f"{label:<20}{jw * 1e3:>9.1f}{tw * 1e3:>10.1f}{tokens / jw:>11.0f}{tokens / tw:>12.0f}"
                  f"{tw / jw:>15.2f}x{tc / jc:>14.2f}x")

    cfg = _config("tiny")
    (vw, vc), (lw, lc), diff = per_sample_grads_s(cfg, args.samples, 64, repeats=5, chunk=args.chunk)
    tw, tc = torch_per_sample_loop_s(cfg, args.samples, 64, repeats=5)
    print()
    print(f"per-sample grad norms, tiny llama, {args.samples} samples <= 64 tokens, vmap chunk {args.chunk}")
    print(f"{'baseline':<34}{'vmap ms':>9}{'base ms':>9}{'speed-up wall':>15}{'speed-up CPU':>14}{'max rel diff':>14}")
    print(f"{'loop of jitted JAX single grads':<34}{vw * 1e3:>9.1f}{lw * 1e3:>9.1f}{lw / vw:>14.1f}x{lc / vc:>13.1f}x"
          f"{diff:>14.1e}")
    print(f"{'loop of torch backward per sample':<34}{vw * 1e3:>9.1f}{tw * 1e3:>9.1f}{tw / vw:>14.1f}x{tc / vc:>13.1f}x"
          f"{'-':>14}")

if __name__ == "__main__":
    main()
