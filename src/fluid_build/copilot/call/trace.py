"""What the plan of a call asks of a trace, so the call never imports telemetry.

``copilot/telemetry.py`` (OpenTelemetry spans, loaded only when switched on)
sits above the call and implements this protocol with its ``CallTrace``; the
call's plan (``core.py``) knows a trace only through it. Imports run one way:
telemetry -> call, never back (``tests/test_architecture.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, TypeVar

if TYPE_CHECKING:
    from fluid_build.copilot.call.drive import Plan
    from fluid_build.copilot.call.envelope import RetryEvent

__all__ = ["AttemptTrace"]

R = TypeVar("R")


class AttemptTrace(Protocol):
    """The trace of one call, as its plan uses it: around each attempt, told of each wait."""

    def attempts(
        self, attempt: Callable[[], Plan[R]], provider: str, model: str, *, holds: bool = False
    ) -> Callable[[], Plan[R]]:
        """``attempt`` (the envelope's unit of retry), traced each time it runs.

        ``holds``: a stream's attempt returns at its first event; the trace of
        the one that does stays open until the stream ends.
        """
        ...

    def waited(self, event: RetryEvent) -> None:
        """The envelope's retry hook: one wait before the next attempt."""
        ...

    def cut(self, error: BaseException) -> None:
        """The held attempt's stream was cut by ``error`` and the call goes on (a restart):
        its trace ends, failed, before the next attempt holds one."""
        ...
