"""The connection pools under a call: which transport, how large, and a fair wait for a slot.

One module per role, as httpx's ``_transports/``:

- ``config``: pool sizing, the transport choice and the environment's knobs;
- ``faults``: httpcore's and aiohttp's faults named as httpx names them;
- ``gate``: the FIFO :class:`AdmissionGate` and :class:`GatedTransport`;
- ``sync``: :class:`CoreTransport`, httpcore on the call's deadline;
- ``aio``: :class:`AiohttpTransport`, aiohttp's pool under httpx's types;
- ``proxies``: :func:`env_proxies`, :class:`Routes`, :func:`env_mounts`;
- ``direct``: the JSON request built and sent without httpx's client layers;
- ``clients``: :class:`PooledClient`, :class:`PooledAsyncClient`,
  :func:`build_client`, :func:`build_async_client`.

(The per-loop async pools, :class:`LoopPools`, live in call/loops.py.)

Every pool here is made from httpx's and httpcore's public API: the
transports (the direct one and one per proxy of the environment) are made
here and routed here (:class:`Routes`), so nothing depends on how a given
httpx release builds a client. docs/transports.md states the contract that
every pool keeps, and tests/test_conformance.py proves it on each.
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
