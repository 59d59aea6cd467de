"""Confinement holds when symlinks change between the check and the open.

A ``WorkspacePath`` is checked when the call is validated; the body opens it
later. Here an attacker swaps a directory (or the file itself) for a symlink
to a secret outside the workspace in that gap: first once, deterministically,
then from a thread in a tight loop while the tool reads thousands of times.
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fluid_build.copilot.agents.errors import ToolValidationError
from fluid_build.copilot.llm.types import ToolCall
from fluid_build.copilot.loop import workspace as workspace_module
from fluid_build.copilot.loop.tools import (
    ToolOutcome,
    ToolRegistry,
    Workspace,
    WorkspacePath,
    current_workspace,
    forge_tool,
)
from fluid_build.forge.workspace_tools import discover_workspace, read_sample_schema

pytestmark = pytest.mark.skipif(os.name != "posix", reason="symlinks and openat")

INSIDE = "select 1 -- inside"
SECRET = "SECRET outside the workspace"
TRIES = 3_000


class Layout:
    """root/d/schema.sql inside; outside/schema.sql (and outside/more.sql) beyond the root."""

    def __init__(self, tmp: Path) -> None:
        self.root = tmp / "root"
        self.outside = tmp / "outside"
        (self.root / "d").mkdir(parents=True)
        self.outside.mkdir()
        (self.root / "d" / "schema.sql").write_text(INSIDE)
        (self.outside / "schema.sql").write_text(SECRET)
        (self.outside / "more.sql").write_text(SECRET)

    def swap_dir(self) -> None:
        """d becomes a symlink to the outside directory."""
        os.rename(self.root / "d", self.root / "d.real")
        os.symlink(self.outside, self.root / "d")

    def restore_dir(self) -> None:
        os.unlink(self.root / "d")
        os.rename(self.root / "d.real", self.root / "d")

    def swap_file(self) -> None:
        """d/schema.sql becomes a symlink to the outside file."""
        os.rename(self.root / "d" / "schema.sql", self.root / "d" / "schema.real")
        os.symlink(self.outside / "schema.sql", self.root / "d" / "schema.sql")

    def restore_file(self) -> None:
        os.unlink(self.root / "d" / "schema.sql")
        os.rename(self.root / "d" / "schema.real", self.root / "d" / "schema.sql")


@pytest.fixture
def layout(tmp_path: Path) -> Layout:
    return Layout(tmp_path)


def run(registry: ToolRegistry, name: str, **arguments: Any) -> ToolOutcome:
    return registry.run(ToolCall(id="c", name=name, arguments=arguments))


def shown(outcome: ToolOutcome) -> str:
    return f"{outcome.value!r} {outcome.exception!r}"


# -- one swap, exactly between validation and open ------------------------------------


def after_a_swap(swap: Callable[[], None], body: Callable[..., Any]) -> Callable[..., Any]:
    """A tool body that lets the attacker move first, after the arguments were validated."""

    def wrapped(path: WorkspacePath) -> Any:
        swap()
        return body(path=path)

    return wrapped


@pytest.fixture(params=[True, False], ids=["openat", "open-then-verify"])
def openat(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    monkeypatch.setattr(workspace_module, "_HAVE_OPENAT", request.param)
    return bool(request.param)


@pytest.mark.parametrize("what", ["dir", "file"])
def test_a_swap_after_validation_is_refused_by_the_open(
    layout: Layout, what: str, openat: bool
) -> None:
    swap = layout.swap_dir if what == "dir" else layout.swap_file
    tool = forge_tool(
        after_a_swap(swap, read_sample_schema.fn),
        name="read_after_swap",
        description="Read after a swap.",
    )
    with ToolRegistry([tool], workspace=layout.root) as registry:
        outcome = run(registry, "read_after_swap", path="d/schema.sql")
    assert outcome.value is None
    assert outcome.error is not None
    assert outcome.error.code == "tool.workspace_violation", shown(outcome)
    assert "symbolic link appeared on the path after it was checked" in outcome.error.reason
    assert SECRET not in shown(outcome)


def test_discover_never_lists_through_a_swapped_directory(layout: Layout) -> None:
    tool = forge_tool(
        after_a_swap(layout.swap_dir, lambda path: discover_workspace.fn(directory=path)),
        name="discover_after_swap",
        description="List after a swap.",
    )
    with ToolRegistry([tool], workspace=layout.root) as registry:
        outcome = run(registry, "discover_after_swap", path="d")
    assert outcome.error is not None
    assert outcome.error.code == "tool.workspace_violation"
    # A directory swapped while the walk is under way is skipped, never followed.
    with ToolRegistry([discover_workspace], workspace=layout.root) as registry:
        assert run(registry, "discover_workspace").value == ["d.real/schema.sql"]


def test_a_replaced_root_is_refused(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    workspace = Workspace(layout.root)
    os.rename(layout.root, tmp_path / "moved")
    os.symlink(layout.outside, layout.root)
    with pytest.raises(ToolValidationError, match="the workspace root was replaced"):
        workspace.open("schema.sql")


def test_open_takes_relative_strings_and_resolved_paths(layout: Layout) -> None:
    workspace = Workspace(layout.root)
    for path in ["d/schema.sql", "./d//schema.sql", "d\\schema.sql", layout.root / "d/schema.sql"]:
        fd = workspace.open(path)
        try:
            assert os.read(fd, 100).decode() == INSIDE
        finally:
            os.close(fd)
    for bad in ["../outside/schema.sql", "/etc/passwd", "", layout.outside / "schema.sql"]:
        with pytest.raises(ToolValidationError):
            workspace.open(bad)
    # open() follows no symlink at all, even one that stays inside: resolve() first.
    (layout.root / "alias").symlink_to(layout.root / "d")
    with pytest.raises(ToolValidationError):
        workspace.open("alias/schema.sql")
    fd = workspace.open(workspace.resolve("alias/schema.sql"))
    os.close(fd)
    fd = workspace.open("d", directory=True)
    os.close(fd)
    assert workspace.relative(layout.root / "d" / "schema.sql") == "d/schema.sql"


def test_current_workspace_outside_a_call_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="inside a tool call"):
        current_workspace()


# -- a swapping thread, thousands of reads --------------------------------------------


@pytest.fixture
def swapping(layout: Layout, request: pytest.FixtureRequest) -> Iterator[Counter[str]]:
    """A thread swapping d (or d/schema.sql) in and out of a symlink as fast as it can."""
    what = request.param
    swap, restore = (
        (layout.swap_dir, layout.restore_dir)
        if what == "dir"
        else (layout.swap_file, layout.restore_file)
    )
    stop = threading.Event()
    swaps: Counter[str] = Counter()

    def loop() -> None:
        while not stop.is_set():
            swap()
            restore()
            swaps["swaps"] += 1

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield swaps
    finally:
        stop.set()
        thread.join(10)
    assert not thread.is_alive()


@pytest.mark.parametrize("swapping", ["dir", "file"], indirect=True)
def test_a_swapping_symlink_never_leads_a_read_outside(
    layout: Layout, swapping: Counter[str]
) -> None:
    seen: Counter[str] = Counter()
    with ToolRegistry([read_sample_schema, discover_workspace], workspace=layout.root) as reg:
        for i in range(TRIES):
            if i % 10:
                outcome = run(reg, "read_sample_schema", path="d/schema.sql")
            else:
                outcome = run(reg, "discover_workspace", directory="d")
            text = shown(outcome)
            if SECRET in text or "more.sql" in text:
                seen["escaped"] += 1
            elif outcome.ok:
                seen["read inside"] += 1
            else:
                assert outcome.error is not None
                seen[outcome.error.code] += 1
    print(f"\n{TRIES} tries while {swapping['swaps']} swaps ran: {dict(seen)}")
    assert seen["escaped"] == 0
    assert seen["read inside"] > 0
    assert swapping["swaps"] > 0
