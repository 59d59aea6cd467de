"""Real provider error bodies, each with its source, classified as the contract says.

The payloads live in tests/data/provider_errors.json; every case names where
it came from (an SDK's test suite, a provider's docs, a public issue).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fluid_build.copilot.agents import errors
from fluid_build.copilot.agents.error_classification import classify_provider_error
from tests.helpers import status_error

CASES: list[dict[str, Any]] = json.loads(
    (Path(__file__).parent / "data" / "provider_errors.json").read_text(encoding="utf-8")
)
NOW = 1_700_000_000.0


def test_the_table_is_substantial_and_sourced() -> None:
    assert len(CASES) >= 60
    assert len({case["id"] for case in CASES}) == len(CASES)
    assert all(case["source"].strip() for case in CASES)
    providers = {case["provider"] for case in CASES}
    assert {
        "openai",
        "azure",
        "anthropic",
        "gemini",
        "ollama",
        "vllm",
        "llamacpp",
        "mistral",
        "groq",
        "openrouter",
        "proxy",
    } <= providers


@pytest.mark.parametrize("case", CASES, ids=[case["id"] for case in CASES])
def test_classifies_real_payload(case: dict[str, Any]) -> None:
    exc = status_error(
        case["status"],
        case.get("body"),
        body_text=case.get("body_text"),
        headers=case.get("headers"),
    )
    error = classify_provider_error(exc, provider=case["provider"], now=NOW)
    expect = case["expect"]
    assert type(error).__name__ == expect["class"], str(error)
    assert isinstance(error, getattr(errors, expect["class"]))
    assert error.code == expect["code"], str(error)
    assert error.retryable is expect["retryable"], str(error)
    if "retry_after" in expect and expect["retry_after"] is not None:
        assert error.retry_after == pytest.approx(expect["retry_after"])
    if "retry_after_requested" in expect:
        assert error.details["retry_after_requested"] == expect["retry_after_requested"]
        assert "capped at 300 s" in str(error)
    assert isinstance(error, errors.ProviderError)
    assert error.status_code == case["status"]
    assert error.code in errors.REASON_CODES
