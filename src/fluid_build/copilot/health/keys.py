"""Who shares a cooldown and a breaker: :class:`CooldownKey` and the parts it is made of.

A key names one provider, endpoint, API key (by a one-way fingerprint, never the
key itself) and model; two servers or two API keys never share state.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit

__all__ = ["COOLDOWN", "SEPARATOR", "CooldownKey", "key_fingerprint", "normalize_endpoint"]

# What one key of a store holds; the part after the kind prefix is a CooldownKey.
SEPARATOR: Final = "|"
#: The store's name for a key's cooldown window (the breaker's entries have their own).
COOLDOWN: Final = "cooldown:"


def key_fingerprint(api_key: str | None) -> str:
    """A short, stable, one-way fingerprint of an API key (never the key itself)."""
    if not api_key:
        return "nokey"
    digest = hashlib.blake2b(api_key.encode(), digest_size=8, person=b"fluid-cooldown")
    return digest.hexdigest()


def normalize_endpoint(url: str | None) -> str:
    """``url`` as it scopes shared state: scheme://host[:port]/path, lower-cased host.

    User, password, query and fragment are dropped (they may hold credentials
    and never name another server); a default port and a trailing slash too.
    """
    if not url:
        return "-"
    try:
        parts = urlsplit(url.strip())
        scheme = parts.scheme.lower() or "https"
        host = (parts.hostname or "").lower()
        port = parts.port
    except ValueError:
        return "-"
    if ":" in host:
        host = f"[{host}]"
    if port is not None and (scheme, port) not in {("http", 80), ("https", 443)}:
        host = f"{host}:{port}"
    path = parts.path.rstrip("/").replace(SEPARATOR, "%7C")
    return f"{scheme}://{host}{path}"


@dataclass(frozen=True, slots=True)
class CooldownKey:
    """Who shares a cooldown and a breaker: one provider, endpoint, API key and model."""

    provider: str
    fingerprint: str
    model: str
    endpoint: str = "-"

    @classmethod
    def for_call(
        cls, provider: str, api_key: str | None, model: str, endpoint: str | None = None
    ) -> CooldownKey:
        return cls(provider, key_fingerprint(api_key), model, normalize_endpoint(endpoint))

    @classmethod
    def parse(cls, text: str) -> CooldownKey | None:
        """The key :meth:`__str__` wrote, or None for text in another shape."""
        parts = text.split(SEPARATOR)
        if len(parts) < 4:
            return None
        provider, fingerprint, model = parts[0], parts[-2], parts[-1]
        return cls(provider, fingerprint, model, SEPARATOR.join(parts[1:-2]))

    def __str__(self) -> str:
        return SEPARATOR.join((self.provider, self.endpoint, self.fingerprint, self.model))
