"""Plans the report tests render: real `aegis.plan` output for the seed's example and a few edge cases."""

from __future__ import annotations

from pathlib import Path

import pytest

import aegis
from aegis.planning.planner import plan
from aegis.schema import PlanReport

def support_dataset() -> str:
    """The bundled ShareGPT support dataset (800 rows)."""
    return str(Path(aegis.__file__).parent / "data" / "examples" / "support.jsonl")


@pytest.fixture(scope="session")
def example_report() -> PlanReport:
    """The seed's example request: QLoRA Llama-3.1-8B on an RTX 3090 with a ShareGPT dataset."""
    return plan(f"qlora llama-3.1-8b on 3090 with {support_dataset()}")


@pytest.fixture(scope="session")
def aggressive_report() -> PlanReport:
    """A plan with an aggressive tier (the seed's example has none: micro batch 8 does not fit a 3090)."""
    report = plan(f"lora llama-3.1-8b on a100 with {support_dataset()}")
    assert report.aggressive is not None
    return report


@pytest.fixture(scope="session")
def nothing_fits_report() -> PlanReport:
    return plan("full finetune llama-3.1-70b on 3090")


@pytest.fixture(scope="session")
def multi_gpu_report() -> PlanReport:
    return plan("lora qwen2.5-7b on 2x a100 80gb")


@pytest.fixture(scope="session")
def full_report() -> PlanReport:
    return plan("full finetune qwen2.5-0.5b on a100 80gb")
