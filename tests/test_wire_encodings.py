"""Every Content-Encoding chain inflates through one bounded inflater, or is refused.

Real bytes, no network: each answer is an ``httpx.Response`` over a byte
stream (sync or async) whose head says how its body is encoded, read by
``read_body`` / ``aread_body`` / ``StreamReader`` as a call reads one. A
stacked bomb (gzip of gzip of 1 GiB of zeros: under 3 KB) stops at the limit
with memory and CPU to match; encodings no bounded inflater undoes (br, zstd,
anything unknown, too many layers) are refused, never handed to httpx's own
decoders, which have no bound.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import threading
import time
import zlib
from collections.abc import AsyncIterator, Iterable, Iterator
from functools import cache
from typing import Any

import httpx
import pytest

from fluid_build.copilot.agents.errors import ProviderError, ProviderTimeoutError
from fluid_build.copilot.call.wire import (
    ERROR_BODY_LIMIT,
    Deadline,
    Limits,
    StreamReader,
    aread_body,
    read_body,
)
from tests.bombs import gzip_of_gzip

URL = "http://provider.test/v1/chat/completions"
MiB = 2**20
GiB = 2**30


# -- bodies ------------------------------------------------------------------------------


def packer(coding: str, raw: bool = False) -> Any:
    """A streaming compressor for one coding ("deflate" without its zlib header if raw)."""
    bits = {"gzip": zlib.MAX_WBITS | 16, "deflate": -zlib.MAX_WBITS if raw else zlib.MAX_WBITS}
    return zlib.compressobj(9, zlib.DEFLATED, bits[coding])


def encode(data: bytes, *codings: str, raw_deflate: bool = False) -> bytes:
    """``data`` with ``codings`` applied in order: the header value lists them the same way."""
    for coding in codings:
        pack = packer(coding, raw_deflate)
        data = pack.compress(data) + pack.flush()
    return data


@cache
def stacked_bomb(inflated: int = GiB) -> bytes:
    """gzip of gzip of ``inflated`` zero bytes (tests/bombs.py): under 3 KB for 1 GiB."""
    return gzip_of_gzip(inflated)


def pieces(body: bytes, size: int) -> list[bytes]:
    return [body[i : i + size] for i in range(0, len(body), size)] or [b""]


class SyncBytes(httpx.SyncByteStream):
    def __init__(self, chunks: Iterable[bytes]) -> None:
        self.chunks = chunks

    def __iter__(self) -> Iterator[bytes]:
        yield from self.chunks


class AsyncBytes(httpx.AsyncByteStream):
    def __init__(self, chunks: Iterable[bytes]) -> None:
        self.chunks = chunks

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk


def answer(
    chunks: Iterable[bytes],
    encoding: str | list[str] | None,
    *,
    status: int = 200,
    asynchronous: bool = False,
    content_type: str = "application/json",
) -> httpx.Response:
    """A response whose body streams ``chunks`` as they would come off the socket."""
    headers = [("content-type", content_type)]
    if isinstance(encoding, str):
        headers.append(("content-encoding", encoding))
    elif encoding is not None:
        headers += [("content-encoding", value) for value in encoding]  # the header, repeated
    stream: Any = AsyncBytes(chunks) if asynchronous else SyncBytes(chunks)
    return httpx.Response(
        status, headers=headers, stream=stream, request=httpx.Request("POST", URL)
    )


def read(response: httpx.Response, limits: Limits, deadline: Deadline | None = None) -> Any:
    """The body as ``read_body`` or ``aread_body`` reads it (as the response's stream is
    sync or async); whatever it raises is returned."""
    deadline = deadline or Deadline(30.0, provider="vllm", model="m")
    try:
        if isinstance(response.stream, httpx.AsyncByteStream):
            return asyncio.run(aread_body(response, deadline, limits)).content
        return read_body(response, deadline, limits).content
    except Exception as exc:
        return exc


SIDES = pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])


class Peak:
    """The resident set's growth over a block, sampled every few ms (``/proc/self/statm``)."""

    def __init__(self) -> None:
        self.page = os.sysconf("SC_PAGE_SIZE")
        self.start = self.now()
        self.peak = self.start
        self.running = True
        self.thread = threading.Thread(target=self.sample, daemon=True)

    def now(self) -> int:
        with open("/proc/self/statm", encoding="ascii") as statm:
            return int(statm.read().split()[1]) * self.page

    def sample(self) -> None:
        while self.running:
            self.peak = max(self.peak, self.now())
            time.sleep(0.002)  # noqa: real-sleep - a sampler's pace

    def __enter__(self) -> Peak:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.running = False
        self.thread.join()
        self.peak = max(self.peak, self.now())

    @property
    def growth_mib(self) -> float:
        return (self.peak - self.start) / MiB


# -- stacked bombs ----------------------------------------------------------------------------


@SIDES
@pytest.mark.parametrize(
    "encoding",
    ["gzip, gzip", ["gzip", "gzip"], "GZIP ,x-gzip", "gzip, identity, gzip"],
    ids=["joined", "header-twice", "case-and-x-gzip", "identity-between"],
)
def test_a_stacked_bomb_stops_at_the_limit_with_memory_to_match(
    encoding: str | list[str], asynchronous: bool
) -> None:
    bomb = stacked_bomb()
    assert len(bomb) < 4096  # a few KB...
    limits = Limits(max_response_bytes=8 * MiB)  # ...against 1 GiB, 128 times the limit
    with Peak() as memory:
        started = time.monotonic()
        error = read(answer(pieces(bomb, 512), encoding, asynchronous=asynchronous), limits)
        seconds = time.monotonic() - started
    assert isinstance(error, ProviderError), repr(error)
    assert error.code == "llm.response_too_large"
    assert not error.retryable
    assert error.details["received"] == 8 * MiB + 1  # counted inflated, stopped at once
    assert memory.growth_mib < 64, memory.growth_mib  # httpx's decoders: 2 GB and more
    assert seconds < 5.0


@SIDES
def test_a_stacked_bomb_under_the_default_limit_is_refused_too(asynchronous: bool) -> None:
    error = read(answer([stacked_bomb()], "gzip, gzip", asynchronous=asynchronous), Limits())
    assert isinstance(error, ProviderError)
    assert error.code == "llm.response_too_large"
    assert error.details["limit"] == 32 * MiB


def gzip_named(data: bytes, name: bytes) -> bytes:
    """A gzip member whose header carries a file name: header bytes that inflate to nothing."""
    pack = packer("deflate", raw=True)
    head = b"\x1f\x8b\x08\x08" + b"\0\0\0\0" + b"\x00\xff" + name + b"\0"
    tail = zlib.crc32(data).to_bytes(4, "little") + len(data).to_bytes(4, "little")
    return head + pack.compress(data) + pack.flush() + tail


def test_every_layer_counts_against_the_limit() -> None:
    """The outer layer inflates to 2 MiB (a gzip header's file name) that the inner one
    inflates to two bytes: the outer layer's bytes pass the limit, and that is refused."""
    inner = gzip_named(b"hi", b"n" * (2 * MiB))
    assert zlib.decompressobj(zlib.MAX_WBITS | 16).decompress(inner) == b"hi"
    body = encode(inner, "gzip")
    assert len(body) < 16384
    limits = Limits(max_response_bytes=MiB)
    error = read(answer(pieces(body, 4096), "gzip, gzip"), limits)
    assert isinstance(error, ProviderError), repr(error)
    assert error.code == "llm.response_too_large"
    assert error.details["received"] == MiB + 1
    # within the limit, the same chain reads exactly
    small = gzip_named(b"hi", b"n" * 1000)
    assert read(answer(pieces(encode(small, "gzip"), 100), "gzip, gzip"), limits) == b"hi"
    noise = os.urandom(300_000)
    assert read(answer(pieces(encode(noise, "gzip", "gzip"), 4096), "gzip, gzip"), limits) == noise


@SIDES
def test_a_bomb_cannot_hold_the_cpu_past_the_deadline(asynchronous: bool) -> None:
    """The whole bomb arrives in one chunk; the deadline is checked while it inflates."""
    ticks = itertools.count()
    deadline = Deadline(1.0, clock=lambda: next(ticks) * 0.1, provider="vllm", model="m")
    limits = Limits(max_response_bytes=2 * GiB)  # the limit alone would let it all inflate
    started = time.monotonic()
    with Peak() as memory:
        error = read(
            answer([stacked_bomb()], "gzip, gzip", asynchronous=asynchronous), limits, deadline
        )
    assert isinstance(error, ProviderTimeoutError), repr(error)
    assert error.code == "llm.deadline_exceeded"
    assert time.monotonic() - started < 2.0
    assert memory.growth_mib < 64, memory.growth_mib


@SIDES
def test_an_error_answer_with_a_stacked_bomb_is_read_up_to_64_kib(asynchronous: bool) -> None:
    response = answer(
        pieces(stacked_bomb(), 256), "gzip, gzip", status=400, asynchronous=asynchronous
    )
    with Peak() as memory:
        error = read(response, Limits())
    assert isinstance(error, httpx.HTTPStatusError), repr(error)
    assert error.response.status_code == 400
    assert error.response.content == b"\0" * ERROR_BODY_LIMIT
    assert "content-encoding" not in error.response.headers
    assert memory.growth_mib < 64


# -- chains that decode ---------------------------------------------------------------------

TEXT = b'{"choices": [{"message": {"content": "' + b"stacked layers, undone " * 400 + b'"}}]}'


@SIDES
@pytest.mark.parametrize(
    ("header", "applied", "raw_deflate"),
    [
        ("gzip, gzip", ("gzip", "gzip"), False),
        (["gzip", "gzip"], ("gzip", "gzip"), False),
        ("gzip, identity", ("gzip",), False),
        ("identity, gzip,", ("gzip",), False),
        ("deflate, gzip", ("deflate", "gzip"), False),
        ("deflate, gzip", ("deflate", "gzip"), True),
        ("gzip, deflate", ("gzip", "deflate"), False),
        ("deflate", ("deflate",), True),
        ("gzip, gzip, deflate, gzip", ("gzip", "gzip", "deflate", "gzip"), False),
        ("identity", (), False),
        ("", (), False),
    ],
    ids=[
        "gzip-gzip",
        "header-twice",
        "gzip-identity",
        "identity-gzip-empty",
        "deflate-gzip",
        "raw-deflate-gzip",
        "gzip-deflate",
        "raw-deflate",
        "four-layers",
        "identity",
        "empty",
    ],
)
@pytest.mark.parametrize("size", [1, 7, 4096], ids=lambda n: f"{n}B-chunks")
def test_a_stacked_answer_decodes_exactly(
    header: str | list[str],
    applied: tuple[str, ...],
    raw_deflate: bool,
    size: int,
    asynchronous: bool,
) -> None:
    body = encode(TEXT, *applied, raw_deflate=raw_deflate)
    response = answer(pieces(body, size), header, asynchronous=asynchronous)
    assert read(response, Limits()) == TEXT


@SIDES
def test_an_answer_exactly_at_the_limit_passes(asynchronous: bool) -> None:
    data = b"x" * 4096
    limits = Limits(max_response_bytes=4096)
    body = encode(data, "gzip", "gzip")
    assert read(answer([body], "gzip, gzip", asynchronous=asynchronous), limits) == data
    over = encode(data + b"x", "gzip", "gzip")
    error = read(answer([over], "gzip, gzip", asynchronous=asynchronous), limits)
    assert isinstance(error, ProviderError)
    assert error.code == "llm.response_too_large"


def test_bytes_after_the_end_of_a_layer_are_dropped_not_kept() -> None:
    body = encode(TEXT, "gzip", "gzip")
    garbage = (b"\x17" * 65536 for _ in range(512))  # 32 MiB after the end
    with Peak() as memory:
        assert read(answer(itertools.chain([body], garbage), "gzip, gzip"), Limits()) == TEXT
    assert memory.growth_mib < 16


@SIDES
def test_a_body_that_does_not_inflate_is_a_decoding_error(asynchronous: bool) -> None:
    error = read(answer([b"not gzip at all"], "gzip", asynchronous=asynchronous), Limits())
    assert isinstance(error, httpx.DecodingError), repr(error)
    inner = encode(b"not gzip inside", "gzip")[:-4] + b"\xff\xff\xff\xff"  # wrong CRC
    error = read(answer([encode(inner, "gzip")], "gzip, gzip", asynchronous=asynchronous), Limits())
    assert isinstance(error, httpx.DecodingError), repr(error)


# -- encodings no bounded inflater undoes ------------------------------------------------------


@SIDES
@pytest.mark.parametrize(
    "header",
    [
        "br",
        "zstd",
        "compress",
        "x-compress",
        "gzip, br",
        "br, gzip",
        ["gzip", "zstd"],
        "snappy",
        "gzip, gzip, gzip, gzip, gzip",
    ],
)
def test_an_encoding_it_cannot_bound_is_refused(
    header: str | list[str], asynchronous: bool
) -> None:
    response = answer([b"\x8b\x00whatever"], header, asynchronous=asynchronous)
    error = read(response, Limits())
    assert isinstance(error, ProviderError), repr(error)
    assert error.code == "llm.malformed_response"
    assert error.retryable is False
    assert error.status_code == 200
    shown = header if isinstance(header, str) else ", ".join(header)
    assert repr(shown) in error.message
    assert "'gzip, deflate'" in error.message
    assert error.details["content_encoding"] == shown


def test_a_long_encoding_is_shown_truncated() -> None:
    header = "br" + ", identity" * 500
    error = read(answer([b"x"], header), Limits())
    assert isinstance(error, ProviderError)
    assert error.code == "llm.malformed_response"
    assert len(error.details["content_encoding"]) <= 63
    assert len(error.message) < 400


@SIDES
def test_an_error_answer_in_an_encoding_it_cannot_bound_is_classified_by_its_status(
    asynchronous: bool,
) -> None:
    """Its body is not read: the status (and headers, such as Retry-After) still count."""
    response = answer([b"\x1b\x00brotli"], "br", status=429, asynchronous=asynchronous)
    error = read(response, Limits())
    assert isinstance(error, httpx.HTTPStatusError), repr(error)
    assert error.response.status_code == 429
    assert error.response.content == b""


# -- bodies already in memory (a mock, a replay) -----------------------------------------------


def test_an_answer_already_in_memory_is_counted_as_httpx_holds_it() -> None:
    # httpx inflated it when the response was made (its decoders, the mock's doing): what
    # it holds is the answer, counted against the limit like any other.
    held = httpx.Response(
        200,
        content=encode(TEXT, "gzip", "gzip"),
        headers={"content-encoding": "gzip, gzip"},
        request=httpx.Request("POST", URL),
    )
    assert held.is_stream_consumed
    assert read(held, Limits()) == TEXT
    error = read(held, Limits(max_response_bytes=1024))
    assert isinstance(error, ProviderError)
    assert error.code == "llm.response_too_large"


def test_an_answer_in_memory_in_an_encoding_it_cannot_bound_is_refused_the_same() -> None:
    held = httpx.Response(
        200, content=b"raw", headers={"content-encoding": "br"}, request=httpx.Request("POST", URL)
    )
    error = read(held, Limits())
    assert isinstance(error, ProviderError)
    assert error.code == "llm.malformed_response"


def test_a_mock_transport_answer_reads_the_same() -> None:
    body = encode(TEXT, "deflate", "gzip")

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=body, headers={"content-encoding": "deflate, gzip"})

    with httpx.Client(transport=httpx.MockTransport(handler)) as pool:
        response = pool.send(pool.build_request("POST", URL), stream=True)
        assert read(response, Limits()) == TEXT


# -- streams ------------------------------------------------------------------------------------

EVENTS = b"".join(
    b'data: {"choices": [{"index": 0, "delta": {"content": "%d"}}]}\r\n\r\n' % i for i in range(200)
)


def lines_of(response: httpx.Response, limits: Limits) -> list[str]:
    reader = StreamReader(response, Deadline(30.0, provider="vllm", model="m"), limits)
    if isinstance(response.stream, httpx.AsyncByteStream):

        async def collect() -> list[str]:
            return [line async for line in reader.alines()]

        return asyncio.run(collect())
    return list(reader.lines())


@SIDES
@pytest.mark.parametrize("size", [1, 13, 4096])
def test_a_stacked_gzip_stream_gives_its_lines(size: int, asynchronous: bool) -> None:
    body = encode(EVENTS, "gzip", "gzip")
    response = answer(
        pieces(body, size),
        "gzip, gzip",
        asynchronous=asynchronous,
        content_type="text/event-stream",
    )
    expected = EVENTS.decode().split("\r\n")[:-1]
    assert lines_of(response, Limits()) == expected


@SIDES
def test_a_stacked_bomb_stream_stops_at_a_limit(asynchronous: bool) -> None:
    response = answer(
        pieces(stacked_bomb(), 512),
        "gzip, gzip",
        asynchronous=asynchronous,
        content_type="text/event-stream",
    )
    with Peak() as memory, pytest.raises(ProviderError) as caught:
        lines_of(response, Limits(max_response_bytes=8 * MiB, max_event_bytes=MiB))
    assert caught.value.code == "llm.response_too_large"
    assert memory.growth_mib < 64


@SIDES
def test_a_stream_in_an_encoding_it_cannot_bound_is_refused(asynchronous: bool) -> None:
    response = answer([EVENTS], "br", asynchronous=asynchronous, content_type="text/event-stream")
    with pytest.raises(ProviderError) as caught:
        lines_of(response, Limits())
    assert caught.value.code == "llm.malformed_response"
    assert caught.value.retryable is False


def test_same_lines_whatever_the_chunking() -> None:
    body = encode(EVENTS, "gzip", "deflate")
    expected = lines_of(answer([body], "gzip, deflate"), Limits())
    for size in (1, 2, 3, 5, 64, 1000):
        assert lines_of(answer(pieces(body, size), "gzip, deflate"), Limits()) == expected
        assert (
            lines_of(answer(pieces(body, size), "gzip, deflate", asynchronous=True), Limits())
            == expected
        )


# -- helpers, checked -----------------------------------------------------------------------------


def test_the_bomb_is_what_it_says() -> None:
    bomb = stacked_bomb()
    once = zlib.decompressobj(zlib.MAX_WBITS | 16).decompress(bomb)
    assert len(once) < 2 * MiB  # the inner layer: about 1 MB of gzip
    twice = zlib.decompressobj(zlib.MAX_WBITS | 16)
    out = twice.decompress(once, 4 * MiB)
    assert out == b"\0" * (4 * MiB)
    assert twice.unconsumed_tail  # and far more to come
