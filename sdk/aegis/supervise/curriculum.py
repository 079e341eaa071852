"""Dynamic curriculum: per-domain evaluation and mixing-weight updates against forgetting (spec §6.6).

Every ``eval_interval`` steps each domain is evaluated (mean eval loss, lower is better). A domain
is *degraded* when its loss is above its best so far by more than ``drop_threshold`` (relative);
its weight is multiplied by ``boost``, the weights are renormalised to sum to 1 and capped at
``max_weight``. Only the sampling mix changes — batch shapes stay the same, so nothing recompiles.

    update = update_curriculum(weights, best, {"chat": 1.9, "prose": 1.2}, cfg.curriculum)
    update.weights, update.degraded
"""

from __future__ import annotations

import math

from pydantic import Field

from aegis.schema import Frozen
from aegis.supervise.run_config import CurriculumSection

__all__ = ["CurriculumUpdate", "initial_weights", "update_curriculum", "normalise"]


class CurriculumUpdate(Frozen):
    """Result of one evaluation round."""

    weights: dict[str, float] = Field(description="New normalised mixing weights.")
    best_loss: dict[str, float] = Field(description="Best eval loss per domain, this round included.")
    degraded: tuple[str, ...] = Field(description="Domains whose weight was raised.")
    losses: dict[str, float] = Field(description="This round's eval loss per domain.")


def normalise(weights: dict[str, float], max_weight: float = 1.0) -> dict[str, float]:
    """Weights scaled to sum to 1, none above ``max_weight`` (excess spread over the others)."""
    total = sum(weights.values())
    if total <= 0:
        n = len(weights)
        return {k: 1.0 / n for k in weights}
    w = {k: v / total for k, v in weights.items()}
    cap = max(max_weight, 1.0 / len(w))
    capped: set[str] = set()
    for _ in range(len(w)):
        over = {k for k, v in w.items() if v > cap + 1e-12}
        if not over:
            break
        excess = sum(w[k] - cap for k in over)
        capped |= over
        free = {k: v for k, v in w.items() if k not in capped}
        free_total = sum(free.values())
        for k in over:
            w[k] = cap
        for k, v in free.items():
            w[k] = v + excess * (v / free_total if free_total > 0 else 1.0 / len(free))
    return w


def initial_weights(counts: dict[str, int], cfg: CurriculumSection) -> dict[str, float]:
    """Starting mix: the configured weights (domains not named get 0), else proportional to domain sizes."""
    if cfg.weights:
        return normalise({d: float(cfg.weights.get(d, 0.0)) for d in counts}, 1.0)
    return normalise({d: float(n) for d, n in counts.items()}, 1.0)


def update_curriculum(
    weights: dict[str, float], best_loss: dict[str, float], losses: dict[str, float], cfg: CurriculumSection
) -> CurriculumUpdate:
    """Raise the weight of every domain whose eval loss degraded past the threshold."""
    best = dict(best_loss)
    degraded = []
    raw = dict(weights)
    for domain, loss in losses.items():
        if not math.isfinite(loss):
            continue
        prev = best.get(domain)
        if prev is not None and loss > prev * (1.0 + cfg.drop_threshold) and domain in raw:
            degraded.append(domain)
            raw[domain] = raw[domain] * cfg.boost
        best[domain] = loss if prev is None else min(prev, loss)
    new = normalise(raw, cfg.max_weight) if degraded else dict(weights)
    return CurriculumUpdate(weights=new, best_loss=best, degraded=tuple(degraded), losses=dict(losses))
