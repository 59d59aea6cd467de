"""Turn anything raised around a provider call into one typed error.

This module and the two beside it are the one place where provider wording is
matched as text; every other part of fluid_build branches on the typed class
and its ``code``. An error answer arrives as plain data, an
:class:`~.error_answers.ErrorAnswer` (status, body, headers, provider, model),
is read by :mod:`.error_answers` (the wait it asks for, its body, the
provider's fields) and judged by the ordered table of
:mod:`.classification_rules`; this module builds the typed error the deciding
rule yields, and judges what comes with no answer at all (timeouts, refused
connections, anything else raised around the call).

What the body says beats what the status says: a context-length message is a
:class:`ContextOverflowError` under any status, an invalid key reported in a
400 is a :class:`ProviderAuthError`, and an error event inside an HTTP 200
stream is classified by its own error type. An ``x-should-retry: true|false``
header, when the server sends one, has the last word on ``retryable``.
"""

from __future__ import annotations

import contextlib
import json
import re
import ssl
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

import httpx

from fluid_build._redact import (
    REDACTED,
    exception_chain,
    is_credential_header,
    one_line,
    redact,
    redact_exception,
    redact_url,
    truncate,
)
from fluid_build.copilot.agents.classification_rules import (
    REDIRECTED,
    SHOULD_RETRY,
    Verdict,
    aws_error,
    decide,
)
from fluid_build.copilot.agents.error_answers import (
    MAX_BODY_BYTES,
    Body,
    ErrorAnswer,
    ErrorFields,
    Evidence,
    HeadersLike,
    html_title,
    overflow_numbers,
    request_secrets_of,
    requested_reset,
    requested_wait,
    wait_from_message,
)
from fluid_build.copilot.agents.errors import (
    MAX_RETRY_AFTER,
    AgentExecutionError,
    ContextOverflowError,
    ProviderError,
    ProviderTimeoutError,
    SchemaValidationError,
)

__all__ = [
    "MAX_BODY_BYTES",
    "ErrorAnswer",
    "classify_answer",
    "classify_provider_error",
    "classify_response",
    "parse_rate_limit_reset",
    "parse_retry_after",
    "redact_chain",
]

# --------------------------------------------------------------------------
# Retry-After and its fallbacks
# --------------------------------------------------------------------------


def parse_retry_after(headers: HeadersLike, *, now: float | datetime | None = None) -> float | None:
    """The wait a response asks for, in seconds, capped at 300; None if it asks for none.

    ``retry-after-ms`` (milliseconds) wins over ``Retry-After``, which may be
    integer or float seconds, or an HTTP-date taken relative to ``now`` (a
    POSIX timestamp or an aware datetime; default: the current time). Header
    names are case-insensitive. Negative, unparsable, non-finite or past
    values give None; this never raises.
    """
    requested = requested_wait(headers, now)
    return None if requested is None else min(requested, MAX_RETRY_AFTER)


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
    requested = requested_reset(headers, now)
    return None if requested is None else min(requested, MAX_RETRY_AFTER)


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
                found.extend(request_secrets_of(request))
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
    ctx.secrets = tuple(dict.fromkeys([*ctx.secrets, *request_secrets_of(request)]))
    _where(ctx, request.url)
    timeout = request.extensions.get("timeout")
    if isinstance(timeout, dict):
        kind = _TIMEOUT_KINDS.get(type(exc)) if exc is not None else None
        limit = timeout.get(kind) if kind else None
        if isinstance(limit, int | float):
            ctx.timeout = float(limit)
    return ctx


def _where(ctx: _Context, url: httpx.URL) -> None:
    """The redacted URL, and the provider and model it names when they are not given."""
    host = url.host or ""
    bare = url.copy_with(query=None, fragment=None, username=None, password=None)
    ctx.url = redact(str(bare), ctx.secrets)
    if ctx.provider is None:
        ctx.provider = next((p for suffix, p in _HOST_PROVIDERS if host.endswith(suffix)), None)
        if ctx.provider is None and url.port == 11434:
            ctx.provider = "ollama"
    if ctx.model is None:
        match = re.search(r"/models/([^/:]+)|/deployments/([^/]+)", url.path)
        if match:
            ctx.model = match.group(1) or match.group(2)


def _who(ctx: _Context) -> str:
    who = ctx.provider or "the provider"
    return f"{who} ({ctx.model})" if ctx.model else who


# --------------------------------------------------------------------------
# HTTP error answers
# --------------------------------------------------------------------------


def _describe(status: int, body: Body, info: ErrorFields, ctx: _Context) -> str:
    head = f"{_who(ctx)} answered HTTP {status}"
    if body.kind == "sse" or (status < 400 and body.data is not None):
        head = f"{_who(ctx)} sent an error event in a stream (HTTP {status})"
    if info.message:
        return f"{head}: {truncate(one_line(info.message), 400)}"
    if body.kind == "html":
        title = html_title(body.text)
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
    headers: httpx.Headers, info: ErrorFields, now: float | datetime | None
) -> tuple[float | None, str | None]:
    """The wait a 429 asks for, uncapped, and where it was found."""
    seconds = requested_wait(headers, now)
    if seconds is not None:
        return seconds, "retry-after header"
    if info.retry_delay is not None:
        return info.retry_delay, "body retry delay"
    # The message names the limit that was hit ("Please try again in 9.816s");
    # the reset headers describe every limit, including ones not exhausted.
    seconds = wait_from_message(info.message)
    if seconds is not None:
        return seconds, "message"
    seconds = requested_reset(headers, now)
    if seconds is not None:
        return seconds, "rate-limit reset header"
    return None, None


def _note_cap(details: dict[str, object], requested: float | None) -> None:
    # The error caps retry_after at 300 s; keep what the server really asked
    # for, so a caller with a deadline can give up instead of waiting in vain.
    if requested is not None and requested > MAX_RETRY_AFTER:
        details["retry_after_requested"] = requested


def _classify_answer(
    answer: ErrorAnswer, ctx: _Context, now: float | datetime | None
) -> ProviderError:
    headers = answer.headers
    evidence = _with_aws_type(Evidence(answer.status, headers, answer.read(), now))
    error = _judge_answer(evidence, ctx)
    # The server knows whether sending the same request again can work; its
    # SDKs obey this header before looking at the status, and so does the
    # envelope. "false" always stops. "true" overrides a verdict drawn from the
    # status, never one the body proved cannot succeed as sent: a prompt too
    # long, a rejected key, a spent quota or a content refusal fail the same way
    # however often they are sent.
    verdict = SHOULD_RETRY.says(headers)
    if verdict is not None:
        error.details["x_should_retry"] = verdict
        if verdict is not error.retryable and (
            verdict is False or error.code not in SHOULD_RETRY.keeps
        ):
            error.details["retryable_source"] = "x-should-retry header"
            error.retryable = verdict
    return error


def _with_aws_type(evidence: Evidence) -> Evidence:
    """AWS's error type and message (:func:`aws_error`) as the fields the error reports,
    when the body names no type of its own."""
    fields = evidence.fields
    kind, message = aws_error(evidence)
    if not kind or fields.type:
        return evidence
    before = fields.search_text()
    fields.type = kind
    fields.message = fields.message or message
    # The words the rules match: the fields' own, then whatever the body added after them.
    evidence.text = fields.search_text() + evidence.text[len(before) :]
    return evidence


def _judge_answer(evidence: Evidence, ctx: _Context) -> ProviderError:
    status, headers, body = evidence.status, evidence.headers, evidence.body
    info = evidence.fields
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
        or headers.get("x-amzn-requestid")
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
    return _yield(decide(evidence).yields, evidence, message, details, common)


def _yield(
    verdict: Verdict,
    evidence: Evidence,
    message: str,
    details: dict[str, object],
    common: dict[str, Any],
) -> ProviderError:
    """The typed error ``verdict`` names, with its wait and where the wait came from."""
    if verdict is REDIRECTED:
        location = evidence.headers.get("location", "?")
        return ProviderError(
            f"{message}; the endpoint redirected to {location}", code=verdict.code, **common
        )
    if verdict.error is ContextOverflowError:
        prompt_tokens, window = overflow_numbers(evidence.fields)
        return ContextOverflowError(
            message, prompt_tokens=prompt_tokens, context_window=window, **common
        )
    retry_after: float | None = None
    if verdict.wait == "hint":
        retry_after, source = _retry_hint(evidence.headers, evidence.fields, evidence.now)
        if source:
            details["retry_after_source"] = source
        _note_cap(details, retry_after)
    elif verdict.wait == "retry-after":
        retry_after = evidence.asked_wait()
        if verdict.notes_wait_source:
            details["retry_after_source"] = "retry-after header"
        _note_cap(details, retry_after)
    error = verdict.error
    if verdict.error_on_429 is not None and evidence.judged == 429:
        error = verdict.error_on_429
    return error(
        message, code=verdict.code, retryable=verdict.retryable, retry_after=retry_after, **common
    )


def classify_answer(answer: ErrorAnswer, *, now: float | datetime | None = None) -> ProviderError:
    """Classify an error answer given as plain data; never raises.

    Every error answer is judged here: a non-2xx response (through
    :func:`classify_response`), a stream's error event inside a 200 (the
    body's error type decides, not the 200), a Bedrock exception frame. The
    answer's ``secrets`` and its URL's key are kept out of the error.
    """
    try:
        ctx = _Context(answer.provider, answer.model, answer.secrets)
        if answer.url is not None:
            _where(ctx, answer.url)
        return _classify_answer(answer, ctx, now)
    except Exception as failure:  # noqa: BLE001 - the contract is "never raises"
        return _unclassifiable("Response", failure, answer.provider, answer.model)


def classify_response(
    response: httpx.Response,
    *,
    provider: str | None = None,
    model: str | None = None,
    now: float | datetime | None = None,
) -> ProviderError:
    """Classify an error answer: a non-2xx response, or a 200 whose body is an error.

    A thin wrapper: the response's status, headers, body prefix and request
    become an :class:`ErrorAnswer` for :func:`classify_answer`. Never raises.
    """
    try:
        answer = ErrorAnswer.of_response(response, provider=provider, model=model)
    except Exception as failure:  # noqa: BLE001 - the contract is "never raises"
        return _unclassifiable("Response", failure, provider, model)
    return classify_answer(answer, now=now)


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
            answer = ErrorAnswer.of_response(exc.response, secrets=ctx.secrets)
            return _classify_answer(answer, ctx, now)
        return _classify_exception(exc, ctx)
    except Exception as failure:  # noqa: BLE001 - the contract is "never raises"
        return _unclassifiable(type(exc).__name__, failure, provider, model)
    finally:
        # The caller chains ``exc`` to the typed error (``__cause__``, ``__context__``):
        # from here on it shows the redacted URL only.
        redact_chain(exc, secrets)
