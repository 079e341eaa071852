"""Phase 1's `batch_size: auto`: the largest power of two whose compiled Cognate training step fits the memory budget,
the step's bytes being XLA's own memory analysis (checked here against an independent compile of the same step on
real arrays); a bad batch_size is one line."""

from __future__ import annotations

import pytest
from aegis.errors import InvalidConfigError

MICRO = {"model": {"hidden_size": 16, "num_layers": 1, "num_heads": 2, "intermediate_size": 32, "num_persistent": 2,
                   "window": 8, "memory_dim": 4, "memory_chunk": 4, "max_passes": 2, "vocab_size": 300},
         "variants": [{"name": "a", "act_threshold": 0.9, "ltm_slots": 8, "seed": 1, "mix": {"math": 1.0}}],
         "train": {"seq_len": 16, "optimizer": "adamw", "max_batch_size": 8, "memory_headroom": 0.0}}


def _xla_bytes(compiled) -> int:
    ma = compiled.memory_analysis()
    return ma.argument_size_in_bytes + ma.output_size_in_bytes - ma.alias_size_in_bytes + ma.temp_size_in_bytes


@pytest.mark.parametrize("value", [0, -3, "lots", 2.5, True])
def test_bad_batch_size_is_one_line(value):
    from aegis.forge.cognate.phase1 import load_phase1_config

    with pytest.raises(InvalidConfigError) as err:
        load_phase1_config({"train": {"batch_size": value}})
    assert "train.batch_size" in str(err.value) and "auto" in str(err.value) and "\n" not in str(err.value)
    assert load_phase1_config({}).train.batch_size == "auto"
    assert load_phase1_config({}, tiny=True).train.batch_size == 4  # --tiny keeps its pinned batch


@pytest.mark.slow
def test_auto_batch_is_the_largest_whose_compiled_step_fits_the_budget():
    import jax
    import numpy as np
    from aegis.forge.cognate import phase1
    from aegis.forge.cognate.hyperparams import CognateConfig
    from aegis.forge.cognate.model import init_params

    if jax.devices()[0].platform != "cpu":
        pytest.skip("the budget here is the CPU's host budget")
    p1 = phase1.load_phase1_config(MICRO)
    cfg = CognateConfig(**{**p1.model, "act_threshold": 0.9, "ltm_slots": 8})
    tx, step = phase1._train_step(cfg, p1.train)
    params = init_params(cfg, jax.random.key(0))
    opt_state = tx.init(params)
    th, lr = np.float32(0.9), np.float32(1e-3)
    ids = np.random.default_rng(0).integers(0, 300, (2, 16), dtype=np.int32)
    # the reference: the same jitted step compiled on real arrays at batch 2, XLA's memory analysis read here
    ref = step.lower(params, opt_state, ids, th, lr).compile()
    budget = _xla_bytes(ref)  # exactly batch 2's bytes: 2 is chosen only if auto measures the same number
    p1 = phase1.load_phase1_config({**MICRO, "train": {**MICRO["train"], "host_memory_gib": budget / 2**30}})
    batch, report = phase1._choose_batch(cfg, p1)
    assert batch == 2 and report["chosen_by"] == "auto" and abs(report["budget_bytes"] - budget) <= 1
    steps = {int(b): n for b, n in report["step_bytes"].items()}
    assert set(steps) == {2, 4}  # bisection over 1, 2, 4, 8 (cap 8): two compiles
    assert steps[2] == budget and steps[4] > report["budget_bytes"]  # the chosen fits, twice it does not
    assert report["summary"].startswith(f"batch 2: step {budget / 1e9:.3g} GB of ")
    assert "XLA memory analysis" in report["summary"]
    # the training loop reuses the executable compiled for the chosen batch; it computes what the reference does
    compiled = phase1._compiled_step(cfg, p1.train.model_copy(update={"batch_size": 2}))
    assert compiled is not None
    got, want = compiled(params, opt_state, ids, th, lr), ref(params, opt_state, ids, th, lr)
    np.testing.assert_allclose(got[2]["ce"], want[2]["ce"], rtol=1e-6)


def test_fit_batch_bisects_powers_of_two_up_to_the_cap():
    import jax
    import jax.numpy as jnp
    from aegis.forge.cognate.step_memory import compiled_step_bytes, fit_batch

    step = jax.jit(lambda x: jnp.tanh(x) * 2.0)

    def args_for(b):
        return (jax.ShapeDtypeStruct((b, 1024), jnp.float32),)

    one = compiled_step_bytes(step.lower(*args_for(1)).compile())
    assert one >= 2 * 4096  # its input and its output, float32
    big = fit_batch(step, args_for, cap=6, budget_bytes=10**12)
    assert big.batch_size == 4 and max(big.candidates) == 4  # the cap, rounded down to a power of two
    mid = fit_batch(step, args_for, cap=64, budget_bytes=9 * one)
    assert mid.candidates[mid.batch_size] <= 9 * one < mid.candidates[2 * mid.batch_size]
    assert mid.batch_size == 8 and len(mid.candidates) <= 4  # bisection, not all seven candidates
    with pytest.raises(InvalidConfigError, match="lower train.seq_len") as err:
        fit_batch(step, args_for, cap=8, budget_bytes=one // 2, budget_source="host budget")
    assert "\n" not in str(err.value)
