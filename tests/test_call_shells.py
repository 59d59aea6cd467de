"""One call plan, two shells: the sync and async methods make the same decisions.

Each scenario runs once through the sync shell (``complete`` / ``stream``) and
once through the async shell (``acomplete`` / ``astream``) on a fake clock,
and the outcome, the requests sent, the waits and the retry events must match
exactly (and match what the policy says).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import httpx
import respx

from fluid_build.copilot.agents.errors import AgentExecutionError
from fluid_build.copilot.call.envelope import RetryEnvelope, RetryEvent, RetryPolicy
from fluid_build.copilot.client import LLMClient
from fluid_build.copilot.health.cooldown import MemoryCooldownStore
from tests.fakes import FakeClock

OPENAI = "https://api.openai.com/v1/chat/completions"
ANTHROPIC = "https://api.anthropic.com/v1/messages"
KEYS = {"OPENAI_API_KEY": "sk-openai-test", "ANTHROPIC_API_KEY": "sk-ant-test"}
ANTHROPIC_OK = {
    "id": "msg_1",
    "model": "claude-sonnet-4-6",
    "content": [{"type": "text", "text": "from claude"}],
    "stop_reason": "end_turn",
    "usage": {"input_tokens": 3, "output_tokens": 2},
}


def sse(*events: dict[str, Any]) -> bytes:
    return "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events).encode()


def delta(text: str) -> dict[str, Any]:
    return {
        "type": "content_block_delta",
        "index": 0,
        "delta": {"type": "text_delta", "text": text},
    }


STREAM_START = [
    {"type": "message_start", "message": {"model": "m", "usage": {"input_tokens": 1}}},
    {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
]
# Text, then the provider gives up mid-answer.
INTERRUPTED = sse(
    *STREAM_START,
    delta("Part"),
    {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
)
WHOLE = sse(
    *STREAM_START,
    delta("Hi"),
    {"type": "content_block_stop", "index": 0},
    {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 2}},
    {"type": "message_stop"},
)


def error(status: int, **headers: str) -> httpx.Response:
    return httpx.Response(status, json={"error": {"message": "busy"}}, headers=headers)


def streamed(body: bytes) -> httpx.Response:
    return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})


def client(clock: FakeClock, events: list[RetryEvent], provider: str, *fallbacks: str) -> LLMClient:
    envelope = RetryEnvelope(
        RetryPolicy(attempts=3),
        cooldown=MemoryCooldownStore(),
        clock=clock,
        sleep=clock.sleep,
        asleep=clock.asleep,
        random=lambda: 0.0,
        hook=events.append,
    )
    return LLMClient(provider, envelope=envelope, env=KEYS, fallbacks=list(fallbacks))


def outcome(call: Callable[[], Any]) -> dict[str, Any]:
    """What a call came to: the answer's or the error's facts."""
    try:
        done = call()
    except AgentExecutionError as exc:
        return {"error": type(exc).__name__, "code": exc.code, "details": exc.details}
    return done if isinstance(done, dict) else done.model_dump()


def run_complete(clock: FakeClock, events: list[RetryEvent], mode: str) -> dict[str, Any]:
    llm = client(clock, events, "openai", "anthropic:claude-sonnet-4-6")
    if mode == "sync":
        return outcome(lambda: llm.complete("hi"))
    return outcome(lambda: asyncio.run(llm.acomplete("hi")))


def run_stream(clock: FakeClock, events: list[RetryEvent], mode: str) -> dict[str, Any]:
    llm = client(clock, events, "anthropic")
    seen: list[str] = []

    def sync() -> dict[str, Any]:
        for event in llm.stream("hi"):
            seen.append(event.type if event.type != "text" else event.text)
        return {"seen": seen}

    async def agen() -> dict[str, Any]:
        async for event in llm.astream("hi"):
            seen.append(event.type if event.type != "text" else event.text)
        return {"seen": seen}

    result = outcome(sync if mode == "sync" else lambda: asyncio.run(agen()))
    return {**result, "seen": seen}


Answers = Callable[[], dict[str, list[httpx.Response]]]


def both(
    run: Callable[[FakeClock, list[RetryEvent], str], dict[str, Any]], answers: Answers
) -> tuple[dict[str, Any], list[float], list[tuple[float, str, int]], list[str]]:
    """The same scenario in each shell: outcome, waits, retry events, requests sent."""
    results = []
    for mode in ("sync", "async"):
        clock = FakeClock()
        events: list[RetryEvent] = []
        with respx.mock(assert_all_called=False) as router:
            for url, responses in answers().items():
                router.post(url).side_effect = responses
            got = run(clock, events, mode)
            sent = [str(call.request.url) for call in router.calls]
        waits = [(e.wait, e.reason, e.attempts) for e in events]
        results.append((got, clock.waits, waits, sent))
    assert results[0] == results[1]
    return results[0]


def test_retry_after_backoff_and_fallback_are_the_same_in_both_shells() -> None:
    got, slept, waits, sent = both(
        run_complete,
        lambda: {
            OPENAI: [error(429, **{"retry-after": "7"}), error(503), error(503)],
            ANTHROPIC: [error(503), httpx.Response(200, json=ANTHROPIC_OK)],
        },
    )
    assert got["text"] == "from claude"
    assert got["answered_by"] == "anthropic:claude-sonnet-4-6"
    assert got["attempts"] == 2
    # Each failed attempt of the primary, as the answer lists them; error answers cost nothing.
    assert [(e["attempt"], e["code"], e["cost_usd"]) for e in got["fallback_errors"]] == [
        (1, "llm.rate_limited", 0.0),
        (2, "llm.server_error", 0.0),
        (3, "llm.server_error", 0.0),
    ]
    # 7 s as the server asked, a 2 s backoff, then the fallback's own 1 s backoff.
    assert slept == [7.0, 2.0, 1.0]
    assert waits == [(7.0, "retry_after", 1), (2.0, "backoff", 2), (1.0, "backoff", 1)]
    assert sent == [OPENAI] * 3 + [ANTHROPIC] * 2


def test_an_interrupted_stream_is_the_same_in_both_shells() -> None:
    got, slept, waits, sent = both(run_stream, lambda: {ANTHROPIC: [streamed(INTERRUPTED)]})
    assert got["seen"] == ["Part"]
    assert got["code"] == "llm.overloaded"
    assert got["details"]["partial_text"] == "Part"
    assert got["details"]["interrupted"] is True
    assert (slept, waits, sent) == ([], [], [ANTHROPIC])  # never retried once text was out


def test_a_stream_retried_before_its_first_event_is_the_same_in_both_shells() -> None:
    got, slept, waits, sent = both(
        run_stream, lambda: {ANTHROPIC: [error(429, **{"retry-after": "3"}), streamed(WHOLE)]}
    )
    assert got["seen"] == ["Hi", "done"]
    assert (slept, waits, sent) == ([3.0], [(3.0, "retry_after", 1)], [ANTHROPIC] * 2)
