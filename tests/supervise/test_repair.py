"""Repair planner: the least damaging fix, escalation, never an endless loop."""

from aegis.supervise.run_config import RunConfig
from aegis.supervise.repair import apply_repair, plan_repair
from aegis.supervise.state import Anomaly, DiagnosisReport, OutlierStats, RunState

CFG = RunConfig.model_validate({"model": "tiny-llama", "data": "toy", "recovery": {"max_retries": 2}})
STATS = OutlierStats(median_grad_norm=1, max_grad_norm=2, mad_grad_norm=0.1, median_loss=1, max_loss=9, num_samples=8)


def _diag(verdict, ids=()):
    return DiagnosisReport(batch_id="step-7", checkpoint_step=5, verdict=verdict, outlier_indices=tuple(range(len(ids))),
                           outlier_stats=STATS, suspected_samples=tuple(ids), report_path="x.json")


def _state(kind="loss_spike", **kw):
    base = RunState.new("r", lr=1e-3, grad_clip=1.0, weights={}).update(step=5, last_checkpoint_step=5)
    return base.update(anomaly=Anomaly(type=kind, step=7, batch_sample_ids=("a", "b")), **kw)


def test_strategies():
    d = plan_repair(_state(diagnosis=_diag("outliers", ["a"])), CFG, 1)
    assert (d.strategy, d.blacklist_add, d.rollback_to, d.lr) == ("blacklist", ("a",), 5, 1e-3)
    d = plan_repair(_state(diagnosis=_diag("none")), CFG, 1)
    assert (d.strategy, d.lr, d.grad_clip) == ("stabilize", 5e-4, 0.5)
    d = plan_repair(_state(diagnosis=_diag("ambiguous", ["a", "b", "c"])), CFG, 1)
    assert d.strategy == "escalate" and "ambiguous" in d.reason
    d = plan_repair(_state("oom"), CFG, 2)
    assert (d.strategy, d.fallback_tier) == ("fallback", 1)
    d = plan_repair(_state("oom", fallback_tier=1), CFG, 2)
    assert d.strategy == "escalate" and "no further fallback" in d.reason
    d = plan_repair(_state("operator"), CFG, 1)
    assert d.strategy == "escalate" and d.rollback_to is None
    # a sample already blacklisted that spikes again is not blamed twice: stabilise instead
    d = plan_repair(_state(diagnosis=_diag("outliers", ["a"]), blacklist=("a",)), CFG, 1)
    assert d.strategy == "stabilize"


def test_repeated_failures_escalate_after_max_retries():
    state = _state(diagnosis=_diag("none"))
    strategies = []
    for _ in range(5):
        d = plan_repair(state, CFG, 1)
        strategies.append(d.strategy)
        state = apply_repair(state, d)
        if d.strategy == "escalate":
            break
    assert strategies == ["stabilize", "stabilize", "escalate"]
    assert state.human.pending and state.status == "paused"
    assert state.lr == 1e-3 * 0.25
    assert "skip_batch" in state.human.suggested_actions


def test_a_spike_that_survives_stabilising_skips_its_batch():
    state = _state(diagnosis=_diag("none"))
    state = apply_repair(state, plan_repair(state, CFG, 1))
    again = state.update(anomaly=state.anomaly.model_copy(update={"repeat": True}))
    d = plan_repair(again, CFG, 1)
    assert d.strategy == "skip_batch" and d.skip_add == ("a", "b") and d.rollback_to == 5
    after = apply_repair(again, d)
    assert after.skipped == ("a", "b") and after.blacklist == () and after.excluded_ids == ("a", "b")
