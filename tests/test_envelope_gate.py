"""The envelope's gate: breaker and cooldown read together, and still obeyed."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from fluid_build.copilot.agents.errors import ProviderServerError
from fluid_build.copilot.call.envelope import COOLDOWN, RetryEnvelope
from fluid_build.copilot.health.breaker import CircuitBreaker
from fluid_build.copilot.health.cooldown import MemoryCooldownStore


class CountingStore(MemoryCooldownStore):
    """A memory store that counts its reads."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []

    def peek(self, keys: Sequence[str], now: float) -> list[tuple[float, int]]:
        self.reads.append("peek")
        return super().peek(keys, now)

    def remaining(self, key: str, now: float) -> float:
        self.reads.append("remaining")
        return super().remaining(key, now)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def _envelope(store: CountingStore, clock: Clock) -> RetryEnvelope:
    breaker = CircuitBreaker(store, threshold=1, cool_off=30.0, clock=clock)
    return RetryEnvelope(cooldown=store, breaker=breaker, clock=clock, sleep=lambda _: None)


def test_a_closed_breaker_and_no_cooldown_cost_one_read_before_the_call() -> None:
    store, clock = CountingStore(), Clock()
    envelope = _envelope(store, clock)
    assert envelope.call(lambda: "ok", key="k") == "ok"
    # The gate's one read, then the breaker's record of the success.
    assert store.reads == ["peek", "peek"]


def test_an_open_breaker_still_refuses_at_once() -> None:
    store, clock = CountingStore(), Clock()
    envelope = _envelope(store, clock)
    assert envelope.breaker is not None
    store.extend(envelope.breaker.gate_keys("k")[0], 30.0, clock.now)
    calls: list[int] = []
    with pytest.raises(ProviderServerError) as info:
        envelope.call(lambda: calls.append(1), key="k")
    assert info.value.code == "llm.circuit_open"
    assert calls == []


def test_a_cooldown_still_waits_before_the_first_attempt() -> None:
    store, clock = CountingStore(), Clock()
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock.now += seconds

    breaker = CircuitBreaker(store, clock=clock)
    envelope = RetryEnvelope(cooldown=store, breaker=breaker, clock=clock, sleep=sleep)
    store.extend(COOLDOWN + "k", 2.0, clock.now)
    assert envelope.call(lambda: "ok", key="k") == "ok"
    assert sum(slept) >= 2.0
