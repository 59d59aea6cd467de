"""Budgets in USD that every process on one shared store spends from.

``FLUID_BUDGETS="team=25usd/day; ci=5usd"`` declares budgets; a client spends
from the one ``LLMClient(budget="team")`` or ``FLUID_BUDGET=team`` names. The
ledger of each budget (what is spent, what live reservations hold) is kept in
the shared store, apart from its cooldown entries: a budget lasts a month or
until reset, so the stores' one-day sanity cap and entry cap must not touch it.

Before each attempt a call reserves its worst case with one atomic take
(:meth:`BudgetLedger.reserve`); after the answer the reservation is settled to
the real cost (:meth:`BudgetLedger.settle`). A reservation whose process died
ends by itself at its call's deadline plus :data:`HOLD_MARGIN`. Amounts are
integer micro-USD, rounded up, so no float drift adds up across a fleet.
See docs/budgets.md.
"""

from __future__ import annotations

import calendar
import logging
import math
import os
import re
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol

from fluid_build.copilot.agents.errors import AgentExecutionError, ProviderError, python_aside
from fluid_build.copilot.health.store import MOST

if TYPE_CHECKING:
    from fluid_build.copilot.call.prices import Prices
    from fluid_build.copilot.health.store import CooldownStore
    from fluid_build.copilot.llm.types import Usage

__all__ = [
    "BUDGETS_EXAMPLE",
    "HOLD_MARGIN",
    "MICRO",
    "BudgetGuard",
    "BudgetLedger",
    "BudgetSpec",
    "BudgetSpend",
    "BudgetState",
    "Hold",
    "MemoryBudgetLedger",
    "Reservation",
    "budget_error",
    "budgets_from_env",
    "ledger_for",
    "micro_usd",
    "parse_budgets",
    "window_end",
]

LOG = logging.getLogger("fluid_build.budget")

#: Micro-USD per USD: every amount a ledger keeps is a whole number of these.
MICRO: Final = 1_000_000
#: Seconds past its call's deadline a reservation outlives a process that died holding it.
HOLD_MARGIN: Final = 60.0
BUDGETS_EXAMPLE: Final = "team=25usd/day; ci=5usd"

Window = Literal["", "hour", "day", "month"]
_NAME: Final = re.compile(r"[A-Za-z0-9_.-]+")
_ENTRY: Final = re.compile(
    r"^\s*(?P<name>[^=\s]+)\s*=\s*(?P<amount>[0-9]+(?:\.[0-9]+)?)\s*usd"
    r"\s*(?:/\s*(?P<window>hour|day|month))?\s*$",
    re.IGNORECASE,
)


def micro_usd(usd: float) -> int:
    """``usd`` as whole micro-USD, rounded up (a fraction of a micro-USD is still spent)."""
    if not math.isfinite(usd) or usd <= 0:
        return 0
    # Rounded to a millionth of a micro-USD first: 0.0012000000000000001 (float noise
    # from a price sum) is 1200, not 1201.
    return min(math.ceil(round(Decimal(repr(usd)) * MICRO, 6)), MOST)


def _usd(micro: int) -> str:
    return f"{micro / MICRO:.6f}".rstrip("0").rstrip(".") + " USD" if micro else "0 USD"


@dataclass(frozen=True, slots=True)
class BudgetSpec:
    """One declared budget: its limit in micro-USD and its window ("" lives until reset)."""

    name: str
    limit: int
    window: Window = ""


def budget_error(reason: str, variable: str = "FLUID_BUDGETS") -> ProviderError:
    """``llm.not_configured`` for a budget setting that cannot be used, with an example."""
    return ProviderError(
        f"{variable} cannot be used ({reason}); declare budgets as "
        f"{variable}='{BUDGETS_EXAMPLE}' (NAME=AMOUNTusd[/hour|/day|/month], names "
        "[A-Za-z0-9_.-]+, separated by ;)",
        code="llm.not_configured",
        retryable=False,
        details={"variable": variable, "example": BUDGETS_EXAMPLE},
    )


def parse_budgets(text: str, variable: str = "FLUID_BUDGETS") -> dict[str, BudgetSpec]:
    """The budgets ``text`` declares; :func:`budget_error` for anything malformed."""
    specs: dict[str, BudgetSpec] = {}
    for part in text.split(";"):
        if not part.strip():
            continue
        match = _ENTRY.match(part)
        if match is None:
            raise budget_error(f"{part.strip()!r} is not NAME=AMOUNTusd[/window]", variable)
        name = match["name"]
        if not _NAME.fullmatch(name):
            raise budget_error(f"budget name {name!r} is not [A-Za-z0-9_.-]+", variable)
        if name in specs:
            raise budget_error(f"budget {name!r} is declared twice", variable)
        limit = math.ceil(Decimal(match["amount"]) * MICRO)
        if limit <= 0 or limit > MOST:
            raise budget_error(f"budget {name!r} must be above 0 and at most 1e9 USD", variable)
        window: Window = (match["window"] or "").lower()  # type: ignore[assignment]
        specs[name] = BudgetSpec(name, limit, window)
    return specs


def budgets_from_env(env: Mapping[str, str] | None = None) -> dict[str, BudgetSpec]:
    """``FLUID_BUDGETS``, parsed (empty when unset)."""
    source = os.environ if env is None else env
    return parse_budgets(source.get("FLUID_BUDGETS", ""))


def window_end(window: Window, now: float) -> float | None:
    """When the window holding ``now`` ends on the UTC calendar; None for no window."""
    if not window:
        return None
    at = datetime.fromtimestamp(now, UTC)
    if window == "hour":
        start = at.replace(minute=0, second=0, microsecond=0)
        return start.timestamp() + 3600.0
    if window == "day":
        start = at.replace(hour=0, minute=0, second=0, microsecond=0)
        return start.timestamp() + 86_400.0
    days = calendar.monthrange(at.year, at.month)[1]
    start = at.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    return start.timestamp() + days * 86_400.0


# -- the ledger ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BudgetState:
    """A budget as a ledger holds it; amounts in micro-USD, ``ends`` in wall-clock seconds."""

    name: str
    limit: int
    spent: int
    reserved: int
    window: str = ""
    ends: float | None = None

    @property
    def left(self) -> int:
        return max(self.limit - self.spent - self.reserved, 0)


@dataclass(frozen=True, slots=True)
class Reservation:
    """What one reserve did: granted or not, and the budget as it was then."""

    granted: bool
    state: BudgetState


@dataclass(slots=True)
class _Book:
    """One budget's record, the same in every ledger: the rules live in :func:`_reserve`."""

    limit: int
    window: str
    ends: float | None
    spent: int = 0
    holds: dict[str, tuple[int, float]] = field(default_factory=dict)

    def roll(self, spec_window: str, now: float) -> None:
        """Start a new window once the last one ended (or the declared window changed)."""
        if self.window != spec_window:
            self.window = spec_window
            self.ends = window_end(spec_window, now)  # type: ignore[arg-type]
        elif self.ends is not None and now >= self.ends:
            self.spent = 0
            self.ends = window_end(spec_window, now)  # type: ignore[arg-type]
        # A dead process's reservation ends by itself.
        self.holds = {k: v for k, v in self.holds.items() if v[1] > now}

    def state(self, name: str) -> BudgetState:
        reserved = sum(amount for amount, _ in self.holds.values())
        return BudgetState(name, self.limit, self.spent, reserved, self.window, self.ends)


def _reserve(
    book: _Book | None, spec: BudgetSpec, amount: int, hold: str, expires: float, now: float
) -> tuple[_Book, bool]:
    if book is None:
        book = _Book(spec.limit, spec.window, window_end(spec.window, now))
    book.limit = spec.limit  # the last declaration wins
    book.roll(spec.window, now)
    reserved = sum(a for a, _ in book.holds.values())
    if book.spent + reserved + amount > book.limit:
        return book, False
    book.holds[hold] = (amount, expires)
    return book, True


def _settle(book: _Book | None, hold: str, amount: int, now: float) -> _Book | None:
    if book is None:  # reset meanwhile: this spend counts from the reset
        return None
    book.roll(book.window, now)
    book.holds.pop(hold, None)
    book.spent = min(book.spent + max(amount, 0), MOST)
    return book


class BudgetLedger(Protocol):
    """Where budgets are kept: every method is atomic across the processes sharing it."""

    def reserve(
        self, spec: BudgetSpec, amount: int, hold: str, expires: float, now: float
    ) -> Reservation:
        """Hold ``amount`` under ``hold`` until ``expires`` if it fits in what is left."""
        ...

    def settle(self, name: str, hold: str, amount: int, now: float) -> None:
        """Replace ``hold`` by ``amount`` spent (0: nothing was spent)."""
        ...

    def states(self, now: float) -> list[BudgetState]:
        """Every budget, for ``fluid doctor``."""
        ...

    def reset(self, name: str) -> bool:
        """Forget ``name``'s spend and reservations; whether there was any."""
        ...


class MemoryBudgetLedger:
    """Budgets in a dict: shared by the threads and tasks of one process."""

    def __init__(self) -> None:
        self._books: dict[str, _Book] = {}
        self._lock = threading.Lock()

    def reserve(
        self, spec: BudgetSpec, amount: int, hold: str, expires: float, now: float
    ) -> Reservation:
        with self._lock:
            book, granted = _reserve(self._books.get(spec.name), spec, amount, hold, expires, now)
            self._books[spec.name] = book
            return Reservation(granted, book.state(spec.name))

    def settle(self, name: str, hold: str, amount: int, now: float) -> None:
        with self._lock:
            _settle(self._books.get(name), hold, amount, now)

    def states(self, now: float) -> list[BudgetState]:
        with self._lock:
            for book in self._books.values():
                book.roll(book.window, now)
            return [self._books[name].state(name) for name in sorted(self._books)]

    def reset(self, name: str) -> bool:
        with self._lock:
            return self._books.pop(name, None) is not None

    def __repr__(self) -> str:
        return "MemoryBudgetLedger()"


def ledger_for(store: CooldownStore | None) -> BudgetLedger | None:
    """The ledger kept beside ``store`` (the primary of a resilient one); None without one."""
    if store is None:
        return None
    ledger = getattr(store, "budget_ledger", None)
    return ledger() if callable(ledger) else None


# -- spending ----------------------------------------------------------------------------


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
            declared = ", ".join(sorted(specs)) or "none"
            raise budget_error(
                f"budget {name!r} is not declared there (declared: {declared}); the client "
                "names it with budget= or FLUID_BUDGET"
            )
        ledger = ledger_for(store)
        if ledger is None:
            ledger = MemoryBudgetLedger()
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
                    "budget %s: the shared store %r failed (%s); FLUID_BUDGET_FAIL_OPEN=1, so "
                    "this call goes ahead unmetered",
                    guard.spec.name,
                    guard.ledger,
                    type(exc).__name__,
                )
                return None
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
        when = ""
        retry_after = None
        if state.ends is not None:
            retry_after = max(state.ends - now, 0.0)
            at = datetime.fromtimestamp(state.ends, UTC).strftime("%Y-%m-%d %H:%M UTC")
            when = f"; it resets at {at}"
        else:
            when = f"; it lasts until `fluid doctor --reset --budget {name}`"
        return _refused(
            f"budget {name} is spent: {_usd(state.spent)} spent and {_usd(state.reserved)} "
            f"reserved of {_usd(state.limit)}, {_usd(state.left)} left, and this call to "
            f"{self.provider}:{self.model} needs up to {_usd(amount)}; no request was sent"
            f"{when}; ask for a shorter answer or use a cheaper model (--model)",
            "budget.cost_exhausted",
            False,
            retry_after=retry_after,
            budget=name,
            spent_usd=state.spent / MICRO,
            reserved_usd=state.reserved / MICRO,
            limit_usd=state.limit / MICRO,
            needed_usd=amount / MICRO,
            window_end=state.ends,
        )

    def settle(self, hold: Hold | None, usd: float | None) -> None:
        """Replace ``hold`` by what was spent: ``usd``, or the whole hold when unknown."""
        if hold is None:
            return
        amount = hold.amount if usd is None else micro_usd(usd)
        try:
            self.guard.ledger.settle(self.guard.spec.name, hold.id, amount, self.guard.wall())
        except Exception as exc:  # noqa: BLE001 - the answer is here; its spend is logged
            LOG.warning(
                "budget %s: could not record %s spent in %r (%s); the reservation ends by "
                "itself within %s s",
                self.guard.spec.name,
                _usd(amount),
                self.guard.ledger,
                type(exc).__name__,
                f"{(self.deadline or 600.0) + self.guard.margin:g}",
            )

    def priced(self, usage: Usage | None, answered_model: str | None) -> float | None:
        """What ``usage`` cost (None: no usage to price)."""
        if usage is None or not (usage.input_tokens or usage.output_tokens):
            return None
        from fluid_build.copilot.call.prices import price_call

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

    def failed(self, hold: Hold | None, exc: BaseException) -> None:
        """An attempt failed: an error answer or a refused connection spent nothing;
        any other failure after sending may have been billed, so its hold is spent."""
        self.settle(hold, 0.0 if _nothing_billed(exc) else None)

    def finish(self, usage: Usage | None, answered_model: str | None = None) -> None:
        """A stream ended (whole or broken): settle what its usage said, else its whole hold."""
        hold, self.open = self.open, None
        self.settle(hold, self.priced(usage, answered_model))


def _nothing_billed(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return False
        if getattr(seen, "status_code", None) is not None:
            return True
        if type(seen).__name__ in ("ConnectError", "ConnectTimeout"):
            return True
        seen = seen.__cause__
    return False
