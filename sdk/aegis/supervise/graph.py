"""The supervisor as a LangGraph ``StateGraph``, persisted in the run folder's SQLite file.

::

    START → train → monitor ─ normal ──────────────→ train | curriculum → train | END (done/stopped)
                            ├ loss spike / grad / NaN → forensics → repair ─ auto-fix → train
                            └ OOM / operator ────────────────────→ repair ─ escalate → notify → human
    human ─ resume → train │ stop → END │ other commands → human (waits again)

The graph state is one key, ``run``: the :class:`RunState` as JSON. The checkpointer is
``langgraph.checkpoint.sqlite.SqliteSaver`` on ``<run>/supervisor.sqlite`` with the run id as
thread id, so any process can resume the run or read its state.

    with open_graph(ctx) as app:
        app.invoke(initial, thread_config(run_id))
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from functools import partial
from typing import Any, TypedDict

from aegis.supervise.context import RunContext
from aegis.supervise.nodes import (
    curriculum_node,
    forensics_node,
    human_node,
    monitor_node,
    notify_node,
    repair_node,
    route_after_human,
    route_after_monitor,
    route_after_repair,
    train_node,
)
from aegis.supervise.runs import RunPaths

__all__ = ["GraphState", "build_graph", "open_graph", "open_saver", "thread_config", "read_state"]


class GraphState(TypedDict):
    """LangGraph channel layout: the whole run state as JSON under ``run``."""

    run: dict[str, Any]


def thread_config(run_id: str, recursion_limit: int = 100_000) -> dict[str, Any]:
    """The LangGraph config addressing a run's thread."""
    return {"configurable": {"thread_id": run_id}, "recursion_limit": recursion_limit}


def build_graph(ctx: RunContext) -> Any:
    """The uncompiled StateGraph with every node bound to ``ctx``."""
    from langgraph.graph import END, START, StateGraph

    g = StateGraph(GraphState)
    g.add_node("train", partial(train_node, ctx))
    g.add_node("monitor", partial(monitor_node, ctx))
    g.add_node("forensics", partial(forensics_node, ctx))
    g.add_node("repair", partial(repair_node, ctx))
    g.add_node("curriculum", partial(curriculum_node, ctx))
    g.add_node("notify", partial(notify_node, ctx))
    g.add_node("human", partial(human_node, ctx))
    g.add_edge(START, "train")
    g.add_edge("train", "monitor")
    g.add_conditional_edges(
        "monitor",
        partial(route_after_monitor, ctx),
        {"train": "train", "forensics": "forensics", "repair": "repair", "curriculum": "curriculum", "end": END},
    )
    g.add_edge("forensics", "repair")
    g.add_conditional_edges("repair", partial(route_after_repair, ctx), {"train": "train", "notify": "notify"})
    g.add_edge("curriculum", "train")
    g.add_edge("notify", "human")
    g.add_conditional_edges(
        "human", partial(route_after_human, ctx), {"train": "train", "human": "human", "end": END}
    )
    return g


@contextlib.contextmanager
def open_saver(paths: RunPaths) -> Iterator[Any]:
    """A SqliteSaver on the run's SQLite file (closed on exit)."""
    from langgraph.checkpoint.sqlite import SqliteSaver

    conn = sqlite3.connect(str(paths.sqlite), check_same_thread=False, timeout=30)
    try:
        yield SqliteSaver(conn)
    finally:
        conn.close()


@contextlib.contextmanager
def open_graph(ctx: RunContext) -> Iterator[Any]:
    """The compiled graph with its SQLite checkpointer."""
    with open_saver(ctx.paths) as saver:
        yield build_graph(ctx).compile(checkpointer=saver)


def read_state(paths: RunPaths) -> dict[str, Any] | None:
    """The latest persisted run state (JSON), without building the graph; None before the first node."""
    if not paths.sqlite.exists():
        return None
    with open_saver(paths) as saver:
        tup = saver.get_tuple({"configurable": {"thread_id": paths.run_id}})
    if tup is None:
        return None
    return tup.checkpoint.get("channel_values", {}).get("run")
