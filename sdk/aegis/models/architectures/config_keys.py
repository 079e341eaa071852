"""config.json readers with transformers' defaults: the one place the planner and the engine read an
architecture key that a config may leave out.

A Hub config.json omits any key whose value is its transformers ``Config`` class default, and several
keys only mean something after that class's ``__post_init__`` (Qwen's ``use_sliding_window`` switches
``sliding_window`` off; ``layer_types`` is derived from ``max_window_layers`` or a pattern). Each reader
here mirrors ``configuration_<model_type>.py`` (transformers 5) and the attribute its ``modeling_*.py``
reads. What differs between model types (class defaults, window rules, which keys count experts, biases) is
data in the architecture registry (`aegis.models.architectures.registry`, ``_data/<model_type>.json``);
:data:`TRANSFORMERS_DEFAULTS` is a view of its defaults, pinned to transformers' dataclass fields by
``tests/models/test_three_way_counts.py``. A model type the registry does not know falls back to the llama
reading (head_dim = hidden / heads, kv heads = heads, untied, no sliding window).

    from aegis.models.architectures import config_keys as arch
    arch.head_dim(cfg)         # 128 for a Qwen3 config.json without head_dim, hidden / heads for Llama
    arch.layer_windows(cfg)    # per layer: the sliding window, or None for full attention

Pure Python: the planner imports this without JAX, torch or transformers.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from aegis.models.architectures import registry
from aegis.errors import InvalidConfigError

__all__ = [
    "TRANSFORMERS_DEFAULTS",
    "model_type",
    "canonical",
    "value",
    "head_dim",
    "num_kv_heads",
    "tie_word_embeddings",
    "max_position_embeddings",
    "rms_norm_eps",
    "lm_head_bias",
    "attention_dropout",
    "residual_dropout",
    "embedding_dropout",
    "attention_biases",
    "mlp_bias",
    "sliding_window",
    "layer_types",
    "layer_windows",
    "rope_layers",
    "num_experts",
    "experts_per_tok",
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
    "is_sparse_layer",
    "MLA",
    "mla",
    "required_int",
    "mla_dense_intermediate_size",
]

def __getattr__(name: str) -> Any:
    """``TRANSFORMERS_DEFAULTS`` and ``MLA_DENSE_WIDTH_DEFAULTS``: views of the registry's data, built on first use."""
    if name == "TRANSFORMERS_DEFAULTS":
        return {e.model_type: dict(e.defaults) for e in registry.all_entries()}
    if name == "MLA_DENSE_WIDTH_DEFAULTS":
        return {e.model_type: e.dense_width_default for e in registry.all_entries() if e.mla}
    raise AttributeError(name)


def _entry(config: dict[str, Any]) -> registry.Architecture | None:
    return registry.find(model_type(config))


def model_type(config: dict[str, Any]) -> str:
    """``config["model_type"]``; a multimodal ``gemma3`` reads like its text model, ``gemma3_text``."""
    mt = config.get("model_type") or ""
    entry = registry.find(mt) if mt else None
    return entry.model_type if entry is not None else mt


def canonical(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with the standard keys a model type stores under its own names (the registry's ``attribute_map``,
    transformers' ``Config.attribute_map``: GPT-2's ``n_embd`` is ``hidden_size``) added, read as `value` reads
    them (the class default where config.json leaves the key out); the same dict when there are none."""
    entry = _entry(config)
    if entry is None or not entry.attribute_map:
        return config
    out = dict(config)
    for key in (*entry.attribute_map, "vocab_size"):
        if key not in out and (v := value(config, key)) is not None:
            out[key] = v
    return out


def value(config: dict[str, Any], key: str) -> Any:
    """``config[key]`` when present (even ``null``), else the key this model type stores it under (the registry's
    ``attribute_map``: GPT-2's ``n_embd`` for ``hidden_size``), else an older key transformers reads for it
    (``key_aliases``), else transformers' class default for the model type (a field default, or one its
    ``__post_init__`` sets)."""
    if key in config:
        return config[key]
    entry = _entry(config)
    if entry is None:
        return None
    if key in entry.attribute_map:
        return value(config, entry.attribute_map[key])
    alias = entry.key_aliases.get(key)
    if alias is not None and alias in config:  # GPT-NeoX's rotary_pct for partial_rotary_factor
        return config[alias]
    if key in entry.defaults:
        return entry.defaults[key]
    if key in entry.post_init_defaults:
        return entry.post_init_defaults[key]
    return value(config, alias) if alias is not None else None  # Falcon: hidden_act is its `activation`'s default


def _int(config: dict[str, Any], key: str, raw: Any) -> int:
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or int(raw) != raw or raw < 0:
        raise InvalidConfigError(f"config.json key {key!r} must be a non-negative integer, got {raw!r}")
    if key == "num_hidden_layers" and raw > _MAX_LAYERS:  # per-layer lists: 10**9 layers would hang the planner
        raise InvalidConfigError(f"config.json key {key!r} is {raw:,}: accepted 0 to {_MAX_LAYERS:,} layers")
    return int(raw)


_MAX_LAYERS = 10_000
"""More decoder layers than any released model has by ~50x (Llama 3.1 405B: 126)."""


def _required(config: dict[str, Any], key: str) -> int:
    raw = config.get(key)
    entry = _entry(config) if raw is None else None
    if entry is not None and (key in entry.attribute_map or key in entry.defaults):
        raw = value(config, key)  # GPT-2: n_embd for hidden_size; a default the registry lists (GPT2Config's vocab)
    if raw is None:
        raise InvalidConfigError(
            f"config.json ({config.get('model_type', '?')}) has no {key!r}: is this a causal-LM config.json "
            "from the Hugging Face Hub?"
        )
    return _int(config, key, raw)


def required_int(config: dict[str, Any], key: str) -> int:
    """``config[key]`` as a non-negative int; an InvalidConfigError naming the key when it is missing."""
    return _required(config, key)


def _optional(config: dict[str, Any], key: str) -> int | None:
    raw = value(config, key)
    return None if raw is None else _int(config, key, raw)


# ----- attention --------------------------------------------------------------------------------------


def head_dim(config: dict[str, Any]) -> int:
    """``head_dim``, or its class default (Qwen3 128, Gemma 256), or ``hidden_size // num_attention_heads``; as the
    registry derives it where it does (GPT-2 and OPT: n_embd / n_head, whatever ``head_dim`` key a config carries,
    as transformers' classes have none; DeepSeek: the q/k head, nope + rope)."""
    entry = _entry(config)
    if entry is not None and "head_dim" in entry.vars:
        return int(entry.names(config)["head_dim"])
    hd = _optional(config, "head_dim")
    return hd if hd else _required(config, "hidden_size") // max(1, _required(config, "num_attention_heads"))


def num_kv_heads(config: dict[str, Any]) -> int:
    """``num_key_value_heads``, or its class default (Mistral 8, Qwen2 32, ...), or ``num_attention_heads``; as the
    registry derives it where it does (Falcon: one for multi-query, else ``num_kv_heads``)."""
    entry = _entry(config)
    if entry is not None and "kv_heads" in entry.vars:
        return int(entry.names(config)["kv_heads"])
    kv = _optional(config, "num_key_value_heads")
    heads = _optional(config, "num_attention_heads")
    if kv is not None and heads and (kv == 0 or kv > heads or heads % kv):
        raise InvalidConfigError(
            f"config.json num_key_value_heads {kv} does not divide num_attention_heads {heads}: each key/value head "
            "serves a whole group of query heads (1 to num_attention_heads, a divisor of it)")
    return kv if kv is not None else _required(config, "num_attention_heads")


def _bias(config: dict[str, Any], entry: registry.Architecture, params: tuple, names: tuple[str, ...]) -> bool:
    by_name = {p.short_name: p for p in params}
    p = next((by_name[n] for n in names if n in by_name), None)
    return p is not None and bool(registry.evaluate(p.bias, entry.names(config)))


def attention_biases(config: dict[str, Any]) -> tuple[bool, bool]:
    """(bias on q/k/v, bias on o), as the registry's attention parameters say: Qwen2 always (q/k/v), Qwen2-MoE
    per ``qkv_bias`` (q/k/v), Mistral, Mixtral and Phi-3 never, the others per ``attention_bias`` (all four);
    a model type the registry does not know reads ``attention_bias`` like Llama."""
    entry = _entry(config)
    if entry is None:
        bias = bool(config.get("attention_bias"))
        return bias, bias
    return (_bias(config, entry, entry.attention, ("q_a_proj", "q_proj", entry.fused_qkv or "qkv_proj")),
            _bias(config, entry, entry.attention, (entry.output_projection,)))


def mlp_bias(config: dict[str, Any]) -> bool:
    """Whether the dense MLP's projections have a bias (Llama, Granite and DeepSeek-V2 read ``mlp_bias``)."""
    entry = _entry(config)
    if entry is None:
        return bool(config.get("mlp_bias"))
    first = next((p for p in entry.mlp if p.kind == "linear"), None)  # gate_proj, gate_up_proj, fc1, c_fc
    return first is not None and bool(registry.evaluate(first.bias, entry.names(config)))


# ----- embeddings, norms, positions -------------------------------------------------------------------


def tie_word_embeddings(config: dict[str, Any]) -> bool:
    """Whether the LM head reuses the embedding (class default: True for Gemma, False otherwise)."""
    return bool(value(config, "tie_word_embeddings"))


def max_position_embeddings(config: dict[str, Any], fallback: int = 4096) -> int:
    """``max_position_embeddings`` or its class default (``fallback`` for a model type not in the table)."""
    n = _optional(config, "max_position_embeddings")
    return n if n is not None else fallback


def lm_head_bias(config: dict[str, Any]) -> bool:
    """Whether the LM head has a bias: always in Phi, per ``lm_head_bias`` in Phi-MoE (default False); no other
    family has one."""
    entry = _entry(config)
    if entry is None:
        return False
    return entry.lm_head_bias or (entry.lm_head_bias_key is not None and bool(value(config, entry.lm_head_bias_key)))


def attention_dropout(config: dict[str, Any]) -> float:
    """``attention_dropout`` (on the attention probabilities in training), or its transformers default."""
    return float(value(config, "attention_dropout") or 0.0)


def residual_dropout(config: dict[str, Any]) -> float:
    """Dropout on each sublayer's output before its residual add, where the family has one (Seed-OSS
    ``residual_dropout``), else 0."""
    entry = _entry(config)
    key = entry.residual_dropout_key if entry is not None else None
    return float(value(config, key) or 0.0) if key else 0.0


def embedding_dropout(config: dict[str, Any]) -> float:
    """Dropout on the token embeddings in training, where the family has one (Phi ``embd_pdrop``), else 0."""
    entry = _entry(config)
    key = entry.embedding_dropout_key if entry is not None else None
    return float(value(config, key) or 0.0) if key else 0.0


def partial_rotary_factor(config: dict[str, Any]) -> float | None:
    """The share of each head RoPE rotates: GPT-J's ``rotary_dim / head_dim``, else ``partial_rotary_factor`` (the
    config's, or the family's default: Phi 0.5), None where neither is set."""
    entry = _entry(config)
    if entry is not None and entry.rotary_dim_key:
        dims = value(config, entry.rotary_dim_key)
        return None if not dims else int(dims) / head_dim(config)
    return value(config, "partial_rotary_factor")


def clip_qkv(config: dict[str, Any]) -> float | None:
    """The bound q, k and v projections are clamped to (OLMo ``clip_qkv``), or None."""
    entry = _entry(config)
    key = entry.clip_qkv_key if entry is not None else None
    bound = value(config, key) if key else None
    return None if bound is None else float(bound)


def rms_norm_eps(config: dict[str, Any]) -> float:
    """The norms' epsilon (``rms_norm_eps``; Phi's LayerNorm ``layer_norm_eps``), or its transformers default."""
    entry = _entry(config)
    key = entry.norm_eps_key if entry is not None else "rms_norm_eps"
    eps = value(config, key) if key is not None else None
    if eps is None and entry is not None:
        eps = entry.norm_eps_default  # OPT: nn.LayerNorm's own default, no config key
    return float(eps if eps is not None else 1e-6)


# ----- sliding windows --------------------------------------------------------------------------------


def sliding_window(config: dict[str, Any]) -> int | None:
    """The window transformers' config holds after ``__post_init__``: None (or Qwen2-MoE's 0) when Qwen's
    ``use_sliding_window`` is off; halved plus one for a bidirectional Gemma 3."""
    entry = _entry(config)
    rule = entry.windows if entry is not None else None
    if rule is not None and rule.use_sliding_window and not value(config, "use_sliding_window"):
        return None
    window = _optional(config, "sliding_window")
    if window and rule is not None and rule.bidirectional_halves and value(config, "use_bidirectional_attention"):
        window = window // 2 + 1
    return window or None


def layer_types(config: dict[str, Any]) -> list[str]:
    """Per layer ``"sliding_attention"`` or ``"full_attention"``, as each config's ``__post_init__`` derives it:
    an explicit ``layer_types`` (Qwen2/3, Qwen2-MoE, Gemma 2/3); Qwen2/3 slide from ``max_window_layers`` on;
    Qwen2-MoE slides even layers below it; Gemma 2 and GPT-OSS alternate; Gemma 3 keeps every
    ``sliding_window_pattern``-th (default 6) layer global, OLMo 3 every 4th; Mistral, Mixtral, Phi-3, Phi-MoE and Qwen3-MoE slide every
    layer when a window is set."""
    n = _required(config, "num_hidden_layers")
    entry = _entry(config)
    rule = entry.windows.rule if entry is not None else "none"
    explicit = value(config, "layer_types") if entry is not None and entry.windows.explicit_layer_types else None
    if explicit:
        return [str(t) for t in explicit]
    if rule == "max_window_layers":
        slides = sliding_window(config) is not None
        first = _optional(config, "max_window_layers") or 0
        return ["sliding_attention" if slides and i >= first else "full_attention" for i in range(n)]
    if rule == "qwen2_moe":
        use = bool(value(config, "use_sliding_window"))
        below = _optional(config, "max_window_layers") or 0
        return ["sliding_attention" if use and (i + 1) % 2 and i < below else "full_attention" for i in range(n)]
    if rule == "alternate":
        return ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n)]
    if rule == "pattern":
        windows = entry.windows  # type: ignore[union-attr]  (rule "pattern" comes from an entry)
        pattern = (config.get(windows.pattern_key) if windows.pattern_key else None) or windows.pattern
        return ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n)]
    if rule == "no_rope_layers":  # SmolLM3: the layers without RoPE slide, when a window is used
        slides = sliding_window(config) is not None
        return ["sliding_attention" if slides and not uses_rope else "full_attention" for uses_rope in rope_layers(config)]
    if rule == "uniform" and sliding_window(config):
        return ["sliding_attention"] * n
    return ["full_attention"] * n


def rope_layers(config: dict[str, Any]) -> list[bool]:
    """Per layer, whether it applies RoPE: SmolLM3's ``no_rope_layers`` (1 = RoPE), by default every
    ``no_rope_layer_interval``-th (4) layer without; Cohere 2's layers with a sliding window (none when
    ``sliding_window`` is null); every layer for the other model types."""
    n = _required(config, "num_hidden_layers")
    entry = _entry(config)
    if entry is not None and entry.rope_on_sliding_layers_only:
        return [w is not None for w in layer_windows(config)]
    explicit = config.get("no_rope_layers")
    if explicit is not None:
        if len(explicit) != n:
            raise InvalidConfigError(f"config.json no_rope_layers lists {len(explicit)} layers, the model has {n}")
        return [bool(x) for x in explicit]
    interval = config.get("no_rope_layer_interval")
    if interval is None and entry is not None:
        interval = entry.defaults.get("no_rope_layer_interval")
    return [not interval or (i + 1) % int(interval) != 0 for i in range(n)]


def layer_windows(config: dict[str, Any]) -> list[int | None]:
    """Per layer, the sliding window its attention uses (None: full causal attention)."""
    window = sliding_window(config)
    return [window if window and t == "sliding_attention" else None for t in layer_types(config)]


# ----- mixture of experts -----------------------------------------------------------------------------


def num_experts(config: dict[str, Any]) -> int:
    """Routed experts per sparse layer. Mixtral and Qwen3-MoE take both ``num_experts`` and
    ``num_local_experts`` (one aliases the other); given both, the one transformers sets last wins: Mixtral's
    ``num_experts``, Qwen3-MoE's ``num_local_experts``. Qwen2-MoE reads ``num_experts`` only."""
    entry = _entry(config)
    keys = entry.moe.experts_keys if entry is not None and entry.moe else ("num_local_experts", "num_experts")
    for key in keys:
        if config.get(key) is not None:
            return _int(config, key, config[key])
    n = next((v for k in keys if (v := value(config, k)) is not None), None)
    if n is None:
        raise InvalidConfigError(
            f"MoE config.json ({model_type(config)!r}) has neither num_experts nor num_local_experts"
        )
    return _int(config, keys[0], n)


def experts_per_tok(config: dict[str, Any]) -> int:
    k = _optional(config, "num_experts_per_tok")
    if k is None:
        raise InvalidConfigError(f"MoE config.json ({model_type(config)!r}) has no 'num_experts_per_tok'")
    return k


def moe_intermediate_size(config: dict[str, Any]) -> int:
    """One routed expert's width: Mixtral's, GPT-OSS's and Phi-MoE's ``intermediate_size``, the Qwen MoEs'
    ``moe_intermediate_size``."""
    entry = _entry(config)
    if entry is not None and entry.moe is not None and entry.moe.width == "intermediate_size":
        return _required(config, "intermediate_size")
    width = _optional(config, "moe_intermediate_size")
    return width if width is not None else _required(config, "moe_intermediate_size")


def shared_expert_intermediate_size(config: dict[str, Any]) -> int:
    """Qwen2-MoE's shared expert width (every sparse layer has one); DeepSeek's ``n_shared_experts`` experts
    of ``moe_intermediate_size`` fused into one MLP; 0 for the other families."""
    entry = _entry(config)
    if entry is None or entry.moe is None or entry.moe.shared is None:
        return 0
    if entry.mla:
        return (_optional(config, "n_shared_experts") or 0) * moe_intermediate_size(config)
    return _optional(config, "shared_expert_intermediate_size") or 0


def is_sparse_layer(config: dict[str, Any], layer: int) -> bool:
    """Whether ``layer`` routes to experts: Mixtral, GPT-OSS and Phi-MoE always; the Qwen MoEs unless in
    ``mlp_only_layers`` or off the ``decoder_sparse_step`` grid."""
    entry = _entry(config)
    rule = entry.moe.sparse_layers if entry is not None and entry.moe is not None else "step"
    if rule == "every":
        return True
    if rule == "first_k_dense":  # DeepSeek: transformers 5 reads first_k_dense_replace only (not moe_layer_freq)
        return layer >= (_optional(config, "first_k_dense_replace") or 0)
    step = _optional(config, "decoder_sparse_step") or 1
    dense = value(config, "mlp_only_layers") or []
    return layer not in dense and num_experts(config) > 0 and (layer + 1) % step == 0


# ----- multi-head latent attention (DeepSeek-V2/V3) ---------------------------------------------------

class MLA(NamedTuple):
    """DeepSeek's multi-head latent attention widths (``modeling_deepseek_v2.py`` / ``_v3.py``)."""

    q_lora_rank: int | None
    """Rank of the query down-projection (``q_a_proj``); None: a plain ``q_proj`` (V2-Lite)."""
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int

    @property
    def qk_head_dim(self) -> int:
        """Query / key head width: the un-rotated part plus the rotated part."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim


def mla_dense_intermediate_size(config: dict[str, Any]) -> int:
    """The width of a DeepSeek dense layer's MLP: ``intermediate_size`` or its class default."""
    raw = config.get("intermediate_size")
    entry = _entry(config)
    if raw is None and entry is not None:
        raw = entry.dense_width_default
    return _int(config, "intermediate_size", raw)


def mla(config: dict[str, Any]) -> MLA | None:
    """The MLA widths of a DeepSeek-V2/V3 config (class defaults for missing keys), None for other types."""
    entry = _entry(config)
    if entry is None or not entry.mla:
        return None
    return MLA(
        q_lora_rank=_optional(config, "q_lora_rank") or None,
        kv_lora_rank=_optional(config, "kv_lora_rank") or 0,
        qk_nope_head_dim=_optional(config, "qk_nope_head_dim") or 0,
        qk_rope_head_dim=_optional(config, "qk_rope_head_dim") or 0,
        v_head_dim=_optional(config, "v_head_dim") or 0,
    )
