"""Run config: YAML keys of spec §10.3, clear errors on unknown keys."""

import json

import pytest

from aegis.errors import InvalidConfigError
from aegis.supervise.config import load_run_config, parse_run_config, run_config_from_plan


def test_yaml_round_trip_and_relative_paths(tmp_path):
    (tmp_path / "d.jsonl").write_text('{"text": "hi"}\n')
    (tmp_path / "run.yaml").write_text(
        "data: d.jsonl\n"
        "training: {steps_per_window: 10, total_steps: 30, batch_size: 2, lr: 1.0e-4, grad_clip: 0.5}\n"
        "monitoring: {spike_sigma: 4, grad_norm_threshold: 50}\n"
        "forensics: {outlier_ratio: 50, zscore_threshold: 5}\n"
        "recovery: {max_retries: 2}\n"
        "checkpoints: {interval: 10, keep_last_n: 2, async: false}\n"
        "curriculum: {eval_interval: 20, domains: [a], weights: {a: 1.0}}\n"
        "notifications: {webhook_url: 'https://example.invalid/hook', slack_channel: '#runs'}\n"
    )
    cfg = load_run_config(tmp_path / "run.yaml")
    assert cfg.data == str(tmp_path / "d.jsonl")
    assert cfg.checkpoints.async_save is False and cfg.monitoring.spike_sigma == 4
    assert cfg.tiers[0].micro_batch_size == 2
    again = parse_run_config(cfg.model_dump(mode="json", by_alias=True))
    assert again == cfg


@pytest.mark.parametrize(
    "data, fragment",
    [
        ({"trainning": {}}, "unknown key 'trainning'"),
        ({"training": {"step_per_window": 3}}, "unknown key 'training.step_per_window' (valid here: steps_per_window"),
        ({"checkpoints": {"keep": 3}}, "valid here: interval, keep_last_n, async"),
        ({"training": {"lr": -1}}, "training.lr"),
        ({"notifications": {"webhook_url": "ftp://x"}}, "http"),
        ({"fallbacks": [{"method": "full", "micro_batch_size": 0}]}, "micro_batch_size must be a positive"),
    ],
)
def test_bad_configs_name_the_key(data, fragment):
    with pytest.raises(InvalidConfigError) as err:
        parse_run_config(data)
    assert fragment in str(err.value)


def test_missing_or_broken_files(tmp_path):
    with pytest.raises(InvalidConfigError, match="does not exist"):
        load_run_config(tmp_path / "nope.yaml")
    (tmp_path / "bad.yaml").write_text("training: [unclosed\n")
    with pytest.raises(InvalidConfigError, match="not valid YAML"):
        load_run_config(tmp_path / "bad.yaml")


def test_plan_supplies_config_and_fallback_chain(tmp_path):
    plan = {
        "recommended": {"config": {"method": "full", "micro_batch_size": 8, "seq_len": 64}},
        "fallbacks": [{"method": "full", "micro_batch_size": 4, "seq_len": 64}, {"method": "full", "micro_batch_size": 2, "seq_len": 64}],
    }
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    cfg = run_config_from_plan(tmp_path / "plan.json", {"training": {"total_steps": 5}})
    assert [t.micro_batch_size for t in cfg.tiers] == [8, 4, 2]
    (tmp_path / "empty.json").write_text("{}")
    with pytest.raises(InvalidConfigError, match="recommended"):
        run_config_from_plan(tmp_path / "empty.json")


def test_a_real_plan_report_becomes_a_run_config(tmp_path):
    import aegis

    report = aegis.plan("full llama-3.2-1b on h100", seq_len=64)
    (tmp_path / "plan.json").write_text(report.model_dump_json())
    cfg = run_config_from_plan(tmp_path / "plan.json", {"training": {"total_steps": 4}})
    assert cfg.tiers[0] == report.recommended.config
    assert list(cfg.tiers[1:]) == [t.config for t in report.fallbacks]
    # the planned model itself (its Hub id), not a config to initialise randomly
    assert cfg.model == report.request.model == "meta-llama/Llama-3.2-1B" and cfg.init == "pretrained"
    assert cfg.training.total_steps == 4


def test_a_plan_for_a_model_whose_weights_are_not_here_says_what_to_download(tmp_path):
    import aegis
    from aegis.errors import WeightsNotFoundError
    from aegis.supervise.engine import resolve_model_input

    report = aegis.plan("lora llama-3.2-1b on h100", seq_len=64)
    (tmp_path / "plan.json").write_text(report.model_dump_json())
    cfg = run_config_from_plan(tmp_path / "plan.json")
    with pytest.raises(WeightsNotFoundError, match=r"hf download meta-llama/Llama-3.2-1B"):
        resolve_model_input(cfg.model, cfg.init)


@pytest.mark.parametrize(("model_type", "targets"), [
    ("starcoder2", ["q_proj", "k_proj", "v_proj", "o_proj", "c_fc", "c_proj"]),
    ("phi", ["q_proj", "k_proj", "v_proj", "dense", "fc1", "fc2"]),
    ("llama", ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]),
])
def test_lora_tiers_without_targets_get_the_models_own_defaults(tmp_path, model_type, targets):
    """A run adapts what its plan sized: the planner's defaults for the model (Phi's dense/fc1/fc2, StarCoder2's
    c_fc/c_proj), not the seven Llama names, which miss their MLPs; explicit targets and full tiers are kept."""
    from hf_folders import make_model_folder

    folder = make_model_folder(tmp_path / "m", model_type=model_type)
    (tmp_path / "run.yaml").write_text(
        "model: ./m\ndata: ./d.jsonl\n"
        "train_config: {method: lora, micro_batch_size: 2, seq_len: 64, lora: {rank: 4}}\n"
        "fallbacks: [{method: qlora, micro_batch_size: 1, seq_len: 64}, {method: full, micro_batch_size: 1, seq_len: 64},"
        " {method: lora, micro_batch_size: 1, seq_len: 64, lora: {target_modules: [q_proj]}}]\n"
    )
    cfg = load_run_config(tmp_path / "run.yaml")
    assert cfg.model == str(folder.resolve())
    assert list(cfg.train_config.lora_config.target_modules) == targets and cfg.train_config.lora_config.rank == 4
    assert list(cfg.fallbacks[0].lora_config.target_modules) == targets
    assert cfg.fallbacks[1].lora is None
    assert list(cfg.fallbacks[2].lora_config.target_modules) == ["q_proj"]
