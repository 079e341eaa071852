"""Run status: a snapshot of a run read from its folder (no JAX, no graph), and its rich rendering.

    report = build_status(paths)            # RunStatusReport
    console.print(render_status(report))    # table + loss sparkline
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import Field

from aegis.schema import Frozen
from aegis.supervise.config import RunConfig
from aegis.supervise.events import EventLog, read_jsonl
from aegis.supervise.graph import read_state
from aegis.supervise.runs import RunPaths, is_live
from aegis.supervise.state import RunState

__all__ = ["RunStatusReport", "build_status", "sparkline", "render_status"]

_BARS = "▁▂▃▄▅▆▇█"


class RunStatusReport(Frozen):
    """What `aegis status` shows."""

    run_id: str
    run_dir: str
    status: str = Field(description="running / paused / stopped / completed, or 'starting' before the first node.")
    live: bool = Field(description="A process is running the run right now.")
    step: int
    total_steps: int
    lr: float | None = None
    grad_clip: float | None = None
    fallback_tier: int = 0
    blacklist: tuple[str, ...] = ()
    domain_weights: dict[str, float] = Field(default_factory=dict)
    pending_reason: str | None = None
    suggested_actions: tuple[str, ...] = ()
    last_anomaly: str | None = None
    losses: tuple[float, ...] = Field(default=(), description="Loss of the last logged steps, oldest first.")
    checkpoints: tuple[int, ...] = ()
    recent_events: tuple[str, ...] = ()


def sparkline(values: list[float] | tuple[float, ...], width: int = 60) -> str:
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


def _checkpoint_steps(paths: RunPaths) -> tuple[int, ...]:
    d = paths.checkpoints
    if not d.is_dir():
        return ()
    return tuple(sorted(int(p.name) for p in d.iterdir() if p.name.isdigit()))  # in-progress saves carry a suffix


def build_status(paths: RunPaths, loss_points: int = 200) -> RunStatusReport:
    """The status of the run in ``paths`` from its SQLite state, metrics and events."""
    cfg = RunConfig.model_validate_json(paths.config.read_text())
    raw = read_state(paths)
    state = RunState.model_validate(raw) if raw is not None else None
    by_step: dict[int, float] = {}
    for rec in read_jsonl(paths.metrics):
        if isinstance(rec.get("step"), int) and isinstance(rec.get("loss"), (int, float)):
            by_step[rec["step"]] = float(rec["loss"])
    losses = tuple(by_step[s] for s in sorted(by_step))[-loss_points:]
    events = EventLog(paths.events).read()
    recent = tuple(f"{e.kind}@{e.step}" if e.step is not None else e.kind for e in events[-8:])
    common: dict[str, Any] = dict(
        run_id=paths.run_id,
        run_dir=str(paths.root),
        live=is_live(paths),
        total_steps=cfg.training.total_steps,
        losses=losses,
        checkpoints=_checkpoint_steps(paths),
        recent_events=recent,
    )
    if state is None:
        return RunStatusReport(status="starting", step=0, **common)
    return RunStatusReport(
        status=state.status,
        step=state.step,
        lr=state.lr,
        grad_clip=state.grad_clip,
        fallback_tier=state.fallback_tier,
        blacklist=state.blacklist,
        domain_weights=state.domain_weights,
        pending_reason=state.human.reason if state.human.pending else None,
        suggested_actions=state.human.suggested_actions if state.human.pending else (),
        last_anomaly=state.anomaly.detail if state.anomaly is not None else None,
        **common,
    )


def render_status(report: RunStatusReport) -> Any:
    """A rich renderable: key/value table with a loss sparkline."""
    from rich.table import Table

    t = Table(title=f"run {report.run_id}", show_header=False, title_justify="left")
    t.add_column("field", style="bold")
    t.add_column("value")
    state = report.status + (" (live)" if report.live else "")
    t.add_row("status", state)
    t.add_row("step", f"{report.step} / {report.total_steps}")
    if report.lr is not None:
        t.add_row("lr / clip", f"{report.lr:.3g} / {report.grad_clip:.3g}")
    t.add_row("fallback tier", str(report.fallback_tier))
    if report.losses:
        t.add_row("loss", f"{sparkline(report.losses)}  last {report.losses[-1]:.4g}")
    t.add_row("blacklist", ", ".join(report.blacklist) or "-")
    if report.domain_weights:
        t.add_row("domain mix", ", ".join(f"{d} {w:.2f}" for d, w in report.domain_weights.items()))
    t.add_row("checkpoints", ", ".join(map(str, report.checkpoints)) or "-")
    if report.last_anomaly:
        t.add_row("last anomaly", report.last_anomaly)
    if report.pending_reason:
        t.add_row("waiting for", report.pending_reason)
        t.add_row("try", " | ".join(report.suggested_actions))
    t.add_row("recent events", " ".join(report.recent_events) or "-")
    t.add_row("folder", report.run_dir)
    return t
