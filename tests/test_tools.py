"""The tool registry: schemas from signatures, refusals, confinement, timeouts, concurrency."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field, field_validator

from fluid_build._threads import DaemonPool
from fluid_build.copilot.agents.errors import AgentExecutionError, ToolValidationError
from fluid_build.copilot.llm.types import ToolCall, ToolSpec
from fluid_build.copilot.loop.declare import _parse_docstring
from fluid_build.copilot.loop.tools import (
    Tool,
    ToolOutcome,
    ToolRegistry,
    Workspace,
    WorkspacePath,
    _plan_batches,
    forge_tool,
)

MODES = ["sync", "async"]
SECRETS = ["sk-proj-Zq8vT3mXk2LpR7wN4bYc9dHf", "correct-horse-battery-staple"]


class Point(BaseModel):
    x: int
    y: int = 0


class Touchy(BaseModel):
    v: int

    @field_validator("v")
    @classmethod
    def broken(cls, v: int) -> int:
        raise RuntimeError("a bug in the validator")


@forge_tool(read_only=True, timeout=5)
def read_file(path: WorkspacePath, limit: int = 100) -> str:
    """Read a text file from the workspace.

    Lines past ``limit`` are dropped.

    Args:
        path: The file to read.
        limit: How many lines to return,
            counted from the top.
    """
    return "\n".join(path.read_text().splitlines()[:limit])


@forge_tool
def add(a: int, b: int = 2) -> int:
    """Add two numbers."""
    return a + b


@forge_tool(name="fetch", description="Fetch a thing by key.", timeout=1.5)
async def fetch_thing(key: str, tags: list[str] | None = None) -> dict[str, Any]:
    """This docstring loses to description=."""
    return {"key": key, "tags": tags}


@forge_tool
def move(p: Point, paths: list[WorkspacePath] | None = None) -> Point:
    """Move a point."""
    return Point(x=p.x + 1, y=p.y)


@forge_tool
def touchy(t: Touchy) -> int:
    """Trip over a buggy validator."""
    return t.v


def call(name: str, call_id: str = "c1", /, **arguments: Any) -> ToolCall:
    return ToolCall(id=call_id, name=name, arguments=arguments)


def run_in(mode: str, registry: ToolRegistry, tool_call: ToolCall) -> ToolOutcome:
    if mode == "sync":
        return registry.run(tool_call)
    return asyncio.run(registry.arun(tool_call))


def run_all(
    mode: str, registry: ToolRegistry, calls: list[ToolCall], **kw: Any
) -> list[ToolOutcome]:
    if mode == "sync":
        return registry.run_many(calls, **kw)
    return asyncio.run(registry.arun_many(calls, **kw))


def shown(error: BaseException) -> str:
    """Everything an error shows: message, repr and its dict."""
    text = f"{error}\n{error!r}"
    if isinstance(error, AgentExecutionError):
        text += "\n" + json.dumps(error.to_dict())
    return text


@pytest.fixture
def root(tmp_path: Path) -> Path:
    workspace = tmp_path / "root"
    (workspace / "sub").mkdir(parents=True)
    (workspace / "notes.txt").write_text("one\ntwo\nthree\n")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.txt").write_text("top secret")
    return workspace


@pytest.fixture
def registry(root: Path) -> Iterator[ToolRegistry]:
    with ToolRegistry([read_file, add, fetch_thing, move, touchy], workspace=root) as reg:
        yield reg


# -- the decorator --------------------------------------------------------------


def test_schema_comes_from_the_signature() -> None:
    assert isinstance(add, Tool)
    assert (add.name, add.description, add.read_only, add.timeout) == (
        "add",
        "Add two numbers.",
        False,
        30.0,
    )
    assert add.parameters == {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer", "default": 2}},
        "required": ["a"],
        "additionalProperties": False,
    }


def test_docstring_gives_the_description_and_parameter_help() -> None:
    assert read_file.description == "Read a text file from the workspace."
    assert (read_file.read_only, read_file.timeout) == (True, 5.0)
    assert read_file.parameters["properties"] == {
        "path": {"type": "string", "description": "The file to read."},
        "limit": {
            "type": "integer",
            "default": 100,
            "description": "How many lines to return, counted from the top.",
        },
    }
    assert read_file.parameters["required"] == ["path"]


def test_decorator_with_arguments_on_an_async_function() -> None:
    assert fetch_thing.is_async
    assert fetch_thing.spec() == ToolSpec("fetch", "Fetch a thing by key.", fetch_thing.parameters)
    assert fetch_thing.timeout == 1.5
    assert fetch_thing.parameters["required"] == ["key"]
    assert fetch_thing.parameters["properties"]["tags"]["default"] is None


def test_called_with_the_function_and_options() -> None:
    def slow(seconds: float) -> None:
        """Wait a while."""

    tool = forge_tool(slow, read_only=True, timeout=2)
    assert (tool.name, tool.read_only, tool.timeout, tool.fn) == ("slow", True, 2.0, slow)


def test_field_description_beats_the_docstring_and_awkward_names_work() -> None:
    def shape(
        schema: Annotated[str, Field(description="From Field.")],
        json: int = 1,
        _hidden: bool = False,
    ) -> None:
        """Awkward names.

        Args:
            schema: From the docstring.
            json: Shadows BaseModel.json.
        """

    tool = forge_tool(shape)
    props = tool.parameters["properties"]
    assert props["schema"]["description"] == "From Field."
    assert props["json"]["description"] == "Shadows BaseModel.json."
    with ToolRegistry([tool]) as reg:
        assert reg.validate("shape", {"schema": "s", "_hidden": True}) == {
            "schema": "s",
            "json": 1,
            "_hidden": True,
        }


def test_nested_models_are_validated_into_instances(registry: ToolRegistry) -> None:
    assert "Point" in move.parameters["$defs"]
    kwargs = registry.validate("move", {"p": {"x": 1}})
    assert kwargs == {"p": Point(x=1, y=0), "paths": None}


@pytest.mark.parametrize(
    ("source", "error", "text"),
    [
        ("def f(x): 'Doc.'", TypeError, "needs a type annotation"),
        ("def f(*xs: int) -> None: 'Doc.'", TypeError, "passable by keyword"),
        ("def f(**kw: int) -> None: 'Doc.'", TypeError, "passable by keyword"),
        ("def f(x: int, /) -> None: 'Doc.'", TypeError, "passable by keyword"),
        ("def f(x: int) -> None: pass", ValueError, "docstring or description="),
        ("f = lambda: None", ValueError, "pass name="),
        ("def f(x: int = Field(alias='y')) -> None: 'Doc.'", TypeError, "alias"),
    ],
)
def test_unusable_functions_are_refused_at_declaration(
    source: str, error: type[Exception], text: str
) -> None:
    namespace: dict[str, Any] = {"Annotated": Annotated, "Field": Field}
    exec(source, namespace)  # noqa: S102 - small fixed snippets
    with pytest.raises(error, match=text):
        forge_tool(namespace["f"])


@pytest.mark.parametrize("timeout", [0, -1, float("inf"), float("nan")])
def test_timeout_must_be_positive_and_finite(timeout: float) -> None:
    with pytest.raises(ValueError, match="timeout"):
        forge_tool(timeout=timeout)(add.fn)


def test_docstring_parser_reads_google_style_args() -> None:
    doc = """Summary line
    continues here.

    Body text.

    Args:
        first (int): One.
        second: Two,
            and more.
        empty:

    Returns:
        nothing: not a parameter.
    """
    assert _parse_docstring(doc) == (
        "Summary line continues here.",
        {"first": "One.", "second": "Two, and more."},
    )


# -- the registry ---------------------------------------------------------------


def test_registry_wraps_plain_callables_and_sorts(root: Path) -> None:
    def zeta() -> str:
        """Last."""
        return "z"

    with ToolRegistry([zeta, add, read_file], workspace=str(root)) as reg:
        assert reg.names == ["add", "read_file", "zeta"]
        assert [spec.name for spec in reg.specs()] == ["add", "read_file", "zeta"]
        assert reg.workspace is not None
        assert reg.workspace.root == root.resolve()


def test_duplicate_names_are_refused() -> None:
    def add(x: int) -> int:
        """Another add."""
        return x

    with pytest.raises(ValueError, match="'add'"):
        ToolRegistry([forge_tool(add), globals()["add"]])


def test_workspace_paths_need_a_workspace() -> None:
    with pytest.raises(ValueError, match="read_file"):
        ToolRegistry([read_file])


def test_workspace_root_must_be_a_directory(tmp_path: Path) -> None:
    with pytest.raises(NotADirectoryError):
        Workspace(tmp_path / "missing")


# -- validation -----------------------------------------------------------------


def refusal(registry: ToolRegistry, name: str, arguments: dict[str, Any]) -> ToolValidationError:
    with pytest.raises(ToolValidationError) as caught:
        registry.validate(name, arguments)
    error = caught.value
    assert error.details["valid_next_actions"] == registry.names
    assert error.tool_name == name
    return error


def test_validate_returns_confined_paths_and_defaults(registry: ToolRegistry, root: Path) -> None:
    assert registry.validate("read_file", {"path": "notes.txt"}) == {
        "path": root.resolve() / "notes.txt",
        "limit": 100,
    }


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ({"a": "three"}, "a: Input should be a valid integer"),
        ({"a": [1]}, "a: Input should be a valid integer"),
        ({"b": 1}, "a: Field required"),
        ({"a": 1, "bogus": 2}, "bogus: Extra inputs are not permitted"),
    ],
)
def test_bad_arguments_name_the_field_and_the_expectation(
    registry: ToolRegistry, arguments: dict[str, Any], expected: str
) -> None:
    error = refusal(registry, "add", arguments)
    assert error.code == "tool.invalid_input"
    assert expected in error.reason
    assert error.details["errors"]


def test_unknown_tool_lists_the_real_ones(registry: ToolRegistry) -> None:
    error = refusal(registry, "delete_everything", {})
    assert error.code == "tool.unknown_tool"
    for name in registry.names:
        assert name in error.reason


@pytest.mark.parametrize("secret", SECRETS)
def test_refusals_never_quote_the_offending_value(registry: ToolRegistry, secret: str) -> None:
    for name, arguments in [
        ("add", {"a": secret}),
        ("add", {"a": {"nested": [secret]}}),
        ("move", {"p": {"x": secret}}),
        ("read_file", {"path": f"../{secret}"}),
        ("nope", {"a": secret}),
    ]:
        error = refusal(registry, name, arguments)
        assert secret not in shown(error)
        assert error.tool_args == {key: type(value).__name__ for key, value in arguments.items()}


def test_paths_are_refused_as_workspace_violations(registry: ToolRegistry, root: Path) -> None:
    error = refusal(registry, "read_file", {"path": "../outside/secret.txt", "limit": "x"})
    assert error.code == "tool.workspace_violation"
    assert "path: path escapes the workspace" in error.reason
    assert "limit: Input should be a valid integer" in error.reason
    assert str(root) not in shown(error)
    nested = refusal(registry, "move", {"p": {"x": 1}, "paths": ["ok", "/etc/passwd"]})
    assert nested.code == "tool.workspace_violation"
    assert "paths.1:" in nested.reason


# -- the workspace --------------------------------------------------------------


@pytest.mark.parametrize(
    "relative",
    [
        "",
        "..",
        "../x",
        "a/../../x",
        "sub/..",
        "/etc/passwd",
        "//server/share",
        "\\\\server\\share\\x",
        "\\abs",
        "~",
        "~/x",
        "~root/.ssh",
        "a\x00b",
        "..\\..\\etc",
        "C:\\Windows",
        "c:/x",
        "C:x",
        "\ud800",
    ],
)
def test_escapes_are_refused_without_naming_the_root(root: Path, relative: str) -> None:
    workspace = Workspace(root)
    with pytest.raises(ToolValidationError) as caught:
        workspace.resolve(relative)
    error = caught.value
    assert error.code == "tool.workspace_violation"
    assert error.reason.startswith("path escapes the workspace")
    text = shown(error)
    assert str(workspace.root) not in text
    home = str(Path.home())
    if len(home) > 1:
        assert home not in text


def test_an_absolute_path_into_the_root_is_still_refused(root: Path) -> None:
    with pytest.raises(ToolValidationError):
        Workspace(root).resolve(str(root / "notes.txt"))


def test_symlinks_that_leave_the_root_are_refused(root: Path) -> None:
    outside = root.parent / "outside"
    (root / "link").symlink_to(outside / "secret.txt")
    (root / "sub" / "door").symlink_to(outside, target_is_directory=True)
    (root / "dangling").symlink_to(outside / "not-yet")
    workspace = Workspace(root)
    for relative in ["link", "sub/door", "sub/door/secret.txt", "sub/door/new.txt", "dangling"]:
        with pytest.raises(ToolValidationError, match="symbolic link"):
            workspace.resolve(relative)


def test_paths_inside_resolve_even_through_inner_symlinks(root: Path) -> None:
    (root / "alias").symlink_to(root / "sub", target_is_directory=True)
    workspace = Workspace(root)
    real = workspace.root
    assert workspace.resolve("alias/file.txt") == real / "sub" / "file.txt"
    assert workspace.resolve("new/dir/file.txt") == real / "new" / "dir" / "file.txt"
    assert workspace.resolve("./notes.txt") == real / "notes.txt"
    assert workspace.resolve("sub\\x.txt") == real / "sub" / "x.txt"
    assert workspace.resolve(".") == real
    assert workspace.resolve("~notatilde"[1:]) == real / "notatilde"


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("sandbox")
    root = base / "root"
    (root / "sub").mkdir(parents=True)
    (base / "outside").mkdir()
    (root / "link").symlink_to(base / "outside", target_is_directory=True)
    (root / "sub" / "inner").symlink_to(base / "outside", target_is_directory=True)
    (root / "up").symlink_to("..", target_is_directory=True)
    (root / "alias").symlink_to(root / "sub", target_is_directory=True)
    (root / "loop").symlink_to(root / "loop")
    return root


_PIECES = ["/", "..", ".", "~", "\\", "\x00", "a", "sub", "link", "inner", "up", "alias", "loop"]
path_strings = st.one_of(
    st.text(),
    st.lists(st.sampled_from([*_PIECES, "C:", "é", "\ud800", " "]) | st.text(max_size=3)).map(
        "".join
    ),
)


@settings(deadline=None)
@given(relative=path_strings)
def test_resolve_stays_inside_or_refuses(sandbox: Path, relative: str) -> None:
    workspace = Workspace(sandbox)
    outcome: Path | ToolValidationError
    try:
        outcome = workspace.resolve(relative)
    except ToolValidationError as exc:
        outcome = exc
    if isinstance(outcome, ToolValidationError):
        assert outcome.code == "tool.workspace_violation"
    else:
        assert Path(os.path.realpath(outcome)).is_relative_to(workspace.root)


# -- execution ------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_success_passes_the_value_through(mode: str, registry: ToolRegistry) -> None:
    outcome = run_in(mode, registry, call("read_file", path="notes.txt", limit=2))
    assert outcome.ok
    assert (outcome.call_id, outcome.name, outcome.value) == ("c1", "read_file", "one\ntwo")
    assert outcome.seconds >= 0
    fetched = run_in(mode, registry, call("fetch", key="k"))
    assert fetched.value == {"key": "k", "tags": None}


@pytest.mark.parametrize("mode", MODES)
def test_refusals_come_back_as_outcomes(mode: str, registry: ToolRegistry) -> None:
    outcome = run_in(mode, registry, call("add", a="x"))
    assert not outcome.ok
    assert isinstance(outcome.error, ToolValidationError)
    assert outcome.error.code == "tool.invalid_input"
    assert outcome.exception is None


@pytest.mark.parametrize("mode", MODES)
def test_a_raising_body_shows_only_its_class(mode: str) -> None:
    sentinel = ValueError("cannot open /home/alice/secret/config.yml")

    def crash() -> None:
        """Fail."""
        raise sentinel

    async def acrash() -> None:
        """Fail, asynchronously."""
        raise sentinel

    with ToolRegistry([crash, acrash]) as reg:
        for name in ["crash", "acrash"]:
            outcome = run_in(mode, reg, call(name))
            assert outcome.error is not None
            assert outcome.error.code == "tool.execution_error"
            assert outcome.error.details == {
                "tool": name,
                "exception": "ValueError",
                "valid_next_actions": ["acrash", "crash"],
            }
            assert outcome.exception is sentinel
            assert "/home/alice" not in shown(outcome.error)


@pytest.mark.parametrize("mode", MODES)
def test_a_broken_validator_fails_the_tool_not_the_loop(mode: str, registry: ToolRegistry) -> None:
    outcome = run_in(mode, registry, call("touchy", t={"v": 1}))
    assert outcome.error is not None
    assert outcome.error.code == "tool.execution_error"
    assert isinstance(outcome.exception, RuntimeError)


@pytest.mark.parametrize("mode", MODES)
def test_a_body_confining_its_own_path_is_a_refusal(mode: str, root: Path) -> None:
    workspace = Workspace(root)

    def follow(name: str) -> str:
        """Open a path named inside a file."""
        return workspace.resolve(name).name

    with ToolRegistry([follow], workspace=workspace) as reg:
        outcome = run_in(mode, reg, call("follow", name="../etc/passwd"))
    assert outcome.error is not None
    assert outcome.error.code == "tool.workspace_violation"
    assert outcome.error.details["valid_next_actions"] == ["follow"]


@pytest.mark.parametrize("mode", MODES)
def test_a_blocking_sync_body_times_out_at_the_deadline(mode: str) -> None:
    release, finished = threading.Event(), threading.Event()

    def stuck() -> str:
        """Block until released."""
        release.wait(5)
        finished.set()
        return "late"

    with ToolRegistry([forge_tool(stuck, timeout=0.05)]) as reg:
        try:
            outcome = run_in(mode, reg, call("stuck"))
        finally:
            release.set()
    assert finished.wait(5)  # the orphaned thread ran to its end in the background
    assert outcome.error is not None
    assert outcome.error.code == "tool.timeout"
    assert outcome.error.details["timeout_seconds"] == 0.05
    assert outcome.error.details["started"] is True
    assert outcome.value is None
    assert 0.04 <= outcome.seconds < 1.0


def test_an_async_body_ignoring_cancellation_still_times_out() -> None:
    async def scenario() -> tuple[ToolOutcome, int, str]:
        release, done = asyncio.Event(), asyncio.Event()
        cancellations = 0

        async def stubborn() -> str:
            """Refuse to stop."""
            nonlocal cancellations
            while not release.is_set():
                try:
                    await release.wait()
                except asyncio.CancelledError:
                    cancellations += 1
            done.set()
            return "late"

        with ToolRegistry([forge_tool(stubborn, timeout=0.05)]) as reg:
            outcome = await reg.arun(call("stubborn"))
            still_running = "running" if not done.is_set() else "finished"
            release.set()
            await done.wait()
        return outcome, cancellations, still_running

    outcome, cancellations, state = asyncio.run(scenario())
    assert outcome.error is not None
    assert outcome.error.code == "tool.timeout"
    assert 0.04 <= outcome.seconds < 1.0
    assert cancellations == 1
    assert state == "running"


def test_an_async_body_times_out_under_sync_run() -> None:
    release = threading.Event()

    async def slow() -> str:
        """Wait in a thread."""
        await asyncio.to_thread(release.wait, 5)
        return "late"

    with ToolRegistry([forge_tool(slow, timeout=0.05)]) as reg:
        try:
            outcome = reg.run(call("slow"))
        finally:
            release.set()
    assert outcome.error is not None
    assert outcome.error.code == "tool.timeout"


def test_a_queued_call_that_times_out_never_runs_late() -> None:
    release, ran = threading.Event(), threading.Event()

    def stuck() -> None:
        """Hold the only worker."""
        release.wait(5)

    def quick() -> None:
        """Would run if it ever got a worker."""
        ran.set()

    def probe() -> str:
        """Runs after anything queued before it."""
        return "drained"

    async def both(reg: ToolRegistry) -> list[ToolOutcome]:
        # quick is queued behind stuck on the only worker and gives up first.
        return list(await asyncio.gather(reg.arun(call("stuck")), reg.arun(call("quick"))))

    tools = [forge_tool(stuck, timeout=0.3), forge_tool(quick, timeout=0.05), probe]
    with ToolRegistry(tools, executor_workers=1) as reg:
        try:
            first, second = asyncio.run(both(reg))
        finally:
            release.set()
        assert reg.run(call("probe")).value == "drained"
    assert first.error is not None
    assert second.error is not None
    assert first.error.details["started"] is True
    assert second.error.details["started"] is False
    assert not ran.is_set()


def test_a_job_picked_up_after_its_deadline_is_cancelled_not_run() -> None:
    ran = threading.Event()
    pool = DaemonPool(1, "fluid-tool-test")
    try:
        future = pool.submit(ran.set, deadline=time.monotonic() - 1)
        concurrent.futures.wait([future], timeout=5)
        assert future.cancelled()
        assert pool.submit(lambda: "ok", deadline=time.monotonic() + 5).result(5) == "ok"
    finally:
        pool.shutdown()
    assert not ran.is_set()
    with pytest.raises(RuntimeError, match="closed"):
        pool.submit(lambda: None, deadline=time.monotonic() + 5)


@pytest.mark.parametrize("mode", MODES)
def test_blocked_bodies_never_exhaust_the_pool(mode: str) -> None:
    """More calls to a body that blocks than the pool has workers: each times out, and the
    pool replaces every abandoned worker, so later calls still run."""
    release = threading.Event()
    workers = 2

    def hang() -> str:
        """Block until released."""
        release.wait(30)
        return "late"

    def quick(n: int) -> int:
        """Answer at once."""
        return n

    tools = [forge_tool(hang, timeout=0.05, read_only=True), quick]
    with ToolRegistry(tools, executor_workers=workers) as reg:
        try:
            hung = [run_in(mode, reg, call("hang", str(i))) for i in range(workers + 3)]
            hung += run_all(mode, reg, [call("hang", f"b{i}") for i in range(2 * workers)])
            assert reg.abandoned_threads == len(hung)
            answers = run_all(mode, reg, [call("quick", str(n), n=n) for n in range(6)])
        finally:
            release.set()
        deadline = time.monotonic() + 10
        while reg.abandoned_threads and time.monotonic() < deadline:
            time.sleep(0.005)  # noqa: real-sleep - polls real threads ending on their own
        assert reg.abandoned_threads == 0
    for outcome in hung:
        assert outcome.error is not None
        assert outcome.error.code == "tool.timeout"
        assert outcome.error.details["started"] is True
        assert outcome.seconds < 1.0
    assert [a.value for a in answers] == list(range(6))


_HANGING_SCRIPT = """
import json, sys, threading, time
from fluid_build.copilot.loop.tools import ToolRegistry, forge_tool
from fluid_build.copilot.llm.types import ToolCall

forever = threading.Event()

def hang() -> str:
    \"\"\"Never return.\"\"\"
    forever.wait()
    return "never"

def quick() -> str:
    \"\"\"Answer at once.\"\"\"
    return "ok"

reg = ToolRegistry([forge_tool(hang, timeout=0.05), quick], executor_workers=2)
codes = [reg.run(ToolCall(id=str(i), name="hang", arguments={})).error.code for i in range(5)]
last = reg.run(ToolCall(id="q", name="quick", arguments={})).value
print(json.dumps({"codes": codes, "last": last, "abandoned": reg.abandoned_threads}))
if sys.argv[1] == "close":
    reg.close()
"""


@pytest.mark.parametrize("ending", ["close", "no-close"])
def test_a_process_with_abandoned_tool_threads_exits_promptly(ending: str) -> None:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", _HANGING_SCRIPT, ending],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    seconds = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report == {"codes": ["tool.timeout"] * 5, "last": "ok", "abandoned": 5}
    assert seconds < 5, f"the process took {seconds:.1f} s to exit"


class Abort(BaseException):
    """Not an Exception: must travel up, never into an outcome."""


@pytest.mark.parametrize(("mode", "kind"), [("sync", KeyboardInterrupt), ("async", Abort)])
def test_base_exceptions_are_not_swallowed(mode: str, kind: type[BaseException]) -> None:
    def interrupted() -> None:
        """Get interrupted."""
        raise kind

    async def ainterrupted() -> None:
        """Get interrupted, asynchronously."""
        raise kind

    with ToolRegistry([interrupted, ainterrupted]) as reg:
        for name in ["interrupted", "ainterrupted"]:
            with pytest.raises(kind):
                run_in(mode, reg, call(name))


# -- many calls -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("read_only", "width", "batches"),
    [
        ([], 4, []),
        ([True, True, True], 4, [[0, 1, 2]]),
        ([True, True, True], 2, [[0, 1], [2]]),
        ([False, False], 4, [[0], [1]]),
        ([True, True, False, True, True], 4, [[0, 1], [2], [3, 4]]),
        ([False, True, False], 4, [[0], [1], [2]]),
    ],
)
def test_batches_keep_order_and_isolate_writes(
    read_only: list[bool], width: int, batches: list[list[int]]
) -> None:
    assert [list(batch) for batch in _plan_batches(read_only, width)] == batches


@pytest.mark.parametrize("mode", MODES)
def test_read_only_calls_overlap_and_writes_run_alone(mode: str) -> None:
    log: list[str] = []
    lock = threading.Lock()
    barriers = {1: threading.Barrier(3, timeout=2), 2: threading.Barrier(2, timeout=2)}

    def note(event: str) -> None:
        with lock:
            log.append(event)

    def look(n: int, group: int) -> int:
        """Read, meeting the rest of the group (only possible if they overlap)."""
        note(f"start {n}")
        barriers[group].wait()
        note(f"end {n}")
        return n

    def write(n: int) -> int:
        """Write."""
        note(f"start {n}")
        note(f"end {n}")
        return n

    calls = [
        call("look", "a", n=0, group=1),
        call("look", "b", n=1, group=1),
        call("look", "c", n=2, group=1),
        call("write", "d", n=3),
        call("look", "e", n=4, group=2),
        call("look", "f", n=5, group=2),
    ]
    with ToolRegistry([forge_tool(look, read_only=True), write]) as reg:
        outcomes = run_all(mode, reg, calls)
    assert [o.call_id for o in outcomes] == list("abcdef")
    assert [o.value for o in outcomes] == [0, 1, 2, 3, 4, 5]
    assert max(log.index(f"end {n}") for n in (0, 1, 2)) < log.index("start 3")
    assert log.index("end 3") < min(log.index(f"start {n}") for n in (4, 5))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("workers", "max_concurrency"), [(4, 2), (2, 8)])
def test_concurrency_is_capped(mode: str, workers: int, max_concurrency: int) -> None:
    lock = threading.Lock()
    pair = threading.Barrier(2, timeout=2)
    active, peak = 0, 0

    def look(n: int) -> int:
        """Read in pairs."""
        nonlocal active, peak
        with lock:
            active += 1
            peak = max(peak, active)
        pair.wait()
        with lock:
            active -= 1
        return n

    tool = forge_tool(look, read_only=True)
    with ToolRegistry([tool], executor_workers=workers) as reg:
        calls = [call("look", str(n), n=n) for n in range(4)]
        outcomes = run_all(mode, reg, calls, max_concurrency=max_concurrency)
    assert [o.value for o in outcomes] == [0, 1, 2, 3]
    assert peak == 2


def test_max_concurrency_must_be_positive(registry: ToolRegistry) -> None:
    with pytest.raises(ValueError, match="max_concurrency"):
        registry.run_many([call("add", a=1)], max_concurrency=0)


def test_the_example_in_docs_tools_md_runs(tmp_path: Path) -> None:
    docs = Path(__file__).resolve().parent.parent / "docs" / "tools.md"
    example = docs.read_text().split("```python\n", 1)[1].split("```", 1)[0]
    (tmp_path / "project").mkdir()
    (tmp_path / "project" / "notes.txt").write_text("one\ntwo\nthree\n")
    (tmp_path / "outside.txt").write_text("secret")
    namespace: dict[str, Any] = {}
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        exec(compile(example, str(docs), "exec"), namespace)  # noqa: S102 - our own docs
    finally:
        os.chdir(cwd)
    registry: ToolRegistry = namespace["registry"]
    with registry:
        assert registry.run(call("read_file", path="notes.txt", limit=2)).value == "one\ntwo\n"
        (tmp_path / "project" / "link.txt").symlink_to(tmp_path / "outside.txt")
        refused = registry.run(call("read_file", path="link.txt"))
    assert refused.error is not None
    assert refused.error.code == "tool.workspace_violation"
