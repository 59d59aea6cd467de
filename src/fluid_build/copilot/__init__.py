"""The LLM layer of fluid_build: provider calls, retries and agents.

``from fluid_build.copilot import LLMClient`` is the public entry point; the
heavy parts (pydantic models, adapters) load on first use, not at import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fluid_build.copilot.client import LLMClient
    from fluid_build.copilot.llm.types import Completion, StreamEvent, ToolCall, ToolSpec, Usage

__all__ = ["Completion", "LLMClient", "StreamEvent", "ToolCall", "ToolSpec", "Usage"]


def __getattr__(name: str) -> Any:
    if name == "LLMClient":
        from fluid_build.copilot.client import LLMClient

        return LLMClient
    if name in {"Completion", "StreamEvent", "ToolCall", "ToolSpec", "Usage"}:
        from fluid_build.copilot.llm import types

        return getattr(types, name)
    raise AttributeError(f"module 'fluid_build.copilot' has no attribute {name!r}")
