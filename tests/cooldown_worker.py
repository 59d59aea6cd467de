"""One worker process of the multi-process cooldown test.

Usage: python -m tests.cooldown_worker BASE_URL STORE_URL WORKER_ID

Sends calls on one key through the envelope until the server answers with
``x-done: 1`` (or 20 s pass), then exits 0.
"""

from __future__ import annotations

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


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:4]))
