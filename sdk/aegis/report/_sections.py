"""A `PlanReport` laid out as sections of labelled lines, each with its reason: what every renderer draws.

The text, Markdown and Slack renderers only style what this module decides to say, so the three
always show the same figures with the same reasons.

    from aegis.report._sections import build_sections
    for section in build_sections(report):
        print(section.title, section.subtitle)
        for item in section.items: ...      # Line (label, value, reason) or Table (breakdown rows)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from aegis.report.format import (
    format_bytes,
    format_bytes_range,
    format_hours_range,
    format_int,
    format_params,
    format_rate,
    format_share,
    format_usd,
    config_diff,
    headroom_verdict,
    method_label,
    method_short,
    optimizer_label,
    targets_label,
)
from aegis.schema import Cost, DatasetProfile, PlanReport, Tier, TrainConfig

__all__ = ["Level", "Line", "Row", "Table", "Section", "build_sections", "breakdown_tier", "tiers"]

Level = Literal["", "ok", "warn", "danger"]

_FORMAT_LABELS = {
    "alpaca": "Alpaca (instruction/input/output)",
    "sharegpt": "ShareGPT (conversations/from/value)",
    "messages": "OpenAI messages (role/content)",
    "prompt_completion": "prompt/completion",
    "text": "raw text",
}
_SOURCE_LABELS = {
    "catalog": "config.json bundled with Aegis",
    "hub": "config.json from the Hugging Face Hub",
    "cache": "config.json from the local Hub cache",
    "path": "config.json from the given path",
}
_EIGHT_BIT = ("adamw_8bit", "paged_adamw_8bit")
_ATTENTION_REASONS = {
    "eager": "eager attention materialises batch x heads x seq^2 scores",
    "sdpa": "PyTorch SDPA keeps no seq^2 score matrix",
    "flash": "FlashAttention keeps no seq^2 score matrix",
}
_PRECISION_REASONS = {
    "bf16": "weights, grads and optimizer states in bf16",
    "bf16_mixed": "fp32 master weights, bf16 compute",
    "fp16_mixed": "fp32 master weights, fp16 compute with loss scaling",
    "fp32": "everything in fp32",
}
_MAX_BAD_LINES_SHOWN = 10


@dataclass(frozen=True)
class Line:
    """One labelled figure and why it is what it is."""

    label: str
    value: str
    reason: str = ""
    level: Level = ""


@dataclass(frozen=True)
class Row:
    """One row of the memory breakdown: name, amount and how it was computed."""

    name: str
    amount: str
    how: str = ""
    emphasis: bool = False


@dataclass(frozen=True)
class Table:
    """The memory breakdown table."""

    columns: tuple[str, str, str]
    rows: tuple[Row, ...]


@dataclass(frozen=True)
class Section:
    """A titled block of the report. ``key`` is stable ('model', 'memory', 'fallbacks', ...)."""

    key: str
    title: str
    subtitle: str = ""
    items: tuple[Line | Table, ...] = field(default_factory=tuple)
    level: Level = ""


def tiers(report: PlanReport) -> list[Tier]:
    """Recommended, aggressive and every fallback, in that order (absent ones skipped)."""
    out = [t for t in (report.recommended, report.aggressive) if t is not None]
    return out + list(report.fallbacks)


def breakdown_tier(report: PlanReport) -> Tier | None:
    """The tier whose memory the breakdown shows: the recommended one, else the smallest tried."""
    if report.recommended is not None:
        return report.recommended
    candidates = tiers(report)
    return min(candidates, key=lambda t: t.memory.total_bytes) if candidates else None


def _gb1(n: int) -> str:
    return format_bytes(n, 1)


def _effective(report: PlanReport, cfg: TrainConfig) -> int:
    return cfg.effective_batch_size * report.gpu_count


def _gpu_short(report: PlanReport) -> str:
    return report.gpu.name.removeprefix("NVIDIA ").removeprefix("GeForce ").removeprefix("AMD ")


# --- sections -------------------------------------------------------------------------------


def _model(report: PlanReport) -> Section:
    m = report.model
    arch = f"{m.architecture} ({m.family_description})" if m.family_description else m.architecture
    items: list[Line | Table] = [
        Line("Architecture", arch, _SOURCE_LABELS.get(m.source, f"config from {m.source}")),
        Line(
            "Parameters",
            f"{format_params(m.total_params)} | Vocab: {format_int(m.vocab_size)} | Layers: {m.num_layers}"
            f" | Hidden: {format_int(m.hidden_size)}",
            "counted from the config's tensor shapes",
        ),
    ]
    if m.num_experts:
        items.append(
            Line(
                "Experts",
                f"{m.num_experts} per MoE layer, top-{m.num_experts_per_tok} per token | Active per token: "
                f"{format_params(m.active_params_per_token)} of {format_params(m.total_params)}",
                "memory holds every expert; compute per token touches only the routed ones",
            )
        )
    return Section("model", "Model", m.model_id, tuple(items))


def _dataset(ds: DatasetProfile) -> Section:
    t = ds.tokens
    sampled = "every row" if ds.sampled_rows >= ds.num_rows else f"{format_int(ds.sampled_rows)} sampled rows"
    tok_reason = (
        "exact: the model's own tokenizer"
        if ds.tokenizer_exact
        else "approximate: not the model's own tokenizer, so lengths are indicative"
    )
    items: list[Line | Table] = [
        Line(
            "Sequence lengths",
            f"min={format_int(t.min)}  mean={format_int(t.mean)}  p50={format_int(t.p50)}  "
            f"p95={format_int(t.p95)}  p99={format_int(t.p99)}  max={format_int(t.max)}",
            f"tokens per row after the chat template, from {sampled}",
        ),
        Line("Format", f"{_FORMAT_LABELS[ds.format]} (detected) -- tokenized with {ds.tokenizer}", tok_reason),
        Line(
            "Chat template",
            f"+{ds.template_overhead_tokens:.0f} tokens per row on average",
            "role markers and special tokens the template adds around the text",
        ),
        Line("Seq len", f"{format_int(ds.seq_len)} tokens", ds.seq_len_reason),
        Line(
            f"At {format_int(ds.seq_len)} tokens",
            f"{format_share(ds.truncated_share)} of rows truncated | padding waste {format_share(ds.padding_waste)}"
            f" | packing efficiency {format_share(ds.packing_efficiency)}",
            "padding waste: share of pad tokens when every row is padded to the seq len; "
            "packing efficiency: share of real tokens when rows are packed into seq-len blocks",
        ),
    ]
    if ds.bad_lines:
        shown = ", ".join(str(n) for n in ds.bad_lines[:_MAX_BAD_LINES_SHOWN])
        more = len(ds.bad_lines) - _MAX_BAD_LINES_SHOWN
        items.append(
            Line(
                "Unparsed lines",
                shown + (f" (+{more} more)" if more > 0 else ""),
                "skipped; every other line was analysed",
                "warn",
            )
        )
    items += [Line("Note", note) for note in ds.notes]
    return Section("dataset", "Dataset", f"{ds.source} ({format_int(ds.num_rows)} rows)", tuple(items))


def _hardware(report: PlanReport) -> Section:
    gpu = report.gpu
    per = " per GPU" if report.gpu_count > 1 else ""
    overhead = gpu.memory_bytes - report.usable_bytes
    reason = "usable = total - CUDA context and framework reservation (catalog figures)"
    shown = breakdown_tier(report)
    if shown is not None and _budget(report, shown)[1] == "total":
        reason += "; the estimates below include this overhead, so headroom is measured against the total"
    items: list[Line | Table] = [
        Line(
            "Memory",
            f"Total: {_gb1(gpu.memory_bytes)} | Framework overhead: {_gb1(overhead)} | Usable: "
            f"{_gb1(report.usable_bytes)}{per}",
            reason,
        ),
        Line(
            "Compute",
            f"{gpu.bf16_tflops:g} TFLOPS dense bf16 | {gpu.bandwidth_gb_per_s:,.0f} GB/s memory bandwidth",
            "spec-sheet figures from the catalog; the throughput estimate builds on them",
        ),
    ]
    subtitle = gpu.name + (f" x {report.gpu_count}" if report.gpu_count > 1 else "")
    return Section("hardware", "Hardware", subtitle, tuple(items))


def _training(report: PlanReport) -> Section:
    items: list[Line | Table] = [Line("Method", method_label(report.method))]
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
    if report.method != "full":
        lora = report.lora or (report.recommended.config.lora_config if report.recommended else None)
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


def _memory(report: PlanReport, tier: Tier) -> Section:
    mem, cfg = tier.memory, tier.config
    rows: list[Row] = []
    for c in mem.components:
        if c.in_peak:
            how = c.formula + (f" -- {c.note}" if c.note else "")
            rows.append(Row(c.name, format_bytes(c.bytes), how))
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
    rows.append(Row("Total", format_bytes(mem.total_bytes), "expected device peak", emphasis=True))
    rows.append(
        Row("Dynamic margin", f"+/- {format_bytes(mem.dynamic_margin_bytes, 1)}", "fragmentation and transient peaks")
    )
    budget, budget_label = _budget(report, tier)
    share = format_share(mem.high_bytes / budget) if budget else "n/a"
    rows.append(
        Row(
            "Predicted range",
            format_bytes_range(mem.low_bytes, mem.high_bytes),
            f"high end = {share} of the {_gb1(budget)} {budget_label} on the {_gpu_short(report)}",
        )
    )
    for c in mem.components:
        if not c.in_peak:
            how = c.formula + (f" -- {c.note}" if c.note else "")
            rows.append(Row(f"{c.name} (not in peak)", format_bytes(c.bytes), how))
    items: list[Line | Table] = [Table(("Component", "Memory", "How"), tuple(rows))]
    verdict = headroom_verdict(tier.headroom_bytes)
    items.append(
        Line(
            "Headroom",
            f"{_gb1(tier.headroom_bytes)} -- {verdict}",
            _headroom_reason(report, tier),
            "ok" if verdict == "comfortable" else ("warn" if verdict == "tight" else "danger"),
        )
    )
    if mem.eval_peak_bytes:
        items.append(
            Line(
                "Eval peak",
                format_bytes(mem.eval_peak_bytes),
                "one eval step at the eval length: KV and logits of the longest sequences",
            )
        )
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


def _budget(report: PlanReport, tier: Tier) -> tuple[int, str]:
    """The memory the headroom was measured against: the card's total when the estimate already
    includes the runtime overhead (headroom = total - high), else the usable memory."""
    if tier.headroom_bytes == report.gpu.memory_bytes - tier.memory.high_bytes:
        return report.gpu.memory_bytes, "total"
    return report.usable_bytes, "usable"


def _headroom_reason(report: PlanReport, tier: Tier) -> str:
    high = tier.memory.high_bytes
    budget, label = _budget(report, tier)
    if tier.headroom_bytes == budget - high:
        extra = " (the estimate includes the runtime overhead)" if label == "total" else ""
        return f"{label} {_gb1(budget)} - predicted high end {_gb1(high)}{extra}"
    return f"memory left above the predicted high end {_gb1(high)}"


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


def _recommended(report: PlanReport, tier: Tier) -> Section:
    cfg, mem = tier.config, tier.memory
    eff_reason = "effective = micro batch x grad accum" + (f" x {report.gpu_count} GPUs" if report.gpu_count > 1 else "")
    if report.request.effective_batch_size:
        eff_reason += f"; you asked for {report.request.effective_batch_size}"
    kernels = [f"{cfg.attention} attention", cfg.precision]
    reasons = [_ATTENTION_REASONS[cfg.attention], _PRECISION_REASONS[cfg.precision]]
    if cfg.chunked_cross_entropy:
        kernels.append("chunked cross-entropy")
        reasons.append("the loss is computed in vocab chunks: no full fp32 logits")
    kernel_reason = "; ".join(reasons)
    items: list[Line | Table] = [
        Line(
            "Batch",
            f"Micro batch: {cfg.micro_batch_size} | Grad accum: {cfg.gradient_accumulation_steps} | "
            f"Effective: {_effective(report, cfg)}",
            eff_reason,
        ),
        Line("Seq len", format_int(cfg.seq_len), _seq_reason(report, cfg)),
        Line("Grad checkpointing", "ON" if cfg.gradient_checkpointing else "OFF", _ckpt_reason(report, tier)),
        Line("Optimizer", optimizer_label(cfg.optimizer), _optimizer_reason(report, tier)),
        Line("Kernels", " | ".join(kernels), kernel_reason),
        Line(
            "Predicted",
            f"{format_bytes(mem.total_bytes)} ({format_bytes_range(mem.low_bytes, mem.high_bytes)}) | headroom "
            f"{_gb1(tier.headroom_bytes)}",
            headroom_verdict(tier.headroom_bytes),
        ),
        Line("Why", tier.summary),
    ]
    return Section("recommended", "Recommended Config", "", tuple(items))


def _aggressive(report: PlanReport, tier: Tier) -> Section:
    cfg, mem = tier.config, tier.memory
    base = report.recommended.config if report.recommended else None
    restart = (
        "appropriate on a local card where a restart is cheap"
        if report.gpu.local
        else "on a rented GPU an OOM restart costs money: prefer the recommended config"
    )
    items: list[Line | Table] = [
        Line(
            "Batch",
            f"Micro batch: {cfg.micro_batch_size} | Grad accum: {cfg.gradient_accumulation_steps} | "
            f"Effective: {_effective(report, cfg)}",
            config_diff(base, cfg),
        ),
        Line(
            "Predicted",
            f"{_gb1(mem.high_bytes)} at the high end | headroom {_gb1(tier.headroom_bytes)} -- "
            f"{headroom_verdict(tier.headroom_bytes)}",
            "fits, but OOM is likely on the longest sequences",
        ),
    ]
    speed = _speed_vs_recommended(report, tier)
    if speed is not None and abs(speed - 1) >= 0.01:
        items.append(Line("Speed", f"~{speed:.2f}x the recommended throughput", "solver's relative-speed model: bigger micro batches keep the GPU busier"))
    items.append(Line("When", restart))
    return Section("aggressive", "Aggressive Config", f"({tier.summary})", tuple(items))


def _multi_gpu(report: PlanReport) -> Section:
    mg = report.multi_gpu
    assert mg is not None
    mark = {"ddp": "", "fsdp": ""}
    mark[mg.assumed] = "  <- assumed"
    items: list[Line | Table] = [
        Line("DDP", f"{format_bytes(mg.ddp_bytes)} per GPU{mark['ddp']}", "plain data parallel: everything replicated on each GPU"),
        Line(
            "FSDP",
            f"{format_bytes(mg.fsdp_bytes)} per GPU{mark['fsdp']}",
            f"FULL_SHARD / ZeRO-3: weights, gradients and optimizer states / {mg.gpu_count}, plus the largest "
            "gathered layer and communication buffers",
        ),
        Line("Assumes", mg.assumed.upper(), mg.reason),
        Line(
            "Scaling",
            f"{format_share(mg.efficiency_low)}-{format_share(mg.efficiency_high)} efficiency over {mg.gpu_count} GPUs",
            "applied to the single-GPU throughput in the estimates below",
        ),
    ]
    return Section("multi_gpu", "Multi-GPU", f"({mg.gpu_count} x {_gpu_short(report)})", tuple(items))


def _estimates(report: PlanReport) -> Section:
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


def _fallbacks(report: PlanReport) -> Section:
    base = report.recommended.config if report.recommended else None
    items: list[Line | Table] = []
    for i, t in enumerate(report.fallbacks, 1):
        reason = t.summary
        speed = _speed_vs_recommended(report, t)
        pct = round(100 * (1 - speed)) if speed is not None else 0
        if pct:
            reason += f"; ~{abs(pct)}% {'slower' if pct > 0 else 'faster'} than recommended"
        reason += f"; headroom {_gb1(t.headroom_bytes)}" if t.fits else "; does NOT fit"
        items.append(
            Line(f"{i}.", f"{config_diff(base, t.config)} -> {_gb1(t.memory.total_bytes)}", reason, "ok" if t.fits else "danger")
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
                f"usable is {_gb1(report.usable_bytes)}: short by {_gb1(-smallest.headroom_bytes)}",
                "danger",
            )
        )
    return Section("nothing_fits", "Nothing fits", "", tuple(items), level="danger")


def build_sections(report: PlanReport) -> list[Section]:
    """Every section the report shows, in reading order."""
    out = [_model(report)]
    if report.dataset is not None:
        out.append(_dataset(report.dataset))
    out += [_hardware(report), _training(report)]
    if report.recommended is None:
        out.append(_nothing_fits(report))
    shown = breakdown_tier(report)
    if shown is not None:
        out.append(_memory(report, shown))
    if report.recommended is not None:
        out.append(_recommended(report, report.recommended))
    if report.aggressive is not None:
        out.append(_aggressive(report, report.aggressive))
    if report.gpu_count > 1 and report.multi_gpu is not None:
        out.append(_multi_gpu(report))
    out.append(_estimates(report))
    if report.risks:
        out.append(_risks(report))
    if report.recommended is not None or report.fallbacks:
        out.append(_fallbacks(report))
    if report.notes:
        out.append(Section("notes", "Notes", "", tuple(Line("", n) for n in report.notes)))
    return out
