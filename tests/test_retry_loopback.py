"""The envelope against a real HTTP server on loopback, with real time."""

from __future__ import annotations

import time

import httpx

from fluid_build.copilot.call.envelope import RetryEnvelope
from tests import loopback

OK = (200, {"content-type": "application/json"}, b'{"ok": true}')
LIMITED = (
    429,
    {"content-type": "application/json", "retry-after": "1"},
    b'{"error": {"message": "Rate limit reached", "type": "requests"}}',
)


def test_429_with_retry_after_one_second_then_200() -> None:
    replies = iter([LIMITED, OK])
    with loopback.http_server(lambda seen: next(replies)) as server, httpx.Client() as client:
        url = loopback.base_url(server) + "/v1/chat/completions"

        def send() -> object:
            response = client.post(url, json={"model": "m"})
            response.raise_for_status()
            return response.json()

        started = time.monotonic()
        result = RetryEnvelope(random=lambda: 0.0).call(send, provider="openai")
        elapsed = time.monotonic() - started
    assert result == {"ok": True}
    assert len(server.seen) == 2
    assert 1.0 <= elapsed < 1.5
    gap = server.seen[1].at - server.seen[0].at
    assert 0.99 <= gap < 1.5
