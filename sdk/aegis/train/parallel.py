"""The run config's ``parallel`` section: how a run lays its devices out as a (data, fsdp, tensor) mesh.

    parallel: {data: 2, fsdp: 2}      # 4 devices: 2 data-parallel groups, each sharding the model over 2

``data`` replicates the model and splits the batch; ``fsdp`` splits the batch too and shards every parameter,
adapter, NF4 block and optimizer moment (ZeRO-3); ``tensor`` splits heads and MLP columns (the batch is not split
over it). Missing axes are 1, and the product must be the device count. With no ``parallel`` section every local
device is a ``data`` rank (each holds the whole model, as before meshes were configurable); name ``fsdp`` to shard.

``train_config.micro_batch_size`` is per data-parallel rank (per ``data x fsdp`` rank, like transformers'
``per_device_train_batch_size``): the global batch is micro batch x data x fsdp x gradient accumulation.

Pure pydantic: importing it imports no JAX (the run config validates it); the mesh itself is
:func:`aegis.train.sharding.make_mesh`.
"""

from __future__ import annotations

from pydantic import Field

from aegis.errors import InvalidConfigError
from aegis.schema import Frozen

__all__ = ["MESH_AXES", "ParallelConfig", "resolve_parallel", "global_batch_size"]

MESH_AXES = ("data", "fsdp", "tensor")
"""The mesh's axis names, in the order of its device array."""


class ParallelConfig(Frozen):
    """Devices per mesh axis (the product is the run's device count)."""

    data: int = Field(default=1, ge=1, description="Data-parallel ranks: each holds the whole model, a slice of the batch.")
    fsdp: int = Field(
        default=1, ge=1, description="Fully sharded ranks: each holds 1/fsdp of every parameter and optimizer state "
        "and a slice of the batch."
    )
    tensor: int = Field(default=1, ge=1, description="Tensor-parallel ranks: heads and MLP widths split across them.")

    @property
    def devices(self) -> int:
        """Devices the mesh needs."""
        return self.data * self.fsdp * self.tensor

    @property
    def batch_ranks(self) -> int:
        """Ranks the batch is split over (``data x fsdp``): micro_batch_size is per one of them."""
        return self.data * self.fsdp

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.data, self.fsdp, self.tensor)

    def describe(self) -> str:
        """``data 2 x fsdp 2 x tensor 1``."""
        return " x ".join(f"{axis} {n}" for axis, n in zip(MESH_AXES, self.shape, strict=True))


def resolve_parallel(parallel: ParallelConfig | None, device_count: int) -> ParallelConfig:
    """The mesh a run uses on ``device_count`` devices: ``parallel`` checked against the count, or (None) every
    device a ``data`` rank. Raises InvalidConfigError (one line) when the product is not the device count."""
    if parallel is None:
        return ParallelConfig(data=device_count)
    if parallel.devices != device_count:
        raise InvalidConfigError(
            f"parallel {parallel.describe()} needs {parallel.devices} devices but this run has {device_count}; "
            f"make data x fsdp x tensor = {device_count} (or leave `parallel` out to use them all as data ranks)"
        )
    return parallel


def global_batch_size(micro_batch_size: int, parallel: ParallelConfig, accumulation: int = 1) -> int:
    """Examples per optimizer step: micro batch x data x fsdp x accumulation."""
    return micro_batch_size * parallel.batch_ranks * accumulation
