"""Phase 1's batch size read at run time: the largest batch whose compiled training step fits the device.

    budget, source = memory_budget(host_gib=8.0, headroom=0.1)
    choice = fit_batch(step, args_for, cap=16, budget_bytes=budget, budget_source=source)
    choice.batch_size, choice.compiled            # the chosen batch and its compiled step (the loop reuses it)

Cognate is not a planner family, so its step's memory is not modelled from shapes: it is measured. The jitted
training step is lowered and compiled at the run's sequence length for candidate batches (powers of two up to the
cap, by bisection: ``log2(cap) + 1`` candidates, about ``log2(log2(cap))`` + 2 compiles) and XLA's
``compiled.memory_analysis()`` gives the step's device bytes: arguments + outputs - aliased (donated) + temporaries,
the quantity the planner's JAX profile predicts for registry families (`aegis.planning.memory.jax_profile`). The
budget is the device's ``memory_stats()["bytes_limit"]`` (GPU/TPU) or, where the backend reports none (the CPU), a
stated host budget; a headroom fraction is kept free of both. Nothing is allocated: arguments are shapes. The cost
is the compiles (seconds each for the default 25M model); the chosen batch's executable is returned for reuse.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aegis.errors import InvalidConfigError

__all__ = ["BatchChoice", "compiled_step_bytes", "fit_batch", "memory_budget"]


@dataclass(frozen=True)
class BatchChoice:
    batch_size: int
    budget_bytes: int
    budget_source: str
    candidates: dict[int, int] = field(default_factory=dict)
    """Every compiled candidate batch -> its step's bytes (XLA memory analysis)."""
    compiled: Any = None

    def summary(self) -> str:
        b = self.candidates[self.batch_size] / 1e9
        return (f"batch {self.batch_size}: step {b:.3g} GB of {self.budget_bytes / 1e9:.3g} GB budget "
                f"(XLA memory analysis; {self.budget_source})")

    def to_json(self) -> dict[str, Any]:
        return {"batch_size": self.batch_size, "chosen_by": "auto", "budget_bytes": self.budget_bytes,
                "budget_source": self.budget_source,
                "step_bytes": {str(k): v for k, v in sorted(self.candidates.items())}, "summary": self.summary()}


def compiled_step_bytes(compiled: Any) -> int:
    """A compiled executable's device bytes: arguments + outputs - aliased + temporaries."""
    ma = compiled.memory_analysis()
    return int(ma.argument_size_in_bytes + ma.output_size_in_bytes - ma.alias_size_in_bytes
               + ma.temp_size_in_bytes)


def memory_budget(*, host_gib: float, headroom: float) -> tuple[int, str]:
    """(bytes the step may use, where the limit came from): the first device's ``bytes_limit``, else ``host_gib``;
    times ``1 - headroom``."""
    import jax

    dev = jax.devices()[0]
    stats = None
    try:
        stats = dev.memory_stats()
    except Exception:  # noqa: BLE001 - backends without memory stats raise or return None
        stats = None
    if stats and stats.get("bytes_limit"):
        limit, src = int(stats["bytes_limit"]), f"{dev.device_kind} bytes_limit"
    else:
        limit, src = int(host_gib * 2**30), f"host budget {host_gib:g} GiB"
    return int(limit * (1 - headroom)), f"{src}, {headroom:.0%} headroom"


def fit_batch(step: Any, args_for: Callable[[int], tuple[Any, ...]], *, cap: int, budget_bytes: int,
              budget_source: str = "budget") -> BatchChoice:
    """The largest power-of-two batch <= ``cap`` whose ``step.lower(*args_for(batch)).compile()`` fits
    ``budget_bytes`` (bisection over the powers of two; step bytes grow with the batch). Raises
    :class:`InvalidConfigError` when batch 1 does not fit."""
    powers = [2**i for i in range(cap.bit_length()) if 2**i <= cap]
    seen: dict[int, int] = {}
    execs: dict[int, Any] = {}

    def fits(i: int) -> bool:
        b = powers[i]
        compiled = step.lower(*args_for(b)).compile()
        seen[b] = compiled_step_bytes(compiled)
        if seen[b] <= budget_bytes:
            execs.clear()  # keep only the best fitting executable
            execs[b] = compiled
            return True
        return False

    lo, hi = -1, len(powers)  # powers[lo] fits (or none), powers[hi] does not (or past the cap)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    if lo < 0:
        raise InvalidConfigError(f"one sequence's training step needs {seen[1] / 1e9:.3g} GB, over the "
                                 f"{budget_bytes / 1e9:.3g} GB budget ({budget_source}); lower train.seq_len or the "
                                 "model size, or raise train.host_memory_gib on a CPU")
    best = powers[lo]
    return BatchChoice(best, budget_bytes, budget_source, dict(sorted(seen.items())), execs.get(best))
