"""Aegis: plan a fine-tune before renting a GPU, then train it under a self-healing supervisor.

    from aegis import plan
    report = plan("qlora llama-3.1-8b on 3090")

    aegis.estimate_memory("llama-3.1-8b", method="lora", micro_batch_size=4, seq_len=1024)

Importing this package is cheap: no JAX, torch, transformers or gradio. The memory engine loads
with the package; the planner, parser and dataset analyser load on first use of their names, and
the training engine and supervisor (`aegis.train`, `aegis.supervise`) import JAX when first used.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from aegis.errors import *  # noqa: F403
from aegis.errors import __all__ as _errors_all
from aegis.planning.hardware import find_gpu, list_gpus
from aegis.models.resolve import ModelMatch, match_model, resolve_model
from aegis.planning.memory import estimate_memory
from aegis.schema import (
    GPU,
    LoRAConfig,
    MemoryComponent,
    MemoryEstimate,
    ModelProfile,
    StackProfile,
    TrainConfig,
)

if TYPE_CHECKING:
    from aegis.data.profile import analyze_dataset
    from aegis.planning.parse import parse_request
    from aegis.planning.planner import plan
    from aegis.planning.solver import solve
    from aegis.forge import merge_models
    from aegis.models.source import locate_model
    from aegis.supervise import Supervisor, load_run_config
    from aegis.schema import DatasetProfile, PlanReport, PlanRequest, Tier

__version__ = "0.1.0"

_LAZY = {
    "analyze_dataset": "aegis.data.profile",
    "parse_request": "aegis.planning.parse",
    "plan": "aegis.planning.planner",
    "solve": "aegis.planning.solver",
    "Supervisor": "aegis.supervise",
    "load_run_config": "aegis.supervise",
    "locate_model": "aegis.models.source",
    "merge_models": "aegis.forge",
    "DatasetProfile": "aegis.schema",
    "PlanReport": "aegis.schema",
    "PlanRequest": "aegis.schema",
    "Tier": "aegis.schema",
}

__all__ = [
    *_errors_all,
    "GPU",
    "DatasetProfile",
    "LoRAConfig",
    "MemoryComponent",
    "MemoryEstimate",
    "ModelMatch",
    "ModelProfile",
    "PlanReport",
    "PlanRequest",
    "StackProfile",
    "Supervisor",
    "Tier",
    "TrainConfig",
    "analyze_dataset",
    "estimate_memory",
    "find_gpu",
    "list_gpus",
    "load_run_config",
    "locate_model",
    "match_model",
    "merge_models",
    "parse_request",
    "plan",
    "resolve_model",
    "solve",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'aegis' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
