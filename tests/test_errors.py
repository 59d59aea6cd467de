"""The typed error hierarchy: shape, value semantics and redaction."""

from __future__ import annotations

import copy
import json
import pickle
from typing import Any

import pydantic
import pytest

from fluid_build import FluidError as RootFluidError
from fluid_build.copilot.agents import errors
from fluid_build.copilot.agents.errors import (
    MAX_RETRY_AFTER,
    REASON_CODES,
    AgentExecutionError,
    ContextOverflowError,
    FluidError,
    FluidGenerationError,
    ProviderAuthError,
    ProviderError,
    ProviderServerError,
    ProviderTimeoutError,
    RateLimitError,
    SchemaValidationError,
    ToolValidationError,
)
from tests.helpers import SECRET_KEY

PARENTS: dict[type[Exception], type[Exception]] = {
    FluidGenerationError: FluidError,
    AgentExecutionError: FluidGenerationError,
    ProviderError: AgentExecutionError,
    RateLimitError: ProviderError,
    ProviderTimeoutError: ProviderError,
    ContextOverflowError: ProviderError,
    ProviderAuthError: ProviderError,
    ProviderServerError: ProviderError,
    SchemaValidationError: AgentExecutionError,
    ToolValidationError: AgentExecutionError,
}

SECRETS = [
    SECRET_KEY,
    "sk-ant-api03-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789",
    "AIzaSyD-1234567890abcdefghijklmnopqrstu",
    "gsk_abcdefghijklmnopqrstuvwxyz012345",
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N",
]


def leaky_message() -> str:
    return (
        f"key {SECRETS[0]} rejected; Authorization: Bearer {SECRETS[1]}\n"
        f"x-goog-api-key: {SECRETS[2]} url https://h/v1?key={SECRETS[2]}&alt=sse "
        f"{{'api_key': '{SECRETS[3]}'}} token={SECRETS[4]}"
    )


def every_error() -> list[AgentExecutionError]:
    leak = leaky_message()
    provider_fields: dict[str, Any] = {
        "provider": "openai",
        "status_code": 429,
        "model": "gpt-4o",
        "provider_error_type": "rate_limit_error",
        "provider_error_code": "rate_limit_exceeded",
        "request_id": "req_123",
        "headers": {
            "Retry-After": "3",
            "Set-Cookie": f"session={SECRETS[0]}",
            "X-Request-Id": "r1",
        },
        "retry_after": 3.0,
        "details": {"body": leak, "nested": [{"authorization": "Bearer abcdefghijklmnop"}]},
    }
    return [
        AgentExecutionError(leak, details={"why": leak}),
        ProviderError(leak, code="llm.invalid_request", **provider_fields),
        RateLimitError(leak, **provider_fields),
        ProviderTimeoutError(leak, provider="anthropic", details={"timeout_seconds": 120.0}),
        ContextOverflowError(
            leak, prompt_tokens=210_000, context_window=200_000, provider="anthropic"
        ),
        ProviderAuthError(leak, provider="gemini", status_code=400),
        ProviderServerError(leak, provider="openai", status_code=503, code="llm.overloaded"),
        SchemaValidationError(
            leak,
            schema_name="ForgeOutput",
            validation_errors=[{"loc": "contract.name", "msg": leak, "type": "missing"}],
            raw_output=leak,
        ),
        ToolValidationError(
            tool_name="read_sample_schema",
            tool_args={"path": "../../etc/passwd", "api_key": SECRETS[0], "note": leak},
            reason=leak,
            code="tool.workspace_violation",
        ),
    ]


ERRORS = every_error()
IDS = [f"{type(e).__name__}-{i}" for i, e in enumerate(ERRORS)]


def rendered(error: AgentExecutionError) -> str:
    return "\n".join([str(error), repr(error), json.dumps(error.to_dict())])


def test_hierarchy_is_exactly_the_seed() -> None:
    for cls, parent in PARENTS.items():
        assert cls.__bases__ == (parent,), cls
    assert FluidError is RootFluidError
    assert FluidError.__bases__ == (Exception,)


def test_except_fluid_error_catches_every_class() -> None:
    for error in ERRORS:
        with pytest.raises(FluidError):
            raise error


def test_public_names_are_exported_and_sorted() -> None:
    assert len(set(errors.__all__)) == len(errors.__all__)
    for name in errors.__all__:
        assert hasattr(errors, name)
    for cls in PARENTS:
        assert cls.__name__ in errors.__all__


@pytest.mark.parametrize("error", ERRORS, ids=IDS)
def test_no_secret_in_str_repr_or_to_dict(error: AgentExecutionError) -> None:
    text = rendered(error)
    for secret in SECRETS:
        assert secret not in text
    assert "abcdefghijklmnop" not in text
    assert "[REDACTED]" in text


@pytest.mark.parametrize("error", ERRORS, ids=IDS)
def test_str_is_one_operator_line_with_code_and_action(error: AgentExecutionError) -> None:
    text = str(error)
    assert "\n" not in text
    assert f"[{error.code}]" in text
    assert error.action in text
    assert error.code in REASON_CODES


@pytest.mark.parametrize("error", ERRORS, ids=IDS)
def test_pickle_and_copy_round_trip(error: AgentExecutionError) -> None:
    for clone in (
        pickle.loads(pickle.dumps(error)),  # noqa: S301 - our own bytes
        copy.copy(error),
        copy.deepcopy(error),
    ):
        assert type(clone) is type(error)
        assert clone == error
        assert clone.to_dict() == error.to_dict()
        assert str(clone) == str(error)
        assert clone.args == error.args
        assert hash(clone) == hash(error)


@pytest.mark.parametrize("error", ERRORS, ids=IDS)
def test_to_dict_is_json_and_complete(error: AgentExecutionError) -> None:
    data = json.loads(json.dumps(error.to_dict()))
    assert data["error"] == type(error).__name__
    assert data["code"] == error.code
    assert data["retryable"] == error.retryable
    assert data["retry_after"] == error.retry_after
    assert isinstance(data["details"], dict)
    if isinstance(error, ProviderError):
        for field in (
            "provider",
            "status_code",
            "model",
            "provider_error_type",
            "provider_error_code",
            "request_id",
            "headers",
        ):
            assert field in data
    if isinstance(error, SchemaValidationError):
        assert {"schema_name", "validation_errors", "raw_output"} <= data.keys()
    if isinstance(error, ToolValidationError):
        assert {"tool_name", "tool_args", "reason"} <= data.keys()


def test_equality_is_by_value_and_class() -> None:
    a = RateLimitError("slow down", provider="openai", retry_after=2)
    assert a == RateLimitError("slow down", provider="openai", retry_after=2)
    assert a != RateLimitError("slow down", provider="openai", retry_after=3)
    assert a != ProviderServerError("slow down", provider="openai", retry_after=2)
    assert len({a, copy.copy(a)}) == 1


@pytest.mark.parametrize(
    ("cls", "code", "retryable"),
    [
        (AgentExecutionError, "agent.execution_failed", False),
        (ProviderError, "llm.provider_error", False),
        (RateLimitError, "llm.rate_limited", True),
        (ProviderTimeoutError, "llm.timeout", True),
        (ContextOverflowError, "llm.context_overflow", False),
        (ProviderAuthError, "llm.auth", False),
        (ProviderServerError, "llm.server_error", True),
        (SchemaValidationError, "llm.schema_violation", False),
        (ToolValidationError, "tool.invalid_input", False),
    ],
)
def test_defaults_per_class(cls: type[AgentExecutionError], code: str, retryable: bool) -> None:
    error = cls("x")
    assert error.code == code
    assert error.retryable is retryable
    assert error.retry_after is None
    assert error.details == {}
    assert REASON_CODES[code].retryable is retryable


def test_quota_exhausted_rate_limit_is_not_retryable() -> None:
    error = RateLimitError("out of credits", code="llm.quota_exhausted", retryable=False)
    assert isinstance(error, RateLimitError)
    assert not error.retryable


@pytest.mark.parametrize(
    ("given", "kept"),
    [
        (2, 2.0),
        (0, 0.0),
        (1e9, MAX_RETRY_AFTER),
        (-1, None),
        (float("nan"), None),
        (float("inf"), None),
        ("7", 7.0),
        ("soon", None),
        (None, None),
    ],
)
def test_retry_after_is_cleaned(given: Any, kept: float | None) -> None:
    assert RateLimitError("x", retry_after=given).retry_after == kept


def test_headers_keep_rate_limit_and_ids_only() -> None:
    error = RateLimitError(
        "x",
        headers={
            "Retry-After": "3",
            "X-RateLimit-Remaining-Tokens": "0",
            "Set-Cookie": "a=b",
            "Authorization": f"Bearer {SECRET_KEY}",
            "request-id": "req_1",
        },
    )
    assert error.headers == {
        "retry-after": "3",
        "x-ratelimit-remaining-tokens": "0",
        "request-id": "req_1",
    }


def test_details_are_json_safe_and_bounded() -> None:
    class Hostile:
        def __repr__(self) -> str:
            raise RuntimeError("no")

    details = {
        "nan": float("nan"),
        "bytes": b"\xff\xfeabc",
        "obj": object(),
        "hostile": Hostile(),
        "deep": [[[[[[[[[[["bottom"]]]]]]]]]]],
        "many": list(range(500)),
        "long": "x" * 10_000,
        "password": "hunter2hunter2",
    }
    error = AgentExecutionError("x", details=details)
    json.dumps(error.to_dict())
    assert error.details["nan"] == "nan"
    assert error.details["password"] == "[REDACTED]"
    many = error.details["many"]
    assert isinstance(many, list)
    assert len(many) == 101
    long = error.details["long"]
    assert isinstance(long, str)
    assert len(long) <= 4000


def test_message_is_one_line_and_bounded() -> None:
    error = ProviderError("line one\nline two\r\n\tthree " + "y" * 5000)
    assert "\n" not in error.message
    assert len(error.message) <= 600
    assert error.message.startswith("line one line two three")


def test_secrets_given_by_value_are_redacted_whatever_their_shape() -> None:
    odd_key = "my-company-key-0f9e8d7c6b5a"
    error = ProviderAuthError(
        f"key {odd_key} is invalid", secrets=[odd_key], details={"k": odd_key}
    )
    assert odd_key not in rendered(error)
    assert "secrets" not in error.__dict__


def test_context_overflow_carries_counts() -> None:
    error = ContextOverflowError("too long", prompt_tokens=9000, context_window=8192)
    assert (error.prompt_tokens, error.context_window) == (9000, 8192)
    assert error.to_dict()["prompt_tokens"] == 9000


class Contract(pydantic.BaseModel):
    name: str
    version: int


def test_schema_validation_error_from_pydantic_keeps_paths_not_inputs() -> None:
    raw = '{"name": 5, "version": "sk-proj-leakedleakedleaked0000"}'
    with pytest.raises(pydantic.ValidationError) as caught:
        Contract.model_validate_json(raw)
    error = SchemaValidationError.from_pydantic(caught.value, raw_output=raw)
    assert error.schema_name == "Contract"
    assert [e["loc"] for e in error.validation_errors] == ["name", "version"]
    assert all("input" not in e for e in error.validation_errors)
    assert "leakedleaked" not in rendered(error)
    assert error.raw_output is not None
    assert "[REDACTED]" in error.raw_output
    assert "2 error(s)" in error.message


def test_schema_raw_output_is_capped() -> None:
    error = SchemaValidationError("bad", raw_output="z" * 100_000)
    assert error.raw_output is not None
    assert len(error.raw_output) == 64_000
    assert error.details["raw_output_chars"] == 100_000


def test_with_details_returns_an_enriched_copy() -> None:
    error = RateLimitError("x", retry_after=1, details={"a": 1})
    richer = error.with_details(attempts=3, waits=[1.0, 2.0])
    assert richer.details == {"a": 1, "attempts": 3, "waits": [1.0, 2.0]}
    assert error.details == {"a": 1}
    assert type(richer) is RateLimitError
    assert richer.retry_after == 1.0


def test_every_reason_code_is_documented() -> None:
    from pathlib import Path

    doc = (Path(__file__).parents[1] / "docs" / "typed-errors.md").read_text(encoding="utf-8")
    for code in REASON_CODES:
        assert f"`{code}`" in doc, code
    for cls in PARENTS:
        assert cls.__name__ in doc
