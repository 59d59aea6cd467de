"""Build the shipped cassettes in corpus/ from real, sourced payloads.

These are not recordings (there are no provider keys where they were made):
each error answer is a payload from tests/data/provider_errors.json (which
names where every payload comes from) or a documented one cited here, and
each success answer follows the provider's documented response shape. Every
cassette says which in its ``source``.

    python corpus/make_cassettes.py          # (re)write corpus/*.json
    python corpus/make_cassettes.py --check  # exit 1 if a file differs from what it would write

Deterministic: no clocks, no randomness, so rerunning reproduces every file
byte for byte. Answers pass through the same sanitizing as ``fluid corpus
record`` (credential headers dropped, bodies redacted).
"""

from __future__ import annotations

import base64
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "src"))

from fluid_build.copilot.schema.strict import harden_schema  # noqa: E402
from fluid_build.corpus.cassette import (  # noqa: E402
    CASSETTE_VERSION,
    CallRecipe,
    Cassette,
    DataProduct,
    Exchange,
    ExchangeRequest,
    ExchangeResponse,
    Expectation,
    dump_cassette,
)
from fluid_build.corpus.record import sanitize_response  # noqa: E402

PAYLOADS: dict[str, dict[str, Any]] = {
    case["id"]: case
    for case in json.loads(
        (ROOT / "tests" / "data" / "provider_errors.json").read_text(encoding="utf-8")
    )
}
NOT_RECORDED = "constructed from documented payloads, not a recording"

PROMPT = "Plan a daily sales_orders data product: its name and the build steps."
SYSTEM = "You are a data engineer. Answer with JSON only."
PLAN = {
    "name": "sales_orders",
    "steps": [
        "Stage raw orders and order lines; deduplicate on order_line_id.",
        "Build dim_customer and dim_product with surrogate keys.",
        "Build fct_order_lines at one row per order line, with revenue and quantity.",
    ],
}
# The first answer of the schema-correction loop: `steps` is a string, not a list.
BAD_PLAN = {"name": "sales_orders", "steps": "stage, model, test"}
DATA_PRODUCT = {
    "name": "sales_orders_daily",
    "owner": None,
    "tags": ["sales", "daily"],
    "properties": {"refresh": "daily", "retention_days": 30, "pii": False},
}


# -- providers: where a call goes and what a success looks like -----------------------------


class Provider:
    name: str
    model: str
    env: dict[str, str]
    path: str
    stream_path: str
    body_model: bool = True  # whether the request body names the model
    # What the caller tells fluid_build about a model it cannot know (Azure deployments
    # and OpenAI-compatible servers name models freely), as a real caller would.
    matrix: dict[str, Any] = {}  # noqa: RUF012 - read-only class data
    success_doc: str
    stream_doc: str
    json_headers: dict[str, str]
    stream_headers: dict[str, str]

    def request(self, *, stream: bool = False, model: str | None = None) -> ExchangeRequest:
        used = model or self.model
        return ExchangeRequest(
            method="POST",
            path=self.stream_path if stream else self.path,
            model=used if self.body_model else None,
        )

    def success(self, answer: dict[str, Any], *, schema: str, n: int) -> dict[str, Any]:
        raise NotImplementedError

    def stream(self, answer: dict[str, Any], *, schema: str) -> str:
        raise NotImplementedError


def _pieces(text: str, parts: int = 3) -> list[str]:
    size = -(-len(text) // parts)
    return [text[i : i + size] for i in range(0, len(text), size)]


class OpenAI(Provider):
    name = "openai"
    model = "gpt-4o-mini"
    env: dict[str, str] = {}  # noqa: RUF012 - read-only class data
    path = stream_path = "/v1/chat/completions"
    served_model = "gpt-4o-mini-2024-07-18"
    success_doc = (
        "success: OpenAI chat completion object "
        "(https://platform.openai.com/docs/api-reference/chat/object)"
    )
    stream_doc = (
        "stream: OpenAI chat completion chunk object with stream_options.include_usage "
        "(https://platform.openai.com/docs/api-reference/chat-streaming)"
    )
    json_headers = {"content-type": "application/json", "x-request-id": "req_corpus_0001"}  # noqa: RUF012
    stream_headers = {"content-type": "text/event-stream; charset=utf-8"}  # noqa: RUF012
    usage_in_stream = True
    system_fingerprint: str | None = "fp_corpus01"

    def success(self, answer: dict[str, Any], *, schema: str, n: int) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": f"chatcmpl-corpus{n:04d}",
            "object": "chat.completion",
            "created": 1735689600 + n,
            "model": self.served_model,
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": json.dumps(answer),
                        "refusal": None,
                    },
                    "logprobs": None,
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 96, "completion_tokens": 58, "total_tokens": 154},
        }
        if self.system_fingerprint:
            body["system_fingerprint"] = self.system_fingerprint
        return body

    def _chunk(self, n: int, choices: list[dict[str, Any]], **extra: Any) -> str:
        chunk = {
            "id": f"chatcmpl-corpus{n:04d}",
            "object": "chat.completion.chunk",
            "created": 1735689600 + n,
            "model": self.served_model,
            "choices": choices,
            **extra,
        }
        return f"data: {json.dumps(chunk)}\n\n"

    def stream(self, answer: dict[str, Any], *, schema: str) -> str:
        n = 90
        out = [self._chunk(n, [_delta({"role": "assistant", "content": ""})])]
        out += [
            self._chunk(n, [_delta({"content": piece})]) for piece in _pieces(json.dumps(answer))
        ]
        out.append(self._chunk(n, [_delta({}, finish="stop")]))
        if self.usage_in_stream:
            usage = {"prompt_tokens": 96, "completion_tokens": 58, "total_tokens": 154}
            out.append(self._chunk(n, [], usage=usage))
        out.append("data: [DONE]\n\n")
        return "".join(out)


def _delta(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}


class Azure(OpenAI):
    name = "azure"
    model = "fluid-gpt-4o-mini"  # the deployment name
    env = {"AZURE_OPENAI_ENDPOINT": "https://fluid-corpus.openai.azure.com"}  # noqa: RUF012
    matrix = {"context_window": 128_000, "max_output_tokens": 16_384}  # noqa: RUF012 - gpt-4o-mini
    path = stream_path = "/openai/deployments/fluid-gpt-4o-mini/chat/completions"
    success_doc = (
        "success: Azure OpenAI chat completions response, OpenAI's shape plus "
        "prompt_filter_results / content_filter_results "
        "(https://learn.microsoft.com/azure/ai-services/openai/reference#chat-completions)"
    )
    stream_doc = (
        "stream: Azure OpenAI streams OpenAI chunks after a first chunk carrying only "
        "prompt_filter_results (https://learn.microsoft.com/azure/ai-services/openai/concepts/"
        "content-filter#streaming-scenarios)"
    )
    json_headers = {"content-type": "application/json", "apim-request-id": "corpus-0001"}  # noqa: RUF012
    system_fingerprint = "fp_corpus01"
    _filters = {  # noqa: RUF012
        "hate": {"filtered": False, "severity": "safe"},
        "self_harm": {"filtered": False, "severity": "safe"},
        "sexual": {"filtered": False, "severity": "safe"},
        "violence": {"filtered": False, "severity": "safe"},
    }

    def success(self, answer: dict[str, Any], *, schema: str, n: int) -> dict[str, Any]:
        body = super().success(answer, schema=schema, n=n)
        body["prompt_filter_results"] = [
            {"prompt_index": 0, "content_filter_results": self._filters}
        ]
        body["choices"][0]["content_filter_results"] = self._filters
        return body

    def stream(self, answer: dict[str, Any], *, schema: str) -> str:
        first = {
            "choices": [],
            "created": 0,
            "id": "",
            "model": "",
            "object": "",
            "prompt_filter_results": [{"prompt_index": 0, "content_filter_results": self._filters}],
        }
        return f"data: {json.dumps(first)}\n\n" + super().stream(answer, schema=schema)


class VLLM(OpenAI):
    name = "vllm"
    model = "Qwen/Qwen2.5-7B-Instruct"
    served_model = model
    env = {"OPENAI_BASE_URL": "http://127.0.0.1:8000/v1"}  # noqa: RUF012
    matrix = {"context_window": 32_768}  # noqa: RUF012 - Qwen2.5-7B-Instruct's --max-model-len
    success_doc = (
        "success: vLLM's OpenAI-compatible server answers in OpenAI's chat completion shape "
        "(https://docs.vllm.ai/en/latest/serving/openai_compatible_server.html)"
    )
    stream_doc = (
        "stream: OpenAI chat completion chunks; no usage chunk, as from a server that does "
        "not report it (fluid_build asks with stream_options.include_usage; a stream without "
        "one is unpriced)"
    )
    json_headers = {"content-type": "application/json"}  # noqa: RUF012
    usage_in_stream = False
    system_fingerprint = None


class Anthropic(Provider):
    name = "anthropic"
    model = "claude-sonnet-4-6"
    env: dict[str, str] = {}  # noqa: RUF012
    path = stream_path = "/v1/messages"
    success_doc = (
        "success: Anthropic Message object with a tool_use block (structured output through "
        "a forced tool; https://docs.anthropic.com/en/api/messages)"
    )
    stream_doc = (
        "stream: Anthropic message_start / content_block_* / input_json_delta / message_delta "
        "events (https://docs.anthropic.com/en/docs/build-with-claude/streaming)"
    )
    json_headers = {"content-type": "application/json", "request-id": "req_corpus0001"}  # noqa: RUF012
    stream_headers = {"content-type": "text/event-stream; charset=utf-8"}  # noqa: RUF012

    def success(self, answer: dict[str, Any], *, schema: str, n: int) -> dict[str, Any]:
        return {
            "id": f"msg_corpus{n:04d}",
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [
                {
                    "type": "tool_use",
                    "id": f"toolu_corpus{n:04d}",
                    "name": f"respond_{schema}",
                    "input": answer,
                }
            ],
            "stop_reason": "tool_use",
            "stop_sequence": None,
            "usage": {"input_tokens": 412, "output_tokens": 71},
        }

    def stream(self, answer: dict[str, Any], *, schema: str) -> str:
        def event(name: str, data: dict[str, Any]) -> str:
            return f"event: {name}\ndata: {json.dumps(data)}\n\n"

        message = {
            "id": "msg_corpus0090",
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": self.model,
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 412, "output_tokens": 1},
        }
        block = {
            "type": "tool_use",
            "id": "toolu_corpus0090",
            "name": f"respond_{schema}",
            "input": {},
        }
        out = [
            event("message_start", {"type": "message_start", "message": message}),
            event(
                "content_block_start",
                {"type": "content_block_start", "index": 0, "content_block": block},
            ),
            event("ping", {"type": "ping"}),
        ]
        for piece in _pieces(json.dumps(answer)):
            delta = {"type": "input_json_delta", "partial_json": piece}
            out.append(
                event(
                    "content_block_delta",
                    {"type": "content_block_delta", "index": 0, "delta": delta},
                )
            )
        out += [
            event("content_block_stop", {"type": "content_block_stop", "index": 0}),
            event(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": "tool_use", "stop_sequence": None},
                    "usage": {"output_tokens": 71},
                },
            ),
            event("message_stop", {"type": "message_stop"}),
        ]
        return "".join(out)


class Gemini(Provider):
    name = "gemini"
    model = "gemini-2.5-flash"
    env: dict[str, str] = {}  # noqa: RUF012
    path = "/v1beta/models/gemini-2.5-flash:generateContent"
    stream_path = "/v1beta/models/gemini-2.5-flash:streamGenerateContent"
    body_model = False  # the model is in the path
    success_doc = (
        "success: Gemini GenerateContentResponse "
        "(https://ai.google.dev/api/generate-content#generatecontentresponse)"
    )
    stream_doc = (
        "stream: GenerateContentResponse chunks as server-sent events with alt=sse, "
        "CRLF-separated (https://ai.google.dev/api/generate-content#method:-models.streamgeneratecontent)"
    )
    json_headers = {"content-type": "application/json; charset=UTF-8"}  # noqa: RUF012
    stream_headers = {"content-type": "text/event-stream"}  # noqa: RUF012

    def _response(self, text: str, *, n: int, final: bool) -> dict[str, Any]:
        candidate: dict[str, Any] = {"content": {"parts": [{"text": text}], "role": "model"}}
        if final:
            candidate["finishReason"] = "STOP"
        candidate["index"] = 0
        return {
            "candidates": [candidate],
            "usageMetadata": {
                "promptTokenCount": 88,
                "candidatesTokenCount": 64,
                "totalTokenCount": 152,
            },
            "modelVersion": self.model,
            "responseId": f"corpus{n:04d}",
        }

    def success(self, answer: dict[str, Any], *, schema: str, n: int) -> dict[str, Any]:
        return self._response(json.dumps(answer), n=n, final=True)

    def stream(self, answer: dict[str, Any], *, schema: str) -> str:
        pieces = _pieces(json.dumps(answer))
        return "".join(
            f"data: {json.dumps(self._response(p, n=90, final=i == len(pieces) - 1))}\r\n\r\n"
            for i, p in enumerate(pieces)
        )


class Ollama(Provider):
    name = "ollama"
    model = "llama3.1"
    env: dict[str, str] = {}  # noqa: RUF012
    path = stream_path = "/api/chat"
    success_doc = (
        "success: Ollama /api/chat response, non-streaming "
        "(https://github.com/ollama/ollama/blob/main/docs/api.md#generate-a-chat-completion)"
    )
    stream_doc = (
        "stream: Ollama /api/chat NDJSON stream, one object per line, the last with done: true "
        "(https://github.com/ollama/ollama/blob/main/docs/api.md#generate-a-chat-completion)"
    )
    json_headers = {"content-type": "application/json; charset=utf-8"}  # noqa: RUF012
    stream_headers = {"content-type": "application/x-ndjson"}  # noqa: RUF012
    _timings = {  # noqa: RUF012
        "total_duration": 4883583458,
        "load_duration": 1334875,
        "prompt_eval_count": 92,
        "prompt_eval_duration": 342546000,
        "eval_count": 66,
        "eval_duration": 4535599000,
    }

    def success(self, answer: dict[str, Any], *, schema: str, n: int) -> dict[str, Any]:
        return {
            "model": self.model,
            "created_at": f"2025-01-01T00:00:{n:02d}.000000Z",
            "message": {"role": "assistant", "content": json.dumps(answer)},
            "done_reason": "stop",
            "done": True,
            **self._timings,
        }

    def stream(self, answer: dict[str, Any], *, schema: str) -> str:
        lines = [
            {
                "model": self.model,
                "created_at": f"2025-01-01T00:01:{i:02d}.000000Z",
                "message": {"role": "assistant", "content": piece},
                "done": False,
            }
            for i, piece in enumerate(_pieces(json.dumps(answer)))
        ]
        lines.append(
            {
                "model": self.model,
                "created_at": "2025-01-01T00:01:59.000000Z",
                "message": {"role": "assistant", "content": ""},
                "done_reason": "stop",
                "done": True,
                **self._timings,
            }
        )
        return "".join(json.dumps(line) + "\n" for line in lines)


# -- answers ---------------------------------------------------------------------------


def answer(
    status: int, headers: dict[str, str], *, body: Any = None, text: str | None = None
) -> ExchangeResponse:
    raw = text if text is not None else json.dumps(body)
    return sanitize_response(status, headers, raw)


def payload(case_id: str, **header_overrides: str) -> tuple[ExchangeResponse, str]:
    """A payload of tests/data/provider_errors.json, and its source line."""
    case = PAYLOADS[case_id]
    headers = {**case.get("headers", {}), **header_overrides}
    response = answer(case["status"], headers, body=case.get("body"), text=case.get("body_text"))
    extra = f" plus header(s) {', '.join(sorted(header_overrides))}" if header_overrides else ""
    return response, f"{case_id}{extra} ({case['source']})"


def documented(
    status: int, headers: dict[str, str], source: str, *, body: Any = None, text: str | None = None
) -> tuple[ExchangeResponse, str]:
    return answer(status, headers, body=body, text=text), source


def ok(p: Provider, value: dict[str, Any], *, schema: str = "Plan", n: int = 1) -> ExchangeResponse:
    return answer(200, p.json_headers, body=p.success(value, schema=schema, n=n))


def ok_stream(p: Provider, value: dict[str, Any], *, schema: str = "Plan") -> ExchangeResponse:
    return answer(200, p.stream_headers, text=p.stream(value, schema=schema))


# Payloads documented elsewhere than tests/data/provider_errors.json.
NGINX_401 = (
    "<html>\r\n<head><title>401 Authorization Required</title></head>\r\n<body>\r\n"
    "<center><h1>401 Authorization Required</h1></center>\r\n<hr><center>nginx</center>\r\n"
    "</body>\r\n</html>\r\n"
)
OLLAMA_JSON = {"content-type": "application/json; charset=utf-8"}

RATE_LIMITS: dict[str, tuple[Callable[[], tuple[ExchangeResponse, str]], float]] = {
    "openai": (lambda: payload("openai-429-rate-limit-tpm-ms-hint"), 0.644),
    "azure": (lambda: payload("azure-429-token-rate-limit-retry-after-ms"), 5.81),
    "anthropic": (lambda: payload("anthropic-429-rate-limit-itpm"), 17.0),
    "gemini": (lambda: payload("gemini-429-per-minute-retryinfo"), 26.0),
    # Neither Ollama nor vLLM rate-limits; a gateway in front of them does.
    "ollama": (lambda: payload("proxy-429-text-plain", **{"retry-after": "3"}), 3.0),
    "vllm": (lambda: payload("proxy-429-text-plain", **{"retry-after": "3"}), 3.0),
}
SERVER_ERRORS: dict[str, Callable[[], tuple[ExchangeResponse, str]]] = {
    "openai": lambda: payload("openai-500-server-error"),
    "azure": lambda: payload("openai-500-server-error"),  # Azure OpenAI's envelope is OpenAI's
    "anthropic": lambda: payload("anthropic-500-api-error"),
    "gemini": lambda: payload("gemini-500-internal"),
    "ollama": lambda: documented(
        500,
        OLLAMA_JSON,
        'Ollama\'s {"error": ...} envelope with the message of issue ollama/ollama#8770 '
        "('500 Internal Server Error: llama runner process has terminated: exit status 2')",
        body={"error": "llama runner process has terminated: exit status 2"},
    ),
    "vllm": lambda: payload("proxy-502-nginx-bad-gateway"),  # nginx in front of vLLM
}
OVERLOADED: dict[str, Callable[[], tuple[ExchangeResponse, str]]] = {
    "openai": lambda: payload("openai-503-model-overloaded"),
    "azure": lambda: payload("openai-503-model-overloaded"),
    "anthropic": lambda: payload("anthropic-529-overloaded"),
    "gemini": lambda: payload("gemini-503-model-overloaded"),
    "ollama": lambda: documented(
        503,
        OLLAMA_JSON,
        "ollama server/sched.go ErrMaxQueue ('server busy, please try again.  maximum pending "
        "requests exceeded', OLLAMA_MAX_QUEUE full), answered as HTTP 503 by server/routes.go",
        body={"error": "server busy, please try again.  maximum pending requests exceeded"},
    ),
    "vllm": lambda: payload("proxy-503-nginx-unavailable"),
}
AUTH_FAILURES: dict[str, Callable[[], tuple[ExchangeResponse, str]]] = {
    "openai": lambda: payload("openai-401-invalid-api-key"),
    "azure": lambda: payload("azure-401-invalid-subscription-key"),
    "anthropic": lambda: payload("anthropic-401-invalid-x-api-key"),
    "gemini": lambda: payload("gemini-400-api-key-invalid"),
    # Ollama has no keys: a 401 comes from the reverse proxy guarding it.
    "ollama": lambda: documented(
        401,
        {"content-type": "text/html", "server": "nginx"},
        "nginx src/http/ngx_http_special_response.c (ngx_http_error_401_page + "
        "ngx_http_error_tail): the page nginx auth_basic answers in front of Ollama",
        text=NGINX_401,
    ),
    "vllm": lambda: documented(
        401,
        {"content-type": "application/json"},
        "vllm-project/vllm vllm/entrypoints/openai/api_server.py AuthenticationMiddleware "
        '(JSONResponse(content={"error": "Unauthorized"}, status_code=401) with --api-key)',
        body={"error": "Unauthorized"},
    ),
}
OVERFLOWS: dict[str, Callable[[], tuple[ExchangeResponse, str]]] = {
    "openai": lambda: payload("openai-400-context-length-exceeded"),
    "azure": lambda: payload("azure-400-context-length-exceeded"),
    "anthropic": lambda: payload("anthropic-400-prompt-too-long"),
    "gemini": lambda: payload("gemini-400-input-token-count-exceeds"),
    "vllm": lambda: payload("vllm-400-context-length-nested"),
}


# -- cassettes -------------------------------------------------------------------------


def cassette(
    p: Provider,
    scenario: str,
    description: str,
    sources: list[str],
    exchanges: list[tuple[ExchangeRequest, ExchangeResponse]],
    expect: Expectation,
    *,
    kind: Literal["complete", "stream", "loop"] = "complete",
    response_model: str | None = "Plan",
    model: str | None = None,
    max_output_tokens: int | None = None,
    strict_schema: bool = False,
    prompt: str = PROMPT,
) -> Cassette:
    return Cassette(
        version=CASSETTE_VERSION,
        name=f"{p.name}-{scenario}",
        description=description,
        provider=p.name,
        model=model or p.model,
        source=f"{NOT_RECORDED}: " + "; ".join(sources),
        call=CallRecipe(
            kind=kind,
            messages=[{"role": "user", "content": prompt}],
            system=SYSTEM,
            response_model=response_model,
            strict_schema=strict_schema,
            max_output_tokens=max_output_tokens,
            env=dict(p.env),
            capability_matrix=dict(p.matrix),
        ),
        exchanges=[Exchange(request=r, response=a) for r, a in exchanges],
        expect=expect,
    )


def success(attempts: int, waits: list[float], output: Any = PLAN) -> Expectation:
    return Expectation(outcome="success", output=output, attempts=attempts, waits=waits)


def failure(error_class: str, code: str, attempts: int = 1) -> Expectation:
    return Expectation(
        outcome="error", error_class=error_class, error_code=code, attempts=attempts, waits=[]
    )


def provider_cassettes(p: Provider) -> list[Cassette]:
    req = p.request()
    out = [
        cassette(
            p,
            "success",
            "One structured call answered at once; the output validates as a Plan.",
            [p.success_doc],
            [(req, ok(p, PLAN))],
            success(1, []),
        ),
        cassette(
            p,
            "stream",
            "The same call streamed: the deltas assemble into a Plan that validates.",
            [p.stream_doc],
            [(p.request(stream=True), ok_stream(p, PLAN))],
            success(1, []),
            kind="stream",
        ),
    ]
    limited, wait = RATE_LIMITS[p.name]
    error, source = limited()
    out.append(
        cassette(
            p,
            "rate-limit-retry",
            f"A 429 asking for {wait:g} s: the envelope waits exactly that, then succeeds.",
            [f"429: {source}", p.success_doc],
            [(req, error), (req, ok(p, PLAN, n=2))],
            success(2, [wait]),
        )
    )
    for scenario, table, what in (
        ("server-error-retry", SERVER_ERRORS, "A 5xx without Retry-After"),
        ("overloaded-retry", OVERLOADED, "Overloaded"),
    ):
        error, source = table[p.name]()
        out.append(
            cassette(
                p,
                scenario,
                f"{what} (HTTP {error.status}): one backoff of 1 s (no jitter), then success.",
                [f"{error.status}: {source}", p.success_doc],
                [(req, error), (req, ok(p, PLAN, n=2))],
                success(2, [1.0]),
            )
        )
    error, source = AUTH_FAILURES[p.name]()
    out.append(
        cassette(
            p,
            "auth-failure",
            f"A rejected key (HTTP {error.status}): ProviderAuthError at once, never retried.",
            [f"{error.status}: {source}"],
            [(req, error)],
            failure("ProviderAuthError", "llm.auth"),
        )
    )
    if p.name in OVERFLOWS:
        error, source = OVERFLOWS[p.name]()
        out.append(
            cassette(
                p,
                "context-overflow",
                "The provider refuses the prompt at submit time as too long: "
                "ContextOverflowError, never retried.",
                [f"{error.status}: {source}"],
                [(req, error)],
                failure("ContextOverflowError", "llm.context_overflow"),
            )
        )
    else:
        # Ollama truncates an over-long prompt silently instead of refusing it, so the
        # only place an overflow surfaces is fluid_build's pre-flight, before any request.
        out.append(
            cassette(
                p,
                "context-overflow",
                "llama3 has an 8,192-token window and the call reserves all of it for the "
                "answer: the pre-flight refuses it before sending (0 requests). Ollama "
                "itself would truncate the prompt silently (num_ctx).",
                [
                    "no exchange: the window of llama3 is ollama.com/library/llama3 "
                    "'context length 8192', as fluid_build's capability matrix holds it"
                ],
                [],
                failure("ContextOverflowError", "llm.context_overflow", attempts=0),
                model="llama3",
                max_output_tokens=8192,
            )
        )
    out.append(
        cassette(
            p,
            "schema-corrected",
            "The agent loop: the first answer gives steps as a string and fails Plan; the "
            "loop feeds the validation errors back and the second answer validates.",
            [p.success_doc],
            [(req, ok(p, BAD_PLAN)), (req, ok(p, PLAN, n=2))],
            success(2, []),
            kind="loop",
        )
    )
    return out


def openai_strict(p: Provider) -> list[Cassette]:
    strict = harden_schema(DataProduct.model_json_schema(), name="DataProduct")
    encoded = strict.encode(DATA_PRODUCT)
    assert isinstance(encoded["properties"], str)  # the free-form field travels as JSON text
    req = p.request()
    return [
        cassette(
            p,
            "strict-schema-on",
            "Strict-schema mode: the free-form `properties` field is sent as a JSON-encoded "
            "string (strict mode cannot describe it) and decoded back before validation.",
            [p.success_doc, "strict shape per docs/openai-strict-schema.md"],
            [(req, ok(p, encoded, schema="DataProduct"))],
            success(1, [], DATA_PRODUCT),
            response_model="DataProduct",
            strict_schema=True,
            prompt="Describe the sales_orders_daily data product.",
        ),
        cassette(
            p,
            "strict-schema-off",
            "Strict-schema mode off: the same data product with `properties` as a plain "
            "JSON object validates as is.",
            [p.success_doc],
            [(req, ok(p, DATA_PRODUCT, schema="DataProduct"))],
            success(1, [], DATA_PRODUCT),
            response_model="DataProduct",
            strict_schema=False,
            prompt="Describe the sales_orders_daily data product.",
        ),
    ]


def stream_error_retries() -> list[Cassette]:
    out = []
    for p, case_id in (
        (Anthropic(), "anthropic-200-sse-overloaded"),
        (OpenAI(), "openai-200-stream-error-chunk"),
    ):
        error, source = payload(case_id)
        out.append(
            cassette(
                p,
                "stream-error-retry",
                "An error event inside an HTTP 200 stream before any delta: retried after a 1 s "
                "backoff like any failed attempt; the second stream succeeds.",
                [f"200 stream: {source}", p.stream_doc],
                [(p.request(stream=True), error), (p.request(stream=True), ok_stream(p, PLAN))],
                success(2, [1.0]),
                kind="stream",
            )
        )
    return out


# -- recorded answers: the providers of issue 23 ------------------------------------------
#
# These answers are real: rows of tests/data/provider_answers.json, each taken verbatim
# from a recorded exchange it cites (mostly pydantic-ai's test cassettes). Replay matches a
# request by method, path and model only, so the recipe's prompt is the recorded test's
# question in spirit, and the output checked is the recorded answer's text.

ANSWERS: dict[str, dict[str, Any]] = {
    row["id"]: row
    for row in json.loads(
        (ROOT / "tests" / "data" / "provider_answers.json").read_text(encoding="utf-8")
    )
}
#: What a replay reaches each provider with, as its recipe's environment: never a key. The
#: key is the replay's own (``replay-key``): Bedrock takes it as a Bedrock API key (a bearer
#: token, so no AWS credential chain and no SigV4), Vertex as an access token (so no
#: Application Default Credentials). The project and region are made up: they only shape
#: the URL, which the cassette's paths pin.
VERTEX_PROJECT = "fluid-corpus"
RECORDED_ENV: dict[str, dict[str, str]] = {
    "bedrock": {"AWS_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"},
    "vertex": {"GOOGLE_CLOUD_PROJECT": VERTEX_PROJECT, "GOOGLE_CLOUD_LOCATION": "us-central1"},
}

#: What a caller tells fluid_build about models its capability matrix does not hold, as a
#: real caller would (else the pre-flight warns and assumes 8,192 tokens): each model's
#: documented context window.
RECORDED_MATRIX: dict[str, dict[str, Any]] = {
    "amazon.nova-micro-v1:0": {"context_window": 128_000},  # AWS Nova model card: 128K
    "us.anthropic.claude-sonnet-4-20250514-v1:0": {"context_window": 200_000},
    "gemini-3.7-flash": {"context_window": 1_048_576},  # as every Gemini Flash model
    "deepseek-reasoner": {"context_window": 128_000},  # api-docs.deepseek.com: 128K
    "grok-beta": {"context_window": 131_072},  # docs.x.ai models table
    "llama3.3-70b": {"context_window": 128_000},  # Meta's Llama 3.3 70B: 128K
    # Meta's Llama 3.1 model card: 128K, as Together and Fireworks serve them.
    "meta-llama/Meta-Llama-3.1-405B-Instruct-Turbo": {"context_window": 128_000},
    "accounts/fireworks/models/llama-v3p1-8b-instruct": {"context_window": 128_000},
}


def _recorded_body(row: dict[str, Any]) -> ExchangeResponse:
    """The row's answer as a cassette keeps it: JSON, text lines, or base64 bytes."""
    headers = dict(row.get("headers") or {})
    if row.get("stream_encoding") == "base64":  # AWS event-stream frames: binary
        raw = base64.b64decode("".join(row["stream"]))
        kept = sanitize_response(row.get("status", 200), headers, "")
        return kept.model_copy(update={"body_base64": base64.b64encode(raw).decode("ascii")})
    if "stream" in row:
        return answer(row.get("status", 200), headers, text="\n".join(row["stream"]))
    return answer(row.get("status", 200), headers, body=row["body"])


def _path(provider: str, model: str, *, stream: bool, location: str = "us-central1") -> str:
    if provider == "openai_responses":
        return "/v1/responses"
    if provider == "bedrock":
        return f"/model/{model}/converse-stream" if stream else f"/model/{model}/converse"
    if provider == "vertex":
        verb = "streamGenerateContent" if stream else "generateContent"
        return (
            f"/v1/projects/{VERTEX_PROJECT}/locations/{location}/publishers/google/models/"
            f"{model}:{verb}"
        )
    if provider == "fireworks":  # its base URL is https://api.fireworks.ai/inference/v1
        return "/inference/v1/chat/completions"
    return "/chat/completions" if provider == "deepseek" else "/v1/chat/completions"


def _request(
    provider: str, model: str, *, stream: bool = False, location: str = ""
) -> ExchangeRequest:
    in_body = provider not in ("bedrock", "vertex")  # those two name the model in the path
    return ExchangeRequest(
        method="POST",
        path=_path(provider, model, stream=stream, location=location or "us-central1"),
        model=model if in_body else None,
    )


def recorded(
    name: str,
    description: str,
    row_id: str,
    prompt: str,
    *,
    location: str = "",
) -> Cassette:
    """A cassette replaying one recorded answer of tests/data/provider_answers.json."""
    row = ANSWERS[row_id]
    provider, model = row["provider"], row["request_model"]
    stream = "stream" in row
    env = dict(RECORDED_ENV.get(provider, {}))
    if location:
        env["GOOGLE_CLOUD_LOCATION"] = location
    return Cassette(
        version=CASSETTE_VERSION,
        name=name,
        description=description,
        provider=provider,
        model=model,
        source=f"recorded from {provider} ({model}): provider_answers.json {row_id}, "
        + row["source"],
        call=CallRecipe(
            kind="stream" if stream else "complete",
            messages=[{"role": "user", "content": prompt}],
            env=env,
            capability_matrix=dict(RECORDED_MATRIX.get(model, {})),
        ),
        exchanges=[
            Exchange(
                request=_request(provider, model, stream=stream, location=location),
                response=_recorded_body(row),
            )
        ],
        expect=success(1, [], row["expect"]["text"]),
    )


def recorded_error(
    name: str,
    description: str,
    row_id: str,
    recorded_answer: tuple[ExchangeResponse, str],
    expect: Expectation,
    *,
    retried: bool = False,
) -> Cassette:
    """A recorded error answer (and its source); retried: then the row's answer.

    A row holding a stream makes a stream call: the error answers the stream request.
    """
    row = ANSWERS[row_id]
    provider, model = row["provider"], row["request_model"]
    error, source = recorded_answer
    stream = "stream" in row
    req = _request(provider, model, stream=stream)
    exchanges = [Exchange(request=req, response=error)]
    if retried:
        exchanges.append(Exchange(request=req, response=_recorded_body(row)))
    return Cassette(
        version=CASSETTE_VERSION,
        name=name,
        description=description,
        provider=provider,
        model=model,
        source=f"recorded from {provider}: the error {source}"
        + (f"; then provider_answers.json {row_id}, {row['source']}" if retried else ""),
        call=CallRecipe(
            kind="stream" if stream else "complete",
            messages=[{"role": "user", "content": "What is the capital of France?"}],
            env=dict(RECORDED_ENV.get(provider, {})),
            capability_matrix=dict(RECORDED_MATRIX.get(model, {})),
        ),
        exchanges=exchanges,
        expect=expect,
    )


# Bedrock's 500 from pydantic-ai's cassette test_bedrock_server_error.yaml (not in
# provider_errors.json): the error type is the body's __type, as Bedrock's JSON protocol
# sends it.
PYDANTIC_AI_BEDROCK = "pydantic/pydantic-ai tests/models/cassettes/test_bedrock/"


def bedrock_error(
    status: int, body: dict[str, str], cassette_file: str
) -> tuple[ExchangeResponse, str]:
    return documented(
        status,
        {"content-type": "application/json"},
        f"{PYDANTIC_AI_BEDROCK}{cassette_file} (status and parsed_body verbatim; like the "
        "throttling cassette, written for pydantic-ai's retry test rather than recorded)",
        body=body,
    )


# xAI: the answer printed in M-Lai-ai/LLM-Provider-reference Grok/no-streaming.md (commit
# 70f43cb), verbatim, to the request shown there (the recipe of xai-success).
XAI_SOURCE = (
    "M-Lai-ai/LLM-Provider-reference Grok/no-streaming.md (a curl call to "
    "https://api.x.ai/v1/chat/completions and its answer, verbatim)"
)
XAI_ANSWER = json.loads(
    r"""{"id":"3b86b984-91ef-4dfd-bcd2-8d2a7449a92d","object":"chat.completion","created":1732552110,"model":"grok-beta","choices":[{"index":0,"message":{"role":"assistant","content":"Coca-Cola is a carbonated soft drink invented in 1886 by John Pemberton in Atlanta, Georgia. Here are some key points about Coca-Cola:\n\n- **Brand**: It's one of the most recognized and valuable brands in the world, known for its iconic contoured bottle and the classic red and white logo.\n\n- **Ingredients**: The original formula included ingredients like coca leaves (de-cocainized since 1903), kola nuts, sugar (or high fructose corn syrup in some markets), caffeine, carbonated water, caramel color, and various flavorings.\n\n- **Taste**: Coca-Cola has a distinctive sweet, slightly acidic taste with a hint of vanilla and spice, which comes from its secret formula known as \"Merchandise 7X.\"\n\n- **Varieties**: Over the years, Coca-Cola has expanded its product line to include numerous variations like Diet Coke, Coca-Cola Zero Sugar, Coca-Cola Cherry, Vanilla Coke, and many others tailored","refusal":null},"finish_reason":"length"}],"usage":{"prompt_tokens":38,"completion_tokens":200,"total_tokens":238,"prompt_tokens_details":{"text_tokens":38,"audio_tokens":0,"image_tokens":0,"cached_tokens":0}},"system_fingerprint":"fp_6ca29cf396"}"""  # noqa: E501 - verbatim
)


def xai_success() -> Cassette:
    return Cassette(
        version=CASSETTE_VERSION,
        name="xai-success",
        description="A recorded xAI chat completion (grok-beta) cut at max_tokens (finish "
        "reason length): the text that arrived is the answer.",
        provider="xai",
        model="grok-beta",
        source=f"recorded 2024-11-25 from xai (grok-beta): {XAI_SOURCE}",
        call=CallRecipe(
            messages=[
                {"role": "user", "content": "hello"},
                {"role": "assistant", "content": "hello how can I help you"},
                {"role": "user", "content": "what is Coca Cola"},
            ],
            system="You are an assistant for the company Coca Cola ",
            max_output_tokens=200,
            capability_matrix=dict(RECORDED_MATRIX["grok-beta"]),
        ),
        exchanges=[
            Exchange(
                request=_request("xai", "grok-beta"),
                response=answer(200, {"content-type": "application/json"}, body=XAI_ANSWER),
            )
        ],
        expect=success(1, [], XAI_ANSWER["choices"][0]["message"]["content"]),
    )


def recorded_cassettes() -> list[Cassette]:
    overflow = failure("ContextOverflowError", "llm.context_overflow")
    return [
        recorded(
            "openai_responses-success",
            "A recorded Responses API answer (output_text in a message item) read as the text.",
            "openai-responses-text-after-tool",
            "What is the capital of PotatoLand?",
        ),
        recorded(
            "openai_responses-stream",
            "A recorded Responses API stream: reasoning items first (never text), then "
            "output_text deltas, then response.completed.",
            "openai-responses-stream-reasoning-then-text",
            "Tell me a short story.",
        ),
        recorded_error(
            "openai_responses-context-overflow",
            "The Responses API refuses the input as over the context window "
            "(code context_length_exceeded): ContextOverflowError, never retried.",
            "openai-responses-text-after-tool",
            payload("openai-responses-400-context-window"),
            overflow,
        ),
        recorded(
            "bedrock-success",
            "A recorded Converse answer (amazon.nova-micro), reached with a Bedrock API key.",
            "bedrock-text",
            "Hello!",
        ),
        recorded(
            "bedrock-reasoning",
            "A recorded Converse answer of Claude on Bedrock: its reasoningContent block is "
            "reasoning, never the answer's text.",
            "bedrock-reasoning",
            "How do I cross the street?",
        ),
        recorded(
            "bedrock-stream",
            "A recorded converse-stream answer: AWS event-stream binary frames (body_base64), "
            "decoded and read as text deltas.",
            "bedrock-stream-text",
            "What is the capital of France?",
        ),
        recorded_error(
            "bedrock-rate-limit-retry",
            "Bedrock's 429 ThrottlingException (no Retry-After): one backoff of 1 s (no "
            "jitter), then the recorded answer.",
            "bedrock-text",
            payload("bedrock-429-throttling"),
            success(2, [1.0], ANSWERS["bedrock-text"]["expect"]["text"]),
            retried=True,
        ),
        recorded_error(
            "bedrock-server-error-retry",
            "Bedrock's 500 InternalServerError: one backoff of 1 s (no jitter), then the "
            "recorded answer.",
            "bedrock-text",
            bedrock_error(
                500,
                {"__type": "InternalServerError", "message": "Internal error"},
                "test_bedrock_server_error.yaml",
            ),
            success(2, [1.0], ANSWERS["bedrock-text"]["expect"]["text"]),
            retried=True,
        ),
        recorded_error(
            "bedrock-overloaded-retry",
            "Bedrock's 503 ServiceUnavailableException: one backoff of 1 s (no jitter), then "
            "the recorded answer.",
            "bedrock-text",
            payload("bedrock-503-service-unavailable"),
            success(2, [1.0], ANSWERS["bedrock-text"]["expect"]["text"]),
            retried=True,
        ),
        recorded_error(
            "bedrock-stream-error-retry",
            "converse-stream answers 424 ModelStreamErrorException ('Retry your request'): "
            "one backoff of 1 s (no jitter), then the recorded event stream.",
            "bedrock-stream-text",
            payload("bedrock-424-model-stream-error"),
            success(2, [1.0], ANSWERS["bedrock-stream-text"]["expect"]["text"]),
            retried=True,
        ),
        recorded_error(
            "bedrock-auth-failure",
            "Bedrock rejects the credentials (403 UnrecognizedClientException): "
            "ProviderAuthError at once, never retried.",
            "bedrock-text",
            payload("bedrock-403-unrecognized-client"),
            failure("ProviderAuthError", "llm.auth"),
        ),
        recorded_error(
            "bedrock-context-overflow",
            "Bedrock refuses the input (400 ValidationException 'Input is too long for "
            "requested model.'): ContextOverflowError, never retried.",
            "bedrock-text",
            payload("bedrock-400-input-too-long"),
            overflow,
        ),
        recorded_error(
            "bedrock-model-not-found",
            "Bedrock refuses an unknown model id (HTTP 400, no __type): not retried.",
            "bedrock-text",
            payload("bedrock-400-model-identifier-invalid"),
            failure("ProviderError", "llm.model_not_found"),
        ),
        recorded(
            "vertex-success",
            "A recorded Vertex AI generateContent answer (us-central1), reached with an "
            "access token and GOOGLE_CLOUD_PROJECT.",
            "vertex-text-us-central1",
            "What is the capital of France?",
        ),
        recorded(
            "vertex-stream",
            "A recorded Vertex AI stream from location global: chunks holding only thought "
            "signatures carry no text; the last carries the finish reason.",
            "vertex-stream-global-signature-chunks",
            "Do any animals appear in the video?",
            location="global",
        ),
        recorded_error(
            "vertex-rate-limit-retry",
            "Vertex's 429 RESOURCE_EXHAUSTED without RetryInfo: one backoff of 1 s (no "
            "jitter), then the recorded answer.",
            "vertex-text-us-central1",
            payload("gemini-429-vertex-resource-exhausted"),
            success(2, [1.0], ANSWERS["vertex-text-us-central1"]["expect"]["text"]),
            retried=True,
        ),
        recorded_error(
            "vertex-auth-failure",
            "Vertex refuses an expired access token (401 UNAUTHENTICATED, "
            "ACCESS_TOKEN_EXPIRED): ProviderAuthError at once, never retried.",
            "vertex-text-us-central1",
            payload("vertex-401-access-token-expired"),
            failure("ProviderAuthError", "llm.auth"),
        ),
        recorded_error(
            "vertex-context-overflow",
            "Vertex refuses the input as over the model's token limit: ContextOverflowError, "
            "never retried.",
            "vertex-text-us-central1",
            payload("vertex-400-input-token-count-exceeds-no-count"),
            overflow,
        ),
        recorded(
            "deepseek-success",
            "A recorded deepseek-reasoner answer: reasoning_content is its thinking, never "
            "the answer's text.",
            "deepseek-reasoner-reasoning-content",
            "How do I cross the street?",
        ),
        xai_success(),
        recorded(
            "cerebras-success",
            "A recorded Cerebras chat completion through the cerebras preset.",
            "cerebras-text",
            "What is the capital of France?",
        ),
        recorded_error(
            "cerebras-context-overflow",
            "Cerebras refuses the prompt as longer than the limit ('Current length is ... "
            "while limit is ...'): ContextOverflowError, never retried.",
            "cerebras-text",
            payload("cerebras-400-current-length-while-limit"),
            overflow,
        ),
        recorded(
            "together-success",
            "A recorded Together chat completion (Llama 3.1 405B Turbo) through the together "
            "preset; its finish reason is Together's own 'eos'.",
            "together-text-finish-eos",
            "Which is cooler, SF or LA?",
        ),
        recorded(
            "together-tool-call",
            "A recorded Together answer that is a tool call (get_weather, call_id kept): "
            "no text; replay compares the text, tests/test_corpus_providers.py the call.",
            "together-tool-call-llama-405b",
            "What is the weather in SF?",
        ),
        recorded(
            "fireworks-stream",
            "A recorded Fireworks stream (Llama 3.1 8B) through the fireworks preset: "
            "chat completion chunks, the usage in the last one with the finish reason.",
            "fireworks-stream-llama-usage-in-last-chunk",
            "What is the Latin name for the Sun?",
        ),
    ]


# -- answers read right (issue 35 items 1 to 3): shapes from the API references ---------------
#
# Constructed, not recorded: each answer follows the provider's API reference, cited in the
# cassette's source. Bedrock: ConverseResponse, ConverseStreamMetadataEvent,
# GuardrailTraceAssessment / GuardrailAssessment, CitationsContentBlock, CitationsDelta
# (https://docs.aws.amazon.com/bedrock/latest/APIReference/). Gemini and Vertex AI:
# GenerateContentResponse with its enums as numbers (enum-encoding=int):
# Candidate.FinishReason of google/ai/generativelanguage/v1beta/generative_service.proto and
# of google/cloud/aiplatform/v1/content.proto.

AWS_REFERENCE = "https://docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_"
BEDROCK_MODEL = "amazon.nova-micro-v1:0"
BEDROCK_JSON = {"content-type": "application/json"}
BEDROCK_STREAM = {"content-type": "application/vnd.amazon.eventstream"}
BEDROCK_USAGE = {"inputTokens": 21, "outputTokens": 9, "totalTokens": 30}
BEDROCK_METRICS = {"latencyMs": 412}
GUARDRAIL_ID = "gr1abc2def3"
MASKED = "Send the refund to {NAME} at {EMAIL}."
GUARD_METRICS = {
    "guardrailProcessingLatency": 95,
    "usage": {"sensitiveInformationPolicyUnits": 1, "contentPolicyUnits": 1},
}
MASKING = {
    "guardrail": {
        "modelOutput": ["Send the refund to Jane Doe at jane@example.com."],
        "outputAssessments": {
            GUARDRAIL_ID: [
                {
                    "sensitiveInformationPolicy": {
                        "piiEntities": [
                            {"match": "Jane Doe", "type": "NAME", "action": "ANONYMIZED"},
                            {"match": "jane@example.com", "type": "EMAIL", "action": "ANONYMIZED"},
                        ]
                    },
                    "invocationMetrics": GUARD_METRICS,
                }
            ]
        },
    }
}
BLOCKING = {
    "guardrail": {
        "inputAssessment": {
            GUARDRAIL_ID: {
                "contentPolicy": {
                    "filters": [
                        {
                            "type": "VIOLENCE",
                            "confidence": "HIGH",
                            "filterStrength": "HIGH",
                            "action": "BLOCKED",
                            "detected": True,
                        }
                    ]
                },
                "invocationMetrics": GUARD_METRICS,
            }
        }
    }
}
CITATION = {
    "title": "expense-policy.pdf",
    "sourceContent": [{"text": "Expense reports are due within 30 days of purchase."}],
    "location": {"documentChar": {"documentIndex": 0, "start": 120, "end": 172}},
}
CITED = "submit expense reports within 30 days of purchase."
CITED_ANSWER = "Employees should " + CITED + " Late reports need a manager's approval."


def event_frame(event: str, payload: dict[str, Any]) -> bytes:
    """One AWS event-stream frame (string headers), as ConverseStream sends an event."""
    import zlib

    headers = {":event-type": event, ":content-type": "application/json", ":message-type": "event"}
    raw = b""
    for name, value in headers.items():
        raw += bytes([len(name)]) + name.encode() + b"\x07" + len(value).to_bytes(2, "big")
        raw += value.encode()
    body = json.dumps(payload, separators=(",", ":")).encode()
    total = 16 + len(raw) + len(body)
    prelude = total.to_bytes(4, "big") + len(raw).to_bytes(4, "big")
    prelude += zlib.crc32(prelude).to_bytes(4, "big")
    message = prelude + raw + body
    return message + zlib.crc32(message).to_bytes(4, "big")


def converse_stream(
    deltas: list[dict[str, Any]], stop: str, trace: dict[str, Any] | None
) -> ExchangeResponse:
    metadata: dict[str, Any] = {"usage": BEDROCK_USAGE, "metrics": BEDROCK_METRICS}
    if trace is not None:
        metadata["trace"] = trace
    frames = b"".join(
        [
            event_frame("messageStart", {"role": "assistant"}),
            *(event_frame("contentBlockDelta", d) for d in deltas),
            event_frame("contentBlockStop", {"contentBlockIndex": 0}),
            event_frame("messageStop", {"stopReason": stop}),
            event_frame("metadata", metadata),
        ]
    )
    kept = sanitize_response(200, BEDROCK_STREAM, "")
    return kept.model_copy(update={"body_base64": base64.b64encode(frames).decode("ascii")})


def converse(content: list[dict[str, Any]], stop: str, trace: Any = None) -> ExchangeResponse:
    body: dict[str, Any] = {
        "output": {"message": {"role": "assistant", "content": content}},
        "stopReason": stop,
        "usage": BEDROCK_USAGE,
        "metrics": BEDROCK_METRICS,
    }
    if trace is not None:
        body["trace"] = trace
    return answer(200, BEDROCK_JSON, body=body)


def answered(
    name: str,
    description: str,
    provider: str,
    model: str,
    sources: list[str],
    prompt: str,
    response: ExchangeResponse,
    expect: Expectation,
    *,
    stream: bool = False,
    request: ExchangeRequest | None = None,
) -> Cassette:
    """One call answered by a response built from the API reference (``sources``)."""
    request = request or _request(provider, model, stream=stream)
    return Cassette(
        version=CASSETTE_VERSION,
        name=name,
        description=description,
        provider=provider,
        model=model,
        source=f"{NOT_RECORDED}: " + "; ".join(sources),
        call=CallRecipe(
            kind="stream" if stream else "complete",
            messages=[{"role": "user", "content": prompt}],
            env=dict(RECORDED_ENV.get(provider, {})),
            capability_matrix=dict(RECORDED_MATRIX.get(model, {"context_window": 1_048_576})),
        ),
        exchanges=[Exchange(request=request, response=response)],
        expect=expect,
    )


def _halves(text: str, index: int = 0) -> list[dict[str, Any]]:
    half = len(text) // 2
    return [
        {"contentBlockIndex": index, "delta": {"text": text[:half]}},
        {"contentBlockIndex": index, "delta": {"text": text[half:]}},
    ]


def gemini_numbers(finish: int, text: str = "Paris.") -> dict[str, Any]:
    return {
        "candidates": [
            {
                "content": {"parts": [{"text": text}], "role": "model"},
                "finishReason": finish,
                "index": 0,
                "safetyRatings": [{"category": 8, "probability": 1}],
            }
        ],
        "usageMetadata": {"promptTokenCount": 7, "candidatesTokenCount": 2, "totalTokenCount": 9},
        "modelVersion": "gemini-2.5-flash",
    }


def answers_read_right() -> list[Cassette]:
    guard = [
        f"{AWS_REFERENCE}Converse.html (stopReason guardrail_intervened, trace)",
        f"{AWS_REFERENCE}GuardrailTraceAssessment.html",
        f"{AWS_REFERENCE}GuardrailAssessment.html (its policies' findings and their action)",
    ]
    stream_guard = [
        f"{AWS_REFERENCE}ConverseStream.html",
        f"{AWS_REFERENCE}ConverseStreamMetadataEvent.html (trace)",
        *guard[1:],
    ]
    cites = [
        f"{AWS_REFERENCE}ContentBlock.html (citationsContent)",
        f"{AWS_REFERENCE}CitationsContentBlock.html",
        f"{AWS_REFERENCE}Citation.html",
    ]
    stream_cites = [
        f"{AWS_REFERENCE}ContentBlockDelta.html (citation)",
        f"{AWS_REFERENCE}CitationsDelta.html",
    ]
    gemini_ref = (
        "Gemini API GenerateContentResponse with enum-encoding=int: Candidate.FinishReason "
        "1 = STOP (googleapis google/ai/generativelanguage/v1beta/generative_service.proto)"
    )
    vertex_ref = (
        "Vertex AI GenerateContentResponse with enum-encoding=int: Candidate.FinishReason "
        "1 = STOP, 6 = BLOCKLIST (googleapis google/cloud/aiplatform/v1/content.proto)"
    )
    paris = "Paris."
    gemini = Gemini()
    return [
        answered(
            "bedrock-guardrail-masked",
            "A guardrail masked two PII entities of the answer (ANONYMIZED, nothing BLOCKED; "
            "stopReason guardrail_intervened): the masked text is the answer.",
            "bedrock",
            BEDROCK_MODEL,
            guard,
            "Where does the refund go?",
            converse([{"text": MASKED}], "guardrail_intervened", MASKING),
            success(1, [], MASKED),
        ),
        answered(
            "bedrock-guardrail-masked-stream",
            "The same masked answer streamed: the guardrail's trace comes in the metadata event "
            "after messageStop; the masked text is the answer, never an error.",
            "bedrock",
            BEDROCK_MODEL,
            stream_guard,
            "Where does the refund go?",
            converse_stream(_halves(MASKED), "guardrail_intervened", MASKING),
            success(1, [], MASKED),
            stream=True,
        ),
        answered(
            "bedrock-guardrail-blocked",
            "A guardrail's content filter blocked the prompt (BLOCKED): llm.content_filtered, "
            "never retried.",
            "bedrock",
            BEDROCK_MODEL,
            guard,
            "Describe the fight in detail.",
            converse(
                [{"text": "Sorry, the model cannot answer this question."}],
                "guardrail_intervened",
                BLOCKING,
            ),
            failure("ProviderError", "llm.content_filtered"),
        ),
        answered(
            "bedrock-citations",
            "An answer grounded in a document: the text inside its citationsContent block is "
            "answer text, between the plain text blocks.",
            "bedrock",
            BEDROCK_MODEL,
            cites,
            "When are expense reports due?",
            converse(
                [
                    {"text": "Employees should "},
                    {"citationsContent": {"content": [{"text": CITED}], "citations": [CITATION]}},
                    {"text": " Late reports need a manager's approval."},
                ],
                "end_turn",
            ),
            success(1, [], CITED_ANSWER),
        ),
        answered(
            "bedrock-citations-stream",
            "The same cited answer streamed: a citation delta, then the cited text.",
            "bedrock",
            BEDROCK_MODEL,
            stream_cites,
            "When are expense reports due?",
            converse_stream(
                [
                    {"contentBlockIndex": 0, "delta": {"text": "Employees should "}},
                    {"contentBlockIndex": 1, "delta": {"citation": CITATION}},
                    {"contentBlockIndex": 1, "delta": {"text": CITED}},
                    {
                        "contentBlockIndex": 2,
                        "delta": {"text": " Late reports need a manager's approval."},
                    },
                ],
                "end_turn",
                None,
            ),
            success(1, [], CITED_ANSWER),
            stream=True,
        ),
        answered(
            "gemini-int-enums",
            "A Gemini answer whose enums are numbers (finishReason 1, safety ratings too): "
            "read as STOP, the text is the answer.",
            "gemini",
            gemini.model,
            [gemini_ref],
            "What is the capital of France?",
            answer(200, gemini.json_headers, body=gemini_numbers(1)),
            success(1, [], paris),
            request=gemini.request(),
        ),
        answered(
            "vertex-int-enums",
            "A Vertex AI answer whose enums are numbers (finishReason 1): read as STOP.",
            "vertex",
            "gemini-3.7-flash",
            [vertex_ref],
            "What is the capital of France?",
            answer(200, gemini.json_headers, body=gemini_numbers(1)),
            success(1, [], paris),
        ),
        answered(
            "vertex-int-enums-blocklist",
            "A Vertex AI answer stopped with finishReason 6, Vertex's BLOCKLIST (the Gemini "
            "API's 6 is LANGUAGE): llm.content_filtered, never retried.",
            "vertex",
            "gemini-3.7-flash",
            [vertex_ref],
            "What is the capital of France?",
            answer(200, gemini.json_headers, body=gemini_numbers(6, "")),
            failure("ProviderError", "llm.content_filtered"),
        ),
    ]


def build() -> list[Cassette]:
    providers: list[Provider] = [OpenAI(), Azure(), Anthropic(), Gemini(), Ollama(), VLLM()]
    out: list[Cassette] = []
    for p in providers:
        out += provider_cassettes(p)
    out += openai_strict(OpenAI())
    out += stream_error_retries()
    out += recorded_cassettes()
    out += answers_read_right()
    names = [c.name for c in out]
    assert len(names) == len(set(names)), "cassette names must be unique"
    return sorted(out, key=lambda c: c.name)


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for item in build():
        target = HERE / f"{item.name}.json"
        text = dump_cassette(item)
        current = target.read_text(encoding="utf-8") if target.exists() else None
        if current == text:
            continue
        if check:
            stale.append(target.name)
        else:
            target.write_text(text, encoding="utf-8")
            print(f"wrote {target.relative_to(ROOT)}")
    if stale:
        print("out of date (run python corpus/make_cassettes.py): " + ", ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
