"""Tensor I/O for merges: lazy reads of input models, streamed writes of the merged shards.

    weights = ModelWeights("a", locate_model("./a"))   # tensor index from the headers, nothing read yet
    weights.dtype("model.norm.weight"), weights.shape(...), weights.read(...)   # one tensor at a time
    with ShardWriter(out, [(name, "F32", shape), ...], max_shard_bytes) as w:
        w.write(name, array)        # in the planned order; memory: the tensor being written

Reads go through ``safetensors.safe_open`` (memory-mapped, one tensor at a time). Because every output
tensor's dtype and shape are known before any is computed, each shard's header is written first and
tensors are streamed after it, so a merge holds a few tensors in memory, never a model or a shard.
Shards follow transformers' names (``model.safetensors``, or ``model-00001-of-00003.safetensors`` +
``model.safetensors.index.json``).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from aegis.errors import InvalidConfigError
from aegis.model_source import INDEX_FILE, ModelSource

__all__ = ["DTYPES", "DTYPE_NAMES", "ModelWeights", "ShardWriter", "plan_shards"]

DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype(np.float64),
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "I64": np.dtype(np.int64),
    "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16),
    "I8": np.dtype(np.int8),
    "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_),
}
"""safetensors dtype codes and their numpy dtypes."""
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
FLOATING = frozenset({"F64", "F32", "F16", "BF16"})
SINGLE_FILE = "model.safetensors"


class ModelWeights:
    """The tensors of one input model, read lazily by name."""

    def __init__(self, label: str, source: ModelSource):
        from safetensors import safe_open

        self.label = label
        self.source = source
        self.config: dict[str, Any] = source.config()
        self._files: dict[str, Any] = {}
        self._where: dict[str, str] = {}
        for name in source.weight_files:
            try:
                handle = safe_open(str(source.folder / name), framework="numpy")
            except Exception as err:  # safetensors raises its own SafetensorError for corrupt files
                raise InvalidConfigError(f"{label}: cannot read {source.folder / name} ({err}); re-download it") from err
            self._files[name] = handle
            for key in handle.keys():
                self._where.setdefault(key, name)

    @property
    def names(self) -> list[str]:
        """Tensor names, in the order the shards list them."""
        return list(self._where)

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def _slice(self, name: str) -> Any:
        return self._files[self._where[name]].get_slice(name)

    def dtype(self, name: str) -> str:
        """safetensors dtype code of ``name`` ('F32', 'BF16', ...)."""
        return str(self._slice(name).get_dtype())

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(int(d) for d in self._slice(name).get_shape())

    def read(self, name: str) -> np.ndarray:
        return self._files[self._where[name]].get_tensor(name)

    def close(self) -> None:
        self._files.clear()


def plan_shards(entries: list[tuple[str, str, tuple[int, ...]]], max_shard_bytes: int) -> list[list[int]]:
    """Group entries (name, dtype code, shape) into shards of at most ``max_shard_bytes`` (a bigger tensor
    gets a shard of its own), keeping their order."""
    shards: list[list[int]] = []
    size = 0
    for i, (_, code, shape) in enumerate(entries):
        nbytes = DTYPES[code].itemsize * int(np.prod(shape, dtype=np.int64))
        if not shards or (shards[-1] and size + nbytes > max_shard_bytes):
            shards.append([])
            size = 0
        shards[-1].append(i)
        size += nbytes
    return shards


class ShardWriter:
    """Streams tensors, in a fixed order, into safetensors shards whose headers are written up front."""

    def __init__(self, folder: Path, entries: list[tuple[str, str, tuple[int, ...]]], max_shard_bytes: int):
        self.folder = Path(folder)
        self.entries = entries
        self.shards = plan_shards(entries, max_shard_bytes)
        n = len(self.shards)
        self.files = [SINGLE_FILE] if n == 1 else [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
        self._order = [i for shard in self.shards for i in shard]
        self._shard_of = {i: s for s, members in enumerate(self.shards) for i in members}
        self._next = 0
        self._shard = -1
        self._fh: Any = None
        self._remaining = 0
        self.total_bytes = 0

    def __enter__(self) -> ShardWriter:
        self.folder.mkdir(parents=True, exist_ok=True)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def _open(self, shard: int) -> None:
        if self._fh is not None:
            self._fh.close()
        header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
        offset = 0
        for i in self.shards[shard]:
            name, code, shape = self.entries[i]
            nbytes = DTYPES[code].itemsize * int(np.prod(shape, dtype=np.int64))
            header[name] = {"dtype": code, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
            offset += nbytes
        blob = json.dumps(header, separators=(",", ":")).encode()
        blob += b" " * (-len(blob) % 8)
        self._fh = open(self.folder / self.files[shard], "wb")
        self._fh.write(struct.pack("<Q", len(blob)))
        self._fh.write(blob)
        self._shard = shard

    def write(self, name: str, array: np.ndarray) -> None:
        """Write the next planned tensor (``name`` must be it, with the planned dtype and shape)."""
        i = self._order[self._next]
        want, code, shape = self.entries[i]
        if name != want or tuple(array.shape) != tuple(shape) or DTYPE_NAMES.get(array.dtype) != code:
            raise RuntimeError(f"writer expected {want} {code}{list(shape)}, got {name} {array.dtype}{list(array.shape)}")
        if self._shard_of[i] != self._shard:
            self._open(self._shard_of[i])
        data = np.ascontiguousarray(array)
        self._fh.write(data.view(np.uint8).reshape(-1).data if data.size else b"")
        self.total_bytes += data.nbytes
        self._next += 1

    def finish(self) -> list[str]:
        """Close the last shard and write the index when there are several; returns the shard file names."""
        if self._next != len(self._order):
            raise RuntimeError(f"writer finished after {self._next} of {len(self._order)} tensors")
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        if len(self.files) > 1:
            weight_map = {self.entries[i][0]: self.files[s] for s, members in enumerate(self.shards) for i in members}
            index = {"metadata": {"total_size": self.total_bytes}, "weight_map": weight_map}
            (self.folder / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
        return list(self.files)
