"""The stack profile a plan is sized for: given by the user, else detected from installed packages, else the default.

Detection reads package metadata only, nothing is imported, once per process: one pass over the ``sys.path``
folders for the ``{name}-{version}.dist-info`` folders every installer writes (PEP 376/427), and
`importlib.metadata` only for an ``.egg-info`` without a version in its name. (Four ``importlib.metadata.version``
calls, three of them misses that scan every path entry, cost more: `tools/bench/bench_plan.py` measures it.)

- ``transformers_version``: the installed ``transformers`` distribution's version; default ``"5"``.
- ``trainer``, first match wins: ``unsloth`` installed -> unsloth (it patches transformers when imported, and one
  installs it to use it); ``axolotl`` -> axolotl; ``trl`` -> trl; otherwise hf (HF Trainer). A plain PEFT loop
  cannot be told from HF Trainer by what is installed: say ``--trainer peft``.
- ``liger`` is never detected: installing ``liger-kernel`` does not turn it on (TRL's ``use_liger_kernel`` and
  axolotl's plugin are opt-in); say ``--liger``.
- ``kbit_prep`` follows the trainer (`StackProfile.kbit_prep_effective`); ``checkpointing`` is ``offload`` for
  Unsloth (``use_gradient_checkpointing="unsloth"``, its documented default), else ``non_reentrant``.

    from aegis.planning.stack import resolve_stack
    stack, source = resolve_stack(trainer="trl", transformers_version="4.48.1")
    source  # {"trainer": "given", "transformers_version": "given", ...}
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from aegis.errors import InvalidConfigError
from aegis.schema import StackProfile

__all__ = ["TRAINER_PRECEDENCE", "installed_versions", "detect_stack", "resolve_stack", "check_model_in_stack"]

TRAINER_PRECEDENCE: tuple[tuple[str, str], ...] = (("unsloth", "unsloth"), ("axolotl", "axolotl"), ("trl", "trl"))
"""(distribution, trainer) pairs in the order detection tries them."""


_WANTED = ("transformers", *(dist for dist, _ in TRAINER_PRECEDENCE))


def _metadata_version(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def installed_versions(names: tuple[str, ...] = _WANTED) -> dict[str, str]:
    """Installed versions of the distributions ``names`` (lower case, no dashes), first on ``sys.path`` wins."""
    import os
    import sys

    found: dict[str, str] = {}
    for entry in sys.path:
        try:
            listing = os.scandir(entry or ".")
        except OSError:
            continue
        with listing:
            for item in listing:
                stem, dot, kind = item.name.rpartition(".")
                if kind not in ("dist-info", "egg-info") or not dot:
                    continue
                name, _, version = stem.partition("-")
                name = name.lower().replace("-", "_")
                if name in names and name not in found:
                    version = version.partition("-")[0] or (_metadata_version(name) or "")
                    if version:
                        found[name] = version
    return found


@lru_cache(maxsize=1)
def detect_stack() -> dict[str, Any]:
    """Stack fields found in this Python environment's package metadata (only those found)."""
    found: dict[str, Any] = {}
    versions = installed_versions()
    if "transformers" in versions:
        found["transformers_version"] = versions["transformers"]
    for dist, trainer in TRAINER_PRECEDENCE:
        if dist in versions:
            found["trainer"] = trainer
            break
    return found


def resolve_stack(
    *,
    trainer: str | None = None,
    transformers_version: str | None = None,
    kbit_prep: bool | None = None,
    liger: bool | None = None,
    checkpointing: str | None = None,
    detect: bool = True,
) -> tuple[StackProfile, dict[str, str]]:
    """The profile from what was given, filled in by detection (``detect``) and defaults, and where each field came from."""
    given = {"trainer": trainer, "transformers_version": transformers_version, "kbit_prep": kbit_prep, "liger": liger,
             "checkpointing": checkpointing}
    fields: dict[str, Any] = {k: v for k, v in given.items() if v is not None}
    source = {k: "given" for k in fields}
    if detect:
        for key, value in detect_stack().items():
            if key not in fields:
                fields[key] = value
                source[key] = "detected"
    if "checkpointing" not in fields and fields.get("trainer") == "unsloth":
        fields["checkpointing"] = "offload"
    try:
        stack = StackProfile(**fields)
    except ValueError as err:
        errors = getattr(err, "errors", None)
        first = errors()[0] if callable(errors) else {"loc": ("stack",), "msg": str(err)}
        where = ".".join(str(x) for x in first.get("loc", ())) or "stack"
        raise InvalidConfigError(
            f"bad stack setting {where}: {first['msg'].removeprefix('Value error, ')} "
            "(trainer: hf, trl, peft, axolotl, unsloth; transformers: e.g. 4.48.1 or 5)"
        ) from None
    for key in given:
        source.setdefault(key, "default")
    return stack, source


def _release(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def check_model_in_stack(model_type: str | None, stack: StackProfile, source: dict[str, str]) -> str | None:
    """Whether the stack's transformers has the model's architecture (the registry's ``transformers_since``).

    Given (``--transformers 4.48``, the SDK's ``transformers_version``) and older: an InvalidConfigError that says
    which release first has it. Detected (the installed transformers) and older: a note for the report, since one
    upgrades before training. A bare major ("4") predates a model only when that model came in a later major."""
    from aegis.models.architectures import registry

    entry = registry.find(model_type)
    if entry is None:
        return None
    have, need = _release(stack.transformers_version), _release(entry.transformers_since)
    if not have or have >= need[: len(have)]:
        return None
    named = ", ".join(entry.hf_architectures) or entry.model_type
    if source.get("transformers_version") == "given":
        raise InvalidConfigError(
            f"transformers {stack.transformers_version} has no {named} (model_type {entry.model_type!r}, first in "
            f"transformers {entry.transformers_since}): plan with --transformers {entry.transformers_since} or later "
            "(or --transformers 5), or upgrade transformers"
        )
    return (
        f"the installed transformers {stack.transformers_version} has no {named} (first in {entry.transformers_since}): "
        f"upgrade it before training (pip install 'transformers>={entry.transformers_since}')"
    )
