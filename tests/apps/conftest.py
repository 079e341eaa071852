"""App test fixtures: a local fake Slack Web API (http.server on 127.0.0.1) that records every call."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import pytest

from tests.agent._runs import write_template

NOT_IN_CHANNEL = "CNOTIN"
"""A channel the fake Slack refuses posts to, as Slack does where the bot was not invited."""


class FakeSlack:
    """Answers every Web API method with ok=true; ``calls`` holds (method, params) in order."""

    not_in_channel = NOT_IN_CHANNEL

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self._ts = 1000
        self._lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
                if "json" in (self.headers.get("Content-Type") or ""):
                    params = json.loads(raw or "{}")
                else:
                    params = {k: v[0] for k, v in parse_qs(raw).items()}
                if isinstance(params.get("blocks"), str):
                    params["blocks"] = json.loads(params["blocks"])
                method = self.path.rsplit("/", 1)[-1]
                body = fake.answer(method, params)
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/api/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def answer(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            self.calls.append((method, params))
            if method == "auth.test":
                return {"ok": True, "user_id": "UBOT", "bot_id": "BBOT", "team_id": "T1", "user": "aegis", "team": "t"}
            if method == "chat.postMessage" and params.get("channel") == NOT_IN_CHANNEL:
                return {"ok": False, "error": "not_in_channel"}
            self._ts += 1
            params["_ts"] = f"{self._ts}.000100"  # the ts Slack answered with, for thread replies
            return {"ok": True, "channel": params.get("channel"), "ts": params["_ts"]}

    def posted(self, method: str = "chat.postMessage") -> list[dict[str, Any]]:
        with self._lock:
            return [p for m, p in self.calls if m == method]

    def wait_for(self, pred: Any, timeout_s: float = 60.0, method: str = "chat.postMessage") -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for p in self.posted(method):
                if pred(p):
                    return p
            time.sleep(0.05)
        raise AssertionError(f"no {method} matching within {timeout_s} s; calls: {self.calls}")


@pytest.fixture
def fake_slack() -> Any:
    fake = FakeSlack()
    yield fake
    fake.server.shutdown()
    fake.server.server_close()


@pytest.fixture
def fast_template(tmp_path: Path) -> Path:
    return write_template(tmp_path)
