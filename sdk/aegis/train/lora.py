"""LoRA adapters for the JAX models, initialised and applied as PEFT (0.21) does.

``W x`` becomes ``W x + (alpha / r) * B A dropout(x)`` on each targeted linear, with ``A`` drawn
kaiming-uniform(a=sqrt(5)) (uniform in ``±1/sqrt(in_features)``) and ``B`` zeros, so a fresh adapter
leaves the model unchanged. Adapters are created, kept and updated in fp32 under any base dtype (PEFT's
``autocast_adapter_dtype=True``; ``aegis.train.step.precision_dtypes``), and the update runs as PEFT's
``Linear.forward`` does (``aegis.train.modeling.layers.linear``): over a bf16 base the input is cast to fp32
and the sum back; under mixed precision (autocast) in the compute dtype. Adapters are a
:class:`LoRAWeights` pytree whose array leaves mirror the params tree (``lora_A``/``lora_B`` under each
targeted module, stacked over layers) and whose rank/alpha/dropout/targets are static, so optax and
``jax.grad`` see only the matrices.

    lora = init_lora(model, params, rank=16, alpha=32, target_modules=("q_proj", "v_proj"), rng=key)
    logits = model.apply(params, ids, lora=lora)                 # no dropout
    logits = model.apply(params, ids, lora=lora, rng=key2)  # with lora.dropout
    merged = merge_lora(model, params, lora)                     # W + scale * B @ A, plain params

``target_modules`` are module names as PEFT takes them (``q_proj``, ``gate_up_proj``, ...) or
``"all-linear"`` (every ``nn.Linear`` in the decoder layers).

**Fused MoE experts.** transformers 5 stores routed experts as 3-D parameters (``experts.gate_up_proj``
``[E, 2I, D]``, ``experts.down_proj`` ``[E, D, I]``) and the router as a custom module, none of them
``nn.Linear``. For the model types in :data:`PEFT_MOE_PARAMETER_TARGETS` PEFT 0.21 rewrites the config
(``utils/transformers_weight_conversion.py``): the v4 names (``gate_proj``/``up_proj``/``down_proj``,
Mixtral's ``w1``/``w3``/``w2``, the router ``gate``, and all of them under ``"all-linear"``) become
``target_parameters`` wrapped by ``lora.ParamWrapper``: per expert ``W_e + (alpha/r) B_e A_e`` with
``lora_A`` ``[r*E, in]`` (rows expert-major) and ``lora_B`` ``[out, r*E]`` (columns expert-minor), rank
and alpha doubled on ``gate_up_proj`` (the fused pair), and the router weight adapted like a linear.
Naming only one of a fused pair is refused, and so is ``dropout > 0`` (ParamWrapper cannot apply it).
Other MoE types (Qwen2-MoE in 0.21) keep their experts un-adapted, as PEFT does. For DeepSeek the
conversion also takes ``gate_proj``/``up_proj``/``down_proj`` away from its nn.Linear MLPs (the dense
layers' and the shared experts'), which PEFT then leaves un-adapted; so does this module.

Models with several layer stacks (DeepSeek's ``model.dense_layers`` before ``model.layers``, see
``aegis.models.shapes.layer_stacks``) get adapters per stack under the same keys.
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

__all__ = [
    "LoRAWeights",
    "PEFT_MOE_PARAMETER_TARGETS",
    "init_lora",
    "merge_lora",
    "linear_modules",
    "parameter_targets",
    "peft_parameter_name",
    "expert_factors",
    "lora_param_count",
]

_NOT_LINEAR = ("gate", "experts")  # MoE router parameter and fused expert stacks: not nn.Linear in transformers

PEFT_MOE_PARAMETER_TARGETS: dict[str, dict[str, str]] = {
    "mixtral": {"gate": "gate.weight", "w1": "gate_up_proj", "w3": "gate_up_proj", "w2": "down_proj"},
    "qwen3_moe": {
        "gate": "gate.weight",
        "gate_proj": "gate_up_proj",
        "up_proj": "gate_up_proj",
        "down_proj": "down_proj",
    },
}
"""PEFT 0.21's ``_MOE_TARGET_MODULE_MAPPING`` for the engine's MoE model types it converts (``mixtral``;
``qwen3_moe`` through transformers' ``qwen2_moe`` conversion pattern): v4 module name -> targeted parameter.
Names mapping to the same parameter are fused: PEFT targets it with rank and alpha times their count."""
# DeepSeek-V2/V3 go through the qwen2_moe pattern too (their nn.Linear MLPs then lose these names to the experts)
PEFT_MOE_PARAMETER_TARGETS.update({t: PEFT_MOE_PARAMETER_TARGETS["qwen3_moe"] for t in ("deepseek_v2", "deepseek_v3")})


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
        """``alpha / rank``, the factor on ``B A x`` (also on fused experts: their rank and alpha are both scaled)."""
        return self.alpha / self.rank

    def tree_flatten(self) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        return (self.tree,), (self.rank, self.alpha, self.dropout, self.target_modules)

    @classmethod
    def tree_unflatten(cls, aux: tuple[Any, ...], children: tuple[Any, ...]) -> LoRAWeights:
        return cls(children[0], *aux)


def _weight_shape(w: Any) -> tuple[int, ...]:
    return tuple(w.shape) if isinstance(w, NF4Tensor) else tuple(w.shape[1:])


def _stack_keys(params: dict[str, Any]) -> list[str]:
    """The stacked decoder-layer groups of a params (or adapter) tree, in layer order."""
    return [k for k in ("dense_layers", "layers") if k in params["model"]]


def linear_modules(params: dict[str, Any], stack: str = "layers") -> dict[tuple[str, ...], tuple[int, int]]:
    """Every ``nn.Linear`` in the stacked decoder layers: path under ``model.<stack>`` -> (out, in)."""
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

    visit(params["model"][stack], ())
    return found


def peft_parameter_name(path: tuple[str, ...]) -> str | None:
    """The ``target_parameters`` entry PEFT uses for the adapter at ``path`` (under ``model.layers``), or
    None for an ordinary ``nn.Linear`` adapter: ``gate.weight`` for the router, the parameter name for experts."""
    if path and path[-1] == "gate":
        return "gate.weight"
    if len(path) >= 2 and path[-2] == "experts":
        return path[-1]
    return None


def parameter_targets(model_type: str | None, targets: Sequence[str]) -> tuple[dict[str, int], tuple[str, ...]]:
    """PEFT 0.21's MoE config conversion: ``({parameter name: rank multiplier}, remaining module targets)``.

    Raises InvalidConfigError when only part of a fused pair is named (PEFT raises ValueError there).
    """
    mapping = PEFT_MOE_PARAMETER_TARGETS.get(model_type or "")
    if not mapping:
        return {}, tuple(targets)
    resolved = list(targets)
    if "all-linear" in resolved:  # PEFT: every nn.Linear plus all the v4 names of the converted modules
        resolved += list(mapping)
    fused: dict[str, list[str]] = {}
    for old, new in mapping.items():
        fused.setdefault(new, []).append(old)
    named: dict[str, set[str]] = {}
    remaining = []
    for t in resolved:
        old = next((o for o in mapping if t == o or t.endswith("." + o)), None)
        if old is None:
            remaining.append(t)
        else:
            named.setdefault(mapping[old], set()).add(old)
    for new, present in named.items():
        if len(present) < len(fused[new]):
            missing = sorted(set(fused[new]) - present)
            raise InvalidConfigError(
                f"{model_type} fuses {' and '.join(fused[new])} into experts.{new}: target {', '.join(missing)} "
                f"too (PEFT refuses {', '.join(sorted(present))} alone)."
            )
    return {new: len(fused[new]) for new in named}, tuple(remaining)


def _parameter_leaves(params: dict[str, Any], stack: str = "layers") -> dict[tuple[str, ...], tuple[int, ...]]:
    """Dotted parameter paths under ``model.<stack>`` (router ``...gate.weight``, experts ``...experts.down_proj``)."""
    found: dict[tuple[str, ...], tuple[int, ...]] = {}

    def visit(node: Any, path: tuple[str, ...]) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                visit(v, path + (k,))
        else:
            found[path] = _weight_shape(node)

    visit(params["model"][stack], ())
    return found


def _init_pair(key: jax.Array, n_layers: int, rows: int, in_f: int, out_f: int, dtype: Any) -> dict[str, Any]:
    bound = 1.0 / math.sqrt(in_f)  # kaiming_uniform_(a=sqrt(5)): gain*sqrt(3/fan_in) = 1/sqrt(fan_in)
    a = jax.random.uniform(key, (n_layers, rows, in_f), jnp.float32, -bound, bound).astype(dtype)
    return {"lora_A": {"weight": a}, "lora_B": {"weight": jnp.zeros((n_layers, out_f, rows), dtype)}}


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
    """Fresh adapters for ``target_modules``: ``A`` kaiming-uniform (PEFT's default), ``B`` zeros.

    Fused MoE experts get PEFT's ParamWrapper adapters where PEFT 0.21 creates them (see the module docs):
    ``lora_A`` ``[L, m*r*E, in]``, ``lora_B`` ``[L, out, m*r*E]`` with ``m`` 2 on ``gate_up_proj``, else 1.
    """
    if rank <= 0:
        raise InvalidConfigError(f"LoRA rank must be positive, got {rank}; typical values are 8-64.")
    if not 0.0 <= dropout < 1.0:
        raise InvalidConfigError(f"LoRA dropout must be in [0, 1), got {dropout}.")
    targets = (target_modules,) if isinstance(target_modules, str) else tuple(target_modules)
    wrapped, module_targets = parameter_targets(model.config.get("model_type"), targets)
    from aegis.models.shapes import layer_stacks

    # PEFT's conversion took the mapped names from the nn.Linear modules too ("all-linear" included)
    converted = frozenset(PEFT_MOE_PARAMETER_TARGETS.get(model.config.get("model_type") or "", {}))
    stacks = [(key, count) for key, _, count in layer_stacks(model.spec)]
    trees = {}
    keys_per_stack = [rng] if len(stacks) == 1 else list(jax.random.split(rng, len(stacks)))
    for (stack, n_layers), key in zip(stacks, keys_per_stack, strict=True):
        tree = _init_stack(params, stack, n_layers, rank, wrapped, module_targets, converted, key, dtype)
        if tree:
            trees[stack] = tree
    if any(_has_param_adapter(t) for t in trees.values()) and dropout > 0.0:
        raise InvalidConfigError(
            f"LoRA dropout must be 0 when the MoE experts/router are adapted (PEFT's ParamWrapper refuses "
            f"lora_dropout={dropout}); set dropout=0 or leave {', '.join(sorted(wrapped))} out of target_modules."
        )
    if not trees:
        names = sorted({p[-1] for st in _stack_keys(params) for p in linear_modules(params, st)} | set(
            PEFT_MOE_PARAMETER_TARGETS.get(model.config.get("model_type") or "", {})))
        raise InvalidConfigError(
            f"target_modules {list(targets)} match no linear layer of this {model.family} model; "
            f"valid names: {', '.join(names)} (or 'all-linear')."
        )
    if "layers" in _stack_keys(params) and "layers" not in trees:
        trees["layers"] = {}
    return LoRAWeights({"model": trees}, rank, float(alpha), float(dropout), targets)


def _has_param_adapter(tree: dict[str, Any]) -> bool:
    return any(peft_parameter_name(p) is not None for p, _ in _iter_modules(tree))


def _init_stack(
    params: dict[str, Any], stack: str, n_layers: int, rank: int, wrapped: dict[str, int],
    module_targets: tuple[str, ...], converted: frozenset[str], rng: jax.Array, dtype: Any,
) -> dict[str, Any]:
    """Fresh adapters for one stacked layer group (``model.<stack>``)."""
    modules = {p: s for p, s in linear_modules(params, stack).items()
               if _selected(p, module_targets) and p[-1] not in converted}
    param_adapters: dict[tuple[str, ...], tuple[int, int, int, int]] = {}  # path -> (rows, in, out, multiplier)
    for leaf, shape in _parameter_leaves(params, stack).items():
        dotted = ".".join(leaf)
        name = next((n for n in wrapped if dotted == n or dotted.endswith("." + n)), None)
        if name is None:
            continue
        mult = wrapped[name]
        if len(shape) == 3:  # experts [E, out, in] (PEFT swaps in/out for non-transposed 3-D parameters)
            param_adapters[leaf] = (mult * rank * shape[0], shape[2], shape[1], mult)
        else:  # the router weight [E, D]: a plain 2-D LoRA
            param_adapters[leaf[:-1]] = (mult * rank, shape[1], shape[0], mult)
    tree: dict[str, Any] = {}
    entries = [(p, (rank, s[1], s[0])) for p, s in modules.items()]
    entries += [(p, (rows, in_f, out_f)) for p, (rows, in_f, out_f, _) in param_adapters.items()]
    if not entries:
        return tree
    keys = jax.random.split(rng, len(entries))
    for key, (path, (rows, in_f, out_f)) in zip(keys, sorted(entries), strict=True):
        node = tree
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = _init_pair(key, n_layers, rows, in_f, out_f, dtype)
    return tree


def _selected(path: tuple[str, ...], targets: Sequence[str]) -> bool:
    if "all-linear" in targets:
        return True
    dotted = ".".join(path)
    return any(path[-1] == t or dotted == t or dotted.endswith("." + t) for t in targets)


def expert_factors(lora: dict[str, Any], num_experts: int, dtype: Any) -> tuple[jax.Array, jax.Array]:
    """A ParamWrapper adapter's per-expert factors ``(A_e [..., E, r, in], B_e [..., E, out, r])`` reshaped as
    PEFT does: ``lora_A.reshape(E, r, in)``, ``lora_B.reshape(out, r, E).permute(2, 0, 1)``; the delta of
    expert ``e`` is ``scale * B_e @ A_e``."""
    a = lora["lora_A"]["weight"].astype(dtype)
    b = lora["lora_B"]["weight"].astype(dtype)
    lead = a.shape[:-2]
    r = a.shape[-2] // num_experts
    a_e = a.reshape(*lead, num_experts, r, a.shape[-1])
    b_e = b.reshape(*lead, b.shape[-2], r, num_experts)
    return a_e, jnp.moveaxis(b_e, -1, -3)


def _iter_modules(tree: dict[str, Any], path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], dict[str, Any]]]:
    if "lora_A" in tree:
        return [(path, tree)]
    out = []
    for k, v in tree.items():
        out += _iter_modules(v, path + (k,))
    return out


def merge_lora(model: Any, params: dict[str, Any], lora: LoRAWeights) -> dict[str, Any]:
    """Params with ``W + scale * B @ A`` folded into each targeted weight (NF4 weights come back dense);
    fused experts get PEFT's per-expert ``scale * B_e @ A_e``."""
    out = dict(params)
    out["model"] = dict(params["model"])
    for stack, tree in lora.tree["model"].items():
        out["model"][stack] = _merge_stack(params["model"][stack], tree, lora.scale)
    return out


def _merge_stack(stack_params: dict[str, Any], tree: dict[str, Any], scale: float) -> dict[str, Any]:
    layers = jax.tree_util.tree_map(lambda x: x, stack_params, is_leaf=lambda x: isinstance(x, NF4Tensor))
    for path, mod in _iter_modules(tree):
        parent = layers
        for part in path[:-1]:
            parent = parent[part]
        node, key = (parent[path[-1]], "weight") if isinstance(parent[path[-1]], dict) else (parent, path[-1])
        w = node[key]
        dense = maybe_dequantize(w, jnp.float32) if isinstance(w, NF4Tensor) else w.astype(jnp.float32)
        if dense.ndim == 4:  # [L, E, out, in] fused experts
            a_e, b_e = expert_factors(mod, dense.shape[1], jnp.float32)
            delta = jnp.einsum("leor,leri->leoi", b_e, a_e)
        else:
            delta = jnp.einsum(
                "lor,lri->loi", mod["lora_B"]["weight"].astype(jnp.float32), mod["lora_A"]["weight"].astype(jnp.float32)
            )
        target_dtype = jnp.dtype(w.dtype) if isinstance(w, NF4Tensor) else w.dtype
        node[key] = (dense + scale * delta).astype(target_dtype)
    return layers


def lora_param_count(lora: LoRAWeights) -> int:
    """Number of trainable adapter parameters."""
    return sum(int(x.size) for x in jax.tree_util.tree_leaves(lora))
