"""What stops an agent run: its budgets, and the worst case of the next call.

Deciding only, as plain functions over the run's :class:`Budget` and
:class:`LoopUsage`: each returns the :class:`Stop` that ends the run, or
``None``. The loop (``loop/agent.py``) checks them immediately before every
model call and raises the stop as an ``AgentExecutionError`` that keeps the
work done so far (docs/budgets.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from fluid_build.copilot.health.budget import usd_amount

if TYPE_CHECKING:
    from fluid_build.copilot.client import LLMClient

__all__ = ["Budget", "LoopUsage", "Stop", "WorstCase", "cost_stop", "spent_stop", "worst_case"]


class Budget(BaseModel):
    """Hard limits on one run; ``None`` is no limit. Cost needs known prices."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_llm_calls: int | None = Field(default=None, ge=1)
    max_tool_calls: int | None = Field(default=None, ge=0)
    max_seconds: float | None = Field(default=None, gt=0)
    max_total_tokens: int | None = Field(default=None, ge=1)
    max_cost_usd: float | None = Field(default=None, gt=0)


class LoopUsage(BaseModel):
    """What a run used, so far."""

    rounds: int = 0
    llm_calls: int = 0
    tool_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    seconds: float = 0.0
    cost_usd: float | None = None
    corrections: int = 0
    compactions: int = 0

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens


@dataclass(frozen=True, slots=True)
class Stop:
    """Why the run stops: the error's code, what ran out, and the error's details."""

    code: str
    what: str
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class WorstCase:
    """The most the next call can cost, on the dearest entry of the client's chain."""

    usd: float
    label: str
    input_tokens: int
    max_output_tokens: int


def spent_stop(budget: Budget, max_rounds: int, usage: LoopUsage) -> Stop | None:
    """The first budget ``usage`` has used up, in the order the loop has always checked."""
    if usage.rounds >= max_rounds:
        return Stop(
            "budget.rounds_exhausted",
            f"{usage.rounds} rounds without a final answer (FLUID_AGENT_MAX_ROUNDS={max_rounds})",
        )
    if budget.max_llm_calls is not None and usage.llm_calls >= budget.max_llm_calls:
        return Stop("budget.llm_calls_exhausted", f"{usage.llm_calls} model calls made")
    if budget.max_seconds is not None and usage.seconds >= budget.max_seconds:
        return Stop(
            "budget.seconds_exhausted",
            f"{usage.seconds:.1f} s used of {budget.max_seconds:g} s",
        )
    if budget.max_total_tokens is not None and usage.total_tokens >= budget.max_total_tokens:
        return Stop(
            "budget.tokens_exhausted",
            f"{usage.total_tokens} tokens used of {budget.max_total_tokens}",
        )
    if (
        budget.max_cost_usd is not None
        and usage.cost_usd is not None
        and usage.cost_usd >= budget.max_cost_usd
    ):
        return Stop(
            "budget.cost_exhausted",
            f"{usd_amount(usage.cost_usd)} USD spent of the run's max_cost_usd of "
            f"{usd_amount(budget.max_cost_usd)} USD",
            {"spent_usd": usage.cost_usd, "left_usd": 0.0, "limit_usd": budget.max_cost_usd},
        )
    return None


def worst_case(
    client: LLMClient,
    prices: Mapping[str, Any],
    messages: Sequence[Mapping[str, Any]],
    options: Mapping[str, Any],
) -> tuple[WorstCase | None, list[str]]:
    """The most the call could cost, as a shared budget reserves it (docs/budgets.md):
    the prompt it sends, counted as the pre-flight counts it, priced, plus
    ``max_output_tokens`` (else the model's maximum output), priced. A fallback
    may answer, so each entry is priced at its own model and the dearest counts.
    Also the entries no price is known for."""
    from fluid_build.copilot.call.capabilities import capabilities_for
    from fluid_build.copilot.call.preflight import prompt_tokens
    from fluid_build.copilot.call.prepare import response_schema, tool_spec
    from fluid_build.copilot.call.prices import worst_case_usd

    tools = [tool_spec(tool).as_dict() for tool in options.get("tools") or ()]
    response_model = options.get("response_model")
    wanted = options.get("max_output_tokens")
    worst: WorstCase | None = None
    unpriced: list[str] = []
    for entry in (client, *client.fallbacks):
        counted = list(tools)
        if response_model is not None:
            # The response schema travels with the prompt: counted like a tool.
            schema, _, name = response_schema(response_model, entry.strict_schema)
            counted.append({"name": name, "description": "", "parameters": schema})
        matrix = entry.capability_matrix or None
        tokens, _ = prompt_tokens(
            entry.provider, entry.model, options.get("system"), messages, counted, matrix
        )
        most = wanted
        if most is None:
            most = capabilities_for(entry.provider, entry.model, matrix).max_output_tokens
        usd = worst_case_usd(entry.provider, entry.model, tokens, most, overrides=prices)
        label = f"{entry.provider}:{entry.model}"
        if usd is None:
            unpriced.append(label)
        elif worst is None or usd > worst.usd:
            worst = WorstCase(usd, label, tokens, most)
    return worst, unpriced


def cost_stop(limit: float, spent: float, worst: WorstCase) -> Stop | None:
    """The stop BEFORE a call whose worst case would take the run past ``limit`` USD."""
    if spent + worst.usd <= limit:
        return None
    left = max(limit - spent, 0.0)
    return Stop(
        "budget.cost_exhausted",
        f"{usd_amount(spent)} USD spent of the run's max_cost_usd of {usd_amount(limit)} USD, "
        f"{usd_amount(left)} USD left, and the next call to {worst.label} needs up to "
        f"{usd_amount(worst.usd)} USD "
        f"({worst.input_tokens} input tokens and up to {worst.max_output_tokens} output "
        "tokens, priced); no request was sent (raise max_cost_usd, lower "
        "max_output_tokens or use a cheaper model)",
        {
            "spent_usd": spent,
            "left_usd": left,
            "limit_usd": limit,
            "needed_usd": worst.usd,
            "model": worst.label,
            "input_tokens": worst.input_tokens,
            "max_output_tokens": worst.max_output_tokens,
        },
    )
