"""Monitor: anomaly rules over per-step metrics (spec §6.2).

Rules, in order of precedence, for a step with loss ``l`` and gradient norm ``g``:

1. ``nan`` — ``l`` or ``g`` is NaN/Inf, or the engine flagged non-finite values (params/grads);
2. ``grad_explosion`` — ``g > grad_norm_threshold`` (when configured);
3. ``loss_spike`` — ``l > mean + spike_sigma * std`` of the previous ``history_size`` clean steps,
   judged once ``min_history`` steps are known (``std`` floored at ``min_std``).

Anomalous steps never enter the history, so one spike does not raise the bar for the next (a step kept
while the history was still too short to judge it is left out of the mean when it lies ``spike_sigma``
robust sigmas, 1.4826 x MAD, above the history's median: packed batches of ~40 examples meet a rare bad
row often enough that one lands there); nor
do the first ``warmup_steps`` steps, whose fast-falling loss would inflate the standard deviation.
A step the fp16 loss scaler skipped (``overflow``: its scaled gradients overflowed, the update was
not applied and the scale halved) is neither judged nor kept: the scaler already handled it.

    det = Detector(cfg.monitoring, history=state.metrics)
    for m in window:                              # StepMetrics
        anomaly = det.observe(m)
        if anomaly: break
"""

from __future__ import annotations

import math
import statistics
from collections import deque

from aegis.supervise.run_config import MonitoringSection
from aegis.supervise.state import Anomaly, MetricsWindow, StepMetrics

__all__ = ["StepMetrics", "Detector", "rolling_stats"]


def rolling_stats(values: list[float] | tuple[float, ...]) -> tuple[float, float]:
    """Mean and population standard deviation."""
    n = len(values)
    mean = sum(values) / n
    var = sum((v - mean) ** 2 for v in values) / n
    return mean, math.sqrt(var)


class Detector:
    """Stateful rule evaluation over a stream of steps, seeded with the persisted history."""

    def __init__(self, cfg: MonitoringSection, history: MetricsWindow | None = None) -> None:
        self.cfg = cfg
        h = history or MetricsWindow()
        kept = [loss for step, loss in zip(h.steps, h.loss_history) if step > cfg.warmup_steps]
        self.losses: deque[float] = deque(kept, maxlen=cfg.history_size)

    def threshold(self) -> float | None:
        """Current loss-spike threshold, or None while the history is too short."""
        if len(self.losses) < self.cfg.min_history:
            return None
        # steps kept before the history was long enough to judge were never checked: one that stands out from
        # the rest by spike_sigma robust sigmas (1.4826 x MAD about the median) is a spike, not a clean step
        values = list(self.losses)
        med = statistics.median(values)
        mad = statistics.median(abs(v - med) for v in values)
        if mad > 0:
            values = [v for v in values if v <= med + self.cfg.spike_sigma * 1.4826 * mad]
        mean, std = rolling_stats(tuple(values))
        return mean + self.cfg.spike_sigma * max(std, self.cfg.min_std)

    def check(self, m: StepMetrics) -> Anomaly | None:
        """The anomaly at step ``m`` (without recording it)."""
        ids = m.sample_ids
        if m.overflow:
            return None
        if m.nonfinite or not math.isfinite(m.loss) or not math.isfinite(m.grad_norm):
            return Anomaly(
                type="nan",
                step=m.step,
                detail=f"non-finite values at step {m.step} (loss={m.loss}, grad_norm={m.grad_norm})",
                batch_sample_ids=ids,
            )
        limit = self.cfg.grad_norm_threshold
        if limit is not None and m.grad_norm > limit:
            return Anomaly(
                type="grad_explosion",
                step=m.step,
                value=m.grad_norm,
                threshold=limit,
                detail=f"grad norm {m.grad_norm:.4g} > threshold {limit:.4g} at step {m.step}",
                batch_sample_ids=ids,
            )
        bar = self.threshold() if m.step > self.cfg.warmup_steps else None
        if bar is not None and m.loss > bar:
            return Anomaly(
                type="loss_spike",
                step=m.step,
                value=m.loss,
                threshold=bar,
                detail=(
                    f"loss {m.loss:.4g} > mean + {self.cfg.spike_sigma:g} sigma = {bar:.4g} "
                    f"over the last {len(self.losses)} steps, at step {m.step}"
                ),
                batch_sample_ids=ids,
            )
        return None

    def observe(self, m: StepMetrics) -> Anomaly | None:
        """Check a step; a clean step joins the history."""
        anomaly = self.check(m)
        if anomaly is None and m.step > self.cfg.warmup_steps and not m.overflow:
            self.losses.append(m.loss)
        return anomaly

    def first_anomaly(self, window: list[StepMetrics]) -> Anomaly | None:
        """The first anomalous step of a window (clean steps before it join the history)."""
        for m in window:
            anomaly = self.observe(m)
            if anomaly is not None:
                return anomaly
        return None
