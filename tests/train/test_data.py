"""Data layer: stable ids, fixed shapes, correct targets/masks, blacklist, domain mixing, resume."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aegis.data import ByteTokenizer, tiny_llama_config, toy_dataset_path
from aegis.errors import DatasetError
from aegis.train.data import (
    BatchSampler,
    Example,
    iter_batches,
    load_jsonl,
    pack_examples,
    split_examples,
    tokenize_row,
    tokenize_rows,
)

TOK = ByteTokenizer()


@pytest.fixture(scope="module")
def examples() -> list[Example]:
    return load_jsonl(toy_dataset_path(), TOK)


def test_toy_dataset_has_three_domains_and_fits_the_tiny_vocab(examples):
    assert len(examples) == 252
    assert {ex.domain for ex in examples} == {"arithmetic", "chat", "prose"}
    assert max(int(ex.input_ids.max()) for ex in examples) < tiny_llama_config()["vocab_size"]
    assert len({ex.sample_id for ex in examples}) == len(examples)


def test_sample_ids_are_stable_across_loads_and_independent_of_row_order(tmp_path, examples):
    again = load_jsonl(toy_dataset_path(), TOK)
    assert [e.sample_id for e in again] == [e.sample_id for e in examples]
    rows = [json.loads(line) for line in toy_dataset_path().read_text().splitlines()]
    shuffled = tmp_path / "rev.jsonl"
    shuffled.write_text("\n".join(json.dumps(r) for r in reversed(rows)))
    assert {e.sample_id for e in load_jsonl(shuffled, TOK)} == {e.sample_id for e in examples}


def test_explicit_ids_win_and_duplicates_get_suffixes():
    assert tokenize_row({"id": 7, "text": "abc"}, TOK).sample_id == "7"
    exs = tokenize_rows([{"text": "same"}, {"text": "same"}], TOK)
    assert exs[1].sample_id == exs[0].sample_id + "#2"


def test_chat_rows_train_only_on_assistant_tokens():
    ex = tokenize_row(
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}, TOK
    )
    trained = [int(t) for t, m in zip(ex.input_ids, ex.loss_mask) if m]
    assert TOK.decode(trained) == "yo<|assistant_end|>"


def test_bad_rows_raise_dataset_errors(tmp_path):
    with pytest.raises(DatasetError, match="neither a 'text'"):
        tokenize_row({"prompt": "x"}, TOK)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{not json\n')
    with pytest.raises(DatasetError, match=r"bad.jsonl:2"):
        load_jsonl(bad, TOK)


@pytest.mark.parametrize("packing", [False, True])
def test_batches_have_fixed_shape_and_targets_are_next_tokens_of_the_same_example(examples, packing):
    sampler = BatchSampler(examples, batch_size=4, seq_len=48, seed=1, packing=packing)
    by_id = {e.sample_id: e for e in examples}
    for _ in range(5):
        b = sampler.next_batch()
        assert b.input_ids.shape == b.targets.shape == b.loss_mask.shape == (4, 48)
        if not packing:
            assert len(b.sample_ids) == 4
        for k, sid in enumerate(b.sample_ids):
            ex = by_id[sid]
            r, cols = np.nonzero(b.sample_index == k)
            assert len(set(r)) == 1
            n = min(len(ex), 48)
            np.testing.assert_array_equal(b.input_ids[r[0], cols], ex.input_ids[:n])
            np.testing.assert_array_equal(b.positions[r[0], cols], np.arange(n))
            # targets: next token; mask: whether that next token is a training target
            np.testing.assert_array_equal(b.targets[r[0], cols[:-1]], ex.input_ids[1:n])
            np.testing.assert_array_equal(b.loss_mask[r[0], cols[:-1]], ex.loss_mask[1:n])
            assert b.loss_mask[r[0], cols[-1]] == 0  # the last token has no target inside its example
        assert np.all(b.loss_mask[b.segment_ids == 0] == 0)


def test_packing_fills_rows_better_than_padding(examples):
    pad = BatchSampler(examples, 4, 128, packing=False).next_batch()
    packed = BatchSampler(examples, 4, 128, packing=True).next_batch()
    assert (packed.segment_ids > 0).mean() > 2 * (pad.segment_ids > 0).mean()


def test_long_examples_are_truncated_to_seq_len():
    ex = tokenize_row({"text": "x" * 100}, TOK)
    batch, rest = pack_examples([ex], 2, 16, packing=True)
    assert not rest and (batch.segment_ids[0] == 1).all() and batch.loss_mask[0].sum() == 15


def test_blacklisted_ids_never_appear(examples):
    banned = {e.sample_id for e in examples[:100]}
    sampler = BatchSampler(examples, 8, 64, seed=3, blacklist=banned)
    seen = set()
    for _ in range(40):
        seen |= set(sampler.next_batch().sample_ids)
    assert seen and not seen & banned
    assert len(seen) == len(examples) - len(banned)  # everything else still shows up


def test_blacklisting_everything_is_refused(examples):
    sampler = BatchSampler(examples, 2, 32)
    with pytest.raises(DatasetError, match="every example"):
        sampler.set_blacklist([e.sample_id for e in examples])


def test_a_fully_blacklisted_domain_drops_out_of_the_mix(examples):
    chat = [e.sample_id for e in examples if e.domain == "chat"]
    sampler = BatchSampler(examples, 4, 64, seed=0, blacklist=chat)
    domains = Counter(sampler.example(i).domain for _ in range(10) for i in sampler.next_batch().sample_ids)
    assert "chat" not in domains and domains


def test_domain_weights_steer_the_mix_without_changing_shapes(examples):
    sampler = BatchSampler(examples, 8, 64, seed=0, packing=True)
    first = sampler.next_batch()
    sampler.set_domain_weights({"chat": 1.0})
    counts = Counter()
    for _ in range(10):
        b = sampler.next_batch()
        assert b.shape == first.shape
        counts.update(sampler.example(i).domain for i in b.sample_ids)
    # one carried-over example from before the change may remain
    assert counts["chat"] >= sum(counts.values()) - 1
    sampler.set_domain_weights({"arithmetic": 3, "prose": 1})
    counts = Counter(sampler.example(i).domain for _ in range(30) for i in sampler.next_batch().sample_ids)
    share = counts["arithmetic"] / (counts["arithmetic"] + counts["prose"])
    assert 0.65 < share < 0.85 and counts["chat"] <= 1
    with pytest.raises(DatasetError, match="unknown domain"):
        sampler.set_domain_weights({"poetry": 1})


@pytest.mark.parametrize("packing", [False, True])
def test_resume_from_state_dict_replays_the_same_batches(examples, packing):
    a = BatchSampler(examples, 4, 64, seed=5, packing=packing, domain_weights={"chat": 2, "prose": 1, "arithmetic": 1})
    for _ in range(7):
        a.next_batch()
    a.set_blacklist([examples[0].sample_id])
    state = json.loads(json.dumps(a.state_dict()))  # survives a JSON round trip
    expected = [a.next_batch().sample_ids for _ in range(20)]
    b = BatchSampler(examples, 4, 64, seed=0, packing=packing)
    b.load_state_dict(state)
    assert [b.next_batch().sample_ids for _ in range(20)] == expected
    assert b.blacklist == a.blacklist


def test_every_example_is_seen_once_per_epoch_with_natural_weights(examples):
    sampler = BatchSampler(examples, 4, 64, seed=2, packing=False)
    ids = [i for _ in range(len(examples) // 4) for i in sampler.next_batch().sample_ids]
    # natural weights sample domains in proportion, so after one dataset's worth most ids appeared once
    assert len(set(ids)) > 0.8 * len(examples)
    assert abs(sampler.epoch - 1.0) < 1e-9


def test_iter_batches_covers_every_example_once(examples):
    ids = [i for b in iter_batches(examples, 4, 64, packing=True) for i in b.sample_ids]
    assert sorted(ids) == sorted(e.sample_id for e in examples)


def test_split_is_deterministic_and_disjoint(examples):
    tr, ev = split_examples(examples, 0.2, seed=1)
    tr2, ev2 = split_examples(examples, 0.2, seed=1)
    assert [e.sample_id for e in ev] == [e.sample_id for e in ev2]
    assert not {e.sample_id for e in tr} & {e.sample_id for e in ev}
    assert 0.1 < len(ev) / len(examples) < 0.3


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(2, 40), min_size=1, max_size=30),
    batch=st.integers(1, 4),
    seq=st.integers(8, 64),
    packing=st.booleans(),
)
def test_pack_examples_conserves_tokens(lengths, batch, seq, packing):
    exs = [Example(str(i), "d", np.arange(n) % 250, np.ones(n, bool)) for i, n in enumerate(lengths)]
    b, rest = pack_examples(exs, batch, seq, packing=packing)
    placed = {int(i) for i in b.sample_ids}
    assert placed | {int(e.sample_id) for e in rest} == set(range(len(exs)))
    assert (b.segment_ids > 0).sum() == sum(min(lengths[i], seq) for i in placed)
    assert b.loss_mask.sum() == sum(min(lengths[i], seq) - 1 for i in placed)


def test_the_data_layer_does_not_import_jax():
    import subprocess
    import sys

    code = "import sys, aegis.train.data, aegis.data; print('jax' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
