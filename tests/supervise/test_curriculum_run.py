"""Curriculum on the real engine: a starved domain forgets, its weight is raised, its loss recovers."""

from __future__ import annotations

import json
import random

import pytest

from aegis.supervise import Supervisor, parse_run_config

from tests.demo_model import TINY_RUN


@pytest.mark.slow
def test_degraded_domain_gets_more_weight_and_recovers(tmp_path):
    rng = random.Random(0)
    rows = []
    for i in range(300):
        a, b = rng.randrange(50), rng.randrange(50)
        rows.append({"id": f"num-{i}", "domain": "numbers", "text": f"{a} + {b} = {a + b}"})
    words = ["apple", "river", "stone", "cloud", "green", "house", "light", "quiet", "table", "water"]
    for i in range(300):
        rows.append({"id": f"word-{i}", "domain": "words", "text": " ".join(rng.choice(words) for _ in range(5))})
    (tmp_path / "two.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = parse_run_config(
        {
            "run_id": "cur",
            **TINY_RUN,
            "data": str(tmp_path / "two.jsonl"),
            "train_config": {"method": "full", "micro_batch_size": 8, "seq_len": 64, "precision": "fp32"},
            "training": {"steps_per_window": 10, "total_steps": 60, "lr": 3e-3, "min_lr_ratio": 1.0, "warmup_steps": 0,
                         "seed": 0},
            "monitoring": {"warmup_steps": 1000},
            "curriculum": {"eval_interval": 10, "eval_batches": 2, "weights": {"numbers": 1.0, "words": 0.02},
                           "drop_threshold": 0.05, "boost": 3.0},
        }
    )
    sup = Supervisor(tmp_path / "runs")
    assert sup.start(cfg).status == "completed"
    evals = [e for e in sup.events("cur") if e.kind == "curriculum"]
    hit = next(i for i, e in enumerate(evals) if "words" in e.data["degraded"])
    before = evals[hit - 1].data["weights"]["words"]
    after = evals[hit].data["weights"]["words"]
    assert after > 3 * before
    assert evals[-1].data["losses"]["words"] < evals[hit].data["losses"]["words"]  # the boost helps it recover
    assert sup.state("cur").domain_weights["words"] == pytest.approx(after)
