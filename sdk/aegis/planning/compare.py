"""Catalog views for the CLI and the agent: which GPUs fit a job (cheapest first), the model and GPU lists.

    rows = compare_gpus("lora qwen2.5-7b seq 2048")
    print(render_comparison(rows, "text"))
"""

from __future__ import annotations

import json
from typing import Literal

from pydantic import Field

from aegis.models import catalog
from aegis.planning import hardware
from aegis.errors import RequestParseError
from aegis.schema import Frozen, PlanRequest
from aegis.units import gib

__all__ = ["GPUFit", "compare_gpus", "render_comparison", "render_models", "render_gpus"]

Fmt = Literal["text", "markdown", "json"]


class GPUFit(Frozen):
    """One GPU's answer to a job."""

    gpu_id: str
    gpu_name: str
    memory_bytes: int
    fits: bool
    micro_batch_size: int | None = None
    gradient_checkpointing: bool | None = None
    peak_bytes: int | None = Field(default=None, description="Predicted total of the recommended tier (or the smallest tried).")
    tokens_per_s_low: float | None = None
    tokens_per_s_high: float | None = None
    usd_per_hour: float | None = Field(default=None, description="Cheapest listed price; None for unpriced cards.")
    total_usd_low: float | None = None
    total_usd_high: float | None = None


def compare_gpus(request: str | None = None, **fields) -> list[GPUFit]:
    """Plan the job on every catalog GPU; fitting GPUs first, cheapest first."""
    from aegis.planning.parse import parse_request
    from aegis.planning.planner import plan_request

    req = parse_request(request) if request else PlanRequest()
    req = req.merged(PlanRequest(**{k: v for k, v in fields.items() if v is not None}))
    if not req.model:
        raise RequestParseError("no model named: e.g. `aegis compare \"lora qwen2.5-7b\"`")
    dataset = None
    if req.dataset:  # analysed once, not once per GPU
        from aegis.data.profile import analyze_dataset
        from aegis.models.resolve import resolve_model

        dataset = analyze_dataset(req.dataset, model=resolve_model(req.model), seq_len=req.seq_len)
    rows: list[GPUFit] = []
    for gpu in hardware.list_gpus():
        report = plan_request(req.model_copy(update={"gpu": gpu.id}), dataset_profile=dataset)
        tier = report.recommended
        price = gpu.prices[0].usd_per_hour if gpu.prices else None
        t = report.throughput
        rows.append(GPUFit(
            gpu_id=gpu.id, gpu_name=gpu.name, memory_bytes=gpu.memory_bytes, fits=tier is not None,
            micro_batch_size=tier.config.micro_batch_size if tier else None,
            gradient_checkpointing=tier.config.gradient_checkpointing if tier else None,
            peak_bytes=tier.memory.total_bytes if tier else None,
            tokens_per_s_low=t.tokens_per_s_low if t else None, tokens_per_s_high=t.tokens_per_s_high if t else None,
            usd_per_hour=price,
            total_usd_low=t.total_hours_low * price * report.gpu_count if t and price and t.total_hours_high else None,
            total_usd_high=t.total_hours_high * price * report.gpu_count if t and price and t.total_hours_high else None,
        ))
    inf = float("inf")
    return sorted(rows, key=lambda r: (not r.fits, r.total_usd_high or inf, r.usd_per_hour or inf, r.memory_bytes))


def _table(headers: list[str], rows: list[list[str]], fmt: Fmt, title: str) -> str:
    if fmt == "markdown":
        lines = [f"**{title}**", "", "| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        return "\n".join(lines)
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for i, h in enumerate(headers):  # the first column names the row: whole; the others fold, never cut to '…'
        if i == 0:
            table.add_column(h, no_wrap=True, min_width=max((len(r[0]) for r in rows), default=len(h)))
        else:
            table.add_column(h, overflow="fold")
    for r in rows:
        table.add_row(*r)
    console = Console(width=120, record=True, force_terminal=False, color_system=None)
    with console.capture() as cap:
        console.print(table)
    return cap.get().rstrip()


def render_comparison(rows: list[GPUFit], fmt: Fmt = "text") -> str:
    if fmt == "json":
        return json.dumps([r.model_dump() for r in rows], indent=2)
    body = []
    for r in rows:
        body.append([
            r.gpu_id, gib(r.memory_bytes, 0), "yes" if r.fits else "no",
            gib(r.peak_bytes) if r.peak_bytes else "-",
            (f"mb {r.micro_batch_size}" + (" +ckpt" if r.gradient_checkpointing else "")) if r.fits else "-",
            f"{r.tokens_per_s_low:,.0f}-{r.tokens_per_s_high:,.0f}" if r.fits and r.tokens_per_s_low else "-",
            f"${r.usd_per_hour:.2f}/h" if r.usd_per_hour else "local",
            f"${r.total_usd_low:,.2f}-{r.total_usd_high:,.2f}" if r.total_usd_high else "-",
        ])
    return _table(["GPU", "memory", "fits", "peak", "config", "tok/s", "price", "run cost"], body, fmt,
                  "Which GPUs fit (cheapest first)")


def render_models(fmt: Fmt = "text") -> str:
    from aegis.models.resolve import resolve_model

    rows = []
    for entry in catalog.models():
        p = resolve_model(entry.id)
        rows.append({"id": entry.id, "architecture": p.architecture, "params": p.total_params,
                     "active_params": p.active_params_per_token, "aliases": list(entry.aliases)})
    if fmt == "json":
        return json.dumps(rows, indent=2)
    body = [[r["id"], r["architecture"], f"{r['params'] / 1e9:.2f}B",
             f"{r['active_params'] / 1e9:.2f}B" if r["active_params"] != r["params"] else "", ", ".join(r["aliases"][:3])]
            for r in rows]
    return _table(["model", "architecture", "params", "active", "aliases"], body, fmt, "Bundled models (offline)")


def render_gpus(fmt: Fmt = "text") -> str:
    gpus = hardware.list_gpus()
    if fmt == "json":
        return json.dumps([g.model_dump() for g in gpus], indent=2)
    body = [[g.id, g.name, gib(g.memory_bytes), gib(g.overhead_bytes),
             f"{g.bf16_tflops:g}" + ("" if g.bf16_native else " (emulated)"), f"{g.tflops('fp16_mixed'):g}",
             f"${g.prices[0].usd_per_hour:.2f}/h ({g.prices[0].provider})" if g.prices else "local"]
            for g in gpus]
    return _table(["id", "name", "memory", "overhead", "bf16 TFLOPS", "fp16 TFLOPS", "cheapest"], body, fmt,
                  "GPU catalog")
