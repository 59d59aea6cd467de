"""fluid_build: boringly reliable calls to LLM providers.

The public face, importable from here::

    from fluid_build import LLMClient, RateLimitError, RetryPolicy, classify_provider_error

- the client: :class:`LLMClient`, an entry of its fallback chain with settings of
  its own, :class:`Fallback`, and what a call returns, :class:`Completion` and
  :class:`Usage`;
- the error tree: :class:`FluidError` (the root of every error fluid_build
  raises), :class:`FluidGenerationError`, :class:`AgentExecutionError`,
  :class:`ProviderError` and its five kinds (:class:`RateLimitError`,
  :class:`ProviderTimeoutError`, :class:`ContextOverflowError`,
  :class:`ProviderAuthError`, :class:`ProviderServerError`),
  :class:`SchemaValidationError`, :class:`ToolValidationError`;
- the retry policy: :class:`RetryPolicy`, :class:`RetryEnvelope`;
- around your own httpx calls: :func:`classify_provider_error`,
  :func:`parse_retry_after`.

Each name is the very object at its home module (``fluid_build.copilot``,
``fluid_build.copilot.agents.errors``, ``...error_classification``,
``...retry``), so ``except fluid_build.RateLimitError`` catches what those
modules raise. ``import fluid_build`` stays cheap: a name loads its module
(httpx, pydantic) the first time it is used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from fluid_build._lazy import lazy_attributes
from fluid_build.errors import FluidError

if TYPE_CHECKING:
    from fluid_build.copilot.agents.error_classification import (
        classify_provider_error,
        parse_retry_after,
    )
    from fluid_build.copilot.agents.errors import (
        AgentExecutionError,
        ContextOverflowError,
        FluidGenerationError,
        ProviderAuthError,
        ProviderError,
        ProviderServerError,
        ProviderTimeoutError,
        RateLimitError,
        SchemaValidationError,
        ToolValidationError,
    )
    from fluid_build.copilot.call.envelope import RetryEnvelope, RetryPolicy
    from fluid_build.copilot.client import LLMClient
    from fluid_build.copilot.llm.fallback import Fallback
    from fluid_build.copilot.llm.types import Completion, Usage

__all__ = [
    "AgentExecutionError",
    "Completion",
    "ContextOverflowError",
    "Fallback",
    "FluidError",
    "FluidGenerationError",
    "LLMClient",
    "ProviderAuthError",
    "ProviderError",
    "ProviderServerError",
    "ProviderTimeoutError",
    "RateLimitError",
    "RetryEnvelope",
    "RetryPolicy",
    "SchemaValidationError",
    "ToolValidationError",
    "Usage",
    "__version__",
    "classify_provider_error",
    "parse_retry_after",
]

from fluid_build._version import __version__

_ERRORS: Final = "fluid_build.copilot.agents.errors"
# Each lazy name and the module that defines it.
_HOMES: Final = {
    "LLMClient": "fluid_build.copilot.client",
    "Completion": "fluid_build.copilot.llm.types",
    "Fallback": "fluid_build.copilot.llm.fallback",
    "Usage": "fluid_build.copilot.llm.types",
    "FluidGenerationError": _ERRORS,
    "AgentExecutionError": _ERRORS,
    "ProviderError": _ERRORS,
    "RateLimitError": _ERRORS,
    "ProviderTimeoutError": _ERRORS,
    "ContextOverflowError": _ERRORS,
    "ProviderAuthError": _ERRORS,
    "ProviderServerError": _ERRORS,
    "SchemaValidationError": _ERRORS,
    "ToolValidationError": _ERRORS,
    "RetryPolicy": "fluid_build.copilot.call.envelope",
    "RetryEnvelope": "fluid_build.copilot.call.envelope",
    "classify_provider_error": "fluid_build.copilot.agents.error_classification",
    "parse_retry_after": "fluid_build.copilot.agents.error_classification",
}


__getattr__ = lazy_attributes(__name__, _HOMES)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
