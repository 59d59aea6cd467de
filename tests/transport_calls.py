"""One call through each way a client reaches the wire, for the per-provider transport tests.

tests/test_conformance.py holds the scenarios every transport must pass; a
provider's own test (tests/test_bedrock.py, test_vertex.py,
test_openai_responses.py) runs its answers and streams through
:func:`call_over` on each of :data:`TRANSPORTS`, with its own client.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx

from fluid_build.copilot.client import LLMClient

#: The sync direct pool, the async pools (httpx's, aiohttp's), a caller's sync and async pools.
TRANSPORTS = ["sync-direct", "async-httpx", "async-aiohttp", "caller-sync", "caller-async"]


def transport_env(transport: str) -> dict[str, str]:
    """The client's FLUID_LLM_TRANSPORT for ``transport``."""
    return {"FLUID_LLM_TRANSPORT": "aiohttp" if transport == "async-aiohttp" else "httpx"}


def call_over(transport: str, client: Callable[..., LLMClient], call: str) -> Any:
    """One call (``complete``, else ``stream``) of ``client(**http)`` through ``transport``:
    the answer, or the list of stream events."""
    if transport == "sync-direct":
        with client() as own:
            return own.complete("hi") if call == "complete" else list(own.stream("hi"))
    if transport == "caller-sync":
        with httpx.Client() as http:
            made = client(http_client=http)
            return made.complete("hi") if call == "complete" else list(made.stream("hi"))

    async def go() -> Any:
        if transport == "caller-async":
            async with httpx.AsyncClient() as http:
                made = client(async_http_client=http)
                if call == "complete":
                    return await made.acomplete("hi")
                return [event async for event in made.astream("hi")]
        async with client() as own:
            if call == "complete":
                return await own.acomplete("hi")
            return [event async for event in own.astream("hi")]

    return asyncio.run(go())
