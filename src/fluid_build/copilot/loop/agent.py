"""The multi-turn agent loop: tools, corrective feedback, scrubbing, compaction and budgets.

``AgentLoop(client, tools=[...], workspace=path, response_model=M).run(task)``
calls the model, runs the tools it asks for, and feeds failures back as
corrective messages until the model gives a final answer that validates
(against ``response_model``, then the caller's ``check``).

What reaches the model when a tool fails is only
``{"error": "<ClassName>", "message": "Tool '<name>' failed - see server logs"}``
and a fixed guidance message chosen by the failure's class and code: never
the exception text, which can hold paths, hostnames, environment values or
keys. The full detail goes to the operator's log, redacted.
"""

from __future__ import annotations

import json
import logging
import os
import time
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field

from fluid_build._redact import redact, truncate
from fluid_build.config import env_int
from fluid_build.copilot.agents.errors import (
    AgentExecutionError,
    ContextOverflowError,
    SchemaValidationError,
    python_aside,
)
from fluid_build.copilot.call import drive
from fluid_build.copilot.call.drive import Plan
from fluid_build.copilot.llm.types import Completion, ToolCall
from fluid_build.copilot.loop import limits
from fluid_build.copilot.loop.declare import Tool
from fluid_build.copilot.loop.limits import Budget, LoopUsage
from fluid_build.copilot.loop.tools import ToolOutcome, ToolRegistry
from fluid_build.copilot.loop.workspace import Workspace

if TYPE_CHECKING:
    from fluid_build.copilot.call.core import CallOptions
    from fluid_build.copilot.client import LLMClient

__all__ = [
    "AgentLoop",
    "AgentResult",
    "Budget",
    "LoopSettings",
    "LoopUsage",
    "guidance_for",
    "scrubbed_tool_error",
]

LOG = logging.getLogger("fluid_build.agent")

Strategy = Literal["truncate", "summarize", "hybrid"]
_STRATEGIES: Final = ("truncate", "summarize", "hybrid")
_MAX_TOOL_RESULT_CHARS: Final = 20_000
#: A compaction summary's call: short, whatever the run's max_output_tokens.
_SUMMARY_OPTIONS: Final[Mapping[str, Any]] = {"max_output_tokens": 1024}


def _loop_prices(prices: Mapping[str, Any] | None) -> dict[str, Any]:
    """``prices=`` as call/prices reads it; the older ``(usd_in, usd_out)`` pair still works."""
    from fluid_build.copilot.call.prices import parse_prices

    shaped = {
        model: {"input": price[0], "output": price[1]} if isinstance(price, tuple) else price
        for model, price in (prices or {}).items()
    }
    return parse_prices(shaped)


class LoopSettings(BaseModel):
    """Limits of the loop's shape; ``from_env`` reads the ``FLUID_AGENT_*`` variables."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_rounds: int = Field(default=12, ge=1, le=200)
    max_tool_calls_per_round: int = Field(default=8, ge=1, le=64)
    max_concurrency: int = Field(default=4, ge=1, le=32)
    compact_after: int = Field(default=6, ge=1, le=200)
    compaction: Strategy = "truncate"
    keep_last: int = Field(default=4, ge=1, le=50)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> LoopSettings:
        """Read ``FLUID_AGENT_MAX_ROUNDS``, ``_COMPACT_AFTER``, ``FLUID_COMPACTION_STRATEGY``."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {
            "max_rounds": env_int(env, "FLUID_AGENT_MAX_ROUNDS", 12, minimum=1, maximum=200),
            "compact_after": env_int(env, "FLUID_AGENT_COMPACT_AFTER", 6, minimum=1, maximum=200),
        }
        strategy = (env.get("FLUID_COMPACTION_STRATEGY") or "").strip().lower()
        if strategy in _STRATEGIES:
            values["compaction"] = strategy
        elif strategy:
            logging.getLogger("fluid_build.config").warning(
                "FLUID_COMPACTION_STRATEGY=%r is not one of %s; using truncate",
                truncate(redact(strategy), 40),
                ", ".join(_STRATEGIES),
            )
        values.update(overrides)
        return cls(**values)


class AgentResult(BaseModel):
    """A finished run: the validated output, the transcript and the usage."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    output: Any = None
    text: str = ""
    transcript: list[dict[str, Any]] = Field(default_factory=list)
    usage: LoopUsage = Field(default_factory=LoopUsage)
    finished: bool = False


# -- what the model is told ---------------------------------------------------------

_GUIDANCE: Final[Mapping[str, str]] = {
    "tool.invalid_input": (
        "Your tool arguments did not match the tool's input schema. Re-read the tool's schema "
        "definition above and submit values that satisfy every required field with the "
        "correct types."
    ),
    "tool.unknown_tool": (
        "That tool does not exist. Call only the tools listed below, with their exact names."
    ),
    "tool.workspace_violation": (
        "The path you gave is outside the workspace. Use a relative path inside the "
        "workspace; absolute paths, '..' and links that lead out of it are refused."
    ),
    "tool.timeout": (
        "The tool did not finish within its time limit. Ask for less at once, or continue "
        "without it."
    ),
    "tool.execution_error": (
        "The tool raised an error while running; the details are in the server logs. Check "
        "your arguments, or take a different approach."
    ),
}
_TOO_MANY = "TooManyToolCalls"


def scrubbed_tool_error(
    name: str, error: AgentExecutionError | None, *, skipped: bool = False
) -> dict[str, str]:
    """The only thing the model learns about a failed tool call."""
    if skipped:
        return {"error": _TOO_MANY, "message": f"Tool '{name}' was not run - see server logs"}
    return {"error": _class_name(error), "message": f"Tool '{name}' failed - see server logs"}


def _class_name(error: AgentExecutionError | None) -> str:
    if error is None:
        return "AgentExecutionError"
    if error.code == "tool.execution_error":
        # The body's own exception class: a class name says what kind of
        # failure it was without quoting anything the exception carried.
        name = error.details.get("exception")
        if isinstance(name, str) and name.isidentifier():
            return name
    if error.code == "tool.timeout":
        return "ToolTimeoutError"
    return type(error).__name__


def guidance_for(name: str, error: AgentExecutionError | None, tools: Sequence[str]) -> str:
    """The fixed corrective message for one failed tool call, keyed by its class and code."""
    code = error.code if error is not None else "tool.execution_error"
    advice = _GUIDANCE.get(code, _GUIDANCE["tool.execution_error"])
    listed = ", ".join(tools) if tools else "(none)"
    return (
        f"Tool `{name}` failed with error class `{_class_name(error)}`. {advice} "
        f"Tools you can call next: {listed}."
    )


def _schema_feedback(error: SchemaValidationError) -> str:
    lines = []
    for entry in error.validation_errors[:20]:
        where = truncate(redact(str(entry.get("loc") or "<root>")), 200)
        what = redact(str(entry.get("msg") or "invalid"))
        kind = truncate(redact(str(entry.get("type") or "")), 60)
        lines.append(f"- {where}: {truncate(what, 200)}" + (f" ({kind})" if kind else ""))
    if not lines:
        lines.append("- <root>: the output did not match the schema")
    schema = error.schema_name or "the response schema"
    return (
        f"Your previous answer failed validation against `{schema}` with these errors:\n"
        + "\n".join(lines)
        + "\nPlease correct your answer and reply with JSON that satisfies the schema."
    )


def _result_content(value: Any) -> str:
    if isinstance(value, str):
        text = value
    else:
        try:
            text = json.dumps(value, default=str, ensure_ascii=False)
        except (TypeError, ValueError):
            text = str(value)
    return truncate(redact(text), _MAX_TOOL_RESULT_CHARS)


def _log_tool_failure(outcome: ToolOutcome) -> None:
    error = outcome.error
    detail = ""
    # A typed error says what went wrong itself (a tool refusing the model's argument); only
    # an unexpected exception needs its traceback for whoever reads the log.
    if outcome.exception is not None and not isinstance(outcome.exception, AgentExecutionError):
        detail = "".join(traceback.format_exception(outcome.exception))
    LOG.warning(
        "tool %s (call %s) failed [%s]: %s%s",
        outcome.name,
        outcome.call_id,
        error.code if error else "?",
        redact(str(error)) if error else "",
        ("\n" + redact(detail)) if detail else "",
    )


# -- compaction ---------------------------------------------------------------------------


def _protected_tail(messages: Sequence[Mapping[str, Any]], keep_last: int) -> int:
    """Index where the untouchable tail starts: the last ``keep_last`` messages, widened
    so that no tool result is separated from the assistant turn that called it."""
    start = max(len(messages) - keep_last, 1)
    while start > 1 and messages[start].get("role") == "tool":
        start -= 1
    return start


def _truncate_middle(messages: list[dict[str, Any]], keep_last: int) -> int:
    """Shorten old tool results in place; return how many were shortened."""
    tail = _protected_tail(messages, keep_last)
    shortened = 0
    for message in messages[1:tail]:
        content = message.get("content")
        if (
            message.get("role") == "tool"
            and isinstance(content, str)
            and not content.startswith("[compacted")
        ):
            message["content"] = f"[compacted: {len(content)} characters of tool output omitted]"
            shortened += 1
    return shortened


# -- the loop ----------------------------------------------------------------------------


@dataclass
class _State:
    messages: list[dict[str, Any]]
    usage: LoopUsage
    started: float
    output: Any = None
    text: str = ""
    finished: bool = False
    warned_cost: bool = False
    force_compaction: bool = False
    overflow_retried: bool = False
    last_summary_round: int = 0


#: What ``check`` returns: validation errors as ``{"loc", "msg", "type"}`` mappings.
Check = Callable[[Any], Sequence[Mapping[str, object]]]


@dataclass(frozen=True, slots=True)
class _Ask(drive.Effect):
    """One model call of the run: ``complete`` in the sync shell, ``acomplete`` in the async one."""

    client: LLMClient
    messages: list[dict[str, Any]]
    options: dict[str, Any]

    def run(self) -> Completion:
        return self.client.complete(self.messages, **self.options)

    async def arun(self) -> Completion:
        return await self.client.acomplete(self.messages, **self.options)


@dataclass(frozen=True, slots=True)
class _RunTools(drive.Effect):
    """One batch of tool calls, in order; consecutive read-only ones overlap."""

    registry: ToolRegistry
    calls: Sequence[ToolCall]
    max_concurrency: int

    def run(self) -> list[ToolOutcome]:
        return self.registry.run_many(self.calls, max_concurrency=self.max_concurrency)

    async def arun(self) -> list[ToolOutcome]:
        return await self.registry.arun_many(self.calls, max_concurrency=self.max_concurrency)


#: What the loop itself sets on each call: its own arguments, never ``options``.
_LOOP_OWNS: Final = frozenset(
    {"system", "tools", "response_model", "max_output_tokens", "validate"}
)


def _call_options(options: CallOptions | None) -> dict[str, Any]:
    """``AgentLoop(options=)`` checked: known call options, none the loop sets itself."""
    from fluid_build.copilot.call.core import CALL_OPTIONS
    from fluid_build.copilot.call.options import check_names, sampling

    given = dict(options or {})
    for name in sorted(given.keys() & _LOOP_OWNS):
        raise TypeError(f"AgentLoop(options=) cannot set {name}: pass AgentLoop({name}=)")
    check_names(given, CALL_OPTIONS - _LOOP_OWNS, "AgentLoop(options=)")
    sampling(given)
    return given


class AgentLoop:
    """Run a task with tools until the model gives a final answer that validates.

    ``run(task)`` (and ``await arun(task)``) return an :class:`AgentResult`.
    A budget that runs out raises an :class:`AgentExecutionError` whose code
    says which (``budget.llm_calls_exhausted`` ...); :attr:`result` then holds
    the work done so far (transcript and usage).

    A final answer must validate against ``response_model`` and then pass
    ``check`` (errors as ``{"loc", "msg", "type"}``; empty when it passes).
    Either failure is fed back as a corrective message and the run goes on;
    ``on_correction`` sees each one as a :class:`SchemaValidationError`. After
    ``max_corrections`` corrections, the next failure is raised instead
    (``None``: only the budgets bound them). A ``check`` that raises ends the
    run with its exception, which never reaches the model.

    ``options`` are the call options every model call of the run carries
    (``temperature``, ``seed``, ``tool_choice`` ..., docs/llm-providers.md "Call
    options"), over the client's own; the loop sets ``system``, ``tools``,
    ``response_model`` and ``max_output_tokens`` from its own arguments.
    """

    def __init__(
        self,
        client: LLMClient,
        *,
        tools: Iterable[Tool | Callable[..., Any]] | ToolRegistry = (),
        workspace: Workspace | str | os.PathLike[str] | None = None,
        response_model: type[BaseModel] | None = None,
        system: str | None = None,
        settings: LoopSettings | None = None,
        budget: Budget | None = None,
        prices: Mapping[str, Any] | None = None,
        max_output_tokens: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        env: Mapping[str, str] | None = None,
        check: Check | None = None,
        max_corrections: int | None = None,
        on_correction: Callable[[SchemaValidationError], None] | None = None,
        options: CallOptions | None = None,
    ) -> None:
        if max_corrections is not None and max_corrections < 0:
            raise ValueError(f"max_corrections must be >= 0, not {max_corrections!r}")
        self.options = _call_options(options)
        self.client = client
        if isinstance(tools, ToolRegistry):
            self.registry = tools
        else:
            root = workspace if workspace is not None else Path.cwd()
            self.registry = ToolRegistry(tools, workspace=root)
        self.response_model = response_model
        self.system = system
        self.settings = settings or LoopSettings.from_env(env)
        self.budget = budget or Budget()
        # Over the client's own (genai-prices, FLUID_PRICES): docs/budgets.md.
        self.prices = _loop_prices(prices)
        self.max_output_tokens = max_output_tokens
        self.clock = clock
        self.check = check
        self.max_corrections = max_corrections
        self.on_correction = on_correction
        self.result = AgentResult()

    # -- shared decisions --------------------------------------------------------------

    def _start(self, task: str) -> _State:
        state = _State([{"role": "user", "content": task}], LoopUsage(), self.clock())
        self.result = AgentResult(transcript=state.messages, usage=state.usage)
        return state

    def _stop(self, state: _State, code: str, what: str, **details: Any) -> AgentExecutionError:
        state.usage.seconds = self.clock() - state.started
        self.result = AgentResult(
            text=state.text, transcript=list(state.messages), usage=state.usage, finished=False
        )
        usage = state.usage.model_dump()
        LOG.warning("agent loop stopped: %s", what)
        return AgentExecutionError(
            f"the agent loop stopped: {what}; the work done so far is kept",
            code=code,
            details={"usage": usage, "messages": len(state.messages), **details},
        )

    def _check_budget(self, state: _State) -> None:
        state.usage.seconds = self.clock() - state.started
        stop = limits.spent_stop(self.budget, self.settings.max_rounds, state.usage)
        if stop is not None:
            raise self._stop(state, stop.code, stop.what, **stop.details)

    def _before_call(
        self, state: _State, messages: Sequence[Mapping[str, Any]], options: Mapping[str, Any]
    ) -> None:
        """Every budget, checked immediately before a model call; the call then counts.

        The summary call of a compaction goes through here too, so no strategy can
        make more calls than ``max_llm_calls``. A call counts when it is made, whether
        it answers or fails (see :meth:`_not_sent` for the one exception).
        """
        self._check_budget(state)
        self._check_worst_case(state, messages, options)
        state.usage.llm_calls += 1

    def _prices(self) -> dict[str, Any]:
        """The client's prices (FLUID_PRICES, its ``prices=``), the loop's over them."""
        return {**getattr(self.client, "prices", {}), **self.prices}

    def _check_worst_case(
        self, state: _State, messages: Sequence[Mapping[str, Any]], options: Mapping[str, Any]
    ) -> None:
        """Stop the run BEFORE a call whose worst case would take it past ``max_cost_usd``."""
        limit = self.budget.max_cost_usd
        if limit is None:
            return  # no limit, nothing counted or priced
        worst, unpriced = limits.worst_case(self.client, self._prices(), messages, options)
        if unpriced and not state.warned_cost:
            state.warned_cost = True
            LOG.warning(
                "max_cost_usd cannot be enforced for %s: no price is known (calls it answers "
                "are not counted); give one with FLUID_PRICES %s, see docs/budgets.md",
                ", ".join(unpriced),
                python_aside("prices"),
            )
        if worst is None:
            return
        stop = limits.cost_stop(limit, state.usage.cost_usd or 0.0, worst)
        if stop is not None:
            raise self._stop(state, stop.code, stop.what, **stop.details)

    @staticmethod
    def _not_sent(state: _State, error: AgentExecutionError) -> None:
        """A call the pre-flight refused sent nothing: it does not count."""
        if isinstance(error, ContextOverflowError) and error.status_code is None:
            state.usage.llm_calls = max(state.usage.llm_calls - 1, 0)

    def _calls_left(self, state: _State) -> int | None:
        if self.budget.max_llm_calls is None:
            return None
        return self.budget.max_llm_calls - state.usage.llm_calls

    def _account(self, state: _State, completion: Completion) -> None:
        usage = state.usage
        usage.input_tokens += completion.usage.input_tokens
        usage.output_tokens += completion.usage.output_tokens
        spent = completion.cost_usd
        if self.prices:
            from fluid_build.copilot.call.prices import price_call

            spent = price_call(
                completion.provider,
                self.client.model,
                completion.usage,
                answered_model=completion.model,
                overrides=self._prices(),
            )
        if spent is not None:
            usage.cost_usd = (usage.cost_usd or 0.0) + spent

    def _request(self, state: _State) -> dict[str, Any]:
        return {
            **self.options,
            "system": self.system,
            "tools": self.registry.specs() or None,
            "response_model": self.response_model,
            "max_output_tokens": self.max_output_tokens,
            "validate": False,
        }

    def _needs_compaction(self, state: _State) -> bool:
        return state.force_compaction or state.usage.rounds >= self.settings.compact_after

    def _after_completion(self, state: _State, completion: Completion) -> list[ToolCall]:
        """Record the model's turn; return the tool calls to run (empty when it answered)."""
        self._account(state, completion)
        calls = list(completion.tool_calls)
        if calls:
            state.messages.append(
                {
                    "role": "assistant",
                    "content": completion.text,
                    "tool_calls": [c.model_dump() for c in calls],
                }
            )
            return calls
        state.messages.append({"role": "assistant", "content": completion.text})
        state.text = completion.text
        if self.response_model is None:
            state.output, state.finished = completion.text, True
            return []
        try:
            output = self.client.validate(completion.text, self.response_model)
            self._run_check(output, completion.text)
        except SchemaValidationError as error:
            self._correct(state, error)
            return []
        state.output, state.finished = output, True
        return []

    def _run_check(self, output: Any, text: str) -> None:
        """Raise :class:`SchemaValidationError` when ``check`` finds problems in ``output``."""
        if self.check is None:
            return
        problems = [dict(entry) for entry in self.check(output)]
        if not problems:
            return
        key = self.client.config.api_key
        schema = self.response_model.__name__ if self.response_model is not None else None
        noun = "check" if len(problems) == 1 else "checks"
        raise SchemaValidationError(
            f"the final answer failed {len(problems)} {noun}",
            schema_name=schema,
            validation_errors=problems,
            raw_output=text,
            secrets=[key] if key else (),
        )

    def _correct(self, state: _State, error: SchemaValidationError) -> None:
        """Feed a failed final answer back, or give up after ``max_corrections``."""
        if self.max_corrections is not None and state.usage.corrections >= self.max_corrections:
            state.usage.seconds = self.clock() - state.started
            self.result = AgentResult(
                text=state.text, transcript=list(state.messages), usage=state.usage
            )
            answers = state.usage.corrections + 1
            LOG.warning("agent loop stopped: %d final answers failed validation", answers)
            raise error.with_details(note=f"gave up after {answers} attempts")
        state.usage.corrections += 1
        LOG.info("final answer failed %s; asking for a correction", error.schema_name)
        if self.on_correction is not None:
            self.on_correction(error)
        state.messages.append({"role": "user", "content": _schema_feedback(error)})

    def _split_calls(
        self, state: _State, calls: list[ToolCall]
    ) -> tuple[list[ToolCall], list[ToolCall]]:
        """The calls to run now, and those refused (per-round cap, tool budget)."""
        allowed = self.settings.max_tool_calls_per_round
        if self.budget.max_tool_calls is not None:
            allowed = min(allowed, max(self.budget.max_tool_calls - state.usage.tool_calls, 0))
        return calls[:allowed], calls[allowed:]

    def _after_tools(
        self, state: _State, outcomes: Sequence[ToolOutcome], skipped: Sequence[ToolCall]
    ) -> None:
        state.usage.tool_calls += len(outcomes)
        names = self.registry.names
        advice: list[str] = []
        for outcome in outcomes:
            if outcome.ok:
                content = _result_content(outcome.value)
            else:
                _log_tool_failure(outcome)
                content = json.dumps(scrubbed_tool_error(outcome.name, outcome.error))
                advice.append(guidance_for(outcome.name, outcome.error, names))
            state.messages.append(
                {
                    "role": "tool",
                    "tool_call_id": outcome.call_id,
                    "name": outcome.name,
                    "content": content,
                }
            )
        for call in skipped:
            LOG.warning(
                "tool call %s (%s) not run: over the per-round or tool-call limit",
                call.id,
                call.name,
            )
            state.messages.append(
                {
                    "role": "tool",
                    "tool_call_id": call.id,
                    "name": call.name,
                    "content": json.dumps(scrubbed_tool_error(call.name, None, skipped=True)),
                }
            )
        if skipped:
            advice.append(
                f"{len(skipped)} tool call(s) were not run: at most "
                f"{self.settings.max_tool_calls_per_round} are honoured per round. "
                "Make fewer calls at once."
            )
        if advice:
            state.messages.append({"role": "user", "content": "\n\n".join(advice)})
        if (
            skipped
            and self.budget.max_tool_calls is not None
            and state.usage.tool_calls >= self.budget.max_tool_calls
        ):
            raise self._stop(
                state,
                "budget.tool_calls_exhausted",
                f"{state.usage.tool_calls} tool calls made of {self.budget.max_tool_calls}",
            )

    def _summary_request(self, state: _State) -> tuple[list[dict[str, Any]], int, int] | None:
        tail = _protected_tail(state.messages, self.settings.keep_last)
        middle = state.messages[1:tail]
        if len(middle) < 2:
            return None
        text = "\n".join(
            f"[{m.get('role')}] {truncate(str(m.get('content') or ''), 4000)}"
            + (
                f" (called {', '.join(c['name'] for c in m['tool_calls'])})"
                if m.get("tool_calls")
                else ""
            )
            for m in middle
        )
        prompt = [
            {
                "role": "user",
                "content": "Summarize the work below for your own later use: the facts found, "
                "the tool results that matter, and what remains to do. Be concise.\n\n" + text,
            }
        ]
        return prompt, 1, tail

    def _summary_due(self, state: _State) -> bool:
        # Truncation is cheap and runs every round once due; a summary costs a
        # model call, so it runs again only after another compact_after rounds.
        due = state.force_compaction or (
            state.usage.rounds - state.last_summary_round >= self.settings.compact_after
        )
        if due:
            state.last_summary_round = state.usage.rounds
        return due

    def _apply_summary(self, state: _State, summary: str, start: int, tail: int) -> None:
        state.messages[start:tail] = [
            {"role": "user", "content": f"[Summary of earlier work]\n{truncate(summary, 8000)}"}
        ]

    def _retry_after_overflow(self, state: _State) -> bool:
        """A prompt that no longer fits: compact now and try the round once more."""
        if state.overflow_retried:
            return False
        LOG.info("the conversation no longer fits the window; compacting before retrying")
        state.overflow_retried = True
        state.force_compaction = True
        state.usage.rounds -= 1
        return True

    def _compacted(self, state: _State) -> None:
        state.usage.compactions += 1
        state.force_compaction = False

    # -- drivers ---------------------------------------------------------------------

    def _begin_compaction(self, state: _State) -> tuple[list[dict[str, Any]], int, int] | None:
        """Truncate as the strategy says; return a summary request when one is due."""
        strategy = self.settings.compaction
        if strategy in {"truncate", "hybrid"}:
            _truncate_middle(state.messages, self.settings.keep_last)
        if strategy in {"summarize", "hybrid"} and self._summary_due(state):
            request = self._summary_request(state)
            left = self._calls_left(state)
            if request is not None and left is not None and left < 2:
                # A summary would take the call the round needs: truncate instead.
                LOG.info(
                    "no model call to spare for a summary (%d left of max_llm_calls=%d); "
                    "truncating instead",
                    left,
                    self.budget.max_llm_calls,
                )
                _truncate_middle(state.messages, self.settings.keep_last)
            elif request is not None:
                self._before_call(state, request[0], _SUMMARY_OPTIONS)
                return request
        self._compacted(state)
        return None

    def _end_compaction(
        self,
        state: _State,
        request: tuple[list[dict[str, Any]], int, int],
        completion: Completion | None,
        error: AgentExecutionError | None,
    ) -> None:
        """Apply the summary, or fall back to truncation when it failed."""
        if completion is not None:
            self._account(state, completion)
            self._apply_summary(state, completion.text, request[1], request[2])
        else:
            assert error is not None
            self._not_sent(state, error)
            LOG.warning("summary for compaction failed [%s]; truncating instead", error.code)
            _truncate_middle(state.messages, self.settings.keep_last)
        self._compacted(state)

    def _plan(self, task: str) -> Plan[AgentResult]:
        """The whole run, written once: it yields the model calls and tool batches to make.

        :meth:`run` performs them in the sync shell and :meth:`arun` in the
        async one (:mod:`fluid_build.copilot.call.drive`), so the two cannot
        drift apart.
        """
        state = self._start(task)
        while not state.finished:
            self._check_budget(state)
            if self._needs_compaction(state):
                request = self._begin_compaction(state)
                if request is not None:
                    try:
                        summary = yield _Ask(self.client, request[0], dict(_SUMMARY_OPTIONS))
                    except AgentExecutionError as error:
                        self._end_compaction(state, request, None, error)
                    else:
                        self._end_compaction(state, request, summary, None)
            options = self._request(state)
            # Again: a summary may have used the last call, or the cost it needs.
            self._before_call(state, state.messages, options)
            state.usage.rounds += 1
            try:
                completion = yield _Ask(self.client, state.messages, options)
            except ContextOverflowError as error:
                self._not_sent(state, error)
                if not self._retry_after_overflow(state):
                    # Marked as the loop's: only here does compacting earlier help, so
                    # only this overflow's hint names FLUID_AGENT_COMPACT_AFTER.
                    raise error.with_details(agent_loop=True) from error.__cause__
                continue
            state.overflow_retried = False
            calls = self._after_completion(state, completion)
            if calls:
                now, skipped = self._split_calls(state, calls)
                outcomes = yield _RunTools(self.registry, now, self.settings.max_concurrency)
                self._after_tools(state, outcomes, skipped)
        return self._finish(state)

    def run(self, task: str) -> AgentResult:
        """Run ``task`` to a validated final answer, or raise the typed error that stopped it."""
        return drive.run(self._plan(task))

    async def arun(self, task: str) -> AgentResult:
        """:meth:`run` on the running event loop: the same plan, in the async shell."""
        return await drive.arun(self._plan(task))

    def _finish(self, state: _State) -> AgentResult:
        state.usage.seconds = self.clock() - state.started
        self.result = AgentResult(
            output=state.output,
            text=state.text,
            transcript=state.messages,
            usage=state.usage,
            finished=True,
        )
        return self.result
