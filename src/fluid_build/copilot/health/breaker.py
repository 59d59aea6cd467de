"""The circuit breaker: stop calling an endpoint, key and model that keeps failing.

After ``threshold`` consecutive transient failures within ``window`` seconds
(timeouts, 5xx, overloaded, connection errors: see
``AgentExecutionError.counts_toward_breaker``), the breaker opens for
``cool_off`` seconds: calls fail at once with a retryable
:class:`ProviderServerError` (code ``llm.circuit_open``) saying until when.
Then it is half-open for ``window`` seconds: one call at a time goes through
as the trial, under a lease (owner + expiry) in the shared store. The trial's
success closes the breaker for everyone; a failure that counts opens it
again; any other ending (a 429, a 401, a cancellation, a killed process)
gives the lease back, or lets it expire, and the next call is the trial.
Half-open ends by itself: a breaker nobody proves healthy closes after its
window.

Everything lives in the cooldown store under the call's key, and every entry
has an end (see :mod:`fluid_build.copilot.health.cooldown`): nothing here can
lock a key out for longer than ``cool_off + window``, or a trial for longer
than its lease. ``fluid doctor --reset`` clears it by hand.
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final, Literal

from fluid_build.config import env_float, env_int
from fluid_build.copilot.agents.errors import (
    MAX_RETRY_AFTER,
    AgentExecutionError,
    ProviderServerError,
    until_text,
)
from fluid_build.copilot.health.resilient import reset_keys
from fluid_build.copilot.health.store import CooldownStore, trusted

__all__ = ["BREAKER_PREFIXES", "RESET_HINT", "BreakerState", "CircuitBreaker"]

LOG = logging.getLogger("fluid_build.breaker")

FAILS: Final = "breaker-fails:"
OPEN: Final = "breaker-open:"
HALF: Final = "breaker-half:"
TRIAL: Final = "breaker-trial:"
BREAKER_PREFIXES: Final = (FAILS, OPEN, HALF, TRIAL)

#: What the operator runs to clear breakers and cooldowns by hand.
RESET_HINT: Final = "fluid doctor --reset"

# A trial's lease outlives the trial's own deadline by a quarter of it (at
# least 0.5 s, at most 5 s), for the answer in flight and the release itself.
LEASE_MARGIN: Final = 5.0

_OWNER_IDS = itertools.count(1)
_HOST: list[str] = []


def new_owner() -> str:
    """A lease owner id: host, process and a counter (shown by ``fluid doctor``)."""
    if not _HOST:
        try:
            _HOST.append(socket.gethostname() or "host")
        except OSError:
            _HOST.append("host")
    return f"{_HOST[0]}:{os.getpid()}:{next(_OWNER_IDS)}"


@dataclass(frozen=True, slots=True)
class BreakerState:
    """One key's breaker, as read from the store. Times are wall-clock seconds."""

    state: Literal["closed", "open", "half_open"]
    failures: int
    opens_for: float  # seconds until it half-opens (0 unless open)
    since: float | None = None  # when it opened (None when closed)
    until: float | None = None  # open: when it half-opens; half-open: when it closes by itself
    reason: str | None = None  # the code of the failure that opened it
    trial_owner: str | None = None  # who holds the half-open trial lease
    trial_ends_in: float = 0.0  # seconds until that lease expires


class CircuitBreaker:
    """Per-key breaker over a shared store. ``clock`` is the store's wall-clock seconds."""

    def __init__(
        self,
        store: CooldownStore,
        *,
        threshold: int = 5,
        cool_off: float = 30.0,
        window: float = 60.0,
        trial_seconds: float = 60.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.threshold = threshold
        self.cool_off = cool_off
        self.window = window
        self.trial_seconds = trial_seconds
        self.clock = clock
        self._names: dict[str, tuple[str, str, str, str]] = {}

    @classmethod
    def from_env(
        cls, store: CooldownStore, env: Mapping[str, str] | None = None, **kwargs: object
    ) -> CircuitBreaker:
        """``FLUID_BREAKER_THRESHOLD`` (1..1000, default 5), ``FLUID_BREAKER_COOL_OFF_SECONDS``
        (default 30), ``FLUID_BREAKER_WINDOW_SECONDS`` (60), ``FLUID_BREAKER_TRIAL_SECONDS`` (60).
        """
        env = os.environ if env is None else env
        threshold = env_int(env, "FLUID_BREAKER_THRESHOLD", 5, minimum=1, maximum=1000)
        cool_off = env_float(
            env, "FLUID_BREAKER_COOL_OFF_SECONDS", 30.0, minimum=1.0, maximum=3600.0
        )
        window = env_float(env, "FLUID_BREAKER_WINDOW_SECONDS", 60.0, minimum=1.0, maximum=3600.0)
        trial = env_float(env, "FLUID_BREAKER_TRIAL_SECONDS", 60.0, minimum=1.0, maximum=3600.0)
        return cls(
            store,
            threshold=threshold,
            cool_off=cool_off or 30.0,
            window=window or 60.0,
            trial_seconds=trial or 60.0,
            **kwargs,  # type: ignore[arg-type]
        )

    def __repr__(self) -> str:
        return (
            f"CircuitBreaker(threshold={self.threshold}, cool_off={self.cool_off:g}, "
            f"window={self.window:g}, trial_seconds={self.trial_seconds:g})"
        )

    # -- reading -------------------------------------------------------------------

    def gate_keys(self, key: str) -> tuple[str, str]:
        """The store keys :meth:`check` reads first (open, half-open): both unset is closed."""
        names = self._keys(key)
        return names[1], names[2]

    def _keys(self, key: str) -> tuple[str, str, str, str]:
        names = self._names.get(key)
        if names is None:
            names = (FAILS + key, OPEN + key, HALF + key, TRIAL + key)
            if len(self._names) < 10_000:
                self._names[key] = names
        return names

    def lease_ttl(self, deadline: float | None = None) -> float:
        """How long a trial may hold its lease: its deadline (<= ``trial_seconds``) + margin."""
        bound = self.trial_deadline(deadline)
        return bound + min(LEASE_MARGIN, max(0.5, bound / 4))

    def trial_deadline(self, deadline: float | None = None) -> float:
        """The deadline a trial call runs under: its own, never past ``trial_seconds``."""
        return self.trial_seconds if deadline is None else min(deadline, self.trial_seconds)

    def state(self, key: str) -> BreakerState:
        now = self.clock()
        names = self._keys(key)
        _, open_, half, trial = names
        (_, failures), (open_left, _), (half_left, _), (lease_left, _) = self.store.peek(names, now)
        open_left = trusted(self.store, open_, open_left, self.cool_off, now)
        half_left = trusted(self.store, half, half_left, self.cool_off + self.window, now)
        lease_left = trusted(self.store, trial, lease_left, self.lease_ttl(), now)
        if open_left <= 0 and half_left <= 0:
            return BreakerState("closed", failures, 0.0)
        entry = next((e for e in self.store.entries(now) if e.key == open_ or e.key == half), None)
        since = entry.since if entry is not None else None
        reason = entry.note or None if entry is not None else None
        owner = None
        if lease_left > 0:
            owner = next((e.owner for e in self.store.entries(now) if e.key == trial), None)
        if open_left > 0:
            return BreakerState(
                "open", failures, open_left, since, now + open_left, reason, owner, lease_left
            )
        return BreakerState(
            "half_open", failures, 0.0, since, now + half_left, reason, owner, lease_left
        )

    def is_open(self, key: str) -> bool:
        now = self.clock()
        left = self.store.remaining(OPEN + key, now)
        return trusted(self.store, OPEN + key, left, self.cool_off, now) > 0

    # -- deciding ------------------------------------------------------------------

    def check(
        self,
        key: str,
        *,
        provider: str | None = None,
        model: str | None = None,
        deadline: float | None = None,
        owner: str | None = None,
    ) -> str | None:
        """Let the call through, or raise ``llm.circuit_open`` at once.

        Returns the lease owner id when this call is the half-open trial (the
        caller must :meth:`release` it when the call ends, whatever the
        outcome), else None. A call already holding the lease (``owner``)
        renews it.
        """
        now = self.clock()
        _, open_, half, trial = self._keys(key)
        (open_left, _), (half_left, _) = self.store.peek((open_, half), now)
        if open_left <= 0 and half_left <= 0:
            return None  # closed: the fast path
        open_left = trusted(self.store, open_, open_left, self.cool_off, now)
        if open_left > 0:
            raise self._refusal(key, provider, model, now, open_left, None, 0.0)
        half_left = trusted(self.store, half, half_left, self.cool_off + self.window, now)
        if half_left <= 0:
            return None
        me = owner or new_owner()
        ttl = self.lease_ttl(deadline)
        if self.store.acquire(trial, me, ttl, now):
            if owner is None:
                LOG.warning(
                    "circuit for %s is half-open: one trial call goes through (lease %s, "
                    "at most %.0f s)",
                    key,
                    me,
                    ttl,
                )
            return me
        # Capped at the longest lease anyone may hold, never at this caller's own:
        # a caller with a shorter deadline must not cut the holder's lease short.
        lease_left = trusted(
            self.store, trial, self.store.remaining(trial, now), self.lease_ttl(), now
        )
        holder = next((e.owner for e in self.store.entries(now) if e.key == trial), None)
        raise self._refusal(key, provider, model, now, 0.0, holder, lease_left)

    def _refusal(
        self,
        key: str,
        provider: str | None,
        model: str | None,
        now: float,
        open_left: float,
        holder: str | None,
        lease_left: float,
    ) -> ProviderServerError:
        who = f"{provider or 'provider'} ({model})" if model else (provider or "provider")
        # One wait, worded once: the message and the hint (counted from details["until"])
        # name the same clock time and duration.
        if open_left > 0:
            wait: float = open_left
            when = f"it half-opens at {until_text(now, wait)}"
        else:
            wait = max(lease_left, 1.0)
            when = f"a trial call is in progress; its lease ends by {until_text(now, wait)}"
        details: dict[str, object] = {
            "breaker_key": key,
            "threshold": self.threshold,
            "cool_off": self.cool_off,
            "until": now + wait,
            "trial_owner": holder,
            "reset": RESET_HINT,
        }
        if wait > MAX_RETRY_AFTER:  # retry_after is capped; the hint names the real wait
            details["retry_after_requested"] = wait
        return ProviderServerError(
            f"circuit open for {who} after {self.threshold} consecutive failures; {when}. "
            f"`{RESET_HINT}` closes it now",
            provider=provider,
            model=model,
            code="llm.circuit_open",
            retryable=True,
            retry_after=wait,
            details=details,
        )

    # -- recording -----------------------------------------------------------------

    def record_success(self, key: str, *, sent_at: float | None = None) -> None:
        """A call on ``key`` succeeded: clear its breaker for every process (one read if clean).

        ``sent_at`` (wall-clock) is when its request went out: the answer to a
        request sent before the breaker opened says nothing about the
        provider since, so it does not close an open breaker.
        """
        now = self.clock()
        names = self._keys(key)
        view = self.store.peek(names, now)
        if not any(left > 0 for left, _ in view):
            return
        if view[1][0] > 0 and sent_at is not None:
            opened = next((e.since for e in self.store.entries(now) if e.key == names[1]), None)
            if opened is not None and sent_at < opened:
                return
        self.store.delete(*names)
        if view[1][0] > 0 or view[2][0] > 0:
            LOG.warning("circuit for %s closed: a call succeeded", key)

    def record_failure(
        self, key: str, error: AgentExecutionError, *, trial: str | None = None
    ) -> bool:
        """Count a failure; return True when it opened the breaker.

        ``trial`` is the lease owner when this call is the half-open trial:
        its counting failure opens the breaker again at once.
        """
        if not error.counts_toward_breaker:
            return False
        now = self.clock()
        fails, open_, half, trial_key = self._keys(key)
        failures = self.store.incr(fails, self.window, now, error.code)
        if failures < self.threshold and trial is None:
            return False
        if self.store.remaining(open_, now) > 0:
            return False  # already open: a call that was in flight when it opened
        self.store.extend(open_, self.cool_off, now, error.code)
        self.store.extend(half, self.cool_off + self.window, now, error.code)
        if trial is not None:
            self.store.release(trial_key, trial)
        how = (
            "its half-open trial failed"
            if trial is not None
            else (f"{failures} consecutive failures")
        )
        LOG.warning(
            "circuit for %s opened: %s [%s]; it half-opens at %s; `%s` closes it by hand",
            key,
            how,
            error.code,
            until_text(now, self.cool_off),
            RESET_HINT,
        )
        return True

    def release(self, key: str, owner: str) -> None:
        """The trial ended without a verdict (or with one already recorded): give its lease back."""
        self.store.release(TRIAL + key, owner)

    def reset(self, key: str) -> None:
        """Close ``key``'s breaker by hand: failures, open window, half-open and lease.

        Deliberate: the shared store itself is changed, waiting briefly for
        another writer's lock, or :class:`StoreResetError` says why not.
        """
        reset_keys(self.store, self._keys(key))
