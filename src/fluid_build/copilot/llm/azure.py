"""Azure OpenAI: the chat-completions wire format on a deployment URL, with an api-key header."""

from __future__ import annotations

from fluid_build.copilot.llm.openai import OpenAIAdapter

__all__ = ["AZURE_API_VERSION", "AzureOpenAIAdapter"]

AZURE_API_VERSION = "2024-10-21"


class AzureOpenAIAdapter(OpenAIAdapter):
    """``model`` is the deployment name; ``base_url`` the resource endpoint."""

    provider = "azure"
    default_base_url = None

    def url(self) -> str:
        endpoint = (self.config.base_url or "").rstrip("/")
        version = self.config.api_version or AZURE_API_VERSION
        return (
            f"{endpoint}/openai/deployments/{self.config.model}/chat/completions"
            f"?api-version={version}"
        )

    def headers(self) -> dict[str, str]:
        headers = {"content-type": "application/json", **self.config.headers}
        if self.config.api_key:
            headers["api-key"] = self.config.api_key
        return headers
