"""Run configuration of a supervised training run: the YAML keys of spec §10.3, validated by pydantic.

A run config says what to train (model config, data, the plan's train config and its fallback
chain) and how to supervise it (window size, anomaly thresholds, outlier rules, retries,
checkpoints, curriculum, notifications). Unknown keys are rejected with an error naming the key
and the valid ones.

    from aegis.supervise.config import load_run_config
    cfg = load_run_config("run.yaml")          # RunConfig; InvalidConfigError on bad input
    cfg.training.steps_per_window               # 100

A minimal YAML::

    model: tiny-llama            # bundled tiny llama, a path to a config.json, or an inline mapping
    data: toy                    # bundled toy JSONL, or a path to a JSONL file
    train_config: {method: full, micro_batch_size: 8, seq_len: 64}
    fallbacks: [{method: full, micro_batch_size: 4, seq_len: 64}]
    training: {steps_per_window: 50, total_steps: 200, lr: 1.0e-3, grad_clip: 1.0}
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from aegis.errors import InvalidConfigError
from aegis.schema import Frozen, TrainConfig

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
    "run_config_from_plan",
]


class TrainingSection(Frozen):
    """How the run trains: windows, length, optimiser knobs."""

    steps_per_window: int = Field(default=100, ge=1, description="Optimizer steps per Train window (K).")
    total_steps: int = Field(default=1000, ge=1, description="Optimizer steps of the whole run.")
    batch_size: int | None = Field(
        default=None, ge=1, description="Micro batch size; overrides train_config.micro_batch_size when set."
    )
    lr: float = Field(default=1e-4, gt=0, description="Peak learning rate.")
    grad_clip: float = Field(default=1.0, gt=0, description="Global gradient-norm clipping threshold.")
    seed: int = Field(default=0, description="Seed of weight initialisation and data order.")
    warmup_steps: int = Field(default=0, ge=0, description="Linear LR warmup steps.")
    min_lr_ratio: float = Field(
        default=0.1, ge=0, le=1, description="Cosine decay ends at this share of the LR (1.0: constant LR)."
    )

    @field_validator("lr", "grad_clip")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("must be a finite number")
        return v


class MonitoringSection(Frozen):
    """Anomaly rules the Monitor applies to every step's metrics."""

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

    max_retries: int = Field(default=3, ge=0, description="Automatic repairs in a row before escalating.")
    lr_factor: float = Field(default=0.5, gt=0, lt=1, description="Strategy B multiplies the LR by this.")
    clip_factor: float = Field(default=0.5, gt=0, lt=1, description="Strategy B multiplies the clip norm by this.")


class CheckpointsSection(Frozen):
    """Orbax checkpointing."""

    model_config = Frozen.model_config | {"populate_by_name": True}

    interval: int = Field(default=100, ge=1, description="Save every this many steps (and at each window end).")
    keep_last_n: int = Field(default=3, ge=2, description="Checkpoints kept; at least 2 so a corrupt one has a fallback.")
    async_save: bool = Field(default=True, alias="async", description="Write checkpoints in the background.")


class CurriculumSection(Frozen):
    """Per-domain evaluation and mixing-weight adjustment."""

    eval_interval: int = Field(default=1000, ge=1, description="Evaluate every domain every this many steps.")
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
        default="tiny-llama",
        description="The model to fine-tune: a Hugging Face model folder (config.json, safetensors, tokenizer), a "
        "config.json inside one, a Hub id in the local cache, or a bundled alias; 'tiny-llama' or an inline "
        "config dict for the demo and tests (random weights, byte tokens).",
    )
    data: str = Field(
        default="toy",
        description="The dataset: a JSONL/JSON/CSV/Parquet file or a `datasets` id, in any format the planner "
        "detects (Alpaca, ShareGPT, messages, prompt/completion, text); 'toy' for the bundled demo data.",
    )
    init: Literal["pretrained", "random"] = Field(
        default="pretrained",
        description="'pretrained': load the model folder's weights (an error when it has none); 'random': "
        "initialise from config.json only. Inline configs and 'tiny-llama' are always random.",
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


def _format_error(err: ValidationError, source: str) -> str:
    parts = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"]) or "(top level)"
        if e["type"] == "extra_forbidden":
            section = _section_model(e["loc"][:-1])
            valid = ", ".join(_field_names(section)) if section else ""
            parts.append(f"unknown key '{loc}'" + (f" (valid here: {valid})" if valid else ""))
        else:
            parts.append(f"{loc}: {e['msg']}")
    return f"invalid run config {source}: " + "; ".join(parts)


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


def load_run_config(path: str | Path) -> RunConfig:
    """Read a YAML (or JSON) run config; relative model/data paths resolve against its folder."""
    p = Path(path)
    if not p.is_file():
        raise InvalidConfigError(f"run config {p} does not exist: pass the path of a YAML file (see `aegis run --help`)")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as err:
        raise InvalidConfigError(f"run config {p} is not valid YAML: {err}".splitlines()[0]) from err
    data = data or {}
    if isinstance(data, dict):
        for key in ("model", "data"):
            value = data.get(key)
            if isinstance(value, str) and value not in ("tiny-llama", "toy") and not Path(value).is_absolute():
                local = p.parent / Path(value).expanduser()
                if local.exists() or value.startswith((".", "~")):  # a Hub id or a `datasets` id stays as written
                    data[key] = str(local.resolve())
    return parse_run_config(data, str(p))


def _with_model_lora_targets(data: Any) -> Any:
    """``data`` with the model's own default LoRA targets written into every LoRA/QLoRA tier that names none, as the
    planner chooses them (`aegis.schema.default_lora_targets`: Phi's dense/fc1/fc2, StarCoder2's c_fc/c_proj, Phi-3's
    fused projections), so a run adapts what its plan sized; written once, when the config is read, so a resumed run
    keeps them. A model that cannot be read here is left to the engine's own error."""
    if not isinstance(data, dict) or not isinstance(data.get("model"), str) or not _untargeted_tiers(data):
        return data
    from aegis.errors import AegisError
    from aegis.hub import resolve_model
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


def run_config_from_plan(plan_path: str | Path, overrides: dict[str, Any] | None = None) -> RunConfig:
    """A RunConfig whose train config and fallback chain come from a plan JSON (`aegis plan --json`).

    The plan must hold ``recommended`` (a TrainConfig, or a tier with a ``config`` TrainConfig)
    and optionally ``fallbacks`` (a list of the same); ``overrides`` supplies the other sections.
    Without ``model``/``data`` overrides, the plan request's model (a local folder, made absolute, or its
    Hub id: its weights are loaded when the run starts) and dataset are used.
    """
    p = Path(plan_path)
    try:
        plan = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise InvalidConfigError(f"cannot read plan {p}: {err}; write one with `aegis plan ... --json > plan.json`") from err

    def as_config(entry: Any) -> Any:
        return entry.get("config", entry) if isinstance(entry, dict) and "config" in entry else entry

    if not isinstance(plan, dict) or "recommended" not in plan:
        raise InvalidConfigError(f"plan {p} has no 'recommended' configuration; write it with `aegis plan --json`")
    if plan["recommended"] is None:
        raise InvalidConfigError(f"plan {p} has no configuration that fits (nothing_fits); re-plan with a larger GPU")
    data = dict(overrides or {})
    request = plan.get("request") or {}
    if "model" not in data and request.get("model"):
        model = str(request["model"])
        data["model"] = str(Path(model).expanduser().resolve()) if Path(model).expanduser().exists() else model
    if "data" not in data and request.get("dataset"):
        dataset = str(request["dataset"])
        data["data"] = str(Path(dataset).expanduser().resolve()) if Path(dataset).expanduser().exists() else dataset
    data["train_config"] = as_config(plan["recommended"])
    data["fallbacks"] = [as_config(f) for f in plan.get("fallbacks", [])]
    return parse_run_config(data, str(p))
