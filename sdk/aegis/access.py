"""Which local paths a request may name: the policy front ends apply before anything is read.

Locally (the CLI, Gradio on 127.0.0.1) a request may name any path, as always. A remote front end
(Slack, Gradio bound beyond loopback or shared) serves people who must not reach the server's files:
there a model or dataset is either a Hub id / bundled model name, or a path under one of the configured
roots — ``AEGIS_MODEL_DIRS`` and ``AEGIS_DATA_DIRS`` (``os.pathsep``-separated folders). A path is
resolved (``~``, ``..`` and symlinks) before the check, and a refused path is never opened, listed
or read: the refusal is one line naming the allowed roots and how to configure them.

    policy = PathPolicy.from_env(remote=True)          # roots from AEGIS_MODEL_DIRS / AEGIS_DATA_DIRS
    policy.check_model("Qwen/Qwen2.5-0.5B")            # a Hub id: returned as given
    policy.check_data("/srv/data/support.jsonl")       # under a data root: returned as given
    policy.check_data("/etc/passwd")                   # PathNotAllowedError, nothing read
    policy.check_mentions("qlora llama-3.1-8b with ~/secret.jsonl")   # paths in free text, before parsing

What counts as a path: a URL other than http(s), anything absolute or starting with ``.``, ``~`` or a
separator, with a backslash, a ``..`` part, more than one ``/`` or a trailing ``/``, a file suffix
(``.jsonl``, ``.json``, ``.csv``, ``.parquet``, ``.safetensors`` …), and any name that exists relative to
the working directory (the SDK would read it as a local path). Everything else (``org/name``,
``llama-3.1-8b``) is a Hub id or catalog name and passes.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from aegis.errors import PathNotAllowedError
from aegis.schema import Frozen

__all__ = ["MODEL_DIRS_ENV", "DATA_DIRS_ENV", "PathPolicy", "env_dirs", "looks_like_path"]

MODEL_DIRS_ENV = "AEGIS_MODEL_DIRS"
DATA_DIRS_ENV = "AEGIS_DATA_DIRS"

_FILE_SUFFIX = re.compile(
    r"\.(?:jsonl|ndjson|json|csv|tsv|parquet|pq|arrow|txt|yaml|yml|safetensors|bin|pt|pth|gguf|model)"
    r"(?:\.gz|\.zst|\.bz2|\.xz)?$",
    re.IGNORECASE,
)
_SCHEME = re.compile(r"^[A-Za-z][\w+.-]*://")
_WEB = re.compile(r"^https?://", re.IGNORECASE)
_STRIP_LEAD = "([{<\"'`"
_STRIP_TRAIL = ")]}>\"'`,;:!?."
_Kind = Literal["model", "data"]


def env_dirs(name: str, environ: Mapping[str, str] | None = None) -> tuple[Path, ...]:
    """The folders an ``os.pathsep``-separated variable lists (empty entries skipped)."""
    value = (os.environ if environ is None else environ).get(name) or ""
    return tuple(Path(p) for p in (s.strip() for s in value.split(os.pathsep)) if p)


def looks_like_path(spec: str) -> bool:
    """True when the SDK would read ``spec`` as a local file or folder rather than a Hub id or catalog name."""
    if _SCHEME.match(spec):
        return True
    if spec.startswith((".", "~", "/", "\\")) or "\\" in spec or spec.endswith("/"):
        return True
    if re.match(r"^[A-Za-z]:", spec) or os.path.isabs(spec):
        return True
    parts = spec.split("/")
    if len(parts) > 2 or ".." in parts or _FILE_SUFFIX.search(spec):
        return True
    try:
        return os.path.lexists(spec)  # 'org/name' that is a folder here: the SDK would read it
    except (OSError, ValueError):
        return True


def _path_shaped(item: str) -> bool:
    return bool(item) and (
        "/" in item or "\\" in item or item.startswith((".", "~")) or bool(_FILE_SUFFIX.search(item))
    )


def _resolve(path: str | Path) -> Path | None:
    try:
        return Path(path).expanduser().resolve()
    except (OSError, RuntimeError, ValueError):  # symlink loop, unknown ~user, NUL byte
        return None


class PathPolicy(Frozen):
    """Where requests may point: anywhere (local use) or, for remote users, only under the roots."""

    model_dirs: tuple[Path, ...] = Field(default=(), description=f"Folders models may come from ({MODEL_DIRS_ENV}).")
    data_dirs: tuple[Path, ...] = Field(default=(), description=f"Folders datasets may come from ({DATA_DIRS_ENV}).")
    remote: bool = Field(
        default=False, description="Requests come from remote users: local paths must lie under the roots."
    )

    @classmethod
    def from_env(cls, *, remote: bool = False, environ: Mapping[str, str] | None = None) -> PathPolicy:
        """Roots from ``AEGIS_MODEL_DIRS`` / ``AEGIS_DATA_DIRS``."""
        return cls(
            model_dirs=env_dirs(MODEL_DIRS_ENV, environ), data_dirs=env_dirs(DATA_DIRS_ENV, environ), remote=remote
        )

    def check_model(self, spec: str) -> str:
        """``spec`` unchanged when it may be used as a model; PathNotAllowedError (nothing read) otherwise."""
        return self._check(spec, "model")

    def check_data(self, spec: str) -> str:
        """``spec`` unchanged when it may be used as a dataset; PathNotAllowedError (nothing read) otherwise."""
        return self._check(spec, "data")

    def check_request(self, request: Any) -> Any:
        """A `PlanRequest` (anything with ``model`` and ``dataset``) whose model and dataset pass, unchanged."""
        if self.remote:
            if request.model is not None:
                self.check_model(request.model)
            if request.dataset is not None:
                self.check_data(request.dataset)
        return request

    def check_mentions(self, text: str) -> None:
        """Refuse free text naming a path outside every root, before a parser looks at the file system."""
        if not self.remote:
            return
        for raw in (text or "").split():
            item = raw.lstrip(_STRIP_LEAD).rstrip(_STRIP_TRAIL)
            if not _path_shaped(item) or _WEB.match(item) or not looks_like_path(item):
                continue  # a bare word ('data', 'runs') is never read as a path by the parser
            if not self._under(item, (*self.model_dirs, *self.data_dirs)):
                raise PathNotAllowedError(self._refusal(item, None))

    # ------------------------------------------------------------------ internals

    def _check(self, spec: str, kind: _Kind) -> str:
        if not self.remote or not looks_like_path(spec):
            return spec
        if not self._under(spec, self._roots(kind)):
            raise PathNotAllowedError(self._refusal(spec, kind))
        return spec

    def _roots(self, kind: _Kind) -> tuple[Path, ...]:
        return self.model_dirs if kind == "model" else self.data_dirs

    @staticmethod
    def _under(spec: str, roots: tuple[Path, ...]) -> bool:
        if _SCHEME.match(spec):
            return False
        path = _resolve(spec)
        if path is None:
            return False
        for root in roots:
            base = _resolve(root)
            if base is not None and path.is_relative_to(base):
                return True
        return False

    def _refusal(self, spec: str, kind: _Kind | None) -> str:
        """One line: what was refused, which roots are allowed, how to allow more. Never the resolved path."""
        shown = spec if len(spec) <= 80 else spec[:77] + "..."

        def folders(k: _Kind) -> str:
            roots = self._roots(k)
            return f"the {k} folders " + (", ".join(str(r) for r in roots) if roots else "(none configured)")

        if kind == "model":
            use, under, env = "a Hub id (org/name), a bundled model name", folders("model"), MODEL_DIRS_ENV
        elif kind == "data":
            use, under, env = "a Hub dataset id (org/name)", folders("data"), DATA_DIRS_ENV
        else:
            use = "Hub ids (org/name), bundled model names"
            under, env = f"{folders('model')} or {folders('data')}", f"{MODEL_DIRS_ENV} / {DATA_DIRS_ENV}"
        what = {"model": "model path", "data": "dataset path", None: "path"}[kind]
        return (
            f"{what} {shown!r} is not allowed here: use {use} or a path under {under}; "
            f"the server's admin lists allowed folders in {env} ({os.pathsep!r}-separated)"
        )
