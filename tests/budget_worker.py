"""One worker process of the shared-budget tests (tests/test_budget.py).

Usage: python -m tests.budget_worker MODE BASE_URL OUT_FILE

MODE:
  calls  15 calls through ``LLMClient(budget="team")``, as a user makes them: each
         attempt reserves its worst case (the prompt the pre-flight counts, plus
         ``max_output_tokens``, priced) and settles the price the answer's usage
         says; one JSON line per call in OUT_FILE
  hold   one call through the same client to a server that never answers: the
         test kills the process while the call holds its reservation
  ledger the budget ledger of the store, driven a line at a time on stdin:
         ``AMOUNT HOLD`` reserves AMOUNT micro-USD of "team" and settles it whole,
         printing ``granted`` or ``refused`` and the spend it saw

The store (FLUID_COOLDOWN_URL, or the sqlite file under XDG_CACHE_HOME) and the
budget (FLUID_BUDGETS) come from the environment, as a client reads them. The
worker prints ``ready`` once built and waits for one line on stdin, so that the
test starts every worker's calls at the same instant.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from fluid_build.copilot.agents.errors import AgentExecutionError
from fluid_build.copilot.client import LLMClient

#: USD per million tokens: a call's answer (1000 in, 300 out) costs 0.0016 USD.
PRICES = {"m": {"input": 1.0, "output": 2.0}}
CALLS = 15
#: About 1,000 tokens, so that the worst case reserved covers what the answer says.
PROMPT = "word " * 1_000
MAX_OUTPUT = 500


def ledger() -> int:
    import time

    from fluid_build.copilot.health.budget import budgets_from_env, ledger_for
    from fluid_build.copilot.health.cooldown import cooldown_store_from_env

    book = ledger_for(cooldown_store_from_env())
    assert book is not None
    spec = budgets_from_env()["team"]
    print("ready", flush=True)
    for line in sys.stdin:
        amount, hold = line.split()
        now = time.time()
        done = book.reserve(spec, int(amount), hold, now + 60, now)
        if done.granted:
            book.settle("team", hold, int(amount), now)
        print("granted" if done.granted else "refused", done.state.spent, flush=True)
    return 0


def main(argv: list[str]) -> int:
    mode, base_url, out_path = argv
    if mode == "ledger":
        return ledger()
    # BUDGET_WORKER_PRICE: another price for "m" (JSON), as a fleet of dearer calls needs.
    prices = json.loads(os.environ.get("BUDGET_WORKER_PRICE") or "null") or PRICES
    deadline = float(os.environ.get("BUDGET_WORKER_DEADLINE") or (5.0 if mode == "hold" else 30.0))
    client = LLMClient(
        "openai_compatible",
        "m",
        base_url=base_url + "/v1",
        prices=prices,
        budget="team",
        deadline=deadline,
        # Its window given: the client does not ask the server for it, so the one
        # connection a call makes is its request (the hold test waits for exactly that).
        capability_matrix={"context_window": 32_768},
    )
    if os.environ.get("BUDGET_WORKER_MARGIN") and client.budget is not None:
        # How long past its deadline a hold outlives a process killed holding it.
        client.budget.margin = float(os.environ["BUDGET_WORKER_MARGIN"])
    print("ready", flush=True)
    sys.stdin.readline()
    with client, open(out_path, "w") as out:
        for _ in range(1 if mode == "hold" else CALLS):
            record: dict[str, Any]
            began = time.monotonic()
            try:
                done = client.complete(
                    [{"role": "user", "content": PROMPT}], max_output_tokens=MAX_OUTPUT
                )
            except AgentExecutionError as error:
                record = {"outcome": error.code, "message": error.message}
            else:
                record = {"outcome": "ok", "cost_usd": done.cost_usd}
            record["seconds"] = time.monotonic() - began
            out.write(json.dumps(record) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
