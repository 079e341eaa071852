"""CLI: help per command, one-line errors, status rendering, the demo end to end."""

from __future__ import annotations

import json
import time

import pytest
from typer.testing import CliRunner

from aegis.cli.supervised import app

from tests.demo_model import TINY_LLAMA, TOY_DATA

runner = CliRunner()


@pytest.mark.parametrize("cmd", ["run", "resume", "status", "interrupt", "command"])
def test_help(cmd):
    result = runner.invoke(app, [cmd, "--help"])
    assert result.exit_code == 0 and "Usage" in result.output


def test_bad_input_gives_one_line_errors(tmp_path):
    runs = str(tmp_path / "runs")
    for args in (["status", "--run-id", "ghost"], ["command", "ghost", "stop"], ["interrupt", "--run-id", "ghost"],
                 ["resume", "--run-id", "ghost"]):
        result = runner.invoke(app, [*args, "--runs-dir", runs])
        assert result.exit_code == 2, result.output
        assert "unknown run id 'ghost'" in result.output and result.output.strip().count("\n") == 0
    (tmp_path / "bad.yaml").write_text("training: {stepz: 3}\n")
    result = runner.invoke(app, ["run", "--config", str(tmp_path / "bad.yaml"), "--runs-dir", runs])
    assert result.exit_code == 2 and "unknown key 'training.stepz'" in result.output
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_demo_detects_diagnoses_and_repairs_in_under_two_minutes(tmp_path):
    runs = str(tmp_path / "runs")
    t0 = time.monotonic()
    result = runner.invoke(app, ["run", "--demo", "--run-id", "demo", "--runs-dir", runs])
    elapsed = time.monotonic() - t0
    assert result.exit_code == 0, result.output
    out = result.output
    assert "anomaly" in out and "diagnosis" in out and "toxic-0001" in out
    assert "blacklist" in out and "stabilize" in out and "completed" in out
    assert elapsed < 120
    status = runner.invoke(app, ["status", "--run-id", "demo", "--runs-dir", runs])
    assert status.exit_code == 0 and "completed" in status.output and "toxic-0001" in status.output
    cmd = runner.invoke(app, ["command", "demo", "set_lr 1e-5", "--runs-dir", runs])
    assert cmd.exit_code == 2 and "completed" in cmd.output
    exported = json.loads((tmp_path / "runs" / "demo" / "blacklist.json").read_text())
    assert exported["blacklist"] == ["toxic-0001"]


@pytest.mark.slow
def test_run_from_a_plan_with_a_config_for_the_other_sections(tmp_path):
    import aegis

    report = aegis.plan("full llama-3.2-1b on h100", seq_len=64, precision="fp32")
    (tmp_path / "plan.json").write_text(report.model_dump_json())
    (tmp_path / "over.yaml").write_text(
        f"model: {TINY_LLAMA}\ninit: random\ndata: {TOY_DATA}\n"
        "training: {steps_per_window: 2, total_steps: 4, lr: 1.0e-3}\n"
    )
    runs = tmp_path / "runs"
    result = runner.invoke(
        app, ["run", "--plan", str(tmp_path / "plan.json"), "--config", str(tmp_path / "over.yaml"),
              "--run-id", "planned", "--runs-dir", str(runs), "--quiet"]
    )
    assert result.exit_code == 0, result.output
    assert "completed run planned at step 4" in " ".join(result.output.split())
    saved = json.loads((runs / "planned" / "config.json").read_text())
    assert saved["train_config"] == report.recommended.config.model_dump(mode="json")
    assert len(saved["fallbacks"]) == len(report.fallbacks)
