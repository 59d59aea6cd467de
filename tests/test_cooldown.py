"""The cooldown stores: extend-only windows, shared across instances, processes and machines."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fluid_build.copilot.health.cooldown import (
    CooldownKey,
    CooldownStore,
    MemoryCooldownStore,
    RedisCooldownStore,
    ResilientCooldownStore,
    SqliteCooldownStore,
    cooldown_store_from_env,
    cooldown_store_from_url,
    default_cooldown_path,
    key_fingerprint,
    normalize_endpoint,
)
from fluid_build.copilot.health.sqlite_store import to_wal
from tests import loopback
from tests.fakes import FakeClock

ROOT = Path(__file__).resolve().parents[1]
NOW = 1_700_000_000.0


# -- one contract, three stores ------------------------------------------------------

StorePair = tuple[CooldownStore, CooldownStore, Callable[[], float]]


@pytest.fixture(params=["memory", "sqlite", "redis"])
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StorePair]:
    """Two handles on one shared store (two processes' view of it) and the clock it runs on."""
    if request.param == "memory":
        shared = MemoryCooldownStore()
        yield shared, shared, lambda: NOW
    elif request.param == "sqlite":
        path = tmp_path / "cooldown.sqlite3"
        yield SqliteCooldownStore(path), SqliteCooldownStore(path), lambda: NOW
    else:
        url = request.getfixturevalue("redis_url")
        prefix = f"test:{request.node.name}:"
        first = RedisCooldownStore(url, prefix=prefix)
        second = RedisCooldownStore(url, prefix=prefix)
        yield first, second, lambda: NOW


def test_a_window_is_seen_by_every_handle(stores: StorePair) -> None:
    writer, reader, clock = stores
    assert reader.remaining("k", clock()) == 0.0
    assert writer.extend("k", 5.0, clock()) == pytest.approx(5.0, abs=0.1)
    assert reader.remaining("k", clock()) == pytest.approx(5.0, abs=0.1)
    assert reader.remaining("other", clock()) == 0.0


def test_a_second_retry_after_extends_but_never_shortens(stores: StorePair) -> None:
    writer, reader, clock = stores
    writer.extend("k", 8.0, clock())
    assert reader.extend("k", 2.0, clock()) == pytest.approx(8.0, abs=0.1)
    assert writer.remaining("k", clock()) == pytest.approx(8.0, abs=0.1)
    assert reader.extend("k", 12.0, clock()) == pytest.approx(12.0, abs=0.1)
    assert writer.remaining("k", clock()) == pytest.approx(12.0, abs=0.1)


@pytest.mark.parametrize("seconds", [0.0, -3.0, float("nan"), float("inf")])
def test_nonsense_windows_are_ignored(stores: StorePair, seconds: float) -> None:
    writer, _, clock = stores
    assert writer.extend("k", seconds, clock()) == 0.0
    assert writer.remaining("k", clock()) == 0.0


def test_windows_end(tmp_path: Path) -> None:
    for store in (MemoryCooldownStore(), SqliteCooldownStore(tmp_path / "c.sqlite3")):
        store.extend("k", 5.0, NOW)
        assert store.remaining("k", NOW + 4.5) == pytest.approx(0.5)
        assert store.remaining("k", NOW + 5.0) == 0.0
        assert store.remaining("k", NOW + 60) == 0.0


def test_redis_cleans_up_an_ended_entry_by_itself(redis_url: str) -> None:
    import redis

    store = RedisCooldownStore(redis_url, prefix="test:expiry:")
    store.extend("k", 5.0, time.time())
    assert 0 < store.remaining("k", time.time()) <= 5.0
    # Redis drops the key a minute after its end, so nothing piles up.
    ttl = redis.Redis.from_url(redis_url).pttl("test:expiry:k")
    assert 60_000 < ttl <= 65_000
    assert store.remaining("k", time.time() + 5.0) == 0.0


def test_sqlite_is_safe_under_concurrent_writers(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite3"
    errors: list[BaseException] = []

    def writer(i: int) -> None:
        # Safety, not latency, is what this checks: each write may wait as long as it needs
        # (at the default 0.1 s a loaded machine refuses some, which the resilient store
        # treats as contention: see test_health_processes.py).
        store = SqliteCooldownStore(path, busy_timeout=10.0)
        try:
            for j in range(30):
                store.extend("k", float(i * 30 + j + 1), NOW)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert SqliteCooldownStore(path).remaining("k", NOW) == 180.0


def _in_the_way(path: Path) -> Any:
    """A connection holding the write lock of a new file still in rollback mode: what a
    second process opening a fresh store at the same moment can hold. Its ``COMMIT``
    lets go."""
    import sqlite3

    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    blocker = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    blocker.execute("CREATE TABLE other (x)")
    blocker.execute("BEGIN IMMEDIATE")
    blocker.execute("INSERT INTO other VALUES (1)")
    return blocker


def test_switching_a_fresh_file_to_wal_waits_for_a_lock_in_the_way(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "c.sqlite3"
    blocker = _in_the_way(path)
    conn = sqlite3.connect(path, isolation_level=None, timeout=5.0)
    # sqlite refuses at once, not after its 5 s busy wait: waiting could deadlock there.
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        conn.execute("PRAGMA journal_mode=WAL")
    pauses: list[float] = []

    def sleep(seconds: float) -> None:
        pauses.append(seconds)
        if len(pauses) == 3:
            blocker.execute("COMMIT")

    to_wal(conn, 2.0, sleep=sleep)
    assert pauses == [0.005, 0.01, 0.02]
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()
    blocker.close()


def test_switching_to_wal_gives_up_at_its_deadline(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "c.sqlite3"
    blocker = _in_the_way(path)
    conn = sqlite3.connect(path, isolation_level=None, timeout=5.0)
    clock = FakeClock()
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        to_wal(conn, 0.2, clock=clock, sleep=clock.sleep)
    # Pauses that double up to 0.05 s, none past the deadline.
    assert clock.waits == [0.005, 0.01, 0.02, 0.04, 0.05, 0.05]
    conn.close()
    blocker.close()


def test_a_store_opened_while_another_holds_a_fresh_file_waits_then_writes(
    tmp_path: Path,
) -> None:
    # End to end on a real file: the store's first change meets the lock, waits for it
    # (it used to fail at once with "database is locked" and go on advisory state), and
    # writes once the other connection commits.
    path = tmp_path / "c.sqlite3"
    blocker = _in_the_way(path)
    release = threading.Timer(0.1, blocker.execute, ("COMMIT",))
    release.start()
    try:
        store = SqliteCooldownStore(path, busy_timeout=5.0)
        assert store.extend("k", 5.0, NOW) == 5.0
    finally:
        release.join()
        blocker.close()
    assert SqliteCooldownStore(path).remaining("k", NOW) == 5.0


def test_sqlite_reader_sees_a_write_made_after_it_cached(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite3"
    reader, writer = SqliteCooldownStore(path), SqliteCooldownStore(path)
    assert reader.remaining("k", NOW) == 0.0  # reader caches "nothing is cooling down"
    writer.extend("k", 9.0, NOW)
    assert reader.remaining("k", NOW) == 9.0


def test_sqlite_generation_stamp_stays_eight_bytes_and_readers_see_every_write(
    tmp_path: Path,
) -> None:
    path = tmp_path / "c.sqlite3"
    reader, writer = SqliteCooldownStore(path), SqliteCooldownStore(path)
    stamps = set()
    generation = path.with_name(path.name + ".generation")
    for i in range(40):
        assert reader.remaining(f"k{i}", NOW) == 0.0  # cached: nothing there
        writer.extend(f"k{i}", 9.0, NOW)
        stamps.add(generation.read_bytes())
        assert reader.remaining(f"k{i}", NOW) == 9.0
    assert generation.stat().st_size == 8  # it does not grow with the writes
    assert len(stamps) == 40  # every write set a stamp never seen before


def test_sqlite_generation_file_planted_short_is_grown_never_read_past_its_end(
    tmp_path: Path,
) -> None:
    path = tmp_path / "c.sqlite3"
    path.with_name(path.name + ".generation").write_bytes(b"abc")
    reader, writer = SqliteCooldownStore(path), SqliteCooldownStore(path)
    assert reader.remaining("k", NOW) == 0.0
    writer.extend("k", 9.0, NOW)
    assert reader.remaining("k", NOW) == 9.0
    assert path.with_name(path.name + ".generation").stat().st_size == 8


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are POSIX")
def test_a_fifo_in_place_of_the_generation_file_degrades_instead_of_hanging(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "c.sqlite3"
    os.mkfifo(path.with_name(path.name + ".generation"))
    store = cooldown_store_from_url(str(path))
    assert store is not None
    done = threading.Event()

    def work() -> None:
        with caplog.at_level(logging.WARNING, logger="fluid_build.cooldown"):
            assert store.extend("k", 4.0, NOW) == 4.0
            assert store.remaining("k", NOW) == 4.0
        done.set()

    threading.Thread(target=work, daemon=True).start()
    assert done.wait(10), "the store blocked on a FIFO"
    assert "failed (OSError" in caplog.text  # ENXIO with no reader; EINVAL with one


def test_sqlite_creates_its_directory(tmp_path: Path) -> None:
    store = SqliteCooldownStore(tmp_path / "deep" / "er" / "c.sqlite3")
    store.extend("k", 1.0, NOW)
    assert (tmp_path / "deep" / "er" / "c.sqlite3").exists()
    store.close()


# -- never failing a call --------------------------------------------------------------


class Broken:
    def __init__(self) -> None:
        self.calls = 0

    def remaining(self, key: str, now: float) -> float:
        self.calls += 1
        raise ConnectionError("store is down")

    def extend(self, key: str, seconds: float, now: float, note: str = "") -> float:
        self.calls += 1
        raise ConnectionError("store is down")

    def __repr__(self) -> str:
        return "Broken()"


def test_a_failing_store_degrades_to_memory_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tick = [0.0]
    broken = Broken()
    store = ResilientCooldownStore(broken, retry_every=30, clock=lambda: tick[0])
    with caplog.at_level(logging.WARNING, logger="fluid_build.cooldown"):
        assert store.extend("k", 5.0, NOW) == 5.0  # still shared within the process
        assert store.remaining("k", NOW + 1) == 4.0
        assert store.remaining("k", NOW + 2) == 3.0
    assert broken.calls == 1  # not hammered while down
    assert store.degraded
    assert caplog.text.count("cooldown store Broken() failed") == 1

    healthy = MemoryCooldownStore()
    store.primary = healthy
    tick[0] = 31.0
    with caplog.at_level(logging.WARNING, logger="fluid_build.cooldown"):
        assert store.remaining("k", NOW + 2) == 3.0
    assert not store.degraded
    assert "answers again" in caplog.text


def test_unreachable_redis_never_fails_a_call(caplog: pytest.LogCaptureFixture) -> None:
    port = loopback.closed_port()
    store = cooldown_store_from_url(f"redis://127.0.0.1:{port}/0")
    assert isinstance(store, ResilientCooldownStore)
    with caplog.at_level(logging.WARNING, logger="fluid_build.cooldown"):
        assert store.extend("k", 3.0, NOW) == 3.0
        assert store.remaining("k", NOW) == 3.0
    assert "failed (ConnectionError" in caplog.text


# -- choosing a store -------------------------------------------------------------------


def test_store_from_url(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    env = {"XDG_CACHE_HOME": str(tmp_path)}
    default = cooldown_store_from_url(None, env=env)
    assert isinstance(default, ResilientCooldownStore)
    assert isinstance(default.primary, SqliteCooldownStore)
    assert default.primary.path == tmp_path / "fluid_build" / "cooldown.sqlite3"
    assert default_cooldown_path(env) == default.primary.path

    assert isinstance(cooldown_store_from_url("memory://"), MemoryCooldownStore)
    assert cooldown_store_from_url("off") is None
    explicit = cooldown_store_from_url(f"sqlite://{tmp_path}/x.sqlite3")
    assert isinstance(explicit, ResilientCooldownStore)
    assert isinstance(explicit.primary, SqliteCooldownStore)
    assert explicit.primary.path == tmp_path / "x.sqlite3"
    plain = cooldown_store_from_url(str(tmp_path / "y.sqlite3"))
    assert isinstance(plain, ResilientCooldownStore)
    assert isinstance(plain.primary, SqliteCooldownStore)
    redis_store = cooldown_store_from_url("redis://:s3cretpass@localhost:6379/0")
    assert isinstance(redis_store, ResilientCooldownStore)
    assert isinstance(redis_store.primary, RedisCooldownStore)
    assert "s3cretpass" not in repr(redis_store)

    with caplog.at_level(logging.WARNING, logger="fluid_build.cooldown"):
        odd = cooldown_store_from_url("ftp://example/x", env=env)
    assert isinstance(odd, ResilientCooldownStore)
    assert isinstance(odd.primary, SqliteCooldownStore)
    assert "unknown scheme" in caplog.text


def test_store_from_env(tmp_path: Path) -> None:
    assert isinstance(
        cooldown_store_from_env({"FLUID_COOLDOWN_URL": "memory://"}), MemoryCooldownStore
    )
    store = cooldown_store_from_env({"XDG_CACHE_HOME": str(tmp_path)})
    assert isinstance(store, ResilientCooldownStore)


def test_the_key_is_a_fingerprint_never_the_key() -> None:
    secret = "sk-proj-abcdefghijklmnopqrstuvwxyz"
    key = CooldownKey.for_call("openai", secret, "gpt-4o")
    assert secret not in str(key)
    assert "abcdefgh" not in str(key)
    assert key == CooldownKey.for_call("openai", secret, "gpt-4o")
    assert key != CooldownKey.for_call("openai", secret + "x", "gpt-4o")
    assert key_fingerprint(None) == key_fingerprint("") == "nokey"
    assert len(key_fingerprint(secret)) == 16


# -- four processes, one key ---------------------------------------------------------------

WINDOW = 1.0
# Requests already on the wire when the 429 landed, and the check-then-send race of a
# worker that read the store just before the window was written: on a loaded 2-core CI
# machine that gap has reached ~100 ms. Without a shared store the control below sees
# dozens of requests in the 0.8 s that remain, so the bound still tells the two apart.
SLACK = 0.2


def run_workers(store_url: str, workers: int = 4) -> tuple[float, list[loopback.Seen]]:
    """Four worker processes hammer one key; the server answers one 429 with Retry-After: 1."""
    state: dict[str, float] = {}
    box: list[loopback._ScriptedServer] = []

    def reply(seen: loopback.Seen) -> loopback.Reply:
        server = box[0]
        with server.lock:
            ids = {s.headers.get("x-worker") for s in server.seen}
            if "t429" not in state and len(ids) >= workers and len(server.seen) >= 10 * workers:
                state["t429"] = time.time()
                return (
                    429,
                    {"retry-after": "1", "content-type": "application/json"},
                    (b'{"error": {"message": "Rate limit reached", "type": "requests"}}'),
                )
        time.sleep(0.003)  # noqa: real-sleep - a provider takes a moment to answer
        done = "t429" in state and time.time() > state["t429"] + WINDOW + 0.5
        return 200, {"x-done": "1" if done else "0"}, b'{"ok": true}'

    with loopback.http_server(reply) as server:
        box.append(server)
        base = loopback.base_url(server)
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        processes = [
            subprocess.Popen(
                [sys.executable, "-m", "tests.cooldown_worker", base, store_url, f"w{i}"],
                cwd=ROOT,
                env=env,
            )
            for i in range(workers)
        ]
        codes = [process.wait(timeout=60) for process in processes]
        seen = list(server.seen)
    assert codes == [0] * workers
    assert "t429" in state, "the server never saw all workers busy at once"
    return state["t429"], seen


def in_window(t429: float, seen: list[loopback.Seen]) -> list[loopback.Seen]:
    return [s for s in seen if t429 + SLACK < s.at < t429 + WINDOW - 0.01]


@pytest.mark.parametrize("store", ["sqlite", "redis"])
def test_after_one_429_no_process_sends_on_the_key_until_the_window_ends(
    store: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = (
        f"sqlite://{tmp_path}/cooldown.sqlite3"
        if store == "sqlite"
        else request.getfixturevalue("redis_url")
    )
    t429, seen = run_workers(url)
    assert in_window(t429, seen) == []
    # Every worker was busy before the 429 and went back to work after the window.
    before = {s.headers["x-worker"] for s in seen if s.at < t429}
    after = {s.headers["x-worker"] for s in seen if s.at >= t429 + WINDOW - 0.01}
    assert before == after == {"w0", "w1", "w2", "w3"}


def test_without_a_shared_store_the_other_processes_keep_hammering() -> None:
    # The control for the test above: it would notice a cooldown that is not shared.
    t429, seen = run_workers("off")
    assert len(in_window(t429, seen)) > 10


def test_an_unusable_sqlite_path_degrades_instead_of_failing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where a directory should be")
    store = cooldown_store_from_url(str(blocker / "cooldown.sqlite3"))
    assert store is not None
    with caplog.at_level(logging.WARNING, logger="fluid_build.cooldown"):
        assert store.extend("k", 4.0, NOW) == 4.0
        assert store.remaining("k", NOW) == 4.0
    assert caplog.text.count("failed") == 1


def test_envelope_from_env_uses_the_named_store(tmp_path: Path) -> None:
    from fluid_build.copilot.call.envelope import RetryEnvelope

    env = {"FLUID_COOLDOWN_URL": f"sqlite://{tmp_path}/c.sqlite3", "FLUID_LLM_MAX_ATTEMPTS": "4"}
    envelope = RetryEnvelope.from_env(env)
    assert envelope.policy.attempts == 4
    assert isinstance(envelope.cooldown, ResilientCooldownStore)
    assert isinstance(envelope.cooldown.primary, SqliteCooldownStore)
    assert "c.sqlite3" in repr(envelope)


# -- the state has a lifetime ------------------------------------------------------------


def test_a_counter_ends_ttl_after_its_last_increment(stores: StorePair) -> None:
    writer, reader, clock = stores
    now = clock()
    assert writer.incr("c", 10.0, now, "llm.server_error") == 1
    assert reader.incr("c", 10.0, now + 9, "llm.timeout") == 2  # within the window: counts
    assert writer.count("c", now + 18) == 2  # the window slides with each increment
    assert reader.count("c", now + 19.5) == 0  # and then it ends by itself
    assert writer.incr("c", 10.0, now + 20) == 1  # a fresh run of failures


def test_a_lease_has_one_owner_and_ends_by_itself(stores: StorePair) -> None:
    first, second, clock = stores
    now = clock()
    assert first.acquire("t", "a", 5.0, now)
    assert not second.acquire("t", "b", 5.0, now + 1)  # held
    assert first.acquire("t", "a", 5.0, now + 2)  # the owner renews it
    assert second.remaining("t", now + 2) == pytest.approx(5.0)
    second.release("t", "b")  # not the owner: nothing happens
    assert not second.acquire("t", "b", 5.0, now + 3)
    assert second.acquire("t", "b", 5.0, now + 7.5)  # "a" died: its lease ended
    first.release("t", "a")  # a late release by the old owner frees nothing
    assert not first.acquire("t", "a", 5.0, now + 8)
    second.release("t", "b")
    assert first.acquire("t", "a", 5.0, now + 8)


def test_only_one_of_many_contenders_gets_the_lease(stores: StorePair) -> None:
    first, second, clock = stores
    now = clock()
    won = [
        handle.acquire("t", f"owner-{i}", 5.0, now) for i, handle in enumerate([first, second] * 10)
    ]
    assert won.count(True) == 1


def test_cap_cuts_a_planted_window_down(stores: StorePair) -> None:
    writer, reader, clock = stores
    now = clock()
    # 20 hours: a skewed clock or a hand-planted row (past a day it is not fluid's at
    # all, and the shared stores delete it: tests/test_store_hostile.py)
    writer.extend("w", 72_000.0, now)
    reader.cap("w", 300.0, now)
    assert writer.remaining("w", now) == pytest.approx(300.0)
    reader.cap("w", 600.0, now)  # cap never lengthens
    assert writer.remaining("w", now) == pytest.approx(300.0)


def test_peek_reads_several_keys_at_once(stores: StorePair) -> None:
    writer, reader, clock = stores
    now = clock()
    writer.extend("w", 4.0, now)
    writer.incr("c", 10.0, now)
    writer.incr("c", 10.0, now)
    assert reader.peek(["w", "c", "none"], now) == [
        (pytest.approx(4.0), 0),
        (pytest.approx(10.0), 2),
        (0.0, 0),
    ]


def test_entries_list_what_is_live_and_clear_empties_the_store(stores: StorePair) -> None:
    writer, reader, clock = stores
    now = clock()
    writer.extend("cooldown:k", 30.0, now, "llm.rate_limited")
    writer.incr("breaker-fails:k", 60.0, now, "llm.server_error")
    writer.acquire("breaker-trial:k", "host:1:1", 5.0, now)
    writer.extend("gone", 1.0, now - 10)
    listed = {e.key: e for e in reader.entries(now)}
    assert set(listed) == {"cooldown:k", "breaker-fails:k", "breaker-trial:k"}
    assert listed["cooldown:k"].note == "llm.rate_limited"
    assert listed["cooldown:k"].until == pytest.approx(now + 30.0)
    assert listed["cooldown:k"].since == pytest.approx(now)
    assert listed["breaker-fails:k"].count == 1
    assert listed["breaker-trial:k"].owner == "host:1:1"
    assert reader.clear() >= 3
    assert writer.entries(now) == []
    assert writer.remaining("cooldown:k", now) == 0.0


def test_sqlite_drops_the_tables_of_an_older_version(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "cooldown.sqlite3"
    old = sqlite3.connect(path)
    old.execute("CREATE TABLE counters (key TEXT PRIMARY KEY, n INTEGER NOT NULL)")
    old.execute("INSERT INTO counters VALUES ('breaker-trial:openai:nokey:gpt-4o', 1)")
    old.commit()
    old.close()
    store = SqliteCooldownStore(path)
    assert store.entries(NOW) == []
    tables = {row[0] for row in sqlite3.connect(path).execute("SELECT name FROM sqlite_master")}
    assert "counters" not in tables
    store.close()


def test_the_key_names_the_endpoint_and_parses_back() -> None:
    a = CooldownKey.for_call("vllm", None, "llama", "http://127.0.0.1:8000/v1/")
    b = CooldownKey.for_call("vllm", None, "llama", "http://127.0.0.1:8001/v1")
    assert a != b
    assert str(a) == "vllm|http://127.0.0.1:8000/v1|nokey|llama"
    assert CooldownKey.parse(str(a)) == a
    assert CooldownKey.parse("no separators") is None
    # Credentials, query and fragment never reach a key; default ports and case fold.
    assert normalize_endpoint("HTTPS://user:pw@API.Example.com:443/v1/?key=k#f") == (
        "https://api.example.com/v1"
    )
    assert normalize_endpoint("http://[::1]:8080") == "http://[::1]:8080"
    assert normalize_endpoint("http://[") == "-"
    assert normalize_endpoint(None) == "-"


def test_an_empty_sqlite_url_uses_the_default_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    env = {"XDG_CACHE_HOME": str(tmp_path)}
    with caplog.at_level(logging.WARNING, logger="fluid_build.cooldown"):
        store = cooldown_store_from_url("sqlite://", env=env)
    assert isinstance(store, ResilientCooldownStore)
    assert isinstance(store.primary, SqliteCooldownStore)
    assert store.primary.path == default_cooldown_path(env)
    assert "names no file" in caplog.text


def test_a_second_connection_on_the_same_file_never_opens_and_closes_it_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Closing any descriptor of a file drops every POSIX lock this process holds on it:
    sqlite's own (the WAL index's) among them. A second store or the budget ledger on a
    file a connection of this process has open must not open the database, -wal or -shm
    again (8 processes on one budget died of SIGBUS when it did)."""
    import os

    from fluid_build.copilot.health import sqlite_store

    path = tmp_path / "c.sqlite3"
    first = SqliteCooldownStore(path)
    first.extend("k", 5.0, NOW)
    opened: list[str] = []
    real_open = os.open

    def spying(file: Any, *args: Any, **kwargs: Any) -> int:
        opened.append(os.fspath(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(sqlite_store.os, "open", spying)
    second = SqliteCooldownStore(path)
    second.extend("k", 6.0, NOW)
    ledger = second.budget_ledger()
    assert ledger.states(NOW) == []
    database = [f for f in opened if f in {str(path), f"{path}-wal", f"{path}-shm"}]
    assert database == []
    # A new file at that path (the old one removed) is checked again, as a new file.
    ledger.close()
    second.close()
    first.close()
    for name in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        name.unlink(missing_ok=True)
    SqliteCooldownStore(path).extend("k", 1.0, NOW)
    assert str(path) in opened
