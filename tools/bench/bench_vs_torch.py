"""The JAX engine against transformers + PEFT on the same model, batch, precision and threads, in one run.

Both sides train the same Llama-shaped config with random weights on the same token batch: AdamW, clip
1.0, full fine-tuning, LoRA or QLoRA (rank 16, alpha 32, all linear layers, no dropout; QLoRA's base is NF4 with
double quantisation, bitsandbytes' ``Linear4bit`` on the torch side, the rest of the model in the compute dtype on
both sides). The engine runs as a
run does: a :class:`aegis.train.loop.Trainer` (the one step builder, its mesh, packing and prefetch),
``train(n)`` yielding a step at a time. The torch side is what a user would otherwise run: HF's
``LlamaForCausalLM`` with SDPA attention (flash-attention 2 where installed and on a GPU), PEFT's
``get_peft_model`` for LoRA, ``torch.optim.AdamW``, ``clip_grad_norm_``; ``--torch-loop trainer`` steps
it through ``transformers.Trainer.training_step`` and the Trainer's own optimizer instead.

Timing: rounds alternate (engine, torch, engine, ...); each turn pauses so the other library's worker
threads go quiet, runs ``--settle`` untimed steps, then ``--per-round`` timed ones; the table reports
medians of wall and CPU time. Peak memory: the device allocator's peak on a GPU (for a run's first method: the
counter never resets), else the compiled step's memory analysis (arguments + outputs - donated + temporaries),
on torch:CPU the bytes of params,
gradients and optimizer state plus the step's peak of live allocations (the profiler's memory events).
Host memory: the engine's ``reuse_host_memory()`` runs before JAX starts, as in a Trainer run (``--host-memory
default`` leaves glibc's settings, under which XLA:CPU maps its step temporaries afresh every step); both sides
run under the same settings.

    python -m tools.bench.bench_vs_torch --threads 1 --rounds 5                 # 25M llama, 256 tokens, batch 4
    python -m tools.bench.bench_vs_torch --preset llama-1b --precision bf16 --seq 2048 --batch 4   # on a GPU
    python -m tools.bench.bench_vs_torch --preset llama-8b --method qlora --precision bf16 --seq 2048 --batch 2

On a GPU each row also gives MFU (the planner's model FLOPs per token, `aegis.planning.throughput`, times tokens/s over
the catalog's dense peak for the detected GPU) for both sides; ``--json PATH`` writes the rows with their conditions.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import numpy as np

from tools.bench.bench_engine import side_by_side

PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {},
    "small": {"hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 4, "num_attention_heads": 8,
              "num_key_value_heads": 4, "head_dim": 32, "vocab_size": 2048},
    # ~25M parameters (22.4M in matmuls): the reviewer's CPU bar
    "25m": {"hidden_size": 512, "intermediate_size": 1408, "num_hidden_layers": 6, "num_attention_heads": 8,
            "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 6144, "tie_word_embeddings": False},
    "llama-1b": {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
                 "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 128256, "tie_word_embeddings": True,
                 "max_position_embeddings": 131072, "rope_theta": 500000.0},
    "llama-8b": {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
                 "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 128256, "tie_word_embeddings": False,
                 "max_position_embeddings": 131072, "rope_theta": 500000.0},
}


def model_config(preset: str) -> dict[str, Any]:
    from aegis.data import tiny_llama_config

    return {**tiny_llama_config(), "max_position_embeddings": 4096, **PRESETS[preset]}


def token_rows(vocab: int, batch: int, seq: int, seed: int = 0) -> np.ndarray:
    """``[batch, seq + 1]`` random token ids: each row one full-length example (the same on both sides)."""
    return np.random.default_rng(seed).integers(0, vocab, size=(batch, seq + 1), dtype=np.int32)


def train_config(method: str, batch: int, seq: int, precision: str) -> Any:
    """The run configuration both sides train (the engine's ``TrainConfig``; the FLOPs behind MFU count it)."""
    from aegis.schema import LoRAConfig, TrainConfig

    return TrainConfig(method=method, micro_batch_size=batch, seq_len=seq, precision=precision,
                       lora=LoRAConfig(rank=16, alpha=32, dropout=0.0) if method != "full" else None)


def engine_side(cfg: dict, method: str, rows: np.ndarray, precision: str,
                device_peak: bool = True) -> tuple[Any, Any, float, int]:
    """(one step, the trainer, its compile seconds, its peak bytes): the engine as a run drives it. ``device_peak``:
    read the device allocator's peak (on a GPU), which only the process's first trainer may: the counter never goes
    down (on the H200 a LoRA row after a full one read the full row's 41.6 GB); otherwise XLA's memory analysis."""
    import jax
    from aegis.train.benchmark import _memory_dict
    from aegis.train.data import Example
    from aegis.train.loop import Trainer
    from aegis.train.step import OptimizerSettings

    batch, width = rows.shape
    examples = [Example(f"row-{i}", "bench", r, np.ones(width, bool)) for i, r in enumerate(rows)]
    tc = train_config(method, batch, width - 1, precision)
    trainer = Trainer(cfg, tc, examples, optimizer=OptimizerSettings(learning_rate=1e-4, clip_norm=1.0),
                      devices=jax.devices()[:1])
    t0 = time.perf_counter()
    next(iter(trainer.train(1)))
    compile_s = time.perf_counter() - t0
    device = trainer.devices[0]
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    if device_peak and stats and stats.get("peak_bytes_in_use"):
        peak = int(stats["peak_bytes_in_use"])
    else:
        arrays = trainer._device_batch(trainer.last_batch)
        peak = _memory_dict(trainer._step.lower(trainer.state, trainer.frozen, arrays).compile())["peak_bytes"]

    def run() -> None:
        for _ in trainer.train(1):
            pass
        jax.block_until_ready(trainer.state)  # the optimizer update too, not only the metrics the step yields

    return run, trainer, compile_s, peak


def _quantize_linears(model: Any, dtype: Any) -> int:
    """Every ``nn.Linear`` of the decoder layers replaced by bitsandbytes' NF4 ``Linear4bit`` (double quantisation,
    ``compute_dtype`` ``dtype``: what ``from_pretrained(quantization_config=BitsAndBytesConfig(load_in_4bit=True,
    bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True))`` builds), quantised on the weights' device; the
    embeddings, norms and ``lm_head`` stay as they are. Returns the number of layers replaced."""
    import bitsandbytes as bnb
    import torch

    count = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if not isinstance(child, torch.nn.Linear) or name == "lm_head":
                continue
            q = bnb.nn.Linear4bit(child.in_features, child.out_features, bias=child.bias is not None,
                                  compute_dtype=dtype, compress_statistics=True, quant_type="nf4", device="meta")
            q.weight = bnb.nn.Params4bit(child.weight.data, requires_grad=False, compress_statistics=True,
                                         quant_type="nf4").to(child.weight.device)
            if child.bias is not None:
                q.bias = torch.nn.Parameter(child.bias.data, requires_grad=False)
            setattr(parent, name, q)
            count += 1
    return count


def torch_side(cfg: dict, method: str, rows: np.ndarray, precision: str, loop: str) -> tuple[Any, Any]:
    """(one step, a function measuring its peak bytes): transformers + PEFT with SDPA (or flash-attention 2)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cuda = torch.cuda.is_available()
    dev = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    attn = "sdpa"
    if cuda and precision == "bf16":
        try:
            import flash_attn  # noqa: F401

            attn = "flash_attention_2"
        except ImportError:
            pass
    torch.manual_seed(0)
    hf_cfg = {k: v for k, v in cfg.items() if k not in ("architectures", "model_type", "torch_dtype")}
    with torch.device(dev):  # built where it trains (an 8B model's random init on a CPU takes minutes)
        model = LlamaForCausalLM(LlamaConfig(**hf_cfg, attn_implementation=attn)).to(dtype)
    if method == "qlora":
        _quantize_linears(model, dtype)
        if cuda:
            torch.cuda.empty_cache()
    if method != "full":
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", lora_dropout=0.0))
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    ids = torch.from_numpy(np.ascontiguousarray(rows[:, :-1])).long().to(dev)
    labels = torch.from_numpy(np.ascontiguousarray(rows[:, 1:])).long().to(dev)

    def loss_of(m: Any) -> Any:
        logits = m(input_ids=ids).logits
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1))

    if loop == "trainer":
        from transformers import Trainer, TrainingArguments

        args = TrainingArguments(output_dir="/tmp/bench_vs_torch", learning_rate=1e-4, weight_decay=0.0,
                                 max_grad_norm=1.0, report_to=[], bf16=precision == "bf16", use_cpu=not cuda)
        hf = Trainer(model=model, args=args, compute_loss_func=lambda out, lab, num_items_in_batch=None: (
            torch.nn.functional.cross_entropy(out.logits.reshape(-1, out.logits.shape[-1]).float(), lab.reshape(-1))))
        hf.create_optimizer_and_scheduler(num_training_steps=10_000)
        opt = hf.optimizer

        def step() -> None:
            hf.training_step(hf.model, {"input_ids": ids, "labels": labels})
            hf.accelerator.clip_grad_norm_(params, 1.0)
            opt.step()
            hf.lr_scheduler.step()
            hf.model.zero_grad(set_to_none=True)
    else:
        opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.0)

        def step() -> None:
            loss_of(model).backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)

    def run() -> None:
        step()
        if cuda:
            torch.cuda.synchronize()

    def peak() -> int:
        if cuda:
            torch.cuda.reset_peak_memory_stats()
            run()
            return int(torch.cuda.max_memory_allocated())
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            run()
        live = top = 0
        for ev in sorted(prof.events(), key=lambda e: e.time_range.start):  # each op's own allocations, frees
            live += ev.self_cpu_memory_usage
            top = max(top, live)
        state = sum(t.numel() * t.element_size() for p in model.parameters() for t in (p, p.grad) if t is not None)
        state += sum(v.numel() * v.element_size() for s in opt.state.values() for v in s.values()
                     if torch.is_tensor(v))
        return int(state + top)

    return run, peak


def _mfu(tokens_per_s: float, cfg: dict, tc: Any, gpu_id: str) -> float | None:
    """The MFU ``tokens_per_s`` means for ``tc`` on catalog GPU ``gpu_id`` (None off a GPU the catalog knows)."""
    from aegis.models.profiles import profile_from_config
    from aegis.planning.throughput import model_flops_utilisation
    from aegis.train.benchmark import _gpu

    gpu = _gpu(gpu_id)
    if gpu is None:
        return None
    profile = profile_from_config(dict(cfg), model_id="bench", source="path")
    return model_flops_utilisation(tokens_per_s, profile, tc, gpu)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", choices=list(PRESETS), default="25m", help="model size (Llama-shaped)")
    ap.add_argument("--method", action="append", choices=["full", "lora", "qlora"],
                    help="repeatable (default: full and lora)")
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds (medians are reported)")
    ap.add_argument("--per-round", type=int, default=2, help="timed steps per side per round")
    ap.add_argument("--settle", type=int, default=1, help="untimed steps per side per round")
    ap.add_argument("--pause", type=float, default=0.5, help="seconds of quiet before each turn")
    ap.add_argument("--threads", type=int, default=0, help="pin to this many cores (XLA's pool and torch follow)")
    ap.add_argument("--torch-loop", choices=["plain", "trainer"], default="plain",
                    help="plain: a torch + PEFT loop; trainer: transformers.Trainer.training_step and its optimizer")
    ap.add_argument("--host-memory", choices=["reuse", "default"], default="reuse",
                    help="reuse: the engine's reuse_host_memory() before JAX starts, as a Trainer run does; "
                         "default: glibc's own settings (XLA:CPU maps its step temporaries afresh every step)")
    ap.add_argument("--json", metavar="PATH", help="also write the rows and their conditions here (rewritten per row)")
    args = ap.parse_args(argv)
    if args.threads:  # before JAX sizes its CPU pool (from the affinity mask) and torch its OpenMP team
        os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[: args.threads]))
    # on a GPU both libraries share the device: JAX's pool takes under half of it (its default is 75%)
    os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.45")
    from aegis.train.step import reuse_host_memory

    reused = reuse_host_memory() if args.host_memory == "reuse" else False
    import jax
    import torch

    from aegis.planning.stack import installed_versions
    from aegis.train.benchmark import detect_gpu_id

    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = model_config(args.preset)
    rows = token_rows(cfg["vocab_size"], args.batch, args.seq)
    device = jax.devices()[0]
    gpu_id = detect_gpu_id(device)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    versions = installed_versions(("jax", "jaxlib", "torch", "transformers", "peft", "bitsandbytes", "flash_attn"))
    attn = "flash_attention_2" if "flash_attn" in versions and device.platform == "gpu" else "sdpa"
    conditions = {
        "device": device.device_kind, "gpu_id": gpu_id, "versions": versions, "preset": args.preset,
        "model_config": cfg, "batch": args.batch, "seq": args.seq,
        "precision": args.precision, "optimizer": "AdamW, clip 1.0", "torch_loop": args.torch_loop,
        "torch_attention": attn, "rounds": args.rounds, "per_round": args.per_round, "settle": args.settle,
        "date": time.strftime("%Y-%m-%d"),
    }
    print(f"{device.device_kind} (load {load}); jax {jax.__version__}, torch {torch.__version__} "
          f"({torch.get_num_threads()} threads); preset {args.preset}, batch {args.batch} x seq {args.seq}, "
          f"{args.precision}, AdamW, clip 1.0; torch side {args.torch_loop} loop, {attn}; {args.rounds} alternating "
          f"rounds of {args.per_round} steps, medians; host memory {'reused' if reused else 'glibc default'}")
    print(f"{'method':<7}{'engine tok/s':>13}{'torch tok/s':>12}{'ratio wall':>11}{'ratio CPU':>10}"
          f"{'engine MFU':>11}{'torch MFU':>10}{'engine peak MB':>15}{'torch peak MB':>14}{'compile s':>10}")
    tokens = args.batch * args.seq
    results: list[dict[str, Any]] = []
    for i, method in enumerate(args.method or ["full", "lora"]):
        tc = train_config(method, args.batch, args.seq, args.precision)
        engine, trainer, compile_s, engine_peak = engine_side(cfg, method, rows, args.precision, device_peak=i == 0)
        torch_run, torch_peak = torch_side(cfg, method, rows, args.precision, args.torch_loop)
        torch_run()
        (ew, ec), (tw, tc_s) = side_by_side([engine, torch_run], args.rounds, args.per_round, warmup=0,
                                            settle=args.settle, pause=args.pause)
        e_mfu, t_mfu = _mfu(tokens / ew, cfg, tc, gpu_id), _mfu(tokens / tw, cfg, tc, gpu_id)
        t_peak = torch_peak()
        pct = lambda x: f"{x:.1%}" if x is not None else "-"  # noqa: E731
        print(f"{method:<7}{tokens / ew:>13.0f}{tokens / tw:>12.0f}{tw / ew:>10.2f}x{tc_s / ec:>9.2f}x"
              f"{pct(e_mfu):>11}{pct(t_mfu):>10}{engine_peak / 2**20:>15.0f}{t_peak / 2**20:>14.0f}{compile_s:>10.1f}",
              flush=True)
        results.append({"method": method, "engine_tokens_per_s": tokens / ew, "torch_tokens_per_s": tokens / tw,
                        "ratio_wall": tw / ew, "ratio_cpu": tc_s / ec, "engine_mfu": e_mfu, "torch_mfu": t_mfu,
                        "engine_peak_bytes": engine_peak, "torch_peak_bytes": t_peak, "engine_compile_s": compile_s,
                        "engine_step_s": ew, "torch_step_s": tw})
        if args.json:
            with open(args.json, "w") as fh:
                json.dump({**conditions, "rows": results}, fh, indent=1)
        del trainer, engine, torch_run, torch_peak
        import gc

        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
