"""As many connections as calls in flight: N concurrent calls get N connections to one
server, unless the user capped the pool (``FLUID_LLM_MAX_CONNECTIONS`` or
``LLMClient(max_connections=)``), and then the admission gate keeps them in line.

A real loopback server holds every request until ``N`` are in it at once (a barrier):
a pool that opens fewer connections than that never fills the barrier, and the calls
fail. No clock decides anything here.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from fluid_build.copilot import LLMClient
from fluid_build.copilot.agents.errors import ProviderError
from fluid_build.copilot.call.envelope import RetryEnvelope
from fluid_build.copilot.call.transport import (
    KEEPALIVE_EXPIRY,
    MAX_CONNECTIONS,
    MAX_CONNECTIONS_ENV,
    TRANSPORT_ENV,
    AiohttpTransport,
    GatedTransport,
    build_async_client,
    build_client,
    connection_ceiling,
    max_connections_choice,
)
from tests.test_transport import ANSWER

#: More calls at once than the 100 connections a pool used to hold.
N = 150


class Together:
    """What the server saw: the connections (peer ports), and the most requests in it at
    once. Each request waits for ``group`` requests to be in the server together."""

    def __init__(self, group: int) -> None:
        self.barrier = threading.Barrier(group, timeout=20)
        self.lock = threading.Lock()
        self.peers: set[tuple[str, int]] = set()
        self.inside = 0
        self.most = 0
        self.broken = 0


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        seen = self.server.together
        with seen.lock:
            seen.peers.add(self.client_address[:2])
            seen.inside += 1
            seen.most = max(seen.most, seen.inside)
        try:
            seen.barrier.wait()
            status, body = 200, ANSWER
        except threading.BrokenBarrierError:  # fewer came together than asked: fail the call
            with seen.lock:
                seen.broken += 1
            status, body = 400, b'{"error": {"message": "not enough calls in flight"}}'
        with seen.lock:
            seen.inside -= 1
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # N connections arriving at once are all accepted

    def __init__(self, together: Together) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.together = together


@contextmanager
def server(group: int) -> Iterator[tuple[str, Together]]:
    together = Together(group)
    http = _Server(together)
    thread = threading.Thread(target=http.serve_forever, kwargs={"poll_interval": 0.05})
    thread.daemon = True
    thread.start()
    try:
        host, port = http.server_address[:2]
        yield f"http://{host!s}:{port}/v1", together
    finally:
        together.barrier.abort()  # nobody stays held past the test
        http.shutdown()
        http.server_close()
        thread.join(timeout=5)


def client(base: str, env: dict[str, str], **kwargs: Any) -> LLMClient:
    return LLMClient(
        "vllm",
        "m",
        base_url=base,
        envelope=RetryEnvelope(cooldown=None, sleep=lambda s: None, hook=lambda e: None),
        capability_matrix={"context_window": 32_768},
        env=env,
        **kwargs,
    )


@pytest.mark.parametrize("transport", ["aiohttp", "httpx"])
def test_n_concurrent_acomplete_calls_get_n_connections(transport: str) -> None:
    with server(N) as (base, seen):
        llm = client(base, {TRANSPORT_ENV: transport})

        async def main() -> list[str]:
            try:
                done = await asyncio.gather(*(llm.acomplete("hi") for _ in range(N)))
            finally:
                await llm.aclose()
            return [c.text for c in done]

        assert asyncio.run(main()) == ["Hi"] * N
    assert (seen.most, len(seen.peers), seen.broken) == (N, N, 0)


def test_amap_with_concurrency_n_has_n_calls_in_flight() -> None:
    with server(N) as (base, seen):
        llm = client(base, {})

        async def main() -> Any:
            try:
                return await llm.amap(["hi"] * N, concurrency=N)
            finally:
                await llm.aclose()

        batch = asyncio.run(main())
    assert [o.unwrap().text for o in batch] == ["Hi"] * N
    assert (seen.most, len(seen.peers)) == (N, N)


def test_map_with_concurrency_n_has_n_calls_in_flight_on_the_sync_pool() -> None:
    with server(N) as (base, seen), client(base, {}) as llm:
        batch = llm.map(["hi"] * N, concurrency=N)
    assert [o.unwrap().text for o in batch] == ["Hi"] * N
    assert (seen.most, len(seen.peers)) == (N, N)


@pytest.mark.parametrize(
    ("env", "kwargs"),
    [
        ({MAX_CONNECTIONS_ENV: "10"}, {}),
        ({MAX_CONNECTIONS_ENV: "500"}, {"max_connections": 10}),  # the argument wins
    ],
)
@pytest.mark.parametrize("transport", ["aiohttp", "httpx"])
def test_a_capped_pool_holds_that_many_connections_and_the_rest_wait_their_turn(
    transport: str, env: dict[str, str], kwargs: dict[str, int]
) -> None:
    # Requests are answered ten at a time: more than ten in the server at once, or
    # fewer than ten arriving together, and the barrier breaks.
    with server(10) as (base, seen):
        llm = client(base, {**env, TRANSPORT_ENV: transport}, **kwargs)

        async def main() -> list[str]:
            try:
                done = await asyncio.gather(*(llm.acomplete("hi") for _ in range(40)))
            finally:
                await llm.aclose()
            return [c.text for c in done]

        assert asyncio.run(main()) == ["Hi"] * 40
    assert (seen.most, len(seen.peers), seen.broken) == (10, 10, 0)


def test_a_capped_sync_pool_holds_that_many_connections() -> None:
    with server(10) as (base, seen), client(base, {MAX_CONNECTIONS_ENV: "10"}) as llm:
        batch = llm.map(["hi"] * 40, concurrency=40)
    assert [o.unwrap().text for o in batch] == ["Hi"] * 40
    assert (seen.most, len(seen.peers), seen.broken) == (10, 10, 0)


# -- the limits each pool is made with --------------------------------------------------------


def _gate_slots(pool: httpx.AsyncClient) -> int:
    transport = pool._transport
    assert isinstance(transport, GatedTransport | AiohttpTransport)
    return transport.gate.slots


def test_pools_follow_the_ceiling_unless_capped() -> None:
    ceiling = connection_ceiling()
    for env, slots in (({}, ceiling), ({MAX_CONNECTIONS_ENV: " 7 "}, 7)):
        for name in ("aiohttp", "httpx"):
            pool = build_async_client(30.0, "openai", {**env, TRANSPORT_ENV: name})
            assert _gate_slots(pool) == slots
            asyncio.run(pool.aclose())
        sync = build_client(30.0, "openai", env)
        core = sync._transport.pool  # type: ignore[attr-defined]
        assert core._max_connections == core._max_keepalive_connections == slots
        assert core._keepalive_expiry == KEEPALIVE_EXPIRY
        sync.close()
    pool = build_async_client(30.0, None, {MAX_CONNECTIONS_ENV: "7"}, max_connections=3)
    assert _gate_slots(pool) == 3
    asyncio.run(pool.aclose())


@pytest.mark.parametrize(
    ("soft", "ceiling"),
    [(1024, 512), (256, 128), (1_048_576, MAX_CONNECTIONS), (1, 1)],
)
def test_the_ceiling_is_half_the_open_file_limit(
    monkeypatch: pytest.MonkeyPatch, soft: int, ceiling: int
) -> None:
    import resource

    monkeypatch.setattr(resource, "getrlimit", lambda which: (soft, resource.RLIM_INFINITY))
    assert connection_ceiling() == ceiling
    monkeypatch.setattr(
        resource, "getrlimit", lambda which: (resource.RLIM_INFINITY, resource.RLIM_INFINITY)
    )
    assert connection_ceiling() == MAX_CONNECTIONS


@pytest.mark.parametrize("raw", ["0", "-1", "abc", "1e3", "10.5", "10001", "٣", "9" * 40])
def test_a_bad_cap_in_the_environment_is_a_typed_error_naming_it(raw: str) -> None:
    with pytest.raises(ProviderError) as caught:
        max_connections_choice({MAX_CONNECTIONS_ENV: raw})
    error = caught.value
    assert error.code == "llm.not_configured"
    assert MAX_CONNECTIONS_ENV in str(error)
    assert "e.g. FLUID_LLM_MAX_CONNECTIONS=200" in str(error)
    assert error.details["variable"] == MAX_CONNECTIONS_ENV
    # ... and a client says so when it is made, not at its first call
    with pytest.raises(ProviderError, match=MAX_CONNECTIONS_ENV):
        client("http://127.0.0.1:9/v1", {MAX_CONNECTIONS_ENV: raw})


@pytest.mark.parametrize("bad", [0, -5, MAX_CONNECTIONS + 1, True])
def test_a_bad_cap_argument_is_a_typed_error_when_the_client_is_made(bad: int) -> None:
    with pytest.raises(ProviderError, match="max_connections=") as caught:
        client("http://127.0.0.1:9/v1", {}, max_connections=bad)
    assert caught.value.code == "llm.not_configured"


def test_blank_means_no_cap() -> None:
    assert max_connections_choice({MAX_CONNECTIONS_ENV: "  "}) is None
    assert max_connections_choice({}) is None
    assert max_connections_choice({}, 250) == 250
