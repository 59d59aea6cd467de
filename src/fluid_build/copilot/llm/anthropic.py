"""Anthropic's messages API, with tool use; structured output through a forced tool."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, ClassVar, Final

from fluid_build.copilot.llm.answer_shape import COUNT, NULL, TEXT, text_of
from fluid_build.copilot.llm.base import SAMPLING_OPTIONS, Adapter, Parsed, Request, StreamState
from fluid_build.copilot.llm.types import CallSpec, StreamEvent, ToolCall, Usage

__all__ = [
    "ANTHROPIC_VERSION",
    "THINKING_BUDGETS",
    "AnthropicAdapter",
    "adaptive_thinking",
    "choose_tool",
    "takes_thinking",
    "thinking_fields",
    "thinking_refusals",
]

ANTHROPIC_BASE_URL = "https://api.anthropic.com"
ANTHROPIC_VERSION = "2023-06-01"
DEFAULT_MAX_TOKENS = 4096

#: ``reasoning_effort`` -> ``thinking.budget_tokens`` (docs/llm-providers.md, "Call
#: options"). 1024 is the least Anthropic takes; 24576 keeps budget and answer room
#: (:data:`DEFAULT_MAX_TOKENS`) under the 32000-token output of the smallest thinking model.
THINKING_BUDGETS: Final = {"low": 1024, "medium": 8192, "high": 24576}
MIN_THINKING_BUDGET: Final = 1024
#: Claude models before extended thinking (Claude 2, Instant, the 3 and 3.5 families):
#: ``thinking`` is an error there, so ``reasoning_effort`` is refused before sending.
_NO_THINKING: Final = re.compile(r"claude-(?:instant|v?2|3-(?:haiku|sonnet|opus|5))")


def takes_thinking(model: str) -> bool:
    """Whether a Claude model id (Anthropic's or Bedrock's) has extended thinking: any but
    the families known to lack it (a name fluid does not know, such as a proxy's alias,
    is given the benefit of the doubt)."""
    return _NO_THINKING.search(model) is None


#: Claude models that think adaptively: ``thinking: {"type": "adaptive"}`` with the effort in
#: ``output_config.effort``. Opus 4.7 and later take nothing else (``"enabled"`` with a
#: budget is a 400); Opus and Sonnet 4.6 deprecate the budget. Sources:
#: platform.claude.com/docs/en/build-with-claude/adaptive-thinking and
#: docs.aws.amazon.com/bedrock/latest/userguide/claude-messages-adaptive-thinking.html.
_ADAPTIVE: Final = re.compile(
    r"claude-(?:(?:opus|sonnet)-4-[6-9]|(?:opus|sonnet|haiku)-[5-9]|mythos|fable)"
)


def adaptive_thinking(model: str) -> bool:
    """Whether a Claude model id (Anthropic's or Bedrock's) thinks adaptively."""
    return _ADAPTIVE.search(model) is not None


def thinking_fields(effort: str, cap: int | None, model: str) -> tuple[dict[str, Any], int]:
    """The request fields for ``reasoning_effort`` and the ``max_tokens`` to send beside them.

    Adaptive models get ``thinking: {"type": "adaptive"}`` and ``output_config.effort``;
    the others ``thinking: {"type": "enabled", "budget_tokens": N}``
    (:data:`THINKING_BUDGETS`). Thinking counts toward ``max_tokens``: without a cap the
    answer gets :data:`DEFAULT_MAX_TOKENS` beside the effort's budget. A cap
    (``max_output_tokens``, or the one a USD budget sets) is kept; when it does not exceed
    the budget, thinking gets half of it (at least 1024). A cap too small to think in is
    one of :func:`thinking_refusals`, refused (or dropped) before the request is built.
    """
    budget = THINKING_BUDGETS[effort]
    if adaptive_thinking(model):
        fields: dict[str, Any] = {
            "thinking": {"type": "adaptive"},
            "output_config": {"effort": effort},
        }
        return fields, cap if cap is not None else budget + DEFAULT_MAX_TOKENS
    if cap is None:
        return {
            "thinking": {"type": "enabled", "budget_tokens": budget}
        }, budget + DEFAULT_MAX_TOKENS
    if cap <= budget:
        budget = max(MIN_THINKING_BUDGET, cap // 2)
    return {"thinking": {"type": "enabled", "budget_tokens": budget}}, cap


def thinking_refusals(spec: CallSpec, respond: str | None) -> dict[str, str]:
    """Why ``reasoning_effort`` cannot go with the rest of ``spec`` (empty: it can).

    Extended thinking takes only tool choices ``auto`` and ``none``, so a forced tool
    (``required``, a name, or the answer tool fluid forces for a ``response_model``)
    refuses it, as pydantic-ai refuses thinking with output tools; and a budgeted model
    needs more than :data:`MIN_THINKING_BUDGET` tokens of ``max_tokens``.
    """
    if spec.reasoning_effort is None:
        return {}
    choice, _ = choose_tool(spec, respond)
    if choice is not None and choice not in ("auto", "none"):
        why = (
            "a response_model (answered through a tool fluid forces)"
            if spec.response_schema is not None and spec.tool_choice not in ("required", choice)
            else f"tool_choice={spec.tool_choice!r}"
        )
        return {
            "reasoning_effort": f"extended thinking allows only tool_choice 'auto' or 'none', "
            f"and {why} forces a tool (docs.claude.com, extended thinking)"
        }
    cap = spec.max_output_tokens
    if cap is not None and cap <= MIN_THINKING_BUDGET and not adaptive_thinking(spec.model):
        return {
            "reasoning_effort": f"thinking needs at least {MIN_THINKING_BUDGET} tokens and the "
            f"answer more, and max_output_tokens={cap} leaves none"
        }
    return {}


def choose_tool(spec: CallSpec, respond: str | None) -> tuple[str | None, bool]:
    """The tool choice of a forced-tool provider (Anthropic, Bedrock Converse), as
    ``(choice, offer_respond)``: choice is None (send none), ``"auto"``, ``"none"``,
    ``"any"`` or a tool's name; ``respond`` is the structured answer's tool, if any.

    With a response schema the answer itself is a tool call, so the caller's
    ``tool_choice`` is read against the caller's tools: ``"auto"`` (and no choice)
    lets the model call one of them or answer (``"any"``, or the answer's tool when
    there are no others), ``"none"`` forces the answer, and ``"required"`` or a name
    forces the caller's tools, without the answer's tool on offer this turn.
    """
    choice = spec.tool_choice
    if respond is None:
        if not spec.tools:
            return None, False  # nothing to choose among: tool_choice needs tools
        if choice is None:
            return ("auto" if spec.parallel_tool_calls is not None else None), False
        return ("any" if choice == "required" else choice), False
    if choice in (None, "auto"):
        return ("any" if spec.tools else respond), True
    if choice == "none":
        return respond, True
    return ("any" if choice == "required" else choice), False


def _respond_tool(spec: CallSpec) -> str:
    return f"respond_{spec.schema_name}"[:64]


def anthropic_messages(spec: CallSpec) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for message in spec.messages:
        role = message.get("role", "user")
        content = message.get("content") or ""
        if role == "tool":
            block = {
                "type": "tool_result",
                "tool_use_id": message.get("tool_call_id", ""),
                "content": content if isinstance(content, str) else json.dumps(content),
            }
            if out and out[-1]["role"] == "user" and isinstance(out[-1]["content"], list):
                out[-1]["content"].append(block)  # results of one round go in one user turn
            else:
                out.append({"role": "user", "content": [block]})
            continue
        if role == "assistant" and message.get("tool_calls"):
            blocks: list[dict[str, Any]] = [{"type": "text", "text": content}] if content else []
            blocks += [
                {
                    "type": "tool_use",
                    "id": c["id"],
                    "name": c["name"],
                    "input": c.get("arguments", {}),
                }
                for c in message["tool_calls"]
            ]
            out.append({"role": "assistant", "content": blocks})
            continue
        out.append({"role": "assistant" if role == "assistant" else "user", "content": content})
    return out


_USAGE = {
    "input_tokens": COUNT,
    "output_tokens": COUNT,
    "cache_creation_input_tokens": COUNT,
    "cache_read_input_tokens": COUNT,
}
#: The usage fields an Anthropic answer may carry, and what they become.
_USAGE_FIELDS = (
    "input_tokens",
    "output_tokens",
    "cache_creation_input_tokens",
    "cache_read_input_tokens",
)


def _counts(usage: Any, into: dict[str, int] | None = None) -> dict[str, int]:
    """The usage counts an answer (or a stream event) carries; later events win per field."""
    counts = dict(into or {})
    if isinstance(usage, dict):
        details = usage.get("output_tokens_details")
        found = {name: usage.get(name) for name in _USAGE_FIELDS}
        if isinstance(details, dict):
            found["thinking_tokens"] = details.get("thinking_tokens")
        for name, value in found.items():
            if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                counts[name] = value
    return counts


def _usage(counts: dict[str, int]) -> Usage:
    """Anthropic counts cached reads and cache writes apart from input_tokens: all are input."""
    read = counts.get("cache_read_input_tokens", 0)
    written = counts.get("cache_creation_input_tokens", 0)
    return Usage(
        input_tokens=counts.get("input_tokens", 0) + read + written,
        output_tokens=counts.get("output_tokens", 0),
        reasoning_tokens=counts.get("thinking_tokens", 0),  # a part of output_tokens
        cache_read_tokens=read,
        cache_write_tokens=written,
    )


def _anthropic_choice(choice: str, parallel: bool | None) -> dict[str, Any]:
    kinds = {"auto": {"type": "auto"}, "none": {"type": "none"}, "any": {"type": "any"}}
    out: dict[str, Any] = kinds.get(choice) or {"type": "tool", "name": choice}
    if parallel is not None and out["type"] != "none":
        out["disable_parallel_tool_use"] = not parallel
    return out


class AnthropicAdapter(Adapter):
    provider = "anthropic"
    shape: ClassVar[Any] = {
        "content": [{"type": TEXT, "text": TEXT, "id": TEXT, "name": TEXT, "input": (dict, NULL)}],
        "usage": _USAGE,
        "stop_reason": TEXT,
        "model": TEXT,
    }
    chunk_shape: ClassVar[Any] = {
        "type": TEXT,
        "index": COUNT,
        "delta": {"type": TEXT, "text": TEXT, "partial_json": TEXT, "stop_reason": TEXT},
        "content_block": {"type": TEXT, "id": TEXT, "name": TEXT, "text": TEXT},
        "message": {"usage": _USAGE, "model": TEXT},
        "usage": _USAGE,
    }
    default_base_url = ANTHROPIC_BASE_URL
    key_header = ("x-api-key", "{key}")
    default_api_version = ANTHROPIC_VERSION
    version_header = "anthropic-version"
    models_path: ClassVar[str | None] = "/v1/models"
    models_query: ClassVar[Mapping[str, str | int]] = {"limit": 1000}
    #: What says a stream is over; one that ends without it was cut (see call/core.py).
    #: message_delta's stop_reason comes with the final usage: only message_stop follows.
    stream_end: ClassVar[str] = "message_stop (or a message_delta with a stop_reason)"
    #: No ``seed``: the Messages API has none.
    options: ClassVar[frozenset[str]] = SAMPLING_OPTIONS - {"seed"}
    sampling_names: ClassVar[Mapping[str, str]] = {
        "temperature": "temperature",
        "top_p": "top_p",
        "stop": "stop_sequences",
    }

    def supported_options(self, model: str) -> frozenset[str]:
        return self.options if takes_thinking(model) else self.options - {"reasoning_effort"}

    def refusals(self, spec: CallSpec) -> dict[str, str]:
        respond = _respond_tool(spec) if spec.response_schema is not None else None
        return thinking_refusals(spec, respond)

    def request(self, spec: CallSpec, *, stream: bool) -> Request:
        base = (self.config.base_url or ANTHROPIC_BASE_URL).rstrip("/")
        headers = self.json_headers()
        max_tokens = spec.max_output_tokens
        thinking: dict[str, Any] | None = None
        if spec.reasoning_effort is not None:
            self.refuse(spec)  # what the call's checks let through: never sent as is
            thinking, max_tokens = thinking_fields(spec.reasoning_effort, max_tokens, spec.model)
        body: dict[str, Any] = {
            "model": spec.model,
            "max_tokens": max_tokens or DEFAULT_MAX_TOKENS,
            "messages": anthropic_messages(spec),
        }
        if spec.system:
            body["system"] = spec.system
        if thinking is not None:
            body.update(thinking)
        body.update(self.sampling(spec))
        tools = [
            {"name": t.name, "description": t.description, "input_schema": dict(t.parameters)}
            for t in spec.tools
        ]
        respond = _respond_tool(spec) if spec.response_schema is not None else None
        choice, offer_respond = choose_tool(spec, respond)
        if respond is not None and offer_respond:
            tools.append(
                {
                    "name": respond,
                    "description": "Return the final answer in exactly this shape.",
                    "input_schema": dict(spec.response_schema or {}),
                }
            )
        if choice is not None:
            body["tool_choice"] = _anthropic_choice(choice, spec.parallel_tool_calls)
        if tools:
            body["tools"] = tools
        if stream:
            body["stream"] = True
        return self.post(spec, f"{base}/v1/messages", headers, body)

    def parse(self, data: Any, spec: CallSpec) -> Parsed:
        respond = _respond_tool(spec) if spec.response_schema is not None else None
        texts: list[str] = []
        calls: list[ToolCall] = []
        for block in data.get("content") or []:
            if block.get("type") == "text":
                texts.append(text_of(block.get("text")))
            elif block.get("type") == "tool_use":
                arguments = block.get("input") if isinstance(block.get("input"), dict) else {}
                if block.get("name") == respond:
                    texts = [json.dumps(arguments)]  # the structured answer is the text
                    respond = None
                    continue
                calls.append(
                    ToolCall(
                        id=str(block.get("id") or ""),
                        name=str(block.get("name") or ""),
                        arguments=arguments,
                    )
                )
        return Parsed(
            "".join(texts),
            calls,
            _usage(_counts(data.get("usage"))),
            data.get("stop_reason"),
            data.get("model"),
        )

    def chunk_events(
        self, data: dict[str, Any], event: str, state: StreamState, spec: CallSpec
    ) -> list[StreamEvent]:
        kind = data.get("type") or event
        blocks = state.block_kinds
        events: list[StreamEvent] = []
        if kind == "message_start":
            message = data.get("message") or {}
            state.model = message.get("model")
            state.counts = _counts(message.get("usage"))
            state.usage = _usage(state.counts)
        elif kind == "content_block_start":
            index = int(data.get("index") or 0)
            block = data.get("content_block") or {}
            block_type = block.get("type")
            if block_type == "tool_use":
                if spec.response_schema is not None and block.get("name") == _respond_tool(spec):
                    blocks[index] = "respond"
                else:
                    blocks[index] = "tool"
                    events.append(state.add_call(index, id=block.get("id"), name=block.get("name")))
            elif block_type == "text":
                blocks[index] = "text"
                event_ = state.add_text(text_of(block.get("text")))
                if event_:
                    events.append(event_)
            else:
                # thinking, redacted_thinking, and every server-side tool block
                # (server_tool_use, web_search_tool_result, web_fetch_tool_result,
                # code execution and MCP results ...): the provider ran them, not
                # the caller, so none is a tool call and none is answer text.
                blocks[index] = "provider"
        elif kind == "content_block_delta":
            index = int(data.get("index") or 0)
            delta = data.get("delta") or {}
            owner = blocks.get(index, "text")
            if owner == "provider":
                pass  # thinking_delta, signature_delta, a server tool's input ...
            elif delta.get("type") == "text_delta":
                event_ = state.add_text(text_of(delta.get("text")))
                if event_:
                    events.append(event_)
            elif delta.get("type") == "input_json_delta":
                fragment = str(delta.get("partial_json") or "")
                if owner == "respond":
                    event_ = state.add_text(fragment)
                    if event_:
                        events.append(event_)
                elif owner == "tool":
                    events.append(state.add_call(index, arguments_delta=fragment))
        elif kind == "message_delta":
            state.finish_reason = (data.get("delta") or {}).get(
                "stop_reason"
            ) or state.finish_reason
            # Cumulative counts: each field this event carries is the final one.
            state.counts = _counts(data.get("usage"), state.counts)
            state.usage = _usage(state.counts)
            if (data.get("delta") or {}).get("stop_reason"):
                state.done = True
        elif kind == "message_stop":
            state.done = True
        return events

    def is_error_chunk(self, data: Any, event: str) -> bool:
        return event == "error" or (isinstance(data, dict) and data.get("type") == "error")
