"""The Aegis Slack bot (slack-bolt): plans as Block Kit, run interrupts with buttons, commands in threads.

- ``/aegis plan <request>`` (or any chat text after ``/aegis``) goes to the conversational agent
  (one conversation per channel and user, so follow-ups work); a plan is answered with the SDK's
  Block Kit rendering (summary, memory table, tiers) and its "Start run" button.
- A run that pauses for a human is posted to the run's channel with the anomaly, the diagnosis
  and one button per action of the paused-run panel (the supervisor's suggestions: blacklist the suspects,
  set the LR it proposes, resume, stop). Replies in that message's
  thread (``set_lr 1e-5``, ``blacklist_samples 12 40``, ``resume``) go to the supervisor and are
  acknowledged in the thread.
- Only allow-listed users in allow-listed channels may start or steer runs (empty lists: nobody);
  a refused request changes nothing. Request signatures are verified by bolt (HTTP mode).
- Slack users are remote: the agent must be built with ``AgentSettings(remote=True)`` (``aegis slack``
  does), so requests name only Hub ids or paths under ``AEGIS_MODEL_DIRS`` / ``AEGIS_DATA_DIRS``; any
  other path is refused unread (`aegis.access.PathPolicy`).

The Slack app needs the ``/aegis`` slash command, interactivity (buttons), the ``message.channels``
event (thread replies) and the scopes ``commands``, ``chat:write``, ``channels:history``.
Environment: ``SLACK_BOT_TOKEN``, ``SLACK_SIGNING_SECRET``, ``SLACK_APP_TOKEN`` (Socket Mode),
``AEGIS_SLACK_ALLOWED_USERS`` / ``AEGIS_SLACK_ALLOWED_CHANNELS`` (comma-separated ids),
``AEGIS_SLACK_CHANNEL`` (where run notices go; default: the channel the run was started from).

    bot = SlackBot(SlackSettings.from_env(), agent=ChatAgent(AgentSettings.from_env(remote=True)))
    bot.start_socket_mode()            # SLACK_APP_TOKEN; or bot.serve_http(port=3000)
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from pathlib import Path
from typing import Any

from aegis.errors import AegisError
from aegis.schema import Frozen, PlanRequest
from aegis.supervise.status import RunStatusReport, paused_actions, paused_details
from aegis_agent import ChatAgent, RunNotice, understand
from pydantic import Field

__all__ = ["RUN_TOOLS", "SlackBot", "SlackSettings", "interrupt_blocks"]

RUN_TOOLS = frozenset({"start_run", "send_run_command"})
"""Agent tools that change a run: allow-listed users in allow-listed channels only."""

_COMMAND_ACTION = re.compile(r"^run_command_\w+$")
_THREADS_FILE = "slack-threads.json"
log = logging.getLogger("aegis.slack")


def _split(value: str | None) -> tuple[str, ...]:
    return tuple(v.strip() for v in (value or "").split(",") if v.strip())


class SlackSettings(Frozen):
    """Tokens and the allow-lists, from the environment."""

    bot_token: str = Field(repr=False, description="xoxb- bot token (SLACK_BOT_TOKEN).")
    signing_secret: str = Field(repr=False, description="Request signing secret (SLACK_SIGNING_SECRET).")
    app_token: str | None = Field(
        default=None, repr=False, description="xapp- token for Socket Mode (SLACK_APP_TOKEN)."
    )
    allowed_users: tuple[str, ...] = Field(default=(), description="User ids that may control runs.")
    allowed_channels: tuple[str, ...] = Field(default=(), description="Channel ids where runs may be controlled.")
    channel: str | None = Field(default=None, description="Channel for run notices (default: where the run started).")

    @classmethod
    def from_env(cls) -> SlackSettings:
        env = os.environ
        missing = [k for k in ("SLACK_BOT_TOKEN", "SLACK_SIGNING_SECRET") if not env.get(k)]
        if missing:
            raise AegisError(f"set {' and '.join(missing)} (from your Slack app's settings) to run `aegis slack`")
        return cls(
            bot_token=env["SLACK_BOT_TOKEN"],
            signing_secret=env["SLACK_SIGNING_SECRET"],
            app_token=env.get("SLACK_APP_TOKEN") or None,
            allowed_users=_split(env.get("AEGIS_SLACK_ALLOWED_USERS")),
            allowed_channels=_split(env.get("AEGIS_SLACK_ALLOWED_CHANNELS")),
            channel=env.get("AEGIS_SLACK_CHANNEL") or None,
        )


def _button(label: str, run_id: str, command: str, key: str, style: str | None = None) -> dict[str, Any]:
    button: dict[str, Any] = {
        "type": "button",
        "action_id": f"run_command_{key}",
        "text": {"type": "plain_text", "text": label[:75]},
        "value": json.dumps({"run_id": run_id, "command": command}),
    }
    if style:
        button["style"] = style
    return button


_STYLES = {"resume": "primary", "stop": "danger"}


def interrupt_blocks(status: RunStatusReport) -> list[dict[str, Any]]:
    """Block Kit for a run waiting for a human, from its status (the one run-state model): why, the anomaly and
    the diagnosis (:func:`aegis.supervise.status.paused_details`, as the Gradio panel shows them), and one button
    per action of the paused-run panel (:func:`aegis.supervise.status.paused_actions`, the same as `aegis status`
    and the chat offer)."""
    lines = [
        f":double_vertical_bar: *Run `{status.run_id}` paused at step {status.step}*: "
        f"{status.pending_reason or 'needs you'}",
        *(_mrkdwn(line) for line in paused_details(status)),
    ]
    buttons, keys = [], set()
    for action in paused_actions(status.suggested_actions, status.suspected_samples):
        key = action.kind if action.kind not in keys else f"{action.kind}_{len(buttons)}"  # action ids are unique
        keys.add(key)
        buttons.append(_button(action.label, status.run_id, action.command, key, _STYLES.get(action.kind)))
    return [
        {"type": "section", "text": {"type": "mrkdwn", "text": "\n".join(lines)[:3000]}},
        {"type": "actions", "elements": buttons},
        {
            "type": "context",
            "elements": [
                {
                    "type": "mrkdwn",
                    "text": "Or reply in this thread: `set_lr 1e-5`, `blacklist_samples 12 40`, `skip_batch`, `resume`, `stop`, `status`",
                }
            ],
        },
    ]


class SlackBot:
    """A bolt `App` wired to a `ChatAgent` and its `RunManager`."""

    def __init__(
        self,
        settings: SlackSettings,
        agent: ChatAgent,
        *,
        client: Any = None,
        token_verification_enabled: bool = True,
        process_before_response: bool = True,
    ) -> None:
        """``process_before_response=False`` acks at once and handles in a thread (long servers); True
        answers after handling (serverless, and deterministic tests)."""
        from slack_bolt import App

        if not agent.policy.remote:
            raise AegisError(
                "the Slack bot serves remote users: build its agent with AgentSettings(remote=True) so requests "
                "may only name paths under AEGIS_MODEL_DIRS / AEGIS_DATA_DIRS"
            )
        self.settings = settings
        self.agent = agent
        self.runs = agent.runs
        self.app = App(
            token=settings.bot_token if client is None else None,
            signing_secret=settings.signing_secret,
            client=client,
            process_before_response=process_before_response,
            token_verification_enabled=token_verification_enabled,
        )
        self._threads_path = Path(self.runs.settings.runs_dir) / _THREADS_FILE
        self._threads: dict[str, dict[str, str]] = self._load_threads()
        self._run_channels: dict[str, str] = {v["run_id"]: v["channel"] for v in self._threads.values()}
        self._lock = threading.Lock()
        self.app.command("/aegis")(self._on_slash)
        self.app.action("start_run")(self._on_start_run)
        self.app.action(_COMMAND_ACTION)(self._on_command_button)
        self.app.event("message")(self._on_message)
        self.runs.add_listener(self.on_notice)

    # ------------------------------------------------------------------ bookkeeping

    def _load_threads(self) -> dict[str, dict[str, str]]:
        try:
            return json.loads(self._threads_path.read_text())
        except (OSError, ValueError):
            return {}

    def _remember_thread(self, channel: str, ts: str, run_id: str) -> None:
        with self._lock:
            self._threads[f"{channel}:{ts}"] = {"run_id": run_id, "channel": channel}
            self._run_channels[run_id] = channel
            self._threads_path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self._threads_path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self._threads, indent=1))
            tmp.replace(self._threads_path)

    def run_for_thread(self, channel: str, thread_ts: str) -> str | None:
        """The run whose message started this thread, if any."""
        entry = self._threads.get(f"{channel}:{thread_ts}")
        return entry["run_id"] if entry else None

    def may_control(self, user: str | None, channel: str | None) -> bool:
        """True for an allow-listed user in an allow-listed channel."""
        return bool(
            user and channel and user in self.settings.allowed_users and channel in self.settings.allowed_channels
        )

    def _refuse(self, client: Any, channel: str, user: str, thread_ts: str | None = None) -> None:
        client.chat_postEphemeral(
            channel=channel,
            user=user,
            thread_ts=thread_ts,
            text="Sorry, only allow-listed users in allow-listed channels may start or steer runs. "
            "Ask an admin to add you to AEGIS_SLACK_ALLOWED_USERS.",
        )

    # ------------------------------------------------------------------ handlers

    def _on_slash(self, ack: Any, command: dict[str, Any], client: Any, respond: Any) -> None:
        ack()
        text = (command.get("text") or "").strip()
        text = re.sub(r"^plan\b\s*", "", text, flags=re.IGNORECASE)
        user, channel = command.get("user_id"), command.get("channel_id")
        thread_id = f"slack-{channel}-{user}"
        view = self.agent.conversation(thread_id)
        u = understand(text, request=view.request, run_id=view.run_id, policy=self.agent.policy)
        if u.call is not None and u.call.name in RUN_TOOLS and not self.may_control(user, channel):
            self._refuse(client, channel, user)
            return
        reply = self.agent.reply(text, thread_id)
        if reply.report is not None:
            from aegis.planning.report import render_blocks
            from aegis.planning.report.markdown import verdict_line

            self._post(
                client, respond, channel=channel, text=verdict_line(reply.report), blocks=render_blocks(reply.report)
            )
            return
        resp = self._post(client, respond, channel=channel, text=_mrkdwn(reply.text)[:3900])
        if resp is not None and reply.run_id and any(c.name == "start_run" for c in reply.tool_calls):
            self._remember_thread(channel, resp["ts"], reply.run_id)

    @staticmethod
    def _post(client: Any, respond: Any, **message: Any) -> Any:
        """Post to the channel; where the bot may not (not invited), answer through the command's response_url."""
        from slack_sdk.errors import SlackApiError

        try:
            return client.chat_postMessage(**message)
        except SlackApiError as err:
            log.warning("chat.postMessage failed (%s); answering through response_url", err.response.get("error"))
            message.pop("channel", None)
            respond(response_type="in_channel", **message)
            return None

    def _controller(self, body: dict[str, Any], client: Any) -> tuple[str, str | None, str | None] | None:
        """(user, channel, thread_ts) of a button press by someone allowed to control runs; refuses others."""
        user, channel = body["user"]["id"], body.get("channel", {}).get("id")
        thread_ts = body.get("message", {}).get("ts")
        if not self.may_control(user, channel):
            self._refuse(client, channel, user, thread_ts)
            return None
        return user, channel, thread_ts

    def _on_start_run(self, ack: Any, body: dict[str, Any], client: Any) -> None:
        ack()
        who = self._controller(body, client)
        if who is None:
            return
        user, channel, thread_ts = who
        try:
            request = PlanRequest.model_validate_json(body["actions"][0]["value"])
            report = self.agent.toolkit.report_for(request)
            status = self.runs.start(report, prefix="slack")
        except (AegisError, ValueError) as err:
            client.chat_postMessage(channel=channel, thread_ts=thread_ts, text=f"The run did not start: {err}")
            return
        resp = client.chat_postMessage(
            channel=self.settings.channel or channel,
            text=(
                f":rocket: <@{user}> started run `{status.run_id}`{_trains(status.model, status.data)} "
                f"({status.total_steps} steps). I will post here when it needs you; reply in this thread with commands."
            ),
        )
        self._remember_thread(resp["channel"], resp["ts"], status.run_id)

    def _on_command_button(self, ack: Any, body: dict[str, Any], client: Any) -> None:
        ack()
        who = self._controller(body, client)
        if who is None:
            return
        user, channel, thread_ts = who
        value = json.loads(body["actions"][0]["value"])
        self._send(client, channel, thread_ts, user, value["run_id"], value["command"])

    def _on_message(self, event: dict[str, Any], client: Any) -> None:
        if event.get("bot_id") or event.get("subtype") or not event.get("thread_ts"):
            return
        channel, user = event.get("channel"), event.get("user")
        run_id = self.run_for_thread(channel, event["thread_ts"])
        if run_id is None:
            return
        if not self.may_control(user, channel):
            self._refuse(client, channel, user, event["thread_ts"])
            return
        self._send(client, channel, event["thread_ts"], user, run_id, event.get("text", ""))

    def _send(self, client: Any, channel: str, thread_ts: str | None, user: str, run_id: str, text: str) -> None:
        from aegis_agent import status_markdown

        try:
            receipt = self.runs.command(run_id, text.strip(), source=f"slack:{user}")
        except AegisError as err:
            client.chat_postMessage(channel=channel, thread_ts=thread_ts, text=f":warning: Not sent: {err}")
            return
        if receipt.status is not None:
            reply = _mrkdwn(status_markdown(receipt.status))
        else:
            where = "the run applies it at its next step" if receipt.live else "it applies when the run resumes"
            reply = f":white_check_mark: <@{user}> sent `{receipt.command}` to run `{run_id}`: {where}."
        client.chat_postMessage(channel=channel, thread_ts=thread_ts, text=reply)

    # ------------------------------------------------------------------ run notices

    def on_notice(self, notice: RunNotice) -> None:
        """Post a paused run (with buttons) or a finished one to the run's channel."""
        channel = self.settings.channel or self._run_channels.get(notice.run_id)
        if channel is None:
            return
        client = self.app.client
        st = notice.status
        if notice.kind == "paused" and st is not None:
            resp = client.chat_postMessage(
                channel=channel, text=f"Run {notice.run_id} paused: {st.pending_reason}", blocks=interrupt_blocks(st)
            )
            self._remember_thread(channel, resp["ts"], notice.run_id)
            return
        reason = notice.error or (st.pending_reason if st is not None else None)
        detail = f": {reason}" if reason else ""
        trains = _trains(st.model, st.data) if st is not None else ""
        export = f"; exported to `{st.export_path}`" if st is not None and st.export_path else ""
        step = st.step if st is not None else 0
        client.chat_postMessage(
            channel=channel, text=f"Run `{notice.run_id}` {notice.kind} at step {step}{detail}{trains}{export}"
        )

    # ------------------------------------------------------------------ serving

    def start_socket_mode(self) -> None:
        """Serve over Socket Mode (no public URL needed); blocks."""
        from slack_bolt.adapter.socket_mode import SocketModeHandler

        if not self.settings.app_token:
            raise AegisError("Socket Mode needs SLACK_APP_TOKEN (xapp-...); or serve HTTP with `aegis slack --http`")
        SocketModeHandler(self.app, self.settings.app_token).start()

    def serve_http(self, host: str = "127.0.0.1", port: int = 3000, path: str = "/slack/events") -> Any:
        """An HTTP server for Slack's request URL (put it behind your HTTPS proxy); returns it unstarted."""
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        from slack_bolt.request import BoltRequest

        app = self.app

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                if self.path.split("?")[0] != path:
                    self.send_error(404)
                    return
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
                resp = app.dispatch(BoltRequest(body=body, headers={k.lower(): v for k, v in self.headers.items()}))
                self.send_response(resp.status)
                for name, values in resp.headers.items():
                    for v in values:
                        self.send_header(name, v)
                data = resp.body.encode()
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, fmt: str, *args: Any) -> None:
                log.info(fmt, *args)

        return ThreadingHTTPServer((host, port), Handler)


def _trains(model: str | None, data: str | None) -> str:
    """' (`model` on `data`)' for a run message; empty when unknown."""
    if not model:
        return ""
    return f" (`{model}`" + (f" on `{data}`)" if data else ")")


def _mrkdwn(markdown: str) -> str:
    """Chat Markdown → Slack mrkdwn (bold, headings); tables stay as text."""
    text = re.sub(r"\*\*(.+?)\*\*", r"*\1*", markdown)
    return re.sub(r"^#{1,6}\s*(.+)$", r"*\1*", text, flags=re.MULTILINE)
