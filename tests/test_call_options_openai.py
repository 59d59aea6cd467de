"""Call options on the wire for OpenAI chat, Azure, the OpenAI-compatible presets, the
Responses API and Ollama (issue 34 items 1-3): each option under the provider's own
field, ``extra_body`` merged key by key, ``extra_headers`` sent, and an option the
provider has no field for refused before anything is sent (or dropped with one warning).

Every request goes to a real HTTP server on 127.0.0.1 that keeps what it received.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from pydantic import BaseModel

from fluid_build.copilot import LLMClient, ToolSpec
from fluid_build.copilot.agents.errors import ProviderError
from fluid_build.copilot.call import options as options_module
from fluid_build.copilot.call.envelope import RetryEnvelope
from fluid_build.copilot.health.cooldown import MemoryCooldownStore
from tests.fakes import FakeClock

KEY = "sk-test-0123456789abcdef"
TEXT = '{"word": "fine"}'
LOOKUP = ToolSpec("lookup", "Look a word up", {"type": "object", "properties": {}})
SPELL = ToolSpec("spell", "Spell a word", {"type": "object", "properties": {}})


class Word(BaseModel):
    word: str


# -- a loopback server that keeps each request ------------------------------------------


@dataclass
class Seen:
    path: str
    headers: dict[str, str]
    raw_headers: list[tuple[str, str]]
    body: dict[str, Any]


def _sse(*events: dict[str, Any], done: bool = True) -> bytes:
    out = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
    return out + (b"data: [DONE]\n\n" if done else b"")


def _answer(path: str, stream: bool) -> tuple[str, bytes]:
    """What each API answers: one short text, whole or as a stream."""
    if path.endswith("/api/chat"):
        if not stream:
            return "application/json", json.dumps(
                {"model": "m", "message": {"content": TEXT}, "done": True, "done_reason": "stop"}
            ).encode()
        lines = [
            {"model": "m", "message": {"content": TEXT}, "done": False},
            {"model": "m", "message": {"content": ""}, "done": True, "done_reason": "stop"},
        ]
        return "application/x-ndjson", b"".join(json.dumps(x).encode() + b"\n" for x in lines)
    if path.endswith("/responses"):
        response = {
            "status": "completed",
            "model": "m",
            "output": [{"type": "message", "content": [{"type": "output_text", "text": TEXT}]}],
            "usage": {"input_tokens": 3, "output_tokens": 2},
        }
        if not stream:
            return "application/json", json.dumps(response).encode()
        return "text/event-stream", _sse(
            {"type": "response.output_text.delta", "delta": TEXT},
            {"type": "response.completed", "response": response},
            done=False,
        )
    usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    if not stream:
        message = {"role": "assistant", "content": TEXT}
        choice = {"index": 0, "message": message, "finish_reason": "stop"}
        return "application/json", json.dumps(
            {"model": "m", "choices": [choice], "usage": usage}
        ).encode()
    return "text/event-stream", _sse(
        {"model": "m", "choices": [{"index": 0, "delta": {"content": TEXT}}]},
        {"model": "m", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    )


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def do_GET(self) -> None:  # a local server's context-size probe: nothing to tell
        self.send_response(404)
        self.send_header("content-length", "0")
        self.end_headers()

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("content-length") or 0))
        body = json.loads(raw or b"{}")
        seen = Seen(
            self.path,
            {k.lower(): v for k, v in self.headers.items()},
            [(k.lower(), v) for k, v in self.headers.items()],
            body,
        )
        with self.server.lock:
            self.server.seen.append(seen)
        kind, answer = _answer(self.path.split("?", 1)[0], bool(body.get("stream")))
        status = 200
        if self.server.echo:  # a server that quotes the request's headers in its error
            status, kind = 400, "application/json"
            quoted = " ".join(f"{k}={v}" for k, v in seen.raw_headers)
            answer = json.dumps(
                {"error": {"message": f"bad request: {quoted}", "type": "invalid_request_error"}}
            ).encode()
        self.send_response(status)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, format: str, *args: object) -> None:
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.seen: list[Seen] = []
        self.lock = threading.Lock()
        self.echo = False

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"


@pytest.fixture
def server() -> Iterator[_Server]:
    served = _Server()
    thread = threading.Thread(target=served.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield served
    finally:
        served.shutdown()
        served.server_close()
        thread.join(timeout=5)


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    # The drop warning is once per process per provider:option: each test starts afresh.
    monkeypatch.setattr(options_module, "_warned", set())


def client(server: _Server, provider: str, model: str, **kwargs: Any) -> LLMClient:
    clock = FakeClock()
    envelope = RetryEnvelope(
        cooldown=MemoryCooldownStore(),
        clock=clock,
        sleep=clock.sleep,
        asleep=clock.asleep,
        random=lambda: 0.0,
        hook=lambda event: None,
    )
    base = server.url if provider in ("azure", "ollama") else f"{server.url}/v1"
    kwargs.setdefault("env", {})
    kwargs.setdefault("api_key", KEY)
    return LLMClient(provider, model, base_url=base, envelope=envelope, **kwargs)


def run(llm: LLMClient, mode: str, **options: Any) -> str:
    """One call, plain or streamed (sync or async); the answer's text."""
    if mode == "complete":
        return llm.complete("hi", **options).text
    if mode == "stream":
        return "".join(e.text or "" for e in llm.stream("hi", **options) if e.type == "text")

    async def go() -> str:
        async with llm:
            if mode == "acomplete":
                return (await llm.acomplete("hi", **options)).text
            parts = [e.text or "" async for e in llm.astream("hi", **options) if e.type == "text"]
            return "".join(parts)

    return asyncio.run(go())


# -- each option under the provider's own field ----------------------------------------------


@dataclass(frozen=True)
class Case:
    provider: str
    model: str
    options: dict[str, Any]
    #: The fields the body must carry, with these values.
    expect: dict[str, Any]
    #: Fields that must not be there (an option under another provider's name).
    absent: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)


SAMPLING = {
    "temperature": 0.37,
    "top_p": 0.81,
    "stop": ["END"],
    "seed": 4242,
    "max_output_tokens": 321,
    "tools": [LOOKUP, SPELL],
    "tool_choice": "lookup",
    "parallel_tool_calls": False,
}
CHAT = {
    "temperature": 0.37,
    "top_p": 0.81,
    "stop": ["END"],
    "seed": 4242,
    "tool_choice": {"type": "function", "function": {"name": "lookup"}},
    "parallel_tool_calls": False,
}

CASES = {
    "openai": Case(
        "openai", "gpt-4.1-mini", SAMPLING, {**CHAT, "max_completion_tokens": 321}, ("max_tokens",)
    ),
    "openai-reasoning": Case(
        "openai", "o4-mini", {"reasoning_effort": "low"}, {"reasoning_effort": "low"}
    ),
    "azure": Case(
        "azure", "my-gpt", SAMPLING, {**CHAT, "max_completion_tokens": 321}, ("max_tokens",)
    ),
    "azure-reasoning": Case(
        "azure",
        "my-o4",
        {"reasoning_effort": "high"},
        {"reasoning_effort": "high"},
        env={"AZURE_OPENAI_API_VERSION": "2025-04-01-preview"},
    ),
    # Groq: max_tokens is deprecated for max_completion_tokens.
    "groq": Case(
        "groq",
        "openai/gpt-oss-20b",
        {**SAMPLING, "reasoning_effort": "medium"},
        {**CHAT, "max_completion_tokens": 321, "reasoning_effort": "medium"},
        ("max_tokens",),
    ),
    # Mistral: the seed is random_seed, the cap max_tokens.
    "mistral": Case(
        "mistral",
        "mistral-small-latest",
        SAMPLING,
        {**{k: v for k, v in CHAT.items() if k != "seed"}, "random_seed": 4242, "max_tokens": 321},
        ("seed", "max_completion_tokens"),
    ),
    # OpenRouter: reasoning as {"effort": ...}.
    "openrouter": Case(
        "openrouter",
        "deepseek/deepseek-r1",
        {**SAMPLING, "reasoning_effort": "high"},
        {**CHAT, "max_tokens": 321, "reasoning": {"effort": "high"}},
        ("reasoning_effort", "max_completion_tokens"),
    ),
    "vllm": Case(
        "vllm",
        "Qwen/Qwen3-8B",
        {**SAMPLING, "reasoning_effort": "low"},
        {**CHAT, "max_tokens": 321, "reasoning_effort": "low"},
        ("max_completion_tokens",),
    ),
    "cerebras": Case(
        "cerebras",
        "gpt-oss-120b",
        {**SAMPLING, "reasoning_effort": "low"},
        {**CHAT, "max_completion_tokens": 321, "reasoning_effort": "low"},
        ("max_tokens",),
    ),
    # DeepSeek has no seed, parallel_tool_calls or reasoning effort (refused, below).
    "deepseek": Case(
        "deepseek",
        "deepseek-chat",
        {k: v for k, v in SAMPLING.items() if k not in ("seed", "parallel_tool_calls")},
        {
            **{k: v for k, v in CHAT.items() if k not in ("seed", "parallel_tool_calls")},
            "max_tokens": 321,
        },
        ("max_completion_tokens", "seed", "parallel_tool_calls"),
    ),
    "together": Case(
        "together",
        "openai/gpt-oss-20b",
        {k: v for k, v in SAMPLING.items() if k != "parallel_tool_calls"}
        | {"reasoning_effort": "high"},
        {
            **{k: v for k, v in CHAT.items() if k != "parallel_tool_calls"},
            "max_tokens": 321,
            "reasoning_effort": "high",
        },
        ("max_completion_tokens",),
    ),
    "fireworks": Case(
        "fireworks",
        "accounts/fireworks/models/gpt-oss-20b",
        {k: v for k, v in SAMPLING.items() if k not in ("seed", "parallel_tool_calls")}
        | {"reasoning_effort": "medium"},
        {
            **{k: v for k, v in CHAT.items() if k not in ("seed", "parallel_tool_calls")},
            "max_tokens": 321,
            "reasoning_effort": "medium",
        },
        ("max_completion_tokens",),
    ),
    # A server named only as OpenAI-compatible: OpenAI's fields, the cap as max_tokens.
    "openai_compatible": Case(
        "openai_compatible",
        "my-model",
        {**SAMPLING, "reasoning_effort": "low"},
        {**CHAT, "max_tokens": 321, "reasoning_effort": "low"},
        ("max_completion_tokens",),
    ),
    # llama.cpp takes only auto/none/required: a named tool is "required" with it alone.
    "llamacpp": Case(
        "llamacpp",
        "model.gguf",
        SAMPLING,
        {**CHAT, "tool_choice": "required", "max_tokens": 321},
        ("max_completion_tokens",),
    ),
    # xAI: only grok-3-mini takes reasoning_effort, and a reasoning model takes no stop.
    "xai": Case(
        "xai",
        "grok-3-mini",
        {**{k: v for k, v in SAMPLING.items() if k != "stop"}, "reasoning_effort": "low"},
        {
            **{k: v for k, v in CHAT.items() if k != "stop"},
            "max_completion_tokens": 321,
            "reasoning_effort": "low",
        },
        ("max_tokens", "stop"),
    ),
    "xai-non-reasoning": Case(
        "xai",
        "grok-4-fast-non-reasoning",
        SAMPLING,
        {**CHAT, "max_completion_tokens": 321},
        ("max_tokens",),
    ),
    "openai_responses": Case(
        "openai_responses",
        "gpt-4.1-mini",
        {k: v for k, v in SAMPLING.items() if k not in ("stop", "seed")},
        {
            "temperature": 0.37,
            "top_p": 0.81,
            "max_output_tokens": 321,
            "tool_choice": {"type": "function", "name": "lookup"},
            "parallel_tool_calls": False,
        },
        ("stop", "seed", "max_completion_tokens"),
    ),
    "openai_responses-reasoning": Case(
        "openai_responses",
        "o4-mini",
        {"reasoning_effort": "medium"},
        {"reasoning": {"effort": "medium"}},
        ("reasoning_effort",),
    ),
    "ollama": Case(
        "ollama",
        "gpt-oss:20b",
        {
            "temperature": 0.37,
            "top_p": 0.81,
            "stop": ["END"],
            "seed": 4242,
            "max_output_tokens": 321,
            "reasoning_effort": "high",
        },
        {
            "options": {
                "temperature": 0.37,
                "top_p": 0.81,
                "stop": ["END"],
                "seed": 4242,
                "num_predict": 321,
            },
            "think": "high",
        },
        ("temperature", "seed", "stop", "max_tokens", "reasoning_effort"),
    ),
}


def bare(provider: str, stream: bool) -> set[str]:
    """The body of a call that sets no option: what it was before options were mapped, so
    that the requests recorded cassettes replay stay as they were."""
    if provider == "openai_responses":
        return {"model", "input"} | ({"stream"} if stream else set())
    if provider == "ollama":
        return {"model", "messages", "stream"}
    if not stream:
        return {"model", "messages"}
    return {"model", "messages", "stream", "stream_options"}  # the usage, in a last chunk


@pytest.mark.parametrize("mode", ["complete", "stream"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_each_option_goes_under_the_providers_own_field(
    server: _Server, name: str, mode: str
) -> None:
    case = CASES[name]
    with client(server, case.provider, case.model, env=case.env) as llm:
        assert run(llm, mode, **case.options) == TEXT
        assert run(llm, mode) == TEXT  # the same call without the options
    seen, plain = server.seen
    assert set(plain.body) == bare(case.provider, mode == "stream")
    for key, value in case.expect.items():
        assert seen.body.get(key) == value, key
    for key in case.absent:
        assert key not in seen.body, key
    if case.provider == "llamacpp":
        assert [t["function"]["name"] for t in seen.body["tools"]] == ["lookup"]
    elif "tools" in case.options:
        assert len(seen.body["tools"]) == 2


@pytest.mark.parametrize("mode", ["acomplete", "astream"])
@pytest.mark.parametrize("name", ["openai", "mistral", "openai_responses", "ollama"])
def test_the_async_calls_map_the_same_options(server: _Server, name: str, mode: str) -> None:
    case = CASES[name]
    assert run(client(server, case.provider, case.model), mode, **case.options) == TEXT
    [seen] = server.seen
    for key, value in case.expect.items():
        assert seen.body.get(key) == value, key


@pytest.mark.parametrize("choice", ["auto", "none", "required"])
@pytest.mark.parametrize("provider", ["openai", "llamacpp", "openai_responses"])
def test_the_tool_choice_words_go_as_they_are(server: _Server, provider: str, choice: str) -> None:
    with client(server, provider, "m") as llm:
        llm.complete("hi", tools=[LOOKUP, SPELL], tool_choice=choice)
    [seen] = server.seen
    assert seen.body["tool_choice"] == choice
    assert len(seen.body["tools"]) == 2


def test_parallel_tool_calls_without_tools_is_not_sent_to_chat_completions(
    server: _Server,
) -> None:
    # OpenAI answers 400 to it without tools; with no tool there is nothing to call at once.
    with client(server, "openai", "gpt-4.1-mini") as llm:
        llm.complete("hi", parallel_tool_calls=False)
        llm.complete("hi", parallel_tool_calls=False, tools=[LOOKUP])
    assert "parallel_tool_calls" not in server.seen[0].body
    assert server.seen[1].body["parallel_tool_calls"] is False


# -- extra_body merged key by key, extra_headers sent after fluid's own ----------------------


@dataclass(frozen=True)
class Extra:
    provider: str
    options: dict[str, Any]
    #: A path of keys into the body, and the value found there.
    expect: tuple[tuple[tuple[str, ...], Any], ...]
    auth: str  # the header carrying the key


EXTRAS = {
    "openai": Extra(
        "openai",
        {
            "response_model": Word,
            "temperature": 0.37,
            "extra_body": {"response_format": {"json_schema": {"description": "one word"}}},
        },
        (
            (("response_format", "type"), "json_schema"),
            (("response_format", "json_schema", "name"), "Word"),
            (("response_format", "json_schema", "description"), "one word"),
            (("temperature",), 0.37),
        ),
        "authorization",
    ),
    "azure": Extra(
        "azure",
        {"extra": {"store": False, "metadata": {"run": "r-7"}}},
        ((("store",), False), (("metadata", "run"), "r-7")),
        "api-key",
    ),
    "mistral": Extra(
        "mistral",
        {"seed": 4242, "extra_body": {"safe_prompt": True, "random_seed": 5}},
        ((("safe_prompt",), True), (("random_seed",), 5)),  # the caller's body wins
        "authorization",
    ),
    "openai_responses": Extra(
        "openai_responses",
        {
            "response_model": Word,
            "reasoning_effort": "low",
            "extra_body": {"text": {"verbosity": "low"}, "reasoning": {"summary": "auto"}},
        },
        (
            (("text", "format", "name"), "Word"),
            (("text", "verbosity"), "low"),
            (("reasoning", "effort"), "low"),
            (("reasoning", "summary"), "auto"),
        ),
        "authorization",
    ),
    "ollama": Extra(
        "ollama",
        {
            "temperature": 0.37,
            "max_output_tokens": 64,
            "extra_body": {"options": {"num_ctx": 8192}, "keep_alive": "5m"},
        },
        (
            (("options", "temperature"), 0.37),
            (("options", "num_predict"), 64),
            (("options", "num_ctx"), 8192),
            (("keep_alive",), "5m"),
        ),
        "authorization",
    ),
}


def _at(body: dict[str, Any], path: tuple[str, ...]) -> Any:
    for key in path:
        body = body[key]
    return body


@pytest.mark.parametrize("mode", ["complete", "stream"])
@pytest.mark.parametrize("name", sorted(EXTRAS))
def test_extra_body_is_merged_into_fluids_and_extra_headers_are_sent(
    server: _Server, name: str, mode: str
) -> None:
    case = EXTRAS[name]
    model = "o4-mini" if "reasoning_effort" in case.options else "m"
    headers = {"X-Trace-Id": "t-4242", "OpenAI-Organization": "org-7"}
    with client(server, case.provider, model) as llm:
        run(llm, mode, extra_headers=headers, **case.options)
    [seen] = server.seen
    for path, value in case.expect:
        assert _at(seen.body, path) == value, path
    assert seen.headers["x-trace-id"] == "t-4242"
    assert seen.headers["openai-organization"] == "org-7"
    assert KEY in seen.headers[case.auth]  # fluid's own headers are still there


def test_the_stream_options_fluid_sets_keep_what_extra_body_adds(server: _Server) -> None:
    with client(server, "openai", "gpt-4.1-mini") as llm:
        run(llm, "stream", extra_body={"stream_options": {"include_obfuscation": False}})
    assert server.seen[0].body["stream_options"] == {
        "include_usage": True,
        "include_obfuscation": False,
    }


def test_a_compatible_server_gets_the_stream_options_the_caller_asks_for(server: _Server) -> None:
    # fluid asks these servers for the usage too (issue 35); what a caller sets in
    # extra_body is merged after fluid's own fields, and wins.
    with client(server, "vllm", "Qwen/Qwen3-8B") as llm:
        run(llm, "stream", extra_body={"stream_options": {"include_usage": False}})
        run(llm, "stream")
    assert server.seen[0].body["stream_options"] == {"include_usage": False}
    assert server.seen[1].body["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize(
    ("version", "takes"),
    [
        ("2024-10-21", False),
        ("2024-12-01-preview", True),
        ("2025-04-01-preview", True),
        ("preview", True),
    ],
)
def test_azure_takes_reasoning_effort_from_the_api_version_that_has_it(
    server: _Server, version: str, takes: bool
) -> None:
    env = {"AZURE_OPENAI_API_VERSION": version}
    with client(server, "azure", "my-o4", env=env) as llm:
        if takes:
            llm.complete("hi", reasoning_effort="high")
        else:
            with pytest.raises(ProviderError, match="cannot take reasoning_effort="):
                llm.complete("hi", reasoning_effort="high")
        llm.complete("hi", seed=4242)  # every version fluid knows has the seed
    sent = [seen.body for seen in server.seen]
    assert [body.get("reasoning_effort") for body in sent] == ["high"] * takes + [None]
    assert sent[-1]["seed"] == 4242
    assert all(f"api-version={version}" in seen.path for seen in server.seen)


@pytest.mark.parametrize("provider", ["openai", "azure", "openai_responses", "ollama", "groq"])
def test_an_extra_header_replaces_fluids_own_of_the_same_name_in_any_case(
    server: _Server, provider: str
) -> None:
    auth = "api-key" if provider == "azure" else "Authorization"
    with client(server, provider, "m") as llm:
        llm.complete("hi", extra_headers={auth.upper(): "Bearer from-the-caller"})
    [seen] = server.seen
    sent = [v for k, v in seen.raw_headers if k == auth.lower()]
    assert sent == ["Bearer from-the-caller"]  # once, the caller's
    assert KEY not in json.dumps(seen.raw_headers)


@pytest.mark.parametrize("provider", ["openai", "azure", "vllm", "openai_responses", "ollama"])
def test_a_credential_in_extra_headers_never_shows_in_the_error(
    server: _Server, provider: str
) -> None:
    server.echo = True
    secret = "plain-looking-value-7f3a9c"
    headers = {"Authorization": f"Bearer {secret}", "X-Gateway-Token": secret}
    with client(server, provider, "m") as llm, pytest.raises(ProviderError) as caught:
        llm.complete("hi", extra_headers=headers)
    [seen] = server.seen
    assert seen.headers["x-gateway-token"] == secret  # it was sent
    error = caught.value
    assert error.code == "llm.invalid_request"
    shown = str(error) + repr(error) + json.dumps(error.to_dict())
    assert secret not in shown
    assert KEY not in shown


# -- an option the provider has no field for: refused before sending, or dropped -------------

REFUSED = [
    ("openai_responses", "gpt-4.1-mini", "stop", ["END"]),
    ("openai_responses", "gpt-4.1-mini", "seed", 4242),
    ("ollama", "llama3.1", "tool_choice", "lookup"),
    ("ollama", "llama3.1", "parallel_tool_calls", False),
    # A level for think is gpt-oss's alone: Ollama answers 400 to it for other models.
    ("ollama", "qwen3:8b", "reasoning_effort", "low"),
    ("deepseek", "deepseek-chat", "seed", 4242),
    ("deepseek", "deepseek-chat", "parallel_tool_calls", False),
    ("mistral", "mistral-small-latest", "reasoning_effort", "low"),
    ("llamacpp", "model.gguf", "reasoning_effort", "low"),
    ("fireworks", "accounts/fireworks/models/llama-v3p3-70b-instruct", "seed", 4242),
    ("together", "meta-llama/Llama-3.3-70B-Instruct-Turbo", "parallel_tool_calls", False),
    ("azure", "my-o4", "reasoning_effort", "low"),  # api-version 2024-10-21 has no such field
    ("xai", "grok-4", "reasoning_effort", "low"),
    ("xai", "grok-4", "stop", ["END"]),
]


def _with_tools(option: str, value: Any) -> dict[str, Any]:
    options: dict[str, Any] = {option: value}
    if option in ("tool_choice", "parallel_tool_calls"):
        options["tools"] = [LOOKUP]
    return options


@pytest.mark.parametrize("mode", ["complete", "stream", "acomplete"])
@pytest.mark.parametrize(("provider", "model", "option", "value"), REFUSED)
def test_an_option_without_a_field_is_refused_before_anything_is_sent(
    server: _Server, provider: str, model: str, option: str, value: Any, mode: str
) -> None:
    llm = client(server, provider, model)
    with pytest.raises(ProviderError) as caught:
        run(llm, mode, **_with_tools(option, value))
    llm.close()
    error = caught.value
    assert error.code == "llm.unsupported_option"
    assert error.details["option"] == option
    assert f"{provider}:{model} cannot take {option}=" in error.message
    assert server.seen == []
    # What the provider has a field for goes, on the same route.
    with client(server, provider, model) as llm:
        llm.complete("hi", temperature=0.37)
    [seen] = server.seen
    assert 0.37 in (seen.body.get("temperature"), seen.body.get("options", {}).get("temperature"))


@pytest.mark.parametrize(
    ("provider", "model", "option", "value", "field_name"),
    [
        ("openai_responses", "gpt-4.1-mini", "stop", ["END"], "stop"),
        ("ollama", "llama3.1", "tool_choice", "lookup", "tool_choice"),
        ("deepseek", "deepseek-chat", "seed", 4242, "seed"),
        ("mistral", "mistral-small-latest", "reasoning_effort", "low", "reasoning_effort"),
    ],
)
def test_drop_unsupported_sends_without_it_and_warns_once_per_provider_option(
    server: _Server,
    caplog: pytest.LogCaptureFixture,
    provider: str,
    model: str,
    option: str,
    value: Any,
    field_name: str,
) -> None:
    options = {**_with_tools(option, value), "temperature": 0.37}
    with (
        caplog.at_level(logging.WARNING, logger="fluid_build.llm"),
        client(server, provider, model, drop_unsupported=True) as llm,
    ):
        assert llm.complete("hi", **options).text == TEXT
        assert run(llm, "stream", **options) == TEXT
    assert len(server.seen) == 2
    for seen in server.seen:
        assert field_name not in seen.body
        assert field_name not in seen.body.get("options", {})
        # What the provider does take still goes.
        assert 0.37 in (
            seen.body.get("temperature"),
            seen.body.get("options", {}).get("temperature"),
        )
    warned = [r for r in caplog.records if f"cannot take {option}=" in r.getMessage()]
    assert len(warned) == 1
    assert f"{provider}:{model}" in warned[0].getMessage()


# -- a real llama.cpp server takes what fluid sends it ---------------------------------------


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from tests.llamacpp_server import llamacpp_server, write_tiny_model

    model = write_tiny_model(tmp_path_factory.mktemp("model") / "tiny-random.gguf")
    with llamacpp_server(model, tmp_path_factory.mktemp("llama"), n_ctx=256) as served:
        yield served.base_url


@pytest.mark.realserver
def test_a_real_llamacpp_server_takes_every_field_and_honours_the_seed(llama: str) -> None:
    """llama.cpp ignores a field it does not know: a seed under another name would leave
    every call to the server's own seed, and the two seeds below would give one text."""
    clock = FakeClock()
    envelope = RetryEnvelope(cooldown=MemoryCooldownStore(), clock=clock, sleep=clock.sleep)
    options: dict[str, Any] = {
        "temperature": 1.0,
        "top_p": 0.95,
        "stop": ["END"],
        "max_output_tokens": 12,
    }
    with LLMClient("llamacpp", "tiny", base_url=llama, envelope=envelope, env={}) as llm:
        first = llm.complete("Say something.", seed=4242, **options)
        again = llm.complete("Say something.", seed=4242, **options)
        other = llm.complete("Say something.", seed=7, **options)
        streamed = [run(llm, "stream", seed=seed, **options) for seed in (4242, 4242, 7)]
    assert first.attempts == again.attempts == other.attempts == 1  # no 400 for any field
    assert 1 <= first.usage.output_tokens <= 12
    assert first.text == again.text != other.text
    assert streamed[0] == streamed[1] != streamed[2]
