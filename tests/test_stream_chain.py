"""Streams walk the fallback chain as complete() does; on_cut="restart" (issue 33 items 1, 4, 5).

Every test runs against tests/chaos_server.py on loopback, one model per
entry of the chain, each pinned to a fault (``models=``): a primary that
fails one way, a healthy fallback. Sleeps and the breaker's time are a
virtual clock: no test waits for real.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from fluid_build.copilot import LLMClient
from fluid_build.copilot.agents.errors import (
    AgentExecutionError,
    ContextOverflowError,
    ProviderAuthError,
    ProviderError,
    ProviderServerError,
    RateLimitError,
)
from fluid_build.copilot.call.envelope import RetryEnvelope, RetryPolicy
from fluid_build.copilot.call.transport import TRANSPORT_ENV
from fluid_build.copilot.health.breaker import CircuitBreaker
from fluid_build.copilot.health.cooldown import MemoryCooldownStore, SqliteCooldownStore
from fluid_build.copilot.llm.types import Completion, StreamEvent, Usage
from tests.chaos_server import ChaosServer, chaos_server, stream_text
from tests.fakes import FakeClock

TRANSPORTS = ("sync-direct", "async-httpx", "async-aiohttp", "caller-sync", "caller-async")
PRIMARY = "openai:primary"
HEALTHY = "openai:healthy"
COOL_OFF = 30.0


def clocked(
    clock: FakeClock, *, attempts: int = 2, threshold: int = 5, store: Any = None
) -> RetryEnvelope:
    store = MemoryCooldownStore() if store is None else store
    return RetryEnvelope(
        RetryPolicy(attempts=attempts),
        cooldown=store,
        breaker=CircuitBreaker(store, threshold=threshold, cool_off=COOL_OFF, clock=clock),
        clock=clock,
        sleep=clock.sleep,
        asleep=clock.asleep,
        random=lambda: 0.0,
        hook=lambda event: None,
    )


class Rig:
    """A client on one transport against ``server``: the primary and its fallbacks."""

    def __init__(
        self,
        server: ChaosServer,
        transport: str,
        *fallbacks: str,
        clock: FakeClock | None = None,
        envelope: RetryEnvelope | None = None,
        env: dict[str, str] | None = None,
        **kwargs: Any,
    ) -> None:
        self.clock = clock or FakeClock()
        self.is_async = transport.startswith(("async-", "caller-async"))
        self.runner = asyncio.Runner() if self.is_async else None
        source = {"OPENAI_API_KEY": "sk-chain-test", "OPENAI_BASE_URL": server.base_url}
        source.update(env or {})
        self.own: httpx.Client | httpx.AsyncClient | None = None
        if transport == "async-httpx":
            source[TRANSPORT_ENV] = "httpx"
        elif transport == "async-aiohttp":
            source[TRANSPORT_ENV] = "aiohttp"
        elif transport == "caller-sync":
            self.own = kwargs["http_client"] = httpx.Client()
        elif transport == "caller-async":
            self.own = kwargs["async_http_client"] = httpx.AsyncClient()
        self.client = LLMClient(
            "openai",
            "primary",
            envelope=envelope or clocked(self.clock),
            env=source,
            fallbacks=[("openai", name) for name in fallbacks],
            **kwargs,
        )

    def stream(self, prompt: str = "hi", **options: Any) -> list[StreamEvent]:
        """Every event of one stream; on a failure, the error with the events so far in
        ``.events``."""
        events: list[StreamEvent] = []
        try:
            if self.runner is None:
                events.extend(self.client.stream(prompt, **options))
            else:

                async def read() -> None:
                    async for event in self.client.astream(prompt, **options):
                        events.append(event)

                self.runner.run(read())
        except AgentExecutionError as error:
            error.events = events  # type: ignore[attr-defined]
            raise
        return events

    def complete(self, prompt: str = "hi") -> Completion:
        if self.runner is None:
            return self.client.complete(prompt)
        return self.runner.run(self.client.acomplete(prompt))

    def close(self) -> None:
        if self.runner is None:
            self.client.close()
            if isinstance(self.own, httpx.Client):
                self.own.close()
            return
        self.runner.run(self.client.aclose())
        if isinstance(self.own, httpx.AsyncClient):
            self.runner.run(self.own.aclose())
        self.runner.close()


@contextlib.contextmanager
def rig(
    models: dict[str, Any], transport: str, *fallbacks: str, stall: float = 1.5, **kwargs: Any
) -> Iterator[tuple[Rig, ChaosServer]]:
    with chaos_server(weights={"ok": 1}, models=models, stall=stall) as server:
        made = Rig(server, transport, *fallbacks, **kwargs)
        try:
            yield made, server
        finally:
            made.close()


def requests(server: ChaosServer) -> dict[str | None, int]:
    counts: dict[str | None, int] = {}
    for request in server.snapshot():
        counts[request.model] = counts.get(request.model, 0) + 1
    return counts


def text(events: list[StreamEvent]) -> str:
    return "".join(event.text for event in events if event.type == "text")


def done(events: list[StreamEvent]) -> Completion:
    assert events[-1].type == "done"
    completion = events[-1].completion
    assert completion is not None
    return completion


# -- item 1: every failure before the first delta moves on ---------------------------------

BEFORE_THE_FIRST_DELTA = {
    # fault: (the primary's error class, its code, the requests it received)
    "429_retry_after": (RateLimitError, "llm.rate_limited", 2),
    "503": (ProviderServerError, "llm.server_error", 2),
    "reset_before_response": (ProviderError, "llm.network_error", 2),
    "429_quota": (RateLimitError, "llm.quota_exhausted", 1),
    "context_overflow": (ContextOverflowError, "llm.context_overflow", 1),
}


#: The rows of docs/fallbacks-and-breakers.md's stream table for the faults above.
DOCUMENTED = {
    "429_retry_after": "429 with Retry-After, every time",
    "429_quota": "429 quota exhausted",
    "503": "503, every time",
    "reset_before_response": "connection reset before the answer",
    "context_overflow": "context overflow (the server's 400)",
}


def test_the_docs_table_says_what_these_tests_assert() -> None:
    # The one table of docs/fallbacks-and-breakers.md ("What the caller gets, fault by
    # fault"), which tests/test_failover_matrix.py asserts for every kind of call.
    from tests.test_failover_matrix import documented

    rows = documented()
    for fault, (_, code, sent) in BEFORE_THE_FIRST_DELTA.items():
        chained, requests_, _, alone, *_ = rows[(DOCUMENTED[fault], "stream, astream")]
        assert (chained, requests_, alone) == (
            "the fallback's whole answer",
            f"{sent}, 1",
            f"`{code}`",
        )


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("fault", sorted(BEFORE_THE_FIRST_DELTA))
def test_a_stream_moves_on_before_its_first_delta(fault: str, transport: str) -> None:
    cls, code, sent = BEFORE_THE_FIRST_DELTA[fault]
    with rig({"primary": fault, "healthy": "ok"}, transport, "healthy") as (made, server):
        events = made.stream()
    assert [e.type for e in events].count("done") == 1
    assert text(events) == stream_text("healthy")
    answer = done(events)
    assert answer.text == stream_text("healthy")
    assert answer.answered_by == HEALTHY
    assert answer.model == "healthy"
    assert answer.usage == Usage(input_tokens=12, output_tokens=8)
    # One record per attempt, as complete() lists them: an error answer cost nothing; a
    # reset after the request went out may have been billed (unknown without a budget).
    cost = None if fault == "reset_before_response" else 0.0
    assert answer.fallback_errors == [
        {
            "entry": PRIMARY,
            "attempt": attempt,
            "error": cls.__name__,
            "code": code,
            "sent": True,
            "cost_usd": cost,
        }
        for attempt in range(1, sent + 1)
    ]
    assert requests(server) == {"primary": sent, "healthy": 1}


@pytest.mark.parametrize("transport", ["sync-direct", "async-aiohttp"])
def test_an_open_breaker_sends_the_stream_on_at_once(transport: str) -> None:
    clock = FakeClock()
    envelope = clocked(clock, threshold=2)
    with rig({"primary": "503", "healthy": "ok"}, transport, "healthy", envelope=envelope) as (
        made,
        server,
    ):
        made.stream()  # two 503s: the primary's breaker opens
        assert requests(server) == {"primary": 2, "healthy": 1}
        events = made.stream()
        assert requests(server) == {"primary": 2, "healthy": 2}  # no request to the primary
    assert done(events).answered_by == HEALTHY
    assert [e["code"] for e in done(events).fallback_errors] == ["llm.circuit_open"]


@pytest.mark.parametrize("transport", ["sync-direct", "caller-async"])
def test_the_preflight_skips_every_entry_too_small_without_a_request(transport: str) -> None:
    matrix = (
        '{"openai:primary": {"context_window": 2000}, "openai:small": {"context_window": 2000},'
        ' "openai:healthy": {"context_window": 200000}}'
    )
    models = {"primary": "ok", "small": "ok", "healthy": "ok"}
    with rig(models, transport, "small", "healthy", env={"FLUID_CAPABILITY_MATRIX": matrix}) as (
        made,
        server,
    ):
        events = made.stream("word " * 4000)
    assert done(events).answered_by == HEALTHY
    assert [e["code"] for e in done(events).fallback_errors] == ["llm.context_overflow"] * 2
    assert requests(server) == {"healthy": 1}


@pytest.mark.parametrize("transport", ["sync-direct", "async-httpx"])
def test_auth_moves_on_only_when_opted_in(transport: str) -> None:
    models = {"primary": "401", "healthy": "ok"}
    with rig(models, transport, "healthy") as (made, server):
        with pytest.raises(ProviderAuthError):
            made.stream()
        assert requests(server) == {"primary": 1}
    with rig(models, transport, "healthy", fallback_on_auth=True) as (made, server):
        events = made.stream()
    assert done(events).answered_by == HEALTHY
    assert requests(server) == {"primary": 1, "healthy": 1}


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_after_the_first_delta_a_cut_raises_by_default(transport: str) -> None:
    with (
        rig({"primary": "cut_mid_stream", "healthy": "ok"}, transport, "healthy") as (
            made,
            server,
        ),
        pytest.raises(ProviderError) as caught,
    ):
        made.stream()
    error = caught.value
    assert error.code == "llm.network_error"
    assert error.details["interrupted"] is True
    received = text(error.events)  # type: ignore[attr-defined]
    assert received
    assert stream_text("primary").startswith(received)
    assert error.details["partial_text"] == received
    assert all(e.type == "text" for e in error.events)  # type: ignore[attr-defined]
    assert requests(server) == {"primary": 1}  # the fallback is not asked


def test_when_every_entry_fails_the_most_actionable_error_wins() -> None:
    with (
        rig({"primary": "503", "healthy": "429_retry_after"}, "sync-direct", "healthy") as (
            made,
            server,
        ),
        pytest.raises(RateLimitError) as caught,
    ):
        made.stream()
    attempts = caught.value.details["fallback_attempts"]
    assert [(a["entry"], a["code"]) for a in attempts] == [
        (PRIMARY, "llm.server_error"),
        (HEALTHY, "llm.rate_limited"),
    ]
    assert requests(server) == {"primary": 2, "healthy": 2}


# -- item 4: on_cut="restart" --------------------------------------------------------------


def _restarted(events: list[StreamEvent], again_on: str, answer_model: str) -> Completion:
    kinds = [e.type for e in events]
    assert kinds.count("restart") == 1
    cut_at = kinds.index("restart")
    before, restart, after = events[:cut_at], events[cut_at], events[cut_at + 1 :]
    assert before
    assert all(e.type == "text" for e in before)
    assert stream_text("primary").startswith(text(before))
    assert text(before) != stream_text("primary")
    assert (restart.code, restart.entry) == ("llm.network_error", again_on)
    assert "cut" in restart.reason
    assert text(after) == stream_text(answer_model)  # the whole answer, from scratch
    return done(after)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_cut_stream_restarts_on_the_next_entry(transport: str) -> None:
    # The fallback rejects an assistant prefill, as many providers do: the restart sends
    # the caller's messages as they were.
    models = {"primary": "cut_mid_stream", "healthy": "no_prefill"}
    with rig(models, transport, "healthy", on_cut="restart") as (made, server):
        events = made.stream()
    answer = _restarted(events, HEALTHY, "healthy")
    assert answer.answered_by == HEALTHY
    assert answer.text == stream_text("healthy")
    assert answer.fallback_errors == [
        {
            "entry": PRIMARY,
            "attempt": 1,
            "error": "ProviderError",
            "code": "llm.network_error",
            "sent": True,
            "cost_usd": None,
        }
    ]
    assert requests(server) == {"primary": 1, "healthy": 1}
    assert [(r.stream, r.last_role) for r in server.snapshot()] == [(True, "user")] * 2


@pytest.mark.parametrize("transport", ["sync-direct", "async-httpx"])
def test_a_malformed_event_after_text_raises_or_restarts(transport: str) -> None:
    models = {"primary": "malformed_mid_stream", "healthy": "ok"}
    with (
        rig(models, transport, "healthy") as (made, server),
        pytest.raises(ProviderError) as caught,
    ):
        made.stream()
    assert caught.value.code == "llm.malformed_response"
    assert stream_text("primary").startswith(caught.value.details["partial_text"])
    assert requests(server) == {"primary": 1}
    with rig(models, transport, "healthy", on_cut="restart") as (made, server):
        events = made.stream()
    kinds = [e.type for e in events]
    restart = events[kinds.index("restart")]
    assert (restart.code, restart.entry) == ("llm.malformed_response", HEALTHY)
    assert text(events[kinds.index("restart") + 1 :]) == stream_text("healthy")
    assert requests(server) == {"primary": 1, "healthy": 1}


def test_the_fault_server_rejects_a_prefill_for_a_no_prefill_model() -> None:
    prefilled = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hel"}]
    with rig({"primary": "no_prefill"}, "sync-direct") as (made, server):
        with pytest.raises(ProviderError) as caught:
            made.client.complete(prefilled)
        assert made.client.complete("hi").text
    assert caught.value.code == "llm.invalid_request"
    assert [r.last_role for r in server.snapshot()] == ["assistant", "user"]


@pytest.mark.parametrize("transport", ["sync-direct", "async-aiohttp", "caller-async"])
def test_a_stream_that_stalls_after_text_restarts_on_the_next_entry(transport: str) -> None:
    # The stall is caught by the attempt's read timeout (a real 0.3 s on loopback).
    models = {"primary": "stall_mid_stream", "healthy": "ok"}
    with rig(models, transport, "healthy", stall=2.0, timeout=0.3, on_cut="restart") as (
        made,
        server,
    ):
        events = made.stream()
    kinds = [e.type for e in events]
    restart = events[kinds.index("restart")]
    assert (restart.code, restart.entry) == ("llm.timeout", HEALTHY)
    assert text(events[kinds.index("restart") + 1 :]) == stream_text("healthy")
    assert done(events).answered_by == HEALTHY
    assert requests(server) == {"primary": 1, "healthy": 1}


@pytest.mark.parametrize("transport", ["sync-direct", "async-aiohttp"])
def test_on_cut_is_a_stream_option_too(transport: str) -> None:
    with rig({"primary": "cut_mid_stream", "healthy": "ok"}, transport, "healthy") as (made, _):
        events = made.stream(on_cut="restart")
    assert _restarted(events, HEALTHY, "healthy").answered_by == HEALTHY
    # The call's choice wins over the client's.
    models = {"primary": "cut_mid_stream", "healthy": "ok"}
    with (
        rig(models, transport, "healthy", on_cut="restart") as (made, server),
        pytest.raises(ProviderError) as caught,
    ):
        made.stream(on_cut="raise")
    assert caught.value.code == "llm.network_error"
    assert requests(server) == {"primary": 1}


@pytest.mark.parametrize("transport", ["sync-direct", "async-httpx"])
def test_a_lone_entry_restarts_on_itself(transport: str) -> None:
    with rig({"primary": ["cut_mid_stream", "ok"]}, transport, on_cut="restart") as (
        made,
        server,
    ):
        events = made.stream()
    answer = _restarted(events, PRIMARY, "primary")
    assert answer.answered_by == PRIMARY
    assert [e["code"] for e in answer.fallback_errors] == ["llm.network_error"]
    assert requests(server) == {"primary": 2}


@pytest.mark.parametrize("transport", ["sync-direct", "caller-async"])
def test_a_failed_restart_raises_the_cuts_error(transport: str) -> None:
    models = {"primary": "cut_mid_stream", "healthy": "503"}
    with (
        rig(models, transport, "healthy", on_cut="restart") as (made, server),
        pytest.raises(ProviderError) as caught,
    ):
        made.stream()
    error = caught.value
    assert type(error) is ProviderError
    assert error.code == "llm.network_error"  # the cut's, not the 503's
    assert str(error).startswith("the stream from openai (primary) was cut")
    assert "and openai:healthy failed too [llm.server_error]" in str(error)
    assert stream_text("primary").startswith(error.details["partial_text"])
    assert [(a["entry"], a["code"]) for a in error.details["fallback_attempts"]] == [
        (PRIMARY, "llm.network_error"),
        (HEALTHY, "llm.server_error"),
    ]
    assert [e.type for e in error.events].count("restart") == 1  # type: ignore[attr-defined]
    assert requests(server) == {"primary": 1, "healthy": 2}


def test_at_most_one_restart_per_call() -> None:
    models = {"primary": "cut_mid_stream", "healthy": "cut_mid_stream", "third": "ok"}
    with (
        rig(models, "sync-direct", "healthy", "third", on_cut="restart") as (made, server),
        pytest.raises(ProviderError) as caught,
    ):
        made.stream()
    error = caught.value
    assert error.code == "llm.network_error"
    assert stream_text("primary").startswith(error.details["partial_text"])
    assert [a["entry"] for a in error.details["fallback_attempts"]] == [PRIMARY, HEALTHY]
    assert [e.type for e in error.events].count("restart") == 1  # type: ignore[attr-defined]
    assert requests(server) == {"primary": 1, "healthy": 1}  # the third is never asked


def test_on_cut_takes_raise_or_restart() -> None:
    with chaos_server(weights={"ok": 1}) as server:
        env = {"OPENAI_API_KEY": "sk-chain-test", "OPENAI_BASE_URL": server.base_url}
        with pytest.raises(ProviderError) as caught:
            LLMClient("openai", "primary", env=env, on_cut="retry")  # type: ignore[arg-type]
        assert caught.value.code == "llm.not_configured"
        assert caught.value.details["choices"] == ["raise", "restart"]
        with (
            LLMClient("openai", "primary", env=env) as client,
            pytest.raises(ProviderError) as caught,
        ):
            client.stream("hi", on_cut="again")  # type: ignore[arg-type]
        assert caught.value.code == "llm.not_configured"
        assert server.snapshot() == []


# -- item 5: while a primary is down, the chain serves every call ----------------------------

CALLS = 20
STEP = 10.0  # virtual seconds between two calls
HEALTHY_AT = 10  # the call from which the primary answers again


def _down_then_healthy(kind: str, transport: str, store: Any = None) -> None:
    clock = FakeClock()
    envelope = clocked(clock, threshold=3, store=store)
    models: dict[str, Any] = {"primary": "503", "healthy": "ok"}
    with rig(models, transport, "healthy", clock=clock, envelope=envelope) as (made, server):
        answered: list[str | None] = []
        primary: list[tuple[int, float]] = []  # (call, virtual time) of each request to it
        for call in range(CALLS):
            if call == HEALTHY_AT:
                server.models["primary"] = "ok"
            seen = len(server.snapshot())
            answer = done(made.stream()) if kind == "stream" else made.complete()
            answered.append(answer.answered_by)
            primary += [(call, clock.now) for r in server.snapshot()[seen:] if r.model == "primary"]
            clock.sleep(STEP)
    assert len(answered) == CALLS  # every call answered
    # Down: answered by the fallback; back to the primary once healthy, and for good.
    back = answered.index(PRIMARY)
    assert HEALTHY_AT <= back <= HEALTHY_AT + COOL_OFF / STEP
    assert answered == [HEALTHY] * back + [PRIMARY] * (CALLS - back)
    assert requests(server)["healthy"] == back
    # The breaker opened on its third failure (2 attempts, then 1); after that, one trial
    # per cool-off: the call that found it half-open sent one request, the others none.
    assert [call for call, _ in primary[:3]] == [0, 0, 1]
    opened = primary[2][1]
    trials = [at for call, at in primary[3:] if call <= back]
    assert len(trials) == len({call for call, _ in primary[3:] if call <= back})
    gaps = [b - a for a, b in zip([opened, *trials], trials, strict=False)]
    assert trials
    assert all(gap >= COOL_OFF for gap in gaps), primary
    assert len(primary) == 3 + len(trials) + (CALLS - back - 1)


@pytest.mark.parametrize(
    ("kind", "transport"),
    [
        ("stream", "sync-direct"),
        ("stream", "async-aiohttp"),
        ("stream", "caller-sync"),
        ("complete", "sync-direct"),
        ("complete", "async-httpx"),
    ],
)
def test_while_the_primary_is_down_every_call_is_served(kind: str, transport: str) -> None:
    _down_then_healthy(kind, transport)


@pytest.mark.parametrize("kind", ["stream", "complete"])
def test_while_the_primary_is_down_every_call_is_served_on_the_sqlite_store(
    kind: str, tmp_path: Path
) -> None:
    # The default store (a file): the breaker's state and its trial lease live there.
    _down_then_healthy(kind, "sync-direct", SqliteCooldownStore(tmp_path / "health.sqlite3"))


@pytest.mark.parametrize("kind", ["stream", "complete"])
def test_while_the_primary_is_down_every_call_is_served_on_redis(kind: str, redis_url: str) -> None:
    from fluid_build.copilot.health.cooldown import RedisCooldownStore

    store = RedisCooldownStore(redis_url, prefix=f"test:stream-chain:{kind}:")
    _down_then_healthy(kind, "async-aiohttp", store)


# -- the chain keeps a stream's other promises -------------------------------------------------


@pytest.mark.parametrize("transport", ["sync-direct", "async-aiohttp", "caller-async"])
def test_a_caller_that_stops_after_the_fallbacks_first_delta_closes_its_response(
    transport: str,
) -> None:
    with rig({"primary": "503", "healthy": "ok"}, transport, "healthy") as (made, server):
        if made.runner is None:
            events = made.client.stream("hi")
            first = next(events)
            events.close()  # the chain throws GeneratorExit into the entry's plan: it closes
        else:
            stream = made.client.astream("hi")

            async def one() -> StreamEvent:
                try:
                    return await anext(stream)
                finally:
                    await stream.aclose()  # type: ignore[attr-defined]

            first = made.runner.run(one())
        assert first.type == "text"
        assert stream_text("healthy").startswith(first.text)
        # The connection went back closed, not mid-answer: the next call is served on the pool.
        assert text(made.stream()) == stream_text("healthy")
    assert requests(server) == {"primary": 4, "healthy": 2}


def test_a_restart_ends_the_cut_attempts_span_failed() -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from fluid_build.copilot.telemetry import Telemetry

    exported = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    telemetry = Telemetry(tracer_provider=provider)
    models = {"primary": "cut_mid_stream", "healthy": "ok"}
    with rig(models, "sync-direct", "healthy", on_cut="restart", telemetry=telemetry) as (made, _):
        events = made.stream()
    assert done(events).answered_by == HEALTHY
    spans = exported.get_finished_spans()
    attempts = [s for s in spans if s.name == "fluid.attempt"]
    assert len(spans) == len(attempts) + 1  # every attempt span ended, and the call's
    codes = [(s.attributes or {}).get("fluid.error.code") for s in attempts]
    assert codes == ["llm.network_error", None]
    models_asked = [(s.attributes or {})["gen_ai.request.model"] for s in attempts]
    assert models_asked == ["primary", "healthy"]
    [call] = [s for s in spans if s.name != "fluid.attempt"]
    assert (call.attributes or {})["fluid.answered_by"] == HEALTHY
    [restart] = [e for e in call.events if e.name == "fluid.stream.restart"]
    assert dict(restart.attributes or {}) == {
        "fluid.error.code": "llm.network_error",
        "fluid.restart.entry": HEALTHY,
    }


# -- several processes share the primary's breaker --------------------------------------------

_STREAMER = """
import asyncio, json, sys
from fluid_build.copilot import LLMClient

async def main() -> None:
    async with LLMClient.from_env(provider="openai", model="primary",
                                  fallbacks=[("openai", "healthy")]) as client:
        events = [event async for event in client.astream("hi")]
    answer = events[-1].completion
    print(json.dumps({"answered_by": answer.answered_by,
                      "codes": [e["code"] for e in answer.fallback_errors]}))

asyncio.run(main())
"""


def _streamer(env: dict[str, str]) -> dict[str, Any]:
    import json
    import subprocess
    import sys

    ran = subprocess.run(
        [sys.executable, "-c", _STREAMER],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr
    result: dict[str, Any] = json.loads(ran.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.parametrize("store", ["sqlite", "redis"])
def test_a_breaker_opened_in_one_process_sends_another_processes_streams_on(
    store: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    import os

    url = (
        f"sqlite:///{tmp_path / 'health.sqlite3'}"
        if store == "sqlite"
        else request.getfixturevalue("redis_url")
    )
    with chaos_server(weights={"ok": 1}, models={"primary": "503", "healthy": "ok"}) as server:
        env = {
            "PATH": os.environ.get("PATH", ""),
            "HOME": str(tmp_path),
            "XDG_CACHE_HOME": str(tmp_path / "cache"),
            "OPENAI_API_KEY": f"sk-chain-{store}-{tmp_path.name}",  # its own breaker key
            "OPENAI_BASE_URL": server.base_url,
            "FLUID_COOLDOWN_URL": url,
            "FLUID_LLM_MAX_ATTEMPTS": "1",
            "FLUID_BREAKER_THRESHOLD": "1",  # one failure opens it: no wait in any process
        }
        # The first process meets the 503: its breaker opens in the shared store.
        assert _streamer(env) == {"answered_by": HEALTHY, "codes": ["llm.server_error"]}
        assert requests(server) == {"primary": 1, "healthy": 1}
        # Another process's stream goes to the fallback at once: no request to the primary.
        assert _streamer(env) == {"answered_by": HEALTHY, "codes": ["llm.circuit_open"]}
        # And this one's, through the store it names.
        with LLMClient.from_env(
            env, provider="openai", model="primary", fallbacks=[("openai", "healthy")]
        ) as client:
            answer = done(list(client.stream("hi")))
        # The store from FLUID_COOLDOWN_URL is the envelope's, which outlives the client.
        assert client.envelope.cooldown is not None
        client.envelope.cooldown.close()
        assert answer.answered_by == HEALTHY
        assert [e["code"] for e in answer.fallback_errors] == ["llm.circuit_open"]
        assert requests(server) == {"primary": 1, "healthy": 3}
