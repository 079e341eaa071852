"""OPT (``opt``): learned positions read two rows on (``OPTLearnedPositionalEmbedding``'s offset), ``ffn_dim``,
``enable_bias``, ReLU, LayerNorms named ``self_attn_layer_norm`` / ``final_layer_norm``, fc1/fc2 on the layer itself,
everything under ``model.decoder``; the settings OPT-350m uses (post-LayerNorm, project_in/out) refused. Counts,
gradients, checkpoints and LoRA against transformers and PEFT are in test_layernorm_families.py, logits parity in
test_parity.py (``opt``, ``opt_nobias`` in conftest.TINY_CONFIGS), the dropouts in test_model_dropout.py."""

from __future__ import annotations

import numpy as np
import pytest
from aegis.errors import InvalidConfigError, UnsupportedArchitectureError
from aegis.models.profiles import profile_from_config
from aegis.train.modeling import build_model
from conftest import tiny_config

NAMES = ["opt", "opt_nobias"]


@pytest.mark.parametrize("name", NAMES)
def test_spec_follows_optconfig(name):
    from transformers import OPTConfig

    config = tiny_config(name)
    spec = build_model(config).spec
    hf = OPTConfig(**{k: v for k, v in config.items() if k != "model_type"})
    assert (spec.hidden_size, spec.num_layers, spec.num_heads, spec.num_kv_heads, spec.intermediate_size) == (
        hf.hidden_size, hf.num_hidden_layers, hf.num_attention_heads, hf.num_attention_heads, hf.ffn_dim)
    assert spec.hidden_act == hf.activation_function and spec.rms_norm_eps == 1e-5  # nn.LayerNorm's default
    assert spec.tie_embeddings == hf.tie_word_embeddings
    assert spec.qkv_bias == spec.o_bias == spec.mlp_bias == hf.enable_bias
    assert (spec.attention_dropout, spec.residual_dropout, spec.embedding_dropout) == (hf.attention_dropout, hf.dropout, 0.0)
    # position p reads row p + 2 of a table of max_position_embeddings + 2 rows
    assert (spec.position_embeddings, spec.position_offset) == (hf.max_position_embeddings + 2, 2)
    assert all(r.rope_type == "none" for r in spec.ropes) and not spec.conv1d


def test_the_full_context_runs_and_one_token_more_is_refused():
    import jax

    model = build_model(tiny_config("opt"))
    params = model.init(jax.random.PRNGKey(0))
    n = tiny_config("opt")["max_position_embeddings"]
    assert model.apply(params, np.zeros((1, n), np.int32)).shape == (1, n, 256)
    with pytest.raises(InvalidConfigError) as err:
        model.apply(params, np.zeros((1, n + 1), np.int32))
    assert f"{n:,}" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(("key", "value"), [("do_layer_norm_before", False), ("word_embed_proj_dim", 32),
                                            ("_remove_final_layer_norm", True), ("layer_norm_elementwise_affine", False),
                                            ("layerdrop", 0.1)])
def test_settings_aegis_does_not_describe_are_refused_in_one_line(key, value):
    config = {**tiny_config("opt"), key: value}
    for make in (lambda: profile_from_config(config, model_id="t", source="path"), lambda: build_model(config)):
        with pytest.raises(UnsupportedArchitectureError) as err:
            make()
        assert key in str(err.value) and "\n" not in str(err.value)


def test_hub_files_saved_from_optmodel_load(hf_checkpoint):
    """OPT's Hub checkpoints name ``decoder.layers.0.*`` (saved from OPTModel, no ``model.`` prefix); the engine reads
    them as transformers does, to the same logits."""
    import json

    import jax
    import torch
    from safetensors.numpy import load_file, save_file

    from aegis.train.weights import load_checkpoint

    hf, folder = hf_checkpoint("opt")
    tensors = load_file(folder / "model.safetensors")
    save_file({k.removeprefix("model."): v for k, v in tensors.items()}, str(folder / "model.safetensors"))
    model = build_model(json.loads((folder / "config.json").read_text()))
    params = load_checkpoint(model, folder)
    ids = np.random.default_rng(0).integers(3, 256, size=(2, 16)).astype(np.int32)
    with torch.no_grad():
        ref = hf(torch.from_numpy(ids).long()).logits.numpy()
    np.testing.assert_allclose(np.asarray(jax.jit(model.apply)(params, ids)), ref, rtol=1e-4,
                               atol=1e-4 * float(np.abs(ref).max()))
