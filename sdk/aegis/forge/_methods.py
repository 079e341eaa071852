"""Merge methods as numpy kernels over one output tensor, with mergekit's parameter specs and formulas.

Each method is a :class:`Method`: its parameters (name, type, scope, default — mergekit 0.1.5's
``registered_methods()``), its input contract (base model required or ignored, how many inputs) and a
kernel ``fn(inputs, base_index, shared, per_input, rng) -> array``. ``inputs`` are the same tensor
read from every model of the slice, in the YAML's order; ``per_input[i]`` holds the parameters of
``inputs[i]`` (empty for the base where a parameter skips it).

    spec = get_method("ties")        # InvalidConfigError lists the methods there are
    out = spec.kernel(inputs, base_index, {"normalize": True, ...}, [{"weight": 1.0, "density": 0.5}, {}], rng)

Numerics follow mergekit (``merge_methods/{linear,slerp,passthrough,generalized_task_arithmetic}.py`` and
``sparsify.py``): linear and slerp work in float32 (float64 for float64 inputs) and return the input
dtype; task arithmetic, TIES and DARE round every step to the input dtype, as torch does when mergekit
runs them on bfloat16 or float16 tensors. TIES keeps, among entries of equal magnitude at its threshold,
the first ones (torch's unstable sort may pick others: possible only where half-precision values tie). DARE's
``rescale`` matches the L1 norm of the pruned delta to the unpruned one, as mergekit 0.1.5 does (the
kept entries are scaled by one factor per tensor, 1/density in expectation).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Optional

import numpy as np

from aegis.errors import InvalidConfigError

__all__ = ["Param", "Method", "METHODS", "MERGEKIT_ONLY", "KNOWN_PARAMETERS", "get_method", "slerp", "sparsify"]

REQUIRED = object()
"""Default of a parameter the YAML must set."""

Scope = Literal["shared", "input", "non_base"]
"""shared: one value per tensor; input: one per input model; non_base: one per input other than the base."""


@dataclass(frozen=True)
class Param:
    """One parameter of a merge method (mergekit's ``ParameterSpec``)."""

    name: str
    kind: Any
    scope: Scope
    default: Any = REQUIRED

    @property
    def required(self) -> bool:
        return self.default is REQUIRED


Kernel = Callable[[Sequence[np.ndarray], Optional[int], dict, Sequence[dict], np.random.Generator], np.ndarray]


@dataclass(frozen=True)
class Method:
    """A merge method: parameters, input contract and kernel."""

    name: str
    params: tuple[Param, ...]
    base: Literal["required", "ignored"]
    kernel: Kernel
    min_inputs: int = 1
    max_inputs: int | None = None
    description: str = ""

    @property
    def param_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    def param(self, name: str) -> Param | None:
        return next((p for p in self.params if p.name == name), None)


def _work_dtype(dtype: np.dtype) -> np.dtype:
    """float64 stays float64; everything else is computed in float32."""
    return np.dtype(np.float64) if dtype == np.float64 else np.dtype(np.float32)


# ----- linear ------------------------------------------------------------------------------------------


def _linear(inputs, base_index, shared, per_input, rng) -> np.ndarray:
    work = _work_dtype(inputs[0].dtype)
    weights = np.asarray([p["weight"] for p in per_input], dtype=work)
    result = np.zeros(inputs[0].shape, dtype=work)
    for tensor, w in zip(inputs, weights, strict=True):
        if work == np.float32:  # mergekit's addcmul_ is a fused multiply-add: one rounding, emulated in float64
            result = (result.astype(np.float64) + tensor.astype(np.float64) * np.float64(w)).astype(np.float32)
        else:
            result += tensor.astype(work, copy=False) * w
    if shared["normalize"]:
        result /= weights.sum(dtype=work)
    return result.astype(inputs[0].dtype, copy=False)


# ----- slerp -------------------------------------------------------------------------------------------


def slerp(t: float, v0: np.ndarray, v1: np.ndarray, dot_threshold: float = 0.9995, eps: float = 1e-8) -> np.ndarray:
    """Spherical interpolation of two whole tensors from ``v0`` (t=0) to ``v1`` (t=1).

    As mergekit: the angle comes from the tensors flattened and normalised (a norm at or below ``eps``
    counts as 1); when ``|cos| > dot_threshold`` (nearly parallel or antiparallel) it interpolates
    linearly instead.
    """
    work = _work_dtype(v0.dtype)
    a = v0.astype(work, copy=False).reshape(-1)
    b = v1.astype(work, copy=False).reshape(-1)
    t32 = np.asarray(t, dtype=work)
    if a.size == 0:
        return ((1 - t32) * a + t32 * b).reshape(v0.shape)
    norm_a = float(np.linalg.norm(a.astype(np.float64)))
    norm_b = float(np.linalg.norm(b.astype(np.float64)))
    norm_a = norm_a if norm_a > eps else 1.0
    norm_b = norm_b if norm_b > eps else 1.0
    dot = float(np.dot(a.astype(np.float64) / norm_a, b.astype(np.float64) / norm_b))
    dot = min(1.0, max(-1.0, dot))
    if abs(dot) > dot_threshold:
        coef_a, coef_b = 1 - t32, t32
    else:
        theta = math.acos(dot)
        sin_theta = math.sin(theta)
        coef_a = np.asarray(math.sin((1 - float(t32)) * theta) / sin_theta, dtype=work)
        coef_b = np.asarray(math.sin(float(t32) * theta) / sin_theta, dtype=work)
    return (coef_a * a + coef_b * b).reshape(v0.shape)


def _slerp(inputs, base_index, shared, per_input, rng) -> np.ndarray:
    other = 1 - base_index
    return slerp(shared["t"], inputs[base_index], inputs[other]).astype(inputs[base_index].dtype, copy=False)


# ----- passthrough -------------------------------------------------------------------------------------


def _passthrough(inputs, base_index, shared, per_input, rng) -> np.ndarray:
    scale = per_input[0].get("scale")
    if scale is None:
        return inputs[0]
    work = _work_dtype(inputs[0].dtype)
    return (inputs[0].astype(work, copy=False) * np.asarray(scale, dtype=work)).astype(inputs[0].dtype, copy=False)


# ----- task arithmetic, TIES, DARE ---------------------------------------------------------------------
#
# mergekit runs these in the tensors' own dtype: with bfloat16 or float16 inputs every torch operation
# rounds its result to that dtype (computing in float32 first). The kernels below compute in float32 and
# round with ``q`` wherever torch would, so half-precision merges match mergekit's numbers too.


def _rounder(dtype: np.dtype) -> Callable[[Any], Any]:
    if dtype in (np.float32, np.float64):
        return lambda x: x
    return lambda x: np.asarray(x).astype(dtype).astype(np.float32)


def _rescaled(tensor: np.ndarray, mask: np.ndarray, rescale: bool, q: Callable[[Any], Any], eps: float = 1e-7) -> np.ndarray:
    """``tensor * mask``, scaled so that its L1 norm matches ``tensor``'s when ``rescale`` (mergekit's
    ``rescaled_masked_tensor`` with ``RescaleNorm.l1``)."""
    masked = tensor * mask
    if not rescale:
        return masked
    before = q(np.abs(tensor).sum(dtype=np.float64))
    after = q(np.abs(masked).sum(dtype=np.float64))
    if before < eps or after < eps:
        return masked
    return q(masked * q(np.asarray(before / after, dtype=tensor.dtype)))


def _top_k_mask(w: np.ndarray, k: int) -> np.ndarray:
    """The ``k`` largest entries of flat ``w``; among equal values at the threshold, the first ones."""
    threshold = np.partition(w, w.size - k)[w.size - k]
    mask = w > threshold
    mask[np.flatnonzero(w == threshold)[: k - int(mask.sum())]] = True
    return mask


def sparsify(
    tensor: np.ndarray,
    density: float,
    how: Literal["magnitude", "random"],
    rescale: bool,
    rng: np.random.Generator,
    q: Callable[[Any], Any] = lambda x: x,
) -> np.ndarray:
    """Keep a ``density`` share of ``tensor``: its largest magnitudes (TIES) or a Bernoulli draw (DARE).
    ``q`` rounds to the storage dtype where mergekit computes in it."""
    if density >= 1:
        return tensor
    if how == "magnitude":
        if density <= 0 or tensor.size == 0:
            return np.zeros_like(tensor)
        k = max(1, int(density * tensor.size))
        mask = _top_k_mask(np.abs(tensor).reshape(-1).astype(np.float32, copy=False), k)
        return _rescaled(tensor, mask.reshape(tensor.shape).astype(tensor.dtype), rescale, q)
    mask = (rng.random(tensor.shape, dtype=np.float32) < density).astype(tensor.dtype)
    return _rescaled(tensor, mask, rescale, q)


def _majority_mask(deltas: np.ndarray, q: Callable[[Any], Any] = lambda x: x) -> np.ndarray:
    """TIES sign election ('sum'): keep the entries whose sign agrees with the sign of the summed deltas."""
    majority = np.where(q(deltas.sum(axis=0)) >= 0, 1, -1).astype(deltas.dtype)
    return np.sign(deltas) == majority


def _task_arithmetic(sparsification: Literal["magnitude", "random"] | None, consensus: bool) -> Kernel:
    def kernel(inputs, base_index, shared, per_input, rng) -> np.ndarray:
        base = inputs[base_index]
        work = _work_dtype(base.dtype)
        q = _rounder(base.dtype)
        others = [i for i in range(len(inputs)) if i != base_index]
        if not others:
            return base
        base_w = base.astype(work, copy=False)
        deltas = np.empty((len(others), *base.shape), dtype=work)
        for row, i in enumerate(others):
            delta = q(inputs[i].astype(work, copy=False) - base_w)
            if sparsification:
                delta = sparsify(delta, per_input[i]["density"], sparsification, shared["rescale"], rng, q)
            deltas[row] = delta
        weights = q(np.asarray([per_input[i]["weight"] for i in others], dtype=work)).reshape(
            (len(others),) + (1,) * base.ndim
        )
        deltas = q(deltas * weights)
        if consensus:
            mask = _majority_mask(deltas, q)
            mixed = q((deltas * mask).sum(axis=0))
            divisor = q((weights * mask).sum(axis=0))
            divisor[divisor == 0] = 1
        else:
            mixed = q(deltas.sum(axis=0))
            divisor = q(weights.sum(axis=0))
            divisor[np.abs(divisor) < 1e-8] = 1
        if shared["normalize"]:
            mixed = q(mixed / divisor)
        if shared["lambda"] != 1:
            mixed = q(mixed * np.asarray(shared["lambda"], dtype=work))
        return (base_w + mixed).astype(base.dtype, copy=False)

    return kernel


def _gta_params(normalize: bool, rescale: bool) -> tuple[Param, ...]:
    return (
        Param("int8_mask", bool, "shared", False),
        Param("normalize", bool, "shared", normalize),
        Param("rescale", bool, "shared", rescale),
        Param("lambda", float, "shared", 1.0),
        Param("weight", float, "non_base"),
        Param("density", float, "non_base", 1.0),
    )


METHODS: dict[str, Method] = {
    m.name: m
    for m in [
        Method("linear", (Param("weight", float, "input"), Param("normalize", bool, "shared", True)), "ignored",
               _linear, description="weighted average of the models"),
        Method("slerp", (Param("t", float, "shared"),), "required", _slerp, min_inputs=2, max_inputs=2,
               description="spherical interpolation from the base (t=0) to the other model (t=1)"),
        Method("passthrough", (Param("scale", Optional[float], "input", None),), "ignored", _passthrough,
               max_inputs=1, description="copy tensors as they are (frankenmerges from layer slices)"),
        Method("task_arithmetic", _gta_params(False, False), "required", _task_arithmetic(None, False),
               description="base + lambda * sum of weighted task vectors"),
        Method("ties", _gta_params(True, False), "required", _task_arithmetic("magnitude", True),
               description="task vectors trimmed to their largest entries, signs elected (TIES)"),
        Method("dare_ties", _gta_params(False, True), "required", _task_arithmetic("random", True),
               description="task vectors randomly dropped and rescaled (DARE), signs elected"),
        Method("dare_linear", _gta_params(False, True), "required", _task_arithmetic("random", False),
               description="task vectors randomly dropped and rescaled (DARE), summed"),
    ]
}
"""The merge methods ``aegis merge`` implements, by mergekit name."""

MERGEKIT_ONLY = (
    "multislerp", "nearswap", "ram", "ramplus_tl", "sce", "nuslerp", "model_stock", "arcee_fusion",
    "karcher", "breadcrumbs", "breadcrumbs_ties", "della", "della_linear",
)
"""mergekit methods that ``aegis merge`` does not implement (yet)."""

KNOWN_PARAMETERS = frozenset(
    {p.name for m in METHODS.values() for p in m.params}
    | {"gamma", "epsilon", "select_topk", "normalize_weights", "eps", "nuslerp_row_wise", "nuslerp_flatten",
       "filter_wise", "max_iter", "tol", "r", "alpha"}
)
"""Parameter names some mergekit method reads: a name outside this set is a typo."""


def get_method(name: str) -> Method:
    """The method called ``name``; InvalidConfigError lists the valid names."""
    try:
        return METHODS[name]
    except KeyError:
        pass
    valid = ", ".join(METHODS)
    if name in MERGEKIT_ONLY:
        raise InvalidConfigError(f"{name!r} is a mergekit method aegis does not implement yet; use one of {valid}")
    import difflib

    close = difflib.get_close_matches(str(name), list(METHODS), n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise InvalidConfigError(f"unknown merge method {name!r}; {hint}valid: {valid}")
