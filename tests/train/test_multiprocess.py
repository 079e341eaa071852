"""Multi-process runs on one host: the same ``{data: 2, fsdp: 2}`` LoRA run as 2 real ``aegis run`` processes x 2
forced host devices (gloo on 127.0.0.1) and as 1 process x 4 devices: the same losses step by step and the same
exported PEFT adapter; only process 0 writes the run folder."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from safetensors.numpy import load_file

from tests.hf_folders import CHATML, make_model_folder, write_sharegpt

CONFIG = {
    "training": {"steps_per_window": 3, "total_steps": 6, "lr": 1.0e-2, "warmup_steps": 2, "min_lr_ratio": 0.1},
    "train_config": {"method": "lora", "micro_batch_size": 2, "seq_len": 64, "precision": "fp32",
                     "lora": {"rank": 4, "alpha": 8}},
    "parallel": {"data": 2, "fsdp": 2},
    "checkpoints": {"interval": 3},
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(devices: int) -> dict[str, str]:
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1")
    flags = [f for f in env.get("XLA_FLAGS", "").split() if "force_host_platform_device_count" not in f]
    env["XLA_FLAGS"] = " ".join([*flags, f"--xla_force_host_platform_device_count={devices}"])
    return env


def _aegis(*args: str) -> list[str]:
    return [sys.executable, "-c", "from aegis.supervise.cli import main; main()", "run", *args, "-q"]


def _losses(run: Path) -> list[float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in sorted(rows, key=lambda r: r["step"])]


@pytest.mark.slow
def test_two_processes_train_and_export_what_one_process_on_four_devices_does(tmp_path: Path) -> None:
    folder = make_model_folder(tmp_path / "model", template=CHATML)
    data = write_sharegpt(tmp_path / "sharegpt.jsonl", n=32)
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({**CONFIG, "model": str(folder), "data": str(data)}))
    runs = tmp_path / "runs"

    one = subprocess.run(_aegis("--config", str(config), "--run-id", "one", "--runs-dir", str(runs)),
                         env=_env(4), capture_output=True, text=True, timeout=300)
    assert one.returncode == 0, one.stdout[-2000:] + one.stderr[-3000:]

    port = _free_port()
    procs = [
        subprocess.Popen(
            _aegis("--config", str(config), "--run-id", "two", "--runs-dir", str(runs),
                   "--coordinator", f"127.0.0.1:{port}", "--num-processes", "2", "--process-id", str(i)),
            env=_env(2), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for i in range(2)
    ]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=300))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, out[-2000:] + err[-3000:]

    mesh = [json.loads(line) for line in (runs / "two" / "events.jsonl").read_text().splitlines()]
    mesh = next(e for e in mesh if e["kind"] == "mesh")["data"]
    assert (mesh["data"], mesh["fsdp"], mesh["devices"], mesh["global_batch_size"]) == (2, 2, 4, 8)
    np.testing.assert_allclose(_losses(runs / "two"), _losses(runs / "one"), rtol=1e-5)
    assert len(_losses(runs / "two")) == CONFIG["training"]["total_steps"]
    a = load_file(runs / "one" / "export" / "adapter_model.safetensors")
    b = load_file(runs / "two" / "export" / "adapter_model.safetensors")
    assert a.keys() == b.keys() and a
    assert max(float(np.max(np.abs(a[k] - b[k]))) for k in a) <= 1e-5
    # only process 0 wrote a run folder; both wrote their shards of the shared checkpoints
    assert sorted(p.name for p in runs.iterdir()) == ["one", "two"]
    steps = lambda run: sorted(p.name for p in (runs / run / "checkpoints").iterdir() if p.name.isdigit())  # noqa: E731
    assert steps("two") == steps("one") and "6" in steps("two")


def test_multi_process_flags_are_all_or_none_and_checked_in_one_line() -> None:
    from typer.testing import CliRunner

    from aegis.errors import InvalidConfigError
    from aegis.supervise.cli import app
    from aegis.train.distributed import check_flags

    assert check_flags(None, None, None) is False
    assert check_flags("127.0.0.1:7654", 2, 1) is True
    for bad, match in [(("127.0.0.1:7654", 2, None), "needs all of"), (("localhost", 2, 0), "is not HOST:PORT"),
                       (("127.0.0.1:7654", 2, 2), "must be in 0..1")]:
        with pytest.raises(InvalidConfigError, match=match):
            check_flags(*bad)
    res = CliRunner().invoke(app, ["run", "--demo", "--coordinator", "127.0.0.1:1", "--num-processes", "2"])
    assert res.exit_code == 2 and "needs all of --coordinator" in res.output and "Traceback" not in res.output
