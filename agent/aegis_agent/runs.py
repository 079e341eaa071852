"""Runs started from a conversation: a thin adapter over `aegis.supervise.Supervisor`.

The supervisor trains in the calling thread until the run completes, stops or pauses for a
human; a chat or Slack front end must keep answering meanwhile, so `RunManager` drives each run
in a background thread (``wait_for_commands_s``: a paused run's process stays up and applies
commands as they arrive) and watches its status, telling listeners when it pauses or ends.
Commands go through ``Supervisor.command`` (the one grammar and validation); a ``resume`` for a
run no process is running (after a restart) starts ``Supervisor.resume`` in a thread.

What a run trains is the plan's, through the one plan -> run translation that `aegis run --plan` uses
(:func:`aegis.supervise.run_config.run_config_from_report`): its model (a local folder as the user named it,
made absolute, or the Hub id) with its weights loaded, on its dataset, with its recommended config and
fallback chain, for the plan's epochs, at the recipe's learning rate — the same RunConfig as the CLI's for
the same plan. A template (``settings.run_template``) adds only what it says about supervision; its
injected faults never reach a user's run; without one the recipe's defaults supervise. The weights must
already be on this machine: `start` refuses with the download command otherwise, and a plan without a
dataset asks for one. The demo (the bundled tiny llama on its data: random weights, byte tokens) runs only when
asked for: ``start(None)`` (no plan), or a run template that itself names a random model to train (a model with
``init: random``, as the demo's, or an inline config): a drill, run as the template says.

    runs = RunManager(AgentSettings(runs_dir="runs"))
    runs.add_listener(lambda notice: print(notice.kind, notice.run_id))
    status = runs.start(report)                       # RunStatusReport once the folder exists
    runs.command(status.run_id, "set_lr 1e-5", source="chat")
"""

from __future__ import annotations

import contextlib
import secrets
import threading
import time
from collections.abc import Callable
from typing import Literal

from aegis.train import compile_cache
from aegis.errors import AegisError, DatasetError, NothingFitsError, RunError
from aegis.schema import Frozen, PlanReport
from aegis.supervise import CommandReceipt, RunConfig, RunStatusReport, Supervisor, parse_run_config
from aegis.supervise.run_config import read_run_yaml, run_config_from_report
from aegis.supervise.runs import list_runs, open_run
from aegis.supervise.status import status_markdown
from pydantic import Field

from aegis_agent.settings import AgentSettings

__all__ = ["RunManager", "RunNotice", "status_markdown"]

_POLL_S = 0.25


class RunNotice(Frozen):
    """A change worth telling a human: the run paused for them, or ended. What the run is at that moment is its
    :class:`~aegis.supervise.status.RunStatusReport` (the one run-state model: step, reason, anomaly, diagnosis,
    suspects, actions, model, data, export), the same that `aegis status` and the chat show; the notice adds only
    what happened and, for a failed run, how its process died."""

    run_id: str
    kind: Literal["paused", "completed", "stopped", "failed"]
    status: RunStatusReport | None = Field(
        default=None, description="The run's status when it happened (None: it failed before its folder existed)."
    )
    error: str | None = Field(default=None, description="How a failed run's process died ('RunError: ...').")


def _new_run_id(prefix: str) -> str:
    return time.strftime(f"{prefix}-%Y%m%d-%H%M%S-") + secrets.token_hex(2)


class RunManager:
    """Start, watch and steer runs in ``settings.runs_dir`` from a front end."""

    def __init__(self, settings: AgentSettings | None = None, *, compile_cache: bool = True) -> None:
        self.settings = settings or AgentSettings()
        self.supervisor = Supervisor(self.settings.runs_dir)
        self._compile_cache = compile_cache
        self._threads: dict[str, threading.Thread] = {}
        self._errors: dict[str, str] = {}
        self._listeners: list[Callable[[RunNotice], None]] = []
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ listeners

    def add_listener(self, fn: Callable[[RunNotice], None]) -> None:
        """Call ``fn(notice)`` (from a background thread) when a run pauses or ends."""
        self._listeners.append(fn)

    def _tell(self, notice: RunNotice) -> None:
        for fn in list(self._listeners):
            with contextlib.suppress(Exception):  # a broken front end must not kill the watcher
                fn(notice)

    # ------------------------------------------------------------------ starting

    def run_config(self, report: PlanReport | None, run_id: str) -> RunConfig:
        """The run's config: the plan's, translated as `aegis run --plan` does, with the template's supervision
        (module docstring); the demo for ``report=None`` or a template naming a random model. DatasetError without
        a dataset, NothingFitsError without a recommended config, PathNotAllowedError for a path the policy
        refuses."""
        template = self._template()
        if report is None or _names_random_model(template):
            if report is None and "model" not in template:
                from aegis.supervise.demo import demo_config

                return parse_run_config({**demo_config().model_dump(mode="json", by_alias=True), "run_id": run_id},
                                        "the demo")
            data = {**template, "run_id": run_id}
            if self.settings.tiers == "plan" and report is not None and report.recommended is not None:
                data["train_config"] = report.recommended.config.model_dump(mode="json")
                data["fallbacks"] = [t.config.model_dump(mode="json") for t in report.fallbacks]
            return parse_run_config(data, "the chat run template")
        return self._planned_config(report, template, run_id)

    def _template(self) -> dict:
        """What ``settings.run_template`` says (relative paths resolved), or nothing."""
        return read_run_yaml(self.settings.run_template) if self.settings.run_template else {}

    def _planned_config(self, report: PlanReport, template: dict, run_id: str) -> RunConfig:
        request = report.request
        if report.recommended is None:
            raise NothingFitsError(f"nothing fits, so there is nothing to run: {report.nothing_fits}")
        self.settings.path_policy.check_request(request)  # as the tools do: a remote user names no other path
        if not request.dataset:
            gpu = request.gpu or report.gpu.id
            raise DatasetError(
                f"the plan names no dataset, so there is nothing to train on: plan it with one "
                f"(`{report.method} {request.model or report.model.model_id} on {gpu} with <data file>`), "
                "then say `start the run`"
            )
        drop = {"model", "data", "faults"}  # the plan names what to train; injected faults: drills and demo only
        if self.settings.tiers != "template":
            drop |= {"train_config", "fallbacks"}
        sections = {k: v for k, v in template.items() if k not in drop}
        sections["run_id"] = run_id
        return run_config_from_report(report, sections, source=f"of the plan for {request.model}")

    def check_weights(self, cfg: RunConfig) -> None:
        """Raise (WeightsNotFoundError: the `hf download …` command) unless ``cfg.model``'s weights are here."""
        if not isinstance(cfg.model, str):
            return  # an inline config: random weights
        from aegis.supervise.engine_handle import resolve_model_input

        resolve_model_input(cfg.model, cfg.init)

    def start(
        self,
        report: PlanReport | None = None,
        *,
        run_id: str | None = None,
        prefix: str = "chat",
        timeout_s: float = 60.0,
    ) -> RunStatusReport:
        """Start a run of ``report`` (None: the demo) in a background thread; its status once its folder exists.

        Nothing starts on an AegisError whose one line says what to do: the weights are not on this machine
        (WeightsNotFoundError with the `hf download …` command), the plan has no dataset, nothing fits, a path
        the policy refuses; RunError if the run failed to start."""
        run_id = run_id or _new_run_id(prefix)
        cfg = self.run_config(report, run_id)
        self.check_weights(cfg)
        self._launch(run_id, lambda: self.supervisor.start(cfg, wait_for_commands_s=self.settings.run_wait_s))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if run_id in self._errors:
                raise RunError(f"run '{run_id}' failed to start: {self._errors[run_id]}")
            with contextlib.suppress(RunError):
                return self.supervisor.status(run_id)
            time.sleep(0.05)
        raise RunError(
            f"run '{run_id}' did not create its folder within {timeout_s:.0f} s; see {self.settings.runs_dir}"
        )

    def _launch(self, run_id: str, body: Callable[[], object]) -> None:
        with self._lock:
            alive = self._threads.get(run_id)
            if alive is not None and alive.is_alive():
                return
            self._errors.pop(run_id, None)

            def work() -> None:
                if self._compile_cache:
                    compile_cache.enable()
                try:
                    body()
                except Exception as err:  # noqa: BLE001 - reported through status and notices, not lost in a thread
                    self._errors[run_id] = f"{type(err).__name__}: {err}"

            thread = threading.Thread(target=work, name=f"aegis-run-{run_id}", daemon=True)
            self._threads[run_id] = thread
            thread.start()
            threading.Thread(
                target=self._watch, args=(run_id, thread), name=f"aegis-watch-{run_id}", daemon=True
            ).start()

    def _watch(self, run_id: str, thread: threading.Thread) -> None:
        paused_at: tuple[int, str] | None = None
        while thread.is_alive():
            with contextlib.suppress(Exception):
                st = self.supervisor.status(run_id)
                key = (st.step, st.pending_reason) if st.pending_reason else None
                if key is not None and key != paused_at:
                    self._tell(self.notice(run_id, "paused"))
                paused_at = key
            thread.join(_POLL_S)
        if run_id in self._errors:
            self._tell(self.notice(run_id, "failed"))
            return
        with contextlib.suppress(Exception):
            st = self.supervisor.status(run_id)
            if st.status in ("completed", "stopped"):
                self._tell(self.notice(run_id, st.status))  # type: ignore[arg-type]

    # ------------------------------------------------------------------ reading and steering

    def notice(self, run_id: str, kind: Literal["paused", "completed", "stopped", "failed"]) -> RunNotice:
        """A notice with the run's status now (and, for a failed run, its error; its status when readable)."""
        error = self._errors.get(run_id) if kind == "failed" else None
        try:
            status = self.supervisor.status(run_id)
        except (AegisError, OSError, ValueError):  # a run that failed before its folder (or config) was written
            if kind != "failed":
                raise
            status = None
        return RunNotice(run_id=run_id, kind=kind, status=status, error=error)

    def status(self, run_id: str) -> RunStatusReport:
        return self.supervisor.status(run_id)

    def error(self, run_id: str) -> str | None:
        """Why the run's thread died, if it did."""
        return self._errors.get(run_id)

    def is_running_here(self, run_id: str) -> bool:
        thread = self._threads.get(run_id)
        return thread is not None and thread.is_alive()

    def command(self, run_id: str, text: str, *, source: str = "chat") -> CommandReceipt:
        """Send a command (CommandError/RunError and no change when rejected); `resume` restarts a run no process runs."""
        receipt = self.supervisor.command(run_id, text, source=source)
        if receipt.command == "resume" and not receipt.live and not self.is_running_here(run_id):
            self._launch(run_id, lambda: self.supervisor.resume(run_id, wait_for_commands_s=self.settings.run_wait_s))
            receipt = receipt.model_copy(update={"live": True})
        return receipt

    def shutdown(self, timeout_s: float = 60.0) -> None:
        """Stop the runs this process drives (each checkpoints and ends at its next step) and wait for them."""
        for run_id, thread in list(self._threads.items()):
            if thread.is_alive():
                with contextlib.suppress(AegisError):
                    self.supervisor.command(run_id, "stop", source="shutdown")
                thread.join(timeout_s)

    def latest_run_id(self) -> str | None:
        """The most recently created run in the runs folder."""
        runs = list_runs(self.settings.runs_dir)
        if not runs:
            return None
        return max(runs, key=lambda r: open_run(self.settings.runs_dir, r).config.stat().st_mtime)

    def wait(self, run_id: str, until: Callable[[RunStatusReport], bool], timeout_s: float) -> RunStatusReport:
        """Poll the run's status until ``until(status)`` holds; RunError after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            st = self.supervisor.status(run_id)
            if until(st):
                return st
            if run_id in self._errors:
                raise RunError(f"run '{run_id}' failed: {self._errors[run_id]}")
            if time.monotonic() > deadline:
                raise RunError(f"run '{run_id}' still {st.status} at step {st.step} after {timeout_s:.0f} s")
            time.sleep(_POLL_S)

    def join(self, run_id: str, timeout_s: float | None = None) -> None:
        """Wait for the run's thread in this process to end."""
        thread = self._threads.get(run_id)
        if thread is not None:
            thread.join(timeout_s)


def _names_random_model(template: dict) -> bool:
    """A template that says which model to train, with random weights (``init: random``, as the demo's, or an
    inline config): settings asking for drills, not for the plan's fine-tune."""
    model = template.get("model")
    return isinstance(model, dict) or (model is not None and template.get("init") == "random")
