"""Run by ``test_weights_sharded.py`` in a subprocess with 4 forced host devices (XLA reads the flag when JAX starts).

For each checkpoint folder on the command line: the streamed sharded load (``place=Placement(...)``) on
``{fsdp: 4}`` and ``{data: 2, fsdp: 2}`` equals, leaf for leaf and bit for bit, the whole-parameter load on one
device and the whole-parameter load put on the same shardings (``place=jax.device_put``), with the same shardings;
each device's slice of a tensor stored as kept is read by ``read_slice`` (every element once per process,
replicas not read again, no read larger than a shard). Also a cast on load (``--cast``) and NF4 (``--nf4``: its
absmax is within 1e-6 of the one-device load, bit-identical to the sharded whole-parameter load).
Prints ``OK`` and what it checked.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import jax
import numpy as np
from aegis.train.modeling import build_model
from aegis.train.nf4 import NF4Tensor
from aegis.train.parallel import ParallelConfig
from aegis.train.safetensors_io import CheckpointReader
from aegis.train.sharding import ShardingRules, make_mesh
from aegis.train.weights import Placement, load_checkpoint
from jax.sharding import NamedSharding

assert len(jax.devices()) == 4, jax.devices()
MESHES = (ParallelConfig(fsdp=4), ParallelConfig(data=2, fsdp=2))


def flat(tree: object) -> list[tuple[str, object]]:
    leaves = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: isinstance(x, NF4Tensor))[0]
    return [(jax.tree_util.keystr(p), x) for p, x in leaves]


def arrays(leaf: object) -> list[jax.Array]:
    return list(jax.tree.leaves(leaf)) if isinstance(leaf, NF4Tensor) else [leaf]


def same(a: object, b: object, *, shardings: bool, exact: bool = True) -> int:
    """Leaf for leaf, bit-identical (same dtype and bytes; not ``exact``: within 1e-6 relative); ``shardings``: the
    same shardings too."""
    fa, fb = flat(a), flat(b)
    assert [k for k, _ in fa] == [k for k, _ in fb]
    n = 0
    for (key, x), (_, y) in zip(fa, fb, strict=True):
        for u, v in zip(arrays(x), arrays(y), strict=True):
            assert u.dtype == v.dtype and u.shape == v.shape, (key, u.dtype, v.dtype, u.shape, v.shape)
            hu, hv = np.asarray(u), np.asarray(v)
            if exact:
                assert hu.tobytes() == hv.tobytes(), key
            else:
                np.testing.assert_allclose(hu, hv, rtol=1e-6, err_msg=key)
            if shardings:
                assert u.sharding.is_equivalent_to(v.sharding, u.ndim), (key, u.sharding, v.sharding)
            n += 1
    return n


class Reads:
    """Bytes each ``read_slice`` call read, per tensor name (the streamed path's only reads of kept tensors)."""

    def __init__(self) -> None:
        self.calls: dict[str, list[int]] = {}
        self._orig = CheckpointReader.read_slice

        def spy(reader: CheckpointReader, name: str, index: tuple, out: np.ndarray) -> None:
            self.calls.setdefault(name, []).append(out.size * reader.get(name).dtype.itemsize)
            self._orig(reader, name, index, out)

        CheckpointReader.read_slice = spy  # type: ignore[method-assign]

    def close(self) -> None:
        CheckpointReader.read_slice = self._orig  # type: ignore[method-assign]


class Logged(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def main(argv: list[str]) -> None:
    cast = "--cast" in argv
    nf4 = "--nf4" in argv
    folders = [Path(a) for a in argv if not a.startswith("--")]
    log = logging.getLogger("aegis.train.weights")
    log.setLevel(logging.DEBUG)
    handler = Logged()
    log.addHandler(handler)
    report = []
    for folder in folders:
        config = json.loads((folder / "config.json").read_text())
        model = build_model(config)
        kwargs = {"dtype": "bfloat16"} if cast else {}
        kwargs |= {"nf4": True} if nf4 else {}
        reference = load_checkpoint(model, folder, **kwargs)  # today's loader, one device
        reader = CheckpointReader(folder)
        for parallel in MESHES:
            mesh, _ = make_mesh(parallel)
            rules = ShardingRules.for_model(model, mesh)

            def sharding(path: tuple[str, ...], shape: tuple[int, ...], mesh=mesh, rules=rules) -> NamedSharding:
                return NamedSharding(mesh, rules.spec(path, shape))

            whole = load_checkpoint(model, folder, place=lambda p, a: jax.device_put(a, sharding(p, a.shape)), **kwargs)
            reads = Reads()
            try:
                handler.messages.clear()
                streamed = load_checkpoint(model, folder, place=Placement(sharding), **kwargs)
            finally:
                reads.close()
            # NF4: quantising a sharded array reduces the double-quantised absmax in another order than on one device
            # (1 ulp apart, whatever the loader); the streamed load equals the sharded whole-parameter one exactly
            n = same(streamed, reference, shardings=False, exact=not nf4)
            same(streamed, whole, shardings=True)
            split = [x for _, leaf in flat(streamed) for x in arrays(leaf) if not x.sharding.is_fully_replicated]
            assert split, "nothing was sharded"
            assert reads.calls, "no tensor was read by slices"
            for name, sizes in reads.calls.items():
                assert sum(sizes) == reader.nbytes(name), (name, sizes, reader.nbytes(name))  # each byte once
                assert max(sizes) <= reader.nbytes(name) // 2, (name, sizes)  # never the whole tensor
            fallback = [m.split(":")[0] for m in handler.messages]
            report.append(f"{config['model_type']} {parallel.model_dump()}: {n} leaves equal, {len(split)} sharded, "
                          f"{len(reads.calls)} tensors read by slices, joined per layer: {fallback}")
    print("OK")
    print("\n".join(report))


if __name__ == "__main__":
    main(sys.argv[1:])
