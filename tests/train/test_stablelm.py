"""StableLM (``stablelm``): LayerNorms with biases, q/k/v biases per ``use_qkv_bias``, a SwiGLU MLP, partial RoPE
(StableLmConfig's 0.25 default), sequential blocks or, with ``use_parallel_residual``, attention and the MLP side by
side on one LayerNorm. Planner, engine and transformers agree on parameters, gradients, checkpoints and LoRA; PEFT
loads the engine's adapter; ``qk_layernorm`` (per-head LayerNorms) is refused in one line by planner and engine alike.
Logits parity is in test_parity.py (``stablelm``, ``stablelm_parallel`` in conftest.TINY_CONFIGS) and the dropouts
in test_model_dropout.py."""

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
    meta_model,
)

from aegis import catalog
from aegis.errors import UnsupportedArchitectureError
from aegis.hub import profile_from_config
from aegis.train.models import build_model

NAMES = ["stablelm", "stablelm_parallel"]
BUNDLED = [m for m in catalog.models() if catalog.read_model_config(m)["model_type"] == "stablelm"]


@pytest.mark.parametrize("config", [tiny_config(n) for n in NAMES] + [catalog.read_model_config(m) for m in BUNDLED],
                         ids=NAMES + [m.id for m in BUNDLED])
def test_planner_engine_and_transformers_count_the_same_parameters(config):
    check_counts_agree(config)


@pytest.mark.parametrize("name", NAMES)
def test_defaults_and_layout_follow_stablelmconfig(name):
    """A config.json that leaves out partial_rotary_factor, hidden_act and the switches gets StableLmConfig's values;
    the parallel block is the config's ``use_parallel_residual``."""
    from transformers import StableLmConfig

    config = tiny_config(name)
    spec = build_model(config).spec
    hf = StableLmConfig(**{k: v for k, v in config.items() if k != "model_type"})
    assert spec.ropes[0].rotary_dim == int(hf.hidden_size // hf.num_attention_heads
                                           * hf.rope_parameters["partial_rotary_factor"])
    assert spec.hidden_act == hf.hidden_act == "silu" and spec.rms_norm_eps == hf.layer_norm_eps
    assert spec.parallel_block == hf.use_parallel_residual and spec.qkv_bias == hf.use_qkv_bias
    assert spec.layer_norm and not spec.plain_mlp and not spec.o_bias and not spec.qk_norm


@pytest.mark.parametrize("name", NAMES)
def test_every_gradient_matches_torch_autograd(name, hf_checkpoint):
    """Through both layouts, LayerNorm weights and biases, the q/k/v biases and the partial rotation."""
    check_every_gradient_matches_torch(*hf_checkpoint(name))


@pytest.mark.parametrize("name", NAMES)
def test_the_training_loss_is_torch_cross_entropy(name, hf_checkpoint):
    check_training_loss_is_torch_cross_entropy(*hf_checkpoint(name))


@pytest.mark.parametrize("name", NAMES)
def test_checkpoint_round_trip_keeps_transformers_names_and_values(name, hf_checkpoint, tmp_path):
    """Norm biases, q/k/v biases and (parallel) the missing post_attention_layernorm are read and written under
    transformers' names; transformers loads the saved folder to the same logits."""
    check_checkpoint_round_trip(*hf_checkpoint(name), tmp_path / "saved")


@pytest.mark.parametrize("name", NAMES)
def test_lora_adapter_sizes_equal_peft_and_the_engine(name):
    check_lora_sizes_equal_peft(tiny_config(name), ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                    "down_proj"))


def test_peft_loads_the_engines_adapter_to_the_engines_logits(hf_checkpoint, tmp_path):
    """An adapter on the parallel block's o_proj, down_proj and q_proj."""
    check_peft_loads_the_engines_adapter(*hf_checkpoint("stablelm_parallel"), ("o_proj", "down_proj", "q_proj"),
                                         tmp_path / "adapter")


def test_per_head_qk_layernorm_is_refused_in_one_line_by_planner_and_engine():
    """transformers builds ``qk_layernorm`` as one LayerNorm per head (``q_layernorm.norms.{h}``): not described,
    so neither a count nor a model is made from such a config."""
    config = {**tiny_config("stablelm"), "qk_layernorm": True}
    hf = sum(p.numel() for p in meta_model(config).parameters())
    assert hf != profile_from_config(tiny_config("stablelm"), model_id="t", source="path").total_params
    for make in (lambda: profile_from_config(config, model_id="t", source="path"), lambda: build_model(config)):
        with pytest.raises(UnsupportedArchitectureError) as err:
            make()
        assert "qk_layernorm" in str(err.value) and "\n" not in str(err.value)


def test_the_catalog_serves_stablelm_3b_and_2_and_refuses_the_lines_it_does_not_hold():
    """StableLM-3B-4E1T (the Hub's file), its Zephyr chat model (litgpt's table) and StableLM 2 1.6B (the Hub's file)
    are bundled; StableLM 2 12B and Zephyr 1.6B, the GPT-NeoX alpha models and other sizes are refused, never answered
    with another size or line."""
    from aegis.errors import UnknownModelError
    from aegis.hub import match_model, resolve_model
    from aegis.parse import parse_request_lenient

    for name, model_id in (("stablelm-3b-4e1t", "stabilityai/stablelm-3b-4e1t"),
                           ("stabilityai/stablelm-3b-4e1t", "stabilityai/stablelm-3b-4e1t"),
                           ("stablelm:3b", "stabilityai/stablelm-3b-4e1t"),
                           ("stablelm-zephyr-3b", "stabilityai/stablelm-zephyr-3b"),
                           ("stablelm-zephyr:3b", "stabilityai/stablelm-zephyr-3b"),
                           ("stablelm-2-1_6b", "stabilityai/stablelm-2-1_6b"), ("stablelm2:1.6b", "stabilityai/stablelm-2-1_6b"),
                           ("stabilityai/stablelm-2-1_6b", "stabilityai/stablelm-2-1_6b")):
        assert resolve_model(name).model_id == model_id
        assert parse_request_lenient(f"lora {name} on a100").request.model == model_id
    assert resolve_model("stablelm-3b-4e1t").total_params == 2_795_443_200  # the model card's table
    for name in ("stablelm-2-12b", "stablelm-2-zephyr-1_6b", "stablelm-2-3b", "stablelm-base-alpha-3b", "stablelm-7b",
                 "stablelm"):
        with pytest.raises(UnknownModelError):
            match_model(name)
        assert parse_request_lenient(f"lora {name} on a100").request.model is None
