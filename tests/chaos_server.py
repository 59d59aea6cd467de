"""A chat-completions server on 127.0.0.1 that fails on a seeded schedule.

:class:`ChaosServer` speaks just enough HTTP/1.1 for httpx (request line,
headers, a ``content-length`` body; no chunked requests) and answers
``POST /v1/chat/completions`` in OpenAI's shape. Before answering, it draws a
fault for the request from ``random.Random(seed)`` (or takes the next one
from ``script``): a 429 with ``retry-after`` or ``retry-after-ms``, a 5xx,
Anthropic's 529, an HTML gateway page, a reset before or during the answer, a
body cut short of its ``content-length``, headers held past the client's
read timeout, or a correct answer.

Connections are kept alive after every complete answer (the client's pool
reuses them) and closed only by the faults that break them, by a request
carrying ``connection: close``, or when the server stops; an idle connection
is never closed under the client.

``bursts`` adds outages to the draw: stretches of time (each an offset
after the server's first request and a length) in which every request is
answered 503, whatever was drawn for it, as a provider in an incident would.

It runs on its own event loop in a background thread, so the code under test
can use any loop (or none). Every request is recorded: arrival time, the
``x-key`` header (which cooldown key sent it), the ``x-call`` header (which
call of the test sent it), the fault served, whether a burst served it and,
for a 429, when it was sent and the window it asked for.

``models`` maps a model name to the fault every request for that model meets
(a persistent fault, or "ok" for a healthy model), or to a list of faults met
in turn (its last one for good), whatever the draw says, which it does not
advance; the map can change while the server runs (a model down for a while,
then healthy). A request with ``"stream": true`` is answered
as an OpenAI chat-completions event stream (a few text deltas, a usage chunk,
``[DONE]``) where an answer would be; ``cut_mid_stream`` sends half of it. The
stream faults meet a request for a whole answer as its own kind of the same
break: ``cut_mid_stream`` sends half the body then FIN, ``stall_mid_stream``
half the body then silence, ``malformed_mid_stream`` a 200 of the wrong shape;
``no_end_marker`` answers it whole.

The sequence of faults is fixed by the seed; which call meets which fault
depends on the order requests arrive in, which concurrency does not fix.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Final

__all__ = [
    "DEFAULT_WEIGHTS",
    "FAULTS",
    "MODEL_FAULTS",
    "ChaosServer",
    "Request",
    "chaos_server",
    "stream_text",
]

#: Every fault the server can serve, and "ok" (a correct answer).
FAULTS: Final = (
    "ok",
    "429_retry_after",  # 429, retry-after: 0.1..0.2 (seconds, as a decimal)
    "429_retry_after_ms",  # 429, retry-after-ms: 100..200
    "500",
    "502",
    "503",
    "529_overloaded",  # Anthropic's overloaded_error body
    "html_502",  # a gateway's HTML page instead of JSON
    "reset_before_response",  # RST after reading the request, nothing sent
    "reset_during_body",  # headers and half the body, then RST
    "truncated_json",  # a correct content-length, half the JSON, then FIN
    "slow_headers",  # nothing until the client gives up (or ``stall`` s)
)

#: Faults a model can be pinned to (``models=``), beside :data:`FAULTS`; never drawn.
MODEL_FAULTS: Final = (
    "context_overflow",  # 400, OpenAI's context_length_exceeded
    "cut_mid_stream",  # a stream's head and its first deltas, then FIN before [DONE]
    "429_quota",  # 429, OpenAI's insufficient_quota: no wait will help
    "401",  # OpenAI's invalid_api_key
    "stall_mid_stream",  # a stream's first deltas, then silence until the client hangs up
    "no_prefill",  # "ok", but a 400 for a conversation that ends with an assistant message
    "malformed_mid_stream",  # a stream's first deltas, then an event of the wrong shape
    "429_no_retry_after",  # 429 rate_limit_exceeded with no retry-after of any kind
    "429_retry_after_long",  # 429, retry-after: 120 (past the client's move-on threshold)
    "slow_first_token",  # a correct answer, ``slow`` s late (a stream: its head at once)
    "no_end_marker",  # a stream's deltas, whole and framed, with no finish_reason or [DONE]
    "content_filter",  # 400, OpenAI's content_policy_violation (the safety system)
)

#: The suite's mix: half the requests are answered, the rest fail one way or another.
DEFAULT_WEIGHTS: Final[Mapping[str, float]] = {
    "ok": 50,
    "429_retry_after": 8,
    "429_retry_after_ms": 7,
    "500": 4,
    "502": 4,
    "503": 4,
    "529_overloaded": 4,
    "html_502": 4,
    "reset_before_response": 4,
    "reset_during_body": 4,
    "truncated_json": 4,
    "slow_headers": 3,
}

_REASONS: Final = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    411: "Length Required",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
    529: "Overloaded",
}

_HTML_502: Final = (
    b"<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n"
    b"<center><h1>502 Bad Gateway</h1></center>\r\n<hr><center>nginx</center>\r\n"
    b"</body>\r\n</html>\r\n"
)


@dataclass
class Request:
    """One request as the server saw it, and what it did about it."""

    index: int  # arrival order on this server, from 0
    at: float  # time.time() once the request was read
    key: str | None  # the x-key header
    path: str
    fault: str
    connection: int  # which connection carried it
    server: str = ""  # the name of the server that saw it
    burst: bool = False  # served a 503 because it arrived inside a burst
    call: int | None = None  # the x-call header: which call of the test sent it
    sent_at: float | None = None  # time.time() just before the answer (if any) was written
    dispatched: float | None = None  # the x-sent-at header: when the client decided to send
    window: float | None = None  # for a 429: the seconds it asked the client to wait
    model: str | None = None  # the request body's model
    stream: bool = False  # the request asked for an event stream
    last_role: str | None = None  # the role of the request's last message


def _answer(index: int, model: str | None = None) -> bytes:
    content = json.dumps({"answer": "ok", "request": index})
    return json.dumps(
        {
            "id": f"chatcmpl-chaos-{index}",
            "object": "chat.completion",
            "model": model or "chaos-model",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19},
        }
    ).encode()


def stream_text(model: str) -> str:
    """The whole text of a streamed answer from ``model``."""
    return f"Hello from {model}, in four parts."


def _stream_body(index: int, model: str | None, *, end: bool = True) -> bytes:
    """A whole OpenAI chat-completions event stream: deltas, finish, usage, [DONE]; without
    ``end``, the deltas and usage only (no finish_reason, no [DONE])."""
    name = model or "chaos-model"
    text = stream_text(name)
    quarter = -(-len(text) // 4)
    deltas = [text[i : i + quarter] for i in range(0, len(text), quarter)]
    chunks: list[dict[str, object]] = [
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": delta}}]}
        for delta in deltas
    ]
    if end:
        chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    chunks.append({"choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 8}})
    lines = [
        "data: "
        + json.dumps(
            {"id": f"chatcmpl-chaos-{index}", "object": "chat.completion.chunk", "model": name}
            | chunk
        )
        + "\n\n"
        for chunk in chunks
    ]
    return ("".join(lines) + ("data: [DONE]\n\n" if end else "")).encode()


def _json_error(message: str, kind: str, code: str | None = None) -> bytes:
    return json.dumps({"error": {"message": message, "type": kind, "code": code}}).encode()


def _head(status: int, headers: Mapping[str, str], length: int, keep_alive: bool) -> bytes:
    lines = [
        f"HTTP/1.1 {status} {_REASONS.get(status, 'Unknown')}",
        f"content-length: {length}",
        f"connection: {'keep-alive' if keep_alive else 'close'}",
    ]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _linger_zero(writer: asyncio.StreamWriter) -> None:
    """Make the coming close send RST instead of FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


class ChaosServer:
    """A misbehaving chat-completions server; use :func:`chaos_server` to run one.

    ``weights`` maps fault names (:data:`FAULTS`) to relative weights;
    ``script`` overrides the draw for the first requests, in arrival order
    (then the draw resumes). ``bursts`` are ``(offset, seconds)`` pairs: from
    ``offset`` s after the first request, for ``seconds`` s, every request
    is answered 503 (the draw still advances, so the rest of the schedule
    does not move). ``stall`` bounds how long ``slow_headers`` holds a
    connection whose client has not hung up: set it above the client's read
    timeout. ``latency`` delays every answer (and every fault) by that many
    seconds, as a slow model would. ``name`` labels the requests
    (``Request.server``). ``slow`` is how late ``slow_first_token`` answers.
    ``retry_after`` is the window every 429 asks for, in
    seconds (None: 0.15 for a pinned model, drawn from 0.1..0.2 otherwise).
    """

    def __init__(
        self,
        seed: int = 0,
        *,
        weights: Mapping[str, float] | None = None,
        script: Sequence[str] = (),
        stall: float = 1.5,
        bursts: Sequence[tuple[float, float]] = (),
        latency: float = 0.0,
        name: str = "",
        models: Mapping[str, str | Sequence[str]] | None = None,
        slow: float = 0.1,
        retry_after: float | None = None,
    ) -> None:
        weights = dict(DEFAULT_WEIGHTS if weights is None else weights)
        self.models: dict[str, str | list[str]] = {
            name: faults if isinstance(faults, str) else list(faults)
            for name, faults in (models or {}).items()
        }
        pinned = {f for v in self.models.values() for f in ([v] if isinstance(v, str) else v)}
        unknown = (set(weights) | set(script)) - set(FAULTS)
        unknown |= pinned - {*FAULTS, *MODEL_FAULTS}
        if unknown:
            raise ValueError(f"unknown faults {sorted(unknown)}; known: {', '.join(FAULTS)}")
        if any(not (offset >= 0 and seconds > 0) for offset, seconds in bursts):
            raise ValueError(f"a burst is (offset >= 0, seconds > 0), not {list(bursts)}")
        self.seed = seed
        self.name = name
        self.bursts = tuple(bursts)
        self.first_at: float | None = None  # time.time() of the first request
        self._kinds = [k for k, w in weights.items() if w > 0]
        self._weights = [weights[k] for k in self._kinds]
        self._script = list(script)
        self._rng = random.Random(seed)  # noqa: S311 - a test schedule, not cryptography
        self.stall = stall
        self.latency = latency
        self.slow = slow
        self.retry_after = retry_after
        self.requests: list[Request] = []
        self.errors: list[BaseException] = []  # the server's own failures: a test asserts none
        self._lock = threading.Lock()
        self._connections = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None
        self.port = 0

    @property
    def base_url(self) -> str:
        """The OpenAI-style base URL (``.../v1``)."""
        return f"http://127.0.0.1:{self.port}/v1"

    def snapshot(self) -> list[Request]:
        with self._lock:
            return list(self.requests)

    def served(self) -> Counter[str]:
        """How many requests met each fault (a burst's 503s count as ``503``)."""
        return Counter(r.fault for r in self.snapshot())

    def burst_windows(self) -> list[tuple[float, float]]:
        """Each burst's ``(start, end)`` in ``time.time()`` (none before the first request)."""
        first = self.first_at
        if first is None:
            return []
        return [(first + offset, first + offset + seconds) for offset, seconds in self.bursts]

    def _in_burst(self, now: float) -> bool:
        return any(start <= now < end for start, end in self.burst_windows())

    # -- lifecycle -----------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._run, name=f"chaos-server-{self.name or self.seed}", daemon=True
        )
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the chaos server did not start within 10 s")
        if self._failure is not None:
            raise RuntimeError("the chaos server failed to start") from self._failure

    def stop(self) -> None:
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None:
            with contextlib.suppress(RuntimeError):  # the loop already ended
                loop.call_soon_threadsafe(stop.set)
        if self._thread is not None:
            self._thread.join(timeout=10)
            if self._thread.is_alive():
                raise RuntimeError("the chaos server did not stop within 10 s")
            self._thread = None

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # reported to start(), or lost with the thread
            self._failure = exc
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        handlers: set[asyncio.Task[None]] = set()
        writers: set[asyncio.StreamWriter] = set()

        async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            assert task is not None
            handlers.add(task)
            writers.add(writer)
            try:
                await self._connection(reader, writer)
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
                pass  # the client went away: nothing to answer
            except Exception as exc:  # a bug here must fail the test, not vanish
                with self._lock:
                    self.errors.append(exc)
            finally:
                writers.discard(writer)
                handlers.discard(task)
                writer.close()

        server = await asyncio.start_server(on_connect, "127.0.0.1", 0, backlog=512)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            server.close()
            await server.wait_closed()
            # Hang up on every client; each handler then ends on its own (EOF).
            for writer in list(writers):
                writer.transport.abort()
            pending = list(handlers)
            if pending:
                _, late = await asyncio.wait(pending, timeout=5)
                for task in late:
                    task.cancel()
                await asyncio.gather(*late, return_exceptions=True)
            await asyncio.sleep(0)  # let the transports' close callbacks run

    # -- one connection ----------------------------------------------------------------

    def _draw(self) -> tuple[str, float]:
        """The next fault, and a retry window in case it is a 429 (both from the seed)."""
        fault = (
            self._script.pop(0)
            if self._script
            else self._rng.choices(self._kinds, self._weights)[0]
        )
        window = round(self._rng.uniform(0.1, 0.2), 3)
        return fault, window

    def _pinned(self, model: str | None) -> str | None:
        """The fault ``models`` pins this request to (None: none, draw one)."""
        with self._lock:
            faults = self.models.get(model or "")
            if faults is None or isinstance(faults, str):
                return faults
            return faults.pop(0) if len(faults) > 1 else faults[0]

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with self._lock:
            self._connections += 1
            connection = self._connections
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                return  # the client closed an idle connection
            except asyncio.LimitOverrunError:
                writer.write(_head(431, {}, 0, keep_alive=False))
                await writer.drain()
                return
            lines = head.decode("latin-1").split("\r\n")
            method, _, rest = lines[0].partition(" ")
            path = rest.rpartition(" ")[0] or rest
            headers = {}
            for line in lines[1:]:
                name, sep, value = line.partition(":")
                if sep:
                    headers[name.strip().lower()] = value.strip()
            if "chunked" in headers.get("transfer-encoding", "").lower():
                writer.write(_head(411, {}, 0, keep_alive=False))
                await writer.drain()
                return
            payload = await reader.readexactly(int(headers.get("content-length") or 0))
            model, wants_stream, last_role = _model_and_stream(payload)
            keep_alive = headers.get("connection", "").lower() != "close"

            if method != "POST" or path != "/v1/chat/completions":
                body = _json_error(f"no route for {method} {path}", "invalid_request_error")
                writer.write(_head(404, {"content-type": "application/json"}, len(body), False))
                writer.write(body)
                await writer.drain()
                return

            pinned = self._pinned(model)
            if pinned is not None:
                fault, window = pinned, 0.15
            else:
                fault, window = self._draw()
            if self.retry_after is not None:
                window = self.retry_after
            now = time.time()
            with self._lock:
                if self.first_at is None:
                    self.first_at = now
                burst = self._in_burst(now)
                record = Request(
                    len(self.requests),
                    now,
                    headers.get("x-key"),
                    path,
                    "503" if burst else fault,
                    connection,
                    server=self.name,
                    burst=burst,
                    model=model,
                    stream=wants_stream,
                    last_role=last_role,
                )
                self.requests.append(record)
            with contextlib.suppress(ValueError):
                record.dispatched = float(headers.get("x-sent-at", ""))
            with contextlib.suppress(ValueError):
                record.call = int(headers.get("x-call", ""))
            fault = record.fault
            if not await self._serve(fault, window, record, writer, reader, keep_alive):
                return

    async def _serve(
        self,
        fault: str,
        window: float,
        record: Request,
        writer: asyncio.StreamWriter,
        reader: asyncio.StreamReader,
        keep_alive: bool,
    ) -> bool:
        """Serve one fault; True when the connection can carry another request."""
        json_type = {"content-type": "application/json"}
        if self.latency:
            await asyncio.sleep(self.latency)  # noqa: real-sleep - a model takes its time
        if fault == "reset_before_response":
            _linger_zero(writer)
            writer.transport.abort()
            return False
        if fault == "slow_headers":
            # Hold the answer until the client hangs up (its read timeout), or `stall` s.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(reader.read(1), self.stall)  # noqa: real-sleep - headers late
            return False
        if fault == "no_prefill":
            fault = "ok" if record.last_role != "assistant" else "no_prefill"
        if fault == "slow_first_token" and not record.stream:
            # A whole answer's head comes once the model has written all of it.
            await asyncio.sleep(self.slow)  # noqa: real-sleep - a model thinking
            fault = "ok"
        if fault == "no_end_marker" and not record.stream:
            fault = "ok"
        if record.stream and fault in {
            "ok",
            "cut_mid_stream",
            "stall_mid_stream",
            "malformed_mid_stream",
            "slow_first_token",
            "no_end_marker",
        }:
            body = _stream_body(record.index, record.model, end=fault != "no_end_marker")
            sse = {"content-type": "text/event-stream"}
            record.sent_at = time.time()
            if fault == "ok":
                writer.write(_head(200, sse, len(body), keep_alive) + body)
                await writer.drain()
                return keep_alive
            if fault == "slow_first_token":  # the head at once, the first event late
                writer.write(_head(200, sse, len(body), keep_alive))
                await writer.drain()
                await asyncio.sleep(self.slow)  # noqa: real-sleep - a model thinking
                writer.write(body)
                await writer.drain()
                return keep_alive
            if fault == "no_end_marker":  # every delta, framed whole, then FIN
                writer.write(_head(200, sse, len(body), keep_alive=False) + body)
                await writer.drain()
                return False
            # Half the events (past the first delta), then FIN (the client reads them, then
            # EOF), or silence until the client hangs up (or ``stall`` s).
            cut = body.index(b"\n\n", len(body) // 2) + 2
            if fault == "malformed_mid_stream":  # the rest of the stream follows it, whole
                bad = b'data: {"choices": "not a list"}\n\n'
                body = body[:cut] + bad + body[cut:]
                writer.write(_head(200, sse, len(body), keep_alive=False) + body)
                await writer.drain()
                return False
            writer.write(_head(200, sse, len(body), keep_alive=True) + body[:cut])
            await writer.drain()
            if fault == "stall_mid_stream":
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(reader.read(1), self.stall)  # noqa: real-sleep - a stall
            writer.close()
            return False
        if fault in {"reset_during_body", "truncated_json", "cut_mid_stream", "stall_mid_stream"}:
            body = _answer(record.index, record.model if fault.endswith("_stream") else None)
            record.sent_at = time.time()
            writer.write(_head(200, json_type, len(body), keep_alive=True) + body[: len(body) // 2])
            await writer.drain()
            if fault == "stall_mid_stream":  # half the answer, then silence
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(reader.read(1), self.stall)  # noqa: real-sleep - a stall
                writer.close()
            elif fault == "reset_during_body":
                # Let the client start reading the body, so the RST cuts it mid-way.
                await asyncio.sleep(0.005)  # noqa: real-sleep - the client reads the headers
                _linger_zero(writer)
                writer.transport.abort()
            else:
                writer.close()
            return False

        status, headers, body = 200, dict(json_type), b""
        if fault == "ok":
            body = _answer(record.index, record.model)
        elif fault == "malformed_mid_stream":  # a whole answer of the wrong shape
            body = json.dumps({"id": f"chatcmpl-chaos-{record.index}", "choices": "no"}).encode()
        elif fault == "429_quota":
            status = 429
            body = _json_error(
                "You exceeded your current quota, please check your plan and billing details.",
                "insufficient_quota",
                "insufficient_quota",
            )
        elif fault == "401":
            status = 401
            body = _json_error(
                "Incorrect API key provided: sk-chaos. You can find your API key at "
                "https://platform.openai.com/account/api-keys.",
                "invalid_request_error",
                "invalid_api_key",
            )
        elif fault == "no_prefill":
            status = 400
            body = _json_error(
                "This model does not support assistant message prefill. The conversation must "
                "end with a user message.",
                "invalid_request_error",
            )
        elif fault == "context_overflow":
            status = 400
            body = _json_error(
                "This model's maximum context length is 8192 tokens. However, your messages "
                "resulted in 9000 tokens. Please reduce the length of the messages.",
                "invalid_request_error",
                "context_length_exceeded",
            )
        elif fault == "429_retry_after":
            status, record.window = 429, window
            headers["retry-after"] = f"{window:g}"
            body = _json_error(
                "Rate limit reached for requests per min. Please slow down.",
                "requests",
                "rate_limit_exceeded",
            )
        elif fault in {"429_no_retry_after", "429_retry_after_long"}:
            status = 429
            if fault == "429_retry_after_long":
                status, record.window = 429, 120.0
                headers["retry-after"] = "120"
            body = _json_error(
                "Rate limit reached for requests per min. Please slow down.",
                "requests",
                "rate_limit_exceeded",
            )
        elif fault == "content_filter":
            status = 400
            body = _json_error(
                "Your request was rejected as a result of our safety system. Your prompt may "
                "contain text that is not allowed by our safety system.",
                "invalid_request_error",
                "content_policy_violation",
            )
        elif fault == "429_retry_after_ms":
            status, record.window = 429, window
            headers["retry-after-ms"] = str(round(window * 1000))
            body = _json_error(
                "Rate limit reached for requests per min. Please slow down.",
                "requests",
                "rate_limit_exceeded",
            )
        elif fault in {"500", "502", "503"}:
            status = int(fault)
            body = _json_error(f"upstream answered {status}", "server_error")
        elif fault == "529_overloaded":
            status = 529
            body = json.dumps(
                {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
            ).encode()
        elif fault == "html_502":
            status, headers, body = 502, {"content-type": "text/html"}, _HTML_502
        else:  # pragma: no cover - FAULTS and this function disagree
            raise AssertionError(f"no way to serve {fault!r}")
        # Stamped before writing: the client cannot have read the answer any earlier.
        record.sent_at = time.time()
        writer.write(_head(status, headers, len(body), keep_alive) + body)
        await writer.drain()
        return keep_alive


def _model_and_stream(payload: bytes) -> tuple[str | None, bool, str | None]:
    """The request body's ``model``, ``stream`` and its last message's role (None, False,
    None for a body that has none)."""
    try:
        data = json.loads(payload)
    except ValueError:
        return None, False, None
    if not isinstance(data, dict):
        return None, False, None
    model = data.get("model")
    messages = data.get("messages")
    last = messages[-1] if isinstance(messages, list) and messages else None
    role = last.get("role") if isinstance(last, dict) else None
    return (
        model if isinstance(model, str) else None,
        data.get("stream") is True,
        role if isinstance(role, str) else None,
    )


@contextmanager
def chaos_server(
    seed: int = 0,
    *,
    weights: Mapping[str, float] | None = None,
    script: Sequence[str] = (),
    stall: float = 1.5,
    bursts: Sequence[tuple[float, float]] = (),
    latency: float = 0.0,
    name: str = "",
    models: Mapping[str, str | Sequence[str]] | None = None,
    slow: float = 0.1,
    retry_after: float | None = None,
) -> Iterator[ChaosServer]:
    """Run a :class:`ChaosServer` for the ``with`` block; it stops, sockets closed, after."""
    server = ChaosServer(
        seed,
        weights=weights,
        script=script,
        stall=stall,
        bursts=bursts,
        latency=latency,
        name=name,
        models=models,
        slow=slow,
        retry_after=retry_after,
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()
