"""The rate-limit budget: reading the headers, the store's take and put, the limiter."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from fluid_build.copilot.agents.errors import ProviderError, RateLimitError
from fluid_build.copilot.health.cooldown import (
    CooldownKey,
    CooldownStore,
    MemoryCooldownStore,
    RedisCooldownStore,
    ResilientCooldownStore,
    SqliteCooldownStore,
)
from fluid_build.copilot.health.ratelimit import (
    OWN_REQUESTS,
    REQUESTS,
    TOKENS,
    Limit,
    OwnLimit,
    RateBudget,
    RateLimiter,
    estimate_tokens,
    parse_rate_limits,
)
from fluid_build.copilot.health.report import read_health, reset_health
from tests.ratelimit_server import RateLimitedProvider, duration, serving

NOW = 1_700_000_000.0
KEY = CooldownKey.for_call("openai", "sk-test", "gpt-4o-mini", "https://api.openai.com/v1")

# -- what an answer announces -----------------------------------------------------------


def test_openai_headers_are_read_with_their_durations() -> None:
    budget = RateBudget.from_headers(
        {
            "x-ratelimit-limit-requests": "60",
            "x-ratelimit-remaining-requests": "59",
            "x-ratelimit-reset-requests": "1s",
            "x-ratelimit-limit-tokens": "150000",
            "X-RateLimit-Remaining-Tokens": "149984",
            "x-ratelimit-reset-tokens": "6m0s",
        },
        NOW,
    )
    assert budget == RateBudget(
        requests=Limit(60, 59, 1.0),
        tokens=Limit(150000, 149984, 300.0),  # 6 minutes, capped as Retry-After is
    )


def test_anthropic_headers_are_read_with_their_rfc3339_resets() -> None:
    headers = {"anthropic-ratelimit-requests-limit": "50"}
    for kind, left in (("requests", "49"), ("input-tokens", "39000"), ("output-tokens", "7900")):
        headers[f"anthropic-ratelimit-{kind}-remaining"] = left
        headers[f"anthropic-ratelimit-{kind}-reset"] = "2023-11-14T22:13:40Z"  # NOW + 20 s
    budget = RateBudget.from_headers(headers, NOW)
    assert budget is not None
    assert budget.requests == Limit(50, 49, pytest.approx(20.0))
    assert budget.tokens is None
    assert budget.input_tokens == Limit(None, 39000, pytest.approx(20.0))
    assert budget.output_tokens == Limit(None, 7900, pytest.approx(20.0))
    assert budget.token_limit == budget.input_tokens


@pytest.mark.parametrize(
    "headers",
    [
        None,
        {},
        {"content-type": "application/json"},
        {"x-ratelimit-remaining-requests": "lots", "x-ratelimit-reset-requests": "soon"},
        {"x-ratelimit-remaining-tokens": "-5", "x-ratelimit-reset-tokens": "-1s"},
        {"anthropic-ratelimit-requests-reset": "2023-02-30T99:00:00Z"},
        [("x-ratelimit-remaining-requests", "\x00")],
        42,
    ],
)
def test_garbage_headers_announce_nothing(headers: object) -> None:
    assert RateBudget.from_headers(headers, NOW) is None  # type: ignore[arg-type]


def test_a_huge_number_stays_inside_the_stores_integers() -> None:
    budget = RateBudget.from_headers(
        {"x-ratelimit-remaining-requests": "9" * 20, "x-ratelimit-reset-requests": "1s"}, NOW
    )
    assert budget is not None
    assert budget.requests is not None
    assert budget.requests.remaining == 10**15


@pytest.mark.parametrize(
    ("seconds", "text"), [(0.02, "20ms"), (1.2, "1.2s"), (360.0, "6m0s"), (61.5, "1m1.5s")]
)
def test_the_server_writes_resets_as_openai_does(seconds: float, text: str) -> None:
    assert duration(seconds) == text


def test_a_request_is_estimated_at_bytes_over_four_plus_its_output_cap() -> None:
    assert estimate_tokens(b"x" * 401, 16) == 101 + 16
    assert estimate_tokens("", None) == 0


# -- the operator's own limits -----------------------------------------------------------


def test_own_limits_parse_per_provider_and_model() -> None:
    assert parse_rate_limits("openai/gpt-4o=500rpm,30000TPM; anthropic = 50 rpm;") == (
        OwnLimit("openai", "gpt-4o", 500, 30000),
        OwnLimit("anthropic", None, 50, None),
    )
    limiter = RateLimiter(
        MemoryCooldownStore(),
        limits=parse_rate_limits("openai=10rpm; openai/gpt-4o-mini=2rpm; ollama=1rpm"),
    )
    assert limiter.own_limit(KEY) == OwnLimit("openai", "gpt-4o-mini", 2, None)
    assert limiter.own_limit(str(CooldownKey.for_call("openai", None, "o3"))) == OwnLimit(
        "openai", None, 10, None
    )


@pytest.mark.parametrize("value", ["openai", "openai=fast", "=5rpm", "openai=0rpm", "x=5rps"])
def test_a_bad_own_limit_names_the_variable_and_a_valid_example(value: str) -> None:
    with pytest.raises(ProviderError) as caught:
        RateLimiter.from_env(MemoryCooldownStore(), {"FLUID_RATE_LIMITS": value})
    error = caught.value
    assert error.code == "llm.not_configured"
    assert error.details["variable"] == "FLUID_RATE_LIMITS"
    assert parse_rate_limits(error.details["example"])
    assert "FLUID_RATE_LIMITS" in str(error)


def test_the_argument_wins_and_off_turns_the_budget_off() -> None:
    store = MemoryCooldownStore()
    env = {"FLUID_RATE_LIMITS": "openai=1rpm"}
    assert RateLimiter.from_env(store, env, limits="openai=3rpm").limits[0].requests_per_minute == 3
    off = RateLimiter.from_env(store, {"FLUID_RATE_LIMITS": "off"})
    assert not off.enabled
    off.observe(
        KEY, {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "9s"}, NOW
    )
    assert off.reserve(KEY, 10, NOW) == 0.0
    assert store.entries(NOW) == []


# -- the store operations, one contract for three stores ------------------------------------

Pair = tuple[CooldownStore, CooldownStore]


@pytest.fixture(params=["memory", "sqlite", "redis", "resilient"])
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Pair]:
    """Two handles on one shared store (two processes' view of it)."""
    if request.param == "memory":
        shared = MemoryCooldownStore()
        yield shared, shared
    elif request.param == "sqlite":
        path = tmp_path / "cooldown.sqlite3"
        yield SqliteCooldownStore(path), SqliteCooldownStore(path)
    elif request.param == "resilient":
        path = tmp_path / "cooldown.sqlite3"
        first = ResilientCooldownStore(SqliteCooldownStore(path))
        yield first, ResilientCooldownStore(SqliteCooldownStore(path))
    else:
        url = request.getfixturevalue("redis_url")
        prefix = f"test:{request.node.name}:"
        yield RedisCooldownStore(url, prefix=prefix), RedisCooldownStore(url, prefix=prefix)


def test_take_starts_a_budget_from_its_limit_and_refuses_past_it(stores: Pair) -> None:
    one, two = stores
    assert one.take("b", 1, None, 60, NOW) == (True, None)  # nothing known: nothing written
    assert one.entries(NOW) == []
    assert one.take("b", 2, 5, 60, NOW) == (True, 3)
    assert two.take("b", 3, 5, 60, NOW + 1) == (True, 0)
    assert one.take("b", 1, 5, 60, NOW + 2) == (False, 0)
    assert two.remaining("b", NOW + 2) == pytest.approx(58.0, abs=0.01)
    assert one.take("b", 1, 5, 60, NOW + 60) == (True, 4)  # ended: a new budget


def test_take_is_all_or_nothing_and_gives_back_up_to_the_limit(stores: Pair) -> None:
    one, two = stores
    one.take("b", 1, 10, 60, NOW)
    assert two.take("b", 20, 10, 60, NOW) == (False, 9)
    assert two.take("b", -5, 10, 60, NOW) == (True, 10)  # never above the limit
    assert one.take("b", -5, None, 60, NOW) == (True, 15)
    assert one.take("gone", -5, 10, 60, NOW) == (True, None)  # nothing to give back to
    assert one.entries(NOW)[0].key == "b"


def test_a_first_take_larger_than_the_limit_goes_and_empties_it(stores: Pair) -> None:
    one, _ = stores
    assert one.take("b", 50, 10, 60, NOW) == (True, 0)


def test_put_keeps_the_lower_budget_and_the_latest_reset(stores: Pair) -> None:
    one, two = stores
    assert one.put("b", 10, 30, NOW) == 10
    assert two.take("b", 4, None, 60, NOW) == (True, 6)
    assert one.put("b", 8, 20, NOW + 1) == 6  # the announcer had not seen the take yet
    assert two.remaining("b", NOW + 1) == pytest.approx(20.0, abs=0.01)
    assert one.put("b", 2, 20, NOW + 1) == 2
    assert one.put("b", 7, 0, NOW + 1) == 2  # no reset: nothing written
    assert one.put("b", 9, 5, NOW + 30) == 9  # the old budget ended
    assert [e.count for e in two.entries(NOW + 30)] == [9]


def test_reserve_waits_for_the_announced_reset_in_every_handle(stores: Pair) -> None:
    one, two = stores
    first, second = RateLimiter(one), RateLimiter(two)
    headers = {
        "x-ratelimit-limit-requests": "3",
        "x-ratelimit-remaining-requests": "1",
        "x-ratelimit-reset-requests": "12s",
    }
    first.observe(KEY, headers, NOW)
    assert second.reserve(KEY, 0, NOW) == 0.0
    assert first.reserve(KEY, 0, NOW + 2) == pytest.approx(10.0, abs=0.01)
    assert second.reserve(KEY, 0, NOW + 12) == 0.0  # reset: a new budget, from the limit
    for _ in range(3):  # the limit it learned: 3 in all
        assert first.reserve(KEY, 0, NOW + 12) == 0.0
    assert first.reserve(KEY, 0, NOW + 12) > 0.0


# -- the limiter ------------------------------------------------------------------------------


def _announce(requests: int, tokens: int, reset: str = "30s") -> dict[str, str]:
    return {
        "x-ratelimit-limit-requests": str(max(requests, 100)),
        "x-ratelimit-remaining-requests": str(requests),
        "x-ratelimit-reset-requests": reset,
        "x-ratelimit-limit-tokens": str(max(tokens, 1000)),
        "x-ratelimit-remaining-tokens": str(tokens),
        "x-ratelimit-reset-tokens": reset,
    }


def test_a_reservation_takes_a_request_and_its_tokens_or_nothing() -> None:
    store = MemoryCooldownStore()
    limiter = RateLimiter(store)
    limiter.observe(KEY, _announce(5, 100), NOW)
    assert limiter.reserve(KEY, 60, NOW) == 0.0
    assert limiter.reserve(KEY, 60, NOW) == pytest.approx(30.0)  # the tokens refuse it
    counts = {e.key.split(":")[0]: e.count for e in store.entries(NOW)}
    assert counts == {"ratelimit-requests": 4, "ratelimit-tokens": 40}  # the request given back


def test_settle_corrects_a_reservation_by_the_real_usage() -> None:
    store = MemoryCooldownStore()
    limiter = RateLimiter(store)
    limiter.observe(KEY, _announce(5, 1000), NOW)
    limiter.reserve(KEY, 300, NOW)
    limiter.settle(KEY, 300, 100, NOW)
    assert store.count(TOKENS + str(KEY), NOW) == 900
    limiter.settle(KEY, 100, 2000, NOW)  # far more than was left: down to 0, not refused
    assert store.count(TOKENS + str(KEY), NOW) == 0
    assert store.remaining(TOKENS + str(KEY), NOW) == pytest.approx(30.0)


def test_own_limits_work_without_any_header() -> None:
    store = MemoryCooldownStore()
    limiter = RateLimiter(store, limits=[OwnLimit("openai", None, 2, 500)])
    assert limiter.reserve(KEY, 100, NOW) == 0.0
    assert limiter.reserve(KEY, 100, NOW + 10) == 0.0
    assert limiter.reserve(KEY, 100, NOW + 20) == pytest.approx(40.0)  # the minute began at NOW
    assert limiter.reserve(KEY, 100, NOW + 60) == 0.0
    assert store.count(OWN_REQUESTS + str(KEY), NOW + 60) == 1


def test_a_key_nobody_announced_costs_no_write() -> None:
    store = MemoryCooldownStore()
    limiter = RateLimiter(store)
    for _ in range(3):
        assert limiter.reserve(KEY, 100, NOW) == 0.0
    assert limiter.observe(KEY, {"content-type": "application/json"}, NOW) is None
    assert store.entries(NOW) == []


def test_waits_stop_at_the_deadline_with_a_typed_error() -> None:
    limiter = RateLimiter(MemoryCooldownStore())
    limiter.observe(KEY, _announce(0, 1000, "20s"), NOW)
    clock = [NOW]
    waits = limiter.waits(KEY, 1, wall=lambda: clock[0], left=lambda: 5.0, provider="openai")
    with pytest.raises(RateLimitError) as caught:
        next(waits)
    assert caught.value.code == "llm.rate_limited"
    assert caught.value.retry_after == pytest.approx(20.0)
    assert caught.value.details["rate_limit_budget"] is True


def test_waits_sleep_until_the_reset_then_reserve() -> None:
    store = MemoryCooldownStore()
    limiter = RateLimiter(store)
    limiter.observe(KEY, _announce(0, 1000, "20s"), NOW)
    clock = [NOW]
    taken = []
    for wait in limiter.waits(KEY, 10, wall=lambda: clock[0], left=lambda: None):
        taken.append(wait)
        clock[0] += wait
    assert taken == [pytest.approx(20.0)]
    assert store.count(REQUESTS + str(KEY), clock[0]) == 99  # a new budget from the limit


def test_a_store_that_is_down_degrades_to_the_process(tmp_path: Path) -> None:
    (tmp_path / "dir.sqlite3").mkdir()  # no sqlite file can be opened there
    store = ResilientCooldownStore(SqliteCooldownStore(tmp_path / "dir.sqlite3"))
    limiter = RateLimiter(store)
    limiter.observe(KEY, _announce(1, 1000), NOW)
    assert store.degraded
    assert limiter.reserve(KEY, 1, NOW) == 0.0
    assert limiter.reserve(KEY, 1, NOW) == pytest.approx(30.0)


def test_a_busy_store_never_fails_a_reservation(tmp_path: Path) -> None:
    path = tmp_path / "cooldown.sqlite3"
    store = ResilientCooldownStore(SqliteCooldownStore(path, busy_timeout=0.01))
    limiter = RateLimiter(store)
    limiter.observe(KEY, _announce(1, 1000), NOW)
    holder = sqlite3.connect(path)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        assert limiter.reserve(KEY, 1, NOW) == 0.0  # the mirror's answer
        assert store.contended >= 1
    finally:
        holder.rollback()
        holder.close()


def test_doctor_lists_and_resets_the_budgets() -> None:
    store = MemoryCooldownStore()
    limiter = RateLimiter(store, limits=[OwnLimit("openai", None, 5, None)])
    limiter.observe(KEY, _announce(7, 700), NOW)
    limiter.reserve(KEY, 0, NOW)
    (health,) = read_health(store, NOW)
    assert health.rate_limits == {
        "requests": {"remaining": 6, "until": NOW + 30},
        "tokens": {"remaining": 700, "until": NOW + 30},
        "own_requests": {"remaining": 4, "until": NOW + 60},
    }
    assert reset_health(store, provider="openai") == 3
    assert store.entries(NOW) == []


# -- against the loopback provider ---------------------------------------------------------


@pytest.mark.parametrize("style", ["openai", "anthropic"])
def test_no_request_past_the_announced_budget_reaches_the_server(style: str) -> None:
    provider = RateLimitedProvider(4, 10_000, style=style)  # type: ignore[arg-type]
    limiter = RateLimiter(MemoryCooldownStore())
    body = b'{"max_tokens": 16, "messages": []}'
    waits = []
    with serving(provider) as url, httpx.Client(base_url=url) as client:
        for _ in range(6):
            now = time.time()
            wait = limiter.reserve(KEY, estimate_tokens(body, 16), now)
            if wait > 0:
                waits.append(wait)
                continue
            response = client.post("/v1/chat/completions", content=body)
            limiter.observe(KEY, response.headers, time.time())
    assert provider.ok == 4
    assert provider.refused == 0
    assert len(waits) == 2
    assert all(50 < w <= 60.01 for w in waits)


# -- several real processes on the default store ------------------------------------------------


def _taker(path: str, rounds: int, granted: multiprocessing.Queue[int]) -> None:
    limiter = RateLimiter(ResilientCooldownStore(SqliteCooldownStore(path, busy_timeout=2.0)))
    limiter.observe(KEY, _announce(40, 100_000), NOW)
    count = 0
    for _ in range(rounds):
        if limiter.reserve(KEY, 10, NOW) == 0.0:
            count += 1
    granted.put(count)


def _forever(path: str, ready: multiprocessing.Queue[int]) -> None:
    limiter = RateLimiter(ResilientCooldownStore(SqliteCooldownStore(path, busy_timeout=2.0)))
    limiter.observe(KEY, _announce(40, 100_000), NOW)
    limiter.reserve(KEY, 10, NOW)
    ready.put(os.getpid())
    while True:  # giving back and taking again, until killed in the middle of it
        limiter.settle(KEY, 10, 0, NOW)
        limiter.settle(KEY, 0, 10, NOW)


def test_processes_sharing_the_default_store_never_take_past_the_budget(tmp_path: Path) -> None:
    path = str(tmp_path / "cooldown.sqlite3")
    spawn = multiprocessing.get_context("spawn")
    ready: multiprocessing.Queue[int] = spawn.Queue()
    killed = spawn.Process(target=_forever, args=(path, ready))
    killed.start()
    ready.get(timeout=60)
    os.kill(killed.pid or 0, signal.SIGKILL)  # mid-call: no lock or transaction survives it
    killed.join(timeout=30)
    granted: multiprocessing.Queue[int] = spawn.Queue()
    workers = [spawn.Process(target=_taker, args=(path, 20, granted)) for _ in range(4)]
    for worker in workers:
        worker.start()
    total = sum(granted.get(timeout=60) for _ in workers)
    for worker in workers:
        worker.join(timeout=30)
    assert total == 39  # 40 announced, 1 taken by the killed process, none lost or doubled
    store = SqliteCooldownStore(path)
    assert store.count(REQUESTS + str(KEY), NOW) == 0
    # The killed process held 10 tokens, or had just given them back.
    assert store.count(TOKENS + str(KEY), NOW) in {100_000 - 40 * 10, 100_000 - 39 * 10}
    assert RateLimiter(store).reserve(KEY, 10, NOW + 30) == 0.0  # reset: a new budget


def test_doctor_shows_each_budget_with_its_reset() -> None:
    from fluid_build.cli.doctor import _shared_lines

    store = MemoryCooldownStore()
    RateLimiter(store).observe(KEY, _announce(7, 700), NOW)
    entries = [item.to_dict() for item in read_health(store, NOW)]
    lines = _shared_lines({"entries": entries, "now": NOW})
    assert "requests budget 7 left, resets 22:13:50 UTC (in 30 s)" in lines[1]
    assert "tokens budget 700 left" in lines[1]
