"""One deadline and one size limit per call, kept whatever the server does, on real sockets.

Each hostile server runs on loopback: a body dripped a byte at a time, a
stream dripped an event at a time, a huge body, gzip and deflate bombs (one
layer, or stacked), encodings no bounded inflater undoes, an endless SSE
stream, answers that parse but do not fit. Each call ends in its
typed error within the deadline plus a small margin; memory stays bounded
(measured in a subprocess).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from fluid_build.copilot import LLMClient
from fluid_build.copilot.agents.errors import (
    AgentExecutionError,
    ProviderError,
    ProviderTimeoutError,
)
from fluid_build.copilot.call.envelope import RetryEnvelope, RetryPolicy
from fluid_build.copilot.call.wire import Limits
from tests import loopback
from tests.bombs import GZIP, ZLIB, gzip_of_gzip, zeros_packed

ROOT = Path(__file__).resolve().parents[1]
MARGIN = 1.5  # the bound: deadline + 1.5 s at most
OK = json.dumps(
    {"choices": [{"message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}]}
).encode()


def _send(conn: socket.socket, data: bytes) -> bool:
    try:
        conn.sendall(data)
    except OSError:
        return False
    return True


def _head(status: int = 200, headers: dict[str, str] | None = None) -> bytes:
    lines = [f"HTTP/1.1 {status} X"] + [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def drip_body(conn: socket.socket) -> None:
    """Headers at once, then the body one byte every 0.2 s."""
    loopback.read_request(conn)
    body = OK * 50
    if not _send(conn, _head(headers={"content-length": str(len(body))})):
        return
    for byte in body:
        time.sleep(0.2)  # noqa: real-sleep - the point: a server that drips
        if not _send(conn, bytes([byte])):
            return


def drip_stream(conn: socket.socket) -> None:
    """An SSE stream that sends one event every 0.2 s, forever."""
    loopback.read_request(conn)
    if not _send(conn, _head(headers={"content-type": "text/event-stream"})):
        return
    event = b'data: {"choices": [{"index": 0, "delta": {"content": "a"}}]}\n\n'
    while _send(conn, event):
        time.sleep(0.2)  # noqa: real-sleep - the point: a server that drips


def endless_stream(conn: socket.socket) -> None:
    """An SSE stream as fast as the socket takes it, forever."""
    loopback.read_request(conn)
    if not _send(conn, _head(headers={"content-type": "text/event-stream"})):
        return
    event = b'data: {"choices": [{"index": 0, "delta": {"content": "a"}}]}\n\n' * 64
    while _send(conn, event):
        pass


def huge_body(conn: socket.socket) -> None:
    """A JSON body announced as 3.9 GiB and sent as fast as the client reads."""
    loopback.read_request(conn)
    size = int(3.9 * 2**30)
    head = _head(headers={"content-length": str(size), "content-type": "application/json"})
    if not _send(conn, head + b'{"choices": "'):
        return
    block = b"a" * 65536
    while _send(conn, block):
        pass


@cache
def bomb(kind: str, inflated: int = 2**30) -> bytes:
    """``inflated`` zero bytes, gzip- or zlib-compressed (about 1 MB for 1 GiB)."""
    return zeros_packed(GZIP if kind == "gzip" else ZLIB, inflated, b'{"choices": "')


def bomb_server(kind: str) -> Callable[[socket.socket], None]:
    bomb(kind)  # compressed before any call starts, not while one waits

    def handler(conn: socket.socket) -> None:
        loopback.read_request(conn)
        body = bomb(kind)
        headers = {
            "content-length": str(len(body)),
            "content-encoding": kind,
            "content-type": "application/json",
        }
        _send(conn, _head(headers=headers) + body)

    return handler


@cache
def stacked_bomb(inflated: int = 2**30) -> bytes:
    """gzip of gzip of a JSON start and ``inflated`` zero bytes: a few KB for 1 GiB."""
    return gzip_of_gzip(inflated, b'{"choices": "')


def stacked_server(
    encodings: list[str], *, sse: bool = False, body: bytes | None = None
) -> tuple[Callable[[socket.socket], None], list[bytes]]:
    """A server answering ``body`` (the stacked bomb) with one Content-Encoding header per
    entry of ``encodings``; and the calls it read (not the context-window probes)."""
    if body is None:
        body = stacked_bomb()  # compressed before any call starts, not while one waits
    seen: list[bytes] = []

    def handler(conn: socket.socket) -> None:
        request = loopback.read_request(conn)
        if request.startswith(b"POST"):
            seen.append(request)
        kind = "text/event-stream" if sse else "application/json"
        # Closed after one answer, and says so: else aiohttp reuses the context-window probe's
        # connection for the call, finds it closed, and waits a backoff (1 s) to retry.
        lines = ["HTTP/1.1 200 OK", f"content-length: {len(body)}", f"content-type: {kind}"]
        lines += ["connection: close", *(f"content-encoding: {value}" for value in encodings)]
        _send(conn, ("\r\n".join(lines) + "\r\n\r\n").encode() + body)

    return handler, seen


def client(
    base: str,
    *,
    deadline: float = 2.0,
    limits: Limits | None = None,
    waits: list[float] | None = None,
) -> LLMClient:
    """A vllm client; given ``waits``, its retry waits go there instead of passing for real."""
    faked: dict[str, Any] = {} if waits is None else {"sleep": waits.append, "random": lambda: 0.0}
    envelope = RetryEnvelope(RetryPolicy(attempts=3), cooldown=None, hook=lambda e: None, **faked)
    return LLMClient(
        "vllm",
        "m",
        base_url=f"{base}/v1",
        envelope=envelope,
        deadline=deadline,
        limits=limits,
        timeout=30.0,
        env={},
    )


def timed(call: Callable[[], Any]) -> tuple[float, Any]:
    started = time.monotonic()
    try:
        result = call()
    except AgentExecutionError as error:
        result = error
    return time.monotonic() - started, result


# -- the deadline -----------------------------------------------------------------------


def test_a_dripped_body_ends_at_the_deadline() -> None:
    with loopback.serve(drip_body) as base, client(base, deadline=2.0) as llm:
        seconds, error = timed(lambda: llm.complete("hi"))
    assert isinstance(error, ProviderTimeoutError)
    assert error.code == "llm.deadline_exceeded"
    assert error.details["reached"] == "the body"
    assert error.details["received_bytes"] > 0
    assert not error.retryable
    assert 2.0 <= seconds < 2.0 + MARGIN


def test_a_silent_server_ends_at_the_deadline_not_the_read_timeout() -> None:
    with loopback.serve(loopback.silent) as base, client(base, deadline=1.5) as llm:
        seconds, error = timed(lambda: llm.complete("hi"))
    assert isinstance(error, ProviderTimeoutError)
    assert error.code == "llm.deadline_exceeded"
    assert error.details["reached"] == "the response headers"
    assert 1.5 <= seconds < 1.5 + MARGIN


def test_a_dripped_stream_ends_at_the_deadline_with_what_arrived() -> None:
    with loopback.serve(drip_stream) as base, client(base, deadline=1.5) as llm:
        texts: list[str] = []

        def consume() -> None:
            for event in llm.stream("hi"):
                if event.type == "text":
                    texts.append(event.text or "")

        seconds, error = timed(consume)
    assert isinstance(error, ProviderTimeoutError)
    assert error.code == "llm.deadline_exceeded"
    assert error.details["reached"].startswith("stream event ")
    assert error.details["interrupted"] is True
    assert error.details["partial_text"] == "".join(texts)
    assert len(texts) >= 3
    assert 1.5 <= seconds < 1.5 + MARGIN


def test_an_async_dripped_body_ends_at_the_deadline() -> None:
    import asyncio

    async def main() -> tuple[float, Any]:
        async with client(base, deadline=1.5) as llm:
            started = time.monotonic()
            try:
                result: Any = await llm.acomplete("hi")
            except AgentExecutionError as error:
                result = error
            return time.monotonic() - started, result

    with loopback.serve(drip_body) as base:
        seconds, error = asyncio.run(main())
    assert isinstance(error, ProviderTimeoutError)
    assert error.code == "llm.deadline_exceeded"
    assert 1.5 <= seconds < 1.5 + MARGIN


def test_the_deadline_comes_from_the_environment() -> None:
    llm = LLMClient("vllm", "m", base_url="http://127.0.0.1:9/v1", env={})
    assert llm.deadline == 600.0
    env = {"FLUID_LLM_DEADLINE_SECONDS": "45", "FLUID_LLM_MAX_STREAM_EVENTS": "50"}
    from_env = LLMClient.from_env(env, provider="vllm", model="m", base_url="http://x/v1")
    assert from_env.deadline == 45.0
    assert from_env.limits.max_stream_events == 50
    assert LLMClient("vllm", "m", base_url="http://x/v1", deadline=7, env={}).deadline == 7
    for made in (llm, from_env):
        made.close()


# -- sizes ------------------------------------------------------------------------------


def test_a_huge_body_stops_at_the_limit() -> None:
    limits = Limits(max_response_bytes=4 * 2**20)
    with loopback.serve(huge_body) as base, client(base, limits=limits) as llm:
        seconds, error = timed(lambda: llm.complete("hi"))
    assert isinstance(error, ProviderError)
    assert error.code == "llm.response_too_large"
    assert error.details["limit"] == 4 * 2**20
    assert not error.retryable
    assert seconds < 2.0 + MARGIN


@pytest.mark.parametrize("kind", ["gzip", "deflate"])
def test_a_compression_bomb_stops_at_the_limit(kind: str) -> None:
    limits = Limits(max_response_bytes=8 * 2**20)
    with loopback.serve(bomb_server(kind)) as base, client(base, limits=limits) as llm:
        _, error = timed(lambda: llm.complete("hi"))
    assert isinstance(error, ProviderError)
    assert error.code == "llm.response_too_large"
    assert error.details["received"] == 8 * 2**20 + 1  # counted inflated, stopped at once


def _call(llm: LLMClient, mode: str) -> Any:
    if mode == "acomplete":
        import asyncio

        async def main() -> Any:
            try:
                return await llm.acomplete("hi")
            finally:
                await llm.aclose()

        return asyncio.run(main())
    if mode == "stream":
        return list(llm.stream("hi"))
    return llm.complete("hi")


@pytest.mark.parametrize("mode", ["complete", "acomplete", "stream"])
@pytest.mark.parametrize(
    "encodings", [["gzip, gzip"], ["gzip", "gzip"], ["gzip", "identity, x-gzip"]]
)
def test_a_stacked_compression_bomb_stops_at_the_limit(encodings: list[str], mode: str) -> None:
    """Two gzip layers (in one header or two): 2.5 KB that inflate to 1 GiB, counted inflated
    layer by layer on every transport, never handed to httpx's unbounded decoders."""
    limits = Limits(max_response_bytes=8 * 2**20, max_event_bytes=2**20)
    handler, seen = stacked_server(encodings, sse=mode == "stream")
    with loopback.serve(handler) as base, client(base, limits=limits) as llm:
        seconds, error = timed(lambda: _call(llm, mode))
    assert isinstance(error, ProviderError), repr(error)
    assert error.code == "llm.response_too_large"
    assert not error.retryable
    assert len(seen) == 1
    if mode != "stream":
        assert error.details["received"] == 8 * 2**20 + 1
    assert seconds < 2.0 + MARGIN


@pytest.mark.parametrize("mode", ["complete", "acomplete", "stream"])
@pytest.mark.parametrize("encodings", [["br"], ["zstd"], ["gzip", "br"], ["gzip, " * 4 + "gzip"]])
def test_an_encoding_fluid_cannot_bound_is_refused_and_not_retried(
    encodings: list[str], mode: str
) -> None:
    handler, seen = stacked_server(encodings, sse=mode == "stream", body=b"\x1b\x00\x00 br?")
    with loopback.serve(handler) as base, client(base) as llm:
        _, error = timed(lambda: _call(llm, mode))
    assert isinstance(error, ProviderError), repr(error)
    assert error.code == "llm.malformed_response"
    assert error.retryable is False
    assert error.status_code == 200
    assert "gzip, deflate" in error.message
    assert len(seen) == 1  # the answer would be the same again


def test_an_endless_stream_stops_at_the_event_limit() -> None:
    limits = Limits(max_stream_events=500)
    with loopback.serve(endless_stream) as base, client(base, limits=limits) as llm:
        events: list[Any] = []

        def consume() -> None:
            events.extend(llm.stream("hi"))

        seconds, error = timed(consume)
    assert isinstance(error, ProviderError)
    assert error.code == "llm.response_too_large"
    assert error.details["unit"] == "events"
    assert error.details["interrupted"] is True
    assert len(error.details["partial_text"]) == 500  # the events within the limit, kept
    assert seconds < 2.0 + MARGIN


def test_only_the_start_of_an_error_body_is_read() -> None:
    def handler(conn: socket.socket) -> None:
        loopback.read_request(conn)
        body = b'{"error": {"message": "server on fire"}}' + b" " * (8 * 2**20)
        _send(conn, _head(503, {"content-length": str(len(body))}) + body)

    with loopback.serve(handler) as base:
        envelope = RetryEnvelope(RetryPolicy(attempts=1), cooldown=None, hook=lambda e: None)
        with LLMClient("vllm", "m", base_url=f"{base}/v1", envelope=envelope, env={}) as llm:
            _, error = timed(lambda: llm.complete("hi"))
    assert error.code == "llm.server_error"
    assert "server on fire" in error.message


MEMORY_PROBE = """
import json, resource, sys
from fluid_build.copilot import LLMClient
from fluid_build.copilot.agents.errors import AgentExecutionError
from fluid_build.copilot.call.envelope import RetryEnvelope, RetryPolicy

def peak_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

envelope = RetryEnvelope(RetryPolicy(attempts=1), cooldown=None, hook=lambda e: None)
llm = LLMClient("vllm", "m", base_url=sys.argv[1] + "/v1", envelope=envelope, env={},
                deadline=float(sys.argv[3]))
before = peak_mib()
try:
    if sys.argv[2] == "stream":
        for _ in llm.stream("hi"):
            pass
    else:
        llm.complete("hi")
    code = "ok"
except AgentExecutionError as error:
    code = error.code
llm.close()
print(json.dumps({"code": code, "growth_mib": peak_mib() - before}))
"""


@pytest.mark.parametrize(
    ("name", "mode"),
    [
        ("huge", "complete"),
        ("gzip", "complete"),
        ("deflate", "complete"),
        ("endless", "stream"),
        ("gzip, gzip", "complete"),
        ("gzip, gzip", "stream"),
    ],
)
def test_memory_stays_bounded_at_the_default_limits(name: str, mode: str) -> None:
    handlers = {"huge": huge_body, "endless": endless_stream}
    if name in handlers:
        handler = handlers[name]
    elif "," in name:
        handler = stacked_server([name], sse=mode == "stream")[0]
    else:
        handler = bomb_server(name)
    with loopback.serve(handler) as base:
        done = subprocess.run(
            [sys.executable, "-c", MEMORY_PROBE, base, mode, "20"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["code"] == "llm.response_too_large", (name, result)
    assert result["growth_mib"] < 256, (name, result)


# -- answers that parse but do not fit ------------------------------------------------------


def answering(body: bytes) -> Iterator[Any]:
    handler = loopback.respond(200, body, {"content-type": "application/json"})
    return loopback.serve(handler)


@pytest.mark.parametrize(
    ("body", "where"),
    [
        (b'{"choices": "nope"}', "choices"),
        (b'{"choices": [null]}', "choices.0"),
        (b'{"choices": [{"message": 7}]}', "choices.0.message"),
        (b'{"choices": [{"message": {"content": {"a": 1}}}]}', "choices.0.message.content"),
        (b'{"choices": [{"message": {"tool_calls": "x"}}]}', "choices.0.message.tool_calls"),
        (b"[" * 100_000 + b"]" * 100_000, None),
        (b"null", None),
        (b"NaN", None),
        (b"\xff\xfe garbage", None),
    ],
    ids=[
        "choices-str",
        "choice-null",
        "message-int",
        "content-dict",
        "tool-calls-str",
        "deep",
        "null",
        "nan",
        "bytes",
    ],
)
def test_a_malformed_answer_names_what_is_wrong(body: bytes, where: str | None) -> None:
    waits: list[float] = []
    with answering(body) as base, client(base, waits=waits) as llm:
        _, error = timed(lambda: llm.complete("hi"))
    assert isinstance(error, ProviderError), repr(error)
    assert error.code == "llm.malformed_response"
    # Retried once, after the first backoff: the next (2 s) would pass the 2 s deadline.
    assert waits == [1.0]
    if where is not None:
        assert error.details.get("field") == where, error.details
        assert where in error.message


def test_a_half_open_trial_ends_inside_its_lease_whatever_the_server_does() -> None:
    from fluid_build.copilot.agents.errors import ProviderServerError
    from fluid_build.copilot.health.breaker import CircuitBreaker
    from fluid_build.copilot.health.cooldown import MemoryCooldownStore

    store = MemoryCooldownStore()
    breaker = CircuitBreaker(store, threshold=1, cool_off=0.01, window=60, trial_seconds=1.0)
    envelope = RetryEnvelope(
        RetryPolicy(attempts=3), cooldown=store, breaker=breaker, hook=lambda e: None
    )
    with loopback.serve(loopback.silent) as base:
        llm = LLMClient(
            "vllm", "m", base_url=f"{base}/v1", envelope=envelope, deadline=20.0, env={}
        )
        breaker.record_failure(str(llm.health_key), ProviderServerError("503"))
        time.sleep(0.02)  # noqa: real-sleep - past the 10 ms cool-off: half-open
        seconds, error = timed(lambda: llm.complete("hi"))
        llm.close()
    assert isinstance(error, ProviderTimeoutError)
    assert error.code == "llm.deadline_exceeded"
    assert seconds < breaker.lease_ttl()  # 1.5 s: the next trial can never overlap it


@pytest.mark.parametrize(
    ("provider", "url", "body", "where"),
    [
        (
            "anthropic",
            "https://api.anthropic.com/v1/messages",
            {"content": [{"type": "text", "text": ["a"]}]},
            "content.0.text",
        ),
        (
            "anthropic",
            "https://api.anthropic.com/v1/messages",
            {"content": "text"},
            "content",
        ),
        (
            "gemini",
            "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash:generateContent",
            {"candidates": [{"content": {"parts": "x"}}]},
            "candidates.0.content.parts",
        ),
        (
            "ollama",
            "http://127.0.0.1:11434/api/chat",
            {"message": {"content": "ok", "tool_calls": [{"function": "f"}]}},
            "message.tool_calls.0.function",
        ),
    ],
    ids=["anthropic-text", "anthropic-content", "gemini-parts", "ollama-function"],
)
def test_every_adapter_names_the_wrong_field(
    provider: str, url: str, body: dict[str, Any], where: str
) -> None:
    import respx

    envelope = RetryEnvelope(RetryPolicy(attempts=1), cooldown=None, hook=lambda e: None)
    env = {"ANTHROPIC_API_KEY": "sk-ant-x", "GEMINI_API_KEY": "AIza-x"}
    model = {"gemini": "gemini-2.5-flash", "ollama": "llama3.1"}.get(provider)
    with respx.mock() as mock, LLMClient(provider, model, envelope=envelope, env=env) as llm:
        mock.post(url).respond(200, json=body)
        _, error = timed(lambda: llm.complete("hi"))
    assert error.code == "llm.malformed_response", repr(error)
    assert error.details["field"] == where


def test_a_stream_event_that_does_not_fit_is_named_with_what_arrived() -> None:
    import respx

    events = (
        b'data: {"choices": [{"index": 0, "delta": {"content": "par"}}]}\n\n'
        b'data: {"choices": [{"index": 0, "delta": {"tool_calls": 5}}]}\n\n'
    )
    envelope = RetryEnvelope(RetryPolicy(attempts=1), cooldown=None, hook=lambda e: None)
    with (
        respx.mock() as mock,
        LLMClient("vllm", "m", base_url="http://h/v1", envelope=envelope, env={}) as llm,
    ):
        mock.post("http://h/v1/chat/completions").respond(
            200, content=events, headers={"content-type": "text/event-stream"}
        )
        _, error = timed(lambda: list(llm.stream("hi")))
    assert error.code == "llm.malformed_response"
    assert error.details["field"] == "choices.0.delta.tool_calls"
    assert error.details["partial_text"] == "par"
