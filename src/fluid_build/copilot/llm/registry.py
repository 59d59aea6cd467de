"""Every provider fluid can call: one frozen entry each, and nothing else.

A provider is one adapter module (its wire format, under ``copilot/llm/``, with
its credential step) and one :class:`ProviderEntry` in :data:`PROVIDERS`. Every
other part reads the entry: the settings resolver (key, URL, model, endpoint),
the client (the adapter, imported by its dotted path only when a client is
made), the prices (genai-prices' id), the call (OpenAI strict schema), the
capability matrix (the family whose rows apply), ``fluid doctor`` and
``fluid ai``. ``tests/test_architecture.py`` fails the build if a list of
provider names appears anywhere else, so a new provider cannot be half added.

This module imports no adapter and no other part of fluid_build: importing it
costs a few dataclasses (tests/test_import_cost.py), and it sits below every
layer, so the error contract (copilot/agents/) reads it too.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

__all__ = ["PROVIDERS", "Dialect", "ProviderEntry", "load"]


@dataclass(frozen=True, slots=True)
class Dialect:
    """Where one OpenAI-compatible server's chat completions differ from OpenAI's, for the
    call options (docs/llm-providers.md, "Call options", cites each from its API reference)."""

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


@dataclass(frozen=True, slots=True)
class ProviderEntry:
    """One provider as the user names it (``--provider``, ``FLUID_LLM_PROVIDER``)."""

    #: The name the user gives, lower case.
    name: str
    #: The adapter's name: its module under ``copilot/llm/`` and its ``provider``.
    adapter: str
    #: The adapter class as ``"package.module:Class"``, imported when a client is made.
    adapter_class: str
    #: The variables the key is read from, in order (``FLUID_LLM_API_KEY`` beats them all).
    key_vars: tuple[str, ...] = ()
    #: A missing key is ``ProviderAuthError`` before any request (False: sent when set).
    key_required: bool = False
    #: The model when neither ``model=`` nor ``FLUID_LLM_MODEL`` names one (None: required).
    default_model: str | None = None
    #: The variable the base URL is read from.
    base_url_var: str | None = None
    #: The URL the resolved config carries when none is given (a hosted preset's home).
    default_base_url: str | None = None
    #: A model name shown when one is required and missing.
    model_example: str = "my-model"
    #: What the model is called at this provider, in that message.
    model_noun: str = "model name"
    #: Picked without FLUID_LLM_PROVIDER when its key is the only one of these set.
    auto: bool = False
    #: Set: a base URL is required; a missing one is reported as this (``{name}``: the name).
    url_required: str | None = None
    #: The URL shown as an example for this provider (default: its variable's example).
    url_example: str | None = None
    #: The URL variable may hold ``host:port`` alone (http is meant).
    bare_host: bool = False
    #: Set: only a loopback host is accepted unless this variable says yes (1/true/yes/on).
    remote_switch: str | None = None
    #: The variables the API version is read from, in order.
    version_vars: tuple[str, ...] = ()
    #: ``"package.module:function"`` turning ``(url, key, env)`` into the URL, or into
    #: ``(url, region, key)``: a cloud's endpoint (its library loads only for this provider).
    endpoint_step: str | None = None
    #: The settings ``fluid ai setup`` stores for this provider (never a credential).
    stored_settings: tuple[str, ...] = ()
    #: Whose cloud credentials the adapter signs with (``fluid doctor`` shows where from).
    cloud: Literal["aws", "google"] | None = None
    #: genai-prices' provider id (None: no price unless the user gives one).
    price_id: str | None = None
    #: A server the user runs: in no price list, whatever its models are called.
    local: bool = False
    #: On a local URL, ask the server its context window (llm/local_server.py).
    probe_window: bool = False
    #: The API has OpenAI's strict-schema mode (``FLUID_OPENAI_STRICT_SCHEMA``).
    strict_schema: bool = False
    #: The capability matrix's section whose rows apply (None: models named freely).
    family: str | None = None
    #: An OpenAI-compatible server's own field names (None: OpenAI's).
    dialect: Dialect | None = None
    #: The prefix its keys start with, to warn about a key pasted for another provider.
    key_prefix: str | None = None
    #: OpenTelemetry's ``gen_ai.provider.name`` for it (None: fluid's name).
    otel_name: str | None = None
    #: The host name endings of its API: an error on such a URL names this provider.
    hosts: tuple[str, ...] = ()
    #: A server the user starts with ``--api-key``: the advice for a rejected key names it.
    server_label: str | None = None


_COMPATIBLE: Final = "fluid_build.copilot.llm.openai_compatible:OpenAICompatibleAdapter"
# The example for a server speaking the OpenAI API that is not OpenAI itself.
_LOCAL_SERVER: Final = "http://127.0.0.1:8000/v1"


def _hosted(name: str, key_var: str, url: str, model_example: str, **more: Any) -> ProviderEntry:
    """An OpenAI-compatible service with a known home: its key required, no URL variable."""
    return ProviderEntry(
        name,
        "openai_compatible",
        _COMPATIBLE,
        (key_var,),
        True,
        default_base_url=url,
        model_example=model_example,
        **more,
    )


def _server(name: str, **more: Any) -> ProviderEntry:
    """A server the user runs speaking OpenAI's API: its URL required, a key optional."""
    return ProviderEntry(
        name,
        "openai_compatible",
        _COMPATIBLE,
        ("OPENAI_API_KEY",),
        base_url_var="OPENAI_BASE_URL",
        url_required="{name} needs the server's URL",
        url_example=_LOCAL_SERVER,
        local=True,
        probe_window=True,
        **more,
    )


_ENTRIES: Final = (
    ProviderEntry(
        "openai",
        "openai",
        "fluid_build.copilot.llm.openai:OpenAIAdapter",
        ("OPENAI_API_KEY",),
        True,
        "gpt-4o-mini",
        "OPENAI_BASE_URL",
        auto=True,
        price_id="openai",
        strict_schema=True,
        family="openai",
        key_prefix="sk-",
        otel_name="openai",
        hosts=("api.openai.com",),
    ),
    ProviderEntry(
        "azure",
        "azure",
        "fluid_build.copilot.llm.azure:AzureOpenAIAdapter",
        ("AZURE_OPENAI_API_KEY",),
        True,
        base_url_var="AZURE_OPENAI_ENDPOINT",
        model_example="my-gpt-4o-deployment",
        model_noun="deployment name",
        url_required="Azure OpenAI needs its endpoint",
        version_vars=("AZURE_OPENAI_API_VERSION", "OPENAI_API_VERSION"),
        price_id="azure",
        strict_schema=True,
        otel_name="azure.ai.openai",
        hosts=("openai.azure.com",),
    ),
    ProviderEntry(
        "anthropic",
        "anthropic",
        "fluid_build.copilot.llm.anthropic:AnthropicAdapter",
        ("ANTHROPIC_API_KEY",),
        True,
        "claude-sonnet-4-6",
        "ANTHROPIC_BASE_URL",
        auto=True,
        price_id="anthropic",
        family="anthropic",
        key_prefix="sk-ant-",
        otel_name="anthropic",
        hosts=("anthropic.com",),
    ),
    ProviderEntry(
        "gemini",
        "gemini",
        "fluid_build.copilot.llm.gemini:GeminiAdapter",
        ("GEMINI_API_KEY", "GOOGLE_API_KEY"),
        True,
        "gemini-2.5-flash",
        "GEMINI_BASE_URL",
        auto=True,
        price_id="google",
        family="gemini",
        key_prefix="AIza",
        otel_name="gcp.gemini",
        hosts=("generativelanguage.googleapis.com",),
    ),
    # Gemini on Vertex AI: Google credentials (ADC) or an access token by api_key=, no key
    # variable; the project's URL from GOOGLE_CLOUD_PROJECT / GOOGLE_CLOUD_LOCATION.
    ProviderEntry(
        "vertex",
        "vertex",
        "fluid_build.copilot.llm.vertex:VertexAdapter",
        default_model="gemini-2.5-flash",
        endpoint_step="fluid_build.copilot.llm.vertex:resolve_base_url",
        stored_settings=("GOOGLE_CLOUD_PROJECT", "GOOGLE_CLOUD_LOCATION"),
        cloud="google",
        price_id="google",  # Google's list covers Gemini on Vertex AI too
        family="gemini",
        otel_name="gcp.vertex_ai",
        hosts=("aiplatform.googleapis.com",),
    ),
    # AWS Bedrock (Converse): the AWS credential chain, or a Bedrock API key
    # (AWS_BEARER_TOKEN_BEDROCK, read by llm/bedrock.py) as a bearer token.
    ProviderEntry(
        "bedrock",
        "bedrock",
        "fluid_build.copilot.llm.bedrock:BedrockAdapter",
        default_model="us.anthropic.claude-sonnet-4-5-20250929-v1:0",
        base_url_var="AWS_ENDPOINT_URL_BEDROCK_RUNTIME",
        endpoint_step="fluid_build.copilot.llm.bedrock:resolve_endpoint",
        stored_settings=("AWS_REGION",),
        cloud="aws",
        price_id="aws",  # genai-prices lists Bedrock's model ids, inference profiles too
        family="bedrock",
        otel_name="aws.bedrock",
    ),
    ProviderEntry(
        "ollama",
        "ollama",
        "fluid_build.copilot.llm.ollama:OllamaAdapter",
        default_model="llama3.1",
        base_url_var="OLLAMA_HOST",
        bare_host=True,
        remote_switch="FLUID_OLLAMA_ALLOW_REMOTE",
        local=True,
        family="ollama",
    ),
    ProviderEntry(
        "openai_responses",
        "openai_responses",
        "fluid_build.copilot.llm.openai_responses:OpenAIResponsesAdapter",
        ("OPENAI_API_KEY",),
        True,
        "gpt-4o-mini",
        "OPENAI_BASE_URL",
        price_id="openai",
        strict_schema=True,
        family="openai_responses",
        key_prefix="sk-",
        otel_name="openai",  # the same provider, another API
    ),
    _server("openai_compatible"),
    # OpenAI-compatible services with a known home. Groq, Cerebras, xAI: max_tokens is
    # deprecated there in favour of max_completion_tokens.
    _hosted(
        "groq",
        "GROQ_API_KEY",
        "https://api.groq.com/openai/v1",
        "llama-3.3-70b-versatile",
        price_id="groq",
        dialect=Dialect(max_tokens="max_completion_tokens"),
        key_prefix="gsk_",
        otel_name="groq",
        hosts=("api.groq.com",),
    ),
    # Mistral: the seed is random_seed; no reasoning effort (Magistral reasons by itself).
    _hosted(
        "mistral",
        "MISTRAL_API_KEY",
        "https://api.mistral.ai/v1",
        "mistral-small-latest",
        price_id="mistral",
        dialect=Dialect(seed="random_seed", lacks=frozenset({"reasoning_effort"})),
        otel_name="mistral_ai",
        hosts=("api.mistral.ai",),
    ),
    # OpenRouter normalises reasoning across its models as reasoning: {effort}.
    _hosted(
        "openrouter",
        "OPENROUTER_API_KEY",
        "https://openrouter.ai/api/v1",
        "openai/gpt-4o-mini",
        price_id="openrouter",
        dialect=Dialect(reasoning="reasoning"),
        key_prefix="sk-or-",
        hosts=("openrouter.ai",),
    ),
    _hosted(
        "xai",
        "XAI_API_KEY",
        "https://api.x.ai/v1",
        "grok-4",
        price_id="x-ai",
        family="xai",
        dialect=Dialect(max_tokens="max_completion_tokens"),
        key_prefix="xai-",
        otel_name="x_ai",
    ),
    # DeepSeek: no seed, no parallel_tool_calls, no reasoning effort (deepseek-reasoner
    # always reasons).
    _hosted(
        "deepseek",
        "DEEPSEEK_API_KEY",
        "https://api.deepseek.com",
        "deepseek-chat",
        price_id="deepseek",
        family="deepseek",
        dialect=Dialect(lacks=frozenset({"seed", "parallel_tool_calls", "reasoning_effort"})),
        otel_name="deepseek",
    ),
    # Together's and Fireworks' chat-completions references name no parallel_tool_calls
    # (and Fireworks' no seed): refused rather than sent to a server that may ignore it.
    _hosted(
        "together",
        "TOGETHER_API_KEY",
        "https://api.together.xyz/v1",
        "meta-llama/Llama-3.3-70B-Instruct-Turbo",
        price_id="together",
        family="together",
        dialect=Dialect(lacks=frozenset({"parallel_tool_calls"})),
    ),
    _hosted(
        "fireworks",
        "FIREWORKS_API_KEY",
        "https://api.fireworks.ai/inference/v1",
        "accounts/fireworks/models/llama-v3p3-70b-instruct",
        price_id="fireworks",
        dialect=Dialect(lacks=frozenset({"seed", "parallel_tool_calls"})),
    ),
    _hosted(
        "cerebras",
        "CEREBRAS_API_KEY",
        "https://api.cerebras.ai/v1",
        "llama-3.3-70b",
        price_id="cerebras",
        dialect=Dialect(max_tokens="max_completion_tokens"),
    ),
    # Local servers: a key is optional (sent when set, for `--api-key`), never required.
    _server("vllm", server_label="vLLM"),
    # llama.cpp's server: tool_choice is only auto/none/required; reasoning effort is a
    # chat-template argument there (chat_template_kwargs), not a request field.
    _server(
        "llamacpp",
        dialect=Dialect(lacks=frozenset({"reasoning_effort"}), named_tool_choice=False),
        server_label="llama.cpp",
    ),
)

#: Every provider by name, in the order ``fluid doctor`` lists them. Read it at call time
#: (never copy it at import): a provider added to it is then known everywhere at once.
PROVIDERS: Final[Mapping[str, ProviderEntry]] = {e.name: e for e in _ENTRIES}


def load(path: str) -> Any:
    """The object ``"package.module:name"`` names, importing its module now."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)
