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

The limiter is driven directly around httpx calls (reserve, observe, settle),
as the client will once it is wired in; LLMClient does not use it yet.

    python benchmarks/bench_ratelimit.py [--window 2] [--style openai|anthropic] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
from tests.ratelimit_server import RateLimitedProvider, serving  # noqa: E402

PROCESSES = 8
CALLS = 200
REQUESTS = 25
TOKENS = 1_500
BODY = json.dumps({"model": "gpt-4o-mini", "max_tokens": 16, "messages": [{"x": "y" * 160}]})


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


def run(limited: bool, window: float, style: str) -> dict[str, Any]:
    provider = RateLimitedProvider(REQUESTS, TOKENS, window=window, style=style)  # type: ignore[arg-type]
    per_window = min(REQUESTS, TOKENS // provider.cost(BODY.encode()))
    least = (math.ceil(CALLS / per_window) - 1) * window
    spawn = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory() as cache, serving(provider) as url:
        os.environ["XDG_CACHE_HOME"] = cache
        os.environ.pop("FLUID_COOLDOWN_URL", None)
        start = spawn.Event()
        results: multiprocessing.Queue[int] = spawn.Queue()
        workers = [
            spawn.Process(target=_worker, args=(url, CALLS // PROCESSES, limited, start, results))
            for _ in range(PROCESSES)
        ]
        for worker in workers:
            worker.start()
        time.sleep(3.0)  # noqa: real-sleep - let every process import before the clock starts
        began = time.perf_counter()
        start.set()
        refused = sum(results.get(timeout=600) for _ in workers)
        wall = time.perf_counter() - began
        for worker in workers:
            worker.join(timeout=30)
    return {
        "limiter": limited,
        "style": style,
        "answers_429": refused,
        "server_429": provider.refused,
        "answered": provider.ok,
        "wall_s": round(wall, 3),
        "least_s": least,
        "ratio": round(wall / least, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=float, default=2.0)
    parser.add_argument("--style", choices=["openai", "anthropic"], default="openai")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = [run(limited, args.window, args.style) for limited in (False, True)]
    for row in rows:
        print(
            f"{'with' if row['limiter'] else 'without'} limiter ({row['style']}): "
            f"{row['answers_429']} answers 429, {row['answered']} answered, wall "
            f"{row['wall_s']:.2f} s against a least of {row['least_s']:.2f} s "
            f"({row['ratio']:.2f}x)"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
