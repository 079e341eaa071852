"""Number formatting and the package's import weight."""

from __future__ import annotations

import subprocess
import sys

import pytest

import aegis.planning.report
from aegis.planning.report.format import (
    config_diff,
    format_bytes,
    format_bytes_range,
    format_hours,
    format_hours_range,
    format_int,
    format_params,
    format_rate,
    format_share,
    headroom_verdict,
    targets_label,
)
from aegis.schema import LoRAConfig, TrainConfig


@pytest.mark.parametrize(
    ("value", "text"),
    [(13_346_742_190, "12.43 GiB"), (25_769_803_776, "24.00 GiB"), (0, "0.00 GiB"), (5_242_880, "5.0 MiB"), (-2_684_354_560, "-2.50 GiB")],
)
def test_format_bytes(value, text):
    assert format_bytes(value) == text


def test_format_bytes_range():
    assert format_bytes_range(11.6 * 2**30, 13.2 * 2**30) == "11.6 - 13.2 GiB"


@pytest.mark.parametrize(
    ("n", "text"),
    [(8_030_261_248, "8.03B"), (70_553_706_496, "70.55B"), (41_943_040, "41.9M"), (9_437_184, "9.4M"), (512_000, "512K"), (900, "900")],
)
def test_format_params(n, text):
    assert format_params(n) == text


def test_counts_shares_rates():
    assert format_int(10247) == "10,247"
    assert format_share(0.0052) == "0.52%" and format_share(0.058) == "5.8%" and format_share(0.73) == "73%"
    assert format_rate(1523.4) == "1,520" and format_rate(87.25) == "87" and format_rate(0.53) == "0.53"


@pytest.mark.parametrize(
    ("low", "high", "text"),
    [(35 / 60, 50 / 60, "35-50 min"), (0.5, 0.5, "30 min"), (1.5, 2.25, "1.5-2.2 h"), (30, 60, "1.2-2.5 days")],
)
def test_format_hours_range(low, high, text):
    assert format_hours_range(low, high) == text


def test_format_hours():
    assert format_hours(0.6) == "36 min" and format_hours(2.5) == "2.5 h" and format_hours(60) == "2.5 days"


def test_targets_and_verdicts():
    assert targets_label(LoRAConfig().target_modules) == "q,k,v,o,gate,up,down (all attn + MLP)"
    assert targets_label(("q_proj", "k_proj", "v_proj", "o_proj")) == "q,k,v,o (all attention)"
    assert targets_label(("q_proj", "v_proj")) == "q,v"
    assert targets_label(("all-linear",)) == "all-linear (every linear layer PEFT can wrap)"


def test_targets_label_says_which_names_select_nothing_on_the_model():
    """Mixtral's experts are w1/w2/w3: the seven standard names adapt its attention only, as PEFT does; the
    plan's default names its experts."""
    from aegis import plan
    from aegis.schema import ALL_LINEAR_TARGETS

    standard = plan("lora mixtral-8x7b on h200", lora_targets=ALL_LINEAR_TARGETS)
    label = targets_label(standard.lora.target_modules, standard.model.lora_names)
    assert label == "q,k,v,o (all attention); gate,up,down match no module of this model"
    assert standard.trainable_params == 13_631_488  # attention adapters only (PEFT's count)
    assert any("target w1,w3,w2 (or all-linear) to adapt them too" in n for n in standard.notes)
    default = plan("lora mixtral-8x7b on h200")
    assert default.lora.target_modules == ("q_proj", "k_proj", "v_proj", "o_proj", "w1", "w3", "w2")
    assert targets_label(default.lora.target_modules, default.model.lora_names) == "q,k,v,o,w1,w3,w2 (all attn + MLP)"
    assert default.trainable_params == 13_631_488 + 343_932_928  # + PEFT's ParamWrapper experts
    assert any("PEFT wraps them with per-expert adapters" in n for n in default.notes)
    qwen3 = plan("lora qwen3-30b-a3b on h200")
    assert targets_label(qwen3.lora.target_modules, qwen3.model.lora_names) == "q,k,v,o,gate,up,down (all attn + MLP)"


def test_headroom_verdicts():
    assert headroom_verdict(-1) == "does not fit"
    assert headroom_verdict(500_000_000) == "tight" and headroom_verdict(9_600_000_000) == "comfortable"


def test_config_diff():
    base = TrainConfig(method="qlora", micro_batch_size=4, gradient_accumulation_steps=4, lora=LoRAConfig(rank=16))
    assert config_diff(base, base) == "same configuration"
    assert config_diff(base, base.model_copy(update={"micro_batch_size": 2, "gradient_accumulation_steps": 8})) == "bs=2, grad_accum=8"
    assert config_diff(base, base.model_copy(update={"gradient_checkpointing": True})) == "Enable grad checkpointing"
    smaller = base.model_copy(update={"lora": LoRAConfig(rank=8), "gradient_checkpointing": True, "micro_batch_size": 1})
    assert config_diff(base, smaller) == "Rank 8, grad ckpt, bs=1"
    assert config_diff(None, base).startswith("bs=4, grad_accum=4, seq=1024, rank 16")


def test_report_package_is_light_and_lazy():
    code = (
        "import sys, aegis; before = set(sys.modules);"
        "import aegis.planning.report.json, aegis.planning.report.format;"
        "new = set(sys.modules) - before;"
        "heavy = [m for m in ('torch', 'transformers', 'jax', 'gradio', 'jinja2', 'rich') if m in new];"
        "assert not heavy, heavy;"
        "from aegis.planning.report import render_text, render_blocks, render_markdown;"
        "heavy = [m for m in ('torch', 'transformers', 'jax', 'gradio', 'jinja2') if m in sys.modules];"
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_public_names_resolve():
    for name in aegis.planning.report.__all__:
        assert callable(getattr(aegis.planning.report, name)) or name == "EMIT_KINDS"
    with pytest.raises(AttributeError):
        aegis.planning.report.nope  # noqa: B018


def test_targets_label_keeps_names_that_would_shrink_to_a_letter():
    """StarCoder2's c_fc/c_proj: 'c_proj' is not shortened to 'c'; the standard and fused names still are."""
    sc2 = ("q_proj", "k_proj", "v_proj", "o_proj", "c_fc", "c_proj")
    assert targets_label(sc2, sc2) == "q,k,v,o,c_fc,c_proj (all attn + MLP)"
    assert targets_label(("qkv_proj", "gate_up_proj")).startswith("qkv,gate_up")
