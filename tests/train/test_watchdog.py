"""The pieces of a multi-process run that need no second JAX process: the watchdog's verdict on a peer's heartbeat
(a killed process, a clean end, a failure, a silent host, an earlier launch), ``aegis launch``'s argument checks and
its one-line report of a failing process, and the mesh/process lines of ``aegis status``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from aegis.cli.supervised import app
from aegis.supervise.launch import launch, mesh_lines
from aegis.train.watchdog import STALE_S, Watchdog


def _peer(folder: Path, **rec: object) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    base = {"pid": os.getpid(), "host": "here", "session": "s1", "time": time.time(), "step": 7, "exit": None,
            "reason": None}
    (folder / "1.json").write_text(json.dumps({**base, **rec}))


def _dog(folder: Path) -> Watchdog:
    dog = Watchdog(folder, process_id=0, num_processes=2, session="s1")
    dog.host = "here"
    return dog


def test_watchdog_names_a_killed_peer_and_ignores_a_clean_end_or_an_earlier_launch(tmp_path: Path) -> None:
    folder = tmp_path / "processes"
    dog = _dog(folder)
    _peer(folder)  # alive: this test's own pid
    assert dog.lost() is None

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    child.kill()
    child.wait()
    _peer(folder, pid=child.pid)
    assert dog.lost() == f"process 1 of 2 (pid {child.pid}) died after step 7 without a word (killed, or crashed)"

    _peer(folder, pid=child.pid, exit=0)  # finished a moment before this one: not a loss
    assert dog.lost() is None
    _peer(folder, pid=child.pid, exit=3)  # paused for a human, as this one will
    assert dog.lost() is None
    _peer(folder, pid=child.pid, exit=2, reason="config.yaml not found")
    assert dog.lost() == "process 1 of 2 failed after step 7: config.yaml not found"

    _peer(folder, pid=child.pid, session="s0")  # a heartbeat of the launch before a resume
    assert dog.lost() is None
    dog.started -= 1000
    assert "never reported" in (dog.lost() or "")


def test_watchdog_takes_a_silent_peer_on_another_host_for_lost(tmp_path: Path) -> None:
    folder = tmp_path / "processes"
    dog = _dog(folder)
    _peer(folder, host="elsewhere", pid=1, time=time.time() - 5)
    assert dog.lost() is None  # another host: its pid says nothing here; a recent heartbeat is alive
    _peer(folder, host="elsewhere", pid=1, time=time.time() - STALE_S - 10)
    assert "(host elsewhere) stopped responding after step 7" in (dog.lost() or "")


def test_watchdog_writes_its_heartbeat_and_a_clean_exit(tmp_path: Path) -> None:
    folder = tmp_path / "processes"
    folder.mkdir()
    dog = Watchdog(folder, process_id=1, num_processes=2, session="s1")
    dog.note_step(4, lambda: [{"device": 2, "bytes_in_use": 2**20, "peak_bytes": None, "limit_bytes": None}])
    dog.exit(0)
    rec = json.loads((folder / "1.json").read_text())
    assert (rec["pid"], rec["session"], rec["step"], rec["exit"]) == (os.getpid(), "s1", 4, 0)
    assert rec["devices"][0]["bytes_in_use"] == 2**20


def test_launch_checks_its_arguments_in_one_line() -> None:
    runner = CliRunner()
    for args, match in [(["--nproc", "2", "--", "plan", "x"], "starts `run` or `resume`"),
                        (["--nproc", "2", "--", "run", "--config", "r.yaml"], "needs --run-id"),
                        (["--nproc", "2", "--", "run", "--run-id", "a", "--process-id", "1"], "leave out --process-id")]:
        res = runner.invoke(app, ["launch", *args])
        assert res.exit_code == 2 and match in res.output and "Traceback" not in res.output, res.output


def test_launch_reports_the_failing_process_in_one_line(tmp_path: Path) -> None:
    res = launch(["run", "--config", str(tmp_path / "missing.yaml"), "--run-id", "r", "--runs-dir",
                  str(tmp_path / "runs")], 2, echo=False)
    assert res.returncodes == [2, 2] and res.exit_code == 2
    assert res.failed == 0 and "missing.yaml" in (res.reason or ""), res.lines
    assert not any("Traceback" in line for lines in res.lines.values() for line in lines)


def test_status_lines_show_the_mesh_and_each_process(tmp_path: Path) -> None:
    run = tmp_path / "r"
    (run / "processes").mkdir(parents=True)
    events = [{"time": 0, "kind": "mesh", "step": 0, "data": {"data": 2, "fsdp": 2, "tensor": 1, "devices": 4,
                                                              "global_batch_size": 8}},
              {"time": 0, "kind": "memory_check", "step": 0, "data": {"compiled_peak_bytes": 3 * 2**20}}]
    (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    now = time.time()
    dev = [{"device": 0, "bytes_in_use": 2**20, "peak_bytes": None, "limit_bytes": None}]
    (run / "processes" / "0.json").write_text(json.dumps(
        {"pid": os.getpid(), "host": os.uname().nodename, "session": "s", "time": now, "step": 5, "exit": None,
         "devices": dev}))
    (run / "processes" / "1.json").write_text(json.dumps(
        {"pid": 1, "host": "other", "session": "s", "time": now, "step": 5, "exit": 2, "reason": "boom"}))
    (run / "processes" / "2.json").write_text(json.dumps({"pid": 1, "host": "x", "session": "old", "time": 0}))
    lines = mesh_lines(run)
    assert lines[0] == "mesh: data 2 x fsdp 2 x tensor 1 = 4 devices over 2 process(es); global batch 8"
    assert lines[1] == "compiled step peak: 3.0 MiB per device"
    assert lines[2].startswith(f"process 0: pid {os.getpid()} on ") and "running, step 5; device 0 1.0 MiB" in lines[2]
    assert lines[3] == "process 1: pid 1 on other — failed: boom, step 5"
    assert len(lines) == 4
    assert mesh_lines(tmp_path / "missing") == []


@pytest.mark.parametrize("code", [0, 3])
def test_a_launch_of_clean_processes_exits_as_they_do(code: int) -> None:
    from aegis.supervise.launch import LaunchResult

    assert LaunchResult([code, code]).exit_code == code
    assert LaunchResult([0, -9], failed=1).exit_code == 1


def test_a_slurm_or_open_mpi_job_of_several_tasks_is_a_multi_process_run(monkeypatch: pytest.MonkeyPatch) -> None:
    from aegis.train.distributed import detect_cluster

    for key in [k for k in os.environ if k.startswith(("SLURM_", "OMPI_"))]:
        monkeypatch.delenv(key)
    assert detect_cluster() is None
    slurm = {"SLURM_JOB_ID": "4242", "SLURM_STEP_NODELIST": "node[007-008]", "SLURM_NTASKS": "2",
             "SLURM_PROCID": "1", "SLURM_LOCALID": "0"}
    for k, v in slurm.items():
        monkeypatch.setenv(k, v)
    # jax.distributed.initialize()'s own reading: the first node, a port from the job id
    assert detect_cluster() == (f"node007:{4242 % 2**12 + 65535 - 2**12 + 1}", 2, 1)
    monkeypatch.setenv("SLURM_NTASKS", "1")
    assert detect_cluster() is None  # one task: a one-process run
