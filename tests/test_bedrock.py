"""provider="bedrock": SigV4 signing, the AWS credential chain, endpoints, event-stream frames.

The real answers (JSON and event-stream) replay in tests/test_real_answers.py
(rows ``bedrock-*`` of tests/data/provider_answers.json, from pydantic-ai's
recorded cassettes). Here: what is sent, where, signed how, and what a broken
stream becomes.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import itertools
import json
import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from fluid_build.copilot import LLMClient
from fluid_build.copilot.agents.errors import ProviderAuthError, ProviderError
from fluid_build.copilot.llm.settings import resolve_provider_config
from tests.fakes import FakeClock, aws_sandbox, clocked_envelope, warm_async_transport
from tests.transport_calls import TRANSPORTS, call_over, transport_env

ENDPOINT = "https://bedrock-runtime.us-east-1.amazonaws.com"
MODEL = "amazon.nova-micro-v1:0"
ACCESS = "AKIDEXAMPLE"
SECRET = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
ANSWER = {
    "output": {"message": {"role": "assistant", "content": [{"text": "hi"}]}},
    "stopReason": "end_turn",
    "usage": {"inputTokens": 3, "outputTokens": 1},
}
ROWS = json.loads((Path(__file__).parent / "data" / "provider_answers.json").read_text())
STREAM = base64.b64decode(
    "".join(next(r for r in ROWS if r["id"] == "bedrock-stream-text")["stream"])
)


@pytest.fixture(autouse=True)
def aws_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No AWS variable of the machine's, a fresh HOME, and no instance metadata lookups."""
    aws_sandbox(monkeypatch, tmp_path, config_dir=".aws")
    return tmp_path


def _client(handler: Any, env: dict[str, str], **kwargs: Any) -> tuple[LLMClient, httpx.Client]:
    http = httpx.Client(transport=httpx.MockTransport(handler))
    client = LLMClient(
        "bedrock",
        MODEL,
        envelope=clocked_envelope(FakeClock()),
        env=env,
        http_client=http,
        **kwargs,
    )
    return client, http


def _answer(seen: list[httpx.Request], body: bytes | None = None, **headers: str) -> Any:
    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        content = json.dumps(ANSWER).encode() if body is None else body
        return httpx.Response(200, content=content, headers=headers)

    return handler


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode(), hashlib.sha256).digest()


def _expected_signature(request: httpx.Request, secret: str, region: str) -> str:
    """SigV4 recomputed from the request as sent, by the published algorithm
    (https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_sigv-create-signed-request.html),
    not by botocore: what the server will check."""
    auth = request.headers["authorization"]
    signed = auth.split("SignedHeaders=")[1].split(",")[0].split(";")
    stamp = request.headers["x-amz-date"]
    # Not S3: the path as it arrives is URI-encoded once more (a "%3A" sent is "%253A" there,
    # a ":" sent is "%3A"), so what is signed must be what is sent, byte for byte.
    segments = request.url.raw_path.decode().split("?")[0].split("/")
    path = "/".join(quote(part, safe="~") for part in segments)
    canonical = "\n".join(
        [
            request.method,
            path,
            "",
            *(f"{name}:{request.headers[name].strip()}" for name in signed),
            "",
            ";".join(signed),
            hashlib.sha256(request.content).hexdigest(),
        ]
    )
    scope = f"{stamp[:8]}/{region}/bedrock/aws4_request"
    to_sign = "\n".join(
        ["AWS4-HMAC-SHA256", stamp, scope, hashlib.sha256(canonical.encode()).hexdigest()]
    )
    key = ("AWS4" + secret).encode()
    for part in (stamp[:8], region, "bedrock", "aws4_request"):
        key = _hmac(key, part)
    return hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()


def test_a_request_is_signed_with_sigv4_from_environment_credentials(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_SESSION_TOKEN", "session-token-1")
    seen: list[httpx.Request] = []
    client, http = _client(_answer(seen), {"AWS_REGION": "eu-west-3"})
    with http:
        completion = client.complete("hi")
    assert completion.text == "hi"
    request = seen[0]
    assert str(request.url) == (
        "https://bedrock-runtime.eu-west-3.amazonaws.com/model/amazon.nova-micro-v1:0/converse"
    )
    auth = request.headers["authorization"]
    assert auth.startswith(f"AWS4-HMAC-SHA256 Credential={ACCESS}/")
    assert "/eu-west-3/bedrock/aws4_request" in auth
    assert request.headers["x-amz-security-token"] == "session-token-1"
    assert auth.endswith("Signature=" + _expected_signature(request, SECRET, "eu-west-3"))
    body = json.loads(request.content)
    assert body["messages"] == [{"role": "user", "content": [{"text": "hi"}]}]


def test_each_attempt_signs_anew(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if len(seen) == 1:
            return httpx.Response(
                503, json={"message": "busy"}, headers={"x-amzn-errortype": "ServiceUnavailable"}
            )
        return httpx.Response(200, json=ANSWER)

    client, http = _client(handler, {"AWS_REGION": "us-east-1"})
    with http:
        assert client.complete("hi").text == "hi"
    assert len(seen) == 2
    for request in seen:
        signature = _expected_signature(request, SECRET, "us-east-1")
        assert request.headers["authorization"].endswith(signature)


def test_credentials_and_region_from_a_profile_in_the_shared_files(
    aws_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (aws_home / ".aws").mkdir()
    (aws_home / ".aws" / "config").write_text("[profile team]\nregion = ap-south-1\n")
    (aws_home / ".aws" / "credentials").write_text(
        f"[team]\naws_access_key_id = AKIDPROFILE\naws_secret_access_key = {SECRET}\n"
    )
    monkeypatch.setenv("AWS_PROFILE", "team")
    seen: list[httpx.Request] = []
    import os

    client, http = _client(_answer(seen), dict(os.environ))
    with http:
        client.complete("hi")
    request = seen[0]
    assert request.url.host == "bedrock-runtime.ap-south-1.amazonaws.com"
    assert "Credential=AKIDPROFILE/" in request.headers["authorization"]
    assert request.headers["authorization"].endswith(
        _expected_signature(request, SECRET, "ap-south-1")
    )


def test_a_bedrock_api_key_is_sent_as_a_bearer_token() -> None:
    seen: list[httpx.Request] = []
    env = {"AWS_REGION": "us-west-2", "AWS_BEARER_TOKEN_BEDROCK": "bedrock-api-key-1"}
    client, http = _client(_answer(seen), env)
    with http:
        client.complete("hi")
    assert seen[0].headers["authorization"] == "Bearer bedrock-api-key-1"
    assert "x-amz-date" not in seen[0].headers


def test_no_credentials_anywhere_is_an_auth_error_naming_the_aws_next_step() -> None:
    client, http = _client(_answer([]), {"AWS_REGION": "us-east-1"})
    with http, pytest.raises(ProviderAuthError) as caught:
        client.complete("hi")
    assert caught.value.code == "llm.auth"
    assert "aws sso login" in str(caught.value)
    assert "AWS_PROFILE" in str(caught.value)


def test_a_missing_region_is_not_configured_naming_aws_region() -> None:
    with pytest.raises(ProviderError) as caught:
        resolve_provider_config("bedrock", env={})
    assert caught.value.code == "llm.not_configured"
    assert "AWS_REGION" in str(caught.value)
    assert caught.value.details["variable"] == "AWS_REGION"


@pytest.mark.parametrize(
    ("env", "base_url", "expected"),
    [
        (
            {"AWS_REGION": "eu-central-1"},
            None,
            "https://bedrock-runtime.eu-central-1.amazonaws.com",
        ),
        (
            {"AWS_DEFAULT_REGION": "us-west-2"},
            None,
            "https://bedrock-runtime.us-west-2.amazonaws.com",
        ),
        (
            {"AWS_REGION": "us-east-1", "AWS_ENDPOINT_URL": "http://127.0.0.1:4566"},
            None,
            "http://127.0.0.1:4566",
        ),
        (
            {
                "AWS_REGION": "us-east-1",
                "AWS_ENDPOINT_URL": "http://127.0.0.1:4566",
                "AWS_ENDPOINT_URL_BEDROCK_RUNTIME": "https://vpce-1.bedrock-runtime.example.test",
            },
            None,
            "https://vpce-1.bedrock-runtime.example.test",
        ),
        (
            {"AWS_REGION": "us-east-1", "AWS_ENDPOINT_URL_BEDROCK_RUNTIME": "http://127.0.0.1:1"},
            "http://127.0.0.1:2",
            "http://127.0.0.1:2",
        ),
    ],
)
def test_the_endpoint_comes_from_the_documented_variables(
    env: dict[str, str], base_url: str | None, expected: str
) -> None:
    config = resolve_provider_config("bedrock", base_url=base_url, env=env)
    assert config.base_url == expected


def test_the_region_is_read_from_a_standard_endpoint_when_a_token_is_used() -> None:
    config = resolve_provider_config(
        "bedrock", base_url=ENDPOINT, env={"AWS_BEARER_TOKEN_BEDROCK": "k"}
    )
    assert (config.region, config.api_key) == ("us-east-1", "k")


def test_a_missing_botocore_is_not_configured_with_the_pip_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "botocore.session", None)
    monkeypatch.setitem(sys.modules, "botocore.eventstream", None)
    for env in (
        {"AWS_REGION": "us-east-1"},
        {"AWS_REGION": "us-east-1", "AWS_BEARER_TOKEN_BEDROCK": "k"},
    ):
        with pytest.raises(ProviderError) as caught:
            LLMClient("bedrock", MODEL, env=env)
        assert caught.value.code == "llm.not_configured"
        assert "pip install 'fluid-build[bedrock]'" in str(caught.value)


def _streamed(body: bytes, **env: str) -> list[Any]:
    seen: list[httpx.Request] = []
    handler = _answer(seen, body, **{"content-type": "application/vnd.amazon.eventstream"})
    client, http = _client(
        handler, {"AWS_REGION": "us-east-1", "AWS_BEARER_TOKEN_BEDROCK": "k", **env}
    )
    with http:
        events = list(client.stream("hi"))
    assert seen[0].url.path.endswith("/converse-stream")
    return events


def test_a_stream_delivered_one_byte_at_a_time_reads_the_same() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200,
            stream=_Drip(STREAM),
            headers={"content-type": "application/vnd.amazon.eventstream"},
        )

    client, http = _client(handler, {"AWS_REGION": "us-east-1", "AWS_BEARER_TOKEN_BEDROCK": "k"})
    with http:
        events = list(client.stream("hi"))
    done = events[-1].completion
    assert done is not None
    assert done.text.startswith("The capital of France is Paris.")
    assert (done.finish_reason, done.usage.input_tokens, done.usage.output_tokens) == (
        "end_turn",
        13,
        82,
    )


class _Drip(httpx.SyncByteStream):
    def __init__(self, data: bytes) -> None:
        self.data = data

    def __iter__(self) -> Any:
        for i in range(len(self.data)):
            yield self.data[i : i + 1]


def test_a_frame_over_the_event_limit_is_refused_as_it_starts() -> None:
    delta = {"contentBlockIndex": 0, "delta": {"text": "x" * 2000}}
    big = _frame(
        {":message-type": "event", ":event-type": "contentBlockDelta"}, json.dumps(delta).encode()
    )
    with pytest.raises(ProviderError) as caught:
        _streamed(STREAM[:181] + big[:8], FLUID_LLM_MAX_EVENT_BYTES="1024")
    assert caught.value.code == "llm.response_too_large"
    assert caught.value.details["received"] == len(big)  # refused from its length alone


def test_a_stream_cut_inside_a_frame_is_a_typed_error() -> None:
    cut = STREAM[: len(STREAM) - 40]  # inside the last frame (metadata, after messageStop)
    with pytest.raises(ProviderError) as caught:
        _streamed(cut)
    assert caught.value.code == "llm.network_error"
    assert caught.value.details["partial_frame_bytes"] > 0


def test_a_frame_whose_checksum_fails_is_a_malformed_response() -> None:
    broken = bytearray(STREAM)
    broken[200] ^= 0xFF  # inside the second frame's payload
    with pytest.raises(ProviderError) as caught:
        _streamed(bytes(broken))
    assert caught.value.code == "llm.malformed_response"


def _frame(headers: dict[str, str], payload: bytes) -> bytes:
    """One event-stream frame (string headers), as AWS encodes it."""
    import zlib

    raw = b""
    for name, value in headers.items():
        raw += bytes([len(name)]) + name.encode() + b"\x07" + len(value).to_bytes(2, "big")
        raw += value.encode()
    total = 16 + len(raw) + len(payload)
    prelude = total.to_bytes(4, "big") + len(raw).to_bytes(4, "big")
    prelude += zlib.crc32(prelude).to_bytes(4, "big")
    message = prelude + raw + payload
    return message + zlib.crc32(message).to_bytes(4, "big")


def test_an_exception_frame_is_classified() -> None:
    frame = _frame(
        {":message-type": "exception", ":exception-type": "throttlingException"},
        b'{"message":"Too many requests, please wait before trying again."}',
    )
    with pytest.raises(ProviderError) as caught:
        _streamed(STREAM[:181] + frame)  # messageStart, then the exception
    assert caught.value.code == "llm.rate_limited"
    assert caught.value.retryable is True


def test_a_guardrail_intervention_is_content_filtered() -> None:
    body = {
        "output": {"message": {"role": "assistant", "content": [{"text": "Sorry."}]}},
        "stopReason": "guardrail_intervened",
        "usage": {"inputTokens": 9, "outputTokens": 2},
    }
    client, http = _client(
        _answer([], json.dumps(body).encode()),
        {"AWS_REGION": "us-east-1", "AWS_BEARER_TOKEN_BEDROCK": "k"},
    )
    with http, pytest.raises(ProviderError) as caught:
        client.complete("hi")
    assert caught.value.code == "llm.content_filtered"


def test_a_structured_answer_is_a_forced_tool_and_its_input_the_text() -> None:
    from pydantic import BaseModel

    class City(BaseModel):
        name: str

    body = {
        "output": {
            "message": {
                "role": "assistant",
                "content": [
                    {
                        "toolUse": {
                            "toolUseId": "t1",
                            "name": "respond_City",
                            "input": {"name": "Oslo"},
                        }
                    }
                ],
            }
        },
        "stopReason": "tool_use",
        "usage": {"inputTokens": 9, "outputTokens": 2},
    }
    seen: list[httpx.Request] = []
    client, http = _client(
        _answer(seen, json.dumps(body).encode()),
        {"AWS_REGION": "us-east-1", "AWS_BEARER_TOKEN_BEDROCK": "k"},
    )
    with http:
        completion = client.complete("hi", response_model=City)
    assert completion.parsed == City(name="Oslo")
    assert completion.tool_calls == []
    sent = json.loads(seen[0].content)
    assert sent["toolConfig"]["toolChoice"] == {"tool": {"name": "respond_City"}}


def test_importing_the_library_loads_neither_botocore_nor_the_adapter() -> None:
    import subprocess

    code = (
        "import sys, fluid_build, fluid_build.copilot\n"
        "print(sorted(m for m in sys.modules if m.startswith('botocore') "
        "or m == 'fluid_build.copilot.llm.bedrock'))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


# -- error answers ---------------------------------------------------------------------------


def _refused(status: int, kind: str, message: str) -> ProviderError:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            status,
            json={"message": message},
            headers={"x-amzn-errortype": f"{kind}:http://internal.amazon.com/coral/x/"},
        )

    client, http = _client(handler, {"AWS_REGION": "us-east-1", "AWS_BEARER_TOKEN_BEDROCK": "k"})
    with http, pytest.raises(ProviderError) as caught:
        client.complete("hi")
    return caught.value


def test_a_rejected_aws_credential_says_the_aws_next_step() -> None:
    error = _refused(
        403, "ExpiredTokenException", "The security token included in the request is expired"
    )
    assert isinstance(error, ProviderAuthError)
    assert error.provider_error_type == "ExpiredTokenException"
    assert "aws sso login" in error.action
    assert "AWS_BEARER_TOKEN_BEDROCK" in error.action
    assert "OPENAI_API_KEY" not in error.action


def test_access_denied_to_a_model_names_the_iam_permission_and_model_access() -> None:
    error = _refused(
        403,
        "AccessDeniedException",
        "You don't have access to the model with the specified model ID.",
    )
    assert isinstance(error, ProviderAuthError)
    assert "bedrock:InvokeModel" in error.action
    assert "Model access" in error.action


@pytest.mark.parametrize(
    ("status", "kind", "message", "code", "retryable"),
    [
        (
            400,
            "ValidationException",
            "Input is too long for requested model.",
            "llm.context_overflow",
            False,
        ),
        (
            400,
            "ValidationException",
            "The provided model identifier is invalid.",
            "llm.model_not_found",
            False,
        ),
        (
            400,
            "ValidationException",
            "Malformed input request, please reformat your input.",
            "llm.invalid_request",
            False,
        ),
        (404, "ResourceNotFoundException", "Model not found.", "llm.model_not_found", False),
        (
            400,
            "ServiceQuotaExceededException",
            "Your request exceeds the service quota.",
            "llm.quota_exhausted",
            False,
        ),
        (
            424,
            "ModelStreamErrorException",
            "An error occurred while streaming the response.",
            "llm.server_error",
            True,
        ),
        (
            503,
            "ServiceUnavailableException",
            "Bedrock is unable to process your request.",
            "llm.server_error",
            True,
        ),
        (
            429,
            "ThrottlingException",
            "Too many requests, please wait before trying again.",
            "llm.rate_limited",
            True,
        ),
    ],
)
def test_an_aws_error_type_decides_the_typed_error(
    status: int, kind: str, message: str, code: str, retryable: bool
) -> None:
    error = _refused(status, kind, message)
    assert (error.code, error.retryable, error.provider_error_type) == (code, retryable, kind)


def test_the_aws_request_id_is_kept_for_a_support_case() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            400,
            json={"message": "Malformed input request, please reformat your input."},
            headers={
                "x-amzn-errortype": "ValidationException",
                "x-amzn-requestid": "9251f066-a420-483b-b3ae-7485084f6dc6",
            },
        )

    client, http = _client(handler, {"AWS_REGION": "us-east-1", "AWS_BEARER_TOKEN_BEDROCK": "k"})
    with http, pytest.raises(ProviderError) as caught:
        client.complete("hi")
    assert caught.value.request_id == "9251f066-a420-483b-b3ae-7485084f6dc6"
    assert caught.value.code == "llm.invalid_request"


def test_a_model_stream_error_frame_is_retryable_server_trouble() -> None:
    frame = _frame(
        {":message-type": "exception", ":exception-type": "modelStreamErrorException"},
        b'{"message":"An error occurred while streaming the response. Retry your request."}',
    )
    with pytest.raises(ProviderError) as caught:
        _streamed(STREAM[:181] + frame)
    assert (caught.value.code, caught.value.retryable) == ("llm.server_error", True)


# -- credentials from the container endpoint and the instance metadata service ----------------


class _Metadata:
    """A loopback HTTP server answering as the ECS/EKS container credentials endpoint and as
    the EC2 instance metadata service (IMDSv2: a token PUT, then the role GETs), with the
    documented JSON. Each credentials answer hands out the next access key of ``keys``."""

    def __init__(self, keys: list[str], expires_in: float) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.keys = keys
        self.expires_in = expires_in
        self.seen: list[tuple[str, str, dict[str, str]]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _send(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_PUT(self) -> None:
                outer.seen.append(("PUT", self.path, dict(self.headers.items())))
                if self.path == "/latest/api/token":
                    self._send(200, b"imds-token-1")
                else:
                    self._send(404, b"")

            def do_GET(self) -> None:
                outer.seen.append(("GET", self.path, dict(self.headers.items())))
                roles = "/latest/meta-data/iam/security-credentials/"
                if self.path == roles:
                    self._send(200, b"fluid-role")
                elif self.path in (roles + "fluid-role", "/creds"):
                    self._send(200, json.dumps(outer.next_credentials()).encode())
                else:
                    self._send(404, b"")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def next_credentials(self) -> dict[str, str]:
        from datetime import UTC, datetime, timedelta

        expiry = datetime.now(UTC) + timedelta(seconds=self.expires_in)
        return {
            "Code": "Success",
            "Type": "AWS-HMAC",
            "AccessKeyId": self.keys.pop(0),
            "SecretAccessKey": SECRET,
            "Token": "role-session-token",
            "Expiration": expiry.strftime("%Y-%m-%dT%H:%M:%SZ"),
        }

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _signed_keys(count: int) -> list[str]:
    """Send ``count`` calls through one client; the access key each was signed with."""
    seen: list[httpx.Request] = []
    client, http = _client(_answer(seen), {"AWS_REGION": "us-east-1"})
    with http:
        for _ in range(count):
            client.complete("hi")
    for request in seen:  # signed with the secret the server handed out, as AWS checks it
        assert request.headers["authorization"].endswith(
            _expected_signature(request, SECRET, "us-east-1")
        )
        assert request.headers["x-amz-security-token"] == "role-session-token"
    return [r.headers["authorization"].split("Credential=")[1].split("/")[0] for r in seen]


def test_credentials_from_the_container_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    server = _Metadata(["AKIDCONTAINER1"], expires_in=6 * 3600)
    monkeypatch.setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", server.url + "/creds")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    try:
        assert _signed_keys(2) == ["AKIDCONTAINER1", "AKIDCONTAINER1"]
    finally:
        server.close()
    assert [(m, p) for m, p, _ in server.seen] == [("GET", "/creds")]  # fetched once


def test_credentials_from_the_instance_metadata_service_with_an_imdsv2_token(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server = _Metadata(["AKIDINSTANCE1"], expires_in=6 * 3600)
    monkeypatch.delenv("AWS_EC2_METADATA_DISABLED")
    monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", server.url + "/")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    try:
        assert _signed_keys(1) == ["AKIDINSTANCE1"]
    finally:
        server.close()
    calls = [(m, p) for m, p, _ in server.seen]
    assert calls[0] == ("PUT", "/latest/api/token")
    assert ("GET", "/latest/meta-data/iam/security-credentials/fluid-role") in calls
    for method, _, headers in server.seen:
        lowered = {k.lower(): v for k, v in headers.items()}
        if method == "GET":  # IMDSv2: every read carries the session token
            assert lowered["x-aws-ec2-metadata-token"] == "imds-token-1"


def test_role_credentials_about_to_expire_are_refreshed_before_signing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Five minutes left is inside botocore's mandatory refresh window (10 min): each
    # signing fetches fresh credentials, so each call carries the next key served.
    server = _Metadata(["AKIDOLD", "AKIDNEW1", "AKIDNEW2"], expires_in=300)
    monkeypatch.setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", server.url + "/creds")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    try:
        assert _signed_keys(2) == ["AKIDNEW1", "AKIDNEW2"]
    finally:
        server.close()
    assert len(server.seen) == 3


def test_the_aws_chain_reads_the_process_environment_not_the_env_mapping(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # LLMClient(env=) gives the region, the endpoint and AWS_BEARER_TOKEN_BEDROCK; the
    # signing credentials are botocore's chain, which reads the process environment
    # (docs/llm-providers.md says so).
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDPROCESS")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    seen: list[httpx.Request] = []
    env = {"AWS_REGION": "us-east-1", "AWS_ACCESS_KEY_ID": "AKIDMAPPING"}
    client, http = _client(_answer(seen), env)
    with http:
        client.complete("hi")
    assert "Credential=AKIDPROCESS/" in seen[0].headers["authorization"]


def test_no_credentials_names_the_aws_variables_the_process_has(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDHALF")  # no secret: the chain finds nothing
    client, http = _client(_answer([]), {"AWS_REGION": "us-east-1"})
    with http, pytest.raises(ProviderAuthError) as caught:
        client.complete("hi")
    assert "AWS variables set for this process: AWS_ACCESS_KEY_ID," in str(caught.value)
    assert "AKIDHALF" not in str(caught.value)


# -- the capability matrix and prices ----------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "window", "output"),
    [
        ("anthropic.claude-sonnet-4-5-20250929-v1:0", 200_000, 64_000),
        ("us.anthropic.claude-sonnet-4-5-20250929-v1:0", 200_000, 64_000),
        ("eu.anthropic.claude-haiku-4-5-20251001-v1:0", 200_000, 64_000),
        ("global.anthropic.claude-opus-4-1-20250805-v1:0", 200_000, 32_000),
        ("apac.anthropic.claude-3-5-haiku-20241022-v1:0", 200_000, 8_192),
        (
            "arn:aws:bedrock:us-east-1:123456789012:inference-profile/"
            "us.anthropic.claude-sonnet-4-20250514-v1:0",
            200_000,
            64_000,
        ),
    ],
)
def test_claude_on_bedrock_has_its_model_cards_window_whatever_the_inference_profile(
    model: str, window: int, output: int
) -> None:
    from fluid_build.copilot.call.capabilities import capabilities_for

    row = capabilities_for("bedrock", model)
    assert (row.known, row.context_window, row.max_output_tokens) == (True, window, output)
    assert row.tools is True
    # Structured output goes through a forced tool: Bedrock does not hold it to the schema.
    assert row.strict_schema is False


def test_a_bedrock_model_not_in_the_matrix_is_unknown() -> None:
    from fluid_build.copilot.call.capabilities import capabilities_for

    assert capabilities_for("bedrock", "amazon.nova-micro-v1:0").known is False
    assert capabilities_for("bedrock", "us.meta.llama3-3-70b-instruct-v1:0").known is False


@pytest.mark.parametrize(
    ("model", "usd"),
    [
        # genai-prices' AWS Bedrock list: a regional inference profile costs 10% more.
        ("us.anthropic.claude-sonnet-4-5-20250929-v1:0", 3.30 + 16.50),
        ("global.anthropic.claude-sonnet-4-5-20250929-v1:0", 3.00 + 15.00),
        ("amazon.nova-micro-v1:0", 0.035 + 0.14),
    ],
)
def test_a_bedrock_answer_is_priced_by_its_model_id(model: str, usd: float) -> None:
    from fluid_build.copilot.call.prices import known_price, price_call
    from fluid_build.copilot.llm.types import Usage

    usage = Usage(input_tokens=1_000_000, output_tokens=1_000_000)
    assert known_price("bedrock", model)
    assert price_call("bedrock", model, usage) == pytest.approx(usd)


# -- every transport, over a real socket ---------------------------------------------------


class _Bedrock:
    """A loopback Bedrock runtime: each POST is kept (path, headers, body) and answered with
    the next of ``answers`` (content type, bytes)."""

    def __init__(self, answers: list[tuple[str, bytes]]) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.seen: list[httpx.Request] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                outer.seen.append(
                    httpx.Request(
                        "POST",
                        outer.url + self.path,
                        headers=[(k.lower(), v) for k, v in self.headers.items()],
                        content=body,
                    )
                )
                kind, data = answers.pop(0)
                self.send_response(200)
                self.send_header("content-type", kind)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _over(transport: str, url: str, call: str, **more: str) -> Any:
    """One call (``complete`` or ``stream``) to ``url`` through ``transport``, signed with
    the process's AWS credentials (or a Bedrock API key in ``more``)."""

    env = {
        **more,
        "AWS_REGION": "us-east-1",
        **transport_env(transport),
    }

    def client(**http: Any) -> LLMClient:
        return LLMClient(
            "bedrock",
            MODEL,
            base_url=url,
            envelope=clocked_envelope(FakeClock()),
            env=env,
            **http,
        )

    return call_over(transport, client, call)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_every_transport_carries_a_signed_answer_and_an_event_stream(
    transport: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    server = _Bedrock(
        [
            ("application/json", json.dumps(ANSWER).encode()),
            ("application/vnd.amazon.eventstream", STREAM),
        ]
    )
    try:
        done = _over(transport, server.url, "complete")
        events = _over(transport, server.url, "stream")
    finally:
        server.close()
    assert (done.text, done.finish_reason) == ("hi", "end_turn")
    streamed = events[-1].completion
    assert streamed.text.startswith("The capital of France is Paris.")
    assert (streamed.usage.input_tokens, streamed.usage.output_tokens) == (13, 82)
    answer, stream = server.seen
    assert answer.url.path == "/model/amazon.nova-micro-v1:0/converse"
    assert stream.url.path == "/model/amazon.nova-micro-v1:0/converse-stream"
    for request in server.seen:  # the bytes that arrived are the bytes that were signed
        assert request.headers["authorization"].endswith(
            "Signature=" + _expected_signature(request, SECRET, "us-east-1")
        )


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_an_event_stream_reset_mid_frame_is_the_same_typed_error_on_every_transport(
    transport: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.loopback import serve, sse_then

    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    key = {"AWS_BEARER_TOKEN_BEDROCK": "bedrock-api-key-1"}
    with serve(sse_then("reset", STREAM[:200])) as url, pytest.raises(ProviderError) as caught:
        _over(transport, url, "stream", **key)
    assert (caught.value.code, caught.value.retryable) == ("llm.network_error", True)
    assert "bedrock-api-key-1" not in str(caught.value)


# -- credentials from AWS IAM Identity Center (SSO) --------------------------------------------

SSO_START_URL = "https://fluid-example.awsapps.com/start"
SSO_TOKEN = "sso-access-token-from-aws-sso-login"


class _Portal:
    """A loopback HTTP server answering as the SSO portal's GetRoleCredentials
    (``GET /federation/credentials``, the token in ``x-amz-sso_bearer_token``), with the
    documented JSON; each answer hands out the next access key of ``keys``."""

    def __init__(self, keys: list[str]) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.keys = keys
        self.seen: list[tuple[str, dict[str, str]]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                headers = {k.lower(): v for k, v in self.headers.items()}
                outer.seen.append((self.path, headers))
                if headers.get("x-amz-sso_bearer_token") != SSO_TOKEN:
                    status, body = 401, {"message": "Session token not found or invalid"}
                else:
                    status, body = 200, outer.role_credentials()
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def role_credentials(self) -> dict[str, Any]:
        import time

        expiry_ms = int((time.time() + 6 * 3600) * 1000)
        return {
            "roleCredentials": {
                "accessKeyId": self.keys.pop(0),
                "secretAccessKey": SECRET,
                "sessionToken": "role-session-token",
                "expiration": expiry_ms,
            }
        }

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _sso_profile(
    home: Path,
    monkeypatch: pytest.MonkeyPatch,
    *,
    session: bool,
    expires_in_hours: float | None,
    portal_in_config: str | None = None,
) -> None:
    """Write what `aws configure sso` and `aws sso login` leave behind in ~/.aws: a profile
    ``dev`` (with an ``sso-session`` section, or the legacy ``sso_start_url`` form) and the
    cached token, named as botocore's SSOTokenLoader looks it up: the SHA-1 of the session
    name, or of the start URL when there is no session."""
    from datetime import UTC, datetime, timedelta

    aws = home / ".aws"
    (aws / "sso" / "cache").mkdir(parents=True)
    role = "sso_account_id = 123456789012\nsso_role_name = FluidBedrockUser\nregion = us-east-1\n"
    services = "services = loopback-portal\n" if portal_in_config else ""
    if session:
        config = (
            f"[profile dev]\nsso_session = fluid\n{role}{services}\n"
            f"[sso-session fluid]\nsso_start_url = {SSO_START_URL}\nsso_region = eu-west-1\n"
        )
        key = "fluid"
    else:
        config = (
            f"[profile dev]\nsso_start_url = {SSO_START_URL}\nsso_region = eu-west-1\n"
            f"{role}{services}"
        )
        key = SSO_START_URL
    if portal_in_config:
        config += f"\n[services loopback-portal]\nsso =\n  endpoint_url = {portal_in_config}\n"
    (aws / "config").write_text(config)
    if expires_in_hours is not None:  # None: `aws sso login` never ran
        expires = datetime.now(UTC) + timedelta(hours=expires_in_hours)
        token = {
            "startUrl": SSO_START_URL,
            "region": "eu-west-1",
            "accessToken": SSO_TOKEN,
            "expiresAt": expires.strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        name = hashlib.sha1(key.encode(), usedforsecurity=False).hexdigest() + ".json"
        (aws / "sso" / "cache" / name).write_text(json.dumps(token))
    monkeypatch.setenv("AWS_PROFILE", "dev")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    # botocore fixes its SSO cache directory from HOME when it is first imported; this
    # process imported it under an earlier test's HOME, a real one starts with its own.
    import botocore.credentials
    import botocore.tokens

    cache = str(aws / "sso" / "cache")
    monkeypatch.setattr(botocore.credentials.SSOProvider, "_SSO_TOKEN_CACHE_DIR", cache)
    monkeypatch.setattr(botocore.tokens.SSOTokenProvider, "_SSO_TOKEN_CACHE_DIR", cache)


@pytest.mark.parametrize("session", [True, False], ids=["sso-session", "legacy-start-url"])
@pytest.mark.parametrize("portal_from", ["environment", "config"])
def test_credentials_from_an_sso_profile_and_its_cached_login(
    aws_home: Path, monkeypatch: pytest.MonkeyPatch, session: bool, portal_from: str
) -> None:
    portal = _Portal(["AKIDSSOROLE1"])
    try:
        if portal_from == "environment":
            monkeypatch.setenv("AWS_ENDPOINT_URL_SSO", portal.url)
            _sso_profile(aws_home, monkeypatch, session=session, expires_in_hours=8)
        else:
            _sso_profile(
                aws_home,
                monkeypatch,
                session=session,
                expires_in_hours=8,
                portal_in_config=portal.url,
            )
        # Signed with the key the portal handed out, and its secret, as AWS checks it.
        assert _signed_keys(2) == ["AKIDSSOROLE1", "AKIDSSOROLE1"]
    finally:
        portal.close()
    [(path, headers)] = portal.seen  # asked once: the role credentials last six hours
    assert path.startswith("/federation/credentials?")
    assert "role_name=FluidBedrockUser" in path
    assert "account_id=123456789012" in path
    assert headers["x-amz-sso_bearer_token"] == SSO_TOKEN


@pytest.mark.parametrize("session", [True, False], ids=["sso-session", "legacy-start-url"])
@pytest.mark.parametrize("expires_in_hours", [-1, None], ids=["expired", "never-logged-in"])
def test_an_expired_sso_login_is_an_auth_error_naming_aws_sso_login_for_the_profile(
    aws_home: Path, monkeypatch: pytest.MonkeyPatch, session: bool, expires_in_hours: float | None
) -> None:
    portal = _Portal(["AKIDNEVER"])
    monkeypatch.setenv("AWS_ENDPOINT_URL_SSO", portal.url)
    _sso_profile(aws_home, monkeypatch, session=session, expires_in_hours=expires_in_hours)
    client, http = _client(_answer([]), {"AWS_REGION": "us-east-1"})
    try:
        with http, pytest.raises(ProviderAuthError) as caught:
            client.complete("hi")
    finally:
        portal.close()
    message = str(caught.value)
    assert "aws sso login --profile dev" in message
    assert "\n" not in message
    assert SSO_TOKEN not in message
    assert (caught.value.code, caught.value.retryable) == ("llm.auth", False)
    assert portal.seen == []  # an expired token is never sent


# -- the credential lookup: off the event loop, within the call's deadline (issue 32 item 9) --

TIGHT = 0.5  # the call's deadline (s): the silent endpoint is never answered within it
#: How late past it a call may end (the conformance suite's own bound is 1.5 s): a loaded
#: machine's scheduling, never a credential source's silence (seconds, unbounded before).
MARGIN = 1.0


def _silent_credentials_endpoint(monkeypatch: pytest.MonkeyPatch) -> Any:
    """A container credentials endpoint on loopback that reads each request and never
    answers (botocore waits 2 s a try, 3 tries: about 9 s of silence per lookup)."""
    from tests import hostile

    serving = hostile.serve(hostile.silent, hold=30.0)
    server = serving.__enter__()
    monkeypatch.setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", server.url + "/creds")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    return serving, server


def _lookup_of(client: LLMClient) -> Any:
    (entry,) = client._entries()
    return entry.adapter.signer.lookup  # type: ignore[attr-defined]


def _end(serving: Any, client: LLMClient) -> None:
    """Stop the silent endpoint; the abandoned lookup is refused from now on and ends by
    itself (botocore's own retries), in its daemon thread, failed: nothing ever answered."""
    serving.__exit__(None, None, None)
    assert _lookup_of(client)._future is not None


def test_a_silent_credentials_endpoint_ends_complete_within_its_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import time

    serving, server = _silent_credentials_endpoint(monkeypatch)
    seen: list[httpx.Request] = []
    client, http = _client(_answer(seen), {"AWS_REGION": "us-east-1"}, deadline=TIGHT)
    try:
        started = time.monotonic()
        with pytest.raises(ProviderError) as caught:
            client.complete("hi")
        elapsed = time.monotonic() - started
        assert server.requests  # botocore did ask the endpoint
    finally:
        http.close()
        _end(serving, client)
    assert caught.value.code == "llm.deadline_exceeded"
    assert "AWS credentials" in str(caught.value)
    assert elapsed < TIGHT + MARGIN, elapsed
    assert seen == []  # nothing was sent unsigned


def test_a_silent_credentials_endpoint_never_holds_the_event_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import asyncio
    import time

    warm_async_transport()
    serving, _ = _silent_credentials_endpoint(monkeypatch)
    ticks: list[float] = []
    client = LLMClient(
        "bedrock",
        MODEL,
        envelope=clocked_envelope(FakeClock()),
        env={"AWS_REGION": "us-east-1"},
        deadline=TIGHT,
        base_url="http://127.0.0.1:9",
    )

    async def ticker(stop: asyncio.Event) -> None:
        while not stop.is_set():
            ticks.append(time.monotonic())
            await asyncio.sleep(0.01)  # noqa: real-sleep - the loop's liveness is what is measured

    async def go() -> tuple[BaseException, float]:
        stop = asyncio.Event()
        other = asyncio.create_task(ticker(stop))
        started = time.monotonic()
        try:
            await client.acomplete("hi")
        except ProviderError as exc:
            return exc, time.monotonic() - started
        finally:
            stop.set()
            await other
            await client.aclose()
        raise AssertionError("the call was answered")

    try:
        error, elapsed = asyncio.run(go())
    finally:
        _end(serving, client)
    assert isinstance(error, ProviderError)
    assert error.code == "llm.deadline_exceeded"
    assert elapsed < TIGHT + MARGIN, elapsed
    # The loop ran on while the lookup waited: the other task ticked all along, never
    # stopped for long (a frozen loop ticks once, at the start).
    assert len(ticks) >= 5, ticks
    gaps = [b - a for a, b in itertools.pairwise(ticks)]
    assert max(gaps) < 0.4, max(gaps)


def test_calls_waiting_for_one_lookup_share_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # Two calls during one silent lookup: one request to the endpoint, not two, and no
    # thread piling up behind another.
    import threading

    before = set(threading.enumerate())
    serving, server = _silent_credentials_endpoint(monkeypatch)
    client, http = _client(_answer([]), {"AWS_REGION": "us-east-1"}, deadline=TIGHT)
    try:
        for _ in range(2):
            with pytest.raises(ProviderError) as caught:
                client.complete("hi")
            assert caught.value.code == "llm.deadline_exceeded"
        assert len(server.requests) == 1
        started = set(threading.enumerate()) - before
        lookups = [t for t in started if t.name == "fluid-aws-credentials"]
        assert len(lookups) == 1
    finally:
        http.close()
        _end(serving, client)


@pytest.mark.parametrize("mode", ["complete", "stream"])
def test_a_credential_process_that_never_ends_ends_the_call_within_its_deadline(
    mode: str, aws_home: Path
) -> None:
    # credential_process waits on a FIFO nobody writes: the program never answers while
    # the call waits. Opening the FIFO's other end at the end lets it go (EOF).
    import os
    import sys
    import threading
    import time

    fifo = aws_home / "never"
    os.mkfifo(fifo)
    (aws_home / ".aws").mkdir()
    (aws_home / ".aws" / "config").write_text(
        f'[default]\ncredential_process = {sys.executable} -c "open({str(fifo)!r}).read()"\n'
    )
    seen: list[httpx.Request] = []
    client, http = _client(_answer(seen), {"AWS_REGION": "us-east-1"}, deadline=TIGHT)
    try:
        started = time.monotonic()
        call = client.complete if mode == "complete" else lambda p: list(client.stream(p))
        with pytest.raises(ProviderError) as caught:
            call("hi")
        elapsed = time.monotonic() - started
    finally:
        http.close()
        # The writer's open returns once the program has opened its end (now or when it
        # gets there on a slow machine), and its close is the program's end of file.
        threading.Thread(target=lambda: open(fifo, "wb").close(), daemon=True).start()
    assert caught.value.code == "llm.deadline_exceeded"
    assert "AWS credentials" in str(caught.value)
    assert elapsed < TIGHT + MARGIN, elapsed
    assert seen == []


def test_a_container_endpoint_botocore_refuses_is_not_configured_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # botocore takes AWS_CONTAINER_CREDENTIALS_FULL_URI only on loopback or ECS's and EKS's
    # addresses; it says so with a ValueError, a raw exception before (issue 32 item 12).
    monkeypatch.setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", "http://creds.example/v2/x")
    client, http = _client(_answer([]), {"AWS_REGION": "us-east-1"})
    with http, pytest.raises(ProviderError) as caught:
        client.complete("hi")
    assert caught.value.code == "llm.not_configured"
    assert caught.value.details["variable"] == "AWS_CONTAINER_CREDENTIALS_FULL_URI"
    assert "creds.example" in str(caught.value)
