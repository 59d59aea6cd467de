"""The known model rules (issue 34 item 4): options a model refuses though its provider has a
field for them, refused (or dropped) before sending, each rule with its source.

The table is tested through ``option_rules`` itself, one case or more per rule with the
boundary next to it (the default value, the family beside it); the refusal, the drop, the
fallback chain and the ``allow_options`` override through a real ``LLMClient`` over respx.
Where an adapter on this branch does not map an option yet, ``adapters_take_every_option``
gives the adapters the field, so the error shown is the model rule's and not the
provider's "no such field" (the adapters' own mapping is tested in test_call_options*.py).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import respx

from fluid_build.copilot import LLMClient
from fluid_build.copilot.agents.errors import ProviderError
from fluid_build.copilot.call import options as options_module
from fluid_build.copilot.call.capabilities import (
    OPTION_RULES,
    OVERRIDE_KEYS,
    capabilities_for,
    capability_matrix_from_env,
    option_rules,
)
from fluid_build.copilot.call.options import SAMPLING_FIELDS
from fluid_build.copilot.llm.anthropic import AnthropicAdapter
from fluid_build.copilot.llm.azure import AzureOpenAIAdapter
from fluid_build.copilot.llm.base import SAMPLING_OPTIONS, Adapter
from fluid_build.copilot.llm.gemini import GeminiAdapter
from fluid_build.copilot.llm.openai import OpenAIAdapter
from fluid_build.copilot.llm.openai_compatible import OpenAICompatibleAdapter
from fluid_build.copilot.llm.openai_responses import OpenAIResponsesAdapter
from tests.fakes import FakeClock, clocked_envelope

RULES = {rule.name: rule for rule in OPTION_RULES}
OPENAI_URL = "https://api.openai.com/v1/chat/completions"
OK = {
    "id": "c1",
    "model": "gpt-4o",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "fine"}, "finish_reason": "stop"}
    ],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
}


def why(rule: str, model: str) -> str:
    return RULES[rule].why.format(model=model)


# -- the table: each rule, and the boundary beside it ----------------------------------------

#: (rule, provider, model, the call's fields, the option refused)
REFUSED: list[tuple[str, str, str, dict[str, Any], str]] = [
    ("openai-reasoning-temperature", "openai", "o3", {"temperature": 0.2}, "temperature"),
    (
        "openai-reasoning-temperature",
        "openai",
        "o1-2024-12-17",
        {"temperature": 0.0},
        "temperature",
    ),
    ("openai-reasoning-temperature", "openai", "gpt-5-mini", {"temperature": 0.7}, "temperature"),
    (
        "openai-reasoning-temperature",
        "openai_responses",
        "o3-pro",
        {"temperature": 0},
        "temperature",
    ),
    ("openai-reasoning-temperature", "azure", "o4-mini", {"temperature": 0.3}, "temperature"),
    (
        "openai-reasoning-temperature",
        "openai",
        "gpt-5.1-codex-max",
        {"temperature": 0.3},
        "temperature",
    ),
    ("openai-reasoning-top-p", "openai", "o3-mini", {"top_p": 0.5}, "top_p"),
    ("openai-reasoning-top-p", "openai", "gpt-5-nano-2025-08-07", {"top_p": 0.9}, "top_p"),
    (
        "openai-effort-temperature",
        "openai",
        "gpt-5.1",
        {"temperature": 0.2, "reasoning_effort": "low"},
        "temperature",
    ),
    (
        "openai-effort-temperature",
        "openai",
        "gpt-5.2-2025-12-11",
        {"temperature": 0.2, "reasoning_effort": "high"},
        "temperature",
    ),
    (
        "openai-effort-top-p",
        "openai_responses",
        "gpt-5.4",
        {"top_p": 0.3, "reasoning_effort": "medium"},
        "top_p",
    ),
    ("openai-reasoning-stop", "openai", "o3-2025-04-16", {"stop": ("END",)}, "stop"),
    ("openai-reasoning-stop", "azure", "o4-mini", {"stop": ("END",)}, "stop"),
    ("openai-gpt5-stop", "openai", "gpt-5", {"stop": ("END",)}, "stop"),
    ("openai-gpt5-stop", "openai", "gpt-5.2", {"stop": ("END",)}, "stop"),
    ("openai-gpt5-stop", "openai", "o1-mini", {"stop": ("END",)}, "stop"),
    (
        "openai-no-reasoning",
        "openai",
        "gpt-4o-2024-08-06",
        {"reasoning_effort": "low"},
        "reasoning_effort",
    ),
    (
        "openai-no-reasoning",
        "openai_responses",
        "gpt-4.1",
        {"reasoning_effort": "high"},
        "reasoning_effort",
    ),
    (
        "openai-no-reasoning",
        "openai",
        "gpt-5-chat-latest",
        {"reasoning_effort": "low"},
        "reasoning_effort",
    ),
    (
        "openai-no-reasoning",
        "azure",
        "gpt-4o-mini",
        {"reasoning_effort": "low"},
        "reasoning_effort",
    ),
    (
        "openai-no-reasoning",
        "openai",
        "gpt-3.5-turbo",
        {"reasoning_effort": "low"},
        "reasoning_effort",
    ),
    (
        "claude-sampling-removed-temperature",
        "anthropic",
        "claude-opus-4-7",
        {"temperature": 0.0},
        "temperature",
    ),
    (
        "claude-sampling-removed-top-p",
        "anthropic",
        "claude-opus-4-8-20260801",
        {"top_p": 0.9},
        "top_p",
    ),
    (
        "claude-sampling-removed-temperature",
        "bedrock",
        "global.anthropic.claude-opus-4-7",
        {"temperature": 0.5},
        "temperature",
    ),
    (
        "claude-thinking-temperature",
        "anthropic",
        "claude-sonnet-4-5",
        {"temperature": 0.2, "reasoning_effort": "low"},
        "temperature",
    ),
    (
        "claude-thinking-temperature",
        "anthropic",
        "claude-3-7-sonnet-latest",
        {"temperature": 0.0, "reasoning_effort": "high"},
        "temperature",
    ),
    (
        "claude-thinking-temperature",
        "bedrock",
        "us.anthropic.claude-sonnet-4-20250514-v1:0",
        {"temperature": 0.2, "reasoning_effort": "low"},
        "temperature",
    ),
    (
        "claude-thinking-top-p",
        "anthropic",
        "claude-opus-4-1",
        {"top_p": 0.9, "reasoning_effort": "low"},
        "top_p",
    ),
    (
        "claude-thinking-forced-tool",
        "anthropic",
        "claude-haiku-4-5",
        {"tool_choice": "required", "reasoning_effort": "low"},
        "reasoning_effort",
    ),
    (
        "claude-thinking-forced-tool",
        "bedrock",
        "us.anthropic.claude-sonnet-4-6",
        {"tool_choice": "lookup", "reasoning_effort": "medium"},
        "reasoning_effort",
    ),
    (
        "claude-one-sampler",
        "anthropic",
        "claude-sonnet-4-5-20250929",
        {"temperature": 0.2, "top_p": 0.9},
        "top_p",
    ),
    (
        "claude-one-sampler",
        "anthropic",
        "claude-opus-4-1",
        {"temperature": 0.2, "top_p": 0.9},
        "top_p",
    ),
    (
        "claude-one-sampler",
        "bedrock",
        "anthropic.claude-haiku-4-5-20251001-v1:0",
        {"temperature": 0.2, "top_p": 0.9},
        "top_p",
    ),
    (
        "claude-no-thinking",
        "anthropic",
        "claude-3-5-haiku-20241022",
        {"reasoning_effort": "low"},
        "reasoning_effort",
    ),
    (
        "gemini-no-thinking",
        "gemini",
        "gemini-2.0-flash",
        {"reasoning_effort": "low"},
        "reasoning_effort",
    ),
    (
        "gemini-no-thinking",
        "vertex",
        "gemini-2.0-flash-lite-001",
        {"reasoning_effort": "high"},
        "reasoning_effort",
    ),
    (
        "gemini-no-thinking",
        "gemini",
        "models/gemini-1.5-pro",
        {"reasoning_effort": "low"},
        "reasoning_effort",
    ),
    (
        "deepseek-reasoner-temperature",
        "deepseek",
        "deepseek-reasoner",
        {"temperature": 0.0},
        "temperature",
    ),
    ("deepseek-reasoner-top-p", "deepseek", "deepseek-reasoner", {"top_p": 0.5}, "top_p"),
    ("xai-reasoning-stop", "xai", "grok-4-0709", {"stop": ("END",)}, "stop"),
    ("xai-reasoning-stop", "xai", "grok-3-mini", {"stop": ("END",)}, "stop"),
    ("xai-no-effort", "xai", "grok-4", {"reasoning_effort": "low"}, "reasoning_effort"),
    ("xai-no-effort", "xai", "grok-3", {"reasoning_effort": "high"}, "reasoning_effort"),
]

#: (provider, model, the call's fields): nothing refused.
ACCEPTED: list[tuple[str, str, dict[str, Any]]] = [
    # The default value is what a reasoning model takes.
    ("openai", "o3", {"temperature": 1.0, "top_p": 1}),
    ("anthropic", "claude-opus-4-7", {"temperature": 1}),
    ("anthropic", "claude-sonnet-4-5", {"temperature": 1.0, "reasoning_effort": "low"}),
    # Not a reasoning model, or not this rule's family.
    ("openai", "gpt-4o", {"temperature": 0.2, "top_p": 0.5, "stop": ("END",)}),
    ("openai", "gpt-5-chat-latest", {"temperature": 0.2, "top_p": 0.5}),
    ("openai", "o3-mini", {"stop": ("END",), "reasoning_effort": "low"}),
    ("openai", "gpt-5", {"reasoning_effort": "high"}),
    # gpt-5.1 and later default to reasoning effort none, where sampling is taken.
    ("openai", "gpt-5.1", {"temperature": 0.2, "top_p": 0.5}),
    ("openai_responses", "gpt-5.4-2026-03-05", {"temperature": 0.2}),
    # Claude: thinking off, or within what thinking takes.
    ("anthropic", "claude-sonnet-4-5", {"temperature": 0.2}),
    ("anthropic", "claude-sonnet-4-5", {"top_p": 0.97, "reasoning_effort": "low"}),
    ("anthropic", "claude-opus-4-6", {"tool_choice": "auto", "reasoning_effort": "high"}),
    ("anthropic", "claude-sonnet-4", {"temperature": 0.2, "top_p": 0.9}),
    ("anthropic", "claude-3-7-sonnet", {"reasoning_effort": "low"}),
    ("bedrock", "us.anthropic.claude-3-5-sonnet-20240620-v1:0", {"temperature": 0.2}),
    ("gemini", "gemini-2.5-flash", {"reasoning_effort": "low", "temperature": 0.2}),
    ("deepseek", "deepseek-chat", {"temperature": 0.0, "top_p": 0.5}),
    ("xai", "grok-3-mini", {"reasoning_effort": "low"}),
    ("xai", "grok-4.3", {"reasoning_effort": "low"}),
    ("xai", "grok-4-fast-non-reasoning", {"stop": ("END",)}),
    ("xai", "grok-3", {"stop": ("END",)}),
    # A rule binds its providers only: a vLLM server may serve a model called o3.
    ("openai_compatible", "o3", {"temperature": 0.2}),
    ("ollama", "deepseek-r1", {"temperature": 0.2}),
    # An Azure deployment named freely is not recognised (allow_options covers the rest).
    ("azure", "prod-reasoner", {"temperature": 0.2}),
]


@pytest.mark.parametrize(("rule", "provider", "model", "fields", "option"), REFUSED)
def test_a_rule_refuses_its_option_on_its_models(
    rule: str, provider: str, model: str, fields: dict[str, Any], option: str
) -> None:
    refused = option_rules(provider, model, fields)
    assert refused.get(option) == why(rule, model)
    assert model in refused[option]


@pytest.mark.parametrize(("provider", "model", "fields"), ACCEPTED)
def test_a_call_the_model_takes_is_not_refused(
    provider: str, model: str, fields: dict[str, Any]
) -> None:
    assert option_rules(provider, model, fields) == {}


def test_every_rule_is_exercised_by_a_refused_case() -> None:
    assert {case[0] for case in REFUSED} == set(RULES)


def test_every_rule_has_a_source_and_its_families_resolve_to_known_matrix_rows() -> None:
    assert len(RULES) == len(OPTION_RULES)  # names are unique
    for rule in OPTION_RULES:
        assert rule.option in SAMPLING_FIELDS, rule.name
        assert len(rule.source) > 20, rule.name
        assert "." in rule.source, rule.name
        # The reason names the model and, briefly, where the rule comes from.
        assert "{model}" in rule.why, rule.name
        assert "(" in rule.why, rule.name
        assert not set(rule.models) & set(rule.unless), rule.name
        for family in rule.models + rule.unless:
            # Known to one of the rule's providers at least (o1-pro is the Responses API's
            # only); Azure names its deployments freely and knows none.
            names = {
                provider: f"anthropic.{family}" if provider == "bedrock" else family
                for provider in rule.providers - {"azure"}
            }
            assert any(
                capabilities_for(provider, name).known for provider, name in names.items()
            ), (rule.name, family)


def test_thinking_refused_for_a_forced_tool_takes_the_thinking_rules_with_it() -> None:
    # A drop sends the forced tool and temperature 0.2 without thinking, which Claude takes.
    fields = {"tool_choice": "required", "reasoning_effort": "low", "temperature": 0.2}
    refused = option_rules("anthropic", "claude-sonnet-4-5", fields)
    assert refused == {"reasoning_effort": why("claude-thinking-forced-tool", "claude-sonnet-4-5")}
    assert (
        "extended thinking allows only tool_choice 'auto' or 'none'" in refused["reasoning_effort"]
    )


def test_a_later_rule_sees_the_call_without_what_an_earlier_one_refused() -> None:
    # With thinking, temperature 0.2 is refused; top_p 0.97 is then sent alone, which
    # Sonnet 4.5 takes: dropping both would be one drop too many.
    fields = {"temperature": 0.2, "top_p": 0.97, "reasoning_effort": "low"}
    refused = option_rules("anthropic", "claude-sonnet-4-5", fields)
    assert refused == {"temperature": why("claude-thinking-temperature", "claude-sonnet-4-5")}


# -- switching a rule off: the capability_matrix key allow_options -------------------------


def test_allow_options_switches_the_rules_off_for_those_options_only() -> None:
    fields = {"temperature": 0.2, "top_p": 0.5}
    assert set(option_rules("azure", "o3-mini", fields)) == {"temperature", "top_p"}
    allowed = option_rules("azure", "o3-mini", fields, {"allow_options": ["temperature"]})
    assert set(allowed) == {"top_p"}
    assert (
        option_rules("azure", "o3-mini", fields, {"allow_options": ("temperature", "top_p")}) == {}
    )


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("temperature", "must be a list of call options"),
        ([1], "names 1, which is not a call option"),
        (["temprature"], "names 'temprature', which is not a call option"),
    ],
)
def test_a_bad_allow_options_is_a_value_error_naming_the_key(value: Any, message: str) -> None:
    assert "allow_options" in OVERRIDE_KEYS
    with pytest.raises(ValueError, match=message) as caught:
        option_rules("openai", "o3", {"temperature": 0.2}, {"allow_options": value})
    assert "capability_matrix['allow_options']" in str(caught.value)
    with pytest.raises(ValueError, match="allow_options"):
        capabilities_for("openai", "o3", {"allow_options": value})


def test_allow_options_is_read_from_fluid_capability_matrix_flat_and_per_model() -> None:
    flat = {"FLUID_CAPABILITY_MATRIX": '{"allow_options": ["temperature"]}'}
    assert capability_matrix_from_env(flat, "azure", "o3-mini") == {
        "allow_options": ("temperature",)
    }
    keyed = {
        "FLUID_CAPABILITY_MATRIX": json.dumps(
            {"azure:o3-mini": {"allow_options": ["top_p"]}, "gpt-4o": {"tools": True}}
        )
    }
    assert capability_matrix_from_env(keyed, "azure", "o3-mini") == {"allow_options": ("top_p",)}
    bad = {"FLUID_CAPABILITY_MATRIX": '{"allow_options": "temperature"}'}
    with pytest.raises(ProviderError) as caught:
        capability_matrix_from_env(bad, "azure", "o3-mini")
    assert caught.value.code == "llm.not_configured"
    assert "allow_options" in caught.value.message


# -- through a real client: refused before sending, dropped, the chain ----------------------


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def mock() -> Iterator[respx.MockRouter]:
    with respx.mock(assert_all_called=False) as router:
        yield router


ADAPTERS = (
    AnthropicAdapter,
    AzureOpenAIAdapter,
    GeminiAdapter,
    OpenAIAdapter,
    OpenAICompatibleAdapter,
    OpenAIResponsesAdapter,
)


def adapters_take(monkeypatch: pytest.MonkeyPatch, options: frozenset[str]) -> None:
    def supported_options(self: Adapter, model: str) -> frozenset[str]:
        return options

    for adapter in ADAPTERS:
        monkeypatch.setattr(adapter, "supported_options", supported_options)


@pytest.fixture
def adapters_take_every_option(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every adapter has a field for every option, as if it mapped them all: what is
    refused is then the model rules' doing alone."""
    adapters_take(monkeypatch, SAMPLING_OPTIONS)


def make(provider: str, model: str, clock: FakeClock, **kwargs: Any) -> LLMClient:
    envelope = clocked_envelope(clock)
    kwargs.setdefault("env", {})
    kwargs.setdefault("api_key", "sk-test-0123456789")
    if provider == "azure":
        kwargs.setdefault("base_url", "https://fluid-test.openai.azure.com")
    return LLMClient(provider, model, envelope=envelope, **kwargs)


#: (rule, provider, model, the call's options, the option refused)
THROUGH_A_CLIENT: list[tuple[str, str, str, dict[str, Any], str]] = [
    ("openai-reasoning-temperature", "openai", "o3", {"temperature": 0.37}, "temperature"),
    ("openai-reasoning-top-p", "azure", "o3-mini", {"top_p": 0.37}, "top_p"),
    ("openai-gpt5-stop", "openai", "gpt-5-mini", {"stop": "END"}, "stop"),
    (
        "openai-no-reasoning",
        "openai_responses",
        "gpt-4.1",
        {"reasoning_effort": "low"},
        "reasoning_effort",
    ),
    (
        "claude-thinking-temperature",
        "anthropic",
        "claude-sonnet-4-5",
        {"temperature": 0.37, "reasoning_effort": "low"},
        "temperature",
    ),
    (
        "claude-sampling-removed-temperature",
        "anthropic",
        "claude-opus-4-7",
        {"temperature": 0.37},
        "temperature",
    ),
    (
        "gemini-no-thinking",
        "gemini",
        "gemini-2.0-flash",
        {"reasoning_effort": "high"},
        "reasoning_effort",
    ),
    (
        "deepseek-reasoner-temperature",
        "deepseek",
        "deepseek-reasoner",
        {"temperature": 0.37},
        "temperature",
    ),
    ("xai-reasoning-stop", "xai", "grok-4", {"stop": ["END"]}, "stop"),
]


@pytest.mark.usefixtures("adapters_take_every_option")
@pytest.mark.parametrize(("rule", "provider", "model", "options", "option"), THROUGH_A_CLIENT)
def test_a_refused_option_is_a_typed_error_with_nothing_sent(
    mock: respx.MockRouter,
    clock: FakeClock,
    rule: str,
    provider: str,
    model: str,
    options: dict[str, Any],
    option: str,
) -> None:
    route = mock.route().respond(200, json={})
    client = make(provider, model, clock)
    with pytest.raises(ProviderError) as caught:
        client.complete("hi", **options)
    error = caught.value
    assert error.code == "llm.unsupported_option"
    assert not error.retryable
    assert (error.provider, error.details["option"]) == (provider, option)
    assert error.details["reason"] == why(rule, model)
    assert f"{provider}:{model} cannot take {option}=" in error.message
    with pytest.raises(ProviderError, match=f"cannot take {option}="):
        list(client.stream("hi", **options))
    assert route.call_count == 0


@pytest.mark.usefixtures("adapters_take_every_option")
def test_drop_unsupported_sends_the_call_without_the_refused_option(
    mock: respx.MockRouter, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    options_module._warned.discard("openai:temperature")
    route = mock.post(OPENAI_URL).respond(200, json=OK)
    client = make("openai", "o3", clock, drop_unsupported=True)
    with caplog.at_level(logging.WARNING, logger="fluid_build.llm"):
        assert client.complete("hi", temperature=0.37).text == "fine"
    assert route.call_count == 1
    assert "temperature" not in json.loads(route.calls[0].request.content)
    [warned] = [
        r.getMessage() for r in caplog.records if "cannot take temperature=" in r.getMessage()
    ]
    assert why("openai-reasoning-temperature", "o3") in warned
    assert "dropped (drop_unsupported)" in warned


@pytest.mark.usefixtures("adapters_take_every_option")
def test_a_fallback_whose_model_takes_the_option_answers(
    mock: respx.MockRouter, clock: FakeClock
) -> None:
    route = mock.post(OPENAI_URL).respond(200, json=OK)
    client = make(
        "openai",
        "o3",
        clock,
        fallbacks=[{"provider": "openai", "model": "gpt-4o", "api_key": "sk-other-key-01"}],
    )
    completion = client.complete("hi", temperature=0.37)
    assert completion.answered_by == "openai:gpt-4o"
    assert route.call_count == 1
    assert json.loads(route.calls[0].request.content)["model"] == "gpt-4o"
    [record] = completion.fallback_errors
    assert record["entry"] == "openai:o3"
    assert record["code"] == "llm.unsupported_option"
    assert record["sent"] is False


@pytest.mark.usefixtures("adapters_take_every_option")
def test_allow_options_from_the_client_or_the_environment_sends_the_option(
    mock: respx.MockRouter, clock: FakeClock
) -> None:
    route = mock.post(OPENAI_URL).respond(200, json=OK)
    by_argument = make("openai", "o3", clock, capability_matrix={"allow_options": ["temperature"]})
    assert by_argument.complete("hi", temperature=0.37).text == "fine"
    matrix = json.dumps({"openai:o3": {"allow_options": ["temperature"]}})
    by_env = make("openai", "o3", clock, env={"FLUID_CAPABILITY_MATRIX": matrix})
    assert by_env.complete("hi", temperature=0.37).text == "fine"
    # Per call too, and only for the options named.
    plain = make("openai", "o3", clock)
    assert (
        plain.complete(
            "hi", temperature=0.37, capability_matrix={"allow_options": ["temperature"]}
        ).text
        == "fine"
    )
    with pytest.raises(ProviderError, match="cannot take top_p="):
        plain.complete("hi", top_p=0.37, capability_matrix={"allow_options": ["temperature"]})
    assert route.call_count == 3


def test_the_rules_judge_the_call_without_what_the_adapter_has_no_field_for(
    mock: respx.MockRouter, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An adapter without reasoning_effort sends no thinking: temperature is then not
    # refused for thinking, and the error names reasoning_effort alone.
    adapters_take(monkeypatch, SAMPLING_OPTIONS - {"reasoning_effort"})
    mock.route().respond(200, json={})
    client = make("anthropic", "claude-sonnet-4-5", clock)
    with pytest.raises(ProviderError) as caught:
        client.complete("hi", temperature=0.37, reasoning_effort="low")
    assert caught.value.details["options"] == ["reasoning_effort"]


def test_the_documented_rules_are_the_rules() -> None:
    doc = Path(__file__).parents[1] / "docs" / "capability-warnings.md"
    row = re.compile(r"^\| `([a-z0-9-]+)` \| [^|]+ \| [^|]+ \| `(\w+)` \|")
    documented = {
        match.groups()
        for line in doc.read_text(encoding="utf-8").splitlines()
        if (match := row.match(line))
    }
    assert documented == {(rule.name, rule.option) for rule in OPTION_RULES}


@pytest.mark.parametrize(
    ("rule", "provider", "model", "options", "option"),
    [
        (
            "gemini-no-thinking",
            "gemini",
            "gemini-2.0-flash",
            {"reasoning_effort": "low"},
            "reasoning_effort",
        ),
        ("xai-reasoning-stop", "xai", "grok-4", {"stop": "END", "temperature": 0.37}, "stop"),
        (
            "claude-no-thinking",
            "anthropic",
            "claude-3-5-haiku",
            {"reasoning_effort": "low"},
            "reasoning_effort",
        ),
    ],
)
def test_an_option_the_adapter_refuses_for_the_model_shows_the_rules_reason(
    mock: respx.MockRouter,
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
    rule: str,
    provider: str,
    model: str,
    options: dict[str, Any],
    option: str,
) -> None:
    # The adapter knows the model takes no such option (as the Gemini, xAI and Anthropic
    # adapters do for these models): the reason shown is the rule's, naming the model and
    # the source, not "has no such field".
    adapters_take(monkeypatch, SAMPLING_OPTIONS - {option, "seed"})
    route = mock.route().respond(200, json={})
    with pytest.raises(ProviderError) as caught:
        make(provider, model, clock).complete("hi", **options)
    assert caught.value.details["options"] == [option]
    assert caught.value.details["reason"] == why(rule, model)
    # An option no rule explains keeps the provider's reason.
    with pytest.raises(ProviderError) as caught:
        make(provider, model, clock).complete("hi", **{option: options[option]}, seed=1)
    assert f"{option}= ({why(rule, model)})" in caught.value.message
    assert f"seed= ({provider} has no such field)" in caught.value.message
    assert route.call_count == 0
