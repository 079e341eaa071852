"""Measure the JAX engine: real steps for throughput and peak memory, XLA's compiled memory and cost analysis.

:func:`run_benchmark` runs real steps through a :class:`~aegis.train.loop.Trainer`: the step a run takes
(one builder, :func:`aegis.train.step.build_train_step`, with the trainer's mesh, sharding, packing and
prefetch) on packed batches of long-tailed synthetic examples (throughput does not depend on token values)
or on the examples given. It reads the device's allocator peak (``device.memory_stats()``; XLA:CPU has
none, so the compiled memory analysis stands in), and reports where the time goes: the model's FLOPs per
token (:func:`aegis.planning.throughput.token_flops`), the compiled step's (XLA's cost analysis) and their ratio,
the packed batches' useful-token fraction, the host time per step the device waited on, MFU on a catalog
GPU. The record goes to the calibration store, keyed by GPU id, model id and method, for the planner.

:func:`jax_step_memory` compiles the train step for a configuration from shapes only (no
parameter is allocated, so an 8B model costs nothing but compile time) and returns XLA's
memory analysis: arguments + outputs - aliased (donated state) + temporaries.

    res = run_benchmark("meta-llama/Llama-3.2-1B", "lora", micro_batch_size=4, seq_len=2048)
    print(res.record.tokens_per_s, res.record.peak_memory_bytes, res.record.mfu, res.flops_ratio)
    mem = jax_step_memory(config_dict, TrainConfig(method="qlora", micro_batch_size=1, seq_len=1024))
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from pydantic import Field

from aegis.planning.calibration import CalibrationRecord, CalibrationStore
from aegis.errors import InvalidConfigError, UnknownModelError
from aegis.schema import (
    Frozen,
    LoRAConfig,
    Method,
    ModelProfile,
    Optimizer,
    Precision,
    TrainConfig,
)
from aegis.train.loop import build_trainable
from aegis.train.step import (
    LossScaleSettings,
    OptimizerSettings,
    build_train_step,
    init_state,
    make_optimizer,
    precision_dtypes,
)

__all__ = [
    "BenchmarkResult",
    "run_benchmark",
    "jax_step_memory",
    "detect_gpu_id",
    "resolve_config",
    "synthetic_batch",
    "synthetic_examples",
    "compiled_flops",
]


class BenchmarkResult(Frozen):
    """A benchmark run: the stored record plus what was measured along the way."""

    record: CalibrationRecord
    compile_s: float = Field(description="Wall time of the first (compiling) step.")
    losses: tuple[float, ...] = Field(description="Loss of each timed step.")
    compiled_memory: dict[str, int] = Field(description="XLA memory analysis of the step (see jax_step_memory).")
    stored_at: str | None = Field(default=None, description="Calibration file written, None when not recorded.")
    model_flops_per_token: float | None = Field(
        default=None, description="The planner's training FLOPs per token (aegis.planning.throughput.token_flops)."
    )
    compiled_flops_per_token: float = Field(
        default=0.0, description="FLOPs of the compiled step (XLA's cost analysis) per position of its batch."
    )
    flops_ratio: float | None = Field(
        default=None, description="compiled / model FLOPs per token: compute beyond the model's own (recompute, "
        "adapters, full attention scores, the loss, the optimizer)."
    )
    flops_source: str = Field(default="", description="How the compiled FLOPs were counted.")
    useful_token_fraction: float = Field(
        default=1.0, description="Share of the packed batches' positions holding example tokens (not padding)."
    )
    loss_token_fraction: float = Field(
        default=1.0, description="Share of the packed batches' positions whose target the loss is taken over."
    )
    host_wait_s: float = Field(
        default=0.0, description="Median host time per step that the device waited on (between steps)."
    )
    packing: bool = Field(default=True, description="Examples packed several per row (False: one per row).")
    buckets: bool = Field(default=False, description="Packing off: length-bucketed batches (aegis.train.data).")
    batch_lengths: tuple[int, ...] = Field(
        default=(), description="Sequence lengths the timed batches took (one compiled step each)."
    )


def resolve_config(model: str | Mapping[str, Any] | ModelProfile, model_id: str | None = None) -> tuple[dict, str]:
    """``(config.json dict, model id)`` for a config dict, a ModelProfile, a config path or a model id/alias."""
    if isinstance(model, ModelProfile):
        return dict(model.config), model_id or model.model_id
    if isinstance(model, Mapping):
        cfg = dict(model)
        return cfg, model_id or str(cfg.get("_name_or_path") or cfg.get("model_type", "custom"))
    path = Path(model).expanduser()
    named = str(path)  # the id `aegis plan` gives the same path (aegis.models.resolve), so its records are found
    if path.is_dir():
        path = path / "config.json"
    if path.is_file():
        return json.loads(path.read_text()), model_id or named
    try:
        from aegis.models.resolve import resolve_model
    except ImportError as err:  # the hub module is part of the planner install
        raise UnknownModelError(f"cannot resolve {model!r}: pass a config.json path or dict") from err
    profile = resolve_model(str(model))
    return dict(profile.config), model_id or profile.model_id


def detect_gpu_id(device: jax.Device) -> str:
    """Catalog GPU id of a device ('cpu' for XLA:CPU; a slug of the device kind when not in the catalog)."""
    if device.platform == "cpu":
        return "cpu"
    kind = str(getattr(device, "device_kind", device.platform))
    try:
        from aegis.planning.hardware import find_gpu

        for candidate in (kind, kind.replace("NVIDIA ", ""), " ".join(kind.split()[:2])):
            try:
                return find_gpu(candidate).id
            except LookupError:
                continue
    except ImportError:
        pass
    return re.sub(r"[^a-z0-9]+", "-", kind.lower()).strip("-")


def synthetic_batch(vocab_size: int, accum: int, batch: int, seq_len: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Full-length rows of random tokens in the train step's ``[accum, batch, seq]`` layout."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocab_size, size=(accum, batch, seq_len + 1), dtype=np.int32)
    mask = np.ones((accum, batch, seq_len), np.float32)
    return {
        "input_ids": ids[..., :-1],
        "targets": ids[..., 1:],
        "loss_mask": mask,
        "segment_ids": np.ones((accum, batch, seq_len), np.int32),
        "positions": np.broadcast_to(np.arange(seq_len, dtype=np.int32), (accum, batch, seq_len)).copy(),
    }


def _tree_bytes(tree: Any) -> int:
    return int(sum(np.prod(x.shape) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree)))


def _abstract_setup(config: dict, tc: TrainConfig, settings: OptimizerSettings) -> tuple[Any, Any, Any, Any, Any]:
    """Model, step function and abstract (shape-only) state / frozen / batch for a configuration."""
    from aegis.train.modeling import build_model, engine_attention

    dtypes = precision_dtypes(tc.precision)
    model = build_model(config, dtype=dtypes.compute, param_dtype=dtypes.params, remat=tc.gradient_checkpointing,
                        remat_layers=tc.remat_layers, attention=engine_attention(tc.attention))
    tx = make_optimizer(tc, settings)
    scaler = LossScaleSettings() if dtypes.loss_scaling else None

    def setup(rng: jax.Array) -> tuple[Any, Any]:
        k1, k2, k3 = jax.random.split(rng, 3)
        params = model.init(k1)
        trainable, frozen = build_trainable(model, params, tc, k2, dtypes.lora)
        return init_state(trainable, tx, settings, k3, loss_scale=scaler), frozen

    state, frozen = jax.eval_shape(setup, jax.random.PRNGKey(0))
    batch = jax.eval_shape(
        lambda: {k: jnp.asarray(v) for k, v in synthetic_batch(2, tc.gradient_accumulation_steps, tc.micro_batch_size, tc.seq_len).items()}
    )
    return model, build_train_step(model, tc, settings), state, frozen, batch


def _memory_dict(compiled: Any) -> dict[str, int]:
    ma = compiled.memory_analysis()
    out = {
        "argument_bytes": int(ma.argument_size_in_bytes),
        "output_bytes": int(ma.output_size_in_bytes),
        "alias_bytes": int(ma.alias_size_in_bytes),
        "temp_bytes": int(ma.temp_size_in_bytes),
        "generated_code_bytes": int(ma.generated_code_size_in_bytes),
    }
    out["peak_bytes"] = out["argument_bytes"] + out["output_bytes"] - out["alias_bytes"] + out["temp_bytes"]
    return out


def jax_step_memory(
    config: Mapping[str, Any], train_config: TrainConfig, *, optimizer: OptimizerSettings | None = None
) -> dict[str, int]:
    """XLA's memory analysis of the compiled train step for one device (shapes only, nothing allocated).

    Keys: ``argument_bytes``, ``output_bytes``, ``alias_bytes`` (donated state reused for the
    new state), ``temp_bytes``, ``generated_code_bytes``, ``peak_bytes`` (= arguments + outputs
    - aliased + temporaries; XLA:CPU's own ``peak_memory_in_bytes`` leaves temporaries out), and
    the argument split ``frozen_bytes`` / ``trainable_bytes`` / ``opt_state_bytes`` / ``batch_bytes``.
    """
    settings = optimizer or OptimizerSettings()
    _, step, state, frozen, batch = _abstract_setup(dict(config), train_config, settings)
    compiled = step.lower(state, frozen, batch).compile()
    out = _memory_dict(compiled)
    out.update(
        frozen_bytes=_tree_bytes(frozen) if frozen is not None else 0,
        trainable_bytes=_tree_bytes(state.trainable),
        opt_state_bytes=_tree_bytes(state.opt_state),
        batch_bytes=_tree_bytes(batch),
    )
    return out


def _gpu(gpu_id: str) -> Any:
    """The catalog GPU ``gpu_id`` names (None for XLA:CPU or a device the catalog does not hold)."""
    try:
        from aegis.planning.hardware import find_gpu

        return find_gpu(gpu_id)
    except (ImportError, LookupError):
        return None


def synthetic_examples(
    vocab_size: int, seq_len: int, count: int, *, seed: int = 0, median_len: int | None = None
) -> list[Any]:
    """``count`` chat-shaped examples of random tokens whose lengths are long-tailed (log-normal around
    ``median_len``, default a quarter of ``seq_len``, clipped to ``[8, seq_len]``): a prompt of a third of the
    tokens is context, the answer is trained on. What the benchmark packs when no data is given."""
    from aegis.train.data import Example

    rng = np.random.default_rng(seed)
    median = median_len or max(seq_len // 4, 8)
    lengths = np.clip(np.exp(rng.normal(np.log(median), 0.9, count)).astype(int), 8, seq_len)
    out = []
    for i, n in enumerate(lengths):
        mask = np.zeros(n, bool)
        mask[n // 3 :] = True
        ids = rng.integers(0, vocab_size, size=n, dtype=np.int32)
        out.append(Example(sample_id=f"synthetic-{seed}-{i}", domain="synthetic", input_ids=ids, loss_mask=mask))
    return out


def _model_flops_per_token(config: dict, model_id: str, tc: TrainConfig) -> float | None:
    """The planner's FLOPs per token (:func:`aegis.planning.throughput.token_flops`), None for a config it cannot profile."""
    try:
        from aegis.models.profiles import profile_from_config
        from aegis.planning.throughput import recomputed_share, token_flops

        profile = profile_from_config(dict(config), model_id=model_id, source="path")
    except Exception:  # noqa: BLE001 - a config the planner does not know still benchmarks
        return None
    return token_flops(profile, tc.method, tc.seq_len, recompute=recomputed_share(profile, tc),
                       lora=tc.lora_config if tc.method != "full" else None).training


def _abstract(tree: Any) -> Any:
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)


def compiled_flops(trainer: Any, arrays: Mapping[str, Any]) -> tuple[float, str]:
    """``(FLOPs of one train step, how counted)`` from XLA's cost analysis of the step ``trainer`` runs.

    XLA counts a ``while`` loop's body once, so a model whose layers run under ``lax.scan`` is counted
    on its unrolled twin (same program otherwise, compiled from shapes, nothing allocated). On a mesh
    the compiled module is one device's share: its count times the devices."""
    import dataclasses

    from aegis.train.step import build_train_step

    model = trainer.model
    args = (trainer.state, trainer.frozen, arrays)
    if model.scans_layers(trainer.frozen if trainer.frozen is not None else trainer.state.trainable):
        unrolled = dataclasses.replace(model, scan_layers=False)
        step = build_train_step(unrolled, trainer.train_config, trainer.settings)
        compiled = step.lower(*_abstract(args)).compile()
        how = "xla cost analysis of the unrolled layer loop"
        devices = 1
    else:
        compiled = trainer._step.lower(*args).compile()
        how = "xla cost analysis"
        devices = trainer.parallel.devices
    analysis = compiled.cost_analysis()
    if isinstance(analysis, list):  # older JAX: one dict per module
        analysis = analysis[0]
    return float(analysis.get("flops", 0.0)) * devices, how


def run_benchmark(
    model: str | Mapping[str, Any] | ModelProfile,
    method: Method,
    micro_batch_size: int,
    seq_len: int,
    steps: int = 10,
    gpu_id: str | None = None,
    *,
    model_id: str | None = None,
    precision: Precision = "bf16",
    gradient_checkpointing: bool = False,
    remat_layers: int | None = None,
    gradient_accumulation_steps: int = 1,
    chunked_cross_entropy: bool = False,
    optimizer: Optimizer = "adamw",
    lora: LoRAConfig | None = None,
    warmup_steps: int = 2,
    store: CalibrationStore | None = None,
    record: bool = True,
    seed: int = 0,
    examples: Sequence[Any] | None = None,
    packing: bool = True,
    buckets: bool = False,
    devices: Sequence[jax.Device] | None = None,
) -> BenchmarkResult:
    """Run ``warmup_steps`` + ``steps`` real train steps through a :class:`~aegis.train.loop.Trainer` (its
    step builder, mesh, sharding, packing and prefetch: the step a run takes) and measure them.

    ``examples``: the data to pack (default: :func:`synthetic_examples`, long-tailed lengths). ``devices``:
    the trainer's mesh (default: the first local device). ``packing=False, buckets=True``: length-bucketed
    batches (tokens/s counts each batch's own positions). Returns the :class:`BenchmarkResult`; when
    ``record`` is true the :class:`CalibrationRecord` is written to ``store`` (default:
    ``$AEGIS_HOME/calibration.json``). ``gpu_id`` defaults to the catalog id matching the device (``cpu``
    on XLA:CPU).
    """
    from aegis.train.loop import Trainer

    if steps < 1 or warmup_steps < 1:
        raise InvalidConfigError("a benchmark needs steps >= 1 and warmup_steps >= 1 (the first step compiles)")
    config, model_id = resolve_config(model, model_id)
    tc = TrainConfig(
        method=method,
        micro_batch_size=micro_batch_size,
        seq_len=seq_len,
        gradient_accumulation_steps=gradient_accumulation_steps,
        gradient_checkpointing=gradient_checkpointing,
        remat_layers=remat_layers,
        chunked_cross_entropy=chunked_cross_entropy,
        precision=precision,
        optimizer=optimizer,
        lora=lora if method != "full" else None,
    )
    devices = list(devices or jax.devices()[:1])
    device = devices[0]
    gpu_id = gpu_id or detect_gpu_id(device)
    settings = OptimizerSettings(total_steps=steps + warmup_steps)
    if examples is None:
        per_step = micro_batch_size * gradient_accumulation_steps * len(devices) * 8
        examples = synthetic_examples(int(config["vocab_size"]), seq_len, per_step * (steps + warmup_steps), seed=seed)
    trainer = Trainer(config, tc, examples, optimizer=settings, seed=seed, packing=packing, buckets=buckets,
                      devices=devices)

    lengths: list[int] = []  # each step's batch length (length buckets: a new one compiles a new program)
    trainer.add_hook(lambda info: lengths.append(trainer.last_batch.shape[1]), every=1)
    t0 = time.perf_counter()
    for _ in trainer.train(warmup_steps):
        pass
    compile_s = time.perf_counter() - t0
    arrays = trainer._device_batch(trainer.last_batch)
    compiled = trainer._step.lower(trainer.state, trainer.frozen, arrays).compile()  # the jit cache's program
    compiled_memory = _memory_dict(compiled)
    t0 = time.perf_counter()
    infos = list(trainer.train(steps))
    elapsed = time.perf_counter() - t0

    warm, lengths = lengths[:-steps], lengths[-steps:]
    positions = trainer.global_batch_size * float(np.mean(lengths))  # mean positions per step (buckets vary)
    step_time = elapsed / steps
    tokens_per_s = positions / step_time
    # length buckets: a timed step whose length no earlier step had compiled is left out (its time is a compile)
    compiled_before = [n in warm or n in lengths[:k] for k, n in enumerate(lengths)]
    if not all(compiled_before) and any(compiled_before):
        kept = [(i, n) for i, n, ok in zip(infos, lengths, compiled_before) if ok]
        tokens_per_s = trainer.global_batch_size * sum(n for _, n in kept) / sum(i.step_time_s for i, _ in kept)
        step_time = positions / tokens_per_s
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    if stats and stats.get("peak_bytes_in_use"):
        peak, source = int(stats["peak_bytes_in_use"]), "device"
    else:
        peak, source = compiled_memory["peak_bytes"], "compiled"
    gpu = _gpu(gpu_id)
    mfu = None
    if gpu is not None:  # the planner's own FLOPs count and peak: a measured MFU reads on the planner's scale
        from aegis.models.profiles import profile_from_config
        from aegis.planning.throughput import model_flops_utilisation

        profile = profile_from_config(dict(config), model_id=model_id, source="path")
        mfu = model_flops_utilisation(tokens_per_s / len(devices), profile, tc, gpu)
    step_flops, flops_source = compiled_flops(trainer, arrays)
    model_flops = _model_flops_per_token(config, model_id, tc)
    compiled_per_token = step_flops / arrays["input_ids"].size  # the compiled batch's own positions
    rec = CalibrationRecord(
        gpu_id=gpu_id,
        model_id=model_id,
        method=method,
        tokens_per_s=tokens_per_s / len(devices),
        peak_memory_bytes=peak,
        memory_source=source,
        device=str(getattr(device, "device_kind", device.platform)),
        micro_batch_size=micro_batch_size,
        seq_len=seq_len,
        gradient_accumulation_steps=gradient_accumulation_steps,
        gradient_checkpointing=gradient_checkpointing,
        remat_layers=remat_layers,
        precision=precision,
        steps=steps,
        step_time_s=step_time,
        mfu=mfu,
    )
    stored = None
    if record:
        stored = str((store or CalibrationStore()).record(rec))
    target = sum(i.tokens for i in infos)
    return BenchmarkResult(
        record=rec,
        compile_s=compile_s,
        losses=tuple(i.loss for i in infos),
        compiled_memory=compiled_memory,
        stored_at=stored,
        model_flops_per_token=model_flops,
        compiled_flops_per_token=compiled_per_token,
        flops_ratio=compiled_per_token / model_flops if model_flops else None,
        flops_source=flops_source,
        useful_token_fraction=sum(i.useful_token_fraction * n for i, n in zip(infos, lengths)) / sum(lengths),
        loss_token_fraction=target / (positions * steps),
        host_wait_s=float(np.median([i.host_wait_s for i in infos])),
        packing=packing,
        buckets=trainer.sampler.buckets,
        batch_lengths=tuple(sorted(set(lengths))),
    )
