"""The conversational agent as a LangGraph graph with message state, persisted per conversation.

::

    START → understand ─ tool call ─→ tools (ToolNode) → respond → END
                       └ direct answer (help, a question back) ────→ END

``understand`` reads the latest human message with `aegis_agent.understand` (the deterministic
parser first, the optional LLM second) and emits an AI message with one tool call; ``tools`` runs
it; ``respond`` turns the tool's Markdown into the reply and updates the conversation: the planned
request (what follow-ups build on) and the run being steered. The state is small — messages, the
request as a dict, a run id — and checkpointed by ``SqliteSaver`` under the conversation's thread id.

    with open_checkpointer("runs/conversations.sqlite") as saver:
        app = build_graph(toolkit, extractor=None).compile(checkpointer=saver)
        app.invoke({"messages": [HumanMessage("qlora llama-3.1-8b on 3090")]}, thread_config("t1"))
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, TypedDict

from aegis.schema import PlanRequest
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
from langgraph.graph.message import add_messages

from aegis_agent.tools import AegisToolkit
from aegis_agent.understand import understand

__all__ = ["ConversationState", "build_graph", "open_checkpointer", "thread_config"]


class ConversationState(TypedDict, total=False):
    """LangGraph channels: the messages, the conversation's current request and run."""

    messages: Annotated[list[AnyMessage], add_messages]
    request: dict[str, Any] | None
    run_id: str | None


def thread_config(thread_id: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread_id}}


@contextlib.contextmanager
def open_checkpointer(path: str | Path) -> Iterator[Any]:
    """A SqliteSaver on ``path`` (created with its folder), closed on exit."""
    from langgraph.checkpoint.sqlite import SqliteSaver

    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(str(p), check_same_thread=False, timeout=30)
    try:
        yield SqliteSaver(conn)
    finally:
        conn.close()


def _last_human(messages: list[AnyMessage]) -> str:
    for m in reversed(messages):
        if isinstance(m, HumanMessage):
            return m.content if isinstance(m.content, str) else str(m.content)
    return ""


def build_graph(toolkit: AegisToolkit, extractor: Any = None) -> Any:
    """The uncompiled StateGraph; compile it with a checkpointer."""
    from langgraph.graph import END, START, StateGraph
    from langgraph.prebuilt import ToolNode

    def understand_node(state: ConversationState) -> dict[str, Any]:
        messages = state.get("messages", [])
        request = PlanRequest(**state["request"]) if state.get("request") else None
        u = understand(
            _last_human(messages),
            request=request,
            run_id=state.get("run_id"),
            extractor=extractor,
            policy=toolkit.policy,
        )
        if u.call is None:
            return {"messages": [AIMessage(content=u.reply or "", response_metadata={"understood_by": u.source})]}
        call = {"name": u.call.name, "args": u.call.args, "id": f"call_{len(messages)}", "type": "tool_call"}
        return {"messages": [AIMessage(content="", tool_calls=[call], response_metadata={"understood_by": u.source})]}

    def route(state: ConversationState) -> str:
        last = state["messages"][-1]
        return "tools" if isinstance(last, AIMessage) and last.tool_calls else END

    def respond_node(state: ConversationState) -> dict[str, Any]:
        update: dict[str, Any] = {}
        texts: list[str] = []
        for m in reversed(state["messages"]):
            if not isinstance(m, ToolMessage):
                break
            texts.insert(0, m.content if isinstance(m.content, str) else str(m.content))
            art = m.artifact or {}
            if "error" in art:
                continue
            if m.name in ("plan_finetune", "compare_gpus") and art.get("request"):
                update["request"] = art["request"]
            if art.get("run_id"):
                update["run_id"] = art["run_id"]
        update["messages"] = [AIMessage(content="\n\n".join(texts))]
        return update

    g = StateGraph(ConversationState)
    g.add_node("understand", understand_node)
    g.add_node("tools", ToolNode(toolkit.tools(), handle_tool_errors=False))
    g.add_node("respond", respond_node)
    g.add_edge(START, "understand")
    g.add_conditional_edges("understand", route, {"tools": "tools", END: END})
    g.add_edge("tools", "respond")
    g.add_edge("respond", END)
    return g
