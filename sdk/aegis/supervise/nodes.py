"""The supervisor graph's nodes (spec §9): Train, Monitor, Forensics, Repair, Curriculum, Notify, Human.

Each node takes the graph state ``{"run": <RunState as JSON>}`` and the process's
:class:`RunContext`, and returns the updated ``{"run": ...}``. Side effects (checkpoints,
metrics, events) are idempotent enough to re-run: after a ``kill -9`` LangGraph re-executes the
interrupted node from the last persisted state.

* **train** — applies queued commands, restores the engine when it is not at the state's step,
  trains up to ``steps_per_window`` steps (stopping early at a first anomaly, an OOM, or an urgent
  command), logs every step, checkpoints on the interval and at a clean window's end; before
  training it drops the logged steps past the engine's (a killed process's or a rolled-back future),
  so metrics.jsonl holds each step once;
* **monitor** — judges the window with :class:`Detector`, extends the history, routes;
* **forensics** — restores the checkpoint before the anomaly and diagnoses the offending batch;
* **repair** — chooses and applies the repair, rolls checkpoints back, exports the blacklist;
* **curriculum** — per-domain eval and weight update;
* **notify** — webhook and event for a human;
* **human** — ``interrupt()``; on resume applies the inbox commands and routes.
"""

from __future__ import annotations

from typing import Any

from aegis.errors import CommandError
from aegis.supervise.commands import Command, parse_command, validate_command
from aegis.supervise.context import RunContext
from aegis.supervise.curriculum import update_curriculum
from aegis.supervise.faults import FaultInjector
from aegis.supervise.forensics import diagnose
from aegis.supervise.monitor import Detector
from aegis.supervise.notify import build_payload, send_webhook
from aegis.supervise.repair import apply_repair, plan_repair, suggested_actions
from aegis.supervise.state import Anomaly, HumanInterrupt, RunState, StepMetrics
from aegis.train import watchdog
from aegis.train.distributed import device_memory, share

__all__ = [
    "load",
    "dump",
    "apply_command",
    "consume_inbox",
    "train_node",
    "monitor_node",
    "forensics_node",
    "repair_node",
    "curriculum_node",
    "notify_node",
    "human_node",
]

GraphState = dict[str, Any]


def load(gs: GraphState) -> RunState:
    return RunState.model_validate(gs["run"])


def dump(state: RunState) -> GraphState:
    return {"run": state.model_dump(mode="json")}


def _anomaly_data(anomaly: Anomaly) -> dict[str, Any]:
    return anomaly.model_dump(mode="json", exclude={"batch_sample_ids", "step"}) | {
        "batch_size": len(anomaly.batch_sample_ids)
    }


# --------------------------------------------------------------------------- commands


def apply_command(state: RunState, cmd: Command) -> RunState:
    """The state after a (validated) command."""
    if cmd.name == "set_lr":
        return state.update(lr=cmd.value)
    if cmd.name == "blacklist_samples":
        return state.update(blacklist=tuple(dict.fromkeys((*state.blacklist, *cmd.ids))))
    if cmd.name == "skip_batch":
        ids = state.anomaly.batch_sample_ids if state.anomaly is not None else ()
        return state.update(skipped=tuple(dict.fromkeys((*state.skipped, *ids))))
    if cmd.name == "stop":
        return state.update(stop_requested=True)
    if cmd.name == "interrupt":
        return state if state.human.pending else state.update(interrupt_requested=True)
    if cmd.name == "resume":
        return state.update(status="running", human=HumanInterrupt(), repair_attempts=0)
    return state


def consume_inbox(ctx: RunContext, state: RunState) -> RunState:
    """Apply every inbox command past ``state.inbox_offset``; one that no longer applies is logged and skipped.
    In a multi-process run every process applies process 0's inbox (the one `aegis command` writes to)."""
    texts = share("inbox", ctx.inbox())
    known = ctx.known_ids() if ctx.paths.samples.exists() else None
    for text in texts[state.inbox_offset :]:
        try:
            cmd = parse_command(text)
            validate_command(cmd, state, known)
        except CommandError as err:
            ctx.event("command_skipped", state.step, command=text, reason=str(err))
            continue
        state = apply_command(state, cmd)
        ctx.event("command_applied", state.step, command=cmd.text)
    if len(texts) > state.inbox_offset:
        state = state.update(inbox_offset=len(texts))
        ctx.export_blacklist(state)
    return state


# --------------------------------------------------------------------------- train


def _prepare_engine(ctx: RunContext, state: RunState, target: int) -> tuple[Any, RunState, list[StepMetrics]]:
    """The engine at the state's step (or at a later checkpoint of this window, after a crash)."""
    engine = ctx.engine_for(state)
    store = ctx.store
    recovered: list[StepMetrics] = []
    if not store.all_steps():
        engine.sync(state)
        path = engine.checkpoint(store, engine.step, state)
        store.wait()
        engine.dirty = False
        return engine, state.update(last_checkpoint_path=path, last_checkpoint_step=engine.step), recovered
    if engine.dirty or engine.step != state.step:
        restored = engine.restore(
            store,
            state,
            max_step=target,
            on_corrupt=lambda step, why: ctx.event("checkpoint_corrupt", step, reason=why),
        )
        if restored.step != state.step:
            older = {"defaulted": list(restored.defaulted)} if restored.defaulted else {}
            ctx.event("restored", restored.step, from_step=state.step, skipped_corrupt=list(restored.skipped_corrupt), **older)
        if restored.step > state.step:
            recovered = ctx.metrics_between(state.step, restored.step)
        elif restored.step < state.step:
            state = state.update(step=restored.step, metrics=state.metrics.truncated(restored.step))
        state = state.update(last_checkpoint_path=str(store.path(restored.step)), last_checkpoint_step=restored.step)
    else:
        engine.sync(state)
    return engine, state, recovered


def train_node(ctx: RunContext, gs: GraphState) -> GraphState:
    cfg = ctx.cfg
    state = consume_inbox(ctx, load(gs)).update(anomaly=None, diagnosis=None, window=())
    if state.stop_requested:
        ctx.event("stopped", state.step, reason="stop command")
        return dump(state.update(status="stopped"))
    if state.interrupt_requested:
        anomaly = Anomaly(type="operator", step=state.step, detail="interrupt requested by an operator")
        ctx.event("anomaly", state.step, **_anomaly_data(anomaly))
        return dump(state.update(anomaly=anomaly, interrupt_requested=False))
    total = cfg.training.total_steps
    if state.step >= total:
        return dump(state)
    target = min(state.step + cfg.training.steps_per_window, total)
    try:
        engine, state, window = _prepare_engine(ctx, state, target)
    except Exception as err:  # out of memory while building, loading or restoring: the next fallback tier
        oom = _oom_anomaly(ctx, err, state.step + 1)
        return dump(state.update(anomaly=oom, window=()))
    store = ctx.store
    ctx.rewind_metrics(engine.step)  # steps past it were a dead process's or a rolled-back future
    detector = Detector(cfg.monitoring, state.metrics)
    for m in window:
        detector.observe(m)
    injector = FaultInjector(cfg.faults, state.faults_fired, engine.tier)
    if ctx.callbacks.on_window is not None:
        ctx.callbacks.on_window(engine.step, target)
    anomaly = None
    steps = engine.trainer.train(target - engine.step)
    try:
        while engine.step < target:
            step_no = engine.step + 1
            injector.before(engine, step_no)
            if injector.last is not None:
                ctx.event("fault_injected", step_no, fault=injector.last)
            info = next(steps)
            injector.after(engine)
            m = StepMetrics(
                step=info.step,
                loss=info.loss,
                grad_norm=info.grad_norm,
                lr=info.lr,
                tokens_per_s=info.tokens_per_s,
                nonfinite=info.nan_or_inf,
                overflow=info.scaler_overflow,
                sample_ids=info.sample_ids,
                tokens=info.tokens,
                step_time_s=info.step_time_s,
                useful_token_fraction=info.useful_token_fraction,
                loss_token_fraction=info.loss_token_fraction,
                host_wait_s=info.host_wait_s,
            )
            ctx.record_step(m, state.lr, engine.tier)
            if (dog := watchdog.current()) is not None:
                dog.note_step(info.step, device_memory)
            window.append(m)
            anomaly = detector.observe(m)
            if anomaly is not None:
                break
            if store.due(info.step) and info.step < target:
                engine.checkpoint(store, info.step, state)
            if share("urgent command", ctx.urgent_command_waiting(state.inbox_offset)):
                break  # every process stops this window at the same step
    except Exception as err:
        anomaly = _oom_anomaly(ctx, err, engine.step + 1)
    finally:
        steps.close()
        injector.after(engine)
    keep_ids = cfg.forensics.context_batches + 1
    trimmed = tuple(m if i >= len(window) - keep_ids else m.model_copy(update={"sample_ids": ()}) for i, m in enumerate(window))
    state = state.update(window=trimmed, faults_fired=tuple(injector.fired))
    if anomaly is not None:
        engine.dirty = True
        if anomaly.type == "oom":
            return dump(state.update(anomaly=anomaly))
        return dump(state)
    engine.settle()
    try:
        path = engine.checkpoint(store, engine.step, state)
    except Exception as err:  # out of memory copying the state to the host
        return dump(state.update(anomaly=_oom_anomaly(ctx, err, engine.step)))
    return dump(state.update(last_checkpoint_path=path, last_checkpoint_step=engine.step))


def _oom_anomaly(ctx: RunContext, err: Exception, step: int) -> Anomaly:
    """An ``oom`` anomaly for an out-of-memory error anywhere in a step (device or host transfer); any
    other error propagates. The engine is dropped so the repair's next tier builds afresh."""
    from aegis.supervise.engine_handle import is_oom

    if not is_oom(err):
        raise err
    ctx.drop_engine()
    return Anomaly(type="oom", step=step, detail=(str(err).strip().splitlines() or ["out of memory"])[0][:300])


# --------------------------------------------------------------------------- monitor


def monitor_node(ctx: RunContext, gs: GraphState) -> GraphState:
    cfg = ctx.cfg
    state = load(gs)
    if state.status in ("stopped", "completed") or (state.anomaly is not None and state.anomaly.type in ("operator", "oom")):
        if state.anomaly is not None and state.anomaly.type == "oom":
            ctx.event("anomaly", state.anomaly.step, **_anomaly_data(state.anomaly))
        return dump(state)
    detector = Detector(cfg.monitoring, state.metrics)
    clean: list[StepMetrics] = []
    anomaly = None
    for m in state.window:
        anomaly = detector.observe(m)
        if anomaly is not None:
            break
        clean.append(m)
    kept = [m for m in clean if not m.overflow]  # a skipped fp16 overflow step has no gradient norm to keep
    metrics = state.metrics.extended(
        [m.step for m in kept], [m.loss for m in kept], [m.grad_norm for m in kept], cfg.monitoring.history_size
    )
    state = state.update(metrics=metrics)
    if anomaly is not None:
        ctx.event("anomaly", anomaly.step, **_anomaly_data(anomaly))
        attempts = state.repair_attempts
        progressed = state.last_anomaly_step is not None and anomaly.step > state.last_anomaly_step
        anomaly = anomaly.model_copy(update={"repeat": state.last_anomaly_step == anomaly.step})
        if progressed and state.repairs and state.repairs[-1].strategy == "blacklist":
            attempts = 0  # the blamed samples are gone and training got past them: a new problem
        return dump(state.update(anomaly=anomaly, repair_attempts=attempts, last_anomaly_step=anomaly.step))
    last = state.window[-1].step if state.window else state.step
    state = state.update(step=max(state.step, last), repair_attempts=0)
    ctx.event("window_done", state.step, loss=clean[-1].loss if clean else None, steps=len(clean))
    if state.step >= cfg.training.total_steps:
        ctx.store.wait()
        ctx.export_blacklist(state)
        if cfg.export:
            ctx.export_model(state)
        ctx.event("completed", state.step, blacklist=list(state.blacklist),
                  export=str(ctx.paths.export) if cfg.export else None)
        return dump(state.update(status="completed"))
    return dump(state)


def route_after_monitor(ctx: RunContext, gs: GraphState) -> str:
    state = load(gs)
    if state.status in ("stopped", "completed"):
        return "end"
    if state.anomaly is not None:
        return "repair" if state.anomaly.type in ("oom", "operator") else "forensics"
    if state.step - state.last_eval_step >= ctx.cfg.curriculum.eval_interval:
        return "curriculum"
    return "train"


# --------------------------------------------------------------------------- forensics


def forensics_node(ctx: RunContext, gs: GraphState) -> GraphState:
    state = load(gs)
    anomaly = state.anomaly
    assert anomaly is not None  # routed here only with an anomaly
    try:
        engine = ctx.engine_for(state)
        restored = engine.restore(
            ctx.store,
            state,
            max_step=anomaly.step - 1,
            on_corrupt=lambda step, why: ctx.event("checkpoint_corrupt", step, reason=why),
        )
        context = [m.sample_ids for m in state.window if m.step < anomaly.step and m.sample_ids]
        report = diagnose(
            anomaly.type,
            engine.trainer,
            anomaly.batch_sample_ids,
            context,
            anomaly.step,
            restored.step,
            ctx.cfg.forensics,
            ctx.paths.diagnoses,
        )
    except Exception as err:  # per-sample gradients out of memory: the repair takes the next fallback tier
        oom = _oom_anomaly(ctx, err, anomaly.step)
        ctx.event("anomaly", oom.step, **_anomaly_data(oom))
        return dump(state.update(anomaly=oom))
    ctx.event(
        "diagnosis",
        anomaly.step,
        verdict=report.verdict,
        checkpoint_step=report.checkpoint_step,
        suspected_samples=list(report.suspected_samples),
        median_grad_norm=report.outlier_stats.median_grad_norm,
        max_grad_norm=report.outlier_stats.max_grad_norm,
        report=report.report_path,
    )
    return dump(state.update(diagnosis=report))


# --------------------------------------------------------------------------- repair


def repair_node(ctx: RunContext, gs: GraphState) -> GraphState:
    state = load(gs)
    decision = plan_repair(state, ctx.cfg, num_tiers=len(ctx.cfg.tiers))
    state = apply_repair(state, decision)
    ctx.event(
        "repair",
        state.anomaly.step if state.anomaly else state.step,
        strategy=decision.strategy,
        reason=decision.reason,
        blacklisted=list(decision.blacklist_add),
        lr=decision.lr,
        grad_clip=decision.grad_clip,
        fallback_tier=decision.fallback_tier,
    )
    if decision.rollback_to is not None:
        dropped = ctx.store.rollback(decision.rollback_to)
        ctx.event("rollback", decision.rollback_to, from_step=state.step, dropped_checkpoints=dropped)
        state = state.update(
            step=decision.rollback_to,
            metrics=state.metrics.truncated(decision.rollback_to),
            last_checkpoint_step=decision.rollback_to,
            last_checkpoint_path=str(ctx.store.path(decision.rollback_to)),
        )
    ctx.export_blacklist(state)
    return dump(state)


def route_after_repair(ctx: RunContext, gs: GraphState) -> str:
    return "notify" if load(gs).human.pending else "train"


# --------------------------------------------------------------------------- curriculum


def curriculum_node(ctx: RunContext, gs: GraphState) -> GraphState:
    cfg = ctx.cfg.curriculum
    state = load(gs)
    engine = ctx.engine_for(state)
    if engine.dirty or engine.step != state.step:
        engine.restore(ctx.store, state, max_step=state.step)
    domains = [d for d in ctx.domains() if cfg.domains is None or d in cfg.domains]
    losses = {d: engine.trainer.eval(d, max_batches=cfg.eval_batches) for d in domains}
    update = update_curriculum(state.domain_weights, state.domain_best_loss, losses, cfg)
    ctx.event(
        "curriculum",
        state.step,
        losses=losses,
        degraded=list(update.degraded),
        weights=update.weights,
    )
    return dump(state.update(domain_weights=update.weights, domain_best_loss=update.best_loss, last_eval_step=state.step))


# --------------------------------------------------------------------------- human in the loop


def notify_node(ctx: RunContext, gs: GraphState) -> GraphState:
    state = load(gs)
    reason = state.human.reason or "human review requested"
    payload = build_payload(state, reason, ctx.cfg.notifications.slack_channel)
    ok, error = send_webhook(ctx.cfg.notifications, payload)
    ctx.event("escalated", state.step, reason=reason, suggested_actions=list(payload.suggested_actions))
    if ok:
        ctx.event("notified", state.step, channel="webhook")
    elif error is not None:
        ctx.event("notify_failed", state.step, channel="webhook", error=error)
    return dump(state)


def human_node(ctx: RunContext, gs: GraphState) -> GraphState:
    from langgraph.types import interrupt

    state = load(gs)
    value = interrupt(
        {
            "run_id": state.run_id,
            "step": state.step,
            "reason": state.human.reason,
            "suggested_actions": list(state.human.suggested_actions or suggested_actions(state)),
        }
    )
    state = consume_inbox(ctx, state)
    if state.stop_requested:
        ctx.event("stopped", state.step, reason="stop command")
        return dump(state.update(status="stopped", human=HumanInterrupt()))
    if isinstance(value, dict) and value.get("resume") and state.human.pending:
        state = apply_command(state, parse_command("resume"))
        ctx.event("command_applied", state.step, command="resume", source="aegis resume")
    if not state.human.pending:
        ctx.event("resumed", state.step, lr=state.lr, blacklist_size=len(state.blacklist))
    return dump(state)


def route_after_human(ctx: RunContext, gs: GraphState) -> str:
    state = load(gs)
    if state.status == "stopped":
        return "end"
    return "human" if state.human.pending else "train"
