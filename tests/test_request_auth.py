"""Credentials are a step applied to the built request, its body encoded once (issue 36 item 4).

Bedrock's SigV4 signs the bytes and the path a request carries once the pool
has built it, so whatever the one JSON encoder (call/encode.py) makes, the
signature holds on every transport: here the encoder is swapped, and a real
loopback server recomputes each signature with botocore from what arrived
(at the same frozen time) and answers 403 when it does not match, as AWS
does. Vertex's token is the same kind of step: added to the built request,
its refresh run off the event loop first.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from fluid_build.copilot import LLMClient
from fluid_build.copilot.agents.errors import ProviderAuthError
from fluid_build.copilot.call import encode
from tests.fakes import FakeClock, aws_sandbox, clocked_envelope
from tests.loopback import Reply, Seen, base_url, http_server
from tests.test_bedrock import ANSWER, STREAM  # a Converse answer, and one as an event stream
from tests.transport_calls import TRANSPORTS, call_over, transport_env

ACCESS = "AKIDEXAMPLE"
SECRET = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
SESSION = "session-token-item-4"
REGION = "us-east-1"
#: An inference profile's ARN: its "/" is escaped in the path, its ":" are not.
MODEL = "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.amazon.nova-micro-v1:0"
NOW = datetime(2026, 11, 29, 0, 55, 0, tzinfo=UTC)
#: What the call sends beside the prompt: the temperature in ``inferenceConfig`` after
#: ``messages``, and a caller's field with keys out of order and a non-ASCII value, so that
#: every swapped encoder below makes other bytes than httpx's.
OPTIONS: Any = {"temperature": 0.5, "extra_body": {"requestMetadata": {"zeta": "é", "alpha": "1"}}}
ENCODERS = {
    "spaced": json.JSONEncoder(ensure_ascii=False, separators=(", ", ": "), allow_nan=False),
    "sorted-ascii": json.JSONEncoder(sort_keys=True, allow_nan=False),
}
#: AWS's answer to a signature that does not match.
MISMATCH: Reply = (
    403,
    {"content-type": "application/json", "x-amzn-errortype": "InvalidSignatureException"},
    b'{"message":"The request signature we calculated does not match the signature you provided."}',
)


@pytest.fixture(autouse=True)
def aws_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Static AWS credentials in the process environment, nothing else of the machine's,
    and botocore's clock frozen (the server signs again at the same instant)."""
    import botocore.auth

    aws_sandbox(monkeypatch, tmp_path, keys=(ACCESS, SECRET, SESSION))
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda: NOW.replace(tzinfo=None))


#: How far a request's time may be from the server's (AWS's rule for SigV4).
SKEW = timedelta(minutes=5)


def signature_holds(seen: Seen, url: str, now: datetime = NOW) -> bool:
    """What AWS checks: the request's time is within :data:`SKEW` of the server's (``now``:
    the frozen NOW), and the signature botocore makes with the same credentials, over the
    method, the path, the signed header fields (its time among them) and the body exactly
    as they arrived, is the one the request carries."""
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    given = seen.headers.get("authorization", "")
    stamp = seen.headers.get("x-amz-date", "")
    try:
        at = datetime.strptime(stamp, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
    except ValueError:
        return False
    if "SignedHeaders=" not in given or abs(at - now) > SKEW:
        return False
    names = given.split("SignedHeaders=")[1].split(",")[0].split(";")
    fields = {name: seen.headers[name] for name in names if name in seen.headers}
    again = AWSRequest(method="POST", url=url + seen.path, data=seen.body, headers=fields)
    again.context["timestamp"] = stamp
    signer = SigV4Auth(Credentials(ACCESS, SECRET, SESSION), "bedrock", REGION)
    canonical = signer.canonical_request(again)
    signature = signer.signature(signer.string_to_sign(again, canonical), again)
    expected = (
        f"AWS4-HMAC-SHA256 Credential={signer.scope(again)}, "
        f"SignedHeaders={';'.join(names)}, Signature={signature}"
    )
    return given == expected and seen.headers.get("x-amz-security-token") == SESSION


class AwsCheck:
    """A loopback Bedrock runtime that checks every signature: 403 on a mismatch, else the
    JSON answer or the event stream the path asks for."""

    def __init__(self) -> None:
        self.url = ""
        self.seen: list[Seen] = []
        self.refused: list[Seen] = []

    def __call__(self, seen: Seen) -> Reply:
        self.seen.append(seen)
        if not signature_holds(seen, self.url):
            self.refused.append(seen)
            return MISMATCH
        if seen.path.endswith("/converse-stream"):
            return 200, {"content-type": "application/vnd.amazon.eventstream"}, STREAM
        return 200, {"content-type": "application/json"}, json.dumps(ANSWER).encode()


@pytest.fixture
def aws() -> Iterator[AwsCheck]:
    check = AwsCheck()
    with http_server(check) as server:
        check.url = base_url(server)
        yield check


def _bedrock(url: str, transport: str) -> Any:
    def client(**http: Any) -> LLMClient:
        return LLMClient(
            "bedrock",
            MODEL,
            base_url=url,
            envelope=clocked_envelope(FakeClock()),
            env={"AWS_REGION": REGION, **transport_env(transport)},
            options=OPTIONS,
            **http,
        )

    return client


# -- the server's check can fail ---------------------------------------------------------


def test_the_servers_check_refuses_a_changed_body_path_header_or_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A signature made now holds; one byte of the body, the path's escaping, a signed
    header's value or its time changed, and it does not; nor one made 6 minutes off."""
    import botocore.auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    url, path, body = "http://127.0.0.1:9", "/model/a%2Fb:0/converse", b'{"a":1}'
    fields = {"content-type": "application/json", "accept": "application/json"}
    signed = AWSRequest(method="POST", url=url + path, data=body, headers=dict(fields))
    botocore.auth.SigV4Auth(Credentials(ACCESS, SECRET, SESSION), "bedrock", REGION).add_auth(
        signed
    )
    headers = {k.lower(): str(v) for k, v in signed.headers.items()}
    assert signature_holds(Seen(0.0, path, headers, body), url)
    assert not signature_holds(Seen(0.0, path, headers, b'{"a": 1}'), url)
    assert not signature_holds(Seen(0.0, "/model/a/b:0/converse", headers, body), url)
    assert not signature_holds(Seen(0.0, path, {**headers, "accept": "*/*"}, body), url)
    moved = {**headers, "x-amz-date": "20261129T005501Z"}
    assert not signature_holds(Seen(0.0, path, moved, body), url)
    later = NOW.replace(tzinfo=None) + timedelta(minutes=6)
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda: later)
    late = AWSRequest(method="POST", url=url + path, data=body, headers=dict(fields))
    botocore.auth.SigV4Auth(Credentials(ACCESS, SECRET, SESSION), "bedrock", REGION).add_auth(late)
    late_headers = {k.lower(): str(v) for k, v in late.headers.items()}
    assert not signature_holds(Seen(0.0, path, late_headers, body), url)


# -- a swapped encoder, every transport ----------------------------------------------------


@pytest.mark.parametrize("encoder", sorted(ENCODERS))
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_swapped_json_encoder_still_gets_valid_sigv4_on_every_transport(
    transport: str,
    encoder: str,
    aws: AwsCheck,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The body is encoded once, by call/encode.py, and signed as encoded: an encoder
    other than httpx's reaches the wire on every pool, and AWS's check still holds. No
    log record, down to botocore's DEBUG canonical request, shows a secret."""
    import logging

    caplog.set_level(logging.DEBUG)
    swapped = ENCODERS[encoder]
    monkeypatch.setattr(encode, "ENCODER", swapped)
    client = _bedrock(aws.url, transport)
    done = call_over(transport, client, "complete")
    events = call_over(transport, client, "stream")
    assert aws.refused == []
    assert done.text == "hi"
    assert events[-1].completion.text.startswith("The capital of France is Paris.")
    answer, stream = aws.seen
    escaped = "arn:aws:bedrock:us-east-1:123456789012:inference-profile%2Fus.amazon.nova-micro-v1:0"
    assert answer.path == f"/model/{escaped}/converse"
    assert stream.path == f"/model/{escaped}/converse-stream"
    for seen in aws.seen:
        body = json.loads(seen.body)
        # The swapped encoder's bytes arrived (not httpx's), and they are what was signed.
        assert seen.body == swapped.encode(body).encode()
        assert seen.body != json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
        assert body["inferenceConfig"]["temperature"] == 0.5
        assert body["requestMetadata"] == {"zeta": "é", "alpha": "1"}
        assert seen.headers["x-amz-security-token"] == SESSION
        assert seen.headers["x-amz-date"] == "20261129T005500Z"
        signature = seen.headers["authorization"].rsplit("Signature=", 1)[1]
        assert signature not in caplog.text
    assert "CanonicalRequest" in caplog.text  # botocore's DEBUG records were there to see
    assert SESSION not in caplog.text
    assert SECRET not in caplog.text


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_request_changed_after_signing_is_refused_by_the_server(
    transport: str, aws: AwsCheck, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server's check is live on each transport: a request changed once signed (its
    time, one second on) gets AWS's 403, an auth error that carries no credential."""
    from fluid_build.copilot.llm import bedrock

    signer_auth = bedrock._Signer.auth

    def then_changed(self: Any, request: httpx.Request) -> httpx.Request:
        signed = signer_auth(self, request)
        request.headers["x-amz-date"] = "20261129T005501Z"  # one second off what was signed
        return signed

    monkeypatch.setattr(bedrock._Signer, "auth", then_changed)
    with pytest.raises(ProviderAuthError) as caught:
        call_over(transport, _bedrock(aws.url, transport), "complete")
    assert len(aws.refused) == len(aws.seen) == 1
    assert caught.value.status_code == 403
    text = repr(caught.value) + str(caught.value) + json.dumps(caught.value.to_dict())
    assert SECRET not in text
    assert SESSION not in text


def test_a_request_that_waited_for_a_rate_limit_is_signed_when_it_goes_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The credential step runs on the request as it leaves: one held 4 minutes by a spent
    rate-limit budget is signed again after the wait, its time the time it is sent (AWS
    takes a signature for 5 minutes: a longer hold would be refused)."""
    import botocore.auth

    clock = FakeClock()

    def now() -> datetime:
        return datetime.fromtimestamp(clock.now, UTC)

    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda: now().replace(tzinfo=None))
    spent = {  # the last request of a window that opens again in 4 minutes
        "x-ratelimit-limit-requests": "2",
        "x-ratelimit-remaining-requests": "0",
        "x-ratelimit-reset-requests": "4m0s",
    }
    refused: list[str] = []
    signed_at: list[tuple[str, str]] = []

    def aws(request: httpx.Request) -> httpx.Response:
        seen = Seen(0.0, request.url.raw_path.decode(), dict(request.headers), request.content)
        signed_at.append((seen.headers["x-amz-date"], now().strftime("%Y%m%dT%H%M%SZ")))
        if not signature_holds(seen, "http://127.0.0.1:9", now()):
            refused.append(seen.headers["x-amz-date"])
            return httpx.Response(MISMATCH[0], headers=MISMATCH[1], content=MISMATCH[2])
        return httpx.Response(200, json=ANSWER, headers=spent)

    envelope = clocked_envelope(clock, limited=True)
    with httpx.Client(transport=httpx.MockTransport(aws)) as http:
        client = LLMClient(
            "bedrock",
            MODEL,
            base_url="http://127.0.0.1:9",
            envelope=envelope,
            env={"AWS_REGION": REGION},
            http_client=http,
        )
        assert [client.complete("hi").text for _ in range(2)] == ["hi", "hi"]
    assert clock.waits == [pytest.approx(240.0)]
    assert refused == []
    assert len(signed_at) == 2
    assert [stamp for stamp, _ in signed_at] == [arrived for _, arrived in signed_at]


def test_the_adapter_leaves_signing_to_its_credential_step() -> None:
    """``adapter.request()`` builds method, URL, headers and body, and names its step;
    nothing is signed before the body is encoded."""
    from fluid_build.copilot.llm.types import CallSpec

    client = LLMClient("bedrock", MODEL, env={"AWS_REGION": REGION})
    (entry,) = client._entries()
    wire = entry.adapter.request(CallSpec(model=MODEL, messages=[{"role": "user"}]), stream=False)
    assert wire.auth is entry.adapter.credential is not None
    assert not {"authorization", "x-amz-date", "x-amz-security-token"} & set(wire.headers)


def test_no_adapter_is_asked_for_a_pending_refresh_by_name() -> None:
    """The credential step is declared (``Adapter.credential``, ``Request.auth``, typed):
    no ``pending_refresh`` is looked up or defined anywhere in src/."""
    src = Path(__file__).resolve().parents[1] / "src"
    found = [
        str(path.relative_to(src))
        for path in sorted(src.rglob("*.py"))
        if "pending_refresh" in path.read_text(encoding="utf-8")
    ]
    assert found == []


# -- Vertex's token: the same kind of step ---------------------------------------------------


class _Credentials:
    """google-auth's credentials as TokenSource uses them: each refresh hands out the next
    token, valid for an hour, and says in which thread it ran."""

    def __init__(self) -> None:
        self.token: str | None = None
        self.expiry: datetime | None = None
        self.threads: list[tuple[str, bool]] = []

    def refresh(self, request: Any) -> None:
        import asyncio

        try:
            asyncio.get_running_loop()
            on_loop = True
        except RuntimeError:
            on_loop = False
        self.threads.append((threading.current_thread().name, on_loop))
        self.token = f"ya29.step-{len(self.threads)}"
        self.expiry = _utcnow() + timedelta(hours=1)


def _utcnow() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)  # google-auth's expiry is naive UTC


GEMINI_ANSWER = {
    "candidates": [
        {"content": {"role": "model", "parts": [{"text": "hi"}]}, "finishReason": "STOP"}
    ],
    "usageMetadata": {"promptTokenCount": 2, "candidatesTokenCount": 1},
}


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_vertex_adds_its_token_to_the_encoded_request_refreshed_off_the_event_loop(
    transport: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The token step gets the request with its body's bytes final (a swapped encoder's)
    and adds ``Authorization`` last; an expired token was refreshed before the step, in
    the lookup's thread, never on a call's thread or event loop."""
    from fluid_build.copilot.llm import vertex

    for name in ("GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_CLOUD_PROJECT", "GCLOUD_PROJECT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))
    swapped = ENCODERS["spaced"]
    monkeypatch.setattr(encode, "ENCODER", swapped)
    credentials = _Credentials()
    at_step: list[bytes] = []
    stale_at_step: list[bool] = []
    token_auth = vertex.TokenSource.auth

    def watched(self: Any, request: httpx.Request) -> httpx.Request:
        at_step.append(request.content)
        stale_at_step.append(self.stale())  # True: the step itself would wait on Google
        return token_auth(self, request)

    monkeypatch.setattr(vertex.TokenSource, "auth", watched)

    def reply(seen: Seen) -> Reply:
        if seen.path.endswith("alt=sse"):
            data = b"data: " + json.dumps(GEMINI_ANSWER).encode() + b"\n\n"
            return 200, {"content-type": "text/event-stream"}, data
        return 200, {"content-type": "application/json"}, json.dumps(GEMINI_ANSWER).encode()

    with http_server(reply) as server:

        def client(**http: Any) -> LLMClient:
            made = LLMClient(
                "vertex",
                "gemini-2.5-flash",
                base_url=base_url(server),
                envelope=clocked_envelope(FakeClock()),
                env={"GOOGLE_CLOUD_PROJECT": "my-project", **transport_env(transport)},
                **http,
            )
            (entry,) = made._entries()
            entry.adapter.tokens._credentials = credentials  # type: ignore[attr-defined]
            credentials.expiry = _utcnow() - timedelta(minutes=1)  # expired: refreshed first
            return made

        done = call_over(transport, client, "complete")
        events = call_over(transport, client, "stream")
        seen = list(server.seen)
    assert done.text == "hi"
    assert events[-1].type == "done"
    assert [s.headers["authorization"] for s in seen] == [
        "Bearer ya29.step-1",
        "Bearer ya29.step-2",
    ]
    assert at_step == [s.body for s in seen]  # the step saw the bytes that were sent
    for body in at_step:
        assert body == swapped.encode(json.loads(body)).encode()
    # Each refresh ran before the step, in the lookup's thread, off every event loop.
    assert stale_at_step == [False, False]
    assert credentials.threads == [("fluid-google-token", False)] * 2


def test_a_callers_authorization_header_is_sent_instead_of_the_token() -> None:
    """The caller's word is last, as before: an ``extra_headers`` Authorization is sent and
    the request carries no token step (none is fetched for it)."""
    from fluid_build.copilot.llm import vertex
    from fluid_build.copilot.llm.base import ProviderConfig
    from fluid_build.copilot.llm.types import CallSpec

    config = ProviderConfig("vertex", "gemini-2.5-flash", None, "http://127.0.0.1:9/v1/p")
    adapter = vertex.VertexAdapter(config, tokens=vertex.TokenSource(_Credentials()))
    spec = CallSpec(model="gemini-2.5-flash", messages=[{"role": "user", "content": "hi"}])
    assert adapter.request(spec, stream=False).auth is adapter.tokens
    own = CallSpec(
        model="gemini-2.5-flash",
        messages=[{"role": "user", "content": "hi"}],
        extra_headers={"Authorization": "Bearer ya29.callers"},
    )
    wire = adapter.request(own, stream=False)
    assert wire.auth is None
    assert wire.headers["Authorization"] == "Bearer ya29.callers"
