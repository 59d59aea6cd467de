"""A call's options as a caller meets them: checked names and values, client-wide defaults,
refusals before sending, the fallback chain, the agent loop, and what mypy sees (issue 34).

Each provider's mapping of the options to its own fields is tested over loopback in
test_call_options_openai.py and test_call_options_providers.py; the model rules in
test_option_rules.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import respx

from fluid_build.copilot import LLMClient, ToolSpec
from fluid_build.copilot.agents.errors import ProviderError
from fluid_build.copilot.loop.agent import AgentLoop
from fluid_build.copilot.loop.workspace import Workspace
from tests.fakes import FakeClock, clocked_envelope

OPENAI_URL = "https://api.openai.com/v1/chat/completions"
ANTHROPIC_URL = "https://api.anthropic.com/v1/messages"
OK = {
    "id": "c1",
    "model": "gpt-4o-mini",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "fine"}, "finish_reason": "stop"}
    ],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
}
TOOL = ToolSpec("lookup", "Look a word up", {"type": "object", "properties": {}})


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def make(provider: str, clock: FakeClock, **kwargs: Any) -> LLMClient:
    envelope = clocked_envelope(clock)
    kwargs.setdefault("env", {})
    kwargs.setdefault("api_key", "sk-test-0123456789")
    return LLMClient(provider, envelope=envelope, **kwargs)


@pytest.fixture
def mock() -> Iterator[respx.MockRouter]:
    with respx.mock(assert_all_called=False) as router:
        yield router


def body(route: respx.Route, n: int = -1) -> Any:
    return json.loads(route.calls[n].request.content)


# -- names: a TypeError before anything is sent ---------------------------------------------


def test_an_unknown_option_is_a_type_error_on_every_call_method(
    mock: respx.MockRouter, clock: FakeClock
) -> None:
    route = mock.post(OPENAI_URL).respond(200, json=OK)
    client = make("openai", clock, model="gpt-4o-mini")
    bogus: dict[str, Any] = {"bogus": 1}
    with pytest.raises(TypeError, match=r"LLMClient.complete\(\) .* 'bogus'"):
        client.complete("hi", **bogus)
    with pytest.raises(TypeError, match=r"LLMClient.acomplete\(\) .* 'bogus'"):
        asyncio.run(client.acomplete("hi", **bogus))
    with pytest.raises(TypeError, match=r"LLMClient.stream\(\) .* 'bogus'"):
        client.stream("hi", **bogus)
    with pytest.raises(TypeError, match=r"LLMClient.astream\(\) .* 'bogus'"):
        client.astream("hi", **bogus)
    with pytest.raises(TypeError, match=r"LLMClient.map\(\) .* 'bogus'"):
        client.map(["a", "b"], **bogus)
    with pytest.raises(TypeError, match=r"LLMClient.amap\(\) .* 'bogus'"):
        asyncio.run(client.amap(["a", "b"], **bogus))
    assert route.call_count == 0


def test_a_misspelt_option_names_the_one_meant(clock: FakeClock) -> None:
    client = make("openai", clock, model="gpt-4o-mini")
    misspelt: dict[str, Any] = {"temprature": 0.2}
    with pytest.raises(TypeError, match="did you mean 'temperature'"):
        client.complete("hi", **misspelt)
    with pytest.raises(TypeError, match=r"LLMClient\(options=\) .* 'topp'"):
        make("openai", clock, model="gpt-4o-mini", options={"topp": 0.5})  # type: ignore[typeddict-unknown-key]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"temperature": 3}, "temperature must be from 0 to 2"),
        ({"temperature": "hot"}, "temperature must be a number"),
        ({"temperature": float("nan")}, "temperature must be a number"),
        ({"temperature": True}, "temperature must be a number"),
        ({"top_p": 1.5}, "top_p must be from 0 to 1"),
        ({"stop": [""]}, "stop must be a non-empty string"),
        ({"stop": 5}, "stop must be a non-empty string"),
        ({"seed": 1.5}, "seed must be a whole number"),
        ({"seed": 2**64}, "seed must fit in 64 bits"),
        ({"reasoning_effort": "max"}, "reasoning_effort must be one of low, medium, high"),
        ({"parallel_tool_calls": "no"}, "parallel_tool_calls must be True or False"),
        ({"tool_choice": 3}, "tool_choice must be one of auto, none, required"),
        ({"tool_choice": "required"}, "needs tools="),
        ({"tool_choice": "nosuch", "tools": [TOOL]}, "neither auto, none, required nor the name"),
        ({"extra": {"a": 1}, "extra_body": {"b": 2}}, "extra is an alias of extra_body"),
        ({"extra_body": ["not", "a", "mapping"]}, "extra_body must be a mapping"),
    ],
)
def test_a_bad_value_is_refused_before_sending(
    mock: respx.MockRouter, clock: FakeClock, options: dict[str, Any], message: str
) -> None:
    route = mock.post(OPENAI_URL).respond(200, json=OK)
    client = make("openai", clock, model="gpt-4o-mini")
    with pytest.raises(ValueError, match=message):
        client.complete("hi", **options)
    assert route.call_count == 0


def test_a_bad_header_value_is_refused_without_showing_it(clock: FakeClock) -> None:
    client = make("openai", clock, model="gpt-4o-mini")
    with pytest.raises(Exception, match="x-secret") as caught:
        client.complete("hi", extra_headers={"x-secret": "sk-live-abc\nInjected: 1"})
    assert "sk-live-abc" not in str(caught.value)


# -- defaults on the client, and what a call overrides ----------------------------------------


def test_the_clients_options_reach_every_call_and_a_call_overrides_them(
    mock: respx.MockRouter, clock: FakeClock
) -> None:
    route = mock.post(OPENAI_URL).respond(200, json=OK)
    client = make(
        "openai",
        clock,
        model="gpt-4o-mini",
        options={"temperature": 0.37, "seed": 4242, "max_output_tokens": 77},
    )
    client.complete("hi")
    sent = body(route)
    assert (sent["temperature"], sent["seed"], sent["max_completion_tokens"]) == (0.37, 4242, 77)
    client.complete("hi", temperature=0.9, max_output_tokens=5)
    sent = body(route)
    assert (sent["temperature"], sent["seed"], sent["max_completion_tokens"]) == (0.9, 4242, 5)
    list(client.map(["a"], seed=1))
    assert body(route)["seed"] == 1


def test_the_environment_sets_defaults_under_the_clients_and_the_calls(
    mock: respx.MockRouter, clock: FakeClock
) -> None:
    route = mock.post(OPENAI_URL).respond(200, json=OK)
    env = {"FLUID_LLM_TEMPERATURE": "0.37", "FLUID_LLM_MAX_OUTPUT_TOKENS": "77"}
    client = make("openai", clock, model="gpt-4o-mini", env=env)
    client.complete("hi")
    assert (body(route)["temperature"], body(route)["max_completion_tokens"]) == (0.37, 77)
    # A None from the caller (the agent loop's max_output_tokens) is not set: the default holds.
    client.complete("hi", temperature=0.5, max_output_tokens=None)
    assert (body(route)["temperature"], body(route)["max_completion_tokens"]) == (0.5, 77)
    client = make("openai", clock, model="gpt-4o-mini", env=env, options={"temperature": 0.9})
    client.complete("hi")
    assert (body(route)["temperature"], body(route)["max_completion_tokens"]) == (0.9, 77)


@pytest.mark.parametrize(
    ("variable", "value"),
    [("FLUID_LLM_TEMPERATURE", "hot"), ("FLUID_LLM_MAX_OUTPUT_TOKENS", "-5")],
)
def test_a_bad_environment_default_is_not_configured_naming_it(
    clock: FakeClock, variable: str, value: str
) -> None:
    with pytest.raises(ProviderError) as caught:
        make("openai", clock, model="gpt-4o-mini", env={variable: value})
    assert caught.value.code == "llm.not_configured"
    assert caught.value.details["variable"] == variable


def test_a_bad_client_default_fails_at_construction(clock: FakeClock) -> None:
    with pytest.raises(ValueError, match="temperature must be from 0 to 2"):
        make("openai", clock, model="gpt-4o-mini", options={"temperature": 9})


# -- what the provider cannot take: refused, or dropped once with a warning ------------------


def test_an_option_the_provider_has_no_field_for_is_refused_with_nothing_sent(
    mock: respx.MockRouter, clock: FakeClock
) -> None:
    route = mock.post(ANTHROPIC_URL).respond(200, json={})
    client = make("anthropic", clock, model="claude-sonnet-4-5")
    with pytest.raises(ProviderError) as caught:
        client.complete("hi", seed=4242)
    error = caught.value
    assert error.code == "llm.unsupported_option"
    assert not error.retryable
    assert error.details["option"] == "seed"
    assert "anthropic:claude-sonnet-4-5 cannot take seed=" in error.message
    assert "drop_unsupported=True" in error.message
    with pytest.raises(ProviderError, match="cannot take seed="):
        list(client.stream("hi", seed=4242))
    assert route.call_count == 0
    # Not the provider's doing: no sticky last error in health().
    assert client.health()[0]["last_error"] is None


def test_drop_unsupported_sends_without_it_and_warns_once_per_provider_option(
    mock: respx.MockRouter, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    from fluid_build.copilot.call import options as options_module

    options_module._warned.discard("anthropic:seed")
    answer = {
        "id": "m1",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5",
        "content": [{"type": "text", "text": "fine"}],
        "stop_reason": "end_turn",
        "usage": {"input_tokens": 3, "output_tokens": 1},
    }
    route = mock.post(ANTHROPIC_URL).respond(200, json=answer)
    client = make("anthropic", clock, model="claude-sonnet-4-5", drop_unsupported=True)
    with caplog.at_level(logging.WARNING, logger="fluid_build.llm"):
        assert client.complete("hi", seed=4242).text == "fine"
        assert client.complete("hi", seed=7).text == "fine"
    assert route.call_count == 2
    assert all("seed" not in body(route, n) for n in range(2))
    warned = [r for r in caplog.records if "cannot take seed=" in r.getMessage()]
    assert len(warned) == 1
    assert "dropped (drop_unsupported)" in warned[0].getMessage()


# -- a fallback chain: an entry that cannot take an option is skipped, and says why ----------


def answer(request: httpx.Request) -> httpx.Response:
    """OK, as a whole answer or as a stream, as the request asks."""
    if not json.loads(request.content).get("stream"):
        return httpx.Response(200, json=OK)
    chunks = [
        {"choices": [{"index": 0, "delta": {"content": "fine"}}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    ]
    text = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
    return httpx.Response(200, text=text, headers={"content-type": "text/event-stream"})


def test_a_refused_entry_is_skipped_for_one_that_takes_the_option(
    mock: respx.MockRouter, clock: FakeClock
) -> None:
    anthropic = mock.post(ANTHROPIC_URL).respond(200, json={})
    openai = mock.post(OPENAI_URL).mock(side_effect=answer)
    client = make(
        "anthropic",
        clock,
        model="claude-sonnet-4-5",
        fallbacks=[{"provider": "openai", "model": "gpt-4o-mini", "api_key": "sk-other-key-01"}],
    )
    completion = client.complete("hi", seed=4242)
    assert completion.answered_by == "openai:gpt-4o-mini"
    assert body(openai)["seed"] == 4242
    assert anthropic.call_count == 0
    [record] = completion.fallback_errors
    assert record["entry"] == "anthropic:claude-sonnet-4-5"
    assert record["code"] == "llm.unsupported_option"
    assert (record["sent"], record["cost_usd"]) == (False, 0.0)
    # A stream walks the chain the same way.
    events = list(client.stream("hi", seed=4242))
    assert events[-1].completion is not None
    assert events[-1].completion.answered_by == "openai:gpt-4o-mini"
    assert events[-1].completion.text == "fine"
    assert body(openai)["seed"] == 4242
    assert anthropic.call_count == 0


def test_when_every_entry_refuses_the_error_lists_why_for_each(
    mock: respx.MockRouter, clock: FakeClock
) -> None:
    route = mock.route().respond(200, json={})
    client = make(
        "anthropic",
        clock,
        model="claude-sonnet-4-5",
        fallbacks=[
            {"provider": "openai_responses", "model": "gpt-4o-mini", "api_key": "sk-other-01"}
        ],
    )
    with pytest.raises(ProviderError) as caught:
        client.complete("hi", stop=["END"], seed=1)
    error = caught.value
    assert error.code == "llm.unsupported_option"
    attempts = error.details["fallback_attempts"]
    assert [a["entry"] for a in attempts] == [
        "anthropic:claude-sonnet-4-5",
        "openai_responses:gpt-4o-mini",
    ]
    assert all(a["code"] == "llm.unsupported_option" for a in attempts)
    assert "cannot take seed=" in attempts[0]["message"]
    assert "cannot take stop=" in attempts[1]["message"]
    assert route.call_count == 0


def test_a_fallback_entry_with_a_bad_option_value_fails_when_the_client_is_built(
    clock: FakeClock,
) -> None:
    from fluid_build import Fallback

    with pytest.raises(ProviderError) as caught:
        make(
            "openai",
            clock,
            model="gpt-4o-mini",
            fallbacks=[Fallback("ollama", "llama3.1:8b", options={"temperature": 7})],
        )
    assert caught.value.code == "llm.not_configured"
    assert "ollama:llama3.1:8b" in caught.value.message
    assert "temperature must be from 0 to 2" in caught.value.message


# -- the agent loop ----------------------------------------------------------------------------


def test_the_agent_loop_sends_its_options_on_every_call(
    mock: respx.MockRouter, clock: FakeClock, tmp_path: Path
) -> None:
    route = mock.post(OPENAI_URL).respond(200, json=OK)
    client = make("openai", clock, model="gpt-4o-mini", options={"seed": 4242})
    loop = AgentLoop(
        client, workspace=Workspace(tmp_path), options={"temperature": 0.37, "stop": "END"}
    )
    result = loop.run("say fine")
    assert result.text == "fine"
    sent = body(route)
    assert (sent["temperature"], sent["stop"], sent["seed"]) == (0.37, ["END"], 4242)


def test_the_agent_loop_refuses_options_it_sets_itself_and_unknown_names(
    clock: FakeClock, tmp_path: Path
) -> None:
    client = make("openai", clock, model="gpt-4o-mini")
    with pytest.raises(TypeError, match=r"cannot set system: pass AgentLoop\(system=\)"):
        AgentLoop(client, workspace=tmp_path, options={"system": "x"})
    with pytest.raises(TypeError, match="'bogus'"):
        AgentLoop(client, workspace=tmp_path, options={"bogus": 1})  # type: ignore[typeddict-unknown-key]
    with pytest.raises(ValueError, match="top_p must be from 0 to 1"):
        AgentLoop(client, workspace=tmp_path, options={"top_p": 2})


# -- what mypy --strict sees -------------------------------------------------------------------


def test_mypy_strict_accepts_every_option_and_rejects_a_misspelt_one(tmp_path: Path) -> None:
    (tmp_path / "good.py").write_text(
        textwrap.dedent(
            """
            from fluid_build import LLMClient

            client = LLMClient("openai", "gpt-4o-mini", api_key="k", options={"seed": 1})
            client.complete(
                "hi",
                temperature=0.2,
                top_p=0.9,
                stop=["END"],
                seed=7,
                max_output_tokens=100,
                tool_choice="lookup",
                parallel_tool_calls=False,
                reasoning_effort="low",
                extra_body={"store": False},
                extra={"store": False},
                extra_headers={"x-trace": "1"},
                drop_unsupported=True,
            )
            client.stream("hi", stop="END", tool_choice="required")
            """
        )
    )
    (tmp_path / "bad.py").write_text(
        textwrap.dedent(
            """
            from fluid_build import LLMClient

            client = LLMClient("openai", "gpt-4o-mini", api_key="k")
            client.complete("hi", temprature=0.2)
            client.complete("hi", reasoning_effort="max")
            client.complete("hi", seed="7")
            """
        )
    )
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--no-error-summary",
            "--cache-dir",
            str(tmp_path / "cache"),
            "good.py",
            "bad.py",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    errors = [line for line in run.stdout.splitlines() if ": error:" in line]
    assert not [line for line in errors if line.startswith("good.py")], run.stdout
    bad = [line for line in errors if line.startswith("bad.py")]
    assert len(bad) == 3, run.stdout
    assert 'Unexpected keyword argument "temprature"' in bad[0]
    assert "reasoning_effort" in bad[1]
    assert "seed" in bad[2]
