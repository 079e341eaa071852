"""`aegis forge`: phases 1 -> 4 into OUT, each with its report; killed after phase 1 and re-run, phase 1 is not
retrained. Phase 1 is a stub here (three tiny llama folders), standing in for aegis.forge.cognate.run_phase1."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from aegis.forge import pipeline


def _stub_phase1(calls: list):
    def run_phase1(config: dict, out: Path, *, tiny: bool = False) -> list[Path]:
        from tools.hf_folders import make_model_folder

        calls.append(tiny)
        return [make_model_folder(Path(out) / f"model{i}", hidden=32, layers=2, seed=i) for i in range(3)]

    return run_phase1


def _config() -> dict:
    cfg = pipeline.tiny_config()
    cfg["phase2"] = {"generations": 0, "population": 8, "max_eval_rows": 4, "seq_len": 32}
    cfg["phase3"].update(rows=32, bake_steps=2, rl_steps=2, check_every=2, batch_size=4)
    return cfg


def test_forge_runs_four_phases_and_resumes_after_a_kill_without_retraining_phase1(tmp_path, monkeypatch):
    import importlib

    evo = importlib.import_module("aegis.forge.evomerge")  # the package re-exports a function of that name

    calls: list = []
    real = evo.evomerge

    def killed(*a, **k):
        raise KeyboardInterrupt  # as if kill -9 hit phase 2

    monkeypatch.setattr(evo, "evomerge", killed)
    with pytest.raises(KeyboardInterrupt):
        pipeline.run_forge(_config(), tmp_path / "out", run_phase1=_stub_phase1(calls))
    assert calls == [True] and (tmp_path / "out" / "phase1_cognate" / ".complete").is_file()
    assert not (tmp_path / "out" / "phase2_evomerge" / ".complete").exists()

    monkeypatch.setattr(evo, "evomerge", real)
    logs: list[str] = []
    results = pipeline.run_forge(_config(), tmp_path / "out", run_phase1=_stub_phase1(calls), log=logs.append)
    assert calls == [True]  # phase 1 was not run again
    assert "phase 1: done (skipped)" in logs
    out = tmp_path / "out"
    for phase in pipeline.PHASES:
        report = json.loads((out / phase / "report.json").read_text())
        assert report and (out / phase / "report.md").is_file()
    p1 = json.loads((out / "phase1_cognate" / "report.json").read_text())
    n = p1["sizes"]["model0"]["params"]
    p3 = json.loads((out / "phase3_quietstar" / "report.json").read_text())
    assert p3["input_size"]["params"] == n  # sizes read from the files each phase got
    assert p3["size_change"]["params_before"] == n and p3["size_change"]["params_added"] == 12 * 32 * 2
    assert p3["output_size"]["params"] - n == 12 * 32 * 2 + (32 * 64 + 32 + 32 + 1)  # + the mixing head's file
    assert (out / "final" / "bitnet_config.json").exists() or any((out / "final").glob("*.json"))
    assert (out / "final" / "quietstar.json").is_file()
    assert set(results) == set(pipeline.PHASES)


def test_forge_config_errors_are_one_line(tmp_path):
    from aegis.errors import InvalidConfigError

    with pytest.raises(InvalidConfigError, match="not a file"):
        pipeline.load_forge_config(tmp_path / "nope.yml")
    bad = tmp_path / "bad.yml"
    bad.write_text("phase5: {}\n")
    with pytest.raises(InvalidConfigError, match="phase1, phase2"):
        pipeline.load_forge_config(bad)
