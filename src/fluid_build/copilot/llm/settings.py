"""Which provider, model, key and endpoint a client uses: arguments, then the environment.

Order: explicit arguments; then ``FLUID_LLM_PROVIDER`` / ``FLUID_LLM_MODEL`` /
``FLUID_LLM_API_KEY`` (which overrides every provider's own key variable);
then the provider's own variables; then, for the provider, the single one
whose key is set. A missing key is a :class:`ProviderAuthError` raised before
any request, naming the variable to set.

A value that cannot be used (an unknown provider, a URL that does not parse,
control characters in a model name or a key) is a typed error too, never a
bare ``ValueError``: its message names the variable (or the argument) it came
from and shows a valid example, and ``details`` carries ``variable`` and
``example`` for tools such as ``fluid doctor``. The value itself is shown only
without credentials (URL user and password dropped), never for a key.
"""

from __future__ import annotations

import ipaddress
import math
import os
from collections.abc import Mapping
from typing import Final, cast
from urllib.parse import urlsplit

from fluid_build._redact import redact, truncate
from fluid_build.config import env_float
from fluid_build.copilot.agents.errors import ProviderAuthError, ProviderError, python_aside
from fluid_build.copilot.llm.base import ProviderConfig
from fluid_build.copilot.llm.checks import clean as _clean
from fluid_build.copilot.llm.checks import not_configured as _not_configured
from fluid_build.copilot.llm.checks import url_problem as _url_problem
from fluid_build.copilot.llm.registry import PROVIDERS, ProviderEntry, load

__all__ = [
    "CALL_DEFAULT_VARIABLES",
    "PROVIDERS",
    "ProviderInfo",
    "call_defaults_from_env",
    "resolve_provider_config",
]

DEFAULT_TIMEOUT: Final = 120.0


#: The old name of a provider's entry (llm/registry.py).
ProviderInfo = ProviderEntry

#: A valid value for each variable, shown when the value set cannot be used.
EXAMPLES: Final[Mapping[str, str]] = {
    "FLUID_LLM_PROVIDER": "openai",
    "FLUID_LLM_MODEL": "gpt-4o-mini",
    "OPENAI_BASE_URL": "https://api.openai.com/v1",
    "ANTHROPIC_BASE_URL": "https://api.anthropic.com",
    "GEMINI_BASE_URL": "https://generativelanguage.googleapis.com/v1beta",
    "OLLAMA_HOST": "127.0.0.1:11434",
    "AZURE_OPENAI_ENDPOINT": "https://my-resource.openai.azure.com",
    "AZURE_OPENAI_API_VERSION": "2024-10-21",
    "OPENAI_API_VERSION": "2024-10-21",
    "FLUID_OLLAMA_ALLOW_REMOTE": "1",
    "AWS_ENDPOINT_URL_BEDROCK_RUNTIME": "https://bedrock-runtime.us-east-1.amazonaws.com",
    "AWS_ENDPOINT_URL": "https://bedrock-runtime.us-east-1.amazonaws.com",
    "AWS_REGION": "us-east-1",
    "FLUID_LLM_TEMPERATURE": "0.2",
    "FLUID_LLM_MAX_OUTPUT_TOKENS": "1024",
}
_YES: Final = frozenset({"1", "true", "yes", "on"})


def _shown(value: str, limit: int = 60) -> str:
    """A value for a message: credentials redacted, cut short, control characters escaped."""
    return repr(truncate(redact(value), limit))


def _get(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(name)
    return value.strip() if value and value.strip() else None


def _pick_provider(env: Mapping[str, str]) -> str:
    named = _get(env, "FLUID_LLM_PROVIDER")
    if named:
        name = named.lower()
        if name not in PROVIDERS:
            raise _not_configured(
                f"unknown provider {_shown(named, 40)} in FLUID_LLM_PROVIDER: set it to one of "
                f"{', '.join(sorted(PROVIDERS))}, e.g. FLUID_LLM_PROVIDER=openai",
                variable="FLUID_LLM_PROVIDER",
                example=EXAMPLES["FLUID_LLM_PROVIDER"],
            )
        return name
    auto = [e for e in PROVIDERS.values() if e.auto]
    with_keys = [e.name for e in auto if any(_get(env, v) for v in e.key_vars)]
    if len(with_keys) == 1:
        return with_keys[0]
    if not with_keys:
        first = [e.key_vars[0] for e in auto]
        raise ProviderAuthError(
            f"no LLM provider is configured: set {', '.join(first[:-1])} or {first[-1]}, "
            "or choose one with FLUID_LLM_PROVIDER (e.g. FLUID_LLM_PROVIDER=ollama "
            f"for a local model) or --provider {python_aside('provider')}, or run "
            "`fluid ai setup --provider <name>`"
        )
    keys = ", ".join(v for p in with_keys for v in PROVIDERS[p].key_vars if _get(env, v))
    raise _not_configured(
        f"several provider keys are set ({keys}): choose one with FLUID_LLM_PROVIDER "
        f"(e.g. FLUID_LLM_PROVIDER={with_keys[0]}) or --provider {python_aside('provider')}",
        variable="FLUID_LLM_PROVIDER",
        example=with_keys[0],
    )


def _key(
    provider: str, info: ProviderInfo, api_key: str | None, env: Mapping[str, str]
) -> str | None:
    source = "api_key="
    key = api_key
    if key is None:
        for name in ("FLUID_LLM_API_KEY", *info.key_vars):
            key = _get(env, name)
            if key is not None:
                source = name
                break
    key = key.strip() if key else None
    if not key:
        if not info.key_required:
            return None
        names = " or ".join(info.key_vars)
        raise ProviderAuthError(
            f"no API key for {provider}: set {names} (or FLUID_LLM_API_KEY) in the environment, "
            f"e.g. {info.key_vars[0]}=<your key> {python_aside('api_key')}, or run "
            f"`fluid ai setup --provider {provider}`",
            provider=provider,
            details={"variable": info.key_vars[0], "example": "<your key>"},
        )
    if not _clean(key):
        # Never echo any of it: a key with a pasted newline is still a key.
        if source == "api_key=":
            where = "api_key="
            fix = "pass the key alone: api_key='<your key>' (or set FLUID_LLM_API_KEY)"
        else:
            where = f"{source} holds a key that"
            fix = f"set the key alone, on one line: {source}=<your key>"
        raise ProviderAuthError(
            f"the API key for {provider} looks malformed: {where} contains whitespace or "
            f"control characters (a pasted newline or space?); {fix}",
            provider=provider,
            details={"variable": None if source == "api_key=" else source},
            secrets=(key,),
        )
    return key


def _is_local(host: str) -> bool:
    if host in {"localhost", "localhost.localdomain"}:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _public(url: str) -> str:
    """``url`` as a message may show it: no user, password, query or fragment."""
    head = url.split("#", 1)[0].split("?", 1)[0]
    scheme, sep, rest = head.partition("://")
    if not sep:
        return head.rpartition("@")[2]
    authority, slash, path = rest.partition("/")
    return f"{scheme}://{authority.rpartition('@')[2]}{slash}{path}"


def _base_url(
    provider: str, info: ProviderInfo, base_url: str | None, env: Mapping[str, str]
) -> str | None:
    source = "base_url="
    url = base_url.strip() if base_url and base_url.strip() else None
    if url is None and info.base_url_var:
        url = _get(env, info.base_url_var)
        source = info.base_url_var
    if url is None and info.default_base_url:
        return info.default_base_url
    if url is None:
        if info.url_required is not None:
            variable = cast(str, info.base_url_var)
            example = _url_example(info)
            raise _not_configured(
                f"{info.url_required.format(name=provider)}: set {variable}, "
                f"e.g. {variable}={example} {python_aside('base_url')}",
                provider,
                variable=variable,
                example=example,
            )
        return None
    if info.bare_host and "://" not in url:
        url = f"http://{url}"  # OLLAMA_HOST is often host:port
    problem = _url_problem(url)
    if problem is not None:
        example = _url_example(info)
        if source == "base_url=":
            shown, fix = "base_url", f"pass base_url='{example}'"
            if info.base_url_var:
                fix += f" (or set {info.base_url_var})"
        else:
            shown, fix = source, f"set it like {source}={example}"
        raise ProviderError(
            f"{provider} base URL {_shown(_public(url), 80)} from {shown} is not an http(s) "
            f"URL fluid can use: {problem}; {fix}",
            provider=provider,
            code="llm.bad_endpoint",
            retryable=False,
            details={"variable": None if source == "base_url=" else source, "example": example},
        )
    host = urlsplit(url).hostname or ""
    if info.remote_switch is not None:
        if host in {"0.0.0.0", "::"}:  # noqa: S104 - a listen address, meaning this machine
            url = url.replace(host, "127.0.0.1", 1)
        elif not _is_local(host) and not _allow_remote(env, info.remote_switch):
            host_var, switch = info.base_url_var or "base_url", info.remote_switch
            raise ProviderError(
                f"{host_var} points to {host}, which is not this machine; prompts would leave "
                f"it unencrypted. Set {switch}=1 to allow it"
                + _remote_note(env, switch)
                + f", or point {host_var} at this machine (e.g. {host_var}="
                + f"{EXAMPLES.get(host_var, '127.0.0.1')}).",
                provider=provider,
                code="llm.bad_endpoint",
                retryable=False,
                details={"variable": switch, "example": "1"},
            )
    return url


def _url_example(info: ProviderEntry) -> str:
    """The URL a message shows as an example for ``info``'s base URL."""
    return (
        info.url_example
        or EXAMPLES.get(info.base_url_var or "")
        or info.default_base_url
        or "https://api.example.com/v1"
    )


def _allow_remote(env: Mapping[str, str], switch: str) -> bool:
    return (_get(env, switch) or "").lower() in _YES


def _remote_note(env: Mapping[str, str], switch: str) -> str:
    value = _get(env, switch)
    if value is None or value.lower() in {"0", "false", "no", "off"}:
        return ""
    return f" (it is set to {_shown(value, 20)}, which is not 1, true, yes or on)"


def _model(name: str, info: ProviderEntry, model: str | None, env: Mapping[str, str]) -> str:
    source = "model="
    chosen = model.strip() if model and model.strip() else None
    if chosen is None:
        chosen = _get(env, "FLUID_LLM_MODEL")
        source = "FLUID_LLM_MODEL"
    if chosen is None:
        chosen = info.default_model
    if not chosen:
        what, example = info.model_noun, info.model_example
        raise _not_configured(
            f"{name} needs a {what}: set FLUID_LLM_MODEL (e.g. FLUID_LLM_MODEL={example}) "
            f"or give --model {python_aside('model')}",
            name,
            variable="FLUID_LLM_MODEL",
            example=example,
        )
    if not chosen.isprintable():
        where = f"--model {python_aside('model')}" if source == "model=" else "FLUID_LLM_MODEL"
        raise _not_configured(
            f"the model name {_shown(chosen, 40)} from {where} contains control characters: "
            "set it to the name alone, e.g. "
            + ("--model gpt-4o-mini" if source == "model=" else "FLUID_LLM_MODEL=gpt-4o-mini"),
            name,
            variable=None if source == "model=" else "FLUID_LLM_MODEL",
            example=EXAMPLES["FLUID_LLM_MODEL"],
        )
    return chosen


def _api_version(name: str, info: ProviderEntry, env: Mapping[str, str]) -> str | None:
    for variable in info.version_vars:
        value = _get(env, variable)
        if value is None:
            continue
        if not _clean(value):
            raise _not_configured(
                f"{variable}={_shown(value, 40)} contains whitespace or control characters: "
                f"set it like {variable}=2024-10-21",
                name,
                variable=variable,
                example=EXAMPLES[variable],
            )
        return value
    return None


def resolve_provider_config(
    provider: str | None = None,
    model: str | None = None,
    api_key: str | None = None,
    base_url: str | None = None,
    *,
    timeout: float | None = None,
    env: Mapping[str, str] | None = None,
) -> ProviderConfig:
    """The :class:`ProviderConfig` for a call; raises typed errors, never sends anything."""
    env = os.environ if env is None else env
    name = (provider.strip() if provider else _pick_provider(env)).lower()
    info = PROVIDERS.get(name)
    if info is None:
        raise _not_configured(
            f"unknown provider {_shown(name, 40)}: use one of {', '.join(sorted(PROVIDERS))}, "
            "e.g. --provider openai or FLUID_LLM_PROVIDER=openai " + python_aside("provider"),
            truncate(redact(name), 40),
        )
    chosen_model = _model(name, info, model, env)
    url = _base_url(name, info, base_url, env)
    key = _key(name, info, api_key, env)
    region = None
    if info.endpoint_step is not None:
        # A cloud's endpoint (and region): its library loads only for this provider.
        settled = load(info.endpoint_step)(url, key, env)
        if isinstance(settled, tuple):
            url, region, key = settled
        else:
            url = settled
    if timeout is None:
        timeout = env_float(
            env, "FLUID_LLM_TIMEOUT_SECONDS", DEFAULT_TIMEOUT, minimum=1.0, maximum=3600.0
        )
    elif timeout and not (
        isinstance(timeout, int | float) and math.isfinite(timeout) and timeout > 0
    ):
        raise _not_configured(
            f"timeout={timeout!r} is not a positive number of seconds: pass e.g. timeout=120, "
            "or leave it out to use FLUID_LLM_TIMEOUT_SECONDS",
            name,
        )
    return ProviderConfig(
        provider=name,
        model=chosen_model,
        api_key=key,
        base_url=url,
        timeout=float(timeout or DEFAULT_TIMEOUT),
        api_version=_api_version(name, info, env),
        region=region,
    )


#: The variables that give every call of a client a default option: variable -> option.
CALL_DEFAULT_VARIABLES: Final[Mapping[str, str]] = {
    "FLUID_LLM_TEMPERATURE": "temperature",
    "FLUID_LLM_MAX_OUTPUT_TOKENS": "max_output_tokens",
}
_MAX_TEMPERATURE: Final = 2.0


def _bad_default(name: str, raw: str, expected: str) -> ProviderError:
    example = EXAMPLES[name]
    return _not_configured(
        f"{name}={_shown(raw, 40)} cannot be used: it must be {expected}, e.g. {name}={example}; "
        f"unset it to leave the provider's default",
        variable=name,
        example=example,
    )


def call_defaults_from_env(env: Mapping[str, str]) -> dict[str, float | int]:
    """The call options the environment sets for every call: ``temperature`` from
    ``FLUID_LLM_TEMPERATURE`` (a number from 0 to 2) and ``max_output_tokens`` from
    ``FLUID_LLM_MAX_OUTPUT_TOKENS`` (a whole number from 1); only those set appear.

    Unlike a timeout, a bad value is not replaced by a default: a temperature the
    operator asked for and did not get is a wrong answer nobody sees. So garbage,
    ``nan``, ``inf``, a negative or out-of-range value is ``llm.not_configured``
    naming the variable (``details["variable"]``) and a valid example. Empty or
    blank is unset.
    """
    found: dict[str, float | int] = {}
    raw = _get(env, "FLUID_LLM_TEMPERATURE")
    if raw is not None:
        try:
            temperature = float(raw)
        except ValueError:
            temperature = math.nan
        if not (math.isfinite(temperature) and 0.0 <= temperature <= _MAX_TEMPERATURE):
            raise _bad_default("FLUID_LLM_TEMPERATURE", raw, "a number from 0 to 2")
        found["temperature"] = temperature
    raw = _get(env, "FLUID_LLM_MAX_OUTPUT_TOKENS")
    if raw is not None:
        try:
            tokens = int(raw, 10)
        except ValueError:
            tokens = 0
        if tokens < 1:
            raise _bad_default(
                "FLUID_LLM_MAX_OUTPUT_TOKENS", raw, "a whole number of tokens, 1 or more"
            )
        found["max_output_tokens"] = tokens
    return found
