"""With the base install only, no command prints a traceback: each names the extra it needs, `--help` lists
every command, and the planner works (the extras' packages are made unimportable in a subprocess)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("base_install_cli.py")


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def test_the_planner_runs_on_the_base_install(tmp_path):
    out = _cli("plan", "qlora llama-3.1-8b on 3090", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "Recommended" in out.stdout or "recommended" in out.stdout


@pytest.mark.parametrize(
    ("args", "extra"),
    [
        (("plan", "lora qwen2.5-0.5b on 3090 with DATA"), "data"),
        (("run", "--demo"), "supervise"),
        (("resume", "--run-id", "x"), "supervise"),
        (("status", "--run-id", "x"), "supervise"),
        (("export", "x"), "supervise"),
        (("command", "x", "stop"), "supervise"),
        (("chat",), "apps"),
        (("slack", "--http"), "apps"),
        (("benchmark", "llama-3.2-1b"), "train"),
    ],
)
def test_each_command_without_its_extra_says_which_to_install(tmp_path, args, extra):
    (tmp_path / "d.jsonl").write_text('{"text": "hello"}\n')
    out = _cli(*(a.replace("DATA", str(tmp_path / "d.jsonl")) for a in args), cwd=tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr + out.stdout
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and f"pip install 'aegis-ml[{extra}]'" in lines[0], out.stderr


def test_help_lists_every_command_with_the_extra_it_needs(tmp_path):
    out = _cli("--help", cwd=tmp_path)
    assert out.returncode == 0
    for name in ("plan", "compare", "models", "gpus", "benchmark", "run", "resume", "status", "export", "chat", "slack"):
        assert f" {name} " in out.stdout
    assert "aegis-ml[supervise]" in out.stdout and "aegis-ml[apps]" in out.stdout
