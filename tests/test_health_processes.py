"""The shared failure state heals itself, across real processes and a real clock.

Each test starts real worker processes (``python -m tests.health_worker``,
see that module) against real loopback servers. They share the DEFAULT store,
the sqlite file under ``$XDG_CACHE_HOME`` (conftest points it at the test's
own tmp dir, and every process of one test inherits it), or a real Redis
(``FLUID_COOLDOWN_URL``). Settings are small (threshold 2, cool-off 1 s,
trial 1-2 s) so that every scenario runs in a few seconds of real time, and
every wait is bounded: a worker that hangs is killed, never waited on forever.
Each worker is a fresh process for one role in one test; a small pool starts
the next ones early, so that their imports overlap with the current test's
waiting (see :class:`Pool`).

What they show: a killed half-open trial holds its lease only until the lease
expires, and nobody else sends in the meantime; a trial that ends in a 429 or
a 401 gives the lease back; two endpoints never share a breaker or a
cooldown; a store that already holds a previous run's state behaves like a
fresh one; ``LLMClient.reset_health()`` in one process lets another
process's next call through at once.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import select
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pytest

from fluid_build.copilot.health.cooldown import cooldown_store_from_env, default_cooldown_path
from tests import loopback

ROOT = Path(__file__).resolve().parents[1]

THRESHOLD = 2
COOL_OFF = 1.0
TRIAL = 1.0


def lease_for(trial: float) -> float:
    """A half-open trial's lease: its deadline (the trial seconds) + a quarter, at least 0.5 s."""
    return trial + min(5.0, max(0.5, trial / 4))


LEASE = lease_for(TRIAL)  # 1.5 s
# Real processes on a loaded machine: how late a poll, a request or a write may be.
SLACK = 1.0

#: Settings every worker gets unless a test says otherwise (one request per call).
SETTINGS = {
    "FLUID_BREAKER_THRESHOLD": str(THRESHOLD),
    "FLUID_BREAKER_COOL_OFF_SECONDS": str(COOL_OFF),
    "FLUID_BREAKER_TRIAL_SECONDS": str(TRIAL),
    "FLUID_BREAKER_WINDOW_SECONDS": "10",
    "FLUID_LLM_MAX_ATTEMPTS": "1",
}

#: What a process logs when the shared store did not answer within its lock wait.
STORE_BUSY = "is busy (another process holds its lock); calls go ahead without waiting"
HOLD = 0  # a scripted "status": hold the request open until released, then answer 503
OPEN = "llm.circuit_open"


# -- a scripted provider on a real loopback server -----------------------------------


@dataclass(frozen=True)
class Arrival:
    at: float  # time.time() when the request arrived
    worker: str  # its x-worker header
    status: int  # what the script answered (HOLD for the held one)


def _body(status: int) -> bytes:
    if status == 200:
        return json.dumps(
            {
                "choices": [
                    {"message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
                ],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1},
            }
        ).encode()
    message = {
        503: ("Service temporarily unavailable", "server_error"),
        429: ("Rate limit reached for requests", "requests"),
        401: ("Incorrect API key provided", "invalid_request_error"),
    }[status]
    return json.dumps({"error": {"message": message[0], "type": message[1]}}).encode()


Step = int | tuple[int, dict[str, str]]


class Provider:
    """An OpenAI-compatible provider whose answers are scripted: queued steps, then a default."""

    def __init__(self, *steps: Step, default: int = 200) -> None:
        self.lock = threading.Lock()
        self.holding = threading.Event()  # the HOLD step's request has arrived
        self.release = threading.Event()  # let the held request answer
        self.script(*steps, default=default)

    def script(self, *steps: Step, default: int = 200) -> None:
        with self.lock:
            self.queue: deque[tuple[int, dict[str, str]]] = deque(
                (s, {}) if isinstance(s, int) else s for s in steps
            )
            self.default = default
            self.log: list[Arrival] = []
        self.holding.clear()
        self.release.clear()

    def reply(self, seen: loopback.Seen) -> loopback.Reply:
        with self.lock:
            status, headers = self.queue.popleft() if self.queue else (self.default, {})
            self.log.append(Arrival(seen.at, seen.headers.get("x-worker", "?"), status))
        if status == HOLD:
            self.holding.set()
            self.release.wait(timeout=30)  # until the test has killed the caller
            status = 503
        return status, {"content-type": "application/json", **headers}, _body(status)

    def arrivals(self) -> list[Arrival]:
        with self.lock:
            return list(self.log)

    def statuses(self) -> list[int]:
        return [a.status for a in self.arrivals()]


@contextlib.contextmanager
def serve(provider: Provider) -> Iterator[str]:
    """The provider on a real loopback server; yields its base URL."""
    with loopback.http_server(provider.reply) as server:
        try:
            yield loopback.base_url(server)
        finally:
            provider.release.set()  # a held request must not outlive the test


# -- worker processes ---------------------------------------------------------------------


class Worker:
    """One ``python -m tests.health_worker`` process and what it wrote."""

    def __init__(self, name: str, proc: subprocess.Popen[bytes], out: Path, err: IO[bytes]):
        self.name = name
        self.proc = proc
        self.out = out
        self.err = err

    @property
    def pid(self) -> int:
        return self.proc.pid

    def records(self) -> list[dict[str, Any]]:
        records = []
        text = self.out.read_text(encoding="utf-8") if self.out.exists() else ""
        for line in text.splitlines():
            with contextlib.suppress(ValueError):  # a line still being written
                records.append(json.loads(line))
        return records

    def events(self) -> list[dict[str, Any]]:
        return [r for r in self.records() if "outcome" in r]

    def outcomes(self) -> list[str]:
        return [e["outcome"] for e in self.events()]

    def end(self) -> dict[str, Any]:
        ends = [r for r in self.records() if "end" in r]
        assert ends, f"{self.name} wrote no end record\n{self.stderr()}"
        return ends[-1]

    def health(self) -> dict[str, Any]:
        (report,) = self.end()["health"]
        return report

    def stderr(self) -> str:
        self.err.flush()
        return Path(self.err.name).read_text(encoding="utf-8", errors="replace")[-4000:]


def _close(proc: subprocess.Popen[bytes], err: IO[bytes]) -> None:
    """Reap one of our own worker processes (by its handle) and close its pipes."""
    for pipe in (proc.stdin, proc.stdout):
        if pipe is not None:
            with contextlib.suppress(OSError):
                pipe.close()  # an idle warm worker exits when its stdin closes
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)
    err.close()


class Pool:
    """Warm worker processes: each one a fresh ``python -m tests.health_worker``.

    A worker spends most of its CPU on imports. The pool starts the next
    workers while the current ones run (a test's workers mostly wait out
    cool-offs and leases), so their imports overlap with that waiting; each
    process still serves one role in one test, and gets its whole environment
    with that role.
    """

    def __init__(self, logdir: Path, target: int) -> None:
        self.logdir = logdir
        self.target = target
        self.idle: deque[tuple[subprocess.Popen[bytes], IO[bytes]]] = deque()
        self.numbers = itertools.count(1)
        self.lock = threading.Lock()
        # Whatever the developer's shell exports never reaches a worker: each
        # one gets its whole environment with its role.
        self.env = {
            k: v for k, v in os.environ.items() if k in {"PATH", "HOME", "LANG", "SYSTEMROOT"}
        }
        self.env.update(PYTHONPATH=str(ROOT), PYTHONDONTWRITEBYTECODE="1")
        self.fill()

    def _spawn(self) -> None:
        err = open(self.logdir / f"worker-{next(self.numbers)}.err", "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.health_worker"],
            cwd=ROOT,
            env=self.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
        )
        self.idle.append((proc, err))

    def fill(self) -> None:
        with self.lock:
            while len(self.idle) < self.target:
                self._spawn()

    def take(self) -> tuple[subprocess.Popen[bytes], IO[bytes]]:
        with self.lock:
            if not self.idle:
                self._spawn()
            return self.idle.popleft()

    def close(self) -> None:
        with self.lock:
            idle, self.idle = list(self.idle), deque()
        for proc, err in idle:
            proc.kill()  # our own idle child, by its handle
            _close(proc, err)


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    warm = Pool(tmp_path_factory.mktemp("workers"), target=3)
    try:
        yield warm
    finally:
        warm.close()


class Fleet:
    """The worker processes of one test: given a role, made ready, told to go, always reaped."""

    def __init__(self, pool: Pool, workdir: Path, **env: str) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.pool = pool
        self.workdir = workdir
        # The test's environment (conftest cleaned it and set XDG_CACHE_HOME), small settings.
        self.env = {**os.environ, "PYTHONPATH": str(ROOT), **SETTINGS, **env}
        self.workers: list[Worker] = []
        self.lock = threading.Lock()

    def spawn(self, mode: str, base: str, name: str, *options: str, **env: str) -> Worker:
        """A worker process with this role (``python -m tests.health_worker MODE BASE OUT ...``)."""
        out = self.workdir / f"{name}.jsonl"
        proc, err = self.pool.take()
        worker = Worker(name, proc, out, err)
        with self.lock:
            self.workers.append(worker)
        assert proc.stdin is not None
        role = {"argv": [mode, base, str(out), "--id", name, *options], "env": {**self.env, **env}}
        proc.stdin.write(json.dumps(role).encode() + b"\n")
        proc.stdin.flush()
        return worker

    def ready(self, *workers: Worker, timeout: float = 30.0) -> None:
        """Wait until each worker has built its client and opened the store."""
        deadline = time.monotonic() + timeout
        for worker in workers:
            assert worker.proc.stdout is not None
            left = max(deadline - time.monotonic(), 0.0)
            readable, _, _ = select.select([worker.proc.stdout], [], [], left)
            line = worker.proc.stdout.readline() if readable else b""
            assert line == b"ready\n", f"{worker.name} never got ready\n{worker.stderr()}"

    def go(self, *workers: Worker) -> None:
        for worker in workers:
            assert worker.proc.stdin is not None
            worker.proc.stdin.write(b"go\n")
            worker.proc.stdin.flush()
        self.pool.fill()  # the next workers import while these ones run

    def named(self, name: str) -> Worker:
        with self.lock:
            return next(w for w in self.workers if w.name == name)

    def wait(self, worker: Worker, timeout: float) -> int:
        try:
            return worker.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            worker.proc.kill()
            worker.proc.wait(timeout=5)
            pytest.fail(f"{worker.name} still running after {timeout} s\n{worker.stderr()}")

    def finished(self, *workers: Worker, timeout: float = 15.0) -> None:
        """Each worker exits 0, and none of them saw its shared store fail."""
        for worker in workers:
            code = self.wait(worker, timeout)
            assert code == 0, f"{worker.name} exited {code}\n{worker.stderr()}"
            # A store that fails degrades to memory with a warning: the test would
            # then prove nothing about sharing.
            assert "in this process only" not in worker.stderr(), worker.stderr()

    def close(self) -> None:
        for worker in self.workers:
            if worker.proc.poll() is None:
                worker.proc.kill()  # only our own children, by their handle
            _close(worker.proc, worker.err)

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def wait_until(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out after {timeout} s: {what}"
        time.sleep(0.01)  # noqa: real-sleep - watching real processes


def held_lease_until(fleet: Fleet, holder: Worker) -> float:
    """When the half-open trial lease ``holder`` holds ends, read from the store the fleet
    shares (the default sqlite file or Redis, as the workers' environment says)."""
    store = cooldown_store_from_env(fleet.env)
    assert store is not None, "the workers share no store"
    leases = [e.until for e in store.entries(time.time()) if f":{holder.pid}:" in (e.owner or "")]
    assert len(leases) == 1, f"{holder.name} holds {len(leases)} leases"
    return leases[0]


def saw_open(worker: Worker) -> bool:
    return OPEN in worker.outcomes()


def squeeze(outcomes: list[str]) -> list[str]:
    """Outcomes with repeats collapsed: how many polls were refused depends on timing."""
    return [k for k, _ in itertools.groupby(outcomes)]


def live_entries(path: Path) -> list[tuple[str, float]]:
    """The entries of the sqlite store that have not ended yet."""
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return conn.execute(
            "SELECT key, until FROM fluid_state WHERE until > ?", (time.time(),)
        ).fetchall()


def get_ready(fleet: Fleet, barrier: threading.Barrier | None, *workers: Worker) -> None:
    """Wait for the workers; with a barrier, until every scenario's workers are ready."""
    try:
        fleet.ready(*workers)
    except BaseException:
        if barrier is not None:
            barrier.abort()  # the other scenarios must not wait for this one
        raise
    if barrier is not None:
        barrier.wait(timeout=60)


# -- scenarios (each returns what must be identical from one run to the next) -------------


def trial_killed(
    fleet: Fleet, provider: Provider, base: str, model: str, barrier: threading.Barrier | None
) -> dict[str, Any]:
    """503s open the breaker; the half-open trial's process is SIGKILLed mid-request."""
    provider.script(503, 503, HOLD, default=200)
    workers = [
        fleet.spawn(
            "calls",
            base,
            f"{model}-{n}",
            "--model",
            model,
            "--stop-on",
            "ok",
            "--max-seconds",
            "10",
        )
        for n in ("a", "b", "c")
    ]
    get_ready(fleet, barrier, *workers)
    first, *rest = workers
    fleet.go(first)  # alone: its two 503s open the breaker
    wait_until(lambda: saw_open(first), 10, f"{first.name} never saw the breaker open")
    (refusal,) = [e for e in first.events() if e["outcome"] == OPEN][:1]
    half_opens_at = float(refusal["until"])
    opened_at = half_opens_at - COOL_OFF
    fleet.go(*rest)  # now three processes poll for the half-open trial

    assert provider.holding.wait(timeout=COOL_OFF + 10), "no trial request ever arrived"
    trial = provider.arrivals()[2]
    holder = fleet.named(trial.worker)
    # The lease as the store holds it: its end is the point no other trial may come before.
    # (Measured from the lease, not from the trial's arrival: on a busy machine the holder
    # may take a while between taking the lease and its request reaching the server.)
    lease_until = held_lease_until(fleet, holder)
    os.kill(holder.pid, signal.SIGKILL)  # mid-request, holding the lease
    assert fleet.wait(holder, 5) == -signal.SIGKILL
    provider.release.set()
    survivors = [w for w in workers if w is not holder]
    fleet.finished(*survivors)

    arrivals = provider.arrivals()
    assert [a.status for a in arrivals] == [503, 503, HOLD, 200, 200]
    # The trial arrived once the cool-off was over, not before.
    assert trial.at >= half_opens_at - 0.05
    # During the killed trial's lease, nothing else reached the server: no second trial ...
    second = arrivals[3]
    assert second.worker != holder.name
    assert lease_until - trial.at <= LEASE + 0.05, (trial, lease_until)  # taken before it came
    # ... unless the store did not answer that process within its 0.1 s lock wait: then,
    # as documented (docs/retry-envelope.md, "A busy store never stalls a call"), it went
    # on what it knew itself, and said so. A loaded machine (the suite's other workers)
    # can hold the sqlite lock that long; the lease is the store's, not a promise past it.
    if STORE_BUSY not in fleet.named(second.worker).stderr():
        assert second.at >= lease_until - 0.05, (trial, second, lease_until)
        # ... and the lease expired by itself: the next trial went through soon after.
        assert second.at - lease_until <= SLACK, (trial, second, lease_until)
    # While the lease was held, refusals named its owner: the killed process.
    held = [
        e
        for w in survivors
        for e in w.events()
        if e["outcome"] == OPEN and e["t0"] > trial.at + 0.05 and e["t1"] < trial.at + LEASE - 0.3
    ]
    assert held, "no survivor polled while the trial was in flight"
    assert all(f":{holder.pid}:" in (e["trial_owner"] or "") for e in held), held
    # Every other process got its answer within cool-off + lease of the breaker opening.
    for worker in survivors:
        ok = worker.events()[-1]
        assert ok["outcome"] == "ok"
        assert ok["t1"] - opened_at <= COOL_OFF + LEASE + SLACK, (worker.name, ok, opened_at)
        if STORE_BUSY not in worker.stderr():  # else its view is partly its own (above)
            assert worker.health()["breaker"] == "closed"
            assert worker.health()["trial_owner"] is None
    return {
        "statuses": [a.status for a in arrivals],
        "killed": holder.proc.returncode,
        "survivors": sorted(w.outcomes()[-1] for w in survivors),
        "health": sorted(w.health()["breaker"] for w in survivors),
    }


def retry_after_then_ok(
    fleet: Fleet, provider: Provider, base: str, model: str, barrier: threading.Barrier | None
) -> dict[str, Any]:
    """A 429 with Retry-After: 1, then 200: one call, two attempts, one second apart."""
    provider.script((429, {"retry-after": "1"}), default=200)
    worker = fleet.spawn(
        "calls", base, f"{model}-w", "--model", model, "--stop-on", "ok", FLUID_LLM_MAX_ATTEMPTS="3"
    )
    get_ready(fleet, barrier, worker)
    fleet.go(worker)
    fleet.finished(worker)
    arrivals = provider.arrivals()
    assert [a.status for a in arrivals] == [429, 200]
    assert 1.0 - 0.05 <= arrivals[1].at - arrivals[0].at <= 1.0 + SLACK
    (event,) = worker.events()
    assert event["outcome"] == "ok"
    assert event["attempts"] == 2
    health = worker.health()
    assert (health["breaker"], health["failures"], health["cooldown_remaining"]) == (
        "closed",
        0,
        0.0,
    )
    return {"statuses": [a.status for a in arrivals], "outcomes": worker.outcomes()}


def server_error_then_ok(
    fleet: Fleet, provider: Provider, base: str, model: str, barrier: threading.Barrier | None
) -> dict[str, Any]:
    """One 503 (below the threshold), then 200: the backoff, then a success that clears it."""
    provider.script(503, default=200)
    worker = fleet.spawn(
        "calls", base, f"{model}-w", "--model", model, "--stop-on", "ok", FLUID_LLM_MAX_ATTEMPTS="3"
    )
    get_ready(fleet, barrier, worker)
    fleet.go(worker)
    fleet.finished(worker)
    arrivals = provider.arrivals()
    # A failure count left over from an earlier run would open the breaker here.
    assert [a.status for a in arrivals] == [503, 200]
    (event,) = worker.events()
    assert event["outcome"] == "ok"
    assert event["attempts"] == 2
    health = worker.health()
    assert (health["breaker"], health["failures"]) == ("closed", 0)
    return {"statuses": [a.status for a in arrivals], "outcomes": worker.outcomes()}


def opens_then_recovers(
    fleet: Fleet, provider: Provider, base: str, model: str, barrier: threading.Barrier | None
) -> dict[str, Any]:
    """Two 503s open the breaker; after the cool-off the trial succeeds and closes it."""
    provider.script(503, 503, default=200)
    worker = fleet.spawn("calls", base, f"{model}-w", "--model", model, "--stop-on", "ok")
    get_ready(fleet, barrier, worker)
    fleet.go(worker)
    fleet.finished(worker)
    arrivals = provider.arrivals()
    assert [a.status for a in arrivals] == [503, 503, 200]
    events = worker.events()
    assert squeeze(worker.outcomes()) == ["llm.server_error", OPEN, "ok"]
    half_opens_at = float(next(e for e in events if e["outcome"] == OPEN)["until"])
    assert half_opens_at - 0.05 <= arrivals[2].at <= half_opens_at + SLACK
    assert worker.health()["breaker"] == "closed"
    return {"statuses": [a.status for a in arrivals], "outcomes": squeeze(worker.outcomes())}


# -- 1. a killed half-open trial ----------------------------------------------------------


def test_a_killed_trial_frees_its_lease_on_the_default_store(tmp_path: Path, pool: Pool) -> None:
    provider = Provider()
    with serve(provider) as base, Fleet(pool, tmp_path / "workers") as fleet:
        trial_killed(fleet, provider, base, "m", None)
    assert default_cooldown_path().exists(), "the workers did not use the default store"


def test_a_killed_trial_frees_its_lease_on_redis(
    tmp_path: Path, pool: Pool, redis_url: str
) -> None:
    provider = Provider()
    model = f"m-{uuid.uuid4().hex[:8]}"  # one Redis for the session: a key of its own
    with (
        serve(provider) as base,
        Fleet(pool, tmp_path / "workers", FLUID_COOLDOWN_URL=redis_url) as fleet,
    ):
        trial_killed(fleet, provider, base, model, None)
    assert not default_cooldown_path().exists(), "the workers did not use Redis"


# -- 2. a trial that ends in a 429 or a 401 ----------------------------------------------


@pytest.mark.parametrize(
    ("status", "headers", "code", "waits"),
    [(429, {"retry-after": "1"}, "llm.rate_limited", 1.0), (401, {}, "llm.auth", 0.0)],
    ids=["429", "401"],
)
def test_a_trial_that_ends_in_a_4xx_gives_the_lease_back(
    tmp_path: Path, pool: Pool, status: int, headers: dict[str, str], code: str, waits: float
) -> None:
    trial_seconds = 2.0
    lease = lease_for(trial_seconds)  # 2.5 s: longer than the calls need if it is given back
    provider = Provider(503, 503, (status, headers), default=200)
    with (
        serve(provider) as base,
        Fleet(pool, tmp_path / "workers", FLUID_BREAKER_TRIAL_SECONDS=str(trial_seconds)) as fleet,
    ):
        first = fleet.spawn("calls", base, "a", "--stop-on", "ok", "--max-seconds", "10")
        second = fleet.spawn("calls", base, "b", "--stop-on", "ok", "--max-seconds", "10")
        fleet.ready(first, second)
        fleet.go(first)
        wait_until(lambda: saw_open(first), 10, "the breaker never opened")
        fleet.go(second)
        fleet.finished(first, second)

    arrivals = provider.arrivals()
    assert [a.status for a in arrivals] == [503, 503, status, 200, 200]
    trial, after = arrivals[2], arrivals[3]
    # The 4xx trial gave its lease back: the next call did not wait for it to expire.
    gap = after.at - trial.at
    assert waits - 0.05 <= gap <= waits + SLACK, gap
    assert gap < lease - 0.3, gap
    # The trial's own call failed with the 4xx, as a 4xx: it did not count toward the breaker.
    trial_events = fleet.named(trial.worker).events()
    ended = [e for e in trial_events if e["t0"] <= trial.at <= e["t1"]]
    assert [e["outcome"] for e in ended] == [code]
    # No permanent llm.circuit_open: once a call succeeded, nobody was refused again.
    healed = min(e["t1"] for w in (first, second) for e in w.events() if e["outcome"] == "ok")
    for worker in (first, second):
        assert worker.outcomes()[-1] == "ok"
        assert not [e for e in worker.events() if e["outcome"] == OPEN and e["t0"] > healed]
        assert worker.health()["breaker"] == "closed"


# -- 3. two endpoints never share health ---------------------------------------------------


def test_a_sick_endpoint_never_delays_or_refuses_another(tmp_path: Path, pool: Pool) -> None:
    sick = Provider((429, {"retry-after": "2"}), default=503)
    well = Provider(default=200)
    stop = tmp_path / "stop"
    with (
        serve(sick) as base_a,
        serve(well) as base_b,
        Fleet(pool, tmp_path / "workers") as fleet,
    ):
        a = fleet.spawn("calls", base_a, "a", "--stop-on", OPEN)
        b = fleet.spawn("calls", base_b, "b", "--stop-file", str(stop), "--poll", "0.05")
        fleet.ready(a, b)
        fleet.go(a, b)
        fleet.finished(a)
        time.sleep(0.5)  # noqa: real-sleep - B keeps calling while A's breaker is open
        stop.touch()
        fleet.finished(b)

    assert sick.statuses() == [429, 503, 503]
    assert a.outcomes() == ["llm.rate_limited", "llm.server_error", "llm.server_error", OPEN]
    assert a.health()["breaker"] == "open"
    t429 = sick.arrivals()[0].at
    # A's own cooldown was real: its next request waited out the Retry-After ...
    assert sick.arrivals()[1].at - t429 >= 2.0 - 0.05
    opened = a.events()[2]["t1"]
    # ... while B was called, and answered at once, all along: during A's cooldown
    # and while A's breaker was open.
    assert set(b.outcomes()) == {"ok"}
    assert all(e["attempts"] == 1 for e in b.events())
    assert max(e["t1"] - e["t0"] for e in b.events()) < 0.5
    during_cooldown = [x for x in well.arrivals() if t429 + 0.1 < x.at < t429 + 1.9]
    while_open = [x for x in well.arrivals() if opened < x.at < opened + 0.45]
    assert len(during_cooldown) >= 5
    assert len(while_open) >= 2
    health = b.health()
    assert (health["breaker"], health["failures"], health["cooldown_remaining"]) == (
        "closed",
        0,
        0.0,
    )
    # Same provider, same model, no key: only the endpoint tells the keys apart.
    assert health["key"] != a.health()["key"]


# -- 4. the same suite twice on the same store ----------------------------------------------


SUITE = (retry_after_then_ok, server_error_then_ok, opens_then_recovers, trial_killed)
SUITE_PROCESSES = 6  # one worker each, three for the killed trial


def test_the_suite_passes_twice_on_the_same_default_store(tmp_path: Path, pool: Pool) -> None:
    providers = [Provider() for _ in SUITE]
    store = default_cooldown_path()
    runs: list[list[dict[str, Any]]] = []
    target = pool.target
    pool.target = SUITE_PROCESSES  # the first run warms the second run's workers
    with contextlib.ExitStack() as servers:
        # The same endpoints and models both times: the second run meets the first one's keys.
        bases = [servers.enter_context(serve(p)) for p in providers]
        for run in (1, 2):
            if run == 2:
                pool.target = target
            barrier = threading.Barrier(len(SUITE))
            with (
                Fleet(pool, tmp_path / f"run{run}") as fleet,
                ThreadPoolExecutor(len(SUITE)) as threads,
            ):
                futures = [
                    threads.submit(
                        scenario, fleet, provider, base, f"m-{scenario.__name__}", barrier
                    )
                    for scenario, provider, base in zip(SUITE, providers, bases, strict=True)
                ]
                runs.append([future.result(timeout=60) for future in futures])
            assert store.exists()
            assert live_entries(store) == [], f"run {run} left live state behind"
    assert runs[0] == runs[1]


# -- 5. a reset in one process, felt at once in another -------------------------------------


def test_reset_health_in_one_process_lets_another_through_at_once(
    tmp_path: Path, pool: Pool
) -> None:
    provider = Provider(503, 503, default=200)
    # A cool-off far longer than the test: only the reset can close this breaker in time.
    with (
        serve(provider) as base,
        Fleet(pool, tmp_path / "workers", FLUID_BREAKER_COOL_OFF_SECONDS="60") as fleet,
    ):
        # The caller trips the breaker itself, as the long-running process an operator
        # resets usually has; it keeps calling for at most 4 s.
        caller = fleet.spawn("calls", base, "caller", "--stop-on", "ok", "--max-seconds", "4")
        resetter = fleet.spawn("reset", base, "resetter")
        fleet.ready(caller, resetter)
        fleet.go(caller)
        wait_until(lambda: saw_open(caller), 10, "the breaker never opened")
        time.sleep(0.2)  # noqa: real-sleep - the caller is refused for a while
        fleet.go(resetter)
        fleet.finished(resetter)
        fleet.wait(caller, 10)

    (reset,) = resetter.events()
    assert reset["before"][0]["breaker"] == "open"
    assert reset["after"][0]["breaker"] == "closed"
    refused = [e for e in caller.events() if e["outcome"] == OPEN]
    assert len(refused) >= 3
    assert all(e["retry_after"] > 50 for e in refused[:3])  # it would not heal by itself
    late = [e for e in refused if e["t0"] > reset["t1"] + 0.5]
    assert not late, (
        f"{len(late)} calls of the process that opened the breaker were still refused more "
        f"than 0.5 s after another process's reset_health(), the last one "
        f"{late[-1]['t0'] - reset['t1']:.1f} s after it with retry_after="
        f"{late[-1]['retry_after']:.0f} s; yet the reset closed it: {reset['after'][0]}"
    )
    assert provider.statuses() == [503, 503, 200]
    ok = caller.events()[-1]
    assert ok["outcome"] == "ok"
    assert provider.arrivals()[2].at >= reset["t0"]
    assert ok["t1"] - reset["t1"] <= 0.5
    assert caller.proc.returncode == 0, caller.stderr()
    assert caller.health()["breaker"] == "closed"
