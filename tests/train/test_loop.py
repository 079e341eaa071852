"""Trainer: a tiny llama learns the toy data; hooks, live settings, blacklist, domain mix, exact resume."""

from __future__ import annotations

from collections import Counter

import jax
import numpy as np
import pytest

from aegis.data import ByteTokenizer, tiny_llama_config, toy_dataset_path
from aegis.errors import CheckpointError, DatasetError
from aegis.schema import LoRAConfig, TrainConfig
from aegis.train.data import load_jsonl, split_examples
from aegis.train.loop import StepInfo, Trainer
from aegis.train.step import OptimizerSettings

pytestmark = pytest.mark.slow

EXAMPLES = load_jsonl(toy_dataset_path(), ByteTokenizer())
TRAIN, HELD = split_examples(EXAMPLES, 0.15, seed=0)


@pytest.fixture(scope="module")
def trainer(tmp_path_factory) -> Trainer:
    """One trainer (one compile) shared by the tests; its initial state is saved as ``trainer.initial``."""
    tc = TrainConfig(method="full", micro_batch_size=8, seq_len=64, precision="fp32")
    settings = OptimizerSettings(learning_rate=3e-3, warmup_steps=3, total_steps=200, weight_decay=0.01)
    tr = Trainer(tiny_llama_config(), tc, TRAIN, eval_examples=HELD, optimizer=settings, seed=0)
    tr.initial = tr.save(tmp_path_factory.mktemp("initial") / "ckpt")
    return tr


def test_tiny_llama_loss_falls_on_the_toy_dataset(trainer):
    trainer.restore(trainer.initial)  # tests may run in any order (xdist): start from step 0
    assert trainer.step == 0
    before = trainer.eval()
    infos = list(trainer.train(40))
    after = trainer.eval()
    assert before == pytest.approx(np.log(264), abs=0.15)  # random init predicts ~uniformly
    assert after < before - 1.5, (before, after)
    assert np.mean([i.loss for i in infos[-5:]]) < infos[0].loss - 1.5
    assert [i.step for i in infos] == list(range(1, 41))
    assert all(isinstance(i, StepInfo) and not i.nan_or_inf and not i.update_skipped for i in infos)
    assert all(i.tokens_per_s > 0 and i.sample_ids for i in infos)
    assert infos[-1].epoch > infos[0].epoch


def test_hooks_fire_on_their_interval(trainer):
    seen = []
    trainer.add_hook(lambda info: seen.append(info.step), every=3)
    start = trainer.step
    list(trainer.train(7))
    trainer._hooks.clear()
    assert seen == [s for s in range(start + 1, start + 8) if s % 3 == 0]


def test_lr_and_clip_are_live_and_do_not_recompile(trainer):
    list(trainer.train(4))  # past the 3 warmup steps, whatever ran before
    compiled = trainer._step._cache_size()
    (base,) = trainer.train(1)
    trainer.set_lr(trainer.lr / 10)
    trainer.set_clip(1e-3)
    (low,) = trainer.train(1)
    assert low.lr == pytest.approx(base.lr / 10, rel=0.05)  # the cosine moves a little between steps
    assert trainer.clip_norm == pytest.approx(1e-3)
    assert trainer._step._cache_size() == compiled
    trainer.set_lr(3e-3)
    trainer.set_clip(1.0)


def test_blacklist_set_mid_window_applies_to_the_very_next_step(trainer):
    banned: set[str] = set()

    def ban(info: StepInfo) -> None:
        # ban everything the sampler is about to serve (the prefetched batch included)
        banned.update(e.sample_id for e in TRAIN if e.domain == "chat")
        trainer.set_blacklist(sorted(banned))

    trainer.add_hook(ban, every=1)
    infos = []
    for info in trainer.train(4):
        infos.append(info)
    trainer._hooks.clear()
    later = [sid for info in infos[1:] for sid in info.sample_ids]
    assert later and not set(later) & banned
    trainer.set_blacklist([])


def test_domain_weights_change_the_mix_without_recompiling(trainer):
    list(trainer.train(1))
    compiled = trainer._step._cache_size()
    trainer.set_domain_weights({"arithmetic": 1.0})
    domains = Counter(
        trainer.sampler.example(sid).domain for info in trainer.train(4) for sid in info.sample_ids
    )
    assert domains["arithmetic"] >= sum(domains.values()) - 1  # one carried-over example at most
    assert trainer._step._cache_size() == compiled
    trainer.set_domain_weights({"arithmetic": 1.0, "chat": 1.0, "prose": 1.0})


def test_eval_by_domain(trainer):
    per = {d: trainer.eval(d) for d in ("arithmetic", "chat", "prose")}
    assert all(np.isfinite(v) and v > 0 for v in per.values())
    with pytest.raises(DatasetError, match="eval domains"):
        trainer.eval("poetry")


def test_save_restore_replays_the_same_steps(trainer, tmp_path):
    list(trainer.train(2))
    trainer.save(tmp_path / "ckpt")
    first = [(i.loss, i.sample_ids) for i in trainer.train(5)]
    trainer.set_lr(1e-4)  # restored state brings back the saved LR too
    trainer.restore(tmp_path / "ckpt")
    again = [(i.loss, i.sample_ids) for i in trainer.train(5)]
    assert [ids for _, ids in again] == [ids for _, ids in first]
    np.testing.assert_allclose([l for l, _ in again], [l for l, _ in first], rtol=1e-6)


def test_restore_refuses_other_methods_and_missing_folders(trainer, tmp_path):
    trainer.save(tmp_path / "full")
    lora = Trainer(
        tiny_llama_config(),
        TrainConfig(method="lora", micro_batch_size=8, seq_len=64, precision="fp32"),
        TRAIN,
    )
    with pytest.raises(CheckpointError, match="different model or method"):
        lora.restore(tmp_path / "full")
    with pytest.raises(CheckpointError, match="not an Aegis checkpoint"):
        trainer.restore(tmp_path / "nowhere")


@pytest.mark.parametrize("method", ["lora", "qlora"])
def test_adapters_train_and_the_base_stays_frozen(method):
    tc = TrainConfig(
        method=method, micro_batch_size=8, seq_len=64, precision="fp32", lora=LoRAConfig(rank=8, alpha=16)
    )
    tr = Trainer(
        tiny_llama_config(), tc, TRAIN, optimizer=OptimizerSettings(learning_rate=3e-2, total_steps=20), seed=1
    )
    frozen_before = jax.tree.map(np.asarray, tr.frozen)
    infos = list(tr.train(12))
    assert all(not i.nan_or_inf for i in infos)
    assert np.mean([i.loss for i in infos[-3:]]) < infos[0].loss - 0.05
    flat = jax.tree_util.tree_flatten_with_path(tr.state.trainable)[0]
    b_mats = [np.asarray(x) for path, x in flat if "lora_B" in jax.tree_util.keystr(path)]
    assert b_mats and all(np.abs(b).max() > 0 for b in b_mats)  # B starts at zero
    for a, b in zip(jax.tree.leaves(tr.frozen), jax.tree.leaves(frozen_before)):
        np.testing.assert_array_equal(np.asarray(a), b)
    if method == "qlora":
        assert any(np.asarray(x).dtype == np.uint8 for x in jax.tree.leaves(tr.frozen))
