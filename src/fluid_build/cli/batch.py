"""``fluid batch``: many prompts from a file (or stdin), one JSON line per prompt, a summary.

The calls run through :meth:`LLMClient.amap` rather than ``map``: Ctrl-C then
cancels the calls in flight at once, where ``map``'s threads would keep the
process alive until each call's deadline.
"""

from __future__ import annotations

import json
import os
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import click

from fluid_build.cli._messages import report_error
from fluid_build.cli._options import (
    call_options,
    call_options_given,
    model_option,
    provider_option,
)
from fluid_build.cli.exit_codes import Interrupted, PromptsFileError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from fluid_build._files import OutputFile
    from fluid_build.copilot.batch import Batch, Outcome
    from fluid_build.copilot.call.core import CallOptions
    from fluid_build.copilot.client import LLMClient
    from fluid_build.copilot.llm.types import Completion
    from fluid_build.errors import FluidError

__all__ = ["MAX_PROMPTS_BYTES", "PromptsFileError", "command", "read_prompts"]

#: The most of a prompts file (or of stdin) read; at most one byte more is ever read.
MAX_PROMPTS_BYTES: Final = 10_000_000
_STDIN: Final = "standard input"


def _read_bytes(source: str) -> bytes:
    from fluid_build._files import FileTooLargeError, UnsafeFileError, read_regular

    if source == "-":
        data = sys.stdin.buffer.read(MAX_PROMPTS_BYTES + 1)
        if len(data) > MAX_PROMPTS_BYTES:
            too_large = FileTooLargeError(_STDIN, MAX_PROMPTS_BYTES)
            raise PromptsFileError(f"{_STDIN} {too_large.reason}", "split the prompts in batches")
        return data
    try:
        return read_regular(source, limit=MAX_PROMPTS_BYTES)
    except UnsafeFileError as exc:
        raise PromptsFileError(f"{exc.path} {exc.reason}", exc.advice) from None
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise PromptsFileError(
            f"{source} cannot be read ({reason})",
            "give the path of a file with one prompt per line, or - for standard input",
        ) from None


def read_prompts(source: str) -> list[tuple[int, str]]:
    """``(line number, prompt)`` of each non-blank line of ``source`` (a path, or ``-``).

    The file is read bounded and never blocks (see :mod:`fluid_build._files`).
    """
    name = _STDIN if source == "-" else source
    data = _read_bytes(source)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PromptsFileError(
            f"{name} is not UTF-8 text (byte {exc.start})", "give a UTF-8 text file"
        ) from None
    prompts = [(n, line.strip()) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not prompts:
        raise PromptsFileError(f"{name} holds no prompt", "write one prompt per line")
    return prompts


def _error_record(error: FluidError) -> dict[str, Any]:
    """The class, reason code, message and hint of a failed prompt, as the CLI prints them."""
    from fluid_build.cli._messages import describe

    described = describe(error)
    name = type(error).__name__
    shown = f"{name} [{described.code}]" if described.code else name
    return {
        "class": name,
        "code": described.code,
        "message": described.headline.removeprefix(f"fluid: {shown}: "),
        "hint": described.hint,
    }


def _record(outcome: Outcome[Completion], line: int) -> dict[str, Any]:
    from fluid_build.copilot.health.budget import usd_json

    record: dict[str, Any] = {"index": outcome.index, "line": line, "ok": outcome.ok}
    if outcome.error is not None:
        record["error"] = _error_record(outcome.error)
    elif outcome.value is not None:
        record["text"] = outcome.value.text
        # null: no price is known for the model that answered (docs/budgets.md).
        record["cost_usd"] = usd_json(outcome.value.cost_usd)
    return record


async def _run(
    client: LLMClient,
    prompts: Sequence[str],
    concurrency: int,
    fail_fast: bool,
    bar: bool,
    options: CallOptions,
) -> Batch[Completion]:
    """``client.amap`` with the bar; Ctrl-C cancels it and is raised as ``Interrupted``."""
    import asyncio
    import signal

    from fluid_build.cli._console import interrupt_echoed, make_console
    from fluid_build.copilot.batch import progress_bar

    shown = (
        progress_bar(len(prompts), description="prompts", console=make_console(stderr=True))
        if bar
        else nullcontext(None)
    )
    # A signal handler that raises inside the event loop can be swallowed by a transport
    # callback; the loop's own handler cancels the batch instead. SIGINT ignored stays so.
    loop, task = asyncio.get_running_loop(), asyncio.current_task()
    before = signal.getsignal(signal.SIGINT)
    interrupted: list[bool] = []

    def on_sigint() -> None:
        interrupt_echoed()
        interrupted.append(True)
        if task is not None:
            task.cancel()

    watching = callable(before)
    if watching:
        try:
            loop.add_signal_handler(signal.SIGINT, on_sigint)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, Windows
            watching = False
    try:
        with shown as progress:
            return await client.amap(
                prompts, concurrency=concurrency, fail_fast=fail_fast, progress=progress, **options
            )
    except asyncio.CancelledError:
        if interrupted:
            raise Interrupted from None
        raise
    finally:
        if watching:
            loop.remove_signal_handler(signal.SIGINT)
            signal.signal(signal.SIGINT, before)
        await client.aclose()


def _exit_code(batch: Batch[Completion]) -> int:
    """0, or the family code of the first failure in input order (docs/cli.md)."""
    from fluid_build.cli.exit_codes import EXIT_CODES, exit_code_for

    first = next((outcome.error for outcome in batch if outcome.error is not None), None)
    return exit_code_for(first) if first is not None else EXIT_CODES["ok"]


def _cost_line(batch: Batch[Completion]) -> str:
    """What the answers cost, saying which answers had no price rather than counting them as 0."""
    from fluid_build.copilot.health.budget import usd_amount

    answers = [outcome.value for outcome in batch if outcome.value is not None]
    if not answers:
        return "cost: none counted (no prompt was answered)"
    unpriced = sorted({f"{a.provider}:{a.model}" for a in answers if a.cost_usd is None})
    missing = (
        f"no price for {', '.join(unpriced)}; give one in FLUID_PRICES (docs/budgets.md)"
        if unpriced
        else ""
    )
    cost = batch.cost_usd
    if cost is None:
        return f"cost: unknown ({missing})"
    if unpriced:
        priced = sum(answer.cost_usd is not None for answer in answers)
        return f"cost: {usd_amount(cost)} USD for {priced} of {len(answers)} answers ({missing})"
    return f"cost: {usd_amount(cost)} USD"


def _print_summary(batch: Batch[Completion], lines: Sequence[int], source: str) -> None:
    from rich.table import Table

    from fluid_build.cli._console import make_console
    from fluid_build.cli._messages import describe
    from fluid_build.copilot.batch import COST, SUCCESS

    table = Table("outcome", "prompts", box=None, pad_edge=False)
    for code, count in batch.summary().items():
        if code != COST:  # the counts; the cost has its own line
            table.add_row(code, str(count), style="green" if code == SUCCESS else "red")
    console = make_console(stderr=True)
    console.print(table)
    click.echo(_cost_line(batch), err=True)
    for outcome in batch.failures()[:1]:
        if outcome.error is not None:
            # The line of the file, as an editor shows it; "index" counts prompts from 0,
            # as the JSON lines do, skipping blank lines.
            where = _STDIN if source == "-" else source
            click.echo(
                f"first failure: line {lines[outcome.index]} of {where} "
                f"(index {outcome.index} in the JSON lines):",
                err=True,
            )
            for text in describe(outcome.error).lines():
                click.echo(text, err=True)


def _check_out(out: Path) -> OutputFile:
    from fluid_build._files import check_output_file

    return check_output_file(
        out, name=str(out), hint="choose an --out you can write and run again; nothing was sent"
    )


def _open_stream(target: OutputFile, shown: str) -> int:
    """Open a FIFO, a device or /dev/stdout to write into; a FIFO waits for its reader."""
    from fluid_build._files import OutputPathError, open_output

    try:
        return open_output(target)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise OutputPathError(
            shown, f"cannot be opened for writing ({reason})", "choose another --out"
        ) from None


def _write_results(
    target: OutputFile, stream: int | None, shown: str, data: bytes, count: int
) -> None:
    """Write the JSON lines to --out; when that fails, keep them aside and say where."""
    from fluid_build._files import OutputPathError, save_aside, write_all, write_atomic

    try:
        if stream is not None:
            write_all(stream, data)
        else:
            write_atomic(target.path, data)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        # The answers are paid for: a file nobody asked for beats losing them.
        saved = save_aside(data, prefix="fluid-batch-", suffix=".jsonl")
        if saved is None:
            raise OutputPathError(
                shown,
                f"could not be written ({reason}), nor could the {count} results be saved "
                "in the working or the temporary directory",
                "free some space or choose an --out you can write, and run again",
            ) from None
        raise OutputPathError(
            shown,
            f"could not be written ({reason}); the {count} results were saved in {saved}",
            f"take the results from {saved}; choose an --out you can write next time",
            saved_to=saved,
        ) from None


@click.command("batch")
@click.argument("prompts", metavar="PROMPTS")
@provider_option
@model_option
@click.option(
    "--concurrency",
    type=click.IntRange(min=1),
    default=None,
    help="Calls in flight at once (default: the library's, 8).",
)
@click.option("--fail-fast", is_flag=True, help="After the first failure, send no other prompt.")
@call_options
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the JSON lines to this file (replaced whole; a FIFO or /dev/stdout is "
    "written into) instead of stdout. Checked before any request.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable: the summary as JSON too.")
def command(
    prompts: str,
    provider: str | None,
    model: str | None,
    concurrency: int | None,
    fail_fast: bool,
    max_output_tokens: int | None,
    temperature: float | None,
    seed: int | None,
    out: Path | None,
    as_json: bool,
) -> None:
    """Send every line of PROMPTS (a file, or - for stdin) as a prompt, several at a time.

    Writes one JSON line per prompt, in input order (index, ok, then text and
    cost_usd, or error), to --out FILE or stdout; then a summary by reason
    code and what the answers cost in USD. Exits 0
    when every prompt got an answer, else with the exit code of the first
    failure (docs/cli.md).
    """
    import asyncio

    from fluid_build.cli._console import make_console
    from fluid_build.cli.forge import _stored_env, _wait_printer, quiet
    from fluid_build.copilot.batch import DEFAULT_CONCURRENCY
    from fluid_build.copilot.call.envelope import RetryEnvelope
    from fluid_build.copilot.client import LLMClient

    console = make_console(stderr=True)
    client: LLMClient | None = None
    stream: int | None = None
    try:
        items = read_prompts(prompts)
        # Before any request: results nobody can write would be paid for and lost.
        target = _check_out(out) if out is not None else None
        env = _stored_env()
        # The wait lines print above the bar; a live countdown would be a second live display.
        envelope = RetryEnvelope.from_env(env, hook=_wait_printer(console))
        client = LLMClient(provider, model, envelope=envelope, env=env)
        if not as_json or quiet(env):
            # Quiet, this shows nothing, and tells the pre-flight the run was warned: with
            # --json alone the pre-flight's own warning stays the only one.
            client.run_start_warnings()
        if target is not None and target.stream:
            stream = _open_stream(target, str(out))
        workers = concurrency or DEFAULT_CONCURRENCY
        console.print(
            f"{len(items)} prompt(s) to {client.provider}:{client.model}, {workers} at a time"
        )
        bar = console.is_terminal and not as_json
        texts = [text for _, text in items]
        options = call_options_given(max_output_tokens, temperature, seed)
        batch = asyncio.run(_run(client, texts, workers, fail_fast, bar, options))
        lines = "".join(
            json.dumps(_record(outcome, line)) + "\n"
            for outcome, (line, _) in zip(batch, items, strict=True)
        )
        if target is not None:
            _write_results(target, stream, str(out), lines.encode("utf-8"), len(items))
    except click.UsageError:
        raise
    except Exception as exc:  # noqa: BLE001 - every failure leaves through one exit-code map
        sys.exit(report_error(exc, as_json=as_json))
    finally:
        if client is not None:
            client.close()
        if stream is not None:
            os.close(stream)  # a FIFO's reader sees the end here
    if target is None:
        click.echo(lines, nl=False)
    code = _exit_code(batch)
    if as_json:
        result: dict[str, Any] = {"ok": batch.ok, "exit_code": code, "summary": batch.summary()}
        if out is not None:
            result["out"] = str(out)
        click.echo(json.dumps(result))
    else:
        _print_summary(batch, [line for line, _ in items], prompts)
    if code:
        sys.exit(code)
