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
