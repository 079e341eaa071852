"""`aegis chat` / `aegis slack` as typer commands (the main CLI mounts these functions)."""

from __future__ import annotations

import pytest
from aegis_apps.launchers import app
from typer.testing import CliRunner

runner = CliRunner()


@pytest.mark.parametrize("command", ["chat", "slack"])
def test_help(command: str) -> None:
    result = runner.invoke(app, [command, "--help"])
    assert result.exit_code == 0 and "--runs-dir" in result.output


def test_slack_without_tokens_says_what_to_set(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("SLACK_BOT_TOKEN", "SLACK_SIGNING_SECRET", "SLACK_APP_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    result = runner.invoke(app, ["slack"])
    assert result.exit_code == 2 and "SLACK_BOT_TOKEN and SLACK_SIGNING_SECRET" in result.output


def test_socket_mode_needs_the_app_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-x")
    monkeypatch.setenv("SLACK_SIGNING_SECRET", "s")
    monkeypatch.delenv("SLACK_APP_TOKEN", raising=False)
    result = runner.invoke(app, ["slack"])
    assert result.exit_code == 2 and "SLACK_APP_TOKEN" in result.output


def test_importing_the_apps_package_imports_no_gradio_or_bolt() -> None:
    import subprocess
    import sys

    code = "import sys, aegis_apps, aegis_apps.launchers; print(any(m in sys.modules for m in ('gradio', 'slack_bolt')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False"
