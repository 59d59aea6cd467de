"""The fallback chain: one call over the client's entries, first answer wins.

:func:`completing` and :func:`streaming` walk the entries (``call/core.py``'s
:class:`~.core.Entry`, the client's model and its fallbacks) in order: a
failure the next entry may not share moves the call on, any other is raised;
when every entry failed, the most actionable error is raised, listing them
all (``details["fallback_attempts"]``). Each failed attempt is kept with its
cost (:class:`~.core.Tally`) for the answer of a later entry.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal

from fluid_build.copilot.agents.errors import (
    AgentExecutionError,
    ContextOverflowError,
    ProviderAuthError,
    ProviderServerError,
    ProviderTimeoutError,
    RateLimitError,
)
from fluid_build.copilot.call.core import _CALLER_SIDE, Entry, Tally
from fluid_build.copilot.call.drive import Emit, Plan
from fluid_build.copilot.call.prepare import Messages
from fluid_build.copilot.llm.types import Completion, StreamEvent

if TYPE_CHECKING:
    from fluid_build.copilot.call.core import CallOptions
    from fluid_build.copilot.call.envelope import MoveOn
    from fluid_build.copilot.call.trace import AttemptTrace
    from fluid_build.copilot.call.wire import Deadline

__all__ = ["OnCut", "completing", "streaming"]

LOG = logging.getLogger("fluid_build.client")

History = list[tuple[Entry, AgentExecutionError]]
# Non-retryable failures after which another provider may still answer (an option this
# entry's provider or model cannot take, nothing sent: the next may take it).
_MOVE_ON = frozenset({"llm.circuit_open", "llm.quota_exhausted", "llm.unsupported_option"})


def completing(
    entries: Sequence[Entry],
    messages: Messages,
    options: CallOptions,
    deadline: Deadline,
    *,
    fallback_on_auth: bool = False,
    trace: AttemptTrace | None = None,
    move_on: MoveOn | None = None,
) -> Plan[Completion]:
    """One answer from the first entry that gives one; else the most actionable error.

    The answer's ``fallback_errors`` lists every failed attempt on the entries before
    it, each with its cost (see :class:`Tally`). ``move_on`` applies to every entry but
    the last: one that said nothing, or asked for a long wait, hands the call on without
    being retried (envelope.py ``moving_on``).
    """
    history: History = []
    failed: list[dict[str, Any]] | None = None  # none yet: no list held for the first entry
    last = len(entries) - 1
    for index, entry in enumerate(entries):
        if deadline.provider != entry.provider or deadline.model != entry.model:
            deadline = deadline.of(entry.provider, entry.model)
        # None for the last entry (and a client without fallbacks): nothing comes after it.
        tally = Tally() if index < last else None
        try:
            onward = move_on if index < last else None
            return (
                yield from entry.complete(messages, options, deadline, failed, trace, tally, onward)
            )
        except AgentExecutionError as error:
            _next_or_raise(entry, error, history, len(entries) > 1, fallback_on_auth)
            if tally is not None:
                failed = [*(failed or ()), *tally.records(entry, error)]
    raise _final_error(history)


#: What a stream does when it is cut after text reached the caller (``on_cut=``).
OnCut = Literal["raise", "restart"]


def streaming(
    entries: Sequence[Entry],
    messages: Messages,
    options: CallOptions,
    start: Callable[[], Deadline],
    *,
    fallback_on_auth: bool = False,
    on_cut: OnCut = "raise",
    trace: AttemptTrace | None = None,
    move_on: MoveOn | None = None,
) -> Plan[None]:
    """A stream from the first entry that gives one: :func:`completing`'s chain for streams.

    The deadline ``start()`` s when the caller first asks for an event. Every
    failure before an event reached the caller moves on as in
    :func:`completing`. After one, the typed error with what arrived is raised
    (``on_cut="raise"``); with ``on_cut="restart"`` a cut the provider may not
    repeat (a retryable error) starts the call again from scratch, once: on the
    next entry, or on the same one when it is the last, after a ``restart``
    event saying the text so far is void. The restart walks the rest of the
    chain as a new stream would; if it fails, the cut's error is raised with
    the restart's failures in ``details["fallback_attempts"]``. ``move_on`` as in
    :func:`completing`, for every entry but the last.

    Each entry's plan is stepped by hand, not with ``yield from``: that would turn
    the caller's ``GeneratorExit`` into ``close()``, and the plan's cleanup yields
    effects (closing the response); see :meth:`CallTrace.stream`.
    """
    deadline = start()
    history: History = []
    failed: list[dict[str, Any]] | None = None  # as in completing(): one record per attempt
    cut: AgentExecutionError | None = None  # the cut that was restarted, once
    index = 0
    last = len(entries) - 1
    while True:
        entry = entries[index]
        if deadline.provider != entry.provider or deadline.model != entry.model:
            deadline = deadline.of(entry.provider, entry.model)
        # None when no answer can follow this entry's failure (completing()'s rule); a
        # restart may follow a cut on the last entry too, on that entry.
        tally = Tally() if index < last or (on_cut == "restart" and cut is None) else None
        onward = move_on if index < last else None
        plan = entry.stream(messages, options, deadline, failed, trace, tally, onward)
        send: Callable[[Any], Any] = plan.send
        value: Any = None
        emitted = False
        try:
            while True:
                try:
                    step = send(value)
                except StopIteration:
                    return
                if isinstance(step, Emit):
                    emitted = True
                try:
                    value = yield step
                    send = plan.send
                except BaseException as exc:  # noqa: BLE001 - the plan decides, as in the shells
                    value, send = exc, plan.throw
        except AgentExecutionError as broke:
            error = broke
        # Decided outside the handler: the error raised keeps its own cause.
        if tally is not None:
            failed = [*(failed or ()), *tally.records(entry, error)]
        if emitted:
            if cut is None and on_cut == "restart" and _restartable(error, deadline):
                entry.remember(error)
                history.append((entry, error))
                cut = error
                if trace is not None:
                    trace.cut(error)
                index = min(index + 1, len(entries) - 1)
                LOG.warning(
                    "the stream from %s was cut [%s]; starting again on %s (on_cut=restart)",
                    entry.label,
                    error.code,
                    entries[index].label,
                )
                yield Emit(
                    StreamEvent(
                        type="restart",
                        code=error.code,
                        reason=error.message,
                        entry=entries[index].label,
                    )
                )
                continue
            entry.remember(error)
            history.append((entry, error))
            raise _with_history(error, history) if cut is None else _restart_failed(cut, history)
        if cut is None:
            _next_or_raise(entry, error, history, len(entries) > 1, fallback_on_auth)
        elif not _moves_on(entry, error, history, index + 1 < len(entries), fallback_on_auth):
            raise _restart_failed(cut, history)
        index += 1
        if index == len(entries):
            raise _final_error(history)


def _moves_on(
    entry: Entry,
    error: AgentExecutionError,
    history: History,
    chained: bool,
    fallback_on_auth: bool,
) -> bool:
    """:func:`_next_or_raise` as a decision: whether the call moves to the next entry."""
    try:
        _next_or_raise(entry, error, history, chained, fallback_on_auth)
    except AgentExecutionError:
        return False
    return True


def _restartable(error: AgentExecutionError, deadline: Deadline) -> bool:
    """Whether a stream cut by ``error`` may start again: the provider may answer whole
    next time (a cut, a stall, a server error mid-stream), and there is time left."""
    return error.retryable and error.code not in _CALLER_SIDE and deadline.left() > 0


def _restart_failed(cut: AgentExecutionError, history: History) -> AgentExecutionError:
    """The cut's own error (never masked by a later one), listing every attempt after it."""
    last, error = history[-1]
    note = f"restarted (on_cut=restart), and {last.label} failed too [{error.code}]"
    return cut.with_details(fallback_attempts=_attempts(history), note=note)


def _next_or_raise(
    entry: Entry,
    error: AgentExecutionError,
    history: History,
    chained: bool,
    fallback_on_auth: bool,
) -> None:
    """Record a failed entry; raise unless the call should move to the next one."""
    entry.remember(error)
    history.append((entry, error))
    if not chained:
        raise error
    if isinstance(error, ProviderAuthError):
        if fallback_on_auth:
            LOG.warning(
                "%s rejected the key [%s]; moving to the next fallback (opted in)",
                entry.label,
                error.code,
            )
            return
        raise _with_history(error, history)
    if isinstance(error, ContextOverflowError) or error.retryable or error.code in _MOVE_ON:
        LOG.warning("%s failed [%s]; moving to the next fallback", entry.label, error.code)
        return
    raise _with_history(error, history)


def _with_history(error: AgentExecutionError, history: History) -> AgentExecutionError:
    if len(history) < 2:
        return error
    return error.with_details(fallback_attempts=_attempts(history))


def _attempts(history: History) -> list[dict[str, Any]]:
    """``details["fallback_attempts"]``: each failed entry's error class, code and message."""
    return [
        {"entry": entry.label, "error": type(e).__name__, "code": e.code, "message": e.message}
        for entry, e in history
    ]


def _actionability(error: AgentExecutionError) -> int:
    """Lower is more actionable: overflow, then rate limits, then server errors."""
    order = (ContextOverflowError, RateLimitError, ProviderServerError, ProviderTimeoutError)
    for rank, cls in enumerate(order):
        if isinstance(error, cls):
            return rank
    return len(order)


def _final_error(history: History) -> AgentExecutionError:
    """Every entry failed: the most actionable error, listing them all."""
    best = min(history, key=lambda item: _actionability(item[1]))[1]
    final = _with_history(best, history)
    if len(history) > 1:
        final = final.with_details(note=f"all {len(history)} fallback entries failed")
    return final
