"""The agent loop's ``max_cost_usd`` stops the run BEFORE the call that could cross it.

Each model call first reserves its worst case (the prompt it will send,
counted as the pre-flight counts it, priced, plus ``max_output_tokens`` or
the model's maximum output, priced: call/prices.worst_case_usd); when what
is spent plus that would pass the limit, the run stops with
``budget.cost_exhausted`` and no request is sent. Answers are scripted with
respx; prices are genai-prices' own, or given with ``prices=``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import respx

from fluid_build.copilot import LLMClient
from fluid_build.copilot.agents.errors import AgentExecutionError
from fluid_build.copilot.health.budget import usd_amount
from fluid_build.copilot.loop.agent import AgentLoop, Budget, LoopSettings
from fluid_build.copilot.loop.tools import forge_tool
from tests.fakes import FakeClock, clocked_envelope

URL = "https://api.openai.com/v1/chat/completions"
KEY = "sk-proj-LOOPCOST0123456789abcdef"


@forge_tool(read_only=True)
def count_rows(table: str) -> int:
    """Count the rows of a table."""
    return {"sales": 42}.get(table, 0)


def tool_turn(model: str, input_tokens: int, output_tokens: int) -> httpx.Response:
    """An answer asking for one more tool call: a run that would go on for ever."""
    call = {
        "id": "call_0",
        "type": "function",
        "function": {"name": "count_rows", "arguments": json.dumps({"table": "sales"})},
    }
    return httpx.Response(
        200,
        json={
            "model": model,
            "choices": [
                {
                    "message": {"role": "assistant", "content": None, "tool_calls": [call]},
                    "finish_reason": "tool_calls",
                }
            ],
            "usage": {"prompt_tokens": input_tokens, "completion_tokens": output_tokens},
        },
    )


@pytest.fixture
def mock() -> Iterator[respx.MockRouter]:
    with respx.mock(assert_all_called=False) as router:
        yield router


def client(model: str, **kwargs: Any) -> LLMClient:
    # The key in env: fallbacks read theirs from it too.
    env = {"OPENAI_API_KEY": KEY}
    return LLMClient("openai", model, envelope=clocked_envelope(FakeClock()), env=env, **kwargs)


def listed(model: str) -> tuple[float, float]:
    """genai-prices' own (input, output) USD per token for an OpenAI model."""
    from genai_prices import data_snapshot

    _, info = data_snapshot.get_snapshot().find_provider_model(model, None, "openai", None)
    price = info.get_prices(datetime.now(tz=UTC))
    return float(price.input_mtok) / 1e6, float(price.output_mtok) / 1e6


def run_until_stopped(agent: AgentLoop) -> AgentExecutionError:
    with pytest.raises(AgentExecutionError) as caught:
        agent.run("count the sales rows, again and again")
    return caught.value


# Each answer says it read far more than the prompt holds, so one answer costs
# more than the next call's worst case; a limit of two answers plus a little
# then leaves room for neither a third answer nor a third call's worst case.
BILLED_IN, BILLED_OUT, MAX_OUT = 2_000, 100, 100


def test_the_third_call_that_could_cross_the_limit_is_never_sent(
    mock: respx.MockRouter, tmp_path: Path
) -> None:
    rate_in, rate_out = listed("gpt-4o-mini")
    per_answer = BILLED_IN * rate_in + BILLED_OUT * rate_out
    limit = 2 * per_answer + 0.5 * MAX_OUT * rate_out
    route = mock.post(URL)
    route.side_effect = [tool_turn("gpt-4o-mini", BILLED_IN, BILLED_OUT) for _ in range(10)]
    agent = AgentLoop(
        client("gpt-4o-mini"),
        tools=[count_rows],
        workspace=tmp_path,
        settings=LoopSettings(),
        budget=Budget(max_cost_usd=limit),
        max_output_tokens=MAX_OUT,
    )
    error = run_until_stopped(agent)
    assert error.code == "budget.cost_exhausted"
    assert route.call_count == 2
    usage = agent.result.usage
    assert usage.llm_calls == 2
    assert usage.cost_usd == pytest.approx(2 * per_answer)
    assert usage.cost_usd is not None
    assert usage.cost_usd <= limit
    details = error.details
    assert details["spent_usd"] == pytest.approx(2 * per_answer)
    assert details["left_usd"] == pytest.approx(limit - 2 * per_answer)
    # The worst case: MAX_OUT output tokens plus the prompt it would send, priced.
    assert details["needed_usd"] > MAX_OUT * rate_out
    assert details["needed_usd"] < MAX_OUT * rate_out + 1_000 * rate_in
    assert details["max_output_tokens"] == MAX_OUT
    assert details["input_tokens"] > 0
    message = str(error)
    assert "no request was sent" in message
    assert f"{usd_amount(2 * per_answer)} USD spent" in message
    assert f"{usd_amount(limit - 2 * per_answer)} USD left" in message


def test_a_worst_case_over_the_limit_stops_before_the_first_request(
    mock: respx.MockRouter, tmp_path: Path
) -> None:
    _, rate_out = listed("gpt-4o-mini")
    route = mock.post(URL)
    route.side_effect = [tool_turn("gpt-4o-mini", 10, 10) for _ in range(10)]
    agent = AgentLoop(
        client("gpt-4o-mini"),
        tools=[count_rows],
        workspace=tmp_path,
        settings=LoopSettings(),
        # One answer of 10 + 10 tokens would cost far less, but it MAY write 100,000.
        budget=Budget(max_cost_usd=0.01),
        max_output_tokens=100_000,
    )
    error = run_until_stopped(agent)
    assert error.code == "budget.cost_exhausted"
    assert route.call_count == 0
    assert agent.result.usage.llm_calls == 0
    assert error.details["needed_usd"] >= 100_000 * rate_out
    assert error.details["spent_usd"] == 0


def test_without_max_output_tokens_the_models_maximum_output_is_reserved(
    mock: respx.MockRouter, tmp_path: Path
) -> None:
    from fluid_build.copilot.call.capabilities import capabilities_for

    _, rate_out = listed("gpt-4o-mini")
    most = capabilities_for("openai", "gpt-4o-mini").max_output_tokens
    route = mock.post(URL)
    route.side_effect = [tool_turn("gpt-4o-mini", 10, 10) for _ in range(10)]
    agent = AgentLoop(
        client("gpt-4o-mini"),
        tools=[count_rows],
        workspace=tmp_path,
        settings=LoopSettings(),
        budget=Budget(max_cost_usd=0.5 * most * rate_out),
    )
    error = run_until_stopped(agent)
    assert error.code == "budget.cost_exhausted"
    assert route.call_count == 0
    assert error.details["max_output_tokens"] == most


def test_prices_given_to_the_loop_price_the_reservation(
    mock: respx.MockRouter, tmp_path: Path
) -> None:
    # A private model genai-prices does not know: priced only by prices=, in both shapes.
    for prices in (
        {"my-private-model": {"input": 100.0, "output": 400.0}},
        {"my-private-model": (100.0, 400.0)},
    ):
        rate_in, rate_out = 100.0 / 1e6, 400.0 / 1e6
        per_answer = BILLED_IN * rate_in + BILLED_OUT * rate_out
        limit = 2 * per_answer + 0.5 * MAX_OUT * rate_out
        route = mock.post(URL)
        route.side_effect = [
            tool_turn("my-private-model", BILLED_IN, BILLED_OUT) for _ in range(10)
        ]
        agent = AgentLoop(
            client("my-private-model"),
            tools=[count_rows],
            workspace=tmp_path,
            settings=LoopSettings(),
            budget=Budget(max_cost_usd=limit),
            prices=prices,
            max_output_tokens=MAX_OUT,
        )
        error = run_until_stopped(agent)
        assert error.code == "budget.cost_exhausted"
        assert route.call_count == 2
        assert agent.result.usage.cost_usd == pytest.approx(2 * per_answer)
        assert error.details["needed_usd"] > MAX_OUT * rate_out
        mock.reset()


def test_a_fallback_reserves_at_its_own_price(mock: respx.MockRouter, tmp_path: Path) -> None:
    # gpt-4o-mini's worst case fits; gpt-4o's (its fallback, 16x dearer) does not.
    _, mini_out = listed("gpt-4o-mini")
    _, big_out = listed("gpt-4o")
    assert big_out > 4 * mini_out
    route = mock.post(URL)
    route.side_effect = [tool_turn("gpt-4o-mini", 10, 10) for _ in range(10)]
    agent = AgentLoop(
        client("gpt-4o-mini", fallbacks=["openai:gpt-4o"]),
        tools=[count_rows],
        workspace=tmp_path,
        settings=LoopSettings(),
        budget=Budget(max_cost_usd=2 * MAX_OUT * mini_out + 0.001 * MAX_OUT * big_out),
        max_output_tokens=MAX_OUT,
    )
    error = run_until_stopped(agent)
    assert error.code == "budget.cost_exhausted"
    assert route.call_count == 0
    assert error.details["needed_usd"] > MAX_OUT * big_out


def test_the_async_loop_stops_before_the_call_too(mock: respx.MockRouter, tmp_path: Path) -> None:
    import asyncio

    route = mock.post(URL)
    route.side_effect = [tool_turn("gpt-4o-mini", 10, 10) for _ in range(10)]
    agent = AgentLoop(
        client("gpt-4o-mini"),
        tools=[count_rows],
        workspace=tmp_path,
        settings=LoopSettings(),
        budget=Budget(max_cost_usd=0.01),
        max_output_tokens=100_000,
    )
    with pytest.raises(AgentExecutionError) as caught:
        asyncio.run(agent.arun("count"))
    assert caught.value.code == "budget.cost_exhausted"
    assert route.call_count == 0


def test_no_known_price_is_said_before_the_first_request_and_the_run_goes_on(
    mock: respx.MockRouter, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    said_before: list[bool] = []

    def reply(request: httpx.Request) -> httpx.Response:
        said_before.append("max_cost_usd cannot be enforced" in caplog.text)
        done = len(said_before) >= 2
        body = tool_turn("my-private-model", 10, 10).json()
        if done:
            body["choices"][0]["message"] = {"role": "assistant", "content": "42"}
            body["choices"][0]["finish_reason"] = "stop"
        return httpx.Response(200, json=body)

    mock.post(URL).side_effect = reply
    agent = AgentLoop(
        client("my-private-model"),
        tools=[count_rows],
        workspace=tmp_path,
        settings=LoopSettings(),
        budget=Budget(max_cost_usd=0.000001),
    )
    with caplog.at_level(logging.WARNING, logger="fluid_build.agent"):
        result = agent.run("count")
    assert result.finished
    assert result.text == "42"
    assert said_before == [True, True]
    assert caplog.text.count("max_cost_usd cannot be enforced") == 1
    assert "FLUID_PRICES" in caplog.text
    assert result.usage.cost_usd is None


def test_no_max_cost_usd_counts_nothing(
    mock: respx.MockRouter, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fluid_build.copilot.call import preflight, prices

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a run without max_cost_usd must not price its calls in advance")

    monkeypatch.setattr(prices, "worst_case_usd", refuse)
    monkeypatch.setattr(preflight, "prompt_tokens", refuse, raising=False)
    mock.post(URL).side_effect = [tool_turn("gpt-4o-mini", 10, 10) for _ in range(2)]
    agent = AgentLoop(
        client("gpt-4o-mini"),
        tools=[count_rows],
        workspace=tmp_path,
        settings=LoopSettings(),
        budget=Budget(max_llm_calls=2),
    )
    assert run_until_stopped(agent).code == "budget.llm_calls_exhausted"


def test_a_compaction_summary_is_priced_before_it_is_sent_too(
    mock: respx.MockRouter, tmp_path: Path
) -> None:
    rate_in, rate_out = listed("gpt-4o-mini")
    route = mock.post(URL)
    route.side_effect = [tool_turn("gpt-4o-mini", 10, 10) for _ in range(10)]
    # Two rounds, then a summary is due: it may write 1,024 tokens, a round only MAX_OUT.
    settings = LoopSettings(compact_after=2, compaction="summarize", keep_last=1)
    spent = 2 * (10 * rate_in + 10 * rate_out)
    agent = AgentLoop(
        client("gpt-4o-mini"),
        tools=[count_rows],
        workspace=tmp_path,
        settings=settings,
        budget=Budget(max_cost_usd=spent + 400 * rate_out),
        max_output_tokens=MAX_OUT,
    )
    error = run_until_stopped(agent)
    assert error.code == "budget.cost_exhausted"
    assert route.call_count == 2
    assert all("tools" in json.loads(call.request.content) for call in route.calls)
    assert error.details["max_output_tokens"] == 1024
    assert agent.result.usage.cost_usd == pytest.approx(spent)


def test_the_loops_prices_add_to_the_clients_and_do_not_hide_them(
    mock: respx.MockRouter, tmp_path: Path
) -> None:
    # The client prices the private model; the loop prices another: both apply.
    mock.post(URL).side_effect = [
        tool_turn("my-private-model", 1_000_000, 0),
        tool_turn("my-private-model", 1_000_000, 0),
    ]
    agent = AgentLoop(
        client("my-private-model", prices={"my-private-model": {"input": 2.0, "output": 8.0}}),
        tools=[count_rows],
        workspace=tmp_path,
        settings=LoopSettings(),
        budget=Budget(max_llm_calls=2, max_cost_usd=100.0),
        prices={"another-model": (1.0, 1.0)},
        max_output_tokens=MAX_OUT,
    )
    assert run_until_stopped(agent).code == "budget.llm_calls_exhausted"
    assert agent.result.usage.cost_usd == pytest.approx(4.0)
