"""The supervisor's handle on the JAX engine: builds the ``Trainer`` for a fallback tier, keeps its
settings in step with the run state, checkpoints it through :class:`CheckpointStore`, and tells an
out-of-memory failure from any other.

Heavy objects (the trainer, its arrays) live here, in process memory, never in graph state.

    engine = Engine.build(cfg, examples, tier=0)
    engine.sync(state)                               # LR, clip, blacklist, domain weights
    for info in engine.trainer.train(50): ...
    engine.checkpoint(store, step, state)            # async Orbax save of params + sampler state
    engine.restore(store, max_step=120)              # newest readable checkpoint <= 120
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from aegis.errors import CheckpointError
from aegis.supervise.checkpoints import CheckpointStore, Restored
from aegis.supervise.config import RunConfig
from aegis.supervise.state import RunState

__all__ = ["Engine", "is_oom", "load_examples", "resolve_model_config"]

_OOM_MARKERS = ("RESOURCE_EXHAUSTED", "Out of memory", "out of memory", "OOM when allocating")


def is_oom(err: BaseException) -> bool:
    """Whether an exception is the device running out of memory (XLA RESOURCE_EXHAUSTED, MemoryError)."""
    if isinstance(err, MemoryError):
        return True
    names = {c.__name__ for c in type(err).__mro__}
    if names & {"XlaRuntimeError", "JaxRuntimeError"}:
        return any(m in str(err) for m in _OOM_MARKERS)
    return False


def resolve_model_config(model: str | dict[str, Any]) -> dict[str, Any]:
    """The config.json dict a RunConfig's ``model`` names."""
    import json
    from pathlib import Path

    from aegis.errors import InvalidConfigError

    if isinstance(model, dict):
        return dict(model)
    if model == "tiny-llama":
        from aegis.data import tiny_llama_config

        return tiny_llama_config()
    p = Path(model)
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise InvalidConfigError(
            f"model {model!r} is neither 'tiny-llama' nor a config.json path; pass a path to a model's config.json"
        )
    try:
        return json.loads(p.read_text())
    except json.JSONDecodeError as err:
        raise InvalidConfigError(f"{p} is not valid JSON: {err.msg} (line {err.lineno})") from err


def load_examples(data: str) -> list[Any]:
    """Tokenised examples of a RunConfig's ``data`` ('toy' or a JSONL path), with the byte tokenizer."""
    from aegis.data import ByteTokenizer, toy_dataset_path
    from aegis.train.data import load_jsonl

    path = toy_dataset_path() if data == "toy" else data
    return load_jsonl(path, ByteTokenizer())


class Engine:
    """A Trainer for one tier of the plan, with the glue the supervisor needs."""

    def __init__(self, trainer: Any, tier: int, tiers: Sequence[Any] = ()) -> None:
        self.trainer = trainer
        self.tier = tier
        self.tiers = tuple(tiers)  # every tier's TrainConfig: a checkpoint of another tier is converted on restore
        self.dirty = True  # True until the in-memory state is known to match the run state's step

    @classmethod
    def build(cls, cfg: RunConfig, model_config: dict[str, Any], examples: Sequence[Any], tier: int) -> "Engine":
        from aegis.train.loop import Trainer
        from aegis.train.step import OptimizerSettings

        train_config = cfg.tiers[tier]
        settings = OptimizerSettings(
            learning_rate=cfg.training.lr,
            clip_norm=cfg.training.grad_clip,
            total_steps=cfg.training.total_steps,
            warmup_steps=cfg.training.warmup_steps,
            min_lr_ratio=cfg.training.min_lr_ratio,
        )
        trainer = Trainer(
            model_config,
            train_config,
            examples,
            optimizer=settings,
            seed=cfg.training.seed,
            packing=False,
        )
        return cls(trainer, tier, cfg.tiers)

    # ------------------------------------------------------------------ settings

    @property
    def step(self) -> int:
        return self.trainer.step

    def sync(self, state: RunState) -> None:
        """Apply the run state's LR, clip, exclusions and domain weights (also drops a prefetched batch)."""
        t = self.trainer
        t.set_blacklist(state.excluded_ids)
        if state.domain_weights:
            t.set_domain_weights(state.domain_weights)
        t.set_lr(state.lr)
        t.set_clip(state.grad_clip)

    def settle(self) -> None:
        """Put back a batch the trainer prefetched, so the sampler state matches the steps taken."""
        self.trainer.set_blacklist(self.trainer.sampler.blacklist)

    # ------------------------------------------------------------------ checkpoints

    def checkpoint(self, store: CheckpointStore, step: int, state: RunState) -> str:
        """Save params, optimizer and sampler state at ``step`` (async)."""
        self.settle()
        meta = {
            "sampler": self.trainer.sampler.state_dict(),
            "lr": state.lr,
            "grad_clip": state.grad_clip,
            "fallback_tier": self.tier,
        }
        return str(store.save(step, self.trainer.state, meta))

    def _other_tier(self, meta: dict[str, Any]) -> int | None:
        tier = meta.get("fallback_tier", self.tier)
        return tier if isinstance(tier, int) and tier != self.tier and 0 <= tier < len(self.tiers) else None

    def _target(self, meta: dict[str, Any] | None = None) -> Any:
        """The restore target: this engine's state, or the state another tier's configuration keeps
        (its optimizer and precision may differ: a checkpoint from before an OOM fallback)."""
        import jax

        t = self.trainer
        other = self._other_tier(meta or {})
        if other is None:
            return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), t.state)
        from aegis.train.step import abstract_state

        shape = abstract_state(t.state.trainable, self.tiers[other], t.settings)
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=t._replicated), shape)

    def restore(
        self,
        store: CheckpointStore,
        state: RunState,
        max_step: int | None = None,
        on_corrupt: Callable[[int, str], None] | None = None,
    ) -> Restored:
        """Load the newest readable checkpoint at or below ``max_step``, then re-apply the run state's settings."""
        self.settle()
        restored = store.restore_latest(self._target, max_step=max_step, on_corrupt=on_corrupt)
        if restored is None:
            raise CheckpointError(
                f"no readable checkpoint at or below step {max_step} in {store.directory}; "
                "start the run again with `aegis run`"
            )
        t = self.trainer
        other = self._other_tier(restored.meta)
        if other is None:
            t.state = restored.state
        else:
            import jax

            from aegis.train.step import convert_state

            converted = convert_state(restored.state, self.tiers[other], t.train_config, t.tx)
            t.state = jax.device_put(converted, t._replicated)
        t.sampler.load_state_dict(restored.meta["sampler"])
        self.sync(state)
        self.dirty = False
        return restored

    # ------------------------------------------------------------------ faults

    def poison_params(self) -> None:
        """Turn every trainable parameter into NaN (the ``nan_at_steps`` drill)."""
        import jax
        import jax.numpy as jnp

        t = self.trainer
        t.state = dataclasses.replace(t.state, trainable=jax.tree.map(lambda x: x * jnp.nan, t.state.trainable))
