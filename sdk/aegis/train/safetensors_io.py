"""Safetensors files, the one layer that reads and writes them: the dtype table, the file names, readers, writers.

    DTYPES["BF16"], code_of("bfloat16"), code_of(jnp.bfloat16), numpy_dtype("bfloat16")   # codes <-> dtypes
    reader = CheckpointReader("ckpt/")          # folder (single file or index + shards) or one file; lazy
    reader.get(name), reader.read_into(name, out)   # memory-mapped view / one ``readinto`` into ``out``
    reader.read_slice(name, (slice(0, 8), slice(None)), out)   # only those bytes (a device's shard)
    weights = ModelWeights("a", locate_model("./a"))   # forge's reader: ``safetensors.safe_open``, by name
    write_file(path, {name: array}, metadata)   # one file, tensors in name order
    write_shards(folder, {name: array}, max_shard_bytes)   # model.safetensors, or shards + index
    with ShardWriter(out, [(name, "F32", shape), ...], max_shard_bytes) as w:
        w.write(name, array)                    # streamed, in the planned order: headers are written up front

Files follow transformers' layout (``model.safetensors``, or ``model-00001-of-00003.safetensors`` +
``model.safetensors.index.json``). Every write goes through :class:`ShardWriter`, which knows each tensor's
dtype and shape before its data, so a merge holds a few tensors in memory, never a shard (``safetensors``'
``save_file`` needs every tensor at once and orders data by dtype alignment). Reads of input models go through
``safetensors.safe_open`` (:class:`ModelWeights`); the engine's loader reads the header itself and copies each
tensor with one ``readinto`` straight into the parameter buffer (:meth:`CheckpointReader.read_into`).
"""

from __future__ import annotations

import itertools
import json
import math
import struct
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aegis.errors import CheckpointError, InvalidConfigError
from aegis.models.source import INDEX_FILE, ModelSource

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "DTYPES", "DTYPE_CODES", "FLOATING", "SINGLE_FILE", "INDEX_FILE", "ADAPTER_FILE", "MAX_SHARD_BYTES",
    "code_of", "numpy_dtype", "read_header", "CheckpointReader", "ModelWeights", "plan_shards", "shard_names",
    "ShardWriter", "write_file", "write_shards",
]



@cache
def _dtypes() -> dict[str, np.dtype]:
    import ml_dtypes
    import numpy as np

    return {
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


@cache
def _codes() -> dict[np.dtype, str]:
    return {v: k for k, v in _dtypes().items()}


def __getattr__(name: str) -> Any:
    """``DTYPES`` (safetensors code -> numpy dtype; ``BF16``: ml_dtypes' bfloat16, which is also JAX's) and
    ``DTYPE_CODES`` (its inverse), built on first use: importing this module imports neither numpy nor safetensors."""
    if name == "DTYPES":
        return _dtypes()
    if name == "DTYPE_CODES":
        return _codes()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


FLOATING = frozenset({"F64", "F32", "F16", "BF16"})
"""The floating codes: the engine loads only these (quantised or integer checkpoints are refused)."""

SINGLE_FILE = "model.safetensors"
ADAPTER_FILE = "adapter_model.safetensors"
_PAGE_BYTES = 4096
_CHUNK_BYTES = 8 * 2**20
MAX_SHARD_BYTES = 5 * 2**30
"""Largest shard written by default (transformers' default ``max_shard_size`` is 5 GB)."""


def numpy_dtype(dtype: Any) -> np.dtype:
    """The numpy dtype of a name ('bfloat16'), a numpy, ml_dtypes or JAX dtype, or a safetensors code ('BF16')."""
    import numpy as np

    table = _dtypes()  # imports ml_dtypes, so 'bfloat16' and jnp.bfloat16 resolve
    if isinstance(dtype, str) and dtype in table:
        return table[dtype]
    return np.dtype(dtype)


def code_of(dtype: Any) -> str:
    """The safetensors code ('F32', 'BF16', ...) of a dtype or dtype name; KeyError for one safetensors lacks."""
    return _codes()[numpy_dtype(dtype)]


# ----- reading -------------------------------------------------------------------------------------------


def read_header(path: Path) -> tuple[dict[str, Any], int]:
    """The JSON header of a safetensors file and the byte offset where tensor data starts."""
    try:
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) != 8:
                raise CheckpointError(f"{path} is not a safetensors file (shorter than 8 bytes); re-download it.")
            (n,) = struct.unpack("<Q", raw)
            header = json.loads(f.read(n))
    except FileNotFoundError as err:
        raise CheckpointError(f"checkpoint file {path} does not exist; check the path.") from err
    except (json.JSONDecodeError, UnicodeDecodeError, MemoryError, OverflowError) as err:
        raise CheckpointError(f"{path} has a corrupt safetensors header; re-download it.") from err
    return header, 8 + n


def _floating(code: str) -> np.dtype | None:
    return _dtypes()[code] if code in FLOATING else None


class CheckpointReader:
    """Lazy access to the tensors of a checkpoint folder or file, by name (the engine's loader)."""

    def __init__(self, path: str | Path):
        path = Path(path)
        self.root = path if path.is_dir() else path.parent
        if path.is_dir():
            if (path / INDEX_FILE).exists():
                files = self._from_index(path / INDEX_FILE)
            elif (path / SINGLE_FILE).exists():
                files = [path / SINGLE_FILE]
            else:
                singles = sorted(path.glob("*.safetensors"))
                if not singles:
                    raise CheckpointError(
                        f"{path} holds no {SINGLE_FILE} or {INDEX_FILE}; point at a Hugging Face checkpoint folder."
                    )
                files = singles
        elif path.name.endswith(".index.json"):
            files = self._from_index(path)
        elif path.exists():
            files = [path]
        else:
            raise CheckpointError(f"checkpoint {path} does not exist; check the path.")
        self._where: dict[str, tuple[Path, dict[str, Any], int]] = {}
        for f in files:
            header, start = read_header(f)
            for name, info in header.items():
                if name != "__metadata__":
                    self._where[name] = (f, info, start)
        self._maps: dict[Path, np.memmap] = {}

    def _from_index(self, index: Path) -> list[Path]:
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as err:
            raise CheckpointError(f"{index} is not a valid safetensors index (no weight_map); re-download it.") from err
        files = []
        for shard in sorted(set(weight_map.values())):
            f = index.parent / shard
            if not f.exists():
                raise CheckpointError(
                    f"shard {shard!r} listed in {index.name} is missing from {index.parent}; download it."
                )
            files.append(f)
        return files

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def unprefixed(self, name: str, prefix: str) -> str:
        """``name``, or ``name`` without its leading ``prefix.`` where only that is stored (transformers reads a
        base model's checkpoint into the LM: GPT-2's Hub files name ``h.0.*`` for ``transformer.h.0.*``)."""
        short = name[len(prefix) + 1:] if name.startswith(prefix + ".") else name
        return short if name not in self._where and short in self._where else name

    def read_into(self, name: str, out: np.ndarray) -> None:
        """Copy tensor ``name`` into ``out`` (same shape): one ``readinto`` from the file when ``out`` has the
        stored dtype and is contiguous (no page faults through a memory map, no temporary), else a cast."""
        f, info, start = self._where[name]
        stored = _floating(info["dtype"])
        if stored is not None and out.dtype == stored and out.flags.c_contiguous:
            import numpy as np

            begin, end = info["data_offsets"]
            with open(f, "rb", buffering=0) as fh:
                fh.seek(start + begin)
                view = memoryview(out.reshape(-1).view(np.uint8))
                done = 0
                while done < end - begin:
                    n = fh.readinto(view[done:])
                    if not n:
                        raise CheckpointError(f"{f} ends inside tensor {name!r}; re-download it.")
                    done += n
            return
        out[...] = self.get(name)

    def read_slice(self, name: str, index: tuple[slice, ...], out: np.ndarray) -> None:
        """Copy ``tensor[index]`` (``index``: one step-1 slice per axis, as a sharding's device indices are) into
        ``out``, reading only the file's bytes of those rows: one ``readinto`` per contiguous run (a row range is one
        run, a column range one per row); runs shorter than a page (the disk reads whole pages anyway) come from
        whole rows read in chunks of at most 8 MiB. Cast into ``out``'s dtype through a buffer of the slice's size."""
        import numpy as np

        f, info, start = self._where[name]
        stored = _floating(info["dtype"])
        shape = tuple(int(d) for d in info["shape"])
        if stored is None or not shape:  # get() refuses an unsupported dtype; a scalar is one read
            out[...] = self.get(name)[index]
            return
        bounds = [s.indices(n) for s, n in zip(index, shape, strict=True)]
        if any(step != 1 for _, _, step in bounds):
            raise ValueError(f"read_slice takes step-1 slices, got {index}")
        if tuple(b - a for a, b, _ in bounds) != tuple(out.shape):
            raise ValueError(f"slice {index} of {name!r} {list(shape)} does not fit an output of shape {out.shape}")
        buf = out if out.dtype == stored and out.flags.c_contiguous else np.empty(out.shape, stored)
        if buf.size:
            k = len(shape) - 1  # the runs: axes after k are whole, so each run spans axis k's range
            while k > 0 and bounds[k][:2] == (0, shape[k]):
                k -= 1
            strides = [math.prod(shape[d + 1 :]) for d in range(len(shape))]
            width, base = stored.itemsize, start + info["data_offsets"][0]
            lo, hi = bounds[k][:2]
            with open(f, "rb", buffering=0) as fh:

                def read_at(element: int, into: np.ndarray) -> None:
                    fh.seek(base + element * width)
                    view, done = memoryview(into.reshape(-1).view(np.uint8)), 0
                    while done < into.nbytes:
                        got = fh.readinto(view[done:])
                        if not got:
                            raise CheckpointError(f"{f} ends inside tensor {name!r}; re-download it.")
                        done += got

                if k > 0 and (hi - lo) * strides[k] * width < _PAGE_BYTES:  # whole rows of axis k - 1, in chunks
                    r_lo, r_hi = bounds[k - 1][:2]
                    rows = buf.reshape(-1, r_hi - r_lo, hi - lo, strides[k])
                    per = max(1, _CHUNK_BYTES // (strides[k - 1] * width))
                    outer = itertools.product(*(range(a, b) for a, b, _ in bounds[: k - 1]))
                    for n, ids in enumerate(outer):
                        first = sum(i * s for i, s in zip(ids, strides, strict=False))
                        for r in range(r_lo, r_hi, per):
                            chunk = np.empty((min(per, r_hi - r), shape[k], strides[k]), stored)
                            read_at(first + r * strides[k - 1], chunk)
                            rows[n, r - r_lo : r - r_lo + len(chunk)] = chunk[:, lo:hi]
                else:
                    runs = buf.reshape(-1, (hi - lo) * strides[k])
                    outer = itertools.product(*(range(a, b) for a, b, _ in bounds[:k]))
                    for n, ids in enumerate(outer):
                        read_at(sum(i * s for i, s in zip(ids, strides, strict=False)) + lo * strides[k], runs[n])
        if buf is not out:
            out[...] = buf

    def dtype_name(self, name: str) -> str:
        """The safetensors dtype tag of tensor ``name`` ('F32', 'BF16', ...)."""
        return str(self._where[name][1]["dtype"])

    def nbytes(self, name: str) -> int:
        begin, end = self._where[name][1]["data_offsets"]
        return int(end - begin)

    def total_bytes(self) -> int:
        """Bytes of tensor data in every file (for progress bars)."""
        return sum(self.nbytes(n) for n in self._where)

    def names(self) -> list[str]:
        return sorted(self._where)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._where[name][1]["shape"])

    def get(self, name: str, *, packed: bool = False) -> np.ndarray:
        """The tensor as a numpy array in its stored dtype (a view into the memory-mapped file). ``packed``: the
        caller decodes integer codes itself (MXFP4 blocks and scales: ``U8``)."""
        f, info, start = self._where[name]
        dtype = _floating(info["dtype"])
        if dtype is None and packed and info["dtype"] == "U8":
            dtype = _dtypes()["U8"]
        if dtype is None:
            raise CheckpointError(
                f"tensor {name!r} has unsupported dtype {info['dtype']}; supported: "
                f"{', '.join(c for c in _dtypes() if c in FLOATING)} (dequantise the checkpoint first)."
            )
        if f not in self._maps:
            import numpy as np

            self._maps[f] = np.memmap(f, dtype=np.uint8, mode="r")
        begin, end = info["data_offsets"]
        return self._maps[f][start + begin : start + end].view(dtype).reshape(info["shape"])


class ModelWeights:
    """The tensors of one input model (forge: merge, BitNet), read lazily by name through ``safe_open``."""

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


# ----- writing -------------------------------------------------------------------------------------------

Entry = tuple[str, str, tuple[int, ...]]
"""A tensor to write: (name, dtype code, shape)."""


def _nbytes(code: str, shape: tuple[int, ...]) -> int:
    n = _dtypes()[code].itemsize
    for d in shape:
        n *= int(d)
    return n


def plan_shards(entries: list[Entry], max_shard_bytes: int | None) -> list[list[int]]:
    """Group entries (name, dtype code, shape) into shards of at most ``max_shard_bytes`` (a bigger tensor
    gets a shard of its own; None: one file), keeping their order."""
    shards: list[list[int]] = []
    size = 0
    for i, (_, code, shape) in enumerate(entries):
        nbytes = _nbytes(code, shape)
        if not shards or (max_shard_bytes is not None and shards[-1] and size + nbytes > max_shard_bytes):
            shards.append([])
            size = 0
        shards[-1].append(i)
        size += nbytes
    return shards or [[]]


def shard_names(n: int) -> list[str]:
    """transformers' file names for ``n`` shards: ``model.safetensors`` alone, else ``model-0000k-of-0000n``."""
    return [SINGLE_FILE] if n == 1 else [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]


def _header(entries: list[Entry], metadata: dict[str, str] | None) -> bytes:
    """The 8-byte length and the JSON header (padded with spaces to 8 bytes, as ``safetensors`` pads it)."""
    header: dict[str, Any] = {"__metadata__": metadata or {"format": "pt"}}
    offset = 0
    for name, code, shape in entries:
        nbytes = _nbytes(code, shape)
        header[name] = {"dtype": code, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    return struct.pack("<Q", len(blob)) + blob


class ShardWriter:
    """Streams tensors, in a fixed order, into safetensors shards whose headers are written up front.

    ``files``: ``[path.name]`` when ``single`` names the one file to write, else transformers' shard names;
    ``finish`` writes ``model.safetensors.index.json`` when there are several."""

    def __init__(self, folder: Path, entries: list[Entry], max_shard_bytes: int | None, *,
                 metadata: dict[str, str] | None = None, single: str | None = None):
        self.folder = Path(folder)
        self.entries = entries
        self.metadata = metadata
        self.shards = [list(range(len(entries)))] if single else plan_shards(entries, max_shard_bytes)
        self.files = [single] if single else shard_names(len(self.shards))
        self._order = [i for shard in self.shards for i in shard]
        self._shard_of = {i: s for s, members in enumerate(self.shards) for i in members}
        self._next = 0
        self._shard = -1
        self._fh: Any = None
        self.total_bytes = 0

    def __enter__(self) -> ShardWriter:
        self.folder.mkdir(parents=True, exist_ok=True)
        if not self.entries:  # no tensor: one file with the header alone
            self._open(0)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def _open(self, shard: int) -> None:
        if self._fh is not None:
            self._fh.close()
        self._fh = open(self.folder / self.files[shard], "wb")
        self._fh.write(_header([self.entries[i] for i in self.shards[shard]], self.metadata))
        self._shard = shard

    def write(self, name: str, array: np.ndarray) -> None:
        """Write the next planned tensor (``name`` must be it, with the planned dtype and shape)."""
        i = self._order[self._next]
        want, code, shape = self.entries[i]
        if name != want or tuple(array.shape) != tuple(shape) or _codes().get(array.dtype) != code:
            raise RuntimeError(f"writer expected {want} {code}{list(shape)}, got {name} {array.dtype}{list(array.shape)}")
        if self._shard_of[i] != self._shard:
            self._open(self._shard_of[i])
        import numpy as np

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


def _entries(tensors: dict[str, np.ndarray]) -> list[Entry]:
    """Entries for ``tensors`` in name order; CheckpointError for a dtype safetensors cannot store."""
    entries = []
    for name in sorted(tensors):
        arr = tensors[name]
        if arr.dtype not in _codes():
            raise CheckpointError(f"cannot save tensor {name!r} with dtype {arr.dtype}; use float32, float16 or bfloat16.")
        entries.append((name, _codes()[arr.dtype], tuple(arr.shape)))
    return entries


def _write_all(writer: ShardWriter, tensors: dict[str, np.ndarray]) -> list[str]:
    with writer:
        for name, _, _ in writer.entries:
            writer.write(name, tensors[name])
        return writer.finish()


def write_file(path: str | Path, tensors: dict[str, np.ndarray], metadata: dict[str, str] | None = None) -> Path:
    """Write ``tensors`` (name order) into one safetensors file at ``path``; returns it."""
    path = Path(path)
    _write_all(ShardWriter(path.parent, _entries(tensors), None, metadata=metadata, single=path.name), tensors)
    return path


def write_shards(folder: str | Path, tensors: dict[str, np.ndarray], max_shard_bytes: int | None = None) -> list[str]:
    """Write ``tensors`` (name order) into ``folder`` as ``model.safetensors``, or as shards of at most
    ``max_shard_bytes`` with ``model.safetensors.index.json``; returns the file names."""
    return _write_all(ShardWriter(Path(folder), _entries(tensors), max_shard_bytes), tensors)
