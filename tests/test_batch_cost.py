"""What a batch cost (copilot/batch.py): ``Batch.cost_usd`` and the summary's ``cost_usd``.

The figures are checked against call/prices' ``price_call`` for the usage each
answer reported, and pinned to gpt-4o-mini's list price (0.15 / 0.60 USD per
million input / output tokens, cached input 0.075) so a price that silently
stopped applying fails here too.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import httpx
import pytest
import respx

from fluid_build.copilot import Completion, LLMClient
from fluid_build.copilot.agents.errors import ProviderError
from fluid_build.copilot.batch import Batch, Outcome, map_calls
from fluid_build.copilot.call.envelope import RetryEnvelope, RetryPolicy
from fluid_build.copilot.call.prices import price_call

KEY = "sk-proj-BATCHCOST0123456789abcdef"
URL = "https://api.openai.com/v1/chat/completions"
#: prompt -> (prompt_tokens, cached of those, completion_tokens); "bad" gets a 400.
USAGE = {"small": (1000, 0, 500), "cached": (1000, 400, 500), "big": (20_000, 0, 3_000)}


def client() -> LLMClient:
    envelope = RetryEnvelope(RetryPolicy(attempts=1), hook=lambda event: None)
    return LLMClient("openai", "gpt-4o-mini", api_key=KEY, envelope=envelope, env={})


def answer(request: httpx.Request) -> httpx.Response:
    prompt = str(json.loads(request.content)["messages"][-1]["content"])
    if prompt == "bad":
        error = {"message": "unknown parameter", "type": "invalid_request_error"}
        return httpx.Response(400, json={"error": error})
    prompt_tokens, cached, completion_tokens = USAGE[prompt]
    usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached},
    }
    body = {
        "model": "gpt-4o-mini-2024-07-18",
        "choices": [{"message": {"content": f"answer to {prompt}"}, "finish_reason": "stop"}],
        "usage": usage,
    }
    return httpx.Response(200, json=body)


@pytest.fixture
def mock() -> Iterator[respx.MockRouter]:
    with respx.mock(assert_all_called=True) as router:
        router.post(URL).mock(side_effect=answer)
        yield router


def _priced(batch: Batch[Completion]) -> float:
    """What call/prices says each answer's usage costs, added up."""
    total = 0.0
    for outcome in batch:
        if outcome.value is not None:
            cost = price_call("openai", "gpt-4o-mini", outcome.value.usage)
            assert cost is not None
            total += cost
    return total


def test_a_batch_costs_what_its_answers_cost(mock: respx.MockRouter) -> None:
    with client() as llm:
        batch = llm.map(["small", "bad", "cached", "big"], concurrency=2)
    assert [o.code for o in batch] == ["success", "llm.invalid_request", "success", "success"]
    assert batch.cost_usd == pytest.approx(_priced(batch))
    # 0.00045 + 0.00042 (400 of the input read from the cache) + 0.0048
    assert batch.cost_usd == pytest.approx(0.00567)
    assert batch.summary() == {"success": 3, "llm.invalid_request": 1, "cost_usd": 0.00567}
    assert list(batch.summary())[-1] == "cost_usd"
    assert repr(batch) == "Batch(4 calls: success=3, llm.invalid_request=1, cost_usd=0.00567)"


def test_amap_costs_the_same(mock: respx.MockRouter) -> None:
    async def go() -> Batch[Completion]:
        async with client() as llm:
            return await llm.amap(["small", "cached"], concurrency=2)

    batch = asyncio.run(go())
    assert batch.cost_usd == pytest.approx(0.00087)
    assert batch.summary()["cost_usd"] == 0.00087


def _answer(index: int, cost: float | None) -> Outcome[Completion]:
    return Outcome(index, Completion(provider="openai", model="m", cost_usd=cost))


def test_a_partly_priced_batch_costs_the_sum_of_the_known_prices() -> None:
    batch = Batch((_answer(0, 0.25), _answer(1, None), _answer(2, 0.125)))
    assert batch.cost_usd == 0.375
    assert batch.summary()["cost_usd"] == 0.375


def test_no_known_price_is_none_not_zero() -> None:
    failed: Outcome[Completion] = Outcome(1, error=ProviderError("no", code="llm.server_error"))
    batch = Batch((_answer(0, None), failed))
    assert batch.cost_usd is None
    assert batch.summary() == {"success": 1, "llm.server_error": 1, "cost_usd": None}
    assert repr(batch) == "Batch(2 calls: success=1, llm.server_error=1, cost_usd=None)"
    assert Batch(()).summary() == {"cost_usd": None}


def test_values_that_are_not_answers_have_no_cost() -> None:
    batch = map_calls(str.upper, ["a", "b"])
    assert batch.cost_usd is None
    assert batch.summary() == {"success": 2, "cost_usd": None}


def test_a_free_answer_costs_zero_not_unknown() -> None:
    batch = Batch((_answer(0, 0.0),))
    assert batch.cost_usd == 0.0
    assert batch.summary()["cost_usd"] == 0.0


def test_the_summary_rounds_to_a_billionth_of_a_dollar() -> None:
    # Nano-USD, as every USD amount fluid writes in JSON (docs/budgets.md): a tenth of a
    # micro-USD is kept, float noise from the sum is not.
    batch = Batch((_answer(0, 1.2e-7), _answer(1, 0.0010001)))
    assert batch.cost_usd == pytest.approx(0.00100022)
    assert batch.summary()["cost_usd"] == 0.00100022
    noisy = Batch((_answer(0, 0.1), _answer(1, 0.2)))
    assert noisy.cost_usd == 0.30000000000000004
    assert noisy.summary()["cost_usd"] == 0.3
