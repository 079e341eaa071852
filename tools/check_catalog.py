"""Check the bundled model configs against transformers and published parameter counts.

Every ``sdk/aegis/catalog/models/*.json`` listed in ``models.json`` is loaded into the
transformers config class of its ``model_type``, the model is built on the meta device
(no memory, no download), and its parameter count is compared with the count the
publisher reports (safetensors metadata / model card). A config with a wrong size,
vocabulary or tie flag shows up as a ratio other than 1.0000. Anything transformers
logs or warns while reading a config is printed under the table.

    python tools/check_catalog.py            # table; exit status 1 on any mismatch
    python tools/check_catalog.py --only qwen  # ids containing "qwen"

Needs torch and transformers (test/tools dependencies, not needed by the planner).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

CATALOG_DIR = Path(__file__).resolve().parents[1] / "sdk" / "aegis" / "catalog"

# Parameter counts as published: the safetensors "total" the Hugging Face Hub shows for the
# repository (tied embeddings counted once) or the exact figure in the model card. They are the
# reference this tool checks the vendored configs against, not an output of Aegis.
PUBLISHED_PARAMS: dict[str, int] = {
    "meta-llama/Llama-3.1-8B": 8_030_261_248,
    "meta-llama/Llama-3.1-70B": 70_553_706_496,
    "meta-llama/Llama-3.2-1B": 1_235_814_400,
    "meta-llama/Llama-3.2-3B": 3_212_749_824,
    "Qwen/Qwen2.5-0.5B": 494_032_768,
    "Qwen/Qwen2.5-1.5B": 1_543_714_304,
    "Qwen/Qwen2.5-7B": 7_615_616_512,
    "Qwen/Qwen2.5-14B": 14_770_033_664,
    "Qwen/Qwen2.5-32B": 32_763_876_352,
    "Qwen/Qwen2.5-72B": 72_706_203_648,
    "Qwen/Qwen3-0.6B": 596_049_920,
    "Qwen/Qwen3-8B": 8_190_735_360,
    "mistralai/Mistral-7B-v0.3": 7_248_023_552,
    "microsoft/Phi-3-mini-4k-instruct": 3_821_079_552,
    "google/gemma-2-2b": 2_614_341_888,
    "google/gemma-2-9b": 9_241_705_984,
    "google/gemma-3-1b-pt": 999_885_952,
    "mistralai/Mixtral-8x7B-v0.1": 46_702_792_704,
    "Qwen/Qwen1.5-MoE-A2.7B": 14_315_784_192,
    "Qwen/Qwen3-30B-A3B": 30_532_122_624,
}


@dataclass(frozen=True)
class Row:
    """One checked model."""

    model_id: str
    architecture: str
    params: int
    published: int | None
    messages: tuple[str, ...]

    @property
    def ratio(self) -> float | None:
        return None if self.published is None else self.params / self.published


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def count_params(config_dict: dict) -> tuple[str, int, tuple[str, ...]]:
    """Build the model of ``config_dict`` on the meta device; return (class name, params, warnings)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    handler = _Collect()
    tf_logger = logging.getLogger("transformers")
    tf_logger.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            cfg = dict(config_dict)
            model_type = cfg.pop("model_type")
            cfg.pop("auto_map", None)  # remote-code pointers: the native class is used instead
            config = AutoConfig.for_model(model_type, **cfg)
            with torch.device("meta"):
                model = AutoModelForCausalLM.from_config(config)
    finally:
        tf_logger.removeHandler(handler)
    params = sum(p.numel() for p in model.parameters())
    messages = tuple(handler.messages) + tuple(str(w.message) for w in caught)
    return type(model).__name__, params, messages


def check(only: str | None = None) -> list[Row]:
    """Check every indexed model (optionally only ids containing ``only``)."""
    index = json.loads((CATALOG_DIR / "models.json").read_text())
    rows = []
    for entry in index:
        if only and only.lower() not in entry["id"].lower():
            continue
        config_dict = json.loads((CATALOG_DIR / "models" / entry["file"]).read_text())
        arch, params, messages = count_params(config_dict)
        rows.append(Row(entry["id"], arch, params, PUBLISHED_PARAMS.get(entry["id"]), messages))
    return rows


def render(rows: list[Row]) -> str:
    """The table, then any messages transformers emitted per model."""
    head = f"{'model':36} {'class':28} {'transformers':>16} {'published':>16} {'ratio':>8}"
    lines = [head, "-" * len(head)]
    for r in rows:
        pub = f"{r.published:,}" if r.published is not None else "n/a"
        ratio = f"{r.ratio:.4f}" if r.ratio is not None else "-"
        lines.append(f"{r.model_id:36} {r.architecture:28} {r.params:>16,} {pub:>16} {ratio:>8}")
    for r in rows:
        for m in r.messages:
            lines.append(f"[{r.model_id}] {m}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="check only ids containing this text")
    args = parser.parse_args(argv)
    rows = check(args.only)
    print(render(rows))
    bad = [r.model_id for r in rows if r.published is not None and r.params != r.published]
    if bad:
        print(f"\nMISMATCH: {', '.join(bad)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
