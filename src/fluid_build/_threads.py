"""Daemon worker threads for waits fluid gives up on: a stuck one replaced, none held at exit.

Python cannot kill a thread, so a job that overruns its deadline is given
up on (:meth:`DaemonPool.abandon`) rather than stopped: it finishes in the
background on its own daemon thread, which then ends, while a new worker
takes its place. Two pools use it: the heads of answers on a caller's own
sync pool (call/drive.py) and sync tool bodies (loop/tools.py; docs/tools.md,
"Timeouts").

Ctrl-C reaches the main thread however many threads run. The kernel hands a
process's SIGINT to any thread that does not block it; Python then runs the
handler in the main thread, but only once that thread runs again, and a
thread blocked in one long wait does not. So the main thread never waits in
one piece for another thread (:func:`wait_done`, :func:`hold`,
:func:`as_completed`: they wake every 0.1 s), and threads that only ever
wait on fluid's behalf are started with SIGINT and SIGTERM blocked
(:func:`signals_stay_with_main`), so a main thread blocked in a socket read
is the one that takes them.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import itertools
import queue
import signal
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Final, TypeVar

T = TypeVar("T")

__all__ = ["DaemonPool", "as_completed", "hold", "signals_stay_with_main", "wait_done"]

#: How often the main thread wakes from a wait to run a signal handler that is due.
WAKE: Final = 0.1
_MAIN_ONLY: Final = frozenset({signal.SIGINT, signal.SIGTERM})


def _in_main() -> bool:
    return threading.current_thread() is threading.main_thread()


def wait_done(future: concurrent.futures.Future[Any], seconds: float) -> bool:
    """Wait up to ``seconds`` for ``future``; True once it is done.

    In the main thread the wait wakes every :data:`WAKE` seconds, so a Ctrl-C
    that the kernel gave another thread is raised here within that, not at
    the end of the wait."""
    if not _in_main():
        concurrent.futures.wait([future], timeout=max(seconds, 0.0))
        return future.done()
    end = time.monotonic() + seconds
    while not future.done():
        left = end - time.monotonic()
        if left <= 0:
            return False
        concurrent.futures.wait([future], timeout=min(left, WAKE))
    return True


def as_completed(
    futures: Iterable[concurrent.futures.Future[T]],
) -> Iterator[concurrent.futures.Future[T]]:
    """``concurrent.futures.as_completed(futures)``; in the main thread, waking every
    :data:`WAKE` seconds (as :func:`wait_done`). Each future tells one queue when it is
    done, once: a wake-up costs the same however many futures are left."""
    if not _in_main():
        yield from concurrent.futures.as_completed(futures)
        return
    finished: queue.SimpleQueue[concurrent.futures.Future[T]] = queue.SimpleQueue()
    waiting = set(futures)
    for future in waiting:
        future.add_done_callback(finished.put)  # at once for one already done
    for _ in waiting:
        while True:
            try:
                future = finished.get(timeout=WAKE)
            except queue.Empty:
                continue
            break
        yield future


def hold(lock: threading.Lock) -> None:
    """``lock.acquire()``; in the main thread, waking every :data:`WAKE` seconds (as
    :func:`wait_done`)."""
    if not _in_main():
        lock.acquire()
        return
    while not lock.acquire(timeout=WAKE):
        pass


@contextlib.contextmanager
def signals_stay_with_main() -> Iterator[None]:
    """Threads started inside block SIGINT and SIGTERM for life (a new thread takes its
    starter's signal mask), so the kernel gives those signals to a thread that acts on
    them. Only for threads that run no one else's code: a process started from such a
    thread would inherit the mask, and Ctrl-C would not stop it."""
    if not hasattr(signal, "pthread_sigmask"):  # Windows: signals go to the main thread
        yield
        return
    before = signal.pthread_sigmask(signal.SIG_BLOCK, _MAIN_ONLY)
    try:
        yield
    finally:
        # A signal that came meanwhile was held for the process: it is handled now.
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


@dataclass(eq=False)
class _Worker:
    abandoned: bool = False


@dataclass(frozen=True, eq=False)
class _Job:
    future: concurrent.futures.Future[Any]
    fn: Callable[[], Any]
    deadline: float


class _PoolState:
    """What a pool's worker threads share. It never refers to the pool, so the pool can be
    collected (and its workers told to stop) while they live."""

    def __init__(self, size: int, prefix: str) -> None:
        self.jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self.lock = threading.Lock()
        self.idle = threading.Semaphore(0)
        self.size = size
        self.live = 0  # workers that are not abandoned
        self.orphans = 0  # abandoned workers whose body has not returned yet
        self.running: dict[concurrent.futures.Future[Any], _Worker] = {}
        self.closed = False
        self.prefix = prefix
        self.names = itertools.count()

    def start_worker(self) -> None:
        """Start one more worker (the lock is held)."""
        self.live += 1
        thread = threading.Thread(
            target=_work, args=(self,), name=f"{self.prefix}_{next(self.names)}", daemon=True
        )
        thread.start()

    def close(self) -> None:
        with self.lock:
            if self.closed:
                return
            self.closed = True
            for _ in range(self.live):
                self.jobs.put(None)


def _work(state: _PoolState) -> None:
    me = _Worker()
    while True:
        job = state.jobs.get()
        if job is None:
            return
        if time.monotonic() >= job.deadline:
            job.future.cancel()  # its caller gave up waiting: never start it late
        with state.lock:
            state.running[job.future] = me
        started = job.future.set_running_or_notify_cancel()
        if started:
            try:
                result = job.fn()
            except BaseException as exc:  # noqa: BLE001 - handed to the caller through the future
                job.future.set_exception(exc)
            else:
                job.future.set_result(result)
        with state.lock:
            state.running.pop(job.future, None)
            if me.abandoned:
                state.orphans -= 1
                return  # a replacement took this worker's place
        del job
        state.idle.release()


class DaemonPool:
    """A thread pool whose workers are daemon threads, and whose stuck workers are replaced.

    ``concurrent.futures.ThreadPoolExecutor`` joins its workers at interpreter
    exit, so one body that never returns keeps the process alive forever.
    Here, :meth:`abandon` gives up on a running job: its thread is left to
    finish the body in the background (then it ends instead of taking more
    work) and a new worker takes its place, so the pool keeps ``size``
    usable workers. Daemon threads never hold up exit.

    A job still queued when its deadline passes is cancelled by the worker
    that picks it up, never started late.
    """

    def __init__(self, size: int, prefix: str) -> None:
        self._state = _PoolState(size, prefix)
        weakref.finalize(self, _PoolState.close, self._state)

    def submit(self, fn: Callable[[], Any], deadline: float) -> concurrent.futures.Future[Any]:
        state = self._state
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        with state.lock:
            if state.closed:
                raise RuntimeError("cannot run a tool after the registry was closed")
            state.jobs.put(_Job(future, fn, deadline))
            if not state.idle.acquire(blocking=False) and state.live < state.size:
                state.start_worker()
        return future

    def abandon(self, future: concurrent.futures.Future[Any]) -> bool:
        """Give up on ``future``'s running job; True when a worker was replaced."""
        state = self._state
        with state.lock:
            worker = state.running.pop(future, None)
            if worker is None or future.done():
                return False
            worker.abandoned = True
            state.live -= 1
            state.orphans += 1
            if not state.closed:
                state.start_worker()
            return True

    @property
    def abandoned(self) -> int:
        """How many threads still run bodies that were given up on."""
        return self._state.orphans

    def shutdown(self) -> None:
        self._state.close()
