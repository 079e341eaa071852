"""Architecture facts read from a Hugging Face config.json, normalised for the JAX decoder.

:class:`ArchSpec` is everything the shared blocks need (widths, heads, norms, rope per layer,
sliding windows, soft-caps, MoE routing); families build one from a config dict with the helpers
here, mirroring what each transformers ``Config.__post_init__`` derives (layer types, rope
defaults). :func:`param_shapes` gives the parameter tree's shapes, named like transformers'
in-memory ``state_dict`` with decoder layers stacked on a leading axis.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from aegis.architectures import config as arch
from aegis.errors import InvalidConfigError, UnsupportedArchitectureError
from aegis.train.models.rope import RopeSpec

__all__ = [
    "ArchSpec", "MoESpec", "param_shapes", "layer_stacks", "BUFFER_LEAVES", "rope_single", "rope_for_layer_types", "require", "FULL_WINDOW",
]

BUFFER_LEAVES = ("e_score_correction_bias",)
"""Tree leaves transformers keeps as (persistent) buffers, not parameters: loaded and saved with the checkpoint,
never counted as parameters (DeepSeek-V3's router score correction)."""

FULL_WINDOW = 2**30
"""Window value that means "no sliding window" (attends to the whole causal prefix)."""


@dataclass(frozen=True)
class MoESpec:
    """Sparse MoE feed-forward: top-k routing over ``num_experts`` gated experts."""

    num_experts: int
    top_k: int
    expert_intermediate_size: int
    norm_topk_prob: bool
    shared_expert_intermediate_size: int | None = None  # Qwen2-MoE: a dense expert with a sigmoid gate
    shared_gate: bool = True  # False: DeepSeek's ``shared_experts`` MLP, added ungated
    router: str = "softmax"  # "sigmoid": DeepSeek-V3 (scores + e_score_correction_bias choose the experts)
    n_group: int = 1  # group-limited routing (DeepSeek): experts in n_group groups, topk_group groups kept
    topk_group: int = 1
    group_score: str = "max"  # a group's score: its best expert ("max", V2) or its best two summed ("top2", V3)
    routed_scaling_factor: float = 1.0  # DeepSeek: top-k weights multiplied by it


@dataclass(frozen=True)
class ArchSpec:
    """A decoder-only transformer, as the shared JAX blocks compute it."""

    model_type: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    hidden_act: str
    initializer_range: float = 0.02
    gemma_norm: bool = False  # (1 + w) RMSNorm, multiplied in float32 before the cast back
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    fused_qkv: bool = False  # Phi-3 qkv_proj
    qkv_name: str = "qkv_proj"  # the fused q/k/v projection's name (GPT-NeoX: ``query_key_value``)
    qkv_grouped: bool = False  # GPT-NeoX, Falcon: the fused output is [q_1..q_g, k, v] per kv head, not [q; k; v]
    fused_gate_up: bool = False  # Phi-3 gate_up_proj
    qk_norm: bool = False  # Qwen3 / Gemma3 RMSNorm over head_dim on q and k before rope
    sandwich_norms: bool = False  # Gemma 2/3: post-attention, pre- and post-feedforward norms
    qk_norm_full: bool = False  # OLMo 2: RMSNorm over the whole q / k projection width, before the head split
    post_norms_only: bool = False  # OLMo 2: no pre-norms; RMSNorm on the attention and MLP outputs before the add
    residual_scale: float = 1.0  # Granite residual_multiplier: sublayer outputs scaled before the residual add
    logits_divisor: float = 1.0  # Granite logits_scaling: logits divided by it
    norm_weight_fp32: bool = False  # OLMo 2 RMSNorm: (w * norm(x)).to(dtype), the product taken in float32
    attn_scale: float = 1.0
    attn_softcap: float | None = None
    final_softcap: float | None = None
    embed_scale: float | None = None  # Gemma: embeddings times sqrt(hidden_size) in the compute dtype
    tie_embeddings: bool = False
    ropes: tuple[RopeSpec, ...] = ()
    layer_rope: tuple[int, ...] = ()  # per layer: index into ``ropes``
    layer_window: tuple[int, ...] = ()  # per layer: sliding window (FULL_WINDOW for full attention)
    moe: MoESpec | None = None
    mla: Any = None  # DeepSeek multi-head latent attention widths (`aegis.architectures.config.MLA`)
    dense_layers: int = 0  # DeepSeek first_k_dense_replace: leading layers with a dense MLP (``model.dense_layers``)
    rope_interleave: bool = False  # DeepSeek: the rotated dims are interleaved pairs (x0, x1), (x2, x3), ...
    attn_sinks: bool = False  # GPT-OSS: a learned per-head logit in every softmax (self_attn.sinks [heads])
    router_bias: bool = False  # GPT-OSS: the router has a bias
    expert_bias: bool = False  # GPT-OSS: gate_up_proj_bias [E, 2I] and down_proj_bias [E, d]
    router_name: str = "gate"  # the router's key under ``mlp`` (Phi-MoE's nn.Linear ``router``, which PEFT wraps)
    layer_norm: bool = False  # Phi-MoE: LayerNorm (weight and bias) in place of every RMSNorm
    layer_norm_bias: bool = True  # False: the LayerNorms have a weight only (Cohere)
    norm_affine: bool = True  # False: the norms have no weight or bias at all (OLMo's LayerNorm)
    clip_qkv: float | None = None  # OLMo clip_qkv: q, k and v projections clamped to [-clip, clip]
    qk_norm_head_weights: bool = False  # Cohere: the q/k LayerNorms (weight only) hold a weight per head [heads, hd]
    logits_scale: float = 1.0  # Cohere logit_scale: logits multiplied by it
    lm_head_bias: bool = False  # Phi-MoE: lm_head.bias [vocab]
    attention_dropout: float = 0.0  # training: dropout on the attention probabilities (Granite 3.0, Seed-OSS: 0.1)
    residual_dropout: float = 0.0  # training: dropout on each sublayer's output before its residual add (Seed-OSS)
    residual_dropout_on: tuple[str, ...] = ("attention", "mlp")  # the sublayers it drops (StableLM: the MLP only)
    embedding_dropout: float = 0.0  # training: dropout on the token embeddings (Phi embd_pdrop)
    parallel_block: bool = False  # Phi: x + attn(ln(x)) + mlp(ln(x)), one input_layernorm per layer
    parallel_mlp_norm: bool = False  # GPT-NeoX, Falcon-40B: the parallel MLP reads a second norm of x
    plain_mlp: bool = False  # Phi, StarCoder2: the two-matrix MLP out(act(in(x))), named by ``plain_mlp_names``
    plain_mlp_names: tuple[str, str] = ("fc1", "fc2")  # its input and output projections (StarCoder2: c_fc, c_proj)
    o_name: str = "o_proj"  # the attention output projection's name (Phi: ``dense``)
    position_embeddings: int = 0  # GPT-2, OPT: learned absolute positions (model.embed_positions [rows, d]); 0: none
    position_offset: int = 0  # OPT: position p reads row p + 2
    conv1d: bool = False  # GPT-2: checkpoints store the linears as Conv1D ([in, out]); PEFT adapts them fan_in_fan_out
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim


def require(config: dict[str, Any], key: str) -> Any:
    """``config[key]`` or an :class:`InvalidConfigError` naming the missing key."""
    if config.get(key) is None:
        raise InvalidConfigError(
            f"config.json ({config.get('model_type', '?')}) has no {key!r}; pass the model's complete config.json."
        )
    return config[key]


def _legacy_rope(config: dict[str, Any], default_theta: float) -> dict[str, Any]:
    """The flat rope-parameters dict from either layout (``rope_scaling`` wins over ``rope_parameters``)."""
    params = dict(config.get("rope_scaling") or config.get("rope_parameters") or {})
    theta = arch.value(config, "rope_theta")  # the config's (GPT-NeoX: rotary_emb_base), else the family's default
    params.setdefault("rope_theta", default_theta if theta is None else theta)
    partial = arch.partial_rotary_factor(config)  # the config's, the family's default (Phi: 0.5), GPT-J's rotary_dim
    if partial is not None:
        params.setdefault("partial_rotary_factor", partial)
    return params


def rope_single(config: dict[str, Any], head_dim: int, *, default_theta: float = 10_000.0) -> RopeSpec:
    """One RoPE for every layer (Llama, Qwen, Mistral, Phi-3, MoE families)."""
    params = _legacy_rope(config, default_theta)
    if "full_attention" in params and isinstance(params["full_attention"], dict):
        params = dict(params["full_attention"])
        params.setdefault("rope_theta", config.get("rope_theta", default_theta))
    return RopeSpec.from_params(
        params,
        head_dim=head_dim,
        max_position_embeddings=arch.value(config, "max_position_embeddings"),
        original_max_position_embeddings=arch.value(config, "original_max_position_embeddings"),
    )


def rope_for_layer_types(
    config: dict[str, Any], head_dim: int, *, global_theta: float, local_theta: float
) -> dict[str, RopeSpec]:
    """Gemma 3: separate RoPE for ``full_attention`` (scaled) and ``sliding_attention`` (local base) layers."""
    rp = config.get("rope_parameters") or {}
    nested = isinstance(rp.get("full_attention"), dict) or isinstance(rp.get("sliding_attention"), dict)
    full = dict(rp.get("full_attention") or {}) if nested else {"rope_type": "default"}
    local = dict(rp.get("sliding_attention") or {}) if nested else {"rope_type": "default"}
    if not nested and rp:
        full.update(rp)
    if config.get("rope_scaling"):
        full.update(config["rope_scaling"])
    full.setdefault("rope_theta", config.get("rope_theta", global_theta))
    local.setdefault("rope_theta", config.get("rope_local_base_freq", local_theta))
    mpe = arch.value(config, "max_position_embeddings")
    return {
        "full_attention": RopeSpec.from_params(full, head_dim=head_dim, max_position_embeddings=mpe),
        "sliding_attention": RopeSpec.from_params(local, head_dim=head_dim, max_position_embeddings=mpe),
    }


def check_layer_types(config: dict[str, Any], layer_types: list[str]) -> list[str]:
    """Validate an explicit or derived ``layer_types`` list."""
    n = require(config, "num_hidden_layers")
    if len(layer_types) != n or any(t not in ("full_attention", "sliding_attention") for t in layer_types):
        raise UnsupportedArchitectureError(
            f"layer_types must list {n} entries of 'full_attention'/'sliding_attention'; got {layer_types!r}."
        )
    return layer_types


def _linear(out_f: int, in_f: int, bias: bool) -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {"weight": (out_f, in_f)}
    if bias:
        shapes["bias"] = (out_f,)
    return shapes


def layer_stacks(spec: ArchSpec) -> tuple[tuple[str, int, int], ...]:
    """The stacked layer groups under ``params["model"]``: ``(key, first layer, count)`` in order. One
    ``layers`` stack, except DeepSeek's leading dense layers (``dense_layers``) before its MoE ``layers``."""
    if spec.dense_layers <= 0 or spec.moe is None:
        return (("layers", 0, spec.num_layers),)
    k = min(spec.dense_layers, spec.num_layers)
    stacks = (("dense_layers", 0, k), ("layers", k, spec.num_layers - k))
    return tuple(st for st in stacks if st[2] > 0)


def stack_spec(spec: ArchSpec, key: str) -> ArchSpec:
    """The spec one stack's layers follow (DeepSeek's dense layers: no MoE)."""
    return dataclasses.replace(spec, moe=None) if key == "dense_layers" else spec


def _mla_shapes(spec: ArchSpec) -> dict[str, Any]:
    m, d, heads = spec.mla, spec.hidden_size, spec.num_heads
    attn: dict[str, Any] = {}
    if m.q_lora_rank is None:
        attn["q_proj"] = _linear(heads * m.qk_head_dim, d, False)
    else:
        attn["q_a_proj"] = _linear(m.q_lora_rank, d, spec.o_bias)
        attn["q_a_layernorm"] = {"weight": (m.q_lora_rank,)}
        attn["q_b_proj"] = _linear(heads * m.qk_head_dim, m.q_lora_rank, False)
    attn["kv_a_proj_with_mqa"] = _linear(m.kv_lora_rank + m.qk_rope_head_dim, d, spec.o_bias)
    attn["kv_a_layernorm"] = {"weight": (m.kv_lora_rank,)}
    attn["kv_b_proj"] = _linear(heads * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank, False)
    attn["o_proj"] = _linear(d, heads * m.v_head_dim, spec.o_bias)
    return attn


def layer_shapes(spec: ArchSpec) -> dict[str, Any]:
    """Shapes of one decoder layer's parameters (before stacking)."""
    d = spec.hidden_size
    attn: dict[str, Any] = {}
    if spec.mla is not None:
        attn = _mla_shapes(spec)
    elif spec.fused_qkv:
        attn[spec.qkv_name] = _linear(spec.q_size + 2 * spec.kv_size, d, spec.qkv_bias)
    else:
        attn["q_proj"] = _linear(spec.q_size, d, spec.qkv_bias)
        attn["k_proj"] = _linear(spec.kv_size, d, spec.qkv_bias)
        attn["v_proj"] = _linear(spec.kv_size, d, spec.qkv_bias)
    if spec.mla is None:
        attn[spec.o_name] = _linear(d, spec.q_size, spec.o_bias)
    if spec.attn_sinks:
        attn["sinks"] = (spec.num_heads,)
    if spec.qk_norm and spec.qk_norm_head_weights:  # Cohere's use_qk_norm: a weight-only LayerNorm, a weight per head
        attn["q_norm"] = {"weight": (spec.num_heads, spec.head_dim)}
        attn["k_norm"] = {"weight": (spec.num_kv_heads, spec.head_dim)}
    elif spec.qk_norm and spec.layer_norm:  # Phi's qk_layernorm: a LayerNorm per head, named q/k_layernorm
        attn["q_layernorm"] = {"weight": (spec.head_dim,), "bias": (spec.head_dim,)}
        attn["k_layernorm"] = {"weight": (spec.head_dim,), "bias": (spec.head_dim,)}
    elif spec.qk_norm:
        attn["q_norm"] = {"weight": (spec.head_dim,)}
        attn["k_norm"] = {"weight": (spec.head_dim,)}
    elif spec.qk_norm_full:
        attn["q_norm"] = {"weight": (spec.q_size,)}
        attn["k_norm"] = {"weight": (spec.kv_size,)}

    if spec.moe is None:
        i = spec.intermediate_size
        if spec.plain_mlp:
            fc_in, fc_out = spec.plain_mlp_names
            mlp = {fc_in: _linear(i, d, spec.mlp_bias), fc_out: _linear(d, i, spec.mlp_bias)}
        elif spec.fused_gate_up:
            mlp: dict[str, Any] = {"gate_up_proj": _linear(2 * i, d, spec.mlp_bias)}
        else:
            mlp = {"gate_proj": _linear(i, d, spec.mlp_bias), "up_proj": _linear(i, d, spec.mlp_bias)}
        if not spec.plain_mlp:
            mlp["down_proj"] = _linear(d, i, spec.mlp_bias)
    else:
        m = spec.moe
        mlp = {
            spec.router_name: _linear(m.num_experts, d, spec.router_bias),
            "experts": {
                "gate_up_proj": (m.num_experts, 2 * m.expert_intermediate_size, d),
                "down_proj": (m.num_experts, d, m.expert_intermediate_size),
            },
        }
        if spec.expert_bias:
            mlp["experts"]["gate_up_proj_bias"] = (m.num_experts, 2 * m.expert_intermediate_size)
            mlp["experts"]["down_proj_bias"] = (m.num_experts, d)
        if m.router == "sigmoid":
            mlp[spec.router_name]["e_score_correction_bias"] = (m.num_experts,)
        if m.shared_expert_intermediate_size:
            s = m.shared_expert_intermediate_size
            shared = {
                "gate_proj": _linear(s, d, spec.mlp_bias),
                "up_proj": _linear(s, d, spec.mlp_bias),
                "down_proj": _linear(d, s, spec.mlp_bias),
            }
            if m.shared_gate:
                mlp["shared_expert"] = shared
                mlp["shared_expert_gate"] = {"weight": (1, d)}
            else:
                mlp["shared_experts"] = shared

    layer: dict[str, Any] = {
        "input_layernorm": {"weight": (d,)},
        "self_attn": attn,
        "post_attention_layernorm": {"weight": (d,)},
        "mlp": mlp,
    }
    if spec.parallel_block and not spec.parallel_mlp_norm:
        del layer["post_attention_layernorm"]
    if spec.post_norms_only:
        del layer["input_layernorm"]
        layer["post_feedforward_layernorm"] = {"weight": (d,)}
    if spec.sandwich_norms:
        layer["pre_feedforward_layernorm"] = {"weight": (d,)}
        layer["post_feedforward_layernorm"] = {"weight": (d,)}
    if spec.layer_norm and spec.layer_norm_bias:
        for key in ("input_layernorm", "post_attention_layernorm"):
            if key in layer:
                layer[key]["bias"] = (d,)
    if not spec.norm_affine:  # OLMo: the norms hold no parameter, so the tree has no node for them
        for key in ("input_layernorm", "post_attention_layernorm"):
            layer.pop(key, None)
    return layer


def param_shapes(spec: ArchSpec) -> dict[str, Any]:
    """The parameter tree's shapes: ``{"model": {embed_tokens, layers (stacked), norm}, "lm_head"?}``."""

    def stack(node: Any, n: int) -> Any:
        if isinstance(node, dict):
            return {k: stack(v, n) for k, v in node.items()}
        return (n, *node)

    model: dict[str, Any] = {"embed_tokens": {"weight": (spec.vocab_size, spec.hidden_size)}}
    if spec.position_embeddings:
        model["embed_positions"] = {"weight": (spec.position_embeddings, spec.hidden_size)}
    for key, _, count in layer_stacks(spec):
        model[key] = stack(layer_shapes(stack_spec(spec, key)), count)
    if spec.norm_affine:
        model["norm"] = {"weight": (spec.hidden_size,)}
    tree: dict[str, Any] = {"model": model}
    if spec.layer_norm and spec.layer_norm_bias and spec.norm_affine:
        tree["model"]["norm"]["bias"] = (spec.hidden_size,)
    if not spec.tie_embeddings:
        tree["lm_head"] = {"weight": (spec.vocab_size, spec.hidden_size)}
    if spec.lm_head_bias:
        tree.setdefault("lm_head", {})["bias"] = (spec.vocab_size,)
    return tree
