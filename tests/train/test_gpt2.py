"""GPT-2 (``gpt2``; and GPT-BigCode, its nn.Linear multi-query cousin): config.json keys of its own (``n_embd``,
``n_layer``, ``n_head``, ``n_positions``, ``n_inner``, ``activation_function``) read as GPT2Config reads them, learned absolute positions (``transformer.wpe``) that bound the
sequence, ``Conv1D`` linears stored [in, out], and the Hub's files that leave out the ``transformer.`` prefix and keep
the causal-mask buffers. Counts, gradients, checkpoints and LoRA against transformers and PEFT are in
test_layernorm_families.py, logits parity in test_parity.py (``gpt2``, ``gpt2_inner`` in conftest.TINY_CONFIGS), the
dropouts in test_model_dropout.py."""

from __future__ import annotations

import json

import numpy as np
import pytest
from aegis.errors import InvalidConfigError, RequestParseError, UnsupportedArchitectureError
from aegis.models.profiles import profile_from_config
from aegis.train.modeling import build_model
from conftest import tiny_config

NAMES = ["gpt2", "gpt2_inner"]


@pytest.mark.parametrize("name", NAMES)
def test_spec_follows_gpt2config(name):
    """Widths, MLP width (``n_inner`` or 4 x ``n_embd``), activation, epsilon, tie, dropouts and the position table
    as transformers' GPT2Config reads the same config.json; no rotation."""
    from transformers import GPT2Config

    config = tiny_config(name)
    spec = build_model(config).spec
    hf = GPT2Config(**{k: v for k, v in config.items() if k != "model_type"})
    assert (spec.hidden_size, spec.num_layers, spec.num_heads, spec.num_kv_heads) == (
        hf.hidden_size, hf.num_hidden_layers, hf.num_attention_heads, hf.num_attention_heads)
    assert spec.intermediate_size == (hf.n_inner or 4 * hf.hidden_size)
    assert spec.hidden_act == hf.activation_function and spec.rms_norm_eps == hf.layer_norm_epsilon
    assert spec.tie_embeddings == hf.tie_word_embeddings
    assert spec.position_embeddings == hf.max_position_embeddings and spec.conv1d
    assert (spec.attention_dropout, spec.residual_dropout, spec.embedding_dropout) == (
        hf.attn_pdrop, hf.resid_pdrop, hf.embd_pdrop)
    assert all(r.rope_type == "none" for r in spec.ropes)
    assert spec.fused_qkv and not spec.qkv_grouped and spec.plain_mlp and spec.layer_norm
    assert spec.qkv_bias and spec.o_bias and spec.mlp_bias


def test_gpt2config_defaults_fill_a_config_that_leaves_keys_out():
    """A config.json holding only ``model_type`` is GPT-2 small (GPT2Config's defaults): 124,439,808 parameters, as
    transformers builds it on the meta device."""
    from family_checks import meta_model

    config = {"model_type": "gpt2"}
    profile = profile_from_config(config, model_id="t", source="path")
    assert profile.total_params == sum(p.numel() for p in meta_model(config).parameters()) == 124_439_808
    assert profile.position_embedding_params == 1024 * 768 and profile.max_position_embeddings == 1024


def test_hub_files_without_the_base_model_prefix_load(hf_checkpoint, tmp_path):
    """The Hub's GPT-2 checkpoints were saved from ``GPT2Model``: ``h.0.attn.c_attn.weight``, ``wte.weight``, no
    ``transformer.`` prefix, and the causal-mask buffers ``h.{i}.attn.bias`` beside them. transformers reads such a
    file into GPT2LMHeadModel; the engine reads it to the same logits."""
    import jax
    import torch
    from safetensors.numpy import load_file, save_file

    from aegis.train.weights import load_checkpoint

    hf, folder = hf_checkpoint("gpt2")
    tensors = load_file(folder / "model.safetensors")
    hub = {k.removeprefix("transformer."): v for k, v in tensors.items()}
    n = tiny_config("gpt2")["n_positions"]
    for i in range(tiny_config("gpt2")["n_layer"]):
        hub[f"h.{i}.attn.bias"] = np.tril(np.ones((n, n), np.float32))[None, None]
    assert not any(k.startswith("transformer.") for k in hub)
    save_file(hub, str(folder / "model.safetensors"))
    config = json.loads((folder / "config.json").read_text())
    model = build_model(config)
    params = load_checkpoint(model, folder)
    ids = np.random.default_rng(0).integers(0, 256, size=(2, 20)).astype(np.int32)
    with torch.no_grad():
        ref = hf(torch.from_numpy(ids).long()).logits.numpy()
    out = np.asarray(jax.jit(model.apply)(params, ids))
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4 * float(np.abs(ref).max()))


def test_a_sequence_past_the_learned_positions_is_refused_in_one_line():
    """There is no position embedding past row ``n_positions - 1``: the engine refuses the longer sequence (a lookup
    past the table would read nothing that was trained), and so does the planner for an explicit seq."""
    import jax

    from aegis import plan

    model = build_model(tiny_config("gpt2"))
    params = model.init(jax.random.PRNGKey(0))
    n = model.spec.position_embeddings
    assert model.apply(params, np.zeros((1, n), np.int32)).shape == (1, n, 256)
    with pytest.raises(InvalidConfigError) as err:
        model.apply(params, np.zeros((1, n + 1), np.int32))
    assert str(n) in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(RequestParseError) as err:
        plan("lora gpt2 on t4 seq 2048")
    assert "1,024" in str(err.value) and "\n" not in str(err.value)
    assert plan("lora gpt2 on t4").recommended.config.seq_len <= 1024


@pytest.mark.parametrize(("key", "value"), [("add_cross_attention", True), ("scale_attn_by_inverse_layer_idx", True),
                                            ("scale_attn_weights", False)])
def test_settings_the_engine_does_not_compute_are_refused_in_one_line(key, value):
    config = {**tiny_config("gpt2"), key: value}
    for make in (lambda: profile_from_config(config, model_id="t", source="path"), lambda: build_model(config)):
        with pytest.raises(UnsupportedArchitectureError) as err:
            make()
        assert key in str(err.value) and "\n" not in str(err.value)


def test_qlora_keeps_the_position_table_unquantised():
    """bitsandbytes quantises the Conv1D linears (transposed first) and leaves ``wpe`` alone; so does the engine."""
    import jax

    from aegis.train.nf4 import NF4Tensor, quantize_params

    model = build_model(tiny_config("gpt2"))
    q = quantize_params(model, model.init(jax.random.PRNGKey(0)))
    assert not isinstance(q["model"]["embed_positions"]["weight"], NF4Tensor)
    assert isinstance(q["model"]["layers"]["self_attn"]["c_attn"]["weight"], NF4Tensor)
    assert isinstance(q["model"]["layers"]["mlp"]["c_fc"]["weight"], NF4Tensor)


def test_keys_gpt2config_does_not_have_are_ignored_as_transformers_ignores_them():
    """A GPT-2 config.json written with Llama-style keys (head_dim, num_key_value_heads, intermediate_size: what
    ``AutoConfig.for_model("gpt2", hidden_size=..., num_key_value_heads=...)`` saves) is the same model to
    transformers: the same count, and the same spec and plan here."""
    from family_checks import meta_model

    clean = tiny_config("gpt2")
    stray = {**clean, "head_dim": 3, "num_key_value_heads": 1, "intermediate_size": 7}
    assert sum(p.numel() for p in meta_model(stray).parameters()) == sum(p.numel() for p in meta_model(clean).parameters())
    assert build_model(stray).spec == build_model(clean).spec
    a, b = (profile_from_config(c, model_id="t", source="path") for c in (stray, clean))
    assert (a.total_params, a.head_dim, a.num_key_value_heads, a.intermediate_size) == (
        b.total_params, b.head_dim, b.num_key_value_heads, b.intermediate_size)


@pytest.mark.parametrize("name", ["gpt_bigcode", "gpt_bigcode_mha"])
def test_gpt_bigcode_spec_follows_its_config(name):
    """GPT-BigCode (StarCoder, SantaCoder): GPT-2's keys and layout in nn.Linear, one key/value head under
    ``multi_query`` (c_attn's rows [q; k; v]) or a key and value per head ([q_h; k_h; v_h], grouped like GPT-NeoX)."""
    from transformers import GPTBigCodeConfig

    config = tiny_config(name)
    spec = build_model(config).spec
    hf = GPTBigCodeConfig(**{k: v for k, v in config.items() if k != "model_type"})
    assert spec.num_kv_heads == (1 if hf.multi_query else hf.num_attention_heads)
    assert spec.head_dim == hf.hidden_size // hf.num_attention_heads
    assert spec.intermediate_size == (hf.n_inner or 4 * hf.hidden_size)
    assert spec.fused_qkv and spec.qkv_grouped and not spec.conv1d
    assert spec.position_embeddings == hf.max_position_embeddings and spec.tie_embeddings == hf.tie_word_embeddings
    profile = profile_from_config(config, model_id="t", source="path")
    assert profile.num_key_value_heads == spec.num_kv_heads and profile.position_embedding_params > 0
