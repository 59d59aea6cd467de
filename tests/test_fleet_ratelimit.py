"""A fleet on one Redis keeps sharing across a Redis restart, and never fails a call for it.

The store that wraps Redis (:class:`ResilientCooldownStore`) goes on in memory
while Redis is down and tries it again soon, one attempt per process at a
time: first a schedule on an injected clock, then real worker processes
calling ``LLMClient.complete`` through a real redis-server that is killed and
started again on the same port (its state lost, as a restart without
persistence is). benchmarks/bench_ratelimit.py ``--fleet`` measures the same
on 4 hosts of 4 processes (docs/benchmarks.md).
"""

from __future__ import annotations

import itertools
import multiprocessing
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from fluid_build.copilot.health.keys import CooldownKey
from fluid_build.copilot.health.ratelimit import TOKENS, RateLimiter
from fluid_build.copilot.health.resilient import ResilientCooldownStore
from fluid_build.copilot.health.store import MemoryCooldownStore
from tests.ratelimit_server import RateLimitedProvider, RestartableRedis, serving

NOW = 1_700_000_000.0
#: Sharing must resume this soon after Redis answers again (issue 25).
RESUME_WITHIN = 5.0


class Tick:
    """An injected monotonic clock."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Outage:
    """A store that refuses every operation while ``down`` is set, like a stopped Redis."""

    def __init__(self) -> None:
        self.down = False
        self.tries: list[float] = []
        self.clock: Tick | None = None
        self.inner = MemoryCooldownStore()
        self.refuse: Callable[[], None] = self.refused

    @staticmethod
    def refused() -> None:
        raise ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

    def __getattr__(self, op: str) -> Any:
        inner = getattr(self.inner, op)

        def call(*args: Any) -> Any:
            self.tries.append(self.clock() if self.clock else 0.0)
            if self.down:
                self.refuse()
            return inner(*args)

        return call


def outage_store() -> tuple[ResilientCooldownStore, Outage, Tick]:
    tick, primary = Tick(), Outage()
    primary.clock = tick
    return ResilientCooldownStore(primary, clock=tick), primary, tick


def test_a_store_back_after_a_restart_is_used_again_within_seconds() -> None:
    store, primary, tick = outage_store()
    primary.down = True
    store.extend("k", 5.0, NOW)  # the failure: down from t=0
    assert store.degraded
    restarted = 2.0  # Redis answers again 2 s later
    while store.degraded and tick.now < 60.0:
        tick.now = round(tick.now + 0.01, 2)  # a call every 10 ms
        primary.down = tick.now < restarted
        store.remaining("k", NOW)
    assert not store.degraded
    assert tick.now - restarted <= RESUME_WITHIN - 1.0, f"sharing resumed at t={tick.now}"


def test_a_store_that_stays_down_is_tried_once_per_interval_at_most() -> None:
    store, primary, tick = outage_store()
    primary.down = True
    for step in range(6_000):  # a call every 10 ms for 60 s, three operations each
        tick.now = step / 100
        store.peek(["a", "b"], NOW)
        store.take("a", 1, 25, 60.0, NOW)
        store.put("a", 3, 2.0, NOW)
    tries = primary.tries
    gaps = [later - earlier for earlier, later in itertools.pairwise(tries)]
    # 1 s after the failure, then every 2 s: at most 31 attempts in a minute, and
    # never more than 2 s without one (so a store back is used within 2 s of a call).
    assert len(primary.tries) <= 1 + 60 / 2 + 1
    assert max(gaps) <= 2.0 + 0.01
    assert gaps[:3] == pytest.approx([1.0, 2.0, 2.0])


def test_one_thread_tries_a_down_store_while_the_others_go_on_in_memory() -> None:
    store, primary, tick = outage_store()
    primary.down = True
    store.extend("k", 5.0, NOW)
    tick.now = 30.0  # long past the time to try again
    release = threading.Event()
    returned: list[float] = []

    def slow_refusal() -> None:  # a blackholed host: the connect times out
        release.wait(timeout=5.0)
        raise ConnectionError("Timeout connecting to server")

    primary.refuse = slow_refusal
    threads = [
        threading.Thread(target=lambda: returned.append(store.remaining("k", NOW + 1)))
        for _ in range(8)
    ]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 5.0
    while len(returned) < 7 and time.monotonic() < deadline:
        threading.Event().wait(0.005)  # polling, bounded by the deadline
    release.set()
    for thread in threads:
        thread.join(timeout=5.0)
    assert len(primary.tries) == 1 + 1  # the failure at t=0, then one attempt
    assert returned == [4.0] * 8  # every call answered from the mirror


# -- a refusal waits for the budget that refused, not for the next one -----------------

LIMITS = {
    "x-ratelimit-limit-requests": "25",
    "x-ratelimit-remaining-requests": "10",
    "x-ratelimit-reset-requests": "2s",
    "x-ratelimit-limit-tokens": "1500",
    "x-ratelimit-remaining-tokens": "50",
    "x-ratelimit-reset-tokens": "2s",
}


class NextWindowStarts(MemoryCooldownStore):
    """Another process starts the next window's budget between a refusal and its read.

    The refusing budget ends as this process is refused; another one's reservation,
    a moment later, starts the next window from the announced limit, for the
    default 60 s until an answer says when it resets.
    """

    def take(
        self, key: str, amount: int, limit: int | None, ttl: float, now: float
    ) -> tuple[bool, int | None]:
        granted, left = super().take(key, amount, limit, ttl, now)
        if not granted and key.startswith(TOKENS):
            self.delete(key)
            super().take(key, 79, 1500, ttl, now)
        return granted, left


def test_a_refusal_whose_budget_was_just_replaced_tries_again_at_once() -> None:
    key = CooldownKey.for_call("openai", "sk-fleet", "gpt-4o-mini", "http://127.0.0.1:9/v1")
    limiter = RateLimiter(NextWindowStarts())
    limiter.observe(key, LIMITS, NOW)  # 50 tokens left for 2 s: a call of 79 does not fit
    wait = limiter.reserve(key, 79, NOW + 1.0)
    # Before: it waited the new budget's 60 s (a fleet process stalled a minute).
    assert wait <= 1.0
    assert limiter.reserve(key, 79, NOW + 1.0 + wait) == 0.0  # and the next window has room


def test_a_refusal_waits_for_the_announced_reset() -> None:
    key = CooldownKey.for_call("openai", "sk-fleet", "gpt-4o-mini", "http://127.0.0.1:9/v1")
    limiter = RateLimiter(MemoryCooldownStore())
    limiter.observe(key, LIMITS, NOW)
    assert limiter.reserve(key, 79, NOW + 0.5) == pytest.approx(1.5)


# -- real processes on a real Redis that restarts ------------------------------------


@pytest.fixture
def restartable_redis(tmp_path: Path) -> Iterator[RestartableRedis]:
    server = RestartableRedis(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.kill()


def call_loop(
    base: str, store_url: str, home: str, stop: Any, results: multiprocessing.Queue[Any]
) -> None:
    """One worker: ``LLMClient.complete`` until ``stop`` is set; puts (answered, failures)."""
    from fluid_build.copilot import LLMClient

    env = {"FLUID_COOLDOWN_URL": store_url, "HOME": home, "XDG_CACHE_HOME": home}
    answered, failures = 0, []
    with LLMClient(
        "openai", "gpt-4o-mini", api_key="sk-fleet", base_url=f"{base}/v1", env=env
    ) as client:
        while not stop.is_set():
            try:
                client.complete("hello", max_output_tokens=16)
                answered += 1
            except Exception as exc:  # every failure is the finding
                failures.append(f"{type(exc).__name__}: {exc}"[:300])
            stop.wait(0.01)  # paced, so two processes leave the machine's cores to others
    results.put((answered, failures))


def wait_for(condition: Any, within: float, what: str) -> float:
    """Poll ``condition()`` every 20 ms for at most ``within`` s; the seconds it took."""
    began = time.monotonic()
    while not condition():
        if time.monotonic() - began > within:
            raise AssertionError(f"{what}: not within {within} s")
        threading.Event().wait(0.02)  # polling with a bound, not a fixed sleep
    return time.monotonic() - began


def test_processes_share_again_within_5_s_of_a_redis_restart_and_no_call_fails(
    restartable_redis: RestartableRedis, tmp_path: Path
) -> None:
    server = restartable_redis
    names = [f"fleet-worker-{i}" for i in range(2)]
    # Generous limits: every answer still announces a budget, so every call writes it.
    provider = RateLimitedProvider(1_000_000, 1_000_000_000, window=60.0)
    spawn = multiprocessing.get_context("spawn")
    stop = spawn.Event()
    results: multiprocessing.Queue[Any] = spawn.Queue()

    def sharing() -> bool:
        try:
            seen = server.clients()
        except redis.ConnectionError:
            return False
        # Connected again and past the handshake: the worker's store uses Redis.
        return all(name in seen and not seen[name].startswith("client") for name in names)

    with serving(provider) as base:
        workers = [
            spawn.Process(
                target=call_loop,
                args=(base, f"{server.url}?client_name={name}", str(tmp_path), stop, results),
            )
            for name in names
        ]
        for worker in workers:
            worker.start()
        try:
            wait_for(sharing, 30.0, "the workers reaching Redis at all")
            server.kill()
            during = provider.ok
            wait_for(lambda: provider.ok >= during + 20, 10.0, "calls while Redis is down")
            server.start()
            resumed = wait_for(sharing, 2 * RESUME_WITHIN, "sharing after the restart")
            after = provider.ok
            wait_for(lambda: provider.ok >= after + 20, 10.0, "calls after the restart")
        finally:
            stop.set()
            outcomes = [results.get(timeout=30) for _ in workers]
            for worker in workers:
                worker.join(timeout=10)
                if worker.is_alive():
                    worker.kill()
    assert [failures for _, failures in outcomes] == [[], []]
    assert sum(answered for answered, _ in outcomes) == provider.ok
    assert resumed <= RESUME_WITHIN, f"sharing resumed {resumed:.2f} s after Redis came back"
