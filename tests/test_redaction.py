"""Secrets never persist or print: URLs, exception chains, log records, raw_output, cassettes.

Unit tests of each rule; tests/test_fuzz_redaction.py holds the properties.
"""

from __future__ import annotations

import asyncio
import functools
import gzip
import importlib
import json
import logging
import pickle
import pkgutil
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pydantic
import pytest
from click.testing import CliRunner

import fluid_build
from fluid_build._redact import (
    REDACTED,
    REDACTED_LOGGERS,
    RedactingFilter,
    exception_chain,
    is_credential_header,
    is_credential_param,
    is_secret_field,
    redact,
    redact_exception,
    redact_json,
    redact_url,
    request_secrets,
)
from fluid_build.cli import corpus as corpus_cli
from fluid_build.copilot.agents.error_classification import classify_provider_error, redact_chain
from fluid_build.copilot.agents.errors import AgentExecutionError, SchemaValidationError
from fluid_build.copilot.call.envelope import RetryEnvelope
from fluid_build.copilot.health.cooldown import MemoryCooldownStore
from fluid_build.corpus.cassette import (
    OMITTED,
    CallRecipe,
    Cassette,
    CassetteError,
    ExchangeResponse,
    dump_cassette,
    load_cassette,
)
from fluid_build.corpus.record import Recorder, record
from fluid_build.corpus.replay import ReplayBodyOmitted, VirtualClock, replay_client, run_cassette
from tests.bombs import gzip_of_gzip

KEY = "k3y-9f8e7d6c5b4a39281706f5e4"  # no known shape: only its position or value gives it away
PLAN = {"name": "sales_orders", "steps": ["stage", "model"]}


def _rendered(exc: BaseException) -> str:
    """Everything an exception chain shows: str, repr and args of every link, and requests."""
    parts: list[str] = []
    for link in exception_chain(exc):
        parts += [str(link), repr(link), repr(link.args)]
        request = getattr(link, "_request", None) or getattr(link, "request", None)
        if isinstance(request, httpx.Request):
            parts += [repr(request), str(request.url), repr(list(request.headers.multi_items()))]
    return "\n".join(parts)


# -- URLs -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("https://user:pw123456@h.example/v1", "https://h.example/v1"),
        (f"https://{KEY}@h.example/v1?api-version=1", "https://h.example/v1?api-version=1"),
        (
            f"https://h.example/v1?key={KEY}&api-version=2024",
            "https://h.example/v1?key=[REDACTED]&api-version=2024",
        ),
        (
            "https://h.example/x?access_token=a&sig=b&password=c&X-Amz-Signature=d&q=e",
            "https://h.example/x?access_token=[REDACTED]&sig=[REDACTED]&password=[REDACTED]"
            "&X-Amz-Signature=[REDACTED]&q=e",
        ),
        (
            "https://h.example/cb#access_token=abc&state=s",
            "https://h.example/cb#access_token=[REDACTED]&state=s",
        ),
        ("/v1/models?key=abc", "/v1/models?key=[REDACTED]"),
        ("https://h.example/v1/chat/completions", "https://h.example/v1/chat/completions"),
    ],
)
def test_redact_url_drops_userinfo_and_key_like_query_values(url: str, shown: str) -> None:
    assert redact_url(url) == shown
    assert redact_url(shown) == shown  # idempotent
    assert redact_url(httpx.URL(url)).startswith(shown.split("?")[0].split("#")[0])


def test_redact_url_removes_the_key_by_value_in_the_path_too() -> None:
    assert KEY not in redact_url(f"https://h.example/keys/{KEY}/v1", [KEY])


def test_urls_inside_text_are_redacted_by_name() -> None:
    text = (
        "Client error '401 Unauthorized' for url "
        f"'https://me:{KEY}@gw.example/v1/chat?key={KEY}&api-version=1'"
    )
    clean = redact(text)
    assert KEY not in clean
    assert "me:" not in clean
    assert "'https://gw.example/v1/chat?key=[REDACTED]&api-version=1'" in clean


def test_secrets_go_by_value_also_url_and_json_escaped() -> None:
    secret = 'a+b/c=d"e-0123456789'
    text = f"{secret} {httpx.QueryParams({'x': secret})} {json.dumps(secret)}"
    assert redact(text, [secret]).count(REDACTED) == 3


def test_json_fields_named_like_credentials_lose_their_whole_value() -> None:
    text = json.dumps({"password": "correct horse battery staple", "note": "ok"})
    assert redact(text) == json.dumps({"password": REDACTED, "note": "ok"})
    nested = json.dumps({"content": json.dumps({"client_secret": "two words"})})
    assert "two words" not in redact(nested)


@pytest.mark.parametrize(
    ("name", "credential"),
    [
        ("Authorization", True),
        ("proxy-authorization", True),
        ("api-key", True),
        ("X-Api-Key", True),
        ("x-goog-api-key", True),
        ("ocp-apim-subscription-key", True),
        ("cookie", True),
        ("set-cookie", True),
        ("x-auth-token", True),
        ("x-amz-security-token", True),
        ("x-ratelimit-remaining-tokens", False),
        ("anthropic-ratelimit-tokens-reset", False),
        ("openai-organization", False),  # an account id: see ACCOUNT_HEADERS
        ("www-authenticate", False),
        ("content-type", False),
    ],
)
def test_credential_headers_by_name(name: str, credential: bool) -> None:
    assert is_credential_header(name) is credential


@pytest.mark.parametrize(
    ("name", "credential"),
    [
        *((n, True) for n in ("key", "api_key", "api-key", "apikey", "token", "access_token")),
        *((n, True) for n in ("sig", "signature", "password", "client_secret", "code", "auth")),
        *((n, True) for n in ("X-Amz-Credential", "X-Goog-Signature", "subscription-key")),
        *((n, False) for n in ("api-version", "alt", "q", "model", "stream")),
    ],
)
def test_credential_params_by_name(name: str, credential: bool) -> None:
    assert is_credential_param(name) is credential


def test_secret_fields_by_name() -> None:
    assert all(map(is_secret_field, ["password", "api_key", "Authorization", "client-secret"]))
    assert not any(map(is_secret_field, ["prompt_tokens", "total_tokens", "key_id", "name"]))


def test_request_secrets_finds_headers_userinfo_and_params() -> None:
    found = request_secrets(
        [("Authorization", f"Bearer {KEY}"), ("x-request-id", "r1"), ("x-goog-api-key", "g" * 20)],
        "https://u:p%40ssword1@h.example/v1?key=a%2Bb12345678&alt=sse",
    )
    for expected in (f"Bearer {KEY}", KEY, "g" * 20, "p%40ssword1", "p@ssword1", "a+b12345678"):
        assert expected in found
    assert "r1" not in found
    assert "sse" not in found


def test_redact_json_keeps_shape_and_token_counts() -> None:
    data = {
        "usage": {"prompt_tokens": 3, "total_tokens": 5},
        "token": "t-1",
        "password": None,
        "list": [f"key is {KEY}", {"api_key": "short"}],
    }
    clean = redact_json(data, [KEY])
    assert clean == {
        "usage": {"prompt_tokens": 3, "total_tokens": 5},
        "token": REDACTED,
        "password": None,
        "list": [f"key is {REDACTED}", {"api_key": REDACTED}],
    }


# -- exceptions -----------------------------------------------------------------------------


def test_redact_exception_in_place_args_notes_attributes_oserror() -> None:
    url = f"https://u:{KEY}@h.example/v1?key={KEY}"
    error = OSError(5, f"failed for {url}", url)
    error.add_note(f"while calling {url}")
    other = RuntimeError(f"boom {url}", {"nested": url})
    other.url = url  # type: ignore[attr-defined]
    for exc in (error, other):
        redact_exception(exc)
        assert KEY not in str(exc)
        assert KEY not in repr(exc)
        assert KEY not in repr(exc.args)
        assert KEY not in repr(vars(exc))
    assert error.errno == 5


def test_a_hostile_exception_never_breaks_redaction() -> None:
    class Hostile(Exception):
        def __repr__(self) -> str:
            raise RuntimeError("no")

    class Locked(Exception):
        @property
        def args(self) -> Any:  # type: ignore[override]
            return ("https://u:password99@h",)

    redact_exception(Hostile(object()))
    redact_exception(Locked())


def _status_error(url: str, key: str = KEY) -> httpx.HTTPStatusError:
    request = httpx.Request("POST", url, headers={"Authorization": f"Bearer {key}"}, json={})
    response = httpx.Response(401, request=request, json={"error": {"message": f"bad {key}"}})
    try:
        response.raise_for_status()
    except httpx.HTTPStatusError as exc:
        return exc
    raise AssertionError("no error")  # pragma: no cover


def test_classified_http_error_keeps_only_the_redacted_url() -> None:
    exc = _status_error(f"https://me:{KEY}@gw.example/v1/chat/completions?key={KEY}")
    error = classify_provider_error(exc)
    assert error.code == "llm.auth"
    error.__cause__ = exc
    shown = _rendered(error)
    assert KEY not in shown
    assert "me:" not in shown
    assert "gw.example/v1/chat/completions?key=[REDACTED]" in str(exc)
    assert exc.request.headers["authorization"] == REDACTED
    assert exc.response.request is exc.request
    assert exc.request.method == "POST"


def test_chained_links_are_redacted_and_reclassifying_is_stable() -> None:
    url = f"https://gw.example/v1/chat?token={KEY}"
    request = httpx.Request(
        "POST",
        url,
        headers={"x-api-key": KEY},
        extensions={"timeout": {"connect": 1.5, "read": 2, "write": 2, "pool": 2}},
    )
    try:
        try:
            raise ConnectionRefusedError(111, f"refused by {url} using {KEY}")
        except OSError as low:
            raise httpx.ConnectTimeout(f"connect to {url} timed out", request=request) from low
    except httpx.ConnectTimeout as exc:
        first = classify_provider_error(exc)
        second = classify_provider_error(exc)
        shown = _rendered(exc)
    assert KEY not in shown
    assert first.code == second.code == "llm.timeout"
    assert first.details.get("timeout_seconds") == second.details.get("timeout_seconds") == 1.5


def test_a_typed_error_passed_in_has_its_chain_redacted() -> None:
    exc = _status_error(f"https://gw.example/v1?key={KEY}")
    typed = AgentExecutionError("deadline passed", code="llm.deadline_exceeded")
    typed.__cause__ = exc
    assert classify_provider_error(typed) is typed
    assert KEY not in _rendered(typed)


def test_redact_chain_walks_groups_and_never_raises() -> None:
    inner = RuntimeError(f"https://a:{KEY}@h")
    group = ExceptionGroup("many", [inner, ValueError("fine")])
    redact_chain(group)
    assert KEY not in str(inner)
    redact_chain(RuntimeError(object()))


# -- logging --------------------------------------------------------------------------------


def _all_fluid_modules() -> Iterator[str]:
    for info in pkgutil.walk_packages(fluid_build.__path__, "fluid_build."):
        if ".forge.examples" not in info.name and not info.name.endswith("__main__"):
            yield info.name


def test_every_fluid_logger_and_httpx_carries_the_filter() -> None:
    for name in _all_fluid_modules():
        importlib.import_module(name)
    names = [
        n
        for n in logging.Logger.manager.loggerDict
        if n == "fluid_build" or n.startswith("fluid_build.")
    ]
    assert names
    for name in {*names, *REDACTED_LOGGERS}:
        filters = logging.getLogger(name).filters
        assert any(isinstance(f, RedactingFilter) for f in filters), name


def test_the_cloud_libraries_loggers_carry_the_filter_before_and_after_import() -> None:
    # botocore.auth writes the canonical request (x-amz-security-token) and the signature at
    # DEBUG; google-auth and urllib3 carry token exchanges (issue 32 item 8).
    import botocore.auth
    import botocore.credentials
    import google.auth._default
    import google.oauth2._client
    import urllib3.connectionpool

    from fluid_build._redact import install_log_redaction

    install_log_redaction()
    names = [
        n
        for n in logging.Logger.manager.loggerDict
        if n.startswith(("botocore", "google.auth", "google.oauth2", "urllib3"))
    ]
    modules = (botocore.auth, botocore.credentials, google.auth._default, google.oauth2._client)
    for module in (*modules, urllib3.connectionpool):
        assert module.__name__ in names
    for name in names:
        filters = logging.getLogger(name).filters
        assert any(isinstance(f, RedactingFilter) for f in filters), name


def test_a_sigv4_authorizations_pieces_are_redacted_wherever_they_show() -> None:
    # An error body echoing only part of the Authorization header (issue 32 item 11).
    signature = "5d672d79c15b13162d9279b0855cfba6789a8edb4c82c400e06b5924a6f2b5d7"
    header = (
        "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20261128/us-east-1/bedrock/aws4_request, "
        f"SignedHeaders=content-type;host;x-amz-date, Signature={signature}"
    )
    texts = [
        '{"message": "Credential=AKIDEXAMPLE/20261128/us-east-1/bedrock/aws4_request"}',
        f"Signature={signature} does not match",
        f"Signature:\n{signature}",  # botocore.auth's DEBUG record
        f"https://h.example/x?X-Amz-Credential=AKIDEXAMPLE%2F20261128&X-Amz-Signature={signature}",
        f"Authorization: {header}",
    ]
    for text in texts:
        clean = redact(text)
        assert "AKIDEXAMPLE" not in clean, clean
        assert signature not in clean, clean
    assert {"AKIDEXAMPLE", signature} <= set(request_secrets([("Authorization", header)], "/"))
    assert redact("the signature: it was wrong") == "the signature: it was wrong"


@pytest.mark.parametrize(
    "text",
    [
        "AWS_SECRET_ACCESS_KEY={v}",
        'export AWS_SECRET_ACCESS_KEY="{v}"',
        "aws_secret_access_key = {v}",  # ~/.aws/credentials
        "{{'AccessKeyId': 'AKID', 'SecretAccessKey': '{v}', 'Token': 't'}}",  # botocore.utils
        '{{"SecretAccessKey": "{v}"}}',  # a container endpoint's answer
        "AWS_SESSION_TOKEN={v}",
        '{{"AWS_SESSION_TOKEN": "{v}"}}',
    ],
)
def test_aws_secrets_are_redacted_in_their_usual_spellings(text: str) -> None:
    # botocore.utils logs an instance metadata answer it cannot use at DEBUG; an env dump
    # or a credentials file pasted in an error holds them too.
    value = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
    clean = redact(text.format(v=value))
    assert value not in clean, clean
    assert "wJalr" not in clean, clean


def test_google_auths_structured_request_log_is_redacted() -> None:
    record = logging.LogRecord(
        "google.oauth2._client", logging.DEBUG, "f", 1, "Making request...", None, None
    )
    record.httpRequest = {"headers": {"Authorization": f"Bearer {KEY}"}, "body": {"token": KEY}}
    RedactingFilter().filter(record)
    assert KEY not in repr(record.__dict__)


def test_the_httpx_request_line_shows_the_redacted_url(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="httpx")
    transport = httpx.MockTransport(lambda request: httpx.Response(200, json={}))
    with httpx.Client(transport=transport) as http:
        http.get(f"https://me:{KEY}@gw.example/v1/models?key={KEY}&alt=json")
    lines = [r.getMessage() for r in caplog.records if r.name == "httpx"]
    assert lines
    assert all(KEY not in line and "me:" not in line for line in lines)
    assert "gw.example/v1/models?key=[REDACTED]&alt=json" in lines[0]


def test_fluid_log_records_and_their_exceptions_are_redacted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = logging.getLogger("fluid_build.retry")
    url = f"https://me:{KEY}@gw.example/v1?key={KEY}"
    try:
        raise httpx.ConnectError(f"cannot reach {url}")
    except httpx.ConnectError:
        log.exception("calling %s failed", url)
    log.warning("Authorization: Bearer %s", "sk-" + "x" * 30)
    assert KEY not in caplog.text
    assert "me:" not in caplog.text
    assert "x" * 30 not in caplog.text
    assert caplog.records[0].getMessage() == "calling https://gw.example/v1?key=[REDACTED] failed"


def test_the_filter_survives_a_broken_record() -> None:
    record = logging.LogRecord("fluid_build", logging.INFO, __file__, 1, "%d", ("x",), None)
    assert RedactingFilter().filter(record)


# -- raw_output ----------------------------------------------------------------------------


def test_raw_output_redacts_the_requests_key_and_credential_fields() -> None:
    text = json.dumps({"name": f"plan {KEY}", "password": "correct horse battery"})
    error = SchemaValidationError("bad", raw_output=text, secrets=[KEY])
    for shown in (error.raw_output or "", str(error), repr(error), json.dumps(error.to_dict())):
        assert KEY not in shown
        assert "horse" not in shown
    assert KEY not in (pickle.loads(pickle.dumps(error)).raw_output or "")  # noqa: S301


def test_from_pydantic_takes_the_secrets() -> None:
    class Plan(pydantic.BaseModel):
        steps: list[str]

    raw = json.dumps({"steps": f"not a list {KEY}"})
    try:
        Plan.model_validate_json(raw)
    except pydantic.ValidationError as exc:
        error = SchemaValidationError.from_pydantic(exc, raw_output=raw, secrets=[KEY])
    assert KEY not in (error.raw_output or "")
    assert REDACTED in (error.raw_output or "")


def _openai_answer(content: str, **headers: str) -> httpx.Response:
    return httpx.Response(
        200,
        headers=headers,
        json={
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1,
            "model": "gpt-4o-mini",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        },
    )


def _client(handler: Any, **kwargs: Any) -> Any:
    from fluid_build.copilot.client import LLMClient

    clock = VirtualClock()
    envelope = RetryEnvelope(
        cooldown=MemoryCooldownStore(),
        clock=clock,
        sleep=clock.sleep,
        asleep=clock.asleep,
        random=lambda: 0.0,
        hook=lambda event: None,
    )
    kwargs.setdefault("env", {})
    kwargs.setdefault("api_key", KEY)
    return LLMClient(
        "openai",
        "gpt-4o-mini",
        envelope=envelope,
        http_client=httpx.Client(transport=httpx.MockTransport(handler)),
        **kwargs,
    )


def test_raw_output_from_the_client_redacts_the_requests_key() -> None:
    class Plan(pydantic.BaseModel):
        name: str
        steps: list[str]

    client = _client(lambda request: _openai_answer(json.dumps({"name": KEY, "steps": "x"})))
    with pytest.raises(SchemaValidationError) as caught:
        client.complete([{"role": "user", "content": "plan"}], response_model=Plan)
    assert KEY not in (caught.value.raw_output or "")


@pytest.mark.parametrize("streaming", [False, True])
def test_a_transport_error_that_quotes_the_key_is_redacted_by_value(streaming: bool) -> None:
    """A proxy or gateway that echoes the key in its error text: the key is known by value."""

    def echo(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadError(f"gateway refused token {KEY} for this route")

    client = _client(echo, env={"FLUID_LLM_MAX_ATTEMPTS": "2"})
    messages = [{"role": "user", "content": "hi"}]
    call = (
        (lambda: list(client.stream(messages)))
        if streaming
        else (lambda: client.complete(messages))
    )
    with pytest.raises(AgentExecutionError) as caught:
        call()
    assert caught.value.code == "llm.network_error"
    assert KEY not in _rendered(caught.value)


def test_client_errors_chain_only_redacted_urls(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)

    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError(f"cannot reach {request.url}", request=request)

    client = _client(
        refuse,
        base_url=f"https://me:{KEY}@gw.example/v1?key={KEY}",
        env={"FLUID_LLM_MAX_ATTEMPTS": "2"},
    )
    with pytest.raises(AgentExecutionError) as caught:
        client.complete([{"role": "user", "content": "hi"}])
    assert caught.value.code == "llm.network_error"
    assert caught.value.__cause__ is not None
    assert KEY not in _rendered(caught.value)
    assert KEY not in caplog.text


# -- cassettes -------------------------------------------------------------------------------


OPENAI_URL = "https://api.openai.com/v1/chat/completions"


def _limited() -> httpx.Response:
    return httpx.Response(
        429,
        headers={"retry-after": "2"},
        json={"error": {"message": f"Rate limit for {KEY}. Try again in 2s.", "type": "requests"}},
    )


def test_record_without_bodies_keeps_the_flow_and_no_content(tmp_path: Path) -> None:
    answers = iter([_limited(), _openai_answer(json.dumps(PLAN), **{"openai-project": "p1"})])
    out = tmp_path / "openai-no-bodies.json"
    cassette = record(
        "Plan the secret customer project.",
        provider="openai",
        model="gpt-4o-mini",
        system="You are the planner of ACME.",
        out=out,
        response_model="Plan",
        env={"OPENAI_API_KEY": KEY},
        transport=httpx.MockTransport(lambda request: next(answers)),
        clock=VirtualClock(),
        bodies=False,
    )
    text = out.read_text(encoding="utf-8")
    for private in (KEY, "secret customer", "ACME", "sales_orders", "openai-project"):
        assert private not in text
    assert cassette.bodies is False
    assert json.loads(text)["bodies"] is False
    assert cassette.call.messages == [{"role": "user", "content": OMITTED}]
    assert cassette.call.system == OMITTED
    assert cassette.expect.outcome == "success"
    assert cassette.expect.output is None
    assert cassette.expect.waits == [2.0]
    limited, answered = cassette.exchanges
    assert limited.response.body is not None  # error answers are kept: they decide the retry
    assert answered.response.omitted
    assert answered.response.body is None
    assert answered.response.body_text is None
    assert answered.request.model == "gpt-4o-mini"
    result = run_cassette(load_cassette(out))
    assert result.ok, result.mismatches
    assert result.outcome == "flow-only"
    assert result.attempts == 2
    assert result.waits == [2.0]


def test_flow_only_replay_still_catches_a_changed_wait(tmp_path: Path) -> None:
    answers = iter([_limited(), _openai_answer(json.dumps(PLAN))])
    cassette = record(
        "hi",
        provider="openai",
        model="gpt-4o-mini",
        env={"OPENAI_API_KEY": KEY},
        transport=httpx.MockTransport(lambda request: next(answers)),
        clock=VirtualClock(),
        bodies=False,
    )
    doctored = cassette.model_copy(
        update={"expect": cassette.expect.model_copy(update={"waits": [7.0]})}
    )
    result = run_cassette(doctored)
    assert not result.ok
    assert "expected waits [7] s" in result.mismatches[0]


def test_replay_client_stops_at_an_omitted_body() -> None:
    cassette = record(
        "hi",
        provider="openai",
        model="gpt-4o-mini",
        env={"OPENAI_API_KEY": KEY},
        transport=httpx.MockTransport(lambda request: _openai_answer("hello")),
        clock=VirtualClock(),
        bodies=False,
    )
    client = replay_client(cassette)
    # A local FluidError, raised as it is: never retried, never a provider's failure.
    with pytest.raises(ReplayBodyOmitted):
        client.complete([{"role": "user", "content": "anything"}])


def test_with_bodies_the_key_goes_from_prompt_output_env_and_answers(tmp_path: Path) -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        assert request.headers["authorization"]  # Basic from the URL's userinfo, here
        content = json.dumps({"name": f"p-{KEY}", "steps": ["a"]})
        return _openai_answer(
            content,
            **{
                "x-echo": KEY,
                "set-cookie": "s=1",
                "openai-organization": "org-me",
                "x-request-id": "req_1",
            },
        )

    out = tmp_path / "c.json"
    cassette = record(
        f"Use the key {KEY} nowhere.",
        provider="openai",
        model="gpt-4o-mini",
        out=out,
        response_model="Plan",
        env={
            "OPENAI_API_KEY": KEY,
            "OPENAI_BASE_URL": f"https://me:{KEY}@gw.example/v1",
        },
        transport=httpx.MockTransport(answer),
        clock=VirtualClock(),
    )
    text = out.read_text(encoding="utf-8")
    assert KEY not in text
    assert "me:" not in text
    assert "org-me" not in text
    assert cassette.call.env["OPENAI_BASE_URL"] == "https://gw.example/v1"
    assert cassette.exchanges[0].response.headers == {
        "content-type": "application/json",
        "x-request-id": "req_1",
    }
    assert cassette.expect.output == {"name": f"p-{REDACTED}", "steps": ["a"]}
    assert run_cassette(load_cassette(out)).ok


def test_recorder_records_several_calls_sync_and_async_and_learns_keys() -> None:
    import asyncio

    from fluid_build.copilot.client import LLMClient

    other = "second-key-0123456789abcdef"
    recorder = Recorder()  # no key given: it learns them from the requests
    seen: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers["authorization"])
        return _openai_answer(f"echo {request.headers['authorization']}")

    with recorder.client(httpx.MockTransport(answer)) as http:
        LLMClient("openai", "gpt-4o-mini", KEY, http_client=http, env={}).complete("one")
        LLMClient("openai", "gpt-4o-mini", other, http_client=http, env={}).complete("two")

    async def async_call() -> None:
        async with recorder.async_client(httpx.MockTransport(answer)) as http:
            client = LLMClient("openai", "gpt-4o-mini", KEY, async_http_client=http, env={})
            await client.acomplete("three")

    asyncio.run(async_call())
    assert len(seen) == 3
    assert KEY in recorder.secrets
    assert other in recorder.secrets
    cassette = recorder.cassette(
        name="run",
        provider="openai",
        model="gpt-4o-mini",
        call=CallRecipe(messages=[{"role": "user", "content": f"k={KEY}"}]),
        expect=recorder.expectation(error=None, output=f"echo {other}"),
    )
    dumped = dump_cassette(cassette)
    assert KEY not in dumped
    assert other not in dumped
    assert cassette.expect.attempts == 3
    assert "bodies" not in json.loads(dumped)  # written only when false


def test_recorder_refuses_an_answer_past_its_size_limit() -> None:
    recorder = Recorder(max_bytes=1000)
    big = httpx.Response(200, content=b"x" * 5000)
    with (
        recorder.client(httpx.MockTransport(lambda request: big)) as http,
        pytest.raises(CassetteError, match="larger than 1000 bytes"),
    ):
        http.get("https://h.example/")
    with pytest.raises(CassetteError, match="got no answer"):
        recorder.check_answered()


def _gzip_layers(data: bytes, layers: int) -> bytes:
    for _ in range(layers):
        data = gzip.compress(data, compresslevel=9)
    return data


@functools.cache
def _stacked_bomb() -> bytes:
    """gzip of gzip of 256 MiB of zeros (tests/bombs.py): about a KB."""
    return gzip_of_gzip(256 * 2**20)


def _encoded(body: bytes, encoding: str) -> httpx.Response:
    return httpx.Response(
        200, headers={"content-encoding": encoding}, stream=httpx.ByteStream(body)
    )


def test_recorder_counts_every_layer_of_a_stacked_encoding_against_its_limit() -> None:
    recorder = Recorder(max_bytes=1000)
    bomb = _stacked_bomb()
    tracemalloc.start()
    try:
        with (
            recorder.client(
                httpx.MockTransport(lambda request: _encoded(bomb, "gzip, gzip"))
            ) as http,
            pytest.raises(CassetteError, match="larger than 1000 bytes"),
        ):
            http.get("https://h.example/")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 * 1024 * 1024  # stopped at the limit, not inflated whole (256 MiB)
    with (
        recorder.client(
            httpx.MockTransport(lambda request: _encoded(_stacked_bomb(), "gzip, gzip"))
        ) as http,
        pytest.raises(CassetteError, match="larger than 1000 bytes"),
    ):
        http.get("https://h.example/")

    async def asynchronously() -> None:
        transport = httpx.MockTransport(lambda request: _encoded(_stacked_bomb(), "gzip, gzip"))
        async with recorder.async_client(transport) as http:
            await http.get("https://h.example/")

    with pytest.raises(CassetteError, match="larger than 1000 bytes"):
        asyncio.run(asynchronously())


def test_recorder_keeps_a_stacked_answer_decoded() -> None:
    recorder = Recorder(max_bytes=1000)
    body = _gzip_layers(b'{"ok": true}', 2)
    with recorder.client(httpx.MockTransport(lambda request: _encoded(body, "gzip, gzip"))) as http:
        answer = http.get("https://h.example/")
    assert answer.json() == {"ok": True}
    assert "content-encoding" not in answer.headers


def test_omitted_bodies_are_validated() -> None:
    with pytest.raises(pydantic.ValidationError, match="omitted body"):
        ExchangeResponse(status=200, body={"x": 1}, omitted=True)
    data = json.loads(dump_cassette(load_cassette(Path("corpus/openai-success.json"))))
    data["exchanges"][0]["response"] = {"status": 200, "omitted": True}
    with pytest.raises(pydantic.ValidationError, match="needs bodies: false"):
        Cassette.model_validate(data)
    data["bodies"] = False
    with pytest.raises(pydantic.ValidationError, match="no expected output"):
        Cassette.model_validate(data)


def test_cli_record_no_bodies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import respx

    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    out = tmp_path / "openai-cli.json"
    with respx.mock(assert_all_called=True) as router:
        router.post(OPENAI_URL).mock(return_value=_openai_answer(json.dumps(PLAN)))
        result = CliRunner().invoke(
            corpus_cli.command,
            [
                *("record", "--provider", "openai", "--model", "gpt-4o-mini", "--no-bodies"),
                *("--out", str(out), "--response-model", "Plan", "Plan my private thing."),
            ],
        )
    assert result.exit_code == 0, result.output
    assert "without bodies" in result.stdout
    text = out.read_text(encoding="utf-8")
    assert "private thing" not in text
    assert "sales_orders" not in text
    assert KEY not in text
    replayed = CliRunner().invoke(corpus_cli.command, ["replay", str(out)])
    assert replayed.exit_code == 0, replayed.output
    assert "flow-only" in replayed.stdout
