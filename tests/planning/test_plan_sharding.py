"""A request that names DDP or FSDP gets it: the plan assumes the strategy asked for, sized by the same memory model
that the unasked plan compares (`estimate(..., ddp=True)` / `estimate(..., fsdp_shards=N)`), and the engine's mesh
follows; requests the planner cannot honour get one line that says what to change."""

from __future__ import annotations

import pytest

import aegis
from aegis.errors import AegisError
from aegis.planning.memory import estimate
from aegis.planning.parse import parse_request_lenient

BASE = "qlora llama 2 70b on 2x a100 80gb seq 4096 batch 1 gradient checkpointing"


@pytest.mark.parametrize(("said", "value"), [
    ("with fsdp", "fsdp"), ("FSDP2", "fsdp"), ("fully sharded data parallel", "fsdp"), ("full shard", "fsdp"),
    ("with DDP", "ddp"), ("distributed data parallel", "ddp"), ("", None),
])
def test_the_request_names_the_strategy(said, value) -> None:
    parsed = parse_request_lenient(f"{BASE} {said}")
    assert parsed.request.sharding == value and not parsed.issues


def test_an_asked_strategy_is_the_one_planned_even_where_the_planner_would_choose_the_other() -> None:
    chosen = aegis.plan(BASE)
    assert chosen.multi_gpu.assumed == "ddp"  # it fits with headroom: unasked, DDP is the faster choice
    fsdp = aegis.plan(f"{BASE} with fsdp")
    ddp = aegis.plan(f"{BASE} with ddp")
    sdk = aegis.plan(BASE, sharding="fsdp")
    for report, kind, mesh in ((fsdp, "fsdp", {"fsdp": 2}), (sdk, "fsdp", {"fsdp": 2}), (ddp, "ddp", {"data": 2})):
        multi = report.multi_gpu
        assert multi.assumed == kind and multi.parallel == mesh and "as asked" in multi.reason
        cfg = report.recommended.config
        profile = aegis.resolve_model("llama-2-70b")
        gpu = aegis.find_gpu("a100-80gb")
        expected = (estimate(profile, cfg, gpu=gpu, fsdp_shards=2) if kind == "fsdp"
                    else estimate(profile, cfg, gpu=gpu, ddp=True))
        assert report.recommended.memory.total_bytes == expected.total_bytes
    assert fsdp.recommended.memory.total_bytes < ddp.recommended.memory.total_bytes


@pytest.mark.parametrize(("request_text", "needle"), [
    ("lora llama 3 8b on 1x h100 with fsdp", "FSDP spreads the run over several GPUs"),
    ("lora llama 3 8b on 2x h100 with fsdp and zero3", "names both FSDP and DeepSpeed ZeRO-3"),
    ("lora llama 3 8b on 2x h100 with fsdp and ddp", "two multi-GPU strategies"),
])
def test_requests_it_cannot_honour_get_one_line(request_text, needle) -> None:
    with pytest.raises(AegisError) as err:
        aegis.plan(request_text)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_the_cli_flags_ask_for_a_strategy_and_win_over_the_text() -> None:
    import json

    from typer.testing import CliRunner

    from aegis.cli import app

    def run(*args: str):
        return CliRunner().invoke(app, ["plan", "lora llama 3 8b on 2x a10g seq 2048 with ddp", *args, "--json"])

    fsdp = json.loads(run("--sharding", "fsdp").output)
    assert fsdp["multi_gpu"]["assumed"] == "fsdp" and fsdp["multi_gpu"]["parallel"] == {"fsdp": 2}
    zero = json.loads(CliRunner().invoke(app, ["plan", "lora llama 3 8b on 2x a10g seq 2048", "--zero-stage", "3",
                                               "--json"]).output)
    assert zero["multi_gpu"]["assumed"] == "deepspeed" and zero["multi_gpu"]["zero_stage"] == 3
    bad = run("--sharding", "foo")  # the one-line error the CLI's entry point prints (an AegisError)
    assert bad.exit_code != 0 and isinstance(bad.exception, AegisError)
    assert "sharding: Input should be 'ddp' or 'fsdp'" in str(bad.exception) and "\n" not in str(bad.exception)
