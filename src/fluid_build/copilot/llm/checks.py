"""Checks every provider's settings share: a value that cannot be used is a typed error.

Kept apart from :mod:`.settings` so that an adapter resolving its own settings
(bedrock's endpoint and region, vertex's project) uses them without importing
the table of providers, which imports it back.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from fluid_build.copilot.agents.errors import ProviderError

__all__ = ["clean", "not_configured", "url_problem"]


def not_configured(
    message: str,
    provider: str | None = None,
    *,
    variable: str | None = None,
    example: str | None = None,
) -> ProviderError:
    details = {"variable": variable, "example": example} if variable else None
    return ProviderError(
        message, provider=provider, code="llm.not_configured", retryable=False, details=details
    )


def clean(value: str) -> bool:
    """No control characters and no whitespace inside (the ends are already stripped)."""
    return value.isprintable() and not any(ch.isspace() for ch in value)


def url_problem(url: str) -> str | None:
    """Why ``url`` cannot be used as an endpoint, or None when it can."""
    if not clean(url):
        return "it contains whitespace or control characters"
    try:
        parts = urlsplit(url)
        port = parts.port  # a malformed or out-of-range port raises here, not at send time
    except ValueError:
        return "it does not parse as a URL"
    if parts.scheme.lower() not in {"http", "https"}:
        return "it is not an http:// or https:// URL"
    host = parts.hostname
    if not host:
        return "it names no host"
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if not all(ch.isalnum() or ch in "-._" for ch in host):
            return f"its host {host[:40]!r} is not a host name"
    if port == 0:
        return "its port is 0"
    import httpx  # what will send it must accept it too

    try:
        httpx.URL(url)
    except (httpx.InvalidURL, ValueError):
        return "it is not a valid URL"
    return None
