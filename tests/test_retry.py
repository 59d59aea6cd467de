"""The retry envelope with a fake clock: exact waits, fail-fast, deadline, sync and async alike."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from email.utils import format_datetime
from typing import Any

import httpx
import pytest

from fluid_build.copilot.agents.errors import (
    AgentExecutionError,
    ContextOverflowError,
    ProviderAuthError,
    ProviderError,
    ProviderServerError,
    RateLimitError,
    SchemaValidationError,
    ToolValidationError,
)
from fluid_build.copilot.call.envelope import (
    COOLDOWN,
    RetryEnvelope,
    RetryEvent,
    RetryPolicy,
    backoff_wait,
    decide,
)
from fluid_build.copilot.health.cooldown import CooldownKey, MemoryCooldownStore
from tests.fakes import FakeClock, Script
from tests.helpers import status_error

MODES = ["sync", "async"]


def http_429(seconds: str | None = None, **headers: str) -> httpx.HTTPStatusError:
    if seconds is not None:
        headers["retry-after"] = seconds
    return status_error(429, {"error": {"message": "Rate limit reached"}}, headers=headers)


def http_503() -> httpx.HTTPStatusError:
    return status_error(503, {"error": {"message": "upstream unavailable"}})


def envelope(
    clock: FakeClock, events: list[RetryEvent] | None = None, **kwargs: Any
) -> RetryEnvelope:
    policy = kwargs.pop("policy", None) or RetryPolicy(**kwargs.pop("policy_args", {}))
    return RetryEnvelope(
        policy,
        clock=clock,
        sleep=clock.sleep,
        asleep=clock.asleep,
        random=kwargs.pop("random", lambda: 0.0),
        hook=(events.append if events is not None else lambda event: None),
        **kwargs,
    )


def run(env: RetryEnvelope, script: Script, mode: str, **kwargs: Any) -> Any:
    if mode == "sync":
        return env.call(script, **kwargs)
    return asyncio.run(env.acall(script.acall, **kwargs))


def run_error(env: RetryEnvelope, script: Script, mode: str, **kwargs: Any) -> AgentExecutionError:
    with pytest.raises(AgentExecutionError) as caught:
        run(env, script, mode, **kwargs)
    return caught.value


# -- the pure decisions ----------------------------------------------------------


@pytest.mark.parametrize(
    ("attempt", "u", "expected"),
    [
        (1, 0.0, 1.0),
        (2, 0.0, 2.0),
        (3, 0.0, 4.0),
        (4, 0.0, 8.0),
        (5, 0.0, 8.0),
        (30, 0.0, 8.0),
        (1, 0.5, 0.95),
        (2, 0.999, 1.8002),
        (4, 1.0, 7.2),
    ],
)
def test_backoff_table(attempt: int, u: float, expected: float) -> None:
    assert backoff_wait(attempt, RetryPolicy(), u) == pytest.approx(expected)


def test_jitter_never_lengthens_past_the_cap_nor_shortens_past_ten_percent() -> None:
    policy = RetryPolicy()
    for attempt in range(1, 10):
        nominal = min(2.0 ** (attempt - 1), 8.0)
        for u in (0.0, 0.25, 0.5, 0.75, 0.9999):
            wait = backoff_wait(attempt, policy, u)
            assert nominal * 0.9 <= wait <= nominal <= 8.0


@pytest.mark.parametrize(
    ("error", "attempt", "elapsed", "policy", "wait", "reason"),
    [
        (RateLimitError("x", retry_after=7), 1, 0, RetryPolicy(), 7.0, "retry_after"),
        (RateLimitError("x", retry_after=0), 1, 0, RetryPolicy(), 0.0, "retry_after"),
        (
            RateLimitError("x", retry_after=7),
            1,
            0,
            RetryPolicy(retry_after_cap=5),
            5.0,
            "retry_after",
        ),
        (ProviderServerError("x"), 2, 0, RetryPolicy(), 2.0, "backoff"),
        (ProviderServerError("x"), 3, 0, RetryPolicy(), None, "gave up after 3 attempt(s)"),
        (ProviderAuthError("x"), 1, 0, RetryPolicy(), None, "not retryable"),
        (ValueError("x"), 1, 0, RetryPolicy(), None, "not retryable"),
        (
            RateLimitError("x", retry_after=30),
            1,
            5,
            RetryPolicy(deadline=20),
            None,
            "gave up: the server asked to wait 30 s but only 15 s of the 20 s deadline are left",
        ),
        (
            ProviderServerError("x"),
            2,
            19,
            RetryPolicy(deadline=20),
            None,
            "gave up: the next backoff is 2 s but only 1 s of the 20 s deadline are left",
        ),
        (
            RateLimitError("x", retry_after=300, details={"retry_after_requested": 86400}),
            1,
            0,
            RetryPolicy(deadline=600),
            None,
            "gave up: the server asked to wait 8.64e+04 s but only 600 s of the 600 s deadline "
            "are left",
        ),
        (RateLimitError("x", retry_after=10), 1, 5, RetryPolicy(deadline=20), 10.0, "retry_after"),
    ],
)
def test_decide_table(
    error: BaseException,
    attempt: int,
    elapsed: float,
    policy: RetryPolicy,
    wait: float | None,
    reason: str,
) -> None:
    decision = decide(error, attempt, elapsed, policy, 0.0)
    assert decision.wait == wait
    assert decision.reason == reason


# -- honouring what the server asked for -----------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"retry-after": "7"}, 7.0),
        ({"retry-after": "2.5"}, 2.5),
        ({"retry-after-ms": "1500", "retry-after": "9"}, 1.5),
        ({"retry-after": "86400"}, 300.0),
        ("http-date", 42.0),
    ],
)
def test_retry_after_is_slept_exactly(mode: str, headers: Any, expected: float) -> None:
    clock = FakeClock()
    if headers == "http-date":
        when = datetime.fromtimestamp(clock.now + 42, tz=UTC)
        headers = {"retry-after": format_datetime(when, usegmt=True)}
    script = Script(http_429(**headers), "ok")
    assert run(envelope(clock, random=lambda: 0.999), script, mode) == "ok"
    assert clock.waits == [pytest.approx(expected)]
    assert script.calls == 2


@pytest.mark.parametrize("mode", MODES)
def test_backoff_is_one_two_four_then_the_last_error(mode: str) -> None:
    clock = FakeClock()
    script = Script(http_503(), http_503(), http_503(), http_503())
    error = run_error(envelope(clock, policy_args={"attempts": 4}), script, mode)
    assert clock.waits == [1.0, 2.0, 4.0]
    assert script.calls == 4
    assert isinstance(error, ProviderServerError)
    assert error.details["attempts"] == 4
    assert error.details["waits"] == [
        {"seconds": 1.0, "reason": "backoff"},
        {"seconds": 2.0, "reason": "backoff"},
        {"seconds": 4.0, "reason": "backoff"},
    ]
    assert error.details["gave_up"] == "gave up after 4 attempt(s)"
    assert "gave up after 4 attempt(s)" in str(error)


@pytest.mark.parametrize("mode", MODES)
def test_backoff_jitter_stays_within_ten_percent(mode: str) -> None:
    clock = FakeClock()
    draws = iter([0.3, 0.999, 0.5, 0.0, 0.7, 0.1])
    script = Script(*[http_503() for _ in range(6)])
    run_error(
        envelope(clock, random=lambda: next(draws), policy_args={"attempts": 6}), script, mode
    )
    assert clock.waits == pytest.approx([0.97, 1.8002, 3.8, 8.0, 7.44])
    for wait, nominal in zip(clock.waits, [1, 2, 4, 8, 8], strict=True):
        assert nominal * 0.9 <= wait <= nominal


@pytest.mark.parametrize("mode", MODES)
def test_final_error_is_the_last_attempts(mode: str) -> None:
    clock = FakeClock()
    script = Script(http_503(), http_429("3"), http_429("4"))
    error = run_error(envelope(clock), script, mode)
    assert isinstance(error, RateLimitError)
    assert error.retry_after == 4.0
    assert clock.waits == [1.0, 3.0]
    assert isinstance(error.__cause__, httpx.HTTPStatusError)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "failure",
    [
        status_error(401, {"error": {"message": "Incorrect API key provided"}}),
        status_error(400, {"error": {"message": "This model's maximum context length is 8192"}}),
        status_error(
            429,
            {"error": {"message": "quota", "code": "insufficient_quota"}},
            headers={"retry-after": "5"},
        ),
        status_error(400, {"error": {"message": "Unrecognized request argument"}}),
        SchemaValidationError("bad output", schema_name="Out"),
        ToolValidationError(tool_name="t", reason="bad args"),
        ContextOverflowError("pre-flight refused"),
    ],
    ids=["auth", "overflow", "quota", "invalid", "schema", "tool", "preflight"],
)
def test_fail_fast_classes_make_one_attempt(mode: str, failure: BaseException) -> None:
    clock = FakeClock()
    script = Script(failure, "never")
    error = run_error(envelope(clock), script, mode)
    assert script.calls == 1
    assert clock.waits == []
    assert not error.retryable
    assert error.details["attempts"] == 1
    assert "gave_up" not in error.details


@pytest.mark.parametrize("mode", MODES)
def test_deadline_gives_up_at_once_when_the_server_asks_for_too_long(mode: str) -> None:
    clock = FakeClock()
    script = Script(http_429("120"), "never")
    error = run_error(envelope(clock, policy_args={"deadline": 60}), script, mode)
    assert script.calls == 1
    assert clock.waits == []
    assert isinstance(error, RateLimitError)
    assert "server asked to wait 120 s" in str(error)
    assert "60 s deadline" in str(error)


@pytest.mark.parametrize("mode", MODES)
def test_deadline_counts_time_spent_in_attempts(mode: str) -> None:
    clock = FakeClock()
    script = Script(http_503(), http_503(), "never", clock=clock, takes=9.0)
    error = run_error(envelope(clock, policy_args={"deadline": 20, "attempts": 5}), script, mode)
    # 9 s + wait 1 s + 9 s = 19 s used; the 2 s backoff would end past 20 s.
    assert clock.waits == [1.0]
    assert script.calls == 2
    assert "only 1 s of the 20 s deadline" in str(error)


@pytest.mark.parametrize("mode", MODES)
def test_success_on_first_attempt_is_untouched(mode: str) -> None:
    clock = FakeClock()
    script = Script({"answer": 42})
    assert run(envelope(clock), script, mode) == {"answer": 42}
    assert (script.calls, clock.waits) == (1, [])


@pytest.mark.parametrize("mode", MODES)
def test_the_hook_sees_every_wait_and_a_broken_hook_changes_nothing(
    mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()
    events: list[RetryEvent] = []
    script = Script(http_429("5"), http_503(), "ok")
    run(envelope(clock, events, cooldown=None), script, mode, provider="openai", model="gpt-4o")
    assert [(e.wait, e.reason, e.attempts) for e in events] == [
        (5.0, "retry_after", 1),
        (2.0, "backoff", 2),
    ]
    assert [e.error.code for e in events if e.error] == ["llm.rate_limited", "llm.server_error"]
    assert all((e.provider, e.model) == ("openai", "gpt-4o") for e in events)

    def broken(event: RetryEvent) -> None:
        raise RuntimeError("hook bug")

    clock2 = FakeClock()
    env = envelope(clock2)
    env.hook = broken
    with caplog.at_level(logging.ERROR, logger="fluid_build.retry"):
        assert run(env, Script(http_503(), "ok"), mode) == "ok"
    assert clock2.waits == [1.0]
    assert "retry hook" in caplog.text


def test_default_hook_logs_each_wait(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    env = RetryEnvelope(clock=clock, sleep=clock.sleep, random=lambda: 0.0)
    with caplog.at_level(logging.WARNING, logger="fluid_build.retry"):
        env.call(Script(http_429("3"), "ok"), provider="openai")
    assert "openai: attempt 1 failed [llm.rate_limited]; waiting 3.00 s (as the server asked)" in (
        caplog.text
    )


@pytest.mark.parametrize("mode", MODES)
def test_cancellation_and_bugs_are_not_retried_or_wrapped(mode: str) -> None:
    clock = FakeClock()
    with pytest.raises(KeyboardInterrupt):
        run(envelope(clock), Script(KeyboardInterrupt(), "never"), mode)
    with pytest.raises(KeyboardInterrupt):
        run(envelope(clock), Script(http_503(), KeyboardInterrupt(), "never"), mode)
    assert clock.waits == [1.0]


@pytest.mark.parametrize("mode", MODES)
def test_unknown_exceptions_become_typed_and_fail_fast(mode: str) -> None:
    clock = FakeClock()
    script = Script(ValueError("bug in the adapter"), "never")
    error = run_error(envelope(clock), script, mode)
    assert type(error) is ProviderError
    assert error.code == "llm.unknown_error"
    assert isinstance(error.__cause__, ValueError)
    assert script.calls == 1


@pytest.mark.parametrize("mode", MODES)
def test_network_errors_are_retried_with_backoff(mode: str) -> None:
    clock = FakeClock()
    script = Script(httpx.ConnectError("refused"), httpx.ReadTimeout("slow"), "ok")
    assert run(envelope(clock), script, mode) == "ok"
    assert clock.waits == [1.0, 2.0]


# -- the shared cooldown -----------------------------------------------------------

KEY = CooldownKey.for_call("openai", "sk-proj-abcdefghijklmnop", "gpt-4o")


@pytest.mark.parametrize("mode", MODES)
def test_a_retry_after_makes_other_calls_on_the_key_wait(mode: str) -> None:
    clock = FakeClock()
    store = MemoryCooldownStore()
    events: list[RetryEvent] = []
    env = envelope(clock, events, cooldown=store, policy_args={"attempts": 1})
    start = clock.now
    # One call gets a 429 asking for 30 s (and, with one attempt, gives up).
    first = Script(http_429("30"), clock=clock)
    assert isinstance(run_error(env, first, mode, key=KEY), RateLimitError)
    assert store.remaining(COOLDOWN + str(KEY), start) == pytest.approx(30.0)
    # Ten seconds later another call on the same key waits out the other 20 s.
    clock.now = start + 10
    other = Script("ok", clock=clock)
    assert run(env, other, mode, key=KEY) == "ok"
    assert clock.waits == [pytest.approx(20.0)]
    assert other.sent_at == [pytest.approx(start + 30)]
    assert (events[-1].reason, events[-1].key) == ("cooldown", str(KEY))
    # Another model on the same key, and calls without a key, are not held back.
    clock.now = start + 15
    clock.waits.clear()
    o3 = CooldownKey(KEY.provider, KEY.fingerprint, "o3")
    assert run(env, Script("ok"), mode, key=o3) == "ok"
    assert run(env, Script("ok"), mode) == "ok"
    assert clock.waits == []


@pytest.mark.parametrize("mode", MODES)
def test_cooldown_longer_than_the_deadline_gives_up_without_sending(mode: str) -> None:
    clock = FakeClock()
    store = MemoryCooldownStore()
    store.extend(COOLDOWN + str(KEY), 120, clock.now)
    script = Script("never", clock=clock)
    env = envelope(clock, cooldown=store, policy_args={"deadline": 30})
    error = run_error(env, script, mode, key=KEY, provider="openai")
    assert script.calls == 0
    assert clock.waits == []
    assert isinstance(error, RateLimitError)
    assert error.details["cooldown"] is True
    assert error.details["attempts"] == 0
    assert "cooling down for 120 s" in str(error)


@pytest.mark.parametrize("mode", MODES)
def test_cooldown_then_retry_after_shares_and_waits(mode: str) -> None:
    clock = FakeClock()
    store = MemoryCooldownStore()
    script = Script(http_429("5"), "ok", clock=clock)
    assert run(envelope(clock, cooldown=store), script, mode, key=KEY) == "ok"
    # The retry waited the Retry-After once (not again as a cooldown on top).
    assert clock.waits == [5.0]
    assert script.sent_at[1] - script.sent_at[0] == pytest.approx(5.0)


def test_policy_from_env(caplog: pytest.LogCaptureFixture) -> None:
    # From the environment, the whole call is bounded by default (docs/limits.md).
    assert RetryPolicy.from_env({}) == RetryPolicy(deadline=600)
    env = {"FLUID_LLM_MAX_ATTEMPTS": "5", "FLUID_LLM_DEADLINE_SECONDS": "90"}
    assert RetryPolicy.from_env(env) == RetryPolicy(attempts=5, deadline=90)
    with caplog.at_level(logging.WARNING, logger="fluid_build.config"):
        bad = RetryPolicy.from_env(
            {"FLUID_LLM_MAX_ATTEMPTS": "three", "FLUID_LLM_DEADLINE_SECONDS": "1e999"}
        )
    assert bad == RetryPolicy(deadline=600)
    assert "FLUID_LLM_MAX_ATTEMPTS='three' is not a whole number; using 3" in caplog.text
    assert "FLUID_LLM_DEADLINE_SECONDS" in caplog.text
    with caplog.at_level(logging.WARNING, logger="fluid_build.config"):
        clamped = RetryPolicy.from_env({"FLUID_LLM_MAX_ATTEMPTS": "1000"})
    assert clamped.attempts == 100


def test_policy_rejects_nonsense() -> None:
    import pydantic

    for bad in (
        {"attempts": 0},
        {"jitter": 2},
        {"retry_after_cap": 301},
        {"deadline": -1},
        {"surprise": 1},
    ):
        with pytest.raises(pydantic.ValidationError):
            RetryPolicy(**bad)
