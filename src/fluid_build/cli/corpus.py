"""``fluid corpus``: record provider exchanges as cassettes, and replay them offline.

``fluid corpus replay [PATH ...]`` runs every cassette through the real
client with the network and the clock replaced, and exits with
``EXIT_CODES["corpus_mismatch"]`` (30) when any outcome differs from the
recording or a cassette cannot be read. A ``fluid forge`` recording is
refused before anything is replayed (exit 3, naming ``fluid forge --replay``):
its recipe is not what was sent. ``fluid corpus record`` checks ``--out``
first, then makes one real call and writes what it saw. See docs/corpus.md.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

import click

from fluid_build.cli._messages import report_error
from fluid_build.cli._options import call_options, model_option
from fluid_build.cli.exit_codes import EXIT_CODES

if TYPE_CHECKING:
    from fluid_build.corpus.cassette import Cassette, CassetteError
    from fluid_build.corpus.replay import ReplayResult

__all__ = ["command"]

DEFAULT_CORPUS = Path("corpus")


@click.group(name="corpus")
def corpus() -> None:
    """Record provider exchanges as cassettes; replay them offline."""


# -- replay ---------------------------------------------------------------------------


def _cassette_files(paths: Sequence[Path]) -> list[Path]:
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            files.extend(sorted(path.glob("*.json")))
        else:
            files.append(path)
    return files


def _load_all(files: Sequence[Path]) -> list[tuple[Path, Cassette | CassetteError]]:
    from fluid_build.corpus.cassette import CassetteError, load_cassette

    loaded: list[tuple[Path, Cassette | CassetteError]] = []
    for path in files:
        try:
            loaded.append((path, load_cassette(path)))
        except CassetteError as exc:
            loaded.append((path, exc))  # reported in its row: the others still replay
    return loaded


def _forge_run_error(forge_runs: Sequence[tuple[Path, Cassette]]) -> CassetteError:
    """One line for the forge recordings given to ``corpus replay``, naming the command
    that replays the first one from here."""
    from fluid_build.corpus.cassette import CassetteError

    first, cassette = forge_runs[0]
    others = ""
    if len(forge_runs) > 1:
        shown = ", ".join(str(p) for p, _ in forge_runs[1:4])
        more = f" and {len(forge_runs) - 4} more" if len(forge_runs) > 4 else ""
        others = f" (so are {shown}{more})"
    advice, where = _forge_replay_advice(first, cassette)
    return CassetteError(
        f"is a `fluid forge` run, not a corpus cassette{others}: replay it with `{advice}`{where}",
        path=str(first),
        hint="`fluid forge --replay FILE` replays a forge run with the intent it was recorded "
        "with; `fluid corpus replay` takes cassettes from `fluid corpus record` and "
        "corpus/make_cassettes.py.",
    )


def _forge_replay_advice(path: Path, cassette: Cassette) -> tuple[str, str]:
    """The ``fluid forge`` command that replays ``path``, and where to run it when the
    working directory is not a workspace its recorded tool calls can read."""
    from fluid_build.cli.forge import workspace_for
    from fluid_build.forge.cassette import missing_workspace_file, recorded_tool_calls

    if not recorded_tool_calls(cassette):
        return f"fluid forge --replay {path}", ""
    advice = f"fluid forge --agent-loop --replay {path}"
    missing = missing_workspace_file(cassette, workspace_for(None, path))
    if missing is None:
        return advice, ""
    return advice, f", from the workspace it was recorded in (its model read {missing[1]})"


def _replay_one(path: Path, loaded: Cassette | CassetteError) -> ReplayResult:
    from fluid_build.corpus.cassette import CassetteError
    from fluid_build.corpus.replay import ReplayResult, run_cassette

    if isinstance(loaded, CassetteError):
        return ReplayResult(
            name=path.stem,
            ok=False,
            mismatches=[f"unreadable: {loaded}"],
            outcome="unreadable",
            attempts=0,
            waits=[],
            error=None,
            path=str(path),
        )
    result = run_cassette(loaded)
    result.path = str(path)
    return result


def _waits(waits: Sequence[float]) -> str:
    return ", ".join(f"{w:g}" for w in waits) if waits else "-"


def _print_table(results: Sequence[ReplayResult]) -> None:
    from rich.markup import escape
    from rich.table import Table

    from fluid_build.cli._console import make_console

    console = make_console()
    table = Table(title="fluid corpus replay", title_justify="left")
    table.add_column("cassette", no_wrap=True)
    table.add_column("provider")
    table.add_column("outcome")
    table.add_column("attempts", justify="right")
    table.add_column("waits (s)")
    table.add_column("result")
    table.add_column("reason", overflow="fold")
    for result in results:
        verdict = "[green]OK[/]" if result.ok else "[bold red]MISMATCH[/]"
        if result.skipped is not None:
            verdict = "[yellow]SKIPPED[/]"
        table.add_row(
            escape(result.name),
            escape(result.provider or "?"),
            result.outcome,
            str(result.attempts),
            _waits(result.waits),
            verdict,
            escape("\n".join(result.mismatches) or result.skipped or ""),
        )
    console.print(table)
    failed = sum(not r.ok for r in results)
    skipped = [r for r in results if r.skipped is not None]
    if failed:
        console.print(
            f"[bold red]{failed} of {len(results)} cassette(s) did not replay as recorded[/]"
        )
    else:
        replayed = len(results) - len(skipped)
        console.print(f"[green]{replayed} cassette(s) replayed as recorded[/]")
    for reason in sorted({r.skipped for r in skipped if r.skipped is not None}):
        count = sum(r.skipped == reason for r in skipped)
        providers = ", ".join(sorted({r.provider for r in skipped if r.skipped == reason}))
        console.print(
            f"[yellow]{count} skipped[/] ({providers}): {escape(reason)}; install it to replay them"
        )


@corpus.command(name="replay")
@click.argument("paths", nargs=-1, type=click.Path(exists=True, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
def replay(paths: tuple[Path, ...], as_json: bool) -> None:
    """Replay cassettes (files or directories; default ./corpus) and compare outcomes.

    Exits 30 when any cassette differs from its recording or cannot be read,
    and 3, replaying nothing, when one is a `fluid forge` run (replay it with
    `fluid forge --replay FILE`).
    """
    chosen = list(paths)
    if not chosen:
        if not DEFAULT_CORPUS.is_dir():
            raise click.UsageError(
                "no ./corpus directory here: run from the project root or pass cassette paths"
            )
        chosen = [DEFAULT_CORPUS]
    files = _cassette_files(chosen)
    if not files:
        where = ", ".join(str(p) for p in chosen)
        raise click.UsageError(f"no cassettes (*.json) in {where}")
    from fluid_build.corpus.cassette import CassetteError, is_forge_run

    loaded = _load_all(files)
    forge_runs = [(p, c) for p, c in loaded if not isinstance(c, CassetteError) and is_forge_run(c)]
    if forge_runs:
        # Its recipe is a summary of the intent, not what was sent: replaying it here
        # could only report a mismatch that says nothing about the code.
        raise SystemExit(report_error(_forge_run_error(forge_runs), as_json=as_json))
    results = [_replay_one(path, cassette) for path, cassette in loaded]
    failed = any(not r.ok for r in results)
    code = EXIT_CODES["corpus_mismatch"] if failed else EXIT_CODES["ok"]
    if as_json:
        payload: dict[str, Any] = {
            "ok": not failed,
            "exit_code": code,
            "cassettes": len(results),
            "mismatched": sum(not r.ok for r in results),
            "skipped": sum(r.skipped is not None for r in results),
            "results": [_result_json(r) for r in results],
        }
        click.echo(json.dumps(payload, indent=2, default=str))
    else:
        _print_table(results)
    if failed:
        raise SystemExit(code)


def _result_json(result: ReplayResult) -> dict[str, Any]:
    data = result.to_dict()
    data.pop("output", None)
    return data


# -- record ---------------------------------------------------------------------------


@corpus.command(name="record")
@click.argument("prompt")
@click.option("--provider", required=True, help="openai, azure, anthropic, gemini, ollama, ...")
@model_option
@click.option(
    "--out",
    "out",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="The cassette file to write (provider-scenario.json).",
)
@click.option("--response-model", help="A response model the output must validate against.")
@click.option(
    "--kind",
    type=click.Choice(["complete", "stream", "loop"]),
    default="complete",
    show_default=True,
    help="complete(), stream(), or the agent loop (schema corrections).",
)
@click.option("--system", help="A system prompt.")
@click.option("--strict-schema", is_flag=True, help="OpenAI strict-schema mode.")
@click.option("--name", help="The cassette's name (default: the file name).")
@click.option("--description", default="", help="What the cassette shows.")
@click.option("--force", is_flag=True, help="Overwrite an existing cassette.")
@click.option(
    "--no-bodies",
    "no_bodies",
    is_flag=True,
    help="Keep no prompt and no model output: the cassette checks the flow "
    "(requests, statuses, waits) only.",
)
@call_options
def record_command(
    prompt: str,
    provider: str,
    model: str | None,
    out: Path,
    response_model: str | None,
    kind: str,
    system: str | None,
    strict_schema: bool,
    name: str | None,
    description: str,
    force: bool,
    no_bodies: bool,
    max_output_tokens: int | None,
    temperature: float | None,
    seed: int | None,
) -> None:
    """Make one real call with PROMPT and write it as a cassette.

    The API key comes from the environment, as for any call; it is never
    written: request headers are not kept, credential headers, cookies and
    account ids of the answers are dropped, and bodies are redacted (the key
    by value, credential fields by name, URL userinfo and key-like query
    values). --no-bodies keeps neither PROMPT nor the model's output.
    """
    from fluid_build.corpus.cassette import check_writable
    from fluid_build.corpus.record import record
    from fluid_build.errors import FluidError

    try:
        # Before the call, and before --force is asked for: a FIFO, a device, a path
        # through a file or a directory nothing can be created in is no place for it.
        check_writable(out)
    except FluidError as exc:
        raise SystemExit(report_error(exc)) from None
    if out.exists() and not force:
        raise click.UsageError(f"{out} exists; pass --force to overwrite it")
    try:
        cassette = record(
            prompt,
            provider=provider,
            model=model,
            out=out,
            response_model=response_model,
            kind=cast(Literal["complete", "stream", "loop"], kind),
            system=system,
            strict_schema=strict_schema,
            name=name,
            description=description,
            bodies=not no_bodies,
            # Into the recipe too: the replay sends them again, and compares them.
            max_output_tokens=max_output_tokens,
            temperature=temperature,
            seed=seed,
        )
    except FluidError as exc:
        raise SystemExit(report_error(exc)) from None
    expect = cassette.expect
    what = (
        "success"
        if expect.outcome == "success"
        else f"error {expect.error_class} [{expect.error_code}]"
    )
    click.echo(
        f"recorded {out}: {cassette.provider} ({cassette.model}), {what}, "
        f"{expect.attempts} request(s), waits {_waits(expect.waits)}"
        + ("" if cassette.bodies else ", without bodies")
    )
    click.echo("check it (fluid corpus replay) and read it before sharing it.")


command = corpus
