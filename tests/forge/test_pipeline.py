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


@pytest.mark.slow
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
    p4 = json.loads((out / "phase4_bitnet" / "report.json").read_text())  # a llama stub: packed without QAT, measured
    assert p4["method"] == "packing (compress only)" and p4["training"] == {}
    assert 0.0 <= p4["quality"]["compress_only"]["top1_agreement"] <= 1.0 and p4["quality"]["phase3"]["kl_to_phase3"] == 0
    assert set(results) == set(pipeline.PHASES)


def test_forge_config_errors_are_one_line(tmp_path):
    from aegis.errors import InvalidConfigError

    with pytest.raises(InvalidConfigError, match="not a file"):
        pipeline.load_forge_config(tmp_path / "nope.yml")
    bad = tmp_path / "bad.yml"
    bad.write_text("phase5: {}\n")
    with pytest.raises(InvalidConfigError, match="phase1, phase2"):
        pipeline.load_forge_config(bad)


def test_phase2_pads_cognate_memories_to_one_slot_count_without_changing_the_logits(tmp_path):
    """The tiny variants differ in LTM slots (256 / 1024); EvoMerge needs equal shapes. Zero slots are inactive:
    the padded model's logits equal the original's, and the memory's test-time updates leave the slots at zero."""
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    import numpy as np

    from aegis.forge.cognate.hyperparams import TINY_MODEL, CognateConfig
    from aegis.forge.cognate.hf_folder import load_pretrained, save_pretrained
    from aegis.forge.cognate.model import forward, memory_scan

    from tests.forge.conftest import random_cognate_params as random_params

    base = {**TINY_MODEL, "vocab_size": 61, "memory_chunk": 4, "window": 6, "num_layers": 2}
    folders, params = [], {}
    for name, slots in (("reasoning", 8), ("memory", 32), ("speed", 8)):
        cfg = CognateConfig(**base, ltm_slots=slots)
        params[name] = (random_params(cfg, slots), cfg)
        folders.append(str(save_pretrained(params[name][0], cfg, tmp_path / "p1" / name)))

    inputs, aligned = pipeline._align_memory(folders, tmp_path / "inputs", lambda s: None)
    assert aligned == {"reasoning": {"ltm_slots": 8, "padded_to": 32}, "speed": {"ltm_slots": 8, "padded_to": 32}}
    assert inputs[1] == folders[1] and inputs[0] != folders[0]
    shapes = [{k: v["shape"] for k, v in _header(f).items()} for f in inputs]
    assert shapes[0] == shapes[1] == shapes[2]

    ids = jnp.asarray(np.random.default_rng(0).integers(0, 61, (2, 19)))
    p, cfg = params["reasoning"]
    wide, wcfg = load_pretrained(inputs[0])
    assert wcfg.ltm_slots == 32 and wcfg.model_copy(update={"ltm_slots": 8}) == cfg
    fwd = jax.jit(forward, static_argnums=1)
    want, got = fwd(p, cfg, ids), fwd(wide, wcfg, ids)
    np.testing.assert_allclose(np.asarray(got["logits"]), np.asarray(want["logits"]), rtol=0, atol=2e-5)  # fp32 sums
    np.testing.assert_array_equal(np.asarray(got["steps"]), np.asarray(want["steps"]))

    # the mechanism: through a layer's test-time memory updates (momentum, forgetting) the added slots stay zero
    # and the real ones move exactly as in the narrow memory
    narrow = {k: v[0] for k, v in p["layers"].items()}
    lp = {k: v[0] for k, v in wide["layers"].items()}
    x = jax.random.normal(jax.random.key(3), (4, 3, 16))
    x = x / jnp.linalg.norm(x, axis=-1, keepdims=True)  # the model's keys and queries are L2-normalised
    theta, eta, alpha = jnp.full((4, 3), 0.05), jnp.full((4,), 0.9), jnp.full((4,), 0.1)
    outs, (w1, w2, s1, s2) = memory_scan(lp["memory.w1"], lp["memory.w2"], x, x[::-1], x * 2, theta, eta, alpha)
    ref_outs, ref = memory_scan(narrow["memory.w1"], narrow["memory.w2"], x, x[::-1], x * 2, theta, eta, alpha)
    for t in (w1[:, 8:], s1[:, 8:], w2[8:], s2[8:]):
        assert float(jnp.abs(t).max()) == 0.0
    for got_t, want_t in zip((w1[:, :8], w2[:8], s1[:, :8], s2[:8], outs), (*ref, ref_outs), strict=True):
        np.testing.assert_allclose(np.asarray(got_t), np.asarray(want_t), rtol=1e-5, atol=1e-6)
    assert float(jnp.abs(s1).max()) > 0  # the memory did learn at test time


def _header(folder):
    from aegis.train.safetensors_io import read_header

    header, _ = read_header(Path(folder) / "model.safetensors")
    header.pop("__metadata__", None)
    return header


def test_forge_refuses_a_folder_it_did_not_write(tmp_path):
    """The output-folder rule: a user's file in OUT stops the run before anything is written; --overwrite keeps it."""
    from aegis.errors import OutputPathError
    from aegis.forge import pipeline

    out = tmp_path / "out"
    out.mkdir()
    (out / "important.txt").write_text("keep")
    with pytest.raises(OutputPathError, match="important.txt"):
        pipeline.run_forge(_config(), out, run_phase1=_stub_phase1([]))
    assert sorted(p.name for p in out.iterdir()) == ["important.txt"]
