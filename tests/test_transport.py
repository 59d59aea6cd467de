"""The connection pools: limits, the FIFO admission gate, and the transport choice."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

from fluid_build.copilot import LLMClient
from fluid_build.copilot.agents.errors import ProviderError, ProviderTimeoutError
from fluid_build.copilot.call.envelope import RetryEnvelope
from fluid_build.copilot.call.transport import (
    TRANSPORT_ENV,
    AdmissionGate,
    AiohttpTransport,
    GatedTransport,
    PooledAsyncClient,
    build_async_client,
    build_client,
    connection_ceiling,
    transport_choice,
)
from tests import loopback

ANSWER = json.dumps(
    {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "m",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "Hi"}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }
).encode()
TWO_SLOTS = httpx.Limits(max_connections=2, max_keepalive_connections=2)


class Held:
    """What a holding server saw: callers in order of arrival, each held until let go."""

    def __init__(self) -> None:
        self.order: list[str] = []
        self.arrived = threading.Semaphore(0)
        self.go = threading.Semaphore(0)

    def reply(self, seen: loopback.Seen) -> loopback.Reply:
        self.order.append(seen.headers.get("x-caller", "?"))
        self.arrived.release()
        self.go.acquire(timeout=10)
        return 200, {"content-type": "application/json"}, ANSWER

    async def wait_arrival(self) -> None:
        assert await asyncio.to_thread(self.arrived.acquire, True, 5), "no request arrived"


@contextmanager
def holding_server() -> Iterator[tuple[str, Held]]:
    held = Held()
    with loopback.http_server(held.reply) as server:
        try:
            yield loopback.base_url(server), held
        finally:
            for _ in range(16):  # nobody stays held past the test
                held.go.release()


def gate_of(client: httpx.AsyncClient) -> AdmissionGate:
    """The gate before a pool: httpx's behind a GatedTransport, aiohttp's its own."""
    transport = client._transport
    assert isinstance(transport, GatedTransport | AiohttpTransport)
    return transport.gate


async def queued(gate: AdmissionGate, waiting: int) -> None:
    """Let the loop run until ``waiting`` callers stand in line (no clock involved)."""
    for _ in range(10_000):
        if gate.waiting == waiting:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"{gate!r}: expected {waiting} waiting")


def vllm(base: str, pool: httpx.AsyncClient, deadline: float = 10.0) -> LLMClient:
    return LLMClient(
        "vllm",
        "m",
        base_url=f"{base}/v1",
        envelope=RetryEnvelope(cooldown=None, sleep=lambda s: None, hook=lambda e: None),
        capability_matrix={"context_window": 32_768},
        async_http_client=pool,
        deadline=deadline,
        env={},
    )


def test_pools_keep_every_connection_alive() -> None:
    for name in ("aiohttp", "httpx"):
        other = build_async_client(30.0, "openai", {TRANSPORT_ENV: name})
        assert other.transport_name == name
        assert gate_of(other).slots == connection_ceiling()
        asyncio.run(other.aclose())
    client = build_async_client(30.0, "openai", {TRANSPORT_ENV: "httpx"})
    gate = gate_of(client)
    pool = client._transport.inner._pool  # type: ignore[attr-defined]
    slots = connection_ceiling()
    assert gate.slots == slots
    assert pool._max_connections == pool._max_keepalive_connections == slots
    assert client.timeout == httpx.Timeout(30.0)
    sync = build_client(30.0, "openai", {})
    sync_pool = sync._transport.pool  # type: ignore[attr-defined]
    assert sync_pool._max_connections == sync_pool._max_keepalive_connections == slots
    sync.close()
    asyncio.run(client.aclose())


def test_callers_beyond_the_pool_are_admitted_in_the_order_they_came() -> None:
    async def main(base: str, held: Held) -> list[str]:
        async with build_async_client(10.0, None, {}, limits=TWO_SLOTS) as client:
            gate = gate_of(client)

            async def call(name: str) -> int:
                response = await client.post(f"{base}/x", headers={"x-caller": name}, json={})
                return response.status_code

            tasks = []
            for i in range(5):
                tasks.append(asyncio.create_task(call(str(i))))
                if i < 2:
                    await held.wait_arrival()
                else:
                    await queued(gate, i - 1)
            for _ in range(3):  # each one let go admits the longest waiter, and only it
                held.go.release()
                await held.wait_arrival()
            held.go.release()
            held.go.release()
            assert await asyncio.gather(*tasks) == [200] * 5
            assert (gate.in_use, gate.waiting) == (0, 0)
            return held.order

    with holding_server() as (base, held):
        assert asyncio.run(main(base, held)) == ["0", "1", "2", "3", "4"]


def test_a_deadline_that_ends_in_line_is_the_typed_timeout_and_leaks_no_slot() -> None:
    deadline = 0.4

    async def main(base: str, held: Held) -> tuple[float, ProviderTimeoutError]:
        pool = build_async_client(10.0, "vllm", {}, limits=TWO_SLOTS)
        patient, hurried = (vllm(base, pool, seconds) for seconds in (10.0, deadline))
        busy = [asyncio.create_task(patient.acomplete("hi")) for _ in range(2)]
        await held.wait_arrival()
        await held.wait_arrival()
        started = time.monotonic()
        with pytest.raises(ProviderTimeoutError) as caught:
            await hurried.acomplete("hi")
        took = time.monotonic() - started
        held.go.release()
        held.go.release()
        await asyncio.gather(*busy)
        gate = gate_of(pool)
        assert (gate.in_use, gate.waiting) == (0, 0)
        await pool.aclose()
        return took, caught.value

    with holding_server() as (base, held):
        took, error = asyncio.run(main(base, held))
    assert error.code == "llm.deadline_exceeded"
    assert error.details["reached"] == "a connection"
    assert took < deadline + 0.25
    assert held.order == ["?", "?"]  # the third never reached the server


def test_a_caller_cancelled_in_line_gives_up_its_place() -> None:
    async def main(base: str, held: Held) -> None:
        async with build_async_client(10.0, None, {}, limits=TWO_SLOTS) as client:
            gate = gate_of(client)

            async def call(name: str) -> int:
                response = await client.post(f"{base}/x", headers={"x-caller": name}, json={})
                return response.status_code

            first = [asyncio.create_task(call(str(i))) for i in range(2)]
            await held.wait_arrival()
            await held.wait_arrival()
            gone = asyncio.create_task(call("gone"))
            await queued(gate, 1)
            after = asyncio.create_task(call("after"))
            await queued(gate, 2)
            gone.cancel()
            with pytest.raises(asyncio.CancelledError):
                await gone
            assert gate.waiting == 1
            held.go.release()
            await held.wait_arrival()
            held.go.release()
            held.go.release()
            assert await asyncio.gather(*first, after) == [200] * 3
            assert (gate.in_use, gate.waiting) == (0, 0)

    with holding_server() as (base, held):
        asyncio.run(main(base, held))
        assert held.order[2:] == ["after"]


def test_a_slot_handed_over_as_its_caller_gives_up_goes_to_the_next() -> None:
    async def main() -> None:
        gate = AdmissionGate(1)
        await gate.acquire(None)
        late = asyncio.create_task(gate.acquire(None))
        await queued(gate, 1)
        gate.release()  # handed to `late`, which is cancelled before it runs
        late.cancel()
        await asyncio.gather(late, return_exceptions=True)
        assert (gate.in_use, gate.waiting) == (0, 0)
        await gate.acquire(None)
        with pytest.raises(httpx.PoolTimeout):  # full, and no time to wait
            await gate.acquire(0.0)

    asyncio.run(main())


@pytest.mark.parametrize("value", ["requests", "aiohttp2", "h2", "httpx;rm"])
def test_an_unknown_transport_names_the_variable(value: str) -> None:
    with pytest.raises(ProviderError) as caught:
        build_async_client(10.0, "openai", {TRANSPORT_ENV: value})
    assert caught.value.code == "llm.not_configured"
    assert caught.value.retryable is False
    assert caught.value.details["variable"] == TRANSPORT_ENV
    assert caught.value.details["example"] == "httpx"
    assert TRANSPORT_ENV in str(caught.value)
    assert "aiohttp" in str(caught.value)


@pytest.mark.parametrize("missing", ["aiohttp"])
def test_aiohttp_asked_for_but_not_installed_says_how_to_install(
    missing: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, missing, None)  # import fails as if not installed
    with pytest.raises(ProviderError) as caught:
        transport_choice({TRANSPORT_ENV: "aiohttp"})
    assert caught.value.code == "llm.not_configured"
    assert caught.value.details == {
        "variable": TRANSPORT_ENV,
        "example": "httpx",
        "missing": missing,
    }
    assert "pip install aiohttp" in str(caught.value)
    # Left to choose, a client installed without them still has httpx.
    assert transport_choice({}) == transport_choice({TRANSPORT_ENV: "auto"}) == "httpx"


@pytest.mark.parametrize(
    ("env", "argument", "chosen"),
    [
        ({}, None, "aiohttp"),
        ({TRANSPORT_ENV: "auto"}, None, "aiohttp"),
        ({TRANSPORT_ENV: "httpx"}, None, "httpx"),
        ({TRANSPORT_ENV: " AIOHTTP "}, None, "aiohttp"),
        ({}, "aiohttp", "aiohttp"),
        ({TRANSPORT_ENV: "aiohttp"}, "httpx", "httpx"),
    ],
)
def test_the_transport_comes_from_the_argument_else_the_variable(
    env: dict[str, str], argument: str | None, chosen: str
) -> None:
    assert transport_choice(env, argument) == chosen


def test_auto_is_httpx_while_a_test_double_stands_in_for_httpx(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import respx

    assert transport_choice({}) == "aiohttp"
    with respx.mock:  # replaces httpcore's pool methods
        assert transport_choice({}) == "httpx"
        # asked for by name, aiohttp it is: the caller chose to go round the double
        assert transport_choice({TRANSPORT_ENV: "aiohttp"}) == "aiohttp"
    assert transport_choice({}) == "aiohttp"

    async def answered(self: object, request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=ANSWER)

    # as pytest-httpx does: httpx's own async transport replaced
    monkeypatch.setattr(httpx.AsyncHTTPTransport, "handle_async_request", answered)
    assert transport_choice({}) == "httpx"


def test_a_respx_mock_sees_the_default_clients_async_calls() -> None:
    import respx

    with respx.mock:
        route = respx.post("http://provider.invalid/v1/chat/completions").mock(
            return_value=httpx.Response(200, content=ANSWER)
        )
        client = LLMClient(
            "vllm",
            "m",
            base_url="http://provider.invalid/v1",
            envelope=RetryEnvelope(cooldown=None, sleep=lambda s: None, hook=lambda e: None),
            capability_matrix={"context_window": 32_768},
            env={},
        )

        async def main() -> str:
            try:
                return (await client.acomplete("hi")).text
            finally:
                await client.aclose()

        assert asyncio.run(main()) == "Hi"
        assert route.call_count == 1


def test_respx_using_httpx_sees_an_aiohttp_pools_calls_too() -> None:
    import respx

    async def main() -> str:
        pool = build_async_client(10.0, "vllm", {TRANSPORT_ENV: "aiohttp"})
        try:
            return (await vllm("http://provider.invalid", pool).acomplete("hi")).text
        finally:
            await pool.aclose()

    with respx.mock(using="httpx") as router:  # hooks the client's choice of transport
        route = router.post("http://provider.invalid/v1/chat/completions").mock(
            return_value=httpx.Response(200, content=ANSWER)
        )
        assert asyncio.run(main()) == "Hi"
        assert route.call_count == 1


def test_the_default_client_sends_async_calls_over_aiohttp() -> None:
    async def main(base: str) -> tuple[str, str]:
        client = LLMClient(
            "vllm",
            "m",
            base_url=f"{base}/v1",
            envelope=RetryEnvelope(cooldown=None, sleep=lambda s: None, hook=lambda e: None),
            capability_matrix={"context_window": 32_768},
            env={},
        )
        try:
            text = (await client.acomplete("hi")).text
            return text, cast_pool(client._aclient()).transport_name
        finally:
            await client.aclose()

    with loopback.http_server(
        lambda seen: (200, {"content-type": "application/json"}, ANSWER)
    ) as server:
        assert asyncio.run(main(loopback.base_url(server))) == ("Hi", "aiohttp")


def cast_pool(pool: httpx.AsyncClient) -> PooledAsyncClient:
    assert isinstance(pool, PooledAsyncClient)
    return pool


def test_the_aiohttp_transport_carries_a_call_and_frees_its_slot() -> None:
    async def main(base: str) -> dict[str, Any]:
        pool = build_async_client(10.0, "vllm", {TRANSPORT_ENV: "aiohttp"})
        gate = gate_of(pool)
        assert type(pool._transport) is AiohttpTransport
        async with vllm(base, pool) as llm:
            completion = await llm.acomplete("hi")
        raw = await pool.post(f"{base}/v1/chat/completions", json={"x": 1})
        assert (gate.in_use, gate.waiting) == (0, 0)
        await pool.aclose()
        return {"text": completion.text, "status": raw.status_code, "json": raw.json()}

    def reply(seen: loopback.Seen) -> loopback.Reply:
        return 200, {"content-type": "application/json"}, ANSWER

    with loopback.http_server(reply) as server:
        got = asyncio.run(main(loopback.base_url(server)))
        assert [s.path for s in server.seen] == ["/v1/chat/completions"] * 2
    assert got == {"text": "Hi", "status": 200, "json": json.loads(ANSWER)}


@pytest.mark.parametrize("transport", ["httpx", "aiohttp"])
@pytest.mark.parametrize(
    ("fault", "expected"),
    [("reset", httpx.ReadError), ("silent", httpx.ReadTimeout), ("refused", httpx.ConnectError)],
)
def test_both_transports_name_a_fault_alike(
    transport: str, fault: str, expected: type[httpx.HTTPError]
) -> None:
    async def main(base: str) -> type[BaseException]:
        async with build_async_client(0.3, None, {}, transport=transport) as pool:
            with pytest.raises(httpx.HTTPError) as caught:
                await pool.post(f"{base}/x", json={})
            assert (gate_of(pool).in_use, gate_of(pool).waiting) == (0, 0)
            return type(caught.value)

    if fault == "refused":
        raised = asyncio.run(main(f"http://127.0.0.1:{loopback.closed_port()}"))
    else:
        with loopback.serve(getattr(loopback, fault)) as base:
            raised = asyncio.run(main(base))
    assert raised is expected
