"""Tools the agent loop can call: declared with ``@forge_tool``, run by a ``ToolRegistry``.

A tool is a typed Python function. :func:`forge_tool` turns its signature into
a pydantic model: the JSON schema the model is shown, and the validator every
call's arguments pass through. :class:`ToolRegistry` validates a call, runs the
body under the tool's timeout and hands back a :class:`ToolOutcome`; a failing
tool never raises into the loop. Refusals and failures carry stable codes::

    ToolValidationError              refused before the body ran
        tool.unknown_tool            no tool has that name
        tool.invalid_input           the arguments do not match the schema
        tool.workspace_violation     a WorkspacePath leads outside the workspace
    AgentExecutionError              the body ran
        tool.execution_error         it raised; the model sees the class name only
        tool.timeout                 it did not finish in time

Every refusal and failure lists the callable tools in
``details["valid_next_actions"]``. Messages never quote argument values.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import errno
import functools
import inspect
import itertools
import math
import os
import queue
import re
import stat
import threading
import time
import typing
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Annotated, Any, Final, TypeAlias, overload

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    ValidationError,
    ValidationInfo,
    WithJsonSchema,
    create_model,
)
from pydantic.fields import FieldInfo
from pydantic.json_schema import GenerateJsonSchema
from pydantic_core import PydanticCustomError

from fluid_build._files import NotRegularFileError, open_regular
from fluid_build.copilot.agents.errors import AgentExecutionError, ToolValidationError
from fluid_build.copilot.llm.types import ToolCall, ToolSpec

__all__ = [
    "Tool",
    "ToolOutcome",
    "ToolRegistry",
    "Workspace",
    "WorkspacePath",
    "current_workspace",
    "forge_tool",
]

# -- the workspace ---------------------------------------------------------------

_DRIVE: Final = re.compile(r"[A-Za-z]:")
_ESCAPE: Final = "path escapes the workspace"


def _lexical_violation(relative: str) -> str | None:
    """Why ``relative`` can never name a file inside a root, judged on the text alone."""
    if not relative:
        return "the path is empty"
    if "\x00" in relative:
        return "the path contains a NUL byte"
    text = relative.replace("\\", "/")
    if text.startswith("/"):
        return "absolute paths are not allowed"
    if _DRIVE.match(text):
        return "drive letters are not allowed"
    parts = text.split("/")
    if parts[0].startswith("~"):
        return "home-directory paths are not allowed"
    if ".." in parts:
        return "'..' segments are not allowed"
    return None


def _violation(why: str) -> ToolValidationError:
    # The reason names the rule only: never the path, the root or $HOME.
    reason = f"{_ESCAPE}: {why}"
    return ToolValidationError(reason, code="tool.workspace_violation", reason=reason)


_O_DIRECTORY: Final = getattr(os, "O_DIRECTORY", 0)
_O_NOFOLLOW: Final = getattr(os, "O_NOFOLLOW", 0)
_O_CLOEXEC: Final = getattr(os, "O_CLOEXEC", 0)
#: Whether this platform can open relative to a directory descriptor without
#: following symlinks (``openat`` with ``O_NOFOLLOW``): every POSIX system.
_HAVE_OPENAT: Final = bool(_O_DIRECTORY and _O_NOFOLLOW) and os.open in os.supports_dir_fd
_SWAPPED: Final = "a symbolic link appeared on the path after it was checked"


class Workspace:
    """The directory that ``WorkspacePath`` arguments are confined to.

    ``root`` is resolved (symlinks included) once, here. Backslashes in a
    relative path are read as separators, so ``src\\main.py`` means
    ``src/main.py`` on every platform.

    :meth:`resolve` checks a path's text and where it leads now; :meth:`open`
    opens it so that nothing changed on disk since can lead it outside (see
    docs/tools.md).
    """

    __slots__ = ("_identity", "root")

    root: Path

    def __init__(self, root: str | os.PathLike[str]) -> None:
        resolved = Path(os.path.realpath(os.fspath(root)))
        if not resolved.is_dir():
            raise NotADirectoryError(f"workspace root is not a directory: {resolved}")
        self.root = resolved
        info = os.stat(resolved)
        self._identity = (info.st_dev, info.st_ino)

    def __repr__(self) -> str:
        return f"Workspace({str(self.root)!r})"

    def resolve(self, relative: str) -> Path:
        """The real path ``relative`` names inside the root.

        Refused with ``tool.workspace_violation``: empty strings, NUL bytes,
        absolute paths, drive letters and UNC names, ``~``, any ``..`` segment,
        and symlinks anywhere along the path that lead outside the root. A path
        that does not exist yet is fine when its existing part stays inside.
        """
        why = _lexical_violation(relative)
        if why is not None:
            raise _violation(why)
        try:
            os.fsencode(relative)
            real = Path(os.path.realpath(os.path.join(self.root, relative.replace("\\", "/"))))
        except (UnicodeError, ValueError, OSError):
            raise _violation("the path cannot be represented on this filesystem") from None
        if not real.is_relative_to(self.root):
            raise _violation("a symbolic link leads outside the workspace")
        return real

    # -- opening without following symlinks -----------------------------------

    def _parts(self, path: str | os.PathLike[str]) -> list[str]:
        """The components of ``path`` below the root: a relative string, or a resolved path."""
        if isinstance(path, str):
            why = _lexical_violation(path)
            if why is not None:
                raise _violation(why)
            text = path.replace("\\", "/")
        else:
            full = Path(os.fspath(path))
            if not full.is_relative_to(self.root):
                raise _violation("the path is not inside the workspace")
            text = full.relative_to(self.root).as_posix()
        parts = [part for part in text.split("/") if part not in ("", ".")]
        if ".." in parts:
            raise _violation("'..' segments are not allowed")
        return parts

    def relative(self, path: str | os.PathLike[str]) -> str:
        """How ``path`` (relative, or a resolved path inside the root) reads from the root."""
        return "/".join(self._parts(path)) or "."

    def _open_root(self) -> int:
        fd = os.open(self.root, os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC)
        info = os.fstat(fd)
        if (info.st_dev, info.st_ino) != self._identity:
            os.close(fd)
            raise _violation("the workspace root was replaced")
        return fd

    def open_at(self, dir_fd: int, name: str, *, directory: bool = False, shown: str = "") -> int:
        """Open one entry ``name`` of the open directory ``dir_fd``, never following a symlink.

        ``directory=True`` opens a directory (for ``os.scandir`` or the next
        step of a walk); otherwise a regular file, opened without blocking
        (a FIFO, device, socket or directory is a ``NotRegularFileError``).
        A symlink is refused with ``tool.workspace_violation``.
        """
        if not name or name in (".", "..") or "/" in name or "\x00" in name:
            raise _violation("not a single path component")
        try:
            if directory:
                return os.open(
                    name, os.O_RDONLY | _O_DIRECTORY | _O_NOFOLLOW | _O_CLOEXEC, dir_fd=dir_fd
                )
            return open_regular(name, name=shown or name, dir_fd=dir_fd, follow_symlinks=False)
        except NotRegularFileError as exc:
            if exc.kind == "a symbolic link":
                raise _violation(_SWAPPED) from None
            raise
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
                try:
                    mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
                except OSError:
                    raise exc from None
                if stat.S_ISLNK(mode):
                    raise _violation(_SWAPPED) from None
            raise

    def open(self, path: str | os.PathLike[str], *, directory: bool = False) -> int:
        """A read-only descriptor on ``path``, opened so that it cannot lead outside the root.

        ``path`` is relative to the root, or a path :meth:`resolve` returned.
        From a descriptor on the root (checked to be the same directory as
        when the workspace was built), each component is opened with
        ``O_NOFOLLOW`` relative to the one before. Symlinks are not followed:
        a path :meth:`resolve` returned has none, so one met here was swapped
        in after the check, and is refused with ``tool.workspace_violation``.
        A file must be a regular file, opened without blocking. The caller
        closes the descriptor.
        """
        parts = self._parts(path)
        shown = "/".join(parts) or "."
        if not _HAVE_OPENAT:
            return self._open_and_verify(parts, shown, directory=directory)
        if not parts and not directory:
            raise NotRegularFileError(".", "a directory")
        fd = self._open_root()
        try:
            for index, name in enumerate(parts):
                last = index == len(parts) - 1
                step = self.open_at(fd, name, directory=directory or not last, shown=shown)
                os.close(fd)
                fd = step
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _open_and_verify(self, parts: list[str], shown: str, *, directory: bool) -> int:
        """Where ``openat`` is missing: open, then check the real path of what was opened."""
        full = os.path.join(self.root, *parts)
        if directory:
            fd = os.open(full, os.O_RDONLY | _O_CLOEXEC)
        else:
            fd = open_regular(full, name=shown)
        try:
            real = os.path.realpath(full)
            if not Path(real).is_relative_to(self.root) or not os.path.samestat(
                os.fstat(fd), os.stat(real)
            ):
                raise _violation(_SWAPPED)
        except BaseException:
            os.close(fd)
            raise
        return fd


_CURRENT: Final[contextvars.ContextVar[Workspace | None]] = contextvars.ContextVar(
    "fluid_build.current_workspace", default=None
)


def current_workspace() -> Workspace:
    """The workspace of the registry running the current tool call.

    Inside a tool body this is the ``Workspace`` its ``WorkspacePath``
    arguments were confined to: open them with ``current_workspace().open(path)``
    so a symlink swapped in after validation cannot lead outside.
    """
    workspace = _CURRENT.get()
    if workspace is None:
        raise RuntimeError("no workspace: current_workspace() works inside a tool call only")
    return workspace


_WORKSPACE_KEY: Final = "fluid_build.workspace"


def _confine(value: object, info: ValidationInfo) -> Path:
    if not isinstance(value, str):
        raise PydanticCustomError("string_type", "Input should be a valid string")
    context = info.context if isinstance(info.context, Mapping) else {}
    workspace = context.get(_WORKSPACE_KEY)
    if not isinstance(workspace, Workspace):
        raise PydanticCustomError("workspace_violation", "no workspace is configured")
    try:
        return workspace.resolve(value)
    except ToolValidationError as exc:
        raise PydanticCustomError("workspace_violation", exc.reason) from None


_CONFINE: Final = PlainValidator(_confine, json_schema_input_type=str)

#: A tool parameter naming a path inside the workspace. The model sends a
#: relative string; the body receives the resolved, confined ``Path``.
WorkspacePath: TypeAlias = Annotated[
    Path,
    _CONFINE,
    WithJsonSchema({"type": "string", "description": "A path relative to the workspace root."}),
]


def _mentions_workspace(item: object, seen: set[int]) -> bool:
    """Whether a type, field or model takes a ``WorkspacePath`` anywhere inside."""
    if item is _CONFINE:
        return True
    if isinstance(item, FieldInfo):
        return _mentions_workspace(item.annotation, seen) or any(
            _mentions_workspace(m, seen) for m in item.metadata
        )
    if isinstance(item, type) and issubclass(item, BaseModel):
        if id(item) in seen:
            return False
        seen.add(id(item))
        return any(_mentions_workspace(f, seen) for f in item.model_fields.values())
    return any(_mentions_workspace(arg, seen) for arg in typing.get_args(item))


# -- declaring a tool -----------------------------------------------------------

_NAME: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")
_SECTION: Final = re.compile(r"(Args|Arguments|Parameters|Params):")
_ENTRY: Final = re.compile(r"(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)")
_MODEL_CONFIG: Final = ConfigDict(extra="forbid", validate_default=True, hide_input_in_errors=True)


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """The first paragraph as one line, and the ``Args:`` entries by parameter name."""
    lines = inspect.cleandoc(doc).splitlines()
    summary: list[str] = []
    for line in lines:
        if not line.strip() or _SECTION.fullmatch(line.strip()):
            break
        summary.append(line.strip())
    params: dict[str, list[str]] = {}
    inside, indent, current = False, -1, ""
    for line in lines:
        stripped = line.strip()
        if not line[:1].isspace() and stripped:
            inside, indent, current = bool(_SECTION.fullmatch(stripped)), -1, ""
            continue
        if not inside or not stripped:
            continue
        level = len(line) - len(line.lstrip())
        indent = level if indent < 0 else indent
        entry = _ENTRY.fullmatch(stripped) if level == indent else None
        if entry:
            current = entry.group(1)
            params[current] = [entry.group(2)]
        elif current:
            params[current].append(stripped)
    described = {name: " ".join(" ".join(words).split()) for name, words in params.items()}
    return " ".join(summary), {name: text for name, text in described.items() if text}


def _has_description(annotation: object, default: object) -> bool:
    if isinstance(default, FieldInfo) and default.description:
        return True
    metadata = getattr(annotation, "__metadata__", ())
    return any(isinstance(m, FieldInfo) and m.description for m in metadata)


def _input_model(
    fn: Callable[..., Any], tool_name: str, docs: Mapping[str, str]
) -> type[BaseModel]:
    """A pydantic model of ``fn``'s keyword arguments.

    Fields are stored under neutral names (``p0``, ``p1`` ...) with the
    parameter name as alias, so parameters may be called ``schema``, ``json``
    or ``_private`` without clashing with ``BaseModel``.
    """
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except NameError as exc:
        raise TypeError(f"tool {tool_name}: cannot resolve its annotations ({exc})") from exc
    fields: dict[str, Any] = {}
    names: dict[str, str] = {}
    for index, param in enumerate(inspect.signature(fn).parameters.values()):
        if param.kind not in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY):
            raise TypeError(
                f"tool {tool_name}: parameter {param.name} must be passable by keyword "
                "(no *args, **kwargs or positional-only parameters)"
            )
        if param.name not in hints:
            raise TypeError(f"tool {tool_name}: parameter {param.name} needs a type annotation")
        annotation = hints[param.name]
        default = ... if param.default is param.empty else param.default
        described = _has_description(annotation, default)
        extra = Field(alias=param.name)
        if not described and param.name in docs:
            extra = Field(alias=param.name, description=docs[param.name])
        fields[f"p{index}"] = (Annotated[annotation, extra], default)
        names[f"p{index}"] = param.name
    model: type[BaseModel] = create_model(
        f"{tool_name}_arguments",
        __config__=_MODEL_CONFIG,
        **fields,
    )
    for key, info in model.model_fields.items():
        if info.alias != names[key]:
            raise TypeError(f"tool {tool_name}: parameter {names[key]} must not set an alias")
    return model


class _ToolJsonSchema(GenerateJsonSchema):
    """Schemas without the auto-generated titles: they only cost the model tokens."""

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False


def _json_schema(model: type[BaseModel]) -> dict[str, Any]:
    schema = model.model_json_schema(schema_generator=_ToolJsonSchema)
    schema.pop("title", None)
    return schema


@dataclass(frozen=True)
class Tool:
    """A callable the model may ask for, with its JSON schema and limits.

    Build one with :func:`forge_tool`. ``fn`` is the body; ``input_model``
    validates its arguments and produced ``parameters``.
    """

    name: str
    description: str
    parameters: dict[str, Any]
    read_only: bool
    timeout: float
    fn: Callable[..., Any] = field(repr=False, kw_only=True)
    input_model: type[BaseModel] = field(repr=False, kw_only=True)

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)

    def spec(self) -> ToolSpec:
        """What the model is shown: name, description, parameter schema."""
        return ToolSpec(self.name, self.description, self.parameters)


def _build_tool(
    fn: Callable[..., Any],
    *,
    name: str | None,
    description: str | None,
    read_only: bool,
    timeout: float,
) -> Tool:
    tool_name: str = name or str(getattr(fn, "__name__", ""))
    if not _NAME.fullmatch(tool_name):
        raise ValueError(
            f"tool name {tool_name!r} must be 1-64 letters, digits, '_' or '-' (pass name=)"
        )
    if isinstance(timeout, bool) or not math.isfinite(timeout) or timeout <= 0:
        raise ValueError(f"tool {tool_name}: timeout must be a positive number of seconds")
    summary, docs = _parse_docstring(inspect.getdoc(fn) or "")
    text = " ".join((description or summary).split())
    if not text:
        raise ValueError(f"tool {tool_name}: give it a docstring or description=")
    model = _input_model(fn, tool_name, docs)
    return Tool(
        name=tool_name,
        description=text,
        parameters=_json_schema(model),
        read_only=read_only,
        timeout=float(timeout),
        fn=fn,
        input_model=model,
    )


@overload
def forge_tool(
    fn: Callable[..., Any],
    *,
    name: str | None = None,
    description: str | None = None,
    read_only: bool = False,
    timeout: float = 30.0,
) -> Tool: ...


@overload
def forge_tool(
    fn: None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    read_only: bool = False,
    timeout: float = 30.0,
) -> Callable[[Callable[..., Any]], Tool]: ...


def forge_tool(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    read_only: bool = False,
    timeout: float = 30.0,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Turn a typed function (sync or async) into a :class:`Tool`.

    Usable bare (``@forge_tool``) or with arguments
    (``@forge_tool(read_only=True, timeout=5)``). The description is
    ``description=`` or the docstring's first paragraph; parameter
    descriptions come from ``Field(description=...)`` or the docstring's
    ``Args:`` section. Every parameter needs a type annotation.
    """

    def build(body: Callable[..., Any]) -> Tool:
        return _build_tool(
            body, name=name, description=description, read_only=read_only, timeout=timeout
        )

    return build if fn is None else build(fn)


# -- running a tool -------------------------------------------------------------


@dataclass(frozen=True)
class ToolOutcome:
    """What one call produced: the body's value, or the error the model is told about.

    ``exception`` is the original exception for the operator's log; it is
    never shown to the model.
    """

    call_id: str
    name: str
    value: Any = None
    error: AgentExecutionError | None = None
    exception: BaseException | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class _Running:
    call: ToolCall
    tool: Tool
    future: concurrent.futures.Future[Any]
    started: float
    deadline: float


def _plan_batches(read_only: Sequence[bool], width: int) -> list[range]:
    """Split calls, in order, into batches run together.

    Consecutive read-only calls share a batch of at most ``width``; any other
    call is a batch of its own.
    """
    batches: list[range] = []
    start = 0
    while start < len(read_only):
        stop = start + 1
        if read_only[start]:
            while stop < len(read_only) and read_only[stop] and stop - start < width:
                stop += 1
        batches.append(range(start, stop))
        start = stop
    return batches


def _argument_shape(arguments: Mapping[str, Any]) -> dict[str, str]:
    # What was sent, without the values: names and JSON types only.
    return {str(key): type(value).__name__ for key, value in arguments.items()}


def _problems(exc: ValidationError) -> list[dict[str, str]]:
    """Field paths, what was expected and the error type: never the input."""
    return [
        {
            "loc": ".".join(str(part) for part in error["loc"]) or "<root>",
            "msg": error["msg"],
            "type": error["type"],
        }
        for error in exc.errors(include_url=False, include_input=False, include_context=False)
    ]


def _run_coroutine(fn: Callable[..., Any], kwargs: Mapping[str, Any]) -> Any:
    return asyncio.run(fn(**kwargs))


@dataclass(eq=False)
class _Worker:
    abandoned: bool = False


@dataclass(frozen=True, eq=False)
class _Job:
    future: concurrent.futures.Future[Any]
    fn: Callable[[], Any]
    deadline: float


class _PoolState:
    """What a pool's worker threads share. It never refers to the pool, so the pool can be
    collected (and its workers told to stop) while they live."""

    def __init__(self, size: int, prefix: str) -> None:
        self.jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self.lock = threading.Lock()
        self.idle = threading.Semaphore(0)
        self.size = size
        self.live = 0  # workers that are not abandoned
        self.orphans = 0  # abandoned workers whose body has not returned yet
        self.running: dict[concurrent.futures.Future[Any], _Worker] = {}
        self.closed = False
        self.prefix = prefix
        self.names = itertools.count()

    def start_worker(self) -> None:
        """Start one more worker (the lock is held)."""
        self.live += 1
        thread = threading.Thread(
            target=_work, args=(self,), name=f"{self.prefix}_{next(self.names)}", daemon=True
        )
        thread.start()

    def close(self) -> None:
        with self.lock:
            if self.closed:
                return
            self.closed = True
            for _ in range(self.live):
                self.jobs.put(None)


def _work(state: _PoolState) -> None:
    me = _Worker()
    while True:
        job = state.jobs.get()
        if job is None:
            return
        if time.monotonic() >= job.deadline:
            job.future.cancel()  # its caller gave up waiting: never start it late
        with state.lock:
            state.running[job.future] = me
        started = job.future.set_running_or_notify_cancel()
        if started:
            try:
                result = job.fn()
            except BaseException as exc:  # noqa: BLE001 - handed to the caller through the future
                job.future.set_exception(exc)
            else:
                job.future.set_result(result)
        with state.lock:
            state.running.pop(job.future, None)
            if me.abandoned:
                state.orphans -= 1
                return  # a replacement took this worker's place
        del job
        state.idle.release()


class _DaemonPool:
    """A thread pool whose workers are daemon threads, and whose stuck workers are replaced.

    ``concurrent.futures.ThreadPoolExecutor`` joins its workers at interpreter
    exit, so one body that never returns keeps the process alive forever.
    Here, :meth:`abandon` gives up on a running job: its thread is left to
    finish the body in the background (then it ends instead of taking more
    work) and a new worker takes its place, so the pool keeps ``size``
    usable workers. Daemon threads never hold up exit.

    A job still queued when its deadline passes is cancelled by the worker
    that picks it up, never started late.
    """

    def __init__(self, size: int, prefix: str) -> None:
        self._state = _PoolState(size, prefix)
        weakref.finalize(self, _PoolState.close, self._state)

    def submit(self, fn: Callable[[], Any], deadline: float) -> concurrent.futures.Future[Any]:
        state = self._state
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        with state.lock:
            if state.closed:
                raise RuntimeError("cannot run a tool after the registry was closed")
            state.jobs.put(_Job(future, fn, deadline))
            if not state.idle.acquire(blocking=False) and state.live < state.size:
                state.start_worker()
        return future

    def abandon(self, future: concurrent.futures.Future[Any]) -> bool:
        """Give up on ``future``'s running job; True when a worker was replaced."""
        state = self._state
        with state.lock:
            worker = state.running.pop(future, None)
            if worker is None or future.done():
                return False
            worker.abandoned = True
            state.live -= 1
            state.orphans += 1
            if not state.closed:
                state.start_worker()
            return True

    @property
    def abandoned(self) -> int:
        """How many threads still run bodies that were given up on."""
        return self._state.orphans

    def shutdown(self) -> None:
        self._state.close()


class ToolRegistry:
    """The tools one agent may call, and the place their calls run.

    Sync bodies run on the registry's pool of ``executor_workers`` daemon
    threads, so a blocking body cannot freeze the caller or the event loop.
    Python cannot kill a thread: a sync body that overruns its timeout is
    abandoned, not stopped. Its outcome returns at the deadline; the body keeps
    running on its own thread until it returns (its result is then dropped), a
    new worker takes its place in the pool, and the daemon thread never holds
    up interpreter exit.
    """

    def __init__(
        self,
        tools: Iterable[Tool | Callable[..., Any]] = (),
        *,
        workspace: Workspace | str | os.PathLike[str] | None = None,
        executor_workers: int = 4,
    ) -> None:
        if executor_workers < 1:
            raise ValueError("executor_workers must be at least 1")
        by_name: dict[str, Tool] = {}
        for item in tools:
            tool = item if isinstance(item, Tool) else forge_tool(item)
            if tool.name in by_name:
                raise ValueError(f"two tools are named {tool.name!r}")
            by_name[tool.name] = tool
        if workspace is not None and not isinstance(workspace, Workspace):
            workspace = Workspace(workspace)
        needing = sorted(n for n, t in by_name.items() if _mentions_workspace(t.input_model, set()))
        if needing and workspace is None:
            raise ValueError(f"tools {', '.join(needing)} take WorkspacePath: pass workspace=")
        self._tools = by_name
        self._names = sorted(by_name)
        self._workspace = workspace
        self._workers = executor_workers
        self._pool = _DaemonPool(executor_workers, "fluid-tool")
        # Timed-out async bodies that ignored cancellation: kept referenced until done.
        self._orphans: set[asyncio.Future[Any]] = set()

    @property
    def names(self) -> list[str]:
        return list(self._names)

    @property
    def workspace(self) -> Workspace | None:
        return self._workspace

    def specs(self) -> list[ToolSpec]:
        return [self._tools[name].spec() for name in self._names]

    @property
    def abandoned_threads(self) -> int:
        """Threads still running sync bodies that timed out (each ends when its body returns)."""
        return self._pool.abandoned

    def close(self) -> None:
        """Stop accepting calls. Running bodies are not waited for."""
        self._pool.shutdown()

    def __enter__(self) -> ToolRegistry:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- validation ---------------------------------------------------------

    def validate(self, name: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """The keyword arguments for ``name``'s body, or a ToolValidationError.

        ``WorkspacePath`` arguments come back as confined ``Path`` objects.
        """
        tool = self._tools.get(name)
        next_actions = {"valid_next_actions": self.names}
        if tool is None:
            reason = f"unknown tool; the tools are: {', '.join(self._names) or '(none)'}"
            raise ToolValidationError(
                reason,
                code="tool.unknown_tool",
                tool_name=name,
                tool_args=_argument_shape(arguments),
                reason=reason,
                details=next_actions,
            )
        try:
            parsed = tool.input_model.model_validate(
                dict(arguments), context={_WORKSPACE_KEY: self._workspace}
            )
        except ValidationError as exc:
            problems = _problems(exc)
            escaped = any(p["type"] == "workspace_violation" for p in problems)
            listed = "; ".join(f"{p['loc']}: {p['msg']}" for p in problems)
            reason = f"invalid arguments for {name}: {listed}"
            raise ToolValidationError(
                reason,
                code="tool.workspace_violation" if escaped else "tool.invalid_input",
                tool_name=name,
                tool_args=_argument_shape(arguments),
                reason=reason,
                details={"errors": problems, **next_actions},
            ) from exc
        return {
            info.alias or key: getattr(parsed, key)
            for key, info in type(parsed).model_fields.items()
        }

    # -- outcomes -------------------------------------------------------------

    def _refused(self, call: ToolCall, error: AgentExecutionError, started: float) -> ToolOutcome:
        return ToolOutcome(call.id, call.name, error=error, seconds=time.monotonic() - started)

    def _settle(
        self, call: ToolCall, exc: BaseException | None, value: Any, started: float
    ) -> ToolOutcome:
        """The outcome of a body that finished, raising what must not be swallowed."""
        seconds = time.monotonic() - started
        if exc is None:
            return ToolOutcome(call.id, call.name, value=value, seconds=seconds)
        if not isinstance(exc, Exception):
            raise exc
        error: AgentExecutionError
        if isinstance(exc, ToolValidationError):
            # The body confined a path of its own (Workspace.resolve): a refusal, not a crash.
            error = exc.with_details(valid_next_actions=self.names)
        else:
            kind = type(exc).__name__
            error = AgentExecutionError(
                f"tool {call.name} raised {kind}",
                code="tool.execution_error",
                details={"tool": call.name, "exception": kind, "valid_next_actions": self.names},
            )
        return ToolOutcome(call.id, call.name, error=error, exception=exc, seconds=seconds)

    def _timed_out(self, call: ToolCall, tool: Tool, *, ran: bool, started: float) -> ToolOutcome:
        error = AgentExecutionError(
            f"tool {tool.name} did not finish within {tool.timeout:g} s",
            code="tool.timeout",
            details={
                "tool": tool.name,
                "timeout_seconds": tool.timeout,
                "started": ran,
                "valid_next_actions": self.names,
            },
        )
        return ToolOutcome(call.id, call.name, error=error, seconds=time.monotonic() - started)

    def _prepare(self, call: ToolCall, started: float) -> ToolOutcome | tuple[Tool, dict[str, Any]]:
        try:
            kwargs = self.validate(call.name, call.arguments)
        except ToolValidationError as exc:
            return self._refused(call, exc, started)
        except Exception as exc:  # noqa: BLE001 - a validator's bug fails this tool, not the loop
            return self._settle(call, exc, None, started)
        return self._tools[call.name], kwargs

    # -- sync -----------------------------------------------------------------

    def _context(self) -> contextvars.Context:
        """A copy of the caller's context in which :func:`current_workspace` is this one's."""
        context = contextvars.copy_context()
        context.run(_CURRENT.set, self._workspace)
        return context

    def _body(self, tool: Tool, kwargs: Mapping[str, Any]) -> Callable[[], Any]:
        context = self._context()
        if tool.is_async:
            return functools.partial(context.run, _run_coroutine, tool.fn, kwargs)
        return functools.partial(context.run, tool.fn, **kwargs)

    def _give_up(self, future: concurrent.futures.Future[Any]) -> bool:
        """Stop waiting for ``future``: True when its body had started (and is abandoned)."""
        # cancel() succeeds only for a body still queued: it will never run late.
        if future.cancel():
            return False
        self._pool.abandon(future)
        return True

    def _submit(self, call: ToolCall) -> ToolOutcome | _Running:
        started = time.monotonic()
        prepared = self._prepare(call, started)
        if isinstance(prepared, ToolOutcome):
            return prepared
        tool, kwargs = prepared
        deadline = time.monotonic() + tool.timeout
        future = self._pool.submit(self._body(tool, kwargs), deadline)
        return _Running(call, tool, future, started, deadline)

    def _collect(self, running: ToolOutcome | _Running) -> ToolOutcome:
        if isinstance(running, ToolOutcome):
            return running
        future = running.future
        concurrent.futures.wait([future], timeout=max(running.deadline - time.monotonic(), 0.0))
        if future.cancelled() or not future.done():
            ran = not future.cancelled() and self._give_up(future)
            return self._timed_out(running.call, running.tool, ran=ran, started=running.started)
        exc = future.exception()
        value = future.result() if exc is None else None
        return self._settle(running.call, exc, value, running.started)

    def run(self, call: ToolCall) -> ToolOutcome:
        """Validate and run one call; tool failures come back in the outcome."""
        return self._collect(self._submit(call))

    def _width(self, max_concurrency: int) -> int:
        if max_concurrency < 1:
            raise ValueError("max_concurrency must be at least 1")
        return min(max_concurrency, self._workers)

    def _read_only(self, calls: Sequence[ToolCall]) -> list[bool]:
        # An unknown tool is refused without running anything, so it may join any batch.
        return [self._tools[c.name].read_only if c.name in self._tools else True for c in calls]

    def run_many(self, calls: Sequence[ToolCall], *, max_concurrency: int = 4) -> list[ToolOutcome]:
        """Run calls in order; consecutive read-only calls overlap.

        At most ``min(max_concurrency, executor_workers)`` run at once; a tool
        that is not read-only runs alone, after everything before it.
        """
        outcomes: list[ToolOutcome] = []
        for batch in _plan_batches(self._read_only(calls), self._width(max_concurrency)):
            running = [self._submit(calls[i]) for i in batch]
            outcomes.extend(self._collect(item) for item in running)
        return outcomes

    # -- async ----------------------------------------------------------------

    def _forget(self, future: asyncio.Future[Any]) -> None:
        self._orphans.discard(future)
        if not future.cancelled():
            future.exception()  # retrieved, so asyncio does not log it as lost

    async def arun(self, call: ToolCall) -> ToolOutcome:
        """Validate and run one call on the running event loop.

        The deadline is enforced with ``asyncio.wait``: it fires on time even
        when an async body ignores cancellation (the body is then left
        running, referenced until it ends).
        """
        started = time.monotonic()
        prepared = self._prepare(call, started)
        if isinstance(prepared, ToolOutcome):
            return prepared
        tool, kwargs = prepared
        queued: concurrent.futures.Future[Any] | None = None
        waiter: asyncio.Future[Any]
        if tool.is_async:
            loop = asyncio.get_running_loop()
            waiter = loop.create_task(tool.fn(**kwargs), context=self._context())
        else:
            # What loop.run_in_executor does, keeping the pool's future to learn if it started.
            queued = self._pool.submit(self._body(tool, kwargs), time.monotonic() + tool.timeout)
            waiter = asyncio.wrap_future(queued)
        try:
            await asyncio.wait({waiter}, timeout=tool.timeout)
        except asyncio.CancelledError:
            waiter.cancel()
            if queued is not None:
                self._give_up(queued)
            raise
        if queued is not None and queued.cancelled():
            return self._timed_out(call, tool, ran=False, started=started)
        if not waiter.done():
            ran = queued is None or self._give_up(queued)
            waiter.cancel()
            if not waiter.done():
                self._orphans.add(waiter)
                waiter.add_done_callback(self._forget)
            return self._timed_out(call, tool, ran=ran, started=started)
        exc = waiter.exception()
        value = waiter.result() if exc is None else None
        return self._settle(call, exc, value, started)

    async def arun_many(
        self, calls: Sequence[ToolCall], *, max_concurrency: int = 4
    ) -> list[ToolOutcome]:
        """The async twin of :meth:`run_many`, with the same ordering rules."""
        outcomes: list[ToolOutcome] = []
        for batch in _plan_batches(self._read_only(calls), self._width(max_concurrency)):
            outcomes.extend(await asyncio.gather(*(self.arun(calls[i]) for i in batch)))
        return outcomes
