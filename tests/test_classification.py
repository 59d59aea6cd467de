"""classify_provider_error(): every status class, every failure with no answer, bad bodies."""

from __future__ import annotations

import json
import ssl
from typing import Any

import httpx
import pydantic
import pytest
import respx
import tenacity

from fluid_build.copilot.agents.error_classification import (
    classify_provider_error,
    classify_response,
)
from fluid_build.copilot.agents.errors import (
    REASON_CODES,
    AgentExecutionError,
    ContextOverflowError,
    ProviderAuthError,
    ProviderError,
    ProviderServerError,
    ProviderTimeoutError,
    RateLimitError,
    SchemaValidationError,
)
from tests.helpers import SECRET_KEY, request, status_error

NOW = 1_700_000_000.0


def classify(exc: BaseException, **kwargs: Any) -> AgentExecutionError:
    error = classify_provider_error(exc, now=NOW, **kwargs)
    assert error.code in REASON_CODES
    return error


# -- status classes, with bodies that say nothing specific --------------------


@pytest.mark.parametrize(
    ("status", "headers", "cls", "code", "retryable", "retry_after"),
    [
        (400, {}, ProviderError, "llm.invalid_request", False, None),
        (401, {}, ProviderAuthError, "llm.auth", False, None),
        (402, {}, ProviderError, "llm.quota_exhausted", False, None),
        (403, {}, ProviderAuthError, "llm.auth", False, None),
        (404, {}, ProviderError, "llm.endpoint_not_found", False, None),
        (405, {}, ProviderError, "llm.endpoint_not_found", False, None),
        (408, {}, ProviderTimeoutError, "llm.timeout", True, None),
        (409, {}, ProviderError, "llm.invalid_request", False, None),
        (413, {}, ContextOverflowError, "llm.context_overflow", False, None),
        (422, {}, ProviderError, "llm.invalid_request", False, None),
        (429, {}, RateLimitError, "llm.rate_limited", True, None),
        (429, {"Retry-After": "17"}, RateLimitError, "llm.rate_limited", True, 17.0),
        (429, {"retry-after-ms": "1500"}, RateLimitError, "llm.rate_limited", True, 1.5),
        (500, {}, ProviderServerError, "llm.server_error", True, None),
        (500, {"Retry-After": "4"}, RateLimitError, "llm.server_error", True, 4.0),
        (502, {}, ProviderServerError, "llm.server_error", True, None),
        (503, {}, ProviderServerError, "llm.server_error", True, None),
        (503, {"Retry-After": "30"}, RateLimitError, "llm.server_error", True, 30.0),
        (504, {}, ProviderServerError, "llm.server_error", True, None),
        (522, {}, ProviderServerError, "llm.server_error", True, None),
        (524, {}, ProviderServerError, "llm.server_error", True, None),
        (529, {}, ProviderServerError, "llm.overloaded", True, None),
        (529, {"Retry-After": "9"}, RateLimitError, "llm.overloaded", True, 9.0),
        (599, {}, ProviderServerError, "llm.server_error", True, None),
        (418, {}, ProviderError, "llm.invalid_request", False, None),
    ],
)
def test_status_classes(
    status: int,
    headers: dict[str, str],
    cls: type[ProviderError],
    code: str,
    retryable: bool,
    retry_after: float | None,
) -> None:
    error = classify(status_error(status, body_text="nope", headers=headers), provider="openai")
    assert type(error) is cls
    assert isinstance(error, ProviderError)
    assert (error.code, error.retryable, error.status_code) == (code, retryable, status)
    assert error.retry_after == retry_after
    assert error.provider == "openai"


def test_redirect_is_a_bad_endpoint() -> None:
    exc = status_error(301, headers={"location": "https://api.openai.com/v1/chat/completions"})
    error = classify(exc)
    assert error.code == "llm.bad_endpoint"
    assert not error.retryable
    assert "redirected to https://api.openai.com" in str(error)


def test_404_naming_a_model_is_model_not_found() -> None:
    body = {"error": {"message": "The model `gpt-9` does not exist", "code": "model_not_found"}}
    assert classify(status_error(404, body)).code == "llm.model_not_found"


# -- what the body says beats what the status says -----------------------------


@pytest.mark.parametrize(
    ("status", "message", "cls", "code"),
    [
        (
            500,
            "This model's maximum context length is 8192 tokens.",
            ContextOverflowError,
            "llm.context_overflow",
        ),
        (
            200,
            "prompt is too long: 300000 tokens > 200000 maximum",
            ContextOverflowError,
            "llm.context_overflow",
        ),
        (400, "Incorrect API key provided: sk-***abcd", ProviderAuthError, "llm.auth"),
        (404, "Incorrect API key provided", ProviderAuthError, "llm.auth"),
        (
            400,
            "Your credit balance is too low to access the Anthropic API.",
            ProviderError,
            "llm.quota_exhausted",
        ),
        (
            429,
            "You exceeded your current quota, please check your plan and billing details.",
            RateLimitError,
            "llm.quota_exhausted",
        ),
        (
            400,
            "The response was filtered due to the prompt triggering Azure OpenAI's content "
            "management policy.",
            ProviderError,
            "llm.content_filtered",
        ),
    ],
)
def test_body_beats_status(status: int, message: str, cls: type[ProviderError], code: str) -> None:
    error = classify(status_error(status, {"error": {"message": message}}))
    assert type(error) is cls
    assert error.code == code
    assert not error.retryable


def test_tpm_request_too_large_is_overflow_but_an_ordinary_tpm_limit_is_not() -> None:
    too_large = (
        "Request too large for gpt-4 in organization org-x on tokens per min (TPM): "
        "Limit 10000, Requested 15000."
    )
    ordinary = (
        "Rate limit reached for gpt-4 in organization org-x on tokens per min (TPM): "
        "Limit 10000, Used 9000, Requested 2000. Please try again in 6s."
    )
    big = classify(
        status_error(429, {"error": {"message": too_large, "code": "rate_limit_exceeded"}})
    )
    assert isinstance(big, ContextOverflowError)
    assert (big.prompt_tokens, big.context_window) == (15000, 10000)
    small = classify(
        status_error(429, {"error": {"message": ordinary, "code": "rate_limit_exceeded"}})
    )
    assert isinstance(small, RateLimitError)
    assert small.retryable
    assert small.retry_after == 6.0
    assert small.details["retry_after_source"] == "message"


@pytest.mark.parametrize(
    ("message", "prompt_tokens", "window"),
    [
        ("prompt is too long: 208310 tokens > 200000 maximum", 208310, 200000),
        (
            "The input token count (1200000) exceeds the maximum number of tokens allowed "
            "(1048576).",
            1200000,
            1048576,
        ),
        (
            "This model's maximum context length is 8192 tokens. However, your messages "
            "resulted in 9000 tokens. Please reduce the length of the messages.",
            9000,
            8192,
        ),
        (
            "Prompt contains 40000 tokens and 0 draft tokens, too large for model with 32768 "
            "maximum context length",
            40000,
            32768,
        ),
        ("context_length_exceeded", None, None),
    ],
)
def test_overflow_numbers_are_parsed(
    message: str, prompt_tokens: int | None, window: int | None
) -> None:
    error = classify(status_error(400, {"error": {"message": message}}))
    assert isinstance(error, ContextOverflowError)
    assert (error.prompt_tokens, error.context_window) == (prompt_tokens, window)


def test_llama_cpp_numbers_come_from_fields() -> None:
    body = {
        "error": {
            "code": 400,
            "message": "the request exceeds the available context size, try increasing it",
            "type": "exceed_context_size_error",
            "n_prompt_tokens": 5000,
            "n_ctx": 4096,
        }
    }
    error = classify(status_error(400, body))
    assert isinstance(error, ContextOverflowError)
    assert (error.prompt_tokens, error.context_window) == (5000, 4096)


# -- Retry-After and its fallbacks, in priority order -------------------------

GEMINI_RATE = {
    "error": {
        "code": 429,
        "message": "You exceeded your current quota. Please retry in 31.9s.",
        "status": "RESOURCE_EXHAUSTED",
        "details": [
            {
                "@type": "type.googleapis.com/google.rpc.QuotaFailure",
                "violations": [{"quotaId": "GenerateRequestsPerMinutePerProjectPerModel-FreeTier"}],
            },
            {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "31s"},
        ],
    }
}


@pytest.mark.parametrize(
    ("headers", "body", "expected", "source"),
    [
        (
            {"retry-after": "5", "x-ratelimit-reset-tokens": "9s"},
            GEMINI_RATE,
            5.0,
            "retry-after header",
        ),
        ({"x-ratelimit-reset-tokens": "9s"}, GEMINI_RATE, 31.0, "body retry delay"),
        (
            {"x-ratelimit-reset-tokens": "9s"},
            {"error": {"message": "Try again in 2s"}},
            2.0,
            "message",
        ),
        (
            {"x-ratelimit-reset-tokens": "9s", "x-ratelimit-reset-requests": "120ms"},
            {"error": {"message": "Rate limit reached"}},
            9.0,
            "rate-limit reset header",
        ),
        ({}, {"error": {"message": "Please try again in 644ms."}}, 0.644, "message"),
        ({}, {"error": {"message": "Please retry after 6 seconds."}}, 6.0, "message"),
        ({}, {"error": {"message": "Try again in 9m38.016s"}}, 300.0, "message"),
        ({}, {"error": {"message": "slow down"}}, None, None),
    ],
)
def test_rate_limit_wait_sources(
    headers: dict[str, str], body: Any, expected: float | None, source: str | None
) -> None:
    error = classify(status_error(429, body, headers=headers))
    assert isinstance(error, RateLimitError)
    assert error.code == "llm.rate_limited"
    assert error.retry_after == (None if expected is None else pytest.approx(expected))
    assert error.details.get("retry_after_source") == source


def test_gemini_per_day_quota_is_exhausted_not_rate_limited() -> None:
    body = json.loads(json.dumps(GEMINI_RATE))
    body["error"]["details"][0]["violations"][0]["quotaId"] = (
        "GenerateRequestsPerDayPerProjectPerModel"
    )
    error = classify(status_error(429, body))
    assert isinstance(error, RateLimitError)
    assert error.code == "llm.quota_exhausted"
    assert not error.retryable


# -- errors inside a 200 stream ------------------------------------------------


@pytest.mark.parametrize(
    ("event", "cls", "code"),
    [
        (
            '{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}',
            ProviderServerError,
            "llm.overloaded",
        ),
        (
            '{"type":"error","error":{"type":"rate_limit_error","message":"Slow down"}}',
            RateLimitError,
            "llm.rate_limited",
        ),
        (
            '{"type":"error","error":{"type":"api_error","message":"Internal"}}',
            ProviderServerError,
            "llm.server_error",
        ),
        (
            '{"error":{"message":"The server had an error","type":"server_error"}}',
            ProviderServerError,
            "llm.server_error",
        ),
        (
            '{"error":{"code":429,"message":"quota","status":"RESOURCE_EXHAUSTED"}}',
            RateLimitError,
            "llm.rate_limited",
        ),
        (
            '{"type":"error","error":{"type":"mystery","message":"?"}}',
            ProviderServerError,
            "llm.server_error",
        ),
    ],
)
def test_sse_error_on_http_200(event: str, cls: type[ProviderError], code: str) -> None:
    text = (
        f'event: message_start\ndata: {{"type":"message_start"}}\n\nevent: error\ndata: {event}\n\n'
    )
    response = httpx.Response(
        200, text=text, headers={"content-type": "text/event-stream"}, request=request()
    )
    error = classify_response(response, provider="anthropic", now=NOW)
    assert type(error) is cls
    assert error.code == code
    assert error.status_code == 200
    assert "stream" in error.message


# -- bodies that are not what anyone expects -------------------------------------


@pytest.mark.parametrize(
    ("content", "content_type", "kind", "fragment"),
    [
        (b"", "", "empty", "empty body"),
        (b"   \n", "text/plain", "empty", "empty body"),
        (
            b"<html><head><title>502 Bad Gateway</title></head><body><h1>502</h1></body></html>",
            "text/html",
            "html",
            "'502 Bad Gateway'",
        ),
        (
            b"<!DOCTYPE html><html><body><h1>Cloudflare &amp; friends</h1></body></html>",
            "",
            "html",
            "Cloudflare & friends",
        ),
        (
            b'{"error": {"message": "The server is overloa',
            "application/json",
            "json",
            "The server is overloa",
        ),
        (bytes(range(256)) * 4, "application/octet-stream", "binary", "non-text body (1024 bytes)"),
        (b"\xff\xfe\xfd" * 100, "application/json", "binary", "non-text body"),
        (b"[" * 50_000 + b"]" * 50_000, "application/json", "json", "could not read"),
        (b'{"error": 12}', "application/json", "json", "could not read"),
        (b'"just a string"', "application/json", "json", "could not read"),
        (b"Too Many Requests", "text/plain", "text", "Too Many Requests"),
    ],
)
def test_strange_bodies_never_crash(
    content: bytes, content_type: str, kind: str, fragment: str
) -> None:
    headers = {"content-type": content_type} if content_type else {}
    error = classify(status_error(502, body_text=content, headers=headers))
    assert isinstance(error, ProviderError)
    assert error.details["body_kind"] == kind
    assert fragment in error.message


def test_ten_megabyte_body_is_read_only_as_a_prefix() -> None:
    message = "x" * (10 * 1024 * 1024)
    content = json.dumps({"error": {"message": message}}).encode()
    error = classify(status_error(500, body_text=content))
    assert isinstance(error, ProviderServerError)
    assert error.details["body_truncated"] is True
    assert error.details["body_bytes"] == len(content)
    assert len(error.message) <= 600
    assert len(json.dumps(error.to_dict())) < 20_000


def test_unread_sync_stream_is_read_up_to_the_bound() -> None:
    chunks = [b'{"error": {"message": "prompt is too long: 9 tokens > 8 maximum"}}'] + [
        b" " * 65536
    ] * 200

    def stream() -> Any:
        yield from chunks

    req = request()
    response = httpx.Response(400, content=stream(), request=req)
    error = classify(httpx.HTTPStatusError("x", request=req, response=response))
    assert isinstance(error, ContextOverflowError)
    assert response.is_closed


@pytest.mark.anyio
async def test_unread_async_stream_is_not_touched() -> None:
    async def stream() -> Any:
        yield b'{"error": {"message": "boom"}}'

    req = request()
    response = httpx.Response(503, content=stream(), request=req)
    error = classify(httpx.HTTPStatusError("x", request=req, response=response))
    assert isinstance(error, ProviderServerError)
    assert error.details["body_kind"] == "empty"


def test_response_without_request_is_fine() -> None:
    error = classify_response(httpx.Response(429, json={"error": {"message": "slow"}}))
    assert isinstance(error, RateLimitError)


# -- secrets ------------------------------------------------------------------------


def test_the_request_key_is_redacted_wherever_the_provider_echoes_it() -> None:
    odd_key = "corp-7f3a9b2c1d0e4f5a6b7c8d9e"  # matches no known key shape
    req = httpx.Request(
        "POST", "https://llm.internal.example/v1/chat/completions", headers={"api-key": odd_key}
    )
    body = {
        "error": {"message": f"key {odd_key} revoked", "type": odd_key, "code": odd_key},
        "request_id": odd_key,
    }
    exc = status_error(401, body, headers={"x-request-id": odd_key}, req=req)
    error = classify(exc)
    text = str(error) + repr(error) + json.dumps(error.to_dict())
    assert odd_key not in text


def test_gemini_key_in_the_query_never_shows() -> None:
    key = "AIzaSyA-not-a-real-key-0123456789abcdef"
    req = httpx.Request(
        "POST",
        f"https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash:generateContent?key={key}",
    )
    error = classify(status_error(503, {"error": {"message": f"echo {key}"}}, req=req))
    text = str(error) + repr(error) + json.dumps(error.to_dict())
    assert key not in text
    assert isinstance(error, ProviderError)
    assert (error.provider, error.model) == ("gemini", "gemini-2.5-flash")
    assert error.details["url"] == (
        "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash:generateContent"
    )


@pytest.mark.parametrize(
    ("url", "provider"),
    [
        ("https://api.openai.com/v1/chat/completions", "openai"),
        ("https://myres.openai.azure.com/openai/deployments/gpt4o/chat/completions", "azure"),
        ("https://api.anthropic.com/v1/messages", "anthropic"),
        ("http://127.0.0.1:11434/api/chat", "ollama"),
        ("https://openrouter.ai/api/v1/chat/completions", "openrouter"),
        ("https://example.test/v1/chat/completions", None),
    ],
)
def test_provider_is_inferred_from_the_host(url: str, provider: str | None) -> None:
    error = classify(status_error(500, req=httpx.Request("POST", url)))
    assert isinstance(error, ProviderError)
    assert error.provider == provider


def test_explicit_provider_and_model_win() -> None:
    error = classify(status_error(500), provider="vllm", model="qwen3")
    assert isinstance(error, ProviderError)
    assert (error.provider, error.model) == ("vllm", "qwen3")
    assert "vllm (qwen3)" in error.message


# -- no answer at all ------------------------------------------------------------


@pytest.mark.parametrize(
    ("exc_type", "kind", "words"),
    [
        (httpx.ConnectTimeout, "connect", "could not connect"),
        (httpx.ReadTimeout, "read", "no data within the read timeout"),
        (httpx.WriteTimeout, "write", "write timeout"),
        (httpx.PoolTimeout, "pool", "no free connection"),
    ],
)
def test_every_httpx_timeout(exc_type: type[httpx.TimeoutException], kind: str, words: str) -> None:
    req = request()
    req.extensions["timeout"] = {"connect": 5.0, "read": 120.0, "write": 6.0, "pool": 7.0}
    error = classify(exc_type("timed out", request=req))
    assert isinstance(error, ProviderTimeoutError)
    assert (error.code, error.retryable, error.status_code) == ("llm.timeout", True, None)
    assert words in error.message
    expected = {"connect": 5.0, "read": 120.0, "write": 6.0, "pool": 7.0}[kind]
    assert error.details["timeout_seconds"] == expected


@pytest.mark.parametrize(
    "exc",
    [
        httpx.ConnectError("[Errno 111] Connection refused"),
        httpx.ConnectError("[Errno -2] Name or service not known"),
        httpx.ReadError("[Errno 104] Connection reset by peer"),
        httpx.WriteError("broken pipe"),
        httpx.RemoteProtocolError("Server disconnected without sending a response."),
        httpx.ProxyError("407 Proxy Authentication Required"),
        httpx.CloseError("close failed"),
        ConnectionResetError(104, "Connection reset by peer"),
        BrokenPipeError(),
        OSError("Network is unreachable"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_connection_failures_are_retryable_network_errors(exc: Exception) -> None:
    error = classify(exc)
    assert type(error) is ProviderError
    assert (error.code, error.retryable, error.status_code) == ("llm.network_error", True, None)


def test_builtin_timeout_is_a_timeout() -> None:
    assert isinstance(classify(TimeoutError()), ProviderTimeoutError)


def test_tls_verification_failure_is_not_retried() -> None:
    cause = ssl.SSLCertVerificationError(1, "certificate verify failed: self-signed certificate")
    exc = httpx.ConnectError("[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed")
    exc.__cause__ = cause
    error = classify(exc)
    assert (error.code, error.retryable) == ("llm.tls_error", False)


@pytest.mark.parametrize(
    "exc",
    [
        httpx.UnsupportedProtocol("Request URL is missing an 'http://' or 'https://' protocol."),
        httpx.InvalidURL("Invalid port"),
        httpx.TooManyRedirects("Exceeded maximum allowed redirects."),
        httpx.LocalProtocolError("Illegal header value"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_endpoint_mistakes_fail_fast(exc: Exception) -> None:
    error = classify(exc)
    assert (error.code, error.retryable) == ("llm.bad_endpoint", False)


def test_decoding_and_json_failures_are_malformed_responses() -> None:
    assert classify(httpx.DecodingError("gzip truncated")).code == "llm.malformed_response"
    try:
        json.loads('{"choices": [')
    except json.JSONDecodeError as exc:
        error = classify(exc)
    assert (error.code, error.retryable) == ("llm.malformed_response", True)


def test_typed_errors_pass_through_unchanged() -> None:
    original = RateLimitError("slow", retry_after=3)
    assert classify_provider_error(original) is original


def test_tenacity_retry_error_is_judged_by_its_last_attempt() -> None:
    @tenacity.retry(stop=tenacity.stop_after_attempt(2), wait=tenacity.wait_none())
    def always_times_out() -> None:
        raise httpx.ReadTimeout("timed out")

    with pytest.raises(tenacity.RetryError) as caught:
        always_times_out()
    assert isinstance(classify(caught.value), ProviderTimeoutError)


def test_pydantic_validation_error_becomes_schema_validation_error() -> None:
    class Out(pydantic.BaseModel):
        answer: int

    with pytest.raises(pydantic.ValidationError) as caught:
        Out.model_validate({"answer": "many"})
    error = classify(caught.value)
    assert isinstance(error, SchemaValidationError)
    assert error.schema_name == "Out"


def test_cancellation_is_reported_not_swallowed_silently() -> None:
    error = classify(KeyboardInterrupt())
    assert (error.code, error.retryable) == ("llm.cancelled", False)


def test_hostile_exceptions_never_break_the_classifier() -> None:
    class Hostile(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no str for you")

        @property
        def request(self) -> Any:
            raise RuntimeError("no request either")

    error = classify(Hostile())
    assert error.code == "llm.unknown_error"
    assert "Hostile" in error.message


def test_unknown_exception_is_not_retried_and_is_redacted() -> None:
    error = classify(ValueError(f"weird thing with {SECRET_KEY}"))
    assert (error.code, error.retryable) == ("llm.unknown_error", False)
    assert SECRET_KEY not in str(error)


# -- through a real httpx client, with respx ---------------------------------------


@respx.mock
def test_respx_round_trip_through_raise_for_status() -> None:
    respx.post("https://api.anthropic.com/v1/messages").mock(
        return_value=httpx.Response(
            529,
            json={"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
            headers={"request-id": "req_011CSHoEeqs5C35K2UUqR7Fy"},
        )
    )
    with httpx.Client() as client:
        response = client.post(
            "https://api.anthropic.com/v1/messages",
            headers={"x-api-key": SECRET_KEY},
            json={"model": "claude"},
        )
        with pytest.raises(httpx.HTTPStatusError) as caught:
            response.raise_for_status()
    error = classify(caught.value, model="claude-sonnet-4-6")
    assert isinstance(error, ProviderServerError)
    assert error.code == "llm.overloaded"
    assert error.provider == "anthropic"
    assert error.request_id == "req_011CSHoEeqs5C35K2UUqR7Fy"
    assert error.provider_error_type == "overloaded_error"


@pytest.mark.anyio
@respx.mock
async def test_respx_async_connect_error() -> None:
    respx.post("https://api.openai.com/v1/chat/completions").mock(
        side_effect=httpx.ConnectError("[Errno 111] Connection refused")
    )
    async with httpx.AsyncClient() as client:
        with pytest.raises(httpx.ConnectError) as caught:
            await client.post("https://api.openai.com/v1/chat/completions", json={})
    error = classify(caught.value)
    assert error.code == "llm.network_error"
    assert isinstance(error, ProviderError)
    assert error.provider == "openai"


def test_a_wait_beyond_the_cap_is_capped_but_remembered() -> None:
    error = classify(
        status_error(429, {"error": {"message": "slow"}}, headers={"retry-after": "86400"})
    )
    assert error.retry_after == 300.0
    assert error.details["retry_after_requested"] == 86400.0
    assert "asked to wait 86400 s; capped at 300 s" in str(error)
    unhinted = classify(status_error(503, headers={"retry-after": "12"}))
    assert "retry_after_requested" not in unhinted.details


# -- details say what the body said, nothing inferred --------------------------------------

OPENAI_BAD_KEY = {
    "error": {
        "message": "Incorrect API key provided: sk-proj-****. You can find your API key at ...",
        "type": "invalid_request_error",
        "param": None,
        "code": "invalid_api_key",
    }
}


def test_a_401_whose_body_states_no_status_has_no_body_status() -> None:
    """OpenAI types a bad key 'invalid_request_error': that names no status, least of all 400."""
    error = classify(status_error(401, OPENAI_BAD_KEY))
    assert isinstance(error, ProviderAuthError)
    assert error.status_code == 401
    assert error.details["status_code"] == 401
    assert "body_status" not in error.details


@pytest.mark.parametrize(
    ("body", "stated"),
    [
        (
            {"error": {"code": 401, "message": "API key not valid", "status": "UNAUTHENTICATED"}},
            401,
        ),
        ({"error": {"message": "bad", "code": "401"}}, 401),
        ({"code": 429, "message": "relayed"}, 429),
    ],
)
def test_a_status_the_body_states_is_kept(body: dict[str, Any], stated: int) -> None:
    assert (
        classify(status_error(503 if stated == 429 else 401, body)).details["body_status"] == stated
    )


def test_an_error_type_still_judges_a_stream_error_and_a_relayed_limit() -> None:
    """The type's meaning is still used to judge; it is only not reported as the body's status."""
    relayed = classify(
        status_error(502, {"error": {"message": "slow", "type": "rate_limit_error"}})
    )
    assert isinstance(relayed, RateLimitError)
    assert "body_status" not in relayed.details
    overloaded = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    in_stream = classify_response(httpx.Response(200, json=overloaded, request=request()))
    assert isinstance(in_stream, ProviderServerError)
    assert in_stream.code == "llm.overloaded"


def test_a_401_through_fluid_forge_json_tells_the_truth(tmp_path: Any) -> None:
    import shutil

    from fluid_build.cli.exit_codes import EXIT_CODES
    from fluid_build.cli.forge import EXAMPLE_INTENT
    from tests.docs_model import model_server
    from tests.test_cli_conventions import fluid, fresh_env

    home = tmp_path / "home"
    home.mkdir()
    intent = tmp_path / "intent.yaml"
    shutil.copy(EXAMPLE_INTENT, intent)
    with model_server() as (base, model):
        model.script = lambda request: (401, OPENAI_BAD_KEY)
        env = fresh_env(
            home, OPENAI_API_KEY=SECRET_KEY, OPENAI_BASE_URL=f"{base}/v1", NO_PROXY="127.0.0.1"
        )
        done = fluid(home, "forge", str(intent), "--json", env=env)
    assert done.returncode == EXIT_CODES["auth"], done.stdout + done.stderr
    error = json.loads(done.stdout.strip().splitlines()[-1])["error"]
    assert error["status_code"] == error["details"]["status_code"] == 401
    assert "body_status" not in error["details"]
    assert error["provider_error_code"] == "invalid_api_key"
    assert SECRET_KEY not in done.stdout + done.stderr
