"""Shared failure state: cooldown windows, breaker counts and trial leases, with a lifetime.

When a provider answers one call with Retry-After, every other call with the
same key (provider + endpoint + a fingerprint of the API key + model) waits
out that window before sending, instead of hammering the provider into longer
cool-downs. A window only ever grows: a second Retry-After extends it to the
later deadline, never shortens it. The circuit breaker keeps its failure
count and its half-open trial lease in the same store.

Every entry expires by itself: a window at its end, a counter ``ttl`` seconds
after its last increment, a lease at the expiry its owner gave it (so a
killed owner frees it). Nothing needs a human to clear it, and
:meth:`CooldownStore.clear` (``fluid doctor --reset``) clears it anyway.

Stores:

- :class:`MemoryCooldownStore`: one process.
- :class:`SqliteCooldownStore`: every process on the machine (the default).
- :class:`RedisCooldownStore`: every machine that reaches one Redis.

``FLUID_COOLDOWN_URL`` picks one (``memory://``, ``sqlite:///path``,
``redis://host:6379/0``, ``off``). A store that fails degrades to memory with
one warning; it never fails a call.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import math
import mmap
import os
import stat
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol, runtime_checkable
from urllib.parse import unquote, urlsplit

from fluid_build.errors import FluidError

if TYPE_CHECKING:
    import sqlite3

    import redis

__all__ = [
    "COOLDOWN",
    "COOLDOWN_URL_ENV",
    "CooldownKey",
    "CooldownStore",
    "MemoryCooldownStore",
    "RedisCooldownStore",
    "ResilientCooldownStore",
    "SqliteCooldownStore",
    "StoreEntry",
    "StoreResetError",
    "cooldown_store_from_env",
    "cooldown_store_from_url",
    "default_cooldown_path",
    "key_fingerprint",
    "normalize_endpoint",
    "reset_keys",
    "trusted",
]

LOG = logging.getLogger("fluid_build.cooldown")

COOLDOWN_URL_ENV: Final = "FLUID_COOLDOWN_URL"

# A store holds at most this many live entries; the ones ending soonest go first.
MAX_ENTRIES: Final = 10_000
# What one key of a store holds; the part after the kind prefix is a CooldownKey.
SEPARATOR: Final = "|"
#: The store's name for a key's cooldown window (the breaker's entries have their own).
COOLDOWN: Final = "cooldown:"


def key_fingerprint(api_key: str | None) -> str:
    """A short, stable, one-way fingerprint of an API key (never the key itself)."""
    if not api_key:
        return "nokey"
    digest = hashlib.blake2b(api_key.encode(), digest_size=8, person=b"fluid-cooldown")
    return digest.hexdigest()


def normalize_endpoint(url: str | None) -> str:
    """``url`` as it scopes shared state: scheme://host[:port]/path, lower-cased host.

    User, password, query and fragment are dropped (they may hold credentials
    and never name another server); a default port and a trailing slash too.
    """
    if not url:
        return "-"
    try:
        parts = urlsplit(url.strip())
        scheme = parts.scheme.lower() or "https"
        host = (parts.hostname or "").lower()
        port = parts.port
    except ValueError:
        return "-"
    if ":" in host:
        host = f"[{host}]"
    if port is not None and (scheme, port) not in {("http", 80), ("https", 443)}:
        host = f"{host}:{port}"
    path = parts.path.rstrip("/").replace(SEPARATOR, "%7C")
    return f"{scheme}://{host}{path}"


@dataclass(frozen=True, slots=True)
class CooldownKey:
    """Who shares a cooldown and a breaker: one provider, endpoint, API key and model."""

    provider: str
    fingerprint: str
    model: str
    endpoint: str = "-"

    @classmethod
    def for_call(
        cls, provider: str, api_key: str | None, model: str, endpoint: str | None = None
    ) -> CooldownKey:
        return cls(provider, key_fingerprint(api_key), model, normalize_endpoint(endpoint))

    @classmethod
    def parse(cls, text: str) -> CooldownKey | None:
        """The key :meth:`__str__` wrote, or None for text in another shape."""
        parts = text.split(SEPARATOR)
        if len(parts) < 4:
            return None
        provider, fingerprint, model = parts[0], parts[-2], parts[-1]
        return cls(provider, fingerprint, model, SEPARATOR.join(parts[1:-2]))

    def __str__(self) -> str:
        return SEPARATOR.join((self.provider, self.endpoint, self.fingerprint, self.model))


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
                "shared state %s ends in %.0f s, beyond its %g s cap (a skewed clock or a "
                "planted entry); cut down to %g s",
                key,
                left,
                cap,
                cap,
            )
        store.cap(key, cap, now)
    return cap


def _valid(seconds: float) -> bool:
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
        if not _valid(seconds):
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


def default_cooldown_path(env: Mapping[str, str] | None = None) -> Path:
    """``$XDG_CACHE_HOME/fluid_build/cooldown.sqlite3`` (``~/.cache`` by default)."""
    env = os.environ if env is None else env
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "fluid_build" / "cooldown.sqlite3"


_SCHEMA: Final = (
    "CREATE TABLE IF NOT EXISTS fluid_state (key TEXT PRIMARY KEY, until REAL NOT NULL, "
    "since REAL NOT NULL, n INTEGER NOT NULL DEFAULT 0, owner TEXT, note TEXT NOT NULL DEFAULT '')"
)
# Before the state had a lifetime: counters without an end. Dropping them heals
# a machine that an older version locked out.
_LEGACY_TABLES: Final = ("cooldown", "counters")

_EXTEND_SQL: Final = (
    "INSERT INTO fluid_state (key, until, since, note) VALUES (:key, :until, :now, :note) "
    "ON CONFLICT(key) DO UPDATE SET "
    "since = CASE WHEN until > :now THEN since ELSE :now END, "
    "n = CASE WHEN until > :now THEN n ELSE 0 END, "
    "owner = CASE WHEN until > :now THEN owner ELSE NULL END, "
    "note = CASE WHEN :note != '' THEN :note ELSE note END, "
    "until = max(CASE WHEN until > :now THEN until ELSE 0 END, :until) "
    "RETURNING until"
)
_INCR_SQL: Final = (
    "INSERT INTO fluid_state (key, until, since, n, note) VALUES (:key, :until, :now, 1, :note) "
    "ON CONFLICT(key) DO UPDATE SET "
    "n = CASE WHEN until > :now THEN n + 1 ELSE 1 END, "
    "since = CASE WHEN until > :now THEN since ELSE :now END, "
    "owner = NULL, "
    "note = CASE WHEN :note != '' THEN :note ELSE note END, "
    "until = :until "
    "RETURNING n"
)
_ACQUIRE_SQL: Final = (
    "INSERT INTO fluid_state (key, until, since, owner) VALUES (:key, :until, :now, :owner) "
    "ON CONFLICT(key) DO UPDATE SET "
    "since = CASE WHEN owner IS :owner AND until > :now THEN since ELSE :now END, "
    "n = 0, note = '', owner = :owner, until = :until "
    "WHERE until <= :now OR owner IS NULL OR owner = :owner "
    "RETURNING owner"
)


_O_NONBLOCK: Final = getattr(os, "O_NONBLOCK", 0)
_O_NOFOLLOW: Final = getattr(os, "O_NOFOLLOW", 0)
_O_CLOEXEC: Final = getattr(os, "O_CLOEXEC", 0)
#: The bytes of the generation stamp at the start of the sidecar file.
_STAMP_SIZE: Final = 8


def _map_stamp(path: Path) -> mmap.mmap:
    """The first 8 bytes of ``path``, mapped shared; the file is created (or grown) to 8.

    Opened without following a link and without blocking, and refused unless
    it is a regular file: a FIFO or device planted there is an error (the
    store is then treated as down), never a hang. The file only ever grows,
    so the mapped bytes stay inside it.
    """
    flags = os.O_RDWR | os.O_CREAT | _O_NONBLOCK | _O_NOFOLLOW | _O_CLOEXEC
    fd = os.open(path, flags, 0o600)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        if info.st_size < _STAMP_SIZE:
            os.ftruncate(fd, _STAMP_SIZE)  # zeros; a concurrent opener grows it alike
        return mmap.mmap(fd, _STAMP_SIZE)  # keeps its own descriptor
    finally:
        os.close(fd)


class SqliteCooldownStore:
    """Entries in a sqlite file, shared by every process on the machine.

    Each change is one upsert, so concurrent writers cannot lose each other's
    updates. Readers do not query sqlite on every call: after each committed
    change a writer sets a fresh random 8-byte stamp at the start of a sidecar
    file (``<file>.generation``) that every process maps into memory, and a
    reader re-reads the table only when the stamp differs from the one it
    read the table under. Checking costs no system call, so a call on a key
    with nothing stored costs a comparison of 8 bytes. A stamp is random, not
    a counter, so that writers need no lock to set it and a value can never
    come back: a reader that read the table before a change is sure to see a
    stamp it has not seen once that change is committed.

    Nothing but this store writes the sidecar, and it never shrinks (a file
    truncated under a mapping would crash its readers): ``fluid doctor
    --reset`` clears the table and sets a new stamp.

    The file is in WAL mode, so a writer never blocks readers. A write waits
    at most ``busy_timeout`` seconds (0.1 by default) for another writer's
    lock, and as long again for another thread of this process that is
    waiting on it; then it raises ``sqlite3.OperationalError`` ("database is
    locked"), which :class:`ResilientCooldownStore` treats as contention, not
    as a failure (see :meth:`ResilientCooldownStore.is_contention`). The
    state is advisory: a call never waits longer than that on it.
    """

    #: Seconds a write waits for the lock before giving up (per operation).
    DEFAULT_BUSY_TIMEOUT: Final = 0.1

    def __init__(
        self, path: str | os.PathLike[str], *, busy_timeout: float = DEFAULT_BUSY_TIMEOUT
    ) -> None:
        self.path = Path(path)
        self._stamp_path = self.path.with_name(self.path.name + ".generation")
        self.busy_timeout = busy_timeout
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._pid = 0
        self._stamp: mmap.mmap | None = None
        self._seen_stamp: bytes | None = None
        self._cache: dict[str, tuple[float, int]] = {}
        self._writes = 0

    def _acquire(self) -> None:
        """Take this store's thread lock, waiting no longer than a busy database would."""
        if not self._lock.acquire(timeout=max(self.busy_timeout, 0.001)):
            import sqlite3

            raise sqlite3.OperationalError(
                "database is locked (another thread of this process is waiting on it)"
            )

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None or self._pid != os.getpid():  # a forked child opens its own
            import sqlite3

            self.path.parent.mkdir(parents=True, exist_ok=True)
            timeout = max(self.busy_timeout, 0.0)
            conn = sqlite3.connect(self.path, timeout=timeout, check_same_thread=False)
            try:
                conn.execute(f"PRAGMA busy_timeout={int(timeout * 1000)}")
                conn.execute("PRAGMA journal_mode=WAL")
                # Advisory state: a power cut may lose the last changes, never the file.
                conn.execute("PRAGMA synchronous=NORMAL")
                with conn:
                    conn.execute(_SCHEMA)
                    for table in _LEGACY_TABLES:
                        conn.execute(f"DROP TABLE IF EXISTS {table}")
            except BaseException:
                conn.close()
                raise
            if self._stamp is None:  # a forked child shares its parent's mapping
                try:
                    self._stamp = _map_stamp(self._stamp_path)
                except BaseException:
                    conn.close()
                    raise
            self._conn, self._pid = conn, os.getpid()
            self._seen_stamp = None
        return self._conn

    def _refresh(self, now: float) -> None:
        """Re-read the live rows if any process committed a change since the last read."""
        stamp = self._stamp
        if stamp is not None and stamp[:_STAMP_SIZE] == self._seen_stamp:
            return
        self._acquire()
        try:
            conn = self._connection()
            assert self._stamp is not None  # mapped by _connection()
            # The stamp first, then the rows: a change committed after this read
            # sets a new stamp, which the next call sees.
            seen = self._stamp[:_STAMP_SIZE]
            rows = conn.execute(
                "SELECT key, until, n FROM fluid_state WHERE until > ?", (now,)
            ).fetchall()
            self._cache = {key: (float(until), int(n)) for key, until, n in rows}
            self._seen_stamp = seen
        finally:
            self._lock.release()

    def _write(
        self, sql: str, params: Mapping[str, Any] | tuple[Any, ...], now: float | None
    ) -> Any:
        """Run one change in its own transaction; return its first row.

        With ``now``, entries that ended over a minute before it are purged too.
        """
        self._acquire()
        try:
            conn = self._connection()
            with conn:
                row = conn.execute(sql, params).fetchone()
                self._writes += 1
                if now is not None:
                    conn.execute("DELETE FROM fluid_state WHERE until < ?", (now - 60.0,))
                if self._writes % 100 == 0:
                    conn.execute(
                        "DELETE FROM fluid_state WHERE key NOT IN "
                        "(SELECT key FROM fluid_state ORDER BY until DESC LIMIT ?)",
                        (MAX_ENTRIES,),
                    )
            self._bump()
        finally:
            self._lock.release()
        return row

    def _bump(self) -> None:
        # A new stamp only after the change is committed: a reader that sees it
        # is sure to read the new rows. Random (from the OS, never a PRNG that a
        # fork copies) so that no two writes set the same stamp.
        assert self._stamp is not None  # mapped by _connection()
        self._stamp[:_STAMP_SIZE] = os.urandom(_STAMP_SIZE)
        self._seen_stamp = None

    def remaining(self, key: str, now: float) -> float:
        self._refresh(now)
        cached = self._cache.get(key)
        return cached[0] - now if cached is not None and cached[0] > now else 0.0

    def extend(self, key: str, seconds: float, now: float, note: str = "") -> float:
        if not _valid(seconds):
            return self.remaining(key, now)
        row = self._write(
            _EXTEND_SQL, {"key": key, "until": now + seconds, "now": now, "note": note}, now
        )
        return max(float(row[0]) - now, 0.0) if row else seconds

    def cap(self, key: str, seconds: float, now: float) -> None:
        self._write(
            "UPDATE fluid_state SET until = min(until, ?) WHERE key = ? RETURNING until",
            (now + max(seconds, 0.0), key),
            now,
        )

    def incr(self, key: str, ttl: float, now: float, note: str = "") -> int:
        until = now + max(ttl, 0.001)
        row = self._write(_INCR_SQL, {"key": key, "until": until, "now": now, "note": note}, now)
        return int(row[0])

    def count(self, key: str, now: float) -> int:
        self._refresh(now)
        cached = self._cache.get(key)
        return cached[1] if cached is not None and cached[0] > now else 0

    def peek(self, keys: Sequence[str], now: float) -> list[tuple[float, int]]:
        self._refresh(now)
        out = []
        for key in keys:
            cached = self._cache.get(key)
            if cached is None or cached[0] <= now:
                out.append((0.0, 0))
            else:
                out.append((cached[0] - now, cached[1]))
        return out

    def acquire(self, key: str, owner: str, ttl: float, now: float) -> bool:
        until = now + max(ttl, 0.001)
        row = self._write(
            _ACQUIRE_SQL, {"key": key, "until": until, "now": now, "owner": owner}, now
        )
        return row is not None

    def release(self, key: str, owner: str) -> None:
        self._write(
            "DELETE FROM fluid_state WHERE key = ? AND owner = ? RETURNING key",
            (key, owner),
            None,
        )

    def delete(self, *keys: str) -> None:
        if not keys:
            return
        marks = ",".join("?" * len(keys))
        self._write(f"DELETE FROM fluid_state WHERE key IN ({marks}) RETURNING key", keys, None)  # noqa: S608 - only placeholders

    def entries(self, now: float) -> list[StoreEntry]:
        self._acquire()
        try:
            rows = (
                self._connection()
                .execute(
                    "SELECT key, until, since, n, owner, note FROM fluid_state WHERE until > ? "
                    "ORDER BY key LIMIT ?",
                    (now, MAX_ENTRIES),
                )
                .fetchall()
            )
        finally:
            self._lock.release()
        return [
            StoreEntry(k, float(u), float(s), int(n), o, str(t or "")) for k, u, s, n, o, t in rows
        ]

    def clear(self) -> int:
        self._acquire()
        try:
            conn = self._connection()
            with conn:
                gone = conn.execute("DELETE FROM fluid_state").rowcount
            self._bump()
        finally:
            self._lock.release()
        return int(gone)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
            if self._stamp is not None:
                stamp, self._stamp = self._stamp, None
                self._seen_stamp = None
                stamp.close()

    def __repr__(self) -> str:
        return f"SqliteCooldownStore({str(self.path)!r})"


# Each entry is a Redis hash: its end (``until``, wall-clock seconds, as every
# store keeps it), when it began, a counter, a lease owner and a note. Every
# change is one Lua script, so it is atomic across the fleet. The key's Redis
# TTL only cleans up: it outlives ``until`` by a minute, for readers whose
# clocks run a little behind. ARGV[1] is always the caller's ``now``.
_REDIS_EXTEND: Final = """
local now = tonumber(ARGV[1])
local want = now + tonumber(ARGV[2])
local til = tonumber(redis.call('HGET', KEYS[1], 'until') or '0') or 0
if til <= now then
  redis.call('DEL', KEYS[1])
  redis.call('HSET', KEYS[1], 'since', ARGV[1])
  til = 0
end
if ARGV[3] ~= '' then redis.call('HSET', KEYS[1], 'note', ARGV[3]) end
if til >= want then return tostring(til - now) end
redis.call('HSET', KEYS[1], 'until', tostring(want))
redis.call('PEXPIRE', KEYS[1], math.ceil(tonumber(ARGV[2]) * 1000) + 60000)
return tostring(want - now)
"""
_REDIS_CAP: Final = """
local now = tonumber(ARGV[1])
local want = now + tonumber(ARGV[2])
local til = tonumber(redis.call('HGET', KEYS[1], 'until') or '0') or 0
if til > want then
  redis.call('HSET', KEYS[1], 'until', tostring(want))
  redis.call('PEXPIRE', KEYS[1], math.ceil(tonumber(ARGV[2]) * 1000) + 60000)
end
return 0
"""
_REDIS_INCR: Final = """
local now = tonumber(ARGV[1])
local til = tonumber(redis.call('HGET', KEYS[1], 'until') or '0') or 0
if til <= now or redis.call('HEXISTS', KEYS[1], 'owner') == 1 then
  redis.call('DEL', KEYS[1])
  redis.call('HSET', KEYS[1], 'since', ARGV[1])
end
local n = redis.call('HINCRBY', KEYS[1], 'n', 1)
if ARGV[3] ~= '' then redis.call('HSET', KEYS[1], 'note', ARGV[3]) end
redis.call('HSET', KEYS[1], 'until', tostring(now + tonumber(ARGV[2])))
redis.call('PEXPIRE', KEYS[1], math.ceil(tonumber(ARGV[2]) * 1000) + 60000)
return n
"""
_REDIS_ACQUIRE: Final = """
local now = tonumber(ARGV[1])
local til = tonumber(redis.call('HGET', KEYS[1], 'until') or '0') or 0
local held = redis.call('HGET', KEYS[1], 'owner')
if til > now and held and held ~= ARGV[3] then return 0 end
if not (til > now and held == ARGV[3]) then
  redis.call('DEL', KEYS[1])
  redis.call('HSET', KEYS[1], 'owner', ARGV[3], 'since', ARGV[1])
end
redis.call('HSET', KEYS[1], 'until', tostring(now + tonumber(ARGV[2])))
redis.call('PEXPIRE', KEYS[1], math.ceil(tonumber(ARGV[2]) * 1000) + 60000)
return 1
"""
_REDIS_RELEASE: Final = """
if redis.call('HGET', KEYS[1], 'owner') == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class RedisCooldownStore:
    """Entries as Redis hashes, shared by every machine on one Redis.

    Like the other stores it keeps each entry's end in wall-clock seconds, so
    the machines' clocks should agree (NTP); a skewed writer can never make
    a reader wait past the cap the reader applies (see :func:`trusted`).
    """

    # Before entries were hashes with a lifetime; ``clear`` removes these too.
    LEGACY_PREFIX: Final = "fluid:cooldown:"

    def __init__(
        self,
        url: str | None = None,
        *,
        client: redis.Redis | None = None,
        prefix: str = "fluid:health:",
        timeout: float = 0.5,
    ) -> None:
        if client is None:
            import redis as redis_lib  # only a Redis store needs it

            if url is None:
                raise ValueError("RedisCooldownStore needs a url or a client")
            client = redis_lib.Redis.from_url(
                url, socket_timeout=timeout, socket_connect_timeout=timeout
            )
        self._client = client
        self._prefix = prefix
        scripts = (_REDIS_EXTEND, _REDIS_CAP, _REDIS_INCR, _REDIS_ACQUIRE, _REDIS_RELEASE)
        self._extend, self._cap, self._incr, self._acquire, self._release = (
            client.register_script(script) for script in scripts
        )
        self._url = _without_password(url) if url else repr(client)

    def remaining(self, key: str, now: float) -> float:
        return self.peek([key], now)[0][0]

    def peek(self, keys: Sequence[str], now: float) -> list[tuple[float, int]]:
        if len(keys) == 1:
            replies = [self._client.hmget(self._prefix + keys[0], "until", "n")]
        else:
            pipe = self._client.pipeline(transaction=False)
            for key in keys:
                pipe.hmget(self._prefix + key, "until", "n")
            replies = pipe.execute()
        out = []
        for until, n in replies:
            left = _float(_text(until), 0.0) - now
            out.append((left, int(_float(_text(n), 0.0))) if left > 0 else (0.0, 0))
        return out

    def extend(self, key: str, seconds: float, now: float, note: str = "") -> float:
        if not _valid(seconds):
            return self.remaining(key, now)
        left = self._extend(keys=[self._prefix + key], args=[repr(now), repr(seconds), note])
        return max(_float(_text(left), 0.0), 0.0)

    def cap(self, key: str, seconds: float, now: float) -> None:
        self._cap(keys=[self._prefix + key], args=[repr(now), repr(max(seconds, 0.0))])

    def incr(self, key: str, ttl: float, now: float, note: str = "") -> int:
        ttl = max(ttl, 0.001)
        return int(self._incr(keys=[self._prefix + key], args=[repr(now), repr(ttl), note]))

    def count(self, key: str, now: float) -> int:
        return self.peek([key], now)[0][1]

    def acquire(self, key: str, owner: str, ttl: float, now: float) -> bool:
        ttl = max(ttl, 0.001)
        return bool(self._acquire(keys=[self._prefix + key], args=[repr(now), repr(ttl), owner]))

    def release(self, key: str, owner: str) -> None:
        self._release(keys=[self._prefix + key], args=[owner])

    def delete(self, *keys: str) -> None:
        if keys:
            self._client.delete(*(self._prefix + key for key in keys))

    def _scan(self, prefix: str) -> list[bytes]:
        pattern = "".join("\\" + ch if ch in "*?[]\\" else ch for ch in prefix) + "*"
        found: list[bytes] = []
        for name in self._client.scan_iter(match=pattern, count=1000):
            found.append(name)
            if len(found) >= MAX_ENTRIES:
                break
        return found

    def entries(self, now: float) -> list[StoreEntry]:
        names = self._scan(self._prefix)
        pipe = self._client.pipeline(transaction=False)
        for name in names:
            pipe.hgetall(name)
        replies = pipe.execute() if names else []
        out: list[StoreEntry] = []
        for name, fields in zip(names, replies, strict=True):
            if not isinstance(fields, dict):
                continue
            text = {_text(k) or "": _text(v) for k, v in fields.items()}
            until = _float(text.get("until"), 0.0)
            if until <= now:
                continue
            out.append(
                StoreEntry(
                    (_text(name) or "")[len(self._prefix) :],
                    until,
                    _float(text.get("since"), now),
                    int(_float(text.get("n"), 0.0)),
                    text.get("owner"),
                    text.get("note") or "",
                )
            )
        return sorted(out, key=lambda entry: entry.key)

    def clear(self) -> int:
        names = self._scan(self._prefix) + self._scan(self.LEGACY_PREFIX)
        if names:
            self._client.delete(*names)
        return len(names)

    def __repr__(self) -> str:
        return f"RedisCooldownStore({self._url!r})"


def _text(value: object) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)


def _float(text: str | None, default: float) -> float:
    try:
        value = float(text) if text is not None else default
    except ValueError:
        return default
    return value if math.isfinite(value) else default


def _without_password(url: str) -> str:
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
                else f"{type(exc).__name__}: {_without_password(str(exc))}"
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
    one warning; the store is tried again every ``retry_every`` seconds and a
    recovery is logged too.

    Contention is not a failure: when the shared store is busy (another
    process holds the sqlite file's write lock past its short busy timeout,
    see :meth:`is_contention`), the call goes ahead on the mirror's answer,
    the store's answer being advisory. One warning says so (at most one per
    ``retry_every`` seconds), the store is not marked down, reads keep asking
    it, and writes skip it for ``contention_pause`` seconds so that no call
    waits on the lock twice in a row. The changes made meanwhile stay in this
    process until they end.
    """

    WRITES: Final = frozenset({"extend", "cap", "incr", "acquire", "release", "delete", "clear"})

    def __init__(
        self,
        primary: CooldownStore,
        *,
        retry_every: float = 30.0,
        contention_pause: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.primary = primary
        self.fallback = MemoryCooldownStore()
        self._retry_every = retry_every
        self._contention_pause = contention_pause
        self._clock = clock
        self._down_since: float | None = None
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
        return self._down_since is None or self._clock() - self._down_since >= self._retry_every

    def _contended(self) -> None:
        with self._busy_lock:
            now = self._clock()
            self.contended += 1
            self._busy_until = now + self._contention_pause
            if self._busy_warned is not None and now - self._busy_warned < self._retry_every:
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
                _without_password(str(exc)),
            )
        self._down_since = self._clock()

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
                self._contended()
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

    def close(self) -> None:
        close = getattr(self.primary, "close", None)
        if callable(close):
            close()

    def __repr__(self) -> str:
        return f"ResilientCooldownStore({self.primary!r})"


def cooldown_store_from_url(
    url: str | None, *, env: Mapping[str, str] | None = None
) -> CooldownStore | None:
    """The store a URL names, wrapped so that it never fails a call.

    ``None`` or ``""``: the sqlite file at :func:`default_cooldown_path`;
    ``memory://``; ``sqlite:///abs/path`` or a plain path; ``redis://`` or
    ``rediss://``; ``off`` / ``none``: no cooldown sharing at all. An
    unknown scheme logs a warning and uses the default.
    """
    text = (url or "").strip()
    if text.lower() in {"off", "none", "disabled", "0"}:
        return None
    if text.lower() in {"memory", "memory://", "mem://"}:
        return MemoryCooldownStore()
    try:
        scheme = urlsplit(text).scheme.lower() if "://" in text else ""
    except ValueError:  # "http://[" and friends
        scheme = "unparsable"
    primary: CooldownStore
    if scheme in {"redis", "rediss", "unix"}:
        try:
            primary = RedisCooldownStore(text)
        except Exception as exc:  # noqa: BLE001 - e.g. the redis package is missing
            hint = " (install fluid-build[redis])" if isinstance(exc, ImportError) else ""
            LOG.warning(
                "%s=%s cannot be used (%s: %s); sharing cooldowns in this process only%s",
                COOLDOWN_URL_ENV,
                _without_password(text),
                type(exc).__name__,
                _without_password(str(exc)),
                hint,
            )
            return MemoryCooldownStore()
    elif scheme in {"sqlite", "file"}:
        path = unquote(text.split("://", 1)[1].split("?", 1)[0])
        if not path.strip():
            LOG.warning(
                "%s=%r names no file; using the sqlite file at %s",
                COOLDOWN_URL_ENV,
                text,
                default_cooldown_path(env),
            )
            path = str(default_cooldown_path(env))
        primary = SqliteCooldownStore(path)
    elif scheme == "" and text:
        try:
            where = Path(text).expanduser()
        except RuntimeError:  # "~someone/..." for a user this machine does not know
            where = default_cooldown_path(env)
            LOG.warning(
                "%s=%r names the home of an unknown user; using the sqlite file at %s",
                COOLDOWN_URL_ENV,
                text[:200],
                where,
            )
        primary = SqliteCooldownStore(where)
    else:
        if text:
            LOG.warning(
                "%s=%r has an unknown scheme; using the sqlite file at %s",
                COOLDOWN_URL_ENV,
                _without_password(text),
                default_cooldown_path(env),
            )
        primary = SqliteCooldownStore(default_cooldown_path(env))
    return ResilientCooldownStore(primary)


def cooldown_store_from_env(env: Mapping[str, str] | None = None) -> CooldownStore | None:
    """The store ``FLUID_COOLDOWN_URL`` names (the sqlite file by default)."""
    env = os.environ if env is None else env
    return cooldown_store_from_url(env.get(COOLDOWN_URL_ENV), env=env)
