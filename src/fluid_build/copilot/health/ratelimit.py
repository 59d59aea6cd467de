"""The rate-limit budget: what a provider says is left, shared so no call is sent to a 429.

OpenAI, Azure and Groq announce their budget on every answer
(``x-ratelimit-limit-*``, ``-remaining-*``, ``-reset-*`` for requests and
tokens), Anthropic too (``anthropic-ratelimit-{requests,tokens,input-tokens,
output-tokens}-{limit,remaining,reset}``). :class:`RateBudget` reads them (garbage
gives nothing, never an exception); :class:`RateLimiter` keeps what is left in the
shared store, per key, ending at the announced reset, and takes one request and
the call's estimated tokens from it before each attempt: a call that does not
fit waits for the reset instead of coming back 429. Operators can set their own
limits per provider or model (``FLUID_RATE_LIMITS``), which need no header.

The store keeps four kinds of entry per key, each ending by itself:
``ratelimit-requests:`` and ``ratelimit-tokens:`` (announced), and
``ratelimit-own-requests:`` and ``ratelimit-own-tokens:`` (the operator's, per minute).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import httpx

from fluid_build._redact import redact, truncate
from fluid_build.copilot.agents.errors import MAX_RETRY_AFTER, ProviderError, RateLimitError
from fluid_build.copilot.health.keys import CooldownKey
from fluid_build.copilot.health.resilient import reset_keys
from fluid_build.copilot.health.store import MAX_ENTRIES, CooldownStore, trusted

if TYPE_CHECKING:
    from fluid_build.copilot.agents.error_answers import HeadersLike

__all__ = [
    "KINDS",
    "OWN_REQUESTS",
    "OWN_TOKENS",
    "RATE_LIMITS_ENV",
    "REQUESTS",
    "TOKENS",
    "Limit",
    "OwnLimit",
    "RateBudget",
    "RateLimiter",
    "estimate_tokens",
    "parse_rate_limits",
]

#: The operator's own limits, or ``off`` to turn the budget off (see docs/retry-envelope.md).
RATE_LIMITS_ENV: Final = "FLUID_RATE_LIMITS"
_EXAMPLE: Final = "openai/gpt-4o-mini=500rpm,200000tpm; anthropic=50rpm"
_OFF: Final = frozenset({"off", "0", "false", "no", "none"})

REQUESTS: Final = "ratelimit-requests:"
TOKENS: Final = "ratelimit-tokens:"
OWN_REQUESTS: Final = "ratelimit-own-requests:"
OWN_TOKENS: Final = "ratelimit-own-tokens:"
#: Every kind of entry the budget writes, for ``fluid doctor`` and resets.
KINDS: Final = (REQUESTS, TOKENS, OWN_REQUESTS, OWN_TOKENS)

#: How long a budget started from a known limit lasts until an answer says when it resets.
WINDOW: Final = 60.0
#: The shortest wait reported for a refusal (the budget may end as it is read).
_MIN_WAIT: Final = 0.01
# Larger than any real budget; keeps a planted number inside every store's integers.
_MOST: Final = 10**15
_COUNT = re.compile(r"^\s*(\d{1,20})\s*$")


# -- what an answer announces ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Limit:
    """One announced limit: its size, what is left, seconds until it resets (capped at 300)."""

    limit: int | None
    remaining: int | None
    reset: float | None


def _count(raw: str | None) -> int | None:
    match = _COUNT.match(raw) if raw is not None else None
    return min(int(match.group(1)), _MOST) if match else None


def _limit(headers: Mapping[str, str], names: tuple[str, str, str], now: float) -> Limit | None:
    size, left, reset_name = names
    raw_reset = headers.get(reset_name)
    reset = None
    if raw_reset is not None:  # the one parser of reset values, capped as Retry-After is
        from fluid_build.copilot.agents.error_classification import parse_rate_limit_reset

        reset = parse_rate_limit_reset({reset_name: raw_reset}, now=now)
    found = Limit(_count(headers.get(size)), _count(headers.get(left)), reset)
    return None if found == Limit(None, None, None) else found


def _openai(kind: str) -> tuple[str, str, str]:
    return (
        f"x-ratelimit-limit-{kind}",
        f"x-ratelimit-remaining-{kind}",
        f"x-ratelimit-reset-{kind}",
    )


def _anthropic(kind: str) -> tuple[str, str, str]:
    base = f"anthropic-ratelimit-{kind}"
    return (f"{base}-limit", f"{base}-remaining", f"{base}-reset")


@dataclass(frozen=True, slots=True)
class RateBudget:
    """The budget one answer announced; a limit the provider did not send is None."""

    requests: Limit | None = None
    tokens: Limit | None = None
    input_tokens: Limit | None = None
    output_tokens: Limit | None = None

    @classmethod
    def from_headers(cls, headers: HeadersLike, now: float) -> RateBudget | None:
        """The budget in ``headers`` (OpenAI/Azure/Groq or Anthropic names), or None.

        Never raises.
        """
        try:
            if isinstance(headers, httpx.Headers) and not any(
                name.startswith(_BUDGET_PREFIXES)
                for name in headers.keys()  # noqa: SIM118 - lower-cased names, no values decoded
            ):
                return None  # the common answer, without a budget: no pairs built
            lowered = {
                name.lower(): value
                for name, value in _pairs(headers)
                if name.lower().startswith(_BUDGET_PREFIXES)
            }
            if not lowered:
                return None
            budget = cls(
                requests=_limit(lowered, _openai("requests"), now)
                or _limit(lowered, _anthropic("requests"), now),
                tokens=_limit(lowered, _openai("tokens"), now)
                or _limit(lowered, _anthropic("tokens"), now),
                input_tokens=_limit(lowered, _anthropic("input-tokens"), now),
                output_tokens=_limit(lowered, _anthropic("output-tokens"), now),
            )
        except Exception:  # noqa: BLE001 - garbage headers mean "nothing announced"
            return None
        return None if budget == cls() else budget

    @property
    def token_limit(self) -> Limit | None:
        """The token limit a reservation counts against: ``tokens``, else input tokens.

        Anthropic's ``tokens`` is the most restrictive of its token limits; a
        reservation estimates what is sent, so input tokens come next.
        """
        return self.tokens or self.input_tokens


#: The header names a provider announces its budget under (lower-cased).
_BUDGET_PREFIXES: Final = ("x-ratelimit-", "anthropic-ratelimit-")


def _pairs(headers: HeadersLike) -> list[tuple[str, str]]:
    if headers is None:
        return []
    items = headers.items() if isinstance(headers, Mapping) else headers
    if hasattr(headers, "multi_items"):
        items = headers.multi_items()
    return [(str(name), str(value)) for name, value in items]


def estimate_tokens(body: bytes | str | None, max_output_tokens: int | None = None) -> int:
    """Tokens a request will count against a budget: its body's bytes / 4, plus the output cap.

    OpenAI and Anthropic count the requested output cap when a request is
    admitted; the pre-flight's own count is better when there is one.
    """
    size = len(body.encode() if isinstance(body, str) else body or b"")
    return math.ceil(size / 4) + max(max_output_tokens or 0, 0)


# -- the operator's own limits -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OwnLimit:
    """An operator's limit for a provider, or one model of it (``model`` None: every model)."""

    provider: str
    model: str | None = None
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None


_RATE = re.compile(r"^\s*(\d{1,15})\s*(rpm|tpm)\s*$", re.IGNORECASE)


def _not_configured(source: str, value: str, why: str) -> ProviderError:
    return ProviderError(
        f"{source} {truncate(redact(value), 60)!r}: {why}; write PROVIDER[/MODEL]=Nrpm,Ntpm "
        f"rules separated by ';' (e.g. {RATE_LIMITS_ENV}={_EXAMPLE!r}), or 'off'",
        code="llm.not_configured",
        retryable=False,
        details={"variable": RATE_LIMITS_ENV, "example": _EXAMPLE},
    )


def parse_rate_limits(text: str, source: str = RATE_LIMITS_ENV) -> tuple[OwnLimit, ...]:
    """``openai/gpt-4o=500rpm,30000tpm; anthropic=50rpm`` as limits.

    A bad rule is a typed ``llm.not_configured`` error naming ``source`` and a valid example.
    """
    rules: list[OwnLimit] = []
    for rule in filter(str.strip, text.split(";")):
        who, sep, rates = rule.partition("=")
        provider, _, model = who.strip().partition("/")
        if not sep or not provider.strip() or not rates.strip():
            raise _not_configured(source, rule, "each rule is PROVIDER[/MODEL]=RATES")
        per: dict[str, int] = {}
        for rate in rates.split(","):
            match = _RATE.match(rate)
            if match is None or int(match.group(1)) <= 0:
                raise _not_configured(
                    source, rule, f"{rate.strip()!r} is not like 500rpm or 30000tpm"
                )
            per[match.group(2).lower()] = int(match.group(1))
        rules.append(
            OwnLimit(provider.strip(), model.strip() or None, per.get("rpm"), per.get("tpm"))
        )
    return tuple(rules)


# -- the limiter ------------------------------------------------------------------------------


class RateLimiter:
    """The rate-limit budget of every key, in a shared store.

    Before each attempt :meth:`reserve` (or :meth:`waits`, which waits inside a
    deadline); after each answer :meth:`observe` its headers and :meth:`settle`
    the tokens it really used. ``enabled=False`` turns all of it off.
    """

    def __init__(
        self,
        store: CooldownStore,
        *,
        limits: Sequence[OwnLimit] = (),
        enabled: bool = True,
    ) -> None:
        self.store = store
        self.limits = tuple(limits)
        self.enabled = enabled
        # The limits each key last announced (requests, tokens): a budget that has
        # reset starts again from them, so calls in flight are counted from the start.
        self._announced: dict[str, tuple[int | None, int | None]] = {}

    @classmethod
    def from_env(
        cls,
        store: CooldownStore,
        env: Mapping[str, str] | None = None,
        *,
        limits: Sequence[OwnLimit] | str | None = None,
    ) -> RateLimiter:
        """Own limits from ``limits`` (an argument wins) or ``FLUID_RATE_LIMITS``; ``off`` disables.

        A value that does not parse raises ``llm.not_configured`` naming where it came from.
        """
        if limits is None:
            text = (os.environ if env is None else env).get(RATE_LIMITS_ENV, "")
            source = RATE_LIMITS_ENV
        elif isinstance(limits, str):
            text, source = limits, "limits="
        else:
            return cls(store, limits=limits)
        if text.strip().lower() in _OFF:
            return cls(store, enabled=False)
        return cls(store, limits=parse_rate_limits(text, source))

    def __repr__(self) -> str:
        state = "on" if self.enabled else "off"
        return f"RateLimiter({self.store!r}, {state}, limits={len(self.limits)})"

    def own_limit(self, key: CooldownKey | str) -> OwnLimit | None:
        """The operator's limit for ``key``: the model's rule, else the provider's."""
        if not self.limits:
            return None
        parsed = key if isinstance(key, CooldownKey) else CooldownKey.parse(key)
        if parsed is None:
            return None
        found = None
        for rule in self.limits:
            if rule.provider == parsed.provider:
                if rule.model == parsed.model:
                    return rule
                if rule.model is None:
                    found = rule
        return found

    def _steps(self, key: str, tokens: int) -> list[tuple[str, int, int | None, float]]:
        """The takes of one reservation: (entry, amount, limit to start from, its window)."""
        requests, token_limit = self._announced.get(key, (None, None))
        steps: list[tuple[str, int, int | None, float]] = [(REQUESTS + key, 1, requests, WINDOW)]
        if tokens > 0:
            steps.append((TOKENS + key, tokens, token_limit, WINDOW))
        own = self.own_limit(key)
        if own is not None and own.requests_per_minute:
            steps.append((OWN_REQUESTS + key, 1, own.requests_per_minute, 60.0))
        if own is not None and own.tokens_per_minute and tokens > 0:
            steps.append((OWN_TOKENS + key, tokens, own.tokens_per_minute, 60.0))
        return steps

    def reserve(self, key: CooldownKey | str, tokens: int, now: float) -> float:
        """Take one request and ``tokens`` from ``key``'s budget: 0.0, or the seconds to wait.

        All or nothing: a refusal gives back what it took, and says how long
        until the budget that refused resets (capped at 300 s); call again then.
        Nothing known about the key (no answer announced a budget, no own
        limit) is always 0.0.
        """
        if not self.enabled:
            return 0.0
        skey = str(key)
        steps = self._steps(skey, max(int(tokens), 0))
        if len(steps) <= 2 and skey not in self._announced:
            # Nothing this process knows: ask the store cheaply whether another did.
            seen = self.store.peek([name for name, *_ in steps], now)
            if all(left <= 0 for left, _ in seen):
                return 0.0
        taken: list[tuple[str, int, int | None]] = []
        for name, amount, limit, window in steps:
            granted, _ = self.store.take(name, amount, limit, window, now)
            if not granted:
                for back, back_amount, back_limit in taken:
                    self.store.take(back, -back_amount, back_limit, window, now)
                left, held = self.store.peek([name], now)[0]
                if held >= amount:
                    # The budget that refused has ended since, and another process has
                    # started the next one (for WINDOW, until an answer says when it
                    # resets): its end is not this refusal's. Try again at once.
                    return _MIN_WAIT
                return max(trusted(self.store, name, left, MAX_RETRY_AFTER, now), _MIN_WAIT)
            taken.append((name, amount, limit))
        return 0.0

    def waits(
        self,
        key: CooldownKey | str,
        tokens: int,
        *,
        wall: Callable[[], float],
        left: Callable[[], float | None],
        provider: str | None = None,
        model: str | None = None,
    ) -> Iterator[float]:
        """The waits before an attempt may go; it has its reservation when this ends.

        ``left()`` is what the call's deadline leaves (None: no deadline): a
        wait longer than that raises :class:`RateLimitError` (``llm.rate_limited``,
        ``details["rate_limit_budget"]``) without sending. The waits of one
        attempt add up to at most 300 s; then it goes, and the server judges.
        """
        budget = MAX_RETRY_AFTER
        while budget > 0:
            wait = min(self.reserve(key, tokens, wall()), budget)
            if wait <= 0:
                return
            remaining = left()
            if remaining is not None and wait > remaining:
                raise RateLimitError(
                    f"{provider or 'provider'} key {key}: its rate-limit budget resets in "
                    f"{wait:.3g} s but only {remaining:.3g} s of the deadline are left",
                    provider=provider,
                    model=model,
                    retry_after=wait,
                    details={"rate_limit_budget": True, "cooldown_key": str(key)},
                )
            budget -= wait
            yield wait

    def observe(
        self, key: CooldownKey | str, headers: HeadersLike, now: float
    ) -> RateBudget | None:
        """Keep what an answer (any answer, a 429 too) announced; return it, or None."""
        if not self.enabled:
            return None
        budget = RateBudget.from_headers(headers, now)
        if budget is None:
            return None
        skey = str(key)
        requests, tokens = budget.requests, budget.token_limit
        limits = (requests.limit if requests else None, tokens.limit if tokens else None)
        if limits != (None, None) and self._announced.get(skey) != limits:
            if len(self._announced) >= MAX_ENTRIES:
                self._announced.clear()  # relearned from the next answers
            self._announced[skey] = limits
        for prefix, limit in ((REQUESTS, requests), (TOKENS, tokens)):
            if limit is not None and limit.remaining is not None and limit.reset:
                self.store.put(prefix + skey, limit.remaining, limit.reset, now)
        return budget

    def settle(self, key: CooldownKey | str, reserved: int, actual: int, now: float) -> None:
        """Correct a reservation of ``reserved`` tokens by what the answer really used.

        More is taken even past what is left (down to 0); less is given back, never
        above the limit. A budget that has reset meanwhile is left alone.
        """
        extra = int(actual) - int(reserved)
        if not self.enabled or extra == 0:
            return
        skey = str(key)
        own = self.own_limit(skey)
        names = [(TOKENS + skey, self._announced.get(skey, (None, None))[1])]
        if own is not None and own.tokens_per_minute:
            names.append((OWN_TOKENS + skey, own.tokens_per_minute))
        live = self.store.peek([name for name, _ in names], now)
        for (name, limit), (ends_in, _) in zip(names, live, strict=True):
            if ends_in <= 0:  # no budget kept there, or it has reset: nothing to correct
                continue
            granted, _ = self.store.take(name, extra, None if extra > 0 else limit, WINDOW, now)
            if not granted:
                ends = self.store.remaining(name, now)
                if ends > 0:
                    self.store.put(name, 0, ends, now)

    def reset(self, key: CooldownKey | str) -> None:
        """Forget ``key``'s budget, in the shared store, for every process."""
        skey = str(key)
        self._announced.pop(skey, None)
        reset_keys(self.store, [kind + skey for kind in KINDS])
