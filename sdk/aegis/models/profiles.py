"""Model profiles: a config.json dict → the `ModelProfile` the planner and memory engine size, every count from
layer shapes (the family registry, `aegis.models.families`, reads each architecture's config keys).

    profile = profile_from_config(json.load(open("config.json")), model_id="acme/tiny", source="path")
    profile.total_params, profile.linear_modules

`aegis.models.resolve.resolve_model` finds the config for a name and calls this.
"""

from __future__ import annotations

from typing import Any

from aegis.errors import InvalidConfigError
from aegis.models.families import get_family
from aegis.schema import LinearModule, ModelProfile

__all__ = ["profile_from_config"]


def profile_from_config(config: Any, *, model_id: str, source: str, transformers_major: int = 5) -> ModelProfile:
    """Compute a `ModelProfile` from a config.json dict (every count from shapes), with the module layout
    ``transformers_major`` builds (4.x: MoE experts as separate nn.Linear)."""
    if not isinstance(config, dict):
        raise InvalidConfigError(f"config for {model_id} is not a JSON object: pass a Hugging Face config.json")
    if config.get("model_type") == "gemma3" and isinstance(config.get("text_config"), dict):
        config = {**config["text_config"], "model_type": "gemma3_text", "architectures": ["Gemma3ForCausalLM"]}
    family = get_family(config)
    layers = family.layers_for(config, transformers_major)
    hidden, vocab = family.hidden(config), family.vocab(config)
    if hidden == 0 or vocab == 0 or not layers or family.heads(config) == 0:
        raise InvalidConfigError(f"config for {model_id} has a zero size (hidden, vocab, layers or heads): check config.json")
    embedding = vocab * hidden
    lm_head = (0 if family.tied(config) else vocab * hidden) + (vocab if family.lm_head_bias(config) else 0)
    final_norm = family.final_norm_params(config)
    positions = family.position_embedding_params(config)  # GPT-2's learned wpe
    layer_params = tuple(layer.params for layer in layers)
    total = embedding + positions + lm_head + final_norm + sum(layer_params)
    active = embedding + positions + lm_head + final_norm + sum(layer.active_params for layer in layers)
    merged: dict[tuple, int] = {}
    for layer in layers:
        for lin in layer.linears:
            key = (lin.name, lin.in_features, lin.out_features, lin.bias, lin.matched_by, lin.lora_targetable, lin.quantizable,
                   lin.lora_rank_factor)
            merged[key] = merged.get(key, 0) + lin.count
    modules = tuple(
        LinearModule(
            name=name, in_features=i, out_features=o, count=n, bias=b,
            matched_by=mb or (name,), lora_targetable=lt, quantizable=qz, lora_rank_factor=rf,
        )
        for (name, i, o, b, mb, lt, qz, rf), n in merged.items()
    )
    sliding = next((layer.sliding_window for layer in layers if layer.sliding_window), None)
    moe = next((layer for layer in layers if layer.num_experts), None)
    return ModelProfile(
        model_id=model_id,
        source=source,  # type: ignore[arg-type]
        architecture=(config.get("architectures") or [type(family).__name__])[0],
        model_type=config["model_type"],
        family=family.name,
        family_description=family.description,
        num_layers=len(layers),
        hidden_size=hidden,
        intermediate_size=moe.mlp_intermediate if moe else family.intermediate(config),
        num_attention_heads=family.heads(config),
        num_key_value_heads=family.kv_heads(config),
        head_dim=family.head_dim(config),
        vocab_size=vocab,
        tie_word_embeddings=family.tied(config),
        max_position_embeddings=family.max_positions(config),
        num_experts=moe.num_experts if moe else 0,
        num_experts_per_tok=moe.experts_per_tok if moe else 0,
        sliding_window=sliding,
        total_params=total,
        embedding_params=embedding,
        lm_head_params=lm_head,
        position_embedding_params=positions,
        layer_params=layer_params,
        norm_params=final_norm + sum(layer.norm_params for layer in layers),
        active_params_per_token=active,
        linear_modules=modules,
        config=config,
        layout_major=transformers_major,
    )
