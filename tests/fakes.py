"""Fakes for the retry tests: a clock that moves only when slept on, scripted calls."""

from __future__ import annotations

from typing import Any


class FakeClock:
    """Wall-clock seconds that advance only when someone sleeps."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.now = start
        self.waits: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.now += seconds

    async def asleep(self, seconds: float) -> None:
        self.sleep(seconds)


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
