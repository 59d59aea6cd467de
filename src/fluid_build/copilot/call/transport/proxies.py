"""Proxies from the environment, routed without httpx's private API.

:func:`env_proxies` reads the environment as httpx does for a client it
makes; :func:`env_mounts` makes a transport for each proxy, and
:class:`Routes` picks the one that carries a URL, as httpx's mounts do.
"""

from __future__ import annotations

import ipaddress
import urllib.request
from collections.abc import Callable, Mapping
from typing import Generic, TypeVar

import httpx

from fluid_build.copilot.call.transport.config import URLS_KEPT


def env_proxies() -> dict[str, str | None]:
    """The proxy of each URL pattern, as httpx reads the environment for a client it makes:
    ``HTTP_PROXY``, ``HTTPS_PROXY``, ``ALL_PROXY`` (any case) and ``NO_PROXY`` (None:
    no proxy for that pattern; ``NO_PROXY=*``: none at all)."""
    found = urllib.request.getproxies()
    mounts: dict[str, str | None] = {}
    for scheme in ("http", "https", "all"):
        if found.get(scheme):
            url = found[scheme]
            mounts[f"{scheme}://"] = url if "://" in url else f"http://{url}"
    for host in (h.strip() for h in found.get("no", "").split(",")):
        if host == "*":
            return {}
        if not host:
            continue
        if "://" in host:
            mounts[host] = None
        elif _is_ip(host):
            mounts[f"all://[{host}]" if ":" in host else f"all://{host}"] = None
        elif host.lower() == "localhost":
            mounts[f"all://{host}"] = None
        else:
            mounts[f"all://*{host}"] = None
    return mounts


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.split("/")[0])
    except ValueError:
        return False
    return True


class _Pattern:
    """One mount pattern (``all://``, ``https://``, ``all://*example.com``, ``http://h:8080``),
    matched as httpx matches its own."""

    __slots__ = ("host", "port", "rank", "scheme")

    def __init__(self, pattern: str) -> None:
        scheme, _, rest = pattern.partition("://")
        self.scheme = "" if scheme == "all" else scheme.lower()
        host, port = rest, None
        if host.startswith("["):
            inner, _, tail = host[1:].partition("]")
            host = inner
            if tail.startswith(":") and tail[1:].isdigit():
                port = int(tail[1:])
        elif host.count(":") == 1:
            name, _, digits = host.partition(":")
            if digits.isdigit():
                host, port = name, int(digits)
        self.host = host.lower().rstrip("/")
        self.port = port
        # httpx's order: a port first, then the longer host, then the longer scheme
        self.rank = (port is not None, len(self.host), len(self.scheme))

    def matches(self, url: httpx.URL) -> bool:
        if self.scheme and url.scheme != self.scheme:
            return False
        host = url.host.lower()
        if self.host.startswith("*."):
            if not host.endswith(self.host[1:]):
                return False
        elif self.host.startswith("*"):
            suffix = self.host[1:]
            if host != suffix and not host.endswith("." + suffix):
                return False
        elif self.host and host != self.host:
            return False
        return self.port is None or url.port == self.port


_Routed = TypeVar("_Routed")


class Routes(Generic[_Routed]):
    """Which transport carries a URL: the first matching mount's, else the default one."""

    __slots__ = ("_cache", "default", "mounts")

    def __init__(self, default: _Routed, mounts: Mapping[str, _Routed | None]) -> None:
        self.default = default
        patterns = [(_Pattern(p), t) for p, t in mounts.items()]
        self.mounts = sorted(patterns, key=lambda item: item[0].rank, reverse=True)
        self._cache: dict[tuple[str, str, int | None], _Routed] = {}

    def __call__(self, url: httpx.URL) -> _Routed:
        if not self.mounts:  # no proxy in the environment: the common case, nothing to match
            return self.default
        key = (url.scheme, url.host, url.port)
        found = self._cache.get(key)
        if found is None:
            found = self.default
            for pattern, transport in self.mounts:
                if pattern.matches(url):
                    found = self.default if transport is None else transport
                    break
            if len(self._cache) >= URLS_KEPT:
                self._cache.clear()
            self._cache[key] = found
        return found


def env_mounts(
    make: Callable[[httpx.Proxy | None], _Routed], trust_env: bool = True
) -> tuple[_Routed, dict[str, _Routed | None]]:
    """A default transport and one per proxy of the environment, each made by ``make``:
    what ``httpx.Client(transport=..., mounts=...)`` takes, from httpx's public API only."""
    mounts: dict[str, _Routed | None] = {}
    if trust_env:
        for pattern, url in env_proxies().items():
            mounts[pattern] = None if url is None else make(httpx.Proxy(url))
    return make(None), mounts
