"""The pooled clients a call runs on, and the factories that make them from the environment.

:class:`PooledClient` (sync, over :class:`~fluid_build.copilot.call.transport.sync.CoreTransport`)
and :class:`PooledAsyncClient` (async, over aiohttp's pool or httpx's, a gate
before each) are ``httpx`` clients made from httpx's public API only, with one
transport per proxy of the environment. :func:`build_client` and
:func:`build_async_client` read the knobs (call/transport/config.py) and
turn a pool the environment cannot make into a typed error.
"""

from __future__ import annotations

import ssl
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, TypedDict, TypeVar

import httpx
from typing_extensions import Unpack

from fluid_build.copilot.call.transport.aio import AiohttpTransport
from fluid_build.copilot.call.transport.config import (
    Transport,
    made_from_env,
    max_connections_choice,
    pool_limits,
    transport_choice,
)
from fluid_build.copilot.call.transport.direct import DirectPool
from fluid_build.copilot.call.transport.faults import client_closed
from fluid_build.copilot.call.transport.gate import gated
from fluid_build.copilot.call.transport.sync import CoreTransport

if TYPE_CHECKING:
    from fluid_build.copilot.call.seams import AsyncPool, SyncPool


def _routing_mocked(cls: type[Any]) -> bool:
    """Whether a test double (respx's ``using="httpx"`` mocker) stands in for httpx's own
    choice of transport: then a pool of ours sends through ``send``, so the double sees
    the request. Only looked at, never relied on: without the name, nothing is mocked."""
    method = cls.__dict__.get("_transport_for_url")
    return method is not None and not (getattr(method, "__module__", "") or "").startswith("httpx.")


class PoolOptions(TypedDict, total=False):
    """What both pools take besides their transport, as httpx's clients take it; one left
    out is httpx's default (``limits``: :func:`pool_limits`, every connection kept alive)."""

    timeout: httpx.Timeout | float
    limits: httpx.Limits | None
    verify: ssl.SSLContext | str | bool
    cert: Any
    trust_env: bool
    headers: Mapping[str, str] | None


_Made = TypeVar("_Made", httpx.BaseTransport, httpx.AsyncBaseTransport)
#: What makes a pool's transport (the direct one, or one for a proxy of the environment)
#: from its ``verify``, ``cert``, ``trust_env``, ``limits`` and ``proxy``.
_Maker = Callable[[ssl.SSLContext | str | bool, Any, bool, httpx.Limits, httpx.Proxy | None], _Made]


def _client_arguments(
    pool: DirectPool, make: _Maker[_Made], transport: _Made | None, options: PoolOptions
) -> dict[str, Any]:
    """What httpx's client takes for ``pool``: ``options``, and the transports ``make``
    makes (``transport`` given, it carries everything, as in httpx)."""
    limits = options.get("limits") or pool_limits()
    verify = options.get("verify", True)
    cert = options.get("cert")
    trust_env = options.get("trust_env", True)

    def made(proxy: httpx.Proxy | None) -> _Made:
        return make(verify, cert, trust_env, limits, proxy)

    return {
        "timeout": options.get("timeout", 5.0),
        "headers": options.get("headers"),
        **pool._mounted(made, trust_env, transport),
    }


def _core_transport(
    verify: ssl.SSLContext | str | bool,
    cert: Any,
    trust_env: bool,
    limits: httpx.Limits,
    proxy: httpx.Proxy | None,
) -> httpx.BaseTransport:
    return CoreTransport(verify=verify, cert=cert, trust_env=trust_env, limits=limits, proxy=proxy)


def _gated_httpx_transport(
    verify: ssl.SSLContext | str | bool,
    cert: Any,
    trust_env: bool,
    limits: httpx.Limits,
    proxy: httpx.Proxy | None,
) -> httpx.AsyncBaseTransport:
    """httpx's own async pool, a gate before it (the aiohttp transport's gate is its own)."""
    inner = httpx.AsyncHTTPTransport(
        verify=verify, cert=cert, trust_env=trust_env, limits=limits, proxy=proxy
    )
    return gated(inner, limits)


class PooledClient(DirectPool, httpx.Client):
    """The sync pool: ``httpx.Client`` over :class:`CoreTransport` (one per proxy of the
    environment too), whose call-path requests go straight to the transport."""

    def __init__(
        self, *, transport: httpx.BaseTransport | None = None, **options: Unpack[PoolOptions]
    ) -> None:
        super().__init__(**_client_arguments(self, _core_transport, transport, options))
        self._direct_init()

    def fluid_send(self, request: httpx.Request) -> httpx.Response:
        """The answer's head, its body left to stream; as ``send(request, stream=True)``."""
        if self.is_closed:
            raise client_closed()
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


class PooledAsyncClient(DirectPool, httpx.AsyncClient):
    """``httpx.AsyncClient`` over httpx's or aiohttp's pool (one per proxy of the
    environment too), with a gate before each; made from httpx's public API."""

    def __init__(
        self,
        *,
        transport_name: Transport = "httpx",
        transport: httpx.AsyncBaseTransport | None = None,
        **options: Unpack[PoolOptions],
    ) -> None:
        self.transport_name: Transport = transport_name
        make = AiohttpTransport if transport_name == "aiohttp" else _gated_httpx_transport
        super().__init__(**_client_arguments(self, make, transport, options))
        self._direct_init()

    def fluid_send(self, request: httpx.Request) -> Awaitable[httpx.Response]:
        """:meth:`PooledClient.fluid_send`, to be awaited: our aiohttp transport's own
        coroutine (one frame fewer for each call in flight), else one that names the
        request on the answer and on the faults, as ``send`` does."""
        if self.is_closed:
            raise client_closed()
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
    return made_from_env(
        lambda: PooledClient(timeout=httpx.Timeout(timeout), limits=limits), provider
    )


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
    return made_from_env(
        lambda: PooledAsyncClient(
            transport_name=name, timeout=httpx.Timeout(timeout), limits=chosen
        ),
        provider,
    )


if TYPE_CHECKING:
    # Each pool held to its seam (call/seams.py): renaming a member on either side fails
    # mypy here.
    _SYNC_POOL: type[SyncPool] = PooledClient
    _ASYNC_POOL: type[AsyncPool] = PooledAsyncClient
