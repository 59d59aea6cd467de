"""One worker process of tests/test_client_close.py: calls its own client closes, or one call.

Usage: python -m tests.closing_worker MODE TRANSPORT BASE_URL [CALLS]

MODE:
  close  start CALLS calls at once (threads for ``sync``, tasks on one event loop in a
         thread of its own for ``aiohttp``), print ``ready``, wait for a line on stdin
         (the test has seen every request arrive), call ``client.close()`` from the main
         thread, then print one JSON line: each call's outcome and attempts.
  call   one call; print one JSON line: its outcome, attempts, and the client's health.

TRANSPORT: ``sync`` (``complete`` on fluid's sync pool) or ``aiohttp`` (``acomplete`` on
the aiohttp transport). The shared store is the default one (the sqlite file under
``$XDG_CACHE_HOME``), with the breaker's default settings: what every process on the
machine shares. The envelope records its waits and never sleeps.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
from typing import Any

from fluid_build.copilot import LLMClient
from fluid_build.copilot.agents.errors import AgentExecutionError
from fluid_build.copilot.call.envelope import RetryEnvelope

KEY = "sk-closing-worker-0123456789"


def _outcome(fn: Any) -> dict[str, Any]:
    try:
        done = fn()
    except AgentExecutionError as error:
        return {
            "outcome": error.code,
            "retryable": error.retryable,
            "attempts": error.details.get("attempts"),
        }
    except Exception as exc:  # reported to the test, which fails on it
        return {"outcome": f"untyped:{type(exc).__name__}: {exc}"}
    return {"outcome": "ok", "attempts": done.attempts, "text": done.text}


def _raise(exc: Exception) -> Any:
    raise exc


def main(argv: list[str]) -> int:
    mode, transport, base = argv[:3]
    calls = int(argv[3]) if len(argv) > 3 else 1
    waits: list[float] = []

    async def asleep(seconds: float) -> None:
        waits.append(seconds)

    env = {**os.environ, "FLUID_LLM_TRANSPORT": "aiohttp" if transport == "aiohttp" else "httpx"}
    client = LLMClient(
        "openai",
        "gpt-4o-mini",
        api_key=KEY,
        base_url=f"{base}/v1",
        deadline=20.0,
        envelope=RetryEnvelope.from_env(env, sleep=waits.append, asleep=asleep),
        env=env,
    )
    if mode == "call":
        if transport == "aiohttp":
            result = _outcome(lambda: asyncio.run(client.acomplete("hi")))
        else:
            result = _outcome(lambda: client.complete("hi"))
        result.update(health=client.health(), waits=waits)
        client.close()
        print(json.dumps(result, default=str), flush=True)
        return 0

    results: list[dict[str, Any]] = [{} for _ in range(calls)]
    if transport == "aiohttp":
        loop = asyncio.new_event_loop()

        async def one(i: int) -> None:
            try:
                done = await client.acomplete("hi")
            except Exception as exc:  # the outcome, told as the sync calls tell theirs
                failed = exc
                results[i] = _outcome(lambda: _raise(failed))
            else:
                results[i] = _outcome(lambda: done)

        async def every() -> None:
            await asyncio.gather(*(one(i) for i in range(calls)))

        def run_loop() -> None:
            loop.run_until_complete(every())
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

        workers = [threading.Thread(target=run_loop)]
    else:

        def run_one(i: int) -> None:
            results[i] = _outcome(lambda: client.complete("hi"))

        workers = [threading.Thread(target=run_one, args=(i,)) for i in range(calls)]
    for worker in workers:
        worker.start()
    print("ready", flush=True)
    if not sys.stdin.readline():
        return 3  # the test went away before saying close
    client.close()  # from this thread, while every call waits on the server
    for worker in workers:
        worker.join(timeout=30)
    print(json.dumps({"results": results, "waits": waits}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
