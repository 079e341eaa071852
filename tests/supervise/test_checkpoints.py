"""Orbax checkpoint store: async saves, keep-last-N, rollback, corrupt newest -> previous."""

import numpy as np
import pytest

from aegis.errors import CheckpointError
from aegis.supervise.checkpoints import CheckpointStore


def _tree(k):
    return {"w": np.full((4, 3), float(k), np.float32), "step": np.asarray(k, np.int32)}


def test_interval_retention_rollback_and_corruption(tmp_path):
    store = CheckpointStore(tmp_path / "checkpoints", interval=2, keep_last_n=3, async_save=True)
    for step in range(1, 11):
        store.maybe_save(step, _tree(step), {"lr": 0.1 * step})
    store.wait()
    assert store.all_steps() == [6, 8, 10]
    target = _tree(0)
    got = store.restore_latest(target)
    assert got.step == 10 and got.meta["lr"] == pytest.approx(1.0)
    np.testing.assert_array_equal(got.state["w"], _tree(10)["w"])
    # damage the newest: truncate every data file of step 10
    for f in (tmp_path / "checkpoints" / "10").rglob("*"):
        if f.is_file() and "d" in f.parent.name:
            f.write_bytes(b"")
    seen = []
    got = store.restore_latest(target, on_corrupt=lambda s, why: seen.append(s))
    assert got.step == 8 and seen == [10] and got.skipped_corrupt == (10,)
    assert store.all_steps() == [6, 8]
    assert (tmp_path / "corrupt_checkpoints").is_dir()
    assert store.rollback(6) == [8] and store.all_steps() == [6]
    assert store.restore_latest(target, max_step=5) is None
    with pytest.raises(CheckpointError, match="no checkpoint at step 7"):
        store.restore(7, target)
    store.close()
    reopened = CheckpointStore(tmp_path / "checkpoints", interval=2, keep_last_n=3)
    assert reopened.all_steps() == [6]


def _legacy_state(k):
    """A TrainState as Aegis wrote it before dynamic loss scaling (no loss_scale / good_steps fields)."""
    import dataclasses
    from typing import Any

    import jax

    @jax.tree_util.register_dataclass
    @dataclasses.dataclass
    class TrainState:
        step: Any
        trainable: Any
        opt_state: Any
        rng: Any
        peak_lr: Any
        clip_norm: Any

    return TrainState(np.asarray(k, np.int32), {"w": np.full((4, 3), float(k), np.float32)},
                      ({"mu": np.full((4, 3), 0.5, np.float32)},), np.asarray([7, 9], np.uint32),
                      np.asarray(1e-3, np.float32), np.asarray(1.0, np.float32))


def test_a_checkpoint_from_before_loss_scaling_restores_with_the_defaults(tmp_path):
    """Upgrading Aegis mid-run keeps the run: the old checkpoint is not taken for a damaged one."""
    import dataclasses

    import jax

    from aegis.train.step import TrainState

    store = CheckpointStore(tmp_path / "checkpoints", interval=1, keep_last_n=3, async_save=False)
    store.save(4, _legacy_state(4), {"lr": 1e-3})
    old = _legacy_state(0)
    current = TrainState(**{f.name: getattr(old, f.name) for f in dataclasses.fields(old)})
    target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), jax.device_put(current))
    seen = []
    got = store.restore_latest(target, on_corrupt=lambda s, why: seen.append(s))
    assert got is not None and got.step == 4 and seen == [] and store.all_steps() == [4]
    assert got.defaulted == ("good_steps", "loss_scale")
    assert isinstance(got.state, TrainState)
    assert float(got.state.loss_scale) == 1.0 and int(got.state.good_steps) == 0
    assert got.state.loss_scale.sharding == target.loss_scale.sharding
    np.testing.assert_array_equal(got.state.trainable["w"], np.full((4, 3), 4.0, np.float32))
    np.testing.assert_array_equal(got.state.rng, [7, 9])
    # a field without a default cannot be made up: that checkpoint stays unreadable
    partial = {"step": np.asarray(5, np.int32), "trainable": {"w": np.zeros((4, 3), np.float32)}}
    store.save(5, partial, {})
    with pytest.raises(CheckpointError, match="unreadable"):
        store.restore(5, target)
    store.close()


def test_reading_the_meta_before_the_state_prints_no_orbax_warning(tmp_path, caplog):
    """Before restoring an engine state (a dataclass) the store reads what the checkpoint holds: the meta (which
    fallback tier wrote it) and the state's metadata. Orbax warns on the absl logger about each item such a read
    leaves; `aegis export` and resume printed two of those warnings, now dropped (and only those)."""
    import dataclasses
    import logging

    import jax

    @jax.tree_util.register_dataclass
    @dataclasses.dataclass
    class State:
        w: np.ndarray
        step: np.ndarray

    store = CheckpointStore(tmp_path / "checkpoints", interval=1, keep_last_n=2, async_save=False)
    store.maybe_save(1, State(**_tree(1)), {"lr": 0.5})
    store.close()
    store = CheckpointStore(tmp_path / "checkpoints", interval=1, keep_last_n=2)  # a later process: export, resume
    with caplog.at_level(logging.WARNING):
        got = store.restore(1, lambda meta: State(**_tree(0)) if meta["lr"] == 0.5 else None)
    np.testing.assert_array_equal(got.state.w, _tree(1)["w"])
    assert not [r for r in caplog.records if "could not be restored" in r.getMessage()]
    store.close()
