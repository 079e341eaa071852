""""start the run" in chat trains the planned model on the planned dataset: a real HF model folder (weights loaded,
its own tokenizer and chat template) on a ShareGPT file, under the template's supervision, exported as a PEFT
adapter; a plan whose weights are not on this machine answers with the download command and starts nothing; a plan
without a dataset asks for one."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest
import yaml
from aegis.supervise.demo import demo_config
from aegis.supervise.events import read_jsonl
from aegis.supervise.runs import open_run
from aegis_agent import AgentSettings, ChatAgent, RunManager

from tests.hf_folders import make_model_folder, write_sharegpt

TOTAL_STEPS = 40
SUPERVISION = {  # no model, no data: the plan names them
    "training": {"steps_per_window": 20, "total_steps": TOTAL_STEPS, "batch_size": 8, "lr": 1e-2, "min_lr_ratio": 1.0},
    "monitoring": {"history_size": 50, "min_history": 10, "warmup_steps": TOTAL_STEPS},
    "checkpoints": {"interval": 20, "keep_last_n": 2},
    "curriculum": {"eval_interval": 100000},
    "faults": {"lr_spike_at_steps": [5]},  # a drill's fault: never applied to a user's run
}


def _agent(tmp_path: Path) -> tuple[ChatAgent, RunManager]:
    template = tmp_path / "supervision.yaml"
    template.write_text(yaml.safe_dump(SUPERVISION))
    settings = AgentSettings(runs_dir=str(tmp_path / "runs"), run_template=str(template))
    runs = RunManager(settings, compile_cache=False)
    return ChatAgent(settings, runs=runs), runs


@pytest.fixture
def empty_hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No model is cached on this machine (whatever the developer's own cache holds)."""
    from huggingface_hub import constants

    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    return cache


@pytest.mark.slow
def test_start_the_run_trains_the_planned_folder_on_the_planned_data(tmp_path: Path) -> None:
    folder = make_model_folder(tmp_path / "support-model")
    data = write_sharegpt(tmp_path / "chats.jsonl", n=64)
    agent, runs = _agent(tmp_path)
    try:
        reply = agent.reply(f"lora {folder} on 3090 with {data}", "real")
        assert [c.name for c in reply.tool_calls] == ["plan_finetune"] and reply.report is not None
        assert reply.report.recommended is not None

        reply = agent.reply("start the run", "real")
        assert [c.name for c in reply.tool_calls] == ["start_run"]
        run_id = reply.run_id
        assert run_id and f"Started run `{run_id}`" in reply.text and str(folder) in reply.text, reply.text
        final = runs.wait(run_id, lambda s: s.status in ("completed", "stopped"), timeout_s=540)
        runs.join(run_id, 60)
        assert final.status == "completed" and final.step == TOTAL_STEPS, runs.status(run_id)

        paths = open_run(runs.settings.runs_dir, run_id)
        source = json.loads(paths.source.read_text())
        assert source["folder"] == str(folder.resolve()) and source["init"] == "pretrained"
        assert source["data"] == str(data.resolve())
        cfg = json.loads(paths.config.read_text())
        assert cfg["train_config"]["method"] == "lora" and cfg["faults"]["lr_spike_at_steps"] == []
        assert cfg["train_config"] == reply_plan_config(agent, "real")
        assert (paths.export / "adapter_config.json").is_file()

        losses = [r["loss"] for r in read_jsonl(paths.metrics) if isinstance(r.get("loss"), (int, float))]
        assert len(losses) >= 10
        assert statistics.mean(losses[-5:]) < statistics.mean(losses[:5]), losses

        status = runs.status(run_id)  # what `aegis status` and the panels show
        assert (status.model, status.data) == (str(folder.resolve()), str(data.resolve()))
        assert status.export_path == str(paths.export)
        reply = agent.reply("status", "real")
        assert f"`{folder.resolve()}` (lora) on `{data.resolve()}`" in reply.text
        assert f"Export (PEFT adapter): `{paths.export}`" in reply.text
        notice = runs.notice(run_id, "completed")
        assert (notice.status.export_path, notice.status.model) == (str(paths.export), str(folder.resolve()))
    finally:
        runs.shutdown()
        agent.close()


def reply_plan_config(agent: ChatAgent, thread: str) -> dict:
    """The tier-0 config of the conversation's plan, as the run stores it."""
    report = agent.toolkit.cached_report(agent.conversation(thread).request)
    return report.recommended.config.model_dump(mode="json")


def test_weights_not_on_this_machine_answer_with_the_download_command(tmp_path: Path, empty_hub_cache: Path) -> None:
    data = write_sharegpt(tmp_path / "chats.jsonl", n=16)
    agent, runs = _agent(tmp_path)
    try:
        reply = agent.reply(f"lora llama-3.2-1b on 3090 with {data}", "hub")
        assert reply.report is not None and reply.report.recommended is not None
        reply = agent.reply("start the run", "hub")
        assert [c.name for c in reply.tool_calls] == ["start_run"]
        assert "did not start" in reply.text and "`hf download meta-llama/Llama-3.2-1B`" in reply.text, reply.text
        assert "\n" not in reply.text
        assert reply.run_id is None and runs.latest_run_id() is None
        assert not (tmp_path / "runs").is_dir() or not any(p.is_dir() for p in (tmp_path / "runs").iterdir())
    finally:
        agent.close()


def test_a_plan_without_a_dataset_asks_for_one(tmp_path: Path, empty_hub_cache: Path) -> None:
    folder = make_model_folder(tmp_path / "support-model")
    agent, runs = _agent(tmp_path)
    try:
        agent.reply(f"lora {folder} on 3090", "nodata")
        reply = agent.reply("start the run", "nodata")
        assert "did not start" in reply.text and "no dataset" in reply.text and "with <data file>" in reply.text
        assert reply.run_id is None and runs.latest_run_id() is None
    finally:
        agent.close()


def test_the_run_config_takes_the_plan_and_leaves_the_template_faults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without training: the config of a plan naming a relative folder (absolute paths, plan tiers, no faults)."""
    import aegis

    make_model_folder(tmp_path / "m")
    write_sharegpt(tmp_path / "d.jsonl", n=16)
    _, runs = _agent(tmp_path)
    monkeypatch.chdir(tmp_path)
    report = aegis.plan("lora ./m on 3090 with ./d.jsonl")
    cfg = runs.run_config(report, "r1")
    assert (cfg.model, cfg.data) == (str((tmp_path / "m").resolve()), str((tmp_path / "d.jsonl").resolve()))
    assert cfg.train_config == report.recommended.config and cfg.fallbacks == tuple(t.config for t in report.fallbacks)
    assert cfg.faults.lr_spike_at_steps == () and cfg.training.total_steps == TOTAL_STEPS
    assert cfg.monitoring.warmup_steps == TOTAL_STEPS  # the template's supervision

    bundled = RunManager(AgentSettings(runs_dir=str(tmp_path / "runs2")), compile_cache=False)
    cfg = bundled.run_config(report, "r2")  # no template: the recipe's supervision, nothing of the demo's
    assert cfg.model == str((tmp_path / "m").resolve()) and cfg.faults.lr_spike_at_steps == ()
    assert cfg.train_config.method == "lora" and cfg.training.lr == 2e-4  # the recipe's LoRA rate
    assert cfg.training.total_steps == math.ceil(report.epochs * report.steps_per_epoch)  # the plan's epochs
    assert cfg.monitoring != demo_config().monitoring and cfg.checkpoints != demo_config().checkpoints
    assert bundled.run_config(None, "demo").model == demo_config().model  # no plan: the demo, as asked
