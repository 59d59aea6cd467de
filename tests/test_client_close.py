"""A call ended by its own client's ``close()`` is no provider failure (issue 32 item 13).

Real processes on the default store (the sqlite file under ``$XDG_CACHE_HOME``, the
breaker's default threshold of 5): one process starts six calls against a healthy
loopback server that is still thinking, and closes its client from another thread
while they wait. Each call ends ``llm.client_closed``, not retryable, after one
request, and nothing is written against the provider; a fresh process then calls
the same server, key and model, and is answered (no ``llm.circuit_open``). Sync
(fluid's sync pool) and async (the aiohttp transport). tests/test_conformance.py
(``closed-mid-call``, ``closed-mid-stream``) shows the outcome on every pool fluid makes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import hostile

ROOT = Path(__file__).resolve().parents[1]
CALLS = 6  # past the breaker's default threshold (5): each counted failure would open it
BOUND = 30.0  # seconds any process step may take on a loaded machine


class Thinking:
    """A healthy server that holds requests (it is thinking) until told to answer."""

    def __init__(self) -> None:
        self.arrived = threading.Condition()
        self.count = 0
        self.answering = threading.Event()

    def __call__(self, conn: hostile.Conn, request: hostile.Request) -> bool:
        if not self.answering.is_set():
            with self.arrived:
                self.count += 1
                self.arrived.notify_all()
            conn.hold()  # until the client hangs up
            return False
        return hostile.ok(conn, request)

    def wait_for(self, count: int) -> bool:
        with self.arrived:
            return self.arrived.wait_for(lambda: self.count >= count, timeout=BOUND)


@pytest.fixture
def server() -> Iterator[tuple[Thinking, str]]:
    thinking = Thinking()
    with hostile.serve(thinking, hold=BOUND) as running:
        yield thinking, running.url


def _worker(*argv: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("FLUID_COOLDOWN_URL", None)  # the default store
    return subprocess.Popen(
        [sys.executable, "-m", "tests.closing_worker", *argv],
        cwd=ROOT,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _last_line(proc: subprocess.Popen[str], stdin: str = "") -> dict[str, Any]:
    try:
        out, err = proc.communicate(stdin, timeout=BOUND)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"the worker hung; stderr: {err[-2000:]}")
    assert proc.returncode == 0, err[-2000:]
    assert err == "", err[-2000:]  # nothing on stderr: no "Unclosed ...", no traceback
    return dict(json.loads(out.strip().splitlines()[-1]))


@pytest.mark.parametrize("transport", ["sync", "aiohttp"])
def test_closing_a_client_mid_call_does_not_open_the_shared_breaker(
    transport: str, server: tuple[Thinking, str]
) -> None:
    thinking, url = server
    closing = _worker("close", transport, url, str(CALLS))
    try:
        assert closing.stdout is not None
        assert closing.stdout.readline().strip() == "ready"
        assert thinking.wait_for(CALLS), f"only {thinking.count} of {CALLS} requests arrived"
    except BaseException:
        closing.kill()
        closing.communicate()
        raise
    ended = _last_line(closing, "close\n")
    outcomes = [(r["outcome"], r.get("retryable"), r.get("attempts")) for r in ended["results"]]
    assert outcomes == [("llm.client_closed", False, 1)] * CALLS
    assert ended["waits"] == []  # nothing retried
    assert thinking.count == CALLS  # one request each

    thinking.answering.set()
    fresh = _last_line(_worker("call", transport, url))
    assert (fresh["outcome"], fresh["attempts"]) == ("ok", 1)
    (health,) = fresh["health"]
    assert (health["breaker"], health["failures"]) == ("closed", 0)
