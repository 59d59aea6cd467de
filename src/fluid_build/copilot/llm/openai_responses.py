"""OpenAI's Responses API (``POST /responses``): the only API of o1-pro, o3-pro and the
deep research and codex models; DeepSeek's ``/responses`` speaks it too.

An answer is a list of output items. Only ``message`` items are answer text and
only ``function_call`` items are the caller's tool calls (their id is the
``call_id`` a ``function_call_output`` answers); reasoning items and the items of
tools the provider ran itself (web and file search, code interpreter, MCP, image
generation ...) are neither. The finish reason is the provider's own word:
``status``, or ``incomplete_details.reason`` when the answer is incomplete.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, ClassVar

from fluid_build.copilot.agents.errors import ProviderError
from fluid_build.copilot.llm.answer_shape import COUNT, NULL, TEXT, text_of
from fluid_build.copilot.llm.base import (
    SAMPLING_OPTIONS,
    Adapter,
    Parsed,
    Request,
    StreamState,
    loads_arguments,
)
from fluid_build.copilot.llm.openai import OPENAI_BASE_URL, _refused
from fluid_build.copilot.llm.types import CallSpec, StreamEvent, ToolCall, Usage

__all__ = ["OpenAIResponsesAdapter", "responses_input"]

#: The stream events after which nothing of the answer follows.
_ENDS = frozenset({"response.completed", "response.incomplete", "response.failed"})


def responses_input(spec: CallSpec) -> list[dict[str, Any]]:
    """Neutral messages as Responses ``input`` items; the system prompt goes apart."""
    out: list[dict[str, Any]] = []
    for message in spec.messages:
        role = message.get("role", "user")
        content = message.get("content") or ""
        if role == "tool":
            out.append(
                {
                    "type": "function_call_output",
                    "call_id": message.get("tool_call_id", ""),
                    "output": content if isinstance(content, str) else json.dumps(content),
                }
            )
            continue
        if role == "assistant" and message.get("tool_calls"):
            if content:
                out.append({"role": "assistant", "content": content})
            out += [
                {
                    "type": "function_call",
                    "call_id": call["id"],
                    "name": call["name"],
                    "arguments": json.dumps(call.get("arguments", {})),
                }
                for call in message["tool_calls"]
            ]
            continue
        out.append({"role": role, "content": content})
    return out


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _usage(usage: Any) -> Usage:
    """input_tokens includes cached tokens and output_tokens reasoning: both are subsets."""
    if not isinstance(usage, dict):
        return Usage()
    read = usage.get("input_tokens_details")
    thought = usage.get("output_tokens_details")
    return Usage(
        input_tokens=_count(usage.get("input_tokens")),
        output_tokens=_count(usage.get("output_tokens")),
        reasoning_tokens=_count(thought.get("reasoning_tokens"))
        if isinstance(thought, dict)
        else 0,
        cache_read_tokens=_count(read.get("cached_tokens")) if isinstance(read, dict) else 0,
    )


def _finish_reason(response: dict[str, Any]) -> str | None:
    details = response.get("incomplete_details")
    if response.get("status") == "incomplete" and isinstance(details, dict):
        return details.get("reason") or "incomplete"
    status = response.get("status")
    return status if isinstance(status, str) else None


def _function_call(item: dict[str, Any], index: int) -> ToolCall:
    return ToolCall(
        id=str(item.get("call_id") or item.get("id") or f"call_{index}"),
        name=str(item.get("name") or ""),
        arguments=loads_arguments(item.get("arguments")),
    )


def _classified(error: Any, provider: str, model: str) -> ProviderError:
    """A failed response's (or an ``error`` event's) error, classified as an error body is.

    The Responses API names the kind of error in ``code`` (``rate_limit_exceeded``,
    ``server_error``, ``context_length_exceeded``), where chat completions names it
    in ``type``: the classifier is given it as the type it knows.
    """
    from fluid_build.copilot.agents.error_classification import ErrorAnswer, classify_answer

    fields = dict(error) if isinstance(error, dict) else {"message": "the response failed"}
    if not fields.get("type") and isinstance(fields.get("code"), str):
        fields["type"] = fields["code"]
    answer = ErrorAnswer.of_json(200, {"error": fields}, provider=provider, model=model)
    return classify_answer(answer)


def _event_error(data: dict[str, Any]) -> Any:
    """An ``error`` event's error: nested under ``error``, or its own top-level fields."""
    nested = data.get("error")
    if isinstance(nested, dict):
        return nested
    return {key: data[key] for key in ("code", "message", "param") if key in data}


_USAGE = {
    "input_tokens": COUNT,
    "output_tokens": COUNT,
    "input_tokens_details": {"cached_tokens": COUNT},
    "output_tokens_details": {"reasoning_tokens": COUNT},
}
_ITEM = {
    "type": TEXT,
    "call_id": TEXT,
    "name": TEXT,
    "arguments": (str, dict, NULL),
    "content": [{"type": TEXT, "text": TEXT, "refusal": TEXT}],
}
_RESPONSE = {
    "status": TEXT,
    "model": TEXT,
    "output": [_ITEM],
    "usage": _USAGE,
    "incomplete_details": {"reason": TEXT},
}


class OpenAIResponsesAdapter(Adapter):
    provider = "openai_responses"
    default_base_url: ClassVar[str | None] = OPENAI_BASE_URL
    models_path: ClassVar[str | None] = "/models"
    #: What says a stream is over; one that ends without it was cut (see call/core.py).
    stream_end: ClassVar[str] = "response.completed (or response.incomplete)"
    shape: ClassVar[Any] = _RESPONSE
    chunk_shape: ClassVar[Any] = {
        "type": TEXT,
        "delta": TEXT,
        "output_index": COUNT,
        "item": _ITEM,
        "response": _RESPONSE,
    }

    #: The Responses API has no ``stop`` and no ``seed``: those are refused.
    options: ClassVar[frozenset[str]] = SAMPLING_OPTIONS - {"stop", "seed"}
    sampling_names: ClassVar[Mapping[str, str]] = {"temperature": "temperature", "top_p": "top_p"}

    def sampling(self, spec: CallSpec) -> dict[str, Any]:
        """The call's options under the Responses API's names; only those set."""
        out = super().sampling(spec)
        if spec.tool_choice is not None:
            choice = spec.tool_choice
            named = choice not in ("auto", "none", "required")
            out["tool_choice"] = {"type": "function", "name": choice} if named else choice
        if spec.parallel_tool_calls is not None:
            out["parallel_tool_calls"] = spec.parallel_tool_calls
        if spec.reasoning_effort is not None:
            out["reasoning"] = {"effort": spec.reasoning_effort}
        return out

    def request(self, spec: CallSpec, *, stream: bool) -> Request:
        base = (self.config.base_url or OPENAI_BASE_URL).rstrip("/")
        body: dict[str, Any] = {"model": spec.model, "input": responses_input(spec)}
        if spec.system:
            body["instructions"] = spec.system
        if spec.tools:
            # The Responses API makes a function tool strict unless told otherwise, and
            # strict mode rejects the plain JSON schemas tools are declared with.
            body["tools"] = [
                {"type": "function", **tool.as_dict(), "strict": False} for tool in spec.tools
            ]
        if spec.response_schema is not None:
            body["text"] = {
                "format": {
                    "type": "json_schema",
                    "name": spec.schema_name,
                    "schema": dict(spec.response_schema),
                    "strict": spec.strict,
                }
            }
        if spec.max_output_tokens is not None:
            body["max_output_tokens"] = spec.max_output_tokens
        body.update(self.sampling(spec))
        if stream:
            body["stream"] = True
        return self.post(spec, f"{base}/responses", self.json_headers(), body)

    def parse(self, data: Any, spec: CallSpec) -> Parsed:
        if data.get("status") == "failed":
            raise _classified(data.get("error"), self.provider, spec.model)
        texts: list[str] = []
        refusals: list[str] = []
        calls: list[ToolCall] = []
        for index, item in enumerate(data.get("output") or []):
            kind = item.get("type")
            if kind == "function_call":
                calls.append(_function_call(item, index))
            elif kind == "message":
                for part in item.get("content") or []:
                    if part.get("type") == "output_text":
                        texts.append(text_of(part.get("text")))
                    elif part.get("type") == "refusal":
                        refusals.append(text_of(part.get("refusal")))
            # reasoning, and every item of a tool the provider ran: not the caller's
        text = "".join(texts)
        if not text and refusals:
            refusal = "".join(refusals)
            if spec.response_schema is not None and not calls:
                raise _refused(refusal, spec, self.provider)
            text = refusal  # the chat-completions rule: the refusal is the answer's words
        return Parsed(
            text, calls, _usage(data.get("usage")), _finish_reason(data), data.get("model")
        )

    def chunk_events(
        self, data: dict[str, Any], event: str, state: StreamState, spec: CallSpec
    ) -> list[StreamEvent]:
        kind = data.get("type") or event
        events: list[StreamEvent] = []
        if kind == "error":
            raise self._broken(_event_error(data), state, spec)
        if kind == "response.output_text.delta":
            text_event = state.add_text(text_of(data.get("delta")))
            if text_event:
                events.append(text_event)
        elif kind == "response.refusal.delta":
            delta = text_of(data.get("delta"))
            if spec.response_schema is None:  # as in a whole answer: the refusal is the words
                text_event = state.add_text(delta)
                if text_event:
                    events.append(text_event)
            else:
                state.refusal.append(delta)
        elif kind in {"response.output_item.added", "response.output_item.done"}:
            item = data.get("item") or {}
            if item.get("type") == "function_call":
                index = int(data.get("output_index") or 0)
                known = index in state.calls
                events.append(state.add_call(index, id=item.get("call_id"), name=item.get("name")))
                # A server that sends no argument deltas gives them whole when the item is done.
                arguments = item.get("arguments")
                if kind.endswith(".done") and not (known and state.calls[index]["args"]):
                    if isinstance(arguments, dict):
                        arguments = json.dumps(arguments)
                    if arguments:
                        events[-1] = state.add_call(index, arguments_delta=str(arguments))
        elif kind == "response.function_call_arguments.delta":
            index = int(data.get("output_index") or 0)
            delta = text_of(data.get("delta"))
            if delta:
                events.append(state.add_call(index, arguments_delta=delta))
        elif kind in {"response.created", "response.in_progress"} or kind in _ENDS:
            response = data.get("response") or {}
            state.model = response.get("model") or state.model
            if kind in _ENDS:
                self._end(response, kind, state, spec)
        return events

    def _end(self, response: dict[str, Any], kind: str, state: StreamState, spec: CallSpec) -> None:
        if kind == "response.failed":
            raise self._broken(response.get("error"), state, spec)
        state.usage = _usage(response.get("usage"))
        state.finish_reason = _finish_reason(response)
        state.done = True
        refused = "".join(state.refusal)
        if refused and not (state.text or state.calls):
            raise _refused(refused, spec, self.provider)

    def _broken(self, error: Any, state: StreamState, spec: CallSpec) -> ProviderError:
        """A stream's error; once text or a tool call had arrived, it carries them."""
        classified = _classified(error, self.provider, spec.model)
        if state.text or state.calls:
            return classified.with_details(interrupted=True, **state.partial())
        return classified

    def is_error_chunk(self, data: Any, event: str) -> bool:
        # An error event that is an object is read by chunk_events (its kind is in
        # ``code``); only one that is not JSON goes to the classifier as it came.
        return event == "error" and not isinstance(data, dict)
