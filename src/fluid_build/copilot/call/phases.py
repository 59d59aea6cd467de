"""The phases of one attempt, each with its own limit beside the call's deadline.

- ``connect``: opening the connection (TCP and TLS). The transport's own
  connect timeout, set to this limit (never past the deadline).
- ``first_token``: from the request handed to the pool to the first byte of
  the answer: its head for a whole answer; for a stream, its first body byte
  (an event, or a keep-alive comment), since a stream's head comes at once
  and says nothing about the model.
- ``idle``: the longest gap between body bytes once they flow (a stream's
  events and keep-alives, a whole answer's body).

A limit that ends an attempt is :class:`ProviderTimeoutError` (``llm.timeout``,
retryable) with ``details["phase"]`` and ``details["bytes_received"]`` (body
bytes: 0 means the route said nothing). :class:`Phase` is one attempt's watch:
the shells and the readers tell it what arrived, and ask it when the next
byte is due (call/drive.py, call/transport/sync.py, call/wire.py).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from fluid_build._redact import redact, truncate
from fluid_build.copilot.agents.errors import ProviderError, ProviderTimeoutError

__all__ = [
    "CONNECT_ENV",
    "DEFAULT_CONNECT",
    "DEFAULT_FIRST_TOKEN",
    "DEFAULT_MOVE_ON_RETRY_AFTER",
    "FIRST_TOKEN_ENV",
    "IDLE_ENV",
    "MOVE_ON_RETRY_AFTER_ENV",
    "PHASE_EXTENSION",
    "Phase",
    "PhaseLimits",
    "PhaseName",
    "move_on_retry_after_choice",
    "seconds_choice",
]

PhaseName = Literal["connect", "first_token", "idle"]

CONNECT_ENV: Final = "FLUID_LLM_CONNECT_TIMEOUT_SECONDS"
FIRST_TOKEN_ENV: Final = "FLUID_LLM_FIRST_TOKEN_TIMEOUT_SECONDS"  # noqa: S105 - a name
IDLE_ENV: Final = "FLUID_LLM_IDLE_TIMEOUT_SECONDS"
MOVE_ON_RETRY_AFTER_ENV: Final = "FLUID_LLM_MOVE_ON_RETRY_AFTER_SECONDS"

#: A connection that takes longer than this is to a host that is down or unreachable.
DEFAULT_CONNECT: Final = 10.0
#: Reasoning models think for minutes before their first token (a whole answer's head
#: comes only once it is written): the wait for it is never cut before this.
DEFAULT_FIRST_TOKEN: Final = 300.0
#: A Retry-After longer than this moves the call to the next entry at once, when there is one.
DEFAULT_MOVE_ON_RETRY_AFTER: Final = 10.0
#: The largest value any phase limit takes (a day).
MOST: Final = 86_400.0

#: The request extension that carries the attempt's :class:`Phase`.
PHASE_EXTENSION: Final = "fluid.phase"

_ARGUMENTS: Final = {
    CONNECT_ENV: "connect_timeout",
    FIRST_TOKEN_ENV: "first_token_timeout",
    IDLE_ENV: "idle_timeout",
    MOVE_ON_RETRY_AFTER_ENV: "move_on_retry_after",
}
_EXAMPLES: Final = {
    CONNECT_ENV: "10",
    FIRST_TOKEN_ENV: "300",
    IDLE_ENV: "120",
    MOVE_ON_RETRY_AFTER_ENV: "10",
}


def _refused(variable: str, given: str, source: str, provider: str | None, least: str) -> Exception:
    argument = _ARGUMENTS[variable]
    example = _EXAMPLES[variable]
    return ProviderError(
        f"{source} {truncate(redact(given), 40)!r} is not a number of seconds: a number "
        f"{least}, up to {MOST:g} (e.g. {variable}={example}, or {argument}={example})",
        provider=provider,
        code="llm.not_configured",
        retryable=False,
        details={"variable": variable, "example": example, "argument": argument},
    )


def seconds_choice(
    env: Mapping[str, str],
    variable: str,
    given: float | None,
    *,
    provider: str | None = None,
    zero: bool = False,
) -> float | None:
    """The argument ``given`` (else ``env[variable]``) as seconds, checked; None: neither set.

    A value that is not a finite number greater than 0 (``zero``: 0 or more) and at
    most a day is ``llm.not_configured`` naming where it came from, never a default
    in its place: a limit the operator set and fluid ignored would fail later, and
    far from its cause.
    """
    least = "of 0 or more" if zero else "greater than 0"
    if given is not None:
        ok = isinstance(given, int | float) and not isinstance(given, bool)
        value = float(given) if ok else math.nan
        source, raw = f"{_ARGUMENTS[variable]}=", repr(given)
        if ok and value == math.inf and zero:
            return value  # "never move on"
    else:
        raw = env.get(variable, "").strip()
        if not raw:
            return None
        source = variable
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
    if math.isfinite(value) and (value >= 0 if zero else value > 0) and value <= MOST:
        return value
    raise _refused(variable, raw, source, provider, least)


def move_on_retry_after_choice(
    env: Mapping[str, str], given: float | None, *, provider: str | None = None
) -> float:
    """The Retry-After (seconds) past which a call moves to the next entry at once."""
    value = seconds_choice(env, MOVE_ON_RETRY_AFTER_ENV, given, provider=provider, zero=True)
    return DEFAULT_MOVE_ON_RETRY_AFTER if value is None else value


@dataclass(frozen=True, slots=True)
class PhaseLimits:
    """The limits of one entry's phases, in seconds (see the module docstring)."""

    connect: float = DEFAULT_CONNECT
    first_token: float = DEFAULT_FIRST_TOKEN
    idle: float = 120.0

    @classmethod
    def choose(
        cls,
        env: Mapping[str, str],
        timeout: float,
        *,
        timeout_set: bool = False,
        connect: float | None = None,
        first_token: float | None = None,
        idle: float | None = None,
        provider: str | None = None,
    ) -> PhaseLimits:
        """The arguments, else ``FLUID_LLM_*_TIMEOUT_SECONDS``, else the defaults, which follow
        the attempt's ``timeout``: connect at most 10 s and never past it; idle exactly the
        timeout, which is what each read waited before phases had limits of their own; the
        first token 300 s, so that a model may think for minutes, or the timeout when that
        is longer or was set by hand (``timeout_set``: the argument or
        ``FLUID_LLM_TIMEOUT_SECONDS``), since a timeout set by hand bounded that wait too."""
        chosen_connect = seconds_choice(env, CONNECT_ENV, connect, provider=provider)
        chosen_first = seconds_choice(env, FIRST_TOKEN_ENV, first_token, provider=provider)
        chosen_idle = seconds_choice(env, IDLE_ENV, idle, provider=provider)
        return cls(
            connect=min(DEFAULT_CONNECT, timeout) if chosen_connect is None else chosen_connect,
            first_token=chosen_first
            if chosen_first is not None
            else timeout
            if timeout_set
            else max(DEFAULT_FIRST_TOKEN, timeout),
            idle=timeout if chosen_idle is None else chosen_idle,
        )

    def timeouts(self, left: float, per_attempt: float) -> dict[str, float]:
        """A request's timeouts (httpx's four, seconds): connect by its limit, each read
        by the first token's (the wait for the head: from the send, the connection's time
        included, as the shells count it), write and pool by the attempt's; none past the
        ``left`` seconds of the deadline. Reads are the phases' alone: the attempt's
        ``timeout`` no longer cuts a model that thinks (docs/limits.md)."""
        left = max(left, 0.001)
        both = min(per_attempt, left)
        return {
            "connect": min(self.connect, left),
            "read": min(self.first_token + self.connect, left),
            "write": both,
            "pool": both,
        }

    def watch(self, *, stream: bool) -> Phase:
        return Phase(self, stream)


class Phase:
    """One attempt's phases: when it was sent, what arrived and when; when the next byte
    is due (:meth:`due`, on ``time.monotonic``) and which limit a timeout was."""

    __slots__ = (
        "body",
        "ceiling",
        "head_at",
        "last",
        "limits",
        "sent",
        "skew",
        "slack",
        "stream",
        "timer",
    )

    def __init__(self, limits: PhaseLimits, stream: bool) -> None:
        self.limits = limits
        self.stream = stream
        self.sent: float | None = None  # the request handed to the pool (or written)
        # Until the request is seen written, the connection may still be opening: its own
        # limit's time is not the first token's (only fluid's sync pool sees the write).
        self.slack = limits.connect
        self.head_at: float | None = None  # the answer's head arrived
        self.body = 0  # body bytes received (raw, before any inflating)
        self.last = 0.0  # when the last of them arrived
        #: The async shell's timer for the wait in progress (an ``asyncio.Timeout``), moved
        #: on as bytes arrive, never past ``ceiling`` (the call's deadline, monotonic).
        self.timer: Any = None
        self.ceiling = math.inf
        self.skew = 0.0  # the timer's loop's clock less ``time.monotonic``

    def start(self) -> None:
        self.sent = time.monotonic()

    def written(self) -> None:
        """The request's bytes went out on an open connection: the first token's wait starts."""
        if self.head_at is None:
            self.sent = time.monotonic()
            self.slack = 0.0

    def headed(self) -> None:
        self.head_at = time.monotonic()

    def got(self, size: int) -> None:
        """Body bytes arrived: the wait for the next one starts again (the idle limit)."""
        if size:
            self.body += size
            self.last = now = time.monotonic()
            timer = self.timer
            if timer is not None:
                try:
                    timer.reschedule(min(now + self.limits.idle, self.ceiling) + self.skew)
                except RuntimeError:  # the timer is already expiring, or done
                    self.timer = None

    def current(self) -> PhaseName:
        """The phase now: the first token until the answer said something, then idle."""
        if self.body:
            return "idle"
        if self.head_at is not None and not self.stream:
            return "idle"
        return "first_token"

    def due(self) -> float | None:
        """When (``time.monotonic``) the next byte must have come; None: not sent yet."""
        if self.body:
            return self.last + self.limits.idle
        if self.head_at is not None and not self.stream:
            return self.head_at + self.limits.idle
        if self.sent is None:
            return None
        return self.sent + self.slack + self.limits.first_token

    def error(
        self, provider: str | None, model: str | None, *, connect: bool = False
    ) -> ProviderTimeoutError:
        """The attempt's error for the phase whose limit passed."""
        phase: PhaseName = "connect" if connect else self.current()
        limit = getattr(self.limits, phase)
        who = provider or "provider"
        if model:
            who += f" ({model})"
        said = (
            "nothing"
            if not self.body and self.head_at is None
            else "only the head of its answer"
            if not self.body
            else f"{self.body} byte{'' if self.body == 1 else 's'} of its answer"
        )
        what = {
            "connect": "to open a connection",
            "first_token": "for the first token",
            "idle": "between bytes of the answer",
        }[phase]
        variable = {"connect": CONNECT_ENV, "first_token": FIRST_TOKEN_ENV, "idle": IDLE_ENV}[phase]
        return ProviderTimeoutError(
            f"{who} took longer than the {limit:g} s {phase.replace('_', ' ')} limit {what}; it "
            f"had sent {said} ({variable} or {_ARGUMENTS[variable]}= sets the limit)",
            provider=provider,
            model=model,
            code="llm.timeout",
            retryable=True,
            details={
                "phase": phase,
                "limit": limit,
                "bytes_received": self.body,
                "head_received": self.head_at is not None,
            },
        )
