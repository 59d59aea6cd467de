"""The faults of httpcore and aiohttp, named as httpx names them.

Every transport raises httpx's exceptions whatever library sends the bytes, so
the one classifier (agents/error_classification.py) sees the same fault, with
the same code and retryability, on every pool.
"""

from __future__ import annotations

from typing import Final, NoReturn

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


def as_httpx(exc: Exception) -> httpx.TransportError | None:
    for core, ours in _CORE_FAULTS:
        if isinstance(exc, core):
            return ours(str(exc))
    return None


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


def from_aiohttp(exc: BaseException, request: httpx.Request) -> BaseException:
    """httpx's error for ``exc``, raised by aiohttp: named by the aiohttp error itself,
    never chained to it (its ``request_info`` holds the request's headers)."""
    fault = aiohttp_fault(exc)
    if fault is None:
        return exc
    error = fault(f"{type(exc).__name__}: {exc}")
    error.request = request
    return error


def raise_named(exc: Exception, request: httpx.Request) -> NoReturn:
    """From the handler of ``exc``: raise httpx's error for it (:func:`from_aiohttp`,
    never chained to it), or ``exc`` itself as it was when it is not aiohttp's."""
    mapped = from_aiohttp(exc, request)
    if mapped is exc:
        raise exc
    raise mapped from None


def client_closed() -> RuntimeError:
    return RuntimeError("Cannot send a request, as the client has been closed.")
