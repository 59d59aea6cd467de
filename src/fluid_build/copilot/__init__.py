"""The LLM layer of fluid_build: provider calls, retries and agents.

``from fluid_build.copilot import LLMClient`` is the public entry point; the
heavy parts (pydantic models, adapters) load on first use, not at import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fluid_build._lazy import lazy_attributes

if TYPE_CHECKING:
    from fluid_build.copilot.client import LLMClient
    from fluid_build.copilot.llm.fallback import Fallback
    from fluid_build.copilot.llm.types import Completion, StreamEvent, ToolCall, ToolSpec, Usage

__all__ = ["Completion", "Fallback", "LLMClient", "StreamEvent", "ToolCall", "ToolSpec", "Usage"]


_TYPES = "fluid_build.copilot.llm.types"
__getattr__ = lazy_attributes(
    __name__,
    {
        "LLMClient": "fluid_build.copilot.client",
        "Fallback": "fluid_build.copilot.llm.fallback",
        **dict.fromkeys(("Completion", "StreamEvent", "ToolCall", "ToolSpec", "Usage"), _TYPES),
    },
)
