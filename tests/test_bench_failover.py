"""benchmarks/bench_failover.py cannot rot: its fluid side runs in ``--quick`` mode, here.

The openai SDK is not in the test extras: the run is made as if it were not
importable, so the script must skip its rows with a printed note, not fail. The
envelope's waits are recorded on a clock that moves without sleeping; the only
real waits are the quick mode's phase limits (0.3 s, twice) on a loopback server.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _bench(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    name = "bench_failover_under_test"
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / "bench_failover.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)  # its dataclasses look themselves up there
    spec.loader.exec_module(module)
    return module


class Clock:
    """The envelope's sleep, monotonic clock and wall clock, moved by its own waits."""

    def __init__(self) -> None:
        self.offset = 0.0
        self.waits: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.offset += seconds

    def kwargs(self) -> dict[str, Any]:
        return {
            "sleep": self.sleep,
            "clock": lambda: time.monotonic() + self.offset,
            "wall": lambda: time.time() + self.offset,
        }


#: fault label -> (outcome, requests primary / fallback) for fluid_build's chain.
EXPECTED = {
    ("429 with Retry-After, once", "fluid_build (chain)"): ("answer from `primary`", "2 / 0"),
    ("429 with Retry-After, persistent", "fluid_build (chain)"): (
        "answer from `healthy`",
        "3 / 1",
    ),
    ("500, once", "fluid_build (chain)"): ("answer from `primary`", "2 / 0"),
    ("503, persistent", "fluid_build (chain)"): ("answer from `healthy`", "3 / 1"),
    ("connection reset before the head, persistent", "fluid_build (chain)"): (
        "answer from `healthy`",
        "3 / 1",
    ),
    # A route that said nothing within its limit is not asked again: one request each.
    ("no answer at all (connection open, silent)", "fluid_build (chain)"): (
        "answer from `healthy`",
        "1 / 1",
    ),
    ("slow first token", "fluid_build (chain)"): ("answer from `healthy`", "1 / 1"),
    ("stream cut mid-answer (streamed), persistent", "fluid_build (chain)"): (
        "error: llm.network_error (after part of the text)",
        "1 / 0",
    ),
    ("stream cut mid-answer (streamed), persistent", 'fluid_build (chain, on_cut="restart")'): (
        "answer from `healthy` (after 1 restart)",
        "1 / 1",
    ),
    ("context overflow (400)", "fluid_build (chain)"): ("answer from `healthy`", "1 / 1"),
}


def test_the_quick_run_prints_the_fluid_table_and_skips_the_sdk_with_a_note(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = _bench(monkeypatch)
    monkeypatch.setattr(bench, "openai_version", lambda: None)  # as if not importable
    clock = Clock()
    out = tmp_path / "failover.json"

    assert bench.main(["--quick", "--json", str(out)], clock=clock.kwargs()) == 0

    printed = capsys.readouterr().out
    assert "note: openai SDK not installed: its rows are skipped" in printed
    assert "Retry-After on every 429: 0.2 s" in printed
    rows = [
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in printed.splitlines()
        if line.startswith("| ") and not line.startswith(("| fault ", "| ---"))
    ]
    table = {(fault, client): (outcome, sent) for fault, client, outcome, sent, _ in rows}
    assert table == EXPECTED
    for *_, seconds in rows:
        assert re.fullmatch(r"\d+\.\d\d", seconds)
    summary = re.search(r"^fluid_build \(chain\): (.*)$", printed, re.MULTILINE)
    assert summary is not None
    assert summary[1].startswith("8 of 9 faults answered, ")
    assert summary[1].endswith('(9 of 9 with on_cut="restart")')

    data = json.loads(out.read_text())
    assert data["openai"] is None
    assert {row["client"] for row in data["rows"]} == {"fluid", "fluid-restart"}
    assert data["timings"]["retry_after"] == 0.2
    # The waits the envelope asked for, in order: the Retry-After of each 429 (once, then
    # twice before moving on), the backoff after the 500, the 503s and the resets (1 s,
    # 2 s, jitter at most 10 %). Nothing else waited.
    expected = [0.2, 0.2, 0.2, 1.0, 1.0, 2.0, 1.0, 2.0]
    assert clock.waits == pytest.approx(expected, rel=0.1)
