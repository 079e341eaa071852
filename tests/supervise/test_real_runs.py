"""Real fine-tuning runs: a transformers model folder with its own BPE tokenizer and chat template, ShareGPT /
Alpaca / messages data, `aegis run --config` through the CLI, and exports that transformers and PEFT load.

The references are transformers (the assistant-token loss it computes on the data, its logits on the export)
and a plain PEFT + torch training loop on the same examples (the LoRA loss drop to match).
"""

from __future__ import annotations

import json
import math
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from aegis.supervise.events import read_jsonl
from tests.hf_folders import CHATML, CHATML_GENERATION, make_model_folder, write_alpaca, write_messages, write_sharegpt

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

TRAINING = {"steps_per_window": 40, "total_steps": 120, "lr": 1.0e-2, "warmup_steps": 10, "min_lr_ratio": 0.1}
LORA_TRAINING = {**TRAINING, "steps_per_window": 30, "total_steps": 60}
"""The LoRA run and its PEFT reference: half the full fine-tune's steps (both loops train the same 60 steps)."""


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return make_model_folder(tmp_path_factory.mktemp("model") / "tiny-support", template=CHATML)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("data")
    return {
        "sharegpt": write_sharegpt(d / "sharegpt.jsonl", n=128),
        "alpaca": write_alpaca(d / "alpaca.jsonl", n=128),
        "messages": write_messages(d / "messages.jsonl", n=64),
    }


def _run(tmp_path: Path, run_id: str, cfg: dict) -> Path:
    from aegis.cli.supervised import app

    (tmp_path / f"{run_id}.yaml").write_text(yaml.safe_dump(cfg))
    runs = tmp_path / "runs"
    res = CliRunner().invoke(
        app, ["run", "--config", str(tmp_path / f"{run_id}.yaml"), "--run-id", run_id, "--runs-dir", str(runs), "-q"]
    )
    assert res.exit_code == 0, res.output
    return runs / run_id


def _examples(folder: Path, data: Path, seq_len: int = 64) -> list:
    from aegis.data.render import ChatRenderer
    from aegis.train.data import load_examples

    return load_examples(str(data), ChatRenderer.from_folder(folder), seq_len=seq_len)[0]


def _assistant_loss(model, examples) -> float:
    """transformers' own loss (labels = input ids on assistant tokens, -100 elsewhere), token-weighted."""
    total, count = 0.0, 0
    with torch.no_grad():
        for ex in examples:
            ids = torch.tensor(ex.input_ids, dtype=torch.long)[None]
            labels = torch.where(torch.tensor(ex.loss_mask), ids[0], -100)[None]
            n = int((labels[0, 1:] != -100).sum())
            total += model(ids, labels=labels).loss.item() * n
            count += n
    return total / count


def _hf(folder: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def _peft_reference_drop(folder: Path, examples, *, lr: float, steps: int, rank: int, alpha: float) -> float:
    """A plain PEFT + torch loop with the run's optimizer, schedule, clip and batch: its loss drop."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    model = get_peft_model(_hf(folder), LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0, target_modules=[
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
    before = _assistant_loss(model, examples)
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)
    warm = TRAINING["warmup_steps"]

    def factor(s: int) -> float:
        if s < warm:
            return s / warm
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (s - warm) / (steps - warm)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
    rng, order = random.Random(0), []
    for _ in range(steps):
        if len(order) < 8:
            order += rng.sample(range(len(examples)), len(examples))
        rows, order = [examples[i] for i in order[:8]], order[8:]
        width = max(len(e.input_ids) for e in rows)
        ids = torch.zeros(8, width, dtype=torch.long)
        att = torch.zeros(8, width, dtype=torch.long)
        labels = torch.full((8, width), -100)
        for r, e in enumerate(rows):
            n = len(e.input_ids)
            ids[r, :n] = torch.tensor(e.input_ids, dtype=torch.long)
            att[r, :n] = 1
            labels[r, :n] = torch.where(torch.tensor(e.loss_mask), ids[r, :n], -100)
        model(ids, attention_mask=att, labels=labels).loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad()
    model.eval()
    return 1 - _assistant_loss(model, examples) / before


def _jax_logits(folder: Path, export: Path, ids: np.ndarray) -> np.ndarray:
    import jax
    import jax.numpy as jnp

    from aegis.train.modeling import build_model
    from aegis.train.weights import load_checkpoint, load_lora_adapter

    config = json.loads((folder / "config.json").read_text())
    model = build_model(config, dtype=jnp.float32, param_dtype=jnp.float32)
    params = load_checkpoint(model, folder, dtype=jnp.float32)
    lora = load_lora_adapter(model, export) if (export / "adapter_config.json").exists() else None
    if lora is None:
        params = load_checkpoint(model, export, dtype=jnp.float32)
    return np.asarray(jax.jit(model.apply)(params, jnp.asarray(ids[None]), lora=lora))[0]


@pytest.mark.slow
def test_lora_on_sharegpt_exports_a_peft_adapter_that_peft_loads_and_matches(tmp_path, folder, data):
    from peft import PeftModel

    cfg = {
        "model": str(folder), "data": str(data["sharegpt"]), "training": LORA_TRAINING,
        "train_config": {"method": "lora", "micro_batch_size": 8, "seq_len": 64, "precision": "fp32",
                         "lora": {"rank": 8, "alpha": 16}},
    }
    run = _run(tmp_path, "lora", cfg)
    export = run / "export"
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json"} <= {p.name for p in export.iterdir()}
    source = json.loads((run / "source.json").read_text())
    assert source["folder"] == str(folder.resolve()) and source["init"] == "pretrained"
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    loaded = next(e for e in events if e["kind"] == "data_loaded")["data"]
    assert loaded["format"] == "sharegpt" and loaded["examples"] == 128

    examples = _examples(folder, data["sharegpt"])
    before = _assistant_loss(_hf(folder), examples)
    tuned = PeftModel.from_pretrained(_hf(folder), export).eval()
    drop = 1 - _assistant_loss(tuned, examples) / before
    reference = _peft_reference_drop(folder, examples, lr=LORA_TRAINING["lr"], steps=LORA_TRAINING["total_steps"],
                                     rank=8, alpha=16)
    assert drop >= 0.9 * reference and drop > 0.1, (drop, reference)

    ids = np.asarray(examples[0].input_ids)
    with torch.no_grad():
        theirs = tuned(torch.tensor(ids, dtype=torch.long)[None]).logits[0].numpy()
    np.testing.assert_allclose(_jax_logits(folder, export, ids), theirs, atol=1e-4, rtol=1e-4)
    out = tuned.generate(torch.tensor(ids[:8], dtype=torch.long)[None], max_new_tokens=4, do_sample=False)
    assert out.shape[1] == 12

    from aegis.cli.supervised import app

    merged = tmp_path / "merged"
    res = CliRunner().invoke(app, ["export", "lora", str(merged), "--merge", "--runs-dir", str(tmp_path / "runs")])
    assert res.exit_code == 0, res.output
    with torch.no_grad():
        folded = _hf(merged)(torch.tensor(ids, dtype=torch.long)[None]).logits[0].numpy()
    np.testing.assert_allclose(folded, theirs, atol=1e-4, rtol=1e-4)


@pytest.mark.slow
def test_full_fine_tuning_on_alpaca_exports_an_hf_folder(tmp_path, folder, data):
    cfg = {
        "model": str(folder), "data": str(data["alpaca"]), "training": {**TRAINING, "lr": 3e-3},
        "train_config": {"method": "full", "micro_batch_size": 8, "seq_len": 64, "precision": "fp32"},
    }
    export = _run(tmp_path, "full", cfg) / "export"
    names = {p.name for p in export.iterdir()}
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json"} <= names
    examples = _examples(folder, data["alpaca"])
    before = _assistant_loss(_hf(folder), examples)
    tuned = _hf(export)
    assert 1 - _assistant_loss(tuned, examples) / before >= 0.3
    ids = np.asarray(examples[3].input_ids)
    with torch.no_grad():
        theirs = tuned(torch.tensor(ids, dtype=torch.long)[None]).logits[0].numpy()
    np.testing.assert_allclose(_jax_logits(folder, export, ids), theirs, atol=1e-4, rtol=1e-4)
    assert tuned.generate(torch.tensor(ids[:8], dtype=torch.long)[None], max_new_tokens=3).shape[1] == 11


@pytest.mark.parametrize("kind", ["sharegpt", "alpaca", "messages"])
def test_the_plans_row_lengths_are_the_runs(folder, data, kind):
    from aegis.data.profile import analyze_dataset
    from aegis.data.render import ChatRenderer
    from aegis.train.data import load_examples

    profile = analyze_dataset(str(data[kind]), model=str(folder))
    _, report = load_examples(str(data[kind]), ChatRenderer.from_folder(folder), seq_len=None)
    assert "AutoTokenizer" in profile.tokenizer
    assert list(profile.row_lengths) == report.lengths and len(report.lengths) == profile.num_rows


def test_assistant_mask_by_prefixes_equals_transformers_generation_mask(tmp_path):
    """On a template with {% generation %} tags, the prefix-rendering mask (used for templates without tags)
    selects the tokens transformers' return_assistant_tokens_mask selects."""
    from aegis.data.render import ChatRenderer

    gen = make_model_folder(tmp_path / "gen", template=CHATML_GENERATION)
    r = ChatRenderer.from_folder(gen)
    conv = [("system", "be brief"), ("user", "reset password"), ("assistant", "click settings"),
            ("user", "thanks"), ("assistant", "the refund is on the card")]
    assert r.generation_tags
    ids, mask = r.render(conv)
    out = r.tokenizer.apply_chat_template([{"role": a, "content": b} for a, b in conv], return_dict=True,
                                          return_assistant_tokens_mask=True)
    assert ids == list(out["input_ids"]) and mask == [bool(m) for m in out["assistant_masks"]]
    r.generation_tags = False
    assert r.render(conv) == (ids, mask)


def test_raw_text_rows_train_on_every_token_after_the_first(folder, tmp_path):
    from aegis.data.render import ChatRenderer
    from aegis.train.data import load_examples

    (tmp_path / "t.jsonl").write_text('{"text": "reset the password please"}\n')
    (ex,), _ = load_examples(str(tmp_path / "t.jsonl"), ChatRenderer.from_folder(folder))
    assert not ex.loss_mask[0] and ex.loss_mask[1:].all() and ex.input_ids[-1] == 2  # <|eos|>


# ------------------------------------------------------------------------------------------- bad input


def test_a_folder_without_weights_is_a_one_line_error_naming_the_folder(tmp_path, folder, data):
    import shutil

    from aegis.cli.supervised import app

    empty = tmp_path / "no-weights"
    empty.mkdir()
    shutil.copy(folder / "config.json", empty / "config.json")
    cfg = {"model": str(empty), "data": str(data["sharegpt"]),
           "train_config": {"method": "lora", "micro_batch_size": 2, "seq_len": 64}}
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(cfg))
    res = CliRunner().invoke(app, ["run", "--config", str(tmp_path / "r.yaml"), "--runs-dir", str(tmp_path / "runs")])
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert str(empty) in res.output and "safetensors" in res.output and "hf download" in res.output
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("checkpoints/*"))


def test_chat_data_for_a_tokenizer_without_a_template_is_refused_unless_one_is_given(tmp_path, data):
    from aegis.errors import DatasetError
    from aegis.data.render import ChatRenderer
    from aegis.train.data import load_examples

    bare = make_model_folder(tmp_path / "bare", template=None)
    with pytest.raises(DatasetError, match="no chat template.*chat_template"):
        load_examples(str(data["sharegpt"]), ChatRenderer.from_folder(bare))
    (tmp_path / "t.jinja").write_text(CHATML)
    examples, _ = load_examples(str(data["sharegpt"]), ChatRenderer.from_folder(bare, chat_template=str(tmp_path / "t.jinja")))
    assert len(examples) == 128


def test_a_shard_whose_shapes_disagree_with_the_config_is_refused(tmp_path, folder):
    import jax.numpy as jnp

    from aegis.errors import CheckpointError
    from aegis.train.modeling import build_model
    from aegis.train.weights import load_checkpoint

    config = json.loads((folder / "config.json").read_text())
    wrong = build_model({**config, "intermediate_size": config["intermediate_size"] * 2}, dtype=jnp.float32)
    with pytest.raises(CheckpointError, match=r"mlp\.(gate|up|down)_proj.*shape.*expected"):
        load_checkpoint(wrong, folder)


def test_corrupt_lines_are_counted_by_line_and_the_rest_trains(tmp_path, folder, data):
    from aegis.data.render import ChatRenderer
    from aegis.train.data import load_examples

    lines = data["sharegpt"].read_text().splitlines()[:10]
    lines[3] = '{"conversations": [{"from": "human", "value": "cut off'
    lines[6] = '{"conversations": "not a list"}'
    (tmp_path / "bad.jsonl").write_text("\n".join(lines) + "\n")
    examples, report = load_examples(str(tmp_path / "bad.jsonl"), ChatRenderer.from_folder(folder), seq_len=32)
    assert report.bad_lines == (4,) and [n for n, _ in report.malformed] == [7]  # file lines, as an editor shows
    # 8 rows render; cut at 32 tokens, those whose answer falls past the cut have nothing to learn and are counted
    assert len(report.lengths) == 8 and report.truncated == sum(1 for n in report.lengths if n > 32)
    assert len(examples) + report.no_targets == 8 and all(ex.loss_mask[1:].any() for ex in examples)
    assert any("1 corrupt line skipped: line 4" in w for w in report.warnings())


@pytest.mark.slow
def test_kill_9_then_resume_exports_the_same_adapter_and_a_changed_base_is_refused(tmp_path, folder, data):
    """A run killed mid-window and resumed ends with the adapter an uninterrupted run gives (fp32, 1e-5). Its base
    changed after the kill is refused in one line and trains nothing; the original weights put back, it resumes."""
    import shutil

    from safetensors.numpy import load_file

    weights = tmp_path / "base"  # the runs' own copy of the base: changed after the kill, then restored
    shutil.copytree(folder, weights)
    cfg = {
        "model": str(weights), "data": str(data["sharegpt"]),
        "train_config": {"method": "lora", "micro_batch_size": 4, "seq_len": 64, "precision": "fp32",
                         "lora": {"rank": 4, "alpha": 8}},
        "training": {"steps_per_window": 20, "total_steps": 40, "lr": 5e-3, "warmup_steps": 5},
        "checkpoints": {"interval": 5}, "curriculum": {"eval_interval": 100000},
    }
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(cfg))
    runs = tmp_path / "runs"

    def cli(*args: str) -> subprocess.Popen:  # both runs as a user starts them: `aegis run` in its own process
        return subprocess.Popen([sys.executable, "-m", "aegis.cli.supervised", *args, "--runs-dir", str(runs), "-q"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    straight = cli("run", "--config", str(tmp_path / "run.yaml"), "--run-id", "straight")
    assert straight.wait(timeout=300) == 0, straight.stderr.read().decode()[-2000:]
    proc = cli("run", "--config", str(tmp_path / "run.yaml"), "--run-id", "killed")
    metrics = runs / "killed" / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while not metrics.exists() or len(metrics.read_text().splitlines()) < 27:  # mid second window
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        assert time.monotonic() < deadline
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (runs / "killed" / "export").exists()

    from transformers import AutoModelForCausalLM

    from aegis.cli.supervised import app

    # the base changes after the kill: resuming refuses it in one line, and trains nothing
    # (re-saved in another precision: the fingerprint reads shard sizes and safetensors headers, not the data)
    AutoModelForCausalLM.from_pretrained(weights, dtype=torch.float32).to(torch.bfloat16).save_pretrained(weights)
    steps_before = len(metrics.read_text().splitlines())
    res = CliRunner().invoke(app, ["resume", "--run-id", "killed", "--runs-dir", str(runs), "-q"])
    assert res.exit_code == 2 and "changed since run killed started" in res.output and "Traceback" not in res.output
    assert len(metrics.read_text().splitlines()) == steps_before
    shutil.rmtree(weights)  # the original weights back, as the error says to do
    shutil.copytree(folder, weights)

    resumed = cli("resume", "--run-id", "killed")
    assert resumed.wait(timeout=300) == 0, resumed.stderr.read().decode()[-2000:]
    a = load_file(runs / "straight" / "export" / "adapter_model.safetensors")
    b = load_file(runs / "killed" / "export" / "adapter_model.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_allclose(b[k], a[k], atol=1e-5, rtol=0)
    # each step logged once, with the loss the uninterrupted run logged at that step
    straight_log, killed_log = (read_jsonl(runs / r / "metrics.jsonl") for r in ("straight", "killed"))
    assert [r["step"] for r in killed_log] == [r["step"] for r in straight_log] == list(range(1, 41))
    np.testing.assert_allclose([r["loss"] for r in killed_log], [r["loss"] for r in straight_log], rtol=1e-6)
    # packed (the default): the same examples in every step's batch, and the same sampler state at the end, the
    # examples carried over to the next batch included
    assert [r["sample_ids"] for r in killed_log] == [r["sample_ids"] for r in straight_log]
    assert json.loads((runs / "killed" / "config.json").read_text())["training"]["packing"]
    end = [json.loads((runs / r / "checkpoints" / "40" / "meta" / "metadata").read_text())["sampler"]
           for r in ("straight", "killed")]
    assert end[0] == end[1] and end[0]["pending"]


def test_qlora_quantises_the_folders_weights_while_loading_and_exports_an_adapter(tmp_path, folder, data):
    import jax.numpy as jnp
    from peft import PeftModel

    from aegis.train.modeling import build_model
    from aegis.train.nf4 import NF4_CODE, NF4Tensor, dequantize
    from aegis.train.weights import load_checkpoint

    config = json.loads((folder / "config.json").read_text())
    model = build_model(config, dtype=jnp.float32, param_dtype=jnp.float32)
    dense = load_checkpoint(model, folder, dtype=jnp.float32)
    nf4 = load_checkpoint(model, folder, dtype=jnp.float32, nf4=True)
    q = nf4["model"]["layers"]["self_attn"]["q_proj"]["weight"]
    w = dense["model"]["layers"]["self_attn"]["q_proj"]["weight"]
    assert isinstance(q, NF4Tensor) and not isinstance(nf4["model"]["embed_tokens"]["weight"], NF4Tensor)
    # NF4's worst case: half the widest gap between adjacent codes, times the block's absmax (+1% for the
    # double-quantised absmax)
    half_gap = float(np.max(np.diff(np.asarray(NF4_CODE)))) / 2
    assert float(jnp.max(jnp.abs(dequantize(q, jnp.float32) - w))) <= 1.01 * half_gap * float(jnp.max(jnp.abs(w)))

    cfg = {
        "model": str(folder), "data": str(data["messages"]),
        "train_config": {"method": "qlora", "micro_batch_size": 4, "seq_len": 96, "precision": "fp32",
                         "lora": {"rank": 4, "alpha": 8}},
        "training": {"steps_per_window": 10, "total_steps": 10, "lr": 5e-3},
    }
    export = _run(tmp_path, "qlora", cfg) / "export"
    tuned = PeftModel.from_pretrained(_hf(folder), export)
    assert tuned.peft_config["default"].r == 4


def test_a_hub_id_is_found_in_the_huggingface_cache_and_an_uncached_one_says_what_to_download(tmp_path, folder):
    """`model: org/name` resolves to the snapshot huggingface_hub keeps (offline: local files only)."""
    import shutil

    cache = tmp_path / "hub"
    snap = cache / "models--acme--tiny-support" / "snapshots" / "0123abcd"
    shutil.copytree(folder, snap)
    (cache / "models--acme--tiny-support" / "refs").mkdir()
    (cache / "models--acme--tiny-support" / "refs" / "main").write_text("0123abcd")
    code = (
        "from aegis.models.source import locate_model\n"
        "from aegis.errors import WeightsNotFoundError\n"
        "src = locate_model('acme/tiny-support'); print(src.hub_id, src.folder, src.weight_files)\n"
        "try:\n    locate_model('acme/not-here')\nexcept WeightsNotFoundError as e:\n    print('ERR', e)\n"
    )
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    first, err = out.stdout.strip().splitlines()
    assert first.startswith(f"acme/tiny-support {snap}") and "model.safetensors" in first
    assert err.startswith("ERR the weights of acme/not-here are not on this machine") and "hf download acme/not-here" in err


def test_sharded_and_tied_checkpoints_load_as_transformers_reads_them(tmp_path):
    import jax
    import jax.numpy as jnp

    from aegis.train.modeling import build_model
    from aegis.train.weights import load_checkpoint

    sharded = make_model_folder(tmp_path / "sharded", max_shard_size="40KB", tie=True, hidden=64)
    assert (sharded / "model.safetensors.index.json").is_file() and len(list(sharded.glob("*.safetensors"))) > 2
    config = json.loads((sharded / "config.json").read_text())
    model = build_model(config, dtype=jnp.float32, param_dtype=jnp.float32)
    seen: list[tuple[int, int]] = []
    params = load_checkpoint(model, sharded, dtype=jnp.float32, on_progress=lambda d, t: seen.append((d, t)))
    assert seen[-1][0] == seen[-1][1] and all(a[0] <= b[0] for a, b in zip(seen, seen[1:]))  # bytes, monotone
    ids = np.arange(1, 30) % config["vocab_size"]
    ours = np.asarray(jax.jit(model.apply)(params, jnp.asarray(ids[None])))[0]
    with torch.no_grad():
        theirs = _hf(sharded)(torch.tensor(ids, dtype=torch.long)[None]).logits[0].numpy()
    np.testing.assert_allclose(ours, theirs, atol=1e-4, rtol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize(("model_type", "targets", "conv1d"), [
    ("gpt2", {"c_attn", "c_proj", "c_fc"}, True),
    ("opt", {"q_proj", "out_proj", "fc1", "fc2"}, False),
    ("cohere", {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}, False),
    ("cohere2", {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}, False),
    ("olmo", {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}, False),
    ("gptj", {"q_proj", "k_proj", "v_proj", "out_proj", "fc_in", "fc_out"}, False),
])
def test_other_layouts_fine_tune_with_lora_and_peft_loads_the_adapter(tmp_path, data, model_type, targets, conv1d):
    """GPT-2 (Conv1D linears, config keys of its own), OPT (positions offset by 2, layers under model.decoder), Cohere
    (the parallel block, RoPE over adjacent pairs, logits times logit_scale), Cohere 2 (a sliding-window layer and
    a global one without positions), OLMo 1 (LayerNorms without parameters, q/k/v clamped by clip_qkv) and GPT-J
    (RoPE over adjacent pairs of the first rotary_dim dims, an lm_head bias), as transformers saves them (GPT-2 and OPT with the stray Llama-style keys their
    configs ignore): LoRA on ShareGPT with the plan's default targets lowers transformers' assistant loss, and PEFT
    loads the adapter (GPT-2: fan_in_fan_out) to the engine's logits."""
    from peft import PeftModel

    folder = make_model_folder(tmp_path / model_type, template=CHATML, model_type=model_type)
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == model_type
    if model_type == "cohere2":  # a window shorter than the rows, and a global layer without positions
        config.update(sliding_window=16, layer_types=["sliding_attention", "full_attention"])
    if model_type.startswith("cohere"):  # Command R's 1/16 keeps a random tiny model's logits near zero for 120
        config["logit_scale"] = 1.0  # steps: plain logits let the loss move in this budget (parity checks the scale)
    if model_type == "olmo":  # OLMo 1.7's clip_qkv read from the folder (tests/train checks the clamp's values)
        config["clip_qkv"] = 0.5
    if model_type == "gptj":  # GPTJConfig's default rotary_dim (64) is wider than this model's 16-dim heads
        config["rotary_dim"] = 8
    (folder / "config.json").write_text(json.dumps(config))
    cfg = {
        "model": str(folder), "data": str(data["sharegpt"]), "training": TRAINING,
        "train_config": {"method": "lora", "micro_batch_size": 8, "seq_len": 64, "precision": "fp32",
                         "lora": {"rank": 8, "alpha": 16}},
    }
    export = _run(tmp_path, model_type, cfg) / "export"
    adapter = json.loads((export / "adapter_config.json").read_text())
    assert adapter["fan_in_fan_out"] == conv1d and set(adapter["target_modules"]) >= targets
    examples = _examples(folder, data["sharegpt"])
    before = _assistant_loss(_hf(folder), examples)
    tuned = PeftModel.from_pretrained(_hf(folder), export).eval()
    assert 1 - _assistant_loss(tuned, examples) / before > 0.1
    ids = np.asarray(examples[0].input_ids)
    with torch.no_grad():
        theirs = tuned(torch.tensor(ids, dtype=torch.long)[None]).logits[0].numpy()
    np.testing.assert_allclose(_jax_logits(folder, export, ids), theirs, atol=1e-4, rtol=1e-4)
