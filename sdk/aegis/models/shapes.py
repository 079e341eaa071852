"""The JAX engine's parameter tree without JAX: shapes, layer stacks, rope specs and logical sharding axes.

One description of what the engine holds, read by the engine (`aegis.train.modeling`, `aegis.train.sharding`,
weights and LoRA) and by the planner's JAX profile (`aegis.planning.memory.jax_profile`), which must not import JAX:

- :class:`ArchSpec` / :class:`MoESpec` / :class:`RopeSpec`: a decoder as the shared JAX blocks compute it
  (`aegis.models.arch_spec.arch_spec` reads one from a config.json);
- :func:`param_shapes`: the parameter tree's shapes, named like transformers' in-memory ``state_dict`` with the
  decoder layers stacked on a leading axis, in the :func:`layer_stacks` the engine scans;
- :class:`CheckpointNames`: how a family's checkpoints name the engine's modules;
- :func:`logical_axes`: logical axis names per leaf (``embed``, ``vocab``, ``heads``, ``kv_heads``, ``mlp``,
  ``experts``, ``layers``, ...) from the architecture registry's shape expressions, :data:`LOGICAL_AXIS_RULES`
  mapping them to mesh axes, and :func:`mesh_axes_of` the mesh axes one array is split over (the rule
  `aegis.train.sharding.partition_spec` turns into a ``PartitionSpec``).

    from aegis.models.arch_spec import arch_spec
    from aegis.models.shapes import param_shapes, logical_axes, mesh_axes_of
    spec = arch_spec(config)                              # config.json dict -> ArchSpec
    tree = param_shapes(spec)                             # {"model": {"embed_tokens": {"weight": (V, d)}, ...}}
    axes = logical_axes(config, spec)                     # {("model", "layers", "mlp", "up_proj", "weight"): ("layers", "mlp", "embed")}
    mesh_axes_of((V, d), ("vocab", "embed"), {"fsdp": 4}) # (None, "fsdp")
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aegis.models.architectures import registry
from aegis.errors import UnsupportedArchitectureError

__all__ = [
    "ArchSpec", "MoESpec", "RopeSpec", "SUPPORTED_ROPE_TYPES", "BUFFER_LEAVES", "FULL_WINDOW",
    "param_shapes", "layer_shapes", "layer_stacks", "stack_spec", "tree_leaves",
    "CheckpointNames", "checkpoint_names",
    "LOGICAL_AXIS_RULES", "EXPRESSION_AXES", "TOP_LEVEL_AXES", "Logical", "logical_axes", "leaf_logical",
    "mesh_axes_of", "shard_count", "query_blocks", "causal_key_span",
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
    mla: Any = None  # DeepSeek multi-head latent attention widths (`aegis.models.architectures.config_keys.MLA`)
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



SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn", "longrope")


@dataclass(frozen=True)
class RopeSpec:
    """One RoPE variant: type, base and the scaling parameters its type needs."""

    rope_type: str
    theta: float
    head_dim: int
    partial_rotary_factor: float = 1.0
    factor: float | None = None
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    original_max_position_embeddings: int | None = None
    max_position_embeddings: int | None = None
    attention_factor: float | None = None
    beta_fast: float | None = None
    beta_slow: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True
    short_factor: tuple[float, ...] | None = None
    long_factor: tuple[float, ...] | None = None

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @classmethod
    def from_params(
        cls,
        params: dict[str, Any],
        *,
        head_dim: int,
        max_position_embeddings: int | None,
        original_max_position_embeddings: int | None = None,
    ) -> RopeSpec:
        """Build from one rope-parameters dict (``rope_type``/``type``, ``rope_theta``, scaling keys)."""
        rope_type = params.get("rope_type", params.get("type", "default")) or "default"
        if rope_type in ("su",):  # Phi-3's historical name for longrope
            rope_type = "longrope"
        if rope_type == "dynamic":
            # Dynamic NTK only changes frequencies beyond max_position_embeddings; within it equals default.
            rope_type = "default"
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise UnsupportedArchitectureError(
                f"rope_type {rope_type!r} is not supported by the JAX engine; supported: "
                f"{', '.join(SUPPORTED_ROPE_TYPES)}. "
                "Remove the rope scaling from config.json to train at the base length."
            )
        if params.get("rope_theta") is None:
            raise UnsupportedArchitectureError("config.json has no rope_theta; add it (e.g. 10000.0) and retry.")
        orig = params.get("original_max_position_embeddings") or original_max_position_embeddings
        if rope_type in ("llama3", "yarn", "longrope") and orig is None:
            orig = max_position_embeddings

        def _tuple(x: Any) -> tuple[float, ...] | None:
            return None if x is None else tuple(float(v) for v in x)

        return cls(
            rope_type=rope_type,
            theta=float(params["rope_theta"]),
            head_dim=head_dim,
            partial_rotary_factor=float(params.get("partial_rotary_factor", 1.0) or 1.0),
            factor=None if params.get("factor") is None else float(params["factor"]),
            low_freq_factor=params.get("low_freq_factor"),
            high_freq_factor=params.get("high_freq_factor"),
            original_max_position_embeddings=orig,
            max_position_embeddings=max_position_embeddings,
            attention_factor=params.get("attention_factor"),
            beta_fast=params.get("beta_fast"),
            beta_slow=params.get("beta_slow"),
            mscale=params.get("mscale"),
            mscale_all_dim=params.get("mscale_all_dim"),
            truncate=bool(params.get("truncate", True)),
            short_factor=_tuple(params.get("short_factor")),
            long_factor=_tuple(params.get("long_factor")),
        )


# ----- the parameter tree ------------------------------------------------------------------------------


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


def tree_leaves(tree: Any, path: tuple[str, ...] = ()) -> dict[tuple[str, ...], tuple[int, ...]]:
    """``{path: shape}`` of every leaf of a nested dict of shapes (:func:`param_shapes`)."""
    if isinstance(tree, dict):
        out: dict[tuple[str, ...], tuple[int, ...]] = {}
        for k, v in tree.items():
            out.update(tree_leaves(v, path + (k,)))
        return out
    return {path: tuple(tree)}


# ----- logical axes and the rules that map them to mesh axes ---------------------------------------------

LOGICAL_AXIS_RULES: dict[str, tuple[str, ...]] = {
    "batch": ("data", "fsdp"),
    "vocab": ("tensor",),
    "embed": ("fsdp",),
    "heads": ("tensor",),
    "kv_heads": ("tensor",),
    "mlp": ("tensor",),
    "experts": ("fsdp", "tensor"),
    "head_dim": (),
    "lora_rank": (),
    "layers": (),
}
"""Logical axis -> the mesh axes it may be sharded over, in order of preference (an axis takes the first one that
is free and divides it). ``layers`` (the scan-stacked axis) and ``lora_rank`` stay whole."""

EXPRESSION_AXES: dict[str, str] = {
    "heads": "heads",
    "kv_heads": "kv_heads",
    "experts": "experts",
    "hidden": "embed",
    "intermediate": "mlp",
    "expert_width": "mlp",
    "shared_width": "mlp",
    "vocab": "vocab",
    "head_dim": "head_dim",
}
"""Names of the registry's shape expressions -> logical axis: an expression takes the axis of the first name in it
that is listed (``heads * head_dim`` -> heads, ``2 * expert_width`` -> mlp); one with none (``kv_lora_rank``) has no
logical axis and is sharded by the fsdp fallback only."""

TOP_LEVEL_AXES: dict[str, tuple[str | None, ...]] = {
    "model.embed_tokens.weight": ("vocab", "embed"),
    "model.embed_positions.weight": (None, "embed"),
    "model.norm.weight": ("embed",),
    "model.norm.bias": ("embed",),
    "lm_head.weight": ("vocab", "embed"),
    "lm_head.bias": ("vocab",),
}
"""Logical axes of the parameters outside the decoder layers, as the engine names them for every family."""

STACKS = ("layers", "dense_layers")
"""The keys under ``params["model"]`` whose leaves are stacked over layers (:func:`layer_stacks`)."""

Logical = tuple[str | None, ...]


def mesh_axes_of(shape: Sequence[int], logical: Logical, mesh_sizes: Mapping[str, int]) -> tuple[Any, ...]:
    """The mesh axis (a name, a tuple of names, or None) each axis of an array of ``shape`` named ``logical`` is
    split over, trailing Nones dropped (a ``PartitionSpec``'s entries):

    1. each axis takes the first mesh axis its rule lists that is larger than 1, unused by the array, and divides
       the axis' size (``layers`` is never sharded);
    2. where ``fsdp`` is still unused, it shards the largest remaining axis it divides (ZeRO-3: every array is
       split, whatever its logical names), or, with none left, the largest axis it shares with ``tensor``;
    3. whatever divides nothing is replicated. Never an error.
    """
    shape = tuple(int(s) for s in shape)
    if len(logical) != len(shape):
        logical = (None,) * len(shape)
    spec: list[Any] = [None] * len(shape)
    used: set[str] = set()
    for i, (size, name) in enumerate(zip(shape, logical, strict=True)):
        for axis in LOGICAL_AXIS_RULES.get(name, ()) if name else ():
            n = mesh_sizes.get(axis, 1)
            if n > 1 and axis not in used and size % n == 0:
                spec[i] = axis
                used.add(axis)
                break
    fsdp = mesh_sizes.get("fsdp", 1)
    if fsdp > 1 and "fsdp" not in used:
        free = [i for i, size in enumerate(shape) if spec[i] is None and logical[i] != "layers" and size % fsdp == 0]
        # no free axis: share one that another mesh axis already splits, if it divides by both
        shared = [i for i, size in enumerate(shape) if spec[i] is not None and size % (fsdp * mesh_sizes[spec[i]]) == 0]
        if free or shared:
            best = max(free or shared, key=lambda i: (shape[i], -i))
            spec[best] = "fsdp" if spec[best] is None else (spec[best], "fsdp")
    while spec and spec[-1] is None:
        spec.pop()
    return tuple(spec)


def shard_count(shape: Sequence[int], logical: Logical | None, mesh_sizes: Mapping[str, int]) -> int:
    """Into how many pieces the rules split an array (1: replicated on every device); None: a leaf of no parameter."""
    if logical is None:
        return 1
    n = 1
    for entry in mesh_axes_of(shape, logical, mesh_sizes):
        for axis in (entry if isinstance(entry, tuple) else (entry,) if entry else ()):
            n *= mesh_sizes.get(axis, 1)
    return n


def _expression_axis(expr: str | int) -> str | None:
    if not isinstance(expr, str):
        return None
    names = [n.id for n in ast.walk(ast.parse(expr, mode="eval")) if isinstance(n, ast.Name)]
    ordered = sorted(names, key=lambda n: expr.find(n))
    return next((EXPRESSION_AXES[n] for n in ordered if n in EXPRESSION_AXES), None)


def _param_tensors(p: Any, names: Any, prefix: str) -> list[tuple[str, tuple[int, ...], Logical]]:
    """``(checkpoint name, shape, logical axes)`` of each tensor of registry parameter ``p``."""
    tensors = p.checkpoint(names, prefix)
    if p.linear is not None:
        i, o = (_expression_axis(x) for x in p.linear)
        axes = [(i, o) if p.conv1d else (o, i), (o,)]
    elif p.experts is not None:
        i, o = (_expression_axis(x) for x in p.experts)
        axes = [("experts", i, o) if p.transposed else ("experts", o, i), ("experts", o)]
    elif p.vector is not None:
        axes = [(_expression_axis(p.vector),)]
    else:
        axes = [tuple(_expression_axis(x) for x in p.matrix or ())]
    return [(name, shape, ax) for (name, shape), ax in zip(tensors, axes, strict=False)]


def logical_axes(config: dict[str, Any], spec: ArchSpec) -> dict[tuple[str, ...], Logical]:
    """Logical axis names of every leaf of the :func:`param_shapes` tree of ``spec`` (read from ``config``;
    stacked leaves lead with ``layers``): the registry's shape expressions for the decoder layers,
    :data:`TOP_LEVEL_AXES` outside them; a leaf the registry does not describe in the engine's layout gets ``None``
    names (sharded by the fsdp fallback only)."""
    shapes = tree_leaves(param_shapes(spec))
    entry = registry.get(config.get("model_type"))
    names = entry.names(config)
    ckpt = checkpoint_names(entry, config)
    known: dict[tuple[str, ...], Logical] = {}
    for key, first, _ in layer_stacks(spec):
        for p in entry.layer_param_kinds(config, first, names):
            for name, shape, axes in _param_tensors(p, names, f"{entry.layers_path}.{first}."):
                engine = ckpt.engine(name)
                if engine is None:
                    continue
                rest = engine.split(".", 3)[3:]  # model.layers.{i}.<rest>
                path = ("model", key, *rest[0].split(".")) if rest else None
                leaf = shapes.get(path) if path else None
                if leaf is None:
                    continue
                if tuple(leaf[1:]) == tuple(shape):
                    known[path] = ("layers", *axes)
                elif len(shape) >= 2 and tuple(leaf[1:]) == (*shape[:-2], shape[-1], shape[-2]):  # stored transposed
                    known[path] = ("layers", *axes[:-2], axes[-1], axes[-2])
    out: dict[tuple[str, ...], Logical] = {}
    for path, shape in shapes.items():
        if path in known:
            out[path] = known[path]
        elif ".".join(path) in TOP_LEVEL_AXES and len(TOP_LEVEL_AXES[".".join(path)]) == len(shape):
            out[path] = TOP_LEVEL_AXES[".".join(path)]
        else:
            stacked = len(path) > 1 and path[0] == "model" and path[1] in STACKS
            out[path] = (("layers",) if stacked else ()) + (None,) * (len(shape) - int(stacked))
    return out


def leaf_logical(
    axes: Mapping[tuple[str, ...], Logical], shapes: Mapping[tuple[str, ...], tuple[int, ...]],
    path: Sequence[str], shape: Sequence[int],
) -> Logical | None:
    """Logical names of the leaf at ``path`` (in any tree holding a param-shaped subtree: params, optimizer
    moments, LoRA adapters, NF4 bases) of ``shape``, given the params' ``axes`` and ``shapes``. A leaf of a
    parameter's own shape takes its names; a LoRA adapter follows its base weight (``lora_A``: ``[layers,
    lora_rank, in]``, ``lora_B``: ``[layers, out, lora_rank]``); anything else under a parameter (NF4 codes and
    absmax, 8-bit moments) gets None names (a leaf stacked over layers keeps that axis whole). None for a leaf that
    belongs to no parameter (step counters, RNG keys, learning rates: replicated)."""
    shape = tuple(shape)
    for start, key in enumerate(path):
        if key not in ("model", "lm_head"):
            continue
        rel = tuple(path[start:])
        if rel in axes and shapes[rel] == shape:
            return axes[rel]
        if len(rel) >= 3 and rel[-2] in ("lora_A", "lora_B"):  # an adapter: follows its base weight
            base = rel[:-2]
            base_axes = axes.get(base + ("weight",)) or axes.get(base)
            if base_axes is not None and len(shape) == 3 and len(base_axes) >= 3:
                out_axis, in_axis = base_axes[-2], base_axes[-1]
                if rel[-2] == "lora_A":
                    return ("layers", "lora_rank", in_axis)
                return ("layers", out_axis, "lora_rank")
        stacked = len(rel) > 1 and rel[0] == "model" and rel[1] in STACKS and len(shape) >= 1
        return (("layers",) if stacked else ()) + (None,) * (len(shape) - int(stacked))
    return None


# ----- checkpoint names --------------------------------------------------------------------------------


@dataclass(frozen=True)
class CheckpointNames:
    """How a family's checkpoint files name the engine's modules (the engine names them as Llama does:
    ``model.embed_tokens``, ``model.layers.{i}.self_attn.*``, ``model.norm``, ``lm_head``), from the registry:
    GPT-NeoX's ``gpt_neox.embed_in``, ``gpt_neox.layers.{i}.attention.*``, ``gpt_neox.final_layer_norm``,
    ``embed_out``. Module paths only; a tensor's leaf (``weight``, ``lora_A.weight``) follows unchanged."""

    layers: str = "model.layers"
    embedding: str = "model.embed_tokens"
    final_norm: str = "model.norm"
    lm_head: str = "lm_head"
    position_embedding: str = "model.embed_positions"
    """GPT-2's ``transformer.wpe``: a learned position embedding, where the family has one."""
    in_layer: tuple[tuple[str, str], ...] = ()
    """(engine module under a layer, the checkpoint's), where they differ (``self_attn.dense``, ``attention.dense``)."""

    @property
    def renames(self) -> bool:
        return self != CheckpointNames()

    def _tops(self) -> tuple[tuple[str, str], ...]:
        return (("model.embed_tokens", self.embedding), ("model.norm", self.final_norm), ("lm_head", self.lm_head),
                ("model.embed_positions", self.position_embedding))

    def checkpoint(self, name: str) -> str:
        """The checkpoint's name of engine tensor or module ``name``."""
        for ours, theirs in self._tops():
            if name == ours or name.startswith(ours + "."):
                return theirs + name[len(ours):]
        if not name.startswith("model.layers."):
            return name
        layer, _, rest = name[len("model.layers."):].partition(".")
        for ours, theirs in self.in_layer:
            if rest == ours or rest.startswith(ours + "."):
                rest = theirs + rest[len(ours):]
                break
        return f"{self.layers}.{layer}.{rest}" if rest else f"{self.layers}.{layer}"

    def engine(self, name: str) -> str | None:
        """The engine's name of checkpoint tensor or module ``name`` (the inverse of `checkpoint`); None when it is
        not one of the family's module paths."""
        for ours, theirs in self._tops():
            if name == theirs or name.startswith(theirs + "."):
                return ours + name[len(theirs):]
        if not name.startswith(self.layers + "."):
            return None
        layer, _, rest = name[len(self.layers) + 1:].partition(".")
        for ours, theirs in self.in_layer:
            if rest == theirs or rest.startswith(theirs + "."):
                rest = ours + rest[len(theirs):]
                break
        return f"model.layers.{layer}.{rest}" if rest else f"model.layers.{layer}"


def checkpoint_names(entry: registry.Architecture, config: dict[str, Any] | None = None) -> CheckpointNames:
    """The family's checkpoint names; with ``config`` also the norms it renames for that config (Falcon's
    ``ln_attn``/``ln_mlp`` where it has two)."""
    in_layer = []
    for section, params in (("self_attn", entry.attention), ("mlp", entry.mlp)):
        for p in params:
            if p.kind == "linear" and f"{section}.{p.short_name}" != p.path:
                in_layer.append((f"{section}.{p.short_name}", p.path))
    names = entry.names(config) if config is not None else None
    for p in entry.norms:  # renamed norms: always (GPT-2's ln_1 / ln_2), or as this config has them (Falcon)
        unconditional = p.when is None and p.unless is None
        if p.name is not None and p.name != p.path and (unconditional or (names is not None and p.present(names))):
            pair = (p.name.rsplit(".", 1)[0], p.path.rsplit(".", 1)[0])
            if pair not in in_layer:
                in_layer.append(pair)
    wpe = entry.position_embedding
    return CheckpointNames(
        layers=entry.layers_path, embedding=entry.embedding_path,
        final_norm=entry.final_norm[0].path.rsplit(".", 1)[0] if entry.final_norm else "model.norm",
        lm_head=entry.lm_head_saved_as, in_layer=tuple(in_layer),
        **({"position_embedding": wpe.path.rsplit(".", 1)[0]} if wpe is not None else {}),
    )


# ----- causal attention in query blocks ------------------------------------------------------------------------------
QUERY_BLOCK = 64
"""Query block of the engine's explicit-scores (``xla``) attention, doubled until a sequence has at most
:data:`QUERY_BLOCKS_MAX` blocks: smaller blocks make GEMMs too thin to pay for the scores they skip."""
QUERY_BLOCKS_MAX = 16
"""Most query blocks per sequence (each is its own pair of batched GEMMs in the compiled step)."""


def query_blocks(seq_len: int) -> tuple[tuple[int, int], ...]:
    """``(start, end)`` of the query blocks the engine's ``xla`` attention computes one at a time.

    A causal (or packed, or windowed: each is a subset of causal) mask lets the queries ``[start, end)`` see keys
    ``[0, end)`` only, so a block computes its scores against those keys and skips the ones above the diagonal:
    with ``n`` equal blocks the scores are ``(n + 1) / (2n)`` of the full ``s x s`` (``n = 16``: 53%), the rest of
    the ``s^2`` a single block would compute, mask and drop. Blocks of 64 queries (the last one shorter), the size
    doubled until there are at most 16: the scored area then grows with the sequence (a longer sequence never
    scores fewer keys, so memory stays monotonic in the length).
    """
    size = QUERY_BLOCK
    while -(-seq_len // size) > QUERY_BLOCKS_MAX:
        size *= 2
    return tuple((start, min(seq_len, start + size)) for start in range(0, seq_len, size))


def causal_key_span(seq_len: int) -> float:
    """Keys per query the blocked attention scores, on average over the sequence (``seq_len`` for one block):
    the per-token width of its score tensors, ``sum(block rows x block end) / seq_len``."""
    return sum((end - start) * end for start, end in query_blocks(seq_len)) / seq_len
