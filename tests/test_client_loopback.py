"""Streams that break on a real socket: the typed error carries what had arrived."""

from __future__ import annotations

import json

import pytest

from fluid_build.copilot import LLMClient, StreamEvent
from fluid_build.copilot.agents.errors import ProviderError, ProviderTimeoutError
from fluid_build.copilot.call.envelope import RetryEnvelope
from tests import loopback

FIRST = (
    "data: " + json.dumps({"choices": [{"delta": {"content": "Hello wor"}}]}) + "\n\n"
).encode()


def client(base: str, timeout: float = 5.0) -> LLMClient:
    envelope = RetryEnvelope(sleep=lambda s: None, hook=lambda e: None)
    return LLMClient("vllm", "m", base_url=f"{base}/v1", timeout=timeout, envelope=envelope, env={})


@pytest.mark.parametrize(
    ("action", "timeout", "cls", "code"),
    [
        ("reset", 5.0, ProviderError, "llm.network_error"),
        ("stall", 0.3, ProviderTimeoutError, "llm.timeout"),
    ],
)
def test_a_broken_stream_raises_typed_with_the_partial_text(
    action: str, timeout: float, cls: type[ProviderError], code: str
) -> None:
    handler = loopback.sse_then(action, FIRST)
    received: list[StreamEvent] = []
    with (
        loopback.serve(handler) as base,
        client(base, timeout) as llm,
        pytest.raises(cls) as caught,
    ):
        received.extend(llm.stream("hi"))
    assert [event.text for event in received] == ["Hello wor"]
    error = caught.value
    assert error.code == code
    assert error.details["partial_text"] == "Hello wor"
    assert error.details["interrupted"] is True
