"""The transport conformance suite: one scenario list, run on every transport (issue 21).

Each scenario (tests/hostile.py ``SCENARIOS``) is one way a server, a proxy, a
certificate or the caller's own code can behave; every transport must give
the same outcome for it: the same code and retryable flag, the same number
of requests sent, within the deadline plus 1.5 s, with RSS growth under
256 MB, and with the API key nowhere in the error, anything chained to it,
or the log records written at DEBUG.

The transports: ``sync-direct`` (fluid's own sync pool), ``async-httpx`` and
``async-aiohttp`` (``FLUID_LLM_TRANSPORT``), ``caller-sync`` and
``caller-async`` (a caller's own ``httpx.Client`` / ``httpx.AsyncClient``),
and for the redirect scenarios the caller's pools with
``follow_redirects=True``. One transport: ``pytest tests/test_conformance.py
-k async-aiohttp``; one scenario on all: ``-k drip-head``.
``python benchmarks/conformance_table.py`` prints the whole matrix. The
``phase-*`` scenarios hold each phase limit (connect, first token, idle) at
0.2 s on every transport (issue 33 item 2): ``-k phase``.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest

from fluid_build.copilot import LLMClient
from fluid_build.copilot.agents.errors import AgentExecutionError
from tests import hostile

CASES = [
    pytest.param(scenario, transport, id=f"{scenario.name}-{transport}")
    for scenario, transport in hostile.cases()
]


@pytest.fixture(autouse=True, scope="module")
def _frozen_heap() -> Iterator[None]:
    """What lived before this module is frozen while it runs, so the collections each
    scenario makes (hostile.run, and the one after each test) walk only what this module
    made: late in a run a worker's whole heap takes 0.3 s to walk, twice per scenario."""
    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()


@pytest.mark.parametrize(("scenario", "transport"), CASES)
def test_every_transport_keeps_the_contract(
    scenario: hostile.Scenario, transport: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.DEBUG, logger="fluid_build")
    result: hostile.Outcome | None = None
    try:
        result = hostile.run(scenario, transport)
        logs = [caplog.text, *(repr(record.args) for record in caplog.records)]
        found = hostile.problems(scenario, result, logs)
        summary = (
            f"{scenario.name} ({scenario.about}) on {transport}: "
            f"{result.code}, retryable={result.retryable}, requests={result.requests}, "
            f"{result.elapsed:.2f} s, RSS +{result.rss_mb:.0f} MB\n  - " + "\n  - ".join(found)
        )
    finally:
        # Nothing of the call outlives the test (pytest keeps a failed test's traceback),
        # so a pool left open warns when collected here, in the scenario that left it.
        result = None
        caplog.clear()
        gc.collect()
    if found:
        pytest.fail(summary, pytrace=False)


# -- the scan itself: it must find what it is for ----------------------------------------


def test_the_secret_scan_finds_a_key_in_a_chained_requests_headers() -> None:
    import httpx

    request = httpx.Request("POST", "http://x.invalid/", headers={"x-api-key": hostile.KEY})
    try:
        try:
            raise httpx.ReadError("cut", request=request)
        except httpx.ReadError as exc:
            raise RuntimeError("a wrapper that says nothing") from exc
    except RuntimeError as error:
        leaks = hostile.secret_leaks(error)
    assert any(".request" in where or "._request" in where for where in leaks), leaks
    assert hostile.secret_leaks(RuntimeError("nothing here")) == []
    assert hostile.secret_leaks(None, [f"DEBUG sent Bearer {hostile.KEY}"])


def test_the_secret_scan_finds_a_key_in_aiohttps_request_info() -> None:
    import aiohttp
    from multidict import CIMultiDict, CIMultiDictProxy
    from yarl import URL

    headers = CIMultiDictProxy(CIMultiDict({"Authorization": f"Bearer {hostile.KEY}"}))
    info = aiohttp.RequestInfo(URL("http://x.invalid/"), "POST", headers, URL("http://x.invalid/"))
    error = aiohttp.ClientResponseError(info, (), status=400, message="bad status line")
    outer = ValueError("wrapped")
    outer.__cause__ = error
    assert hostile.secret_leaks(outer)


# -- cloud credentials: no secret in any error or any logger's DEBUG records (issue 32) ----------

AWS_KEY_ID = "AKIDCONFORMANCEKEY01"
AWS_SECRET = "conformance/AWS+secret/access-key-0123456789"
AWS_SESSION = "IQoJconformance-session-token/+0123456789abcdefghij=="
BEDROCK_MODEL = "amazon.nova-micro-v1:0"
CONVERSE_ANSWER = json.dumps(
    {
        "output": {"message": {"role": "assistant", "content": [{"text": "ok"}]}},
        "stopReason": "end_turn",
        "usage": {"inputTokens": 3, "outputTokens": 1},
    }
).encode()


def _echo_denied(conn: hostile.Conn, request: hostile.Request) -> bool:
    """AWS's 403 for a bad signature, echoing the request's credential headers (as some
    gateways and proxies do in their error pages)."""
    body = json.dumps(
        {
            "message": "The request signature we calculated does not match the signature you "
            f"provided. Authorization: {request.header('authorization')}; security token "
            f"{request.header('x-amz-security-token')}",
        }
    ).encode()
    return hostile.respond(403, body, (*hostile.JSON, ("x-amzn-errortype", "AccessDenied")))(
        conn, request
    )


def _sent_secrets(requests: list[hostile.Request]) -> tuple[str, ...]:
    """Each SigV4 signature the server received: computed per request, secret all the same."""
    found = []
    for request in requests:
        auth = request.header("authorization") or ""
        found.append(auth.rpartition("Signature=")[2])
    return tuple(s for s in found if s)


def _bedrock_call(transport: str, url: str) -> Any:
    from fluid_build.copilot.call.envelope import RetryEnvelope
    from fluid_build.copilot.call.transport import TRANSPORT_ENV

    async def asleep(seconds: float) -> None:
        return None

    env = {"AWS_REGION": "us-east-1"}
    if transport != "sync-direct":
        env[TRANSPORT_ENV] = "aiohttp" if transport == "async-aiohttp" else "httpx"
    envelope = RetryEnvelope(hostile.POLICY, cooldown=None, sleep=lambda s: None, asleep=asleep)
    client = LLMClient(
        "bedrock", BEDROCK_MODEL, base_url=url, env=env, envelope=envelope, deadline=5.0
    )
    try:
        if transport == "sync-direct":
            return client.complete(hostile.PROMPT)

        async def call() -> Any:
            try:
                return await client.acomplete(hostile.PROMPT)
            finally:
                await client.aclose()

        return asyncio.run(call())
    finally:
        client.close()


SIGV4_TRANSPORTS = ("sync-direct", "async-httpx", "async-aiohttp")


@pytest.mark.parametrize("answer", ["ok", "denied-echoing-the-signature"])
@pytest.mark.parametrize("transport", SIGV4_TRANSPORTS)
def test_a_sigv4_call_with_a_session_token_shows_no_secret_in_any_debug_log(
    transport: str, answer: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Root at DEBUG, every logger propagating to it: botocore.auth writes the canonical
    # request (with x-amz-security-token) and the signature there, urllib3 and httpx the
    # exchanges. None of the credential's parts may show, nor in the error.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", AWS_KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", AWS_SECRET)
    monkeypatch.setenv("AWS_SESSION_TOKEN", AWS_SESSION)
    handler = hostile.respond(200, CONVERSE_ANSWER) if answer == "ok" else _echo_denied
    with hostile.serve(handler) as server:
        measured = hostile.measure(lambda: _bedrock_call(transport, server.url))
        requests = list(server.requests)
    assert requests, "no request reached the server"
    assert any("botocore.auth" in line for line in measured.logs)  # the scan saw its records
    if answer == "ok":
        assert measured.error is None, measured.error
    else:
        assert isinstance(measured.error, AgentExecutionError), measured.error
        assert measured.error.code == "llm.auth"
    secrets = (AWS_KEY_ID, AWS_SECRET, AWS_SESSION, *_sent_secrets(requests))
    leaks = hostile.secret_leaks(measured.error, measured.logs, secrets)
    assert leaks == [], leaks


VERTEX_TOKEN = "ya29.conformance-ACCESS-TOKEN-0123456789"
GEMINI_ANSWER = json.dumps(
    {
        "candidates": [
            {"content": {"role": "model", "parts": [{"text": "ok"}]}, "finishReason": "STOP"}
        ],
        "usageMetadata": {"promptTokenCount": 3, "candidatesTokenCount": 1, "totalTokenCount": 4},
    }
).encode()


def _echo_unauthenticated(conn: hostile.Conn, request: hostile.Request) -> bool:
    body = json.dumps(
        {
            "error": {
                "code": 401,
                "status": "UNAUTHENTICATED",
                # The bare token, as some gateways quote it: no "Bearer" before it.
                "message": "Request had invalid authentication credentials: "
                f"{(request.header('authorization') or '').rpartition(' ')[2]} expired",
            }
        }
    ).encode()
    return hostile.respond(401, body)(conn, request)


def _key_file(path: Any, token_uri: str) -> Any:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    info = {
        "type": "service_account",
        "project_id": "conformance-project",
        "private_key_id": "conformance-key-id",
        "private_key": pem,
        "client_email": "sa@conformance-project.iam.gserviceaccount.com",
        "client_id": "1",
        "token_uri": token_uri,
    }
    path.write_text(json.dumps(info))
    return path, pem


@pytest.mark.parametrize("answer", ["ok", "unauthenticated-echoing-the-token"])
@pytest.mark.parametrize("transport", SIGV4_TRANSPORTS)
def test_a_vertex_call_with_an_adc_token_shows_no_secret_in_any_debug_log(
    transport: str, answer: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    from fluid_build.copilot.call.envelope import RetryEnvelope
    from fluid_build.copilot.call.transport import TRANSPORT_ENV

    token = json.dumps({"access_token": VERTEX_TOKEN, "expires_in": 3600}).encode()
    model = hostile.respond(200, GEMINI_ANSWER) if answer == "ok" else _echo_unauthenticated
    with hostile.serve(hostile.respond(200, token)) as tokens, hostile.serve(model) as server:
        key, pem = _key_file(tmp_path / "key.json", f"{tokens.url}/token")
        monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(key))
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        env = {} if transport == "sync-direct" else {TRANSPORT_ENV: transport.split("-")[1]}

        async def asleep(seconds: float) -> None:
            return None

        envelope = RetryEnvelope(hostile.POLICY, cooldown=None, sleep=lambda s: None, asleep=asleep)

        def call() -> Any:
            client = LLMClient("vertex", base_url=server.url, env=env, envelope=envelope)
            try:
                if transport == "sync-direct":
                    return client.complete(hostile.PROMPT)

                async def acall() -> Any:
                    try:
                        return await client.acomplete(hostile.PROMPT)
                    finally:
                        await client.aclose()

                return asyncio.run(acall())
            finally:
                client.close()

        measured = hostile.measure(call)
        sent = [r.body.decode() for r in tokens.requests]  # the signed assertion (a JWT)
    assert sent, "the token endpoint was never asked"
    assert server.requests, "no request reached the model's server"
    if answer == "ok":
        assert measured.error is None, measured.error
    else:
        assert isinstance(measured.error, AgentExecutionError), measured.error
        assert measured.error.code == "llm.auth"
    pem_body = "".join(pem.splitlines()[1:-1])[:64]
    secrets = (VERTEX_TOKEN, pem_body, *(s.rpartition("assertion=")[2] for s in sent))
    leaks = hostile.secret_leaks(measured.error, measured.logs, secrets)
    assert leaks == [], leaks
