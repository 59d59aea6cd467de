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

:func:`record` makes a cassette from a real call; :class:`Recorder` records
any run (several calls, sync or async) through the httpx clients it hands
out. What is kept of a request is a summary (method, path, model: never
headers, keys or the body); of an answer, its status, its headers without
credentials or account ids, and its body with every secret taken out (the
request's own key by value, credential fields by name, URL userinfo and
key-like query values, known key shapes by pattern). ``bodies=False`` keeps
no prompt and no model output at all. See docs/corpus.md.
"""

from __future__ import annotations

import importlib
import json
import math
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from fluid_build._redact import (
    ACCOUNT_HEADERS,
    is_credential_header,
    one_line,
    redact,
    redact_json,
    redact_url,
    request_secrets,
    truncate,
)
from fluid_build.errors import FluidError

if TYPE_CHECKING:
    from fluid_build.copilot.call.envelope import RetryEvent
    from fluid_build.copilot.client import LLMClient

__all__ = [
    "CASSETTE_VERSION",
    "COMPARED_BODY_FIELDS",
    "MAX_RECORDED_BYTES",
    "NOT_COMPARED",
    "OMITTED",
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
    "Recorder",
    "RecordingTransport",
    "ReplayBodyOmitted",
    "ReplayMismatch",
    "ReplayResult",
    "ReplayTransport",
    "VirtualClock",
    "body_difference",
    "compared_body",
    "dump_cassette",
    "load_cassette",
    "recipe_env",
    "record",
    "register_response_model",
    "replay_client",
    "resolve_response_model",
    "run_cassette",
    "sanitize_headers",
    "sanitize_response",
    "shown_pair",
    "summarize_request",
    "write_cassette",
]

#: The cassette format this module reads and writes.
CASSETTE_VERSION: Final = 1
#: The API key a replayed client sends; it reaches no provider.
REPLAY_KEY: Final = "replay-key"
#: Waits are compared with this tolerance, in seconds.
WAIT_TOLERANCE: Final = 1e-6
#: What stands for the prompt in a cassette recorded without bodies.
OMITTED: Final = "[omitted: recorded without bodies]"
#: The largest answer a recording keeps (decompressed bytes); a larger one fails the recording.
MAX_RECORDED_BYTES: Final = 32 * 1024 * 1024

# Response headers a cassette never keeps, besides credentials and account ids:
# the framing of the original bytes (the body is stored decoded).
_FRAMING_HEADERS: Final = frozenset(
    {
        "content-length",
        "content-encoding",
        "transfer-encoding",
        "connection",
        "keep-alive",
    }
)


def _dropped(name: str) -> bool:
    low = name.lower()
    return low in _FRAMING_HEADERS or low in ACCOUNT_HEADERS or is_credential_header(low)


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
    """A replayed call asked for something the cassette does not hold.

    ``index`` is the request's number (1-based), ``field`` what differs
    (``method``, ``path``, ``model``, ``request`` for one past the last
    exchange or one never sent, ``body.<path>`` for the request body), and
    ``expected`` and ``got`` the two values, redacted and cut short. All four
    are ``None`` when the mismatch is not about one request.
    """

    def __init__(
        self,
        message: str,
        *,
        index: int | None = None,
        field: str | None = None,
        expected: str | None = None,
        got: str | None = None,
    ) -> None:
        super().__init__(message)
        self.index = index
        self.field = field
        self.expected = expected
        self.got = got

    def to_dict(self) -> dict[str, Any]:
        return {
            "error": type(self).__name__,
            "code": "replay.mismatch",
            "message": str(self),
            "request": self.index,
            "field": self.field,
            "expected": self.expected,
            "got": self.got,
        }

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            _rebuild_mismatch,
            (str(self), self.index, self.field, self.expected, self.got),
        )


def _rebuild_mismatch(
    message: str, index: int | None, field: str | None, expected: str | None, got: str | None
) -> ReplayMismatch:
    return ReplayMismatch(message, index=index, field=field, expected=expected, got=got)


class ReplayBodyOmitted(FluidError):
    """A replayed call reached an answer whose body was not recorded (``bodies=False``).

    The replay stops there: what came before (requests, waits) was checked.
    """


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
    """What was asked: never headers or keys; enough to check the order.

    ``body`` is the request's JSON body, redacted, kept only by recorders
    asked for it (``fluid forge --record``, with bodies); replay then compares
    the conversation in it (:data:`COMPARED_BODY_FIELDS`, tool results aside).
    """

    method: str
    path: str
    model: str | None = None
    body: Any | None = None


class ExchangeResponse(_Strict):
    """What the provider answered: status, kept headers, and a JSON body or raw text.

    ``omitted`` marks an answer whose body was not recorded (``bodies=False``).
    """

    status: int = Field(ge=100, le=599)
    headers: dict[str, str] = Field(default_factory=dict)
    body: Any | None = None
    body_text: str | None = None
    omitted: bool = False

    @model_validator(mode="after")
    def _one_body(self) -> ExchangeResponse:
        if self.body is not None and self.body_text is not None:
            raise ValueError("give body (JSON) or body_text (raw text), not both")
        if self.omitted and (self.body is not None or self.body_text is not None):
            raise ValueError("an omitted body has neither body nor body_text")
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
    #: False: recorded without bodies (no prompt, no model output); replay checks the flow only.
    bodies: bool = True

    @model_validator(mode="after")
    def _version(self) -> Cassette:
        if self.version != CASSETTE_VERSION:
            raise ValueError(_version_message(self.version))
        return self

    @model_validator(mode="after")
    def _bodies(self) -> Cassette:
        if not self.bodies and self.expect.output is not None:
            raise ValueError("a cassette recorded without bodies has no expected output")
        if self.bodies and any(e.response.omitted for e in self.exchanges):
            raise ValueError("an omitted body needs bodies: false")
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


#: The largest cassette file read (a recorded stream of a long answer fits easily).
MAX_CASSETTE_BYTES: Final = 64 * 1024 * 1024


def load_cassette(path: str | Path) -> Cassette:
    """Read and validate a cassette; any problem is a :class:`CassetteError` saying what."""
    from fluid_build._files import UnsafeFileError, load_json, read_regular

    where = str(path)
    try:
        # Bounded: never a FIFO, a device or a directory, never more than the limit.
        text = read_regular(path, limit=MAX_CASSETTE_BYTES, name=where).decode("utf-8")
    except UnsafeFileError as exc:
        raise CassetteError(f"{exc.reason}; {exc.advice}", path=where) from None
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise CassetteError(f"cannot be read ({reason})", path=where) from None
    except UnicodeDecodeError:
        raise CassetteError("is not UTF-8 text", path=where) from None
    try:
        data = load_json(text, name=where)
    except UnsafeFileError as exc:
        raise CassetteError(f"{exc.reason}; {exc.advice}", path=where) from None
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
    """The cassette as the JSON text this module writes (stable: same cassette, same bytes).

    ``bodies`` and ``omitted`` are written only when they say something
    (false, true), so cassettes recorded with bodies read as they always did.
    """
    data = cassette.model_dump(mode="json")
    if data.get("bodies") is True:
        del data["bodies"]
    for exchange in data["exchanges"]:
        if exchange["response"].get("omitted") is False:
            del exchange["response"]["omitted"]
        if exchange["request"].get("body") is None:
            del exchange["request"]["body"]
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def write_cassette(cassette: Cassette, path: str | Path) -> Path:
    """Write ``cassette`` to ``path`` atomically: a reader sees the old file or the whole new one.

    The text goes to a temporary file in the same directory (mode 0600), which
    is then renamed over ``path``; nothing is left behind if writing is
    interrupted.
    """
    from fluid_build._files import write_atomic

    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(target, dump_cassette(cassette).encode("utf-8"))
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
        model = redact(data["model"], secrets)
    return ExchangeRequest(
        method=request.method.upper(), path=redact_url(request.url.path, secrets), model=model
    )


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
        if _dropped(low):
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


def _served(record: ExchangeResponse, request: httpx.Request) -> httpx.Response:
    headers = httpx.Headers({k: v for k, v in record.headers.items() if not _dropped(k)})
    if record.body_text is not None:
        content = record.body_text.encode("utf-8")
    elif record.body is not None:
        content = json.dumps(record.body).encode("utf-8")
        headers.setdefault("content-type", "application/json")
    else:
        content = b""
    return httpx.Response(record.status, headers=headers, content=content, request=request)


# -- comparing request bodies --------------------------------------------------------

#: The fields of a recorded request body that replay compares: the conversation
#: (OpenAI, Anthropic, Ollama: ``messages`` and ``system``; Gemini: ``contents``
#: and ``systemInstruction``). Tool definitions, response schemas and sampling
#: settings are not compared: they come from the code and its libraries (a
#: pydantic upgrade rewrites a JSON schema), not from the run.
COMPARED_BODY_FIELDS: Final = ("messages", "system", "contents", "systemInstruction")
#: What stands for a tool's result when bodies are compared: it depends on the
#: workspace at the time (a file added since, the cassette itself), not the run.
NOT_COMPARED: Final = "[tool result: not compared]"
_MISSING: Final = "<missing>"
_MAX_COMPARED_DEPTH: Final = 64
_SHOWN_CHARS: Final = 100


def _masked(value: Any, depth: int = 0) -> Any:
    """``value`` with every tool result replaced by :data:`NOT_COMPARED`."""
    if depth > _MAX_COMPARED_DEPTH:
        return value
    if isinstance(value, list):
        return [_masked(item, depth + 1) for item in value]
    if not isinstance(value, dict):
        return value
    result_holder = value.get("role") == "tool" or value.get("type") == "tool_result"
    out: dict[str, Any] = {}
    for key, item in value.items():
        if key == "content" and result_holder:
            out[key] = NOT_COMPARED
        elif key == "functionResponse" and isinstance(item, dict):  # Gemini
            out[key] = {**item, "response": NOT_COMPARED} if "response" in item else item
        else:
            out[key] = _masked(item, depth + 1)
    return out


def compared_body(body: Any) -> dict[str, Any]:
    """What replay compares of a request body: :data:`COMPARED_BODY_FIELDS`, tool results
    masked."""
    if not isinstance(body, dict):
        return {}
    return {key: _masked(body[key]) for key in COMPARED_BODY_FIELDS if key in body}


def body_difference(expected: Any, got: Any, where: str = "body") -> tuple[str, Any, Any] | None:
    """The first place two JSON values differ, as ``(path, expected, got)``; None when equal.

    Paths read ``body.messages[2].content``; a value one side lacks is ``"<missing>"``.
    Lists are compared item by item before their lengths, so an added message is
    named by its index.
    """
    return _difference(expected, got, where, 0)


def _difference(expected: Any, got: Any, where: str, depth: int) -> tuple[str, Any, Any] | None:
    if depth > _MAX_COMPARED_DEPTH:
        return None if expected == got else (where, expected, got)
    if isinstance(expected, dict) and isinstance(got, dict):
        for key in [*expected, *(k for k in got if k not in expected)]:
            if key not in expected or key not in got:
                return f"{where}.{key}", expected.get(key, _MISSING), got.get(key, _MISSING)
            found = _difference(expected[key], got[key], f"{where}.{key}", depth + 1)
            if found:
                return found
        return None
    if isinstance(expected, list) and isinstance(got, list):
        for i, (a, b) in enumerate(zip(expected, got, strict=False)):
            found = _difference(a, b, f"{where}[{i}]", depth + 1)
            if found:
                return found
        if len(expected) != len(got):
            i = min(len(expected), len(got))
            return (
                f"{where}[{i}]",
                expected[i] if i < len(expected) else _MISSING,
                got[i] if i < len(got) else _MISSING,
            )
        return None
    same = type(expected) is type(got) and expected == got
    return None if same else (where, expected, got)


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, default=str, sort_keys=True)


def shown_pair(expected: Any, got: Any, limit: int = _SHOWN_CHARS) -> tuple[str, str]:
    """Two differing values as an operator reads them: redacted, on one line, cut short
    around the first character that differs."""
    a, b = one_line(redact(_as_text(expected))), one_line(redact(_as_text(got)))
    same = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        same += 1
    start = max(same - 30, 0)
    if start:
        a, b = "…" + a[start:], "…" + b[start:]
    return truncate(a, limit), truncate(b, limit)


def _request_json(request: httpx.Request) -> Any:
    try:
        return json.loads(request.content) if request.content else None
    except (ValueError, RecursionError, httpx.RequestNotRead):
        return None


# -- the transports -----------------------------------------------------------------


class ReplayTransport(httpx.BaseTransport, httpx.AsyncBaseTransport):
    """Serves a cassette's exchanges in order, sync or async; refuses anything else.

    Each request must match the next exchange's method, path, (when the
    cassette names one) model and (when the cassette holds it) the
    conversation in its body (:func:`compared_body`); a mismatch or a request
    past the last exchange raises :class:`ReplayMismatch`, whose reason is kept
    in :attr:`mismatches` and the error itself in :attr:`errors`. :attr:`seen`
    holds every request received. An answer recorded without its body raises
    :class:`ReplayBodyOmitted`; :attr:`omitted_at` is the index of the first
    such exchange reached.
    """

    def __init__(self, exchanges: Sequence[Exchange]) -> None:
        self.exchanges = list(exchanges)
        self.seen: list[httpx.Request] = []
        self.mismatches: list[str] = []
        self.errors: list[ReplayMismatch] = []
        self.omitted_at: int | None = None
        self._lock = threading.Lock()

    @property
    def unused(self) -> int:
        """Exchanges no request has asked for yet."""
        return max(len(self.exchanges) - len(self.seen), 0)

    @property
    def first_mismatch(self) -> ReplayMismatch | None:
        """The first request that differed from the cassette, as the error raised for it."""
        with self._lock:
            return self.errors[0] if self.errors else None

    def finish(self) -> None:
        """Raise the first mismatch, or one naming the first exchange never requested.

        Call it when the run is over: a replay that stopped short of the
        cassette's end did not do what the recording did.
        """
        first = self.first_mismatch
        if first is not None:
            raise first
        if self.unused:
            index = len(self.seen)
            want = self.exchanges[index].request
            expected = f"{want.method.upper()} {want.path}"
            raise ReplayMismatch(
                f"request {index + 1} ({expected}) was never sent: the run ended after "
                f"{index} request(s) and the cassette holds {len(self.exchanges)}",
                index=index + 1,
                field="request",
                expected=expected,
                got="(none: the run ended)",
            )

    def _fail(
        self,
        reason: str,
        *,
        index: int,
        field: str,
        expected: str,
        got: str,
    ) -> ReplayMismatch:
        error = ReplayMismatch(reason, index=index, field=field, expected=expected, got=got)
        with self._lock:
            self.mismatches.append(reason)
            self.errors.append(error)
        return error

    def _serve(self, request: httpx.Request) -> httpx.Response:
        with self._lock:
            index = len(self.seen)
            self.seen.append(request)
        got = summarize_request(request)
        number = index + 1
        if index >= len(self.exchanges):
            raise self._fail(
                f"request {number} ({got.method} {got.path}) is extra: the cassette holds "
                f"{len(self.exchanges)} exchange(s)",
                index=number,
                field="request",
                expected=f"none (the cassette holds {len(self.exchanges)} exchange(s))",
                got=f"{got.method} {got.path}",
            )
        want = self.exchanges[index].request
        if (want.method.upper(), want.path) != (got.method, got.path):
            raise self._fail(
                f"request {number}: the cassette expects {want.method.upper()} {want.path}, "
                f"the client sent {got.method} {got.path}",
                index=number,
                field="method" if want.method.upper() != got.method else "path",
                expected=f"{want.method.upper()} {want.path}",
                got=f"{got.method} {got.path}",
            )
        if want.model is not None and want.model != got.model:
            raise self._fail(
                f"request {number}: the cassette expects model {want.model!r}, "
                f"the client sent {got.model!r}",
                index=number,
                field="model",
                expected=truncate(want.model, _SHOWN_CHARS),
                got=truncate(redact(str(got.model)), _SHOWN_CHARS),
            )
        if want.body is not None:
            sent = redact_json(_request_json(request))
            found = body_difference(compared_body(want.body), compared_body(sent))
            if found is not None:
                where, expected, actual = found
                shown_expected, shown_got = shown_pair(expected, actual)
                raise self._fail(
                    f"request {number}: the request differs at {where}: the cassette expects "
                    f"{shown_expected!r}, the client sent {shown_got!r}",
                    index=number,
                    field=where,
                    expected=shown_expected,
                    got=shown_got,
                )
        response = self.exchanges[index].response
        if response.omitted:
            if self.omitted_at is None:
                self.omitted_at = index
            raise ReplayBodyOmitted(
                f"request {index + 1}: the answer (HTTP {response.status}) was recorded without "
                "its body; replay checks the exchanges up to here"
            )
        return _served(response, request)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        request.read()
        return self._serve(request)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        await request.aread()
        return self._serve(request)


class _Raw:
    """One exchange as it happened, kept until the cassette is made (then redacted)."""

    __slots__ = ("body", "headers", "method", "model", "path", "status", "text")

    def __init__(
        self,
        method: str,
        path: str,
        model: str | None,
        status: int,
        headers: list[tuple[str, str]],
        text: str,
        body: Any = None,
    ) -> None:
        self.method, self.path, self.model = method, path, model
        self.status, self.headers, self.text = status, headers, text
        self.body = body


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

        Without ``inner`` the client is made as httpx makes any client, so the
        proxies of the environment (``HTTPS_PROXY``, ``ALL_PROXY``, ``NO_PROXY``)
        and its certificate settings apply as they would to a call that is not
        recorded; then each of its transports is wrapped.
        """
        if inner is not None:
            return httpx.Client(transport=self.transport(inner), **kwargs)
        http = httpx.Client(**kwargs)
        self._wrap(http)
        return http

    def async_client(
        self, inner: httpx.AsyncBaseTransport | None = None, **kwargs: Any
    ) -> httpx.AsyncClient:
        """An ``httpx.AsyncClient`` recording every exchange; proxies as in :meth:`client`."""
        if inner is not None:
            return httpx.AsyncClient(transport=self.async_transport(inner), **kwargs)
        http = httpx.AsyncClient(**kwargs)
        self._wrap(http)
        return http

    def _wrap(self, http: httpx.Client | httpx.AsyncClient) -> None:
        """Record through every transport ``http`` chose: its default one and its proxy mounts.

        httpx picks the proxy transports only when it makes the transport
        itself, so they are wrapped after the fact (``_transport`` and
        ``_mounts`` have held them since httpx 0.18).
        """
        http._transport = RecordingTransport(http._transport, recorder=self)
        http._mounts = {  # type: ignore[assignment]
            pattern: None if transport is None else RecordingTransport(transport, recorder=self)
            for pattern, transport in http._mounts.items()
        }

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
        text = content.decode(response.encoding or "utf-8", errors="replace")
        raw = _Raw(
            request.method.upper(),
            request.url.path,
            model,
            response.status_code,
            list(response.headers.multi_items()),
            text,
            data if self.bodies and self.request_bodies else None,
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
                    ),
                    response=sanitize_response(
                        raw.status, headers, raw.text, secrets=secrets, bodies=self.bodies
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
        )


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

    def _too_big(self, size: int) -> CassetteError | None:
        limit = self.recorder.max_bytes
        if size > limit:
            return CassetteError(f"the answer is larger than {limit} bytes; it is not recorded")
        return None

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
                for chunk in response.iter_bytes():
                    buf += chunk
                    problem = self._too_big(len(buf))
                    if problem is not None:
                        raise problem
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
                async for chunk in response.aiter_bytes():
                    buf += chunk
                    problem = self._too_big(len(buf))
                    if problem is not None:
                        raise problem
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
    from fluid_build.copilot.call.envelope import RetryEnvelope, RetryPolicy
    from fluid_build.copilot.client import LLMClient
    from fluid_build.copilot.health.cooldown import MemoryCooldownStore

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
    from fluid_build.copilot.loop.agent import AgentLoop

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
    if transport.omitted_at is not None:
        return _judge_flow(cassette, transport, clock)
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


def _judge_flow(cassette: Cassette, transport: ReplayTransport, clock: _Clock) -> ReplayResult:
    """A replay that reached an answer recorded without its body: compare the flow up to it.

    The requests so far matched (or the mismatches say where not); the waits
    taken are the recorded ones, in order; when the omitted answer was the
    last exchange, the request count and every wait must match too. The
    outcome and the output cannot be compared: they came from the body.
    """
    expect = cassette.expect
    problems = list(transport.mismatches)
    attempts = len(transport.seen)
    waits = list(clock.waits)
    last = transport.omitted_at == len(cassette.exchanges) - 1
    wanted = list(expect.waits) if last else list(expect.waits[: len(waits)])
    if last and attempts != expect.attempts:
        problems.append(f"expected {expect.attempts} request(s), the client sent {attempts}")
    if len(waits) != len(wanted) or any(
        abs(a - b) > WAIT_TOLERANCE for a, b in zip(waits, wanted, strict=False)
    ):
        problems.append(
            f"expected waits {_fmt_waits(wanted)} s up to request {attempts}, "
            f"the client waited {_fmt_waits(waits)} s"
        )
    return ReplayResult(
        name=cassette.name,
        ok=not problems,
        mismatches=problems,
        outcome="flow-only",
        attempts=attempts,
        waits=waits,
        error=None,
        provider=cassette.provider,
    )


def run_cassette(cassette: Cassette) -> ReplayResult:
    """Replay ``cassette`` and compare with its ``expect``; never raises for a mismatch.

    Compared: the outcome, the error class and code (or the validated output),
    the requests sent, and the waits asked of the clock (within 1e-6 s). A
    cassette recorded without bodies replays up to its first answer without
    a body and compares the flow up to there (outcome ``flow-only``).
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


def recipe_env(client: LLMClient, env: Mapping[str, str]) -> dict[str, str]:
    """What a replay needs from the environment: the endpoint and the retry policy."""
    from fluid_build.copilot.llm.settings import PROVIDERS

    config = client.config
    info = PROVIDERS[config.provider]
    kept: dict[str, str] = {}
    if config.base_url and info.base_url_var and config.base_url != info.default_base_url:
        kept[info.base_url_var] = redact_url(config.base_url, [config.api_key or ""])
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
    )
    if response_model is not None:
        resolve_response_model(response_model)
    ticking: _Clock = clock if clock is not None else _WallClock()
    output: Any = None
    error: BaseException | None = None
    with recorder.client(transport, timeout=httpx.Timeout(config.timeout)) as http:
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
        recipe = recipe.model_copy(update={"env": recipe_env(client, source_env)})
        try:
            output = _execute(client, recipe, ticking)
        except Exception as exc:  # noqa: BLE001 - a failure is an outcome worth keeping
            error = exc
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
