"""Servers speaking OpenAI's chat completions: vLLM, llama.cpp, Groq, Mistral, OpenRouter ...

Each preset names its own fields where they differ from OpenAI's (its entry's
``dialect`` in llm/registry.py), from its API reference (docs/llm-providers.md,
"Call options", says which and where from): the field of the answer's length
cap, of the seed and of the reasoning effort, and the call options the server
has no field for (refused before sending).
"""

from __future__ import annotations

from typing import Any, Final

from fluid_build.copilot.llm.openai import CHAT_OPTIONS, OpenAIAdapter
from fluid_build.copilot.llm.registry import PROVIDERS, Dialect
from fluid_build.copilot.llm.types import CallSpec

__all__ = ["Dialect", "OpenAICompatibleAdapter"]


#: Servers without a dialect of their own (``openai_compatible``, any server the caller
#: points at): OpenAI's fields, except ``max_tokens``, the one every such server knows.
_GENERIC: Final = Dialect()


class OpenAICompatibleAdapter(OpenAIAdapter):
    """The OpenAI adapter on another base URL; the key is optional (local servers need none)."""

    provider = "openai_compatible"
    default_base_url = None

    @property
    def dialect(self) -> Dialect:
        # Each preset's dialect is in its registry entry (llm/registry.py, with its sources).
        entry = PROVIDERS.get(self.config.provider)
        return entry.dialect if entry is not None and entry.dialect is not None else _GENERIC

    def supported_options(self, model: str) -> frozenset[str]:
        # Per model (xAI's reasoning models refuse stop, most refuse reasoning_effort): the
        # model rules of call/capabilities.py, with their sources.
        return CHAT_OPTIONS - self.dialect.lacks

    def fields(self, spec: CallSpec, *, stream: bool) -> dict[str, Any]:
        dialect = self.dialect
        body = super().fields(spec, stream=stream)
        if "max_completion_tokens" in body and dialect.max_tokens != "max_completion_tokens":
            body[dialect.max_tokens] = body.pop("max_completion_tokens")
        if "seed" in body and dialect.seed != "seed":
            body[dialect.seed] = body.pop("seed")
        if "reasoning_effort" in body and dialect.reasoning == "reasoning":
            body["reasoning"] = {"effort": body.pop("reasoning_effort")}
        choice = body.get("tool_choice")
        if isinstance(choice, dict) and not dialect.named_tool_choice:
            # Forcing one named tool is "required" with that tool alone on offer.
            name = choice["function"]["name"]
            body["tool_choice"] = "required"
            body["tools"] = [t for t in body["tools"] if t["function"]["name"] == name]
        # stream_options stays: a server that refuses it (vLLM before 0.5, Fireworks in 2024)
        # is asked again without it, once per client (OpenAIAdapter.refused_own_field).
        return body
