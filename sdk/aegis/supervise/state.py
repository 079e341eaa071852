"""Run state: the small, serialisable record the LangGraph supervisor persists after every node.

Arrays never live here — only paths, ids and small numbers (spec §8). The graph keeps the state
as JSON under one key (``{"run": RunState.model_dump(mode="json")}``) so SQLite checkpoints hold
plain data; nodes validate it back into :class:`RunState` and return an updated copy.

    state = RunState.new("run-1", lr=1e-3, grad_clip=1.0, weights={"chat": 0.5, "prose": 0.5})
    state = state.update(step=100)          # frozen: every change is a copy
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from aegis.schema import Frozen

__all__ = [
    "StepMetrics",
    "AnomalyType",
    "RunStatus",
    "MetricsWindow",
    "Anomaly",
    "OutlierStats",
    "DiagnosisReport",
    "RepairAttempt",
    "HumanInterrupt",
    "RunState",
]

AnomalyType = Literal["loss_spike", "grad_explosion", "nan", "oom", "operator"]
"""What went wrong: a loss spike, exploding gradients, NaN/Inf, out of memory, or an operator's interrupt."""

RunStatus = Literal["running", "paused", "stopped", "completed"]
"""Lifecycle: training, waiting for a human, stopped by a human, or all steps done."""


class StepMetrics(Frozen):
    """What the supervisor keeps of one optimizer step (from the engine's StepInfo)."""

    step: int
    loss: float
    grad_norm: float
    lr: float = 0.0
    tokens_per_s: float = 0.0
    nonfinite: bool = Field(default=False, description="The engine saw NaN/Inf in loss, grads or params.")
    overflow: bool = Field(
        default=False,
        description="fp16 loss-scaler overflow: update skipped and loss scale halved (routine, not an anomaly).",
    )
    sample_ids: tuple[str, ...] = Field(default=(), description="Batch sample ids (kept for the last steps only).")
    tokens: int = Field(default=0, description="Target tokens the loss was taken over.")
    step_time_s: float = Field(default=0.0, description="Wall time of the step (the first one of a process: + compile).")
    useful_token_fraction: float = Field(
        default=1.0, description="Share of the batch's positions holding example tokens (not padding)."
    )
    loss_token_fraction: float = Field(
        default=1.0, description="Share of the batch's positions whose target is trained on."
    )
    host_wait_s: float = Field(default=0.0, description="Host time before the step that the device waited on.")


class MetricsWindow(Frozen):
    """Rolling per-step history the Monitor judges new steps against (parallel tuples)."""

    steps: tuple[int, ...] = ()
    loss_history: tuple[float, ...] = ()
    grad_norm_history: tuple[float, ...] = ()

    def extended(self, steps: list[int], losses: list[float], grad_norms: list[float], keep: int) -> "MetricsWindow":
        """History with new steps appended, trimmed to the last ``keep``."""
        return MetricsWindow(
            steps=(*self.steps, *steps)[-keep:],
            loss_history=(*self.loss_history, *losses)[-keep:],
            grad_norm_history=(*self.grad_norm_history, *grad_norms)[-keep:],
        )

    def truncated(self, last_step: int) -> "MetricsWindow":
        """History of the steps up to ``last_step`` (after a rollback)."""
        n = sum(1 for s in self.steps if s <= last_step)
        return MetricsWindow(
            steps=self.steps[:n], loss_history=self.loss_history[:n], grad_norm_history=self.grad_norm_history[:n]
        )


class Anomaly(Frozen):
    """The anomaly the Monitor (or the runner, for OOM) found."""

    type: AnomalyType
    step: int = Field(description="Optimizer step at which it was seen.")
    value: float | None = Field(default=None, description="Offending loss or grad norm (None for NaN/OOM).")
    threshold: float | None = Field(default=None, description="Threshold the value crossed.")
    detail: str = Field(default="", description="One line for humans.")
    batch_sample_ids: tuple[str, ...] = Field(default=(), description="Sample ids of the batch at that step.")
    repeat: bool = Field(default=False, description="The previous anomaly was at the same step (a retry failed again).")


class OutlierStats(Frozen):
    """Per-sample gradient-norm statistics of the analysed population."""

    median_grad_norm: float
    max_grad_norm: float
    mad_grad_norm: float = Field(description="Median absolute deviation of the grad norms.")
    median_loss: float
    max_loss: float
    num_samples: int = Field(description="Samples analysed (offending batch plus context batches).")


class DiagnosisReport(Frozen):
    """What Forensics concluded about the anomaly (the full per-sample table is in ``report_path``)."""

    batch_id: str = Field(description="'step-<n>' of the offending batch.")
    checkpoint_step: int = Field(description="Checkpoint the per-sample kernel ran on (before the anomaly).")
    verdict: Literal["outliers", "none", "ambiguous"] = Field(
        description="Samples to blame, no sample to blame (an optimisation problem), or too many to tell."
    )
    outlier_indices: tuple[int, ...] = Field(description="Indices of the outliers in the offending batch.")
    outlier_stats: OutlierStats
    suspected_samples: tuple[str, ...] = Field(description="Sample ids of the outliers.")
    report_path: str = Field(description="JSON with every analysed sample's loss and grad norm.")


class RepairAttempt(Frozen):
    """One automatic repair or operator action."""

    step: int
    strategy: Literal["blacklist", "stabilize", "skip_batch", "fallback", "escalate", "operator"]
    detail: str


class HumanInterrupt(Frozen):
    """Whether the run waits for a human, and why."""

    pending: bool = False
    reason: str | None = None
    suggested_actions: tuple[str, ...] = ()


class RunState(Frozen):
    """The supervisor's persistent state (spec §8 plus the plan tier, LR/clip and inbox cursor)."""

    run_id: str
    status: RunStatus = "running"
    step: int = Field(default=0, description="Optimizer steps completed and checkpointed-or-resumable.")
    last_checkpoint_path: str | None = None
    last_checkpoint_step: int | None = None
    metrics: MetricsWindow = Field(default_factory=MetricsWindow)
    window: tuple[StepMetrics, ...] = Field(
        default=(), description="Steps of the latest Train window (sample ids kept for its last few steps)."
    )
    anomaly: Anomaly | None = None
    diagnosis: DiagnosisReport | None = None
    repair_attempts: int = Field(
        default=0,
        description="Automatic repairs since the last clean window (a blacklist that got training past its anomaly resets it).",
    )
    last_anomaly_step: int | None = Field(default=None, description="Step of the previous anomaly.")
    repairs: tuple[RepairAttempt, ...] = Field(default=(), description="Last repairs, newest last.")
    blacklist: tuple[str, ...] = ()
    skipped: tuple[str, ...] = Field(default=(), description="Sample ids of batches skipped by `skip_batch`.")
    domain_weights: dict[str, float] = Field(default_factory=dict)
    domain_best_loss: dict[str, float] = Field(default_factory=dict, description="Best eval loss per domain.")
    last_eval_step: int = 0
    lr: float
    grad_clip: float
    fallback_tier: int = Field(default=0, description="0: the plan's config; n: fallbacks[n-1].")
    human: HumanInterrupt = Field(default_factory=HumanInterrupt)
    inbox_offset: int = Field(default=0, description="Commands of inbox.jsonl already applied.")
    interrupt_requested: bool = False
    stop_requested: bool = False
    faults_fired: tuple[str, ...] = Field(default=(), description="Injected faults already fired (fire once).")

    @classmethod
    def new(cls, run_id: str, *, lr: float, grad_clip: float, weights: dict[str, float]) -> "RunState":
        return cls(run_id=run_id, lr=lr, grad_clip=grad_clip, domain_weights=dict(weights))

    def update(self, **changes: Any) -> "RunState":
        """A validated copy with ``changes`` applied."""
        return RunState.model_validate({**self.model_dump(), **changes})

    def with_repair(self, attempt: RepairAttempt, keep: int = 20) -> "RunState":
        return self.update(repairs=(*self.repairs, attempt)[-keep:])

    @property
    def excluded_ids(self) -> tuple[str, ...]:
        """Ids the data pipeline must leave out: blacklist plus skipped batches."""
        return tuple(dict.fromkeys((*self.blacklist, *self.skipped)))
