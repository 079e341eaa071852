"""Trace a DDP training step on CPU (real tensors, a one-process gloo group) with its allocation stream recorded.

    python -m tools.truth.ddp --write      # trace GRID, store tests/data/ddp_truth.json
    python -m tools.truth.ddp --show       # traced allocated / reserved against the planner's DDP replay

The model is `tools.truth.model.build_model`'s (full: bf16 weights, grads and AdamW states; LoRA: bf16 base, fp32
adapters under bf16 autocast), wrapped in `DistributedDataParallel` as the HF Trainer wraps it
(``find_unused_parameters`` = not gradient checkpointing for a `PreTrainedModel`, True for a PEFT model;
``gradient_as_bucket_view`` and the bucket caps at their defaults), on a gloo group of one process over a `HashStore`.
DDP's buckets are the same for any world size: flat buffers of the trainable parameters' dtype (the first up to
1 MiB, the rest up to 25 MiB, in reverse parameter order), allocated when DDP wraps the model and alive for the run.
The all-reduce (gloo here, NCCL on a GPU) is in place on the bucket, and the bucket is copied back into the existing
``.grad``: it makes no allocation of its own on any stream.

Each storage's allocation and free is recorded by `tools.truth.stream.StreamLiveBytes` from the model's build on, and
the whole stream is replayed through `aegis.planning.memory.allocator` (one stream: DDP allocates on the default
stream). Two steps (forward with labels, backward, clip, AdamW foreach step, zero_grad), as `tools.truth.trace`. Each
row also holds the same step traced without DDP (``one_gpu_*``), so a row separates what DDP adds from what the one-GPU
stream (`aegis.planning.memory.device.allocation_stream`) misses by itself.
"""

from __future__ import annotations

import argparse
import contextlib
import json
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[2]
TABLE = REPO / "tests" / "data" / "ddp_truth.json"
CONFIGS = REPO / "tests" / "data" / "sharded_configs.json"
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
WIDE = {"model_type": "llama", "hidden_size": 512, "intermediate_size": 1376, "num_hidden_layers": 4,
        "num_attention_heads": 8, "num_key_value_heads": 4, "vocab_size": 8192, "max_position_embeddings": 512,
        "tie_word_embeddings": False}
"""A tiny Llama whose weights outweigh a short step's activations: where DDP's buckets move the reserved peak."""
GRID = [  # (name, config (None: sharded_configs.json's family), method, micro batch, seq_len, gradient checkpointing)
    ("llama", None, "full", 1, 256, False),
    ("llama", None, "full", 1, 256, True),
    ("llama", None, "lora", 1, 256, False),
    ("llama-wide", WIDE, "full", 1, 64, False),
    ("llama-wide", WIDE, "full", 1, 64, True),
    ("llama-wide", WIDE, "lora", 2, 256, False),
]
GIB = 1 << 30


def _setup(method: str, micro_batch_size: int, seq_len: int, gc: bool):
    from tools.truth.setup import TraceSetup

    return TraceSetup(method=method, micro_batch_size=micro_batch_size, seq_len=seq_len, lora_rank=16, lora_alpha=32,
                      lora_targets=TARGETS, gradient_checkpointing=gc, autocast=method != "full")


def trace_ddp(config: dict[str, Any], method: str, micro_batch_size: int, seq_len: int, gc: bool) -> dict[str, Any]:
    """Two DDP steps of ``config``: the traced stream's replayed allocated and reserved peaks and DDP's buckets."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from transformers import PreTrainedModel

    from aegis.planning.memory.allocator import replay
    from tools.truth.model import build_model
    from tools.truth.patches import cuda_dropout, unpadded_inputs
    from tools.truth.stream import StreamLiveBytes, as_loaded, trace_stream
    from tools.truth.trace import _import_outside_modes, _param_groups

    setup = _setup(method, micro_batch_size, seq_len, gc)
    _import_outside_modes(config)
    torch.manual_seed(0)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    tracker = StreamLiveBytes()
    try:
        with unpadded_inputs(), cuda_dropout(), tracker:
            inner = build_model(config, setup).model
            built = len(tracker.events)
            find_unused = not gc if isinstance(inner, PreTrainedModel) else True  # Trainer._wrap_model
            model = DistributedDataParallel(inner, find_unused_parameters=find_unused)
            wrapped = tracker.events[built:]
            data = model._get_ddp_logging_data()
            buckets = [int(x) for x in str(data["bucket_sizes"]).split(",") if x]
            optimizer = torch.optim.AdamW(_param_groups(inner), lr=5e-5, foreach=True)
            vocab = inner.get_input_embeddings().num_embeddings
            shape = (micro_batch_size, seq_len)
            ids = torch.randint(0, vocab, shape, dtype=torch.long)
            batch = {"input_ids": ids, "attention_mask": torch.ones(shape, dtype=torch.long), "labels": ids.clone()}
            trainable = [p for p in model.parameters() if p.requires_grad]
            autocast = torch.autocast("cpu", dtype=torch.bfloat16) if setup.autocast else contextlib.nullcontext()
            for _ in range(2):
                with autocast:
                    loss = model(**batch).loss
                loss.backward()
                del loss
                torch.nn.utils.clip_grad_norm_(trainable, 1.0, foreach=True)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            rebuilt = model._get_ddp_logging_data().get("rebuilt_bucket_sizes")
            del model, inner, optimizer, trainable
    finally:
        dist.destroy_process_group()
    stats = replay(as_loaded(tracker.events, built))  # without the from_config build's freed blocks
    one_tracker = trace_stream(config, setup, fake=False)[1]  # the same step without DDP
    one = replay(as_loaded(one_tracker.events, one_tracker.reset_at))
    return {
        "config": config, "method": method, "micro_batch_size": micro_batch_size, "seq_len": seq_len,
        "gradient_checkpointing": gc, "find_unused_parameters": find_unused, "steps": 2,
        "bucket_bytes": buckets,
        "rebuilt_bucket_bytes": [int(x) for x in str(rebuilt or "").split(",") if x],
        "wrap_allocations": [e[2] for e in wrapped if e[0] == "alloc"],
        "traced_peak_bytes": tracker.peak_bytes,
        "traced_max_allocated_bytes": stats.max_allocated_bytes,
        "traced_max_reserved_bytes": stats.max_reserved_bytes,
        "traced_events": len(tracker.events),
        "one_gpu_max_allocated_bytes": one.max_allocated_bytes,
        "one_gpu_max_reserved_bytes": one.max_reserved_bytes,
    }


def planned_estimate(row: dict[str, Any], ddp: bool = True) -> tuple[Any, Any]:
    """(profile, the planner's estimate) for ``row`` on the traced stack (with ``ddp=False``: one GPU)."""
    from aegis.models.profiles import profile_from_config
    from aegis.planning.memory.estimate import estimate_memory
    from aegis.schema import LoRAConfig, StackProfile

    profile = profile_from_config(row["config"], model_id=f"tiny-{row['name']}", source="path")
    lora = LoRAConfig(rank=16, alpha=32, target_modules=TARGETS) if row["method"] != "full" else None
    est = estimate_memory(profile, method=row["method"], micro_batch_size=row["micro_batch_size"],
                          seq_len=row["seq_len"], precision="bf16", lora=lora, ddp=ddp,
                          gradient_checkpointing=row["gradient_checkpointing"], autocast=row["method"] != "full",
                          stack=StackProfile(adamw="foreach"))  # the traced AdamW: foreach, as on CUDA
    return profile, est


def planned(row: dict[str, Any], ddp: bool = True) -> tuple[int, int, int]:
    """(estimate's tensor peak, replayed allocated, replayed reserved) of the planner's DDP stream for ``row`` (with
    ``ddp=False`` its one-GPU stream)."""
    from aegis.planning.memory.allocator import replay
    from aegis.planning.memory.device import allocation_stream
    from aegis.planning.memory.multi_gpu import ddp_allocation_stream

    profile, est = planned_estimate(row, ddp)
    stream = ddp_allocation_stream if ddp else allocation_stream
    stats = replay(stream(profile, est.config))
    return est.tensor_bytes, stats.max_allocated_bytes, stats.max_reserved_bytes


def show(rows: list[dict[str, Any]]) -> str:
    """Traced DDP allocated / reserved against the planner's, and the one-GPU step's reserved error beside it."""
    mib = 1 << 20
    lines = [f"{'row':<26} | {'traced alloc':>12} {'reserved':>8} | {'planned alloc':>13} {'reserved':>8} {'err':>7} "
             f"| {'one GPU: traced':>15} {'planned':>7} {'err':>7}"]
    for r in rows:
        _, alloc, res = planned(r)
        one = planned(r, ddp=False)[2]
        gc = " gc" if r["gradient_checkpointing"] else ""
        name = f"{r['name']} {r['method']} b{r['micro_batch_size']} s{r['seq_len']}{gc}"
        traced_alloc, traced_res = r["traced_max_allocated_bytes"], r["traced_max_reserved_bytes"]
        lines.append(f"{name:<26} | {traced_alloc / mib:>12.2f} {traced_res / mib:>8.2f}"
                     f" | {alloc / mib:>13.2f} {res / mib:>8.2f} {res / r['traced_max_reserved_bytes'] - 1:>+7.2%} "
                     f"| {r['one_gpu_max_reserved_bytes'] / mib:>15.2f} {one / mib:>7.2f} "
                     f"{one / r['one_gpu_max_reserved_bytes'] - 1:>+7.2%}")
    return "\n".join(lines + ["MiB; err: planned / traced - 1"])


def main(argv: list[str] | None = None) -> int:
    import warnings

    parser = argparse.ArgumentParser(prog="python -m tools.truth.ddp", description=__doc__.split("\n")[0])
    parser.add_argument("--write", action="store_true", help="trace GRID and store the rows")
    parser.add_argument("--show", action="store_true", help="print the stored rows against the planner")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    configs = json.loads(CONFIGS.read_text(encoding="utf-8"))
    if args.write:
        rows = [{"name": name, **trace_ddp(config or configs[name], m, b, s, gc)} for name, config, m, b, s, gc in GRID]
        TABLE.write_text(json.dumps({"description": __doc__.split("\n")[0], "torch": torch.__version__,
                                     "rows": rows}, indent=1) + "\n", encoding="utf-8")
    rows = json.loads(TABLE.read_text(encoding="utf-8"))["rows"]
    print(show(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
