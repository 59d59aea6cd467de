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


def _client_body() -> bytes:
    """The bytes LLMClient sends for the benchmark's call (the server's token cost is of them)."""
    sent: list[bytes] = []

    def capture(request: httpx.Request) -> httpx.Response:
        sent.append(request.content)
        return httpx.Response(200, json={"choices": [{"message": {"content": "ok"}}]})

    with (
        httpx.Client(transport=httpx.MockTransport(capture)) as http,
        _client("http://127.0.0.1:9", True, http_client=http) as client,
    ):
        client.complete(PROMPT, max_output_tokens=16)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=float, default=2.0)
    parser.add_argument("--style", choices=["openai", "anthropic"], default="openai")
    parser.add_argument("--direct", action="store_true", help="bare httpx around the limiter")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
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
