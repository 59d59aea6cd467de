"""The rate-limit budget through LLMClient: a spent budget is waited out, never sent into a 429.

The limiter's own contract (headers, stores, processes) is tests/test_ratelimit.py;
here the budget an answer announces holds the client's next call, in both shells.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import respx

from fluid_build.copilot import LLMClient
from fluid_build.copilot.agents.errors import RateLimitError
from fluid_build.copilot.call.envelope import RetryEvent
from fluid_build.copilot.health.store import MemoryCooldownStore
from tests.fakes import FakeClock, clocked_envelope

URL = "https://api.openai.com/v1/chat/completions"
OK = {
    "choices": [{"message": {"content": "ok"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 5, "completion_tokens": 1},
}
#: OpenAI's headers on an answer that used the last request of the window.
SPENT = {
    "x-ratelimit-limit-requests": "2",
    "x-ratelimit-remaining-requests": "0",
    "x-ratelimit-reset-requests": "4s",
    "x-ratelimit-limit-tokens": "100000",
    "x-ratelimit-remaining-tokens": "99000",
    "x-ratelimit-reset-tokens": "600ms",
}


@pytest.fixture
def mock() -> Iterator[respx.MockRouter]:
    with respx.mock(assert_all_called=False) as router:
        yield router


def client_on(clock: FakeClock, events: list[RetryEvent], **kwargs: Any) -> LLMClient:
    envelope = clocked_envelope(clock, limited=True, hook=events.append)
    return LLMClient("openai", "gpt-4o", api_key="sk-test", envelope=envelope, env={}, **kwargs)


@pytest.mark.parametrize("shell", ["sync", "async"])
def test_a_spent_budget_is_waited_out_instead_of_sent_into_a_429(
    mock: respx.MockRouter, shell: str
) -> None:
    route = mock.post(URL).mock(
        side_effect=[httpx.Response(200, json=OK, headers=SPENT), httpx.Response(200, json=OK)]
    )
    clock = FakeClock()
    events: list[RetryEvent] = []
    client = client_on(clock, events)
    if shell == "sync":
        with client:
            texts = [client.complete("hi").text for _ in range(2)]
    else:

        async def both() -> list[str]:
            async with client:
                return [(await client.acomplete("hi")).text for _ in range(2)]

        texts = asyncio.run(both())
    assert texts == ["ok", "ok"]
    assert route.call_count == 2  # no request went out into the spent window
    assert clock.waits == [pytest.approx(4.0)]
    assert [(e.reason, round(e.wait, 3)) for e in events] == [("rate_limit", 4.0)]


def test_a_reset_past_the_deadline_fails_at_once_without_a_request(
    mock: respx.MockRouter,
) -> None:
    spent_long = {**SPENT, "x-ratelimit-reset-requests": "1m0s"}
    route = mock.post(URL).mock(
        side_effect=[httpx.Response(200, json=OK, headers=spent_long), httpx.Response(200, json=OK)]
    )
    clock = FakeClock()
    with client_on(clock, [], deadline=10.0) as client:
        client.complete("hi")
        with pytest.raises(RateLimitError) as caught:
            client.complete("hi")
    assert caught.value.code == "llm.rate_limited"
    assert route.call_count == 1
    assert clock.waits == []


def test_a_budget_nobody_announced_never_holds_a_call(mock: respx.MockRouter) -> None:
    route = mock.post(URL).respond(200, json=OK)
    clock = FakeClock()
    events: list[RetryEvent] = []
    with client_on(clock, events) as client:
        for _ in range(5):
            client.complete("hi")
    assert route.call_count == 5
    assert clock.waits == []
    assert events == []


def test_a_call_without_an_announced_budget_writes_nothing_to_the_store(
    mock: respx.MockRouter,
) -> None:
    """The usage of an answer (5 + 1 tokens, far from the estimate) settles nothing."""
    mock.post(URL).respond(200, json=OK)
    clock = FakeClock()
    store = MemoryCooldownStore()
    writes: list[str] = []
    for name in ("take", "put", "extend", "incr", "acquire"):
        original = getattr(store, name)

        def spy(*args: Any, _name: str = name, _original: Any = original) -> Any:
            writes.append(_name)
            return _original(*args)

        setattr(store, name, spy)
    envelope = clocked_envelope(clock, store=store, limited=True)
    with LLMClient("openai", "gpt-4o", api_key="sk-test", envelope=envelope, env={}) as client:
        for _ in range(3):
            client.complete("hi")
    assert writes == []
    assert store.entries(clock.now) == []


def test_fluid_forge_says_why_it_waits_for_a_budget() -> None:
    from rich.console import Console

    from fluid_build.cli.forge import _wait_printer

    console = Console(record=True, width=200, color_system=None)
    hook = _wait_printer(console)
    hook(RetryEvent(4.0, "rate_limit", 0, None, "k", "openai", "gpt-4o"))
    shown = console.export_text()
    assert "wait 4.0 s (the provider's announced budget is spent until its reset)" in shown
    assert "cooldown" not in shown
