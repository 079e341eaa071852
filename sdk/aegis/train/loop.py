"""The training loop: a :class:`Trainer` whose ``train(n)`` yields one typed :class:`StepInfo` per step.

This is what the supervisor drives. It never reaches inside: it reads ``StepInfo`` (loss,
grad norm, lr, tokens/s, NaN/Inf flags, the batch's sample ids), attaches hooks, changes the
learning rate, clip norm, blacklist and domain weights between windows, evaluates, saves and
restores (orbax: train state + sampler state), and asks for per-sample forensics of a batch.

    from aegis.data import ByteTokenizer, tiny_llama_config, toy_dataset_path
    from aegis.train.data import load_jsonl
    trainer = Trainer(tiny_llama_config(), TrainConfig(method="lora", micro_batch_size=4, seq_len=128,
                      precision="fp32"), load_jsonl(toy_dataset_path(), ByteTokenizer()))
    trainer.add_hook(lambda info: print(info.step, info.loss), every=10)
    for info in trainer.train(50):
        if info.nan_or_inf: break
    trainer.set_lr(1e-4); trainer.set_blacklist(trainer.analyze().outliers())
    trainer.save("/tmp/run/ckpt-50")

Devices: a ``(data, fsdp, tensor)`` mesh over all local devices (or the ``devices`` given), laid out by
``parallel`` (:class:`aegis.train.parallel.ParallelConfig`; None: every device a ``data`` rank). The batch is
split over ``data x fsdp``; params, adapters, NF4 blocks and optimizer state are sharded by the rules of
:mod:`aegis.train.sharding` (replicated on a data-only mesh) and XLA's SPMD partitioner inserts the collectives.
``TrainConfig.micro_batch_size`` is per ``data x fsdp`` rank: ``global_batch_size`` = micro x data x fsdp x accumulation.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from pydantic import Field

from aegis.errors import CheckpointError, DatasetError, InvalidConfigError
from aegis.schema import Frozen, TrainConfig
from aegis.train.data import Batch, BatchSampler, Example, iter_batches
from aegis.train.distributed import host_to_global
from aegis.train.per_sample import BatchForensics, analyze_batch
from aegis.train.parallel import ParallelConfig
from aegis.train.sharding import ShardingRules, batch_sharding, make_mesh
from aegis.train.step import (
    LossScaleSettings,
    OptimizerSettings,
    TrainState,
    build_train_step,
    init_state,
    make_eval_step,
    make_optimizer,
    precision_dtypes,
    reuse_host_memory,
)

__all__ = ["StepInfo", "Trainer", "build_trainable"]



@contextlib.contextmanager
def partial_restore_quietly() -> Iterator[None]:
    """Restoring some items of an orbax checkpoint (its meta, before the state it describes) is on purpose: orbax's
    warning for each item left unrestored (on the ``absl`` logger) is dropped while it runs, and only that one."""
    logger = logging.getLogger("absl")
    drop = logging.Filter()
    drop.filter = lambda record: "could not be restored" not in record.getMessage()  # type: ignore[method-assign]
    logger.addFilter(drop)
    try:
        yield
    finally:
        logger.removeFilter(drop)

class StepInfo(Frozen):
    """What one optimizer step did (all host floats: cheap to log, send and keep in graph state)."""

    step: int = Field(description="Optimizer steps taken after this one (1-based).")
    loss: float = Field(description="Mean next-token NLL over the step's target tokens.")
    grad_norm: float = Field(description="Global gradient norm before clipping.")
    lr: float = Field(description="Learning rate used by this step.")
    tokens: int = Field(description="Target tokens the loss was taken over.")
    tokens_per_s: float = Field(description="Positions processed per second (batch x seq x accumulation / step time).")
    step_time_s: float = Field(description="Wall time from dispatch to metrics on the host (first step: + compile).")
    epoch: float = Field(description="Examples drawn so far / dataset size.")
    loss_nonfinite: bool = Field(description="The loss was NaN or Inf.")
    grads_nonfinite: bool = Field(description="The gradient norm was NaN or Inf.")
    params_nonfinite: bool = Field(description="Some trainable parameter is NaN or Inf after the step.")
    update_skipped: bool = Field(description="The update was not applied because loss or grads were not finite.")
    sample_ids: tuple[str, ...] = Field(description="Ids of the examples in the step's batch.", repr=False)
    loss_scale: float = Field(default=1.0, description="Dynamic loss scale this step used (fp16_mixed); 1 otherwise.")
    scaler_overflow: bool = Field(
        default=False,
        description="fp16 loss scaling overflowed (finite loss, non-finite scaled grads at a scale > 1): the "
        "update was skipped and the scale halved, as GradScaler does. Routine, not a divergence.",
    )
    useful_token_fraction: float = Field(
        default=1.0, description="Share of the batch's positions holding an example's tokens (not padding)."
    )
    loss_token_fraction: float = Field(
        default=1.0, description="Share of the batch's positions whose target the loss is taken over."
    )
    host_wait_s: float = Field(
        default=0.0, description="Host time between the previous step's end and this step's dispatch (device idle)."
    )

    @property
    def nan_or_inf(self) -> bool:
        """Non-finite loss, params, or gradients that are not a loss-scaler overflow."""
        grads = self.grads_nonfinite and not self.scaler_overflow
        return self.loss_nonfinite or grads or self.params_nonfinite


def build_trainable(
    model: Any, params: Any, train_config: TrainConfig, rng: jax.Array, lora_dtype: Any
) -> tuple[Any, Any]:
    """``(trainable, frozen)`` for a method: params / None, or LoRA adapters over a bf16 or NF4 base."""
    if train_config.method == "full":
        return params, None
    from aegis.train.lora import init_lora

    lc = train_config.lora_config
    lora = init_lora(
        model,
        params,
        rank=lc.rank,
        alpha=lc.alpha,
        target_modules=lc.target_modules,
        rng=rng,
        dtype=lora_dtype,
        dropout=lc.dropout,
    )
    if train_config.method == "qlora":
        from aegis.train.nf4 import quantize_params

        return lora, quantize_params(model, params)
    return lora, params


class Trainer:
    """A training run in progress: model, train state, sampler, jitted steps."""

    def __init__(
        self,
        model_config: Mapping[str, Any],
        train_config: TrainConfig,
        examples: Sequence[Example],
        *,
        optimizer: OptimizerSettings | None = None,
        eval_examples: Sequence[Example] | None = None,
        params: Any = None,
        load_params: Callable[[Any, Any], Any] | None = None,
        seed: int = 0,
        packing: bool = True,
        domain_weights: Mapping[str, float] | None = None,
        blacklist: Sequence[str] = (),
        buckets: bool = False,
        devices: Sequence[jax.Device] | None = None,
        wrap_model: Callable[[Any], Any] | None = None,
        parallel: ParallelConfig | None = None,
    ) -> None:
        """``wrap_model``: the built model -> the model the steps run (same params tree), e.g. the BitNet
        b1.58 straight-through forward of :mod:`aegis.forge.bitnet_train`; params and checkpoints are unchanged.
        ``buckets`` (with ``packing=False``): length-bucketed batches (:class:`~aegis.train.data.BatchSampler`), padded
        to one of ``sampler.lengths``: one compiled step per length used."""
        from aegis.train.modeling import build_model, engine_attention

        reuse_host_memory()  # XLA:CPU keeps its step buffers between steps (only before JAX's backend starts)
        self.model_config = dict(model_config)
        self.train_config = train_config
        self.settings = optimizer or OptimizerSettings()
        dtypes = precision_dtypes(train_config.precision)
        self.model = build_model(
            self.model_config,
            dtype=dtypes.compute,
            param_dtype=dtypes.params,
            remat=train_config.gradient_checkpointing,
            remat_layers=train_config.remat_layers,
            attention=engine_attention(train_config.attention),
        )
        vocab = int(self.model_config.get("vocab_size", 0))
        too_big = [ex.sample_id for ex in examples if vocab and int(ex.input_ids.max()) >= vocab]
        if too_big:
            raise DatasetError(
                f"example {too_big[0]!r} has token ids >= the model's vocab_size {vocab}; "
                "tokenize with the model's own tokenizer"
            )

        self.devices = list(devices or jax.devices())
        self.mesh, self.parallel = make_mesh(parallel, self.devices)
        self.rules = ShardingRules.for_model(self.model, self.mesh)
        self._replicated = NamedSharding(self.mesh, P())
        self._batch_sharding = batch_sharding(self.mesh, 1, 3)
        self._eval_sharding = batch_sharding(self.mesh, 0, 2)
        self.global_micro_batch = train_config.micro_batch_size * self.parallel.batch_ranks
        accum = train_config.gradient_accumulation_steps
        self.global_batch_size = self.global_micro_batch * accum
        self.sampler = BatchSampler(
            examples,
            self.global_micro_batch * accum,
            train_config.seq_len,
            seed=seed,
            packing=packing,
            domain_weights=domain_weights,
            blacklist=blacklist,
            buckets=buckets,
        )
        self.eval_examples = list(eval_examples) if eval_examples is not None else list(examples)
        self.packing = packing

        rng = jax.random.PRNGKey(seed)
        init_rng, lora_rng, state_rng = jax.random.split(rng, 3)
        if params is None and load_params is not None:  # pretrained weights, streamed in the params dtype
            # on a sharded mesh each parameter streams into its shards (a load_params that takes ``place``): each
            # device's slices are read from the files alone
            sharded = self.parallel.devices != self.parallel.data
            from aegis.train.weights import Placement

            params = load_params(self.model, dtypes.params, **({"place": Placement(self._leaf_sharding)} if sharded else {}))
        if params is None:
            params = self.model.init(init_rng)
        else:  # e.g. fp32 weights from a checkpoint, trained in bf16 (NF4 weights stay as they are)
            from aegis.train.nf4 import NF4Tensor

            params = jax.tree.map(
                lambda x: x.astype(dtypes.params)
                if not isinstance(x, NF4Tensor) and jnp.issubdtype(x.dtype, jnp.floating)
                else x,
                params,
                is_leaf=lambda x: isinstance(x, NF4Tensor),
            )
        if wrap_model is not None:
            self.model = wrap_model(self.model)
        trainable, frozen = build_trainable(self.model, params, train_config, lora_rng, dtypes.lora)
        self.tx = make_optimizer(train_config, self.settings)
        self.loss_scaler = LossScaleSettings() if dtypes.loss_scaling else None
        state = init_state(trainable, self.tx, self.settings, state_rng, loss_scale=self.loss_scaler)
        self._state_shardings = self.rules.shardings(state)
        self.state: TrainState = jax.device_put(state, self._state_shardings)
        self.frozen = self.rules.place(frozen) if frozen is not None else None

        self._step = build_train_step(  # the one step builder (aegis.train.benchmark measures this step)
            self.model,
            train_config,
            self.settings,
            state_shardings=self._state_shardings,
            metrics_sharding=self._replicated,
            shard_grads=self.parallel.devices != self.parallel.data,
        )
        self._eval = jax.jit(
            make_eval_step(
                self.model,
                chunked_cross_entropy=train_config.chunked_cross_entropy,
                chunk_tokens=self.settings.ce_chunk_tokens,
            )
        )
        self._hooks: list[tuple[Callable[[StepInfo], Any], int]] = []
        self._prefetched: tuple[dict, Batch] | None = None
        self.last_batch: Batch | None = None

    def mesh_summary(self) -> dict[str, int]:
        """The mesh and batch of this run, for its events: axes, devices, micro and global batch."""
        return {
            **self.parallel.model_dump(),
            "devices": self.parallel.devices,
            "micro_batch_size": self.train_config.micro_batch_size,
            "accumulation": self.train_config.gradient_accumulation_steps,
            "global_batch_size": self.global_batch_size,
        }

    def _leaf_sharding(self, path: tuple[str, ...], shape: tuple[int, ...]) -> NamedSharding:
        """The sharding of the parameter at ``path`` (of ``shape``) of the params tree on the mesh, by the rules."""
        return NamedSharding(self.mesh, self.rules.spec(path, shape))

    def place_state(self, state: TrainState) -> TrainState:
        """``state`` (e.g. converted from another tier's checkpoint) on this run's mesh, sharded by its rules."""
        return self.rules.place(state)

    # ----------------------------------------------------------------- hooks and settings

    def add_hook(self, fn: Callable[[StepInfo], Any], *, every: int = 1) -> None:
        """Call ``fn(info)`` after every ``every``-th step (by step number)."""
        if every < 1:
            raise InvalidConfigError(f"hook interval must be >= 1, got {every}")
        self._hooks.append((fn, every))

    @property
    def step(self) -> int:
        return int(jax.device_get(self.state.step))

    @property
    def lr(self) -> float:
        """The current peak learning rate (the schedule scales it)."""
        return float(jax.device_get(self.state.peak_lr))

    @property
    def clip_norm(self) -> float:
        return float(jax.device_get(self.state.clip_norm))

    def set_lr(self, peak_lr: float) -> None:
        """New peak learning rate; the warmup/cosine schedule keeps scaling it. No recompile."""
        if not peak_lr > 0:
            raise InvalidConfigError(f"learning rate must be > 0, got {peak_lr}")
        value = jax.device_put(jnp.asarray(peak_lr, jnp.float32), self._replicated)
        self.state = dataclasses.replace(self.state, peak_lr=value)

    def set_clip(self, clip_norm: float) -> None:
        """New global gradient-norm clip (0 disables clipping). No recompile."""
        if not clip_norm >= 0:
            raise InvalidConfigError(f"clip norm must be >= 0, got {clip_norm}")
        value = jax.device_put(jnp.asarray(clip_norm, jnp.float32), self._replicated)
        self.state = dataclasses.replace(self.state, clip_norm=value)

    def set_blacklist(self, sample_ids: Sequence[str]) -> None:
        """Exclude these sample ids from all batches built from now on (replaces the set)."""
        self._rewind()
        self.sampler.set_blacklist(sample_ids)

    def set_domain_weights(self, weights: Mapping[str, float]) -> None:
        """Domain mixing weights for the batches built from now on; shapes do not change."""
        self._rewind()
        self.sampler.set_domain_weights(weights)

    # ----------------------------------------------------------------- training

    def _rewind(self) -> None:
        """Undo a prefetched batch so that setting changes and checkpoints see exact sampler state."""
        if self._prefetched is not None:
            self.sampler.load_state_dict(self._prefetched[0])
            self._prefetched = None

    def _take_batch(self) -> tuple[Batch, dict[str, jax.Array]]:
        """The next batch and its arrays on the devices (prefetched while the previous step ran, when it was)."""
        if self._prefetched is not None:
            _, batch, arrays = self._prefetched
            self._prefetched = None
            return batch, arrays
        batch = self.sampler.next_batch()
        return batch, self._device_batch(batch)

    def _device_batch(self, batch: Batch) -> dict[str, jax.Array]:
        accum = self.train_config.gradient_accumulation_steps
        shaped = {k: v.reshape(accum, self.global_micro_batch, -1) for k, v in batch.arrays().items()}
        return host_to_global(shaped, self._batch_sharding)  # multi-process: each places its devices' slices

    def train(self, num_steps: int) -> Iterator[StepInfo]:
        """Run ``num_steps`` optimizer steps, yielding a :class:`StepInfo` after each."""
        ready = None  # when the previous step's metrics reached the host (the device was done)
        for i in range(num_steps):
            batch, arrays = self._take_batch()
            positions = batch.input_ids.size  # length buckets: the batch's own length
            t0 = time.perf_counter()
            host_wait = 0.0 if ready is None else t0 - ready  # hooks, the caller, batch building: device idle
            self.state, metrics = self._step(self.state, self.frozen, arrays)
            if i + 1 < num_steps:  # build the next batch and put it on the devices while this step computes
                snapshot = self.sampler.state_dict()
                nxt = self.sampler.next_batch()
                self._prefetched = (snapshot, nxt, self._device_batch(nxt))
            m = jax.device_get(metrics)
            ready = time.perf_counter()
            dt = ready - t0
            self.last_batch = batch
            info = StepInfo(
                step=int(jax.device_get(self.state.step)),
                loss=float(m["loss"]),
                grad_norm=float(m["grad_norm"]),
                lr=float(m["lr"]),
                tokens=int(m["tokens"]),
                tokens_per_s=positions / dt,
                step_time_s=dt,
                epoch=self.sampler.epoch,
                loss_nonfinite=not bool(m["loss_finite"]),
                grads_nonfinite=not bool(m["grads_finite"]),
                params_nonfinite=not bool(m["params_finite"]),
                update_skipped=bool(m["skipped"]),
                sample_ids=batch.sample_ids,
                loss_scale=float(m["loss_scale"]),
                scaler_overflow=bool(m["overflow"]),
                useful_token_fraction=float((batch.segment_ids > 0).mean()),
                loss_token_fraction=float((batch.loss_mask > 0).mean()),
                host_wait_s=host_wait,
            )
            for fn, every in self._hooks:
                if info.step % every == 0:
                    fn(info)
            yield info
        self._rewind()

    def eval(self, domain: str | None = None, *, max_batches: int | None = None) -> float:
        """Mean next-token NLL over the eval examples (of one domain), blacklisted ones excluded."""
        examples = [
            ex
            for ex in self.eval_examples
            if (domain is None or ex.domain == domain) and ex.sample_id not in self.sampler.blacklist
        ]
        if not examples:
            domains = sorted({ex.domain for ex in self.eval_examples})
            raise DatasetError(f"no eval examples for domain {domain!r}; eval domains: {domains}")
        total, count = 0.0, 0.0
        for k, batch in enumerate(iter_batches(examples, self.global_micro_batch, self.sampler.seq_len, packing=self.packing)):
            if max_batches is not None and k >= max_batches:
                break
            arrays = host_to_global(batch.arrays(), self._eval_sharding)
            t, c = jax.device_get(self._eval(self.state.trainable, self.frozen, arrays))
            total += float(t)
            count += float(c)
        return total / max(count, 1.0)

    def analyze(
        self, batch: Batch | None = None, *, sample_ids: Sequence[str] | None = None, chunk_size: int = 8
    ) -> BatchForensics:
        """Per-sample losses and gradient norms of a batch (default: the last trained batch)."""
        if sample_ids is not None:
            batch = self.sampler.batch_of(sample_ids)
        batch = batch or self.last_batch
        if batch is None:
            raise DatasetError("no batch to analyze yet: train a step first or pass sample_ids")
        return analyze_batch(
            self.model,
            self.state.trainable,
            self.frozen,
            batch,
            chunk_size=chunk_size,
            chunked_cross_entropy=self.train_config.chunked_cross_entropy,
            chunk_tokens=self.settings.ce_chunk_tokens,
        )

    # ----------------------------------------------------------------- checkpoints

    def save(self, path: str | Path) -> Path:
        """Write an orbax checkpoint (train state + sampler state + run metadata) to ``path``."""
        import orbax.checkpoint as ocp

        self._rewind()
        path = Path(path).absolute()
        meta = {
            "method": self.train_config.method,
            "train_config": self.train_config.model_dump(mode="json"),
            "model_config": self.model_config,
        }
        with ocp.Checkpointer(ocp.CompositeCheckpointHandler()) as ckptr:
            ckptr.save(
                path,
                ocp.args.Composite(
                    state=ocp.args.StandardSave(self.state),
                    sampler=ocp.args.JsonSave(self.sampler.state_dict()),
                    meta=ocp.args.JsonSave(meta),
                ),
                force=True,
            )
        return path

    def restore(self, path: str | Path) -> None:
        """Continue from a checkpoint written by :meth:`save` for the same model, method and dataset (its items are
        read in two steps, meta first, so orbax's notes on the items each step leaves are dropped)."""
        import orbax.checkpoint as ocp

        path = Path(path).absolute()
        if not (path / "state").is_dir() or not (path / "sampler").exists():
            raise CheckpointError(f"{path} is not an Aegis checkpoint (needs state/ and sampler/); pass a saved folder")
        self._rewind()
        abstract = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), self.state
        )
        try:
            with ocp.Checkpointer(ocp.CompositeCheckpointHandler()) as ckptr, partial_restore_quietly():
                meta = ckptr.restore(path, ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
                if meta["method"] != self.train_config.method or meta["model_config"] != json.loads(
                    json.dumps(self.model_config)
                ):
                    raise CheckpointError(
                        f"{path} was saved by a {meta['method']} run of a different model or method; "
                        "restore it into a Trainer built with the same model config and method"
                    )
                out = ckptr.restore(
                    path,
                    ocp.args.Composite(state=ocp.args.StandardRestore(abstract), sampler=ocp.args.JsonRestore()),
                )
        except CheckpointError:
            raise
        except (ValueError, KeyError, FileNotFoundError) as err:
            raise CheckpointError(f"cannot restore {path}: {err}; was it saved with the same settings?") from err
        self.state = out["state"]
        self.sampler.load_state_dict(out["sampler"])
