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

The cursor: at a terminal, a run follows whether the cursor sits mid-line
(:func:`following_the_cursor`): after a prompt, after an echoed ``^C``, or not
(after a line ended, or a live display erased itself). ``fluid: interrupted``
starts a fresh line only in the first case, so it never follows a blank line.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Final, Literal, TextIO, cast

import click

from fluid_build._threads import signals_stay_with_main

if TYPE_CHECKING:
    from rich.console import Console
    from rich.status import Status

__all__ = [
    "COLOR_ENV",
    "COLOR_MODES",
    "ColorMode",
    "color_mode",
    "cursor_mid_line",
    "following_the_cursor",
    "interrupt_echoed",
    "make_console",
    "set_color_mode",
    "status",
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
        from fluid_build.copilot.agents.errors import without_python_asides

        try:
            text = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed log call must not end the run
            text = str(record.msg)
        # The command's operator cannot pass a Python argument: the variable beside it is
        # the advice.
        text = without_python_asides(text)
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


# -- where the cursor is ------------------------------------------------------------

# One token of terminal output: a CSI sequence (its final byte), another escape, a line
# end, or one character that is shown.
_TOKEN: Final = re.compile(r"\x1b\[([0-9;?]*)([@-~])|\x1b.|([\r\n])|([^\x1b\r\n])", re.DOTALL)


def _mid_line_after(text: str, mid_line: bool) -> bool:
    """Whether the cursor is mid-line after ``text`` is written, from ``mid_line`` before."""
    for match in _TOKEN.finditer(text):
        params, final, line_end, shown = match.groups()
        if line_end or (final in ("E", "F") or (final == "G" and params in ("", "1"))):
            mid_line = False  # a new line, or back to its first column
        elif shown is not None and shown.isprintable():
            mid_line = True
    return mid_line


class _Cursor:
    mid_line = False
    following = False


_CURSOR: Final = _Cursor()


class _Followed:
    """A text stream that notes, on every write, where the terminal's cursor ends."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        written = self._stream.write(text)
        _CURSOR.mid_line = _mid_line_after(text, _CURSOR.mid_line)
        return written

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def cursor_mid_line() -> bool:
    """Whether, at a terminal, the cursor sits mid-line; False when not followed."""
    return _CURSOR.following and _CURSOR.mid_line


def interrupt_echoed() -> None:
    """Note a SIGINT: a terminal that echoes control characters has just printed ``^C``.

    Called from the SIGINT handlers. With echo off (a hidden prompt) nothing was printed.
    """
    if not _CURSOR.following:
        return
    try:
        import termios

        local = termios.tcgetattr(sys.__stderr__.fileno())[3]  # type: ignore[union-attr]
    except (ImportError, AttributeError, OSError, ValueError):
        return
    echoctl = getattr(termios, "ECHOCTL", 0)
    if local & termios.ECHO and local & echoctl:
        _CURSOR.mid_line = True


@contextmanager
def following_the_cursor() -> Iterator[None]:
    """For one run at a terminal: follow every write to stdout and stderr (see the top).

    Nothing changes anywhere else (a pipe, a file, a test's captured streams).
    """
    if not (_isatty(sys.stderr) and _isatty(sys.stdout)):
        yield
        return
    stdout, stderr = sys.stdout, sys.stderr
    sys.stdout = cast("TextIO", _Followed(stdout))
    sys.stderr = cast("TextIO", _Followed(stderr))
    _CURSOR.following, _CURSOR.mid_line = True, False
    try:
        yield
    finally:
        sys.stdout, sys.stderr = stdout, stderr
        _CURSOR.following = False


@contextmanager
def status(console: Console, text: str) -> Iterator[Status]:
    """``console.status(text)``, whose refresh thread leaves Ctrl-C to the main thread.

    A thread that does not block SIGINT may be the one the kernel hands it to, and
    then a main thread blocked in a socket read would not see it until the read ends
    (fluid_build/_threads.py)."""
    shown = console.status(text)
    with signals_stay_with_main():
        shown.start()
    try:
        yield shown
    finally:
        shown.stop()
