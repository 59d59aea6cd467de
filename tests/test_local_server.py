"""What the client learns from a local server: its context size, asked once, bounded.

The answers below are real: llama.cpp's (b0 of xllamacpp 2026.10, captured from the
server tests/test_realserver.py starts) and vLLM's /v1/models card
(vllm/entrypoints/openai/protocol.py, ModelCard.max_model_len).
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from fluid_build.copilot import LLMClient
from fluid_build.copilot.agents.errors import ContextOverflowError, ProviderServerError
from fluid_build.copilot.call.envelope import RetryEnvelope, RetryPolicy
from fluid_build.copilot.call.window import alearn_window, learn_window
from fluid_build.copilot.health.breaker import CircuitBreaker
from fluid_build.copilot.health.cooldown import MemoryCooldownStore
from fluid_build.copilot.llm.local_server import (
    MAX_PROBE_BYTES,
    is_local_url,
    probe_urls,
    window_from,
)

LLAMACPP_PROPS = {
    "default_generation_settings": {"params": {"n_predict": -1, "seed": 4294967295}, "n_ctx": 256},
    "total_slots": 1,
    "model_alias": "tiny.gguf",
}
LLAMACPP_MODELS = {
    "object": "list",
    "data": [
        {
            "id": "tiny.gguf",
            "object": "model",
            "owned_by": "llamacpp",
            "meta": {"vocab_type": 2, "n_vocab": 260, "n_ctx": 256, "n_ctx_train": 4096},
        }
    ],
}
# Before llama.cpp reported the running context in meta: the trained one only.
LLAMACPP_MODELS_OLD = {
    "object": "list",
    "data": [{"id": "m.gguf", "object": "model", "meta": {"n_ctx_train": 8192}}],
}
VLLM_MODELS = {
    "object": "list",
    "data": [
        {
            "id": "Qwen/Qwen3-8B",
            "object": "model",
            "created": 1735000000,
            "owned_by": "vllm",
            "root": "Qwen/Qwen3-8B",
            "parent": None,
            "max_model_len": 32768,
        },
        {
            "id": "qwen-lora",
            "object": "model",
            "owned_by": "vllm",
            "root": "Qwen/Qwen3-8B",
            "parent": "Qwen/Qwen3-8B",
            "max_model_len": 32768,
        },
    ],
}
OPENAI_OK = {
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}],
    "usage": {"prompt_tokens": 5, "completion_tokens": 1},
}
LONG = "Describe the order table. " * 80  # ~500 estimated tokens


@pytest.mark.parametrize(
    ("url", "local"),
    [
        ("http://127.0.0.1:8080/v1", True),
        ("http://localhost:8000/v1", True),
        ("http://[::1]:8000/v1", True),
        ("http://10.1.2.3:8000/v1", True),
        ("http://172.16.0.9:8000/v1", True),
        ("http://192.168.1.20:11434", True),
        ("http://169.254.10.1/v1", True),
        ("http://vllm:8000/v1", True),  # a compose service
        ("http://gpu-box.local:8080/v1", True),
        ("http://host.docker.internal:8080/v1", True),
        ("https://api.groq.com/openai/v1", False),
        ("http://8.8.8.8/v1", False),
        ("https://llm.example.com/v1", False),
        ("http://[", False),
        ("not a url", False),
    ],
)
def test_which_urls_are_local(url: str, local: bool) -> None:
    assert is_local_url(url) is local


@pytest.mark.parametrize(
    ("provider", "base", "urls"),
    [
        (
            "llamacpp",
            "http://127.0.0.1:8080/v1",
            ("http://127.0.0.1:8080/props", "http://127.0.0.1:8080/v1/models"),
        ),
        (
            "vllm",
            "http://127.0.0.1:8000/v1/",
            ("http://127.0.0.1:8000/props", "http://127.0.0.1:8000/v1/models"),
        ),
        (
            "openai_compatible",
            "http://10.0.0.2:8080",
            ("http://10.0.0.2:8080/props", "http://10.0.0.2:8080/models"),
        ),
        ("vllm", "https://llm.example.com/v1", ()),  # not local: nothing is asked
        ("ollama", "http://127.0.0.1:11434", ()),  # its model list has no context size
        ("openai", "http://127.0.0.1:8000/v1", ()),
        ("groq", "https://api.groq.com/openai/v1", ()),
        ("llamacpp", None, ()),
    ],
)
def test_what_is_asked(provider: str, base: str | None, urls: tuple[str, ...]) -> None:
    assert probe_urls(provider, base) == urls


@pytest.mark.parametrize(
    ("url", "data", "model", "window"),
    [
        ("http://h/props", LLAMACPP_PROPS, "anything", 256),
        ("http://h/v1/models", LLAMACPP_MODELS, "whatever-it-is-called", 256),
        ("http://h/v1/models", LLAMACPP_MODELS_OLD, "m", 8192),
        ("http://h/v1/models", VLLM_MODELS, "Qwen/Qwen3-8B", 32768),
        ("http://h/v1/models", VLLM_MODELS, "qwen-lora", 32768),
        ("http://h/v1/models", VLLM_MODELS, "not-served", None),  # two models, neither named
        ("http://h/props", {"default_generation_settings": {"n_ctx": True}}, "m", None),
        ("http://h/props", {"default_generation_settings": {"n_ctx": -1}}, "m", None),
        ("http://h/props", {"default_generation_settings": {"n_ctx": 10**12}}, "m", None),
        ("http://h/props", {"default_generation_settings": {"n_ctx": "256"}}, "m", None),
        ("http://h/props", {"default_generation_settings": []}, "m", None),
        ("http://h/props", ["not", "a", "mapping"], "m", None),
        ("http://h/v1/models", {"data": "nope"}, "m", None),
        ("http://h/v1/models", {"data": [{"id": "m", "meta": "x"}]}, "m", None),
        ("http://h/v1/models", None, "m", None),
    ],
)
def test_reading_an_answer(url: str, data: Any, model: str, window: int | None) -> None:
    assert window_from(url, data, model) == window


# -- the shells --------------------------------------------------------------------------


Handler = Callable[[httpx.Request], httpx.Response]
URLS = ("http://127.0.0.1:8080/props", "http://127.0.0.1:8080/v1/models")


def recording(handler: Handler) -> tuple[list[httpx.Request], Handler]:
    seen: list[httpx.Request] = []

    def record(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return handler(request)

    return seen, record


def by_path(answers: dict[str, Any]) -> Handler:
    """200 with the JSON for a path it knows, else 404 (a fresh response each time)."""

    def handle(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        return httpx.Response(200, json=answers[path]) if path in answers else httpx.Response(404)

    return handle


CASES: list[tuple[str, Handler, int | None, list[str]]] = [
    (
        "props answers",
        by_path({"/props": LLAMACPP_PROPS}),
        256,
        ["/props"],
    ),
    (
        "vllm: props 404, then models",
        by_path({"/v1/models": VLLM_MODELS}),
        32768,
        ["/props", "/v1/models"],
    ),
    (
        "a wrong key stops at the first 401",
        lambda request: httpx.Response(401, json={"error": {"message": "Invalid API Key"}}),
        None,
        ["/props"],
    ),
    (
        "too large to read",
        lambda request: httpx.Response(200, content=b" " * (MAX_PROBE_BYTES + 1) + b"{}"),
        None,
        ["/props", "/v1/models"],
    ),
    (
        "compressed although identity was asked for",
        lambda request: httpx.Response(
            200,
            content=gzip.compress(json.dumps(LLAMACPP_PROPS).encode()),
            headers={"content-encoding": "gzip"},
        ),
        None,
        ["/props", "/v1/models"],
    ),
    (
        "not JSON",
        lambda request: httpx.Response(200, content=b"<html>"),
        None,
        ["/props", "/v1/models"],
    ),
    (
        "absurdly nested",
        lambda request: httpx.Response(200, content=b"[" * 100_000),
        None,
        ["/props", "/v1/models"],
    ),
]


def _refused(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("refused", request=request)


def _broken(request: httpx.Request) -> httpx.Response:
    raise RuntimeError("a transport that fails in its own way")


CASES += [
    ("refused", _refused, None, ["/props", "/v1/models"]),
    ("any failure at all", _broken, None, ["/props", "/v1/models"]),
]


@pytest.mark.parametrize(
    ("handler", "window", "paths"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_asking(handler: Handler, window: int | None, paths: list[str]) -> None:
    seen, record = recording(handler)
    with httpx.Client(transport=httpx.MockTransport(record)) as client:
        found = learn_window(client, URLS, "qwen-lora", api_key="sk-local", deadline_left=60)
    assert found == window
    assert [r.url.path for r in seen] == paths
    assert all(r.method == "GET" for r in seen)
    assert all(r.headers["authorization"] == "Bearer sk-local" for r in seen)
    assert all(r.headers["accept-encoding"] == "identity" for r in seen)


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("handler", "window", "paths"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
async def test_asking_async(handler: Handler, window: int | None, paths: list[str]) -> None:
    seen, record = recording(handler)
    async with httpx.AsyncClient(transport=httpx.MockTransport(record)) as client:
        found = await alearn_window(client, URLS, "qwen-lora", deadline_left=60)
    assert found == window
    assert [r.url.path for r in seen] == paths
    assert all("authorization" not in r.headers for r in seen)


def test_nothing_is_asked_when_the_deadline_is_nearly_spent() -> None:
    seen, record = recording(by_path({"/props": LLAMACPP_PROPS}))
    with httpx.Client(transport=httpx.MockTransport(record)) as client:
        assert learn_window(client, URLS, "tiny", deadline_left=0.02) is None
    assert seen == []


# -- through LLMClient ------------------------------------------------------------------------


def server(window: int = 256) -> tuple[list[str], httpx.MockTransport]:
    """A llama.cpp-shaped server: /props, and chat completions."""
    seen: list[str] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(f"{request.method} {request.url.path}")
        if request.url.path == "/props":
            props = {"default_generation_settings": {"n_ctx": window}}
            return httpx.Response(200, json=props)
        if request.url.path == "/v1/chat/completions":
            return httpx.Response(200, json=OPENAI_OK)
        return httpx.Response(404)

    return seen, httpx.MockTransport(handle)


def client(transport: httpx.MockTransport, **kwargs: Any) -> LLMClient:
    kwargs.setdefault("base_url", "http://127.0.0.1:8080/v1")
    kwargs.setdefault("envelope", RetryEnvelope(RetryPolicy(attempts=1), hook=lambda e: None))
    return LLMClient(
        "llamacpp",
        "tiny",
        env={},
        http_client=httpx.Client(transport=transport),
        async_http_client=httpx.AsyncClient(transport=transport),
        **kwargs,
    )


def test_asked_once_per_client_and_used_by_preflight() -> None:
    seen, transport = server(256)
    llm = client(transport)
    llm.complete("hi")
    llm.complete("hi again")
    with pytest.raises(ContextOverflowError) as caught:
        llm.complete(LONG)
    assert seen == ["GET /props", "POST /v1/chat/completions", "POST /v1/chat/completions"]
    error = caught.value
    assert error.context_window == 256
    assert error.details["window_source"] == "server"
    assert error.details["source"] == "preflight"
    assert "the server reports" in error.message


def test_a_large_window_lets_a_long_prompt_through() -> None:
    seen, transport = server(32768)
    client(transport).complete(LONG)
    assert seen == ["GET /props", "POST /v1/chat/completions"]


@pytest.mark.anyio
async def test_async_calls_ask_too() -> None:
    seen, transport = server(256)
    llm = client(transport)
    await llm.acomplete("hi")
    with pytest.raises(ContextOverflowError):
        await llm.acomplete(LONG)
    assert seen == ["GET /props", "POST /v1/chat/completions"]


def test_streams_ask_too() -> None:
    seen, transport = server(256)
    with pytest.raises(ContextOverflowError):
        next(iter(client(transport).stream(LONG)))
    assert seen == ["GET /props"]


@pytest.mark.parametrize(
    "matrix", [{"context_window": 100_000}, {"preflight": False}], ids=["window", "no-preflight"]
)
def test_not_asked_when_the_caller_gives_the_window(matrix: dict[str, Any]) -> None:
    seen, transport = server(256)
    client(transport, capability_matrix=matrix).complete(LONG)
    seen_per_call, transport = server(256)
    client(transport).complete(LONG, capability_matrix=matrix)
    assert seen == seen_per_call == ["POST /v1/chat/completions"]


def test_the_callers_window_beats_the_servers() -> None:
    seen, transport = server(100_000)
    llm = client(transport, capability_matrix={"context_window": 256})
    with pytest.raises(ContextOverflowError) as caught:
        llm.complete(LONG)
    assert caught.value.details["window_source"] == "capability_matrix"
    assert seen == []


def test_not_asked_for_a_remote_server() -> None:
    seen, transport = server(256)
    client(transport, base_url="https://llm.example.com/v1").complete("hi")
    assert seen == ["POST /v1/chat/completions"]


def test_not_asked_while_the_circuit_is_not_closed() -> None:
    store = MemoryCooldownStore()
    breaker = CircuitBreaker(store, threshold=1, cool_off=60, window=60)
    envelope = RetryEnvelope(
        RetryPolicy(attempts=1), cooldown=store, breaker=breaker, hook=lambda e: None
    )
    seen, transport = server(256)
    llm = client(transport, envelope=envelope)
    breaker.record_failure(str(llm.health_key), ProviderServerError("503"))
    with pytest.raises(Exception, match="circuit"):
        llm.complete("hi")
    assert seen == []  # neither the probe nor the call
    breaker.reset(str(llm.health_key))
    llm.complete("hi")
    assert seen == ["GET /props", "POST /v1/chat/completions"]
