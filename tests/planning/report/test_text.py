"""The terminal report: every section of the seed's example, every figure with its reason, plain and coloured."""

from __future__ import annotations

import io
import re
from pathlib import Path

from rich.console import Console

from aegis.planning.report import print_report, render_text
from aegis.planning.report._sections import Line, build_sections
from aegis.schema import Risk

EXAMPLE_TEXT = Path(__file__).with_name("report-example.txt")
"""The seed design's example report (a copy of shared/report-example.txt)."""


def _flat(text: str) -> str:
    return " ".join(text.split())


def _example_titles() -> list[str]:
    """Section titles of the seed example: its unindented lines, up to the first ':' or '('."""
    titles = []
    for line in EXAMPLE_TEXT.read_text().splitlines():
        if line and not line[0].isspace() and not line.startswith("$"):
            titles.append(re.split(r"[:(]", line)[0].strip())
    return titles


def test_example_titles_are_read():
    titles = _example_titles()
    assert titles[:4] == ["Model", "Dataset", "Hardware", "What you're training"]
    assert {"VRAM Breakdown", "Recommended Config", "Aggressive Config", "Estimates", "Risks", "Fallbacks"} <= set(titles)


def test_every_section_of_the_example(example_report):
    out = render_text(example_report)
    heads = [line for line in out.splitlines() if line and not line[0].isspace()]
    for title in _example_titles():
        assert any(h.startswith(title) for h in heads), f"section {title!r} missing; heads: {heads}"
    # same order as the example
    order = [next(i for i, h in enumerate(heads) if h.startswith(t)) for t in _example_titles()]
    assert order == sorted(order)


def test_every_figure_has_its_reason(example_report):
    out = _flat(render_text(example_report, explain=True))
    r = example_report
    rec = r.recommended
    for c in rec.memory.components:
        assert _flat(c.formula) in out, c.key
        if c.note:
            assert _flat(c.note) in out
    assert _flat(r.dataset.seq_len_reason) in out
    assert r.dataset.tokenizer in out
    assert ("approximate" in out) != r.dataset.tokenizer_exact
    assert _flat(rec.summary) in out
    if r.aggressive is not None:
        assert _flat(r.aggressive.summary) in out
    else:  # the section stays, with the solver's reason
        assert "Aggressive Config: none: nothing faster than the recommended config fits" in out
    assert _flat(r.throughput.basis) in out and "(estimated)" in out and "aegis benchmark" in out
    for risk in r.risks:
        assert _flat(risk.detail) in out
    for tier in r.fallbacks:
        assert _flat(tier.summary) in out
    for marker, level in (("[ok]", "ok"), ("[!!]", "warn"), ("[XX]", "danger")):
        assert (marker in out) == any(x.level == level for x in r.risks)
    assert "Cost: $0.00 (local)" in out and "Cloud equivalent" in out  # the 3090 is a local card
    assert f"Grad checkpointing: {'ON' if rec.config.gradient_checkpointing else 'OFF'}" in out


def test_numeric_lines_carry_a_reason(example_report, multi_gpu_report, full_report):
    """Any line with a number in it says why, except risks (their detail is the reason) and notes."""
    for report in (example_report, multi_gpu_report, full_report):
        for section in build_sections(report, explain=True):
            if section.key in {"risks", "notes"}:
                continue
            for item in section.items:
                if isinstance(item, Line) and item.label not in {"Method", "Note", "Why"} and re.search(r"\d", item.value):
                    assert item.reason, f"{section.key}/{item.label}: {item.value!r} has no reason"


def test_numbers_match_the_report(example_report):
    out = render_text(example_report)
    cfg = example_report.recommended.config
    assert (
        f"Micro batch: {cfg.micro_batch_size} | Grad accum: {cfg.gradient_accumulation_steps} | "
        f"Effective: {cfg.effective_batch_size}" in out
    )
    assert f"{example_report.recommended.memory.total_bytes / 2**30:.2f} GiB" in out
    assert f"{example_report.dataset.num_rows:,} rows" in out
    assert f"{example_report.steps_per_epoch:,} optimizer steps per epoch" in out


def test_plain_text_has_no_ansi_and_colour_has(example_report):
    assert "\x1b[" not in render_text(example_report)
    assert "\x1b[" in render_text(example_report, color=True)


def test_width_is_respected(example_report):
    for width in (40, 80, 120):
        for explain in (False, True):
            assert max(len(line) for line in render_text(example_report, width=width, explain=explain).splitlines()) <= width


def test_default_report_is_compact_and_explain_adds_the_detail(example_report):
    """The issue's bar: about 60 lines at 100 columns with every decision and number; --explain the formulas."""
    out = render_text(example_report, width=100)
    assert len(out.splitlines()) <= 60 and max(len(line) for line in out.splitlines()) <= 100
    explained = render_text(example_report, width=100, explain=True)
    assert len(explained.splitlines()) > len(out.splitlines())
    rec, flat = example_report.recommended, _flat(out)
    for c in rec.memory.components:  # every number of the breakdown, no formula
        assert f"{c.bytes / 2**30:.2f} GiB" in flat and _flat(c.formula) not in flat
        assert _flat(c.formula) in _flat(explained)
    for tier in example_report.fallbacks:
        assert f"-> {tier.memory.total_bytes / 2**30:.1f} GiB" in flat
    for risk in example_report.risks:
        assert _flat(risk.detail) in flat
    assert _flat(rec.summary) in flat and f"Grad checkpointing: {'ON' if rec.config.gradient_checkpointing else 'OFF'}" in flat


def test_qlora_report_does_not_contradict_itself(example_report):
    """QLoRA: PEFT adapters and AdamW states are fp32 -- the method line, breakdown and kernels all say so."""
    for explain in (False, True):
        out = _flat(render_text(example_report, explain=explain))
        assert "bf16 adapters" not in out and "QLoRA (NF4 base + fp32 adapters)" in out
        assert "LoRA adapters (fp32)" in out and "Optimizer states (AdamW, fp32)" in out
        assert "optimizer states in bf16" not in out


def test_nothing_fits(nothing_fits_report):
    r = nothing_fits_report
    assert r.recommended is None
    out = render_text(r)
    assert "Nothing fits:" in out
    assert _flat(r.nothing_fits) in _flat(out)
    assert "Recommended Config" not in out and "[XX]" in out
    assert "Cost:" not in out  # no cost for a job that cannot run


def test_multi_gpu_section(multi_gpu_report, example_report):
    out = render_text(multi_gpu_report)
    mg = multi_gpu_report.multi_gpu
    assert "Multi-GPU" in out and "<- assumed" in out
    assert f"{mg.ddp_bytes / 2**30:.2f} GiB per GPU" in out and f"{mg.fsdp_bytes / 2**30:.2f} GiB per GPU" in out
    assert _flat(mg.reason) in _flat(out)
    assert "Multi-GPU" not in render_text(example_report)


def test_full_fine_tune_has_no_lora_line(full_report):
    out = render_text(full_report)
    assert "Full fine-tuning" in out and "LoRA:" not in out


def test_user_text_is_not_rich_markup(example_report):
    report = example_report.model_copy(update={"risks": (Risk(level="warn", title="[bold]odd[/bold]", detail="see [red]this[/red]"),)})
    out = render_text(report)
    assert "[bold]odd[/bold]" in out and "see [red]this[/red]" in out


def test_print_report_writes_to_the_console(example_report):
    buffer = io.StringIO()
    print_report(example_report, Console(file=buffer, width=100, no_color=True, force_terminal=False))
    assert "Recommended Config:" in buffer.getvalue()


def test_every_figure_of_the_aggressive_tier_has_its_reason(aggressive_report):
    out = _flat(render_text(aggressive_report, explain=True))
    assert _flat(aggressive_report.aggressive.summary) in out and "Aggressive Config" in out
    assert "fits, but OOM is likely on the longest sequences" in out


def test_measured_throughput_and_cloud_cost(example_report, aggressive_report):
    from aegis.planning.hardware import find_gpu
    from aegis.schema import Cost

    gpu = find_gpu("a100-80gb")
    price = gpu.prices[0]
    tp = example_report.throughput.model_copy(update={"source": "measured", "basis": "aegis benchmark, 2026-01"})
    cost = Cost(gpu_id=gpu.id, provider=price.provider, usd_low=1.5, usd_high=2.25, usd_per_hour=price.usd_per_hour, as_of=price.as_of)
    out = _flat(render_text(example_report.model_copy(update={"gpu": gpu, "throughput": tp, "costs": (cost,)}), explain=True))
    assert "(measured)" in out and "to calibrate" not in out and "aegis benchmark, 2026-01" in out
    assert f"Cost: ~$1.50-$2.25 on {price.provider} ({gpu.id})" in out and "(local)" not in out
    rented = aggressive_report.model_copy(update={"gpu": gpu, "throughput": tp, "costs": (cost,)})
    assert "restart costs money" in _flat(render_text(rented, explain=True))  # the aggressive tier's advice on a rented GPU


# --- the plain layout (no rich import for `aegis plan`) against rich's own layout of the same sections ---------

from hypothesis import HealthCheck, assume, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from aegis.models import catalog  # noqa: E402
from aegis.errors import AegisError  # noqa: E402
from aegis.planning.planner import plan  # noqa: E402
from aegis.planning.report import text as text_module  # noqa: E402
from aegis.planning.report._layout import Row, Section, Table  # noqa: E402


def _both(sections, width, explain):
    """(what rich prints, what the plain layout prints or None where it hands over to rich)."""
    want = text_module._rich_text(sections, width=width, color=False, explain=explain)
    lines = text_module._plain_lines(sections, width, explain)
    return want, None if lines is None else "\n".join(lines) + "\n"


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    model=st.sampled_from([m.id for m in catalog.models()]),
    gpu=st.sampled_from([g.id for g in catalog.gpus()]),
    method=st.sampled_from(["full", "lora", "qlora"]),
    gpu_count=st.sampled_from([1, 2, 4]),
    explain=st.booleans(),
    width=st.sampled_from([60, 80, 100, 120]),
)
def test_plain_layout_equals_rich_on_any_plan(model, gpu, method, gpu_count, explain, width):
    try:
        report = plan(model=model, gpu=gpu, method=method, gpu_count=gpu_count)
    except AegisError:
        assume(False)
    sections = build_sections(report, explain=explain)
    want, got = _both(sections, width, explain)
    if width >= 80:  # a plan's cells fit 80 columns: the plain layout must not hand over to rich
        assert got is not None
    assert got is None or got == want
    assert render_text(report, width=width, explain=explain) == want


def test_the_example_plan_is_laid_out_without_rich(example_report, multi_gpu_report, full_report, nothing_fits_report):
    for report in (example_report, multi_gpu_report, full_report, nothing_fits_report):
        for explain in (False, True):
            sections = build_sections(report, explain=explain)
            want, got = _both(sections, 100, explain)
            assert got == want


WORDS = st.text(alphabet="abc:.-", min_size=1, max_size=30)
CELL = st.lists(WORDS, min_size=0, max_size=12).map(" ".join) | st.sampled_from(["", " lead", "trail  ", "a  b"])


@settings(max_examples=300, deadline=None)
@given(
    labels=st.lists(st.tuples(st.sampled_from(["", "Label", "Long label text", "Risk."]), CELL, CELL,
                              st.sampled_from(["", "ok", "warn", "danger"])), min_size=1, max_size=4),
    rows=st.lists(st.tuples(WORDS, st.sampled_from(["1.00 GiB", "12.34 GiB", "  0 B"]), CELL), max_size=3),
    key=st.sampled_from(["model", "memory", "risks", "notes"]),
    subtitle=CELL,
    width=st.integers(8, 110),
    explain=st.booleans(),
)
def test_plain_layout_equals_rich_on_random_cells(labels, rows, key, subtitle, width, explain):
    # Long words (folded), empty cells, leading and doubled spaces, labels wider than the space (handed to rich).
    items = [Line(label=label, value=value, reason=reason, level=level) for label, value, reason, level in labels]
    if rows:
        items.insert(1, Table(columns=("Component", "Memory", "How"), rows=tuple(Row(*r) for r in rows)))
    sections = [Section(key=key, title="Title", subtitle=subtitle, items=tuple(items)),
                Section(key="memory", title="Second", items=tuple(items[:1]))]
    want, got = _both(sections, width, explain)
    assert got is None or got == want


def test_text_rich_cannot_lay_out_goes_through_rich(example_report):
    # Non-ASCII (a wide character) is left to rich; the result is still rich's.
    sections = [Section(key="notes", title="Notes", items=(Line(label="", value="模型 is two cells per character"),))]
    want, got = _both(sections, 40, False)
    assert got is None and "模型" in want


def test_cli_text_plan_does_not_import_rich():
    # Start-up (issue 13): the plain report is laid out without rich; the JAX memory profile is not loaded either.
    import subprocess
    import sys

    code = (
        "import sys, io, contextlib\n"
        "from aegis.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
        "    try:\n        main(['plan', 'qlora llama-3.1-8b on 3090'])\n    except SystemExit:\n        pass\n"
        "assert 'Recommended Config' in out.getvalue(), out.getvalue()\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'rich' or m == 'aegis.planning.memory.jax_profile'))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "[]", proc.stdout + proc.stderr
