"""Credential lookups that can block: off the event loop, one at a time, awaited within a deadline.

A cloud credential comes from a chain of sources, some of which wait on the
network or on another program: AWS's container endpoint, the instance
metadata service, SSO, ``credential_process``; Google's token endpoint and
metadata server. Neither botocore nor google-auth takes a deadline, and
neither can be interrupted. So a lookup runs in a daemon thread of its own
(:class:`Lookup`: at most one per credential source at a time, however many
calls are waiting for it), and each call waits for it no longer than its own
deadline (:func:`wait` and :func:`await_`): past it, the call ends with its
deadline's error while the lookup finishes on its own (bounded by the
library's timeouts) for the calls that come after. An event loop never waits
on it: the async shell awaits the lookup's future.

A credential that is more than a plain header is a :class:`RequestAuth`, in
the shape of ``httpx.Auth``: a step applied to the request once it is built,
its body already encoded (call/encode.py), so that what it covers (SigV4's
hash of the body and its path, llm/bedrock.py) is exactly what is sent on
every transport, and a bearer token (llm/vertex.py) is added last. An
adapter puts its step on each :class:`~fluid_build.copilot.llm.base.Request`
it builds (``auth``); the call (call/core.py) first runs the step's
:meth:`RequestAuth.pending` lookup, if any, off the event loop within its
deadline (call/drive.py, ``Blocking``), then builds the request on the pool
(call/prepare.py ``http_request``) and hands it to :meth:`RequestAuth.auth`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Protocol

from fluid_build._threads import wait_done

if TYPE_CHECKING:
    import httpx

__all__ = ["UNBOUNDED_WAIT", "Lookup", "Pending", "RequestAuth", "await_", "wait"]

#: Seconds a lookup's outcome is waited for when no call's deadline bounds it (a direct
#: ``adapter.request()``, outside a call): past it, the lookup is abandoned.
UNBOUNDED_WAIT: Final = 120.0


@dataclass(frozen=True, slots=True)
class Pending:
    """The step an adapter needs before its next request: ``start()`` begins (or joins) the
    lookup; ``what`` names it for the deadline's message ("AWS credentials")."""

    what: str
    start: Callable[[], concurrent.futures.Future[Any]]


class RequestAuth(Protocol):
    """A credential step: what an adapter adds to a built request, as ``httpx.Auth`` does.

    Its lookup (:meth:`pending`) runs first, off the event loop; :meth:`auth` then never
    waits on the network (outside a call, an ``adapter.request()`` alone, it may)."""

    def pending(self) -> Pending | None:
        """The lookup the next :meth:`auth` needs first, or None while the credential in
        hand is good."""
        ...

    def auth(self, request: httpx.Request) -> httpx.Request:
        """``request``, its body's bytes final, with the credential's headers added."""
        ...


class Lookup:
    """One credential source's lookups: at most one in flight, in a daemon thread."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._future: concurrent.futures.Future[Any] | None = None

    def start(self, fn: Callable[[], Any]) -> concurrent.futures.Future[Any]:
        """The lookup in flight, or a new one running ``fn``; its outcome is shared by all
        who wait for it. A finished lookup is never reused: each start after it looks anew."""
        with self._lock:
            future = self._future
            if future is None or future.done():
                future = concurrent.futures.Future()
                # Running from the start: a waiter that gives up can never cancel it for the
                # others (asyncio.wrap_future cancels what it wraps).
                future.set_running_or_notify_cancel()
                self._future = future
                thread = threading.Thread(
                    target=_run, args=(fn, future), name=f"fluid-{self.name}", daemon=True
                )
                thread.start()
            return future


def _run(fn: Callable[[], Any], future: concurrent.futures.Future[Any]) -> None:
    try:
        result = fn()
    except BaseException as exc:  # noqa: BLE001 - handed to every waiter, typed by them
        future.set_exception(exc)
    else:
        future.set_result(result)


def _outcome(future: concurrent.futures.Future[Any]) -> Any:
    error = future.exception(timeout=0)
    if error is not None:
        # Each waiter raises its own copy: one exception object raised in several threads
        # would gather all their tracebacks.
        raise _copied(error) from None
    return future.result(timeout=0)


def _copied(error: BaseException) -> BaseException:
    try:
        fresh = copy.copy(error)
    except Exception:  # noqa: BLE001 - an exception that does not copy is raised as it is
        return error
    fresh.__traceback__ = None
    return fresh


def wait(future: concurrent.futures.Future[Any], seconds: float) -> tuple[bool, Any]:
    """``(True, result)`` once the lookup ends within ``seconds`` (its error raised), else
    ``(False, None)``: the caller's deadline passed first."""
    if not wait_done(future, seconds):
        return False, None
    return True, _outcome(future)


async def await_(future: concurrent.futures.Future[Any], seconds: float) -> tuple[bool, Any]:
    """:func:`wait` for an event loop: the loop runs on while the lookup's thread works."""
    wrapped = asyncio.wrap_future(future)
    try:
        await asyncio.wait([wrapped], timeout=max(seconds, 0.0))
    finally:
        if not wrapped.done():
            # Nothing is kept for a loop that may close before the lookup ends (the lookup
            # itself runs on: it started RUNNING, so this cancels only the wrapper).
            wrapped.cancel()
        elif not wrapped.cancelled():
            wrapped.exception()  # read from ``future`` below: not "never retrieved"
    if not future.done():
        return False, None
    return True, _outcome(future)
