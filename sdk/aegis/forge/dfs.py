"""DFS merging (data-flow space, Akiba et al., "Evolutionary Optimization of Model Merging Recipes",
arXiv 2403.13187, §3.2): a path through the stacked layers of several models, with input scaling.

    merge_method: dfs
    models: [{model: ./a}, {model: ./b}]          # layers stacked: a's 0..La-1, then b's La..La+Lb-1 (M in all)
    dfs:
      repeats: 2                                  # r: the stack is walked r times, T = M * r slots
      indicator: [1, 1, 0, 1,  0, 1, 1, 1,  ...]  # I: slot t runs layer t mod M when I[t] = 1
      scales:                                     # W (M x M), default 1: a full matrix, or overrides
        - {from: 1, to: 5, value: 0.8}            # the input of layer 5 is scaled by 0.8 when it follows layer 1

``aegis merge dfs.yml OUT`` writes it as a plain Hugging Face folder (transformers loads it with no
custom code): :func:`compile_dfs` turns the path into a passthrough frankenmerge, one slice per run of
consecutive layers, and folds the scaling into weights. Embeddings come from the model of the first layer
on the path, the final norm and head from the model of the last (mergekit's passthrough rule).

The computation (the paper's): with ``h_0`` the embeddings and ``j_1, j_2, ...`` the layers whose slots are
on (``I[t] = 1``), ``h_k = L_{j_k}(W[j_{k-1}, j_k] * h_{k-1})`` and the first layer's input is not scaled.

**The fold.** A pre-norm decoder layer ``u = x + A(n1(x)); y = u + F(n2(u))`` whose norms are RMSNorm
satisfies ``L(c x) = c L~(x)`` for ``c > 0``, where ``L~`` is ``L`` with the attention output projection
(``o_proj``, weight and bias) and the MLP output projection (``down_proj``) divided by ``c`` -- *when the
norms are scale invariant*, i.e. ``rms_norm_eps = 0``. So the folded model carries ``h_k / C_k`` with
``C_k = W[j_0, j_1] * ... * W[j_{k-1}, j_k]`` and layer ``k`` is written with its output projections divided
by ``C_k``; the final norm, scale invariant too, removes the last ``C``. The fold is exact (up to float
rounding) when every scale on the path is 1, or when ``rms_norm_eps == 0``. With ``eps > 0`` a folded norm
reads the stream divided by ``C`` and computes ``y / sqrt(ms(y) + eps * C^2)`` where the paper's layer computes
``y / sqrt(ms(y) + eps)`` (``y`` the scaled input, ``ms`` its mean square): a relative change of about
``eps * |C^2 - 1| / (2 ms(y))``, negligible where hidden states are large (trained models), and reported as a
warning with the ``C`` farthest from 1. Scaling a layer's input norm weight (an idea that comes up) is
not equivalent: RMSNorm ignores its input's scale, the residual stream does not. Negative or zero scales
cannot be folded (the layers are not odd functions) and are refused; so are non-unit scales on families
whose layers are not of this form (post-norm Gemma 2/3, MoE), for which only the indicator is supported.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from pydantic import ConfigDict, Field, field_validator, model_validator

from aegis.errors import InvalidConfigError
from aegis.schema import Frozen

__all__ = ["DFSParameters", "ScaleOverride", "PathStep", "dfs_path", "compile_dfs", "FOLDABLE_MODEL_TYPES"]

FOLDABLE_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3"})
"""Families whose decoder layer is ``x + A(RMSNorm(x))`` then ``u + F(RMSNorm(u))`` (scales fold exactly)."""
OUTPUT_PROJECTIONS = ("self_attn.o_proj", "mlp.down_proj")
"""The tensors (weight and bias) that a layer's residual branches end in: where ``1 / C`` is folded."""


class ScaleOverride(Frozen):
    """One entry of W: the input of layer ``to`` is multiplied by ``value`` when it follows layer ``from``."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True, populate_by_name=True)

    src: int = Field(alias="from", ge=0, description="Index of the previous layer in the stacked layers (0..M-1).")
    dst: int = Field(alias="to", ge=0, description="Index of the layer whose input is scaled (0..M-1).")
    value: float = Field(description="The scale (positive).")


class DFSParameters(Frozen):
    """The ``dfs:`` block of a merge YAML: layer path and scaling."""

    repeats: int = Field(default=1, ge=1, description="r: how many times the stack of all models' layers is walked.")
    indicator: tuple[int, ...] = Field(description="I: T = M * r entries, 1 where the slot's layer runs.")
    scales: tuple[tuple[float, ...], ...] | tuple[ScaleOverride, ...] | None = Field(
        default=None, description="W: an M x M matrix, or {from, to, value} overrides of the default 1."
    )

    @field_validator("indicator", mode="before")
    @classmethod
    def _bits(cls, v: Any) -> Any:
        if not isinstance(v, (list, tuple)) or not v:
            raise ValueError("indicator must be a non-empty list of 0/1 (one entry per slot, M * repeats)")
        out = []
        for e in v:
            if e in (0, 1) and not isinstance(e, float) or isinstance(e, bool):
                out.append(int(e))
            else:
                raise ValueError(f"indicator entries are 0 or 1, got {e!r}")
        return tuple(out)

    @model_validator(mode="after")
    def _positive(self) -> DFSParameters:
        for v in self._scale_values():
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"scales must be positive finite numbers (got {v!r}); a layer cannot take a negative input")
        if not any(self.indicator):
            raise ValueError("indicator selects no layer; set at least one entry to 1")
        return self

    def _scale_values(self) -> list[float]:
        if not self.scales:
            return []
        if isinstance(self.scales[0], ScaleOverride):
            return [s.value for s in self.scales]  # type: ignore[union-attr]
        return [v for row in self.scales for v in row]  # type: ignore[union-attr]

    def scale(self, src: int, dst: int) -> float:
        """W[src, dst] (1 where not set)."""
        if not self.scales:
            return 1.0
        if isinstance(self.scales[0], ScaleOverride):
            found = [s.value for s in self.scales if s.src == src and s.dst == dst]  # type: ignore[union-attr]
            return found[-1] if found else 1.0
        return float(self.scales[src][dst])  # type: ignore[index]

    def check(self, num_layers: int, where: str = "dfs") -> None:
        """Raise InvalidConfigError unless the indicator has M * r entries and W fits M x M."""
        want = num_layers * self.repeats
        if len(self.indicator) != want:
            raise InvalidConfigError(
                f"{where}.indicator has {len(self.indicator)} entries; it needs M * repeats = "
                f"{num_layers} * {self.repeats} = {want} (one per layer slot)"
            )
        if self.scales and not isinstance(self.scales[0], ScaleOverride):
            rows = self.scales
            if len(rows) != num_layers or any(len(r) != num_layers for r in rows):  # type: ignore[arg-type]
                raise InvalidConfigError(f"{where}.scales must be an M x M matrix with M = {num_layers} (the stacked layers)")
        elif self.scales:
            bad = next((s for s in self.scales if s.src >= num_layers or s.dst >= num_layers), None)  # type: ignore[union-attr]
            if bad is not None:
                raise InvalidConfigError(
                    f"{where}.scales: layer index {max(bad.src, bad.dst)} is past the {num_layers} stacked layers (0..{num_layers - 1})"  # type: ignore[union-attr]
                )


class PathStep(Frozen):
    """One layer of the DFS path as it runs: which model and layer, its input scale and the product so far."""

    model: str = Field(description="Model folder (as the YAML names it).")
    layer: int = Field(description="Layer index inside that model.")
    stacked: int = Field(description="Index in the stacked layers (0..M-1).")
    scale: float = Field(description="W[previous, this]: the factor on this layer's input (1 for the first).")
    cumulative: float = Field(description="C: product of the scales up to and including this one.")


def dfs_path(params: DFSParameters, depths: list[tuple[str, int]]) -> list[PathStep]:
    """The layers the path runs, in order, for models ``depths`` = [(name, number of layers), ...]."""
    owners: list[tuple[str, int]] = [(name, layer) for name, n in depths for layer in range(n)]
    m = len(owners)
    params.check(m)
    steps: list[PathStep] = []
    prev: int | None = None
    c = 1.0
    for t, on in enumerate(params.indicator):
        if not on:
            continue
        j = t % m
        s = 1.0 if prev is None else params.scale(prev, j)
        c *= s
        name, layer = owners[j]
        steps.append(PathStep(model=name, layer=layer, stacked=j, scale=s, cumulative=c))
        prev = j
    return steps


def compile_dfs(cfg: Any, root: Path | None = None) -> tuple[Any, list[str]]:
    """A ``merge_method: dfs`` MergeConfig as the passthrough MergeConfig that writes it, and warnings.

    Raises InvalidConfigError (one line) for an indicator or W that does not fit the models, scales on a
    family they cannot be folded into, or a DFS config with ``slices:`` or ``parameters:``.
    """
    from aegis.models.architectures.config_keys import rms_norm_eps
    from aegis.forge.merge_config import MergeConfig
    from aegis.forge.merge import _Planner

    if cfg.dfs is None:
        raise InvalidConfigError("merge_method dfs needs a `dfs:` block with indicator (and optional repeats, scales)")
    if cfg.slices:
        raise InvalidConfigError("dfs walks whole models: list them under `models:`, not `slices:`")
    if cfg.parameters or any(m.parameters for m in cfg.models or []):
        raise InvalidConfigError("dfs takes no `parameters:`; put repeats, indicator and scales under `dfs:`")
    planner = _Planner(cfg.model_copy(update={"merge_method": "passthrough", "dfs": None}), root)
    try:
        keys = [planner.locate(m.model, f"models[{i}].model") for i, m in enumerate(cfg.models or [])]
        if len(set(keys)) != len(keys):
            raise InvalidConfigError("dfs: a model is listed twice; list each model once and walk it with repeats")
        for k in keys:
            planner.open(k)
        depths = [(k, planner.depth(k)) for k in keys]
        steps = dfs_path(cfg.dfs, depths)
        model_types = {k: str(planner.weights[k].config.get("model_type")) for k in keys}
        eps = {k: rms_norm_eps(planner.weights[k].config) for k in keys}  # transformers' default when unset
        layer_names = {k: planner.layouts[k].layers for k in keys}
        located = {
            key: str(planner.sources[planner.locate(value, key)].folder)
            for key in ("base_model", "tokenizer_source")
            if (value := getattr(cfg, key)) is not None and value not in ("base", "union")
        }
    finally:
        planner.close()

    warnings: list[str] = []
    scaled = [s for s in steps if s.cumulative != 1.0]
    if scaled:
        bad = next((k for k in keys if model_types[k] not in FOLDABLE_MODEL_TYPES), None)
        if bad is not None:
            raise InvalidConfigError(
                f"dfs: scales other than 1 fold only into pre-norm RMSNorm decoders "
                f"({', '.join(sorted(FOLDABLE_MODEL_TYPES))}); {planner.label[bad]} is {model_types[bad]}: drop `scales:`"
            )
        for s in scaled:
            rests = layer_names[s.model].get(s.layer, [])
            for proj in OUTPUT_PROJECTIONS:
                if f"{proj}.weight" not in rests:
                    raise InvalidConfigError(f"dfs: layer {s.layer} of {planner.label[s.model]} has no {proj}.weight to fold its scale into")
        worst = max(scaled, key=lambda s: abs(s.cumulative**2 - 1))
        nonzero = {k: e for k, e in eps.items() if e}
        if nonzero:
            e = max(float(v) for v in nonzero.values())
            warnings.append(
                f"dfs: input scales folded into o_proj/down_proj; exact for rms_norm_eps=0, here eps={e:g}, and with the "
                f"stream scaled by up to C={worst.cumulative:.4g} a folded norm acts as if eps were eps*C^2"
            )

    slices: list[dict[str, Any]] = []
    for s in steps:
        params = None
        if s.cumulative != 1.0:
            inv = 1.0 / s.cumulative
            params = {"scale": [{"filter": f".{proj}.", "value": inv} for proj in OUTPUT_PROJECTIONS]}
        last = slices[-1] if slices else None
        if (last is not None and last["_key"] == (s.model, s.cumulative)
                and last["sources"][0]["layer_range"][1] == s.layer):
            last["sources"][0]["layer_range"][1] = s.layer + 1
            continue
        src: dict[str, Any] = {"model": s.model, "layer_range": [s.layer, s.layer + 1]}
        if params:
            src["parameters"] = params
        slices.append({"_key": (s.model, s.cumulative), "sources": [src]})
    for sl in slices:
        del sl["_key"]
    data: dict[str, Any] = {"merge_method": "passthrough", "slices": slices}
    for key in ("base_model", "dtype", "out_dtype", "tokenizer_source"):
        if getattr(cfg, key) is not None:
            data[key] = located.get(key, getattr(cfg, key))
    return MergeConfig.model_validate(data), warnings
