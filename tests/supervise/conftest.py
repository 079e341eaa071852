"""Supervisor test fixtures and run helpers (the XLA compilation cache is the suite's: tests/conftest.py)."""

from __future__ import annotations

import json
import random
from pathlib import Path


from tests.demo_model import TINY_RUN


def write_arith_dataset(path: Path, n_clean: int, n_toxic: int, seed: int = 0) -> tuple[list[str], list[str]]:
    """A homogeneous arithmetic JSONL ("7 * 3 = 21") with planted toxic rows: 62 random printable
    characters, which a model trained on the rest predicts badly (huge per-sample loss).
    Returns (clean ids, toxic ids)."""
    rng = random.Random(seed)
    ops = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
    rows = []
    for i in range(n_clean):
        a, b, o = rng.randrange(20), rng.randrange(20), rng.choice("+-*")
        rows.append({"id": f"clean-{i}", "domain": "mul" if o == "*" else "addsub", "text": f"{a} {o} {b} = {ops[o](a, b)}"})
    toxic = []
    for i in range(n_toxic):
        text = "".join(chr(rng.randrange(33, 127)) for _ in range(62))
        rows.append({"id": f"toxic-{i}", "domain": rng.choice(["addsub", "mul"]), "text": text})
        toxic.append(f"toxic-{i}")
    rng.shuffle(rows)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return [f"clean-{i}" for i in range(n_clean)], toxic


BASE = {
    **TINY_RUN,
    "train_config": {"method": "full", "micro_batch_size": 8, "seq_len": 64, "precision": "fp32"},
    "training": {"steps_per_window": 20, "total_steps": 60, "lr": 3e-3, "grad_clip": 1.0, "min_lr_ratio": 1.0,
                 "warmup_steps": 0, "seed": 0},
    "monitoring": {"history_size": 50, "min_history": 10, "warmup_steps": 30, "spike_sigma": 5.0},
    "checkpoints": {"interval": 20, "keep_last_n": 3},
    "curriculum": {"eval_interval": 100000},
}


def run_config(tmp_path: Path, **sections: dict) -> dict:
    """BASE with sections merged in (one level deep), data defaulting to a small arithmetic set; another model
    takes the config's own init (pretrained unless it says)."""
    cfg = json.loads(json.dumps(BASE))
    if "model" in sections:
        cfg.pop("init")
    if "data" not in sections:
        data = tmp_path / "arith.jsonl"
        if not data.exists():
            write_arith_dataset(data, 300, 0)
        cfg["data"] = str(data)
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(cfg.get(key), dict):
            cfg[key] = {**cfg[key], **value}
        else:
            cfg[key] = value
    return cfg
