"""Run status: a snapshot of a run read from its folder (no JAX, no graph), and its renderings — the one
status every front end shows: a rich table for `aegis status`, Markdown for the chat and Slack run panels.

What the run trains comes from ``<run>/source.json`` (written when the model is resolved: Hub id or folder,
``pretrained``/``random``) or, before that, from its config; where its result went, from the last
``exported`` event (``<run>/export/``: a PEFT adapter or an HF model folder).

    report = build_status(paths)            # RunStatusReport
    console.print(render_status(report))    # table + loss sparkline
    status_markdown(report)                 # chat / Slack bullets
    paused_actions(report.suggested_actions, report.suspected_samples)  # the paused run's buttons, in order
    paused_details(report)                  # the paused panel's anomaly and diagnosis lines (Gradio, Slack)

:class:`RunStatusReport` is the one model of a run's state: `Supervisor.start`/`resume` return it (what
`aegis run` prints at the end), `aegis status` renders it, and the chat, Gradio and Slack read it (a
chat/Slack notice is a :class:`RunStatusReport` with what happened: ``aegis_agent.RunNotice``). Each fact
(state, step, loss, reason, diagnosis, actions) is decided once, here, from the run folder.

A run whose state says it is training but whose process is gone (``kill -9``, a crash, a closed
laptop) shows as ``crashed``, with who ran it and the command that continues it; the sparkline says
which steps it covers ("last 60 of 150 steps, 91–150").
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import Field

from aegis.schema import Frozen
from aegis.supervise.run_config import RunConfig
from aegis.supervise.events import EventLog, read_jsonl
from aegis.supervise.graph import read_state
from aegis.supervise.runs import RunPaths, liveness
from aegis.supervise.state import RunState

__all__ = [
    "MAX_PAUSED_ACTIONS",
    "PausedAction",
    "RunStatusReport",
    "paused_actions",
    "paused_details",
    "build_status",
    "sparkline",
    "sparkline_window",
    "render_status",
    "status_markdown",
    "memory_line",
    "speed_line",
]

_BARS = "▁▂▃▄▅▆▇█"
SPARK_WIDTH = 60
"""Steps drawn by `aegis status`'s loss sparkline (the chat and Slack panels draw 40)."""
SPEED_STEPS = 20
"""Logged steps the speed line summarises (medians: a process's first, compiling step does not move them)."""


class RunStatusReport(Frozen):
    """A run's state read from its folder: what `aegis status`, the end of `aegis run`, the chat, Gradio and
    Slack show (:func:`build_status`)."""

    run_id: str
    run_dir: str
    status: str = Field(
        description="running / paused / stopped / completed, 'starting' before the first node, or 'crashed': "
        "the state says training but no process runs it (killed, crashed); `aegis resume` continues it."
    )
    live: bool = Field(description="A process is running the run right now.")
    process: str | None = Field(
        default=None, description="Who runs (or last ran) it: 'process 4242', with the host when it is another."
    )
    stale: str | None = Field(
        default=None, description="Why a 'crashed' run is not running: its process is gone, the last heartbeat."
    )
    next_action: str | None = Field(
        default=None, description="The command that moves the run on from here (`aegis resume --run-id RUN`)."
    )
    step: int
    total_steps: int
    lr: float | None = None
    grad_clip: float | None = None
    fallback_tier: int = 0
    blacklist: tuple[str, ...] = ()
    domain_weights: dict[str, float] = Field(default_factory=dict)
    pending_reason: str | None = None
    suggested_actions: tuple[str, ...] = ()
    suspected_samples: tuple[str, ...] = Field(
        default=(), description="While waiting for a human: the sample ids the diagnosis blames (else empty)."
    )
    last_anomaly: str | None = None
    diagnosis: str | None = Field(
        default=None,
        description="The last forensics verdict in one line: 'outliers: suspects toxic-0001 (median grad norm 1, "
        "max 40)'.",
    )
    losses: tuple[float, ...] = Field(default=(), description="Loss of the last logged steps, oldest first.")
    loss_steps: tuple[int, ...] = Field(default=(), description="The steps of ``losses`` (same order).")
    steps_logged: int = Field(default=0, description="Steps in metrics.jsonl (``losses`` holds the last of them).")
    checkpoints: tuple[int, ...] = ()
    recent_events: tuple[str, ...] = ()
    model: str | None = Field(
        default=None,
        description="What the run trains: the Hub id or folder of its weights (source.json), else the config's model.",
    )
    data: str | None = Field(default=None, description="The dataset it trains on: a file or a `datasets` id.")
    init: str | None = Field(
        default=None, description="'pretrained' (the model's weights loaded) or 'random' (demo, `init: random`)."
    )
    method: str | None = Field(default=None, description="full, lora or qlora: the tier-0 config's method.")
    export_path: str | None = Field(
        default=None, description="Where the run's PEFT adapter or HF folder was written (last `exported` event)."
    )
    export_kind: str | None = Field(default=None, description="'PEFT adapter' or 'HF model folder' for export_path.")
    compiled_peak_bytes: int | None = Field(
        default=None, description="Peak of the compiled train step (XLA memory analysis) of the current tier."
    )
    planned_peak_bytes: int | None = Field(
        default=None, description="The planner's framework='jax' estimate for the same model and config."
    )
    tokens_per_s: float | None = Field(
        default=None, description=f"Median positions per second of the last {SPEED_STEPS} logged steps (None before one)."
    )
    useful_token_fraction: float | None = Field(
        default=None, description=f"Mean share of the batches' positions holding example tokens, last {SPEED_STEPS} steps."
    )
    loss_token_fraction: float | None = Field(
        default=None, description=f"Mean share of the batches' positions trained on, last {SPEED_STEPS} steps."
    )
    host_wait_s: float | None = Field(
        default=None, description=f"Median host time per step the device waited on, last {SPEED_STEPS} steps."
    )


def sparkline(values: list[float] | tuple[float, ...], width: int = SPARK_WIDTH) -> str:
    """A unicode sparkline of the last ``width`` finite values (NaN/Inf drawn as '!')."""
    vals = list(values)[-width:]
    finite = [v for v in vals if math.isfinite(v)]
    if not finite:
        return "!" * len(vals)
    lo, hi = min(finite), max(finite)
    span = hi - lo or 1.0
    return "".join(
        _BARS[min(len(_BARS) - 1, int((v - lo) / span * (len(_BARS) - 1)))] if math.isfinite(v) else "!" for v in vals
    )


def sparkline_window(report: "RunStatusReport", width: int = SPARK_WIDTH) -> str:
    """Which steps a sparkline of ``width`` covers: 'last 60 of 150 steps, 91–150', or 'all 12 steps, 1–12'."""
    steps = report.loss_steps[-width:]
    if not steps:
        return ""
    total = max(report.steps_logged, len(report.loss_steps))
    span = f"{steps[0]}–{steps[-1]}" if len(steps) > 1 else f"{steps[0]}"
    if len(steps) >= total:
        return f"all {total} step{'s' if total != 1 else ''}, {span}"
    return f"last {len(steps)} of {total} steps, {span}"


def _checkpoint_steps(paths: RunPaths) -> tuple[int, ...]:
    d = paths.checkpoints
    if not d.is_dir():
        return ()
    return tuple(sorted(int(p.name) for p in d.iterdir() if p.name.isdigit()))  # in-progress saves carry a suffix


def _source(paths: RunPaths, cfg: RunConfig) -> dict[str, Any]:
    """model / data / init of the run: source.json once the model was resolved, the config before."""
    try:
        src = json.loads(paths.source.read_text())
    except (OSError, ValueError):
        src = None
    named = cfg.model if isinstance(cfg.model, str) else f"inline {cfg.model.get('model_type', 'model')} config"
    if isinstance(src, dict):
        model = src.get("hub_id") or src.get("folder") or named
        return {"model": model, "data": src.get("data") or cfg.data, "init": src.get("init")}
    random_init = cfg.init == "random" or not isinstance(cfg.model, str)
    return {"model": named, "data": cfg.data, "init": "random" if random_init else "pretrained"}


def _export(events: list[Any]) -> dict[str, Any]:
    last = next((e for e in reversed(events) if e.kind == "exported" and e.data.get("path")), None)
    if last is None:
        return {}
    adapter = last.data.get("method") in ("lora", "qlora") and not last.data.get("merged")
    return {"export_path": str(last.data["path"]), "export_kind": "PEFT adapter" if adapter else "HF model folder"}


def _memory(events: list[Any]) -> dict[str, Any]:
    last = next((e for e in reversed(events) if e.kind == "memory_check" and "compiled_peak_bytes" in e.data), None)
    if last is None:
        return {}
    return {"compiled_peak_bytes": int(last.data["compiled_peak_bytes"]),
            "planned_peak_bytes": int(last.data["planned_peak_bytes"])}


def _gib(n: int) -> str:
    return f"{n / 2**30:.3f} GiB" if n >= 2**26 else f"{n / 2**20:.1f} MiB"


def _speed(records: list[dict[str, Any]]) -> dict[str, Any]:
    """tokens/s, batch fill and host wait of the last `SPEED_STEPS` logged steps (a step's last record wins);
    records from before these fields were logged leave them None."""
    by_step = {r["step"]: r for r in records if isinstance(r.get("step"), int) and "useful_token_fraction" in r}
    last = [by_step[s] for s in sorted(by_step)[-SPEED_STEPS:]]
    if not last:
        return {}

    def median(key: str) -> float:
        values = sorted(float(r.get(key, 0.0)) for r in last)
        mid = len(values) // 2
        return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2

    return {"tokens_per_s": median("tokens_per_s"), "host_wait_s": median("host_wait_s"),
            "useful_token_fraction": sum(float(r["useful_token_fraction"]) for r in last) / len(last),
            "loss_token_fraction": sum(float(r.get("loss_token_fraction", 1.0)) for r in last) / len(last)}


def speed_line(report: RunStatusReport) -> str | None:
    """'1,234 tokens/s; batches 96% tokens (61% trained on); host wait 0.2 ms/step' or None before a step."""
    if report.tokens_per_s is None:
        return None
    return (f"{report.tokens_per_s:,.0f} tokens/s; batches {report.useful_token_fraction:.0%} tokens "
            f"({report.loss_token_fraction:.0%} trained on); host wait {report.host_wait_s * 1e3:.1f} ms/step")


def memory_line(report: RunStatusReport) -> str | None:
    """'compiled step 5.2 MiB, planned 5.6 MiB (+8.9%)' or None before the first build."""
    if report.compiled_peak_bytes is None or report.planned_peak_bytes is None:
        return None
    c, p = report.compiled_peak_bytes, report.planned_peak_bytes
    return f"compiled step {_gib(c)}, planned {_gib(p)} ({(p / c - 1) * 100:+.1f}%)"


def _diagnosis_line(state: RunState) -> str | None:
    """The forensics verdict in one line (None before any diagnosis)."""
    d = state.diagnosis
    if d is None:
        return None
    who = f"suspects {', '.join(d.suspected_samples)}" if d.suspected_samples else "no sample to blame"
    return (
        f"{d.verdict}: {who} (median grad norm {d.outlier_stats.median_grad_norm:.3g}, "
        f"max {d.outlier_stats.max_grad_norm:.3g})"
    )


def _run_state(state: RunState | None, alive: Any, lock_exists: bool, run_id: str) -> dict[str, Any]:
    """status / stale / next_action: the one decision of where a run stands (its saved state and its process)."""
    resume = f"aegis resume --run-id {run_id}"
    if state is None:
        if alive.live or not lock_exists:
            return {"status": "starting"}
        # the process died before the first step: resume starts it again
        return {"status": "crashed", "stale": alive.detail or "no process runs it", "next_action": resume}
    status = "paused" if state.human.pending and state.status == "running" else state.status
    if status == "running" and not alive.live:
        return {"status": "crashed", "stale": alive.detail or "no process runs it", "next_action": resume}
    if status == "paused" and not alive.live:
        return {"status": status, "next_action": resume}
    return {"status": status}


def build_status(paths: RunPaths, loss_points: int = 200) -> RunStatusReport:
    """The status of the run in ``paths`` from its SQLite state, metrics and events."""
    cfg = RunConfig.model_validate_json(paths.config.read_text())
    raw = read_state(paths)
    state = RunState.model_validate(raw) if raw is not None else None
    by_step: dict[int, float] = {}
    records = read_jsonl(paths.metrics)
    for rec in records:
        if isinstance(rec.get("step"), int) and isinstance(rec.get("loss"), (int, float)):
            by_step[rec["step"]] = float(rec["loss"])
    loss_steps = tuple(sorted(by_step))[-loss_points:]
    losses = tuple(by_step[s] for s in loss_steps)
    events = EventLog(paths.events).read()
    alive = liveness(paths)
    recent = tuple(f"{e.kind}@{e.step}" if e.step is not None else e.kind for e in events[-8:])
    common: dict[str, Any] = dict(
        run_id=paths.run_id,
        run_dir=str(paths.root),
        live=alive.live,
        process=alive.owner.describe() if alive.owner is not None else None,
        total_steps=cfg.training.total_steps,
        losses=losses,
        loss_steps=loss_steps,
        steps_logged=len(by_step),
        checkpoints=_checkpoint_steps(paths),
        recent_events=recent,
        method=cfg.tiers[0].method,
        **_source(paths, cfg),
        **_export(events),
        **_memory(events),
        **_speed(records),
    )
    where = _run_state(state, alive, paths.lock.exists(), paths.run_id)
    if state is None:
        return RunStatusReport(step=0, **where, **common)
    return RunStatusReport(
        **where,
        step=state.step,
        lr=state.lr,
        grad_clip=state.grad_clip,
        fallback_tier=state.fallback_tier,
        blacklist=state.blacklist,
        domain_weights=state.domain_weights,
        pending_reason=state.human.reason if state.human.pending else None,
        suggested_actions=state.human.suggested_actions if state.human.pending else (),
        suspected_samples=state.diagnosis.suspected_samples
        if state.human.pending and state.diagnosis is not None else (),
        last_anomaly=state.anomaly.detail if state.anomaly is not None else None,
        diagnosis=_diagnosis_line(state),
        **common,
    )


MAX_PAUSED_ACTIONS = 5
"""Commands a paused run's panel offers at most (the Gradio panel has this many buttons)."""


class PausedAction(Frozen):
    """One command offered for a run waiting for a human: a button in the chat and Slack, a line in `aegis status`."""

    command: str = Field(description="The command text sent to the run, as `aegis command RUN '<command>'` takes it.")
    label: str = Field(description="What a button says: 'Resume', 'Set LR 0.0003', 'Blacklist toxic-0001'.")
    kind: Literal["resume", "stop", "set_lr", "blacklist", "skip_batch", "command"] = Field(
        description="The command's verb (Slack's action id and button style)."
    )


_LABELS = {"resume": "Resume", "stop": "Stop", "set_lr": "Set LR", "blacklist_samples": "Blacklist",
           "skip_batch": "Skip batch"}


def paused_actions(suggested: Sequence[str], suspects: Sequence[str] = ()) -> tuple[PausedAction, ...]:
    """The actions a paused run's panel offers, in order, for CLI, chat and Slack alike: the supervisor's suggested
    commands (:func:`aegis.supervise.repair.suggested_actions`: most likely first), with a blacklist of the
    diagnosis's ``suspects`` second when the supervisor suggested none; ``resume``/``stop`` when it suggested
    nothing. Nothing is invented (no LR the supervisor did not propose); at most :data:`MAX_PAUSED_ACTIONS`."""
    commands = list(dict.fromkeys(" ".join(c.split()) for c in suggested if c.strip())) or ["resume", "stop"]
    if suspects and not any(c.split()[0] == "blacklist_samples" for c in commands):
        commands.insert(1, "blacklist_samples " + " ".join(suspects))
    out = []
    for command in commands[:MAX_PAUSED_ACTIONS]:
        verb, _, rest = command.partition(" ")
        kind = {"blacklist_samples": "blacklist"}.get(verb, verb)
        out.append(PausedAction(
            command=command,
            label=f"{_LABELS[verb]} {rest}".strip() if verb in _LABELS else command,
            kind=kind if kind in ("resume", "stop", "set_lr", "blacklist", "skip_batch") else "command",
        ))
    return tuple(out)


def paused_details(report: RunStatusReport) -> tuple[str, ...]:
    """The paused-run panel's Markdown lines beside its actions: the anomaly and the diagnosis (Gradio's run panel;
    Slack's notice in mrkdwn). Empty unless the run waits for a human."""
    if not report.pending_reason:
        return ()
    return tuple(
        line
        for line in (
            f"**Anomaly:** {report.last_anomaly}" if report.last_anomaly else "",
            f"**Diagnosis:** {report.diagnosis}" if report.diagnosis else "",
        )
        if line
    )


def render_status(report: RunStatusReport) -> Any:
    """A rich renderable: key/value table with a loss sparkline."""
    from rich.table import Table

    t = Table(title=f"run {report.run_id}", show_header=False, title_justify="left")
    t.add_column("field", style="bold")
    t.add_column("value")
    t.add_row("status", _state_line(report))
    if report.next_action:
        t.add_row("continue", report.next_action)
    t.add_row("step", f"{report.step} / {report.total_steps}")
    if report.model:
        t.add_row("model", f"{report.model}{_how(report)}")
    if report.data:
        t.add_row("data", report.data)
    if report.lr is not None:
        t.add_row("lr / clip", f"{report.lr:.3g} / {report.grad_clip:.3g}")
    t.add_row("fallback tier", str(report.fallback_tier))
    if memory_line(report):
        t.add_row("memory", memory_line(report))
    if speed_line(report):
        t.add_row("speed", speed_line(report))
    if report.losses:
        window = sparkline_window(report)
        t.add_row("loss", f"{sparkline(report.losses)}  last {report.losses[-1]:.4g}" + (f" ({window})" if window else ""))
    t.add_row("blacklist", ", ".join(report.blacklist) or "-")
    if report.domain_weights:
        t.add_row("domain mix", ", ".join(f"{d} {w:.2f}" for d, w in report.domain_weights.items()))
    t.add_row("checkpoints", ", ".join(map(str, report.checkpoints)) or "-")
    if report.last_anomaly:
        t.add_row("last anomaly", report.last_anomaly)
    if report.pending_reason:
        t.add_row("waiting for", report.pending_reason)
        actions = paused_actions(report.suggested_actions, report.suspected_samples)
        t.add_row("try", " | ".join(a.command for a in actions))
    t.add_row("recent events", " ".join(report.recent_events) or "-")
    if report.export_path:
        t.add_row("export", f"{report.export_path} ({report.export_kind})")
    t.add_row("folder", report.run_dir)
    return t


def _state_line(report: RunStatusReport) -> str:
    """'running (live, process 4242)', 'crashed: process 4242 that ran it is gone, last heartbeat 2 min ago'."""
    if report.live:
        return f"{report.status} (live{', ' + report.process if report.process else ''})"
    if report.stale:
        return f"{report.status}: {report.stale}"
    return report.status


def _how(report: RunStatusReport) -> str:
    """' (lora)', ' (full, random init)' …: the method, and whether the weights are random."""
    how = ", ".join(x for x in (report.method, "random init" if report.init == "random" else None) if x)
    return f" ({how})" if how else ""


def status_markdown(report: RunStatusReport) -> str:
    """The status as short Markdown bullets (the chat and Gradio run panels; Slack converts it to mrkdwn)."""
    st = report
    lines = [f"**Run `{st.run_id}`**: {_state_line(st)}, step {st.step} / {st.total_steps}"]
    if st.status == "crashed" and st.next_action:
        lines.append(f"- **Not running**: continue it with `{st.next_action}` (or say `resume`)")
    if st.model:
        lines.append(f"- Model `{st.model}`{_how(st)}" + (f" on `{st.data}`" if st.data else ""))
    if st.lr is not None:
        lines.append(f"- LR {st.lr:.3g}, grad clip {st.grad_clip:.3g}, fallback tier {st.fallback_tier}")
    if memory_line(st):
        lines.append(f"- Memory: {memory_line(st)}")
    if speed_line(st):
        lines.append(f"- Speed: {speed_line(st)}")
    if st.losses:
        window = sparkline_window(st, 40)
        lines.append(f"- Loss `{sparkline(st.losses, 40)}` last {st.losses[-1]:.4g}" + (f" ({window})" if window else ""))
    if st.blacklist:
        lines.append(f"- Blacklist: {', '.join(st.blacklist)}")
    if st.last_anomaly:
        lines.append(f"- Last anomaly: {st.last_anomaly}")
    if st.export_path:
        lines.append(f"- Export ({st.export_kind}): `{st.export_path}`")
    if st.pending_reason:
        lines.append(f"- **Waiting for you**: {st.pending_reason}")
        actions = paused_actions(st.suggested_actions, st.suspected_samples)
        lines.append("- Try: " + " | ".join(f"`{a.command}`" for a in actions))
    return "\n".join(lines)
