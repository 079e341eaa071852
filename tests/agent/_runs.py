"""Shared by the agent and app tests: a fast run template and the XLA compile cache they share."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

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


def enable_compile_cache(config: Any) -> Path:
    """Reuse compiled train programs across tests, workers and sessions (same folder as tests/supervise)."""
    import jax

    provider = getattr(config, "cache", None)
    cache = (
        Path(str(provider.mkdir("aegis-jax-compile")))
        if provider
        else Path(tempfile.gettempdir()) / "aegis-jax-compile"
    )
    jax.config.update("jax_compilation_cache_dir", str(cache))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    return cache
