"""GPU lookup: catalog ids, aliases and loose spellings (`3090`, `a100 40gb`, `h100`) → `GPU`.

    gpu = find_gpu("3090")
    gpu.usable_bytes          # memory minus CUDA context / framework reservation
"""

from __future__ import annotations

import re
from functools import lru_cache

from aegis.models import catalog
from aegis.errors import UnknownGPUError
from aegis.schema import GPU

__all__ = ["list_gpus", "find_gpu", "gpu_names", "cudnn_flash_attention"]


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
    import difflib  # suggestions only: a GPU that resolves never needs it

    names = difflib.get_close_matches(key, list(table), n=8, cutoff=0.5)
    close = list(dict.fromkeys(table[n].id for n in names))[:3]
    hint = f"did you mean {', '.join(repr(c) for c in close)}? " if close else ""
    raise UnknownGPUError(f"unknown GPU {name!r}: {hint}`aegis gpus` lists all")


def cudnn_flash_attention(
    compute_capability: str | None, *, head_dim: int, soft_capped: bool, half_precision: bool
) -> bool:
    """Whether cuDNN flash attention (``jax.nn.dot_product_attention(implementation="cudnn")``) runs an
    attention on an NVIDIA GPU of ``compute_capability``: Ampere (8.0) or later, bf16/fp16 compute, no
    soft-capped attention logits, and a head dim that is a multiple of 8, at most 256 from Hopper (9.0)
    on and 128 before (jax's ``check_is_flash_attention``)."""
    try:
        major = int(str(compute_capability).split(".")[0])
    except ValueError:
        return False
    if major < 8 or not half_precision or soft_capped or head_dim % 8:
        return False
    return head_dim <= (256 if major >= 9 else 128)
