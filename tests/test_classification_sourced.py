"""Classification defects of issue 14, each pinned on a sourced answer.

The real answers live in tests/data/provider_errors.json, each with its source;
test_provider_payloads.py checks their class, code and retryable. This module
checks what that one does not (the token counts read from an overflow, the
details an answer leaves), and the tables of peers' published tests quoted
below: litellm's tests/test_litellm/litellm_core_utils/test_exception_mapping_utils.py
("litellm's table" here).
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import httpx
import pytest

from fluid_build.copilot.agents.error_classification import (
    classify_provider_error,
    parse_rate_limit_reset,
    parse_retry_after,
)
from fluid_build.copilot.agents.errors import (
    REASON_CODES,
    AgentExecutionError,
    ContextOverflowError,
    ProviderAuthError,
    ProviderError,
    ProviderServerError,
    RateLimitError,
)
from fluid_build.copilot.call.envelope import RetryEnvelope, RetryPolicy
from fluid_build.copilot.llm.settings import PROVIDERS
from tests.fakes import FakeClock, Script
from tests.helpers import request, status_error

NOW = 1_700_000_000.0
CASES: list[dict[str, Any]] = json.loads(
    (Path(__file__).parent / "data" / "provider_errors.json").read_text(encoding="utf-8")
)
EXTRA = ("prompt_tokens", "context_window", "details")


def classify(exc: BaseException, **kwargs: Any) -> ProviderError:
    error = classify_provider_error(exc, now=NOW, **kwargs)
    assert isinstance(error, ProviderError)
    assert error.code in REASON_CODES
    return error


def answer(status: int, message: str, **fields: Any) -> ProviderError:
    return classify(status_error(status, {"error": {"message": message, **fields}}))


# -- what the sourced rows expect beyond class, code and retryable -------------------


@pytest.mark.parametrize(
    "case",
    [case for case in CASES if any(key in case["expect"] for key in EXTRA)],
    ids=lambda case: case["id"],
)
def test_sourced_answer_leaves_the_expected_numbers_and_details(case: dict[str, Any]) -> None:
    exc = status_error(
        case["status"], case.get("body"), body_text=case.get("body_text"), headers=case["headers"]
    )
    error = classify(exc, provider=case["provider"])
    expect = case["expect"]
    if "prompt_tokens" in expect or "context_window" in expect:
        assert isinstance(error, ContextOverflowError)
        assert error.prompt_tokens == expect.get("prompt_tokens")
        assert error.context_window == expect.get("context_window")
    for key, value in expect.get("details", {}).items():
        assert error.details.get(key) == value, key


# -- 1. "rate limit" is a token, never part of an identifier --------------------------


@pytest.mark.parametrize(
    "message",
    [
        # litellm's table: test_is_error_str_rate_limit_ignores_field_name_substring
        "Unknown parameter: '_litellm_rate_limit_descriptors'.",
        "Unrecognized request arguments supplied: _litellm_rate_limit_descriptors, "
        "_litellm_tpm_reserved_tokens",
        "my_rate_limit_field is not allowed",
        # the same flaw in the other phrase lists: a field name echoed back
        "Unknown parameter: 'x_insufficient_quota'.",
        "Unknown parameter: 'my_invalid_api_key_hint'.",
        "Unknown parameter: 'azure_content_filter_config'.",
        "Unknown parameter: 'x-ratelimit-reset'.",
    ],
)
def test_a_phrase_inside_an_identifier_is_an_invalid_request(message: str) -> None:
    error = answer(400, message, type="invalid_request_error")
    assert type(error) is ProviderError
    assert (error.code, error.retryable) == ("llm.invalid_request", False)


@pytest.mark.parametrize(
    "message",
    [
        # litellm's table: test_is_error_str_rate_limit_still_matches_standalone_token
        "Rate limit exceeded for tokens",
        "rate_limit_exceeded: try again later",
        "rate-limit-exceeded",
        "You hit a rate limit",
        "litellm.RateLimitError: OpenAIException - slow down",
        "Requests are rate-limited.",
    ],
)
def test_a_rate_limit_phrase_standing_alone_is_a_rate_limit(message: str) -> None:
    error = answer(400, message)
    assert isinstance(error, RateLimitError)
    assert (error.code, error.retryable) == ("llm.rate_limited", True)


@pytest.mark.parametrize("code", ["rate_limit_exceeded", "rate-limit-exceeded", "RateLimitError"])
def test_a_rate_limit_code_value_is_a_rate_limit(code: str) -> None:
    error = answer(400, "slow down", code=code)
    assert isinstance(error, RateLimitError)


# -- 2. string_above_max_length is an overflow only for the prompt ----------------------


@pytest.mark.parametrize(
    ("param", "message", "overflow"),
    [
        ("messages", "Invalid 'messages': string too long.", True),
        ("messages[0].content", "Invalid 'messages[0].content': string too long.", True),
        ("messages[3].content[0].text", "Invalid 'messages[3].content[0].text': ...", True),
        ("input", "Invalid 'input': string too long.", True),
        ("input[0].content[0].text", "Invalid 'input[0].content[0].text': ...", True),
        # litellm's table: the 'user' parameter is no context window
        (
            "user",
            "Invalid 'user': string too long. Expected a string with maximum length 64, "
            "but got a string with length 123 instead.",
            False,
        ),
        ("tools[0].function.description", "Invalid 'tools[0].function.description': ...", False),
        # issue langmanus/langmanus#119: a tool call id over 40 characters
        (
            "messages[10].tool_calls[0].id",
            "Invalid 'messages[10].tool_calls[0].id': string too long.",
            False,
        ),
        # no param field: the quoted name in the message decides
        (None, "Invalid 'messages[17].content': string too long.", True),
        (None, "Invalid 'user': string too long.", False),
    ],
)
def test_string_above_max_length_is_an_overflow_only_for_the_prompt(
    param: str | None, message: str, overflow: bool
) -> None:
    error = answer(
        400, message, type="invalid_request_error", param=param, code="string_above_max_length"
    )
    assert isinstance(error, ContextOverflowError) is overflow
    assert error.code == ("llm.context_overflow" if overflow else "llm.invalid_request")
    assert not error.retryable


# -- 3. any all-digit wait past the cap is the cap ---------------------------------------


@pytest.mark.parametrize("digits", [7, 30, 31, 40, 308, 309, 400, 5000])
@pytest.mark.parametrize("name", ["retry-after", "retry-after-ms"])
def test_an_all_digit_wait_past_the_cap_is_the_cap(name: str, digits: int) -> None:
    assert parse_retry_after({name: "9" * digits}, now=NOW) == 300.0


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"x-ratelimit-reset": "9" * 31}, 300.0),  # an epoch in ms, far away
        ({"x-ratelimit-reset": "9" * 400}, 300.0),
        ({"x-ratelimit-reset-tokens": "9" * 31 + "s"}, 300.0),
        ({"x-ratelimit-reset-requests": "9" * 400 + "ms"}, 300.0),
        ({"x-ratelimit-reset-tokens": "9" * 400 + "h"}, 300.0),
        ({"x-ratelimit-reset-tokens": "1.5s"}, 1.5),
    ],
)
def test_reset_headers_past_the_cap_are_the_cap(headers: dict[str, str], expected: float) -> None:
    assert parse_rate_limit_reset(headers, now=NOW) == expected


def test_a_huge_wait_is_capped_and_remembered_not_dropped() -> None:
    for wait in ("9" * 30, "9" * 31):
        error = classify(
            status_error(429, body_text="Too Many Requests", headers={"retry-after": wait})
        )
        assert error.retry_after == 300.0
        assert error.details["retry_after_requested"] == float(wait)
    error = answer(429, "Please try again in " + "9" * 40 + " seconds.")
    assert error.retry_after == 300.0
    assert error.details["retry_after_source"] == "message"


@pytest.mark.parametrize("value", ["-1", "1e400", "inf", "nan", "9" * 31 + "x", "0x10"])
def test_what_is_not_all_digits_is_still_no_wait(value: str) -> None:
    assert parse_retry_after({"retry-after": value}, now=NOW) is None


# -- 4. x-should-retry has the last word on retryable ------------------------------------


@pytest.mark.parametrize(
    ("status", "values", "retryable", "overridden"),
    [
        (500, ["false"], False, True),  # Anthropic, anthropics/claude-code#35491
        (429, ["false"], False, True),
        (503, ["true"], True, False),  # agrees with the status
        (429, ["true"], True, False),  # Anthropic, anthropics/anthropic-sdk-typescript#357
        (400, ["true"], True, True),
        (409, ["true"], True, True),
        (500, [" TRUE "], True, False),
        (400, ["False"], False, False),
    ],
)
def test_x_should_retry_overrides_the_status(
    status: int, values: list[str], retryable: bool, overridden: bool
) -> None:
    headers = httpx.Headers([("x-should-retry", value) for value in values])
    error = classify(status_error(status, {"error": {"message": "x"}}, headers=dict(headers)))
    assert error.retryable is retryable
    assert error.details["x_should_retry"] is retryable
    assert (error.details.get("retryable_source") == "x-should-retry header") is overridden


@pytest.mark.parametrize(
    ("status", "body", "code"),
    [
        (
            401,
            {"error": {"message": "Incorrect API key provided", "code": "invalid_api_key"}},
            "llm.auth",
        ),
        (
            400,
            {
                "error": {
                    "message": "maximum context length is 128000 tokens",
                    "code": "context_length_exceeded",
                }
            },
            "llm.context_overflow",
        ),
        (
            429,
            {"error": {"message": "You exceeded your current quota", "code": "insufficient_quota"}},
            "llm.quota_exhausted",
        ),
        (
            400,
            {"error": {"message": "x", "code": "content_policy_violation"}},
            "llm.content_filtered",
        ),
    ],
)
def test_x_should_retry_true_never_revives_what_the_body_proved_cannot_succeed(
    status: int, body: dict[str, Any], code: str
) -> None:
    error = classify(status_error(status, body, headers={"x-should-retry": "true"}))
    assert error.code == code
    assert error.retryable is False
    assert error.details["x_should_retry"] is True
    assert "retryable_source" not in error.details


@pytest.mark.parametrize("value", ["", "yes", "1", "maybe", "true, false", "truefalse"])
@pytest.mark.parametrize(("status", "retryable"), [(500, True), (400, False), (429, True)])
def test_a_garbage_x_should_retry_is_ignored(value: str, status: int, retryable: bool) -> None:
    error = classify(
        status_error(status, {"error": {"message": "x"}}, headers={"x-should-retry": value})
    )
    assert error.retryable is retryable
    assert "x_should_retry" not in error.details


def test_contradicting_x_should_retry_headers_are_ignored() -> None:
    req = httpx.Request("POST", "https://api.openai.com/v1/chat/completions")
    response = httpx.Response(
        500, headers=[("x-should-retry", "true"), ("x-should-retry", "false")], request=req
    )
    error = classify(httpx.HTTPStatusError("x", request=req, response=response))
    assert error.retryable
    assert "x_should_retry" not in error.details


def test_the_envelope_follows_x_should_retry_false_and_makes_one_attempt() -> None:
    clock = FakeClock()
    refused = status_error(500, {"error": {"message": "x"}}, headers={"x-should-retry": "false"})
    script = Script(refused, "never")
    env = RetryEnvelope(RetryPolicy(), clock=clock, sleep=clock.sleep, random=lambda: 0.0)
    with pytest.raises(AgentExecutionError) as caught:
        env.call(script)
    assert script.calls == 1
    assert clock.waits == []
    assert caught.value.details["retryable_source"] == "x-should-retry header"


def test_the_envelope_retries_a_400_the_server_calls_retryable() -> None:
    clock = FakeClock()
    flaky = status_error(400, {"error": {"message": "x"}}, headers={"x-should-retry": "true"})
    script = Script(flaky, "ok")
    env = RetryEnvelope(RetryPolicy(), clock=clock, sleep=clock.sleep, random=lambda: 0.0)
    assert env.call(script) == "ok"
    assert clock.waits == [1.0]


# -- 5. overflow wordings, and the numbers they state -----------------------------------


@pytest.mark.parametrize(
    ("message", "prompt_tokens", "window"),
    [
        # litellm's table, context_window_test_cases
        (
            "An error occurred: The input exceeds the model's maximum context limit of 8192 "
            "tokens.",
            None,
            8192,
        ),
        ("Current length is 132784 while limit is 131000", 132784, 131000),
        (
            "CerebrasException - Please reduce the length of the messages or completion. Current "
            "length is 50000 while limit is 40000",
            50000,
            40000,
        ),
        (
            "request (67311 tokens) exceeds the available context size (65536 tokens), try "
            "increasing it",
            67311,
            65536,
        ),
        (
            "The input token count exceeds the maximum number of tokens allowed 1048576.",
            None,
            1048576,
        ),
        (
            "AnthropicException - input length and max_tokens exceed context limit: 200000 + "
            "8000 > 200000, decrease input length or max_tokens and try again",
            None,
            None,
        ),
        # the bare form of Anthropic's "prompt is too long: N tokens > M maximum"
        ("250000 tokens > 200000 maximum", 250000, 200000),
        # Vertex, google-gemini/gemini-cli#19727
        (
            "Unable to submit request because the input token count is 1251952 but model only "
            "supports up to 1048576. Reduce the input token count and try again.",
            1251952,
            1048576,
        ),
        # Cohere, cohere-ai/sandbox-topically#4
        (
            "too many tokens: total number of tokens (prompt and prediction) cannot exceed 2048 "
            "- received 6354. Try using a shorter prompt or a smaller max_tokens value.",
            6354,
            2048,
        ),
        # llama.cpp tools/server: the embedding form of the same refusal
        ("input (5000 tokens) is larger than the max context size (4096 tokens)", 5000, 4096),
    ],
)
def test_overflow_wordings_and_their_numbers(
    message: str, prompt_tokens: int | None, window: int | None
) -> None:
    error = answer(400, message)
    assert isinstance(error, ContextOverflowError), message
    assert (error.prompt_tokens, error.context_window) == (prompt_tokens, window)
    assert not error.retryable


@pytest.mark.parametrize(
    "message",
    [
        # litellm's table, the negative rows
        "A generic API error occurred.",
        "Rate limit reached for requests.",
        "The context is large, but acceptable.",
        # a per-minute token limit is a rate limit, not a prompt that cannot fit
        "Too many tokens per minute, slow down.",
    ],
)
def test_wordings_that_are_not_overflows(message: str) -> None:
    assert not isinstance(answer(400, message), ContextOverflowError)


# -- 6. content-policy refusals ----------------------------------------------------------


@pytest.mark.parametrize(
    "message",
    [
        # litellm's table: test_is_azure_content_policy_violation_error_with_policy_violation_text
        "invalid_request_error content_policy_violation occurred",
        "The response was filtered due to the prompt triggering Azure OpenAI's content "
        "management policy",
        "Your task failed as a result of our safety system detecting harmful content",
        "The model produced invalid content that violates our policy",
        "Request blocked due to content_filter_policy restrictions",
        # Anthropic, anthropics/claude-code#43487
        "Output blocked by content filtering policy",
    ],
)
def test_content_policy_refusals_are_content_filtered(message: str) -> None:
    error = answer(400, message)
    assert type(error) is ProviderError
    assert (error.code, error.retryable) == ("llm.content_filtered", False)


@pytest.mark.parametrize(
    "message",
    [
        # litellm's table: the negative partial matches
        "Invalid content format in request",
        "Policy configuration error",
        "Content type not supported",
        "Management API unavailable",
    ],
)
def test_words_near_a_policy_are_no_refusal(message: str) -> None:
    assert answer(400, message).code == "llm.invalid_request"


# -- issue 35 item 4: the wordings litellm's table reads otherwise -----------------------


@pytest.mark.parametrize(
    "message",
    [
        # litellm's table: test_is_azure_content_policy_violation_error_case_insensitive
        "The Response Was Filtered Due To The Prompt Triggering Azure OpenAI's Content Management",
        "THE RESPONSE WAS FILTERED DUE TO THE PROMPT TRIGGERING AZURE OPENAI'S CONTENT MANAGEMENT",
        "The response was filtered due to the prompt triggering Azure OpenAI\u2019s content "
        "management",
        "INVALID_REQUEST_ERROR CONTENT_POLICY_VIOLATION",
        "YOUR TASK FAILED AS A RESULT OF OUR SAFETY SYSTEM",
        "Content_Filter_Policy restriction detected",
    ],
)
def test_a_refusal_in_any_case_is_content_filtered(message: str) -> None:
    error = answer(400, message)
    assert (error.code, error.retryable) == ("llm.content_filtered", False)


@pytest.mark.parametrize(
    "message",
    [
        "Content Management API unavailable",
        "Your content management settings were saved",
        "The prompt triggered a validation error",
    ],
)
def test_content_management_alone_is_no_refusal(message: str) -> None:
    assert answer(400, message).code == "llm.invalid_request"


@pytest.mark.parametrize(
    ("message", "overflow"),
    [
        (
            "Invalid 'messages[17].content': string too long. Expected a string with maximum "
            "length 1048576, but got a string with length 1744259 instead.",
            True,
        ),
        ("INVALID 'INPUT': STRING TOO LONG. EXPECTED A STRING WITH MAXIMUM LENGTH 10", True),
        (
            "Invalid 'user': string too long. Expected a string with maximum length 64, "
            "but got a string with length 123 instead.",
            False,
        ),
        # litellm's row names no string: nothing says it is the prompt
        ("Validation Error: string too long. expected a string with maximum length 1000.", False),
    ],
)
def test_the_string_too_long_wording_alone_reads_as_its_code(message: str, overflow: bool) -> None:
    error = answer(400, message)
    assert isinstance(error, ContextOverflowError) is overflow
    assert error.code == ("llm.context_overflow" if overflow else "llm.invalid_request")
    assert not error.retryable


@pytest.mark.parametrize("status", [400, 500])
def test_the_model_producing_invalid_content_is_a_server_error_worth_retrying(status: int) -> None:
    error = answer(
        status,
        "The model produced invalid content. Consider modifying your prompt if you are seeing "
        "this error persistently.",
        type="model_error",
    )
    assert type(error) is ProviderServerError
    assert (error.code, error.retryable) == ("llm.server_error", True)


def test_google_status_in_lower_case_is_still_a_per_minute_limit() -> None:
    # A relay that lower-cases Google's status: its "exceeded your current quota" is still
    # RESOURCE_EXHAUSTED per minute (no per-day id, no "limit: 0"), not a spent quota.
    body = {
        "error": {
            "code": 429,
            "message": "You exceeded your current quota, please check your plan and billing "
            "details.",
            "status": "resource_exhausted",
        }
    }
    error = classify(status_error(429, body))
    assert isinstance(error, RateLimitError)
    assert (error.code, error.retryable) == ("llm.rate_limited", True)


def test_a_quota_of_zero_in_any_case_is_spent() -> None:
    body = {
        "error": {
            "code": 429,
            "message": "Quota exceeded for metric: generate_content_free_tier_requests, "
            "Limit: 0, model: gemini-2.5-pro",
            "status": "RESOURCE_EXHAUSTED",
        }
    }
    error = classify(status_error(429, body))
    assert (error.code, error.retryable) == ("llm.quota_exhausted", False)


# -- 7. an upstream 429 relayed as a 5xx ---------------------------------------------------


@pytest.mark.parametrize("status", [500, 502, 503, 504])
def test_a_5xx_carrying_429_is_a_rate_limit_that_honours_retry_after(status: int) -> None:
    body = {"error": {"message": "bad gateway", "code": 429}}  # litellm's table, the 502 row
    error = classify(status_error(status, body, headers={"retry-after-ms": "2500"}))
    assert isinstance(error, RateLimitError)
    assert (error.code, error.retryable, error.retry_after) == ("llm.rate_limited", True, 2.5)
    assert error.status_code == status


def test_a_5xx_saying_resource_exhausted_is_a_rate_limit_with_its_retry_delay() -> None:
    body = {
        "error": {
            "code": 503,
            "message": "Resource has been exhausted (e.g. check quota).",
            "status": "RESOURCE_EXHAUSTED",
            "details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "7s"}],
        }
    }
    error = classify(status_error(503, body))
    assert isinstance(error, RateLimitError)
    assert (error.code, error.retry_after) == ("llm.rate_limited", 7.0)


def test_a_5xx_without_429_stays_a_server_error() -> None:
    # litellm's table: "HTTP 500 with body code:500 stays InternalServerError"
    error = classify(status_error(500, {"error": {"message": "server boom", "code": 500}}))
    assert type(error) is ProviderServerError


# -- 8. the advice for a rejected key names the right variable ---------------------------


@pytest.mark.parametrize(("provider", "server"), [("vllm", "vLLM"), ("llamacpp", "llama.cpp")])
def test_a_local_server_rejecting_the_key_names_openai_api_key_and_api_key(
    provider: str, server: str
) -> None:
    # llama.cpp's answer (tools/server/server.cpp middleware_validate_api_key)
    body = {"error": {"code": 401, "message": "Invalid API Key", "type": "authentication_error"}}
    error = classify(status_error(401, body), provider=provider)
    assert isinstance(error, ProviderAuthError)
    assert "OPENAI_API_KEY" in error.action
    assert f"--api-key the {server} server was started with" in error.action
    assert error.action in str(error)
    again = pickle.loads(pickle.dumps(error))  # noqa: S301 - our own bytes
    assert again.action == error.action


@pytest.mark.parametrize(
    ("provider", "variable"),
    [
        ("openai", "OPENAI_API_KEY"),
        ("anthropic", "ANTHROPIC_API_KEY"),
        ("gemini", "GEMINI_API_KEY"),
        ("azure", "AZURE_OPENAI_API_KEY"),
        ("groq", "GROQ_API_KEY"),
        ("mistral", "MISTRAL_API_KEY"),
        ("openrouter", "OPENROUTER_API_KEY"),
    ],
)
def test_a_provider_rejecting_the_key_names_its_own_variable(provider: str, variable: str) -> None:
    error = classify(status_error(401, {"error": {"message": "bad key"}}), provider=provider)
    assert variable in error.action
    assert f"--provider {provider}" in error.action
    assert error.action.startswith(f"Check {variable} ")


@pytest.mark.parametrize("provider", [None, "ollama", "someproxy"])
def test_an_unknown_provider_gets_the_general_key_advice(provider: str | None) -> None:
    req = httpx.Request("POST", "https://llm.example.test/v1/chat/completions")
    error = classify(status_error(401, req=req), provider=provider)
    assert error.provider == provider
    assert error.action == REASON_CODES["llm.auth"].action


def test_the_advice_agrees_with_the_provider_table() -> None:
    for name, info in PROVIDERS.items():
        action = ProviderAuthError("x", provider=name).action
        if name in {"vllm", "llamacpp"}:
            assert "OPENAI_API_KEY" in action
            assert set(info.key_vars) <= {"OPENAI_API_KEY"}
        elif info.key_vars:
            assert f"Check {info.key_vars[0]} " in action, name


@pytest.mark.parametrize("seconds", [10**400, "9" * 400, 31])
def test_a_google_retry_delay_of_any_length_is_a_wait_up_to_the_cap(seconds: Any) -> None:
    body = {
        "error": {
            "code": 429,
            "message": "Resource has been exhausted (e.g. check quota).",
            "status": "RESOURCE_EXHAUSTED",
            "details": [
                {
                    "@type": "type.googleapis.com/google.rpc.RetryInfo",
                    "retryDelay": {"seconds": seconds, "nanos": 0},
                }
            ],
        }
    }
    url = "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash:generateContent"
    error = classify(status_error(429, body, req=request(url)), provider="gemini")
    assert error.retry_after == (31.0 if seconds == 31 else 300.0)
