"""The seams between the call's own pools and the steps that use them, declared once.

A pool made by call/transport.py takes a shorter path than a caller's own
``httpx`` pool at three points, and each point is a contract written here:

- :class:`JsonRequests`: call/prepare.py builds the request with the pool's
  ``fluid_json_request`` (httpx's ``build_request(..., json=)`` in a third
  of its time) instead of ``build_request``.
- :class:`SyncPool` / :class:`AsyncPool`: call/drive.py sends with the pool's
  ``fluid_send`` (straight to the transport ``Routes`` picks) instead of
  ``send``.
- :class:`DirectBody`: call/drive.py and call/wire.py read the aiohttp
  body with ``fluid_read`` (its faults already named as httpx names them)
  instead of httpx's iterators.
- :class:`FieldRequest`: the aiohttp transport sends a request made by
  ``fluid_json_request`` as its header fields (``fluid_fields``) to its URL's
  text (``fluid_url``), without httpx's ``Headers`` built and read back.

Which path a call takes is found by a plain ``isinstance`` on a nominal mark
(:class:`OwnPool`, :class:`OwnBody`, :class:`OwnRequest`), one class
each, about 80 ns: an ``isinstance`` on a ``runtime_checkable`` Protocol
costs over 1 us on every call. call/transport.py holds every marked class to
its Protocol under mypy, so renaming a ``fluid_*`` member on either side
breaks the type check (and tests/test_architecture.py fails on any
``getattr``/``hasattr`` of a ``fluid_*`` name).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Protocol, TypeGuard

import httpx

__all__ = [
    "AsyncPool",
    "DirectBody",
    "FieldRequest",
    "JsonRequests",
    "OwnBody",
    "OwnPool",
    "OwnRequest",
    "SyncPool",
    "is_own_async_pool",
    "is_own_body",
    "is_own_pool",
    "is_own_request",
    "is_own_sync_pool",
]


class JsonRequests(Protocol):
    """A pool that builds its JSON requests itself (call/prepare.py)."""

    def fluid_json_request(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        payload: Any,
        timeout: float | Mapping[str, float],
    ) -> httpx.Request:
        """The request ``build_request(method, url, headers=, json=payload, timeout=)``
        would make: the same method, URL, headers (the pool's defaults first), body
        bytes and timeouts."""
        ...


class SyncPool(JsonRequests, Protocol):
    """A sync pool that sends straight to its transport (call/drive.py ``send``)."""

    def fluid_send(self, request: httpx.Request) -> httpx.Response:
        """As ``send(request, stream=True, follow_redirects=False)``: the answer's head,
        its body left to stream, every fault naming ``request``."""
        ...


class AsyncPool(JsonRequests, Protocol):
    """An async pool that sends straight to its transport (call/drive.py ``asend``)."""

    def fluid_send(self, request: httpx.Request) -> Awaitable[httpx.Response]:
        """:meth:`SyncPool.fluid_send`, to be awaited (called at once: no bound method is
        held while the call is in flight)."""
        ...


class DirectBody(Protocol):
    """An answer's body read without httpx's iterators between (call/wire.py): its
    faults are already named as httpx names them."""

    def __aiter__(self) -> AsyncIterator[bytes]:
        """The raw chunks as they arrive."""
        ...

    async def fluid_read(self, take: Callable[[bytes], bytes], done: Callable[[], bool]) -> bytes:
        """The raw body, each chunk through ``take`` (which raises past the size limit or
        the deadline) until the end or ``done()``."""
        ...

    async def aclose(self) -> None:
        """Give the connection back to the pool (once)."""
        ...


class FieldRequest(Protocol):
    """A request whose header fields and URL text the transport may send as they are.

    ``fluid_fields`` is ``None`` once ``headers`` has been read (then it may have been
    changed, and ``headers`` is what is sent); ``fluid_url`` is ``None`` once ``url``
    has been set."""

    fluid_fields: list[tuple[str, str]] | None
    fluid_url: str | None


class OwnPool:
    """The mark of a pool made by call/transport.py: a :class:`SyncPool` on an
    ``httpx.Client``, an :class:`AsyncPool` on an ``httpx.AsyncClient``."""

    __slots__ = ()


class OwnBody:
    """The mark of a body that is a :class:`DirectBody`."""

    __slots__ = ()


class OwnRequest:
    """The mark of a request that is a :class:`FieldRequest`."""

    __slots__ = ()


def is_own_pool(pool: httpx.Client | httpx.AsyncClient) -> TypeGuard[JsonRequests]:
    return isinstance(pool, OwnPool)


def is_own_sync_pool(pool: httpx.Client) -> TypeGuard[SyncPool]:
    return isinstance(pool, OwnPool)


def is_own_async_pool(pool: httpx.AsyncClient) -> TypeGuard[AsyncPool]:
    return isinstance(pool, OwnPool)


def is_own_body(stream: object) -> TypeGuard[DirectBody]:
    return isinstance(stream, OwnBody)


def is_own_request(request: httpx.Request) -> TypeGuard[FieldRequest]:
    return isinstance(request, OwnRequest)
