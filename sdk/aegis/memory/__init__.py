"""The memory engine: `estimate_memory` predicts a training step's peak, component by component."""

from aegis.memory.estimate import estimate, estimate_memory

__all__ = ["estimate", "estimate_memory"]
