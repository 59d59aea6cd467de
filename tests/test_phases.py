"""Phase limits and moving on (issue 33 items 2 and 3).

The decisions are pure functions, tested with tables; the chain is tested on a
real loopback server (tests/hostile.py) with a primary model that fails one way
and a healthy fallback model on the same server, and an injected sleep that
records every wait (nothing here sleeps; loopback silence is the only waiting).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from fluid_build.copilot import LLMClient
from fluid_build.copilot.agents.errors import (
    AgentExecutionError,
    ProviderServerError,
    ProviderTimeoutError,
    RateLimitError,
)
from fluid_build.copilot.call.envelope import MoveOn, RetryEnvelope, RetryPolicy, decide
from fluid_build.copilot.call.phases import (
    DEFAULT_CONNECT,
    DEFAULT_FIRST_TOKEN,
    DEFAULT_MOVE_ON_RETRY_AFTER,
    PhaseLimits,
    move_on_retry_after_choice,
)
from tests import hostile

POLICY = RetryPolicy(attempts=3, backoff_base=0.05, backoff_cap=0.2, jitter=0.0, deadline=1000.0)


def _phase_error(phase: str, received: int) -> ProviderTimeoutError:
    return ProviderTimeoutError(
        "x", code="llm.timeout", details={"phase": phase, "bytes_received": received}
    )


ON = MoveOn(silence=True, retry_after=10.0)

# (error, move_on, attempt, wanted wait (None: give up), the reason starts with)
DECISIONS: list[tuple[AgentExecutionError, MoveOn | None, int, float | None, str]] = [
    (_phase_error("first_token", 0), ON, 1, None, "moved on: the route said nothing"),
    (_phase_error("connect", 0), ON, 1, None, "moved on: the route said nothing"),
    (_phase_error("idle", 0), ON, 1, None, "moved on: the route said nothing"),
    (_phase_error("idle", 12), ON, 1, 0.05, "backoff"),  # it said something: retried
    (_phase_error("first_token", 0), None, 1, 0.05, "backoff"),  # no later entry
    (_phase_error("first_token", 0), MoveOn(silence=False), 1, 0.05, "backoff"),
    (ProviderTimeoutError("read timeout"), ON, 1, 0.05, "backoff"),  # not a phase's
    (RateLimitError("slow down", retry_after=120.0), ON, 1, None, "moved on: the server"),
    (RateLimitError("slow down", retry_after=120.0), None, 1, 120.0, "retry_after"),
    (RateLimitError("slow down", retry_after=10.0), ON, 1, 10.0, "retry_after"),  # not longer
    (RateLimitError("slow down", retry_after=3.0), MoveOn(retry_after=0.0), 1, None, "moved on"),
    (
        RateLimitError("slow down", retry_after=300.0, details={"retry_after_requested": 900.0}),
        MoveOn(retry_after=400.0),
        1,
        None,
        "moved on: the server asked to wait 900 s",
    ),
    (ProviderServerError("503"), ON, 1, 0.05, "backoff"),
    (ProviderServerError("503"), ON, 3, None, "gave up after 3"),
    (RateLimitError("quota", retryable=False, code="llm.quota_exhausted"), ON, 1, None, "not"),
]


@pytest.mark.parametrize(("error", "move_on", "attempt", "wait", "reason"), DECISIONS)
def test_decide_moves_on_only_with_a_later_entry(
    error: AgentExecutionError,
    move_on: MoveOn | None,
    attempt: int,
    wait: float | None,
    reason: str,
) -> None:
    decision = decide(error, attempt, 0.0, POLICY, 0.0, move_on=move_on)
    assert decision.wait == wait
    assert decision.reason.startswith(reason), decision.reason


# -- settings ------------------------------------------------------------------------------

LIMIT_VARIABLES = {
    "connect_timeout": "FLUID_LLM_CONNECT_TIMEOUT_SECONDS",
    "first_token_timeout": "FLUID_LLM_FIRST_TOKEN_TIMEOUT_SECONDS",
    "idle_timeout": "FLUID_LLM_IDLE_TIMEOUT_SECONDS",
    "move_on_retry_after": "FLUID_LLM_MOVE_ON_RETRY_AFTER_SECONDS",
}


def _client(env: dict[str, str], **kwargs: Any) -> LLMClient:
    return LLMClient(
        "openai",
        "gpt-4o-mini",
        api_key="sk-test",
        env=env,
        envelope=RetryEnvelope(POLICY, cooldown=None),
        **kwargs,
    )


def test_the_defaults_follow_the_attempt_timeout() -> None:
    assert _client({}).phases == PhaseLimits(DEFAULT_CONNECT, DEFAULT_FIRST_TOKEN, 120.0)
    # A timeout set by hand bounds the wait for the first token too, as it always did.
    assert _client({}, timeout=5.0).phases == PhaseLimits(5.0, 5.0, 5.0)
    assert _client({"FLUID_LLM_TIMEOUT_SECONDS": "60"}).phases == PhaseLimits(10.0, 60.0, 60.0)
    assert _client({}, timeout=900.0).phases == PhaseLimits(DEFAULT_CONNECT, 900.0, 900.0)
    assert PhaseLimits.choose({}, 900.0).first_token == 900.0
    assert PhaseLimits.choose({}, 5.0).first_token == DEFAULT_FIRST_TOKEN
    assert _client({}).move_on_retry_after == DEFAULT_MOVE_ON_RETRY_AFTER
    assert _client({}).move_on_silence is True


def test_arguments_win_over_the_environment() -> None:
    env = dict.fromkeys(LIMIT_VARIABLES.values(), "7")
    assert _client(env).phases == PhaseLimits(7.0, 7.0, 7.0)
    assert _client(env).move_on_retry_after == 7.0
    client = _client(
        env, connect_timeout=1, first_token_timeout=2.5, idle_timeout=3, move_on_retry_after=0
    )
    assert client.phases == PhaseLimits(1.0, 2.5, 3.0)
    assert client.move_on_retry_after == 0.0
    assert move_on_retry_after_choice({}, float("inf")) == float("inf")


@pytest.mark.parametrize("argument", sorted(LIMIT_VARIABLES))
@pytest.mark.parametrize("raw", ["soon", "-1", "0", "nan", "inf", "1e9"])
def test_a_bad_value_is_not_configured_naming_the_variable(argument: str, raw: str) -> None:
    variable = LIMIT_VARIABLES[argument]
    if argument == "move_on_retry_after" and raw == "0":
        assert _client({variable: raw}).move_on_retry_after == 0.0  # 0: always move on
        return
    with pytest.raises(AgentExecutionError) as caught:
        _client({variable: raw})
    assert caught.value.code == "llm.not_configured"
    assert caught.value.details["variable"] == variable
    assert variable in str(caught.value)
    with pytest.raises(AgentExecutionError) as given:
        _client({}, **{argument: -5})
    assert given.value.code == "llm.not_configured"
    assert f"{argument}=" in str(given.value)


# -- the chain on loopback: a primary that fails one way, a healthy fallback ----------------

PRIMARY, HEALTHY = "gpt-4o-mini", "gpt-4o"


def _by_model(primary: hostile.Handler) -> hostile.Handler:
    """The primary model's requests to ``primary``, the fallback's answered at once."""

    def handler(conn: hostile.Conn, request: hostile.Request) -> bool:
        if json.loads(request.body or b"{}").get("model") == PRIMARY:
            return primary(conn, request)
        return hostile.ok(conn, request)

    return handler


def _models(server: hostile.HostileServer) -> list[str]:
    return [json.loads(r.body)["model"] for r in server.requests]


def _chain(url: str, waits: list[float], *, fallback: bool = True, **kwargs: Any) -> LLMClient:
    async def asleep(seconds: float) -> None:
        waits.append(seconds)

    envelope = RetryEnvelope(POLICY, cooldown=None, sleep=waits.append, asleep=asleep)
    return LLMClient(
        "openai",
        PRIMARY,
        api_key=hostile.KEY,
        base_url=f"{url}/v1",
        envelope=envelope,
        # The fallback entry reads its endpoint from the environment (the same server).
        env={"OPENAI_API_KEY": hostile.KEY, "OPENAI_BASE_URL": f"{url}/v1"},
        fallbacks=[("openai", HEALTHY)] if fallback else (),
        deadline=1000.0,  # sleeps are recorded, never slept: room for two 120 s waits
        **kwargs,
    )


def _call(client: LLMClient, how: str) -> Any:
    if how == "complete":
        with client:
            return client.complete("hi")

    async def go() -> Any:
        async with client:
            return await client.acomplete("hi")

    return asyncio.run(go())


TIGHT = {"connect_timeout": 0.2, "first_token_timeout": 0.2, "idle_timeout": 0.2}


@pytest.mark.parametrize("how", ["complete", "acomplete"])
def test_a_silent_primary_is_asked_once_then_the_fallback_answers(how: str) -> None:
    waits: list[float] = []
    with hostile.environ(), hostile.serve(_by_model(hostile.silent)) as server:
        started = time.monotonic()
        answer = _call(_chain(server.url, waits, **TIGHT), how)
        elapsed = time.monotonic() - started
        models = _models(server)
    assert answer.text == "ok"
    assert answer.answered_by == f"openai:{HEALTHY}"
    assert models == [PRIMARY, HEALTHY]  # one attempt on the primary, no retry
    assert waits == []  # no backoff slept before moving on
    # connect + first token (the connection's time may count), and the fallback's answer
    assert elapsed < 0.4 + 1.0, elapsed
    assert answer.fallback_errors[0]["code"] == "llm.timeout"


@pytest.mark.parametrize("how", ["complete", "acomplete"])
def test_moving_on_from_silence_can_be_turned_off(how: str) -> None:
    waits: list[float] = []
    with hostile.environ(), hostile.serve(_by_model(hostile.silent)) as server:
        answer = _call(_chain(server.url, waits, move_on_silence=False, **TIGHT), how)
        models = _models(server)
    assert answer.answered_by == f"openai:{HEALTHY}"
    assert models == [PRIMARY, PRIMARY, PRIMARY, HEALTHY]  # retried per policy first
    assert waits == [0.05, 0.1]


def _rate_limited(conn: hostile.Conn, request: hostile.Request) -> bool:
    body = json.dumps({"error": {"message": "slow down", "type": "rate_limit_error"}}).encode()
    return hostile.respond(429, body, (*hostile.JSON, ("retry-after", "120")))(conn, request)


@pytest.mark.parametrize("how", ["complete", "acomplete"])
def test_a_long_retry_after_moves_to_the_fallback_without_sleeping(how: str) -> None:
    waits: list[float] = []
    with hostile.environ(), hostile.serve(_by_model(_rate_limited)) as server:
        answer = _call(_chain(server.url, waits), how)
        models = _models(server)
    assert answer.answered_by == f"openai:{HEALTHY}"
    assert models == [PRIMARY, HEALTHY]
    assert waits == []


@pytest.mark.parametrize("how", ["complete", "acomplete"])
def test_without_a_fallback_the_envelope_sleeps_what_the_server_asked(how: str) -> None:
    waits: list[float] = []
    with hostile.environ(), hostile.serve(_by_model(_rate_limited)) as server:
        with pytest.raises(RateLimitError) as caught:
            _call(_chain(server.url, waits, fallback=False), how)
        models = _models(server)
    assert models == [PRIMARY] * 3
    assert waits == [120.0, 120.0]
    assert "moved_on" not in caught.value.details


# -- the shared cooldown is a wait the server asked for too ----------------------------------


@pytest.mark.parametrize("later", [True, False])
def test_a_long_shared_cooldown_moves_on_at_once_only_with_a_later_entry(later: bool) -> None:
    from fluid_build.copilot.call.envelope import COOLDOWN
    from fluid_build.copilot.health.store import MemoryCooldownStore

    now = [1000.0]
    waits: list[float] = []

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        now[0] += seconds

    store = MemoryCooldownStore()
    store.extend(COOLDOWN + "k", 60.0, now[0], "llm.rate_limited")  # another call's 429
    envelope = RetryEnvelope(
        POLICY, cooldown=store, breaker=None, clock=lambda: now[0], sleep=sleep
    )
    sent: list[int] = []
    how: dict[str, Any] = {"key": "k", "provider": "openai", "model": "m"}
    if later:
        how["move_on"] = MoveOn()
        with pytest.raises(RateLimitError) as caught:
            envelope.call(lambda: sent.append(1), **how)
        assert caught.value.details["moved_on"] is True
        assert caught.value.details["attempts"] == 0
        assert waits == []
        assert sent == []
    else:
        envelope.call(lambda: sent.append(1), **how)
        assert waits == [60.0]
        assert sent == [1]


# -- one attempt's watch -------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_a_phase_is_first_token_until_the_answer_says_something_then_idle(stream: bool) -> None:
    limits = PhaseLimits(connect=1.0, first_token=30.0, idle=5.0)
    phase = limits.watch(stream=stream)
    assert phase.due() is None  # not sent yet
    phase.start()
    assert phase.sent is not None
    # The connection may still be opening: its limit's time is not the first token's.
    assert phase.due() == pytest.approx(phase.sent + 31.0)
    phase.written()
    assert phase.due() == pytest.approx(phase.sent + 30.0)
    phase.headed()
    assert phase.head_at is not None
    if stream:  # a stream's head says nothing about the model: still the first token's wait
        assert phase.current() == "first_token"
        assert phase.due() == pytest.approx(phase.sent + 30.0)
    else:  # a whole answer's head is its first byte: its body is due within the idle limit
        assert phase.current() == "idle"
        assert phase.due() == pytest.approx(phase.head_at + 5.0)
    phase.got(0)
    assert phase.body == 0
    phase.got(12)
    assert phase.current() == "idle"
    assert phase.due() == pytest.approx(phase.last + 5.0)
    error = phase.error("openai", "gpt-4o")
    assert error.code == "llm.timeout"
    assert error.retryable is True
    assert error.details == {
        "phase": "idle",
        "limit": 5.0,
        "bytes_received": 12,
        "head_received": True,
    }
    assert "FLUID_LLM_IDLE_TIMEOUT_SECONDS" in str(error)


def test_the_timeouts_of_a_request_follow_the_phases_and_the_deadline() -> None:
    limits = PhaseLimits(connect=2.0, first_token=30.0, idle=5.0)
    assert limits.timeouts(600.0, 120.0) == {
        "connect": 2.0,
        "read": 32.0,  # the head's wait: the first token's, the connection's time included
        "write": 120.0,
        "pool": 120.0,
    }
    assert limits.timeouts(1.5, 120.0) == {"connect": 1.5, "read": 1.5, "write": 1.5, "pool": 1.5}
    connect = limits.watch(stream=False).error("openai", None, connect=True)
    assert connect.details["phase"] == "connect"
    assert connect.details["bytes_received"] == 0
    assert connect.details["head_received"] is False
