"""`kill -9` mid-window, then resume: nothing lost beyond the last checkpoint; blacklist, LR and
events survive; `aegis status` says the dead run is not running and how to continue it; metrics.jsonl
holds each step once (the run is a real subprocess killed with SIGKILL)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml
from typer.testing import CliRunner

from aegis.supervise import Supervisor
from aegis.cli.supervised import app
from aegis.supervise.demo import DEMO_TOXIC_IDS, demo_config
from aegis.supervise.events import read_jsonl


def _max_step(path) -> int:
    return max((r["step"] for r in read_jsonl(path)), default=0)


@pytest.mark.slow
def test_kill_9_mid_window_then_resume(tmp_path):
    cfg = demo_config().model_dump(mode="json", by_alias=True)
    cfg.update(run_id="killed", faults={}, curriculum={"eval_interval": 100000})
    cfg["training"]["total_steps"] = 100
    cfg["checkpoints"]["interval"] = 10
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(cfg))
    runs = tmp_path / "runs"
    run_dir = runs / "killed"
    proc = subprocess.Popen(
        [sys.executable, "-m", "aegis.cli.supervised", "run", "--config", str(tmp_path / "run.yaml"), "--quiet"],
        env={**os.environ, "AEGIS_RUNS_DIR": str(runs)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 240
    while _max_step(run_dir / "metrics.jsonl") < 85:  # window 75 -> 100, checkpoints every 10 steps
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        assert time.monotonic() < deadline, "the run did not reach step 85"
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    killed_at = _max_step(run_dir / "metrics.jsonl")
    committed = sorted(int(p.name) for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit())
    events_before = (run_dir / "events.jsonl").read_bytes()
    sup = Supervisor(runs)
    state = sup.state("killed")
    assert state.status == "running" and set(state.blacklist) == set(DEMO_TOXIC_IDS)
    assert killed_at < 100 and committed
    assert killed_at > committed[-1]  # the dead process logged steps past its last checkpoint
    shown = CliRunner().invoke(app, ["status", "--run-id", "killed", "--runs-dir", str(runs)], env={"COLUMNS": "200"})
    assert shown.exit_code == 0 and "crashed" in shown.output and f"process {proc.pid}" in shown.output
    assert "aegis resume --run-id killed" in shown.output and "(live" not in shown.output

    out = sup.resume("killed")
    assert out.status == "completed" and out.step == 100
    assert set(out.blacklist) == set(DEMO_TOXIC_IDS) and out.lr == pytest.approx(state.lr)
    assert (run_dir / "events.jsonl").read_bytes().startswith(events_before.rstrip(b"\n").rsplit(b"\n", 1)[0])
    events = sup.events("killed")
    restored = [e for e in events if e.kind == "restored"]
    newest = committed[-1]
    if newest > state.step:  # the kill came after a mid-window checkpoint: resume from it, not the window start
        assert restored and restored[-1].step == newest and restored[-1].data["from_step"] == state.step
    # every step's final record exists once per step, and the resumed steps never include the toxic row
    records = read_jsonl(run_dir / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, 101))  # once each: the dead process's future is gone
    steps = {r["step"]: r for r in records}
    assert all(not set(r["sample_ids"]) & set(DEMO_TOXIC_IDS) for s, r in steps.items() if s > newest)
    assert json.loads((run_dir / "blacklist.json").read_text())["blacklist"] == list(DEMO_TOXIC_IDS)
    shown = CliRunner().invoke(app, ["status", "--run-id", "killed", "--runs-dir", str(runs)], env={"COLUMNS": "200"})
    assert "completed" in shown.output and "crashed" not in shown.output
    assert "(last 60 of 100 steps, 41–100)" in shown.output
