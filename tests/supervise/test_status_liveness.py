"""Honest state: a run whose process died shows as crashed with the command that continues it, the loss
sparkline says which steps it covers, a resumed run's metrics hold each step once, and a config that cannot run
is refused before it starts (an out-of-memory pause suggests what frees memory, not `set_lr`).

The processes here are real (a child holding the run's lock, killed with SIGKILL); the state they ran is written
through the same graph checkpointer the supervisor uses. The end-to-end `kill -9` of a training run is in
test_kill_resume.py."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from aegis.errors import InvalidConfigError
from aegis.supervise import Supervisor, parse_run_config
from aegis.cli.supervised import app
from aegis.supervise.run_config import RunConfig
from aegis.supervise.events import append_jsonl, read_jsonl
from aegis.supervise.runs import RunPaths, _pid_alive, _proc_start, liveness, truncate_metrics
from aegis.supervise.state import Anomaly, RunState
from aegis.supervise.status import build_status, render_status, status_markdown

from tests.demo_model import TINY_LLAMA, TINY_RUN, TOY_DATA

from .conftest import run_config

runner = CliRunner()


def _run(tmp_path: Path, state: RunState | None, monkeypatch: pytest.MonkeyPatch) -> RunPaths:
    paths = RunPaths(tmp_path / "runs" / "r1")
    paths.root.mkdir(parents=True)
    paths.config.write_text(RunConfig(run_id="r1", **TINY_RUN, data=TOY_DATA, training={"total_steps": 150}).model_dump_json(by_alias=True))
    raw = state.model_dump(mode="json") if state is not None else None
    monkeypatch.setattr("aegis.supervise.status.read_state", lambda p: raw)
    monkeypatch.setattr("aegis.supervise.runner.read_state", lambda p: raw)
    return paths


_HOLD = """
import sys, time
from pathlib import Path
from aegis.supervise.runs import RunPaths, run_lock
with run_lock(RunPaths(Path(sys.argv[1]))):
    print("locked", flush=True)
    time.sleep(120)
"""


def _holder(paths: RunPaths) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", _HOLD, str(paths.root)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_a_killed_process_shows_as_crashed_with_the_resume_command(tmp_path, monkeypatch):
    paths = _run(tmp_path, RunState.new("r1", lr=1e-3, grad_clip=1.0, weights={}).update(step=40), monkeypatch)
    proc = _holder(paths)
    try:
        st = build_status(paths)
        assert st.live and st.status == "running" and st.process == f"process {proc.pid}"
        assert st.next_action is None and st.stale is None
        owner = json.loads(paths.lock.read_text())
        assert owner["pid"] == proc.pid and owner["host"] == socket.gethostname()
        assert owner["proc_start"] == _proc_start(proc.pid)
        with pytest.raises(Exception, match="being run by another process"):
            Supervisor(paths.root.parent).resume("r1")
        assert "not paused" in runner.invoke(app, ["command", "r1", "resume", "--runs-dir", str(paths.root.parent)]).output
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()

    st = build_status(paths)
    assert not st.live and st.status == "crashed"
    assert st.stale.startswith(f"process {proc.pid} that ran it is gone, last heartbeat")
    assert st.next_action == "aegis resume --run-id r1"
    res = runner.invoke(app, ["status", "--run-id", "r1", "--runs-dir", str(paths.root.parent)], env={"COLUMNS": "200"})
    assert res.exit_code == 0 and "crashed" in res.output and "aegis resume --run-id r1" in res.output
    assert "(live" not in res.output
    md = status_markdown(st)
    assert "crashed" in md.splitlines()[0] and "`aegis resume --run-id r1`" in md
    # `resume` from the chat or Slack is accepted for a dead run (it restarts the process), not queued in its inbox
    receipt = Supervisor(paths.root.parent).command("r1", "resume", source="chat")
    assert receipt.command == "resume" and not receipt.live and not receipt.queued
    assert not paths.inbox.exists()


def test_a_paused_run_without_a_process_is_not_crashed(tmp_path, monkeypatch):
    state = RunState.new("r1", lr=1e-3, grad_clip=1.0, weights={}).update(status="paused")
    paths = _run(tmp_path, state, monkeypatch)
    proc = _holder(paths)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    st = build_status(paths)
    assert st.status == "paused" and st.stale is None and st.next_action == "aegis resume --run-id r1"


def test_a_process_that_died_before_its_first_step_is_crashed_not_starting(tmp_path, monkeypatch):
    paths = _run(tmp_path, None, monkeypatch)
    assert build_status(paths).status == "starting"  # no lock yet: nothing has run
    proc = _holder(paths)
    assert build_status(paths).status == "starting"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    st = build_status(paths)
    assert st.status == "crashed" and st.next_action == "aegis resume --run-id r1"


def test_a_recycled_pid_and_another_hosts_heartbeat(tmp_path):
    me = os.getpid()
    assert _pid_alive(me, _proc_start(me)) and not _pid_alive(me, "1")  # same pid, another process's start time
    paths = RunPaths(tmp_path / "r1")
    paths.root.mkdir()
    paths.lock.write_text(json.dumps({"pid": 1, "host": "gpu-node-7", "proc_start": "5", "started_at": time.time()}))
    alive = liveness(paths)  # flock cannot see another host's lock: a fresh heartbeat means it runs
    assert alive.live and alive.owner.describe() == "process 1 on gpu-node-7"
    old = time.time() - 600
    os.utime(paths.lock, (old, old))
    alive = liveness(paths)
    assert not alive.live and alive.detail == "process 1 on gpu-node-7 that ran it is gone, last heartbeat 10 min ago"


def _metrics(paths: RunPaths, steps: range) -> None:
    for s in steps:
        append_jsonl(paths.metrics, {"step": s, "loss": 10.0 / s, "grad_norm": 1.0})


def test_the_sparkline_says_which_steps_it_draws(tmp_path, monkeypatch):
    paths = _run(tmp_path, RunState.new("r1", lr=1e-3, grad_clip=1.0, weights={}).update(step=150), monkeypatch)
    _metrics(paths, range(1, 151))
    st = build_status(paths)
    console = Console(record=True, width=250)
    console.print(render_status(st))
    text = console.export_text()
    assert "(last 60 of 150 steps, 91–150)" in text
    assert "(last 40 of 150 steps, 111–150)" in status_markdown(st)
    paths.metrics.unlink()
    _metrics(paths, range(1, 13))
    assert "(all 12 steps, 1–12)" in status_markdown(build_status(paths))


def test_truncate_metrics_drops_a_dead_process_future_once(tmp_path):
    paths = RunPaths(tmp_path)
    _metrics(paths, range(1, 55))
    with open(paths.metrics, "ab") as f:
        f.write(b'{"step": 55, "lo')  # kill -9 mid-write
    assert truncate_metrics(paths, 50) == 4
    assert [r["step"] for r in read_jsonl(paths.metrics)] == list(range(1, 51))
    assert paths.metrics.read_bytes().endswith(b"\n")
    before = paths.metrics.stat().st_ino
    assert truncate_metrics(paths, 50) == 0 and truncate_metrics(paths, 60) == 0
    assert paths.metrics.stat().st_ino == before  # nothing to drop: the file is not rewritten
    assert truncate_metrics(RunPaths(tmp_path / "none"), 3) == 0


def _gpt2(n_positions: int = 32) -> dict:
    return {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": 264, "n_positions": n_positions,
            "n_embd": 32, "n_layer": 2, "n_head": 4, "n_inner": None, "activation_function": "gelu_new",
            "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True}


def test_a_seq_len_past_learned_positions_or_any_memory_is_refused_before_the_run(tmp_path):
    from aegis.supervise.engine_handle import check_feasible, resolve_model_config

    gpt2 = parse_run_config(run_config(tmp_path, model=_gpt2(), train_config={"seq_len": 64}))
    with pytest.raises(InvalidConfigError, match=r"train_config.seq_len 64 is past .* 32 learned positions.*32 or less"):
        check_feasible(gpt2, _gpt2())
    check_feasible(parse_run_config(run_config(tmp_path, model=_gpt2(), train_config={"seq_len": 32})), _gpt2())
    huge = parse_run_config(run_config(tmp_path, run_id="huge", train_config={"seq_len": 100_000_000_000}))
    with pytest.raises(InvalidConfigError, match=r"train_config cannot run here: micro batch 8 x seq_len 100,000,000,000"):
        check_feasible(huge, resolve_model_config(TINY_LLAMA))

    runs = tmp_path / "runs"
    t0 = time.monotonic()
    with pytest.raises(InvalidConfigError, match="lower its seq_len or micro_batch_size"):
        Supervisor(runs).start(huge)
    assert time.monotonic() - t0 < 60 and not (runs / "huge").exists()  # nothing trained, no half folder
    (tmp_path / "huge.yaml").write_text(json.dumps({**run_config(tmp_path), "train_config": {"seq_len": 10**11}}))
    res = runner.invoke(app, ["run", "--config", str(tmp_path / "huge.yaml"), "--runs-dir", str(runs), "-q"])
    assert res.exit_code == 2 and res.output.startswith("error: train_config cannot run here")
    assert res.output.strip().count("\n") == 0 and "set_lr" not in res.output


def test_an_out_of_memory_pause_suggests_memory_fixes_not_the_lr(tmp_path):
    from aegis.supervise.repair import apply_repair, plan_repair

    cfg = parse_run_config(run_config(tmp_path, train_config={"micro_batch_size": 8, "seq_len": 64}))
    state = RunState.new("r1", lr=1e-3, grad_clip=1.0, weights={}).update(
        anomaly=Anomaly(type="oom", step=3, detail="RESOURCE_EXHAUSTED: out of memory"), last_checkpoint_step=0
    )
    decision = plan_repair(state, cfg, num_tiers=1)
    paused = apply_repair(state, decision)
    assert decision.strategy == "escalate" and paused.human.pending
    assert "micro batch 8, seq_len 64" in decision.reason and "smaller micro_batch_size or seq_len" in decision.reason
    assert paused.human.suggested_actions == ("resume", "stop")
    assert not any(a.startswith("set_lr") for a in paused.human.suggested_actions)


@pytest.mark.parametrize("same_process", [False, True])
def test_a_rewind_leaves_each_step_once_in_metrics_and_tensorboard(tmp_path, same_process):
    """After a kill (a new process) or a rollback (the same one) training goes on from the checkpoint at 50: the
    steps 51-54 logged before are dropped from metrics.jsonl and purged in TensorBoard (read with its own
    EventAccumulator), and the new 51-54 are the ones kept."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from aegis.supervise.context import RunContext
    from aegis.supervise.state import StepMetrics

    cfg = parse_run_config(run_config(tmp_path, report_to="tensorboard"))
    paths = RunPaths(tmp_path / "runs" / "r1")
    paths.root.mkdir(parents=True)
    ctx = RunContext(cfg, paths)
    for s in range(1, 55):
        ctx.record_step(StepMetrics(step=s, loss=float(s), grad_norm=1.0), 1e-3, 0)
    if not same_process:
        ctx.close()  # killed: the next process opens a new event file
        ctx = RunContext(cfg, paths)
    assert ctx.rewind_metrics(50) == 4 and ctx.rewind_metrics(50) == 0
    for s in range(51, 61):
        ctx.record_step(StepMetrics(step=s, loss=100.0 + s, grad_norm=1.0), 1e-3, 0)
    ctx.close()
    want = [(s, float(s)) for s in range(1, 51)] + [(s, 100.0 + s) for s in range(51, 61)]
    assert [(r["step"], r["loss"]) for r in read_jsonl(paths.metrics)] == want
    acc = EventAccumulator(str(paths.logs / "tensorboard"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("train/loss")] == want
