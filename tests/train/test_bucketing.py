"""Length-bucketed sampling with packing off: batches of similar-length examples padded to one of a few lengths, so
padding waste drops while every example is still drawn once per epoch and the step compiles a bounded number of
programs."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from aegis.train.data import BatchSampler, Example, bucket_lengths


def long_tailed_chats(n: int, seq_len: int, *, seed: int = 0, domain: str = "chat") -> list[Example]:
    """Chat-shaped examples whose lengths are log-normal around a quarter of ``seq_len`` (a long tail up to it): a
    prompt of a third of the tokens, the answer trained on."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(np.exp(rng.normal(np.log(seq_len / 4), 0.9, n)).astype(int), 8, seq_len)
    out = []
    for i, length in enumerate(lengths):
        mask = np.zeros(length, bool)
        mask[length // 3:] = True
        ids = rng.integers(3, 250, size=length).astype(np.int32)
        out.append(Example(sample_id=f"{domain}-{i}", domain=domain, input_ids=ids, loss_mask=mask))
    return out


def _draw(sampler: BatchSampler, batches: int) -> tuple[list, float]:
    out = [sampler.next_batch() for _ in range(batches)]
    useful = sum(int((b.segment_ids > 0).sum()) for b in out) / sum(b.segment_ids.size for b in out)
    return out, useful


@pytest.mark.parametrize("seq_len, batch", [(1024, 4), (2048, 8), (512, 16)])
def test_buckets_raise_the_useful_token_fraction_and_keep_shapes_bounded(seq_len, batch):
    examples = long_tailed_chats(2048, seq_len)
    n = len(examples) // batch
    padded, plain = _draw(BatchSampler(examples, batch, seq_len, seed=1, packing=False), n)
    bucketed_sampler = BatchSampler(examples, batch, seq_len, seed=1, packing=False, buckets=True)
    bucketed, fill = _draw(bucketed_sampler, n)
    assert fill >= 0.85 and fill > plain + 0.4, (fill, plain)  # measured: ~0.90 vs 0.33
    shapes = {b.shape for b in bucketed}
    assert {s[0] for s in shapes} == {batch}
    lengths = bucket_lengths(seq_len)
    assert {s[1] for s in shapes} <= set(lengths) and len(shapes) <= len(lengths) == len(bucketed_sampler.lengths)
    assert all(b.shape == (batch, seq_len) for b in padded)
    for b in bucketed:  # each batch takes the shortest allowed length that holds its longest example
        longest = int((b.segment_ids > 0).sum(axis=1).max())
        assert b.shape[1] == min(n for n in lengths if n >= longest)


def test_every_example_once_per_epoch_none_dropped_or_repeated():
    examples = long_tailed_chats(1024, 256)  # 1024 = 8 windows of 32 batches x 4 rows
    sampler = BatchSampler(examples, 4, 256, seed=3, packing=False, buckets=True)
    by_id = {ex.sample_id: ex for ex in examples}
    for epoch in range(2):
        got = Counter(i for b in (sampler.next_batch() for _ in range(256)) for i in b.sample_ids)
        assert got == Counter({ex.sample_id: 1 for ex in examples}), epoch
    b = sampler.next_batch()  # rows hold the examples' own tokens, padded after them
    for r, sid in enumerate(b.sample_ids):
        ex = by_id[sid]
        assert (b.input_ids[r, : len(ex)] == ex.input_ids).all() and (b.segment_ids[r, len(ex):] == 0).all()
        assert (b.loss_mask[r, : len(ex) - 1] == ex.loss_mask[1:]).all()


def test_a_window_that_straddles_epochs_still_draws_each_example_once_per_epoch():
    examples = long_tailed_chats(1000, 256)  # not a multiple of a window (128 rows): windows cross the epoch
    sampler = BatchSampler(examples, 4, 256, seed=0, packing=False, buckets=True)
    got = Counter(i for _ in range(256) for i in sampler.next_batch().sample_ids)  # 8 windows = 1,024 draws
    assert set(got) == {ex.sample_id for ex in examples} and sum(got.values()) == 1024
    assert sorted(Counter(got.values()).items()) == [(1, 976), (2, 24)]


def test_seeded_resumable_and_the_blacklist_applies_to_a_drawn_window():
    examples = long_tailed_chats(600, 256, domain="a") + long_tailed_chats(400, 256, seed=1, domain="b")
    a = BatchSampler(examples, 4, 256, seed=5, packing=False, buckets=True)
    first = [a.next_batch().sample_ids for _ in range(40)]  # mid-window: the queue is part of the state
    state = a.state_dict()
    rest = [a.next_batch().sample_ids for _ in range(40)]
    b = BatchSampler(examples, 4, 256, seed=5, packing=False, buckets=True)
    assert [b.next_batch().sample_ids for _ in range(40)] == first
    c = BatchSampler(examples, 4, 256, seed=0, packing=False, buckets=True)
    c.load_state_dict(state)
    assert [c.next_batch().sample_ids for _ in range(40)] == rest
    assert [BatchSampler(examples, 4, 256, seed=6, packing=False, buckets=True).next_batch().sample_ids
            for _ in range(3)] != first[:3]
    d = BatchSampler(examples, 4, 256, seed=0, packing=False, buckets=True)
    d.load_state_dict(state)
    banned = set(rest[0])
    d.set_blacklist(banned)
    assert not banned & {i for _ in range(40) for i in d.next_batch().sample_ids}


def test_bucket_lengths_waste_at_most_a_quarter_and_grow_with_log_seq_len():
    for seq_len in (64, 512, 2048, 8192):
        lengths = bucket_lengths(seq_len)
        assert list(lengths) == sorted(set(lengths)) and lengths[-1] == seq_len
        assert all(n % 8 == 0 for n in lengths[:-1])
        worst = max(min(n for n in lengths if n >= k) / k for k in range(64, seq_len + 1))
        assert worst <= 1.25
        assert len(lengths) <= 4 * np.log2(seq_len / 16) + 1
    assert bucket_lengths(2048)[7:12] == (80, 96, 112, 128, 160)  # four per octave, on multiples of 16 there


def test_packing_ignores_buckets_and_keeps_the_fixed_shape():
    examples = long_tailed_chats(64, 128)
    s = BatchSampler(examples, 4, 128, packing=True, buckets=True)
    assert s.lengths == (128,) and all(s.next_batch().shape == (4, 128) for _ in range(4))


@pytest.mark.slow
def test_a_bucketed_step_equals_the_same_examples_padded_to_seq_len():
    """Padding to a bucket's length instead of seq_len changes no number: loss and gradient norm of the trainer's
    first bucketed step equal the same trainer's step on the same rows padded to seq_len; tokens/s counts the
    bucket's positions."""
    import jax

    from aegis.data import tiny_llama_config
    from aegis.schema import TrainConfig
    from aegis.train.data import pack_examples
    from aegis.train.loop import Trainer

    examples = [ex for ex in long_tailed_chats(400, 64, seed=2) if 10 <= len(ex) <= 20]
    tc = TrainConfig(method="full", micro_batch_size=4, seq_len=64, precision="fp32")
    bucketed = Trainer(tiny_llama_config(), tc, examples, seed=0, packing=False, buckets=True)
    (info,) = list(bucketed.train(1))
    batch = bucketed.last_batch
    assert batch.shape[1] in (16, 24) and info.useful_token_fraction > 0.6
    assert info.tokens_per_s == pytest.approx(batch.input_ids.size / info.step_time_s)
    by_id = {ex.sample_id: ex for ex in examples}
    padded, _ = pack_examples([by_id[i] for i in batch.sample_ids], 4, 64, packing=False)
    reference = Trainer(tiny_llama_config(), tc, examples, seed=0, packing=False)
    _, metrics = reference._step(reference.state, reference.frozen, reference._device_batch(padded))
    metrics = jax.device_get(metrics)
    assert info.loss == pytest.approx(float(metrics["loss"]), rel=1e-5)
    assert info.grad_norm == pytest.approx(float(metrics["grad_norm"]), rel=1e-4)
    assert info.tokens == int(metrics["tokens"])
