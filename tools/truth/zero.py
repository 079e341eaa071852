"""Trace rank 0 of a DeepSpeed ZeRO-2 / ZeRO-3 training step on CPU: tiny real tensors, a fake process group.

    from tools.truth.zero import ZeroSetup, trace_zero
    row = trace_zero(config_dict, ZeroSetup(method="lora", stage=3), world_size=8)

DeepSpeed flattens, narrows and re-points ``param.data`` in ways fake tensors do not follow, so the step runs on real
CPU tensors of the tiny configs (tests/data/sharded_configs.json) in one process: torch's ``fake`` process group
(`FakeStore`, rank 0 of ``world_size``; every collective returns at once, shapes right, values not) is what
``deepspeed.init_distributed`` finds, and DeepSpeed picks its CPU accelerator. Rank 0's live storage bytes are
counted as `tools.truth.sharded` counts them (`ShardedLiveBytes`: 512-byte blocks, storage resizes followed), less
``meta`` tensors (ZeRO-2 builds meta copies of every parameter to size its groups: no device memory).

What runs is what the HF Trainer (transformers 4.45-5, accelerate) runs under ``--deepspeed`` with ``bf16=True`` and
the ZeRO configs HF documents (``ds_config_zero2.json`` / ``ds_config_zero3.json``), with its "auto" values resolved
for the model (`transformers.integrations.deepspeed.HfTrainerDeepSpeedConfig.trainer_config_finalize`):
``reduce_bucket_size`` = hidden², ``stage3_prefetch_bucket_size`` = 0.9 hidden², ``stage3_param_persistence_threshold``
= 10 hidden; ``gradient_clipping`` 1.0 (``max_grad_norm``). The Trainer builds its own AdamW (torch, foreach, the two
weight-decay groups of ``Trainer.create_optimizer``) and hands it to ``deepspeed.initialize`` (no ``optimizer``
section: ``zero_allow_untested_optimizer``). The model is built in bf16 (LoRA: PEFT's adapters, which the engine
casts to bf16 with the rest); no autocast (accelerate leaves mixed precision to DeepSpeed). Two steps of
``engine(**batch).loss``, ``engine.backward(loss)``, ``engine.step()`` (what ``accelerator.backward`` does).

QLoRA is sharded as TRL/axolotl shard it (`tools.truth.sharded`): NF4 without k-bit preparation, the packed weights
viewed as bf16 (``bnb_4bit_quant_storage=torch.bfloat16``), so ZeRO-3 partitions them like any bf16 parameter while
each ``Linear4bit`` keeps its quantisation state (absmax, code book: not parameters) whole.

Gradient checkpointing (``--gradient-checkpointing``) is what the Trainer's ``gradient_checkpointing=True`` does with
TRL's ``use_reentrant=False``: ``gradient_checkpointing_enable`` on the model before PEFT wraps it and DeepSpeed
partitions it (which also calls ``enable_input_require_grads``); the recompute in backward runs each layer's forward
again, so ZeRO-3 gathers its parameters again.

Reserved memory: the tracer also records rank 0's allocation stream and replays the steps through the allocator
model, as `tools.truth.sharded` does (``traced_max_reserved_bytes``). DeepSpeed's CPU accelerator has no streams, so
the stream is one stream's (``traced_streams`` 1): a lower bound of a GPU's, where ZeRO-2's reduction stream and
ZeRO-3's all-gather stream keep their blocks apart. Rows traced before this carry no reserved figure.

Regenerate the rows (tests/data/zero_truth.json):

    python -m tools.truth.zero --write          # every row of GRID; --only llama, --stage 3 to filter
    python -m tools.truth.zero --write --gradient-checkpointing --only qwen2   # the checkpointed rows
    python -m tools.truth.zero --show           # the stored rows against the planner
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict

from tools.truth.setup import DEFAULT_LORA_TARGETS
from tools.truth.sharded import (
    CONFIGS,
    LORA_TARGETS,
    ShardedStreamLiveBytes,
    _bf16_quant_storage,
    replayed,
    write_table,
)

ROOT = Path(__file__).resolve().parents[2]
TABLE = ROOT / "tests" / "data" / "zero_truth.json"


class ZeroSetup(BaseModel):
    """One ZeRO step to trace (rank 0's view)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    method: Literal["full", "lora", "qlora"]
    stage: Literal[2, 3]
    micro_batch_size: int = 1
    seq_len: int = 256
    lora_rank: int = 16
    lora_targets: tuple[str, ...] = DEFAULT_LORA_TARGETS
    steps: int = 2
    max_reuse_distance: int = int(1e9)
    """``stage3_max_reuse_distance``: HF's 1e9 keeps every layer of a tiny model gathered from its forward to its
    backward; a smaller one makes the tiny model release layers as a 7-70B model does."""
    max_live_parameters: int = int(1e9)
    """``stage3_max_live_parameters``: HF's 1e9 is more than a tiny model; a smaller one caps what is gathered."""
    gradient_checkpointing: bool = False
    """HF Trainer's ``gradient_checkpointing=True`` with ``use_reentrant=False`` (what TRL sets):
    ``model.gradient_checkpointing_enable`` before PEFT wraps it and DeepSpeed partitions it."""


def zero_config(stage: int, hidden_size: int, world_size: int, micro_batch_size: int,
                max_reuse_distance: int = int(1e9), max_live_parameters: int = int(1e9)) -> dict[str, Any]:
    """HF's documented ZeRO-2/3 config (docs/source/en/deepspeed.md) with the Trainer's "auto" values resolved."""
    zero: dict[str, Any] = {"stage": stage, "overlap_comm": True, "contiguous_gradients": True,
                            "reduce_bucket_size": hidden_size * hidden_size}
    if stage == 2:
        zero.update(allgather_partitions=True, allgather_bucket_size=int(2e8), reduce_scatter=True)
    else:
        zero.update(sub_group_size=int(1e9), stage3_prefetch_bucket_size=int(0.9 * hidden_size * hidden_size),
                    stage3_param_persistence_threshold=10 * hidden_size, stage3_max_live_parameters=max_live_parameters,
                    stage3_max_reuse_distance=max_reuse_distance, stage3_gather_16bit_weights_on_model_save=True)
    return {"bf16": {"enabled": True}, "zero_optimization": zero, "gradient_clipping": 1.0,
            "train_micro_batch_size_per_gpu": micro_batch_size, "gradient_accumulation_steps": 1,
            "train_batch_size": micro_batch_size * world_size, "zero_allow_untested_optimizer": True,
            "steps_per_print": 10**9, "wall_clock_breakdown": False}


class _DeviceBytes(ShardedStreamLiveBytes):
    """`ShardedStreamLiveBytes` less meta tensors, which hold no memory. The allocation stream it records is one
    stream's: DeepSpeed's CPU accelerator has no streams (``Stream`` is None, ``stream(s)`` a no-op), so ZeRO-2's
    reduction stream and ZeRO-3's all-gather stream (``overlap_comm``) are not seen; on a GPU their blocks sit in
    their own pools, so the replayed ``traced_max_reserved_bytes`` is a lower bound there."""

    def _track(self, t: torch.Tensor) -> None:
        if t.device.type == "meta":
            return
        super()._track(t)


def _run(config: dict[str, Any], setup: ZeroSetup, ds_config: dict[str, Any]) -> dict[str, Any]:
    import deepspeed

    from tools.truth.model import build_model
    from tools.truth.setup import TraceSetup
    from tools.truth.trace import _param_groups

    start = time.perf_counter()
    torch.manual_seed(0)
    tracker = _DeviceBytes(record_origin=True)
    qlora = setup.method == "qlora"
    trace = TraceSetup(method=setup.method, micro_batch_size=setup.micro_batch_size, seq_len=setup.seq_len,
                       lora_rank=setup.lora_rank, lora_alpha=2 * setup.lora_rank, lora_targets=setup.lora_targets,
                       autocast=False, kbit_prep=not qlora, trainer="peft" if qlora else "hf",
                       gradient_checkpointing=setup.gradient_checkpointing, checkpointing="non_reentrant")
    with tracker:
        model = build_model(config, trace).model
        if qlora:
            _bf16_quant_storage(model)
        optimizer = torch.optim.AdamW(_param_groups(model), lr=5e-5, foreach=True)
        engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config)
        del model, optimizer
        vocab = engine.module.get_input_embeddings().num_embeddings
        shape = (setup.micro_batch_size, setup.seq_len)
        ids = torch.randint(0, vocab, shape, dtype=torch.long)
        batch = {"input_ids": ids, "attention_mask": torch.ones(shape, dtype=torch.long), "labels": ids.clone()}
        after_setup = tracker.total_bytes
        tracker.reset_peak()
        phase_peaks: dict[str, int] = {}
        for _ in range(setup.steps):
            tracker.phase_peaks = {}
            tracker.phase("forward")
            loss = engine(**batch).loss
            tracker.phase("backward")
            engine.backward(loss)
            del loss
            tracker.phase("step")
            engine.step()
            tracker.phase("idle")
            for name, value in tracker.phase_peaks.items():
                if name != "idle":
                    phase_peaks[name] = max(phase_peaks.get(name, 0), value)
        live: dict[str, int] = {}
        tracker.peak_breakdown()
        for key, size in tracker.peak_snapshot.items():
            phase, op, shp, dtype = tracker.peak_origin.get(key, ("setup", "?", (), "?"))
            name = f"{phase} {op} {list(shp)} {dtype}"
            live[name] = live.get(name, 0) + size
        engine.destroy()
    return {"peak_bytes": tracker.peak_bytes, "peak_phase": tracker.peak_phase, "phase_peak_bytes": phase_peaks,
            "after_setup_bytes": after_setup, "trace_seconds": round(time.perf_counter() - start, 2), **replayed(tracker),
            "peak_live": dict(sorted(live.items(), key=lambda kv: -kv[1])[:int(os.environ.get("ZERO_TRUTH_TOP", "16"))])}


def trace_zero(config: dict[str, Any], setup: ZeroSetup, world_size: int) -> dict[str, Any]:
    """Rank 0's peak (and the 16 largest live groups at it) for ``setup`` on ``world_size`` ranks."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE=str(world_size), LOCAL_WORLD_SIZE=str(world_size),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT="29517")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        import deepspeed

        deepspeed.init_distributed()
        ds_config = zero_config(setup.stage, config["hidden_size"], world_size, setup.micro_batch_size,
                                setup.max_reuse_distance, setup.max_live_parameters)
        out = _run(config, setup, ds_config)
        out["ds_config"] = ds_config
        return out
    finally:
        dist.destroy_process_group()


def versions() -> dict[str, str]:
    import deepspeed

    from tools.truth.sharded import versions as base

    return {**base(), "deepspeed": deepspeed.__version__}


GRID = {
    "families": ("llama", "qwen2", "mistral", "phi3", "gpt_neox"),
    "methods": ("full", "lora", "qlora"),
    "stages": (2, 3),
    "world_sizes": (2, 8),
    "micro_batch_size": 1,
    "seq_len": 256,
}


def _trace_apart(family: str, setup: ZeroSetup, world_size: int) -> dict[str, Any]:
    """`trace_zero` in a fresh interpreter: DeepSpeed keeps its process groups in module globals, which a second
    ``init_process_group`` in the same process does not replace."""
    import subprocess
    import sys

    arg = json.dumps({"family": family, "world_size": world_size, "setup": setup.model_dump()})
    done = subprocess.run([sys.executable, "-m", "tools.truth.zero", "--one", arg], cwd=ROOT, capture_output=True,
                          text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"tracing {arg} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def row_key(row: dict[str, Any]) -> tuple:
    return (row["family"], row["method"], row["stage"], row["world_size"], row["micro_batch_size"], row["seq_len"],
            row["lora_rank"], tuple(row["lora_targets"]), row.get("max_reuse_distance", int(1e9)),
            row.get("max_live_parameters", int(1e9)), row.get("gradient_checkpointing", False))


def _write(rows: list[dict[str, Any]]) -> None:
    write_table(TABLE, rows, row_key, "rank 0's traced peak of DeepSpeed ZeRO training steps (tools/truth/zero.py)",
                versions(), GRID)


def build_rows(only: str | None = None, stage: int | None = None, method: str | None = None,
               world_size: int | None = None, write: bool = False, max_reuse_distance: int = int(1e9),
               max_live_parameters: int = int(1e9), gradient_checkpointing: bool = False) -> list[dict[str, Any]]:
    rows = []
    for family in GRID["families"]:
        if only and only not in family:
            continue
        for how in GRID["methods"]:
            for st in GRID["stages"]:
                for ws in GRID["world_sizes"]:
                    if (method and how != method) or (stage and st != stage) or (world_size and ws != world_size):
                        continue
                    setup = ZeroSetup(method=how, stage=st, lora_targets=LORA_TARGETS.get(family, DEFAULT_LORA_TARGETS),
                                      micro_batch_size=GRID["micro_batch_size"], seq_len=GRID["seq_len"],
                                      max_reuse_distance=max_reuse_distance,
                                      max_live_parameters=max_live_parameters,
                                      gradient_checkpointing=gradient_checkpointing)
                    traced = _trace_apart(family, setup, ws)
                    row = {"family": family, "world_size": ws, **setup.model_dump(), **traced}
                    print(f"{family:<8} {how:<5} zero{st} ws{ws}{' ckpt' if gradient_checkpointing else ''}: "
                          f"{traced['peak_bytes']:,} B "
                          f"({traced['peak_phase']}, {traced['trace_seconds']} s)", flush=True)
                    rows.append(row)
                    if write:
                        _write([row])
    return rows


def planned_bytes(row: dict[str, Any], configs: dict[str, Any], **overrides: Any) -> int:
    """The planner's rank-0 tensor peak for a row (`aegis.estimate_memory` with ``zero_stage`` and ``fsdp_shards``
    = world size, the row's ZeRO buckets); ``overrides`` go to `estimate_memory`."""
    from aegis.models.profiles import profile_from_config
    from aegis.planning.memory.estimate import estimate_memory
    from aegis.planning.memory.zero_stages import ZeroBuckets
    from aegis.schema import LoRAConfig, StackProfile

    profile = profile_from_config(configs[row["family"]], model_id=f"tiny-{row['family']}", source="path")
    lora = None
    if row["method"] != "full":
        lora = LoRAConfig(rank=row["lora_rank"], alpha=2 * row["lora_rank"], target_modules=tuple(row["lora_targets"]))
    zero = row["ds_config"]["zero_optimization"]
    buckets = ZeroBuckets(reduce_bucket_size=zero["reduce_bucket_size"],
                          prefetch_bucket_size=zero.get("stage3_prefetch_bucket_size", 0),
                          persistence_threshold=zero.get("stage3_param_persistence_threshold", 0),
                          max_reuse_distance=zero.get("stage3_max_reuse_distance", int(1e9)),
                          max_live_parameters=zero.get("stage3_max_live_parameters", int(1e9)))
    kwargs = {"method": row["method"], "micro_batch_size": row["micro_batch_size"], "seq_len": row["seq_len"],
              "precision": "bf16", "lora": lora, "fsdp_shards": row["world_size"], "zero_stage": row["stage"],
              "zero_buckets": buckets, "autocast": False, "gradient_checkpointing": row.get("gradient_checkpointing", False), "stack": StackProfile(kbit_prep=False) if row["method"] == "qlora" else None,
              **overrides}
    return estimate_memory(profile, **kwargs).tensor_bytes


def show() -> str:
    """The truth table: traced rank-0 peak against the planner's, per row."""
    configs = json.loads(CONFIGS.read_text(encoding="utf-8"))
    lines = [f"{'family':<8} {'method':<6} {'stage':>5} {'ws':>2} {'ckpt':>4} {'traced B':>12} {'planned B':>12} "
             f"{'error':>7}"]
    for row in json.loads(TABLE.read_text(encoding="utf-8"))["rows"]:
        plan = planned_bytes(row, configs)
        lines.append(f"{row['family']:<8} {row['method']:<6} {row['stage']:>5} {row['world_size']:>2} "
                     f"{'on' if row.get('gradient_checkpointing') else 'off':>4} "
                     f"{row['peak_bytes']:>12,} {plan:>12,} {(plan - row['peak_bytes']) / row['peak_bytes']:>+7.2%}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", help="families whose name contains this")
    parser.add_argument("--stage", type=int, choices=(2, 3), help="only this ZeRO stage")
    parser.add_argument("--method", choices=("full", "lora", "qlora"), help="only this method")
    parser.add_argument("--world-size", type=int, choices=(2, 8), help="only this world size")
    parser.add_argument("--max-reuse-distance", type=int, default=int(1e9),
                        help="stage3_max_reuse_distance (HF's 1e9 keeps every tiny layer gathered)")
    parser.add_argument("--max-live-parameters", type=int, default=int(1e9),
                        help="stage3_max_live_parameters (HF's 1e9 is more than a tiny model)")
    parser.add_argument("--gradient-checkpointing", action="store_true",
                        help="HF Trainer's gradient_checkpointing=True (use_reentrant=False, as TRL sets)")
    parser.add_argument("--write", action="store_true",
                        help=f"write each row into {TABLE.relative_to(ROOT)} as it is traced (replacing the same setup)")
    parser.add_argument("--show", action="store_true", help="print the stored rows against the planner")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # one row, as JSON on the last line (used by build_rows)
    args = parser.parse_args(argv)
    if args.one:
        spec = json.loads(args.one)
        configs = json.loads(CONFIGS.read_text(encoding="utf-8"))
        print(json.dumps(trace_zero(configs[spec["family"]], ZeroSetup(**spec["setup"]), spec["world_size"])))
        return
    if args.show:
        print(show())
        return
    build_rows(args.only, args.stage, args.method, args.world_size, write=args.write,
               max_reuse_distance=args.max_reuse_distance, max_live_parameters=args.max_live_parameters,
               gradient_checkpointing=args.gradient_checkpointing)


if __name__ == "__main__":
    main()
