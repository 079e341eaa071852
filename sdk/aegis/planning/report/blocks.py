"""Slack Block Kit rendering of a `PlanReport`: summary, memory table, tiers, risks, a "Start run" button.

The blocks respect Block Kit's limits (at most 50 blocks, section text <= 3000 characters,
header <= 150, at most 10 fields of <= 2000 each, button text <= 75 and value <= 2000), so the Slack
bot can post them as they are. The button's ``action_id`` is ``start_run``; its ``value`` is the
plan's request as JSON, which the bot turns back into a `PlanRequest` to start the run.

    from aegis.planning.report import render_blocks
    client.chat_postMessage(channel=ch, text=verdict, blocks=render_blocks(report))
"""

from __future__ import annotations

from typing import Any

from aegis.planning.report._layout import Table
from aegis.planning.report._sections import breakdown_tier, build_sections
from aegis.planning.report.format import (
    format_bytes,
    format_bytes_range,
    format_hours_range,
    format_int,
    format_params,
    format_rate,
    format_share,
    headroom_verdict,
    method_label,
    method_short,
)
from aegis.schema import PlanReport, Tier

__all__ = ["render_blocks", "START_RUN_ACTION_ID", "LIMITS"]

START_RUN_ACTION_ID = "start_run"
"""``action_id`` of the "Start run" button (the Slack bot routes on it)."""

LIMITS = {
    "blocks": 50,
    "section_text": 3000,
    "header_text": 150,
    "fields": 10,
    "field_text": 2000,
    "context_elements": 10,
    "button_text": 75,
    "button_value": 2000,
}
"""Block Kit limits the renderer keeps to (api.slack.com/reference/block-kit/blocks)."""

_RISK_EMOJI = {"ok": ":white_check_mark:", "warn": ":warning:", "danger": ":x:"}


def _esc(text: str) -> str:
    """Escape the three characters Slack mrkdwn reserves."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _mrkdwn(text: str, limit: int = LIMITS["section_text"]) -> dict[str, Any]:
    return {"type": "mrkdwn", "text": _clip(text, limit)}


def _section(text: str) -> dict[str, Any]:
    return {"type": "section", "text": _mrkdwn(text)}


def _tier_text(report: PlanReport, label: str, tier: Tier) -> str:
    cfg = tier.config
    parts = [f"bs {cfg.micro_batch_size} x accum {cfg.gradient_accumulation_steps}", f"seq {format_int(cfg.seq_len)}"]
    if cfg.method != "full":
        parts.append(f"rank {cfg.lora_config.rank}")
    parts.append(f"ckpt {'ON' if cfg.gradient_checkpointing else 'OFF'}")
    parts.append(cfg.optimizer + (" + chunked CE" if cfg.chunked_cross_entropy else ""))
    memory = f"{format_bytes(tier.memory.high_bytes, 1)} high end, {format_bytes(tier.headroom_bytes, 1)} headroom"
    return f"*{_esc(label)}*: {_esc(', '.join(parts))} → {memory}\n_{_esc(tier.summary)}_"


def _summary(report: PlanReport) -> str:
    rec = report.recommended
    if rec is None:
        return f":x: *Does not fit.* {_esc(report.nothing_fits or 'No configuration fits this GPU.')}"
    return (
        f":white_check_mark: *Fits* with {format_bytes(rec.headroom_bytes, 1)} headroom "
        f"({headroom_verdict(rec.headroom_bytes, report.gpu)}): {format_bytes(rec.memory.total_bytes)} predicted "
        f"({format_bytes_range(rec.memory.low_bytes, rec.memory.high_bytes)})."
    )


def _shown_config(report: PlanReport):
    tier = breakdown_tier(report)
    return tier.config if tier is not None else None


def _fields(report: PlanReport) -> list[dict[str, Any]]:
    m = report.model
    fields = [
        f"*Model*\n{_esc(m.model_id)}\n{format_params(m.total_params)} params, {m.num_layers} layers",
        f"*Hardware*\n{_esc(report.gpu.name)}" + (f" x {report.gpu_count}" if report.gpu_count > 1 else "")
        + f"\n{format_bytes(report.usable_bytes, 1)} usable",
        f"*Method*\n{_esc(method_label(report.method, _shown_config(report)))}\n{format_params(report.trainable_params)} trainable "
        f"({format_share(report.trainable_params / m.total_params) if m.total_params else 'n/a'})",
    ]
    ds = report.dataset
    if ds is not None:
        exact = "exact" if ds.tokenizer_exact else "approximate"
        fields.append(
            f"*Dataset*\n{_esc(ds.source)}: {format_int(ds.num_rows)} rows\np95 {format_int(ds.tokens.p95)} tokens "
            f"({exact} tokenizer)"
        )
    tp = report.throughput
    if tp is not None:
        fields.append(
            f"*Throughput* ({tp.source})\n~{format_rate(tp.tokens_per_s_low)}-{format_rate(tp.tokens_per_s_high)} tok/s"
        )
        if report.num_rows is not None:
            fields.append(f"*Time*\n{report.epochs:g} epochs ~ {format_hours_range(tp.total_hours_low, tp.total_hours_high)}")
    if report.costs:
        cheapest = min(report.costs, key=lambda c: c.usd_low)
        label = "Cloud equivalent" if cheapest.counterfactual else "Cost"
        local = "$0.00 locally; " if report.gpu.local else ""
        fields.append(
            f"*{label}*\n{local}~${cheapest.usd_low:,.2f}-{cheapest.usd_high:,.2f} on {_esc(cheapest.provider)} "
            f"({_esc(cheapest.gpu_id)})"
        )
    return [_mrkdwn(f, LIMITS["field_text"]) for f in fields[: LIMITS["fields"]]]


def _memory_block(report: PlanReport) -> dict[str, Any] | None:
    memory = next((s for s in build_sections(report) if s.key == "memory"), None)
    tier = breakdown_tier(report)
    if memory is None or tier is None:
        return None
    table = next(item for item in memory.items if isinstance(item, Table))
    width = max(len(row.name) for row in table.rows)
    lines = [f"{row.name:<{width}}  {row.amount:>14}" for row in table.rows]
    head = f"*VRAM breakdown* {_esc(memory.subtitle)}\n"
    tail = f"\nHeadroom: {format_bytes(tier.headroom_bytes, 1)} ({headroom_verdict(tier.headroom_bytes, report.gpu)})"
    body = "```" + _esc("\n".join(lines)) + "```"
    room = LIMITS["section_text"] - len(head) - len(tail)
    if len(body) > room:
        body = "```" + _clip(_esc("\n".join(lines)), room - 6) + "```"
    return _section(head + body + tail)


def _tiers_block(report: PlanReport) -> dict[str, Any] | None:
    entries: list[str] = []
    if report.recommended is not None:
        entries.append(_tier_text(report, "Recommended", report.recommended))
    if report.aggressive is not None:
        entries.append(_tier_text(report, "Aggressive", report.aggressive))
    for i, t in enumerate(report.fallbacks, 1):
        entries.append(_tier_text(report, f"Fallback {i}", t))
    if not entries:
        return None
    text = ""
    for i, entry in enumerate(entries):
        if len(text) + len(entry) + 2 > LIMITS["section_text"] - 60:
            text += f"\n_…and {len(entries) - i} more in the full report_"
            break
        text += ("\n\n" if text else "") + entry
    return _section(text)


def _risks_block(report: PlanReport) -> dict[str, Any] | None:
    if not report.risks:
        return None
    lines = [f"{_RISK_EMOJI[r.level]} *{_esc(r.title)}*: {_esc(r.detail)}" for r in report.risks]
    return _section("*Risks*\n" + "\n".join(lines))


def _context(report: PlanReport) -> dict[str, Any] | None:
    elements = []
    if report.throughput is not None:
        basis = report.throughput.basis
        if report.throughput.source == "estimated":
            basis += "; run `aegis benchmark` to calibrate"
        elements.append(_mrkdwn(f"Throughput: {_esc(basis)}"))
    if report.dataset is not None:
        elements.append(_mrkdwn(f"Seq len {format_int(report.dataset.seq_len)}: {_esc(report.dataset.seq_len_reason)}"))
    if not elements:
        return None
    return {"type": "context", "elements": elements[: LIMITS["context_elements"]]}


def _actions(report: PlanReport) -> dict[str, Any] | None:
    if report.recommended is None:
        return None
    value = report.request.model_dump_json(exclude_none=True)
    if len(value) > LIMITS["button_value"]:
        value = report.request.model_copy(update={"dataset": None}).model_dump_json(exclude_none=True)
    return {
        "type": "actions",
        "elements": [
            {
                "type": "button",
                "action_id": START_RUN_ACTION_ID,
                "text": {"type": "plain_text", "text": "Start run", "emoji": True},
                "style": "primary",
                "value": value,
                "confirm": {
                    "title": {"type": "plain_text", "text": "Start this run?"},
                    "text": _mrkdwn(
                        f"Train {_esc(report.model.model_id)} with the recommended config on {_esc(report.gpu.name)}.",
                        300,
                    ),
                    "confirm": {"type": "plain_text", "text": "Start"},
                    "deny": {"type": "plain_text", "text": "Cancel"},
                },
            }
        ],
    }


def render_blocks(report: PlanReport) -> list[dict[str, Any]]:
    """The report as Slack Block Kit blocks (within Block Kit's limits)."""
    title = f"Aegis plan: {method_short(report.method)} {report.model.model_id.split('/')[-1]} on {report.gpu.name}"
    if report.gpu_count > 1:
        title += f" x {report.gpu_count}"
    blocks: list[dict[str, Any] | None] = [
        {"type": "header", "text": {"type": "plain_text", "text": _clip(title, LIMITS["header_text"]), "emoji": True}},
        _section(_summary(report)),
        {"type": "section", "fields": _fields(report)},
        {"type": "divider"},
        _memory_block(report),
        _tiers_block(report),
        _risks_block(report),
        _context(report),
        _actions(report),
    ]
    out = [b for b in blocks if b is not None]
    return out[: LIMITS["blocks"]]
