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
async call: ``auto`` (the default), ``aiohttp`` (aiohttp's pool through
httpx-aiohttp: 6x httpx 0.28's calls per second at 1,000 in flight, see
docs/benchmarks.md "Async at 1,000 concurrent calls") or ``httpx``. ``auto``
is aiohttp, except while a test double stands in for httpx's async transport
(respx, pytest-httpx, ``mock.patch``): then httpx, so that the double sees the
calls. Sync calls always use httpx.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, Final, Literal, TypeVar, cast

import httpx

from fluid_build._redact import one_line, redact, redact_url, truncate
from fluid_build.copilot.agents.errors import ProviderError
from fluid_build.copilot.call.wire import ACCEPT_ENCODING

__all__ = [
    "MAX_CONNECTIONS",
    "POOL_LIMITS",
    "TRANSPORTS",
    "TRANSPORT_ENV",
    "AdmissionGate",
    "GatedTransport",
    "PooledAsyncClient",
    "PooledClient",
    "Transport",
    "build_async_client",
    "build_client",
    "httpx_mocked",
    "transport_choice",
]

Transport = Literal["httpx", "aiohttp"]
#: What FLUID_LLM_TRANSPORT may say; ``auto`` (or nothing) is resolved by :func:`transport_choice`.
TRANSPORTS: Final[tuple[str, ...]] = ("auto", "aiohttp", "httpx")
TRANSPORT_ENV: Final = "FLUID_LLM_TRANSPORT"

#: Connections per pool (per proxy, per client). More gave no more calls/s
#: against one server in docs/benchmarks.md; fewer sockets are kinder to it.
MAX_CONNECTIONS: Final = 100
#: All of them kept alive: an idle connection is never closed to make room.
POOL_LIMITS: Final = httpx.Limits(
    max_connections=MAX_CONNECTIONS, max_keepalive_connections=MAX_CONNECTIONS
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
_AIOHTTP_INSTALL: Final = "pip install aiohttp httpx-aiohttp (fluid-build depends on both)"


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
        import httpx_aiohttp  # noqa: F401
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


class GatedTransport(httpx.AsyncBaseTransport):
    """An async transport whose requests first pass ``gate``, held until the body is closed."""

    def __init__(self, inner: httpx.AsyncBaseTransport, gate: AdmissionGate) -> None:
        self.inner = inner
        self.gate = gate

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        timeouts: dict[str, float | None] = request.extensions.get("timeout", {})
        if not self.gate.try_acquire():  # a free slot: no clock read on the fast path
            started = time.monotonic()
            await self.gate.acquire(timeouts.get("pool"))
            if timeouts:
                request.extensions["timeout"] = _shortened(timeouts, time.monotonic() - started)
        try:
            response = await self.inner.handle_async_request(request)
        except BaseException:
            self.gate.release()
            raise
        response.stream = _Released(cast(httpx.AsyncByteStream, response.stream), self.gate)
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


class _AiohttpFaults(httpx.AsyncBaseTransport):
    """httpx-aiohttp's faults as httpx names them: its map calls every aiohttp connection
    error a ``ConnectTimeout``, a refused connection and a reset one alike; the error
    classes (and so the reason codes) must not depend on the transport."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner = inner

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        try:
            return await self.inner.handle_async_request(request)
        except httpx.ConnectTimeout as exc:
            cause = exc.__cause__
            if cause is None or isinstance(cause, TimeoutError):
                raise
            import aiohttp

            refused = isinstance(cause, aiohttp.ClientConnectorError)
            fault = httpx.ConnectError if refused else httpx.ReadError
            raise fault(str(exc), request=request) from cause

    async def aclose(self) -> None:
        await self.inner.aclose()


def _limits(kwargs: Mapping[str, Any]) -> httpx.Limits:
    limits = kwargs.get("limits")
    return limits if isinstance(limits, httpx.Limits) else POOL_LIMITS


def _gated(inner: httpx.AsyncBaseTransport, limits: httpx.Limits) -> httpx.AsyncBaseTransport:
    slots = limits.max_connections
    return inner if slots is None else GatedTransport(inner, AdmissionGate(slots))


#: Parsed URLs a pool keeps (one or two endpoints a client, in practice).
_URLS_KEPT: Final = 64


class _Direct:
    """The call path's requests on a pool of ours, without the client layers it never uses.

    ``httpx.Client.send`` runs an auth flow, a redirect loop, the cookie jar
    (a ``urllib`` request per answer) and event hooks around the transport:
    about 60 us a call, more than all of fluid_build's own work
    (docs/benchmarks.md). A pool made by :func:`build_client` or
    :func:`build_async_client` has no auth, hooks or cookies and follows no
    redirect, so its requests go straight to the transport httpx would pick
    (the direct pool, or a proxy's from the environment) and are otherwise the
    same: the pool's default headers, the body httpx 0.28 would encode, the
    timeouts. A pool a caller passes in (``http_client=``) keeps httpx's whole
    path, its auth, hooks and cookies with it.
    """

    headers: httpx.Headers
    _fluid_urls: dict[str, httpx.URL]
    _fluid_defaults: dict[str, str]

    def _direct_init(self) -> None:
        self._fluid_urls = {}
        self._fluid_defaults = {
            **{name.lower(): value for name, value in self.headers.items()},
            "accept-encoding": ACCEPT_ENCODING,
            "content-type": "application/json",
        }

    def fluid_json_request(
        self, method: str, url: str, headers: Mapping[str, str], payload: Any, timeout: float
    ) -> httpx.Request:
        """The request ``build_request(..., json=payload)`` would make, in a third of its time.

        The body is encoded as httpx 0.28 encodes ``json=``; only encodings the
        size limit can count as they inflate are accepted (call/wire.py).
        """
        parsed = self._fluid_urls.get(url)
        if parsed is None:
            if len(self._fluid_urls) >= _URLS_KEPT:
                self._fluid_urls.clear()
            parsed = self._fluid_urls[url] = httpx.URL(url)
        merged = self._fluid_defaults.copy()
        for name, value in headers.items():
            merged[name.lower()] = value
        body = json.dumps(payload, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        return httpx.Request(
            method,
            parsed,
            headers=merged,
            content=body.encode(),
            extensions={
                "timeout": {"connect": timeout, "read": timeout, "write": timeout, "pool": timeout}
            },
        )


def _closed() -> RuntimeError:
    return RuntimeError("Cannot send a request, as the client has been closed.")


class PooledClient(_Direct, httpx.Client):
    """The sync pool: ``httpx.Client`` whose call-path requests go straight to the transport."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._direct_init()

    def fluid_send(self, request: httpx.Request) -> httpx.Response:
        """The answer's head, its body left to stream; as ``send(request, stream=True)``."""
        if self.is_closed:
            raise _closed()
        transport = self._transport_for_url(request.url)
        try:
            response = transport.handle_request(request)
        except httpx.RequestError as exc:
            exc.request = request
            raise
        response.request = request
        return response


class PooledAsyncClient(_Direct, httpx.AsyncClient):
    """``httpx.AsyncClient`` with a gate before each pool, the direct one and each proxy's.

    It hooks the two methods httpx uses to make pools, as httpx-aiohttp does,
    so that proxies from the environment are honoured just as by httpx.
    """

    def __init__(self, *, transport_name: Transport = "httpx", **kwargs: Any) -> None:
        self.transport_name: Transport = transport_name
        super().__init__(**kwargs)
        self._direct_init()

    async def fluid_send(self, request: httpx.Request) -> httpx.Response:
        """:meth:`PooledClient.fluid_send`, awaited."""
        if self.is_closed:
            raise _closed()
        transport = self._transport_for_url(request.url)
        try:
            response = await transport.handle_async_request(request)
        except httpx.RequestError as exc:
            exc.request = request
            raise
        response.request = request
        return response

    def _init_transport(self, *args: Any, **kwargs: Any) -> httpx.AsyncBaseTransport:
        if kwargs.get("transport") is not None:
            return cast(httpx.AsyncBaseTransport, kwargs["transport"])
        limits = _limits(kwargs)
        if self.transport_name == "aiohttp":
            from httpx_aiohttp import AiohttpTransport

            inner: httpx.AsyncBaseTransport = _AiohttpFaults(
                AiohttpTransport(
                    verify=kwargs.get("verify", True),
                    cert=kwargs.get("cert"),
                    trust_env=kwargs.get("trust_env", True),
                    limits=limits,
                )
            )
        else:
            inner = super()._init_transport(*args, **kwargs)
        return _gated(inner, limits)

    def _init_proxy_transport(self, *args: Any, **kwargs: Any) -> httpx.AsyncBaseTransport:
        return _gated(super()._init_proxy_transport(*args, **kwargs), _limits(kwargs))


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
    timeout: float, provider: str | None, env: Mapping[str, str] | None = None
) -> httpx.Client:
    """The sync pool: httpx, every connection kept alive (threads wait in httpx's own pool).

    ``env`` is accepted for symmetry with :func:`build_async_client`; the
    transport variable concerns async calls only.
    """
    del env
    return _made(lambda: PooledClient(timeout=httpx.Timeout(timeout), limits=POOL_LIMITS), provider)


def build_async_client(
    timeout: float,
    provider: str | None,
    env: Mapping[str, str] | None = None,
    *,
    transport: str | None = None,
    limits: httpx.Limits = POOL_LIMITS,
) -> httpx.AsyncClient:
    """The async pool: the chosen transport, every connection kept alive, a FIFO gate before it.

    ``env`` (default ``os.environ``) is where ``FLUID_LLM_TRANSPORT`` is read;
    ``transport=`` overrides it.
    """
    name = transport_choice(env, transport, provider=provider)
    return _made(
        lambda: PooledAsyncClient(
            transport_name=name, timeout=httpx.Timeout(timeout), limits=limits
        ),
        provider,
    )
