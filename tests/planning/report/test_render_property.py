"""Every renderer handles any plan the planner can produce: random catalog models, GPUs, methods, counts."""

from __future__ import annotations

import json

import yaml

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from aegis.models import catalog
from aegis.errors import AegisError
from aegis.planning.planner import plan
from aegis.planning.report import emit, render_blocks, render_json, render_markdown, render_text
from aegis.planning.report.blocks import LIMITS
from aegis.schema import PlanReport

MODELS = [m.id for m in catalog.models()]
GPUS = [g.id for g in catalog.gpus()]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    model=st.sampled_from(MODELS),
    gpu=st.sampled_from(GPUS),
    method=st.sampled_from(["full", "lora", "qlora"]),
    gpu_count=st.sampled_from([1, 2, 4]),
    seq_len=st.sampled_from([None, 512, 4096]),
)
def test_any_plan_renders(model, gpu, method, gpu_count, seq_len):
    try:
        report = plan(model=model, gpu=gpu, method=method, gpu_count=gpu_count, seq_len=seq_len)
    except AegisError:
        assume(False)
    text = render_text(report, width=100)
    assert max(len(line) for line in text.splitlines()) <= 100
    assert ("Nothing fits:" in text) == (report.recommended is None)
    assert ("Multi-GPU" in text) == (report.gpu_count > 1 and report.multi_gpu is not None)
    md = render_markdown(report)
    assert md.startswith("### Aegis plan:")
    assert PlanReport.model_validate_json(render_json(report)) == report
    blocks = render_blocks(report)
    assert len(blocks) <= LIMITS["blocks"]
    assert all(len(b["text"]["text"]) <= LIMITS["section_text"] for b in blocks if "text" in b and b["type"] == "section")
    json.dumps(blocks)
    if report.recommended is not None:
        for kind in ("axolotl", "hf", "unsloth"):
            out = emit(report, kind)
            if kind == "axolotl":
                assert yaml.safe_load(out)["micro_batch_size"] == report.recommended.config.micro_batch_size
            else:
                compile(out, f"{kind}.py", "exec")
