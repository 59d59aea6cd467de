"""The faults of httpcore and aiohttp, named as httpx names them, at one boundary each.

Every transport raises httpx's exceptions whatever library sends the bytes, so
the one classifier (agents/error_classification.py) sees the same fault, with
the same code and retryability, on every pool. As httpx's own
``map_httpcore_exceptions``, each library has one boundary, a context manager
every place that calls into the library runs inside:

- :func:`map_httpcore_exceptions`: the sync pool (call/transport/sync.py), its
  request and its body; httpcore's fault becomes httpx's, chained to it.
- :func:`map_aiohttp_exceptions`: the aiohttp pool (call/transport/aio.py), its
  request, its body and its close; aiohttp's fault becomes httpx's naming the
  request, never chained to it (aiohttp's ``request_info`` holds the request's
  headers, and with them its credentials).

An exception that is not the library's goes through as it was; so do
``BaseException`` s that are not errors (cancellation, ``GeneratorExit``).
Each boundary is a plain object with ``__slots__``, not a generator-based
context manager: it costs two method calls where the call goes through it.
"""

from __future__ import annotations

from types import TracebackType
from typing import Final

import httpcore
import httpx

#: httpcore's exceptions as httpx names them, the most specific first (httpx's own table).
_CORE_FAULTS: Final[tuple[tuple[type[Exception], type[httpx.TransportError]], ...]] = (
    (httpcore.ConnectTimeout, httpx.ConnectTimeout),
    (httpcore.ReadTimeout, httpx.ReadTimeout),
    (httpcore.WriteTimeout, httpx.WriteTimeout),
    (httpcore.PoolTimeout, httpx.PoolTimeout),
    (httpcore.TimeoutException, httpx.TimeoutException),
    (httpcore.ConnectError, httpx.ConnectError),
    (httpcore.ReadError, httpx.ReadError),
    (httpcore.WriteError, httpx.WriteError),
    (httpcore.NetworkError, httpx.NetworkError),
    (httpcore.ProxyError, httpx.ProxyError),
    (httpcore.UnsupportedProtocol, httpx.UnsupportedProtocol),
    (httpcore.LocalProtocolError, httpx.LocalProtocolError),
    (httpcore.RemoteProtocolError, httpx.RemoteProtocolError),
    (httpcore.ProtocolError, httpx.ProtocolError),
)


def _as_httpx(exc: Exception) -> httpx.TransportError | None:
    for core, ours in _CORE_FAULTS:
        if isinstance(exc, core):
            return ours(str(exc))
    return None


class _HttpcoreFaults:
    """The sync pool's boundary: httpcore's faults raised as httpx's, ``from`` the original."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if isinstance(exc, Exception):
            mapped = _as_httpx(exc)
            if mapped is not None:
                raise mapped from exc


_HTTPCORE_FAULTS: Final = _HttpcoreFaults()  # it keeps nothing: one for every call


def map_httpcore_exceptions() -> _HttpcoreFaults:
    """The boundary every call into httpcore runs inside (``with map_httpcore_exceptions():``)."""
    return _HTTPCORE_FAULTS


def aiohttp_fault(exc: BaseException) -> type[httpx.TransportError] | None:
    """What httpx raises for what aiohttp raised (None: not aiohttp's, let it through)."""
    import aiohttp

    if isinstance(exc, aiohttp.ClientSSLError):
        return httpx.ConnectError  # its text names the certificate failure
    if isinstance(exc, aiohttp.ClientProxyConnectionError | aiohttp.ClientHttpProxyError):
        return httpx.ProxyError
    if isinstance(exc, aiohttp.ClientConnectorError):
        return httpx.ConnectError
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return httpx.ConnectTimeout
    if isinstance(exc, aiohttp.ServerTimeoutError | aiohttp.SocketTimeoutError):
        return httpx.ReadTimeout
    if isinstance(exc, aiohttp.InvalidURL):
        return httpx.UnsupportedProtocol
    if isinstance(
        exc,
        aiohttp.ClientResponseError  # a head it cannot parse: a bad status line, a long field
        | aiohttp.ServerDisconnectedError
        | aiohttp.ClientPayloadError,
    ):
        return httpx.RemoteProtocolError  # as h11 names the same faults under httpx
    if isinstance(exc, aiohttp.ClientError):
        return httpx.ReadError
    return None


class AiohttpFaults:
    """The aiohttp pool's boundary for one request: aiohttp's faults raised as httpx's,
    naming ``request``, never chained to the original (:func:`map_aiohttp_exceptions`)."""

    __slots__ = ("request",)

    def __init__(self, request: httpx.Request) -> None:
        self.request = request

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if not isinstance(exc, Exception):
            return
        fault = aiohttp_fault(exc)
        if fault is not None:
            error = fault(f"{type(exc).__name__}: {exc}")  # named by aiohttp's error itself
            error.request = self.request
            raise error from None


def map_aiohttp_exceptions(request: httpx.Request) -> AiohttpFaults:
    """The boundary every call into aiohttp for ``request`` runs inside: made once a
    request, kept by its body for the reads and the close."""
    return AiohttpFaults(request)


def client_closed() -> RuntimeError:
    return RuntimeError("Cannot send a request, as the client has been closed.")
