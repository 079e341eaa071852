"""Safetensors checkpoints load and save (single file and sharded), adapters load in PEFT, bad input is named."""

from __future__ import annotations

import json
import shutil

import jax
import numpy as np
import pytest
import torch
from conftest import tiny_config

from aegis.errors import CheckpointError
from aegis.train.lora import init_lora
from aegis.train.modeling import build_model
from aegis.train.weights import (
    CheckpointReader,
    load_checkpoint,
    load_lora_adapter,
    save_checkpoint,
    save_lora_adapter,
    to_hf_state_dict,
)


def _assert_trees_equal(a, b) -> None:
    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    assert ta == tb
    for x, y in zip(la, lb, strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize("name", ["mixtral", "phi3"])
def test_round_trip_single_and_sharded(name: str, hf_checkpoint, tmp_path) -> None:
    hf, folder = hf_checkpoint(name)
    config = json.loads((folder / "config.json").read_text())
    model = build_model(config)
    params = load_checkpoint(model, folder)
    # Exactly the tensors transformers saved, under the same names (per-expert MoE weights on disk).
    reader = CheckpointReader(folder)
    ours = to_hf_state_dict(model, params)
    assert sorted(ours) == reader.names()
    for key, value in ours.items():
        np.testing.assert_array_equal(value, reader.get(key))

    single = save_checkpoint(model, params, tmp_path / "single")
    _assert_trees_equal(load_checkpoint(model, single), params)
    sharded = save_checkpoint(model, params, tmp_path / "sharded", max_shard_bytes=64 * 1024)
    assert len(list(sharded.glob("model-*-of-*.safetensors"))) > 1
    _assert_trees_equal(load_checkpoint(model, sharded), params)
    _assert_trees_equal(load_checkpoint(model, sharded / "model.safetensors.index.json"), params)

    # transformers reads what we wrote.
    from transformers import AutoModelForCausalLM

    reloaded = AutoModelForCausalLM.from_pretrained(sharded, attn_implementation="eager").eval()
    ids = torch.randint(3, 256, (1, 10))
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids).logits, hf(ids).logits, rtol=0, atol=0)


def test_transformers_sharded_bf16_checkpoint_loads(hf_checkpoint) -> None:
    hf, folder = hf_checkpoint("qwen2", max_shard_size="60KB")
    assert (folder / "model.safetensors.index.json").exists()
    config = json.loads((folder / "config.json").read_text())
    model = build_model(config)
    params = load_checkpoint(model, folder)
    q = hf.model.layers[1].self_attn.q_proj
    np.testing.assert_array_equal(
        np.asarray(params["model"]["layers"]["self_attn"]["q_proj"]["bias"][1]), q.bias.detach().numpy()
    )

    bf16_dir = folder.parent / "bf16"
    hf.to(torch.bfloat16).save_pretrained(bf16_dir)
    params16 = load_checkpoint(build_model(config, param_dtype="bfloat16"), bf16_dir)
    w = params16["model"]["layers"]["mlp"]["down_proj"]["weight"][0]
    assert w.dtype == jax.numpy.bfloat16
    np.testing.assert_array_equal(
        np.asarray(w, np.float32), hf.model.layers[0].mlp.down_proj.weight.detach().float().numpy()
    )


def test_bad_checkpoints_give_one_line_errors(hf_checkpoint, tmp_path) -> None:
    _, folder = hf_checkpoint("llama", max_shard_size="60KB")
    config = json.loads((folder / "config.json").read_text())

    wrong = build_model({**config, "intermediate_size": 96})
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(wrong, folder)
    msg = str(err.value)
    assert "\n" not in msg and "model.layers.0.mlp.gate_proj.weight" in msg and "(96, 64)" in msg and "(128, 64)" in msg

    untied = build_model({**config, "num_hidden_layers": 3})
    with pytest.raises(CheckpointError, match=r"lacks tensor 'model\.layers\.2\."):
        load_checkpoint(untied, folder)

    broken = tmp_path / "broken"
    shutil.copytree(folder, broken)
    shard = sorted(broken.glob("model-*.safetensors"))[-1]
    shard.unlink()
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(build_model(config), broken)
    assert shard.name in str(err.value) and "missing" in str(err.value)

    from safetensors.torch import load_file, save_file

    int8_dir = tmp_path / "int8"
    int8_dir.mkdir()
    state = load_file(sorted(folder.glob("*.safetensors"))[0])
    bad_key = sorted(state)[0]
    state[bad_key] = torch.zeros(state[bad_key].shape, dtype=torch.int8)
    save_file(state, int8_dir / "model.safetensors", metadata={"format": "pt"})
    reader = CheckpointReader(int8_dir)
    with pytest.raises(CheckpointError, match=rf"tensor '{bad_key}' has unsupported dtype I8"):
        reader.get(bad_key)

    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(build_model(config), tmp_path / "nowhere.safetensors")


@pytest.mark.parametrize(
    ("name", "targets"),
    [
        ("llama", ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]),
        ("phi3", ["qkv_proj", "gate_up_proj"]),
        ("qwen2_moe", "all-linear"),
    ],
)
def test_peft_loads_our_adapter_with_matching_outputs(name: str, targets, tmp_path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    config = tiny_config(name)
    model = build_model(config)
    params = jax.tree_util.tree_map(lambda x: x * 5.0, model.init(jax.random.key(0)))
    base_dir = save_checkpoint(model, params, tmp_path / "base")
    lora = init_lora(model, params, rank=4, alpha=8, target_modules=targets, rng=jax.random.key(1))
    lora = jax.tree_util.tree_map(lambda x: x + 0.1 if x.ndim == 3 and not np.any(np.asarray(x)) else x, lora)
    adapter_dir = save_lora_adapter(model, lora, tmp_path / "adapter", base_model_name_or_path=str(base_dir))

    files = json.loads((adapter_dir / "adapter_config.json").read_text())
    assert files["peft_type"] == "LORA" and files["r"] == 4 and files["lora_alpha"] == 8
    keys = CheckpointReader(adapter_dir / "adapter_model.safetensors").names()
    first = "q_proj" if name != "phi3" else "qkv_proj"
    assert f"base_model.model.model.layers.0.self_attn.{first}.lora_A.weight" in keys

    hf = AutoModelForCausalLM.from_pretrained(base_dir, attn_implementation="eager").eval()
    peft_model = PeftModel.from_pretrained(hf, adapter_dir).eval()
    ids = np.random.default_rng(0).integers(3, 256, (2, 12)).astype(np.int32)
    with torch.no_grad():
        ref = peft_model(torch.from_numpy(ids).long()).logits.numpy()
    out = np.asarray(jax.jit(model.apply)(params, ids, lora=lora))
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
    no_lora = np.asarray(jax.jit(model.apply)(params, ids))
    assert np.max(np.abs(no_lora - ref)) > 1e-3 * np.abs(ref).max()  # the adapter matters

    back = load_lora_adapter(model, adapter_dir)
    assert back.rank == lora.rank and back.alpha == lora.alpha
    _assert_trees_equal(back.tree, lora.tree)


def test_a_checkpoint_tensor_the_config_switches_off_is_refused(hf_checkpoint, tmp_path):
    """StarCoder2 weights with biases under a config.json saying use_bias: false: the biases would be dropped
    silently; the loader refuses in one line instead."""
    import json

    import pytest

    from aegis.errors import CheckpointError
    from aegis.train.modeling import build_model
    from aegis.train.weights import load_checkpoint

    _, folder = hf_checkpoint("starcoder2")
    config = json.loads((folder / "config.json").read_text())
    model = build_model({**config, "use_bias": False})
    with pytest.raises(CheckpointError, match="use_bias"):
        load_checkpoint(model, folder)
    load_checkpoint(build_model(config), folder)  # the matching config reads every tensor
