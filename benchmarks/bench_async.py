"""Async calls at 100 and 1,000 in flight: transports, pool limits and the admission gate.

The loopback server is bench_client.py's (raw asyncio, keep-alive, one fixed
OpenAI answer, its own process), counting the connections it accepts. Each
variant runs in a fresh process: ``N`` workers each make calls back to back
until 5,000 are done (``--quick``: 1,000), so ``N`` calls are always in
flight. Reported per variant: calls/s, p50, p99 and max latency (from the
moment a call is made: queueing for a connection counts), failures by type,
connections opened, peak RSS, and bytes per in-flight call (RSS growth and
tracemalloc peak of one traced round of ``N`` calls, divided by ``N``).

Variants: bare httpx with its defaults (5 s timeouts; 100 connections, 20
kept alive), httpx with all 100 kept alive, httpx2, httpx over aiohttp
(httpx-aiohttp), fluid_build's pool (src/fluid_build/copilot/call/transport/)
bare, and ``LLMClient.acomplete`` with today's pool and with each transport of
transport.py (handed in as ``async_http_client``), and the openai SDK when
installed. Peers that are not installed are skipped, with a note.

    python benchmarks/bench_async.py [--quick] [--passes N] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench_client import (
    ANSWER,
    API_KEY,
    HEADERS,
    MATRIX,
    MODEL,
    PAYLOAD,
    PROMPT,
    TIMEOUT,
    _Answer,
    _rss_mib,
    _version,
    machine,
    machine_line,
)
from bench_client import (
    RESPONSE as _RESPONSE,
)

CONCURRENCY = (100, 1_000)
#: The suffix of a variant run on another checkout's src/ (``--before DIR``).
BEFORE = "@before"
#: Set (by ``--gc-off``) for the workers: the timed calls run with the collector disabled.
GC_OFF = "FLUID_BENCH_GC_OFF"
CALLS = {False: 5_000, True: 1_000}  # by --quick
WARM_CALLS = 20  # one at a time, before the clock: imports and first-use caches

Call = Callable[[], Awaitable[object]]
Close = Callable[[], Awaitable[None]]

ROWS: tuple[tuple[str, str, str | None], ...] = (  # (variant, label, module it needs)
    ("aiohttp", "bare aiohttp ClientSession, its default pool (100 connections)", "aiohttp"),
    ("aiohttp-1000", "bare aiohttp ClientSession, 1,000-connection pool", "aiohttp"),
    ("httpx-default", "bare httpx 0.28, defaults (100 conns, 20 kept alive, 5 s)", None),
    ("httpx-ka100", "bare httpx 0.28, 100 conns all kept alive", None),
    ("httpx2", "bare httpx2, defaults (timeout 120 s)", "httpx2"),
    ("httpx-aiohttp", "bare httpx over aiohttp (httpx-aiohttp), 100 conns", "httpx_aiohttp"),
    ("pool-httpx", "bare transport.py pool, httpx + FIFO gate", None),
    ("pool-aiohttp", "bare transport.py pool, aiohttp + FIFO gate", "httpx_aiohttp"),
    ("llm-default", "LLMClient.acomplete, out of the box (default transport and store)", None),
    ("llm-httpx", "LLMClient.acomplete, transport.py httpx", None),
    ("llm-aiohttp", "LLMClient.acomplete, transport.py aiohttp", "httpx_aiohttp"),
    ("openai", "openai SDK AsyncOpenAI", "openai"),
)


#: ``--floor``: where an async call's CPU goes, layer by layer, from bare aiohttp to LLMClient.
FLOOR_ROWS: tuple[tuple[str, str, str | None], ...] = (
    ("aiohttp", "bare aiohttp ClientSession.post(json=) + .json() (the baseline)", "aiohttp"),
    (
        "aiohttp-as-fluid",
        "aiohttp ClientSession as transport.py calls it (encoded URL, header list, bytes body, "
        "no decompression): the transport's floor",
        "aiohttp",
    ),
    (
        "pool-exchange",
        "transport.py's aiohttp pool under httpx's types: a direct JSON request, one Exchange "
        "(send, bounded read, close), no LLMClient",
        "aiohttp",
    ),
    (
        "llm-nowire",
        "LLMClient.acomplete, default store, on a transport that answers in-process "
        "(no socket): fluid_build's own work",
        None,
    ),
    ("llm-default", "LLMClient.acomplete, out of the box (default transport and store)", None),
)


# -- the server: bench_client's, counting accepted connections ----------------------------------


class _Counted(_Answer):
    accepted = 0
    delay = 0.0  # seconds before each answer: 0 for CPU-bound runs, 0.2 for latency-bound

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        _Counted.accepted += 1
        super().connection_made(transport)

    def answer(self) -> None:
        if not self.delay:
            super().answer()
            return
        asyncio.get_running_loop().call_later(self.delay, self._answer_now)

    def _answer_now(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(_RESPONSE)


def _pin(cpu: int) -> None:
    """Keep this process on one core (the server on the first, clients on the second), as
    the issue's measurements were made; a no-op on a one-core machine."""
    with contextlib.suppress(AttributeError, OSError):
        if len(os.sched_getaffinity(0)) > 1:
            os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[cpu]})


def _serve(ready: Any, control: Any, delay: float) -> None:
    _pin(0)
    _Counted.delay = delay

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(_Counted, "127.0.0.1", 0, backlog=4096)

        def answer() -> None:  # any message on the control pipe: "how many so far?"
            control.recv()
            control.send(_Counted.accepted)

        loop.add_reader(control.fileno(), answer)
        ready.send(server.sockets[0].getsockname()[1])
        ready.close()
        await asyncio.Event().wait()  # until terminated

    asyncio.run(main())


@contextmanager
def counting_server(delay: float = 0.0) -> Iterator[tuple[str, Callable[[], int]]]:
    """The loopback server in its own process: its base URL and a count of its accepts."""
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    ask, control = ctx.Pipe()
    process = ctx.Process(target=_serve, args=(child, control, delay), daemon=True)
    process.start()

    def accepted() -> int:
        ask.send(None)
        return int(ask.recv())

    try:
        if not parent.poll(30):
            raise RuntimeError("the loopback server did not start")
        yield f"http://127.0.0.1:{parent.recv()}/v1", accepted
    finally:
        process.terminate()
        process.join(5)


# -- the variants (in the worker process) ---------------------------------------------------


def variant(name: str, url: str) -> tuple[Call, Close]:
    endpoint = f"{url}/chat/completions"
    if name in ("aiohttp", "aiohttp-1000"):
        import aiohttp

        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=1_000 if name == "aiohttp-1000" else 100),
            timeout=aiohttp.ClientTimeout(total=TIMEOUT),
        )

        async def bare() -> object:
            async with session.post(endpoint, json=PAYLOAD, headers=HEADERS) as response:
                response.raise_for_status()
                return await response.json()

        return bare, session.close
    if name == "aiohttp-as-fluid":
        return _as_fluid(endpoint)
    if name == "pool-exchange":
        return _pool_exchange(endpoint)
    if name.startswith(("httpx", "pool")):
        if name == "httpx-default":
            import httpx

            client: Any = httpx.AsyncClient()
        elif name == "httpx-ka100":
            import httpx

            client = httpx.AsyncClient(
                timeout=TIMEOUT,
                limits=httpx.Limits(max_connections=100, max_keepalive_connections=100),
            )
        elif name == "httpx2":
            import httpx2

            client = httpx2.AsyncClient(timeout=TIMEOUT)
        elif name == "httpx-aiohttp":
            from httpx_aiohttp import HttpxAiohttpClient

            client = HttpxAiohttpClient(timeout=TIMEOUT)
        else:
            from fluid_build.copilot.call.transport import build_async_client

            client = build_async_client(TIMEOUT, None, {}, transport=name.split("-")[1])

        async def post() -> object:
            return (await client.post(endpoint, json=PAYLOAD, headers=HEADERS)).json()

        return post, client.aclose
    if name.startswith("llm"):
        from fluid_build.copilot import LLMClient
        from fluid_build.copilot.call.envelope import RetryEnvelope
        from fluid_build.copilot.call.transport import PooledAsyncClient, build_async_client

        pool: Any = None
        if name == "llm-nowire":
            pool = PooledAsyncClient(transport=_in_process())
        elif name != "llm-default":
            pool = build_async_client(TIMEOUT, "vllm", {}, transport=name[4:])
        out_of_the_box = name in ("llm-default", "llm-nowire")
        # out of the box: the default store (a sqlite file, here in a scratch cache) and breaker
        scratch = {"XDG_CACHE_HOME": tempfile.mkdtemp(prefix="fluid-bench-")}
        llm = LLMClient(
            "vllm",
            MODEL,
            API_KEY,
            url,
            envelope=RetryEnvelope.from_env(scratch)
            if out_of_the_box
            else RetryEnvelope(cooldown=None),
            capability_matrix=MATRIX,
            env={},
            async_http_client=pool,
        )

        async def acomplete() -> object:
            return await llm.acomplete(PROMPT)

        async def close() -> None:
            await llm.aclose()
            if pool is not None:
                await pool.aclose()

        return acomplete, close
    if name == "openai":
        import openai

        sdk = openai.AsyncOpenAI(api_key=API_KEY, base_url=url)
        messages: Any = [{"role": "user", "content": PROMPT}]

        async def create() -> object:
            return await sdk.chat.completions.create(model=MODEL, messages=messages)

        return create, sdk.close
    raise ValueError(name)


def _as_fluid(endpoint: str) -> tuple[Call, Close]:
    """aiohttp's session called the way transport.py's AiohttpTransport calls it, with
    nothing of fluid_build around: the body encoded as fluid_build encodes it, the head
    and the timeouts made once, the body read whole and the connection released."""
    import aiohttp
    import yarl

    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=1_000), cookie_jar=aiohttp.DummyCookieJar()
    )
    url = yarl.URL(endpoint, encoded=True)
    timeout = aiohttp.ClientTimeout(sock_connect=TIMEOUT, sock_read=TIMEOUT, connect=TIMEOUT)
    head = [*HEADERS.items(), ("accept-encoding", "gzip, deflate")]

    async def call() -> object:
        body = json.dumps(PAYLOAD, ensure_ascii=False, separators=(",", ":")).encode()
        response = await session.request(
            "POST",
            url,
            headers=head,
            data=body,
            allow_redirects=False,
            auto_decompress=False,
            compress=False,
            timeout=timeout,
        )
        try:
            return json.loads(await response.read())
        finally:
            response.release()

    return call, session.close


def _pool_exchange(endpoint: str) -> tuple[Call, Close]:
    """transport.py's aiohttp pool as the call path uses it, without LLMClient: a direct
    JSON request, then one Exchange (send, the bounded read, close) within a deadline."""
    from fluid_build.copilot.call.drive import Exchange
    from fluid_build.copilot.call.transport import build_async_client
    from fluid_build.copilot.call.wire import Deadline, Limits

    pool: Any = build_async_client(TIMEOUT, "vllm", {}, transport="aiohttp")
    limits = Limits()

    async def call() -> object:
        request = pool.fluid_json_request("POST", endpoint, HEADERS, PAYLOAD, TIMEOUT)
        response = await Exchange(pool, request, Deadline(TIMEOUT), limits).arun()
        return json.loads(response.content)

    return call, pool.aclose


def _in_process() -> Any:
    """A transport that gives the fixed answer at once, with no socket: what is left of a
    call on it is fluid_build's own work (httpx is imported here, not in every worker)."""
    import httpx

    class InProcess(httpx.AsyncBaseTransport):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            return httpx.Response(
                200,
                headers=[
                    ("content-type", "application/json"),
                    ("x-request-id", "req_bench"),
                    ("content-length", str(len(ANSWER))),
                ],
                stream=httpx.ByteStream(ANSWER),
                request=request,
            )

    return InProcess()


class _GcClock:
    """The time the cyclic garbage collector takes (a gc callback), and its full passes."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.full = 0
        self._began = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
            return
        self.seconds += time.perf_counter() - self._began
        self.full += info["generation"] == 2


async def run(
    name: str, url: str, concurrency: int, calls: int, profile: str | None = None
) -> dict[str, Any]:
    """``concurrency`` workers making ``calls`` calls in all; then one traced round.

    ``profile``: a path to write a cProfile of the timed calls to (then the figures are
    the profiler's, inflated, and only good for where the time goes).
    """
    call, close = variant(name, url)
    latencies: list[float] = []
    settled: list[float] = []  # the calls made after the first N (the connections' wave)
    failures: Counter[str] = Counter()
    left = calls

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            later = calls - left > concurrency
            started = time.perf_counter()
            try:
                await call()
            except Exception as exc:  # noqa: BLE001 - counted by type, the run goes on
                failures[type(exc).__name__] += 1
            else:
                latencies.append(time.perf_counter() - started)
                if later:
                    settled.append(latencies[-1])

    try:
        for _ in range(WARM_CALLS):
            await call()
        gc.collect()
        rss_warm = _rss_mib()
        profiler = None
        if profile:
            import cProfile

            profiler = cProfile.Profile()
            profiler.enable()
        collecting = _GcClock()
        gc.callbacks.append(collecting)
        if os.environ.get(GC_OFF):  # --gc-off: what the calls look like without the collector
            gc.disable()
        cpu = time.process_time()
        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
        cpu = time.process_time() - cpu
        gc.enable()
        gc.callbacks.remove(collecting)
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(profile)
        rss_peak = _rss_mib()
        gc.collect()
        tracemalloc.start()  # one traced round of `concurrency` calls at once: memory only
        base = tracemalloc.get_traced_memory()[0]
        await asyncio.gather(*(call() for _ in range(concurrency)), return_exceptions=True)
        traced = tracemalloc.get_traced_memory()[1] - base
        tracemalloc.stop()
    finally:
        await close()
    latencies.sort()
    settled.sort()

    def at(q: float, among: list[float] = latencies) -> float:
        return among[min(int(q * len(among)), len(among) - 1)] if among else 0.0

    return {
        "calls_per_s": len(latencies) / elapsed,
        "cpu_us_per_call": cpu / max(len(latencies), 1) * 1e6,
        "gc_us_per_call": collecting.seconds / max(len(latencies), 1) * 1e6,
        "gc_full": collecting.full,
        "p50_s": at(0.50),
        "p99_s": at(0.99),
        "max_s": latencies[-1] if latencies else 0.0,
        # past the first N calls, which open the pool's connections all at once
        "settled_p99_over_p50": at(0.99, settled) / at(0.50, settled) if settled else 0.0,
        "failures": dict(failures),
        "rss_peak_mib": rss_peak,
        "rss_per_call_kib": max(rss_peak - rss_warm, 0.0) * 1024 / concurrency,
        "traced_per_call_kib": traced / 1024 / concurrency,
    }


def measure(
    name: str, url: str, concurrency: int, calls: int, profile: str | None = None
) -> dict[str, Any]:
    """One variant in a fresh interpreter, so that its memory and its pool are its own."""
    extra = ["--profile-to", profile] if profile else []
    env = None
    if name.endswith(BEFORE):  # the same variant on another checkout's src/ (--before)
        name = name[: -len(BEFORE)]
        env = {**os.environ, "PYTHONPATH": os.environ["FLUID_BENCH_BEFORE"]}
    done = subprocess.run(  # noqa: S603 - this script, this interpreter
        [sys.executable, __file__, "--worker", name, url, str(concurrency), str(calls), *extra],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=1_800,
    )
    if done.returncode != 0:
        raise RuntimeError(f"worker {name} x{concurrency} failed:\n{done.stderr[-2000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _ratio(runs: list[dict[str, Any]], base: list[dict[str, Any]] | None) -> str:
    """The median over passes of a pass's calls/s over the baseline's in the same pass."""
    if not base:
        return "n/a"
    pairs = zip(runs, base, strict=False)
    return f"{statistics.median(r['calls_per_s'] / b['calls_per_s'] for r, b in pairs):.2f}x"


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


#: What a profiled function's file is part of, the first that matches.
_PACKAGES: tuple[tuple[str, str], ...] = (
    ("fluid_build/copilot/call/", "fluid_build: the call (call/)"),
    ("fluid_build/copilot/health/", "fluid_build: store, breaker, limiter (health/)"),
    ("fluid_build/copilot/llm/", "fluid_build: the adapter (llm/)"),
    ("fluid_build/", "fluid_build: the rest"),
    ("httpx/", "httpx"),
    ("aiohttp/", "aiohttp"),
    ("yarl/", "aiohttp"),
    ("multidict/", "aiohttp"),
    ("asyncio/", "asyncio"),
    ("json/", "json"),
    ("pydantic", "pydantic"),
    ("sqlite3", "sqlite3"),
    ("bench_async.py", "the benchmark's loop"),
)


def _package(filename: str) -> str:
    for marker, name in _PACKAGES:
        if marker in filename:
            return name
    return "C builtins" if filename == "~" else "other"


def profile_variant(args: argparse.Namespace) -> int:
    """cProfile ``args.profile``'s timed calls at each N; print the functions that cost most,
    fluid_build's and its libraries' alike (own time and cumulative, us per call)."""
    import pstats

    calls = args.calls or CALLS[args.quick]
    with tempfile.TemporaryDirectory() as tmp, counting_server(args.delay) as (url, _):
        for concurrency in tuple(args.concurrency or CONCURRENCY):
            path = str(Path(tmp) / f"{concurrency}.prof")
            result = measure(args.profile, url, concurrency, calls, profile=path)
            stats = pstats.Stats(path)
            table: dict[tuple[str, int, str], tuple[Any, ...]] = stats.stats  # type: ignore[attr-defined]
            done = result["calls_per_s"] and calls
            total = sum(row[2] for row in table.values())
            print(
                f"cProfile of {calls:,} {args.profile} calls at {concurrency:,} in flight "
                f"(us per call, profiled: about 2x the real figures; {total / done * 1e6:,.0f} "
                "us of own time per call in all):"
            )
            print()
            groups: Counter[str] = Counter()
            for (filename, _, _), (_, _, own, _, _) in table.items():
                groups[_package(filename)] += own
            print("| where (own time) | us per call | share |")
            print("| --- | ---: | ---: |")
            for where, own in groups.most_common(10):
                print(f"| {where} | {own / done * 1e6:.1f} | {own / total:.0%} |")
            print()
            print("| function | own (us) | cumulative (us) |")
            print("| --- | ---: | ---: |")
            rows = sorted(table.items(), key=lambda item: item[1][2], reverse=True)
            for (filename, line, func), (_, _, own, cumulative, _) in rows[:30]:
                where = filename
                for marker in ("site-packages/", "src/", "lib/python3"):
                    if marker in where:
                        where = where[where.index(marker) + len(marker) :]
                        break
                print(
                    f"| {where}:{line}({func}) | {own / done * 1e6:.1f} | "
                    f"{cumulative / done * 1e6:.1f} |"
                )
            print()
    return 0


def objects_in_flight(name: str, concurrency: int) -> float:
    """The objects the garbage collector tracks per call in flight: ``concurrency`` calls
    held at a server that answers after 2 s, counted against the same process idle
    (warmed up, with the connections they will use already open)."""
    with counting_server(2.0) as (url, _):

        async def count() -> float:
            call, close = variant(name, url)
            try:
                await asyncio.gather(*(call() for _ in range(concurrency)))  # connections
                gc.collect()
                idle = len(gc.get_objects())
                calls = [asyncio.ensure_future(call()) for _ in range(concurrency)]
                await asyncio.sleep(1.0)  # every call sent, none answered
                gc.collect()
                held = len(gc.get_objects()) - idle
                await asyncio.gather(*calls)
                return held / concurrency
            finally:
                await close()

        return asyncio.run(count())


def installed(module: str | None) -> bool:
    if module is None:
        return True
    from importlib.util import find_spec

    return find_spec(module) is not None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1,000 calls a variant, one pass")
    parser.add_argument("--passes", type=int, help="interleaved passes (default 2; --quick 1)")
    parser.add_argument("--only", help="comma-separated variants to run")
    parser.add_argument(
        "--concurrency", type=int, action="append", help="calls in flight (default: 100, 1000)"
    )
    parser.add_argument(
        "--delay",
        type=float,
        default=0.0,
        help="seconds the server waits before each answer (0: CPU-bound; 0.2: latency-bound)",
    )
    parser.add_argument("--calls", type=int, help="calls a variant (default 5,000; --quick 1,000)")
    parser.add_argument(
        "--profile",
        metavar="VARIANT",
        help="cProfile one variant's timed calls at each N and print where the time goes",
    )
    parser.add_argument(
        "--before",
        metavar="SRC",
        help="also run LLMClient out of the box from this src/ directory (e.g. a worktree of "
        "an earlier commit), interleaved, as the row 'llm-default@before'",
    )
    parser.add_argument(
        "--floor",
        action="store_true",
        help="where an async call's CPU goes, layer by layer: bare aiohttp, aiohttp as "
        "transport.py calls it, the pool under httpx's types, LLMClient with no socket, "
        "LLMClient",
    )
    parser.add_argument(
        "--objects",
        metavar="VARIANTS",
        help="comma-separated variants: the objects the garbage collector tracks per call in "
        "flight, at each N (the collector's work grows with them)",
    )
    parser.add_argument(
        "--gc-off",
        action="store_true",
        help="a diagnosis, not a figure: the timed calls run with the garbage collector "
        "disabled (what its pauses add to CPU and to p99)",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
    parser.add_argument("--profile-to", help=argparse.SUPPRESS)
    parser.add_argument("--objects-of", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _pin(1)
        name, url, concurrency, calls = args.worker
        result = asyncio.run(run(name, url, int(concurrency), int(calls), args.profile_to))
        print(json.dumps(result))
        return 0
    if args.profile:
        return profile_variant(args)
    if args.objects:
        print("| variant | N | tracked objects per call in flight |")
        print("| --- | ---: | ---: |")
        for name in args.objects.split(","):
            for concurrency in tuple(args.concurrency or CONCURRENCY):
                # each in a fresh process, as the timed runs are
                done = subprocess.run(  # noqa: S603 - this script, this interpreter
                    [sys.executable, __file__, "--objects-of", name, str(concurrency)],
                    capture_output=True,
                    text=True,
                    check=True,
                    timeout=600,
                )
                print(f"| {name} | {concurrency:,} | {float(done.stdout.strip()):.1f} |")
        return 0
    if args.objects_of:
        print(objects_in_flight(args.objects_of[0], int(args.objects_of[1])))
        return 0

    if args.gc_off:
        os.environ[GC_OFF] = "1"
        print("the garbage collector is disabled during the timed calls (--gc-off)")
    calls = args.calls or CALLS[args.quick]
    passes = args.passes or (1 if args.quick else 2)
    wanted = set(args.only.split(",")) if args.only else None
    levels = tuple(args.concurrency or CONCURRENCY)
    rows = [r for r in (FLOOR_ROWS if args.floor else ROWS) if wanted is None or r[0] in wanted]
    if args.before:
        os.environ["FLUID_BENCH_BEFORE"] = str(Path(args.before).resolve())
        label = f"LLMClient.acomplete, out of the box, from {args.before}"
        rows.append((f"llm-default{BEFORE}", label, None))
    present = [name for name, _, module in rows if installed(module)]
    seen: dict[tuple[str, int], list[dict[str, Any]]] = {}
    with counting_server(args.delay) as (url, accepted):
        for _ in range(passes):  # interleaved: load from other processes falls on all alike
            for concurrency in levels:
                for name in present:
                    before = accepted()
                    result = measure(name, url, concurrency, calls)
                    result["connections"] = accepted() - before
                    seen.setdefault((name, concurrency), []).append(result)
                    print(
                        f"  {name} x{concurrency}: {result['calls_per_s']:.0f}/s", file=sys.stderr
                    )

    versions = {d: _version(d) for d in ("httpx", "httpx2", "aiohttp", "httpx-aiohttp", "openai")}
    print(machine_line(machine()))
    print(", ".join(f"{d} {v or 'not installed'}" for d, v in versions.items()))
    print()
    pinned = "server and client pinned to their own cores" if _cores() > 1 else "one core"
    print(
        f"{calls:,} calls a variant (after {WARM_CALLS} warm-up calls), N always in flight, "
        f"server answering after {args.delay * 1000:g} ms, {pinned}, "
        f"each variant in a fresh process, {passes} interleaved pass(es): calls/s and "
        "latencies as min-max over passes; 'x aiohttp' is the median over passes of each "
        "pass's calls/s over bare aiohttp's (default pool, and 1,000 connections) in the same "
        "pass; CPU per call is the client process's CPU time over the timed calls, of it GC "
        "the time the garbage collector ran (gc.callbacks); 'p99/p50 later' leaves out the "
        "first N calls, which open the pool's connections all at once; memory "
        "the largest pass; connections include the warm-up and the traced round of N:"
    )
    print()
    print(
        "| N | variant | calls/s | x aiohttp | x aiohttp 1,000 conns | p50 (s) | p99 (s) "
        "| p99/p50 | p99/p50 later | max (s) | CPU per call (us) | of it GC (us) | failures "
        "| connections | peak RSS (MiB) | RSS per in-flight call (KiB) "
        "| traced per in-flight call (KiB) |"
    )
    print(
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- "
        "| ---: "
        "| ---: | ---: | ---: |"
    )
    table: list[dict[str, Any]] = []

    def span(runs: list[dict[str, Any]], key: str, fmt: str) -> str:
        low, high = min(r[key] for r in runs), max(r[key] for r in runs)
        return (
            format(low, fmt)
            if format(low, fmt) == format(high, fmt)
            else (f"{format(low, fmt)}-{format(high, fmt)}")
        )

    for concurrency in levels:
        for name, label, module in rows:
            runs = seen.get((name, concurrency))
            if not runs:
                print(f"| {concurrency:,} | {label} | {module} not installed | | | | | | | | |")
                continue
            failures: Counter[str] = Counter()
            for r in runs:
                failures.update(r["failures"])
            shown = ", ".join(f"{n:,} {k}" for k, n in failures.most_common()) or "0"
            ratio = " | ".join(
                _ratio(runs, seen.get((base, concurrency))) for base in ("aiohttp", "aiohttp-1000")
            )
            for r in runs:
                r["p99_over_p50"] = r["p99_s"] / r["p50_s"] if r["p50_s"] else 0.0
            # no call past the first N (a run of N calls or fewer): nothing to say
            later = (
                span(runs, "settled_p99_over_p50", ".2f")
                if all(r["settled_p99_over_p50"] for r in runs)
                else "n/a"
            )
            print(
                f"| {concurrency:,} | {label} | {span(runs, 'calls_per_s', ',.0f')} | {ratio} | "
                f"{span(runs, 'p50_s', '.3f')} | {span(runs, 'p99_s', '.3f')} | "
                f"{span(runs, 'p99_over_p50', '.2f')} | "
                f"{later} | "
                f"{span(runs, 'max_s', '.2f')} | {span(runs, 'cpu_us_per_call', ',.0f')} | "
                f"{span(runs, 'gc_us_per_call', ',.0f')} | "
                f"{shown} | {span(runs, 'connections', ',d')} | "
                f"{max(r['rss_peak_mib'] for r in runs):.0f} | "
                f"{max(r['rss_per_call_kib'] for r in runs):.1f} | "
                f"{max(r['traced_per_call_kib'] for r in runs):.1f} |"
            )
            table.append(
                {"variant": name, "label": label, "concurrency": concurrency, "runs": runs}
            )
    if args.json:
        Path(args.json).write_text(
            json.dumps({"machine": machine(), "versions": versions, "rows": table}, indent=2) + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
