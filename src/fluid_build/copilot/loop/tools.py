"""Running tools: a ``ToolRegistry`` validates each call and runs its body under a timeout.

:class:`ToolRegistry` holds the tools one agent may call (declared with
``@forge_tool``, :mod:`fluid_build.copilot.loop.declare`), validates a call's
arguments (``WorkspacePath`` ones confined, :mod:`fluid_build.copilot.loop.workspace`),
runs the body under the tool's timeout (sync bodies on a pool of daemon threads,
:mod:`~fluid_build._threads`) and hands back a :class:`ToolOutcome`; a
failing tool never raises into the loop. Refusals and failures carry stable codes::

    ToolValidationError              refused before the body ran
        tool.unknown_tool            no tool has that name
        tool.invalid_input           the arguments do not match the schema
        tool.workspace_violation     a WorkspacePath leads outside the workspace
    AgentExecutionError              the body ran
        tool.execution_error         it raised; the model sees the class name only
        tool.timeout                 it did not finish in time

Every refusal and failure lists the callable tools in
``details["valid_next_actions"]``. Messages never quote argument values.

This module is the public import path of docs/tools.md: it exports
``forge_tool`` and ``Tool`` (from ``declare``), ``Workspace``,
``WorkspacePath`` and ``current_workspace`` (from ``workspace``) too.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from pydantic import ValidationError

from fluid_build._threads import DaemonPool, wait_done
from fluid_build.copilot.agents.errors import AgentExecutionError, ToolValidationError
from fluid_build.copilot.llm.types import ToolCall, ToolSpec
from fluid_build.copilot.loop.declare import Tool, forge_tool
from fluid_build.copilot.loop.workspace import (
    WORKSPACE_KEY,
    Workspace,
    WorkspacePath,
    context_with,
    current_workspace,
    mentions_workspace,
)

__all__ = [
    "Tool",
    "ToolOutcome",
    "ToolRegistry",
    "Workspace",
    "WorkspacePath",
    "current_workspace",
    "forge_tool",
]


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
        needing = sorted(n for n, t in by_name.items() if mentions_workspace(t.input_model, set()))
        if needing and workspace is None:
            raise ValueError(f"tools {', '.join(needing)} take WorkspacePath: pass workspace=")
        self._tools = by_name
        self._names = sorted(by_name)
        self._workspace = workspace
        self._workers = executor_workers
        self._pool = DaemonPool(executor_workers, "fluid-tool")
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
                dict(arguments), context={WORKSPACE_KEY: self._workspace}
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
        return context_with(self._workspace)

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
        if not wait_done(future, running.deadline - time.monotonic()) or future.cancelled():
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
