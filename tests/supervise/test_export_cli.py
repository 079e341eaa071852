"""`aegis export RUN [OUT]`: a user's files in OUT survive, a folder Aegis did not write needs --overwrite, an
impossible OUT or --step is one line before any model is built, and the export still equals the run's own."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from aegis.cli.supervised import app
from tests.supervise.conftest import run_config

runner = CliRunner()


def _fake_run(tmp_path: Path, steps=(2, 4)) -> Path:
    """A run folder as `aegis export` first looks at it: config.json and Orbax's step folders."""
    root = tmp_path / "runs" / "r"
    (root / "checkpoints").mkdir(parents=True)
    (root / "config.json").write_text("{}")
    for s in steps:
        (root / "checkpoints" / str(s)).mkdir()
    (root / "checkpoints" / "6.orbax-checkpoint-tmp-1").mkdir()  # an unfinished save is not a step
    return tmp_path / "runs"


def _one_line(args: list[str], runs: Path) -> str:
    t0 = time.monotonic()
    res = runner.invoke(app, ["export", *args, "--runs-dir", str(runs)])
    assert time.monotonic() - t0 < 5  # refused before anything is built (was NotADirectoryError after 28 s)
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1, res.output
    return lines[0]


def test_a_users_folder_is_refused_and_kept(tmp_path):
    runs = _fake_run(tmp_path)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "important.txt").write_text("keep")
    line = _one_line(["r", str(mine)], runs)
    assert str(mine) in line and "important.txt" in line and "--overwrite" in line
    assert [p.name for p in mine.iterdir()] == ["important.txt"]


@pytest.mark.parametrize("out, words", [
    ("/dev/null/x", "/dev/null is not a folder"),
    ("{runs}/r/config.json", "is a file"),
    ("{runs}/r", "the run's own folder"),
    ("{runs}/r/checkpoints", "the run's own folder"),
])
def test_impossible_targets_are_one_line_and_fast(tmp_path, out, words):
    runs = _fake_run(tmp_path)
    assert words in _one_line(["r", out.format(runs=runs)], runs)
    assert (runs / "r" / "config.json").read_text() == "{}"


@pytest.mark.parametrize("step", ["-1", "1"])
def test_a_step_without_a_checkpoint_lists_the_steps(tmp_path, step):
    runs = _fake_run(tmp_path)
    line = _one_line(["r", str(tmp_path / "out"), "--step", step], runs)
    assert f"no checkpoint at or below step {step}" in line and "steps 2, 4" in line
    assert "aegis run" not in line and not (tmp_path / "out").exists()


def test_no_checkpoint_yet(tmp_path):
    runs = _fake_run(tmp_path, steps=())
    assert "no checkpoint to export yet" in _one_line(["r", "--step", "0"], runs)


@pytest.mark.slow
def test_export_beside_a_users_file_equals_the_runs_own_export(tmp_path):
    from safetensors.numpy import load_file

    cfg = run_config(tmp_path, training={"steps_per_window": 2, "total_steps": 4}, checkpoints={"interval": 2})
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(cfg))
    runs = tmp_path / "runs"
    res = runner.invoke(app, ["run", "--config", str(tmp_path / "run.yaml"), "--run-id", "t", "--runs-dir", str(runs), "-q"])
    assert res.exit_code == 0, res.output
    own = runs / "t" / "export"
    reference = load_file(own / "model.safetensors")

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "important.txt").write_text("keep")
    res = runner.invoke(app, ["export", "t", str(mine), "--overwrite", "--runs-dir", str(runs)])
    assert res.exit_code == 0, res.output
    assert f"exported t at step 4 to {mine} (HF model folder)" in res.output
    assert (mine / "important.txt").read_text() == "keep"
    got = load_file(mine / "model.safetensors")
    assert got.keys() == reference.keys() and all((got[k] == reference[k]).all() for k in got)
    assert json.loads((mine / "config.json").read_text())["model_type"] == json.loads((own / "config.json").read_text())["model_type"]

    # the run's own export folder is Aegis's: exported again without --overwrite, a file put there stays
    (own / "notes.txt").write_text("keep")
    res = runner.invoke(app, ["export", "t", "--step", "3", "--runs-dir", str(runs)])
    assert res.exit_code == 0 and "exported t at step 2 to" in res.output, res.output
    assert (own / "notes.txt").read_text() == "keep" and (own / "model.safetensors").is_file()
    assert sorted(p.name for p in (runs / "t").iterdir() if p.name.startswith(".")) == []
