"""The architecture registry (`aegis.models.architectures.registry`) against transformers.

Every ``_data/<model_type>.json`` entry, expanded on the tiny configs (and on variants with every bias key
on), names exactly the parameters transformers' own model holds for each layer — same names, same shapes,
nothing missing, nothing extra — and its final norm; its ``hf_architectures`` and ``model_type`` are
transformers'. The JAX engine's parameter tree, unstacked, holds the same names and shapes (with its few
documented departures). The planner's layer shapes are sums over these entries (``test_three_way_counts.py``
checks the totals against the engine and transformers)."""

from __future__ import annotations

import re

import pytest

from aegis.models.architectures import config_keys as arch
from aegis.models.architectures import registry
from aegis.errors import UnsupportedArchitectureError
from tests.train.conftest import TINY_CONFIGS


def _variants() -> list[tuple[str, dict]]:
    out = []
    for name, cfg in TINY_CONFIGS.items():
        out.append((name, dict(cfg)))
        out.append((f"{name}+biases", {**cfg, "attention_bias": True, "mlp_bias": True, "qkv_bias": True,
                                       "lm_head_bias": True}))
    return out


def _transformers_params(cfg: dict) -> dict[str, tuple[int, ...]]:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    hf_config = AutoConfig.for_model(**cfg)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config)
    return {k: tuple(v.shape) for k, v in model.named_parameters(remove_duplicate=False)}


@pytest.mark.parametrize(("case", "cfg"), _variants(), ids=[c for c, _ in _variants()])
def test_every_layer_names_what_transformers_holds(case: str, cfg: dict) -> None:
    entry = registry.get(cfg["model_type"])
    hf = _transformers_params(cfg)
    for i in range(arch.required_int(cfg, "num_hidden_layers")):  # GPT-2: n_layer
        prefix = f"{entry.layers_path}.{i}."
        theirs = {k: v for k, v in hf.items() if k.startswith(prefix)}
        ours = dict(entry.layer_params(cfg, i))
        assert len(ours) == len(entry.layer_params(cfg, i)), "a name appears twice"
        assert ours == theirs, f"layer {i}: only ours {sorted(ours.keys() - theirs.keys())}, only transformers' " \
            f"{sorted(theirs.keys() - ours.keys())}, shapes differ {[k for k in ours if k in theirs and ours[k] != theirs[k]]}"
    names = entry.names(cfg)
    final = {n: s for p in entry.final_norm for n, s in p.checkpoint(names)}
    wpe = dict(entry.position_embedding.checkpoint(names)) if entry.position_embedding is not None else {}
    assert wpe == {k: v for k, v in hf.items() if k in wpe}  # GPT-2's learned positions, [n_positions, n_embd]
    outside = (f"{entry.layers_path}.", f"{entry.embedding_path}.", "lm_head.", *wpe)  # what is left: the final norm
    assert final == {k: v for k, v in hf.items() if not k.startswith(outside)}


def test_entries_name_transformers_classes_and_model_types() -> None:
    import transformers
    from transformers import CONFIG_MAPPING

    for entry in registry.all_entries():
        assert entry.model_type in CONFIG_MAPPING, entry.model_type
        for alias in entry.also_model_types:
            assert alias in CONFIG_MAPPING, alias
        for cls in entry.hf_architectures:
            assert hasattr(transformers, cls), cls


def test_every_registry_model_type_has_a_tiny_config_checked_above() -> None:
    checked = {registry.get(c["model_type"]).model_type for c in TINY_CONFIGS.values()}
    assert checked == {e.model_type for e in registry.all_entries()}


def test_planner_and_engine_serve_exactly_the_registry() -> None:
    from aegis.models.families import get_family, supported_model_types
    from aegis.train.modeling.families import ENGINE_FAMILIES

    assert set(supported_model_types()) == set(registry.model_types())
    assert set(ENGINE_FAMILIES) == {e.model_type for e in registry.all_entries()}
    for entry in registry.all_entries():
        assert get_family({"model_type": entry.model_type}).entry is entry
        assert ENGINE_FAMILIES[entry.model_type].architectures == entry.hf_architectures


def test_expressions_are_arithmetic_only() -> None:
    with pytest.raises(ValueError, match="not allowed"):
        registry.Param(path="x", vector="__import__('os')")
    with pytest.raises(ValueError, match="not allowed"):
        registry.Param(path="x", linear=("hidden", "heads.real"))
    p = registry.Param(path="self_attn.q_proj", linear=("hidden", "heads * (head_dim + 2)"), bias="attention_bias")
    names = registry.get("llama").names({"model_type": "llama", "hidden_size": 8, "num_attention_heads": 2})
    assert p.checkpoint(names) == [("self_attn.q_proj.weight", (12, 8))]


def test_unknown_model_type_is_one_line_naming_the_data_folder() -> None:
    from aegis.models.families import get_family

    with pytest.raises(UnsupportedArchitectureError, match=re.escape("_data/<model_type>.json")):
        get_family({"model_type": "mamba", "architectures": ["MambaForCausalLM"]})
    assert registry.find("gemma3").model_type == "gemma3_text"
    assert registry.find("mamba") is None


# Where the engine's parameter tree departs from transformers' names and layouts on purpose (its checkpoint
# recipes map them back): GPT-OSS keeps its router as ``mlp.gate`` like the other MoEs and its experts in the
# [E, out, in] layout; DeepSeek-V3's ``e_score_correction_bias`` is a buffer in transformers, a leaf here.
_ENGINE_RENAMES = {
    "gpt_oss": {"mlp.router.weight": "mlp.gate.weight", "mlp.router.bias": "mlp.gate.bias"},
    "granitemoe": {"block_sparse_moe.router.weight": "mlp.gate.weight",  # the engine keeps Mixtral's names
                   "block_sparse_moe.experts.gate_up_proj": "mlp.experts.gate_up_proj",
                   "block_sparse_moe.experts.down_proj": "mlp.experts.down_proj"},
}


def _engine_layers(cfg: dict) -> dict[int, dict[str, tuple[int, ...]]]:
    """The engine's tree unstacked: layer index -> {name under the layer: shape}."""
    from aegis.train.modeling import build_model

    model = build_model(cfg)
    out: dict[int, dict[str, tuple[int, ...]]] = {}

    def visit(node, path):
        if isinstance(node, dict):
            for k, v in node.items():
                visit(v, (*path, k))
            return
        stack = ".".join(path[:2])
        if stack not in ("model.layers", "model.dense_layers"):
            return
        dense = model.spec.dense_layers if model.spec.moe is not None else 0
        layers = range(dense) if stack == "model.dense_layers" else range(dense, arch.required_int(cfg, "num_hidden_layers"))
        for j, i in enumerate(layers):
            out.setdefault(i, {})[".".join(path[2:])] = tuple(node[1:])

    visit(model.param_shapes(), ())
    return out


@pytest.mark.parametrize("name", sorted(TINY_CONFIGS))
def test_the_engine_tree_holds_the_registry_parameters(name: str) -> None:
    cfg = TINY_CONFIGS[name]
    entry = registry.get(cfg["model_type"])
    engine = _engine_layers(cfg)
    from aegis.train.modeling.families import ENGINE_FAMILIES

    names = ENGINE_FAMILIES[entry.model_type].checkpoint_names(cfg)  # Falcon: ln_attn / ln_mlp per config
    assert sorted(engine) == list(range(arch.required_int(cfg, "num_hidden_layers")))
    for i, theirs in engine.items():
        ours = {}
        for full, shape in entry.layer_params(cfg, i):
            key = full.removeprefix(f"{entry.layers_path}.{i}.")
            p = next(p for p in entry.layer_param_kinds(cfg, i) if key.startswith(p.path))
            if p.transposed and len(shape) == 3:
                shape = (shape[0], shape[2], shape[1])
            if p.conv1d and len(shape) == 2:  # GPT-2's Conv1D [in, out]: the engine holds [out, in] like nn.Linear
                shape = shape[::-1]
            key = names.engine(full).removeprefix(f"model.layers.{i}.")  # GPT-NeoX: attention.* is self_attn.*
            ours[_ENGINE_RENAMES.get(entry.model_type, {}).get(key, key)] = shape
        extra = {k for k in theirs.keys() - ours.keys() if k.endswith("e_score_correction_bias")}
        assert {k: v for k, v in theirs.items() if k not in extra} == ours, f"layer {i}"


@pytest.mark.parametrize(
    "cfg",
    [
        {**TINY_CONFIGS["smollm3"], "use_sliding_window": True, "sliding_window": 8},
        {**TINY_CONFIGS["smollm3"], "use_sliding_window": True, "sliding_window": 8, "no_rope_layers": [0, 1, 0, 1]},
        {**TINY_CONFIGS["smollm3"], "no_rope_layer_interval": 2},
        {**TINY_CONFIGS["olmo3"], "num_hidden_layers": 9},
        {k: v for k, v in TINY_CONFIGS["ministral"].items() if k != "layer_types"},
        {**TINY_CONFIGS["gemma3"], "num_hidden_layers": 7},
    ],
    ids=["smollm3-window", "smollm3-explicit", "smollm3-interval", "olmo3", "ministral-derived", "gemma3"],
)
def test_window_rules_derive_transformers_layer_types(cfg: dict) -> None:
    from transformers import AutoConfig

    from aegis.models.architectures import config_keys as arch

    hf = AutoConfig.for_model(**cfg)
    assert arch.layer_types(cfg) == list(hf.layer_types)
    if cfg["model_type"] == "smollm3":
        assert arch.rope_layers(cfg) == [bool(x) for x in hf.no_rope_layers]
