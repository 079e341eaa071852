"""The device mesh and the sharding rules of a run: logical axis names per parameter, mapped to mesh axes as data.

Every parameter gets logical axis names (``embed``, ``vocab``, ``heads``, ``kv_heads``, ``head_dim``, ``mlp``,
``experts``, ``layers`` for the axis stacked under ``lax.scan``, ``lora_rank``) read from the architecture
registry: each registry parameter's shape is an expression over the config (``linear: [hidden, heads * head_dim]``)
and :data:`EXPRESSION_AXES` names an expression by the first of its names it knows. :data:`LOGICAL_AXIS_RULES`
maps logical axes to mesh axes (MaxText's ``logical_axis_rules``, levanter's ``axis_resources``). The names and
the rules are JAX-free data in `aegis.models.shapes`, which the planner's JAX profile shards by too
(`aegis.planning.memory.jax_profile`). A parameter is then sharded by :func:`partition_spec`:

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

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from aegis.train.parallel import MESH_AXES, ParallelConfig, resolve_parallel
from aegis.models.shapes import (
    EXPRESSION_AXES,
    LOGICAL_AXIS_RULES,
    TOP_LEVEL_AXES,
    Logical,
    leaf_logical,
    mesh_axes_of,
    tree_leaves,
)
from aegis.models.shapes import logical_axes as _logical_axes

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
    """The PartitionSpec of an array of ``shape`` whose axes are named ``logical`` (see the module docs and
    `aegis.models.shapes.mesh_axes_of`)."""
    return P(*mesh_axes_of(shape, logical, mesh_sizes))


# ----- logical axes from the registry ------------------------------------------------------------------------


def logical_axes(model: Any) -> dict[tuple[str, ...], Logical]:
    """Logical axis names of every leaf of ``model``'s params tree (`aegis.models.shapes.logical_axes` of its
    config and spec)."""
    return _logical_axes(model.config, model.spec)


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
        return cls(mesh, logical_axes(model), tree_leaves(model.param_shapes()))

    def leaf_logical(self, path: Sequence[str], shape: Sequence[int]) -> Logical | None:
        """Logical names of the leaf at ``path`` (a path in any tree holding a param-shaped subtree) of ``shape``;
        None for a leaf that belongs to no parameter (step counters, RNG keys, learning rates: replicated)."""
        return leaf_logical(self.axes, self.shapes, path, shape)

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
