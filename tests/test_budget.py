"""Shared USD budgets (issue 24): FLUID_BUDGETS, the ledger on every store, refusals."""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from fluid_build.copilot.agents.errors import AgentExecutionError
from fluid_build.copilot.call.prices import ModelPrice
from fluid_build.copilot.call.spend import BudgetGuard
from fluid_build.copilot.health.budget import (
    MICRO,
    BudgetLedger,
    BudgetSpec,
    MemoryBudgetLedger,
    budgets_from_env,
    ledger_for,
    micro_usd,
    parse_budgets,
    window_end,
)
from fluid_build.copilot.health.resilient import ResilientCooldownStore
from fluid_build.copilot.health.sqlite_store import SqliteCooldownStore
from fluid_build.copilot.health.store import LONGEST, MemoryCooldownStore
from fluid_build.copilot.llm.types import Usage


def _at(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


NOON = _at("2026-03-14T12:00:00")

# -- FLUID_BUDGETS -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("team=25usd/day", {"team": BudgetSpec("team", 25 * MICRO, "day")}),
        ("ci=5usd", {"ci": BudgetSpec("ci", 5 * MICRO, "")}),
        (
            " a.b-c_1 = 0.5USD / hour ; x=1usd/month;",
            {
                "a.b-c_1": BudgetSpec("a.b-c_1", MICRO // 2, "hour"),
                "x": BudgetSpec("x", MICRO, "month"),
            },
        ),
        ("t=0.0000001usd", {"t": BudgetSpec("t", 1, "")}),  # rounded up, never 0
        ("", {}),
    ],
)
def test_fluid_budgets_parses(text: str, expected: dict[str, BudgetSpec]) -> None:
    assert parse_budgets(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "team",
        "team=25",
        "team=25eur",
        "team=-1usd",
        "team=0usd",
        "team=25usd/week",
        "te am=1usd",
        "tëam=1usd",
        "a=1usd; a=2usd",
        "a=1usd, b=2usd",
        "a=nanusd",
    ],
)
def test_a_bad_fluid_budgets_is_not_configured_with_an_example(text: str) -> None:
    with pytest.raises(AgentExecutionError) as caught:
        budgets_from_env({"FLUID_BUDGETS": text})
    error = caught.value
    assert error.code == "llm.not_configured"
    assert "FLUID_BUDGETS" in error.message
    assert "team=25usd/day" in error.message  # the example
    assert error.details["variable"] == "FLUID_BUDGETS"


def test_a_client_naming_an_undeclared_budget_is_not_configured() -> None:
    env = {"FLUID_BUDGETS": "team=1usd", "FLUID_BUDGET": "other"}
    with pytest.raises(AgentExecutionError) as caught:
        BudgetGuard.from_env(None, MemoryCooldownStore(), env)
    assert caught.value.code == "llm.not_configured"
    assert "'other'" in caught.value.message
    assert "team" in caught.value.message


def test_no_budget_named_is_no_guard() -> None:
    assert BudgetGuard.from_env(None, MemoryCooldownStore(), {"FLUID_BUDGETS": "a=1usd"}) is None


@pytest.mark.parametrize(
    ("usd", "micro"), [(0.1, 100_000), (1e-9, 1), (0.0000015, 2), (0.0, 0), (2.5, 2_500_000)]
)
def test_amounts_are_whole_micro_usd_rounded_up(usd: float, micro: int) -> None:
    assert micro_usd(usd) == micro


@pytest.mark.parametrize(
    ("window", "now", "end"),
    [
        ("", "2026-03-14T12:00:00", None),
        ("hour", "2026-03-14T12:59:59", "2026-03-14T13:00:00"),
        ("day", "2026-03-14T23:59:59", "2026-03-15T00:00:00"),
        ("day", "2026-03-15T00:00:00", "2026-03-16T00:00:00"),
        ("month", "2026-02-10T08:00:00", "2026-03-01T00:00:00"),
        ("month", "2026-12-31T23:00:00", "2027-01-01T00:00:00"),
    ],
)
def test_windows_follow_the_utc_calendar(window: Any, now: str, end: str | None) -> None:
    assert window_end(window, _at(now)) == (None if end is None else _at(end))


# -- the ledger: one contract, every store -------------------------------------------------


@pytest.fixture(params=["memory", "sqlite", "redis"])
def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BudgetLedger]:
    if request.param == "memory":
        yield MemoryBudgetLedger()
        return
    if request.param == "sqlite":
        store = SqliteCooldownStore(tmp_path / "cooldown.sqlite3")
        yield store.budget_ledger()
        store.budget_ledger().close()
        store.close()
        return
    import redis

    from fluid_build.copilot.health.redis_store import RedisCooldownStore

    url = request.getfixturevalue("redis_url")
    client = redis.Redis.from_url(url)
    client.flushdb()
    yield RedisCooldownStore(client=client).budget_ledger()
    client.flushdb()
    client.close()


@pytest.fixture(params=["memory", "sqlite"])
def clocked(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BudgetLedger]:
    """A ledger on the caller's clock (``now``): Redis keeps its own (tested apart)."""
    if request.param == "memory":
        yield MemoryBudgetLedger()
        return
    store = SqliteCooldownStore(tmp_path / "cooldown.sqlite3")
    yield store.budget_ledger()
    store.budget_ledger().close()
    store.close()


TEAM = BudgetSpec("team", 1_000, "")
DAILY = BudgetSpec("daily", 1_000, "day")


def test_reserve_takes_what_fits_and_refuses_the_rest(ledger: BudgetLedger) -> None:
    first = ledger.reserve(TEAM, 600, "a", NOON + 60, NOON)
    assert first.granted
    assert (first.state.spent, first.state.reserved, first.state.limit) == (0, 600, 1_000)
    refused = ledger.reserve(TEAM, 401, "b", NOON + 60, NOON)
    assert not refused.granted
    assert (refused.state.spent, refused.state.reserved, refused.state.left) == (0, 600, 400)
    assert ledger.reserve(TEAM, 400, "c", NOON + 60, NOON).granted
    assert not ledger.reserve(TEAM, 1, "d", NOON + 60, NOON).granted


def test_settle_replaces_the_reservation_by_the_real_cost(ledger: BudgetLedger) -> None:
    assert ledger.reserve(TEAM, 600, "a", NOON + 60, NOON).granted
    ledger.settle("team", "a", 150, NOON + 1)
    (state,) = ledger.states(NOON + 2)
    assert (state.name, state.spent, state.reserved, state.left) == ("team", 150, 0, 850)
    ledger.settle("team", "gone", 0, NOON + 3)  # a refused or failed attempt spent nothing
    assert ledger.states(NOON + 3)[0].spent == 150


def test_a_hold_whose_process_died_is_spent_when_it_ends(clocked: BudgetLedger) -> None:
    """Issue 32 item 4: its request may have been billed, so it is never given back."""
    assert clocked.reserve(TEAM, 900, "dead", NOON + 60, NOON).granted
    assert not clocked.reserve(TEAM, 200, "b", NOON + 120, NOON + 59).granted
    assert clocked.states(NOON + 59)[0].reserved == 900
    (ended,) = clocked.states(NOON + 60)
    assert (ended.spent, ended.reserved) == (900, 0)
    assert not clocked.reserve(TEAM, 200, "b", NOON + 120, NOON + 60).granted
    assert clocked.reserve(TEAM, 100, "c", NOON + 120, NOON + 60).granted
    # The dead holder's late settle (it was only slow) is not counted twice.
    clocked.settle("team", "dead", 100, NOON + 61)
    clocked.settle("team", "c", 40, NOON + 62)
    (state,) = clocked.states(NOON + 62)
    assert (state.spent, state.reserved) == (940, 0)


def test_a_day_window_resets_at_utc_midnight(clocked: BudgetLedger) -> None:
    ledger = clocked
    late = _at("2026-03-14T23:59:00")
    assert ledger.reserve(DAILY, 900, "a", late + 30, late).granted
    ledger.settle("daily", "a", 900, late + 1)
    refused = ledger.reserve(DAILY, 200, "b", late + 30, late + 2)
    assert not refused.granted
    assert refused.state.ends == _at("2026-03-15T00:00:00")
    midnight = _at("2026-03-15T00:00:00")
    granted = ledger.reserve(DAILY, 200, "c", midnight + 30, midnight)
    assert granted.granted
    assert granted.state.spent == 0
    assert granted.state.ends == _at("2026-03-16T00:00:00")


def test_a_budget_without_a_window_outlives_the_stores_day_cap(clocked: BudgetLedger) -> None:
    ledger = clocked
    assert ledger.reserve(TEAM, 700, "a", NOON + 60, NOON).granted
    ledger.settle("team", "a", 700, NOON + 1)
    later = NOON + 40 * LONGEST  # forty days on, nothing purged it
    refused = ledger.reserve(TEAM, 301, "b", later + 60, later)
    assert not refused.granted
    assert refused.state.spent == 700
    assert refused.state.ends is None


def test_reset_clears_one_budget(ledger: BudgetLedger) -> None:
    other = BudgetSpec("other", 50, "")
    assert ledger.reserve(TEAM, 1_000, "a", NOON + 60, NOON).granted
    assert ledger.reserve(other, 10, "b", NOON + 60, NOON).granted
    assert ledger.reset("team") is True
    assert ledger.reset("team") is False
    assert [state.name for state in ledger.states(NOON)] == ["other"]
    assert ledger.reserve(TEAM, 1_000, "c", NOON + 60, NOON).granted


def test_the_last_declared_limit_wins(ledger: BudgetLedger) -> None:
    assert ledger.reserve(TEAM, 900, "a", NOON + 60, NOON).granted
    ledger.settle("team", "a", 900, NOON)
    assert ledger.reserve(BudgetSpec("team", 2_000, ""), 900, "b", NOON + 60, NOON).granted


def test_clearing_the_cooldown_store_keeps_the_spend(tmp_path: Path) -> None:
    store = SqliteCooldownStore(tmp_path / "c.sqlite3")
    ledger = store.budget_ledger()
    assert ledger.reserve(TEAM, 500, "a", NOON + 60, NOON).granted
    ledger.settle("team", "a", 500, NOON)
    store.clear()  # what `fluid doctor --reset` does
    assert ledger.states(NOON)[0].spent == 500
    ledger.close()
    store.close()


def test_every_store_gives_its_own_ledger(tmp_path: Path) -> None:
    memory = MemoryCooldownStore()
    assert ledger_for(memory) is ledger_for(memory)
    sqlite = SqliteCooldownStore(tmp_path / "c.sqlite3")
    resilient = ResilientCooldownStore(sqlite)
    assert ledger_for(resilient) is sqlite.budget_ledger()  # never the in-memory mirror
    assert ledger_for(None) is None


def test_the_sqlite_store_forgets_a_budget_no_call_used_for_90_days(tmp_path: Path) -> None:
    from fluid_build.copilot.health.budget import IDLE_FORGET

    store = SqliteCooldownStore(tmp_path / "c.sqlite3")
    ledger = store.budget_ledger()
    assert ledger.reserve(TEAM, 700, "a", NOON + 60, NOON).granted
    ledger.settle("team", "a", 700, NOON + 1)  # a settle is no use: the reserve was
    assert ledger.reserve(DAILY, 100, "b", NOON + 60, NOON).granted  # its hold never settles
    soon = NOON + IDLE_FORGET - 1
    assert ledger.reserve(BudgetSpec("ci", 1_000), 1, "c", soon + 60, soon).granted
    # The day window ended more than a day ago: gone, with its dead hold.
    assert [s.name for s in ledger.states(soon)] == ["ci", "team"]
    later = NOON + IDLE_FORGET + 1
    assert ledger.reserve(BudgetSpec("ci", 1_000), 1, "d", later + 60, later).granted
    assert [s.name for s in ledger.states(later)] == ["ci"]
    conn = ledger._connection()
    assert conn.execute("SELECT count(*) FROM fluid_budget_hold").fetchone()[0] == 2  # ci's
    ledger.close()
    store.close()


def test_every_redis_budget_expires(request: pytest.FixtureRequest) -> None:
    import time

    import redis

    from fluid_build.copilot.health.budget import IDLE_FORGET
    from fluid_build.copilot.health.redis_store import RedisCooldownStore

    client = redis.Redis.from_url(request.getfixturevalue("redis_url"))
    client.delete("fluid:budget:team", "fluid:budget:daily")
    ledger = RedisCooldownStore(client=client).budget_ledger()
    now = time.time()
    assert ledger.reserve(TEAM, 700, "a", now + 60, now).granted
    ledger.settle("team", "a", 700, now + 1)
    assert IDLE_FORGET * 1000 - 60_000 < client.pttl("fluid:budget:team") <= IDLE_FORGET * 1000
    assert ledger.reserve(DAILY, 100, "b", now + 60, now).granted
    ends = window_end("day", now)
    assert ends is not None
    expected = (ends - now + 86_400) * 1000
    assert expected - 60_000 < client.pttl("fluid:budget:daily") <= expected + 1_000
    client.delete("fluid:budget:team", "fluid:budget:daily")
    client.close()


def _redis_ledger(request: pytest.FixtureRequest) -> Any:
    import redis

    from fluid_build.copilot.health.redis_store import RedisCooldownStore

    client = redis.Redis.from_url(request.getfixturevalue("redis_url"))
    client.delete("fluid:budget:team", "fluid:budget:monthly")

    def done() -> None:
        client.delete("fluid:budget:team", "fluid:budget:monthly")
        client.close()

    request.addfinalizer(done)
    return RedisCooldownStore(client=client).budget_ledger(), client


def test_redis_holds_end_on_the_servers_clock_not_a_slow_hosts(
    request: pytest.FixtureRequest,
) -> None:
    """Issue 32 item 6: a host 120 s slow wrote holds the others saw as ended."""
    import time

    ledger, client = _redis_ledger(request)
    slow = time.time() - 120
    assert ledger.reserve(TEAM, 600, "slow-host", slow + 60, slow).granted  # lives 60 s
    now = time.time()
    refused = ledger.reserve(TEAM, 600, "other-host", now + 60, now)
    assert not refused.granted
    assert refused.state.reserved == 600
    seconds, micros = client.time()
    server = seconds + micros / 1e6
    raw = client.hget("fluid:budget:team", "h:slow-host").decode()
    assert raw.startswith("600 ")
    assert server + 55 < float(raw.split()[1]) <= server + 60


def test_redis_windows_follow_the_servers_clock_not_a_fast_hosts(
    request: pytest.FixtureRequest,
) -> None:
    """Issue 32 item 6: a host ahead of the others reset the window's spend for everyone."""
    import time

    ledger, client = _redis_ledger(request)
    monthly = BudgetSpec("monthly", 1_000, "month")
    now = time.time()
    assert ledger.reserve(monthly, 900, "a", now + 60, now).granted
    ledger.settle("monthly", "a", 900, now)
    ahead = now + 40 * 86_400  # a host whose clock is in another month
    refused = ledger.reserve(monthly, 200, "b", ahead + 60, ahead)
    assert not refused.granted
    assert refused.state.spent == 900
    seconds, _ = client.time()
    assert refused.state.ends == window_end("month", float(seconds))


def test_the_redis_scripts_calendar_is_the_utc_calendar(request: pytest.FixtureRequest) -> None:
    import redis

    from fluid_build.copilot.health.redis_store import _BUDGET_BOOK

    client = redis.Redis.from_url(request.getfixturevalue("redis_url"))
    request.addfinalizer(client.close)
    script = client.register_script(_BUDGET_BOOK + "return fresh_end(ARGV[1], tonumber(ARGV[2]))")
    moments = [
        _at("2024-02-29T23:59:59"),  # a leap day
        _at("2025-02-28T12:00:00"),
        _at("2026-12-31T23:59:59.5"),
        _at("2000-03-01T00:00:00"),
        _at("2100-02-28T00:00:00"),  # no leap day in 2100
        *(NOON + k * 86_400 * 7.3 for k in range(60)),
    ]
    for moment in moments:
        for window in ("hour", "day", "month"):
            got = script(args=[window, repr(moment)]).decode()
            assert float(got) == window_end(window, moment), (window, moment)  # type: ignore[arg-type]
    assert script(args=["", repr(NOON)]) == b""


# -- refusals ------------------------------------------------------------------------------

PRICES = {"m": ModelPrice(input=1.0, output=2.0)}  # USD per million tokens


def _guard(ledger: BudgetLedger, usd: float = 1.0, **kwargs: Any) -> BudgetGuard:
    clock = kwargs.pop("wall", lambda: NOON)
    return BudgetGuard(
        BudgetSpec("team", micro_usd(usd), kwargs.pop("window", "")),
        ledger,
        prices=PRICES,
        wall=clock,
        **kwargs,
    )


def test_a_call_reserves_its_worst_case_and_settles_its_price() -> None:
    ledger = MemoryBudgetLedger()
    spend = _guard(ledger).spend("openai_compatible", "m", 1_000, 500, deadline=30)
    hold = spend.reserve()
    assert hold is not None
    assert hold.amount == 2_000  # 1000 in at 1 USD/M + 500 out at 2 USD/M = 0.002 USD
    assert ledger.states(NOON)[0].reserved == 2_000
    answer = type("Parsed", (), {"usage": Usage(input_tokens=1_000, output_tokens=100)})()
    spend.succeeded(hold, (answer, None))
    (state,) = ledger.states(NOON)
    assert (state.spent, state.reserved) == (1_200, 0)


def test_exhausted_is_not_retryable_and_says_spent_left_and_what_it_would_reserve() -> None:
    ledger = MemoryBudgetLedger()
    guard = _guard(ledger, usd=0.003, window="day")
    first = guard.spend("openai_compatible", "m", 1_000, 500, deadline=30)
    first.settle(first.reserve(), 0.0015)
    with pytest.raises(AgentExecutionError) as caught:
        guard.spend("openai_compatible", "m", 1_000, 500, deadline=30).reserve()
    error = caught.value
    assert error.code == "budget.cost_exhausted"
    assert error.retryable is False
    # What happened: not "spent", but a call that needs more than is left.
    assert error.message.startswith(
        "budget team has 0.0015 USD left (0.0015 USD spent and 0 USD reserved by calls in flight, "
        "of 0.003 USD/day), and this call to openai_compatible:m would reserve up to 0.002 USD "
        "(1,000 input tokens and up to 500 output tokens, priced), more than is left; no "
        "request was sent; the budget starts again at 2026-03-15 00:00 UTC; "
    )
    assert error.retry_after == 300.0  # 12 h to midnight, capped as every wait is
    assert error.summary == error.message  # the wait is the budget's, never a server's
    assert error.details["window_end"] == _at("2026-03-15T00:00:00")
    # 1,000 input tokens cost 0.001 USD; each output token 2 micro-USD: 250 fit in 0.0015.
    assert error.details["fitting_max_output_tokens"] == 250
    assert error.details["left_usd"] == 0.0015
    # The advice can be followed: from the command line, and from Python.
    assert error.message.endswith(
        "at most 250 output tokens fit in what is left: ask for them with --max-output-tokens "
        "250 (max_output_tokens= in Python), or use a cheaper model (--model)"
    )
    from fluid_build.cli._messages import describe

    shown = describe(error)
    assert "ask for them with --max-output-tokens 250, or use a cheaper model" in shown.headline
    assert "in Python" not in shown.headline
    assert shown.hint is not None
    assert "--max-output-tokens" in shown.hint
    assert pickle.loads(pickle.dumps(error)).code  # noqa: S301 - our own bytes == "budget.cost_exhausted"


def test_an_unpriced_model_under_a_budget_is_refused_with_the_way_to_price_it() -> None:
    spend = _guard(MemoryBudgetLedger()).spend("ollama", "llama3", 10, 10, deadline=30)
    with pytest.raises(AgentExecutionError) as caught:
        spend.reserve()
    assert caught.value.code == "budget.cost_unknown"
    assert caught.value.retryable is False
    assert "FLUID_PRICES" in caught.value.message
    assert "llama3" in caught.value.message


class _Down:
    def reserve(self, *args: Any) -> Any:
        raise ConnectionError("redis is down")

    def settle(self, *args: Any) -> None:
        raise ConnectionError("redis is down")

    def states(self, now: float) -> list[Any]:
        raise ConnectionError("redis is down")

    def reset(self, name: str) -> bool:
        raise ConnectionError("redis is down")


def test_a_store_that_cannot_be_reached_refuses_unless_fail_open(
    caplog: pytest.LogCaptureFixture,
) -> None:
    spend = _guard(_Down()).spend("openai_compatible", "m", 10, 10, deadline=30)
    with pytest.raises(AgentExecutionError) as caught:
        spend.reserve()
    assert caught.value.code == "budget.store_unavailable"
    assert caught.value.retryable is True
    assert "FLUID_BUDGET_FAIL_OPEN=1" in caught.value.message
    open_spend = _guard(_Down(), fail_open=True).spend("openai_compatible", "m", 10, 10, 30)
    assert open_spend.reserve() is None  # unmetered, and said so
    assert "unmetered" in caplog.text


def test_fail_open_comes_from_the_environment() -> None:
    env = {"FLUID_BUDGETS": "team=1usd", "FLUID_BUDGET_FAIL_OPEN": "1"}
    guard = BudgetGuard.from_env("team", MemoryCooldownStore(), env)
    assert guard is not None
    assert guard.fail_open


def test_a_broken_stream_settles_its_usage_else_its_whole_reservation() -> None:
    ledger = MemoryBudgetLedger()
    guard = _guard(ledger)
    stream = guard.spend("openai_compatible", "m", 1_000, 500, deadline=30)
    hold = stream.reserve()
    stream.succeeded(hold, ("a response", "chunks"))  # an opening: the stream goes on
    assert ledger.states(NOON)[0].reserved == 2_000
    stream.finish(Usage(input_tokens=1_000, output_tokens=50))
    assert ledger.states(NOON)[0].spent == 1_100
    cut = guard.spend("openai_compatible", "m", 1_000, 500, deadline=30)
    cut.succeeded(cut.reserve(), ("a response", "chunks"))
    cut.finish(None)  # cut before any usage arrived: the whole reservation is spent
    (state,) = ledger.states(NOON)
    assert (state.spent, state.reserved) == (3_100, 0)


def test_an_error_answer_spends_nothing_a_lost_answer_its_reservation() -> None:
    import httpx

    ledger = MemoryBudgetLedger()
    guard = _guard(ledger)
    spend = guard.spend("openai_compatible", "m", 1_000, 500, deadline=30)
    answered = AgentExecutionError("429", code="llm.rate_limited")
    answered.status_code = 429  # type: ignore[attr-defined]
    spend.failed(spend.reserve(), answered)
    spend.failed(spend.reserve(), httpx.ConnectError("refused"))
    assert ledger.states(NOON)[0].spent == 0
    spend.failed(spend.reserve(), httpx.ReadTimeout("no answer"))
    assert ledger.states(NOON)[0].spent == 2_000


# -- a fleet on one budget: real processes, a real loopback server --------------------------

WORKERS = 8
BUDGET_USD = 0.5  # 500,000 micro-USD
#: The fleet's calls (issue 32 item 7): each reserves about 12,500 micro-USD (1,000 prompt
#: tokens and 500 output at 6.25 and 12.5 USD per million) and costs 10,000 (0.01 USD), with
#: a 10 s deadline.
FLEET_ENV = {
    "BUDGET_WORKER_PRICE": '{"m": {"input": 6.25, "output": 12.5}}',
    "BUDGET_WORKER_DEADLINE": "10",
}
COST = 10_000


class _Server:
    """A loopback chat endpoint that counts the requests it answers."""

    def __init__(self) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        server = self
        self.requests = 0
        self.lock = threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length") or 0))
                with server.lock:
                    server.requests += 1
                body = (
                    b'{"id": "c1", "object": "chat.completion", "model": "m", "choices": '
                    b'[{"index": 0, "message": {"role": "assistant", "content": "ok"}, '
                    b'"finish_reason": "stop"}], '
                    b'"usage": {"prompt_tokens": 1000, "completion_tokens": 300}}'
                )
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"
        self.thread = threading.Thread(target=self.http.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()


def _worker_env(tmp_path: Path, store_url: str | None) -> dict[str, str]:
    import os

    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(tmp_path),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "FLUID_BUDGETS": f"team={BUDGET_USD}usd/month",
        "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
        "PYTHONFAULTHANDLER": "1",  # a worker that crashes says where
    }
    if store_url is not None:
        env["FLUID_COOLDOWN_URL"] = store_url
    return env


def _start(mode: str, url: str, out: Path, env: dict[str, str]) -> Any:
    import subprocess
    import sys

    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.budget_worker", mode, url, str(out)],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    return proc


def _close(proc: Any) -> None:
    proc.stdin.close()
    proc.stdout.close()


def _fleet(tmp_path: Path, store_url: str | None) -> dict[str, Any]:
    import json

    server = _Server()
    env = {**_worker_env(tmp_path, store_url), **FLEET_ENV}
    try:
        outs = [tmp_path / f"w{i}.jsonl" for i in range(WORKERS)]
        procs = [_start("calls", server.url, out, env) for out in outs]
        for proc in procs:  # every worker starts calling at once
            proc.stdin.write("go\n")
            proc.stdin.flush()
        for proc in procs:
            assert proc.wait(timeout=120) == 0
            _close(proc)
        records = [json.loads(line) for out in outs for line in out.read_text().splitlines()]
    finally:
        server.close()
    return {"records": records, "requests": server.requests}


def _ledger_of(tmp_path: Path, store_url: str | None) -> BudgetLedger:
    from fluid_build.copilot.health.cooldown import cooldown_store_from_env

    ledger = ledger_for(cooldown_store_from_env(_worker_env(tmp_path, store_url)))
    assert ledger is not None
    return ledger


@pytest.mark.parametrize("store", ["sqlite", "redis"])
def test_eight_processes_share_one_budget(
    store: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    import time

    url = None
    if store == "redis":
        url = request.getfixturevalue("redis_url")
        import redis

        redis.Redis.from_url(url).delete("fluid:budget:team")
    fleet = _fleet(tmp_path, url)
    records = fleet["records"]
    granted = [r for r in records if r["outcome"] == "ok"]
    refused = [r for r in records if r["outcome"] != "ok"]
    assert len(records) == WORKERS * 15
    assert {r["outcome"] for r in refused} == {"budget.cost_exhausted"}
    assert fleet["requests"] == len(granted)  # a refusal sends no request
    (state,) = _ledger_of(tmp_path, url).states(time.time())
    limit = micro_usd(BUDGET_USD)
    assert state.reserved == 0
    assert state.spent == COST * len(granted)
    assert state.spent <= limit
    assert state.spent >= 0.8 * limit
    assert [r["cost_usd"] for r in granted] == [pytest.approx(COST / MICRO)] * len(granted)
    # Each call ends answered or refused, and quickly: far inside its 10 s deadline.
    slowest = max(r["seconds"] for r in records)
    assert slowest < 8
    print(  # the figures the closing note gives (pytest -s shows them)
        f"{store}: spent {state.spent / MICRO:.4f} of {limit / MICRO:.4f} USD; "
        f"{fleet['requests']} requests sent, {len(granted)} calls granted, "
        f"{len(refused)} refused; slowest call {slowest:.2f} s"
    )
    # Run again on the same store, nothing cleared: the spend outlived every process, so
    # the whole second fleet is refused and sends nothing.
    again = _fleet(tmp_path, url)
    assert again["requests"] == 0
    assert len(again["records"]) == WORKERS * 15
    assert {r["outcome"] for r in again["records"]} == {"budget.cost_exhausted"}
    assert max(r["seconds"] for r in again["records"]) < 8
    (after,) = _ledger_of(tmp_path, url).states(time.time())
    assert (after.spent, after.reserved) == (state.spent, 0)


@pytest.mark.parametrize("store", ["sqlite", "redis"])
def test_a_killed_processs_hold_is_spent_when_it_ends(
    store: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Issue 32 item 4: a worker killed after the server took its request may have been
    billed; once its hold ends (its 2 s deadline plus a margin of 0 here) it is spent."""
    import signal
    import socket
    import time

    url = None
    if store == "redis":
        url = request.getfixturevalue("redis_url")
        import redis

        redis.Redis.from_url(url).delete("fluid:budget:team")
    # A server that takes the connection and never answers: the call holds its reservation.
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    env = {**_worker_env(tmp_path, url), "BUDGET_WORKER_DEADLINE": "2", "BUDGET_WORKER_MARGIN": "0"}
    address = f"http://127.0.0.1:{silent.getsockname()[1]}"
    try:
        proc = _start("hold", address, tmp_path / "unused", env)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        ledger = _ledger_of(tmp_path, url)
        # The call reserves before it sends: once it has connected, its hold is in the store.
        silent.settimeout(30)
        connection, _ = silent.accept()
        held_at = time.monotonic()
        (held,) = ledger.states(time.time())
        assert held.reserved, "the worker's call connected without a reservation"
        assert 2_000 <= held.reserved < 3_000  # ~1,000 prompt tokens and 500 output, priced
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
        _close(proc)
        connection.close()
    finally:
        silent.close()
    # Its hold lives 2 s on the store's clock (Redis: the server's), then is spent whole.
    while True:
        (state,) = ledger.states(time.time() + (3 if store == "sqlite" else 0))
        if state.reserved == 0 or time.monotonic() - held_at > 10:
            break
        time.sleep(0.1)  # noqa: real-sleep - Redis expires the hold on its own clock
    assert (state.spent, state.reserved) == (held.reserved, 0)
    # And stays spent: what is left excludes it, for a new process as for this one.
    limit = micro_usd(BUDGET_USD)
    spec = BudgetSpec("team", limit, "month")
    now = time.time() + (3 if store == "sqlite" else 0)
    assert not ledger.reserve(spec, limit - held.reserved + 1, "next", now + 60, now).granted
    after = ledger.reserve(spec, limit - held.reserved, "fits", now + 60, now)
    assert after.granted
    assert after.state.spent == held.reserved


# -- a named budget is shared or refused, never kept apart in silence (issue 32 item 2) ----


@pytest.mark.parametrize(
    ("setting", "says"),
    [
        ({"FLUID_COOLDOWN_URL": "redis://127.0.0.1:63a79/0"}, "cannot be used"),
        ({"FLUID_COOLDOWN_URL": "off"}, "FLUID_COOLDOWN_URL=off"),
        ({"FLUID_COOLDOWN_URL": "redis://127.0.0.1:6379/0", "NO_REDIS": "1"}, "redis"),
    ],
    ids=["unparsable-url", "off", "redis-package-missing"],
)
def test_processes_with_no_shared_store_are_refused_before_sending(
    setting: dict[str, str], says: str, tmp_path: Path
) -> None:
    """Two processes, each of whose clients would have spent the whole limit apart."""
    import json

    env = _worker_env(tmp_path, setting["FLUID_COOLDOWN_URL"])
    if setting.get("NO_REDIS"):  # an environment without the redis package
        fake = tmp_path / "no_redis" / "redis"
        fake.mkdir(parents=True)
        (fake / "__init__.py").write_text("raise ImportError('No module named redis')\n")
        env["PYTHONPATH"] = f"{fake.parent}:{env['PYTHONPATH']}"
    server = _Server()
    try:
        outs = [tmp_path / f"w{i}.jsonl" for i in range(2)]
        procs = [_start("calls", server.url, out, env) for out in outs]
        for proc in procs:
            proc.stdin.write("go\n")
            proc.stdin.flush()
        for proc in procs:
            assert proc.wait(timeout=60) == 0
            _close(proc)
        records = [json.loads(line) for out in outs for line in out.read_text().splitlines()]
        assert server.requests == 0
        assert len(records) == 2 * 15
        assert {r["outcome"] for r in records} == {"budget.store_unavailable"}
        assert says in records[0]["message"]
        assert "FLUID_BUDGET_FAIL_OPEN=1" in records[0]["message"]
        # FLUID_BUDGET_FAIL_OPEN=1: the operator's choice to spend unmetered meanwhile.
        proc = _start("calls", server.url, outs[0], {**env, "FLUID_BUDGET_FAIL_OPEN": "1"})
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.wait(timeout=60) == 0
        _close(proc)
        opened = [json.loads(line) for line in outs[0].read_text().splitlines()]
        assert {r["outcome"] for r in opened} == {"ok"}
        assert server.requests == 15
    finally:
        server.close()


def test_a_client_whose_envelope_has_no_store_is_refused() -> None:
    from fluid_build.copilot.call.envelope import RetryEnvelope
    from fluid_build.copilot.client import LLMClient

    env = {"FLUID_BUDGETS": "team=1usd", "OPENAI_API_KEY": "sk-test"}
    llm = LLMClient("openai", "gpt-4o-mini", envelope=RetryEnvelope(), env=env, budget="team")
    assert llm.budget is not None
    spend = llm.budget.spend("openai", "gpt-4o-mini", 10, 10, deadline=30)
    with pytest.raises(AgentExecutionError) as caught:
        spend.reserve()
    assert caught.value.code == "budget.store_unavailable"
    assert caught.value.retryable is False
    assert "RetryEnvelope(cooldown=None)" in caught.value.message
    llm.close()


def test_memory_is_one_ledger_for_the_whole_process() -> None:
    from fluid_build.copilot.health.budget import PROCESS_LEDGER
    from fluid_build.copilot.health.cooldown import cooldown_store_from_env

    env = {"FLUID_COOLDOWN_URL": "memory", "FLUID_BUDGETS": "shared-mem=0.002usd"}
    first = BudgetGuard.from_env("shared-mem", cooldown_store_from_env(env), env, prices=PRICES)
    second = BudgetGuard.from_env("shared-mem", cooldown_store_from_env(env), env, prices=PRICES)
    assert first is not None
    assert second is not None
    assert first.ledger is second.ledger is PROCESS_LEDGER
    PROCESS_LEDGER.reset("shared-mem")
    try:
        # 1,000 input and 500 output tokens: 0.002 USD, the whole limit, for one client only.
        first.spend("openai_compatible", "m", 1_000, 500, deadline=30).reserve()
        with pytest.raises(AgentExecutionError) as caught:
            second.spend("openai_compatible", "m", 1_000, 500, deadline=30).reserve()
        assert caught.value.code == "budget.cost_exhausted"
    finally:
        PROCESS_LEDGER.reset("shared-mem")


def test_a_store_file_removed_under_a_live_process_does_not_split_the_ledger(
    tmp_path: Path,
) -> None:
    """Issue 32 item 5: the old process wrote on to the removed file, new ones to a new
    one, and each spent the limit. Now the old one notices and moves to the new file."""
    env = {**_worker_env(tmp_path, None), "FLUID_BUDGETS": "team=0.001usd"}  # 1,000 micro
    old = _start("ledger", "-", "-", env)

    def ask(proc: Any, line: str) -> str:
        proc.stdin.write(line + "\n")
        proc.stdin.flush()
        return str(proc.stdout.readline().strip())

    assert ask(old, "100 a") == "granted 0"
    from fluid_build.copilot.health.sqlite_store import default_cooldown_path

    path = default_cooldown_path(env)
    assert path.exists()
    for name in (path, *path.parent.glob(path.name + "-*")):  # `rm cooldown.sqlite3*`
        name.unlink()
    new = _start("ledger", "-", "-", env)
    try:
        assert ask(new, "900 b") == "granted 0"  # a new file: the 100 went with the old one
        # The old process sees the 900 the new one spent: one ledger, not two.
        assert ask(old, "500 c") == "refused 900"
        assert ask(old, "100 d") == "granted 900"
        assert ask(new, "1 e") == "refused 1000"
    finally:
        for proc in (old, new):
            proc.stdin.close()
            assert proc.wait(timeout=30) == 0
            proc.stdout.close()
