"""Shared by the agent and app tests: a fast run template (the XLA compile cache is the suite's: tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.demo_model import TINY_RUN, TOY_DATA

FAST_TEMPLATE = {
    **TINY_RUN,
    "data": TOY_DATA,
    "train_config": {"method": "full", "micro_batch_size": 8, "seq_len": 64, "precision": "fp32"},
    "training": {"steps_per_window": 10, "total_steps": 30, "lr": 3e-3, "grad_clip": 1.0, "min_lr_ratio": 1.0,
                 "warmup_steps": 0, "seed": 0},
    "monitoring": {"history_size": 50, "min_history": 10, "warmup_steps": 30},
    "checkpoints": {"interval": 10, "keep_last_n": 2},
    "curriculum": {"eval_interval": 100000},
}
"""A run the supervisor trains in seconds on a CPU once compiled (the supervisor tests' shapes)."""


def write_template(folder: Path) -> Path:
    path = folder / "run-template.yaml"
    path.write_text(yaml.safe_dump(FAST_TEMPLATE))
    return path
