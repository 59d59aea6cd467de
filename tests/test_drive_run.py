"""The sync shell's run(): a plan that emits by mistake still has its cleanup run."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

from fluid_build.copilot.call.drive import Call, Emit, run


def test_run_returns_what_the_plan_returns_after_its_effects() -> None:
    def plan() -> Generator[Any, Any, int]:
        first = yield Call(lambda: 20)
        second = yield Call(lambda: 22)
        return int(first) + int(second)

    assert run(plan()) == 42


def test_an_effect_that_raises_is_thrown_into_the_plan() -> None:
    def fail() -> None:
        raise OSError("no route")

    def plan() -> Generator[Any, Any, str]:
        try:
            yield Call(fail)
        except OSError as exc:
            return f"handled {exc}"
        return "not reached"

    assert run(plan()) == "handled no route"


def test_a_plan_that_emits_is_refused_after_its_cleanup_ran() -> None:
    cleaned: list[str] = []

    def plan() -> Generator[Any, Any, None]:
        try:
            yield Emit("an event")
        finally:
            cleaned.append((yield Call(lambda: "closed")))

    with pytest.raises(AssertionError, match="emitted 'an event'"):
        run(plan())
    assert cleaned == ["closed"]
