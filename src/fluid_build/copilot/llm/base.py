"""What every provider adapter does: build a request, read an answer, read a stream.

Adapters are pure: they turn a :class:`CallSpec` into method, URL, headers and
JSON, and provider JSON back into text, tool calls and usage. The client does
the I/O, the retries and the validation. The vocabulary an adapter declares its
answer's shape with is :mod:`fluid_build.copilot.llm.answer_shape`'s (its names
stay importable from here).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Final, Literal, NamedTuple

from fluid_build.copilot.agents.errors import ProviderError
from fluid_build.copilot.llm.answer_shape import (
    COUNT,
    NULL,
    TEXT,
    Shape,
    first_wrong_field,
    text_of,
)
from fluid_build.copilot.llm.types import CallSpec, StreamEvent, ToolCall, Usage

if TYPE_CHECKING:
    from fluid_build.copilot.llm.credentials import RequestAuth

__all__ = [
    "COUNT",
    "NULL",
    "TEXT",
    "Adapter",
    "ModelsRequest",
    "Parsed",
    "ProviderConfig",
    "Request",
    "StreamState",
    "aiter_frames",
    "aiter_stream",
    "first_wrong_field",
    "function_calls",
    "iter_frames",
    "iter_stream",
    "loads_arguments",
    "merge_body",
    "sampling_fields",
    "set_headers",
    "text_of",
    "unsupported_option",
]

#: The call options an adapter maps to a field of its own (``Adapter.supported_options``).
#: ``extra_body`` and ``extra_headers`` go to every provider and are not listed.
SAMPLING_OPTIONS: Final = frozenset(
    {
        "temperature",
        "top_p",
        "stop",
        "seed",
        "max_output_tokens",
        "tool_choice",
        "parallel_tool_calls",
        "reasoning_effort",
    }
)


def unsupported_option(provider: str, model: str, refused: Mapping[str, str]) -> ProviderError:
    """``llm.unsupported_option`` naming every option of ``refused`` (option -> why), the
    provider and the model; not retryable (another entry of a chain may take the call)."""
    option, why = next(iter(refused.items()))
    each = ", ".join(f"{name}= ({reason})" for name, reason in refused.items())
    them = "it" if len(refused) == 1 else "them"
    return ProviderError(
        f"{provider}:{model} cannot take {each}; remove {them}, or pass "
        f"drop_unsupported=True to send the call without {them}",
        provider=provider,
        model=model,
        code="llm.unsupported_option",
        retryable=False,
        details={"option": option, "options": sorted(refused), "reason": why},
    )


def sampling_fields(spec: CallSpec, names: Mapping[str, str]) -> dict[str, Any]:
    """The spec's sampling options that are set, each under the provider's name for it.

    ``names``: option (``temperature``, ``top_p``, ``stop``, ``seed``) -> the provider's
    field; an option not in it is not sent here. ``stop`` goes as a list. An option not
    set is left out, so a call without options sends the body it always did.
    """
    out: dict[str, Any] = {}
    for option, name in names.items():
        value = getattr(spec, option)
        if value is not None and value != ():
            out[name] = list(value) if option == "stop" else value
    return out


def merge_body(body: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """``body`` with ``extra`` merged in last, key by key, in place.

    A nested object in ``extra`` adds to the one already in ``body`` (its keys win),
    so ``{"generationConfig": {"responseLogprobs": True}}`` keeps the temperature
    and schema the adapter put there; anything else (a list, a number, None)
    replaces what was there. ``extra``'s own objects are copied, never shared.
    """
    for key, value in extra.items():
        mine = body.get(key)
        if isinstance(value, Mapping) and isinstance(mine, dict):
            body[key] = merge_body(dict(mine), value)
        elif isinstance(value, Mapping):
            body[key] = merge_body({}, value)
        else:
            body[key] = value
    return body


def set_headers(headers: dict[str, str], extra: Mapping[str, str]) -> dict[str, str]:
    """``headers`` with ``extra`` (a call's ``extra_headers``) set last, in place: a name
    already there in any case is replaced, never sent twice."""
    for name, value in extra.items():
        for mine in [k for k in headers if k.lower() == name.lower()]:
            del headers[mine]
        headers[name] = value
    return headers


@dataclass(frozen=True, slots=True)
class ProviderConfig:
    """Where and how to reach one provider. ``repr`` never shows the key."""

    provider: str
    model: str
    api_key: str | None = field(default=None, repr=False)
    base_url: str | None = None
    timeout: float = 120.0
    api_version: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    #: The cloud region requests are signed for (Bedrock's SigV4), when the provider has one.
    region: str | None = None


@dataclass(frozen=True, slots=True)
class Request:
    """What an adapter builds: the call encodes ``json`` once (call/encode.py), then
    ``auth``, the credential step (None: the key, if any, is a plain header), adds its
    headers to the request whose bytes are the ones sent (llm/credentials.py)."""

    method: str
    url: str
    headers: dict[str, str]
    json: dict[str, Any]
    auth: RequestAuth | None = None


class ModelsRequest(NamedTuple):
    """The GET listing the models a key may use (``fluid ai setup --check``)."""

    url: str
    headers: dict[str, str]
    params: dict[str, str | int]


@dataclass(slots=True)
class Parsed:
    text: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    finish_reason: str | None = None
    model: str | None = None
    #: ``Completion.details``: what the provider said about the answer beside its text.
    details: dict[str, Any] = field(default_factory=dict)


def loads_arguments(raw: Any) -> dict[str, Any]:
    """Tool-call arguments as a dict: JSON text is decoded, garbage kept under ``_raw``."""
    if isinstance(raw, dict):
        return raw
    if raw is None or raw == "":
        return {}
    try:
        value = json.loads(raw)
    except (TypeError, ValueError):
        return {"_raw": str(raw)}
    return value if isinstance(value, dict) else {"_value": value}


def function_calls(message: dict[str, Any]) -> list[ToolCall]:
    """A message's ``tool_calls`` as OpenAI and Ollama send them: ``{id, function}`` each."""
    return [
        ToolCall(
            id=str(call.get("id") or f"call_{i}"),
            name=str((call.get("function") or {}).get("name") or ""),
            arguments=loads_arguments((call.get("function") or {}).get("arguments")),
        )
        for i, call in enumerate(message.get("tool_calls") or [])
    ]


@dataclass(slots=True)
class StreamState:
    """What a stream has delivered so far; attached to the error if it breaks."""

    text: list[str] = field(default_factory=list)
    calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    usage: Usage = field(default_factory=Usage)
    finish_reason: str | None = None
    model: str | None = None
    # The provider said the answer is over (each adapter's ``stream_end``; SSE's [DONE] is
    # marked by call/core.py's reader): a stream that ends without it was cut.
    done: bool = False
    block_kinds: dict[int, str] = field(default_factory=dict)  # an adapter's per-block notes
    counts: dict[str, int] = field(default_factory=dict)  # raw usage counts seen so far
    refusal: list[str] = field(default_factory=list)  # a refusal's words, apart from the text
    details: dict[str, Any] = field(default_factory=dict)  # Completion.details, as they arrive

    def add_text(self, delta: str) -> StreamEvent | None:
        if not delta:
            return None
        self.text.append(delta)
        return StreamEvent(type="text", text=delta)

    def add_call(
        self,
        index: int,
        *,
        id: str | None = None,
        name: str | None = None,
        arguments_delta: str = "",
    ) -> StreamEvent:
        call = self.calls.setdefault(index, {"id": None, "name": None, "args": []})
        if id:
            call["id"] = id
        if name:
            call["name"] = name
        if arguments_delta:
            call["args"].append(arguments_delta)
        return StreamEvent(
            type="tool_call",
            index=index,
            id=call["id"],
            name=call["name"],
            arguments_delta=arguments_delta,
        )

    def tool_calls(self, *, complete_only: bool = False) -> list[ToolCall]:
        out = []
        for index in sorted(self.calls):
            call = self.calls[index]
            raw = "".join(call["args"])
            if complete_only:
                try:
                    json.loads(raw or "{}")
                except ValueError:
                    continue  # its arguments had not finished arriving
            out.append(
                ToolCall(
                    id=call["id"] or f"call_{index}",
                    name=call["name"] or "",
                    arguments=loads_arguments(raw),
                )
            )
        return out

    def partial(self) -> dict[str, Any]:
        """For an interrupted stream: the text so far and the tool calls that completed."""
        return {
            "partial_text": "".join(self.text),
            "tool_calls": [c.model_dump() for c in self.tool_calls(complete_only=True)],
        }

    def parsed(self) -> Parsed:
        return Parsed(
            "".join(self.text),
            self.tool_calls(),
            self.usage,
            self.finish_reason,
            self.model,
            self.details,
        )


class Adapter:
    """One provider's wire format. Subclasses override the hooks they need."""

    provider: ClassVar[str] = "provider"
    #: How a stream is framed: SSE or NDJSON lines, or AWS event-stream binary frames.
    stream_format: ClassVar[Literal["sse", "ndjson", "eventstream"]] = "sse"
    #: What ends this provider's stream, as an error message names it.
    stream_end: ClassVar[str] = "its end marker"
    #: Where requests go when no base URL is configured (None: one must be).
    default_base_url: ClassVar[str | None] = None
    #: The fields of an answer (and of a stream chunk) the adapter reads, and their types.
    shape: ClassVar[Shape] = {}
    chunk_shape: ClassVar[Shape] = {}
    #: The sampling options (``temperature``, ``top_p``, ``stop``, ``seed``) under this
    #: provider's names for them, as :meth:`sampling` sends them.
    sampling_names: ClassVar[Mapping[str, str]] = {}
    #: The call options (of :data:`SAMPLING_OPTIONS`) this provider's API has a field for.
    options: ClassVar[frozenset[str]] = frozenset({"max_output_tokens"})
    #: The credential step this adapter's requests carry (``Request.auth``): SigV4, a
    #: Google token; None where the key is a plain header.
    credential: RequestAuth | None = None
    #: The header a plain key goes in, and its value, the key standing for ``{key}``.
    key_header: ClassVar[tuple[str, str]] = ("authorization", "Bearer {key}")
    #: The API version named when the config gives none, and the header or the query field
    #: naming it (None: this API takes no version so).
    default_api_version: ClassVar[str | None] = None
    version_header: ClassVar[str | None] = None
    version_query: ClassVar[str | None] = None
    #: Where the models a key may use are listed (a path under :attr:`endpoint`) and the
    #: query asking for them all: ``fluid ai setup --check`` GETs it (:meth:`models_request`).
    #: None: no list a key alone can read (a cloud's endpoint wants a signed request).
    models_path: ClassVar[str | None] = None
    models_query: ClassVar[Mapping[str, str | int]] = {}

    def __init__(self, config: ProviderConfig) -> None:
        self.config = config

    def supported_options(self, model: str) -> frozenset[str]:
        """The call options this adapter sends for ``model``; a call that sets another is
        refused before sending (or, with ``drop_unsupported``, sent without it)."""
        return self.options

    def refusals(self, spec: CallSpec) -> dict[str, str]:
        """The options of ``spec`` this provider cannot send beside the rest of it (option ->
        why): what only the whole request shows (thinking beside a forced tool ...). The
        call refuses them before sending, or drops them under ``drop_unsupported``."""
        return {}

    def refuse(self, spec: CallSpec) -> None:
        """``llm.unsupported_option`` for the first of :meth:`refusals`, if any: a guard in
        ``request()`` for a spec that did not come through the call's checks."""
        refused = self.refusals(spec)
        if refused:
            raise unsupported_option(self.provider, spec.model, refused)

    @property
    def endpoint(self) -> str | None:
        """The base URL requests go to: the configured one, or the provider's default."""
        return self.config.base_url or self.default_base_url

    def request(self, spec: CallSpec, *, stream: bool) -> Request:
        raise NotImplementedError

    def sampling(self, spec: CallSpec) -> dict[str, Any]:
        """The call's sampling options that are set, under :attr:`sampling_names`."""
        return sampling_fields(spec, self.sampling_names)

    @property
    def api_version(self) -> str | None:
        """The API version requests name: the configured one, or the adapter's default."""
        return self.config.api_version or self.default_api_version

    def key_headers(self, first: Mapping[str, str]) -> dict[str, str]:
        """``first``, the API version's header, the configured headers, then the key in
        :attr:`key_header`, in that order: a name set later wins."""
        headers = dict(first)
        if self.version_header is not None and self.api_version:
            headers[self.version_header] = self.api_version
        headers.update(self.config.headers)
        if self.config.api_key:
            name, value = self.key_header
            headers[name] = value.format(key=self.config.api_key)
        return headers

    def json_headers(self) -> dict[str, str]:
        """A JSON request's headers (:meth:`key_headers`, after the content type)."""
        return self.key_headers({"content-type": "application/json"})

    def models_request(self) -> ModelsRequest | None:
        """The cheapest GET the key must pass: the list at :attr:`models_path`, sent with the
        headers a call carries (None: the API has no such list, as for the clouds)."""
        if self.models_path is None:
            return None
        params = dict(self.models_query)
        if self.version_query is not None and self.api_version:
            params[self.version_query] = self.api_version
        url = (self.endpoint or "").rstrip("/") + self.models_path
        return ModelsRequest(url, self.key_headers({"accept": "application/json"}), params)

    def post(
        self, spec: CallSpec, url: str, headers: dict[str, str], body: dict[str, Any]
    ) -> Request:
        """The POST of ``body`` to ``url``, the call's word last: its ``extra_body`` merged
        into ``body`` and its ``extra_headers`` set over ``headers`` (both in place)."""
        merge_body(body, spec.extra)
        set_headers(headers, spec.extra_headers)
        return Request("POST", url, headers, body)

    def refused_own_field(self, spec: CallSpec, answer: Any) -> bool:
        """Whether ``answer`` (an error response to a stream's request, its body read)
        refused a field this adapter adds of its own accord and can do without.

        When it did, the adapter leaves the field out from then on, and the call
        sends the request again at once, within the same attempt (call/core.py);
        a field the caller set (``extra_body``) is never the adapter's to drop.
        """
        return False

    def parse(self, data: Any, spec: CallSpec) -> Parsed:
        raise NotImplementedError

    def parse_chunk(
        self, data: Any, event: str, state: StreamState, spec: CallSpec
    ) -> list[StreamEvent]:
        """One decoded stream chunk's events; a chunk that is not an object has none."""
        if not isinstance(data, dict):
            return []
        return self.chunk_events(data, event, state, spec)

    def chunk_events(
        self, data: dict[str, Any], event: str, state: StreamState, spec: CallSpec
    ) -> list[StreamEvent]:
        """The events of one stream chunk that is a JSON object: each adapter's own reading."""
        raise NotImplementedError

    def is_error_chunk(self, data: Any, event: str) -> bool:
        return event == "error" or (isinstance(data, dict) and "error" in data)


Chunk = tuple[str, Any]  # (event name, decoded data)


def _decode(data: str) -> Any:
    try:
        return json.loads(data)
    except ValueError:
        return {"_unparsed": data}


class _ChunkReader:
    """An SSE or NDJSON body, line by line: ``feed(line)`` gives the decoded chunk it
    completes, if any (sync and async readers alike: the shared half of both).

    ``done`` turns true at SSE's ``[DONE]``: nothing after it is to be read; a ``state``
    given is marked done there too (how an OpenAI-style stream says it is over).
    ``rest()`` gives the event a body ended in without a blank line.
    """

    __slots__ = ("data", "done", "event", "ndjson", "state")

    def __init__(self, fmt: str, state: StreamState | None = None) -> None:
        self.ndjson = fmt == "ndjson"
        self.event = ""
        self.data: list[str] = []
        self.done = False
        self.state = state

    def feed(self, line: str) -> tuple[Chunk, ...]:
        if self.ndjson:
            return (("", _decode(line)),) if line.strip() else ()
        if line == "":
            return self._dispatch()
        if line.startswith(":"):
            return ()
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            self.event = value
        elif name == "data":
            self.data.append(value)
        return ()

    def _dispatch(self) -> tuple[Chunk, ...]:
        """The SSE event the lines so far make (none for none, or ``[DONE]``)."""
        if not self.data:
            self.event = ""
            return ()
        event, data = self.event, "\n".join(self.data)
        self.event, self.data = "", []
        if data == "[DONE]":
            self.done = True
            if self.state is not None:
                self.state.done = True
            return ()
        return ((event, _decode(data)),)

    def rest(self) -> tuple[Chunk, ...]:
        return () if self.ndjson else self._dispatch()


def iter_stream(
    fmt: str, lines: Iterator[str], state: StreamState | None = None
) -> Iterator[Chunk]:
    """Decoded chunks of an SSE or NDJSON body; SSE's ``[DONE]`` ends them and, given a
    ``state``, marks it done (how an OpenAI-style stream says it is over)."""
    reader = _ChunkReader(fmt, state)
    for line in lines:
        yield from reader.feed(line)
        if reader.done:
            return
    yield from reader.rest()


async def aiter_stream(
    fmt: str, lines: AsyncIterator[str], state: StreamState | None = None
) -> AsyncIterator[Chunk]:
    """The async twin of :func:`iter_stream`: the same reader, over ``async for``."""
    reader = _ChunkReader(fmt, state)
    async for line in lines:
        for chunk in reader.feed(line):
            yield chunk
        if reader.done:
            return
    for chunk in reader.rest():
        yield chunk


# -- AWS event-stream frames (application/vnd.amazon.eventstream) -----------------------

#: A frame's prelude: total length, headers length (4 bytes each) and the prelude's CRC.
_PRELUDE: Final = 12
_SMALLEST_FRAME: Final = 16  # a prelude and the message CRC, no headers, no payload


class _Frames:
    """AWS event-stream bytes, frame by frame: ``feed(chunk)`` gives the chunks it completes.

    A frame's length is read from its prelude before its bytes are kept, so a
    frame over ``limit`` is refused as soon as its first 4 bytes arrive, the way
    an over-long line is; each whole frame is checked (CRCs, header and payload
    lengths) and decoded by botocore's parser. An event gives
    ``(event type, JSON payload)``; an exception frame ``("exception",
    {"__type": ..., **payload})``, which the adapter reads as an error chunk.

    A frame that is refused or does not decode ends the stream, but never takes the
    good frames before it down with it: those that came in the same read are given
    first, and its error waits in :attr:`fault` for the caller to raise once they
    are delivered, as if each frame had come in a read of its own (issue 32 item 15).
    """

    __slots__ = ("buffer", "fault", "limit", "model", "provider", "refuse")

    def __init__(
        self,
        limit: int,
        refuse: Callable[[int], Exception],
        provider: str | None = None,
        model: str | None = None,
    ) -> None:
        self.limit = limit
        self.refuse = refuse
        self.buffer = bytearray()
        self.provider = provider
        self.model = model
        self.fault: Exception | None = None

    def feed(self, chunk: bytes) -> list[Chunk]:
        """The chunks the frames completed by ``chunk`` give, up to the first bad frame; that
        one's error is raised at once when no good frame came before it, else kept in
        :attr:`fault` (the caller raises it after delivering these)."""
        self.buffer += chunk
        out: list[Chunk] = []
        try:
            while len(self.buffer) >= 4:
                total = int.from_bytes(self.buffer[:4], "big")
                if total > self.limit:
                    raise self.refuse(total)
                if total < _SMALLEST_FRAME:
                    raise self._bad(f"a frame says it is {total} bytes long, under the 16 it needs")
                if len(self.buffer) < total:
                    break
                frame = bytes(self.buffer[:total])
                del self.buffer[:total]
                out.append(self._decode(frame))
        except Exception as exc:
            if not out:
                raise
            self.fault = exc
        return out

    def _decode(self, frame: bytes) -> Chunk:
        from botocore.eventstream import EventStreamBuffer, ParserError

        parser = EventStreamBuffer()
        parser.add_data(frame)
        try:
            message = next(parser)
        except ParserError as exc:
            raise self._bad(f"a frame does not decode ({type(exc).__name__})") from None
        headers = message.headers
        payload = _decode(message.payload.decode("utf-8", "replace")) if message.payload else {}
        kind = headers.get(":message-type", "event")
        if kind == "event":
            return str(headers.get(":event-type", "")), payload
        name = str(headers.get(":exception-type") or headers.get(":error-code") or "error")
        data = payload if isinstance(payload, dict) else {"message": str(payload)}
        if kind == "error" and "message" not in data:
            data = {**data, "message": str(headers.get(":error-message", ""))}
        return "exception", {"__type": name[:1].upper() + name[1:], **data}

    def _bad(self, what: str) -> ProviderError:
        return ProviderError(
            f"{self.provider or 'provider'} sent a stream that is not valid AWS event-stream "
            f"framing: {what}",
            provider=self.provider,
            model=self.model,
            code="llm.malformed_response",
            retryable=True,
        )

    def rest(self) -> None:
        """The stream ended: bytes of a frame that never completed mean it was cut inside one."""
        if self.buffer:
            raise ProviderError(
                f"the stream from {self.provider or 'provider'} was cut inside an event-stream "
                f"frame ({len(self.buffer)} bytes of it arrived): the answer never finished",
                provider=self.provider,
                model=self.model,
                code="llm.network_error",
                retryable=True,
                details={"partial_frame_bytes": len(self.buffer)},
            )


def iter_frames(
    chunks: Iterator[bytes],
    limit: int,
    refuse: Callable[[int], Exception],
    provider: str | None = None,
    model: str | None = None,
) -> Iterator[Chunk]:
    """Decoded chunks of an AWS event-stream body (Bedrock's ``converse-stream``)."""
    frames = _Frames(limit, refuse, provider, model)
    for chunk in chunks:
        yield from frames.feed(chunk)
        if frames.fault is not None:
            raise frames.fault
    frames.rest()


async def aiter_frames(
    chunks: AsyncIterator[bytes],
    limit: int,
    refuse: Callable[[int], Exception],
    provider: str | None = None,
    model: str | None = None,
) -> AsyncIterator[Chunk]:
    """The async twin of :func:`iter_frames`."""
    frames = _Frames(limit, refuse, provider, model)
    async for chunk in chunks:
        for decoded in frames.feed(chunk):
            yield decoded
        if frames.fault is not None:
            raise frames.fault
    frames.rest()
