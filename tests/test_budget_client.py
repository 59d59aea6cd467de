"""A shared USD budget as LLMClient spends it: one reservation per attempt, settled after.

The ledger and its rules are tested in tests/test_budget.py, and the fleet
(8 real processes on sqlite and Redis) there too. Here: what one client call
reserves (the prompt the pre-flight counts plus ``max_output_tokens``, or the
model's maximum output, priced at the entry's own model), that a retry
reserves again, that a refusal sends nothing, and how a stream settles, on
the sync and the async shell.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
import respx

from fluid_build.copilot.agents.errors import AgentExecutionError
from fluid_build.copilot.call.capabilities import capabilities_for
from fluid_build.copilot.call.envelope import RetryEnvelope, RetryPolicy
from fluid_build.copilot.call.prepare import prepare
from fluid_build.copilot.client import LLMClient
from fluid_build.copilot.health.budget import (
    BudgetSpec,
    BudgetState,
    MemoryBudgetLedger,
    Reservation,
    micro_usd,
)
from fluid_build.copilot.health.cooldown import MemoryCooldownStore
from tests.fakes import FakeClock

OPENAI = "https://api.openai.com/v1/chat/completions"
ANTHROPIC = "https://api.anthropic.com/v1/messages"
KEYS = {"OPENAI_API_KEY": "sk-openai-test", "ANTHROPIC_API_KEY": "sk-ant-test"}
#: USD per million tokens, given (over genai-prices') so that the figures are plain.
PRICES = {
    "gpt-4o-mini": {"input": 1.0, "output": 2.0},
    "claude-sonnet-4-6": {"input": 3, "output": 15},
}
#: About 1,000 tokens: the hold covers the 1,000 input tokens the answers below report.
PROMPT = "word " * 1_000


class Spy(MemoryBudgetLedger):
    """The memory ledger, keeping every reservation asked for and every settlement."""

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


def client(
    usd: float = 1.0,
    *fallbacks: str,
    spy: Spy | None = None,
    prices: dict[str, dict[str, float]] = PRICES,
) -> tuple[LLMClient, Spy]:
    clock = FakeClock()
    envelope = RetryEnvelope(
        RetryPolicy(attempts=3),
        cooldown=MemoryCooldownStore(),
        clock=clock,
        sleep=clock.sleep,
        asleep=clock.asleep,
        random=lambda: 0.0,
    )
    env = {**KEYS, "FLUID_BUDGETS": f"team={usd}usd"}
    llm = LLMClient(
        "openai",
        "gpt-4o-mini",
        envelope=envelope,
        env=env,
        prices=prices,
        budget="team",
        fallbacks=list(fallbacks),
    )
    assert llm.budget is not None
    spy = spy or Spy()
    llm.budget.ledger = spy
    for fallback in llm.fallbacks:
        assert fallback.budget is llm.budget
    return llm, spy


def answer(input_tokens: int = 1_000, output_tokens: int = 300) -> httpx.Response:
    return httpx.Response(
        200,
        json={
            "id": "c1",
            "object": "chat.completion",
            "model": "gpt-4o-mini",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "hello"},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": input_tokens, "completion_tokens": output_tokens},
        },
    )


def counted(provider: str, model: str, max_output_tokens: int | None) -> tuple[int, int]:
    """What the pre-flight counts for PROMPT, and the most output the call may take."""
    prepared = prepare(
        provider,
        model,
        [{"role": "user", "content": PROMPT}],
        system=None,
        response_model=None,
        tools=None,
        max_output_tokens=max_output_tokens,
        capability_matrix=None,
        strict_schema=False,
        count=True,
    )
    assert prepared.input_tokens is not None
    assert prepared.input_tokens > 0
    assert prepared.most_output_tokens is not None
    return prepared.input_tokens, prepared.most_output_tokens


def worst(input_tokens: int, output_tokens: int, price: dict[str, float]) -> int:
    return micro_usd((input_tokens * price["input"] + output_tokens * price["output"]) / 1e6)


def call(llm: LLMClient, mode: str, **options: Any) -> Any:
    if mode == "sync":
        return llm.complete(PROMPT, **options)
    return asyncio.run(llm.acomplete(PROMPT, **options))


@pytest.mark.parametrize("mode", ["sync", "async"])
@respx.mock
def test_a_call_reserves_prompt_and_max_output_then_settles_its_price(mode: str) -> None:
    route = respx.post(OPENAI).mock(return_value=answer(1_000, 300))
    llm, spy = client()
    done = call(llm, mode, max_output_tokens=500)
    prompt, most = counted("openai", "gpt-4o-mini", 500)
    assert most == 500
    assert spy.asked == [worst(prompt, 500, PRICES["gpt-4o-mini"])]
    cost = worst(1_000, 300, PRICES["gpt-4o-mini"])  # 0.0016 USD
    assert spy.settled == [cost]
    assert (spy.state().spent, spy.state().reserved) == (cost, 0)
    assert done.cost_usd == pytest.approx(cost / 1e6)
    assert route.call_count == 1


@respx.mock
def test_without_max_output_tokens_the_models_maximum_output_is_reserved() -> None:
    respx.post(OPENAI).mock(return_value=answer())
    llm, spy = client()
    llm.complete(PROMPT)
    prompt, most = counted("openai", "gpt-4o-mini", None)
    assert most == capabilities_for("openai", "gpt-4o-mini").max_output_tokens > 4_096
    assert spy.asked == [worst(prompt, most, PRICES["gpt-4o-mini"])]


@pytest.mark.parametrize("mode", ["sync", "async"])
@respx.mock
def test_each_attempt_reserves_again_and_an_error_answer_spends_nothing(mode: str) -> None:
    route = respx.post(OPENAI).mock(
        side_effect=[httpx.Response(503, json={"error": {"message": "busy"}}), answer()]
    )
    llm, spy = client()
    call(llm, mode, max_output_tokens=500)
    assert route.call_count == 2
    assert len(spy.asked) == 2
    assert spy.asked[0] == spy.asked[1]
    assert spy.settled == [0, worst(1_000, 300, PRICES["gpt-4o-mini"])]
    assert spy.state().reserved == 0


@pytest.mark.parametrize("mode", ["sync", "async"])
@respx.mock
def test_a_call_that_does_not_fit_is_refused_before_any_request(mode: str) -> None:
    route = respx.post(OPENAI).mock(return_value=answer())
    llm, spy = client(usd=0.001)  # the worst case of 500 output tokens alone is 0.001 USD
    with pytest.raises(AgentExecutionError) as caught:
        call(llm, mode, max_output_tokens=500)
    assert caught.value.code == "budget.cost_exhausted"
    assert caught.value.retryable is False
    assert "no request was sent" in caught.value.message
    assert route.call_count == 0
    assert len(spy.asked) == 1  # refused once, never retried
    assert spy.state().spent == 0


@respx.mock
def test_a_model_with_no_price_under_a_budget_is_refused_before_any_request() -> None:
    route = respx.post(OPENAI).mock(return_value=answer())
    clock = FakeClock()
    envelope = RetryEnvelope(RetryPolicy(attempts=1), cooldown=MemoryCooldownStore(), clock=clock)
    llm = LLMClient(
        "openai",
        "my-private-finetune",
        envelope=envelope,
        env={**KEYS, "FLUID_BUDGETS": "team=1usd"},
        budget="team",
    )
    with pytest.raises(AgentExecutionError) as caught:
        llm.complete(PROMPT)
    assert caught.value.code == "budget.cost_unknown"
    assert "FLUID_PRICES" in caught.value.message
    assert route.call_count == 0


@respx.mock
def test_a_fallback_entry_reserves_at_its_own_models_price() -> None:
    respx.post(OPENAI).mock(return_value=httpx.Response(503, json={"error": {"message": "x"}}))
    respx.post(ANTHROPIC).mock(
        return_value=httpx.Response(
            200,
            json={
                "id": "msg_1",
                "model": "claude-sonnet-4-6",
                "content": [{"type": "text", "text": "from claude"}],
                "stop_reason": "end_turn",
                "usage": {"input_tokens": 100, "output_tokens": 20},
            },
        )
    )
    llm, spy = client(1.0, "anthropic:claude-sonnet-4-6")
    done = llm.complete(PROMPT, max_output_tokens=500)
    assert done.answered_by == "anthropic:claude-sonnet-4-6"
    openai_prompt, _ = counted("openai", "gpt-4o-mini", 500)
    claude_prompt, _ = counted("anthropic", "claude-sonnet-4-6", 500)
    openai_worst = worst(openai_prompt, 500, PRICES["gpt-4o-mini"])
    assert spy.asked == [openai_worst] * 3 + [
        worst(claude_prompt, 500, PRICES["claude-sonnet-4-6"])
    ]
    claude_cost = worst(100, 20, PRICES["claude-sonnet-4-6"])
    assert spy.state().spent == claude_cost


CLAUDE_ANSWER = {
    "id": "msg_1",
    "model": "claude-sonnet-4-6",
    "content": [{"type": "text", "text": "from claude"}],
    "stop_reason": "end_turn",
    "usage": {"input_tokens": 100, "output_tokens": 20},
}


@pytest.mark.parametrize("mode", ["sync", "async"])
@respx.mock
def test_a_fallbacks_answer_lists_each_failed_attempt_and_what_it_cost(mode: str) -> None:
    """A 503 spends nothing; a timeout after the request went out may have been billed, so
    its whole hold is spent; the budget is charged for that and the fallback's answer.
    The timeout comes last: one with no byte of an answer hands the call on at once
    (move_on_silence, docs/retry-envelope.md), which would leave no third attempt."""
    down = httpx.Response(503, json={"error": {"message": "down"}})
    primary = respx.post(OPENAI).mock(side_effect=[down, down, httpx.ReadTimeout("slow")])
    respx.post(ANTHROPIC).mock(return_value=httpx.Response(200, json=CLAUDE_ANSWER))
    llm, spy = client(1.0, "anthropic:claude-sonnet-4-6")
    done = call(llm, mode, max_output_tokens=500)
    assert primary.call_count == 3
    assert (done.answered_by, done.provider, done.model) == (
        "anthropic:claude-sonnet-4-6",
        "anthropic",
        "claude-sonnet-4-6",
    )
    assert (done.usage.input_tokens, done.usage.output_tokens) == (100, 20)
    openai_hold = worst(counted("openai", "gpt-4o-mini", 500)[0], 500, PRICES["gpt-4o-mini"])
    claude_cost = worst(100, 20, PRICES["claude-sonnet-4-6"])
    assert [
        (e["entry"], e["attempt"], e["error"], e["code"], e["sent"], e["cost_usd"])
        for e in done.fallback_errors
    ] == [
        ("openai:gpt-4o-mini", 1, "ProviderServerError", "llm.server_error", True, 0.0),
        ("openai:gpt-4o-mini", 2, "ProviderServerError", "llm.server_error", True, 0.0),
        ("openai:gpt-4o-mini", 3, "ProviderTimeoutError", "llm.timeout", True, openai_hold / 1e6),
    ]
    assert spy.state().spent == claude_cost + openai_hold
    assert spy.state().reserved == 0
    assert done.cost_usd == pytest.approx(claude_cost / 1e6)
    # What the answer says the call cost is what the budget was charged.
    listed = sum(e["cost_usd"] for e in done.fallback_errors) + done.cost_usd
    assert micro_usd(listed) == spy.state().spent


@respx.mock
def test_without_a_budget_an_attempt_that_may_have_been_billed_costs_an_unknown_amount() -> None:
    down = httpx.Response(503, json={"error": {"message": "down"}})
    respx.post(OPENAI).mock(side_effect=[down, httpx.ReadTimeout("slow")])
    respx.post(ANTHROPIC).mock(return_value=httpx.Response(200, json=CLAUDE_ANSWER))
    clock = FakeClock()
    llm = LLMClient(
        "openai",
        "gpt-4o-mini",
        envelope=RetryEnvelope(
            RetryPolicy(attempts=2),
            cooldown=MemoryCooldownStore(),
            clock=clock,
            sleep=clock.sleep,
            asleep=clock.asleep,
            random=lambda: 0.0,
        ),
        env=KEYS,
        prices=PRICES,
        fallbacks=["anthropic:claude-sonnet-4-6"],
    )
    done = llm.complete(PROMPT)
    assert [(e["code"], e["cost_usd"]) for e in done.fallback_errors] == [
        ("llm.server_error", 0.0),
        ("llm.timeout", None),
    ]


def test_on_real_sockets_a_silent_primarys_hold_and_the_fallbacks_answer_are_charged() -> None:
    """Loopback: the primary answers 503, then reads the next request and never answers
    (its 0.3 s read timeout ends it); the fallback, another server with its own key,
    answers. The budget spends the timed-out attempt's hold and the answer's price."""
    import socket

    from fluid_build import Fallback
    from tests import loopback

    seen: list[int] = []
    window = {"context_window": 128_000}

    def primary(conn: socket.socket) -> None:
        seen.append(len(seen) + 1)
        if len(seen) == 1:
            loopback.respond(503, b'{"error": {"message": "down"}}')(conn)
        else:
            loopback.silent(conn)

    body = {
        "choices": [{"message": {"content": "backup here"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 100, "completion_tokens": 20},
    }
    ok = (200, {"content-type": "application/json"}, json.dumps(body).encode())
    prices = {"main": {"input": 1.0, "output": 2.0}, "backup": {"input": 3.0, "output": 15.0}}
    clock = FakeClock()
    envelope = RetryEnvelope(
        RetryPolicy(attempts=2),
        cooldown=MemoryCooldownStore(),
        clock=clock,
        sleep=clock.sleep,
        asleep=clock.asleep,
        random=lambda: 0.0,
    )
    spy = Spy()
    with loopback.serve(primary) as first, loopback.http_server(lambda s: ok) as second:
        llm = LLMClient(
            "openai_compatible",
            "main",
            api_key="key-a",
            base_url=first + "/v1",
            timeout=0.3,
            capability_matrix=window,  # no probe of the servers' own window
            envelope=envelope,
            env={"FLUID_BUDGETS": "team=1usd"},
            prices=prices,
            budget="team",
            fallbacks=[
                Fallback(
                    "openai_compatible",
                    "backup",
                    base_url=loopback.base_url(second) + "/v1",
                    api_key="key-b",
                    options={"capability_matrix": window},
                )
            ],
        )
        assert llm.budget is not None
        llm.budget.ledger = spy
        with llm:
            done = llm.complete(PROMPT, max_output_tokens=500)
    assert seen == [1, 2]
    assert done.text == "backup here"
    assert second.seen[0].headers["authorization"] == "Bearer key-b"
    hold = spy.asked[1]
    assert spy.asked[0] == hold  # each attempt on the primary reserved its worst case
    assert [(e["attempt"], e["code"], e["cost_usd"]) for e in done.fallback_errors] == [
        (1, "llm.server_error", 0.0),
        (2, "llm.timeout", hold / 1e6),
    ]
    answer_cost = worst(100, 20, prices["backup"])
    assert spy.state().spent == hold + answer_cost
    assert micro_usd(done.cost_usd or 0.0) == answer_cost


def chunks(*events: dict[str, Any]) -> bytes:
    return "".join(f"data: {json.dumps(e)}\n\n" for e in events).encode()


def text_chunk(text: str) -> dict[str, Any]:
    return {
        "id": "c1",
        "model": "gpt-4o-mini",
        "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}],
    }


WHOLE_STREAM = (
    chunks(
        text_chunk("hel"),
        text_chunk("lo"),
        {
            "id": "c1",
            "model": "gpt-4o-mini",
            "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
        },
        {
            "id": "c1",
            "model": "gpt-4o-mini",
            "choices": [],
            "usage": {"prompt_tokens": 1_000, "completion_tokens": 300},
        },
    )
    + b"data: [DONE]\n\n"
)
# Text, then the connection ends with no usage and no [DONE].
CUT_STREAM = chunks(text_chunk("hel"))


def streamed(body: bytes) -> httpx.Response:
    return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})


def stream(llm: LLMClient, mode: str) -> list[Any]:
    async def collect() -> list[Any]:
        return [event async for event in llm.astream(PROMPT, max_output_tokens=500)]

    if mode == "sync":
        return list(llm.stream(PROMPT, max_output_tokens=500))
    return asyncio.run(collect())


@pytest.mark.parametrize("mode", ["sync", "async"])
@respx.mock
def test_a_whole_stream_settles_what_its_usage_says(mode: str) -> None:
    respx.post(OPENAI).mock(return_value=streamed(WHOLE_STREAM))
    llm, spy = client()
    events = stream(llm, mode)
    cost = worst(1_000, 300, PRICES["gpt-4o-mini"])
    assert events[-1].type == "done"
    assert events[-1].completion.cost_usd == pytest.approx(cost / 1e6)
    assert spy.settled == [cost]
    assert (spy.state().spent, spy.state().reserved) == (cost, 0)


@pytest.mark.parametrize("mode", ["sync", "async"])
@respx.mock
def test_a_broken_stream_without_usage_spends_its_whole_reservation(mode: str) -> None:
    respx.post(OPENAI).mock(return_value=streamed(CUT_STREAM))
    llm, spy = client()
    with pytest.raises(AgentExecutionError) as caught:
        stream(llm, mode)
    assert caught.value.code == "llm.network_error"
    (held,) = spy.asked
    assert spy.settled == [held]  # the text was billed, and nothing said how much
    assert (spy.state().spent, spy.state().reserved) == (held, 0)


@pytest.mark.parametrize("mode", ["sync", "async"])
@respx.mock
def test_a_restarted_stream_settles_the_cut_attempts_hold_and_the_answers_usage(
    mode: str,
) -> None:
    # Issue 33 item 4: the cut attempt settles as any broken stream does; the restart is
    # a new attempt with its own reservation, settled at what its usage says.
    respx.post(OPENAI).mock(side_effect=[streamed(CUT_STREAM), streamed(WHOLE_STREAM)])
    llm, spy = client()
    llm.on_cut = "restart"
    events = stream(llm, mode)
    assert [e.type for e in events].count("restart") == 1
    assert events[-1].completion.text == "hello"
    cut_hold, _ = spy.asked
    cost = worst(1_000, 300, PRICES["gpt-4o-mini"])
    assert spy.settled == [cut_hold, cost]
    assert (spy.state().spent, spy.state().reserved) == (cut_hold + cost, 0)


@pytest.mark.parametrize("mode", ["sync", "async"])
@respx.mock
def test_a_restarted_streams_answer_lists_each_failed_attempt_at_what_the_budget_settled(
    mode: str,
) -> None:
    # Issue 33 item 7: a stream's fallback_errors are complete()'s records: the 503 cost
    # nothing, the cut attempt its whole hold (no usage came); with the answer's cost,
    # what the budget was charged.
    down = httpx.Response(503, json={"error": {"message": "down"}})
    respx.post(OPENAI).mock(side_effect=[down, streamed(CUT_STREAM), streamed(WHOLE_STREAM)])
    llm, spy = client()
    llm.on_cut = "restart"
    done = stream(llm, mode)[-1].completion
    _, cut_hold, _ = spy.asked
    assert [
        (e["entry"], e["attempt"], e["error"], e["code"], e["sent"], e["cost_usd"])
        for e in done.fallback_errors
    ] == [
        ("openai:gpt-4o-mini", 1, "ProviderServerError", "llm.server_error", True, 0.0),
        ("openai:gpt-4o-mini", 2, "ProviderError", "llm.network_error", True, cut_hold / 1e6),
    ]
    listed = sum(e["cost_usd"] for e in done.fallback_errors) + done.cost_usd
    assert micro_usd(listed) == spy.state().spent


@respx.mock
def test_a_stream_left_unread_still_settles_when_closed() -> None:
    respx.post(OPENAI).mock(return_value=streamed(WHOLE_STREAM))
    llm, spy = client()
    events = llm.stream(PROMPT, max_output_tokens=500)
    assert next(iter(events)).type == "text"
    events.close()  # type: ignore[attr-defined]
    (held,) = spy.asked
    assert spy.settled == [held]
    assert spy.state().reserved == 0


@respx.mock
def test_a_client_without_a_budget_counts_nothing_and_reserves_nothing() -> None:
    respx.post(OPENAI).mock(return_value=answer())
    llm = LLMClient("openai", "gpt-4o-mini", env=KEYS, prices=PRICES)
    assert llm.budget is None
    done = llm.complete(PROMPT)
    assert done.cost_usd == pytest.approx(0.0016)


@respx.mock
def test_clients_sharing_one_envelope_keep_their_own_budgets() -> None:
    respx.post(OPENAI).mock(return_value=answer())
    llm, spy = client()
    other = LLMClient("openai", "gpt-4o-mini", envelope=llm.envelope, env=KEYS, prices=PRICES)
    assert other.budget is None
    other.complete(PROMPT)
    assert spy.asked == []  # the client without a budget spent nothing from the other's
    llm.complete(PROMPT, max_output_tokens=500)
    assert len(spy.asked) == 1


# -- whatever the provider answers, spend stays within the hold (issue 32 items 1 and 3) ----


@pytest.mark.parametrize("mode", ["sync", "async"])
@respx.mock
def test_without_max_output_tokens_the_request_carries_the_cap_it_reserved(mode: str) -> None:
    openai = respx.post(OPENAI).mock(return_value=answer())
    llm, spy = client()
    call(llm, mode)
    prompt, most = counted("openai", "gpt-4o-mini", None)
    assert spy.asked == [worst(prompt, most, PRICES["gpt-4o-mini"])]
    assert json.loads(openai.calls.last.request.content)["max_completion_tokens"] == most


@respx.mock
def test_every_provider_field_carries_the_reserved_cap() -> None:
    route = respx.post(ANTHROPIC).mock(
        return_value=httpx.Response(
            200,
            json={
                "id": "msg_1",
                "model": "claude-sonnet-4-6",
                "content": [{"type": "text", "text": "hi"}],
                "stop_reason": "end_turn",
                "usage": {"input_tokens": 10, "output_tokens": 2},
            },
        )
    )
    llm = LLMClient(
        "anthropic",
        "claude-sonnet-4-6",
        envelope=RetryEnvelope(RetryPolicy(attempts=1), cooldown=MemoryCooldownStore()),
        env={**KEYS, "FLUID_BUDGETS": "team=5usd"},
        prices=PRICES,
        budget="team",
    )
    llm.complete(PROMPT)
    most = capabilities_for("anthropic", "claude-sonnet-4-6").max_output_tokens
    assert json.loads(route.calls.last.request.content)["max_tokens"] == most
    # Without a budget the request is as the caller made it: no cap fluid chose.
    plain = LLMClient("openai", "gpt-4o-mini", env=KEYS, prices=PRICES)
    openai = respx.post(OPENAI).mock(return_value=answer())
    plain.complete(PROMPT)
    assert "max_completion_tokens" not in json.loads(openai.calls.last.request.content)


@pytest.mark.parametrize(
    ("usage", "why"),
    [
        ({"prompt_tokens": 1_000, "completion_tokens": 30_000}, "past the cap"),
        ({"prompt_tokens": 1_000, "completion_tokens": 10**18}, "absurd output"),
        ({"prompt_tokens": 10**22, "completion_tokens": 10}, "absurd input"),
        ({"prompt_tokens": 10**400, "completion_tokens": 10}, "no float"),
        ({"prompt_tokens": 2_000_000, "completion_tokens": 10}, "dearer than the hold"),
    ],
)
@respx.mock
def test_spend_never_passes_the_hold_whatever_the_usage_says(
    usage: dict[str, int], why: str, caplog: pytest.LogCaptureFixture
) -> None:
    body = answer().json()
    body["usage"] = usage
    respx.post(OPENAI).mock(return_value=httpx.Response(200, content=json.dumps(body).encode()))
    llm, spy = client()
    done = llm.complete(PROMPT, max_output_tokens=100)
    (hold,) = spy.asked
    assert spy.settled == [hold], why
    assert (spy.state().spent, spy.state().reserved) == (hold, 0)
    if why == "dearer than the hold":  # a real cost, above the hold: both figures logged
        assert done.cost_usd == pytest.approx(2.00002)
        assert "2.00002 USD, more than the" in caplog.text
        assert f"{hold / 1e6:g} USD reserved" in caplog.text
    elif why != "past the cap":
        assert done.cost_usd is None


def test_a_fleet_of_threads_with_no_cap_given_never_overspends() -> None:
    """The issue's 8 threads on 0.05 USD, a server answering 30,000 output tokens."""
    from concurrent.futures import ThreadPoolExecutor

    with respx.mock:
        respx.post(OPENAI).mock(return_value=answer(1_000, 30_000))
        llm, spy = client(usd=0.05)
        with ThreadPoolExecutor(8) as pool:
            outcomes = list(pool.map(lambda _: _outcome(llm), range(8)))
    assert "ok" in outcomes
    assert set(outcomes) <= {"ok", "budget.cost_exhausted"}
    assert spy.state().spent <= micro_usd(0.05)


def _outcome(llm: LLMClient) -> str:
    try:
        llm.complete(PROMPT)
    except AgentExecutionError as error:
        return error.code
    return "ok"


@pytest.mark.parametrize("mode", ["sync", "async"])
@respx.mock
def test_an_attempt_that_sent_nothing_spends_nothing(mode: str) -> None:
    """Issue 32 item 7: a hold granted after the deadline passed (a store that took that
    long) was spent whole by an attempt that then sent nothing."""
    route = respx.post(OPENAI).mock(return_value=answer())
    llm, _ = client()
    clock = llm.envelope.clock

    class Slow(Spy):
        def reserve(
            self, spec: BudgetSpec, amount: int, hold: str, expires: float, now: float
        ) -> Reservation:
            granted = super().reserve(spec, amount, hold, expires, now)
            clock.sleep(llm.deadline + 1)  # type: ignore[attr-defined]
            return granted

    slow = Slow()
    assert llm.budget is not None
    llm.budget.ledger = slow
    with pytest.raises(AgentExecutionError) as caught:
        call(llm, mode, max_output_tokens=500)
    assert caught.value.code == "llm.deadline_exceeded"
    assert route.call_count == 0
    assert slow.settled == [0]
    assert (slow.state().spent, slow.state().reserved) == (0, 0)


@respx.mock
def test_the_cap_a_budget_sends_leaves_room_for_the_prompt_in_the_window() -> None:
    """A server such as vLLM refuses a prompt plus a cap past its context: the cap sent
    (and reserved) is what the window leaves after the prompt, when that is less."""
    route = respx.post("http://127.0.0.1:8000/v1/chat/completions").mock(
        return_value=answer(1_000, 10)
    )
    llm = LLMClient(
        "openai_compatible",
        "m",
        base_url="http://127.0.0.1:8000/v1",
        envelope=RetryEnvelope(RetryPolicy(attempts=1), cooldown=MemoryCooldownStore()),
        env={"FLUID_BUDGETS": "team=1usd"},
        prices={"m": {"input": 1.0, "output": 2.0}},
        budget="team",
        capability_matrix={"context_window": 2_048, "max_output_tokens": 4_096},
    )
    spy = Spy()
    assert llm.budget is not None
    llm.budget.ledger = spy
    llm.complete(PROMPT)
    sent = json.loads(route.calls.last.request.content)["max_tokens"]
    prompt = 2_048 - sent
    assert 1_000 <= prompt < 1_400  # PROMPT as the pre-flight counts it (an estimate, high)
    assert spy.asked == [micro_usd((prompt * 1.0 + sent * 2.0) / 1e6)]
