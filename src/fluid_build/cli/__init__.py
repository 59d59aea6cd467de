"""The ``fluid`` console script: forge, batch, ai setup, corpus, doctor and completion.

Commands are thin: they call the library and map failures to exit codes in
one place (:mod:`fluid_build.cli.exit_codes`). Heavy modules load inside the
commands, so ``fluid --help`` stays fast.

Conventions every command shares (docs/cli.md, "Conventions"): Ctrl-C exits
130 with one line; ``--color`` / ``FLUID_COLOR`` / ``NO_COLOR``; no hard
wrapping in a pipe (:mod:`fluid_build.cli._console`); each warning once per run.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Final

import click

from fluid_build._version import __version__
from fluid_build.cli._console import (
    COLOR_MODES,
    ColorMode,
    cursor_mid_line,
    following_the_cursor,
    interrupt_echoed,
    set_color_mode,
    warnings_once,
)
from fluid_build.cli.exit_codes import EXIT_CODES, Interrupted

__all__ = ["EXIT_INTERRUPTED", "main"]

#: 128 + SIGINT, as a shell reports a process that Ctrl-C ended.
EXIT_INTERRUPTED: Final = EXIT_CODES["interrupted"]

_SHELLS: Final = ("bash", "zsh", "fish")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(
    __version__, "--version", "-V", prog_name="fluid", message="%(prog)s %(version)s"
)
@click.option(
    "--color",
    type=click.Choice(COLOR_MODES),
    default=None,
    metavar="auto|always|never",
    help="Color the output: auto (at a terminal; the default), always, never. "
    "Also FLUID_COLOR; NO_COLOR means never.",
)
@click.pass_context
def cli(ctx: click.Context, color: ColorMode | None) -> None:
    """fluid_build: reliable LLM calls and the forge pipeline."""
    set_color_mode(ctx, color)


@click.command("completion")
@click.argument("shell", type=click.Choice(_SHELLS), metavar="SHELL")
def completion(shell: str) -> None:
    """Print the shell completion script for SHELL (bash, zsh or fish).

    \b
    bash:  eval "$(fluid completion bash)"          (in ~/.bashrc)
    zsh:   eval "$(fluid completion zsh)"           (in ~/.zshrc)
    fish:  fluid completion fish > ~/.config/fish/completions/fluid.fish
    """
    from click.shell_completion import get_completion_class

    shell_class = get_completion_class(shell)
    if shell_class is None:  # pragma: no cover - click ships all three
        raise click.UsageError(f"no completion for {shell}")
    script = shell_class(cli, {}, "fluid", "_FLUID_COMPLETE").source()
    click.echo(script)


def _register() -> None:
    from fluid_build.cli import ai, batch, corpus, doctor, forge

    commands = (forge.command, batch.command, ai.command, corpus.command, doctor.command)
    for command in (*commands, completion):
        cli.add_command(command)


def _raise_interrupted(signum: int, frame: FrameType | None) -> None:
    interrupt_echoed()
    raise Interrupted


def _catch_sigint() -> Callable[[], None]:
    """Route SIGINT to :class:`Interrupted`; returns what puts the old handler back.

    Left alone where Python's default handler is not in place: a SIGINT that
    was ignored (a background job) stays ignored, and an embedding program
    keeps its own handler.
    """
    try:
        if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
            return lambda: None
        signal.signal(signal.SIGINT, _raise_interrupted)
    except ValueError:  # not the main thread
        return lambda: None

    def restore() -> None:
        signal.signal(signal.SIGINT, signal.default_int_handler)

    return restore


def _interrupted() -> int:
    # A fresh line when the cursor sits after an echoed ^C or a prompt; after a line that
    # ended (a progress bar's last one), none: it would show as a blank line.
    lead = "\n" if cursor_mid_line() else ""
    click.echo(f"{lead}fluid: interrupted", err=True)
    return EXIT_INTERRUPTED


def _run(argv: Sequence[str] | None) -> int:
    try:
        code = cli.main(
            args=list(argv) if argv is not None else None,
            prog_name="fluid",
            standalone_mode=False,
        )
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except SystemExit as done:
        if isinstance(done.code, str):
            click.echo(done.code, err=True)
            return 1
        return int(done.code or 0)
    # A command's return value, or the code of ctx.exit(); commands return None.
    return code if isinstance(code, int) else 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``fluid`` command; returns the exit code.

    Ctrl-C (SIGINT) ends any command with one line, ``fluid: interrupted``, and
    exit code 130; whatever was being written is left as it was (every file
    fluid writes is renamed into place whole).
    """
    _register()
    restore = _catch_sigint()
    try:
        with following_the_cursor():
            try:
                with warnings_once():
                    return _run(argv)
            except (Interrupted, KeyboardInterrupt, click.Abort):
                # click.Abort: Ctrl-C or end of input at a prompt.
                return _interrupted()
    finally:
        restore()
