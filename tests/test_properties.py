"""Property tests: the classifier and the Retry-After parser never raise, never leak."""

from __future__ import annotations

import json
from typing import Any

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fluid_build.copilot.agents.error_classification import (
    classify_provider_error,
    parse_rate_limit_reset,
    parse_retry_after,
)
from fluid_build.copilot.agents.errors import REASON_CODES, AgentExecutionError

NOW = 1_700_000_000.0
ALNUM = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"

# Credentials in the shapes providers and proxies actually use.
secret_tokens = st.one_of(
    st.text(ALNUM + "_-", min_size=20, max_size=60).map(lambda s: f"sk-{s}"),
    st.text(ALNUM, min_size=20, max_size=60).map(lambda s: f"sk-ant-api03-{s}"),
    st.text(ALNUM + "_-", min_size=35, max_size=35).map(lambda s: f"AIza{s}"),
    st.text(ALNUM, min_size=20, max_size=52).map(lambda s: f"gsk_{s}"),
)
# A key of no known shape: only the request it was sent with can reveal it.
# Hex, so it cannot spell a word the error's own text uses ("ProviderServerEr").
request_keys = st.text("0123456789abcdef", min_size=24, max_size=48)

json_leaf = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=40)
)
json_values = st.recursive(
    json_leaf,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=20,
)
error_fields = st.sampled_from(["message", "type", "code", "status", "detail", "request_id"])
header_names = st.sampled_from(
    [
        "retry-after",
        "retry-after-ms",
        "x-ratelimit-reset-tokens",
        "x-ratelimit-reset-requests",
        "x-ratelimit-remaining-tokens",
        "anthropic-ratelimit-requests-reset",
        "x-request-id",
        "request-id",
        "content-type",
        "x-whatever",
    ]
)
header_values = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=40)


@st.composite
def bodies(draw: st.DrawFn, secret: str) -> bytes:
    """Arbitrary bodies: raw bytes, text, JSON in provider shapes, SSE, HTML; the secret inside."""
    kind = draw(st.sampled_from(["bytes", "text", "json", "provider", "sse", "html"]))
    if kind == "bytes":
        return draw(st.binary(max_size=300)) + f" {secret} ".encode()
    if kind == "text":
        return f"{draw(st.text(max_size=100))} {secret} {draw(st.text(max_size=50))}".encode(
            "utf-8", "surrogatepass"
        )
    error: dict[str, Any] = {
        draw(error_fields): draw(json_values) for _ in range(draw(st.integers(0, 4)))
    }
    error[draw(error_fields)] = (
        f"{draw(st.text(max_size=30))} {secret} {draw(st.text(max_size=30))}"
    )
    if kind == "json":
        return json.dumps(draw(st.sampled_from([error, [error], {"detail": error}]))).encode()
    wrapped = draw(st.sampled_from([{"error": error}, {"type": "error", "error": error}, error]))
    payload = json.dumps(wrapped)
    if kind == "provider":
        cut = draw(st.integers(0, len(payload)))
        return (
            payload.encode()
            if draw(st.booleans())
            else payload[:cut].encode() + f" {secret}".encode()
        )
    if kind == "sse":
        return f"event: error\ndata: {payload}\n\n".encode()
    return f"<html><title>{secret}</title><body>{payload}</body></html>".encode()


def assert_clean(error: AgentExecutionError, *secrets: str) -> None:
    rendered = "\n".join([str(error), repr(error), json.dumps(error.to_dict())])
    for secret in secrets:
        assert secret not in rendered


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    status=st.integers(min_value=100, max_value=599),
    secret=secret_tokens,
    request_key=request_keys,
    headers=st.dictionaries(header_names, header_values, max_size=5),
    echo_in_header=st.booleans(),
    data=st.data(),
)
def test_classifier_never_raises_and_never_leaks(
    status: int,
    secret: str,
    request_key: str,
    headers: dict[str, str],
    echo_in_header: bool,
    data: st.DataObject,
) -> None:
    body = data.draw(bodies(secret))
    body += f" echo {request_key} ".encode() if data.draw(st.booleans()) else b""
    if echo_in_header:
        headers = {**headers, "x-request-id": f"{request_key} {secret}"}
    req = httpx.Request(
        "POST",
        f"https://api.example.test/v1/chat?key={request_key}",
        headers={"Authorization": f"Bearer {request_key}"},
    )
    response = httpx.Response(status, content=body, headers=headers, request=req)
    error = classify_provider_error(
        httpx.HTTPStatusError("x", request=req, response=response), now=NOW
    )
    assert isinstance(error, AgentExecutionError)
    assert error.code in REASON_CODES
    assert error.retry_after is None or 0 <= error.retry_after <= 300
    assert "\n" not in str(error)
    assert_clean(error, secret, request_key)


@settings(deadline=None)
@given(
    headers=st.one_of(
        st.dictionaries(header_names, header_values, max_size=6),
        st.dictionaries(st.text(max_size=20), st.text(max_size=40), max_size=6),
        st.lists(st.tuples(header_names, st.text(max_size=40)), max_size=6),
    ),
    now=st.one_of(st.floats(min_value=-1e12, max_value=1e12), st.just(NOW)),
)
def test_wait_parsers_never_raise_and_stay_in_bounds(headers: Any, now: float) -> None:
    for parse in (parse_retry_after, parse_rate_limit_reset):
        got = parse(headers, now=now)
        assert got is None or 0 <= got <= 300


@settings(deadline=None)
@given(text=st.text(max_size=200), secret=secret_tokens)
def test_any_exception_text_is_redacted(text: str, secret: str) -> None:
    error = classify_provider_error(RuntimeError(f"{text} {secret} {text}"))
    assert error.code == "llm.unknown_error"
    assert_clean(error, secret)
