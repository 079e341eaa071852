"""GPU lookup: catalog ids, aliases and loose spellings (`3090`, `a100 40gb`, `h100`) → `GPU`.

    gpu = find_gpu("3090")
    gpu.usable_bytes          # memory minus CUDA context / framework reservation
"""

from __future__ import annotations

import difflib
import re
from functools import lru_cache

from aegis import catalog
from aegis.errors import UnknownGPUError
from aegis.schema import GPU

__all__ = ["list_gpus", "find_gpu", "gpu_names"]


def _norm(text: str) -> str:
    text = text.strip().lower()
    text = re.sub(r"^(nvidia|amd|geforce)\s+", "", text)
    text = re.sub(r"\b(nvidia|geforce|gpus?|cards?)\b", " ", text)
    text = re.sub(r"(\d+)\s*g(i?b)?\b", r"\1gb", text)
    return re.sub(r"[\s_]+", "-", text.strip()).replace("--", "-")


def list_gpus() -> list[GPU]:
    """Every catalog GPU, smallest memory first."""
    return sorted(catalog.gpus(), key=lambda g: (g.memory_bytes, g.id))


@lru_cache(maxsize=1)
def _table() -> dict[str, GPU]:
    table: dict[str, GPU] = {}
    for gpu in catalog.gpus():
        for name in (gpu.id, gpu.name, *gpu.aliases):
            table[_norm(name)] = gpu
            table[_norm(name).replace("-", "")] = gpu
    return table


def gpu_names() -> list[str]:
    """All names a GPU can be looked up by (normalised)."""
    return sorted(_table())


def find_gpu(name: str) -> GPU:
    """The catalog GPU for a name or alias; UnknownGPUError with close matches on a miss."""
    if not isinstance(name, str) or not name.strip():
        raise UnknownGPUError("no GPU given: name one like 'rtx-3090' or 'a100-80gb'; `aegis gpus` lists all")
    key = _norm(name)
    table = _table()
    for candidate in (key, key.replace("-", ""), key.removeprefix("rtx-"), "rtx-" + key):
        if candidate in table:
            return table[candidate]
    names = difflib.get_close_matches(key, list(table), n=8, cutoff=0.5)
    close = list(dict.fromkeys(table[n].id for n in names))[:3]
    hint = f"did you mean {', '.join(repr(c) for c in close)}? " if close else ""
    raise UnknownGPUError(f"unknown GPU {name!r}: {hint}`aegis gpus` lists all")
