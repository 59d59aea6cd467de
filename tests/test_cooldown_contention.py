"""A busy sqlite store never stalls a call: contention is advisory, not an outage.

Another process holds ``BEGIN EXCLUSIVE`` on the store's file (a real second
process, with its own connection): writes cannot get the lock. Calls through
the client must still complete promptly, one warning must say why, the store
must not be marked down, and sharing must work again once the lock is free.
Timings are asserted loosely (well under a second) to stay stable on busy CI.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import respx

from fluid_build.copilot import LLMClient
from fluid_build.copilot.call.envelope import RetryEnvelope
from fluid_build.copilot.health.cooldown import (
    MemoryCooldownStore,
    ResilientCooldownStore,
    SqliteCooldownStore,
)

URL = "https://api.openai.com/v1/chat/completions"
KEY = "sk-proj-CONTENTION0123456789abcdef"
NOW = 1_700_000_000.0
PROMPT = 0.5  # seconds: "well under one second", with room for a loaded machine

HOLDER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
sys.stdin.readline()
conn.execute("ROLLBACK")
conn.close()
"""


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """Another process holds the write lock of ``path`` inside the block."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdin is not None
    assert holder.stdout is not None
    try:
        assert holder.stdout.readline().strip() == "locked"
        yield
    finally:
        holder.stdin.write("\n")
        holder.stdin.close()
        assert holder.wait(timeout=10) == 0
        holder.stdout.close()


def created(path: Path) -> SqliteCooldownStore:
    """A store whose file exists, in WAL mode, as any first call leaves it."""
    store = SqliteCooldownStore(path)
    store.extend("warm-up", 1.0, NOW)
    return store


def busy_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "fluid_build.cooldown" and r.levelno >= logging.WARNING
    ]


class Tick:
    """The resilient store's monotonic clock, moved by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


# -- the sqlite store itself -------------------------------------------------------------


def test_a_locked_file_fails_a_write_fast_and_reads_still_answer(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite3"
    store = created(path)
    store.extend("k", 30.0, NOW)
    try:
        with locked(path):
            started = time.perf_counter()
            with pytest.raises(sqlite3.OperationalError) as caught:
                store.extend("k", 60.0, NOW)
            assert time.perf_counter() - started < PROMPT
            assert ResilientCooldownStore.is_contention(caught.value)
            # WAL: a writer never blocks readers, even a new handle's first read.
            assert store.remaining("k", NOW) == 30.0
            assert SqliteCooldownStore(path).remaining("k", NOW) == 30.0
        assert store.extend("k", 60.0, NOW) == 60.0
    finally:
        store.close()


def test_threads_queued_behind_a_locked_file_do_not_add_up(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite3"
    store = created(path)
    took: list[float] = []
    errors: list[BaseException] = []

    def write(i: int) -> None:
        started = time.perf_counter()
        try:
            store.extend(f"k{i}", 5.0, NOW)
        except sqlite3.OperationalError as exc:
            errors.append(exc)
        took.append(time.perf_counter() - started)

    try:
        with locked(path):
            threads = [threading.Thread(target=write, args=(i,)) for i in range(16)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
    finally:
        store.close()
    assert len(errors) == 16
    assert all(ResilientCooldownStore.is_contention(e) for e in errors)
    # Sixteen writers waiting in turn would take 16 busy timeouts; none waits more than two.
    assert max(took) < 2 * PROMPT


# -- contention is not breakage ----------------------------------------------------------


class Busy:
    """A primary in WAL mode while another process writes: reads answer, writes are locked."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __getattr__(self, op: str) -> object:
        def locked(*args: object) -> object:
            self.calls.append(op)
            if op in ResilientCooldownStore.WRITES:
                raise sqlite3.OperationalError("database is locked")
            return 0.0

        return locked

    def __repr__(self) -> str:
        return "Busy()"


def test_contention_answers_from_the_mirror_with_one_warning_and_no_outage(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tick = Tick()
    busy = Busy()
    store = ResilientCooldownStore(busy, retry_every=30, contention_pause=1.0, clock=tick)  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, logger="fluid_build.cooldown"):
        for i in range(50):
            tick.now = i * 0.1
            assert store.extend("k", 5.0, NOW) == 5.0
            assert store.incr("n", 60.0, NOW) == i + 1
            assert store.acquire("lease", "me", 10.0, NOW)
            assert store.remaining("k", NOW + 1) == 4.0
    assert not store.degraded  # contention is not an outage
    assert store.contended > 0
    warnings = busy_warnings(caplog)
    assert len(warnings) == 1
    assert "is busy" in warnings[0]
    assert "advisory" in warnings[0]
    # Reads ask every time; writes wait out the pause between tries (5 s: 5 tries of 3).
    assert busy.calls.count("remaining") == 50
    writes = [op for op in busy.calls if op != "remaining"]
    assert 5 <= len(writes) <= 5 * 3


def test_a_broken_store_is_still_marked_down() -> None:
    class Broken(Busy):
        def __getattr__(self, op: str) -> object:
            def broken(*args: object) -> object:
                self.calls.append(op)
                raise sqlite3.OperationalError("disk I/O error")

            return broken

    store = ResilientCooldownStore(Broken(), clock=Tick())  # type: ignore[arg-type]
    store.extend("k", 5.0, NOW)
    assert store.degraded
    assert store.contended == 0


@pytest.mark.parametrize(
    ("error", "busy"),
    [
        (sqlite3.OperationalError("database is locked"), True),
        (sqlite3.OperationalError("database table is locked"), True),
        (sqlite3.OperationalError("database is busy"), True),
        (sqlite3.OperationalError("disk I/O error"), False),
        (sqlite3.OperationalError("unable to open database file"), False),
        (sqlite3.DatabaseError("file is not a database"), False),
        (ConnectionError("database is locked"), False),
    ],
)
def test_what_counts_as_contention(error: BaseException, busy: bool) -> None:
    assert ResilientCooldownStore.is_contention(error) is busy


# -- through the client ------------------------------------------------------------------


def client_over(store: ResilientCooldownStore) -> LLMClient:
    envelope = RetryEnvelope.from_env(
        {},
        cooldown=store,
        sleep=lambda seconds: None,
        asleep=_no_wait,
        random=lambda: 0.0,
        hook=lambda event: None,
    )
    return LLMClient("openai", "gpt-4o", api_key=KEY, envelope=envelope, env={})


async def _no_wait(seconds: float) -> None:
    return None


def ok() -> httpx.Response:
    return httpx.Response(
        200,
        json={
            "model": "gpt-4o",
            "choices": [
                {"message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
            ],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1},
        },
    )


def boom() -> httpx.Response:
    return httpx.Response(500, json={"error": {"message": "boom"}})


def test_calls_through_a_locked_store_complete_promptly_and_sharing_resumes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "cooldown.sqlite3"
    created(path).close()
    tick = Tick()
    store = ResilientCooldownStore(SqliteCooldownStore(path), clock=tick)
    other = SqliteCooldownStore(path)  # another process's view of the same file
    took: list[float] = []
    with respx.mock() as mock, client_over(store) as client:
        route = mock.post(URL)
        with caplog.at_level(logging.WARNING), locked(path):
            for i in range(12):
                # Each call fails once, then succeeds: the breaker counts (a write),
                # then clears (another write); both meet the lock.
                route.side_effect = [boom(), ok()]
                tick.now = i * 0.25
                started = time.perf_counter()
                if i % 2:
                    assert asyncio.run(client.acomplete("hi")).text == "hi"
                else:
                    assert client.complete("hi").text == "hi"
                took.append(time.perf_counter() - started)
            assert not [e for e in other.entries(time.time()) if e.key != "warm-up"]
        assert max(took) < PROMPT, took
        assert sum(took) < 12 * PROMPT / 2
        warnings = busy_warnings(caplog)
        assert len(warnings) == 1, warnings
        assert "is busy" in warnings[0]
        assert not store.degraded

        # The lock is free: after the short pause, what this process writes is shared again.
        tick.now += 2.0
        route.side_effect = [boom(), boom(), boom()]
        with pytest.raises(Exception, match="boom"):
            client.complete("hi")
        shared = [e for e in other.entries(time.time()) if e.key.startswith("breaker-fails:")]
        assert shared
        assert shared[0].count == 3
    other.close()
    store.close()
    assert len(busy_warnings(caplog)) == 1


def test_a_memory_primary_never_contends() -> None:
    store = ResilientCooldownStore(MemoryCooldownStore(), clock=Tick())
    assert store.extend("k", 5.0, NOW) == 5.0
    assert store.contended == 0
