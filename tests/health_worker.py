"""One worker process of the self-healing health tests (tests/test_health_processes.py).

Usage: python -m tests.health_worker MODE BASE_URL OUT_FILE [options]
   or: python -m tests.health_worker      (a warm worker: its role arrives on stdin)

MODE:
  calls   call ``LLMClient.complete`` in a loop until a stop condition; one JSON
          line per call in OUT_FILE, then one ``{"end": ...}`` line
  reset   ``LLMClient.reset_health()``; one JSON line with the health before and after

Options:
  --id NAME          sent as the ``x-worker`` header (the server sees who asked)
  --model M          the model name (default ``m``); part of the shared key
  --stop-on CODES    comma-separated outcomes that end the loop (``ok`` for a success)
  --max-seconds S    end the loop after S seconds whatever happened (default 20)
  --stop-file PATH   end the loop once PATH exists
  --poll S           pause between two calls (default 0.02)

A warm worker is started before its test knows what it will do, so that its
imports overlap with another test's waiting: it reads one JSON line
``{"argv": [MODE, BASE_URL, OUT_FILE, ...], "env": {...}}`` from stdin, makes
``env`` its whole environment, and goes on as if started with ``argv``.

The worker prints ``ready`` once it is built (imports done, store opened) and
waits for one line on stdin before its first call, so the test can start
several processes at the same instant. Everything else (the store, the breaker
and retry settings, ``XDG_CACHE_HOME``) comes from the environment, exactly as
``LLMClient`` reads it. Exit 0 when a stop condition was met, 2 when
``--max-seconds`` ran out first.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from fluid_build.copilot import LLMClient
from fluid_build.copilot.agents.errors import AgentExecutionError


def _write(out: Any, record: dict[str, Any]) -> None:
    out.write(json.dumps(record, default=str) + "\n")
    out.flush()


def _event(worker: str, t0: float, outcome: str) -> dict[str, Any]:
    return {"worker": worker, "pid": os.getpid(), "t0": t0, "t1": time.time(), "outcome": outcome}


def _error_event(worker: str, t0: float, error: AgentExecutionError) -> dict[str, Any]:
    record = _event(worker, t0, error.code)
    record.update(
        error=type(error).__name__,
        retry_after=error.retry_after,
        until=error.details.get("until"),
        trial_owner=error.details.get("trial_owner"),
        attempts=error.details.get("attempts"),
    )
    return record


def calls(client: LLMClient, out: Any, args: argparse.Namespace) -> int:
    stop_on = {code for code in (args.stop_on or "").split(",") if code}
    give_up_at = time.monotonic() + args.max_seconds
    stop_file = Path(args.stop_file) if args.stop_file else None
    code = 2
    while time.monotonic() < give_up_at:
        if stop_file is not None and stop_file.exists():
            code = 0
            break
        t0 = time.time()
        try:
            done = client.complete("hi")
        except AgentExecutionError as error:
            record = _error_event(args.id, t0, error)
        else:
            record = _event(args.id, t0, "ok")
            record.update(attempts=done.attempts, text=done.text)
        _write(out, record)
        if record["outcome"] in stop_on:
            code = 0
            break
        time.sleep(args.poll)  # noqa: real-sleep - a real process polling a real store
    _write(out, {"end": time.time(), "pid": os.getpid(), "health": client.health()})
    return code


def reset(client: LLMClient, out: Any, args: argparse.Namespace) -> int:
    before = client.health()
    t0 = time.time()
    client.reset_health()
    record = _event(args.id, t0, "reset")
    record.update(before=before, after=client.health())
    _write(out, record)
    return 0


def main(argv: list[str]) -> int:
    if not argv:  # a warm worker: its role and its environment arrive on stdin
        line = sys.stdin.readline()
        if not line:
            return 3  # the test went away before giving it a role
        config = json.loads(line)
        os.environ.clear()
        os.environ.update(config["env"])
        argv = list(config["argv"])
    parser = argparse.ArgumentParser(prog="python -m tests.health_worker")
    parser.add_argument("mode", choices=("calls", "reset"))
    parser.add_argument("base")
    parser.add_argument("out")
    parser.add_argument("--id", default=f"w{os.getpid()}")
    parser.add_argument("--model", default="m")
    parser.add_argument("--stop-on", default="")
    parser.add_argument("--max-seconds", type=float, default=20.0)
    parser.add_argument("--stop-file", default="")
    parser.add_argument("--poll", type=float, default=0.02)
    args = parser.parse_args(argv)

    with (
        httpx.Client(headers={"x-worker": args.id}, timeout=30.0) as http,
        LLMClient(
            "vllm", args.model, base_url=f"{args.base}/v1", http_client=http, env=os.environ
        ) as client,
        open(args.out, "a", encoding="utf-8") as out,
    ):
        client.health()  # opens the shared store before the go
        print("ready", flush=True)
        if not sys.stdin.readline():
            return 3  # the test went away before saying go
        run = calls if args.mode == "calls" else reset
        try:
            return run(client, out, args)
        finally:
            close = getattr(client.envelope.cooldown, "close", None)
            if callable(close):
                close()


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
