"""What the JAX engine's state trees hold per device: its parameter leaves (shapes, logical axes, the share one
device of a mesh holds), NF4 blocks, LoRA adapter shapes and optimizer states. Split out of
`aegis.planning.memory.jax_profile`, whose step-memory model builds on them."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from aegis.errors import InvalidConfigError
from aegis.models.arch_spec import arch_spec
from aegis.models.families import get_family
from aegis.models.families.base import LayerShape
from aegis.models.shapes import (
    BUFFER_LEAVES,
    STACKS,
    ArchSpec,
    layer_stacks,
    logical_axes,
    mesh_axes_of,
    param_shapes,
    tree_leaves,
)
from aegis.schema import ModelProfile, TrainConfig, lora_selects, lora_target_names

__all__ = ["Leaf", "local_shape", "engine_leaves", "nf4_leaf_bytes", "optimizer_state_bytes", "NF4_BLOCK", "NF4_BLOCK2",
           "ADAM8BIT_BLOCK", "ADAM8BIT_MIN_SIZE", "ADAFACTOR_MIN_DIM", "ENGINE_NF4_SKIP"]

_FP32 = 4

NF4_BLOCK = 64
"""Weights per NF4 absmax (`train/nf4.py` ``block_size``)."""
NF4_BLOCK2 = 256
"""Absmax values per float32 double-quantisation scale."""
ADAM8BIT_BLOCK = 256
"""Elements per float32 absmax of 8-bit Adam's moments (`train/optim8bit.py` ``BLOCK_SIZE``)."""
ADAM8BIT_MIN_SIZE = 4096
"""Per-slice size below which 8-bit Adam keeps float32 moments (bitsandbytes ``min_8bit_size``)."""
ADAFACTOR_MIN_DIM = 128
"""optax.adafactor ``min_dim_size_to_factor``: both factored dimensions must be at least this."""
ENGINE_NF4_SKIP = ("gate", "router", "shared_expert_gate")
"""Linear-like weights the engine keeps unquantised under QLoRA: the MoE routers (`train/nf4.py`
``DEFAULT_SKIP``, which also skips embeddings and the head)."""


@dataclass(frozen=True)
class Leaf:
    """One array of the engine's parameter tree: stacked layer tensors carry the layer axis first."""

    path: str
    shape: tuple[int, ...]
    matrix: bool
    """A weight the layers multiply by (quantised under QLoRA, in the weight-decay group)."""
    quantizable: bool
    stacked: bool
    logical: tuple[str | None, ...] = ()
    """Logical axis names (`aegis.models.shapes.logical_axes`): how the engine's sharding rules split it."""

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def local_shape(self, mesh: Mapping[str, int]) -> tuple[int, ...]:
        """The shape one device holds on a mesh of these axis sizes (the engine's rules)."""
        return local_shape(self.shape, self.logical or (None,) * len(self.shape), mesh)

    def local_size(self, mesh: Mapping[str, int]) -> int:
        return math.prod(self.local_shape(mesh))


def local_shape(shape: tuple[int, ...], logical: tuple[str | None, ...], mesh: Mapping[str, int]) -> tuple[int, ...]:
    """One device's block of an array of ``shape`` named ``logical`` (`aegis.models.shapes.mesh_axes_of`: the rules
    `aegis.train.sharding` places the engine's arrays by; an axis no mesh axis divides stays whole)."""
    out = list(shape)
    for i, entry in enumerate(mesh_axes_of(shape, logical, mesh)):
        for axis in entry if isinstance(entry, tuple) else (entry,) if entry else ():
            out[i] //= mesh.get(axis, 1)
    return tuple(out)


def engine_leaves(profile: ModelProfile) -> list[Leaf]:
    """The JAX engine's parameter tree for a profile, leaf by leaf (`aegis.models.shapes.param_shapes` of the
    engine's own `aegis.models.arch_spec.arch_spec`): embeddings, per-layer tensors stacked over layers, final
    norm, untied head. Buffers (DeepSeek-V3's score correction) are not parameters and not leaves here."""
    out = []
    spec = _spec(profile)
    axes = logical_axes(profile.config, spec)
    for path, shape in tree_leaves(param_shapes(spec)).items():
        if path[-1] in BUFFER_LEAVES:
            continue
        stacked = len(path) > 1 and path[0] == "model" and path[1] in STACKS
        # a weight a dot multiplies by: what `train/nf4.py` quantises (linears, fused experts) and the routers
        # and head it skips; norms (Cohere's per-head q/k norm weights too) and embeddings are not
        matrix = (path[-1] in ("weight", "gate_up_proj", "down_proj") and len(shape) - int(stacked) >= 2
                  and not any(k.endswith("norm") or k in ("embed_tokens", "embed_positions") for k in path))
        quantizable = matrix and not any(k in ENGINE_NF4_SKIP or k == "lm_head" for k in path)
        out.append(Leaf(".".join(path), shape, matrix=matrix, quantizable=quantizable, stacked=stacked, logical=axes[path]))
    return out


def _spec(profile: ModelProfile) -> ArchSpec:
    return arch_spec(profile.config)


def _layer_stacks(profile: ModelProfile, layers: list[LayerShape]) -> list[tuple[int, LayerShape]]:
    """The engine's stacks (`aegis.models.shapes.layer_stacks`: one, or DeepSeek's dense layers before its MoE
    layers) as (count, the planner's shape of the stack's first layer)."""
    return [(count, layers[first]) for _, first, count in layer_stacks(_spec(profile))]


def nf4_leaf_bytes(leaf: Leaf, mesh: Mapping[str, int] | None = None) -> int:
    """Bytes of one stacked weight quantised per layer slice as `train/nf4.py` stores it: packed uint8
    codes (two per byte), uint8 absmax per 64 weights, float32 scale per 256 absmax, float32 offset. On a
    ``mesh``, one device's share: the NF4 arrays ``[layers, k]`` are no parameter's shape, so the rules' fsdp
    fallback splits ``k`` where fsdp divides it (the layer axis stays whole; the offsets are replicated)."""
    layers = leaf.shape[0]
    n = math.prod(leaf.shape[1:])
    blocks = -(-n // NF4_BLOCK)
    f = (mesh or {}).get("fsdp", 1)

    def share(k: int) -> int:
        return k // f if k % f == 0 else k

    return layers * (share(-(-n // 2)) + share(blocks) + _FP32 * share(-(-blocks // NF4_BLOCK2)) + _FP32)


def _lora_local(shape: tuple[int, ...], hidden: int, mesh: Mapping[str, int]) -> tuple[int, ...]:
    """One device's block of an adapter matrix: it follows its base weight (`aegis.models.shapes.leaf_logical`):
    A ``[layers, lora_rank, in]``, B ``[layers, out, lora_rank]``, a hidden-wide side named ``embed``."""
    _, a, b = shape
    if a <= b:  # A: [L, rank, in]
        return local_shape(shape, ("layers", "lora_rank", "embed" if b == hidden else "mlp"), mesh)
    return local_shape(shape, ("layers", "embed" if a == hidden else "mlp", "lora_rank"), mesh)


def _lora_leaves(profile: ModelProfile, cfg: TrainConfig) -> list[tuple[int, ...]]:
    """Shapes of the adapter matrices `train/lora.py` creates, stacked over layers: A [L, r, in] and
    B [L, out, r] per targeted linear; fused MoE experts as PEFT's ParamWrapper, A [L, f*r*E, in] and
    B [L, out, f*r*E] (f = 2 on the fused gate+up pair)."""
    lora = cfg.lora_config
    layers = get_family(profile.config).layers(profile.config)
    targets = lora_target_names(lora.target_modules, profile.linear_modules)
    shapes = []
    for n, layer in _layer_stacks(profile, layers):
        for lin in layer.linears:
            if lora_selects(lin, targets):
                rank = lora.rank * lin.lora_rank_factor * lin.count
                shapes += [(n, rank, lin.in_features), (n, lin.out_features, rank)]
    return shapes


def _adafactor_bytes(shape: tuple[int, ...], width: int) -> int:
    dims = sorted(range(len(shape)), key=lambda i: shape[i])
    if len(shape) >= 2 and shape[dims[-2]] >= ADAFACTOR_MIN_DIM:
        size = math.prod(shape)
        return width * (size // shape[dims[-1]] + size // shape[dims[-2]] + 1)  # v_row, v_col, v placeholder
    return width * (math.prod(shape) + 2)  # v, v_row and v_col placeholders


def _adam8bit_bytes(shape: tuple[int, ...], stacked: bool) -> int:
    """One moment of `train/optim8bit.py`: uint8 codes + float32 absmax per 256 per layer slice, or
    float32 below 4,096 elements per slice."""
    layers = shape[0] if stacked else 1
    n = math.prod(shape) // layers
    if n < ADAM8BIT_MIN_SIZE:
        return _FP32 * n * layers
    return layers * (n + _FP32 * -(-n // ADAM8BIT_BLOCK))


def optimizer_state_bytes(cfg: TrainConfig, shapes: list[tuple[int, ...]], param_width: int,
                          stacked: list[bool] | None = None) -> tuple[int, str]:
    """Bytes of the optax state `step.make_optimizer` builds for trainable leaves of these shapes
    (``stacked``: which leaves carry the layer axis; 8-bit Adam quantises per layer slice)."""
    count = sum(math.prod(s) for s in shapes)
    stacked = stacked if stacked is not None else [True] * len(shapes)
    if cfg.optimizer == "adamw":
        # _fp32_update: mu and nu in float32; count, inner count and 6 injected float32 hyper-parameters
        return 2 * _FP32 * count + 8 * 4, f"AdamW mu + nu in fp32: 2 x {count:,} x 4 B"
    if cfg.optimizer in ("adamw_8bit", "paged_adamw_8bit"):
        total = 2 * sum(_adam8bit_bytes(sh, st) for sh, st in zip(shapes, stacked, strict=True)) + 7 * 4
        return total, f"8-bit AdamW: 2 moments x {count:,} x (1 B + 4 B/256 absmax); float32 below 4,096 per slice"
    if cfg.optimizer == "sgd":
        return param_width * count + 4 + 2 * param_width, f"SGD momentum trace: {count:,} x {param_width} B"
    if cfg.optimizer == "adafactor":
        total = sum(_adafactor_bytes(s, param_width) for s in shapes) + 5 * 4 + 4 * param_width
        return total, f"Adafactor factored second moments (row + column means) in {param_width}-byte floats"
    raise InvalidConfigError(
        f"optimizer {cfg.optimizer!r} has no optax implementation in the JAX engine; use adamw, adamw_8bit, adafactor or sgd"
    )
