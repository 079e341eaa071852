"""Aegis' conversational agent: plans, GPU comparisons, memory explanations and run control in chat.

A LangGraph graph (``understand → tools → respond``) persisted per conversation in SQLite; the
SDK's operations are its langchain-core tools. Works offline with the deterministic request parser;
an LLM (pydantic-ai, ``AEGIS_LLM_MODEL``) reads free-form requests the parser cannot.

    from aegis_agent import ChatAgent, AgentSettings
    with ChatAgent(AgentSettings(runs_dir="runs")) as agent:
        print(agent.reply("qlora llama-3.1-8b on 3090", thread_id="me").text)
        print(agent.reply("on a 4090 instead", thread_id="me").text)
"""

from aegis_agent.agent import AgentReply, ChatAgent, ConversationView, ToolCallRecord
from aegis_agent.graph import build_graph, open_checkpointer, thread_config
from aegis_agent.llm import RequestExtractor
from aegis_agent.runs import RunManager, RunNotice, status_markdown
from aegis_agent.settings import AgentSettings
from aegis_agent.tools import TOOL_NAMES, AegisToolkit, explain_component
from aegis_agent.understand import HELP, ToolCall, Understanding, carry_over, understand

__all__ = [
    "HELP",
    "TOOL_NAMES",
    "AegisToolkit",
    "AgentReply",
    "AgentSettings",
    "ChatAgent",
    "ConversationView",
    "RequestExtractor",
    "RunManager",
    "RunNotice",
    "ToolCall",
    "ToolCallRecord",
    "Understanding",
    "build_graph",
    "carry_over",
    "explain_component",
    "open_checkpointer",
    "status_markdown",
    "thread_config",
    "understand",
]
