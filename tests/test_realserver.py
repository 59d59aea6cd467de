"""The client against a real llama.cpp server: xllamacpp's prebuilt server, on 127.0.0.1.

The model is generated when the session starts (tests/llamacpp_server.py: random
weights, under 1 MB, nothing downloaded), so answers are gibberish but every
status, header, stream and refusal is the real server's. `nox -s realserver`
runs the same tests on a real small model (REALSERVER_MODEL), so each
assertion holds for both: a typed outcome, never a particular text.

Where the real server cannot be made to answer a certain way (the "Loading
model" 503 happens before the in-process server listens), a counting proxy in
front of it answers that itself, with llama.cpp's exact body; the proxy also
counts the requests that reached the server.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, Field

from fluid_build.cli.exit_codes import EXIT_CODES
from fluid_build.copilot import LLMClient
from fluid_build.copilot.agents.errors import (
    ContextOverflowError,
    ProviderAuthError,
    SchemaValidationError,
)
from fluid_build.copilot.call.envelope import RetryEnvelope, RetryPolicy
from tests.llamacpp_server import LlamaServer, counting_proxy, llamacpp_server, write_tiny_model

pytestmark = pytest.mark.realserver

RIGHT_KEY = "sk-local-right-key-0123456789"
WRONG_KEY = "sk-local-wrong-key-9876543210"
# ~2,000 characters: over a 256-token context for any tokenizer, and under the
# budget of a window pre-flight does not know (8,192 less 2,048).
LONG_PROMPT = "Describe the order table. " * 80
# The model is the generated one (CI), not a real one (`nox -s realserver`).
GENERATED = not os.environ.get("REALSERVER_MODEL")
# The data endpoints a proxy hides so that the server's context size is unknown.
METADATA = frozenset({"/props", "/v1/models", "/models"})


@pytest.fixture(scope="session")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """REALSERVER_MODEL (`nox -s realserver`), else a tiny random model made now."""
    chosen = os.environ.get("REALSERVER_MODEL")
    if chosen:
        return Path(chosen)
    return write_tiny_model(tmp_path_factory.mktemp("model") / "tiny-random.gguf")


@pytest.fixture(scope="session")
def small(model_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    """A server with a 256-token context and no key."""
    with llamacpp_server(model_file, tmp_path_factory.mktemp("small"), n_ctx=256) as server:
        yield server


@pytest.fixture(scope="session")
def keyed(model_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    """A server started with an API key, 4,096 tokens of context, 48-token answers."""
    with llamacpp_server(
        model_file, tmp_path_factory.mktemp("keyed"), n_ctx=4096, api_key=RIGHT_KEY, n_predict=48
    ) as server:
        yield server


def envelope(waits: list[float] | None = None, attempts: int = 3) -> RetryEnvelope:
    """The retry envelope with its sleep recorded instead of slept."""
    sleeps = [] if waits is None else waits
    return RetryEnvelope(
        RetryPolicy(attempts=attempts),
        sleep=sleeps.append,
        random=lambda: 0.0,
        hook=lambda event: None,
    )


def llamacpp(base_url: str, **kwargs: Any) -> LLMClient:
    kwargs.setdefault("env", {})
    kwargs.setdefault("envelope", envelope())
    return LLMClient("llamacpp", "tiny", base_url=base_url, **kwargs)


class Summary(BaseModel):
    """Needs more than 16 tokens of JSON, so a 16-token answer can never be one."""

    title: str = Field(min_length=20)
    steps: list[str] = Field(min_length=1)


# -- answers ---------------------------------------------------------------------------------


def test_the_server_started_quickly_from_a_generated_model(
    small: LlamaServer, model_file: Path
) -> None:
    if GENERATED:
        assert model_file.stat().st_size < 1_000_000
    assert small.started_in < 30


def test_a_completion(small: LlamaServer) -> None:
    with llamacpp(small.base_url) as client:
        done = client.complete("Say hello.", max_output_tokens=8)
    assert isinstance(done.text, str)
    assert 1 <= done.usage.output_tokens <= 8
    assert done.usage.input_tokens > 0
    assert done.attempts == 1
    assert done.finish_reason in {"length", "stop"}


@pytest.mark.anyio
async def test_an_async_completion(small: LlamaServer) -> None:
    async with llamacpp(small.base_url) as client:
        done = await client.acomplete("Say hello.", max_output_tokens=8)
    assert 1 <= done.usage.output_tokens <= 8
    assert done.attempts == 1


def test_a_stream_assembles_into_its_completion(small: LlamaServer) -> None:
    with llamacpp(small.base_url) as client:
        events = list(client.stream("Count to three.", max_output_tokens=12))
    texts = [e.text or "" for e in events if e.type == "text"]
    assert events[-1].type == "done"
    completion = events[-1].completion
    assert completion is not None
    assert texts
    assert completion.text == "".join(texts)
    assert completion.finish_reason in {"length", "stop"}


@pytest.mark.anyio
async def test_an_async_stream(small: LlamaServer) -> None:
    async with llamacpp(small.base_url) as client:
        events = [e async for e in client.astream("Count to three.", max_output_tokens=12)]
    assert events[-1].type == "done"
    assert events[-1].completion is not None
    assert events[-1].completion.text == "".join(e.text or "" for e in events if e.type == "text")


def test_a_stream_asks_for_its_usage_and_llama_cpp_takes_the_field(small: LlamaServer) -> None:
    # Issue 35: stream_options.include_usage goes to llama.cpp too; the server takes it (one
    # request, a 200) and the streamed answer carries its usage.
    with counting_proxy(small.url) as proxy, llamacpp(proxy.base_url) as client:
        events = list(client.stream("Count to three.", max_output_tokens=12))
    completion = events[-1].completion
    assert completion is not None
    assert completion.usage.input_tokens > 0
    assert 1 <= completion.usage.output_tokens <= 12
    posts = [seen for seen in proxy.script.seen if seen.method == "POST"]
    assert [(seen.path, seen.status) for seen in posts] == [("/v1/chat/completions", 200)]
    assert json.loads(posts[0].body)["stream_options"] == {"include_usage": True}


def test_structured_output_is_typed_either_way(small: LlamaServer) -> None:
    """The schema reaches the server (its grammar makes the answer JSON); gibberish cut
    at 16 tokens is a typed SchemaValidationError, never an untyped failure. (A real
    model may also answer in time: then the answer is the typed object.)"""
    with llamacpp(small.base_url) as client:
        try:
            done = client.complete(
                "Plan the orders table.", response_model=Summary, max_output_tokens=16
            )
        except SchemaValidationError as caught:
            error = caught
        else:
            assert not GENERATED, "gibberish can never fill this schema in 16 tokens"
            assert isinstance(done.parsed, Summary)
            return
    assert error.code in {"llm.parse_error", "llm.schema_violation"}
    assert error.raw_output is not None
    assert error.raw_output.lstrip().startswith("{")  # the JSON-schema grammar was applied
    assert not error.retryable


# -- the context window ------------------------------------------------------------------------


def test_overflow_is_refused_by_preflight_with_the_window_the_server_reports(
    small: LlamaServer,
) -> None:
    with counting_proxy(small.url) as proxy, llamacpp(proxy.base_url) as client:
        with pytest.raises(ContextOverflowError) as caught:
            client.complete(LONG_PROMPT)
        # Asked once per client: a second call sends nothing at all.
        with pytest.raises(ContextOverflowError):
            client.complete(LONG_PROMPT)
    error = caught.value
    assert error.details["source"] == "preflight"
    assert error.details["window_source"] == "server"
    assert error.context_window == 256
    assert "the server reports" in error.message
    assert proxy.requests() == ["GET /props -> 200"]  # no completion request was sent


@pytest.mark.anyio
async def test_async_overflow_is_refused_by_preflight_too(small: LlamaServer) -> None:
    with counting_proxy(small.url) as proxy:
        async with llamacpp(proxy.base_url) as client:
            with pytest.raises(ContextOverflowError) as caught:
                await client.acomplete(LONG_PROMPT)
    assert caught.value.details["window_source"] == "server"
    assert proxy.requests() == ["GET /props -> 200"]


def test_the_window_comes_from_v1_models_when_props_is_hidden(small: LlamaServer) -> None:
    with (
        counting_proxy(small.url, hidden=frozenset({"/props"})) as proxy,
        llamacpp(proxy.base_url) as client,
        pytest.raises(ContextOverflowError) as caught,
    ):
        client.complete(LONG_PROMPT)
    assert caught.value.context_window == 256
    assert proxy.requests() == ["GET /props -> 404", "GET /v1/models -> 200"]


def test_overflow_with_an_unknown_window_is_classified_from_the_servers_400(
    small: LlamaServer,
) -> None:
    with (
        counting_proxy(small.url, hidden=METADATA) as proxy,
        llamacpp(proxy.base_url) as client,
        pytest.raises(ContextOverflowError) as caught,
    ):
        client.complete(LONG_PROMPT)
    error = caught.value
    assert error.status_code == 400
    assert error.details.get("source") != "preflight"
    assert not error.retryable
    assert proxy.requests("POST") == ["POST /v1/chat/completions -> 400"]  # not retried


def test_a_stream_overflow_is_refused_before_streaming(small: LlamaServer) -> None:
    with (
        counting_proxy(small.url, hidden=METADATA) as proxy,
        llamacpp(proxy.base_url) as client,
        pytest.raises(ContextOverflowError) as caught,
    ):
        next(iter(client.stream(LONG_PROMPT)))
    assert caught.value.status_code == 400
    assert proxy.requests("POST") == ["POST /v1/chat/completions -> 400"]


def test_a_window_the_caller_gives_is_not_asked_for(small: LlamaServer) -> None:
    with counting_proxy(small.url) as proxy, llamacpp(proxy.base_url) as client:
        client.complete("Hi.", max_output_tokens=4, capability_matrix={"context_window": 256})
    assert proxy.requests() == ["POST /v1/chat/completions -> 200"]


def test_the_run_start_warning_judges_the_window_the_server_reports(small: LlamaServer) -> None:
    """Not "not in the capability matrix, assuming 8,192": the server said 256."""
    with counting_proxy(small.url) as proxy, llamacpp(proxy.base_url) as client:
        warnings = client.run_start_warnings(banner=False)
        client.complete("Hi.", max_output_tokens=4)
    assert not [w for w in warnings if "not in the capability matrix" in w], warnings
    assert any("256" in w for w in warnings), warnings
    # Asked once for the whole client: the warning's question served the call too.
    assert proxy.requests() == ["GET /props -> 200", "POST /v1/chat/completions -> 200"]


# -- keys -------------------------------------------------------------------------------------


def test_a_wrong_key_is_an_auth_error_after_one_request(keyed: LlamaServer) -> None:
    with (
        counting_proxy(keyed.url) as proxy,
        llamacpp(proxy.base_url, api_key=WRONG_KEY) as client,
        pytest.raises(ProviderAuthError) as caught,
    ):
        client.complete("Hi.")
    assert caught.value.status_code == 401
    assert not caught.value.retryable
    assert WRONG_KEY not in str(caught.value)
    # The probe stops at the first 401; the completion is sent once, never retried.
    assert proxy.requests() == ["GET /props -> 401", "POST /v1/chat/completions -> 401"]


def test_no_key_for_a_server_that_wants_one_is_an_auth_error(keyed: LlamaServer) -> None:
    with (
        counting_proxy(keyed.url) as proxy,
        llamacpp(proxy.base_url) as client,
        pytest.raises(ProviderAuthError),
    ):
        client.complete("Hi.")
    assert proxy.requests("POST") == ["POST /v1/chat/completions -> 401"]
    assert all(seen.authorization is None for seen in proxy.script.seen)


def test_the_key_comes_from_openai_api_key(keyed: LlamaServer) -> None:
    env = {"OPENAI_API_KEY": RIGHT_KEY}
    with counting_proxy(keyed.url) as proxy, llamacpp(proxy.base_url, env=env) as client:
        done = client.complete("Hi.", max_output_tokens=4)
    assert done.attempts == 1
    assert proxy.requests() == ["GET /props -> 200", "POST /v1/chat/completions -> 200"]
    assert {seen.authorization for seen in proxy.script.seen} == {f"Bearer {RIGHT_KEY}"}


# -- a server still loading ---------------------------------------------------------------------


def test_loading_model_503_is_retried_with_backoff(small: LlamaServer) -> None:
    """llama.cpp answers 503 "Loading model" until its model is loaded; xllamacpp
    listens only once it is, so the proxy gives the first two answers itself."""
    waits: list[float] = []
    with (
        counting_proxy(small.url, loading=2) as proxy,
        llamacpp(proxy.base_url, envelope=envelope(waits)) as client,
    ):
        done = client.complete("Hi.", max_output_tokens=4)
    assert done.attempts == 3
    assert len(waits) == 2
    assert 0 < waits[0] < waits[1]  # backoff, not a fixed pause
    assert proxy.requests("POST") == [
        "POST /v1/chat/completions -> 503",
        "POST /v1/chat/completions -> 503",
        "POST /v1/chat/completions -> 200",
    ]


# -- fluid forge, the console script ------------------------------------------------------------


def fluid(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    script = shutil.which("fluid", path=os.path.dirname(sys.executable)) or shutil.which("fluid")
    assert script is not None, "the fluid console script is not installed"
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("OPENAI_", "FLUID_", "ANTHROPIC_", "GEMINI_", "GOOGLE_"))
    }
    return subprocess.run(
        [script, *args],
        env={**base, "FLUID_HOME": str(cwd / "home"), "FLUID_NONINTERACTIVE": "1", **env},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def intent(path: Path, description: str) -> Path:
    path.write_text(
        "data_product:\n"
        "  name: sales_orders\n"
        "  domain: sales\n"
        f"  description: {json.dumps(description)}\n"
        "  owner: sales-data@example.com\n"
        "grain: one row per order line\n"
        "dimensions: [customer, product]\n"
        "metrics: [revenue]\n"
        "modeling_technique: dimensional\n"
    )
    return path


def last_json(stdout: str) -> dict[str, Any]:
    payload: dict[str, Any] = json.loads(stdout.strip().splitlines()[-1])
    return payload


def test_forge_against_a_server_with_a_key_from_openai_api_key(
    keyed: LlamaServer, tmp_path: Path
) -> None:
    """The console script reads the key, talks to the real server, and gibberish
    that never validates ends as the schema exit code after the stage's attempts."""
    with counting_proxy(keyed.url) as proxy:
        env = {
            "FLUID_LLM_PROVIDER": "llamacpp",
            "FLUID_LLM_MODEL": "tiny",
            "OPENAI_BASE_URL": proxy.base_url,
            "OPENAI_API_KEY": RIGHT_KEY,
        }
        orders = intent(tmp_path / "intent.yaml", "Order lines with revenue, for daily reports.")
        done = fluid(["forge", str(orders), "--json"], env, tmp_path)
    assert done.returncode == EXIT_CODES["schema"], done.stderr + done.stdout
    payload = last_json(done.stdout)
    assert payload["error"]["error"] == "SchemaValidationError"
    posts = proxy.requests("POST")
    assert posts
    assert set(posts) == {"POST /v1/chat/completions -> 200"}
    assert {seen.authorization for seen in proxy.script.seen} == {f"Bearer {RIGHT_KEY}"}
    assert RIGHT_KEY not in done.stdout + done.stderr


def test_forge_refuses_an_intent_too_large_for_the_server_before_sending_it(
    small: LlamaServer, tmp_path: Path
) -> None:
    with counting_proxy(small.url) as proxy:
        env = {
            "FLUID_LLM_PROVIDER": "llamacpp",
            "FLUID_LLM_MODEL": "tiny",
            "OPENAI_BASE_URL": proxy.base_url,
        }
        # Intents allow 2,000 characters of description: enough to overflow 256 tokens.
        orders = intent(tmp_path / "intent.yaml", ("Describe the order table. " * 70).strip())
        done = fluid(["forge", str(orders), "--json"], env, tmp_path)
    assert done.returncode == EXIT_CODES["context_overflow"], done.stderr + done.stdout
    error = last_json(done.stdout)["error"]
    assert error["error"] == "ContextOverflowError"
    assert proxy.requests() == ["GET /props -> 200"]
