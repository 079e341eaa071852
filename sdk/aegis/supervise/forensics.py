"""Forensics: which samples of the offending batch caused the anomaly (spec §6.3).

The Forensics node restores the checkpoint *before* the anomaly and runs the engine's per-sample
kernel (``Trainer.analyze``: ``vmap(grad)`` under ``jit``) on the offending batch and on up to
``context_batches`` clean batches trained just before it. The clean batches widen the population
the statistics are taken over; only samples of the offending batch can be blamed.

A sample is an outlier when its gradient norm or loss is non-finite, its gradient norm is above
``median * outlier_ratio``, or the robust z-score ``(x - median) / (1.4826 * MAD)`` of the signal
that explains the anomaly exceeds ``zscore_threshold``: the per-sample **loss** for a loss spike
(only a high-loss sample can raise the batch loss), the **gradient norm** for a gradient
explosion, both for NaN/Inf. Judging a loss spike by gradient norms alone blames clean short rows
(few target tokens, so a large mean-loss gradient) and misses toxic rows seen before (once the
model predicts a row's noise distribution its per-token gradients cancel, but its loss stays high). (A plain
z-score over one batch of ``n`` samples can never exceed ``(n-1)/sqrt(n)`` — 2.5 for a batch of 8 —
so the median/MAD form is what makes a threshold of 6 meaningful.)

Verdicts: ``outliers`` (blame them), ``none`` (an optimisation problem: stabilise), ``ambiguous``
(more than ``max_outlier_fraction`` of the batch: ask a human).

    outliers, stats = find_outliers(grad_norms, losses, candidates=range(8), cfg=cfg.forensics)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from aegis.supervise.run_config import ForensicsSection
from aegis.supervise.runs import write_json_atomic
from aegis.supervise.state import DiagnosisReport, OutlierStats

__all__ = ["SIGNALS", "robust_z", "find_outliers", "diagnose"]


def _json_float(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def robust_z(values: np.ndarray) -> np.ndarray:
    """``(x - median) / (1.4826 * MAD)`` over the finite values (NaN where x is not finite)."""
    finite = values[np.isfinite(values)]
    if finite.size == 0:
        return np.full(values.shape, np.nan)
    med = float(np.median(finite))
    mad = float(np.median(np.abs(finite - med)))
    scale = 1.4826 * mad if mad > 0 else max(abs(med) * 1e-3, 1e-12)
    return (values - med) / scale


SIGNALS: dict[str, tuple[str, ...]] = {
    "loss_spike": ("loss",),
    "grad_explosion": ("grad_norm",),
    "nan": ("grad_norm", "loss"),
}
"""Per anomaly type, the per-sample signals whose z-score can blame a sample."""


def find_outliers(
    grad_norms: Sequence[float],
    losses: Sequence[float],
    candidates: Sequence[int],
    cfg: ForensicsSection,
    signals: Sequence[str] = ("grad_norm", "loss"),
) -> tuple[list[int], OutlierStats]:
    """Indices (from ``candidates``) of outliers, with the population statistics."""
    g = np.asarray(grad_norms, dtype=np.float64)
    loss = np.asarray(losses, dtype=np.float64)
    finite = g[np.isfinite(g)]
    med = float(np.median(finite)) if finite.size else float("nan")
    mad = float(np.median(np.abs(finite - med))) if finite.size else float("nan")
    z = {"grad_norm": robust_z(g), "loss": robust_z(loss)}
    out = []
    for i in candidates:
        if not (math.isfinite(g[i]) and math.isfinite(loss[i])):
            out.append(i)
        elif g[i] > med * cfg.outlier_ratio or any(z[k][i] > cfg.zscore_threshold for k in signals):
            out.append(i)
    finite_loss = loss[np.isfinite(loss)]
    stats = OutlierStats(
        median_grad_norm=med,
        max_grad_norm=float(np.max(finite)) if finite.size else float("nan"),
        mad_grad_norm=mad,
        median_loss=float(np.median(finite_loss)) if finite_loss.size else float("nan"),
        max_loss=float(np.max(finite_loss)) if finite_loss.size else float("nan"),
        num_samples=int(g.size),
    )
    return out, stats


def diagnose(
    anomaly_type: str,
    trainer: object,
    offending_ids: Sequence[str],
    context_ids: Sequence[Sequence[str]],
    anomaly_step: int,
    checkpoint_step: int,
    cfg: ForensicsSection,
    report_dir: Path,
) -> DiagnosisReport:
    """Run the per-sample kernel on the offending batch (+ context) and write the report JSON."""
    batches = [list(offending_ids), *[list(ids) for ids in context_ids[-cfg.context_batches :] if ids]]
    ids: list[str] = []
    losses: list[float] = []
    norms: list[float] = []
    for batch_ids in batches:
        result = trainer.analyze(sample_ids=batch_ids)  # type: ignore[attr-defined]
        for s in result.samples:
            ids.append(s.sample_id)
            losses.append(s.loss)
            norms.append(s.grad_norm)
    n_off = len(offending_ids)
    signals = SIGNALS.get(anomaly_type, ("grad_norm", "loss"))
    found, stats = find_outliers(norms, losses, range(n_off), cfg, signals)
    limit = max(1, int(cfg.max_outlier_fraction * n_off))
    verdict = "none" if not found else ("ambiguous" if len(found) > limit else "outliers")
    report_dir.mkdir(parents=True, exist_ok=True)
    path = report_dir / f"step-{anomaly_step}.json"
    write_json_atomic(
        path,
        {
            "anomaly_step": anomaly_step,
            "checkpoint_step": checkpoint_step,
            "verdict": verdict,
            "rule": {
                "outlier_ratio": cfg.outlier_ratio,
                "zscore_threshold": cfg.zscore_threshold,
                "zscore_on": list(signals),
                "max_outlier_fraction": cfg.max_outlier_fraction,
            },
            "stats": {k: _json_float(v) for k, v in stats.model_dump(mode="json").items()},
            "samples": [
                {
                    "sample_id": sid,
                    "offending_batch": k < n_off,
                    "loss": _json_float(losses[k]),
                    "grad_norm": _json_float(norms[k]),
                    "outlier": k in found,
                }
                for k, sid in enumerate(ids)
            ],
        },
    )
    return DiagnosisReport(
        batch_id=f"step-{anomaly_step}",
        checkpoint_step=checkpoint_step,
        verdict=verdict,
        outlier_indices=tuple(found),
        outlier_stats=stats,
        suspected_samples=tuple(ids[i] for i in found),
        report_path=str(path),
    )
