"""One entry of a fallback chain with its own settings: :class:`Fallback`, and the reading
of ``LLMClient(fallbacks=...)`` / ``FLUID_LLM_FALLBACKS`` into a list of them.

An entry is a provider and a model, and whatever of its own it needs: an endpoint, a
key, timeouts, headers, call options. What it leaves out comes from the environment,
as for a client (its own provider's key variable, its base URL variable), never from
another entry or from the primary. A value that cannot be used is ``llm.not_configured``
naming ``fallbacks=`` (or ``FLUID_LLM_FALLBACKS``) and the entry, never echoing a key or
a header's value (see docs/fallbacks-and-breakers.md, "Fallback chains").
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from fluid_build.copilot.agents.errors import ProviderError

__all__ = ["FALLBACKS_ENV", "PHASE_FIELDS", "Fallback", "checked_headers", "fallback_entries"]

FALLBACKS_ENV: Final = "FLUID_LLM_FALLBACKS"
_EXAMPLE: Final = "anthropic:claude-sonnet-4-6,gemini:gemini-2.5-flash"
_ARGUMENT: Final = "fallbacks="
#: The phase limits: passed on to an entry's client only when set (docs/fallbacks-and-breakers.md).
PHASE_FIELDS: Final = ("connect_timeout", "first_token_timeout", "idle_timeout")
_SECONDS: Final = ("timeout", *PHASE_FIELDS)


def _problem(message: str, where: str, provider: str | None = None) -> ProviderError:
    from fluid_build.copilot.llm.checks import not_configured

    error = not_configured(message, provider)
    if where == "headers=":  # the client's own headers, not an entry's
        return error.with_details(argument=where)
    details: dict[str, Any] = {"argument": _ARGUMENT, "entry": where}
    if where.startswith(FALLBACKS_ENV):
        details = {"variable": FALLBACKS_ENV, "example": _EXAMPLE, "entry": where}
    return error.with_details(**details)


@dataclass(frozen=True, slots=True)
class Fallback:
    """One entry of a fallback chain: a provider and a model, with settings of its own.

    ``LLMClient("openai", "gpt-4o", fallbacks=[Fallback("openai_compatible", "llama-3.3-70b",
    base_url="http://10.0.0.5:8000/v1", api_key="...")])``. Every field but the provider
    and the model is optional; what is left out is resolved as for a client of its own
    (its provider's key and URL variables, ``FLUID_LLM_TIMEOUT_SECONDS``). ``headers``
    are sent with every request to this entry; ``options`` are call options
    (``max_output_tokens``, ``system`` ...) used on this entry in place of the call's.
    ``repr`` shows neither the key nor a header's value; a bad value is
    ``llm.not_configured`` naming the field.
    """

    provider: str
    model: str
    base_url: str | None = None
    api_key: str | None = field(default=None, repr=False)
    timeout: float | None = None
    connect_timeout: float | None = None
    first_token_timeout: float | None = None
    idle_timeout: float | None = None
    headers: Mapping[str, str] | None = field(default=None, hash=False)
    options: Mapping[str, Any] | None = field(default=None, hash=False)

    def __post_init__(self) -> None:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        where = f"the fallbacks= entry Fallback({_label(self.provider, self.model)})"
        for name, value in _checked(values, where).items():
            object.__setattr__(self, name, value)

    @property
    def label(self) -> str:
        """``provider:model``, as the chain's reports name the entry."""
        return f"{self.provider}:{self.model}"

    def __repr__(self) -> str:
        shown = [f"{self.provider!r}", f"{self.model!r}"]
        for name in ("base_url", *_SECONDS):
            value = getattr(self, name)
            if value is not None:
                shown.append(f"{name}={value!r}")
        if self.api_key is not None:
            shown.append("api_key=<set>")
        if self.headers:
            # Only the names: a header's value may be a credential.
            shown.append(f"headers=<{', '.join(sorted(self.headers))}>")
        if self.options:
            shown.append(f"options={dict(self.options)!r}")
        return f"Fallback({', '.join(shown)})"

    @classmethod
    def from_mapping(cls, entry: Mapping[str, Any], where: str = _ARGUMENT) -> Fallback:
        """An entry given as a mapping with the same keys; an unknown key is refused."""
        known = [f.name for f in fields(cls)]
        unknown = [k for k in entry if k not in known]
        if unknown:
            from fluid_build._redact import redact, truncate

            names = ", ".join(repr(truncate(redact(str(k)), 40)) for k in unknown)
            raise _problem(
                f"{where} has an unknown key {names}: use {', '.join(known)}",
                where,
            )
        for required in ("provider", "model"):
            if required not in entry:
                raise _problem(
                    f"{where} has no {required!r}: give both, e.g. "
                    "{'provider': 'anthropic', 'model': 'claude-sonnet-4-6'}",
                    where,
                )
        values: dict[str, Any] = {name: entry.get(name) for name in known}
        _checked(values, f"{where} ({_label(values['provider'], values['model'])})")
        return cls(**values)


def _label(provider: object, model: object) -> str:
    """An entry as a message may show it: short, with nothing secret-looking."""
    from fluid_build._redact import redact, truncate

    return truncate(redact(f"{provider}:{model}"), 80)


def _checked(entry: Mapping[str, Any], where: str) -> dict[str, Any]:
    """An entry's fields normalised; raises ``llm.not_configured`` naming ``where`` for the
    first bad one."""
    from fluid_build.copilot.llm.settings import PROVIDERS

    provider, model = entry["provider"], entry["model"]
    if not isinstance(provider, str) or not provider.strip():
        raise _problem(f"{where}: provider must be a provider's name", where)
    name = provider.strip().lower()
    if name not in PROVIDERS:
        raise _problem(
            f"{where} names an unknown provider (one of {', '.join(sorted(PROVIDERS))})",
            where,
        )
    if not isinstance(model, str) or not model.strip():
        raise _problem(f"{where}: model must be a non-empty model name", where, name)
    if not model.strip().isprintable():
        raise _problem(f"{where}: the model name has control characters", where, name)
    values: dict[str, Any] = {"provider": name, "model": model.strip()}
    if entry["base_url"] is not None and not isinstance(entry["base_url"], str):
        raise _problem(f"{where}: base_url must be a URL string", where, name)
    key = entry["api_key"]
    if key is not None and (not isinstance(key, str) or not key):
        # Its value is never shown, whatever it is.
        raise _problem(f"{where}: api_key must be a non-empty string", where, name)
    for seconds in _SECONDS:
        value = entry[seconds]
        if value is None:
            continue
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
            or value <= 0
        ):
            raise _problem(
                f"{where}: {seconds} must be a positive number of seconds or None, "
                f"e.g. {seconds}=30",
                where,
                name,
            )
        values[seconds] = float(value)
    if entry["headers"] is not None:
        values["headers"] = checked_headers(entry["headers"], where, name)
    if entry["options"] is not None:
        if not isinstance(entry["options"], Mapping) or not all(
            isinstance(k, str) for k in entry["options"]
        ):
            raise _problem(
                f"{where}: options must be a mapping of call options, "
                "e.g. {'max_output_tokens': 1024}",
                where,
                name,
            )
        values["options"] = dict(entry["options"])
    return values


def checked_headers(headers: object, where: str, provider: str | None = None) -> dict[str, str]:
    """``headers`` as a plain dict of str to str; a bad one is ``llm.not_configured`` naming
    the header, never showing its value (it may be a credential)."""
    from fluid_build.copilot.llm.checks import clean

    if not isinstance(headers, Mapping):
        raise _problem(f"{where}: headers must be a mapping of str to str", where, provider)
    checked: dict[str, str] = {}
    for key, value in headers.items():
        if not isinstance(key, str) or not key or not clean(key):
            raise _problem(f"{where}: a header's name is not a header name", where, provider)
        if not isinstance(value, str) or not value.isprintable():
            raise _problem(
                f"{where}: header {key[:40]!r} must be a printable string", where, provider
            )
        checked[key] = value
    return checked


def fallback_entries(
    fallbacks: Sequence[Fallback | Mapping[str, Any] | tuple[str, str] | str] | None,
    env: Mapping[str, str],
    *,
    option_names: Collection[str] = (),
) -> list[Fallback]:
    """The chain's fallback entries, from ``fallbacks`` or else ``FLUID_LLM_FALLBACKS``.

    Each may be a :class:`Fallback`, a mapping with its fields, a ``(provider, model)``
    pair or a ``"provider:model"`` string (an Ollama model keeps its tag:
    ``ollama:llama3.1:8b``). ``option_names`` are the call options an entry may set.
    """
    if fallbacks is None:
        raw = env.get(FALLBACKS_ENV, "")
        return [_from_text(p.strip(), FALLBACKS_ENV) for p in raw.split(",") if p.strip()]
    if isinstance(fallbacks, str | bytes | Mapping) or not isinstance(fallbacks, Sequence):
        raise _problem(
            "fallbacks= must be a list of entries (Fallback objects, mappings, "
            "(provider, model) pairs or 'provider:model' strings)",
            _ARGUMENT,
        )
    entries: list[Fallback] = []
    for index, item in enumerate(fallbacks):
        where = f"fallbacks=[{index}]"
        if isinstance(item, Fallback):
            entry = item
        elif isinstance(item, Mapping):
            entry = Fallback.from_mapping(item, where)
        elif isinstance(item, tuple) and len(item) == 2:
            entry = _entry(item[0], item[1], where)
        elif isinstance(item, str):
            entry = _from_text(item, where)
        else:
            raise _problem(
                f"{where} is a {type(item).__name__}: give a Fallback, a "
                "mapping, a (provider, model) pair or a 'provider:model' string",
                where,
            )
        unknown = sorted(set(entry.options or ()) - set(option_names))
        if unknown and option_names:
            raise _problem(
                f"{where} ({_label(entry.provider, entry.model)}) has an unknown "
                f"call option {', '.join(repr(k[:40]) for k in unknown)}: use "
                f"{', '.join(sorted(option_names))}",
                where,
                entry.provider,
            )
        entries.append(entry)
    return entries


def _entry(provider: object, model: object, where: str) -> Fallback:
    """A :class:`Fallback` whose bad value names ``where`` (an index, or the variable)."""
    values: dict[str, Any] = {f.name: None for f in fields(Fallback)}
    values.update(provider=provider, model=model)
    _checked(values, f"{where} ({_label(provider, model)})")
    return Fallback(str(provider), str(model))


def _from_text(item: str, where: str) -> Fallback:
    provider, sep, model = item.partition(":")
    if not sep or not provider.strip() or not model.strip():
        from fluid_build._redact import redact, truncate

        raise _problem(
            f"fallback {truncate(redact(item), 60)!r} in {where} is not provider:model; e.g. "
            f"{FALLBACKS_ENV}={_EXAMPLE}",
            where,
        )
    return _entry(provider.strip(), model.strip(), where)
