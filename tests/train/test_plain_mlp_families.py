"""The families with a plain two-matrix MLP and LayerNorms: Phi-1/1.5/2 (``phi``: attention and the fc1/fc2 MLP side
by side on one LayerNorm, ``dense``, partial RoPE, an lm_head bias) and StarCoder2 (``starcoder2``: sequential
LayerNorm blocks, c_fc/c_proj, biases per use_bias, one sliding window): PhiConfig's defaults and the catalog's names.
Counts, gradients, checkpoints and LoRA against transformers and PEFT are in test_layernorm_families.py, logits parity
in test_parity.py (``phi``, ``phi_qk``, ``starcoder2`` in conftest.TINY_CONFIGS), the dropouts in
test_model_dropout.py."""

from __future__ import annotations

import pytest
from aegis.models import catalog
from aegis.train.modeling import build_model
from conftest import tiny_config

BUNDLED = [m for m in catalog.models() if catalog.read_model_config(m)["model_type"] in ("phi", "starcoder2")]


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


def test_the_catalog_serves_phi_and_starcoder2_and_refuses_the_sizes_it_does_not_hold():
    from aegis.errors import AegisError
    from aegis.models.resolve import resolve_model
    from aegis.planning.parse import parse_request

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
