"""Recording: real provider exchanges kept as a cassette with no secret in it.

:func:`record` makes a cassette from one real call; :class:`Recorder`
records any run (several calls, sync or async) through the httpx clients it
hands out, each exchange passing through a :class:`RecordingTransport`.
What is kept of a request is a summary (method, path, model: never headers,
keys or the body, unless asked for); of an answer, its status, its headers
without credentials or account ids (:func:`sanitize_headers`), and its body
with every secret taken out (:func:`sanitize_response`: the request's own key
by value, credential fields by name, URL userinfo and key-like query values,
known key shapes by pattern). ``bodies=False`` keeps no prompt and no model
output at all. See docs/corpus.md.
"""

from __future__ import annotations

import base64
import contextlib
import json
import re
import struct
import threading
import time
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

import httpx

from fluid_build._redact import redact, redact_json, redact_url, request_secrets
from fluid_build.copilot.agents.errors import AgentExecutionError
from fluid_build.copilot.call.wire import DEFAULT_DEADLINE, Deadline, ainflated, inflated
from fluid_build.copilot.llm.registry import PROVIDERS
from fluid_build.corpus.cassette import (
    CASSETTE_VERSION,
    OMITTED,
    CallRecipe,
    Cassette,
    CassetteError,
    Exchange,
    ExchangeRequest,
    ExchangeResponse,
    Expectation,
    check_writable,
    is_dropped_header,
    resolve_response_model,
    write_cassette,
)
from fluid_build.corpus.compare import request_settings
from fluid_build.corpus.run import Clock, recipe_client, run_recipe

if TYPE_CHECKING:
    from fluid_build.copilot.client import LLMClient

__all__ = [
    "MAX_RECORDED_BYTES",
    "Recorder",
    "RecordingTransport",
    "recipe_env",
    "record",
    "sanitize_binary",
    "sanitize_headers",
    "sanitize_response",
]

#: The largest answer a recording keeps (decompressed bytes); a larger one fails the recording.
MAX_RECORDED_BYTES: Final = 32 * 1024 * 1024


# -- what is kept of an answer ----------------------------------------------------------


def sanitize_headers(headers: Mapping[str, str], *, secrets: Sequence[str] = ()) -> dict[str, str]:
    """Response headers worth keeping, lower-cased.

    Dropped: every header that carries a credential (Authorization, api-key,
    x-api-key, x-goog-api-key, cookies, ``*-token`` ...; see
    :func:`~fluid_build._redact.is_credential_header`), the account ids
    (``openai-organization``, ``openai-project``, ``anthropic-organization-id``),
    framing, and any header whose value :func:`redact` would change.
    """
    kept: dict[str, str] = {}
    for name, value in headers.items():
        low = name.lower()
        if is_dropped_header(low):
            continue
        line = f"{low}: {value}"
        if redact(line, secrets) != line:
            continue
        kept[low] = value
    return kept


def _is_json(content_type: str) -> bool:
    kind = content_type.split(";", 1)[0].strip().lower()
    return kind == "application/json" or (kind.endswith("+json") and "ndjson" not in kind)


def sanitize_response(
    status: int,
    headers: Mapping[str, str],
    text: str,
    *,
    secrets: Sequence[str] = (),
    bodies: bool = True,
) -> ExchangeResponse:
    """An answer as a cassette keeps it: headers filtered, body redacted, JSON decoded.

    A JSON body is decoded first, then redacted value by value (so a key
    escaped inside a JSON string goes too, and fields named like a
    credential lose their value); any other body is redacted as text. With
    ``bodies=False`` a 2xx answer keeps no body at all (``omitted``): that is
    where the model's output is. Error answers keep theirs, redacted: the
    classification and the waits depend on them.
    """
    kept = sanitize_headers(headers, secrets=secrets)
    if not bodies and 200 <= status < 300:
        return ExchangeResponse(status=status, headers=kept, omitted=True)
    if text and _is_json(kept.get("content-type", "")):
        try:
            data = json.loads(text)
        except (ValueError, RecursionError):
            pass
        else:
            return ExchangeResponse(status=status, headers=kept, body=redact_json(data, secrets))
    return ExchangeResponse(status=status, headers=kept, body_text=redact(text, secrets) or None)


#: Answers whose body is binary framing, kept as ``body_base64`` (never decoded as text,
#: which would break the frames' checksums): AWS event-stream, Bedrock's streams.
EVENTSTREAM: Final = "application/vnd.amazon.eventstream"


def is_binary(content_type: str) -> bool:
    """Whether an answer of this content type is kept as bytes (``body_base64``)."""
    return content_type.split(";", 1)[0].strip().lower() == EVENTSTREAM


def sanitize_binary(
    status: int,
    headers: Mapping[str, str],
    content: bytes,
    *,
    secrets: Sequence[str] = (),
    bodies: bool = True,
) -> ExchangeResponse:
    """An AWS event-stream answer as a cassette keeps it: every frame redacted, re-framed.

    Each frame's payload is redacted as :func:`sanitize_response` redacts a body
    (JSON value by value, else as text) and its string headers as text; the
    frame is then written again with its lengths and CRC32 checksums, so it
    decodes as the original did. Bytes that do not parse as frames are refused:
    they could not be redacted.
    """
    kept = sanitize_headers(headers, secrets=secrets)
    if not bodies and 200 <= status < 300:
        return ExchangeResponse(status=status, headers=kept, omitted=True)
    try:
        frames = _redacted_frames(content, secrets)
    except ValueError as exc:
        raise CassetteError(
            f"an {EVENTSTREAM} answer cannot be recorded: {exc}",
            hint="record the call without streaming (--kind complete)",
        ) from None
    return ExchangeResponse(
        status=status, headers=kept, body_base64=base64.b64encode(frames).decode("ascii")
    )


# Header value sizes of the AWS event-stream format by type: 0/1 booleans, 2 byte,
# 3 short, 4 int, 5 long, 8 timestamp, 9 uuid; 6 (bytes) and 7 (string) carry a length.
_FIXED: Final = {0: 0, 1: 0, 2: 1, 3: 2, 4: 4, 5: 8, 8: 8, 9: 16}


def _redacted_headers(raw: bytes, secrets: Sequence[str]) -> bytes:
    out = bytearray()
    at = 0
    while at < len(raw):
        size = raw[at]
        name_end = at + 1 + size
        if name_end >= len(raw):
            raise ValueError("a frame's headers are cut short")
        kind = raw[name_end]
        head = raw[at : name_end + 1]
        at = name_end + 1
        if kind in _FIXED:
            out += head + raw[at : at + _FIXED[kind]]
            at += _FIXED[kind]
            continue
        if kind not in (6, 7) or at + 2 > len(raw):
            raise ValueError(f"a frame has a header of unknown type {kind}")
        (length,) = struct.unpack_from(">H", raw, at)
        value = raw[at + 2 : at + 2 + length]
        at += 2 + length
        if kind == 7:
            value = redact(value.decode("utf-8", errors="replace"), secrets).encode("utf-8")
        out += head + struct.pack(">H", len(value)) + value
    return bytes(out)


def _redacted_payload(payload: bytes, secrets: Sequence[str]) -> bytes:
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        return payload  # opaque bytes: nothing a key could be read from as text
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return redact(text, secrets).encode("utf-8")
    kept = redact_json(data, secrets)
    # Unchanged payloads keep their bytes: a clean recording is the provider's, verbatim.
    if kept == data:
        return payload
    return json.dumps(kept, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _redacted_frames(content: bytes, secrets: Sequence[str]) -> bytes:
    out = bytearray()
    at = 0
    while at < len(content):
        if at + 12 > len(content):
            raise ValueError("the last frame is cut short")
        total, header_size = struct.unpack_from(">II", content, at)
        if total < 16 + header_size or at + total > len(content):
            raise ValueError("a frame's length does not fit the answer")
        headers = content[at + 12 : at + 12 + header_size]
        payload = content[at + 12 + header_size : at + total - 4]
        headers = _redacted_headers(headers, secrets)
        payload = _redacted_payload(payload, secrets)
        prelude = struct.pack(">II", 16 + len(headers) + len(payload), len(headers))
        frame = prelude + struct.pack(">I", zlib.crc32(prelude)) + headers + payload
        out += frame + struct.pack(">I", zlib.crc32(frame))
        at += total
    return bytes(out)


# -- recording a run ----------------------------------------------------------------------


class _Raw:
    """One exchange as it happened, kept until the cassette is made (then redacted)."""

    __slots__ = (
        "body",
        "content",
        "headers",
        "method",
        "model",
        "path",
        "settings",
        "status",
        "text",
    )

    def __init__(
        self,
        method: str,
        path: str,
        model: str | None,
        status: int,
        headers: list[tuple[str, str]],
        text: str,
        body: Any = None,
        content: bytes | None = None,
        settings: dict[str, Any] | None = None,
    ) -> None:
        self.method, self.path, self.model = method, path, model
        self.status, self.headers, self.text = status, headers, text
        self.body = body
        #: The call settings the body carried, kept when the body is not.
        self.settings = settings
        #: The answer's bytes, kept only when they are binary framing (:func:`is_binary`).
        self.content = content


class Recorder:
    """Records the HTTP exchanges of any run, and makes a cassette with no secret in it.

    Hand the clients it makes (or its transports) to any number of
    :class:`~fluid_build.copilot.client.LLMClient` s, sync or async; every
    request and answer passes through. It learns the secrets of every request
    (credential headers, URL userinfo, key-like query parameters) on top of
    the ``secrets`` given, and removes them, by value, from everything it
    keeps. Nothing is redacted until it is read (:attr:`exchanges`,
    :meth:`cassette`), so a key first seen late (a fallback's) still goes
    from earlier answers.

    ::

        recorder = Recorder(secrets=[api_key], bodies=False)
        with recorder.client(timeout=60) as http:
            client = LLMClient(provider, model, api_key, http_client=http, envelope=...)
            ...                                       # one call, or a whole forge run
        cassette = recorder.cassette(
            name="forge-run", provider=..., model=..., call=recipe, expect=expectation
        )

    ``bodies=False`` keeps no prompt and no model output: the recipe's
    messages become :data:`OMITTED`, 2xx answers are kept without their
    body (``omitted``), and ``expect.output`` is dropped. What replay needs
    to match requests (method, path, model), the statuses, headers, error
    answers and waits stay.

    ``request_bodies=True`` (with ``bodies``) keeps each request's JSON body
    too, redacted like the answers, so that a replay can say where a request
    differs (``fluid forge --record`` uses it).
    """

    def __init__(
        self,
        *,
        secrets: Iterable[str | None] = (),
        bodies: bool = True,
        max_bytes: int = MAX_RECORDED_BYTES,
        request_bodies: bool = False,
    ) -> None:
        self.bodies = bodies
        self.request_bodies = request_bodies
        self.max_bytes = max_bytes
        self._secrets: dict[str, None] = {}
        self._raw: list[_Raw] = []
        self._unanswered: list[str] = []
        self._lock = threading.Lock()
        self.add_secrets(*secrets)

    # -- secrets ------------------------------------------------------------------------

    @property
    def secrets(self) -> tuple[str, ...]:
        """Every secret known so far: the ones given and the ones seen in requests."""
        with self._lock:
            return tuple(self._secrets)

    def add_secrets(self, *values: str | None) -> None:
        """Remove ``values`` too, wherever they appear in what is kept."""
        with self._lock:
            for value in values:
                if value:
                    self._secrets[value] = None

    def _learn(self, request: httpx.Request) -> None:
        found = request_secrets(request.headers.multi_items(), request.url)
        self.add_secrets(*found, request.url.password, request.url.username)

    # -- what passes through ----------------------------------------------------------------

    def transport(self, inner: httpx.BaseTransport | None = None) -> RecordingTransport:
        """A sync transport recording into this recorder (default inner: a real one)."""
        return RecordingTransport(inner or httpx.HTTPTransport(), recorder=self)

    def async_transport(self, inner: httpx.AsyncBaseTransport | None = None) -> RecordingTransport:
        """An async transport recording into this recorder (default inner: a real one)."""
        return RecordingTransport(inner or httpx.AsyncHTTPTransport(), recorder=self)

    def client(self, inner: httpx.BaseTransport | None = None, **kwargs: Any) -> httpx.Client:
        """An ``httpx.Client`` (``kwargs`` as for it) whose every exchange is recorded.

        Without ``inner`` the client's transports are made as fluid's own pools make
        theirs (call/transport/proxies.py ``env_mounts``), so the proxies of the environment
        (``HTTPS_PROXY``, ``ALL_PROXY``, ``NO_PROXY``) and its certificate settings
        apply as they would to a call that is not recorded; each is recorded.
        """
        if inner is not None:
            return httpx.Client(transport=self.transport(inner), **kwargs)
        from fluid_build.copilot.call.transport.proxies import env_mounts

        def make(proxy: httpx.Proxy | None) -> httpx.BaseTransport:
            return self.transport(httpx.HTTPTransport(proxy=proxy))

        default, mounts = env_mounts(make)
        return httpx.Client(transport=default, mounts=mounts, **kwargs)

    def async_client(
        self, inner: httpx.AsyncBaseTransport | None = None, **kwargs: Any
    ) -> httpx.AsyncClient:
        """An ``httpx.AsyncClient`` recording every exchange; proxies as in :meth:`client`."""
        if inner is not None:
            return httpx.AsyncClient(transport=self.async_transport(inner), **kwargs)
        from fluid_build.copilot.call.transport.proxies import env_mounts

        def make(proxy: httpx.Proxy | None) -> httpx.AsyncBaseTransport:
            return self.async_transport(httpx.AsyncHTTPTransport(proxy=proxy))

        default, mounts = env_mounts(make)
        return httpx.AsyncClient(transport=default, mounts=mounts, **kwargs)

    def _begin(self, request: httpx.Request) -> str:
        self._learn(request)
        return f"{request.method.upper()} {redact_url(request.url.path, self.secrets)}"

    def _keep(self, request: httpx.Request, response: httpx.Response, content: bytes) -> None:
        model: str | None = None
        try:
            data = json.loads(request.content) if request.content else None
        except (ValueError, RecursionError, httpx.RequestNotRead):
            data = None
        if isinstance(data, dict) and isinstance(data.get("model"), str):
            model = data["model"]
        binary = is_binary(response.headers.get("content-type", ""))
        text = "" if binary else content.decode(response.encoding or "utf-8", errors="replace")
        kept_body = self.bodies and self.request_bodies
        # A kept body holds the settings already; otherwise they are kept on their own
        # (none of them is a prompt or an answer), so that replay still compares them.
        settings = None if kept_body or not isinstance(data, dict) else request_settings(data)
        raw = _Raw(
            request.method.upper(),
            request.url.path,
            model,
            response.status_code,
            list(response.headers.multi_items()),
            text,
            data if kept_body else None,
            content if binary else None,
            settings,
        )
        with self._lock:
            self._raw.append(raw)

    def _failed(self, what: str, exc: BaseException) -> None:
        with self._lock:
            self._unanswered.append(f"{what}: {type(exc).__name__}")

    # -- what is kept ---------------------------------------------------------------------

    @property
    def exchanges(self) -> list[Exchange]:
        """The exchanges so far, redacted with every secret known now."""
        secrets = self.secrets
        with self._lock:
            raws = list(self._raw)
        out = []
        for raw in raws:
            headers: dict[str, str] = {}
            for name, value in raw.headers:
                low = name.lower()
                headers[low] = f"{headers[low]}, {value}" if low in headers else value
            out.append(
                Exchange(
                    request=ExchangeRequest(
                        method=raw.method,
                        path=redact_url(raw.path, secrets),
                        model=redact(raw.model, secrets) if raw.model is not None else None,
                        body=redact_json(raw.body, secrets) if raw.body is not None else None,
                        settings=(
                            redact_json(raw.settings, secrets) if raw.settings is not None else None
                        ),
                    ),
                    response=(
                        sanitize_binary(
                            raw.status, headers, raw.content, secrets=secrets, bodies=self.bodies
                        )
                        if raw.content is not None
                        else sanitize_response(
                            raw.status, headers, raw.text, secrets=secrets, bodies=self.bodies
                        )
                    ),
                )
            )
        return out

    @property
    def unanswered(self) -> list[str]:
        """Requests that got no answer (``METHOD /path: Exception``): they cannot be replayed."""
        with self._lock:
            return [redact(line, self._secrets) for line in self._unanswered]

    def check_answered(self) -> None:
        """Raise :class:`CassetteError` when a request got no answer."""
        missing = self.unanswered
        if missing:
            raise CassetteError(
                "a request got no answer, and only answers can be replayed: " + "; ".join(missing)
            )

    def scrub(self, value: Any) -> Any:
        """A JSON value (a message, an output) with every secret out, as a cassette keeps it."""
        return redact_json(value, self.secrets)

    def recipe(self, recipe: CallRecipe) -> CallRecipe:
        """``recipe`` as a cassette keeps it: redacted, or without the prompt (``bodies=False``)."""
        secrets = self.secrets
        if self.bodies:
            messages = [self.scrub(dict(m)) for m in recipe.messages]
            system = redact(recipe.system, secrets) if recipe.system is not None else None
        else:
            messages = [
                {"role": str(m.get("role", "user")), "content": OMITTED} for m in recipe.messages
            ]
            system = OMITTED if recipe.system is not None else None
        env = {
            name: redact_url(value, secrets) if "://" in value else redact(value, secrets)
            for name, value in recipe.env.items()
        }
        return recipe.model_copy(
            update={
                "messages": messages,
                "system": system,
                "env": env,
                "capability_matrix": self.scrub(dict(recipe.capability_matrix)),
            }
        )

    def expectation(
        self,
        *,
        error: BaseException | None,
        output: Any = None,
        waits: Sequence[float] = (),
        attempts: int | None = None,
    ) -> Expectation:
        """What a run came to, as a cassette keeps it (``attempts``: the exchanges recorded)."""
        code = getattr(error, "code", None)
        kept_output = self.scrub(output) if error is None and self.bodies else None
        return Expectation(
            outcome="error" if error is not None else "success",
            error_class=type(error).__name__ if error is not None else None,
            error_code=code if error is not None and isinstance(code, str) else None,
            output=kept_output,
            attempts=len(self._raw) if attempts is None else attempts,
            waits=list(waits),
        )

    def cassette(
        self,
        *,
        name: str,
        provider: str,
        model: str,
        call: CallRecipe,
        expect: Expectation,
        description: str = "",
        now: datetime | None = None,
        forge_run: bool = False,
    ) -> Cassette:
        """The cassette of what was recorded; refuses when a request got no answer.

        ``call`` and ``expect`` are scrubbed here as well (by value, by name,
        by pattern; without prompt and output when ``bodies=False``).
        """
        self.check_answered()
        stamp = (now or datetime.now(UTC)).strftime("%Y-%m-%d")
        if not self.bodies or expect.output is not None:
            expect = expect.model_copy(
                update={"output": self.scrub(expect.output) if self.bodies else None}
            )
        return Cassette(
            version=CASSETTE_VERSION,
            name=name,
            description=redact(description, self.secrets),
            provider=provider,
            model=redact(model, self.secrets),
            source=f"recorded {stamp} from {provider} ({redact(model, self.secrets)})",
            call=self.recipe(call),
            exchanges=self.exchanges,
            expect=expect,
            bodies=self.bodies,
            forge_run=forge_run,
        )


def _deadline() -> Deadline:
    """A recorded answer is read within the default whole-call deadline."""
    return Deadline(DEFAULT_DEADLINE)


class RecordingTransport(httpx.BaseTransport, httpx.AsyncBaseTransport):
    """Wraps a real transport (sync or async) and records each exchange into a :class:`Recorder`.

    Answers are read whole (at most ``recorder.max_bytes`` decompressed
    bytes: past that the request fails and counts as unanswered) and handed
    on decoded.
    """

    def __init__(
        self,
        inner: httpx.BaseTransport | httpx.AsyncBaseTransport,
        *,
        secrets: Sequence[str] = (),
        bodies: bool = True,
        recorder: Recorder | None = None,
    ) -> None:
        self.inner = inner
        self.recorder = recorder if recorder is not None else Recorder(bodies=bodies)
        self.recorder.add_secrets(*secrets)

    @property
    def secrets(self) -> tuple[str, ...]:
        return self.recorder.secrets

    @property
    def exchanges(self) -> list[Exchange]:
        return self.recorder.exchanges

    @property
    def unanswered(self) -> list[str]:
        return self.recorder.unanswered

    @contextlib.contextmanager
    def _bounded(self) -> Iterator[None]:
        """An answer past ``max_bytes`` (inflated, every layer counted) is not recorded."""
        try:
            yield
        except AgentExecutionError as error:
            if error.code != "llm.response_too_large":
                raise
            limit = self.recorder.max_bytes
            raise CassetteError(
                f"the answer is larger than {limit} bytes; it is not recorded"
            ) from None

    def _handed_on(
        self, request: httpx.Request, response: httpx.Response, content: bytes
    ) -> httpx.Response:
        self.recorder._keep(request, response, content)
        headers = [
            (k, v)
            for k, v in response.headers.multi_items()
            if k.lower() not in {"content-encoding", "content-length", "transfer-encoding"}
        ]
        return httpx.Response(
            response.status_code, headers=headers, content=content, request=request
        )

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if not isinstance(self.inner, httpx.BaseTransport):
            raise TypeError("this RecordingTransport wraps an async transport")
        what = self.recorder._begin(request)
        try:
            response = self.inner.handle_request(request)
            try:
                buf = bytearray()
                with self._bounded():
                    for chunk in inflated(response, self.recorder.max_bytes, _deadline()):
                        buf += chunk
            finally:
                response.close()
        except Exception as exc:
            self.recorder._failed(what, exc)
            raise
        return self._handed_on(request, response, bytes(buf))

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if not isinstance(self.inner, httpx.AsyncBaseTransport):
            raise TypeError("this RecordingTransport wraps a sync transport")
        what = self.recorder._begin(request)
        try:
            response = await self.inner.handle_async_request(request)
            try:
                buf = bytearray()
                with self._bounded():
                    async for chunk in ainflated(response, self.recorder.max_bytes, _deadline()):
                        buf += chunk
            finally:
                await response.aclose()
        except Exception as exc:
            self.recorder._failed(what, exc)
            raise
        return self._handed_on(request, response, bytes(buf))

    def close(self) -> None:
        if isinstance(self.inner, httpx.BaseTransport):
            self.inner.close()

    async def aclose(self) -> None:
        if isinstance(self.inner, httpx.AsyncBaseTransport):
            await self.inner.aclose()


class _WallClock:
    """The real clock and real sleeps, keeping the waits (for recording)."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    def __call__(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        time.sleep(seconds)

    async def asleep(self, seconds: float) -> None:
        import asyncio

        self.waits.append(seconds)
        await asyncio.sleep(seconds)


# -- recording one call ----------------------------------------------------------------

#: The retry settings a recipe keeps from the environment (the endpoint is kept too).
#: Where vertex's project and location sit in its resolved URL (llm/vertex.py).
_VERTEX_URL: Final = re.compile(r"/v1/projects/([^/]+)/locations/([^/]+)/publishers/google$")
_RECORDED_ENV: Final = (
    "FLUID_LLM_MAX_ATTEMPTS",
    "FLUID_LLM_DEADLINE_SECONDS",
    "FLUID_OLLAMA_ALLOW_REMOTE",
    # Every call's defaults: a replay sends what the recording sent.
    "FLUID_LLM_TEMPERATURE",
    "FLUID_LLM_MAX_OUTPUT_TOKENS",
)


def recipe_env(client: LLMClient, env: Mapping[str, str]) -> dict[str, str]:
    """What a replay needs from the environment: the endpoint and the retry policy."""
    config = client.config
    info = PROVIDERS[config.provider]
    kept: dict[str, str] = {}
    if config.base_url and info.base_url_var and config.base_url != info.default_base_url:
        kept[info.base_url_var] = redact_url(config.base_url, [config.api_key or ""])
    if info.version_vars and config.api_version:
        kept[info.version_vars[0]] = config.api_version
    if info.cloud == "aws" and config.region:
        # The region names the endpoint; replay reaches it with its own bearer token, so
        # the credential chain (and its instance metadata) is never asked.
        kept["AWS_REGION"] = config.region
        kept["AWS_EC2_METADATA_DISABLED"] = "true"
    if info.cloud == "google" and config.base_url:
        # The project may have come from the credentials (ADC), which replay never loads.
        found = _VERTEX_URL.search(config.base_url)
        if found:
            kept["GOOGLE_CLOUD_PROJECT"], kept["GOOGLE_CLOUD_LOCATION"] = found.groups()
    for name in _RECORDED_ENV:
        value = env.get(name)
        if value:
            kept[name] = value
    return kept


def record(
    prompt: str | Sequence[Mapping[str, Any]],
    *,
    provider: str | None = None,
    model: str | None = None,
    out: str | Path | None = None,
    response_model: str | None = None,
    kind: Literal["complete", "stream", "loop"] = "complete",
    system: str | None = None,
    max_output_tokens: int | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    stop: str | list[str] | None = None,
    seed: int | None = None,
    reasoning_effort: Literal["low", "medium", "high"] | None = None,
    strict_schema: bool = False,
    name: str | None = None,
    description: str = "",
    api_key: str | None = None,
    base_url: str | None = None,
    env: Mapping[str, str] | None = None,
    transport: httpx.BaseTransport | None = None,
    clock: Clock | None = None,
    now: datetime | None = None,
    bodies: bool = True,
) -> Cassette:
    """Make one real call and keep it as a cassette (written to ``out`` when given).

    The key is resolved as :class:`LLMClient` resolves it (argument, then the
    environment). Kept: each request's method, path and model; each answer's
    status, headers without credentials, cookies or account ids, and body,
    redacted (the key by value wherever it appears, credential fields by
    name, URL userinfo and key-like query values, known key shapes by
    pattern); the recipe and the output redacted the same way.
    ``bodies=False`` keeps neither the prompt nor the model's output (see
    :class:`Recorder`). ``expect`` is what was observed. Retries run without
    jitter so a replay waits exactly what the recording waited; ``clock``
    replaces real sleeping (tests). For a run of several calls, use
    :class:`Recorder` directly.

    ``out`` is checked before the call (:func:`check_writable`). A request
    without an answer cannot be replayed: when the call failed, its own failure
    is raised (``ProviderTimeoutError``, ``llm.network_error`` ...) and nothing
    is written; when it succeeded after one, :class:`CassetteError`.
    """
    import os

    from fluid_build.copilot.llm.settings import resolve_provider_config

    source_env = dict(os.environ if env is None else env)
    config = resolve_provider_config(provider, model, api_key, base_url, env=source_env)
    recorder = Recorder(secrets=[config.api_key or ""], bodies=bodies)
    messages = (
        [{"role": "user", "content": prompt}]
        if isinstance(prompt, str)
        else [dict(m) for m in prompt]
    )
    recipe = CallRecipe(
        kind=kind,
        messages=messages,
        system=system,
        response_model=response_model,
        strict_schema=strict_schema,
        max_output_tokens=max_output_tokens,
        temperature=temperature,
        top_p=top_p,
        stop=stop,
        seed=seed,
        reasoning_effort=reasoning_effort,
    )
    if response_model is not None:
        resolve_response_model(response_model)
    if out is not None:
        check_writable(out)  # before the call: a paid answer must have somewhere to go
    ticking: Clock = clock if clock is not None else _WallClock()
    output: Any = None
    error: BaseException | None = None
    with recorder.client(transport, timeout=httpx.Timeout(config.timeout)) as http:
        client = recipe_client(
            provider=config.provider,
            model=config.model,
            api_key=config.api_key,
            # Vertex's resolved URL already holds the project and location, which the
            # client would add again: it resolves them itself from the caller's endpoint.
            base_url=base_url if PROVIDERS[config.provider].cloud == "google" else config.base_url,
            env=source_env,
            strict_schema=strict_schema,
            clock=ticking,
            http=http,
        )
        recipe = recipe.model_copy(update={"env": recipe_env(client, source_env)})
        try:
            output = run_recipe(client, recipe, ticking)
        except Exception as exc:  # noqa: BLE001 - a failure is an outcome worth keeping
            error = exc
    if error is not None and recorder.unanswered:
        # No answer to keep (a refused connection, a timeout): the call's own failure
        # says what happened, where "no answer to record" would only blame the file.
        raise error
    cassette = recorder.cassette(
        name=name or (Path(out).stem if out is not None else f"{config.provider}-recorded"),
        description=description,
        provider=config.provider,
        model=config.model,
        call=recipe,
        expect=recorder.expectation(error=error, output=output, waits=ticking.waits),
        now=now,
    )
    if out is not None:
        write_cassette(cassette, out)
    return cassette
