"""One line for a pydantic `ValidationError`: the field, the value given and what is accepted.

    try:
        PlanRequest(lora_rank=0)
    except ValidationError as err:
        raise InvalidConfigError(validation_line(err, where="run.yaml: ")) from None
    # run.yaml: lora_rank 0 is out of range: accepted 1 or more

Every loader that validates user input with pydantic (plan fields, merge and evomerge YAML, the CLI's last line
of defence) turns the error into this line, so no pydantic report of several lines reaches a user.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable
from typing import Any

__all__ = ["validation_line", "loc_text", "range_text", "check_range"]

_BOUNDS = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}


def loc_text(loc: Iterable[Any]) -> str:
    """``("models", 0, "parameters")`` -> ``models[0].parameters``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def range_text(low: float | None = None, high: float | None = None, *, low_open: bool = False,
               high_open: bool = False) -> str:
    """'from 1 to 4096', '1 or more', 'above 0', 'in (0, 1]'."""
    def num(x: float) -> str:
        return f"{x:,}" if isinstance(x, int) and abs(x) >= 10000 else f"{x:g}"

    if low is not None and high is not None:
        if not low_open and not high_open:
            return f"from {num(low)} to {num(high)}"
        return f"in {'(' if low_open else '['}{num(low)}, {num(high)}{')' if high_open else ']'}"
    if low is not None:
        return f"above {num(low)}" if low_open else f"{num(low)} or more"
    if high is not None:
        return f"below {num(high)}" if high_open else f"{num(high)} or less"
    return "a finite number"


def check_range(name: str, value: Any, low: float | None = None, high: float | None = None, *,
                low_open: bool = False, high_open: bool = False, integer: bool = False) -> str | None:
    """None when ``value`` is a finite number in range, else one line naming ``name``, the value and the range."""
    accepted = range_text(low, high, low_open=low_open, high_open=high_open)
    kind = "a whole number" if integer else "a number"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"{name} {_short(value)} is not {kind}: give {kind} {accepted}"
    if isinstance(value, float) and not math.isfinite(value):
        return f"{name} {value} is not a finite number: give {kind} {accepted}"
    if integer and value != int(value):
        return f"{name} {value:g} is not a whole number: give one {accepted}"
    bad = ((low is not None and (value <= low if low_open else value < low))
           or (high is not None and (value >= high if high_open else value > high)))
    return f"{name} {value:g} is out of range: accepted {accepted}" if bad else None


def _accepted(error: dict[str, Any], model: Any) -> str | None:
    """The accepted range of the field at fault: the field's own constraints when ``model`` is given, else the
    error's context (one bound)."""
    loc = error.get("loc", ())
    field = None
    if model is not None and loc and isinstance(loc[-1], str):
        field = getattr(model, "model_fields", {}).get(loc[-1])
    bounds: dict[str, Any] = {}
    if field is not None:
        for meta in field.metadata:
            for key in _BOUNDS:
                if getattr(meta, key, None) is not None:
                    bounds[key] = getattr(meta, key)
    for key, value in (error.get("ctx") or {}).items():
        if key in _BOUNDS:
            bounds.setdefault(key, value)
    if not bounds:
        return None
    low = bounds.get("ge", bounds.get("gt"))
    high = bounds.get("le", bounds.get("lt"))
    return range_text(low, high, low_open="gt" in bounds, high_open="lt" in bounds)


def validation_line(err: Any, where: str = "", model: Any = None, valid_keys: Iterable[str] | None = None) -> str:
    """One line for a pydantic ValidationError (``err``): ``where`` (e.g. ``'merge.yml: '``) + the field, the value
    and what is accepted. An unknown key (a typo) is reported before the missing key it explains. ``model``: the
    pydantic class validated (for the field's whole range and 'did you mean'); ``valid_keys`` overrides its keys."""
    errors = err.errors()
    if not errors:
        return f"{where}invalid input".strip()
    first = next((e for e in errors if e.get("type") == "extra_forbidden"), errors[0])
    loc = tuple(first.get("loc", ()))
    name = loc_text(loc)
    kind = first.get("type", "")
    if kind == "extra_forbidden":
        key, parent = str(loc[-1]) if loc else "?", loc_text(loc[:-1])
        keys = list(valid_keys) if valid_keys is not None else list(getattr(model, "model_fields", {}) or ())
        close = difflib.get_close_matches(key, keys, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else (f"; valid keys: {', '.join(keys)}" if keys else "")
        return f"{where}unknown key {key!r}{' in ' + parent if parent else ''}{hint}"
    if kind == "missing":
        return f"{where}missing key {name!r}"
    msg = " ".join(str(first.get("msg", "")).removeprefix("Value error, ").split())
    accepted = _accepted(first, model)
    given = f" {_short(first['input'])}" if "input" in first and not isinstance(first["input"], (dict, list)) else ""
    if accepted is not None:
        return f"{where}{name or 'value'}{given} is out of range: accepted {accepted}"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    if kind.startswith("value_error") or kind == "assertion_error" or not given:  # a validator's sentence names it
        return f"{where}{name + ': ' if name else ''}{msg}{more}"
    return f"{where}{name or 'value'}: {msg} (got{given}){more}"
