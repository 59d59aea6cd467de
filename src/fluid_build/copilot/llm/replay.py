"""Cassettes: provider exchanges on file, replayed offline through the real client.

A cassette holds one call (the recipe), the HTTP exchanges it caused (a
request summary and the provider's answer) and what came of it (outcome,
typed error or validated output, requests sent, waits taken). Replaying
runs the recipe through :class:`~fluid_build.copilot.client.LLMClient`,
the retry envelope and the agent loop exactly as a live call would, with
the network replaced by :class:`ReplayTransport` and the clock by
:class:`VirtualClock`, then compares what happened with ``expect``.

::

    cassette = load_cassette("corpus/openai-rate-limit-retry.json")
    result = run_cassette(cassette)        # ReplayResult(ok=..., mismatches=[...])
    client = replay_client(cassette)       # an LLMClient answering from the cassette

:func:`record` makes a cassette from a real call. What it keeps is a request
summary (method, path, model: never headers or keys) and the answer, with
credential headers dropped and the body redacted. See docs/corpus.md.
"""

from __future__ import annotations

import importlib
import json
import math
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from fluid_build._redact import one_line, redact, truncate
from fluid_build.errors import FluidError

if TYPE_CHECKING:
    from fluid_build.copilot.agents.retry import RetryEvent
    from fluid_build.copilot.client import LLMClient

__all__ = [
    "CASSETTE_VERSION",
    "REPLAY_KEY",
    "RESPONSE_MODELS",
    "CallRecipe",
    "Cassette",
    "CassetteError",
    "DataProduct",
    "Exchange",
    "ExchangeRequest",
    "ExchangeResponse",
    "Expectation",
    "Plan",
    "RecordingTransport",
    "ReplayMismatch",
    "ReplayResult",
    "ReplayTransport",
    "VirtualClock",
    "dump_cassette",
    "load_cassette",
    "record",
    "register_response_model",
    "replay_client",
    "resolve_response_model",
    "run_cassette",
    "sanitize_headers",
    "sanitize_response",
    "summarize_request",
    "write_cassette",
]

#: The cassette format this module reads and writes.
CASSETTE_VERSION: Final = 1
#: The API key a replayed client sends; it reaches no provider.
REPLAY_KEY: Final = "replay-key"
#: Waits are compared with this tolerance, in seconds.
WAIT_TOLERANCE: Final = 1e-6

# Response headers a cassette never keeps: credentials and cookies, and the
# framing of the original bytes (the body is stored decoded).
_DROPPED_HEADERS: Final = frozenset(
    {
        "authorization",
        "proxy-authorization",
        "api-key",
        "x-api-key",
        "x-goog-api-key",
        "ocp-apim-subscription-key",
        "cookie",
        "set-cookie",
        "content-length",
        "content-encoding",
        "transfer-encoding",
        "connection",
        "keep-alive",
    }
)


# -- errors -------------------------------------------------------------------------


class CassetteError(FluidError):
    """A cassette that cannot be read: missing, not JSON, another version, or invalid."""

    def __init__(self, message: str, *, path: str | None = None) -> None:
        super().__init__(f"{path}: {message}" if path else message)
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_cassette_error, (str(self), self.path))


def _rebuild_cassette_error(message: str, path: str | None) -> CassetteError:
    error = CassetteError(message)
    error.path = path
    return error


class ReplayMismatch(FluidError):
    """A replayed call asked for something the cassette does not hold."""


# -- response models cassettes may name ---------------------------------------------------


class Plan(BaseModel):
    """A data product plan: the response model of most shipped cassettes."""

    name: str
    steps: list[str]


class DataProduct(BaseModel):
    """A data product with a free-form ``properties`` field (JSON-encoded in strict mode)."""

    name: str
    owner: str | None = None
    tags: list[str] = Field(default_factory=list)
    properties: dict[str, Any] = Field(default_factory=dict)


#: Response models a cassette names by ``call.response_model``.
RESPONSE_MODELS: dict[str, type[BaseModel]] = {"DataProduct": DataProduct, "Plan": Plan}


def register_response_model(model: type[BaseModel], name: str | None = None) -> type[BaseModel]:
    """Make ``model`` available to cassettes as ``name`` (default: its class name)."""
    RESPONSE_MODELS[name or model.__name__] = model
    return model


def resolve_response_model(name: str) -> type[BaseModel]:
    """The model a cassette names: a registered name, or ``fluid_build.module:Class``."""
    known = RESPONSE_MODELS.get(name)
    if known is not None:
        return known
    module_name, _, attr = name.partition(":")
    if attr and (module_name == "fluid_build" or module_name.startswith("fluid_build.")):
        try:
            found = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise CassetteError(f"response model {name!r} cannot be imported: {exc}") from None
        if isinstance(found, type) and issubclass(found, BaseModel):
            return found
        raise CassetteError(f"response model {name!r} is not a pydantic model")
    choices = ", ".join(sorted(RESPONSE_MODELS))
    raise CassetteError(
        f"unknown response model {name!r}: use one of {choices}, or "
        "'fluid_build.<module>:<Class>' (only fluid_build modules are imported)"
    )


# -- the format ---------------------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ExchangeRequest(_Strict):
    """What was asked: never headers, keys or the body, only enough to check the order."""

    method: str
    path: str
    model: str | None = None


class ExchangeResponse(_Strict):
    """What the provider answered: status, kept headers, and a JSON body or raw text."""

    status: int = Field(ge=100, le=599)
    headers: dict[str, str] = Field(default_factory=dict)
    body: Any | None = None
    body_text: str | None = None

    @model_validator(mode="after")
    def _one_body(self) -> ExchangeResponse:
        if self.body is not None and self.body_text is not None:
            raise ValueError("give body (JSON) or body_text (raw text), not both")
        return self


class Exchange(_Strict):
    request: ExchangeRequest
    response: ExchangeResponse


class CallRecipe(_Strict):
    """The call to replay: what the caller passed to the client (or the agent loop)."""

    kind: Literal["complete", "stream", "loop"] = "complete"
    messages: list[dict[str, Any]] = Field(min_length=1)
    system: str | None = None
    response_model: str | None = None
    strict_schema: bool = False
    max_output_tokens: int | None = Field(default=None, ge=1)
    env: dict[str, str] = Field(default_factory=dict)
    capability_matrix: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _loop_task(self) -> CallRecipe:
        if self.kind == "loop":
            first = self.messages[0]
            if (
                len(self.messages) != 1
                or first.get("role") != "user"
                or not isinstance(first.get("content"), str)
            ):
                raise ValueError("a loop recipe takes one user message with text content")
        return self


class Expectation(_Strict):
    """What the call came to; replay must reproduce it."""

    outcome: Literal["success", "error"]
    error_class: str | None = None
    error_code: str | None = None
    output: Any | None = None
    attempts: int = Field(ge=0)
    waits: list[float] = Field(default_factory=list)

    @model_validator(mode="after")
    def _consistent(self) -> Expectation:
        if self.outcome == "error" and not self.error_class:
            raise ValueError("an error outcome needs error_class")
        if self.outcome == "success" and (self.error_class or self.error_code):
            raise ValueError("a success outcome has no error_class or error_code")
        if any(not math.isfinite(w) or w < 0 for w in self.waits):
            raise ValueError("waits are finite, non-negative seconds")
        return self


class Cassette(_Strict):
    version: int
    name: str = Field(min_length=1)
    description: str = ""
    provider: str
    model: str
    source: str = Field(min_length=1)
    call: CallRecipe
    exchanges: list[Exchange]
    expect: Expectation

    @model_validator(mode="after")
    def _version(self) -> Cassette:
        if self.version != CASSETTE_VERSION:
            raise ValueError(_version_message(self.version))
        return self


def _version_message(version: object) -> str:
    return (
        f"cassette version {version!r} is not supported: this fluid_build reads version "
        f"{CASSETTE_VERSION}"
    )


def _pydantic_problems(exc: ValidationError) -> str:
    shown = []
    for entry in exc.errors()[:5]:
        where = ".".join(str(part) for part in entry["loc"]) or "<root>"
        shown.append(f"{where}: {entry['msg']}")
    more = f" (+{exc.error_count() - 5} more)" if exc.error_count() > 5 else ""
    return "; ".join(shown) + more


def load_cassette(path: str | Path) -> Cassette:
    """Read and validate a cassette; any problem is a :class:`CassetteError` saying what."""
    where = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise CassetteError(f"cannot be read ({reason})", path=where) from None
    except UnicodeDecodeError:
        raise CassetteError("is not UTF-8 text", path=where) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CassetteError(
            f"is not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})", path=where
        ) from None
    if not isinstance(data, dict):
        raise CassetteError("must hold a JSON object", path=where)
    if "version" not in data:
        raise CassetteError(
            f"has no 'version' (this fluid_build reads version {CASSETTE_VERSION})", path=where
        )
    if data["version"] != CASSETTE_VERSION:
        raise CassetteError(_version_message(data["version"]), path=where)
    try:
        cassette = Cassette.model_validate(data)
    except ValidationError as exc:
        raise CassetteError(
            f"is not a valid cassette: {_pydantic_problems(exc)}", path=where
        ) from None
    if cassette.call.response_model is not None:
        try:
            resolve_response_model(cassette.call.response_model)
        except CassetteError as exc:
            raise CassetteError(str(exc), path=where) from None
    return cassette


def dump_cassette(cassette: Cassette) -> str:
    """The cassette as the JSON text this module writes (stable: same cassette, same bytes)."""
    return json.dumps(cassette.model_dump(mode="json"), indent=2, ensure_ascii=False) + "\n"


def write_cassette(cassette: Cassette, path: str | Path) -> Path:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(dump_cassette(cassette), encoding="utf-8")
    return target


# -- what is kept of a request and an answer ---------------------------------------------


def summarize_request(request: httpx.Request, *, secrets: Sequence[str] = ()) -> ExchangeRequest:
    """Method, URL path and the body's ``model``: all a cassette keeps of a request."""
    model: str | None = None
    try:
        data = json.loads(request.content) if request.content else None
    except (ValueError, httpx.RequestNotRead):
        data = None
    if isinstance(data, dict) and isinstance(data.get("model"), str):
        model = data["model"]
    return ExchangeRequest(
        method=request.method.upper(), path=redact(request.url.path, secrets), model=model
    )


def sanitize_headers(headers: Mapping[str, str], *, secrets: Sequence[str] = ()) -> dict[str, str]:
    """Response headers worth keeping: no credentials, cookies, framing, or anything redactable."""
    kept: dict[str, str] = {}
    for name, value in headers.items():
        low = name.lower()
        if low in _DROPPED_HEADERS:
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
) -> ExchangeResponse:
    """An answer as a cassette keeps it: headers filtered, body redacted, JSON decoded."""
    kept = sanitize_headers(headers, secrets=secrets)
    clean = redact(text, secrets)
    body: Any = None
    body_text: str | None = clean if clean else None
    if clean and _is_json(kept.get("content-type", "")):
        try:
            body = json.loads(clean)
        except ValueError:
            body = None
        else:
            body_text = None
    return ExchangeResponse(status=status, headers=kept, body=body, body_text=body_text)


def _served(record: ExchangeResponse, request: httpx.Request) -> httpx.Response:
    headers = httpx.Headers(
        {k: v for k, v in record.headers.items() if k.lower() not in _DROPPED_HEADERS}
    )
    if record.body_text is not None:
        content = record.body_text.encode("utf-8")
    elif record.body is not None:
        content = json.dumps(record.body).encode("utf-8")
        headers.setdefault("content-type", "application/json")
    else:
        content = b""
    return httpx.Response(record.status, headers=headers, content=content, request=request)


# -- the transports -----------------------------------------------------------------


class ReplayTransport(httpx.BaseTransport, httpx.AsyncBaseTransport):
    """Serves a cassette's exchanges in order, sync or async; refuses anything else.

    Each request must match the next exchange's method, path and (when the
    cassette names one) model; a mismatch or a request past the last
    exchange raises :class:`ReplayMismatch` and is kept in
    :attr:`mismatches`. :attr:`seen` holds every request received.
    """

    def __init__(self, exchanges: Sequence[Exchange]) -> None:
        self.exchanges = list(exchanges)
        self.seen: list[httpx.Request] = []
        self.mismatches: list[str] = []
        self._lock = threading.Lock()

    @property
    def unused(self) -> int:
        """Exchanges no request has asked for yet."""
        return max(len(self.exchanges) - len(self.seen), 0)

    def _fail(self, reason: str) -> ReplayMismatch:
        self.mismatches.append(reason)
        return ReplayMismatch(reason)

    def _serve(self, request: httpx.Request) -> httpx.Response:
        with self._lock:
            index = len(self.seen)
            self.seen.append(request)
        got = summarize_request(request)
        if index >= len(self.exchanges):
            raise self._fail(
                f"request {index + 1} ({got.method} {got.path}) is extra: the cassette holds "
                f"{len(self.exchanges)} exchange(s)"
            )
        want = self.exchanges[index].request
        if (want.method.upper(), want.path) != (got.method, got.path):
            raise self._fail(
                f"request {index + 1}: the cassette expects {want.method.upper()} {want.path}, "
                f"the client sent {got.method} {got.path}"
            )
        if want.model is not None and want.model != got.model:
            raise self._fail(
                f"request {index + 1}: the cassette expects model {want.model!r}, "
                f"the client sent {got.model!r}"
            )
        return _served(self.exchanges[index].response, request)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        request.read()
        return self._serve(request)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        await request.aread()
        return self._serve(request)


class RecordingTransport(httpx.BaseTransport):
    """Wraps a real transport and keeps each exchange as a cassette would hold it."""

    def __init__(self, inner: httpx.BaseTransport, *, secrets: Sequence[str] = ()) -> None:
        self.inner = inner
        self.secrets = tuple(s for s in secrets if s)
        self.exchanges: list[Exchange] = []
        self.unanswered: list[str] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        summary = summarize_request(request, secrets=self.secrets)
        try:
            response = self.inner.handle_request(request)
            try:
                content = response.read()
            finally:
                response.close()
        except Exception as exc:
            self.unanswered.append(f"{summary.method} {summary.path}: {type(exc).__name__}")
            raise
        text = content.decode(response.encoding or "utf-8", errors="replace")
        self.exchanges.append(
            Exchange(
                request=summary,
                response=sanitize_response(
                    response.status_code, response.headers, text, secrets=self.secrets
                ),
            )
        )
        headers = [
            (k, v)
            for k, v in response.headers.multi_items()
            if k.lower() not in {"content-encoding", "content-length", "transfer-encoding"}
        ]
        return httpx.Response(
            response.status_code, headers=headers, content=content, request=request
        )

    def close(self) -> None:
        self.inner.close()


# -- clocks -------------------------------------------------------------------------


class VirtualClock:
    """Wall-clock seconds that move only when slept on; every wait is kept in :attr:`waits`."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.now = start
        self.waits: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.now += seconds

    async def asleep(self, seconds: float) -> None:
        self.sleep(seconds)

    def __repr__(self) -> str:
        return f"VirtualClock(now={self.now!r}, waits={self.waits!r})"


class _Clock(Protocol):
    waits: list[float]

    def __call__(self) -> float: ...
    def sleep(self, seconds: float) -> None: ...
    async def asleep(self, seconds: float) -> None: ...


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


def _no_jitter() -> float:
    return 0.0  # backoffs are exact, so a replay waits what the recording waited


def _quiet(event: RetryEvent) -> None:
    return None


# -- running a recipe ---------------------------------------------------------------


def _client(
    *,
    provider: str,
    model: str,
    api_key: str | None,
    env: Mapping[str, str],
    strict_schema: bool,
    capability_matrix: Mapping[str, Any] | None = None,
    clock: _Clock,
    http: httpx.Client,
    ahttp: httpx.AsyncClient | None = None,
    base_url: str | None = None,
) -> LLMClient:
    from fluid_build.copilot.agents.cooldown import MemoryCooldownStore
    from fluid_build.copilot.agents.retry import RetryEnvelope, RetryPolicy
    from fluid_build.copilot.client import LLMClient

    envelope = RetryEnvelope(
        RetryPolicy.from_env(env),
        cooldown=MemoryCooldownStore(),
        hook=_quiet,
        clock=clock,
        sleep=clock.sleep,
        asleep=clock.asleep,
        random=_no_jitter,
    )
    return LLMClient(
        provider,
        model,
        api_key,
        base_url,
        envelope=envelope,
        http_client=http,
        async_http_client=ahttp,
        env=env,
        strict_schema=strict_schema,
        capability_matrix=capability_matrix,
    )


def _replay_client(
    cassette: Cassette,
    clock: _Clock,
    http: httpx.Client,
    ahttp: httpx.AsyncClient | None = None,
) -> LLMClient:
    return _client(
        provider=cassette.provider,
        model=cassette.model,
        api_key=REPLAY_KEY,
        env=dict(cassette.call.env),
        strict_schema=cassette.call.strict_schema,
        capability_matrix=cassette.call.capability_matrix,
        clock=clock,
        http=http,
        ahttp=ahttp,
    )


def replay_client(cassette: Cassette, *, clock: VirtualClock | None = None) -> LLMClient:
    """An :class:`LLMClient` whose provider is the cassette: no network, no real sleeping.

    The key is :data:`REPLAY_KEY`, the environment is the recipe's, the retry
    envelope runs on ``clock`` (a fresh :class:`VirtualClock` by default) with
    an in-memory cooldown and no jitter.
    """
    transport = ReplayTransport(cassette.exchanges)
    return _replay_client(
        cassette,
        clock or VirtualClock(),
        httpx.Client(transport=transport),
        httpx.AsyncClient(transport=transport),
    )


def _as_json(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    return value


def _execute(client: LLMClient, recipe: CallRecipe, clock: _Clock) -> Any:
    """Run the recipe; return the validated output as JSON (the text without a model)."""
    model = resolve_response_model(recipe.response_model) if recipe.response_model else None
    if recipe.kind == "complete":
        done = client.complete(
            recipe.messages,
            system=recipe.system,
            response_model=model,
            max_output_tokens=recipe.max_output_tokens,
        )
        return _as_json(done.parsed if model is not None else done.text)
    if recipe.kind == "stream":
        events: Iterator[Any] = client.stream(
            recipe.messages,
            system=recipe.system,
            response_model=model,
            max_output_tokens=recipe.max_output_tokens,
        )
        completion = None
        for event in events:
            if event.type == "done":
                completion = event.completion
        if completion is None:
            raise ReplayMismatch("the stream ended without its done event")
        return _as_json(completion.parsed if model is not None else completion.text)
    from fluid_build.copilot.agents.loop import AgentLoop

    loop = AgentLoop(
        client,
        response_model=model,
        system=recipe.system,
        max_output_tokens=recipe.max_output_tokens,
        clock=clock,
        env=recipe.env,
    )
    result = loop.run(str(recipe.messages[0]["content"]))
    return _as_json(result.output)


def _describe(error: BaseException) -> str:
    code = getattr(error, "code", None)
    label = type(error).__name__ + (f" [{code}]" if isinstance(code, str) else "")
    return f"{label}: {truncate(one_line(redact(str(error))), 300)}"


def _first_difference(expected: Any, actual: Any, where: str = "$") -> str | None:
    """Where two JSON values differ (floats within the tolerance), or None."""
    if isinstance(expected, bool) or isinstance(actual, bool):
        same = type(expected) is type(actual) and expected == actual
        return None if same else where
    if isinstance(expected, int | float) and isinstance(actual, int | float):
        return None if math.isclose(expected, actual, abs_tol=WAIT_TOLERANCE) else where
    if isinstance(expected, dict) and isinstance(actual, dict):
        for key in sorted(set(expected) | set(actual), key=str):
            if key not in expected or key not in actual:
                return f"{where}.{key}"
            found = _first_difference(expected[key], actual[key], f"{where}.{key}")
            if found:
                return found
        return None
    if isinstance(expected, list) and isinstance(actual, list):
        if len(expected) != len(actual):
            return f"{where} (length {len(expected)} vs {len(actual)})"
        for i, (a, b) in enumerate(zip(expected, actual, strict=True)):
            found = _first_difference(a, b, f"{where}[{i}]")
            if found:
                return found
        return None
    return None if expected == actual else where


def _short(value: Any) -> str:
    return truncate(json.dumps(value, ensure_ascii=False, default=str), 120)


def _fmt_waits(waits: Sequence[float]) -> str:
    return "[" + ", ".join(f"{w:g}" for w in waits) + "]"


@dataclass
class ReplayResult:
    """How one cassette replayed: ``ok`` when nothing differed from ``expect``."""

    name: str
    ok: bool
    mismatches: list[str]
    outcome: str
    attempts: int
    waits: list[float]
    error: str | None
    provider: str = ""
    path: str | None = None
    output: Any = field(default=None, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _judge(
    cassette: Cassette,
    transport: ReplayTransport,
    clock: _Clock,
    output: Any,
    error: BaseException | None,
) -> ReplayResult:
    expect = cassette.expect
    problems = list(transport.mismatches)
    if expect.outcome == "success":
        if error is not None:
            problems.append(f"expected success, got {_describe(error)}")
        elif expect.output is not None:
            where = _first_difference(expect.output, output)
            if where is not None:
                problems.append(
                    f"output differs at {where}: expected {_short(expect.output)}, "
                    f"got {_short(output)}"
                )
    elif error is None:
        problems.append(f"expected {expect.error_class} [{expect.error_code}], got success")
    else:
        got_class = type(error).__name__
        got_code = getattr(error, "code", None)
        if got_class != expect.error_class:
            problems.append(f"expected error class {expect.error_class}, got {_describe(error)}")
        if expect.error_code is not None and got_code != expect.error_code:
            problems.append(f"expected error code {expect.error_code}, got {got_code}")
    attempts = len(transport.seen)
    if attempts != expect.attempts:
        problems.append(f"expected {expect.attempts} request(s), the client sent {attempts}")
    elif transport.unused and not transport.mismatches:
        problems.append(f"{transport.unused} exchange(s) at the end were never requested")
    waits = list(clock.waits)
    if len(waits) != len(expect.waits) or any(
        abs(a - b) > WAIT_TOLERANCE for a, b in zip(waits, expect.waits, strict=False)
    ):
        problems.append(
            f"expected waits {_fmt_waits(expect.waits)} s, the client waited {_fmt_waits(waits)} s"
        )
    return ReplayResult(
        name=cassette.name,
        ok=not problems,
        mismatches=problems,
        outcome="error" if error is not None else "success",
        attempts=attempts,
        waits=waits,
        error=_describe(error) if error is not None else None,
        provider=cassette.provider,
        output=output,
    )


def run_cassette(cassette: Cassette) -> ReplayResult:
    """Replay ``cassette`` and compare with its ``expect``; never raises for a mismatch.

    Compared: the outcome, the error class and code (or the validated output),
    the requests sent, and the waits asked of the clock (within 1e-6 s).
    """
    clock = VirtualClock()
    transport = ReplayTransport(cassette.exchanges)
    http = httpx.Client(transport=transport)
    output: Any = None
    error: BaseException | None = None
    try:
        client = _replay_client(cassette, clock, http)
        output = _execute(client, cassette.call, clock)
    except Exception as exc:  # noqa: BLE001 - every failure is an outcome to compare
        error = exc
    finally:
        http.close()
    return _judge(cassette, transport, clock, output, error)


# -- recording ------------------------------------------------------------------------


_RECORDED_ENV: Final = (
    "FLUID_LLM_MAX_ATTEMPTS",
    "FLUID_LLM_DEADLINE_SECONDS",
    "FLUID_OLLAMA_ALLOW_REMOTE",
)


def _recipe_env(client: LLMClient, env: Mapping[str, str]) -> dict[str, str]:
    """What a replay needs from the environment: the endpoint and the retry policy."""
    from fluid_build.copilot.llm.settings import PROVIDERS

    config = client.config
    info = PROVIDERS[config.provider]
    kept: dict[str, str] = {}
    if config.base_url and info.base_url_var and config.base_url != info.default_base_url:
        kept[info.base_url_var] = redact(config.base_url, [config.api_key or ""])
    if config.provider == "azure" and config.api_version:
        kept["AZURE_OPENAI_API_VERSION"] = config.api_version
    for name in (
        "FLUID_LLM_MAX_ATTEMPTS",
        "FLUID_LLM_DEADLINE_SECONDS",
        "FLUID_OLLAMA_ALLOW_REMOTE",
    ):
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
    strict_schema: bool = False,
    name: str | None = None,
    description: str = "",
    api_key: str | None = None,
    base_url: str | None = None,
    env: Mapping[str, str] | None = None,
    transport: httpx.BaseTransport | None = None,
    clock: VirtualClock | None = None,
    now: datetime | None = None,
) -> Cassette:
    """Make one real call and keep it as a cassette (written to ``out`` when given).

    The key is resolved as :class:`LLMClient` resolves it (argument, then the
    environment). Kept: each request's method, path and model; each answer's
    status, headers without credentials or cookies, and body, redacted (the
    key is also removed by value). ``expect`` is what was observed. Retries
    run without jitter so a replay waits exactly what the recording waited;
    ``clock`` replaces real sleeping (tests).
    """
    import os

    from fluid_build.copilot.llm.settings import resolve_provider_config

    source_env = dict(os.environ if env is None else env)
    config = resolve_provider_config(provider, model, api_key, base_url, env=source_env)
    recorder = RecordingTransport(
        transport if transport is not None else httpx.HTTPTransport(),
        secrets=[config.api_key or ""],
    )
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
    )
    if response_model is not None:
        resolve_response_model(response_model)
    ticking: _Clock = clock if clock is not None else _WallClock()
    output: Any = None
    error: BaseException | None = None
    with httpx.Client(transport=recorder, timeout=httpx.Timeout(config.timeout)) as http:
        client = _client(
            provider=config.provider,
            model=config.model,
            api_key=config.api_key,
            base_url=config.base_url,
            env=source_env,
            strict_schema=strict_schema,
            clock=ticking,
            http=http,
        )
        recipe = recipe.model_copy(update={"env": _recipe_env(client, source_env)})
        try:
            output = _execute(client, recipe, ticking)
        except Exception as exc:  # noqa: BLE001 - a failure is an outcome worth keeping
            error = exc
    if recorder.unanswered:
        raise CassetteError(
            "a request got no answer, and only answers can be replayed: "
            + "; ".join(recorder.unanswered)
        )
    stamp = (now or datetime.now(UTC)).strftime("%Y-%m-%d")
    code = getattr(error, "code", None)
    cassette = Cassette(
        version=CASSETTE_VERSION,
        name=name or (Path(out).stem if out is not None else f"{config.provider}-recorded"),
        description=description,
        provider=config.provider,
        model=config.model,
        source=f"recorded {stamp} from {config.provider} ({config.model})",
        call=recipe,
        exchanges=list(recorder.exchanges),
        expect=Expectation(
            outcome="error" if error is not None else "success",
            error_class=type(error).__name__ if error is not None else None,
            error_code=code if error is not None and isinstance(code, str) else None,
            output=output if error is None else None,
            attempts=len(recorder.exchanges),
            waits=list(ticking.waits),
        ),
    )
    if out is not None:
        write_cassette(cassette, out)
    return cassette
