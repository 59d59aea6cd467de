"""What one answer cost in USD: genai-prices' bundled data, or prices the user gives.

Rules (docs/budgets.md, "Prices"), in order: a price the user gave
(``LLMClient(prices=...)`` or ``FLUID_PRICES``) for the model the answer
names, then for the model requested; then genai-prices for the model the
answer names, then for the model requested, at the provider's ``price_id``
(llm/registry.py). ``openai`` is priced as OpenAI at any base URL; a local
server (an entry with ``local``: openai_compatible, vllm, llamacpp, ollama)
has no price unless the user gives one. ``None`` means no price is known.

genai-prices is imported on first use, never at ``import fluid_build.copilot``
(it costs a quarter of a second), and never fetches: only the data bundled in
the installed package is read. A (provider, model) lookup is cached, so the
per-call cost is a dict hit plus a few multiplications.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Final

from fluid_build.copilot.agents.errors import ProviderError
from fluid_build.copilot.llm.registry import PROVIDERS

if TYPE_CHECKING:
    from fluid_build.copilot.llm.types import Usage

__all__ = [
    "MOST_PRICE",
    "MOST_TOKENS",
    "PRICES_EXAMPLE",
    "PRICES_VARIABLE",
    "ModelPrice",
    "Prices",
    "known_price",
    "parse_prices",
    "price_call",
    "prices_from_env",
    "prices_version",
    "sane_usage",
    "worst_case_usd",
]

PRICES_VARIABLE: Final = "FLUID_PRICES"
PRICES_EXAMPLE: Final = '{"my-model": {"input": 0.5, "output": 1.5}}'

_PER_MILLION: Final = 1_000_000.0
#: More tokens than any model reads or writes in one answer: a usage figure past it (or
#: below 0) is no count at all, and the answer's cost is unknown rather than absurd.
MOST_TOKENS: Final = 10**9
#: USD per million tokens above which a given price is a mistake (1 USD a token).
MOST_PRICE: Final = 1_000_000.0


@dataclass(frozen=True, slots=True)
class ModelPrice:
    """A model's prices in USD per million tokens; a cache price left out is the input price."""

    input: float
    output: float
    cache_read: float | None = None
    cache_write: float | None = None

    def cost(self, usage: Usage) -> float:
        """USD for ``usage`` (normalized: cache counts are part of ``input_tokens``)."""
        return _Rate.of(self).cost(*_counts(usage))


def _counts(usage: Usage) -> tuple[int, int, int, int]:
    return (
        usage.input_tokens,
        usage.output_tokens,
        usage.cache_read_tokens,
        usage.cache_write_tokens,
    )


def sane_usage(usage: Usage) -> bool:
    """Whether every count ``usage`` holds is a whole number a model could have used, and
    its parts fit in their totals (an answer saying it read 5 cached tokens of a 0-token
    prompt cannot be priced: genai-prices refuses it with a ValueError)."""
    return all(
        isinstance(count, int) and not isinstance(count, bool) and 0 <= count <= MOST_TOKENS
        for count in (*_counts(usage), usage.reasoning_tokens)
    ) and (
        usage.cache_read_tokens + usage.cache_write_tokens <= usage.input_tokens
        and usage.reasoning_tokens <= usage.output_tokens
    )


#: User-given prices, keyed ``model`` or ``provider:model``.
Prices = Mapping[str, ModelPrice]


def _bad_prices(reason: str, variable: str | None) -> ProviderError:
    where = variable or "prices="
    example = f"{variable}='{PRICES_EXAMPLE}'" if variable else f"prices={PRICES_EXAMPLE}"
    return ProviderError(
        f"{where} cannot be used ({reason}): give USD per million tokens per model, e.g. {example}",
        code="llm.not_configured",
        retryable=False,
        details={"variable": variable or "prices", "example": PRICES_EXAMPLE},
    )


def _amount(value: Any, field: str, key: str, variable: str | None) -> float:
    # bool is an int to Python, never a price.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _bad_prices(f"{key!r}: {field} is not a number", variable)
    try:
        amount = float(value)
    except OverflowError:  # an int of hundreds of digits
        amount = math.inf
    if not math.isfinite(amount) or amount < 0:
        raise _bad_prices(f"{key!r}: {field} is not a finite amount >= 0", variable)
    if amount > MOST_PRICE:
        raise _bad_prices(
            f"{key!r}: {field} is {amount:g} USD per million tokens, more than {MOST_PRICE:g}",
            variable,
        )
    return amount


def _model_price(key: str, value: Any, variable: str | None) -> ModelPrice:
    if isinstance(value, ModelPrice):
        return value
    if not isinstance(value, Mapping):
        raise _bad_prices(f"{key!r} is not an object of prices", variable)
    unknown = sorted(set(value) - {"input", "output", "cache_read", "cache_write"})
    if unknown:
        raise _bad_prices(f"{key!r}: unknown field {unknown[0]!r}", variable)
    for needed in ("input", "output"):
        if needed not in value:
            raise _bad_prices(f"{key!r} has no {needed!r} price", variable)
    cache = {
        name: _amount(value[name], name, key, variable)
        for name in ("cache_read", "cache_write")
        if value.get(name) is not None
    }
    return ModelPrice(
        _amount(value["input"], "input", key, variable),
        _amount(value["output"], "output", key, variable),
        **cache,
    )


def parse_prices(
    raw: Mapping[str, Any] | None, *, variable: str | None = None
) -> dict[str, ModelPrice]:
    """``{"model" or "provider:model": {"input": ..., "output": ..., ...}}`` as prices.

    A value that cannot be used is ``llm.not_configured`` naming ``variable``
    (or ``prices=``) with an example.
    """
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise _bad_prices("not an object keyed by model", variable)
    prices: dict[str, ModelPrice] = {}
    for key, value in raw.items():
        if not isinstance(key, str) or not key.strip():
            raise _bad_prices("a model name is empty", variable)
        prices[key.strip()] = _model_price(key, value, variable)
    return prices


def prices_from_env(env: Mapping[str, str] | None = None) -> dict[str, ModelPrice]:
    """``FLUID_PRICES`` (JSON) from ``env`` (``os.environ`` when None); ``{}`` when unset."""
    text = (os.environ if env is None else env).get(PRICES_VARIABLE, "").strip()
    if not text:
        return {}
    try:
        raw = json.loads(text)
    except ValueError:
        raise _bad_prices("not JSON", PRICES_VARIABLE) from None
    except RecursionError:  # nested past the parser's depth: no price list is
        raise _bad_prices("nested too deeply", PRICES_VARIABLE) from None
    return parse_prices(raw, variable=PRICES_VARIABLE)


@dataclass(frozen=True, slots=True)
class _Tiered:
    """A genai-prices threshold price: past ``start`` input tokens, every token costs more."""

    base: float
    tiers: tuple[tuple[int, float], ...]  # (start, USD per token), highest start first

    def at(self, input_tokens: int) -> float:
        for start, rate in self.tiers:
            if input_tokens > start:
                return rate
        return self.base


_Amount = float | _Tiered | None


def _at(rate: _Amount, input_tokens: int) -> float | None:
    return rate.at(input_tokens) if isinstance(rate, _Tiered) else rate


@dataclass(frozen=True, slots=True)
class _Rate:
    """USD per token (not per million): the arithmetic done on every answer."""

    input: _Amount
    output: _Amount
    cache_read: _Amount
    cache_write: _Amount
    per_request: float = 0.0

    @classmethod
    def of(cls, price: ModelPrice) -> _Rate:
        def each(value: float | None) -> float | None:
            return None if value is None else value / _PER_MILLION

        return cls(
            each(price.input), each(price.output), each(price.cache_read), each(price.cache_write)
        )

    def cost(self, input_tokens: int, output_tokens: int, read: int, write: int) -> float:
        rate_in = _at(self.input, input_tokens) or 0.0
        read_rate = _at(self.cache_read, input_tokens)
        write_rate = _at(self.cache_write, input_tokens)
        # Cache counts are part of input_tokens; one without a price of its own is input.
        total = self.per_request + (_at(self.output, input_tokens) or 0.0) * output_tokens
        uncached = input_tokens
        if read_rate is not None:
            uncached -= read
            total += read_rate * read
        if write_rate is not None:
            uncached -= write
            total += write_rate * write
        return total + rate_in * max(uncached, 0)

    def worst_input(self, input_tokens: int) -> float:
        """The dearest an input token can be: a cache write costs more than input at Anthropic."""
        rates = [_at(self.input, input_tokens), _at(self.cache_write, input_tokens)]
        return max((rate for rate in rates if rate is not None), default=0.0)


# genai-prices keys this module prices itself; a model with any other token price
# (audio, reasoning apart, ...) is priced by genai-prices' own calculation.
_OWN_KEYS: Final = frozenset(
    {"input_mtok", "output_mtok", "cache_read_mtok", "cache_write_mtok", "requests_kcount"}
)
# Cache-write variants priced only for counts fluid never reports (0): harmless.
_ZERO_KEYS: Final = frozenset({"cache_write_5m_mtok", "cache_write_1h_mtok"})


def _converted(value: Any) -> _Amount:
    from genai_prices.types import TieredPrices

    if value is None:
        return None
    if isinstance(value, TieredPrices):
        tiers = sorted(value.tiers, key=lambda tier: tier.start, reverse=True)
        return _Tiered(
            float(value.base) / _PER_MILLION,
            tuple((tier.start, float(tier.price) / _PER_MILLION) for tier in tiers),
        )
    return float(value) / _PER_MILLION


@dataclass(frozen=True, slots=True)
class _Listed:
    """A model genai-prices knows: our own rates when they say it all, else its ModelPrice."""

    rate: _Rate | None
    model_price: Any  # genai_prices.types.ModelPrice

    def cost(self, input_tokens: int, output_tokens: int, read: int, write: int) -> float:
        if self.rate is not None:
            return self.rate.cost(input_tokens, output_tokens, read, write)
        from genai_prices import Usage as GenaiUsage

        usage = GenaiUsage(
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            cache_read_tokens=read,
            cache_write_tokens=write,
        )
        return float(self.model_price.calc_price(usage)["total_price"])


def _listed_rate(model_price: Any) -> _Rate | None:
    keys = {key for key, value in vars(model_price).items() if value is not None}
    token_keys = {key for key in keys if key.endswith("_mtok")}
    if not token_keys <= _OWN_KEYS | _ZERO_KEYS or "input_mtok" not in keys:
        return None
    if token_keys & _ZERO_KEYS and "cache_write_mtok" not in keys:
        return None
    per_request = model_price.requests_kcount
    return _Rate(
        _converted(model_price.input_mtok),
        _converted(model_price.output_mtok),
        _converted(model_price.cache_read_mtok),
        _converted(model_price.cache_write_mtok),
        0.0 if per_request is None else float(per_request) / 1000,
    )


@lru_cache(maxsize=1024)
def _listed(provider_id: str, model: str) -> _Listed | None:
    """genai-prices' price for ``model`` at ``provider_id`` today; None when it has none."""
    from datetime import UTC, datetime

    from genai_prices import data_snapshot

    try:
        _, info = data_snapshot.get_snapshot().find_provider_model(model, None, provider_id, None)
    except LookupError:
        return None
    model_price = info.get_prices(datetime.now(tz=UTC))
    return _Listed(_listed_rate(model_price), model_price)


def _given(overrides: Prices | None, provider: str, model: str | None) -> ModelPrice | None:
    if not overrides or not model:
        return None
    return overrides.get(f"{provider}:{model}") or overrides.get(model)


def _price(
    provider: str, model: str, answered_model: str | None, overrides: Prices | None
) -> ModelPrice | _Listed | None:
    """The price that applies, by the rules in the module docstring."""
    named = answered_model if answered_model and answered_model != model else None
    given = _given(overrides, provider, named) or _given(overrides, provider, model)
    if given is not None:
        return given
    entry = PROVIDERS.get(provider)
    # A server the user runs is in no price list, whatever its models are called.
    provider_id = None if entry is None or entry.local else entry.price_id
    if provider_id is None:
        return None
    if named is not None:
        listed = _listed(provider_id, named)
        if listed is not None:
            return listed
    return _listed(provider_id, model)


def _rate_of(price: ModelPrice | _Listed) -> _Rate | _Listed:
    return _Rate.of(price) if isinstance(price, ModelPrice) else price


def price_call(
    provider: str,
    model: str,
    usage: Usage,
    *,
    answered_model: str | None = None,
    overrides: Prices | None = None,
) -> float | None:
    """The USD cost of one answer; None when no price is known for it, or when its usage
    is not a count a model could have used (see :func:`sane_usage`)."""
    if not sane_usage(usage):
        return None
    price = _price(provider, model, answered_model, overrides)
    if price is None:
        return None
    cost = _rate_of(price).cost(*_counts(usage))
    return cost if math.isfinite(cost) else None


def known_price(provider: str, model: str, *, overrides: Prices | None = None) -> bool:
    """Whether a call to ``provider``'s ``model`` can be priced."""
    return _price(provider, model, None, overrides) is not None


def worst_case_usd(
    provider: str,
    model: str,
    input_tokens: int,
    max_output_tokens: int,
    *,
    overrides: Prices | None = None,
) -> float | None:
    """The most one attempt can cost: every input token at the dearest input price
    (a cache write can cost more than input) plus ``max_output_tokens`` of output."""
    price = _price(provider, model, None, overrides)
    if price is None:
        return None
    rate = _rate_of(price)
    if isinstance(rate, _Listed):
        if rate.rate is None:
            # genai-prices' own sum for a model this module does not price itself.
            return max(
                rate.cost(input_tokens, max_output_tokens, 0, 0),
                rate.cost(input_tokens, max_output_tokens, 0, input_tokens),
            )
        rate = rate.rate
    output = (_at(rate.output, input_tokens) or 0.0) * max_output_tokens
    return rate.per_request + rate.worst_input(input_tokens) * input_tokens + output


def prices_version() -> str:
    """Which price data is in use, for ``fluid doctor``: the package and its latest price date."""
    from importlib.metadata import version

    from genai_prices import data_snapshot

    snapshot = data_snapshot.get_snapshot()
    dates = [
        constraint.start_date
        for provider in snapshot.providers
        for info in provider.models
        if isinstance(info.prices, list)
        for conditional in info.prices
        if (constraint := getattr(conditional, "constraint", None)) is not None
        and getattr(constraint, "start_date", None) is not None
    ]
    models = sum(len(provider.models) for provider in snapshot.providers)
    latest = f", price changes listed up to {max(dates).isoformat()}" if dates else ""
    return (
        f"genai-prices {version('genai-prices')} (bundled data: {len(snapshot.providers)} "
        f"providers, {models} models{latest})"
    )
