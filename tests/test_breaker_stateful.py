"""The circuit breaker as a state machine: several workers, one shared store, one virtual clock.

Each simulated worker is a process of its own: its own :class:`CircuitBreaker`,
its own :class:`RetryEnvelope` and (for sqlite and Redis) its own handle on the
shared store. A worker's call is a real ``RetryEnvelope.acall`` coroutine,
stepped by hand: it runs until it would send, stays in flight while the
machine does other things, and ends when a rule sends it the provider's
answer, throws an error or a cancellation into it, or drops it for good (the
worker died: nothing is given back, its lease has to expire by itself).

The machine keeps a model of what the breaker documents (the failure count
and its window, the open and half-open windows, the trial lease) and checks,
after every step and through every worker's handle on the store:

1. one trial at a time: the store holds at most one lease, the model's, and
   a worker's lease lasts until the expiry it was granted unless a verdict (a
   success, its own failure, its release) ended it;
2. liveness: once the provider is healthy, a call gets through and closes the
   breaker after ``max(cool_off, lease_ttl)`` of simulated time (tighter than
   the documented ``cool_off + lease_ttl``);
3. nothing is refused longer than documented: a refusal's ``retry_after`` is
   at most ``max(cool_off, lease_ttl)`` and exactly what is left of the open
   window or of the holder's lease; the breaker is open for at most
   ``cool_off`` after it last opened;
4. ``state()`` is one of the three states, the model's, and agrees with
   every refusal, whichever process reads it.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import os
from collections.abc import Callable, Coroutine, Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from fluid_build.copilot.agents.errors import AgentExecutionError, ProviderServerError
from fluid_build.copilot.call.envelope import RetryEnvelope, RetryPolicy
from fluid_build.copilot.health.breaker import TRIAL, CircuitBreaker
from fluid_build.copilot.health.cooldown import (
    CooldownStore,
    MemoryCooldownStore,
    RedisCooldownStore,
    SqliteCooldownStore,
)
from tests.fakes import FakeClock
from tests.helpers import status_error

START = FakeClock().now
KEY = "openai|https://api.openai.com/v1|abc|gpt-4o"
THRESHOLD = 3
COOL_OFF = 30.0
WINDOW = 60.0
TRIAL_SECONDS = 20.0
WORKERS = 4
# A call's policy deadline (drawn per call): as the trial, its lease lasts 25, 7.5 or 2.5 s.
DEADLINES: tuple[float | None, ...] = (None, 6.0, 2.0)
# One step of simulated time: every lease and window length, and a few others.
STEPS = (1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 25.0, 30.0, 31.0, 60.0, 90.0, 0.5)
# How an in-flight call ends. "answer" and "slow" depend on the provider's health when
# the call was sent: a healthy provider answers 200, a failing one 503 or times out.
ENDINGS = ("answer", "slow", "answer", "429", "401", "cancel", "die")
COUNTS = {"503", "timeout"}

# Examples per store (derandomized, see tests/conftest.py): about 20 s for the three.
EXAMPLES = {"memory": 100, "sqlite": 70, "redis": 50}


def lease_ttl(deadline: float | None) -> float:
    """The documented lease: the trial's deadline (at most trial_seconds) plus its margin."""
    bound = TRIAL_SECONDS if deadline is None else min(deadline, TRIAL_SECONDS)
    return bound + min(5.0, max(0.5, bound / 4))


MAX_LEASE = max(lease_ttl(d) for d in DEADLINES)
# Invariants 2 and 3: the longest any refusal may ask a caller to wait.
MAX_REFUSAL = max(COOL_OFF, MAX_LEASE)


def at(now: float) -> str:
    return f"t+{now - START:g}"


# -- the model -------------------------------------------------------------------------


@dataclass
class Model:
    """What the breaker documents, for one key. Every time is the virtual wall clock."""

    failures: int = 0
    failures_until: float = -math.inf
    open_until: float = -math.inf
    half_until: float = -math.inf
    opened_at: float | None = None
    lease_owner: str | None = None
    lease_until: float = -math.inf

    def count(self, now: float) -> int:
        return self.failures if self.failures_until > now else 0

    def state(self, now: float) -> str:
        if self.open_until > now:
            return "open"
        if self.half_until > now:
            return "half_open"
        return "closed"

    def holder(self, now: float) -> str | None:
        return self.lease_owner if self.lease_until > now else None

    def admit(self, now: float) -> tuple[str, float]:
        """A new call's fate: ("pass" | "trial" | "refused", the refusal's retry_after)."""
        state = self.state(now)
        if state == "closed":
            return "pass", 0.0
        if state == "open":
            return "refused", self.open_until - now
        if self.holder(now) is not None:
            return "refused", max(self.lease_until - now, 1.0)
        return "trial", 0.0

    def grant(self, owner: str, now: float, ttl: float) -> None:
        self.lease_owner, self.lease_until = owner, now + ttl

    def release(self, owner: str | None) -> None:
        if owner is not None and owner == self.lease_owner:
            self.lease_owner, self.lease_until = None, -math.inf

    def success(self) -> None:
        vars(self).update(vars(Model()))  # a success clears everything, for everyone

    def fail(self, now: float, trial: str | None) -> None:
        """A failure that counts, from a plain call or (``trial``) from the trial."""
        self.failures = self.failures + 1 if self.failures_until > now else 1
        self.failures_until = now + WINDOW
        if self.failures < THRESHOLD and trial is None:
            return
        if self.open_until > now:
            return  # already open
        self.open_until = now + COOL_OFF
        self.half_until = max(self.half_until, now + COOL_OFF + WINDOW)
        self.opened_at = now
        self.release(trial)


# -- workers, their calls and their stores ---------------------------------------------------


class Answer:
    """What a provider call awaits: the machine sends the answer or throws the error."""

    def __await__(self) -> Generator[Answer, Any, Any]:
        return (yield self)


async def provider_call() -> Any:
    return await Answer()


class RecordingBreaker(CircuitBreaker):
    """The breaker, remembering the lease its last admitted trial got."""

    trial: str | None = None

    def check(self, key: str, **kwargs: Any) -> str | None:
        owner = super().check(key, **kwargs)
        if owner is not None and kwargs.get("owner") is None:
            self.trial = owner
        return owner


@dataclass
class Worker:
    name: str
    store: CooldownStore
    breaker: RecordingBreaker
    call: Coroutine[Any, Any, Any] | None = None
    owner: str | None = None  # the lease the call in flight holds, when it is the trial
    granted_until: float = -math.inf
    sent_healthy: bool = True


@dataclass
class Handles:
    """Per-example handles on one shared store, one per worker, and how to drop them."""

    stores: list[CooldownStore]
    cleanup: Callable[[], None] = lambda: None


@dataclass
class StoreFactory:
    """Fresh shared state for every example: a new memory store, sqlite file or Redis prefix."""

    kind: str
    tmp: Path
    redis_url: str | None = None
    _ids: Iterator[int] = field(default_factory=itertools.count)
    _clients: list[Any] = field(default_factory=list)

    def open(self, count: int) -> Handles:
        n = next(self._ids)
        if self.kind == "memory":
            return Handles([MemoryCooldownStore()] * count)
        if self.kind == "sqlite":
            path = self.tmp / f"example-{n}.sqlite3"
            sqlite = [SqliteCooldownStore(path) for _ in range(count)]

            def close_sqlite() -> None:
                for store in sqlite:
                    store.close()

            return Handles(list(sqlite), close_sqlite)
        import redis

        assert self.redis_url is not None
        while len(self._clients) < count:  # one connection per process, for every example
            self._clients.append(redis.Redis.from_url(self.redis_url))
        prefix = f"test:breaker-stateful:{os.getpid()}:{n}:"
        handles = [RedisCooldownStore(client=c, prefix=prefix) for c in self._clients[:count]]

        def clear_redis() -> None:
            handles[0].clear()

        return Handles(list(handles), clear_redis)

    def close(self) -> None:
        for client in self._clients:
            client.close()
        self._clients.clear()


def resume(coro: Coroutine[Any, Any, Any], exc: BaseException | None) -> BaseException | str:
    """Resume an in-flight call with a 200 (``exc is None``) or an error; what it ended with."""
    try:
        if exc is None:
            coro.send("ok")
        else:
            coro.throw(exc)
    except StopIteration as stop:
        return str(stop.value)
    except BaseException as ended:  # the call's own ending, judged by the caller
        return ended
    raise AssertionError("the call asked to send again: the policy allows one attempt")


ERRORS: dict[str, Callable[[], BaseException | None]] = {
    "success": lambda: None,
    "503": lambda: status_error(503),
    "timeout": lambda: httpx.ReadTimeout("slow"),
    "429": lambda: status_error(429),
    "401": lambda: status_error(401),
    "cancel": asyncio.CancelledError,
}


class BreakerMachine(RuleBasedStateMachine):
    """Workers sharing one breaker key through one store, on one virtual clock."""

    factory: StoreFactory  # set per store kind by machine_for()

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.handles = self.factory.open(WORKERS + 1)
        self.workers = [self._worker(f"w{i}", self.handles.stores[i]) for i in range(WORKERS)]
        # The liveness probe: one more process, trying once the provider is healthy.
        self.probe = self._worker("probe", self.handles.stores[WORKERS])
        self.model = Model()
        self.healthy = False  # the provider starts out failing; flip_health() heals it
        self.dead: list[Coroutine[Any, Any, Any]] = []
        self.told: tuple[Worker, float] | None = None  # the last refusal: who, how long
        self.turn = 0
        self.trace: list[str] = []

    def _worker(self, name: str, store: CooldownStore) -> Worker:
        breaker = RecordingBreaker(
            store,
            threshold=THRESHOLD,
            cool_off=COOL_OFF,
            window=WINDOW,
            trial_seconds=TRIAL_SECONDS,
            clock=self.clock,
        )
        return Worker(name, store, breaker)

    def envelope(self, worker: Worker, deadline: float | None) -> RetryEnvelope:
        return RetryEnvelope(
            RetryPolicy(attempts=1, deadline=deadline),
            cooldown=None,  # the breaker alone: no cooldown waits inside a call
            breaker=worker.breaker,
            clock=self.clock,
            sleep=self.clock.sleep,
            asleep=self.clock.asleep,
            hook=lambda e: None,
            random=lambda: 0.0,
        )

    def teardown(self) -> None:
        try:
            for worker in [*self.workers, self.probe]:
                if worker.call is not None:
                    self.dead.append(worker.call)
                    worker.call = None
            for coro in self.dead:
                coro.close()
        finally:
            self.handles.cleanup()

    @property
    def now(self) -> float:
        return self.clock.now

    def log(self, line: str) -> None:
        self.trace.append(f"{at(self.now)}: {line}")

    def story(self) -> str:
        return "\nwhat happened:\n  " + "\n  ".join(self.trace[-30:])

    def views(self) -> list[Worker]:
        """The workers whose handles the checks read through: every distinct view of the store.

        Sqlite handles each cache what they read, so every one is checked each time;
        Redis handles differ only by their connection, so one a step, in turn.
        """
        everyone = [*self.workers, self.probe]
        if self.factory.kind == "redis":
            self.turn += 1
            return [everyone[self.turn % len(everyone)]]
        return everyone

    def pick(self, index: int, *, busy: bool) -> Worker:
        """Worker ``index`` if it is idle (busy), else the next one that is."""
        for k in range(WORKERS):
            worker = self.workers[(index + k) % WORKERS]
            if (worker.call is not None) == busy:
                return worker
        raise AssertionError("unreachable: the rule's precondition")

    # -- the rules ---------------------------------------------------------------------

    def any_idle(self) -> bool:
        return any(w.call is None for w in self.workers)

    def any_busy(self) -> bool:
        return any(w.call is not None for w in self.workers)

    @precondition(any_idle)
    @rule(worker=st.integers(0, WORKERS - 1), deadline=st.sampled_from(DEADLINES))
    def start_call(self, worker: int, deadline: float | None) -> None:
        """A worker starts a call; it stays in flight."""
        self.start(self.pick(worker, busy=False), deadline)

    @precondition(any_idle)
    @rule(
        worker=st.integers(0, WORKERS - 1),
        deadline=st.sampled_from(DEADLINES),
        ending=st.sampled_from(ENDINGS),
    )
    def whole_call(self, worker: int, deadline: float | None, ending: str) -> None:
        """A call that starts and ends while nothing else happens."""
        chosen = self.pick(worker, busy=False)
        if self.start(chosen, deadline):
            self.end(chosen, ending)

    @precondition(any_busy)
    @rule(worker=st.integers(0, WORKERS - 1), ending=st.sampled_from(ENDINGS))
    def end_call(self, worker: int, ending: str) -> None:
        """A call in flight ends: an answer, an error, a cancellation, or its worker dies."""
        self.end(self.pick(worker, busy=True), ending)

    @precondition(lambda self: self.told is not None and self.told[0].call is None)
    @rule(deadline=st.sampled_from(DEADLINES))
    def obey_retry_after(self, deadline: float | None) -> None:
        """The last refused worker sleeps exactly as long as it was told, then tries again."""
        assert self.told is not None
        worker, wait = self.told
        self.told = None
        self.clock.now += wait
        self.log(f"{worker.name} slept the {wait:g} s it was told")
        self.start(worker, deadline)

    @rule(seconds=st.sampled_from(STEPS))
    def advance(self, seconds: float) -> None:
        self.clock.now += seconds
        self.log(f"{seconds:g} s pass")

    @rule()
    def flip_health(self) -> None:
        self.healthy = not self.healthy
        self.log("the provider is " + ("healthy" if self.healthy else "failing"))

    @precondition(lambda self: self.healthy)
    @rule()
    def healthy_provider_gets_through(self) -> None:
        """Invariant 2: after the longest documented lock-out, a call gets through."""
        self.clock.now += MAX_REFUSAL
        self.log(f"{MAX_REFUSAL:g} s pass; the probe tries")
        state = self.probe.breaker.state(KEY)
        assert state.state != "open", (
            f"still open {MAX_REFUSAL:g} s later (last opened at "
            f"{at(self.model.opened_at or START)}): {state}{self.story()}"
        )
        assert self.start(self.probe, None), (
            f"refused after waiting out every window and lease{self.story()}"
        )
        self.end(self.probe, "answer")
        for worker in self.views():
            state = worker.breaker.state(KEY)
            assert (state.state, state.failures) == ("closed", 0), (worker.name, state)

    # -- what the rules do -------------------------------------------------------------

    def start(self, worker: Worker, deadline: float | None) -> bool:
        """Start ``worker``'s call; True when it was let through (it is now in flight)."""
        expected, wait = self.model.admit(self.now)
        worker.breaker.trial = None
        coro = self.envelope(worker, deadline).acall(
            provider_call, key=KEY, provider="openai", model="gpt-4o"
        )
        try:
            coro.send(None)
        except ProviderServerError as refused:
            self.log(f"{worker.name} (deadline {deadline}) refused: {refused.message}")
            self.refused(worker, refused, expected, wait)
            return False
        owner = worker.breaker.trial
        how = f"the trial, lease {owner}" if owner else "not a trial"
        self.log(f"{worker.name} (deadline {deadline}) sends: {how}")
        assert expected != "refused", (
            f"{worker.name} was let through, but the breaker is {self.model.state(self.now)} "
            f"(lease {self.model.holder(self.now)}) and should have refused it{self.story()}"
        )
        assert (owner is not None) == (expected == "trial"), (
            f"{worker.name}: expected {expected}, got trial lease {owner}{self.story()}"
        )
        worker.call, worker.owner, worker.sent_healthy = coro, owner, self.healthy
        if owner is not None:
            ttl = lease_ttl(deadline)
            self.model.grant(owner, self.now, ttl)
            worker.granted_until = self.now + ttl
        return True

    def refused(
        self, worker: Worker, error: ProviderServerError, expected: str, wait: float
    ) -> None:
        assert error.code == "llm.circuit_open"
        assert expected == "refused", (
            f"{worker.name} was refused but the breaker should let it through "
            f"({expected}; model {self.model}){self.story()}"
        )
        retry_after = error.retry_after
        assert retry_after is not None
        # Invariant 3: never refused longer than documented, nor longer than what is left.
        assert 0 < retry_after <= MAX_REFUSAL, f"refused for {retry_after} s{self.story()}"
        assert retry_after == pytest.approx(wait, abs=1e-6), (
            f"{worker.name} was told to wait {retry_after:g} s; what is left is {wait:g} s "
            f"(model {self.model}){self.story()}"
        )
        self.told = (worker, retry_after)
        # Invariant 4: the refusal agrees with state(), as every process reads it.
        for other in self.views():
            state = other.breaker.state(KEY)
            if "trial call is in progress" in error.message:
                assert state.state == "half_open", (other.name, state, error.message)
                assert state.trial_owner == error.details["trial_owner"], (other.name, state)
            else:
                assert state.state == "open", (other.name, state, error.message)
                assert state.opens_for == pytest.approx(retry_after, abs=1e-6)

    def end(self, worker: Worker, ending: str) -> None:
        coro, owner = worker.call, worker.owner
        assert coro is not None
        worker.call, worker.owner, worker.granted_until = None, None, -math.inf
        if ending == "answer":
            outcome = "success" if worker.sent_healthy else "503"
        elif ending == "slow":
            outcome = "success" if worker.sent_healthy else "timeout"
        else:
            outcome = ending
        role = f" (the trial, lease {owner})" if owner else ""
        self.log(f"{worker.name}'s call{role} ends: {outcome}")
        if outcome == "die":  # killed mid-call: nothing runs, nothing is given back
            self.dead.append(coro)
            return
        ended = resume(coro, ERRORS[outcome]())
        if outcome == "success":
            assert ended == "ok", ended
            self.model.success()
            return
        if outcome == "cancel":
            assert isinstance(ended, asyncio.CancelledError), ended
        else:
            assert isinstance(ended, AgentExecutionError), ended
            assert ended.counts_toward_breaker == (outcome in COUNTS), (outcome, ended.code)
        if outcome in COUNTS:
            self.model.fail(self.now, owner)
        self.model.release(owner)  # the envelope gives the lease back, whatever the ending

    # -- the invariants ----------------------------------------------------------------

    @invariant()
    def state_matches_the_model(self) -> None:
        """Invariants 3 and 4 through every handle: a documented state, within its bounds."""
        now, model = self.now, self.model
        expected = model.state(now)
        for worker in self.views():
            state = worker.breaker.state(KEY)
            where = f"{worker.name} reads {state}\nthe model: {model}{self.story()}"
            assert state.state in {"closed", "open", "half_open"}, where
            assert state.state == expected, where
            assert state.failures == model.count(now), where
            if state.state == "open":
                assert model.opened_at is not None
                assert 0 < state.opens_for <= COOL_OFF, where
                assert state.until == pytest.approx(model.opened_at + COOL_OFF, abs=1e-6), where
            if state.state == "half_open":
                assert state.opens_for == 0.0, where
                assert state.until == pytest.approx(model.half_until, abs=1e-6), where
            if state.state != "closed":
                assert state.trial_owner == model.holder(now), where
                left = model.lease_until - now if model.holder(now) else 0.0
                assert state.trial_ends_in == pytest.approx(left, abs=1e-6), where

    @invariant()
    def one_trial_at_a_time(self) -> None:
        """Invariant 1: at most one live lease, the model's; no lease is cut short."""
        now = self.now
        leases = [e for e in self.workers[0].store.entries(now) if e.key == TRIAL + KEY]
        assert len(leases) <= 1, leases
        holder = self.model.holder(now)
        for w in self.workers:
            # In flight as the trial, its lease granted until later and not ended by a
            # verdict (a success, its own failure, a release): it must still hold it.
            if w.call is not None and w.owner is not None and w.owner == holder:
                assert [(e.owner, e.until) for e in leases] == [(w.owner, w.granted_until)], (
                    f"{w.name}'s trial lease {w.owner}, granted until {at(w.granted_until)}, "
                    f"is not the store's at {at(now)}: {leases}{self.story()}"
                )
        assert [e.owner for e in leases] == ([holder] if holder else []), (
            f"the store's lease {leases}, the model's {holder}{self.story()}"
        )


def machine_for(factory: StoreFactory) -> type[BreakerMachine]:
    return type(f"BreakerMachine_{factory.kind}", (BreakerMachine,), {"factory": factory})


@pytest.mark.parametrize("kind", ["memory", "sqlite", "redis"])
def test_breaker_state_machine(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="fluid_build")  # every opening logs a warning
    profile = settings.default
    # The explore profile (`nox -s fuzz`) searches further, within reason.
    examples = EXAMPLES[kind] if profile.derandomize else min(profile.max_examples, 2000)
    url = request.getfixturevalue("redis_url") if kind == "redis" else None
    factory = StoreFactory(kind, tmp_path, url)
    try:
        run_state_machine_as_test(
            machine_for(factory),
            settings=settings(
                profile,
                max_examples=examples,
                stateful_step_count=40,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow],
            ),
        )
    finally:
        factory.close()


def test_a_refused_caller_never_shortens_the_trials_lease() -> None:
    """The machine's shortest counterexample, spelled out: one trial at a time, whatever the
    deadlines. A caller refused while a trial is out must not cut the holder's lease down to
    the lease its own (shorter) deadline would get."""
    clock = FakeClock()
    store = MemoryCooldownStore()
    first, second = (
        CircuitBreaker(store, threshold=1, cool_off=30, trial_seconds=20, clock=clock)
        for _ in range(2)
    )
    first.record_failure(KEY, ProviderServerError("x"))
    clock.now += 30
    holder = first.check(KEY)  # the trial: a lease of 20 + 5 s
    assert holder is not None
    with pytest.raises(ProviderServerError) as refused:
        second.check(KEY, deadline=2.0)  # its own lease would be 2.5 s
    assert refused.value.retry_after == 25.0
    clock.now += 3  # 3 s into a trial allowed 20 s
    assert first.state(KEY).trial_owner == holder
    with pytest.raises(ProviderServerError, match="trial call is in progress"):
        second.check(KEY)  # a second trial while the first is still out
