"""Fakes for the tests: a clock that moves only when slept on, scripted calls, an AWS
sandbox (botocore reads only what a test gives it)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fluid_build.copilot.call.envelope import RetryEnvelope, RetryEvent
from fluid_build.copilot.health.cooldown import MemoryCooldownStore
from fluid_build.copilot.health.ratelimit import RateLimiter
from fluid_build.copilot.health.store import CooldownStore
from fluid_build.corpus.replay import VirtualClock

#: Every AWS variable botocore's credential and endpoint chain reads.
AWS_VARS = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_BEARER_TOKEN_BEDROCK",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_BEDROCK_RUNTIME",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_EC2_METADATA_DISABLED",
)


def aws_sandbox(
    monkeypatch: pytest.MonkeyPatch,
    home: Path,
    *,
    keys: tuple[str, str] | tuple[str, str, str] | None = None,
    config_dir: str = "",
) -> None:
    """No AWS variable of the machine's, ``home`` as HOME with the AWS config and
    credentials files under it (``config_dir``, e.g. ``.aws``), no instance metadata
    lookups, and static ``keys`` (access key, secret, session token) when given."""
    for name in AWS_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(home))
    prefix = f"{config_dir}/" if config_dir else "aws-"
    monkeypatch.setenv("AWS_CONFIG_FILE", str(home / f"{prefix}config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(home / f"{prefix}credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    for name, value in zip(
        ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"),
        keys or (),
        strict=False,
    ):
        monkeypatch.setenv(name, value)


def warm_async_transport() -> None:
    """Import the async transport now. A process's first async call imports it on the
    loop (aiohttp and its TLS context: about 0.14 s on a quiet machine, far more on a
    loaded one): a test of the loop's liveness during a credential wait warms it first,
    so that its ticks measure the wait, not that one-time import."""
    import aiohttp  # noqa: F401

    import fluid_build.copilot.call.transport.aio  # noqa: F401


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
