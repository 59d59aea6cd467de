"""The half-open trial is a lease: released on every outcome, expiring when its owner dies.

And the rest of the shared state's promises, on a fake clock: failure counts
expire, a success anywhere resets everyone, windows read back are capped,
deadlines run on the monotonic clock, two endpoints never share state, and
each state change logs one line.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import respx

from fluid_build.copilot import LLMClient
from fluid_build.copilot.agents.errors import (
    AgentExecutionError,
    ProviderServerError,
    RateLimitError,
)
from fluid_build.copilot.call.envelope import RetryEnvelope, RetryPolicy
from fluid_build.copilot.health.breaker import TRIAL, CircuitBreaker
from fluid_build.copilot.health.cooldown import (
    COOLDOWN,
    CooldownStore,
    MemoryCooldownStore,
    ResilientCooldownStore,
    SqliteCooldownStore,
    StoreResetError,
    reset_keys,
)
from fluid_build.errors import FluidError
from tests.fakes import FakeClock, Script
from tests.helpers import status_error

KEY = "openai|https://api.openai.com/v1|abc|gpt-4o"
COOL_OFF = 30.0
WINDOW = 60.0


def envelope(clock: FakeClock, store: CooldownStore | None = None, **policy: Any) -> RetryEnvelope:
    store = store if store is not None else MemoryCooldownStore()
    breaker = CircuitBreaker(
        store, threshold=3, cool_off=COOL_OFF, window=WINDOW, trial_seconds=20, clock=clock
    )
    return RetryEnvelope(
        RetryPolicy(**{"attempts": 1, **policy}),
        cooldown=store,
        breaker=breaker,
        clock=clock,
        sleep=clock.sleep,
        asleep=clock.asleep,
        random=lambda: 0.0,
        hook=lambda e: None,
    )


def outcome(env: RetryEnvelope, script: Script) -> Any:
    try:
        return env.call(script, key=KEY, provider="openai", model="gpt-4o")
    except AgentExecutionError as error:
        return error


def trip(env: RetryEnvelope) -> None:
    for _ in range(3):
        outcome(env, Script(status_error(503)))
    assert env.breaker is not None
    assert env.breaker.state(KEY).state == "open"


def lease_holders(env: RetryEnvelope, clock: FakeClock) -> list[str | None]:
    assert env.cooldown is not None
    return [e.owner for e in env.cooldown.entries(clock.now) if e.key == TRIAL + KEY]


@pytest.mark.parametrize(
    "ending",
    [
        status_error(429, {"error": {"message": "Rate limit reached"}}),
        status_error(401, {"error": {"message": "Incorrect API key provided"}}),
        status_error(400, {"error": {"message": "Unrecognized request argument"}}),
        ValueError("a bug in the caller's code"),
    ],
    ids=["429", "401", "400", "bug"],
)
def test_a_trial_without_a_verdict_gives_its_lease_back(ending: Exception) -> None:
    clock = FakeClock()
    env = envelope(clock)
    trip(env)
    clock.now += COOL_OFF
    error = outcome(env, Script(ending))
    assert isinstance(error, AgentExecutionError)
    assert error.code != "llm.circuit_open"
    assert lease_holders(env, clock) == []
    # The very next call is the new trial, and the healthy provider closes it.
    assert outcome(env, Script("ok")) == "ok"
    assert env.breaker is not None
    assert env.breaker.state(KEY).state == "closed"


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, SystemExit, GeneratorExit])
def test_a_trial_interrupted_by_the_user_gives_its_lease_back(
    interrupt: type[BaseException],
) -> None:
    clock = FakeClock()
    env = envelope(clock)
    trip(env)
    clock.now += COOL_OFF
    with pytest.raises(interrupt):
        env.call(Script(interrupt()), key=KEY)
    assert lease_holders(env, clock) == []
    assert outcome(env, Script("ok")) == "ok"


def test_a_cancelled_async_trial_gives_its_lease_back() -> None:
    clock = FakeClock()
    env = envelope(clock)
    trip(env)
    clock.now += COOL_OFF

    async def main() -> None:
        started = asyncio.Event()

        async def hangs() -> str:
            started.set()
            await asyncio.Event().wait()  # a provider that never answers
            return "never"

        task = asyncio.ensure_future(env.acall(hangs, key=KEY))
        await started.wait()
        assert len(lease_holders(env, clock)) == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert lease_holders(env, clock) == []
    assert outcome(env, Script("ok")) == "ok"


def test_a_dead_trial_owner_blocks_only_until_its_lease_ends() -> None:
    clock = FakeClock()
    env = envelope(clock)
    trip(env)
    clock.now += COOL_OFF
    assert env.breaker is not None
    owner = env.breaker.check(KEY)  # a process takes the trial, then is killed: no release
    assert owner is not None
    refused = outcome(env, Script("never"))
    assert refused.code == "llm.circuit_open"
    assert "trial call is in progress" in refused.message
    lease = env.breaker.lease_ttl()
    assert lease == 25.0  # trial_seconds 20 + a quarter of it
    assert refused.retry_after == pytest.approx(lease)
    assert refused.details["trial_owner"] == owner
    clock.now += lease
    assert outcome(env, Script("ok")) == "ok"  # the lease ended by itself
    assert env.breaker.state(KEY).state == "closed"


def test_a_trials_own_retries_run_under_its_lease() -> None:
    clock = FakeClock()
    store = MemoryCooldownStore()
    trip(envelope(clock, store))
    env = envelope(clock, store, attempts=3)
    clock.now += COOL_OFF
    limited = status_error(
        429, {"error": {"message": "Rate limit reached"}}, headers={"retry-after": "2"}
    )
    script = Script(limited, "ok", clock=clock)
    assert outcome(env, script) == "ok"
    assert script.calls == 2
    assert clock.waits == [2.0]
    assert lease_holders(env, clock) == []


def test_a_trial_that_fails_again_reopens_at_once() -> None:
    clock = FakeClock()
    store = MemoryCooldownStore()
    trip(envelope(clock, store))
    env = envelope(clock, store, attempts=3)
    clock.now += COOL_OFF
    script = Script(status_error(503), "never")
    error = outcome(env, script)
    assert script.calls == 1  # no retry into a breaker that just reopened
    assert "the circuit breaker opened" in error.message
    assert env.breaker is not None
    state = env.breaker.state(KEY)
    assert (state.state, state.opens_for) == ("open", COOL_OFF)
    assert lease_holders(env, clock) == []


def test_half_open_ends_by_itself() -> None:
    clock = FakeClock()
    env = envelope(clock)
    trip(env)
    assert env.breaker is not None
    clock.now += COOL_OFF + 1
    assert env.breaker.state(KEY).state == "half_open"
    clock.now += WINDOW
    assert env.breaker.state(KEY).state == "closed"


def test_failure_counts_expire() -> None:
    clock = FakeClock()
    env = envelope(clock)
    for _ in range(2):
        outcome(env, Script(status_error(503)))
    clock.now += WINDOW + 1  # the run of failures is over
    for _ in range(2):
        outcome(env, Script(status_error(503)))
    assert env.breaker is not None
    state = env.breaker.state(KEY)
    assert (state.state, state.failures) == ("closed", 2)


def test_a_success_in_one_process_resets_the_failures_of_another(tmp_path: Path) -> None:
    clock = FakeClock()
    path = tmp_path / "shared.sqlite3"
    worker_a = envelope(clock, SqliteCooldownStore(path))
    worker_b = envelope(clock, SqliteCooldownStore(path))
    outcome(worker_a, Script(status_error(503)))
    outcome(worker_a, Script(status_error(503)))
    assert outcome(worker_b, Script("ok")) == "ok"  # b never failed, yet its success counts
    outcome(worker_a, Script(status_error(503)))
    assert worker_a.breaker is not None
    state = worker_a.breaker.state(KEY)
    assert (state.state, state.failures) == ("closed", 1)


def test_a_planted_ten_day_window_waits_at_most_the_cap(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    store = MemoryCooldownStore()
    store.extend(COOLDOWN + KEY, 864_000.0, clock.now)
    env = envelope(clock, store)
    with caplog.at_level(logging.WARNING, logger="fluid_build.cooldown"):
        assert outcome(env, Script("ok")) == "ok"
    assert clock.waits == [300.0]
    assert store.remaining(COOLDOWN + KEY, clock.now) == 0.0  # repaired for everyone
    assert caplog.text.count("beyond its 5 min cap") == 1


def test_a_planted_open_window_is_cut_to_the_cool_off() -> None:
    clock = FakeClock()
    store = MemoryCooldownStore()
    env = envelope(clock, store)
    trip(env)
    store.extend("breaker-open:" + KEY, 864_000.0, clock.now)
    refused = outcome(env, Script("never"))
    assert refused.retry_after == pytest.approx(COOL_OFF)
    clock.now += COOL_OFF
    assert outcome(env, Script("ok")) == "ok"


def test_deadlines_run_on_the_monotonic_clock_not_the_wall_clock() -> None:
    monotonic = FakeClock()
    wall = FakeClock()
    store = MemoryCooldownStore()
    env = RetryEnvelope(
        RetryPolicy(attempts=3, deadline=10.0),
        cooldown=store,
        clock=monotonic,
        wall=wall,
        sleep=monotonic.sleep,
        random=lambda: 0.0,
        hook=lambda e: None,
    )

    sent: list[float] = []

    def send() -> str:
        sent.append(wall.now)
        if len(sent) == 1:
            wall.now += 3600  # an NTP step forwards in the middle of the call
            raise httpx.ConnectError("refused")
        return "ok"

    # With the deadline on the wall clock the call would give up: an hour is
    # past its 10 s. On the monotonic clock it backs off 1 s and succeeds.
    assert env.call(send, key=KEY) == "ok"
    assert len(sent) == 2
    assert monotonic.waits == [1.0]


def test_each_state_change_logs_one_line_not_each_call(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    env = envelope(clock)
    with caplog.at_level(logging.INFO):
        trip(env)
        for _ in range(5):
            outcome(env, Script("never"))  # refused while open: no line each
        clock.now += COOL_OFF
        assert outcome(env, Script("ok")) == "ok"
        for _ in range(5):
            assert outcome(env, Script("ok")) == "ok"
    lines = [r.getMessage() for r in caplog.records if r.name == "fluid_build.breaker"]
    assert [line.split(":", 1)[0] for line in lines] == [f"circuit for {KEY.split(':')[0]}"] * 3
    assert "opened: 3 consecutive failures" in lines[0]
    assert "half-open" in lines[1]
    assert "closed: a call succeeded" in lines[2]


# -- endpoints -------------------------------------------------------------------------

A = "http://127.0.0.1:8001/v1"
B = "http://127.0.0.1:8002/v1"
OK = {"choices": [{"message": {"role": "assistant", "content": "ok"}}]}


def test_two_endpoints_never_share_a_cooldown_or_a_breaker() -> None:
    clock = FakeClock()
    store = MemoryCooldownStore()
    env = envelope(clock, store)
    server_a = LLMClient("vllm", "llama", base_url=A, envelope=env, env={})
    server_b = LLMClient("vllm", "llama", base_url=B, envelope=env, env={})
    assert server_a.health_key != server_b.health_key
    with respx.mock() as mock:
        mock.post(f"{A}/chat/completions").respond(
            429, json={"error": {"message": "Rate limit reached"}}, headers={"retry-after": "30"}
        )
        route_b = mock.post(f"{B}/chat/completions").respond(200, json=OK)
        with pytest.raises(RateLimitError):
            server_a.complete("hi")
        assert server_b.complete("hi").text == "ok"
        assert clock.waits == []  # A's window never held B back
        mock.post(f"{A}/chat/completions").respond(503, json={"error": {"message": "down"}})
        for _ in range(3):
            with pytest.raises(ProviderServerError):
                server_a.complete("hi")
        assert [h["breaker"] for h in server_a.health()] == ["open"]
        assert [h["breaker"] for h in server_b.health()] == ["closed"]
        assert server_b.complete("hi").text == "ok"
        assert route_b.call_count == 2
    server_a.reset_health()  # the Python twin of `fluid doctor --reset`
    assert [h["breaker"] for h in server_a.health()] == ["closed"]
    assert store.entries(clock.now) == []
    server_a.close()
    server_b.close()


def test_an_answer_to_a_request_sent_before_it_opened_does_not_close_it() -> None:
    clock = FakeClock()
    store = MemoryCooldownStore()
    breaker = CircuitBreaker(store, threshold=1, cool_off=COOL_OFF, window=WINDOW, clock=clock)
    sent_at = clock.now
    assert breaker.check(KEY) is None  # call A goes out
    clock.now += 1
    breaker.record_failure(KEY, ProviderServerError("503", code="llm.server_error"))  # B opens it
    breaker.record_success(KEY, sent_at=sent_at)  # A's late 200 predates the opening
    assert breaker.state(KEY).state == "open"
    breaker.record_success(KEY, sent_at=clock.now)  # a request sent since: the provider answers
    assert breaker.state(KEY).state == "closed"


# -- a deliberate reset is never skipped because the store is busy ---------------------------


def _hold_write_lock(path: Path) -> sqlite3.Connection:
    """Another process's writer, mid-transaction: it holds the file's write lock."""
    holder = sqlite3.connect(path, timeout=0, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    return holder


def test_reset_health_waits_out_a_busy_writer_instead_of_skipping(tmp_path: Path) -> None:
    clock = FakeClock()
    path = tmp_path / "shared.sqlite3"
    store = ResilientCooldownStore(SqliteCooldownStore(path), clock=clock)
    env = envelope(clock, store)
    client = LLMClient("vllm", "llama", base_url=A, envelope=env, env={})
    with respx.mock() as mock:
        mock.post(f"{A}/chat/completions").respond(503, json={"error": {"message": "down"}})
        for _ in range(3):
            with pytest.raises(ProviderServerError):
                client.complete("hi")
    assert [h["breaker"] for h in client.health()] == ["open"]
    holder = _hold_write_lock(path)
    # A write meets the lock first, so the store pauses its own writes for a while...
    store.extend(COOLDOWN + "other", 5.0, clock.now)
    assert store.contended == 1
    # ...and the lock is let go while the reset is waiting for it.
    release = threading.Timer(0.3, holder.commit)
    release.start()
    try:
        client.reset_health()
    finally:
        release.join()
        holder.close()
    assert [h["breaker"] for h in client.health()] == ["closed"]
    reader = SqliteCooldownStore(path)  # what every other process now reads
    assert [e.key for e in reader.entries(time.time())] == []
    client.close()


def test_a_reset_that_cannot_reach_the_store_says_so(tmp_path: Path) -> None:
    path = tmp_path / "shared.sqlite3"
    store = ResilientCooldownStore(SqliteCooldownStore(path))
    store.extend(COOLDOWN + KEY, 30.0, time.time())
    holder = _hold_write_lock(path)
    try:
        with pytest.raises(StoreResetError, match=r"held its write lock for 0\.2 s") as caught:
            reset_keys(store, [COOLDOWN + KEY], wait=0.2)
    finally:
        holder.close()
    assert isinstance(caught.value, FluidError)
    assert "fluid doctor --reset" in str(caught.value)
    assert store.remaining(COOLDOWN + KEY, time.time()) > 0  # nothing was cleared: it says so

    class Down(MemoryCooldownStore):
        def delete(self, *keys: str) -> None:
            raise ConnectionError("redis://:hunter2@cache:6379 refused")

    with pytest.raises(StoreResetError, match="ConnectionError") as down:
        reset_keys(ResilientCooldownStore(Down()), [COOLDOWN + KEY])
    assert "hunter2" not in str(down.value)


def test_a_store_being_made_by_another_process_is_waited_for_not_skipped(tmp_path: Path) -> None:
    """Two processes starting at once both make the file; the second waits, once."""
    path = tmp_path / "shared.sqlite3"
    maker = sqlite3.connect(path, timeout=0, isolation_level=None, check_same_thread=False)
    maker.execute("BEGIN EXCLUSIVE")  # mid-setup: nobody else may touch the file
    release = threading.Timer(0.3, maker.commit)
    release.start()
    store = ResilientCooldownStore(SqliteCooldownStore(path))
    try:
        store.extend(COOLDOWN + KEY, 30.0, time.time())
    finally:
        release.join()
        maker.close()
    assert store.contended == 0
    assert SqliteCooldownStore(path).remaining(COOLDOWN + KEY, time.time()) > 0  # shared


def test_a_busy_read_does_not_keep_the_next_write_from_the_shared_store() -> None:
    class BusyOnce(MemoryCooldownStore):
        busy = True

        def peek(self, keys: Any, now: float) -> list[tuple[float, int]]:
            if self.busy:
                self.busy = False
                raise sqlite3.OperationalError("database is locked")
            return super().peek(keys, now)

    primary = BusyOnce()
    store = ResilientCooldownStore(primary)
    assert store.peek([COOLDOWN + KEY], 0.0) == [(0.0, 0)]  # answered by the mirror
    assert store.contended == 1
    store.extend(COOLDOWN + KEY, 30.0, 0.0)
    assert primary.remaining(COOLDOWN + KEY, 0.0) == 30.0  # the write reached the store
