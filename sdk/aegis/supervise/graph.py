"""The supervisor as a LangGraph ``StateGraph``, persisted in the run folder's SQLite file.

::

    START → train → monitor ─ normal ──────────────→ train | curriculum → train | END (done/stopped)
                            ├ loss spike / grad / NaN → forensics → repair ─ auto-fix → train
                            └ OOM / operator ────────────────────→ repair ─ escalate → notify → human
    human ─ resume → train │ stop → END │ other commands → human (waits again)

The graph state is one key, ``run``: the :class:`RunState` as JSON. The checkpointer is
``langgraph.checkpoint.sqlite.SqliteSaver`` on ``<run>/supervisor.sqlite`` with the run id as
thread id, so any process can resume the run or read its state.

In a multi-process run every process runs this graph (each node's collectives need all of them), and process 0's
state after each node is every process's (:func:`aegis.train.distributed.share`): one supervisor decides the
rollbacks, LR changes, blacklists, curriculum weights and stops, and all processes take them at the same step.

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
    nodes = {"train": train_node, "monitor": monitor_node, "forensics": forensics_node, "repair": repair_node,
             "curriculum": curriculum_node, "notify": notify_node, "human": human_node}
    for name, node in nodes.items():
        g.add_node(name, partial(_decided_by_process_0, name, node, ctx))
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


def _decided_by_process_0(name: str, node: Any, ctx: RunContext, gs: GraphState) -> GraphState:
    """Run ``node``; in a multi-process run, leave with process 0's state (the same on every process)."""
    from aegis.train.distributed import share

    out = node(ctx, gs)
    decided = share(f"state after {name}", out)
    if decided != out:  # a follower that would have decided otherwise: follow, and say where
        mine, primary = out.get("run", {}), decided.get("run", {})
        differ = sorted(k for k in set(mine) | set(primary) if mine.get(k) != primary.get(k) and k != "window")
        if differ:  # (a window's steps differ in their measured speed only)
            ctx.event("decision_of_process_0", primary.get("step"), node=name, fields=differ)
    return decided


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
