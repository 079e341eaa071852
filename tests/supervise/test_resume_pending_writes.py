"""A process killed after a node returned but before LangGraph wrote the next checkpoint (its result is only a pending
write): `resume` goes on from that result (the next node runs; the finished one is not run again) instead of taking
the run for finished. Seen when `kill -9` hit process 0 of a 2-process run right after a window."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import aegis.supervise.graph as G
from aegis.supervise.nodes import dump
from aegis.supervise.runner import Supervisor
from aegis.supervise.runs import RunPaths
from aegis.supervise.state import RunState


def test_resume_goes_on_from_a_node_result_the_kill_left_uncheckpointed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []

    def node(name: str) -> Any:
        def run(ctx: Any, gs: dict) -> dict:
            calls.append(name)
            state = RunState.model_validate(gs["run"])
            return dump(state.update(status="completed") if name == "monitor" else state)
        return run

    for name in ("train", "monitor", "forensics", "repair", "curriculum", "notify", "human"):
        monkeypatch.setattr(G, f"{name}_node", node(name))
    monkeypatch.setattr(G, "route_after_monitor", lambda ctx, gs: "end")
    paths = RunPaths(tmp_path / "r")
    paths.root.mkdir()
    tc = G.thread_config("r")
    start = dump(RunState.new("r", lr=1e-3, grad_clip=1.0, weights={"default": 1.0}))
    with G.open_saver(paths) as saver:
        app = G.build_graph(None).compile(checkpointer=saver, interrupt_before=["train"])
        app.invoke(start, tc)
        snap = app.get_state(tc)
        assert snap.next == ("train",)
        trained = dump(RunState.model_validate(start["run"]).update(step=3))
        saver.put_writes(snap.config, [("run", trained["run"]), ("branch:to:monitor", None)], snap.tasks[0].id)
        assert app.get_state(tc).next == ()  # what a resume used to read as "finished"

    ctx = SimpleNamespace(paths=paths, close=lambda: None)
    Supervisor(tmp_path)._drive(ctx, None, None, implicit_resume=True)  # type: ignore[arg-type]
    assert calls == ["monitor"]
    with G.open_saver(paths) as saver:
        final = G.build_graph(None).compile(checkpointer=saver).get_state(tc).values["run"]
    assert (final["status"], final["step"]) == ("completed", 3)
