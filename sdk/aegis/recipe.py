"""The one recipe: per-method training defaults that a plan does not decide, in one place.

Learning rate, warm-up, schedule, final LR ratio, gradient clip, seed, LoRA rank/alpha/dropout and the
supervisor's cadence (steps per window, checkpoint interval, evaluation interval) are data in
``aegis/models/catalog/recipe.json``, validated here. The planner (LoRA alpha = ``alpha_per_rank`` x rank), the
emitters (axolotl, HF, Unsloth), ``RunConfig`` (``aegis run``, chat, Slack), ``LoRAConfig`` and the engine's
``OptimizerSettings`` all read it, so the same plan trains with the same numbers whichever way it is run.

    from aegis.recipe import recipe, steps_for_epochs
    r = recipe()
    r.learning_rate["full"]                     # 1e-05 (LoRA/QLoRA: 2e-4)
    total = steps_for_epochs(rows=1000, epochs=3, micro_batch_size=4, accumulation=4, data_parallel=1)  # 189
    packing_choice(0.97, 0.62, 2048)            # (True, 'packing keeps 97% of tokens real vs 38% ...')
    r.warmup_steps(total)                       # 6: ceil(189 x 3%), as transformers rounds a warm-up ratio

Imports nothing heavy (json and pydantic only), so `aegis plan` stays fast.
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from importlib import resources
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["Recipe", "LoRADefaults", "Cadence", "packing_choice", "recipe", "steps_for_epochs"]

_METHODS = ("full", "lora", "qlora")


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)


class LoRADefaults(_Frozen):
    """Adapter settings a request does not give."""

    rank: int = Field(ge=1, description="Adapter rank r.")
    alpha_per_rank: float = Field(gt=0, description="lora_alpha = alpha_per_rank x rank (scale alpha / r).")
    dropout: float = Field(ge=0, lt=1, description="Dropout on the adapter input.")

    def alpha(self, rank: int) -> float:
        """The default lora_alpha of an adapter of ``rank``."""
        return self.alpha_per_rank * rank


class Cadence(_Frozen):
    """How often a supervised run stops to look, save and evaluate (optimizer steps)."""

    steps_per_window: int = Field(ge=1, description="Steps per Train window (the monitor judges each window).")
    checkpoint_interval: int = Field(ge=1, description="Save a checkpoint every this many steps (and at window ends).")
    keep_last_n: int = Field(ge=2, description="Checkpoints kept.")
    eval_interval: int = Field(ge=1, description="Evaluate every curriculum domain every this many steps.")


class Recipe(_Frozen):
    """Training defaults per method (``catalog/recipe.json``)."""

    learning_rate: dict[Literal["full", "lora", "qlora"], float] = Field(description="Peak learning rate per method.")
    lr_scheduler: Literal["cosine"] = Field(description="Decay after warm-up (transformers' lr_scheduler_type).")
    warmup_ratio: float = Field(ge=0, lt=1, description="Linear warm-up as a share of all optimizer steps.")
    min_lr_ratio: float = Field(ge=0, le=1, description="The cosine ends at this share of the peak.")
    max_grad_norm: float = Field(gt=0, description="Global gradient-norm clip.")
    seed: int = Field(description="Seed of initialisation and data order.")
    lora: LoRADefaults
    cadence: Cadence

    def lr(self, method: str) -> float:
        """The peak learning rate of ``method`` (full, lora, qlora)."""
        return self.learning_rate[method]  # type: ignore[index]

    def warmup_steps(self, total_steps: int) -> int:
        """Warm-up steps of a run of ``total_steps``: ``ceil(total x warmup_ratio)``, as transformers'
        ``TrainingArguments.get_warmup_steps`` turns the ratio the emitted scripts pass into steps."""
        return math.ceil(total_steps * self.warmup_ratio)


@lru_cache(maxsize=1)
def recipe() -> Recipe:
    """The bundled recipe (``aegis/models/catalog/recipe.json``), read once."""
    text = resources.files("aegis.models.catalog").joinpath("recipe.json").read_text(encoding="utf-8")
    data = {k: v for k, v in json.loads(text).items() if not k.startswith("_")}
    out = Recipe.model_validate(data)
    missing = [m for m in _METHODS if m not in out.learning_rate]
    if missing:
        raise ValueError(f"catalog/recipe.json has no learning_rate for {', '.join(missing)}")
    return out


def steps_for_epochs(rows: int, epochs: float, micro_batch_size: int, accumulation: int, data_parallel: int = 1) -> int:
    """Optimizer steps of ``epochs`` passes over ``rows`` with a global batch of micro x accumulation x data
    parallel: ``ceil(epochs x ceil(rows / global batch))``, transformers Trainer's ``max_steps`` for
    ``num_train_epochs`` (its ``ceil(ceil(rows / (micro x processes)) / accumulation)`` steps per epoch is
    the same number), at least 1."""
    per_epoch = max(1, math.ceil(rows / (micro_batch_size * accumulation * data_parallel)))
    return max(1, math.ceil(epochs * per_epoch))


def packing_choice(packing_efficiency: float | None, padding_waste: float | None, seq_len: int | None) -> tuple[bool, str]:
    """Whether a plan's dataset trains packed (several examples per row) and why: packing when it keeps more tokens
    real than padding each row to the longest does (the data profile's ``packing_efficiency`` vs
    ``1 - padding_waste``); no profile: padding. The emitters' ``packing`` (axolotl's ``sample_packing``) and
    ``aegis run --plan``'s ``training.packing`` both come from here, so an emitted config and a supervised run lay
    batches out alike."""
    if packing_efficiency is None or padding_waste is None or seq_len is None:
        return False, "no dataset profile: padding each batch to its longest row"
    if packing_efficiency > 1 - padding_waste:
        return True, (
            f"packing keeps {packing_efficiency:.0%} of tokens real vs {1 - padding_waste:.0%} when padding to "
            f"{round(seq_len):,}; same tokens per micro batch, so the same memory"
        )
    return False, f"padding wastes only {padding_waste:.0%} of tokens at {round(seq_len):,}"
