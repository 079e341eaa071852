"""The memory engine against the traced truth table (tests/data/memory_truth.json, built by tools/truth).

Bars: >= 30 rows over >= 4 families and all three methods, median |error| <= 2%, worst <= 5% on the
tensor-level peak; a MoE row where a naive parameter-count estimate is off by >= 2x while the
engine is within the bar. The bars hold for every stack profile the table traced (transformers 4 and 5, HF
Trainer / TRL / plain PEFT preparation, LoRA dropout, k-bit preparation or not, reentrant checkpointing). Known gaps (rows `tools.memory_table.unmodelled_reason` names) are pinned in
KNOWN_GAPS: they stay out of the bars but must stay visible in the table.
"""

import statistics

import pytest

from tools.memory_table import compare, load_rows, profile_of, render, unmodelled_reason

ROWS = load_rows()
RESULTS = compare(ROWS)

# The seed design's per-parameter weight cost: what a parameter-count estimate assumes.
NAIVE_BYTES_PER_PARAM = {"full": 16.0, "lora": 2.0, "qlora": 0.55}

MEDIAN_BAR = 0.02
WORST_BAR = 0.05

# Truth rows the engine is known not to model (row key -> the unmodelled_reason the tool reports).
# Empty: every traced row is modelled (measured worst |error| 2.95% over 123 rows, median 0.03%; the stack profile
# rows span transformers 4.48.1 / 5.23.0, HF / TRL / plain-PEFT preparation, LoRA dropout, reentrant). A row goes here
# only together with its reason in tools.memory_table.unmodelled_reason, and leaves once within the bar.
KNOWN_GAPS: dict[str, str] = {}


def test_table_covers_families_methods_and_sizes():
    assert len(ROWS) >= 30
    families = {profile_of(r).family for r in ROWS}
    assert len(families) >= 4, families
    assert {r["method"] for r in ROWS} == {"full", "lora", "qlora"}
    assert {r["gradient_checkpointing"] for r in ROWS} == {True, False}
    assert any(profile_of(r).is_moe for r in ROWS)
    assert max(r["peak_bytes"] for r in ROWS) > 40 * 2**30  # real model sizes, not toys


def test_table_covers_the_stack_profiles():
    """Rows traced under both transformers majors, with LoRA dropout, without k-bit preparation, with
    reentrant checkpointing and with TRL's preparation, including a transformers 4 MoE row."""
    majors = {r.get("transformers_version", "5.23.0").split(".")[0] for r in ROWS}
    assert {"4", "5"} <= majors, majors
    assert any((r.get("lora_dropout") or 0) > 0 for r in ROWS)
    assert any(r["method"] == "qlora" and r.get("kbit_prep", True) is False for r in ROWS)
    assert any(r["gradient_checkpointing"] and r.get("checkpointing") == "reentrant" for r in ROWS)
    assert any(r.get("trainer") == "trl" for r in ROWS)
    assert any(
        r.get("transformers_version", "5.23.0").startswith("4.") and profile_of(r).is_moe
        and r["method"] == "qlora"
        for r in ROWS
    )


def test_config_of_gives_the_planner_the_stack_each_row_traced():
    from tools.memory_table import config_of

    for row in ROWS:
        config = config_of(row)
        assert config.stack.transformers_version == row.get("transformers_version", "5.23.0")
        assert config.stack.trainer == row.get("trainer", "hf")
        assert config.stack.kbit_prep == row.get("kbit_prep", True)
        assert config.stack.checkpointing == row.get("checkpointing", "non_reentrant")
        if row["method"] != "full":
            assert config.lora.dropout == (row.get("lora_dropout") or 0.0)


MODELLED = [r for r in RESULTS if not r["unmodelled"]]


def test_median_and_worst_error_over_the_modelled_rows():
    assert len(MODELLED) >= 30
    errors = [abs(r["error"]) for r in MODELLED]
    assert statistics.median(errors) <= MEDIAN_BAR
    worst = max(MODELLED, key=lambda r: abs(r["error"]))
    assert abs(worst["error"]) <= WORST_BAR, worst


def test_fp32_weights_under_autocast_keep_their_16_bit_copies():
    """HF Trainer's ``bf16=True`` on an fp32 model: autocast's bf16 copy of every matmul weight is saved for backward
    (only the head's, with checkpointing). Rows whose peak is at the loss, not the optimizer step, show it: without
    the copies the plan was 3.2% under Llama-3.2-1B at 8 x 2,048 tokens and 6.1% under Mistral-7B at 4 x 4,096."""
    rows = [r for r in RESULTS if r["key"].split("|")[2] == "bf16_mixed" and r["method"] == "full"]
    assert len(rows) >= 6 and {r["ckpt"] for r in rows} == {True, False}
    assert len({r["model"] for r in rows}) >= 3
    for r in rows:
        assert abs(r["error"]) <= 0.001, (r["key"], r["error"])


def _gap_problems(results: list[dict], table: str, known: dict[str, str]) -> list[str]:
    """Why the known-gap bookkeeping is wrong: a pinned gap missing, closed or hidden; a row out of the bar
    that is not a pinned gap."""
    lines = table.splitlines()
    by_key = {r["key"]: r for r in results}
    problems = [f"{key}: pinned as a known gap but no longer in the truth table" for key in known if key not in by_key]
    for r in results:
        if r["key"] not in known:
            if r["unmodelled"]:
                problems.append(f"{r['key']}: unmodelled ({r['unmodelled']}) but not pinned in KNOWN_GAPS")
            elif abs(r["error"]) > WORST_BAR:
                problems.append(f"{r['key']}: engine error {r['error']:+.2%} is outside the {WORST_BAR:.0%} bar")
            continue
        if r["unmodelled"] != known[r["key"]]:
            problems.append(f"{r['key']}: the tool reports {r['unmodelled']!r}, KNOWN_GAPS says {known[r['key']]!r}")
        if abs(r["error"]) <= WORST_BAR:
            problems.append(f"{r['key']}: within the bar now ({r['error']:+.2%}); drop it from KNOWN_GAPS and "
                            "unmodelled_reason")
        if f"* {r['unmodelled']}" not in lines:
            problems.append(f"{r['key']}: its reason is not listed under the table")
    marked = sum(line.endswith("* not modelled") for line in lines)
    if marked != len(known):
        problems.append(f"the table marks {marked} rows not modelled, KNOWN_GAPS pins {len(known)}")
    worst_all = max(abs(r["error"]) for r in results)
    if f"all rows {len(results)} |" not in table or f"worst {worst_all:.2%}" not in table:
        problems.append("the 'all rows' summary (gaps included) is missing or wrong")
    return problems


def test_known_gaps_stay_visible():
    """Rows the engine does not model are kept out of the bars but not hidden: still traced, still outside
    the bar, marked in the table with their reason, counted in its 'all rows' line. Every other row is
    within the bar."""
    assert not _gap_problems(RESULTS, render(RESULTS), KNOWN_GAPS)


def test_gap_check_catches_hidden_and_closed_gaps():
    """The gap check fails on what it guards against, on a copy of the real results."""
    row = dict(RESULTS[0], error=0.3)  # a row out of the bar
    results = [row, *RESULTS[1:]]
    assert any("outside the 5% bar" in p for p in _gap_problems(results, render(results), {}))
    gap = dict(row, unmodelled="attention kernel not modelled")  # declared by the tool: visible in the table
    results = [gap, *RESULTS[1:]]
    table = render(results)
    assert f"* {gap['unmodelled']}" in table and "  * not modelled" in table
    assert any("not pinned" in p for p in _gap_problems(results, table, {}))
    assert not _gap_problems(results, table, {gap["key"]: gap["unmodelled"]})
    hidden = table.replace("  * not modelled", "")
    assert any("marks 0 rows" in p for p in _gap_problems(results, hidden, {gap["key"]: gap["unmodelled"]}))
    closed = [dict(gap, error=0.01), *RESULTS[1:]]
    problems = _gap_problems(closed, render(closed), {gap["key"]: gap["unmodelled"]})
    assert any("within the bar now" in p for p in problems)
    assert any("no longer in" in p for p in _gap_problems(RESULTS, render(RESULTS), {"gone|row": "x"}))


def test_moe_row_where_naive_estimate_fails():
    found = []
    for row, result in zip(ROWS, RESULTS):
        profile = profile_of(row)
        if not profile.is_moe or result["unmodelled"]:
            continue
        naive = profile.total_params * NAIVE_BYTES_PER_PARAM[row["method"]]
        ratio = max(naive, row["peak_bytes"]) / min(naive, row["peak_bytes"])
        if ratio >= 2 and abs(result["error"]) <= WORST_BAR:
            found.append((row["key"], round(ratio, 1), result["error"]))
    if not found:
        pytest.fail("no MoE row where the naive estimate is off by >= 2x and the engine within 5%")


@pytest.mark.parametrize("row", ROWS, ids=[r["key"] for r in ROWS])
def test_static_components_match_the_trace(row):
    """Weights + adapters and optimizer state are exact (to the allocator's rounding of tiny tensors)."""
    from aegis.planning.memory import estimate
    from tools.memory_table import config_of

    if unmodelled_reason(row):
        pytest.skip(unmodelled_reason(row))
    est = estimate(profile_of(row), config_of(row))
    params = est.component("weights").bytes + sum(c.bytes for c in est.components if c.key == "adapters")
    traced = row["param_bytes_frozen"] + row["param_bytes_trainable"]
    assert params == pytest.approx(traced, rel=0.002)
    assert est.component("optimizer").bytes == pytest.approx(row["optimizer_state_bytes"], rel=0.01)
