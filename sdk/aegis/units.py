"""Memory units for display. Aegis computes bytes; people read GiB — the unit PyTorch's OOM
messages and nvidia-smi (MiB) use, and the one that makes a "24 GB" RTX 3090 read 24.0.

    from aegis.units import GIB, gib
    gib(25_769_803_776)   # '24.0 GiB'
"""

from __future__ import annotations

__all__ = ["GIB", "gib"]

GIB = 1 << 30


def gib(nbytes: float, digits: int = 1) -> str:
    """Bytes as GiB text with `digits` decimals."""
    return f"{nbytes / GIB:.{digits}f} GiB"
