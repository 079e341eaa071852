"""fp16_mixed: dynamic loss scaling equals torch.amp.GradScaler; overflow steps are skipped and back
the scale off; unscaled fp16 gradients are the fp32 ones; the tiny llama trains; checkpoints keep
the scale; the supervisor's monitor does not mistake a scaler overflow for a divergence."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from aegis.data import ByteTokenizer, tiny_llama_config, toy_dataset_path
from aegis.schema import TrainConfig
from aegis.train.data import BatchSampler, load_jsonl
from aegis.train.modeling import build_model
from aegis.train.step import (
    LossScaleSettings,
    OptimizerSettings,
    init_state,
    make_optimizer,
    make_train_step,
    precision_dtypes,
    update_loss_scale,
)

FINITE = [True] * 5 + [False] + [True] * 2 + [False, False] + [True] * 7 + [False] + [True] * 4


def _torch_scaler_run(pattern: list[bool], **kwargs: float) -> list[tuple[float, bool]]:
    """(scale after update, step skipped) per step of torch's GradScaler on CPU."""
    w = torch.nn.Parameter(torch.ones(1))
    opt = torch.optim.SGD([w], lr=0.1)
    scaler = torch.amp.GradScaler("cpu", **kwargs)
    out = []
    for finite in pattern:
        opt.zero_grad()
        x = torch.tensor([1.0 if finite else float("inf")])
        scaler.scale((w * x).sum()).backward()
        before = w.detach().clone()
        scaler.step(opt)
        scaler.update()
        out.append((scaler.get_scale(), bool(torch.equal(before, w.detach()))))
    return out


def test_defaults_are_gradscalers() -> None:
    ref = torch.amp.GradScaler("cpu")
    ours = LossScaleSettings()
    assert (ours.init_scale, ours.growth_factor, ours.backoff_factor, ours.growth_interval) == (
        ref._init_scale,
        ref._growth_factor,
        ref._backoff_factor,
        ref._growth_interval,
    )


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        (dict(init_scale=2.0**16, growth_interval=3), FINITE),
        (dict(init_scale=2.0**10, growth_factor=4.0, backoff_factor=0.25, growth_interval=2), FINITE),
        (dict(init_scale=2.0**125, growth_interval=1), [True] * 4 + [False] + [True] * 3),  # growth to inf is refused
        (dict(), FINITE),  # defaults: no growth within 2000 steps
    ],
)
def test_scale_and_skips_equal_torch_gradscaler(kwargs: dict, pattern: list[bool]) -> None:
    settings = LossScaleSettings(**kwargs)
    update = jax.jit(lambda s, g, f: update_loss_scale(s, g, f, settings))
    scale, good = jnp.float32(settings.init_scale), jnp.int32(0)
    ours = []
    for finite in pattern:
        scale, good = update(scale, good, jnp.asarray(finite))
        ours.append((float(scale), not finite))
    assert ours == _torch_scaler_run(pattern, **kwargs)


@pytest.fixture(scope="module")
def fp16_model():
    d = precision_dtypes("fp16_mixed")
    return build_model(tiny_llama_config(), dtype=d.compute, param_dtype=d.params)


@pytest.fixture(scope="module")
def params(fp16_model):
    return fp16_model.init(jax.random.PRNGKey(0))


@pytest.fixture(scope="module")
def batch():
    examples = load_jsonl(toy_dataset_path(), ByteTokenizer())
    b = BatchSampler(examples, 8, 48, seed=0, packing=True).next_batch()
    return {k: jnp.asarray(v.reshape(1, *v.shape)) for k, v in b.arrays().items()}


SETTINGS = OptimizerSettings(learning_rate=1e-3, clip_norm=0.0)
SCALER = LossScaleSettings()


@pytest.fixture(scope="module")
def fp16_step(fp16_model):
    tx = make_optimizer(TrainConfig(method="full", precision="fp16_mixed"), SETTINGS)
    return tx, jax.jit(make_train_step(fp16_model, tx, SETTINGS, loss_scale=SCALER))


@pytest.mark.slow
def test_overflow_step_is_skipped_and_the_scale_halves(params, batch, fp16_step) -> None:
    tx, step = fp16_step
    state = init_state(params, tx, SETTINGS, jax.random.PRNGKey(1), loss_scale=SCALER)
    assert float(state.loss_scale) == 2.0**16 and int(state.good_steps) == 0
    state, m = step(state, None, batch)
    assert not bool(m["skipped"]) and not bool(m["overflow"]) and float(m["loss_scale"]) == 2.0**16
    assert float(state.loss_scale) == 2.0**16 and int(state.good_steps) == 1
    # 2**40 x the mean-loss gradient overflows fp16 (max 65504) in the backward pass
    big = dataclasses.replace(state, loss_scale=jnp.float32(2.0**40))
    after, m = step(big, None, batch)
    assert bool(m["overflow"]) and bool(m["skipped"]) and not bool(m["grads_finite"]) and bool(m["loss_finite"])
    assert float(m["loss_scale"]) == 2.0**40
    assert float(after.loss_scale) == 2.0**39 and int(after.good_steps) == 0 and int(after.step) == int(state.step) + 1
    kept = lambda s: (s.trainable, s.opt_state.inner_state)  # noqa: E731  (hyperparams carry this step's lr)
    for a, b in zip(jax.tree.leaves(kept(after)), jax.tree.leaves(kept(big))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.slow
def test_unscaled_fp16_gradients_are_the_fp32_gradients(params, batch, fp16_step) -> None:
    tx, step = fp16_step
    fp32_model = build_model(tiny_llama_config())
    tx32 = make_optimizer(TrainConfig(method="full", precision="fp32"), SETTINGS)
    state32 = init_state(params, tx32, SETTINGS, jax.random.PRNGKey(1))
    _, m32 = jax.jit(make_train_step(fp32_model, tx32, SETTINGS))(state32, None, batch)
    state = init_state(params, tx, SETTINGS, jax.random.PRNGKey(1), loss_scale=SCALER)
    _, m16 = step(state, None, batch)
    np.testing.assert_allclose(float(m16["loss"]), float(m32["loss"]), rtol=2e-3)
    np.testing.assert_allclose(float(m16["grad_norm"]), float(m32["grad_norm"]), rtol=1e-2)
    # accumulation: the scaled loss is the step's mean, so 4 micro batches give the same gradients
    four = {k: v.reshape(4, -1, v.shape[-1]) for k, v in batch.items()}
    _, m4 = step(state, None, four)
    np.testing.assert_allclose(float(m4["grad_norm"]), float(m16["grad_norm"]), rtol=1e-3)
    assert float(m4["tokens"]) == float(m16["tokens"])


@pytest.mark.slow
def test_tiny_llama_trains_in_fp16_mixed_and_checkpoints_keep_the_scale(tmp_path) -> None:
    from aegis.train.loop import Trainer

    examples = load_jsonl(toy_dataset_path(), ByteTokenizer())
    tc = TrainConfig(method="full", micro_batch_size=8, seq_len=64, precision="fp16_mixed", optimizer="adamw_8bit")
    settings = OptimizerSettings(learning_rate=3e-3, warmup_steps=2, total_steps=30)
    trainer = Trainer(tiny_llama_config(), tc, examples, optimizer=settings)
    assert trainer.model.dtype == jnp.float16 and trainer.loss_scaler == LossScaleSettings()
    infos = list(trainer.train(12))
    assert all(i.loss_scale == 2.0**16 and not i.nan_or_inf for i in infos)
    assert infos[-1].loss < 0.75 * infos[0].loss  # measured 5.58 -> 3.4 over 12 steps
    trainer.state = dataclasses.replace(trainer.state, loss_scale=jnp.float32(1024.0))  # a non-default scale
    trainer.save(tmp_path / "ckpt")
    saved = jax.device_get(trainer.state)
    ahead = [(i.loss, i.loss_scale) for i in trainer.train(2)]
    trainer.restore(tmp_path / "ckpt")
    restored = jax.device_get(trainer.state)
    assert float(restored.loss_scale) == 1024.0 and int(restored.good_steps) == 12
    leaves_a, tree_a = jax.tree.flatten(saved)
    leaves_b, tree_b = jax.tree.flatten(restored)
    assert tree_a == tree_b
    for a, b in zip(leaves_a, leaves_b):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)
    assert [(i.loss, i.loss_scale) for i in trainer.train(2)] == ahead


def test_the_monitor_lets_a_scaler_overflow_pass_but_not_a_nan() -> None:
    from aegis.supervise.run_config import MonitoringSection
    from aegis.supervise.monitor import Detector
    from aegis.supervise.state import StepMetrics
    from aegis.train.loop import StepInfo

    base = dict(
        step=5, loss=2.0, grad_norm=math.inf, lr=1e-3, tokens=10, tokens_per_s=1.0, step_time_s=1.0, epoch=0.1,
        loss_nonfinite=False, grads_nonfinite=True, params_nonfinite=False, update_skipped=True, sample_ids=("a",),
    )
    assert not StepInfo(**base, loss_scale=65536.0, scaler_overflow=True).nan_or_inf
    assert StepInfo(**base).nan_or_inf
    det = Detector(MonitoringSection(warmup_steps=0))
    overflow = StepMetrics(step=5, loss=2.0, grad_norm=math.inf, overflow=True)
    assert det.observe(overflow) is None and list(det.losses) == []
    assert det.observe(StepMetrics(step=6, loss=2.0, grad_norm=math.inf, nonfinite=True)).type == "nan"
