"""Trainer configs for a plan's recommended tier: an axolotl YAML, a Hugging Face script, an Unsloth script.

The templates live in ``aegis/planning/report/templates/*.j2`` (jinja2, imported only here and only when
called); hyper-parameters a plan does not decide (learning rate, scheduler, warm-up, grad clip, seed)
are the one recipe's (:mod:`aegis.recipe`, which runs read too), and each trainer's names for optimizers and
attention come from ``templates/defaults.json``. What the plan decided — micro batch,
grad accumulation, seq len, checkpointing, optimizer, LoRA settings, precision, attention —
is written as the plan says, with the plan's predicted memory in the header comment.

    from aegis.planning.report import emit
    Path("axolotl.yaml").write_text(emit(report, "axolotl"))
    Path("train_hf.py").write_text(emit(report, "hf"))
    Path("train_unsloth.py").write_text(emit(report, "unsloth"))
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from pathlib import PurePosixPath
from typing import Any, Literal, get_args

from aegis.errors import InvalidConfigError, NothingFitsError
from aegis.recipe import packing_choice, recipe
from aegis.planning.report._sections import stack_text
from aegis.planning.report.format import config_diff, format_bytes, format_bytes_range
from aegis.schema import PlanReport

__all__ = ["EmitKind", "EMIT_KINDS", "emit", "emit_filename", "emit_defaults"]

EmitKind = Literal["axolotl", "hf", "unsloth"]
EMIT_KINDS: tuple[str, ...] = get_args(EmitKind)
_TEMPLATES = {"axolotl": "axolotl.yaml.j2", "hf": "hf_train.py.j2", "unsloth": "unsloth_train.py.j2"}
_FILENAMES = {"axolotl": "axolotl.yaml", "hf": "train_hf.py", "unsloth": "train_unsloth.py"}
_DS_TYPES = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}


@lru_cache(maxsize=1)
def emit_defaults() -> dict[str, Any]:
    """The emitters' own settings (``templates/defaults.json``: logging, output folder, optimizer and attention
    names); training hyper-parameters are :func:`aegis.recipe.recipe`'s."""
    text = resources.files("aegis.planning.report").joinpath("templates", "defaults.json").read_text(encoding="utf-8")
    return json.loads(text)


def emit_filename(kind: EmitKind) -> str:
    """The file name the CLI writes an emitted config to."""
    return _FILENAMES[kind]


@lru_cache(maxsize=1)
def _environment() -> Any:
    import jinja2

    def load(name: str) -> str:
        return resources.files("aegis.planning.report").joinpath("templates", name).read_text(encoding="utf-8")

    env = jinja2.Environment(
        loader=jinja2.FunctionLoader(load),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    env.filters["py"] = repr
    env.filters["js"] = lambda v: json.dumps(v, ensure_ascii=False)
    return env


def _dataset_context(report: PlanReport) -> dict[str, Any] | None:
    source = (report.dataset.source if report.dataset else None) or report.request.dataset
    if not source:
        return None
    suffix = PurePosixPath(source).suffix.lower()
    return {
        "path": source,
        "format": report.dataset.format if report.dataset else "messages",
        "format_known": report.dataset is not None,
        "ds_type": _DS_TYPES.get(suffix),
    }


def _precision(precision: str, method: str, autocast: bool) -> dict[str, Any]:
    """Trainer flags and dtypes of a precision mode. Mixed modes load fp32 master weights for full fine-tuning;
    LoRA's frozen base loads in the 16-bit compute dtype (the memory model sizes it at 2 bytes), PEFT keeps the
    adapters fp32 and the Trainer's autocast (and, for fp16, its loss scaler) does the rest. A plan sized without
    autocast (a plain PEFT loop's, or ``autocast=False``, on bf16) gets neither flag: the bf16 model trains as
    loaded, as the plan sized it."""
    compute = {"bf16": "bfloat16", "bf16_mixed": "bfloat16", "fp16_mixed": "float16", "fp32": "float32"}[precision]
    mixed_full = method == "full" and precision in ("bf16_mixed", "fp16_mixed")
    return {
        "bf16": precision in ("bf16", "bf16_mixed") and autocast,
        "fp16": precision == "fp16_mixed",
        "load_dtype": "float32" if mixed_full else compute,
        "compute_dtype": compute,
    }


def _packing(report: PlanReport) -> tuple[bool, str]:
    ds = report.dataset  # the rule is the recipe's, shared with `aegis run --plan` (training.packing)
    if ds is None:
        return packing_choice(None, None, None)
    return packing_choice(ds.packing_efficiency, ds.padding_waste, ds.seq_len)


def _one_line(text: str) -> str:
    """Text safe in a YAML comment and a Python docstring: one line, no backslashes or triple quotes."""
    return " ".join(text.split()).replace("\\", "/").replace('"' * 3, "'" * 3)


def _context(report: PlanReport) -> dict[str, Any]:
    tier = report.recommended
    if tier is None:
        raise NothingFitsError(
            "nothing to emit: no configuration of this plan fits. "
            + (report.nothing_fits or "Try QLoRA, a shorter seq len, a larger GPU or more GPUs.")
        )
    cfg, mem = tier.config, tier.memory
    defaults, training = emit_defaults(), recipe()
    lora = cfg.lora_config if cfg.method != "full" else None
    packing, packing_reason = _packing(report)
    model_name = report.model.model_id.rstrip("/").split("/")[-1]
    multi = report.multi_gpu if report.gpu_count > 1 else None
    fsdp = multi is not None and multi.assumed == "fsdp"
    deepspeed = multi.deepspeed if multi is not None and multi.assumed == "deepspeed" else None
    fallbacks = [
        f"{i}. {config_diff(cfg, t.config)} -> {format_bytes(t.memory.total_bytes, 1)} ({t.summary})"
        for i, t in enumerate(report.fallbacks, 1)
    ]
    return {
        "model_id": report.model.model_id,
        "architecture": report.model.architecture,
        "decoder_layer_cls": report.model.architecture.replace("ForCausalLM", "DecoderLayer"),
        "method": cfg.method,
        "cfg": cfg,
        "lora": lora,
        # PEFT reads "all-linear" only as the bare string (a list would name a module "all-linear")
        "target_modules": ("all-linear" if "all-linear" in lora.target_modules else list(lora.target_modules)) if lora else [],
        "dataset": _dataset_context(report),
        "epochs": report.epochs,
        "learning_rate": training.lr(cfg.method),
        "lr_scheduler": training.lr_scheduler,
        "warmup_ratio": training.warmup_ratio,
        "max_grad_norm": training.max_grad_norm,
        "logging_steps": defaults["logging_steps"],
        "seed": training.seed,
        "optimizer_name": defaults["optimizer_names"][cfg.optimizer],
        "attn_implementation": defaults["attn_implementation"][cfg.attention],
        "output_dir": f"{defaults['output_root']}/{model_name}-{cfg.method}",
        "packing": packing,
        "packing_reason": _one_line(packing_reason),
        "gpu_name": report.gpu.name,
        "gpu_count": report.gpu_count,
        "multi_gpu": multi,
        "predicted": f"{format_bytes(mem.total_bytes)} ({format_bytes_range(mem.low_bytes, mem.high_bytes)})"
                     + (f", {format_bytes(mem.reserved_bytes)} reserved by the allocator" if mem.reserved_bytes else ""),
        "expandable_segments": mem.expandable_segments,
        "headroom": format_bytes(tier.headroom_bytes, 1),
        "summary": _one_line(tier.summary),
        "fallbacks": [_one_line(f) for f in fallbacks],
        "stack_label": _one_line(stack_text(report)),
        "stack": report.stack,
        "fsdp": fsdp,
        # the ZeRO plan's deepspeed= dict (`aegis.planning.memory.zero_stages.hf_deepspeed_config`): its buckets
        "deepspeed": deepspeed,
        "zero_stage": multi.zero_stage if deepspeed else None,
        # sharded QLoRA is planned without k-bit preparation (`aegis.planning.memory.estimate.FSDP_QLORA_NOTE`,
        # `ZERO_QLORA_NOTE`)
        "kbit_prep": report.stack.kbit_prep_effective and not ((fsdp or deepspeed) and cfg.method == "qlora"),
        "use_reentrant": report.stack.checkpointing == "reentrant",
        **_precision(cfg.precision, cfg.method, cfg.autocast_effective),
        # DeepSpeed's bf16 needs the Trainer's bf16=True (accelerate then leaves mixed precision to the engine)
        **({"bf16": True} if deepspeed else {}),
    }


_EMITTED_TRAINERS = {"hf": ("hf", "trl", "peft"), "axolotl": ("axolotl",), "unsloth": ("unsloth",)}
"""Planned trainers whose memory each emitted config reproduces (the HF script follows the planned k-bit prep
and checkpointing, so it stands in for TRL and a plain PEFT loop)."""


def _stack_warning(report: PlanReport, kind: EmitKind) -> str:
    """A line when the emitted trainer is not the one the plan was sized for ('' when it is)."""
    planned = report.stack.trainer
    if planned in _EMITTED_TRAINERS[kind]:
        return ""
    return (f"the plan was sized for {planned}, this config runs {kind}: memory differs (k-bit prep, checkpointing, "
            f"loss kernels); re-plan with --trainer {'hf' if kind == 'hf' else kind} for numbers that match")


def emit(report: PlanReport, kind: EmitKind) -> str:
    """A ready-to-run config or script (``kind``: axolotl, hf, unsloth) for the recommended tier.

    Raises NothingFitsError when the plan has no recommended tier, InvalidConfigError for an
    unknown kind.
    """
    if kind not in _TEMPLATES:
        raise InvalidConfigError(f"unknown emitter {kind!r}: choose one of {', '.join(EMIT_KINDS)}")
    context = _context(report)
    if context["deepspeed"] and kind != "hf":
        raise InvalidConfigError(f"this plan runs DeepSpeed ZeRO-{context['zero_stage']} under the HF Trainer: --emit hf "
                                 f"writes it with its deepspeed= config ({kind} is not emitted for DeepSpeed plans)")
    context["stack_warning"] = _one_line(_stack_warning(report, kind))
    return _environment().get_template(_TEMPLATES[kind]).render(**context)
