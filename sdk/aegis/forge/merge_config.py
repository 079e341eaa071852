"""mergekit's merge YAML as users write it, parsed into frozen models, and its parameter rules.

    cfg = load_merge_config("merge.yml")        # InvalidConfigError: one line naming the key at fault
    cfg.merge_method, cfg.base_model, cfg.models, cfg.slices, cfg.parameters, cfg.dtype

The keys are mergekit's (``mergekit/config.py``): ``merge_method``, ``base_model``, either ``models``
(``model`` + ``parameters``) or ``slices`` (``sources`` with ``layer_range``, optional ``base_model`` and
``parameters`` per slice), global ``parameters``, ``dtype``, ``out_dtype``, ``tokenizer_source``.
Unlike mergekit, an unknown key is an error (with the closest valid key), not silently ignored.

A parameter's value is a scalar, a gradient (a list interpolated over a slice's layers: ``t: [0, 0.5, 1]``)
or a list of ``{filter, value}`` whose first filter that is a substring of the tensor name wins.
:func:`evaluate_setting` and :func:`resolve` reproduce mergekit's ``evaluate_setting`` and
``resolve_parameters``: the most specific place that sets a parameter wins (a slice source, then its
slice, then the global ``parameters``), else the method's default.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from aegis.errors import InvalidConfigError
from aegis.schema import Frozen
from aegis.forge.dfs import DFSParameters

__all__ = [
    "Conditional",
    "InputModel",
    "SliceSource",
    "OutputSlice",
    "MergeConfig",
    "load_merge_config",
    "evaluate_setting",
    "resolve",
]

Scalar = bool | int | float | str
DType = Literal["bfloat16", "float16", "float32", "float64"]
_UNSUPPORTED_KEYS = {
    "modules": "multi-module `modules:` configs are not supported yet; use `models:` or `slices:`",
    "tokenizer": "`tokenizer:` (vocabulary surgery) is not supported yet; use `tokenizer_source: base`, `union` or a model",
    "chat_template": "`chat_template:` is not supported yet; set the template in the tokenizer_source model's tokenizer",
}


class Conditional(Frozen):
    """A parameter value that applies to tensors whose name contains ``filter`` (all tensors when None)."""

    value: Any = Field(description="A scalar or a gradient (tuple of scalars).")
    filter: str | None = Field(default=None, description="Substring of the tensor name; None or '*' matches all.")


def _scalar_or_gradient(v: Any, name: str) -> Any:
    if isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (list, tuple)) and v and all(isinstance(e, (bool, int, float, str)) for e in v):
        return tuple(v)
    raise ValueError(f"{name}: expected a number, a boolean or a list of them (a gradient), got {v!r}")


def _conditional(d: Any, name: str) -> Conditional:
    if isinstance(d, Conditional):
        return d
    unknown = sorted(set(d) - {"filter", "value"})
    if unknown:
        close = difflib.get_close_matches(str(unknown[0]), ["filter", "value"], n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"{name}: unknown key {unknown[0]!r} in a {{filter, value}} entry{hint}")
    if "value" not in d:
        raise ValueError(f"{name}: a {{filter, value}} entry needs a value")
    if d.get("filter") is not None and not isinstance(d["filter"], str):
        raise ValueError(f"{name}: filter must be a substring of tensor names, got {d['filter']!r}")
    return Conditional(value=_scalar_or_gradient(d["value"], name), filter=d.get("filter"))


def _setting(v: Any, name: str) -> Any:
    """Normalise one parameter setting: scalar | tuple of scalars | tuple of Conditional."""
    if isinstance(v, (Mapping, Conditional)):
        return (_conditional(v, name),)
    if isinstance(v, (list, tuple)) and v and all(isinstance(e, (Mapping, Conditional)) for e in v):
        return tuple(_conditional(e, name) for e in v)
    return _scalar_or_gradient(v, name)


def _parameters(v: Any) -> Any:
    if v is None:
        return None
    if not isinstance(v, Mapping):
        raise ValueError(f"`parameters` must be a mapping of name: value, got {v!r}")
    return {str(k): _setting(val, str(k)) for k, val in v.items()}


def _model_ref(v: Any) -> Any:
    if isinstance(v, str) and v.strip():
        return v.strip()
    raise ValueError(f"expected a model folder or Hub id (a string), got {v!r}")


class InputModel(Frozen):
    """An entry of ``models:``: a model and its parameters."""

    model: str = Field(description="Model folder, config.json path or cached Hub id.")
    parameters: dict[str, Any] | None = Field(default=None, description="Parameters of this model (weight, density, ...).")

    @field_validator("model", mode="before")
    @classmethod
    def _model(cls, v: Any) -> Any:
        return _model_ref(v)

    @field_validator("parameters", mode="before")
    @classmethod
    def _params(cls, v: Any) -> Any:
        return _parameters(v)


class SliceSource(Frozen):
    """A source of an output slice: layers ``[start, end)`` of a model."""

    model: str = Field(description="Model folder, config.json path or cached Hub id.")
    layer_range: tuple[int, int] = Field(description="First layer and one past the last, as in Python slices.")
    parameters: dict[str, Any] | None = Field(default=None, description="Parameters of this source.")

    @field_validator("model", mode="before")
    @classmethod
    def _model(cls, v: Any) -> Any:
        return _model_ref(v)

    @field_validator("parameters", mode="before")
    @classmethod
    def _params(cls, v: Any) -> Any:
        return _parameters(v)

    @field_validator("layer_range")
    @classmethod
    def _range(cls, v: tuple[int, int]) -> tuple[int, int]:
        if v[0] < 0 or v[1] <= v[0]:
            raise ValueError(f"layer_range {list(v)} must be [start, end) with 0 <= start < end")
        return v


class OutputSlice(Frozen):
    """An entry of ``slices:``: output layers merged from equally long layer ranges of its sources."""

    sources: list[SliceSource] = Field(min_length=1, description="The models and layer ranges merged into this slice.")
    base_model: str | None = Field(default=None, description="Base model of this slice (default: the global one).")
    residual_weight: float | None = Field(default=None, description="Accepted for mergekit compatibility; unused.")
    parameters: dict[str, Any] | None = Field(default=None, description="Parameters of this slice.")

    @field_validator("base_model", mode="before")
    @classmethod
    def _base(cls, v: Any) -> Any:
        return v if v is None else _model_ref(v)

    @field_validator("parameters", mode="before")
    @classmethod
    def _params(cls, v: Any) -> Any:
        return _parameters(v)


class MergeConfig(Frozen):
    """A mergekit merge configuration."""

    merge_method: str = Field(
        description="linear, slerp, task_arithmetic, ties, dare_ties, dare_linear, passthrough or dfs (aegis.forge.dfs)."
    )
    base_model: str | None = Field(default=None, description="The base model (required by slerp and the task-vector methods).")
    models: list[InputModel] | None = Field(default=None, description="Whole models to merge (or use `slices`).")
    slices: list[OutputSlice] | None = Field(default=None, description="Output layer slices, in order (or use `models`).")
    parameters: dict[str, Any] | None = Field(default=None, description="Global parameters (t, normalize, lambda, ...).")
    dtype: DType | None = Field(default=None, description="dtype the inputs are read in (and the output stored in).")
    out_dtype: DType | None = Field(default=None, description="dtype the output is stored in (default: dtype).")
    tokenizer_source: str | None = Field(
        default=None, description="'base', 'union' or a model: the output's tokenizer, embedding and head rows remapped by token "
        "as mergekit does (unset: the base's, else the first model's, rows merged by index)."
    )
    dfs: DFSParameters | None = Field(
        default=None, description="merge_method dfs: layer path (repeats, indicator) and scaling (aegis.forge.dfs)."
    )

    @field_validator("base_model", "tokenizer_source", mode="before")
    @classmethod
    def _base(cls, v: Any) -> Any:
        return v if v is None else _model_ref(v)

    @field_validator("parameters", mode="before")
    @classmethod
    def _params(cls, v: Any) -> Any:
        return _parameters(v)

    @field_validator("dtype", "out_dtype", mode="before")
    @classmethod
    def _dtype(cls, v: Any) -> Any:
        return v[len("torch."):] if isinstance(v, str) and v.startswith("torch.") else v

    @field_validator("merge_method")
    @classmethod
    def _method(cls, v: str) -> str:
        from aegis.forge._methods import get_method

        if v != "dfs":  # dfs (aegis.forge.dfs) is not a mergekit method: it compiles to a passthrough
            get_method(v)
        return v

    @model_validator(mode="before")
    @classmethod
    def _unsupported(cls, data: Any) -> Any:
        if isinstance(data, Mapping):
            for key, why in _UNSUPPORTED_KEYS.items():
                if key in data:
                    raise ValueError(f"{key}: {why}")
        return data

    @model_validator(mode="after")
    def _one_of(self) -> MergeConfig:
        if bool(self.models) == bool(self.slices):
            raise ValueError("give exactly one of `models:` and `slices:` (a non-empty list)")
        if (self.dfs is None) != (self.merge_method != "dfs"):
            raise ValueError("a `dfs:` block goes with merge_method: dfs (and dfs needs one)")
        return self

    @model_validator(mode="after")
    def _parameter_ranges(self) -> MergeConfig:
        _check_parameters(self.parameters, "parameters")
        for i, m in enumerate(self.models or []):
            _check_parameters(m.parameters, f"models[{i}].parameters")
        for i, sl in enumerate(self.slices or []):
            _check_parameters(sl.parameters, f"slices[{i}].parameters")
            for j, src in enumerate(sl.sources):
                _check_parameters(src.parameters, f"slices[{i}].sources[{j}].parameters")
        return self

    def referenced_models(self) -> list[str]:
        """Every model the YAML names, in order of first mention (base first)."""
        names = [self.base_model] if self.base_model else []
        for m in self.models or []:
            names.append(m.model)
        for s in self.slices or []:
            names.extend(src.model for src in s.sources)
            if s.base_model:
                names.append(s.base_model)
        if self.tokenizer_source and self.tokenizer_source not in ("base", "union"):
            names.append(self.tokenizer_source)
        return list(dict.fromkeys(names))


# ----- loading and one-line errors --------------------------------------------------------------------


def _loc(loc: Iterable[Any]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _fields_at(loc: tuple[Any, ...]) -> list[str]:
    """Valid keys of the model found at ``loc`` (for 'did you mean')."""
    model: Any = MergeConfig
    for part in loc:
        if isinstance(part, int):
            continue
        nxt = {"models": InputModel, "slices": OutputSlice, "sources": SliceSource, "dfs": DFSParameters}.get(str(part))
        if nxt is None:
            break
        model = nxt
    return list(model.model_fields)


def _one_line(err: ValidationError, where: str) -> InvalidConfigError:
    """One line naming the key at fault, the value and the accepted range (`aegis._validation.validation_line`)."""
    from aegis._validation import validation_line

    errors = err.errors()
    first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])  # a typo explains a 'missing'
    loc = tuple(first["loc"])
    model: Any = MergeConfig
    for part in loc[:-1]:  # the model whose field is at fault: its keys and the field's range
        model = {"models": InputModel, "slices": OutputSlice, "sources": SliceSource, "dfs": DFSParameters}.get(
            str(part), model)
    return InvalidConfigError(validation_line(err, where=where, model=model, valid_keys=_fields_at(loc[:-1])))


# ----- parameter ranges -------------------------------------------------------------------------------

_RANGES: dict[str, tuple[float | None, float | None, bool, bool, str]] = {
    "t": (0.0, 1.0, False, False, "slerp's position from the base model (0) to the other (1)"),
    "density": (0.0, 1.0, True, False, "the fraction of each task vector kept"),
    "weight": (None, None, False, False, "a model's weight"),
    "lambda": (None, None, False, False, "the scale of the summed task vectors"),
    "scale": (None, None, False, False, "a passthrough input's scale"),
    "epsilon": (0.0, 1.0, False, True, "the spread of the keep probabilities"),
    "gamma": (0.0, 1.0, False, False, "the fraction of largest entries removed"),
}
"""Accepted values of the numeric merge parameters (mergekit reads them unchecked: a slerp at t = 7.5 extrapolates
far past both models and a density of 0 keeps nothing). Other numeric parameters need only be finite."""
_FLAGS = frozenset({"normalize", "rescale", "int8_mask"})


def _check_value(name: str, value: Any, where: str) -> None:
    from aegis._validation import check_range

    if name in _FLAGS:
        if not isinstance(value, bool):
            raise ValueError(f"{where}: {name} {value!r} is not a boolean: write true or false")
        return
    number = value
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            if name in _RANGES:
                raise ValueError(f"{where}: {name} {value!r} is not a number ({_RANGES[name][4]})") from None
            return  # a string parameter of a method aegis does not run is left to it
    elif isinstance(value, bool):
        if name in _RANGES:
            raise ValueError(f"{where}: {name} {value!r} is not a number ({_RANGES[name][4]})")
        return
    low, high, low_open, high_open, what = _RANGES.get(name, (None, None, False, False, "a merge parameter"))
    problem = check_range(name, number, low, high, low_open=low_open, high_open=high_open)
    if problem is not None:
        raise ValueError(f"{where}: {problem} ({what})")


def _check_parameters(params: Mapping[str, Any] | None, where: str) -> None:
    """Every value of a `parameters:` block (scalars, gradients, {filter, value} entries) in its accepted range."""
    for name, setting in (params or {}).items():
        at = f"{where}.{name}"
        entries = setting if isinstance(setting, tuple) and setting and isinstance(setting[0], Conditional) else (setting,)
        for entry in entries:
            value = entry.value if isinstance(entry, Conditional) else entry
            for v in value if isinstance(value, tuple) else (value,):
                _check_value(name, v, at)


MAX_CONFIG_BYTES = 16 * 2**20
"""A merge or evomerge YAML is a few kilobytes; a larger file (or /dev/zero) is not one and is not read."""


def _check_config_file(path: Path, what: str) -> None:
    """A regular file of at most MAX_CONFIG_BYTES: /dev/zero, a FIFO or a 5 GB file are refused before reading."""
    if path.exists() and not path.is_file():
        kind = "a folder" if path.is_dir() else "not a regular file"
        raise InvalidConfigError(f"{what} {path} is {kind}: pass the YAML file")
    if path.is_file() and path.stat().st_size > MAX_CONFIG_BYTES:
        raise InvalidConfigError(f"{what} {path} is {path.stat().st_size:,} bytes: a YAML config is at most "
                                 f"{MAX_CONFIG_BYTES // 2**20} MiB; pass the YAML file")


def load_merge_config(source: str | Path | Mapping[str, Any]) -> MergeConfig:
    """Parse a merge YAML file (a path), YAML text, or an already-loaded mapping."""
    import yaml

    where = ""
    if isinstance(source, Mapping):
        data: Any = source
    else:
        text = str(source)
        path = Path(source) if isinstance(source, Path) or "\n" not in text else None
        if path is not None and (isinstance(source, Path) or path.suffix in (".yml", ".yaml") or path.exists()):
            try:
                _check_config_file(path, "merge config")
                text = path.read_text(encoding="utf-8")
            except OSError as err:
                raise InvalidConfigError(f"cannot read merge config {path} ({err.strerror or err}); check the path") from err
            except UnicodeDecodeError as err:
                raise InvalidConfigError(f"merge config {path} is not a text file (not UTF-8 at byte {err.start}): "
                                         "pass the mergekit YAML") from None
            where = f"{path.name}: "
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            at = f" at line {mark.line + 1}" if mark is not None else ""
            raise InvalidConfigError(f"{where}not valid YAML{at} ({getattr(err, 'problem', None) or err})") from err
    if not isinstance(data, Mapping):
        raise InvalidConfigError(f"{where}a merge config is a YAML mapping with merge_method and models or slices")
    try:
        return MergeConfig.model_validate(data)
    except ValidationError as err:
        raise _one_line(err, where) from None
    except InvalidConfigError as err:
        raise InvalidConfigError(f"{where}{err}") from None


# ----- parameter values (mergekit's evaluate_setting / resolve_parameters) -----------------------------


def evaluate_setting(tensor_name: str, setting: Any, t: float, validate: Callable[[Any], Any]) -> Any:
    """The value of ``setting`` for ``tensor_name`` at relative depth ``t`` in its slice (0..1), or None
    when no filter matches. Numeric gradients interpolate linearly; boolean or string lists pick an entry."""
    if isinstance(setting, (bool, int, float, str)):
        return validate(setting)
    if not setting:
        return None
    if isinstance(setting[0], Conditional):
        for cond in setting:
            if cond.filter is None or cond.filter == "*" or (tensor_name and cond.filter in tensor_name):
                return evaluate_setting(tensor_name, cond.value, t, validate)
        return None
    values = [validate(e) for e in setting]
    if not all(isinstance(e, (int, float)) and not isinstance(e, bool) for e in values):
        return values[int(t * (len(values) - 1))]
    scaled = t * (len(setting) - 1)
    i0 = int(scaled)
    i1 = min(len(setting) - 1, i0 + 1)
    frac = scaled - i0
    return validate((1 - frac) * values[i0] + frac * values[i1])


def resolve(
    name: str,
    scopes: Iterable[Mapping[str, Any] | None],
    *,
    tensor_name: str,
    t: float,
    default: Any,
    required: bool,
    validate: Callable[[Any], Any],
    who: str,
) -> Any:
    """The value of parameter ``name``: the first scope that sets it (and whose filters match) wins."""
    for scope in scopes:
        if scope is not None and name in scope:
            try:
                value = evaluate_setting(tensor_name, scope[name], t, validate)
            except ValidationError as err:
                msg = err.errors()[0]["msg"]
                raise InvalidConfigError(f"parameter {name!r} for {who}: {msg} ({scope[name]!r})") from None
            if value is not None:
                return value
    if required:
        raise InvalidConfigError(
            f"missing parameter {name!r} for {who}; set it under the model's or the global `parameters:`"
        )
    return default
