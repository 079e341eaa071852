"""LoRA in the JAX models behaves as PEFT's: kaiming-uniform A, zero B, ``W + (alpha/r) B A`` on targets."""

from __future__ import annotations

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import tiny_config

from aegis.errors import InvalidConfigError
from aegis.train.lora import LoRAWeights, init_lora, linear_modules, lora_param_count, merge_lora
from aegis.train.modeling import build_model


def _randomise_b(lora: LoRAWeights, seed: int = 3, std: float = 0.2) -> LoRAWeights:
    leaves, treedef = jax.tree_util.tree_flatten(lora)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(lora)[0]]
    new = [
        jax.random.normal(k, x.shape, x.dtype) * std if "lora_B" in p else x
        for k, x, p in zip(keys, leaves, paths, strict=True)
    ]
    return jax.tree_util.tree_unflatten(treedef, new)


@pytest.fixture(scope="module")
def llama():
    model = build_model(tiny_config("llama"))
    params = jax.tree_util.tree_map(lambda x: x * 5.0, model.init(jax.random.key(0)))
    ids = np.random.default_rng(0).integers(3, 256, (2, 12)).astype(np.int32)
    return model, params, ids


def test_init_is_peft_kaiming_uniform_a_and_zero_b(llama) -> None:
    model, params, ids = llama
    lora = init_lora(model, params, rank=8, alpha=16, target_modules=["q_proj", "down_proj"], rng=jax.random.key(1))
    layers = lora.tree["model"]["layers"]
    assert set(layers) == {"self_attn", "mlp"}
    a_q = np.asarray(layers["self_attn"]["q_proj"]["lora_A"]["weight"])
    a_down = np.asarray(layers["mlp"]["down_proj"]["lora_A"]["weight"])
    assert a_q.shape == (2, 8, 64) and a_down.shape == (2, 8, 128)
    assert layers["self_attn"]["q_proj"]["lora_B"]["weight"].shape == (2, 64, 8)
    # kaiming_uniform_(a=sqrt(5)) on [r, in]: U(-1/sqrt(in), 1/sqrt(in)), variance bound^2 / 3
    for a, fan_in in ((a_q, 64), (a_down, 128)):
        bound = 1 / math.sqrt(fan_in)
        assert np.abs(a).max() <= bound
        assert abs(a.std() - bound / math.sqrt(3)) < 0.1 * bound
    assert not np.any(np.asarray(layers["mlp"]["down_proj"]["lora_B"]["weight"]))
    assert lora.scale == 2.0
    assert lora_param_count(lora) == 2 * (8 * 64 + 64 * 8 + 8 * 128 + 64 * 8)
    apply = jax.jit(model.apply)
    np.testing.assert_array_equal(np.asarray(apply(params, ids, lora=lora)), np.asarray(apply(params, ids)))


def test_lora_forward_equals_merged_weights_and_trains_only_adapters(llama) -> None:
    model, params, ids = llama
    lora = init_lora(model, params, rank=4, alpha=8, target_modules="all-linear", rng=jax.random.key(2))
    lora = _randomise_b(lora)
    out = np.asarray(jax.jit(model.apply)(params, ids, lora=lora))
    merged = merge_lora(model, params, lora)
    ref = np.asarray(jax.jit(model.apply)(merged, ids))
    assert np.max(np.abs(out - np.asarray(jax.jit(model.apply)(params, ids)))) > 1e-2
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())

    def loss(lora_: LoRAWeights) -> jax.Array:
        return jnp.mean(model.apply(params, ids, lora=lora_) ** 2)

    grads = jax.jit(jax.grad(loss))(lora)
    assert isinstance(grads, LoRAWeights) and grads.rank == 4
    assert all(np.any(np.asarray(g)) for g in jax.tree_util.tree_leaves(grads))


def test_dropout_applies_only_with_an_rng(llama) -> None:
    model, params, ids = llama
    lora = _randomise_b(
        init_lora(model, params, rank=4, alpha=4, target_modules=["v_proj"], rng=jax.random.key(0), dropout=0.5)
    )
    apply = jax.jit(model.apply)
    plain = np.asarray(apply(params, ids, lora=lora))
    d1 = np.asarray(apply(params, ids, lora=lora, rng=jax.random.key(1)))
    d2 = np.asarray(apply(params, ids, lora=lora, rng=jax.random.key(2)))
    assert np.max(np.abs(d1 - plain)) > 1e-4 and np.max(np.abs(d1 - d2)) > 1e-4
    np.testing.assert_array_equal(d1, np.asarray(apply(params, ids, lora=lora, rng=jax.random.key(1))))


def test_targets_follow_peft_module_names() -> None:
    phi3 = build_model(tiny_config("phi3"))
    phi_params = jax.eval_shape(phi3.init, jax.random.key(0))
    assert {p[-1] for p in linear_modules(phi_params)} == {"qkv_proj", "o_proj", "gate_up_proj", "down_proj"}
    moe = build_model(tiny_config("qwen2_moe"))
    moe_params = jax.eval_shape(moe.init, jax.random.key(0))
    found = set(linear_modules(moe_params))
    assert ("mlp", "shared_expert", "gate_proj") in found and ("mlp", "shared_expert_gate") in found
    assert not any("experts" in p or p[-1] == "gate" for p in found)  # fused experts / router: not nn.Linear
    with pytest.raises(InvalidConfigError, match="valid names: .*qkv_proj"):
        init_lora(phi3, phi_params, rank=4, alpha=8, target_modules=["q_proj"], rng=jax.random.key(0))
    with pytest.raises(InvalidConfigError, match="rank must be positive"):
        init_lora(phi3, phi_params, rank=0, alpha=8, target_modules=["qkv_proj"], rng=jax.random.key(0))


# ----- fused MoE experts: PEFT 0.21's ParamWrapper adapters --------------------------------------------------


def _moe_config(name: str) -> dict:
    config = tiny_config(name)
    if name == "qwen3_moe":
        config["moe_intermediate_size"] = 48  # 2I = 96 != hidden 64: a swapped in/out axis cannot pass unnoticed
    return config


def _peft_adapter(base_dir, targets, out_dir, seed: int = 0):
    """PEFT's own adapter on the transformers model (random lora_B): (trainable count, saved folder, logits fn)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(base_dir, attn_implementation="eager").eval()
    peft_model = get_peft_model(hf, LoraConfig(r=4, lora_alpha=8, target_modules=targets)).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    peft_model.save_pretrained(out_dir)
    return peft_model.get_nb_trainable_parameters()[0], out_dir, peft_model


def _peft_logits(peft_model, ids: np.ndarray) -> np.ndarray:
    import torch

    with torch.no_grad():
        return peft_model(torch.from_numpy(ids).long()).logits.numpy()


@pytest.mark.parametrize(
    ("name", "targets", "wrapped"),
    [
        pytest.param(
            "qwen3_moe", "all-linear", ["down_proj", "gate.weight", "gate_up_proj"], marks=pytest.mark.slow
        ),
        ("qwen3_moe", ["q_proj", "gate_proj", "up_proj", "down_proj"], ["down_proj", "gate_up_proj"]),
        ("qwen3_moe", ["down_proj"], ["down_proj"]),
        ("mixtral", ["w1", "w3", "gate"], ["gate.weight", "gate_up_proj"]),
        ("qwen2_moe", "all-linear", []),  # PEFT 0.21 converts no qwen2_moe config: experts stay frozen
    ],
)
def test_moe_adapters_match_peft_both_ways(name: str, targets, wrapped: list[str], tmp_path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from aegis.train.weights import CheckpointReader, load_lora_adapter, save_checkpoint, save_lora_adapter

    config = _moe_config(name)
    model = build_model(config)
    params = jax.tree_util.tree_map(lambda x: x * 5.0, model.init(jax.random.key(0)))
    base_dir = save_checkpoint(model, params, tmp_path / "base")
    count, peft_dir, peft_model = _peft_adapter(base_dir, targets, tmp_path / "peft")
    peft_cfg = json.loads((peft_dir / "adapter_config.json").read_text())
    assert sorted(peft_cfg["target_parameters"] or []) == wrapped
    ids = np.random.default_rng(0).integers(3, 256, (2, 12)).astype(np.int32)
    ref = _peft_logits(peft_model, ids)
    apply = jax.jit(model.apply)
    tol = {"rtol": 1e-4, "atol": 1e-4 * np.abs(ref).max()}

    # PEFT's file -> JAX: same outputs, and a fresh JAX init has exactly PEFT's tensors and count
    theirs = load_lora_adapter(model, peft_dir)
    np.testing.assert_allclose(np.asarray(apply(params, ids, lora=theirs)), ref, **tol)
    assert np.max(np.abs(np.asarray(apply(params, ids)) - ref)) > 1e-2 * np.abs(ref).max()
    fresh = init_lora(model, params, rank=4, alpha=8, target_modules=targets, rng=jax.random.key(1))
    assert lora_param_count(fresh) == lora_param_count(theirs) == count
    assert jax.tree_util.tree_map(np.shape, fresh.tree) == jax.tree_util.tree_map(np.shape, theirs.tree)
    has_experts = any(w != "gate.weight" for w in wrapped)
    assert ("experts" in fresh.tree["model"]["layers"].get("mlp", {})) == has_experts

    # JAX -> PEFT's format: same names and shapes as PEFT writes, and PeftModel reproduces the JAX outputs
    ours = jax.tree_util.tree_map(lambda x: x * 0.5, theirs)
    our_dir = save_lora_adapter(model, ours, tmp_path / "ours", base_model_name_or_path=str(base_dir))
    our_cfg = json.loads((our_dir / "adapter_config.json").read_text())
    assert sorted(our_cfg["target_parameters"] or []) == wrapped
    assert our_cfg["rank_pattern"] == peft_cfg["rank_pattern"]
    def saved(folder):
        reader = CheckpointReader(folder / "adapter_model.safetensors")
        return {k: reader.shape(k) for k in reader.names()}

    assert saved(our_dir) == saved(peft_dir)
    hf = AutoModelForCausalLM.from_pretrained(base_dir, attn_implementation="eager").eval()
    ref2 = _peft_logits(PeftModel.from_pretrained(hf, our_dir).eval(), ids)
    np.testing.assert_allclose(np.asarray(apply(params, ids, lora=ours)), ref2, rtol=1e-4, atol=1e-4 * np.abs(ref2).max())


@pytest.mark.slow
def test_expert_adapters_init_forward_merge_and_grads() -> None:
    model = build_model(_moe_config("qwen3_moe"))
    params = jax.tree_util.tree_map(lambda x: x * 5.0, model.init(jax.random.key(0)))
    ids = np.random.default_rng(1).integers(3, 256, (2, 10)).astype(np.int32)
    lora = init_lora(model, params, rank=4, alpha=8, target_modules="all-linear", rng=jax.random.key(2))
    mlp = lora.tree["model"]["layers"]["mlp"]
    e, d, i, r, n = 4, 64, 48, 4, 2
    gu, down = mlp["experts"]["gate_up_proj"], mlp["experts"]["down_proj"]
    assert gu["lora_A"]["weight"].shape == (n, 2 * r * e, d) and gu["lora_B"]["weight"].shape == (n, 2 * i, 2 * r * e)
    assert down["lora_A"]["weight"].shape == (n, r * e, i) and down["lora_B"]["weight"].shape == (n, d, r * e)
    assert mlp["gate"]["lora_A"]["weight"].shape == (n, r, d) and mlp["gate"]["lora_B"]["weight"].shape == (n, e, r)
    for a, fan_in in ((gu["lora_A"]["weight"], d), (down["lora_A"]["weight"], i)):
        assert np.abs(np.asarray(a)).max() <= 1 / math.sqrt(fan_in)
    apply = jax.jit(model.apply)
    np.testing.assert_array_equal(np.asarray(apply(params, ids, lora=lora)), np.asarray(apply(params, ids)))

    lora = _randomise_b(lora, std=0.05)
    out = np.asarray(apply(params, ids, lora=lora))
    ref = np.asarray(apply(merge_lora(model, params, lora), ids))  # PEFT's delta: W_e + scale * B_e @ A_e
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
    w = np.asarray(params["model"]["layers"]["mlp"]["experts"]["down_proj"])
    a = np.asarray(down["lora_A"]["weight"]).reshape(n, e, r, i)
    b = np.asarray(lora.tree["model"]["layers"]["mlp"]["experts"]["down_proj"]["lora_B"]["weight"])
    b = b.reshape(n, d, r, e).transpose(0, 3, 1, 2)  # PEFT: lora_B.reshape(out, r, E).permute(2, 0, 1)
    merged = np.asarray(merge_lora(model, params, lora)["model"]["layers"]["mlp"]["experts"]["down_proj"])
    np.testing.assert_allclose(merged, w + 2.0 * b @ a, rtol=1e-5, atol=1e-5)

    grads = jax.jit(jax.grad(lambda lo: jnp.mean(model.apply(params, ids, lora=lo) ** 2)))(lora)
    assert all(np.any(np.asarray(g)) for g in jax.tree_util.tree_leaves(grads))


def test_expert_adapters_refuse_what_peft_refuses(tmp_path) -> None:
    from peft import LoraConfig, get_peft_model

    from conftest import build_hf_model

    qwen3 = build_model(_moe_config("qwen3_moe"))
    params = jax.eval_shape(qwen3.init, jax.random.key(0))
    hf = build_hf_model(_moe_config("qwen3_moe"))
    with pytest.raises(ValueError, match="lora_dropout"):
        get_peft_model(hf, LoraConfig(r=4, target_modules="all-linear", lora_dropout=0.1))
    with pytest.raises(InvalidConfigError, match="dropout must be 0 when the MoE experts"):
        init_lora(qwen3, params, rank=4, alpha=8, target_modules="all-linear", rng=jax.random.key(0), dropout=0.1)
    init_lora(qwen3, params, rank=4, alpha=8, target_modules=["q_proj"], rng=jax.random.key(0), dropout=0.1)
    with pytest.raises(ValueError, match="without also targeting up_proj"):
        get_peft_model(build_hf_model(_moe_config("qwen3_moe")), LoraConfig(r=4, target_modules=["gate_proj"]))
    with pytest.raises(InvalidConfigError, match="target up_proj too"):
        init_lora(qwen3, params, rank=4, alpha=8, target_modules=["gate_proj"], rng=jax.random.key(0))
    mixtral = build_model(tiny_config("mixtral"))  # Mixtral's experts answer to w1/w3/w2, not gate/up/down_proj
    mixtral_params = jax.eval_shape(mixtral.init, jax.random.key(0))
    with pytest.raises(InvalidConfigError, match="valid names: .*w1"):
        init_lora(mixtral, mixtral_params, rank=4, alpha=8, target_modules=["up_proj"], rng=jax.random.key(0))
    qwen2 = build_model(tiny_config("qwen2_moe"))  # no ParamWrapper there, so dropout stays allowed
    qwen2_params = jax.eval_shape(qwen2.init, jax.random.key(0))
    lora = init_lora(qwen2, qwen2_params, rank=4, alpha=8, target_modules="all-linear", rng=jax.random.key(0), dropout=0.1)
    assert lora.dropout == 0.1 and "experts" not in lora.tree["model"]["layers"]["mlp"]


def test_expert_adapters_on_nf4_experts_match_dequantized() -> None:
    from aegis.train.nf4 import NF4Tensor, dequantize, quantize_params

    model = build_model(_moe_config("qwen3_moe"))
    params = jax.tree_util.tree_map(lambda x: x * 5.0, model.init(jax.random.key(0)))
    qparams = quantize_params(model, params)
    assert isinstance(qparams["model"]["layers"]["mlp"]["experts"]["gate_up_proj"], NF4Tensor)
    dense = jax.tree_util.tree_map(
        lambda x: dequantize(x, jnp.float32) if isinstance(x, NF4Tensor) else x,
        qparams,
        is_leaf=lambda x: isinstance(x, NF4Tensor),
    )
    lora = _randomise_b(init_lora(model, qparams, rank=4, alpha=8, target_modules="all-linear", rng=jax.random.key(3)))
    ids = np.random.default_rng(2).integers(3, 256, (2, 10)).astype(np.int32)
    out = np.asarray(jax.jit(model.apply)(qparams, ids, lora=lora))
    ref = np.asarray(jax.jit(model.apply)(dense, ids, lora=lora))
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


@pytest.mark.parametrize("model_id", ["Qwen/Qwen3-30B-A3B", "mistralai/Mixtral-8x7B-v0.1"])
def test_trainable_count_equals_peft_at_full_width(model_id: str) -> None:
    """Real layer shapes (bundled config.json, depth cut to 2): JAX adapters count what PEFT counts, r=16."""
    from accelerate import init_empty_weights
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    from aegis.models.catalog import model_entry, read_model_config

    config = {**read_model_config(model_entry(model_id)), "num_hidden_layers": 2}
    model = build_model(config)
    shapes = jax.eval_shape(model.init, jax.random.key(0))
    lora = jax.eval_shape(
        lambda k: init_lora(model, shapes, rank=16, alpha=32, target_modules="all-linear", rng=k), jax.random.key(0)
    )
    hf_kwargs = {k: v for k, v in config.items() if k not in ("model_type", "architectures", "transformers_version")}
    with init_empty_weights():
        hf = AutoModelForCausalLM.from_config(AutoConfig.for_model(config["model_type"], **hf_kwargs))
    count = get_peft_model(hf, LoraConfig(r=16, lora_alpha=32, target_modules="all-linear")).get_nb_trainable_parameters()
    assert lora_param_count(lora) == count[0]
    experts = lora.tree["model"]["layers"]["mlp"]["experts"]
    e = model.spec.moe.num_experts
    assert experts["gate_up_proj"]["lora_A"]["weight"].shape == (2, 2 * 16 * e, config["hidden_size"])
