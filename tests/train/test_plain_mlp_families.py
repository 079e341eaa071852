"""The families with a plain two-matrix MLP and LayerNorms: Phi-1/1.5/2 (``phi``: attention and the fc1/fc2 MLP side
by side on one LayerNorm, ``dense``, partial RoPE, an lm_head bias) and StarCoder2 (``starcoder2``: sequential
LayerNorm blocks, c_fc/c_proj, biases per use_bias, one sliding window). Planner, engine and transformers agree on
parameters, gradients, checkpoints and LoRA; PEFT loads the engine's adapter. Logits parity is in test_parity.py
(``phi``, ``phi_qk``, ``starcoder2`` in conftest.TINY_CONFIGS) and the models' dropouts in test_model_dropout.py."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from conftest import tiny_config
from family_checks import (
    check_checkpoint_round_trip,
    check_training_loss_is_torch_cross_entropy,
    engine_param_count,
    meta_model,
    tokens,
)

from aegis import catalog
from aegis.hub import profile_from_config
from aegis.schema import default_lora_targets
from aegis.train.models import build_model
from aegis.train.weights import load_checkpoint, to_hf_state_dict

NAMES = ["phi", "phi_qk", "starcoder2"]
BUNDLED = [m for m in catalog.models() if catalog.read_model_config(m)["model_type"] in ("phi", "starcoder2")]
DEFAULT_TARGETS = {
    "phi": ("q_proj", "k_proj", "v_proj", "dense", "fc1", "fc2"),
    "starcoder2": ("q_proj", "k_proj", "v_proj", "o_proj", "c_fc", "c_proj"),
}


@pytest.mark.parametrize("config", [tiny_config(n) for n in NAMES] + [catalog.read_model_config(m) for m in BUNDLED],
                         ids=NAMES + [m.id for m in BUNDLED])
def test_planner_engine_and_transformers_count_the_same_parameters(config):
    hf = meta_model(config)
    profile = profile_from_config(config, model_id="test", source="path")
    assert profile.total_params == engine_param_count(config) == sum(p.numel() for p in hf.parameters())
    assert profile.layer_params == tuple(sum(p.numel() for p in layer.parameters()) for layer in hf.model.layers)


def test_defaults_follow_phiconfig():
    """A config.json that leaves out partial_rotary_factor, hidden_act and layer_norm_eps gets PhiConfig's values."""
    from transformers import PhiConfig

    spec = build_model(tiny_config("phi")).spec
    hf = PhiConfig(**{k: v for k, v in tiny_config("phi").items() if k != "model_type"})
    assert spec.ropes[0].rotary_dim == int(hf.hidden_size // hf.num_attention_heads
                                           * hf.rope_parameters["partial_rotary_factor"])
    assert spec.hidden_act == hf.hidden_act == "gelu_new"
    assert spec.rms_norm_eps == hf.layer_norm_eps
    assert spec.lm_head_bias and spec.parallel_block and spec.plain_mlp and not spec.qk_norm


@pytest.mark.parametrize("name", NAMES)
def test_every_gradient_matches_torch_autograd(name, hf_checkpoint):
    """Through the parallel block (Phi), LayerNorm weights and biases, every linear bias, the lm_head bias (Phi) and
    the tied head (StarCoder2)."""
    hf, folder = hf_checkpoint(name)
    model = build_model(json.loads((folder / "config.json").read_text()))
    params = load_checkpoint(model, folder)
    ids, targets = tokens(256, (2, 20)), tokens(256, (2, 20), seed=7)

    def loss(p):
        logp = jax.nn.log_softmax(model.apply(p, jnp.asarray(ids)))
        return -jnp.mean(jnp.take_along_axis(logp, jnp.asarray(targets)[..., None], axis=-1))

    grads = to_hf_state_dict(model, jax.jit(jax.grad(loss))(params))
    hf.zero_grad()
    logp = torch.log_softmax(hf(torch.from_numpy(ids).long()).logits, dim=-1)
    (-logp.gather(-1, torch.from_numpy(targets).long()[..., None]).mean()).backward()
    theirs = {k: p.grad.numpy() for k, p in hf.named_parameters()}
    assert set(grads) == set(theirs)
    for key, ref in theirs.items():
        np.testing.assert_allclose(grads[key], ref, rtol=1e-4, atol=1e-4 * float(np.abs(ref).max()), err_msg=key)


@pytest.mark.parametrize("name", NAMES)
def test_the_training_loss_is_torch_cross_entropy(name, hf_checkpoint):
    check_training_loss_is_torch_cross_entropy(*hf_checkpoint(name))


@pytest.mark.parametrize("name", NAMES)
def test_checkpoint_round_trip_keeps_transformers_names_and_values(name, hf_checkpoint, tmp_path):
    """Phi's ``model.final_layernorm``, ``self_attn.dense``, ``mlp.fc1/fc2`` and ``lm_head.bias``, StarCoder2's
    ``mlp.c_fc/c_proj`` and norm biases are read and written under transformers' names (a tied head left out, as
    transformers saves it); transformers loads the saved folder to the same logits."""
    check_checkpoint_round_trip(*hf_checkpoint(name), tmp_path / "saved")


@pytest.mark.parametrize("name", NAMES)
def test_lora_adapter_sizes_equal_peft_and_the_engine(name):
    """Planner == PEFT == the engine's adapters for "all-linear" and the plan's defaults, which are the models' own
    module names (Phi: q/k/v, dense, fc1, fc2; StarCoder2: q/k/v/o, c_fc, c_proj)."""
    import peft

    import aegis
    from aegis.train.lora import init_lora, lora_param_count

    config = tiny_config(name)
    profile = profile_from_config(config, model_id=name, source="path")
    defaults = default_lora_targets(profile.linear_modules)
    assert defaults == DEFAULT_TARGETS[config["model_type"]]
    model = build_model(config)
    params = model.init(jax.random.key(0))
    for targets in (("all-linear",), defaults, ("q_proj", "v_proj")):
        peft_targets = "all-linear" if targets == ("all-linear",) else list(targets)
        wrapped = peft.get_peft_model(meta_model(config), peft.LoraConfig(r=8, target_modules=peft_targets))
        trainable = sum(p.numel() for p in wrapped.parameters() if p.requires_grad)
        planned = profile.trainable_params("lora", aegis.LoRAConfig(rank=8, target_modules=targets))
        engine = init_lora(model, params, rank=8, alpha=16, target_modules=targets, rng=jax.random.key(1))
        assert planned == trainable == lora_param_count(engine), (targets, planned, trainable)


def test_peft_loads_the_engines_adapter_to_the_engines_logits(hf_checkpoint, tmp_path):
    """An adapter trained on the parallel block's dense and fc2 (random B, so it changes the output), exported by
    the engine, loaded by PEFT onto transformers' model: the same logits as the engine with the adapter."""
    import peft

    from aegis.train.lora import init_lora
    from aegis.train.weights import save_lora_adapter

    hf, folder = hf_checkpoint("phi")
    model = build_model(json.loads((folder / "config.json").read_text()))
    params = load_checkpoint(model, folder)
    lora = init_lora(model, params, rank=4, alpha=8, target_modules=("dense", "fc2", "q_proj"), rng=jax.random.key(2))
    lora = jax.tree.map(lambda x: x + 0.05 * jax.random.normal(jax.random.key(5), x.shape, x.dtype), lora)
    out = tmp_path / "adapter"
    save_lora_adapter(model, lora, out, base_model_name_or_path=str(folder))
    ids = tokens(256, (1, 12))
    ours = np.asarray(model.apply(params, jnp.asarray(ids), lora=lora))
    assert not np.allclose(ours, np.asarray(model.apply(params, jnp.asarray(ids))), atol=1e-3)
    wrapped = peft.PeftModel.from_pretrained(hf, out).eval()
    with torch.no_grad():
        theirs = wrapped(torch.from_numpy(ids).long()).logits.numpy()
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-4)


def test_the_catalog_serves_phi_and_starcoder2_and_refuses_the_sizes_it_does_not_hold():
    from aegis.errors import AegisError
    from aegis.hub import resolve_model
    from aegis.parse import parse_request

    assert {m.id for m in BUNDLED} >= {"microsoft/phi-2", "microsoft/phi-1_5", "bigcode/starcoder2-3b"}
    for name in ("phi-2", "phi2", "microsoft/phi-2", "Phi-2"):
        assert resolve_model(name).model_id == "microsoft/phi-2"
        assert parse_request(f"lora {name} on a100").model == "microsoft/phi-2"
    for name in ("phi-2:7b", "phi-1", "phi", "starcoder2", "starcoder2-1b"):
        with pytest.raises(AegisError):
            resolve_model(name)
    # Hub ids write decimals with '_': phi-1_5 is Phi-1.5, however it is spelled
    for name, model_id in (("phi-1_5", "microsoft/phi-1_5"), ("phi-1.5", "microsoft/phi-1_5"), ("phi1.5", "microsoft/phi-1_5"),
                           ("starcoder2-3b", "bigcode/starcoder2-3b"), ("starcoder2:7b", "bigcode/starcoder2-7b"),
                           ("bigcode/starcoder2-15b", "bigcode/starcoder2-15b"),
                           ("starcoder2-15b-instruct-v0.1", "bigcode/starcoder2-15b-instruct-v0.1")):
        assert resolve_model(name).model_id == model_id
        assert parse_request(f"qlora {name} on a100").model == model_id
