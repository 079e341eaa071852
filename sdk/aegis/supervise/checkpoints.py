"""Checkpoints: Orbax ``CheckpointManager`` with async saves, keep-last-N, rollback and corruption fallback.

A checkpoint holds two items: ``state`` (the engine's pytree: params, optimizer state, sampler
state) and ``meta`` (small JSON: step, LR, clip, tier). Orbax writes each step to a temporary
folder and renames it when complete, so a process killed mid-save leaves no half checkpoint in
the listing. A newest checkpoint that is listed but unreadable (a truncated or deleted file) is
detected on restore, moved to ``<run>/corrupt_checkpoints/`` and the previous one is used. A
checkpoint written before the state gained a field (``TrainState.loss_scale``) restores with that
field's default rather than being taken for a damaged one.

    store = CheckpointStore(run_dir / "checkpoints", interval=100, keep_last_n=3, async_save=True)
    store.maybe_save(step, trainer_state, {"lr": 1e-4})      # every `interval` steps, in the background
    restored = store.restore_latest(target=abstract_state)   # Restored(step, state, meta)
    store.rollback(to_step=200)                               # forget every checkpoint after 200
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aegis.errors import CheckpointError

__all__ = ["Restored", "CheckpointStore"]


@dataclass(frozen=True)
class Restored:
    """A restored checkpoint: its step, the engine state pytree and the JSON metadata."""

    step: int
    state: Any
    meta: dict[str, Any]
    skipped_corrupt: tuple[int, ...] = ()
    defaulted: tuple[str, ...] = ()  # state fields the checkpoint predates, filled with their defaults


class CheckpointStore:
    """Orbax-managed checkpoints of one run."""

    def __init__(self, directory: Path, *, interval: int, keep_last_n: int, async_save: bool = True) -> None:
        import orbax.checkpoint as ocp

        self._ocp = ocp
        self.directory = Path(directory).absolute()
        self.interval = interval
        self.keep_last_n = keep_last_n
        self.async_save = async_save
        self.quarantine = self.directory.parent / "corrupt_checkpoints"
        self._open()

    def _open(self) -> None:
        ocp = self._ocp
        options = ocp.CheckpointManagerOptions(
            max_to_keep=self.keep_last_n,
            save_interval_steps=1,
            enable_async_checkpointing=self.async_save,
            cleanup_tmp_directories=True,
            create=True,
        )
        self.manager = ocp.CheckpointManager(self.directory, options=options, item_names=("state", "meta"))

    # saving -------------------------------------------------------------------------------------------

    def due(self, step: int) -> bool:
        """Whether ``step`` is on the save interval."""
        return step > 0 and step % self.interval == 0

    def save(self, step: int, state: Any, meta: dict[str, Any]) -> Path:
        """Start saving ``state`` at ``step`` (returns at once when async); replaces an existing ``step``."""
        ocp = self._ocp
        if step in self.all_steps():
            self.wait()
            self.manager.delete(step)
        args = ocp.args.Composite(
            state=ocp.args.StandardSave(state),
            meta=ocp.args.JsonSave({**meta, "step": step, "saved_at": time.time()}),
        )
        self.manager.save(step, args=args, force=True)
        return self.path(step)

    def maybe_save(self, step: int, state: Any, meta: dict[str, Any]) -> Path | None:
        """Save when ``step`` is on the interval."""
        return self.save(step, state, meta) if self.due(step) else None

    def wait(self) -> None:
        """Block until background saves are committed."""
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.wait()
        self.manager.close()

    # reading ------------------------------------------------------------------------------------------

    def path(self, step: int) -> Path:
        return self.directory / str(step)

    def all_steps(self) -> list[int]:
        return sorted(self.manager.all_steps())

    def latest_step(self) -> int | None:
        steps = self.all_steps()
        return steps[-1] if steps else None

    def restore(self, step: int, target: Any) -> Restored:
        """Restore one step into the structure/dtypes of ``target``; CheckpointError if unreadable.

        ``target`` may be a function of the checkpoint's meta that returns the target (the state's
        structure depends on the fallback tier that wrote it)."""
        ocp = self._ocp
        self.wait()
        if step not in self.all_steps():
            raise CheckpointError(f"no checkpoint at step {step} in {self.directory}; have {self.all_steps()}")
        from aegis.train.loop import partial_restore_quietly

        try:
            with partial_restore_quietly():  # the meta and the state's metadata first, then the state
                if callable(target):
                    meta = self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta
                    target = target(dict(meta or {}))
                target, fill = self._legacy_target(step, target)
            out = self.manager.restore(
                step,
                args=ocp.args.Composite(state=ocp.args.StandardRestore(target), meta=ocp.args.JsonRestore()),
            )
        except Exception as err:  # orbax/tensorstore raise many types for a damaged folder
            raise CheckpointError(
                f"checkpoint {self.path(step)} is unreadable ({type(err).__name__}: {str(err)[:200]}); "
                "an earlier one will be used"
            ) from err
        state, defaulted = fill(out.state)
        return Restored(step=step, state=state, meta=dict(out.meta or {}), defaulted=defaulted)

    def _saved_fields(self, step: int) -> set[str] | None:
        """Top-level keys of the saved state tree (None when the metadata does not say)."""
        try:
            tree = self.manager.item_metadata(step)["state"]
            tree = getattr(tree, "tree", tree)
        except Exception:  # noqa: BLE001 - metadata is optional; the restore itself reports damage
            return None
        return set(tree) if isinstance(tree, dict) else None

    def _legacy_target(self, step: int, target: Any) -> tuple[Any, Callable[[Any], tuple[Any, tuple[str, ...]]]]:
        """The target to restore, and how to finish the restored tree.

        For a dataclass state whose checkpoint lacks fields that have defaults (it was written by an
        older version), restore the saved fields alone and fill the rest with their defaults, placed
        like the target's. Otherwise the target as is."""
        unchanged = (target, lambda state: (state, ()))
        if not dataclasses.is_dataclass(target) or isinstance(target, type):
            return unchanged
        saved = self._saved_fields(step)
        fields = {f.name: f for f in dataclasses.fields(target)}
        if saved is None or not saved < set(fields):
            return unchanged
        missing = sorted(set(fields) - saved)
        if any(fields[n].default is dataclasses.MISSING and fields[n].default_factory is dataclasses.MISSING for n in missing):
            return unchanged
        import jax

        def default(name: str) -> Any:
            f = fields[name]
            value = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            sharding = getattr(getattr(target, name), "sharding", None)
            return value if sharding is None else jax.device_put(value, sharding)

        def fill(state: dict[str, Any]) -> tuple[Any, tuple[str, ...]]:
            return type(target)(**state, **{n: default(n) for n in missing}), tuple(missing)

        return {n: getattr(target, n) for n in fields if n in saved}, fill

    def restore_latest(
        self,
        target: Any | Callable[[dict[str, Any]], Any],
        max_step: int | None = None,
        on_corrupt: Callable[[int, str], None] | None = None,
    ) -> Restored | None:
        """Newest readable checkpoint at or below ``max_step``; damaged ones are quarantined and skipped."""
        skipped: list[int] = []
        for step in reversed(self.all_steps()):
            if max_step is not None and step > max_step:
                continue
            try:
                restored = self.restore(step, target)
            except CheckpointError as err:
                skipped.append(step)
                self._quarantine(step)
                if on_corrupt is not None:
                    on_corrupt(step, str(err))
                continue
            return dataclasses.replace(restored, skipped_corrupt=tuple(skipped))
        return None

    def _quarantine(self, step: int) -> None:
        self.quarantine.mkdir(parents=True, exist_ok=True)
        dest = self.quarantine / f"{step}-{int(time.time() * 1000)}"
        shutil.move(str(self.path(step)), dest)
        self.manager.reload()

    # rollback -----------------------------------------------------------------------------------------

    def rollback(self, to_step: int) -> list[int]:
        """Delete every checkpoint after ``to_step`` (they belong to a discarded future); returns them."""
        self.wait()
        dropped = [s for s in self.all_steps() if s > to_step]
        for s in dropped:
            self.manager.delete(s)
        if dropped:
            self.manager.reload()
        return dropped
