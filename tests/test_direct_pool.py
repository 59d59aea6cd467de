"""The pools LLMClient makes send straight to the transport; a caller's pool keeps httpx's path.

call/transport/clients.py ``PooledClient``/``PooledAsyncClient`` skip ``Client.send``'s
auth flow, redirect loop, cookie jar and hooks (none of which a pool of ours
has) but must stay what httpx would send: the same request, the proxy from
the environment, the same errors.
"""

from __future__ import annotations

import asyncio
import json
import pickle
from typing import Any

import httpx
import pytest

from fluid_build.copilot import LLMClient
from fluid_build.copilot.agents.errors import ProviderError
from fluid_build.copilot.call.envelope import RetryEnvelope
from fluid_build.copilot.call.transport import (
    PooledAsyncClient,
    PooledClient,
    build_client,
    pool_limits,
)
from tests import loopback
from tests.test_transport import ANSWER

PAYLOAD = {"model": "m", "messages": [{"role": "user", "content": "h\u00e9llo \u2603"}], "n": 1}
URL = "https://api.example.test/v1/chat/completions"


def vllm(base_url: str, **kwargs: Any) -> LLMClient:
    """A client on ``base_url`` with no store, no real sleeps and no environment."""
    return LLMClient(
        "vllm",
        "m",
        base_url=base_url,
        envelope=RetryEnvelope(cooldown=None, sleep=lambda s: None, hook=lambda e: None),
        capability_matrix={"context_window": 32_768},
        env={},
        **kwargs,
    )


def test_a_direct_request_is_the_one_build_request_makes() -> None:
    pool = PooledClient(timeout=httpx.Timeout(30.0), limits=pool_limits())
    plain = httpx.Client()
    headers = {"Authorization": "Bearer sk-test", "x-extra": "1"}
    direct = pool.fluid_json_request("POST", URL, headers, PAYLOAD, 12.5)
    built = plain.build_request(
        "POST",
        URL,
        headers={**headers, "accept-encoding": "gzip, deflate"},
        json=PAYLOAD,
        timeout=12.5,
    )
    assert direct.method == built.method
    assert direct.url == built.url
    assert sorted(direct.headers.multi_items()) == sorted(built.headers.multi_items())
    assert direct.read() == built.read()
    assert direct.extensions["timeout"] == built.extensions["timeout"]
    # the parsed URL is kept, not parsed again
    pool.fluid_json_request("POST", URL, headers, PAYLOAD, 1.0)
    assert list(pool._fluid_urls) == [URL]
    pool.close()
    plain.close()


@pytest.mark.parametrize(
    ("url", "headers"),
    [
        (URL, {"Authorization": "Bearer sk-test"}),
        ("http://127.0.0.1:8080/v1/x?a=1", {"x-extra": "1"}),
        ("http://[::1]:9/v1/x", {}),
        (URL, {"Host": "signed.example.test", "x-amz-date": "20260101T000000Z"}),
    ],
)
def test_a_direct_request_has_the_headers_content_gives_in_the_same_order(
    url: str, headers: dict[str, str]
) -> None:
    pool = PooledClient(timeout=httpx.Timeout(30.0), limits=pool_limits())
    direct = pool.fluid_json_request("POST", url, headers, PAYLOAD, 12.5)
    merged = {**pool._fluid_defaults, **{k.lower(): v for k, v in headers.items()}}
    public = httpx.Request("POST", url, headers=merged, content=direct.content)
    assert [(k.lower(), v) for k, v in direct.headers.raw] == [
        (k.lower(), v) for k, v in public.headers.raw
    ]
    assert direct.content == public.content
    assert list(direct.stream) == [direct.content]  # type: ignore[arg-type]
    pool.close()


def test_a_payload_json_cannot_carry_is_refused_as_httpx_refuses_it() -> None:
    pool = PooledClient()
    with pytest.raises(ValueError, match="JSON compliant"):
        pool.fluid_json_request("POST", URL, {}, {"x": float("nan")}, 1.0)
    pool.close()


def test_the_proxy_from_the_environment_carries_our_pools_requests(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with loopback.http_server(
        lambda seen: (200, {"content-type": "application/json"}, ANSWER)
    ) as proxy:
        for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy", "http_proxy"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("HTTP_PROXY", loopback.base_url(proxy))
        client = vllm("http://provider.invalid/v1")
        assert isinstance(client._client(), PooledClient)
        assert client.complete("hi").text == "Hi"

        async def once() -> str:
            try:
                return (await client.acomplete("hi")).text
            finally:
                await client.aclose()

        assert asyncio.run(once()) == "Hi"
        # Both went through the proxy, in the absolute form a proxy is asked in.
        assert [seen.path for seen in proxy.seen] == [
            "http://provider.invalid/v1/chat/completions"
        ] * 2


def test_a_closed_pool_refuses_as_httpx_does() -> None:
    pool = build_client(5.0, "vllm")
    request = pool.fluid_json_request("POST", URL, {}, PAYLOAD, 1.0)
    pool.close()
    with pytest.raises(RuntimeError, match="client has been closed"):
        pool.fluid_send(request)

    async def closed_async() -> None:
        apool = PooledAsyncClient()
        await apool.aclose()
        with pytest.raises(RuntimeError, match="client has been closed"):
            await apool.fluid_send(request)

    asyncio.run(closed_async())


def test_a_refused_connection_carries_its_request_and_is_typed() -> None:
    port = loopback.closed_port()
    pool = build_client(5.0, "vllm")
    request = pool.fluid_json_request(
        "POST", f"http://127.0.0.1:{port}/v1/chat/completions", {}, PAYLOAD, 1.0
    )
    with pytest.raises(httpx.ConnectError) as raised:
        pool.fluid_send(request)
    assert raised.value.request is request
    pool.close()
    client = vllm(f"http://127.0.0.1:{port}/v1")
    with pytest.raises(ProviderError) as failed:
        client.complete("hi")
    assert failed.value.code == "llm.network_error"
    client.close()


def test_a_callers_own_pool_keeps_its_hooks_and_auth() -> None:
    seen_by_hook: list[str] = []
    with loopback.http_server(
        lambda seen: (200, {"content-type": "application/json"}, ANSWER)
    ) as server:
        own = httpx.Client(
            event_hooks={"request": [lambda request: seen_by_hook.append(str(request.url))]},
            headers={"x-team": "blue"},
        )
        client = vllm(f"{loopback.base_url(server)}/v1", http_client=own)
        assert client.complete("hi").text == "Hi"
        client.close()
        own.close()
        assert seen_by_hook == [f"{loopback.base_url(server)}/v1/chat/completions"]
        assert server.seen[0].headers["x-team"] == "blue"


def test_a_json_requests_headers_are_made_when_asked_and_then_sent_as_changed() -> None:
    """The aiohttp transport sends a direct request's header fields as they are; once its
    ``headers`` are read they may change, and what is sent is then what they say."""
    with loopback.http_server(
        lambda seen: (200, {"content-type": "application/json"}, ANSWER)
    ) as server:
        url = f"{loopback.base_url(server)}/v1/chat/completions"

        async def both() -> None:
            pool = PooledAsyncClient(transport_name="aiohttp")
            try:
                untouched = pool.fluid_json_request("POST", url, {"x-a": "1"}, PAYLOAD, 5.0)
                assert untouched.fluid_fields is not None  # type: ignore[attr-defined]
                await (await pool.fluid_send(untouched)).aclose()
                changed = pool.fluid_json_request("POST", url, {"x-a": "1"}, PAYLOAD, 5.0)
                assert changed.headers["x-a"] == "1"  # made now: the fields are forgotten
                assert changed.fluid_fields is None  # type: ignore[attr-defined]
                changed.headers["x-a"] = "2"
                changed.headers["x-b"] = "3"
                await (await pool.fluid_send(changed)).aclose()
                replaced = pool.fluid_json_request("POST", url, {"x-a": "1"}, PAYLOAD, 5.0)
                replaced.headers = {**replaced.headers, "x-a": "4"}  # type: ignore[assignment]
                await (await pool.fluid_send(replaced)).aclose()
                moved = pool.fluid_json_request("POST", url, {"x-a": "1"}, PAYLOAD, 5.0)
                moved.url = httpx.URL(url.replace("/chat/", "/other/"))
                await (await pool.fluid_send(moved)).aclose()
            finally:
                await pool.aclose()

        asyncio.run(both())
        first, second, third, _ = server.seen
        assert [seen.path for seen in server.seen] == ["/v1/chat/completions"] * 3 + [
            "/v1/other/completions"
        ]
        assert first.headers["x-a"] == "1"
        assert "x-b" not in first.headers
        assert (second.headers["x-a"], second.headers["x-b"]) == ("2", "3")
        assert third.headers["x-a"] == "4"
        plain = PooledClient()
        length = str(len(plain.fluid_json_request("POST", url, {}, PAYLOAD, 1).content))
        plain.close()
        for seen in server.seen:  # the body's length, as httpx would send it
            assert seen.headers["content-length"] == length
            assert seen.headers["content-type"] == "application/json"


def test_a_json_request_is_an_httpx_request_in_every_public_way() -> None:
    pool = PooledClient(timeout=httpx.Timeout(30.0), limits=pool_limits())
    request = pool.fluid_json_request("post", URL, {"Authorization": "Bearer sk-test"}, PAYLOAD, 2)
    assert isinstance(request, httpx.Request)
    assert request.method == "POST"
    assert request.content == request.read() == b"".join(request.stream)  # type: ignore[arg-type]
    assert asyncio.run(request.aread()) == request.content
    assert (
        request.content == json.dumps(PAYLOAD, ensure_ascii=False, separators=(",", ":")).encode()
    )
    assert "sk-test" not in repr(request)
    assert request.headers["host"] == "api.example.test"
    assert request.url == httpx.URL(URL)
    assert request.fluid_url == str(request.url)  # type: ignore[attr-defined]
    request.url = httpx.URL("https://other.example.test/v1/x")
    assert request.fluid_url is None  # type: ignore[attr-defined]
    assert request.url.host == "other.example.test"
    # pickled as httpx pickles a request: the body kept, the stream no longer readable
    copy = pickle.loads(pickle.dumps(request))  # noqa: S301 - our own object
    assert (copy.method, copy.url, copy.content) == (request.method, request.url, request.content)
    assert copy.headers["host"] == "api.example.test"
    with pytest.raises(httpx.StreamClosed):
        b"".join(copy.stream)  # type: ignore[arg-type]
    pool.close()


# -- loops made and closed by hand (issue 32 item 14) ---------------------------------------


def _by_hand(client: LLMClient, loops: int) -> list[str]:
    """``loop = new_event_loop(); loop.run_until_complete(acomplete()); loop.close()``."""
    texts = []
    for _ in range(loops):
        loop = asyncio.new_event_loop()
        try:
            texts.append(loop.run_until_complete(client.acomplete("hi")).text)
        finally:
            loop.close()
    return texts


@pytest.mark.parametrize("transport", ["aiohttp", "httpx"])
def test_a_pool_whose_loop_is_closed_by_hand_is_closed_with_it_silently(
    transport: str, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    import gc
    import sys
    import warnings

    from tests import hostile

    reported: list[str] = []
    hook = sys.unraisablehook
    sys.unraisablehook = lambda report: reported.append(f"{report.exc_value!r}")
    try:
        with (
            hostile.serve(hostile.ok) as server,
            warnings.catch_warnings(record=True) as caught,
        ):
            warnings.simplefilter("always")
            client = LLMClient(
                "openai",
                "gpt-4o-mini",
                api_key="sk-test",
                base_url=f"{server.url}/v1",
                envelope=RetryEnvelope(cooldown=None),
                env={"FLUID_LLM_TRANSPORT": transport},
            )
            assert _by_hand(client, 3) == ["ok"] * 3
            pools = client._apools
            assert pools is not None
            assert len(pools) == 0
            del client, pools
            gc.collect()
            gc.collect()
    finally:
        sys.unraisablehook = hook
    assert [str(w.message) for w in caught] == []
    assert reported == []
    assert not [r for r in caplog.records if "Unclosed" in r.getMessage()]
    out, err = capfd.readouterr()
    assert (out, err) == ("", "")


def test_the_close_hook_leaves_the_loop_as_it_was_and_runs_a_close_set_before_it() -> None:
    from fluid_build.copilot.call.loops import LoopPools

    closed: list[str] = []
    made: list[httpx.AsyncClient] = []

    def make() -> httpx.AsyncClient:
        made.append(httpx.AsyncClient())
        return made[-1]

    pools = LoopPools(make)
    loop = asyncio.new_event_loop()
    own_close = loop.close

    def theirs() -> None:  # a close another library set on the instance before fluid
        closed.append("theirs")
        own_close()

    vars(loop)["close"] = theirs

    async def use() -> None:
        pools.get()

    loop.run_until_complete(use())
    loop.close()
    assert closed == ["theirs"]
    assert loop.is_closed()
    assert made[0].is_closed
    assert len(pools) == 0
    assert vars(loop)["close"] is theirs  # fluid's hook is gone, theirs is back


@pytest.mark.parametrize("transport", ["aiohttp", "httpx"])
def test_the_pool_of_a_loop_left_open_is_closed_silently_when_its_client_is_collected(
    transport: str, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    import gc
    import sys
    import warnings

    from tests import hostile

    reported: list[str] = []
    hook = sys.unraisablehook
    sys.unraisablehook = lambda report: reported.append(f"{report.exc_value!r}")
    loop = asyncio.new_event_loop()
    try:
        with (
            hostile.serve(hostile.ok) as server,
            warnings.catch_warnings(record=True) as caught,
        ):
            warnings.simplefilter("always")
            client = LLMClient(
                "openai",
                "gpt-4o-mini",
                api_key="sk-test",
                base_url=f"{server.url}/v1",
                envelope=RetryEnvelope(cooldown=None),
                env={"FLUID_LLM_TRANSPORT": transport},
            )
            assert loop.run_until_complete(client.acomplete("hi")).text == "ok"
            assert client._apools is not None
            pool = client._apools._pools[loop][0]  # the loop's own pool
            del client  # never closed, and its loop is still open
            gc.collect()
            gc.collect()
            assert pool.is_closed
    finally:
        sys.unraisablehook = hook
        loop.close()
    assert [str(w.message) for w in caught] == []
    assert reported == []
    assert not [r for r in caplog.records if "Unclosed" in r.getMessage()]
    assert capfd.readouterr() == ("", "")
