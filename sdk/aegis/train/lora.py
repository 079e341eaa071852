"""LoRA adapters for the JAX models, initialised and applied as PEFT does.

``W x`` becomes ``W x + (alpha / r) * B A dropout(x)`` on each targeted linear, with ``A`` drawn
kaiming-uniform(a=sqrt(5)) (uniform in ``±1/sqrt(in_features)``) and ``B`` zeros, so a fresh adapter
leaves the model unchanged. Adapters are a :class:`LoRAWeights` pytree whose array leaves mirror
the params tree (``lora_A``/``lora_B`` under each targeted module, stacked over layers) and whose
rank/alpha/dropout/targets are static, so optax and ``jax.grad`` see only the matrices.

    lora = init_lora(model, params, rank=16, alpha=32, target_modules=("q_proj", "v_proj"), rng=key)
    logits = model.apply(params, ids, lora=lora)                 # no dropout
    logits = model.apply(params, ids, lora=lora, lora_rng=key2)  # with lora.dropout
    merged = merge_lora(model, params, lora)                     # W + scale * B @ A, plain params

``target_modules`` are module names as PEFT takes them (``q_proj``, ``gate_up_proj``, ...) or
``"all-linear"`` (every linear in the decoder layers; MoE expert stacks and routers are not
``nn.Linear`` in transformers and are never targeted).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

from aegis.errors import InvalidConfigError
from aegis.train.nf4 import NF4Tensor, maybe_dequantize

__all__ = ["LoRAWeights", "init_lora", "merge_lora", "linear_modules", "lora_param_count"]

_NOT_LINEAR = ("gate", "experts")  # MoE router parameter and fused expert stacks: not nn.Linear in transformers


@jax.tree_util.register_pytree_node_class
@dataclass(frozen=True)
class LoRAWeights:
    """LoRA matrices (``tree``) plus static hyper-parameters."""

    tree: dict[str, Any]
    rank: int
    alpha: float
    dropout: float
    target_modules: tuple[str, ...]

    @property
    def scale(self) -> float:
        """``alpha / rank``, the factor on ``B A x``."""
        return self.alpha / self.rank

    def tree_flatten(self) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        return (self.tree,), (self.rank, self.alpha, self.dropout, self.target_modules)

    @classmethod
    def tree_unflatten(cls, aux: tuple[Any, ...], children: tuple[Any, ...]) -> LoRAWeights:
        return cls(children[0], *aux)


def _weight_shape(w: Any) -> tuple[int, ...]:
    return tuple(w.shape) if isinstance(w, NF4Tensor) else tuple(w.shape[1:])


def linear_modules(params: dict[str, Any]) -> dict[tuple[str, ...], tuple[int, int]]:
    """Every ``nn.Linear`` in the stacked decoder layers: path under ``model.layers`` -> (out, in)."""
    found: dict[tuple[str, ...], tuple[int, int]] = {}

    def visit(node: Any, path: tuple[str, ...]) -> None:
        if not isinstance(node, dict):
            return
        if "weight" in node and path and path[-1] not in _NOT_LINEAR and not path[-1].endswith("norm"):
            shape = _weight_shape(node["weight"])
            if len(shape) == 2:
                found[path] = (shape[0], shape[1])
            return
        for k, v in node.items():
            visit(v, path + (k,))

    visit(params["model"]["layers"], ())
    return found


def _selected(path: tuple[str, ...], targets: Sequence[str]) -> bool:
    if "all-linear" in targets:
        return True
    dotted = ".".join(path)
    return any(path[-1] == t or dotted == t or dotted.endswith("." + t) for t in targets)


def init_lora(
    model: Any,
    params: dict[str, Any],
    *,
    rank: int,
    alpha: float,
    target_modules: Sequence[str] | str,
    rng: jax.Array,
    dtype: Any = jnp.float32,
    dropout: float = 0.0,
) -> LoRAWeights:
    """Fresh adapters for ``target_modules``: ``A`` kaiming-uniform (PEFT's default), ``B`` zeros."""
    if rank <= 0:
        raise InvalidConfigError(f"LoRA rank must be positive, got {rank}; typical values are 8-64.")
    if not 0.0 <= dropout < 1.0:
        raise InvalidConfigError(f"LoRA dropout must be in [0, 1), got {dropout}.")
    targets = (target_modules,) if isinstance(target_modules, str) else tuple(target_modules)
    modules = {p: s for p, s in linear_modules(params).items() if _selected(p, targets)}
    if not modules:
        names = sorted({p[-1] for p in linear_modules(params)})
        raise InvalidConfigError(
            f"target_modules {list(targets)} match no linear layer of this {model.family} model; "
            f"valid names: {', '.join(names)} (or 'all-linear')."
        )
    n_layers = model.spec.num_layers
    tree: dict[str, Any] = {}
    keys = jax.random.split(rng, len(modules))
    for key, (path, (out_f, in_f)) in zip(keys, sorted(modules.items()), strict=True):
        bound = 1.0 / math.sqrt(in_f)  # kaiming_uniform_(a=sqrt(5)): gain*sqrt(3/fan_in) = 1/sqrt(fan_in)
        a = jax.random.uniform(key, (n_layers, rank, in_f), jnp.float32, -bound, bound).astype(dtype)
        b = jnp.zeros((n_layers, out_f, rank), dtype)
        node = tree
        for part in path:
            node = node.setdefault(part, {})
        node["lora_A"] = {"weight": a}
        node["lora_B"] = {"weight": b}
    return LoRAWeights({"model": {"layers": tree}}, rank, float(alpha), float(dropout), targets)


def _iter_modules(tree: dict[str, Any], path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], dict[str, Any]]]:
    if "lora_A" in tree:
        return [(path, tree)]
    out = []
    for k, v in tree.items():
        out += _iter_modules(v, path + (k,))
    return out


def merge_lora(model: Any, params: dict[str, Any], lora: LoRAWeights) -> dict[str, Any]:
    """Params with ``W + scale * B @ A`` folded into each targeted weight (NF4 weights come back dense)."""
    layers = jax.tree_util.tree_map(lambda x: x, params["model"]["layers"], is_leaf=lambda x: isinstance(x, NF4Tensor))
    for path, mod in _iter_modules(lora.tree["model"]["layers"]):
        node = layers
        for part in path:
            node = node[part]
        w = node["weight"]
        dense = maybe_dequantize(w, jnp.float32) if isinstance(w, NF4Tensor) else w.astype(jnp.float32)
        delta = jnp.einsum(
            "lor,lri->loi", mod["lora_B"]["weight"].astype(jnp.float32), mod["lora_A"]["weight"].astype(jnp.float32)
        )
        target_dtype = jnp.dtype(w.dtype) if isinstance(w, NF4Tensor) else w.dtype
        node["weight"] = (dense + lora.scale * delta).astype(target_dtype)
    out = dict(params)
    out["model"] = dict(params["model"])
    out["model"]["layers"] = layers
    return out


def lora_param_count(lora: LoRAWeights) -> int:
    """Number of trainable adapter parameters."""
    return sum(int(x.size) for x in jax.tree_util.tree_leaves(lora))
