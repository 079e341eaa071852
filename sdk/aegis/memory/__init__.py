"""The memory engine: `estimate_memory` predicts a training step's peak, component by component
(``framework="hf"``: HF Trainer on PyTorch; ``"jax"``: Aegis' JAX engine as XLA compiles it)."""

from aegis.memory.estimate import estimate, estimate_memory
from aegis.memory.jax_profile import estimate_jax

__all__ = ["estimate", "estimate_memory", "estimate_jax"]
