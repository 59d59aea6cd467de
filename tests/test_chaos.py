"""Chaos: many concurrent ``acomplete`` calls against two servers that fail on a seeded schedule.

Real sockets, real time, real sleeps (all short): two chaos servers
(tests/chaos_server.py) on loopback, endpoints ``a`` and ``b``, draw a fault
for each request, and each goes through one long burst of 503s. The clients
run as in production: the real retry envelope over the default store (the
sqlite file under ``$XDG_CACHE_HOME``) with a circuit breaker on, set short
so that breakers open and recover within the run. The suite runs 120 calls
at 20 concurrency; ``CHAOS_CALLS=1000 CHAOS_CONCURRENCY=50`` is the full size
(docs/chaos-and-fuzzing.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import math
import os
import time
from collections import Counter, defaultdict
from collections.abc import Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Final

import httpx
import pytest
from pydantic import BaseModel

from fluid_build.copilot import LLMClient
from fluid_build.copilot.agents.errors import (
    AgentExecutionError,
    ProviderError,
    ProviderServerError,
    ProviderTimeoutError,
    RateLimitError,
)
from fluid_build.copilot.call.envelope import COOLDOWN, RetryEnvelope, RetryEvent, RetryPolicy
from fluid_build.copilot.health.breaker import HALF, OPEN, TRIAL, CircuitBreaker
from fluid_build.copilot.health.cooldown import (
    CooldownKey,
    CooldownStore,
    MemoryCooldownStore,
    ResilientCooldownStore,
    SqliteCooldownStore,
    StoreEntry,
    cooldown_store_from_env,
    default_cooldown_path,
    key_fingerprint,
    normalize_endpoint,
)
from fluid_build.copilot.llm.types import Completion
from tests.chaos_server import FAULTS, ChaosServer, Request, chaos_server

CALLS: Final = int(os.environ.get("CHAOS_CALLS") or 120)
CONCURRENCY: Final = int(os.environ.get("CHAOS_CONCURRENCY") or 20)
SEED: Final = int(os.environ.get("CHAOS_SEED") or 20_240_611)

TIMEOUT: Final = 0.5  # the client's connect/read/write/pool timeout, per attempt
DEADLINE: Final = 2.0
POLICY: Final = RetryPolicy(attempts=4, backoff_base=0.01, backoff_cap=0.05, deadline=DEADLINE)
# The last attempt may start just before the deadline and run for a timeout;
# LATE is the event loop's own lateness under load, on top.
LATE: Final = 0.5
CALL_LIMIT: Final = DEADLINE + TIMEOUT + LATE

KEYS: Final = 4  # API keys, each used on both endpoints: 8 cooldown keys, 8 breakers
ENDPOINTS: Final = ("a", "b")
MODEL: Final = "chaos-model"

# Call n starts no earlier than n * SPAN / CALLS seconds into the run (later
# when CONCURRENCY calls are running), so calls keep coming to both endpoints
# through the bursts and after them, however fast a refused call ends.
SPAN: Final = float(os.environ.get("CHAOS_SPAN") or CALLS / (1.75 * CONCURRENCY))
# Each endpoint's burst of 503s: (from, for) seconds after its first request.
# Endpoint a's comes first, then b's, so each has its breakers open while the
# other serves, and both leave time to recover before the calls run out.
BURSTS: Final = {"a": (0.10 * SPAN, 0.25 * SPAN), "b": (0.42 * SPAN, 0.25 * SPAN)}
# The breaker, short enough to open and recover many times within the run.
# Four failures in a row open it: a burst does that on every key within a
# few hundred milliseconds, even on a loaded machine; the background
# schedule (a third of its requests fail in a way that counts) does it now
# and then too.
THRESHOLD: Final = 4
COOL_OFF: Final = 0.3
BREAKER_WINDOW: Final = 1.0

#: The call of the test a task is running (the request hook and the store read it).
CALL: Final[ContextVar[int | None]] = ContextVar("chaos_call", default=None)


def api_key(i: int) -> str:
    return f"chaos-key-{i}"


# The x-key of each API key, by its fingerprint in the store's keys.
X_KEY: Final = {key_fingerprint(api_key(i)): f"k{i}" for i in range(KEYS)}


class Answer(BaseModel):
    answer: str
    request: int


@dataclass
class Outcome:
    call: int
    server: str  # the endpoint's name
    key: int
    at: float  # time.time() when the call started (after its pace and the gate)
    seconds: float
    result: Completion | Exception

    @property
    def who(self) -> str:
        """Its cooldown key and breaker, as the checks name them: ``a/k0``."""
        return f"{self.server}/k{self.key}"

    @property
    def code(self) -> str | None:
        return self.result.code if isinstance(self.result, AgentExecutionError) else None


def who(request: Request) -> str:
    return f"{request.server}/{request.key}"


@dataclass(frozen=True)
class Opened:
    """A cooldown window the envelope opened: on which key, when, for how long."""

    key: str
    at: float
    seconds: float


@dataclass(frozen=True)
class StoreOp:
    """A write to a breaker's entries: which, on whose breaker, by which call, when.

    ``at`` is the ``now`` the breaker gave the store (``time.time()`` when
    the write does not take one); ``ok`` is what ``acquire`` answered.
    """

    at: float
    op: str  # extend, acquire, release, delete, cap
    prefix: str  # breaker-open:, breaker-half:, breaker-trial:
    who: str
    call: int | None
    seconds: float = 0.0
    owner: str | None = None
    ok: bool = True
    prefixes: tuple[str, ...] = ()  # for a delete: every entry it removed


Waited = tuple[int | None, RetryEvent]  # a wait of the envelope, and the call that took it


class RecordingStore:
    """The envelope's store, logging what the checks need; it changes nothing by default.

    Every cooldown window opened (``opened``) and every write to an open,
    half-open or trial entry (``ops``), stamped with the call that made it.
    The negative controls break it on purpose: ``honour_cooldowns=False``
    hides the windows from readers, ``honour_breakers=False`` hides open and
    half-open breakers, ``exclusive_leases=False`` grants every trial lease.
    """

    def __init__(
        self,
        inner: CooldownStore,
        endpoints: Mapping[str, str],
        *,
        honour_cooldowns: bool = True,
        honour_breakers: bool = True,
        exclusive_leases: bool = True,
    ) -> None:
        self.inner = inner
        self.endpoints = dict(endpoints)  # normalised base URL -> server name
        self.honour_cooldowns = honour_cooldowns
        self.honour_breakers = honour_breakers
        self.exclusive_leases = exclusive_leases
        self.opened: list[Opened] = []
        self.ops: list[StoreOp] = []

    def who(self, key: str) -> str:
        """``a/k0`` for a key of endpoint a and API key 0, whatever its prefix."""
        parsed = CooldownKey.parse(key.partition(":")[2])
        if parsed is None:
            return key
        server = self.endpoints.get(parsed.endpoint, parsed.endpoint)
        return f"{server}/{X_KEY.get(parsed.fingerprint, parsed.fingerprint)}"

    def _log(self, at: float, op: str, key: str, **extra: Any) -> None:
        prefix = next((p for p in (OPEN, HALF, TRIAL) if key.startswith(p)), None)
        if prefix is not None:
            self.ops.append(StoreOp(at, op, prefix, self.who(key), CALL.get(), **extra))

    def _hidden(self, key: str) -> bool:
        return (not self.honour_cooldowns and key.startswith(COOLDOWN)) or (
            not self.honour_breakers and key.startswith((OPEN, HALF))
        )

    def remaining(self, key: str, now: float) -> float:
        return 0.0 if self._hidden(key) else self.inner.remaining(key, now)

    def peek(self, keys: Sequence[str], now: float) -> list[tuple[float, int]]:
        seen = self.inner.peek(keys, now)
        return [(0.0, 0) if self._hidden(k) else v for k, v in zip(keys, seen, strict=True)]

    def extend(self, key: str, seconds: float, now: float, note: str = "") -> float:
        if key.startswith(COOLDOWN):
            self.opened.append(Opened(self.who(key), now, seconds))
        self._log(now, "extend", key, seconds=seconds)
        return self.inner.extend(key, seconds, now, note)

    def cap(self, key: str, seconds: float, now: float) -> None:
        self._log(now, "cap", key, seconds=seconds)
        self.inner.cap(key, seconds, now)

    def incr(self, key: str, ttl: float, now: float, note: str = "") -> int:
        return self.inner.incr(key, ttl, now, note)

    def count(self, key: str, now: float) -> int:
        return self.inner.count(key, now)

    def acquire(self, key: str, owner: str, ttl: float, now: float) -> bool:
        ok = self.inner.acquire(key, owner, ttl, now) or not self.exclusive_leases
        self._log(now, "acquire", key, seconds=ttl, owner=owner, ok=ok)
        return ok

    def release(self, key: str, owner: str) -> None:
        self._log(time.time(), "release", key, owner=owner)
        self.inner.release(key, owner)

    def delete(self, *keys: str) -> None:
        # One entry per breaker, naming all it removed: a close removes them together.
        now = time.time()
        removed: defaultdict[str, list[str]] = defaultdict(list)
        for key in keys:
            prefix = next((p for p in (OPEN, HALF, TRIAL) if key.startswith(p)), None)
            if prefix is not None:
                removed[self.who(key)].append(prefix)
        for name, prefixes in removed.items():
            self.ops.append(StoreOp(now, "delete", "", name, CALL.get(), prefixes=tuple(prefixes)))
        self.inner.delete(*keys)

    def entries(self, now: float) -> list[StoreEntry]:
        return self.inner.entries(now)

    def clear(self) -> int:
        return self.inner.clear()

    @property
    def degraded(self) -> bool:
        """Whether the shared store failed and the envelope fell back to memory."""
        return bool(getattr(self.inner, "degraded", False))

    def close(self) -> None:
        close = getattr(self.inner, "close", None)
        if callable(close):
            close()


def default_store(servers: Sequence[ChaosServer], **flaws: bool) -> RecordingStore:
    """The store ``RetryEnvelope.from_env`` builds here: the sqlite file under XDG_CACHE_HOME."""
    store = cooldown_store_from_env()  # tests/conftest.py points XDG_CACHE_HOME at tmp_path
    assert isinstance(store, ResilientCooldownStore)
    assert isinstance(store.primary, SqliteCooldownStore)
    assert store.primary.path == default_cooldown_path()
    default = RetryEnvelope.from_env()  # the same file, and a breaker on it
    assert isinstance(default.cooldown, ResilientCooldownStore)
    assert isinstance(default.cooldown.primary, SqliteCooldownStore)
    assert default.cooldown.primary.path == store.primary.path
    assert isinstance(default.breaker, CircuitBreaker)
    default.cooldown.close()
    endpoints = {normalize_endpoint(server.base_url): server.name for server in servers}
    return RecordingStore(store, endpoints, **flaws)


def breaker_on(store: CooldownStore, threshold: int = THRESHOLD) -> CircuitBreaker:
    return CircuitBreaker(
        store,
        threshold=threshold,
        cool_off=COOL_OFF,
        window=BREAKER_WINDOW,
        trial_seconds=DEADLINE,
        clock=time.time,
    )


def open_fds() -> set[tuple[str, str]]:
    """This process's open descriptors and what they point at (``socket:[inode]`` ...)."""
    gc.collect()
    fds = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            fds.add((fd, os.readlink(f"/proc/self/fd/{fd}")))
        except OSError:  # the descriptor listdir itself used, now closed
            continue
    return fds


def envelope(
    policy: RetryPolicy = POLICY,
    events: list[Waited] | None = None,
    store: CooldownStore | None = None,
    breaker: CircuitBreaker | None = None,
) -> RetryEnvelope:
    seen: list[Waited] = [] if events is None else events

    def hook(event: RetryEvent) -> None:  # the default hook would log a line per wait
        seen.append((CALL.get(), event))

    return RetryEnvelope(
        policy,
        cooldown=MemoryCooldownStore() if store is None else store,
        breaker=breaker,
        hook=hook,
        clock=time.monotonic,
        wall=time.time,
        asleep=asyncio.sleep,  # noqa: real-sleep - the chaos tests run in real time
    )


async def stamp(request: httpx.Request) -> None:
    """Tell the server when the envelope let this attempt go (before the pool and the socket)."""
    request.headers["x-sent-at"] = repr(time.time())
    call = CALL.get()
    if call is not None:
        request.headers["x-call"] = str(call)


async def drive(
    servers: Sequence[ChaosServer],
    env: RetryEnvelope,
    calls: int,
    concurrency: int,
    keys: int = KEYS,
    timeout: float = TIMEOUT,
    span: float = 0.0,
) -> list[Outcome]:
    """``calls`` calls, ``concurrency`` at a time, over the servers and ``keys`` API keys.

    Call n goes to server ``n % len(servers)`` with API key
    ``n // len(servers) % keys``, and starts no earlier than ``n * span /
    calls`` seconds in.
    """
    baseline = asyncio.all_tasks()
    # One pool per API key, shared by its clients on every endpoint; x-key tells the server which.
    https = [
        httpx.AsyncClient(
            timeout=httpx.Timeout(timeout),
            headers={"x-key": f"k{i}"},
            event_hooks={"request": [stamp]},
        )
        for i in range(keys)
    ]
    clients = {
        (server.name, i): LLMClient(
            "vllm",
            MODEL,
            api_key=api_key(i),
            base_url=server.base_url,
            timeout=timeout,
            envelope=env,
            async_http_client=http,
            capability_matrix={"context_window": 32_768},
            env={},
        )
        for server in servers
        for i, http in enumerate(https)
    }
    gate = asyncio.Semaphore(concurrency)
    began = time.monotonic()

    async def one(n: int) -> Outcome:
        server = servers[n % len(servers)]
        key = n // len(servers) % keys
        CALL.set(n)
        if span:
            pace = began + n * span / calls - time.monotonic()
            await asyncio.sleep(max(pace, 0.0))  # noqa: real-sleep - calls arrive over time
        async with gate:
            at, started = time.time(), time.monotonic()
            try:
                result: Completion | Exception = await clients[server.name, key].acomplete(
                    f"call {n}", response_model=Answer
                )
            except Exception as exc:  # judged by the caller: typed or not
                result = exc
            return Outcome(n, server.name, key, at, time.monotonic() - started, result)

    try:
        return await asyncio.gather(*(one(n) for n in range(calls)))
    finally:
        for client in clients.values():
            await client.aclose()
        for http in https:
            await http.aclose()
        assert asyncio.all_tasks() == baseline, "tasks outlived the calls"


def run(
    bound: float,
    servers: Sequence[ChaosServer],
    env: RetryEnvelope,
    *,
    calls: int,
    concurrency: int,
    keys: int = KEYS,
    timeout: float = TIMEOUT,
    span: float = 0.0,
) -> list[Outcome]:
    """Drive the calls on a fresh loop, bounded so the test always ends by itself."""

    async def bounded() -> list[Outcome]:
        return await asyncio.wait_for(
            drive(servers, env, calls, concurrency, keys=keys, timeout=timeout, span=span), bound
        )

    return asyncio.run(bounded())


# Endpoint b opens with every fault once, each followed by a good answer, so
# that even the small run serves them all (b's burst comes later than a's).
COVERAGE: Final = [served for fault in FAULTS[1:] for served in (fault, "ok")]


@contextlib.contextmanager
def chaos_servers(**kwargs: Any) -> Iterator[list[ChaosServer]]:
    """Both endpoints' servers, each on its own seed and with its own burst."""
    with contextlib.ExitStack() as stack:
        yield [
            stack.enter_context(
                chaos_server(
                    SEED + i,
                    bursts=[BURSTS[name]],
                    script=COVERAGE if name == "b" else (),
                    name=name,
                    **kwargs,
                )
            )
            for i, name in enumerate(ENDPOINTS)
        ]


# -- the checks -------------------------------------------------------------------------


@dataclass
class CooldownCheck:
    violations: list[str]
    in_flight: int  # arrived inside a window, but sent before the client had read its 429
    unread: int  # 429s whose client had given up on the request before reading them


def check_cooldowns(requests: Sequence[Request], opened: Sequence[Opened]) -> CooldownCheck:
    """No request arrives on a key inside a window an earlier 429 on that key asked for.

    Except one already in flight: sent (``x-sent-at``) before the client had
    read that 429 and opened the window (the store's ``extend``). Each window
    the client opened must be one a 429 on that key asked for, to the
    millisecond. A key is an endpoint and an API key (``a/k0``).
    """
    pending = sorted(
        (r for r in requests if r.window is not None and r.sent_at is not None),
        key=lambda r: r.sent_at or 0.0,
    )
    problems: list[str] = []
    windows: list[tuple[Request, float]] = []
    for o in sorted(opened, key=lambda o: o.at):
        match = next(
            (
                w
                for w in pending
                if who(w) == o.key
                and (w.sent_at or 0.0) <= o.at
                and math.isclose(w.window or 0.0, o.seconds, abs_tol=1e-9)
            ),
            None,
        )
        if match is None:
            problems.append(f"the client opened a {o.seconds} s window on {o.key} unasked")
            continue
        pending.remove(match)
        windows.append((match, o.at))
    in_flight: set[tuple[str, int]] = set()
    for w, opened_at in windows:
        start = w.sent_at or 0.0
        end = start + (w.window or 0.0)
        for r in requests:
            if who(r) != who(w) or not start <= r.at < end:
                continue
            if r.dispatched is not None and r.dispatched < opened_at:
                in_flight.add((r.server, r.index))
            else:
                problems.append(
                    f"request {r.index} on {who(r)} arrived {r.at - start:.3f} s into the "
                    f"{w.window} s window of request {w.index}, sent "
                    f"{(r.dispatched or 0.0) - opened_at:.3f} s after the client opened it"
                )
    return CooldownCheck(problems, len(in_flight), len(pending))


@dataclass
class Span:
    """A breaker open (refusing everything) on ``who`` from ``start`` to ``end``."""

    who: str
    start: float
    end: float


@dataclass
class _Lease:
    owner: str
    call: int | None
    until: float


@dataclass
class _Mirror:
    """One breaker as its writes left it (the checks replay them, never read the store)."""

    open_until: float = 0.0
    half_until: float = 0.0
    lease: _Lease | None = None
    span: Span | None = None

    def live_lease(self, at: float) -> _Lease | None:
        return self.lease if self.lease is not None and self.lease.until > at else None


@dataclass(frozen=True)
class Close:
    """A breaker closed by a success: its trial's, or one sent before it opened."""

    who: str
    at: float
    trial: bool


@dataclass
class BreakerCheck:
    violations: list[str]
    opened: list[Span] = field(default_factory=list)  # every opening, until it half-opened
    trials: int = 0  # trial leases granted to a new owner
    trial_requests: int = 0  # requests sent while half-open, each by the lease holder
    closed: list[Close] = field(default_factory=list)
    in_flight: int = 0  # requests that arrived while open, sent before it opened

    @property
    def recovered(self) -> list[Close]:
        """The closes through a half-open trial."""
        return [c for c in self.closed if c.trial]


def check_breakers(requests: Sequence[Request], ops: Sequence[StoreOp]) -> BreakerCheck:
    """No request is sent on a key while its breaker is open; half-open, only by its trial.

    The breakers' writes (opened until, half-open until, each trial lease,
    each close) are replayed in time order with the requests' ``x-sent-at``:
    a request sent while its key's breaker was open fails the check; one sent
    while it was half-open must come from the call holding the trial lease
    (``x-call``); the store must never grant a lease someone else holds, nor
    refuse one nobody holds. A close by the lease holder's success, while
    half-open, is a recovery through the trial; the breaker also closes on
    the success of a request sent before it opened.
    """
    timeline: list[tuple[float, int, StoreOp | Request]] = [(op.at, 0, op) for op in ops]
    timeline += [(r.dispatched, 1, r) for r in requests if r.dispatched is not None]
    timeline.sort(key=lambda item: (item[0], item[1]))
    breakers: defaultdict[str, _Mirror] = defaultdict(_Mirror)
    check = BreakerCheck([])
    problems = check.violations
    for at, _, item in timeline:
        if isinstance(item, Request):
            m = breakers[who(item)]
            lease = m.live_lease(at)
            if at < m.open_until:
                problems.append(
                    f"request {item.index} on {who(item)} (call {item.call}) was sent "
                    f"{at - (m.span.start if m.span else at):.3f} s after its breaker opened"
                )
            elif at < m.half_until:
                if lease is not None and lease.call == item.call:
                    check.trial_requests += 1
                else:
                    holder = f"call {lease.call}" if lease else "nobody"
                    problems.append(
                        f"request {item.index} on {who(item)} (call {item.call}) was sent while "
                        f"its breaker was half-open and {holder} held the trial lease"
                    )
            continue
        op, m = item, breakers[item.who]
        if op.op == "extend" and op.prefix == OPEN:
            if at >= m.open_until:
                m.span = Span(op.who, at, at + op.seconds)
                check.opened.append(m.span)
            m.open_until = max(m.open_until, at + op.seconds)
        elif op.op == "extend" and op.prefix == HALF:
            m.half_until = max(m.half_until, at + op.seconds)
        elif op.op == "acquire":
            lease = m.live_lease(at)
            if not op.ok:
                if lease is None:
                    problems.append(f"{op.who}: the store refused a trial lease nobody held")
                continue
            if lease is not None and lease.owner != op.owner:
                problems.append(
                    f"{op.who}: a second trial (call {op.call}) while call {lease.call} "
                    f"held the lease for {lease.until - at:.3f} s more"
                )
            if lease is None or lease.owner != op.owner:
                check.trials += 1
            m.lease = _Lease(op.owner or "", op.call, at + op.seconds)
        elif op.op == "release" and op.prefix == TRIAL:
            if m.lease is not None and m.lease.owner == op.owner:
                m.lease = None
        elif op.op == "delete":
            was_open, was_half = at < m.open_until, m.open_until <= at < m.half_until
            lease = m.live_lease(at)
            if OPEN in op.prefixes:
                if m.span is not None and at < m.span.end:
                    m.span.end = at
                m.open_until = 0.0
            if HALF in op.prefixes:
                m.half_until = 0.0
            if TRIAL in op.prefixes:
                m.lease = None
            if (was_open or was_half) and at >= max(m.open_until, m.half_until):
                by_trial = was_half and lease is not None and lease.call == op.call
                check.closed.append(Close(op.who, at, by_trial))
        elif op.op == "cap":
            if op.prefix == OPEN:
                m.open_until = min(m.open_until, at + op.seconds)
            elif op.prefix == HALF:
                m.half_until = min(m.half_until, at + op.seconds)
            elif m.lease is not None:
                m.lease.until = min(m.lease.until, at + op.seconds)
    for span in check.opened:
        check.in_flight += sum(
            1
            for r in requests
            if who(r) == span.who
            and span.start <= r.at < span.end
            and (r.dispatched or 0.0) < span.start
        )
    return check


def kind(outcome: Outcome) -> str:
    result = outcome.result
    if isinstance(result, Completion):
        return "success"
    if not isinstance(result, AgentExecutionError):
        return f"untyped {type(result).__name__}"
    how = ", cooldown" if result.details.get("cooldown") else ""
    return f"{type(result).__name__}[{result.code}{how}]"


def describe(outcome: Outcome) -> str:
    """One call, for a failure message: what it met, attempt by attempt."""
    result = outcome.result
    details = result.details if isinstance(result, AgentExecutionError) else {}
    return (
        f"call {outcome.call} on {outcome.who} took {outcome.seconds:.2f} s: {kind(outcome)}, "
        f"attempts {details.get('attempts')}, waits {details.get('waits')}, "
        f"{details.get('gave_up') or ''}"
    )


def blocked_by(outcome: Outcome, store: RecordingStore) -> str | None:
    """The key whose cooldown or breaker refused this call (None: it was not refused)."""
    result = outcome.result
    if not isinstance(result, AgentExecutionError):
        return None
    if result.code == "llm.circuit_open":
        return store.who(OPEN + str(result.details.get("breaker_key")))
    if result.details.get("cooldown"):
        return store.who(COOLDOWN + str(result.details.get("cooldown_key")))
    return None


# -- the chaos run ----------------------------------------------------------------------


def test_chaos_calls_end_typed_in_time_and_respect_cooldowns_and_breakers() -> None:
    fds = open_fds()
    events: list[Waited] = []
    bound = SPAN + (CALLS / CONCURRENCY + 1) * CALL_LIMIT + 30
    started = time.monotonic()
    with chaos_servers(stall=3 * TIMEOUT) as servers:
        store = default_store(servers)
        env = envelope(events=events, store=store, breaker=breaker_on(store))
        outcomes = run(bound, servers, env, calls=CALLS, concurrency=CONCURRENCY, span=SPAN)
        assert not store.degraded, "the sqlite store failed and fell back to memory"
        store.close()
    wall = time.monotonic() - started
    requests = [r for server in servers for r in server.snapshot()]
    assert [server.errors for server in servers] == [[], []]

    # Every call ends in a validated answer or a typed error, never a bare exception.
    for outcome in outcomes:
        if isinstance(outcome.result, Completion):
            assert isinstance(outcome.result.parsed, Answer)
            assert 1 <= outcome.result.attempts <= POLICY.attempts
        else:
            assert isinstance(outcome.result, AgentExecutionError), repr(outcome.result)
    # No call outlives its deadline by more than its last attempt's timeout.
    slowest = max(o.seconds for o in outcomes)
    assert slowest <= CALL_LIMIT, (
        f"a call took {slowest:.2f} s; the bound is {CALL_LIMIT:.2f} s: "
        + "; ".join(describe(o) for o in outcomes if o.seconds > CALL_LIMIT)
    )
    # No request sent on a key while a 429 on that key had it cooling down.
    cooldowns = check_cooldowns(requests, store.opened)
    assert cooldowns.violations == []
    # No request sent on a key while its breaker was open; half-open, only its one trial.
    breakers = check_breakers(requests, store.ops)
    assert breakers.violations == []
    # One endpoint's windows and breakers never hold back the other's calls.
    for outcome in outcomes:
        assert blocked_by(outcome, store) in (None, outcome.who), kind(outcome)
    for n, event in events:
        if event.key is not None and n is not None:
            assert store.who(COOLDOWN + event.key) == outcomes[n].who
    # Nothing leaked: every socket and the sqlite file closed (tasks: checked inside drive()).
    assert open_fds() - fds == set()

    # Each burst opened its endpoint's breakers, which refused calls while the
    # other endpoint kept serving, and closed again through a trial after it.
    bursts = {
        server.name: burst_figures(server, outcomes, requests, breakers) for server in servers
    }
    # The calls the bursts left alone: before their endpoint's burst, or a
    # breaker window after it.
    quiet = [
        o
        for o in outcomes
        for server in servers
        if o.server == server.name
        and all(o.at < s or o.at >= e + BREAKER_WINDOW for s, e in server.burst_windows())
    ]
    kinds = Counter(kind(o) for o in outcomes)
    quiet_kinds = Counter(kind(o) for o in quiet)
    print(  # shown with -s: the figures docs/chaos-and-fuzzing.md quotes
        f"\nchaos: {CALLS} calls at {CONCURRENCY} concurrency over {SPAN:.1f} s, seed {SEED}: "
        f"{wall:.2f} s wall, {len(requests)} requests, slowest call {slowest:.2f} s\n"
        f"  outcomes: {dict(sorted(kinds.items()))}\n"
        f"  quiet:    {len(quiet)} calls clear of the bursts: {dict(sorted(quiet_kinds.items()))}\n"
        f"  served:   {dict(sorted(sum((s.served() for s in servers), Counter()).items()))}\n"
        f"  waits:    {dict(Counter(e.reason for _, e in events))}\n"
        f"  cooldown: {len(store.opened)} windows opened, {cooldowns.in_flight} requests "
        f"already in flight, {cooldowns.unread} 429s unread, 0 violations\n"
        f"  breaker:  {len(breakers.opened)} openings, {breakers.trials} trials "
        f"({breakers.trial_requests} requests), {len(breakers.closed)} closes "
        f"({len(breakers.recovered)} through a trial), {breakers.in_flight} requests already "
        f"in flight, 0 violations\n" + "\n".join(f"  {name}: {b}" for name, b in bursts.items())
    )
    for name, b in bursts.items():
        other = next(n for n in ENDPOINTS if n != name)
        assert b.opened, f"no breaker on {name} was open during its burst"
        assert b.refused, f"no call on {name} was refused by an open breaker"
        assert b.meanwhile, f"no request reached {other} while {name}'s breakers were open"
        assert b.closed, f"no breaker on {name} closed again after its burst"
        assert b.back, f"no call on {name} succeeded after its burst"
    # Through half-open trials. (Per burst, a breaker may also be closed by the
    # success of a request sent before it opened, which the breaker allows:
    # under load, such stragglers sometimes close them all first.)
    assert sum(len(b.recovered) for b in bursts.values()), "no trial closed a breaker"
    # The schedule really exercised the envelope: every fault served, many calls
    # answered. (A burst fails its endpoint's calls for a while, and a breaker
    # opened by the background schedule refuses a few more.)
    assert set().union(*(s.served() for s in servers)) == set(FAULTS)
    assert kinds["success"] >= CALLS / 3
    assert quiet_kinds["success"] >= len(quiet) / 2


@dataclass
class Burst:
    """What one endpoint's burst did."""

    seconds: float
    served: int  # requests answered 503 by the burst
    opened: list[Span]  # the endpoint's breakers open during the burst
    refused: int  # calls on the endpoint refused by an open breaker (any time)
    closed: list[Close]  # the endpoint's breakers closed again after the burst
    back: int  # calls on the endpoint that started after the burst and succeeded
    meanwhile: int  # requests to the other endpoint while one of these breakers was open

    @property
    def recovered(self) -> list[Close]:
        return [c for c in self.closed if c.trial]

    def __str__(self) -> str:
        return (
            f"{self.served} x 503 in {self.seconds:.2f} s; {len(self.opened)} openings during "
            f"it on {len({s.who for s in self.opened})} keys; {self.refused} calls refused; "
            f"{self.meanwhile} requests to the other endpoint meanwhile; {len(self.closed)} "
            f"closes after it ({len(self.recovered)} through a trial); {self.back} calls "
            f"answered after it"
        )


def burst_figures(
    server: ChaosServer,
    outcomes: Sequence[Outcome],
    requests: Sequence[Request],
    breakers: BreakerCheck,
) -> Burst:
    ((start, end),) = server.burst_windows()
    name = server.name
    mine = [o for o in outcomes if o.server == name]
    opened = [
        s
        for s in breakers.opened
        if s.who.startswith(f"{name}/") and s.start < end and s.end > start
    ]
    return Burst(
        seconds=end - start,
        served=sum(1 for r in requests if r.server == name and r.burst),
        opened=opened,
        refused=sum(1 for o in mine if o.code == "llm.circuit_open"),
        closed=[c for c in breakers.closed if c.who.startswith(f"{name}/") and c.at >= end],
        back=sum(1 for o in mine if o.at >= end and isinstance(o.result, Completion)),
        meanwhile=sum(
            1 for r in requests if r.server != name and any(s.start <= r.at < s.end for s in opened)
        ),
    )


# -- the checks have teeth -----------------------------------------------------------------


def test_the_cooldown_check_catches_an_envelope_that_ignores_windows() -> None:
    # With a store that hides its windows, calls on the key keep arriving inside them.
    with chaos_server(SEED, weights={"ok": 1, "429_retry_after": 1}, name="a") as server:
        store = default_store([server], honour_cooldowns=False)
        run(30, [server], envelope(store=store), calls=60, concurrency=20, keys=1)
        store.close()
    assert check_cooldowns(server.snapshot(), store.opened).violations


@pytest.mark.parametrize(
    ("flaw", "symptom"),
    [
        ("honour_breakers", "after its breaker opened"),  # a breaker that never refuses
        ("exclusive_leases", "a second trial"),  # a lease anyone can take
    ],
)
def test_the_breaker_check_catches_a_breaker_that_lets_calls_through(
    flaw: str, symptom: str
) -> None:
    # A 503 burst opens the breaker at once. With the flaw, calls keep being
    # sent while it is open, or, half-open, several go through as trials
    # together (each answer takes 200 ms, and a call starts every 15 ms).
    bursts = [(0.0, 0.6)]
    with chaos_server(SEED, weights={"ok": 1}, bursts=bursts, latency=0.2, name="a") as server:
        store = default_store([server], **{flaw: False})
        env = envelope(store=store, breaker=breaker_on(store, threshold=2))
        run(30, [server], env, calls=80, concurrency=20, keys=1, span=1.2)
        store.close()
    violations = check_breakers(server.snapshot(), store.ops).violations
    assert any(symptom in v for v in violations), violations[:5]


# -- one fault at a time --------------------------------------------------------------

EXPECTED: Final[dict[str, tuple[type[ProviderError], str, str]]] = {
    # fault: (the typed error of the failed attempt, its code, how the envelope waits)
    "429_retry_after": (RateLimitError, "llm.rate_limited", "retry_after"),
    "429_retry_after_ms": (RateLimitError, "llm.rate_limited", "retry_after"),
    "500": (ProviderServerError, "llm.server_error", "backoff"),
    "502": (ProviderServerError, "llm.server_error", "backoff"),
    "503": (ProviderServerError, "llm.server_error", "backoff"),
    "529_overloaded": (ProviderServerError, "llm.overloaded", "backoff"),
    "html_502": (ProviderServerError, "llm.server_error", "backoff"),
    "reset_before_response": (ProviderError, "llm.network_error", "backoff"),
    "reset_during_body": (ProviderError, "llm.network_error", "backoff"),
    "truncated_json": (ProviderError, "llm.network_error", "backoff"),
    "slow_headers": (ProviderTimeoutError, "llm.timeout", "backoff"),
}
SHORT: Final = 0.3  # the client timeout of the one-fault tests


def test_every_fault_has_an_expectation() -> None:
    assert set(EXPECTED) == set(FAULTS) - {"ok"}


def one_call(server: ChaosServer, attempts: int, events: list[Waited]) -> Outcome:
    policy = RetryPolicy(attempts=attempts, backoff_base=0.01, backoff_cap=0.05, deadline=5.0)
    (outcome,) = run(
        10, [server], envelope(policy, events), calls=1, concurrency=1, keys=1, timeout=SHORT
    )
    return outcome


@pytest.mark.parametrize("fault", sorted(EXPECTED))
def test_one_fault_then_a_good_answer_is_retried_to_success(fault: str) -> None:
    cls, code, reason = EXPECTED[fault]
    events: list[Waited] = []
    with chaos_server(SEED, weights={"ok": 1}, script=[fault], stall=3 * SHORT) as server:
        outcome = one_call(server, 4, events)
    first, second = server.snapshot()
    assert (first.fault, second.fault) == (fault, "ok")
    assert isinstance(outcome.result, Completion)
    assert outcome.result.attempts == 2
    assert outcome.result.parsed == Answer(answer="ok", request=1)
    _, event = events[0]
    assert type(event.error) is cls
    assert event.error.code == code
    assert event.reason == reason
    if reason == "retry_after":
        # The wait is exactly what the server asked for, and really taken.
        assert first.sent_at is not None
        assert first.window is not None
        assert event.wait == pytest.approx(first.window)
        assert second.at >= first.sent_at + first.window
    else:
        assert event.wait <= 0.01
    if fault == "slow_headers":
        assert SHORT <= outcome.seconds < SHORT + 0.5


@pytest.mark.parametrize("fault", sorted(EXPECTED))
def test_a_fault_every_time_ends_in_its_typed_error(fault: str) -> None:
    cls, code, _ = EXPECTED[fault]
    events: list[Waited] = []
    with chaos_server(SEED, weights={"ok": 1}, script=[fault] * 2, stall=3 * SHORT) as server:
        outcome = one_call(server, 2, events)
    assert [r.fault for r in server.snapshot()] == [fault] * 2
    error = outcome.result
    assert type(error) is cls
    assert error.code == code
    assert error.details["attempts"] == 2
    assert error.details["gave_up"] == "gave up after 2 attempt(s)"
