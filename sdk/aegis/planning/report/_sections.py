"""A `PlanReport` laid out as sections of labelled lines, each with its reason: what every renderer draws.

The text, Markdown and Slack renderers only style what this module decides to say, so the three
always show the same figures with the same reasons. Figures that several sections state (dtypes,
batch, totals, headroom) are read from `aegis.planning.report._facts.plan_facts`, computed once per plan. The
layout's types live in `_layout`; the sections about the request's inputs (model, dataset, hardware) in `_inputs`.

By default the sections are compact: every decision and number, reasons left out. With
``explain=True`` every figure carries its formula and reason (the breakdown's "How" column).

    from aegis.planning.report._sections import build_sections
    for section in build_sections(report, explain=False):
        print(section.title, section.subtitle)
        for item in section.items: ...      # Line (label, value, reason) or Table (breakdown rows)
"""

from __future__ import annotations

from aegis.planning.memory._dtypes import placement
from aegis.planning.report._facts import (
    DtypeFacts,
    PlanFacts,
    batch_facts,
    breakdown_tier,
    dtype_facts,
    memory_facts,
    plan_facts,
    tiers,
)
from aegis.planning.report._inputs import (
    dataset_brief,
    dataset_section,
    hardware_brief,
    hardware_section,
    model_brief,
    model_section,
)
from aegis.planning.report._layout import Level, Line, Row, Section, Table
from aegis.planning.report.format import (
    config_diff,
    format_bytes,
    format_bytes_range,
    format_hours_range,
    format_int,
    format_params,
    format_rate,
    format_share,
    format_usd,
    method_label,
    method_short,
    optimizer_label,
    targets_label,
)
from aegis.planning.solver import AGGRESSIVE_OMITTED as _AGGRESSIVE_OMITTED
from aegis.schema import Cost, MemoryComponent, PlanReport, Tier, TrainConfig

__all__ = ["build_sections", "breakdown_tier", "stack_text", "tiers"]

_EIGHT_BIT = ("adamw_8bit", "paged_adamw_8bit")
_ATTENTION_REASONS = {
    "eager": "eager attention materialises batch x heads x seq^2 scores",
    "sdpa": "PyTorch SDPA keeps no seq^2 score matrix",
    "flash": "FlashAttention keeps no seq^2 score matrix",
}


def _gb1(n: int) -> str:
    return format_bytes(n, 1)


def _effective(report: PlanReport, cfg: TrainConfig) -> int:
    return batch_facts(report, cfg).effective


def _batch_text(report: PlanReport, cfg: TrainConfig) -> str:
    b = batch_facts(report, cfg)
    return f"Micro batch: {b.micro} | Grad accum: {b.accum} | Effective: {b.effective}"


def _dtypes_text(d: DtypeFacts) -> str:
    """Where every tensor lives, in words (the same facts the method label and the breakdown rows state)."""
    parts = [f"base weights {d.base}"]
    if d.adapters:
        parts.append(f"adapters {d.adapters}")
    parts += [f"gradients {d.gradients}", f"optimizer states {d.optimizer}", f"activations {d.activations}"]
    return ", ".join(parts)


def _component_name(c: MemoryComponent, d: DtypeFacts) -> str:
    """A breakdown row's name, its dtype stated from the plan's facts."""
    if c.key == "weights":
        return f"Base model ({d.base})"
    if c.key == "adapters" and d.adapters:
        return f"LoRA adapters ({d.adapters})"
    if c.key == "optimizer":
        inner = c.name.removeprefix("Optimizer states (").removesuffix(")")
        said = "," in inner or d.optimizer in inner  # the ZeRO row names its dtype itself; 'AdamW 8-bit' says it
        return f"Optimizer states ({inner}, {d.optimizer})" if d.optimizer != "none" and not said else c.name
    if c.key == "gradients":
        return f"Gradients ({d.gradients})"
    return c.name


def _gpu_short(report: PlanReport) -> str:
    return report.gpu.name.removeprefix("NVIDIA ").removeprefix("GeForce ").removeprefix("AMD ")


# --- sections -------------------------------------------------------------------------------


def _training(report: PlanReport, facts: PlanFacts, explain: bool) -> Section:
    if not explain:
        return _training_brief(report, facts)
    return _training_explained(report, facts)


def _lora(report: PlanReport):
    if report.method == "full":
        return None
    return report.lora or (report.recommended.config.lora_config if report.recommended else None)


_TRAINER_NAMES = {"hf": "HF Trainer", "trl": "TRL SFTTrainer", "peft": "plain PEFT loop", "axolotl": "axolotl",
                  "unsloth": "Unsloth"}


def stack_text(report: PlanReport) -> str:
    """The stack a plan was sized for, each part with where it came from: (given), (detected), nothing for a default."""
    st, src = report.stack, report.stack_source

    def origin(key: str) -> str:
        return f" ({src[key]})" if src.get(key, "default") != "default" else ""

    parts = [_TRAINER_NAMES[st.trainer] + origin("trainer"), f"transformers {st.transformers_version}" + origin("transformers_version")]
    sharded = report.multi_gpu is not None and report.gpu_count > 1 and report.multi_gpu.assumed in ("fsdp", "deepspeed")
    if report.method == "qlora" and sharded and st.kbit_prep_effective:  # `aegis.planning.memory.estimate.FSDP_QLORA_NOTE`
        parts.append("no k-bit prep under FSDP (TRL and axolotl skip it when sharding): bf16 embeddings/head/norms"
                     if report.multi_gpu.assumed == "fsdp" else  # `ZERO_QLORA_NOTE`
                     "no k-bit prep under DeepSpeed (the engine casts every float parameter to bf16)")
    tier = report.recommended or (report.fallbacks[0] if report.fallbacks else None)
    if report.method == "qlora" and not (sharded and st.kbit_prep_effective):
        if not st.kbit_prep_effective:
            kbit = "no k-bit prep: bf16 embeddings/head/norms"
        elif tier is not None and placement(tier.config).embedding_bytes == 2:
            kbit = "k-bit prep: fp32 norms, bf16 embeddings/head (TRL casts them back under bf16=True)"
        else:
            kbit = "k-bit prep: fp32 embeddings/head/norms"
        parts.append(kbit + origin("kbit_prep"))
    if tier is not None and tier.config.autocast_effective:  # the Trainer's bf16/fp16 flag: accelerate's autocast
        dt = "fp16" if tier.config.precision == "fp16_mixed" else "bf16"
        parts.append(f"{dt}=True: {dt} autocast")
    if report.multi_gpu is not None and report.multi_gpu.assumed == "deepspeed":
        parts.append(f"DeepSpeed ZeRO-{report.multi_gpu.zero_stage} (HF's ds_config_zero{report.multi_gpu.zero_stage}"
                     ".json, 'auto' buckets), bf16 without autocast")
    if st.liger:
        parts.append("Liger kernels")
    if st.checkpointing != "non_reentrant":
        parts.append(f"{st.checkpointing} checkpointing")
    return ", ".join(parts)


def _stack_changes(report: PlanReport) -> list[str]:
    """What the stack profile changed in the recommended tier's estimate (the engine says, `MemoryEstimate.stack_notes`)."""
    tier = report.recommended or (report.fallbacks[0] if report.fallbacks else None)
    return list(tier.memory.stack_notes) if tier is not None else []


def _training_brief(report: PlanReport, facts: PlanFacts) -> Section:
    cfg = facts.tier.config if facts.tier else None
    total = report.model.total_params
    share = format_share(report.trainable_params / total) if total else "n/a"
    items: list[Line | Table] = [
        Line("", f"Method: {method_label(report.method, cfg)} | Trainable: {format_params(report.trainable_params)} / "
                 f"{format_params(total)} parameters ({share})"),
        Line("", f"Stack: {stack_text(report)}"),
    ]
    lora = _lora(report)
    if lora is not None:
        items.append(
            Line("", f"LoRA: rank {lora.rank}, alpha {lora.alpha:g}, dropout {lora.dropout:g}, targets: "
                     f"{targets_label(lora.target_modules, report.model.lora_names)}")
        )
    rec = report.recommended
    if report.num_rows is not None and report.steps_per_epoch is not None:
        eff = f"effective batch {_effective(report, rec.config)}" if rec else "the effective batch"
        total_steps = round(report.steps_per_epoch * report.epochs)
        items.append(
            Line("", f"Steps: {format_int(report.steps_per_epoch)} optimizer steps per epoch ({format_int(report.num_rows)} "
                     f"rows / {eff}) x {report.epochs:g} epochs = {format_int(total_steps)} steps")
        )
    elif report.num_rows is None:
        items.append(Line("", f"Data: no dataset given | {report.epochs:g} epochs"))
    return Section("training", "What you're training", "", tuple(items))


def _training_explained(report: PlanReport, facts: PlanFacts) -> Section:
    cfg = facts.tier.config if facts.tier else None
    items: list[Line | Table] = [Line("Method", method_label(report.method, cfg), _dtypes_text(facts.dtypes))]
    total = report.model.total_params
    share = format_share(report.trainable_params / total) if total else "n/a"
    trainable_reason = (
        "every weight is updated"
        if report.method == "full"
        else "adapter weights only: rank x (in + out) for each targeted linear layer"
    )
    items.append(
        Line("Trainable", f"{format_params(report.trainable_params)} / {format_params(total)} parameters ({share})", trainable_reason)
    )
    changes = _stack_changes(report)
    items.append(Line("Stack", stack_text(report), "; ".join(changes) if changes else
                      "the engine's reference stack: nothing changed"))
    if report.method != "full":
        lora = _lora(report)
        if lora is not None:
            items.append(
                Line(
                    "LoRA",
                    f"rank {lora.rank}, alpha {lora.alpha:g}, dropout {lora.dropout:g}, targets: "
                    f"{targets_label(lora.target_modules, report.model.lora_names)}",
                    f"adapter updates are scaled by alpha / rank = {lora.alpha / lora.rank:g}",
                )
            )
    rec = report.recommended
    if report.num_rows is not None and report.steps_per_epoch is not None:
        eff = f"effective batch {_effective(report, rec.config)}" if rec else "the effective batch"
        items.append(
            Line(
                "Steps",
                f"{format_int(report.steps_per_epoch)} optimizer steps per epoch",
                f"{format_int(report.num_rows)} rows / {eff}",
            )
        )
        total_steps = round(report.steps_per_epoch * report.epochs)
        items.append(
            Line(
                "Epochs",
                f"{report.epochs:g} = each sample seen {report.epochs:g} times ({format_int(total_steps)} steps in all)",
                "each epoch is one pass over every row",
            )
        )
    elif report.num_rows is None:
        items.append(
            Line("Data", f"no dataset given | {report.epochs:g} epochs", "pass a dataset for steps, time and cost per epoch")
        )
    return Section("training", "What you're training", "", tuple(items))


def _memory(report: PlanReport, facts: PlanFacts, explain: bool) -> Section:
    tier, f, d = facts.tier, facts.memory, facts.dtypes
    assert tier is not None and f is not None
    mem, cfg = tier.memory, tier.config
    rows: list[Row] = []
    for c in mem.components:
        if c.in_peak:
            how = c.formula + (f" -- {c.note}" if c.note else "")
            rows.append(Row(_component_name(c, d), format_bytes(c.bytes), how))
    summed = sum(c.bytes for c in mem.components if c.in_peak)
    if summed != mem.total_bytes:
        if summed != mem.tensor_bytes:
            rows.append(
                Row(
                    "Peak of live tensors",
                    format_bytes(mem.tensor_bytes),
                    f"the lines above sum to {format_bytes(summed)} but do not all peak at the same moment",
                )
            )
        if mem.overhead_bytes:
            rows.append(
                Row("Runtime overhead", format_bytes(mem.overhead_bytes), "CUDA context, workspaces and allocator reserve")
            )
    share = format_share(f.share) if f.budget_bytes else "n/a"
    of_budget = f"{share} of the {_gb1(f.budget_bytes)} {f.budget_label}" + (f" on the {_gpu_short(report)}" if explain else "")
    if explain:
        rows.append(Row("Total", format_bytes(f.total_bytes), "expected device peak", emphasis=True))
        rows.append(Row("Dynamic margin", f"+/- {format_bytes(f.margin_bytes, 1)}", "fragmentation and transient peaks"))
        rows.append(Row("Predicted range", format_bytes_range(f.low_bytes, f.high_bytes), f"high end = {of_budget}"))
    elif f.reserved_bytes is not None:
        rows.append(Row("Total", format_bytes(f.total_bytes), "live tensors + runtime overhead", emphasis=True))
        rows.append(Row("Predicted range", format_bytes_range(f.low_bytes, f.high_bytes),
                        f"{format_bytes(f.reserved_bytes)} reserved + overhead: {share} of {_gb1(f.budget_bytes)}"))
    else:
        rows.append(Row("Total", format_bytes(f.total_bytes), f"+/- {format_bytes(f.margin_bytes, 1)} margin", emphasis=True))
        rows.append(Row("Predicted range", format_bytes_range(f.low_bytes, f.high_bytes), f"high end = {of_budget}"))
    level = mem.device_level
    if explain and level is not None:  # the three numbers a user can read, each with what it is (aegis.planning.memory.runtime)
        segments = "expandable segments" if mem.expandable_segments else "caching allocator"
        rows += [
            Row("Allocated (peak)", format_bytes(level.allocated_bytes),
                "live tensors at the peak: torch.cuda.max_memory_allocated"),
            Row("Reserved (peak)", format_bytes(level.reserved_bytes),
                f"allocated + {format_bytes(level.cache_bytes)} the {segments} keeps cached: "
                f"torch.cuda.max_memory_reserved ({level.replay} replayed)" if level.replay else
                "at least the allocated peak: torch.cuda.max_memory_reserved (a multi-GPU step is not replayed "
                "through the allocator model: its cache is not counted)"),
            Row("Device (nvidia-smi)", format_bytes(level.device_bytes),
                f"reserved + CUDA context {format_bytes(level.context_bytes)} + cuBLAS workspace "
                f"{format_bytes(level.cublas_workspace_bytes)}"
                + (f" + NCCL buffers {format_bytes(level.nccl_bytes)}" if level.nccl_bytes else "")
                + ": what nvidia-smi shows for the process" + ("" if level.replay else ", at least, on each GPU")),
        ]
    elif explain and f.reserved_bytes is not None and f.device_bytes is not None:
        segments = "expandable segments" if mem.expandable_segments else "caching allocator"
        rows.append(Row(
            "Device (reserved)", format_bytes(f.device_bytes),
            f"{format_bytes(f.reserved_bytes)} reserved for {format_bytes(mem.tensor_bytes)} of live tensors "
            f"({segments}: the allocation stream replayed through a model of PyTorch's allocator)",
        ))
    for c in mem.components:
        if not c.in_peak:
            how = c.formula + (f" -- {c.note}" if c.note else "")
            rows.append(Row(f"{_component_name(c, d)} (not in peak)", format_bytes(c.bytes), how))
    if not explain:  # the formulas are --explain's: keep only the short notes of the summary rows
        rows = [r if r.name in {"Total", "Predicted range", "Device (reserved)"} else Row(r.name, r.amount, "", r.emphasis)
                for r in rows]
    items: list[Line | Table] = [Table(("Component", "Memory", "How"), tuple(rows))]
    level: Level = "ok" if f.verdict == "comfortable" else ("warn" if f.verdict == "tight" else "danger")
    eval_peak = f" | Eval peak: {format_bytes(mem.eval_peak_bytes)}" if mem.eval_peak_bytes and not explain else ""
    items.append(Line("Headroom", f"{_gb1(f.headroom_bytes)} -- {f.verdict}{eval_peak}", _headroom_reason(f) if explain else "",
                      level))
    if mem.eval_peak_bytes and explain:
        items.append(
            Line(
                "Eval peak",
                format_bytes(mem.eval_peak_bytes),
                "one eval step at the eval length: KV and logits of the longest sequences",
            )
        )
    if explain:
        items += [Line("Note", note) for note in mem.notes]
    parts = [method_short(cfg.method)]
    if cfg.method != "full":
        parts[0] += f" rank {cfg.lora_config.rank}"
    parts += [f"bs={cfg.micro_batch_size}", f"seq={cfg.seq_len}"]
    if cfg.gradient_checkpointing:
        parts.append("grad ckpt")
    if report.recommended is None:
        parts.append(f"{tier.name}, smallest tried")
    return Section("memory", "VRAM Breakdown", f"({', '.join(parts)})", tuple(items))


def _headroom_reason(f) -> str:
    if f.headroom_bytes == f.budget_bytes - f.high_bytes:
        extra = " (the estimate includes the runtime overhead)" if f.budget_label == "total" else ""
        return f"{f.budget_label} {_gb1(f.budget_bytes)} - predicted high end {_gb1(f.high_bytes)}{extra}"
    return f"memory left above the predicted high end {_gb1(f.high_bytes)}"


def _speed_vs_recommended(report: PlanReport, tier: Tier) -> float | None:
    """Throughput of ``tier`` relative to the recommended one (None without a recommendation)."""
    rec = report.recommended
    if rec is None or rec.relative_speed <= 0 or tier is rec:
        return None
    return tier.relative_speed / rec.relative_speed


def _seq_reason(report: PlanReport, cfg: TrainConfig) -> str:
    ds = report.dataset
    if report.request.seq_len is not None and report.request.seq_len == cfg.seq_len:
        return "as requested"
    if ds is not None and cfg.seq_len == ds.seq_len:
        return f"your data: {ds.seq_len_reason}" if ds.seq_len_reason else "your data"
    if ds is not None and cfg.seq_len == ds.tokens.p95:
        return "your data p95"
    if ds is None:
        return "default: no dataset to measure"
    return f"chosen by the solver (your data: p95 {format_int(ds.tokens.p95)}, max {format_int(ds.tokens.max)})"


def _ckpt_reason(report: PlanReport, tier: Tier) -> str:
    if report.request.gradient_checkpointing is not None:
        return "as requested"
    if tier.config.gradient_checkpointing:
        return "activations are recomputed in backward: slower, but needed for this batch to fit comfortably"
    return f"{_gb1(tier.headroom_bytes)} headroom -- not needed"


def _optimizer_reason(report: PlanReport, tier: Tier) -> str:
    cfg = tier.config
    if report.request.optimizer is not None:
        return "as requested"
    if cfg.optimizer in _EIGHT_BIT:
        return "8-bit optimizer states to save memory"
    for other in tiers(report):
        if other.config.optimizer in _EIGHT_BIT:
            try:
                saved = tier.memory.component("optimizer").bytes - other.memory.component("optimizer").bytes
            except KeyError:
                continue
            if saved > 0:
                return f"{other.config.optimizer} saves {format_bytes(saved, 1)} if needed"
    return "full-precision optimizer states: the quality reference"


def _kernels(cfg: TrainConfig) -> tuple[str, str]:
    d = dtype_facts(cfg)
    kernels = [f"{cfg.attention} attention", f"precision {cfg.precision}"]
    reasons = [_ATTENTION_REASONS[cfg.attention], _dtypes_text(d)]
    if cfg.stack.liger:
        kernels.append("Liger kernels")
        reasons.append("fused linear cross-entropy (no full logits), fused RMSNorm and SwiGLU")
    elif cfg.chunked_cross_entropy or cfg.stack.trainer == "unsloth":
        kernels.append("chunked cross-entropy")
        reasons.append("the loss is computed in vocab chunks: no full fp32 logits")
    return ", ".join(kernels), "; ".join(reasons)


def _recommended(report: PlanReport, facts: PlanFacts, explain: bool) -> Section:
    tier, f = facts.tier, facts.memory
    assert tier is not None and f is not None
    cfg = tier.config
    kernels, kernel_reason = _kernels(cfg)
    predicted = (
        f"{format_bytes(f.total_bytes)} ({format_bytes_range(f.low_bytes, f.high_bytes)}) | headroom "
        f"{_gb1(f.headroom_bytes)}"
    )
    ckpt = "ON" if cfg.gradient_checkpointing else "OFF"
    optimizer = f"{optimizer_label(cfg.optimizer)} ({facts.dtypes.optimizer} states)"
    if not explain:
        items: list[Line | Table] = [
            Line("", f"{_batch_text(report, cfg)} | Seq len: {format_int(cfg.seq_len)} | Grad checkpointing: {ckpt}"),
            Line("", f"Optimizer: {optimizer} | Kernels: {kernels}"),
            Line("", f"Predicted: {predicted} -- {f.verdict}"),
            Line("", f"Why: {tier.summary}"),
        ]
        return Section("recommended", "Recommended Config", "", tuple(items))
    eff_reason = "effective = micro batch x grad accum" + (f" x {report.gpu_count} GPUs" if report.gpu_count > 1 else "")
    if report.request.effective_batch_size:
        eff_reason += f"; you asked for {report.request.effective_batch_size}"
    items = [
        Line("Batch", _batch_text(report, cfg), eff_reason),
        Line("Seq len", format_int(cfg.seq_len), _seq_reason(report, cfg)),
        Line("Grad checkpointing", ckpt, _ckpt_reason(report, tier)),
        Line("Optimizer", optimizer, _optimizer_reason(report, tier)),
        Line("Kernels", kernels, kernel_reason),
        Line("Predicted", predicted, f.verdict),
        Line("Why", tier.summary),
    ]
    return Section("recommended", "Recommended Config", "", tuple(items))


def _aggressive(report: PlanReport, tier: Tier, explain: bool) -> Section:
    cfg, f = tier.config, memory_facts(report, tier)
    base = report.recommended.config if report.recommended else None
    restart = (
        "appropriate on a local card where a restart is cheap"
        if report.gpu.local
        else "on a rented GPU an OOM restart costs money: prefer the recommended config"
    )
    predicted = f"{_gb1(f.high_bytes)} at the high end | headroom {_gb1(f.headroom_bytes)} -- {f.verdict}"
    speed = _speed_vs_recommended(report, tier)
    shows_speed = speed is not None and abs(speed - 1) >= 0.01
    if not explain:
        extra = f" | ~{speed:.2f}x the recommended speed" if shows_speed else ""
        items: list[Line | Table] = [
            Line("", _batch_text(report, cfg) + (f" | Seq len: {format_int(cfg.seq_len)}" if base and cfg.seq_len != base.seq_len else "")),
            Line("", f"Predicted: {predicted}{extra}"),
            Line("", f"Why: {tier.summary}" + ("" if report.gpu.local else f"; {restart}")),
        ]
        return Section("aggressive", "Aggressive Config", "", tuple(items))
    items = [
        Line("Batch", _batch_text(report, cfg), config_diff(base, cfg)),
        Line("Predicted", predicted, "fits, but OOM is likely on the longest sequences"),
    ]
    if shows_speed:
        items.append(Line("Speed", f"~{speed:.2f}x the recommended throughput", "solver's relative-speed model: bigger micro batches keep the GPU busier"))
    items.append(Line("When", restart))
    return Section("aggressive", "Aggressive Config", f"({tier.summary})", tuple(items))


def _multi_gpu(report: PlanReport) -> Section:
    mg = report.multi_gpu
    assert mg is not None
    mark = {"ddp": "", "fsdp": "", "deepspeed": ""}
    mark[mg.assumed] = "  <- assumed"
    items: list[Line | Table] = [
        Line("DDP", f"{format_bytes(mg.ddp_bytes)} per GPU{mark['ddp']}", "plain data parallel: everything replicated on each GPU"),
        Line(
            "FSDP",
            f"{format_bytes(mg.fsdp_bytes)} per GPU{mark['fsdp']}",
            f"FULL_SHARD / ZeRO-3: weights, gradients and optimizer states / {mg.gpu_count}, plus the largest "
            "gathered layer and communication buffers",
        ),
        *([Line(f"ZeRO-{mg.zero_stage}", f"{format_bytes(mg.zero_bytes or 0)} per GPU{mark['deepspeed']}",
                "DeepSpeed: fp32 master, optimizer states and gradients / GPUs"
                + (", parameters too (each layer gathered for its forward and backward)" if mg.zero_stage == 3 else
                   ", parameters whole on every GPU"))] if mg.assumed == "deepspeed" else []),
        Line("Assumes", f"DeepSpeed ZeRO-{mg.zero_stage}" if mg.assumed == "deepspeed" else mg.assumed.upper(),
             mg.reason, key_reason=True),
        Line(
            "Scaling",
            f"{format_share(mg.efficiency_low)}-{format_share(mg.efficiency_high)} efficiency over {mg.gpu_count} GPUs",
            "applied to the single-GPU throughput in the estimates below",
        ),
    ]
    at = f", both at {mg.compared_at}" if mg.compared_at else ""
    return Section("multi_gpu", "Multi-GPU", f"({mg.gpu_count} x {_gpu_short(report)}{at})", tuple(items))


def _estimates(report: PlanReport, explain: bool) -> Section:
    section = _estimates_explained(report)
    if explain:
        return section
    items: list[Line | Table] = []
    cloud: list[str] = []
    for item in section.items:
        assert isinstance(item, Line)
        if item.label == "Throughput" and report.throughput is not None and report.throughput.source == "estimated":
            items.append(Line(item.label, item.value.replace("(estimated)", "(estimated; `aegis benchmark` calibrates)")))
        elif item.label == "Throughput" and report.throughput is not None and report.throughput.basis.startswith("measured by"):
            when = report.throughput.basis.split(":", 1)[0]  # "measured by `aegis benchmark` on <date>"
            items.append(Line(item.label, item.value.replace("(measured)", f"({when}; --explain shows how)")))
        elif item.label == "Cloud equivalent":
            cloud.append(item.value.removeprefix("~"))
        else:
            items.append(Line(item.label, item.value, "", item.level))
    if cloud:
        items.append(Line("Cloud equivalent", "~" + "; ".join(cloud)))
    return Section(section.key, section.title, section.subtitle, tuple(items))


def _estimates_explained(report: PlanReport) -> Section:
    tp = report.throughput
    items: list[Line | Table] = []
    if tp is None:
        reason = "no configuration fits" if report.recommended is None else "not estimated for this plan"
        items.append(Line("Throughput", "n/a", reason))
    else:
        reason = tp.basis
        if tp.source == "estimated":
            reason += "; run `aegis benchmark` to calibrate"
        items.append(
            Line(
                "Throughput",
                f"~{format_rate(tp.tokens_per_s_low)} - {format_rate(tp.tokens_per_s_high)} tok/sec ({tp.source})",
                reason,
            )
        )
        if report.num_rows is not None:
            items.append(
                Line(
                    "Time",
                    f"1 epoch ~ {format_hours_range(tp.epoch_hours_low, tp.epoch_hours_high)} | {report.epochs:g} epochs ~ "
                    f"{format_hours_range(tp.total_hours_low, tp.total_hours_high)}",
                    "tokens to train / throughput range",
                )
            )
        else:
            items.append(Line("Time", "n/a", "needs a dataset: time scales with its rows and lengths"))
    if report.recommended is None:
        return Section("estimates", "Estimates", "", tuple(items))
    own = [c for c in report.costs if not c.counterfactual]
    cloud = [c for c in report.costs if c.counterfactual]
    if report.gpu.local and not own:
        items.append(Line("Cost", f"{format_usd(0)} (local)", "your own card: no rental, electricity only"))
    for c in own:
        items.append(Line("Cost", _cost_text(c), f"{format_usd(c.usd_per_hour)}/GPU-hour list price ({c.as_of}) x time range"))
    for c in cloud:
        items.append(Line("Cloud equivalent", _cost_text(c), f"{format_usd(c.usd_per_hour)}/GPU-hour ({c.as_of}), if you rented instead"))
    if not report.costs and tp is not None and report.num_rows is not None and not report.gpu.local:
        items.append(Line("Cost", "n/a", "no price for this GPU in the catalog"))
    return Section("estimates", "Estimates", "", tuple(items))


def _cost_text(c: Cost) -> str:
    money = format_usd(c.usd_low) if format_usd(c.usd_low) == format_usd(c.usd_high) else f"{format_usd(c.usd_low)}-{format_usd(c.usd_high)}"
    return f"~{money} on {c.provider} ({c.gpu_id})"


def _risks(report: PlanReport) -> Section:
    items = tuple(Line(r.title, r.detail, "", r.level) for r in report.risks)
    return Section("risks", "Risks", "", items)


def _fallbacks(report: PlanReport, explain: bool) -> Section:
    base = report.recommended.config if report.recommended else None
    items: list[Line | Table] = []
    for i, t in enumerate(report.fallbacks, 1):
        reason = t.summary if explain else ""
        speed = _speed_vs_recommended(report, t)
        pct = round(100 * (1 - speed)) if speed is not None else 0
        if pct:
            reason += f"; ~{abs(pct)}% {'slower' if pct > 0 else 'faster'}" + (" than recommended" if explain else "")
        reason += f"; headroom {_gb1(t.headroom_bytes)}" if t.fits else "; does NOT fit"
        items.append(
            Line(f"{i}.", f"{config_diff(base, t.config)} -> {_gb1(t.memory.total_bytes)}", reason.removeprefix("; "),
                 "ok" if t.fits else "danger")
        )
    if not items:
        items.append(Line("", "none: no smaller configuration fits", ""))
    return Section("fallbacks", "Fallbacks", "(pre-computed, if primary OOMs)", tuple(items))


def _nothing_fits(report: PlanReport) -> Section:
    text = report.nothing_fits or "No configuration of this job fits the usable memory of this GPU."
    items: list[Line | Table] = [Line("", text, "", "danger")]
    smallest = breakdown_tier(report)
    if smallest is not None:
        items.append(
            Line(
                "Smallest tried",
                f"{config_diff(None, smallest.config)} -> {_gb1(smallest.memory.high_bytes)} at the high end",
                f"{memory_facts(report, smallest).budget_label} is {_gb1(memory_facts(report, smallest).budget_bytes)}: "
                f"short by {_gb1(-smallest.headroom_bytes)}",
                "danger",
                key_reason=True,
            )
        )
    return Section("nothing_fits", "Nothing fits", "", tuple(items), level="danger")


def _brief(section: Section) -> Section:
    """A section without its reasons (the compact report); lines that are reasons themselves stay."""
    items = tuple(
        item if isinstance(item, Table) or item.key_reason else Line(item.label, item.value, "", item.level)
        for item in section.items
    )
    return Section(section.key, section.title, section.subtitle, items, section.level)


def build_sections(report: PlanReport, *, explain: bool = False) -> list[Section]:
    """Every section the report shows, in reading order: compact (every decision and number), or with
    every formula and reason when ``explain``."""
    facts = plan_facts(report)
    brief = (lambda s: s) if explain else _brief
    out = [model_section(report) if explain else model_brief(report)]
    if report.dataset is not None:
        out.append(dataset_section(report.dataset) if explain else dataset_brief(report.dataset))
    out += [hardware_section(report) if explain else hardware_brief(report), _training(report, facts, explain)]
    if report.recommended is None:
        out.append(brief(_nothing_fits(report)))
    if facts.tier is not None:
        out.append(_memory(report, facts, explain))
    if report.recommended is not None:
        out.append(_recommended(report, facts, explain))
    omitted = report.recommended is not None and _AGGRESSIVE_OMITTED in report.notes
    if report.aggressive is not None:
        out.append(_aggressive(report, report.aggressive, explain))
    elif omitted:  # the section stays where readers look for it, with the solver's reason
        out.append(Section("aggressive", "Aggressive Config", "", (Line("", "none: nothing faster than the recommended config fits"),)))
    if report.gpu_count > 1 and report.multi_gpu is not None:
        out.append(brief(_multi_gpu(report)))
    out.append(_estimates(report, explain))
    if report.risks:
        out.append(_risks(report))
    if report.recommended is not None:  # a chain below the recommended config: none when nothing fits
        out.append(_fallbacks(report, explain))
    notes = [n for n in report.notes if not (omitted and n == _AGGRESSIVE_OMITTED)]
    if notes:
        out.append(Section("notes", "Notes", "", tuple(Line("", n) for n in notes)))
    return out
