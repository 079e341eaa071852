"""The agent package's public surface and its settings from the environment."""

from __future__ import annotations

import importlib

import aegis_agent
import pytest
from aegis_agent import AgentSettings


def test_every_public_name_imports() -> None:
    module = importlib.import_module("aegis_agent")
    for name in aegis_agent.__all__:
        assert getattr(module, name) is not None, name


def test_settings_from_env(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("AEGIS_RUNS_DIR", str(tmp_path))
    monkeypatch.setenv("AEGIS_LLM_MODEL", "openai:gpt-4o-mini")
    monkeypatch.setenv("AEGIS_RUN_WAIT_S", "12")
    monkeypatch.delenv("AEGIS_RUN_TEMPLATE", raising=False)
    monkeypatch.delenv("AEGIS_RUN_TIERS", raising=False)
    s = AgentSettings.from_env()
    assert (s.runs_dir, s.llm_model, s.run_wait_s) == (str(tmp_path), "openai:gpt-4o-mini", 12.0)
    assert s.conversation_db == tmp_path / "conversations.sqlite"
    assert s.tiers == "template"  # the bundled demo trains its own config
    assert AgentSettings.from_env(runs_dir="elsewhere", run_template="t.yaml").tiers == "plan"
    assert "llm_api_key" not in repr(AgentSettings(llm_api_key="secret"))
