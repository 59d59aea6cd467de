"""Prices: every answer's cost_usd, checked against genai-prices' own price numbers.

The expected costs are computed here from the ModelPrice genai-prices lists
for the model (its per-million prices, its tiers), never by calling
price_call a second time.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import respx
from genai_prices import data_snapshot
from genai_prices.types import TieredPrices

from fluid_build.copilot import LLMClient
from fluid_build.copilot.agents.errors import ProviderError
from fluid_build.copilot.call.envelope import RetryEnvelope
from fluid_build.copilot.call.prices import (
    ModelPrice,
    known_price,
    parse_prices,
    price_call,
    prices_from_env,
    prices_version,
    worst_case_usd,
)
from fluid_build.copilot.health.cooldown import MemoryCooldownStore
from fluid_build.copilot.llm.types import Usage
from tests.fakes import FakeClock

KEY = "sk-proj-TESTKEY0123456789abcdef"
ANTHROPIC_KEY = "sk-ant-TESTKEY0123456789abcdef"
GEMINI_KEY = "AIzaSyTESTTESTTESTTESTTESTTESTTESTTES"


def listed(provider_id: str, model: str) -> Any:
    """genai-prices' ModelPrice for the model, as its own data says today."""
    from datetime import UTC, datetime

    _, info = data_snapshot.get_snapshot().find_provider_model(model, None, provider_id, None)
    return info.get_prices(datetime.now(tz=UTC))


def per_token(price: Decimal | TieredPrices | None, input_tokens: int) -> Decimal:
    """A genai-prices price per token, at the tier ``input_tokens`` falls in (a cliff)."""
    if price is None:
        return Decimal(0)
    if isinstance(price, TieredPrices):
        rate = price.base
        for tier in price.tiers:
            if input_tokens > tier.start:
                rate = tier.price
        return rate / 1_000_000
    return price / 1_000_000


def expected(model_price: Any, usage: Usage) -> float:
    n = usage.input_tokens
    uncached = n - usage.cache_read_tokens - usage.cache_write_tokens
    total = (
        per_token(model_price.input_mtok, n) * uncached
        + per_token(model_price.cache_read_mtok, n) * usage.cache_read_tokens
        + per_token(model_price.cache_write_mtok, n) * usage.cache_write_tokens
        + per_token(model_price.output_mtok, n) * usage.output_tokens
    )
    return float(total)


@pytest.fixture
def mock() -> Iterator[respx.MockRouter]:
    with respx.mock(assert_all_called=False) as router:
        yield router


def make(provider: str, **kwargs: Any) -> LLMClient:
    clock = FakeClock()
    envelope = RetryEnvelope(
        cooldown=MemoryCooldownStore(),
        clock=clock,
        sleep=clock.sleep,
        asleep=clock.asleep,
        random=lambda: 0.0,
        hook=lambda event: None,
    )
    kwargs.setdefault("env", {})
    return LLMClient(provider, envelope=envelope, **kwargs)


def openai_answer(model: str, prompt: int, completion: int, cached: int = 0) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "model": model,
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
        ],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "prompt_tokens_details": {"cached_tokens": cached},
        },
    }


# -- the arithmetic against genai-prices' numbers -------------------------------------------


def test_openai_gpt_4o_with_cache_reads_is_priced_from_genai_prices() -> None:
    usage = Usage(input_tokens=12_000, output_tokens=800, cache_read_tokens=8_000)
    model_price = listed("openai", "gpt-4o")
    assert model_price.cache_read_mtok is not None  # the cache read has its own price
    assert price_call("openai", "gpt-4o", usage) == pytest.approx(expected(model_price, usage))
    # Cache reads are cheaper than input: the same tokens uncached cost more.
    plain = Usage(input_tokens=12_000, output_tokens=800)
    assert price_call("openai", "gpt-4o", plain) > price_call("openai", "gpt-4o", usage)  # type: ignore[operator]


def test_anthropic_cache_reads_and_writes_each_at_their_price() -> None:
    usage = Usage(
        input_tokens=20_000, output_tokens=1_000, cache_read_tokens=9_000, cache_write_tokens=6_000
    )
    model_price = listed("anthropic", "claude-sonnet-4-0")
    assert model_price.cache_write_mtok > model_price.input_mtok > model_price.cache_read_mtok
    cost = price_call("anthropic", "claude-sonnet-4-0", usage)
    assert cost == pytest.approx(expected(model_price, usage))
    assert cost == pytest.approx((5_000 * 3 + 9_000 * 0.3 + 6_000 * 3.75 + 1_000 * 15) / 1e6)


def test_gemini_thinking_is_output_and_the_long_prompt_tier_applies() -> None:
    model_price = listed("google", "gemini-2.5-pro")
    assert isinstance(model_price.input_mtok, TieredPrices)
    short = Usage(input_tokens=10_000, output_tokens=3_000, reasoning_tokens=2_500)
    long = Usage(input_tokens=250_000, output_tokens=3_000, reasoning_tokens=2_500)
    for usage in (short, long):
        assert price_call("gemini", "gemini-2.5-pro", usage) == pytest.approx(
            expected(model_price, usage)
        )
    # Past 200k input tokens every token is at the dearer tier.
    assert price_call("gemini", "gemini-2.5-pro", long) == pytest.approx(
        (250_000 * 2.5 + 3_000 * 15) / 1e6
    )


@pytest.mark.parametrize(
    ("provider", "provider_id", "model"),
    [
        ("groq", "groq", "llama-3.3-70b-versatile"),
        ("mistral", "mistral", "mistral-small-latest"),
        ("openrouter", "openrouter", "openai/gpt-4o-mini"),
        ("azure", "azure", "gpt-4o"),
        ("gemini", "google", "gemini-2.5-flash"),
    ],
)
def test_the_other_providers_are_priced_from_their_own_lists(
    provider: str, provider_id: str, model: str
) -> None:
    from genai_prices import Usage as GenaiUsage

    usage = Usage(input_tokens=3_000, output_tokens=400)
    genai = data_snapshot.get_snapshot().calc(
        GenaiUsage(input_tokens=3_000, output_tokens=400), model, provider_id, None, None
    )
    assert price_call(provider, model, usage) == pytest.approx(float(genai.total_price))
    assert known_price(provider, model)


def test_local_servers_are_unpriced_unless_given_a_price() -> None:
    usage = Usage(input_tokens=1_000, output_tokens=1_000)
    for provider in ("openai_compatible", "vllm", "llamacpp", "ollama"):
        # A local server running a model with a famous name is still the operator's own.
        assert price_call(provider, "gpt-4o", usage) is None
        assert not known_price(provider, "gpt-4o")
        assert worst_case_usd(provider, "gpt-4o", 100, 100) is None
    given = parse_prices({"vllm:gpt-4o": {"input": 1.0, "output": 2.0}})
    assert price_call("vllm", "gpt-4o", usage, overrides=given) == pytest.approx(0.003)
    assert price_call("llamacpp", "gpt-4o", usage, overrides=given) is None


def test_an_unknown_model_has_no_price() -> None:
    usage = Usage(input_tokens=1_000, output_tokens=1_000)
    assert price_call("openai", "my-private-finetune-xyz", usage) is None
    assert not known_price("openai", "my-private-finetune-xyz")
    assert worst_case_usd("openai", "my-private-finetune-xyz", 10, 10) is None


def test_the_model_the_answer_names_is_priced_when_known_else_the_one_asked() -> None:
    usage = Usage(input_tokens=1_000_000, output_tokens=0)
    mini = float(listed("openai", "gpt-4o-mini").input_mtok)
    big = float(listed("openai", "gpt-4o").input_mtok)
    assert price_call("openai", "gpt-4o", usage, answered_model="gpt-4o-mini") == pytest.approx(
        mini
    )
    # A name genai-prices does not know: the model requested.
    assert price_call(
        "openai", "gpt-4o", usage, answered_model="gpt-4o-proxy-build-7"
    ) == pytest.approx(big)


def test_overrides_win_and_cache_prices_default_to_input() -> None:
    usage = Usage(input_tokens=2_000_000, output_tokens=1_000_000, cache_read_tokens=1_000_000)
    given = parse_prices({"gpt-4o": {"input": 1.0, "output": 4.0}})
    # No cache_read price given: the cached million is input.
    assert price_call("openai", "gpt-4o", usage, overrides=given) == pytest.approx(6.0)
    with_cache = parse_prices({"openai:gpt-4o": {"input": 1.0, "output": 4.0, "cache_read": 0.5}})
    assert price_call("openai", "gpt-4o", usage, overrides=with_cache) == pytest.approx(5.5)
    assert ModelPrice(1.0, 4.0).cost(usage) == pytest.approx(6.0)


def test_worst_case_prices_every_input_token_at_the_dearest_input_rate() -> None:
    model_price = listed("anthropic", "claude-sonnet-4-0")
    worst = worst_case_usd("anthropic", "claude-sonnet-4-0", 10_000, 2_000)
    # A cache write (3.75) costs more than input (3): the worst case assumes it.
    want = (10_000 * model_price.cache_write_mtok + 2_000 * model_price.output_mtok) / 1_000_000
    assert worst == pytest.approx(float(want))
    given = parse_prices({"m": {"input": 1.0, "output": 2.0}})
    assert worst_case_usd("vllm", "m", 1_000_000, 1_000_000, overrides=given) == pytest.approx(3.0)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("{not json", "not JSON"),
        ('["gpt-4o"]', "not an object keyed by model"),
        ('{"m": {"input": 1}}', "no 'output' price"),
        ('{"m": {"input": -1, "output": 1}}', "finite amount >= 0"),
        ('{"m": {"input": "1", "output": 1}}', "not a number"),
        ('{"m": {"input": 1, "output": 1, "cached": 1}}', "unknown field 'cached'"),
        # Issue 32 item 12: an OverflowError, a RecursionError and llm.unknown_error before.
        ('{"m": {"input": 1' + "0" * 400 + ', "output": 1}}', "finite amount >= 0"),
        ('{"m": {"input": 1, "output": ' + "[" * 100_000 + "1" + "]" * 100_000 + "}}", "nested"),
        ('{"m": {"input": 1e300, "output": 1}}', "more than 1e+06"),
    ],
)
def test_a_bad_fluid_prices_is_not_configured_naming_the_variable(text: str, says: str) -> None:
    with pytest.raises(ProviderError) as caught:
        prices_from_env({"FLUID_PRICES": text})
    error = caught.value
    assert error.code == "llm.not_configured"
    assert not error.retryable
    assert says in str(error)
    assert "FLUID_PRICES" in str(error)
    assert '"input": 0.5' in str(error)  # the example
    assert error.details["variable"] == "FLUID_PRICES"
    # And a client reading it refuses to start the same way.
    with pytest.raises(ProviderError, match="FLUID_PRICES"):
        LLMClient("openai", api_key=KEY, env={"FLUID_PRICES": text})


def test_prices_version_names_the_package_and_its_data() -> None:
    from importlib.metadata import version

    shown = prices_version()
    assert shown.startswith(f"genai-prices {version('genai-prices')} (bundled data:")
    assert "models" in shown


# -- every answer carries its cost -----------------------------------------------------------


def test_a_completed_openai_call_carries_cost_usd(mock: respx.MockRouter) -> None:
    mock.post("https://api.openai.com/v1/chat/completions").respond(
        200, json=openai_answer("gpt-4o-2024-08-06", 1_000, 200, cached=400)
    )
    done = make("openai", model="gpt-4o", api_key=KEY).complete("hi")
    model_price = listed("openai", "gpt-4o-2024-08-06")
    want = expected(
        model_price, Usage(input_tokens=1_000, output_tokens=200, cache_read_tokens=400)
    )
    assert done.cost_usd == pytest.approx(want)
    assert isinstance(done.cost_usd, float)


def test_openai_at_another_base_url_is_still_priced_as_openai(mock: respx.MockRouter) -> None:
    mock.post("https://llm-proxy.example.test/v1/chat/completions").respond(
        200, json=openai_answer("gpt-4o", 1_000, 100)
    )
    client = make(
        "openai", model="gpt-4o", api_key=KEY, base_url="https://llm-proxy.example.test/v1"
    )
    done = client.complete("hi")
    assert done.cost_usd == pytest.approx(
        expected(listed("openai", "gpt-4o"), Usage(input_tokens=1_000, output_tokens=100))
    )


def test_a_local_server_answer_has_no_cost_until_priced(mock: respx.MockRouter) -> None:
    mock.post("http://127.0.0.1:8000/v1/chat/completions").respond(
        200, json=openai_answer("llama-3.1-8b", 1_000_000, 1_000_000)
    )
    base = "http://127.0.0.1:8000/v1"
    assert make("vllm", model="llama-3.1-8b", base_url=base).complete("hi").cost_usd is None
    priced = make(
        "vllm",
        model="llama-3.1-8b",
        base_url=base,
        prices={"llama-3.1-8b": {"input": 0.1, "output": 0.2}},
    )
    assert priced.complete("hi").cost_usd == pytest.approx(0.3)
    from_env = make(
        "vllm",
        model="llama-3.1-8b",
        base_url=base,
        env={"FLUID_PRICES": json.dumps({"vllm:llama-3.1-8b": {"input": 1, "output": 1}})},
    )
    assert from_env.complete("hi").cost_usd == pytest.approx(2.0)
    # The argument wins over the variable.
    both = make(
        "vllm",
        model="llama-3.1-8b",
        base_url=base,
        env={"FLUID_PRICES": json.dumps({"llama-3.1-8b": {"input": 1, "output": 1}})},
        prices={"llama-3.1-8b": {"input": 0.1, "output": 0.2}},
    )
    assert both.complete("hi").cost_usd == pytest.approx(0.3)


def test_an_anthropic_answer_prices_its_cache_reads_and_writes(mock: respx.MockRouter) -> None:
    mock.post("https://api.anthropic.com/v1/messages").respond(
        200,
        json={
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "claude-sonnet-4-0",
            "content": [{"type": "text", "text": "ok"}],
            "stop_reason": "end_turn",
            "usage": {
                "input_tokens": 1_000,
                "output_tokens": 300,
                "cache_read_input_tokens": 5_000,
                "cache_creation_input_tokens": 2_000,
            },
        },
    )
    client = make("anthropic", model="claude-sonnet-4-0", env={"ANTHROPIC_API_KEY": ANTHROPIC_KEY})
    done = client.complete("hi")
    usage = Usage(
        input_tokens=8_000, output_tokens=300, cache_read_tokens=5_000, cache_write_tokens=2_000
    )
    assert done.usage == usage
    assert done.cost_usd == pytest.approx(expected(listed("anthropic", "claude-sonnet-4-0"), usage))


def test_a_gemini_answer_prices_thinking_as_output(mock: respx.MockRouter) -> None:
    mock.post(
        "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-pro:generateContent"
    ).respond(
        200,
        json={
            "candidates": [
                {"content": {"role": "model", "parts": [{"text": "ok"}]}, "finishReason": "STOP"}
            ],
            "usageMetadata": {
                "promptTokenCount": 4_000,
                "candidatesTokenCount": 100,
                "thoughtsTokenCount": 900,
            },
            "modelVersion": "gemini-2.5-pro",
        },
    )
    done = make("gemini", model="gemini-2.5-pro", env={"GEMINI_API_KEY": GEMINI_KEY}).complete("hi")
    model_price = listed("google", "gemini-2.5-pro")
    assert done.usage.output_tokens == 1_000
    assert done.cost_usd == pytest.approx(
        float(
            per_token(model_price.input_mtok, 4_000) * 4_000
            + per_token(model_price.output_mtok, 4_000) * 1_000
        )
    )


def test_a_stream_done_event_carries_cost_usd(mock: respx.MockRouter) -> None:
    chunks = [
        {"model": "gpt-4o", "choices": [{"delta": {"role": "assistant", "content": "Hi"}}]},
        {"choices": [{"delta": {}, "finish_reason": "stop"}]},
        {"choices": [], "usage": {"prompt_tokens": 2_000, "completion_tokens": 500}},
    ]
    body = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
    mock.post("https://api.openai.com/v1/chat/completions").respond(
        200, content=body.encode(), headers={"content-type": "text/event-stream"}
    )
    events = list(make("openai", model="gpt-4o", api_key=KEY).stream("hi"))
    done = events[-1]
    assert done.type == "done"
    assert done.completion is not None
    assert done.completion.cost_usd == pytest.approx(
        expected(listed("openai", "gpt-4o"), Usage(input_tokens=2_000, output_tokens=500))
    )


# -- fluid doctor shows the price data -------------------------------------------------------


def test_fluid_doctor_shows_the_price_data_version_and_given_prices(tmp_path: Path) -> None:
    from importlib.metadata import version

    from tests.test_cli_conventions import fluid, fresh_env

    home = tmp_path / "home"
    home.mkdir()
    given = json.dumps({"my-model": {"input": 0.5, "output": 1.5}})
    shown = fluid(home, "doctor", env=fresh_env(home, FLUID_PRICES=given))
    line = next(text for text in shown.stdout.splitlines() if text.startswith("prices: "))
    assert line.startswith(f"prices: genai-prices {version('genai-prices')} (bundled data:")
    assert line.endswith("; FLUID_PRICES prices my-model")
    report = json.loads(fluid(home, "doctor", "--json").stdout)
    assert report["prices"]["version"].startswith("genai-prices ")
    assert report["prices"]["given"] == []


# -- usage no model could have used (issue 32 item 3) -----------------------------------------

ABSURD = 10**400  # valid JSON, and no float


def test_an_absurd_usage_prices_as_unknown_never_a_crash(mock: respx.MockRouter) -> None:
    import asyncio

    answer = openai_answer("gpt-4o", 1_000, 100)
    answer["usage"]["prompt_tokens"] = ABSURD
    mock.post("https://api.openai.com/v1/chat/completions").respond(
        200, content=json.dumps(answer).encode(), headers={"content-type": "application/json"}
    )
    client = make("openai", model="gpt-4o", api_key=KEY)
    done = client.complete("hi")
    assert done.text
    assert done.cost_usd is None
    assert asyncio.run(client.acomplete("hi")).cost_usd is None
    assert price_call("openai", "gpt-4o", Usage(input_tokens=10, output_tokens=10**22)) is None
    assert price_call("openai", "gpt-4o", Usage(input_tokens=10, output_tokens=10)) is not None


def test_an_absurd_usage_in_a_responses_stream_prices_as_unknown(mock: respx.MockRouter) -> None:
    events = [
        {"type": "response.output_text.delta", "delta": "Hi"},
        {
            "type": "response.completed",
            "response": {
                "model": "gpt-4o",
                "status": "completed",
                "usage": {"input_tokens": ABSURD, "output_tokens": 5},
            },
        },
    ]
    body = "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events)
    mock.post("https://api.openai.com/v1/responses").respond(
        200, content=body.encode(), headers={"content-type": "text/event-stream"}
    )
    streamed = list(make("openai_responses", model="gpt-4o", api_key=KEY).stream("hi"))
    done = streamed[-1]
    assert done.type == "done"
    assert done.completion is not None
    assert done.completion.cost_usd is None
