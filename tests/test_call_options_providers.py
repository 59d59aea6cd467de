"""Call options on the wire for Anthropic, Gemini, Vertex AI and Bedrock (issue 34 items 1-3).

A real loopback server keeps every request (path, headers, JSON body) and answers with a
recorded answer of the provider (tests/data/provider_answers.json): each option must
arrive under the provider's own field (docs/llm-providers.md, "Call options"), for a
plain call and a stream; ``extra_body`` is merged key by key, ``extra_headers`` arrive
(and on Bedrock are signed); an option the provider has no field for is refused before
anything is sent, or dropped with one warning under ``drop_unsupported``.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import BaseModel

from fluid_build.copilot import LLMClient
from fluid_build.copilot.agents.errors import AgentExecutionError, ProviderError
from fluid_build.copilot.call import options as call_options
from tests.fakes import FakeClock, aws_sandbox, clocked_envelope
from tests.test_bedrock import _expected_signature
from tests.transport_calls import TRANSPORTS, call_over, transport_env

ROWS = {
    row["id"]: row
    for row in json.loads(
        (Path(__file__).parent / "data" / "provider_answers.json").read_text(encoding="utf-8")
    )
}
ACCESS = "AKIDEXAMPLE"
SECRET = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
LOOKUP = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Look a word up.",
        "parameters": {"type": "object", "properties": {"word": {"type": "string"}}},
    },
}
TRACE = {"x-trace-id": "trace-4242"}


def _wire(row: dict[str, Any]) -> tuple[str, bytes]:
    kind = row["headers"].get("content-type", "application/json")
    if row["provider"] == "bedrock" and "stream" in row:
        return kind, base64.b64decode("".join(row["stream"]))
    if "stream" in row:
        return kind, "\n".join(row["stream"]).encode()
    return kind, json.dumps(row["body"], ensure_ascii=False).encode()


@dataclass
class Provider:
    name: str
    model: str
    answer: str  # the recorded row a plain call gets
    streamed: str  # the recorded row a stream gets
    make: Callable[..., LLMClient]  # (url, model, **more LLMClient arguments)


def _client(provider: str, **more: Any) -> Callable[..., LLMClient]:
    def make(url: str, model: str, **call: Any) -> LLMClient:
        return LLMClient(
            provider,
            model,
            base_url=url,
            envelope=clocked_envelope(FakeClock()),
            **{**more, **call},
        )

    return make


#: What each provider's client reads from ``env=`` here.
ENVS: dict[str, dict[str, str]] = {
    "anthropic": {},
    "gemini": {},
    "vertex": {"GOOGLE_CLOUD_PROJECT": "my-project"},
    "bedrock": {"AWS_REGION": "us-east-1"},
}
BEDROCK_CLAUDE = "us.anthropic.claude-sonnet-4-5-20250929-v1:0"
#: The model each thinking test names: Bedrock's default here is Nova, which has none.
THINKER: dict[str, str | None] = {"anthropic": None, "bedrock": BEDROCK_CLAUDE}
PROVIDERS = {
    "anthropic": Provider(
        "anthropic",
        "claude-sonnet-4-5",
        "anthropic-cache-read-and-write",
        "anthropic-stream-text-with-ping",
        _client("anthropic", api_key="sk-ant-test", env=ENVS["anthropic"]),
    ),
    "gemini": Provider(
        "gemini",
        "gemini-2.5-flash",
        "gemini-thoughts-token-count",
        "gemini-stream-thought-parts",
        _client("gemini", api_key="g-test", env=ENVS["gemini"]),
    ),
    "vertex": Provider(
        "vertex",
        "gemini-2.5-flash",
        "vertex-text-us-central1",
        "vertex-stream-global-signature-chunks",
        _client("vertex", api_key="ya29.test", env=ENVS["vertex"]),
    ),
    "bedrock": Provider(
        "bedrock",
        "amazon.nova-pro-v1:0",
        "bedrock-text",
        "bedrock-stream-text",
        _client("bedrock", env=ENVS["bedrock"]),
    ),
}


class Recorder:
    """A loopback provider: each POST kept as an ``httpx.Request`` (path, headers, body)
    and answered with the recorded plain answer, or the recorded stream for a stream."""

    def __init__(self, provider: Provider) -> None:
        self.provider = provider.name
        self.seen: list[httpx.Request] = []
        outer = self
        plain, streamed = _wire(ROWS[provider.answer]), _wire(ROWS[provider.streamed])

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                request = httpx.Request(
                    "POST",
                    outer.url + self.path,
                    headers=[(k.lower(), v) for k, v in self.headers.items()],
                    content=body,
                )
                outer.seen.append(request)
                stream = "stream" in self.path.lower() or json.loads(body).get("stream")
                kind, data = streamed if stream else plain
                self.send_response(200)
                self.send_header("content-type", kind)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()

    def bodies(self) -> list[dict[str, Any]]:
        return [json.loads(request.content) for request in self.seen]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


@pytest.fixture(autouse=True)
def clean_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Loopback only (no proxy), the AWS chain reading only this test's keys, and the
    once-per-process drop warnings forgotten."""
    proxies = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")
    for name in proxies:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    aws_sandbox(monkeypatch, tmp_path, keys=(ACCESS, SECRET))
    monkeypatch.setattr(call_options, "_warned", set())


@pytest.fixture
def recorder(request: pytest.FixtureRequest) -> Iterator[Recorder]:
    server = Recorder(PROVIDERS[request.param])
    try:
        yield server
    finally:
        server.close()


def _call(
    server: Recorder, how: str, messages: Any = "hi", model: str | None = None, **options: Any
) -> Any:
    provider = PROVIDERS[server.provider]
    with provider.make(server.url, model or provider.model) as client:
        if how == "stream":
            events = list(client.stream(messages, **options))
            return events[-1].completion
        return client.complete(messages, **options)


def _signed(request: httpx.Request) -> bool:
    return request.headers["authorization"].endswith(
        "Signature=" + _expected_signature(request, SECRET, "us-east-1")
    )


#: What each provider is given, and the body it must receive (each option under its
#: field, with the value given). Anthropic's thinking has its own tests: it does not go
#: with temperature.
SAMPLING = {"temperature": 0.37, "top_p": 0.81, "stop": ["END"], "max_output_tokens": 2000}
SENT: dict[str, tuple[dict[str, Any], Callable[[dict[str, Any]], Any], Any]] = {
    "anthropic": (
        {
            "temperature": 0.37,  # top_p alone below: recent Claude models take one of the two
            "stop": ["END"],
            "max_output_tokens": 2000,
            "tools": [LOOKUP],
            "tool_choice": "lookup",
            "parallel_tool_calls": False,
        },
        lambda b: (
            {k: b.get(k) for k in ("temperature", "top_p", "stop_sequences", "max_tokens")}
            | {"tool_choice": b.get("tool_choice")}
        ),
        {
            "temperature": 0.37,
            "top_p": None,
            "stop_sequences": ["END"],
            "max_tokens": 2000,
            "tool_choice": {"type": "tool", "name": "lookup", "disable_parallel_tool_use": True},
        },
    ),
    "gemini": (
        {
            **SAMPLING,
            "seed": 4242,
            "reasoning_effort": "medium",
            "tools": [LOOKUP],
            "tool_choice": "lookup",
        },
        lambda b: {
            "generationConfig": b.get("generationConfig"),
            "toolConfig": b.get("toolConfig"),
        },
        {
            "generationConfig": {
                "temperature": 0.37,
                "topP": 0.81,
                "stopSequences": ["END"],
                "seed": 4242,
                "maxOutputTokens": 2000,
                "thinkingConfig": {"thinkingBudget": 8192},
            },
            "toolConfig": {
                "functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["lookup"]}
            },
        },
    ),
    "bedrock": (
        {**SAMPLING, "tools": [LOOKUP], "tool_choice": "lookup"},
        lambda b: {
            "inferenceConfig": b.get("inferenceConfig"),
            "toolChoice": b["toolConfig"].get("toolChoice"),
        },
        {
            "inferenceConfig": {
                "maxTokens": 2000,
                "temperature": 0.37,
                "topP": 0.81,
                "stopSequences": ["END"],
            },
            "toolChoice": {"tool": {"name": "lookup"}},
        },
    ),
}
SENT["vertex"] = SENT["gemini"]
CASES = [(p, how) for p in PROVIDERS for how in ("complete", "stream")]


@pytest.mark.parametrize(
    ("recorder", "how"), CASES, indirect=["recorder"], ids=[f"{p}-{h}" for p, h in CASES]
)
def test_each_option_arrives_under_the_providers_field(recorder: Recorder, how: str) -> None:
    provider = recorder.provider
    options, pick, expected = SENT[provider]
    _call(recorder, how, extra_headers=TRACE, **options)
    (request,) = recorder.seen
    assert pick(json.loads(request.content)) == expected
    assert request.headers["x-trace-id"] == "trace-4242"
    if provider == "bedrock":  # the caller's header is among those signed, and verifies
        assert "x-trace-id" in request.headers["authorization"].split("SignedHeaders=")[1]
        assert _signed(request)


@pytest.mark.parametrize("recorder", ["anthropic"], indirect=True)
@pytest.mark.parametrize("how", ["complete", "stream"])
def test_anthropic_top_p_arrives_as_top_p(recorder: Recorder, how: str) -> None:
    _call(recorder, how, top_p=0.81)
    (body,) = recorder.bodies()
    assert (body["top_p"], "temperature" in body) == (0.81, False)


def _one(param: str) -> Any:
    return pytest.mark.parametrize("recorder", [param], indirect=True)


ALL = pytest.mark.parametrize("recorder", list(PROVIDERS), indirect=True)


class Answer(BaseModel):
    word: str


# -- extra_body: merged key by key, last ----------------------------------------------


@pytest.mark.parametrize("recorder", ["gemini", "vertex"], indirect=True)
def test_extra_body_adds_to_generation_config_and_keeps_temperature_and_schema(
    recorder: Recorder,
) -> None:
    _call(
        recorder,
        "complete",
        temperature=0.37,
        response_model=Answer,
        validate=False,  # the recorded answer is not an Answer
        extra_body={"generationConfig": {"responseLogprobs": True}},
    )
    config = recorder.bodies()[0]["generationConfig"]
    assert config["temperature"] == 0.37
    assert config["responseLogprobs"] is True
    assert config["responseMimeType"] == "application/json"
    assert config["responseJsonSchema"]["properties"]["word"]["type"] == "string"


@_one("anthropic")
def test_extra_body_adds_to_anthropics_tool_choice(recorder: Recorder) -> None:
    _call(
        recorder,
        "complete",
        tools=[LOOKUP],
        tool_choice="auto",
        temperature=0.37,
        extra={"tool_choice": {"disable_parallel_tool_use": True}, "top_k": 7},
    )
    (body,) = recorder.bodies()
    assert body["tool_choice"] == {"type": "auto", "disable_parallel_tool_use": True}
    assert (body["top_k"], body["temperature"]) == (7, 0.37)


@_one("bedrock")
def test_extra_body_is_merged_before_the_body_is_signed(recorder: Recorder) -> None:
    _call(
        recorder,
        "stream",
        model=BEDROCK_CLAUDE,
        reasoning_effort="low",
        max_output_tokens=3000,
        extra_body={"additionalModelRequestFields": {"top_k": 40}, "inferenceConfig": {}},
    )
    (request,) = recorder.seen
    body = json.loads(request.content)
    assert body["additionalModelRequestFields"] == {
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "top_k": 40,
    }
    assert body["inferenceConfig"] == {"maxTokens": 3000}
    assert _signed(request)


# -- refused before sending, or dropped with one warning ------------------------------

UNSUPPORTED = {
    "anthropic": ("seed", 4242),
    "gemini": ("parallel_tool_calls", False),
    "vertex": ("parallel_tool_calls", False),
    "bedrock": ("seed", 4242),
}


@ALL
@pytest.mark.parametrize("how", ["complete", "stream"])
def test_an_option_the_provider_has_no_field_for_is_refused_before_sending(
    recorder: Recorder, how: str
) -> None:
    option, value = UNSUPPORTED[recorder.provider]
    with pytest.raises(ProviderError) as caught:
        _call(recorder, how, tools=[LOOKUP], temperature=0.37, **{option: value})
    assert caught.value.code == "llm.unsupported_option"
    assert caught.value.details["options"] == [option]  # temperature is taken
    assert recorder.provider in str(caught.value)
    assert recorder.seen == []


@ALL
def test_drop_unsupported_sends_without_it_and_warns_once(
    recorder: Recorder, caplog: pytest.LogCaptureFixture
) -> None:
    option, value = UNSUPPORTED[recorder.provider]
    caplog.set_level(logging.WARNING, logger="fluid_build")
    for how in ("complete", "stream"):
        _call(
            recorder,
            how,
            tools=[LOOKUP],
            temperature=0.37,
            drop_unsupported=True,
            **{option: value},
        )
    assert len(recorder.seen) == 2
    for body in recorder.bodies():
        text = json.dumps(body)
        assert "0.37" in text  # the option it takes went out
        assert option.partition("_")[0] not in text  # "seed", "parallel"
    warned = [r for r in caplog.records if f"{option}=" in r.getMessage()]
    assert len(warned) == 1
    assert recorder.provider in warned[0].getMessage()


# -- tool choice, each value ------------------------------------------------------------

CHOICES = {
    "anthropic": lambda b: b.get("tool_choice"),
    "gemini": lambda b: b.get("toolConfig"),
    "vertex": lambda b: b.get("toolConfig"),
    "bedrock": lambda b: (
        (b.get("toolConfig") or {}).get("toolChoice", "no toolChoice")
        if "toolConfig" in b
        else "no toolConfig"
    ),
}
EXPECTED_CHOICE: dict[str, dict[str, Any]] = {
    "anthropic": {
        "auto": {"type": "auto"},
        "none": {"type": "none"},
        "required": {"type": "any"},
        None: None,
    },
    "gemini": {
        "auto": {"functionCallingConfig": {"mode": "AUTO"}},
        "none": {"functionCallingConfig": {"mode": "NONE"}},
        "required": {"functionCallingConfig": {"mode": "ANY"}},
        None: None,
    },
    "bedrock": {
        "auto": {"auto": {}},
        "none": "no toolConfig",  # Converse has no "none": the tools are left out
        "required": {"any": {}},
        None: "no toolChoice",
    },
}
EXPECTED_CHOICE["vertex"] = EXPECTED_CHOICE["gemini"]


@ALL
@pytest.mark.parametrize("choice", ["auto", "none", "required", None])
def test_each_tool_choice_value(recorder: Recorder, choice: str | None) -> None:
    _call(recorder, "complete", tools=[LOOKUP], tool_choice=choice)
    (body,) = recorder.bodies()
    assert CHOICES[recorder.provider](body) == EXPECTED_CHOICE[recorder.provider][choice]


TOOL_TURNS = [
    {"role": "user", "content": "look up fluid"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "t1", "name": "lookup", "arguments": {"word": "fluid"}}],
    },
    {"role": "tool", "tool_call_id": "t1", "name": "lookup", "content": "a liquid"},
]


@_one("bedrock")
def test_bedrock_refuses_tool_choice_none_once_the_conversation_used_tools(
    recorder: Recorder,
) -> None:
    with pytest.raises(ProviderError) as caught:
        _call(recorder, "complete", TOOL_TURNS, tools=[LOOKUP], tool_choice="none")
    assert (caught.value.code, caught.value.details["option"]) == (
        "llm.unsupported_option",
        "tool_choice",
    )
    assert "no 'none'" in str(caught.value)
    assert recorder.seen == []


@pytest.mark.parametrize("recorder", ["anthropic", "bedrock"], indirect=True)
@pytest.mark.parametrize(
    ("choice", "forced", "offered"),
    [
        (None, "any", True),
        ("auto", "any", True),
        ("none", "respond_Answer", True),
        ("required", "any", False),
        ("lookup", "lookup", False),
    ],
)
def test_a_tool_choice_beside_a_response_model(
    recorder: Recorder, choice: str | None, forced: str, offered: bool
) -> None:
    """The structured answer is a tool fluid forces: the caller's choice is read against
    the caller's own tools (docs/llm-providers.md, "Call options")."""
    _call(
        recorder,
        "complete",
        tools=[LOOKUP],
        tool_choice=choice,
        response_model=Answer,
        validate=False,  # the recorded answer is not an Answer
    )
    (body,) = recorder.bodies()
    if recorder.provider == "anthropic":
        sent = body["tool_choice"]
        names = [t["name"] for t in body["tools"]]
        kind = sent["type"] if sent["type"] == "any" else sent["name"]
    else:
        sent = body["toolConfig"]["toolChoice"]
        names = [t["toolSpec"]["name"] for t in body["toolConfig"]["tools"]]
        kind = "any" if "any" in sent else sent["tool"]["name"]
    assert kind == forced
    assert ("respond_Answer" in names) is offered
    assert "lookup" in names


# -- reasoning effort -------------------------------------------------------------------


@_one("anthropic")
@pytest.mark.parametrize(
    ("effort", "cap", "budget", "max_tokens"),
    [
        ("low", None, 1024, 1024 + 4096),
        ("medium", None, 8192, 8192 + 4096),
        ("high", None, 24576, 24576 + 4096),
        ("high", 30000, 24576, 30000),
        ("high", 10000, 5000, 10000),
        ("medium", 1500, 1024, 1500),
    ],
)
@pytest.mark.parametrize("how", ["complete", "stream"])
def test_anthropic_reasoning_effort_is_a_thinking_budget_under_max_tokens(
    recorder: Recorder, effort: str, cap: int | None, budget: int, max_tokens: int, how: str
) -> None:
    _call(recorder, how, reasoning_effort=effort, max_output_tokens=cap)
    (body,) = recorder.bodies()
    assert body["thinking"] == {"type": "enabled", "budget_tokens": budget}
    assert body["max_tokens"] == max_tokens > budget


@pytest.mark.parametrize("recorder", ["anthropic", "bedrock"], indirect=True)
def test_a_cap_too_small_to_think_in_is_refused_before_sending(recorder: Recorder) -> None:
    with pytest.raises(ProviderError) as caught:
        _call(
            recorder,
            "complete",
            model=THINKER[recorder.provider],
            reasoning_effort="low",
            max_output_tokens=1024,
        )
    assert caught.value.code == "llm.unsupported_option"
    assert caught.value.details["option"] == "reasoning_effort"
    assert "max_output_tokens" in str(caught.value)
    assert recorder.seen == []


@pytest.mark.parametrize("recorder", ["anthropic", "bedrock"], indirect=True)
@pytest.mark.parametrize(
    "forcing",
    [{"response_model": Answer}, {"tools": [LOOKUP], "tool_choice": "required"}],
    ids=["response_model", "required"],
)
def test_thinking_with_a_forced_tool_is_refused_before_sending(
    recorder: Recorder, forcing: dict[str, Any]
) -> None:
    with pytest.raises(ProviderError) as caught:
        _call(
            recorder,
            "complete",
            model=THINKER[recorder.provider],
            reasoning_effort="medium",
            **forcing,
        )
    assert caught.value.code == "llm.unsupported_option"
    assert caught.value.details["option"] == "reasoning_effort"
    assert "extended thinking allows only tool_choice 'auto' or 'none'" in str(caught.value)
    assert recorder.seen == []


@pytest.mark.parametrize("recorder", ["anthropic", "bedrock"], indirect=True)
@pytest.mark.parametrize(
    "forcing",
    [
        {"response_model": Answer},
        {"tools": [LOOKUP], "tool_choice": "required"},
        {"max_output_tokens": 1024},
    ],
    ids=["response_model", "required", "tiny-cap"],
)
def test_drop_unsupported_sends_the_call_without_thinking_it_cannot_have(
    recorder: Recorder, forcing: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    call_options._warned.discard(f"{recorder.provider}:reasoning_effort")
    # The recorded answer is text, so a response_model call ends in a parse error after it.
    parsed = pytest.raises(AgentExecutionError, match="not valid JSON")
    with (
        caplog.at_level(logging.WARNING, logger="fluid_build.llm"),
        parsed if "response_model" in forcing else contextlib.nullcontext(),
    ):
        _call(
            recorder,
            "complete",
            model=THINKER[recorder.provider],
            reasoning_effort="medium",
            drop_unsupported=True,
            **forcing,
        )
    (body,) = recorder.bodies()
    assert "thinking" not in json.dumps(body)
    warned = [r.getMessage() for r in caplog.records if "reasoning_effort=" in r.getMessage()]
    assert len(warned) == 1
    assert "dropped (drop_unsupported)" in warned[0]


BEDROCK_OPUS_47 = "us.anthropic.claude-opus-4-7"


@pytest.mark.parametrize(
    ("recorder", "model"),
    [
        ("anthropic", "claude-opus-4-7"),
        ("anthropic", "claude-sonnet-4-6"),
        ("bedrock", BEDROCK_OPUS_47),
    ],
    indirect=["recorder"],
)
@pytest.mark.parametrize("cap", [None, 512])
def test_an_adaptive_claude_thinks_by_effort_not_by_budget(
    recorder: Recorder, model: str, cap: int | None
) -> None:
    _call(recorder, "complete", model=model, reasoning_effort="low", max_output_tokens=cap)
    (body,) = recorder.bodies()
    fields = body.get("additionalModelRequestFields", body)
    assert fields["thinking"] == {"type": "adaptive"}
    assert fields["output_config"] == {"effort": "low"}
    sent = body["inferenceConfig"]["maxTokens"] if "inferenceConfig" in body else body["max_tokens"]
    assert sent == (cap if cap is not None else 1024 + 4096)


@_one("bedrock")
def test_bedrock_claude_thinks_through_additional_model_request_fields(
    recorder: Recorder,
) -> None:
    _call(recorder, "complete", model=BEDROCK_CLAUDE, reasoning_effort="high")
    (request,) = recorder.seen
    body = json.loads(request.content)
    assert body["additionalModelRequestFields"] == {
        "thinking": {"type": "enabled", "budget_tokens": 24576}
    }
    assert body["inferenceConfig"] == {"maxTokens": 24576 + 4096}
    assert _signed(request)


@pytest.mark.parametrize(
    ("recorder", "model"),
    [
        ("anthropic", "claude-3-5-haiku-20241022"),
        ("gemini", "gemini-2.0-flash"),
        ("vertex", "gemma-3-27b-it"),
        ("bedrock", "amazon.nova-micro-v1:0"),
        ("bedrock", "anthropic.claude-3-5-sonnet-20240620-v1:0"),
    ],
    indirect=["recorder"],
)
def test_reasoning_effort_on_a_model_without_thinking_is_refused(
    recorder: Recorder, model: str
) -> None:
    with pytest.raises(ProviderError) as caught:
        _call(recorder, "complete", model=model, stop=["END"], reasoning_effort="low")
    assert caught.value.details["options"] == ["reasoning_effort"]  # stop is taken
    assert recorder.seen == []


@pytest.mark.parametrize("recorder", ["gemini", "vertex"], indirect=True)
@pytest.mark.parametrize(
    ("model", "thinking"),
    [
        ("gemini-3-pro-preview", {"thinkingLevel": "HIGH"}),
        ("gemini-3.1-flash", {"thinkingLevel": "HIGH"}),
        ("gemini-2.5-pro", {"thinkingBudget": 24576}),
        ("gemini-flash-latest", {"thinkingBudget": 24576}),
    ],
)
def test_gemini_thinks_by_level_from_gemini_3_and_by_budget_before(
    recorder: Recorder, model: str, thinking: dict[str, Any]
) -> None:
    _call(recorder, "stream", model=model, reasoning_effort="high")
    (body,) = recorder.bodies()
    assert body["generationConfig"] == {"thinkingConfig": thinking}


OWN_HEADER = {
    "anthropic": ("Anthropic-Version", "2099-01-01"),
    "gemini": ("X-Goog-Api-Key", "g-other"),
    "vertex": ("Authorization", "Bearer ya29.other"),
    "bedrock": ("Accept", "application/json"),
}


@ALL
def test_an_extra_header_replaces_fluids_own_of_the_same_name_in_any_case(
    recorder: Recorder,
) -> None:
    name, value = OWN_HEADER[recorder.provider]
    _call(recorder, "stream", extra_headers={name: value})
    (request,) = recorder.seen
    assert request.headers.get_list(name) == [value]  # sent once, the caller's
    if recorder.provider == "bedrock":
        assert _signed(request)


# -- every transport: the same fields, and on Bedrock the same signature ----------------

ON_EVERY_TRANSPORT = {
    "anthropic": ({"temperature": 0.37}, lambda b: b["temperature"]),
    "gemini": ({"seed": 4242}, lambda b: b["generationConfig"]["seed"]),
    "vertex": ({"top_p": 0.81}, lambda b: b["generationConfig"]["topP"]),
    "bedrock": ({"stop": ["END"]}, lambda b: b["inferenceConfig"]["stopSequences"]),
}


@ALL
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_options_set_on_the_client_reach_the_wire_on_every_transport(
    recorder: Recorder, transport: str
) -> None:
    """Sync and async, fluid's pools and the caller's: one adapter builds every request,
    and Bedrock's signature covers the caller's header and merged body on each."""
    provider = PROVIDERS[recorder.provider]
    option, pick = ON_EVERY_TRANSPORT[recorder.provider]
    options = {**option, "extra_headers": TRACE, "extra_body": {"metadata": {"run": "r-1"}}}
    more = {"env": {**ENVS[recorder.provider], **transport_env(transport)}}

    def client(**http: Any) -> LLMClient:
        return provider.make(recorder.url, provider.model, options=options, **more, **http)

    call_over(transport, client, "complete")
    call_over(transport, client, "stream")
    assert len(recorder.seen) == 2
    for request in recorder.seen:
        body = json.loads(request.content)
        assert pick(body) == next(iter(option.values()))
        assert body["metadata"] == {"run": "r-1"}
        assert request.headers["x-trace-id"] == "trace-4242"
        if recorder.provider == "bedrock":
            assert _signed(request)
