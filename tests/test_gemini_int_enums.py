"""Gemini and Vertex AI enums sent as numbers (issue 35 item 3), through LLMClient over respx.

An answer read with ``enum-encoding=int`` names its enums by number. The
answers are built from Google's API reference: the Gemini API's
GenerateContentResponse (Candidate.FinishReason, PromptFeedback.BlockReason in
google/ai/generativelanguage/v1beta/generative_service.proto) and Vertex AI's
(google/cloud/aiplatform/v1/content.proto), whose numbers differ from 6 on.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import respx

from fluid_build.copilot import LLMClient
from fluid_build.copilot.agents.errors import ProviderError
from tests.fakes import FakeClock, clocked_envelope

GEMINI = "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash"


@pytest.fixture
def router() -> Iterator[respx.MockRouter]:
    with respx.mock(assert_all_called=True) as mock:
        yield mock


def _gemini_answer(finish: Any, **extra: Any) -> dict[str, Any]:
    return {
        "candidates": [
            {
                "content": {"parts": [{"text": "Paris."}], "role": "model"},
                "finishReason": finish,
                "index": 0,
                # Harm categories and probabilities as numbers too: read by nobody, refused
                # by nothing.
                "safetyRatings": [{"category": 8, "probability": 1}],
            }
        ],
        "usageMetadata": {"promptTokenCount": 7, "candidatesTokenCount": 2},
        "modelVersion": "gemini-2.5-flash",
        **extra,
    }


def _gemini() -> LLMClient:
    return LLMClient(
        "gemini", "gemini-2.5-flash", api_key="g-key", envelope=clocked_envelope(FakeClock())
    )


@pytest.mark.parametrize(
    ("number", "name"), [(1, "STOP"), (2, "MAX_TOKENS"), (6, "LANGUAGE"), (99, "99")]
)
def test_a_gemini_finish_reason_sent_as_a_number_is_read_as_its_name(
    router: respx.MockRouter, number: int, name: str
) -> None:
    router.post(GEMINI + ":generateContent").respond(200, json=_gemini_answer(number))
    with _gemini() as client:
        done = client.complete("Capital of France?")
    assert (done.text, done.finish_reason) == ("Paris.", name)


@pytest.mark.parametrize("number", [3, 7, 8, 9])  # SAFETY, BLOCKLIST, PROHIBITED_CONTENT, SPII
def test_a_gemini_block_sent_as_a_number_is_content_filtered(
    router: respx.MockRouter, number: int
) -> None:
    router.post(GEMINI + ":generateContent").respond(200, json=_gemini_answer(number))
    with _gemini() as client, pytest.raises(ProviderError) as caught:
        client.complete("Capital of France?")
    assert caught.value.code == "llm.content_filtered"


def test_a_prompt_block_reason_as_a_number_is_named_and_zero_is_no_block(
    router: respx.MockRouter,
) -> None:
    route = router.post(GEMINI + ":generateContent")
    route.side_effect = [
        httpx.Response(200, json={"promptFeedback": {"blockReason": 4}}),
        httpx.Response(200, json=_gemini_answer(1, promptFeedback={"blockReason": 0})),
    ]
    with _gemini() as client:
        with pytest.raises(ProviderError) as caught:
            client.complete("hi")
        assert "PROHIBITED_CONTENT" in str(caught.value)
        assert caught.value.provider_error_type == "PROHIBITED_CONTENT"
        assert client.complete("hi").text == "Paris."  # BLOCK_REASON_UNSPECIFIED: no block


def test_a_gemini_stream_with_number_enums_ends_at_its_finish_reason(
    router: respx.MockRouter,
) -> None:
    first = {"candidates": [{"content": {"parts": [{"text": "Par"}], "role": "model"}}]}
    last = _gemini_answer(1)
    last["candidates"][0]["content"]["parts"] = [{"text": "is."}]
    body = f"data: {json.dumps(first)}\r\n\r\ndata: {json.dumps(last)}\r\n\r\n"
    router.post(GEMINI + ":streamGenerateContent").respond(
        200, text=body, headers={"content-type": "text/event-stream"}
    )
    with _gemini() as client:
        events = list(client.stream("Capital of France?"))
    done = events[-1].completion
    assert done is not None
    assert (done.text, done.finish_reason) == ("Paris.", "STOP")


def _vertex() -> LLMClient:
    return LLMClient(
        "vertex",
        "gemini-2.5-flash",
        api_key="ya29.access-token",
        env={"GOOGLE_CLOUD_PROJECT": "fluid-test", "GOOGLE_CLOUD_LOCATION": "us-central1"},
        envelope=clocked_envelope(FakeClock()),
    )


@pytest.mark.parametrize(
    ("number", "outcome"),
    [(1, "STOP"), (6, "llm.content_filtered"), (10, "llm.content_filtered"), (9, "MALFORMED")],
)
def test_vertex_numbers_its_finish_reasons_its_own_way(
    router: respx.MockRouter, number: int, outcome: str
) -> None:
    """Vertex AI's 6 is BLOCKLIST and 10 MODEL_ARMOR (the Gemini API's 6 is LANGUAGE)."""
    router.post(url__regex=r".*/models/gemini-2\.5-flash:generateContent$").respond(
        200, json=_gemini_answer(number)
    )
    with _vertex() as client:
        if outcome.startswith("llm."):
            with pytest.raises(ProviderError) as caught:
                client.complete("Capital of France?")
            assert caught.value.code == outcome
        else:
            done = client.complete("Capital of France?")
            assert done.finish_reason is not None
            assert done.finish_reason.startswith(outcome)


def test_a_finish_reason_of_another_shape_is_a_malformed_response_not_a_crash(
    router: respx.MockRouter,
) -> None:
    router.post(GEMINI + ":generateContent").respond(200, json=_gemini_answer({"name": "STOP"}))
    with _gemini() as client, pytest.raises(ProviderError) as caught:
        client.complete("hi")
    assert caught.value.code == "llm.malformed_response"
    # The message names the field and what it may be: a name or a number.
    assert caught.value.details["field"] == "candidates.0.finishReason"
    assert caught.value.details["expected"] == "a string or a number or null"


def test_a_safety_block_names_its_harm_category_whatever_the_encoding(
    router: respx.MockRouter,
) -> None:
    ratings = [
        {"category": 10, "probability": 4, "blocked": True},  # DANGEROUS_CONTENT: HIGH
        {"category": "HARM_CATEGORY_HATE_SPEECH", "probability": "NEGLIGIBLE"},
    ]
    router.post(GEMINI + ":generateContent").respond(
        200, json={"promptFeedback": {"blockReason": 1, "safetyRatings": ratings}}
    )
    with _gemini() as client, pytest.raises(ProviderError) as caught:
        client.complete("hi")
    assert "blocked for SAFETY (HARM_CATEGORY_DANGEROUS_CONTENT: HIGH)" in str(caught.value)
    assert caught.value.details["safety_ratings"] == [
        {"category": "HARM_CATEGORY_DANGEROUS_CONTENT", "probability": "HIGH", "blocked": True},
        {"category": "HARM_CATEGORY_HATE_SPEECH", "probability": "NEGLIGIBLE", "blocked": False},
    ]


def test_vertex_numbers_its_harm_categories_its_own_way(router: respx.MockRouter) -> None:
    """Vertex AI's HarmCategory 2 is DANGEROUS_CONTENT (the Gemini API's 2 is TOXICITY)."""
    body = _gemini_answer(3)  # SAFETY on both
    body["candidates"][0]["safetyRatings"] = [{"category": 2, "probability": 3, "blocked": True}]
    router.post(url__regex=r".*/models/gemini-2\.5-flash:generateContent$").respond(200, json=body)
    with _vertex() as client, pytest.raises(ProviderError) as caught:
        client.complete("hi")
    assert caught.value.details["safety_ratings"] == [
        {"category": "HARM_CATEGORY_DANGEROUS_CONTENT", "probability": "MEDIUM", "blocked": True}
    ]
