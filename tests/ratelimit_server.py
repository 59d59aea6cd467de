"""A loopback provider that enforces requests and tokens per window and announces them.

Each window (60 s by default, shorter in benchmarks) starts at the first
request after the last one ended. A request costs one request and its body's
bytes / 4 plus its ``max_tokens`` (as OpenAI counts at admission); one that
does not fit is answered 429 with ``Retry-After`` / ``retry-after-ms`` and not
counted. Every answer announces the budget as OpenAI does (``x-ratelimit-*``,
resets as ``1.25s``) or, with ``style="anthropic"``, as Anthropic does
(``anthropic-ratelimit-*``, resets as RFC 3339 times). Given ``tag_of``, the
provider also keeps a log of every answer (when, its status, the tag
``tag_of`` finds in the body: which host of a fleet sent it) and of when
each window began.

:class:`RestartableRedis` is the Redis a fleet of processes shares in
benchmarks/bench_ratelimit.py ``--fleet`` and tests/test_fleet_ratelimit.py: a
real redis-server on a fixed loopback port, which can be killed and started
again there (its state lost, as a restart without persistence loses it).
"""

from __future__ import annotations

import json
import math
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Literal, NamedTuple

from tests.redis_server import _free_port, redis_binary

Style = Literal["openai", "anthropic"]


class Answer(NamedTuple):
    """One answer in the log: ``clock()`` when admitted, its status, the request's tag."""

    at: float
    status: int
    tag: str


def duration(seconds: float) -> str:
    """``seconds`` as OpenAI writes a reset (``20ms``, ``1.25s``, ``6m0s``), rounded up."""
    millis = math.ceil(max(seconds, 0.0) * 1000)
    if millis < 1000:
        return f"{millis}ms"
    minutes, millis = divmod(millis, 60_000)
    text = f"{millis / 1000:g}s"
    return f"{minutes}m{text}" if minutes else text


class RateLimitedProvider:
    """The budget and what it answered; the HTTP handler only calls :meth:`admit`."""

    def __init__(
        self,
        requests: int,
        tokens: int,
        *,
        window: float = 60.0,
        style: Style = "openai",
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        tag_of: Callable[[bytes], str] | None = None,
    ) -> None:
        self.requests, self.tokens, self.window, self.style = requests, tokens, window, style
        self.clock, self.wall = clock, wall
        self.tag_of = tag_of
        #: With ``tag_of``: every answer, and the ``clock()`` each window began at.
        self.log: list[Answer] = []
        self.windows: list[float] = []
        self._lock = threading.Lock()
        self._ends = -math.inf
        self._used_requests = 0
        self._used_tokens = 0
        self.ok = 0
        self.refused = 0

    def cost(self, body: bytes) -> int:
        try:
            asked = json.loads(body or b"{}").get("max_tokens", 16)
        except (ValueError, AttributeError):
            asked = 16
        return math.ceil(len(body) / 4) + (asked if isinstance(asked, int) else 16)

    def admit(self, body: bytes) -> tuple[int, dict[str, str], int]:
        """``(status, headers, tokens charged)`` for one request."""
        cost = self.cost(body)
        with self._lock:
            now = self.clock()
            if now >= self._ends:
                self._ends = now + self.window
                self._used_requests = self._used_tokens = 0
                if self.tag_of is not None:
                    self.windows.append(now)
            fits = (
                self._used_requests + 1 <= self.requests and self._used_tokens + cost <= self.tokens
            )
            if fits:
                self._used_requests += 1
                self._used_tokens += cost
                self.ok += 1
            else:
                self.refused += 1
            if self.tag_of is not None:
                self.log.append(Answer(now, 200 if fits else 429, self.tag_of(body)))
            reset = self._ends - now
            headers = self._announce(reset)
        if not fits:
            headers["retry-after"] = str(math.ceil(reset))
            headers["retry-after-ms"] = str(math.ceil(reset * 1000))
            return 429, headers, 0
        return 200, headers, cost

    def _announce(self, reset: float) -> dict[str, str]:
        left_requests = self.requests - self._used_requests
        left_tokens = self.tokens - self._used_tokens
        if self.style == "openai":
            return {
                "x-ratelimit-limit-requests": str(self.requests),
                "x-ratelimit-limit-tokens": str(self.tokens),
                "x-ratelimit-remaining-requests": str(left_requests),
                "x-ratelimit-remaining-tokens": str(left_tokens),
                "x-ratelimit-reset-requests": duration(reset),
                "x-ratelimit-reset-tokens": duration(reset),
            }
        at = datetime.fromtimestamp(math.ceil((self.wall() + reset) * 1000) / 1000, UTC)
        stamp = at.isoformat(timespec="milliseconds").replace("+00:00", "Z")
        headers: dict[str, str] = {}
        for kind, size, left in (
            ("requests", self.requests, left_requests),
            ("tokens", self.tokens, left_tokens),
            ("input-tokens", self.tokens, left_tokens),
        ):
            headers[f"anthropic-ratelimit-{kind}-limit"] = str(size)
            headers[f"anthropic-ratelimit-{kind}-remaining"] = str(left)
            headers[f"anthropic-ratelimit-{kind}-reset"] = stamp
        return headers

    def answer(self, tokens: int) -> bytes:
        if self.style == "openai":
            body = {
                "id": "chatcmpl-ratelimit",
                "object": "chat.completion",
                "model": "gpt-4o-mini",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "ok"},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": tokens, "completion_tokens": 0, "total_tokens": tokens},
            }
        else:
            body = {
                "id": "msg_ratelimit",
                "type": "message",
                "role": "assistant",
                "model": "claude-3-5-haiku-latest",
                "content": [{"type": "text", "text": "ok"}],
                "stop_reason": "end_turn",
                "usage": {"input_tokens": tokens, "output_tokens": 0},
            }
        return json.dumps(body).encode()


def _handler(provider: RateLimitedProvider) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            status, headers, tokens = provider.admit(body)
            if status == 200:
                payload = provider.answer(tokens)
            else:
                payload = b'{"error": {"message": "Rate limit reached", "type": "requests"}}'
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: object) -> None:
            return

    return Handler


@contextmanager
def serving(provider: RateLimitedProvider) -> Iterator[str]:
    """Serve ``provider`` on a free loopback port; yield its base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(provider))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class RestartableRedis:
    """A redis-server on a fixed loopback port that a test can kill and start again."""

    def __init__(self, workdir: Path) -> None:
        binary = redis_binary()
        if binary is None:
            raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
        self.binary, self.workdir, self.port = binary, workdir, _free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> float:
        """Start redis-server; the ``time.monotonic()`` at which it first answered."""
        import redis

        self.process = subprocess.Popen(
            [
                *(self.binary, "--port", str(self.port), "--bind", "127.0.0.1"),
                *("--save", "", "--appendonly", "no", "--dir", str(self.workdir)),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 10.0
        try:
            with redis.Redis(port=self.port, socket_connect_timeout=0.2) as probe:
                while True:
                    try:
                        if probe.ping():
                            return time.monotonic()
                    except redis.ConnectionError:
                        pass
                    if self.process.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"redis-server did not start ({self.process.poll()})")
                    threading.Event().wait(0.01)  # polling a real server's start, bounded
        except BaseException:
            self.kill()  # never left running behind a failed start
            raise

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Stop it (SIGKILL by default: no goodbye to the clients) and wait for the exit."""
        if self.process is not None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
            self.process = None

    def clients(self) -> dict[str, str]:
        """Each named connection's last command (``client|setname`` right after connecting)."""
        import redis

        with redis.Redis(port=self.port, socket_timeout=1.0) as admin:
            return {
                entry["name"]: entry["cmd"] for entry in admin.client_list() if entry.get("name")
            }
