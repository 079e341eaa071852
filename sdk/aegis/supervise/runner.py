"""Supervisor: start, resume, steer and inspect supervised training runs (the Python API behind the CLI).

    from aegis.supervise import Supervisor, load_run_config
    sup = Supervisor("runs")
    out = sup.start(load_run_config("run.yaml"))      # RunStatusReport: completed, or paused for a human
    sup.command(out.run_id, "set_lr 1e-5")            # validated, queued, logged (any process)
    out = sup.resume(out.run_id)                      # continues from the last checkpoint
    sup.status(out.run_id)                            # RunStatusReport

A run is a folder (see :mod:`aegis.supervise.runs`). Everything needed to continue — graph
state in SQLite, Orbax checkpoints, the command inbox and the event log — is on disk, so a run
killed at any moment resumes with its blacklist, curriculum, LR and events.
"""

from __future__ import annotations

import json
import secrets
import shutil
import time
from collections import Counter
from pathlib import Path
from typing import Any

from pydantic import Field

from aegis.errors import InvalidConfigError, RunError
from aegis.schema import Frozen
from aegis.supervise.commands import parse_command, validate_command
from aegis.supervise.run_config import RunConfig
from aegis.supervise.context import RunCallbacks, RunContext
from aegis.supervise.curriculum import initial_weights
from aegis.supervise.events import EventLog, append_jsonl, read_jsonl
from aegis.supervise.graph import open_graph, read_state, thread_config
from aegis.supervise.nodes import dump
from aegis.supervise.runs import RunPaths, is_live, open_run, run_lock, write_json_atomic
from aegis.supervise.state import RunState
from aegis.supervise.status import RunStatusReport, build_status

__all__ = ["CommandReceipt", "Supervisor"]


class CommandReceipt(Frozen):
    """A command accepted for a run."""

    run_id: str
    command: str = Field(description="Canonical text of the command.")
    queued: bool = Field(
        description="False for `status` (answered at once) and for `resume` of a run whose process died "
        "(nothing to queue: `aegis resume` restarts it)."
    )
    live: bool = Field(description="A process is running the run and will apply it at the next step/window.")
    status: RunStatusReport | None = None


def _new_run_id() -> str:
    return time.strftime("run-%Y%m%d-%H%M%S-") + secrets.token_hex(2)


class Supervisor:
    """Runs live in ``runs_dir/<run_id>/``."""

    def __init__(self, runs_dir: str | Path = "runs") -> None:
        self.runs_dir = Path(runs_dir)

    # ------------------------------------------------------------------ lifecycle

    def start(
        self,
        cfg: RunConfig,
        *,
        callbacks: RunCallbacks | None = None,
        wait_for_commands_s: float | None = None,
    ) -> RunStatusReport:
        """Create the run folder and train until completion, a stop, or a human review; the run's status then
        (:func:`aegis.supervise.status.build_status`, read once this process let go of the run)."""
        run_id = cfg.run_id or _new_run_id()
        paths = RunPaths(self.runs_dir / run_id)
        if paths.exists():
            raise RunError(f"run '{run_id}' already exists in {self.runs_dir}; continue it with `aegis resume --run-id {run_id}`")
        cfg = cfg.model_copy(update={"run_id": run_id})
        created = not paths.root.exists()
        try:
            with run_lock(paths):  # taken before config.json exists: `aegis status` never sees a lockless new run
                ctx = RunContext(cfg, paths, callbacks)
                self._begin(ctx, wait_for_commands_s)
        except BaseException:
            if created and not paths.config.exists():  # refused before it began: leave no half folder behind
                shutil.rmtree(paths.root, ignore_errors=True)
            raise
        return build_status(paths)

    def _begin(self, ctx: RunContext, wait_for_commands_s: float | None) -> None:
        """Check the config against the model and this machine, write the run's files and train from step 0."""
        cfg, paths = ctx.cfg, ctx.paths
        from aegis.supervise.engine_handle import check_feasible

        check_feasible(cfg, ctx.model_config)
        counts = Counter(ex.domain for ex in ctx.examples)
        unknown = sorted(set(cfg.curriculum.weights) - set(counts))
        if unknown:
            raise InvalidConfigError(f"curriculum.weights names unknown domain(s) {unknown}; the data has {sorted(counts)}")
        write_json_atomic(paths.config, cfg.model_dump(mode="json", by_alias=True))
        ctx.write_samples_manifest()
        state = RunState.new(
            paths.run_id,
            lr=cfg.training.lr,
            grad_clip=cfg.training.grad_clip,
            weights=initial_weights(dict(counts), cfg.curriculum),
        )
        ctx.event("run_started", 0, tiers=len(cfg.tiers), total_steps=cfg.training.total_steps, samples=len(ctx.examples))
        self._drive(ctx, dump(state), wait_for_commands_s)

    def resume(
        self,
        run_id: str,
        *,
        callbacks: RunCallbacks | None = None,
        wait_for_commands_s: float | None = None,
    ) -> RunStatusReport:
        """Continue a run from its persisted state: after a crash, or after a human review (implies `resume`).
        A run whose process died before its first step starts again from step 0. Its status when it returns."""
        paths = open_run(self.runs_dir, run_id)
        with run_lock(paths):
            ctx = RunContext(self._config(paths), paths, callbacks)
            raw = read_state(paths)
            if raw is None:
                ctx.event("process_resumed", 0, restarted=True)
                self._begin(ctx, wait_for_commands_s)
            else:
                ctx.event("process_resumed", raw.get("step"))
                self._drive(ctx, None, wait_for_commands_s, implicit_resume=True)
        return build_status(paths)

    def _drive(
        self, ctx: RunContext, initial: Any, wait_for_commands_s: float | None, implicit_resume: bool = False
    ) -> None:
        from langgraph.types import Command

        tc = thread_config(ctx.paths.run_id)
        try:
            with open_graph(ctx) as app:  # the caller holds the run's lock
                snap = app.get_state(tc)
                if initial is None and _interrupted(snap):
                    app.invoke(Command(resume={"resume": implicit_resume}), tc)
                elif initial is None and not snap.next:
                    run = (snap.values or {}).get("run") or {}
                    if run.get("status") not in ("completed", "stopped") and any(t.result is not None for t in snap.tasks):
                        app.invoke(None, tc)  # killed between a node's result and the next checkpoint: go on from it
                    # else finished (completed or stopped): nothing to run
                else:
                    app.invoke(initial, tc)
                while wait_for_commands_s is not None and _interrupted(app.get_state(tc)):
                    offset = RunState.model_validate(app.get_state(tc).values["run"]).inbox_offset
                    from aegis.train.distributed import is_primary, share

                    got = self._wait_inbox(ctx.paths, offset, wait_for_commands_s) if is_primary() else False
                    if not share("commands arrived", got):  # the others wait for process 0's inbox
                        break
                    app.invoke(Command(resume={"resume": False}), tc)
        finally:
            ctx.close()

    @staticmethod
    def _wait_inbox(paths: RunPaths, offset: int, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if len(read_jsonl(paths.inbox)) > offset:
                return True
            time.sleep(0.2)
        return False

    # ------------------------------------------------------------------ steering

    def command(self, run_id: str, text: str, *, source: str = "cli") -> CommandReceipt:
        """Validate a command and queue it for the run (CommandError and no change if rejected)."""
        paths = open_run(self.runs_dir, run_id)
        cmd = parse_command(text)
        raw = read_state(paths)
        state = RunState.model_validate(raw) if raw is not None else None
        known = set(json.loads(paths.samples.read_text())["ids"]) if paths.samples.exists() else None
        live = is_live(paths)
        died = not live and (state is None or (state.status == "running" and not state.human.pending))
        if not (cmd.name == "resume" and died):  # `resume` of a run whose process died restarts it
            validate_command(cmd, state, known)
        step = state.step if state is not None else None
        if cmd.name == "status":
            EventLog(paths.events).append("command", step, command=cmd.text, source=source)
            return CommandReceipt(run_id=run_id, command=cmd.text, queued=False, live=live, status=build_status(paths))
        if cmd.name == "resume" and died:  # nothing to apply in the run: whoever resumes it restarts its process
            EventLog(paths.events).append("command", step, command=cmd.text, source=source)
            return CommandReceipt(run_id=run_id, command=cmd.text, queued=False, live=False)
        append_jsonl(paths.inbox, {"text": cmd.text, "time": time.time(), "source": source})
        EventLog(paths.events).append("command", step, command=cmd.text, source=source)
        return CommandReceipt(run_id=run_id, command=cmd.text, queued=True, live=live)

    def interrupt(self, run_id: str, *, source: str = "cli") -> CommandReceipt:
        """Ask the run to pause for a human review at its next step."""
        return self.command(run_id, "interrupt", source=source)

    def export(
        self, run_id: str, out: str | Path | None = None, *, merge: bool = False, step: int | None = None,
        overwrite: bool = False,
    ) -> Path:
        """Write the run's model at its newest checkpoint (at or below ``step``) for transformers/PEFT:
        a PEFT adapter folder (LoRA/QLoRA), a full HF folder (full fine-tuning, or ``merge``). An ``out``
        holding files Aegis did not write is refused unless ``overwrite`` (:mod:`aegis._outdir`)."""
        paths = open_run(self.runs_dir, run_id)
        raw = read_state(paths)
        if raw is None:
            raise RunError(f"run '{run_id}' has no checkpoint yet; export it once it has trained")
        state = RunState.model_validate(raw)
        ctx = RunContext(self._config(paths), paths)
        try:
            target = Path(out) if out is not None else paths.export
            return Path(ctx.export_model(state, target, merge=merge, step=step if step is not None else state.step,
                                         overwrite=overwrite or out is None))
        finally:
            ctx.close()

    # ------------------------------------------------------------------ reading

    def status(self, run_id: str) -> RunStatusReport:
        return build_status(open_run(self.runs_dir, run_id))

    def state(self, run_id: str) -> RunState | None:
        raw = read_state(open_run(self.runs_dir, run_id))
        return RunState.model_validate(raw) if raw is not None else None

    def events(self, run_id: str) -> list[Any]:
        return EventLog(open_run(self.runs_dir, run_id).events).read()

    @staticmethod
    def _config(paths: RunPaths) -> RunConfig:
        try:
            return RunConfig.model_validate_json(paths.config.read_text())
        except ValueError as err:
            raise RunError(f"run '{paths.run_id}' has an unreadable config.json ({err}); start a new run") from err


def _interrupted(snap: Any) -> bool:
    return any(task.interrupts for task in snap.tasks)
