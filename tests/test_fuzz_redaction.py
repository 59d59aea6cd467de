"""Properties: no key ever appears in a cassette, a raw_output, an exception chain or a log record.

Each example places one key where a real one ends up: a credential header of
the request (the request's own key), the base URL's userinfo, a key-like
query parameter, and, anywhere else, echoed by the provider in headers and
bodies (JSON, text, SSE), in the prompt and in the model's output. Runs with
the repository's derandomized profile; ``nox -s fuzz`` explores further.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import quote

import httpx
import pydantic
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fluid_build._redact import exception_chain, redact, redact_url
from fluid_build.copilot.agents.error_classification import classify_provider_error
from fluid_build.copilot.agents.errors import AgentExecutionError, SchemaValidationError
from fluid_build.copilot.call.envelope import RetryEnvelope
from fluid_build.copilot.health.cooldown import MemoryCooldownStore
from fluid_build.corpus.cassette import dump_cassette
from fluid_build.corpus.record import record
from fluid_build.corpus.replay import VirtualClock

UNRESERVED = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.~"
# Keys of no known shape (only where they stand gives them away), and keys with
# the characters of base64 and of real keys, which URLs and JSON escape.
keys = st.one_of(
    st.text("0123456789abcdef", min_size=16, max_size=48).map(lambda s: f"k{s}"),
    st.text(UNRESERVED, min_size=16, max_size=40).map(lambda s: f"K{s}z"),
    st.text(UNRESERVED + "+/=", min_size=16, max_size=40).map(lambda s: f"B{s}=="),
)
key_params = st.sampled_from(
    [
        *("key", "api_key", "api-key", "apikey", "token", "access_token", "sig", "signature"),
        *("password", "client_secret", "X-Amz-Signature", "subscription-key", "code"),
    ]
)
key_headers = st.sampled_from(
    ["authorization", "x-api-key", "api-key", "x-goog-api-key", "set-cookie", "x-auth-token"]
)
echo_headers = st.sampled_from(["x-echo", "x-request-id", "www-authenticate", "server", "via"])
filler = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=30)


def _share(divisor: int) -> int:
    """A share of the profile's examples (conftest: 300; ``nox -s fuzz``: 20,000), for the
    properties that make whole calls."""
    return max(settings.default.max_examples // divisor, 10)


def _variants(key: str) -> list[str]:
    """The key as it may be written out: raw, URL-encoded, JSON-escaped."""
    return list({key, quote(key, safe=""), json.dumps(key)[1:-1]})


def assert_absent(key: str, *texts: str) -> None:
    for text in texts:
        for form in _variants(key):
            assert form not in text


@st.composite
def base_urls(draw: st.DrawFn, key: str) -> str:
    """A base URL that carries the key in userinfo, a key-like parameter, or both."""
    where = draw(st.sampled_from(["password", "user", "query", "all"]))
    userinfo = ""
    if where in {"password", "all"}:
        userinfo = f"{draw(st.sampled_from(['me', 'svc']))}:{quote(key, safe='')}@"
    elif where == "user":
        userinfo = f"{quote(key, safe='')}@"
    query = ""
    if where in {"query", "all"}:
        query = f"?{draw(key_params)}={quote(key, safe='')}"
    return f"https://{userinfo}gw.example.test/v1{query}"


@st.composite
def echoes(draw: st.DrawFn, key: str) -> str:
    """The key as a provider or a model might echo it back, in some text."""
    shape = draw(st.sampled_from(["bare", "sentence", "field", "url", "bearer", "spaced-field"]))
    if shape == "bare":
        return key
    if shape == "sentence":
        return f"{draw(filler)} {key} {draw(filler)}"
    if shape == "field":
        return f'"{draw(key_params)}": "{key}"'
    if shape == "url":
        return f"https://me:{quote(key, safe='')}@h.example/x?key={quote(key, safe='')}"
    if shape == "bearer":
        return f"Authorization: Bearer {key}"
    return f"password = {key}"


def _openai_answer(content: str, headers: dict[str, str]) -> httpx.Response:
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


@st.composite
def error_answers(draw: st.DrawFn, key: str) -> httpx.Response:
    status = draw(st.sampled_from([400, 401, 403, 404, 429, 500, 503]))
    echo = draw(echoes(key))
    kind = draw(st.sampled_from(["json", "text", "sse", "html"]))
    headers = {draw(echo_headers): echo.replace("\n", " ")[:200]}
    if draw(st.booleans()):
        headers[draw(key_headers)] = key
    if kind == "json":
        payload = {"error": {"message": echo, "type": "invalid_request_error", "param": key}}
        return httpx.Response(status, headers=headers, json=payload)
    if kind == "sse":
        data = json.dumps({"type": "error", "error": {"message": echo}})
        headers["content-type"] = "text/event-stream"
        return httpx.Response(status, headers=headers, text=f"event: error\ndata: {data}\n\n")
    if kind == "html":
        headers["content-type"] = "text/html"
        return httpx.Response(status, headers=headers, text=f"<html><h1>{echo}</h1></html>")
    return httpx.Response(status, headers=headers, text=echo)


# -- cassettes -----------------------------------------------------------------------------


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow], max_examples=_share(3))
@given(key=keys, bodies=st.booleans(), data=st.data())
def test_no_key_in_any_cassette(key: str, bodies: bool, data: st.DataObject) -> None:
    env = {"OPENAI_API_KEY": key, "FLUID_LLM_MAX_ATTEMPTS": "2"}
    if data.draw(st.booleans(), label="key in the base URL"):
        env["OPENAI_BASE_URL"] = data.draw(base_urls(key))
    answers: list[httpx.Response] = []
    if data.draw(st.booleans(), label="an error answer first"):
        answers.append(data.draw(error_answers(key)))
    content = json.dumps({"name": data.draw(echoes(key)), "steps": [data.draw(echoes(key))]})
    ok_headers = {data.draw(echo_headers): key, data.draw(key_headers): key}
    answers.append(_openai_answer(content, ok_headers))
    served = iter(answers)

    def answer(request: httpx.Request) -> httpx.Response:
        return next(served, answers[-1])

    prompt = data.draw(echoes(key))
    cassette = record(
        prompt,
        provider="openai",
        model="gpt-4o-mini",
        system=data.draw(st.one_of(st.none(), echoes(key))),
        response_model=data.draw(st.sampled_from([None, "Plan"])),
        env=env,
        transport=httpx.MockTransport(answer),
        clock=VirtualClock(),
        bodies=bodies,
    )
    assert_absent(key, dump_cassette(cassette))
    assert cassette.expect.attempts >= 1


# -- raw_output ----------------------------------------------------------------------------


class Plan(pydantic.BaseModel):
    name: str
    steps: list[str]


@settings(deadline=None)
@given(key=keys, data=st.data())
def test_no_key_in_raw_output(key: str, data: st.DataObject) -> None:
    pieces = data.draw(st.lists(st.one_of(filler, echoes(key)), min_size=1, max_size=5))
    as_json = data.draw(st.booleans())
    raw = json.dumps({"name": 1, "steps": pieces}) if as_json else " ".join(pieces)
    if data.draw(st.booleans()):
        error = SchemaValidationError("output failed", raw_output=raw, secrets=[key])
    else:
        try:
            Plan.model_validate_json(raw)
        except pydantic.ValidationError as exc:
            error = SchemaValidationError.from_pydantic(exc, raw_output=raw, secrets=[key])
        else:  # pragma: no cover - name=1 and plain text never validate
            raise AssertionError("validated")
    assert_absent(key, error.raw_output or "", str(error), repr(error), json.dumps(error.to_dict()))


# -- exception chains ----------------------------------------------------------------------


def _shown(exc: BaseException) -> str:
    parts: list[str] = []
    for link in exception_chain(exc):
        parts += [str(link), repr(link), repr(link.args), repr(getattr(link, "__notes__", ""))]
        request = getattr(link, "_request", None)
        if isinstance(link, httpx.HTTPStatusError):
            request = link.request
            parts.append(repr(link.response.request.url))
        if isinstance(request, httpx.Request):
            parts += [repr(request), str(request.url), repr(list(request.headers.multi_items()))]
    return "\n".join(parts)


@st.composite
def requests(draw: st.DrawFn, key: str) -> httpx.Request:
    """A request that carries the key in a credential header or in its URL (or both)."""
    in_header = draw(st.booleans())
    url = draw(base_urls(key)) if draw(st.booleans()) or not in_header else "https://h.test/v1"
    if draw(st.booleans()):  # the key elsewhere in the URL, found by value
        url += ("&" if "?" in url else "?") + f"q={quote(key, safe='')}"
    headers = {}
    if in_header:
        name = draw(key_headers)
        headers[name] = f"Bearer {key}" if name == "authorization" else key
    return httpx.Request("POST", url, headers=headers, json={"model": "m"})


@settings(deadline=None)
@given(key=keys, data=st.data())
def test_no_key_in_any_exception_chain(key: str, data: st.DataObject) -> None:
    request = data.draw(requests(key))
    message = f"{data.draw(filler)} {request.url} {data.draw(echoes(key))}"
    kind = data.draw(st.sampled_from(["status", "connect", "read", "protocol", "plain"]))
    inner: BaseException = data.draw(
        st.sampled_from(
            [
                OSError(111, f"refused: {request.url}"),
                RuntimeError(message),
                ConnectionResetError(f"reset {key}"),
            ]
        )
    )
    if data.draw(st.booleans()):
        inner.add_note(f"while sending to {request.url}")
    outer: BaseException
    if kind == "status":
        response = httpx.Response(
            data.draw(st.sampled_from([400, 401, 429, 500])),
            request=request,
            json={"error": {"message": message}},
        )
        outer = httpx.HTTPStatusError(
            f"Client error for url '{request.url}'", request=request, response=response
        )
    elif kind == "connect":
        outer = httpx.ConnectError(message, request=request)
    elif kind == "read":
        outer = httpx.ReadTimeout(message, request=request)
    elif kind == "protocol":
        outer = httpx.RemoteProtocolError(message, request=request)
    else:
        outer = RuntimeError(message)
    if data.draw(st.booleans()):
        outer.__cause__ = inner
    else:
        outer.__context__ = inner
    if kind != "plain" and data.draw(st.booleans()):
        # The client's own typed error, raised from the httpx one (a deadline, a stream cut).
        typed = AgentExecutionError("the call failed", code="llm.deadline_exceeded")
        typed.__cause__ = outer
        error = classify_provider_error(typed)
        assert error is typed
    else:
        # An exception that is not httpx's carries no request to learn the key from:
        # the caller's key is passed, as the retry envelope passes it.
        known = [key] if kind == "plain" else []
        error = classify_provider_error(outer, secrets=known)
        error.__cause__ = outer  # what the retry envelope does
    assert isinstance(error, AgentExecutionError)
    assert_absent(key, _shown(error), str(error), repr(error), json.dumps(error.to_dict()))


# -- log records ---------------------------------------------------------------------------


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self.formatted: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        self.formatted.append(logging.Formatter().format(record))


@contextmanager
def captured() -> Iterator[_Records]:
    root = logging.getLogger()
    handler = _Records()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def _client(key: str, base_url: str, handler: Any) -> Any:
    from fluid_build.copilot.client import LLMClient

    clock = VirtualClock()
    envelope = RetryEnvelope(
        cooldown=MemoryCooldownStore(),
        clock=clock,
        sleep=clock.sleep,
        asleep=clock.asleep,
        random=lambda: 0.0,
    )
    return LLMClient(
        "openai",
        "gpt-4o-mini",
        key,
        base_url,
        envelope=envelope,
        http_client=httpx.Client(transport=httpx.MockTransport(handler)),
        env={"FLUID_LLM_MAX_ATTEMPTS": "3"},
    )


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow], max_examples=_share(3))
@given(key=keys, data=st.data())
def test_no_key_in_any_log_record(key: str, data: st.DataObject) -> None:
    base_url = data.draw(base_urls(key))
    first = data.draw(st.sampled_from(["answer", "error-answer", "refused", "timeout"]))
    failure = data.draw(error_answers(key))
    calls: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        if len(calls) == 1 and first == "error-answer":
            return failure
        if len(calls) == 1 and first == "refused":
            raise httpx.ConnectError(f"cannot reach {request.url}", request=request)
        if len(calls) == 1 and first == "timeout":
            raise httpx.ReadTimeout(f"{request.url} sent nothing", request=request)
        return _openai_answer(json.dumps({"name": "n", "steps": []}), {})

    with captured() as logs:
        client = _client(key, base_url, handler)
        try:
            client.complete([{"role": "user", "content": "hi"}])
        except AgentExecutionError as error:
            logging.getLogger("fluid_build.client").exception("call failed: %s", error)
        logging.getLogger("fluid_build.agent").warning("calling %s", base_url)
    assert logs.records
    for record_, text in zip(logs.records, logs.formatted, strict=True):
        assert_absent(key, record_.getMessage(), text)


# -- the redaction functions themselves ------------------------------------------------------

url_texts = st.builds(
    "{}://{}{}{}{}".format,
    st.sampled_from(["https", "http", "wss", "redis"]),
    st.one_of(st.just(""), filler.map(lambda s: quote(s, safe=":") + "@")),
    st.sampled_from(["h.example", "[::1]:8080", "10.0.0.1"]),
    filler.map(lambda s: "/" + quote(s, safe="/")),
    st.lists(st.tuples(st.one_of(key_params, filler), filler), max_size=4).map(
        lambda pairs: "?" + "&".join(f"{quote(n)}={quote(v)}" for n, v in pairs) if pairs else ""
    ),
)


@settings(deadline=None, max_examples=_share(2))
@given(text=st.one_of(st.text(max_size=200), url_texts, st.lists(url_texts).map(" ".join)))
def test_redaction_is_idempotent_and_never_raises(text: str) -> None:
    once = redact(text)
    assert redact(once) == once
    url = redact_url(text)
    assert redact_url(url) == url


@settings(deadline=None, max_examples=_share(2))
@given(url=url_texts, key=keys, name=key_params)
def test_a_key_like_parameter_or_userinfo_never_survives(url: str, key: str, name: str) -> None:
    carrying = url.replace("://", f"://{quote(key, safe='')}@", 1) if "@" not in url else url
    carrying += ("&" if "?" in carrying else "?") + f"{name}={quote(key, safe='')}"
    assert_absent(key, redact_url(carrying), redact(f"see {carrying} now"))
