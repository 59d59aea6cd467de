"""One async pool per event loop, and each closed in its own loop however that loop ends.

An ``httpx.AsyncClient`` (and the aiohttp session under it) belongs to the loop it
first ran in. :class:`LoopPools` gives each loop a client of its own and closes it in
that loop: at the loop's shutdown (the end of ``asyncio.run``), when the loop is
closed by hand (``loop.close()`` with no ``asyncio.run``), by ``aclose()`` in it or
``close()`` from anywhere, or when its owner is collected unclosed (or at exit)
while the loop is still open. docs/transports.md, "Any thread, any event loop,
closed silently", states the promise; tests/test_conformance.py's ``close-silently-*``
and ``second-event-loop`` scenarios and tests/test_direct_pool.py show it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Final

import httpx

__all__ = ["LoopPools"]


async def _closer(pool: httpx.AsyncClient, forget: Callable[[], None]) -> AsyncIterator[None]:
    """Started and left waiting in its loop; the loop closes it as it shuts down (asyncio
    shuts down every async generator it started at the end of ``asyncio.run``), which
    closes ``pool`` while the loop can still run its cleanup."""
    try:
        yield
    finally:
        forget()
        with contextlib.suppress(Exception):
            await pool.aclose()


def _started(closer: AsyncIterator[None]) -> None:
    """Run ``closer`` to its ``yield`` without awaiting: it awaits nothing before it, and
    asking for its first item is what registers it with the running loop."""
    step = closer.__anext__()
    try:
        step.send(None)  # type: ignore[attr-defined]
    except StopIteration:
        return
    raise AssertionError("a closer awaited before its yield")


#: The longest a pool's closing may hold a loop that is being closed (an idle connection
#: closes at once; a TLS one may wait for its peer's close_notify).
_CLOSE_BOUND: Final = 5.0


async def _bounded(ending: Awaitable[Any]) -> None:
    async with asyncio.timeout(_CLOSE_BOUND):
        await ending


class _CloseFirst:
    """Set as an event loop's own ``close`` (on the instance, where the loop allows one):
    the pools made on the loop are closed in it first, while it can still run their
    cleanup, then the loop's own ``close`` runs and this is taken off again.

    ``asyncio.run`` and ``asyncio.Runner`` shut down the loop's async generators before
    closing it, which closes each pool (:func:`_closer`); a loop closed by hand
    (``loop.run_until_complete(...)`` then ``loop.close()``) does not, and without
    this its pools would be left to the collector, and aiohttp would print
    "Unclosed client session" for each (issue 32 item 14).
    """

    __slots__ = ("__weakref__", "loop", "owners", "previous")

    def __init__(self, loop: asyncio.AbstractEventLoop, previous: Any) -> None:
        self.loop = weakref.ref(loop)
        self.previous = previous  # a ``close`` set on the instance before ours (None: none)
        self.owners: weakref.WeakSet[LoopPools] = weakref.WeakSet()

    def __call__(self) -> None:
        loop = self.loop()
        if loop is None:
            return
        if loop.is_running():  # the loop's own close refuses; nothing is ours to undo
            type(loop).close(loop)
            return
        own = vars(loop)
        if own.get("close") is self:
            if self.previous is None:
                del own["close"]
            else:
                own["close"] = self.previous
        if not loop.is_closed():
            for owner in list(self.owners):
                owner.close_in(loop)
        if self.previous is not None:
            self.previous()
        else:
            type(loop).close(loop)

    @classmethod
    def install(cls, loop: asyncio.AbstractEventLoop, owner: LoopPools) -> None:
        """Have ``owner``'s pool of ``loop`` closed when ``loop`` closes (once per loop)."""
        try:
            own = vars(loop)
        except TypeError:  # a loop without instance attributes: closed by its shutdown only
            return
        hook = own.get("close")
        if not isinstance(hook, cls):
            hook = own["close"] = cls(loop, hook)
        hook.owners.add(owner)


#: A pool and its closer (None: made outside any loop), by the loop it belongs to.
_Kept = dict[asyncio.AbstractEventLoop | None, tuple[httpx.AsyncClient, AsyncIterator[None] | None]]


def _forgetting(
    owner: weakref.ref[LoopPools], loop: asyncio.AbstractEventLoop, pool: httpx.AsyncClient
) -> Callable[[], None]:
    """What a closer calls as it ends: ``owner`` forgets ``pool`` (if ``owner`` still lives)."""

    def forget() -> None:
        pools = owner()
        if pools is not None:
            pools._forget(loop, pool)

    return forget


def _close_left(pools: _Kept) -> None:
    """The pools a collected :class:`LoopPools` left (or left at exit): each closed in its
    loop, where that loop can still run here (not closed, not running, and no loop running
    in this thread), within :data:`_CLOSE_BOUND`; the others are left as they are."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        return  # no loop can be run from inside another
    for loop, (pool, closer) in list(pools.items()):
        if loop is None or loop.is_closed() or loop.is_running():
            continue
        ending = _bounded(closer.aclose() if closer is not None else pool.aclose())  # type: ignore[attr-defined]
        try:
            loop.run_until_complete(ending)
        except Exception:  # noqa: BLE001 - a pool that cannot close now is left, never raised
            ending.close()
    pools.clear()


class LoopPools:
    """An async pool for each event loop a client is used in, made there on first use.

    An ``httpx.AsyncClient`` (and the aiohttp session under it) belongs to the loop
    it first ran in; used from another it fails ("Event loop is closed") for good.
    Here each loop gets its own, closed when that loop shuts down (the end of
    ``asyncio.run``) or is closed by hand (``loop.close()``, see :class:`_CloseFirst`),
    by :meth:`aclose` in it, or by :meth:`close` from anywhere, with no "Unclosed
    client session" left behind. Threads each running their own loop share the
    client safely.
    """

    def __init__(self, make: Callable[[], httpx.AsyncClient]) -> None:
        self._make = make
        self._pools: _Kept = {}
        self._lock = threading.Lock()
        self._closing: set[asyncio.Future[Any]] = set()
        # Collected (its client dropped unclosed) or left at exit with pools of loops that
        # were never closed: each is closed in its loop then, not left to aiohttp's warning.
        # Nothing kept here holds this object (the closers hold it weakly).
        weakref.finalize(self, _close_left, self._pools)

    def __len__(self) -> int:
        return len(self._pools)

    def get(self) -> httpx.AsyncClient:
        """The running loop's pool (made now if it has none)."""
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None  # made outside any loop: the caller closes it
        found = self._pools.get(loop)
        if found is not None:
            return found[0]
        with self._lock:
            found = self._pools.get(loop)
            if found is not None:
                return found[0]
            for other in [o for o in self._pools if o is not None and o.is_closed()]:
                del self._pools[other]  # its loop ended without shutting down: nothing to run
            pool = self._make()
            closer = None
            if loop is not None:
                closer = _closer(pool, _forgetting(weakref.ref(self), loop, pool))
                _started(closer)
                _CloseFirst.install(loop, self)
            self._pools[loop] = (pool, closer)
        return pool

    def close_in(self, loop: asyncio.AbstractEventLoop) -> None:
        """Close the pool of ``loop`` in it (``loop`` is not running: it is being closed),
        within :data:`_CLOSE_BOUND`; whatever goes wrong, it is forgotten."""
        with self._lock:
            found = self._pools.pop(loop, None)
        if found is None:
            return
        pool, closer = found
        ending = closer.aclose() if closer is not None else pool.aclose()  # type: ignore[attr-defined]
        with contextlib.suppress(Exception):
            loop.run_until_complete(_bounded(ending))

    def _forget(self, loop: asyncio.AbstractEventLoop | None, pool: httpx.AsyncClient) -> None:
        with self._lock:
            found = self._pools.get(loop)
            if found is not None and found[0] is pool:
                del self._pools[loop]

    async def aclose(self) -> None:
        """Close the running loop's pool now, and the others as :meth:`close` does."""
        loop = asyncio.get_running_loop()
        with self._lock:
            found = self._pools.pop(loop, None)
        if found is not None:
            pool, closer = found
            if closer is not None:
                await closer.aclose()  # type: ignore[attr-defined]
            else:
                await pool.aclose()
        self.close()

    def close(self) -> None:
        """Close every pool, each in its own loop: now if that loop is not running, else
        as a task there (this loop's), or from this thread (another thread's loop)."""
        with self._lock:
            found = list(self._pools.items())
            self._pools.clear()
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        for loop, (pool, closer) in found:
            ending = closer.aclose() if closer is not None else pool.aclose()  # type: ignore[attr-defined]
            if loop is None or loop.is_closed():
                ending.close()  # nothing can run it; its loop's shutdown closed the pool
            elif loop is running:
                task = loop.create_task(ending)
                self._closing.add(task)
                task.add_done_callback(self._closing.discard)
            elif loop.is_running():
                asyncio.run_coroutine_threadsafe(ending, loop)
            else:
                with contextlib.suppress(Exception):
                    loop.run_until_complete(ending)
