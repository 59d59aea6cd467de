"""A call's spending from a shared USD budget: reserve per attempt, settle per answer.

The ledger (what each budget has spent and holds, in the shared store) is
:mod:`fluid_build.copilot.health.budget`; this is the call's side of it: what
an attempt's worst case costs at the entry's own prices, the refusals
(``budget.cost_exhausted``, ``budget.cost_unknown``,
``budget.store_unavailable``) and the settling after the answer. The retry
envelope runs :class:`BudgetSpend` around every attempt (``CallBounds``'
``spend``); docs/budgets.md says the rules.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from fluid_build.copilot.agents.errors import AgentExecutionError, python_aside
from fluid_build.copilot.health.budget import (
    HOLD_MARGIN,
    MICRO,
    BudgetLedger,
    BudgetSpec,
    BudgetState,
    Reservation,
    budget_error,
    budgets_from_env,
    ledger_for,
    micro_usd,
    usd_text,
)

if TYPE_CHECKING:
    from fluid_build.copilot.call.prices import Prices
    from fluid_build.copilot.health.store import CooldownStore
    from fluid_build.copilot.llm.types import Usage

__all__ = [
    "BudgetGuard",
    "BudgetSpend",
    "Hold",
    "NoSharedLedger",
    "NoSharedStore",
    "nothing_billed",
]

LOG = logging.getLogger("fluid_build.budget")


@dataclass(frozen=True, slots=True)
class Hold:
    """One attempt's reservation: its id and amount (micro-USD)."""

    id: str
    amount: int


def _refused(message: str, code: str, retryable: bool, **details: Any) -> AgentExecutionError:
    retry_after = details.pop("retry_after", None)
    return AgentExecutionError(
        message, code=code, retryable=retryable, retry_after=retry_after, details=details
    )


class BudgetGuard:
    """A client's budget: which one, where it is kept, and how to price against it.

    ``wall`` stamps the ledger (wall-clock seconds, as every store keeps them).
    ``fail_open`` (``FLUID_BUDGET_FAIL_OPEN=1``) lets a call through unmetered
    when the ledger cannot be reached, instead of refusing it.
    """

    def __init__(
        self,
        spec: BudgetSpec,
        ledger: BudgetLedger,
        *,
        prices: Prices | None = None,
        fail_open: bool = False,
        wall: Callable[[], float] | None = None,
        margin: float = HOLD_MARGIN,
    ) -> None:
        import time

        self.spec = spec
        self.ledger = ledger
        self.prices = prices
        self.fail_open = fail_open
        self.wall = wall or time.time
        self.margin = margin

    @classmethod
    def from_env(
        cls,
        name: str | None,
        store: CooldownStore | None,
        env: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> BudgetGuard | None:
        """The guard for ``name`` (``FLUID_BUDGET`` when None); None when no budget is named."""
        source = os.environ if env is None else env
        name = name if name is not None else (source.get("FLUID_BUDGET") or None)
        if name is None:
            return None
        specs = budgets_from_env(source)
        if name not in specs:
            named = f"FLUID_BUDGET {python_aside('budget')}"
            if specs:
                reason = (
                    f"budget {name!r} is not declared there (declared: "
                    f"{', '.join(sorted(specs))}); name one of those with {named}, or declare "
                    f"{name!r}"
                )
            else:
                reason = (
                    f"budget {name!r} is named but none is declared there; declare it, or "
                    f"unset {named}"
                )
            raise budget_error(reason)
        ledger = ledger_for(store)
        if ledger is None:
            # A budget kept per client (or per process) would let each spend the whole
            # limit: with no shared store, calls are refused (or let through unmetered
            # with FLUID_BUDGET_FAIL_OPEN=1), never metered apart in silence.
            ledger = NoSharedLedger(_no_store(store, source))
        kwargs.setdefault("fail_open", source.get("FLUID_BUDGET_FAIL_OPEN", "") == "1")
        return cls(specs[name], ledger, **kwargs)

    def spend(
        self,
        provider: str,
        model: str,
        input_tokens: int,
        max_output_tokens: int,
        deadline: float | None,
    ) -> BudgetSpend:
        """One call's spending on one entry of its chain (each attempt reserves again)."""
        return BudgetSpend(self, provider, model, input_tokens, max_output_tokens, deadline)

    def __repr__(self) -> str:
        return f"BudgetGuard({self.spec.name!r}, {self.ledger!r})"


def _no_store(store: CooldownStore | None, env: Mapping[str, str]) -> str:
    """Why a client has no ledger its budget can be shared in, for the refusal."""
    why = getattr(store, "why", None)
    if isinstance(why, str):
        return why
    if store is not None:
        return f"its store {store!r} keeps no budgets"
    url = env.get("FLUID_COOLDOWN_URL", "").strip()
    if url:
        return f"FLUID_COOLDOWN_URL={url} turns the shared store off"
    return "the client's envelope has no shared store (RetryEnvelope(cooldown=None))"


class NoSharedStore(Exception):
    """There is no shared store to keep the budget in (see :class:`NoSharedLedger`)."""


class NoSharedLedger:
    """The ledger of a client with no shared store: every reservation is refused."""

    def __init__(self, why: str) -> None:
        self.why = why

    def reserve(
        self, spec: BudgetSpec, amount: int, hold: str, expires: float, now: float
    ) -> Reservation:
        raise NoSharedStore(self.why)

    def settle(self, name: str, hold: str, amount: int, now: float) -> None:
        return None

    def states(self, now: float) -> list[BudgetState]:
        return []

    def reset(self, name: str) -> bool:
        return False

    def __repr__(self) -> str:
        return f"NoSharedLedger({self.why!r})"


class BudgetSpend:
    """The reservations of one call on one model: reserve per attempt, settle per answer."""

    def __init__(
        self,
        guard: BudgetGuard,
        provider: str,
        model: str,
        input_tokens: int,
        max_output_tokens: int,
        deadline: float | None,
    ) -> None:
        self.guard = guard
        self.provider = provider
        self.model = model
        self.input_tokens = input_tokens
        self.max_output_tokens = max_output_tokens
        self.deadline = deadline
        #: The hold of an attempt whose answer is still arriving (a stream).
        self.open: Hold | None = None

    def worst_case(self) -> int:
        """The attempt's worst case in micro-USD; ``budget.cost_unknown`` without a price."""
        from fluid_build.copilot.call.prices import worst_case_usd

        usd = worst_case_usd(
            self.provider,
            self.model,
            self.input_tokens,
            self.max_output_tokens,
            overrides=self.guard.prices,
        )
        if usd is None:
            name = self.guard.spec.name
            raise _refused(
                f"budget {name}: no price is known for {self.provider}:{self.model}, so the "
                "call cannot be metered; give one with FLUID_PRICES='{\""
                f'{self.model}": {{"input": 0.5, "output": 1.5}}}}\' (USD per million '
                f"tokens) {python_aside('prices')}",
                "budget.cost_unknown",
                False,
                budget=name,
                provider=self.provider,
                model=self.model,
            )
        return max(micro_usd(usd), 1)

    def reserve(self) -> Hold | None:
        """Reserve this attempt's worst case, or raise the refusal; None: unmetered (fail-open)."""
        guard = self.guard
        amount = self.worst_case()
        now = guard.wall()
        expires = now + (self.deadline or 600.0) + guard.margin
        hold = Hold(f"{os.getpid()}-{uuid.uuid4().hex}", amount)
        try:
            done = guard.ledger.reserve(guard.spec, amount, hold.id, expires, now)
        except Exception as exc:  # any store failure is one typed refusal
            if guard.fail_open:
                LOG.warning(
                    "budget %s: %s; FLUID_BUDGET_FAIL_OPEN=1, so this call goes ahead unmetered",
                    guard.spec.name,
                    exc
                    if isinstance(exc, NoSharedStore)
                    else f"the shared store {guard.ledger!r} failed ({type(exc).__name__})",
                )
                return None
            if isinstance(exc, NoSharedStore):
                raise _refused(
                    f"budget {guard.spec.name} cannot be shared: {exc}, so the call was not "
                    "sent; set FLUID_COOLDOWN_URL to a store every process can reach (the "
                    "sqlite file by default, redis://... for a fleet, memory for this process "
                    "alone), or FLUID_BUDGET_FAIL_OPEN=1 to spend unmetered",
                    "budget.store_unavailable",
                    False,  # a setting, not a passing fault: asking again changes nothing
                    budget=guard.spec.name,
                    variable="FLUID_COOLDOWN_URL",
                ) from None
            raise _refused(
                f"budget {guard.spec.name}: the shared store {guard.ledger!r} cannot be reached "
                f"({type(exc).__name__}), so the call was not sent; check FLUID_COOLDOWN_URL "
                "and run again, or set FLUID_BUDGET_FAIL_OPEN=1 to spend unmetered meanwhile",
                "budget.store_unavailable",
                True,
                budget=guard.spec.name,
            ) from exc
        if not done.granted:
            raise self._exhausted(done.state, amount, now)
        return hold

    def _exhausted(self, state: BudgetState, amount: int, now: float) -> AgentExecutionError:
        name = self.guard.spec.name
        retry_after = None
        if state.ends is not None:
            retry_after = max(state.ends - now, 0.0)
            at = datetime.fromtimestamp(state.ends, UTC).strftime("%Y-%m-%d %H:%M UTC")
            when = f"; the budget starts again at {at}"
        else:
            when = f"; it lasts until `fluid doctor --reset --budget {name}`"
        window = f"/{state.window}" if state.window else ""
        where = (
            f"{usd_text(state.spent)} spent and {usd_text(state.reserved)} reserved by calls "
            f"in flight, of {usd_text(state.limit)}{window}"
        )
        if state.left:
            what = f"budget {name} has {usd_text(state.left)} left ({where})"
        else:
            what = f"budget {name} has nothing left ({where})"
        fits = self._fitting_output(state.left)
        if fits is not None:
            less = (
                f"at most {fits:,} output tokens fit in what is left: ask for them with "
                f"--max-output-tokens {fits} {python_aside('max_output_tokens')}, or use a "
                "cheaper model (--model)"
            )
        else:
            less = "not even a one-token answer fits in what is left: use a cheaper model (--model)"
        return _refused(
            f"{what}, and this call to {self.provider}:{self.model} would reserve up to "
            f"{usd_text(amount)} ({self.input_tokens:,} input tokens and up to "
            f"{self.max_output_tokens:,} output tokens, priced), more than is left; no request "
            f"was sent{when}; {less}",
            "budget.cost_exhausted",
            False,
            retry_after=retry_after,
            budget=name,
            spent_usd=state.spent / MICRO,
            reserved_usd=state.reserved / MICRO,
            limit_usd=state.limit / MICRO,
            left_usd=state.left / MICRO,
            needed_usd=amount / MICRO,
            input_tokens=self.input_tokens,
            max_output_tokens=self.max_output_tokens,
            fitting_max_output_tokens=fits,
            window_end=state.ends,
        )

    def _fitting_output(self, left: int) -> int | None:
        """The largest output cap whose worst case fits in ``left`` micro-USD (None: none
        does). For a given prompt the worst case is linear in output tokens, so one division
        finds it; each candidate is priced again, and a step either way covers the rounding
        up to whole micro-USD."""
        from fluid_build.copilot.call.prices import worst_case_usd

        def cost(out: int) -> int | None:
            usd = worst_case_usd(
                self.provider, self.model, self.input_tokens, out, overrides=self.guard.prices
            )
            return None if usd is None else max(micro_usd(usd), 1)

        base, one = cost(0), cost(1_000_000)
        if base is None or one is None or one <= base or base >= left:
            return None
        most = self.max_output_tokens - 1  # the cap asked for does not fit
        guess = (left - base) * 1_000_000 // (one - base)
        for tried in (guess + 1, guess, guess - 1, guess * 9 // 10):
            out = min(tried, most)
            spent = cost(out) if out >= 1 else None
            if spent is not None and spent <= left:
                return out
        return None

    def settle(self, hold: Hold | None, usd: float | None) -> float | None:
        """Replace ``hold`` by what was spent: ``usd``, or the whole hold when unknown.

        Returns the USD counted (None: no hold, the call went unmetered)."""
        if hold is None:
            return None
        amount = hold.amount if usd is None else micro_usd(usd)
        if amount > hold.amount:
            # The request carried the output cap the hold priced: an answer dearer than
            # that is a report no bill can match, and the limit holds whatever it says.
            LOG.warning(
                "budget %s: %s:%s reported usage costing %s, more than the %s reserved for "
                "it; %s is counted",
                self.guard.spec.name,
                self.provider,
                self.model,
                usd_text(amount),
                usd_text(hold.amount),
                usd_text(hold.amount),
            )
            amount = hold.amount
        try:
            self.guard.ledger.settle(self.guard.spec.name, hold.id, amount, self.guard.wall())
        except Exception as exc:  # noqa: BLE001 - the answer is here; its spend is logged
            LOG.warning(
                "budget %s: could not record %s spent in %r (%s); the reservation ends by "
                "itself within %s s",
                self.guard.spec.name,
                usd_text(amount),
                self.guard.ledger,
                type(exc).__name__,
                f"{(self.deadline or 600.0) + self.guard.margin:g}",
            )
        return amount / MICRO

    def priced(self, usage: Usage | None, answered_model: str | None) -> float | None:
        """What ``usage`` cost (None: no usage to price, or none a model could have used)."""
        if usage is None or not (usage.input_tokens or usage.output_tokens):
            return None
        from fluid_build.copilot.call.prices import price_call, sane_usage

        if not sane_usage(usage) or usage.output_tokens > self.max_output_tokens:
            # Past the cap the request carried, or no count at all: unknown, so the whole
            # reservation is spent (settle() says so with both figures when it is dearer).
            LOG.warning(
                "budget %s: %s:%s reported %s input and %s output tokens, which no answer "
                "capped at %s output tokens can use; the whole reservation is counted",
                self.guard.spec.name,
                self.provider,
                self.model,
                _count_text(usage.input_tokens),
                _count_text(usage.output_tokens),
                self.max_output_tokens,
            )
            return None

        return price_call(
            self.provider,
            self.model,
            usage,
            answered_model=answered_model,
            overrides=self.guard.prices,
        )

    # -- the envelope's hooks (see RetryEnvelope.plan's ``spend``) ------------------------

    def succeeded(self, hold: Hold | None, result: object) -> None:
        """An attempt answered: settle to its price, or keep a stream's hold open."""
        parsed = result[0] if isinstance(result, tuple) and result else result
        usage = getattr(parsed, "usage", None)
        if usage is None:  # a stream's opening: settled by finish() when it ends
            self.open = hold
            return
        self.settle(hold, self.priced(usage, getattr(parsed, "model", None)))

    def failed(self, hold: Hold | None, exc: BaseException, *, sent: bool = True) -> float | None:
        """An attempt failed: one that sent nothing, an error answer or a refused
        connection spent nothing; any other failure after sending may have been billed,
        so its hold is spent. Returns the USD counted (None: unmetered)."""
        return self.settle(hold, 0.0 if not sent or nothing_billed(exc) else None)

    def finish(self, usage: Usage | None, answered_model: str | None = None) -> float | None:
        """A stream ended (whole or broken): settle what its usage said, else its whole hold.
        Returns the USD counted, as :meth:`settle` does."""
        hold, self.open = self.open, None
        return self.settle(hold, self.priced(usage, answered_model))


def _count_text(count: object) -> str:
    """A token count as a log line can show it, however absurd (10**400 is no float)."""
    text = repr(count)
    return text if len(text) <= 20 else f"a {len(text)}-character number"


def nothing_billed(exc: BaseException) -> bool:
    """Whether a failed attempt cost nothing: an error answer (4xx/5xx), or no connection."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return False
        status = getattr(seen, "status_code", None)
        if status is None:  # httpx.HTTPStatusError keeps the answer, not its status
            status = getattr(getattr(seen, "response", None), "status_code", None)
        if isinstance(status, int) and status >= 400:
            return True
        if type(seen).__name__ in ("ConnectError", "ConnectTimeout"):
            return True
        seen = seen.__cause__
    return False
