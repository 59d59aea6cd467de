"""Asking a local model server for its context size, once, within a short bound.

What to ask and how to read an answer is :mod:`fluid_build.copilot.llm.local_server`;
here is the asking: :func:`asking` is the one plan (each URL in turn, a
bounded GET, the first size found), and :func:`learn_window` /
:func:`alearn_window` are its sync and async shells. Each read is bounded: a
short timeout inside the call's deadline, a body of at most
:data:`~fluid_build.copilot.llm.local_server.MAX_PROBE_BYTES`, and any failure
(refused, timed out, 401, 404, not JSON, no size) means "unknown", never an error.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import Final, TypedDict

import httpx
from typing_extensions import Unpack

from fluid_build.copilot.call.drive import (
    END,
    Bytes,
    Close,
    Next,
    Plan,
    Pool,
    Pools,
    Send,
    arun,
    run,
)
from fluid_build.copilot.llm.local_server import MAX_PROBE_BYTES, PROBE_TIMEOUT, window_from

__all__ = ["ProbeOptions", "alearn_window", "asking", "learn_window"]

# A wrong or missing key: the next URL would say the same.
_STOP: Final = frozenset({401, 403})

# What one GET brought back: status, content-encoding and the body, or None when
# there was no answer (or one too big or too slow to read).
Answer = tuple[int, str | None, bytes] | None


def _headers(api_key: str | None, extra: Mapping[str, str]) -> dict[str, str]:
    # identity: a size limit on what arrives is then a limit on what is decoded.
    headers = {**extra, "accept": "application/json", "accept-encoding": "identity"}
    if api_key:
        headers["authorization"] = f"Bearer {api_key}"
    return headers


def _decoded(status: int, encoding: str | None, body: bytes) -> object:
    if status != 200 or encoding not in (None, "identity"):
        return None
    try:
        return json.loads(body)
    except (ValueError, RecursionError):  # not JSON, not UTF-8, or absurdly nested
        return None


def _get(
    pools: Pools, url: str, headers: dict[str, str], ends: float, clock: Callable[[], float]
) -> Plan[Answer]:
    """One bounded GET; any failure at all is no answer."""
    try:
        pool = yield Pool(pools)
        request = pool.build_request("GET", url, headers=headers, timeout=ends - clock())
        response: httpx.Response = yield Send(pool, request)
        try:
            status, encoding = response.status_code, response.headers.get("content-encoding")
            if status != 200 or encoding not in (None, "identity"):
                return status, encoding, b""  # only the status counts: the body is not read
            body = bytearray()
            chunks = yield Bytes(response)
            while (chunk := (yield Next(chunks))) is not END:
                body += chunk
                if len(body) > MAX_PROBE_BYTES or clock() > ends:
                    return None  # too big, or dripped: the read timeout is per chunk
            return status, encoding, bytes(body)
        finally:
            yield Close(response)
    except Exception:  # noqa: BLE001 - a probe that fails in any way only means "unknown"
        return None


def asking(
    pools: Pools,
    urls: tuple[str, ...],
    model: str,
    *,
    api_key: str | None = None,
    headers: Mapping[str, str] | None = None,
    deadline_left: float | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Plan[int | None]:
    """Ask ``urls`` in turn, all within :data:`PROBE_TIMEOUT` (and a quarter of what is left).

    Returns the first context size found, or None.
    """
    budget = PROBE_TIMEOUT if deadline_left is None else min(PROBE_TIMEOUT, deadline_left / 4)
    ends = clock() + budget
    sent = _headers(api_key, headers or {})
    for url in urls:
        if ends - clock() <= 0.01:
            return None
        answer = yield from _get(pools, url, sent, ends, clock)
        if answer is None:
            continue
        status, encoding, body = answer
        if status in _STOP:
            return None
        found = window_from(url, _decoded(status, encoding, body), model)
        if found is not None:
            return found
    return None


class ProbeOptions(TypedDict, total=False):
    """How to ask: the key (sent as a bearer token), extra headers, the call's time left."""

    api_key: str | None
    headers: Mapping[str, str] | None
    deadline_left: float | None


def learn_window(
    client: httpx.Client, urls: tuple[str, ...], model: str, **options: Unpack[ProbeOptions]
) -> int | None:
    """Ask ``urls`` in turn; the first context size found, or None. Never raises for I/O."""
    return run(asking(Pools(sync=lambda: client), urls, model, **options))


async def alearn_window(
    client: httpx.AsyncClient, urls: tuple[str, ...], model: str, **options: Unpack[ProbeOptions]
) -> int | None:
    """:func:`learn_window` in the async shell: the same plan."""
    return await arun(asking(Pools(async_=lambda: client), urls, model, **options))
