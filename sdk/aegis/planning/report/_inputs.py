"""The sections about what a plan is for: the model, the dataset and the hardware, compact or explained.

They state the request's inputs as the planner read them (the model's config and counts, the dataset's profile, the
catalog's GPU); `aegis.planning.report._sections` puts them first and adds the decisions.
"""

from __future__ import annotations

from aegis.planning.report._facts import breakdown_tier, memory_facts
from aegis.planning.report._layout import Line, Section, Table
from aegis.planning.report.format import (
    format_bytes,
    format_int,
    format_params,
    format_share,
)
from aegis.schema import GPU, DatasetProfile, PlanReport

__all__ = ["dataset_brief", "dataset_section", "hardware_brief", "hardware_section", "model_brief", "model_section"]

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

def model_section(report: PlanReport) -> Section:
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


def model_brief(report: PlanReport) -> Section:
    m = report.model
    arch = f"{m.architecture} ({m.family_description})" if m.family_description else m.architecture
    items: list[Line | Table] = [
        Line("", f"{arch} | {format_params(m.total_params)} params | Vocab: {format_int(m.vocab_size)} | "
                 f"Layers: {m.num_layers} | Hidden: {format_int(m.hidden_size)}"),
    ]
    if m.num_experts:
        items.append(Line("", f"Experts: {m.num_experts} per MoE layer, top-{m.num_experts_per_tok} per token | "
                              f"Active per token: {format_params(m.active_params_per_token)}"))
    return Section("model", "Model", m.model_id, tuple(items))


def dataset_section(ds: DatasetProfile) -> Section:
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
    items += [Line("Data problem", text, "as the run counts them: the plan reads rows with the run's reader", "warn")
              for text in _data_problems(ds)]
    items += [Line("Note", note) for note in ds.notes]
    return Section("dataset", "Dataset", f"{ds.source} ({format_int(ds.num_rows)} rows)", tuple(items))


def hardware_section(report: PlanReport) -> Section:
    gpu = report.gpu
    per = " per GPU" if report.gpu_count > 1 else ""
    overhead = gpu.memory_bytes - report.usable_bytes
    reason = "usable = total - CUDA context and framework reservation (catalog figures)"
    shown = breakdown_tier(report)
    if shown is not None and memory_facts(report, shown).budget_label == "total":
        reason += "; the estimates below include this overhead, so headroom is measured against the total"
    items: list[Line | Table] = [
        Line(
            "Memory",
            f"Total: {_gib1(gpu.memory_bytes)} | Framework overhead: {_gib1(overhead)} | Usable: "
            f"{_gib1(report.usable_bytes)}{per}",
            reason,
        ),
        Line(
            "Compute",
            f"{_rates(gpu, ' dense')} | {gpu.bandwidth_gb_per_s:,.0f} GB/s memory bandwidth",
            "spec-sheet figures from the catalog; the throughput estimate builds on them",
        ),
    ]
    subtitle = gpu.name + (f" x {report.gpu_count}" if report.gpu_count > 1 else "")
    return Section("hardware", "Hardware", subtitle, tuple(items))


def dataset_brief(ds: DatasetProfile) -> Section:
    t = ds.tokens
    exact = "exact" if ds.tokenizer_exact else "approximate"
    items: list[Line | Table] = [
        Line(
            "",
            f"Tokens/row: min={format_int(t.min)}  mean={format_int(t.mean)}  p50={format_int(t.p50)}  "
            f"p95={format_int(t.p95)}  p99={format_int(t.p99)}  max={format_int(t.max)}",
        ),
        Line(
            "",
            f"Format: {_FORMAT_LABELS[ds.format].split(' (')[0]} (detected), +{ds.template_overhead_tokens:.0f} "
            f"template tokens/row | Tokenizer: {ds.tokenizer.split(' (')[0]} ({exact})",
        ),
        Line(
            "",
            f"Seq len: {format_int(ds.seq_len)} | {format_share(ds.truncated_share)} of rows truncated | "
            f"padding waste {format_share(ds.padding_waste)} | packing efficiency {format_share(ds.packing_efficiency)}",
        ),
    ]
    items += [Line("", text, "", "warn") for text in _data_problems(ds)]
    return Section("dataset", "Dataset", f"{ds.source} ({format_int(ds.num_rows)} rows)", tuple(items))


def _data_problems(ds: DatasetProfile) -> list[str]:
    """One line per kind of row a run skips, drops or truncates, with its first lines (a profile saved before
    problems were recorded: its unparsed lines)."""
    from aegis.data.reading import describe_problem

    if not ds.problems:
        return [describe_problem("corrupt", len(ds.bad_lines), ds.bad_lines)] if ds.bad_lines else []
    return [describe_problem(p.kind, p.count, p.lines, unit=p.unit, reason=p.reason, fmt=ds.format,
                             of_sample=ds.sampled_rows if p.sampled else None) for p in ds.problems]


def _rates(gpu: GPU, dense: str = "") -> str:
    """'989.4 TFLOPS bf16', or on a card without bf16 tensor cores '65 TFLOPS fp16 (bf16 emulated: 8.1)'."""
    if gpu.fp16_tflops and not gpu.bf16_native:
        return f"{gpu.fp16_tflops:g} TFLOPS{dense} fp16 (bf16 emulated: {gpu.bf16_tflops:g})"
    return f"{gpu.bf16_tflops:g} TFLOPS{dense} bf16"


def hardware_brief(report: PlanReport) -> Section:
    gpu = report.gpu
    per = " per GPU" if report.gpu_count > 1 else ""
    text = (
        f"Total: {_gib1(gpu.memory_bytes)} | Framework overhead: {_gib1(gpu.memory_bytes - report.usable_bytes)} | "
        f"Usable: {_gib1(report.usable_bytes)}{per} | {_rates(gpu)} | {gpu.bandwidth_gb_per_s:,.0f} GB/s"
    )
    subtitle = gpu.name + (f" x {report.gpu_count}" if report.gpu_count > 1 else "")
    return Section("hardware", "Hardware", subtitle, (Line("", text),))


def _gib1(n: int) -> str:
    return format_bytes(n, 1)
