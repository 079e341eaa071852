"""The scripted conversation through the agent graph: plan → follow-ups → start run → interrupt →
set_lr 1e-5 → resume, with the expected tool calls, a real supervised run and persisted state."""

from __future__ import annotations

from pathlib import Path

import pytest
from aegis.supervise import Supervisor
from aegis_agent import AgentSettings, ChatAgent, RunManager

LLAMA = "meta-llama/Llama-3.1-8B"


@pytest.mark.slow
def test_scripted_conversation(tmp_path: Path, fast_template: Path) -> None:
    settings = AgentSettings(runs_dir=str(tmp_path / "runs"), run_template=str(fast_template), run_tiers="template")
    runs = RunManager(settings, compile_cache=False)
    notices = []
    runs.add_listener(notices.append)
    agent = ChatAgent(settings, runs=runs)

    def say(text: str):
        reply = agent.reply(text, "conv-1")
        return reply, [(c.name, c.args) for c in reply.tool_calls]

    reply, calls = say("qlora llama-3.1-8b on 3090")
    assert calls == [("plan_finetune", {"model": LLAMA, "method": "qlora", "gpu": "rtx-3090"})]
    assert reply.report is not None and "RTX 3090" in reply.text
    total_3090 = reply.report.recommended.memory.total_bytes

    reply, calls = say("on a 4090 instead")
    assert calls == [("plan_finetune", {"model": LLAMA, "method": "qlora", "gpu": "rtx-4090"})]
    assert reply.report.gpu.id == "rtx-4090" and reply.report.recommended.memory.total_bytes != total_3090

    reply, calls = say("rank 32")
    request = {"model": LLAMA, "method": "qlora", "gpu": "rtx-4090", "lora_rank": 32}
    assert calls == [("plan_finetune", request)]
    assert reply.report.lora.rank == 32 and "rank 32" in reply.text

    reply, calls = say("start the run")
    assert calls == [("start_run", {"request": request})]
    run_id = reply.run_id
    assert run_id and f"Started run `{run_id}`" in reply.text

    reply, calls = say("interrupt")
    assert calls == [("send_run_command", {"command": "interrupt", "run_id": run_id})]
    paused = runs.wait(run_id, lambda s: s.pending_reason is not None, timeout_s=240)
    assert paused.status in ("running", "paused") and "interrupt" in paused.pending_reason
    assert "set_lr" in " ".join(paused.suggested_actions)

    reply, calls = say("set_lr 1e-5")
    assert calls == [("send_run_command", {"command": "set_lr 1e-05", "run_id": run_id})]
    assert "Sent `set_lr 1e-05`" in reply.text
    runs.wait(run_id, lambda s: s.lr == 1e-5, timeout_s=60)

    reply, calls = say("resume")
    assert calls == [("send_run_command", {"command": "resume", "run_id": run_id})]
    final = runs.wait(run_id, lambda s: s.status == "completed", timeout_s=240)
    runs.join(run_id, 30)
    assert final.step == final.total_steps == 30 and final.lr == 1e-5

    reply, calls = say("status")
    assert calls == [("run_status", {"run_id": run_id})] and "completed" in reply.text

    applied = [
        e.data.get("command") for e in Supervisor(settings.runs_dir).events(run_id) if e.kind == "command_applied"
    ]
    assert applied[:3] == ["interrupt", "set_lr 1e-05", "resume"]
    assert [n.kind for n in notices if n.run_id == run_id][:1] == ["paused"] and notices[-1].kind == "completed"
    agent.close()

    with ChatAgent(settings, runs=runs) as again:  # a new process: the conversation is in SQLite
        view = again.conversation("conv-1")
        assert view.request.model_dump(exclude_none=True) == request and view.run_id == run_id
        assert view.messages == 8 * 4  # each turn: human, AI tool call, tool result, AI reply
        reply = again.reply("with 8-bit adam", "conv-1")
        assert reply.tool_calls[0].args == {**request, "optimizer": "adamw_8bit"}
