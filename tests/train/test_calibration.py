"""Calibration store: round trip, keying, atomic writes, no JAX import; benchmark stores a real measurement."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from aegis.planning.calibration import CalibrationRecord, CalibrationStore, default_store_path
from aegis.errors import InvalidConfigError


def _rec(**kw) -> CalibrationRecord:
    base = dict(
        gpu_id="rtx-3090",
        model_id="meta-llama/Llama-3.2-1B",
        method="lora",
        tokens_per_s=1234.5,
        peak_memory_bytes=9_000_000_000,
        device="NVIDIA GeForce RTX 3090",
        micro_batch_size=4,
        seq_len=1024,
    )
    return CalibrationRecord(**(base | kw))


def test_record_and_lookup_round_trip(tmp_path):
    store = CalibrationStore(tmp_path / "cal.json")
    assert store.lookup("rtx-3090", "meta-llama/Llama-3.2-1B", "lora") is None
    rec = _rec()
    store.record(rec)
    assert store.lookup("rtx-3090", "meta-llama/Llama-3.2-1B", "lora") == rec
    assert store.lookup("rtx-3090", "meta-llama/Llama-3.2-1B", "qlora") is None
    assert store.lookup("rtx-4090", "meta-llama/Llama-3.2-1B", "lora") is None


def test_latest_record_per_key_wins_and_others_are_kept(tmp_path):
    store = CalibrationStore(tmp_path / "cal.json")
    store.record(_rec(tokens_per_s=100.0))
    store.record(_rec(method="full", tokens_per_s=50.0))
    store.record(_rec(tokens_per_s=200.0))
    assert store.lookup("rtx-3090", "meta-llama/Llama-3.2-1B", "lora").tokens_per_s == 200.0
    assert store.lookup("rtx-3090", "meta-llama/Llama-3.2-1B", "full").tokens_per_s == 50.0
    assert len(store.records()) == 2
    # a valid JSON file with no temp files left behind
    assert json.loads((tmp_path / "cal.json").read_text())["version"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["cal.json"]


def test_default_path_follows_aegis_home(tmp_path, monkeypatch):
    monkeypatch.setenv("AEGIS_HOME", str(tmp_path / "home"))
    assert default_store_path() == tmp_path / "home" / "calibration.json"
    CalibrationStore().record(_rec())
    assert (tmp_path / "home" / "calibration.json").exists()


def test_a_failed_write_leaves_the_old_file_intact(tmp_path, monkeypatch):
    store = CalibrationStore(tmp_path / "cal.json")
    store.record(_rec(tokens_per_s=1.0))
    before = (tmp_path / "cal.json").read_text()

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        store.record(_rec(tokens_per_s=2.0))
    assert (tmp_path / "cal.json").read_text() == before
    assert [p.name for p in tmp_path.iterdir()] == ["cal.json"]


def test_corrupt_store_gives_an_error_naming_the_fix(tmp_path):
    (tmp_path / "cal.json").write_text("{not json")
    with pytest.raises(InvalidConfigError, match="delete it"):
        CalibrationStore(tmp_path / "cal.json").lookup("a", "b", "lora")


def test_records_reject_bad_values():
    with pytest.raises(ValueError):
        _rec(tokens_per_s=0.0)
    with pytest.raises(ValueError):
        _rec(method="dpo")


def test_importing_the_store_does_not_import_jax():
    code = "import sys, aegis.planning.calibration; print('jax' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.slow
def test_run_benchmark_measures_real_steps_and_stores_them(tmp_path):
    from aegis.data import tiny_llama_config
    from aegis.train.benchmark import run_benchmark

    store = CalibrationStore(tmp_path / "cal.json")
    config = tiny_llama_config()
    res = run_benchmark(
        config, "lora", micro_batch_size=2, seq_len=32, steps=3, model_id="tiny-llama", precision="fp32", store=store
    )
    assert res.record.tokens_per_s > 0 and res.record.peak_memory_bytes > 0
    assert res.record.gpu_id == "cpu" and res.record.memory_source == "compiled"
    assert res.record.tokens_per_s == pytest.approx(2 * 32 / res.record.step_time_s)
    assert store.lookup("cpu", "tiny-llama", "lora") == res.record
    assert len(res.losses) == 3 and all(l > 0 for l in res.losses)


@pytest.mark.slow
def test_jax_step_memory_accounts_for_state_and_shrinks_with_chunked_cross_entropy():
    from aegis.data import tiny_llama_config
    from aegis.schema import TrainConfig
    from aegis.train.benchmark import jax_step_memory
    from aegis.train.modeling import build_model
    from aegis.train.step import OptimizerSettings

    config = tiny_llama_config() | {"vocab_size": 16384}
    b, s = 4, 128
    full = jax_step_memory(config, TrainConfig(method="full", micro_batch_size=b, seq_len=s, precision="fp32"))
    chunked = jax_step_memory(
        config,
        TrainConfig(method="full", micro_batch_size=b, seq_len=s, precision="fp32", chunked_cross_entropy=True),
        optimizer=OptimizerSettings(ce_chunk_tokens=64),  # 8 chunks of the 512 tokens
    )
    shapes = jax.tree.leaves(build_model(config).param_shapes(), is_leaf=lambda x: isinstance(x, tuple))
    n_params = sum(int(np.prod(sh)) for sh in shapes)
    for m in (full, chunked):
        assert m["peak_bytes"] == m["argument_bytes"] + m["output_bytes"] - m["alias_bytes"] + m["temp_bytes"]
        assert m["trainable_bytes"] == 4 * n_params and m["frozen_bytes"] == 0
        assert m["opt_state_bytes"] >= 2 * 4 * n_params  # Adam's two moments
        assert m["alias_bytes"] >= m["trainable_bytes"] + 2 * 4 * n_params  # donated state is reused
    logits_bytes = b * s * config["vocab_size"] * 4
    assert full["temp_bytes"] > logits_bytes  # full fp32 logits (and their gradient) exist
    assert chunked["temp_bytes"] < full["temp_bytes"] - logits_bytes


def test_benchmark_line_reports_mfu_where_the_peak_is_known():
    from aegis.cli import _benchmark_text

    assert "MFU 41% of the catalog bf16 peak" in _benchmark_text(_rec(mfu=0.41))
    assert "MFU" not in _benchmark_text(_rec(mfu=None))
