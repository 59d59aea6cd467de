"""The OpenAI-compatible presets: xai, deepseek, together, fireworks, cerebras.

Each is the openai_compatible adapter on its provider's endpoint with its own
key variable: where a call goes and with which key, what a missing key or model
says, ``base_url=`` overriding the endpoint, DeepSeek's ``reasoning_content``
never being answer text (in an answer and in a stream), and ``fluid doctor``
showing each (through the installed console script, in a fresh HOME).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from fluid_build.copilot import LLMClient, StreamEvent
from fluid_build.copilot.agents.errors import ProviderAuthError, ProviderError
from fluid_build.copilot.call.capabilities import (
    UNKNOWN_CONTEXT_WINDOW,
    UNKNOWN_MAX_OUTPUT,
    capabilities_for,
    models_with_larger_window,
    run_start_warnings,
)
from fluid_build.copilot.call.prices import known_price
from fluid_build.copilot.llm.settings import resolve_provider_config
from tests.fakes import FakeClock, clocked_envelope
from tests.test_cli_conventions import fluid, fresh_env

PRESETS = {
    "xai": ("https://api.x.ai/v1", "XAI_API_KEY", "grok-4"),
    "deepseek": ("https://api.deepseek.com", "DEEPSEEK_API_KEY", "deepseek-chat"),
    "together": (
        "https://api.together.xyz/v1",
        "TOGETHER_API_KEY",
        "meta-llama/Llama-3.3-70B-Instruct-Turbo",
    ),
    "fireworks": (
        "https://api.fireworks.ai/inference/v1",
        "FIREWORKS_API_KEY",
        "accounts/fireworks/models/llama-v3p3-70b-instruct",
    ),
    "cerebras": ("https://api.cerebras.ai/v1", "CEREBRAS_API_KEY", "llama-3.3-70b"),
}
KEY = "sk-preset-0123456789abcdef"
ANSWER = {
    "choices": [{"message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 5, "completion_tokens": 1},
}


def _client(provider: str, env: dict[str, str], http: httpx.Client, **kw: Any) -> LLMClient:
    return LLMClient(
        provider,
        kw.pop("model", "some-model"),
        envelope=clocked_envelope(FakeClock()),
        env=env,
        http_client=http,
        **kw,
    )


@pytest.mark.parametrize("provider", sorted(PRESETS))
def test_a_preset_sends_to_its_endpoint_with_its_key(provider: str) -> None:
    base, variable, _ = PRESETS[provider]
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=ANSWER)

    with httpx.Client(transport=httpx.MockTransport(answer)) as http:
        done = _client(provider, {variable: KEY}, http).complete("hi")
    assert done.text == "ok"
    assert str(seen[0].url) == f"{base}/chat/completions"
    assert seen[0].headers["authorization"] == f"Bearer {KEY}"
    body = json.loads(seen[0].content)
    assert body["model"] == "some-model"


@pytest.mark.parametrize("provider", sorted(PRESETS))
def test_a_missing_key_names_the_presets_variable(provider: str) -> None:
    _, variable, _ = PRESETS[provider]
    with pytest.raises(ProviderAuthError) as caught:
        resolve_provider_config(provider, model="m", env={"OPENAI_API_KEY": "sk-other"})
    message = caught.value.message
    assert f"no API key for {provider}: set {variable}" in message
    assert f"fluid ai setup --provider {provider}" in message
    assert caught.value.details["variable"] == variable


@pytest.mark.parametrize("provider", sorted(PRESETS))
def test_a_missing_model_shows_a_model_of_that_provider(provider: str) -> None:
    _, variable, example = PRESETS[provider]
    with pytest.raises(ProviderError) as caught:
        resolve_provider_config(provider, env={variable: KEY})
    assert caught.value.code == "llm.not_configured"
    assert f"FLUID_LLM_MODEL={example}" in caught.value.message


@pytest.mark.parametrize("provider", sorted(PRESETS))
def test_base_url_overrides_the_presets_endpoint(provider: str) -> None:
    _, variable, _ = PRESETS[provider]
    config = resolve_provider_config(
        provider, model="m", base_url="https://gateway.example/v1", env={variable: KEY}
    )
    assert (config.base_url, config.api_key) == ("https://gateway.example/v1", KEY)


@pytest.mark.parametrize(
    ("provider", "model"),
    [
        ("xai", "grok-3"),
        ("deepseek", "deepseek-chat"),
        ("together", "meta-llama/Llama-3.3-70B-Instruct-Turbo"),
        ("fireworks", "accounts/fireworks/models/deepseek-v3p2"),
        ("cerebras", "llama3.1-8b"),
    ],
)
def test_presets_are_priced_by_genai_prices(provider: str, model: str) -> None:
    assert known_price(provider, model)


# -- DeepSeek's reasoning_content ---------------------------------------------------------


def _deepseek_chunk(**delta: Any) -> dict[str, Any]:
    # The chunk shape of deepseek-reasoner's stream (pydantic/pydantic-ai
    # tests/models/cassettes/test_deepseek/test_deepseek_model_thinking_stream.yaml):
    # reasoning_content deltas first, with content null, then content deltas.
    return {
        "id": "a1",
        "object": "chat.completion.chunk",
        "created": 1745330951,
        "model": "deepseek-reasoner",
        "system_fingerprint": "fp_5417b77867_prod0225",
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}],
    }


def test_deepseek_reasoning_content_deltas_are_not_text() -> None:
    chunks = [
        _deepseek_chunk(role="assistant", content=None, reasoning_content=""),
        _deepseek_chunk(content=None, reasoning_content="Okay, the user"),
        _deepseek_chunk(content=None, reasoning_content=" asks about streets."),
        _deepseek_chunk(content="Look both", reasoning_content=None),
        _deepseek_chunk(content=" ways.", reasoning_content=None),
        {
            **_deepseek_chunk(content="", reasoning_content=None),
            "choices": [
                {"index": 0, "delta": {"content": ""}, "logprobs": None, "finish_reason": "stop"}
            ],
            "usage": {
                "prompt_tokens": 12,
                "completion_tokens": 40,
                "completion_tokens_details": {"reasoning_tokens": 30},
            },
        },
    ]
    wire = "".join(f"data: {json.dumps(chunk)}\n\n" for chunk in chunks) + "data: [DONE]\n\n"

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=wire)

    with httpx.Client(transport=httpx.MockTransport(answer)) as http:
        client = _client("deepseek", {"DEEPSEEK_API_KEY": KEY}, http, model="deepseek-reasoner")
        events: list[StreamEvent] = list(client.stream("How do I cross the street?"))
    assert [e.text for e in events if e.type == "text"] == ["Look both", " ways."]
    done = events[-1].completion
    assert done is not None
    assert done.text == "Look both ways."
    assert (done.usage.output_tokens, done.usage.reasoning_tokens) == (40, 30)


# -- the CLI ------------------------------------------------------------------------------


def test_fluid_doctor_shows_each_preset_and_where_its_key_came_from(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    env = fresh_env(home, **{variable: KEY for _, variable, _ in PRESETS.values()})
    result = fluid(home, "doctor", "--json", env=env)
    assert KEY not in result.stdout + result.stderr
    rows = {row["name"]: row for row in json.loads(result.stdout)["providers"]}
    for provider, (base, variable, _) in PRESETS.items():
        row = rows[provider]
        assert row["adapter"] == "openai_compatible"
        assert row["base_url"] == base
        assert (row["key"]["present"], row["key"]["source"]) == (True, variable)


# -- the capability matrix ----------------------------------------------------------------

# (provider, model as a user names it, window, max output, tools, strict schema, JSON mode)
PRESET_ROWS = [
    # api-docs.deepseek.com/quick_start/pricing
    ("deepseek", "deepseek-chat", 128_000, 8_192, True, False, True),
    ("deepseek", "deepseek-reasoner", 128_000, 65_536, True, False, True),
    # docs.x.ai/docs/models
    ("xai", "grok-4", 256_000, 256_000, True, True, True),
    ("xai", "grok-4-0709", 256_000, 256_000, True, True, True),
    ("xai", "grok-code-fast-1", 256_000, 256_000, True, True, True),
    ("xai", "grok-3", 131_072, 131_072, True, True, True),
    ("xai", "grok-3-mini", 131_072, 131_072, True, True, True),
    ("xai", "grok-3-mini-fast", 131_072, 131_072, True, True, True),
    # docs.together.ai/docs/chat-models; Together's ids are mixed case
    ("together", "meta-llama/Llama-3.3-70B-Instruct-Turbo", 131_072, 131_072, True, False, True),
]


@pytest.mark.parametrize(
    ("provider", "model", "window", "output", "tools", "strict", "json_mode"), PRESET_ROWS
)
def test_a_presets_main_models_are_in_the_capability_matrix(
    provider: str,
    model: str,
    window: int,
    output: int,
    tools: bool,
    strict: bool,
    json_mode: bool,
) -> None:
    caps = capabilities_for(provider, model)
    assert caps.known
    assert (caps.provider, caps.model) == (provider, model)
    assert (caps.context_window, caps.max_output_tokens, caps.max_input_tokens) == (
        window,
        output,
        None,
    )
    assert (caps.tools, caps.strict_schema, caps.json_mode) == (tools, strict, json_mode)
    # No tokenizer of theirs is bundled: estimated with a margin, never counted as OpenAI's.
    assert caps.tokenizer == "llama"
    assert run_start_warnings(caps, uses_tools=True, wants_strict_schema=strict) == []


@pytest.mark.parametrize(
    ("provider", "model"),
    [
        ("xai", "grok-9-ultra"),
        ("deepseek", "deepseek-coder-v9"),
        ("together", "Qwen/Qwen9-Giant"),
        ("fireworks", "accounts/fireworks/models/llama-v3p3-70b-instruct"),
        ("cerebras", "llama-3.3-70b"),
        # A preset's model under another preset is not that preset's row.
        ("together", "deepseek-chat"),
    ],
)
def test_an_unknown_model_under_a_preset_gets_the_conservative_default(
    provider: str, model: str
) -> None:
    caps = capabilities_for(provider, model)
    assert not caps.known
    assert (caps.context_window, caps.max_output_tokens) == (
        UNKNOWN_CONTEXT_WINDOW,
        UNKNOWN_MAX_OUTPUT,
    )
    assert (caps.tools, caps.strict_schema, caps.json_mode) == (False, False, False)
    [warning] = run_start_warnings(caps)
    assert f"{provider}:{model} is not in the capability matrix" in warning


def test_a_presets_models_are_suggested_only_to_that_preset() -> None:
    # A larger window on another provider's preset needs another key: not offered to
    # an OpenAI run, but offered to a run of the same preset.
    everywhere = " ".join(models_with_larger_window(0, limit=100))
    for section in ("xai:", "deepseek:", "together:"):
        assert section not in everywhere
    assert models_with_larger_window(131_072, provider="xai") == ["xai:grok-4 (256,000)"]
    assert models_with_larger_window(100_000, provider="deepseek") == [
        "deepseek:deepseek-chat (128,000)"
    ]
