"""A tiny OpenAI-style server on loopback, to try ``fluid batch`` without a provider.

``python -m fluid_build.fakeserver`` serves ``http://127.0.0.1:8000/v1`` until
Ctrl-C: ``POST /v1/chat/completions`` answers each request with its last user
message (``echo: ...``) and a token count, ``GET /v1/models`` lists the one
model, ``echo``, with its window (as vLLM does, so the client's pre-flight knows
it). It listens on 127.0.0.1 only, keeps nothing, needs no key (a key sent is
ignored) and does not stream. ``--fail-every N`` answers every Nth chat request
with a 500, to see a retry. See docs/batch.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import threading
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Final

__all__ = ["HOST", "MODEL", "FakeServer", "main"]

#: Loopback only: the server answers anyone who can connect, so nobody else can.
HOST: Final = "127.0.0.1"
MODEL: Final = "echo"
WINDOW: Final = 32_768
#: The most of a request body read; a larger one is refused with 413.
MAX_BODY: Final = 1_000_000


def _words(text: str) -> int:
    return max(1, len(text.split()))


def _last_user_text(body: Any) -> str:
    messages = body.get("messages") if isinstance(body, dict) else None
    for message in reversed(messages if isinstance(messages, list) else []):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):  # content parts: the text ones
                return " ".join(
                    str(p.get("text", "")) for p in content if isinstance(p, dict)
                ).strip()
    return ""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: FakeServer

    def _send(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode("utf-8")
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, message: str, kind: str) -> None:
        self._send(status, {"error": {"message": message, "type": kind, "code": None}})

    def do_GET(self) -> None:
        if self.path.rstrip("/") == "/v1/models":
            model = {"id": MODEL, "object": "model", "max_model_len": WINDOW}
            self._send(200, {"object": "list", "data": [model]})
            return
        self._error(404, f"no route {self.path}: try /v1/models", "not_found")

    def do_POST(self) -> None:
        try:
            length = int(self.headers.get("content-length") or 0)
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_BODY:
            self.close_connection = True
            self._error(413, f"the body must be 0 to {MAX_BODY} bytes", "invalid_request_error")
            return
        raw = self.rfile.read(length)
        if self.path.rstrip("/") != "/v1/chat/completions":
            self._error(404, f"no route {self.path}: try /v1/chat/completions", "not_found")
            return
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            self._error(400, "the body is not JSON", "invalid_request_error")
            return
        if isinstance(body, dict) and body.get("stream"):
            self._error(400, "this fake server does not stream", "invalid_request_error")
            return
        if self.server.should_fail():
            self._error(500, f"failing every {self.server.fail_every}th request", "server_error")
            return
        prompt = _last_user_text(body)
        text = f"echo: {prompt}"
        model = body.get("model") if isinstance(body, dict) else None
        usage = {"prompt_tokens": _words(prompt), "completion_tokens": _words(text)}
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        self._send(
            200,
            {
                "id": f"chatcmpl-fake-{self.server.count}",
                "object": "chat.completion",
                "model": model if isinstance(model, str) else MODEL,
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "stop",
                        "message": {"role": "assistant", "content": text},
                    }
                ],
                "usage": usage,
            },
        )

    def log_message(self, format: str, *args: object) -> None:
        if self.server.verbose:
            sys.stderr.write(f"fakeserver: {self.command} {self.path}\n")


class FakeServer(ThreadingHTTPServer):
    """The server; ``port=0`` takes a free port (see :attr:`base_url`)."""

    daemon_threads = True

    def __init__(self, port: int = 8000, *, fail_every: int = 0, verbose: bool = False) -> None:
        super().__init__((HOST, port), _Handler)
        self.fail_every = fail_every
        self.verbose = verbose
        self.count = 0
        self._lock = threading.Lock()

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.server_address[1]}/v1"

    def should_fail(self) -> bool:
        with self._lock:
            self.count += 1
            return self.fail_every > 0 and self.count % self.fail_every == 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m fluid_build.fakeserver",
        description="An OpenAI-style server on 127.0.0.1 that echoes each prompt.",
    )
    parser.add_argument("--port", type=int, default=8000, help="default: 8000 (0: any free)")
    parser.add_argument(
        "--fail-every", type=int, default=0, metavar="N", help="answer every Nth request 500"
    )
    parser.add_argument("--verbose", action="store_true", help="print each request")
    args = parser.parse_args(argv)
    if not 0 <= args.port <= 65535 or args.fail_every < 0:
        parser.error("--port is 0 to 65535, --fail-every 0 or more")
    try:
        server = FakeServer(args.port, fail_every=args.fail_every, verbose=args.verbose)
    except OSError as exc:
        print(f"fakeserver: cannot listen on {HOST}:{args.port} ({exc.strerror})", file=sys.stderr)
        return 1
    with server:
        print(f"fakeserver: serving {server.base_url} (model {MODEL}); Ctrl-C stops it", flush=True)
        with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C is how it is meant to stop
            server.serve_forever(poll_interval=0.2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
