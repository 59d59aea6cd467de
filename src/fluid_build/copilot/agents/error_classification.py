"""Turn anything raised around a provider call into one typed error.

This module is the one place where provider wording is matched as text; every
other part of fluid_build branches on the typed class and its ``code``.

What the body says beats what the status says: a context-length message is a
:class:`ContextOverflowError` under any status, an invalid key reported in a
400 is a :class:`ProviderAuthError`, and an error event inside an HTTP 200
stream is classified by its own error type. An ``x-should-retry: true|false``
header, when the server sends one, has the last word on ``retryable``.
"""

from __future__ import annotations

import contextlib
import html
import json
import math
import re
import ssl
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, Final, Literal

import httpx

from fluid_build._redact import (
    REDACTED,
    exception_chain,
    is_credential_header,
    one_line,
    redact,
    redact_exception,
    redact_url,
    request_secrets,
    truncate,
)
from fluid_build.copilot.agents.errors import (
    MAX_RETRY_AFTER,
    AgentExecutionError,
    ContextOverflowError,
    ProviderAuthError,
    ProviderError,
    ProviderServerError,
    ProviderTimeoutError,
    RateLimitError,
    SchemaValidationError,
)

__all__ = [
    "MAX_BODY_BYTES",
    "classify_provider_error",
    "classify_response",
    "parse_rate_limit_reset",
    "parse_retry_after",
    "redact_chain",
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


def parse_retry_after(headers: HeadersLike, *, now: float | datetime | None = None) -> float | None:
    """The wait a response asks for, in seconds, capped at 300; None if it asks for none.

    ``retry-after-ms`` (milliseconds) wins over ``Retry-After``, which may be
    integer or float seconds, or an HTTP-date taken relative to ``now`` (a
    POSIX timestamp or an aware datetime; default: the current time). Header
    names are case-insensitive. Negative, unparsable, non-finite or past
    values give None; this never raises.
    """
    requested = _requested_wait(headers, now)
    return None if requested is None else min(requested, MAX_RETRY_AFTER)


def _requested_wait(headers: HeadersLike, now: float | datetime | None) -> float | None:
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


def parse_rate_limit_reset(
    headers: HeadersLike, *, now: float | datetime | None = None
) -> float | None:
    """A fallback wait from the rate-limit reset headers providers send with a 429.

    Reads OpenAI/Groq ``x-ratelimit-reset-requests`` / ``-tokens`` (``6m0s``,
    ``20ms``), Anthropic ``anthropic-ratelimit-*-reset`` (RFC 3339 times) and
    generic ``x-ratelimit-reset`` (seconds, or an epoch in s or ms). When a
    limit reports zero remaining, its reset is the answer (the longest, if
    several are exhausted); otherwise the longest reset, since the limit that
    refused the request is not known and waiting for the shorter one risks
    another 429. Capped at 300 s; None when nothing usable is present. Never
    raises.
    """
    requested = _requested_reset(headers, now)
    return None if requested is None else min(requested, MAX_RETRY_AFTER)


def _requested_reset(headers: HeadersLike, now: float | datetime | None) -> float | None:
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


def _wait_from_message(message: str) -> float | None:
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
class _Body:
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


def _decode(prefix: bytes, response: httpx.Response) -> str:
    encoding = "utf-8"
    try:
        encoding = response.charset_encoding or "utf-8"
        return prefix.decode(encoding, errors="replace")
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


def _read_body(response: httpx.Response) -> _Body:
    prefix, size, truncated = _read_prefix(response)
    if not prefix.strip():
        return _Body("empty", size=size)
    text = _decode(prefix, response)
    if _looks_binary(prefix, text):
        return _Body("binary", size=size, truncated=truncated)
    content_type = response.headers.get("content-type", "").lower()
    stripped = text.lstrip()
    if "event-stream" in content_type or stripped.startswith(("event:", "data:")):
        return _Body("sse", text, _parse_sse(text), size, truncated)
    if stripped.startswith(("{", "[")) or "json" in content_type:
        return _Body("json", text, _parse_json(text), size, truncated)
    if "html" in content_type or stripped[:1] == "<":
        return _Body("html", text, None, size, truncated)
    return _Body("text", text, None, size, truncated)


# --------------------------------------------------------------------------
# The provider's own description of the error
# --------------------------------------------------------------------------


@dataclass(slots=True)
class _Info:
    message: str = ""
    type: str = ""
    code: str = ""
    param: str = ""
    body_status: int | None = None
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


def _walk_google_details(details: Any, info: _Info) -> None:
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


def _extract(data: Any) -> _Info:
    info = _Info()
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
    if info.body_status is None:
        mapped = _GOOGLE_STATUS.get(info.type) or _TYPE_STATUS.get(info.type.lower())
        info.body_status = mapped
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


def _extract_loose(text: str) -> _Info:
    """Best-effort fields from JSON that did not parse (a truncated body)."""
    info = _Info()
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


def _html_title(text: str) -> str:
    match = re.search(r"(?is)<title[^>]*>(.*?)</title>", text) or re.search(
        r"(?is)<h1[^>]*>(.*?)</h1>", text
    )
    if not match:
        return ""
    return truncate(one_line(html.unescape(re.sub(r"<[^>]+>", " ", match.group(1)))), 120)


def _html_text(text: str) -> str:
    body = re.sub(r"(?is)<(script|style)[^>]*>.*?</\1>", " ", text[:20_000])
    return one_line(html.unescape(re.sub(r"<[^>]+>", " ", body)))[:4000]


# --------------------------------------------------------------------------
# Recognising each failure in every provider's wording
# --------------------------------------------------------------------------


def _rx(*alternatives: str) -> re.Pattern[str]:
    # Each phrase starts a word: "insufficient_quota" is a code, "x_insufficient_quota"
    # a parameter name the provider echoes back.
    return re.compile("|".join(f"(?<![a-z0-9_])(?:{a})" for a in alternatives), re.IGNORECASE)


_OVERFLOW = _rx(
    r"context[_ ]length[_ ]exceeded",
    r"maximum context length",
    r"exceed_context_size",
    r"exceeds? (?:the )?(?:available |maximum |model'?s? )?context (?:length|window|size|limit)",
    r"(?:model'?s?|the) maximum context limit",
    r"larger than the max(?:imum)? context size",
    r"current length is \d+ while limit is \d+",
    r"\d+ tokens? > \d+ (?:tokens? )?maximum",
    r"context (?:length|window|size|limit) (?:(?:has been|was|is) )?exceeded",
    r"prompt is too long",
    r"input is too long",
    r"input length and `?max_tokens`? exceed context limit",
    r"input token count.{0,60}exceeds",
    r"input token count is \d+ but (?:the )?model only supports up to",
    r"exceeds the maximum number of tokens",
    r"reduce the length of the messages",
    r"maximum model length",
    r"longer than the model'?s? (?:maximum )?context",
    r"too long to fit into the model",
    r"request_too_large",
    r"request too large",
    r"request entity too large",
    r"tokens? \+ `?max_new_tokens`? must be <=",
    r"too many tokens(?: in (?:the )?(?:prompt|input|request)|: total number of tokens)",
)
# OpenAI's string_above_max_length is an overflow only when the long string is the prompt:
# "messages", "messages[3].content", "input[0].content[0].text"; "tools[0].function.description"
# or "messages[1].tool_calls[0].id" too long is a malformed request.
_PROMPT_PARAM = re.compile(
    r"^(?:messages|input|prompt)(?:\[\d+\](?:\.content(?:\[\d+\](?:\.text)?)?)?)?$", re.IGNORECASE
)
_QUOTED_PARAM = re.compile(r"(?i)invalid '([^']{1,200})'")
# "Limit 10000, Requested 15000" without a "Used": one request bigger than the
# whole per-minute budget, which no amount of waiting fixes.
_TPM_TOO_LARGE = re.compile(r"(?i)limit:? (\d+), requested:? (\d+)")

_AUTH = _rx(
    r"invalid[_ ]api[_ ]key",
    r"incorrect api key",
    r"api key not valid",
    r"api_key_invalid",
    r"api key (?:is )?(?:missing|expired|revoked|invalid|disabled)",
    r"api_key_(?:expired|revoked|service_blocked)",
    r"invalid x-api-key",
    r"authentication_error",
    r"invalid_authentication",
    r"\bunauthenticated\b",
    r"no api key provided",
    r"you didn'?t provide an api key",
    r"missing (?:an? )?(?:api[ _]key|authentication|bearer)",
    r"invalid (?:subscription key|authentication|bearer token|credentials)",
    r"access denied due to invalid subscription key",
    r"reported as leaked",
    r"organization has been disabled",
    r"account (?:is |has been )?(?:disabled|deactivated|suspended)",
)

_QUOTA = _rx(
    r"insufficient[_ ]quota",
    r"billing_(?:error|hard_limit|not_active)",
    r"billing hard limit",
    r"credit balance is too low",
    r"insufficient (?:credits|balance|funds)",
    r"out of credits",
    r"exceeded your current quota",
    r"quota (?:has been )?exhausted",
    r"payment required",
    r"spend(?:ing)? limit",
    r"more credits",
)

_FILTER = _rx(
    r"content[_ ]filter",
    r"content_policy_violation",
    r"responsibleaipolicyviolation",
    r"content management policy",
    r"safety system",
    r"flagged as potentially violating",
    r"violat(?:es|ed|ing) (?:our|the) (?:usage |content )?polic(?:y|ies)",
)

_MODEL_NOT_FOUND = _rx(
    r"model_not_found",
    r"deploymentnotfound",
    r"deployment for this resource does not exist",
    r"\bmodel\b[^.\n]{0,120}?(?:not found|does not exist|is not supported for|not available)",
    r"is not found for api version",
    r"not a valid model",
    r"unknown model",
    r"no such model",
)

_RATE_LIMIT = _rx(
    # A token ("rate limit", "rate-limited", "rate_limit_exceeded", "RateLimitError"),
    # never part of an identifier such as "_litellm_rate_limit_descriptors".
    r"(?<!-)rate[ _-]?limit(?:s|ed|ing)?(?:[ _-]?(?:exceeded|error|reached))?(?![a-z0-9_-])",
    r"too many requests",
    r"resource_exhausted",
)

# Specific phrasings only: a proxy page saying "the origin may be overloaded"
# is a gateway failure, not a provider telling us it is busy.
_OVERLOADED = _rx(
    r"overloaded_error",
    r"server_is_overloaded",
    r"^\s*overloaded\b",
    r"\b(?:model|server|servers|engine|service|system|api) (?:is |are )?(?:currently )?overloaded",
    r"over capacity",
)
_RESOURCES = _rx(r"requires more system memory", r"out of memory", r"insufficient memory")
_MODELISH = _rx(r"\bmodel", r"deployment")

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


def _overflow_numbers(text: str, info: _Info) -> tuple[int | None, int | None]:
    if "n_prompt_tokens" in info.numbers or "n_ctx" in info.numbers:
        return info.numbers.get("n_prompt_tokens"), info.numbers.get("n_ctx")
    for pattern, prompt_group, window_group in _OVERFLOW_NUMBERS:
        match = pattern.search(text)
        if match:
            prompt = int(match.group(prompt_group)) if prompt_group is not None else None
            return prompt, int(match.group(window_group))
    return None, None


def _is_overflow(status: int, text: str, info: _Info) -> bool:
    if status == 413:
        return True
    if "string_above_max_length" in text:
        quoted = _QUOTED_PARAM.search(info.message)
        param = info.param or (quoted.group(1) if quoted else "")
        return bool(_PROMPT_PARAM.match(param))
    if _OVERFLOW.search(text):
        return True
    match = _TPM_TOO_LARGE.search(text)
    return bool(match and "used" not in text and int(match.group(2)) > int(match.group(1)))


def _gemini_quota_verdict(info: _Info) -> Literal["quota", "rate", None]:
    """Gemini says "exceeded your current quota" for per-minute limits too."""
    if info.type != "RESOURCE_EXHAUSTED":
        return None
    ids = " ".join(info.quota_ids).lower()
    if "perday" in ids or "per_day" in ids or re.search(r"\blimit: 0\b", info.message):
        return "quota"
    return "rate"


# --------------------------------------------------------------------------
# Request context: provider, model, secrets
# --------------------------------------------------------------------------

_HOST_PROVIDERS: Final = (
    ("openai.azure.com", "azure"),
    ("api.openai.com", "openai"),
    ("anthropic.com", "anthropic"),
    ("generativelanguage.googleapis.com", "gemini"),
    ("aiplatform.googleapis.com", "vertex"),
    ("openrouter.ai", "openrouter"),
    ("api.groq.com", "groq"),
    ("api.mistral.ai", "mistral"),
)
_TIMEOUT_KINDS: Final[Mapping[type[BaseException], str]] = {
    httpx.ConnectTimeout: "connect",
    httpx.ReadTimeout: "read",
    httpx.WriteTimeout: "write",
    httpx.PoolTimeout: "pool",
}


@dataclass(slots=True)
class _Context:
    provider: str | None
    model: str | None
    secrets: tuple[str, ...] = ()
    url: str | None = None
    timeout: float | None = None


def _request_secrets(request: httpx.Request) -> list[str]:
    """What the request carries that is secret: key headers, userinfo, key-like parameters."""
    found = request_secrets(request.headers.multi_items(), request.url)
    if request.url.password:
        found.append(request.url.password)
    if request.url.username:
        found.append(request.url.username)
    return [s for s in dict.fromkeys(found) if s]


# --------------------------------------------------------------------------
# Exception chains: what an error carries as __cause__ / __context__
# --------------------------------------------------------------------------

#: Set on the redacted copy of a request that an exception keeps instead of the original.
_REDACTED_REQUEST: Final = "fluid_redacted"


def _redacted_request(request: httpx.Request, secrets: tuple[str, ...]) -> httpx.Request:
    """A body-less copy of ``request`` with its URL redacted and credential headers masked."""
    if request.extensions.get(_REDACTED_REQUEST):
        return request
    headers = [
        (name, REDACTED if is_credential_header(name) else redact(value, secrets))
        for name, value in request.headers.multi_items()
    ]
    try:
        url = httpx.URL(redact_url(request.url, secrets))
    except Exception:  # noqa: BLE001 - whatever redaction made of it, never the original
        url = httpx.URL("https://redacted.invalid/")
    extensions: dict[str, Any] = {_REDACTED_REQUEST: True}
    if "timeout" in request.extensions:
        extensions["timeout"] = request.extensions["timeout"]
    return httpx.Request(request.method, url, headers=headers, extensions=extensions)


def redact_chain(exc: BaseException, secrets: Iterable[str] = ()) -> None:
    """Take every secret out of the exceptions chained to ``exc``, in place.

    Walks ``exc``, its ``__cause__`` and ``__context__`` (and theirs). Every
    exception that is not a typed fluid_build error (those are redacted when
    built) gets its args, notes and string attributes redacted; an httpx
    exception keeps a redacted, body-less copy of its request (and its
    response's request) instead of the original, so ``str()``, ``repr()``,
    ``args`` and ``.request.url`` show the URL without userinfo and without
    key-like query values. The keys of every request in the chain, and
    ``secrets``, are removed by value. Never raises.
    """
    try:
        chain = exception_chain(exc)
        found = list(secrets)
        for link in chain:
            request = _request_of(link) if isinstance(link, httpx.HTTPError) else None
            if request is not None and not request.extensions.get(_REDACTED_REQUEST):
                found.extend(_request_secrets(request))
        known = tuple(dict.fromkeys(found))
        for link in chain:
            if isinstance(link, AgentExecutionError):
                continue
            redact_exception(link, known)
            if isinstance(link, httpx.HTTPError):
                _redact_requests(link, known)
    except Exception:  # noqa: BLE001, S110 - redaction must never turn into a new failure
        pass


def _redact_requests(exc: httpx.HTTPError, secrets: tuple[str, ...]) -> None:
    request = _request_of(exc)
    if request is not None:
        exc.request = _redacted_request(request, secrets)
    if isinstance(exc, httpx.HTTPStatusError):
        with contextlib.suppress(Exception):
            exc.response.request = exc.request


def _request_of(exc: BaseException) -> httpx.Request | None:
    try:
        request = getattr(exc, "request", None)
    except Exception:  # noqa: BLE001 - httpx raises RuntimeError when it has none
        return None
    return request if isinstance(request, httpx.Request) else None


def _context(
    exc: BaseException | None,
    request: httpx.Request | None,
    provider: str | None,
    model: str | None,
    secrets: Iterable[str] = (),
) -> _Context:
    ctx = _Context(provider, model, tuple(s for s in secrets if s))
    if request is None:
        return ctx
    ctx.secrets = tuple(dict.fromkeys([*ctx.secrets, *_request_secrets(request)]))
    host = request.url.host or ""
    bare = request.url.copy_with(query=None, fragment=None, username=None, password=None)
    ctx.url = redact(str(bare), ctx.secrets)
    if ctx.provider is None:
        ctx.provider = next((p for suffix, p in _HOST_PROVIDERS if host.endswith(suffix)), None)
        if ctx.provider is None and request.url.port == 11434:
            ctx.provider = "ollama"
    if ctx.model is None:
        match = re.search(r"/models/([^/:]+)|/deployments/([^/]+)", request.url.path)
        if match:
            ctx.model = match.group(1) or match.group(2)
    timeout = request.extensions.get("timeout")
    if isinstance(timeout, dict):
        kind = _TIMEOUT_KINDS.get(type(exc)) if exc is not None else None
        limit = timeout.get(kind) if kind else None
        if isinstance(limit, int | float):
            ctx.timeout = float(limit)
    return ctx


def _who(ctx: _Context) -> str:
    who = ctx.provider or "the provider"
    return f"{who} ({ctx.model})" if ctx.model else who


# --------------------------------------------------------------------------
# HTTP error answers
# --------------------------------------------------------------------------


def _describe(status: int, body: _Body, info: _Info, ctx: _Context) -> str:
    head = f"{_who(ctx)} answered HTTP {status}"
    if body.kind == "sse" or (status < 400 and body.data is not None):
        head = f"{_who(ctx)} sent an error event in a stream (HTTP {status})"
    if info.message:
        return f"{head}: {truncate(one_line(info.message), 400)}"
    if body.kind == "html":
        title = _html_title(body.text)
        shown = f" ('{title}')" if title else ""
        return f"{head} with an HTML page{shown}: a proxy or gateway answered, not the API"
    if body.kind == "empty":
        return f"{head} with an empty body"
    if body.kind == "binary":
        size = body.size if body.size is not None else "unknown"
        return f"{head} with a non-text body ({size} bytes)"
    if body.kind == "text":
        return f"{head}: {truncate(one_line(body.text), 300)}"
    return f"{head} with a body fluid_build could not read as an error"


def _retry_hint(
    headers: httpx.Headers, info: _Info, now: float | datetime | None
) -> tuple[float | None, str | None]:
    """The wait a 429 asks for, uncapped, and where it was found."""
    seconds = _requested_wait(headers, now)
    if seconds is not None:
        return seconds, "retry-after header"
    if info.retry_delay is not None:
        return info.retry_delay, "body retry delay"
    # The message names the limit that was hit ("Please try again in 9.816s");
    # the reset headers describe every limit, including ones not exhausted.
    seconds = _wait_from_message(info.message)
    if seconds is not None:
        return seconds, "message"
    seconds = _requested_reset(headers, now)
    if seconds is not None:
        return seconds, "rate-limit reset header"
    return None, None


def _note_cap(details: dict[str, object], requested: float | None) -> None:
    # The error caps retry_after at 300 s; keep what the server really asked
    # for, so a caller with a deadline can give up instead of waiting in vain.
    if requested is not None and requested > MAX_RETRY_AFTER:
        details["retry_after_requested"] = requested


def _should_retry_header(headers: httpx.Headers) -> bool | None:
    """What ``x-should-retry`` says (OpenAI, Anthropic); None when absent, garbage or split."""
    said = {value.strip().lower() for value in headers.get_list("x-should-retry")}
    if said == {"true"}:
        return True
    if said == {"false"}:
        return False
    return None


def _classify_answer(
    status: int,
    headers: httpx.Headers,
    body: _Body,
    ctx: _Context,
    now: float | datetime | None,
) -> ProviderError:
    error = _judge_answer(status, headers, body, ctx, now)
    # The server knows whether sending the same request again can work; its
    # SDKs obey this header before looking at the status, and so does the
    # envelope. "false" always stops. "true" overrides a verdict drawn from the
    # status, never one the body proved cannot succeed as sent: a prompt too
    # long, a rejected key, a spent quota or a content refusal fail the same way
    # however often they are sent.
    verdict = _should_retry_header(headers)
    if verdict is not None:
        error.details["x_should_retry"] = verdict
        if verdict is not error.retryable and (verdict is False or error.code not in _DEFINITE):
            error.details["retryable_source"] = "x-should-retry header"
            error.retryable = verdict
    return error


#: Verdicts an ``x-should-retry: true`` cannot revive: the same request fails the same way.
_DEFINITE: Final = frozenset(
    {"llm.context_overflow", "llm.auth", "llm.quota_exhausted", "llm.content_filtered"}
)


def _effective_status(status: int, info: _Info) -> int:
    """The status to judge an answer by, when it is not the HTTP status itself.

    An error inside a 2xx/3xx (a stream's error event) has its body's status, or 500;
    a gateway that relays an upstream 429 as a 5xx is a rate limit.
    """
    if 400 <= status <= 599:
        relayed_limit = info.body_status == 429 or info.type == "RESOURCE_EXHAUSTED"
        return 429 if status >= 500 and relayed_limit else status
    return info.body_status if info.body_status is not None else 500


def _judge_answer(
    status: int,
    headers: httpx.Headers,
    body: _Body,
    ctx: _Context,
    now: float | datetime | None,
) -> ProviderError:
    if body.kind in {"json", "sse"}:
        info = _extract(body.data) if body.data is not None else _extract_loose(body.text)
    else:
        info = _Info()
    text = info.search_text()
    if body.kind == "html":
        text = f"{text} {_html_text(body.text).lower()}"
    elif body.kind == "text":
        text = f"{text} {body.text[:4000].lower()}"

    message = _describe(status, body, info, ctx)
    details: dict[str, object] = {"status_code": status, "body_kind": body.kind}
    if body.size is not None:
        details["body_bytes"] = body.size
    if body.truncated:
        details["body_truncated"] = True
    if ctx.url:
        details["url"] = ctx.url
    if body.kind in {"json", "sse", "text"} and body.text:
        details["body_excerpt"] = truncate(body.text, 1000)
    if info.body_status is not None:
        details["body_status"] = info.body_status
    if info.quota_ids:
        details["quota_ids"] = info.quota_ids[:10]
    request_id = (
        info.request_id
        or headers.get("x-request-id")
        or headers.get("request-id")
        or headers.get("apim-request-id")
        or None
    )
    common: dict[str, Any] = {
        "provider": ctx.provider,
        "model": ctx.model,
        "status_code": status,
        "provider_error_type": info.type or None,
        "provider_error_code": info.code or (info.reasons[0] if info.reasons else None),
        "request_id": request_id,
        "headers": headers.multi_items(),
        "details": details,
        "secrets": ctx.secrets,
    }

    # 2xx and 3xx carry no verdict of their own: use what the body's error says.
    if 300 <= status < 400 and info.body_status is None and not info.message:
        return ProviderError(
            f"{message}; the endpoint redirected to {headers.get('location', '?')}",
            code="llm.bad_endpoint",
            **common,
        )
    effective = _effective_status(status, info)

    if _is_overflow(effective, text, info):
        prompt_tokens, window = _overflow_numbers(
            f"{info.message} {' '.join(info.extra_text)}", info
        )
        return ContextOverflowError(
            message, prompt_tokens=prompt_tokens, context_window=window, **common
        )
    if effective in (401, 403) or _AUTH.search(text):
        return ProviderAuthError(message, **common)

    gemini = _gemini_quota_verdict(info)
    if gemini == "quota" or (gemini is None and (effective == 402 or _QUOTA.search(text))):
        retry_after = _requested_wait(headers, now)
        _note_cap(details, retry_after)
        if effective == 429:
            return RateLimitError(
                message,
                code="llm.quota_exhausted",
                retryable=False,
                retry_after=retry_after,
                **common,
            )
        return ProviderError(
            message, code="llm.quota_exhausted", retryable=False, retry_after=retry_after, **common
        )
    if _FILTER.search(text):
        return ProviderError(message, code="llm.content_filtered", retryable=False, **common)
    if effective in (404, 405) or _MODEL_NOT_FOUND.search(text):
        if _MODEL_NOT_FOUND.search(text) or (effective == 404 and _MODELISH.search(info.message)):
            return ProviderError(message, code="llm.model_not_found", retryable=False, **common)
        return ProviderError(message, code="llm.endpoint_not_found", retryable=False, **common)

    overloaded = effective == 529 or bool(_OVERLOADED.search(text))
    if effective == 429 or (effective < 500 and _RATE_LIMIT.search(text) and not overloaded):
        retry_after, source = _retry_hint(headers, info, now)
        if source:
            details["retry_after_source"] = source
        _note_cap(details, retry_after)
        return RateLimitError(message, retry_after=retry_after, **common)
    if overloaded or effective >= 500:
        retry_after = _requested_wait(headers, now)
        code = "llm.overloaded" if overloaded else "llm.server_error"
        if retry_after is not None:
            details["retry_after_source"] = "retry-after header"
            _note_cap(details, retry_after)
            return RateLimitError(message, code=code, retry_after=retry_after, **common)
        if _RESOURCES.search(text):
            return ProviderServerError(
                message, code="llm.insufficient_resources", retryable=False, **common
            )
        return ProviderServerError(message, code=code, **common)
    if effective == 408:
        return ProviderTimeoutError(message, **common)
    return ProviderError(message, code="llm.invalid_request", retryable=False, **common)


def classify_response(
    response: httpx.Response,
    *,
    provider: str | None = None,
    model: str | None = None,
    now: float | datetime | None = None,
) -> ProviderError:
    """Classify an error answer: a non-2xx response, or a 200 whose body is an error.

    Adapters call this with the response of an SSE stream that delivered an
    ``error`` event; the body's error type decides, not the 200. Never raises.
    """
    try:
        try:
            request: httpx.Request | None = response.request
        except RuntimeError:  # a Response built without a request
            request = None
        ctx = _context(None, request, provider, model)
        return _classify_answer(
            response.status_code, response.headers, _read_body(response), ctx, now
        )
    except Exception as failure:  # noqa: BLE001 - the contract is "never raises"
        return _unclassifiable("Response", failure, provider, model)


def _unclassifiable(
    what: str, failure: Exception, provider: str | None, model: str | None
) -> ProviderError:
    return ProviderError(
        f"fluid_build could not classify a {what}; this is a bug worth reporting",
        provider=provider,
        model=model,
        code="llm.unknown_error",
        retryable=False,
        details={"exception": what, "classifier_failure": type(failure).__name__},
    )


# --------------------------------------------------------------------------
# No answer, and everything else
# --------------------------------------------------------------------------

_TIMEOUT_WORDS: Final[Mapping[type[BaseException], str]] = {
    httpx.ConnectTimeout: "could not connect within the connect timeout",
    httpx.ReadTimeout: "sent no data within the read timeout",
    httpx.WriteTimeout: "could not take the request within the write timeout",
    httpx.PoolTimeout: (
        "no free connection in the pool within the pool timeout "
        "(more concurrent calls than the pool allows)"
    ),
}


def _exception_text(exc: BaseException, ctx: _Context) -> str:
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - a hostile __str__
        text = ""
    return truncate(one_line(redact(text, ctx.secrets)), 300)


def _cause_chain(exc: BaseException) -> Iterable[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen and len(seen) < 20:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _classify_exception(exc: BaseException, ctx: _Context) -> AgentExecutionError:
    common: dict[str, Any] = {"provider": ctx.provider, "model": ctx.model, "secrets": ctx.secrets}
    details: dict[str, object] = {"exception": type(exc).__name__}
    if ctx.url:
        details["url"] = ctx.url
    reason = _exception_text(exc, ctx)
    who = _who(ctx)

    if isinstance(exc, httpx.TimeoutException | TimeoutError):
        words = _TIMEOUT_WORDS.get(type(exc), "did not answer within the timeout")
        limit = f" ({ctx.timeout:g} s)" if ctx.timeout is not None else ""
        if ctx.timeout is not None:
            details["timeout_seconds"] = ctx.timeout
        return ProviderTimeoutError(f"{who} {words}{limit}", details=details, **common)

    chain = list(_cause_chain(exc))
    if any(isinstance(e, ssl.SSLCertVerificationError) for e in chain) or (
        isinstance(exc, httpx.ConnectError) and "CERTIFICATE_VERIFY_FAILED" in reason
    ):
        return ProviderError(
            f"TLS certificate verification failed for {who}: {reason}",
            code="llm.tls_error",
            retryable=False,
            details=details,
            **common,
        )
    if isinstance(
        exc,
        httpx.UnsupportedProtocol
        | httpx.InvalidURL
        | httpx.TooManyRedirects
        | httpx.LocalProtocolError,
    ):
        return ProviderError(
            f"the request to {who} could not be sent: {reason}",
            code="llm.bad_endpoint",
            retryable=False,
            details=details,
            **common,
        )
    if isinstance(exc, httpx.DecodingError):
        return ProviderError(
            f"the answer from {who} could not be decoded: {reason}",
            code="llm.malformed_response",
            retryable=True,
            details=details,
            **common,
        )
    if isinstance(exc, httpx.TransportError | ConnectionError | OSError):
        return ProviderError(
            f"connection to {who} failed before an answer arrived: {reason or type(exc).__name__}",
            code="llm.network_error",
            retryable=True,
            details=details,
            **common,
        )
    if isinstance(exc, json.JSONDecodeError | UnicodeDecodeError):
        return ProviderError(
            f"the answer from {who} was not valid JSON: {reason}",
            code="llm.malformed_response",
            retryable=True,
            details=details,
            **common,
        )
    if type(exc).__name__ == "ValidationError" and hasattr(exc, "errors"):
        return SchemaValidationError.from_pydantic(exc)
    if not isinstance(exc, Exception):
        return ProviderError(
            f"the call to {who} was interrupted ({type(exc).__name__})",
            code="llm.cancelled",
            retryable=False,
            details=details,
            **common,
        )
    return ProviderError(
        f"unexpected {type(exc).__name__} around the call to {who}: {reason}",
        code="llm.unknown_error",
        retryable=False,
        details=details,
        **common,
    )


def classify_provider_error(
    exc: BaseException,
    *,
    provider: str | None = None,
    model: str | None = None,
    now: float | datetime | None = None,
    secrets: Iterable[str] = (),
) -> AgentExecutionError:
    """The typed error for anything raised around an httpx call to a provider.

    Returns (never raises) an :class:`AgentExecutionError`: a typed error is
    returned unchanged (its chained exceptions redacted); httpx timeouts
    become :class:`ProviderTimeoutError`; connection failures a retryable
    ``llm.network_error``; an
    ``httpx.HTTPStatusError`` is judged by its status, headers and the first
    64 KiB of its body; a pydantic ``ValidationError`` becomes
    :class:`SchemaValidationError`. ``now`` anchors HTTP-date and reset
    headers (tests pass a fixed time).

    ``exc`` and everything chained to it are redacted in place afterwards
    (:func:`redact_chain`): callers chain it to the typed error, and a
    chained httpx exception must not show the request's key, the URL's
    userinfo or a key-like query value. ``secrets`` (the caller's API key)
    are removed by value as well: an exception that is not an httpx one
    carries no request to learn the key from.
    """
    secrets = tuple(secrets)
    if isinstance(exc, AgentExecutionError):
        redact_chain(exc, secrets)
        return exc
    last_attempt = (
        getattr(exc, "last_attempt", None) if type(exc).__name__ == "RetryError" else None
    )
    if last_attempt is not None:  # tenacity.RetryError: judge what the last attempt raised
        try:
            inner = last_attempt.exception()
        except Exception:  # noqa: BLE001
            inner = None
        if isinstance(inner, BaseException):
            redact_chain(exc, secrets)
            return classify_provider_error(
                inner, provider=provider, model=model, now=now, secrets=secrets
            )
    try:
        ctx = _context(exc, _request_of(exc), provider, model, secrets)
        secrets = ctx.secrets
        if isinstance(exc, httpx.HTTPStatusError):
            response = exc.response
            return _classify_answer(
                response.status_code, response.headers, _read_body(response), ctx, now
            )
        return _classify_exception(exc, ctx)
    except Exception as failure:  # noqa: BLE001 - the contract is "never raises"
        return _unclassifiable(type(exc).__name__, failure, provider, model)
    finally:
        # The caller chains ``exc`` to the typed error (``__cause__``, ``__context__``):
        # from here on it shows the redacted URL only.
        redact_chain(exc, secrets)
