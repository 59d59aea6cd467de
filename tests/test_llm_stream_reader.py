"""iter_stream and aiter_stream read SSE and NDJSON bodies alike, chunk for chunk; the
StreamReader under them splits the bytes into lines linearly, within a limit per event."""

from __future__ import annotations

import asyncio
import itertools
import re
import time
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import Any

import httpx
import pytest

from fluid_build.copilot.agents.errors import ProviderError
from fluid_build.copilot.call.wire import Deadline, Limits, StreamReader
from fluid_build.copilot.llm.base import aiter_stream, iter_stream

SSE = "sse"
NDJSON = "ndjson"

CASES: list[tuple[str, str, list[str], list[tuple[str, Any]]]] = [
    (
        "sse events, comments, names and multi-line data",
        SSE,
        [
            ": a comment",
            "event: message_start",
            'data: {"a": 1}',
            "",
            "",
            "data:{",
            'data: "b": 2}',
            "id: 7",
            "",
            "event: ping",
            "",
            "data: not json",
            "",
        ],
        [("message_start", {"a": 1}), ("", {"b": 2}), ("", {"_unparsed": "not json"})],
    ),
    (
        "sse stops at [DONE] and reads nothing after it",
        SSE,
        ['data: {"a": 1}', "", "data: [DONE]", "", 'data: {"b": 2}', ""],
        [("", {"a": 1})],
    ),
    (
        "sse keeps an event the body ends in without a blank line",
        SSE,
        ['data: {"a": 1}', "", "event: last", 'data: {"z": 0}'],
        [("", {"a": 1}), ("last", {"z": 0})],
    ),
    (
        "sse drops a [DONE] the body ends in without a blank line",
        SSE,
        ['data: {"a": 1}', "", "data: [DONE]"],
        [("", {"a": 1})],
    ),
    (
        "an event name with no data is forgotten at the blank line",
        SSE,
        ["event: lonely", "", 'data: {"a": 1}', ""],
        [("", {"a": 1})],
    ),
    ("an empty sse body", SSE, [], []),
    (
        "ndjson, blank lines skipped, garbage kept",
        NDJSON,
        ['{"a": 1}', "", "   ", "[DONE]", '{"b": 2}', "oops"],
        [
            ("", {"a": 1}),
            ("", {"_unparsed": "[DONE]"}),
            ("", {"b": 2}),
            ("", {"_unparsed": "oops"}),
        ],
    ),
    ("an empty ndjson body", NDJSON, [], []),
]


def _sync(fmt: str, lines: list[str]) -> tuple[list[tuple[str, Any]], int]:
    read = 0

    def source() -> Iterator[str]:
        nonlocal read
        for line in lines:
            read += 1
            yield line

    return list(iter_stream(fmt, source())), read


def _async(fmt: str, lines: list[str]) -> tuple[list[tuple[str, Any]], int]:
    read = 0

    async def source() -> AsyncIterator[str]:
        nonlocal read
        for line in lines:
            read += 1
            yield line

    async def collect() -> list[tuple[str, Any]]:
        return [chunk async for chunk in aiter_stream(fmt, source())]

    return asyncio.run(collect()), read


@pytest.mark.parametrize(("name", "fmt", "lines", "expected"), CASES, ids=[c[0] for c in CASES])
def test_sync_and_async_readers_agree(
    name: str, fmt: str, lines: list[str], expected: list[tuple[str, Any]]
) -> None:
    sync_chunks, sync_read = _sync(fmt, lines)
    async_chunks, async_read = _async(fmt, lines)
    assert sync_chunks == expected
    assert async_chunks == expected
    assert sync_read == async_read


def test_done_stops_reading_the_body() -> None:
    lines = ['data: {"a": 1}', "", "data: [DONE]", "", 'data: {"b": 2}', ""]
    assert _sync(SSE, lines)[1] == 4
    assert _async(SSE, lines)[1] == 4


# -- the lines under them: wire.StreamReader --------------------------------------------------

MiB = 2**20


class _SyncBytes(httpx.SyncByteStream):
    def __init__(self, chunks: Iterable[bytes]) -> None:
        self.chunks = chunks

    def __iter__(self) -> Iterator[bytes]:
        yield from self.chunks


class _AsyncBytes(httpx.AsyncByteStream):
    def __init__(self, chunks: Iterable[bytes]) -> None:
        self.chunks = chunks

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk


def _reader(chunks: Iterable[bytes], limits: Limits, *, asynchronous: bool = False) -> StreamReader:
    stream: Any = _AsyncBytes(chunks) if asynchronous else _SyncBytes(chunks)
    response = httpx.Response(
        200,
        headers={"content-type": "text/event-stream"},
        stream=stream,
        request=httpx.Request("POST", "http://provider.test/v1/chat/completions"),
    )
    return StreamReader(response, Deadline(60.0, provider="vllm", model="m"), limits)


def lines_sync(chunks: Iterable[bytes], limits: Limits | None = None) -> list[str]:
    return list(_reader(chunks, limits or Limits()).lines())


def lines_async(chunks: Iterable[bytes], limits: Limits | None = None) -> list[str]:
    reader = _reader(chunks, limits or Limits(), asynchronous=True)

    async def collect() -> list[str]:
        return [line async for line in reader.alines()]

    return asyncio.run(collect())


def expected_lines(body: bytes) -> list[str]:
    """What splitting the whole body at once gives: the reference for any chunking."""
    parts = re.split(r"\r\n|\r|\n", body.decode("utf-8", "replace"))
    if parts and parts[-1] == "":
        parts.pop()
    return parts


SAMPLE = (
    b": hi\r\n"
    b'event: a\r\ndata: {"x": "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80"}\r\n\r\n'
    b"data: one\rdata: two\r\rdata: three\n\n"
    b"data: \xff broken \xe2\x82\r\n"
    b"\r\n\n\r"
    b"data: last without end"
)


def test_every_split_of_a_body_gives_the_same_lines() -> None:
    """CRLF (and a UTF-8 character) split across chunks, at every one and two points."""
    expected = expected_lines(SAMPLE)
    assert "data: last without end" in expected
    n = len(SAMPLE)
    for i in range(n + 1):
        assert lines_sync([SAMPLE[:i], SAMPLE[i:]]) == expected, i
    for i, j in itertools.combinations(range(0, n + 1, 3), 2):
        assert lines_sync([SAMPLE[:i], SAMPLE[i:j], b"", SAMPLE[j:]]) == expected, (i, j)
    assert lines_sync([SAMPLE[k : k + 1] for k in range(n)]) == expected


def test_a_crlf_split_across_chunks_is_one_line_end() -> None:
    assert lines_sync([b"data: a\r", b"\ndata: b\r\n"]) == ["data: a", "data: b"]
    assert lines_sync([b"data: a\r", b"", b"\n", b"\n"]) == ["data: a", ""]
    assert lines_sync([b"data: a\r", b"\r", b"\n"]) == ["data: a", ""]
    assert lines_sync([b"data: a\r", b"data: b"]) == ["data: a", "data: b"]
    assert lines_sync([b"a\r"]) == ["a"]


@pytest.mark.parametrize("size", [1, 2, 7, 64, 100_000])
def test_sync_and_async_lines_agree(size: int) -> None:
    body = SAMPLE * 50
    chunks = [body[i : i + size] for i in range(0, len(body), size)]
    assert lines_sync(chunks) == lines_async(chunks) == expected_lines(body)


def _endless(chunk: bytes) -> Iterator[bytes]:
    while True:
        yield chunk


def test_a_line_over_the_limit_is_refused_before_it_ends() -> None:
    reader = _reader(_endless(b"x" * 1000), Limits(max_event_bytes=4096))
    with pytest.raises(ProviderError) as caught:
        list(reader.lines())
    error = caught.value
    assert error.code == "llm.response_too_large"
    assert not error.retryable
    assert error.details["unit"] == "bytes"
    assert error.details["limit"] == 4096
    assert "a stream event" in error.message
    assert reader.reader.size <= 5000  # refused as it passed the limit, not at its end


def test_a_line_at_the_limit_passes_and_one_byte_more_does_not() -> None:
    limits = Limits(max_event_bytes=1024)
    assert lines_sync([b"a" * 1024 + b"\n"], limits) == ["a" * 1024]
    assert lines_sync([b"a" * 500, b"a" * 524, b"\r\n"], limits) == ["a" * 1024]
    data = b"data: " + b"a" * 1018
    assert lines_sync([data + b"\n\n"], limits) == [data.decode(), ""]
    for chunks in ([b"a" * 1025 + b"\n"], [b"a" * 1000, b"a" * 25, b"\n"], [b"a" * 1025]):
        with pytest.raises(ProviderError) as caught:
            lines_sync(chunks, limits)
        assert caught.value.details["received"] == 1025


def test_an_sse_event_over_the_limit_is_refused_whatever_its_lines() -> None:
    limits = Limits(max_event_bytes=4096)
    data = b"data: " + b"d" * 500 + b"\n"
    # 10 data lines of one event: over 4 KiB together
    with pytest.raises(ProviderError) as caught:
        lines_sync([data * 10 + b"\n"], limits)
    assert caught.value.code == "llm.response_too_large"
    assert caught.value.details["limit"] == 4096
    # the same lines as 10 events: each well within
    assert len(lines_sync([(data + b"\n") * 10], limits)) == 20
    # NDJSON lines are events of their own, however many
    ndjson = b'{"message": {"content": "' + b"n" * 500 + b'"}}\n'
    assert len(lines_sync([ndjson * 100], limits)) == 100


def test_the_event_limit_never_passes_the_response_limit() -> None:
    with pytest.raises(ProviderError) as caught:
        lines_sync([b"z" * 3000], Limits(max_response_bytes=2048))
    assert caught.value.details["limit"] == 2048


def test_the_event_limit_comes_from_the_environment() -> None:
    assert Limits().max_event_bytes == 4 * MiB
    assert Limits.from_env({}).max_event_bytes == 4 * MiB
    assert Limits.from_env({"FLUID_LLM_MAX_EVENT_BYTES": "65536"}).max_event_bytes == 65536
    assert Limits.from_env({"FLUID_LLM_MAX_EVENT_BYTES": "10"}).max_event_bytes == 1024
    assert Limits.from_env({"FLUID_LLM_MAX_EVENT_BYTES": "junk"}).max_event_bytes == 4 * MiB
    small = {"FLUID_LLM_MAX_RESPONSE_BYTES": "100000", "FLUID_LLM_MAX_EVENT_BYTES": "200000"}
    assert Limits.from_env(small).max_event_bytes == 100_000


def _seconds_per_mib(mib: int) -> float:
    chunk = b"y" * 4096
    limits = Limits(max_response_bytes=64 * MiB, max_event_bytes=64 * MiB)  # never reached
    best = float("inf")
    # CPU time of this process, the best of 5: other processes on a loaded machine (a CI
    # run beside other work) stretch the wall clock, not this (the quadratic join is 6x).
    for _ in range(5):
        chunks = itertools.repeat(chunk, mib * MiB // len(chunk))
        started = time.process_time()
        (line,) = lines_sync(chunks, limits)
        best = min(best, time.process_time() - started)
        assert len(line) == mib * MiB
    return best / mib


def test_splitting_an_endless_line_is_linear() -> None:
    """The quadratic join cost 0.18, 0.34, 0.68, 1.35 s per MiB at 1, 2, 4, 8 MiB."""
    per_mib = {mib: _seconds_per_mib(mib) for mib in (1, 2, 4, 8)}
    assert per_mib[8] < 3 * per_mib[1], per_mib
