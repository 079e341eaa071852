"""Write an output folder (or file) without destroying what Aegis did not write.

    out = check_output_dir(out, overwrite=False)      # before any expensive work: one-line OutputPathError
    with output_dir(out, overwrite=False, writer="aegis export") as tmp:
        ...                                           # write every file into tmp (an empty folder)
    # published at out when the block ends without an error; on an error tmp is removed and out is untouched

    write_output_file(path, text, overwrite=False)    # one file (`aegis plan --emit X --out FILE`)

Every folder Aegis writes gets a small ``.aegis-output.json`` listing the files it wrote; that list is how
a later write knows which files are Aegis's. The rules:

- ``out`` does not exist: the files are written into a hidden sibling (``.<name>.partial-`` and a random suffix, same
  parent, so the rename is atomic) and renamed into place: a reader sees no folder or the whole folder.
- ``out`` is empty or holds only files an earlier Aegis write listed: the new folder takes its place by
  rename (the old one is moved aside first; its listed files are deleted after, anything else stays).
- ``out`` holds other files (a user's ``important.txt``, a working directory): refused unless
  ``overwrite``. With ``overwrite`` the new files are moved in one by one (each ``os.replace`` is atomic),
  replacing files of the same name; files the earlier Aegis write listed and this one does not are
  removed; every other file stays. No path deletes a file Aegis did not write (except one of the same
  name that ``overwrite`` replaces).

A target that is a file, whose parent is not a folder (``/dev/null/x``), or that cannot be written is refused
by :func:`check_output_dir` before anything is computed.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path

from aegis.errors import OutputPathError

__all__ = ["MARKER", "check_output_dir", "output_dir", "check_output_file", "write_output_file"]

MARKER = ".aegis-output.json"
"""The file in every folder Aegis writes that lists the files it wrote (relative POSIX paths)."""


def _absolute(path: str | Path) -> Path:
    return Path(os.path.abspath(Path(path).expanduser()))


def _recorded(folder: Path) -> set[str] | None:
    """The files the last Aegis write into ``folder`` listed; None when it has no (readable) marker."""
    try:
        data = json.loads((folder / MARKER).read_text(encoding="utf-8"))
        return {str(f) for f in data["files"]}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _foreign(folder: Path, recorded: set[str]) -> str | None:
    """The first file under ``folder`` that is not in ``recorded`` (None: every file is Aegis's). Walks only
    into folders that hold recorded files, so a huge unrelated folder is not crawled."""
    dirs = {p.as_posix() for f in recorded for p in Path(f).parents if p != Path(".")}
    stack = [(folder, "")]
    while stack:
        here, prefix = stack.pop()
        with os.scandir(here) as entries:
            for entry in entries:
                rel = f"{prefix}{entry.name}"
                if rel == MARKER:
                    continue
                if entry.is_dir(follow_symlinks=False):
                    if rel in dirs:
                        stack.append((Path(entry.path), rel + "/"))
                    elif any(True for _ in os.scandir(entry.path)):
                        return rel + "/"
                elif rel not in recorded:
                    return rel
    return None


def _writable(folder: Path) -> bool:
    return os.access(folder, os.W_OK | os.X_OK)


def check_output_dir(out: str | Path, *, overwrite: bool = False, option: str = "--overwrite") -> Path:
    """The absolute path of output folder ``out`` once it is known to be writable under the module's rules;
    :class:`~aegis.errors.OutputPathError` (one line, naming the folder and ``option``) otherwise."""
    path = _absolute(out)
    if path.exists() and not path.is_dir():
        raise OutputPathError(f"output folder {out} is a file; choose a folder path (it is created if missing)")
    if path.is_dir():
        if not _writable(path):
            raise OutputPathError(f"cannot write to output folder {out} (permission denied); choose another folder")
        recorded = _recorded(path)
        stranger = _foreign(path, recorded or set())
        if stranger is not None and not overwrite:
            raise OutputPathError(
                f"output folder {out} is not empty and Aegis did not write it (it holds {stranger}); pass {option} "
                "to write beside those files (files of the same name are replaced, others are kept), "
                "or choose another folder"
            )
        return path
    ancestor = path.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise OutputPathError(f"cannot create output folder {out}: {ancestor} is not a folder; "
                              "choose another folder")
    if not _writable(ancestor):
        raise OutputPathError(f"cannot create output folder {out}: {ancestor} is not writable (permission denied); "
                              "choose another folder")
    return path


def _files(folder: Path) -> list[str]:
    """Every file under ``folder`` (relative POSIX paths, sorted), the marker left out."""
    return sorted(
        p.relative_to(folder).as_posix() for p in folder.rglob("*") if not p.is_dir() and p.name != MARKER
    )


def _write_marker(folder: Path, files: list[str], writer: str) -> None:
    tmp = folder / f"{MARKER}.tmp"
    tmp.write_text(json.dumps({"written_by": writer, "files": files}, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, folder / MARKER)


def _remove_listed(folder: Path, files: set[str]) -> None:
    """Delete the listed files under ``folder``, then the folders that became empty (``folder`` included)."""
    for rel in files:
        with contextlib.suppress(FileNotFoundError, IsADirectoryError, NotADirectoryError):
            (folder / rel).unlink()
    with contextlib.suppress(FileNotFoundError):
        (folder / MARKER).unlink()
    for sub in sorted((p for p in folder.rglob("*") if p.is_dir() and not p.is_symlink()), key=lambda p: -len(p.parts)):
        with contextlib.suppress(OSError):
            sub.rmdir()
    with contextlib.suppress(OSError):
        folder.rmdir()


def _fresh(parent: Path, prefix: str) -> Path:
    """A new hidden name in ``parent`` (not created); unlike ``tempfile.mkdtemp`` the folder created there
    later gets the umask's permissions, as a folder the user made would."""
    while True:
        candidate = parent / f"{prefix}{os.getpid()}-{secrets.token_hex(3)}"
        if not os.path.lexists(candidate):
            return candidate


def _holds_cwd(path: Path) -> bool:
    cwd = Path(os.getcwd())
    return path == cwd or path in cwd.parents


@contextlib.contextmanager
def output_dir(out: str | Path, *, overwrite: bool = False, writer: str = "aegis", option: str = "--overwrite") -> Iterator[Path]:
    """An empty temporary folder to write ``out``'s files into, published at ``out`` when the block ends
    (the module's rules). Checks ``out`` first (:func:`check_output_dir`); on an error nothing at ``out`` changes."""
    path = check_output_dir(out, overwrite=overwrite, option=option)
    old = _recorded(path) if path.is_dir() else None
    swap = not path.exists() or (
        not path.is_symlink() and not _holds_cwd(path) and _writable(path.parent)
        and _foreign(path, old or set()) is None
    )
    if swap:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = _fresh(path.parent, f".{path.name}.partial-")
    else:
        tmp = _fresh(path, ".aegis-partial-")
    tmp.mkdir()
    try:
        yield tmp
        files = _files(tmp)
        if swap:
            _write_marker(tmp, files, writer)
            _swap_in(tmp, path, old)
        else:
            _move_in(tmp, path, files, old, writer)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _swap_in(tmp: Path, path: Path, old: set[str] | None) -> None:
    """Rename ``tmp`` to ``path``; an existing ``path`` (empty, or only Aegis's files) is moved aside first."""
    if not path.exists():
        os.replace(tmp, path)
        return
    aside = _fresh(path.parent, f".{path.name}.old-")
    os.replace(path, aside)
    os.replace(tmp, path)
    _remove_listed(aside, old or set())


def _move_in(tmp: Path, path: Path, files: list[str], old: set[str] | None, writer: str) -> None:
    """Move ``tmp``'s files into ``path`` one by one, keeping every file Aegis did not write."""
    for rel in files:
        if (path / rel).is_dir():
            raise OutputPathError(f"output folder {path} holds a folder named {rel}, where a file is to be written; "
                                  "move it or choose another folder")
    _write_marker(path, sorted(set(files) | (old or set())), writer)  # a crash midway leaves every file listed
    for rel in files:
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp / rel, path / rel)
    for rel in sorted((old or set()) - set(files)):
        with contextlib.suppress(FileNotFoundError, IsADirectoryError):
            (path / rel).unlink()
    _write_marker(path, files, writer)


def check_output_file(path: str | Path, *, overwrite: bool = False, option: str = "--overwrite") -> Path:
    """The absolute path of output file ``path`` once it can be written: an existing file needs ``overwrite``;
    a folder, a parent that is not a folder or a non-writable one is an :class:`~aegis.errors.OutputPathError`."""
    p = _absolute(path)
    if p.is_dir():
        raise OutputPathError(f"{path} is a folder; give a file path")
    if p.exists() and not overwrite:
        raise OutputPathError(f"{path} exists; pass {option} to replace it, or choose another file")
    if not p.parent.is_dir():
        raise OutputPathError(f"cannot write {path}: {p.parent} is not a folder; choose another path")
    if not _writable(p.parent) or (p.exists() and not os.access(p, os.W_OK)):
        raise OutputPathError(f"cannot write {path} (permission denied); choose another path")
    return p


def write_output_file(path: str | Path, text: str, *, overwrite: bool = False, option: str = "--overwrite") -> Path:
    """Write ``text`` to ``path`` atomically (a sibling temporary file renamed over it) under
    :func:`check_output_file`'s rules; returns the absolute path."""
    p = check_output_file(path, overwrite=overwrite, option=option)
    tmp = _fresh(p.parent, f".{p.name}.partial-")
    try:
        with open(tmp, "x", encoding="utf-8") as fh:
            fh.write(text)
        if not overwrite and p.exists():  # appeared since the check
            raise OutputPathError(f"{path} exists; pass {option} to replace it, or choose another file")
        os.replace(tmp, p)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return p
