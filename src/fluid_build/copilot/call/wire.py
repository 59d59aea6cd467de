"""Reading an answer off the wire within one deadline and a size limit.

httpx's timeouts are per read: a server that drips one byte a second never
trips them. Here every read of one call shares a deadline on a monotonic
clock (each request's timeouts shrink to what is left, and the deadline is
checked after every chunk), and every byte is counted after decompression
as it arrives, so a compression bomb stops at the limit instead of
inflating whole. Past either: a typed error saying what was reached.
"""

from __future__ import annotations

import codecs
import json
import math
import re
import time
import zlib
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

import httpx

from fluid_build.config import env_float, env_int
from fluid_build.copilot.agents.errors import ProviderError, ProviderTimeoutError

__all__ = [
    "ACCEPT_ENCODING",
    "DEFAULT_DEADLINE",
    "Deadline",
    "Limits",
    "StreamReader",
    "aread_body",
    "deadline_from_env",
    "decode_json",
    "read_body",
]

#: The encodings a request accepts: those the size limit can count as they inflate.
ACCEPT_ENCODING: Final = "gzip, deflate"

#: The bound on one whole call when neither ``deadline=`` nor
#: ``FLUID_LLM_DEADLINE_SECONDS`` says otherwise: three attempts of the
#: default 120 s timeout, plus the waits between them.
DEFAULT_DEADLINE: Final = 600.0

#: Only the start of an error answer is read: enough for any provider's JSON.
ERROR_BODY_LIMIT: Final = 64 * 1024

_MiB: Final = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Limits:
    """How much of an answer is read. ``FLUID_LLM_MAX_RESPONSE_BYTES``, ``..._STREAM_EVENTS``."""

    max_response_bytes: int = 32 * _MiB  # one answer, decompressed; a stream's bytes too
    max_stream_events: int = 10_000

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Limits:
        return cls(
            max_response_bytes=env_int(
                env, "FLUID_LLM_MAX_RESPONSE_BYTES", 32 * _MiB, minimum=1024, maximum=2**34
            ),
            max_stream_events=env_int(
                env, "FLUID_LLM_MAX_STREAM_EVENTS", 10_000, minimum=1, maximum=10_000_000
            ),
        )


def deadline_from_env(env: Mapping[str, str]) -> float:
    value = env_float(
        env, "FLUID_LLM_DEADLINE_SECONDS", DEFAULT_DEADLINE, minimum=1.0, maximum=86_400.0
    )
    return DEFAULT_DEADLINE if value is None else value


class Deadline:
    """One call's deadline on a monotonic clock, and who to blame when it passes."""

    __slots__ = ("bound", "clock", "ends", "model", "provider", "seconds", "started")

    def __init__(
        self,
        seconds: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        provider: str | None = None,
        model: str | None = None,
        started: float | None = None,
    ) -> None:
        self.seconds = seconds
        self.clock = clock
        self.started = clock() if started is None else started
        self.ends = self.started + seconds
        self.provider = provider
        self.model = model
        self.bound: float | None = None  # sooner, while the call is a half-open trial

    def narrow(self, bound: float | None) -> None:
        """End the reads by ``bound`` (on ``clock``) too; None lifts it."""
        self.bound = bound

    def of(self, provider: str, model: str) -> Deadline:
        """The same deadline, blaming another provider (a fallback entry)."""
        return Deadline(
            self.seconds, clock=self.clock, provider=provider, model=model, started=self.started
        )

    def left(self) -> float:
        return self._ends() - self.clock()

    def _ends(self) -> float:
        # A half-open trial's attempt ends sooner: inside its lease.
        return self.ends if self.bound is None else min(self.ends, self.bound)

    def timeout(self, per_attempt: float) -> float:
        """The request's timeouts (connect, read, write, pool; seconds): the attempt's own,
        never past the deadline. A float, which httpx makes its one ``Timeout`` of."""
        left = max(self.left(), 0.001)
        return min(per_attempt, left)

    def passed(self, where: str, **details: Any) -> ProviderTimeoutError:
        who = self.provider or "provider"
        if self.model:
            who += f" ({self.model})"
        return ProviderTimeoutError(
            f"{who}: the call's {self.seconds:g} s deadline passed while waiting for {where}",
            provider=self.provider,
            model=self.model,
            code="llm.deadline_exceeded",
            retryable=False,
            details={"deadline": self.seconds, "reached": where, **details},
        )

    def check(self, where: str, **details: Any) -> None:
        if self.clock() >= self._ends():
            raise self.passed(where, **details)


def too_large(
    what: str, limit: int, unit: str, *, provider: str | None, model: str | None, **details: Any
) -> ProviderError:
    who = provider or "provider"
    return ProviderError(
        f"{who} sent {what} over the {limit:,} {unit} limit; stopped reading there",
        provider=provider,
        model=model,
        code="llm.response_too_large",
        retryable=False,
        details={"limit": limit, "unit": unit, **details},
    )


class _Inflate:
    """Decompress as bytes arrive, never producing more than the room left."""

    def __init__(self, encoding: str) -> None:
        enc = encoding.strip().lower()
        self._deflate = enc == "deflate"
        self._zlib: Any = None
        if enc in ("gzip", "x-gzip"):
            self._zlib = zlib.decompressobj(zlib.MAX_WBITS | 16)
        elif self._deflate:
            self._zlib = zlib.decompressobj()
        elif enc not in ("", "identity"):
            raise ValueError(enc)

    def feed(self, raw: bytes, room: int) -> bytes:
        """Up to ``room + 1`` decompressed bytes of ``raw`` (one more says: over the limit)."""
        if self._zlib is None:
            return raw[: room + 1]
        try:
            out = self._zlib.decompress(raw, room + 1)
        except zlib.error:
            if not self._deflate:
                raise
            # "deflate" that is raw DEFLATE without the zlib header, as some servers send
            self._deflate = False
            self._zlib = zlib.decompressobj(-zlib.MAX_WBITS)
            out = self._zlib.decompress(raw, room + 1)
        self._deflate = False  # decided on the first bytes
        return bytes(out)


def _source(response: httpx.Response) -> tuple[_Inflate | None, bool]:
    """Our own bounded inflater for gzip and deflate (None where httpx's bytes will do),
    and whether to read the raw bytes (ours to inflate, or nothing to inflate at all)."""
    if response.is_stream_consumed:
        return None, False  # already in memory (a mock, a replay): httpx serves its bytes
    headers = response.headers
    if "content-encoding" not in headers:  # the common case, without Headers.get's KeyError
        return None, True
    encoding = headers["content-encoding"].strip().lower()
    if encoding in ("", "identity"):
        return None, True
    try:
        return _Inflate(encoding), True
    except ValueError:
        return None, False  # br, zstd: httpx decodes; counted per decoded chunk


def _undecoded(response: httpx.Response) -> httpx.Headers:
    headers = httpx.Headers(response.headers)
    for name in ("content-encoding", "content-length", "transfer-encoding"):
        headers.pop(name, None)
    return headers


class _Reader:
    """Counts, bounds and inflates the chunks of one body; the shared half of sync and async."""

    def __init__(
        self,
        response: httpx.Response,
        deadline: Deadline,
        limit: int,
        where: str,
        *,
        truncate: bool = False,
    ) -> None:
        self.inflate, self.raw = _source(response)
        self.deadline = deadline
        self.limit = limit
        self.where = where
        self.truncate = truncate
        self.size = 0
        self.done = False

    def take(self, chunk: bytes) -> bytes:
        if self.inflate is not None:
            chunk = self.inflate.feed(chunk, self.limit - self.size)
        self.size += len(chunk)
        if self.size > self.limit:
            if not self.truncate:
                raise too_large(
                    "an answer",
                    self.limit,
                    "bytes",
                    provider=self.deadline.provider,
                    model=self.deadline.model,
                    received=self.size,
                )
            chunk = chunk[: len(chunk) - (self.size - self.limit)]
            self.size = self.limit
            self.done = True
        if self.deadline.left() <= 0:
            raise self.deadline.passed(self.where, received_bytes=self.size)
        return chunk


def _chunks(response: httpx.Response, reader: _Reader) -> Iterator[bytes]:
    for chunk in response.iter_raw() if reader.raw else response.iter_bytes():
        yield reader.take(chunk)
        if reader.done:
            return


async def _achunks(response: httpx.Response, reader: _Reader) -> AsyncIterator[bytes]:
    async for chunk in response.aiter_raw() if reader.raw else response.aiter_bytes():
        yield reader.take(chunk)
        if reader.done:
            return


def _finish(
    response: httpx.Response, body: bytes, *, error: bool, reader_inflated: bool
) -> httpx.Response:
    """The answer as a plain, already-read response (what classification and parsing read)."""
    if error:
        done = httpx.Response(
            response.status_code,
            headers=_undecoded(response),
            content=body,
            request=response.request,
        )
        raise httpx.HTTPStatusError(
            f"HTTP {response.status_code}", request=response.request, response=done
        )
    if reader_inflated is False:
        # The hot path: nothing to decode, or httpx decoded the bytes itself,
        # so the body is exactly what ``response.read()`` would have kept. Keep
        # it the way ``read()`` does instead of building a second response.
        response._content = body
        return response
    return httpx.Response(
        response.status_code, headers=_undecoded(response), content=body, request=response.request
    )


def _body_reader(response: httpx.Response, deadline: Deadline, limits: Limits) -> _Reader:
    """The bounded reader of a whole body: an error answer's only up to 64 KiB."""
    error = response.is_error
    return _Reader(
        response,
        deadline,
        ERROR_BODY_LIMIT if error else limits.max_response_bytes,
        "the error body" if error else "the body",
        truncate=error,
    )


def read_body(response: httpx.Response, deadline: Deadline, limits: Limits) -> httpx.Response:
    """Read a streamed response within the deadline and the size limit; raise for an error status.

    An error answer is read only up to 64 KiB (enough for any provider's
    JSON) and raised as :class:`httpx.HTTPStatusError` for classification.
    """
    reader = _body_reader(response, deadline, limits)
    body = b"".join(_chunks(response, reader))
    return _finish(
        response, body, error=reader.truncate, reader_inflated=reader.inflate is not None
    )


async def aread_body(
    response: httpx.Response, deadline: Deadline, limits: Limits
) -> httpx.Response:
    """:func:`read_body`, awaited."""
    reader = _body_reader(response, deadline, limits)
    body = b"".join([chunk async for chunk in _achunks(response, reader)])
    return _finish(
        response, body, error=reader.truncate, reader_inflated=reader.inflate is not None
    )


_LINE_END: Final = re.compile(r"\r\n|\r|\n")


class _Lines:
    """Text lines of a byte stream (``\\r\\n``, ``\\r`` or ``\\n``), split as chunks arrive."""

    def __init__(self) -> None:
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.pending = ""

    def feed(self, chunk: bytes, final: bool = False) -> list[str]:
        text = self.pending + self.decoder.decode(chunk, final)
        hold = ""
        if not final and text.endswith("\r"):  # maybe the first half of "\r\n": wait
            text, hold = text[:-1], "\r"
        parts = _LINE_END.split(text)
        if final:
            self.pending = ""
            if parts and parts[-1] == "":
                parts.pop()
            return parts
        self.pending = parts.pop() + hold
        return parts


class StreamReader:
    """One stream's lines and events, within the deadline, the byte limit and the event limit."""

    def __init__(self, response: httpx.Response, deadline: Deadline, limits: Limits) -> None:
        self.response = response
        self.reader = _Reader(response, deadline, limits.max_response_bytes, "stream event 1")
        self.max_events = limits.max_stream_events
        self.events = 0

    def lines(self) -> Iterator[str]:
        lines = _Lines()
        for chunk in _chunks(self.response, self.reader):
            yield from lines.feed(chunk)
        yield from lines.feed(b"", final=True)

    async def alines(self) -> AsyncIterator[str]:
        lines = _Lines()
        async for chunk in _achunks(self.response, self.reader):
            for line in lines.feed(chunk):
                yield line
        for line in lines.feed(b"", final=True):
            yield line

    def _counted(self) -> None:
        self.events += 1
        if self.events > self.max_events:
            deadline = self.reader.deadline
            raise too_large(
                "a stream",
                self.max_events,
                "events",
                provider=deadline.provider,
                model=deadline.model,
                received_bytes=self.reader.size,
            )
        self.reader.where = f"stream event {self.events + 1}"

    def counted(self, chunks: Iterator[Any]) -> Iterator[Any]:
        for chunk in chunks:
            self._counted()
            yield chunk

    async def acounted(self, chunks: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for chunk in chunks:
            self._counted()
            yield chunk


def decode_json(body: bytes, *, provider: str | None, model: str | None, status: int) -> Any:
    """JSON of an answer; garbage or absurd nesting is ``llm.malformed_response``, not a crash."""
    try:
        return _json_loads(body)
    except (ValueError, RecursionError) as exc:
        what = "nests too deeply" if isinstance(exc, RecursionError) else "is not JSON"
        raise ProviderError(
            f"{provider or 'provider'} answered HTTP {status} with a body that {what}",
            provider=provider,
            model=model,
            status_code=status,
            code="llm.malformed_response",
            retryable=True,
        ) from None


def _json_loads(body: bytes) -> Any:
    value = json.loads(body)
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("not a finite number")
    return value
