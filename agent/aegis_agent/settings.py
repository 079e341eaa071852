"""Settings of the conversational agent, read from the environment (front ends pass them on).

    settings = AgentSettings.from_env()          # AEGIS_* variables, defaults otherwise
    settings = AgentSettings(runs_dir="runs", llm_model="openai:gpt-4o-mini")

Environment variables:

- ``AEGIS_LLM_MODEL``: a pydantic-ai model name (``openai:gpt-4o-mini``, ``anthropic:claude-...``) or,
  with ``AEGIS_LLM_BASE_URL``, the model name served by an OpenAI-compatible server (vLLM,
  llama.cpp, Ollama). Unset: no LLM, the deterministic parser only.
- ``AEGIS_LLM_BASE_URL`` / ``AEGIS_LLM_API_KEY``: the OpenAI-compatible server and its key.
- ``AEGIS_RUNS_DIR``: folder of run folders (default ``runs``, as ``aegis run``).
- ``AEGIS_AGENT_DB``: SQLite file holding the conversations (default ``<runs_dir>/conversations.sqlite``).
- ``AEGIS_RUN_TEMPLATE``: YAML run config giving the model, data and supervision settings of runs
  started from chat (default: the bundled demo run, a tiny llama that trains on a CPU).
- ``AEGIS_RUN_TIERS``: ``plan`` (train the plan's recommended config and fallback chain) or
  ``template`` (the template's own train config). Default: ``plan`` when a template is set,
  ``template`` for the bundled demo (the plan's sizes are for the real model, not the tiny one).
- ``AEGIS_RUN_WAIT_S``: how long a paused run's process waits for commands (default 3600).
- ``AEGIS_MODEL_DIRS`` / ``AEGIS_DATA_DIRS``: folders (``os.pathsep``-separated) whose models and datasets
  remote users may name. With ``remote=True`` (Slack, Gradio beyond loopback or shared; set by the front
  end, not the environment) any other local path is refused unread (`aegis.access.PathPolicy`);
  locally every path stays usable.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from aegis.access import DATA_DIRS_ENV, MODEL_DIRS_ENV, PathPolicy, env_dirs
from aegis.schema import Frozen
from pydantic import Field

__all__ = ["AgentSettings"]


class AgentSettings(Frozen):
    """Where the agent keeps things and which LLM (if any) it may use."""

    runs_dir: str = Field(default="runs", description="Folder of the supervisor's run folders.")
    db_path: str | None = Field(
        default=None, description="Conversation SQLite file (None: <runs_dir>/conversations.sqlite)."
    )
    llm_model: str | None = Field(default=None, description="pydantic-ai model name; None: no LLM.")
    llm_base_url: str | None = Field(default=None, description="OpenAI-compatible server URL for llm_model.")
    llm_api_key: str | None = Field(default=None, repr=False, description="API key for llm_base_url.")
    run_template: str | None = Field(
        default=None,
        description="YAML run config whose supervision sections (windows, monitoring, checkpoints...) chat-started "
        "runs use; the model, data and configs come from the plan (None: the demo's supervision settings).",
    )
    run_tiers: Literal["plan", "template"] | None = Field(
        default=None, description="Train the plan's tiers or the template's config (None: plan iff a template is set)."
    )
    run_wait_s: float = Field(default=3600.0, gt=0, description="Seconds a paused run waits for commands.")
    model_dirs: tuple[Path, ...] = Field(default=(), description="Folders remote users may name models under.")
    data_dirs: tuple[Path, ...] = Field(default=(), description="Folders remote users may name datasets under.")
    remote: bool = Field(
        default=False, description="Requests come from remote users: local paths only under model_dirs/data_dirs."
    )

    @property
    def path_policy(self) -> PathPolicy:
        """What the agent's tools let a request read (`aegis.access`)."""
        return PathPolicy(model_dirs=self.model_dirs, data_dirs=self.data_dirs, remote=self.remote)

    @property
    def conversation_db(self) -> Path:
        return Path(self.db_path) if self.db_path else Path(self.runs_dir) / "conversations.sqlite"

    @property
    def tiers(self) -> Literal["plan", "template"]:
        if self.run_tiers is not None:
            return self.run_tiers
        return "plan" if self.run_template else "template"

    @classmethod
    def from_env(cls, **overrides: object) -> AgentSettings:
        """Settings from ``AEGIS_*`` environment variables; keyword arguments win."""
        env = os.environ
        values: dict[str, object] = {
            "runs_dir": env.get("AEGIS_RUNS_DIR") or "runs",
            "db_path": env.get("AEGIS_AGENT_DB") or None,
            "llm_model": env.get("AEGIS_LLM_MODEL") or None,
            "llm_base_url": env.get("AEGIS_LLM_BASE_URL") or None,
            "llm_api_key": env.get("AEGIS_LLM_API_KEY") or None,
            "run_template": env.get("AEGIS_RUN_TEMPLATE") or None,
            "run_tiers": env.get("AEGIS_RUN_TIERS") or None,
            "model_dirs": env_dirs(MODEL_DIRS_ENV),
            "data_dirs": env_dirs(DATA_DIRS_ENV),
        }
        if env.get("AEGIS_RUN_WAIT_S"):
            values["run_wait_s"] = float(env["AEGIS_RUN_WAIT_S"])
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls.model_validate(values)
