"""Servers speaking OpenAI's chat completions: vLLM, llama.cpp, Groq, Mistral, OpenRouter."""

from __future__ import annotations

from typing import Any

from fluid_build.copilot.llm.openai import OpenAIAdapter
from fluid_build.copilot.llm.types import CallSpec

__all__ = ["OpenAICompatibleAdapter"]


class OpenAICompatibleAdapter(OpenAIAdapter):
    """The OpenAI adapter on another base URL; the key is optional (local servers need none)."""

    provider = "openai_compatible"
    default_base_url = None

    def body(self, spec: CallSpec, *, stream: bool) -> dict[str, Any]:
        body = super().body(spec, stream=stream)
        # Older servers (vLLM, llama.cpp) know max_tokens, not max_completion_tokens,
        # and several reject stream_options.
        if "max_completion_tokens" in body:
            body["max_tokens"] = body.pop("max_completion_tokens")
        body.pop("stream_options", None)
        return body
