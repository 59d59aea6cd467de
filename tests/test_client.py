"""LLMClient through respx: each adapter's request shape, answer parsing, errors and streams."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pydantic
import pytest
import respx

from fluid_build.copilot import Completion, LLMClient, StreamEvent, ToolSpec
from fluid_build.copilot.agents.errors import (
    ContextOverflowError,
    ProviderAuthError,
    ProviderError,
    ProviderServerError,
    RateLimitError,
    SchemaValidationError,
)
from fluid_build.copilot.call.envelope import RetryEnvelope
from fluid_build.copilot.health.cooldown import MemoryCooldownStore
from tests.fakes import FakeClock

KEY = "sk-proj-TESTKEY0123456789abcdef"
WEATHER = ToolSpec(
    "get_weather",
    "The weather in a city",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)


class Plan(pydantic.BaseModel):
    name: str
    steps: list[str]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def make(provider: str, clock: FakeClock, **kwargs: Any) -> LLMClient:
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


@pytest.fixture
def mock() -> Iterator[respx.MockRouter]:
    with respx.mock(assert_all_called=False) as router:
        yield router


def sent_json(route: respx.Route, n: int = -1) -> Any:
    return json.loads(route.calls[n].request.content)


def sse(*events: Any, done: bool = False, named: bool = False) -> bytes:
    out = []
    for event in events:
        if named:
            out.append(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n")
        else:
            out.append(f"data: {json.dumps(event)}\n\n")
    if done:
        out.append("data: [DONE]\n\n")
    return "".join(out).encode()


# -- OpenAI ------------------------------------------------------------------------------

OPENAI_OK = {
    "id": "chatcmpl-1",
    "model": "gpt-4o-2024-08-06",
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                    }
                ],
            },
            "finish_reason": "tool_calls",
        }
    ],
    "usage": {"prompt_tokens": 21, "completion_tokens": 9, "total_tokens": 30},
}


def test_openai_request_shape_and_tool_calls(mock: respx.MockRouter, clock: FakeClock) -> None:
    route = mock.post("https://api.openai.com/v1/chat/completions").respond(
        200, json=OPENAI_OK, headers={"x-request-id": "req_abc"}
    )
    client = make("openai", clock, model="gpt-4o", api_key=KEY)
    done = client.complete(
        "Weather in Oslo?", system="Be brief.", tools=[WEATHER], max_output_tokens=100
    )
    request = route.calls[0].request
    assert request.headers["authorization"] == f"Bearer {KEY}"
    body = sent_json(route)
    assert body["model"] == "gpt-4o"
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Oslo?"},
    ]
    assert body["tools"] == [{"type": "function", "function": WEATHER.as_dict()}]
    assert body["max_completion_tokens"] == 100
    assert done.tool_calls[0].name == "get_weather"
    assert done.tool_calls[0].arguments == {"city": "Oslo"}
    assert (done.usage.input_tokens, done.usage.output_tokens, done.usage.total_tokens) == (
        21,
        9,
        30,
    )
    assert (done.request_id, done.attempts, done.finish_reason) == ("req_abc", 1, "tool_calls")
    assert done.model == "gpt-4o-2024-08-06"


def test_openai_response_model_is_validated(mock: respx.MockRouter, clock: FakeClock) -> None:
    answer = {"choices": [{"message": {"content": '{"name": "p", "steps": ["a", "b"]}'}}]}
    route = mock.post("https://api.openai.com/v1/chat/completions").respond(200, json=answer)
    done = make("openai", clock, api_key=KEY).complete("plan", response_model=Plan)
    assert done.parsed == Plan(name="p", steps=["a", "b"])
    fmt = sent_json(route)["response_format"]
    assert fmt["type"] == "json_schema"
    assert fmt["json_schema"]["name"] == "Plan"
    assert fmt["json_schema"]["strict"] is False
    assert fmt["json_schema"]["schema"] == Plan.model_json_schema()


def test_openai_strict_schema_mode_hardens_and_decodes(
    mock: respx.MockRouter, clock: FakeClock
) -> None:
    class Output(pydantic.BaseModel):
        contract: dict[str, Any]
        note: str | None = None

    answer = {
        "choices": [
            {
                "message": {
                    "content": json.dumps(
                        {"contract": json.dumps({"a": {"b": [1, 2]}}), "note": None}
                    )
                }
            }
        ]
    }
    route = mock.post("https://api.openai.com/v1/chat/completions").respond(200, json=answer)
    client = make("openai", clock, api_key=KEY, env={"FLUID_OPENAI_STRICT_SCHEMA": "1"})
    done = client.complete("x", response_model=Output)
    schema = sent_json(route)["response_format"]["json_schema"]
    assert schema["strict"] is True
    assert schema["schema"]["additionalProperties"] is False
    assert sorted(schema["schema"]["required"]) == ["contract", "note"]
    assert done.parsed == Output(contract={"a": {"b": [1, 2]}})


@pytest.mark.parametrize(
    ("content", "code"),
    [("not json at all", "llm.parse_error"), ('{"name": 3}', "llm.schema_violation")],
)
def test_bad_output_is_a_schema_validation_error(
    mock: respx.MockRouter, clock: FakeClock, content: str, code: str
) -> None:
    mock.post("https://api.openai.com/v1/chat/completions").respond(
        200, json={"choices": [{"message": {"content": content}}]}
    )
    with pytest.raises(SchemaValidationError) as caught:
        make("openai", clock, api_key=KEY).complete("plan", response_model=Plan)
    error = caught.value
    assert error.code == code
    assert error.schema_name == "Plan"
    assert error.raw_output == content
    assert error.validation_errors


def test_retry_after_then_success_counts_attempts(mock: respx.MockRouter, clock: FakeClock) -> None:
    route = mock.post("https://api.openai.com/v1/chat/completions")
    route.side_effect = [
        httpx.Response(
            429, json={"error": {"message": "Rate limit reached"}}, headers={"retry-after": "7"}
        ),
        httpx.Response(200, json=OPENAI_OK),
    ]
    done = make("openai", clock, api_key=KEY).complete("hi")
    assert done.attempts == 2
    assert clock.waits == [7.0]


@pytest.mark.parametrize(
    ("status", "body", "cls", "calls"),
    [
        (
            401,
            {"error": {"message": f"Incorrect API key provided: {KEY}", "code": "invalid_api_key"}},
            ProviderAuthError,
            1,
        ),
        (
            400,
            {
                "error": {
                    "message": "This model's maximum context length is 128000 tokens.",
                    "code": "context_length_exceeded",
                }
            },
            ContextOverflowError,
            1,
        ),
        (503, {"error": {"message": "overloaded"}}, ProviderServerError, 3),
    ],
)
def test_errors_arrive_typed(
    mock: respx.MockRouter, clock: FakeClock, status: int, body: Any, cls: type, calls: int
) -> None:
    route = mock.post("https://api.openai.com/v1/chat/completions").respond(status, json=body)
    with pytest.raises(cls) as caught:
        make("openai", clock, api_key=KEY).complete("hi")
    assert route.call_count == calls
    assert KEY not in str(caught.value) + repr(caught.value) + json.dumps(caught.value.to_dict())


def test_a_200_that_is_not_a_completion_is_malformed(
    mock: respx.MockRouter, clock: FakeClock
) -> None:
    route = mock.post("https://api.openai.com/v1/chat/completions")
    route.side_effect = [
        httpx.Response(200, text="<html>captive portal</html>"),
        httpx.Response(200, json=[1, 2]),
        httpx.Response(200, json={"choices": "nope"}),
    ]
    with pytest.raises(ProviderError) as caught:
        make("openai", clock, api_key=KEY).complete("hi")
    assert caught.value.code == "llm.malformed_response"
    assert route.call_count == 3


def test_async_complete(mock: respx.MockRouter, clock: FakeClock) -> None:
    mock.post("https://api.openai.com/v1/chat/completions").respond(200, json=OPENAI_OK)

    async def go() -> Completion:
        async with make("openai", clock, api_key=KEY) as client:
            return await client.acomplete("hi", tools=[WEATHER])

    assert asyncio.run(go()).tool_calls[0].arguments == {"city": "Oslo"}


# -- Azure, compatible servers ---------------------------------------------------------------


def test_azure_deployment_url_and_api_key_header(mock: respx.MockRouter, clock: FakeClock) -> None:
    route = mock.post(
        "https://res.openai.azure.com/openai/deployments/gpt4o-prod/chat/completions",
        params={"api-version": "2024-10-21"},
    ).respond(200, json=OPENAI_OK)
    client = make(
        "azure",
        clock,
        env={
            "AZURE_OPENAI_API_KEY": KEY,
            "AZURE_OPENAI_ENDPOINT": "https://res.openai.azure.com",
            "FLUID_LLM_MODEL": "gpt4o-prod",
        },
    )
    client.complete("hi")
    request = route.calls[0].request
    assert request.headers["api-key"] == KEY
    assert "authorization" not in request.headers


def test_openai_compatible_by_base_url(mock: respx.MockRouter, clock: FakeClock) -> None:
    route = mock.post("http://127.0.0.1:8000/v1/chat/completions").respond(200, json=OPENAI_OK)
    client = make(
        "openai",
        clock,
        model="Qwen/Qwen3-8B",
        env={"OPENAI_BASE_URL": "http://127.0.0.1:8000/v1", "OPENAI_API_KEY": "local"},
    )
    client.complete("hi", max_output_tokens=50)
    assert sent_json(route)["max_completion_tokens"] == 50
    vllm = make("vllm", clock, model="Qwen/Qwen3-8B", base_url="http://127.0.0.1:8000/v1")
    vllm.complete("hi", max_output_tokens=50)
    body = sent_json(route)
    assert body["max_tokens"] == 50
    assert "authorization" not in route.calls[-1].request.headers


def test_groq_has_a_known_home(mock: respx.MockRouter, clock: FakeClock) -> None:
    route = mock.post("https://api.groq.com/openai/v1/chat/completions").respond(
        200, json=OPENAI_OK
    )
    make("groq", clock, model="llama-3.3-70b-versatile", env={"GROQ_API_KEY": "gsk_x"}).complete(
        "hi"
    )
    assert route.calls[0].request.headers["authorization"] == "Bearer gsk_x"


# -- Anthropic ---------------------------------------------------------------------------------

ANTHROPIC_TOOL = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": "claude-sonnet-4-6",
    "content": [
        {"type": "text", "text": "Let me check."},
        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}},
    ],
    "stop_reason": "tool_use",
    "usage": {"input_tokens": 30, "output_tokens": 12},
}


def test_anthropic_request_shape_and_tool_use(mock: respx.MockRouter, clock: FakeClock) -> None:
    route = mock.post("https://api.anthropic.com/v1/messages").respond(
        200, json=ANTHROPIC_TOOL, headers={"request-id": "req_01"}
    )
    client = make("anthropic", clock, api_key=KEY)
    history = [
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "toolu_0", "name": "get_weather", "arguments": {"city": "Rome"}}],
        },
        {"role": "tool", "tool_call_id": "toolu_0", "name": "get_weather", "content": "sunny"},
        {"role": "user", "content": "And Oslo?"},
    ]
    done = client.complete(history, system="Be brief.", tools=[WEATHER])
    request = route.calls[0].request
    assert request.headers["x-api-key"] == KEY
    assert request.headers["anthropic-version"] == "2023-06-01"
    body = sent_json(route)
    assert body["system"] == "Be brief."
    assert body["max_tokens"] == 4096
    assert body["tools"] == [
        {
            "name": "get_weather",
            "description": "The weather in a city",
            "input_schema": dict(WEATHER.parameters),
        }
    ]
    assert body["messages"][1]["content"][0]["type"] == "tool_use"
    assert body["messages"][2] == {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "toolu_0", "content": "sunny"}],
    }
    assert done.text == "Let me check."
    assert done.tool_calls[0].arguments == {"city": "Oslo"}
    assert (done.usage.input_tokens, done.usage.output_tokens) == (30, 12)
    assert done.request_id == "req_01"


def test_anthropic_structured_output_through_a_forced_tool(
    mock: respx.MockRouter, clock: FakeClock
) -> None:
    answer = {
        **ANTHROPIC_TOOL,
        "content": [
            {
                "type": "tool_use",
                "id": "t",
                "name": "respond_Plan",
                "input": {"name": "p", "steps": []},
            }
        ],
    }
    route = mock.post("https://api.anthropic.com/v1/messages").respond(200, json=answer)
    done = make("anthropic", clock, api_key=KEY).complete("plan", response_model=Plan)
    assert done.parsed == Plan(name="p", steps=[])
    assert done.tool_calls == []
    assert sent_json(route)["tool_choice"] == {"type": "tool", "name": "respond_Plan"}


def test_anthropic_529_is_retried_then_typed(mock: respx.MockRouter, clock: FakeClock) -> None:
    overloaded = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    route = mock.post("https://api.anthropic.com/v1/messages").respond(529, json=overloaded)
    with pytest.raises(ProviderServerError) as caught:
        make("anthropic", clock, api_key=KEY).complete("hi")
    assert caught.value.code == "llm.overloaded"
    assert route.call_count == 3
    assert clock.waits == [1.0, 2.0]


# -- Gemini ------------------------------------------------------------------------------------

GEMINI_OK = {
    "candidates": [
        {
            "content": {
                "role": "model",
                "parts": [
                    {"text": "Checking. "},
                    {"functionCall": {"name": "get_weather", "args": {"city": "Oslo"}}},
                ],
            },
            "finishReason": "STOP",
        }
    ],
    "usageMetadata": {"promptTokenCount": 11, "candidatesTokenCount": 5},
    "modelVersion": "gemini-2.5-flash",
}


def test_gemini_request_shape_and_function_calls(mock: respx.MockRouter, clock: FakeClock) -> None:
    gemini_key = "AIzaSyTESTTESTTESTTESTTESTTESTTESTTES"
    route = mock.post(
        "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash:generateContent"
    ).respond(200, json=GEMINI_OK)
    client = make("gemini", clock, env={"GEMINI_API_KEY": gemini_key})
    done = client.complete("Weather?", system="Be brief.", tools=[WEATHER], response_model=None)
    request = route.calls[0].request
    assert request.headers["x-goog-api-key"] == gemini_key
    assert gemini_key not in str(request.url)
    body = sent_json(route)
    assert body["systemInstruction"] == {"parts": [{"text": "Be brief."}]}
    assert body["contents"] == [{"role": "user", "parts": [{"text": "Weather?"}]}]
    assert body["tools"][0]["functionDeclarations"][0]["name"] == "get_weather"
    assert done.text == "Checking. "
    assert done.tool_calls[0].arguments == {"city": "Oslo"}
    assert (done.usage.input_tokens, done.usage.output_tokens) == (11, 5)


def test_gemini_json_schema_and_safety_block(mock: respx.MockRouter, clock: FakeClock) -> None:
    route = mock.post(
        "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash:generateContent"
    )
    route.side_effect = [
        httpx.Response(
            200,
            json={
                "candidates": [{"content": {"parts": [{"text": '{"name": "p", "steps": ["x"]}'}]}}]
            },
        ),
        httpx.Response(200, json={"promptFeedback": {"blockReason": "SAFETY"}}),
    ]
    client = make("gemini", clock, env={"GOOGLE_API_KEY": "AIzaSyX-" + "x" * 31})
    assert client.complete("plan", response_model=Plan).parsed == Plan(name="p", steps=["x"])
    config = sent_json(route)["generationConfig"]
    assert config["responseMimeType"] == "application/json"
    assert config["responseJsonSchema"] == Plan.model_json_schema()
    with pytest.raises(ProviderError) as caught:
        client.complete("bad")
    assert caught.value.code == "llm.content_filtered"
    assert route.call_count == 2  # not retried


def test_gemini_quota_exhausted_fails_fast(mock: respx.MockRouter, clock: FakeClock) -> None:
    body = {
        "error": {
            "code": 429,
            "status": "RESOURCE_EXHAUSTED",
            "message": "quota",
            "details": [
                {
                    "@type": "type.googleapis.com/google.rpc.QuotaFailure",
                    "violations": [
                        {"quotaId": "GenerateRequestsPerDayPerProjectPerModel-FreeTier"}
                    ],
                }
            ],
        }
    }
    route = mock.post(url__regex=r".*generateContent$").respond(429, json=body)
    with pytest.raises(RateLimitError) as caught:
        make("gemini", clock, env={"GEMINI_API_KEY": "k" * 20}).complete("hi")
    assert caught.value.code == "llm.quota_exhausted"
    assert route.call_count == 1


# -- Ollama ------------------------------------------------------------------------------------


def test_ollama_local_chat(mock: respx.MockRouter, clock: FakeClock) -> None:
    answer = {
        "model": "llama3.1",
        "message": {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}],
        },
        "done": True,
        "done_reason": "stop",
        "prompt_eval_count": 40,
        "eval_count": 8,
    }
    route = mock.post("http://127.0.0.1:11434/api/chat").respond(200, json=answer)
    done = make("ollama", clock).complete("hi", tools=[WEATHER], response_model=None)
    body = sent_json(route)
    assert body["stream"] is False
    assert body["tools"][0]["function"]["name"] == "get_weather"
    assert done.tool_calls[0].arguments == {"city": "Oslo"}
    assert done.usage.total_tokens == 48


def test_ollama_model_missing(mock: respx.MockRouter, clock: FakeClock) -> None:
    mock.post("http://127.0.0.1:11434/api/chat").respond(
        404, json={"error": 'model "llama9" not found, try pulling it first'}
    )
    with pytest.raises(ProviderError) as caught:
        make("ollama", clock, model="llama9").complete("hi")
    assert caught.value.code == "llm.model_not_found"


# -- the pre-flight -------------------------------------------------------------------------


def test_an_overflowing_prompt_is_refused_before_any_request(
    mock: respx.MockRouter, clock: FakeClock
) -> None:
    route = mock.post("https://api.openai.com/v1/chat/completions").respond(200, json=OPENAI_OK)
    client = make(
        "openai", clock, model="gpt-4o", api_key=KEY, capability_matrix={"context_window": 8192}
    )
    with pytest.raises(ContextOverflowError) as caught:
        client.complete("word " * 20_000)
    assert route.call_count == 0
    assert caught.value.context_window == 8192
    assert caught.value.prompt_tokens is not None
    assert caught.value.prompt_tokens > 8192 - 4096


# -- streaming ---------------------------------------------------------------------------------


def collect(events: Iterator[StreamEvent]) -> tuple[str, list[StreamEvent], Completion | None]:
    seen = list(events)
    text = "".join(e.text for e in seen if e.type == "text")
    done = next((e.completion for e in seen if e.type == "done"), None)
    return text, seen, done


OPENAI_STREAM = sse(
    {"model": "gpt-4o", "choices": [{"delta": {"role": "assistant", "content": "Hel"}}]},
    {"choices": [{"delta": {"content": "lo"}}]},
    {
        "choices": [
            {
                "delta": {
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": "call_9",
                            "function": {"name": "get_weather", "arguments": '{"ci'},
                        }
                    ]
                }
            }
        ]
    },
    {
        "choices": [
            {"delta": {"tool_calls": [{"index": 0, "function": {"arguments": 'ty": "Oslo"}'}}]}}
        ]
    },
    {"choices": [{"delta": {}, "finish_reason": "tool_calls"}]},
    {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 7}},
    done=True,
)


def test_openai_stream(mock: respx.MockRouter, clock: FakeClock) -> None:
    route = mock.post("https://api.openai.com/v1/chat/completions").respond(
        200, content=OPENAI_STREAM, headers={"content-type": "text/event-stream"}
    )
    text, seen, done = collect(make("openai", clock, api_key=KEY).stream("hi", tools=[WEATHER]))
    assert text == "Hello"
    fragments = [e.arguments_delta for e in seen if e.type == "tool_call"]
    assert "".join(fragments) == '{"city": "Oslo"}'
    assert done is not None
    assert done.tool_calls[0].model_dump() == {
        "id": "call_9",
        "name": "get_weather",
        "arguments": {"city": "Oslo"},
    }
    assert (done.usage.input_tokens, done.usage.output_tokens) == (5, 7)
    assert sent_json(route)["stream"] is True


ANTHROPIC_STREAM = sse(
    {
        "type": "message_start",
        "message": {"model": "claude-sonnet-4-6", "usage": {"input_tokens": 9}},
    },
    {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi "}},
    {"type": "ping"},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "there"}},
    {"type": "content_block_stop", "index": 0},
    {
        "type": "content_block_start",
        "index": 1,
        "content_block": {"type": "tool_use", "id": "toolu_2", "name": "get_weather", "input": {}},
    },
    {
        "type": "content_block_delta",
        "index": 1,
        "delta": {"type": "input_json_delta", "partial_json": '{"city":'},
    },
    {
        "type": "content_block_delta",
        "index": 1,
        "delta": {"type": "input_json_delta", "partial_json": ' "Oslo"}'},
    },
    {"type": "content_block_stop", "index": 1},
    {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 15}},
    {"type": "message_stop"},
    named=True,
)


def test_anthropic_stream(mock: respx.MockRouter, clock: FakeClock) -> None:
    mock.post("https://api.anthropic.com/v1/messages").respond(
        200, content=ANTHROPIC_STREAM, headers={"content-type": "text/event-stream"}
    )
    text, _, done = collect(make("anthropic", clock, api_key=KEY).stream("hi", tools=[WEATHER]))
    assert text == "Hi there"
    assert done is not None
    assert done.tool_calls[0].arguments == {"city": "Oslo"}
    assert (done.usage.input_tokens, done.usage.output_tokens) == (9, 15)
    assert done.finish_reason == "tool_use"


ANTHROPIC_SERVER_TOOL_STREAM = sse(
    {
        "type": "message_start",
        "message": {
            "model": "claude-sonnet-4-6",
            "usage": {
                "input_tokens": 2,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
                "output_tokens": 1,
            },
        },
    },
    {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "thinking", "thinking": "", "signature": ""},
    },
    {
        "type": "content_block_delta",
        "index": 0,
        "delta": {"type": "thinking_delta", "thinking": "The user wants the weather."},
    },
    {
        "type": "content_block_delta",
        "index": 0,
        "delta": {"type": "signature_delta", "signature": "E"},
    },
    {"type": "content_block_stop", "index": 0},
    {
        "type": "content_block_start",
        "index": 1,
        "content_block": {
            "type": "server_tool_use",
            "id": "srvtoolu_1",
            "name": "web_search",
            "input": {},
        },
    },
    {
        "type": "content_block_delta",
        "index": 1,
        "delta": {"type": "input_json_delta", "partial_json": '{"query": "weather Oslo"}'},
    },
    {"type": "content_block_stop", "index": 1},
    {
        "type": "content_block_start",
        "index": 2,
        "content_block": {
            "type": "web_search_tool_result",
            "tool_use_id": "srvtoolu_1",
            "content": [{"type": "web_search_result", "title": "Oslo", "url": "https://x.example"}],
        },
    },
    {"type": "content_block_stop", "index": 2},
    {"type": "content_block_start", "index": 3, "content_block": {"type": "text", "text": ""}},
    {"type": "content_block_delta", "index": 3, "delta": {"type": "text_delta", "text": "Sunny."}},
    {"type": "content_block_stop", "index": 3},
    {
        "type": "message_delta",
        "delta": {"stop_reason": "end_turn"},
        "usage": {
            "input_tokens": 10682,
            "cache_creation_input_tokens": 100,
            "cache_read_input_tokens": 2000,
            "output_tokens": 510,
            "server_tool_use": {"web_search_requests": 1},
        },
    },
    {"type": "message_stop"},
    named=True,
)


def test_anthropic_stream_keeps_server_tools_and_thinking_out_and_takes_the_final_usage(
    mock: respx.MockRouter, clock: FakeClock
) -> None:
    mock.post("https://api.anthropic.com/v1/messages").respond(
        200, content=ANTHROPIC_SERVER_TOOL_STREAM, headers={"content-type": "text/event-stream"}
    )
    text, seen, done = collect(make("anthropic", clock, api_key=KEY).stream("weather in Oslo?"))
    assert text == "Sunny."
    assert [e for e in seen if e.type == "tool_call"] == []
    assert done is not None
    assert done.tool_calls == []
    usage = done.usage
    assert (usage.input_tokens, usage.output_tokens) == (10682 + 100 + 2000, 510)
    assert (usage.cache_read_tokens, usage.cache_write_tokens) == (2000, 100)


def test_anthropic_answer_with_server_tools_and_cache_usage(
    mock: respx.MockRouter, clock: FakeClock
) -> None:
    answer = {
        "model": "claude-sonnet-4-6",
        "stop_reason": "end_turn",
        "content": [
            {
                "type": "server_tool_use",
                "id": "srvtoolu_1",
                "name": "web_search",
                "input": {"query": "q"},
            },
            {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []},
            {"type": "text", "text": "Sunny."},
        ],
        "usage": {
            "input_tokens": 50,
            "cache_creation_input_tokens": 1000,
            "cache_read_input_tokens": 3000,
            "output_tokens": 20,
        },
    }
    mock.post("https://api.anthropic.com/v1/messages").respond(200, json=answer)
    done = make("anthropic", clock, api_key=KEY).complete("hi")
    assert (done.text, done.tool_calls) == ("Sunny.", [])
    assert (done.usage.input_tokens, done.usage.cache_read_tokens) == (4050, 3000)
    assert done.usage.cache_write_tokens == 1000


def test_groq_stream_usage_from_x_groq(mock: respx.MockRouter, clock: FakeClock) -> None:
    body = sse(
        {"model": "llama-3.3-70b-versatile", "choices": [{"index": 0, "delta": {"content": "Hi"}}]},
        {
            "model": "llama-3.3-70b-versatile",
            "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
            "x_groq": {
                "id": "req_01",
                "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15},
            },
        },
        done=True,
    )
    mock.post("https://api.groq.com/openai/v1/chat/completions").respond(
        200, content=body, headers={"content-type": "text/event-stream"}
    )
    client = make("groq", clock, model="llama-3.3-70b-versatile", env={"GROQ_API_KEY": "g" * 24})
    text, _, done = collect(client.stream("hi"))
    assert text == "Hi"
    assert done is not None
    assert (done.usage.input_tokens, done.usage.output_tokens) == (12, 3)


@pytest.mark.parametrize("streaming", [False, True])
def test_mistral_content_lists_join_text_and_keep_thinking_apart(
    mock: respx.MockRouter, clock: FakeClock, streaming: bool
) -> None:
    thinking = {"type": "thinking", "thinking": [{"type": "text", "text": "let me think"}]}
    parts = [
        thinking,
        {"type": "text", "text": "Paris"},
        {"type": "reference", "reference_ids": [1]},
    ]
    if streaming:
        body = sse(
            {
                "model": "magistral-medium",
                "choices": [{"index": 0, "delta": {"content": [thinking]}}],
            },
            {
                "model": "magistral-medium",
                "choices": [{"index": 0, "delta": {"content": parts[1:]}}],
            },
            {
                "model": "magistral-medium",
                "choices": [{"index": 0, "delta": {"content": " is it."}}],
            },
            done=True,
        )
        mock.post("https://api.mistral.ai/v1/chat/completions").respond(
            200, content=body, headers={"content-type": "text/event-stream"}
        )
    else:
        answer = {
            "model": "magistral-medium",
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": [*parts, {"type": "text", "text": " is it."}],
                    },
                }
            ],
            "usage": {"prompt_tokens": 5, "completion_tokens": 9},
        }
        mock.post("https://api.mistral.ai/v1/chat/completions").respond(200, json=answer)
    client = make("mistral", clock, model="magistral-medium", env={"MISTRAL_API_KEY": "m" * 32})
    if streaming:
        text, _, done = collect(client.stream("capital of France?"))
    else:
        done = client.complete("capital of France?")
        text = done.text
    assert text == "Paris is it."
    assert done is not None
    assert "think" not in done.text


# The refusal openai-python recorded from the live API (tests/data/provider_answers.json,
# row openai-refusal), asked here for a structured answer.
REFUSAL = "I'm very sorry, but I can't assist with that."


@pytest.mark.parametrize("streaming", [False, True])
def test_a_refusal_to_a_structured_answer_is_content_filtered_after_one_request(
    mock: respx.MockRouter, clock: FakeClock, streaming: bool
) -> None:
    route = mock.post("https://api.openai.com/v1/chat/completions")
    if streaming:
        route.respond(
            200,
            content=sse(
                {
                    "model": "gpt-4o",
                    "choices": [{"index": 0, "delta": {"role": "assistant", "refusal": ""}}],
                },
                {"model": "gpt-4o", "choices": [{"index": 0, "delta": {"refusal": REFUSAL}}]},
                {
                    "model": "gpt-4o",
                    "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                },
                done=True,
            ),
            headers={"content-type": "text/event-stream"},
        )
    else:
        message = {"role": "assistant", "content": None, "refusal": REFUSAL}
        answer = {
            "model": "gpt-4o",
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 79, "completion_tokens": 12},
        }
        route.respond(200, json=answer)
    client = make("openai", clock, api_key=KEY)
    ask = (
        (lambda: collect(client.stream("plan", response_model=Plan)))
        if streaming
        else (lambda: client.complete("plan", response_model=Plan))
    )
    with pytest.raises(ProviderError) as caught:
        ask()
    error = caught.value
    assert (error.code, error.retryable) == ("llm.content_filtered", False)
    assert error.details["refusal"] == REFUSAL
    assert route.call_count == 1  # no retry, no correction: the same request is refused again
    assert clock.waits == []


def test_gemini_thinking_tokens_count_as_output(mock: respx.MockRouter, clock: FakeClock) -> None:
    answer = {
        "candidates": [
            {
                "content": {"parts": [{"text": "plan...", "thought": True}, {"text": "42"}]},
                "finishReason": "STOP",
            }
        ],
        "usageMetadata": {
            "promptTokenCount": 10,
            "candidatesTokenCount": 2,
            "thoughtsTokenCount": 300,
            "cachedContentTokenCount": 4,
            "totalTokenCount": 312,
        },
        "modelVersion": "gemini-2.5-flash",
    }
    mock.post(url__regex=r".*:generateContent$").respond(200, json=answer)
    done = make("gemini", clock, env={"GEMINI_API_KEY": "k" * 20}).complete("hi")
    assert done.text == "42"
    usage = done.usage
    assert (usage.input_tokens, usage.output_tokens, usage.reasoning_tokens) == (10, 302, 300)
    assert usage.cache_read_tokens == 4
    assert usage.total_tokens == 312  # what Gemini bills: totalTokenCount


def test_openai_usage_details(mock: respx.MockRouter, clock: FakeClock) -> None:
    answer = {
        "model": "o4-mini",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
        ],
        "usage": {
            "prompt_tokens": 1200,
            "completion_tokens": 400,
            "prompt_tokens_details": {"cached_tokens": 1024, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 320},
        },
    }
    mock.post("https://api.openai.com/v1/chat/completions").respond(200, json=answer)
    usage = make("openai", clock, api_key=KEY).complete("hi").usage
    assert (usage.input_tokens, usage.output_tokens) == (1200, 400)
    assert (usage.reasoning_tokens, usage.cache_read_tokens) == (320, 1024)


def test_gemini_stream(mock: respx.MockRouter, clock: FakeClock) -> None:
    body = sse(
        {"candidates": [{"content": {"parts": [{"text": "Hel"}]}}]},
        {
            "candidates": [
                {
                    "content": {
                        "parts": [
                            {"text": "lo"},
                            {"functionCall": {"name": "get_weather", "args": {"city": "Oslo"}}},
                        ]
                    },
                    "finishReason": "STOP",
                }
            ],
            "usageMetadata": {"promptTokenCount": 3, "candidatesTokenCount": 4},
        },
    )
    route = mock.post(url__regex=r".*:streamGenerateContent\?alt=sse$").respond(
        200, content=body, headers={"content-type": "text/event-stream"}
    )
    text, _, done = collect(make("gemini", clock, env={"GEMINI_API_KEY": "k" * 20}).stream("hi"))
    assert text == "Hello"
    assert done is not None
    assert done.tool_calls[0].arguments == {"city": "Oslo"}
    assert route.call_count == 1


def test_ollama_ndjson_stream(mock: respx.MockRouter, clock: FakeClock) -> None:
    lines = [
        {"model": "llama3.1", "message": {"role": "assistant", "content": "Hel"}, "done": False},
        {"model": "llama3.1", "message": {"role": "assistant", "content": "lo"}, "done": False},
        {
            "model": "llama3.1",
            "message": {"role": "assistant", "content": ""},
            "done": True,
            "done_reason": "stop",
            "prompt_eval_count": 4,
            "eval_count": 2,
        },
    ]
    mock.post("http://127.0.0.1:11434/api/chat").respond(
        200,
        content="\n".join(json.dumps(x) for x in lines).encode(),
        headers={"content-type": "application/x-ndjson"},
    )
    text, _, done = collect(make("ollama", clock).stream("hi"))
    assert text == "Hello"
    assert done is not None
    assert done.usage.total_tokens == 6


def test_stream_error_before_anything_was_yielded_is_retried(
    mock: respx.MockRouter, clock: FakeClock
) -> None:
    overloaded = sse(
        {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
        named=True,
    )
    route = mock.post("https://api.anthropic.com/v1/messages")
    route.side_effect = [
        httpx.Response(200, content=overloaded, headers={"content-type": "text/event-stream"}),
        httpx.Response(
            200, content=ANTHROPIC_STREAM, headers={"content-type": "text/event-stream"}
        ),
    ]
    text, _, done = collect(make("anthropic", clock, api_key=KEY).stream("hi"))
    assert text == "Hi there"
    assert done is not None
    assert done.attempts == 2
    assert clock.waits == [1.0]


def test_stream_error_after_text_raises_typed_with_the_partial(
    mock: respx.MockRouter, clock: FakeClock
) -> None:
    body = sse(
        {"type": "message_start", "message": {"model": "m", "usage": {"input_tokens": 1}}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "text_delta", "text": "Part"},
        },
        {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
        named=True,
    )
    route = mock.post("https://api.anthropic.com/v1/messages").respond(
        200, content=body, headers={"content-type": "text/event-stream"}
    )
    seen: list[StreamEvent] = []
    with pytest.raises(ProviderServerError) as caught:
        seen.extend(make("anthropic", clock, api_key=KEY).stream("hi"))
    assert [e.text for e in seen] == ["Part"]
    assert caught.value.code == "llm.overloaded"
    assert caught.value.details["partial_text"] == "Part"
    assert caught.value.details["interrupted"] is True
    assert route.call_count == 1  # never retried once the caller has text


def test_async_stream(mock: respx.MockRouter, clock: FakeClock) -> None:
    mock.post("https://api.openai.com/v1/chat/completions").respond(
        200, content=OPENAI_STREAM, headers={"content-type": "text/event-stream"}
    )

    async def go() -> list[StreamEvent]:
        client = make("openai", clock, api_key=KEY)
        try:
            return [event async for event in client.astream("hi")]
        finally:
            await client.aclose()

    events = asyncio.run(go())
    assert "".join(e.text for e in events if e.type == "text") == "Hello"
    assert events[-1].type == "done"


def test_run_start_warnings_banner(clock: FakeClock) -> None:
    import io

    out = io.StringIO()
    client = make("ollama", clock, model="gemma2")
    warnings = client.run_start_warnings(uses_tools=True, stream=out)
    assert warnings
    assert "capability warning" in out.getvalue()
    quiet = make("ollama", clock, model="gemma2", env={"FLUID_QUIET": "1"})
    out = io.StringIO()
    assert quiet.run_start_warnings(uses_tools=True, stream=out) == warnings
    assert out.getvalue() == ""
