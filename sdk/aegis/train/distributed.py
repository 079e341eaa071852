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

Process 0 is also the one supervisor: :func:`share` hands its value of a decision (the commands of the inbox, the
run state after each supervisor node, "stop this window now") to every process at the same point of their programs,
through the coordination service's key-value store (no XLA program, no collective on the devices). A process that
dies is noticed by the others' :mod:`aegis.train.watchdog`, which ends them with a one-line reason.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aegis.errors import InvalidConfigError, RunError

__all__ = [
    "Topology", "initialize", "topology", "is_primary", "host_to_global", "gather_to_host", "follower_of", "share",
    "detect_cluster", "device_memory",
]


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


def detect_cluster() -> tuple[str, int, int] | None:
    """``(coordinator, num_processes, process_id)`` of a multi-process job started by SLURM (``srun``) or Open MPI
    (``mpirun``), read from their environment as ``jax.distributed.initialize()`` does; None outside one, or for a
    one-process job. (Only clusters told by environment variables: no metadata server or Kubernetes API is asked.)"""
    import os

    if not any(k in os.environ for k in ("SLURM_JOB_ID", "OMPI_MCA_orte_hnp_uri", "OMPI_COMM_WORLD_SIZE")):
        return None  # no cluster: do not import JAX for nothing
    from jax._src.clusters.ompi_cluster import OmpiCluster
    from jax._src.clusters.slurm_cluster import SlurmCluster

    for cluster in (SlurmCluster, OmpiCluster):
        if cluster.is_env_present() and cluster.get_process_count() > 1:
            return (cluster.get_coordinator_address(None, None), cluster.get_process_count(),
                    cluster.get_process_id())
    return None


HEARTBEAT_TIMEOUT_S = 300
"""JAX's own missed-heartbeat limit: far past the watchdog's (:mod:`aegis.train.watchdog`), so the one-line reason
of the watchdog, not JAX's abort, is what a user sees when a process dies."""


def initialize(coordinator: str, num_processes: int, process_id: int, *, timeout_s: int = 300) -> Topology:
    """Join the run's processes (blocks until all have joined or ``timeout_s`` passes). Call before any JAX use."""
    global _TOPOLOGY
    import jax

    if _TOPOLOGY is not None:
        return _TOPOLOGY
    if "cpu" in (jax.config.jax_platforms or "cpu").split(","):
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    with _coordination_errors_reported():
        jax.distributed.initialize(
            coordinator_address=coordinator,
            num_processes=num_processes,
            process_id=process_id,
            initialization_timeout=timeout_s,
            heartbeat_timeout_seconds=HEARTBEAT_TIMEOUT_S,
        )
    _TOPOLOGY = Topology(coordinator, num_processes, process_id)
    return _TOPOLOGY


def _on_coordination_error(*status: Any) -> None:
    """JAX's client lost the coordination service (process 0 died) or was told another task failed: end this process
    with the watchdog's one-line reason, instead of JAX's abort (a fatal log and a core dump)."""
    import os
    import sys

    from aegis.train.watchdog import current, lost_peer

    reason = lost_peer(wait_s=5.0)
    dog = current()
    if reason is None:
        detail = str(status[0]).strip().splitlines()[0] if status and str(status[0]).strip() else "unreachable"
        reason = f"lost the run's coordination service at {_TOPOLOGY.coordinator if _TOPOLOGY else '?'} ({detail[:200]})"
    if dog is not None:
        dog.die(reason)
    sys.stderr.write(f"error: {reason}\n")
    sys.stderr.flush()
    os._exit(2)


@contextlib.contextmanager
def _coordination_errors_reported() -> Iterator[None]:
    """``jax.distributed.initialize`` with :func:`_on_coordination_error` as its client's error callback (JAX does not
    pass one through; its default aborts the process)."""
    from jax._src import distributed as jd

    make = jd._jax.get_distributed_runtime_client

    def client(*args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("missed_heartbeat_callback", _on_coordination_error)
        return make(*args, **kwargs)

    try:
        jd._jax.get_distributed_runtime_client = client
    except (AttributeError, TypeError):  # a jaxlib whose module is read-only: keep JAX's default
        yield
        return
    try:
        yield
    finally:
        jd._jax.get_distributed_runtime_client = make


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



_SEQ = 0
_PENDING: list[str] = []
_POLL_MS = 5_000


def share(name: str, value: Any, *, timeout_s: float | None = None) -> Any:
    """Process 0's ``value`` (JSON-able) on every process; ``value`` itself in a one-process run. Every process calls
    it at the same point of its program (the n-th call of each process is one exchange); ``name`` checks that they do:
    a process that reached another decision than process 0 stops with a RunError instead of training apart.

    A follower waits for process 0 as long as it takes (``timeout_s``: at most that long, then RunError); a dead
    process 0 is the watchdog's to report."""
    import json

    topo = _TOPOLOGY
    if topo is None or topo.num_processes == 1:
        return value
    global _SEQ
    _SEQ += 1
    key = f"aegis/share/{_SEQ}"
    client = _client()
    if topo.process_id == 0:
        _forget_read(client, topo.num_processes - 1)
        text = json.dumps({"name": name, "value": value})
        client.key_value_set(key, text)
        _PENDING.append(key)
        return json.loads(text)["value"]
    text = _wait_for(client, key, timeout_s, name)
    client.key_value_increment(key + "/read", 1)
    msg = json.loads(text)
    if msg.get("name") != name:
        raise RunError(
            f"process {topo.process_id} reached '{name}' where process 0 reached '{msg.get('name')}' (exchange "
            f"{_SEQ}): the processes run different programs; start every process with the same command and version"
        )
    return msg["value"]


def _client() -> Any:
    from jax._src.distributed import global_state

    if global_state.client is None:
        raise RuntimeError("share() needs jax.distributed to be initialized")
    return global_state.client


def _wait_for(client: Any, key: str, timeout_s: float | None, name: str) -> str:
    import time

    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        try:
            return str(client.blocking_key_value_get(key, _POLL_MS))
        except Exception as err:  # DEADLINE_EXCEEDED: process 0 has not got there yet
            if "DEADLINE_EXCEEDED" not in str(err):
                raise RunError(f"lost process 0 while waiting for its '{name}' decision ({str(err).splitlines()[0]})") from None
        if deadline is not None and time.monotonic() > deadline:
            raise RunError(f"process 0 sent no '{name}' decision in {timeout_s:g} s; stop every process and resume them")


def _forget_read(client: Any, readers: int) -> None:
    """Delete the exchanges every follower has read (the store holds only the ones in flight)."""
    keep = []
    for key in _PENDING:
        try:
            done = int(client.key_value_try_get(key + "/read")) >= readers
        except Exception:  # NOT_FOUND: nobody read it yet
            done = False
        if done:
            client.key_value_delete(key)
            client.key_value_delete(key + "/read")
        else:
            keep.append(key)
    _PENDING[:] = keep


def device_memory() -> list[dict[str, Any]]:
    """Memory of this process's devices: the allocator's bytes in use, peak and limit where the device reports them
    (GPUs), else the bytes of the live arrays' shards on each device (XLA:CPU reports none)."""
    import jax

    out: list[dict[str, Any]] = []
    live: dict[int, int] | None = None
    for d in jax.local_devices():
        stats = d.memory_stats() or {}
        if "bytes_in_use" in stats:
            out.append({"device": d.id, "bytes_in_use": int(stats["bytes_in_use"]),
                        "peak_bytes": stats.get("peak_bytes_in_use"), "limit_bytes": stats.get("bytes_limit")})
            continue
        if live is None:
            live = {}
            for a in jax.live_arrays():
                try:
                    for shard in a.addressable_shards:
                        live[shard.device.id] = live.get(shard.device.id, 0) + int(shard.data.nbytes)
                except Exception:  # deleted while we looked
                    continue
        out.append({"device": d.id, "bytes_in_use": live.get(d.id, 0), "peak_bytes": None, "limit_bytes": None})
    return out
