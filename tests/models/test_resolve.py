"""Model profiles: resolution by id and path, aliases, default targets. (Bundled configs' parameter counts equal
transformers' and the engine's in tests/models/test_three_way_counts.py, the one home of that property.)"""

import json

import pytest

import aegis
from aegis.models import catalog
from aegis.models.resolve import canonical_model_id, resolve_model

BUNDLED = [m.id for m in catalog.models()]


def _meta_counts(config: dict):
    import torch
    import transformers

    cfg = transformers.AutoConfig.for_model(**config)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    total = sum(p.numel() for p in model.parameters())
    embed = model.get_input_embeddings().weight.numel()
    return model, total, embed


def _tweaked(model_id: str, **changes) -> dict:
    config = dict(resolve_model(model_id).config)
    config.update(changes)
    return config


UNBUNDLED = [
    ("meta-llama/Llama-3.2-1B", dict(num_hidden_layers=3, hidden_size=512, intermediate_size=1376, num_attention_heads=8,
                                     num_key_value_heads=2, head_dim=64, tie_word_embeddings=False, mlp_bias=True)),
    ("Qwen/Qwen2.5-0.5B", dict(num_hidden_layers=5, hidden_size=384, num_attention_heads=6, num_key_value_heads=3)),
    ("google/gemma-2-2b", dict(num_hidden_layers=4, layer_types=None, head_dim=96)),
    ("google/gemma-3-1b-pt", dict(num_hidden_layers=7, layer_types=None, attention_bias=True)),
    ("mistralai/Mixtral-8x7B-v0.1", dict(num_hidden_layers=2, num_local_experts=4, num_experts_per_tok=1, hidden_size=256,
                                         intermediate_size=512, num_attention_heads=4, num_key_value_heads=2, head_dim=64)),
    ("Qwen/Qwen1.5-MoE-A2.7B", dict(num_hidden_layers=4, decoder_sparse_step=2, mlp_only_layers=[3], num_experts=6,
                                    hidden_size=128, intermediate_size=256, moe_intermediate_size=64,
                                    shared_expert_intermediate_size=96, num_attention_heads=4, num_key_value_heads=4)),
    ("Qwen/Qwen3-30B-A3B", dict(num_hidden_layers=3, mlp_only_layers=[1], num_experts=8, hidden_size=128,
                                 num_attention_heads=4, num_key_value_heads=2, head_dim=32, moe_intermediate_size=48,
                                 intermediate_size=200)),
    ("microsoft/Phi-3-mini-4k-instruct", dict(num_hidden_layers=2, hidden_size=256, num_attention_heads=8,
                                              num_key_value_heads=4, intermediate_size=512)),
]


@pytest.mark.parametrize(("base", "changes"), UNBUNDLED, ids=[b for b, _ in UNBUNDLED])
def test_unbundled_config_from_path(tmp_path, base, changes):
    if catalog.model_entry(base) is None:
        pytest.skip(f"{base} not bundled")
    config = _tweaked(base, **changes)
    (tmp_path / "config.json").write_text(json.dumps(config))
    profile = resolve_model(str(tmp_path))
    assert profile.source == "path"
    _, total, embed = _meta_counts(profile.config)
    assert profile.total_params == total and profile.embedding_params == embed


@pytest.mark.parametrize(
    ("model", "targets"),
    [
        ("Qwen/Qwen2.5-0.5B", ("q_proj", "v_proj", "down_proj")),
        ("Qwen/Qwen2.5-0.5B", ("all-linear",)),
        ("mixtral-8x7b", ("all-linear",)),  # ParamWrapper experts (2r on gate_up) and router
        ("mixtral-8x7b", ("w1", "w3", "w2")),
        ("mixtral-8x7b", aegis.schema.ALL_LINEAR_TARGETS),  # v4 dense names: attention only on Mixtral
        ("qwen3-30b-a3b", ("all-linear",)),
        ("qwen3-30b-a3b", ("q_proj", "gate")),  # the router alone
        ("qwen1.5-moe-a2.7b", ("all-linear",)),  # Qwen2-MoE: shared expert and its gate, no routed experts
        ("phi-3-mini", aegis.schema.ALL_LINEAR_TARGETS),  # fused qkv_proj / gate_up_proj: only o and down match
        ("phi-3-mini", ("qkv_proj", "gate_up_proj")),
    ],
)
def test_lora_trainable_equals_peft(model, targets):
    """Adapter parameters equal PEFT's count on the transformers model (meta device, 2 layers of the real
    widths), "all-linear" and PEFT 0.21's MoE parameter targets included."""
    import peft
    import torch
    import transformers

    from aegis.models.profiles import profile_from_config

    config = {**resolve_model(model).config, "num_hidden_layers": 2}
    config.pop("layer_types", None)
    profile = profile_from_config(config, model_id=model, source="path")
    cfg = transformers.AutoConfig.for_model(**config)
    with torch.device("meta"):
        hf_model = transformers.AutoModelForCausalLM.from_config(cfg)
    lora = aegis.LoRAConfig(rank=8, target_modules=targets)
    target_modules = "all-linear" if targets == ("all-linear",) else list(targets)
    peft_model = peft.get_peft_model(hf_model, peft.LoraConfig(r=8, target_modules=target_modules))
    trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    assert profile.trainable_params("lora", lora) == trainable


def test_lora_targets_that_match_nothing_are_refused_as_peft_refuses_them():
    with pytest.raises(aegis.InvalidConfigError, match="valid names: .*q_proj"):
        aegis.estimate_memory("llama-3.2-1b", lora=aegis.LoRAConfig(target_modules=("w1", "w2")))
    with pytest.raises(aegis.InvalidConfigError, match="valid names: .*gate"):
        aegis.estimate_memory("qwen3-30b-a3b", lora=aegis.LoRAConfig(target_modules=("gate_up_proj",)))


def test_moe_active_params_smaller_than_total():
    profile = resolve_model("mixtral-8x7b")
    assert profile.is_moe and profile.num_experts == 8 and profile.num_experts_per_tok == 2
    assert profile.active_params_per_token < profile.total_params / 3


def test_aliases_and_errors(tmp_path):
    assert canonical_model_id("Llama-3.1-8B") == "meta-llama/Llama-3.1-8B"
    assert canonical_model_id("llama 3.1 8b") == "meta-llama/Llama-3.1-8B"
    assert resolve_model("lama-3.1-8b").model_id == "meta-llama/Llama-3.1-8B"  # a spelling fix of a full name
    with pytest.raises(aegis.UnknownModelError, match="did you mean meta-llama/"):
        resolve_model("lama-8b")  # a shorthand is not guessed at
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(aegis.InvalidConfigError, match="not valid JSON"):
        resolve_model(str(bad))
    bad.write_text(json.dumps({"model_type": "bloom", "architectures": ["BloomForCausalLM"]}))
    with pytest.raises(aegis.UnsupportedArchitectureError, match="supported model_types: .*llama"):
        resolve_model(str(bad))
    bad.write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    with pytest.raises(aegis.InvalidConfigError, match="num_hidden_layers"):
        resolve_model(str(bad))


def test_offline_uncached_hub_id_is_a_clear_error():
    with pytest.raises((aegis.OfflineError, aegis.UnknownModelError), match="config.json"):
        resolve_model("some-org/not-a-cached-model")


def test_default_targets_adapt_every_projection_of_every_catalog_model():
    """The plan's default LoRA targets select every module "all-linear" does except routers and gates, under
    the names PEFT matches in that model."""
    from aegis.schema import default_lora_targets

    for m in catalog.models():
        profile = resolve_model(m.id)
        targets = default_lora_targets(profile.linear_modules)
        gates = sum(mod.count * 16 * (mod.in_features + mod.out_features) for mod in profile.linear_modules
                    if mod.lora_targetable and set(mod.matched_by) & {"gate", "router", "shared_expert_gate"})
        every = profile.trainable_params("lora", aegis.LoRAConfig(target_modules=("all-linear",)))
        assert profile.trainable_params("lora", aegis.LoRAConfig(target_modules=targets)) == every - gates, m.id
