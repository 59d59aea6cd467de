"""How every ``fluid`` command writes to the terminal: one console factory, one color rule.

Color, first match wins:

1. ``--color auto|always|never`` on the command line (``fluid --color never doctor``);
2. ``FLUID_COLOR=auto|always|never`` (any other value warns once and is ignored);
3. ``NO_COLOR`` set to anything but the empty string: never (https://no-color.org);
4. ``FORCE_COLOR`` set to anything but the empty string: always (https://force-color.org);
5. auto: color when the stream is a terminal.

``never`` writes no escape sequence for style at all; ``always`` colors a pipe
too (16 standard colors, for CI logs) without making it a terminal: no
spinner, no cursor movement.

Width: at a terminal, rich wraps to the terminal's width. Anywhere else (a
pipe, a file, CI) nothing is hard-wrapped: a line is written whole, whatever
its length, so a path is never broken across lines; ``COLUMNS`` is not used
there.

Warnings: during one run, each warning the library logs is printed once, as
``warning: ...`` on standard error (:func:`warnings_once`).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Final, Literal, TextIO, cast

import click

if TYPE_CHECKING:
    from rich.console import Console

__all__ = [
    "COLOR_ENV",
    "COLOR_MODES",
    "ColorMode",
    "color_mode",
    "make_console",
    "set_color_mode",
    "warnings_once",
]

ColorMode = Literal["auto", "always", "never"]
COLOR_MODES: Final[tuple[ColorMode, ...]] = ("auto", "always", "never")
COLOR_ENV: Final = "FLUID_COLOR"
# Where the group's --color lands: ctx.meta is shared by every context of one invocation.
_META_KEY: Final = "fluid_build.color"
# Wide enough that no line of a pipe is ever wrapped; tables still take only the
# width their cells need.
_PIPE_WIDTH: Final = 1 << 16

LOG = logging.getLogger("fluid_build.config")
_SAID: set[str] = set()


def set_color_mode(ctx: click.Context, mode: ColorMode | None) -> None:
    """Record the ``--color`` given on the command line for the rest of this invocation."""
    if mode is not None:
        ctx.meta[_META_KEY] = mode


def _flag() -> ColorMode | None:
    ctx = click.get_current_context(silent=True)
    mode = ctx.meta.get(_META_KEY) if ctx is not None else None
    return cast("ColorMode", mode) if mode in COLOR_MODES else None


def color_mode(env: Mapping[str, str] | None = None) -> ColorMode:
    """The mode in effect: ``--color``, ``FLUID_COLOR``, ``NO_COLOR``, ``FORCE_COLOR``, or auto."""
    flag = _flag()
    if flag is not None:
        return flag
    env = os.environ if env is None else env
    raw = env.get(COLOR_ENV)
    if raw is not None and raw.strip():
        value = raw.strip().lower()
        if value in COLOR_MODES:
            return value
        if raw not in _SAID:
            _SAID.add(raw)
            LOG.warning(
                "%s=%r is not auto, always or never; ignoring it (e.g. %s=never)",
                COLOR_ENV,
                raw[:40],
                COLOR_ENV,
            )
    if env.get("NO_COLOR", ""):
        return "never"
    if env.get("FORCE_COLOR", ""):
        return "always"
    return "auto"


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def make_console(*, stderr: bool = False, env: Mapping[str, str] | None = None) -> Console:
    """The console a command prints with, on stdout (or stderr), per the rules above.

    Markup stays on (commands style their own text); highlighting and emoji
    codes are off, so a value such as a path or a model name prints as it is.
    """
    from rich.console import Console

    env = os.environ if env is None else env
    stream = sys.stderr if stderr else sys.stdout
    tty = _isatty(stream)
    dumb = env.get("TERM", "").strip().lower() in {"dumb", "unknown"}
    mode = color_mode(env)
    colors: Literal["auto", "standard"] | None
    if mode == "never":
        colors = None
    elif mode == "always":
        colors = "auto" if tty and not dumb else "standard"
    else:
        colors = "auto" if tty else None
    return Console(
        stderr=stderr,
        # Decided here from the stream alone: rich's own FORCE_COLOR / TTY_COMPATIBLE
        # reading would turn a pipe into an 80-column "terminal".
        force_terminal=tty,
        color_system=colors,
        no_color=False,  # NO_COLOR is already in `mode`; --color always beats it
        highlight=False,
        emoji=False,
        soft_wrap=not tty,
        width=None if tty else _PIPE_WIDTH,
    )


class _OncePerRun(logging.Handler):
    """Prints each distinct warning once, as ``warning: ...``, on the current stderr."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.seen: set[tuple[int, str]] = set()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed log call must not end the run
            text = str(record.msg)
        key = (record.levelno, text)
        if key in self.seen:
            return
        self.seen.add(key)
        try:
            sys.stderr.write(f"{record.levelname.lower()}: {text}\n")
            sys.stderr.flush()
        except (OSError, ValueError):  # stderr closed or gone: nothing to tell
            pass


@contextmanager
def warnings_once() -> Iterator[None]:
    """For one run: print each warning logged (by fluid_build or any library) once.

    Installed on the root logger for the length of the block, and removed after,
    so a program that calls :func:`fluid_build.cli.main` keeps its own logging.
    """
    root = logging.getLogger()
    handler = _OncePerRun()
    root.addHandler(handler)
    try:
        yield
    finally:
        root.removeHandler(handler)
