"""Fuzz: no adapter lets an untyped exception out of reading an answer (issue 35 item 3).

Every adapter's answer parser and stream chunk parser, through the public
LLMClient over a mock transport: any JSON in (a body or a stream of chunks,
shaped like the adapter's declared answer shape with anything at its leaves,
or anything at all), and out comes a Completion or a typed fluid error (an
AgentExecutionError subclass with a code), never a raw KeyError, TypeError,
pydantic ValidationError, OverflowError ...

Deterministic (derandomized, the conftest profile) and bounded: a few dozen
examples per adapter and kind.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fluid_build.copilot import Completion, LLMClient
from fluid_build.copilot.agents.errors import AgentExecutionError
from fluid_build.copilot.llm.anthropic import AnthropicAdapter
from fluid_build.copilot.llm.base import Adapter
from fluid_build.copilot.llm.bedrock import BedrockAdapter
from fluid_build.copilot.llm.gemini import GeminiAdapter
from fluid_build.copilot.llm.ollama import OllamaAdapter
from fluid_build.copilot.llm.openai import OpenAIAdapter
from fluid_build.copilot.llm.openai_responses import OpenAIResponsesAdapter
from tests.fakes import FakeClock, clocked_envelope
from tests.test_bedrock_answers import frame

#: provider -> (model, base_url, env, the adapter class whose shapes seed the answers).
ADAPTERS: dict[str, tuple[str, str | None, dict[str, str], type[Adapter]]] = {
    "openai": ("gpt-4o-mini", None, {}, OpenAIAdapter),
    "azure": (
        "my-deployment",
        None,
        {"AZURE_OPENAI_ENDPOINT": "https://example.openai.azure.com"},
        OpenAIAdapter,
    ),
    "openai_compatible": ("local", "http://127.0.0.1:8000/v1", {}, OpenAIAdapter),
    "openai_responses": ("gpt-4o-mini", None, {}, OpenAIResponsesAdapter),
    "anthropic": ("claude-sonnet-4-5", None, {}, AnthropicAdapter),
    "gemini": ("gemini-2.5-flash", None, {}, GeminiAdapter),
    "vertex": (
        "gemini-2.5-flash",
        None,
        {"GOOGLE_CLOUD_PROJECT": "fuzz", "GOOGLE_CLOUD_LOCATION": "us-central1"},
        GeminiAdapter,
    ),
    "bedrock": ("amazon.nova-micro-v1:0", None, {"AWS_REGION": "us-east-1"}, BedrockAdapter),
    "ollama": ("llama3.1", "http://127.0.0.1:11434", {}, OllamaAdapter),
}
#: The stream events each adapter tells apart by name (SSE ``event:``, Bedrock's
#: ``:event-type``); "" for a chunk without one.
EVENTS: dict[str, list[str]] = {
    "anthropic": [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
        "error",
    ],
    "openai_responses": [
        "response.output_text.delta",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.completed",
        "response.incomplete",
        "response.failed",
        "error",
    ],
    "bedrock": [
        "messageStart",
        "contentBlockStart",
        "contentBlockDelta",
        "contentBlockStop",
        "messageStop",
        "metadata",
        "exception",
    ],
}
#: Fields an adapter reads that its declared shape does not list.
EXTRA_KEYS = [
    "error",
    "type",
    "refusal",
    "promptFeedback",
    "blockReason",
    "trace",
    "guardrail",
    "outputAssessments",
    "citationsContent",
    "citation",
    "status",
    "incomplete_details",
    "response",
    "delta",
    "done",
    "done_reason",
    "message",
    "stop_reason",
]

# Numbers JSON can carry that Python reads: huge ints, NaN and Infinity (json.dumps writes
# them, json.loads and most servers' parsers accept them).
LEAVES = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.sampled_from([0, 1, -1, 10**400, 6, 10, 99])
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
    | st.sampled_from(["STOP", "guardrail_intervened", "BLOCKED", "ANONYMIZED", "end_turn"])
)
ANY_JSON = st.recursive(
    LEAVES,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(EXTRA_KEYS) | st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=12,
)


def shaped(shape: Any, depth: int = 0) -> st.SearchStrategy[Any]:
    """JSON following ``shape`` (an adapter's declared answer shape), anything at each leaf
    and, now and then, anything in place of a branch."""
    if depth > 6:
        return ANY_JSON
    if isinstance(shape, dict):
        optional = {key: shaped(inner, depth + 1) for key, inner in shape.items()}
        branch: st.SearchStrategy[Any] = st.fixed_dictionaries({}, optional=optional)
    elif isinstance(shape, list) and shape:
        branch = st.lists(shaped(shape[0], depth + 1), max_size=3)
    else:
        return ANY_JSON
    return st.one_of(branch, branch, ANY_JSON)


def _body(provider: str, adapter: type[Adapter]) -> st.SearchStrategy[Any]:
    return st.one_of(shaped(adapter.shape), ANY_JSON)


def _chunks(provider: str, adapter: type[Adapter]) -> st.SearchStrategy[list[tuple[str, Any]]]:
    names = st.sampled_from(EVENTS.get(provider, [""]))
    chunk = st.one_of(shaped(adapter.chunk_shape), shaped(adapter.chunk_shape), ANY_JSON)
    return st.lists(st.tuples(names, chunk), min_size=1, max_size=5)


def _dumps(value: Any) -> str:
    return json.dumps(value, allow_nan=True)


def _wire(provider: str, chunks: list[tuple[str, Any]]) -> tuple[bytes, str]:
    if provider == "bedrock":
        frames = b"".join(frame(event or "metadata", data) for event, data in chunks)
        return frames, "application/vnd.amazon.eventstream"
    if provider == "ollama":
        return "".join(_dumps(data) + "\n" for _, data in chunks).encode(), "application/x-ndjson"
    lines = []
    for event, data in chunks:
        head = f"event: {event}\n" if event else ""
        lines.append(f"{head}data: {_dumps(data)}\n\n")
    return "".join(lines).encode(), "text/event-stream"


def _client(provider: str, body: bytes, content_type: str) -> LLMClient:
    model, base_url, env, _ = ADAPTERS[provider]

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=body, headers={"content-type": content_type})

    return LLMClient(
        provider,
        model,
        api_key="fuzz-key",
        base_url=base_url,
        # One attempt: a fresh client each example, so no breaker or cooldown from an
        # earlier example stands between the answer and its parser.
        env={**env, "FLUID_LLM_MAX_ATTEMPTS": "1"},
        envelope=clocked_envelope(FakeClock()),
        http_client=httpx.Client(transport=httpx.MockTransport(answer)),
    )


def _typed_or_result(outcome: Any) -> None:
    if isinstance(outcome, BaseException):
        assert isinstance(outcome, AgentExecutionError), repr(outcome)
        assert isinstance(outcome.code, str)
        assert outcome.code.startswith("llm.")
        json.dumps(outcome.to_dict())  # its details are JSON-safe
    else:
        assert isinstance(outcome, Completion)
        assert outcome.finish_reason is None or isinstance(outcome.finish_reason, str)
        assert isinstance(outcome.model, str)
        json.dumps(outcome.details, allow_nan=True)
        assert outcome.usage.total_tokens >= 0


FUZZ = settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.mark.parametrize("provider", sorted(ADAPTERS))
def test_any_answer_body_is_a_completion_or_a_typed_error(provider: str) -> None:
    adapter = ADAPTERS[provider][3]

    @FUZZ
    @given(data=_body(provider, adapter))
    def check(data: Any) -> None:
        client = _client(provider, _dumps(data).encode(), "application/json")
        try:
            with client:
                outcome: Any = client.complete("hi")
        except Exception as exc:
            outcome = exc
        _typed_or_result(outcome)

    check()


@pytest.mark.parametrize("provider", sorted(ADAPTERS))
def test_any_stream_is_a_completion_or_a_typed_error(provider: str) -> None:
    adapter = ADAPTERS[provider][3]

    @FUZZ
    @given(chunks=_chunks(provider, adapter))
    def check(chunks: list[tuple[str, Any]]) -> None:
        body, content_type = _wire(provider, chunks)
        client = _client(provider, body, content_type)
        done: Any = None
        try:
            with client:
                for event in client.stream("hi"):
                    if event.type == "done":
                        done = event.completion
        except Exception as exc:
            done = exc
        if done is not None:
            _typed_or_result(done)

    check()


# -- what the fuzz found, pinned ---------------------------------------------------------


def _complete(provider: str, data: Any) -> Completion:
    with _client(provider, _dumps(data).encode(), "application/json") as client:
        return client.complete("hi")


def test_a_model_name_that_is_not_a_string_is_dropped_not_priced() -> None:
    """``"model": 1`` reached genai-prices' lookup (AttributeError: 'int' ... 'lower')."""
    done = _complete("anthropic", {"model": 1, "content": [{"type": "text", "text": "hi"}]})
    assert (done.text, done.model) == ("hi", "claude-sonnet-4-5")


def test_cached_tokens_over_the_prompt_are_left_unpriced_not_a_crash() -> None:
    """Gemini saying it read 1 cached token of a 0-token prompt made genai-prices raise
    ValueError ('cache_read_tokens (1) cannot exceed input_tokens (0)')."""
    body = {
        "candidates": [{"content": {"parts": [{"text": "hi"}]}, "finishReason": "STOP"}],
        "usageMetadata": {"cachedContentTokenCount": 1, "candidatesTokenCount": 1},
    }
    done = _complete("gemini", body)
    assert done.text == "hi"
    assert done.usage.cache_read_tokens == 1
    assert done.cost_usd is None


def test_a_negative_token_count_is_none() -> None:
    """Ollama's ``"eval_count": -1`` was an answer that used -1 tokens."""
    done = _complete("ollama", {"message": {"content": "hi"}, "done": True, "eval_count": -1})
    assert (done.text, done.usage.output_tokens) == ("hi", 0)
