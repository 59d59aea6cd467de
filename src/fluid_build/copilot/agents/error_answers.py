"""What an error answer says, before anyone judges it.

The wait it asks for (``Retry-After``, ``retry-after-ms``, the rate-limit
reset headers, a wait stated in the message), the kind of body it carries
(JSON, an SSE error event, an HTML gateway page, text, binary, nothing) and
the provider's own fields (message, type, code, status, param, Google's
RetryInfo/QuotaFailure/ErrorInfo details), the token counts an overflow
message states, and all of it gathered as :class:`Evidence`. An answer
arrives here as plain data, :class:`ErrorAnswer` (status, body bytes,
headers, provider, model, where it came from and the secrets to keep out of
the error): an HTTP response, a stream's error event and a Bedrock exception
frame alike, so nothing needs to pose as an ``httpx.Response``. Reading never
raises and never reads more than :data:`MAX_BODY_BYTES`;
:mod:`.classification_rules` decides what it all means.
"""

from __future__ import annotations

import contextlib
import html
import json
import math
import re
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, Final, Literal

import httpx

from fluid_build._redact import one_line, request_secrets, truncate

__all__ = [
    "MAX_BODY_BYTES",
    "Body",
    "BodyKind",
    "ErrorAnswer",
    "ErrorFields",
    "Evidence",
    "HeadersLike",
    "extract_fields",
    "extract_fields_loosely",
    "html_text",
    "html_title",
    "overflow_numbers",
    "read_body",
    "request_secrets_of",
    "requested_reset",
    "requested_wait",
    "wait_from_message",
]

#: How much of an error body is read and inspected; the rest is ignored.
MAX_BODY_BYTES: Final = 64 * 1024

HeadersLike = httpx.Headers | Mapping[str, str] | Iterable[tuple[str, str]] | None

# --------------------------------------------------------------------------
# Retry-After and its fallbacks
# --------------------------------------------------------------------------

_SECONDS = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*$")
# What a run of digits too long for a float stands for: longer than any cap.
_LONGEST: Final = sys.float_info.max


def _number(digits: str) -> float:
    """``digits`` as a float; more digits than a float holds is still a number, not junk."""
    return min(float(digits), _LONGEST)


def _now_ts(now: float | datetime | None) -> float:
    if now is None:
        return time.time()
    if isinstance(now, datetime):
        return (now if now.tzinfo else now.replace(tzinfo=UTC)).timestamp()
    return float(now)


def _as_headers(headers: HeadersLike) -> httpx.Headers:
    if headers is None:
        return httpx.Headers()
    if isinstance(headers, httpx.Headers):
        return headers
    try:
        return httpx.Headers(list(headers.items() if isinstance(headers, Mapping) else headers))
    except Exception:  # noqa: BLE001 - garbage headers mean "no hint", never a crash
        return httpx.Headers()


def _nonnegative(value: float) -> float | None:
    return value if math.isfinite(value) and value >= 0 else None


def _parse_http_date(value: str, now: float) -> float | None:
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    try:
        delta = when.timestamp() - now
    except (OverflowError, OSError, ValueError):
        return None
    # A date already past means the server gave no usable wait (often clock
    # skew): fall back to backoff rather than hammering at once.
    if delta <= 0:
        return None
    return _nonnegative(delta)


def requested_wait(headers: HeadersLike, now: float | datetime | None) -> float | None:
    """What the server asked for, before the cap."""
    try:
        parsed = _as_headers(headers)
        for raw in parsed.get_list("retry-after-ms"):
            match = _SECONDS.match(raw)
            if match:
                seconds = _nonnegative(_number(match.group(1)) / 1000.0)
                if seconds is not None:
                    return seconds
        for raw in parsed.get_list("retry-after"):
            match = _SECONDS.match(raw)
            if match:
                seconds = _nonnegative(_number(match.group(1)))
            else:
                seconds = _parse_http_date(raw.strip(), _now_ts(now))
            if seconds is not None:
                return seconds
    except Exception:  # noqa: BLE001 - the contract is "never raises"
        return None
    return None


# "6m0s", "20ms", "1h2m3.5s", "0.5s": the duration form of OpenAI and Groq.
_DURATION = re.compile(
    r"^\s*(?:(?P<h>\d+(?:\.\d+)?)h)?(?:(?P<m>\d+(?:\.\d+)?)m(?!s))?"
    r"(?:(?P<s>\d+(?:\.\d+)?)s)?(?:(?P<ms>\d+(?:\.\d+)?)ms)?\s*$"
)


def _parse_duration(value: str) -> float | None:
    match = _DURATION.match(value)
    if not match or not any(match.groupdict().values()):
        return None
    parts = {k: _number(v) for k, v in match.groupdict().items() if v}
    total = (
        parts.get("h", 0.0) * 3600
        + parts.get("m", 0.0) * 60
        + parts.get("s", 0.0)
        + parts.get("ms", 0.0) / 1000
    )
    return _nonnegative(min(total, _LONGEST))


def _parse_reset_value(value: str, now: float) -> float | None:
    value = value.strip()
    if not value:
        return None
    match = _SECONDS.match(value)
    if match:
        number = _number(match.group(1))
        if number > 1e12:  # epoch milliseconds (OpenRouter)
            return _nonnegative(number / 1000 - now)
        if number > 1e9:  # epoch seconds
            return _nonnegative(number - now)
        return _nonnegative(number)
    duration = _parse_duration(value)
    if duration is not None:
        return duration
    try:  # RFC 3339, Anthropic's form
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    delta = when.timestamp() - now
    return _nonnegative(delta) if delta > 0 else None


_RESET_HEADERS: Final = (
    # (reset header, remaining header)
    ("x-ratelimit-reset-requests", "x-ratelimit-remaining-requests"),
    ("x-ratelimit-reset-tokens", "x-ratelimit-remaining-tokens"),
    ("anthropic-ratelimit-requests-reset", "anthropic-ratelimit-requests-remaining"),
    ("anthropic-ratelimit-tokens-reset", "anthropic-ratelimit-tokens-remaining"),
    ("anthropic-ratelimit-input-tokens-reset", "anthropic-ratelimit-input-tokens-remaining"),
    ("anthropic-ratelimit-output-tokens-reset", "anthropic-ratelimit-output-tokens-remaining"),
    ("x-ratelimit-reset", "x-ratelimit-remaining"),
    ("ratelimit-reset", "ratelimit-remaining"),
)


def requested_reset(headers: HeadersLike, now: float | datetime | None) -> float | None:
    """The wait the rate-limit reset headers name, before the cap."""
    try:
        parsed = _as_headers(headers)
        moment = _now_ts(now)
        exhausted: list[float] = []
        others: list[float] = []
        for reset_name, remaining_name in _RESET_HEADERS:
            raw = parsed.get(reset_name)
            if raw is None:
                continue
            seconds = _parse_reset_value(raw, moment)
            if seconds is None:
                continue
            remaining = parsed.get(remaining_name, "").strip()
            (exhausted if remaining == "0" else others).append(seconds)
        if exhausted:
            return max(exhausted)
        if others:
            return max(others)
    except Exception:  # noqa: BLE001 - a hint, never a crash
        return None
    return None


_MESSAGE_WAIT = re.compile(
    r"(?i)(?:try again|retry) (?:in|after) "
    r"(?:(?P<dur>(?:\d+(?:\.\d+)?(?:h|ms|m|s))+)\b"
    r"|(?P<num>\d+(?:\.\d+)?) ?(?P<unit>milliseconds?|ms|seconds?|secs?|s|minutes?|mins?)\b)"
)


def wait_from_message(message: str) -> float | None:
    """The wait a message states ("Please try again in 9.816s"), or None."""
    match = _MESSAGE_WAIT.search(message)
    if not match:
        return None
    if match.group("dur"):
        return _parse_duration(match.group("dur"))
    number = _number(match.group("num"))
    unit = match.group("unit").lower()
    if unit == "ms" or unit.startswith("milli"):
        number /= 1000
    elif unit.startswith("m"):
        number *= 60
    return _nonnegative(min(number, _LONGEST))


# --------------------------------------------------------------------------
# Reading an error body
# --------------------------------------------------------------------------

BodyKind = Literal["json", "sse", "html", "text", "binary", "empty"]


@dataclass(slots=True)
class Body:
    """An error body's kind and, for text kinds, its decoded prefix and parsed data."""

    kind: BodyKind
    text: str = ""
    data: Any = None
    size: int | None = None
    truncated: bool = False


def _read_prefix(response: httpx.Response) -> tuple[bytes, int | None, bool]:
    try:
        content = response.content
    except httpx.ResponseNotRead:
        content = None
    if content is not None:
        return content[:MAX_BODY_BYTES], len(content), len(content) > MAX_BODY_BYTES
    # An unread sync stream: read a bounded prefix. An async stream cannot be
    # read from here; the adapters read error bodies before raising.
    if not isinstance(response.stream, httpx.SyncByteStream):
        return b"", None, False
    buf = bytearray()
    # Whatever arrived before a failure is all there is to judge.
    with contextlib.suppress(Exception):
        for chunk in response.iter_bytes():
            buf += chunk
            if len(buf) >= MAX_BODY_BYTES:
                break
    with contextlib.suppress(Exception):
        response.close()
    return bytes(buf[:MAX_BODY_BYTES]), None, len(buf) >= MAX_BODY_BYTES


def _decode(prefix: bytes, charset: str | None) -> str:
    try:
        return prefix.decode(charset or "utf-8", errors="replace")
    except (LookupError, ValueError):
        return prefix.decode("utf-8", errors="replace")


def _looks_binary(prefix: bytes, text: str) -> bool:
    if b"\x00" in prefix:
        return True
    sample = text[:2000]
    if not sample:
        return False
    bad = sum(1 for ch in sample if ch == "\ufffd" or (ord(ch) < 32 and ch not in "\r\n\t"))
    return bad / len(sample) > 0.1


def _parse_json(text: str) -> Any:
    try:
        return json.loads(text)
    except Exception:  # noqa: BLE001 - truncated, deeply nested or not JSON at all
        return None


def _parse_sse(text: str) -> Any:
    """The first error payload among the events of an SSE body, or None."""
    event = ""
    data_lines: list[str] = []

    def flush() -> Any:
        if not data_lines:
            return None
        payload = _parse_json("\n".join(data_lines))
        is_error = event == "error" or (
            isinstance(payload, dict) and ("error" in payload or payload.get("type") == "error")
        )
        if is_error:
            return payload if payload is not None else {"error": {"message": "\n".join(data_lines)}}
        return None

    for line in text.splitlines():
        if not line.strip():
            found = flush()
            if found is not None:
                return found
            event, data_lines = "", []
        elif line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data_lines.append(line[5:].strip())
    return flush()


def _charset(response: httpx.Response) -> str | None:
    try:
        return response.charset_encoding
    except Exception:  # noqa: BLE001 - a content-type header httpx cannot parse
        return None


def read_body(response: httpx.Response) -> Body:
    """The first :data:`MAX_BODY_BYTES` of an error answer, sorted by kind; never raises."""
    prefix, size, truncated = _read_prefix(response)
    return _sort_body(prefix, size, truncated, response.headers, _charset(response))


def _sort_body(
    prefix: bytes, size: int | None, truncated: bool, headers: httpx.Headers, charset: str | None
) -> Body:
    if not prefix.strip():
        return Body("empty", size=size)
    text = _decode(prefix, charset)
    if _looks_binary(prefix, text):
        return Body("binary", size=size, truncated=truncated)
    content_type = headers.get("content-type", "").lower()
    stripped = text.lstrip()
    if "event-stream" in content_type or stripped.startswith(("event:", "data:")):
        return Body("sse", text, _parse_sse(text), size, truncated)
    if stripped.startswith(("{", "[")) or "json" in content_type:
        return Body("json", text, _parse_json(text), size, truncated)
    if "html" in content_type or stripped[:1] == "<":
        return Body("html", text, None, size, truncated)
    return Body("text", text, None, size, truncated)


# --------------------------------------------------------------------------
# An error answer as plain data
# --------------------------------------------------------------------------


def request_secrets_of(request: httpx.Request) -> tuple[str, ...]:
    """What a request carries that is secret: key headers, userinfo, key-like parameters."""
    found = request_secrets(request.headers.multi_items(), request.url)
    if request.url.password:
        found.append(request.url.password)
    if request.url.username:
        found.append(request.url.username)
    return tuple(s for s in dict.fromkeys(found) if s)


@dataclass(frozen=True, slots=True)
class ErrorAnswer:
    """One error answer, as plain data: what the classifier judges.

    ``body`` is at most the first :data:`MAX_BODY_BYTES` of the body; ``size``
    is the whole body's length when it is known and ``truncated`` says that
    more was sent than ``body`` holds. ``url`` is where the request went (shown
    in the error redacted, and a hint to the provider and model when they are
    not given); ``secrets`` are values no part of the error may show (the
    request's key). Build one with :meth:`of` (bytes), :meth:`of_json` (an
    event or frame already parsed) or :meth:`of_response` (an httpx answer).
    """

    status: int
    body: bytes = b""
    headers: httpx.Headers = field(default_factory=httpx.Headers)
    provider: str | None = None
    model: str | None = None
    url: httpx.URL | None = None
    secrets: tuple[str, ...] = ()
    size: int | None = None
    truncated: bool = False
    charset: str | None = None

    @classmethod
    def of(
        cls,
        status: int,
        content: bytes,
        headers: HeadersLike = None,
        *,
        provider: str | None = None,
        model: str | None = None,
        url: httpx.URL | str | None = None,
        secrets: Iterable[str] = (),
        charset: str | None = None,
    ) -> ErrorAnswer:
        """An answer whose whole body is ``content``."""
        return cls(
            status,
            content[:MAX_BODY_BYTES],
            _as_headers(headers),
            provider,
            model,
            None if url is None else httpx.URL(url),
            tuple(s for s in secrets if s),
            len(content),
            len(content) > MAX_BODY_BYTES,
            charset,
        )

    @classmethod
    def of_json(
        cls,
        status: int,
        data: Any,
        headers: HeadersLike = None,
        *,
        provider: str | None = None,
        model: str | None = None,
        url: httpx.URL | str | None = None,
        secrets: Iterable[str] = (),
    ) -> ErrorAnswer:
        """An answer whose body is ``data`` as JSON (a stream's error event, an
        exception frame): encoded as httpx encodes a JSON body, so the error
        quotes the same bytes whichever way the answer came."""
        content = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        merged = httpx.Headers(_as_headers(headers))
        merged["content-type"] = "application/json"
        return cls.of(
            status,
            content.encode("utf-8"),
            merged,
            provider=provider,
            model=model,
            url=url,
            secrets=secrets,
        )

    @classmethod
    def of_response(
        cls,
        response: httpx.Response,
        *,
        provider: str | None = None,
        model: str | None = None,
        secrets: Iterable[str] = (),
    ) -> ErrorAnswer:
        """What a real httpx answer holds: its status, the first
        :data:`MAX_BODY_BYTES` of its body (an unread sync stream is read that
        far), its headers, and its request's URL and secrets."""
        try:
            request: httpx.Request | None = response.request
        except RuntimeError:  # a Response built without a request
            request = None
        found = tuple(secrets)
        if request is not None:
            found = tuple(dict.fromkeys([*found, *request_secrets_of(request)]))
        prefix, size, truncated = _read_prefix(response)
        return cls(
            response.status_code,
            prefix,
            response.headers,
            provider,
            model,
            None if request is None else request.url,
            found,
            size,
            truncated,
            _charset(response),
        )

    def read(self) -> Body:
        """The body sorted by kind (JSON, SSE, HTML, text, binary, empty) and parsed."""
        return _sort_body(self.body, self.size, self.truncated, self.headers, self.charset)


# --------------------------------------------------------------------------
# The provider's own description of the error
# --------------------------------------------------------------------------


@dataclass(slots=True)
class ErrorFields:
    """The provider's own description of the error, whatever its envelope."""

    message: str = ""
    type: str = ""
    code: str = ""
    param: str = ""
    #: The HTTP status the body states (``"code": 429``, ``"status": "401"``).
    body_status: int | None = None
    #: The status the body's error type stands for (``rate_limit_error`` -> 429), used
    #: to judge an error that came without one (a stream's error event); the body did
    #: not state it, so it is never reported as the body's status.
    type_status: int | None = None
    retry_delay: float | None = None
    quota_ids: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    request_id: str = ""
    numbers: dict[str, int] = field(default_factory=dict)
    extra_text: list[str] = field(default_factory=list)

    def search_text(self) -> str:
        parts = [
            self.message,
            self.type,
            self.code,
            *self.reasons,
            *self.quota_ids,
            *self.extra_text,
        ]
        return " ".join(p for p in parts if p).lower()[:16_000]


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, bool | int | float):
        return str(value)
    try:
        return json.dumps(value, default=str)[:4000]
    except Exception:  # noqa: BLE001
        return ""


_GOOGLE_STATUS: Final = {
    "INVALID_ARGUMENT": 400,
    "FAILED_PRECONDITION": 400,
    "OUT_OF_RANGE": 400,
    "UNAUTHENTICATED": 401,
    "PERMISSION_DENIED": 403,
    "NOT_FOUND": 404,
    "ABORTED": 409,
    "ALREADY_EXISTS": 409,
    "RESOURCE_EXHAUSTED": 429,
    "CANCELLED": 499,
    "UNKNOWN": 500,
    "INTERNAL": 500,
    "DATA_LOSS": 500,
    "UNIMPLEMENTED": 501,
    "UNAVAILABLE": 503,
    "DEADLINE_EXCEEDED": 504,
}

# Error types that name their HTTP meaning, for errors arriving on a 200 stream.
_TYPE_STATUS: Final = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "rate_limit_exceeded": 429,
    "api_error": 500,
    "server_error": 500,
    "internal_server_error": 500,
    "overloaded_error": 529,
    "timeout_error": 504,
    "billing_error": 402,
}


def _walk_google_details(details: Any, info: ErrorFields) -> None:
    if not isinstance(details, list):
        return
    for item in details[:20]:
        if not isinstance(item, dict):
            continue
        kind = _text(item.get("@type"))
        if kind.endswith("RetryInfo"):
            delay = item.get("retryDelay")
            if isinstance(delay, str):
                info.retry_delay = _parse_duration(delay)
            elif isinstance(delay, dict):  # {"seconds": 31, "nanos": 0}
                with contextlib.suppress(TypeError, ValueError, OverflowError):
                    seconds = delay.get("seconds", 0)
                    if isinstance(seconds, int) and not isinstance(seconds, bool):
                        seconds = min(seconds, _LONGEST)  # a huge count is long, not junk
                    elif isinstance(seconds, str) and seconds.strip().isdigit():
                        seconds = _number(seconds.strip())
                    info.retry_delay = _nonnegative(
                        float(seconds) + float(delay.get("nanos", 0)) / 1e9
                    )
        elif kind.endswith("QuotaFailure"):
            for violation in (item.get("violations") or [])[:20]:
                if isinstance(violation, dict):
                    info.quota_ids.append(
                        _text(violation.get("quotaId") or violation.get("quotaMetric"))
                    )
        elif kind.endswith("ErrorInfo"):
            info.reasons.append(_text(item.get("reason")))


def extract_fields(data: Any) -> ErrorFields:
    """The fields of a parsed error body: OpenAI, Anthropic, Google, Ollama, vLLM envelopes."""
    info = ErrorFields()
    if isinstance(data, list) and data:
        data = data[0]
    if not isinstance(data, dict):
        return info
    info.request_id = _text(data.get("request_id"))
    error = data.get("error")
    if isinstance(error, dict):
        source = error
    elif isinstance(error, str):  # Ollama: {"error": "model not found"}
        info.message = error
        source = data
    else:  # vLLM/Mistral: the fields sit at the top level
        source = data
    if not info.message:
        info.message = _text(
            source.get("message") or source.get("detail") or source.get("error_message")
        )
    raw_type = source.get("type")
    status = source.get("status")
    info.type = _text(raw_type if raw_type not in (None, "error") else status)
    if isinstance(status, str) and status in _GOOGLE_STATUS:
        info.type = status
    code = source.get("code")
    info.code = _text(code)
    info.param = _text(source.get("param"))
    for candidate in (code, source.get("status"), data.get("code")):
        if isinstance(candidate, int) and 100 <= candidate <= 599:
            info.body_status = candidate
            break
        if isinstance(candidate, str) and candidate.isdigit() and 100 <= int(candidate) <= 599:
            info.body_status = int(candidate)
            break
    info.type_status = _GOOGLE_STATUS.get(info.type) or _TYPE_STATUS.get(info.type.lower())
    _walk_google_details(source.get("details"), info)
    inner = source.get("innererror")
    if isinstance(inner, dict):  # Azure content filter
        info.reasons.append(_text(inner.get("code")))
    metadata = source.get("metadata")
    if isinstance(metadata, dict):  # OpenRouter carries the upstream text here
        info.extra_text.append(_text(metadata.get("raw")))
    for key in ("n_prompt_tokens", "n_ctx"):  # llama.cpp server
        value = source.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            info.numbers[key] = value
    return info


_FIELD = r'"{name}"\s*:\s*"((?:[^"\\]|\\.){{0,2000}})'


def extract_fields_loosely(text: str) -> ErrorFields:
    """Best-effort fields from JSON that did not parse (a truncated body)."""
    info = ErrorFields()
    for name in ("message", "type", "code", "status", "param"):
        match = re.search(_FIELD.format(name=name), text)
        if not match:
            continue
        value = match.group(1)
        with contextlib.suppress(Exception):  # undo JSON escapes when they are whole
            value = json.loads(f'"{value}"')
        if name == "message":
            info.message = value
        elif (name == "status" and value in _GOOGLE_STATUS) or (name == "type" and not info.type):
            info.type = value
        elif name == "code":
            info.code = value
        elif name == "param":
            info.param = value
    return info


def html_title(text: str) -> str:
    """An HTML page's title (or first heading), one line."""
    match = re.search(r"(?is)<title[^>]*>(.*?)</title>", text) or re.search(
        r"(?is)<h1[^>]*>(.*?)</h1>", text
    )
    if not match:
        return ""
    return truncate(one_line(html.unescape(re.sub(r"<[^>]+>", " ", match.group(1)))), 120)


def html_text(text: str) -> str:
    """An HTML page's visible text, without scripts and styles."""
    body = re.sub(r"(?is)<(script|style)[^>]*>.*?</\1>", " ", text[:20_000])
    return one_line(html.unescape(re.sub(r"<[^>]+>", " ", body)))[:4000]


# --------------------------------------------------------------------------
# The numbers in an overflow message
# --------------------------------------------------------------------------

_OVERFLOW_NUMBERS: Final[tuple[tuple[re.Pattern[str], int | None, int], ...]] = (
    # (pattern, group of prompt tokens or None, group of the window)
    (re.compile(r"(?i)(\d+) tokens? > (\d+) (?:tokens? )?maximum"), 1, 2),
    (
        re.compile(r"(?i)request \((\d+) tokens\) exceeds the available context size \((\d+)"),
        1,
        2,
    ),
    (
        re.compile(r"(?i)input \((\d+) tokens\) is larger than the max context size \((\d+)"),
        1,
        2,
    ),
    (re.compile(r"(?i)current length is (\d+) while limit is (\d+)"), 1, 2),
    (
        re.compile(r"(?i)input token count is (\d+) but (?:the )?model only supports up to (\d+)"),
        1,
        2,
    ),
    (re.compile(r"(?i)total number of tokens.{0,40}cannot exceed (\d+) - received (\d+)"), 2, 1),
    (
        re.compile(
            r"(?i)input token count \((\d+)\) exceeds the maximum number of tokens"
            r" allowed \((\d+)\)"
        ),
        1,
        2,
    ),
    (re.compile(r"(?i)prompt contains (\d+) tokens.*?(\d+) maximum context length"), 1, 2),
    (
        re.compile(
            r"(?i)maximum context length is (\d+) tokens.*?"
            r"(?:resulted in|requested(?: about)?|has) (\d+)(?: input)? tokens"
        ),
        2,
        1,
    ),
    (re.compile(r"(?i)limit:? (\d+), requested:? (\d+)"), 2, 1),
    # The window alone, when only it is stated.
    (re.compile(r"(?i)exceeds the maximum number of tokens allowed \(?(\d+)"), None, 1),
    (re.compile(r"(?i)maximum context (?:limit|length) (?:is|of) (\d+)"), None, 1),
)


def overflow_numbers(fields: ErrorFields) -> tuple[int | None, int | None]:
    """The prompt's tokens and the model's window, as far as the answer states them."""
    if "n_prompt_tokens" in fields.numbers or "n_ctx" in fields.numbers:
        return fields.numbers.get("n_prompt_tokens"), fields.numbers.get("n_ctx")
    text = f"{fields.message} {' '.join(fields.extra_text)}"
    for pattern, prompt_group, window_group in _OVERFLOW_NUMBERS:
        match = pattern.search(text)
        if match:
            prompt = int(match.group(prompt_group)) if prompt_group is not None else None
            return prompt, int(match.group(window_group))
    return None, None


# --------------------------------------------------------------------------
# The answer as the rules see it
# --------------------------------------------------------------------------


def _judged_status(status: int, fields: ErrorFields) -> int:
    """The status an answer is judged by, when it is not the HTTP status itself.

    An error inside a 2xx/3xx (a stream's error event) has its body's status, or 500;
    a gateway that relays an upstream 429 as a 5xx is a rate limit.
    """
    if 400 <= status <= 599:
        relayed_limit = 429 in (fields.body_status, fields.type_status)
        return 429 if status >= 500 and relayed_limit else status
    for stated in (fields.body_status, fields.type_status):
        if stated is not None:
            return stated
    return 500


class Evidence:
    """One error answer as the rules see it: its statuses, the provider's fields, its words."""

    __slots__ = (
        "_wait",
        "body",
        "fields",
        "headers",
        "judged",
        "now",
        "status",
        "text",
    )

    def __init__(
        self,
        status: int,
        headers: httpx.Headers,
        body: Body,
        now: float | datetime | None,
    ) -> None:
        if body.kind in {"json", "sse"}:
            fields = (
                extract_fields(body.data)
                if body.data is not None
                else extract_fields_loosely(body.text)
            )
        else:
            fields = ErrorFields()
        text = fields.search_text()
        if body.kind == "html":
            text = f"{text} {html_text(body.text).lower()}"
        elif body.kind == "text":
            text = f"{text} {body.text[:4000].lower()}"
        self.status = status
        self.headers = headers
        self.body = body
        self.now = now
        self.fields = fields
        #: The status the rules judge by (see :func:`_judged_status`).
        self.judged = _judged_status(status, fields)
        #: The lower-cased words every wording is matched against.
        self.text = text
        self._wait: float | Literal[False] | None = False

    def asked_wait(self) -> float | None:
        """What ``retry-after-ms`` or ``Retry-After`` asks for, uncapped; read once."""
        if self._wait is False:
            self._wait = requested_wait(self.headers, self.now)
        return self._wait
