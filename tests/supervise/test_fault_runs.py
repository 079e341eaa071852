"""Fault drills on the real engine (tiny llama on CPU): toxic samples, NaN, OOM, repeated failure,
a human's `set_lr` from another process. Each asserts the outcome, not only that it ran."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import respx

from aegis.supervise import Supervisor, parse_run_config
from aegis.supervise.events import read_jsonl

from .conftest import run_config, write_arith_dataset


def _metrics(run_dir: Path) -> dict[int, dict]:
    """Last logged record of every step (a retried step's final attempt wins)."""
    out: dict[int, dict] = {}
    for rec in read_jsonl(run_dir / "metrics.jsonl"):
        out[rec["step"]] = rec
    return out


def _kinds(sup: Supervisor, run_id: str) -> list[str]:
    return [e.kind for e in sup.events(run_id)]


@pytest.mark.slow
def test_planted_toxic_samples_are_found_and_blacklisted(tmp_path):
    data = tmp_path / "toxic.jsonl"
    # a packed batch holds ~37 of these 10-20 token rows (rows of 64, 8 rows): 3,000 clean rows keep a batch with a
    # toxic row as rare (~9% of batches) as 600 did at one example per row, so such a batch is still an anomaly
    clean, toxic = write_arith_dataset(data, 3000, 8, seed=0)
    cfg = parse_run_config(
        run_config(
            tmp_path,
            run_id="toxic",
            data=str(data),
            training={"steps_per_window": 25, "total_steps": 150},
            checkpoints={"interval": 25},
        )
    )
    sup = Supervisor(tmp_path / "runs")
    out = sup.start(cfg)
    assert out.status == "completed" and out.step == 150
    blacklisted = set(out.blacklist)
    recall = len(blacklisted & set(toxic)) / len(toxic)
    assert recall >= 0.95, f"found {sorted(blacklisted & set(toxic))} of {toxic}"
    assert not blacklisted & set(clean), f"clean samples blacklisted: {sorted(blacklisted & set(clean))}"
    exported = json.loads((tmp_path / "runs" / "toxic" / "blacklist.json").read_text())
    assert set(exported["blacklist"]) == blacklisted
    diagnoses = [e for e in sup.events("toxic") if e.kind == "diagnosis"]
    assert diagnoses and all(Path(e.data["report"]).is_file() for e in diagnoses)
    # after a blacklist the toxic rows never reach a batch again
    metrics = _metrics(tmp_path / "runs" / "toxic")
    last_repair = max(e.step for e in sup.events("toxic") if e.kind == "repair")
    later = [s for step, rec in metrics.items() if step > last_repair for s in rec["sample_ids"]]
    assert not set(later) & blacklisted


@pytest.mark.slow
def test_oom_falls_back_and_nan_rolls_back_with_lower_lr(tmp_path):
    cfg = parse_run_config(
        run_config(
            tmp_path,
            run_id="faults",
            fallbacks=[{"method": "full", "micro_batch_size": 4, "gradient_accumulation_steps": 2, "seq_len": 64, "precision": "fp32"}],
            faults={"oom_on_tiers": [0], "nan_at_steps": [45]},
        )
    )
    sup = Supervisor(tmp_path / "runs")
    out = sup.start(cfg)
    assert out.status == "completed" and out.step == 60
    assert out.fallback_tier == 1 and out.lr == pytest.approx(1.5e-3) and out.grad_clip == pytest.approx(0.5)
    events = sup.events("faults")
    anomalies = [(e.data["type"], e.step) for e in events if e.kind == "anomaly"]
    assert anomalies == [("oom", 1), ("nan", 45)]
    repairs = [e.data["strategy"] for e in events if e.kind == "repair"]
    assert repairs == ["fallback", "stabilize"]
    nan_diag = next(e for e in events if e.kind == "diagnosis")
    assert nan_diag.data["verdict"] == "none" and nan_diag.data["checkpoint_step"] == 40
    assert [e.step for e in events if e.kind == "rollback"] == [0, 40]
    metrics = _metrics(tmp_path / "runs" / "faults")
    assert sorted(metrics) == list(range(1, 61))
    assert all(rec["tier"] == 1 for rec in metrics.values())  # tier 0 never completed a step
    assert all(not rec["nonfinite"] for rec in metrics.values())  # the NaN step was retried cleanly
    assert all(rec["peak_lr"] == pytest.approx(1.5e-3) for s, rec in metrics.items() if s > 40)
    assert all(rec["peak_lr"] == pytest.approx(3e-3) for s, rec in metrics.items() if s <= 40)


@pytest.mark.parametrize("phase", ["build", "transfer"])
def test_oom_while_building_or_copying_to_the_host_takes_the_fallback_chain(tmp_path, phase):
    """An out-of-memory outside the jitted step (weights to the device, compilation, the checkpoint's
    device-to-host copy) is an OOM anomaly like any other: the next tier trains, no traceback."""
    cfg = parse_run_config(
        run_config(
            tmp_path,
            run_id=phase,
            training={"steps_per_window": 10, "total_steps": 10},
            fallbacks=[{"method": "full", "micro_batch_size": 4, "seq_len": 64, "precision": "fp32"}],
            faults={"oom_on_tiers": [0], "oom_phase": phase},
        )
    )
    sup = Supervisor(tmp_path / "runs")
    out = sup.start(cfg)
    assert out.status == "completed" and out.step == 10 and out.fallback_tier == 1
    events = sup.events(phase)
    assert [e.data["type"] for e in events if e.kind == "anomaly"] == ["oom"]
    assert [e.data["strategy"] for e in events if e.kind == "repair"] == ["fallback"]
    assert all(rec["tier"] == 1 for rec in _metrics(tmp_path / "runs" / phase).values())


def _cli(*args: str, runs_dir: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "AEGIS_RUNS_DIR": str(runs_dir)}
    return subprocess.run(
        [sys.executable, "-m", "aegis.cli.supervised", *args], capture_output=True, text=True, env=env, timeout=120
    )


def _snapshot(run_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file() and p.name != "lock"}


@pytest.mark.slow
@respx.mock
def test_repeated_failure_interrupts_and_set_lr_from_a_new_process_applies(tmp_path):
    hook = respx.post("https://hooks.example/aegis").mock(return_value=httpx.Response(200))
    cfg = parse_run_config(
        run_config(
            tmp_path,
            run_id="hitl",
            recovery={"max_retries": 1},
            faults={"nan_at_steps": [25, 27]},
            notifications={"webhook_url": "https://hooks.example/aegis"},
        )
    )
    runs = tmp_path / "runs"
    sup = Supervisor(runs)
    out = sup.start(cfg)
    assert out.status == "paused" and "automatic repairs" in out.pending_reason
    assert out.step == 20  # rolled back to the checkpoint before the failures
    kinds = _kinds(sup, "hitl")
    assert kinds.count("repair") == 2 and "escalated" in kinds and "notified" in kinds
    body = hook.calls[0].request.content.decode()
    assert json.loads(body)["run_id"] == "hitl"
    texts = [json.loads(line)["text"] for line in (tmp_path / "arith.jsonl").read_text().splitlines()]
    assert not any(t in body for t in texts)  # ids and numbers only

    run_dir = runs / "hitl"
    before = _snapshot(run_dir)
    bad = _cli("command", "hitl", "set_lr fast", runs_dir=runs)
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "needs a number" in bad.stderr
    unknown = _cli("command", "nope", "set_lr 1e-5", runs_dir=runs)
    assert unknown.returncode == 2 and "unknown run id 'nope'" in unknown.stderr
    assert _snapshot(run_dir) == before  # rejected commands change nothing

    ok = _cli("command", "hitl", "set_lr 1e-5", runs_dir=runs)
    assert ok.returncode == 0, ok.stderr
    assert sup.state("hitl").lr == pytest.approx(1.5e-3)  # queued, not yet applied

    out = sup.resume("hitl")
    assert out.status == "completed" and out.step == 60 and out.lr == pytest.approx(1e-5)
    metrics = _metrics(run_dir)
    resumed = [rec for s, rec in metrics.items() if s > 20]
    assert resumed and all(rec["peak_lr"] == pytest.approx(1e-5) and rec["lr"] <= 1e-5 * (1 + 1e-6) for rec in resumed)
    kinds = _kinds(sup, "hitl")
    assert kinds.index("command") < kinds.index("command_applied") < kinds.index("resumed")


@pytest.mark.slow
def test_operator_interrupt_pauses_a_live_run_at_the_next_step(tmp_path):
    from aegis.supervise.context import RunCallbacks

    cfg = parse_run_config(run_config(tmp_path, run_id="op", training={"total_steps": 30}))
    sup = Supervisor(tmp_path / "runs")
    sent = []

    def on_step(m):
        if m.step == 5 and not sent:
            sent.append(sup.interrupt("op"))

    out = sup.start(cfg, callbacks=RunCallbacks(on_step=on_step))
    assert sent and sent[0].live
    assert out.status == "paused" and out.step == 5 and "operator" in out.pending_reason
    ckpts = tmp_path / "runs" / "op" / "checkpoints"
    assert sorted(int(p.name) for p in ckpts.iterdir() if p.name.isdigit()) == [0, 5]
    # damage the newest checkpoint: resume must detect it and fall back to the previous one
    for f in (ckpts / "5" / "state").rglob("*"):
        if f.is_file() and f.parent.name == "d":
            f.write_bytes(b"\0" * 8)
    out = sup.resume("op")
    assert out.status == "completed" and out.step == 30
    events = sup.events("op")
    assert [e.step for e in events if e.kind == "checkpoint_corrupt"] == [5]
    assert [(e.step, e.data["from_step"]) for e in events if e.kind == "restored"] == [(0, 5)]
    assert (tmp_path / "runs" / "op" / "corrupt_checkpoints").is_dir()
    assert sorted(_metrics(tmp_path / "runs" / "op")) == list(range(1, 31))
