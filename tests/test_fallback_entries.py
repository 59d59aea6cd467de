"""Fallback entries with settings of their own: ``fluid_build.Fallback`` and its mapping form.

Each entry carries its own endpoint, key, timeout, headers and call options; what it
leaves out comes from the environment as for a client of its own. Two OpenAI-compatible
servers with different keys and URLs are chained on real loopback servers, each one
checked for the Authorization header and the path it received.
"""

from __future__ import annotations

import asyncio
import copy
import json
import pickle
from collections.abc import Iterator
from typing import Any

import pytest
import respx

from fluid_build import Fallback, LLMClient, ProviderError
from fluid_build.copilot.call.envelope import RetryEnvelope, RetryPolicy
from fluid_build.copilot.health.cooldown import MemoryCooldownStore
from tests import loopback
from tests.fakes import FakeClock

SECRET = "sk-entry-SECRETKEY0123456789abcdef"
ANTHROPIC = "https://api.anthropic.com/v1/messages"
OPENAI = "https://api.openai.com/v1/chat/completions"
ANTHROPIC_OK = {
    "content": [{"type": "text", "text": "from claude"}],
    "model": "claude-sonnet-4-6",
    "usage": {"input_tokens": 1, "output_tokens": 1},
    "stop_reason": "end_turn",
}


def quiet_envelope(attempts: int = 1) -> RetryEnvelope:
    clock = FakeClock()
    return RetryEnvelope(
        RetryPolicy(attempts=attempts),
        cooldown=MemoryCooldownStore(),
        clock=clock,
        sleep=clock.sleep,
        asleep=clock.asleep,
        random=lambda: 0.0,
        hook=lambda e: None,
    )


@pytest.fixture
def mock() -> Iterator[respx.MockRouter]:
    with respx.mock(assert_all_called=False) as router:
        yield router


# -- two real servers, each with its own key and URL -------------------------------------


def _answer(text: str) -> loopback.Reply:
    body = {"choices": [{"message": {"content": text}, "finish_reason": "stop"}]}
    return 200, {"content-type": "application/json"}, json.dumps(body).encode()


DOWN: loopback.Reply = (503, {"content-type": "application/json"}, b'{"error": {"message": "x"}}')


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("form", ["object", "mapping"])
def test_two_compatible_servers_with_their_own_keys_and_urls_are_chained(
    form: str, mode: str
) -> None:
    with (
        loopback.http_server(lambda seen: DOWN) as first,
        loopback.http_server(lambda seen: _answer("from the second")) as second,
    ):
        settings: dict[str, Any] = {
            "provider": "openai_compatible",
            "model": "model-b",
            "base_url": loopback.base_url(second) + "/team-b/v2",
            "api_key": "key-of-b",
            "headers": {"x-team": "blue"},
        }
        entry: Any = Fallback(**settings) if form == "object" else settings
        # The environment names another server and another key: neither entry uses them.
        env = {
            "OPENAI_API_KEY": "key-from-env",
            "OPENAI_BASE_URL": f"http://127.0.0.1:{loopback.closed_port()}/v1",
        }
        with LLMClient(
            "openai_compatible",
            "model-a",
            api_key="key-of-a",
            base_url=loopback.base_url(first) + "/team-a/v1",
            envelope=quiet_envelope(),
            env=env,
            fallbacks=[entry],
        ) as client:
            done = client.complete("hi") if mode == "sync" else asyncio.run(client.acomplete("hi"))
    assert done.text == "from the second"
    assert done.answered_by == "openai_compatible:model-b"
    assert [(s.path, s.headers["authorization"]) for s in first.seen] == [
        ("/team-a/v1/chat/completions", "Bearer key-of-a")
    ]
    assert [(s.path, s.headers["authorization"]) for s in second.seen] == [
        ("/team-b/v2/chat/completions", "Bearer key-of-b")
    ]
    assert second.seen[0].headers["x-team"] == "blue"
    assert "x-team" not in first.seen[0].headers  # an entry's headers are its own
    # Each entry keeps its own breaker and cooldown key: endpoint and key fingerprint differ.
    primary, fallback = (entry_["key"] for entry_ in client.health())
    assert primary != fallback
    assert "/team-b/v2" in fallback


def test_an_entry_with_a_key_uses_it_and_one_without_reads_its_own_providers(
    mock: respx.MockRouter,
) -> None:
    mock.post(OPENAI).respond(503, json={"error": {"message": "down"}})
    claude = mock.post(ANTHROPIC).respond(200, json=ANTHROPIC_OK)
    env = {"OPENAI_API_KEY": "sk-openai-env", "ANTHROPIC_API_KEY": "sk-ant-env"}
    for entry, sent in [
        (Fallback("anthropic", "claude-sonnet-4-6", api_key="sk-ant-mine"), "sk-ant-mine"),
        ({"provider": "anthropic", "model": "claude-sonnet-4-6"}, "sk-ant-env"),
        (("anthropic", "claude-sonnet-4-6"), "sk-ant-env"),
        ("anthropic:claude-sonnet-4-6", "sk-ant-env"),
    ]:
        client = LLMClient(
            "openai", "gpt-4o", envelope=quiet_envelope(), env=env, fallbacks=[entry]
        )
        assert client.complete("hi").answered_by == "anthropic:claude-sonnet-4-6"
        assert claude.calls.last.request.headers["x-api-key"] == sent
    # The primary's key is never an entry's: an entry's provider needs its own.
    with pytest.raises(ProviderError) as caught:
        LLMClient(
            "openai",
            "gpt-4o",
            api_key=SECRET,
            env={},
            fallbacks=[Fallback("anthropic", "claude-sonnet-4-6")],
        )
    assert caught.value.code == "llm.auth"
    assert caught.value.details["variable"] == "ANTHROPIC_API_KEY"
    assert caught.value.details["entry"] == "anthropic:claude-sonnet-4-6"
    assert SECRET not in str(caught.value)
    assert SECRET not in repr(caught.value.to_dict())


def test_an_entrys_timeout_and_options_are_its_own(mock: respx.MockRouter) -> None:
    mock.post(OPENAI).respond(503, json={"error": {"message": "down"}})
    claude = mock.post(ANTHROPIC).respond(200, json=ANTHROPIC_OK)
    env = {"OPENAI_API_KEY": "sk-openai-env", "ANTHROPIC_API_KEY": "sk-ant-env"}
    client = LLMClient(
        "openai",
        "gpt-4o",
        envelope=quiet_envelope(),
        env=env,
        fallbacks=[
            Fallback(
                "anthropic",
                "claude-sonnet-4-6",
                timeout=7,
                options={"max_output_tokens": 77, "system": "be brief"},
            )
        ],
    )
    assert client.config.timeout == 120.0
    assert client.fallbacks[0].config.timeout == 7.0
    client.complete("hi", max_output_tokens=500)
    primary = json.loads(mock.calls[0].request.content)
    fallback = json.loads(claude.calls.last.request.content)
    assert primary.get("max_completion_tokens", primary.get("max_tokens")) == 500
    assert "be brief" not in json.dumps(primary)
    assert fallback["max_tokens"] == 77  # the entry's option wins on the entry
    assert fallback["system"] == "be brief"


def test_two_servers_of_one_model_are_told_apart_by_their_endpoints(
    mock: respx.MockRouter,
) -> None:
    mock.post("http://gpu-a.internal:8000/v1/chat/completions").respond(503, json={})
    mock.post("http://gpu-b.internal:8000/v1/chat/completions").respond(
        200, json={"choices": [{"message": {"content": "b"}, "finish_reason": "stop"}]}
    )
    client = LLMClient(
        "vllm",
        "llama-3.3-70b",
        base_url="http://gpu-a.internal:8000/v1",
        envelope=quiet_envelope(),
        env={},
        fallbacks=[Fallback("vllm", "llama-3.3-70b", base_url="http://gpu-b.internal:8000/v1")],
    )
    done = client.complete("hi")
    assert done.answered_by == "vllm:llama-3.3-70b@http://gpu-b.internal:8000/v1"
    assert [e["entry"] for e in done.fallback_errors] == [
        "vllm:llama-3.3-70b@http://gpu-a.internal:8000/v1"
    ]
    assert [h["entry"] for h in client.health()] == [
        "vllm:llama-3.3-70b@http://gpu-a.internal:8000/v1",
        "vllm:llama-3.3-70b@http://gpu-b.internal:8000/v1",
    ]


# -- bad entries -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ({"provider": "openai", "model": "gpt-4o", "api_key": SECRET, "temprature": 1}, "key"),
        ({"provider": "openai", "model": "gpt-4o", "api_key": SECRET, "timeout": "30"}, "timeout"),
        ({"provider": "bogus", "model": "m", "api_key": SECRET}, "unknown provider"),
        ({"provider": "openai", "model": " ", "api_key": SECRET}, "model"),
        ({"provider": "openai", "api_key": SECRET}, "model"),
        ({"provider": "openai", "model": "gpt-4o", "api_key": 12345}, "api_key"),
        ({"provider": "openai", "model": "gpt-4o", "api_key": SECRET, "headers": ["x"]}, "headers"),
        (
            {"provider": "openai", "model": "gpt-4o", "headers": {"authorization": SECRET + "\n"}},
            "header",
        ),
        (
            {"provider": "openai", "model": "gpt-4o", "api_key": SECRET, "options": {"tempo": 1}},
            "option",
        ),
        (("openai", ""), "model"),
        ("openai", "provider:model"),
        (42, "int"),
    ],
)
def test_a_bad_entry_is_not_configured_naming_fallbacks_and_the_entry(
    entry: Any, says: str
) -> None:
    env = {"OPENAI_API_KEY": "sk-openai-env"}
    with pytest.raises(ProviderError) as caught:
        LLMClient("openai", "gpt-4o", env=env, fallbacks=[("openai", "gpt-4o-mini"), entry])
    error = caught.value
    assert error.code == "llm.not_configured"
    assert "fallbacks=[1]" in error.message
    assert says in error.message
    assert error.details["argument"] == "fallbacks="
    assert error.details["entry"].startswith("fallbacks=[1]")
    for shown in (str(error), repr(error), json.dumps(error.to_dict())):
        assert SECRET not in shown


@pytest.mark.parametrize(
    "bad",
    [
        {"provider": "nope", "model": "m"},
        {"provider": "openai", "model": ""},
        {"provider": "openai", "model": "m", "timeout": -1},
        {"provider": "openai", "model": "m", "idle_timeout": float("nan")},
        {"provider": "openai", "model": "m", "connect_timeout": True},
        {"provider": "openai", "model": "m", "options": ["max_output_tokens"]},
    ],
)
def test_a_bad_fallback_object_is_refused_when_made(bad: dict[str, Any]) -> None:
    with pytest.raises(ProviderError) as caught:
        Fallback(**bad, api_key=SECRET)
    assert caught.value.code == "llm.not_configured"
    assert "fallbacks=" in caught.value.message
    assert SECRET not in str(caught.value)


def test_an_unusable_url_or_key_of_an_entry_names_the_entry() -> None:
    env = {"OPENAI_API_KEY": "sk-openai-env"}
    with pytest.raises(ProviderError) as caught:
        LLMClient(
            "openai",
            "gpt-4o",
            env=env,
            fallbacks=[Fallback("openai", "gpt-4o-mini", base_url="ftp://x", api_key=SECRET)],
        )
    assert caught.value.code == "llm.bad_endpoint"
    assert "fallback entry openai:gpt-4o-mini of fallbacks=" in caught.value.message
    assert SECRET not in str(caught.value)
    with pytest.raises(ProviderError) as caught:
        LLMClient(
            "openai",
            "gpt-4o",
            env=env,
            fallbacks=[Fallback("openai", "gpt-4o-mini", api_key=SECRET + "\n x")],
        )
    assert "fallback entry openai:gpt-4o-mini" in caught.value.message
    assert "SECRETKEY" not in str(caught.value)
    assert "SECRETKEY" not in repr(caught.value)


def test_the_environments_entries_still_name_the_variable() -> None:
    with pytest.raises(ProviderError) as caught:
        LLMClient("openai", "gpt-4o", env={"OPENAI_API_KEY": "k", "FLUID_LLM_FALLBACKS": "x:"})
    assert caught.value.code == "llm.not_configured"
    assert caught.value.details["variable"] == "FLUID_LLM_FALLBACKS"
    assert "FLUID_LLM_FALLBACKS" in caught.value.message


# -- the value object ------------------------------------------------------------------------


def test_a_fallback_never_shows_its_key_or_header_values_and_pickles_cleanly() -> None:
    entry = Fallback(
        "OpenAI_Compatible",
        " llama-3.3 ",
        base_url="http://10.0.0.5:8000/v1",
        api_key=SECRET,
        timeout=30,
        headers={"Authorization": "Bearer hdr-SECRET-value", "x-team": "blue"},
        options={"max_output_tokens": 64},
    )
    assert (entry.provider, entry.model, entry.timeout) == ("openai_compatible", "llama-3.3", 30.0)
    shown = repr(entry) + str(entry)
    assert SECRET not in shown
    assert "hdr-SECRET-value" not in shown
    assert "api_key=<set>" in shown
    assert "Authorization" in shown
    for twin in (
        pickle.loads(pickle.dumps(entry)),  # noqa: S301 - our own bytes
        copy.copy(entry),
        copy.deepcopy(entry),
    ):
        assert twin == entry
        assert twin.api_key == SECRET
        assert hash(twin) == hash(entry)
    with pytest.raises(AttributeError):
        entry.api_key = "other"  # type: ignore[misc]


def test_a_client_keeps_a_credential_header_of_an_entry_out_of_its_errors(
    mock: respx.MockRouter,
) -> None:
    mock.post(OPENAI).respond(
        400, json={"error": {"message": "bad header hdr-SECRET-value in your request"}}
    )
    client = LLMClient(
        "openai",
        "gpt-4o",
        envelope=quiet_envelope(),
        env={"OPENAI_API_KEY": "sk-openai-env"},
        headers={"api-key": "hdr-SECRET-value"},
    )
    with pytest.raises(ProviderError) as caught:
        client.complete("hi")
    assert mock.calls.last.request.headers["api-key"] == "hdr-SECRET-value"
    assert "hdr-SECRET-value" not in str(caught.value)
    assert "hdr-SECRET-value" not in json.dumps(caught.value.to_dict())


def test_phase_limits_of_an_entry_are_passed_on_only_when_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An entry's connect / first-token / idle limits become its client's arguments of the
    same names, and only when set (the client's own defaults otherwise)."""
    made: list[dict[str, Any]] = []
    phases = ("connect_timeout", "first_token_timeout", "idle_timeout")
    init = LLMClient.__init__

    def recording(self: LLMClient, *args: Any, **kwargs: Any) -> None:
        made.append({k: v for k, v in kwargs.items() if k in phases})
        # Whether or not this client takes them yet, the entry's values are what was passed.
        if "connect_timeout" not in init.__code__.co_varnames:
            kwargs = {k: v for k, v in kwargs.items() if k not in phases}
        init(self, *args, **kwargs)

    monkeypatch.setattr(LLMClient, "__init__", recording)
    LLMClient(
        "openai",
        "gpt-4o",
        env={"OPENAI_API_KEY": "k"},
        fallbacks=[
            Fallback("openai", "gpt-4o-mini", connect_timeout=2, idle_timeout=15.5),
            Fallback("openai", "gpt-4.1-mini", first_token_timeout=600),
            ("openai", "gpt-4.1"),
        ],
    )
    assert made == [
        {},
        {"connect_timeout": 2.0, "idle_timeout": 15.5},
        {"first_token_timeout": 600.0},
        {},
    ]


def test_a_header_of_the_client_is_checked() -> None:
    with pytest.raises(ProviderError) as caught:
        LLMClient("openai", "gpt-4o", env={"OPENAI_API_KEY": "k"}, headers={"x-a": "b\r\nc"})
    assert caught.value.code == "llm.not_configured"
    assert caught.value.details["argument"] == "headers="


@pytest.mark.parametrize("kind", ["complete", "stream"])
def test_an_entrys_own_first_token_limit_is_the_one_applied(kind: str) -> None:
    """A Fallback's ``first_token_timeout`` bounds that entry on a real socket: the middle
    entry thinks for 0.6 s; its own 0.15 s limit gives it up for the next entry, though
    the client and the environment would wait 30 s for it."""
    from tests.chaos_server import chaos_server

    models = {"primary": "503", "thinker": "slow_first_token", "healthy": "ok"}
    with chaos_server(weights={"ok": 1}, models=models, slow=0.6) as server:
        env = {
            "OPENAI_API_KEY": "sk-entry-limit",
            "OPENAI_BASE_URL": server.base_url,
            "FLUID_LLM_FIRST_TOKEN_TIMEOUT_SECONDS": "30",
        }
        envelope = RetryEnvelope(
            RetryPolicy(attempts=1), sleep=lambda s: None, hook=lambda event: None
        )
        client = LLMClient(
            "openai",
            "primary",
            env=env,
            envelope=envelope,
            first_token_timeout=30,
            fallbacks=[
                Fallback(
                    "openai",
                    "thinker",
                    base_url=server.base_url,
                    api_key="sk-entry-limit",
                    first_token_timeout=0.15,
                ),
                Fallback("openai", "healthy", base_url=server.base_url, api_key="sk-entry-limit"),
            ],
        )
        with client:
            if kind == "complete":
                done = client.complete("hi")
            else:
                done = [e for e in client.stream("hi") if e.type == "done"][-1].completion
        seen = [request.model for request in server.snapshot()]
    assert done is not None
    assert done.answered_by == "openai:healthy"
    thinker = [r for r in done.fallback_errors if r["entry"] == "openai:thinker"]
    assert [r["code"] for r in thinker] == ["llm.timeout"]
    assert seen == ["primary", "thinker", "healthy"]
