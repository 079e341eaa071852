"""The families with a plain two-matrix MLP and LayerNorms: Phi-1/1.5/2 (``phi``: attention and the fc1/fc2 MLP side
by side on one LayerNorm, ``dense``, partial RoPE, an lm_head bias) and StarCoder2 (``starcoder2``: sequential
LayerNorm blocks, c_fc/c_proj, biases per use_bias, one sliding window). Planner, engine and transformers agree on
parameters, gradients, checkpoints and LoRA; PEFT loads the engine's adapter. Logits parity is in test_parity.py
(``phi``, ``phi_qk``, ``starcoder2`` in conftest.TINY_CONFIGS) and the models' dropouts in test_model_dropout.py."""

from __future__ import annotations


import pytest
from conftest import tiny_config
from family_checks import (
    check_checkpoint_round_trip,
    check_counts_agree,
    check_every_gradient_matches_torch,
    check_lora_sizes_equal_peft,
    check_peft_loads_the_engines_adapter,
    check_training_loss_is_torch_cross_entropy,
)

from aegis import catalog
from aegis.train.models import build_model

NAMES = ["phi", "phi_qk", "starcoder2"]
BUNDLED = [m for m in catalog.models() if catalog.read_model_config(m)["model_type"] in ("phi", "starcoder2")]
DEFAULT_TARGETS = {
    "phi": ("q_proj", "k_proj", "v_proj", "dense", "fc1", "fc2"),
    "starcoder2": ("q_proj", "k_proj", "v_proj", "o_proj", "c_fc", "c_proj"),
}


@pytest.mark.parametrize("config", [tiny_config(n) for n in NAMES] + [catalog.read_model_config(m) for m in BUNDLED],
                         ids=NAMES + [m.id for m in BUNDLED])
def test_planner_engine_and_transformers_count_the_same_parameters(config):
    check_counts_agree(config)


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
    check_every_gradient_matches_torch(*hf_checkpoint(name))


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
    config = tiny_config(name)
    check_lora_sizes_equal_peft(config, DEFAULT_TARGETS[config["model_type"]])


def test_peft_loads_the_engines_adapter_to_the_engines_logits(hf_checkpoint, tmp_path):
    """An adapter trained on the parallel block's dense and fc2 (random B, so it changes the output), exported by
    the engine, loaded by PEFT onto transformers' model: the same logits as the engine with the adapter."""
    check_peft_loads_the_engines_adapter(*hf_checkpoint("phi"), ("dense", "fc2", "q_proj"), tmp_path / "adapter")


def test_the_catalog_serves_phi_and_starcoder2_and_refuses_the_sizes_it_does_not_hold():
    from aegis.errors import AegisError
    from aegis.hub import resolve_model
    from aegis.parse import parse_request

    assert {m.id for m in BUNDLED} >= {"microsoft/phi-2", "microsoft/phi-1_5", "bigcode/starcoder2-3b"}
    for name in ("phi-2", "phi2", "microsoft/phi-2", "Phi-2"):
        assert resolve_model(name).model_id == "microsoft/phi-2"
        assert parse_request(f"lora {name} on a100").model == "microsoft/phi-2"
    for name in ("phi-2:7b", "phi-1:7b", "phi", "starcoder2", "starcoder2-1b"):
        with pytest.raises(AegisError):
            resolve_model(name)
    # Hub ids write decimals with '_': phi-1_5 is Phi-1.5, however it is spelled
    for name, model_id in (("phi-1", "microsoft/phi-1"), ("phi1", "microsoft/phi-1"), ("phi-1_5", "microsoft/phi-1_5"), ("phi-1.5", "microsoft/phi-1_5"), ("phi1.5", "microsoft/phi-1_5"),
                           ("starcoder2-3b", "bigcode/starcoder2-3b"), ("starcoder2:7b", "bigcode/starcoder2-7b"),
                           ("bigcode/starcoder2-15b", "bigcode/starcoder2-15b"),
                           ("starcoder2-15b-instruct-v0.1", "bigcode/starcoder2-15b-instruct-v0.1")):
        assert resolve_model(name).model_id == model_id
        assert parse_request(f"qlora {name} on a100").model == model_id
