"""The transport conformance matrix: every scenario on every transport, as a markdown table.

The scenarios, transports and expected outcomes are tests/hostile.py's (the
ones tests/test_conformance.py asserts). Each row: the outcome code (``ok``
or the typed error's code), whether it is retryable, the requests the
server read, the elapsed seconds, the peak RSS growth during the call, and
whether the row keeps the contract; the ways a row breaks it follow the table.

    python benchmarks/conformance_table.py [-s SCENARIO ...] [-t TRANSPORT ...]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests import hostile  # noqa: E402 - after the path that finds it


def _isolate() -> None:
    """No provider keys, fluid settings or home directory of whoever runs it (as conftest)."""
    prefixes = ("OPENAI_", "ANTHROPIC_", "GEMINI_", "GOOGLE_API_KEY", "FLUID_")
    for name in list(os.environ):
        if name.startswith(prefixes):
            del os.environ[name]
    home = tempfile.mkdtemp(prefix="fluid-conformance-home-")
    os.environ["HOME"] = home
    os.environ["XDG_CACHE_HOME"] = str(Path(home) / "cache")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-s", "--scenario", action="append", choices=sorted(hostile.BY_NAME))
    parser.add_argument(
        "-t", "--transport", action="append", choices=hostile.TRANSPORTS + hostile.FOLLOWING
    )
    args = parser.parse_args()
    _isolate()
    rows = []
    broken: list[tuple[str, str, list[str]]] = []
    started = time.monotonic()
    for scenario, transport in hostile.cases():
        if args.scenario and scenario.name not in args.scenario:
            continue
        if args.transport and transport not in args.transport:
            continue
        result = hostile.run(scenario, transport)
        found = hostile.problems(scenario, result)
        if found:
            broken.append((scenario.name, transport, found))
        retryable = "" if result.retryable is None else str(result.retryable).lower()
        rows.append(
            f"| {scenario.name} | {transport} | {result.code} | {retryable} | "
            f"{result.requests} | {result.elapsed:.2f} | {result.rss_mb:.1f} | "
            f"{'yes' if not found else 'NO'} |"
        )
        print(f"{scenario.name} on {transport}: {result.code}", file=sys.stderr, flush=True)
    print(
        f"Transport conformance, {time.strftime('%Y-%m-%d')}, Python {platform.python_version()}, "
        f"deadline {hostile.DEADLINE:g} s (bound +{hostile.MARGIN:g} s), "
        f"{time.monotonic() - started:.0f} s in all\n"
    )
    print(
        "| scenario | transport | outcome code | retryable | requests sent | elapsed s "
        "| RSS growth MB | keeps the contract |"
    )
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    if broken:
        print(f"\n{len(broken)} of {len(rows)} rows break the contract:\n")
        for name, transport, found in broken:
            wanted = hostile.BY_NAME[name]
            print(f"- **{name}** on {transport} (owes {wanted.code}):")
            for sentence in found:
                print(f"  - {sentence}")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
