"""What the ``fluid`` command prints when a command fails: what happened, and what to do.

A typed error becomes two lines on standard error::

    fluid: RateLimitError [llm.rate_limited]: openai (gpt-4o) answered HTTP 429: ...
    hint: wait until 14:03:12 UTC (62 s) and run again; if it keeps happening, ...

The first says the class, the reason code and what happened; the second the
next step, in terms a shell can act on (a flag, an environment variable, a
``fluid`` command, a wait until a clock time). Another error prints its class
and message, then a hint where the exit code says what to fix (the intent
file, the output directory), or the bug line where nothing explains it.
Every line is one line, redacted, and names flags and variables, never the
Python argument a library caller would pass instead (``(provider= in Python)``
is left out).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import Final

import click

from fluid_build._redact import one_line, redact

__all__ = ["BUG_LINE", "OperatorMessage", "describe", "render_error", "report_error"]

#: Printed after an error fluid_build did not expect: a bug, whatever it says.
BUG_LINE: Final = "fluid: this looks like a bug in fluid_build; please report it."

# Hints for failures that are not typed errors, by exit code (docs/cli.md).
_HINTS_BY_EXIT: Final = {
    3: "fix the file named above (or give another path) and run again.",
    4: "remove the symbolic link named above, or choose another --out, and run again.",
    30: "if the change is intended, record the run again (`fluid forge --record FILE`); "
    "otherwise replay the cassette with the intent, version and options (--temperature, "
    "--max-output-tokens, --seed) it was recorded with.",
}


@dataclass(frozen=True, slots=True)
class OperatorMessage:
    """One failure as the operator sees it.

    ``headline`` is ``"fluid: <Class> [<code>]: <what happened>"`` (no code for
    an error that has none); ``hint`` the next step, or None; ``bug`` whether
    the failure is unexpected (exit code 1).
    """

    headline: str
    hint: str | None
    code: str | None
    bug: bool

    def lines(self) -> list[str]:
        """The lines printed on standard error, in order."""
        out = [self.headline]
        if self.hint:
            out.append(f"hint: {self.hint}")
        if self.bug:
            out.append(BUG_LINE)
        return out


def _sentence_start(text: str) -> str:
    """``"Wait until ..."`` as it reads after ``hint:``; a name such as ``FLUID_...`` is kept."""
    if len(text) > 1 and text[0].isupper() and text[1].islower():
        return text[0].lower() + text[1:]
    return text


def _clean(text: str) -> str:
    """One redacted line, without the asides that name a Python argument: the
    operator of a command cannot pass one, so the flag or variable beside it is the advice."""
    from fluid_build.copilot.agents.errors import without_python_asides

    return one_line(without_python_asides(redact(text)))


def describe(exc: BaseException, *, now: float | None = None) -> OperatorMessage:
    """The operator's view of ``exc``; ``now`` (Unix time) anchors a wait's clock time."""
    from fluid_build.cli.exit_codes import EXIT_CODES, exit_code_for
    from fluid_build.copilot.agents.errors import AgentExecutionError

    name = type(exc).__name__
    exit_code = exit_code_for(exc)
    if isinstance(exc, AgentExecutionError):
        return OperatorMessage(
            headline=f"fluid: {name} [{exc.code}]: {_clean(exc.summary)}",
            hint=_clean(_sentence_start(exc.hint(now=now))),
            code=exc.code,
            bug=False,
        )
    code = _own_code(exc)
    hint = _own_hint(exc, now) or _HINTS_BY_EXIT.get(exit_code)
    shown = f"{name} [{code}]" if code else name
    return OperatorMessage(
        headline=f"fluid: {shown}: {_clean(str(exc))}",
        hint=_clean(_sentence_start(hint)) if hint else None,
        code=code,
        bug=exit_code == EXIT_CODES["internal"],
    )


def _own_code(exc: BaseException) -> str | None:
    """The reason code an error that is not typed carries (``code``, or in ``to_dict()``)."""
    code = getattr(exc, "code", None)
    if code is None:
        to_dict = getattr(exc, "to_dict", None)
        try:
            payload = to_dict() if callable(to_dict) else None
        except Exception:  # noqa: BLE001 - a code must never hide the error itself
            payload = None
        code = payload.get("code") if isinstance(payload, dict) else None
    return code if isinstance(code, str) and code else None


def _own_hint(exc: BaseException, now: float | None) -> str | None:
    """A hint the exception offers itself (``hint(now=)`` or ``action``), if any."""
    hint = getattr(exc, "hint", None)
    if callable(hint):
        try:
            value = hint(now=now)
        except Exception:  # noqa: BLE001 - a hint must never hide the error itself
            return None
        return value if isinstance(value, str) and value else None
    if isinstance(hint, str) and hint:
        return hint
    action = getattr(exc, "action", None)
    return action if isinstance(action, str) and action else None


def render_error(exc: BaseException, *, now: float | None = None) -> list[str]:
    """The lines ``fluid`` prints on standard error for ``exc``: what happened, then the hint."""
    return describe(exc, now=now).lines()


def report_error(exc: BaseException, *, as_json: bool = False) -> int:
    """Print the operator message for ``exc`` (or its JSON) and return the exit code.

    The message is the class, the reason code and what happened, then a ``hint:``
    line; the JSON carries the hint too, and its ``message`` names flags and
    variables as the lines do (no ``(provider= in Python)``).
    """
    from fluid_build.cli.exit_codes import exit_code_for
    from fluid_build.copilot.agents.errors import without_python_asides

    code = exit_code_for(exc)
    message = describe(exc)
    if as_json:
        to_dict = getattr(exc, "to_dict", None)
        payload = to_dict() if callable(to_dict) else None
        if not isinstance(payload, dict):
            payload = {"error": type(exc).__name__, "message": redact(str(exc))}
        if isinstance(payload.get("message"), str):
            payload["message"] = without_python_asides(payload["message"])
        payload["hint"] = message.hint
        click.echo(json.dumps({"ok": False, "exit_code": code, "error": payload}))
    else:
        for line in message.lines():
            click.echo(line, err=True)
    sys.stderr.flush()
    return code
