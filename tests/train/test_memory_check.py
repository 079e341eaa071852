"""`check_memory`: XLA's peak for a Trainer's compiled step beside the planner's ``jax`` estimate.

References: `aegis.train.benchmark.jax_step_memory` (the one definition of the compiled peak:
arguments + outputs - aliased + temporaries) and ``aegis.planning.memory.estimate(..., framework="jax")``.
Every case holds the planner within RATIO_TOLERANCE of XLA (the measured ratio is noted on
each; XLA:CPU, jax 0.10.2). The measured ratios do not move with tests/train/conftest.py's
fast-compile XLA flags (identical memory analysis with and without them).
"""

from __future__ import annotations

import numpy as np
import pytest

from aegis.data import ByteTokenizer, tiny_llama_config, toy_dataset_path
from aegis.planning.memory import estimate
from aegis.models.profiles import profile_from_config
from aegis.schema import TrainConfig
from aegis.train.data import Example, load_jsonl
from aegis.train.loop import Trainer
from aegis.train.memory_check import MemoryCheck, check_memory

RATIO_TOLERANCE = 0.05
"""Largest |planned / compiled - 1| accepted."""

MID = {"hidden_size": 512, "intermediate_size": 1536, "num_attention_heads": 8, "num_key_value_heads": 2,
       "head_dim": 64, "vocab_size": 32000, "num_hidden_layers": 4}
"""A mid-size llama: 4 (unrolled) layers at hidden 512, a 32k vocabulary."""


def _tiny() -> dict:
    return tiny_llama_config()


def _mid() -> dict:
    return {**tiny_llama_config(), **MID}


def _examples(config: dict) -> list[Example]:
    if config == tiny_llama_config():  # byte-level ids fit its vocab
        return load_jsonl(toy_dataset_path(), ByteTokenizer())
    rng = np.random.default_rng(0)
    return [
        Example(sample_id=f"s{i}", domain="synthetic", input_ids=rng.integers(3, config["vocab_size"], 300),
                loss_mask=np.ones(300, bool))
        for i in range(8)
    ]


def _trainer(config: dict, **kw) -> Trainer:
    return Trainer(config, TrainConfig(**kw), _examples(config))


CASES = [
    # (id, config, TrainConfig kwargs, marks)                                 measured ratio
    ("tiny-full", _tiny, dict(method="full", micro_batch_size=4, seq_len=128), ()),  # 0.973
    ("tiny-lora", _tiny, dict(method="lora", micro_batch_size=4, seq_len=128), ()),  # 0.976
    ("mid-full", _mid, dict(method="full", micro_batch_size=2, seq_len=256), (pytest.mark.slow,)),  # 0.972
    ("mid-lora", _mid, dict(method="lora", micro_batch_size=2, seq_len=256), (pytest.mark.slow,)),  # 0.995
]


@pytest.mark.parametrize(("config", "kw"), [pytest.param(c, kw, id=i, marks=m) for i, c, kw, m in CASES])
def test_planned_peak_within_tolerance_of_compiled(config, kw):
    check = check_memory(_trainer(config(), **kw))
    assert abs(check.ratio - 1) <= RATIO_TOLERANCE, (
        f"planner {check.planned_peak_bytes:,} vs XLA {check.compiled_peak_bytes:,} (ratio {check.ratio:.3f})"
    )


def test_check_uses_the_established_definitions():
    """Compiled peak = jax_step_memory's for the same config; planned = estimate(framework='jax'); the static
    arguments XLA reports equal the planner's components exactly."""
    from aegis.train.benchmark import jax_step_memory

    config = _tiny()
    trainer = _trainer(config, method="lora", micro_batch_size=4, seq_len=128)
    check = check_memory(trainer)
    assert isinstance(check, MemoryCheck)
    d = check.detail
    assert check.compiled_peak_bytes == d["argument_bytes"] + d["output_bytes"] - d["alias_bytes"] + d["temp_bytes"]
    assert check.compiled_peak_bytes == jax_step_memory(config, trainer.train_config)["peak_bytes"]
    plan = estimate(profile_from_config(config, model_id="llama", source="path"), trainer.train_config, framework="jax")
    assert check.planned_peak_bytes == plan.tensor_bytes
    assert check.ratio == pytest.approx(check.planned_peak_bytes / check.compiled_peak_bytes)
    parts = {c.key: c.bytes for c in plan.components}
    assert (parts["weights"], parts["adapters"], parts["optimizer"]) == (
        d["frozen_bytes"], d["trainable_bytes"], d["opt_state_bytes"]
    )
    assert d["batch_bytes"] == 5 * 4 * trainer.global_micro_batch * trainer.train_config.seq_len


def test_check_compiles_the_step_the_trainer_runs():
    """The executable compiled for the check is the one the first train step uses: no second compile."""
    import jax.monitoring

    trainer = _trainer(_tiny(), method="full", micro_batch_size=2, seq_len=64)
    compiles: list[str] = []

    def listen(name: str, secs: float, **kw) -> None:
        if name.endswith("backend_compile_duration"):
            compiles.append(name)

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        first = check_memory(trainer)
        assert len(compiles) == 1
        info = next(trainer.train(1))
        assert info.step == 1 and len(compiles) == 1
        assert check_memory(trainer) == first and len(compiles) == 1
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
