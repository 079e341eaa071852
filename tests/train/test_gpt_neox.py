"""GPT-NeoX (``gpt_neox``: Pythia, GPT-NeoX-20B): checkpoints under ``gpt_neox.*`` with the LM head saved as
``embed_out``, one ``query_key_value`` projection whose rows are grouped by head, partial RoPE (GPTNeoXConfig's 0.25,
also read from the older ``rotary_pct``/``rotary_emb_base``), a GELU MLP with biases, and, with
``use_parallel_residual`` (the default), attention and the MLP side by side on two LayerNorms: GPTNeoXConfig's
defaults, the engine reading PEFT's own adapter, the refusals. Counts, gradients, checkpoints and LoRA against
transformers and PEFT (the engine's adapter loaded by PEFT) are in test_layernorm_families.py, logits parity in
test_parity.py (``gpt_neox``, ``gpt_neox_sequential`` in conftest.TINY_CONFIGS), the dropouts in
test_model_dropout.py."""

from __future__ import annotations

import pytest
from aegis.errors import UnsupportedArchitectureError
from aegis.models.profiles import profile_from_config
from aegis.train.modeling import build_model
from conftest import tiny_config
from family_checks import (
    meta_model,
)

NAMES = ["gpt_neox", "gpt_neox_sequential"]


@pytest.mark.parametrize("name", NAMES)
def test_defaults_and_layout_follow_gptneoxconfig(name):
    """Rotary fraction and base from ``rope_parameters`` as GPTNeoXConfig fills it (``rotary_pct``,
    ``rotary_emb_base`` or its defaults); biases per ``attention_bias``; the parallel block per
    ``use_parallel_residual``."""
    from transformers import GPTNeoXConfig

    config = tiny_config(name)
    spec = build_model(config).spec
    hf = GPTNeoXConfig(**{k: v for k, v in config.items() if k != "model_type"})
    head = hf.hidden_size // hf.num_attention_heads
    assert spec.ropes[0].rotary_dim == int(head * hf.rope_parameters["partial_rotary_factor"])
    assert spec.ropes[0].theta == hf.rope_parameters["rope_theta"]
    assert spec.hidden_act == hf.hidden_act and spec.rms_norm_eps == hf.layer_norm_eps
    assert spec.parallel_block == spec.parallel_mlp_norm == hf.use_parallel_residual
    assert spec.qkv_bias == spec.o_bias == hf.attention_bias and spec.mlp_bias
    assert spec.fused_qkv and spec.qkv_grouped and spec.plain_mlp and spec.layer_norm


def test_grouped_key_value_heads_are_refused_in_one_line():
    """GPTNeoXConfig has no num_key_value_heads: a config that sets fewer key/value heads is not a GPT-NeoX that
    transformers builds, and is refused rather than counted with grouped heads."""
    config = {**tiny_config("gpt_neox"), "num_key_value_heads": 2}
    assert sum(p.numel() for p in meta_model(config).parameters()) == sum(
        p.numel() for p in meta_model(tiny_config("gpt_neox")).parameters())
    for make in (lambda: profile_from_config(config, model_id="t", source="path"), lambda: build_model(config)):
        with pytest.raises(UnsupportedArchitectureError) as err:
            make()
        assert "num_key_value_heads" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.slow
def test_the_engine_reads_peft_s_adapter_to_peft_s_logits(hf_checkpoint, tmp_path):
    """An adapter PEFT made and saved (``gpt_neox.layers.{i}.attention.query_key_value.lora_A``...) loads into the
    engine, which then gives PEFT's logits."""
    import jax.numpy as jnp
    import numpy as np
    import peft
    import torch
    from aegis.train.weights import load_checkpoint, load_lora_adapter

    hf, folder = hf_checkpoint("gpt_neox")
    wrapped = peft.get_peft_model(hf, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["query_key_value", "dense"]))
    torch.manual_seed(3)
    with torch.no_grad():
        for name, p in wrapped.named_parameters():
            if "lora_" in name:
                p.normal_(0.0, 0.2)
    wrapped.save_pretrained(tmp_path / "adapter")
    model = build_model(tiny_config("gpt_neox"))
    params = load_checkpoint(model, folder)
    lora = load_lora_adapter(model, tmp_path / "adapter")
    ids = np.arange(3, 19).reshape(1, 16)
    with torch.no_grad():
        theirs = wrapped(torch.from_numpy(ids)).logits.numpy()
    ours = np.asarray(model.apply(params, jnp.asarray(ids), lora=lora))
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)
