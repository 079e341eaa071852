"""`aegis.access.PathPolicy` and the agent that applies it: remote requests name only Hub ids or paths
under the configured roots, and a refused path is never opened; local use reads any path, as before."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from aegis.access import PathPolicy, looks_like_path
from aegis.data.reading import example_dataset
from aegis.errors import AegisError, PathNotAllowedError
from aegis_agent import AgentSettings, ChatAgent, RunManager

from tests.agent._opened import watch_opens

SECRET_KEYS = ("api_key_column", "ssn_column")


@pytest.fixture
def tree(tmp_path: Path) -> dict[str, Path]:
    """roots/models, roots/data (with a usable dataset and a symlink out), and a secret file outside both."""
    models, data = tmp_path / "roots" / "models", tmp_path / "roots" / "data"
    secret_dir = tmp_path / "aegis-secret-dir"
    for d in (models, data, secret_dir):
        d.mkdir(parents=True)
    secret = secret_dir / "keys.jsonl"
    secret.write_text(json.dumps({k: "x" for k in SECRET_KEYS}) + "\n")
    shutil.copy(example_dataset(), data / "support.jsonl")
    (data / "aegis-secret-link.jsonl").symlink_to(secret)
    return {"models": models, "data": data, "secret": secret, "root": tmp_path / "roots"}


@pytest.fixture
def policy(tree: dict[str, Path]) -> PathPolicy:
    return PathPolicy(model_dirs=(tree["models"],), data_dirs=(tree["data"],), remote=True)


def _agent(tmp_path: Path, **settings: object) -> ChatAgent:
    s = AgentSettings(runs_dir=str(tmp_path / "runs"), **settings)
    return ChatAgent(s, runs=RunManager(s, compile_cache=False))


@pytest.mark.parametrize("spec", ["Qwen/Qwen2.5-0.5B", "tatsu-lab/alpaca", "llama-3.1-8b", "meta-llama/Llama-3.1-8B"])
def test_hub_ids_and_catalog_names_pass(policy: PathPolicy, spec: str) -> None:
    assert policy.check_model(spec) == spec and policy.check_data(spec) == spec
    assert not looks_like_path(spec)


def test_paths_under_the_roots_pass_and_others_are_refused(policy: PathPolicy, tree: dict[str, Path]) -> None:
    inside = str(tree["data"] / "support.jsonl")
    assert policy.check_data(inside) == inside
    assert policy.check_model(str(tree["models"])) == str(tree["models"])
    refused = [
        str(tree["secret"]),
        f"{tree['data']}/../../aegis-secret-dir/keys.jsonl",  # '..' resolved before the check
        str(tree["data"] / "aegis-secret-link.jsonl"),  # a symlink out of the root
        "/etc/passwd",
        "~/.ssh/id_rsa",
        "../x.jsonl",
        "file:///etc/passwd",
        "secret.csv",
        "a/b/c",
        str(tree["data"] / "support.jsonl"),  # a data file is no model
    ]
    for spec in refused[:-1]:
        with pytest.raises(PathNotAllowedError):
            policy.check_data(spec)
    for spec in refused:
        with pytest.raises(PathNotAllowedError):
            policy.check_model(spec)


def test_the_refusal_is_one_line_naming_the_roots_and_the_variable(policy: PathPolicy, tree: dict[str, Path]) -> None:
    with pytest.raises(PathNotAllowedError) as info:
        policy.check_data(str(tree["data"] / "aegis-secret-link.jsonl"))
    msg = str(info.value)
    assert "\n" not in msg and str(tree["data"]) in msg and "AEGIS_DATA_DIRS" in msg
    assert "aegis-secret-dir" not in msg  # where the symlink points is not told
    assert isinstance(info.value, PermissionError) and isinstance(info.value, AegisError)
    none = PathPolicy(remote=True)
    with pytest.raises(PathNotAllowedError, match="none configured.*AEGIS_MODEL_DIRS"):
        none.check_model("/srv/models/x")


def test_a_relative_org_name_that_exists_here_is_a_path(policy: PathPolicy, tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "org" / "name").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(PathNotAllowedError):
        policy.check_data("org/name")
    assert policy.check_data("org/other") == "org/other"


def test_local_policy_reads_anything_and_from_env_splits_on_pathsep(tree: dict[str, Path]) -> None:
    local = PathPolicy()
    assert local.check_data(str(tree["secret"])) == str(tree["secret"]) and local.check_model("/etc") == "/etc"
    env = {"AEGIS_MODEL_DIRS": f"{tree['models']}{os.pathsep}{os.pathsep}/srv/m", "AEGIS_DATA_DIRS": str(tree["data"])}
    p = PathPolicy.from_env(remote=True, environ=env)
    assert p.model_dirs == (tree["models"], Path("/srv/m")) and p.data_dirs == (tree["data"],) and p.remote


def test_agent_settings_carry_the_roots(tree: dict[str, Path], monkeypatch) -> None:
    monkeypatch.setenv("AEGIS_DATA_DIRS", str(tree["data"]))
    monkeypatch.delenv("AEGIS_MODEL_DIRS", raising=False)
    s = AgentSettings.from_env(remote=True)
    assert s.path_policy == PathPolicy(data_dirs=(tree["data"],), remote=True)
    assert AgentSettings.from_env().path_policy.remote is False


def test_mentions_in_free_text(policy: PathPolicy, tree: dict[str, Path]) -> None:
    policy.check_mentions("qlora llama-3.1-8b on 3090 with tatsu-lab/alpaca, runs and data, e.g. 3.1")
    policy.check_mentions(f"lora Qwen/Qwen2.5-0.5B with {tree['data'] / 'support.jsonl'}")
    policy.check_mentions("see https://huggingface.co/datasets/tatsu-lab/alpaca")
    with pytest.raises(PathNotAllowedError):
        policy.check_mentions(f"qlora llama-3.1-8b on 3090 with ({tree['secret']}).")


def test_remote_agent_refuses_a_path_outside_the_roots_without_opening_it(
    tmp_path: Path, tree: dict[str, Path]
) -> None:
    with _agent(tmp_path, data_dirs=(tree["data"],), remote=True) as agent, watch_opens("aegis-secret") as opened:
        reply = agent.reply(f"qlora llama-3.1-8b on 3090 with {tree['secret']}", "t")
        assert "not allowed" in reply.text and "AEGIS_DATA_DIRS" in reply.text
        assert not any(k in reply.text for k in SECRET_KEYS)
        linked = agent.reply(f"qlora llama-3.1-8b on 3090 with {tree['data'] / 'aegis-secret-link.jsonl'}", "t2")
        assert "not allowed" in linked.text and not any(k in linked.text for k in SECRET_KEYS)
        # the tools check too (an LLM or a stored request can hand them a path the text never showed)
        text, art = agent.toolkit.plan_finetune(
            model="llama-3.1-8b", method="qlora", gpu="rtx-3090", dataset=str(tree["secret"])
        )
        assert "not allowed" in text and "error" in art
        text, art = agent.toolkit.compare_gpus(model="llama-3.1-8b", method="qlora", dataset=str(tree["secret"]))
        assert "not allowed" in text and "error" in art
    assert opened == []


def test_remote_agent_plans_with_a_dataset_under_a_root(tmp_path: Path, tree: dict[str, Path]) -> None:
    with _agent(tmp_path, data_dirs=(tree["data"],), remote=True) as agent:
        reply = agent.reply(f"qlora llama-3.1-8b on 3090 with {tree['data'] / 'support.jsonl'}", "t")
    assert reply.report is not None and reply.report.request.dataset == str(tree["data"] / "support.jsonl")


def test_local_agent_still_reads_any_path(tmp_path: Path, tree: dict[str, Path]) -> None:
    outside = tmp_path / "elsewhere.jsonl"
    shutil.copy(example_dataset(), outside)
    with _agent(tmp_path) as agent:
        reply = agent.reply(f"qlora llama-3.1-8b on 3090 with {outside}", "t")
        assert reply.report is not None and reply.report.dataset is not None
        with watch_opens("aegis-secret") as opened:
            secret = agent.reply(f"qlora llama-3.1-8b on 3090 with {tree['secret']}", "t2")
    assert all(k in secret.text for k in SECRET_KEYS)  # local use: the format error names the columns, as before
    assert str(tree["secret"]) in opened  # (and the watcher the remote tests rely on sees the read)
