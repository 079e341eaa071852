"""Every section of a rendered plan states the same facts: random plans, parsed back from text, Markdown and JSON.

The JSON is the engine's own record (component formulas with their bytes per element, the tiers' configs,
totals in bytes); the text and Markdown must agree with it and with themselves on the adapters' dtype,
the optimizer states' dtype, the batch and the totals -- in the compact report and with --explain.
"""

from __future__ import annotations

import json
import re

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from aegis.models import catalog
from aegis.errors import AegisError
from aegis.planning.planner import plan
from aegis.planning.report import render_json, render_markdown, render_text

MODELS = [m.id for m in catalog.models()]
GPUS = [g.id for g in catalog.gpus()]
GIB = 2**30
_DTYPE = {"2": "bf16", "4": "fp32"}


def _expected(data: dict) -> dict | None:
    """What every section must say, read from the JSON (the breakdown's tier: recommended, else the smallest)."""
    tiers = [t for t in (data["recommended"], data["aggressive"]) if t] + list(data["fallbacks"])
    if not tiers:
        return None
    tier = data["recommended"] or min(tiers, key=lambda t: t["memory"]["total_bytes"])
    cfg, comps = tier["config"], {c["key"]: c for c in tier["memory"]["components"]}
    out = {
        "tier": tier,
        "micro": cfg["micro_batch_size"],
        "accum": cfg["gradient_accumulation_steps"],
        "effective": cfg["micro_batch_size"] * cfg["gradient_accumulation_steps"] * data["gpu_count"],
        "total": f"{tier['memory']['total_bytes'] / GIB:.2f} GiB",
        "adapters": None,
        "optimizer": None,
    }
    if "adapters" in comps:  # "41,943,040 params (rank 16) x 4 B": the bytes the engine sized them with
        out["adapters"] = _DTYPE[re.search(r"x (\d) B", comps["adapters"]["formula"]).group(1)]
    elif cfg["method"] != "full":
        out["adapters"] = "fp32"
    if cfg["optimizer"] == "adamw":  # "2 states x N x 4 B"
        out["optimizer"] = _DTYPE[re.search(r"x (\d) B", comps["optimizer"]["formula"]).group(1)]
    return out


def _one(pattern: str, text: str) -> set[str]:
    return set(re.findall(pattern, " ".join(text.split())))


def _check_text(text: str, exp: dict, method: str, recommended: bool, explain: bool) -> None:
    flat = " ".join(text.split())
    if exp["adapters"]:
        assert _one(r"base \+ (\w+) adapters", flat) == {exp["adapters"]}
        assert _one(r"LoRA adapters \((\w+)\)", flat) <= {exp["adapters"]}
        if explain:
            assert _one(r"adapters (bf16|fp32)\b", flat) == {exp["adapters"]}
    else:
        assert "adapters" not in flat.split("Risks")[0].lower() or method != "full"
    if exp["optimizer"]:
        assert _one(r"Optimizer states \(AdamW, (\w+)\)", flat) == {exp["optimizer"]}
        if recommended:
            assert _one(r"Optimizer: AdamW \((\w+) states\)", flat) == {exp["optimizer"]}
        if explain and recommended:
            assert _one(r"optimizer states (bf16|fp32)\b", flat) == {exp["optimizer"]}
    assert not re.search(r"optimizer states in bf16", flat) or exp["optimizer"] == "bf16"
    assert _one(r"\bTotal:? (\d+\.\d\d GiB)", flat) == {exp["total"]}
    if recommended:
        batch = _one(r"Micro batch: (\d+) \| Grad accum: (\d+) \| Effective: (\d+)", flat)
        assert (str(exp["micro"]), str(exp["accum"]), str(exp["effective"])) in batch
        assert _one(r"Predicted: (\d+\.\d\d GiB)", flat) == {exp["total"]}


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    model=st.sampled_from(MODELS),
    gpu=st.sampled_from(GPUS),
    method=st.sampled_from(["full", "lora", "qlora"]),
    precision=st.sampled_from([None, "bf16", "bf16_mixed", "fp32"]),
    optimizer=st.sampled_from([None, "adamw", "adamw_8bit", "paged_adamw_8bit", "sgd"]),
    batch=st.sampled_from([None, 1, 4]),
    seq_len=st.sampled_from([None, 512, 2048]),
    gpu_count=st.sampled_from([1, 2]),
)
def test_sections_agree_on_dtypes_batch_and_totals(model, gpu, method, precision, optimizer, batch, seq_len, gpu_count):
    try:
        report = plan(model=model, gpu=gpu, method=method, precision=precision, optimizer=optimizer,
                      micro_batch_size=batch, seq_len=seq_len, gpu_count=gpu_count)
    except AegisError:
        assume(False)
    exp = _expected(json.loads(render_json(report)))
    assume(exp is not None)
    recommended = report.recommended is not None
    for explain in (False, True):
        text = render_text(report, width=100, explain=explain)
        assert max(len(line) for line in text.splitlines()) <= 100
        _check_text(text, exp, method, recommended, explain)
        md = render_markdown(report, explain=explain)
        assert not any(line.startswith("|") for line in md.splitlines())
        _check_text(md.replace("**", ""), exp, method, recommended, explain)
    if recommended:
        verdict = render_markdown(report).splitlines()[2]
        m = re.search(r"micro batch (\d+) x grad accum (\d+) \(effective (\d+)\).* -> (\d+\.\d\d GiB) predicted", verdict)
        assert m and m.groups() == (str(exp["micro"]), str(exp["accum"]), str(exp["effective"]), exp["total"])
