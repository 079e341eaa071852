"""`aegis plan --emit X --out FILE`: an existing file is replaced only with --overwrite, an impossible path is one
line before the plan is made (nothing printed), and the file written equals what --emit prints to stdout."""

from __future__ import annotations

import pytest

from aegis.cli import main

REQUEST = "lora llama-3.2-1b on 4090"


def _fails(args: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as info:
        main(args)
    assert info.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "Traceback" not in captured.err and captured.err.count("\n") == 1, captured.err
    return captured.err


def test_an_existing_file_needs_overwrite(tmp_path, capsys):
    path = tmp_path / "axolotl.yml"
    path.write_text("mine\n")
    err = _fails(["plan", REQUEST, "--emit", "axolotl", "--out", str(path)], capsys)
    assert f"{path} exists; pass --overwrite" in err and path.read_text() == "mine\n"
    main(["plan", REQUEST, "--emit", "axolotl", "--out", str(path), "--overwrite"])
    capsys.readouterr()
    main(["plan", REQUEST, "--emit", "axolotl"])
    printed = capsys.readouterr().out
    assert path.read_text().strip() and path.read_text().strip() in printed  # the file is what stdout shows
    assert [p.name for p in tmp_path.iterdir()] == ["axolotl.yml"]


@pytest.mark.parametrize("out, words", [("/dev/null/x.yml", "/dev/null is not a folder"), ("{tmp}", "is a folder")])
def test_impossible_paths_are_one_line_before_planning(tmp_path, capsys, out, words):
    assert words in _fails(["plan", REQUEST, "--emit", "hf", "--out", out.format(tmp=tmp_path)], capsys)


def test_out_without_emit_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        main(["plan", REQUEST, "--out", str(tmp_path / "x.yml")])
    assert info.value.code == 2 and "--emit" in capsys.readouterr().err
    assert not (tmp_path / "x.yml").exists()
