"""Memory closes the loop: XLA's figure for a run's compiled train step beside the planner's ``jax`` estimate.

:func:`check_memory` lowers and compiles the :class:`~aegis.train.loop.Trainer`'s own jitted step for
the arguments it is called with (the train state, the frozen base, a ``[accum, global micro batch,
seq]`` batch in the trainer's shardings) and reads ``compiled.memory_analysis()``. The peak is the
one `aegis.train.benchmark.jax_step_memory` and ``tools/jax_memory.py`` use: arguments + outputs -
aliased (the donated state) + temporaries. Next to it goes ``aegis.planning.memory.estimate(...,
framework="jax", fsdp_shards=..., tensor_shards=...)`` for the same model config, :class:`~aegis.schema.TrainConfig`
and mesh (XLA:CPU's layout on a CPU, the device's GPU layout otherwise). On a sharded mesh both are per device:
XLA's analysis of the SPMD-partitioned step is one device's program, and the planner divides parameters, optimizer
states and gradients by the engine's own sharding rules.

JAX caches lowerings and compiled executables by function, argument shapes and shardings, so the
compile here is the one the trainer's first step reuses (called after training has started, it is
a cache hit): one check per run build costs no extra compile.

    trainer = Trainer(config, train_config, examples)
    check = check_memory(trainer)
    print(check.compiled_peak_bytes, check.planned_peak_bytes, check.ratio, check.detail["temp_bytes"])
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import jax
import numpy as np
from pydantic import Field

from aegis.schema import Frozen

if TYPE_CHECKING:
    from aegis.schema import MemoryEstimate
    from aegis.train.loop import Trainer

__all__ = ["MemoryCheck", "check_memory"]


class MemoryCheck(Frozen):
    """Peak memory of one run's train step: what XLA compiled next to what the planner predicted."""

    compiled_peak_bytes: int = Field(
        description="XLA's memory analysis of the compiled step, per device: arguments + outputs - aliased "
        "(donated state) + temporaries (as `aegis.train.benchmark.jax_step_memory`)."
    )
    planned_peak_bytes: int = Field(
        description="The planner's framework='jax' tensor bytes for the same model config and TrainConfig."
    )
    ratio: float = Field(description="planned_peak_bytes / compiled_peak_bytes (1.0 = the plan was exact).")
    parallel: dict[str, int] = Field(
        default_factory=lambda: {"data": 1, "fsdp": 1, "tensor": 1},
        description="The run's mesh (devices per axis: data, fsdp, tensor); both peaks are per device of it.",
    )
    detail: dict[str, int] = Field(
        description="XLA's components in bytes: argument_bytes, output_bytes, alias_bytes, temp_bytes, "
        "generated_code_bytes, and the argument split frozen_bytes, trainable_bytes, opt_state_bytes, batch_bytes."
    )


def _tree_bytes(tree: Any) -> int:
    return int(sum(np.prod(x.shape) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree)))


def _abstract(tree: Any) -> Any:
    """Shapes, dtypes and shardings of a tree of device arrays (lowering reads nothing else)."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


def _abstract_batch(trainer: Trainer) -> dict[str, jax.ShapeDtypeStruct]:
    """The batch `Trainer.train` passes its step (`Trainer._device_batch`: ``[accum, global micro batch, seq]``
    in the batch sharding), as shapes; the arrays and dtypes are `jax_step_memory`'s (`synthetic_batch`)."""
    from aegis.train.benchmark import synthetic_batch

    tc = trainer.train_config
    host = synthetic_batch(2, tc.gradient_accumulation_steps, trainer.global_micro_batch, trainer.sampler.seq_len)
    return {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=trainer._batch_sharding) for k, v in host.items()}


def _planned_estimate(trainer: Trainer) -> MemoryEstimate:
    """The planner's ``framework="jax"`` estimate for the trainer's model config and TrainConfig, in the
    layout of the device the trainer runs on (XLA:CPU, a catalog GPU, or a generic XLA:GPU)."""
    from aegis.planning.memory import estimate, estimate_jax
    from aegis.models.profiles import profile_from_config
    from aegis.train.benchmark import detect_gpu_id, resolve_config

    config, model_id = resolve_config(trainer.model_config)
    profile = profile_from_config(config, model_id=model_id, source="path")
    device = trainer.devices[0]
    shards = {"fsdp_shards": trainer.parallel.fsdp, "tensor_shards": trainer.parallel.tensor}
    if device.platform == "cpu":
        return estimate(profile, trainer.train_config, framework="jax", **shards)
    try:
        return estimate(profile, trainer.train_config, gpu=detect_gpu_id(device), framework="jax", **shards)
    except LookupError:  # UnknownGPUError: a GPU the catalog does not list: XLA:GPU layout, no flash attention
        return estimate_jax(profile, trainer.train_config, platform="gpu", **shards)


def check_memory(trainer: Trainer) -> MemoryCheck:
    """Compile the trainer's step for its real argument shapes and set XLA's peak beside the planner's."""
    from aegis.train.benchmark import _memory_dict

    state, batch = _abstract(trainer.state), _abstract_batch(trainer)
    frozen = _abstract(trainer.frozen) if trainer.frozen is not None else None
    compiled = trainer._step.lower(state, frozen, batch).compile()
    detail = _memory_dict(compiled)
    compiled_peak = detail.pop("peak_bytes")
    detail.update(
        frozen_bytes=_tree_bytes(frozen) if frozen is not None else 0,
        trainable_bytes=_tree_bytes(state.trainable),
        opt_state_bytes=_tree_bytes(state.opt_state),
        batch_bytes=_tree_bytes(batch),
    )
    planned = _planned_estimate(trainer).tensor_bytes
    return MemoryCheck(
        compiled_peak_bytes=compiled_peak, planned_peak_bytes=planned, ratio=planned / compiled_peak, detail=detail,
        parallel=dict(zip(("data", "fsdp", "tensor"), trainer.parallel.shape, strict=True)),
    )
