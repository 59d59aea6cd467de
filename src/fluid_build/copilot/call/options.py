"""A call's options checked before anything is sent: names, values, and what the provider takes.

Three steps, each before the first byte goes out (docs/llm-providers.md, "Call options"):

1. :func:`check_names`: a name no call takes is a ``TypeError`` naming it, as a
   misspelt keyword argument is (the openai SDK does the same).
2. :func:`sampling`: each value checked (a ``ValueError`` naming the option) and
   turned into the :class:`~fluid_build.copilot.llm.types.CallSpec` fields the
   adapters map to their own.
3. :func:`unsupported`: what the chosen provider (its adapter's
   ``supported_options``) and model (the rules of
   :mod:`fluid_build.copilot.call.capabilities`) cannot take. Refused with
   ``llm.unsupported_option`` naming the option and the provider, or, with
   ``drop_unsupported``, dropped with one warning per provider:option.
"""

from __future__ import annotations

import difflib
import logging
import math
import threading
from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, Literal, TypedDict

from fluid_build.copilot.llm.base import unsupported_option

if TYPE_CHECKING:
    from pydantic import BaseModel

    from fluid_build.copilot.llm.types import ToolSpec

__all__ = [
    "CALL_OPTIONS",
    "REASONING_EFFORTS",
    "SAMPLING_FIELDS",
    "TOOL_CHOICES",
    "CallOptions",
    "check_names",
    "sampling",
    "unsupported",
]

LOG = logging.getLogger("fluid_build.llm")


class CallOptions(TypedDict, total=False):
    """What a call asks for besides its messages (see :meth:`LLMClient.complete`).

    The sampling and tool options are mapped to each provider's own field
    (docs/llm-providers.md, "Call options"); one the provider or model cannot take
    is refused before sending, or dropped with a warning under ``drop_unsupported``.
    """

    system: str | None
    response_model: type[BaseModel] | None
    tools: Sequence[ToolSpec | Mapping[str, Any]] | None
    max_output_tokens: int | None
    capability_matrix: Mapping[str, Any] | None
    validate: bool
    temperature: float | None
    top_p: float | None
    #: One stop sequence, or several.
    stop: str | Sequence[str] | None
    seed: int | None
    #: ``"auto"``, ``"none"``, ``"required"``, or the name of one of ``tools``.
    tool_choice: Literal["auto", "none", "required"] | str | None
    parallel_tool_calls: bool | None
    reasoning_effort: Literal["low", "medium", "high"] | None
    #: Merged into the request body last, key by key (a nested object adds to fluid's).
    extra_body: Mapping[str, Any] | None
    #: The same as ``extra_body`` (kept: the docs promised it first).
    extra: Mapping[str, Any] | None
    #: Sent on the request after fluid's own headers.
    extra_headers: Mapping[str, str] | None
    #: Send the call without an option the provider or model cannot take (one warning per
    #: provider:option) instead of refusing it.
    drop_unsupported: bool


#: A CallSpec field's value when its option is not set (an option dropped goes back to it).
UNSET_FIELDS: dict[str, Any] = {"stop": (), "extra_headers": {}}

#: The names a call option may have (a fallback entry's ``options`` are checked against them).
CALL_OPTIONS: frozenset[str] = CallOptions.__optional_keys__ | CallOptions.__required_keys__

#: ``tool_choice`` values besides a tool's name.
TOOL_CHOICES: Final = ("auto", "none", "required")
REASONING_EFFORTS: Final = ("low", "medium", "high")

#: The call options that become :class:`CallSpec` fields of the same name (``stop`` as a
#: tuple), besides ``max_output_tokens`` which the pre-flight reads first.
SAMPLING_FIELDS: Final = (
    "temperature",
    "top_p",
    "stop",
    "seed",
    "tool_choice",
    "parallel_tool_calls",
    "reasoning_effort",
)

_SEED_RANGE: Final = 2**63


def check_names(options: Mapping[str, Any], known: Collection[str], where: str) -> None:
    """``TypeError`` for the first name of ``options`` not in ``known``, with the nearest
    known name when one is close; nothing has been sent."""
    for name in options:
        if name not in known:
            near = difflib.get_close_matches(str(name), sorted(known), n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise TypeError(f"{where} got an unexpected keyword argument {name!r}{hint}")


def _number(name: str, value: object, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name} must be a number from {low:g} to {high:g}, not {value!r:.60}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be from {low:g} to {high:g}, not {value:g}")
    return float(value)


def sampling(options: Mapping[str, Any]) -> dict[str, Any]:
    """The :class:`CallSpec` fields of ``options``' sampling and tool options, checked.

    Only the options that are set (not None) appear. ``extra_body`` (or its alias
    ``extra``; both at once is an error) becomes ``extra``; ``extra_headers`` stays.
    """
    fields: dict[str, Any] = {}
    value = options.get("temperature")
    if value is not None:
        fields["temperature"] = _number("temperature", value, 0, 2)
    value = options.get("top_p")
    if value is not None:
        fields["top_p"] = _number("top_p", value, 0, 1)
    value = options.get("stop")
    if value is not None:
        stops = (value,) if isinstance(value, str) else value
        if not isinstance(stops, list | tuple) or not all(isinstance(s, str) and s for s in stops):
            raise ValueError(
                f"stop must be a non-empty string or a list of them, not {value!r:.60}"
            )
        if stops:
            fields["stop"] = tuple(stops)
    value = options.get("seed")
    if value is not None:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"seed must be a whole number, not {value!r:.60}")
        if not -_SEED_RANGE <= value < _SEED_RANGE:
            raise ValueError("seed must fit in 64 bits")
        fields["seed"] = value
    value = options.get("tool_choice")
    if value is not None:
        if not isinstance(value, str) or not value:
            raise ValueError(
                f"tool_choice must be one of {', '.join(TOOL_CHOICES)} or a tool's name, "
                f"not {value!r:.60}"
            )
        fields["tool_choice"] = value
    value = options.get("parallel_tool_calls")
    if value is not None:
        if not isinstance(value, bool):
            raise ValueError(f"parallel_tool_calls must be True or False, not {value!r:.60}")
        fields["parallel_tool_calls"] = value
    value = options.get("reasoning_effort")
    if value is not None:
        if value not in REASONING_EFFORTS:
            raise ValueError(
                f"reasoning_effort must be one of {', '.join(REASONING_EFFORTS)}, not {value!r:.60}"
            )
        fields["reasoning_effort"] = value
    body, alias = options.get("extra_body"), options.get("extra")
    if body is not None and alias is not None:
        raise ValueError("extra is an alias of extra_body: give one of them")
    body = body if body is not None else alias
    if body is not None:
        if not isinstance(body, Mapping) or not all(isinstance(k, str) for k in body):
            raise ValueError("extra_body must be a mapping of the request body's fields")
        if body:
            fields["extra"] = body
    value = options.get("extra_headers")
    if value is not None:
        from fluid_build.copilot.llm.fallback import checked_headers

        headers = checked_headers(value, "extra_headers")
        if headers:
            fields["extra_headers"] = headers
    return fields


def check_tool_choice(choice: str | None, tool_names: Collection[str]) -> None:
    """A ``tool_choice`` that names a tool needs that tool among the call's; any but
    ``"none"`` needs tools at all (every provider refuses it otherwise)."""
    if choice is None or choice == "none":
        return
    if not tool_names:
        raise ValueError(f"tool_choice={choice!r} needs tools= with at least one tool")
    if choice not in TOOL_CHOICES and choice not in tool_names:
        raise ValueError(
            f"tool_choice={choice!r} is neither {', '.join(TOOL_CHOICES)} nor the name of "
            f"one of the call's tools ({', '.join(sorted(tool_names))})"
        )


_warned: set[str] = set()
_warned_lock = threading.Lock()


def unsupported(
    provider: str,
    model: str,
    fields: Mapping[str, Any],
    refused: Mapping[str, str],
    *,
    drop: bool,
) -> dict[str, Any]:
    """``fields`` without the options ``refused`` names (option -> why); with none, as is.

    Without ``drop``, the first refused option is ``llm.unsupported_option`` (not
    retryable; another provider of a fallback chain may still take the call). With
    ``drop``, each is dropped and warned about once per process per provider:option.
    """
    if not refused:
        return dict(fields)
    if not drop:
        raise unsupported_option(provider, model, refused)
    for option, why in refused.items():
        key = f"{provider}:{option}"
        with _warned_lock:
            first = key not in _warned
            _warned.add(key)
        if first:
            LOG.warning(
                "%s:%s cannot take %s= (%s): dropped (drop_unsupported)",
                provider,
                model,
                option,
                why,
            )
    return {k: v for k, v in fields.items() if k not in refused}
