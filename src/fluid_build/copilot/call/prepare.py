"""The first stage of a call: the neutral request, its schema, and the pre-flight.

A response model's JSON schema (and its strict-mode hardening) is the same
for every call with that model, so it is made once per (model class, strict)
and reused; pydantic would otherwise regenerate it on every call.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx
from pydantic import BaseModel

from fluid_build.copilot.call.drive import DEADLINE_EXTENSION
from fluid_build.copilot.call.phases import PHASE_EXTENSION, PhaseLimits
from fluid_build.copilot.call.seams import is_own_pool
from fluid_build.copilot.call.wire import ACCEPT_ENCODING, Deadline
from fluid_build.copilot.llm.base import Request
from fluid_build.copilot.llm.types import CallSpec, ToolSpec

if TYPE_CHECKING:
    from fluid_build.copilot.schema.strict import StrictSchema

__all__ = [
    "Messages",
    "Prepared",
    "Tools",
    "http_request",
    "prepare",
    "response_schema",
    "tool_spec",
]


Messages = str | Sequence[Mapping[str, Any]]
Tools = Sequence[ToolSpec | Mapping[str, Any]] | None


@dataclass(frozen=True, slots=True)
class Prepared:
    """One call, ready to send: the spec, and how to read the answer back."""

    spec: CallSpec
    response_model: type[BaseModel] | None
    strict: StrictSchema | None
    validate: bool = True
    #: Counted only for a call under a USD budget (``prepare(count=True)``): the
    #: prompt's tokens, and the most the answer may take (``max_output_tokens``,
    #: else the model's maximum output).
    input_tokens: int | None = None
    most_output_tokens: int | None = None


# Per model class (weakly: a class made at run time may go), per strict flag:
# the schema sent, its strict codec (or None) and its name.
_Schema = tuple[dict[str, Any], "StrictSchema | None", str]
_SCHEMAS: weakref.WeakKeyDictionary[type[BaseModel], dict[bool, _Schema]] = (
    weakref.WeakKeyDictionary()
)


def response_schema(model: type[BaseModel], strict: bool) -> _Schema:
    """``model``'s JSON schema (hardened for OpenAI strict mode when ``strict``), cached.

    The schema is shared between calls: it is only ever read.
    """
    known = _SCHEMAS.setdefault(model, {})
    found = known.get(strict)
    if found is None:
        schema = model.model_json_schema()
        name = model.__name__
        codec: StrictSchema | None = None
        if strict:
            from fluid_build.copilot.schema.strict import harden_schema

            codec = harden_schema(schema, name=name)
            schema = codec.schema
        found = known[strict] = (schema, codec, name)
    return found


def _messages(messages: Messages) -> list[dict[str, Any]]:
    if isinstance(messages, str):
        return [{"role": "user", "content": messages}]
    return [dict(m) for m in messages]


def tool_spec(tool: ToolSpec | Mapping[str, Any]) -> ToolSpec:
    """A tool as given (a ToolSpec, or an OpenAI-style dict) as a ToolSpec."""
    if isinstance(tool, ToolSpec):
        return tool
    spec = tool.get("function") if tool.get("type") == "function" else tool
    if not isinstance(spec, Mapping) or not spec.get("name"):
        raise ValueError(f"a tool needs a name and a JSON-schema 'parameters': {tool!r:.200}")
    return ToolSpec(
        str(spec["name"]),
        str(spec.get("description") or ""),
        dict(spec.get("parameters") or {"type": "object", "properties": {}}),
    )


def prepare(
    provider: str,
    model: str,
    messages: Messages,
    *,
    system: str | None,
    response_model: type[BaseModel] | None,
    tools: Tools,
    max_output_tokens: int | None,
    capability_matrix: Mapping[str, Any] | None,
    strict_schema: bool,
    validate: bool = True,
    server_window: int | None = None,
    count: bool = False,
    sampling: Mapping[str, Any] | None = None,
) -> Prepared:
    """The call as the adapters take it; refuses a prompt that cannot fit, before any I/O.

    ``count`` (a call under a USD budget) counts the prompt's tokens and the
    most output the call may take, for its reservation to price.
    """
    from fluid_build.copilot.call.preflight import check_context

    neutral = _messages(messages)
    tool_specs = tuple([tool_spec(t) for t in tools]) if tools else ()
    schema: dict[str, Any] | None = None
    strict: StrictSchema | None = None
    name = "response"
    # The response schema travels with the prompt, so it counts like a tool.
    counted = [t.as_dict() for t in tool_specs] if tool_specs else []
    if response_model is not None:
        schema, strict, name = response_schema(response_model, strict_schema)
        counted.append({"name": name, "description": "", "parameters": schema})
    checked = check_context(
        provider=provider,
        model=model,
        system=system,
        messages=neutral,
        tools=counted or None,
        capability_matrix=capability_matrix or None,
        max_output_tokens=max_output_tokens,
        server_window=server_window,
        count=count,
    )
    most = max_output_tokens
    if count and most is None:
        from fluid_build.copilot.call.capabilities import capabilities_for

        # Under a budget the request carries the cap its reservation prices: without it
        # the answer could run past the hold (docs/budgets.md). Never more than the
        # window leaves after the prompt: a server such as vLLM refuses a request whose
        # prompt and cap together exceed its context.
        caps = capabilities_for(provider, model, capability_matrix or None)
        window = caps.context_window
        if server_window is not None and "context_window" not in (capability_matrix or {}):
            window = server_window
        most = caps.max_output_tokens
        if checked.prompt_tokens is not None and window > checked.prompt_tokens:
            most = min(most, window - checked.prompt_tokens)
    spec = CallSpec(
        model=model,
        messages=neutral,
        system=system,
        tools=tool_specs,
        response_schema=schema,
        schema_name=name,
        strict=strict is not None,
        max_output_tokens=most,
        **(sampling or {}),
    )
    if not count:
        return Prepared(spec, response_model, strict, validate)
    return Prepared(spec, response_model, strict, validate, checked.prompt_tokens, most)


def http_request(
    client: httpx.Client | httpx.AsyncClient,
    request: Request,
    deadline: Deadline,
    per_attempt: float,
    phases: PhaseLimits | None = None,
    *,
    stream: bool = False,
) -> httpx.Request:
    """The adapter's request on ``client``, its timeouts cut to what the deadline leaves.

    With ``phases``, its connect and read timeouts are the phases' limits, and it carries
    the attempt's :class:`~fluid_build.copilot.call.phases.Phase` for the shells to keep.

    Only encodings the size limit can count as they inflate are accepted: said
    here unless the pool already says exactly that (httpx's default when
    neither brotli nor zstandard is installed), so that httpx need not swap
    its own header out on every request.
    """
    built: httpx.Request
    timeout: float | dict[str, float] = (
        deadline.timeout(per_attempt)
        if phases is None
        else phases.timeouts(deadline.left(), per_attempt)
    )
    if is_own_pool(client):  # a pool of ours (call/seams.py): no build_request needed
        built = client.fluid_json_request(
            request.method, request.url, request.headers, request.json, timeout
        )
    else:
        headers = request.headers
        if client.headers.get("accept-encoding") != ACCEPT_ENCODING:
            headers = {"accept-encoding": ACCEPT_ENCODING, **headers}
        built = client.build_request(
            request.method,
            request.url,
            headers=headers,
            json=request.json,
            timeout=timeout if isinstance(timeout, float) else httpx.Timeout(**timeout),
        )
        if "cookie" in built.headers and not any(k.lower() == "cookie" for k in headers):
            del built.headers["cookie"]  # a caller's jar: no call carries a cookie
    # The shells bound every wait of this request by it (call/drive.py).
    built.extensions[DEADLINE_EXTENSION] = deadline
    if phases is not None:
        built.extensions[PHASE_EXTENSION] = phases.watch(stream=stream)
    return built
