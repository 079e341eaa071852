"""Monitor rules against a direct numpy computation of mean + k*sigma."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aegis.supervise.run_config import MonitoringSection
from aegis.supervise.monitor import Detector
from aegis.supervise.state import MetricsWindow, StepMetrics


def _m(step, loss, grad=1.0, nonfinite=False):
    return StepMetrics(step=step, loss=loss, grad_norm=grad, nonfinite=nonfinite)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(0.5, 3.0), min_size=10, max_size=40), st.floats(0.0, 10.0))
def test_spike_threshold_is_mean_plus_k_sigma_of_the_clean_history(history, new):
    cfg = MonitoringSection(spike_sigma=3.0, history_size=1000, min_history=5, min_std=0.0)
    det = Detector(cfg, MetricsWindow(steps=tuple(range(1, len(history) + 1)), loss_history=tuple(history),
                                      grad_norm_history=tuple([1.0] * len(history))))
    # the clean history: steps more than 3 robust sigmas (1.4826 x MAD) above its median were spikes never judged
    med = np.median(history)
    mad = np.median(np.abs(np.array(history) - med))
    clean = [x for x in history if mad == 0 or x <= med + 3 * 1.4826 * mad]
    bar = np.mean(clean) + 3 * np.std(clean)
    anomaly = det.check(_m(len(history) + 1, new))
    assert (anomaly is not None) == (new > bar)
    if anomaly is not None:
        assert anomaly.type == "loss_spike" and math.isclose(anomaly.threshold, bar, rel_tol=1e-9)


def test_rules_nan_grad_explosion_warmup_and_history():
    cfg = MonitoringSection(min_history=3, history_size=4, grad_norm_threshold=10.0, warmup_steps=2)
    det = Detector(cfg)
    assert det.observe(_m(1, 100.0)) is None  # warm-up: not judged, not recorded
    assert det.observe(_m(2, 50.0)) is None
    assert list(det.losses) == []
    for s, loss in zip(range(3, 8), [1.0, 1.1, 0.9, 1.0, 1.05]):
        assert det.observe(_m(s, loss)) is None
    assert len(det.losses) == 4  # rolling window
    assert det.observe(_m(8, float("nan"))).type == "nan"
    assert det.observe(_m(9, 1.0, nonfinite=True)).type == "nan"
    assert det.observe(_m(10, 1.0, grad=11.0)).type == "grad_explosion"
    spike = det.observe(_m(11, 5.0))
    assert spike.type == "loss_spike" and spike.step == 11
    assert 5.0 not in det.losses  # anomalies never enter the history
    first = Detector(cfg).first_anomaly([_m(3, 1.0), _m(4, float("inf")), _m(5, 1.0)])
    assert first.step == 4


def test_a_spike_kept_before_the_history_could_judge_it_does_not_hide_the_next():
    """A packed batch holding a bad row can land among the first min_history steps, unjudged: it must not raise
    the bar so far that the next such batch passes (mean + 5 sigma with it: 2.93; without it: 1.30)."""
    history = [1.10, 1.20, 1.15, 1.13, 1.18, 1.16, 1.12, 1.14, 1.17, 2.26]
    cfg = MonitoringSection(spike_sigma=5.0, history_size=50, min_history=10, min_std=0.0)
    det = Detector(cfg, MetricsWindow(steps=tuple(range(1, 11)), loss_history=tuple(history),
                                      grad_norm_history=tuple([1.0] * 10)))
    clean = history[:-1]
    assert det.threshold() == pytest.approx(np.mean(clean) + 5 * np.std(clean))
    assert np.mean(history) + 5 * np.std(history) > 2.9  # the whole history would let a 1.9 pass
    spike = det.check(_m(11, 1.9))
    assert spike is not None and spike.type == "loss_spike"
