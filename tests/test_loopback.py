"""Real sockets on 127.0.0.1: what httpx raises there is classified right."""

from __future__ import annotations

import httpx
import pytest

from fluid_build.copilot.agents.error_classification import classify_provider_error
from fluid_build.copilot.agents.errors import ProviderError, ProviderTimeoutError, RateLimitError
from tests import loopback


def post(base: str, timeout: float = 2.0) -> httpx.Response:
    with httpx.Client(timeout=httpx.Timeout(timeout)) as client:
        response = client.post(f"{base}/v1/chat/completions", json={"model": "m"})
        response.raise_for_status()
        return response


def test_read_timeout_reports_the_configured_limit() -> None:
    with loopback.serve(loopback.silent) as base, pytest.raises(httpx.ReadTimeout) as caught:
        post(base, timeout=0.2)
    error = classify_provider_error(caught.value, provider="openai")
    assert isinstance(error, ProviderTimeoutError)
    assert error.retryable
    assert error.details["timeout_seconds"] == 0.2
    assert "read timeout (0.2 s)" in error.message


def test_connection_refused_is_a_retryable_network_error() -> None:
    with pytest.raises(httpx.ConnectError) as caught:
        post(f"http://127.0.0.1:{loopback.closed_port()}")
    error = classify_provider_error(caught.value)
    assert type(error) is ProviderError
    assert (error.code, error.retryable) == ("llm.network_error", True)


@pytest.mark.parametrize(
    "handler", [loopback.reset, loopback.truncated], ids=["reset", "truncated"]
)
def test_dropped_connections_are_retryable_network_errors(handler: loopback.Handler) -> None:
    with loopback.serve(handler) as base, pytest.raises(httpx.TransportError) as caught:
        post(base)
    error = classify_provider_error(caught.value)
    assert (error.code, error.retryable) == ("llm.network_error", True)


def test_real_429_with_retry_after() -> None:
    body = b'{"error": {"message": "Rate limit reached", "type": "requests"}}'
    handler = loopback.respond(429, body, {"retry-after": "3", "content-type": "application/json"})
    with loopback.serve(handler) as base, pytest.raises(httpx.HTTPStatusError) as caught:
        post(base)
    error = classify_provider_error(caught.value)
    assert isinstance(error, RateLimitError)
    assert error.retry_after == 3.0
