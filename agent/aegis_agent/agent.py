"""`ChatAgent`: one object the front ends talk to — a message in, a reply (and what it did) out.

    agent = ChatAgent(AgentSettings.from_env())
    reply = agent.reply("qlora llama-3.1-8b on 3090", thread_id="web-1")
    reply.text            # Markdown (the SDK's report renderer)
    reply.report          # the PlanReport when this turn planned, for charts and Block Kit
    reply.tool_calls      # (ToolCallRecord(name='plan_finetune', args={...}),)
    agent.close()

Conversations persist in ``settings.conversation_db`` (SQLite): a new `ChatAgent` on the same
file continues a thread where it stopped. ``settings.remote`` (and the model/data roots) decide which
local paths a request may name (`aegis.access.PathPolicy`); remote front ends require it.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

from aegis.access import PathPolicy
from aegis.schema import Frozen, PlanReport, PlanRequest
from langchain_core.messages import AIMessage, HumanMessage
from pydantic import Field

from aegis_agent.graph import build_graph, open_checkpointer, thread_config
from aegis_agent.llm import RequestExtractor
from aegis_agent.runs import RunManager
from aegis_agent.settings import AgentSettings
from aegis_agent.tools import AegisToolkit

__all__ = ["AgentReply", "ChatAgent", "ConversationView", "ToolCallRecord"]


class ToolCallRecord(Frozen):
    """A tool the agent called this turn."""

    name: str
    args: dict[str, Any] = Field(default_factory=dict)


class ConversationView(Frozen):
    """The persisted state of one conversation."""

    thread_id: str
    request: PlanRequest | None = Field(default=None, description="The request follow-ups build on.")
    run_id: str | None = Field(default=None, description="The run this conversation steers.")
    messages: int = Field(default=0, description="Messages stored so far.")


class AgentReply(Frozen):
    """One answer of the agent."""

    text: str = Field(description="Markdown for the user.")
    tool_calls: tuple[ToolCallRecord, ...] = ()
    understood_by: str = Field(default="rules", description="parser, llm or rules.")
    request: PlanRequest | None = Field(default=None, description="The conversation's request after this turn.")
    run_id: str | None = None
    report: PlanReport | None = Field(default=None, description="The report when this turn planned successfully.")


class ChatAgent:
    """The agent graph compiled with a SQLite checkpointer, plus the run manager it steers."""

    def __init__(
        self,
        settings: AgentSettings | None = None,
        *,
        runs: RunManager | None = None,
        extractor: RequestExtractor | None = None,
    ) -> None:
        self.settings = settings or AgentSettings.from_env()
        self.runs = runs or RunManager(self.settings)
        self.toolkit = AegisToolkit(self.runs, policy=self.settings.path_policy)
        self.extractor = extractor if extractor is not None else RequestExtractor.from_settings(self.settings)
        self._stack = contextlib.ExitStack()
        saver = self._stack.enter_context(open_checkpointer(self.settings.conversation_db))
        self.app = build_graph(self.toolkit, self.extractor).compile(checkpointer=saver)
        self._lock = threading.Lock()

    def reply(self, text: str, thread_id: str = "default") -> AgentReply:
        """Answer one message of conversation ``thread_id``."""
        cfg = thread_config(thread_id)
        with self._lock:
            before = len(self.app.get_state(cfg).values.get("messages", []))
            out = self.app.invoke({"messages": [HumanMessage(content=text)]}, cfg)
        new = out["messages"][before:]
        calls = tuple(
            ToolCallRecord(name=c["name"], args=c["args"])
            for m in new
            if isinstance(m, AIMessage)
            for c in m.tool_calls
        )
        understood = next(
            (
                m.response_metadata.get("understood_by")
                for m in new
                if isinstance(m, AIMessage) and m.response_metadata.get("understood_by")
            ),
            "rules",
        )
        request = PlanRequest(**out["request"]) if out.get("request") else None
        report = None
        if request is not None and any(c.name == "plan_finetune" for c in calls):
            report = self.toolkit.cached_report(request)
        return AgentReply(
            text=str(new[-1].content),
            tool_calls=calls,
            understood_by=understood,
            request=request,
            run_id=out.get("run_id"),
            report=report,
        )

    def conversation(self, thread_id: str = "default") -> ConversationView:
        """What the conversation remembers (request, run, message count)."""
        values = self.app.get_state(thread_config(thread_id)).values
        req = values.get("request")
        return ConversationView(
            thread_id=thread_id,
            request=PlanRequest(**req) if req else None,
            run_id=values.get("run_id"),
            messages=len(values.get("messages", [])),
        )

    @property
    def policy(self) -> PathPolicy:
        """The path policy every request of this agent passes."""
        return self.toolkit.policy

    def close(self) -> None:
        self._stack.close()

    def __enter__(self) -> ChatAgent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
