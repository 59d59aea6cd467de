"""A store that never fails a call (:class:`ResilientCooldownStore`), and deliberate resets.

Calls treat the shared store as advisory: when it is busy or down they go ahead on
an in-memory mirror. A deliberate reset (:func:`reset_keys`) is the exception: it
reaches the shared store or raises :class:`StoreResetError`.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final

from fluid_build.copilot.health.store import (
    MAX_ENTRIES,
    CooldownStore,
    MemoryCooldownStore,
    StoreEntry,
    without_password,
)
from fluid_build.errors import FluidError

if TYPE_CHECKING:
    from fluid_build.copilot.health.budget import BudgetLedger

__all__ = ["RESET_WAIT", "ResilientCooldownStore", "StoreResetError", "reset_keys"]

LOG = logging.getLogger("fluid_build.cooldown")


#: Seconds a deliberate reset waits for another process's write lock.
RESET_WAIT: Final = 2.0


class StoreResetError(FluidError):
    """A deliberate reset could not reach the shared store (busy past its wait, or down)."""


def delete_with_wait(store: CooldownStore, keys: Sequence[str], wait: float) -> None:
    """``store.delete(*keys)``, retried while another writer holds the lock, for ``wait`` s.

    Raises :class:`StoreResetError` naming the store when it stays busy or fails.
    """
    if not keys:
        return
    deadline = time.monotonic() + max(wait, 0.0)
    pause = 0.005
    while True:
        try:
            store.delete(*keys)
        except Exception as exc:  # reported as a typed error below
            if ResilientCooldownStore.is_contention(exc) and time.monotonic() + pause < deadline:
                time.sleep(pause)  # bounded by ``deadline``; sqlite's own busy wait is short
                pause = min(pause * 2, 0.1)
                continue
            busy = ResilientCooldownStore.is_contention(exc)
            reason = (
                f"another process held its write lock for {wait:g} s"
                if busy
                else f"{type(exc).__name__}: {without_password(str(exc))}"
            )
            raise StoreResetError(
                f"could not reset the breaker and cooldown in {store!r}: {reason}; "
                "nothing was cleared there, try again or run `fluid doctor --reset`"
            ) from exc
        return


def reset_keys(store: CooldownStore, keys: Sequence[str], wait: float = RESET_WAIT) -> None:
    """Delete ``keys`` for a deliberate reset: in the shared store itself, or a typed error.

    A :class:`ResilientCooldownStore` does not get to skip the write because
    the store is busy or down (see :meth:`ResilientCooldownStore.delete_now`).
    """
    if isinstance(store, ResilientCooldownStore):
        store.delete_now(*keys, wait=wait)
    else:
        delete_with_wait(store, keys, wait)


class ResilientCooldownStore:
    """A store that never fails a call: on error it degrades to memory.

    Every change is mirrored in memory, so the process keeps its own windows,
    counts and leases while the shared store is down. The first failure logs
    one warning and a recovery is logged too. While the store is down one
    operation of the process (not one per call, nor one per thread) tries it
    again, ``retry_every`` seconds after the failure, then at doubling
    intervals up to ``retry_most``: a Redis restarted is used again within
    ``retry_most`` seconds of answering (by a process that touches the store
    meanwhile), and a store that stays down costs at most one failed attempt
    (a refused connection, or the store's short connect timeout) per
    ``retry_most`` seconds, paid by the one call that makes it.

    Contention is not a failure: when the shared store is busy (another
    process holds the sqlite file's write lock past its short busy timeout,
    see :meth:`is_contention`), the call goes ahead on the mirror's answer,
    the store's answer being advisory. One warning says so (at most one per
    ``warn_every`` seconds), the store is not marked down, reads keep asking
    it, and writes skip it for ``contention_pause`` seconds so that no call
    waits on the lock twice in a row. The changes made meanwhile stay in this
    process until they end.
    """

    WRITES: Final = frozenset(
        {"extend", "cap", "incr", "take", "put", "acquire", "release", "delete", "clear"}
    )

    def __init__(
        self,
        primary: CooldownStore,
        *,
        retry_every: float = 1.0,
        retry_most: float = 2.0,
        warn_every: float = 30.0,
        contention_pause: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.primary = primary
        self.fallback = MemoryCooldownStore()
        self._retry_every = retry_every
        self._retry_most = max(retry_most, retry_every)
        self._warn_every = warn_every
        self._contention_pause = contention_pause
        self._clock = clock
        self._down_since: float | None = None
        # While down: when the store may be tried again, and the interval that led there.
        self._next_try = 0.0
        self._interval = retry_every
        self._try_lock = threading.Lock()  # one attempt at a time, however many threads call
        self._busy_until: float | None = None
        self._busy_warned: float | None = None
        self._busy_lock = threading.Lock()  # one warning, however many threads meet the lock
        #: How many operations went ahead without the shared store because it was busy.
        self.contended = 0
        # Keys written while the shared store was down or busy: only the mirror has them.
        self._unsynced: set[str] = set()

    @property
    def degraded(self) -> bool:
        return self._down_since is not None

    @staticmethod
    def is_contention(exc: BaseException) -> bool:
        """Whether ``exc`` says the store is busy (locked by a writer), not broken."""
        sqlite = sys.modules.get("sqlite3")  # not loaded: no sqlite error can exist
        if sqlite is None or not isinstance(exc, sqlite.OperationalError):
            return False
        code = getattr(exc, "sqlite_errorcode", None)
        if isinstance(code, int) and code & 0xFF in (sqlite.SQLITE_BUSY, sqlite.SQLITE_LOCKED):
            return True
        text = str(exc).lower()
        return "is locked" in text or "is busy" in text

    def _usable(self) -> bool:
        """Whether to ask the shared store: always when up; when down, one caller per interval."""
        if self._down_since is None:
            return True
        with self._try_lock:
            now = self._clock()
            if now < self._next_try:
                return False
            # This caller tries it; the others keep to the mirror meanwhile. Pushed
            # forward before trying, so an attempt that never reports back (a thread
            # interrupted) delays the next one instead of stopping them.
            self._next_try = now + self._interval
            return True

    def _contended(self, write: bool) -> None:
        with self._busy_lock:
            now = self._clock()
            self.contended += 1
            if write:  # a busy read says nothing about the next write's chances
                self._busy_until = now + self._contention_pause
            if self._busy_warned is not None and now - self._busy_warned < self._warn_every:
                return
            self._busy_warned = now
            LOG.warning(
                "cooldown store %r is busy (another process holds its lock); calls go ahead "
                "without waiting for it, as its answers are advisory, and this process keeps "
                "its own cooldowns and breaker counts until the lock is free",
                self.primary,
            )

    def _failed(self, exc: Exception) -> None:
        if self._down_since is None:
            LOG.warning(
                "cooldown store %r failed (%s: %s); sharing cooldowns in this process only "
                "until it answers again",
                self.primary,
                type(exc).__name__,
                without_password(str(exc)),
            )
        with self._try_lock:
            now = self._clock()
            if self._down_since is None:
                self._down_since = now
                self._interval = self._retry_every
            else:  # a store that stays down is tried less and less often, up to retry_most
                self._interval = min(self._interval * 2, self._retry_most)
            self._next_try = now + self._interval

    def _recovered(self) -> None:
        if self._down_since is not None:
            LOG.warning("cooldown store %r answers again", self.primary)
            self._down_since = None

    def _shared(self, op: str, *args: Any) -> tuple[bool, Any]:
        """``(True, result)`` from the primary, or ``(False, None)`` when it is down or busy."""
        if not self._usable():
            return False, None
        if op in self.WRITES and self._busy_until is not None:
            if self._clock() < self._busy_until:
                return False, None
            self._busy_until = None
        try:
            result = getattr(self.primary, op)(*args)
        except Exception as exc:  # noqa: BLE001 - a store must never fail a call
            if self.is_contention(exc):
                self._contended(op in self.WRITES)
            else:
                self._failed(exc)
            return False, None
        self._recovered()
        return True, result

    # Reads trust the shared store whenever it answers: another process may
    # have cleared what this one mirrored (a success, `fluid doctor --reset`).
    # The mirror answers while the store is down, and for the keys written
    # during an outage, until they end.

    def _wrote(self, key: str, ok: bool) -> None:
        if not ok:
            if len(self._unsynced) >= MAX_ENTRIES:
                self._unsynced.clear()  # the mirror's own entries still end by themselves
            self._unsynced.add(key)

    def remaining(self, key: str, now: float) -> float:
        ok, shared = self._shared("remaining", key, now)
        if not ok:
            return self.fallback.remaining(key, now)
        if key in self._unsynced:
            local = self.fallback.remaining(key, now)
            if local <= 0:
                self._unsynced.discard(key)
            return max(float(shared), local)
        return float(shared)

    def extend(self, key: str, seconds: float, now: float, note: str = "") -> float:
        local = self.fallback.extend(key, seconds, now, note)
        ok, shared = self._shared("extend", key, seconds, now, note)
        self._wrote(key, ok)
        return float(shared) if ok else local

    def cap(self, key: str, seconds: float, now: float) -> None:
        self.fallback.cap(key, seconds, now)
        self._shared("cap", key, seconds, now)

    def incr(self, key: str, ttl: float, now: float, note: str = "") -> int:
        local = self.fallback.incr(key, ttl, now, note)
        ok, shared = self._shared("incr", key, ttl, now, note)
        self._wrote(key, ok)
        return int(shared) if ok else local

    def count(self, key: str, now: float) -> int:
        ok, shared = self._shared("count", key, now)
        return int(shared) if ok else self.fallback.count(key, now)

    def peek(self, keys: Sequence[str], now: float) -> list[tuple[float, int]]:
        ok, shared = self._shared("peek", keys, now)
        if not ok:
            return self.fallback.peek(keys, now)
        if not self._unsynced:
            return list(shared)
        local = self.fallback.peek(keys, now)
        return [
            (max(s[0], m[0]), max(s[1], m[1])) if key in self._unsynced else s
            for key, s, m in zip(keys, shared, local, strict=True)
        ]

    def take(
        self, key: str, amount: int, limit: int | None, ttl: float, now: float
    ) -> tuple[bool, int | None]:
        ok, shared = self._shared("take", key, amount, limit, ttl, now)
        if not ok:
            self._wrote(key, False)
            return self.fallback.take(key, amount, limit, ttl, now)
        granted, left = shared
        if granted:  # the mirror follows what was taken, should the store go down
            self.fallback.take(key, amount, limit, ttl, now)
        return bool(granted), left

    def put(self, key: str, value: int, ttl: float, now: float) -> int:
        local = self.fallback.put(key, value, ttl, now)
        ok, shared = self._shared("put", key, value, ttl, now)
        self._wrote(key, ok)
        return int(shared) if ok else local

    def acquire(self, key: str, owner: str, ttl: float, now: float) -> bool:
        local = self.fallback.acquire(key, owner, ttl, now)
        ok, shared = self._shared("acquire", key, owner, ttl, now)
        self._wrote(key, ok)
        if not ok:
            return local
        if not shared:
            self.fallback.release(key, owner)
        return bool(shared)

    def release(self, key: str, owner: str) -> None:
        self.fallback.release(key, owner)
        self._shared("release", key, owner)

    def delete(self, *keys: str) -> None:
        self.fallback.delete(*keys)
        self._unsynced.difference_update(keys)
        self._shared("delete", *keys)

    def delete_now(self, *keys: str, wait: float = RESET_WAIT) -> None:
        """Delete ``keys`` from the shared store itself, or raise :class:`StoreResetError`.

        For a deliberate reset (``LLMClient.reset_health()``): where
        :meth:`delete` lets a busy or down store skip the write, this waits
        up to ``wait`` seconds for a busy writer's lock, ignores the pause
        an earlier contention set, and says so when the store cannot be
        reached, since a reset that silently did nothing leaves the
        operator locked out.
        """
        self.fallback.delete(*keys)
        self._unsynced.difference_update(keys)
        delete_with_wait(self.primary, keys, wait)
        self._busy_until = None
        self._recovered()

    def entries(self, now: float) -> list[StoreEntry]:
        ok, shared = self._shared("entries", now)
        return list(shared) if ok else self.fallback.entries(now)

    def clear(self) -> int:
        local = self.fallback.clear()
        self._unsynced.clear()
        ok, shared = self._shared("clear")
        return int(shared) if ok else local

    def budget_ledger(self) -> BudgetLedger | None:
        """The primary's budgets, never a mirror: a budget is a hard limit, so when
        the shared store fails a call under it is refused, not spent blind."""
        from fluid_build.copilot.health.budget import ledger_for

        return ledger_for(self.primary)

    def close(self) -> None:
        close = getattr(self.primary, "close", None)
        if callable(close):
            close()

    def __repr__(self) -> str:
        return f"ResilientCooldownStore({self.primary!r})"
