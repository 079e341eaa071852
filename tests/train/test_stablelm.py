"""StableLM (``stablelm``): LayerNorms with biases, q/k/v biases per ``use_qkv_bias``, a SwiGLU MLP, partial RoPE
(StableLmConfig's 0.25 default), sequential blocks or, with ``use_parallel_residual``, attention and the MLP side by
side on one LayerNorm: StableLmConfig's defaults, ``qk_layernorm`` (per-head LayerNorms) refused in one line by
planner and engine alike, the catalog's names. Counts, gradients, checkpoints and LoRA against transformers and PEFT
are in test_layernorm_families.py, logits parity in test_parity.py (``stablelm``, ``stablelm_parallel`` in
conftest.TINY_CONFIGS), the dropouts in test_model_dropout.py."""

from __future__ import annotations

import pytest
from aegis.errors import UnsupportedArchitectureError
from aegis.models.profiles import profile_from_config
from aegis.train.modeling import build_model
from conftest import tiny_config
from family_checks import (
    meta_model,
)

NAMES = ["stablelm", "stablelm_parallel"]


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
    from aegis.models.resolve import match_model, resolve_model
    from aegis.planning.parse import parse_request_lenient

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
    # the 2023 StableLM-Alpha and StableCode-Alpha models are GPT-NeoX models (litgpt's table), their own line
    for name, model_id in (("stablelm-base-alpha-3b", "stabilityai/stablelm-base-alpha-3b"),
                           ("stablelm-alpha:7b", "stabilityai/stablelm-base-alpha-7b"),
                           ("stablecode-3b", "stabilityai/stablecode-completion-alpha-3b")):
        assert resolve_model(name).model_id == model_id and resolve_model(name).architecture == "GPTNeoXForCausalLM"
    for name in ("stablelm-2-12b", "stablelm-2-zephyr-1_6b", "stablelm-2-3b", "stablelm-base-alpha-15b", "stablelm-7b",
                 "stablelm"):
        with pytest.raises(UnknownModelError):
            match_model(name)
        assert parse_request_lenient(f"lora {name} on a100").request.model is None
