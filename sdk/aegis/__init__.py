"""Aegis: plan a fine-tune before renting a GPU, then train it under a self-healing supervisor.

    from aegis import plan
    report = plan("qlora llama-3.1-8b on 3090")
    print(aegis.render_markdown(report))

    aegis.estimate_memory("llama-3.1-8b", method="lora", micro_batch_size=4, seq_len=1024)

Importing this package is cheap: no JAX, torch, transformers or gradio. The training engine and
the supervisor (`aegis.train`, `aegis.supervise`) import JAX when they are first used.
"""

from aegis.datasets import analyze_dataset
from aegis.errors import *  # noqa: F403
from aegis.errors import __all__ as _errors_all
from aegis.hardware import find_gpu, list_gpus
from aegis.hub import resolve_model
from aegis.memory import estimate_memory
from aegis.parse import parse_request
from aegis.planner import plan
from aegis.schema import (
    GPU,
    DatasetProfile,
    LoRAConfig,
    MemoryComponent,
    MemoryEstimate,
    ModelProfile,
    PlanReport,
    PlanRequest,
    Tier,
    TrainConfig,
)
from aegis.solver import solve

__version__ = "0.1.0"

__all__ = [
    *_errors_all,
    "GPU",
    "DatasetProfile",
    "LoRAConfig",
    "MemoryComponent",
    "MemoryEstimate",
    "ModelProfile",
    "PlanReport",
    "PlanRequest",
    "Tier",
    "TrainConfig",
    "analyze_dataset",
    "estimate_memory",
    "find_gpu",
    "list_gpus",
    "parse_request",
    "plan",
    "resolve_model",
    "solve",
]
