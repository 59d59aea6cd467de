"""The connection pools under a call, and the transport contract every one of them keeps.

Five pools can carry a call: fluid's sync pool (``sync-direct``), its async
pools over aiohttp (``async-aiohttp``, the default) and over httpx's own
(``async-httpx``), and a caller's ``httpx.Client`` / ``httpx.AsyncClient``
(``caller-sync``, ``caller-async``). One call keeps the same promises whichever
pool carries it; where a transport cannot keep one, fluid keeps it above the
transport. This is the contract, written once; each clause names the modules
that keep it (``config``, ``faults`` ... are this package's modules).
docs/transports.md explains each clause to an operator whose call failed, and
tests/test_conformance.py proves every clause on every pool, from one scenario
list.

1. **One deadline.** One deadline (monotonic) covers connect, send, the
   answer's head and its body or stream; per-read timeouts are a floor, never
   the bound. Kept by ``sync`` (every socket wait of the sync pool cut to what
   the deadline and the attempt's phase leave), call/drive.py (the async send
   and each read under ``asyncio.timeout``; a caller's sync pool's head on a
   worker thread) and call/phases.py (the phase limits).
2. **Sizes count inflated bytes.** Through one bounded inflater, for every
   layer of every ``Content-Encoding`` chain; an encoding it cannot bound is
   refused; a stream line or event over its limit is refused; parsing is
   linear in the bytes read. Kept by call/wire.py, on a body every pool hands
   over raw (``aio``'s ``fluid_read``, httpx's ``iter_raw``) to a request
   asking for ``gzip, deflate`` only (``direct``; call/prepare.py on a
   caller's pool); an answer's head is held to
   :data:`HEAD_LIMIT` on every pool (``config``, told to aiohttp in ``aio``).
3. **No redirect is followed and no cookie is kept;** a 3xx is its own error.
   Kept by ``direct`` (fluid's pools send past httpx's redirect loop and
   cookie jar), ``aio`` (``allow_redirects=False``, a ``DummyCookieJar``) and
   call/drive.py (a caller's pool sent with ``follow_redirects=False``; the
   3xx as ``llm.bad_endpoint``).
4. **Proxies and TLS settings from the environment apply the same way.**
   Kept by ``proxies`` (the variables read as httpx reads them, one transport
   per proxy, each URL routed by httpx's rules), ``sync`` and ``aio`` (httpx's
   TLS context, handed to aiohttp too) and ``config`` (a value the pool cannot
   use is ``llm.not_configured`` naming the variable).
5. **Every failure maps to the same typed error** (code, retryable) on every
   transport. Kept by ``faults`` (httpcore's and aiohttp's exceptions named as
   httpx names them, at one boundary each), then one classifier
   (agents/error_classification.py).
6. **Nothing chained to an error carries a credential** (cause, context,
   attributes such as request headers). Kept by ``faults`` (aiohttp's
   exceptions, whose ``request_info`` holds the headers, never chained) and
   call/drive.py (a scrubbed stand-in as every error's cause).
7. **A client works from any thread and any event loop** (a pool per loop)
   **and closes silently however it is closed.** Kept by call/loops.py (a pool
   per loop, closed in its loop), ``sync`` (a close wakes a blocked read; no
   connection opens after it), ``gate`` and ``aio`` (a call admitted after the
   close is refused) and ``clients``.
8. **A private API of a dependency is used only behind a version fence,** a
   fallback to the public path, and CI on both ends of the allowed range.
   Kept by ``clients``, ``direct``, ``proxies`` and ``sync`` (every pool made
   from httpx's and httpcore's public API), call/wire.py (the one fenced fast
   path) and noxfile.py's ``transports`` session.

One module per role, as httpx's ``_transports/``, each importing only the
ones below it (tests/test_architecture.py):

- ``clients``: :class:`PooledClient`, :class:`PooledAsyncClient`,
  :func:`build_client`, :func:`build_async_client`;
- ``direct``: the JSON request built once and sent straight to a transport;
- ``proxies``: :func:`env_proxies`, :class:`Routes`, :func:`env_mounts`;
- ``aio``: :class:`AiohttpTransport`, aiohttp's pool under httpx's types;
- ``sync``: :class:`CoreTransport`, httpcore's pool on the call's deadline;
- ``gate``: the FIFO :class:`AdmissionGate` and :class:`GatedTransport`;
- ``faults``: each library's faults named as httpx's, at one boundary each;
- ``config``: pool sizes, the transport choice and the environment's knobs.

(The per-loop async pools, :class:`LoopPools`, live in call/loops.py.)
"""

from __future__ import annotations

from fluid_build.copilot.call.drive import CALL_ENDS
from fluid_build.copilot.call.loops import LoopPools
from fluid_build.copilot.call.transport.aio import AiohttpTransport
from fluid_build.copilot.call.transport.clients import (
    PooledAsyncClient,
    PooledClient,
    build_async_client,
    build_client,
)
from fluid_build.copilot.call.transport.config import (
    HEAD_LIMIT,
    KEEPALIVE_EXPIRY,
    MAX_CONNECTIONS,
    MAX_CONNECTIONS_ENV,
    TRANSPORT_ENV,
    TRANSPORTS,
    Transport,
    connection_ceiling,
    httpx_mocked,
    max_connections_choice,
    pool_limits,
    transport_choice,
)
from fluid_build.copilot.call.transport.gate import AdmissionGate, GatedTransport
from fluid_build.copilot.call.transport.proxies import Routes, env_mounts, env_proxies
from fluid_build.copilot.call.transport.sync import CoreTransport

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
