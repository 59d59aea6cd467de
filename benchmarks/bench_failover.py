"""Time to an answer when a route fails: fluid_build's chain against the openai SDK's retries.

For each fault, a fresh loopback fault server (tests/chaos_server.py) serves two
models: ``primary``, which fails in that one way, and ``healthy``, which always
answers. Against it, in the same run:

* fluid_build: ``LLMClient("openai", "primary", fallbacks=[Fallback("openai",
  "healthy", ...)], base_url=<loopback>)``, its defaults (3 attempts, backoff
  1 s then 2 s, the default sqlite store and breaker in a scratch cache, a
  Retry-After over 10 s moves on at once, a route that said nothing is not
  asked again) except tight limits for one attempt: the per-read timeout and
  the connect, first-token and idle limits printed with the table; the
  fallback entry has the same limits. For the cut stream, also with
  ``on_cut="restart"`` (the default is ``"raise"``);
* the openai SDK with its own retries, ``openai.OpenAI(base_url=..., max_retries=2,
  timeout=<the same per-read timeout>)`` on the primary model: it has no
  fallback, so it shows what a single-route client gets.

Each figure is the time from the call to its whole answer (a stream: the last
event) or to the final error, and the requests each model received, counted at
the server. Every run has its own server (its own port, so its own breaker and
cooldown keys), client and store; each library answers once before the first
timed run, so that no import is timed. Two runs over the whole plan (``--runs``;
``--quick``: one); each time is the median, with the fastest and slowest run.
The waits the faults cause are real (Retry-After 1 s, ``--quick``: 0.2 s), so
figures are seconds, not microseconds; the whole run takes about 90 s.

    python benchmarks/bench_failover.py [--quick] [--json PATH] [--clients fluid,openai] [--runs N]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import logging
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the fault server lives with the tests
    sys.path.insert(0, str(ROOT))

from tests.chaos_server import ChaosServer, chaos_server, stream_text  # noqa: E402

API_KEY = "sk-bench"
PRIMARY = "primary"
HEALTHY = "healthy"
PROMPT = "Say hello in one word."
CLIENTS = ("fluid", "openai")


@dataclass(frozen=True)
class Timings:
    """The waits a run's faults ask for and the limits the clients are given, in seconds."""

    retry_after: float  # what every 429 asks for
    timeout: float  # per read, both clients (openai: timeout=; fluid: timeout=)
    connect: float  # fluid's connect limit
    first_token: float  # fluid's first-token limit
    idle: float  # fluid's idle limit
    thinking: float  # how long the slow primary takes to its first token


FULL = Timings(retry_after=1.0, timeout=5.0, connect=1.0, first_token=2.0, idle=2.0, thinking=3.0)
QUICK = Timings(retry_after=0.2, timeout=1.0, connect=0.5, first_token=0.3, idle=0.3, thinking=0.6)


@dataclass(frozen=True)
class Fault:
    """One way the primary fails: its faults in turn (the last for good), and how it is
    asked (a stream or not)."""

    name: str
    label: str
    faults: tuple[str, ...]
    stream: bool = False


FAULTS: tuple[Fault, ...] = (
    Fault("429_once", "429 with Retry-After, once", ("429_retry_after", "ok")),
    Fault("429_persistent", "429 with Retry-After, persistent", ("429_retry_after",)),
    Fault("500_once", "500, once", ("500", "ok")),
    Fault("503_persistent", "503, persistent", ("503",)),
    Fault("reset", "connection reset before the head, persistent", ("reset_before_response",)),
    Fault("no_answer", "no answer at all (connection open, silent)", ("slow_headers",)),
    Fault("slow_first_token", "slow first token", ("slow_first_token",)),
    Fault("cut_stream", "stream cut mid-answer (streamed), persistent", ("cut_mid_stream",), True),
    Fault("context_overflow", "context overflow (400)", ("context_overflow",)),
)


@dataclass
class Row:
    fault: str
    label: str
    client: str
    outcome: str  # "answer" or "error"
    answered_by: str | None  # the model that answered
    detail: str  # the error's code or class, or what else the caller saw
    primary: int  # requests the primary model received
    fallback: int  # requests the healthy model received
    seconds: float  # the median of the runs
    spread: tuple[float, float] | None = None  # the fastest and slowest run, when several


# -- the clients ------------------------------------------------------------------------------


def fluid_client(
    url: str,
    timings: Timings,
    cache: Path,
    *,
    on_cut: Literal["raise", "restart"] = "raise",
    clock: Mapping[str, Any] | None = None,
) -> Any:
    """The chain under test; ``clock``: the envelope's ``sleep``, ``clock`` and ``wall`` (a
    test's, which waits without sleeping; the figures are then not times)."""
    from fluid_build import Fallback, LLMClient
    from fluid_build.copilot.call.envelope import RetryEnvelope

    env = {"XDG_CACHE_HOME": str(cache)}  # the default sqlite store, in a scratch cache
    fallback = Fallback(
        "openai",
        HEALTHY,
        base_url=url,
        api_key=API_KEY,
        timeout=timings.timeout,
        connect_timeout=timings.connect,
        first_token_timeout=timings.first_token,
        idle_timeout=timings.idle,
    )
    return LLMClient(
        "openai",
        PRIMARY,
        API_KEY,
        url,
        fallbacks=[fallback],
        envelope=RetryEnvelope.from_env(env, **(clock or {})),
        env=env,
        on_cut=on_cut,
        timeout=timings.timeout,
        connect_timeout=timings.connect,
        first_token_timeout=timings.first_token,
        idle_timeout=timings.idle,
    )


def run_fluid(client: Any, stream: bool) -> tuple[str, str | None, str]:
    """(outcome, the model that answered, detail) of one call through the chain."""
    from fluid_build.copilot.agents.errors import AgentExecutionError

    try:
        if not stream:
            completion = client.complete(PROMPT)
            whole = '"answer": "ok"' in completion.text
            return _answer(completion.model, whole, completion.answered_by)
        text, restarts, completion = "", 0, None
        for event in client.stream(PROMPT):
            if event.type == "text":
                text += event.text
            elif event.type == "restart":  # the text so far is void
                text, restarts = "", restarts + 1
            elif event.type == "done":
                completion = event.completion
        assert completion is not None
        whole = text == stream_text(completion.model)
        note = f", after {restarts} restart" if restarts else ""
        return _answer(completion.model, whole, (completion.answered_by or "") + note)
    except AgentExecutionError as error:
        partial = error.details.get("partial_text")  # a stream cut after text reached us
        return "error", None, error.code + (" (after part of the text)" if partial else "")


def _answer(model: str, whole: bool, detail: str | None) -> tuple[str, str | None, str]:
    # A truncated answer presented as whole would be the worst outcome: say so.
    return ("answer" if whole else "TRUNCATED answer"), model, detail or ""


def openai_client(url: str, timings: Timings) -> Any:
    import openai

    return openai.OpenAI(api_key=API_KEY, base_url=url, max_retries=2, timeout=timings.timeout)


def run_openai(sdk: Any, stream: bool) -> tuple[str, str | None, str]:
    messages: Any = [{"role": "user", "content": PROMPT}]
    try:
        if not stream:
            answer = sdk.chat.completions.create(model=PRIMARY, messages=messages)
            text = answer.choices[0].message.content or ""
            return _answer(answer.model, '"answer": "ok"' in text, "")
        text, model = "", PRIMARY
        for chunk in sdk.chat.completions.create(model=PRIMARY, messages=messages, stream=True):
            model = chunk.model or model
            for choice in chunk.choices:
                text += choice.delta.content or ""
        return _answer(model, text == stream_text(model), "")
    except Exception as error:  # noqa: BLE001 - whatever the SDK raises is the outcome
        status = getattr(error, "status_code", None)
        detail = type(error).__name__ + (f" {status}" if status else "")
        return "error", None, detail + (" (after part of the text)" if stream and text else "")


# -- one run ----------------------------------------------------------------------------------


@contextlib.contextmanager
def fault_server(fault: Fault, timings: Timings) -> Iterator[ChaosServer]:
    # ``stall``: the silent primary holds until the client hangs up; ``slow``: how long
    # the slow one thinks before its first token.
    with chaos_server(
        models={PRIMARY: list(fault.faults), HEALTHY: "ok"},
        retry_after=timings.retry_after,
        stall=120.0,
        slow=timings.thinking,
        name=fault.name,
    ) as server:
        yield server


def measure(
    fault: Fault,
    client: str,
    timings: Timings,
    cache: Path,
    *,
    clock: Mapping[str, Any] | None = None,
) -> Row:
    """One call of ``client`` against a fresh server failing with ``fault``."""
    with fault_server(fault, timings) as server:
        if client == "openai":
            sdk = openai_client(server.base_url, timings)
            try:
                start = time.perf_counter()
                outcome, model, detail = run_openai(sdk, fault.stream)
                seconds = time.perf_counter() - start
            finally:
                sdk.close()
        else:
            on_cut: Literal["raise", "restart"] = (
                "restart" if client == "fluid-restart" else "raise"
            )
            llm = fluid_client(server.base_url, timings, cache, on_cut=on_cut, clock=clock)
            try:
                start = time.perf_counter()
                outcome, model, detail = run_fluid(llm, fault.stream)
                seconds = time.perf_counter() - start
            finally:
                llm.close()
        seen = server.snapshot()
        if server.errors:
            raise RuntimeError(f"the fault server failed: {server.errors!r}")
    return Row(
        fault=fault.name,
        label=fault.label,
        client=client,
        outcome=outcome,
        answered_by=model,
        detail=detail,
        primary=sum(r.model == PRIMARY for r in seen),
        fallback=sum(r.model == HEALTHY for r in seen),
        seconds=seconds,
    )


def warm_up(clients: Sequence[str], timings: Timings, cache: Path) -> None:
    """One answer per library first: the timed runs do not pay for its imports."""
    with chaos_server(models={PRIMARY: "ok", HEALTHY: "ok"}, name="warm-up") as server:
        for client in clients:
            if client == "openai":
                sdk = openai_client(server.base_url, timings)
                with contextlib.closing(sdk):
                    run_openai(sdk, False)
                    run_openai(sdk, True)
            else:
                llm = fluid_client(server.base_url, timings, cache)
                with contextlib.closing(llm):
                    run_fluid(llm, False)
                    run_fluid(llm, True)


def run_all(
    clients: Sequence[str],
    timings: Timings,
    *,
    runs: int = 1,
    faults: Sequence[Fault] = FAULTS,
    clock: Mapping[str, Any] | None = None,
) -> list[Row]:
    """Every fault against every client, ``runs`` times over the whole plan; the median time.

    Outcomes and request counts must agree between runs (they are the point);
    a disagreement is reported in ``detail``.
    """
    plan = []
    for fault in faults:
        variants = list(clients)
        if fault.stream and "fluid" in clients:
            variants.insert(variants.index("fluid") + 1, "fluid-restart")
        plan += [(fault, client) for client in variants]
    seen: dict[tuple[str, str], list[Row]] = {(f.name, c): [] for f, c in plan}
    with tempfile.TemporaryDirectory(prefix="bench-failover-") as tmp:
        warm_up(clients, timings, Path(tmp) / "warm-up")
        # Run by run over the whole plan, so that load from other processes falls alike.
        for i in range(runs):
            for fault, client in plan:
                cache = Path(tmp) / f"{fault.name}-{client}-{i}"
                seen[fault.name, client].append(measure(fault, client, timings, cache, clock=clock))
    rows = []
    for fault, client in plan:
        mine = seen[fault.name, client]
        row = mine[0]
        row.seconds = statistics.median(r.seconds for r in mine)
        if runs > 1:
            row.spread = (min(r.seconds for r in mine), max(r.seconds for r in mine))
        shapes = {(r.outcome, r.answered_by, r.primary, r.fallback) for r in mine}
        if len(shapes) > 1:
            row.detail += f" (runs differ: {sorted(shapes, key=str)})"
        rows.append(row)
    return rows


# -- the report -------------------------------------------------------------------------------

CLIENT_LABELS = {
    "fluid": "fluid_build (chain)",
    "fluid-restart": 'fluid_build (chain, on_cut="restart")',
    "openai": "openai SDK (max_retries=2)",
}


def table(rows: Sequence[Row]) -> str:
    lines = [
        "| fault | client | outcome | requests primary / fallback | time to answer or error (s) |",
        "| --- | --- | --- | ---: | ---: |",
    ]
    for row in rows:
        if row.outcome == "error":
            outcome = f"error: {row.detail}"
        else:
            outcome = f"{row.outcome} from `{row.answered_by}`"
            note = row.detail.removeprefix(f"openai:{row.answered_by}").lstrip(", ")
            if note:
                outcome += f" ({note})"
        spread = f" ({row.spread[0]:.2f}-{row.spread[1]:.2f})" if row.spread else ""
        lines.append(
            f"| {row.label} | {CLIENT_LABELS.get(row.client, row.client)} | {outcome} | "
            f"{row.primary} / {row.fallback} | {row.seconds:.2f}{spread} |"
        )
    return "\n".join(lines)


def summary(rows: Sequence[Row]) -> list[str]:
    """Per client, the faults that ended in a whole answer, and the time all of them took."""
    lines = []
    for client in dict.fromkeys(r.client for r in rows if r.client != "fluid-restart"):
        mine = [r for r in rows if r.client == client]
        answered = sum(r.outcome == "answer" for r in mine)
        line = (
            f"{CLIENT_LABELS.get(client, client)}: {answered} of {len(mine)} faults answered, "
            f"{sum(r.seconds for r in mine):.1f} s in all"
        )
        if client == "fluid":  # with the cut stream's restart in place of its error
            restarted = {r.fault: r for r in rows if r.client == "fluid-restart"}
            mine = [restarted.get(r.fault, r) for r in mine]
            answered = sum(r.outcome == "answer" for r in mine)
            line += f' ({answered} of {len(mine)} with on_cut="restart")'
        lines.append(line)
    return lines


def settings(timings: Timings) -> str:
    return (
        f"Retry-After on every 429: {timings.retry_after:g} s; per-read timeout (both clients): "
        f"{timings.timeout:g} s; fluid's phase limits: connect {timings.connect:g} s, first "
        f"token {timings.first_token:g} s, idle {timings.idle:g} s; the slow primary's first "
        f"token after {timings.thinking:g} s; the silent primary holds the connection until "
        "the client hangs up. fluid_build otherwise at its defaults (3 attempts, backoff 1 s "
        "then 2 s, move on past a Retry-After over 10 s, default sqlite store and breaker); "
        "the openai SDK at max_retries=2, no fallback (its fallback count is always 0)."
    )


def machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.partition(":")[2].strip()
                break
    commit = None
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],  # noqa: S607 - the checkout's own git
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "os": platform.platform(),
        "date": datetime.date.today().isoformat(),
        "commit": commit,
    }


def openai_version() -> str | None:
    try:
        from importlib.metadata import version

        import openai  # noqa: F401 - importable, not only installed
    except ImportError:
        return None
    return version("openai")


def main(argv: Sequence[str] | None = None, *, clock: Mapping[str, Any] | None = None) -> int:
    """The benchmark; ``clock``: fluid_build's waits without sleeping (tests only)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="shorter waits and limits (Retry-After 0.2 s)"
    )
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument(
        "--clients",
        default=",".join(CLIENTS),
        help="which clients to run, comma-separated (default: fluid,openai)",
    )
    parser.add_argument(
        "--runs", type=int, help="runs per fault and client, the median time (default 2; --quick 1)"
    )
    parser.add_argument(
        "--verbose", action="store_true", help="show fluid_build's log of retries and moves"
    )
    args = parser.parse_args(argv)

    clients = [c.strip() for c in args.clients.split(",") if c.strip()]
    unknown = set(clients) - set(CLIENTS)
    runs = args.runs if args.runs is not None else (1 if args.quick else 2)
    if unknown or not clients or runs < 1:
        parser.error(f"--clients takes {', '.join(CLIENTS)}; --runs at least 1")
    timings = QUICK if args.quick else FULL
    sdk = openai_version()
    notes = []
    if "openai" in clients and sdk is None:
        clients.remove("openai")
        notes.append("openai SDK not installed: its rows are skipped (pip install 'openai>=3')")
    if not clients:
        print("\n".join(notes))
        return 0
    info = machine()
    started = time.perf_counter()
    log = logging.getLogger("fluid_build")
    level = log.level
    if not args.verbose:  # the table says what happened; the log would bury it
        log.setLevel(logging.ERROR)
    try:
        rows = run_all(clients, timings, runs=runs, clock=clock)
    finally:
        log.setLevel(level)
    wall = time.perf_counter() - started
    print(
        f"machine: {info['cores']} cores, {info['cpu']}, {info['python']}, {info['os']}; "
        f"{info['date']}; commit {info['commit']}; openai {sdk or 'not installed'}"
    )
    for note in notes:
        print(f"note: {note}")
    print()
    print(settings(timings))
    print()
    print(table(rows))
    print()
    for line in summary(rows):
        print(line)
    print(f"({runs} run{'s' if runs > 1 else ''} per row, {wall:.0f} s wall)")
    if args.json:
        results = {
            "machine": info,
            "openai": sdk,
            "timings": asdict(timings),
            "runs": runs,
            "notes": notes,
            "rows": [asdict(row) for row in rows],
        }
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
