"""Which provider, model, key and endpoint a client uses: arguments, then the environment.

Order: explicit arguments; then ``FLUID_LLM_PROVIDER`` / ``FLUID_LLM_MODEL`` /
``FLUID_LLM_API_KEY`` (which overrides every provider's own key variable);
then the provider's own variables; then, for the provider, the single one
whose key is set. A missing key is a :class:`ProviderAuthError` raised before
any request, naming the variable to set.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit

from fluid_build.config import env_float
from fluid_build.copilot.agents.errors import ProviderAuthError, ProviderError
from fluid_build.copilot.llm.base import ProviderConfig

__all__ = ["PROVIDERS", "ProviderInfo", "resolve_provider_config"]

DEFAULT_TIMEOUT: Final = 120.0


@dataclass(frozen=True, slots=True)
class ProviderInfo:
    adapter: str  # the adapter module's provider name
    key_vars: tuple[str, ...]
    key_required: bool
    default_model: str | None
    base_url_var: str | None = None
    default_base_url: str | None = None


PROVIDERS: Final[Mapping[str, ProviderInfo]] = {
    "openai": ProviderInfo("openai", ("OPENAI_API_KEY",), True, "gpt-4o-mini", "OPENAI_BASE_URL"),
    "azure": ProviderInfo("azure", ("AZURE_OPENAI_API_KEY",), True, None, "AZURE_OPENAI_ENDPOINT"),
    "anthropic": ProviderInfo(
        "anthropic", ("ANTHROPIC_API_KEY",), True, "claude-sonnet-4-6", "ANTHROPIC_BASE_URL"
    ),
    "gemini": ProviderInfo(
        "gemini", ("GEMINI_API_KEY", "GOOGLE_API_KEY"), True, "gemini-2.5-flash", "GEMINI_BASE_URL"
    ),
    "ollama": ProviderInfo("ollama", (), False, "llama3.1", "OLLAMA_HOST"),
    "openai_compatible": ProviderInfo(
        "openai_compatible", ("OPENAI_API_KEY",), False, None, "OPENAI_BASE_URL"
    ),
    # OpenAI-compatible services with a known home.
    "groq": ProviderInfo(
        "openai_compatible", ("GROQ_API_KEY",), True, None, None, "https://api.groq.com/openai/v1"
    ),
    "mistral": ProviderInfo(
        "openai_compatible", ("MISTRAL_API_KEY",), True, None, None, "https://api.mistral.ai/v1"
    ),
    "openrouter": ProviderInfo(
        "openai_compatible",
        ("OPENROUTER_API_KEY",),
        True,
        None,
        None,
        "https://openrouter.ai/api/v1",
    ),
    "vllm": ProviderInfo("openai_compatible", (), False, None, "OPENAI_BASE_URL"),
    "llamacpp": ProviderInfo("openai_compatible", (), False, None, "OPENAI_BASE_URL"),
}

# Providers picked automatically when theirs is the only key set.
_AUTO: Final = ("openai", "anthropic", "gemini")


def _not_configured(message: str, provider: str | None = None) -> ProviderError:
    return ProviderError(message, provider=provider, code="llm.not_configured", retryable=False)


def _get(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(name)
    return value.strip() if value and value.strip() else None


def _pick_provider(env: Mapping[str, str]) -> str:
    named = _get(env, "FLUID_LLM_PROVIDER")
    if named:
        return named.lower()
    with_keys = [p for p in _AUTO if any(_get(env, v) for v in PROVIDERS[p].key_vars)]
    if len(with_keys) == 1:
        return with_keys[0]
    if not with_keys:
        raise ProviderAuthError(
            "no LLM provider is configured: set OPENAI_API_KEY, ANTHROPIC_API_KEY or "
            "GEMINI_API_KEY (or FLUID_LLM_PROVIDER=ollama for a local model), or pass provider="
        )
    keys = ", ".join(v for p in with_keys for v in PROVIDERS[p].key_vars if _get(env, v))
    raise _not_configured(
        f"several provider keys are set ({keys}): choose one with FLUID_LLM_PROVIDER or provider="
    )


def _key(
    provider: str, info: ProviderInfo, api_key: str | None, env: Mapping[str, str]
) -> str | None:
    key = api_key if api_key is not None else _get(env, "FLUID_LLM_API_KEY")
    if key is None:
        key = next((v for name in info.key_vars if (v := _get(env, name))), None)
    key = key.strip() if key else None
    if not key:
        if not info.key_required:
            return None
        names = " or ".join(info.key_vars)
        raise ProviderAuthError(
            f"no API key for {provider}: set {names} (or FLUID_LLM_API_KEY) in the environment, "
            "or pass api_key=",
            provider=provider,
        )
    if any(ch.isspace() for ch in key) or not key.isprintable():
        raise ProviderAuthError(
            f"the API key for {provider} looks malformed (it contains whitespace or control "
            "characters): check how it was pasted into the environment",
            provider=provider,
        )
    return key


def _is_local(host: str) -> bool:
    if host in {"localhost", "localhost.localdomain"}:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _base_url(
    provider: str, info: ProviderInfo, base_url: str | None, env: Mapping[str, str]
) -> str | None:
    url = base_url or (_get(env, info.base_url_var) if info.base_url_var else None)
    url = url or info.default_base_url
    if url is None:
        if provider == "azure":
            raise _not_configured(
                "Azure OpenAI needs its endpoint: set AZURE_OPENAI_ENDPOINT "
                "(https://<resource>.openai.azure.com) or pass base_url=",
                provider,
            )
        if info.adapter == "openai_compatible":
            raise _not_configured(
                f"{provider} needs the server's URL: set OPENAI_BASE_URL "
                "(e.g. http://127.0.0.1:8000/v1) or pass base_url=",
                provider,
            )
        return None
    if provider == "ollama" and "://" not in url:
        url = f"http://{url}"  # OLLAMA_HOST is often host:port
    try:
        parts = urlsplit(url)
        _ = parts.port  # a malformed port raises here rather than at send time
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in {"http", "https"} or not parts.hostname:
        raise ProviderError(
            f"{provider} base URL {url!r} is not an http(s) URL",
            provider=provider,
            code="llm.bad_endpoint",
            retryable=False,
        )
    if provider == "ollama":
        host = parts.hostname
        if host in {"0.0.0.0", "::"}:  # noqa: S104 - a listen address, meaning this machine
            url = url.replace(host, "127.0.0.1", 1)
        elif not _is_local(host) and _get(env, "FLUID_OLLAMA_ALLOW_REMOTE") not in {"1", "true"}:
            raise ProviderError(
                f"OLLAMA_HOST points to {host}, which is not this machine; prompts would leave "
                "it unencrypted. Set FLUID_OLLAMA_ALLOW_REMOTE=1 to allow it.",
                provider=provider,
                code="llm.bad_endpoint",
                retryable=False,
            )
    return url


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
    name = (provider or _pick_provider(env)).lower()
    info = PROVIDERS.get(name)
    if info is None:
        raise _not_configured(
            f"unknown provider {name!r}: use one of {', '.join(sorted(PROVIDERS))}", name
        )
    if name == "openai" and base_url is None and _get(env, "OPENAI_BASE_URL"):
        base_url = _get(env, "OPENAI_BASE_URL")
    chosen_model = model or _get(env, "FLUID_LLM_MODEL") or info.default_model
    if not chosen_model:
        what = "deployment name" if name == "azure" else "model name"
        raise _not_configured(f"{name} needs a {what}: set FLUID_LLM_MODEL or pass model=", name)
    url = _base_url(name, info, base_url, env)
    key = _key(name, info, api_key, env)
    if timeout is None:
        timeout = env_float(
            env, "FLUID_LLM_TIMEOUT_SECONDS", DEFAULT_TIMEOUT, minimum=1.0, maximum=3600.0
        )
    return ProviderConfig(
        provider=name,
        model=chosen_model,
        api_key=key,
        base_url=url,
        timeout=float(timeout or DEFAULT_TIMEOUT),
        api_version=_get(env, "AZURE_OPENAI_API_VERSION") or _get(env, "OPENAI_API_VERSION")
        if name == "azure"
        else None,
    )
