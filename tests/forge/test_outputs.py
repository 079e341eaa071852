"""`aegis merge`, `compress` and `evomerge` write OUT without destroying a user's files: a folder Aegis did not
write is refused without --overwrite (one line, naming it), a user's file survives --overwrite and the model
written beside it equals the one written to a fresh folder, and an impossible OUT is one line before any work."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import typer
import yaml
from typer.testing import CliRunner

from aegis.cli.forge import compress, evomerge, merge
from tests.forge.conftest import fill, read_folder
from tests.hf_folders import make_model_folder

app = typer.Typer(add_completion=False)
app.command("merge")(merge)
app.command("compress")(compress)
app.command("evomerge")(evomerge)

LINEAR = {"merge_method": "linear", "models": [{"model": "a", "parameters": {"weight": 0.5}},
                                                {"model": "b", "parameters": {"weight": 0.5}}]}


def _invoke(*args: str):
    return CliRunner().invoke(app, [str(a) for a in args])


def _one_line(*args: str) -> str:
    t0 = time.monotonic()
    res = _invoke(*args)
    assert time.monotonic() - t0 < 5  # refused before any tensor is read
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1, res.output
    return lines[0]


def _users_folder(tmp_path: Path) -> Path:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "important.txt").write_text("keep")
    return mine


def _same_tensors(x: Path, y: Path) -> None:
    a, b = read_folder(x), read_folder(y)
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)


def test_merge_keeps_a_users_file(models, tmp_path):
    cfg = tmp_path / "merge.yml"
    cfg.write_text(yaml.safe_dump(fill(LINEAR, models)))
    mine = _users_folder(tmp_path)
    line = _one_line("merge", cfg, mine)
    assert str(mine) in line and "important.txt" in line and "--overwrite" in line
    assert [p.name for p in mine.iterdir()] == ["important.txt"]
    assert _invoke("merge", cfg, mine, "--overwrite", "-q").exit_code == 0
    assert _invoke("merge", cfg, tmp_path / "fresh", "-q").exit_code == 0
    assert (mine / "important.txt").read_text() == "keep"
    _same_tensors(mine, tmp_path / "fresh")
    assert _invoke("merge", cfg, tmp_path / "fresh", "-q").exit_code == 0  # Aegis's own folder: no --overwrite


@pytest.mark.parametrize("out", ["/dev/null/x", "{cfg}"])
def test_merge_impossible_target_is_one_line(models, tmp_path, out):
    cfg = tmp_path / "merge.yml"
    cfg.write_text(yaml.safe_dump(fill(LINEAR, models)))
    line = _one_line("merge", cfg, out.format(cfg=cfg))
    assert "is not a folder" in line or "is a file" in line


def test_compress_keeps_a_users_file(tmp_path):
    src = make_model_folder(tmp_path / "m")
    mine = _users_folder(tmp_path)
    line = _one_line("compress", src, mine)
    assert "important.txt" in line and "--overwrite" in line
    assert _invoke("compress", src, mine, "--overwrite").exit_code == 0
    assert _invoke("compress", src, tmp_path / "fresh").exit_code == 0
    assert (mine / "important.txt").read_text() == "keep" and (mine / "bitnet_config.json").is_file()
    _same_tensors(mine, tmp_path / "fresh")
    assert "/dev/null is not a folder" in _one_line("compress", src, "/dev/null/x")
    # with calibration data the check comes before the calibration is read
    assert "important.txt" in _one_line("compress", src, mine, "--data", tmp_path / "none.jsonl")


def test_evomerge_refuses_a_users_folder_and_an_impossible_one(models, tmp_path):
    eval_data = tmp_path / "eval.jsonl"
    eval_data.write_text('{"text": "hello"}\n')
    cfg = tmp_path / "evo.yml"
    cfg.write_text(yaml.safe_dump({"base_model": str(models["base"]), "models": [str(models["a"]), str(models["b"])],
                                   "eval_data": str(eval_data)}))
    mine = _users_folder(tmp_path)
    line = _one_line("evomerge", cfg, mine)
    assert "important.txt" in line and "--overwrite" in line
    (mine / "work").mkdir()
    (mine / "work" / "thesis.tex").write_text("keep")
    assert "holds work/" in _one_line("evomerge", cfg, mine, "--overwrite")  # the run's scratch is deleted at its end
    assert (mine / "work" / "thesis.tex").read_text() == "keep"
    assert "/dev/null is not a folder" in _one_line("evomerge", cfg, "/dev/null/x")
