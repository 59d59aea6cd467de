"""Comparing what a replay sends with what the cassette recorded.

A forge recording keeps each request's body; replay compares the
conversation in it (:data:`COMPARED_BODY_FIELDS`, tool results masked by
:func:`compared_body`), finds the first place two bodies differ
(:func:`body_difference`) and shows the two values as an operator reads them
(:func:`shown_pair`). Every recording, with or without bodies, also pins the
call's settings (temperature, seed, answer length ...: :data:`SETTING_FIELDS`,
read from a body by :func:`request_settings`), compared by
:func:`settings_difference`. A request that differs is a :class:`ReplayMismatch`,
saying which request, which field, and both values, redacted and cut short.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

from fluid_build._redact import one_line, redact, truncate
from fluid_build.errors import FluidError

__all__ = [
    "COMPARED_BODY_FIELDS",
    "NOT_COMPARED",
    "NOT_SET",
    "SETTING_FIELDS",
    "SHOWN_CHARS",
    "ReplayMismatch",
    "body_difference",
    "compared_body",
    "request_settings",
    "settings_difference",
    "shown_pair",
]


class ReplayMismatch(FluidError):
    """A replayed call asked for something the cassette does not hold.

    ``index`` is the request's number (1-based), ``field`` what differs
    (``method``, ``path``, ``model``, ``request`` for one past the last
    exchange or one never sent, ``body.<path>`` for the request body), and
    ``expected`` and ``got`` the two values, redacted and cut short. All four
    are ``None`` when the mismatch is not about one request.
    """

    def __init__(
        self,
        message: str,
        *,
        index: int | None = None,
        field: str | None = None,
        expected: str | None = None,
        got: str | None = None,
    ) -> None:
        super().__init__(message)
        self.index = index
        self.field = field
        self.expected = expected
        self.got = got

    def to_dict(self) -> dict[str, Any]:
        return {
            "error": type(self).__name__,
            "code": "replay.mismatch",
            "message": str(self),
            "request": self.index,
            "field": self.field,
            "expected": self.expected,
            "got": self.got,
        }

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            _rebuild_mismatch,
            (str(self), self.index, self.field, self.expected, self.got),
        )


def _rebuild_mismatch(
    message: str, index: int | None, field: str | None, expected: str | None, got: str | None
) -> ReplayMismatch:
    return ReplayMismatch(message, index=index, field=field, expected=expected, got=got)


#: The fields of a recorded request body that replay compares: the conversation
#: (OpenAI, Anthropic, Ollama: ``messages`` and ``system``; Gemini: ``contents``
#: and ``systemInstruction``). Tool definitions, response schemas and sampling
#: settings are not compared here: tools and schemas come from the code and its
#: libraries (a pydantic upgrade rewrites a JSON schema), not from the run; the
#: settings the caller sets are compared on their own (:data:`SETTING_FIELDS`).
COMPARED_BODY_FIELDS: Final = ("messages", "system", "contents", "systemInstruction")
#: What stands for a tool's result when bodies are compared: it depends on the
#: workspace at the time (a file added since, the cassette itself), not the run.
NOT_COMPARED: Final = "[tool result: not compared]"
_MISSING: Final = "<missing>"
_MAX_COMPARED_DEPTH: Final = 64
SHOWN_CHARS: Final = 100


#: Where each provider's request body carries a call option the caller sets (the table
#: of docs/llm-providers.md, "Call options"): the field's path in the body -> the option.
#: These are compared on replay, so a cassette recorded with ``temperature=0`` does not
#: replay a call made without it. ``tool_choice`` and ``parallel_tool_calls`` are not
#: here: fluid sets them itself for a response schema (Anthropic's forced tool), so they
#: belong with the tool definitions, which are not compared.
SETTING_FIELDS: Final[Mapping[str, str]] = {
    # OpenAI chat and the compatible servers; the Responses API; Anthropic
    "temperature": "temperature",
    "top_p": "top_p",
    "stop": "stop",
    "stop_sequences": "stop",
    "seed": "seed",
    "max_completion_tokens": "max_output_tokens",
    "max_tokens": "max_output_tokens",
    "max_output_tokens": "max_output_tokens",
    "reasoning_effort": "reasoning_effort",
    "reasoning.effort": "reasoning_effort",
    "thinking": "reasoning_effort",
    "output_config.effort": "reasoning_effort",  # Claude models that think adaptively
    # Gemini and Vertex
    "generationConfig.temperature": "temperature",
    "generationConfig.topP": "top_p",
    "generationConfig.stopSequences": "stop",
    "generationConfig.seed": "seed",
    "generationConfig.maxOutputTokens": "max_output_tokens",
    "generationConfig.thinkingConfig": "reasoning_effort",
    # Bedrock Converse
    "inferenceConfig.temperature": "temperature",
    "inferenceConfig.topP": "top_p",
    "inferenceConfig.stopSequences": "stop",
    "inferenceConfig.maxTokens": "max_output_tokens",
    "additionalModelRequestFields.thinking": "reasoning_effort",  # Claude on Bedrock
    "additionalModelRequestFields.output_config.effort": "reasoning_effort",
    # Ollama's native API
    "options.temperature": "temperature",
    "options.top_p": "top_p",
    "options.stop": "stop",
    "options.seed": "seed",
    "options.num_predict": "max_output_tokens",
}
#: How a setting the request does not carry is shown.
NOT_SET: Final = "<not set>"


def request_settings(body: Any) -> dict[str, Any]:
    """The :data:`SETTING_FIELDS` a request body carries, by path: ``{"temperature": 0.0,
    "generationConfig.maxOutputTokens": 500}``; ``{}`` for none (or a body that is not
    a JSON object)."""
    found: dict[str, Any] = {}
    if not isinstance(body, dict):
        return found
    for path in SETTING_FIELDS:
        value: Any = body
        for part in path.split("."):
            value = value.get(part, _MISSING) if isinstance(value, dict) else _MISSING
        if value is not _MISSING and value is not None:
            found[path] = value
    return found


def _same_setting(expected: Any, got: Any) -> bool:
    numbers = (int, float)
    if (
        isinstance(expected, numbers)
        and isinstance(got, numbers)
        and not isinstance(expected, bool)
        and not isinstance(got, bool)
    ):
        return expected == got  # 0 and 0.0 are the same temperature
    return type(expected) is type(got) and expected == got


def settings_difference(
    expected: Mapping[str, Any], got: Mapping[str, Any]
) -> tuple[str, str, Any, Any] | None:
    """The first setting that differs, as ``(option, path, expected, got)`` (a side that
    does not carry it is :data:`NOT_SET`); None when the two carry the same."""
    for path in [*expected, *(p for p in got if p not in expected)]:
        want, sent = expected.get(path, _MISSING), got.get(path, _MISSING)
        if want is _MISSING or sent is _MISSING or not _same_setting(want, sent):
            option = SETTING_FIELDS.get(path, path)
            return (
                option,
                path,
                NOT_SET if want is _MISSING else want,
                NOT_SET if sent is _MISSING else sent,
            )
    return None


def _masked(value: Any, depth: int = 0) -> Any:
    """``value`` with every tool result replaced by :data:`NOT_COMPARED`."""
    if depth > _MAX_COMPARED_DEPTH:
        return value
    if isinstance(value, list):
        return [_masked(item, depth + 1) for item in value]
    if not isinstance(value, dict):
        return value
    result_holder = value.get("role") == "tool" or value.get("type") == "tool_result"
    out: dict[str, Any] = {}
    for key, item in value.items():
        if key == "content" and result_holder:
            out[key] = NOT_COMPARED
        elif key == "functionResponse" and isinstance(item, dict):  # Gemini
            out[key] = {**item, "response": NOT_COMPARED} if "response" in item else item
        else:
            out[key] = _masked(item, depth + 1)
    return out


def compared_body(body: Any) -> dict[str, Any]:
    """What replay compares of a request body: :data:`COMPARED_BODY_FIELDS`, tool results
    masked."""
    if not isinstance(body, dict):
        return {}
    return {key: _masked(body[key]) for key in COMPARED_BODY_FIELDS if key in body}


def body_difference(expected: Any, got: Any, where: str = "body") -> tuple[str, Any, Any] | None:
    """The first place two JSON values differ, as ``(path, expected, got)``; None when equal.

    Paths read ``body.messages[2].content``; a value one side lacks is ``"<missing>"``.
    Lists are compared item by item before their lengths, so an added message is
    named by its index.
    """
    return _difference(expected, got, where, 0)


def _difference(expected: Any, got: Any, where: str, depth: int) -> tuple[str, Any, Any] | None:
    if depth > _MAX_COMPARED_DEPTH:
        return None if expected == got else (where, expected, got)
    if isinstance(expected, dict) and isinstance(got, dict):
        for key in [*expected, *(k for k in got if k not in expected)]:
            if key not in expected or key not in got:
                return f"{where}.{key}", expected.get(key, _MISSING), got.get(key, _MISSING)
            found = _difference(expected[key], got[key], f"{where}.{key}", depth + 1)
            if found:
                return found
        return None
    if isinstance(expected, list) and isinstance(got, list):
        for i, (a, b) in enumerate(zip(expected, got, strict=False)):
            found = _difference(a, b, f"{where}[{i}]", depth + 1)
            if found:
                return found
        if len(expected) != len(got):
            i = min(len(expected), len(got))
            return (
                f"{where}[{i}]",
                expected[i] if i < len(expected) else _MISSING,
                got[i] if i < len(got) else _MISSING,
            )
        return None
    same = type(expected) is type(got) and expected == got
    return None if same else (where, expected, got)


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, default=str, sort_keys=True)


def shown_pair(expected: Any, got: Any, limit: int = SHOWN_CHARS) -> tuple[str, str]:
    """Two differing values as an operator reads them: redacted, on one line, cut short
    around the first character that differs."""
    a, b = one_line(redact(_as_text(expected))), one_line(redact(_as_text(got)))
    same = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        same += 1
    start = max(same - 30, 0)
    if start:
        a, b = "…" + a[start:], "…" + b[start:]
    return truncate(a, limit), truncate(b, limit)
