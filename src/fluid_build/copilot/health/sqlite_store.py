"""The default store: a sqlite file shared by every process on the machine.

Readers check a random 8-byte generation stamp, mapped from a sidecar file, and
re-read the table only when another writer changed it (see
:class:`SqliteCooldownStore`).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import math
import mmap
import os
import stat
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeVar

from fluid_build._private import private_dir
from fluid_build.copilot.health.budget import (
    IDLE_FORGET,
    BudgetSpec,
    BudgetState,
    Reservation,
    _Book,
    _reserve,
    _settle,
)
from fluid_build.copilot.health.store import (
    LONGEST,
    MAX_ENTRIES,
    MOST,
    StoreEntry,
    sane_entry,
    valid_seconds,
)
from fluid_build.errors import FluidError

if TYPE_CHECKING:
    import sqlite3

T = TypeVar("T")

__all__ = [
    "SqliteBudgetLedger",
    "SqliteCooldownStore",
    "StoreFileError",
    "default_cooldown_path",
]

LOG = logging.getLogger("fluid_build.budget")


class StoreFileError(FluidError):
    """The store's path holds something fluid will not open as its database.

    A symbolic link (followed, it would turn its target into a database, or
    create it), a FIFO, a device, a directory, or a file another user owns.
    :class:`ResilientCooldownStore` then keeps the state in memory, with one
    warning that carries this message.
    """


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


# A budget: one upsert whose RETURNING row says what is left. Lowering a live
# budget never raises it; a budget that has ended starts again at the value.
_PUT_SQL: Final = (
    "INSERT INTO fluid_state (key, until, since, n) VALUES (:key, :until, :now, :value) "
    "ON CONFLICT(key) DO UPDATE SET "
    "n = CASE WHEN until > :now THEN min(n, :value) ELSE :value END, "
    "since = CASE WHEN until > :now THEN since ELSE :now END, "
    "owner = NULL, "
    "note = CASE WHEN until > :now THEN note ELSE '' END, "
    "until = :until "
    "RETURNING n"
)


# What a row must hold to be an entry fluid wrote (:func:`sane_entry`, in SQL). A
# row planted or corrupted otherwise is never read, and the next change deletes it.
_SANE: Final = (
    "(typeof(key) = 'text' AND typeof(until) IN ('integer', 'real') "
    "AND typeof(since) IN ('integer', 'real') AND typeof(n) = 'integer' "
    "AND (owner IS NULL OR typeof(owner) = 'text') AND (note IS NULL OR typeof(note) = 'text') "
    f"AND until <= :now + {LONGEST!r} AND since BETWEEN 0 AND :now + {LONGEST!r} "
    f"AND n BETWEEN 0 AND {MOST})"
)
_PURGE_SQL: Final = f"DELETE FROM fluid_state WHERE until < :ended OR NOT {_SANE}"  # noqa: S608 - constants

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


def _tighten(fd: int, info: os.stat_result) -> None:
    """Make a file an older fluid left readable by others (0644) private again."""
    if stat.S_IMODE(info.st_mode) & 0o077 and hasattr(os, "fchmod"):
        with contextlib.suppress(OSError):
            os.fchmod(fd, 0o600)


def _tighten_sidecars(path: Path) -> None:
    """The -wal and -shm an older fluid left 0644: made 0600 when this user's files.

    sqlite gives new ones the database's mode; these were made before it was private.
    """
    for suffix in ("-wal", "-shm"):
        try:
            fd = os.open(f"{path}{suffix}", os.O_RDONLY | _O_NONBLOCK | _O_NOFOLLOW | _O_CLOEXEC)
        except OSError:
            continue  # none there, or not a file fluid opens: sqlite judges it
        try:
            info = os.fstat(fd)
            owned = not hasattr(os, "geteuid") or info.st_uid == os.geteuid()
            if stat.S_ISREG(info.st_mode) and owned:
                _tighten(fd, info)
        finally:
            os.close(fd)


# The database files this process has checked, by path: (device, inode) -> their stat.
# Checked once per file: closing any descriptor of a file drops every POSIX lock this
# process holds on it, and sqlite's locks (the WAL index's "dead man switch" on -shm
# above all) are POSIX locks. A second check while a connection of this process had
# the file open let another process think it was the only one and reset the WAL index
# under its readers: SIGBUS (8 processes spending from one budget found it).
_CLAIMED: dict[str, os.stat_result] = {}
_CLAIMED_LOCK = threading.Lock()


def _claim(path: Path) -> os.stat_result:
    """Open (or create, mode 0600) ``path`` as the database, never through a link.

    Refused with :class:`StoreFileError` unless it is a regular file this user
    owns with one name: sqlite opens a path and follows links, so whatever is
    there is checked first, without blocking (a FIFO) and without following.
    A file this process already checked (the same inode at the same path) is not
    opened again: see :data:`_CLAIMED`.
    """
    key = os.fspath(path)
    with _CLAIMED_LOCK:
        known = _CLAIMED.get(key)
        if known is not None:
            try:
                now = os.stat(path, follow_symlinks=False)
            except OSError:
                now = None
            if now is not None and (now.st_dev, now.st_ino) == (known.st_dev, known.st_ino):
                return known
        info = _check(path)
        _CLAIMED[key] = info
        return info


def _check(path: Path) -> os.stat_result:
    """:func:`_claim`'s checks, on a file no connection of this process has open."""
    flags = os.O_RDWR | os.O_CREAT | _O_NONBLOCK | _O_NOFOLLOW | _O_CLOEXEC
    what = None
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            what = "is a symbolic link (fluid never follows one there)"
        elif exc.errno == errno.EISDIR:
            what = "is a directory"
        else:
            raise
    else:
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                what = "is not a regular file (a FIFO, socket or device)"
            elif hasattr(os, "geteuid") and info.st_uid != os.geteuid():
                what = f"belongs to another user (uid {info.st_uid})"
            elif info.st_nlink > 1:
                what = "has other names (hard links)"
            else:
                _tighten(fd, info)
                _tighten_sidecars(path)
                return info
        finally:
            os.close(fd)
    raise StoreFileError(
        f"{path} {what}: not used as the cooldown store; remove it, or set "
        "FLUID_COOLDOWN_URL to another file"
    )


#: Seconds a process waits for another to finish making the file, once per process.
SETUP_WAIT: Final = 2.0


def to_wal(
    conn: sqlite3.Connection,
    seconds: float,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """``PRAGMA journal_mode=WAL`` on a newly opened connection, tried again for up to
    ``seconds`` while the file is busy.

    A new file starts in rollback mode, where switching takes its exclusive lock. When
    another connection opening the file at the same moment holds a lock in the way
    (a fleet starting on a fresh store), sqlite answers "database is locked" at once,
    not after its busy wait: waiting could deadlock there. So the wait is done here,
    in short pauses, on one deadline.
    """
    import sqlite3

    end = clock() + seconds
    pause = 0.005
    while True:
        try:
            row = conn.execute("PRAGMA journal_mode=WAL").fetchone()
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) and "busy" not in str(exc):
                raise
            failed = exc
        else:
            if row is not None and str(row[0]).lower() == "wal":
                return
            # The mode could not change (sqlite names the mode it kept): as busy.
            failed = sqlite3.OperationalError("database is locked (its journal mode stays)")
        if clock() + pause > end:
            raise failed
        sleep(pause)
        pause = min(pause * 2, 0.05)


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
        self._ledger: SqliteBudgetLedger | None = None

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

            private_dir(self.path.parent)
            claimed = _claim(self.path)
            timeout = max(self.busy_timeout, 0.0)
            # Making the file (WAL mode, the table) happens once per process and
            # may meet another process doing the same: it waits up to SETUP_WAIT
            # rather than failing into the advisory path with nothing shared.
            setup = max(timeout, SETUP_WAIT)
            conn = sqlite3.connect(self.path, timeout=setup, check_same_thread=False)
            try:
                # sqlite opened the path itself: still the file just checked, not a
                # link swapped in meanwhile. Its -wal and -shm take this file's mode.
                now = os.stat(self.path, follow_symlinks=False)
                if (now.st_dev, now.st_ino) != (claimed.st_dev, claimed.st_ino):
                    raise StoreFileError(
                        f"{self.path} was replaced while it was opened: not used as the "
                        "cooldown store; try again, or set FLUID_COOLDOWN_URL to another file"
                    )
                conn.execute(f"PRAGMA busy_timeout={int(setup * 1000)}")
                to_wal(conn, setup)
                # Advisory state: a power cut may lose the last changes, never the file.
                conn.execute("PRAGMA synchronous=NORMAL")
                with conn:
                    conn.execute(_SCHEMA)
                    for table in _LEGACY_TABLES:
                        conn.execute(f"DROP TABLE IF EXISTS {table}")
                conn.execute(f"PRAGMA busy_timeout={int(timeout * 1000)}")
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
                f"SELECT key, until, n, {_SANE} FROM fluid_state WHERE until > :now",  # noqa: S608 - constants
                {"now": now},
            ).fetchall()
            self._cache = {key: (float(until), int(n)) for key, until, n, sane in rows if sane}
            if not all(sane for *_, sane in rows):
                self._purge(conn, now)
            self._seen_stamp = seen
        finally:
            self._lock.release()

    def _purge(self, conn: sqlite3.Connection, now: float) -> None:
        """Delete rows no fluid wrote (skipped by every read); busy: the next change does it."""
        import sqlite3

        try:
            with conn:
                gone = conn.execute(_PURGE_SQL, {"now": now, "ended": now - 60.0}).rowcount
        except sqlite3.OperationalError:
            return
        if gone:
            self._bump()

    def _write(
        self, sql: str, params: Mapping[str, Any] | tuple[Any, ...], now: float | None
    ) -> Any:
        """Run one change in its own transaction; return its first row.

        With ``now``, entries that ended over a minute before it, and rows no fluid
        wrote, are purged first: a change never builds on a planted value.
        """
        self._acquire()
        try:
            conn = self._connection()
            with conn:
                # The write lock first, waiting for it: a deferred transaction whose read
                # snapshot another writer overtook fails at once ("database is locked")
                # without waiting at all.
                conn.execute("BEGIN IMMEDIATE")
                if now is not None:
                    conn.execute(_PURGE_SQL, {"now": now, "ended": now - 60.0})
                row = conn.execute(sql, params).fetchone()
                self._writes += 1
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

    def _change(self, work: Callable[[sqlite3.Connection], T], now: float) -> T:
        """Run ``work`` in one ``BEGIN IMMEDIATE`` transaction: its reads and writes are atomic."""
        self._acquire()
        try:
            conn = self._connection()
            with conn:
                conn.execute("BEGIN IMMEDIATE")
                conn.execute(_PURGE_SQL, {"now": now, "ended": now - 60.0})
                result = work(conn)
                self._writes += 1
            self._bump()
        finally:
            self._lock.release()
        return result

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
        if not valid_seconds(seconds):
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

    def take(
        self, key: str, amount: int, limit: int | None, ttl: float, now: float
    ) -> tuple[bool, int | None]:
        def work(conn: sqlite3.Connection) -> tuple[bool, int | None]:
            row = conn.execute(
                "SELECT n FROM fluid_state WHERE key = ? AND until > ?", (key, now)
            ).fetchone()
            if row is None:
                if limit is None or amount < 0:
                    return True, None
                left = max(limit - amount, 0)
                conn.execute(
                    "INSERT OR REPLACE INTO fluid_state (key, until, since, n) VALUES (?, ?, ?, ?)",
                    (key, now + max(ttl, 0.001), now, left),
                )
                return True, left
            held = int(row[0])
            if amount > held:
                return False, held
            left = held - amount
            if limit is not None and amount < 0:
                left = min(left, max(limit, 0))
            conn.execute("UPDATE fluid_state SET n = ? WHERE key = ?", (left, key))
            return True, left

        return self._change(work, now)

    def put(self, key: str, value: int, ttl: float, now: float) -> int:
        if not valid_seconds(ttl):
            return self.count(key, now)
        params = {"key": key, "until": now + ttl, "now": now, "value": max(value, 0)}
        return int(self._write(_PUT_SQL, params, now)[0])

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
                    "SELECT key, until, since, n, owner, note FROM fluid_state "  # noqa: S608 - constants
                    f"WHERE until > :then AND {_SANE} ORDER BY key LIMIT :most",
                    {"then": now, "now": max(now, time.time()), "most": MAX_ENTRIES},
                )
                .fetchall()
            )
        finally:
            self._lock.release()
        return [
            StoreEntry(k, float(u), float(s), int(n), o, str(t or ""))
            for k, u, s, n, o, t in rows
            if sane_entry(u, s, n, max(now, time.time()))
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

    def budget_ledger(self) -> SqliteBudgetLedger:
        """The budgets kept in this file, in their own tables (see :mod:`.budget`)."""
        if self._ledger is None:
            self._ledger = SqliteBudgetLedger(self.path)
        return self._ledger

    def __repr__(self) -> str:
        return f"SqliteCooldownStore({str(self.path)!r})"


# Budgets have their own tables: a budget lasts a month or until reset, so the
# cooldown rows' one-day sanity cap, purge and entry cap never touch them.
_BUDGET_SCHEMA: Final = (
    "CREATE TABLE IF NOT EXISTS fluid_budget (name TEXT PRIMARY KEY, lim INTEGER NOT NULL, "
    "win TEXT NOT NULL DEFAULT '', ends REAL, spent INTEGER NOT NULL DEFAULT 0, used REAL)",
    "CREATE TABLE IF NOT EXISTS fluid_budget_hold (name TEXT NOT NULL, id TEXT NOT NULL, "
    "amount INTEGER NOT NULL, expires REAL NOT NULL, PRIMARY KEY (name, id))",
)


class SqliteBudgetLedger:
    """Budgets in the store's sqlite file: each change one ``BEGIN IMMEDIATE`` transaction.

    It has its own connection, which waits up to ``busy_timeout`` seconds (5 by
    default) for another writer: a budget is a hard limit, so a busy file is
    waited for rather than skipped as the advisory cooldown state is.
    """

    def __init__(self, path: str | os.PathLike[str], *, busy_timeout: float = 5.0) -> None:
        self.path = Path(path)
        self.busy_timeout = busy_timeout
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._pid = 0
        #: (st_dev, st_ino) of the file the connection has open.
        self._file: tuple[int, int] | None = None

    def _replaced(self) -> bool:
        """Whether the path no longer names the file the connection has open (removed,
        or another put there): every process must keep one ledger, the one at the path."""
        try:
            now = os.stat(self.path, follow_symlinks=False)
        except FileNotFoundError:
            return True
        return (now.st_dev, now.st_ino) != self._file

    def _connection(self) -> sqlite3.Connection:
        if self._conn is not None and self._pid == os.getpid() and self._replaced():
            # A process writing on to a removed file would keep a ledger no one else
            # sees, and spend the limit a second time beside the new one.
            LOG.warning(
                "budget store %s was removed or replaced while in use; this process now "
                "keeps its budgets in the file at that path, as every new process does",
                self.path,
            )
            self._conn.close()
            self._conn = None
        if self._conn is None or self._pid != os.getpid():
            import sqlite3

            private_dir(self.path.parent)
            claimed = _claim(self.path)
            conn = sqlite3.connect(
                self.path,
                timeout=max(self.busy_timeout, SETUP_WAIT),
                isolation_level=None,
                check_same_thread=False,
            )
            try:
                to_wal(conn, max(self.busy_timeout, SETUP_WAIT))
                conn.execute("PRAGMA synchronous=NORMAL")
                for sql in _BUDGET_SCHEMA:
                    conn.execute(sql)
                columns = {row[1] for row in conn.execute("PRAGMA table_info(fluid_budget)")}
                if "used" not in columns:  # a file from before budgets expired
                    conn.execute("ALTER TABLE fluid_budget ADD COLUMN used REAL")
            except BaseException:
                conn.close()
                raise
            self._conn, self._pid = conn, os.getpid()
            self._file = (claimed.st_dev, claimed.st_ino)
        return self._conn

    def _book(self, conn: sqlite3.Connection, name: str) -> _Book | None:
        row = conn.execute(
            "SELECT lim, win, ends, spent FROM fluid_budget WHERE name = ?", (name,)
        ).fetchone()
        if row is None:
            return None
        lim, win, ends, spent = row
        if not _whole(lim) or not _whole(spent) or not isinstance(win, str):
            return None  # not a row fluid wrote: the budget starts again
        if ends is not None and not (isinstance(ends, int | float) and math.isfinite(ends)):
            ends = None
        holds = {
            str(hold): (int(amount), float(expires))
            for hold, amount, expires in conn.execute(
                "SELECT id, amount, expires FROM fluid_budget_hold WHERE name = ?", (name,)
            )
            if _whole(amount) and isinstance(expires, int | float)
        }
        return _Book(int(lim), win, ends, int(spent), holds)

    def _save(self, conn: sqlite3.Connection, name: str, book: _Book | None) -> None:
        if book is None:
            return
        conn.execute(
            # An upsert, not a replace: the row keeps when a call last reserved (``used``).
            "INSERT INTO fluid_budget (name, lim, win, ends, spent) VALUES (?, ?, ?, ?, ?) "
            "ON CONFLICT (name) DO UPDATE SET lim = excluded.lim, win = excluded.win, "
            "ends = excluded.ends, spent = excluded.spent",
            (name, book.limit, book.window, book.ends, book.spent),
        )
        conn.execute("DELETE FROM fluid_budget_hold WHERE name = ?", (name,))
        conn.executemany(
            "INSERT INTO fluid_budget_hold (name, id, amount, expires) VALUES (?, ?, ?, ?)",
            [(name, hold, amount, expires) for hold, (amount, expires) in book.holds.items()],
        )

    def _atomic(self, work: Callable[[sqlite3.Connection], T]) -> T:
        with self._lock:
            conn = self._connection()
            conn.execute("BEGIN IMMEDIATE")
            try:
                result = work(conn)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
            return result

    def reserve(
        self, spec: BudgetSpec, amount: int, hold: str, expires: float, now: float
    ) -> Reservation:
        def work(conn: sqlite3.Connection) -> Reservation:
            book, granted = _reserve(self._book(conn, spec.name), spec, amount, hold, expires, now)
            self._save(conn, spec.name, book)
            conn.execute("UPDATE fluid_budget SET used = ? WHERE name = ?", (now, spec.name))
            _forget_idle(conn, now)
            return Reservation(granted, book.state(spec.name))

        return self._atomic(work)

    def settle(self, name: str, hold: str, amount: int, now: float) -> None:
        def work(conn: sqlite3.Connection) -> None:
            self._save(conn, name, _settle(self._book(conn, name), hold, amount, now))

        self._atomic(work)

    def states(self, now: float) -> list[BudgetState]:
        def work(conn: sqlite3.Connection) -> list[BudgetState]:
            names = [row[0] for row in conn.execute("SELECT name FROM fluid_budget ORDER BY name")]
            out = []
            for name in names:
                book = self._book(conn, str(name))
                if book is not None:
                    book.roll(book.window, now)
                    out.append(book.state(str(name)))
            return out

        return self._atomic(work)

    def reset(self, name: str) -> bool:
        def work(conn: sqlite3.Connection) -> bool:
            conn.execute("DELETE FROM fluid_budget_hold WHERE name = ?", (name,))
            return conn.execute("DELETE FROM fluid_budget WHERE name = ?", (name,)).rowcount > 0

        return self._atomic(work)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __repr__(self) -> str:
        return f"SqliteBudgetLedger({str(self.path)!r})"


def _forget_idle(conn: sqlite3.Connection, now: float) -> None:
    """Every budget expires: a day after its window ends, or IDLE_FORGET after its last call
    (see docs/budgets.md); its reservations go with it."""
    conn.execute(
        "DELETE FROM fluid_budget WHERE coalesce(used, 0) < ? OR (ends IS NOT NULL AND ends < ?)",
        (now - IDLE_FORGET, now - 86_400.0),
    )
    # An ended hold is left for its budget's next change, which counts it as spent.
    conn.execute("DELETE FROM fluid_budget_hold WHERE name NOT IN (SELECT name FROM fluid_budget)")


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MOST
