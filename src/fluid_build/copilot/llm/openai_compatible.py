"""Servers speaking OpenAI's chat completions: vLLM, llama.cpp, Groq, Mistral, OpenRouter ...

Each preset names its own fields where they differ from OpenAI's, from its API
reference (docs/llm-providers.md, "Call options", says which and where from):
the field of the answer's length cap, of the seed and of the reasoning effort,
and the call options the server has no field for (refused before sending).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from fluid_build.copilot.llm.openai import CHAT_OPTIONS, OpenAIAdapter
from fluid_build.copilot.llm.types import CallSpec

__all__ = ["DIALECTS", "Dialect", "OpenAICompatibleAdapter"]


@dataclass(frozen=True, slots=True)
class Dialect:
    """Where one server's chat completions differ from OpenAI's, for the call options."""

    #: The field of the answer's length cap.
    max_tokens: str = "max_tokens"
    #: The field of the sampling seed.
    seed: str = "seed"
    #: ``reasoning_effort`` as OpenAI sends it, or ``reasoning`` as ``{"effort": ...}``.
    reasoning: str = "reasoning_effort"
    #: Call options the server has no field for.
    lacks: frozenset[str] = frozenset()
    #: The server takes a tool's name as ``tool_choice`` (llama.cpp takes only the words).
    named_tool_choice: bool = True


#: Servers without their own entry (``openai_compatible``, any server the caller points
#: at): OpenAI's fields, except ``max_tokens``, the one every such server knows.
_GENERIC: Final = Dialect()

#: Each preset's dialect (settings.PROVIDERS names the presets). Sources: each
#: provider's API reference, as docs/llm-providers.md ("Call options") cites them.
DIALECTS: Final[Mapping[str, Dialect]] = {
    # Groq, Cerebras, xAI: max_tokens is deprecated there in favour of max_completion_tokens.
    "groq": Dialect(max_tokens="max_completion_tokens"),
    "cerebras": Dialect(max_tokens="max_completion_tokens"),
    "xai": Dialect(max_tokens="max_completion_tokens"),
    # Mistral: the seed is random_seed; no reasoning effort (Magistral reasons by itself).
    "mistral": Dialect(seed="random_seed", lacks=frozenset({"reasoning_effort"})),
    # OpenRouter normalises reasoning across its models as reasoning: {effort}.
    "openrouter": Dialect(reasoning="reasoning"),
    # DeepSeek: no seed, no parallel_tool_calls, no reasoning effort (deepseek-reasoner
    # always reasons).
    "deepseek": Dialect(lacks=frozenset({"seed", "parallel_tool_calls", "reasoning_effort"})),
    # Together's and Fireworks' chat-completions references name no parallel_tool_calls
    # (and Fireworks' no seed): refused rather than sent to a server that may ignore it.
    "together": Dialect(lacks=frozenset({"parallel_tool_calls"})),
    "fireworks": Dialect(lacks=frozenset({"seed", "parallel_tool_calls"})),
    "vllm": _GENERIC,
    # llama.cpp's server: tool_choice is only auto/none/required; reasoning effort is a
    # chat-template argument there (chat_template_kwargs), not a request field.
    "llamacpp": Dialect(lacks=frozenset({"reasoning_effort"}), named_tool_choice=False),
}


class OpenAICompatibleAdapter(OpenAIAdapter):
    """The OpenAI adapter on another base URL; the key is optional (local servers need none)."""

    provider = "openai_compatible"
    default_base_url = None

    @property
    def dialect(self) -> Dialect:
        return DIALECTS.get(self.config.provider, _GENERIC)

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
