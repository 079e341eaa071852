"""Metrics reporting: ``report_to`` like Hugging Face Trainer's, over TensorBoard, W&B and MLflow.

A :class:`MetricsReporter` fans each step's scalars out to the chosen backends. ``"none"`` (or
``None``, ``[]``) reports nowhere, ``"all"`` to every installed backend. Reporting never stops a
run: a backend that fails to start or to log is disabled with one warning and training goes on.

    reporter = open_reporter(["tensorboard"], run_dir, run_id="demo-1", config={"lr": 1e-4})
    if reporter is not None:
        reporter.log(step, {"train/loss": 2.3, "train/lr": 1e-4, "train/tokens_per_s": 1234.0})
        reporter.close()  # flush; safe to call twice

Where each backend writes:

- ``tensorboard``: event files under ``log_dir/tensorboard/`` (``tensorboard --logdir …``),
  written with the ``tensorboard`` package's own event writer, which needs neither torch nor TF.
- ``wandb``: project ``aegis``, run name ``run_id``, files under ``log_dir/wandb/``;
  ``WANDB_MODE`` (``offline``, ``disabled``, …) is honoured.
- ``mlflow``: experiment ``aegis`` (or ``MLFLOW_EXPERIMENT_NAME``) on ``MLFLOW_TRACKING_URI``, or
  when that is unset a local SQLite store ``log_dir/mlflow.db`` (``mlflow ui --backend-store-uri
  sqlite:///…/mlflow.db``).

Importing this module imports none of the backends; opening a reporter imports the chosen ones.
"""

from __future__ import annotations

import difflib
import importlib.util
import os
import time
import warnings
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from aegis.errors import InvalidConfigError

__all__ = ["REPORTERS", "MetricsReporter", "open_reporter"]

REPORTERS: tuple[str, ...] = ("tensorboard", "wandb", "mlflow")

_ALL = "all"
_NONE = "none"
_TB_FLUSH_SECS = 10  # a live `tensorboard --logdir` sees new points within this delay
_MLFLOW_PARAM_CHARS = 500  # MLflow's smallest param-value limit across store versions
_MLFLOW_PARAMS_PER_BATCH = 100  # MLflow's log_batch limit on params


class _Backend(ABC):
    """One reporting backend: started in ``__init__``, then ``log`` per step and ``close`` once."""

    name: ClassVar[str]
    module: ClassVar[str]  # top-level import name, checked with find_spec before starting
    package: ClassVar[str]  # what to pip install when it is missing

    @abstractmethod
    def __init__(self, log_dir: Path, *, run_id: str, config: dict[str, Any] | None) -> None: ...

    @abstractmethod
    def log(self, step: int, metrics: Mapping[str, float]) -> None: ...

    @abstractmethod
    def close(self) -> None: ...

    def rewind(self, step: int) -> None:
        """Forget what was logged after ``step`` (a resumed or rolled-back run logs those steps again); a
        backend that cannot leaves them (W&B and MLflow keep every point they were sent)."""


class _TensorBoard(_Backend):
    name = "tensorboard"
    module = "tensorboard"
    package = "tensorboard"

    def __init__(self, log_dir: Path, *, run_id: str, config: dict[str, Any] | None) -> None:
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self._event_pb2 = event_pb2
        self._summary_pb2 = summary_pb2
        self._writer = EventFileWriter(str(log_dir / "tensorboard"), flush_secs=_TB_FLUSH_SECS)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        summary = self._summary_pb2.Summary(
            value=[self._summary_pb2.Summary.Value(tag=tag, simple_value=value) for tag, value in metrics.items()]
        )
        self._writer.add_event(self._event_pb2.Event(wall_time=time.time(), step=step, summary=summary))

    def rewind(self, step: int) -> None:
        # a SessionLog START at step+1: TensorBoard drops every point at or past it read before (what
        # torch's SummaryWriter(purge_step=...) writes after a restart)
        start = self._event_pb2.SessionLog(status=self._event_pb2.SessionLog.START)
        self._writer.add_event(self._event_pb2.Event(wall_time=time.time(), step=step + 1, session_log=start))
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class _WandB(_Backend):
    name = "wandb"
    module = "wandb"
    package = "wandb"

    def __init__(self, log_dir: Path, *, run_id: str, config: dict[str, Any] | None) -> None:
        import wandb

        # mode None lets wandb decide (its settings file, `wandb offline`): online by default.
        self._run = wandb.init(
            project="aegis", name=run_id, dir=str(log_dir), config=config, mode=os.environ.get("WANDB_MODE")
        )

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self._run.log(dict(metrics), step=step)

    def close(self) -> None:
        self._run.finish()


class _MLflow(_Backend):
    name = "mlflow"
    module = "mlflow"
    package = "mlflow"

    def __init__(self, log_dir: Path, *, run_id: str, config: dict[str, Any] | None) -> None:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI")
        artifacts: str | None = None
        if not uri:  # everything stays in the run folder
            uri = f"sqlite:///{log_dir.resolve() / 'mlflow.db'}"
            artifacts = (log_dir.resolve() / "mlflow-artifacts").as_uri()
        self._client = MlflowClient(tracking_uri=uri)
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or "aegis"
        experiment = self._client.get_experiment_by_name(name)
        experiment_id = (
            experiment.experiment_id
            if experiment is not None
            else self._client.create_experiment(name, artifact_location=artifacts)
        )
        self._run_id = self._client.create_run(experiment_id, run_name=run_id).info.run_id
        params = [Param(k, v[:_MLFLOW_PARAM_CHARS]) for k, v in _flatten(config or {}).items()]
        for i in range(0, len(params), _MLFLOW_PARAMS_PER_BATCH):
            self._client.log_batch(self._run_id, params=params[i : i + _MLFLOW_PARAMS_PER_BATCH])

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        timestamp_ms = int(time.time() * 1000)
        batch = [Metric(key, value, timestamp_ms, step) for key, value in metrics.items()]
        self._client.log_batch(self._run_id, metrics=batch)  # one transaction, not one per key

    def close(self) -> None:
        self._client.set_terminated(self._run_id, status="FINISHED")


_BACKENDS: dict[str, type[_Backend]] = {b.name: b for b in [_TensorBoard, _WandB, _MLflow]}


def _flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": "1"}``: nested settings as flat string params."""
    out: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(_flatten(value, f"{name}."))
        else:
            out[name] = str(value)
    return out


def _installed(name: str) -> bool:
    return importlib.util.find_spec(_BACKENDS[name].module) is not None


def _resolve(report_to: Sequence[str] | str | None) -> tuple[str, ...]:
    """Backend names to start, in order, without duplicates. Raises for unknown or missing ones."""
    if report_to is None:
        return ()
    raw = report_to.split(",") if isinstance(report_to, str) else list(report_to)
    names = [str(n).strip().lower() for n in raw if str(n).strip()]
    valid = ", ".join((*REPORTERS, _ALL, _NONE))
    for name in names:
        if name not in _BACKENDS and name not in (_ALL, _NONE):
            close = difflib.get_close_matches(name, [*REPORTERS, _ALL, _NONE], n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise InvalidConfigError(f"unknown report_to {name!r}; {hint}valid: {valid}")
    if _NONE in names:
        if len(names) > 1:
            raise InvalidConfigError(f"report_to 'none' cannot be combined with {names!r}; valid: {valid}")
        return ()
    chosen: list[str] = []
    for name in names:
        expanded = [n for n in REPORTERS if _installed(n)] if name == _ALL else [name]
        chosen.extend(n for n in expanded if n not in chosen)
    for name in chosen:
        if not _installed(name):
            package = _BACKENDS[name].package
            raise InvalidConfigError(f"report_to {name!r} needs the {package!r} package: pip install {package}")
    return tuple(chosen)


def _scalars(metrics: Mapping[str, Any], warned: set[str]) -> dict[str, float]:
    """Metrics as Python floats (JAX/NumPy scalars included); values that are not numbers are dropped."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        try:
            out[str(key)] = float(value)
        except (TypeError, ValueError):
            if key not in warned:
                warned.add(key)
                warnings.warn(f"metric {key!r} is not a number ({value!r}); not reported", RuntimeWarning, stacklevel=3)
    return out


class MetricsReporter:
    """Fan-out of step scalars over the chosen backends (names from :data:`REPORTERS`, or "all").

    Raises :class:`~aegis.errors.InvalidConfigError` for an unknown or uninstalled backend. A backend
    that fails to start, log or close is disabled with one ``RuntimeWarning``; nothing here raises
    into the training loop after construction.
    """

    def __init__(
        self, report_to: Sequence[str], log_dir: Path, *, run_id: str, config: dict[str, Any] | None = None
    ) -> None:
        names = _resolve(report_to)
        log_dir = Path(log_dir)
        log_dir.mkdir(parents=True, exist_ok=True)
        self._backends: dict[str, _Backend] = {}
        self._bad_keys: set[str] = set()
        self._closed = False
        for name in names:
            try:
                self._backends[name] = _BACKENDS[name](log_dir, run_id=run_id, config=config)
            except Exception as err:  # noqa: BLE001 - a reporting backend must never stop a run
                _warn_disabled(name, "start", err)

    @property
    def backends(self) -> tuple[str, ...]:
        """Names of the backends still reporting."""
        return tuple(self._backends)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        """Report scalars for ``step``. A failing backend is disabled with one warning."""
        if self._closed or not self._backends:
            return
        values = _scalars(metrics, self._bad_keys)
        if not values:
            return
        for name, backend in list(self._backends.items()):
            try:
                backend.log(int(step), values)
            except Exception as err:  # noqa: BLE001 - a reporting backend must never stop a run
                del self._backends[name]
                _warn_disabled(name, f"log step {step}", err)
                _close_quietly(backend)

    def rewind(self, step: int) -> None:
        """Tell the backends that training continues from ``step``: the points logged after it are void."""
        for name, backend in list(self._backends.items()):
            try:
                backend.rewind(int(step))
            except Exception as err:  # noqa: BLE001 - a reporting backend must never stop a run
                del self._backends[name]
                _warn_disabled(name, f"rewind to step {step}", err)
                _close_quietly(backend)

    def close(self) -> None:
        """Flush and close every backend; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        backends, self._backends = self._backends, {}
        for name, backend in backends.items():
            try:
                backend.close()
            except Exception as err:  # noqa: BLE001 - a reporting backend must never stop a run
                _warn_disabled(name, "close", err)

    def __enter__(self) -> MetricsReporter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _warn_disabled(name: str, action: str, err: Exception) -> None:
    warnings.warn(
        f"report_to {name!r} failed to {action} and is disabled for this run: {type(err).__name__}: {err}",
        RuntimeWarning,
        stacklevel=3,
    )


def _close_quietly(backend: _Backend) -> None:
    try:
        backend.close()
    except Exception:  # noqa: BLE001 - already disabled and warned about
        pass


def open_reporter(
    report_to: Sequence[str] | str | None,
    log_dir: Path,
    *,
    run_id: str,
    config: dict[str, Any] | None = None,
) -> MetricsReporter | None:
    """A reporter for ``report_to``, or None when it names no backend ("none", None, [], or "all"
    with nothing installed). A string may list several names: ``"tensorboard,wandb"``.

    Raises :class:`~aegis.errors.InvalidConfigError` for an unknown name (the message lists the
    valid ones) or a backend whose package is not installed (the message says what to install).
    """
    names = _resolve(report_to)
    if not names:
        return None
    return MetricsReporter(names, log_dir, run_id=run_id, config=config)
