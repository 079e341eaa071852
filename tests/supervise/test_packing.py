"""A supervised run packs several examples into each row (first fit; attention and positions per example): the
supervisor's forensics blames a bad example that shares a packed row with good ones, and a blacklist removes
exactly that example from the packed batches that follow, a carried-over copy of it included."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from aegis.supervise.forensics import diagnose
from aegis.supervise.run_config import parse_run_config

from .conftest import run_config, write_arith_dataset

BAD = "toxic-short"


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory):
    """The tier-0 engine of a packed run (the run's own Engine.build) on 300 arithmetic rows plus one short row of
    random characters (30: it fits a row beside arithmetic ones), after 30 steps of learning the arithmetic."""
    from aegis.supervise.engine_handle import Engine, load_examples, resolve_model_input

    tmp = tmp_path_factory.mktemp("packed")
    data = tmp / "arith.jsonl"
    write_arith_dataset(data, 300, 0)
    rng = random.Random(1)
    noise = "".join(chr(rng.randrange(33, 127)) for _ in range(30))
    with data.open("a") as f:
        f.write(json.dumps({"id": BAD, "domain": "addsub", "text": noise}) + "\n")
    cfg = parse_run_config(run_config(tmp, data=str(data)))
    assert cfg.training.packing
    model = resolve_model_input(cfg.model, cfg.init)
    examples, _ = load_examples(cfg, model)
    eng = Engine.build(cfg, model, examples, 0)
    for _ in eng.trainer.train(30):
        pass
    return eng, cfg, examples, tmp


@pytest.mark.slow
def test_forensics_blames_the_bad_example_that_shares_a_packed_row(engine):
    eng, cfg, _, tmp = engine
    trainer = eng.trainer
    steps = []
    for info in trainer.train(12):  # ~37 examples a batch: every example comes round within ~8 steps
        steps.append(info)
        if BAD in info.sample_ids:
            break
    eng.settle()
    hit = steps[-1]
    assert BAD in hit.sample_ids and len(hit.sample_ids) > 3 * cfg.train_config.micro_batch_size
    batch = trainer.last_batch
    k = batch.sample_ids.index(BAD)
    row = int(np.argwhere(batch.sample_index == k)[0, 0])
    neighbours = set(np.unique(batch.sample_index[row])) - {k, -1}
    assert neighbours, "the bad example has a packed row to itself"
    # the spike the monitor sees: ~30 noise tokens among ~470 lift the batch's mean loss above every clean batch's
    assert len(steps) > 1 and hit.loss > max(s.loss for s in steps[:-1])

    # its packed row, the loss masked to each example's own tokens, gives what each example gives alone in a row
    packed = trainer.analyze(batch)
    alone = trainer.analyze(sample_ids=batch.sample_ids)
    assert packed.sample_ids == alone.sample_ids == batch.sample_ids
    np.testing.assert_allclose(packed.losses, alone.losses, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(packed.grad_norms, alone.grad_norms, rtol=1e-3, atol=1e-5)

    report = diagnose("loss_spike", trainer, hit.sample_ids, [s.sample_ids for s in steps[:-1]], hit.step, 30,
                      cfg.forensics, tmp / "forensics")
    assert report.verdict == "outliers" and report.suspected_samples == (BAD,)


@pytest.mark.slow
def test_a_blacklist_removes_exactly_that_example_from_later_packed_batches(engine):
    eng, cfg, examples, _ = engine
    trainer = eng.trainer
    eng.settle()
    # the bad example waits carried over (drawn, did not fit) at the head of the next batch, as packing leaves it
    state = trainer.sampler.state_dict()
    carried = [i for i in state["pending"] if i != BAD]
    trainer.sampler.load_state_dict({**state, "pending": [BAD, *carried]})
    trainer.set_blacklist([BAD])  # what Engine.sync applies after a blacklist repair
    assert trainer.sampler.state_dict()["pending"] == carried  # only it left the carried-over examples

    seen: list[str] = []
    infos = list(trainer.train(10))  # more than an epoch of 301 examples at ~37 a batch
    for info in infos:
        seen.extend(info.sample_ids)
    assert BAD not in seen
    assert set(carried) <= set(infos[0].sample_ids)  # the carried-over examples still go first
    assert set(seen) == {ex.sample_id for ex in examples} - {BAD}  # every other example still trains
    assert all(info.useful_token_fraction >= 0.9 for info in infos)
