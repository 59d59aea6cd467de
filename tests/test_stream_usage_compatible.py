"""Streams from OpenAI-compatible servers ask for their usage (issue 35 item 5).

fluid_build sends ``stream_options: {"include_usage": true}`` to every
compatible preset and server, so that a streamed answer is priced and settles
a budget at what it used. A server that refuses the field (a 400 naming it:
vLLM before 0.5 answered ``extra_forbidden`` at ``('body', 'stream_options')``,
issue modelscope/ms-agent#489; Fireworks "Extra inputs are not permitted,
field: 'stream_options'", issue FlowiseAI/Flowise#2866) is asked again at once
without it, within the same attempt, and its client remembers: the next
stream goes without it. Real loopback servers, both shells.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest

from fluid_build.copilot.agents.errors import AgentExecutionError
from fluid_build.copilot.call.envelope import RetryEnvelope, RetryPolicy
from fluid_build.copilot.client import LLMClient
from fluid_build.copilot.health.budget import (
    BudgetSpec,
    BudgetState,
    MemoryBudgetLedger,
    Reservation,
    micro_usd,
)
from fluid_build.copilot.health.cooldown import MemoryCooldownStore
from fluid_build.copilot.llm.openai import Endpoints
from fluid_build.copilot.llm.types import StreamEvent
from tests.fakes import FakeClock
from tests.loopback import Reply, Seen, base_url, http_server

MODEL = "qwen-test"
#: USD per million tokens, so that the stream is priced (a local model has no price).
PRICES = {MODEL: {"input": 1.0, "output": 2.0}}
USAGE = {"prompt_tokens": 12, "completion_tokens": 300, "total_tokens": 312}
COST = (12 * 1.0 + 300 * 2.0) / 1e6
#: vLLM 0.4's answer to a field its request model forbids (modelscope/ms-agent#489, verbatim).
VLLM_REFUSAL = {
    "object": "error",
    "message": "[{'type': 'extra_forbidden', 'loc': ('body', 'stream_options'), "
    "'msg': 'Extra inputs are not permitted', 'input': {}}]",
    "type": "BadRequestError",
    "param": None,
    "code": 400,
}
#: An OpenAI-style upstream that has no such parameter (QuantumNous/new-api#418, verbatim
#: but for its request ids).
UNKNOWN_PARAMETER = {
    "error": {
        "message": "Unknown parameter: 'stream_options'.",
        "type": "invalid_request_error",
        "param": "stream_options",
        "code": "unknown_parameter",
    }
}
#: FastAPI's 422 for the same, as a pydantic-validated server answers it.
FASTAPI_REFUSAL = {
    "detail": [
        {
            "type": "extra_forbidden",
            "loc": ["body", "stream_options"],
            "msg": "Extra inputs are not permitted",
            "input": {"include_usage": True},
        }
    ]
}
#: Fireworks' wording (FlowiseAI/Flowise#2866).
FIREWORKS_REFUSAL = {
    "error": {
        "object": "error",
        "type": "invalid_request_error",
        "message": "Extra inputs are not permitted, field: 'stream_options'",
    }
}


def sse(*, usage: bool) -> bytes:
    """A whole answer, "hello", and (when ``usage``) the usage chunk after the finish."""
    chunks: list[dict[str, Any]] = [
        {"model": MODEL, "choices": [{"index": 0, "delta": {"content": "hel"}}]},
        {"model": MODEL, "choices": [{"index": 0, "delta": {"content": "lo"}}]},
        {"model": MODEL, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    ]
    if usage:
        chunks.append({"model": MODEL, "choices": [], "usage": USAGE})
    lines = [f"data: {json.dumps(chunk)}\n\n" for chunk in chunks]
    return ("".join(lines) + "data: [DONE]\n\n").encode()


def body_of(seen: Seen) -> dict[str, Any]:
    data = json.loads(seen.body)
    assert isinstance(data, dict)
    return data


def answered(seen: Seen, *, usage: bool) -> Reply:
    return 200, {"content-type": "text/event-stream"}, sse(usage=usage)


def accepting(seen: Seen) -> Reply:
    """A current server: the usage chunk only when asked for (vLLM, OpenAI)."""
    asked = body_of(seen).get("stream_options", {}).get("include_usage") is True
    return answered(seen, usage=asked)


def refusing(refusal: dict[str, Any], status: int = 400) -> Callable[[Seen], Reply]:
    """An older server: refuses the field, and reports usage on its own in the last chunk
    (as llama.cpp's server does), so that the answer asked without it is priced too."""

    def reply(seen: Seen) -> Reply:
        if "stream_options" in body_of(seen):
            return status, {"content-type": "application/json"}, json.dumps(refusal).encode()
        return answered(seen, usage=True)

    return reply


class Spy(MemoryBudgetLedger):
    """The memory ledger, keeping each reservation and settlement."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[int] = []
        self.settled: list[int] = []

    def reserve(
        self, spec: BudgetSpec, amount: int, hold: str, expires: float, now: float
    ) -> Reservation:
        self.asked.append(amount)
        return super().reserve(spec, amount, hold, expires, now)

    def settle(self, name: str, hold: str, amount: int, now: float) -> None:
        self.settled.append(amount)
        super().settle(name, hold, amount, now)

    def state(self) -> BudgetState:
        (state,) = self.states(0.0)
        return state


def client(url: str, provider: str = "vllm", *, budget: bool = False) -> LLMClient:
    clock = FakeClock()
    envelope = RetryEnvelope(
        RetryPolicy(attempts=3),
        cooldown=MemoryCooldownStore(),
        clock=clock,
        sleep=clock.sleep,
        asleep=clock.asleep,
        random=lambda: 0.0,
        hook=lambda event: None,
    )
    env = {"FLUID_BUDGETS": "team=1usd"} if budget else {}
    return LLMClient(
        provider,
        MODEL,
        base_url=f"{url}/v1",
        api_key="sk-local",
        envelope=envelope,
        env=env,
        prices=PRICES,
        budget="team" if budget else None,
        capability_matrix={"context_window": 32_768},
    )


def streams(llm: LLMClient, mode: str, *calls: dict[str, Any]) -> list[list[StreamEvent]]:
    """Each call's events, one stream after another on ``llm`` (closed after), either shell."""
    if mode == "sync":
        with llm:
            return [list(llm.stream("hi", max_output_tokens=400, **call)) for call in calls]

    async def go() -> list[list[StreamEvent]]:
        async with llm:
            return [
                [e async for e in llm.astream("hi", max_output_tokens=400, **call)]
                for call in calls
            ]

    return asyncio.run(go())


def stream(llm: LLMClient, mode: str, **options: Any) -> list[StreamEvent]:
    """One stream on ``llm``, closed after."""
    [events] = streams(llm, mode, options)
    return events


def done(events: list[StreamEvent]) -> Any:
    assert events[-1].type == "done"
    completion = events[-1].completion
    assert completion is not None
    assert completion.text == "hello"
    return completion


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize(
    "provider", ["vllm", "llamacpp", "openai_compatible", "groq", "mistral", "openrouter"]
)
def test_every_compatible_preset_asks_for_the_usage_and_prices_the_stream(
    provider: str, mode: str
) -> None:
    with http_server(accepting) as server:
        completion = done(stream(client(base_url(server), provider), mode))
    [seen] = server.seen
    assert body_of(seen)["stream_options"] == {"include_usage": True}
    assert (completion.usage.input_tokens, completion.usage.output_tokens) == (12, 300)
    assert completion.cost_usd == pytest.approx(COST)
    assert completion.attempts == 1


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize(
    ("refusal", "status"),
    [
        (VLLM_REFUSAL, 400),
        (FIREWORKS_REFUSAL, 400),
        (UNKNOWN_PARAMETER, 400),
        (FASTAPI_REFUSAL, 422),
    ],
    ids=["vllm-extra-forbidden", "fireworks", "unknown-parameter", "fastapi-422"],
)
def test_a_server_refusing_stream_options_is_asked_again_without_it_once_per_client(
    mode: str, refusal: dict[str, Any], status: int
) -> None:
    with http_server(refusing(refusal, status)) as server:
        first, second = (done(events) for events in streams(client(base_url(server)), mode, {}, {}))
    sent = [body_of(seen) for seen in server.seen]
    # The first call: refused, then asked again at once; the second sends no stream_options.
    assert ["stream_options" in body for body in sent] == [True, False, False]
    for completion in (first, second):
        assert completion.attempts == 1  # the field's refusal is no failed attempt
        assert completion.usage.output_tokens == 300
        assert completion.cost_usd == pytest.approx(COST)
        assert completion.fallback_errors == []


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_the_budget_settles_at_the_usage_of_the_stream_asked_again(mode: str) -> None:
    with http_server(refusing(VLLM_REFUSAL)) as server:
        llm = client(base_url(server), budget=True)
        assert llm.budget is not None
        spy = Spy()
        llm.budget.ledger = spy
        completion = done(stream(llm, mode))
    assert len(server.seen) == 2
    [held] = spy.asked  # one reservation: the refusal and the answer are one attempt
    assert held > micro_usd(COST)
    assert spy.settled == [micro_usd(COST)]
    assert (spy.state().spent, spy.state().reserved) == (micro_usd(COST), 0)
    assert completion.cost_usd == pytest.approx(COST)


def test_a_new_client_asks_again() -> None:
    with http_server(refusing(VLLM_REFUSAL)) as server:
        for _ in range(2):
            done(stream(client(base_url(server)), "sync"))
    assert ["stream_options" in body_of(seen) for seen in server.seen] == [
        True,
        False,
        True,
        False,
    ]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_400_that_does_not_name_stream_options_is_an_invalid_request_sent_once(
    mode: str,
) -> None:
    refusal = {"error": {"message": "Unsupported value: 'temperature'", "type": "BadRequestError"}}

    def reply(seen: Seen) -> Reply:
        return 400, {"content-type": "application/json"}, json.dumps(refusal).encode()

    with http_server(reply) as server, pytest.raises(AgentExecutionError) as caught:
        stream(client(base_url(server)), mode)
    assert (caught.value.code, caught.value.retryable) == ("llm.invalid_request", False)
    assert len(server.seen) == 1
    assert "stream_options" in body_of(server.seen[0])


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_server_refusing_it_again_without_it_is_an_invalid_request(mode: str) -> None:
    # The second 400 is a real one: raised as it is, after the two requests of one attempt.
    def reply(seen: Seen) -> Reply:
        return 400, {"content-type": "application/json"}, json.dumps(VLLM_REFUSAL).encode()

    with http_server(reply) as server, pytest.raises(AgentExecutionError) as caught:
        stream(client(base_url(server)), mode)
    assert (caught.value.code, caught.value.retryable) == ("llm.invalid_request", False)
    assert ["stream_options" in body_of(seen) for seen in server.seen] == [True, False]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_the_callers_own_stream_options_are_never_dropped(mode: str) -> None:
    # extra_body's stream_options is the caller's (it wins over fluid's): a refusal of it is
    # the caller's 400, raised after one request, and the next plain stream still asks.
    with http_server(refusing(VLLM_REFUSAL)) as server:
        llm = client(base_url(server))
        with pytest.raises(AgentExecutionError) as caught:
            stream(llm, mode, extra_body={"stream_options": {"include_usage": False}})
    assert caught.value.code == "llm.invalid_request"
    [seen] = server.seen
    assert body_of(seen)["stream_options"] == {"include_usage": False}
    assert len(llm.adapter.without_stream_options) == 0  # type: ignore[attr-defined]


def test_the_callers_stream_options_go_to_a_server_that_refused_fluids() -> None:
    with http_server(accepting) as server:
        llm = client(base_url(server))
        llm.adapter.without_stream_options.add(llm.adapter.url())  # type: ignore[attr-defined]
        asked = {"extra_body": {"stream_options": {"include_usage": True}}}
        for events in streams(llm, "sync", {}, asked):
            done(events)
    plain, asked = (body_of(seen) for seen in server.seen)
    assert "stream_options" not in plain
    assert asked["stream_options"] == {"include_usage": True}


def test_the_endpoints_remembered_are_capped_oldest_first() -> None:
    remembered = Endpoints(cap=3)
    for n in range(5):
        remembered.add(f"http://127.0.0.1:{8000 + n}/v1/chat/completions")
    assert len(remembered) == 3
    assert "http://127.0.0.1:8000/v1/chat/completions" not in remembered
    assert "http://127.0.0.1:8004/v1/chat/completions" in remembered
