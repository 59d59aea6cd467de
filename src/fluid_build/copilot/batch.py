"""Many calls at once: bounded concurrency, results in input order, one outcome per item.

:func:`map_calls` (threads) and :func:`amap_calls` (tasks) run one call per
prompt with at most ``concurrency`` in flight (the calls share the client's
key, its cooldown and its breaker) and return a :class:`Batch`: the
:class:`Outcome` of every prompt, in the order given, each either its value or
its typed error. A failure never stops the others unless ``fail_fast=True``;
then no new call starts, the calls in flight finish, and the prompts never
sent end as ``llm.cancelled`` (``details["skipped"]``). Ctrl-C or a cancelled
task starts no new call and is raised as it is. An exception that is not a
:class:`~fluid_build.errors.FluidError` is a bug, not an outcome: it is raised.

See docs/batch.md for reading a batch that half failed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

from typing_extensions import Unpack

from fluid_build._threads import as_completed, signals_stay_with_main
from fluid_build.copilot.agents.errors import AgentExecutionError
from fluid_build.errors import FluidError

if TYPE_CHECKING:
    from rich.console import Console

    from fluid_build.copilot.call.core import CallOptions
    from fluid_build.copilot.call.prepare import Messages

__all__ = [
    "COST",
    "DEFAULT_CONCURRENCY",
    "SUCCESS",
    "Batch",
    "Outcome",
    "Progress",
    "amap_calls",
    "map_calls",
    "progress_bar",
]

T = TypeVar("T")

#: Calls in flight at once when the caller does not say: enough to hide latency,
#: few enough that one key's per-minute limits are not spent in the first second.
DEFAULT_CONCURRENCY = 8
#: The summary's name for the prompts that got an answer.
SUCCESS = "success"
#: The summary's last entry: what the answers cost in USD (None: no price known).
COST = "cost_usd"


@dataclass(frozen=True, slots=True)
class Outcome(Generic[T]):
    """What one prompt of a batch came to: its ``value``, or its typed ``error``."""

    index: int
    value: T | None = None
    error: FluidError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def code(self) -> str:
        """``"success"``, or the error's reason code (its class name if it has none)."""
        if self.error is None:
            return SUCCESS
        code = getattr(self.error, "code", None)
        return code if isinstance(code, str) else type(self.error).__name__

    def unwrap(self) -> T:
        """The value; the typed error raised if the call failed."""
        if self.error is not None:
            raise self.error
        return cast(T, self.value)


class Batch(tuple[Outcome[T], ...]):
    """The outcomes of a batch, in the order of its prompts."""

    __slots__ = ()

    @property
    def ok(self) -> bool:
        """Whether every prompt got an answer."""
        return all(outcome.ok for outcome in self)

    @property
    def cost_usd(self) -> float | None:
        """What the answers cost in USD: the sum of each value's ``cost_usd``.

        None when no answer had a known price (no price is not a price of 0).
        A partly priced batch gives the sum of the known prices: at least what
        was spent. Failed prompts add nothing here, though a failure after a
        retry may have been billed (see docs/batch.md).
        """
        costs = [cost for cost in map(_cost_of, self) if cost is not None]
        return sum(costs) if costs else None

    def summary(self) -> dict[str, int | float | None]:
        """How many prompts ended how, then the cost.

        ``{"success": 8, "llm.rate_limited": 2, "cost_usd": 0.0042}``:
        ``success`` first, then the reason codes, most frequent first, then
        ``cost_usd`` (:attr:`cost_usd` rounded to 9 places, or None when no
        answer had a known price). The counts are every entry but the last.
        """
        from fluid_build.copilot.health.budget import usd_json

        counts = Counter(outcome.code for outcome in self)
        ordered = sorted(counts.items(), key=lambda item: (item[0] != SUCCESS, -item[1], item[0]))
        summary: dict[str, int | float | None] = dict(ordered)
        cost = self.cost_usd
        summary[COST] = usd_json(cost)
        return summary

    def failures(self) -> list[Outcome[T]]:
        """The outcomes that are errors, in input order."""
        return [outcome for outcome in self if not outcome.ok]

    def values(self) -> list[T]:
        """Every value in input order; the first failure's typed error raised if any failed."""
        return [outcome.unwrap() for outcome in self]

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={value}" for name, value in self.summary().items())
        return f"Batch({len(self)} calls: {shown})"


def _cost_of(outcome: Outcome[Any]) -> float | None:
    """The outcome's value's ``cost_usd`` (a Completion's), when it is a number."""
    cost = getattr(outcome.value, "cost_usd", None)
    return float(cost) if isinstance(cost, (int, float)) and not isinstance(cost, bool) else None


#: Told each outcome as it ends (see :func:`map_calls`).
Progress = Callable[[Outcome[T]], None]


def _checked(concurrency: int) -> int:
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ValueError(f"concurrency must be a positive integer, not {concurrency!r}")
    return concurrency


def _skipped(index: int, first_failure: int | None) -> Outcome[Any]:
    """The outcome of a prompt that was never sent because the batch stopped."""
    # Neither the flag nor the argument: the same words serve `fluid batch --fail-fast`
    # and `amap(..., fail_fast=True)`; the hint names the prompt and the flag.
    why = (
        f"prompt {first_failure} failed first, and the batch stops at its first failure (fail fast)"
        if first_failure is not None
        else "the batch was stopped"
    )
    error = AgentExecutionError(
        f"not sent: {why}",
        code="llm.cancelled",
        details={"skipped": True, "first_failure": first_failure},
    )
    return Outcome(index, error=error)


def map_calls(
    complete: Callable[..., T],
    items: Iterable[Messages],
    *,
    concurrency: int = DEFAULT_CONCURRENCY,
    fail_fast: bool = False,
    progress: Progress[T] | None = None,
    **options: Unpack[CallOptions],
) -> Batch[T]:
    """``complete(prompt, **options)`` for every prompt, ``concurrency`` threads at a time.

    ``progress`` is called in the caller's thread with each outcome as it
    ends (completion order); skipped prompts are reported too, so a bar
    reaches its total.
    """
    from concurrent.futures import Future, ThreadPoolExecutor

    prompts = list(items)
    workers = min(_checked(concurrency), len(prompts))
    outcomes: list[Outcome[T] | None] = [None] * len(prompts)
    if not prompts:
        return Batch(())

    def one(index: int) -> Outcome[T]:
        try:
            return Outcome(index, value=complete(prompts[index], **options))
        except FluidError as error:
            return Outcome(index, error=error)

    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="fluid-map")
    futures: dict[Future[Outcome[T]], int] = {}
    try:
        futures = {pool.submit(one, index): index for index in range(len(prompts))}
        first_failure: int | None = None
        for future in as_completed(futures):
            if future.cancelled():
                outcome: Outcome[T] = _skipped(futures[future], first_failure)
            else:
                outcome = future.result()  # a bug in a call is raised here
            outcomes[outcome.index] = outcome
            if fail_fast and first_failure is None and not outcome.ok:
                first_failure = outcome.index
                for pending in futures:
                    pending.cancel()  # only the unstarted: threads are never interrupted
            if progress is not None:
                progress(outcome)
    except BaseException:
        # Ctrl-C, a bug, a failing progress callback: nothing new starts; calls
        # in flight end within their deadline, on their own.
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    return Batch(_all(outcomes))


async def amap_calls(
    acomplete: Callable[..., Awaitable[T]],
    items: Iterable[Messages],
    *,
    concurrency: int = DEFAULT_CONCURRENCY,
    fail_fast: bool = False,
    progress: Progress[T] | None = None,
    **options: Unpack[CallOptions],
) -> Batch[T]:
    """:func:`map_calls` with tasks: ``concurrency`` workers take the prompts in order.

    Cancelling the awaiting task cancels the calls in flight (each gives back
    whatever it holds, a breaker's trial lease included) and starts no other.
    """
    import asyncio

    prompts = list(items)
    workers = min(_checked(concurrency), len(prompts))
    outcomes: list[Outcome[T] | None] = [None] * len(prompts)
    queue = iter(range(len(prompts)))
    first_failure: int | None = None

    async def worker() -> None:
        nonlocal first_failure
        for index in queue:  # one shared iterator: each prompt goes to one worker
            if first_failure is not None:
                outcome: Outcome[T] = _skipped(index, first_failure)
            else:
                try:
                    outcome = Outcome(index, value=await acomplete(prompts[index], **options))
                except FluidError as error:
                    outcome = Outcome(index, error=error)
                    if fail_fast and first_failure is None:
                        first_failure = index
            outcomes[index] = outcome
            if progress is not None:
                progress(outcome)

    tasks = [asyncio.ensure_future(worker()) for _ in range(workers)]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.wait(tasks)  # every call has cleaned up before this returns
        raise
    return Batch(_all(outcomes))


def _all(outcomes: Sequence[Outcome[T] | None]) -> list[Outcome[T]]:
    done = [outcome for outcome in outcomes if outcome is not None]
    assert len(done) == len(outcomes), "every prompt has an outcome once the batch ends"
    return done


@contextmanager
def progress_bar(
    total: int, *, description: str = "calls", console: Console | None = None
) -> Iterator[Progress[Any]]:
    """A rich progress bar for a batch of ``total`` prompts; yields the ``progress`` callback.

    The bar counts finished prompts and shows the failures so far by reason
    code; rich loads only here.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    failed: Counter[str] = Counter()
    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[failed]}"),
        console=console,
        transient=False,
    )
    task = bar.add_task(description, total=total, failed="")

    def advance(outcome: Outcome[Any]) -> None:
        if not outcome.ok:
            failed[outcome.code] += 1
        shown = ", ".join(f"{code} {n}" for code, n in failed.most_common())
        bar.update(task, advance=1, failed=shown)

    # rich's refresh thread leaves Ctrl-C to the thread that runs the batch.
    with signals_stay_with_main():
        bar.start()
    try:
        yield advance
    finally:
        bar.stop()
