"""Questions about the last plan, answered from the plan itself (no LLM needed).

A user who just planned asks what a reader of the report would: *what eats the most memory?*, *why
checkpointing?*, *how long will it take?*. Each kind of question has one answer function over the
`PlanReport` (and, for "why checkpointing", the same request planned the other way, so the answer is a
measured comparison, not a stock sentence). `classify` reads the kind from the words; the optional LLM
(`aegis_agent.llm.RequestExtractor`) returns a `PlanQuestion` for phrasings the rules miss, and both go
through `answer`.

    kind = classify("what eats the most memory?")        # 'largest_component'
    text = answer(report, kind)                          # Markdown from the report's own figures
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Literal

from aegis.errors import AegisError
from aegis.planning.report._facts import breakdown_tier
from aegis.planning.report.format import format_bytes, format_hours_range, format_usd
from aegis.schema import Frozen, PlanReport, PlanRequest
from pydantic import Field

__all__ = ["QUESTION_KINDS", "PlanQuestion", "QuestionKind", "answer", "classify"]

QuestionKind = Literal["largest_component", "why_checkpointing", "time_and_cost"]
QUESTION_KINDS: tuple[QuestionKind, ...] = ("largest_component", "why_checkpointing", "time_and_cost")


class PlanQuestion(Frozen):
    """A question about the current plan (not a new request): which one."""

    kind: QuestionKind = Field(
        description="largest_component: what uses the most memory / where the memory goes; "
        "why_checkpointing: why gradient checkpointing is on or off; "
        "time_and_cost: how long the run takes, its throughput and cost."
    )


_RULES: tuple[tuple[QuestionKind, re.Pattern[str]], ...] = (
    ("largest_component", re.compile(
        r"\b(?:eats?|takes?|uses?|using|hogs?|consumes?|needs?)\b.*\b(?:most|biggest|largest)\b"
        r"|\b(?:largest|biggest|heaviest|main)\b.*\b(?:component|part|piece|line|memory|share|consumer|item)\b"
        r"|\b(?:component|part|piece|line|consumer|item)s?\b.*\b(?:largest|biggest|heaviest|most)\b"
        r"|\bwhere\b.*\bmemory\b.*\bgo(?:es|ing)?\b|\bmemory hog\b|\bwhat\b.*\bmost (?:memory|vram)\b",
        re.IGNORECASE)),
    ("why_checkpointing", re.compile(
        r"\bwhy\b.*\b(?:gradient[\s_-]*)?(?:checkpointing|ckpt|recompute|recomputation)\b"
        r"|\b(?:do|does|should)\b.*\bneed\b.*\b(?:checkpointing|ckpt)\b", re.IGNORECASE)),
    ("time_and_cost", re.compile(
        r"\bhow\s+(?:long|much\s+time|many\s+hours)\b|\bhow\s+much\b.*\bcost\b|\bwhat\b.*\bcost\b"
        r"|\bhow\s+fast\b|\bthroughput\b|\bwhen\b.*\b(?:finish|done)\b|\btokens?\s*(?:/|per)\s*s", re.IGNORECASE)),
)


def classify(text: str) -> QuestionKind | None:
    """The kind of plan question ``text`` asks, or None when it asks none of them."""
    for kind, pattern in _RULES:
        if pattern.search(text or ""):
            return kind
    return None


def _largest(report: PlanReport, _replan: Callable[[PlanRequest], PlanReport] | None) -> str:
    tier = breakdown_tier(report)  # the tier the report's breakdown shows
    if tier is None:
        return f"Nothing was sized, so there is no breakdown: {report.nothing_fits}"
    mem = tier.memory
    parts = sorted((c for c in mem.components if c.in_peak), key=lambda c: -c.bytes)
    rows = [(c.name, c.bytes, c.note) for c in parts]
    if mem.overhead_bytes:
        rows.append(("Runtime overhead (CUDA context, workspaces)", mem.overhead_bytes, "fixed per GPU"))
        rows.sort(key=lambda r: -r[1])
    top = rows[0]
    share = top[1] / mem.total_bytes if mem.total_bytes else 0.0
    lines = [
        f"**{top[0]}** takes the most: **{format_bytes(top[1])}**, {share:.0%} of the "
        f"{format_bytes(mem.total_bytes)} predicted peak ({tier.name}, micro batch {tier.config.micro_batch_size}, "
        f"seq {tier.config.seq_len:,}).",
    ]
    if top[2]:
        lines.append(f"- What changes it: {top[2]}")
    lines.append("")
    lines.append("| component | memory | share |")
    lines.append("|---|---|---|")
    lines += [f"| {name} | {format_bytes(b)} | {b / mem.total_bytes:.0%} |" for name, b, _ in rows if b]
    lines.append("")
    lines.append("Ask `explain <component>` for the formula behind any line.")
    return "\n".join(lines)


def _why_checkpointing(report: PlanReport, replan: Callable[[PlanRequest], PlanReport] | None) -> str:
    tier = report.recommended
    if tier is None:
        return f"Nothing fits, so no checkpointing choice was made: {report.nothing_fits}"
    on = tier.config.gradient_checkpointing
    state = "ON" if on else "OFF"
    forced = report.request.gradient_checkpointing is not None
    head = (f"Gradient checkpointing is **{state}** in the recommended config (micro batch {tier.config.micro_batch_size}, "
            f"{format_bytes(tier.memory.total_bytes)} predicted, headroom {format_bytes(tier.headroom_bytes, 1)}).")
    if forced:
        return head + f" You asked for it {'on' if on else 'off'}, so the plan kept it that way."
    lines = [head]
    other = None
    if replan is not None:
        try:
            other = replan(report.request.model_copy(update={"gradient_checkpointing": not on}))
        except AegisError as err:
            lines.append(f"- Planning the same job with checkpointing {'OFF' if on else 'ON'} failed: {err}")
    alt = other.recommended if other is not None else None
    if other is not None and alt is None:
        lines.append(f"- With checkpointing {'OFF' if on else 'ON'}, nothing fits with comfortable headroom "
                     f"on the {report.gpu.name}: {other.nothing_fits or 'no micro batch leaves enough room'}.")
    elif alt is not None:
        ratio = tier.relative_speed / alt.relative_speed if alt.relative_speed else 0.0
        lines.append(
            f"- With checkpointing {'OFF' if on else 'ON'}, the best fit is micro batch {alt.config.micro_batch_size} "
            f"at {format_bytes(alt.memory.total_bytes)} (headroom {format_bytes(alt.headroom_bytes, 1)}); the "
            f"recommended config is {ratio:.2f}x its estimated speed, so the plan takes the faster one.")
    if on:
        act = next((c for c in tier.memory.components if c.key == "activations"), None)
        if act is not None:
            lines.append(f"- Checkpointing keeps only each layer's input and recomputes the rest in backward "
                         f"(activations {format_bytes(act.bytes)}: {act.formula}); it costs about one extra forward.")
    lines.append(f"- The plan's reason: {tier.summary}")
    return "\n".join(lines)


def _time_and_cost(report: PlanReport, _replan: Callable[[PlanRequest], PlanReport] | None) -> str:
    tp = report.throughput
    if tp is None:
        return "This plan has no throughput estimate (nothing fits): " + (report.nothing_fits or "")
    how = "measured by `aegis benchmark`" if tp.source == "measured" else "estimated"
    basis = tp.basis if tp.basis.startswith(("measured by", "estimated from")) else f"{how}; {tp.basis}"  # names its source
    lines = [f"**Throughput:** {tp.tokens_per_s_low:,.0f} - {tp.tokens_per_s_high:,.0f} tokens/s ({basis})."]
    if report.num_rows is None or not tp.total_hours_high:
        lines.append("- **Time and cost** need the dataset's size: add it to the request, e.g. "
                     "`with ./data.jsonl`.")
        return "\n".join(lines)
    lines.append(f"- **Time:** {format_hours_range(tp.epoch_hours_low, tp.epoch_hours_high)} per epoch, "
                 f"{format_hours_range(tp.total_hours_low, tp.total_hours_high)} for {report.epochs:g} epochs "
                 f"({report.num_rows:,} rows, {report.steps_per_epoch or 0:,} steps per epoch).")
    if report.gpu.local:
        lines.append(f"- **Cost:** {format_usd(0)} on your own {report.gpu.name}"
                     + ("; the same hours rented:" if report.costs else "."))
    for c in report.costs[:4]:
        spent = ("under $0.01" if c.usd_high < 0.01 else  # a run of a few minutes on a cheap card
                 f"{format_usd(c.usd_low)} - {format_usd(c.usd_high)}")
        lines.append(f"{'  - ' if report.gpu.local else '- '}**{c.provider} ({c.gpu_id}):** "
                     f"{spent} at {format_usd(c.usd_per_hour)}/h per GPU "
                     f"(prices as of {c.as_of})")
    return "\n".join(lines)


_ANSWERS: dict[QuestionKind, Callable[[PlanReport, Callable[[PlanRequest], PlanReport] | None], str]] = {
    "largest_component": _largest,
    "why_checkpointing": _why_checkpointing,
    "time_and_cost": _time_and_cost,
}


def answer(report: PlanReport, kind: QuestionKind,
           replan: Callable[[PlanRequest], PlanReport] | None = None) -> str:
    """Markdown answering ``kind`` about ``report``; ``replan`` plans a variant request (for 'why checkpointing')."""
    return _ANSWERS[kind](report, replan)
