"""aegis._outdir: a folder Aegis writes appears whole (a renamed sibling), a user's files are never deleted, a
non-empty folder Aegis did not write needs overwrite, and an impossible target is refused before any work."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from aegis._outdir import MARKER, check_output_dir, check_output_file, output_dir, write_output_file
from aegis.errors import AegisError, OutputPathError


def _write(out: Path, files: dict[str, str], **kw) -> None:
    with output_dir(out, writer="test", **kw) as tmp:
        assert tmp.is_dir() and not any(tmp.iterdir())
        where = Path(os.path.abspath(out))
        assert tmp.parent in (where.parent, where)  # a sibling (same file system), or inside out itself
        for name, text in files.items():
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp / name).write_text(text)


def _listing(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}


def test_a_new_folder_appears_whole_with_the_umask_permissions(tmp_path):
    out = tmp_path / "a" / "out"
    _write(out, {"config.json": "{}", "sub/w.bin": "x"})
    assert _listing(out) == {"config.json", "sub/w.bin", MARKER}
    assert json.loads((out / MARKER).read_text())["files"] == ["config.json", "sub/w.bin"]
    umask = os.umask(0)
    os.umask(umask)
    assert (out.stat().st_mode & 0o777) == (0o777 & ~umask)
    assert sorted(p.name for p in out.parent.iterdir()) == ["out"]  # no temporary left behind


def test_an_aegis_folder_is_replaced_and_its_stale_files_go(tmp_path):
    out = tmp_path / "out"
    _write(out, {"model-00001-of-00002.safetensors": "1", "model-00002-of-00002.safetensors": "2", "config.json": "a"})
    _write(out, {"model.safetensors": "3", "config.json": "b"})  # no overwrite needed: Aegis wrote it
    assert _listing(out) == {"model.safetensors", "config.json", MARKER}
    assert (out / "config.json").read_text() == "b"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_users_file_is_refused_then_kept_with_overwrite(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "important.txt").write_text("mine")
    with pytest.raises(OutputPathError) as err:
        _write(out, {"config.json": "a"})
    msg = str(err.value)
    assert "\n" not in msg and str(out) in msg and "important.txt" in msg and "--overwrite" in msg
    assert _listing(out) == {"important.txt"}
    _write(out, {"config.json": "a", "a.safetensors": "1"}, overwrite=True)
    _write(out, {"config.json": "b", "b.safetensors": "2"}, overwrite=True)
    # the earlier write's a.safetensors is Aegis's and goes; the user's file stays, in every path
    assert _listing(out) == {"important.txt", "config.json", "b.safetensors", MARKER}
    assert (out / "important.txt").read_text() == "mine" and (out / "config.json").read_text() == "b"
    assert not [p for p in out.iterdir() if p.name.startswith(".aegis-partial")]


def test_a_user_file_added_to_an_aegis_folder_makes_it_a_users_folder(tmp_path):
    out = tmp_path / "out"
    _write(out, {"config.json": "a"})
    (out / "notes").mkdir()
    (out / "notes" / "important.txt").write_text("mine")
    with pytest.raises(OutputPathError, match="notes/"):
        _write(out, {"config.json": "b"})
    _write(out, {"config.json": "b"}, overwrite=True)
    assert (out / "notes" / "important.txt").read_text() == "mine"


def test_the_working_directory_is_never_moved_or_emptied(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "important.txt").write_text("mine")
    with pytest.raises(OutputPathError, match="important.txt"):
        _write(Path("."), {"adapter_config.json": "{}"})
    _write(Path("."), {"adapter_config.json": "{}"}, overwrite=True)
    assert Path.cwd() == tmp_path and (tmp_path / "important.txt").read_text() == "mine"
    assert (tmp_path / "adapter_config.json").is_file()


def test_an_error_while_writing_leaves_the_target_untouched(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(RuntimeError):
        with output_dir(out) as tmp:
            (tmp / "half.bin").write_text("x")
            raise RuntimeError("disk full")
    assert list(tmp_path.iterdir()) == []
    _write(out, {"config.json": "a"})
    with pytest.raises(RuntimeError):
        with output_dir(out) as tmp:
            (tmp / "config.json").write_text("b")
            raise RuntimeError("disk full")
    assert (out / "config.json").read_text() == "a" and sorted(p.name for p in tmp_path.iterdir()) == ["out"]


@pytest.mark.parametrize("target, words", [
    ("/dev/null/x", "/dev/null is not a folder"),
    ("{file}", "is a file"),
    ("{file}/sub", "is not a folder"),
])
def test_impossible_targets_are_one_line_before_any_work(tmp_path, target, words):
    (tmp_path / "f.txt").write_text("x")
    target = target.format(file=tmp_path / "f.txt")
    with pytest.raises(OutputPathError) as err:
        check_output_dir(target)
    assert words in str(err.value) and "\n" not in str(err.value)
    assert isinstance(err.value, AegisError) and isinstance(err.value, OSError)
    with pytest.raises(OutputPathError):
        with output_dir(target):
            pytest.fail("the block must not run")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_a_read_only_parent_is_refused(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        with pytest.raises(OutputPathError, match="permission denied"):
            check_output_dir(ro / "out")
    finally:
        ro.chmod(0o700)


def test_output_file_needs_overwrite_and_is_replaced_whole(tmp_path):
    path = tmp_path / "axolotl.yml"
    write_output_file(path, "one\n")
    with pytest.raises(OutputPathError, match="exists; pass --overwrite"):
        write_output_file(path, "two\n")
    assert path.read_text() == "one\n"
    write_output_file(path, "two\n", overwrite=True)
    assert path.read_text() == "two\n" and [p.name for p in tmp_path.iterdir()] == ["axolotl.yml"]
    with pytest.raises(OutputPathError, match="is a folder"):
        check_output_file(tmp_path)
    with pytest.raises(OutputPathError, match="/dev/null is not a folder"):
        check_output_file("/dev/null/x.yml")
