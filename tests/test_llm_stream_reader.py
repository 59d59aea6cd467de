"""iter_stream and aiter_stream read SSE and NDJSON bodies alike, chunk for chunk."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

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
