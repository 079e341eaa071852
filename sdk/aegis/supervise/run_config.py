"""Run configuration of a supervised training run: the YAML keys of spec §10.3, validated by pydantic.

A run config says what to train (model, data, the plan's train config and its fallback chain)
and how to supervise it (window size, anomaly thresholds, outlier rules, retries, checkpoints,
curriculum, notifications). ``model`` and ``data`` are required: the demo is its own explicit
config (:func:`aegis.supervise.demo.demo_config`, ``aegis run --demo``), never a default. What a
config leaves out of the training hyper-parameters (learning rate per method, warm-up, cosine floor,
clip, seed, cadence) is the one recipe's (:mod:`aegis.recipe`), the same numbers the emitted
trainer scripts use. Every error is one line naming the key, the value and what is accepted.

    from aegis.supervise.run_config import load_run_config, run_config_from_report
    cfg = load_run_config("run.yaml")          # RunConfig; InvalidConfigError on bad input
    cfg = run_config_from_report(report)       # the one plan -> run translation (CLI, chat and Slack)

A minimal YAML::

    model: ./my-model            # a model folder, its config.json, a cached Hub id, or an inline mapping
    data: ./train.jsonl          # a JSONL/JSON/CSV/Parquet file or a `datasets` id
    train_config: {method: lora, micro_batch_size: 4, seq_len: 1024}
    training: {total_steps: 200}  # lr, warm-up, seed...: the recipe's for the method
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from aegis.errors import DatasetError, InvalidConfigError, NothingFitsError
from aegis.recipe import packing_choice, recipe, steps_for_epochs
from aegis.schema import Frozen, PlanReport, TrainConfig
from aegis.train.parallel import ParallelConfig

__all__ = [
    "TrainingSection",
    "MonitoringSection",
    "ForensicsSection",
    "RecoverySection",
    "CheckpointsSection",
    "CurriculumSection",
    "NotificationsSection",
    "FaultsSection",
    "QuantizeSection",
    "RunConfig",
    "load_run_config",
    "parse_run_config",
    "read_run_yaml",
    "run_config_from_plan",
    "run_config_from_report",
]

_RECIPE = recipe()


class TrainingSection(Frozen):
    """How the run trains: windows, length, optimiser knobs."""

    steps_per_window: int = Field(
        default=_RECIPE.cadence.steps_per_window, ge=1, description="Optimizer steps per Train window (K)."
    )
    total_steps: int = Field(default=1000, ge=1, description="Optimizer steps of the whole run.")
    batch_size: int | None = Field(
        default=None, ge=1, description="Micro batch size; overrides train_config.micro_batch_size when set."
    )
    lr: float | None = Field(
        default=None, gt=0, description="Peak learning rate (not given: the recipe's for train_config's method)."
    )
    grad_clip: float = Field(
        default=_RECIPE.max_grad_norm, gt=0, description="Global gradient-norm clipping threshold."
    )
    seed: int = Field(default=_RECIPE.seed, description="Seed of weight initialisation and data order.")
    warmup_steps: int | None = Field(
        default=None, ge=0, description="Linear LR warmup steps (not given: the recipe's share of total_steps)."
    )
    min_lr_ratio: float = Field(
        default=_RECIPE.min_lr_ratio, ge=0, le=1,
        description="Cosine decay ends at this share of the LR (1.0: constant LR).",
    )
    packing: bool = Field(
        default=True,
        description="Pack several examples into each row (first fit, attention and positions per example) so "
        "batches hold tokens, not padding; false: one example per row (length_buckets then applies).",
    )
    packing_reason: str | None = Field(
        default=None,
        description="Why packing is on or off when a plan decided it (aegis.recipe.packing_choice, as `aegis plan "
        "--emit` decides); recorded, not read.",
    )
    length_buckets: bool = Field(
        default=False,
        description="With packing off: batch examples of similar length and pad each batch to one of a few lengths "
        "up to seq_len (aegis.train.data.bucket_lengths: one compiled step each) instead of every row to seq_len. "
        "Set without `packing`, it turns packing off.",
    )

    @model_validator(mode="before")
    @classmethod
    def _buckets_unpack(cls, data: Any) -> Any:
        """``length_buckets: true`` asks for padded batches: packing off unless the config also says ``packing``."""
        if isinstance(data, dict) and data.get("length_buckets") is True and "packing" not in data:
            return {**data, "packing": False}
        return data

    @model_validator(mode="after")
    def _one_layout(self) -> "TrainingSection":
        if self.packing and self.length_buckets:
            raise ValueError("length_buckets applies only with packing off; set packing: false or drop length_buckets")
        return self

    @field_validator("lr", "grad_clip")
    @classmethod
    def _finite(cls, v: float | None) -> float | None:
        if v is not None and not math.isfinite(v):
            raise ValueError(f"must be a finite number, got {v}")
        return v


class MonitoringSection(Frozen):
    """Anomaly rules the Monitor applies to every step's metrics."""

    model_config = Frozen.model_config | {"allow_inf_nan": False}  # .inf / .nan thresholds are refused

    spike_sigma: float = Field(default=3.0, gt=0, description="Loss spike: loss > mean + spike_sigma * std.")
    history_size: int = Field(default=1000, ge=2, description="Rolling window N of past steps for mean/std.")
    min_history: int = Field(default=20, ge=2, description="Steps of history needed before spikes are judged.")
    warmup_steps: int = Field(
        default=0, ge=0, description="Steps before which spikes are not judged nor recorded (the loss still falls fast)."
    )
    min_std: float = Field(
        default=1e-3, ge=0, description="Floor of the rolling std, so a flat loss does not flag noise as a spike."
    )
    grad_norm_threshold: float | None = Field(
        default=None, gt=0, description="Gradient explosion: grad_norm above this (None: rule off)."
    )


class ForensicsSection(Frozen):
    """Outlier rules for per-sample gradient norms of the offending batches."""

    model_config = Frozen.model_config | {"allow_inf_nan": False}  # .inf / .nan thresholds are refused

    outlier_ratio: float = Field(default=100.0, gt=1, description="Outlier: grad_norm > median * outlier_ratio.")
    zscore_threshold: float = Field(
        default=6.0, gt=0, description="Outlier: robust z-score (median/MAD) of the anomaly's signal above this."
    )
    context_batches: int = Field(
        default=3, ge=0, description="Clean batches before the anomaly analysed with it, to widen the population."
    )
    max_outlier_fraction: float = Field(
        default=0.25, gt=0, le=1, description="More outliers than this share of the offending batch: ambiguous."
    )


class RecoverySection(Frozen):
    """Repair limits: retries before a human is asked, and the stabilising factors."""

    model_config = Frozen.model_config | {"allow_inf_nan": False}  # .inf / .nan thresholds are refused

    max_retries: int = Field(default=3, ge=0, description="Automatic repairs in a row before escalating.")
    lr_factor: float = Field(default=0.5, gt=0, lt=1, description="Strategy B multiplies the LR by this.")
    clip_factor: float = Field(default=0.5, gt=0, lt=1, description="Strategy B multiplies the clip norm by this.")


class CheckpointsSection(Frozen):
    """Orbax checkpointing."""

    model_config = Frozen.model_config | {"populate_by_name": True}

    interval: int = Field(
        default=_RECIPE.cadence.checkpoint_interval, ge=1, description="Save every this many steps (and at each window end)."
    )
    keep_last_n: int = Field(
        default=_RECIPE.cadence.keep_last_n, ge=2, description="Checkpoints kept; at least 2 so a corrupt one has a fallback."
    )
    async_save: bool = Field(default=True, alias="async", description="Write checkpoints in the background.")


class CurriculumSection(Frozen):
    """Per-domain evaluation and mixing-weight adjustment."""

    model_config = Frozen.model_config | {"allow_inf_nan": False}  # .inf / .nan thresholds are refused

    eval_interval: int = Field(
        default=_RECIPE.cadence.eval_interval, ge=1, description="Evaluate every domain every this many steps."
    )
    domains: tuple[str, ...] | None = Field(default=None, description="Domains to evaluate (None: all in the data).")
    weights: dict[str, float] = Field(default_factory=dict, description="Initial mixing weights (missing: equal).")
    drop_threshold: float = Field(
        default=0.1, gt=0, description="Degraded: eval loss above the domain's best by more than this share."
    )
    boost: float = Field(default=1.5, gt=1, description="A degraded domain's weight is multiplied by this.")
    max_weight: float = Field(default=0.8, gt=0, le=1, description="No domain's normalised weight goes above this.")
    eval_batches: int = Field(default=4, ge=1, description="Eval batches per domain per evaluation.")

    @field_validator("weights")
    @classmethod
    def _positive(cls, v: dict[str, float]) -> dict[str, float]:
        for name, w in v.items():
            if not (w >= 0 and math.isfinite(w)):
                raise ValueError(f"weight of domain {name!r} must be a finite number >= 0, got {w}")
        return v


class NotificationsSection(Frozen):
    """Optional outbound notifications (IDs and statistics only, never sample text)."""

    model_config = Frozen.model_config | {"allow_inf_nan": False}  # .inf / .nan thresholds are refused

    webhook_url: str | None = Field(default=None, description="POST a JSON payload here on escalation.")
    slack_channel: str | None = Field(default=None, description="Slack channel (delivered by the Slack app).")
    timeout_s: float = Field(default=5.0, gt=0, description="HTTP timeout of one webhook POST.")

    @field_validator("webhook_url")
    @classmethod
    def _http(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(("http://", "https://")):
            raise ValueError(f"webhook_url must start with http:// or https://, got {v!r}")
        return v


class FaultsSection(Frozen):
    """Deliberate faults for drills, tests and the demo; each fires once per step and never on a retry."""

    model_config = Frozen.model_config | {"allow_inf_nan": False}  # .inf / .nan thresholds are refused

    nan_at_steps: tuple[int, ...] = Field(default=(), description="Steps whose update is poisoned to NaN.")
    lr_spike_at_steps: tuple[int, ...] = Field(
        default=(), description="Steps trained with the LR multiplied by lr_spike_factor (a divergence)."
    )
    lr_spike_factor: float = Field(default=1e4, gt=1, description="LR multiplier of an injected spike.")
    oom_on_tiers: tuple[int, ...] = Field(
        default=(), description="Fallback tiers (0: the plan's config) that raise RESOURCE_EXHAUSTED (see oom_phase)."
    )
    oom_phase: Literal["step", "build", "transfer"] = Field(
        default="step",
        description="Where the injected OOM fires: the train step, building the tier (weights to the device, "
        "compilation), or a device-to-host transfer (the checkpoint copy).",
    )


class QuantizeSection(Frozen):
    """Quantisation-aware fine-tuning (``quantize: bitnet_b158``): the forward runs BitNet b1.58 linears
    (ternary weights, int8 activations) with the straight-through estimator (:mod:`aegis.forge.bitnet_train`);
    the params, checkpoints and export stay full precision (the latent weights), ready for ``aegis compress``."""

    method: Literal["bitnet_b158"] = Field(default="bitnet_b158", description="The quantiser (BitNet b1.58).")
    per_channel: bool = Field(default=False, description="Weight scale per output channel (else per tensor).")
    activations: Literal["int8", "none"] = Field(default="int8", description="Per-token absmax int8 activations.")
    lambda_warmup_steps: int = Field(
        default=0, ge=0, description="Steps over which quantisation ramps in (lambda 0 -> 1); 0: quantised from step 0."
    )
    keep_layers: tuple[int, ...] = Field(default=(), description="Decoder layers left in full precision.")


class RunConfig(Frozen):
    """Everything a supervised run needs; stored as config.json in the run folder."""

    run_id: str | None = Field(default=None, description="Run folder name (None: generated).")
    model: str | dict[str, Any] = Field(
        description="The model to fine-tune (required): a Hugging Face model folder (config.json, safetensors, "
        "tokenizer), a config.json inside one, a Hub id in the local cache, or a bundled alias; an "
        "inline config dict for tests (random weights, byte tokens).",
    )
    data: str = Field(
        description="The dataset (required): a JSONL/JSON/CSV/Parquet file or a `datasets` id, in any format the "
        "planner detects (Alpaca, ShareGPT, messages, prompt/completion, text).",
    )
    init: Literal["pretrained", "random"] = Field(
        default="pretrained",
        description="'pretrained': load the model folder's weights (an error when it has none); 'random': "
        "initialise from config.json only. Inline configs are always random.",
    )
    chat_template: str | None = Field(
        default=None, description="A Jinja chat template (text or a .jinja path) for a tokenizer that has none."
    )
    overlong: Literal["truncate", "drop"] = Field(
        default="truncate", description="Rows longer than seq_len: keep their first seq_len tokens, or drop them."
    )
    report_to: tuple[str, ...] = Field(
        default=(), description="Metric loggers, as HF's report_to: tensorboard, wandb, mlflow, all (none: empty)."
    )
    export: bool = Field(default=True, description="Write export/ (PEFT adapter or HF folder) when the run completes.")
    train_config: TrainConfig = Field(
        default_factory=lambda: TrainConfig(method="full", micro_batch_size=8, seq_len=64, precision="fp32"),
        description="The plan's recommended configuration (tier 0).",
    )
    fallbacks: tuple[TrainConfig, ...] = Field(default=(), description="The plan's fallback chain, in order.")
    training: TrainingSection = Field(default_factory=TrainingSection)
    monitoring: MonitoringSection = Field(default_factory=MonitoringSection)
    forensics: ForensicsSection = Field(default_factory=ForensicsSection)
    recovery: RecoverySection = Field(default_factory=RecoverySection)
    checkpoints: CheckpointsSection = Field(default_factory=CheckpointsSection)
    curriculum: CurriculumSection = Field(default_factory=CurriculumSection)
    notifications: NotificationsSection = Field(default_factory=NotificationsSection)
    faults: FaultsSection = Field(default_factory=FaultsSection)
    quantize: QuantizeSection | None = Field(
        default=None, description="Quantisation-aware training: `bitnet_b158` or a mapping (QuantizeSection)."
    )
    parallel: ParallelConfig | None = Field(
        default=None,
        description="Device mesh {data, fsdp, tensor} (missing axes 1, product = device count; none: every local "
        "device a data rank). micro_batch_size is per data x fsdp rank (aegis.train.parallel).",
    )

    @model_validator(mode="before")
    @classmethod
    def _recipe_defaults(cls, data: Any) -> Any:
        """The recipe's learning rate (for tier 0's method) and warm-up (its share of total_steps) where the
        config gives none; written into the config, so a stored run keeps them whatever the recipe becomes."""
        if not isinstance(data, dict):
            return data
        training = data.get("training")
        if isinstance(training, TrainingSection):
            training = training.model_dump(by_alias=True, exclude_unset=True)
        if training is None:
            training = {}
        if not isinstance(training, dict):
            return data
        training = dict(training)
        if training.get("lr") is None:
            training["lr"] = _RECIPE.lr(_tier0_method(data.get("train_config")))
        if training.get("warmup_steps") is None:
            total = training.get("total_steps", TrainingSection.model_fields["total_steps"].default)
            if isinstance(total, int) and not isinstance(total, bool) and total >= 1:
                training["warmup_steps"] = _RECIPE.warmup_steps(total)
            else:
                training.pop("warmup_steps", None)  # total_steps' own error names the problem
        return {**data, "training": training}

    @field_validator("quantize", mode="before")
    @classmethod
    def _quantize(cls, v: Any) -> Any:
        return {"method": v} if isinstance(v, str) else v

    @field_validator("report_to", mode="before")
    @classmethod
    def _report_to(cls, v: Any) -> Any:
        if v is None or v == "none":
            return ()
        return (v,) if isinstance(v, str) else v

    @model_validator(mode="after")
    def _check(self) -> "RunConfig":
        if self.run_id is not None and (not self.run_id or "/" in self.run_id or self.run_id.startswith(".")):
            raise ValueError(f"run_id {self.run_id!r} must be a plain folder name (letters, digits, '-', '_')")
        return self

    @property
    def tiers(self) -> tuple[TrainConfig, ...]:
        """Tier 0 (the plan's config, batch override applied) followed by the fallback chain."""
        first = self.train_config
        if self.training.batch_size is not None:
            first = first.model_copy(update={"micro_batch_size": self.training.batch_size})
        return (first, *self.fallbacks)


def _tier0_method(train_config: Any) -> str:
    """The method of a (raw) train_config: RunConfig's default tier is full fine-tuning, TrainConfig's is LoRA."""
    if train_config is None:
        return "full"
    method = train_config.method if isinstance(train_config, TrainConfig) else (
        train_config.get("method", TrainConfig.model_fields["method"].default) if isinstance(train_config, dict) else None
    )
    return method if method in _RECIPE.learning_rate else "full"  # a bad method: TrainConfig's error names it


_NEEDED = {
    "model": "`model:` (a model folder, its config.json, a cached Hub id or an alias)",
    "data": "`data:` (a JSONL/JSON/CSV/Parquet file or a `datasets` id)",
}
_TYPE_TAGS = {"str", "int", "float", "bool", "dict", "list", "tuple", "none", "function-after", "function-before"}


def _format_error(err: ValidationError, source: str) -> str:
    """One line: the keys a run needs, or each bad key with the value given and what is accepted."""
    errors = err.errors()
    needed = [e for e in errors if e["type"] == "missing" and tuple(e["loc"]) in (("model",), ("data",))]
    keys = " and ".join(_NEEDED[str(e["loc"][0])] for e in needed)
    if needed and len(needed) == len(errors):
        return (f"run config {source} needs {keys}; `aegis run --demo` runs the bundled demo, "
                "`aegis run --plan plan.json` a plan's model and data")
    parts: list[str] = []
    seen: set[tuple[Any, ...]] = set()
    for e in (e for e in errors if e not in needed):
        loc = tuple(x for x in e["loc"] if not _is_type_tag(x))
        if loc in seen:  # one line per key, not one per member of a union
            continue
        seen.add(loc)
        name = _loc_text(loc) or "(top level)"
        if e["type"] == "extra_forbidden":
            section = _section_model(loc[:-1])
            valid = ", ".join(_field_names(section)) if section else ""
            parts.append(f"unknown key '{name}'" + (f" (valid here: {valid})" if valid else ""))
            continue
        msg = " ".join(str(e["msg"]).removeprefix("Value error, ").split())
        given = e.get("input")
        shown = "" if isinstance(given, (dict, list)) or e["type"] == "missing" else f" {_short(given)}"
        accepted = _accepted(loc, e.get("ctx") or {})
        if accepted:
            parts.append(f"{name}{shown} is out of range: accepted {accepted}")
        elif e["type"] == "missing":
            parts.append(f"{name} is missing")
        elif loc == ("model",):
            parts.append(f"model{shown or ' ' + _short(given)}: give a model folder, its config.json, a Hub id or "
                         "alias, or an inline config mapping")
        elif e["type"] in ("bool_parsing", "bool_type"):
            parts.append(f"{name}{shown}: give true or false")
        elif e["type"].startswith("value_error"):  # a validator's own sentence names the value
            parts.append(f"{name}: {msg}")
        else:
            parts.append(f"{name}{shown}: {msg[:1].lower() + msg[1:]}")
    return f"invalid run config {source}: " + "; ".join(parts) + (f"; it also needs {keys}" if needed else "")


def _is_type_tag(part: Any) -> bool:
    """A union member's tag in a pydantic error location (``model``'s 'str', 'dict[str,any]'), not a key."""
    return isinstance(part, str) and (part in _TYPE_TAGS or "[" in part)


def _loc_text(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _short(value: Any, limit: int = 60) -> str:
    text = " ".join(repr(value).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _accepted(loc: tuple[Any, ...], ctx: dict[str, Any]) -> str:
    """'above 0', 'from 0 to 1', '2 or more' for a numeric bound error: the field's whole range ('' if none)."""
    bounds = {k: v for k, v in ctx.items() if k in ("ge", "gt", "le", "lt")}
    if not bounds:
        return ""
    section = _section_model(loc[:-1]) if loc and isinstance(loc[-1], str) else None
    field = section.model_fields.get(str(loc[-1])) if section is not None else None
    for meta in field.metadata if field is not None else ():
        for k in ("ge", "gt", "le", "lt"):
            if getattr(meta, k, None) is not None:
                bounds.setdefault(k, getattr(meta, k))
    low, high = bounds.get("ge", bounds.get("gt")), bounds.get("le", bounds.get("lt"))
    if low is not None and high is not None:
        if "gt" not in bounds and "lt" not in bounds:
            return f"from {low:g} to {high:g}"
        return f"in {'(' if 'gt' in bounds else '['}{low:g}, {high:g}{')' if 'lt' in bounds else ']'}"
    if low is not None:
        return f"above {low:g}" if "gt" in bounds else f"{low:g} or more"
    return f"below {high:g}" if "lt" in bounds else f"{high:g} or less"


def _field_names(model: type[Frozen]) -> list[str]:
    return [f.alias or name for name, f in model.model_fields.items()]


def _section_model(loc: tuple[Any, ...]) -> type[Frozen] | None:
    model: type[Frozen] = RunConfig
    for key in loc:
        if isinstance(key, int):
            continue
        field = model.model_fields.get(str(key))
        if field is None:
            return None
        ann = field.annotation
        candidates = [a for a in getattr(ann, "__args__", (ann,)) if isinstance(a, type) and issubclass(a, Frozen)]
        if not candidates:
            return None
        model = candidates[0]
    return model


def parse_run_config(data: dict[str, Any], source: str = "(dict)") -> RunConfig:
    """Validate a mapping into a RunConfig; InvalidConfigError names each bad or unknown key."""
    if not isinstance(data, dict):
        raise InvalidConfigError(f"run config {source} must be a mapping of sections, got {type(data).__name__}")
    try:
        return RunConfig.model_validate(_with_model_lora_targets(data))
    except ValidationError as err:
        raise InvalidConfigError(_format_error(err, source)) from err


def read_run_yaml(path: str | Path) -> dict[str, Any]:
    """The mapping a YAML (or JSON) run config file holds, relative model/data paths resolved against its folder,
    not yet validated (a template or an override file may name neither model nor data). InvalidConfigError, one
    line, for a missing, unreadable, binary or malformed file, or one that is not a mapping."""
    p = Path(path)
    if not p.is_file():
        what = "is not a file" if p.exists() else "does not exist"
        raise InvalidConfigError(f"run config {p} {what}: pass the path of a YAML file (see `aegis run --help`)")
    try:
        text = p.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise InvalidConfigError(
            f"run config {p} is not a text file (byte {err.start} is not UTF-8): pass a YAML file of run settings"
        ) from None
    except OSError as err:
        raise InvalidConfigError(f"cannot read run config {p}: {err.strerror or err}") from None
    if "\x00" in text:
        raise InvalidConfigError(f"run config {p} is not a text file (it holds NUL bytes): pass a YAML file of run settings")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise InvalidConfigError(f"run config {p} is not valid YAML: {problem}{where}") from None
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise InvalidConfigError(
            f"run config {p} must be a mapping of sections (model:, data:, training: ...), got {type(data).__name__}"
        )
    for key in ("model", "data"):
        value = data.get(key)
        if isinstance(value, str) and not Path(value).is_absolute():
            local = p.parent / Path(value).expanduser()
            if local.exists() or value.startswith((".", "~")):  # a Hub id or a `datasets` id stays as written
                data[key] = str(local.resolve())
    return data


def load_run_config(path: str | Path) -> RunConfig:
    """Read and validate a YAML (or JSON) run config; relative model/data paths resolve against its folder."""
    return parse_run_config(read_run_yaml(path), str(path))


def _with_model_lora_targets(data: Any) -> Any:
    """``data`` with the model's own default LoRA targets written into every LoRA/QLoRA tier that names none, as the
    planner chooses them (`aegis.schema.default_lora_targets`: Phi's dense/fc1/fc2, StarCoder2's c_fc/c_proj, Phi-3's
    fused projections), so a run adapts what its plan sized; written once, when the config is read, so a resumed run
    keeps them. A model that cannot be read here is left to the engine's own error."""
    if not isinstance(data, dict) or not isinstance(data.get("model"), str) or not _untargeted_tiers(data):
        return data
    from aegis.errors import AegisError
    from aegis.models.resolve import resolve_model
    from aegis.schema import default_lora_targets

    try:
        targets = default_lora_targets(resolve_model(data["model"]).linear_modules)
    except AegisError:
        return data
    data = copy.deepcopy(data)  # the caller's mapping stays as given
    for tier in _untargeted_tiers(data):
        lora = tier.get("lora")
        tier["lora"] = {**(lora if isinstance(lora, dict) else {}), "target_modules": list(targets)}
    return data


def _untargeted_tiers(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The LoRA/QLoRA tiers (train_config, fallbacks) of a run-config mapping that name no target_modules."""
    tiers = [data.get("train_config"), *(data.get("fallbacks") or [])]
    return [t for t in tiers if isinstance(t, dict) and t.get("method", "lora") != "full"
            and not (isinstance(t.get("lora"), dict) and "target_modules" in t["lora"])]


def run_config_from_report(
    report: PlanReport, sections: dict[str, Any] | None = None, *, source: str | None = None
) -> RunConfig:
    """The one plan -> run translation, used by ``aegis run --plan``, chat and Slack alike.

    From the plan: its model (a local folder made absolute, else the canonical Hub id; weights are loaded when the
    run starts), its dataset, its recommended config (method, precision, seq len, LoRA rank and targets) and
    fallback chain, the mesh of its multi-GPU section (``parallel``: data ranks for DDP, fsdp ranks for FSDP), and
    ``total_steps`` = the plan's epochs over its dataset rows at the global batch (micro batch
    x accumulation x the plan's GPUs), as transformers' Trainer counts them for the emitted script, and
    ``training.packing`` (with ``packing_reason``) = the plan's packing decision, the one ``aegis plan --emit``
    writes (axolotl's ``sample_packing``; :func:`aegis.recipe.packing_choice`). The learning
    rate, warm-up, cosine floor, clip and seed are the recipe's for the method (:mod:`aegis.recipe`), the values
    the emitted scripts use. ``sections`` (a run YAML's or a chat template's mapping) wins over all of this:
    supervision sections, a ``training`` key given there, or its ``model``/``data``/``train_config``.

    NothingFitsError when the plan has no recommended config; DatasetError when neither the plan nor
    ``sections`` names a dataset; InvalidConfigError (one line) for a bad section."""
    where = source or f"of the plan for {report.request.model or report.model.model_id}"
    if report.recommended is None:
        why = " ".join((report.nothing_fits or "").split()).rstrip(".")
        raise NothingFitsError(
            "the plan has no configuration that fits, so there is nothing to run"
            + (f" ({why})" if why else "") + "; re-plan with QLoRA, a shorter seq len, a larger GPU or more GPUs"
        )
    data = copy.deepcopy(dict(sections or {}))
    data.setdefault("model", plan_model(report))
    if "data" not in data:
        if not report.request.dataset:
            raise DatasetError(
                f"the plan for {report.request.model or report.model.model_id} names no dataset, so there is nothing "
                "to train on: plan it with one ('... with ./train.jsonl'), or give `data:` in the run config"
            )
        data["data"] = local_or_id(report.request.dataset)
    data.setdefault("train_config", report.recommended.config.model_dump(mode="json"))
    data.setdefault("fallbacks", [t.config.model_dump(mode="json") for t in report.fallbacks])
    if report.multi_gpu is not None and report.multi_gpu.parallel:
        data.setdefault("parallel", dict(report.multi_gpu.parallel))  # the plan's mesh: data (DDP) or fsdp ranks
    training = data.get("training")
    training = dict(training) if isinstance(training, dict) else training
    if isinstance(training, dict) or training is None:
        training = training or {}
        tier0 = data["train_config"]
        if "total_steps" not in training and report.num_rows and isinstance(tier0, (dict, TrainConfig)):
            tier0 = tier0 if isinstance(tier0, TrainConfig) else _tier_or_none(tier0)
            if tier0 is not None:
                micro = training.get("batch_size") or tier0.micro_batch_size
                if isinstance(micro, int) and micro >= 1:
                    training["total_steps"] = steps_for_epochs(
                        report.num_rows, report.epochs, micro, tier0.gradient_accumulation_steps, report.gpu_count
                    )
        if "packing" not in training and "length_buckets" not in training:  # the plan's layout, as --emit writes it
            ds = report.dataset
            training["packing"], training["packing_reason"] = packing_choice(
                *((ds.packing_efficiency, ds.padding_waste, ds.seq_len) if ds is not None else (None, None, None))
            )
        data["training"] = training
    return parse_run_config(data, where)


def _tier_or_none(entry: dict[str, Any]) -> TrainConfig | None:
    try:
        return TrainConfig.model_validate(entry)
    except ValidationError:
        return None  # RunConfig's validation names the bad key


def run_config_from_plan(
    plan_path: str | Path, overrides: dict[str, Any] | None = None, *, source: str | None = None
) -> RunConfig:
    """``aegis run --plan``: the plan JSON (`aegis plan --json`) read as a PlanReport and translated by
    :func:`run_config_from_report`; ``overrides`` (the sections of ``--config``) win as they do there. ``source``
    names the config in errors (default: the plan's path)."""
    p = Path(plan_path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InvalidConfigError(f"plan {p} does not exist; write one with `aegis plan ... --json > plan.json`") from None
    except (OSError, UnicodeDecodeError) as err:
        why = "it is not a text file" if isinstance(err, UnicodeDecodeError) else (err.strerror or str(err))
        raise InvalidConfigError(f"cannot read plan {p}: {why}; write one with `aegis plan ... --json > plan.json`") from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as err:
        raise InvalidConfigError(
            f"plan {p} is not JSON ({err.msg} at line {err.lineno}); write one with `aegis plan ... --json > plan.json`"
        ) from None
    if not isinstance(raw, dict) or "recommended" not in raw:
        raise InvalidConfigError(f"plan {p} has no 'recommended' configuration; write it with `aegis plan ... --json`")
    if raw["recommended"] is None:
        raise NothingFitsError(f"plan {p} has no configuration that fits (nothing_fits); re-plan with a larger GPU")
    try:
        report = PlanReport.model_validate(raw)
    except ValidationError as err:
        first = err.errors()[0]
        raise InvalidConfigError(
            f"plan {p} is not a plan Aegis wrote ({_loc_text(tuple(first['loc'])) or 'top level'}: "
            f"{' '.join(str(first['msg']).split())}); write it again with `aegis plan ... --json > {p.name}`"
        ) from None
    return run_config_from_report(report, overrides, source=source or str(p))


def local_or_id(spec: str) -> str:
    """A local path made absolute (from the working folder); a Hub or `datasets` id as written."""
    from aegis.access import looks_like_path

    p = Path(spec).expanduser()
    return str(p.resolve()) if looks_like_path(spec) or p.exists() else spec


def plan_model(report: PlanReport) -> str:
    """The planned model as a run's ``model``: the user's folder made absolute, else the canonical Hub id."""
    from aegis.access import looks_like_path

    spec = report.request.model or report.model.model_id
    local = looks_like_path(spec) or Path(spec).expanduser().exists()
    return local_or_id(spec) if local else report.model.model_id
