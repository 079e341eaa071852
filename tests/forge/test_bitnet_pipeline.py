"""BitNet b1.58 end to end on a tiny llama trained here with the project's trainer: the straight-through
forward against the packed int8 forward and the formulas, the STE fine-tuning run (a supervised run), the
layer-wise revert, and the report against the Agent Forge plan's bars for a tiny model."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from aegis.errors import InvalidConfigError
from aegis.forge._bitnet_pack import absmax_int8, absmean_ternary, pack_ternary, unpack_ternary
from aegis.forge.bitnet import SIZE_CATEGORIES, PackedTernary, compress_model, load_packed
from aegis.forge.bitnet_pipeline import (
    ACCURACY_CRITICAL,
    REPORT_FILE,
    FinetuneSettings,
    compress_calibrated,
    relative_drop,
)
from aegis.forge.bitnet_train import BitLinear, BitNetModel
from tests.forge.conftest import read_folder
from tests.hf_folders import make_model_folder, write_sharegpt

SEQ = 64

# ----- the int8 activation / ternary linear against its formula ---------------------------------------------


@pytest.mark.parametrize("per_channel", [False, True])
def test_packed_linear_is_int8_activations_times_ternary_codes(per_channel):
    import jax.numpy as jnp

    from aegis.forge.bitnet import _register_once

    _register_once()
    rng = np.random.default_rng(0)
    w = rng.normal(0, 0.05, (24, 40)).astype(np.float32)
    x = rng.normal(0, 2, (3, 5, 40)).astype(np.float32)
    codes, gamma = absmean_ternary(w, per_channel=per_channel)
    lin = PackedTernary(jnp.asarray(pack_ternary(codes)), jnp.asarray(gamma), 40)
    got = np.asarray(lin.matmul(jnp.asarray(x), jnp.float32))
    # the paper's BitLinear: Q_a(x) = Clip(round(x * 127 / max|x|), -128, 127) per token, y = Q_a(x) W_q^T * s_x * gamma
    amax = np.maximum(np.abs(x).max(-1, keepdims=True), 1e-5)
    qx = np.clip(np.round(x * 127 / amax), -128, 127).astype(np.int64)
    want = (qx @ codes.T.astype(np.int64)) * (amax / 127) * gamma.reshape(-1)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    q, s = absmax_int8(x)
    np.testing.assert_array_equal(np.asarray(q), qx)


def test_bitlinear_forward_and_straight_through_gradients():
    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(1)
    w = jnp.asarray(rng.normal(0, 0.05, (16, 32)).astype(np.float32))
    x = jnp.asarray(rng.normal(0, 1, (4, 32)).astype(np.float32))
    c = jnp.asarray(rng.normal(0, 1, (4, 16)).astype(np.float32))
    codes, gamma = absmean_ternary(np.asarray(w))
    wq = codes * gamma[..., None]
    q, s = absmax_int8(x)
    xq = np.asarray(q, np.float32) * np.asarray(s)

    def loss(w, x, f):
        return jnp.sum(BitLinear(w, f).matmul(x, jnp.float32) * c)

    np.testing.assert_allclose(np.asarray(BitLinear(w, jnp.float32(1)).matmul(x, jnp.float32)), xq @ wq.T, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(BitLinear(w, jnp.float32(0)).matmul(x, jnp.float32)), np.asarray(x @ w.T), rtol=1e-6)
    gw, gx = jax.grad(loss, argnums=(0, 1))(w, x, jnp.float32(1))
    np.testing.assert_allclose(np.asarray(gw), np.asarray(c).T @ xq, rtol=1e-5, atol=1e-6)  # dL/dW_q, passed straight
    np.testing.assert_allclose(np.asarray(gx), np.asarray(c) @ wq, rtol=1e-5, atol=1e-6)
    half = np.asarray(BitLinear(w, jnp.float32(0.5)).matmul(x, jnp.float32))  # the warm-up's mix, both operands
    xm, wm = np.asarray(x) + 0.5 * (xq - np.asarray(x)), np.asarray(w) + 0.5 * (wq - np.asarray(w))
    np.testing.assert_allclose(half, xm @ wm.T, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("per_channel", [False, True])
def test_ste_model_equals_the_packed_forward_and_kept_layers_are_full_precision(tmp_path, per_channel):
    import jax

    from aegis.train.modeling import build_model
    from aegis.train.weights import load_checkpoint

    src = make_model_folder(tmp_path / "m", layers=3, seed=0)
    ids = np.array([[1, 5, 7, 9, 20, 30, 41, 2], [3, 3, 100, 200, 250, 17, 8, 9]], np.int32)
    model = build_model(json.loads((src / "config.json").read_text()))
    params = load_checkpoint(model, src)
    bm = BitNetModel(model, per_channel=per_channel)
    compress_model(src, tmp_path / "p", per_channel=per_channel)
    np.testing.assert_allclose(np.asarray(jax.jit(bm.apply)(params, ids)),
                               np.asarray(load_packed(tmp_path / "p").apply(ids)), atol=1e-5, rtol=0)
    compress_model(src, tmp_path / "k", per_channel=per_channel, keep_layers=(1,))
    np.testing.assert_allclose(np.asarray(jax.jit(bm.with_keep((1,)).apply)(params, ids)),
                               np.asarray(load_packed(tmp_path / "k").apply(ids)), atol=1e-5, rtol=0)
    fp = np.asarray(jax.jit(model.apply)(params, ids))
    np.testing.assert_array_equal(np.asarray(jax.jit(bm.with_keep((0, 1, 2)).apply)(params, ids)), fp)
    # lambda warm-up over 10 steps: full precision at step 0, quantised from step 10
    warm = BitNetModel(model, per_channel=per_channel, lambda_warmup_steps=10)
    at = jax.jit(lambda p, step: warm.at_step(step).apply(p, ids))
    np.testing.assert_array_equal(np.asarray(at(params, np.int32(0))), fp)
    np.testing.assert_allclose(np.asarray(at(params, np.int32(12))), np.asarray(jax.jit(bm.apply)(params, ids)), atol=1e-6)


# ----- a trained tiny model, compressed -------------------------------------------------------------------


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict[str, Path]:
    """A llama of hidden 128 and 4 layers (0.67M params, 'tiny'), trained 50 steps on a learnable chat set
    with the project's trainer and exported as an HF folder; its calibration data is a held-out file."""
    import jax

    from aegis.data.render import ChatRenderer
    from aegis.train.data import load_examples
    from aegis.schema import TrainConfig
    from aegis.train.export import export_trained
    from aegis.train.loop import Trainer
    from aegis.train.step import OptimizerSettings
    from aegis.train.weights import load_checkpoint

    root = tmp_path_factory.mktemp("bitnet-trained")
    init = make_model_folder(root / "init", hidden=128, layers=4, seed=0)
    train = write_sharegpt(root / "train.jsonl", n=256, seed=0)
    calib = write_sharegpt(root / "calib.jsonl", n=48, seed=1)
    examples, _ = load_examples(str(train), ChatRenderer.from_folder(init), seq_len=SEQ)
    trainer = Trainer(
        json.loads((init / "config.json").read_text()),
        TrainConfig(method="full", micro_batch_size=16, seq_len=SEQ, precision="fp32"),
        examples,
        optimizer=OptimizerSettings(learning_rate=3e-3, total_steps=50),
        load_params=lambda m, d: load_checkpoint(m, init, dtype=d),
        packing=False,
    )
    for _ in trainer.train(50):
        pass
    base = export_trained(trainer.model, jax.device_get(trainer.state.trainable), method="full", out=root / "base",
                          base=init, tokenizer=init)
    return {"root": root, "base": base, "train": train, "calib": calib}


def _torch_eval(folder: Path, calib: Path) -> tuple[float, float, int]:
    """(mean NLL, next-token accuracy, target tokens) over the calibration set's assistant tokens with transformers."""
    import torch
    from transformers import AutoModelForCausalLM

    from aegis.data.render import ChatRenderer
    from aegis.train.data import load_examples

    examples, _ = load_examples(str(calib), ChatRenderer.from_folder(folder), seq_len=SEQ)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    nll = correct = count = 0.0
    with torch.no_grad():
        for ex in examples:
            ids = torch.tensor(ex.input_ids[None].astype(np.int64))
            logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].double(), -1)
            tgt, m = ids[0, 1:], torch.tensor(ex.loss_mask[1:])
            nll += float(-(logp.gather(1, tgt[:, None])[:, 0] * m).sum())
            correct += float(((logp.argmax(-1) == tgt) & m).sum())
            count += float(m.sum())
    return nll / count, correct / count, int(count)


@pytest.mark.slow
def test_ste_run_recovers_the_drop_and_meets_the_tiny_targets(trained, tmp_path):
    rep = compress_calibrated(
        trained["base"], tmp_path / "packed", data=str(trained["calib"]), seq_len=SEQ, runs_dir=tmp_path / "runs",
        finetune=FinetuneSettings(data=str(trained["train"]), steps=40, lr=1e-3, micro_batch_size=16, seq_len=SEQ,
                                  steps_per_window=20),
    )
    print(rep.summary())
    st = rep.stages
    # the eval is transformers' on the same rendered rows
    nll, acc, count = _torch_eval(trained["base"], trained["calib"])
    assert st["full_precision"].nll == pytest.approx(nll, rel=1e-4) and st["full_precision"].accuracy == pytest.approx(acc)
    assert rep.calibration_examples == 48 and st["full_precision"].tokens == count
    # size read at run time: transformers' parameter count, the plan's tiny category and its 6x target
    from transformers import AutoModelForCausalLM

    assert rep.total_params == AutoModelForCausalLM.from_pretrained(trained["base"]).num_parameters()
    assert rep.size_category == "tiny" and rep.compression.target_compression == SIZE_CATEGORIES["tiny"].target_compression
    # ratio and sparsity from the files themselves
    orig, out = read_folder(trained["base"]), read_folder(tmp_path / "packed")
    assert rep.compression.total_compression == pytest.approx(
        sum(a.nbytes for a in orig.values()) / sum(a.nbytes for a in out.values()))
    assert rep.compression.total_compression >= 0.8 * 6.0  # the plan's "low compression" check
    codes = [unpack_ternary(out[n + ".ternary"], orig[n].shape[-1]) for n in rep.compression.packed]
    zeros = sum(int((c == 0).sum()) for c in codes)
    assert rep.compression.sparsity == pytest.approx(zeros / sum(c.size for c in codes))
    assert 0.0 < rep.compression.sparsity < 1.0
    # quantising hurts; STE fine-tuning recovers (eval after STE better than right after quantisation)
    assert st["quantized"].accuracy < st["full_precision"].accuracy and st["quantized"].nll > st["full_precision"].nll
    assert st["after_ste"].accuracy > st["quantized"].accuracy and st["after_ste"].nll < st["quantized"].nll
    # the final (packed) model is within the plan's 10 % accuracy bar
    assert rep.drops["final"] == relative_drop(st["full_precision"], st["final"])
    assert rep.drops["final"] <= ACCURACY_CRITICAL and rep.accuracy_verdict in ("ok", "warning")
    assert rep.reverted_layers == () and rep.layer_decisions == ()
    # the packed folder's forward is the STE model's eval (same quantisers)
    assert st["final"].nll == pytest.approx(st["after_ste"].nll, rel=1e-4)
    # a supervised run: checkpoints, events, the quantize section in its config, the export that was packed
    run = tmp_path / "runs" / rep.run_id
    assert json.loads((run / "config.json").read_text())["quantize"]["method"] == "bitnet_b158"
    assert sorted(int(p.name) for p in (run / "checkpoints").iterdir() if p.name.isdigit())[-1] == 40
    events = [json.loads(line)["kind"] for line in (run / "events.jsonl").read_text().splitlines()]
    assert "completed" in events and "exported" in events
    saved = json.loads((tmp_path / "packed" / REPORT_FILE).read_text())
    assert saved["stages"]["after_ste"]["accuracy"] == st["after_ste"].accuracy


@pytest.mark.slow
def test_layerwise_revert_keeps_the_layers_that_cost_too_much(trained, tmp_path):
    max_drop = 0.05
    rep = compress_calibrated(trained["base"], tmp_path / "p", data=str(trained["calib"]), seq_len=SEQ, max_drop=max_drop)
    print(rep.summary())
    assert rep.drops["quantized"] > max_drop  # all layers ternary: over the threshold, so the revert ran
    assert [d.layer for d in rep.layer_decisions] == [0, 1, 2, 3]
    for d in rep.layer_decisions:
        assert d.reverted == (d.drop > max_drop)
    reverted = tuple(d.layer for d in rep.layer_decisions if d.reverted)
    assert reverted and rep.reverted_layers == reverted and len(reverted) < 4
    for i in range(4):
        in_fp = f"model.layers.{i}.mlp.down_proj.weight" in rep.compression.preserved
        assert in_fp == (i in reverted)
    accepted = [d for d in rep.layer_decisions if not d.reverted]
    assert rep.drops["final"] == pytest.approx(accepted[-1].drop, abs=2e-3) and rep.drops["final"] <= max_drop + 2e-3
    with pytest.raises(InvalidConfigError, match="every layer"):
        compress_calibrated(trained["base"], tmp_path / "q", data=str(trained["calib"]), seq_len=SEQ, max_drop=-1.0)


def test_run_config_quantize_key():
    from aegis.supervise.run_config import parse_run_config

    base = {"model": "tiny-llama", "data": "toy"}
    cfg = parse_run_config(base | {"quantize": "bitnet_b158"})
    assert cfg.quantize is not None and cfg.quantize.method == "bitnet_b158" and cfg.quantize.activations == "int8"
    cfg = parse_run_config(base | {"quantize": {"per_channel": True, "lambda_warmup_steps": 100}})
    assert cfg.quantize.per_channel and cfg.quantize.lambda_warmup_steps == 100
    with pytest.raises(InvalidConfigError, match="lambda_warmup"):
        parse_run_config(base | {"quantize": {"lamda_warmup_steps": 100}})
    with pytest.raises(InvalidConfigError, match="quantize"):
        parse_run_config(base | {"quantize": "gptq"})


@pytest.mark.slow
def test_aegis_compress_with_calibration_data(trained, tmp_path):
    import typer
    from typer.testing import CliRunner

    from aegis.cli.forge import compress

    app = typer.Typer()
    app.command("compress")(compress)
    app.command("noop")(lambda: None)
    base, calib = str(trained["base"]), str(trained["calib"])
    res = CliRunner().invoke(app, ["compress", base, str(tmp_path / "p"), "--data", calib, "--samples", "16",
                                   "--seq-len", str(SEQ), "--no-revert"])
    assert res.exit_code == 0, res.output
    assert "full_precision" in res.output and "quantized" in res.output and "ternary" in res.output
    saved = json.loads((tmp_path / "p" / REPORT_FILE).read_text())
    assert saved["calibration_examples"] == 16 and saved["layer_decisions"] == []
    res = CliRunner().invoke(app, ["compress", base, str(tmp_path / "q"), "--finetune-steps", "5"])
    assert res.exit_code == 2 and "need --data" in res.output
    res = CliRunner().invoke(app, ["compress", base, str(tmp_path / "q"), "--data", calib, "--metric", "bleu"])
    assert res.exit_code == 2 and "--metric" in res.output


@pytest.mark.slow
def test_ste_run_survives_kill_9_and_resumes_to_the_same_weights(trained, tmp_path):
    """A `quantize: bitnet_b158` run killed with SIGKILL mid-run resumes from its checkpoint (the quantised
    forward included) and ends with the weights of the same run left alone."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import yaml

    from aegis.supervise import Supervisor
    from aegis.supervise.events import read_jsonl
    from safetensors.numpy import load_file

    def config(run_id: str) -> Path:
        cfg = {
            "run_id": run_id, "model": str(trained["base"]), "data": str(trained["train"]), "quantize": "bitnet_b158",
            "train_config": {"method": "full", "micro_batch_size": 16, "seq_len": SEQ, "precision": "fp32"},
            "training": {"total_steps": 30, "steps_per_window": 10, "lr": 1e-3},
            "checkpoints": {"interval": 5, "async": False}, "curriculum": {"eval_interval": 100000},
        }
        path = tmp_path / f"{run_id}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        return path

    runs = tmp_path / "runs"

    def launch(run_id: str) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-m", "aegis.cli.supervised", "run", "--config", str(config(run_id)), "--quiet"],
            env={**os.environ, "AEGIS_RUNS_DIR": str(runs)}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )

    def max_step(run_id: str) -> int:
        path = runs / run_id / "metrics.jsonl"
        return max((r["step"] for r in read_jsonl(path)), default=0) if path.exists() else 0

    whole = launch("whole")
    assert whole.wait(timeout=600) == 0, whole.stderr.read().decode()[-2000:]
    killed = launch("killed")
    deadline = time.monotonic() + 600
    while max_step("killed") < 17:
        assert killed.poll() is None, killed.stderr.read().decode()[-2000:]
        assert time.monotonic() < deadline, "the run did not reach step 17"
        time.sleep(0.01)
    os.kill(killed.pid, signal.SIGKILL)
    killed.wait()
    assert max_step("killed") < 30
    out = Supervisor(runs).resume("killed")
    assert out.status == "completed" and out.step == 30
    assert "process_resumed" in [e.kind for e in Supervisor(runs).events("killed")]
    a = load_file(runs / "whole" / "export" / "model.safetensors")
    b = load_file(runs / "killed" / "export" / "model.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_allclose(b[k], a[k], rtol=0, atol=1e-6, err_msg=k)
    base = load_file(trained["base"] / "model.safetensors")
    assert not np.allclose(a["model.layers.0.mlp.down_proj.weight"], base["model.layers.0.mlp.down_proj.weight"])
