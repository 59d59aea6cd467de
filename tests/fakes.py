"""Fakes for the retry tests: a clock that moves only when slept on, scripted calls."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fluid_build.copilot.call.envelope import RetryEnvelope, RetryEvent
from fluid_build.copilot.health.cooldown import MemoryCooldownStore
from fluid_build.copilot.health.ratelimit import RateLimiter
from fluid_build.copilot.health.store import CooldownStore
from fluid_build.corpus.replay import VirtualClock

# The library's own virtual clock (it drives `fluid forge`'s offline replay):
# wall-clock seconds that advance only when someone sleeps.
FakeClock = VirtualClock


def clocked_envelope(
    clock: FakeClock,
    *,
    store: CooldownStore | None = None,
    limited: bool = False,
    hook: Callable[[RetryEvent], None] = lambda event: None,
) -> RetryEnvelope:
    """A retry envelope that sleeps only on ``clock``: ``store`` (its own memory store by
    default), no jitter, no logging hook unless ``hook``; with ``limited``, a rate limiter
    on the same store."""
    store = MemoryCooldownStore() if store is None else store
    return RetryEnvelope(
        cooldown=store,
        limiter=RateLimiter(store) if limited else None,
        clock=clock,
        sleep=clock.sleep,
        asleep=clock.asleep,
        random=lambda: 0.0,
        hook=hook,
    )


class Script:
    """A provider call that raises or returns the given outcomes, in order."""

    def __init__(self, *outcomes: Any, clock: FakeClock | None = None, takes: float = 0.0) -> None:
        self.outcomes = list(outcomes)
        self.calls = 0
        self.sent_at: list[float] = []
        self.clock = clock
        self.takes = takes

    def __call__(self) -> Any:
        self.calls += 1
        if self.clock is not None:
            self.sent_at.append(self.clock.now)
            self.clock.now += self.takes
        if not self.outcomes:
            raise AssertionError("the script ran out of outcomes: too many attempts")
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    async def acall(self) -> Any:
        return self()
