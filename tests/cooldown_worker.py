"""One worker process of the multi-process cooldown tests.

Usage: python -m tests.cooldown_worker BASE_URL STORE_URL WORKER_ID
   or: python -m tests.cooldown_worker call BASE_URL MODEL [CALLS]

The first form sends calls on one key through the envelope until the server
answers with ``x-done: 1`` (or 20 s pass), then exits 0.

The second makes CALLS (default 1) ``LLMClient.complete`` calls to the vllm
server at BASE_URL, configured from the environment exactly as a run is (the
store, ``FLUID_RATE_LIMITS``, the deadline), and prints one JSON line per call:
its outcome (``ok`` or the error's code), ``retry_after`` and ``details``.
"""

from __future__ import annotations

import json
import os
import sys
import time

import httpx

from fluid_build.copilot.call.envelope import RetryEnvelope, RetryPolicy
from fluid_build.copilot.health.cooldown import CooldownKey, cooldown_store_from_url

KEY = CooldownKey.for_call("openai", "sk-proj-shared-key-for-all-workers", "gpt-4o")


def main(base: str, store_url: str, worker: str) -> int:
    envelope = RetryEnvelope(
        RetryPolicy(attempts=5), cooldown=cooldown_store_from_url(store_url), hook=lambda e: None
    )
    done = False
    with httpx.Client(timeout=10.0) as client:

        def send() -> None:
            nonlocal done
            response = client.post(
                f"{base}/v1/chat/completions", json={}, headers={"x-worker": worker}
            )
            response.raise_for_status()
            done = response.headers.get("x-done") == "1"

        give_up_at = time.monotonic() + 20
        while not done and time.monotonic() < give_up_at:
            envelope.call(send, key=KEY, provider="openai", model="gpt-4o")
    return 0 if done else 1


def call(base: str, model: str, calls: str = "1") -> int:
    from fluid_build.copilot import LLMClient
    from fluid_build.copilot.agents.errors import AgentExecutionError

    with LLMClient("vllm", model, base_url=f"{base}/v1", env=os.environ) as client:
        for _ in range(int(calls)):
            record: dict[str, object]
            try:
                client.complete("hi")
            except AgentExecutionError as error:
                record = {
                    "outcome": error.code,
                    "retry_after": error.retry_after,
                    "details": error.details,
                    "message": str(error),
                }
            else:
                record = {"outcome": "ok"}
            print(json.dumps(record, default=str), flush=True)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["call"]:
        raise SystemExit(call(*sys.argv[2:5]))
    raise SystemExit(main(*sys.argv[1:4]))
