"""Compare the planner's memory engine with the traced truth table, row by row.

    python -m tools.memory_table                 # every row, then median / worst |error|
    python -m tools.memory_table --model gemma   # rows whose model id contains this

Truth: tests/data/memory_truth.json (peak live tensor bytes of real HF training steps, traced by
tools/truth). Prediction: `aegis.planning.memory.estimate` for the same configuration, `tensor_bytes` (the
tensor-level peak — CUDA context and allocator overhead are added on top only for device totals).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from aegis.models.resolve import resolve_model
from aegis.planning.memory import estimate
from aegis.schema import LoRAConfig, ModelProfile, StackProfile, TrainConfig

TABLE = Path(__file__).resolve().parents[1] / "tests" / "data" / "memory_truth.json"


def profile_of(row: dict[str, Any]) -> ModelProfile:
    """The profile of the model a row traced: a bundled model, or a reference config (`tools.truth.build.REFERENCE`)."""
    from tools.truth.build import REFERENCE, config_path

    model_id = row["model_id"]
    return resolve_model(str(config_path(model_id)) if model_id.startswith(REFERENCE) else model_id)


def load_rows(path: Path = TABLE) -> list[dict[str, Any]]:
    return json.loads(path.read_text(encoding="utf-8"))["rows"]


def stack_of(row: dict[str, Any]) -> StackProfile:
    """The stack a truth row traced: trainer imitated, transformers version, k-bit prep, checkpointing variant, AdamW.
    Rows traced before these keys existed are HF Trainer, transformers 5.23.0, k-bit prep, non-reentrant."""
    return StackProfile(
        trainer=row.get("trainer", "hf"),
        transformers_version=row.get("transformers_version", "5.23.0"),
        kbit_prep=row.get("kbit_prep", True),
        checkpointing=row.get("checkpointing", "non_reentrant"),
        adamw="fused" if row["optimizer"] == "adamw_fused" else "foreach",
    )


def config_of(row: dict[str, Any]) -> TrainConfig:
    """The TrainConfig a truth row traced."""
    lora = None
    if row["method"] != "full":
        lora = LoRAConfig(
            rank=row["lora_rank"], alpha=row["lora_alpha"], target_modules=tuple(row["lora_targets"]),
            dropout=row.get("lora_dropout") or 0.0,
        )
    return TrainConfig(
        method=row["method"], micro_batch_size=row["micro_batch_size"], seq_len=row["seq_len"],
        gradient_checkpointing=row["gradient_checkpointing"], attention=row["attention"],
        precision=row["precision"], optimizer="adamw", lora=lora,
        autocast=bool(row.get("autocast")) and row["precision"] == "bf16", stack=stack_of(row),  # mixed: always
    )


def stack_label(row: dict[str, Any]) -> str:
    """Short stack column: trainer, transformers version, and what differs from the defaults."""
    parts = [row.get("trainer", "hf"), row.get("transformers_version", "5.23.0")]
    if row.get("lora_dropout"):
        parts.append(f"drop{row['lora_dropout']:g}")
    if not row.get("kbit_prep", True):
        parts.append("nokbit")
    if row["gradient_checkpointing"] and row.get("checkpointing") == "reentrant":
        parts.append("reentrant")
    return " ".join(parts)


def unmodelled_reason(row: dict[str, Any]) -> str | None:
    """Why the engine does not (yet) model a traced configuration; None when it does."""
    return None


def compare(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for row in rows:
        est = estimate(profile_of(row), config_of(row))
        truth = row["peak_bytes"]
        out.append({
            "model": row["model_id"].split("/")[-1], "method": row["method"], "precision": row["precision"],
            "b": row["micro_batch_size"], "s": row["seq_len"], "ckpt": row["gradient_checkpointing"],
            "attn": row["attention"], "stack": stack_label(row), "truth": truth, "predicted": est.tensor_bytes,
            "error": (est.tensor_bytes - truth) / truth, "truth_phase": row["peak_phase"], "phase": est.peak_phase,
            "unmodelled": unmodelled_reason(row), "key": row["key"],
        })
    return out


def render(results: list[dict[str, Any]]) -> str:
    head = f"{'model':<20} {'method':<6} {'prec':<10} {'b':>2} {'seq':>5} {'ckpt':<4} {'attn':<5} {'stack':<26} {'truth GiB':>10} {'pred GiB':>9} {'error':>7}  peak (truth / engine)"
    lines = [head, "-" * len(head)]
    for r in results:
        lines.append(
            f"{r['model']:<20} {r['method']:<6} {r['precision']:<10} {r['b']:>2} {r['s']:>5} {'on' if r['ckpt'] else 'off':<4} "
            f"{r['attn']:<5} {r['stack']:<26} {r['truth'] / 2**30:>10.2f} {r['predicted'] / 2**30:>9.2f} {r['error']:>+7.2%}  "
            f"{r['truth_phase']} / {r['phase']}" + ("  * not modelled" if r["unmodelled"] else "")
        )
    modelled = [r for r in results if not r["unmodelled"]]
    lines.append("-" * len(head))
    for name, group in (("modelled rows", modelled), ("all rows", results)):
        errors = [abs(r["error"]) for r in group]
        if errors:
            lines.append(f"{name} {len(errors)} | median |error| {statistics.median(errors):.2%} | worst {max(errors):.2%} "
                         f"| models {len({r['model'] for r in group})}")
    for reason in sorted({r["unmodelled"] for r in results if r["unmodelled"]}):
        lines.append(f"* {reason}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.memory_table", description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="", help="only rows whose model id contains this")
    args = parser.parse_args(argv)
    rows = [r for r in load_rows() if args.model.lower() in r["model_id"].lower()]
    print(render(compare(rows)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
