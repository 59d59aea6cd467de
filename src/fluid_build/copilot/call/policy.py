"""The retry decisions, pure: how many attempts, how long each wait, when to give up.

:func:`decide` is the envelope's one decision after a failed attempt, a
function of the error, the attempt number, the time spent, the
:class:`RetryPolicy` and a random draw: tested with tables, no clock, no sleep.
:class:`~fluid_build.copilot.call.envelope.RetryEnvelope` applies it (the
rules are listed in that module's docstring); :class:`MoveOn` is when a call
with a later entry in its chain gives this one up instead of retrying it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from fluid_build.config import env_int
from fluid_build.copilot.agents.errors import MAX_RETRY_AFTER, AgentExecutionError

__all__ = ["Decision", "MoveOn", "RetryPolicy", "backoff_wait", "decide", "moving_on", "silent"]


class RetryPolicy(BaseModel):
    """How many attempts, how long to wait between them, and when to stop.

    ``deadline`` bounds the whole call (attempts and waits), in seconds from
    its start; ``None`` means no bound beyond the attempts.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    attempts: int = Field(default=3, ge=1, le=100)
    backoff_base: float = Field(default=1.0, gt=0, le=300)
    backoff_cap: float = Field(default=8.0, gt=0, le=3600)
    jitter: float = Field(default=0.10, ge=0, le=1)
    retry_after_cap: float = Field(default=MAX_RETRY_AFTER, gt=0, le=MAX_RETRY_AFTER)
    deadline: float | None = Field(default=None, gt=0)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> RetryPolicy:
        """``FLUID_LLM_MAX_ATTEMPTS`` (1..100), ``FLUID_LLM_DEADLINE_SECONDS`` (600 s unset).

        Bad values warn once and the default is used.
        """
        import os

        from fluid_build.copilot.call.wire import deadline_from_env

        env = os.environ if env is None else env
        values: dict[str, Any] = {
            "attempts": env_int(env, "FLUID_LLM_MAX_ATTEMPTS", 3, minimum=1, maximum=100),
            "deadline": deadline_from_env(env),
        }
        values.update(overrides)
        return cls(**values)


def backoff_wait(attempt: int, policy: RetryPolicy, u: float) -> float:
    """The backoff after failed attempt number ``attempt`` (1-based), for a draw ``u`` in [0, 1).

    ``base * 2**(attempt-1)``, capped, then shortened by up to ``jitter``.
    """
    nominal = min(policy.backoff_base * 2.0 ** min(attempt - 1, 64), policy.backoff_cap)
    return nominal * (1.0 - policy.jitter * u)


@dataclass(frozen=True, slots=True)
class Decision:
    """What to do after a failed attempt: wait ``wait`` seconds, or give up (``wait is None``)."""

    wait: float | None
    reason: str

    @property
    def gives_up(self) -> bool:
        return self.wait is None


@dataclass(frozen=True, slots=True)
class MoveOn:
    """When a call with a later entry in its chain leaves this one without retrying it.

    ``silence``: after an attempt that ended on a phase limit (connect, first token,
    idle) before any byte of an answer. ``retry_after``: when the server asks to wait
    longer than this many seconds.
    """

    silence: bool = True
    retry_after: float = 10.0


def silent(error: AgentExecutionError) -> bool:
    """Whether ``error`` ended an attempt on a phase limit with no byte of an answer."""
    details = error.details
    return details.get("phase") in ("connect", "first_token", "idle") and not details.get(
        "bytes_received"
    )


def moving_on(error: AgentExecutionError, move_on: MoveOn | None) -> Decision | None:
    """The decision to leave this entry for the next (None: no reason to, or no next)."""
    if move_on is None or not error.retryable:
        return None
    if move_on.silence and silent(error):
        phase = str(error.details["phase"]).replace("_", " ")
        return Decision(None, f"moved on: the route said nothing within its {phase} limit")
    if error.retry_after is not None:
        requested = error.details.get("retry_after_requested")
        asked = float(requested) if isinstance(requested, int | float) else error.retry_after
        if asked > move_on.retry_after:
            return Decision(
                None,
                f"moved on: the server asked to wait {asked:.3g} s, longer than the "
                f"{move_on.retry_after:g} s move-on threshold",
            )
    return None


def decide(
    error: BaseException,
    attempt: int,
    elapsed: float,
    policy: RetryPolicy,
    u: float,
    deadline: float | Literal["policy"] | None = "policy",
    move_on: MoveOn | None = None,
) -> Decision:
    """The retry decision after ``attempt`` failed with ``error``, ``elapsed`` s into the call.

    ``deadline`` overrides the policy's (a half-open trial runs under a shorter one).
    ``move_on`` (given only when a later entry of the chain can answer) may give the
    entry up at once (:func:`moving_on`).
    """
    if deadline == "policy":
        deadline = policy.deadline
    if not isinstance(error, AgentExecutionError) or not error.retryable:
        return Decision(None, "not retryable")
    if error.code == "llm.circuit_open":
        return Decision(None, "gave up: the circuit breaker is open")
    moved = moving_on(error, move_on)
    if moved is not None:
        return moved
    if attempt >= policy.attempts:
        return Decision(None, f"gave up after {attempt} attempt(s)")
    if error.retry_after is not None:
        wait = min(error.retry_after, policy.retry_after_cap)
        requested = error.details.get("retry_after_requested")
        asked = float(requested) if isinstance(requested, int | float) else wait
        reason: str = "retry_after"
    else:
        wait = backoff_wait(attempt, policy, u)
        asked = wait
        reason = "backoff"
    if deadline is not None:
        left = max(deadline - elapsed, 0.0)
        if max(asked, wait) > left:
            who = "the server asked to wait" if reason == "retry_after" else "the next backoff is"
            return Decision(
                None,
                f"gave up: {who} {asked:.3g} s but only {left:.3g} s of the "
                f"{deadline:g} s deadline are left",
            )
    return Decision(wait, reason)
