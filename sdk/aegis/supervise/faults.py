"""Fault drills: deliberate NaNs, LR spikes and out-of-memory errors, to prove the supervisor heals them.

Configured in the run config's ``faults`` section (tests and ``aegis run --demo`` use it; a real
run leaves it empty). Each NaN or spike fault fires once — its key is recorded in the run state,
so the retry after a repair trains cleanly. An OOM fault is a property of a tier (that
configuration "does not fit"), so it fires whenever that tier trains.

* ``nan_at_steps``: before the step, every trainable parameter becomes NaN;
* ``lr_spike_at_steps``: the step runs with the LR multiplied by ``lr_spike_factor`` (divergence);
* ``oom_on_tiers``: the step raises the same ``JaxRuntimeError("RESOURCE_EXHAUSTED: ...")`` XLA
  raises when a buffer does not fit — or, with ``oom_phase``, building the tier (``build``) or
  copying its state to the host for a checkpoint (``transfer``).

    injector = FaultInjector(cfg.faults, state.faults_fired, tier=state.fallback_tier)
    injector.before(engine, step)      # may raise the OOM error
    info = next(steps)
    injector.after(engine)
"""

from __future__ import annotations

from typing import Any

from aegis.supervise.run_config import FaultsSection

__all__ = ["FaultInjector", "injected_oom", "arm_build_faults"]


def injected_oom(tier: int) -> Exception:
    """The exception XLA raises on an allocation failure, marked as injected."""
    import jax

    return jax.errors.JaxRuntimeError(
        f"RESOURCE_EXHAUSTED: Out of memory while trying to allocate the train step's buffers "
        f"(injected by faults.oom_on_tiers for tier {tier})"
    )


def arm_build_faults(cfg: FaultsSection, engine: Any) -> None:
    """The OOM drills outside the step for a freshly built tier: ``oom_phase='build'`` raises now,
    ``'transfer'`` makes the engine's next checkpoint copy raise."""
    if engine.tier not in cfg.oom_on_tiers or cfg.oom_phase == "step":
        return
    if cfg.oom_phase == "build":
        raise injected_oom(engine.tier)
    engine.fail_transfer = injected_oom(engine.tier)


class FaultInjector:
    """Applies the configured faults around each step."""

    def __init__(self, cfg: FaultsSection, fired: tuple[str, ...], tier: int) -> None:
        self.cfg = cfg
        self.fired: list[str] = list(fired)
        self.tier = tier
        self._restore_lr: float | None = None
        self.last: str | None = None

    def before(self, engine: Any, step: int) -> None:
        """Inject what is due before ``step`` runs."""
        self.last = None
        if self.tier in self.cfg.oom_on_tiers and self.cfg.oom_phase == "step":
            raise injected_oom(self.tier)
        key = f"nan@{step}"
        if step in self.cfg.nan_at_steps and key not in self.fired:
            engine.poison_params()
            self.fired.append(key)
            self.last = key
        key = f"lr_spike@{step}"
        if step in self.cfg.lr_spike_at_steps and key not in self.fired:
            self._restore_lr = engine.trainer.lr
            engine.trainer.set_lr(self._restore_lr * self.cfg.lr_spike_factor)
            self.fired.append(key)
            self.last = key

    def after(self, engine: Any) -> None:
        """Undo a temporary change (the spiked LR)."""
        if self._restore_lr is not None:
            engine.trainer.set_lr(self._restore_lr)
            self._restore_lr = None
