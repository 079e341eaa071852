"""Train/eval steps against references: torch cross-entropy, torch AdamW, optax schedules, exact accumulation."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch

from aegis.data import ByteTokenizer, tiny_llama_config, toy_dataset_path
from aegis.errors import InvalidConfigError
from aegis.schema import TrainConfig
from aegis.train.data import BatchSampler, load_jsonl
from aegis.train.modeling import build_model
from aegis.train.step import (
    OptimizerSettings,
    init_state,
    lr_schedule,
    make_eval_step,
    make_optimizer,
    make_train_step,
    precision_dtypes,
    token_loss_sum,
)

pytestmark = pytest.mark.slow  # most tests compile a train step: seconds each, tens on a busy 2-core box


@pytest.fixture(scope="module")
def model():
    return build_model(tiny_llama_config())


@pytest.fixture(scope="module")
def params(model):
    return model.init(jax.random.PRNGKey(0))


@pytest.fixture(scope="module")
def batch():
    examples = load_jsonl(toy_dataset_path(), ByteTokenizer())
    return BatchSampler(examples, 8, 48, seed=0, packing=True).next_batch()


@pytest.fixture(scope="module")
def loss_grad(model):
    """Jitted value-and-grad of the mean masked loss (full logits), shared to keep compiles few."""
    return jax.jit(jax.value_and_grad(lambda p, b: (lambda t, c: t / c)(*token_loss_sum(model, p, None, b))))


SGD = OptimizerSettings(learning_rate=0.5, clip_norm=0.01, b1=0.0)
ADAMW = OptimizerSettings(learning_rate=3e-3, warmup_steps=2, total_steps=6, weight_decay=0.1, clip_norm=0.3, min_lr_ratio=0.1)


@pytest.fixture(scope="module")
def sgd_step(model):
    return _step_fn(model, SGD, TrainConfig(method="full", precision="fp32", optimizer="sgd"))


@pytest.fixture(scope="module")
def adamw_step(model):
    return _step_fn(model, ADAMW)


def _arrays(batch, accum=1):
    return {k: jnp.asarray(v.reshape(accum, -1, v.shape[-1])) for k, v in batch.arrays().items()}


def _flat(batch):
    return {k: jnp.asarray(v) for k, v in batch.arrays().items()}


def test_eval_loss_is_torch_cross_entropy_over_masked_targets(model, params, batch):
    total, count = jax.jit(make_eval_step(model))(params, None, _flat(batch))
    logits = np.array(
        jax.jit(model.apply)(params, batch.input_ids, positions=batch.positions, segment_ids=batch.segment_ids)
    )
    labels = np.where(batch.loss_mask > 0, batch.targets, -100)
    ref = torch.nn.functional.cross_entropy(
        torch.from_numpy(logits).reshape(-1, logits.shape[-1]), torch.from_numpy(labels).long().reshape(-1)
    )
    assert int(count) == batch.num_target_tokens
    np.testing.assert_allclose(float(total / count), ref.item(), rtol=1e-5)


def test_chunked_cross_entropy_equals_full_logits_in_value_and_gradient(model, params, batch, loss_grad):
    def loss(p, b):  # 100 does not divide 8 x 48 tokens: the tail chunk is padded
        t, c = token_loss_sum(model, p, None, b, chunked=True, chunk_tokens=100)
        return t / c

    full, g_full = loss_grad(params, _flat(batch))
    part, g_part = jax.jit(jax.value_and_grad(loss))(params, _flat(batch))
    np.testing.assert_allclose(float(part), float(full), rtol=1e-5)
    for a, b in zip(jax.tree.leaves(g_part), jax.tree.leaves(g_full)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)


def test_chunked_cross_entropy_never_materialises_full_logits(model, params, batch):
    vocab = tiny_llama_config()["vocab_size"]
    b, s = batch.shape

    def loss(p, chunked):
        t, c = token_loss_sum(model, p, None, _flat(batch), chunked=chunked, chunk_tokens=32)
        return t / c

    def has_full_logits(chunked):
        jaxpr = jax.make_jaxpr(jax.grad(loss), static_argnums=1)(params, chunked)
        shapes = set()

        def walk(jp):
            for eqn in jp.eqns:
                shapes.update(tuple(v.aval.shape) for v in eqn.outvars if hasattr(v.aval, "shape"))
                for sub in jax.core.jaxprs_in_params(eqn.params):
                    walk(sub)

        walk(jaxpr.jaxpr)
        return any(np.prod(sh) >= b * s * vocab and vocab in sh for sh in shapes)

    assert has_full_logits(False)
    assert not has_full_logits(True)


def _step_fn(model, settings, train_config=None):
    tc = train_config or TrainConfig(method="full", precision="fp32")
    tx = make_optimizer(tc, settings)
    return tx, jax.jit(make_train_step(model, tx, settings))


def test_gradient_accumulation_equals_the_big_batch(params, batch, sgd_step):
    tx, step = sgd_step
    s1, m1 = step(init_state(params, tx, SGD, jax.random.PRNGKey(1)), None, _arrays(batch, 1))
    s4, m4 = step(init_state(params, tx, SGD, jax.random.PRNGKey(1)), None, _arrays(batch, 4))
    np.testing.assert_allclose(float(m4["loss"]), float(m1["loss"]), rtol=1e-5)
    np.testing.assert_allclose(float(m4["grad_norm"]), float(m1["grad_norm"]), rtol=1e-4)
    assert int(m4["tokens"]) == batch.num_target_tokens
    for a, b in zip(jax.tree.leaves(s4.trainable), jax.tree.leaves(s1.trainable)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)


def test_adamw_with_clipping_and_schedule_matches_torch(params, batch, adamw_step, loss_grad):
    tx, step = adamw_step
    state = init_state(params, tx, ADAMW, jax.random.PRNGKey(0))
    leaves, treedef = jax.tree.flatten(params)
    tparams = [torch.nn.Parameter(torch.from_numpy(np.array(x))) for x in leaves]
    decay = [p for p in tparams if p.ndim >= 2]
    no_decay = [p for p in tparams if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}], lr=1.0, eps=1e-8
    )
    sched = optax.warmup_cosine_decay_schedule(0.0, 3e-3, 2, 6, 3e-4)
    for i in range(4):
        current = jax.tree.unflatten(treedef, [jnp.asarray(p.detach().numpy()) for p in tparams])
        _, g = loss_grad(current, _flat(batch))
        for p, gi in zip(tparams, jax.tree.leaves(g)):
            p.grad = torch.from_numpy(np.array(gi))
        torch.nn.utils.clip_grad_norm_(tparams, 0.3)
        for group in opt.param_groups:
            group["lr"] = float(sched(i))
        opt.step()
        state, metrics = step(state, None, _arrays(batch))
        assert float(metrics["lr"]) == pytest.approx(float(sched(i)), rel=1e-6, abs=1e-12)
    # Adam moves each coordinate by at most ~lr per step, and coordinates whose gradient is near zero turn
    # float32 rounding of m / sqrt(v) into a visible share of that step (measured: 1 of 4096 elements
    # 4.1e-6 apart on one CPU). So the absolute bar is a small share of the largest possible total move.
    max_move = sum(float(sched(i)) for i in range(4))
    for a, p in zip(jax.tree.leaves(state.trainable), tparams):
        np.testing.assert_allclose(np.asarray(a), p.detach().numpy(), rtol=1e-4, atol=1e-3 * max_move)


def test_sgd_step_applies_the_clipped_gradient(params, batch, sgd_step, loss_grad):
    tx, step = sgd_step
    state, m = step(init_state(params, tx, SGD, jax.random.PRNGKey(0)), None, _arrays(batch))
    _, g = loss_grad(params, _flat(batch))
    norm = float(optax.global_norm(g))
    assert float(m["grad_norm"]) == pytest.approx(norm, rel=1e-5) and norm > 0.01
    for new, old, gi in zip(jax.tree.leaves(state.trainable), jax.tree.leaves(params), jax.tree.leaves(g)):
        np.testing.assert_allclose(np.asarray(new), np.asarray(old - 0.5 * gi * 0.01 / norm), rtol=1e-4, atol=1e-7)


def test_lr_and_clip_change_without_recompiling(params, batch, adamw_step):
    tx, step = adamw_step
    state = init_state(params, tx, ADAMW, jax.random.PRNGKey(0))
    for _ in range(3):
        state, m1 = step(state, None, _arrays(batch))
    before = step._cache_size()
    state = dataclasses.replace(state, peak_lr=jnp.asarray(5e-4, jnp.float32), clip_norm=jnp.asarray(0.0, jnp.float32))
    state, m2 = step(state, None, _arrays(batch))
    assert step._cache_size() == before
    assert float(m2["lr"]) == pytest.approx(float(lr_schedule(3, jnp.float32(5e-4), ADAMW)))
    assert float(m2["lr"]) < float(m1["lr"])
    assert float(m2["grad_norm"]) > 0.0


def test_nonfinite_gradients_skip_the_update_and_are_flagged(params, batch, adamw_step):
    tx, step = adamw_step
    bad = jax.tree.map(lambda x: x, params)
    emb = bad["model"]["embed_tokens"]["weight"]
    bad["model"]["embed_tokens"]["weight"] = emb.at[int(batch.input_ids[0, 0])].set(jnp.nan)
    state = init_state(bad, tx, ADAMW, jax.random.PRNGKey(0))
    state = dataclasses.replace(state, step=jnp.asarray(3, jnp.int32))  # past warmup: lr > 0
    new, m = step(state, None, _arrays(batch))
    assert not bool(m["loss_finite"]) and not bool(m["grads_finite"]) and bool(m["skipped"])
    assert not bool(m["params_finite"])  # the planted NaN is still there
    assert int(new.step) == 4
    for a, b in zip(jax.tree.leaves(new.trainable), jax.tree.leaves(state.trainable)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    ok, m_ok = step(dataclasses.replace(state, trainable=params), None, _arrays(batch))
    assert bool(m_ok["loss_finite"]) and bool(m_ok["params_finite"]) and not bool(m_ok["skipped"])
    assert not np.array_equal(np.asarray(jax.tree.leaves(ok.trainable)[0]), np.asarray(jax.tree.leaves(params)[0]))


def test_adafactor_trains_and_an_unknown_optimizer_is_refused_with_the_choices(model, params, batch):
    settings = OptimizerSettings(learning_rate=1e-2)
    tx, step = _step_fn(model, settings, TrainConfig(method="full", precision="fp32", optimizer="adafactor"))
    state = init_state(params, tx, settings, jax.random.PRNGKey(0))
    losses = []
    for _ in range(3):
        state, m = step(state, None, _arrays(batch))
        losses.append(float(m["loss"]))
    assert losses[-1] < losses[0]
    bad = TrainConfig.model_construct(**{**TrainConfig(method="full").__dict__, "optimizer": "lion"})
    with pytest.raises(InvalidConfigError, match="adamw, adamw_8bit, paged_adamw_8bit, sgd and adafactor"):
        make_optimizer(bad, settings)


def test_precision_modes_map_to_dtypes():
    from typing import get_args

    from aegis.schema import Precision

    assert precision_dtypes("bf16_mixed").params == jnp.float32
    assert precision_dtypes("bf16_mixed").compute == jnp.bfloat16
    assert precision_dtypes("bf16").lora == jnp.float32  # PEFT keeps adapters fp32 under a bf16 base
    fp16 = precision_dtypes("fp16_mixed")
    assert (fp16.compute, fp16.params, fp16.lora, fp16.loss_scaling) == (jnp.float16, jnp.float32, jnp.float32, True)
    assert not any(precision_dtypes(p).loss_scaling for p in get_args(Precision) if p != "fp16_mixed")
    with pytest.raises(InvalidConfigError, match="fp16_mixed"):
        precision_dtypes("fp8")


def test_every_public_name_of_the_engine_imports():
    import aegis.train

    for name in aegis.train.__all__:
        assert getattr(aegis.train, name) is not None, name
