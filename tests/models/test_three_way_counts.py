"""Planner, engine and transformers agree on every bundled and tiny config.json.

Three readings of one config: the planner's profile (`aegis.models.profiles.profile_from_config`, shapes from
`aegis.models.families`), the JAX engine's parameter tree (`aegis.train.modeling.build_model(...).param_shapes()`,
shapes only) and transformers' model built on the meta device. They must agree on the parameter count
(a tied head counted once), head_dim, kv heads, tied embeddings and which layers use which sliding window;
the planner's embedding and per-layer counts equal transformers' modules'. The JAX memory profile's copy of
the engine tree (`aegis.planning.memory.jax_profile.engine_leaves`) is checked against the engine too. This is the one
home of "planner = engine = transformers parameter count": every bundled catalog config and every tiny family
config of the engine tests (tests/train/conftest.TINY_CONFIGS).

The second half builds configs *without* a key whose default the planner and engine once read
differently, and asserts all three land on transformers' default; the last test pins
`aegis.models.architectures.config_keys.TRANSFORMERS_DEFAULTS` to transformers' dataclass fields.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import pytest

from aegis.models import catalog
from aegis.models.architectures import config_keys as arch
from aegis.errors import UnsupportedArchitectureError
from tests.train.conftest import TINY_CONFIGS

FULL = None


@functools.cache
def _catalog_configs() -> dict[str, dict[str, Any]]:
    return {m.id: catalog.read_model_config(m) for m in catalog.models()}


CASES = [*(f"catalog:{m.id}" for m in catalog.models()), *(f"tiny:{name}" for name in TINY_CONFIGS)]


def _config(case: str) -> dict[str, Any]:
    kind, name = case.split(":", 1)
    return dict(_catalog_configs()[name] if kind == "catalog" else TINY_CONFIGS[name])


def _planner(cfg: dict[str, Any]) -> dict[str, Any]:
    from aegis.models.families import get_family
    from aegis.planning.memory.jax_profile import engine_leaves
    from aegis.models.profiles import profile_from_config

    try:
        profile = profile_from_config(cfg, model_id="test/config", source="catalog")
    except UnsupportedArchitectureError as e:
        pytest.skip(f"planner has no family for model_type {cfg.get('model_type')!r}: {e}")
    family = get_family(profile.config)
    return dict(
        params=profile.total_params,
        head_dim=profile.head_dim,
        kv_heads=profile.num_key_value_heads,
        tied=profile.tie_word_embeddings,
        windows=tuple(layer.sliding_window for layer in family.layers(profile.config)),
        jax_profile_params=sum(leaf.size for leaf in engine_leaves(profile)),
        embedding_params=profile.embedding_params,
        layer_params=profile.layer_params,
    )


def _engine(cfg: dict[str, Any]) -> dict[str, Any]:
    import jax

    from aegis.train.modeling import build_model, engine_model_types

    if cfg.get("model_type") not in engine_model_types():
        pytest.skip(f"the JAX engine has no family for model_type {cfg.get('model_type')!r}")
    from aegis.models.shapes import BUFFER_LEAVES

    model = build_model(cfg)
    flat = jax.tree_util.tree_flatten_with_path(model.param_shapes(), is_leaf=lambda x: isinstance(x, tuple))[0]
    shapes = [s for path, s in flat if path[-1].key not in BUFFER_LEAVES]  # buffers (DeepSeek-V3) are no parameters
    spec = model.spec
    return dict(
        params=sum(math.prod(s) for s in shapes),
        head_dim=spec.head_dim,
        kv_heads=spec.num_kv_heads,
        tied=spec.tie_embeddings,
        windows=tuple(FULL if w >= 2**30 else w for w in spec.layer_window),
    )


def _transformers(cfg: dict[str, Any]) -> dict[str, Any]:
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    hf_config = transformers.AutoConfig.for_model(**cfg)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(hf_config)
    # only classes with a layer_types field read it (Mistral, Mixtral, Phi-3, Qwen3-MoE slide every layer)
    fields = {f.name for f in dataclasses.fields(type(hf_config))}
    types = getattr(hf_config, "layer_types", None) if "layer_types" in fields else None
    window = getattr(hf_config, "sliding_window", None)
    from aegis.models.architectures import registry

    layers = model.get_submodule(registry.get(cfg["model_type"]).layers_path)  # Falcon: transformer.h
    layer = layers[0]
    attn = next(getattr(layer, n) for n in ("self_attn", "attention", "self_attention", "attn") if hasattr(layer, n))
    return dict(
        params=sum(p.numel() for p in model.parameters()),  # a tied head is one parameter, listed once
        # MLA: the query / key head width; GPT-NeoX: head_size
        head_dim=getattr(attn, "qk_head_dim", None) or getattr(attn, "head_dim", None) or attn.head_size,
        kv_heads=getattr(hf_config, "num_key_value_heads", None) or getattr(attn, "num_kv_heads", None)
        or hf_config.num_attention_heads,  # Falcon's attention holds its own (one for multi-query)
        tied=model.get_output_embeddings().weight is model.get_input_embeddings().weight,
        windows=tuple(
            window if window and (types is None or types[i] == "sliding_attention") else FULL
            for i in range(hf_config.num_hidden_layers)
        ),
        embedding_params=model.get_input_embeddings().weight.numel(),
        layer_params=tuple(sum(p.numel() for p in lay.parameters()) for lay in layers),
        config=hf_config,
    )


def _three_way(cfg: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    planner, engine = _planner(cfg), _engine(cfg)
    hf = _transformers(cfg)
    for key in ("params", "head_dim", "kv_heads", "tied", "windows"):
        got = f"{key}: planner {planner[key]}, engine {engine[key]}, transformers {hf[key]}"
        assert planner[key] == engine[key] == hf[key], got
    assert planner["jax_profile_params"] == engine["params"], "jax_profile.engine_leaves differs from the engine tree"
    for key in ("embedding_params", "layer_params"):
        assert planner[key] == hf[key], f"{key}: planner {planner[key]}, transformers {hf[key]}"
    return planner, engine, hf


@pytest.mark.parametrize("case", CASES)
def test_planner_engine_transformers_agree(case: str) -> None:
    _three_way(_config(case))


# ----- one test per default the planner and the engine once read differently ------------------------------

_SMALL: dict[str, Any] = {
    "vocab_size": 128, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512, "pad_token_id": 0,
}


def _small(model_type: str, *, drop: tuple[str, ...] = (), **over: Any) -> dict[str, Any]:
    cfg = {**_SMALL, "model_type": model_type, **over}
    for key in drop:
        cfg.pop(key, None)
    return cfg


_QWEN2_MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48)
_QWEN3_MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, head_dim=16)
_MIXTRAL = dict(num_local_experts=4, num_experts_per_tok=2)
_KV32 = dict(hidden_size=256, num_attention_heads=32)  # room for a default of 32 kv heads

WITHOUT_KEY = {
    # Qwen2/3: layers i >= max_window_layers (default 28) slide when use_sliding_window; window default 4096
    "qwen2 max_window_layers": (
        _small("qwen2", num_hidden_layers=30, use_sliding_window=True, sliding_window=8),
        dict(windows=(FULL,) * 28 + (8, 8)),
    ),
    "qwen2 sliding_window": (
        _small("qwen2", num_hidden_layers=3, use_sliding_window=True, max_window_layers=1),
        dict(windows=(FULL, 4096, 4096)),
    ),
    "qwen2 layer_types without use_sliding_window": (
        _small("qwen2", layer_types=["sliding_attention"] * 4, sliding_window=8),
        dict(windows=(FULL,) * 4),
    ),
    "qwen3 max_window_layers": (
        _small("qwen3", num_hidden_layers=30, use_sliding_window=True, sliding_window=8, head_dim=16),
        dict(windows=(FULL,) * 28 + (8, 8)),
    ),
    "qwen3 head_dim": (_small("qwen3"), dict(head_dim=128)),
    "qwen3_moe head_dim": (_small("qwen3_moe", **_QWEN3_MOE, drop=("head_dim",)), dict(head_dim=16)),
    "qwen3_moe sliding_window": (
        _small("qwen3_moe", use_sliding_window=True, **_QWEN3_MOE), dict(windows=(4096,) * 4),
    ),
    "qwen2_moe sliding layers": (
        _small("qwen2_moe", use_sliding_window=True, sliding_window=8, max_window_layers=3, **_QWEN2_MOE),
        dict(windows=(8, FULL, 8, FULL)),
    ),
    "qwen2_moe shared_expert_intermediate_size": (
        _small("qwen2_moe", **_QWEN2_MOE, drop=("shared_expert_intermediate_size",)), {},
    ),
    "qwen2_moe moe_intermediate_size": (_small("qwen2_moe", **_QWEN2_MOE, drop=("moe_intermediate_size",)), {}),
    "qwen2_moe num_experts (num_local_experts is not its key)": (
        _small("qwen2_moe", **_QWEN2_MOE, num_local_experts=2, drop=("num_experts",)), {},
    ),
    "qwen3_moe num_local_experts wins over num_experts": (
        _small("qwen3_moe", **_QWEN3_MOE, num_local_experts=2), {},
    ),
    "mixtral num_local_experts": (_small("mixtral", num_experts_per_tok=2), {}),
    "mixtral num_experts wins over num_local_experts": (_small("mixtral", **_MIXTRAL, num_experts=2), {}),
    "mistral sliding_window": (_small("mistral"), dict(windows=(4096,) * 4)),
    "mistral attention_bias is not read": (_small("mistral", attention_bias=True), {}),
    "mixtral attention_bias is not read": (_small("mixtral", attention_bias=True, **_MIXTRAL), {}),
    "qwen2 mlp_bias is not read": (_small("qwen2", mlp_bias=True), {}),
    "gemma2 head_dim": (_small("gemma2"), dict(head_dim=256)),
    "gemma2 sliding_window": (_small("gemma2", head_dim=16), dict(windows=(4096, FULL, 4096, FULL))),
    "gemma3 head_dim": (_small("gemma3_text"), dict(head_dim=256)),
    "gemma3 _sliding_window_pattern is not read": (
        _small("gemma3_text", head_dim=16, num_hidden_layers=7, sliding_window=8, _sliding_window_pattern=2),
        dict(windows=(8,) * 5 + (FULL, 8)),
    ),
    "mistral num_key_value_heads": (_small("mistral", **_KV32, drop=("num_key_value_heads",)), dict(kv_heads=8)),
    "qwen2 num_key_value_heads": (
        _small("qwen2", hidden_size=512, num_attention_heads=64, drop=("num_key_value_heads",)), dict(kv_heads=32),
    ),
    "gemma2 num_key_value_heads": (
        _small("gemma2", head_dim=16, drop=("num_key_value_heads",)), dict(kv_heads=4),
    ),
    "mixtral num_key_value_heads": (
        _small("mixtral", **_KV32, **_MIXTRAL, drop=("num_key_value_heads",)), dict(kv_heads=8),
    ),
    # GPT-OSS: head_dim 64, window 128 on alternate layers (from layer 0), biases, all by default
    "gpt_oss head_dim, sliding_window and layer_types": (
        _small("gpt_oss", num_local_experts=4, num_experts_per_tok=2), dict(head_dim=64, windows=(128, FULL) * 2),
    ),
    "phimoe num_key_value_heads and experts": (
        _small("phimoe", **_KV32, drop=("num_key_value_heads",)), dict(kv_heads=8),
    ),
}


@pytest.mark.parametrize("name", list(WITHOUT_KEY))
def test_default_read_like_transformers(name: str) -> None:
    cfg, expected = WITHOUT_KEY[name]
    planner, _, _ = _three_way(cfg)
    for key, value in expected.items():
        assert planner[key] == value, f"{key}: {planner[key]} (transformers' default gives {value})"


def test_gemma2_softcaps_default_like_transformers() -> None:
    """Without the keys Gemma 2 soft-caps at 50 (attention) and 30 (logits): the planner's activation model
    and flash-attention choice read the same caps as the engine and transformers."""
    from aegis.models.families import get_family
    from aegis.train.modeling import build_model

    cfg = _small("gemma2", head_dim=16)
    hf = _transformers(cfg)["config"]
    spec = build_model(cfg).spec
    family = get_family(cfg)
    assert family.attention_softcap(cfg) == spec.attn_softcap == hf.attn_logit_softcapping == 50.0
    assert family.logit_softcap(cfg) == spec.final_softcap == hf.final_logit_softcapping == 30.0
    cfg3 = _small("gemma3_text", head_dim=16)
    assert get_family(cfg3).attention_softcap(cfg3) is None is build_model(cfg3).spec.attn_softcap


@pytest.mark.parametrize("model_type", ["llama", "mistral", "qwen2", "phi3", "gemma2", "gemma3_text", "mixtral"])
def test_positions_and_eps_default_like_transformers(model_type: str) -> None:
    """max_position_embeddings (planner profile, engine rope) and rms_norm_eps (engine) without the keys."""
    from aegis.models.profiles import profile_from_config
    from aegis.train.modeling import build_model

    extra = {"gemma2": dict(head_dim=16), "gemma3_text": dict(head_dim=16), "mixtral": _MIXTRAL}.get(model_type, {})
    cfg = _small(model_type, **extra, drop=("max_position_embeddings",))
    hf = _transformers(cfg)["config"]
    spec = build_model(cfg).spec
    profile = profile_from_config(cfg, model_id="test/config", source="catalog")
    assert profile.max_position_embeddings == spec.ropes[0].max_position_embeddings == hf.max_position_embeddings
    assert spec.rms_norm_eps == hf.rms_norm_eps


def test_defaults_table_is_transformers_dataclass_defaults() -> None:
    """Every default in the shared table is transformers' field default, and no field the readers use is
    missing from a model type's row."""
    from transformers import CONFIG_MAPPING

    watched = {key for row in arch.TRANSFORMERS_DEFAULTS.values() for key in row}
    for model_type, row in arch.TRANSFORMERS_DEFAULTS.items():
        fields = {f.name: f.default for f in dataclasses.fields(CONFIG_MAPPING[model_type])}
        for key, value in row.items():
            assert key in fields, f"{model_type}: transformers' config has no field {key!r}"
            assert fields[key] == value, f"{model_type}.{key}: table {value!r}, transformers {fields[key]!r}"
        missing = {k for k in watched & fields.keys() if k not in row}
        assert not missing, f"{model_type}: transformers defines {sorted(missing)} but the table has no default"
