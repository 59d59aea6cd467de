"""One worker process of the shared-budget tests (tests/test_budget.py).

Usage: python -m tests.budget_worker MODE BASE_URL OUT_FILE

MODE:
  calls  15 calls through the retry envelope under budget ``team``, each reserving
         its worst case and settling the price the server's usage says; one JSON
         line per call in OUT_FILE
  hold   reserve one call's worst case, print ``held``, and wait to be killed

The store (FLUID_COOLDOWN_URL, or the sqlite file under XDG_CACHE_HOME) and the
budget (FLUID_BUDGETS) come from the environment, as a client reads them. The
worker prints ``ready`` once built and waits for one line on stdin, so that the
test starts every worker's calls at the same instant.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import httpx

from fluid_build.copilot.agents.errors import AgentExecutionError
from fluid_build.copilot.call.envelope import RetryEnvelope, RetryPolicy
from fluid_build.copilot.call.prices import ModelPrice
from fluid_build.copilot.health.budget import BudgetGuard
from fluid_build.copilot.llm.base import Parsed
from fluid_build.copilot.llm.types import Usage

#: USD per million tokens: a call's worst case (1000 in, 500 out) is 0.002 USD.
PRICES = {"m": ModelPrice(input=1.0, output=2.0)}
CALLS = 15


def _answer(client: httpx.Client, base_url: str) -> tuple[Parsed, httpx.Response]:
    response = client.post(base_url + "/v1/chat/completions", json={"model": "m"})
    response.raise_for_status()
    usage = response.json()["usage"]
    parsed = Parsed(
        text="ok",
        usage=Usage(input_tokens=usage["prompt_tokens"], output_tokens=usage["completion_tokens"]),
        model="m",
    )
    return parsed, response


def main(argv: list[str]) -> int:
    mode, base_url, out_path = argv
    envelope = RetryEnvelope.from_env(policy=RetryPolicy(attempts=1))
    guard = BudgetGuard.from_env("team", envelope.cooldown, prices=PRICES)
    assert guard is not None
    print("ready", flush=True)
    sys.stdin.readline()
    if mode == "hold":
        spend = guard.spend("openai_compatible", "m", 1_000, 500, deadline=5.0)
        hold = spend.reserve()
        print("held", json.dumps({"amount": None if hold is None else hold.amount}), flush=True)
        sys.stdin.readline()  # killed before this returns
        return 0
    with httpx.Client(timeout=10.0) as client, open(out_path, "w") as out:
        for _ in range(CALLS):
            spend = guard.spend("openai_compatible", "m", 1_000, 500, deadline=30.0)
            record: dict[str, Any]
            try:
                parsed, _ = envelope.call(lambda: _answer(client, base_url), spend=spend)
            except AgentExecutionError as error:
                record = {"outcome": error.code, "message": error.message}
            else:
                record = {"outcome": "ok", "output_tokens": parsed.usage.output_tokens}
            out.write(json.dumps(record) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
