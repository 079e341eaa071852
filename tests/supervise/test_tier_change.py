"""A fallback tier with another optimizer or precision (the planner's chain ends in paged 8-bit AdamW)
continues from the previous tier's checkpoint: converted, never quarantined as corrupt."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from aegis.schema import TrainConfig
from aegis.supervise import Supervisor, parse_run_config
from aegis.supervise.checkpoints import CheckpointStore
from aegis.supervise.run_config import RunConfig
from aegis.supervise.engine_handle import Engine, load_examples, resolve_model_config
from aegis.supervise.state import RunState
from aegis.train.optim8bit import QuantizedArray, ScaleByAdam8bitState

from tests.demo_model import TINY_LLAMA, TINY_RUN, TOY_DATA

from .conftest import run_config

TIER0 = {"method": "full", "micro_batch_size": 4, "seq_len": 64, "precision": "fp32"}
TIER1 = {**TIER0, "precision": "fp16_mixed", "optimizer": "paged_adamw_8bit"}


@pytest.mark.slow
def test_an_adamw_checkpoint_restores_into_an_8bit_fp16_tier(tmp_path):
    cfg = RunConfig(**TINY_RUN, data=TOY_DATA, train_config=TrainConfig(**TIER0), fallbacks=[TrainConfig(**TIER1)])
    examples, model_config = load_examples(cfg)[0], resolve_model_config(TINY_LLAMA)
    store = CheckpointStore(tmp_path / "checkpoints", interval=10, keep_last_n=3, async_save=False)
    run = RunState(run_id="t", lr=1e-3, grad_clip=1.0)
    first = Engine.build(cfg, model_config, examples, 0)
    list(first.trainer.train(3))
    first.checkpoint(store, 3, run)
    store.wait()
    saved = jax.device_get(first.trainer.state)

    second = Engine.build(cfg, model_config, examples, 1)
    corrupt = []
    tier1 = run.model_copy(update={"fallback_tier": 1})
    restored = second.restore(store, tier1, on_corrupt=lambda s, w: corrupt.append(s))
    assert corrupt == [] and restored.step == 3 and store.all_steps() == [3]
    state = jax.device_get(second.trainer.state)
    assert int(state.step) == 3 and float(state.loss_scale) == 2.0**16
    for a, b in zip(jax.tree.leaves(state.trainable), jax.tree.leaves(saved.trainable)):
        np.testing.assert_array_equal(a, b)
    adam = state.opt_state.inner_state[0]
    assert isinstance(adam, ScaleByAdam8bitState) and int(adam.count) == 3
    assert isinstance(adam.mu["model"]["embed_tokens"]["weight"], QuantizedArray)
    infos = list(second.trainer.train(2))
    assert all(np.isfinite(i.loss) and not i.nan_or_inf for i in infos) and second.step == 5


@pytest.mark.slow
def test_oom_fallback_to_paged_8bit_fp16_completes_the_run(tmp_path):
    cfg = parse_run_config(
        run_config(
            tmp_path,
            run_id="oom8",
            fallbacks=[TIER1],
            training={"steps_per_window": 10, "total_steps": 20},
            faults={"oom_on_tiers": [0]},
        )
    )
    sup = Supervisor(tmp_path / "runs")
    out = sup.start(cfg)
    assert out.status == "completed" and out.step == 20 and out.fallback_tier == 1
    kinds = [e.kind for e in sup.events("oom8")]
    assert "checkpoint_corrupt" not in kinds
    assert [e.data["strategy"] for e in sup.events("oom8") if e.kind == "repair"] == ["fallback"]
