"""The sync pool: httpcore under httpx's types, every socket wait inside the call's deadline.

httpx's timeouts are per read: a server that drips its answer one byte at a
time never trips them. :class:`CoreTransport` is httpx's ``HTTPTransport``
made from public parts, on a network backend whose every wait is cut to what
the call's deadline (and the attempt's phase, call/phases.py) leaves.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import time
from collections.abc import Iterable, Iterator
from typing import Any, cast

import httpcore
import httpx

from fluid_build.copilot.call.drive import CALL_ENDS, CALL_PHASE
from fluid_build.copilot.call.transport.config import pool_limits
from fluid_build.copilot.call.transport.faults import map_httpcore_exceptions


def _narrowed(timeout: float | None) -> float | None:
    """A socket wait of ``timeout`` seconds, cut to what the call's deadline leaves.

    Never 0 (a socket with timeout 0 is non-blocking, not timed): a wait past the
    deadline lasts a millisecond and then times out. The attempt's phase (call/phases.py)
    cuts it too: to when its next byte is due (the first token, then each idle gap).
    """
    ends = CALL_ENDS.get()
    phase = CALL_PHASE.get()
    if phase is not None:
        due = phase.due()
        if due is not None and (ends is None or due < ends):
            ends = due
    if ends is None:
        return timeout
    left = max(ends - time.monotonic(), 0.001)
    return left if timeout is None or left < timeout else timeout


class _DeadlineStream(httpcore.NetworkStream):
    """A connection whose every read and write waits at most what the deadline leaves.

    httpx's timeouts are per read: a server that drips the status line and the
    headers one byte at a time never trips them. Here each wait is narrowed.
    """

    __slots__ = ("_inner",)

    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, _narrowed(timeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, _narrowed(timeout))
        phase = CALL_PHASE.get()
        if phase is not None:
            phase.written()

    def close(self) -> None:
        # Shut down first: a socket closed from another thread (the client's close() during
        # a call) does not wake a read blocked on it, which would then wait out the deadline.
        sock = self._inner.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self._inner.close()

    def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.NetworkStream:
        inner = self._inner.start_tls(ssl_context, server_hostname, _narrowed(timeout))
        return _DeadlineStream(inner)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _DeadlineBackend(httpcore.NetworkBackend):
    """httpcore's sync backend, its connections wrapped in :class:`_DeadlineStream`."""

    def __init__(self) -> None:
        self._inner = httpcore.SyncBackend()
        # Set when the pool closes: a request that waited in httpcore's queue meanwhile
        # would otherwise be sent on a connection opened after the close, and left open.
        self.closed = False

    def _open(self) -> None:
        if self.closed:
            raise httpcore.ConnectError("the client has been closed")

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.NetworkStream:
        self._open()
        stream = self._inner.connect_tcp(
            host, port, _narrowed(timeout), local_address, socket_options
        )
        return _DeadlineStream(stream)

    def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.NetworkStream:
        self._open()
        stream = self._inner.connect_unix_socket(path, _narrowed(timeout), socket_options)
        return _DeadlineStream(stream)

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


class _CoreBody(httpx.SyncByteStream):
    """An httpcore response body, its faults as httpx names them."""

    __slots__ = ("_inner",)

    def __init__(self, inner: Iterable[bytes]) -> None:
        self._inner = inner

    def __iter__(self) -> Iterator[bytes]:
        with map_httpcore_exceptions():
            yield from self._inner

    def close(self) -> None:
        close = getattr(self._inner, "close", None)
        if close is not None:
            close()


def _core_url(url: httpx.URL) -> httpcore.URL:
    return httpcore.URL(
        scheme=url.raw_scheme, host=url.raw_host, port=url.port, target=url.raw_path
    )


class CoreTransport(httpx.BaseTransport):
    """httpx's ``HTTPTransport`` made from public parts: an httpcore pool (direct or
    through a proxy) on a network backend whose every wait ends by the call's deadline."""

    def __init__(
        self,
        *,
        verify: ssl.SSLContext | str | bool = True,
        cert: Any = None,
        trust_env: bool = True,
        limits: httpx.Limits | None = None,
        proxy: httpx.Proxy | None = None,
    ) -> None:
        limits = limits or pool_limits()
        self._backend = _DeadlineBackend()
        common: dict[str, Any] = {
            "ssl_context": httpx.create_ssl_context(verify=verify, cert=cert, trust_env=trust_env),
            "max_connections": limits.max_connections,
            "max_keepalive_connections": limits.max_keepalive_connections,
            "keepalive_expiry": limits.keepalive_expiry,
            "network_backend": self._backend,
        }
        self.pool: httpcore.ConnectionPool
        if proxy is None:
            self.pool = httpcore.ConnectionPool(**common)
        elif proxy.url.scheme in ("http", "https"):
            self.pool = httpcore.HTTPProxy(
                proxy_url=_core_url(proxy.url),
                proxy_auth=proxy.raw_auth,
                proxy_headers=proxy.headers.raw,
                proxy_ssl_context=proxy.ssl_context,
                **common,
            )
        elif proxy.url.scheme in ("socks5", "socks5h"):
            try:
                import socksio  # type: ignore[import-not-found]  # noqa: F401
            except ImportError:
                raise ImportError(
                    "a SOCKS proxy needs the 'socksio' package: pip install 'httpx[socks]'"
                ) from None
            self.pool = httpcore.SOCKSProxy(
                proxy_url=_core_url(proxy.url), proxy_auth=proxy.raw_auth, **common
            )
        else:
            raise ValueError(
                f"a proxy's scheme must be http, https, socks5 or socks5h, not {proxy.url.scheme!r}"
            )

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        core = httpcore.Request(
            method=request.method,
            url=_core_url(request.url),
            headers=request.headers.raw,
            content=cast(Iterable[bytes], request.stream),
            extensions=request.extensions,
        )
        with map_httpcore_exceptions():
            answer = self.pool.handle_request(core)
        return httpx.Response(
            status_code=answer.status,
            headers=answer.headers,
            stream=_CoreBody(cast(Iterable[bytes], answer.stream)),
            extensions=answer.extensions,
        )

    def close(self) -> None:
        self._backend.closed = True
        self.pool.close()
