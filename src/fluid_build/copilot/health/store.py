"""The store protocol (:class:`CooldownStore`), the in-process store, and reading back.

Every store keeps entries with an end in wall-clock seconds: a cooldown window, a
breaker's failure counter, a half-open trial lease. :class:`MemoryCooldownStore`
serves one process; the shared stores are in :mod:`.sqlite_store` (the default)
and :mod:`.redis_store`, and :mod:`.resilient` keeps any of them from failing a call.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Protocol, runtime_checkable
from urllib.parse import urlsplit

__all__ = [
    "LONGEST",
    "MAX_ENTRIES",
    "CooldownStore",
    "MemoryCooldownStore",
    "StandInCooldownStore",
    "StoreEntry",
    "readable_seconds",
    "sane_entry",
    "trusted",
    "valid_seconds",
    "without_password",
]

LOG = logging.getLogger("fluid_build.cooldown")

# A store holds at most this many live entries; the ones ending soonest go first.
MAX_ENTRIES: Final = 10_000

#: Seconds ahead past which an entry is not fluid's. The longest entry fluid writes
#: is a half-open window at its settings' maxima (1 h cool-off + 1 h window); a day
#: leaves room for any clock skew. An entry ending later (1e300, inf), or holding
#: something that is not a number, is skipped and deleted by every store.
LONGEST: Final = 86_400.0
#: The largest counter or budget a store keeps (larger than any real budget).
MOST: Final = 10**15


def sane_entry(until: object, since: object, count: object, now: float) -> bool:
    """Whether these fields, read back from a shared store, can be an entry fluid wrote."""
    if not (_number(until) and _number(since)) or not isinstance(count, int):
        return False
    assert isinstance(until, int | float)
    assert isinstance(since, int | float)
    return (
        math.isfinite(until)
        and math.isfinite(since)
        and until <= now + LONGEST
        and 0 <= since <= now + LONGEST
        and 0 <= count <= MOST
    )


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def readable_seconds(seconds: float) -> str:
    """``seconds`` as an operator reads a wait: "45 s", "5 min", "13 h 53 min", "more than 1 day".

    Never a 300-digit number: anything past a day (:data:`LONGEST`) is "more than 1 day".
    """
    if math.isnan(seconds):
        return "an unknown time"
    if seconds > LONGEST:
        return "more than 1 day"
    seconds = max(seconds, 0.0)
    if seconds < 120:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    if minutes <= 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if minutes else f"{hours} h"


@dataclass(frozen=True, slots=True)
class StoreEntry:
    """One live entry of a store, as ``fluid doctor`` lists it. Times are wall-clock seconds."""

    key: str
    until: float
    since: float
    count: int = 0
    owner: str | None = None
    note: str = ""


@runtime_checkable
class CooldownStore(Protocol):
    """Where shared state lives. ``now`` is wall-clock seconds (``time.time()``).

    Every write gives its entry an end; nothing lives forever.
    """

    def remaining(self, key: str, now: float) -> float:
        """Seconds left before ``key`` ends (0.0 when it is not there)."""
        ...

    def extend(self, key: str, seconds: float, now: float, note: str = "") -> float:
        """Make ``key`` last at least ``seconds`` more; return the seconds now left."""
        ...

    def cap(self, key: str, seconds: float, now: float) -> None:
        """Make ``key`` end within ``seconds`` (repairs a skewed or planted entry)."""
        ...

    def incr(self, key: str, ttl: float, now: float, note: str = "") -> int:
        """Add one to ``key``'s counter, which now ends ``ttl`` s from ``now``; return it.

        A counter that has ended starts again from one.
        """
        ...

    def count(self, key: str, now: float) -> int:
        """The counter's value (0 when it is not there or has ended)."""
        ...

    def peek(self, keys: Sequence[str], now: float) -> list[tuple[float, int]]:
        """``(remaining, count)`` of each key, read together (one staleness check for sqlite)."""
        ...

    def take(
        self, key: str, amount: int, limit: int | None, ttl: float, now: float
    ) -> tuple[bool, int | None]:
        """Take ``amount`` from ``key``'s budget, all or nothing: ``(granted, left)``. Atomic.

        A live budget that holds ``amount`` gives it; one that does not is left
        as it is and refuses. With no live budget, ``limit`` starts one (ending
        ``ttl`` s from ``now``) that always grants this first take, down to at
        least 0; with ``limit`` None nothing is known, the take is granted, nothing
        is written and ``left`` is None. A negative ``amount`` gives back (never
        above ``limit``, when given) and is always granted.
        """
        ...

    def put(self, key: str, value: int, ttl: float, now: float) -> int:
        """Set ``key``'s budget to ``value``, ending ``ttl`` s from ``now``; return what is left.

        Never above what a live budget still holds: takes the announcer had
        not seen yet stay taken. A ``ttl`` that is not positive writes nothing.
        """
        ...

    def acquire(self, key: str, owner: str, ttl: float, now: float) -> bool:
        """Take (or renew) the lease ``key`` for ``owner`` until ``now + ttl``.

        False when another owner holds a lease that has not ended. Atomic.
        """
        ...

    def release(self, key: str, owner: str) -> None:
        """Give the lease back, if ``owner`` still holds it."""
        ...

    def delete(self, *keys: str) -> None:
        """Remove these entries, whatever they hold."""
        ...

    def entries(self, now: float) -> list[StoreEntry]:
        """Every live entry, for ``fluid doctor``."""
        ...

    def clear(self) -> int:
        """Remove every entry this store holds; return how many there were."""
        ...


_CLAMPED: set[str] = set()


def trusted(store: CooldownStore, key: str, left: float, cap: float, now: float) -> float:
    """``left``, read back from ``store``, never longer than ``cap``.

    A longer entry can only come from a skewed clock or a planted value: it
    is logged once, cut down to ``cap`` in the store, and ``cap`` is returned.
    """
    if left <= cap:
        return left
    if left > cap + 1.0:  # past the writers' clock differences: repair it
        if key not in _CLAMPED and len(_CLAMPED) < 1000:
            _CLAMPED.add(key)
            LOG.warning(
                "shared state %s ends in %s, beyond its %s cap (a skewed clock or a "
                "planted entry); cut down to %s",
                key,
                readable_seconds(left),
                readable_seconds(cap),
                readable_seconds(cap),
            )
        store.cap(key, cap, now)
    return cap


def valid_seconds(seconds: float) -> bool:
    """Whether ``seconds`` can lengthen an entry: finite and positive."""
    return math.isfinite(seconds) and seconds > 0


class _Record:
    __slots__ = ("count", "note", "owner", "since", "until")

    def __init__(self, until: float, since: float) -> None:
        self.until = until
        self.since = since
        self.count = 0
        self.owner: str | None = None
        self.note = ""


class MemoryCooldownStore:
    """Entries in a dict: shared by the threads and tasks of one process."""

    def __init__(self) -> None:
        self._records: dict[str, _Record] = {}
        self._lock = threading.Lock()

    def _live(self, key: str, now: float) -> _Record | None:
        record = self._records.get(key)
        return record if record is not None and record.until > now else None

    def _fresh(self, key: str, until: float, now: float) -> _Record:
        record = _Record(until, now)
        self._records[key] = record
        if len(self._records) > MAX_ENTRIES:
            live = sorted(
                ((k, r) for k, r in self._records.items() if r.until > now),
                key=lambda item: item[1].until,
            )
            self._records = dict(live[-MAX_ENTRIES:])
            self._records[key] = record
        return record

    def remaining(self, key: str, now: float) -> float:
        record = self._records.get(key)
        return record.until - now if record is not None and record.until > now else 0.0

    def extend(self, key: str, seconds: float, now: float, note: str = "") -> float:
        if not valid_seconds(seconds):
            return self.remaining(key, now)
        with self._lock:
            record = self._live(key, now) or self._fresh(key, now, now)
            record.until = max(record.until, now + seconds)
            if note:
                record.note = note
            return record.until - now

    def cap(self, key: str, seconds: float, now: float) -> None:
        with self._lock:
            record = self._live(key, now)
            if record is not None:
                record.until = min(record.until, now + max(seconds, 0.0))

    def incr(self, key: str, ttl: float, now: float, note: str = "") -> int:
        with self._lock:
            record = self._live(key, now) or self._fresh(key, now, now)
            record.count += 1
            record.until = now + max(ttl, 0.001)
            if note:
                record.note = note
            return record.count

    def count(self, key: str, now: float) -> int:
        record = self._records.get(key)
        return record.count if record is not None and record.until > now else 0

    def peek(self, keys: Sequence[str], now: float) -> list[tuple[float, int]]:
        out = []
        for key in keys:
            record = self._records.get(key)
            if record is None or record.until <= now:
                out.append((0.0, 0))
            else:
                out.append((record.until - now, record.count))
        return out

    def take(
        self, key: str, amount: int, limit: int | None, ttl: float, now: float
    ) -> tuple[bool, int | None]:
        with self._lock:
            record = self._live(key, now)
            if record is None:
                if limit is None or amount < 0:
                    return True, None
                record = self._fresh(key, now + max(ttl, 0.001), now)
                record.count = max(limit - amount, 0)
                return True, record.count
            if amount > record.count:
                return False, record.count
            record.count -= amount
            if limit is not None and amount < 0:
                record.count = min(record.count, max(limit, 0))
            return True, record.count

    def put(self, key: str, value: int, ttl: float, now: float) -> int:
        with self._lock:
            record = self._live(key, now)
            if not valid_seconds(ttl):
                return record.count if record is not None else 0
            if record is None:
                record = self._fresh(key, now, now)
                record.count = max(value, 0)
            else:
                record.count = min(record.count, max(value, 0))
            record.until = now + ttl
            return record.count

    def acquire(self, key: str, owner: str, ttl: float, now: float) -> bool:
        with self._lock:
            record = self._live(key, now)
            if record is not None and record.owner not in (None, owner):
                return False
            if record is None or record.owner != owner:
                record = self._fresh(key, now, now)
                record.owner = owner
            record.until = now + max(ttl, 0.001)
            return True

    def release(self, key: str, owner: str) -> None:
        with self._lock:
            record = self._records.get(key)
            if record is not None and record.owner == owner:
                del self._records[key]

    def delete(self, *keys: str) -> None:
        with self._lock:
            for key in keys:
                self._records.pop(key, None)

    def entries(self, now: float) -> list[StoreEntry]:
        with self._lock:
            items = list(self._records.items())
        return [
            StoreEntry(key, r.until, r.since, r.count, r.owner, r.note)
            for key, r in items
            if r.until > now
        ]

    def clear(self) -> int:
        with self._lock:
            gone = len(self._records)
            self._records = {}
        return gone

    def __repr__(self) -> str:
        return "MemoryCooldownStore()"


class StandInCooldownStore(MemoryCooldownStore):
    """This process's own entries, standing in for a shared store that cannot be used.

    Cooldowns are advisory, so they go on in this process; a budget is not, so
    no budget is kept here (see ``health.budget.ledger_for``). ``why`` says what
    was asked for and why it cannot be used, without a password.
    """

    def __init__(self, why: str) -> None:
        super().__init__()
        self.why = why

    def __repr__(self) -> str:
        return f"StandInCooldownStore({self.why!r})"


def without_password(url: str) -> str:
    """``url`` with any password masked; never raises, whatever the text."""
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
        user = f"{parts.username}:***@" if parts.username else ":***@"
        return parts._replace(netloc=f"{user}{host}{port}").geturl()
    except ValueError:  # a malformed port or bracket: show nothing after the scheme
        scheme = url.split("://", 1)[0] if "://" in url else ""
        return f"{scheme}://<unparsable>" if scheme else "<unparsable>"
