"""Plot every benchmark's ratios against its baseline, with the target lines.

Reads what the benchmarks wrote in one run: ``client.json``
(``bench_client.py --json``), ``import.json`` (``bench_import.py --json``) and
the markdown that ``bench_envelope.py`` and ``bench_preflight.py`` print
(saved as ``envelope.md`` and ``preflight.md``; with ``--run-missing`` a
missing one is produced by running its script here). Writes a PNG (matplotlib,
Agg backend) and prints every judged figure; exit status 1 when a target is
missed and ``--check`` is given.

    python benchmarks/plot_ratios.py --dir RESULTS [--out docs/benchmarks-ratios.png]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE.parent / "docs" / "benchmarks-ratios.png"

ENVELOPE_TARGET_US = 10.0
PREFLIGHT_TARGET = 1.05
PREFLIGHT_JUDGED = ("~100K", "~1M")
SHORT_CLIENT = {  # bar labels
    "httpx": "bare httpx",
    "llmclient": "LLMClient",
    "llmclient-sqlite": "LLMClient, sqlite cooldown",
    "openai": "openai SDK",
}
SHORT_IMPORT = {
    "fluid-llmclient": "from fluid_build.copilot import LLMClient",
    "openai-client": "from openai import OpenAI",
}


def table_rows(markdown: str) -> list[list[str]]:
    """The body rows of the markdown tables in ``markdown``, as stripped cells."""
    rows = []
    for line in markdown.splitlines():
        line = line.strip()
        if not line.startswith("|") or set(line) <= set("|-: "):
            continue
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if cells and cells[0] in {"variant", "prompt"}:  # a header row
            continue
        rows.append(cells)
    return rows


def _number(text: str) -> float:
    return float(text.rstrip("x").replace(",", ""))


def parse_envelope(markdown: str) -> list[dict[str, Any]]:
    """``bench_envelope.py``'s table: variant, direct, enveloped, overhead (us), ratio."""
    out = []
    for cells in table_rows(markdown):
        if len(cells) >= 5:
            out.append({"variant": cells[0], "overhead_us": _number(cells[3]), "ratio": cells[4]})
    return out


def parse_preflight(markdown: str) -> list[dict[str, Any]]:
    """``bench_preflight.py``'s table: prompt, tokens, bytes, path, check, encode, ratio."""
    out = []
    for cells in table_rows(markdown):
        if len(cells) >= 7:
            out.append(
                {
                    "prompt": cells[0],
                    "path": cells[3].split(" ")[0],
                    "ratio": _number(cells[6]),
                }
            )
    return out


def load(directory: Path | None, given: str | None, name: str) -> Path | None:
    if given:
        return Path(given)
    if directory is not None and (directory / name).exists():
        return directory / name
    return None


def markdown_of(path: Path | None, script: str, run_missing: bool, quick: bool) -> str | None:
    if path is not None:
        return path.read_text()
    if not run_missing:
        return None
    command = [sys.executable, str(HERE / script), *(["--quick"] if quick else [])]
    done = subprocess.run(command, capture_output=True, text=True, check=False)  # noqa: S603
    print(done.stdout)
    return done.stdout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, help="a folder holding the files named below")
    parser.add_argument("--client", help="bench_client.py --json output (client.json)")
    parser.add_argument("--imports", help="bench_import.py --json output (import.json)")
    parser.add_argument("--envelope", help="bench_envelope.py's stdout (envelope.md)")
    parser.add_argument("--preflight", help="bench_preflight.py's stdout (preflight.md)")
    parser.add_argument("--run-missing", action="store_true", help="run a missing markdown one")
    parser.add_argument("--quick", action="store_true", help="with --run-missing: --quick runs")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"default {DEFAULT_OUT}")
    parser.add_argument("--check", action="store_true", help="exit 1 if any target is missed")
    args = parser.parse_args()

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    client_path = load(args.dir, args.client, "client.json")
    import_path = load(args.dir, args.imports, "import.json")
    client = json.loads(client_path.read_text()) if client_path else None
    imports = json.loads(import_path.read_text()) if import_path else None
    envelope_md = markdown_of(
        load(args.dir, args.envelope, "envelope.md"),
        "bench_envelope.py",
        args.run_missing,
        args.quick,
    )
    preflight_md = markdown_of(
        load(args.dir, args.preflight, "preflight.md"),
        "bench_preflight.py",
        args.run_missing,
        args.quick,
    )

    fig, axes = plt.subplots(3, 2, figsize=(14, 14))
    panels = iter(axes.flat)
    missed: list[str] = []

    def bars(ax: Any, labels: list[str], values: list[float], colors: list[str]) -> None:
        ax.barh(range(len(values)), values, color=colors)
        ax.set_yticks(range(len(values)), labels, fontsize=8)
        ax.invert_yaxis()
        for y, value in enumerate(values):
            ax.annotate(f" {value:.3g}", (value, y), va="center", fontsize=8, annotation_clip=False)

    def target(ax: Any, x: float, label: str) -> None:
        ax.axvline(x, color="crimson", linestyle="--", linewidth=1.2, label=label)
        ax.legend(loc="lower right", fontsize=8)

    ours, peer, base_color = "tab:blue", "tab:gray", "tab:green"

    if client is not None:
        ax = next(panels)
        rows = [r for r in client["sync"]["rows"] if "ratio" in r]
        bars(
            ax,
            [SHORT_CLIENT[r["variant"]] for r in rows],
            [r["ratio"] for r in rows],
            [
                base_color
                if r["variant"] == "httpx"
                else ours
                if r["variant"].startswith("llmclient")
                else peer
                for r in rows
            ],
        )
        target(ax, client["target"], f"target {client['target']:.2f}x")
        ax.set_title("per call (sync): time / bare httpx\n(lower is better)", fontsize=10)
        for r in rows:
            if r["variant"].startswith("llmclient") and r["ratio"] > client["target"]:
                missed.append(f"client: {r['label']} {r['ratio']:.3f}x > {client['target']:.2f}x")

        ax = next(panels)
        rows = [r for r in client["async"] if "ratio" in r]
        colors = {"httpx": base_color, "llmclient": ours}
        bars(
            ax,
            [f"{SHORT_CLIENT[r['variant']]}, {r['concurrency']:,} at once" for r in rows],
            [r["ratio"] for r in rows],
            [colors.get(r["variant"], peer) for r in rows],
        )
        target(ax, 1.0, "bare httpx.AsyncClient")
        ax.set_title("async throughput: calls/s / bare httpx\n(higher is better)", fontsize=10)

    if imports is not None:
        ax = next(panels)
        rows = [r for r in imports["rows"] if "ratio" in r]
        colors = {"fluid-copilot": ours, "fluid-llmclient": ours, "openai-client": base_color}
        bars(
            ax,
            [SHORT_IMPORT.get(r["key"], r["statement"]) for r in rows],
            [r["ratio"] for r in rows],
            [colors.get(r["key"], peer) for r in rows],
        )
        ax.set_xscale("log")
        target(ax, imports["target"], "target: below the openai client")
        ax.set_title(
            "cold import: time / `from openai import OpenAI`\n(lower is better)", fontsize=10
        )
        missed += [f"import: {m}" for m in imports.get("missed", [])]

    if envelope_md:
        ax = next(panels)
        rows = parse_envelope(envelope_md)
        bars(
            ax,
            [f"{r['variant']} ({r['ratio']})" for r in rows],
            [max(r["overhead_us"], 1e-3) for r in rows],
            [peer if "Redis" in r["variant"] else ours for r in rows],
        )
        ax.set_xscale("log")
        target(ax, ENVELOPE_TARGET_US, f"target < {ENVELOPE_TARGET_US:g} us")
        ax.set_title(
            "retry envelope: overhead over a direct call, us\n"
            "(ratio to the 60 ns direct call in brackets)",
            fontsize=10,
        )
        for r in rows:
            if "Redis" not in r["variant"] and r["overhead_us"] >= ENVELOPE_TARGET_US:
                missed.append(f"envelope: {r['variant']} {r['overhead_us']:.2f} us")

    if preflight_md:
        ax = next(panels)
        rows = parse_preflight(preflight_md)
        bars(
            ax,
            [f"{r['prompt']} {r['path']} path" for r in rows],
            [r["ratio"] for r in rows],
            [ours if r["path"] == "exact" else peer for r in rows],
        )
        ax.set_xscale("log")
        target(ax, PREFLIGHT_TARGET, f"target {PREFLIGHT_TARGET}x (exact, 100K and 1M)")
        ax.set_title(
            "token pre-flight: time / tiktoken encode_ordinary\n(lower is better)", fontsize=10
        )
        for r in rows:
            judged = r["path"] == "exact" and r["prompt"] in PREFLIGHT_JUDGED
            if judged and r["ratio"] > PREFLIGHT_TARGET:
                missed.append(f"preflight: {r['prompt']} exact {r['ratio']:.3f}x")

    for ax in panels:  # the panels left over: the verdicts
        ax.axis("off")
        verdict = "every target met" if not missed else "targets missed:\n" + "\n".join(missed)
        ax.text(0.0, 1.0, verdict, va="top", fontsize=9, wrap=True, transform=ax.transAxes)
        break
    info = (client or imports or {}).get("machine")
    if info:
        fig.suptitle(
            f"fluid_build benchmarks, ratios to the baseline measured in the same run: "
            f"{info['cores']} cores, {info['cpu']}, {info['python']}, {info['date']}",
            fontsize=11,
        )
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")
    if missed:
        print("targets missed: " + "; ".join(missed))
        return 1 if args.check else 0
    print("every target met")
    return 0


if __name__ == "__main__":
    sys.exit(main())
