"""The memory engine against the traced truth table (tests/data/memory_truth.json, built by tools/truth).

Bars: >= 30 rows over >= 4 families and all three methods, median |error| <= 2%, worst <= 5% on the
tensor-level peak; a MoE row where a naive parameter-count estimate is off by >= 2x while the
engine is within the bar.
"""

import statistics

import pytest

from aegis.hub import resolve_model
from tools.memory_table import compare, load_rows, unmodelled_reason

ROWS = load_rows()
RESULTS = compare(ROWS)

# The seed design's per-parameter weight cost: what a parameter-count estimate assumes.
NAIVE_BYTES_PER_PARAM = {"full": 16.0, "lora": 2.0, "qlora": 0.55}


def test_table_covers_families_methods_and_sizes():
    assert len(ROWS) >= 30
    families = {resolve_model(r["model_id"]).family for r in ROWS}
    assert len(families) >= 4, families
    assert {r["method"] for r in ROWS} == {"full", "lora", "qlora"}
    assert {r["gradient_checkpointing"] for r in ROWS} == {True, False}
    assert any(resolve_model(r["model_id"]).is_moe for r in ROWS)
    assert max(r["peak_bytes"] for r in ROWS) > 40 * 2**30  # real model sizes, not toys


MODELLED = [r for r in RESULTS if not r["unmodelled"]]
GAPS = [r for r in RESULTS if r["unmodelled"]]


def test_median_and_worst_error_over_the_modelled_rows():
    assert len(MODELLED) >= 30
    errors = [abs(r["error"]) for r in MODELLED]
    assert statistics.median(errors) <= 0.02
    worst = max(MODELLED, key=lambda r: abs(r["error"]))
    assert abs(worst["error"]) <= 0.05, worst


@pytest.mark.parametrize("result", GAPS, ids=[r["key"] for r in GAPS])
def test_known_gaps_stay_visible(result):
    """Traced configurations outside what the engine models yet: reported, not hidden."""
    pytest.xfail(f"{result['unmodelled']} (engine error {result['error']:+.2%})")


def test_moe_row_where_naive_estimate_fails():
    found = []
    for row, result in zip(ROWS, RESULTS):
        profile = resolve_model(row["model_id"])
        if not profile.is_moe or result["unmodelled"]:
            continue
        naive = profile.total_params * NAIVE_BYTES_PER_PARAM[row["method"]]
        ratio = max(naive, row["peak_bytes"]) / min(naive, row["peak_bytes"])
        if ratio >= 2 and abs(result["error"]) <= 0.05:
            found.append((row["key"], round(ratio, 1), result["error"]))
    if not found:
        pytest.fail("no MoE row where the naive estimate is off by >= 2x and the engine within 5%")


@pytest.mark.parametrize("row", ROWS, ids=[r["key"] for r in ROWS])
def test_static_components_match_the_trace(row):
    """Weights + adapters and optimizer state are exact (to the allocator's rounding of tiny tensors)."""
    from aegis.memory import estimate
    from tools.memory_table import config_of

    if unmodelled_reason(row):
        pytest.skip(unmodelled_reason(row))
    est = estimate(resolve_model(row["model_id"]), config_of(row))
    params = est.component("weights").bytes + sum(c.bytes for c in est.components if c.key == "adapters")
    traced = row["param_bytes_frozen"] + row["param_bytes_trainable"]
    assert params == pytest.approx(traced, rel=0.002)
    assert est.component("optimizer").bytes == pytest.approx(row["optimizer_state_bytes"], rel=0.01)
