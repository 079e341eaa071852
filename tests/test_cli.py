"""The `aegis` CLI: --help for every command, one-line errors (exit 2, no traceback), output formats."""

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from aegis.cli import _mount_run_commands, app, main

runner = CliRunner()
_mount_run_commands()
COMMANDS = sorted(c.name or c.callback.__name__ for c in app.registered_commands)


def test_the_planner_commands_exist():
    assert {"plan", "compare", "models", "gpus", "benchmark"} <= set(COMMANDS)


@pytest.mark.parametrize("command", COMMANDS)
def test_help(command):
    result = runner.invoke(app, [command, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage" in result.output


def test_plan_text_has_the_report_sections():
    result = runner.invoke(app, ["plan", "qlora llama-3.1-8b on 3090"])
    assert result.exit_code == 0, result.output
    for section in ("Model", "Hardware", "Recommended", "Fallbacks", "Risks"):
        assert section in result.output


def test_plan_json_round_trips():
    import aegis

    result = runner.invoke(app, ["plan", "qlora llama-3.1-8b on 3090", "--json"])
    assert result.exit_code == 0, result.output
    report = aegis.PlanReport.model_validate_json(result.output)
    assert report.gpu.id == "rtx-3090" and report.recommended is not None


def test_gpus_and_models_json():
    gpus = json.loads(runner.invoke(app, ["gpus", "--json"]).output)
    assert {"rtx-3090", "h100-sxm", "mi300x"} <= {g["id"] for g in gpus}
    models = json.loads(runner.invoke(app, ["models", "--json"]).output)
    assert any(m["id"] == "meta-llama/Llama-3.1-8B" and m["params"] == 8_030_261_248 for m in models)


def test_models_architectures_lists_the_registry():
    from aegis.models.architectures import registry

    rows = json.loads(runner.invoke(app, ["models", "--architectures", "--json"]).output)
    assert [r["model_type"] for r in rows] == [e.model_type for e in registry.all_entries()]
    gpt_oss = next(r for r in rows if r["model_type"] == "gpt_oss")
    assert gpt_oss["architectures"] == ["GptOssForCausalLM"] and gpt_oss["transformers_since"] == "4.55.0"
    text = runner.invoke(app, ["models", "smollm3", "--architectures"]).output
    assert "SmolLM3ForCausalLM" in text and "LlamaForCausalLM" not in text
    assert runner.invoke(app, ["models", "mamba", "--architectures"]).exit_code == 1


def test_models_table_names_a_github_source_by_repo_and_short_commit():
    from aegis.models import catalog

    entry = next(m for m in catalog.models() if m.source.library == "github")
    out = runner.invoke(app, ["models", entry.id, "--markdown"]).output
    repo = entry.source.entry.split(":", 1)[0]
    assert f"{repo}@{entry.source.version[:7]}" in out and entry.source.version not in out


def test_compare_lists_fitting_gpus_cheapest_first():
    rows = json.loads(runner.invoke(app, ["compare", "qlora llama-3.1-8b", "--json"]).output)
    fitting = [r for r in rows if r["fits"]]
    assert fitting and not any(r["fits"] for r in rows[len(fitting):])
    priced = [r["usd_per_hour"] for r in fitting if r["usd_per_hour"]]
    assert priced == sorted(priced)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["plan", "qlora llama-3.1-8b on 3900"], "unknown GPU '3900'"),
        (["plan", "--model", "llama-3.1-9b", "--gpu", "3090"], "unknown model"),
        (["plan", "--model", "./nope/config.json", "--gpu", "3090"], "no config.json"),
        (["plan", "lora llama-3.1-8b"], "no GPU named"),
        (["plan", "qlora llama-3.1-8b on 3090 with ./missing.jsonl"], "missing.jsonl"),
        (["plan", "qlora llama-3.1-8b on 3090", "--targets", "w1,w2"], "valid names: down_proj, gate_proj"),
    ],
)
def test_bad_input_is_one_line_exit_2(args, message, capsys):
    with pytest.raises(SystemExit) as info:
        main(args)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and err.count("\n") == 1


def test_zero_batch_is_a_usage_error_not_a_traceback():
    proc = subprocess.run([sys.executable, "-m", "aegis.cli", "plan", "--model", "llama-3.1-8b", "--gpu", "3090", "--batch", "0"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "batch" in proc.stderr


def test_targets_flag_sets_the_lora_modules():
    result = runner.invoke(app, ["plan", "lora mixtral-8x7b on h200", "--targets", "w1, w3,w2 ,q_proj", "--json"])
    report = json.loads(result.output)
    assert report["lora"]["target_modules"] == ["w1", "w3", "w2", "q_proj"]
    assert report["trainable_params"] == 343_932_928 + 4_194_304  # PEFT's ParamWrapper experts + q_proj, rank 16


def test_an_unexpected_error_is_one_line_and_its_traceback_goes_to_a_log(monkeypatch, tmp_path, capsys):
    import aegis.planning.planner

    def boom(*args, **kwargs):
        raise RuntimeError("something\nnobody expected")

    monkeypatch.setattr(aegis.planning.planner, "plan", boom)
    monkeypatch.setenv("AEGIS_LOG_DIR", str(tmp_path / "logs"))
    with pytest.raises(SystemExit) as info:
        main(["plan", "qlora llama-3.1-8b on 3090"])
    err = capsys.readouterr().err
    assert info.value.code == 1 and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("error: RuntimeError: something nobody expected (details in ")
    logs = list((tmp_path / "logs").iterdir())
    assert len(logs) == 1 and str(logs[0]) in err
    text = logs[0].read_text()
    assert "Traceback (most recent call last)" in text and "in boom" in text and "command: aegis plan" in text


def test_the_crash_log_falls_back_to_the_temporary_folder(monkeypatch, tmp_path):
    from aegis.cli import _write_crash_log, crash_log_dir

    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("AEGIS_LOG_DIR", str(blocker / "logs"))  # under a file: cannot be created
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    try:
        raise ValueError("x")
    except ValueError:
        path = _write_crash_log(["plan"])
    assert crash_log_dir() == blocker / "logs"
    assert path is not None and path.parent == tmp_path / "tmp" / "aegis-logs" and "ValueError: x" in path.read_text()


def test_ctrl_c_exits_130_without_a_traceback(monkeypatch, capsys):
    import aegis.planning.planner

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(aegis.planning.planner, "plan", interrupted)
    with pytest.raises(SystemExit) as info:
        main(["plan", "qlora llama-3.1-8b on 3090"])
    assert info.value.code == 130 and "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize(("args", "says"), [
    (["plan", "lora llama-3.1-8b on 3090", "--rank", "1000000"], ["--rank", "'1000000'", "4096", "aegis plan --help"]),
    (["plan", "lora llama-3.1-8b on 3090", "--gpus=0"], ["--gpus", "'0'"]),
    (["plan", "lora llama-3.1-8b on 3090", "--colour"], ["No such option: --colour"]),
    (["gpus", "--json", "--markdown"], ["pick one of --json and --markdown"]),
])
def test_usage_errors_are_one_line_naming_the_option_and_value(args, says, capsys):
    with pytest.raises(SystemExit) as info:
        main(args)
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.count("\n") == 1 and err.startswith("error: ")
    for fragment in says:
        assert fragment in err
