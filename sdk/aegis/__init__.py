"""Aegis: plan a fine-tune before renting a GPU, then train it under a self-healing supervisor.

    import aegis
    profile = aegis.resolve_model("llama-3.1-8b")

Importing this package is cheap: no JAX, torch, transformers or gradio.
"""

from aegis.errors import *  # noqa: F403
from aegis.errors import __all__ as _errors_all
from aegis.schema import (
    GPU,
    DatasetProfile,
    LoRAConfig,
    MemoryComponent,
    MemoryEstimate,
    ModelProfile,
    PlanRequest,
    TrainConfig,
)

__version__ = "0.1.0"

__all__ = [
    *_errors_all,
    "GPU",
    "DatasetProfile",
    "LoRAConfig",
    "MemoryComponent",
    "MemoryEstimate",
    "ModelProfile",
    "PlanRequest",
    "TrainConfig",
]
