"""Falcon (``falcon``: Falcon-7B/40B/180B): checkpoints under ``transformer.*``, one ``query_key_value`` projection
whose rows are grouped by key/value head (``[q_1 .. q_g, k, v]``: multi-query Falcon-7B's one group is ``[q; k; v]``,
Falcon-40B's eight groups, the old non-multi-query layout's one head each), the MLP 4 x hidden unless
``ffn_hidden_size``, ``activation`` for the MLP, tied embeddings by default, and three block layouts: parallel on one
LayerNorm (Falcon-7B), parallel on ``ln_attn``/``ln_mlp`` (``new_decoder_architecture``), sequential
(``parallel_attn`` false): FalconConfig's layout, the refusals, the catalog's names. Counts, gradients, checkpoints and
LoRA against transformers and PEFT are in test_layernorm_families.py, logits parity in test_parity.py (``falcon``,
``falcon_new``, ``falcon_sequential``)."""

from __future__ import annotations

import pytest
from aegis.errors import UnsupportedArchitectureError
from aegis.models.profiles import profile_from_config
from aegis.train.modeling import build_model
from conftest import tiny_config

NAMES = ["falcon", "falcon_new", "falcon_sequential"]
TARGETS = ("query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h")


@pytest.mark.parametrize("name", NAMES)
def test_layout_follows_falconconfig(name):
    """Key/value heads, MLP width, activation, biases, tying and the norms per FalconConfig and FalconDecoderLayer."""
    from transformers import FalconConfig

    config = tiny_config(name)
    spec = build_model(config).spec
    hf = FalconConfig(**{k: v for k, v in config.items() if k != "model_type"})
    kv = hf.num_kv_heads if hf.new_decoder_architecture or not hf.multi_query else 1
    assert (spec.num_kv_heads, spec.intermediate_size, spec.hidden_act) == (kv, hf.ffn_hidden_size, hf.activation)
    assert spec.qkv_bias == spec.o_bias == spec.mlp_bias == hf.bias and spec.tie_embeddings == hf.tie_word_embeddings
    assert spec.parallel_block == hf.parallel_attn
    assert spec.parallel_mlp_norm == bool(hf.new_decoder_architecture)  # ln_attn and ln_mlp
    assert spec.fused_qkv and spec.qkv_grouped and spec.plain_mlp and spec.layer_norm


@pytest.mark.parametrize(("change", "word"), [
    ({"alibi": True}, "alibi"),
    ({"new_decoder_architecture": True, "num_kv_heads": 2, "parallel_attn": False}, "parallel_attn"),
    ({"multi_query": False, "num_kv_heads": 2}, "num_kv_heads"),
    ({"hidden_dropout": 0.1}, "dropout"),
    ({"attention_dropout": 0.1}, "dropout"),
])
def test_settings_the_registry_does_not_describe_are_refused_in_one_line(change, word):
    """ALiBi (Falcon-RW), a layout transformers cannot run, grouped heads without the new layout, and the dropouts
    (Falcon adds them where no other family does): neither a count nor a model is made."""
    config = {**tiny_config("falcon"), **change}
    for make in (lambda: profile_from_config(config, model_id="t", source="path"), lambda: build_model(config)):
        with pytest.raises(UnsupportedArchitectureError) as err:
            make()
        assert word in str(err.value) and "\n" not in str(err.value)


def test_the_catalog_serves_falcon_and_keeps_it_apart_from_falcon3():
    """Falcon 7B/40B/180B (base and chat) are bundled and named by size; Falcon3 names keep their own (Llama-shaped)
    entries; Falcon-RW, Falcon-Mamba, Falcon 2 and other sizes are refused."""
    from aegis.errors import UnknownModelError
    from aegis.models.resolve import match_model, resolve_model
    from aegis.planning.parse import parse_request_lenient

    for name, model_id in (("falcon-7b", "tiiuae/falcon-7b"), ("falcon:40b", "tiiuae/falcon-40b"),
                           ("falcon-7b-instruct", "tiiuae/falcon-7b-instruct"), ("falcon-180b", "tiiuae/falcon-180B"),
                           ("falcon3-7b", "tiiuae/Falcon3-7B-Base")):
        assert resolve_model(name).model_id == model_id
        assert parse_request_lenient(f"lora {name} on a100").request.model == model_id
    assert resolve_model("falcon-7b").total_params == 6_921_720_704
    for name in ("falcon-11b", "falcon-rw-1b", "falcon-mamba-7b", "falcon2-11b", "falcon"):
        with pytest.raises(UnknownModelError):
            match_model(name)
        assert parse_request_lenient(f"lora {name} on a100").request.model is None


def test_qlora_is_refused_on_transformers_5_where_bitsandbytes_skips_falconlinear():
    """transformers 5 replaces ``type(module) is nn.Linear`` only, so Falcon's FalconLinear layers stay unquantised
    (traced: Falcon-7B/40B QLoRA rows quantised 0 modules and held fp32 weights); 4.x replaced them (isinstance)."""
    import aegis
    from aegis.errors import InvalidConfigError
    from aegis.models.resolve import resolve_model
    from aegis.planning.memory.estimate import estimate
    from aegis.schema import LoRAConfig, StackProfile, TrainConfig

    profile = resolve_model("falcon-7b")
    lora = LoRAConfig(target_modules=TARGETS)
    with pytest.raises(InvalidConfigError) as err:
        estimate(profile, TrainConfig(method="qlora", lora=lora, stack=StackProfile(transformers_version="5.24.0")))
    assert "FalconLinear" in str(err.value) and "--transformers 4" in str(err.value) and "\n" not in str(err.value)
    v4 = estimate(profile, TrainConfig(method="qlora", lora=lora, stack=StackProfile(transformers_version="4.48.1")))
    lora_v5 = estimate(profile, TrainConfig(method="lora", lora=lora, stack=StackProfile(transformers_version="5.24.0")))
    assert v4.component("weights").bytes < lora_v5.component("weights").bytes / 3
    assert aegis.plan("lora falcon-7b on an a100").recommended is not None
