"""Aegis errors: one base class, subclasses that are also the builtin a caller would catch.

Every message says what to do next. The CLI prints ``str(err)`` on one line and exits 2;
no traceback reaches a user for these.

    try:
        aegis.resolve_model("lama-8b")
    except aegis.UnknownModelError as err:
        print(err)
"""

from __future__ import annotations

__all__ = [
    "AegisError",
    "UnknownModelError",
    "UnknownGPUError",
    "UnsupportedArchitectureError",
    "InvalidConfigError",
    "OfflineError",
    "DatasetError",
    "RequestParseError",
    "NothingFitsError",
    "CheckpointError",
    "RunError",
    "CommandError",
    "WeightsNotFoundError",
    "MissingExtraError",
    "PathNotAllowedError",
    "OutputPathError",
]


class AegisError(Exception):
    """Base class of every error Aegis raises on purpose."""


class UnknownModelError(AegisError, LookupError):
    """A model id, alias or path that cannot be resolved."""


class UnknownGPUError(AegisError, LookupError):
    """A GPU name that is not in the catalog."""


class UnsupportedArchitectureError(AegisError, ValueError):
    """A config.json whose architecture has no registered family."""


class InvalidConfigError(AegisError, ValueError):
    """A malformed config.json, or training settings that make no sense (zero batch, ...)."""


class OfflineError(AegisError, ConnectionError):
    """The Hub is needed but unreachable and nothing is cached."""


class DatasetError(AegisError, ValueError):
    """A dataset that cannot be read or whose format cannot be detected."""


class RequestParseError(AegisError, ValueError):
    """Free-text request that names something unknown or ambiguous."""


class NothingFitsError(AegisError, ValueError):
    """No configuration of the requested job fits the GPU."""


class CheckpointError(AegisError, ValueError):
    """A checkpoint whose tensors do not match the model, or that is missing or corrupt."""


class RunError(AegisError, LookupError):
    """An unknown run id or a run folder that cannot be used."""


class CommandError(AegisError, ValueError):
    """A malformed human-in-the-loop command."""


class WeightsNotFoundError(AegisError, FileNotFoundError):
    """A model to train whose weights are not on this machine (a folder without safetensors, an uncached Hub id)."""


class PathNotAllowedError(AegisError, PermissionError):
    """A remote request naming a local path outside the allowed roots (AEGIS_MODEL_DIRS / AEGIS_DATA_DIRS)."""


class MissingExtraError(AegisError, ImportError):
    """A feature whose optional extra is not installed; the message names the pip command."""


class OutputPathError(AegisError, OSError):
    """An output folder or file that cannot be written: it holds files Aegis did not write (without
    ``--overwrite``), it is a file, its parent is not a folder, or it is not writable."""
