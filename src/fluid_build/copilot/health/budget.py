"""Budgets in USD that every process on one shared store spends from.

``FLUID_BUDGETS="team=25usd/day; ci=5usd"`` declares budgets; a client spends
from the one ``LLMClient(budget="team")`` or ``FLUID_BUDGET=team`` names. The
ledger of each budget (what is spent, what live reservations hold) is kept in
the shared store, apart from its cooldown entries: a budget lasts a month or
until reset, so the stores' one-day sanity cap and entry cap must not touch it.

Before each attempt a call reserves its worst case with one atomic take
(:meth:`BudgetLedger.reserve`); after the answer the reservation is settled to
the real cost (:meth:`BudgetLedger.settle`). A reservation whose process died
ends by itself at its call's deadline plus :data:`HOLD_MARGIN`, spent whole: its
request may have been billed. Amounts are
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
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Final, Literal, Protocol

from fluid_build.copilot.agents.errors import ProviderError
from fluid_build.copilot.health.store import MOST, MemoryCooldownStore, StandInCooldownStore

if TYPE_CHECKING:
    from fluid_build.copilot.health.store import CooldownStore

__all__ = [
    "BUDGETS_EXAMPLE",
    "HOLD_MARGIN",
    "IDLE_FORGET",
    "MICRO",
    "PROCESS_LEDGER",
    "USD_PLACES",
    "BudgetLedger",
    "BudgetSpec",
    "BudgetState",
    "MemoryBudgetLedger",
    "Reservation",
    "budget_error",
    "budgets_from_env",
    "ledger_for",
    "micro_usd",
    "parse_budgets",
    "usd_amount",
    "usd_json",
    "usd_text",
    "window_end",
]

LOG = logging.getLogger("fluid_build.budget")

#: Micro-USD per USD: every amount a ledger keeps is a whole number of these.
MICRO: Final = 1_000_000
#: Seconds past its call's deadline a reservation outlives a process that died holding it.
HOLD_MARGIN: Final = 60.0
#: Seconds after which a shared store forgets a budget no call has reserved from (90 days):
#: nothing a store keeps lives forever. A windowed budget goes a day after its window ends.
IDLE_FORGET: Final = 90 * 86_400.0
BUDGETS_EXAMPLE: Final = "team=25usd/day; ci=5usd"

Window = Literal["", "hour", "day", "month"]
_NAME: Final = re.compile(r"[A-Za-z0-9_.-]+")
# Read loosely (a sign, any unit, any window), so each mistake gets its own message.
_ENTRY: Final = re.compile(
    r"^\s*(?P<name>[^=\s]+)\s*=\s*(?P<amount>[-+]?[0-9]*\.?[0-9]+)\s*(?P<unit>[^\s/0-9.]*)"
    r"\s*(?:/\s*(?P<window>\S*))?\s*$",
)
_WINDOWS: Final = ("hour", "day", "month")


def micro_usd(usd: float) -> int:
    """``usd`` as whole micro-USD, rounded up (a fraction of a micro-USD is still spent)."""
    if not math.isfinite(usd) or usd <= 0:
        return 0
    if usd >= MOST / MICRO:  # past any ledger (and past Decimal's 28 digits when rounded)
        return MOST
    # Rounded to a millionth of a micro-USD first: 0.0012000000000000001 (float noise
    # from a price sum) is 1200, not 1201.
    return min(math.ceil(round(Decimal(repr(usd)) * MICRO, 6)), MOST)


#: Decimal places every USD amount is shown and written with (nano-USD): a float sum of
#: prices (``1.2499999999999999e-05``) reads as the amount it is (``0.0000125``).
USD_PLACES: Final = 9


def usd_amount(usd: float) -> str:
    """``usd`` as people read it, no exponent: ``0.0000125``, ``25``, ``0.1``.

    Rounded to :data:`USD_PLACES` places; an amount above 0 that rounds to 0 reads
    as under a nano-USD, never as free."""
    if not math.isfinite(usd):
        return repr(usd)
    rounded = round(Decimal(repr(usd)), USD_PLACES)
    if not rounded and usd > 0:
        return f"under {Decimal(1).scaleb(-USD_PLACES):f}"
    text = f"{rounded:f}"
    text = text.rstrip("0").rstrip(".") if "." in text else text
    return "0" if text in ("-0", "") else text


def usd_text(micro: int) -> str:
    """``micro`` micro-USD as people read it: ``0.0016 USD`` (see :func:`usd_amount`)."""
    return f"{usd_amount(micro / MICRO)} USD"


def usd_json(usd: float | None) -> float | None:
    """``usd`` as fluid writes it in JSON: rounded to :data:`USD_PLACES` places (None stays)."""
    if usd is None or not math.isfinite(usd):
        return None
    return round(usd, USD_PLACES)


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
        name, unit, window = match["name"], match["unit"], match["window"]
        if not _NAME.fullmatch(name):
            raise budget_error(f"budget name {name!r} is not [A-Za-z0-9_.-]+", variable)
        if name in specs:
            raise budget_error(f"budget {name!r} is declared twice", variable)
        if unit.lower() != "usd":
            said = f"is in {unit!r}" if unit else "has no currency"
            raise budget_error(
                f"budget {name!r} {said}: budgets are in USD only, e.g. "
                f"{name}={match['amount'].lstrip('+-')}usd",
                variable,
            )
        amount = Decimal(match["amount"])
        limit = math.ceil(amount * MICRO)
        if limit <= 0 or limit > MOST:
            raise budget_error(
                f"budget {name!r} is {match['amount']} USD: it must be above 0 and at most "
                "1000000000 USD",
                variable,
            )
        if window is not None and window.lower() not in _WINDOWS:
            raise budget_error(
                f"budget {name!r} has the window {'/' + window!r}: it must be /hour, /day or "
                "/month, or none (until reset)",
                variable,
            )
        specs[name] = BudgetSpec(name, limit, (window or "").lower())  # type: ignore[arg-type]
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
        # A dead process's reservation ends by itself, spent: its request may have been
        # billed, and nobody is left to say what it cost.
        ended = [k for k, (_, expires) in self.holds.items() if expires <= now]
        for hold in ended:
            self.spent = min(self.spent + self.holds.pop(hold)[0], MOST)

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
    live = book.holds.pop(hold, None)
    book.roll(book.window, now)
    if live is None:
        # Gone: it outlived its call and was counted whole when it ended (or the budget
        # was reset since); counting it again would spend it twice.
        return book
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


#: The budgets of every process-local (``memory``) store in this process: one ledger,
#: whichever client or store reads it, so two clients never each spend the whole limit.
PROCESS_LEDGER: Final = MemoryBudgetLedger()


def ledger_for(store: CooldownStore | None) -> BudgetLedger | None:
    """The ledger kept beside ``store`` (the primary of a resilient one); None where no
    budget can be kept: no store, a store standing in for one that cannot be used, or a
    store that keeps no budgets."""
    if store is None or isinstance(store, StandInCooldownStore):
        return None
    if isinstance(store, MemoryCooldownStore):
        return PROCESS_LEDGER
    ledger = getattr(store, "budget_ledger", None)
    return ledger() if callable(ledger) else None
