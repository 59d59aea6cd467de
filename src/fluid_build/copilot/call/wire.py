"""Reading an answer off the wire within one deadline and a size limit.

httpx's timeouts are per read: a server that drips one byte a second never
trips them. Here every read of one call shares a deadline on a monotonic
clock (each request's timeouts shrink to what is left, and the deadline is
checked after every chunk), and every byte is counted after decompression
as it arrives, so a compression bomb stops at the limit instead of
inflating whole. Past either: a typed error saying what was reached.
"""

from __future__ import annotations

import json
import math
import time
import zlib
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

import httpx

from fluid_build.config import env_float, env_int
from fluid_build.copilot.agents.errors import ProviderError, ProviderTimeoutError
from fluid_build.copilot.call.seams import is_own_body

__all__ = [
    "ACCEPT_ENCODING",
    "DEFAULT_DEADLINE",
    "Deadline",
    "Limits",
    "StreamReader",
    "ainflated",
    "aread_body",
    "deadline_from_env",
    "decode_json",
    "inflated",
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
    """How much of an answer is read. ``FLUID_LLM_MAX_RESPONSE_BYTES``, ``..._STREAM_EVENTS``,
    ``..._EVENT_BYTES``."""

    max_response_bytes: int = 32 * _MiB  # one answer, decompressed; a stream's bytes too
    max_stream_events: int = 10_000
    # One stream line, or one SSE event's data lines together; never more than the above.
    max_event_bytes: int = 4 * _MiB

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Limits:
        response = env_int(
            env, "FLUID_LLM_MAX_RESPONSE_BYTES", 32 * _MiB, minimum=1024, maximum=2**34
        )
        event = env_int(env, "FLUID_LLM_MAX_EVENT_BYTES", 4 * _MiB, minimum=1024, maximum=2**34)
        return cls(
            max_response_bytes=response,
            max_stream_events=env_int(
                env, "FLUID_LLM_MAX_STREAM_EVENTS", 10_000, minimum=1, maximum=10_000_000
            ),
            max_event_bytes=min(event, response),
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


#: The codings the bounded inflater undoes (all that a request asks for): zlib's window bits.
_CODINGS: Final = {
    "gzip": zlib.MAX_WBITS | 16,
    "x-gzip": zlib.MAX_WBITS | 16,
    "deflate": zlib.MAX_WBITS,
}

#: The most codings one answer may stack (``gzip, gzip`` is two); a longer chain is refused.
MAX_ENCODING_LAYERS: Final = 4

#: The most one layer inflates at a time: what each layer holds, and how often the
#: deadline is checked while a bomb inflates.
_STEP: Final = _MiB


def _chain(value: str) -> list[int] | None:
    """The layers of a ``Content-Encoding`` value to undo, the last applied first (zlib
    window bits each; ``identity`` and empty entries left out), or None if one cannot be
    bounded (br, zstd, compress, anything unknown, or too many layers).

    A header given twice arrives joined with ", " (httpx's ``Headers``): one chain.
    """
    layers: list[int] = []
    for entry in value.split(","):
        coding = entry.strip().lower()
        if coding in ("", "identity"):
            continue
        bits = _CODINGS.get(coding)
        if bits is None or len(layers) == MAX_ENCODING_LAYERS:
            return None
        layers.append(bits)
    layers.reverse()
    return layers


class _Layer:
    """One coding of a chain: a zlib stream, and the input it has not inflated yet."""

    __slots__ = ("probe", "produced", "tail", "unzip")

    def __init__(self, bits: int) -> None:
        self.unzip: Any = zlib.decompressobj(bits)
        self.tail = b""  # input not inflated yet: at most one piece of the layer before
        self.produced = 0  # bytes inflated so far
        # A "deflate" layer until its zlib header has come whole: the bytes so far, to
        # start again as raw DEFLATE (no zlib header), which some servers send instead.
        self.probe: bytes | None = b"" if bits == zlib.MAX_WBITS else None

    def inflate(self, most: int) -> bytes:
        """Up to ``most`` (> 0) bytes inflated from the input held; b"": it needs more."""
        data, self.tail = self.tail, b""
        try:
            out = (
                self.unzip.decompress(data, most) if self.probe is None else self._probe(data, most)
            )
        except zlib.error as exc:
            raise httpx.DecodingError(f"the answer does not inflate: {exc}") from None
        self.tail = self.unzip.unconsumed_tail
        self.produced += len(out)
        return bytes(out)

    def _probe(self, data: bytes, most: int) -> bytes:
        seen = self.probe + data if self.probe else data
        try:
            out: bytes = self.unzip.decompress(data, most)
        except zlib.error:
            self.probe = None
            self.unzip = zlib.decompressobj(-zlib.MAX_WBITS)
            return bytes(self.unzip.decompress(seen, most))
        self.probe = seen if len(seen) < 2 else None  # two bytes: the header was good
        return out


class _Inflate:
    """Undo a chain of gzip and deflate layers as bytes arrive, layer by layer.

    Each layer inflates at most a step, and at most the room the limit leaves it
    (+ 1), at a time from what the layer before it gave, so memory stays a few
    steps a layer whatever the ratio. Every layer's inflated bytes count against
    the limit: an inner layer one past it sets ``over`` (and gives no more); the
    final layer's bytes are the reader's to count. Past a layer's end, what
    follows is dropped (as httpx does), never kept.
    """

    __slots__ = ("check", "ended", "last", "layers", "limit", "over")

    def __init__(self, chain: list[int], limit: int, check: Callable[[], None]) -> None:
        self.layers = [_Layer(bits) for bits in chain]
        self.last = len(chain) - 1
        self.limit = limit
        self.check = check  # raises once the deadline has passed
        self.over = 0  # the inflated bytes of an inner layer that passed the limit
        self.ended = False  # a layer's stream has ended: no more input is wanted

    def feed(self, raw: bytes, room: int) -> bytes:
        """Up to ``room + 1`` inflated bytes of ``raw`` (one more says: over the limit)."""
        if not self.ended:
            first = self.layers[0]
            first.tail = first.tail + raw if first.tail else raw
        want = room + 1
        pieces: list[bytes] = []
        while want > 0:
            piece = self._pull(self.last, min(want, _STEP))
            if not piece:
                break
            pieces.append(piece)
            want -= len(piece)
            self.check()
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    def _pull(self, i: int, most: int) -> bytes:
        """Up to ``most`` bytes of layer ``i``'s output; b"" once its input has run out."""
        layer = self.layers[i]
        if i != self.last:
            most = min(most, self.limit - layer.produced + 1)
            if most <= 0:  # never 0: to zlib that is no bound at all
                self.over = max(self.over, layer.produced)
                return b""
        while True:
            if layer.unzip.eof:
                if not self.ended:  # what the layers before would give is dropped anyway
                    self.ended = True
                    for before in self.layers[:i]:
                        before.tail = b""
                return b""
            out = layer.inflate(most)
            if out:
                if i != self.last and layer.produced > self.limit:
                    # Over: what was within the limit still goes on (an error answer's
                    # body is read up to the limit), then nothing more.
                    self.over = layer.produced
                    out = out[: len(out) - (layer.produced - self.limit)]
                return out
            if i == 0 or self.over:
                return b""
            self.check()
            layer.tail = self._pull(i - 1, _STEP)
            if not layer.tail:
                return b""


def _undecoded(response: httpx.Response) -> httpx.Headers:
    headers = httpx.Headers(response.headers)
    for name in ("content-encoding", "content-length", "transfer-encoding"):
        headers.pop(name, None)
    return headers


class _Reader:
    """Counts, bounds and inflates the chunks of one body; the shared half of sync and async."""

    __slots__ = (
        "deadline",
        "done",
        "inflate",
        "limit",
        "phase",
        "raw",
        "refused",
        "size",
        "status",
        "truncate",
        "where",
    )

    def __init__(
        self,
        response: httpx.Response,
        deadline: Deadline,
        limit: int,
        where: str,
        *,
        truncate: bool = False,
    ) -> None:
        self.deadline = deadline
        self.limit = limit
        self.where = where
        self.truncate = truncate
        self.size = 0
        self.done = False
        self.inflate: _Inflate | None = None
        self.refused: str | None = None  # a Content-Encoding no bounded inflater undoes
        # The attempt's phases (call/phases.py): each chunk that arrives restarts the idle wait.
        try:
            phase = response.request.extensions.get("fluid.phase")
        except RuntimeError:  # a response made without a request (a test's own)
            phase = None
        self.phase = phase
        # Read the raw bytes (ours to inflate, or nothing to inflate at all), unless they
        # are already in memory (a mock, a replay): then httpx serves what it holds.
        self.raw = not response.is_stream_consumed
        headers = response.headers
        if "content-encoding" in headers:  # the common case skips this, without a KeyError
            self.status = response.status_code
            self._encoded(headers["content-encoding"])

    def _encoded(self, value: str) -> None:
        chain = _chain(value)
        if chain is None:
            self.refused = value  # never handed to httpx's decoders: they have no bound
        elif chain and self.raw:
            self.inflate = _Inflate(chain, self.limit, self._check)
        # else identity only, or bytes httpx holds already decoded: they are only counted

    def refusal(self) -> ProviderError:
        value = self.refused or ""
        shown = value if len(value) <= 60 else value[:60] + "..."
        who = self.deadline.provider or "provider"
        return ProviderError(
            f"{who} answered HTTP {self.status} with Content-Encoding {shown!r}, which fluid "
            f"cannot inflate within its size limit (it asks for {ACCEPT_ENCODING!r} only, "
            f"at most {MAX_ENCODING_LAYERS} layers)",
            provider=self.deadline.provider,
            model=self.deadline.model,
            status_code=self.status,
            code="llm.malformed_response",
            retryable=False,
            details={"content_encoding": shown, "accepted_encodings": ACCEPT_ENCODING},
        )

    def _check(self) -> None:
        if self.deadline.left() <= 0:
            raise self.deadline.passed(self.where, received_bytes=self.size)

    def timed_out(self) -> None:
        """A read timed out: the deadline's error (with what arrived) if the deadline, not
        the attempt's own timeout, cut it short (the sync pool's reads end by it)."""
        if self.deadline.left() <= 0.05:
            raise self.deadline.passed(self.where, received_bytes=self.size) from None
        phase = self.phase
        if phase is not None:  # each read waits the phase's limit, and no longer
            raise phase.error(self.deadline.provider, self.deadline.model) from None

    def is_done(self) -> bool:
        return self.done

    def take(self, chunk: bytes) -> bytes:
        if self.phase is not None:
            self.phase.got(len(chunk))
        inflate = self.inflate
        if inflate is not None:
            chunk = inflate.feed(chunk, self.limit - self.size)
        self.size += len(chunk)
        if self.size > self.limit or (inflate is not None and inflate.over):
            chunk = self._over(chunk, inflate.over if inflate is not None else 0)
        if self.deadline.left() <= 0:
            raise self.deadline.passed(self.where, received_bytes=self.size)
        return chunk

    def _over(self, chunk: bytes, inner: int) -> bytes:
        """Past the limit (the answer, or an inner layer of its encoding: ``inner`` bytes):
        an error, or for an error answer's body, the end of what is read."""
        if not self.truncate:
            raise too_large(
                "an answer",
                self.limit,
                "bytes",
                provider=self.deadline.provider,
                model=self.deadline.model,
                received=max(self.size, inner),
            )
        if self.size > self.limit:
            chunk = chunk[: len(chunk) - (self.size - self.limit)]
            self.size = self.limit
        self.done = True
        return chunk


def _chunks(response: httpx.Response, reader: _Reader) -> Iterator[bytes]:
    if reader.refused is not None:
        if reader.truncate:
            return  # an error answer: its status and headers say what went wrong
        raise reader.refusal()
    try:
        for chunk in response.iter_raw() if reader.raw else response.iter_bytes():
            yield reader.take(chunk)
            if reader.done:
                return
    except httpx.TimeoutException:
        reader.timed_out()
        raise


async def _achunks(response: httpx.Response, reader: _Reader) -> AsyncIterator[bytes]:
    if reader.refused is not None:
        if reader.truncate:
            return  # an error answer: its status and headers say what went wrong
        raise reader.refusal()
    chunks: AsyncIterator[bytes]
    stream = response.stream
    if reader.raw and is_own_body(stream):
        # One of our own pools' bodies (call/seams.py DirectBody): its raw chunks, its faults
        # already named as httpx names them, without a layer of httpx's iterators.
        response.is_stream_consumed = True
        chunks = stream.__aiter__()
    else:
        chunks = response.aiter_raw() if reader.raw else response.aiter_bytes()
    try:
        async for chunk in chunks:
            yield reader.take(chunk)
            if reader.done:
                return
    except httpx.TimeoutException:
        reader.timed_out()
        raise


_KEEPS_CONTENT: bool | None = None


def _keeps_content() -> bool:
    """Whether this httpx keeps a read body in ``Response._content``, as 0.28 does (its
    ``read()`` sets it and ``content`` returns it): the one private name the call path
    writes, so it is checked once, on a probe, and the public path (a new response)
    taken wherever it does not hold."""
    global _KEEPS_CONTENT
    if _KEEPS_CONTENT is None:
        try:
            probe = httpx.Response(200, stream=httpx.ByteStream(b"{}"))
            probe._content = b'{"ok":1}'
            _KEEPS_CONTENT = probe.content == b'{"ok":1}' and probe.json() == {"ok": 1}
        except Exception:  # noqa: BLE001 - any other httpx: the public path
            _KEEPS_CONTENT = False
    return _KEEPS_CONTENT


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
    if reader_inflated is False and _keeps_content():
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


def inflated(response: httpx.Response, limit: int, deadline: Deadline) -> Iterator[bytes]:
    """A body's bytes as they arrive, through the one bounded inflater: every layer of
    its Content-Encoding counted against ``limit`` (past it: ``llm.response_too_large``),
    an encoding no bounded inflater undoes refused, the deadline checked as it goes.
    For readers other than the call path (``fluid corpus record``)."""
    return _chunks(response, _Reader(response, deadline, limit, "the body"))


def ainflated(response: httpx.Response, limit: int, deadline: Deadline) -> AsyncIterator[bytes]:
    """:func:`inflated`, async."""
    return _achunks(response, _Reader(response, deadline, limit, "the body"))


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
    stream = response.stream
    if reader.refused is None and reader.raw and is_own_body(stream):
        # One of our own pools' bodies (call/seams.py DirectBody): read in one loop, without the
        # two iterators of _achunks between (each call in flight holds their frames).
        response.is_stream_consumed = True
        try:
            body = await stream.fluid_read(reader.take, reader.is_done)
        except httpx.TimeoutException:
            reader.timed_out()
            raise
    else:
        body = b"".join([chunk async for chunk in _achunks(response, reader)])
    return _finish(
        response, body, error=reader.truncate, reader_inflated=reader.inflate is not None
    )


class _Lines:
    """Text lines of a byte stream (``\\r\\n``, ``\\r`` or ``\\n``), split as chunks arrive.

    Linear in the bytes: each chunk is searched once, and a line still open is
    kept as its parts until it ends. A line longer than ``limit`` bytes is
    refused as soon as it passes the limit, and so is an SSE event whose
    ``data`` lines (what :func:`~fluid_build.copilot.llm.base.iter_stream`
    joins into one event) add up to more.
    """

    __slots__ = ("cr", "event", "limit", "parts", "refuse", "size")

    def __init__(self, limit: int, refuse: Callable[[int], Exception]) -> None:
        self.limit = limit
        self.refuse = refuse  # the error for a line or event of so many bytes
        self.parts: list[bytes] = []  # the line still open
        self.size = 0  # its bytes
        self.event = 0  # the bytes of the SSE event's data lines so far
        self.cr = False  # the last chunk ended in "\r": a "\n" next is its other half

    def feed(self, chunk: bytes, final: bool = False) -> list[str]:
        if self.cr and chunk:
            self.cr = False
            if chunk[0] == 10:  # "\n"
                chunk = chunk[1:]
        lines = chunk.splitlines()  # on "\r\n", "\r" and "\n" only, bytes being bytes
        rest = b""
        if chunk.endswith((b"\n", b"\r")):
            self.cr = chunk[-1] == 13
        elif lines:
            rest = lines.pop()
        grown = self.size + len(chunk)
        if self.parts and lines:
            self.parts.append(lines[0])
            lines[0] = b"".join(self.parts)
            self.parts.clear()
            self.size = 0
        if rest:
            self.parts.append(rest)
            self.size += len(rest)
        if grown > self.limit:  # only then can a line, finished or not, be too long
            for line in lines:
                if len(line) > self.limit:
                    raise self.refuse(len(line))
            if self.size > self.limit:
                raise self.refuse(self.size)
        if final and self.parts:
            lines.append(b"".join(self.parts))
            self.parts.clear()
            self.size = 0
        return self._decoded(lines)

    def _decoded(self, lines: list[bytes]) -> list[str]:
        out = []
        event = self.event
        for line in lines:
            if not line:
                event = 0
            elif line.startswith(b"data"):  # the event joins their values, shorter
                event += len(line)
                if event > self.limit:
                    raise self.refuse(event)
            out.append(line.decode("utf-8", "replace"))
        self.event = event
        return out


class StreamReader:
    """One stream's lines and events, within the deadline, the byte limit and the event limit."""

    def __init__(self, response: httpx.Response, deadline: Deadline, limits: Limits) -> None:
        self.response = response
        self.reader = _Reader(response, deadline, limits.max_response_bytes, "stream event 1")
        self.max_events = limits.max_stream_events
        self.max_event_bytes = min(limits.max_event_bytes, limits.max_response_bytes)
        self.events = 0

    def _event_too_large(self, size: int) -> ProviderError:
        deadline = self.reader.deadline
        return too_large(
            "a stream event",
            self.max_event_bytes,
            "bytes",
            provider=deadline.provider,
            model=deadline.model,
            received=size,
            received_bytes=self.reader.size,
        )

    def lines(self) -> Iterator[str]:
        lines = _Lines(self.max_event_bytes, self._event_too_large)
        for chunk in _chunks(self.response, self.reader):
            yield from lines.feed(chunk)
        yield from lines.feed(b"", final=True)

    async def alines(self) -> AsyncIterator[str]:
        lines = _Lines(self.max_event_bytes, self._event_too_large)
        async for chunk in _achunks(self.response, self.reader):
            for line in lines.feed(chunk):
                yield line
        for line in lines.feed(b"", final=True):
            yield line

    def chunks(self) -> Iterator[bytes]:
        """The body's bytes as they arrive, bounded as :meth:`lines` bounds them (a binary
        stream: AWS event-stream frames, whose reader bounds each frame by
        :meth:`event_too_large`)."""
        return _chunks(self.response, self.reader)

    def achunks(self) -> AsyncIterator[bytes]:
        return _achunks(self.response, self.reader)

    def event_too_large(self, size: int) -> ProviderError:
        return self._event_too_large(size)

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
