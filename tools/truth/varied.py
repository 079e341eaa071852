"""Real data's lengths: trace a run whose steps have different lengths, replay its allocation stream.

    python -m tools.truth.varied --build          # trace the rows of CASES, store tests/data/varied_truth.json
    python -m tools.truth.varied --show           # traced replay beside the planner's run_memory

A run over a dataset does not repeat one shape: each batch is padded to its longest row, so every step
allocates activations of another size and the caching allocator's cached blocks, split for one length,
do not fit the next; the reserved peak climbs above what two steps of one shape reserve. This traces the
same HF-Trainer steps as `trace.py` (fake tensors, the model's own loss, clipping, AdamW, zero_grad) with
the allocation stream recorded (`tools.truth.stream`), one step per length of
`aegis.planning.memory.device.run_lengths` (a seeded draw from a stated length sample, then one step at the
longest), and replays the stream through `aegis.planning.memory.allocator` step after step, plain and with
expandable segments. The planner's `aegis.planning.memory.device.run_memory` writes its own stream for the same
lengths; tests/planning/memory/test_varied_lengths.py holds it within 5% of the traced replay.

How the lengths reach the model: `trace._run` builds one batch of ``setup.seq_len``; here the model's
``forward`` is wrapped to replace it, at each call, by a fresh batch of the next length (input ids,
attention mask and labels allocated inside the step, as a collator's batch moved to the device is).

The model as loaded (`as_loaded`): the trace builds the model with ``AutoModelForCausalLM.from_config`` on the
(fake) device, which allocates a tied head's weight and frees it when the weights are tied (Llama-3.2-1B: a
501 MiB block). ``from_pretrained`` never does: it builds on the meta device under ``no_tie_weights``
(transformers ``PreTrainedModel.get_init_context``) and loads each weight into place. Kept in the stream,
that freed block stays cached and the steps' activations and logits are carved out of it (the 11% the
default allocator's replay differed by, with the same step streams on both sides). So the stream replayed
allocates the tensors live when the steps begin once, in their build order, and drops the build's
temporaries, as the planner's setup does; ``max_reserved_from_config_bytes`` keeps the replay of the
stream as traced.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

REPO = Path(__file__).resolve().parents[2]
TABLE = REPO / "tests" / "data" / "varied_truth.json"
GIB = 1 << 30

LENGTH_SAMPLE_SEED = 7
"""Seed of the stated length sample (`length_sample`)."""


def length_sample(n: int = 400, median: int = 600, sigma: float = 0.8, seed: int = LENGTH_SAMPLE_SEED) -> list[int]:
    """A stated length distribution: ``n`` log-normal row lengths around ``median`` tokens (chat/instruction data's
    long right tail), seeded."""
    import math

    rng = random.Random(seed)
    return [max(2, int(rng.lognormvariate(math.log(median), sigma))) for _ in range(n)]


CASES: list[dict[str, Any]] = [
    {"model_id": "meta-llama/Llama-3.2-1B", "method": "lora", "micro_batch_size": 1, "seq_len": 2048},
    {"model_id": "meta-llama/Llama-3.2-1B", "method": "lora", "micro_batch_size": 4, "seq_len": 1024},
    {"model_id": "Qwen/Qwen2.5-0.5B", "method": "full", "micro_batch_size": 2, "seq_len": 2048},
    {"model_id": "Qwen/Qwen2.5-1.5B", "method": "qlora", "micro_batch_size": 2, "seq_len": 1024, "gc": True},
]
"""Rows traced: LoRA batch 1 and 4, full, QLoRA with checkpointing (families Llama and Qwen2)."""


def case_key(case: dict[str, Any]) -> str:
    return (f"{case['model_id']}|{case['method']}|b{case['micro_batch_size']}|s{case['seq_len']}"
            f"|gc{int(case.get('gc', False))}|steps{case.get('steps', 16)}|seed{case.get('seed', 0)}")


def setup_of(case: dict[str, Any]):
    """HF Trainer's step with bf16=True (autocast on, as the planner's default stack has it), one step per length."""
    from tools.truth.setup import TraceSetup

    return TraceSetup(method=case["method"], micro_batch_size=case["micro_batch_size"], seq_len=case["seq_len"],
                      gradient_checkpointing=bool(case.get("gc")), autocast=True, steps=len(lengths_of(case)))


def lengths_of(case: dict[str, Any]) -> tuple[int, ...]:
    from aegis.planning.memory.device import RUN_SEED, RUN_STEPS, run_lengths

    return run_lengths(length_sample(), case["seq_len"], case["micro_batch_size"],
                       steps=case.get("steps", RUN_STEPS), seed=case.get("seed", RUN_SEED))


@contextmanager
def _varied_batches(lengths: tuple[int, ...]):
    """`trace._run`'s model, whose forward trains on a batch of the next length at each call."""
    import torch

    from tools.truth import trace as trace_module

    build = trace_module.build_model
    queue = list(lengths)

    def build_varied(config, setup):
        prepared = build(config, setup)
        model = prepared.model
        forward = model.forward
        vocab = model.get_input_embeddings().num_embeddings

        def forward_varied(**kwargs):
            seq = queue.pop(0)
            shape = (setup.micro_batch_size, seq)
            ids = torch.randint(0, vocab, shape, dtype=torch.long)
            kwargs.update(input_ids=ids, attention_mask=torch.ones(shape, dtype=torch.long), labels=ids.clone())
            return forward(**kwargs)

        model.forward = forward_varied
        return prepared

    with mock.patch.object(trace_module, "build_model", build_varied):
        yield
    if queue:
        raise RuntimeError(f"{len(queue)} lengths were not trained: the trace ran fewer steps than lengths")


def trace_case(case: dict[str, Any]) -> dict[str, Any]:
    """Trace ``case``'s run of varied lengths and replay its stream as loaded (`as_loaded`; plain and expandable
    segments), and as traced."""
    import warnings

    from aegis.planning.memory.allocator import replay
    from tools.truth.build import config_path
    from tools.truth.stream import as_loaded, trace_stream

    warnings.filterwarnings("ignore")
    lengths = lengths_of(case)
    with _varied_batches(lengths):
        result, tracker = trace_stream(str(config_path(case["model_id"])), setup_of(case))
    events = as_loaded(tracker.events, tracker.reset_at)
    plain = replay(events)
    expandable = replay(events, expandable_segments=True)
    return {
        "key": case_key(case), **case, "lengths": list(lengths),
        "traced_peak_bytes": result.peak_bytes,
        "max_allocated_bytes": plain.max_allocated_bytes,
        "max_reserved_bytes": plain.max_reserved_bytes,
        "max_reserved_expandable_bytes": expandable.max_reserved_bytes,
        "max_reserved_from_config_bytes": replay(tracker.events).max_reserved_bytes,
        "replay": "as-loaded",
        "events": len(events),
        "transformers_version": result.transformers_version,
        "date": dt.date.today().isoformat(),
    }


def row_of(case: dict[str, Any]) -> dict[str, Any]:
    """``case`` as a truth row of memory_truth.json's shape, for `tools.memory_table`'s profile and config."""
    from tools.truth.setup import DEFAULT_LORA_TARGETS

    return {"model_id": case["model_id"], "method": case["method"], "micro_batch_size": case["micro_batch_size"],
            "seq_len": case["seq_len"], "gradient_checkpointing": bool(case.get("gc")), "attention": "sdpa",
            "precision": "bf16", "optimizer": "adamw_foreach", "autocast": True, "lora_rank": 16, "lora_alpha": 32,
            "lora_targets": list(DEFAULT_LORA_TARGETS), "transformers_version": case.get("transformers_version", "5.23.0")}


def config_of(case: dict[str, Any]):
    """The planner's profile and TrainConfig for the configuration ``case`` traced."""
    from tools.memory_table import config_of as row_config, profile_of

    row = row_of(case)
    return profile_of(row), row_config(row)


def compare(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    from aegis.planning.memory.device import run_memory

    out = []
    for row in rows:
        profile, cfg = config_of(row)
        rm = run_memory(profile, cfg, row["lengths"])
        out.append({
            "key": row["key"], "traced": row["max_reserved_bytes"], "traced_expandable": row["max_reserved_expandable_bytes"],
            "traced_allocated": row["max_allocated_bytes"],
            "planned": rm.run.max_reserved_bytes, "planned_expandable": rm.run_expandable.max_reserved_bytes,
            "planned_fixed": rm.fixed.max_reserved_bytes,
            "error": rm.run.max_reserved_bytes / row["max_reserved_bytes"] - 1,
            "error_expandable": rm.run_expandable.max_reserved_bytes / row["max_reserved_expandable_bytes"] - 1,
        })
    return out


def render(results: list[dict[str, Any]]) -> str:
    head = (f"{'row':<44} | {'traced alloc':>12} {'reserved':>9} | {'planned':>8} {'err':>7} | {'2 steps@max':>11} | "
            f"{'expandable: traced':>18} {'planned':>8} {'err':>7}")
    lines = [head, "-" * len(head)]
    for r in results:
        lines.append(
            f"{r['key'][:44]:<44} | {r['traced_allocated'] / GIB:>12.2f} {r['traced'] / GIB:>9.2f} | "
            f"{r['planned'] / GIB:>8.2f} {r['error']:>+7.2%} | {r['planned_fixed'] / GIB:>11.2f} | "
            f"{r['traced_expandable'] / GIB:>18.2f} {r['planned_expandable'] / GIB:>8.2f} {r['error_expandable']:>+7.2%}")
    return "\n".join(lines)


def load(path: Path = TABLE) -> list[dict[str, Any]]:
    return json.loads(path.read_text(encoding="utf-8"))["rows"] if path.exists() else []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.truth.varied", description=__doc__.split("\n")[0])
    parser.add_argument("--build", action="store_true", help="trace the CASES missing from the table")
    parser.add_argument("--show", action="store_true", help="print the comparison")
    args = parser.parse_args(argv)
    rows = {r["key"]: r for r in load()}
    if args.build:
        for case in CASES:
            if rows.get(case_key(case), {}).get("replay") == "as-loaded":
                continue
            rows[case_key(case)] = trace_case(case)
            print(case_key(case), file=sys.stderr)
            TABLE.write_text(json.dumps({"description": __doc__.split("\n")[0], "length_sample": {
                "kind": "log-normal", "n": 400, "median": 600, "sigma": 0.8, "seed": LENGTH_SAMPLE_SEED},
                "rows": list(rows.values())}, indent=1) + "\n", encoding="utf-8")
    print(render(compare(list(rows.values()))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
