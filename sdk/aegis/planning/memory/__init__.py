"""The memory engine: `estimate_memory` predicts a training step's peak, component by component
(``framework="hf"``: HF Trainer on PyTorch; ``"jax"``: Aegis' JAX engine as XLA compiles it).

`estimate_jax` (`aegis.planning.memory.jax_profile`) loads on first use: a plan never needs it."""

from typing import TYPE_CHECKING, Any

from aegis.planning.memory.estimate import estimate, estimate_memory

if TYPE_CHECKING:
    from aegis.planning.memory.jax_profile import estimate_jax

__all__ = ["estimate", "estimate_memory", "estimate_jax"]


def __getattr__(name: str) -> Any:
    if name == "estimate_jax":
        from aegis.planning.memory.jax_profile import estimate_jax

        globals()[name] = estimate_jax
        return estimate_jax
    raise AttributeError(f"module 'aegis.planning.memory' has no attribute {name!r}")
