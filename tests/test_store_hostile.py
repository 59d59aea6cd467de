"""A shared store that holds something fluid did not write never stops the sharing.

Issue 22, items 5 to 9: the sqlite file is never opened through a link or a
special file; a garbage entry (text, inf, a wrong-type Redis key) is skipped
and purged while every other key keeps being shared, in every process; only
a server's answer writes a cooldown; private state is 0700/0600; planted
extreme times read as capped, readable times. Store behaviour runs in real
worker processes (``python -m tests.cooldown_worker call``) on the DEFAULT
store (sqlite under a fresh ``XDG_CACHE_HOME``), twice in a row on the same
store, and on a real Redis; CLI paths run the installed ``fluid`` script.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sqlite3
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from fluid_build.copilot import LLMClient
from fluid_build.copilot.health.cooldown import (
    RedisCooldownStore,
    SqliteCooldownStore,
    cooldown_store_from_url,
    default_cooldown_path,
)
from tests import loopback
from tests.test_cli_conventions import FLUID, fresh_env

ROOT = Path(__file__).resolve().parents[1]
SH = "/bin/sh"  # runs the process under umask 022, as most users' shells do
OK = json.dumps(
    {
        "id": "chatcmpl-hostile",
        "object": "chat.completion",
        "model": "m",
        "choices": [
            {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "ok"}}
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
    }
).encode()
LIMITED = b'{"error": {"message": "Rate limit reached for requests", "type": "requests"}}'
JSON = {"content-type": "application/json"}


def worker_env(cache: Path, **extra: str) -> dict[str, str]:
    """A worker's whole environment: the default store under ``cache``, one attempt per call."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("OPENAI_", "FLUID_", "XDG_", "VLLM_"))
    }
    env.update(
        PYTHONPATH=str(ROOT),
        XDG_CACHE_HOME=str(cache),
        FLUID_LLM_MAX_ATTEMPTS="1",
        **extra,
    )
    return env


def call(
    base: str, model: str, env: dict[str, str], calls: int = 1
) -> tuple[list[dict[str, Any]], str]:
    """Run one worker process to its end: one JSON record per call, and its stderr."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.cooldown_worker", "call", base, model, str(calls)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()], done.stderr


def call_key(base: str, model: str) -> str:
    with LLMClient("vllm", model, base_url=f"{base}/v1", env={}) as client:
        return str(client.health_key)


@contextmanager
def provider(first: Callable[[loopback.Seen], loopback.Reply] | None = None) -> Iterator[Any]:
    """A vllm-like server: its first chat request gets ``first``'s answer, every other one 200.

    ``server.chats`` counts the chat requests (a local server is also asked for its models).
    """
    box: list[Any] = []

    def reply(seen: loopback.Seen) -> loopback.Reply:
        if not seen.path.endswith("/chat/completions"):
            return 200, JSON, b'{"object": "list", "data": []}'
        with box[0].lock:
            box[0].chats += 1
            chats = box[0].chats
        if first is not None and chats == 1:
            return first(seen)
        return 200, JSON, OK

    with loopback.http_server(reply) as server:
        server.chats = 0
        box.append(server)
        yield server


#: The 429's window in the store tests: long enough that the second process (and doctor)
#: still find it open on a loaded machine, beside other pytest-xdist workers; no test
#: waits for it to end (one attempt per call).
WINDOW = "30"


def retry_after(seconds: str) -> Callable[[loopback.Seen], loopback.Reply]:
    return lambda seen: (429, {**JSON, "retry-after": seconds}, LIMITED)


# -- item 5: the database is never opened through a link or a special file -----------------

PLANTS = ["link-to-empty-file", "dangling-link", "fifo", "directory", "another-users-file"]


def plant(kind: str, path: Path, victim: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "link-to-empty-file":
        victim.write_bytes(b"")
        path.symlink_to(victim)
    elif kind == "dangling-link":
        path.symlink_to(victim)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    else:
        path.write_bytes(b"")
        os.chown(path, 65534, 65534)  # the suite runs as root in CI; nobody owns it now


def untouched(kind: str, path: Path, victim: Path) -> None:
    if kind == "link-to-empty-file":
        assert path.is_symlink()
        assert victim.read_bytes() == b""
    elif kind == "dangling-link":
        assert path.is_symlink()
        assert not victim.exists()
    elif kind == "fifo":
        assert stat.S_ISFIFO(path.lstat().st_mode)
    elif kind == "directory":
        assert path.is_dir()
        assert list(path.iterdir()) == []
    else:
        assert path.read_bytes() == b""


@pytest.mark.parametrize("kind", PLANTS)
def test_the_database_is_never_opened_through_a_link_or_a_special_file(
    kind: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "state" / "cooldown.sqlite3"
    victim = tmp_path / "victim"
    plant(kind, path, victim)
    store = cooldown_store_from_url(str(path))
    assert store is not None
    now = time.time()
    results: list[float] = []

    def work() -> None:  # in a thread: a FIFO that blocked the open would hang it
        store.extend("cooldown:k", 5.0, now, "llm.rate_limited")
        store.extend("cooldown:j", 5.0, now, "llm.rate_limited")
        results.append(store.remaining("cooldown:k", now))

    with caplog.at_level(logging.WARNING, logger="fluid_build"):
        worker = threading.Thread(target=work, daemon=True)
        worker.start()
        worker.join(timeout=10)
        assert not worker.is_alive(), "the store hung on what was planted at its path"
    close = getattr(store, "close", None)
    if callable(close):
        close()
    assert results == [pytest.approx(5.0)]  # this process still keeps its own windows
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, warnings
    assert str(path) in warnings[0]
    assert "this process only" in warnings[0]
    untouched(kind, path, victim)


def test_doctor_says_why_it_will_not_open_a_linked_store_and_leaves_the_target_alone(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    victim = home / "victim"
    path = home / ".cache" / "fluid_build" / "cooldown.sqlite3"
    home.mkdir()
    plant("link-to-empty-file", path, victim)
    done = subprocess.run(
        [str(FLUID), "doctor", "--json"],
        env=fresh_env(home),
        cwd=home,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    cooldown = json.loads(done.stdout)["cooldown"]
    assert cooldown["reachable"] is False
    assert "symbolic link" in cooldown["error"]
    assert "FLUID_COOLDOWN_URL" in cooldown["error"]
    assert victim.read_bytes() == b""


# -- item 6: a garbage entry is skipped and purged; the rest stays shared ------------------


def garbage_rows(path: Path, key: str, now: float) -> None:
    """Rows no fluid writes, one at the call's own cooldown key, in the file's table."""
    store = SqliteCooldownStore(path)  # the file and its table, as any run makes them
    store.remaining("x", now)
    store.close()
    with sqlite3.connect(path) as conn:
        conn.executemany(
            "INSERT OR REPLACE INTO fluid_state (key, until, since, n, owner, note) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            [
                ("cooldown:" + key, "soon", now, 0, None, ""),
                ("breaker-fails:" + key, now + 30, "yesterday", "many", None, ""),
                ("breaker-open:other|-|nokey|m", 9e999, now, 0, None, "llm.server_error"),
                ("breaker-half:other|-|nokey|m", now + 1e300, -1e300, 0, None, ""),
                ("breaker-trial:other|-|nokey|m", now + 30, now, 0, b"\xff", ""),
                (b"\x00blob", now + 30, now, 0, None, ""),
            ],
        )


def live_garbage(path: Path) -> int:
    with sqlite3.connect(path) as conn:
        rows = conn.execute(
            "SELECT count(*) FROM fluid_state WHERE typeof(key) != 'text' "
            "OR typeof(until) NOT IN ('integer', 'real') OR typeof(n) != 'integer' "
            "OR typeof(since) NOT IN ('integer', 'real') OR abs(until) > 1e12 "
            "OR abs(since) > 1e12 OR typeof(owner) NOT IN ('null', 'text')"
        ).fetchone()
    return int(rows[0])


def test_garbage_rows_in_the_default_store_are_purged_and_sharing_goes_on(
    tmp_path: Path,
) -> None:
    cache = tmp_path / "cache"
    path = default_cooldown_path({"XDG_CACHE_HOME": str(cache)})
    for run, model in enumerate(("m-first", "m-again")):  # twice on the same store
        with provider(retry_after(WINDOW)) as server:
            base = loopback.base_url(server)
            key = call_key(base, model)
            garbage_rows(path, key, time.time())
            (first,), err1 = call(base, model, worker_env(cache))
            (second,), err2 = call(base, model, worker_env(cache, FLUID_LLM_DEADLINE_SECONDS="1"))
            assert first["outcome"] == "llm.rate_limited", (run, first)
            # The 429's window reached the other process through the file: it did not send.
            assert second["outcome"] == "llm.rate_limited", (run, second)
            assert second["details"].get("cooldown") is True, (run, second)
            assert server.chats == 1
            assert "failed" not in err1 + err2, err1 + err2
            assert live_garbage(path) == 0


def plant_redis(url: str, prefix: str, key: str) -> Any:
    import redis

    client = redis.Redis.from_url(url)
    client.rpush(prefix + "cooldown:" + key, "not", "a", "hash")  # the call's own key
    client.rpush(prefix + "breaker-fails:other|-|nokey|m", "x")
    client.set(prefix + "ratelimit-requests:other|-|nokey|m", "a string")
    client.hset(prefix + "breaker-open:" + key, mapping={"until": "soon", "since": "x"})
    client.hset(
        prefix + "breaker-trial:other|-|nokey|m",
        mapping={"until": "inf", "since": "0", "owner": "ghost"},
    )
    return client


def test_wrong_type_and_garbage_redis_keys_are_skipped_deleted_and_doctor_lists_the_rest(
    tmp_path: Path, redis_url: str
) -> None:
    prefix = "fluid:health:"
    cache = tmp_path / "cache"
    for run in range(2):
        with provider(retry_after(WINDOW)) as server:
            base = loopback.base_url(server)
            model = f"m-redis-{run}-{time.time_ns()}"
            key = call_key(base, model)
            client = plant_redis(redis_url, prefix, key)
            env = worker_env(cache, FLUID_COOLDOWN_URL=redis_url)
            (first,), err1 = call(base, model, env)
            (second,), err2 = call(base, model, {**env, "FLUID_LLM_DEADLINE_SECONDS": "1"})
            assert first["outcome"] == "llm.rate_limited", (run, first)
            assert second["outcome"] == "llm.rate_limited", (run, second)
            assert second["details"].get("cooldown") is True, (run, second)
            assert server.chats == 1
            assert "failed" not in err1 + err2, err1 + err2
            done = subprocess.run(
                [str(FLUID), "doctor", "--json"],
                env={**fresh_env(tmp_path), "FLUID_COOLDOWN_URL": redis_url},
                cwd=tmp_path,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert done.returncode == 0, done.stderr
            shared = json.loads(done.stdout)["shared_state"]
            assert shared["error"] is None
            assert key in [e["key"] for e in shared["entries"]]
            for name in (
                "breaker-fails:other|-|nokey|m",
                "ratelimit-requests:other|-|nokey|m",
                "breaker-trial:other|-|nokey|m",
            ):
                assert client.exists(prefix + name) == 0, name
            assert client.type(prefix + "cooldown:" + key) == b"hash"
            client.close()


def test_a_redis_lease_that_never_ends_neither_refuses_nor_shows(redis_url: str) -> None:
    import redis

    prefix = f"fluid:test-inf-{time.time_ns()}:"
    client = redis.Redis.from_url(redis_url)
    store = RedisCooldownStore(redis_url, prefix=prefix)
    now = time.time()
    for until in ("inf", "nan", "1e300", "-inf"):
        client.hset(prefix + "trial", mapping={"until": until, "since": "0", "owner": "ghost"})
        assert store.peek(["trial"], now) == [(0.0, 0)]
        assert store.entries(now) == []
        client.hset(prefix + "trial", mapping={"until": until, "since": "0", "owner": "ghost"})
        assert store.acquire("trial", "me", 5.0, now) is True, until
        store.release("trial", "me")
    client.close()


# -- item 7: only a server's answer writes a cooldown ----------------------------------------


def test_a_refusal_by_the_own_rate_limiter_is_not_shared_as_a_cooldown(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    with provider() as server:
        base = loopback.base_url(server)
        for model in ("m-limited", "m-limited-again"):  # twice on the same store
            limited = worker_env(
                cache, FLUID_RATE_LIMITS="vllm=1rpm", FLUID_LLM_DEADLINE_SECONDS="2"
            )
            records, _ = call(base, model, limited, calls=2)
            assert [r["outcome"] for r in records] == ["ok", "llm.rate_limited"]
            assert records[1]["details"].get("rate_limit_budget") is True
            free_env = worker_env(cache, FLUID_RATE_LIMITS="off", FLUID_LLM_DEADLINE_SECONDS="2")
            (free,), err = call(base, model, free_env)
            assert free["outcome"] == "ok", free
            assert "Retry-After" not in err


# -- item 8: private state is 0700 / 0600 --------------------------------------------------


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_the_store_and_its_directories_are_private_after_a_real_run(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    held = threading.Event()
    release = threading.Event()

    def stall(seen: loopback.Seen) -> loopback.Reply:
        held.set()
        release.wait(30)  # the run is in flight, its store open: -wal and -shm exist
        return 200, JSON, OK

    with provider(stall) as server:
        base = loopback.base_url(server)
        env = worker_env(home / ".cache", HOME=str(home))
        umask = [SH, "-c", 'umask 022; exec "$0" "$@"']
        worker = subprocess.Popen(
            [*umask, sys.executable, "-m", "tests.cooldown_worker", "call", base, "m"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert held.wait(30), "the worker never sent its request"
            store = home / ".cache" / "fluid_build" / "cooldown.sqlite3"
            modes = {
                p.name: oct(mode(p))
                for p in (home / ".cache", store.parent, *store.parent.iterdir())
            }
        finally:
            release.set()
            out, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, err
    assert json.loads(out)["outcome"] == "ok"
    assert modes == {
        ".cache": "0o700",
        "fluid_build": "0o700",
        "cooldown.sqlite3": "0o600",
        "cooldown.sqlite3-wal": "0o600",
        "cooldown.sqlite3-shm": "0o600",
        "cooldown.sqlite3.generation": "0o600",
    }


def test_fluid_doctor_in_a_fresh_home_creates_private_state(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    done = subprocess.run(
        [SH, "-c", 'umask 022; exec "$0" "$@"', str(FLUID), "doctor"],
        env=fresh_env(home),
        cwd=home,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    store = home / ".cache" / "fluid_build" / "cooldown.sqlite3"
    assert mode(home / ".cache") == 0o700
    assert mode(store.parent) == 0o700
    assert mode(store) == 0o600
    assert mode(store.with_name(store.name + ".generation")) == 0o600


# -- item 9: planted extreme times read capped and readable ------------------------------------

LONG_NUMBER = re.compile(r"\d{7,}")


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.4, "0 s"),
        (59.6, "60 s"),
        (119, "119 s"),
        (300, "5 min"),
        (3599, "60 min"),
        (7200, "2 h"),
        (50_000, "13 h 53 min"),
        (86_400, "24 h"),
        (86_401, "more than 1 day"),
        (1e300, "more than 1 day"),
        (float("inf"), "more than 1 day"),
        (float("nan"), "an unknown time"),
        (-5, "0 s"),
    ],
)
def test_readable_seconds(seconds: float, text: str) -> None:
    from fluid_build.copilot.health.store import readable_seconds

    assert readable_seconds(seconds) == text


def test_doctor_shows_planted_extreme_times_capped_and_readable(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    path = home / ".cache" / "fluid_build" / "cooldown.sqlite3"
    path.parent.mkdir(parents=True)
    now = time.time()
    key = "openai|https://api.openai.com/v1|abcdefabcdefabcd|gpt-4o"
    store = SqliteCooldownStore(path)
    store.remaining("x", now)
    store.close()
    with sqlite3.connect(path) as conn:
        conn.executemany(
            "INSERT INTO fluid_state (key, until, since, n, owner, note) VALUES (?, ?, ?, ?, ?, ?)",
            [
                ("cooldown:" + key, now + 1e300, now - 1e300, 0, None, "llm.rate_limited"),
                ("breaker-open:" + key, now + 50_000, now, 0, None, "llm.server_error"),
                ("breaker-half:" + key, now + 80_000, now, 0, None, "llm.server_error"),
                ("breaker-trial:" + key, float("inf"), now, 0, "ghost:1:1", ""),
                ("ratelimit-requests:" + key, now + 70_000, now, 1000, None, ""),
                ("ratelimit-tokens:" + key, now + 30, now, 10**18, None, ""),
            ],
        )
    done = subprocess.run(
        [str(FLUID), "doctor"],
        env=fresh_env(home),
        cwd=home,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    line = next(line for line in done.stdout.splitlines() if "gpt-4o at https" in line)
    assert LONG_NUMBER.findall(line + done.stderr) == [], line + done.stderr
    # As every process trusts them: the open window at the 30 s cool-off, the
    # budget's reset at the 300 s Retry-After cap; the planted cooldown and
    # lease (past a day, or never ending) are not fluid's and are gone.
    assert "half-opens" in line
    assert "(in 30 s)" in line
    assert "resets" in line
    assert "(in 5 min)" in line
    assert "cooling down" not in line
    assert "ghost" not in line
    assert "tokens budget" not in line


def test_a_store_an_older_fluid_left_readable_is_made_private(tmp_path: Path) -> None:
    """A database, -wal and -shm made 0644 before fluid made them private: 0600 after a run."""
    cache = tmp_path / "cache"
    store = cache / "fluid_build" / "cooldown.sqlite3"
    store.parent.mkdir(parents=True)
    with sqlite3.connect(store) as made:  # an older fluid's file, as its umask left it
        made.execute("PRAGMA journal_mode=WAL")
        made.execute("CREATE TABLE old (x)")
    sidecars = [store.with_name(store.name + suffix) for suffix in ("-wal", "-shm")]
    for path in (store, *sidecars):
        path.touch()
        path.chmod(0o644)
    with provider() as server:
        for _ in range(2):  # twice on the same store
            (record,), err = call(loopback.base_url(server), "m", worker_env(cache))
            assert record["outcome"] == "ok", err
    assert mode(store) == 0o600
    for path in sidecars:
        assert not path.exists() or mode(path) == 0o600, path
