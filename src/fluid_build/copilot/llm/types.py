"""What a provider call takes and gives back, in one shape for every provider.

The result models build their pydantic validators on first use (``defer_build``),
not at import: a process that never makes a call does not pay for them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "CallSpec",
    "Completion",
    "StreamEvent",
    "ToolCall",
    "ToolSpec",
    "Usage",
]


class ToolCall(BaseModel):
    """A tool the model asked to call, with its arguments decoded."""

    model_config = ConfigDict(frozen=True, defer_build=True)

    id: str
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class Usage(BaseModel):
    """Tokens one answer cost, counted the same way for every provider.

    ``input_tokens`` is everything the model read: cached reads and cache
    writes included (Anthropic reports those apart; they are added here).
    ``output_tokens`` is everything it wrote: thinking included (Gemini's
    ``thoughtsTokenCount`` is added here). The other fields say how much of
    those totals was reasoning, read from a cache or written to one; 0 when
    the provider does not say. Budgets count the totals.
    """

    model_config = ConfigDict(frozen=True, defer_build=True)

    input_tokens: int = 0
    output_tokens: int = 0
    #: Of ``output_tokens``: reasoning / thinking.
    reasoning_tokens: int = 0
    #: Of ``input_tokens``: read from the provider's prompt cache.
    cache_read_tokens: int = 0
    #: Of ``input_tokens``: written to the provider's prompt cache.
    cache_write_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens


class Completion(BaseModel):
    """One model answer: text, the validated object, tool calls, usage and provenance."""

    model_config = ConfigDict(arbitrary_types_allowed=True, defer_build=True)

    text: str = ""
    parsed: Any = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    usage: Usage = Field(default_factory=Usage)
    #: What this answer cost in USD; None when no price is known (docs/budgets.md).
    cost_usd: float | None = None
    provider: str
    model: str
    finish_reason: str | None = None
    attempts: int = 1
    request_id: str | None = None
    answered_by: str | None = None
    fallback_errors: list[dict[str, Any]] = Field(default_factory=list)
    #: What the provider said about this answer beside its text, JSON-safe, by topic:
    #: ``"guardrail"`` (a Bedrock guardrail changed the answer: its actions),
    #: ``"citations"`` (Bedrock's citations of the documents given). Empty when there is
    #: nothing to say (docs/llm-providers.md).
    details: dict[str, Any] = Field(default_factory=dict)


class StreamEvent(BaseModel):
    """One piece of a streamed answer.

    ``text``: a text delta. ``tool_call``: a fragment of a tool call's
    arguments (``index``, ``id`` and ``name`` once known, ``arguments_delta``).
    ``restart``: the stream was cut after text reached the caller and, with
    ``on_cut="restart"``, the call starts again from scratch: every text and
    tool-call event before this one is void; the whole new answer follows.
    ``code`` is the cut's reason code, ``reason`` its message, ``entry`` the
    ``provider:model`` that answers again (docs/fallbacks-and-breakers.md).
    ``done``: the end, with the assembled :class:`Completion` (its
    ``answered_by`` and ``fallback_errors`` name the chain's entries).
    """

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True, defer_build=True)

    type: Literal["text", "tool_call", "restart", "done"]
    text: str = ""
    index: int | None = None
    id: str | None = None
    name: str | None = None
    arguments_delta: str = ""
    completion: Completion | None = None
    code: str | None = None
    reason: str = ""
    entry: str | None = None


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A tool offered to the model; ``parameters`` is a JSON schema."""

    name: str
    description: str
    parameters: Mapping[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "parameters": dict(self.parameters),
        }


@dataclass(frozen=True, slots=True)
class CallSpec:
    """Everything an adapter needs to build one request.

    ``messages`` are neutral dicts: ``{"role": "user"|"assistant"|"tool",
    "content": str, "tool_calls": [...], "tool_call_id": ...}``.
    """

    model: str
    messages: Sequence[Mapping[str, Any]]
    system: str | None = None
    tools: Sequence[ToolSpec] = ()
    response_schema: Mapping[str, Any] | None = None
    schema_name: str = "response"
    strict: bool = False
    max_output_tokens: int | None = None
    #: ``extra_body`` (or its alias ``extra``): merged into the built body last, key by
    #: key (:func:`fluid_build.copilot.llm.base.merge_body`).
    extra: Mapping[str, Any] = field(default_factory=dict)
    # The call's sampling and tool options (docs/llm-providers.md, "Call options"); None or
    # empty: not set, and the provider's default applies. Each adapter maps the ones its
    # ``supported_options`` names to its own fields; the others never reach it.
    temperature: float | None = None
    top_p: float | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None
    #: ``"auto"``, ``"none"``, ``"required"``, or the name of one of ``tools``.
    tool_choice: str | None = None
    parallel_tool_calls: bool | None = None
    #: ``"low"``, ``"medium"`` or ``"high"``.
    reasoning_effort: str | None = None
    #: Sent on the request after the adapter's own headers (and before any signing).
    extra_headers: Mapping[str, str] = field(default_factory=dict)
