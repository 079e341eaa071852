"""report_to backends: steps and values written by MetricsReporter read back through each backend's
own reader (TensorBoard's EventAccumulator, MlflowClient, W&B's offline transaction log); name
validation; a failing backend is disabled with one warning and never raises into training."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from aegis.errors import InvalidConfigError
from aegis.supervise import reporting
from aegis.supervise.reporting import REPORTERS, MetricsReporter, open_reporter

STEPS = {
    10: {"train/loss": 2.3, "train/grad_norm": 0.9, "train/lr": 1e-4, "train/tokens_per_s": 1234.0},
    20: {"train/loss": 1.7, "train/grad_norm": 1.25, "train/lr": 9e-5, "train/tokens_per_s": 1301.5},
    30: {"train/loss": float("nan"), "train/grad_norm": 3.5e4, "train/lr": 8e-5, "train/tokens_per_s": 1299.0},
}
TAGS = sorted(STEPS[10])


def _write_steps(reporter: MetricsReporter) -> None:
    for step, metrics in STEPS.items():
        reporter.log(step, metrics)
    reporter.close()
    reporter.close()  # a second close is a no-op


def _expected(tag: str, cast=float) -> list[tuple[int, float]]:
    return [(step, cast(metrics[tag])) for step, metrics in STEPS.items()]


def _assert_series(got: list[tuple[int, float]], expected: list[tuple[int, float]]) -> None:
    """Exact steps and values; NaN matches NaN."""
    assert [s for s, _ in got] == [s for s, _ in expected]
    np.testing.assert_array_equal([v for _, v in got], [v for _, v in expected])


# -- names ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("report_to", [None, "none", "NONE", [], (), ["none"], ""])
def test_none_reports_nowhere(report_to, tmp_path: Path) -> None:
    assert open_reporter(report_to, tmp_path, run_id="r") is None
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("bad", ["tensorbord", ["tensorboard", "comet"], "wandb,nope"])
def test_unknown_name_lists_valid_ones(bad, tmp_path: Path) -> None:
    with pytest.raises(InvalidConfigError) as info:
        open_reporter(bad, tmp_path, run_id="r")
    message = str(info.value)
    assert "\n" not in message
    assert all(name in message for name in (*REPORTERS, "all", "none"))
    assert isinstance(info.value, ValueError)


def test_typo_gets_a_suggestion(tmp_path: Path) -> None:
    with pytest.raises(InvalidConfigError, match="did you mean 'tensorboard'"):
        open_reporter("tensorbord", tmp_path, run_id="r")


def test_none_cannot_be_combined(tmp_path: Path) -> None:
    with pytest.raises(InvalidConfigError, match="'none' cannot be combined"):
        open_reporter(["none", "wandb"], tmp_path, run_id="r")


@pytest.mark.parametrize("name", REPORTERS)
def test_missing_backend_says_what_to_install(name, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, name, None)  # find_spec -> None: as if not installed
    with pytest.raises(InvalidConfigError, match=f"pip install {name}$") as info:
        open_reporter([name], tmp_path, run_id="r")
    assert "\n" not in str(info.value)
    with pytest.raises(InvalidConfigError):
        MetricsReporter([name], tmp_path, run_id="r")


def test_all_with_nothing_installed_is_none(tmp_path: Path, monkeypatch) -> None:
    for name in REPORTERS:
        monkeypatch.setitem(sys.modules, name, None)
    assert open_reporter("all", tmp_path, run_id="r") is None


def test_all_picks_installed_backends(tmp_path: Path, monkeypatch) -> None:
    pytest.importorskip("tensorboard")
    monkeypatch.setitem(sys.modules, "wandb", None)
    monkeypatch.setitem(sys.modules, "mlflow", None)
    reporter = open_reporter("all", tmp_path, run_id="r")
    assert reporter is not None and reporter.backends == ("tensorboard",)
    reporter.close()


def test_import_is_light() -> None:
    code = (
        "import sys, aegis.supervise.reporting; "
        "print([m for m in ('tensorboard', 'wandb', 'mlflow', 'torch', 'tensorflow', 'jax') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# -- failures never reach training ---------------------------------------------------------------


class _Flaky(reporting._Backend):
    name = "tensorboard"
    module = "json"  # always importable
    package = "json"
    logged: list[int] = []
    closed = 0

    def __init__(self, log_dir, *, run_id, config) -> None:
        pass

    def log(self, step, metrics) -> None:
        if step >= 20:
            raise OSError("disk full")
        _Flaky.logged.append(step)

    def close(self) -> None:
        _Flaky.closed += 1


class _Broken(_Flaky):
    name = "wandb"

    def __init__(self, log_dir, *, run_id, config) -> None:
        raise RuntimeError("no API key")


def test_failing_backend_warns_once_and_is_disabled(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setitem(reporting._BACKENDS, "tensorboard", _Flaky)
    monkeypatch.setattr(_Flaky, "logged", [])
    monkeypatch.setattr(_Flaky, "closed", 0)
    reporter = open_reporter("tensorboard", tmp_path, run_id="r")
    assert reporter is not None
    with pytest.warns(RuntimeWarning, match="'tensorboard' failed to log step 20.*disk full") as record:
        for step in (10, 20, 30, 40):
            reporter.log(step, {"train/loss": 1.0})
    assert len(record) == 1
    assert _Flaky.logged == [10]
    assert reporter.backends == ()
    assert _Flaky.closed == 1  # closed when disabled
    reporter.close()
    assert _Flaky.closed == 1


def test_backend_that_cannot_start_is_skipped(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setitem(reporting._BACKENDS, "tensorboard", _Flaky)
    monkeypatch.setitem(reporting._BACKENDS, "wandb", _Broken)
    monkeypatch.setattr(_Flaky, "logged", [])
    with pytest.warns(RuntimeWarning, match="'wandb' failed to start.*no API key"):
        reporter = MetricsReporter(["wandb", "tensorboard"], tmp_path, run_id="r")
    assert reporter.backends == ("tensorboard",)
    reporter.log(10, {"train/loss": 1.0})
    assert _Flaky.logged == [10]
    reporter.close()


def test_non_numeric_metric_is_dropped_with_one_warning(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setitem(reporting._BACKENDS, "tensorboard", _Flaky)
    monkeypatch.setattr(_Flaky, "logged", [])
    reporter = open_reporter("tensorboard", tmp_path, run_id="r")
    assert reporter is not None
    with pytest.warns(RuntimeWarning, match="'note' is not a number") as record:
        reporter.log(1, {"train/loss": np.float32(1.5), "note": "hello"})
        reporter.log(2, {"train/loss": 1.0, "note": "again"})
    assert len(record) == 1
    assert _Flaky.logged == [1, 2] and reporter.backends == ("tensorboard",)
    reporter.close()
    reporter.log(3, {"train/loss": 1.0})  # after close: ignored
    assert _Flaky.logged == [1, 2]


# -- tensorboard ---------------------------------------------------------------------------------


def test_tensorboard_round_trip(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        reporter = open_reporter(["tensorboard"], tmp_path, run_id="r", config={"lr": 1e-4})
        assert reporter is not None and reporter.backends == ("tensorboard",)
        _write_steps(reporter)

    files = list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert len(files) == 1
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert sorted(acc.Tags()["scalars"]) == TAGS
    for tag in TAGS:  # TensorBoard stores scalars as float32
        got = [(e.step, e.value) for e in acc.Scalars(tag)]
        _assert_series(got, _expected(tag, lambda v: float(np.float32(v))))


def test_tensorboard_resume_appends_a_second_file(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    for steps in ((1, 2), (3, 4)):  # a run killed and resumed opens a new writer in the same folder
        reporter = open_reporter("tensorboard", tmp_path, run_id="r")
        assert reporter is not None
        for step in steps:
            reporter.log(step, {"train/loss": float(step)})
        reporter.close()
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("train/loss")] == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0)]


# -- mlflow --------------------------------------------------------------------------------------


@pytest.mark.slow  # MLflow creates its SQLite schema (migrations): ~10 s on 2 cores
def test_mlflow_round_trip(tmp_path: Path, monkeypatch) -> None:
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    monkeypatch.chdir(tmp_path)  # nothing may land in the working directory but the run folder
    log_dir = tmp_path / "run"
    config = {"lr": 1e-4, "optimizer": {"name": "adamw", "b1": 0.9}}
    reporter = open_reporter("mlflow", log_dir, run_id="run-42", config=config)
    assert reporter is not None and reporter.backends == ("mlflow",)
    _write_steps(reporter)

    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
    client = MlflowClient(tracking_uri=f"sqlite:///{log_dir / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("aegis")
    assert experiment is not None
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == "run-42"
    assert run.info.status == "FINISHED"
    assert run.data.params == {"lr": "0.0001", "optimizer.name": "adamw", "optimizer.b1": "0.9"}
    for tag in TAGS:
        history = sorted(client.get_metric_history(run.info.run_id, tag), key=lambda m: m.step)
        _assert_series([(m.step, m.value) for m in history], _expected(tag))


# -- wandb ---------------------------------------------------------------------------------------


def _wandb_records(path: Path) -> list[bytes]:
    """Records of a W&B transaction log (``run-*.wandb``): a 7-byte header (":W&B", magic, version)
    then LevelDB-log chunks — crc32c, little-endian length, type (1 full, 2 first, 3 middle, 4 last)
    — in 32 KiB blocks."""
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    block, pos, records, pending = 32768, 7, [], b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # block trailer padding
            pos += left
            continue
        length, kind = struct.unpack_from("<HB", data, pos + 4)
        if pos + 7 + length > len(data):  # a chunk still being written
            break
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == 0 and length == 0:
            continue
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            records.append(pending)
    return records


def _finished_wandb_log(path: Path, record_type, timeout_s: float = 30.0) -> list:
    """Parsed records once the log holds its exit record: W&B's service process writes the log
    asynchronously, and ``run.finish()`` can return before the last records reach the file."""
    deadline = time.monotonic() + timeout_s
    while True:
        records = []
        for raw in _wandb_records(path):
            record = record_type()
            record.ParseFromString(raw)
            records.append(record)
        if any(r.HasField("exit") for r in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.1)


def test_wandb_offline_round_trip(tmp_path: Path, monkeypatch) -> None:
    pytest.importorskip("wandb")
    from wandb.proto import wandb_internal_pb2

    for var, value in {
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "WANDB_CONFIG_DIR": str(tmp_path / "wandb-config"),
        "WANDB_CACHE_DIR": str(tmp_path / "wandb-cache"),
        "WANDB_DATA_DIR": str(tmp_path / "wandb-data"),
    }.items():
        monkeypatch.setenv(var, value)
    log_dir = tmp_path / "run"
    reporter = open_reporter("wandb", log_dir, run_id="run-7", config={"lr": 1e-4})
    assert reporter is not None and reporter.backends == ("wandb",)
    _write_steps(reporter)

    (log,) = (log_dir / "wandb").glob("offline-run-*/run-*.wandb")
    records = _finished_wandb_log(log, wandb_internal_pb2.Record)
    history: dict[str, list[tuple[int, float]]] = {}
    names = []
    for record in records:
        if record.HasField("run"):
            names.append((record.run.project, record.run.display_name))
        if record.HasField("history"):
            items = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            for tag in TAGS:
                if tag in items:
                    history.setdefault(tag, []).append((items["_step"], float(items[tag])))
    assert ("aegis", "run-7") in names
    assert sorted(history) == TAGS
    for tag in TAGS:
        _assert_series(history[tag], _expected(tag))
