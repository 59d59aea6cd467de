"""A cooldown shared by every call on one key: in this process, on this machine, or across machines.

When a provider answers one call with Retry-After, every other call with the
same key (provider + a fingerprint of the API key + model) waits out that
window before sending, instead of hammering the provider into longer
cool-downs. A window only ever grows: a second Retry-After extends it to the
later deadline, never shortens it.

Stores:

- :class:`MemoryCooldownStore`: one process.
- :class:`SqliteCooldownStore`: every process on the machine (the default).
- :class:`RedisCooldownStore`: every machine that reaches one Redis.

``FLUID_COOLDOWN_URL`` picks one (``memory://``, ``sqlite:///path``,
``redis://host:6379/0``, ``off``). A store that fails degrades to memory with
one warning; it never fails a call.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol, runtime_checkable
from urllib.parse import unquote, urlsplit

if TYPE_CHECKING:
    import redis

__all__ = [
    "COOLDOWN_URL_ENV",
    "CooldownKey",
    "CooldownStore",
    "MemoryCooldownStore",
    "RedisCooldownStore",
    "ResilientCooldownStore",
    "SqliteCooldownStore",
    "cooldown_store_from_env",
    "cooldown_store_from_url",
    "default_cooldown_path",
    "key_fingerprint",
]

LOG = logging.getLogger("fluid_build.cooldown")

COOLDOWN_URL_ENV: Final = "FLUID_COOLDOWN_URL"


def key_fingerprint(api_key: str | None) -> str:
    """A short, stable, one-way fingerprint of an API key (never the key itself)."""
    if not api_key:
        return "nokey"
    digest = hashlib.blake2b(api_key.encode(), digest_size=8, person=b"fluid-cooldown")
    return digest.hexdigest()


@dataclass(frozen=True, slots=True)
class CooldownKey:
    """Who shares a cooldown: one provider, one API key, one model."""

    provider: str
    fingerprint: str
    model: str

    @classmethod
    def for_call(cls, provider: str, api_key: str | None, model: str) -> CooldownKey:
        return cls(provider, key_fingerprint(api_key), model)

    def __str__(self) -> str:
        return f"{self.provider}:{self.fingerprint}:{self.model}"


@runtime_checkable
class CooldownStore(Protocol):
    """Where cooldown windows live. ``now`` is wall-clock seconds (``time.time()``)."""

    def remaining(self, key: str, now: float) -> float:
        """Seconds left in ``key``'s window (0.0 when it is not cooling down)."""
        ...

    def extend(self, key: str, seconds: float, now: float) -> float:
        """Make ``key`` cool down for at least ``seconds``; return the seconds now left."""
        ...

    def incr(self, key: str) -> int:
        """Add one to ``key``'s shared counter (the circuit breaker's failures); return it."""
        ...

    def count(self, key: str) -> int:
        """The counter's value (0 when unset)."""
        ...

    def reset(self, key: str) -> None:
        """Clear the counter."""
        ...


def _valid(seconds: float) -> bool:
    return math.isfinite(seconds) and seconds > 0


class MemoryCooldownStore:
    """Windows in a dict: shared by the threads and tasks of one process."""

    def __init__(self) -> None:
        self._until: dict[str, float] = {}
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()

    def incr(self, key: str) -> int:
        with self._lock:
            self._counts[key] = self._counts.get(key, 0) + 1
            return self._counts[key]

    def count(self, key: str) -> int:
        return self._counts.get(key, 0)

    def reset(self, key: str) -> None:
        with self._lock:
            self._counts.pop(key, None)

    def remaining(self, key: str, now: float) -> float:
        until = self._until.get(key)
        return until - now if until is not None and until > now else 0.0

    def extend(self, key: str, seconds: float, now: float) -> float:
        if not _valid(seconds):
            return self.remaining(key, now)
        with self._lock:
            until = max(self._until.get(key, 0.0), now + seconds)
            self._until[key] = until
            if len(self._until) > 10_000:  # drop long-expired windows
                self._until = {k: v for k, v in self._until.items() if v > now}
        return until - now

    def __repr__(self) -> str:
        return "MemoryCooldownStore()"


def default_cooldown_path(env: Mapping[str, str] | None = None) -> Path:
    """``$XDG_CACHE_HOME/fluid_build/cooldown.sqlite3`` (``~/.cache`` by default)."""
    env = os.environ if env is None else env
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "fluid_build" / "cooldown.sqlite3"


class SqliteCooldownStore:
    """Windows in a sqlite file, shared by every process on the machine.

    Writers upsert with ``max()`` in one statement, so concurrent writers can
    only lengthen a window. Readers do not query sqlite on every call: a
    sidecar file grows by one byte per write, and a reader re-reads the table
    only when that file's size changed. A call on a key that is not cooling
    down costs one ``stat()``.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._generation_path = self.path.with_name(self.path.name + ".gen")
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._pid = 0
        self._seen_generation = -1
        self._cache: dict[str, float] = {}
        self._counts: dict[str, int] = {}

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None or self._pid != os.getpid():  # a forked child opens its own
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, timeout=10.0, check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA busy_timeout=10000")
            conn.execute(
                "CREATE TABLE IF NOT EXISTS cooldown (key TEXT PRIMARY KEY, until REAL NOT NULL)"
            )
            conn.execute(
                "CREATE TABLE IF NOT EXISTS counters (key TEXT PRIMARY KEY, n INTEGER NOT NULL)"
            )
            conn.commit()
            self._generation_path.touch(exist_ok=True)
            self._conn, self._pid = conn, os.getpid()
            self._seen_generation = -1
        return self._conn

    def _generation(self) -> int:
        try:
            return self._generation_path.stat().st_size
        except FileNotFoundError:
            return -2

    def _refresh(self, now: float) -> None:
        generation = self._generation()
        if generation != self._seen_generation or self._pid != os.getpid():
            with self._lock:
                conn = self._connection()
                generation = self._generation()
                rows = conn.execute("SELECT key, until FROM cooldown WHERE until > ?", (now,))
                self._cache = dict(rows.fetchall())
                self._counts = dict(conn.execute("SELECT key, n FROM counters").fetchall())
                self._seen_generation = generation

    def _bump(self) -> None:
        # Grow the sidecar only after the change is committed: a reader that
        # sees the new size is sure to read the new rows.
        with open(self._generation_path, "ab") as generation:
            generation.write(b".")
        self._seen_generation = -1

    def remaining(self, key: str, now: float) -> float:
        self._refresh(now)
        until = self._cache.get(key)
        return until - now if until is not None and until > now else 0.0

    def extend(self, key: str, seconds: float, now: float) -> float:
        if not _valid(seconds):
            return self.remaining(key, now)
        with self._lock:
            conn = self._connection()
            with conn:
                conn.execute(
                    "INSERT INTO cooldown (key, until) VALUES (?, ?) "
                    "ON CONFLICT(key) DO UPDATE SET until = max(until, excluded.until)",
                    (key, now + seconds),
                )
                conn.execute("DELETE FROM cooldown WHERE until < ?", (now - 3600,))
                until = conn.execute("SELECT until FROM cooldown WHERE key = ?", (key,)).fetchone()
            self._bump()
        return max(float(until[0]) - now, 0.0) if until else seconds

    def incr(self, key: str) -> int:
        with self._lock:
            conn = self._connection()
            with conn:
                row = conn.execute(
                    "INSERT INTO counters (key, n) VALUES (?, 1) "
                    "ON CONFLICT(key) DO UPDATE SET n = n + 1 RETURNING n",
                    (key,),
                ).fetchone()
            self._bump()
        return int(row[0])

    def count(self, key: str) -> int:
        self._refresh(time.time())
        return self._counts.get(key, 0)

    def reset(self, key: str) -> None:
        with self._lock:
            conn = self._connection()
            with conn:
                gone = conn.execute("DELETE FROM counters WHERE key = ?", (key,)).rowcount
            if gone:
                self._bump()

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __repr__(self) -> str:
        return f"SqliteCooldownStore({str(self.path)!r})"


# Extend-only, in Redis time: the window is the key's TTL, so machines with
# skewed clocks still agree on when it ends.
_EXTEND_SCRIPT: Final = """
local ttl = redis.call('PTTL', KEYS[1])
local want = tonumber(ARGV[1])
if ttl < want then
  redis.call('SET', KEYS[1], '1', 'PX', want)
  return want
end
return ttl
"""


class RedisCooldownStore:
    """Windows as Redis keys with a TTL, shared by every machine on one Redis."""

    def __init__(
        self,
        url: str | None = None,
        *,
        client: redis.Redis | None = None,
        prefix: str = "fluid:cooldown:",
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
        self._extend: Callable[..., Any] = client.register_script(_EXTEND_SCRIPT)
        self._url = _without_password(url) if url else repr(client)

    def remaining(self, key: str, now: float) -> float:
        ttl = self._client.pttl(self._prefix + key)
        return float(ttl) / 1000.0 if isinstance(ttl, int) and ttl > 0 else 0.0

    def extend(self, key: str, seconds: float, now: float) -> float:
        if not _valid(seconds):
            return self.remaining(key, now)
        left = self._extend(keys=[self._prefix + key], args=[max(int(seconds * 1000), 1)])
        return float(left) / 1000.0

    def incr(self, key: str) -> int:
        return int(self._client.incr(self._prefix + "n:" + key))

    def count(self, key: str) -> int:
        value = self._client.get(self._prefix + "n:" + key)
        return int(value) if value is not None else 0

    def reset(self, key: str) -> None:
        self._client.delete(self._prefix + "n:" + key)

    def __repr__(self) -> str:
        return f"RedisCooldownStore({self._url!r})"


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


class ResilientCooldownStore:
    """A store that never fails a call: on error it degrades to memory.

    The first failure logs one warning; the store is tried again every
    ``retry_every`` seconds and a recovery is logged too.
    """

    def __init__(
        self,
        primary: CooldownStore,
        *,
        retry_every: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.primary = primary
        self.fallback = MemoryCooldownStore()
        self._retry_every = retry_every
        self._clock = clock
        self._down_since: float | None = None

    @property
    def degraded(self) -> bool:
        return self._down_since is not None

    def _usable(self) -> bool:
        return self._down_since is None or self._clock() - self._down_since >= self._retry_every

    def _failed(self, exc: Exception) -> None:
        if self._down_since is None:
            LOG.warning(
                "cooldown store %r failed (%s: %s); sharing cooldowns in this process only "
                "until it answers again",
                self.primary,
                type(exc).__name__,
                exc,
            )
        self._down_since = self._clock()

    def _recovered(self) -> None:
        if self._down_since is not None:
            LOG.warning("cooldown store %r answers again", self.primary)
            self._down_since = None

    def remaining(self, key: str, now: float) -> float:
        local = self.fallback.remaining(key, now)
        if not self._usable():
            return local
        try:
            shared = self.primary.remaining(key, now)
        except Exception as exc:  # noqa: BLE001 - a store must never fail a call
            self._failed(exc)
            return local
        self._recovered()
        return max(shared, local)

    def extend(self, key: str, seconds: float, now: float) -> float:
        local = self.fallback.extend(key, seconds, now)
        if not self._usable():
            return local
        try:
            shared = self.primary.extend(key, seconds, now)
        except Exception as exc:  # noqa: BLE001 - a store must never fail a call
            self._failed(exc)
            return local
        self._recovered()
        return max(shared, local)

    def incr(self, key: str) -> int:
        local = self.fallback.incr(key)
        if not self._usable():
            return local
        try:
            shared = self.primary.incr(key)
        except Exception as exc:  # noqa: BLE001 - a store must never fail a call
            self._failed(exc)
            return local
        self._recovered()
        return shared

    def count(self, key: str) -> int:
        if not self._usable():
            return self.fallback.count(key)
        try:
            return self.primary.count(key)
        except Exception as exc:  # noqa: BLE001 - a store must never fail a call
            self._failed(exc)
            return self.fallback.count(key)

    def reset(self, key: str) -> None:
        self.fallback.reset(key)
        if not self._usable():
            return
        try:
            self.primary.reset(key)
        except Exception as exc:  # noqa: BLE001 - a store must never fail a call
            self._failed(exc)
            return
        self._recovered()

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
        primary = SqliteCooldownStore(unquote(text.split("://", 1)[1].split("?", 1)[0]))
    elif scheme == "" and text:
        primary = SqliteCooldownStore(Path(text).expanduser())
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
