"""Per-sample losses and gradient norms: vmap kernel vs a loop of single-sample grads; outliers stand out."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from aegis.data import ByteTokenizer, tiny_llama_config, toy_dataset_path
from aegis.schema import TrainConfig
from aegis.train.data import BatchSampler, Example, load_jsonl, pack_examples
from aegis.train.per_sample import analyze_batch
from aegis.train.lora import init_lora
from aegis.train.loop import Trainer
from aegis.train.modeling import build_model
from aegis.train.step import OptimizerSettings, token_loss_sum

pytestmark = pytest.mark.slow

TOK = ByteTokenizer()
EXAMPLES = load_jsonl(toy_dataset_path(), TOK)


def _single_sample_reference(model, trainable, frozen, examples, seq_len):
    """Loss and gradient norm of each example alone in a [1, seq] padded batch, one at a time."""

    @jax.jit
    def one(trainable, arrays):
        def loss(t):
            total, count = token_loss_sum(model, t, frozen, arrays)
            return total / count

        value, grads = jax.value_and_grad(loss)(trainable)
        return value, optax.global_norm(grads)

    out = []
    for ex in examples:
        batch, _ = pack_examples([ex], 1, seq_len, packing=False)
        value, norm = one(trainable, {k: jnp.asarray(v) for k, v in batch.arrays().items()})
        out.append((float(value), float(norm)))
    return np.array(out)


@pytest.mark.parametrize("method", ["full", "lora"])
def test_vmap_kernel_equals_a_loop_of_single_sample_grads(method):
    model = build_model(tiny_llama_config())
    params = model.init(jax.random.PRNGKey(3))
    if method == "full":
        trainable, frozen = params, None
    else:
        lora = init_lora(model, params, rank=4, alpha=8, target_modules=("q_proj", "v_proj", "down_proj"),
                         rng=jax.random.PRNGKey(4))
        # B starts at zero (then A has no gradient): give it values so every adapter matrix matters
        keys = iter(jax.random.split(jax.random.PRNGKey(5), 64))
        trainable = jax.tree.map(lambda x: x + 0.05 * jax.random.normal(next(keys), x.shape), lora)
        frozen = params
    batch = BatchSampler(EXAMPLES, 4, 64, seed=3, packing=True).next_batch()  # several samples per row
    assert len(batch.sample_ids) > batch.shape[0]
    report = analyze_batch(model, trainable, frozen, batch, chunk_size=3)  # 3 does not divide n
    by_id = {e.sample_id: e for e in EXAMPLES}
    ref = _single_sample_reference(model, trainable, frozen, [by_id[i] for i in batch.sample_ids], 64)
    assert report.sample_ids == batch.sample_ids
    np.testing.assert_allclose(report.losses, ref[:, 0], rtol=1e-4)
    np.testing.assert_allclose(report.grad_norms, ref[:, 1], rtol=1e-3)
    assert len(set(np.round(report.grad_norms, 6))) == len(batch.sample_ids)  # per sample, not per batch
    assert [s.tokens for s in report.samples] == [int(by_id[i].loss_mask[1:64].sum()) for i in batch.sample_ids]


def test_a_planted_garbage_sample_stands_out():
    tc = TrainConfig(method="full", micro_batch_size=8, seq_len=64, precision="fp32")
    tr = Trainer(
        tiny_llama_config(), tc, EXAMPLES, optimizer=OptimizerSettings(learning_rate=3e-3, total_steps=100), seed=0
    )
    list(tr.train(30))
    rng = np.random.default_rng(0)
    garbage = Example("planted", "prose", rng.integers(128, 256, size=50), np.ones(50, bool))  # not UTF-8 text
    clean = BatchSampler(EXAMPLES, 4, 64, seed=9, packing=False)
    picked = [tr.sampler.example(i) for _ in range(4) for i in clean.next_batch().sample_ids][:15]
    batch, _ = pack_examples([*picked[:7], garbage, *picked[7:]], 16, 64, packing=False)
    report = tr.analyze(batch, chunk_size=4)
    assert report.top(1)[0].sample_id == "planted"
    assert report.top(1, by="loss")[0].sample_id == "planted"
    assert "planted" in report.outliers(z=3.0)
    others = np.delete(report.grad_norms, 7)
    assert report.grad_norms[7] > 3 * np.median(others)
    by_ids = tr.analyze(sample_ids=[p.sample_id for p in picked[:3]], chunk_size=4)
    assert by_ids.sample_ids == tuple(p.sample_id for p in picked[:3])
    np.testing.assert_allclose(by_ids.grad_norms, report.grad_norms[:3], rtol=1e-4)
