"""Run config: YAML keys of spec §10.3, one-line errors (unknown keys, values out of range, missing model/data,
files that are not YAML), the recipe's defaults where a config gives none."""

import json
import math

import pytest

from aegis.errors import DatasetError, InvalidConfigError
from aegis.supervise.run_config import load_run_config, parse_run_config, run_config_from_plan


def test_yaml_round_trip_and_relative_paths(tmp_path):
    (tmp_path / "d.jsonl").write_text('{"text": "hi"}\n')
    (tmp_path / "run.yaml").write_text(
        "model: tiny-llama\ndata: d.jsonl\n"
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
        parse_run_config({"model": "tiny-llama", "data": "toy", **data})
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_missing_or_broken_files(tmp_path):
    with pytest.raises(InvalidConfigError, match="does not exist"):
        load_run_config(tmp_path / "nope.yaml")
    (tmp_path / "bad.yaml").write_text("training: [unclosed\n")
    with pytest.raises(InvalidConfigError, match="not valid YAML"):
        load_run_config(tmp_path / "bad.yaml")


def test_a_plan_file_that_is_not_a_plan_gets_one_line(tmp_path):
    (tmp_path / "empty.json").write_text("{}")
    with pytest.raises(InvalidConfigError, match="recommended"):
        run_config_from_plan(tmp_path / "empty.json")
    (tmp_path / "partial.json").write_text(json.dumps({"recommended": {"config": {"method": "full"}}}))
    with pytest.raises(InvalidConfigError, match="not a plan Aegis wrote") as err:
        run_config_from_plan(tmp_path / "partial.json")
    assert "\n" not in str(err.value)
    (tmp_path / "bin.json").write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    with pytest.raises(InvalidConfigError, match="not a text file"):
        run_config_from_plan(tmp_path / "bin.json")
    with pytest.raises(InvalidConfigError, match="does not exist"):
        run_config_from_plan(tmp_path / "nope.json")


def test_a_real_plan_report_becomes_a_run_config(tmp_path):
    import aegis

    report = aegis.plan("full llama-3.2-1b on h100", seq_len=64)
    (tmp_path / "plan.json").write_text(report.model_dump_json())
    with pytest.raises(DatasetError, match="names no dataset"):  # nothing to train on, not the demo's data
        run_config_from_plan(tmp_path / "plan.json", {"training": {"total_steps": 4}})
    cfg = run_config_from_plan(tmp_path / "plan.json", {"training": {"total_steps": 4}, "data": "toy"})
    assert cfg.tiers[0] == report.recommended.config
    assert list(cfg.tiers[1:]) == [t.config for t in report.fallbacks]
    # the planned model itself (its Hub id), not a config to initialise randomly
    assert cfg.model == report.request.model == "meta-llama/Llama-3.2-1B" and cfg.init == "pretrained"
    assert cfg.training.total_steps == 4
    assert cfg.training.lr == 1e-5 and cfg.training.warmup_steps == 1  # the recipe's, for full fine-tuning


def test_a_plan_for_a_model_whose_weights_are_not_here_says_what_to_download(tmp_path):
    import aegis
    from aegis.errors import WeightsNotFoundError
    from aegis.supervise.engine_handle import resolve_model_input

    report = aegis.plan("lora llama-3.2-1b on h100", seq_len=64)
    (tmp_path / "plan.json").write_text(report.model_dump_json())
    cfg = run_config_from_plan(tmp_path / "plan.json", {"data": "toy"})
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


@pytest.mark.parametrize(("text", "needed"), [
    ("", "needs `model:` (a model folder, its config.json, a cached Hub id or an alias) and `data:`"),
    ("# nothing here\n", "and `data:`"),
    ("model: ./m\n", "needs `data:`"),
    ("data: d.jsonl\ntraining: {total_steps: 5}\n", "needs `model:`"),
])
def test_a_config_without_model_or_data_says_which_keys_are_needed(tmp_path, text, needed):
    """No silent demo: an empty config is an error naming the keys a run needs, not tiny-llama on toy data."""
    (tmp_path / "run.yaml").write_text(text)
    with pytest.raises(InvalidConfigError) as err:
        load_run_config(tmp_path / "run.yaml")
    message = str(err.value)
    assert needed in message and "aegis run --demo" in message and "\n" not in message


@pytest.mark.parametrize("payload", [b"\x7fELF\x02\x01\x01\x00\x00\xff\xfe\x00", b"\xff\xfe\x00m\x00o", b"model: a\x00\ndata: b\n"])
def test_a_binary_config_file_gets_one_line(tmp_path, payload):
    (tmp_path / "run.yaml").write_bytes(payload)
    with pytest.raises(InvalidConfigError, match="is not a text file") as err:
        load_run_config(tmp_path / "run.yaml")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(("training", "expected"), [
    ({"lr": -1}, "training.lr -1 is out of range: accepted above 0"),
    ({"min_lr_ratio": 3}, "training.min_lr_ratio 3 is out of range: accepted from 0 to 1"),
    ({"total_steps": 0}, "training.total_steps 0 is out of range: accepted 1 or more"),
    ({"lr": "fast"}, "training.lr 'fast': input should be a valid number, unable to parse string as a number"),
    ({"lr": float("inf")}, "training.lr: must be a finite number, got inf"),
    ({"packing": "sometimes"}, "training.packing 'sometimes': give true or false"),
    ({"packing": True, "length_buckets": True},
     "training: length_buckets applies only with packing off; set packing: false or drop length_buckets"),
])
def test_every_validation_error_is_one_line_with_field_value_and_range(training, expected):
    with pytest.raises(InvalidConfigError) as err:
        parse_run_config({"model": "tiny-llama", "data": "toy", "training": training}, "run.yaml")
    assert str(err.value) == f"invalid run config run.yaml: {expected}"
    assert "\n" not in str(err.value)


def test_the_recipe_fills_what_a_config_does_not_say():
    """LR by tier 0's method, warm-up as ceil(3% of the steps), seed and cosine floor from aegis.recipe (the
    numbers in catalog/recipe.json, asserted here as the emitted scripts' values); given values are kept, and a
    stored config keeps its numbers."""
    from aegis.recipe import recipe

    base = {"model": "tiny-llama", "data": "toy"}
    full = parse_run_config(base)
    assert (full.train_config.method, full.training.lr) == ("full", 1e-5)
    assert full.training.warmup_steps == math.ceil(full.training.total_steps * 0.03) == 30
    assert (full.training.seed, full.training.min_lr_ratio, full.training.grad_clip) == (42, 0.0, 1.0)
    lora = parse_run_config({**base, "train_config": {"method": "qlora", "seq_len": 64},
                             "training": {"total_steps": 39}})
    assert lora.training.lr == 2e-4 and lora.training.warmup_steps == 2
    given = parse_run_config({**base, "training": {"lr": 3e-3, "warmup_steps": 0, "seed": 7}})
    assert (given.training.lr, given.training.warmup_steps, given.training.seed) == (3e-3, 0, 7)
    assert parse_run_config(full.model_dump(mode="json", by_alias=True)) == full
    r = recipe()
    assert (r.lr("full"), r.lr("lora"), r.lr("qlora"), r.seed, r.warmup_ratio) == (1e-5, 2e-4, 2e-4, 42, 0.03)


def test_aegis_run_with_an_empty_config_trains_nothing(tmp_path):
    """`aegis run --config empty.yaml` used to train the demo's random model on toy data for 1,000 steps."""
    from typer.testing import CliRunner

    from aegis.cli.supervised import app

    (tmp_path / "empty.yaml").write_text("")
    (tmp_path / "typo.yaml").write_text("model: tiny-llama\ndata: toy\ntraining: {stepz: 3}\n")
    runs = tmp_path / "runs"
    for name, fragment in (("empty.yaml", "needs `model:`"), ("typo.yaml", "unknown key 'training.stepz'")):
        result = CliRunner().invoke(app, ["run", "--config", str(tmp_path / name), "--runs-dir", str(runs)])
        assert result.exit_code == 2 and fragment in result.output and result.output.strip().count("\n") == 0
    assert not runs.exists()


@pytest.mark.parametrize(("training", "layout"), [
    ({}, (True, False)),  # a supervised run packs unless told
    ({"packing": False}, (False, False)),
    ({"length_buckets": True}, (False, True)),  # buckets are a padded layout: asking for them turns packing off
    ({"packing": False, "length_buckets": True}, (False, True)),
])
def test_runs_pack_by_default_and_length_buckets_mean_padded_batches(training, layout):
    cfg = parse_run_config({"model": "tiny-llama", "data": "toy", "training": training})
    assert (cfg.training.packing, cfg.training.length_buckets) == layout
