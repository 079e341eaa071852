"""CLI of supervised runs: ``aegis run``, ``resume``, ``status``, ``interrupt``, ``command``.

Mount on the main app with ``register(app)`` (adds the five commands at top level), or use
``app`` here directly (tests drive it with typer's ``CliRunner``). Errors Aegis raises on purpose
print one line and exit 2; a run paused for a human exits 3.

    aegis run --demo
    aegis run --config run.yaml [--plan plan.json]
    aegis status --run-id demo-...
    aegis command demo-... "set_lr 1e-5"
    aegis resume --run-id demo-...
    aegis launch --nproc 2 --cpu-devices 2 -- run --config run.yaml --run-id r1   # N local processes, one run
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import typer

from aegis.train import compile_cache
from aegis.errors import AegisError, InvalidConfigError

__all__ = ["app", "register", "main"]

RUNS_DIR_ENV = "AEGIS_RUNS_DIR"

_RunsDir = typer.Option("runs", "--runs-dir", envvar=RUNS_DIR_ENV, help="Folder holding the run folders.")
_RunId = typer.Option(..., "--run-id", help="Id of the run (its folder name under --runs-dir).")


_Coordinator = typer.Option(
    None, "--coordinator", help="HOST:PORT of process 0, for a multi-process run (with --num-processes, --process-id)."
)
_NumProcesses = typer.Option(None, "--num-processes", min=1, help="Processes of a multi-process run.")
_ProcessId = typer.Option(None, "--process-id", min=0, help="This process's index (0 writes the run's files).")


def _join(
    coordinator: str | None, num_processes: int | None, process_id: int | None, runs_dir: str, run_id: str | None,
    *, resuming: bool,
) -> str:
    """Join a multi-process run (before anything touches JAX) and return the runs folder this process keeps: the
    given one on process 0; on the others ``<run>/processes/<i>``, for their supervisor's bookkeeping and events (a
    resume starts from a copy of the primary's run folder, taken while process 0 waits for everyone to join), their
    checkpoint shards going to process 0's run. Starts the watchdog that ends this process with one line when
    another is lost (:mod:`aegis.train.watchdog`). No flags: the SLURM / Open MPI job's tasks
    (:func:`aegis.train.distributed.detect_cluster`), else a one-process run, ``runs_dir``."""
    from aegis.train.distributed import check_flags, detect_cluster, follower_of, initialize, share

    if not check_flags(coordinator, num_processes, process_id):
        cluster = detect_cluster()  # no flags: a SLURM or Open MPI job of several tasks says who is who
        if cluster is None:
            return runs_dir
        coordinator, num_processes, process_id = cluster
    if run_id is None:
        raise InvalidConfigError("a multi-process run needs the same --run-id (or run_id in the config) on every process")
    assert coordinator is not None and num_processes is not None and process_id is not None
    import secrets
    import shutil

    from aegis.train.watchdog import Watchdog

    run_root = Path(runs_dir).absolute() / run_id
    own = runs_dir
    if process_id > 0:
        own = str(run_root / "processes" / str(process_id))
        mine = Path(own) / run_id
        events = mine / "events.jsonl"
        kept = events.read_bytes() if resuming and events.is_file() else None
        shutil.rmtree(mine, ignore_errors=True)
        if resuming and (run_root / "config.json").is_file():
            shutil.copytree(run_root, mine, ignore=shutil.ignore_patterns(
                "checkpoints", "export", "processes", "*.lock", "lock"))
            if kept is not None:  # this process's own event log goes on where it stopped
                (mine / "events.jsonl").write_bytes(kept)
    initialize(coordinator, num_processes, process_id)
    if process_id > 0:
        follower_of(run_root)
    session = share("session", secrets.token_hex(8))
    again = (f"resume all {num_processes} processes: `aegis resume --run-id {run_id} --coordinator {coordinator} "
             f"--num-processes {num_processes} --process-id I`")
    Watchdog(run_root / "processes", process_id, num_processes, session, resume_hint=again).start()
    return own


def _multi_failed(err: BaseException) -> None:
    """In a multi-process run, an error caused by a lost peer (a collective that broke) is that peer's one line."""
    from aegis.train.watchdog import current, lost_peer

    dog = current()
    if dog is None or isinstance(err, (typer.Exit, KeyboardInterrupt)):
        return
    reason = lost_peer()
    if reason is not None:
        dog.die(reason)
    dog.exit(1, f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"[:300])


def _ended(code: int, reason: str | None = None) -> None:
    """Tell the other processes of a multi-process run how this one ends (a clean end is no loss for them)."""
    from aegis.train.watchdog import current

    dog = current()
    if dog is not None:
        dog.exit(code, reason)


def _fail(err: AegisError) -> None:
    from aegis.train.watchdog import current, lost_peer

    if current() is not None and (reason := lost_peer(wait_s=0)) is not None:
        current().die(reason)  # type: ignore[union-attr]  # the error is the lost peer's doing: say so
    _ended(2, str(err))
    typer.echo(f"error: {err}", err=True)
    raise typer.Exit(2)


def _check_run_folder(runs_dir: str, run_id: str) -> None:
    """The run folder's own files readable as what they are (JSON files JSON text, JSONL files UTF-8 up to their last
    line, supervisor.sqlite a SQLite database): a RunError naming the damaged file before a command reads it (an
    unknown or malformed run id is left to the Supervisor's own one-line error)."""
    import json

    from aegis.errors import RunError

    if not run_id or any(c in run_id for c in "/\\\0") or run_id in (".", ".."):
        return
    root = Path(runs_dir) / run_id
    try:
        if not root.is_dir():
            return
    except OSError:
        return

    def damaged(name: str, why: str) -> RunError:
        return RunError(f"run '{run_id}' has a damaged {name} ({why}) in {root}: restore the file, or start the run "
                        "again with `aegis run`")

    for name in ("config.json", "blacklist.json", "source.json"):
        path = root / name
        if path.is_file():
            try:
                json.loads(path.read_bytes().decode("utf-8"))
            except UnicodeDecodeError as err:
                raise damaged(name, f"not UTF-8 text at byte {err.start}") from None
            except ValueError as err:
                raise damaged(name, f"not JSON: {err}") from None
    for name in ("events.jsonl", "metrics.jsonl", "inbox.jsonl"):
        path = root / name
        if path.is_file():
            data = path.read_bytes()
            try:  # a last line cut by a kill is the reader's to skip
                data[:data.rfind(b"\n") + 1].decode("utf-8")
            except UnicodeDecodeError as err:
                raise damaged(name, f"not UTF-8 text at byte {err.start}") from None
    db = root / "supervisor.sqlite"
    if db.is_file() and db.stat().st_size:
        with db.open("rb") as fh:
            if fh.read(16) != b"SQLite format 3\x00":
                raise damaged("supervisor.sqlite", "not a SQLite database")


def _describe(kind: str, step: int | None, data: dict[str, Any]) -> str | None:
    at = f"step {step}" if step is not None else ""
    if kind == "anomaly":
        return f"[red]anomaly[/] {at}: {data.get('detail')}"
    if kind == "diagnosis":
        ids = data.get("suspected_samples") or []
        who = f"suspects {', '.join(ids)}" if ids else "no sample to blame"
        return (
            f"[yellow]diagnosis[/] {at}: {data.get('verdict')} — {who} (median grad norm "
            f"{data.get('median_grad_norm', float('nan')):.3g}, max {data.get('max_grad_norm', float('nan')):.3g})"
        )
    if kind == "repair":
        return f"[green]repair[/] {at}: {data.get('strategy')} — {data.get('reason')}"
    if kind == "rollback":
        return f"[cyan]rollback[/] to checkpoint {step}"
    if kind == "data_warning":
        return f"[yellow]data[/]: {data.get('message')}"
    if kind == "mesh":
        return (
            f"[bold]mesh[/] data {data['data']} x fsdp {data['fsdp']} x tensor {data['tensor']}: global batch "
            f"{data['global_batch_size']} (micro {data['micro_batch_size']} x {data['data'] * data['fsdp']} ranks "
            f"x {data['accumulation']} accumulation)"
        )
    if kind == "fault_injected":
        return f"[magenta]fault injected[/] {at}: {data.get('fault')}"
    if kind == "curriculum" and data.get("degraded"):
        return f"[blue]curriculum[/] {at}: raised weight of {', '.join(data['degraded'])}"
    if kind in ("checkpoint_corrupt", "notify_failed", "command_applied", "command_skipped", "escalated", "stopped"):
        detail = data.get("reason") or data.get("command") or data.get("error") or ""
        return f"[bold]{kind.replace('_', ' ')}[/] {at}: {detail}"
    return None


class _Live:
    """Progress bar per window plus one line per notable event."""

    def __init__(self, quiet: bool) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        self.console = Console()
        self.quiet = quiet
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("step {task.completed:.0f}/{task.total:.0f}"),
            TextColumn("loss {task.fields[loss]}"),
            TextColumn("{task.fields[tps]} tok/s"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=self.console,
            disable=quiet,
        )
        self.task: Any = None
        self.offset = 0

    def callbacks(self) -> Any:
        from aegis.supervise.context import RunCallbacks

        return RunCallbacks(
            on_window=self.on_window, on_step=self.on_step, on_event=self.on_event, on_progress=self.on_progress
        )

    def on_progress(self, what: str, done: int, total: int) -> None:
        """Loading weights (bytes) and tokenising the dataset (rows): one bar each, removed when done."""
        bars = self.__dict__.setdefault("_bars", {})
        if what not in bars:
            label = "loading weights" if what == "weights" else "tokenising rows"
            bars[what] = self.progress.add_task(label, total=max(total, 1), completed=0, loss="-", tps="-")
        self.progress.update(bars[what], completed=done, total=max(total, 1))
        if done >= total:
            self.progress.remove_task(bars.pop(what))

    def on_window(self, start: int, target: int) -> None:
        if self.task is not None:
            self.progress.remove_task(self.task)
        self.offset = start
        self.task = self.progress.add_task(f"window {start}→{target}", total=target, completed=start, loss="-", tps="-")

    def on_step(self, m: Any) -> None:
        if self.task is not None:
            self.progress.update(self.task, completed=m.step, loss=f"{m.loss:.4g}", tps=f"{m.tokens_per_s:,.0f}")

    def on_event(self, kind: str, step: int | None, data: dict[str, Any]) -> None:
        line = _describe(kind, step, data)
        if line and not self.quiet:
            self.progress.console.print(line)


def _report(outcome: Any, console: Any) -> None:
    """The end of `aegis run`/`resume`: the run's RunStatusReport; a paused run's actions are the paused-run
    panel's (:func:`aegis.supervise.status.paused_actions`, as `aegis status`, the chat and Slack offer)."""
    from aegis.supervise.status import paused_actions

    if outcome.status == "paused":
        console.print(f"[bold yellow]paused[/] at step {outcome.step}: {outcome.pending_reason}")
        for action in paused_actions(outcome.suggested_actions, outcome.suspected_samples):
            console.print(f"  aegis command {outcome.run_id} \"{action.command}\"")
        console.print(f"then: aegis resume --run-id {outcome.run_id}")
        raise typer.Exit(3)
    console.print(
        f"[bold]{outcome.status}[/] run {outcome.run_id} at step {outcome.step} "
        f"(lr {outcome.lr:.3g}, tier {outcome.fallback_tier}, blacklist: {', '.join(outcome.blacklist) or '-'})"
    )
    console.print(f"folder: {outcome.run_dir}")
    for line in _data_summary(Path(outcome.run_dir)):
        console.print(line, markup=False)


def _data_summary(run_dir: Path) -> list[str]:
    """What the run's data loading found (its last ``data_loaded`` event and the warnings after it)."""
    from aegis.supervise.events import read_jsonl

    events = read_jsonl(run_dir / "events.jsonl")
    at = max((i for i, e in enumerate(events) if e.get("kind") == "data_loaded"), default=None)
    if at is None:
        return []
    d = events[at].get("data", {})
    out = [f"data: {d.get('examples', 0):,} examples trained from {d.get('rows', 0):,} rows of {d.get('source')}"]
    return out + [f"  {e['data'].get('message')}" for e in events[at + 1:] if e.get("kind") == "data_warning"]


def run(
    config: Path = typer.Option(None, "--config", "-c", help="YAML run config (spec §10.3 keys)."),
    plan: Path = typer.Option(None, "--plan", help="Plan JSON: its recommended config and fallback chain."),
    demo: bool = typer.Option(False, "--demo", help="Tiny model on bundled data with a toxic sample and a spike."),
    run_id: str = typer.Option(None, "--run-id", help="Name of the run folder (default: generated)."),
    runs_dir: str = _RunsDir,
    wait: float = typer.Option(None, "--wait", min=0, max=7 * 24 * 3600,
                               help="When paused, wait this many seconds for commands (at most a week)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar or event lines."),
    coordinator: str = _Coordinator,
    num_processes: int = _NumProcesses,
    process_id: int = _ProcessId,
) -> None:
    """Train under the self-healing supervisor."""
    try:
        cfg = run_config(config, plan, demo, run_id)
        from aegis.supervise.runner import Supervisor

        own_runs = _join(coordinator, num_processes, process_id, runs_dir, cfg.run_id, resuming=False)
        compile_cache.enable()
        live = _Live(quiet)
        with live.progress:
            outcome = Supervisor(own_runs).start(cfg, callbacks=live.callbacks(), wait_for_commands_s=wait)
    except AegisError as err:
        _fail(err)
    except Exception as err:
        _multi_failed(err)
        raise
    _ended(3 if outcome.status == "paused" else 0)
    _report(outcome, live.console)


def run_config(config: Path | None, plan: Path | None, demo: bool = False, run_id: str | None = None) -> Any:
    """The RunConfig `aegis run` trains: the demo (explicitly), a plan through the one plan -> run translation
    (``--config`` adds supervision sections and overrides; the plan's tiers stay), or a YAML run config."""
    from aegis.supervise.run_config import load_run_config, parse_run_config, read_run_yaml, run_config_from_plan

    if demo:
        from aegis.supervise.demo import demo_config

        cfg = demo_config()
        run_id = run_id or time.strftime("demo-%Y%m%d-%H%M%S")
    elif plan is not None:
        overrides = read_run_yaml(config) if config else {}  # only what the YAML says
        overrides.pop("train_config", None)
        overrides.pop("fallbacks", None)
        cfg = run_config_from_plan(plan, overrides, source=f"{config} with plan {plan}" if config else None)
    elif config is not None:
        cfg = load_run_config(config)
    else:
        raise typer.BadParameter("pass --config run.yaml, --plan plan.json or --demo")
    if run_id is not None:
        cfg = parse_run_config({**cfg.model_dump(mode="json", by_alias=True), "run_id": run_id}, "--run-id")
    return cfg


def resume(
    run_id: str = _RunId,
    runs_dir: str = _RunsDir,
    wait: float = typer.Option(None, "--wait", min=0, max=7 * 24 * 3600,
                               help="When paused, wait this many seconds for commands (at most a week)."),
    quiet: bool = typer.Option(False, "--quiet", "-q"),
    coordinator: str = _Coordinator,
    num_processes: int = _NumProcesses,
    process_id: int = _ProcessId,
) -> None:
    """Continue a run from its last checkpoint (after a crash, or after a human review)."""
    from aegis.supervise.runner import Supervisor

    try:
        _check_run_folder(runs_dir, run_id)
        sup = Supervisor(_join(coordinator, num_processes, process_id, runs_dir, run_id, resuming=True))
        sup.status(run_id)  # unknown run id -> one-line error before anything heavy
        compile_cache.enable()
        live = _Live(quiet)
        with live.progress:
            outcome = sup.resume(run_id, callbacks=live.callbacks(), wait_for_commands_s=wait)
    except AegisError as err:
        _fail(err)
    except Exception as err:
        _multi_failed(err)
        raise
    _ended(3 if outcome.status == "paused" else 0)
    _report(outcome, live.console)


def status(run_id: str = _RunId, runs_dir: str = _RunsDir) -> None:
    """Show a run: state, loss sparkline, blacklist, checkpoints, what it waits for."""
    from rich.console import Console

    from aegis.supervise.runner import Supervisor
    from aegis.supervise.status import render_status

    try:
        _check_run_folder(runs_dir, run_id)
        report = Supervisor(runs_dir).status(run_id)
    except AegisError as err:
        _fail(err)
    Console().print(render_status(report))
    from aegis.supervise.launch import mesh_lines

    for line in mesh_lines(report.run_dir):  # several devices or processes: the mesh, each process, its memory
        typer.echo(line)


def interrupt(run_id: str = _RunId, runs_dir: str = _RunsDir) -> None:
    """Ask a run to pause for a human review at its next step."""
    from aegis.supervise.runner import Supervisor

    try:
        _check_run_folder(runs_dir, run_id)
        receipt = Supervisor(runs_dir).interrupt(run_id)
    except AegisError as err:
        _fail(err)
    where = "the live run pauses at its next step" if receipt.live else f"applies on `aegis resume --run-id {run_id}`"
    typer.echo(f"interrupt queued for {run_id}: {where}")


def command(
    run_id: str = typer.Argument(..., help="Run id."),
    text: str = typer.Argument(..., help='Command, e.g. "set_lr 1e-5" or "blacklist_samples id1 id2".'),
    runs_dir: str = _RunsDir,
) -> None:
    """Send a command: resume | stop | set_lr <v> | skip_batch | blacklist_samples <ids…> | status | interrupt."""
    from rich.console import Console

    from aegis.supervise.runner import Supervisor
    from aegis.supervise.status import render_status

    try:
        _check_run_folder(runs_dir, run_id)
        receipt = Supervisor(runs_dir).command(run_id, text)
    except AegisError as err:
        _fail(err)
    if receipt.status is not None:
        Console().print(render_status(receipt.status))
        return
    where = "the live run applies it next" if receipt.live else f"applies on `aegis resume --run-id {run_id}`"
    typer.echo(f"queued '{receipt.command}' for {run_id}: {where}")


def export(
    run_id: str = typer.Argument(..., help="Run id."),
    out: Path = typer.Argument(None, help="Output folder (default: <runs_dir>/<run>/export)."),
    merge: bool = typer.Option(False, "--merge", help="Fold LoRA adapters into the base: a full HF model folder."),
    step: int = typer.Option(None, "--step", help="Newest checkpoint at or below this step (default: the run's step)."),
    overwrite: bool = typer.Option(
        False, "--overwrite", help="Write into OUT even if it holds other files (same names replaced, others kept)."),
    runs_dir: str = _RunsDir,
) -> None:
    """Export a run's checkpoint for transformers/PEFT: a PEFT adapter folder, or an HF model folder."""
    from aegis._outdir import check_output_dir
    from aegis.supervise.runner import Supervisor
    from aegis.supervise.runs import open_run

    try:
        paths = open_run(runs_dir, run_id)
        target = Path(out) if out is not None else paths.export
        _check_export_target(paths, target)
        check_output_dir(target, overwrite=overwrite or out is None)  # before the model is built
        if step is not None:
            _check_export_step(paths, step)
        _check_run_folder(runs_dir, run_id)
        path = Supervisor(runs_dir).export(run_id, out, merge=merge, step=step, overwrite=overwrite)
    except AegisError as err:
        _fail(err)
    from aegis.supervise.events import EventLog

    kind = "HF model folder" if merge or (path / "config.json").is_file() else "PEFT adapter"
    done = [e for e in EventLog(paths.events).read() if e.kind == "exported"]
    at = f" at step {done[-1].step}" if done and done[-1].step is not None else ""
    typer.echo(f"exported {run_id}{at} to {path} ({kind})")


def _checkpoint_steps(paths: Any) -> list[int]:
    """The steps of a run's saved checkpoints (Orbax's step folders), without opening Orbax."""
    folder = paths.checkpoints
    if not folder.is_dir():
        return []
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit() and p.is_dir())


def _check_export_step(paths: Any, step: int) -> None:
    from aegis.errors import CheckpointError

    steps = _checkpoint_steps(paths)
    if not steps:
        raise CheckpointError(f"run '{paths.run_id}' has no checkpoint to export yet; export it once it has saved one")
    if step < steps[0]:
        listing = ", ".join(str(s) for s in steps)
        raise CheckpointError(
            f"--step {step}: run '{paths.run_id}' has no checkpoint at or below step {step}; its checkpoints are "
            f"at steps {listing} (pass one of them, or leave out --step for the run's newest)"
        )


def _check_export_target(paths: Any, target: Path) -> None:
    """The run's own folder and its checkpoints are never export targets (an HF config.json would replace the run's)."""
    from aegis.errors import OutputPathError

    where = Path(os.path.abspath(target.expanduser()))
    root = Path(os.path.abspath(paths.root))
    if where == root or where == root / "checkpoints" or root / "checkpoints" in where.parents:
        raise OutputPathError(f"{target} is the run's own folder; export to another folder "
                              f"(default: {paths.export})")


def launch(
    args: list[str] = typer.Argument(..., help="The `run` or `resume` command of every process, after `--`."),
    nproc: int = typer.Option(..., "--nproc", min=1, help="Processes to start on this host."),
    cpu_devices: int = typer.Option(None, "--cpu-devices", min=1,
                                    help="Run on the CPU with this many forced host devices per process (tests)."),
    port: int = typer.Option(None, "--port", min=1, max=65535, help="Coordinator port (default: a free one)."),
) -> None:
    """Start N local processes of one multi-process run: aegis launch --nproc 2 -- run --config run.yaml --run-id r1."""
    from aegis.supervise.launch import launch as start

    try:
        result = start(args, nproc, port=port, cpu_devices=cpu_devices)
    except AegisError as err:
        _fail(err)
    if result.failed is not None:
        typer.echo(f"error: process {result.failed} of {nproc} failed: {result.reason}", err=True)
    raise typer.Exit(result.exit_code)


_COMMANDS = {"run": run, "resume": resume, "status": status, "interrupt": interrupt, "command": command, "export": export,
             "launch": launch}


def register(parent: typer.Typer) -> None:
    """Add run / resume / status / interrupt / command / export to ``parent`` (the main `aegis` app)."""
    for name, fn in _COMMANDS.items():
        parent.command(name)(fn)


app = typer.Typer(help="Supervised, self-healing training runs.", no_args_is_help=True, add_completion=False)
register(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
