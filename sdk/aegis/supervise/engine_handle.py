"""The supervisor's handle on the JAX engine: builds the ``Trainer`` for a fallback tier, keeps its
settings in step with the run state, checkpoints it through :class:`CheckpointStore`, and tells an
out-of-memory failure from any other.

Heavy objects (the trainer, its arrays) live here, in process memory, never in graph state.

    engine = Engine.build(cfg, examples, tier=0)
    engine.sync(state)                               # LR, clip, blacklist, domain weights
    for info in engine.trainer.train(50): ...
    engine.checkpoint(store, step, state)            # async Orbax save of params + sampler state
    engine.restore(store, max_step=120)              # newest readable checkpoint <= 120

    check_feasible(cfg, model_config)                # before a run starts: one line if no tier can run here
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from aegis.errors import CheckpointError
from aegis.supervise.checkpoints import CheckpointStore, Restored
from aegis.supervise.run_config import RunConfig
from aegis.supervise.state import RunState

__all__ = [
    "Engine",
    "ModelInput",
    "check_feasible",
    "is_oom",
    "load_examples",
    "make_renderer",
    "resolve_model_config",
    "resolve_model_input",
]

_OOM_MARKERS = ("RESOURCE_EXHAUSTED", "Out of memory", "out of memory", "OOM when allocating")


def is_oom(err: BaseException) -> bool:
    """Whether an exception is the device running out of memory (XLA RESOURCE_EXHAUSTED, MemoryError)."""
    if isinstance(err, MemoryError):
        return True
    names = {c.__name__ for c in type(err).__mro__}
    if names & {"XlaRuntimeError", "JaxRuntimeError"}:
        return any(m in str(err) for m in _OOM_MARKERS)
    return False


IMPOSSIBLE_FACTOR = 4.0
"""A run is refused before it starts when every tier's planned peak is this many times the memory there is:
far past the estimate's error (a few percent against XLA's compiled peak), so only configs that cannot run."""


def _device_memory() -> tuple[int | None, str]:
    """(bytes one device can hold, what it is): a GPU's allocator limit, or this host's RAM on XLA:CPU."""
    import os

    import jax

    device = jax.devices()[0]
    if device.platform != "cpu":
        stats = device.memory_stats() or {}
        limit = stats.get("bytes_limit")
        return (int(limit) if limit else None), f"{getattr(device, 'device_kind', device.platform)} memory"
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None, "host RAM"
    return int(ram), "host RAM (XLA:CPU)"


def _gib(n: float) -> str:
    g = n / 2**30
    return f"{g:,.1f} GiB" if g < 1e6 else f"{g:.3g} GiB"


def check_feasible(cfg: RunConfig, model_config: dict[str, Any]) -> None:
    """Refuse, in one line before anything is built, a ``parallel`` mesh whose size is not the device count, or a
    run with a tier that cannot run: a ``seq_len`` past a
    model's learned positions (GPT-2's ``wpe`` has no row for it), or a planned peak (the planner's JAX
    estimate for the tier's micro batch and seq_len) over :data:`IMPOSSIBLE_FACTOR` x this device's memory.

    A tier that merely might not fit is left to the run: an out-of-memory there takes the next fallback."""
    import jax

    from aegis.errors import AegisError, InvalidConfigError
    from aegis.models.families import get_family
    from aegis.train.parallel import resolve_parallel

    resolve_parallel(cfg.parallel, len(jax.devices()))  # a mesh that does not match the devices: one line, now
    try:
        family = get_family(model_config)
    except AegisError:
        return  # an architecture the engine cannot build either: building it says so
    name = str(model_config.get("_name_or_path") or model_config.get("model_type") or "the model")
    if family.position_embedding_params(model_config):
        limit = family.max_positions(model_config)
        for i, tc in enumerate(cfg.tiers):
            if tc.seq_len > limit:
                where = "train_config.seq_len" if i == 0 else f"fallbacks[{i - 1}].seq_len"
                raise InvalidConfigError(
                    f"{where} {tc.seq_len:,} is past {name}'s {limit:,} learned positions (it has no embedding for "
                    f"later tokens): set it to {limit:,} or less"
                )
    capacity, what = _device_memory()
    if capacity is None:
        return
    from aegis.planning.memory import estimate
    from aegis.models.profiles import profile_from_config

    try:
        profile = profile_from_config(model_config, model_id=name, source="path")
        peaks = [estimate(profile, tc, framework="jax").tensor_bytes for tc in cfg.tiers]
    except (AegisError, ValueError, ArithmeticError):
        return  # the planner cannot size it; the run's own memory check will
    for i, (tc, peak) in enumerate(zip(cfg.tiers, peaks)):
        if peak > IMPOSSIBLE_FACTOR * capacity:
            where = "train_config" if i == 0 else f"fallbacks[{i - 1}]"
            raise InvalidConfigError(
                f"{where} cannot run here: micro batch {tc.micro_batch_size} x seq_len {tc.seq_len:,} needs about "
                f"{_gib(peak)} and this machine's {what} is {_gib(capacity)}; lower its seq_len or micro_batch_size "
                "(`aegis plan` sizes them for a GPU)"
            )


def fit_remat(tc: Any, model_config: dict[str, Any], cfg: RunConfig) -> Any:
    """``tc`` with ``remat_layers`` chosen from this GPU's memory: with gradient checkpointing on and no
    ``remat_layers`` given, a LoRA / QLoRA run in 16-bit precision recomputes only the layers the planner's
    ``jax`` memory model says it must for the step to fit the device's allocator limit
    (`aegis.planning.memory.jax_profile.remat_layers_for`); the others keep their activations. Unchanged on
    XLA:CPU (no device limit to fit), for full fine-tuning (all layers or none), in fp32 (where the model's split
    figures are furthest from XLA's), and where the planner cannot size the model."""
    if not tc.gradient_checkpointing or tc.remat_layers is not None or tc.method == "full" or tc.precision == "fp32":
        return tc
    capacity, _ = _device_memory()
    import jax

    if capacity is None or jax.devices()[0].platform == "cpu":
        return tc
    from aegis.errors import AegisError
    from aegis.models.profiles import profile_from_config
    from aegis.planning.memory.jax_profile import remat_layers_for
    from aegis.train.benchmark import detect_gpu_id

    try:
        profile = profile_from_config(model_config, model_id=str(model_config.get("model_type", "model")), source="path")
        shards = {"fsdp_shards": cfg.parallel.fsdp, "tensor_shards": cfg.parallel.tensor} if cfg.parallel else {}
        gpu = detect_gpu_id(jax.devices()[0])
        try:
            k = remat_layers_for(profile, tc, capacity, gpu=gpu, **shards)
        except LookupError:  # a GPU the catalog does not list: XLA:GPU layout
            k = remat_layers_for(profile, tc, capacity, platform="gpu", **shards)
    except (AegisError, ValueError, ArithmeticError):
        return tc
    if k is None or k >= profile.num_layers:
        return tc
    return tc.model_copy(update={"remat_layers": k})


@dataclasses.dataclass
class ModelInput:
    """What a run's ``model:`` names: the config, the weights' folder (None: random init) and the tokenizer's."""

    config: dict[str, Any]
    source: Any = None  # aegis.models.source.ModelSource when weights are loaded
    tokenizer_folder: Any = None  # Path of the tokenizer files (None: the demo's byte tokenizer)

    @property
    def random_init(self) -> bool:
        return self.source is None

    @property
    def name(self) -> str:
        if self.source is not None:
            return self.source.display
        return str(self.config.get("_name_or_path") or self.config.get("model_type") or "inline config")


def resolve_model_input(model: str | dict[str, Any], init: str = "pretrained", *, download: bool = False) -> ModelInput:
    """The config, weights and tokenizer a RunConfig's ``model`` names.

    Inline dicts are the tests' random models (byte tokens). Anything else is a model folder / config.json /
    Hub id / alias whose weights must be on this machine, unless ``init == 'random'`` (config.json and
    tokenizer only: the bundled demo folder, :func:`aegis.data.tiny_llama_path`, is one).
    """
    import json
    from pathlib import Path

    from aegis.errors import InvalidConfigError
    from aegis.models.source import locate_model

    if isinstance(model, dict):
        return ModelInput(dict(model))
    if init == "random":
        p = Path(model).expanduser()
        folder = p if p.is_dir() else p.parent
        file = folder / "config.json"
        if not file.is_file():
            raise InvalidConfigError(f"no config.json at {file}: `init: random` needs a model folder or its config.json")
        try:
            config = json.loads(file.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise InvalidConfigError(f"{file} is not valid JSON: {err.msg} (line {err.lineno})") from err
        return ModelInput(config, None, folder)
    source = locate_model(model, download=download)
    return ModelInput(source.config(), source, source.folder)


def resolve_model_config(model: str | dict[str, Any]) -> dict[str, Any]:
    """The config.json dict a RunConfig's ``model`` names (no weights needed)."""
    return resolve_model_input(model, "random").config  # config.json only: no weights needed


def make_renderer(cfg: RunConfig, model: ModelInput) -> Any:
    """The model's own tokenizer and chat template; the byte tokenizer for an inline config or a folder whose
    tokenizer_config.json names it (the bundled demo model's)."""
    from aegis.data.byte_tokenizer import ByteTokenizer, names_byte_tokenizer

    if model.tokenizer_folder is None or names_byte_tokenizer(model.tokenizer_folder):
        return ByteTokenizer()
    from aegis.data.render import ChatRenderer

    return ChatRenderer.from_folder(model.tokenizer_folder, chat_template=cfg.chat_template)


def load_examples(
    cfg: RunConfig, model: ModelInput | None = None, on_progress: Callable[[int, int], None] | None = None
) -> tuple[list[Any], Any]:
    """(examples, DataReport) of a RunConfig's ``data`` rendered with the model's tokenizer."""
    from aegis.train.data import load_examples as render_examples

    model = model or resolve_model_input(cfg.model, cfg.init)
    return render_examples(
        cfg.data, make_renderer(cfg, model), seq_len=cfg.tiers[0].seq_len, overlong=cfg.overlong, on_progress=on_progress
    )


QUANTIZERS_GROUP = "aegis.quantizers"
"""Entry-point group of the ``quantize`` sections' model wrappers, by method (``bitnet_b158`` ->
``aegis.forge.bitnet_train:bitnet_wrapper``, declared in pyproject.toml): forge runs the supervisor, so the
supervisor names no forge module; it finds the wrapper the installed distribution declares."""


def _quantize_wrapper(cfg: RunConfig) -> Callable[[Any], Any] | None:
    """The model wrapper of the run's ``quantize`` section (None: plain training)."""
    if cfg.quantize is None:
        return None
    from importlib.metadata import entry_points

    from aegis.errors import MissingExtraError

    found = entry_points(group=QUANTIZERS_GROUP, name=cfg.quantize.method)
    if not found:
        raise MissingExtraError(
            f"quantize: {cfg.quantize.method} has no installed implementation (no {QUANTIZERS_GROUP!r} entry point): "
            "reinstall aegis-ml (pip install -e '.[forge]' in a checkout) so its entry points are registered"
        )
    return next(iter(found)).load()(cfg.quantize)


class Engine:
    """A Trainer for one tier of the plan, with the glue the supervisor needs."""

    def __init__(self, trainer: Any, tier: int, tiers: Sequence[Any] = ()) -> None:
        self.trainer = trainer
        self.tier = tier
        self.tiers = tuple(tiers)  # every tier's TrainConfig: a checkpoint of another tier is converted on restore
        self.dirty = True  # True until the in-memory state is known to match the run state's step
        self.model_input: ModelInput | None = None
        self.fail_transfer: BaseException | None = None

    @classmethod
    def build(
        cls,
        cfg: RunConfig,
        model: ModelInput | dict[str, Any],
        examples: Sequence[Any],
        tier: int,
        *,
        on_load: Callable[[int, int], None] | None = None,
    ) -> "Engine":
        """The Trainer of ``tier``, its weights streamed from the model's folder (random for demo models)."""
        from aegis.train.loop import Trainer
        from aegis.train.step import OptimizerSettings

        if isinstance(model, dict):
            model = ModelInput(model)
        load_params: Callable[[Any, Any], Any] | None = None
        if model.source is not None:
            from aegis.train.weights import load_checkpoint

            folder = model.source.folder
            nf4 = cfg.tiers[tier].method == "qlora"

            def load_pretrained(m: Any, dtype: Any, place: Any = None) -> Any:
                return load_checkpoint(m, folder, dtype=dtype, nf4=nf4, on_progress=on_load, place=place)

            load_params = load_pretrained

        train_config = fit_remat(cfg.tiers[tier], model.config, cfg)
        settings = OptimizerSettings(
            learning_rate=cfg.training.lr,
            clip_norm=cfg.training.grad_clip,
            total_steps=cfg.training.total_steps,
            warmup_steps=cfg.training.warmup_steps,
            min_lr_ratio=cfg.training.min_lr_ratio,
        )
        trainer = Trainer(
            model.config,
            train_config,
            examples,
            optimizer=settings,
            load_params=load_params,
            seed=cfg.training.seed,
            packing=cfg.training.packing,
            buckets=cfg.training.length_buckets,  # applies with packing off
            wrap_model=_quantize_wrapper(cfg),
            parallel=cfg.parallel,
        )
        engine = cls(trainer, tier, cfg.tiers)
        engine.model_input = model
        return engine

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
        if self.fail_transfer is not None:  # the faults.oom_phase='transfer' drill
            raise self.fail_transfer
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
        return t.rules.abstract(shape)

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
            from aegis.train.step import convert_state

            converted = convert_state(restored.state, self.tiers[other], t.train_config, t.tx)
            t.state = t.place_state(converted)
        t.sampler.load_state_dict(restored.meta["sampler"])
        self.sync(state)
        self.dirty = False
        return restored

    # ------------------------------------------------------------------ export

    def export(self, out: Any, *, merge: bool = False, chat_template: str | None = None, overwrite: bool = False) -> Any:
        """Write the trained model for transformers/PEFT (see :func:`aegis.train.export.export_trained`)."""
        from pathlib import Path

        from aegis.data.render import load_chat_template
        from aegis.train.distributed import gather_to_host, is_primary
        from aegis.train.export import export_trained

        t = self.trainer
        model = self.model_input or ModelInput(t.model_config)
        source = model.source
        trainable = gather_to_host(t.state.trainable)  # a collective in a multi-process run: every process gathers
        if not is_primary():  # process 0 writes the export
            return Path(out)
        return export_trained(
            t.model,
            trainable,
            method=t.train_config.method,
            out=out,
            base=source.folder if source is not None else None,
            base_name=(source.hub_id or str(source.folder)) if source is not None else None,
            tokenizer=model.tokenizer_folder,
            chat_template=load_chat_template(chat_template) if chat_template else None,
            merge=merge,
            overwrite=overwrite,
        )

    # ------------------------------------------------------------------ faults

    def poison_params(self) -> None:
        """Turn every trainable parameter into NaN (the ``nan_at_steps`` drill)."""
        import jax
        import jax.numpy as jnp

        t = self.trainer
        t.state = dataclasses.replace(t.state, trainable=jax.tree.map(lambda x: x * jnp.nan, t.state.trainable))
