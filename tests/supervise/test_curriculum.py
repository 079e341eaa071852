"""Curriculum: degraded domains get more weight, weights stay a distribution."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aegis.supervise.run_config import CurriculumSection
from aegis.supervise.curriculum import initial_weights, normalise, update_curriculum


def test_degraded_domain_weight_rises():
    cfg = CurriculumSection(drop_threshold=0.1, boost=2.0, max_weight=0.9)
    w = {"a": 0.5, "b": 0.5}
    best = {"a": 1.0, "b": 1.0}
    up = update_curriculum(w, best, {"a": 1.05, "b": 1.3}, cfg)
    assert up.degraded == ("b",)
    assert up.weights["b"] == pytest.approx(2 / 3) and up.weights["a"] == pytest.approx(1 / 3)
    assert up.best_loss == {"a": 1.0, "b": 1.0}
    same = update_curriculum(w, best, {"a": 0.8, "b": 1.05}, cfg)
    assert same.degraded == () and same.weights == w and same.best_loss["a"] == 0.8


@given(st.dictionaries(st.sampled_from("abcdef"), st.floats(0.01, 100), min_size=2), st.floats(0.3, 1.0))
def test_normalise_is_a_capped_distribution(weights, cap):
    out = normalise(weights, cap)
    assert sum(out.values()) == pytest.approx(1.0)
    assert max(out.values()) <= max(cap, 1 / len(out)) + 1e-9


def test_initial_weights():
    assert initial_weights({"a": 30, "b": 10}, CurriculumSection()) == {"a": 0.75, "b": 0.25}
    assert initial_weights({"a": 30, "b": 10}, CurriculumSection(weights={"b": 1.0})) == {"a": 0.0, "b": 1.0}
