"""A stream the server cuts is a typed error carrying what arrived, never a ``done``.

Real loopback sockets; the stream stops before its provider's end marker in
three ways: the body ends by close (no content-length, no chunked framing),
a chunked body ends without its last chunk (httpx: "incomplete chunked
read"), or the connection is reset. Each runs on the sync pool and on both
async transports (``FLUID_LLM_TRANSPORT=httpx`` and ``=aiohttp``).

Once the caller had deltas, the error (``llm.network_error``, retryable)
carries ``interrupted`` and the partial snapshot, and nothing is retried;
before the first delta, the envelope retries the attempt as any failed one.
A stream that did say it was over (``[DONE]``, a finish reason,
``message_stop``, ``done: true``) ends in ``done``, however the connection
closes after it.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from fluid_build.copilot import LLMClient, StreamEvent
from fluid_build.copilot.agents.errors import AgentExecutionError, ProviderError
from tests import loopback
from tests.fakes import FakeClock, clocked_envelope

CUTS = ["eof", "chunked", "reset"]
SHELLS = ["sync", "httpx", "aiohttp"]  # the sync pool; the two async transports
KEY = "sk-test-0123456789abcdef"

# -- what the servers send ---------------------------------------------------------------


def sse(*events: dict[str, Any], named: bool = False) -> bytes:
    out = ""
    for event in events:
        if named:
            out += f"event: {event['type']}\n"
        out += f"data: {json.dumps(event)}\n\n"
    return out.encode()


def ndjson(*lines: dict[str, Any]) -> bytes:
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def openai_chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "model": "gpt-4o-mini",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


OPENAI_ROLE = sse(openai_chunk({"role": "assistant", "content": ""}))
OPENAI_DELTAS = OPENAI_ROLE + sse(
    openai_chunk({"content": "Hello "}), openai_chunk({"content": "wor"})
)
OPENAI_FINISH = sse(openai_chunk({}, "stop"))
OPENAI_DONE = b"data: [DONE]\n\n"

ANTHROPIC_START = sse(
    {
        "type": "message_start",
        "message": {"model": "claude-sonnet-4-6", "usage": {"input_tokens": 5, "output_tokens": 1}},
    },
    {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    named=True,
)
ANTHROPIC_DELTAS = ANTHROPIC_START + sse(
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hello "}},
    {"type": "ping"},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "wor"}},
    named=True,
)
ANTHROPIC_STOP_REASON = sse(
    {"type": "content_block_stop", "index": 0},
    {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 3}},
    named=True,
)
ANTHROPIC_STOP = sse({"type": "message_stop"}, named=True)

#: provider -> (the deltas before the cut, how many events they are, the rest of the answer)
STREAMS = {
    "openai": (OPENAI_DELTAS, 3, OPENAI_FINISH + OPENAI_DONE),
    "anthropic": (ANTHROPIC_DELTAS, 5, ANTHROPIC_STOP_REASON + ANTHROPIC_STOP),
}
#: provider -> what comes before any delta (nothing for the caller yet)
PREAMBLES = {"openai": (OPENAI_ROLE, 1), "anthropic": (ANTHROPIC_START, 2)}

# -- the servers ---------------------------------------------------------------------


def _head(how: str, content_type: str) -> bytes:
    framing = "connection: close" if how == "eof" else "transfer-encoding: chunked"
    return f"HTTP/1.1 200 OK\r\ncontent-type: {content_type}\r\n{framing}\r\n\r\n".encode()


def cut(conn: socket.socket, body: bytes, how: str, content_type: str) -> None:
    """Send a 200 stream of ``body``, then end it ``how``: never with its last chunk."""
    loopback.read_request(conn)
    framed = body if how == "eof" else f"{len(body):x}\r\n".encode() + body + b"\r\n"
    conn.sendall(_head(how, content_type) + framed)
    if how == "reset":
        time.sleep(0.05)  # noqa: real-sleep - the server pauses so the client reads the deltas before the RST
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    else:
        conn.shutdown(socket.SHUT_WR)


def whole(conn: socket.socket, body: bytes, how: str, content_type: str) -> None:
    """Send a 200 stream of ``body`` and end it properly (``how`` as in :func:`cut`)."""
    loopback.read_request(conn)
    if how == "eof":
        conn.sendall(_head(how, content_type) + body)
    else:
        conn.sendall(
            _head(how, content_type) + f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
        )
    conn.shutdown(socket.SHUT_WR)


class Server:
    """A loopback server answering its n-th connection with ``replies[n]`` (the last repeats)."""

    def __init__(self, *replies: Callable[[socket.socket], None]) -> None:
        self.replies = replies
        self.connections = 0
        self.lock = threading.Lock()

    def __call__(self, conn: socket.socket) -> None:
        with self.lock:
            n = self.connections
            self.connections += 1
        self.replies[min(n, len(self.replies) - 1)](conn)


def sends(
    body: bytes, how: str, content_type: str = "text/event-stream", *, ends: bool = False
) -> Callable[[socket.socket], None]:
    reply = whole if ends else cut
    return lambda conn: reply(conn, body, how, content_type)


# -- the clients ---------------------------------------------------------------------

MODELS = {
    "openai": "gpt-4o-mini",
    "anthropic": "claude-sonnet-4-6",
    "gemini": "gemini-2.5-flash",
    "ollama": "llama3.1",
    "bedrock": "amazon.nova-micro-v1:0",
}


def client(url: str, provider: str, shell: str, clock: FakeClock) -> LLMClient:
    envelope = clocked_envelope(clock)
    env = {"FLUID_LLM_TRANSPORT": "aiohttp" if shell == "aiohttp" else "httpx"}
    if provider == "bedrock":  # a Bedrock API key: no AWS credential chain
        env.update(AWS_REGION="us-east-1", AWS_BEARER_TOKEN_BEDROCK=KEY)
    return LLMClient(
        provider=provider,
        model=MODELS[provider],
        base_url=url + "/v1" if provider == "openai" else url,
        api_key=None if provider == "bedrock" else KEY,
        envelope=envelope,
        timeout=5.0,
        deadline=20.0,
        env=env,
    )


def run(
    server: Server, provider: str, shell: str, clock: FakeClock | None = None
) -> tuple[list[StreamEvent], AgentExecutionError | None]:
    """The events the caller saw, and the error the stream ended in (None: it ended well)."""
    clock = clock or FakeClock()
    seen: list[StreamEvent] = []
    with loopback.serve(server) as url:
        llm = client(url, provider, shell, clock)
        if shell == "sync":
            with llm:
                try:
                    seen.extend(llm.stream("hi"))
                except AgentExecutionError as error:
                    return seen, error
            return seen, None

        async def go() -> AgentExecutionError | None:
            try:
                async for event in llm.astream("hi"):
                    seen.append(event)
            except AgentExecutionError as error:
                return error
            finally:
                await llm.aclose()
            return None

        return seen, asyncio.run(go())


def assert_keyless(error: BaseException) -> None:
    """The key is nowhere in the error or what is chained to it."""
    seen: BaseException | None = error
    for _ in range(10):
        if seen is None:
            return
        assert KEY not in str(seen)
        assert KEY not in repr(seen)
        assert KEY not in repr(vars(seen))
        seen = seen.__cause__ or seen.__context__


def texts(events: list[StreamEvent]) -> list[str]:
    return [event.text for event in events if event.type == "text"]


# -- cut after deltas: the typed error with the snapshot -----------------------------------


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("how", CUTS)
@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_stream_cut_after_deltas_is_a_typed_error_with_the_snapshot(
    provider: str, how: str, shell: str
) -> None:
    body, events, _ = STREAMS[provider]
    server = Server(sends(body, how))
    clock = FakeClock()
    seen, error = run(server, provider, shell, clock)
    assert texts(seen) == ["Hello ", "wor"]
    assert all(event.type != "done" for event in seen)
    assert isinstance(error, ProviderError)
    assert (error.code, error.retryable) == ("llm.network_error", True)
    assert error.details["interrupted"] is True
    assert error.details["partial_text"] == "Hello wor"
    assert error.details["tool_calls"] == []
    assert error.details["events_received"] == events
    assert error.details["characters_received"] == 9
    assert error.details["received_bytes"] == len(body)
    assert f"was cut after {events} events / 9 characters" in error.message
    assert "before an answer arrived" not in error.message
    assert "reached the caller" not in error.message
    # The caller had text: never sent again.
    assert (server.connections, clock.waits) == (1, [])
    assert_keyless(error)


@pytest.mark.parametrize("shell", SHELLS)
def test_a_cut_stream_keeps_the_tool_calls_that_completed(shell: str) -> None:
    calls = sse(
        {
            "type": "content_block_start",
            "index": 1,
            "content_block": {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {}},
        },
        {
            "type": "content_block_delta",
            "index": 1,
            "delta": {"type": "input_json_delta", "partial_json": '{"city": "Paris"}'},
        },
        {"type": "content_block_stop", "index": 1},
        {
            "type": "content_block_start",
            "index": 2,
            "content_block": {"type": "tool_use", "id": "toolu_2", "name": "lookup", "input": {}},
        },
        {
            "type": "content_block_delta",
            "index": 2,
            "delta": {"type": "input_json_delta", "partial_json": '{"city": "Ly'},
        },
        named=True,
    )
    server = Server(sends(ANTHROPIC_DELTAS + calls, "chunked"))
    _, error = run(server, "anthropic", shell)
    assert isinstance(error, ProviderError)
    assert error.code == "llm.network_error"
    assert error.details["partial_text"] == "Hello wor"
    # The second call's arguments had not finished arriving.
    assert error.details["tool_calls"] == [
        {"id": "toolu_1", "name": "lookup", "arguments": {"city": "Paris"}}
    ]


# -- cut before the first delta: retried, and said so if it never gets further ----------


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("how", CUTS)
@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_stream_cut_before_its_first_delta_is_retried(
    provider: str, how: str, shell: str
) -> None:
    preamble, _ = PREAMBLES[provider]
    body, _, rest = STREAMS[provider]
    server = Server(sends(preamble, how), sends(body + rest, how, ends=True))
    clock = FakeClock()
    seen, error = run(server, provider, shell, clock)
    assert error is None
    assert texts(seen) == ["Hello ", "wor"]
    assert seen[-1].type == "done"
    assert seen[-1].completion is not None
    assert seen[-1].completion.text == "Hello wor"
    assert seen[-1].completion.attempts == 2
    assert (server.connections, clock.waits) == (2, [1.0])


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("how", CUTS)
def test_a_stream_always_cut_before_its_first_delta_says_so(how: str, shell: str) -> None:
    preamble, events = PREAMBLES["anthropic"]
    server = Server(sends(preamble, how))
    clock = FakeClock()
    seen, error = run(server, "anthropic", shell, clock)
    assert seen == []
    assert isinstance(error, ProviderError)
    assert (error.code, error.retryable) == ("llm.network_error", True)
    assert f"was cut after {events} events / 0 characters" in error.message
    assert "before any of it reached the caller" in error.message
    assert "before an answer arrived" not in error.message
    assert "interrupted" not in error.details  # the caller had nothing
    assert_keyless(error)
    assert error.details["events_received"] == events
    assert server.connections == len(clock.waits) + 1 > 1


# -- a stream that said it was over ends in done, however the connection closes -------------


ENDED = [
    pytest.param("openai", OPENAI_DELTAS + OPENAI_DONE, None, id="openai-done-marker-only"),
    pytest.param("openai", OPENAI_DELTAS + OPENAI_FINISH, "stop", id="openai-finish-reason-only"),
    pytest.param(
        "anthropic", ANTHROPIC_DELTAS + ANTHROPIC_STOP, None, id="anthropic-message-stop-only"
    ),
    pytest.param(
        "anthropic",
        ANTHROPIC_DELTAS + ANTHROPIC_STOP_REASON,
        "end_turn",
        id="anthropic-stop-reason-only",
    ),
]


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize(("provider", "body", "finish"), ENDED)
def test_a_stream_with_its_end_marker_is_done_even_if_the_connection_is_cut(
    provider: str, body: bytes, finish: str | None, shell: str
) -> None:
    server = Server(sends(body, "chunked"))
    seen, error = run(server, provider, shell)
    assert error is None
    assert texts(seen) == ["Hello ", "wor"]
    done = seen[-1].completion
    assert done is not None
    assert (done.text, done.finish_reason) == ("Hello wor", finish)


# -- the other providers' end markers ------------------------------------------------------

GEMINI = sse(
    {"candidates": [{"content": {"parts": [{"text": "Hello "}], "role": "model"}}]},
    {"candidates": [{"content": {"parts": [{"text": "wor"}], "role": "model"}}]},
)
GEMINI_END = sse(
    {
        "candidates": [{"content": {"parts": [{"text": ""}]}, "finishReason": "STOP"}],
        "usageMetadata": {"promptTokenCount": 3, "candidatesTokenCount": 2},
    }
)
OLLAMA = ndjson(
    {"model": "llama3.1", "message": {"role": "assistant", "content": "Hello "}, "done": False},
    {"model": "llama3.1", "message": {"role": "assistant", "content": "wor"}, "done": False},
)
OLLAMA_END = ndjson(
    {
        "model": "llama3.1",
        "message": {"role": "assistant", "content": ""},
        "done": True,
        "done_reason": "stop",
    }
)
OTHERS = [
    pytest.param("gemini", GEMINI, GEMINI_END, "text/event-stream", "STOP", id="gemini"),
    pytest.param("ollama", OLLAMA, OLLAMA_END, "application/x-ndjson", "stop", id="ollama"),
]


@pytest.mark.parametrize("shell", ["sync", "httpx"])
@pytest.mark.parametrize(("provider", "body", "end", "content_type", "finish"), OTHERS)
def test_gemini_and_ollama_streams_end_at_their_own_marker(
    provider: str, body: bytes, end: bytes, content_type: str, finish: str, shell: str
) -> None:
    seen, error = run(Server(sends(body + end, "eof", content_type)), provider, shell)
    assert error is None
    assert seen[-1].completion is not None
    assert (seen[-1].completion.text, seen[-1].completion.finish_reason) == ("Hello wor", finish)

    seen, error = run(Server(sends(body, "eof", content_type)), provider, shell)
    assert texts(seen) == ["Hello ", "wor"]
    assert isinstance(error, ProviderError)
    assert (error.code, error.retryable) == ("llm.network_error", True)
    assert error.details["partial_text"] == "Hello wor"
    assert error.details["interrupted"] is True
    assert "was cut after 2 events / 9 characters" in error.message


# -- AWS event-stream frames: a bad frame never takes the good ones before it down ----------

EVENTSTREAM = "application/vnd.amazon.eventstream"


def _bedrock_frames() -> list[bytes]:
    """The frames of a real Bedrock converse-stream answer (tests/data/provider_answers.json)."""
    import base64
    from pathlib import Path

    rows = json.loads((Path(__file__).parent / "data" / "provider_answers.json").read_text())
    row = next(r for r in rows if r["id"] == "bedrock-stream-text")
    stream = base64.b64decode("".join(row["stream"]))
    frames = []
    while stream:
        total = int.from_bytes(stream[:4], "big")
        frames.append(stream[:total])
        stream = stream[total:]
    return frames


def _corrupted(frame: bytes) -> bytes:
    broken = bytearray(frame)
    broken[-20] ^= 0xFF  # inside the payload: the message CRC no longer matches
    return bytes(broken)


#: messageStart, three text deltas, then a fourth delta whose checksum fails.
BEDROCK_GOOD = _bedrock_frames()[:4]
BEDROCK_TEXTS = ["The", " capital of France is Paris.", " Paris is not"]
BEDROCK_BAD = _corrupted(_bedrock_frames()[4])


def frames_then_fault(writes: str) -> Callable[[socket.socket], None]:
    """Good frames, then a corrupt one: in one write, or each frame in a write of its own."""

    def reply(conn: socket.socket) -> None:
        loopback.read_request(conn)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        head = _head("eof", EVENTSTREAM)
        frames = [*BEDROCK_GOOD, BEDROCK_BAD]
        if writes == "one":
            conn.sendall(head + b"".join(frames))
        else:
            conn.sendall(head)
            for frame in frames:
                conn.sendall(frame)
        conn.shutdown(socket.SHUT_WR)

    return reply


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("writes", ["one", "several"])
def test_event_stream_frames_before_a_corrupt_one_reach_the_caller_however_they_arrive(
    writes: str, shell: str
) -> None:
    server = Server(frames_then_fault(writes))
    seen, error = run(server, "bedrock", shell)
    assert texts(seen) == BEDROCK_TEXTS
    assert isinstance(error, ProviderError)
    assert error.code == "llm.malformed_response"
    assert error.details["interrupted"] is True
    assert error.details["partial_text"] == "".join(BEDROCK_TEXTS)
    assert server.connections == 1  # the caller had text: never retried
    assert_keyless(error)


def test_a_bad_frame_read_with_good_ones_is_raised_after_them() -> None:
    from fluid_build.copilot.llm.base import aiter_frames, iter_frames

    def refuse(size: int) -> Exception:
        return ProviderError(f"{size}", code="llm.response_too_large")

    body = b"".join(BEDROCK_GOOD) + BEDROCK_BAD
    got: list[Any] = []
    with pytest.raises(ProviderError) as caught:
        got.extend(iter_frames(iter([body]), 1 << 20, refuse))
    assert [kind for kind, _ in got] == ["messageStart"] + ["contentBlockDelta"] * 3
    assert caught.value.code == "llm.malformed_response"

    async def chunks() -> Any:
        yield body

    async def collect() -> tuple[list[Any], BaseException | None]:
        out: list[Any] = []
        try:
            async for item in aiter_frames(chunks(), 1 << 20, refuse):
                out.append(item)
        except ProviderError as error:
            return out, error
        return out, None

    items, error = asyncio.run(collect())
    assert items == got
    assert isinstance(error, ProviderError)
    assert error.code == "llm.malformed_response"
    # A bad frame first in its read has no good frames to give: raised at once, as before.
    with pytest.raises(ProviderError):
        next(iter_frames(iter([BEDROCK_BAD]), 1 << 20, refuse))
