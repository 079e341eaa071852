"""tools/bench/bench_mfu: the GPU MFU sweep, run here on the tiny llama on CPU."""

from __future__ import annotations

import pytest

from aegis.data import tiny_llama_config
from tools.bench import bench_mfu


def test_sweep_measures_real_steps_and_sets_the_planner_beside_them(tmp_path, capsys):
    config = tmp_path / "config.json"
    import json

    config.write_text(json.dumps(tiny_llama_config()))
    rows = bench_mfu.sweep(str(config), "full", seq=64, batches=[4], remat="off", steps=2)
    (row,) = rows
    assert row["batch"] == 4 and row["remat"] is False
    assert row["step_ms"] > 0 and row["tokens_per_s"] == pytest.approx(4 * 64 / (row["step_ms"] / 1e3))
    assert row["mfu"] is None and row["source"] == "compiled"  # CPU: no catalog peak, XLA's memory analysis
    assert 0.8 < row["planned"] / row["peak"] < 1.2
    table = bench_mfu._table(rows)
    assert "planned/peak" in table and table.splitlines()[1].split()[:2] == ["4", "off"]


def test_an_out_of_memory_configuration_is_a_row_and_other_errors_propagate(monkeypatch, tmp_path):
    import aegis.train.benchmark as tb

    def oom(config, method, batch, *args, **kwargs):
        if batch > 1:
            raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 81.00GiB")
        raise ValueError("a real bug")

    monkeypatch.setattr(tb, "run_benchmark", oom)
    row = bench_mfu.measure("llama-3.2-1b", "full", seq=2048, batch=8, ckpt=True, steps=1)
    assert row == {"batch": 8, "remat": True, "error": "OOM"}
    assert "OOM" in bench_mfu._table([row])
    with pytest.raises(ValueError, match="a real bug"):
        bench_mfu.measure("llama-3.2-1b", "full", seq=2048, batch=1, ckpt=False, steps=1)


def test_a_failing_worker_stops_the_sweep():
    """Each row runs in its own process (the device's peak counter never goes down); a worker that fails for any
    reason but memory is an error, not a row."""
    with pytest.raises(RuntimeError, match="batch 2, remat off"):
        bench_mfu.sweep("no-such-model-9b", "full", seq=64, batches=[2], remat="off", steps=1)
