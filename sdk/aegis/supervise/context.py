"""Run context: what the graph's nodes share in process memory and never put in graph state.

It holds the run config and folder, the event log, and — created lazily, so `aegis status` and
`aegis command` never import JAX — the dataset, the checkpoint store and the engine of the
active fallback tier. It also reads the command inbox and writes the per-step metrics log.

    ctx = RunContext(cfg, paths, callbacks=RunCallbacks(on_step=print))
    engine = ctx.engine_for(state)          # built (or rebuilt after a fallback) on first use
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aegis.supervise.run_config import RunConfig
from aegis.supervise.events import EventLog, append_jsonl, read_jsonl
from aegis.supervise.runs import RunPaths, write_json_atomic
from aegis.supervise.state import RunState, StepMetrics

__all__ = ["RunCallbacks", "RunContext"]


@dataclass
class RunCallbacks:
    """Optional observers (the CLI's progress bar and live log)."""

    on_window: Callable[[int, int], None] | None = None
    on_step: Callable[[StepMetrics], None] | None = None
    on_event: Callable[[str, int | None, dict[str, Any]], None] | None = None
    on_progress: Callable[[str, int, int], None] | None = None  # ("weights" bytes | "tokenize" rows, done, total)


class RunContext:
    """Per-process companion of a run's graph."""

    def __init__(self, cfg: RunConfig, paths: RunPaths, callbacks: RunCallbacks | None = None) -> None:
        self.cfg = cfg
        self.paths = paths
        self.callbacks = callbacks or RunCallbacks()
        self.log = EventLog(paths.events)
        self._store: Any = None
        self._engine: Any = None
        self._examples: list[Any] | None = None
        self._model_input: Any = None
        self._reporter: Any = None
        self._rewind_to: int | None = None
        self._inbox_size = -1

    # ------------------------------------------------------------------ events and logs

    def event(self, kind: str, step: int | None = None, **data: Any) -> None:
        self.log.append(kind, step, **data)
        if self.callbacks.on_event is not None:
            self.callbacks.on_event(kind, step, data)

    def record_step(self, m: StepMetrics, peak_lr: float, tier: int) -> None:
        rec = m.model_dump(mode="json", exclude={"sample_ids"})
        rec.update(peak_lr=peak_lr, tier=tier, sample_ids=list(m.sample_ids))
        append_jsonl(self.paths.metrics, rec)
        if self.cfg.report_to:
            if self._reporter is None:
                from aegis.supervise.reporting import open_reporter

                self._reporter = open_reporter(
                    self.cfg.report_to, self.paths.logs, run_id=self.paths.run_id,
                    config=self.cfg.model_dump(mode="json", exclude={"model"}),
                )
            if self._reporter is not None and self._rewind_to is not None:
                self._reporter.rewind(self._rewind_to)  # before the first point of a resumed process
            self._rewind_to = None
            if self._reporter is not None:
                self._reporter.log(m.step, {
                    "train/loss": m.loss, "train/grad_norm": m.grad_norm, "train/learning_rate": m.lr,
                    "train/tokens_per_s": m.tokens_per_s, "train/fallback_tier": float(tier),
                    "train/useful_token_fraction": m.useful_token_fraction,
                    "train/loss_token_fraction": m.loss_token_fraction, "train/host_wait_s": m.host_wait_s,
                })
        if self.callbacks.on_step is not None:
            self.callbacks.on_step(m)

    def rewind_metrics(self, step: int) -> int:
        """Drop the logged steps after ``step`` (a killed process's or a rolled-back future) from metrics.jsonl
        and the reporters (TensorBoard purges them), so training on from ``step`` logs each step once."""
        from aegis.supervise.runs import truncate_metrics

        dropped = truncate_metrics(self.paths, step)
        if dropped and self.cfg.report_to:
            if self._reporter is not None:
                self._reporter.rewind(step)
            else:
                self._rewind_to = step  # the reporter opens at the next step: it rewinds first
        return dropped

    def metrics_between(self, after: int, upto: int) -> list[StepMetrics]:
        """Logged metrics of steps in (after, upto], the last record of each step winning."""
        by_step: dict[int, dict[str, Any]] = {}
        for rec in read_jsonl(self.paths.metrics):
            s = rec.get("step")
            if isinstance(s, int) and after < s <= upto:
                by_step[s] = rec
        fields = set(StepMetrics.model_fields)
        return [StepMetrics.model_validate({k: v for k, v in by_step[s].items() if k in fields}) for s in sorted(by_step)]

    def export_blacklist(self, state: RunState) -> None:
        write_json_atomic(
            self.paths.blacklist,
            {"run_id": state.run_id, "step": state.step, "blacklist": list(state.blacklist), "skipped": list(state.skipped)},
        )

    # ------------------------------------------------------------------ inbox

    def inbox(self) -> list[str]:
        """Every command text of the inbox, in arrival order."""
        return [str(r["text"]) for r in read_jsonl(self.paths.inbox) if "text" in r]

    def urgent_command_waiting(self, offset: int) -> bool:
        """A ``stop`` or ``interrupt`` arrived past ``offset`` (cheap: re-reads only when the file grew)."""
        try:
            size = self.paths.inbox.stat().st_size
        except FileNotFoundError:
            return False
        if size == self._inbox_size:
            return False
        self._inbox_size = size
        return any(t.split()[:1] in (["stop"], ["interrupt"]) for t in self.inbox()[offset:])

    # ------------------------------------------------------------------ heavy members (lazy)

    @property
    def model_input(self) -> Any:
        """The model's config, weights folder and tokenizer (a changed base since the run began is refused)."""
        if self._model_input is None:
            from aegis.supervise.engine_handle import resolve_model_input

            model = resolve_model_input(self.cfg.model, self.cfg.init)
            self._check_source(model)
            self._model_input = model
        return self._model_input

    def _check_source(self, model: Any) -> None:
        """Record the base's fingerprint at the first start; on resume, refuse weights that changed."""
        from aegis.errors import CheckpointError

        fingerprint = model.source.fingerprint if model.source is not None else None
        if self.paths.source.is_file():
            recorded = json.loads(self.paths.source.read_text()).get("fingerprint")
            if recorded != fingerprint:
                where = model.source.folder if model.source is not None else self.cfg.model
                raise CheckpointError(
                    f"the base model at {where} changed since run {self.paths.run_id} started (weights fingerprint "
                    f"{str(recorded)[:12]} -> {str(fingerprint)[:12]}); restore the original weights or start a new run"
                )
            return
        info = {
            "model": model.name,
            "folder": str(model.source.folder) if model.source is not None else None,
            "hub_id": model.source.hub_id if model.source is not None else None,
            "weight_files": list(model.source.weight_files) if model.source is not None else [],
            "fingerprint": fingerprint,
            "init": "random" if model.random_init else "pretrained",
            "tokenizer": str(model.tokenizer_folder) if model.tokenizer_folder is not None else "byte (inline config)",
            "data": self.cfg.data,
        }
        write_json_atomic(self.paths.source, info)

    @property
    def examples(self) -> list[Any]:
        if self._examples is None:
            from aegis.supervise.engine_handle import load_examples

            cb = self.callbacks.on_progress
            examples, report = load_examples(
                self.cfg, self.model_input, on_progress=None if cb is None else (lambda n, t: cb("tokenize", n, t))
            )
            self.event("data_loaded", None, **report.summary())
            for warning in report.warnings():
                self.event("data_warning", None, message=warning)
            self._examples = examples
        return self._examples

    @property
    def model_config(self) -> dict[str, Any]:
        return self.model_input.config

    @property
    def store(self) -> Any:
        if self._store is None:
            from aegis.supervise.checkpoints import CheckpointStore

            from aegis.train.distributed import shared_path

            c = self.cfg.checkpoints
            # every process of a multi-process run saves its shards into the primary's checkpoints (orbax)
            self._store = CheckpointStore(
                shared_path(self.paths.checkpoints, "checkpoints"), interval=c.interval, keep_last_n=c.keep_last_n, async_save=c.async_save
            )
        return self._store

    def engine_for(self, state: RunState) -> Any:
        """The engine of the state's fallback tier (a tier change builds a new one, to be restored)."""
        if self._engine is None or self._engine.tier != state.fallback_tier:
            from aegis.supervise.engine_handle import Engine

            self._engine = None  # free the old tier's arrays before building the next
            cb = self.callbacks.on_progress
            self._engine = Engine.build(
                self.cfg, self.model_input, self.examples, state.fallback_tier,
                on_load=None if cb is None else (lambda n, t: cb("weights", n, t)),
            )
            if self.cfg.faults.oom_on_tiers:
                from aegis.supervise.faults import arm_build_faults

                try:
                    arm_build_faults(self.cfg.faults, self._engine)
                except Exception:
                    self._engine = None
                    raise
            self.event("mesh", self._engine.step, tier=self._engine.tier, **self._engine.trainer.mesh_summary())
            self._check_memory(self._engine)
        return self._engine

    def _check_memory(self, engine: Any) -> None:
        """Record the compiled step's peak (XLA memory analysis) beside the planner's JAX estimate."""
        from aegis.supervise.engine_handle import is_oom
        from aegis.train.memory_check import check_memory

        try:
            mc = check_memory(engine.trainer)
        except Exception as err:  # the check must not stop a run; an OOM compiling the step must reach the fallback
            if is_oom(err):
                raise
            self.event("memory_check", engine.step, tier=engine.tier, error=f"{type(err).__name__}: {err}"[:300])
            return
        tc = engine.trainer.train_config
        remat = {"remat_layers": tc.remat_layers} if tc.remat_layers is not None else {}  # engine_handle.fit_remat
        self.event("memory_check", engine.step, tier=engine.tier, **remat, **mc.model_dump(mode="json"))

    def write_samples_manifest(self) -> None:
        """samples.json: every sample id and its domain (commands validate ids against it)."""
        write_json_atomic(
            self.paths.samples, {"ids": [ex.sample_id for ex in self.examples], "domains": self.domains()}
        )

    def domains(self) -> list[str]:
        return sorted({ex.domain for ex in self.examples})

    def known_ids(self) -> set[str]:
        return set(json.loads(self.paths.samples.read_text())["ids"])

    def export_model(
        self, state: RunState, out: Any = None, *, merge: bool = False, step: int | None = None, overwrite: bool = False
    ) -> Any:
        """Write the model at ``step`` (default: the state's) to ``out`` (default ``<run>/export``, where a user's
        files are kept beside it): a PEFT adapter or an HF folder. The engine is restored from the checkpoint
        when it is not at that step."""
        engine = self.engine_for(state)
        want = state.step if step is None else step
        if engine.dirty or engine.step != want:
            engine.restore(self.store, state, max_step=want)
        path = engine.export(out or self.paths.export, merge=merge, chat_template=self.cfg.chat_template,
                             overwrite=overwrite or out is None)
        self.event("exported", engine.step, path=str(path), merged=merge, method=engine.trainer.train_config.method)
        return path

    def drop_engine(self) -> None:
        """Forget the engine (after an out-of-memory while building or saving it); the next use rebuilds."""
        self._engine = None

    def close(self) -> None:
        if self._reporter is not None:
            self._reporter.close()
            self._reporter = None
        if self._store is not None:
            self._store.close()
            self._store = None
