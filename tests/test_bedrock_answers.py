"""Bedrock answers read right (issue 35 items 1 and 2), through LLMClient over respx.

The answers are built from AWS's Bedrock API reference, not copied from a
recording: ConverseResponse / ConverseStreamMetadataEvent with a
``trace.guardrail`` (GuardrailTraceAssessment: ``inputAssessment``,
``outputAssessments``, each a GuardrailAssessment whose policies' findings
carry an ``action`` of BLOCKED, ANONYMIZED or NONE), a ``citationsContent``
content block (CitationsContentBlock: ``content`` of CitationGeneratedContent,
``citations`` of Citation) and its stream form (ContentBlockDelta
``citation``: CitationsDelta).
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterator
from typing import Any

import pytest
import respx

from fluid_build.copilot import LLMClient
from fluid_build.copilot.agents.errors import ProviderError
from tests.fakes import FakeClock, clocked_envelope

MODEL = "amazon.nova-micro-v1:0"
CONVERSE = f"https://bedrock-runtime.us-east-1.amazonaws.com/model/{MODEL}/converse"
USAGE = {"inputTokens": 21, "outputTokens": 9, "totalTokens": 30}
METRICS = {"latencyMs": 412}
MASKED_TEXT = "Send the refund to {NAME} at {EMAIL}."
BLOCKED_TEXT = "Sorry, the model cannot answer this question."


@pytest.fixture
def router() -> Iterator[respx.MockRouter]:
    with respx.mock(assert_all_called=True) as mock:
        yield mock


def _bedrock() -> LLMClient:
    # A Bedrock API key (a bearer token): no SigV4, no AWS credential chain.
    return LLMClient(
        "bedrock",
        MODEL,
        api_key="bedrock-api-key",
        env={"AWS_REGION": "us-east-1"},
        envelope=clocked_envelope(FakeClock()),
    )


def _assessment(policy: str, key: str, findings: list[dict[str, Any]]) -> dict[str, Any]:
    """One GuardrailAssessment: a policy's findings and the invocation's metrics."""
    return {
        policy: {key: findings},
        "invocationMetrics": {
            "guardrailProcessingLatency": 95,
            "usage": {"sensitiveInformationPolicyUnits": 1, "contentPolicyUnits": 1},
            "guardrailCoverage": {"textCharacters": {"guarded": 60, "total": 60}},
        },
    }


#: The guardrail masked two PII entities of the answer (ANONYMIZED), blocked nothing.
MASKING_TRACE = {
    "guardrail": {
        "modelOutput": ["Send the refund to Jane Doe at jane@example.com."],
        "inputAssessment": {
            "gr1abc2def3": _assessment("sensitiveInformationPolicy", "piiEntities", [])
        },
        "outputAssessments": {
            "gr1abc2def3": [
                _assessment(
                    "sensitiveInformationPolicy",
                    "piiEntities",
                    [
                        {"match": "Jane Doe", "type": "NAME", "action": "ANONYMIZED"},
                        {"match": "jane@example.com", "type": "EMAIL", "action": "ANONYMIZED"},
                    ],
                )
            ]
        },
    }
}
#: The guardrail's content filter blocked the prompt (BLOCKED): the text is its messaging.
BLOCKING_TRACE = {
    "guardrail": {
        "inputAssessment": {
            "gr1abc2def3": _assessment(
                "contentPolicy",
                "filters",
                [
                    {
                        "type": "VIOLENCE",
                        "confidence": "HIGH",
                        "filterStrength": "HIGH",
                        "action": "BLOCKED",
                        "detected": True,
                    }
                ],
            )
        }
    }
}


def _converse(text: str, stop: str, trace: dict[str, Any] | None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "output": {"message": {"role": "assistant", "content": [{"text": text}]}},
        "stopReason": stop,
        "usage": USAGE,
        "metrics": METRICS,
    }
    if trace is not None:
        body["trace"] = trace
    return body


def frame(event: str, payload: dict[str, Any]) -> bytes:
    """One AWS event-stream frame (string headers), as ConverseStream sends an event."""
    headers = {":event-type": event, ":content-type": "application/json", ":message-type": "event"}
    raw = b""
    for name, value in headers.items():
        raw += bytes([len(name)]) + name.encode() + b"\x07" + len(value).to_bytes(2, "big")
        raw += value.encode()
    body = json.dumps(payload).encode()
    total = 16 + len(raw) + len(body)
    prelude = total.to_bytes(4, "big") + len(raw).to_bytes(4, "big")
    prelude += zlib.crc32(prelude).to_bytes(4, "big")
    message = prelude + raw + body
    return message + zlib.crc32(message).to_bytes(4, "big")


def _converse_stream(
    deltas: list[dict[str, Any]], stop: str, trace: dict[str, Any] | None
) -> bytes:
    metadata: dict[str, Any] = {"usage": USAGE, "metrics": METRICS}
    if trace is not None:
        metadata["trace"] = trace
    return b"".join(
        [
            frame("messageStart", {"role": "assistant"}),
            *(frame("contentBlockDelta", d) for d in deltas),
            frame("contentBlockStop", {"contentBlockIndex": 0}),
            frame("messageStop", {"stopReason": stop}),
            frame("metadata", metadata),
        ]
    )


def _stream_route(router: respx.MockRouter, body: bytes) -> None:
    router.post(CONVERSE + "-stream").respond(
        200, content=body, headers={"content-type": "application/vnd.amazon.eventstream"}
    )


def _text_deltas(text: str) -> list[dict[str, Any]]:
    half = len(text) // 2
    return [
        {"contentBlockIndex": 0, "delta": {"text": text[:half]}},
        {"contentBlockIndex": 0, "delta": {"text": text[half:]}},
    ]


# -- item 1: a guardrail that masks is an answer, one that blocks is a refusal ----------


def test_a_guardrail_that_masked_the_answer_delivers_it_with_its_actions(
    router: respx.MockRouter,
) -> None:
    router.post(CONVERSE).respond(
        200, json=_converse(MASKED_TEXT, "guardrail_intervened", MASKING_TRACE)
    )
    with _bedrock() as client:
        done = client.complete("Where does the refund go?")
    assert done.text == MASKED_TEXT
    assert done.finish_reason == "guardrail_intervened"
    assert done.details["guardrail"] == {
        "masked": True,
        "actions": [
            {
                "where": "output",
                "policy": "sensitiveInformationPolicy",
                "action": "ANONYMIZED",
                "type": "NAME",
            },
            {
                "where": "output",
                "policy": "sensitiveInformationPolicy",
                "action": "ANONYMIZED",
                "type": "EMAIL",
            },
        ],
    }
    # What the guardrail matched (the PII itself) is never copied into the answer's details.
    assert "Jane Doe" not in json.dumps(done.details)
    assert done.usage.input_tokens == 21


def test_a_guardrail_that_blocked_is_content_filtered_naming_the_policy(
    router: respx.MockRouter,
) -> None:
    router.post(CONVERSE).respond(
        200, json=_converse(BLOCKED_TEXT, "guardrail_intervened", BLOCKING_TRACE)
    )
    with _bedrock() as client, pytest.raises(ProviderError) as caught:
        client.complete("something violent")
    error = caught.value
    assert (error.code, error.retryable) == ("llm.content_filtered", False)
    assert "contentPolicy" in str(error)
    assert error.details["guardrail_actions"] == [
        {"where": "input", "policy": "contentPolicy", "action": "BLOCKED", "type": "VIOLENCE"}
    ]
    assert len(router.calls) == 1  # a refusal is not retried


def test_a_guardrail_stop_without_a_trace_is_taken_for_a_block_and_says_how_to_tell(
    router: respx.MockRouter,
) -> None:
    router.post(CONVERSE).respond(200, json=_converse(BLOCKED_TEXT, "guardrail_intervened", None))
    with _bedrock() as client, pytest.raises(ProviderError) as caught:
        client.complete("hi")
    assert caught.value.code == "llm.content_filtered"
    assert '"trace": "enabled"' in str(caught.value)


def test_a_masked_stream_delivers_its_text_and_ends_with_the_guardrail_in_details(
    router: respx.MockRouter,
) -> None:
    _stream_route(
        router, _converse_stream(_text_deltas(MASKED_TEXT), "guardrail_intervened", MASKING_TRACE)
    )
    with _bedrock() as client:
        events = list(client.stream("Where does the refund go?"))
    texts = [e.text for e in events if e.type == "text"]
    assert "".join(texts) == MASKED_TEXT
    done = events[-1].completion
    assert events[-1].type == "done"
    assert done is not None
    assert done.text == MASKED_TEXT
    assert done.finish_reason == "guardrail_intervened"
    assert [a["type"] for a in done.details["guardrail"]["actions"]] == ["NAME", "EMAIL"]


def test_a_blocked_stream_raises_content_filtered_after_its_messaging(
    router: respx.MockRouter,
) -> None:
    _stream_route(
        router,
        _converse_stream(_text_deltas(BLOCKED_TEXT), "guardrail_intervened", BLOCKING_TRACE),
    )
    seen: list[str] = []

    def read() -> None:
        with _bedrock() as client:
            seen.extend(event.type for event in client.stream("something violent"))

    with pytest.raises(ProviderError) as caught:
        read()
    assert caught.value.code == "llm.content_filtered"
    assert caught.value.details["guardrail_actions"][0]["action"] == "BLOCKED"
    assert seen == ["text", "text"]  # its messaging reached the caller, then the refusal


# -- item 2: citationsContent is answer text, and its citations are kept ----------------

CITATION = {
    "title": "expense-policy.pdf",
    "sourceContent": [{"text": "Expense reports are due within 30 days of purchase."}],
    "location": {"documentChar": {"documentIndex": 0, "start": 120, "end": 172}},
}
CITED = "submit expense reports within 30 days of purchase."
SENTENCE = "Employees should " + CITED + " Late reports need a manager's approval."


def test_text_inside_citations_content_is_answer_text_and_the_citations_are_kept(
    router: respx.MockRouter,
) -> None:
    content = [
        {"text": "Employees should "},
        {"citationsContent": {"content": [{"text": CITED}], "citations": [CITATION]}},
        {"text": " Late reports need a manager's approval."},
    ]
    body = {
        "output": {"message": {"role": "assistant", "content": content}},
        "stopReason": "end_turn",
        "usage": USAGE,
        "metrics": METRICS,
    }
    router.post(CONVERSE).respond(200, json=body)
    with _bedrock() as client:
        done = client.complete("When are expense reports due?")
    assert done.text == SENTENCE
    assert done.details == {"citations": [CITATION]}
    assert done.finish_reason == "end_turn"


def test_a_streamed_cited_answer_reads_the_same_with_its_citations(
    router: respx.MockRouter,
) -> None:
    deltas = [
        {"contentBlockIndex": 0, "delta": {"text": "Employees should "}},
        {"contentBlockIndex": 1, "delta": {"citation": CITATION}},
        {"contentBlockIndex": 1, "delta": {"text": CITED}},
        {"contentBlockIndex": 2, "delta": {"text": " Late reports need a manager's approval."}},
    ]
    _stream_route(router, _converse_stream(deltas, "end_turn", None))
    with _bedrock() as client:
        events = list(client.stream("When are expense reports due?"))
    done = events[-1].completion
    assert done is not None
    assert done.text == SENTENCE
    assert done.details == {"citations": [CITATION]}


def test_an_answer_without_citations_or_guardrail_has_no_details(
    router: respx.MockRouter,
) -> None:
    router.post(CONVERSE).respond(200, json=_converse("hi", "end_turn", None))
    with _bedrock() as client:
        assert client.complete("hi").details == {}
