"""One place that maps every failure to the ``fluid`` command's exit code.

The words printed with it come from :mod:`fluid_build.cli._messages`, which
imports this module (never the other way).
"""

from __future__ import annotations

from typing import Any, Final

from fluid_build.errors import FluidError

__all__ = [
    "CONFIGURATION_CODES",
    "EXIT_CODES",
    "Interrupted",
    "PromptsFileError",
    "exit_code_for",
]

#: Exit codes by failure family (docs/cli.md lists them for scripts).
EXIT_CODES: Final = {
    "ok": 0,
    "internal": 1,  # a bug: please report it
    "usage": 2,  # click's own: a wrong option or argument
    "intent": 3,  # the intent (or cassette) file is missing or invalid (CassetteError)
    "output": 4,  # an --out that cannot be written (OutputTreeError, OutputPathError)
    "prompts": 5,  # fluid batch: the prompts file is missing, not a regular file, too large, empty
    "auth": 10,  # ProviderAuthError, and a setting that cannot be used (CONFIGURATION_CODES)
    "rate_limit": 11,  # RateLimitError, quota exhausted included
    "timeout": 12,  # ProviderTimeoutError, and connection failures
    "context_overflow": 13,  # ContextOverflowError
    "server": 14,  # ProviderServerError
    "provider": 15,  # any other ProviderError (invalid request, model not found ...)
    "schema": 20,  # SchemaValidationError
    "tool": 21,  # ToolValidationError
    "agent": 22,  # any other AgentExecutionError (budgets, tool timeouts)
    # A replay differed from its cassette: fluid forge --replay (ReplayMismatch: a request
    # the cassette does not hold, or one never sent), fluid corpus replay (an outcome).
    "corpus_mismatch": 30,
    "interrupted": 130,  # Ctrl-C (SIGINT): one line, nothing half-written
}

#: Reason codes of a configuration problem, not of the provider's answer: a setting that
#: cannot be used (a malformed base URL, no provider or model resolved). They exit 10,
#: with a missing or rejected key: what to fix is in the environment, not the request.
CONFIGURATION_CODES: Final = frozenset({"llm.not_configured", "llm.bad_endpoint"})


class Interrupted(BaseException):
    """Ctrl-C, as ``fluid`` raises it to end a command (exit 130).

    Not a KeyboardInterrupt: click answers that with a line of its own (a blank one, or
    ``Aborted!``), where ``fluid: interrupted`` must be the only one.
    """


class PromptsFileError(FluidError):
    """``fluid batch``: the prompts file cannot be used (missing, not a regular file, too
    large, not text, empty).

    Defined here, below :mod:`fluid_build.cli.batch`, so that the exit-code map needs no
    command module. ``hint`` says what to do; the exit code is 5 (docs/cli.md).
    """

    def __init__(self, message: str, hint: str) -> None:
        super().__init__(message)
        self.hint = hint

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.hint))


def exit_code_for(exc: BaseException) -> int:
    """The exit code for an exception that ended a command."""
    from fluid_build._files import OutputPathError
    from fluid_build.copilot.agents.errors import (
        AgentExecutionError,
        ContextOverflowError,
        ProviderAuthError,
        ProviderError,
        ProviderServerError,
        ProviderTimeoutError,
        RateLimitError,
        SchemaValidationError,
        ToolValidationError,
    )
    from fluid_build.corpus.cassette import CassetteError
    from fluid_build.corpus.compare import ReplayMismatch
    from fluid_build.forge.app import OutputTreeError
    from fluid_build.forge.intent import IntentError

    if isinstance(exc, IntentError | CassetteError):
        return EXIT_CODES["intent"]
    if isinstance(exc, OutputTreeError | OutputPathError):
        return EXIT_CODES["output"]
    if isinstance(exc, PromptsFileError):
        return EXIT_CODES["prompts"]
    if isinstance(exc, ReplayMismatch):
        return EXIT_CODES["corpus_mismatch"]
    family = [
        (ProviderAuthError, "auth"),
        (RateLimitError, "rate_limit"),
        (ProviderTimeoutError, "timeout"),
        (ContextOverflowError, "context_overflow"),
        (ProviderServerError, "server"),
        (SchemaValidationError, "schema"),
        (ToolValidationError, "tool"),
    ]
    for cls, name in family:
        if isinstance(exc, cls):
            return EXIT_CODES[name]
    if isinstance(exc, ProviderError):
        if exc.code == "llm.network_error":
            return EXIT_CODES["timeout"]
        if exc.code in CONFIGURATION_CODES:
            return EXIT_CODES["auth"]
        return EXIT_CODES["provider"]
    if isinstance(exc, AgentExecutionError):
        return EXIT_CODES["agent"]
    return EXIT_CODES["internal"]
