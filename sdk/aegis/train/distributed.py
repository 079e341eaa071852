"""Multi-process runs on JAX's distributed runtime: one process per host (or several on one host), one global mesh.

    aegis run --config run.yaml --run-id r1 --coordinator 127.0.0.1:7654 --num-processes 2 --process-id 0
    aegis run --config run.yaml --run-id r1 --coordinator 127.0.0.1:7654 --num-processes 2 --process-id 1

:func:`initialize` calls ``jax.distributed.initialize`` before anything else touches JAX (on CPU with gloo
collectives), so ``jax.devices()`` lists every process's devices and the run's mesh spans them all. Every process
builds the same global batch from the same sampler (same ids, blacklist and order as one process) and places only the
slices its own devices hold (:func:`host_to_global`). Process 0 is the primary: it writes the run's files (events,
metrics, state, export); the others follow the same windows and take part in every collective (steps, Orbax saves of
the shared checkpoint folder, the gather before an export), keeping their own supervisor bookkeeping in a scratch
folder (:func:`follower_of`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aegis.errors import InvalidConfigError

__all__ = ["Topology", "initialize", "topology", "is_primary", "host_to_global", "gather_to_host", "follower_of"]


@dataclass(frozen=True)
class Topology:
    """This process's place in a multi-process run."""

    coordinator: str
    num_processes: int
    process_id: int
    shared_run: Path | None = None
    """The primary's run folder (its checkpoints are shared); None on the primary."""


_TOPOLOGY: Topology | None = None


def check_flags(coordinator: str | None, num_processes: int | None, process_id: int | None) -> bool:
    """True when the three flags ask for a multi-process run; InvalidConfigError (one line) when only some are given
    or they do not fit together."""
    given = [x is not None for x in (coordinator, num_processes, process_id)]
    if not any(given):
        return False
    if not all(given):
        raise InvalidConfigError(
            "a multi-process run needs all of --coordinator HOST:PORT, --num-processes N and --process-id I"
        )
    host, _, port = str(coordinator).rpartition(":")
    if not host or not port.isdigit():
        raise InvalidConfigError(f"--coordinator {coordinator!r} is not HOST:PORT (e.g. 127.0.0.1:7654)")
    if not 1 <= int(num_processes) or not 0 <= int(process_id) < int(num_processes):  # type: ignore[arg-type]
        raise InvalidConfigError(
            f"--process-id {process_id} must be in 0..{int(num_processes) - 1} for --num-processes {num_processes}"  # type: ignore[arg-type]
        )
    return True


def initialize(coordinator: str, num_processes: int, process_id: int, *, timeout_s: int = 300) -> Topology:
    """Join the run's processes (blocks until all have joined or ``timeout_s`` passes). Call before any JAX use."""
    global _TOPOLOGY
    import jax

    if _TOPOLOGY is not None:
        return _TOPOLOGY
    if "cpu" in (jax.config.jax_platforms or "cpu").split(","):
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=coordinator,
        num_processes=num_processes,
        process_id=process_id,
        initialization_timeout=timeout_s,
    )
    _TOPOLOGY = Topology(coordinator, num_processes, process_id)
    return _TOPOLOGY


def topology() -> Topology | None:
    """This process's topology, or None in a one-process run."""
    return _TOPOLOGY


def follower_of(run_root: Path) -> None:
    """Record that this (non-primary) process follows the run in ``run_root``: its checkpoints are that run's."""
    global _TOPOLOGY
    if _TOPOLOGY is None:
        raise RuntimeError("follower_of() needs initialize() first")
    _TOPOLOGY = Topology(_TOPOLOGY.coordinator, _TOPOLOGY.num_processes, _TOPOLOGY.process_id, Path(run_root))


def is_primary() -> bool:
    """True in a one-process run and on process 0."""
    return _TOPOLOGY is None or _TOPOLOGY.process_id == 0


def shared_path(own: Path, name: str) -> Path:
    """``own`` in a one-process run and on the primary; on a follower, ``name`` inside the primary's run folder."""
    if _TOPOLOGY is None or _TOPOLOGY.shared_run is None:
        return own
    return _TOPOLOGY.shared_run / name


def host_to_global(tree: Any, shardings: Any) -> Any:
    """Host arrays (the same full value on every process) as global arrays: each process puts on its own devices
    only the slices they hold. In one process this is ``jax.device_put``."""
    import jax

    if jax.process_count() == 1:
        return jax.device_put(tree, shardings)
    if not isinstance(shardings, (dict, list, tuple)):
        shardings = jax.tree.map(lambda _: shardings, tree)

    def one(x: Any, sharding: Any) -> Any:
        return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])

    return jax.tree.map(one, tree, shardings)


def gather_to_host(tree: Any) -> Any:
    """A tree of (possibly sharded across processes) arrays as host numpy arrays on every process (a collective:
    every process must call it)."""
    import jax

    if jax.process_count() == 1:
        return jax.device_get(tree)
    from jax.experimental import multihost_utils

    return jax.tree.map(lambda x: multihost_utils.process_allgather(x, tiled=True), tree)

