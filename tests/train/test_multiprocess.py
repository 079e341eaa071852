"""Multi-process runs on one host: the same ``{data: 2, fsdp: 2}`` LoRA run as 2 real ``aegis run`` processes x 2
forced host devices (gloo on 127.0.0.1, started by ``aegis launch``) and as 1 process x 4 devices: the same losses
step by step and the same exported PEFT adapter; only process 0 writes the run's files. Process 0 is the one
supervisor (a ``set_lr`` reaches both processes at the same step); ``kill -9`` of one process ends the other within
seconds with one line, and resuming both finishes with the uninterrupted run's adapter."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from safetensors.numpy import load_file

from tests.hf_folders import CHATML, make_model_folder, write_sharegpt

CONFIG = {
    "training": {"steps_per_window": 3, "total_steps": 12, "lr": 1.0e-2, "warmup_steps": 2, "min_lr_ratio": 0.1},
    "train_config": {"method": "lora", "micro_batch_size": 2, "seq_len": 64, "precision": "fp32",
                     "lora": {"rank": 4, "alpha": 8}},
    "parallel": {"data": 2, "fsdp": 2},
    "checkpoints": {"interval": 3},
}


def _env(devices: int) -> dict[str, str]:
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1")
    flags = [f for f in env.get("XLA_FLAGS", "").split() if "force_host_platform_device_count" not in f]
    env["XLA_FLAGS"] = " ".join([*flags, f"--xla_force_host_platform_device_count={devices}"])
    return env


def _aegis(*args: str) -> list[str]:
    return [sys.executable, "-c", "from aegis.cli.supervised import main; main()", "run", *args, "-q"]


def _launch(*args: str) -> list[str]:
    return [sys.executable, "-c", "from aegis.cli.supervised import main; main()", "launch", "--nproc", "2",
            "--cpu-devices", "2", "--", *args, "-q"]


def _losses(run: Path) -> list[float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in sorted(rows, key=lambda r: r["step"])]


def _events(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]


def _adapter(run: Path) -> dict[str, np.ndarray]:
    return load_file(run / "export" / "adapter_model.safetensors")


def _max_diff(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    assert a.keys() == b.keys() and a
    return max(float(np.max(np.abs(a[k] - b[k]))) for k in a)


def _wait(proc: subprocess.Popen, timeout: float) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The model, the config and an uninterrupted 2-process run ``two`` (started by ``aegis launch``)."""
    tmp = tmp_path_factory.mktemp("mp")
    folder = make_model_folder(tmp / "model", template=CHATML)
    data = write_sharegpt(tmp / "sharegpt.jsonl", n=32)
    config = tmp / "run.yaml"
    config.write_text(yaml.safe_dump({**CONFIG, "model": str(folder), "data": str(data)}))
    runs = tmp / "runs"
    two = subprocess.run(_launch("run", "--config", str(config), "--run-id", "two", "--runs-dir", str(runs)),
                         env=_env(2), capture_output=True, text=True, timeout=400)
    assert two.returncode == 0, two.stdout[-2000:] + two.stderr[-3000:]
    return {"config": config, "runs": runs}


@pytest.mark.slow
def test_two_processes_train_and_export_what_one_process_on_four_devices_does(setup: dict[str, Path]) -> None:
    config, runs = setup["config"], setup["runs"]
    one = subprocess.run(_aegis("--config", str(config), "--run-id", "one", "--runs-dir", str(runs)),
                         env=_env(4), capture_output=True, text=True, timeout=300)
    assert one.returncode == 0, one.stdout[-2000:] + one.stderr[-3000:]

    mesh = next(e for e in _events(runs / "two") if e["kind"] == "mesh")["data"]
    assert (mesh["data"], mesh["fsdp"], mesh["devices"], mesh["global_batch_size"]) == (2, 2, 4, 8)
    np.testing.assert_allclose(_losses(runs / "two"), _losses(runs / "one"), rtol=1e-5)
    assert len(_losses(runs / "two")) == CONFIG["training"]["total_steps"]
    assert _max_diff(_adapter(runs / "one"), _adapter(runs / "two")) <= 1e-5
    # process 0 wrote the run's files; process 1 its own bookkeeping inside; both their shards of the checkpoints
    assert {"one", "two"} <= {p.name for p in runs.iterdir()}
    assert not (runs / "two" / "processes" / "1" / "two" / "export").exists()
    steps = lambda run: sorted(p.name for p in (runs / run / "checkpoints").iterdir() if p.name.isdigit())  # noqa: E731
    assert steps("two") == steps("one") and "12" in steps("two")


@pytest.mark.slow
def test_kill_9_of_one_process_ends_the_other_with_one_line_and_resume_matches_the_uninterrupted_run(
    setup: dict[str, Path],
) -> None:
    config, runs = setup["config"], setup["runs"]
    run = runs / "three"
    launch = subprocess.Popen(_launch("run", "--config", str(config), "--run-id", "three", "--runs-dir", str(runs)),
                              env=_env(2), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 400
    heartbeat = run / "processes" / "1.json"
    while not (run / "checkpoints" / "3").is_dir():  # a complete checkpoint to resume from, mid-run
        assert launch.poll() is None and time.monotonic() < deadline, _wait(launch, 5)
        time.sleep(0.02)
    os.kill(json.loads(heartbeat.read_text())["pid"], signal.SIGKILL)
    killed = time.monotonic()
    out, err = _wait(launch, 120)
    assert time.monotonic() - killed < 60
    assert launch.returncode != 0, out[-2000:] + err[-3000:]
    reasons = [line for line in err.splitlines() if line.startswith("error: ")]
    assert any("process 1 of 2" in r and "died" in r and "stops too" in r for r in reasons), err[-3000:]
    assert reasons[-1].startswith("error: process 1 of 2 failed: killed by SIGKILL"), err[-3000:]
    assert "Traceback" not in err
    assert max(_steps_logged(run)) < CONFIG["training"]["total_steps"]  # it was stopped mid-run

    again = subprocess.run(_launch("resume", "--run-id", "three", "--runs-dir", str(runs)),
                           env=_env(2), capture_output=True, text=True, timeout=400)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-3000:]
    assert _max_diff(_adapter(run), _adapter(runs / "two")) <= 1e-5
    np.testing.assert_allclose(_losses(run), _losses(runs / "two"), rtol=1e-5)


def _steps_logged(run: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] or [0]


@pytest.mark.slow
def test_set_lr_sent_during_a_two_process_run_is_applied_by_both_at_the_same_step(setup: dict[str, Path]) -> None:
    from aegis.supervise.runner import Supervisor

    config, runs = setup["config"], setup["runs"]
    run = runs / "lr"
    launch = subprocess.Popen(_launch("run", "--config", str(config), "--run-id", "lr", "--runs-dir", str(runs)),
                              env=_env(2), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 400
    while not (run / "events.jsonl").is_file() or not any(e["kind"] == "mesh" for e in _events(run)):
        assert launch.poll() is None and time.monotonic() < deadline, _wait(launch, 5)
        time.sleep(0.02)
    receipt = Supervisor(runs).command("lr", "set_lr 2e-3")  # what `aegis command lr "set_lr 2e-3"` does
    assert receipt.queued and receipt.live
    out, err = _wait(launch, 400)
    assert launch.returncode == 0, out[-2000:] + err[-3000:]

    applied = {}
    for who, folder in (("process 0", run), ("process 1", run / "processes" / "1" / "lr")):
        hits = [e for e in _events(folder) if e["kind"] == "command_applied" and e["data"]["command"] == "set_lr 0.002"]
        assert len(hits) == 1, who
        applied[who] = hits[0]["step"]
        rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
        assert {r["peak_lr"] for r in rows if r["step"] > applied[who]} == {2e-3}, who
        assert {r["peak_lr"] for r in rows if r["step"] <= applied[who]} == {CONFIG["training"]["lr"]}, who
    assert applied["process 0"] == applied["process 1"] < CONFIG["training"]["total_steps"]


def test_multi_process_flags_are_all_or_none_and_checked_in_one_line() -> None:
    from typer.testing import CliRunner

    from aegis.errors import InvalidConfigError
    from aegis.cli.supervised import app
    from aegis.train.distributed import check_flags

    assert check_flags(None, None, None) is False
    assert check_flags("127.0.0.1:7654", 2, 1) is True
    for bad, match in [(("127.0.0.1:7654", 2, None), "needs all of"), (("localhost", 2, 0), "is not HOST:PORT"),
                       (("127.0.0.1:7654", 2, 2), "must be in 0..1")]:
        with pytest.raises(InvalidConfigError, match=match):
            check_flags(*bad)
    res = CliRunner().invoke(app, ["run", "--demo", "--coordinator", "127.0.0.1:1", "--num-processes", "2"])
    assert res.exit_code == 2 and "needs all of --coordinator" in res.output and "Traceback" not in res.output
