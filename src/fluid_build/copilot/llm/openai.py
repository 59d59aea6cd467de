"""OpenAI chat completions; also the base of Azure OpenAI and OpenAI-compatible servers."""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, ClassVar, Final

import httpx

from fluid_build._redact import truncate
from fluid_build.copilot.agents.errors import ProviderError
from fluid_build.copilot.llm.answer_shape import COUNT, NULL, TEXT
from fluid_build.copilot.llm.base import (
    SAMPLING_OPTIONS,
    Adapter,
    Parsed,
    ProviderConfig,
    Request,
    StreamState,
    function_calls,
)
from fluid_build.copilot.llm.types import CallSpec, StreamEvent, Usage

__all__ = [
    "CHAT_OPTIONS",
    "OpenAIAdapter",
    "named_tool_choice",
    "openai_messages",
]

OPENAI_BASE_URL = "https://api.openai.com/v1"

#: The call options chat completions has a field for (docs/llm-providers.md, "Call options").
CHAT_OPTIONS: Final = SAMPLING_OPTIONS


def named_tool_choice(choice: str) -> str | dict[str, Any]:
    """A ``tool_choice`` as chat completions takes it: a tool's name forces that function."""
    if choice in ("auto", "none", "required"):
        return choice
    return {"type": "function", "function": {"name": choice}}


def openai_messages(spec: CallSpec) -> list[dict[str, Any]]:
    """Neutral messages in the chat-completions shape."""
    out: list[dict[str, Any]] = []
    if spec.system:
        out.append({"role": "system", "content": spec.system})
    for message in spec.messages:
        role = message.get("role", "user")
        entry: dict[str, Any] = {"role": role, "content": message.get("content", "")}
        if role == "assistant" and message.get("tool_calls"):
            entry["tool_calls"] = [
                {
                    "id": call["id"],
                    "type": "function",
                    "function": {
                        "name": call["name"],
                        "arguments": json.dumps(call.get("arguments", {})),
                    },
                }
                for call in message["tool_calls"]
            ]
            entry["content"] = message.get("content") or None
        if role == "tool":
            entry["tool_call_id"] = message.get("tool_call_id", "")
        out.append(entry)
    return out


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _usage_of(data: Any) -> dict[str, Any] | None:
    """The usage object of an answer or chunk: ``usage``, or Groq's ``x_groq.usage``."""
    if not isinstance(data, dict):
        return None
    usage = data.get("usage")
    if isinstance(usage, dict) and usage:
        return usage
    groq = data.get("x_groq")
    usage = groq.get("usage") if isinstance(groq, dict) else None
    return usage if isinstance(usage, dict) and usage else None


def _usage(usage: dict[str, Any]) -> Usage:
    """prompt_tokens includes cached tokens and completion_tokens reasoning: both are subsets.

    Except where the total says otherwise: xAI's completion_tokens leaves its
    reasoning out (total_tokens = prompt + completion + reasoning), and output
    includes reasoning on every provider here, so it is added back.
    """
    prompt = usage.get("prompt_tokens_details")
    completion = usage.get("completion_tokens_details")
    inputs = _count(usage.get("prompt_tokens"))
    output = _count(usage.get("completion_tokens"))
    reasoning = _count(completion.get("reasoning_tokens")) if isinstance(completion, dict) else 0
    if reasoning and _count(usage.get("total_tokens")) == inputs + output + reasoning:
        output += reasoning
    return Usage(
        input_tokens=inputs,
        output_tokens=output,
        reasoning_tokens=reasoning,
        cache_read_tokens=_count(prompt.get("cached_tokens")) if isinstance(prompt, dict) else 0,
    )


_USAGE = {
    "prompt_tokens": COUNT,
    "completion_tokens": COUNT,
    "total_tokens": COUNT,
    "prompt_tokens_details": {"cached_tokens": COUNT},
    "completion_tokens_details": {"reasoning_tokens": COUNT},
}
_CONTENT = (str, list, NULL)  # a list of parts from some compatible servers (Mistral)


def _text(content: Any) -> str:
    """A message's text: a string, or the text parts of a list of parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(part.get("text") or "")
            for part in content
            if isinstance(part, dict) and part.get("type", "text") == "text"
        )
    raise TypeError("content")


#: How many endpoints one adapter remembers as refusing ``stream_options``: an adapter has
#: one URL, so one in practice; the cap bounds the memory whatever asks.
REMEMBERED_ENDPOINTS: Final = 64
# "stream_options" as a word, or "stream options" (vLLM: "Stream options can only be defined
# when `stream=True`"); never inside a longer name.
_STREAM_OPTIONS: Final = re.compile(r"(?<![a-z0-9_])stream[_ ]options(?![a-z0-9_])", re.I)


class Endpoints:
    """A bounded set of URLs, safe from any thread: past ``cap``, the oldest is forgotten."""

    def __init__(self, cap: int = REMEMBERED_ENDPOINTS) -> None:
        self.cap = cap
        self._urls: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()

    def __contains__(self, url: object) -> bool:
        with self._lock:
            return url in self._urls

    def __len__(self) -> int:
        with self._lock:
            return len(self._urls)

    def add(self, url: str) -> None:
        with self._lock:
            self._urls[url] = None
            self._urls.move_to_end(url)
            while len(self._urls) > self.cap:
                self._urls.popitem(last=False)


def names_stream_options(answer: httpx.Response) -> bool:
    """Whether an error answer's own words (message, param, code; or a text body) name
    ``stream_options``: vLLM's ``extra_forbidden`` at ``('body', 'stream_options')``
    (modelscope/ms-agent#489), Fireworks' "Extra inputs are not permitted, field:
    'stream_options'" (FlowiseAI/Flowise#2866), an OpenAI-style upstream's "Unknown
    parameter: 'stream_options'" with ``param`` naming it (QuantumNous/new-api#418)."""
    # Only an error answer comes here: a call that succeeds never loads the error tables.
    from fluid_build.copilot.agents.error_answers import extract_fields, read_body

    body = read_body(answer)
    if body.kind == "json" and isinstance(body.data, dict | list):
        fields = extract_fields(body.data)
        said = f"{fields.search_text()} {fields.param}"
    else:
        said = body.text[:4000]
    return bool(_STREAM_OPTIONS.search(said))


def _refused(refusal: str, spec: CallSpec, provider: str) -> ProviderError:
    """A refusal where a structured answer was asked for: no retry or correction can help."""
    return ProviderError(
        f"the model refused to answer in the {spec.schema_name} shape: {truncate(refusal, 200)}",
        provider=provider,
        model=spec.model,
        status_code=200,
        code="llm.content_filtered",
        retryable=False,
        details={"refusal": truncate(refusal, 500)},
    )


class OpenAIAdapter(Adapter):
    provider = "openai"
    default_base_url: ClassVar[str | None] = OPENAI_BASE_URL
    models_path: ClassVar[str | None] = "/models"
    #: What says a stream is over; one that ends without it was cut (see call/core.py).
    #: A finish_reason is marked here, ``[DONE]`` (the chunk reader ends there) by the
    #: stream's reader: a server that sends one of the two has finished the answer.
    stream_end: ClassVar[str] = "[DONE] or a finish_reason"
    shape: ClassVar[Any] = {
        "choices": [
            {
                "message": {
                    "content": _CONTENT,
                    "refusal": TEXT,
                    "tool_calls": [
                        {"id": TEXT, "function": {"name": TEXT, "arguments": (str, dict, NULL)}}
                    ],
                },
                "finish_reason": TEXT,
            }
        ],
        "usage": _USAGE,
        "model": TEXT,
    }
    chunk_shape: ClassVar[Any] = {
        "choices": [
            {
                "delta": {
                    "content": _CONTENT,
                    "refusal": TEXT,
                    "tool_calls": [
                        {
                            "index": COUNT,
                            "id": TEXT,
                            "function": {"name": TEXT, "arguments": TEXT},
                        }
                    ],
                },
                "finish_reason": TEXT,
            }
        ],
        "usage": _USAGE,
        "x_groq": {"usage": _USAGE},
        "model": TEXT,
    }

    options: ClassVar[frozenset[str]] = CHAT_OPTIONS
    sampling_names: ClassVar[Mapping[str, str]] = {
        "temperature": "temperature",
        "top_p": "top_p",
        "stop": "stop",
        "seed": "seed",
    }

    def __init__(self, config: ProviderConfig) -> None:
        super().__init__(config)
        #: The endpoints that refused ``stream_options`` (a 400 naming it): their streams are
        #: asked without it from then on, for this adapter's life (its client's: a new client,
        #: or a new process, asks again). See :meth:`refused_own_field`.
        self.without_stream_options = Endpoints()

    def url(self) -> str:
        # ``endpoint``: a subclass's own default_base_url serves it (a new provider speaking
        # OpenAI's API is a subclass and a registry entry).
        base = (self.endpoint or OPENAI_BASE_URL).rstrip("/")
        return f"{base}/chat/completions"

    def headers(self) -> dict[str, str]:
        return self.json_headers()

    def fields(self, spec: CallSpec, *, stream: bool) -> dict[str, Any]:
        """The body fluid builds for ``spec``, before the caller's ``extra_body``."""
        body: dict[str, Any] = {"model": spec.model, "messages": openai_messages(spec)}
        if spec.tools:
            body["tools"] = [
                {"type": "function", "function": tool.as_dict()} for tool in spec.tools
            ]
        if spec.response_schema is not None:
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {
                    "name": spec.schema_name,
                    "schema": dict(spec.response_schema),
                    "strict": spec.strict,
                },
            }
        if spec.max_output_tokens is not None:
            body["max_completion_tokens"] = spec.max_output_tokens
        body.update(self.sampling(spec))
        if stream:
            body["stream"] = True
            # The usage of a stream comes only when asked for, in a last chunk of its own.
            if self.url() not in self.without_stream_options:
                body["stream_options"] = {"include_usage": True}
        return body

    def refused_own_field(self, spec: CallSpec, answer: Any) -> bool:
        """A 400 (422 from a FastAPI server) naming ``stream_options``, which fluid sent of its
        own accord (not the caller's ``extra_body``): the endpoint is remembered, and its
        streams are asked again without it, carrying no usage."""
        url = self.url()
        if (
            not isinstance(answer, httpx.Response)
            or answer.status_code not in (400, 422)
            or "stream_options" in spec.extra
            or url in self.without_stream_options
            or not names_stream_options(answer)
        ):
            return False
        self.without_stream_options.add(url)
        return True

    def sampling(self, spec: CallSpec) -> dict[str, Any]:
        """The call's sampling and tool options under chat completions' names; only those
        set (an option not set changes nothing in the body)."""
        out = super().sampling(spec)
        if spec.tool_choice is not None:
            out["tool_choice"] = named_tool_choice(spec.tool_choice)
        # OpenAI answers 400 to parallel_tool_calls without tools; with no tool there is
        # no call to make in parallel, so the option has nothing to say.
        if spec.parallel_tool_calls is not None and spec.tools:
            out["parallel_tool_calls"] = spec.parallel_tool_calls
        if spec.reasoning_effort is not None:
            out["reasoning_effort"] = spec.reasoning_effort
        return out

    def request(self, spec: CallSpec, *, stream: bool) -> Request:
        return self.post(spec, self.url(), self.headers(), self.fields(spec, stream=stream))

    def parse(self, data: Any, spec: CallSpec) -> Parsed:
        choice = (data.get("choices") or [{}])[0]
        message = choice.get("message") or {}
        calls = function_calls(message)
        text = _text(message.get("content"))
        if not text and message.get("refusal"):
            if spec.response_schema is not None and not calls:
                raise _refused(str(message["refusal"]), spec, self.provider)
            text = str(message["refusal"])
        usage = _usage_of(data)
        return Parsed(
            str(text),
            calls,
            Usage() if usage is None else _usage(usage),
            choice.get("finish_reason"),
            data.get("model"),
        )

    def chunk_events(
        self, data: dict[str, Any], event: str, state: StreamState, spec: CallSpec
    ) -> list[StreamEvent]:
        events: list[StreamEvent] = []
        state.model = data.get("model") or state.model
        usage = _usage_of(data)
        if usage is not None:
            state.usage = _usage(usage)
        for choice in data.get("choices") or []:
            delta = choice.get("delta") or {}
            text_event = state.add_text(_text(delta.get("content")))
            if text_event:
                events.append(text_event)
            if isinstance(delta.get("refusal"), str):
                state.refusal.append(delta["refusal"])
            for call in delta.get("tool_calls") or []:
                function = call.get("function") or {}
                events.append(
                    state.add_call(
                        int(call.get("index") or 0),
                        id=call.get("id"),
                        name=function.get("name"),
                        arguments_delta=function.get("arguments") or "",
                    )
                )
            if choice.get("finish_reason"):
                state.finish_reason = choice["finish_reason"]
                state.done = True  # the answer is whole; a usage chunk and [DONE] may follow
                refused = "".join(state.refusal)
                if refused and spec.response_schema is not None and not (state.text or state.calls):
                    raise _refused(refused, spec, self.provider)
        return events
