"""Safe to expose: Slack and Gradio beyond loopback serve remote users, who may not reach the server's files.

Slack requests (a real bolt App, signed requests, the local fake Slack) naming a path outside the roots are
refused without the file being opened; Gradio beyond loopback or shared refuses to start without a login
and answers unauthenticated HTTP with 401; on loopback the app reads local paths as before."""

from __future__ import annotations

import json
import shutil
import socket
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import aegis
import pytest
from aegis.data.reading import example_dataset
from aegis.errors import AegisError
from aegis_agent import AgentSettings, ChatAgent, RunManager
from aegis_apps.launchers import app
from aegis_apps.slack import SlackBot, SlackSettings
from slack_sdk import WebClient
from typer.testing import CliRunner

from tests.agent._opened import watch_opens
from tests.apps.test_slack import ALLOWED, CHANNEL, EVIL, SECRET, click, slash

SECRET_KEYS = ("api_key_column", "ssn_column")


@pytest.fixture
def tree(tmp_path: Path) -> dict[str, Path]:
    data, secret_dir = tmp_path / "roots" / "data", tmp_path / "aegis-secret-dir"
    data.mkdir(parents=True)
    secret_dir.mkdir()
    secret = secret_dir / "keys.jsonl"
    secret.write_text(json.dumps({k: "x" for k in SECRET_KEYS}) + "\n")
    shutil.copy(example_dataset(), data / "support.jsonl")
    (data / "aegis-secret-link.jsonl").symlink_to(secret)
    return {"data": data, "secret": secret}


def _agent(tmp_path: Path, **settings: Any) -> ChatAgent:
    s = AgentSettings(runs_dir=str(tmp_path / "runs"), **settings)
    return ChatAgent(s, runs=RunManager(s, compile_cache=False))


def _slack_settings() -> SlackSettings:
    return SlackSettings(
        bot_token="xoxb-test",
        signing_secret=SECRET,
        allowed_users=(ALLOWED,),
        allowed_channels=(CHANNEL,),
        channel=CHANNEL,
    )


@pytest.fixture
def remote_bot(tmp_path: Path, tree: dict[str, Path], fake_slack: Any):
    agent = _agent(tmp_path, data_dirs=(tree["data"],), remote=True)
    bot = SlackBot(_slack_settings(), agent, client=WebClient(token="xoxb-test", base_url=fake_slack.url))
    yield bot, fake_slack
    agent.runs.shutdown()
    agent.close()


# ---------------------------------------------------------------------------------------------- Slack


def test_slack_needs_a_remote_agent(tmp_path: Path, fake_slack: Any) -> None:
    agent = _agent(tmp_path)
    try:
        with pytest.raises(AegisError, match="remote=True"):
            SlackBot(_slack_settings(), agent, client=WebClient(token="xoxb-test", base_url=fake_slack.url))
    finally:
        agent.close()


@pytest.mark.parametrize("where", ["secret", "dotdot", "symlink"])
def test_slack_path_outside_the_roots_is_refused_unread(remote_bot, tree: dict[str, Path], where: str) -> None:
    bot, fake = remote_bot
    spec = {
        "secret": str(tree["secret"]),
        "dotdot": f"{tree['data']}/../../aegis-secret-dir/keys.jsonl",
        "symlink": str(tree["data"] / "aegis-secret-link.jsonl"),
    }[where]
    with watch_opens("aegis-secret") as opened:
        assert bot.app.dispatch(slash(f"plan qlora llama-3.1-8b on 3090 with {spec}")).status == 200
        post = fake.wait_for(lambda p: "text" in p)
    assert opened == []
    text = post["text"]
    assert "not allowed" in text and str(tree["data"]) in text and "AEGIS_DATA_DIRS" in text
    assert len(text.splitlines()) == 1 and not any(k in json.dumps(post) for k in SECRET_KEYS)


def test_slack_start_button_with_a_path_outside_the_roots_starts_nothing(remote_bot, tree: dict[str, Path]) -> None:
    bot, fake = remote_bot
    request = {"model": "meta-llama/Llama-3.1-8B", "method": "qlora", "gpu": "rtx-3090", "dataset": str(tree["secret"])}
    value = json.dumps(request)
    with watch_opens("aegis-secret") as opened:
        assert bot.app.dispatch(click("start_run", value)).status == 200
        post = fake.wait_for(lambda p: "did not start" in p.get("text", ""))
    assert opened == [] and "not allowed" in post["text"] and bot.runs.latest_run_id() is None


def test_slack_plans_with_a_dataset_under_a_root(remote_bot, tree: dict[str, Path]) -> None:
    bot, fake = remote_bot
    bot.app.dispatch(slash(f"plan qlora llama-3.1-8b on 3090 with {tree['data'] / 'support.jsonl'}"))
    post = fake.wait_for(lambda p: "blocks" in p)
    assert "VRAM breakdown" in json.dumps(post["blocks"])


def test_slack_hub_ids_pass_the_policy(remote_bot) -> None:
    bot, _ = remote_bot
    req = aegis.parse_request("qlora Qwen/Qwen2.5-0.5B on 3090 with tatsu-lab/alpaca")
    assert bot.agent.policy.check_request(req) is req


def test_slack_only_allow_listed_controllers_start_runs(remote_bot) -> None:
    bot, fake = remote_bot
    value = aegis.parse_request("qlora llama-3.1-8b on 3090").model_dump_json(exclude_none=True)
    bot.app.dispatch(click("start_run", value, user=EVIL))
    bot.app.dispatch(slash("start the run", user=EVIL))
    bot.app.dispatch(slash("resume run-x", user=EVIL))
    assert len(fake.posted("chat.postEphemeral")) == 3 and bot.runs.latest_run_id() is None


def test_slack_command_builds_a_remote_agent(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import aegis_apps.slack as slack_mod

    seen: dict[str, Any] = {}

    class Stop(Exception):
        pass

    def fake_bot(settings: Any, agent: ChatAgent, **kw: Any) -> Any:
        seen["remote"] = agent.policy.remote
        raise Stop

    monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-x")
    monkeypatch.setenv("SLACK_SIGNING_SECRET", "s")
    monkeypatch.setattr(slack_mod, "SlackBot", fake_bot)
    result = CliRunner().invoke(app, ["slack", "--http", "--runs-dir", str(tmp_path / "runs")])
    assert isinstance(result.exception, Stop) and seen == {"remote": True}


# ---------------------------------------------------------------------------------------------- Gradio


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_loopback_and_remote_hosts() -> None:
    from aegis_apps.gradio_app import is_loopback, is_remote, parse_auth, token_auth

    assert all(is_loopback(h) for h in ("127.0.0.1", "localhost", "::1", "[::1]", "127.0.0.2"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "", None, "10.0.0.5", "example.com"))
    assert is_remote("127.0.0.1", share=True) and not is_remote("127.0.0.1", share=False)
    assert parse_auth("ann:pw:with:colons, bob:x") == [("ann", "pw:with:colons"), ("bob", "x")]
    with pytest.raises(AegisError, match="user:password"):
        parse_auth("justauser")
    check = token_auth("s3cret")
    assert check("anyone", "s3cret") and not check("anyone", "s3cre")


@pytest.mark.parametrize("host,share", [("0.0.0.0", False), ("10.1.2.3", False), ("127.0.0.1", True)])
def test_gradio_beyond_loopback_without_auth_refuses_to_start(tmp_path: Path, host: str, share: bool) -> None:
    from aegis_apps.gradio_app import build_ui, launch

    agent = _agent(tmp_path, remote=True)
    demo = build_ui(agent)
    demo.launch = lambda *a, **kw: pytest.fail("gradio was started")
    try:
        with pytest.raises(AegisError, match="without a login.*--auth") as info:
            launch(demo, host=host, port=_free_port(), share=share, block=False)
        assert "\n" not in str(info.value)
    finally:
        agent.close()


def test_gradio_beyond_loopback_needs_a_remote_agent(tmp_path: Path) -> None:
    from aegis_apps.gradio_app import build_ui, launch, parse_auth

    agent = _agent(tmp_path)
    try:
        with pytest.raises(AegisError, match="remote=True"):
            launch(build_ui(agent), host="0.0.0.0", port=_free_port(), block=False, auth=parse_auth("u:p"))
    finally:
        agent.close()


def test_chat_command_beyond_loopback_without_auth_is_a_one_line_error(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.delenv("AEGIS_GRADIO_AUTH", raising=False)
    monkeypatch.delenv("AEGIS_GRADIO_TOKEN", raising=False)
    for args in (["--host", "0.0.0.0"], ["--share"]):
        result = CliRunner().invoke(app, ["chat", *args, "--runs-dir", str(tmp_path / "runs")])
        assert result.exit_code == 2
        assert result.output.startswith("error: refusing") and len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists()  # refused before an agent was built


def _status(url: str, data: bytes | None = None, opener: Any = None, form: bool = False) -> int:
    kind = "application/x-www-form-urlencoded" if form else "application/json"
    req = urllib.request.Request(url, data=data, headers={"Content-Type": kind})
    try:
        with (opener or urllib.request.build_opener()).open(req, timeout=30) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code


def test_gradio_with_auth_refuses_unauthenticated_requests(tmp_path: Path) -> None:
    import http.cookiejar

    from aegis_apps.gradio_app import build_ui, launch, parse_auth

    agent = _agent(tmp_path, remote=True)
    demo = build_ui(agent)
    port = _free_port()
    launch(demo, host="0.0.0.0", port=port, block=False, auth=parse_auth("ann:pw"))
    base = f"http://127.0.0.1:{port}"
    try:
        assert _status(f"{base}/config") == 401
        assert _status(f"{base}/gradio_api/info") == 401
        assert _status(f"{base}/gradio_api/queue/join", data=b"{}") == 401
        login = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
        assert _status(f"{base}/login", data=b"username=ann&password=wrong", opener=login, form=True) == 400
        assert _status(f"{base}/login", data=b"username=ann&password=pw", opener=login, form=True) == 200
        assert _status(f"{base}/config", opener=login) == 200
    finally:
        demo.close()
        agent.close()


def test_loopback_gradio_agent_still_reads_local_paths(tmp_path: Path, monkeypatch) -> None:
    """`aegis chat` on 127.0.0.1 builds a local agent: any path, as before."""
    import aegis_apps.gradio_app as gradio_app

    seen: dict[str, Any] = {}

    def fake_launch(demo: Any, **kw: Any) -> None:
        seen.update(kw, policy=demo.aegis_policy)

    monkeypatch.setattr(gradio_app, "launch", fake_launch)
    monkeypatch.delenv("AEGIS_GRADIO_AUTH", raising=False)
    monkeypatch.delenv("AEGIS_GRADIO_TOKEN", raising=False)
    result = CliRunner().invoke(app, ["chat", "--runs-dir", str(tmp_path / "runs")])
    assert result.exit_code == 0, result.output
    assert seen["host"] == "127.0.0.1" and seen["auth"] is None and seen["policy"].remote is False
    runs = ["--runs-dir", str(tmp_path / "r")]
    result = CliRunner().invoke(app, ["chat", "--host", "0.0.0.0", "--auth", "ann:pw", *runs])
    assert result.exit_code == 0, result.output
    assert seen["auth"] == [("ann", "pw")] and seen["policy"].remote is True  # beyond loopback: a remote agent
    result = CliRunner().invoke(app, ["chat", "--share", *runs], env={"AEGIS_GRADIO_TOKEN": "t"})
    assert result.exit_code == 0, result.output
    assert seen["share"] and seen["auth"]("anyone", "t") and seen["policy"].remote is True

    outside = tmp_path / "elsewhere.jsonl"
    shutil.copy(example_dataset(), outside)
    with _agent(tmp_path) as agent:
        reply = agent.reply(f"qlora llama-3.1-8b on 3090 with {outside}", "web-1")
    assert reply.report is not None and reply.report.dataset is not None
