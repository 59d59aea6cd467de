"""8 processes, one rate-limited provider, the default store: 429s and wall time.

The provider is tests/ratelimit_server.py (loopback, in this process): a
fixed window of ``--window`` seconds (2 s, standing in for a minute) allowing
25 requests and 1,500 tokens, announced on every answer as OpenAI does
(``--style anthropic``: as Anthropic does); a request that does not fit gets
a 429 with Retry-After. 8 processes, sharing the default store (the sqlite
file under ``$XDG_CACHE_HOME``, here a temporary directory), send 200 calls
in all, each retried after a 429 as the server asks, with and without the
limiter. Reported: the 429 answers and the wall time against the least the
limit allows (every window but the last full).

By default each process calls ``LLMClient.complete`` as a user would (the
limiter is on by default; "without" sets ``FLUID_RATE_LIMITS=off``, leaving
the envelope to wait out each 429's Retry-After); ``--direct`` drives the
limiter around bare httpx calls instead (reserve, observe, settle).

    python benchmarks/bench_ratelimit.py [--window 2] [--style openai|anthropic] [--direct]

``--fleet``: 4 simulated hosts (each its own HOME and ``$XDG_CACHE_HOME``, so
its own sqlite file) of 4 processes each call ``LLMClient.complete`` in a loop
for ``--seconds`` against the same provider, sharing one real redis-server
(``FLUID_COOLDOWN_URL=redis://...``) that this script starts on a free
loopback port. Baselines in the same run: the limiter off
(``FLUID_RATE_LIMITS=off``, cooldowns still shared on Redis) and each host on
its own sqlite file (no Redis). Reported from the provider's log: the 429s in
the first window and after it, the capacity used (answers over what the
windows elapsed allow), each host's share of the answers over the mean, and
the calls that failed. ``--restart-redis`` adds a run where Redis is killed
halfway and started again on its port ``--down`` seconds later, empty: the
429s during and after the outage, and how long after Redis answers again
every process uses it again (each connects under its own ``client_name``, and
``CLIENT LIST`` shows it past the handshake).

    python benchmarks/bench_ratelimit.py --fleet [--restart-redis] [--seconds 30] [--down 2]
        [--modes off,sqlite,redis,restart] [--json F]
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import platform
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
from tests.ratelimit_server import RateLimitedProvider, RestartableRedis, serving  # noqa: E402

PROCESSES = 8
CALLS = 200
REQUESTS = 25
TOKENS = 1_500
BODY = json.dumps({"model": "gpt-4o-mini", "max_tokens": 16, "messages": [{"x": "y" * 160}]})
PROMPT = "y" * 160


def _client(url: str, limited: bool, **kwargs: Any) -> Any:
    """An LLMClient as a user makes one: the environment's store (the default sqlite file)."""
    from fluid_build.copilot import LLMClient

    env = dict(os.environ)
    if not limited:
        env["FLUID_RATE_LIMITS"] = "off"
    return LLMClient(
        "openai", "gpt-4o-mini", api_key="sk-bench", base_url=f"{url}/v1", env=env, **kwargs
    )


def _client_body(prompt: str = PROMPT) -> bytes:
    """The bytes LLMClient sends for the benchmark's call (the server's token cost is of them)."""
    sent: list[bytes] = []

    def capture(request: httpx.Request) -> httpx.Response:
        sent.append(request.content)
        return httpx.Response(200, json={"choices": [{"message": {"content": "ok"}}]})

    with (
        httpx.Client(transport=httpx.MockTransport(capture)) as http,
        _client("http://127.0.0.1:9", True, http_client=http) as client,
    ):
        client.complete(prompt, max_output_tokens=16)
    return sent[0]


def _client_worker(
    url: str, calls: int, limited: bool, start: Any, results: multiprocessing.Queue[int]
) -> None:
    with _client(url, limited) as client:
        start.wait()
        for _ in range(calls):
            client.complete(PROMPT, max_output_tokens=16)
    results.put(0)  # the 429s are counted where they are sent: at the server


def _worker(
    url: str, calls: int, limited: bool, start: Any, results: multiprocessing.Queue[int]
) -> None:
    from fluid_build.copilot.agents.error_classification import parse_retry_after
    from fluid_build.copilot.health.cooldown import CooldownKey, cooldown_store_from_env
    from fluid_build.copilot.health.ratelimit import RateLimiter, estimate_tokens

    store = cooldown_store_from_env(os.environ)  # the default: the sqlite file
    assert store is not None
    limiter = RateLimiter(store)
    key = CooldownKey.for_call("openai", "sk-bench", "gpt-4o-mini", url)
    body = BODY.encode()
    tokens = estimate_tokens(body, 16)
    refused = 0
    start.wait()
    with httpx.Client(base_url=url) as client:
        for _ in range(calls):
            while True:
                if limited:
                    for wait in limiter.waits(key, tokens, wall=time.time, left=lambda: None):
                        time.sleep(wait)  # noqa: real-sleep - a benchmark of real waits
                response = client.post("/v1/chat/completions", content=body)
                if limited:
                    limiter.observe(key, response.headers, time.time())
                if response.status_code != 429:
                    usage = response.json()["usage"]
                    used = usage.get("total_tokens") or sum(usage.values())
                    if limited:
                        limiter.settle(key, tokens, int(used), time.time())
                    break
                refused += 1
                time.sleep(parse_retry_after(response.headers) or 1.0)  # noqa: real-sleep - as asked
    results.put(refused)


def run(limited: bool, window: float, style: str, direct: bool) -> dict[str, Any]:
    provider = RateLimitedProvider(REQUESTS, TOKENS, window=window, style=style)  # type: ignore[arg-type]
    body = BODY.encode() if direct else _client_body()
    per_window = min(REQUESTS, TOKENS // provider.cost(body))
    least = (math.ceil(CALLS / per_window) - 1) * window
    spawn = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory() as cache, serving(provider) as url:
        os.environ["XDG_CACHE_HOME"] = cache
        os.environ.pop("FLUID_COOLDOWN_URL", None)
        start = spawn.Event()
        results: multiprocessing.Queue[int] = spawn.Queue()
        workers = [
            spawn.Process(
                target=_worker if direct else _client_worker,
                args=(url, CALLS // PROCESSES, limited, start, results),
            )
            for _ in range(PROCESSES)
        ]
        for worker in workers:
            worker.start()
        time.sleep(3.0)  # noqa: real-sleep - let every process import before the clock starts
        began = time.perf_counter()
        start.set()
        sum(results.get(timeout=600) for _ in workers)
        wall = time.perf_counter() - began
        for worker in workers:
            worker.join(timeout=30)
    return {
        "limiter": limited,
        "style": style,
        "through": "bare httpx" if direct else "LLMClient",
        "answers_429": provider.refused,
        "answered": provider.ok,
        "wall_s": round(wall, 3),
        "least_s": least,
        "ratio": round(wall / least, 3),
    }


# -- a fleet: hosts of processes on one Redis -------------------------------------------

HOSTS = 4
PER_HOST = 4
_TAG = re.compile(rb"fleet-host-(\d+)")


def _host_prompt(host: int) -> str:
    """The prompt of one host: the same length for every host, tagged for the provider's log."""
    tag = f"fleet-host-{host} "
    return tag + "y" * (len(PROMPT) - len(tag))


def _tag_of(body: bytes) -> str:
    found = _TAG.search(body)
    return found.group(1).decode() if found else "?"


def _fleet_worker(
    url: str,
    host: int,
    env: dict[str, str],
    seconds: float,
    start: Any,
    ready: multiprocessing.Queue[Any],
    results: multiprocessing.Queue[Any],
) -> None:
    """One process of one host: calls for ``seconds`` after ``start``; puts its outcome."""
    from fluid_build.copilot import LLMClient

    os.environ.update(env)  # the host's HOME, cache and store, as its shell would set them
    for name in [n for n in env if env[n] == ""]:
        os.environ.pop(name, None)
    prompt = _host_prompt(host)
    answered, failed, errors, longest = 0, 0, Counter[str](), 0.0
    with LLMClient(
        "openai", "gpt-4o-mini", api_key="sk-bench", base_url=f"{url}/v1", env=dict(os.environ)
    ) as client:
        ready.put(host)
        start.wait()
        deadline = time.monotonic() + seconds
        while (began := time.monotonic()) < deadline:
            try:
                client.complete(prompt, max_output_tokens=16)
                answered += 1
            except Exception as exc:  # noqa: BLE001 - a failed call is what is counted
                failed += 1
                sent = (getattr(exc, "details", None) or {}).get("attempts", "?")
                errors[f"{type(exc).__name__} [{getattr(exc, 'code', '')}] after {sent} sent"] += 1
            longest = max(longest, time.monotonic() - began)
    results.put((host, answered, failed, dict(errors), longest))


def _watch_restart(
    redis: RestartableRedis, at: float, down: float, names: list[str], out: dict[str, float]
) -> None:
    """Kill Redis ``at`` s into the run, start it ``down`` s later, time until all are back."""
    time.sleep(at)  # noqa: real-sleep - a benchmark of a real outage
    out["killed"] = time.monotonic()
    redis.kill()
    time.sleep(down)  # noqa: real-sleep - as long as Redis stays down
    out["back"] = redis.start()
    while time.monotonic() - out["back"] < 30.0:
        try:
            seen = redis.clients()
        except Exception:  # noqa: BLE001 - asked again 20 ms later
            seen = {}
        if all(name in seen and not seen[name].startswith("client") for name in names):
            out["resumed"] = time.monotonic()
            return
        time.sleep(0.02)  # noqa: real-sleep - polling, bounded by the 30 s above


def _fleet_stats(
    provider: RateLimitedProvider, per_window: int, stop: float, outage: dict[str, float]
) -> dict[str, Any]:
    """The figures of one fleet run, from the provider's log up to ``stop``."""
    window = provider.window
    began = provider.windows[0]
    log = [answer for answer in provider.log if answer.at < stop]
    windows = math.floor((stop - began) / window)
    counted = sum(1 for a in log if a.status == 200 and a.at < began + windows * window)
    per_host = Counter(a.tag for a in log if a.status == 200)
    mean = sum(per_host.values()) / HOSTS
    shares = [per_host.get(str(host), 0) / mean if mean else 0.0 for host in range(HOSTS)]
    refused = [a.at for a in log if a.status == 429]
    stats: dict[str, Any] = {
        "answered": sum(per_host.values()),
        "answers_429_first_window": sum(1 for at in refused if at < began + window),
        "answers_429_after": sum(1 for at in refused if at >= began + window),
        "windows": windows,
        "capacity_used": round(counted / (per_window * windows), 4) if windows else 0.0,
        "per_host": [per_host.get(str(host), 0) for host in range(HOSTS)],
        "share_min": round(min(shares), 3),
        "share_max": round(max(shares), 3),
    }
    if "back" in outage:
        killed, back = outage["killed"], outage["back"]
        resumed = outage.get("resumed", math.inf)
        stats.update(
            down_s=round(back - killed, 3),
            resumed_s=round(resumed - back, 3) if math.isfinite(resumed) else None,
            answers_429_while_down=sum(1 for at in refused if killed <= at < back),
            answers_429_until_resumed=sum(1 for at in refused if back <= at < resumed),
            answers_429_after_resumed=sum(1 for at in refused if at >= resumed),
        )
    return stats


def run_fleet(
    mode: str, window: float, seconds: float, down: float, workdir: Path
) -> dict[str, Any]:
    """One fleet run: ``mode`` is off (limiter off, Redis), sqlite, redis or restart."""
    provider = RateLimitedProvider(REQUESTS, TOKENS, window=window, tag_of=_tag_of)
    body = _client_body(_host_prompt(0))
    per_window = min(REQUESTS, TOKENS // provider.cost(body))
    spawn = multiprocessing.get_context("spawn")
    redis = RestartableRedis(workdir)
    redis.start()
    names: list[str] = []
    try:
        with tempfile.TemporaryDirectory() as hosts, serving(provider) as url:
            start = spawn.Event()
            ready: multiprocessing.Queue[Any] = spawn.Queue()
            results: multiprocessing.Queue[Any] = spawn.Queue()
            workers = []
            for host in range(HOSTS):
                home = Path(hosts) / f"host-{host}"
                (home / "cache").mkdir(parents=True)
                for process in range(PER_HOST):
                    name = f"fleet-h{host}-p{process}"
                    env = {
                        "HOME": str(home),
                        "XDG_CACHE_HOME": str(home / "cache"),
                        "FLUID_COOLDOWN_URL": ""
                        if mode == "sqlite"
                        else f"{redis.url}?client_name={name}",
                        "FLUID_RATE_LIMITS": "off" if mode == "off" else "",
                    }
                    names.append(name)
                    workers.append(
                        spawn.Process(
                            target=_fleet_worker,
                            args=(url, host, env, seconds, start, ready, results),
                        )
                    )
            for worker in workers:
                worker.start()
            for _ in workers:
                ready.get(timeout=300)
            outage: dict[str, float] = {}
            watcher = None
            if mode == "restart":
                watcher = threading.Thread(
                    target=_watch_restart, args=(redis, seconds / 2, down, names, outage)
                )
            began = time.monotonic()
            start.set()
            if watcher is not None:
                watcher.start()
            outcomes = [results.get(timeout=seconds + 300) for _ in workers]
            stop = began + seconds
            for worker in workers:
                worker.join(timeout=30)
            if watcher is not None:
                watcher.join(timeout=60)
    finally:
        redis.kill()
    errors: Counter[str] = Counter()
    for _, _, _, seen, _ in outcomes:
        errors.update(seen)
    return {
        "mode": mode,
        "hosts": HOSTS,
        "processes_per_host": PER_HOST,
        "seconds": seconds,
        "per_window": per_window,
        **_fleet_stats(provider, per_window, stop, outage),
        "calls_failed": sum(failed for _, _, failed, _, _ in outcomes),
        "errors": dict(errors),
        "longest_call_s": round(max(longest for *_, longest in outcomes), 3),
    }


FLEET_MODES = {
    "off": "limiter off, cooldowns on Redis",
    "sqlite": "limiter on, each host its own sqlite",
    "redis": "limiter on, one Redis",
    "restart": "limiter on, one Redis, restarted mid-run",
}


def _versions() -> str:
    import redis as redis_lib
    from tests.redis_server import redis_binary

    binary = redis_binary() or "redis-server"
    server = subprocess.run(  # noqa: S603 - the redis-server on PATH, as the runs use
        [binary, "--version"], capture_output=True, text=True, check=False
    ).stdout.split()
    server_version = next((w[2:] for w in server if w.startswith("v=")), "?")
    return (
        f"CPython {platform.python_version()}, {platform.platform()}, {os.cpu_count()} cores; "
        f"httpx {httpx.__version__}, redis-py {redis_lib.__version__}, "
        f"redis-server {server_version}"
    )


def fleet_main(args: argparse.Namespace) -> None:
    modes = ["off", "sqlite", "redis"] + (["restart"] if args.restart_redis else [])
    if args.modes:
        modes = [mode for mode in args.modes.split(",") if mode in FLEET_MODES]
    print(_versions())
    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        for mode in modes:
            row = run_fleet(mode, args.window, args.seconds, args.down, Path(workdir))
            rows.append(row)
            line = (
                f"{FLEET_MODES[mode]}: {row['answers_429_first_window']} answers 429 in the "
                f"first window, {row['answers_429_after']} after; capacity used "
                f"{row['capacity_used']:.1%} of {row['per_window']} a window over "
                f"{row['windows']} windows; host shares {row['share_min']:.2f}x-"
                f"{row['share_max']:.2f}x of the mean {row['per_host']}; "
                f"{row['calls_failed']} calls failed {row['errors'] or ''}; the longest call "
                f"{row['longest_call_s']:.2f} s"
            )
            if mode == "restart":
                resumed = row["resumed_s"]
                when = f"{resumed:.2f} s after it answered" if resumed is not None else "never"
                line += (
                    f"; Redis down {row['down_s']:.2f} s: {row['answers_429_while_down']} 429s "
                    f"while down, {row['answers_429_until_resumed']} until every process used "
                    f"it again ({when}; polled for 30 s), "
                    f"{row['answers_429_after_resumed']} after"
                )
            print(line, flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=float, default=2.0)
    parser.add_argument("--style", choices=["openai", "anthropic"], default="openai")
    parser.add_argument("--direct", action="store_true", help="bare httpx around the limiter")
    parser.add_argument("--fleet", action="store_true", help="4 hosts x 4 processes on one Redis")
    parser.add_argument("--restart-redis", action="store_true", help="with --fleet: and a restart")
    parser.add_argument("--seconds", type=float, default=30.0, help="--fleet: each run's length")
    parser.add_argument("--down", type=float, default=2.0, help="--restart-redis: seconds down")
    parser.add_argument("--modes", help=f"--fleet: only these runs, of {','.join(FLEET_MODES)}")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.fleet or args.restart_redis:
        fleet_main(args)
        return
    rows = [run(limited, args.window, args.style, args.direct) for limited in (False, True)]
    for row in rows:
        print(
            f"{'with' if row['limiter'] else 'without'} limiter ({row['style']}, "
            f"{row['through']}): "
            f"{row['answers_429']} answers 429, {row['answered']} answered, wall "
            f"{row['wall_s']:.2f} s against a least of {row['least_s']:.2f} s "
            f"({row['ratio']:.2f}x)"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
