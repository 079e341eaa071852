"""The Aegis chat app (Gradio): chat with the agent, the last plan's memory chart, a live run panel.

- Chat: every message goes to `aegis_agent.ChatAgent` (one conversation per browser session);
  plans come back as the SDK's Markdown report.
- Memory: one bar of the last plan's breakdown (the tier the report breaks down), used memory from the left and
  the free headroom last, every band named with its size in a legend; and its total.
- Run: status, a loss plot refreshed every second, the anomaly and diagnosis, and buttons for the
  commands a paused run suggests (resume, lower LR, blacklist the suspects, skip the batch, stop);
  a button sends its command through the agent, so it shows in the chat too.

Binds 127.0.0.1, analytics off, no share link unless asked. Bound beyond loopback or shared, the app
is remote: `launch` refuses to start without a login (``auth``: Gradio's own, from ``--auth user:pass``,
``AEGIS_GRADIO_AUTH`` or a token) and unless the agent was built with ``AgentSettings(remote=True)``,
which lets requests name only Hub ids or paths under ``AEGIS_MODEL_DIRS`` / ``AEGIS_DATA_DIRS``.

    demo = build_ui(ChatAgent(AgentSettings.from_env()))
    launch(demo)                               # or: aegis chat --port 7860
    launch(build_ui(ChatAgent(AgentSettings.from_env(remote=True))), host="0.0.0.0", auth=parse_auth("me:pw"))
"""

import hmac
import ipaddress
import os
from collections.abc import Callable
from typing import Any, NamedTuple

from aegis.errors import AegisError
from aegis.units import GIB
from aegis.schema import PlanReport
from aegis.supervise.status import paused_details
from aegis_agent import ChatAgent, status_markdown

__all__ = [
    "CHART_CSS",
    "MAX_COMMAND_BUTTONS",
    "Auth",
    "Band",
    "build_ui",
    "check_exposure",
    "command_buttons",
    "is_loopback",
    "is_remote",
    "launch",
    "loss_frame",
    "memory_bands",
    "memory_chart_html",
    "memory_frame",
    "parse_auth",
    "token_auth",
]

Auth = list[tuple[str, str]] | Callable[[str, str], bool]
"""What Gradio's ``launch(auth=...)`` takes: (user, password) pairs, or a check of both."""

MAX_COMMAND_BUTTONS = 5
"""Buttons in the run panel: the paused run's suggested commands (the supervisor's list) plus the suspects' blacklist."""


def _gradio() -> Any:
    os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"  # before gradio reads it at import
    import gradio

    return gradio


_COMPONENT_COLORS = {
    "weights": "#4c78a8", "adapters": "#f58518", "gradients": "#e45756", "optimizer": "#72b7b2",
    "optimizer temporaries": "#54a24b", "activations": "#eeca3b", "backward temporaries": "#b279a2",
    "logits": "#ff9da6", "masks": "#9ecae9", "casts": "#d6a5c9", "buckets": "#8cd17d", "gathered": "#9d755d",
    "overhead": "#79706e", "margin": "#bab0ac", "headroom": "#ffffff",
}
"""Colours of the memory chart's bands: every key the memory engine emits (`aegis.planning.memory.estimate`), then the
runtime overhead, the margin up to the predicted high end and the free headroom (white, outlined)."""

_OTHER_COLOR = "#c7c7c7"
"""A component key without a colour of its own (a future memory-engine key): still drawn and labelled."""

CHART_CSS = """
#aegis-chat table { display: block; max-width: 100%; overflow-x: auto; border-collapse: collapse; }
#aegis-chat th, #aegis-chat td { white-space: nowrap; word-break: normal; overflow-wrap: normal; }
.aegis-mem { font-size: 0.9em; }
.aegis-mem-title { font-weight: 600; margin-bottom: 4px; }
.aegis-mem-bar { display: flex; width: 100%; height: 28px; border: 1px solid #888; border-radius: 4px;
                 overflow: hidden; box-sizing: border-box; }
.aegis-band { height: 100%; min-width: 1px; box-sizing: border-box; }
.aegis-band[data-key="headroom"] { background-image: repeating-linear-gradient(45deg, transparent 0 5px,
                 rgba(0,0,0,.08) 5px 7px); border-left: 1px dashed #888; }
.aegis-mem-scale { display: flex; justify-content: space-between; color: #777; font-size: 0.85em; }
.aegis-mem-legend { list-style: none; padding: 0; margin: 6px 0 0 0; display: grid; gap: 2px 12px;
                    grid-template-columns: repeat(auto-fill, minmax(210px, 1fr)); }
.aegis-mem-legend li { display: flex; align-items: center; gap: 6px; margin: 0; }
.aegis-swatch { display: inline-block; flex: none; width: 12px; height: 12px; border: 1px solid #888; }
.aegis-mem-legend .aegis-gib { margin-left: auto; font-variant-numeric: tabular-nums; }
"""
"""The app's CSS: tables in the chat scroll sideways instead of wrapping one character per line; the memory chart."""


class Band(NamedTuple):
    """One band of the memory chart."""

    key: str
    label: str
    bytes: int


def memory_bands(report: PlanReport | None) -> list[Band]:
    """The breakdown tier's components in the report's order, then the runtime overhead, the margin up to the
    predicted high end (the caching allocator's reserved segments, or the dynamic margin) and the free headroom,
    which together reach the memory the headroom is measured against. Over capacity, no headroom band. Empty
    without a plan or when nothing was sized. The tier and the budget are the report's own
    (`aegis.planning.report._facts.plan_facts`)."""
    facts = None if report is None else _facts(report)
    if facts is None or facts.tier is None:
        return []
    mem, f = facts.tier.memory, facts.memory
    bands = [Band(c.key, c.name, c.bytes) for c in mem.components if c.in_peak]
    if mem.overhead_bytes:
        bands.append(Band("overhead", "Runtime overhead", mem.overhead_bytes))
    bands.append(Band("margin", "Margin to the high end", f.high_bytes - f.total_bytes))
    if f.headroom_bytes > 0:
        bands.append(Band("headroom", "Headroom (free)", f.headroom_bytes))
    return bands


def _bar_label(report: PlanReport) -> str:
    f = _facts(report).memory
    return f"{report.gpu.name.removeprefix('NVIDIA ').removeprefix('GeForce ')} ({f.budget_bytes / GIB:.1f} GiB {f.budget_label})"


def memory_frame(report: PlanReport | None) -> Any:
    """The chart's bands as a DataFrame (columns bar, component, GiB), for plotting elsewhere; empty without a plan."""
    import pandas as pd

    bands = memory_bands(report)
    if not bands:  # typed columns
        return pd.DataFrame({"bar": pd.Series([], dtype=str), "component": pd.Series([], dtype=str),
                             "GiB": pd.Series([], dtype=float)})
    assert report is not None
    return pd.DataFrame({"bar": [_bar_label(report)] * len(bands), "component": [b.key for b in bands],
                         "GiB": [round(b.bytes / GIB, 3) for b in bands]})


def memory_chart_html(report: PlanReport | None) -> str:
    """The memory chart as HTML: one horizontal bar from 0 to the GPU's memory (or to the predicted high end when
    that is more), used memory from the left and the free headroom last, on the right; every band named with its
    size and share in a legend that wraps at any width. Empty without a sized plan."""
    from html import escape

    from aegis.planning.report.format import format_bytes

    bands = memory_bands(report)
    if not bands:
        return ""
    assert report is not None
    f = _facts(report).memory
    scale = max(sum(b.bytes for b in bands), f.budget_bytes)
    cells, items = [], []
    for b in bands:
        color = _COMPONENT_COLORS.get(b.key, _OTHER_COLOR)
        pct = 100 * b.bytes / scale
        text = f"{b.label}: {format_bytes(b.bytes)} ({b.bytes / f.budget_bytes:.0%} of {format_bytes(f.budget_bytes, 1)})"
        cells.append(f'<div class="aegis-band" data-key="{escape(b.key)}" title="{escape(text)}" '
                     f'style="width:{pct:.3f}%;background-color:{color}"></div>')
        items.append(f'<li data-key="{escape(b.key)}"><span class="aegis-swatch" style="background-color:{color}">'
                     f'</span><span>{escape(b.label)}</span><span class="aegis-gib">{format_bytes(b.bytes)}</span></li>')
    over = "" if f.headroom_bytes > 0 else f" — over by {format_bytes(-f.headroom_bytes, 1)}"
    return (
        f'<div class="aegis-mem"><div class="aegis-mem-title">{escape(_bar_label(report))}{over}</div>'
        f'<div class="aegis-mem-bar" role="img" aria-label="memory used and free">{"".join(cells)}</div>'
        f'<div class="aegis-mem-scale"><span>0</span><span>{format_bytes(scale, 1)}</span></div>'
        f'<ul class="aegis-mem-legend">{"".join(items)}</ul></div>'
    )


def _facts(report: PlanReport) -> Any:
    from aegis.planning.report._facts import plan_facts

    return plan_facts(report)


def _memory_caption(report: PlanReport | None) -> str:
    if report is None:
        return "_Plan something to see its memory breakdown._"
    facts = _facts(report)
    if facts.tier is None:
        return f"**Does not fit.** {report.nothing_fits}"
    from aegis.planning.report.format import format_bytes

    f = facts.memory
    head = "" if report.recommended is not None else "**Does not fit.** Smallest tried: "
    return (
        f"{head}**Memory total: {format_bytes(f.total_bytes)}** predicted ({facts.tier.name}), high end "
        f"{format_bytes(f.high_bytes, 1)} of {format_bytes(f.budget_bytes, 1)} {f.budget_label} on the "
        f"{report.gpu.name}: headroom {format_bytes(f.headroom_bytes, 1)} ({f.verdict})"
    )


def loss_frame(losses: tuple[float, ...] | list[float], steps: tuple[int, ...] | list[int]) -> Any:
    """Loss of the last logged steps as a DataFrame for `gr.LinePlot`: a RunStatusReport's ``losses`` at its
    ``loss_steps`` (the steps the metrics logged, as `aegis status`'s sparkline window names them)."""
    import math

    import pandas as pd

    points = [(s, v) for s, v in zip(steps, losses, strict=True) if math.isfinite(v)]
    return pd.DataFrame(
        {"step": pd.Series([p[0] for p in points], dtype=int), "loss": pd.Series([p[1] for p in points], dtype=float)}
    )


def command_buttons(status: Any) -> list[str]:
    """The commands the run panel offers for a run's status (a RunStatusReport) while it waits for a human, in
    order, at most MAX_COMMAND_BUTTONS: the paused-run panel's actions (:func:`aegis.supervise.status.paused_actions`,
    as `aegis status` and Slack offer). A button shows its command, which a press sends as chat text."""
    from aegis.supervise.status import paused_actions

    if not status.pending_reason:
        return []
    return [a.command for a in paused_actions(status.suggested_actions, status.suspected_samples)][:MAX_COMMAND_BUTTONS]


def build_ui(agent: ChatAgent, *, refresh_s: float = 1.0) -> Any:
    """The Gradio Blocks app over ``agent``."""
    gr = _gradio()  # no `from __future__ import annotations` here: gradio reads `gr.Request` annotations at runtime

    def thread_of(request: Any) -> str:
        return f"web-{getattr(request, 'session_hash', None) or 'default'}"

    def send(text: str, history: list[dict[str, Any]], request: gr.Request) -> tuple[Any, ...]:
        text = (text or "").strip()
        if not text:
            return history, "", gr.update(), gr.update()
        reply = agent.reply(text, thread_of(request))
        history = [*history, {"role": "user", "content": text}, {"role": "assistant", "content": reply.text}]
        if any(c.name == "plan_finetune" for c in reply.tool_calls):
            return history, "", memory_chart_html(reply.report), _memory_caption(reply.report)
        return history, "", gr.update(), gr.update()

    def run_panel(request: gr.Request) -> tuple[Any, ...]:
        run_id = agent.conversation(thread_of(request)).run_id
        hidden = [gr.update(visible=False, value="")] * MAX_COMMAND_BUTTONS
        if run_id is None:
            return ("_No run yet: plan something, then say `start the run`._", loss_frame((), ()), "", *hidden)
        st = agent.runs.status(run_id)
        status = status_markdown(st)
        if agent.runs.error(run_id):
            status += f"\n- The run's process failed: {agent.runs.error(run_id)}"
        details = "\n".join(paused_details(st))  # the paused panel's anomaly and diagnosis, as Slack's notice
        if not st.pending_reason and st.last_anomaly:
            details = f"**Last anomaly:** {st.last_anomaly}"
        commands = command_buttons(st)
        buttons = [gr.update(visible=True, value=c) for c in commands]
        buttons += [gr.update(visible=False, value="")] * (MAX_COMMAND_BUTTONS - len(buttons))
        return (status, loss_frame(st.losses, st.loss_steps), details, *buttons)

    def press(command: str, history: list[dict[str, Any]], request: gr.Request) -> tuple[Any, ...]:
        return send(command, history, request)

    demo = gr.Blocks(title="Aegis", analytics_enabled=False, fill_width=True)
    demo.aegis_policy = getattr(agent, "policy", None)  # what `launch` checks before serving beyond loopback
    with demo:
        gr.Markdown("## Aegis — plan a fine-tune, then run it under a self-healing supervisor")
        with gr.Row():
            with gr.Column(scale=5, min_width=480):  # below ~840 px the two columns stack
                chat = gr.Chatbot(label="Aegis", show_label=False, height=640, elem_id="aegis-chat")
                with gr.Row():
                    box = gr.Textbox(
                        placeholder="qlora llama-3.1-8b on 3090",
                        show_label=False,
                        scale=5,
                        elem_id="aegis-input",
                        submit_btn=True,
                    )
            with gr.Column(scale=3, min_width=340):
                caption = gr.Markdown(_memory_caption(None), elem_id="aegis-memory-total")
                chart = gr.HTML("", elem_id="aegis-memory-chart")  # one bar: used from the left, headroom last
                gr.Markdown("#### Run")
                run_status = gr.Markdown(elem_id="aegis-run-status")
                loss = gr.LinePlot(
                    loss_frame((), ()), x="step", y="loss", title="Loss", height=220, elem_id="aegis-loss"
                )
                details = gr.Markdown(elem_id="aegis-run-details")
                with gr.Row():
                    buttons = [gr.Button(visible=False, size="sm") for _ in range(MAX_COMMAND_BUTTONS)]
        box.submit(send, [box, chat], [chat, box, chart, caption])
        for b in buttons:
            b.click(press, [b, chat], [chat, box, chart, caption])
        timer = gr.Timer(refresh_s)
        timer.tick(run_panel, None, [run_status, loss, details, *buttons], show_progress="hidden")
        demo.load(run_panel, None, [run_status, loss, details, *buttons])
    return demo


def is_loopback(host: str | None) -> bool:
    """True for an address only this machine reaches (127.0.0.0/8, ::1, localhost)."""
    if not host:
        return False
    if host.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def is_remote(host: str | None, share: bool) -> bool:
    """Others can reach the app: bound beyond loopback, or a gradio.live share link."""
    return share or not is_loopback(host)


def parse_auth(value: str) -> list[tuple[str, str]]:
    """``user:pass`` (comma-separated for several) as Gradio's auth pairs; AegisError for a malformed one."""
    pairs = []
    for item in (v.strip() for v in value.split(",")):
        user, sep, password = item.partition(":")
        if not item or not sep or not user or not password:
            raise AegisError("--auth / AEGIS_GRADIO_AUTH takes user:password (comma-separated for several users)")
        pairs.append((user, password))
    return pairs


def token_auth(token: str) -> Callable[[str, str], bool]:
    """A Gradio auth check: any user name, the token as the password (compared in constant time)."""
    if not token:
        raise AegisError("the Gradio token (--auth-token / AEGIS_GRADIO_TOKEN) is empty")
    expected = token.encode()
    return lambda _user, password: hmac.compare_digest((password or "").encode(), expected)


def check_exposure(host: str | None, share: bool, auth: Auth | None, *, remote_paths: bool | None = None) -> None:
    """Refuse (AegisError, one line) to serve others without a login or with an agent that reads any path."""
    if not is_remote(host, share):
        return
    where = "with a share link" if share else f"on {host or 'every interface'}"
    if not auth:
        raise AegisError(
            f"refusing to serve the chat app {where} without a login: pass --auth user:pass "
            "(or set AEGIS_GRADIO_AUTH=user:pass, or AEGIS_GRADIO_TOKEN), or bind --host 127.0.0.1"
        )
    if remote_paths is not True:
        raise AegisError(
            f"refusing to serve the chat app {where} with an agent that reads any local path: build it with "
            "AgentSettings(remote=True) (paths only under AEGIS_MODEL_DIRS / AEGIS_DATA_DIRS)"
        )


def launch(
    demo: Any,
    *,
    host: str = "127.0.0.1",
    port: int | None = None,
    share: bool = False,
    block: bool = True,
    auth: Auth | None = None,
) -> Any:
    """Serve the app (127.0.0.1, no share link unless ``share``); with ``block=False`` returns at once.

    Beyond loopback or shared, ``auth`` is required and the agent must be remote (`check_exposure`)."""
    policy = getattr(demo, "aegis_policy", None)
    check_exposure(host, share, auth, remote_paths=None if policy is None else policy.remote)
    _gradio()
    return demo.launch(
        server_name=host,
        server_port=port,
        share=share,
        auth=auth or None,
        prevent_thread_lock=not block,
        show_error=True,
        quiet=not block,
        css=CHART_CSS,
    )
