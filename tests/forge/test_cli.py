"""``aegis merge CONFIG OUT`` through typer's CliRunner: --help, a merge with its summary line, and a bad
config as one error line with exit code 2 and no traceback."""

from __future__ import annotations

import pytest
import typer
import yaml
from typer.testing import CliRunner

from aegis.cli.forge import merge, parse_size
from tests.forge.conftest import fill

app = typer.Typer(add_completion=False)
app.command("merge")(merge)


@app.callback()
def _root() -> None:
    """A stand-in for the main `aegis` app (the command is mounted there the same way)."""


def test_help():
    result = CliRunner().invoke(app, ["merge", "--help"])
    assert result.exit_code == 0
    for word in ("CONFIG", "OUT", "--seed", "--max-shard-size", "--overwrite", "slerp", "passthrough"):
        assert word in result.output


def test_merge_prints_a_summary(models, tmp_path):
    cfg = tmp_path / "merge.yml"
    cfg.write_text(yaml.safe_dump(fill({
        "merge_method": "dare_ties", "base_model": "base",
        "models": [{"model": "a", "parameters": {"weight": 0.5, "density": 0.5}}, {"model": "b", "parameters": {"weight": 0.5}}],
        "parameters": {"t": 0.5},
    }, models)))
    result = CliRunner().invoke(app, ["merge", str(cfg), str(tmp_path / "out"), "--seed", "0", "--max-shard-size", "200KB"])
    assert result.exit_code == 0, result.output
    assert "merged (dare_ties): 4 layers, 39 tensors" in result.output
    assert "parameters.t is not a parameter of dare_ties" in result.output  # a warning, not an error
    assert (tmp_path / "out" / "model.safetensors.index.json").is_file()


def test_bad_config_is_one_line_exit_2(models, tmp_path):
    cfg = tmp_path / "merge.yml"
    cfg.write_text(f"merge_method: ties\nbase_model: {models['base']}\nmodels:\n  - model: {models['a']}\n    parameters: {{wieght: 1}}\n")
    result = CliRunner().invoke(app, ["merge", str(cfg), str(tmp_path / "out")])
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert lines == ["error: models[0].parameters: unknown parameter 'wieght'; did you mean 'weight'? "
                     "ties takes int8_mask, normalize, rescale, lambda, weight, density"]
    assert "Traceback" not in result.output and not (tmp_path / "out").exists()


@pytest.mark.parametrize("text, nbytes", [("5GB", 5 * 10**9), ("2GiB", 2 * 2**30), ("500MB", 5 * 10**8), ("1000", 1000),
                                          ("1.5kib", 1536), ("200KB", 200_000)])
def test_shard_sizes(text, nbytes):
    assert parse_size(text) == nbytes
    with pytest.raises(typer.BadParameter):
        parse_size("lots")
