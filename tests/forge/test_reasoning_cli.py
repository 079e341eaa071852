"""`aegis reasoning PROMPTS OUT.jsonl`: reasoning rows for Quiet-STaR's baking from an OpenAI-compatible endpoint.

References: pydantic-ai's ``FunctionModel`` in place of the endpoint (the issue's rule: tests never reach the
network), and pydantic-ai's own OpenAI client against a minimal OpenAI-compatible server on 127.0.0.1 (the chat
completions protocol, answering with the tool call pydantic-ai asks for); `load_reasoning` reads what was written.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from typer.testing import CliRunner

from aegis.cli import app, main

pytest.importorskip("pydantic_ai")


def _cli(args: list[str]) -> tuple[int, str]:
    import aegis.cli as cli

    if "reasoning" not in {c.name for c in app.registered_commands}:
        cli._mount_forge_commands()
    r = CliRunner().invoke(app, args)
    return r.exit_code, r.output


def _function_model():
    """Replies through pydantic-ai's output tool; the first reply lacks the thinking markers (validated, retried)."""
    from pydantic_ai.messages import ModelResponse, ToolCallPart
    from pydantic_ai.models.function import FunctionModel

    calls: list[int] = []

    def reply(messages, info):
        calls.append(1)
        reasoning = "no markers" if len(calls) == 1 else "[thinking] <step> add the ones [/endthinking]"
        return ModelResponse(parts=[ToolCallPart(info.output_tools[0].name, {"reasoning": reasoning, "answer": "5"})])

    return FunctionModel(reply), calls


def test_rows_are_generated_validated_and_written_for_quietstar(tmp_path: Path, monkeypatch) -> None:
    from aegis.forge.quietstar import load_reasoning
    from aegis.forge.quietstar import reasoning_data as qd

    model, calls = _function_model()
    seen = {}

    def fake_endpoint(url, name, key):
        seen.update(url=url, name=name, key=key)
        return model

    monkeypatch.setattr(qd, "endpoint_model", fake_endpoint)
    monkeypatch.setenv("MY_KEY", "sk-test")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"question": "What is 2+3?"}) + "\n" + json.dumps({"prompt": "And 1+4?"}) + "\n")
    out = tmp_path / "rows.jsonl"
    code, text = _cli(["reasoning", str(prompts), str(out), "--endpoint", "http://127.0.0.1:1/v1", "--model", "m",
                       "--api-key-env", "MY_KEY", "--rpm", "100000"])
    assert code == 0, text
    assert seen == {"url": "http://127.0.0.1:1/v1", "name": "m", "key": "sk-test"}
    rows = load_reasoning(out)
    assert [r.prompt for r in rows] == ["What is 2+3?", "And 1+4?"] and all(r.answer == "5" for r in rows)
    assert "2 of 2 prompts" in text and "1 rejected" in text  # the first reply had no markers: retried
    before = out.read_text()
    code, text = _cli(["reasoning", str(prompts), str(out)])  # an existing file is not replaced without --overwrite
    assert code == 2 and text.startswith("error: ") and "--overwrite" in text and out.read_text() == before


@pytest.mark.parametrize(("args", "words"), [
    (["{missing}", "{out}"], "no such file"),
    (["{prompts}", "{out}", "--strategy", "<think>"], "not a strategy token"),
    (["{nofield}", "{out}"], "has no prompt"),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path: Path, args: list[str], words: str) -> None:
    (tmp_path / "p.txt").write_text("What is 2+3?\n")
    (tmp_path / "n.jsonl").write_text(json.dumps({"text": "no prompt field"}) + "\n")
    paths = {"missing": tmp_path / "missing.txt", "prompts": tmp_path / "p.txt", "nofield": tmp_path / "n.jsonl",
             "out": tmp_path / "rows.jsonl"}
    code, text = _cli(["reasoning", *(a.format(**paths) for a in args)])
    assert code == 2, text
    assert text.startswith("error: ") and text.strip().count("\n") == 0 and words in text
    assert not (tmp_path / "rows.jsonl").exists()


class _OpenAICompatible(BaseHTTPRequestHandler):
    """POST /v1/chat/completions answering with a call of the output tool the request offers."""

    requests: list[dict] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
        tool = body["tools"][0]["function"]["name"]
        args = {"reasoning": "[thinking] <mece> 7 has no divisor but 1 and 7 [/endthinking]", "answer": "yes"}
        reply = {
            "id": "c1", "object": "chat.completion", "created": 0, "model": body["model"],
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                "role": "assistant", "content": None,
                "tool_calls": [{"id": "t1", "type": "function",
                                "function": {"name": tool, "arguments": json.dumps(args)}}]}}],
            "usage": {"prompt_tokens": 40, "completion_tokens": 20, "total_tokens": 60},
        }
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:  # quiet
        pass


def test_a_real_openai_client_talks_to_an_openai_compatible_server_on_localhost(tmp_path: Path, monkeypatch) -> None:
    pytest.importorskip("openai")
    server = ThreadingHTTPServer(("127.0.0.1", 0), _OpenAICompatible)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("OPENAI_API_KEY", "sk-local")
        (tmp_path / "p.txt").write_text("Is 7 prime?\nIs 9 prime?\n")
        out = tmp_path / "rows.jsonl"
        url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        code, text = _cli(["reasoning", str(tmp_path / "p.txt"), str(out), "--endpoint", url, "--model", "local-7b",
                           "--rpm", "100000", "--usd-per-1k-tokens", "0.5"])
    finally:
        server.shutdown()
    assert code == 0, text
    reqs = _OpenAICompatible.requests
    assert [r["path"] for r in reqs] == ["/v1/chat/completions"] * 2
    assert reqs[0]["auth"] == "Bearer sk-local" and reqs[0]["body"]["model"] == "local-7b"
    assert "Is 7 prime?" in json.dumps(reqs[0]["body"]["messages"])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["prompt"] for r in rows] == ["Is 7 prime?", "Is 9 prime?"] and rows[0]["answer"] == "yes"
    assert "120 tokens, $0.060" in text  # 2 x 60 tokens at $0.5 per 1,000


def test_main_prints_the_missing_extra_in_one_line_without_the_openai_client(tmp_path: Path, monkeypatch, capsys) -> None:
    import builtins

    real_import = builtins.__import__

    def no_openai(name, *args, **kwargs):
        if name.startswith("pydantic_ai.models.openai"):
            raise ImportError("Please install `openai` to use the OpenAI model")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_openai)
    (tmp_path / "p.txt").write_text("What is 2+3?\n")
    with pytest.raises(SystemExit) as exit_:
        main(["reasoning", str(tmp_path / "p.txt"), str(tmp_path / "rows.jsonl")])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "pip install 'aegis-ml[llm]'" in err and err.strip().count("\n") == 0
