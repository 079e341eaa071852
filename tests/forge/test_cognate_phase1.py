"""Phase 1 (`aegis cognate`): config errors are one line; variants resume after a kill; the diversity checks use the
seed's thresholds and retrain with a changed seed when they fail. Training and measuring are replaced by scripted
fakes (the architecture's numerics are tests/forge/test_cognate.py's); one slow test trains a micro config for real."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from aegis.errors import AegisError, DatasetError

MICRO = {"model": {"hidden_size": 16, "num_layers": 1, "num_heads": 2, "intermediate_size": 32, "num_persistent": 2,
                   "window": 8, "memory_dim": 4, "memory_chunk": 4, "max_passes": 2, "vocab_size": 300},
         "train": {"steps": 3, "batch_size": 2, "seq_len": 12, "warmup_steps": 1, "eval_rows": 2}}


def _main(*args):
    return CliRunner().invoke(_app(), list(args))


def _app():
    import typer

    from aegis.cli.forge import cognate

    app = typer.Typer()
    app.command("cognate")(cognate)
    app.command("other")(lambda: None)
    return app


def test_help_and_usage():
    r = _main("cognate", "--help")
    assert r.exit_code == 0 and "--tiny" in r.output
    r = _main("cognate", "only-out")
    assert r.exit_code == 2 and r.output.strip().count("\n") == 0 and "aegis cognate --tiny OUT" in r.output


@pytest.mark.parametrize("text, words", [
    ("variants: 3\n", "variants"),
    ("bogus: 1\n", "bogus"),
    ("train: {steps: -1}\n", "train.steps"),
    ("variants:\n - {name: a, act_threshold: 0.9, ltm_slots: 8, seed: 1, mix: {math: 1}}\n"
     " - {name: a, act_threshold: 0.9, ltm_slots: 8, seed: 2, mix: {math: 1}}\n", "repeat"),
    ("model: {hidden_size: 30, num_heads: 4}\n", "hidden_size"),
    ("[unclosed\n", "not YAML"),
])
def test_bad_configs_are_one_line(tmp_path, text, words):
    cfg = tmp_path / "p1.yml"
    cfg.write_text(text)
    r = _main("cognate", str(cfg), str(tmp_path / "out"))
    assert r.exit_code == 2, r.output
    assert r.output.startswith("error: ") and r.output.strip().count("\n") == 0 and words in r.output
    assert not (tmp_path / "out").exists()


def test_data_errors_are_one_line(tmp_path):
    from aegis.forge.cognate.corpus import read_categories

    with pytest.raises(DatasetError, match="no such file"):
        read_categories({"math": [tmp_path / "missing.jsonl"]})
    bad = tmp_path / "x.jsonl"
    bad.write_text('{"text": "a"}\nnot json\n')
    with pytest.raises(DatasetError, match="line 2"):
        read_categories({"math": [bad]})
    with pytest.raises(DatasetError, match="unknown data category"):
        read_categories({"poetry": [bad]})


def test_bundled_data_and_parquet_rows(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    from aegis.forge.cognate.corpus import CATEGORIES, read_categories

    texts = read_categories(None)
    assert set(texts) == set(CATEGORIES) and all(len(t) >= 40 for t in texts.values())
    pq.write_table(pa.table({"question": ["2 + 2?"], "answer": ["4"]}), tmp_path / "m.parquet")
    assert read_categories({"math": [tmp_path / "m.parquet"]}) == {"math": ["2 + 2?\n4"]}


def test_csv_files_dataset_folders_and_uncached_hub_ids(tmp_path, monkeypatch):
    """Phase 1 reads through the one dataset reader (`aegis.data.reading.iter_records`): CSV, a local dataset folder
    (`datasets.load_dataset`, the path a cached Hub id takes), and a Hub id that is not cached is one line."""
    datasets = pytest.importorskip("datasets")
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    from aegis.errors import OfflineError
    from aegis.forge.cognate.corpus import read_categories

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")
    (tmp_path / "qa.csv").write_text("question,answer\nWho wrote Hamlet?,Shakespeare\n")
    folder = tmp_path / "code-set"
    folder.mkdir()
    pq.write_table(pa.table({"prompt": ["add two numbers", "reverse a list"], "code": ["a + b", "xs[::-1]"]}),
                   folder / "train.parquet")
    texts = read_categories({"qa": [str(tmp_path / "qa.csv")], "code": [str(folder)]})
    assert texts == {"qa": ["Who wrote Hamlet?\nShakespeare"], "code": ["add two numbers\na + b", "reverse a list\nxs[::-1]"]}
    with pytest.raises(OfflineError, match="not in the local cache"):
        read_categories({"math": ["aegis-test/definitely-not-cached"]})


def test_diversity_uses_the_seeds_thresholds():
    from aegis.forge.cognate.phase1 import Diversity, _diversity

    ok = [{"halting_steps": 1.0, "memory_usage": 0.1, "latency_ms": 40.0},
          {"halting_steps": 3.5, "memory_usage": 0.5, "latency_ms": 60.0},
          {"halting_steps": 2.0, "memory_usage": 0.3, "latency_ms": 45.0}]
    checks, failed = _diversity(ok, Diversity())
    assert not failed and checks["halting_steps"]["spread"] == 2.5
    close = [dict(m, memory_usage=0.2 + i * 0.1) for i, m in enumerate(ok)]  # spread 0.2 <= 0.3
    checks, failed = _diversity(close, Diversity())
    assert failed == ["memory_usage spread 0.2 <= 0.3"] and not checks["memory_usage"]["passed"]


@pytest.fixture
def fake_training(monkeypatch):
    """_train_variant -> the initial parameters; _measure -> metrics scripted per (variant, seed)."""
    import numpy as np

    from aegis.forge.cognate import phase1
    from aegis.forge.cognate.hyperparams import param_shapes

    calls: list[tuple[str, int]] = []
    spread = {"reasoning": 1.0, "memory": 3.5, "speed": 2.0}

    def train(v, seed, cfg, p1, streams, work, log):
        calls.append((v.name, seed))
        shapes = param_shapes(cfg)
        params = {k: np.zeros(s, np.float32) for k, s in shapes.items() if not k.startswith("model.layers.")}
        params["layers"] = {k[len("model.layers.0."):]: np.zeros((cfg.num_layers, *s), np.float32)
                            for k, s in shapes.items() if k.startswith("model.layers.0.")}
        return params, [{"stage": s.name} for s in p1.curriculum]

    def measure(params, cfg, ids):
        name = {0.95: "reasoning", 0.90: "memory", 0.99: "speed"}[cfg.act_threshold]
        seed = calls[-1][1] if calls else 0
        moved = seed >= 1000  # a retrained variant moves away from the others
        h = spread[name] + (2.0 if moved else 0.0)
        return {"perplexity": 10.0, "halting_steps": h, "ponder": h, "memory_usage": 0.15 * h,
                "latency_ms": 30.0 + 10 * h}

    monkeypatch.setattr(phase1, "_train_variant", train)
    monkeypatch.setattr(phase1, "_measure", measure)
    return calls


def test_phase1_writes_three_folders_and_resumes_without_retraining(tmp_path, fake_training):
    from aegis.forge.cognate import run_phase1

    out = tmp_path / "p1"
    folders = run_phase1(MICRO, out, tiny=True)
    assert [f.name for f in folders] == ["reasoning", "memory", "speed"]
    for f in folders:
        report = json.loads((f / "report.json").read_text())
        assert report["complete"] and (f / "model.safetensors").is_file() and (f / "modeling_cognate.py").is_file()
        assert json.loads((f / "config.json").read_text())["ltm_slots"] == report["ltm_slots"]
    assert [c[1] for c in fake_training] == [42, 43, 44]
    summary = json.loads((out / "report.json").read_text())
    assert summary["diversity"]["halting_steps"]["threshold"] == 2.0 and (out / "report.md").is_file()
    before = {f: (f / "model.safetensors").stat().st_mtime_ns for f in folders}
    fake_training.clear()
    import shutil

    shutil.rmtree(folders[2])  # killed before its folder was published
    again = run_phase1(MICRO, out, tiny=True)
    assert again == folders and fake_training == [("speed", 44)]
    assert all((f / "model.safetensors").stat().st_mtime_ns == before[f] for f in folders[:2])


def test_failed_diversity_retrains_the_closest_variant_with_a_new_seed(tmp_path, fake_training):
    from aegis.forge.cognate import run_phase1

    cfg = {**MICRO, "diversity": {"min_halting_spread": 2.6, "retries": 1}}  # 3.5 - 1.0 = 2.5 fails
    run_phase1(cfg, tmp_path / "p1", tiny=True)
    summary = json.loads((tmp_path / "p1" / "report.json").read_text())
    assert fake_training[-1] == ("speed", 1044)  # the middle one (halting 2.0) is retrained
    assert summary["retries"][0]["variant"] == "speed" and summary["diversity"]["halting_steps"]["passed"]
    assert not [w for w in summary["warnings"] if "diversity check failed" in w]
    run_phase1({**MICRO, "diversity": {"min_halting_spread": 9.0, "retries": 0}}, tmp_path / "p2", tiny=True)
    warned = json.loads((tmp_path / "p2" / "report.json").read_text())["warnings"]
    assert any("halting_steps spread" in w for w in warned)


def test_another_config_in_the_same_folder_is_refused(tmp_path, fake_training):
    from aegis.forge.cognate import run_phase1

    run_phase1(MICRO, tmp_path / "p1", tiny=True)
    with pytest.raises(AegisError, match="another config"):
        run_phase1({**MICRO, "train": {**MICRO["train"], "steps": 4}}, tmp_path / "p1", tiny=True)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    with pytest.raises(AegisError, match="not empty"):
        run_phase1(MICRO, tmp_path / "mine", tiny=True)


@pytest.mark.slow
def test_micro_phase1_trains_for_real_and_loads_in_transformers(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from aegis.forge.cognate import run_phase1

    cfg = {**MICRO, "variants": [
        {"name": "a", "act_threshold": 0.9, "ltm_slots": 8, "seed": 1, "mix": {"math": 1.0, "qa": 1.0}},
        {"name": "b", "act_threshold": 0.99, "ltm_slots": 16, "seed": 2, "mix": {"code": 1.0, "language": 1.0}}]}
    lines: list[str] = []
    folders = run_phase1(cfg, tmp_path / "p1", tiny=True, log=lines.append)
    assert any("stage foundation" in line for line in lines)
    report = json.loads((folders[1] / "report.json").read_text())
    assert [s["stage"] for s in report["curriculum"]] == ["foundation", "reasoning", "advanced"]
    model = transformers.AutoModelForCausalLM.from_pretrained(folders[1], trust_remote_code=True)
    tok = transformers.AutoTokenizer.from_pretrained(folders[1])
    ids = tok("The answer is", return_tensors="pt")["input_ids"]
    assert model.generate(ids, max_new_tokens=3, do_sample=False).shape[1] == ids.shape[1] + 3


def _layer0_max_logits(params, cfg, ids):
    """Layer 0's largest pre-softmax attention logit per head on the first pass, in numpy float64 from the weights
    (that layer's input is [persistent || embeddings]: no attention weight feeds it)."""
    import numpy as np

    f = lambda t: np.asarray(t, np.float64)  # noqa: E731
    lp = {k: f(v[0]) for k, v in params["layers"].items()}
    b, t = ids.shape
    d, nh, hd, p = cfg.hidden_size, cfg.num_heads, cfg.head_dim, cfg.num_persistent
    emb = f(params["model.embed_tokens.weight"])[ids]
    h = np.concatenate([np.broadcast_to(f(params["model.persistent"]), (b, p, d)), emb], 1)
    xn = h / np.sqrt((h * h).mean(-1, keepdims=True) + cfg.rms_norm_eps) * lp["attn_norm.weight"]
    inv = 1.0 / cfg.rope_theta ** (np.arange(0, hd, 2) / hd)
    ang = np.arange(p + t)[:, None] * inv[None]
    cos, sin = np.cos(np.concatenate([ang, ang], -1))[:, None], np.sin(np.concatenate([ang, ang], -1))[:, None]

    def rope(x):
        return x * cos + np.concatenate([-x[..., hd // 2:], x[..., : hd // 2]], -1) * sin

    q = rope((xn @ lp["q_proj.weight"].T).reshape(b, p + t, nh, hd))
    k = rope((xn @ lp["k_proj.weight"].T).reshape(b, p + t, nh, hd))
    scores = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(hd)
    i, j = np.arange(p + t)[:, None], np.arange(p + t)[None]
    seen = (j < p) | ((j <= i) & (i - j < cfg.window))
    return np.where(seen, scores, -np.inf).max(axis=(0, 2, 3))


@pytest.mark.slow  # compiles a Cognate train step (~12 s of CPU)
def test_qk_clip_in_cognate_training_caps_a_forced_large_logit_at_tau():
    """MuonClip inside phase 1's step: a head forced to a large logit has W_q and W_k scaled by sqrt(tau/max) after
    the step, so its largest logit, recomputed from the new weights in numpy, is tau (at learning rate 0: exactly,
    the other heads untouched; after a real update: within the update's change, where unclipped it would stay ~60x
    tau)."""
    import numpy as np

    from aegis.forge.cognate import phase1
    from aegis.forge.cognate.hyperparams import CognateConfig, param_shapes
    from aegis.forge.cognate.model import from_flat

    cfg = CognateConfig(**{**MICRO["model"], "max_passes": 1})  # one layer, one pass: its max is layer 0's
    rng = np.random.default_rng(0)  # numpy: an eager init_params dispatches ~50 small programs
    flat = {n: np.full(shape, 1.0, np.float32) if n.endswith("norm.weight")
            else (0.02 * rng.standard_normal(shape)).astype(np.float32) for n, shape in param_shapes(cfg).items()}
    params = from_flat(flat, cfg)
    hd = cfg.head_dim
    layers = dict(params["layers"])
    for name in ("q_proj.weight", "k_proj.weight"):  # head 1: 60x the rows of W_q and W_k -> 3600x its logits (0.02 -> 63)
        layers[name] = layers[name].at[:, hd: 2 * hd].multiply(60.0)
    params = {**params, "layers": layers}
    ids = np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 12)).astype(np.int32)
    before = _layer0_max_logits(params, cfg, ids)
    tau = 1.0
    assert before[1] > 40 * tau and before[0] < tau, before  # head 1 far over tau, head 0 under
    tx, step = phase1._train_step(cfg, phase1.TrainSettings(qk_clip_tau=tau))
    for lr in (0.0, 3e-3):  # one compiled step (the learning rate is an argument)
        new, _, metrics = step(params, tx.init(params), ids, np.float32(0.95), np.float32(lr))
        # the forward's statistic is the independent one
        np.testing.assert_allclose(np.asarray(metrics["max_logits"])[0], before, rtol=1e-4)
        assert int(metrics["clipped_heads"]) == 1
        after = _layer0_max_logits(new, cfg, ids)
        if lr == 0.0:
            np.testing.assert_allclose(after[1], tau, rtol=1e-4)
            np.testing.assert_allclose(after[0], before[0], rtol=1e-5)
            factor = np.sqrt(tau / before[1])
            for name in ("q_proj.weight", "k_proj.weight"):
                w0, w1 = np.asarray(params["layers"][name][0]), np.asarray(new["layers"][name][0])
                np.testing.assert_allclose(w1[hd: 2 * hd], w0[hd: 2 * hd] * factor, rtol=1e-5)
                np.testing.assert_array_equal(w1[:hd], w0[:hd])
        else:
            assert after[1] <= tau * 1.01, (after, before)
