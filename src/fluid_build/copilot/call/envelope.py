"""The retry envelope: when to wait, how long, and when to give up.

One :class:`RetryPolicy` decides; :meth:`RetryEnvelope.plan` applies it with
tenacity's own decision step, as a sans-I/O plan (see
:mod:`fluid_build.copilot.call.drive`) that the sync entry point
(:meth:`RetryEnvelope.call`) and the async one (:meth:`RetryEnvelope.acall`)
only run: one implementation, two shells that differ in how they sleep and await.

- A retryable error with ``retry_after`` sleeps exactly that long (capped at
  300 s); the backoff is not applied on top.
- A retryable error without it backs off 1 s, 2 s, 4 s ... capped at 8 s,
  shortened by up to 10 % jitter (never lengthened past the cap).
- A non-retryable error is raised at once: one attempt, no sleep.
- With a deadline, a wait that would end past it gives up at once, saying how
  long the server asked for.
- With a cooldown store and a key, a Retry-After seen by any call on the key
  makes every call on it wait out the window before sending (never longer
  than the 300 s cap in all, whatever the store says).
- With a circuit breaker, an open key refuses at once; a half-open key lets
  one call through as the trial, whose lease is given back however the call
  ends (an answer, any error, a cancellation, Ctrl-C).
- With a rate limiter, :meth:`RetryEnvelope.budget_waits` are the waits before
  an attempt until the announced budget holds it (see
  :mod:`fluid_build.copilot.health.ratelimit`); the call plan takes them.
- With a ``spend`` (a shared USD budget, see
  :mod:`fluid_build.copilot.health.budget`), every attempt reserves its worst
  case before it runs and settles after: a retry is another billable request.
- Deadlines and elapsed times run on ``clock`` (monotonic); only what is
  written to the shared store uses ``wall``.
- With a later entry in the chain (``move_on``, a :class:`MoveOn`), the envelope
  gives this entry up at once instead of retrying it: after an attempt that ended
  on a phase limit with no byte of an answer (the route said nothing), and when
  the server asks for a wait (Retry-After, or the key's shared cooldown) longer
  than ``MoveOn.retry_after``. Without one it retries and sleeps as above.

The error raised at the end is the typed error of the last attempt, with
``details["attempts"]`` (requests sent) and ``details["waits"]``.
"""

from __future__ import annotations

import logging
import random
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypedDict, TypeVar

from typing_extensions import Unpack

from fluid_build.copilot.agents.errors import (
    AgentExecutionError,
    FluidError,
    RateLimitError,
)
from fluid_build.copilot.call.drive import Call, Exchange, Plan, Send, Sleep, arun
from fluid_build.copilot.call.drive import run as run_plan
from fluid_build.copilot.call.policy import (
    Decision,
    MoveOn,
    RetryPolicy,
    backoff_wait,
    decide,
    moving_on,
    silent,
)
from fluid_build.copilot.health.breaker import CircuitBreaker
from fluid_build.copilot.health.cooldown import (
    COOLDOWN,
    CooldownKey,
    CooldownStore,
    cooldown_store_from_env,
    reset_keys,
    trusted,
)
from fluid_build.copilot.health.ratelimit import RateLimiter

__all__ = [
    "COOLDOWN",
    "CallBounds",
    "Decision",
    "MoveOn",
    "RetryEnvelope",
    "RetryEvent",
    "RetryHook",
    "RetryPolicy",
    "Spend",
    "WaitReason",
    "backoff_wait",
    "decide",
    "log_wait",
    "moving_on",
    "silent",
]

if TYPE_CHECKING:
    import tenacity

LOG = logging.getLogger("fluid_build.retry")

T = TypeVar("T")
WaitReason = Literal["retry_after", "backoff", "cooldown", "rate_limit"]


@dataclass(frozen=True, slots=True)
class RetryEvent:
    """One wait of the envelope, as reported to the hook."""

    wait: float
    reason: WaitReason
    attempts: int
    error: AgentExecutionError | None
    key: str | None
    provider: str | None
    model: str | None


class CallBounds(TypedDict, total=False):
    """Who a call is for and how long it may take (see :meth:`RetryEnvelope.call`)."""

    key: CooldownKey | str | None
    provider: str | None
    model: str | None
    started: float | None
    deadline: float | None
    narrow: Callable[[float | None], None] | None
    secrets: Sequence[str]
    hook: RetryHook | None
    spend: Spend | None
    move_on: MoveOn | None


class Spend(Protocol):
    """Reservations against a USD budget, one per attempt (see ``health.budget.BudgetSpend``).

    ``reserve`` raises the refusal (nothing is sent); its hold goes to
    ``succeeded`` with the attempt's result, or to ``failed`` with its exception
    and whether the request had gone out.
    """

    def reserve(self) -> Any: ...

    def succeeded(self, hold: Any, result: object) -> None: ...

    def failed(self, hold: Any, exc: BaseException, *, sent: bool = True) -> object: ...


class RetryHook(Protocol):
    def __call__(self, event: RetryEvent) -> None: ...


def log_wait(event: RetryEvent) -> None:
    """The default hook: one log line per wait."""
    if event.reason == "rate_limit":
        LOG.info(
            "%s: key %s has spent its announced rate-limit budget; waiting %.2f s for the reset",
            event.provider or "provider",
            event.key,
            event.wait,
        )
        return
    if event.reason == "cooldown":
        LOG.warning(
            "%s: key %s is cooling down after a Retry-After; waiting %.2f s before sending",
            event.provider or "provider",
            event.key,
            event.wait,
        )
        return
    code = event.error.code if event.error else "?"
    how = "as the server asked" if event.reason == "retry_after" else "backing off"
    LOG.warning(
        "%s: attempt %d failed [%s]; waiting %.2f s (%s)",
        event.provider or "provider",
        event.attempts,
        code,
        event.wait,
        how,
    )


class _Run:
    """The state of one enveloped call; every decision of both drivers lives here."""

    def __init__(
        self,
        envelope: RetryEnvelope,
        key: str | None,
        provider: str | None,
        model: str | None,
        started: float,
        trial: str | None,
        deadline: float | None = None,
        narrow: Callable[[float | None], None] | None = None,
        secrets: Sequence[str] = (),
        hook: RetryHook | None = None,
        move_on: MoveOn | None = None,
    ) -> None:
        self.env = envelope
        self.move_on = move_on
        self.secrets = tuple(secrets)
        self.hooks = (envelope.hook,) if hook is None else (envelope.hook, hook)
        self.narrow = narrow
        self.key = key if envelope.cooldown is not None or envelope.breaker is not None else None
        self.provider = provider
        self.model = model
        self.started = started
        self.sent = 0
        self.waits: list[dict[str, Any]] = []
        self.decision: Decision | None = None
        policy_deadline = envelope.policy.deadline
        self.deadline = (
            deadline
            if policy_deadline is None
            else policy_deadline
            if deadline is None
            else min(deadline, policy_deadline)
        )
        self.sent_at: float | None = None  # wall-clock, when the last attempt went out
        self.trial: str | None = None
        if trial is not None:
            self.became_trial(trial)

    def elapsed(self) -> float:
        return self.env.clock() - self.started

    def left(self) -> float | None:
        """Seconds left before the call's deadline (None: no deadline)."""
        return None if self.deadline is None else max(self.deadline - self.elapsed(), 0.0)

    def became_trial(self, owner: str) -> None:
        """This call holds the half-open lease: it must end before the lease does."""
        self.trial = owner
        assert self.env.breaker is not None
        bound = self.elapsed() + self.env.breaker.trial_seconds
        self.deadline = bound if self.deadline is None else min(self.deadline, bound)
        if self.narrow is not None:  # the caller's reads must end inside the lease too
            self.narrow(self.started + self.deadline)

    # -- attempts --------------------------------------------------------------

    def failed(self, exc: Exception) -> AgentExecutionError:
        """Classify a failed attempt, count it, and share its Retry-After with the key.

        A :class:`FluidError` that is not an :class:`AgentExecutionError` (a
        cassette that does not match, a configuration that cannot be used) is
        a local problem, not a provider's answer: it is raised as it is, never
        retried, and never counted against the provider.
        """
        if isinstance(exc, FluidError) and not isinstance(exc, AgentExecutionError):
            raise exc
        env = self.env
        # The classification tables load with the first failure, not with the client.
        from fluid_build.copilot.agents.error_classification import classify_provider_error

        error = classify_provider_error(
            exc, provider=self.provider, model=self.model, now=env.wall(), secrets=self.secrets
        )
        if error is not exc:
            error.__cause__ = exc
        if self.key is None:
            return error
        if env.breaker is not None and env.breaker.record_failure(
            self.key, error, trial=self.trial
        ):
            self.trial = None  # reopened: the breaker gave the lease back
        store = env.cooldown
        # Only a server's answer starts a cooldown: a wait fluid set itself (the
        # breaker, this process's own rate-limit budget, a cooldown already shared)
        # sent nothing, and shared it would refuse processes that run without it.
        if (
            store is not None
            and error.retryable
            and error.retry_after is not None
            and error.retry_after > 0
            and not error.own_wait
        ):
            name = COOLDOWN + self.key
            now = env.wall()
            window = min(error.retry_after, env.policy.retry_after_cap)
            if store.remaining(name, now) <= 0:
                # INFO: a server asking for a pause is the envelope working, not a
                # fault; the waits themselves reach the caller as RetryEvents.
                LOG.info(
                    "%s: key %s cools down for %.3g s after a Retry-After [%s]; every call on "
                    "it waits",
                    self.provider or "provider",
                    self.key,
                    window,
                    error.code,
                )
            store.extend(name, window, now, error.code)
        return error

    def before_send(self) -> None:
        breaker = self.env.breaker
        if breaker is not None and self.key is not None:
            owner = breaker.check(
                self.key,
                provider=self.provider,
                model=self.model,
                deadline=self.left(),
                owner=self.trial,
            )
            if owner is not None and self.trial is None:
                self.became_trial(owner)
        self.sent += 1
        self.sent_at = self.env.wall()

    def succeeded(self) -> None:
        if self.env.breaker is not None and self.key is not None:
            # clears the lease too
            self.env.breaker.record_success(self.key, sent_at=self.sent_at)
            self.trial = None

    def cooldown_waits(self) -> Iterator[float]:
        """The waits to take before sending, while the key is cooling down.

        Together they never exceed the Retry-After cap: a window read back
        longer than that (a skewed clock, a planted entry) is cut down.
        """
        store = self.env.cooldown
        if store is None or self.key is None:
            return
        name = COOLDOWN + self.key
        cap = self.env.policy.retry_after_cap
        budget = cap
        while budget > 0:
            now = self.env.wall()
            left = min(trusted(store, name, store.remaining(name, now), cap, now), budget)
            if left <= 0:
                return
            deadline_left = self.left()
            moves = self.move_on is not None and left > self.move_on.retry_after
            if moves or (deadline_left is not None and left > deadline_left):
                # Past the deadline, or longer than a later entry needs to answer: refused now.
                raise RateLimitError(
                    f"{self.provider or 'provider'} key {self.key} is cooling down for "
                    f"{left:.3g} s after another call got Retry-After",
                    provider=self.provider,
                    model=self.model,
                    retry_after=left,
                    details={"cooldown": True, "cooldown_key": self.key},
                )
            budget -= left
            self.report(left, "cooldown", None)
            yield left

    # -- tenacity's callbacks ------------------------------------------------------

    def retry(self, state: tenacity.RetryCallState) -> bool:
        error = state.outcome.exception() if state.outcome else None
        if not isinstance(error, AgentExecutionError):
            return False  # success, cancellation, or a bug: never retried
        self.decision = decide(
            error,
            state.attempt_number,
            self.elapsed(),
            self.env.policy,
            self.env.random(),
            deadline=self.deadline,
            move_on=self.move_on,
        )
        breaker = self.env.breaker
        if (
            not self.decision.gives_up
            and breaker is not None
            and self.key is not None
            and breaker.is_open(self.key)
        ):  # this failure tripped it: waiting to be refused helps nobody
            self.decision = Decision(None, "gave up: the circuit breaker opened")
        return error.retryable

    def wait(self, state: tenacity.RetryCallState) -> float:
        if self.decision is None or self.decision.wait is None:
            return 0.0
        return self.decision.wait

    def stop(self, state: tenacity.RetryCallState) -> bool:
        return self.decision is None or self.decision.gives_up

    def before_sleep(self, state: tenacity.RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome else None
        reason: WaitReason = "backoff"
        if self.decision is not None and self.decision.reason == "retry_after":
            reason = "retry_after"
        typed = error if isinstance(error, AgentExecutionError) else None
        self.report(state.upcoming_sleep, reason, typed)

    def tenacity_kwargs(self) -> dict[str, Any]:
        return {
            "retry": self.retry,
            "wait": self.wait,
            "stop": self.stop,
            "before_sleep": self.before_sleep,
            "reraise": True,
        }

    # -- reporting -------------------------------------------------------------------

    def report(self, wait: float, reason: WaitReason, error: AgentExecutionError | None) -> None:
        self.waits.append({"seconds": wait, "reason": reason})
        event = RetryEvent(wait, reason, self.sent, error, self.key, self.provider, self.model)
        for hook in self.hooks:
            try:
                hook(event)
            except Exception:  # a broken hook must not break the call
                LOG.exception("retry hook %r failed", hook)

    def final(self, error: AgentExecutionError) -> AgentExecutionError:
        """The error to raise: the last attempt's, with what the envelope did."""
        decision = self.decision
        note = None
        if decision is not None and decision.gives_up and decision.reason != "not retryable":
            note = decision.reason
        extra: dict[str, object] = {"attempts": self.sent, "waits": self.waits}
        if note:
            extra["gave_up"] = note
            if note.startswith("moved on"):
                extra["moved_on"] = True
        final = error.with_details(note=_with_knob(note), **extra)
        final.__cause__ = error.__cause__
        final.__traceback__ = error.__traceback__
        return final

    def end(self) -> None:
        """However the call ended (an answer, any error, a cancellation): give the lease back."""
        if self.narrow is not None:
            self.narrow(None)
        if self.trial is not None and self.env.breaker is not None and self.key is not None:
            self.env.breaker.release(self.key, self.trial)
            self.trial = None


def _with_knob(note: str | None) -> str | None:
    """The give-up note as the message shows it: with the variable that sets the limit."""
    if note is None:
        return None
    if "deadline" in note:
        return f"{note} (FLUID_LLM_DEADLINE_SECONDS sets the deadline)"
    if note.startswith("gave up after"):
        return f"{note} (FLUID_LLM_MAX_ATTEMPTS sets how many)"
    return note


def _default_random() -> float:
    return random.random()  # noqa: S311 - jitter, not cryptography


async def _asleep(seconds: float) -> None:
    """``asyncio.sleep``; asyncio loads with the first wait, not with the client."""
    import asyncio

    await asyncio.sleep(seconds)


class RetryEnvelope:
    """Run a provider call with the policy's retries, waits, shared cooldown and breaker.

    ``clock`` measures elapsed time and deadlines (monotonic by default);
    ``wall`` stamps what goes into the shared store, which other processes
    read (``time.time`` by default; an injected ``clock`` drives both unless
    ``wall`` is given too). ``sleep`` / ``asleep`` do the waiting. Tests
    inject them and assert the exact waits without sleeping.
    """

    def __init__(
        self,
        policy: RetryPolicy | None = None,
        *,
        cooldown: CooldownStore | None = None,
        breaker: CircuitBreaker | None = None,
        limiter: RateLimiter | None = None,
        hook: RetryHook = log_wait,
        clock: Callable[[], float] | None = None,
        wall: Callable[[], float] | None = None,
        sleep: Callable[[float], None] = time.sleep,
        asleep: Callable[[float], Awaitable[None]] = _asleep,
        random: Callable[[], float] = _default_random,
    ) -> None:
        self.policy = policy or RetryPolicy()
        self.cooldown = cooldown
        self.breaker = breaker
        self.limiter = limiter
        self.hook = hook
        self.clock = clock or time.monotonic
        self.wall = wall or clock or time.time
        self.sleep = sleep
        self.asleep = asleep
        self.random = random

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **kwargs: Any) -> RetryEnvelope:
        """The policy from ``FLUID_LLM_*`` and the store from ``FLUID_COOLDOWN_URL``."""
        kwargs.setdefault("policy", RetryPolicy.from_env(env))
        if "cooldown" not in kwargs:
            kwargs["cooldown"] = cooldown_store_from_env(env)
        if "breaker" not in kwargs and kwargs["cooldown"] is not None:
            breaker_kwargs = {}
            if kwargs.get("wall") or kwargs.get("clock"):
                breaker_kwargs["clock"] = kwargs.get("wall") or kwargs["clock"]
            kwargs["breaker"] = CircuitBreaker.from_env(kwargs["cooldown"], env, **breaker_kwargs)
        if "limiter" not in kwargs and kwargs["cooldown"] is not None:
            kwargs["limiter"] = RateLimiter.from_env(kwargs["cooldown"], env)
        return cls(**kwargs)

    def __repr__(self) -> str:
        return f"RetryEnvelope({self.policy!r}, cooldown={self.cooldown!r})"

    def _admit(
        self,
        key: str | None,
        provider: str | None,
        model: str | None,
        started: float,
        deadline: float | None,
    ) -> str | None:
        """The breaker's gate before the first attempt: the trial lease owner, or None."""
        if key is None or self.breaker is None:
            return None
        bounds = [d for d in (deadline, self.policy.deadline) if d is not None]
        left = min(bounds) - (self.clock() - started) if bounds else None
        return self.breaker.check(
            key, provider=provider, model=model, deadline=None if left is None else max(left, 0.0)
        )

    def _clear(self, key: str | None) -> bool:
        """Whether the breaker is closed and no cooldown runs, in one store read.

        Only where the breaker keeps its state in the cooldown store on the same
        clock (the default); False sends the call through :meth:`_admit` and
        :meth:`_cooling`, which read again and decide.
        """
        breaker, store = self.breaker, self.cooldown
        if key is None or breaker is None or breaker.store is not store or store is None:
            return False
        if breaker.clock is not self.wall:
            return False
        open_, half = breaker.gate_keys(key)
        view = store.peek((COOLDOWN + key, open_, half), self.wall())
        return view[0][0] <= 0 and view[1][0] <= 0 and view[2][0] <= 0

    def _cooling(self, key: str | None) -> bool:
        return (
            key is not None
            and self.cooldown is not None
            and self.cooldown.remaining(COOLDOWN + key, self.wall()) > 0
        )

    def reset(self, key: CooldownKey | str) -> None:
        """Clear ``key``'s cooldown window and breaker in the shared store, for every process."""
        skey = str(key)
        if self.cooldown is not None:
            reset_keys(self.cooldown, [COOLDOWN + skey])
        if self.breaker is not None:
            self.breaker.reset(skey)
        if self.limiter is not None:
            self.limiter.reset(skey)

    def budget_waits(
        self,
        key: CooldownKey | str,
        tokens: int,
        left: Callable[[], float | None],
        provider: str | None = None,
        model: str | None = None,
    ) -> Iterator[float]:
        """The waits before an attempt until the rate-limit budget holds it, each reported.

        Raises :class:`RateLimitError` when the reset is past the deadline.
        """
        if self.limiter is None:
            return
        for wait in self.limiter.waits(
            key, tokens, wall=self.wall, left=left, provider=provider, model=model
        ):
            event = RetryEvent(wait, "rate_limit", 0, None, str(key), provider, model)
            try:
                self.hook(event)
            except Exception:  # a broken hook must not break the call
                LOG.exception("retry hook %r failed", self.hook)
            yield wait

    # -- the plan and its two shells -------------------------------------------------

    def plan(
        self,
        attempt: Callable[[], Plan[T]],
        *,
        key: CooldownKey | str | None = None,
        provider: str | None = None,
        model: str | None = None,
        started: float | None = None,
        deadline: float | None = None,
        narrow: Callable[[float | None], None] | None = None,
        secrets: Sequence[str] = (),
        hook: RetryHook | None = None,
        spend: Spend | None = None,
        move_on: MoveOn | None = None,
    ) -> Plan[T]:
        """Run the plan ``attempt()`` makes until it succeeds or the policy gives up.

        The one implementation behind :meth:`call` and :meth:`acall`: tenacity's
        own decision step (``iter`` -> attempt / sleep / outcome) runs here, and
        every wait is yielded as a :class:`~fluid_build.copilot.call.drive.Sleep`
        for the shell to take. The arguments are those of :meth:`call`.
        """
        started = self.clock() if started is None else started
        skey = None if key is None else str(key)
        if spend is not None:  # each attempt, the first and every retry, reserves
            attempt = partial(_spending, attempt, spend)
        if self._clear(skey):
            trial, fast = None, True
        else:
            trial = self._admit(skey, provider, model, started, deadline)
            fast = trial is None and not self._cooling(skey)
        run: _Run | None = None
        try:
            first: Exception | None = None
            if fast:
                # The fast path: a first attempt that succeeds pays for nothing else.
                sent_at = self.wall()
                try:
                    result = yield from attempt()
                except Exception as exc:  # noqa: BLE001 - classified below, whatever it is
                    first = exc
                else:
                    if self.breaker is not None and skey is not None:
                        self.breaker.record_success(skey, sent_at=sent_at)
                    return result
            # tenacity (the retry engine) loads with the first call that needs more than
            # one attempt or a wait: a first attempt that succeeds never imports it.
            import tenacity

            run = _Run(
                self,
                skey,
                provider,
                model,
                started,
                trial,
                deadline,
                narrow,
                secrets,
                hook,
                move_on,
            )
            trial = None  # the run holds it now
            pending: AgentExecutionError | None = None
            if first is not None:
                run.sent = 1
                pending = run.failed(first)
            retrying = tenacity.Retrying(**run.tenacity_kwargs())
            retrying.begin()
            state = tenacity.RetryCallState(retrying, fn=None, args=(), kwargs={})
            try:
                while True:
                    action = retrying.iter(state)
                    if isinstance(action, tenacity.DoSleep):
                        state.prepare_for_next_attempt()
                        yield Sleep(action, self.sleep, self.asleep)
                        continue
                    try:
                        if pending is not None:
                            error, pending = pending, None
                            raise error
                        for wait in run.cooldown_waits():
                            yield Sleep(wait, self.sleep, self.asleep)
                        run.before_send()
                        try:
                            result = yield from attempt()
                        except Exception as exc:  # noqa: BLE001 - classified, then judged
                            raise run.failed(exc)  # noqa: B904 - failed() sets __cause__
                        run.succeeded()
                        return result
                    except BaseException:  # noqa: BLE001 - judged by tenacity, as its AttemptManager does
                        state.set_exception(sys.exc_info())  # type: ignore[arg-type]
            except AgentExecutionError as error:
                raise run.final(error) from error.__cause__
        finally:
            self._end(skey, trial, run)

    def _end(self, key: str | None, trial: str | None, run: _Run | None) -> None:
        if run is not None:
            run.end()
        elif trial is not None and self.breaker is not None and key is not None:
            self.breaker.release(key, trial)

    def call(self, fn: Callable[[], T], **how: Unpack[CallBounds]) -> T:
        """Call ``fn()`` until it succeeds or the policy gives up; raise the typed error.

        ``started`` (on ``clock``) and ``deadline`` (seconds) let a caller whose
        call began earlier (a pre-flight, a fallback chain) bound the whole of
        it; the shorter of ``deadline`` and the policy's wins. ``narrow`` is
        told when (on ``clock``) the attempts must end sooner, while this call
        is a half-open trial, and told None when the call ends. ``secrets``
        (the request's key) are removed by value from every error raised.
        ``hook`` hears this call's waits, after the envelope's own hook.
        """
        plan: Plan[T] = self.plan(partial(_calling, fn), **how)
        return run_plan(plan)

    async def acall(self, fn: Callable[[], Awaitable[T]], **how: Unpack[CallBounds]) -> T:
        """:meth:`call` for a coroutine function: the same plan, awaited sleeps."""
        plan: Plan[T] = self.plan(partial(_calling, fn), **how)
        return await arun(plan)


#: The effects that put an attempt's request on the wire (or in the caller's hands).
_SENDING = (Exchange, Send, Call)


def _spending(attempt: Callable[[], Plan[T]], spend: Spend) -> Plan[T]:
    """One attempt under a budget: reserve first (a refusal sends nothing), settle after.

    ``yield from``, watching the effects go by: an attempt that failed before its
    request went out (its deadline passed while it waited for the store, a
    credential, the rate limiter) spent nothing, whatever its error says.
    """
    hold = spend.reserve()
    plan = attempt()
    sent = False
    try:
        effect = next(plan)
        while True:
            sent = sent or isinstance(effect, _SENDING)
            try:
                value = yield effect
            except GeneratorExit:
                plan.close()
                raise
            except BaseException as exc:  # noqa: BLE001 - handed to the attempt, as yield from does
                effect = plan.throw(exc)
            else:
                effect = plan.send(value)
    except StopIteration as stop:
        result: T = stop.value
    except BaseException as exc:
        spend.failed(hold, exc, sent=sent)
        raise
    spend.succeeded(hold, result)
    return result


def _calling(fn: Callable[[], Any]) -> Plan[Any]:
    """The plan of one attempt that is the caller's own function."""
    return (yield Call(fn))
