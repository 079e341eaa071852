"""Repair planner: from an anomaly and its diagnosis to the least damaging fix (spec §6.4).

Strategies, chosen in this order:

* **escalate** (C) — ``repair_attempts`` reached ``max_retries``, the diagnosis is ambiguous,
  the anomaly was an operator's interrupt, or an OOM with no fallback tier left;
* **fallback** — out of memory: switch to the next configuration of the plan's fallback chain;
* **blacklist** (A) — the diagnosis names outlier samples: exclude them, roll back, retry the window;
* **stabilize** (B) — no sample to blame: multiply LR and clip norm by the recovery factors, roll
  back, retry;
* **skip_batch** — the same step spiked again after stabilising, still with no sample to blame: the
  batch itself is the problem (its loss is computed before any update, so a lower LR cannot change
  it); leave its samples out, as PaLM skips the batches around a spike, roll back, retry.

Retries are counted since the last clean window, so a run never loops forever: after
``max_retries`` automatic repairs without a clean window a human is asked.

    decision = plan_repair(state, cfg, num_tiers=len(cfg.tiers))
    state = apply_repair(state, decision)
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from aegis.schema import Frozen
from aegis.supervise.run_config import RunConfig
from aegis.supervise.state import HumanInterrupt, RepairAttempt, RunState

__all__ = ["RepairDecision", "plan_repair", "apply_repair", "suggested_actions"]


class RepairDecision(Frozen):
    """What the planner decided, with the new knob values."""

    strategy: Literal["blacklist", "stabilize", "skip_batch", "fallback", "escalate"]
    reason: str
    blacklist_add: tuple[str, ...] = ()
    skip_add: tuple[str, ...] = Field(default=(), description="Sample ids of a skipped batch.")
    lr: float
    grad_clip: float
    fallback_tier: int
    rollback_to: int | None = Field(default=None, description="Checkpoint step to roll back to before retrying.")


def suggested_actions(state: RunState) -> tuple[str, ...]:
    """Commands a human could send next, most likely first. Out of memory gets none that change the LR or
    the data (they cannot free memory): `resume` retries on the current tier, `stop` ends the run to start a
    smaller one (the pause's reason says which micro batch and seq_len ran out)."""
    if state.anomaly is not None and state.anomaly.type == "oom":
        return ("resume", "stop")
    out: list[str] = []
    if state.diagnosis is not None and state.diagnosis.suspected_samples:
        out.append("blacklist_samples " + " ".join(state.diagnosis.suspected_samples[:10]))
    if state.anomaly is not None and state.anomaly.batch_sample_ids:
        out.append("skip_batch")
    out.append(f"set_lr {state.lr * 0.1:.3g}")
    out += ["resume", "stop"]
    return tuple(out)


def plan_repair(state: RunState, cfg: RunConfig, num_tiers: int) -> RepairDecision:
    """Choose the repair for ``state.anomaly`` given ``state.diagnosis`` and the retry count."""
    anomaly = state.anomaly
    keep = dict(lr=state.lr, grad_clip=state.grad_clip, fallback_tier=state.fallback_tier)
    rollback = state.diagnosis.checkpoint_step if state.diagnosis is not None else state.last_checkpoint_step
    if anomaly is None:
        return RepairDecision(strategy="escalate", reason="repair requested without an anomaly", **keep)
    if anomaly.type == "operator":
        return RepairDecision(strategy="escalate", reason="interrupt requested by an operator", **keep)
    if anomaly.type == "oom":
        rollback = state.last_checkpoint_step
    if state.repair_attempts >= cfg.recovery.max_retries:
        return RepairDecision(
            strategy="escalate",
            reason=(
                f"{state.repair_attempts} automatic repairs without a clean window "
                f"(max_retries={cfg.recovery.max_retries}); last anomaly: {anomaly.detail}"
            ),
            rollback_to=rollback,
            **keep,
        )
    if anomaly.type == "oom":
        nxt = state.fallback_tier + 1
        if nxt >= num_tiers:
            tc = cfg.tiers[min(state.fallback_tier, len(cfg.tiers) - 1)]
            return RepairDecision(
                strategy="escalate",
                reason=(
                    f"out of memory on tier {state.fallback_tier} (micro batch {tc.micro_batch_size}, seq_len "
                    f"{tc.seq_len:,}, {tc.method}) and the plan has no further fallback: `stop` and start a run with "
                    "a smaller micro_batch_size or seq_len, gradient_checkpointing, or qlora (`aegis plan` gives a "
                    "fallback chain), or `resume` if the memory was taken by something else"
                ),
                rollback_to=rollback,
                **keep,
            )
        return RepairDecision(
            strategy="fallback",
            reason=f"out of memory on tier {state.fallback_tier}: switching to fallback tier {nxt}",
            lr=state.lr,
            grad_clip=state.grad_clip,
            fallback_tier=nxt,
            rollback_to=rollback,
        )
    diag = state.diagnosis
    if diag is not None and diag.verdict == "ambiguous":
        return RepairDecision(
            strategy="escalate",
            reason=(
                f"ambiguous diagnosis: {len(diag.suspected_samples)} outliers in batch {diag.batch_id} "
                "(too many to blame on bad samples)"
            ),
            rollback_to=rollback,
            **keep,
        )
    if diag is not None and diag.verdict == "outliers":
        new = tuple(s for s in diag.suspected_samples if s not in state.blacklist)
        if new:
            return RepairDecision(
                strategy="blacklist",
                reason=f"{anomaly.type} at step {anomaly.step} caused by {len(new)} outlier sample(s)",
                blacklist_add=new,
                rollback_to=rollback,
                **keep,
            )
    last = state.repairs[-1].strategy if state.repairs else None
    if anomaly.type == "loss_spike" and anomaly.repeat and last == "stabilize" and anomaly.batch_sample_ids:
        return RepairDecision(
            strategy="skip_batch",
            reason=f"loss spike at step {anomaly.step} again after stabilising, no sample to blame: skipping the batch",
            skip_add=anomaly.batch_sample_ids,
            rollback_to=rollback,
            **keep,
        )
    factor_lr, factor_clip = cfg.recovery.lr_factor, cfg.recovery.clip_factor
    return RepairDecision(
        strategy="stabilize",
        reason=(
            f"{anomaly.type} at step {anomaly.step} with no sample to blame: "
            f"LR x{factor_lr:g}, clip x{factor_clip:g}"
        ),
        lr=state.lr * factor_lr,
        grad_clip=state.grad_clip * factor_clip,
        fallback_tier=state.fallback_tier,
        rollback_to=rollback,
    )


def apply_repair(state: RunState, decision: RepairDecision) -> RunState:
    """The state after a decision: knobs changed, attempt counted, a human asked on escalation."""
    attempt = RepairAttempt(step=state.step, strategy=decision.strategy, detail=decision.reason)
    new = state.with_repair(attempt)
    if decision.strategy == "escalate":
        return new.update(
            status="paused",
            human=HumanInterrupt(pending=True, reason=decision.reason, suggested_actions=suggested_actions(state)),
        )
    return new.update(
        blacklist=(*state.blacklist, *decision.blacklist_add),
        skipped=tuple(dict.fromkeys((*state.skipped, *decision.skip_add))),
        lr=decision.lr,
        grad_clip=decision.grad_clip,
        fallback_tier=decision.fallback_tier,
        repair_attempts=state.repair_attempts + 1,
    )
