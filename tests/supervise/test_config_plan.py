"""One plan -> run translation: `aegis run --plan` and chat/Slack (`RunManager`) give the same RunConfig for the same
plan, it trains the plan's epochs at the global batch, and its learning rate, warm-up, seed and clip are the emitted
HF script's (read from the script's text); its schedule is transformers' cosine-with-warmup step for step."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from aegis.errors import DatasetError
from aegis.planning.report import emit
from aegis.cli.supervised import run_config as cli_run_config

from tests.hf_folders import make_model_folder, write_sharegpt

ROWS = 50


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("plan2run")
    make_model_folder(root / "m")
    write_sharegpt(root / "d.jsonl", n=ROWS)
    return root


def _emitted(report, name: str) -> str:
    match = re.search(rf"^\s*{name}=(.+?),?$", emit(report, "hf"), re.M)
    assert match, name
    return match.group(1)


def _configs(workdir: Path, request: str, monkeypatch: pytest.MonkeyPatch):
    import aegis
    from aegis.planning.report.json import render_json
    from aegis_agent import AgentSettings, RunManager

    monkeypatch.chdir(workdir)
    report = aegis.plan(request)
    plan = workdir / f"plan-{abs(hash(request))}.json"
    plan.write_text(render_json(report))
    from_cli = cli_run_config(None, plan, run_id="r1")
    agent = RunManager(AgentSettings(runs_dir=str(workdir / "runs")), compile_cache=False)
    from_chat = agent.run_config(report, "r1")  # Slack's `start the run` calls the same RunManager.start
    return report, from_cli, from_chat


@pytest.mark.parametrize("request_text", [
    "lora ./m on 3090 with ./d.jsonl",
    "full ./m on 3090 with ./d.jsonl",
    "qlora ./m on 2x 3090 with ./d.jsonl bs 2 rank 8",
])
def test_cli_and_chat_give_the_same_run_config_at_the_emitted_scripts_rate(workdir, monkeypatch, request_text):
    report, from_cli, from_chat = _configs(workdir, request_text, monkeypatch)
    cli, chat = from_cli.model_dump(mode="json"), from_chat.model_dump(mode="json")
    for key in cli:
        assert cli[key] == chat[key], key
    cfg = from_cli
    assert cfg.model == str((workdir / "m").resolve()) and cfg.data == str((workdir / "d.jsonl").resolve())
    assert cfg.train_config == report.recommended.config and cfg.fallbacks == tuple(t.config for t in report.fallbacks)
    tier = cfg.train_config
    assert tier.method == report.method and (tier.lora == report.lora if tier.method != "full" else tier.lora is None)

    # what the emitted HF script trains, read from its text
    lr = float(_emitted(report, "learning_rate"))
    epochs = float(_emitted(report, "num_train_epochs"))
    micro = int(_emitted(report, "per_device_train_batch_size"))
    accum = int(_emitted(report, "gradient_accumulation_steps"))
    warmup_ratio = float(_emitted(report, "warmup_steps"))
    assert 0 < warmup_ratio < 1  # transformers reads a warmup_steps below 1 as a ratio of all steps
    assert cfg.training.lr == lr == (1e-5 if tier.method == "full" else 2e-4)
    assert cfg.training.seed == int(_emitted(report, "seed"))
    assert cfg.training.grad_clip == float(_emitted(report, "max_grad_norm"))
    assert _emitted(report, "lr_scheduler_type") == "'cosine'" and cfg.training.min_lr_ratio == 0.0
    # transformers Trainer's step count for num_train_epochs over ROWS rows on gpu_count processes
    # (DistributedSampler, then micro batches, then accumulation, each rounded up), and its warm-up rounding
    assert report.num_rows == ROWS and (micro, accum) == (tier.micro_batch_size, tier.gradient_accumulation_steps)
    batches = math.ceil(math.ceil(ROWS / report.gpu_count) / micro)
    hf_steps = math.ceil(epochs * max(batches // accum + int(batches % accum > 0), 1))
    assert cfg.training.total_steps == hf_steps
    assert cfg.training.warmup_steps == math.ceil(hf_steps * warmup_ratio)


def test_the_runs_schedule_is_transformers_cosine_with_warmup(workdir, monkeypatch):
    """Step for step, the engine's LR under the translated config equals transformers' get_cosine_schedule_with_warmup
    (what the emitted script's lr_scheduler_type='cosine' builds) for the same peak, warm-up and length."""
    import torch
    from transformers import get_cosine_schedule_with_warmup

    from aegis.train.step import OptimizerSettings, lr_schedule

    _, cfg, _ = _configs(workdir, "lora ./m on 3090 with ./d.jsonl", monkeypatch)
    t = cfg.training
    settings = OptimizerSettings(learning_rate=t.lr, warmup_steps=t.warmup_steps, total_steps=t.total_steps,
                                 min_lr_ratio=t.min_lr_ratio)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=t.lr)
    sched = get_cosine_schedule_with_warmup(opt, t.warmup_steps, t.total_steps)
    ours, theirs = [], []
    for step in range(t.total_steps):
        ours.append(float(lr_schedule(step, t.lr, settings)))
        theirs.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    assert t.warmup_steps >= 1 and ours[0] == theirs[0] == 0.0
    assert ours == pytest.approx(theirs, rel=1e-5, abs=1e-12)


def test_a_plan_without_data_is_an_error_on_both_paths(workdir, monkeypatch):
    import aegis
    from aegis.planning.report.json import render_json
    from aegis_agent import AgentSettings, RunManager

    monkeypatch.chdir(workdir)
    report = aegis.plan("lora ./m on 3090")
    (workdir / "nodata.json").write_text(render_json(report))
    with pytest.raises(DatasetError, match="names no dataset"):
        cli_run_config(None, workdir / "nodata.json")
    with pytest.raises(DatasetError, match="no dataset"):
        RunManager(AgentSettings(runs_dir=str(workdir / "runs")), compile_cache=False).run_config(report, "r")


def _axolotl_packing(report) -> tuple[bool, str]:
    """What the emitted axolotl config packs (``sample_packing``) and the reason it writes above it, from its text."""
    text = emit(report, "axolotl")
    match = re.search(r"^# (.+)\nsample_packing: (true|false)$", text, re.M)
    assert match, "sample_packing"
    return match.group(2) == "true", match.group(1)


def test_the_run_packs_as_the_emitted_config_does_and_says_why(workdir, monkeypatch):
    """`aegis run --plan` takes the plan's packing decision, the one `aegis plan --emit` writes: for this plan's
    profile, for a profile where padding wastes little, and for a plan without one; a run YAML's own choice wins."""
    from aegis.supervise.run_config import run_config_from_report

    report, cfg, chat = _configs(workdir, "lora ./m on 3090 with ./d.jsonl", monkeypatch)
    ds = report.dataset
    assert ds is not None and ds.packing_efficiency > 1 - ds.padding_waste  # chats of mixed length: packing wins
    assert (cfg.training.packing, cfg.training.packing_reason) == _axolotl_packing(report) == (
        chat.training.packing, chat.training.packing_reason)
    assert cfg.training.packing and f"{ds.packing_efficiency:.0%}" in cfg.training.packing_reason

    even = report.model_copy(update={"dataset": ds.model_copy(update={"padding_waste": 0.01})})
    no_profile = report.model_copy(update={"dataset": None})
    for variant in (even, no_profile):
        run = run_config_from_report(variant)
        assert (run.training.packing, run.training.packing_reason) == _axolotl_packing(variant)
        assert run.training.packing is False and run.training.packing_reason

    assert run_config_from_report(report, {"training": {"packing": False}}).training.packing is False
    bucketed = run_config_from_report(report, {"training": {"length_buckets": True}}).training
    assert (bucketed.packing, bucketed.length_buckets) == (False, True)
