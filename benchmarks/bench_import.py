"""Cold import time: fluid_build's LLM layer against the openai SDK (and litellm).

Each figure is the median of 7 fresh interpreters (``--quick``: 3), the
statements interleaved run by run and each ratio the median of the
run-by-run ratios, each interpreter timing one statement with
``time.perf_counter`` around it, so interpreter start-up is not counted; one
discarded run first writes any bytecode caches, so "cold" means a new
process with a warm disk cache, as a CLI starts. Each row also gives the
modules the statement loaded. Target: ``from
fluid_build.copilot import LLMClient`` and ``from fluid_build import
LLMClient`` (plus a first attribute access) at most 1.5x ``import httpx``
(which they include) and below ``from openai import OpenAI``, measured in
the same run.

A peer that is not importable here is measured with the first interpreter
given by ``--extra-python`` that has it (``nox -s bench`` installs every
peer in one environment: litellm 1.110 accepts openai 3.x); if none has
it, its row says so.

    python benchmarks/bench_import.py [--quick] [--json PATH] [--extra-python PYTHON]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

TARGET_RATIO = 1.0  # fluid_build's LLMClient import below the openai SDK's client import
BASELINE = "openai-client"
HTTPX_TARGET = 1.5  # and at most 1.5x `import httpx` (which it includes)
HTTPX = "httpx"
JUDGED = ("fluid-llmclient", "fluid-root-llmclient")

# Import, a client and its first answer over an in-process transport: what a
# short-lived process pays before its first result (the client's call path,
# pydantic among it, loads with the first client, not with the import).
_ANSWER = (
    '{"id":"x","model":"m","choices":[{"index":0,"finish_reason":"stop",'
    '"message":{"role":"assistant","content":"hi"}}],'
    '"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}'
)
_MOCK = (
    "import httpx; "
    f"mock = httpx.MockTransport(lambda request: httpx.Response(200, text={_ANSWER!r}))\n"
)
FIRST_HTTPX = (
    _MOCK + "httpx.Client(transport=mock).post('http://127.0.0.1:9/v1/chat/completions', "
    "json={'model': 'm', 'messages': [{'role': 'user', 'content': 'hi'}]}).json()"
)
FIRST_FLUID = (
    _MOCK + "from fluid_build.copilot import LLMClient\n"
    "LLMClient('vllm', 'm', base_url='http://127.0.0.1:9/v1', "
    "http_client=httpx.Client(transport=mock), "
    "capability_matrix={'context_window': 32768}).complete('hi')"
)

LABELS = {
    "first-httpx": "`import httpx`, a client, its first answer (MockTransport)",
    "first-fluid": "`from fluid_build.copilot import LLMClient`, a client, its first answer",
}

# (key, statement, distribution whose version is shown, module that must be importable)
TARGETS: tuple[tuple[str, str, str, str], ...] = (
    ("httpx", "import httpx", "httpx", "httpx"),
    ("pydantic", "import pydantic", "pydantic", "pydantic"),
    ("fluid-copilot", "import fluid_build.copilot", "fluid-build", "fluid_build"),
    (
        "fluid-llmclient",
        "from fluid_build.copilot import LLMClient; LLMClient.complete",
        "fluid-build",
        "fluid_build",
    ),
    (
        "fluid-root-llmclient",
        "from fluid_build import LLMClient; LLMClient.complete",
        "fluid-build",
        "fluid_build",
    ),
    ("first-httpx", FIRST_HTTPX, "httpx", "httpx"),
    ("first-fluid", FIRST_FLUID, "fluid-build", "fluid_build"),
    ("openai", "import openai", "openai", "openai"),
    ("openai-client", "from openai import OpenAI; OpenAI.chat", "openai", "openai"),
    ("litellm", "import litellm", "litellm", "litellm"),
)
CONTEXT = {"httpx", "pydantic", "first-httpx", "first-fluid"}  # shown for scale, not judged

# Runs in the fresh interpreter: time the statement, count the modules it loaded.
PROBE = """
import sys, time
before = len(sys.modules)
started = time.perf_counter()
exec(compile(sys.argv[1], "<bench>", "exec"), {})
elapsed = time.perf_counter() - started
print(elapsed, len(sys.modules) - before)
"""

VERSION = """
import sys
from importlib.metadata import version
from importlib.util import find_spec
try:
    found = find_spec(sys.argv[2]) is not None
except Exception:
    found = False
print(version(sys.argv[1]) if found else "")
"""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    for name in ("PYTHONPROFILEIMPORTTIME", "PYTHONDONTWRITEBYTECODE", "PYTHONSTARTUP"):
        env.pop(name, None)
    return env


def installed(python: str, dist: str, module: str) -> str | None:
    """The distribution's version if ``module`` is importable by ``python``."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        done = subprocess.run(  # noqa: S603 - an interpreter the caller named
            [python, "-c", VERSION, dist, module],
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
            env=_env(),
        )
        if done.returncode == 0 and done.stdout.strip():
            return done.stdout.strip()
    return None


def time_import(python: str, statement: str) -> tuple[float, int]:
    """Seconds for ``statement`` in one fresh interpreter, and the modules it loaded."""
    done = subprocess.run(  # noqa: S603 - an interpreter the caller named
        [python, "-c", PROBE, statement],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
        env=_env(),
    )
    if done.returncode != 0:
        raise RuntimeError(f"{statement!r} failed under {python}:\n{done.stderr[-2000:]}")
    elapsed, loaded = done.stdout.split()
    return float(elapsed), int(loaded)


def heaviest(python: str, statement: str, top: int) -> list[tuple[str, float]]:
    """The ``top`` top-level packages by summed ``-X importtime`` self time (ms), one run."""
    done = subprocess.run(  # noqa: S603 - an interpreter the caller named
        [python, "-X", "importtime", "-c", statement],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
        env=_env(),
    )
    totals: dict[str, float] = {}
    for line in done.stderr.splitlines():
        parts = line.removeprefix("import time:").split("|")
        if not line.startswith("import time:") or len(parts) != 3 or not parts[0].strip().isdigit():
            continue
        root = parts[2].strip().split(".")[0]
        totals[root] = totals.get(root, 0.0) + int(parts[0]) / 1000
    return sorted(totals.items(), key=lambda item: -item[1])[:top]


def machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.partition(":")[2].strip()
                break
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "os": platform.platform(),
        "date": datetime.date.today().isoformat(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 interpreters a row, not 7")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--no-fail", action="store_true", help="exit 0 even if a target is missed")
    parser.add_argument(
        "--extra-python",
        metavar="PYTHON",
        action="append",
        default=[],
        help="another interpreter for a peer not importable here (repeatable)",
    )
    args = parser.parse_args()
    runs = 3 if args.quick else 7
    pythons = [sys.executable, *args.extra_python]

    rows: list[dict[str, Any]] = []
    for key, statement, dist, module in TARGETS:
        where = next(
            ((python, v) for python in pythons if (v := installed(python, dist, module))), None
        )
        if where is None:
            rows.append(
                {"key": key, "statement": statement, "dist": dist, "skipped": "not installed"}
            )
            continue
        python, version = where
        time_import(python, statement)  # discarded: it may write bytecode caches
        rows.append(
            {
                "key": key,
                "statement": statement,
                "dist": dist,
                "version": version,
                "python": python,
                "ms_runs": [],
            }
        )
    timed = [row for row in rows if "skipped" not in row]
    for _ in range(runs):  # interleaved: a busy spell falls on every statement alike
        for row in timed:
            elapsed, row["modules"] = time_import(row["python"], row["statement"])
            row["ms_runs"].append(elapsed * 1000)
    for row in timed:
        row["ms"] = statistics.median(row["ms_runs"])

    def ratios(key: str, name: str) -> None:
        # The median of run-by-run ratios to the baseline's run beside it.
        base = next((r for r in timed if r["key"] == key), None)
        for row in timed if base is not None else ():
            pairs = zip(row["ms_runs"], base["ms_runs"], strict=True)
            row[name] = statistics.median(t / b for t, b in pairs)

    ratios(BASELINE, "ratio")
    ratios(HTTPX, "ratio_httpx")
    base = next((r for r in timed if r["key"] == BASELINE), None)

    info = machine()
    print(
        f"machine: {info['cores']} cores, {info['cpu']}, {info['python']}, {info['os']}; "
        f"{info['date']}"
    )
    print()
    print(
        f"Cold import, median of {runs} fresh interpreters (start-up not counted); ratio to "
        "`from openai import OpenAI`:"
    )
    print()
    print(
        "| statement | version | import (ms) | modules loaded | ratio to openai client "
        "| ratio to `import httpx` | target |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: | --- |")
    missed: list[str] = []
    for row in rows:
        statement = LABELS.get(row["key"], f"`{row['statement']}`")
        if "skipped" in row:
            print(f"| {statement} | {row['skipped']} here | | | | | |")
            continue
        ratio = f"{row['ratio']:.2f}x" if "ratio" in row else "n/a"
        to_httpx = f"{row['ratio_httpx']:.2f}x" if "ratio_httpx" in row else "n/a"
        verdict = "for scale" if row["key"] in CONTEXT else ""
        if row["key"] == BASELINE:
            verdict = "baseline"
        elif row["key"] in JUDGED:
            verdicts = []
            if "ratio_httpx" in row:
                ok = row["ratio_httpx"] <= HTTPX_TARGET
                verdicts.append(f"<= {HTTPX_TARGET:.1f}x httpx: {'met' if ok else 'MISSED'}")
                if not ok:
                    missed.append(f"`{row['statement']}` {row['ratio_httpx']:.2f}x `import httpx`")
            if base is None:
                verdicts.append("n/a (openai not installed)")
            else:
                ok = row["ratio"] < TARGET_RATIO
                verdicts.append(f"< openai client: {'met' if ok else 'MISSED'}")
                if not ok:
                    missed.append(f"`{row['statement']}` {row['ratio']:.2f}x the openai client's")
            verdict = "; ".join(verdicts)
        if row["python"] != sys.executable:
            verdict = (verdict + "; " if verdict else "") + "own environment"
        print(
            f"| {statement} | {row['dist']} {row['version']} | {row['ms']:.1f} | "
            f"{row['modules']:,} | {ratio} | {to_httpx} | {verdict} |"
        )
    fluid = next((r for r in rows if r["key"] == "fluid-llmclient" and "ms" in r), None)
    if fluid is not None:
        top = heaviest(fluid["python"], fluid["statement"], 6)
        fluid["heaviest"] = top
        print()
        print(
            "Where `from fluid_build.copilot import LLMClient` spends it (-X importtime, "
            "self time by package, one run): "
            + ", ".join(f"{name} {ms:.1f} ms" for name, ms in top)
        )
    first = {r["key"]: r for r in timed if r["key"] in {"first-httpx", "first-fluid"}}
    if len(first) == 2:
        pairs = zip(first["first-fluid"]["ms_runs"], first["first-httpx"]["ms_runs"], strict=True)
        first["first-fluid"]["ratio_first"] = statistics.median(f / h for f, h in pairs)
        print()
        print(
            "Import, a client and its first answer over httpx.MockTransport: "
            f"httpx {first['first-httpx']['ms']:.1f} ms, LLMClient {first['first-fluid']['ms']:.1f}"
            f" ms ({first['first-fluid']['ratio_first']:.2f}x; reported, not judged)"
        )
    print()
    if args.json:
        results = {
            "machine": info,
            "runs": runs,
            "target": TARGET_RATIO,
            "target_httpx": HTTPX_TARGET,
            "rows": rows,
        }
        results["missed"] = missed
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    if missed:
        print("over target: " + "; ".join(missed))
        return 0 if args.no_fail else 1
    if base is not None:
        print(
            f"fluid_build's LLMClient imports within {HTTPX_TARGET:.1f}x `import httpx` and "
            "faster than the openai SDK's client"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
