"""One story per report: random requests (tiny models to MoEs, one GPU to thousands, micro batch 1 to huge, forced
checkpointing on and off), rendered as text, Markdown and JSON, and the sections checked against each other and
against physics.

- one decision: "nothing fits" never beside a tier that fits, "comfortable" or a positive headroom; never "short by"
  a negative amount; the Markdown verdict says the same;
- checkpointing is stated ON or OFF the same way by every section that states it (recommended config, its reason,
  the breakdown's heading, the Multi-GPU comparison, the chat verdict), and as the JSON's recommended config has it;
- the batch the verdict, the recommended config and the steps per epoch use is one batch;
- every fallback fits its budget, and no two fallbacks (nor a fallback and the recommended tier) read the same memory
  figure;
- throughput never exceeds what the card's catalog peak allows for the planner's own FLOPs per token (at 100% MFU),
  nor what its bandwidth allows for the saved activations and logits the JSON's breakdown lists (written once, read
  once);
- the predicted range's low end is not below the fixed runtime overhead;
- no warning is about a component of 0.0 GiB.
"""

from __future__ import annotations

import json
import math
import re
from functools import lru_cache
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import aegis
from aegis.models import catalog
from aegis.errors import AegisError
from aegis.models.resolve import resolve_model
from aegis.planning.planner import plan_request
from aegis.planning.report import render_json, render_markdown, render_text
from aegis.schema import PlanRequest
from aegis.planning.throughput import flops_per_token

GIB = 2**30
TINY_LLAMA = str(Path(aegis.__file__).parent / "data" / "demo" / "tiny-llama" / "config.json")
TINY = [TINY_LLAMA, "EleutherAI/pythia-14m", "EleutherAI/pythia-70m", "distilbert/distilgpt2",
        "HuggingFaceTB/SmolLM2-135M", "facebook/opt-125m"]
MODELS = [m.id for m in catalog.models()]
GPUS = [g.id for g in catalog.gpus()]
SUPPORT = str(Path(aegis.__file__).parent / "data" / "examples" / "support.jsonl")


@pytest.fixture(autouse=True, scope="module")
def _no_calibration(tmp_path_factory):
    """Estimates only: a measurement stored on this machine would replace the roofline under test."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AEGIS_HOME", str(tmp_path_factory.mktemp("aegis-home")))
        yield


@lru_cache(maxsize=1)
def _dataset():
    from aegis.data.profile import analyze_dataset

    return analyze_dataset(SUPPORT)


def _flat(text: str) -> str:
    return " ".join(text.replace("**", "").split())


def _section(text: str, title: str) -> str:
    """The lines of the plain-text section starting with ``title`` (up to the next unindented line)."""
    out, inside = [], False
    for line in text.splitlines():
        if line.startswith(title):
            inside = True
            out.append(line)
        elif inside and line.startswith("  "):
            out.append(line)
        elif inside:
            break
    return " ".join(" ".join(out).split())


def _gib(figure: str) -> float:
    return float(figure)


def _check_decision(data: dict, texts: list[str], verdict: str) -> None:
    rec = data["recommended"]
    for text in texts:
        flat = _flat(text)
        for short in re.findall(r"short by (-?\d+\.\d+) GiB", flat):
            assert _gib(short) > 0, short
        if rec is None:
            assert "Nothing fits" in flat
            assert "comfortable" not in flat and " tight" not in flat, flat
            assert not re.search(r"[Hh]eadroom:? \d", flat), flat
            assert "Fallbacks" not in flat and "Recommended Config" not in flat
        else:
            assert "Nothing fits" not in flat
    if rec is None:
        assert verdict.startswith("**Does not fit.**")
        assert not data["fallbacks"] and data["aggressive"] is None  # no fitting tier beside "nothing fits"
    else:
        assert verdict.startswith("**Fits.**")
        assert rec["fits"] and rec["headroom_bytes"] >= 0


def _check_checkpointing(data: dict, text: str, verdict: str) -> None:
    rec = data["recommended"]
    if rec is None:
        return
    want = "ON" if rec["config"]["gradient_checkpointing"] else "OFF"
    said = re.findall(r"(?i)checkpointing:? (ON|OFF)\b", _section(text, "Recommended Config"))
    said += re.findall(r"checkpointing (ON|OFF)\)", _section(text, "Multi-GPU"))
    said += re.findall(r"grad ckpt (ON|OFF)", verdict)
    assert said and set(said) == {want}, (said, want)
    heading = _section(text, "VRAM Breakdown").split(":")[0]
    assert ("grad ckpt" in heading) == (want == "ON"), heading


def _check_batch(data: dict, text: str, verdict: str) -> None:
    rec = data["recommended"]
    if rec is None:
        return
    cfg = rec["config"]
    effective = cfg["micro_batch_size"] * cfg["gradient_accumulation_steps"] * data["gpu_count"]
    want = (str(cfg["micro_batch_size"]), str(cfg["gradient_accumulation_steps"]), str(effective))
    m = re.search(r"micro batch (\d+) x grad accum (\d+) \(effective (\d+)\)", verdict)
    assert m and m.groups() == want
    assert re.findall(r"Micro batch: (\d+) \| Grad accum: (\d+) \| Effective: (\d+)",
                      _section(text, "Recommended Config")) == [want]
    if data["num_rows"] is not None:
        steps = re.search(r"Steps: ([\d,]+) optimizer steps per epoch \(([\d,]+) rows / effective batch (\d+)\)",
                          _flat(text))
        assert steps and steps.group(3) == str(effective)
        assert int(steps.group(1).replace(",", "")) == math.ceil(data["num_rows"] / effective)


def _check_fallbacks(data: dict, text: str) -> None:
    budget = data["gpu"]["memory_bytes"]
    for fb in data["fallbacks"]:
        assert fb["fits"] and fb["headroom_bytes"] >= 0 and fb["memory"]["high_bytes"] <= budget
    figures = re.findall(r"^ +\d+\. .* -> (\d+\.\d) GiB", text, flags=re.M)
    assert len(figures) == len(data["fallbacks"])
    if data["recommended"] is not None:
        figures.append(f"{data['recommended']['memory']['total_bytes'] / GIB:.1f}")
    assert len(set(figures)) == len(figures), figures
    assert "does NOT fit" not in text


def _check_throughput(data: dict, model: str) -> None:
    tp, rec = data["throughput"], data["recommended"]
    if tp is None or rec is None:
        return
    assert tp["source"] == "estimated"
    from aegis.schema import TrainConfig

    cfg = TrainConfig.model_validate(rec["config"])
    gpu = aegis.find_gpu(data["gpu"]["id"])
    flops, _ = flops_per_token(resolve_model(model), cfg)
    compute_roof = gpu.tflops(cfg.precision) * 1e12 / flops * data["gpu_count"]
    assert tp["tokens_per_s_low"] <= tp["tokens_per_s_high"] <= compute_roof
    parts = {c["key"]: c["bytes"] for c in rec["memory"]["components"]}
    saved = parts.get("activations", 0) + parts.get("logits", 0)
    tokens = cfg.micro_batch_size * cfg.seq_len
    if data["multi_gpu"] is None and saved:  # a sharded tier's breakdown is per GPU: the roof is the one-GPU plan's
        bandwidth_roof = gpu.bandwidth_gb_per_s * 1e9 / (2 * saved / tokens)
        assert tp["tokens_per_s_high"] <= bandwidth_roof * 1.000001


def _check_range_and_warnings(data: dict, texts: list[str]) -> None:
    rec = data["recommended"]
    if rec is not None:
        mem = rec["memory"]
        assert mem["low_bytes"] >= mem["overhead_bytes"]
        overhead = f"{mem['overhead_bytes'] / GIB:.1f}"
        for text in texts:
            for low in re.findall(r"Predicted range:? (\d+\.\d) - ", _flat(text)):
                assert float(low) >= float(overhead), (low, overhead)
    for risk in data["risks"]:  # the risks render one line each, in every format; VRAM's is about the headroom
        if risk["level"] != "ok" and risk["title"] != "VRAM":
            assert not re.search(r"(?<![\d.])0\.0+ GiB", risk["detail"]), risk


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    model=st.one_of(st.sampled_from(TINY), st.sampled_from(MODELS)),
    gpu=st.sampled_from(GPUS),
    method=st.sampled_from(["full", "lora", "qlora"]),
    gpu_count=st.sampled_from([1, 1, 2, 3, 8, 4096]),
    batch=st.sampled_from([None, None, 1, 3, 64, 65536]),
    seq_len=st.sampled_from([None, 128, 512, 2048]),
    rank=st.sampled_from([None, 4, 16, 64]),
    checkpointing=st.sampled_from([None, True, False]),
    with_data=st.booleans(),
)
def test_every_section_tells_one_story(model, gpu, method, gpu_count, batch, seq_len, rank, checkpointing, with_data):
    req = PlanRequest(model=model, gpu=gpu, method=method, gpu_count=gpu_count, micro_batch_size=batch,
                      seq_len=seq_len, lora_rank=rank, gradient_checkpointing=checkpointing)
    try:
        report = plan_request(req, dataset_profile=_dataset() if with_data else None, detect_stack=False)
    except AegisError:
        assume(False)
    data = json.loads(render_json(report))
    texts, verdicts = [], []
    for explain in (False, True):
        texts.append(render_text(report, width=100, explain=explain))
        md = render_markdown(report, explain=explain)
        verdicts.append(md.splitlines()[2])
        texts.append(md)
    text, verdict = texts[0], verdicts[0]
    _check_decision(data, texts, verdict)
    for plain in (texts[0], texts[2]):
        _check_checkpointing(data, plain, verdict)
        _check_batch(data, plain, verdict)
        _check_fallbacks(data, plain)
    _check_throughput(data, model)
    _check_range_and_warnings(data, texts)


@pytest.mark.parametrize(("request_fields", "gpu"), [
    ({"model": "llama-3.1-8b", "method": "lora", "micro_batch_size": 65536}, "a100-80gb"),
    ({"model": "llama-3.1-8b", "method": "lora", "micro_batch_size": 65536}, "rtx-3090"),
    ({"model": "llama-3.1-8b", "method": "lora", "gradient_checkpointing": False, "seq_len": 32768}, "rtx-3090"),
])
def test_an_asked_config_that_does_not_fit_says_nothing_fits_and_what_would(request_fields, gpu):
    """The issue's `--batch 100000000`: a pinned micro batch (or checkpointing) that does not fit is "nothing fits"
    with the smallest configuration *as asked* over the card, no fitting tier beside it, and what would fit named."""
    report = plan_request(PlanRequest(gpu=gpu, **request_fields), detect_stack=False)
    assert report.recommended is None and not report.fallbacks and report.aggressive is None
    text = render_text(report)
    assert "comfortable" not in text and "short by" not in text and "Headroom" not in text
    needs = re.search(r"needs ([\d.]+) GiB on a ([\d.]+) GiB", report.nothing_fits)
    assert needs and float(needs.group(1)) > float(needs.group(2))
    if "micro_batch_size" in request_fields:
        assert re.search(r"micro batch [\d,]+ instead of 65,536", report.nothing_fits)


def test_many_gpus_compare_ddp_and_fsdp_at_the_recommended_config():
    """The issue's `--gpus 100000`: the Multi-GPU heading's checkpointing is the recommended config's."""
    report = plan_request(PlanRequest(model="llama-3.1-8b", method="lora", gpu="rtx-3090", gpu_count=4096),
                          detect_stack=False)
    cfg = report.recommended.config
    assert report.multi_gpu.compared_at == (f"micro batch {cfg.micro_batch_size}, checkpointing "
                                            f"{'ON' if cfg.gradient_checkpointing else 'OFF'}")


def test_a_tiny_model_plans_without_noise():
    """The bundled tiny llama (0.1M parameters) on an H100: no logits warning for a few MiB, one fallback per memory
    figure, a bandwidth-bound throughput under the compute roof, a range that keeps the runtime overhead."""
    report = plan_request(PlanRequest(model=TINY_LLAMA, method="lora", gpu="h100-sxm"), detect_stack=False)
    rec = report.recommended
    assert not [r for r in report.risks if r.level != "ok"]
    totals = [f"{t.memory.total_bytes / GIB:.1f}" for t in (rec, *report.fallbacks)]
    assert len(totals) == len(set(totals))
    assert rec.memory.low_bytes >= rec.memory.overhead_bytes
    tp = report.throughput
    compute_roof = report.gpu.tflops(rec.config.precision) * 1e12 / flops_per_token(resolve_model(TINY_LLAMA), rec.config)[0]
    assert "memory-bound" in tp.basis and tp.tokens_per_s_high < 0.42 * compute_roof
