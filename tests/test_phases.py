"""Phase limits: their settings (issue 33 item 2).

How each limit ends an attempt on every transport is the conformance suite's
(tests/test_conformance.py, the ``phase-*`` scenarios of tests/hostile.py).
"""

from __future__ import annotations

from typing import Any

import pytest

from fluid_build.copilot import LLMClient
from fluid_build.copilot.agents.errors import (
    AgentExecutionError,
)
from fluid_build.copilot.call.envelope import RetryEnvelope, RetryPolicy
from fluid_build.copilot.call.phases import (
    DEFAULT_CONNECT,
    DEFAULT_FIRST_TOKEN,
    PhaseLimits,
)

POLICY = RetryPolicy(attempts=3, backoff_base=0.05, backoff_cap=0.2, jitter=0.0, deadline=1000.0)


# -- settings ------------------------------------------------------------------------------

LIMIT_VARIABLES = {
    "connect_timeout": "FLUID_LLM_CONNECT_TIMEOUT_SECONDS",
    "first_token_timeout": "FLUID_LLM_FIRST_TOKEN_TIMEOUT_SECONDS",
    "idle_timeout": "FLUID_LLM_IDLE_TIMEOUT_SECONDS",
}


def _client(env: dict[str, str], **kwargs: Any) -> LLMClient:
    return LLMClient(
        "openai",
        "gpt-4o-mini",
        api_key="sk-test",
        env=env,
        envelope=RetryEnvelope(POLICY, cooldown=None),
        **kwargs,
    )


def test_the_defaults_follow_the_attempt_timeout() -> None:
    assert _client({}).phases == PhaseLimits(DEFAULT_CONNECT, DEFAULT_FIRST_TOKEN, 120.0)
    assert _client({}, timeout=5.0).phases == PhaseLimits(5.0, DEFAULT_FIRST_TOKEN, 5.0)
    assert _client({}, timeout=900.0).phases == PhaseLimits(DEFAULT_CONNECT, 900.0, 900.0)


def test_arguments_win_over_the_environment() -> None:
    env = dict.fromkeys(LIMIT_VARIABLES.values(), "7")
    assert _client(env).phases == PhaseLimits(7.0, 7.0, 7.0)
    client = _client(env, connect_timeout=1, first_token_timeout=2.5, idle_timeout=3)
    assert client.phases == PhaseLimits(1.0, 2.5, 3.0)


@pytest.mark.parametrize("argument", sorted(LIMIT_VARIABLES))
@pytest.mark.parametrize("raw", ["soon", "-1", "0", "nan", "inf", "1e9"])
def test_a_bad_value_is_not_configured_naming_the_variable(argument: str, raw: str) -> None:
    variable = LIMIT_VARIABLES[argument]
    with pytest.raises(AgentExecutionError) as caught:
        _client({variable: raw})
    assert caught.value.code == "llm.not_configured"
    assert caught.value.details["variable"] == variable
    assert variable in str(caught.value)
    with pytest.raises(AgentExecutionError) as given:
        _client({}, **{argument: -5})
    assert given.value.code == "llm.not_configured"
    assert f"{argument}=" in str(given.value)
