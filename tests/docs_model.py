"""A model server on loopback for the commands the docs show: OpenAI and Anthropic shapes.

It answers like a provider that behaves: the forge's plan and contract (taken
from the bundled example cassette, so they pass the forge's checks), Anthropic
forced-tool answers for `fluid corpus record --response-model Plan`, and the
model list `fluid ai setup --check` asks for. Every request is kept, so a test
can say how many a command sent.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

EXAMPLE_CASSETTE = (
    Path(__file__).resolve().parents[1]
    / "src"
    / "fluid_build"
    / "forge"
    / "examples"
    / "sales_orders.cassette.json"
)


def _example_answers() -> tuple[str, str]:
    """The plan and the final contract the bundled cassette's model gave, as text."""
    exchanges = json.loads(EXAMPLE_CASSETTE.read_text(encoding="utf-8"))["exchanges"]
    texts = [
        e["response"]["body"]["choices"][0]["message"]["content"]
        for e in exchanges
        if e["response"]["status"] == 200
    ]
    return texts[0], texts[-1]


PLAN_TEXT, CONTRACT_TEXT = _example_answers()
GENERIC_PLAN = {"name": "sales_orders", "steps": ["stage the orders", "build the fact table"]}


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class Model:
    """What the server was asked."""

    requests: list[Request] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: Answers a test scripts instead (None: answer as a provider that behaves).
    script: Callable[[Request], tuple[int, dict[str, Any]] | None] | None = None

    def answer(self, request: Request) -> tuple[int, dict[str, Any]]:
        if self.script is not None:
            scripted = self.script(request)
            if scripted is not None:
                return scripted
        if request.method == "GET" and request.path.rstrip("/").endswith("/models"):
            return 200, {"object": "list", "data": [{"id": "gpt-4o", "object": "model"}]}
        if request.path.endswith("/chat/completions"):
            return 200, _openai(request.body)
        if request.path.endswith("/v1/messages"):
            return 200, _anthropic(request.body)
        return 404, {"error": {"message": f"no route {request.path}", "type": "not_found"}}


def _schema_name(body: dict[str, Any]) -> str | None:
    response_format = body.get("response_format") or {}
    return (response_format.get("json_schema") or {}).get("name")


def _openai(body: dict[str, Any]) -> dict[str, Any]:
    name = _schema_name(body)
    if name == "Plan":
        text = PLAN_TEXT if "tables" in json.dumps(body.get("response_format")) else ""
        text = text or json.dumps(GENERIC_PLAN)
    elif name == "ForgeOutput":
        text = CONTRACT_TEXT
    else:
        text = "ok"
    return {
        "id": "chatcmpl-docs",
        "object": "chat.completion",
        "model": body.get("model", "gpt-4o"),
        "choices": [
            {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}
        ],
        "usage": {"prompt_tokens": 100, "completion_tokens": 50, "total_tokens": 150},
    }


def _anthropic(body: dict[str, Any]) -> dict[str, Any]:
    forced = (body.get("tool_choice") or {}).get("name")
    content: list[dict[str, Any]]
    if forced:
        content = [{"type": "tool_use", "id": "toolu_docs", "name": forced, "input": GENERIC_PLAN}]
        stop = "tool_use"
    else:
        content, stop = [{"type": "text", "text": "ok"}], "end_turn"
    return {
        "id": "msg_docs",
        "type": "message",
        "role": "assistant",
        "model": body.get("model", "claude-sonnet-4-6"),
        "content": content,
        "stop_reason": stop,
        "usage": {"input_tokens": 100, "output_tokens": 50},
    }


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def _serve(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            body = {"_raw": raw.decode("utf-8", "replace")}
        request = Request(
            self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body
        )
        with self.server.model.lock:
            self.server.model.requests.append(request)
        status, payload = self.server.model.answer(request)
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = _serve
    do_POST = _serve

    def log_message(self, format: str, *args: object) -> None:
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, model: Model) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.model = model

    def handle_error(self, request: object, client_address: object) -> None:
        # A client that went away mid-answer (Ctrl-C tests, a cut deadline) is the
        # scenario, not a server fault: no traceback in the test output for it.
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)  # type: ignore[arg-type]


@contextmanager
def model_server() -> Iterator[tuple[str, Model]]:
    """``(base URL without a path, the model)`` of a server on 127.0.0.1."""
    model = Model()
    server = _Server(model)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.daemon = True
    thread.start()
    host, port = server.server_address[:2]
    try:
        yield f"http://{host!s}:{port}", model
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
