"""Forge phase 4 on Cognate models: the ternary-aware (straight-through) forward equals the packed folder as
``aegis generate`` serves it, and fine-tuning through it brings the packed model closer to the full-precision one
than packing alone."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.forge.conftest import random_cognate_params

jax = pytest.importorskip("jax")


def _cfg(vocab: int, **over):
    from aegis.forge.cognate.hyperparams import CognateConfig

    base = {"vocab_size": vocab, "hidden_size": 32, "num_layers": 2, "num_heads": 2, "intermediate_size": 64,
            "num_persistent": 2, "window": 16, "memory_dim": 8, "ltm_slots": 16, "memory_chunk": 8, "max_passes": 2}
    return CognateConfig(**{**base, **over})




def test_ternary_forward_at_lambda_one_equals_the_served_packed_model(tmp_path):
    """TernaryCognate's forward (lambda = 1) vs the packed folder loaded as `aegis generate` loads it (float32
    scales): the same logits within 1e-4 (the STE's forward value is w + (q - w) in float32, one rounding from q)
    at every position. The tensors the forward quantises are exactly those the packer stores ternary, with equal
    values, per tensor and per channel, with a kept layer left in full precision in both. At lambda = 0 the forward
    is the full-precision model's; the gradient goes straight through the quantiser."""
    import jax.numpy as jnp
    from aegis.forge.bitnet import compress_model, load_packed
    from aegis.forge.cognate.engine import build_cognate
    from aegis.forge.cognate.hf_folder import save_pretrained
    from aegis.forge.cognate.model import to_flat
    from aegis.forge.cognate.ternary import TernaryCognate, ternary_targets
    from aegis.forge.generate import _engine

    cfg = _cfg(48)
    params = random_cognate_params(cfg, 0)
    src = save_pretrained(params, cfg, tmp_path / "fp")
    model = build_cognate(json.loads((Path(src) / "config.json").read_text()))
    for per_channel, keep in ((True, (-1,)), (False, ())):  # weights: the packer's and the forward's are equal
        r = compress_model(src, tmp_path / f"packed{per_channel}", per_channel=per_channel, keep_layers=keep)
        targets = ternary_targets(cfg, keep)
        assert sorted(f"model.layers.{i}.{k}" for k, on in targets.items() for i in np.flatnonzero(on)) == \
            sorted(r.packed)
        view = to_flat(jax.jit(TernaryCognate(model, per_channel=per_channel, keep_layers=keep).view)(params))
        stored = to_flat(load_packed(tmp_path / f"packed{per_channel}").params)
        for name in stored:
            np.testing.assert_allclose(np.asarray(view[name]), np.asarray(stored[name]), rtol=0, atol=1e-6,
                                       err_msg=name)
    assert {"q_proj.weight", "memory.w1", "memory.lr_proj.weight", "down_proj.weight"} <= set(targets)
    assert np.abs(np.asarray(view["model.layers.1.q_proj.weight"]) - np.asarray(to_flat(params)[
        "model.layers.1.q_proj.weight"])).max() > 1e-3  # quantised: the comparison can fail

    served_model, served, kind = _engine(tmp_path / "packedFalse")  # what `aegis generate` runs
    assert kind == "packed ternary"
    ids = jnp.asarray(np.random.default_rng(1).integers(0, 48, (3, 21)), jnp.int32)
    fwd = jax.jit(model.apply)  # one compiled forward, the served model's config: TernaryCognate.apply is
    student = TernaryCognate(model)  # inner.apply(view(params)), so each side is that forward on its params
    assert served_model.cfg == model.cfg
    got, want = np.asarray(fwd(jax.jit(student.view)(params), ids)), np.asarray(fwd(served, ids))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)
    full = np.asarray(fwd(params, ids))
    assert np.abs(full - want).max() > 1e-2  # packing does change the model
    off = jax.jit(TernaryCognate(model, lam=0.0).view)(params)
    np.testing.assert_allclose(np.asarray(fwd(off, ids)), full, atol=1e-6)
    g = jax.jit(jax.grad(lambda p: jnp.sum(student.view(p)["layers"]["q_proj.weight"] * 3.0)))(params)
    np.testing.assert_array_equal(np.asarray(g["layers"]["q_proj.weight"]), 3.0)


def _phase3_folder(tmp_path: Path, rows, **over) -> Path:
    """A stand-in for phase 3's output: a random tiny Cognate with the thinking tokens and its tokenizer, as
    run_quietstar writes them (without the mixing head: the thought scorer's compile is the pipeline's to pay)."""
    from aegis.forge.cognate.corpus import train_tokenizer
    from aegis.forge.cognate.engine import build_cognate
    from aegis.forge.quietstar.reasoning_data import add_thinking_tokens

    tok = train_tokenizer({"parity": [r.prompt + r.reasoning + r.answer for r in rows]}, vocab_size=300)
    cfg = _cfg(len(tok), **over)
    model = build_cognate({"model_type": "cognate", **cfg.model_dump()})
    model, params, _ = add_thinking_tokens(model, random_cognate_params(cfg, 3), tok)
    folder = tmp_path / "phase3"
    folder.mkdir()
    model.save(params, folder, tokenizer=tok)
    return folder


@pytest.mark.slow
def test_qat_brings_the_packed_model_closer_to_phase3_than_packing_alone_and_resumes(tmp_path, monkeypatch):
    """Measured on the held-out rows, both packed models loaded as `aegis generate` serves them: after 30
    straight-through steps of distillation (KL to the full-precision model; the stand-in phase-3 model is random,
    so the task's CE, which the pipeline adds, is switched off here) the packed model agrees with the full-precision
    one on more next-token predictions and its KL is lower than packing alone gives. The trained forward at
    lambda = 1 equals the served folder. Killed at step 20 and re-run, it resumes from the step-20 checkpoint."""
    from aegis.forge.bitnet import load_packed
    from aegis.forge.cognate import ternary
    from aegis.forge.cognate.ternary import Phase4Settings, run_phase4
    from aegis.forge.quietstar import parity_rows

    rows = parity_rows(64, bits=6)
    src = _phase3_folder(tmp_path, rows, num_layers=1)
    settings = Phase4Settings(steps=30, lr=3e-3, warmup=5, batch_size=8, save_every=10, ce_coef=0.0)

    real_save = ternary._save_state

    def kill_at_20(path, st):
        real_save(path, st)
        if st["step"] == 20:
            raise KeyboardInterrupt

    monkeypatch.setattr(ternary, "_save_state", kill_at_20)
    with pytest.raises(KeyboardInterrupt):
        run_phase4(src, rows, tmp_path / "p4", settings)
    monkeypatch.setattr(ternary, "_save_state", real_save)
    logs: list[str] = []
    report = run_phase4(src, rows, tmp_path / "p4", settings, log=logs.append)
    assert report["training"]["resumed_from_step"] == 20 and any("resuming" in s for s in logs)
    q = report["quality"]
    base, qat = q["compress_only"], q["qat"]
    assert qat["top1_agreement"] > base["top1_agreement"], q
    assert qat["kl_to_phase3"] < base["kl_to_phase3"], q
    assert report["chance"] == 0.5 and report["held_out_rows"] == 16 and "top1_agreement_scored" in qat
    check = report["training"]["trained_forward_vs_served"]
    assert check["max_abs_logprob_diff"] < 1e-4 and check["top1_agreement"] == 1.0
    packed = load_packed(tmp_path / "p4" / "model")
    assert packed.meta["format"] == "aegis-bitnet-b1.58" and not (tmp_path / "p4" / "compress_only").exists()
    md = (tmp_path / "p4" / "report.md").read_text()
    assert "compress only" in md and "ternary-aware" in md
