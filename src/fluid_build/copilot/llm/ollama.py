"""Ollama's /api/chat: local models, NDJSON streaming, tools and a JSON-schema format."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, ClassVar

from fluid_build.copilot.llm.answer_shape import COUNT, NULL, TEXT, text_of
from fluid_build.copilot.llm.base import Adapter, Parsed, Request, StreamState, function_calls
from fluid_build.copilot.llm.types import CallSpec, StreamEvent, Usage

__all__ = ["OLLAMA_DEFAULT_HOST", "OllamaAdapter"]

OLLAMA_DEFAULT_HOST = "http://127.0.0.1:11434"


def ollama_messages(spec: CallSpec) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if spec.system:
        out.append({"role": "system", "content": spec.system})
    for message in spec.messages:
        entry: dict[str, Any] = {
            "role": message.get("role", "user"),
            "content": message.get("content") or "",
        }
        if message.get("tool_calls"):
            entry["tool_calls"] = [
                {"function": {"name": c["name"], "arguments": c.get("arguments", {})}}
                for c in message["tool_calls"]
            ]
        if message.get("role") == "tool" and message.get("name"):
            entry["tool_name"] = message["name"]
        out.append(entry)
    return out


def _usage(data: dict[str, Any]) -> Usage:
    # A negative count is none (as every adapter reads one): a budget never settles below 0.
    return Usage(
        input_tokens=max(0, int(data.get("prompt_eval_count") or 0)),
        output_tokens=max(0, int(data.get("eval_count") or 0)),
    )


def _harmony(model: str) -> bool:
    """Whether ``model`` is OpenAI's gpt-oss (``gpt-oss:20b``, ``library/gpt-oss``)."""
    return model.lower().rsplit("/", 1)[-1].startswith("gpt-oss")


_SHAPE = {
    "message": {
        "content": TEXT,
        "tool_calls": [{"id": TEXT, "function": {"name": TEXT, "arguments": (dict, str, NULL)}}],
    },
    "done_reason": TEXT,
    "prompt_eval_count": COUNT,
    "eval_count": COUNT,
    "model": TEXT,
}


class OllamaAdapter(Adapter):
    provider = "ollama"
    shape: ClassVar[Any] = _SHAPE
    chunk_shape: ClassVar[Any] = _SHAPE
    default_base_url = OLLAMA_DEFAULT_HOST
    models_path: ClassVar[str | None] = "/api/tags"
    stream_format = "ndjson"
    #: What says a stream is over; one that ends without it was cut (see call/core.py).
    stream_end: ClassVar[str] = "a line with done: true"
    #: /api/chat has no tool_choice and no parallel_tool_calls: those are refused.
    options: ClassVar[frozenset[str]] = frozenset(
        {"temperature", "top_p", "stop", "seed", "max_output_tokens"}
    )

    sampling_names: ClassVar[Mapping[str, str]] = {
        "temperature": "temperature",
        "top_p": "top_p",
        "stop": "stop",
        "seed": "seed",
    }

    def supported_options(self, model: str) -> frozenset[str]:
        # ``think`` takes a level ("low", "medium", "high") only on a harmony model
        # (gpt-oss); any other model answers 400 "think value ... is not supported for
        # this model" (ollama server/routes.go, ChatHandler). On/off thinking has no
        # effort to map: a caller turns it on with extra_body={"think": True}.
        if _harmony(model):
            return self.options | {"reasoning_effort"}
        return self.options

    def sampling(self, spec: CallSpec) -> dict[str, Any]:
        """The call's sampling options as /api/chat's ``options`` (the Modelfile's parameters)."""
        out = super().sampling(spec)
        if spec.max_output_tokens is not None:
            out["num_predict"] = spec.max_output_tokens
        return out

    def request(self, spec: CallSpec, *, stream: bool) -> Request:
        base = (self.config.base_url or OLLAMA_DEFAULT_HOST).rstrip("/")
        body: dict[str, Any] = {
            "model": spec.model,
            "messages": ollama_messages(spec),
            "stream": stream,  # Ollama streams unless told not to
        }
        if spec.tools:
            body["tools"] = [{"type": "function", "function": t.as_dict()} for t in spec.tools]
        if spec.response_schema is not None:
            body["format"] = dict(spec.response_schema)
        options = self.sampling(spec)
        if options:
            body["options"] = options
        if spec.reasoning_effort is not None:
            body["think"] = spec.reasoning_effort  # a level: gpt-oss only (supported_options)
        return self.post(spec, f"{base}/api/chat", self.json_headers(), body)

    def parse(self, data: Any, spec: CallSpec) -> Parsed:
        message = data.get("message") or {}
        return Parsed(
            text_of(message.get("content")),
            function_calls(message),
            _usage(data),
            data.get("done_reason"),
            data.get("model"),
        )

    def chunk_events(
        self, data: dict[str, Any], event: str, state: StreamState, spec: CallSpec
    ) -> list[StreamEvent]:
        events: list[StreamEvent] = []
        state.model = data.get("model") or state.model
        message = data.get("message") or {}
        text_event = state.add_text(text_of(message.get("content")))
        if text_event:
            events.append(text_event)
        for call in function_calls(message):
            index = len(state.calls)
            events.append(
                state.add_call(
                    index, id=call.id, name=call.name, arguments_delta=json.dumps(call.arguments)
                )
            )
        if data.get("done"):
            state.done = True
            state.finish_reason = data.get("done_reason")
            state.usage = _usage(data)
        return events
