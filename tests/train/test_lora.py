"""LoRA in the JAX models behaves as PEFT's: kaiming-uniform A, zero B, ``W + (alpha/r) B A`` on targets."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import tiny_config

from aegis.errors import InvalidConfigError
from aegis.train.lora import LoRAWeights, init_lora, linear_modules, lora_param_count, merge_lora
from aegis.train.models import build_model


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
    d1 = np.asarray(apply(params, ids, lora=lora, lora_rng=jax.random.key(1)))
    d2 = np.asarray(apply(params, ids, lora=lora, lora_rng=jax.random.key(2)))
    assert np.max(np.abs(d1 - plain)) > 1e-4 and np.max(np.abs(d1 - d2)) > 1e-4
    np.testing.assert_array_equal(d1, np.asarray(apply(params, ids, lora=lora, lora_rng=jax.random.key(1))))


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
