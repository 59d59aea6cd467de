"""A call ended by its own client's ``close()`` is no provider failure (issue 32 item 13).

Real processes on the default store (the sqlite file under ``$XDG_CACHE_HOME``), and
on a real Redis, with the breaker's default threshold of 5: one process starts six
calls against a healthy loopback server that is still thinking, and closes its client
from another thread while they wait. Each call ends ``llm.client_closed``, not retryable, after one
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


def _worker(*argv: str, store: str | None = None) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("FLUID_COOLDOWN_URL", None)  # the default store, unless one is named
    if store is not None:
        env["FLUID_COOLDOWN_URL"] = store
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


@pytest.mark.parametrize("store", ["default", "redis"])
@pytest.mark.parametrize("transport", ["sync", "aiohttp"])
def test_closing_a_client_mid_call_does_not_open_the_shared_breaker(
    transport: str, store: str, server: tuple[Thinking, str], request: pytest.FixtureRequest
) -> None:
    thinking, url = server
    shared = None if store == "default" else str(request.getfixturevalue("redis_url"))
    closing = _worker("close", transport, url, str(CALLS), store=shared)
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
    fresh = _last_line(_worker("call", transport, url, store=shared))
    assert (fresh["outcome"], fresh["attempts"]) == ("ok", 1)
    (health,) = fresh["health"]
    assert (health["breaker"], health["failures"]) == ("closed", 0)


# -- a call waiting for a connection slot as the client closes -------------------------------


@pytest.mark.parametrize("transport", ["aiohttp", "httpx"])
def test_a_call_waiting_for_a_slot_as_its_client_closes_is_never_sent(
    transport: str, server: tuple[Thinking, str]
) -> None:
    import asyncio
    import gc
    import warnings

    from fluid_build.copilot import LLMClient
    from fluid_build.copilot.agents.errors import AgentExecutionError
    from fluid_build.copilot.call.envelope import RetryEnvelope

    thinking, url = server
    client = LLMClient(
        "openai",
        "gpt-4o-mini",
        api_key="sk-test",
        base_url=f"{url}/v1",
        envelope=RetryEnvelope(cooldown=None),
        env={"FLUID_LLM_TRANSPORT": transport},
        max_connections=1,
    )

    async def one() -> str:
        try:
            return (await client.acomplete("hi")).text
        except AgentExecutionError as error:
            return error.code

    async def both() -> list[str]:
        first = asyncio.create_task(one())
        assert await asyncio.to_thread(thinking.wait_for, 1)
        second = asyncio.create_task(one())
        assert client._apools is not None
        gate = client._apools._pools[asyncio.get_running_loop()][0]._fluid_route.default.gate
        for _ in range(1000):  # the second call reaches the gate within a few turns of the loop
            if gate.waiting:
                break
            await asyncio.sleep(0)
        assert gate.waiting == 1
        thinking.answering.set()  # were it sent now, it would be answered
        await asyncio.to_thread(client.close)
        return list(await asyncio.gather(first, second))

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert asyncio.run(both()) == ["llm.client_closed", "llm.client_closed"]
        gc.collect()  # a connection opened for the waiting call would warn here
    assert thinking.count == 1  # the waiting call was never sent
    assert [str(w.message) for w in caught] == []


def test_a_closed_sync_pool_opens_no_connection_for_a_request_already_inside_it() -> None:
    import httpx

    from fluid_build.copilot.call.transport import CoreTransport

    accepted: list[hostile.Request] = []
    with hostile.serve(lambda conn, request: accepted.append(request) or False) as running:
        transport = CoreTransport()
        transport.close()  # as the client's close() does while a thread waits in httpcore
        request = httpx.Request("POST", f"{running.url}/v1/chat/completions", content=b"{}")
        with pytest.raises(httpx.ConnectError, match="the client has been closed"):
            transport.handle_request(request)
    assert accepted == []
