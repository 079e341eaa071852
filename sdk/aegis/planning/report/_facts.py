"""The facts a report states, computed once per plan: every section, renderer and chart reads them here.

Where two sections name the same thing -- the adapters' dtype, the optimizer states' dtype, the batch,
the predicted total and the headroom -- they print the same `PlanFacts` field, so they cannot disagree.
The dtypes come from the memory engine's own placement (`aegis.planning.memory._dtypes.placement`), the one
function that also sizes those tensors.

    from aegis.planning.report._facts import plan_facts
    facts = plan_facts(report)
    facts.adapter_dtype, facts.optimizer_dtype, facts.batch.effective, facts.memory.total_bytes
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from aegis.planning.memory._dtypes import dtype_name, placement
from aegis.schema import PlanReport, Tier, TrainConfig

__all__ = ["BatchFacts", "MemoryFacts", "PlanFacts", "batch_facts", "dtype_facts", "memory_facts", "plan_facts",
           "breakdown_tier", "tiers"]

_EIGHT_BIT = ("adamw_8bit", "paged_adamw_8bit")


@dataclass(frozen=True)
class BatchFacts:
    """Micro batch, accumulation and the effective batch (across every GPU) of one configuration."""

    micro: int
    accum: int
    gpus: int

    @property
    def effective(self) -> int:
        return self.micro * self.accum * self.gpus


@dataclass(frozen=True)
class MemoryFacts:
    """One tier's predicted memory and the budget its headroom is measured against."""

    total_bytes: int
    low_bytes: int
    high_bytes: int
    margin_bytes: int
    headroom_bytes: int
    budget_bytes: int
    budget_label: str
    """'total' when the estimate includes the runtime overhead (headroom = total - high), else 'usable'."""
    verdict: str
    """'comfortable', 'tight' or 'does not fit' (`aegis.planning.report.format.headroom_verdict`)."""
    reserved_bytes: int | None = None
    """The caching allocator's predicted reserved peak (None where not computed)."""
    device_bytes: int | None = None
    """Reserved + the CUDA context and workspaces: what the device shows."""

    @property
    def share(self) -> float:
        """High end as a share of the budget."""
        return self.high_bytes / self.budget_bytes if self.budget_bytes else 0.0


@dataclass(frozen=True)
class DtypeFacts:
    """Where each tensor of a configuration lives (the memory engine's placement, in words)."""

    base: str
    """'NF4', 'bf16' or 'fp32'."""
    adapters: str | None
    """LoRA adapters' dtype; None for full fine-tuning."""
    gradients: str
    optimizer: str
    """Optimizer states: 'fp32', 'bf16', '8-bit', 'none' (SGD) or 'factored fp32' (Adafactor)."""
    activations: str
    """The residual stream's dtype (matmuls under autocast run in bf16/fp16 whatever it is)."""


@dataclass(frozen=True)
class PlanFacts:
    """Everything several sections of one report state."""

    tier: Tier | None
    """The tier the breakdown shows (`breakdown_tier`)."""
    dtypes: DtypeFacts
    batch: BatchFacts | None
    memory: MemoryFacts | None

    @property
    def adapter_dtype(self) -> str | None:
        return self.dtypes.adapters

    @property
    def optimizer_dtype(self) -> str:
        return self.dtypes.optimizer


def tiers(report: PlanReport) -> list[Tier]:
    """Recommended, aggressive and every fallback, in that order (absent ones skipped)."""
    out = [t for t in (report.recommended, report.aggressive) if t is not None]
    return out + list(report.fallbacks)


def breakdown_tier(report: PlanReport) -> Tier | None:
    """The tier whose memory the breakdown (and the chart) shows: the recommended one, else the smallest tier that
    does not fit. A report whose decision is "nothing fits" never shows a tier that fits (with headroom), so no
    section can say "comfortable" or "short by" a negative amount beside it; the solver leaves such a report no
    fitting tier (`aegis.planning.solver.solve`), and one read from an older plan.json gets no breakdown."""
    if report.recommended is not None:
        return report.recommended
    candidates = [t for t in tiers(report) if t.headroom_bytes < 0]
    return min(candidates, key=lambda t: t.memory.total_bytes) if candidates else None


def dtype_facts(cfg: TrainConfig) -> DtypeFacts:
    """The dtypes of a configuration's base weights, adapters, gradients, optimizer states and matmuls."""
    place = placement(cfg)
    base = "NF4" if cfg.method == "qlora" else dtype_name(place.base_bytes, cfg)
    adapters = None if cfg.method == "full" else dtype_name(place.adapter_bytes, cfg)
    trainable = place.base_bytes if cfg.method == "full" else place.adapter_bytes
    if cfg.optimizer in _EIGHT_BIT:
        optimizer = "8-bit"
    elif cfg.optimizer == "sgd":
        optimizer = "none"
    elif cfg.optimizer == "adafactor":
        optimizer = "factored fp32"
    else:
        optimizer = dtype_name(place.state_bytes, cfg)
    return DtypeFacts(base=base, adapters=adapters, gradients=dtype_name(trainable, cfg), optimizer=optimizer,
                      activations=dtype_name(place.stream_bytes, cfg))


def batch_facts(report: PlanReport, cfg: TrainConfig) -> BatchFacts:
    return BatchFacts(micro=cfg.micro_batch_size, accum=cfg.gradient_accumulation_steps, gpus=report.gpu_count)


def memory_facts(report: PlanReport, tier: Tier) -> MemoryFacts:
    from aegis.planning.report.format import headroom_verdict

    mem = tier.memory
    if tier.headroom_bytes == report.gpu.memory_bytes - mem.high_bytes:
        budget, label = report.gpu.memory_bytes, "total"
    else:
        budget, label = report.usable_bytes, "usable"
    return MemoryFacts(
        total_bytes=mem.total_bytes, low_bytes=mem.low_bytes, high_bytes=mem.high_bytes,
        margin_bytes=mem.dynamic_margin_bytes, headroom_bytes=tier.headroom_bytes, budget_bytes=budget,
        budget_label=label, verdict=headroom_verdict(tier.headroom_bytes, report.gpu),
        reserved_bytes=mem.reserved_bytes, device_bytes=mem.device_bytes,
    )


def plan_facts(report: PlanReport) -> PlanFacts:
    """The facts of ``report``'s breakdown tier (all None when no tier was sized)."""
    tier = breakdown_tier(report)
    if tier is None:
        lora = None if report.method == "full" else report.lora
        return PlanFacts(tier=None, dtypes=dtype_facts(TrainConfig(method=report.method, lora=lora)), batch=None,
                         memory=None)
    dtypes = dtype_facts(tier.config)
    if report.multi_gpu is not None and report.multi_gpu.assumed == "deepspeed":
        # DeepSpeed's bf16 (`aegis.planning.memory.zero_stages`): the engine casts the module, adapters included, to
        # bf16; the optimizer steps an fp32 master partition with fp32 states
        dtypes = replace(dtypes, adapters="bf16" if dtypes.adapters else None, gradients="bf16",
                         optimizer="fp32" if dtypes.optimizer in ("bf16", "fp32") else dtypes.optimizer)
    return PlanFacts(tier=tier, dtypes=dtypes, batch=batch_facts(report, tier.config),
                     memory=memory_facts(report, tier))
