"""What the shared store holds, key by key, and how to clear it: ``fluid doctor``'s view.

Each key (provider + endpoint + API key fingerprint + model) may have a
cooldown window (from a Retry-After), a circuit breaker (failure count,
open window, half-open window, trial lease) and a rate-limit budget (what the
provider announced is left, and the operator's own limits). :func:`read_health` lists them
with since when, until when, why and who holds a trial; :func:`reset_health`
clears them, for every process that shares the store.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

from fluid_build.copilot.agents.errors import MAX_RETRY_AFTER
from fluid_build.copilot.health.breaker import FAILS, HALF, OPEN, TRIAL
from fluid_build.copilot.health.keys import COOLDOWN, CooldownKey
from fluid_build.copilot.health.ratelimit import (
    OWN_REQUESTS,
    OWN_TOKENS,
    REQUESTS,
    TOKENS,
    WINDOW,
)
from fluid_build.copilot.health.store import CooldownStore, StoreEntry, trusted

if TYPE_CHECKING:
    from fluid_build.copilot.health.breaker import CircuitBreaker

__all__ = [
    "KeyHealth",
    "clear_health",
    "entry_caps",
    "entry_reports",
    "read_health",
    "reset_health",
]

# The budget's entries, by the name doctor gives them.
_BUDGETS = {
    REQUESTS: "requests",
    TOKENS: "tokens",
    OWN_REQUESTS: "own_requests",
    OWN_TOKENS: "own_tokens",
}
_KINDS = (COOLDOWN, FAILS, OPEN, HALF, TRIAL, *_BUDGETS)


@dataclass(frozen=True, slots=True)
class KeyHealth:
    """One key's shared state. Times are wall-clock seconds (``time.time()``)."""

    key: str
    provider: str
    endpoint: str
    fingerprint: str
    model: str
    breaker: Literal["closed", "open", "half_open"] = "closed"
    failures: int = 0
    since: float | None = None  # when the breaker opened, or the first failure counted
    until: float | None = None  # open: half-opens then; half-open: closes by itself then
    reason: str | None = None  # the code of the last failure
    trial_owner: str | None = None
    trial_until: float | None = None
    cooldown_since: float | None = None
    cooldown_until: float | None = None
    cooldown_reason: str | None = None
    #: The rate-limit budgets left (``requests``, ``tokens``, ``own_requests``,
    #: ``own_tokens``), each ``{"remaining": n, "until": wall-clock reset}``.
    rate_limits: dict[str, dict[str, float]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _split(name: str) -> tuple[str, str] | None:
    for kind in _KINDS:
        if name.startswith(kind):
            return kind, name[len(kind) :]
    return None


def entry_caps(breaker: CircuitBreaker | None = None) -> dict[str, float]:
    """The longest each kind of entry lasts as a call trusts it, in seconds.

    A window read back longer than this (a skewed clock, a planted value) is cut
    down to it by every call (:func:`trusted`), so ``fluid doctor`` shows it so.
    Without ``breaker``, the longest its settings allow.
    """
    cool_off = breaker.cool_off if breaker is not None else 3600.0
    window = breaker.window if breaker is not None else 3600.0
    lease = breaker.lease_ttl() if breaker is not None else 3605.0
    return {
        COOLDOWN: MAX_RETRY_AFTER,
        FAILS: window,
        OPEN: cool_off,
        HALF: cool_off + window,
        TRIAL: lease,
        REQUESTS: MAX_RETRY_AFTER,
        TOKENS: MAX_RETRY_AFTER,
        OWN_REQUESTS: WINDOW,
        OWN_TOKENS: WINDOW,
    }


def read_health(
    store: CooldownStore, now: float, caps: Mapping[str, float] | None = None
) -> list[KeyHealth]:
    """Every key with live shared state, sorted by key; each end capped as calls trust it."""
    caps = entry_caps() if caps is None else caps
    grouped: dict[str, dict[str, StoreEntry]] = {}
    for entry in store.entries(now):
        split = _split(entry.key)
        if split is not None:
            cap = caps.get(split[0])
            if cap is not None and entry.until > now + cap:
                entry = replace(entry, until=now + cap)
            grouped.setdefault(split[1], {})[split[0]] = entry
    out: list[KeyHealth] = []
    for key, kinds in sorted(grouped.items()):
        parsed = CooldownKey.parse(key) or CooldownKey("?", "?", key, "?")
        fields: dict[str, Any] = {}
        fails = kinds.get(FAILS)
        if fails is not None:
            fields.update(failures=fails.count, since=fails.since, reason=fails.note or None)
        opened = kinds.get(OPEN)
        half = kinds.get(HALF)
        if opened is not None:
            fields.update(breaker="open", since=opened.since, until=opened.until)
            fields["reason"] = opened.note or fields.get("reason")
        elif half is not None:
            fields.update(breaker="half_open", since=half.since, until=half.until)
            fields["reason"] = half.note or fields.get("reason")
        trial = kinds.get(TRIAL)
        if trial is not None:
            fields.update(trial_owner=trial.owner, trial_until=trial.until)
        window = kinds.get(COOLDOWN)
        if window is not None:
            fields.update(
                cooldown_since=window.since,
                cooldown_until=window.until,
                cooldown_reason=window.note or None,
            )
        budgets = {
            name: {"remaining": kinds[kind].count, "until": kinds[kind].until}
            for kind, name in _BUDGETS.items()
            if kind in kinds
        }
        if budgets:
            fields["rate_limits"] = budgets
        out.append(
            KeyHealth(
                key, parsed.provider, parsed.endpoint, parsed.fingerprint, parsed.model, **fields
            )
        )
    return out


def entry_reports(
    entries: Iterable[tuple[str, str, Any]],
    breaker: CircuitBreaker | None,
    store: CooldownStore | None,
    cap: float,
    now: float,
) -> list[dict[str, Any]]:
    """``LLMClient.health()``: per entry (label, key, sticky last error), its breaker and cooldown.

    The cooldown left is read as every process trusts it: a window read back
    from the store is capped at ``cap`` (the Retry-After cap).
    """
    out: list[dict[str, Any]] = []
    for label, key, last_error in entries:
        report: dict[str, Any] = {
            "entry": label,
            "key": key,
            "breaker": None,
            "failures": 0,
            "cooldown_remaining": 0.0,
            "last_error": last_error,
        }
        if breaker is not None:
            state = breaker.state(key)
            report.update(
                breaker=state.state,
                failures=state.failures,
                opens_in=round(state.opens_for, 3),
                since=state.since,
                until=state.until,
                reason=state.reason,
                trial_owner=state.trial_owner,
            )
        if store is not None:
            left = store.remaining(COOLDOWN + key, now)
            report["cooldown_remaining"] = round(trusted(store, COOLDOWN + key, left, cap, now), 3)
        out.append(report)
    return out


def reset_health(
    store: CooldownStore,
    *,
    provider: str | None = None,
    model: str | None = None,
    endpoint: str | None = None,
) -> int:
    """Clear breakers, cooldowns and rate-limit budgets: all, or the keys matching every filter.

    Returns how many store entries were removed. With no filter the whole
    store is emptied, including entries an older fluid_build left behind.
    """
    return clear_health(store, provider=provider, model=model, endpoint=endpoint)[0]


def clear_health(
    store: CooldownStore,
    *,
    provider: str | None = None,
    model: str | None = None,
    endpoint: str | None = None,
    now: float | None = None,
) -> tuple[int, int]:
    """:func:`reset_health`, returning ``(entries removed, keys)``.

    ``keys`` counts the keys that had live state at ``now``: the keys ``fluid
    doctor`` listed (one key holds up to nine entries: its breaker's four, its
    cooldown, its four budgets).
    """
    import time

    now = time.time() if now is None else now
    if provider is None and model is None and endpoint is None:
        keys = {split[1] for e in store.entries(now) if (split := _split(e.key)) is not None}
        return store.clear(), len(keys)
    from fluid_build.copilot.health.keys import normalize_endpoint

    wanted_endpoint = normalize_endpoint(endpoint) if endpoint else None
    doomed: list[str] = []
    live: set[str] = set()
    for entry in store.entries(-1.0):  # ended entries too: nothing matching is left
        split = _split(entry.key)
        parsed = CooldownKey.parse(split[1]) if split is not None else None
        if split is None or parsed is None:
            continue
        if provider is not None and parsed.provider != provider:
            continue
        if model is not None and parsed.model != model:
            continue
        if wanted_endpoint is not None and parsed.endpoint != wanted_endpoint:
            continue
        doomed.append(entry.key)
        if entry.until > now:
            live.add(split[1])
    if doomed:
        store.delete(*doomed)
    return len(doomed), len(live)
