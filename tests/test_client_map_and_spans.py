"""LLMClient.map / amap and the client's spans, of calls and streams: batch.py and telemetry.py
wired into the client.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import respx
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from fluid_build.copilot import LLMClient
from fluid_build.copilot.agents.errors import AgentExecutionError
from fluid_build.copilot.call.envelope import RetryEnvelope
from fluid_build.copilot.health.cooldown import MemoryCooldownStore
from fluid_build.copilot.llm.types import StreamEvent
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
    assert batch.summary() == {"success": 2, "llm.invalid_request": 1, "cost_usd": 0.0}

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


# -- streams -------------------------------------------------------------------------------

PROMPT = "the secret plan for Q3"
STREAMED = [
    {"model": "gpt-4o-2024-08-06", "choices": [{"delta": {"role": "assistant", "content": "fi"}}]},
    {"choices": [{"delta": {"content": "ne"}, "finish_reason": "stop"}]},
    {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2}},
]
# The provider gives up mid-answer, echoing the key and the prompt as some gateways do.
CUT = [STREAMED[0], {"error": {"message": f"overloaded {KEY} on {PROMPT}", "type": "server_error"}}]


def sse(*chunks: dict[str, object]) -> httpx.Response:
    body = "".join(f"data: {json.dumps(chunk)}\n\n" for chunk in chunks) + "data: [DONE]\n\n"
    return httpx.Response(200, content=body.encode(), headers={"content-type": "text/event-stream"})


@dataclass
class Traced:
    client: LLMClient
    clock: FakeClock
    spans: InMemorySpanExporter
    metrics: InMemoryMetricReader

    def span(self, name: str) -> ReadableSpan:
        [found] = [s for s in self.spans.get_finished_spans() if s.name == name]
        return found

    def attempts(self) -> list[ReadableSpan]:
        found = [s for s in self.spans.get_finished_spans() if s.name == "fluid.attempt"]
        return sorted(found, key=lambda s: (s.attributes or {})["fluid.attempt"])

    def points(self, metric: str) -> list[Any]:
        data = self.metrics.get_metrics_data()
        assert data is not None
        return [
            point
            for resource in data.resource_metrics
            for scope in resource.scope_metrics
            for found in scope.metrics
            if found.name == metric
            for point in found.data.data_points
        ]

    def shown(self) -> str:
        """Every name, attribute, event and status recorded, and every metric point."""
        shown = []
        for span in self.spans.get_finished_spans():
            shown += [span.name, json.dumps(dict(span.attributes or {}), default=str)]
            shown += [span.status.description or ""]
            shown += [json.dumps(dict(e.attributes or {}), default=str) for e in span.events]
        data = self.metrics.get_metrics_data()
        assert data is not None
        return "\n".join([*shown, data.to_json()])


def traced() -> Traced:
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    metrics = InMemoryMetricReader()
    telemetry = Telemetry(
        tracer_provider=tracer_provider, meter_provider=MeterProvider(metric_readers=[metrics])
    )
    clock = FakeClock()
    return Traced(make(clock, telemetry=telemetry), clock, spans, metrics)


def read(client: LLMClient, shell: str) -> list[StreamEvent]:
    """Every event of one stream of PROMPT, from the sync or the async shell."""
    if shell == "sync":
        with client:
            return list(client.stream(PROMPT))

    async def go() -> list[StreamEvent]:
        async with client:
            return [event async for event in client.astream(PROMPT)]

    return asyncio.run(go())


@pytest.mark.parametrize("shell", ["sync", "async"])
def test_a_stream_is_one_call_span_with_its_attempt_and_usage(
    mock: respx.MockRouter, shell: str
) -> None:
    mock.post(URL).mock(side_effect=[sse(*STREAMED)])
    otel = traced()
    events = read(otel.client, shell)
    assert [e.type for e in events] == ["text", "text", "done"]
    whole = otel.span("chat gpt-4o")
    assert whole.kind is SpanKind.CLIENT
    assert whole.status.status_code is StatusCode.UNSET
    assert dict(whole.attributes or {}) == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "gpt-4o",
        "gen_ai.output.type": "text",
        "server.address": "api.openai.com",
        "server.port": 443,
        "gen_ai.response.time_to_first_chunk": 0.0,
        "gen_ai.response.model": "gpt-4o-2024-08-06",
        "gen_ai.usage.input_tokens": 5,
        "gen_ai.usage.output_tokens": 2,
        "gen_ai.response.finish_reasons": ("stop",),
        "fluid.attempts": 1,
        # A stream walks the chain as a call does: its span names the entry that answered.
        "fluid.answered_by": "openai:gpt-4o",
        # 5 input tokens at 2.50 USD and 2 output at 10 USD per million (genai-prices).
        "fluid.cost_usd": pytest.approx(3.25e-05),
    }
    [attempt] = otel.attempts()
    assert attempt.parent is not None
    assert attempt.parent.span_id == whole.context.span_id
    assert attempt.status.status_code is StatusCode.UNSET
    # The answering attempt lasts as long as the stream is read.
    assert attempt.end_time is not None
    assert whole.end_time is not None
    assert attempt.end_time <= whole.end_time

    [duration] = otel.points("gen_ai.client.operation.duration")
    assert duration.attributes["gen_ai.response.model"] == "gpt-4o-2024-08-06"
    tokens = {
        p.attributes["gen_ai.token.type"]: p.sum for p in otel.points("gen_ai.client.token.usage")
    }
    assert tokens == {"input": 5, "output": 2}
    [first] = otel.points("gen_ai.client.operation.time_to_first_chunk")
    assert first.count == 1
    assert KEY not in otel.shown()
    assert PROMPT not in otel.shown()


@pytest.mark.parametrize("shell", ["sync", "async"])
def test_a_stream_cut_mid_answer_fails_its_span_with_the_typed_error(
    mock: respx.MockRouter, shell: str
) -> None:
    mock.post(URL).mock(side_effect=[sse(*CUT)])
    otel = traced()
    with pytest.raises(AgentExecutionError) as caught:
        read(otel.client, shell)
    assert caught.value.details["interrupted"] is True
    whole = otel.span("chat gpt-4o")
    [attempt] = otel.attempts()
    for span in (whole, attempt):
        attributes = span.attributes or {}
        assert attributes["error.type"] == type(caught.value).__name__
        assert attributes["fluid.error.code"] == caught.value.code
        assert span.status.status_code is StatusCode.ERROR
        assert span.status.description == caught.value.code
    assert "gen_ai.usage.input_tokens" not in (whole.attributes or {})
    [duration] = otel.points("gen_ai.client.operation.duration")
    assert duration.attributes["error.type"] == type(caught.value).__name__
    assert otel.points("gen_ai.client.token.usage") == []
    assert KEY not in otel.shown()
    assert PROMPT not in otel.shown()


def test_a_stream_retried_after_a_429_before_its_first_event_is_two_attempts(
    mock: respx.MockRouter,
) -> None:
    limited = httpx.Response(429, json={"error": {"message": "slow"}}, headers={"retry-after": "3"})
    mock.post(URL).mock(side_effect=[limited, sse(*STREAMED)])
    otel = traced()
    assert read(otel.client, "sync")[-1].type == "done"
    assert otel.clock.waits == [3.0]
    whole = otel.span("chat gpt-4o")
    first, second = otel.attempts()
    assert dict(first.attributes or {}) == {
        "fluid.attempt": 1,
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "gpt-4o",
        "fluid.wait.seconds": 0.0,
        "error.type": "RateLimitError",
        "fluid.error.code": "llm.rate_limited",
        "http.response.status_code": 429,
        "fluid.error.retry_after": 3.0,
        "fluid.error.retryable": True,
    }
    assert dict(second.attributes or {}) == {
        "fluid.attempt": 2,
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "gpt-4o",
        "fluid.wait.seconds": 3.0,
        "fluid.wait.reason": "retry_after",
    }
    attributes = whole.attributes or {}
    assert attributes["fluid.attempts"] == 2
    assert attributes["gen_ai.response.time_to_first_chunk"] == 3.0  # the wait came first
    [wait] = whole.events
    assert dict(wait.attributes or {}) == {
        "fluid.wait.seconds": 3.0,
        "fluid.wait.reason": "retry_after",
        "fluid.attempt": 1,
    }


@pytest.mark.parametrize("shell", ["sync", "async"])
def test_a_caller_that_stops_early_ends_the_span_without_an_error(
    mock: respx.MockRouter, shell: str
) -> None:
    mock.post(URL).mock(side_effect=[sse(*STREAMED)])
    otel = traced()
    if shell == "sync":
        with otel.client as client:
            events = client.stream(PROMPT)
            assert next(events).text == "fi"
            events.close()
    else:

        async def go() -> None:
            async with otel.client as client:
                events = client.astream(PROMPT)
                assert (await anext(events)).text == "fi"
                await events.aclose()  # type: ignore[attr-defined]

        asyncio.run(go())
    whole = otel.span("chat gpt-4o")
    attributes = whole.attributes or {}
    assert attributes["fluid.stream.stopped_early"] is True
    assert attributes["fluid.attempts"] == 1
    assert "error.type" not in attributes
    assert "gen_ai.usage.input_tokens" not in attributes
    assert whole.status.status_code is StatusCode.UNSET
    [attempt] = otel.attempts()
    assert "error.type" not in (attempt.attributes or {})
    [duration] = otel.points("gen_ai.client.operation.duration")
    assert "error.type" not in duration.attributes
    assert otel.points("gen_ai.client.token.usage") == []
