"""Outlier rules of the forensics node."""

import numpy as np

from aegis.supervise.run_config import ForensicsSection
from aegis.supervise.forensics import find_outliers, robust_z


def test_robust_z_matches_the_formula():
    x = np.array([1.0, 2.0, 3.0, 4.0, 100.0])
    med = 3.0
    mad = np.median(np.abs(x - med))
    np.testing.assert_allclose(robust_z(x), (x - med) / (1.4826 * mad))


def test_ratio_zscore_and_nonfinite_rules():
    cfg = ForensicsSection(outlier_ratio=100.0, zscore_threshold=6.0)
    grads = [1.0, 1.1, 0.9, 1.05, 0.95, 1.0, 150.0, 1.0]
    losses = [1.0] * 8
    found, stats = find_outliers(grads, losses, range(8), cfg, signals=())
    assert found == [6]  # ratio rule alone
    assert stats.median_grad_norm == 1.0 and stats.max_grad_norm == 150.0
    losses2 = [1.0, 1.1, 0.9, 1.0, 1.05, 9.0, 1.0, 0.95]
    found, _ = find_outliers([1.0] * 8, losses2, range(8), cfg, signals=("loss",))
    assert found == [5]
    found, _ = find_outliers([1.0] * 8, losses2, range(8), cfg, signals=("grad_norm",))
    assert found == []
    found, _ = find_outliers([1.0, float("nan"), 1.0], [1.0, 1.0, float("inf")], range(3), cfg)
    assert found == [1, 2]
    # only candidates can be blamed, the rest is context
    found, _ = find_outliers(grads, losses, range(4), cfg, signals=("grad_norm",))
    assert found == []
