"""How large each pool is and which transport carries an async call, read from the environment.

httpx 0.28's default pool keeps 20 of its 100 connections alive, so at 100 or
more calls in flight it closes and reopens connections without end
(encode/httpcore#1035). Here every pool keeps all its connections alive
(:func:`pool_limits`) and opens as many as there are calls in flight, up to
:func:`connection_ceiling`, unless ``FLUID_LLM_MAX_CONNECTIONS`` (or
``max_connections=``) caps it (:func:`max_connections_choice`).

``FLUID_LLM_TRANSPORT`` (or ``transport=``) picks what sends the bytes of an
async call (:func:`transport_choice`): ``auto`` (the default), ``aiohttp`` or
``httpx``. ``auto`` is aiohttp, except while a test double stands in for
httpx's async transport (:func:`httpx_mocked`: respx, pytest-httpx,
``mock.patch``): then httpx, so that the double sees the calls.

A value these knobs cannot use, and a pool the proxy or certificate variables
make impossible (:func:`made_from_env`), is a typed ``llm.not_configured``
error naming the variable.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any, Final, Literal, TypeVar

import httpx

from fluid_build._redact import one_line, redact, redact_url, truncate
from fluid_build.copilot.agents.errors import ProviderError

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
    raise not_configured(
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


def not_configured(message: str, provider: str | None, **details: Any) -> ProviderError:
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
        raise not_configured(
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
        raise not_configured(
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


#: The most an answer's head may hold, on every transport: h11 (under httpx) reads a
#: head of up to 100 KiB; aiohttp is told the same for a line and a header field.
HEAD_LIMIT: Final = 100 * 1024
#: Parsed URLs (and routes) a pool keeps (one or two endpoints a client, in practice).
URLS_KEPT: Final = 64


_Pool = TypeVar("_Pool", httpx.Client, httpx.AsyncClient)


def made_from_env(make: Callable[[], _Pool], provider: str | None) -> _Pool:
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
        raise not_configured(
            f"the HTTP connection pool cannot be made from this environment "
            f"({type(exc).__name__}: {reason}); "
            + (f"check {shown}" if shown else "check the proxy and certificate variables")
            + " (e.g. HTTPS_PROXY=http://proxy.internal:3128; SOCKS needs httpx[socks])",
            provider,
            variable=found[0] if found else None,
            variables=found,
        ) from None
