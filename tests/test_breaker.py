"""The circuit breaker, fallback chains and health, on a fake clock."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import respx

from fluid_build.copilot import LLMClient
from fluid_build.copilot.agents.errors import (
    BREAKER_CODES,
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
from fluid_build.copilot.call.envelope import RetryEnvelope, RetryPolicy
from fluid_build.copilot.health.breaker import CircuitBreaker
from fluid_build.copilot.health.cooldown import MemoryCooldownStore, SqliteCooldownStore
from tests import loopback
from tests.fakes import FakeClock, Script
from tests.helpers import status_error

KEY = "openai:abc:gpt-4o"


def envelope(clock: FakeClock, store: Any = None, **kwargs: Any) -> RetryEnvelope:
    store = store if store is not None else MemoryCooldownStore()
    breaker = CircuitBreaker(store, threshold=kwargs.pop("threshold", 3), cool_off=30, clock=clock)
    return RetryEnvelope(
        kwargs.pop("policy", RetryPolicy(attempts=1)),
        cooldown=store,
        breaker=breaker,
        clock=clock,
        sleep=clock.sleep,
        asleep=clock.asleep,
        random=lambda: 0.0,
        hook=lambda e: None,
    )


def fail(env: RetryEnvelope, exc: BaseException) -> AgentExecutionError:
    with pytest.raises(AgentExecutionError) as caught:
        env.call(Script(exc), key=KEY, provider="openai", model="gpt-4o")
    return caught.value


# -- the breaker -------------------------------------------------------------------------


def test_which_errors_count_toward_the_breaker() -> None:
    assert ProviderServerError("x").counts_toward_breaker
    assert ProviderServerError("x", code="llm.overloaded").counts_toward_breaker
    assert ProviderTimeoutError("x").counts_toward_breaker
    assert ProviderError("x", code="llm.network_error").counts_toward_breaker
    for never in (
        ProviderAuthError("x"),
        ContextOverflowError("x"),
        SchemaValidationError("x"),
        RateLimitError("x"),
        ProviderError("x", code="llm.invalid_request"),
    ):
        assert not never.counts_toward_breaker
    assert set(REASON_CODES) >= BREAKER_CODES


def test_every_transition(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    env = envelope(clock)
    breaker = env.breaker
    assert breaker is not None
    for _ in range(2):
        fail(env, httpx.ConnectError("refused"))
    assert breaker.state(KEY).state == "closed"
    assert breaker.state(KEY).failures == 2
    fail(env, status_error(503))  # the third: it opens
    state = breaker.state(KEY)
    assert (state.state, state.failures, state.opens_for) == ("open", 3, 30.0)

    script = Script("never")
    error = fail(env, RuntimeError("unused"))  # fails at once, nothing sent
    assert error.code == "llm.circuit_open"
    assert isinstance(error, ProviderServerError)
    assert error.retryable
    assert error.retry_after == 30.0
    assert "UTC (30 s)" in str(error)
    assert "fluid doctor --reset" in str(error)
    with pytest.raises(ProviderServerError):
        env.call(script, key=KEY)
    assert script.calls == 0

    clock.now += 30  # half-open: one trial goes through and fails: open again
    assert breaker.state(KEY).state == "half_open"
    fail(env, httpx.ReadTimeout("slow"))
    assert breaker.state(KEY).state == "open"

    clock.now += 30  # half-open again: a second caller is refused while the trial is out
    breaker.check(KEY)  # this caller is the trial
    with pytest.raises(ProviderServerError, match="trial call is in progress"):
        breaker.check(KEY)
    breaker.record_success(KEY)  # the trial succeeded: closed
    assert breaker.state(KEY).state == "closed"
    assert env.call(Script("ok"), key=KEY) == "ok"
    assert breaker.state(KEY).failures == 0
    assert "opened: 3 consecutive failures" in caplog.text


def test_auth_overflow_and_validation_never_trip_it() -> None:
    clock = FakeClock()
    env = envelope(clock)
    for exc in [
        status_error(401),
        status_error(400, {"error": {"message": "maximum context length"}}),
        status_error(400),
        status_error(429),
    ] * 3:
        fail(env, exc)
    assert env.breaker is not None
    assert env.breaker.state(KEY).state == "closed"
    assert env.breaker.state(KEY).failures == 0


def test_a_success_resets_the_count() -> None:
    clock = FakeClock()
    env = envelope(clock)
    fail(env, status_error(502))
    fail(env, status_error(502))
    assert env.call(Script("ok"), key=KEY) == "ok"
    fail(env, status_error(502))
    assert env.breaker is not None
    assert env.breaker.state(KEY).state == "closed"


def test_the_envelope_stops_retrying_once_it_opens() -> None:
    clock = FakeClock()
    env = envelope(clock, policy=RetryPolicy(attempts=5), threshold=2)
    script = Script(status_error(503), status_error(503), "never")
    error = fail_with(env, script)
    assert isinstance(error, ProviderServerError)
    assert "the circuit breaker opened" in str(error)
    assert script.calls == 2
    assert clock.waits == [1.0]
    assert fail_with(env, Script("never")).code == "llm.circuit_open"


def fail_with(env: RetryEnvelope, script: Script) -> AgentExecutionError:
    with pytest.raises(AgentExecutionError) as caught:
        env.call(script, key=KEY)
    return caught.value


def test_workers_share_the_breaker_through_the_sqlite_store(tmp_path: Path) -> None:
    clock = FakeClock()
    path = tmp_path / "c.sqlite3"
    worker_a = envelope(clock, SqliteCooldownStore(path))
    worker_b = envelope(clock, SqliteCooldownStore(path))
    fail(worker_a, status_error(500))
    fail(worker_b, status_error(500))
    fail(worker_a, status_error(500))
    assert worker_b.breaker is not None
    assert worker_b.breaker.state(KEY).state == "open"
    assert fail(worker_b, RuntimeError("unused")).code == "llm.circuit_open"


def test_breaker_settings_from_env(caplog: pytest.LogCaptureFixture) -> None:
    store = MemoryCooldownStore()
    breaker = CircuitBreaker.from_env(
        store, {"FLUID_BREAKER_THRESHOLD": "2", "FLUID_BREAKER_COOL_OFF_SECONDS": "5"}
    )
    assert (breaker.threshold, breaker.cool_off) == (2, 5.0)
    bad = CircuitBreaker.from_env(store, {"FLUID_BREAKER_THRESHOLD": "lots"})
    assert bad.threshold == 5
    assert "FLUID_BREAKER_THRESHOLD" in caplog.text


# -- fallback chains ---------------------------------------------------------------------

OPENAI = "https://api.openai.com/v1/chat/completions"
ANTHROPIC = "https://api.anthropic.com/v1/messages"
OLLAMA = "http://127.0.0.1:11434/api/chat"
KEYS = {"OPENAI_API_KEY": "sk-openai-test", "ANTHROPIC_API_KEY": "sk-ant-test"}
ANTHROPIC_OK = {
    "content": [{"type": "text", "text": "from claude"}],
    "model": "claude-sonnet-4-6",
    "usage": {"input_tokens": 1, "output_tokens": 1},
    "stop_reason": "end_turn",
}


@pytest.fixture
def mock() -> Iterator[respx.MockRouter]:
    with respx.mock(assert_all_called=False) as router:
        yield router


def chain(clock: FakeClock, *fallbacks: str, **kwargs: Any) -> LLMClient:
    store = MemoryCooldownStore()
    env = RetryEnvelope(
        RetryPolicy(attempts=2),
        cooldown=store,
        breaker=CircuitBreaker(store, threshold=5, cool_off=30, clock=clock),
        clock=clock,
        sleep=clock.sleep,
        asleep=clock.asleep,
        random=lambda: 0.0,
        hook=lambda e: None,
    )
    return LLMClient(
        "openai", "gpt-4o", envelope=env, env=KEYS, fallbacks=list(fallbacks), **kwargs
    )


def test_an_exhausted_primary_hands_over(mock: respx.MockRouter) -> None:
    primary = mock.post(OPENAI).respond(503, json={"error": {"message": "down"}})
    fallback = mock.post(ANTHROPIC).respond(200, json=ANTHROPIC_OK)
    done = chain(FakeClock(), "anthropic:claude-sonnet-4-6").complete("hi")
    assert done.text == "from claude"
    assert done.answered_by == "anthropic:claude-sonnet-4-6"
    assert done.fallback_errors == [
        {
            "entry": "openai:gpt-4o",
            "attempt": attempt,
            "error": "ProviderServerError",
            "code": "llm.server_error",
            "sent": True,
            "cost_usd": 0.0,
        }
        for attempt in (1, 2)
    ]
    assert (primary.call_count, fallback.call_count) == (2, 1)


def test_overflow_skips_every_entry_too_small_without_a_request(mock: respx.MockRouter) -> None:
    routes = [
        mock.post(OPENAI),
        mock.post(OLLAMA),
        mock.post(ANTHROPIC).respond(200, json=ANTHROPIC_OK),
    ]
    client = chain(FakeClock(), "ollama:gemma2", "anthropic:claude-sonnet-4-6")
    done = client.complete("word " * 140_000)
    assert done.answered_by == "anthropic:claude-sonnet-4-6"
    assert [r.call_count for r in routes] == [0, 0, 1]
    assert [e["code"] for e in done.fallback_errors] == ["llm.context_overflow"] * 2
    # Refused by the pre-flight: no attempt, nothing sent, nothing spent.
    assert {(e["attempt"], e["sent"], e["cost_usd"]) for e in done.fallback_errors} == {
        (None, False, 0.0)
    }


def test_an_open_primary_is_listed_as_refused_at_no_cost(mock: respx.MockRouter) -> None:
    primary = mock.post(OPENAI)
    mock.post(ANTHROPIC).respond(200, json=ANTHROPIC_OK)
    client = chain(FakeClock(), "anthropic:claude-sonnet-4-6")
    breaker = client.envelope.breaker
    assert breaker is not None
    for _ in range(5):
        breaker.record_failure(str(client.health_key), ProviderServerError("down"))
    done = client.complete("hi")
    assert primary.call_count == 0
    assert done.fallback_errors == [
        {
            "entry": "openai:gpt-4o",
            "attempt": None,
            "error": "ProviderServerError",
            "code": "llm.circuit_open",
            "sent": False,
            "cost_usd": 0.0,
        }
    ]


def test_auth_errors_do_not_fall_through_unless_opted_in(mock: respx.MockRouter) -> None:
    mock.post(OPENAI).respond(401, json={"error": {"message": "Incorrect API key provided"}})
    fallback = mock.post(ANTHROPIC).respond(200, json=ANTHROPIC_OK)
    with pytest.raises(ProviderAuthError):
        chain(FakeClock(), "anthropic:claude-sonnet-4-6").complete("hi")
    assert fallback.call_count == 0
    opted = chain(FakeClock(), "anthropic:claude-sonnet-4-6", fallback_on_auth=True)
    assert opted.complete("hi").answered_by == "anthropic:claude-sonnet-4-6"


def test_when_all_fail_the_most_actionable_error_wins(mock: respx.MockRouter) -> None:
    mock.post(OPENAI).respond(503, json={"error": {"message": "down"}})
    mock.post(ANTHROPIC).respond(
        429,
        json={"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}},
        headers={"retry-after": "3"},
    )
    with pytest.raises(RateLimitError) as caught:
        chain(FakeClock(), "anthropic:claude-sonnet-4-6").complete("hi")
    attempts = caught.value.details["fallback_attempts"]
    assert [a["entry"] for a in attempts] == ["openai:gpt-4o", "anthropic:claude-sonnet-4-6"]
    assert "all 2 fallback entries failed" in str(caught.value)


def test_a_non_retryable_request_error_does_not_hop(mock: respx.MockRouter) -> None:
    mock.post(OPENAI).respond(400, json={"error": {"message": "Unrecognized request argument"}})
    fallback = mock.post(ANTHROPIC).respond(200, json=ANTHROPIC_OK)
    with pytest.raises(ProviderError) as caught:
        chain(FakeClock(), "anthropic:claude-sonnet-4-6").complete("hi")
    assert caught.value.code == "llm.invalid_request"
    assert fallback.call_count == 0


def test_fallbacks_from_the_environment() -> None:
    env = {**KEYS, "FLUID_LLM_FALLBACKS": "anthropic:claude-sonnet-4-6, ollama:llama3.1:8b"}
    client = LLMClient("openai", "gpt-4o", env=env)
    assert [f.label for f in client.fallbacks] == [
        "anthropic:claude-sonnet-4-6",
        "ollama:llama3.1:8b",
    ]
    with pytest.raises(ProviderError) as caught:
        LLMClient("openai", "gpt-4o", env={**KEYS, "FLUID_LLM_FALLBACKS": "claude"})
    assert caught.value.code == "llm.not_configured"


# -- health ---------------------------------------------------------------------------------


def test_health_reports_breaker_cooldown_and_a_sticky_last_error(mock: respx.MockRouter) -> None:
    clock = FakeClock()
    route = mock.post(OPENAI)
    route.side_effect = [httpx.Response(503, json={"error": {"message": "down"}})] * 2 + [
        httpx.Response(200, json={"choices": [{"message": {"content": "ok"}}]})
    ]
    fallback = mock.post(ANTHROPIC).respond(200, json=ANTHROPIC_OK)
    client = chain(clock, "anthropic:claude-sonnet-4-6")
    client.complete("hi")
    primary, second = client.health()
    assert primary["entry"] == "openai:gpt-4o"
    assert primary["breaker"] == "closed"
    assert primary["failures"] == 2
    assert primary["last_error"]["code"] == "llm.server_error"
    assert primary["last_error"]["at"].endswith("+00:00")
    assert second["last_error"] is None
    client.complete("hi")  # a success does not clear it: it is sticky
    assert client.health()[0]["last_error"]["code"] == "llm.server_error"
    assert client.health()[0]["failures"] == 0
    client.clear_last_error()
    assert client.health()[0]["last_error"] is None
    assert fallback.call_count == 1


def test_caller_side_errors_are_not_stored(mock: respx.MockRouter) -> None:
    client = chain(FakeClock())
    client.capability_matrix = {"context_window": 8192}
    with pytest.raises(ContextOverflowError):
        client.complete("word " * 20_000)
    assert client.health()[0]["last_error"] is None


# -- a real primary that is down for good ---------------------------------------------------


def test_loopback_primary_503_for_good_and_the_fallback_answers() -> None:
    down = (503, {"content-type": "application/json"}, b'{"error": {"message": "down"}}')
    ok = (
        200,
        {"content-type": "application/json"},
        json.dumps({"choices": [{"message": {"content": "fallback here"}}]}).encode(),
    )
    with (
        loopback.http_server(lambda seen: down) as primary,
        loopback.http_server(lambda seen: ok) as secondary,
    ):
        env = {"OPENAI_API_KEY": "local", "FLUID_LLM_FALLBACKS": "vllm:backup-model"}
        envelope_ = RetryEnvelope(
            RetryPolicy(attempts=2, backoff_base=0.01, backoff_cap=0.01),
            cooldown=MemoryCooldownStore(),
            hook=lambda e: None,
        )
        client = LLMClient(
            "vllm",
            "main-model",
            base_url=loopback.base_url(primary) + "/v1",
            envelope=envelope_,
            env={**env, "OPENAI_BASE_URL": loopback.base_url(secondary) + "/v1"},
        )
        with client:
            done = client.complete("hi")
    assert done.text == "fallback here"
    assert done.answered_by == "vllm:backup-model"
    assert len(primary.seen) == 2
    assert len(secondary.seen) == 1


def test_doctor_shows_a_breaker_opened_by_another_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from click.testing import CliRunner

    from fluid_build.cli import _register, cli
    from fluid_build.copilot.health.cooldown import CooldownKey

    path = tmp_path / "shared.sqlite3"
    key = str(
        CooldownKey.for_call("openai", "sk-openai-test", "gpt-4o", "https://api.openai.com/v1/")
    )
    breaker = CircuitBreaker(SqliteCooldownStore(path), threshold=1, cool_off=600)
    breaker.record_failure(key, ProviderServerError("down"))  # "another worker" trips it
    monkeypatch.setenv("FLUID_COOLDOWN_URL", f"sqlite://{path}")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai-test")
    monkeypatch.setenv("FLUID_LLM_MODEL", "gpt-4o")
    monkeypatch.setenv("FLUID_HOME", str(tmp_path / "home"))
    _register()
    result = CliRunner().invoke(cli, ["doctor", "--json"])
    assert result.exit_code == 0, result.output
    entries = json.loads(result.stdout)["health"]["entries"]
    assert entries[0]["entry"] == "openai:gpt-4o"
    assert entries[0]["breaker"] == "open"
    text = CliRunner().invoke(cli, ["doctor"]).output
    assert "health openai:gpt-4o: circuit OPEN, half-opens in" in text


def test_an_open_breakers_refusal_starts_no_shared_cooldown() -> None:
    """Only a server's answer writes a cooldown: the breaker's own wait stays the breaker's.

    Shared as a cooldown, it would refuse every process on the store, those that run
    without a breaker (FLUID_BREAKER_THRESHOLD=0) too, saying another call got Retry-After.
    """
    clock = FakeClock()
    store = MemoryCooldownStore()
    env = envelope(clock, store)
    for _ in range(3):
        fail(env, httpx.ConnectError("refused"))
    refused = fail(env, RuntimeError("unused"))
    assert refused.code == "llm.circuit_open"
    assert refused.retry_after == 30.0
    assert refused.own_wait
    assert not [e.key for e in store.entries(clock()) if e.key.startswith("cooldown:")]


@pytest.mark.parametrize("cool_off", [30.0, 900.0])
@pytest.mark.parametrize("opened_at", [1_767_225_600.0, 1_767_225_600.25, 1_767_225_600.75])
def test_an_open_breakers_message_and_hint_name_the_same_time(
    opened_at: float, cool_off: float
) -> None:
    """The message and its hint are worked out from one wait: the same clock time, the
    same duration, past the 300 s cap on retry_after too."""
    import re

    clock = FakeClock()
    clock.now = opened_at
    breaker = CircuitBreaker(MemoryCooldownStore(), threshold=1, cool_off=cool_off, clock=clock)
    breaker.record_failure(KEY, ProviderServerError("boom"))
    clock.now += 0.6
    with pytest.raises(ProviderServerError) as caught:
        breaker.check(KEY, provider="openai", model="gpt-4o")
    error = caught.value
    said = re.search(r"half-opens at (\d\d:\d\d:\d\d UTC \([^)]*\))", str(error))
    assert said is not None, str(error)
    for later in (0.0, 0.3, 5.0):  # the hint is printed a moment after the refusal
        hint = error.hint(now=clock.now + later)
        assert f"until {said.group(1)}" in hint, (str(error), hint)


def test_a_trial_in_progress_message_and_hint_name_the_same_time() -> None:
    import re

    clock = FakeClock()
    clock.now = 1_767_225_600.4
    breaker = CircuitBreaker(MemoryCooldownStore(), threshold=1, cool_off=30, clock=clock)
    breaker.record_failure(KEY, ProviderServerError("boom"))
    clock.now += 30.0
    breaker.check(KEY)  # this caller holds the trial lease
    clock.now += 0.3
    with pytest.raises(ProviderServerError, match="trial call is in progress") as caught:
        breaker.check(KEY, provider="openai", model="gpt-4o")
    error = caught.value
    said = re.search(r"ends by (\d\d:\d\d:\d\d UTC \([^)]*\))", str(error))
    assert said is not None, str(error)
    assert f"until {said.group(1)}" in error.hint(now=clock.now + 1.0)
