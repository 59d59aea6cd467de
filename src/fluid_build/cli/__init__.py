"""The ``fluid`` console script: forge, ai setup, corpus and doctor.

Commands are thin: they call the library and map failures to exit codes in
one place (:mod:`fluid_build.cli.exit_codes`). Heavy modules load inside the
commands, so ``fluid --help`` stays fast.
"""

from __future__ import annotations

from collections.abc import Sequence

import click

from fluid_build import __version__

__all__ = ["main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="fluid", message="%(prog)s %(version)s")
def cli() -> None:
    """fluid_build: reliable LLM calls and the forge pipeline."""


def _register() -> None:
    from fluid_build.cli import ai, corpus, doctor, forge

    for module in (forge, ai, corpus, doctor):
        cli.add_command(module.command)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``fluid`` command; returns the exit code."""
    _register()
    try:
        cli.main(
            args=list(argv) if argv is not None else None, prog_name="fluid", standalone_mode=True
        )
    except SystemExit as done:
        return int(done.code or 0) if not isinstance(done.code, str) else 1
    return 0
