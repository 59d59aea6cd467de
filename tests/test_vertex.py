"""provider="vertex": Gemini on Vertex AI, its URL, its credentials and its real answers.

Credentials are tested against real loopback servers standing in for Google's
token endpoint and the GCE metadata server; the answers are the recorded
Vertex rows of tests/data/provider_answers.json (pydantic-ai cassettes), and
the error bodies are recorded ones, each with its source.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from fluid_build.copilot import LLMClient
from fluid_build.copilot.agents.errors import ProviderAuthError, ProviderError, RateLimitError
from fluid_build.copilot.llm import vertex
from fluid_build.copilot.llm.settings import resolve_provider_config
from tests.fakes import FakeClock, clocked_envelope, warm_async_transport
from tests.transport_calls import TRANSPORTS, call_over, transport_env

ROWS = [
    row
    for row in json.loads(
        (Path(__file__).parent / "data" / "provider_answers.json").read_text(encoding="utf-8")
    )
    if row["provider"] == "vertex"
]
PROJECT = {"GOOGLE_CLOUD_PROJECT": "my-project"}


# -- where requests go ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "base_url", "expected"),
    [
        (
            PROJECT,
            None,
            "https://us-central1-aiplatform.googleapis.com/v1/projects/my-project/locations/"
            "us-central1/publishers/google",
        ),
        (
            {**PROJECT, "GOOGLE_CLOUD_LOCATION": "europe-west4"},
            None,
            "https://europe-west4-aiplatform.googleapis.com/v1/projects/my-project/locations/"
            "europe-west4/publishers/google",
        ),
        (
            {**PROJECT, "GOOGLE_CLOUD_LOCATION": "global"},
            None,
            "https://aiplatform.googleapis.com/v1/projects/my-project/locations/global/"
            "publishers/google",
        ),
        (
            PROJECT,
            "http://127.0.0.1:9/",
            "http://127.0.0.1:9/v1/projects/my-project/locations/us-central1/publishers/google",
        ),
    ],
)
def test_the_url_follows_project_location_and_base_url(
    env: dict[str, str], base_url: str | None, expected: str
) -> None:
    config = resolve_provider_config("vertex", api_key="tok", base_url=base_url, env=env)
    assert config.base_url == expected
    assert config.model == "gemini-2.5-flash"


def test_a_missing_project_names_the_variable() -> None:
    with pytest.raises(ProviderError) as caught:
        resolve_provider_config("vertex", api_key="tok", env={})
    assert caught.value.code == "llm.not_configured"
    assert "GOOGLE_CLOUD_PROJECT" in str(caught.value)
    assert caught.value.details["variable"] == "GOOGLE_CLOUD_PROJECT"


def test_a_bad_location_is_refused() -> None:
    with pytest.raises(ProviderError) as caught:
        resolve_provider_config(
            "vertex", api_key="tok", env={**PROJECT, "GOOGLE_CLOUD_LOCATION": "us/../x"}
        )
    assert caught.value.code == "llm.not_configured"
    assert "GOOGLE_CLOUD_LOCATION" in str(caught.value)


def test_the_project_comes_from_the_credentials_when_unset() -> None:
    url = vertex.resolve_base_url(None, None, {}, adc=lambda: (object(), "adc-project"))
    assert "/projects/adc-project/locations/us-central1/" in url


def _client(row_model: str, env: dict[str, str], **http: Any) -> LLMClient:
    return LLMClient(
        "vertex",
        row_model,
        api_key="ya29.explicit-token",
        envelope=clocked_envelope(FakeClock()),
        env=env,
        **http,
    )


def test_an_explicit_token_is_a_bearer_and_no_api_key_header() -> None:
    seen: list[httpx.Request] = []
    row = ROWS[0]

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=row["body"])

    env = {**PROJECT, "GOOGLE_CLOUD_LOCATION": "global"}
    with httpx.Client(transport=httpx.MockTransport(handler)) as http:
        _client("gemini-2.5-flash", env, http_client=http).complete("hi")
    (request,) = seen
    assert str(request.url) == (
        "https://aiplatform.googleapis.com/v1/projects/my-project/locations/global/publishers/"
        "google/models/gemini-2.5-flash:generateContent"
    )
    assert request.headers["authorization"] == "Bearer ya29.explicit-token"
    assert "x-goog-api-key" not in request.headers


# -- real answers ----------------------------------------------------------------------


def _wire(row: dict[str, Any]) -> bytes:
    if "stream" in row:
        return "\n".join(row["stream"]).encode()
    return json.dumps(row["body"], ensure_ascii=False).encode()


def _answer(row: dict[str, Any], urls: list[str]) -> httpx.MockTransport:
    def handler(request: httpx.Request) -> httpx.Response:
        urls.append(str(request.url))
        return httpx.Response(row["status"], headers=row["headers"], content=_wire(row))

    return httpx.MockTransport(handler)


def _check(completion: Any, expect: dict[str, Any]) -> None:
    assert completion.text == expect["text"]
    assert [c.model_dump() for c in completion.tool_calls] == expect["tool_calls"]
    assert completion.finish_reason == expect["finish_reason"]
    assert completion.model == expect["model"]
    assert completion.usage.model_dump() == {
        "reasoning_tokens": 0,
        "cache_read_tokens": 0,
        "cache_write_tokens": 0,
        **expect["usage"],
    }


def test_the_recorded_answers_are_several_and_sourced() -> None:
    assert len([r for r in ROWS if "body" in r]) >= 5
    assert len([r for r in ROWS if "stream" in r]) >= 1
    assert all("pydantic/pydantic-ai" in r["source"] for r in ROWS)


@pytest.mark.parametrize("row", [r for r in ROWS if "body" in r], ids=lambda r: r["id"])
def test_real_answers_sync_and_async(row: dict[str, Any]) -> None:
    urls: list[str] = []
    with httpx.Client(transport=_answer(row, urls)) as http:
        _check(
            _client(row["request_model"], PROJECT, http_client=http).complete("hi"), row["expect"]
        )

    async def go() -> Any:
        async with httpx.AsyncClient(transport=_answer(row, urls)) as http:
            return await _client(row["request_model"], PROJECT, async_http_client=http).acomplete(
                "hi"
            )

    _check(asyncio.run(go()), row["expect"])
    assert all(url.endswith(f"/models/{row['request_model']}:generateContent") for url in urls)


@pytest.mark.parametrize("row", [r for r in ROWS if "stream" in r], ids=lambda r: r["id"])
def test_real_streams_sync_and_async(row: dict[str, Any]) -> None:
    urls: list[str] = []
    with httpx.Client(transport=_answer(row, urls)) as http:
        events = list(_client(row["request_model"], PROJECT, http_client=http).stream("hi"))

    async def go() -> list[Any]:
        async with httpx.AsyncClient(transport=_answer(row, urls)) as http:
            client = _client(row["request_model"], PROJECT, async_http_client=http)
            return [event async for event in client.astream("hi")]

    for seen in (events, asyncio.run(go())):
        assert "".join(e.text for e in seen if e.type == "text") == row["expect"]["text"]
        assert seen[-1].type == "done"
        _check(seen[-1].completion, row["expect"])
    assert all(url.endswith(":streamGenerateContent?alt=sse") for url in urls)


# pydantic/pydantic-ai tests/models/cassettes/test_google/
# test_google_model_armor_response_template_real_block.yaml and
# test_google_model_armor_prompt_template_text_gets_blocked.yaml (recorded, verbatim but
# for usage details).
ARMOR_ANSWER = {
    "candidates": [
        {
            "avgLogprobs": -1.1124393939971924,
            "finishMessage": "The response violated Responsible AI Safety settings (Hate Speech, "
            "Harassment, Dangerous) filters.",
            "finishReason": "MODEL_ARMOR",
        }
    ],
    "modelVersion": "gemini-2.5-flash",
    "usageMetadata": {"candidatesTokenCount": 6, "promptTokenCount": 19},
}
ARMOR_PROMPT = {
    "modelVersion": "gemini-2.5-flash",
    "promptFeedback": {
        "blockReason": "MODEL_ARMOR",
        "blockReasonMessage": "The prompt violated Prompt Injection and Jailbreak filters.",
    },
    "usageMetadata": {"trafficType": "ON_DEMAND"},
}


@pytest.mark.parametrize("body", [ARMOR_ANSWER, ARMOR_PROMPT], ids=["answer", "prompt"])
def test_a_model_armor_block_is_content_filtered(body: dict[str, Any]) -> None:
    transport = httpx.MockTransport(lambda request: httpx.Response(200, json=body))
    with httpx.Client(transport=transport) as http, pytest.raises(ProviderError) as caught:
        _client("gemini-2.5-flash", PROJECT, http_client=http).complete("hi")
    assert (caught.value.code, caught.value.retryable) == ("llm.content_filtered", False)
    assert caught.value.provider == "vertex"
    assert "MODEL_ARMOR" in str(caught.value)


def test_function_calls_with_unexpected_tool_call_are_still_tool_calls() -> None:
    # The documented shape (finishReason UNEXPECTED_TOOL_CALL: the model called a function
    # the request did not declare); no recorded Vertex sample was found.
    body = {
        "candidates": [
            {
                "content": {
                    "role": "model",
                    "parts": [{"functionCall": {"name": "get_weather", "args": {"city": "Paris"}}}],
                },
                "finishReason": "UNEXPECTED_TOOL_CALL",
            }
        ],
        "modelVersion": "gemini-2.5-flash",
    }
    transport = httpx.MockTransport(lambda request: httpx.Response(200, json=body))
    with httpx.Client(transport=transport) as http:
        done = _client("gemini-2.5-flash", PROJECT, http_client=http).complete("hi")
    assert [c.model_dump() for c in done.tool_calls] == [
        {"id": "call_0", "name": "get_weather", "arguments": {"city": "Paris"}}
    ]
    assert done.finish_reason == "UNEXPECTED_TOOL_CALL"


# -- errors, with recorded bodies ------------------------------------------------------

ERRORS = [
    pytest.param(
        # issue rpurinton/gemini-php#2 (code, message and status verbatim).
        403,
        {
            "error": {
                "code": 403,
                "message": "Permission 'aiplatform.endpoints.predict' denied on resource "
                "'//aiplatform.googleapis.com/projects/gemini-xxxxxx/locations/us-central1/"
                "publishers/google/models/gemini-pro' (or it may not exist).",
                "status": "PERMISSION_DENIED",
            }
        },
        ProviderAuthError,
        "llm.auth",
        None,
        id="permission-denied",
    ),
    pytest.param(
        # https://cloud.google.com/apis/design/errors (UNAUTHENTICATED, the documented message)
        401,
        {
            "error": {
                "code": 401,
                "message": "Request had invalid authentication credentials. Expected OAuth 2 "
                "access token, login cookie or other valid authentication credential.",
                "status": "UNAUTHENTICATED",
            }
        },
        ProviderAuthError,
        "llm.auth",
        None,
        id="unauthenticated",
    ),
    pytest.param(
        # issue RooCodeInc/Roo-Code#3883 (RetryInfo body); the same shape on Vertex.
        429,
        {
            "error": {
                "code": 429,
                "message": "Resource exhausted. Please try again later.",
                "status": "RESOURCE_EXHAUSTED",
                "details": [
                    {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "30s"}
                ],
            }
        },
        RateLimitError,
        "llm.rate_limited",
        30.0,
        id="resource-exhausted-retryinfo",
    ),
]


@pytest.mark.parametrize(("status", "body", "cls", "code", "wait"), ERRORS)
def test_google_error_bodies_are_classified(
    status: int, body: dict[str, Any], cls: type, code: str, wait: float | None
) -> None:
    transport = httpx.MockTransport(lambda request: httpx.Response(status, json=body))
    client = _client("gemini-2.5-flash", PROJECT, http_client=httpx.Client(transport=transport))
    with pytest.raises(ProviderError) as caught:
        client.complete("hi")
    error = caught.value
    assert isinstance(error, cls)
    assert error.code == code
    if wait is not None:
        assert error.retry_after == wait
    assert "ya29.explicit-token" not in repr(error) + str(error)


# -- credentials: Application Default Credentials on loopback ------------------------


class _Google(BaseHTTPRequestHandler):
    """Google's token endpoint and the GCE metadata server, on loopback."""

    hits: list[str]
    fail_token = False

    def log_message(self, *args: Any) -> None:
        pass

    def _json(self, status: int, data: Any, headers: dict[str, str] | None = None) -> None:
        raw = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("content-length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        form = self.rfile.read(length).decode()
        self.server.hits.append(f"POST {self.path} {form.split('&')[0]}")  # type: ignore[attr-defined]
        if self.server.fail_token:  # type: ignore[attr-defined]
            self._json(400, {"error": "invalid_grant", "error_description": "Bad Request"})
            return
        n = len(self.server.hits)  # type: ignore[attr-defined]
        self._json(
            200, {"access_token": f"ya29.token-{n}", "expires_in": 3600, "token_type": "Bearer"}
        )

    def do_GET(self) -> None:
        self.server.hits.append(f"GET {self.path}")  # type: ignore[attr-defined]
        flavor = {"Metadata-Flavor": "Google"}
        if self.server.not_gce or self.headers.get("metadata-flavor") != "Google":  # type: ignore[attr-defined]
            self._json(403, {"error": "no flavor"})
        elif self.path.startswith("/computeMetadata/v1/project/project-id"):
            raw = b"metadata-project"
            self.send_response(200)
            self.send_header("Metadata-Flavor", "Google")
            self.send_header("content-type", "application/text")
            self.send_header("content-length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)
        elif "/token" in self.path:
            n = len(self.server.hits)  # type: ignore[attr-defined]
            self._json(
                200,
                {"access_token": f"ya29.gce-{n}", "expires_in": 3600, "token_type": "Bearer"},
                flavor,
            )
        elif "/service-accounts/default/" in self.path:
            self._json(
                200,
                {
                    "email": "sa@my-project.iam.gserviceaccount.com",
                    "scopes": list(vertex.SCOPES),
                    "aliases": ["default"],
                },
                flavor,
            )
        else:
            self._json(200, {}, flavor)


@pytest.fixture
def google() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Google)
    server.hits = []  # type: ignore[attr-defined]
    server.fail_token = False  # type: ignore[attr-defined]
    server.not_gce = False  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _url(server: ThreadingHTTPServer) -> str:
    host, port = server.server_address[:2]
    return f"http://{host}:{port}"


@pytest.fixture
def clean_google_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No real gcloud config, key file or metadata server can be found."""
    for name in (
        "GOOGLE_APPLICATION_CREDENTIALS",
        "GOOGLE_CLOUD_PROJECT",
        "GCLOUD_PROJECT",
        "GCE_METADATA_HOST",
        "GCE_METADATA_IP",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))
    monkeypatch.setenv("HOME", str(tmp_path))
    # A closed loopback port stands for "not on Google Cloud": the metadata probe fails fast.
    monkeypatch.setenv("GCE_METADATA_HOST", "127.0.0.1:9")
    monkeypatch.setenv("GCE_METADATA_IP", "127.0.0.1:9")
    (tmp_path / "gcloud").mkdir()
    return tmp_path


def _service_account_file(path: Path, token_uri: str) -> Path:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    path.write_text(
        json.dumps(
            {
                "type": "service_account",
                "project_id": "sa-project",
                "private_key_id": "k1",
                "private_key": pem,
                "client_email": "sa@sa-project.iam.gserviceaccount.com",
                "client_id": "1",
                "token_uri": token_uri,
            }
        )
    )
    return path


class _Clock:
    def __init__(self) -> None:
        self.now = datetime.now(UTC).replace(tzinfo=None)  # google-auth's expiry is naive UTC

    def __call__(self) -> datetime:
        return self.now


def test_a_service_account_key_signs_a_token_request_reused_then_refreshed(
    google: ThreadingHTTPServer, clean_google_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = _service_account_file(clean_google_env / "key.json", f"{_url(google)}/token")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(key))
    credentials, project = vertex.load_adc()
    assert project == "sa-project"
    clock = _Clock()
    tokens = vertex.TokenSource(credentials, clock=clock)
    assert tokens.token() == "ya29.token-1"
    assert google.hits[0].startswith("POST /token assertion=")  # type: ignore[attr-defined]
    clock.now += timedelta(minutes=30)
    assert tokens.token() == "ya29.token-1"  # still valid: reused
    assert tokens.refreshes == 1
    clock.now += timedelta(minutes=26)  # within the 5-minute margin of its expiry
    assert tokens.token() == "ya29.token-2"
    assert tokens.refreshes == 2


def test_adc_project_fills_the_url(
    google: ThreadingHTTPServer, clean_google_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = _service_account_file(clean_google_env / "key.json", f"{_url(google)}/token")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(key))
    config = resolve_provider_config("vertex", env={})
    assert "/projects/sa-project/" in (config.base_url or "")


def test_gcloud_user_credentials_refresh_against_their_token_uri(
    google: ThreadingHTTPServer, clean_google_env: Path
) -> None:
    (clean_google_env / "gcloud" / "application_default_credentials.json").write_text(
        json.dumps(
            {
                "type": "authorized_user",
                "client_id": "c.apps.googleusercontent.com",
                "client_secret": "s",
                "refresh_token": "1//r",
                "quota_project_id": "user-project",
                "token_uri": f"{_url(google)}/token",
            }
        )
    )
    credentials, _ = vertex.load_adc()
    assert credentials.refresh_token == "1//r"  # gcloud's file was the one found
    # google-auth always sends user credentials to Google's token endpoint; its public
    # with_token_uri() points this one at the loopback stand-in.
    tokens = vertex.TokenSource(credentials.with_token_uri(f"{_url(google)}/token"))
    assert tokens.token() == "ya29.token-1"
    assert google.hits == ["POST /token grant_type=refresh_token"]  # type: ignore[attr-defined]


def test_the_metadata_server_gives_the_token_and_project(
    google: ThreadingHTTPServer, clean_google_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from google.auth.compute_engine import _metadata

    host = _url(google).removeprefix("http://")
    monkeypatch.setenv("GCE_METADATA_HOST", host)
    monkeypatch.setenv("GCE_METADATA_IP", host)
    # google-auth reads GCE_METADATA_HOST once, when it is first imported (an earlier test
    # may have imported it): the test harness points it here too.
    monkeypatch.setattr(_metadata, "_GCE_METADATA_HOST", host)
    credentials, project = vertex.load_adc()
    assert project == "metadata-project"
    token = vertex.TokenSource(credentials).token()
    assert token.startswith("ya29.gce-")


def test_a_refused_refresh_is_an_auth_error_with_the_next_step(
    google: ThreadingHTTPServer, clean_google_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = _service_account_file(clean_google_env / "key.json", f"{_url(google)}/token")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(key))
    google.fail_token = True  # type: ignore[attr-defined]
    credentials, _ = vertex.load_adc()
    with pytest.raises(ProviderAuthError) as caught:
        vertex.TokenSource(credentials).token()
    assert "gcloud auth application-default login" in str(caught.value)


def test_no_credentials_at_all_is_an_auth_error(
    google: ThreadingHTTPServer, clean_google_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A metadata address that answers, but not as Google's: not on Google Cloud.
    google.not_gce = True  # type: ignore[attr-defined]
    host = _url(google).removeprefix("http://")
    monkeypatch.setenv("GCE_METADATA_HOST", host)
    monkeypatch.setenv("GCE_METADATA_IP", host)
    with pytest.raises(ProviderAuthError) as caught:
        vertex.load_adc()
    assert "gcloud auth application-default login" in str(caught.value)


def test_adc_tokens_reach_the_request(
    google: ThreadingHTTPServer, clean_google_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = _service_account_file(clean_google_env / "key.json", f"{_url(google)}/token")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(key))
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=ROWS[0]["body"])

    with httpx.Client(transport=httpx.MockTransport(handler)) as http:
        client = LLMClient(
            "vertex", envelope=clocked_envelope(FakeClock()), env={}, http_client=http
        )
        client.complete("hi")
        client.complete("again")
    assert [r.headers["authorization"] for r in seen] == ["Bearer ya29.token-1"] * 2
    assert "/projects/sa-project/" in str(seen[0].url)


# -- the extra, and the import budget --------------------------------------------------


def test_a_missing_extra_names_the_pip_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "google.auth", None)
    with pytest.raises(ProviderError) as caught:
        LLMClient("vertex", env=PROJECT)
    assert caught.value.code == "llm.not_configured"
    assert "pip install 'fluid-build[vertex]'" in str(caught.value)


def test_importing_fluid_build_loads_neither_google_auth_nor_the_adapter() -> None:
    code = (
        "import sys, fluid_build, fluid_build.copilot;"
        "print([m for m in sys.modules if m.startswith('google.auth') "
        "or m == 'fluid_build.copilot.llm.vertex'])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# -- no network off Google Cloud, and a clock that moves ---------------------------------


def test_off_google_cloud_no_metadata_server_is_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import google.auth

    for name in (
        "GOOGLE_APPLICATION_CREDENTIALS",
        "GCE_METADATA_HOST",
        "GCE_METADATA_IP",
        "K_SERVICE",
        "CLOUD_RUN_JOB",
        "FUNCTION_TARGET",
        "GOOGLE_CLOUD_PROJECT",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))
    monkeypatch.setattr(vertex, "_on_google_hardware", lambda: False)

    def never(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("google.auth.default pings 169.254.169.254 off Google Cloud")

    monkeypatch.setattr(google.auth, "default", never)
    with pytest.raises(ProviderAuthError) as caught:
        resolve_provider_config("vertex", env={})
    assert "gcloud auth application-default login" in caught.value.message


def test_the_default_clock_moves_so_a_token_is_refreshed_before_it_expires(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [datetime(2026, 11, 26, 12, 0)]

    class Clock(datetime):
        @classmethod
        def now(cls, tz: Any = None) -> Any:  # type: ignore[override]
            return now[0].replace(tzinfo=tz)

    monkeypatch.setattr(vertex, "datetime", Clock)

    class Credentials:
        token = "ya29.first"
        expiry = datetime(2026, 11, 26, 13, 0)

        def refresh(self, request: Any) -> None:
            self.token = "ya29.second"
            self.expiry = now[0] + timedelta(hours=1)

    tokens = vertex.TokenSource(Credentials())
    assert tokens.token() == "ya29.first"
    now[0] = datetime(2026, 11, 26, 12, 56)  # 4 minutes before it expires: refreshed
    assert tokens.token() == "ya29.second"
    assert tokens.refreshes == 1


# -- prices and the capability matrix ----------------------------------------------------


def _google_price(model: str, input_tokens: int, output_tokens: int) -> float:
    """genai-prices' own sum for Google's Gemini (the Vertex rates are the same list)."""
    from genai_prices import Usage as GenaiUsage
    from genai_prices import data_snapshot

    _, info = data_snapshot.get_snapshot().find_provider_model(model, None, "google", None)
    usage = GenaiUsage(input_tokens=input_tokens, output_tokens=output_tokens)
    return float(info.get_prices(datetime.now(tz=UTC)).calc_price(usage)["total_price"])


def test_a_real_vertex_answer_is_priced_as_gemini_with_thinking_as_output() -> None:
    row = next(r for r in ROWS if r["id"] == "vertex-global-thoughts-count")
    usage = row["expect"]["usage"]
    assert usage["reasoning_tokens"] > 0  # the thoughts are part of output_tokens
    with httpx.Client(transport=_answer(row, [])) as http:
        done = _client(row["request_model"], PROJECT, http_client=http).complete("hi")
    assert done.usage.output_tokens == usage["output_tokens"]
    assert done.cost_usd is not None
    assert done.cost_usd == pytest.approx(
        _google_price(row["expect"]["model"], usage["input_tokens"], usage["output_tokens"])
    )
    answer_only = usage["output_tokens"] - usage["reasoning_tokens"]
    assert done.cost_usd > _google_price(row["expect"]["model"], usage["input_tokens"], answer_only)


def test_vertex_models_have_gemini_s_capability_rows() -> None:
    from dataclasses import replace

    from fluid_build.copilot.call.capabilities import capabilities_for

    for model in ("gemini-2.5-flash", "gemini-2.5-pro", "gemini-2.0-flash-001"):
        caps = capabilities_for("vertex", model)
        assert caps.known
        assert replace(caps, provider="gemini") == capabilities_for("gemini", model)
        assert (caps.tools, caps.strict_schema) == (True, True)


# -- recorded Vertex error bodies (tests/data/provider_errors.json) and the next step ----

ERROR_ROWS = [
    row
    for row in json.loads(
        (Path(__file__).parent / "data" / "provider_errors.json").read_text(encoding="utf-8")
    )
    if row["provider"] == "vertex"
]


def test_the_recorded_vertex_error_bodies_cover_each_kind() -> None:
    codes = {row["expect"]["code"] for row in ERROR_ROWS}
    assert {"llm.auth", "llm.model_not_found", "llm.rate_limited", "llm.context_overflow"} <= codes
    assert all(row["source"] for row in ERROR_ROWS)


@pytest.mark.parametrize("row", ERROR_ROWS, ids=lambda r: r["id"])
def test_recorded_vertex_errors_through_the_client(row: dict[str, Any]) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(row["status"], headers=row["headers"], json=row["body"])

    with httpx.Client(transport=httpx.MockTransport(handler)) as http:
        client = _client("gemini-2.5-flash", PROJECT, http_client=http)
        with pytest.raises(ProviderError) as caught:
            client.complete("hi")
    error = caught.value
    expect = row["expect"]
    assert (type(error).__name__, error.code, error.retryable) == (
        expect["class"],
        expect["code"],
        expect["retryable"],
    )
    assert error.provider == "vertex"
    if error.code == "llm.auth":
        # The next step is Google's, never a key variable Vertex does not read.
        assert "gcloud auth application-default login" in error.action
        assert "roles/aiplatform.user" in error.action
        assert "aiplatform.googleapis.com" in error.action
        assert "_API_KEY" not in error.action


def test_a_retry_delay_past_the_cap_waits_the_cap() -> None:
    from fluid_build.copilot.agents.errors import MAX_RETRY_AFTER

    body = {
        "error": {
            "code": 429,
            "message": "Resource exhausted. Please try again later.",
            "status": "RESOURCE_EXHAUSTED",
            "details": [
                {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "864000s"}
            ],
        }
    }
    transport = httpx.MockTransport(lambda request: httpx.Response(429, json=body))
    with httpx.Client(transport=transport) as http, pytest.raises(RateLimitError) as caught:
        _client("gemini-2.5-flash", PROJECT, http_client=http).complete("hi")
    assert caught.value.retry_after == MAX_RETRY_AFTER


# -- the async API never waits for a token refresh on its event loop ---------------------


class _SlowTokens(BaseHTTPRequestHandler):
    """A token endpoint that answers only once the test lets it (server.release)."""

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        server: Any = self.server
        server.arrived.set()
        # Only a coroutine running while the refresh is pending can release it; the
        # timeout bounds a failing run (a refresh blocking the event loop), not a passing one.
        server.released.append(server.release.wait(3.0))
        server.release.clear()
        n = len(server.released)
        # The n-th token lives n hours: the test's clock leaps ahead, google-auth's does not.
        raw = json.dumps({"access_token": f"ya29.slow-{n}", "expires_in": 3600 * n}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)


@pytest.mark.parametrize("mode", ["acomplete", "astream"])
def test_async_calls_refresh_a_stale_token_off_the_event_loop(
    mode: str, clean_google_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _SlowTokens)
    server.arrived = threading.Event()  # type: ignore[attr-defined]
    server.release = threading.Event()  # type: ignore[attr-defined]
    server.released = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    try:
        key = _service_account_file(clean_google_env / "key.json", f"{_url(server)}/token")
        monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(key))
        clock = _Clock()
        seen: list[str] = []

        row = next(r for r in ROWS if ("stream" in r) == (mode == "astream"))

        def handler(request: httpx.Request) -> httpx.Response:
            seen.append(request.headers["authorization"])
            return httpx.Response(row["status"], headers=row["headers"], content=_wire(row))

        async def other(done: asyncio.Event, ticks: list[int]) -> None:
            # Another coroutine of the same loop: it runs only if the refresh does not
            # hold the loop, and it is the one that lets the token endpoint answer.
            while not done.is_set():
                if server.arrived.is_set():  # type: ignore[attr-defined]
                    ticks.append(1)
                    server.arrived.clear()  # type: ignore[attr-defined]
                    server.release.set()  # type: ignore[attr-defined]
                await asyncio.sleep(0)

        async def call(client: LLMClient) -> list[int]:
            done, ticks = asyncio.Event(), []
            helper = asyncio.create_task(other(done, ticks))
            try:
                if mode == "acomplete":
                    await client.acomplete("hi")
                else:
                    assert [e async for e in client.astream("hi")][-1].type == "done"
            finally:
                done.set()
                await helper
            return ticks

        async def go() -> tuple[list[int], list[int], list[int]]:
            async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
                client = LLMClient(
                    "vertex",
                    envelope=clocked_envelope(FakeClock()),
                    env={},
                    async_http_client=http,
                )
                (entry,) = client._entries()
                tokens = entry.adapter.tokens  # type: ignore[attr-defined]
                tokens._clock = clock  # the token's age, without waiting an hour
                first = await call(client)  # no token yet: fetched
                clock.now += timedelta(minutes=30)
                fresh = await call(client)  # valid: reused, no refresh
                clock.now += timedelta(minutes=26)  # inside the 5-minute margin: stale
                stale = await call(client)
                return first, fresh, stale

        first, fresh, stale = asyncio.run(go())
    finally:
        server.shutdown()
        server.server_close()
    assert server.released == [True, True]  # type: ignore[attr-defined]
    assert (first, fresh, stale) == ([1], [], [1])
    assert seen == ["Bearer ya29.slow-1", "Bearer ya29.slow-1", "Bearer ya29.slow-2"]


# -- every transport, over a real socket -------------------------------------------------

TOKEN = "ya29.explicit-token"


def _over(transport: str, url: str, call: str, model: str) -> Any:
    """One call (``complete`` or ``stream``) to the endpoint ``url`` through ``transport``."""
    env = {
        **PROJECT,
        **transport_env(transport),
    }

    def client(**http: Any) -> LLMClient:
        return LLMClient(
            "vertex",
            model,
            api_key=TOKEN,
            base_url=url,
            envelope=clocked_envelope(FakeClock()),
            env=env,
            **http,
        )

    return call_over(transport, client, call)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_every_transport_carries_a_real_answer_and_a_real_stream(transport: str) -> None:
    from tests.loopback import Seen, base_url, http_server

    answer = next(r for r in ROWS if r["id"] == "vertex-global-thoughts-count")
    stream = next(r for r in ROWS if "stream" in r)
    prefix = "/v1/projects/my-project/locations/us-central1/publishers/google/models/"
    expected = [
        (f"{prefix}{answer['request_model']}:generateContent", answer),
        (f"{prefix}{stream['request_model']}:streamGenerateContent?alt=sse", stream),
    ]

    def reply(seen: Seen) -> tuple[int, dict[str, str], bytes]:
        path, row = expected.pop(0)
        assert seen.path == path
        assert seen.headers["authorization"] == f"Bearer {TOKEN}"
        assert "x-goog-api-key" not in seen.headers
        return row["status"], row["headers"], _wire(row)

    with http_server(reply) as server:
        url = base_url(server)
        done = _over(transport, url, "complete", answer["request_model"])
        events = _over(transport, url, "stream", stream["request_model"])
    assert expected == []
    _check(done, answer["expect"])
    assert "".join(e.text for e in events if e.type == "text") == stream["expect"]["text"]
    assert events[-1].type == "done"
    _check(events[-1].completion, stream["expect"])


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_stream_reset_mid_answer_is_the_same_typed_error_on_every_transport(
    transport: str,
) -> None:
    from tests.loopback import serve, sse_then

    chunk = {
        "candidates": [{"content": {"role": "model", "parts": [{"text": "Hal"}]}}],
        "modelVersion": "gemini-2.5-flash",
    }
    first = f"data: {json.dumps(chunk)}\r\n\r\n".encode()
    with serve(sse_then("reset", first)) as url, pytest.raises(ProviderError) as caught:
        _over(transport, url, "stream", "gemini-2.5-flash")
    assert (caught.value.code, caught.value.retryable) == ("llm.network_error", True)
    assert caught.value.details["partial_text"] == "Hal"
    assert TOKEN not in str(caught.value) + repr(caught.value)


# -- credentials bounded: by the deadline, off the loop, files read as files (issue 32) -----

TIGHT = 0.5  # the call's deadline (s)
#: How late past it a call may end (the conformance suite's own bound is 1.5 s): a loaded
#: machine's scheduling, never a credential source's silence (seconds, unbounded before).
MARGIN = 1.0


def _model_answers(seen: list[httpx.Request]) -> Any:
    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=ROWS[0]["body"])

    return handler


def _ticking_call(client: LLMClient) -> tuple[BaseException | None, float, list[float]]:
    """``acomplete`` while another task of the loop ticks every 10 ms: the error, the
    seconds it took, and when each tick came."""
    import time

    warm_async_transport()
    ticks: list[float] = []

    async def ticker(stop: asyncio.Event) -> None:
        while not stop.is_set():
            ticks.append(time.monotonic())
            await asyncio.sleep(0.01)  # noqa: real-sleep - the loop's liveness is what is measured

    async def go() -> tuple[BaseException | None, float]:
        stop = asyncio.Event()
        other = asyncio.create_task(ticker(stop))
        started = time.monotonic()
        try:
            await client.acomplete("hi")
        except Exception as exc:
            return exc, time.monotonic() - started
        finally:
            stop.set()
            await other
            await client.aclose()
        return None, time.monotonic() - started

    error, elapsed = asyncio.run(go())
    return error, elapsed, ticks


@pytest.mark.parametrize("mode", ["complete", "acomplete"])
@pytest.mark.parametrize("endpoint", ["silent", "drip_head", "drip_body"])
def test_a_token_endpoint_that_never_finishes_ends_the_call_within_its_deadline(
    endpoint: str, mode: str, clean_google_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import itertools
    import time

    from tests import hostile

    seen: list[httpx.Request] = []
    with hostile.serve(getattr(hostile, endpoint), hold=30.0) as server:
        key = _service_account_file(clean_google_env / "key.json", f"{server.url}/token")
        monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(key))
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        if mode == "complete":
            with httpx.Client(transport=httpx.MockTransport(_model_answers(seen))) as http:
                client = LLMClient("vertex", env={}, deadline=TIGHT, http_client=http)
                started = time.monotonic()
                try:
                    client.complete("hi")
                except Exception as exc:
                    error: BaseException | None = exc
                else:
                    error = None
                elapsed = time.monotonic() - started
        else:
            client = LLMClient("vertex", env={}, deadline=TIGHT, base_url="http://127.0.0.1:9")
            error, elapsed, ticks = _ticking_call(client)
            assert len(ticks) >= 5, ticks  # the loop ran on while the token was awaited
            assert max(b - a for a, b in itertools.pairwise(ticks)) < 0.4
        assert server.requests  # the token endpoint was asked
    assert isinstance(error, ProviderError), error
    assert error.code == "llm.deadline_exceeded"
    assert "Google access token" in str(error)
    assert elapsed < TIGHT + MARGIN, elapsed
    assert seen == []


@pytest.mark.parametrize("drip", ["drip_head", "drip_body"])
def test_the_token_exchange_itself_is_bounded_as_a_whole_not_per_read(drip: str) -> None:
    import time

    import google.auth.exceptions

    from tests import hostile

    # The head or the body drips a byte every 0.5 s: each read is within the 0.6 s timeout,
    # and the server would go on for 3 s; the exchange as a whole gets 0.6 s. (The lookup's
    # thread, not only the call waiting for it, is free again.)
    with hostile.serve(getattr(hostile, drip), hold=3.0) as server:
        request = vertex._transport()()
        started = time.monotonic()
        with pytest.raises(google.auth.exceptions.TransportError) as caught:
            request(f"{server.url}/token", method="POST", body=b"x", timeout=0.6)
        elapsed = time.monotonic() - started
    assert elapsed < 1.5, elapsed
    assert "took over 0.6 s" in str(caught.value)


def _unusable(error: BaseException, path: Path | str) -> None:
    assert isinstance(error, ProviderError), repr(error)
    assert error.code == "llm.not_configured", error
    assert error.details["variable"] == "GOOGLE_APPLICATION_CREDENTIALS"
    assert str(path) in str(error)


def _construct_within(seconds: float, env: dict[str, str]) -> BaseException | None:
    """``LLMClient("vertex", env=env)`` in a thread: its error, or AssertionError if it is
    still running after ``seconds`` (it would hang)."""
    outcome: list[BaseException | None] = []

    def make() -> None:
        try:
            LLMClient("vertex", env=env).close()
        except BaseException as exc:
            outcome.append(exc)
        else:
            outcome.append(None)

    thread = threading.Thread(target=make, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        return AssertionError(f"LLMClient() still running after {seconds} s")
    return outcome[0]


@pytest.mark.parametrize("project", [None, "my-project"])
def test_an_adc_file_that_is_a_fifo_is_refused_unread(
    project: str | None, clean_google_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    fifo = clean_google_env / "adc.json"
    os.mkfifo(fifo)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(fifo))
    env = {"GOOGLE_CLOUD_PROJECT": project} if project else {}
    try:
        if project is None:  # the project is looked for in the file while the client is made
            error = _construct_within(5.0, env)
        else:  # the file is read by the first call's credential lookup
            with httpx.Client(transport=httpx.MockTransport(_model_answers([]))) as http:
                client = LLMClient("vertex", env=env, deadline=5.0, http_client=http)
                with pytest.raises(ProviderError) as caught:
                    client.complete("hi")
                error = caught.value
    finally:
        # A reader stuck on the FIFO (the old code) gets its end of file and lets go.
        with contextlib.suppress(OSError):
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    assert error is not None
    _unusable(error, fifo)
    assert "FIFO" in str(error)


def _nested(depth: int) -> str:
    return '{"type": "service_account", "x": ' + "[" * depth + "]" * depth + "}"


@pytest.mark.parametrize(
    "kind", ["directory", "dev-zero", "nested", "not-json", "not-an-object", "missing"]
)
@pytest.mark.parametrize("when", ["construction", "call"])
def test_an_unusable_adc_file_is_not_configured_naming_the_file(
    kind: str, when: str, clean_google_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = clean_google_env / "adc.json"
    if kind == "directory":
        path.mkdir()
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")  # endless: read until MemoryError, unbounded
    elif kind == "nested":
        path.write_text(_nested(100_000))
    elif kind == "not-json":
        path.write_text("<html>login</html>")
    elif kind == "not-an-object":
        path.write_text("[1, 2]")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(path))
    if when == "construction":
        with pytest.raises(ProviderError) as caught:
            LLMClient("vertex", env={})
    else:
        with httpx.Client(transport=httpx.MockTransport(_model_answers([]))) as http:
            client = LLMClient("vertex", env=PROJECT, http_client=http)
            with pytest.raises(ProviderError) as caught:
                client.complete("hi")
    _unusable(caught.value, path)


def test_a_gcloud_adc_file_that_is_a_directory_is_not_configured(
    clean_google_env: Path,
) -> None:
    path = clean_google_env / "gcloud" / "application_default_credentials.json"
    path.mkdir()
    with pytest.raises(ProviderError) as caught:
        LLMClient("vertex", env={})
    _unusable(caught.value, path)


def test_a_key_file_google_auth_cannot_use_is_not_configured(
    clean_google_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = clean_google_env / "adc.json"
    path.write_text(json.dumps({"type": "service_account", "project_id": "p"}))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(path))
    with httpx.Client(transport=httpx.MockTransport(_model_answers([]))) as http:
        client = LLMClient("vertex", env={}, http_client=http)  # the project: in the file
        with pytest.raises(ProviderError) as caught:
            client.complete("hi")
    _unusable(caught.value, path)


def test_a_token_endpoint_answering_200_with_no_json_is_an_auth_error(
    clean_google_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests import hostile

    page = hostile.respond(200, b"<html>proxy login</html>", (("content-type", "text/html"),))
    with hostile.serve(page) as server:
        key = _service_account_file(clean_google_env / "key.json", f"{server.url}/token")
        monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(key))
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        with httpx.Client(transport=httpx.MockTransport(_model_answers([]))) as http:
            client = LLMClient("vertex", env={}, deadline=5.0, http_client=http)
            with pytest.raises(ProviderAuthError) as caught:
                client.complete("hi")
    assert "not an access token" in str(caught.value)


def test_making_a_client_never_asks_the_metadata_server_for_the_project(
    clean_google_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # On Google Cloud (a metadata server answers) with no project set and no file naming
    # one: the client is refused at once naming GOOGLE_CLOUD_PROJECT; nothing is asked.
    import time

    from tests import hostile

    with hostile.serve(hostile.silent, hold=30.0) as server:
        host = server.url.removeprefix("http://")
        monkeypatch.setenv("GCE_METADATA_HOST", host)
        monkeypatch.setenv("GCE_METADATA_IP", host)
        started = time.monotonic()
        error = _construct_within(5.0, {})
        elapsed = time.monotonic() - started
        assert server.requests == []
    assert isinstance(error, ProviderError), repr(error)
    assert error.code == "llm.not_configured"
    assert error.details["variable"] == "GOOGLE_CLOUD_PROJECT"
    assert elapsed < 0.5, elapsed


def test_the_project_comes_from_gclouds_configuration_when_no_file_names_one(
    clean_google_env: Path,
) -> None:
    gcloud = clean_google_env / "gcloud"
    (gcloud / "application_default_credentials.json").write_text(
        json.dumps(
            {
                "type": "authorized_user",
                "client_id": "c",
                "client_secret": "s",
                "refresh_token": "r",
            }
        )
    )
    (gcloud / "active_config").write_text("work\n")
    (gcloud / "configurations").mkdir()
    (gcloud / "configurations" / "config_work").write_text("[core]\nproject = gcloud-project\n")
    config = resolve_provider_config("vertex", env={})
    assert "/projects/gcloud-project/" in (config.base_url or "")
