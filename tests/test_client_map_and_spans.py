"""LLMClient.map / amap and the client's spans: batch.py and telemetry.py wired into the client."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import httpx
import pytest
import respx
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from fluid_build.copilot import LLMClient
from fluid_build.copilot.call.envelope import RetryEnvelope
from fluid_build.copilot.health.cooldown import MemoryCooldownStore
from fluid_build.copilot.telemetry import Telemetry
from tests.fakes import FakeClock

KEY = "sk-proj-CLIENTOTEL0123456789abcdef"
URL = "https://api.openai.com/v1/chat/completions"
OK = {
    "model": "gpt-4o-2024-08-06",
    "choices": [{"message": {"content": "fine"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 5, "completion_tokens": 2},
}


@pytest.fixture
def mock() -> Iterator[respx.MockRouter]:
    with respx.mock(assert_all_called=False) as router:
        yield router


def make(clock: FakeClock, **kwargs: object) -> LLMClient:
    envelope = RetryEnvelope(
        cooldown=MemoryCooldownStore(),
        clock=clock,
        sleep=clock.sleep,
        asleep=clock.asleep,
        random=lambda: 0.0,
        hook=lambda event: None,
    )
    return LLMClient("openai", "gpt-4o", api_key=KEY, envelope=envelope, env={}, **kwargs)  # type: ignore[arg-type]


def by_prompt(request: httpx.Request) -> httpx.Response:
    prompt = json.loads(request.content)["messages"][-1]["content"]
    if prompt == "bad":
        return httpx.Response(
            400, json={"error": {"message": "no", "type": "invalid_request_error"}}
        )
    return httpx.Response(200, json={"choices": [{"message": {"content": prompt.upper()}}]})


def test_map_and_amap_are_the_client_s(mock: respx.MockRouter) -> None:
    mock.post(URL).mock(side_effect=by_prompt)
    clock = FakeClock()
    with make(clock) as client:
        batch = client.map(["a", "bad", "c"], concurrency=2)
    assert [o.value.text if o.value else o.code for o in batch] == ["A", "llm.invalid_request", "C"]
    assert batch.summary() == {"success": 2, "llm.invalid_request": 1}

    async def go() -> list[str]:
        async with make(clock) as client:
            done = await client.amap(["x", "y"], concurrency=2)
        return [c.text for c in done.values()]

    assert asyncio.run(go()) == ["X", "Y"]


@pytest.mark.parametrize("shell", ["sync", "async"])
def test_the_client_traces_a_call_that_waited_on_a_429(mock: respx.MockRouter, shell: str) -> None:
    mock.post(URL).mock(
        side_effect=[
            httpx.Response(429, json={"error": {"message": "slow"}}, headers={"retry-after": "3"}),
            httpx.Response(200, json=OK),
        ]
    )
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    clock = FakeClock()
    client = make(clock, telemetry=Telemetry(tracer_provider=provider))
    prompt = "the secret plan for Q3"
    if shell == "sync":
        with client:
            done = client.complete(prompt)
    else:

        async def go() -> object:
            async with client:
                return await client.acomplete(prompt)

        done = asyncio.run(go())
    assert clock.waits == [3.0]
    finished = spans.get_finished_spans()
    [whole] = [s for s in finished if s.name == "chat gpt-4o"]
    attempts = sorted(
        (s for s in finished if s.name == "fluid.attempt"),
        key=lambda s: (s.attributes or {})["fluid.attempt"],
    )
    assert [a.parent.span_id for a in attempts if a.parent] == [whole.context.span_id] * 2
    assert (attempts[0].attributes or {})["fluid.error.code"] == "llm.rate_limited"
    assert (attempts[1].attributes or {})["fluid.wait.seconds"] == 3.0
    assert (attempts[1].attributes or {})["fluid.wait.reason"] == "retry_after"
    attributes = whole.attributes or {}
    assert attributes["gen_ai.usage.input_tokens"] == 5
    assert attributes["fluid.attempts"] == 2
    assert attributes["fluid.answered_by"] == "openai:gpt-4o"
    shown = json.dumps([dict(s.attributes or {}) for s in finished], default=str)
    assert KEY not in shown
    assert prompt not in shown
    assert done is not None


def test_without_telemetry_the_client_opens_no_span(mock: respx.MockRouter) -> None:
    mock.post(URL).respond(200, json=OK)
    with make(FakeClock()) as client:
        assert client.telemetry is None
        assert client.complete("hi").text == "fine"
