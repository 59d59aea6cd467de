"""provider="openai_responses": OpenAI's Responses API through the public LLMClient.

The request each call sends (input items, instructions, tools, text.format,
max_output_tokens), how answers and streams are read (text, function calls by
call_id, reasoning and server-run tool items left out, usage, finish reason),
refusals, and the errors a failed response, an ``error`` event and an HTTP
error answer become. Real recorded answers are replayed by
tests/test_real_answers.py (rows ``openai-responses-*``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pydantic
import pytest

from fluid_build.copilot import Completion, LLMClient, StreamEvent
from fluid_build.copilot.agents.errors import AgentExecutionError, ProviderError
from fluid_build.copilot.call.prices import known_price
from fluid_build.copilot.llm.settings import resolve_provider_config
from fluid_build.copilot.llm.types import ToolSpec
from tests.fakes import FakeClock, clocked_envelope
from tests.transport_calls import TRANSPORTS, call_over, transport_env

KEY = "sk-test-responses-0123456789"
URL = "https://api.openai.com/v1/responses"
WEATHER = ToolSpec(
    "get_weather",
    "The weather in a city.",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)


class Sent:
    """What the mock server received, and the answers it gives in order."""

    def __init__(self, *answers: httpx.Response) -> None:
        self.answers = list(answers)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return self.answers.pop(0)

    @property
    def body(self) -> dict[str, Any]:
        return dict(json.loads(self.requests[-1].content))


def _client(http: httpx.Client | None = None, **kw: Any) -> LLMClient:
    env = kw.pop("env", {})
    return LLMClient(
        "openai_responses",
        kw.pop("model", "o3-pro"),
        api_key=KEY,
        envelope=clocked_envelope(FakeClock()),
        env=env,
        http_client=http,
        **kw,
    )


def _complete(sent: Sent, *messages: Any, **options: Any) -> Completion:
    env = options.pop("env", {})
    with httpx.Client(transport=httpx.MockTransport(sent)) as http:
        return _client(http, env=env).complete(list(messages) or "hi", **options)


def _sse(*events: dict[str, Any]) -> bytes:
    return "".join(
        f"event: {event['type']}\ndata: {json.dumps(event)}\n\n" for event in events
    ).encode()


def _stream_answer(*events: dict[str, Any]) -> httpx.Response:
    return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=_sse(*events))


def _stream(sent: Sent, **options: Any) -> list[StreamEvent]:
    with httpx.Client(transport=httpx.MockTransport(sent)) as http:
        return list(_client(http).stream("hi", **options))


def _answer(output: list[dict[str, Any]], **extra: Any) -> httpx.Response:
    body = {
        "id": "resp_1",
        "object": "response",
        "status": "completed",
        "error": None,
        "incomplete_details": None,
        "model": "o3-pro-2025-06-10",
        "output": output,
        "usage": {
            "input_tokens": 120,
            "input_tokens_details": {"cached_tokens": 100},
            "output_tokens": 80,
            "output_tokens_details": {"reasoning_tokens": 64},
            "total_tokens": 200,
        },
        **extra,
    }
    return httpx.Response(200, json=body)


def _message(text: str) -> dict[str, Any]:
    return {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


REASONING = {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "hm"}]}


# -- the request ------------------------------------------------------------------------


def test_the_request_goes_to_responses_with_instructions_input_and_tools() -> None:
    sent = Sent(_answer([_message("ok")]))
    history = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "call_9", "name": "get_weather", "arguments": {"city": "Paris"}}],
        },
        {"role": "tool", "tool_call_id": "call_9", "content": "sunny"},
    ]
    _complete(sent, *history, system="Be brief.", tools=[WEATHER], max_output_tokens=300)
    request = sent.requests[0]
    assert str(request.url) == URL
    assert request.headers["authorization"] == f"Bearer {KEY}"
    assert sent.body == {
        "model": "o3-pro",
        "instructions": "Be brief.",
        "input": [
            {"role": "user", "content": "Weather in Paris?"},
            {
                "type": "function_call",
                "call_id": "call_9",
                "name": "get_weather",
                "arguments": '{"city": "Paris"}',
            },
            {"type": "function_call_output", "call_id": "call_9", "output": "sunny"},
        ],
        "tools": [
            {
                "type": "function",
                "name": "get_weather",
                "description": "The weather in a city.",
                "parameters": dict(WEATHER.parameters),
                "strict": False,
            }
        ],
        "max_output_tokens": 300,
    }


def test_openai_base_url_moves_the_endpoint() -> None:
    config = resolve_provider_config(
        "openai_responses",
        env={"OPENAI_API_KEY": KEY, "OPENAI_BASE_URL": "https://api.deepseek.com"},
    )
    assert (config.base_url, config.api_key, config.model) == (
        "https://api.deepseek.com",
        KEY,
        "gpt-4o-mini",
    )


class Plan(pydantic.BaseModel):
    steps: list[str]
    note: str | None = None


def test_structured_output_goes_in_text_format() -> None:
    sent = Sent(_answer([_message('{"steps": ["a"], "note": null}')]))
    done = _complete(sent, response_model=Plan)
    fmt = sent.body["text"]["format"]
    assert (fmt["type"], fmt["name"], fmt["strict"]) == ("json_schema", "Plan", False)
    assert done.parsed == Plan(steps=["a"])


def test_strict_schema_mode_hardens_the_schema_as_for_chat_completions() -> None:
    sent = Sent(_answer([_message('{"steps": ["a"], "note": null}')]))
    done = _complete(sent, response_model=Plan, env={"FLUID_OPENAI_STRICT_SCHEMA": "1"})
    fmt = sent.body["text"]["format"]
    assert fmt["strict"] is True
    assert fmt["schema"]["additionalProperties"] is False
    assert sorted(fmt["schema"]["required"]) == ["note", "steps"]
    assert done.parsed == Plan(steps=["a"])


# -- answers ----------------------------------------------------------------------------


def test_reasoning_and_server_tool_items_are_neither_text_nor_tool_calls() -> None:
    sent = Sent(
        _answer(
            [
                REASONING,
                {"type": "web_search_call", "id": "ws_1", "status": "completed"},
                {"type": "mcp_call", "id": "mcp_1", "name": "lookup", "arguments": "{}"},
                {"type": "code_interpreter_call", "id": "ci_1", "code": "1+1"},
                _message("Paris is sunny."),
                {
                    "type": "function_call",
                    "id": "fc_1",
                    "call_id": "call_1",
                    "name": "get_weather",
                    "arguments": '{"city": "Lyon"}',
                },
            ]
        )
    )
    done = _complete(sent, tools=[WEATHER])
    assert done.text == "Paris is sunny."
    assert [c.model_dump() for c in done.tool_calls] == [
        {"id": "call_1", "name": "get_weather", "arguments": {"city": "Lyon"}}
    ]
    assert done.usage.model_dump() == {
        "input_tokens": 120,
        "output_tokens": 80,
        "reasoning_tokens": 64,
        "cache_read_tokens": 100,
        "cache_write_tokens": 0,
    }
    assert (done.finish_reason, done.model) == ("completed", "o3-pro-2025-06-10")


def test_an_incomplete_answer_gives_its_reason_as_the_finish_reason() -> None:
    sent = Sent(
        _answer(
            [_message("Par")],
            status="incomplete",
            incomplete_details={"reason": "max_output_tokens"},
        )
    )
    done = _complete(sent)
    assert (done.text, done.finish_reason) == ("Par", "max_output_tokens")


def _refusal() -> httpx.Response:
    part = {"type": "refusal", "refusal": "I can't help with that."}
    return _answer([{"type": "message", "role": "assistant", "content": [part]}])


def test_a_refusal_without_a_response_model_is_the_text() -> None:
    assert _complete(Sent(_refusal())).text == "I can't help with that."


def test_a_refusal_of_a_structured_answer_is_content_filtered_after_one_request() -> None:
    sent = Sent(_refusal())
    with pytest.raises(ProviderError) as caught:
        _complete(sent, response_model=Plan)
    assert (caught.value.code, caught.value.retryable) == ("llm.content_filtered", False)
    assert caught.value.details["refusal"] == "I can't help with that."
    assert len(sent.requests) == 1


def test_a_failed_response_is_classified_by_its_error() -> None:
    failed = _answer(
        [],
        status="failed",
        error={"code": "invalid_prompt", "message": "Invalid prompt: flagged as violating"},
    )
    with pytest.raises(AgentExecutionError) as caught:
        _complete(Sent(failed))
    assert caught.value.retryable is False


def test_an_http_error_answer_is_openais_error_envelope() -> None:
    body = {
        "error": {
            "message": "Your input exceeds the context window of this model.",
            "type": "invalid_request_error",
            "param": "input",
            "code": "context_length_exceeded",
        }
    }
    with pytest.raises(AgentExecutionError) as caught:
        _complete(Sent(httpx.Response(400, json=body)))
    assert caught.value.code == "llm.context_overflow"


# -- streams ----------------------------------------------------------------------------


def _created() -> dict[str, Any]:
    return {
        "type": "response.created",
        "response": {"model": "o3-pro-2025-06-10", "status": "in_progress"},
    }


def _completed(status: str = "completed", **extra: Any) -> dict[str, Any]:
    response = {
        "model": "o3-pro-2025-06-10",
        "status": status,
        "usage": {
            "input_tokens": 30,
            "output_tokens": 20,
            "output_tokens_details": {"reasoning_tokens": 12},
        },
        **extra,
    }
    kind = "response.completed" if status == "completed" else f"response.{status}"
    return {"type": kind, "response": response}


FUNCTION_ITEM = {
    "type": "function_call",
    "id": "fc_7",
    "call_id": "call_7",
    "name": "get_weather",
    "arguments": "",
}


def _arguments(index: int, delta: str) -> dict[str, Any]:
    return {"type": "response.function_call_arguments.delta", "output_index": index, "delta": delta}


def test_a_stream_gives_text_and_function_call_argument_deltas() -> None:
    sent = Sent(
        _stream_answer(
            _created(),
            {"type": "response.output_item.added", "output_index": 0, "item": REASONING},
            {"type": "response.reasoning_summary_text.delta", "output_index": 0, "delta": "hm"},
            {"type": "response.output_text.delta", "output_index": 1, "delta": "Checking"},
            {"type": "response.output_text.delta", "output_index": 1, "delta": " now."},
            {"type": "response.output_item.added", "output_index": 2, "item": FUNCTION_ITEM},
            {"type": "response.function_call_arguments.delta", "output_index": 2, "delta": '{"ci'},
            {
                "type": "response.function_call_arguments.delta",
                "output_index": 2,
                "delta": 'ty": "Oslo"}',
            },
            {
                "type": "response.output_item.done",
                "output_index": 2,
                "item": {**FUNCTION_ITEM, "arguments": '{"city": "Oslo"}'},
            },
            _completed(),
        )
    )
    events = _stream(sent, tools=[WEATHER])
    assert sent.body["stream"] is True
    assert "".join(e.text for e in events if e.type == "text") == "Checking now."
    args = "".join(e.arguments_delta for e in events if e.type == "tool_call")
    assert json.loads(args) == {"city": "Oslo"}  # the done item does not repeat them
    done = events[-1].completion
    assert done is not None
    assert done.text == "Checking now."
    assert [c.model_dump() for c in done.tool_calls] == [
        {"id": "call_7", "name": "get_weather", "arguments": {"city": "Oslo"}}
    ]
    assert (done.usage.input_tokens, done.usage.output_tokens, done.usage.reasoning_tokens) == (
        30,
        20,
        12,
    )
    assert (done.finish_reason, done.model) == ("completed", "o3-pro-2025-06-10")


def test_a_function_call_whose_arguments_come_only_with_the_done_item() -> None:
    sent = Sent(
        _stream_answer(
            {"type": "response.output_item.added", "output_index": 0, "item": FUNCTION_ITEM},
            {
                "type": "response.output_item.done",
                "output_index": 0,
                "item": {**FUNCTION_ITEM, "arguments": '{"city": "Rome"}'},
            },
            _completed(),
        )
    )
    done = _stream(sent, tools=[WEATHER])[-1].completion
    assert done is not None
    assert done.tool_calls[0].arguments == {"city": "Rome"}


def test_an_incomplete_stream_ends_with_its_reason() -> None:
    sent = Sent(
        _stream_answer(
            {"type": "response.output_text.delta", "output_index": 0, "delta": "Par"},
            _completed("incomplete", incomplete_details={"reason": "max_output_tokens"}),
        )
    )
    done = _stream(sent)[-1].completion
    assert done is not None
    assert (done.text, done.finish_reason) == ("Par", "max_output_tokens")


def test_a_stream_without_its_end_event_was_cut() -> None:
    sent = Sent(
        *[
            _stream_answer({"type": "response.output_text.delta", "output_index": 0, "delta": "Pa"})
            for _ in range(3)
        ]
    )
    seen: list[StreamEvent] = []
    with (
        pytest.raises(ProviderError) as caught,
        httpx.Client(transport=httpx.MockTransport(sent)) as http,
    ):
        seen.extend(_client(http).stream("hi"))
    assert (caught.value.code, caught.value.retryable) == ("llm.network_error", True)
    assert caught.value.details["partial_text"] == "Pa"
    assert "response.completed" in caught.value.message


OVERFLOW = (
    "Your input exceeds the context window of this model. Please adjust your input and try again."
)


@pytest.mark.parametrize(
    ("event", "code", "retryable"),
    [
        (
            {
                "type": "error",
                "code": "rate_limit_exceeded",
                "message": "Rate limit reached for o3-pro in organization org-1 on tokens per min.",
                "param": None,
            },
            "llm.rate_limited",
            True,
        ),
        (
            {
                "type": "response.failed",
                "response": {
                    "status": "failed",
                    "error": {
                        "code": "server_error",
                        "message": "The server had an error processing your request.",
                    },
                },
            },
            "llm.server_error",
            True,
        ),
        (
            # openai/codex's sse_failed fixture for an overflowing turn (codex-rs core tests)
            {
                "type": "response.failed",
                "response": {
                    "status": "failed",
                    "error": {"code": "context_length_exceeded", "message": OVERFLOW},
                },
            },
            "llm.context_overflow",
            False,
        ),
        (
            {
                "type": "error",
                "error": {
                    "type": "invalid_request_error",
                    "code": "context_length_exceeded",
                    "message": OVERFLOW,
                    "param": "input",
                },
            },
            "llm.context_overflow",
            False,
        ),
    ],
    ids=["error-event", "response-failed", "failed-context-window", "nested-error-event"],
)
def test_a_stream_error_carries_the_text_that_had_arrived(
    event: dict[str, Any], code: str, retryable: bool
) -> None:
    sent = Sent(
        _stream_answer(
            {"type": "response.output_text.delta", "output_index": 0, "delta": "Hal"}, event
        )
    )
    seen: list[StreamEvent] = []
    with (
        pytest.raises(ProviderError) as caught,
        httpx.Client(transport=httpx.MockTransport(sent)) as http,
    ):
        seen.extend(_client(http).stream("hi"))
    assert [e.text for e in seen] == ["Hal"]
    assert (caught.value.code, caught.value.retryable) == (code, retryable)
    assert caught.value.details["interrupted"] is True
    assert caught.value.details["partial_text"] == "Hal"


def test_a_streamed_refusal_of_a_structured_answer_is_content_filtered() -> None:
    sent = Sent(
        _stream_answer(
            {"type": "response.refusal.delta", "output_index": 0, "delta": "I can't"},
            {"type": "response.refusal.delta", "output_index": 0, "delta": " help."},
            _completed(),
        )
    )
    with pytest.raises(ProviderError) as caught:
        _stream(sent, response_model=Plan)
    assert caught.value.code == "llm.content_filtered"
    assert caught.value.details["refusal"] == "I can't help."


def test_a_streamed_refusal_without_a_response_model_is_the_text() -> None:
    sent = Sent(
        _stream_answer(
            {"type": "response.refusal.delta", "output_index": 0, "delta": "No."}, _completed()
        )
    )
    events = _stream(sent)
    assert [e.text for e in events if e.type == "text"] == ["No."]


# -- async, and the price ----------------------------------------------------------------


def _async(handler: Callable[[httpx.Request], httpx.Response]) -> Completion:
    async def go() -> Completion:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
            client = LLMClient(
                "openai_responses",
                "o3-pro",
                api_key=KEY,
                envelope=clocked_envelope(FakeClock()),
                env={},
                async_http_client=http,
            )
            return await client.acomplete("hi", tools=[WEATHER])

    return asyncio.run(go())


def test_acomplete_reads_the_same_answer() -> None:
    item = {**FUNCTION_ITEM, "arguments": '{"city": "Nice"}'}
    done = _async(Sent(_answer([REASONING, item])))
    assert [c.model_dump() for c in done.tool_calls] == [
        {"id": "call_7", "name": "get_weather", "arguments": {"city": "Nice"}}
    ]


def test_astream_reads_the_same_stream() -> None:
    sent = Sent(
        _stream_answer(
            {"type": "response.output_text.delta", "output_index": 0, "delta": "Hi"}, _completed()
        )
    )

    async def go() -> list[StreamEvent]:
        async with httpx.AsyncClient(transport=httpx.MockTransport(sent)) as http:
            client = LLMClient(
                "openai_responses",
                "o3-pro",
                api_key=KEY,
                envelope=clocked_envelope(FakeClock()),
                env={},
                async_http_client=http,
            )
            return [event async for event in client.astream("hi")]

    events = asyncio.run(go())
    assert events[-1].completion is not None
    assert events[-1].completion.text == "Hi"


def test_responses_models_are_priced_as_openai() -> None:
    assert known_price("openai_responses", "o3-pro")
    assert known_price("openai_responses", "gpt-4o-mini")


# -- the capability matrix ---------------------------------------------------------------


def test_the_matrix_knows_the_responses_only_models_and_openais() -> None:
    from fluid_build.copilot.call.capabilities import capabilities_for

    pro = capabilities_for("openai_responses", "o3-pro-2025-06-10")
    assert (pro.known, pro.context_window, pro.max_output_tokens, pro.tools) == (
        True,
        200_000,
        100_000,
        True,
    )
    research = capabilities_for("openai_responses", "o3-deep-research")
    assert (research.known, research.tools, research.strict_schema) == (True, False, False)
    assert capabilities_for("openai_responses", "gpt-4o-mini").context_window == 128_000
    # Its own row, not the gpt-5 family's that "openai" falls back to.
    assert capabilities_for("openai_responses", "gpt-5-pro").max_output_tokens == 272_000
    assert capabilities_for("openai", "gpt-5-pro").max_output_tokens == 128_000


# -- every transport, over a real socket ---------------------------------------------------


def _over(transport: str, url: str, call: str) -> Any:
    """One call (``complete`` or ``stream``) to ``url`` through ``transport``."""
    env = transport_env(transport)

    def client(**http: Any) -> LLMClient:
        return LLMClient(
            "openai_responses",
            "o3-pro",
            api_key=KEY,
            base_url=url,
            envelope=clocked_envelope(FakeClock()),
            env=env,
            **http,
        )

    return call_over(transport, client, call)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_every_transport_carries_an_answer_and_a_stream(transport: str) -> None:
    from tests.loopback import Seen, base_url, http_server

    answer = json.dumps(_answer([REASONING, _message("Paris.")]).json()).encode()
    stream = _sse(
        {"type": "response.output_text.delta", "output_index": 1, "delta": "Par"},
        {"type": "response.output_text.delta", "output_index": 1, "delta": "is."},
        _completed(),
    )
    answers = [
        (200, {"content-type": "application/json"}, answer),
        (200, {"content-type": "text/event-stream"}, stream),
    ]

    def reply(seen: Seen) -> tuple[int, dict[str, str], bytes]:
        assert seen.path == "/v1/responses"
        assert seen.headers["authorization"] == f"Bearer {KEY}"
        return answers.pop(0)

    with http_server(reply) as server:
        url = base_url(server) + "/v1"
        done = _over(transport, url, "complete")
        events = _over(transport, url, "stream")
    assert (done.text, done.finish_reason) == ("Paris.", "completed")
    assert "".join(e.text for e in events if e.type == "text") == "Paris."
    assert events[-1].completion.usage.reasoning_tokens == 12


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_stream_reset_mid_answer_is_the_same_typed_error_on_every_transport(
    transport: str,
) -> None:
    from tests.loopback import serve, sse_then

    first = _sse({"type": "response.output_text.delta", "output_index": 0, "delta": "Hal"})
    with serve(sse_then("reset", first)) as url, pytest.raises(ProviderError) as caught:
        _over(transport, url + "/v1", "stream")
    assert (caught.value.code, caught.value.retryable) == ("llm.network_error", True)
    assert caught.value.details["partial_text"] == "Hal"
    assert KEY not in str(caught.value)


# -- the CLI, as an operator runs it ---------------------------------------------------------


def test_fluid_batch_and_ai_setup_check_reach_the_responses_api(tmp_path: Path) -> None:
    from tests.docs_model import Request
    from tests.test_docs_commands import OPENAI_KEY, new_place, run

    def script(request: Request) -> tuple[int, dict[str, Any]] | None:
        if request.path != "/v1/responses":
            return None
        prompt = request.body["input"][0]["content"]
        return 200, _answer([REASONING, _message(f"echo: {prompt}")]).json()

    with new_place(tmp_path, openai=True, attempts=1) as place:
        place.model.script = script
        place.env.update(FLUID_LLM_PROVIDER="openai_responses", FLUID_LLM_MODEL="o3-pro")
        (place.cwd / "prompts.txt").write_text("one\ntwo\n", encoding="utf-8")
        done = run(place, "fluid batch prompts.txt --json")
        checked = run(place, "fluid ai setup --check")
        seen = [(r.method, r.path) for r in place.model.requests]
    output = done.stdout + done.stderr + checked.stdout + checked.stderr
    assert "Traceback" not in output
    assert OPENAI_KEY not in output
    assert done.returncode == 0, output
    records = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    assert [r["text"] for r in records[:2]] == ["echo: one", "echo: two"]
    assert records[-1]["ok"] is True
    assert checked.returncode == 0, output
    assert checked.stdout.strip() == "openai_responses: key accepted (1 models visible)"
    assert ("POST", "/v1/responses") in seen
    assert ("GET", "/v1/models") in seen
