"""OpenTelemetry spans and metrics of a call (copilot/telemetry.py), read from the SDK in memory.

Each test runs a call the way the client does: the call's plan inside
``CallTrace.run``, the retry envelope around the attempts wrapped by
``CallTrace.attempts``, and the envelope's waits reported to ``CallTrace.waited``;
a stream's plan inside ``CallTrace.stream``.
The SDK's in-memory span exporter and metric reader hold what was recorded.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from fluid_build.copilot.agents.errors import ProviderError, RateLimitError
from fluid_build.copilot.call.drive import Call, Emit, Plan, arun, run, stream
from fluid_build.copilot.call.envelope import RetryEnvelope, RetryPolicy
from fluid_build.copilot.health.cooldown import MemoryCooldownStore
from fluid_build.copilot.llm.types import Completion, StreamEvent, Usage
from fluid_build.copilot.telemetry import Telemetry, telemetry_from
from fluid_build.errors import FluidError
from tests.fakes import FakeClock

KEY = "sk-proj-OTELKEY0123456789abcdefXYZ"
PROMPT = "Summarise the quarterly numbers for ACME-SECRET-PROJECT"
URL = "https://api.openai.com/v1/chat/completions"
OK = {
    "model": "gpt-4o-2024-08-06",
    "choices": [{"message": {"content": "All fine."}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 21, "completion_tokens": 9},
}


@dataclass
class Recorded:
    telemetry: Telemetry
    spans: InMemorySpanExporter
    metrics: InMemoryMetricReader

    def finished(self) -> dict[str, ReadableSpan]:
        """The finished spans by name; an attempt's name carries its number here."""
        out = {}
        for span in self.spans.get_finished_spans():
            name = span.name
            if name == "fluid.attempt":
                name = f"attempt {(span.attributes or {})['fluid.attempt']}"
            out[name] = span
        return out

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


def recorded(capture_content: bool = False) -> Recorded:
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    metrics = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[metrics])
    telemetry = Telemetry(
        tracer_provider=tracer_provider,
        meter_provider=meter_provider,
        capture_content=capture_content,
    )
    return Recorded(telemetry, spans, metrics)


@pytest.fixture
def otel() -> Recorded:
    return recorded()


def answers(*responses: httpx.Response) -> Callable[[httpx.Request], httpx.Response]:
    queue = list(responses)
    return lambda request: queue.pop(0)


def too_many(retry_after: str = "2") -> httpx.Response:
    # The body echoes the prompt and the key, as some gateways do: neither may reach a span.
    body = {"error": {"message": f"rate limited for key {KEY} on '{PROMPT}'"}}
    return httpx.Response(429, json=body, headers={"retry-after": retry_after})


def call(
    otel: Recorded,
    handler: Callable[[httpx.Request], httpx.Response],
    *,
    shell: str = "sync",
    attempts: int = 3,
    system: str | None = None,
) -> tuple[Completion, FakeClock]:
    """One traced call, as LLMClient makes it, against ``handler``; the clock it ran on."""
    clock = FakeClock()
    trace = otel.telemetry.call(
        "openai",
        "gpt-4o",
        PROMPT,
        {"system": system, "max_output_tokens": 50},
        endpoint="https://api.openai.com/v1",
        secrets=(KEY,),
        clock=clock,
    )
    envelope = RetryEnvelope(
        RetryPolicy(attempts=attempts),
        cooldown=MemoryCooldownStore(),
        hook=trace.waited,
        clock=clock,
        sleep=clock.sleep,
        asleep=clock.asleep,
        random=lambda: 0.0,
    )
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": PROMPT}]}
    headers = {"authorization": f"Bearer {KEY}"}

    def completion(response: httpx.Response) -> Completion:
        response.raise_for_status()
        data = response.json()
        usage = data["usage"]
        return Completion(
            text=data["choices"][0]["message"]["content"],
            provider="openai",
            model=data["model"],
            finish_reason=data["choices"][0]["finish_reason"],
            usage=Usage(
                input_tokens=usage["prompt_tokens"], output_tokens=usage["completion_tokens"]
            ),
        )

    transport = httpx.MockTransport(handler)
    if shell == "sync":
        with httpx.Client(transport=transport) as http:

            def attempt() -> Plan[Completion]:
                return completion((yield Call(lambda: http.post(URL, json=body, headers=headers))))

            plan = envelope.plan(
                trace.attempts(attempt, "openai", "gpt-4o"),
                key="openai|key|gpt-4o",
                provider="openai",
                model="gpt-4o",
            )
            return run(trace.run(plan)), clock

    async def go() -> Completion:
        async with httpx.AsyncClient(transport=transport) as http:

            def attempt() -> Plan[Completion]:
                return completion((yield Call(lambda: http.post(URL, json=body, headers=headers))))

            plan = envelope.plan(
                trace.attempts(attempt, "openai", "gpt-4o"),
                key="openai|key|gpt-4o",
                provider="openai",
                model="gpt-4o",
            )
            return await arun(trace.run(plan))

    return asyncio.run(go()), clock


@pytest.mark.parametrize("shell", ["sync", "async"])
def test_a_call_that_waited_on_a_429_is_one_span_with_an_attempt_span_each(
    otel: Recorded, shell: str
) -> None:
    done, clock = call(otel, answers(too_many("2"), httpx.Response(200, json=OK)), shell=shell)
    assert done.text == "All fine."
    assert clock.waits == [2.0]
    spans = otel.finished()
    assert sorted(spans) == ["attempt 1", "attempt 2", "chat gpt-4o"]
    whole, first, second = spans["chat gpt-4o"], spans["attempt 1"], spans["attempt 2"]

    # The shape: both attempts are children of the call, in one trace, in order.
    assert whole.parent is None
    assert whole.kind is SpanKind.CLIENT
    for attempt in (first, second):
        assert attempt.parent is not None
        assert attempt.parent.span_id == whole.context.span_id
        assert attempt.context.trace_id == whole.context.trace_id
        assert attempt.kind is SpanKind.INTERNAL
    assert first.end_time is not None
    assert second.start_time is not None
    assert first.end_time <= second.start_time

    assert dict(whole.attributes or {}) == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "gpt-4o",
        "gen_ai.request.max_tokens": 50,
        "gen_ai.output.type": "text",
        "server.address": "api.openai.com",
        "server.port": 443,
        "gen_ai.response.model": "gpt-4o-2024-08-06",
        "gen_ai.usage.input_tokens": 21,
        "gen_ai.usage.output_tokens": 9,
        "gen_ai.response.finish_reasons": ("stop",),
        "fluid.attempts": 2,
    }
    assert whole.status.status_code is StatusCode.UNSET
    [wait] = whole.events
    assert wait.name == "fluid.wait"
    assert dict(wait.attributes or {}) == {
        "fluid.wait.seconds": 2.0,
        "fluid.wait.reason": "retry_after",
        "fluid.attempt": 1,
    }

    assert dict(first.attributes or {}) == {
        "fluid.attempt": 1,
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "gpt-4o",
        "fluid.wait.seconds": 0.0,
        "error.type": "RateLimitError",
        "fluid.error.code": "llm.rate_limited",
        "http.response.status_code": 429,
        "fluid.error.retry_after": 2.0,
        "fluid.error.retryable": True,
    }
    assert first.status.status_code is StatusCode.ERROR
    assert first.status.description == "llm.rate_limited"
    assert dict(second.attributes or {}) == {
        "fluid.attempt": 2,
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "gpt-4o",
        "fluid.wait.seconds": 2.0,
        "fluid.wait.reason": "retry_after",
    }
    assert second.status.status_code is StatusCode.UNSET


def test_the_duration_and_token_metrics_follow_the_conventions(otel: Recorded) -> None:
    call(otel, answers(too_many("2"), httpx.Response(200, json=OK)))
    [duration] = otel.points("gen_ai.client.operation.duration")
    assert duration.count == 1
    assert duration.sum == 2.0  # the call's own clock: the Retry-After wait, nothing else
    assert dict(duration.attributes) == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "gpt-4o",
        "gen_ai.response.model": "gpt-4o-2024-08-06",
    }
    tokens = {
        p.attributes["gen_ai.token.type"]: p.sum for p in otel.points("gen_ai.client.token.usage")
    }
    assert tokens == {"input": 21, "output": 9}


def test_a_call_that_fails_says_which_error_and_why_on_the_span_and_the_metric(
    otel: Recorded,
) -> None:
    with pytest.raises(RateLimitError):
        call(otel, answers(too_many("1"), too_many("1")), attempts=2)
    spans = otel.finished()
    whole = spans["chat gpt-4o"]
    attributes = dict(whole.attributes or {})
    assert attributes["error.type"] == "RateLimitError"
    assert attributes["fluid.error.code"] == "llm.rate_limited"
    assert attributes["fluid.attempts"] == 2
    assert "gen_ai.response.model" not in attributes
    assert whole.status.status_code is StatusCode.ERROR
    assert (spans["attempt 2"].attributes or {})["error.type"] == "RateLimitError"
    [duration] = otel.points("gen_ai.client.operation.duration")
    assert duration.attributes["error.type"] == "RateLimitError"
    assert otel.points("gen_ai.client.token.usage") == []


def test_an_interrupted_attempt_is_named_by_its_exception(otel: Recorded) -> None:
    def interrupted(request: httpx.Request) -> httpx.Response:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        call(otel, interrupted)
    spans = otel.finished()
    for name in ("chat gpt-4o", "attempt 1"):
        attributes = spans[name].attributes or {}
        assert attributes["error.type"] == "KeyboardInterrupt"
        assert attributes["fluid.error.code"] == "llm.cancelled"


def everything_shown(otel: Recorded) -> str:
    """Every name, attribute, event and status of every span, and every metric point."""
    shown = []
    for span in otel.spans.get_finished_spans():
        shown += [span.name, json.dumps(dict(span.attributes or {}), default=str)]
        shown += [span.status.description or ""]
        for event in span.events:
            shown += [event.name, json.dumps(dict(event.attributes or {}), default=str)]
    data = otel.metrics.get_metrics_data()
    assert data is not None
    shown.append(data.to_json())
    return "\n".join(shown)


def test_no_key_and_no_prompt_in_any_span_or_metric_by_default(otel: Recorded) -> None:
    refused = httpx.Response(400, json={"error": {"message": f"bad request {KEY}: {PROMPT}"}})
    with pytest.raises(ProviderError):
        call(otel, answers(too_many("1"), refused), system="You are ACME-SECRET-PROJECT's bot")
    call(otel, answers(httpx.Response(200, json=OK)), system="You are ACME-SECRET-PROJECT's bot")
    shown = everything_shown(otel)
    assert len(otel.spans.get_finished_spans()) == 5
    for secret in (KEY, KEY[8:], "ACME-SECRET-PROJECT", "All fine."):
        assert secret not in shown


def test_content_is_recorded_only_when_asked_and_then_redacted() -> None:
    otel = recorded(capture_content=True)
    with_key = f"{PROMPT}; my key is {KEY}"
    handler = answers(httpx.Response(200, json=OK))
    clock = FakeClock()
    trace = otel.telemetry.call(
        "anthropic", "claude-x", with_key, {"system": "Be brief."}, secrets=(KEY,), clock=clock
    )
    envelope = RetryEnvelope(hook=trace.waited, clock=clock, sleep=clock.sleep)

    def attempt() -> Plan[Completion]:
        response = yield Call(lambda: handler(httpx.Request("POST", URL)))
        return Completion(
            text=response.json()["choices"][0]["message"]["content"],
            provider="anthropic",
            model="claude-x",
            finish_reason="stop",
        )

    run(trace.run(envelope.plan(trace.attempts(attempt, "anthropic", "claude-x"))))
    [whole] = [s for s in otel.spans.get_finished_spans() if s.name == "chat claude-x"]
    attributes = whole.attributes or {}
    assert attributes["gen_ai.provider.name"] == "anthropic"
    sent = json.loads(str(attributes["gen_ai.input.messages"]))
    assert sent[0]["role"] == "user"
    assert PROMPT in sent[0]["parts"][0]["content"]
    assert json.loads(str(attributes["gen_ai.system_instructions"])) == [
        {"type": "text", "content": "Be brief."}
    ]
    assert json.loads(str(attributes["gen_ai.output.messages"])) == [
        {
            "role": "assistant",
            "parts": [{"type": "text", "content": "All fine."}],
            "finish_reason": "stop",
        }
    ]
    assert KEY not in everything_shown(otel)
    assert "[REDACTED]" in str(attributes["gen_ai.input.messages"])


def test_message_lists_are_recorded_in_the_conventions_shape() -> None:
    otel = recorded(capture_content=True)
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]},
    ]
    trace = otel.telemetry.call("gemini", "gemini-2.5-flash", messages, {})
    done = Completion(text="ok", provider="gemini", model="gemini-2.5-flash")

    def plan() -> Plan[Completion]:
        return done
        yield  # a plan that asks for nothing

    assert run(trace.run(plan())) is done
    [whole] = otel.spans.get_finished_spans()
    assert (whole.attributes or {})["gen_ai.provider.name"] == "gcp.gemini"
    assert json.loads(str((whole.attributes or {})["gen_ai.input.messages"])) == [
        {"role": "user", "parts": [{"type": "text", "content": "hi"}]},
        {"role": "assistant", "parts": [{"type": "content", "content": None}]},
    ]


# The semantic conventions' gen_ai.provider.name well-known values for fluid's providers
# (https://opentelemetry.io/docs/specs/semconv/registry/attributes/gen-ai/); together,
# fireworks and cerebras have none and keep fluid's name.
WELL_KNOWN = {
    "openai": "openai",
    "openai_responses": "openai",
    "azure": "azure.ai.openai",
    "anthropic": "anthropic",
    "gemini": "gcp.gemini",
    "vertex": "gcp.vertex_ai",
    "bedrock": "aws.bedrock",
    "xai": "x_ai",
    "deepseek": "deepseek",
    "groq": "groq",
    "mistral": "mistral_ai",
    "together": "together",
    "fireworks": "fireworks",
    "cerebras": "cerebras",
    "ollama": "ollama",
}


@pytest.mark.parametrize(("provider", "expected"), sorted(WELL_KNOWN.items()))
def test_each_provider_has_the_conventions_name(provider: str, expected: str) -> None:
    from fluid_build.copilot.telemetry import provider_name

    assert provider_name(provider) == expected


def test_the_cloud_providers_spans_carry_their_conventions_name() -> None:
    otel = recorded()
    for provider, model in (("bedrock", "amazon.nova-micro-v1:0"), ("vertex", "gemini-2.5-flash")):
        trace = otel.telemetry.call(provider, model, [{"role": "user", "content": "hi"}], {})
        done = Completion(text="ok", provider=provider, model=model)

        def plan(done: Completion = done) -> Plan[Completion]:
            return done
            yield  # a plan that asks for nothing

        assert run(trace.run(plan())) is done
    names = [
        ((s.attributes or {})["gen_ai.provider.name"], (s.attributes or {})["fluid.provider"])
        for s in otel.spans.get_finished_spans()
    ]
    assert names == [("aws.bedrock", "bedrock"), ("gcp.vertex_ai", "vertex")]


def test_openai_responses_is_openai_and_told_apart_by_fluid_provider() -> None:
    otel = recorded()
    for provider in ("openai", "openai_responses"):
        trace = otel.telemetry.call(provider, "gpt-4o", [{"role": "user", "content": "hi"}], {})
        done = Completion(text="ok", provider=provider, model="gpt-4o")

        def plan(done: Completion = done) -> Plan[Completion]:
            return done
            yield  # a plan that asks for nothing

        assert run(trace.run(plan())) is done
    seen = [
        ((s.attributes or {})["gen_ai.provider.name"], (s.attributes or {}).get("fluid.provider"))
        for s in otel.spans.get_finished_spans()
    ]
    assert seen == [("openai", None), ("openai", "openai_responses")]


def test_the_call_span_carries_the_sampling_options_asked_for() -> None:
    otel = recorded()
    options: Any = {"temperature": 0.37, "top_p": 0.81, "stop": "END", "seed": 4242}
    trace = otel.telemetry.call("openai", "gpt-4o", "hi", options)
    done = Completion(text="ok", provider="openai", model="gpt-4o")

    def plan() -> Plan[Completion]:
        return done
        yield  # a plan that asks for nothing

    assert run(trace.run(plan())) is done
    [span] = otel.spans.get_finished_spans()
    attributes = dict(span.attributes or {})
    assert attributes["gen_ai.request.temperature"] == 0.37
    assert attributes["gen_ai.request.top_p"] == 0.81
    assert attributes["gen_ai.request.stop_sequences"] == ("END",)
    assert attributes["gen_ai.request.seed"] == 4242


def test_telemetry_is_off_unless_asked_for(caplog: pytest.LogCaptureFixture) -> None:
    assert telemetry_from(None, {}) is None
    assert telemetry_from(False, {"FLUID_OTEL": "1"}) is None
    assert telemetry_from(None, {"FLUID_OTEL": "no"}) is None
    assert caplog.records == []
    assert telemetry_from(None, {"FLUID_OTEL": "maybe\n"}) is None
    assert [r.getMessage() for r in caplog.records] == [
        "FLUID_OTEL='maybe' is not 1 or 0; telemetry stays off (e.g. FLUID_OTEL=1)"
    ]
    on = telemetry_from(None, {"FLUID_OTEL": "1"})
    assert isinstance(on, Telemetry)
    assert not on.capture_content
    content = telemetry_from(
        None, {"FLUID_OTEL": "true", "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "true"}
    )
    assert content is not None
    assert content.capture_content
    assert isinstance(telemetry_from(True), Telemetry)
    given = Telemetry()
    assert telemetry_from(given, {}) is given
    assert repr(given) == "Telemetry(capture_content=False)"


def fresh(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=120
    )


def test_importing_the_module_does_not_import_opentelemetry() -> None:
    done = fresh(
        "import sys\n"
        "import fluid_build.copilot.telemetry\n"
        "assert not [m for m in sys.modules if m.startswith('opentelemetry')], 'loaded'\n"
    )
    assert done.returncode == 0, done.stderr


def test_without_the_extra_the_env_warns_and_an_explicit_ask_names_the_extra() -> None:
    done = fresh(
        "import logging, sys\n"
        "sys.modules['opentelemetry'] = None  # as if the extra were not installed\n"
        "logging.basicConfig()\n"
        "from fluid_build.copilot.telemetry import Telemetry\n"
        "from fluid_build.errors import FluidError\n"
        "assert Telemetry.from_env({'FLUID_OTEL': '1'}) is None\n"
        "try:\n"
        "    Telemetry()\n"
        "except FluidError as error:\n"
        "    print(error)\n"
    )
    assert done.returncode == 0, done.stderr
    assert "pip install 'fluid-build[otel]'" in done.stdout
    assert "FLUID_OTEL is set but telemetry needs OpenTelemetry" in done.stderr


@pytest.fixture(autouse=True)
def _no_global_provider() -> Iterator[None]:
    """Tests pass their providers: the global ones stay the API's no-op defaults."""
    from opentelemetry import trace

    before = trace.get_tracer_provider()
    yield
    assert trace.get_tracer_provider() is before


def test_a_local_error_keeps_its_class_and_has_no_code(otel: Recorded) -> None:
    trace = otel.telemetry.call("openai", "gpt-4o", "x", {})

    def attempt() -> Plan[Completion]:
        raise FluidError("the cassette has no such exchange")
        yield

    with pytest.raises(FluidError):
        run(trace.run(RetryEnvelope().plan(trace.attempts(attempt, "openai", "gpt-4o"))))
    for span in otel.spans.get_finished_spans():
        assert (span.attributes or {})["error.type"] == "FluidError"
        assert "fluid.error.code" not in (span.attributes or {})


def test_a_stream_stopped_early_ends_its_span_and_still_runs_the_plan_s_cleanup(
    otel: Recorded,
) -> None:
    trace = otel.telemetry.call("openai", "gpt-4o", PROMPT, {}, secrets=(KEY,))
    closed: list[str] = []

    def plan() -> Plan[None]:
        try:
            yield Emit(StreamEvent(type="text", text="All "))
            yield Emit(StreamEvent(type="text", text="fine."))
        finally:  # as Entry.stream closes its response: an effect, during GeneratorExit
            yield Call(lambda: closed.append("response"))

    events = stream(trace.stream(plan()))
    assert next(events).text == "All "
    events.close()
    assert closed == ["response"]
    [whole] = otel.spans.get_finished_spans()
    assert (whole.attributes or {})["fluid.stream.stopped_early"] is True
    assert whole.status.status_code is StatusCode.UNSET


def test_the_stream_span_re_raises_the_generator_exit_thrown_into_it(otel: Recorded) -> None:
    trace = otel.telemetry.call("openai", "gpt-4o", PROMPT, {})

    def plan() -> Plan[None]:
        yield Emit(StreamEvent(type="text", text="All "))

    traced = trace.stream(plan())
    assert isinstance(next(traced), Emit)
    with pytest.raises(GeneratorExit):
        traced.throw(GeneratorExit())
    [whole] = otel.spans.get_finished_spans()
    assert (whole.attributes or {})["fluid.stream.stopped_early"] is True


def test_a_stream_closed_after_its_done_event_is_answered_not_stopped(otel: Recorded) -> None:
    trace = otel.telemetry.call("openai", "gpt-4o", PROMPT, {})
    done = Completion(
        text="All fine.",
        provider="openai",
        model="gpt-4o-2024-08-06",
        finish_reason="stop",
        usage=Usage(input_tokens=21, output_tokens=9),
    )

    def plan() -> Plan[None]:
        yield Emit(StreamEvent(type="done", completion=done))

    events = stream(trace.stream(plan()))
    assert next(events).completion is done
    events.close()
    [whole] = otel.spans.get_finished_spans()
    attributes = whole.attributes or {}
    assert "fluid.stream.stopped_early" not in attributes
    assert attributes["gen_ai.usage.output_tokens"] == 9
    assert attributes["gen_ai.response.finish_reasons"] == ("stop",)


def test_the_call_span_carries_the_answer_s_cost_in_usd(otel: Recorded) -> None:
    from fluid_build.copilot import LLMClient

    clock = FakeClock()
    envelope = RetryEnvelope(
        cooldown=MemoryCooldownStore(), clock=clock, sleep=clock.sleep, random=lambda: 0.0
    )
    body = {**OK, "usage": {"prompt_tokens": 1_000_000, "completion_tokens": 1_000_000}}
    http = httpx.Client(transport=httpx.MockTransport(answers(httpx.Response(200, json=body))))
    priced = {"gpt-4o": {"input": 2.0, "output": 8.0}}
    with LLMClient(
        "openai",
        "gpt-4o",
        api_key=KEY,
        envelope=envelope,
        env={},
        http_client=http,
        telemetry=otel.telemetry,
        prices=priced,
    ) as client:
        done = client.complete("hi")
    http.close()
    assert done.cost_usd == pytest.approx(10.0)
    attributes = otel.finished()["chat gpt-4o"].attributes or {}
    assert attributes["fluid.cost_usd"] == pytest.approx(10.0)
