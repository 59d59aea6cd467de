"""Azure OpenAI: the chat-completions wire format on a deployment URL, with an api-key header."""

from __future__ import annotations

import re
from typing import Final

from fluid_build.copilot.llm.openai import CHAT_OPTIONS, OpenAIAdapter

__all__ = ["AZURE_API_VERSION", "AzureOpenAIAdapter"]

AZURE_API_VERSION = "2024-10-21"

#: The first API version with ``reasoning_effort`` (the o-series' field); the GA version
#: fluid defaults to predates it. A version that is not a date (``v1``, ``latest``,
#: ``preview``) is the current API, which has it.
_REASONING_SINCE: Final = "2024-12-01"
_DATED: Final = re.compile(r"\d{4}-\d{2}-\d{2}")


class AzureOpenAIAdapter(OpenAIAdapter):
    """``model`` is the deployment name; ``base_url`` the resource endpoint."""

    provider = "azure"
    default_base_url = None
    key_header = ("api-key", "{key}")
    default_api_version = AZURE_API_VERSION
    version_query = "api-version"
    models_path = "/openai/models"

    def supported_options(self, model: str) -> frozenset[str]:
        dated = _DATED.match(self.api_version or AZURE_API_VERSION)
        if dated and dated.group() < _REASONING_SINCE:
            return CHAT_OPTIONS - {"reasoning_effort"}
        return CHAT_OPTIONS

    def url(self) -> str:
        endpoint = (self.config.base_url or "").rstrip("/")
        return (
            f"{endpoint}/openai/deployments/{self.config.model}/chat/completions"
            f"?api-version={self.api_version}"
        )
