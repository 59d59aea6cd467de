"""The two shells that run a call's plan: one sync, one async, and nothing else in them.

A plan (see :mod:`fluid_build.copilot.call.core` and the envelope's
:meth:`~fluid_build.copilot.call.envelope.RetryEnvelope.plan`) is a generator
that never touches a socket or a clock: it yields an :class:`Effect` ("send
this request", "sleep this long", "read this body") and is sent back what
came of it, or has the exception thrown in. The shells only perform effects,
so the sync and async paths make the same decisions by construction.

A streaming plan also yields :class:`Emit`: an event for the caller. The
shells hand it over and resume the plan; a caller that stops early has its
``GeneratorExit`` thrown into the plan, whose cleanup still runs its effects.
"""

from __future__ import annotations

import asyncio
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Generator, Iterator
from concurrent.futures import CancelledError
from concurrent.futures import TimeoutError as Late
from contextvars import ContextVar, Token
from typing import Any, Final, Generic, TypeVar, cast

import httpx

from fluid_build._redact import is_credential_header, one_line, redact, redact_url, truncate
from fluid_build._threads import DaemonPool, hold, wait_done
from fluid_build.copilot.agents.errors import ProviderError
from fluid_build.copilot.call.phases import PHASE_EXTENSION, Phase
from fluid_build.copilot.call.seams import is_own_async_pool, is_own_body, is_own_sync_pool
from fluid_build.copilot.call.wire import Deadline, Limits, StreamReader, aread_body, read_body
from fluid_build.copilot.llm.base import (
    StreamState,
    aiter_frames,
    aiter_stream,
    iter_frames,
    iter_stream,
)
from fluid_build.copilot.llm.credentials import Pending, await_, wait
from fluid_build.copilot.llm.types import StreamEvent
from fluid_build.errors import FluidError

__all__ = [
    "CALL_ENDS",
    "CALL_PHASE",
    "DEADLINE_EXTENSION",
    "END",
    "Blocking",
    "Bytes",
    "Call",
    "Close",
    "Effect",
    "Emit",
    "Events",
    "Exchange",
    "Hold",
    "Next",
    "Plan",
    "Pool",
    "Pools",
    "ReadBody",
    "Send",
    "Sleep",
    "arun",
    "astream",
    "run",
    "sever",
    "stream",
]

T = TypeVar("T")
#: What a :class:`Next` gets back once the stream is over.
END: Final = object()


def _other_shell() -> Any:
    raise AssertionError("this plan's pool belongs to the other shell")


class Pools:
    """Where one entry's requests go: its sync and its async pool, each made on first use."""

    __slots__ = ("async_", "sync")

    def __init__(
        self,
        sync: Callable[[], httpx.Client] = _other_shell,
        async_: Callable[[], httpx.AsyncClient] = _other_shell,
    ) -> None:
        self.sync = sync
        self.async_ = async_


#: The request extension that carries the call's :class:`Deadline` (call/prepare.py sets it).
DEADLINE_EXTENSION: Final = "fluid.deadline"

#: When (on ``time.monotonic``) the call running in this context must end; None between
#: calls. The sync shell sets it around each piece of I/O, and the sync pool's sockets
#: wait no longer (call/transport/sync.py). The async shell bounds its awaits instead.
CALL_ENDS: Final[ContextVar[float | None]] = ContextVar("fluid_call_ends", default=None)
#: The attempt's :class:`~fluid_build.copilot.call.phases.Phase` while the sync shell does its
#: I/O: the sync pool's socket waits end when its next byte is due, too.
CALL_PHASE: Final[ContextVar[Phase | None]] = ContextVar("fluid_call_phase", default=None)


def _deadline(request: httpx.Request) -> Deadline | None:
    found = request.extensions.get(DEADLINE_EXTENSION)
    return found if isinstance(found, Deadline) else None


def _phase(request: httpx.Request | None) -> Phase | None:
    if request is None:
        return None
    found = request.extensions.get(PHASE_EXTENSION)
    return found if isinstance(found, Phase) else None


class _until:
    """Every socket wait of the sync pool inside here ends by ``deadline`` (None: no bound),
    and by when the attempt's ``phase`` wants its next byte.

    A class rather than a generator context manager: it wraps each sync attempt."""

    __slots__ = ("deadline", "phase", "token", "watch")

    def __init__(self, deadline: Deadline | None, phase: Phase | None = None) -> None:
        self.deadline = deadline
        self.phase = phase
        self.token: Token[float | None] | None = None
        self.watch: Token[Phase | None] | None = None

    def __enter__(self) -> None:
        if self.deadline is not None:
            self.token = CALL_ENDS.set(time.monotonic() + self.deadline.left())
        if self.phase is not None:
            self.watch = CALL_PHASE.set(self.phase)

    def __exit__(self, *exc: object) -> None:
        if self.token is not None:
            CALL_ENDS.reset(self.token)
        if self.watch is not None:
            CALL_PHASE.reset(self.watch)


def _past(request: httpx.Request | None) -> httpx.ReadTimeout:
    error = httpx.ReadTimeout("the call's deadline passed")
    if request is not None:
        error.request = request
    return error


_GRACE: Final = 0.05


def _bound(deadline: Deadline, phase: Phase | None) -> float:
    """Seconds the next wait may last: to the deadline (and a moment's grace: where the
    transport's own timeouts, cut to it, end the wait, their error says what was being
    waited for), or to when the phase wants its next byte, if sooner."""
    left = max(deadline.left(), 0.0) + _GRACE
    if phase is not None:
        due = phase.due()
        if due is not None:
            left = min(left, max(due - time.monotonic(), 0.0))
    return left


def _watched(phase: Phase | None, timer: Any, deadline: Deadline) -> None:
    """Let ``phase`` move ``timer`` on as bytes arrive (never past the deadline)."""
    if phase is not None:
        now = time.monotonic()
        phase.timer = timer
        phase.skew = asyncio.get_running_loop().time() - now
        phase.ceiling = now + max(deadline.left(), 0.0) + _GRACE


async def _within(
    deadline: Deadline | None, awaitable: Awaitable[T], phase: Phase | None = None
) -> T:
    """``await awaitable``, cancelled when ``deadline`` passes or the ``phase`` waited too
    long for its next byte (then httpx's ReadTimeout, which the plan names after the
    deadline or the phase). Whatever the transport, a server that drips its head or its
    body cannot hold an async call past its deadline."""
    if deadline is None:
        return await awaitable
    timer = asyncio.timeout(_bound(deadline, phase))
    try:
        async with timer:
            _watched(phase, timer, deadline)
            return await awaitable
    except TimeoutError:
        if timer.expired():
            raise _past(None) from None
        raise
    finally:
        if phase is not None:
            phase.timer = None


def _origin(location: str, base: httpx.URL) -> str:
    try:
        url = base.join(location)
        return redact_url(f"{url.scheme}://{url.netloc.decode('ascii', 'replace')}")
    except Exception:  # noqa: BLE001 - a Location that is no URL at all
        return truncate(one_line(redact(location)), 80)


def refuse_redirect(response: httpx.Response, *, close: bool = True) -> None:
    """A 3xx is its own error: no pool follows a redirect (the key would go with it).

    ``close=False``: the caller has closed the answer (the async shell, awaited)."""
    status = response.status_code
    if not 300 <= status < 400:
        return
    deadline = _deadline(response.request)
    provider = deadline.provider if deadline is not None else None
    model = deadline.model if deadline is not None else None
    location = response.headers.get("location")
    origin = _origin(location, response.request.url) if location else None
    where = f"to {origin}" if origin else "with no Location"
    if close:
        response.close()
    raise ProviderError(
        f"{provider or 'the provider'} answered HTTP {status}, a redirect {where}; fluid_build "
        "never follows one (the key would go with it): set the base URL to the endpoint "
        "that answers",
        provider=provider,
        model=model,
        status_code=status,
        code="llm.bad_endpoint",
        retryable=False,
        details={"location_origin": origin} if origin else {},
    )


async def _arefuse_redirect(response: httpx.Response) -> None:
    if 300 <= response.status_code < 400:
        await response.aclose()
        refuse_redirect(response, close=False)


def send(pool: httpx.Client, request: httpx.Request) -> httpx.Response:
    """The answer's head, its body left to stream: straight to the transport on a pool of
    ours (call/seams.py ``SyncPool``), through ``send`` on a caller's own pool,
    never following a redirect. The caller bounds it with :class:`_until`."""
    if is_own_sync_pool(pool):
        response = pool.fluid_send(request)
    else:
        deadline = _deadline(request)
        if deadline is None:
            response = pool.send(request, stream=True, follow_redirects=False)
        else:
            response = _head_within(pool, request, deadline)
            _body_reads(request, deadline)
    refuse_redirect(response)
    return response


def _body_reads(request: httpx.Request, deadline: Deadline) -> None:
    """On a caller's own sync pool, whose sockets fluid cannot narrow: each read of the body
    waits at most the idle limit (a stream: until its first byte, what is left of the first
    token's). httpx reads the request's timeouts when the body starts (its documented
    ``timeout`` extension), so they are set once the head is in."""
    phase = _phase(request)
    timeouts = request.extensions.get("timeout")
    if phase is None or not isinstance(timeouts, dict):
        return
    wait = phase.limits.idle
    due = phase.due()
    if phase.stream and due is not None:
        wait = max(wait, due - time.monotonic())
    request.extensions["timeout"] = {
        **timeouts,
        "read": max(min(wait, deadline.left()), 0.001),
    }


#: Daemon threads that wait for the heads of answers on callers' own sync pools.
_HEADS: Final = 32
_head_pool: DaemonPool | None = None
_head_lock = threading.Lock()


def _head_within(pool: httpx.Client, request: httpx.Request, deadline: Deadline) -> httpx.Response:
    """``pool.send(...)`` on a caller's own sync pool, given up at the deadline.

    Its sockets are the caller's: fluid cannot narrow their waits as it does its
    own pool's, and a server that drips its head would hold the call. So the head
    is awaited on a daemon thread for no longer than the deadline leaves; past it (or on
    Ctrl-C) the call ends, and the thread, replaced, closes the answer that comes later:
    a head that never comes holds neither a worker nor the process's exit."""
    global _head_pool
    if _head_pool is None:
        with _head_lock:
            if _head_pool is None:
                _head_pool = DaemonPool(_HEADS, "fluid-head")
    wait = _bound(deadline, _phase(request))
    sent = _head_pool.submit(
        lambda: pool.send(request, stream=True, follow_redirects=False), time.monotonic() + wait
    )
    try:
        if not wait_done(sent, wait):
            raise Late
        return cast(httpx.Response, sent.result(timeout=0))
    except BaseException as exc:
        if not sent.cancel():  # not still queued: sending, or done
            _head_pool.abandon(sent)
            sent.add_done_callback(_close_late)
        if isinstance(exc, Late | CancelledError):  # cancelled: still queued at the deadline
            raise _past(request) from None
        raise


def _close_late(sent: Any) -> None:
    if not sent.cancelled() and sent.exception() is None:
        sent.result().close()


async def asend(pool: httpx.AsyncClient, request: httpx.Request) -> httpx.Response:
    """:func:`send`, awaited; the caller bounds it with :func:`_within`."""
    if is_own_async_pool(pool):
        response = await pool.fluid_send(request)
    else:
        response = await pool.send(request, stream=True, follow_redirects=False)
    await _arefuse_redirect(response)
    return response


# -- what leaves the shells: no credential chained to it --------------------------------------


def _safe_request(request: httpx.Request) -> httpx.Request:
    """The request without its credentials: headers by name, the URL's userinfo and keys."""
    headers = [(k, v) for k, v in request.headers.items() if not is_credential_header(k)]
    return httpx.Request(request.method, redact_url(str(request.url)), headers=headers)


def _stand_in(exc: BaseException, depth: int = 0) -> BaseException | None:
    """What a fluid error may carry as its cause in place of ``exc``: the same class and
    (already redacted) text, without what a foreign exception holds (the request and
    its headers, aiohttp's ``request_info``, the raw head) and without a chain."""
    if isinstance(exc, FluidError):
        if depth < 3:
            sever(exc, depth + 1)
        return exc
    try:
        text = truncate(one_line(redact(str(exc))), 500)
    except Exception:  # noqa: BLE001 - a hostile __str__
        text = ""
    request = getattr(exc, "_request", None)  # httpx's own slot: reading it never raises
    safe = _safe_request(request) if isinstance(request, httpx.Request) else None
    if isinstance(exc, httpx.HTTPStatusError):
        asked = safe or httpx.Request("GET", "http://unknown.invalid")
        answer = httpx.Response(exc.response.status_code, request=asked)
        return httpx.HTTPStatusError(text, request=asked, response=answer)
    try:
        stand_in = type(exc)(text)
    except Exception:  # noqa: BLE001 - a class that wants other arguments
        stand_in = RuntimeError(f"{type(exc).__name__}: {text}")
    if safe is not None and isinstance(stand_in, httpx.RequestError):
        stand_in.request = safe
    return stand_in


def sever(error: FluidError, depth: int = 0) -> FluidError:
    """``error`` as it leaves the shells: its cause a stand-in (:func:`_stand_in`), its
    context dropped, so that nothing chained to it carries the key, whatever the
    transport put there (a request's headers, a head echoed in a message)."""
    cause = error.__cause__
    if cause is not None:
        error.__cause__ = _stand_in(cause, depth)
    error.__context__ = None
    error.__suppress_context__ = True
    return error


class Effect(ABC):
    """One piece of I/O a plan asks for; each shell performs it its own way."""

    __slots__ = ()

    @abstractmethod
    def run(self) -> Any:
        """Perform it in the sync shell."""

    @abstractmethod
    async def arun(self) -> Any:
        """Perform it in the async shell."""


class Pool(Effect):
    """The shell's connection pool, so that the plan can build requests on it."""

    __slots__ = ("pools",)

    def __init__(self, pools: Pools) -> None:
        self.pools = pools

    def run(self) -> httpx.Client:
        return self.pools.sync()

    async def arun(self) -> httpx.AsyncClient:
        return self.pools.async_()


class Sleep(Effect):
    """Wait, with the sleep each shell was given (tests inject theirs)."""

    __slots__ = ("asleep", "seconds", "sleep")

    def __init__(
        self,
        seconds: float,
        sleep: Callable[[float], None],
        asleep: Callable[[float], Awaitable[None]],
    ) -> None:
        self.seconds = seconds
        self.sleep = sleep
        self.asleep = asleep

    def run(self) -> None:
        self.sleep(self.seconds)

    async def arun(self) -> None:
        await self.asleep(self.seconds)


class Call(Effect):
    """A caller's own function: ``fn()`` in the sync shell, ``await fn()`` in the async one."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn

    def run(self) -> Any:
        return self.fn()

    async def arun(self) -> Any:
        return await self.fn()


class Blocking(Effect):
    """A credential lookup the next request needs (see :mod:`fluid_build.copilot.llm.credentials`):
    it runs in a thread of its own; the sync shell waits for it, the async one awaits it so
    its event loop runs on, and neither past the call's deadline."""

    __slots__ = ("deadline", "pending")

    def __init__(self, pending: Pending, deadline: Deadline) -> None:
        self.pending = pending
        self.deadline = deadline

    def run(self) -> object:
        done, result = wait(self.pending.start(), self.deadline.left())
        if not done:
            raise self.deadline.passed(self.pending.what)
        return result

    async def arun(self) -> object:
        done, result = await await_(self.pending.start(), self.deadline.left())
        if not done:
            raise self.deadline.passed(self.pending.what)
        return result


class Send(Effect):
    """Send a request on ``pool`` (the one it was built on, from :class:`Pool`); the answer's
    headers come back, its body still unread."""

    __slots__ = ("pool", "request")

    def __init__(self, pool: httpx.Client | httpx.AsyncClient, request: httpx.Request) -> None:
        self.pool = pool
        self.request = request

    def run(self) -> httpx.Response:
        phase = _phase(self.request)
        if phase is not None:
            phase.start()
        with _until(_deadline(self.request), phase):
            response = send(cast(httpx.Client, self.pool), self.request)
        if phase is not None:
            phase.headed()
        return response

    async def arun(self) -> httpx.Response:
        pool = cast(httpx.AsyncClient, self.pool)
        phase = _phase(self.request)
        if phase is not None:
            phase.start()
        response = await _within(_deadline(self.request), asend(pool, self.request), phase)
        if phase is not None:
            phase.headed()
        return response


class ReadBody(Effect):
    """Read a whole body within the deadline and the size limit (raises for an error status)."""

    __slots__ = ("deadline", "limits", "response")

    def __init__(self, response: httpx.Response, deadline: Deadline, limits: Limits) -> None:
        self.response = response
        self.deadline = deadline
        self.limits = limits

    def run(self) -> httpx.Response:
        with _until(self.deadline, _phase(self.response.request)):
            return read_body(self.response, self.deadline, self.limits)

    async def arun(self) -> httpx.Response:
        return await _within(
            self.deadline,
            aread_body(self.response, self.deadline, self.limits),
            _phase(self.response.request),
        )


class Exchange(Effect):
    """One whole attempt on the shell's pool: send, read the body within the deadline and the
    size limit (raises for an error status), close. One effect rather than three a call.

    ``where`` says which part a timeout cut short: the response headers, then the body.
    """

    __slots__ = ("deadline", "limits", "pool", "request", "where")

    def __init__(
        self,
        pool: httpx.Client | httpx.AsyncClient,
        request: httpx.Request,
        deadline: Deadline,
        limits: Limits,
    ) -> None:
        self.pool = pool
        self.request = request
        self.deadline = deadline
        self.limits = limits
        self.where = "the response headers"

    def run(self) -> httpx.Response:
        phase = _phase(self.request)
        if phase is not None:
            phase.start()
        with _until(self.deadline, phase):  # one bound on the head and the body
            response = send(cast(httpx.Client, self.pool), self.request)
            try:
                if phase is not None:
                    phase.headed()
                self.where = "the body"
                return read_body(response, self.deadline, self.limits)
            finally:
                response.close()

    async def arun(self) -> httpx.Response:
        # _within and asend written out: one coroutine for the attempt, not three (each
        # call in flight holds its chain of frames, which the collector walks).
        phase = _phase(self.request)
        if phase is not None:
            phase.start()
        timer = asyncio.timeout(_bound(self.deadline, phase))
        try:
            async with timer:
                _watched(phase, timer, self.deadline)
                pool = cast(httpx.AsyncClient, self.pool)
                if is_own_async_pool(pool):  # called at once: no bound method held
                    response = await pool.fluid_send(self.request)
                else:
                    response = await pool.send(self.request, stream=True, follow_redirects=False)
                try:
                    if phase is not None:
                        phase.headed()  # a whole answer: its body is due within the idle limit
                        if timer.when() is not None:
                            timer.reschedule(
                                asyncio.get_running_loop().time() + _bound(self.deadline, phase)
                            )
                    if 300 <= response.status_code < 400:
                        await response.aclose()
                        refuse_redirect(response, close=False)
                    self.where = "the body"
                    return await aread_body(response, self.deadline, self.limits)
                finally:
                    stream = response.stream
                    if is_own_body(stream) and not response.is_closed:
                        # Our aiohttp body (call/transport/aio.py) names its own faults: closed
                        # without httpx's wrapper around it.
                        response.is_closed = True
                        await stream.aclose()
                    else:
                        await response.aclose()
        except TimeoutError:
            if timer.expired():
                raise _past(None) from None
            raise
        finally:
            if phase is not None:
                phase.timer = None


class Close(Effect):
    __slots__ = ("response",)

    def __init__(self, response: httpx.Response) -> None:
        self.response = response

    def run(self) -> None:
        self.response.close()

    async def arun(self) -> None:
        await self.response.aclose()


class Events(Effect):
    """The counted ``(event, data)`` pairs of a stream, in the shell's kind of iterator."""

    __slots__ = ("reader", "state", "stream_format")

    def __init__(
        self, reader: StreamReader, stream_format: str, state: StreamState | None = None
    ) -> None:
        self.reader = reader
        self.stream_format = stream_format
        self.state = state  # marked done at SSE's [DONE]

    def run(self) -> Iterator[tuple[str, Any]]:
        reader = self.reader
        if self.stream_format == "eventstream":  # binary frames, not lines
            who = reader.reader.deadline
            chunks = iter_frames(
                reader.chunks(),
                reader.max_event_bytes,
                reader.event_too_large,
                who.provider,
                who.model,
            )
        else:
            chunks = iter_stream(self.stream_format, reader.lines(), self.state)
        phase = _phase(reader.response.request)
        return _until_each(reader.counted(chunks), reader.reader.deadline, phase)

    async def arun(self) -> AsyncIterator[tuple[str, Any]]:
        reader = self.reader
        if self.stream_format == "eventstream":
            who = reader.reader.deadline
            chunks = aiter_frames(
                reader.achunks(),
                reader.max_event_bytes,
                reader.event_too_large,
                who.provider,
                who.model,
            )
        else:
            chunks = aiter_stream(self.stream_format, reader.alines(), self.state)
        phase = _phase(reader.response.request)
        return _awithin_each(reader.acounted(chunks), reader.reader.deadline, phase)


def _until_each(items: Iterator[T], deadline: Deadline, phase: Phase | None) -> Iterator[T]:
    """``items``, each read within ``deadline`` and the phase's limits (the sync pool's
    sockets wait no longer)."""
    while True:
        with _until(deadline, phase):
            item = next(items, END)
        if item is END:
            return
        yield cast(T, item)


async def _awithin_each(
    items: AsyncIterator[T], deadline: Deadline, phase: Phase | None
) -> AsyncIterator[T]:
    """``items``, each awaited within ``deadline`` and the phase's limits."""
    while True:
        item = await _within(deadline, anext(items, END), phase)
        if item is END:
            return
        yield cast(T, item)


class Next(Effect):
    """The next item of what :class:`Events` (or a byte stream) gave, or :data:`END`."""

    __slots__ = ("items",)

    def __init__(self, items: Any) -> None:
        self.items = items

    def run(self) -> Any:
        return next(self.items, END)

    async def arun(self) -> Any:
        return await anext(self.items, END)


class Bytes(Effect):
    """The raw chunks of a body, as they arrive."""

    __slots__ = ("response",)

    def __init__(self, response: httpx.Response) -> None:
        self.response = response

    def run(self) -> Iterator[bytes]:
        return self.response.iter_bytes()

    async def arun(self) -> AsyncIterator[bytes]:
        return self.response.aiter_bytes()


def _nothing() -> None:
    return None


class Hold(Effect):
    """Hold a thread lock; what comes back gives it up.

    Threads sharing a client wait for each other. The async shell takes no
    thread lock (waiting on one would block its event loop): tasks do not wait.
    """

    __slots__ = ("lock",)

    def __init__(self, lock: threading.Lock) -> None:
        self.lock = lock

    def run(self) -> Callable[[], None]:
        hold(self.lock)
        return self.lock.release

    async def arun(self) -> Callable[[], None]:
        return _nothing


class Emit(Generic[T]):
    """Not I/O: an item for the caller of a streaming plan."""

    __slots__ = ("item",)

    def __init__(self, item: T) -> None:
        self.item = item


Plan = Generator[Effect | Emit[Any], Any, T]


def stream(plan: Plan[Any]) -> Generator[Any, None, Any]:
    """Run ``plan`` in the sync shell: yield what it emits, return what it returns."""
    return _stream(plan, None, plan.send)


def _stream(
    plan: Plan[Any], value: Any, send: Callable[[Any], Effect | Emit[Any]]
) -> Generator[Any, None, Any]:
    """:func:`stream`, resuming the plan with ``send(value)``."""
    while True:
        try:
            step = send(value)
        except StopIteration as done:
            return done.value
        except FluidError as error:
            sever(error)
            raise
        try:
            value = (yield step.item) if isinstance(step, Emit) else step.run()
            send = plan.send
        except BaseException as exc:  # noqa: BLE001 - the plan decides, even on Ctrl-C
            value, send = exc, plan.throw


def run(plan: Plan[T]) -> T:
    """Run a plan that emits nothing in the sync shell; its result.

    :func:`stream`'s loop without a generator of its own around the plan: the
    hot path of every sync call.
    """
    send: Callable[[Any], Effect | Emit[Any]] = plan.send
    value: Any = None
    while True:
        try:
            step = send(value)
        except StopIteration as done:
            result: T = done.value
            return result
        except FluidError as error:
            sever(error)
            raise
        if isinstance(step, Emit):
            # As when stream()'s caller stops: the plan's cleanup still runs its effects.
            steps = _stream(plan, GeneratorExit(), plan.throw)
            try:
                next(steps)
            except (GeneratorExit, StopIteration):
                pass
            finally:
                steps.close()
            raise AssertionError(f"a plan for one answer emitted {step.item!r}")
        try:
            value = step.run()
            send = plan.send
        except BaseException as exc:  # noqa: BLE001 - the plan decides, even on Ctrl-C
            value, send = exc, plan.throw


async def _steps(plan: Plan[Any]) -> AsyncGenerator[Any, Any]:
    """Run ``plan`` in the async shell; what it emits (its result is dropped)."""
    send: Callable[[Any], Effect | Emit[Any]] = plan.send
    value: Any = None
    while True:
        try:
            step = send(value)
        except StopIteration:
            return
        except FluidError as error:
            sever(error)
            raise
        try:
            value = (yield step.item) if isinstance(step, Emit) else await step.arun()
            send = plan.send
        except BaseException as exc:  # noqa: BLE001 - the plan decides, even on cancellation
            value, send = exc, plan.throw


def astream(plan: Plan[Any]) -> AsyncIterator[StreamEvent]:
    """Run a streaming plan in the async shell: what it emits."""
    return _steps(plan)


async def arun(plan: Plan[T]) -> T:
    """Run a plan that emits nothing in the async shell; its result.

    :func:`_steps`'s loop without an async generator around it: one frame fewer for
    each call in flight (a plan that emits nothing yields only effects)."""
    value: Any = None
    thrown: BaseException | None = None  # no bound method held while a step is awaited
    while True:
        try:
            step: Any = plan.send(value) if thrown is None else plan.throw(thrown)
        except StopIteration as done:
            return cast(T, done.value)
        except FluidError as error:
            sever(error)
            raise
        thrown = None
        try:
            value = await step.arun()
        except BaseException as exc:  # noqa: BLE001 - the plan decides, even on cancellation
            thrown = exc
