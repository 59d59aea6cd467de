"""Real successful provider answers, replayed through the public LLMClient.

The rows live in tests/data/provider_answers.json; each names where it came
from (a provider's API reference, an official SDK's test fixture, a peer
project's recorded cassette or fixture). A row holds either a non-stream
``body`` (JSON) or a ``stream``: the exact wire text of an SSE or NDJSON
answer as a list of lines, the wire being ``"\\n".join(stream)`` (``\\r``
kept where the provider sends CRLF). ``expect`` is what the answer means in
the library's terms: text, tool calls, finish reason, model and usage (see
``Usage`` in src/fluid_build/copilot/llm/types.py for how totals are counted).

Non-stream rows go through ``complete()``; stream rows through ``stream()``,
whose text deltas and ``done`` completion must both agree with ``expect`` (a
row in ``CUT`` ends without its end marker: its deltas, then the typed error
carrying them).
The async twins run for the first row of each kind of every provider.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from fluid_build.copilot import Completion, LLMClient, StreamEvent
from fluid_build.copilot.agents.errors import ProviderError
from fluid_build.copilot.llm.settings import PROVIDERS
from tests.fakes import FakeClock, clocked_envelope

ROWS: list[dict[str, Any]] = json.loads(
    (Path(__file__).parent / "data" / "provider_answers.json").read_text(encoding="utf-8")
)
BODIES = [row for row in ROWS if "body" in row]
STREAMS = [row for row in ROWS if "stream" in row]

# How each provider is reached in these tests: a key where one is required, a
# base URL where there is no default home. The transport is mocked, so neither
# is ever used on a network.
KEY = "test-key-0123456789"
BASE_URLS = {
    "azure": "https://example-resource.openai.azure.com",
    "vllm": "http://127.0.0.1:8000/v1",
    "llamacpp": "http://127.0.0.1:8080/v1",
    "bedrock": "https://bedrock-runtime.us-east-1.amazonaws.com",
}
#: Providers reached with an access token (api_key=) and a project, not a key variable.
#: Bedrock: a Bedrock API key (bearer token) instead of SigV4 with the machine's AWS chain.
TOKEN_ENVS = {"vertex": {"GOOGLE_CLOUD_PROJECT": "test-project"}, "bedrock": {}}
USAGE_FIELDS = (
    "input_tokens",
    "output_tokens",
    "reasoning_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
)


def _first_per_provider(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    seen: dict[str, dict[str, Any]] = {}
    for row in rows:
        seen.setdefault(row["provider"], row)
    return list(seen.values())


#: Rows whose stream was logged only in part: no finish reason, no ``[DONE]``. The
#: answer never said it was over, so it is a cut stream (``llm.network_error``
#: carrying the text that arrived), never a ``done``.
CUT = {"mistral-stream-reference-chunk"}


ASYNC_BODIES = _first_per_provider(BODIES)
ASYNC_STREAMS = _first_per_provider([row for row in STREAMS if row["id"] not in CUT])


def _ids(rows: list[dict[str, Any]]) -> list[str]:
    return [row["id"] for row in rows]


def _wire(row: dict[str, Any]) -> bytes:
    if row.get("stream_encoding") == "base64":  # a binary stream (AWS event-stream frames)
        return base64.b64decode("".join(row["stream"]))
    if "stream" in row:
        return "\n".join(row["stream"]).encode()
    return json.dumps(row["body"], ensure_ascii=False).encode()


def _answer(row: dict[str, Any]) -> httpx.MockTransport:
    def handler(request: httpx.Request) -> httpx.Response:
        assert request.method == "POST"
        return httpx.Response(
            row.get("status", 200), headers=row.get("headers") or {}, content=_wire(row)
        )

    return httpx.MockTransport(handler)


def _client(row: dict[str, Any], **http: Any) -> LLMClient:
    provider = row["provider"]
    clock = FakeClock()
    envelope = clocked_envelope(clock)
    return LLMClient(
        provider,
        row["request_model"],
        api_key=KEY if PROVIDERS[provider].key_required or provider in TOKEN_ENVS else None,
        base_url=BASE_URLS.get(provider),
        envelope=envelope,
        env=TOKEN_ENVS.get(provider, {}),
        **http,
    )


def _calls(completion: Completion) -> list[dict[str, Any]]:
    return [call.model_dump() for call in completion.tool_calls]


def _check(completion: Completion, expect: dict[str, Any]) -> None:
    assert completion.text == expect["text"]
    assert _calls(completion) == expect["tool_calls"]
    assert completion.finish_reason == expect["finish_reason"]
    assert completion.model == expect["model"]
    assert completion.usage.model_dump() == {f: expect["usage"].get(f, 0) for f in USAGE_FIELDS}


def _check_stream(events: list[StreamEvent], expect: dict[str, Any]) -> None:
    dones = [event for event in events if event.type == "done"]
    assert len(dones) == 1, "a stream ends with exactly one done event"
    assert events[-1].type == "done"
    completion = dones[0].completion
    assert completion is not None
    _check(completion, expect)
    # The deltas a caller saw add up to the answer it is finally given.
    assert "".join(event.text for event in events if event.type == "text") == expect["text"]
    fragments: dict[int, list[StreamEvent]] = {}
    for event in events:
        if event.type == "tool_call":
            fragments.setdefault(event.index or 0, []).append(event)
    seen = []
    for index in sorted(fragments):
        last = fragments[index][-1]
        raw = "".join(event.arguments_delta for event in fragments[index])
        seen.append({"id": last.id, "name": last.name, "arguments": json.loads(raw) if raw else {}})
    assert seen == expect["tool_calls"]


def _check_cut(events: list[StreamEvent], error: ProviderError, expect: dict[str, Any]) -> None:
    """A stream that ends without its end marker was cut: the deltas, then the typed error."""
    assert all(event.type != "done" for event in events)
    assert "".join(event.text for event in events if event.type == "text") == expect["text"]
    assert (error.code, error.retryable) == ("llm.network_error", True)
    assert error.details["interrupted"] is True
    assert error.details["partial_text"] == expect["text"]
    assert error.details["tool_calls"] == expect["tool_calls"]


def test_the_table_is_substantial_and_sourced() -> None:
    assert len(ROWS) >= 35
    assert len({row["id"] for row in ROWS}) == len(ROWS)
    for row in ROWS:
        assert row["source"].strip(), row["id"]
        assert row["provider"] in PROVIDERS, row["id"]
        assert ("body" in row) != ("stream" in row), row["id"]
        assert set(row["expect"]) == {"text", "tool_calls", "finish_reason", "model", "usage"}
        assert set(row["expect"]["usage"]) <= set(USAGE_FIELDS), row["id"]
    providers = {row["provider"] for row in ROWS}
    # Every provider answers here with a recording, the presets included (xAI, Together
    # and Fireworks each from a capture of their own API; see the rows' sources).
    assert set(PROVIDERS) - {"openai_compatible"} <= providers
    for provider in ("openai", "azure", "anthropic", "gemini", "ollama", "groq", "mistral"):
        kinds = {"stream" in row for row in ROWS if row["provider"] == provider}
        assert kinds == {True, False}, f"{provider} needs both a body and a stream"


@pytest.mark.parametrize("row", BODIES, ids=_ids(BODIES))
def test_complete_reads_a_real_answer(row: dict[str, Any]) -> None:
    with httpx.Client(transport=_answer(row)) as http:
        completion = _client(row, http_client=http).complete("hi")
    _check(completion, row["expect"])


@pytest.mark.parametrize("row", STREAMS, ids=_ids(STREAMS))
def test_stream_reads_a_real_stream(row: dict[str, Any]) -> None:
    seen: list[StreamEvent] = []
    with httpx.Client(transport=_answer(row)) as http:
        events: Iterator[StreamEvent] = _client(row, http_client=http).stream("hi")
        if row["id"] in CUT:
            with pytest.raises(ProviderError) as caught:
                seen.extend(events)
            _check_cut(seen, caught.value, row["expect"])
            return
        seen.extend(events)
    _check_stream(seen, row["expect"])


@pytest.mark.parametrize("row", ASYNC_BODIES, ids=_ids(ASYNC_BODIES))
def test_acomplete_reads_a_real_answer(row: dict[str, Any]) -> None:
    async def go() -> Completion:
        async with httpx.AsyncClient(transport=_answer(row)) as http:
            return await _client(row, async_http_client=http).acomplete("hi")

    _check(asyncio.run(go()), row["expect"])


@pytest.mark.parametrize("row", ASYNC_STREAMS, ids=_ids(ASYNC_STREAMS))
def test_astream_reads_a_real_stream(row: dict[str, Any]) -> None:
    async def go() -> list[StreamEvent]:
        async with httpx.AsyncClient(transport=_answer(row)) as http:
            events: AsyncIterator[StreamEvent] = _client(row, async_http_client=http).astream("hi")
            return [event async for event in events]

    _check_stream(asyncio.run(go()), row["expect"])
