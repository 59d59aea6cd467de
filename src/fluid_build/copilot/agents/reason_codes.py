"""The reason-code table: every code an error of fluid_build carries, what it means, what to do.

``code`` is the stable string callers branch on (``llm.rate_limited``); each row also says
whether the code is retryable by default and the operator's next step. The errors of
:mod:`fluid_build.copilot.agents.errors` read their ``action`` and ``hint()`` from here;
docs/typed-errors.md lists every row (a test keeps them in step).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

__all__ = ["REASON_CODES", "ReasonCode"]


@dataclass(frozen=True, slots=True)
class ReasonCode:
    """One row of the reason-code table.

    ``action`` is the operator's next step, in terms a shell can act on (a
    ``fluid`` command, a flag, an environment variable). ``waited``, for codes
    where waiting helps, is the step when the wait is known: its ``{wait}``
    becomes ``"until 14:03:12 UTC (62 s)"`` in the hint and ``"62 s"`` in the
    action (see :meth:`~fluid_build.copilot.agents.errors.AgentExecutionError.hint`).
    """

    code: str
    retryable: bool
    meaning: str
    action: str
    waited: str | None = None


def _table(*rows: ReasonCode) -> Mapping[str, ReasonCode]:
    return {row.code: row for row in rows}


_KEEPS_HAPPENING: Final = (
    "if it keeps happening, run fewer fluid processes at once on this key, or raise "
    "FLUID_LLM_MAX_ATTEMPTS (default 3) so the envelope retries longer."
)
_PERSISTS: Final = (
    "if it persists, check the provider's status page, or set FLUID_LLM_FALLBACKS "
    "(e.g. FLUID_LLM_FALLBACKS=anthropic:claude-sonnet-4-6) to fall back to another model."
)

#: Every reason code fluid_build emits, what it means and what to do about it.
#: ``retryable`` is the default for the code; the error instance has the final say.
REASON_CODES: Final[Mapping[str, ReasonCode]] = _table(
    ReasonCode(
        "llm.rate_limited",
        True,
        "The provider throttled this key.",
        f"Wait a minute and run again; {_KEEPS_HAPPENING}",
        f"Wait {{wait}} and run again; {_KEEPS_HAPPENING}",
    ),
    ReasonCode(
        "llm.quota_exhausted",
        False,
        "Quota, credits or billing are exhausted; retrying cannot help.",
        "Top up credits, raise the quota or fix billing in the provider's console, then run "
        "again; waiting does not help.",
    ),
    ReasonCode(
        "llm.timeout",
        True,
        "No answer within the timeout.",
        "Check the network, then raise FLUID_LLM_TIMEOUT_SECONDS (default 120) for a slow "
        "proxy or a large local model and run again.",
    ),
    ReasonCode(
        "llm.network_error",
        True,
        "The connection failed before an answer arrived.",
        "Check that the endpoint is reachable from this machine (DNS, HTTPS_PROXY, the base "
        "URL `fluid doctor` shows), then run again.",
    ),
    ReasonCode(
        "llm.tls_error",
        False,
        "The TLS certificate of the endpoint could not be verified.",
        "Check the base URL `fluid doctor` shows; behind a proxy that re-signs TLS, set "
        "SSL_CERT_FILE to its CA bundle.",
    ),
    ReasonCode(
        "llm.bad_endpoint",
        False,
        "The endpoint URL is malformed, unsupported or redirects.",
        "Fix the base URL variable (OPENAI_BASE_URL, AZURE_OPENAI_ENDPOINT, OLLAMA_HOST ...): "
        "an http:// or https:// URL, the final one rather than a redirect; `fluid doctor` "
        "shows what is in use.",
    ),
    ReasonCode(
        "llm.endpoint_not_found",
        False,
        "The URL answered 404/405 without naming a model.",
        "Check the base URL `fluid doctor` shows (and AZURE_OPENAI_API_VERSION for Azure): a "
        "proxy or a wrong path answered.",
    ),
    ReasonCode(
        "llm.server_error",
        True,
        "The provider failed on its side (5xx).",
        f"Run again in a few minutes; {_PERSISTS}",
        f"Wait {{wait}} and run again; {_PERSISTS}",
    ),
    ReasonCode(
        "llm.overloaded",
        True,
        "The provider is overloaded (Anthropic 529, Gemini 503).",
        f"Run again in a few minutes, or use a less busy model (--model); {_PERSISTS}",
        f"Wait {{wait}} and run again, or use a less busy model (--model); {_PERSISTS}",
    ),
    ReasonCode(
        "llm.circuit_open",
        True,
        "The circuit breaker for this endpoint, model and key is open after repeated failures.",
        "Run again once the breaker half-opens (`fluid doctor` shows until when), or run "
        "`fluid doctor --reset` once the provider is healthy; FLUID_LLM_FALLBACKS routes "
        "calls to another model meanwhile.",
        "Wait {wait} for the breaker to half-open and run again, or run "
        "`fluid doctor --reset` once the provider is healthy; FLUID_LLM_FALLBACKS routes "
        "calls to another model meanwhile.",
    ),
    ReasonCode(
        "llm.insufficient_resources",
        False,
        "A local server lacks memory to load the model.",
        "Free memory on the inference host, or run again with a smaller model (--model).",
    ),
    ReasonCode(
        "llm.not_configured",
        False,
        "No provider, model or endpoint could be resolved for the call.",
        "Set the variable the message names (FLUID_LLM_PROVIDER, FLUID_LLM_MODEL, "
        "OPENAI_BASE_URL ...), give --provider and --model, or run "
        "`fluid ai setup --provider <name>`.",
    ),
    ReasonCode(
        "llm.auth",
        False,
        "The API key is missing, invalid, expired or not allowed here.",
        "Check the provider's key variable (OPENAI_API_KEY, ANTHROPIC_API_KEY, GEMINI_API_KEY "
        "..., or FLUID_LLM_API_KEY) in the shell running fluid, or run "
        "`fluid ai setup --provider <name>`.",
    ),
    ReasonCode(
        "llm.context_overflow",
        False,
        "The prompt does not fit the model's context window.",
        "Shorten the inputs, or run again with a larger-window model (--model).",
    ),
    ReasonCode(
        "llm.invalid_request",
        False,
        "The provider rejected the request as malformed.",
        "Read the provider's message: this model refuses a parameter or the schema sent; run "
        "again with another model (--model), and report it if this one should accept it.",
    ),
    ReasonCode(
        "llm.unsupported_option",
        False,
        "The call set an option (temperature, seed, stop ...) that this provider has no field "
        "for, or that this model refuses; nothing was sent.",
        "Leave out the option the message names (--temperature, --seed ... on the command "
        "line) or run again with a model that takes it (--model); a fallback in "
        "FLUID_LLM_FALLBACKS that takes it answers instead.",
    ),
    ReasonCode(
        "llm.model_not_found",
        False,
        "The model or deployment does not exist for this key.",
        "Check the model name (--model or FLUID_LLM_MODEL): for Ollama run "
        "`ollama pull <model>` first, for Azure give the deployment name.",
    ),
    ReasonCode(
        "llm.content_filtered",
        False,
        "The provider's content filter refused the request.",
        "Rephrase the inputs that triggered the filter; the same prompt gets the same refusal.",
    ),
    ReasonCode(
        "llm.deadline_exceeded",
        False,
        "The call's deadline passed (details say where: connect, headers, body, stream "
        "event N, or a wait).",
        "Raise FLUID_LLM_DEADLINE_SECONDS (default 600) if the model is slow but answering; "
        "otherwise check the server, the network or the proxy.",
    ),
    ReasonCode(
        "llm.response_too_large",
        False,
        "The answer or stream went past a size limit (decompressed bytes, stream events, or "
        "one stream event's bytes).",
        "Raise FLUID_LLM_MAX_RESPONSE_BYTES, FLUID_LLM_MAX_STREAM_EVENTS or "
        "FLUID_LLM_MAX_EVENT_BYTES (the one details['unit'] and the message name) if the "
        "answer is legitimately that big; otherwise ask for less output.",
    ),
    ReasonCode(
        "llm.malformed_response",
        True,
        "The provider's answer could not be decoded.",
        "Run again (a cut-off body is usually transient); if it persists, or the answer came "
        "in an encoding fluid does not accept (details['content_encoding']: fluid asks for "
        "gzip or deflate only), something between you and the provider (HTTPS_PROXY, the "
        "base URL `fluid doctor` shows) rewrites answers.",
    ),
    ReasonCode(
        "llm.provider_error",
        False,
        "The provider failed in a way fluid_build does not recognise.",
        "Read the provider's message and run again; if it persists, report it with the "
        "--json output so it can be classified.",
    ),
    ReasonCode(
        "llm.unknown_error",
        False,
        "An unexpected exception happened around the provider call.",
        "This is likely a bug in fluid_build: report it with the command you ran and its "
        "--json output.",
    ),
    ReasonCode(
        "llm.cancelled",
        False,
        "The call was cancelled or interrupted.",
        "Nothing to fix: run the command again when ready.",
    ),
    ReasonCode(
        "llm.client_closed",
        False,
        "The call's own client was closed (close() or aclose(), from another thread or task) "
        "while the call was in flight; the provider did nothing wrong and nothing was "
        "counted against it.",
        "Nothing to fix at the provider: close the client only after its calls have ended, "
        "then run the call again on an open client.",
    ),
    ReasonCode(
        "llm.schema_violation",
        False,
        "The model's output did not match the expected schema.",
        "Run again with a stronger model (--model); for OpenAI, FLUID_OPENAI_STRICT_SCHEMA=1 "
        "constrains the output to the schema.",
    ),
    ReasonCode(
        "llm.parse_error",
        False,
        "The model's output was not valid JSON.",
        "Run again with a model that supports structured output (--model); for OpenAI, "
        "FLUID_OPENAI_STRICT_SCHEMA=1.",
    ),
    ReasonCode(
        "tool.invalid_input",
        False,
        "A tool call's arguments did not match the tool's schema.",
        "Usually nothing: the agent loop feeds this back to the model; if runs still fail, "
        "use a model with stronger tool use (--model) or run without --agent-loop.",
    ),
    ReasonCode(
        "tool.unknown_tool",
        False,
        "The model called a tool that does not exist.",
        "Usually nothing: the agent loop lists the real tools to the model; if runs still "
        "fail, use a model with stronger tool use (--model) or run without --agent-loop.",
    ),
    ReasonCode(
        "tool.workspace_violation",
        False,
        "A tool call pointed outside the workspace root.",
        "Usually nothing: the loop refuses it. Keep the files the model should read next to "
        "the intent file; if the model keeps trying, run without --agent-loop.",
    ),
    ReasonCode(
        "tool.timeout",
        False,
        "A tool body exceeded its timeout.",
        "Keep the workspace (the intent file's directory) small, or run without --agent-loop.",
    ),
    ReasonCode(
        "tool.execution_error",
        False,
        "A tool body raised an exception.",
        "Read the log for the tool's exception (the model saw only its class); run without "
        "--agent-loop to skip tools.",
    ),
    ReasonCode(
        "budget.rounds_exhausted",
        False,
        "The agent loop reached its round limit without a final answer.",
        "Raise FLUID_AGENT_MAX_ROUNDS (default 12), or run again with a stronger model "
        "(--model); the transcript so far is kept.",
    ),
    ReasonCode(
        "budget.llm_calls_exhausted",
        False,
        "The run made as many model calls as its budget allows.",
        "Run again with a stronger model (--model) that needs fewer corrections, or simplify "
        "the intent.",
    ),
    ReasonCode(
        "budget.tool_calls_exhausted",
        False,
        "The run made as many tool calls as its budget allows.",
        "The model loops on its tools: run again with a stronger model (--model), or without "
        "--agent-loop.",
    ),
    ReasonCode(
        "budget.seconds_exhausted",
        False,
        "The run used all the seconds its budget allows.",
        "Run again with a faster model or endpoint (--model), or simplify the intent.",
    ),
    ReasonCode(
        "budget.tokens_exhausted",
        False,
        "The run used all the tokens its budget allows.",
        "Compact earlier (FLUID_AGENT_COMPACT_AFTER=4), shorten the inputs, or run again with "
        "a model that needs fewer turns (--model).",
    ),
    ReasonCode(
        "budget.cost_exhausted",
        False,
        "The run, or the shared USD budget (FLUID_BUDGETS), has no room left for this call.",
        "Ask for a shorter answer, which reserves less (--max-output-tokens, or "
        "FLUID_LLM_MAX_OUTPUT_TOKENS), or use a cheaper model (--model); else wait for the "
        "budget's window to reset (`fluid doctor` shows when), or raise it in FLUID_BUDGETS.",
    ),
    ReasonCode(
        "budget.cost_unknown",
        False,
        "No price is known for the model, so a call under a shared USD budget cannot be metered.",
        "Give the model's price in USD per million tokens: "
        """FLUID_PRICES='{"my-model": {"input": 0.5, "output": 1.5}}' (docs/budgets.md), then """
        "run again.",
    ),
    ReasonCode(
        "budget.store_unavailable",
        True,
        "The shared store keeping the USD budget could not be reached; the call was not sent.",
        "Check the store `fluid doctor` shows (FLUID_COOLDOWN_URL) and run again, or set "
        "FLUID_BUDGET_FAIL_OPEN=1 to let calls through unmetered meanwhile.",
    ),
    ReasonCode(
        "agent.execution_failed",
        False,
        "An agent step failed.",
        "Read the message above; run again with --json for the details, and report it if "
        "the cause is unclear.",
    ),
)
