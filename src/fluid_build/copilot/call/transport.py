"""The connection pools under a call: which transport, how large, and a fair wait for a slot.

httpx 0.28's default pool keeps 20 of its 100 connections alive, so at 100 or
more calls in flight it closes and reopens connections without end
(encode/httpcore#1035), and its queue of waiting requests is matched against
the connections in O(connections x requests). Here every pool keeps all its
connections alive, and in front of each async pool stands an
:class:`AdmissionGate`: a FIFO of calls waiting for one of the pool's slots,
each for at most its request's pool timeout (what is left of the call's
deadline). The pool itself then never queues, and 1,000 calls at once wait
their turn in order instead of ending in thousands of ``PoolTimeout``.

``FLUID_LLM_TRANSPORT`` (or ``transport=``) picks what sends the bytes of an
async call: ``auto`` (the default), ``aiohttp`` (aiohttp's pool under httpx's
types, :class:`AiohttpTransport`: several times httpx 0.28's calls per second at
1,000 in flight, see docs/benchmarks.md "Async at 1,000 concurrent calls") or
``httpx``. ``auto``
is aiohttp, except while a test double stands in for httpx's async transport
(respx, pytest-httpx, ``mock.patch``): then httpx, so that the double sees the
calls. Sync calls always use httpx, over :class:`CoreTransport`: httpcore's
pool on a network backend whose every socket wait ends by the call's deadline.

Every pool here is made from httpx's and httpcore's public API: the
transports (the direct one and one per proxy of the environment) are made
here and routed here (:class:`Routes`), so nothing depends on how a given
httpx release builds a client. docs/transports.md states the contract that
every pool keeps, and tests/test_conformance.py proves it on each.

A pool opens as many connections as there are calls in flight, up to
:func:`connection_ceiling`, unless ``FLUID_LLM_MAX_CONNECTIONS`` (or
``max_connections=``) caps it (:func:`max_connections_choice`).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import ipaddress
import json
import os
import socket
import ssl
import time
import urllib.request
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Final, Generic, Literal, NoReturn, TypeVar, cast

import httpcore
import httpx

from fluid_build._redact import one_line, redact, redact_url, truncate
from fluid_build.copilot.agents.errors import ProviderError
from fluid_build.copilot.call.drive import CALL_ENDS, CALL_PHASE
from fluid_build.copilot.call.loops import LoopPools
from fluid_build.copilot.call.seams import (
    AsyncPool,
    DirectBody,
    FieldRequest,
    OwnBody,
    OwnPool,
    OwnRequest,
    SyncPool,
    is_own_request,
)
from fluid_build.copilot.call.wire import ACCEPT_ENCODING

__all__ = [
    "CALL_ENDS",
    "HEAD_LIMIT",
    "KEEPALIVE_EXPIRY",
    "MAX_CONNECTIONS",
    "MAX_CONNECTIONS_ENV",
    "TRANSPORTS",
    "TRANSPORT_ENV",
    "AdmissionGate",
    "AiohttpTransport",
    "CoreTransport",
    "GatedTransport",
    "LoopPools",
    "PooledAsyncClient",
    "PooledClient",
    "Routes",
    "Transport",
    "build_async_client",
    "build_client",
    "connection_ceiling",
    "env_mounts",
    "env_proxies",
    "httpx_mocked",
    "max_connections_choice",
    "pool_limits",
    "transport_choice",
]

Transport = Literal["httpx", "aiohttp"]
#: What FLUID_LLM_TRANSPORT may say; ``auto`` (or nothing) is resolved by :func:`transport_choice`.
TRANSPORTS: Final[tuple[str, ...]] = ("auto", "aiohttp", "httpx")
TRANSPORT_ENV: Final = "FLUID_LLM_TRANSPORT"

#: Where a user caps the connections of each pool (``LLMClient(max_connections=)`` wins).
MAX_CONNECTIONS_ENV: Final = "FLUID_LLM_MAX_CONNECTIONS"
#: The most any pool opens, capped or not: a port range's worth to one server is
#: far past every provider's own limit on concurrent requests.
MAX_CONNECTIONS: Final = 10_000
#: Seconds an idle connection is kept before it is closed (httpx's default): the
#: connections a burst of calls opened do not outlive it by much.
KEEPALIVE_EXPIRY: Final = 5.0


def connection_ceiling() -> int:
    """How many connections a pool may open when the user set no cap: as many as the
    calls in flight, bounded only by what the process may open (half its open-file
    limit, ``ulimit -n``, leaving the rest to files, the store and the caller) and by
    :data:`MAX_CONNECTIONS`. Read when a pool is made, so a limit raised at start counts."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):  # no such limit here (Windows): the cap alone
        return MAX_CONNECTIONS
    if soft == resource.RLIM_INFINITY or soft <= 0:
        return MAX_CONNECTIONS
    return max(min(soft // 2, MAX_CONNECTIONS), 1)


def pool_limits(max_connections: int | None = None) -> httpx.Limits:
    """A pool's limits: ``max_connections`` (None: :func:`connection_ceiling`), every
    one of them kept alive while in use, an idle one closed after :data:`KEEPALIVE_EXPIRY`."""
    slots = connection_ceiling() if max_connections is None else max_connections
    return httpx.Limits(
        max_connections=slots, max_keepalive_connections=slots, keepalive_expiry=KEEPALIVE_EXPIRY
    )


def max_connections_choice(
    env: Mapping[str, str] | None = None,
    max_connections: int | None = None,
    *,
    provider: str | None = None,
) -> int | None:
    """The user's cap on each pool's connections (the argument, else
    ``FLUID_LLM_MAX_CONNECTIONS``), checked; None: no cap, the pool follows the calls
    in flight. Not a whole number from 1 to :data:`MAX_CONNECTIONS`: a typed
    ``llm.not_configured`` error naming where the value came from."""
    if max_connections is not None:
        source, raw = "max_connections=", str(max_connections)
        ok = isinstance(max_connections, int) and not isinstance(max_connections, bool)
    else:
        raw = (os.environ if env is None else env).get(MAX_CONNECTIONS_ENV, "").strip()
        if not raw:
            return None
        source, ok = MAX_CONNECTIONS_ENV, raw.isascii() and raw.isdigit()
    value = int(raw) if ok else 0
    if 1 <= value <= MAX_CONNECTIONS:
        return value
    raise _not_configured(
        f"{source} {truncate(redact(raw), 40)!r} is not a number of connections; a whole "
        f"number from 1 to {MAX_CONNECTIONS:,}, or unset to follow the calls in flight "
        f"(e.g. {MAX_CONNECTIONS_ENV}=200)",
        provider,
        variable=MAX_CONNECTIONS_ENV if source == MAX_CONNECTIONS_ENV else None,
        example="200",
    )


#: What httpx reads from the environment when it makes a connection pool.
_POOL_VARS: Final = (
    "HTTPS_PROXY",
    "https_proxy",
    "HTTP_PROXY",
    "http_proxy",
    "ALL_PROXY",
    "all_proxy",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
)
_AIOHTTP_INSTALL: Final = "pip install aiohttp (fluid-build depends on it)"


def _not_configured(message: str, provider: str | None, **details: Any) -> ProviderError:
    return ProviderError(
        message,
        provider=provider,
        code="llm.not_configured",
        retryable=False,
        details=details,
    )


def transport_choice(
    env: Mapping[str, str] | None = None,
    transport: str | None = None,
    *,
    provider: str | None = None,
) -> Transport:
    """The async transport asked for (the argument, else ``FLUID_LLM_TRANSPORT``), checked.

    ``auto`` (or nothing) is aiohttp when it is importable and httpx's async
    transport is not being mocked (:func:`httpx_mocked`), else httpx. A bad
    value, or ``aiohttp`` asked for by name but not importable, is a typed
    ``llm.not_configured`` error naming where the value came from.
    """
    source = "transport=" if transport is not None else TRANSPORT_ENV
    if transport is None:
        transport = (os.environ if env is None else env).get(TRANSPORT_ENV, "")
    value = transport.strip().lower() or "auto"
    if value not in TRANSPORTS:
        raise _not_configured(
            f"{source} {truncate(redact(transport), 40)!r} is not a transport; "
            f"one of {', '.join(TRANSPORTS)} (e.g. {TRANSPORT_ENV}=httpx)",
            provider,
            variable=TRANSPORT_ENV,
            example="httpx",
            choices=list(TRANSPORTS),
        )
    if value == "httpx":
        return "httpx"
    if value == "auto" and httpx_mocked():
        return "httpx"
    try:
        import aiohttp  # noqa: F401
    except ImportError as exc:
        if value == "auto":  # installed without its dependencies: httpx still works
            return "httpx"
        raise _not_configured(
            f"{source} asks for the aiohttp transport, but {exc.name or 'aiohttp'} is not "
            f"installed: {_AIOHTTP_INSTALL}, or choose another "
            f"(e.g. {TRANSPORT_ENV}=httpx)",
            provider,
            variable=TRANSPORT_ENV,
            example="httpx",
            missing=exc.name,
        ) from None
    return "aiohttp"


def httpx_mocked() -> bool:
    """Whether a test double stands in for httpx's async transport.

    respx (its default mocker) and ``mock.patch`` replace httpcore's
    ``AsyncConnectionPool.handle_async_request``; pytest-httpx replaces
    ``httpx.AsyncHTTPTransport.handle_async_request``. An aiohttp pool would go
    round either, so ``auto`` picks httpx while one is in place. (respx's
    ``using="httpx"`` mocker hooks the client's choice of transport instead,
    which an aiohttp pool honours too.)
    """
    import httpcore

    for owner, home in (
        (httpcore.AsyncConnectionPool, "httpcore."),
        (httpx.AsyncHTTPTransport, "httpx."),
    ):
        method = owner.__dict__.get("handle_async_request")
        if not (getattr(method, "__module__", None) or "").startswith(home):
            return True
    return False


class AdmissionGate:
    """A FIFO semaphore of ``slots``: callers are admitted in the order they asked.

    A caller waits at most its ``timeout`` (then ``httpx.PoolTimeout``, which
    the client turns into the deadline's typed error); a caller cancelled or
    timed out while queued leaves the queue, and a slot handed to it just as it
    gave up goes to the next caller.
    """

    __slots__ = ("_free", "_waiters", "slots")

    def __init__(self, slots: int) -> None:
        if slots < 1:
            raise ValueError(f"an admission gate needs at least one slot, not {slots}")
        self.slots = slots
        self._free = slots
        self._waiters: deque[asyncio.Future[None]] = deque()

    def __repr__(self) -> str:
        return f"AdmissionGate(slots={self.slots}, in_use={self.in_use}, waiting={self.waiting})"

    @property
    def in_use(self) -> int:
        return self.slots - self._free

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def try_acquire(self) -> bool:
        """Take a free slot if no one is waiting for one; never waits."""
        if self._free > 0 and not self._waiters:
            self._free -= 1
            return True
        return False

    async def acquire(self, timeout: float | None) -> None:
        """Take a slot, waiting in line at most ``timeout`` seconds (None: no bound)."""
        if self.try_acquire():
            return
        if timeout is not None and timeout <= 0:
            raise httpx.PoolTimeout(self._full())
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(turn)
        try:
            async with asyncio.timeout(timeout):
                await turn
        except BaseException as exc:
            if turn.done() and not turn.cancelled():
                self.release()  # admitted as we gave up: the slot goes on
            else:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(turn)
            if isinstance(exc, TimeoutError):
                raise httpx.PoolTimeout(self._full()) from None
            raise

    def release(self) -> None:
        """Give a slot back: to the longest waiter, else to the pool."""
        while self._waiters:
            turn = self._waiters.popleft()
            if not turn.done():
                turn.set_result(None)
                return
        self._free += 1

    def _full(self) -> str:
        return f"all {self.slots} connections stayed busy ({self.waiting} calls waiting)"


class _Released(httpx.AsyncByteStream):
    """A response body that gives its gate slot back when closed (once)."""

    __slots__ = ("_gate", "_stream")

    def __init__(self, stream: httpx.AsyncByteStream, gate: AdmissionGate) -> None:
        self._stream: httpx.AsyncByteStream | None = stream
        self._gate = gate

    async def __aiter__(self) -> AsyncIterator[bytes]:
        assert self._stream is not None, "read after close"
        async for chunk in self._stream:
            yield chunk

    async def aclose(self) -> None:
        stream, self._stream = self._stream, None
        if stream is None:
            return
        try:
            await stream.aclose()
        finally:
            self._gate.release()


def _shortened(timeouts: Mapping[str, float | None], waited: float) -> dict[str, float | None]:
    """The request's timeouts less the time spent in line: the wait counts against them."""
    return {k: None if v is None else max(v - waited, 0.001) for k, v in timeouts.items()}


async def _wait_in_line(gate: AdmissionGate, request: httpx.Request) -> None:
    """Wait for one of ``gate``'s slots, at most the request's pool timeout; the time spent
    in line is taken off the request's timeouts (the gate's slow path, on every pool)."""
    timeouts: dict[str, float | None] = request.extensions.get("timeout", {})
    started = time.monotonic()
    await gate.acquire(timeouts.get("pool"))
    if timeouts:
        request.extensions["timeout"] = _shortened(timeouts, time.monotonic() - started)


class GatedTransport(httpx.AsyncBaseTransport):
    """An async transport whose requests first pass ``gate``, held until the body is closed."""

    def __init__(self, inner: httpx.AsyncBaseTransport, gate: AdmissionGate) -> None:
        self.inner = inner
        self.gate = gate
        self.closed = False

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if not self.gate.try_acquire():  # a free slot: no clock read on the fast path
            await _wait_in_line(self.gate, request)
        try:
            if self.closed:  # admitted after the client closed: httpcore would open anew
                raise _closed()
            response = await self.inner.handle_async_request(request)
        except BaseException:
            self.gate.release()
            raise
        response.stream = _Released(cast(httpx.AsyncByteStream, response.stream), self.gate)
        return response

    async def aclose(self) -> None:
        self.closed = True
        await self.inner.aclose()


# -- the sync pool: httpcore under httpx's types, every socket wait inside the call's deadline --


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


class _CoreBody(httpx.SyncByteStream):
    """An httpcore response body, its faults as httpx names them."""

    __slots__ = ("_inner",)

    def __init__(self, inner: Iterable[bytes]) -> None:
        self._inner = inner

    def __iter__(self) -> Iterator[bytes]:
        try:
            yield from self._inner
        except Exception as exc:
            mapped = _as_httpx(exc)
            if mapped is None:
                raise
            raise mapped from exc

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
        try:
            answer = self.pool.handle_request(core)
        except Exception as exc:
            mapped = _as_httpx(exc)
            if mapped is None:
                raise
            raise mapped from exc
        return httpx.Response(
            status_code=answer.status,
            headers=answer.headers,
            stream=_CoreBody(cast(Iterable[bytes], answer.stream)),
            extensions=answer.extensions,
        )

    def close(self) -> None:
        self._backend.closed = True
        self.pool.close()


# -- the async pools: httpx's or aiohttp's, their faults named alike -----------------------

#: The most an answer's head may hold, on every transport: h11 (under httpx) reads a
#: head of up to 100 KiB; aiohttp is told the same for a line and a header field.
HEAD_LIMIT: Final = 100 * 1024
#: Header fields in one head: aiohttp's own default is 128; h11 counts only bytes.
_MAX_HEADERS: Final = 1024


def _aiohttp_fault(exc: BaseException) -> type[httpx.TransportError] | None:
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


def _from_aiohttp(exc: BaseException, request: httpx.Request) -> BaseException:
    """httpx's error for ``exc``, raised by aiohttp: named by the aiohttp error itself,
    never chained to it (its ``request_info`` holds the request's headers)."""
    fault = _aiohttp_fault(exc)
    if fault is None:
        return exc
    error = fault(f"{type(exc).__name__}: {exc}")
    error.request = request
    return error


def _raise_named(exc: Exception, request: httpx.Request) -> NoReturn:
    """From the handler of ``exc``: raise httpx's error for it (:func:`_from_aiohttp`,
    never chained to it), or ``exc`` itself as it was when it is not aiohttp's."""
    mapped = _from_aiohttp(exc, request)
    if mapped is exc:
        raise exc
    raise mapped from None


def _aiohttp_session(
    verify: ssl.SSLContext | str | bool, cert: Any, trust_env: bool, limits: httpx.Limits
) -> Callable[[], Any]:
    """What makes the aiohttp session of a pool, on first use inside the pool's loop: no
    cookie jar, heads as large as httpx reads, the certificates of the environment."""
    import aiohttp

    context = httpx.create_ssl_context(verify=verify, cert=cert, trust_env=trust_env)
    sizes: dict[str, Any] = {"max_line_size": HEAD_LIMIT, "max_field_size": HEAD_LIMIT}
    if "max_headers" in inspect.signature(aiohttp.ClientSession).parameters:
        sizes["max_headers"] = _MAX_HEADERS

    def session() -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(
            limit=limits.max_connections or 0,
            keepalive_timeout=limits.keepalive_expiry or KEEPALIVE_EXPIRY,
            ssl=context,
        )
        return aiohttp.ClientSession(
            connector=connector, cookie_jar=aiohttp.DummyCookieJar(), trust_env=False, **sizes
        )

    return session


class _AiohttpStream(OwnBody, httpx.AsyncByteStream):
    """An aiohttp response's body as it arrives, its faults as httpx names them; closing
    it gives the connection back to aiohttp's pool and the slot to the gate (once).

    A :class:`~fluid_build.copilot.call.seams.DirectBody`: call/wire.py reads it straight
    (no httpx iterator between), its faults already named."""

    __slots__ = ("_gate", "_request", "_response")

    def __init__(self, response: Any, request: httpx.Request, gate: AdmissionGate) -> None:
        self._response: Any = response
        self._request = request
        self._gate: AdmissionGate | None = gate

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._response.content.iter_any():
                yield chunk
        except Exception as exc:  # noqa: BLE001 - raised again by _raise_named, named
            _raise_named(exc, self._request)

    async def fluid_read(self, take: Callable[[bytes], bytes], done: Callable[[], bool]) -> bytes:
        """The raw body, each chunk through ``take`` (call/wire.py's bound, which raises past
        the limit or the deadline) until the end or ``done()``: no iterator between, its
        faults named as :meth:`__aiter__` names them."""
        content = self._response.content
        parts: list[bytes] = []
        try:
            while chunk := await content.readany():
                parts.append(take(chunk))
                if done():
                    break
        except Exception as exc:  # noqa: BLE001 - raised again by _raise_named, named
            _raise_named(exc, self._request)
        return b"".join(parts)

    async def aclose(self) -> None:
        gate, self._gate = self._gate, None
        if gate is None:
            return
        try:  # read to the end: the connection is kept alive; else it is closed
            await self._response.__aexit__(None, None, None)
        except Exception as exc:  # noqa: BLE001 - raised again by _raise_named, named
            _raise_named(exc, self._request)
        finally:
            gate.release()


class AiohttpTransport(httpx.AsyncBaseTransport):
    """aiohttp's pool under httpx's types, with the admission gate before it.

    What httpx-aiohttp's transport does, without its per-call costs (a URL
    parsed twice, a timeout object and a header conversion each call, a
    generator per layer): the URL is handed over as httpx encoded it (so the
    path sent is the path signed, for SigV4), the request's timeouts are the
    socket waits, and aiohttp's faults are named as on every other transport.
    """

    def __init__(
        self,
        verify: ssl.SSLContext | str | bool,
        cert: Any,
        trust_env: bool,
        limits: httpx.Limits,
        proxy: httpx.Proxy | None,
    ) -> None:
        import aiohttp
        import yarl

        self._make = _aiohttp_session(verify, cert, trust_env, limits)
        self._session: aiohttp.ClientSession | None = None
        self._closed = False  # once closed, no new session: a late request is refused
        self._yarl = yarl.URL
        self._timeout = aiohttp.ClientTimeout
        self._timeouts: dict[tuple[float | None, ...], aiohttp.ClientTimeout] = {}
        self._urls: dict[str, yarl.URL] = {}
        self.gate = AdmissionGate(limits.max_connections or MAX_CONNECTIONS)
        self._proxy: dict[str, Any] = {}
        if proxy is not None:
            self._proxy = {
                "proxy": str(proxy.url),
                "proxy_auth": aiohttp.BasicAuth(*proxy.auth) if proxy.auth else None,
                "proxy_headers": dict(proxy.headers) if proxy.headers else None,
            }

    def _url(self, request: httpx.Request) -> Any:
        text = (request.fluid_url if is_own_request(request) else None) or str(request.url)
        found = self._urls.get(text)
        if found is None:
            if len(self._urls) >= _URLS_KEPT:
                self._urls.clear()
            found = self._urls[text] = self._yarl(text, encoded=True)
        return found

    def _timeouts_of(self, timeouts: Mapping[str, float | None]) -> Any:
        key = (timeouts.get("connect"), timeouts.get("read"), timeouts.get("pool"))
        found = self._timeouts.get(key)
        if found is None:
            if len(self._timeouts) >= _URLS_KEPT:
                self._timeouts.clear()
            found = self._timeouts[key] = self._timeout(
                sock_connect=key[0], sock_read=key[1], connect=key[2]
            )
        return found

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """The answer's head, its body left to stream; every answer and every fault of
        its own names ``request`` (so :meth:`PooledAsyncClient.fluid_send` need not)."""
        gate = self.gate
        if not gate.try_acquire():  # a free slot: no clock read on the fast path
            try:
                await _wait_in_line(gate, request)
            except httpx.RequestError as exc:
                exc.request = request
                raise
        timeouts: dict[str, float | None] = request.extensions.get("timeout", {})
        try:
            session = self._session
            if session is None:
                if self._closed:  # a call that waited for a slot while the client closed
                    raise _closed()
                session = self._session = self._make()
            try:
                content: Any = request.content or None
            except httpx.RequestNotRead:  # a streamed body: aiohttp frames it
                content = request.stream
                request.headers.pop("transfer-encoding", None)
            fields = request.fluid_fields if is_own_request(request) else None  # unread
            response = await session.request(
                request.method,
                self._url(request),
                headers=request.headers.multi_items() if fields is None else fields,
                data=content,
                allow_redirects=False,
                auto_decompress=False,
                compress=False,
                timeout=self._timeouts_of(timeouts),
                server_hostname=request.extensions.get("sni_hostname"),
                **self._proxy,
            )
        except BaseException as exc:
            gate.release()
            if isinstance(exc, Exception):
                _raise_named(exc, request)
            raise
        extensions = {"http_version": b"HTTP/1.1"}
        if response.reason:
            extensions["reason_phrase"] = response.reason.encode()
        return httpx.Response(
            status_code=response.status,
            headers=response.raw_headers,
            stream=_AiohttpStream(response, request, gate),
            request=request,
            extensions=extensions,
        )

    async def aclose(self) -> None:
        self._closed = True
        session, self._session = self._session, None
        if session is not None:
            await session.close()


def _gated(inner: httpx.AsyncBaseTransport, limits: httpx.Limits) -> httpx.AsyncBaseTransport:
    slots = limits.max_connections
    return inner if slots is None else GatedTransport(inner, AdmissionGate(slots))


# -- proxies from the environment, routed without httpx's private API ----------------------


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
            if len(self._cache) >= _URLS_KEPT:
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


#: Parsed URLs (and routes) a pool keeps (one or two endpoints a client, in practice).
_URLS_KEPT: Final = 64


class _Direct(OwnPool):
    """The call path's requests on a pool of ours, without the client layers it never uses.

    ``httpx.Client.send`` runs an auth flow, a redirect loop, the cookie jar
    (a ``urllib`` request per answer) and event hooks around the transport:
    about 60 us a call, more than all of fluid_build's own work
    (docs/benchmarks.md). A pool made here has no auth, hooks or cookies and
    follows no redirect, and it made its transports itself (the direct one and
    one per proxy of the environment), so its requests go straight to the one
    :class:`Routes` picks and are otherwise the same: the pool's default headers,
    the body httpx 0.28 would encode, the timeouts. Only httpx's public API is
    used. A pool a caller passes in (``http_client=``) keeps httpx's whole
    path, its auth, hooks and cookies with it (never its redirects).
    """

    headers: httpx.Headers
    _fluid_urls: dict[str, _Target]
    _fluid_defaults: dict[str, str]
    _fluid_route: Routes[Any]

    def _mounted(
        self, make: Callable[[httpx.Proxy | None], Any], trust_env: bool, transport: Any
    ) -> dict[str, Any]:
        """What httpx's client takes to route as :class:`Routes` does: the transports
        ``make`` makes (the direct one, one per proxy of the environment), no redirects.
        A ``transport`` given (a mock, say) carries everything, as in httpx."""
        mounts: dict[str, Any]
        if transport is not None:
            default, mounts = transport, {}
        else:
            default, mounts = env_mounts(make, trust_env)
        self._fluid_route = Routes(default, mounts)
        return {
            "transport": default,
            "mounts": mounts,
            "trust_env": trust_env,
            "follow_redirects": False,
        }

    def _direct_init(self) -> None:
        self._fluid_urls = {}
        self._fluid_defaults = {
            **{name.lower(): value for name, value in self.headers.items()},
            "accept-encoding": ACCEPT_ENCODING,
            "content-type": "application/json",
        }

    def fluid_json_request(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        payload: Any,
        timeout: float | Mapping[str, float],
    ) -> httpx.Request:
        """The request ``build_request(..., json=payload)`` would make, in a third of its time.

        The body is encoded as httpx 0.28 encodes ``json=``; only encodings the
        size limit can count as they inflate are accepted (call/wire.py).
        """
        target = self._fluid_urls.get(url)
        if target is None:
            if len(self._fluid_urls) >= _URLS_KEPT:
                self._fluid_urls.clear()
            target = self._fluid_urls[url] = _Target(httpx.URL(url))
        merged = self._fluid_defaults.copy()
        for name, value in headers.items():
            merged[name.lower()] = value
        body = _JSON.encode(payload).encode()
        # The headers httpx would send, in its order (Host first, Content-Length last),
        # made once: ``content=`` would build them twice and encode the body again.
        fields = list(merged.items())
        if "host" not in merged and target.host is not None:
            fields.insert(0, target.host)
        if "content-length" not in merged and "transfer-encoding" not in merged:
            fields.append(("Content-Length", str(len(body))))
        timeouts = (  # a mapping: the phases' own, made for this request (call/phases.py)
            timeout
            if isinstance(timeout, dict)
            else {"connect": timeout, "read": timeout, "write": timeout, "pool": timeout}
            if isinstance(timeout, float | int)
            else dict(timeout)
        )
        return _JsonRequest(method.upper(), target, fields, body, {"timeout": timeouts})


#: How httpx 0.28 encodes ``json=`` (one encoder kept: ``json.dumps`` with arguments makes
#: a new one each call).
_JSON: Final = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


class _Target:
    """A URL a direct pool sends to, parsed once: httpx's URL, its text as httpx encodes
    it (what is sent, and signed), and the ``Host`` field httpx would add."""

    __slots__ = ("host", "text", "url")

    def __init__(self, url: httpx.URL) -> None:
        self.url = url
        self.text = str(url)
        self.host = ("Host", url.netloc.decode("ascii")) if url.host else None


class _JsonRequest(OwnRequest, httpx.Request):
    """The request :meth:`_Direct.fluid_json_request` makes: an ``httpx.Request`` in every
    way, whose ``headers`` are made from its header fields only when something asks.

    The aiohttp transport sends :attr:`fluid_fields` as they are (no ``Headers`` built,
    no ``multi_items()`` back) to :attr:`fluid_url` (the URL's text, made once a pool).
    Once ``headers`` has been read it may be changed, so from then on the fields are
    forgotten and ``headers`` is what is sent; setting ``url`` forgets the text. Only
    httpx's public attributes are set, and its body methods answer from the body kept.
    """

    fluid_fields: list[tuple[str, str]] | None
    fluid_url: str | None

    def __init__(
        self,
        method: str,
        target: _Target,
        fields: list[tuple[str, str]],
        body: bytes,
        extensions: dict[str, Any],
    ) -> None:
        # Not httpx's __init__: it would build the headers and the body's stream at once.
        # (No ``__dict__`` touched either: CPython then keeps the attributes in the object.)
        self.method = method
        self._fluid_target = target.url
        self.fluid_url = target.text
        self.extensions = extensions
        self.fluid_fields = fields
        self._fluid_headers: httpx.Headers | None = None
        self._fluid_body = body
        self._fluid_stream: httpx.SyncByteStream | httpx.AsyncByteStream | None = None

    @property
    def headers(self) -> httpx.Headers:
        made = self._fluid_headers
        if made is None:
            made = self._fluid_headers = httpx.Headers(self.fluid_fields)
            self.fluid_fields = None
        return made

    @headers.setter
    def headers(self, value: httpx.Headers | Mapping[str, str]) -> None:
        self._fluid_headers = value if isinstance(value, httpx.Headers) else httpx.Headers(value)
        self.fluid_fields = None

    @property
    def url(self) -> httpx.URL:
        return self._fluid_target

    @url.setter
    def url(self, value: httpx.URL) -> None:
        self._fluid_target = value
        self.fluid_url = None

    @property
    def stream(self) -> httpx.SyncByteStream | httpx.AsyncByteStream:
        made = self._fluid_stream
        if made is None:
            made = self._fluid_stream = httpx.ByteStream(self._fluid_body)
        return made

    @stream.setter
    def stream(self, value: httpx.SyncByteStream | httpx.AsyncByteStream) -> None:
        self._fluid_stream = value

    @property
    def content(self) -> bytes:
        return self._fluid_body

    def read(self) -> bytes:
        return self._fluid_body

    async def aread(self) -> bytes:
        return self._fluid_body


def _routing_mocked(cls: type[Any]) -> bool:
    """Whether a test double (respx's ``using="httpx"`` mocker) stands in for httpx's own
    choice of transport: then a pool of ours sends through ``send``, so the double sees
    the request. Only looked at, never relied on: without the name, nothing is mocked."""
    method = cls.__dict__.get("_transport_for_url")
    return method is not None and not (getattr(method, "__module__", "") or "").startswith("httpx.")


def _closed() -> RuntimeError:
    return RuntimeError("Cannot send a request, as the client has been closed.")


class PooledClient(_Direct, httpx.Client):
    """The sync pool: ``httpx.Client`` over :class:`CoreTransport` (one per proxy of the
    environment too), whose call-path requests go straight to the transport."""

    def __init__(
        self,
        *,
        timeout: httpx.Timeout | float = 5.0,
        limits: httpx.Limits | None = None,
        verify: ssl.SSLContext | str | bool = True,
        cert: Any = None,
        trust_env: bool = True,
        headers: Mapping[str, str] | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        limits = limits or pool_limits()

        def make(proxy: httpx.Proxy | None) -> httpx.BaseTransport:
            return CoreTransport(
                verify=verify, cert=cert, trust_env=trust_env, limits=limits, proxy=proxy
            )

        super().__init__(
            timeout=timeout, headers=headers, **self._mounted(make, trust_env, transport)
        )
        self._direct_init()

    def fluid_send(self, request: httpx.Request) -> httpx.Response:
        """The answer's head, its body left to stream; as ``send(request, stream=True)``."""
        if self.is_closed:
            raise _closed()
        if _routing_mocked(httpx.Client):
            return self.send(request, stream=True)
        transport: httpx.BaseTransport = self._fluid_route(request.url)
        try:
            response = transport.handle_request(request)
        except httpx.RequestError as exc:
            exc.request = request
            raise
        response.request = request
        return response


class PooledAsyncClient(_Direct, httpx.AsyncClient):
    """``httpx.AsyncClient`` over httpx's or aiohttp's pool (one per proxy of the
    environment too), with a gate before each; made from httpx's public API."""

    def __init__(
        self,
        *,
        transport_name: Transport = "httpx",
        timeout: httpx.Timeout | float = 5.0,
        limits: httpx.Limits | None = None,
        verify: ssl.SSLContext | str | bool = True,
        cert: Any = None,
        trust_env: bool = True,
        headers: Mapping[str, str] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.transport_name: Transport = transport_name
        limits = limits or pool_limits()

        def make(proxy: httpx.Proxy | None) -> httpx.AsyncBaseTransport:
            if transport_name == "aiohttp":  # the gate is its own
                return AiohttpTransport(verify, cert, trust_env, limits, proxy)
            inner = httpx.AsyncHTTPTransport(
                verify=verify, cert=cert, trust_env=trust_env, limits=limits, proxy=proxy
            )
            return _gated(inner, limits)

        super().__init__(
            timeout=timeout, headers=headers, **self._mounted(make, trust_env, transport)
        )
        self._direct_init()

    def fluid_send(self, request: httpx.Request) -> Awaitable[httpx.Response]:
        """:meth:`PooledClient.fluid_send`, to be awaited: our aiohttp transport's own
        coroutine (one frame fewer for each call in flight), else one that names the
        request on the answer and on the faults, as ``send`` does."""
        if self.is_closed:
            raise _closed()
        if _routing_mocked(httpx.AsyncClient):
            return self.send(request, stream=True)
        transport: httpx.AsyncBaseTransport = self._fluid_route(request.url)
        if type(transport) is AiohttpTransport:
            return transport.handle_async_request(request)
        return self._fluid_sent(transport, request)

    async def _fluid_sent(
        self, transport: httpx.AsyncBaseTransport, request: httpx.Request
    ) -> httpx.Response:
        try:
            response = await transport.handle_async_request(request)
        except httpx.RequestError as exc:
            exc.request = request
            raise
        response.request = request
        return response


_Pool = TypeVar("_Pool", httpx.Client, httpx.AsyncClient)


def _made(make: Callable[[], _Pool], provider: str | None) -> _Pool:
    """``make()``, or a typed error naming the proxy or certificate variable at fault.

    httpx reads ``HTTPS_PROXY``, ``ALL_PROXY``, ``SSL_CERT_FILE``... when the
    pool is made; an unusable value (an unknown proxy scheme, SOCKS without
    ``socksio``, a missing or empty certificate file) would otherwise escape as
    a bare ValueError, ImportError or OSError at the first call.
    """
    try:
        return make()
    except Exception as exc:  # noqa: BLE001 - whatever httpx or ssl raise, typed here
        found = [name for name in _POOL_VARS if os.environ.get(name)]
        shown = ", ".join(f"{name}={redact_url(os.environ[name])[:120]!r}" for name in found)
        reason = truncate(one_line(redact(str(exc))), 200)
        raise _not_configured(
            f"the HTTP connection pool cannot be made from this environment "
            f"({type(exc).__name__}: {reason}); "
            + (f"check {shown}" if shown else "check the proxy and certificate variables")
            + " (e.g. HTTPS_PROXY=http://proxy.internal:3128; SOCKS needs httpx[socks])",
            provider,
            variable=found[0] if found else None,
            variables=found,
        ) from None


def build_client(
    timeout: float,
    provider: str | None,
    env: Mapping[str, str] | None = None,
    *,
    max_connections: int | None = None,
) -> httpx.Client:
    """The sync pool: httpx, every connection kept alive (threads wait in httpx's own pool).

    ``max_connections`` (else ``FLUID_LLM_MAX_CONNECTIONS`` in ``env``, default
    ``os.environ``) caps it; uncapped, it opens as many as there are calls in
    flight (:func:`connection_ceiling`).
    """
    limits = pool_limits(max_connections_choice(env, max_connections, provider=provider))
    return _made(lambda: PooledClient(timeout=httpx.Timeout(timeout), limits=limits), provider)


def build_async_client(
    timeout: float,
    provider: str | None,
    env: Mapping[str, str] | None = None,
    *,
    transport: str | None = None,
    max_connections: int | None = None,
    limits: httpx.Limits | None = None,
) -> httpx.AsyncClient:
    """The async pool: the chosen transport, every connection kept alive, a FIFO gate before it.

    ``env`` (default ``os.environ``) is where ``FLUID_LLM_TRANSPORT`` and
    ``FLUID_LLM_MAX_CONNECTIONS`` are read; ``transport=`` and ``max_connections=``
    override them (``limits=``: the whole of httpx's limits, for tests).
    """
    name = transport_choice(env, transport, provider=provider)
    if limits is None:
        limits = pool_limits(max_connections_choice(env, max_connections, provider=provider))
    chosen = limits
    return _made(
        lambda: PooledAsyncClient(
            transport_name=name, timeout=httpx.Timeout(timeout), limits=chosen
        ),
        provider,
    )


if TYPE_CHECKING:
    # Each marked class held to its seam (call/seams.py): renaming a member on either
    # side fails mypy here.
    _SYNC_POOL: type[SyncPool] = PooledClient
    _ASYNC_POOL: type[AsyncPool] = PooledAsyncClient
    _BODY: type[DirectBody] = _AiohttpStream
    _REQUEST: type[FieldRequest] = _JsonRequest
