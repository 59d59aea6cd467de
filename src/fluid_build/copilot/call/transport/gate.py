"""A fair wait for a pool's slot: the FIFO :class:`AdmissionGate` before each async pool.

httpcore's queue of waiting requests is matched against the connections in
O(connections x requests). In front of each async pool stands an
:class:`AdmissionGate`: a FIFO of calls waiting for one of the pool's slots,
each for at most its request's pool timeout (what is left of the call's
deadline). The pool itself then never queues, and 1,000 calls at once wait
their turn in order instead of ending in thousands of ``PoolTimeout``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncIterator, Mapping
from typing import cast

import httpx

from fluid_build.copilot.call.transport.faults import client_closed


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


async def wait_in_line(gate: AdmissionGate, request: httpx.Request) -> None:
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
            await wait_in_line(self.gate, request)
        try:
            if self.closed:  # admitted after the client closed: httpcore would open anew
                raise client_closed()
            response = await self.inner.handle_async_request(request)
        except BaseException:
            self.gate.release()
            raise
        response.stream = _Released(cast(httpx.AsyncByteStream, response.stream), self.gate)
        return response

    async def aclose(self) -> None:
        self.closed = True
        await self.inner.aclose()


def gated(inner: httpx.AsyncBaseTransport, limits: httpx.Limits) -> httpx.AsyncBaseTransport:
    slots = limits.max_connections
    return inner if slots is None else GatedTransport(inner, AdmissionGate(slots))
