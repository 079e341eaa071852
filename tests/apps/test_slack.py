"""The Slack bot, offline: signed requests dispatched to a real bolt App, Web API calls captured by a
local fake Slack server, a real supervised run for the thread commands."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import aegis
import pytest
from aegis.planning.report.format import format_bytes
from aegis.supervise.runs import open_run
from aegis_agent import AgentSettings, ChatAgent, RunManager
from aegis_apps.slack import SlackBot, SlackSettings
from slack_bolt.request import BoltRequest
from slack_sdk import WebClient
from slack_sdk.signature import SignatureVerifier

SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
ALLOWED, EVIL, CHANNEL = "UALLOW", "UEVIL", "CALLOW"


def signed(body: str, content_type: str, *, secret: str = SECRET, age_s: float = 0) -> BoltRequest:
    ts = str(int(time.time() - age_s))
    sig = SignatureVerifier(secret).generate_signature(timestamp=ts, body=body)
    headers = {"content-type": content_type, "x-slack-request-timestamp": ts, "x-slack-signature": sig}
    return BoltRequest(body=body, headers=headers)


def slash(
    text: str, user: str = ALLOWED, channel: str = CHANNEL, response_url: str = "http://127.0.0.1:9/unused", **kw: Any
) -> BoltRequest:
    body = urlencode(
        {
            "command": "/aegis",
            "text": text,
            "user_id": user,
            "channel_id": channel,
            "team_id": "T1",
            "response_url": response_url,
            "trigger_id": "1.2.3",
        }
    )
    return signed(body, "application/x-www-form-urlencoded", **kw)


def thread_reply(text: str, thread_ts: str, user: str = ALLOWED) -> BoltRequest:
    event = {
        "type": "message",
        "text": text,
        "user": user,
        "channel": CHANNEL,
        "ts": f"{time.time():.6f}",
        "thread_ts": thread_ts,
        "channel_type": "channel",
    }
    body = json.dumps(
        {
            "type": "event_callback",
            "team_id": "T1",
            "api_app_id": "A1",
            "event": event,
            "event_id": f"Ev{time.time_ns()}",
            "event_time": int(time.time()),
        }
    )
    return signed(body, "application/json")


def click(action_id: str, value: str, user: str = ALLOWED, message_ts: str = "1.0") -> BoltRequest:
    payload = {
        "type": "block_actions",
        "user": {"id": user},
        "team": {"id": "T1"},
        "api_app_id": "A1",
        "channel": {"id": CHANNEL},
        "message": {"ts": message_ts},
        "container": {"type": "message"},
        "trigger_id": "1.2.3",
        "response_url": "http://127.0.0.1:9/unused",
        "actions": [{"action_id": action_id, "block_id": "b", "value": value, "type": "button"}],
    }
    return signed(urlencode({"payload": json.dumps(payload)}), "application/x-www-form-urlencoded")


def _texts(blocks: list[dict]) -> str:
    return json.dumps(blocks)


@pytest.fixture
def bot_env(tmp_path: Path, fake_slack: Any, fast_template: Path):
    settings = AgentSettings(
        runs_dir=str(tmp_path / "runs"), run_template=str(fast_template), run_tiers="template", remote=True
    )
    agent = ChatAgent(settings, runs=RunManager(settings, compile_cache=False))
    slack = SlackSettings(
        bot_token="xoxb-test",
        signing_secret=SECRET,
        allowed_users=(ALLOWED,),
        allowed_channels=(CHANNEL,),
        channel=CHANNEL,
    )
    bot = SlackBot(slack, agent, client=WebClient(token="xoxb-test", base_url=fake_slack.url))
    yield bot, fake_slack
    agent.runs.shutdown()
    agent.close()


def test_plan_reply_is_block_kit_with_the_memory_total(bot_env) -> None:
    bot, fake = bot_env
    resp = bot.app.dispatch(slash("plan qlora llama-3.1-8b on 3090"))
    assert resp.status == 200
    post = fake.wait_for(lambda p: "blocks" in p)
    report = aegis.plan("qlora llama-3.1-8b on 3090")
    blocks = _texts(post["blocks"])
    assert format_bytes(report.recommended.memory.total_bytes) in blocks
    assert "VRAM breakdown" in blocks and "Recommended" in blocks
    assert post["channel"] == CHANNEL
    assert any(
        el.get("action_id") == "start_run" for b in post["blocks"] if b["type"] == "actions" for el in b["elements"]
    )

    bot.app.dispatch(slash("on a 4090 instead"))  # a follow-up in the same channel/user conversation
    post = fake.wait_for(lambda p: "RTX 4090" in _texts(p.get("blocks", [])))
    assert format_bytes(aegis.plan("qlora llama-3.1-8b on 4090").recommended.memory.total_bytes) in _texts(
        post["blocks"]
    )


def test_channel_the_bot_is_not_in_gets_the_answer_through_response_url(bot_env) -> None:
    bot, fake = bot_env
    hook = fake.url.replace("/api/", "/hooks/response")
    assert (
        bot.app.dispatch(
            slash("plan qlora llama-3.1-8b on 3090", channel=fake.not_in_channel, response_url=hook)
        ).status
        == 200
    )
    answer = fake.wait_for(lambda p: "blocks" in p, method="response")
    assert answer["response_type"] == "in_channel" and "VRAM breakdown" in _texts(answer["blocks"])


def test_unknown_gpu_is_a_helpful_reply(bot_env) -> None:
    bot, fake = bot_env
    assert bot.app.dispatch(slash("plan qlora llama-3.1-8b on 3900")).status == 200
    assert "did you mean" in fake.wait_for(lambda p: "text" in p)["text"]


@pytest.mark.parametrize("forgery", ["wrong secret", "stale", "tampered"])
def test_forged_signature_gets_401_and_does_nothing(bot_env, forgery: str) -> None:
    bot, fake = bot_env
    before = list(fake.calls)
    if forgery == "wrong secret":
        req = slash("plan qlora llama-3.1-8b on 3090", secret="not-the-secret")
    elif forgery == "stale":
        req = slash("plan qlora llama-3.1-8b on 3090", age_s=600)
    else:
        req = slash("plan qlora llama-3.1-8b on 3090")
        req = BoltRequest(body=req.raw_body.replace("3090", "4090"), headers={k: v[0] for k, v in req.headers.items()})
    assert bot.app.dispatch(req).status == 401
    assert fake.calls == before
    assert bot.runs.latest_run_id() is None and bot.agent.conversation(f"slack-{CHANNEL}-{ALLOWED}").messages == 0


def test_not_allow_listed_cannot_start_runs(bot_env) -> None:
    bot, fake = bot_env
    value = aegis.parse_request("qlora llama-3.1-8b on 3090").model_dump_json(exclude_none=True)
    assert bot.app.dispatch(click("start_run", value, user=EVIL)).status == 200
    assert bot.app.dispatch(slash("start the run", user=EVIL)).status == 200
    refusals = fake.posted("chat.postEphemeral")
    assert len(refusals) == 2 and all(r["user"] == EVIL and "allow-listed" in r["text"] for r in refusals)
    assert bot.runs.latest_run_id() is None and fake.posted() == []


@pytest.mark.slow
def test_interrupt_thread_commands_reach_the_run(bot_env) -> None:
    bot, fake = bot_env
    value = aegis.parse_request("qlora llama-3.1-8b on 3090").model_dump_json(exclude_none=True)
    assert bot.app.dispatch(click("start_run", value)).status == 200
    started = fake.wait_for(lambda p: "started run" in p.get("text", ""))
    run_id = bot.runs.latest_run_id()
    assert run_id in started["text"] and bot.run_for_thread(CHANNEL, started["_ts"]) == run_id

    assert bot.app.dispatch(thread_reply("interrupt", started["_ts"])).status == 200
    fake.wait_for(lambda p: p.get("thread_ts") == started["_ts"] and "sent `interrupt`" in p.get("text", ""))
    notice = fake.wait_for(lambda p: "paused" in p.get("text", "") and "blocks" in p, timeout_s=240)
    blocks = _texts(notice["blocks"])
    assert "interrupt requested by an operator" in blocks
    buttons = [el for b in notice["blocks"] if b["type"] == "actions" for el in b["elements"]]
    # the supervisor's suggestions in its order (aegis.supervise.repair.suggested_actions), as status and chat show
    assert [json.loads(b["value"])["command"].split()[0] for b in buttons] == ["set_lr", "resume", "stop"]
    thread = notice["_ts"]
    inbox = open_run(bot.runs.settings.runs_dir, run_id).inbox

    # a non-allow-listed user's reply is refused and changes nothing
    lines_before = inbox.read_text()
    assert bot.app.dispatch(thread_reply("stop", thread, user=EVIL)).status == 200
    refusal = fake.wait_for(lambda p: p["user"] == EVIL, method="chat.postEphemeral", timeout_s=240)  # as the waits above
    assert refusal["thread_ts"] == thread and inbox.read_text() == lines_before
    assert bot.runs.status(run_id).status != "stopped"

    # thread replies are routed to the supervisor and acknowledged in the thread
    assert bot.app.dispatch(thread_reply("set_lr 1e-5", thread)).status == 200
    ack = fake.wait_for(lambda p: p.get("thread_ts") == thread and "set_lr 1e-05" in p.get("text", ""))
    assert f"<@{ALLOWED}>" in ack["text"]
    bot.runs.wait(run_id, lambda s: s.lr == 1e-5, timeout_s=60)
    assert bot.app.dispatch(thread_reply("blacklist_samples 12 40", thread)).status == 200
    bad = fake.wait_for(lambda p: p.get("thread_ts") == thread and "Not sent" in p.get("text", ""))
    assert "unknown sample id(s) 12, 40" in bad["text"]

    resume = next(b for b in buttons if b["action_id"] == "run_command_resume")
    assert bot.app.dispatch(click(resume["action_id"], resume["value"], message_ts=thread)).status == 200
    final = bot.runs.wait(run_id, lambda s: s.status == "completed", timeout_s=240)
    assert final.lr == 1e-5 and final.step == final.total_steps
    fake.wait_for(lambda p: f"Run `{run_id}` completed" in p.get("text", ""))
    sources = [e.data.get("source") for e in bot.runs.supervisor.events(run_id) if e.kind == "command"]
    assert sources == [f"slack:{ALLOWED}"] * 3  # interrupt, set_lr, resume; the refused and invalid ones never arrived


def test_http_mode_verifies_signatures_over_the_wire(bot_env) -> None:
    import threading
    import urllib.error
    import urllib.request

    bot, fake = bot_env
    server = bot.serve_http(host="127.0.0.1", port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/slack/events"

    def post(req: BoltRequest) -> int:
        headers = {k: v[0] for k, v in req.headers.items()}
        try:
            with urllib.request.urlopen(urllib.request.Request(url, data=req.raw_body.encode(), headers=headers)) as r:
                return r.status
        except urllib.error.HTTPError as err:
            return err.code

    try:
        assert post(slash("plan qlora llama-3.1-8b on 3090", secret="forged")) == 401
        assert fake.posted() == []
        assert post(slash("plan qlora llama-3.1-8b on 3090")) == 200
        fake.wait_for(lambda p: "blocks" in p)
    finally:
        server.shutdown()
        server.server_close()


def test_interrupt_blocks_offer_the_diagnosis_and_its_repairs() -> None:
    from aegis.supervise.status import RunStatusReport
    from aegis_apps.slack import interrupt_blocks

    notice = RunStatusReport(
        run_id="r1",
        run_dir="runs/r1",
        status="paused",
        live=True,
        step=57,
        total_steps=100,
        pending_reason="3 repairs without a clean window",
        last_anomaly="loss 9.1 > 4.2 (mean + 3 sigma)",
        diagnosis="outliers: suspects toxic-0001",
        suspected_samples=("toxic-0001", "toxic-0002"),
        suggested_actions=("set_lr 0.0003", "resume", "stop"),
        lr=3e-3,
    )
    blocks = interrupt_blocks(notice)
    text = blocks[0]["text"]["text"]
    assert "step 57" in text and "loss 9.1" in text and "suspects toxic-0001" in text
    buttons = blocks[1]["elements"]
    commands = [json.loads(b["value"]) for b in buttons]
    assert [c["command"] for c in commands] == [  # the supervisor's order, the suspects' blacklist second
        "set_lr 0.0003",
        "blacklist_samples toxic-0001 toxic-0002",
        "resume",
        "stop",
    ]
    assert [b["text"]["text"] for b in buttons] == ["Set LR 0.0003", "Blacklist toxic-0001 toxic-0002", "Resume", "Stop"]
    assert [b.get("style") for b in buttons] == [None, None, "primary", "danger"]
    assert len({b["action_id"] for b in buttons}) == len(buttons)  # Slack refuses a block with two equal ids
    assert {c["run_id"] for c in commands} == {"r1"}
    no_hint = notice.model_copy(update={"suggested_actions": (), "suspected_samples": ()})
    assert [json.loads(b["value"])["command"] for b in interrupt_blocks(no_hint)[1]["elements"]] == [
        "resume",
        "stop",
    ]  # no LR the supervisor did not propose


LOSSES = {s: round(3.0 - 0.02 * s, 4) for s in range(1, 40)} | {40: 9.1}
"""The paused run's metrics.jsonl: a falling loss, then the spike at step 40."""


def _paused_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, anomaly: Any, diagnosis: Any = None) -> Path:
    """A run folder whose state is what the supervisor writes when it escalates ``anomaly`` to a human (its real
    repair path: plan_repair -> apply_repair), read by status, the agent's RunManager and so the three front ends."""
    from aegis.supervise.run_config import RunConfig
    from aegis.supervise.repair import apply_repair, plan_repair
    from aegis.supervise.runs import RunPaths
    from aegis.supervise.state import RunState
    from tests.demo_model import TINY_RUN, TOY_DATA

    cfg = RunConfig(run_id="r1", **TINY_RUN, data=TOY_DATA, training={"total_steps": 100})
    state = RunState.new("r1", lr=1e-3, grad_clip=1.0, weights={}).update(
        step=40, anomaly=anomaly, diagnosis=diagnosis, repair_attempts=cfg.recovery.max_retries, last_checkpoint_step=40
    )
    state = apply_repair(state, plan_repair(state, cfg, num_tiers=1)).update(status="paused")
    assert state.human.pending
    paths = RunPaths(tmp_path / "runs" / "r1")
    paths.root.mkdir(parents=True)
    paths.config.write_text(cfg.model_dump_json(by_alias=True))
    paths.metrics.write_text("".join(json.dumps({"step": s, "loss": LOSSES[s]}) + "\n" for s in sorted(LOSSES)))
    raw = state.model_dump(mode="json")
    monkeypatch.setattr("aegis.supervise.status.read_state", lambda p: raw)
    monkeypatch.setattr("aegis.supervise.runner.read_state", lambda p: raw)
    return paths.root.parent


def _loss_spike_with_suspects() -> tuple[Any, Any]:
    from aegis.supervise.state import Anomaly, DiagnosisReport, OutlierStats

    anomaly = Anomaly(type="loss_spike", step=40, value=9.1, threshold=4.2, detail="loss 9.1 > 4.2",
                      batch_sample_ids=("s-0007", "toxic-0001", "toxic-0002"))
    stats = OutlierStats(median_grad_norm=1.0, max_grad_norm=40.0, mad_grad_norm=0.2, median_loss=2.0, max_loss=9.0,
                         num_samples=24)
    diagnosis = DiagnosisReport(batch_id="step-40", checkpoint_step=30, verdict="outliers", outlier_indices=(1, 2),
                                outlier_stats=stats, suspected_samples=("toxic-0001", "toxic-0002"), report_path="x.json")
    return anomaly, diagnosis


@pytest.mark.parametrize("kind", ["loss_spike", "oom"])
def test_cli_chat_and_slack_show_the_same_facts_of_a_paused_run(tmp_path, monkeypatch, kind) -> None:
    """One run-state model (RunStatusReport) read from one run folder: `aegis status`, the end of `aegis run`, the
    chat's status reply, the Gradio run panel and the Slack notice all show the state the supervisor wrote (paused at
    step 40, its reason, the last loss of metrics.jsonl, the diagnosis) and the same paused-run actions, in the
    supervisor's order; an out-of-memory pause offers no LR change in any of them."""
    import io

    import typer
    from aegis.cli.supervised import _report
    from aegis.cli.supervised import app as supervise_app
    from aegis.supervise.state import Anomaly, RunState
    from aegis.supervise import status as status_module
    from aegis_apps.gradio_app import command_buttons, loss_frame
    from aegis_apps.slack import interrupt_blocks
    from rich.console import Console
    from typer.testing import CliRunner

    if kind == "oom":
        runs = _paused_run(tmp_path, monkeypatch, Anomaly(type="oom", step=40, detail="RESOURCE_EXHAUSTED"))
        expected, diagnosis = ["resume", "stop"], None
    else:
        runs = _paused_run(tmp_path, monkeypatch, *_loss_spike_with_suspects())
        expected = ["blacklist_samples toxic-0001 toxic-0002", "skip_batch", "set_lr 0.0001", "resume", "stop"]
        diagnosis = "outliers: suspects toxic-0001, toxic-0002 (median grad norm 1, max 40)"
    state = RunState.model_validate(status_module.read_state(None))  # what the supervisor's repair path wrote
    reason, anomaly = state.human.reason, state.anomaly.detail
    assert state.status == "paused" and state.step == 40 and reason

    # `aegis status`: the table's rows
    res = CliRunner().invoke(supervise_app, ["status", "--run-id", "r1", "--runs-dir", str(runs)], env={"COLUMNS": "300"})
    assert res.exit_code == 0, res.output
    rows = {}
    for line in res.output.splitlines():
        cells = [c.strip() for c in line.strip(" │").split("│")]
        if len(cells) == 2 and cells[0]:
            rows[cells[0]] = cells[1]
    assert rows["status"].startswith("paused") and rows["step"] == "40 / 100" and rows["waiting for"] == reason
    assert rows["last anomaly"] == anomaly and "last 9.1 (all 40 steps, 1–40)" in rows["loss"]
    assert rows["try"].split(" | ") == expected

    manager = RunManager(AgentSettings(runs_dir=str(runs)), compile_cache=False)
    agent = ChatAgent(manager.settings, runs=manager)
    try:
        st = manager.status("r1")
        notice = manager.notice("r1", "paused")
        chat = agent.reply("status", "same-facts").text  # the chat's status reply (status_markdown)
    finally:
        manager.shutdown()
        agent.close()
    assert notice.status == st and (st.status, st.step, st.pending_reason, st.diagnosis) == ("paused", 40, reason, diagnosis)

    # the end of `aegis run` / `aegis resume`: the RunStatusReport Supervisor.start returns, printed
    out = io.StringIO()
    with pytest.raises(typer.Exit) as exit_:
        _report(st, Console(file=out, width=300))
    assert exit_.value.exit_code == 3
    lines = out.getvalue().splitlines()
    assert lines[0] == f"paused at step 40: {reason}"
    assert [line.strip().removeprefix("aegis command r1 ").strip('"') for line in lines[1:-1]] == expected

    # the chat: one Markdown status, the same state, step, loss, reason and actions
    assert chat.startswith("**Run `r1`**: paused, step 40 / 100") and "last 9.1 (all 40 steps, 1–40)" in chat
    assert f"**Waiting for you**: {reason}" in chat and f"- Last anomaly: {anomaly}" in chat
    assert "- Try: " + " | ".join(f"`{c}`" for c in expected) in chat

    # the Gradio run panel: its loss chart, details and buttons
    frame = loss_frame(st.losses, st.loss_steps)
    assert list(frame["step"])[-1] == 40 and list(frame["loss"]) == [LOSSES[s] for s in sorted(LOSSES)]
    assert command_buttons(st) == expected

    # the Slack notice: text and buttons
    blocks = interrupt_blocks(notice.status)
    text = blocks[0]["text"]["text"]
    assert text.startswith(f":double_vertical_bar: *Run `r1` paused at step 40*: {reason}")
    assert f"*Anomaly:* {anomaly}" in text
    assert (f"*Diagnosis:* {diagnosis}" in text) if diagnosis else "Diagnosis" not in text
    assert [json.loads(b["value"])["command"] for b in blocks[1]["elements"]] == expected
