"""The device mesh and the sharding rules of a run: logical axis names per parameter, mapped to mesh axes as data.

Every parameter gets logical axis names (``embed``, ``vocab``, ``heads``, ``kv_heads``, ``head_dim``, ``mlp``,
``experts``, ``layers`` for the axis stacked under ``lax.scan``, ``lora_rank``) read from the architecture
registry: each registry parameter's shape is an expression over the config (``linear: [hidden, heads * head_dim]``)
and :data:`EXPRESSION_AXES` names an expression by the first of its names it knows. :data:`LOGICAL_AXIS_RULES`
maps logical axes to mesh axes (MaxText's ``logical_axis_rules``, levanter's ``axis_resources``). A parameter is
then sharded by :func:`partition_spec`:

1. each axis takes the first mesh axis its rule lists that is larger than 1, unused by the parameter, and divides
   the axis' size (``layers`` is never sharded);
2. where ``fsdp`` is still unused, it shards the largest remaining axis it divides (ZeRO-3: every parameter is
   split, whatever its logical names), or, with none left, the largest axis it shares with ``tensor``;
3. whatever divides nothing is replicated. Never an error.

LoRA adapters follow their base weight (``lora_A``: ``[layers, lora_rank, in]``, ``lora_B``: ``[layers, out,
lora_rank]``); NF4 codes and absmax, optimizer moments and anything else found under a parameter's path fall back
to rule 2 when their shape is not the parameter's (a leaf stacked over layers keeps that axis whole); leaves under
no parameter (step, RNG key, learning rate, loss scale) are replicated. Optimizer
states follow their params by path: optax nests ``mu``/``nu`` trees shaped like the params, so the suffix of a
moment's path from ``model``/``lm_head`` on is its parameter's path. No family-specific code: a new registry entry
is sharded by the same rules.

    mesh = make_mesh(ParallelConfig(data=2, fsdp=2), jax.devices())
    rules = ShardingRules.for_model(model, mesh)
    state = jax.device_put(state, rules.shardings(state))     # TrainState, LoRA, NF4 base: one call
    batch = jax.device_put(arrays, batch_sharding(mesh))        # [accum, batch, seq], batch over (data, fsdp)
"""

from __future__ import annotations

import ast
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from aegis.train.parallel import MESH_AXES, ParallelConfig, resolve_parallel

__all__ = [
    "LOGICAL_AXIS_RULES",
    "EXPRESSION_AXES",
    "TOP_LEVEL_AXES",
    "make_mesh",
    "batch_sharding",
    "logical_axes",
    "partition_spec",
    "ShardingRules",
]

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

_STACKS = ("layers", "dense_layers")
_TOPS = ("model", "lm_head")

Logical = tuple[str | None, ...]


def make_mesh(parallel: ParallelConfig | None, devices: Sequence[Any] | None = None) -> tuple[Mesh, ParallelConfig]:
    """``(Mesh over ("data", "fsdp", "tensor"), the resolved ParallelConfig)`` for ``devices`` (default: all)."""
    devices = list(devices if devices is not None else jax.devices())
    resolved = resolve_parallel(parallel, len(devices))
    return Mesh(np.array(devices).reshape(resolved.shape), MESH_AXES), resolved


def _mesh_sizes(mesh: Mesh) -> dict[str, int]:
    return dict(mesh.shape)


def batch_sharding(mesh: Mesh, batch_axis: int = 1, ndim: int = 3) -> NamedSharding:
    """Arrays with the batch on ``batch_axis`` split over the mesh axes of :data:`LOGICAL_AXIS_RULES` ``batch``."""
    sizes = _mesh_sizes(mesh)
    axes = tuple(a for a in LOGICAL_AXIS_RULES["batch"] if sizes.get(a, 1) > 1)
    spec: list[Any] = [None] * ndim
    spec[batch_axis] = axes[0] if len(axes) == 1 else (axes or None)
    return NamedSharding(mesh, P(*spec))


def partition_spec(shape: Sequence[int], logical: Logical, mesh_sizes: Mapping[str, int]) -> P:
    """The PartitionSpec of an array of ``shape`` whose axes are named ``logical`` (see the module docs)."""
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
    return P(*spec)


# ----- logical axes from the registry ------------------------------------------------------------------------


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


def _tree_leaves(tree: Any, path: tuple[str, ...] = ()) -> dict[tuple[str, ...], tuple[int, ...]]:
    if isinstance(tree, dict):
        out: dict[tuple[str, ...], tuple[int, ...]] = {}
        for k, v in tree.items():
            out.update(_tree_leaves(v, path + (k,)))
        return out
    return {path: tuple(tree)}


def logical_axes(model: Any) -> dict[tuple[str, ...], Logical]:
    """Logical axis names of every leaf of ``model``'s params tree (stacked leaves lead with ``layers``): the
    registry's shape expressions for the decoder layers, :data:`TOP_LEVEL_AXES` outside them; a leaf the registry
    does not describe in the engine's layout gets ``None`` names (sharded by the fsdp fallback only)."""
    from aegis.architectures import registry
    from aegis.train.models import get_family
    from aegis.train.models.spec import layer_stacks

    shapes = _tree_leaves(model.param_shapes())
    config = model.config
    entry = registry.get(config.get("model_type"))
    names = entry.names(config)
    ckpt = get_family(config.get("model_type")).checkpoint_names(config)
    known: dict[tuple[str, ...], Logical] = {}
    for key, first, _ in layer_stacks(model.spec):
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
            stacked = len(path) > 1 and path[0] == "model" and path[1] in _STACKS
            out[path] = (("layers",) if stacked else ()) + (None,) * (len(shape) - int(stacked))
    return out


# ----- shardings of whole trees ------------------------------------------------------------------------------


def _key(entry: Any) -> str:
    for attr in ("key", "name", "idx"):
        if hasattr(entry, attr):
            return str(getattr(entry, attr))
    return str(entry)


class ShardingRules:
    """The shardings of a model's trees on one mesh: params, LoRA adapters, NF4 bases, train states."""

    def __init__(self, mesh: Mesh, axes: Mapping[tuple[str, ...], Logical], shapes: Mapping[tuple[str, ...], tuple[int, ...]]):
        self.mesh = mesh
        self.sizes = _mesh_sizes(mesh)
        self.axes = dict(axes)
        self.shapes = dict(shapes)
        self.replicated = NamedSharding(mesh, P())

    @classmethod
    def for_model(cls, model: Any, mesh: Mesh) -> ShardingRules:
        return cls(mesh, logical_axes(model), _tree_leaves(model.param_shapes()))

    def leaf_logical(self, path: Sequence[str], shape: Sequence[int]) -> Logical | None:
        """Logical names of the leaf at ``path`` (a path in any tree holding a param-shaped subtree) of ``shape``;
        None for a leaf that belongs to no parameter (step counters, RNG keys, learning rates: replicated)."""
        shape = tuple(shape)
        for start, key in enumerate(path):
            if key not in _TOPS:
                continue
            rel = tuple(path[start:])
            if rel in self.axes and self.shapes[rel] == shape:
                return self.axes[rel]
            if len(rel) >= 3 and rel[-2] in ("lora_A", "lora_B"):  # an adapter: follows its base weight
                base = rel[:-2]
                base_axes = self.axes.get(base + ("weight",)) or self.axes.get(base)
                if base_axes is not None and len(shape) == 3 and len(base_axes) >= 3:
                    out_axis, in_axis = base_axes[-2], base_axes[-1]
                    if rel[-2] == "lora_A":
                        return ("layers", "lora_rank", in_axis)
                    return ("layers", out_axis, "lora_rank")
            stacked = len(rel) > 1 and rel[0] == "model" and rel[1] in _STACKS and len(shape) >= 1
            return (("layers",) if stacked else ()) + (None,) * (len(shape) - int(stacked))
        return None

    def spec(self, path: Sequence[str], shape: Sequence[int]) -> P:
        logical = self.leaf_logical(path, shape)
        return P() if logical is None else partition_spec(shape, logical, self.sizes)

    def shardings(self, tree: Any) -> Any:
        """A NamedSharding per array leaf of ``tree`` (a TrainState, params, LoRAWeights, NF4 base, or their
        ``jax.ShapeDtypeStruct`` shapes); None leaves stay None."""

        def one(path: tuple, leaf: Any) -> Any:
            shape = getattr(leaf, "shape", ())
            return NamedSharding(self.mesh, self.spec([_key(k) for k in path], shape))

        return jax.tree_util.tree_map_with_path(one, tree)

    def place(self, tree: Any) -> Any:
        """``tree`` on the mesh, each leaf sharded by the rules."""
        return jax.device_put(tree, self.shardings(tree))

    def abstract(self, tree: Any) -> Any:
        """``jax.ShapeDtypeStruct`` leaves carrying the rules' shardings (an orbax restore target)."""
        shardings = self.shardings(tree)
        return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)
