"""The circuit breaker: stop calling a provider, model and key that keeps failing.

After ``threshold`` consecutive transient failures (timeouts, 5xx, overloaded,
connection errors: see ``AgentExecutionError.counts_toward_breaker``), the
breaker opens for ``cool_off`` seconds: calls fail at once with a retryable
:class:`ProviderServerError` (code ``llm.circuit_open``) saying when it will
half-open. Then one trial call is let through: success closes the breaker,
failure opens it again. The state lives in the cooldown store, so every
worker on the key sees it.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final, Literal

from fluid_build.config import env_float, env_int
from fluid_build.copilot.agents.cooldown import CooldownStore
from fluid_build.copilot.agents.errors import AgentExecutionError, ProviderServerError

__all__ = ["BreakerState", "CircuitBreaker"]

LOG = logging.getLogger("fluid_build.breaker")

_OPEN: Final = "breaker-open:"
_FAILS: Final = "breaker-fails:"
_TRIAL: Final = "breaker-trial:"


@dataclass(frozen=True, slots=True)
class BreakerState:
    state: Literal["closed", "open", "half_open"]
    failures: int
    opens_for: float  # seconds until it half-opens (0 unless open)


class CircuitBreaker:
    """Per-key breaker over a shared store. ``clock`` is wall-clock seconds."""

    def __init__(
        self,
        store: CooldownStore,
        *,
        threshold: int = 5,
        cool_off: float = 30.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.threshold = threshold
        self.cool_off = cool_off
        self.clock = clock
        self._dirty: set[str] = set()  # keys with failures we recorded, to reset on success

    @classmethod
    def from_env(
        cls, store: CooldownStore, env: Mapping[str, str] | None = None, **kwargs: object
    ) -> CircuitBreaker:
        """``FLUID_BREAKER_THRESHOLD`` (1..1000, default 5), ``FLUID_BREAKER_COOL_OFF_SECONDS``."""
        env = os.environ if env is None else env
        threshold = env_int(env, "FLUID_BREAKER_THRESHOLD", 5, minimum=1, maximum=1000)
        cool_off = env_float(
            env, "FLUID_BREAKER_COOL_OFF_SECONDS", 30.0, minimum=1.0, maximum=3600.0
        )
        return cls(store, threshold=threshold, cool_off=cool_off or 30.0, **kwargs)  # type: ignore[arg-type]

    def state(self, key: str) -> BreakerState:
        now = self.clock()
        opens_for = self.store.remaining(_OPEN + key, now)
        failures = self.store.count(_FAILS + key)
        if opens_for > 0:
            return BreakerState("open", failures, opens_for)
        if failures >= self.threshold:
            return BreakerState("half_open", failures, 0.0)
        return BreakerState("closed", failures, 0.0)

    def is_open(self, key: str) -> bool:
        return self.store.remaining(_OPEN + key, self.clock()) > 0

    def check(self, key: str, *, provider: str | None = None, model: str | None = None) -> None:
        """Let the call through, or raise ``llm.circuit_open`` at once."""
        now = self.clock()
        left = self.store.remaining(_OPEN + key, now)
        if left <= 0:
            if self.store.count(_FAILS + key) < self.threshold:
                return  # closed
            if self.store.incr(_TRIAL + key) == 1:
                LOG.warning("circuit for %s is half-open: letting one trial call through", key)
                self._dirty.add(key)
                return
            left = 0.0
        who = f"{provider or 'provider'} ({model})" if model else (provider or "provider")
        when = f"it half-opens in {left:.0f} s" if left > 0 else "a trial call is in progress"
        raise ProviderServerError(
            f"circuit open for {who} after {self.threshold} consecutive failures; {when}",
            provider=provider,
            model=model,
            code="llm.circuit_open",
            retryable=True,
            retry_after=left if left > 0 else None,
            details={"breaker_key": key, "threshold": self.threshold, "cool_off": self.cool_off},
        )

    def record_success(self, key: str) -> None:
        if key in self._dirty:
            self.store.reset(_FAILS + key)
            self.store.reset(_TRIAL + key)
            self._dirty.discard(key)

    def record_failure(self, key: str, error: AgentExecutionError) -> None:
        if not error.counts_toward_breaker:
            return
        self._dirty.add(key)
        failures = self.store.incr(_FAILS + key)
        if failures >= self.threshold:
            self.store.extend(_OPEN + key, self.cool_off, self.clock())
            self.store.reset(_TRIAL + key)
            LOG.warning(
                "circuit for %s opened after %d consecutive failures [%s]; half-opens in %.0f s",
                key,
                failures,
                error.code,
                self.cool_off,
            )
