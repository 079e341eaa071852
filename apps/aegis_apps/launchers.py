"""`aegis chat` and `aegis slack`: typer commands plugged into the main CLI as ``aegis.commands`` entry points
(pyproject.toml); ``python -m aegis_apps.launchers`` runs them without it.

Both read the agent's settings from ``AEGIS_*`` variables (see `aegis_agent.settings`); options win.
Gradio and slack-bolt are imported only when a command runs.

Slack, and Gradio bound beyond loopback or shared, serve remote users: their agent is built with
``remote=True``, so requests may name only Hub ids or paths under ``AEGIS_MODEL_DIRS`` / ``AEGIS_DATA_DIRS``,
and such a Gradio needs a login (``--auth user:pass`` / ``AEGIS_GRADIO_AUTH``, or ``--auth-token`` /
``AEGIS_GRADIO_TOKEN``) or refuses to start.

    aegis chat [--host 127.0.0.1] [--port 7860] [--share] [--auth user:pass]
    aegis slack                     # Socket Mode (SLACK_APP_TOKEN), or:
    aegis slack --http --port 3000  # HTTP mode: Slack's request URL is http(s)://<host>/slack/events
"""

from __future__ import annotations

from typing import Annotated

import typer
from aegis.errors import AegisError

__all__ = ["app", "chat", "slack"]

RunsDirOpt = Annotated[
    str | None, typer.Option("--runs-dir", help="Folder of run folders (default: $AEGIS_RUNS_DIR or runs).")
]


def _fail(err: AegisError) -> None:
    typer.echo(f"error: {err}", err=True)
    raise typer.Exit(2)


def chat(
    host: Annotated[str, typer.Option(help="Interface to bind (127.0.0.1: this machine only).")] = "127.0.0.1",
    port: Annotated[int | None, typer.Option(help="Port (default: Gradio's, 7860 or the next free one).")] = None,
    share: Annotated[bool, typer.Option("--share", help="Also open a public gradio.live share link.")] = False,
    auth: Annotated[
        str | None,
        typer.Option(
            envvar="AEGIS_GRADIO_AUTH",
            show_envvar=False,
            help="Login user:pass (comma-separated for several; env AEGIS_GRADIO_AUTH). Required beyond 127.0.0.1.",
        ),
    ] = None,
    auth_token: Annotated[
        str | None,
        typer.Option(
            "--auth-token",
            envvar="AEGIS_GRADIO_TOKEN",
            show_envvar=False,
            help="Login with any user name and this token as the password (env AEGIS_GRADIO_TOKEN).",
        ),
    ] = None,
    runs_dir: RunsDirOpt = None,
) -> None:
    """Chat with Aegis in the browser: plans, memory chart, live runs with command buttons."""
    from aegis_agent import AgentSettings, ChatAgent

    from aegis_apps.gradio_app import build_ui, check_exposure, is_remote, launch, parse_auth, token_auth

    remote = is_remote(host, share)
    try:
        login = parse_auth(auth) if auth else token_auth(auth_token) if auth_token else None
        check_exposure(host, share, login, remote_paths=remote)
        agent = ChatAgent(AgentSettings.from_env(runs_dir=runs_dir, remote=remote))
    except AegisError as err:
        _fail(err)
    try:
        launch(build_ui(agent), host=host, port=port, share=share, block=True, auth=login)
    except AegisError as err:
        _fail(err)
    finally:
        agent.runs.shutdown()
        agent.close()


def slack(
    http: Annotated[
        bool, typer.Option("--http", help="Serve Slack's HTTP request URL instead of Socket Mode.")
    ] = False,
    host: Annotated[
        str, typer.Option(help="HTTP mode: interface to bind (put an HTTPS proxy in front).")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="HTTP mode: port.")] = 3000,
    runs_dir: RunsDirOpt = None,
) -> None:
    """Run the Slack bot: /aegis plan, run interrupts with buttons, commands in threads (tokens from env)."""
    from aegis_agent import AgentSettings, ChatAgent

    from aegis_apps.slack import SlackBot, SlackSettings

    try:
        settings = SlackSettings.from_env()
        if not http and not settings.app_token:
            raise AegisError("Socket Mode needs SLACK_APP_TOKEN (xapp-...); or serve HTTP with `aegis slack --http`")
        agent = ChatAgent(AgentSettings.from_env(runs_dir=runs_dir, remote=True))  # Slack users are remote
    except AegisError as err:
        _fail(err)
    try:
        bot = SlackBot(settings, agent, process_before_response=False)  # ack within Slack's 3 s
        if http:
            server = bot.serve_http(host=host, port=port)
            typer.echo(f"Slack bot listening on http://{host}:{port}/slack/events", err=True)
            try:
                server.serve_forever()
            finally:
                server.server_close()
        else:
            bot.start_socket_mode()
    except AegisError as err:
        _fail(err)
    finally:
        agent.runs.shutdown()
        agent.close()


app = typer.Typer(help="Aegis front ends.", no_args_is_help=True, add_completion=False)
app.command("chat")(chat)
app.command("slack")(slack)


if __name__ == "__main__":
    app()
