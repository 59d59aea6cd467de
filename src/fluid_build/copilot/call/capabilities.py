"""What each model can do: context window, output cap, tools, strict schemas, tokenizer.

:func:`capabilities_for` looks a model up in the matrix below: the exact name
first, then the longest known prefix that ends at a separator, so dated and
tagged variants resolve to their family (``gpt-4o-2024-08-06``,
``claude-sonnet-4-6-20260101``, ``llama3.1:8b``, ``models/gemini-2.5-flash``).
Azure deployments and other OpenAI-compatible servers name models freely, so
they are always *unknown*: a conservative default (8,192-token window, no
tools, no strict schema) with ``known=False``, which the caller can correct
with a ``capability_matrix`` override, or the operator with
``FLUID_CAPABILITY_MATRIX`` (:func:`capability_matrix_from_env`).

:func:`run_start_warnings` turns a capability row and what the run needs into
short operator-facing warnings; :func:`emit_run_start_banner` shows them once
at the start of a run (or only logs their count under ``FLUID_QUIET=1`` /
``FLUID_NONINTERACTIVE=1``). docs/capability-warnings.md explains each one.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final, TextIO

from fluid_build._redact import redact, truncate
from fluid_build.config import yes_no
from fluid_build.copilot.agents.errors import ProviderError
from fluid_build.copilot.llm.registry import PROVIDERS

__all__ = [
    "CAPABILITY_MATRIX_ENV",
    "OPTION_RULES",
    "OVERRIDE_KEYS",
    "TIGHT_CONTEXT",
    "TOKENIZERS",
    "UNKNOWN_CONTEXT_WINDOW",
    "UNKNOWN_MAX_OUTPUT",
    "WEAK_NESTED_SCHEMAS",
    "WEAK_TOOL_USE",
    "ModelCapabilities",
    "OptionRule",
    "capabilities_for",
    "capability_matrix_from_env",
    "emit_run_start_banner",
    "models_with_larger_window",
    "option_rules",
    "run_start_warnings",
]

LOG = logging.getLogger("fluid_build.capabilities")

#: Tokenizer families. ``claude-4.7`` is the tokenizer Anthropic introduced with
#: Claude Opus 4.7 (up to 1.35x the tokens of the earlier Claude tokenizer).
TOKENIZERS: Final = frozenset(
    {"o200k_base", "cl100k_base", "claude", "claude-4.7", "gemini", "llama", "unknown"}
)

#: The default for a model that is not in the matrix.
UNKNOWN_CONTEXT_WINDOW: Final = 8_192
UNKNOWN_MAX_OUTPUT: Final = 4_096

#: Below this window a run is flagged as tight-context.
TIGHT_CONTEXT: Final = 16_384
#: A prompt above this share of the window is flagged.
_PROMPT_SHARE_WARNING: Final = 0.8

#: Weakness notes that drive run-start warnings; other notes are informational.
WEAK_TOOL_USE: Final = "weak tool use (malformed or invented tool calls are common)"
WEAK_NESTED_SCHEMAS: Final = "struggles with large nested schemas"
_OLLAMA_NUM_CTX: Final = (
    "the server truncates to num_ctx (2,048-4,096 by default on older servers and small "
    "GPUs) unless OLLAMA_CONTEXT_LENGTH or num_ctx is raised"
)


@dataclass(frozen=True, slots=True)
class ModelCapabilities:
    """One model's limits and abilities, as the matrix (plus overrides) knows them.

    ``context_window`` counts prompt and output together. ``max_input_tokens``
    is set where the provider caps the prompt below ``context_window`` minus
    the output (GPT-5: 400,000 in total, 272,000 of it input). ``known`` is
    False when the model was not in the matrix and a conservative default was
    used. ``overridden`` names the values the caller (or ``FLUID_CAPABILITY_MATRIX``)
    set, in place of the matrix's.
    """

    provider: str
    model: str
    context_window: int
    max_output_tokens: int
    tools: bool
    strict_schema: bool
    json_mode: bool
    tokenizer: str
    weaknesses: tuple[str, ...]
    known: bool
    max_input_tokens: int | None = None
    overridden: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        """``provider:model``, as warnings and suggestions name a model."""
        return f"{self.provider}:{self.model}" if self.provider else self.model


@dataclass(frozen=True, slots=True)
class _Row:
    model: str
    context_window: int
    max_output_tokens: int
    tools: bool
    strict_schema: bool
    json_mode: bool
    tokenizer: str
    weaknesses: tuple[str, ...] = ()
    max_input_tokens: int | None = None
    # Offered as a larger-window alternative (retired and legacy models are not).
    suggest: bool = True


def _openai(
    model: str,
    window: int,
    output: int,
    *,
    tools: bool = True,
    strict: bool = True,
    json_mode: bool = True,
    weaknesses: tuple[str, ...] = (),
    max_input: int | None = None,
    suggest: bool = True,
) -> _Row:
    return _Row(
        model,
        window,
        output,
        tools,
        strict,
        json_mode,
        "o200k_base",
        weaknesses,
        max_input,
        suggest,
    )


def _claude(
    model: str,
    window: int,
    output: int,
    *,
    strict: bool,
    tokenizer: str = "claude",
    suggest: bool = True,
) -> _Row:
    # Claude has no JSON mode of its own: JSON comes with structured outputs.
    return _Row(model, window, output, True, strict, strict, tokenizer, suggest=suggest)


def _gemini(
    model: str, window: int, output: int, *, weaknesses: tuple[str, ...] = (), suggest: bool = True
) -> _Row:
    return _Row(model, window, output, True, True, True, "gemini", weaknesses, suggest=suggest)


def _ollama(model: str, window: int, *, tools: bool, weak_tools: bool = False) -> _Row:
    notes = ((WEAK_TOOL_USE,) if weak_tools else ()) + (_OLLAMA_NUM_CTX,)
    # Output shares the window (num_predict has no separate cap); the `format`
    # parameter constrains output to a JSON schema by grammar, hence strict.
    return _Row(model, window, window, tools, True, True, "llama", notes)


_MATRIX: Final[Mapping[str, tuple[_Row, ...]]] = {
    # OpenAI: platform.openai.com/docs/models/<model> (figures as mirrored on the
    # Vercel AI Gateway model pages, which link there). GPT-5's 272,000-token input
    # cap: the GPT-5 developer launch post and the API's own error ("Input tokens
    # exceed the configured limit of 272,000 tokens"). GPT-5.4/5.5: 1,050,000 in
    # total, 922,000 input, 128,000 output (provider model cards). gpt-4-turbo and
    # gpt-3.5-turbo are the cl100k_base models, counted exactly offline.
    "openai": (
        _openai("gpt-4o", 128_000, 16_384),
        _openai("gpt-4o-2024-05-13", 128_000, 4_096, strict=False, suggest=False),
        _openai("gpt-4o-mini", 128_000, 16_384),
        _openai("gpt-4.1", 1_047_576, 32_768),
        _openai("gpt-4.1-mini", 1_047_576, 32_768),
        _openai("gpt-4.1-nano", 1_047_576, 32_768),
        _openai("o3", 200_000, 100_000),
        _openai("o4-mini", 200_000, 100_000),
        _openai("o3-mini", 200_000, 100_000),
        _openai("o1", 200_000, 100_000),
        _openai(
            "o1-mini",
            128_000,
            65_536,
            tools=False,
            strict=False,
            json_mode=False,
            weaknesses=("no system messages",),
            suggest=False,
        ),
        _openai("gpt-5", 400_000, 128_000, max_input=272_000),
        _openai("gpt-5-mini", 400_000, 128_000, max_input=272_000),
        _openai("gpt-5-nano", 400_000, 128_000, max_input=272_000),
        _openai("gpt-5.1", 400_000, 128_000, max_input=272_000),
        _openai("gpt-5.2", 400_000, 128_000, max_input=272_000),
        _openai("gpt-5.4", 1_050_000, 128_000, max_input=922_000),
        _openai("gpt-5.5", 1_050_000, 128_000, max_input=922_000),
        _Row("gpt-4-turbo", 128_000, 4_096, True, False, True, "cl100k_base", suggest=False),
        _Row("gpt-3.5-turbo", 16_385, 4_096, True, False, True, "cl100k_base", suggest=False),
    ),
    # Models OpenAI serves only on the Responses API (provider="openai_responses", which
    # knows every "openai" row too): platform.openai.com/docs/models/<model>. The deep
    # research models take no function tools and no structured output. Never suggested:
    # a larger window there is not a switch of model alone.
    "openai_responses": (
        _openai("o1-pro", 200_000, 100_000, suggest=False),
        _openai("o3-pro", 200_000, 100_000, suggest=False),
        _openai(
            "o3-deep-research",
            200_000,
            100_000,
            tools=False,
            strict=False,
            json_mode=False,
            suggest=False,
        ),
        _openai(
            "o4-mini-deep-research",
            200_000,
            100_000,
            tools=False,
            strict=False,
            json_mode=False,
            suggest=False,
        ),
        _openai("codex-mini-latest", 200_000, 100_000, suggest=False),
        _openai("gpt-5-pro", 400_000, 272_000, max_input=128_000, suggest=False),
        _openai("gpt-5-codex", 400_000, 128_000, max_input=272_000, suggest=False),
    ),
    # Anthropic: platform.claude.com/docs/en/models/<model>/overview ("Context
    # window ... Max output ..."); Opus 4.7 also on the Vertex AI and Bedrock model
    # cards (1,000,000 / 128,000). Structured outputs (strict tools, JSON output):
    # Sonnet 4.5 and Opus 4.1 first, then Haiku 4.5, Opus 4.5 and later; not
    # Claude 3.x nor the 4.0 models. Opus 4.7 and later use the newer tokenizer.
    "anthropic": (
        _claude("claude-opus-4-7", 1_000_000, 128_000, strict=True, tokenizer="claude-4.7"),
        _claude("claude-opus-4-8", 1_000_000, 128_000, strict=True, tokenizer="claude-4.7"),
        _claude("claude-opus-4-6", 1_000_000, 128_000, strict=True),
        _claude("claude-sonnet-4-6", 1_000_000, 128_000, strict=True),
        _claude("claude-sonnet-4-5", 200_000, 64_000, strict=True),
        _claude("claude-opus-4-5", 200_000, 64_000, strict=True),
        _claude("claude-haiku-4-5", 200_000, 64_000, strict=True),
        _claude("claude-opus-4-1", 200_000, 32_000, strict=True),
        _claude("claude-opus-4", 200_000, 32_000, strict=False),
        _claude("claude-sonnet-4", 200_000, 64_000, strict=False),
        _claude("claude-3-7-sonnet", 200_000, 64_000, strict=False, suggest=False),
        _claude("claude-3-5-sonnet", 200_000, 8_192, strict=False, suggest=False),
        _claude("claude-3-5-haiku", 200_000, 8_192, strict=False, suggest=False),
    ),
    # Claude on AWS Bedrock: the Anthropic rows above (the Bedrock model cards state the
    # same windows and output caps) under Bedrock's ids; "us."/"eu."/"global." inference
    # profiles and ARNs resolve to them (_bedrock_model). Structured output there is a
    # forced tool the service does not hold to the schema: never strict. Never suggested:
    # a Bedrock id names a version the row does not. Amazon Nova, Meta Llama and Mistral
    # are not listed: their Bedrock model cards round the output cap ("Max output
    # tokens: 5K"), and a guessed cap is worse than the unknown default.
    "bedrock": (
        _claude(
            "anthropic.claude-opus-4-7",
            1_000_000,
            128_000,
            strict=False,
            tokenizer="claude-4.7",
            suggest=False,
        ),
        _claude(
            "anthropic.claude-opus-4-8",
            1_000_000,
            128_000,
            strict=False,
            tokenizer="claude-4.7",
            suggest=False,
        ),
        _claude("anthropic.claude-opus-4-6", 1_000_000, 128_000, strict=False, suggest=False),
        _claude("anthropic.claude-sonnet-4-6", 1_000_000, 128_000, strict=False, suggest=False),
        _claude("anthropic.claude-sonnet-4-5", 200_000, 64_000, strict=False, suggest=False),
        _claude("anthropic.claude-opus-4-5", 200_000, 64_000, strict=False, suggest=False),
        _claude("anthropic.claude-haiku-4-5", 200_000, 64_000, strict=False, suggest=False),
        _claude("anthropic.claude-opus-4-1", 200_000, 32_000, strict=False, suggest=False),
        _claude("anthropic.claude-opus-4", 200_000, 32_000, strict=False, suggest=False),
        _claude("anthropic.claude-sonnet-4", 200_000, 64_000, strict=False, suggest=False),
        _claude("anthropic.claude-3-7-sonnet", 200_000, 64_000, strict=False, suggest=False),
        _claude("anthropic.claude-3-5-sonnet", 200_000, 8_192, strict=False, suggest=False),
        _claude("anthropic.claude-3-5-haiku", 200_000, 8_192, strict=False, suggest=False),
    ),
    # Gemini: ai.google.dev/gemini-api/docs/models/<model> and the Vertex AI model
    # pages ("Input token limit" / "Output token limit"). The operator reference
    # says 2M for gemini-2.5-pro; Google documents 1,048,576 (see
    # docs/capability-warnings.md). 1.5 models are retired for new projects.
    "gemini": (
        _gemini("gemini-2.5-pro", 1_048_576, 65_536),
        _gemini("gemini-2.5-flash", 1_048_576, 65_536),
        _gemini("gemini-2.5-flash-lite", 1_048_576, 65_536),
        _gemini("gemini-2.0-flash", 1_048_576, 8_192),
        _gemini("gemini-2.0-flash-lite", 1_048_576, 8_192),
        _gemini("gemini-1.5-pro", 2_097_152, 8_192, suggest=False),
        _gemini(
            "gemini-1.5-flash", 1_048_576, 8_192, weaknesses=(WEAK_NESTED_SCHEMAS,), suggest=False
        ),
    ),
    # The OpenAI-compatible presets: suggested only to a run of the same provider
    # (_own_provider_only). No tokenizer of theirs is bundled: open-weight and Grok
    # models are estimated like local ones ("llama"); gpt-oss is o200k_base.
    # DeepSeek: api-docs.deepseek.com/quick_start/pricing ("CONTEXT LENGTH 128K";
    # "MAX OUTPUT ... MAXIMUM: 8K" for deepseek-chat, "64K" for deepseek-reasoner;
    # JSON Output for both). 128K is taken as 128,000, the smaller reading. The
    # reasoner answers a request with tools (through deepseek-chat, the same page
    # says), so both take tools. Only json_object: no strict json_schema.
    "deepseek": (
        _Row("deepseek-chat", 128_000, 8_192, True, False, True, "llama"),
        _Row("deepseek-reasoner", 128_000, 65_536, True, False, True, "llama"),
    ),
    # xAI: docs.x.ai/docs/models/<model> (grok-4 and grok-code-fast-1: 256,000;
    # grok-3 and grok-3-mini: 131,072), as mirrored on OpenRouter's and the Vercel AI
    # Gateway's grok-4 pages (256,000) and Oracle's xai.grok-3-mini model card (131,072).
    # xAI gives no output cap apart from the window: output shares it. Function
    # calling and structured outputs (response_format json_schema, the answer held
    # to the schema: docs.x.ai/docs/guides/structured-outputs, and Google's "Structured
    # output for Grok models" page: "output that always adheres to a specific schema",
    # sent with "strict": true) on all four. The
    # larger-window grok-4-fast and grok-4.x families resolve to grok-4 by prefix:
    # a smaller window than theirs, never a larger one.
    "xai": (
        _Row("grok-4", 256_000, 256_000, True, True, True, "llama"),
        _Row("grok-code-fast-1", 256_000, 256_000, True, True, True, "llama"),
        _Row("grok-3", 131_072, 131_072, True, True, True, "llama"),
        _Row("grok-3-mini", 131_072, 131_072, True, True, True, "llama"),
    ),
    # Together: docs.together.ai/docs/chat-models (context length 131,072, as mirrored
    # in LobeHub's Together provider list, which cites that page; function calling
    # and JSON mode in Together's docs). Together gives no separate
    # output cap: output shares the window. Its json_schema mode is not OpenAI's
    # strict one. Fireworks and Cerebras have no rows: see docs/capability-warnings.md.
    "together": (
        _Row(
            "meta-llama/llama-3.3-70b-instruct-turbo", 131_072, 131_072, True, False, True, "llama"
        ),
    ),
    # Ollama: the trained window from ollama.com/library/<model> ("context length",
    # as `ollama show <model>` prints it) and the "tools" tag there. Ollama serves
    # num_ctx tokens, not this window, unless it is raised (docs/context-length).
    "ollama": (
        _ollama("llama3.3", 131_072, tools=True),
        _ollama("llama3.2", 131_072, tools=True, weak_tools=True),
        _ollama("llama3.1", 131_072, tools=True, weak_tools=True),
        _ollama("llama3", 8_192, tools=False),
        _ollama("qwen2.5", 32_768, tools=True),
        _ollama("qwen2.5-coder", 32_768, tools=True),
        _ollama("mistral", 32_768, tools=True, weak_tools=True),
        _ollama("mistral-nemo", 131_072, tools=True),
        _ollama("gemma2", 8_192, tools=False),
        _ollama("phi3", 4_096, tools=False),
        _ollama("phi3:mini-128k", 131_072, tools=False),
        _ollama("phi3:medium-128k", 131_072, tools=False),
        _ollama("phi3.5", 131_072, tools=False),
        _ollama("deepseek-r1", 131_072, tools=False),
        _ollama("codellama", 16_384, tools=False),
    ),
}

#: Bedrock's cross-region inference profiles put a geography before the model id.
_BEDROCK_GEOGRAPHIES: Final = frozenset(
    {"us", "us-gov", "eu", "apac", "jp", "au", "ca", "in", "global"}
)


def _bedrock_model(name: str) -> str:
    """The model id inside a Bedrock inference profile id or ARN
    (``arn:...:inference-profile/us.anthropic.claude-...`` -> ``anthropic.claude-...``)."""
    name = name.rpartition("/")[2]
    geography, _, rest = name.partition(".")
    return rest if rest and geography in _BEDROCK_GEOGRAPHIES else name


# Another name for a section: Google's own for Gemini's. Each provider's section is its
# registry entry's ``family`` (llm/registry.py).
_SECTION_ALIASES: Final[Mapping[str, str]] = {"google": "gemini"}


def _section(provider: str) -> str | None:
    """The matrix section whose rows apply to ``provider``; None for Azure deployments and
    the OpenAI-compatible family (vLLM, llama.cpp, Groq, OpenRouter ...), which name
    models freely and are never looked up, and for a name the matrix does not know."""
    entry = PROVIDERS.get(provider)
    return entry.family if entry is not None else _SECTION_ALIASES.get(provider)


def _own_provider_only() -> set[str]:
    """Sections offered as a larger-window alternative only to a run of the same provider:
    a local model (``local``), or a hosted preset's (``default_base_url``), needs another
    server or another key."""
    return {e.family for e in PROVIDERS.values() if e.family and (e.local or e.default_base_url)}


# A known name followed by one of these is the same model, versioned or tagged.
_SEPARATORS: Final = frozenset("-:@._/")
_NAME_PREFIXES: Final = ("models/", "library/")


def _normalise(model: str) -> str:
    name = model.strip().lower()
    for prefix in _NAME_PREFIXES:
        if name.startswith(prefix):
            name = name[len(prefix) :]
    return name


def _family(name: str, families: Iterable[str]) -> str | None:
    """``name`` itself if it is one of ``families``, else the longest of them that is a
    prefix of it ending at a separator (``gpt-4o-2024-08-06`` -> ``gpt-4o``)."""
    best: str | None = None
    for family in families:
        if name == family:
            return family
        if (
            name.startswith(family)
            and name[len(family)] in _SEPARATORS
            and (best is None or len(family) > len(best))
        ):
            best = family
    return best


def _match(rows: Sequence[_Row], name: str) -> _Row | None:
    family = _family(name, (row.model for row in rows))
    return next(row for row in rows if row.model == family) if family else None


def _lookup(provider: str, name: str) -> tuple[str, _Row] | None:
    section = _section(provider)
    if section == "bedrock":
        name = _bedrock_model(name)
    if section is not None:
        row = _match(_MATRIX[section], name)
        if row is None and section == "openai_responses":  # it serves OpenAI's models too
            return _lookup("openai", name)
        return (section, row) if row else None
    if provider:
        return None
    # No provider named: find the model in any hosted section, then Ollama's.
    for section, rows in _MATRIX.items():
        row = _match(rows, name)
        if row is not None:
            return section, row
    return None


# -- Known model rules: the call options a model refuses -------------------------------------
#
# The adapters refuse an option their provider has no field for; these rules refuse one the
# provider has a field for but the model does not take, as its own docs say (or its API's
# own error, as published), before anything is sent: a typed llm.unsupported_option (or a
# drop under drop_unsupported) instead of a 400 from the provider, or a value the provider
# accepts and ignores. A caller switches a rule off for a model with the capability_matrix
# key "allow_options" (docs/capability-warnings.md, "Known model rules").

_Fields = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class OptionRule:
    """``option`` is refused on ``models`` (of ``providers``) when ``applies`` holds.

    ``models`` are model families, found like the matrix's rows: the exact name, then
    the longest family that is a prefix of the name at a separator. A name whose
    longest match is one of ``unless`` is not covered (``gpt-5-chat-latest`` is not a
    reasoning model though ``gpt-5`` is its prefix). ``why`` (``{model}`` filled in)
    becomes the refusal's reason; ``source`` is the provider's page, or where the
    API's own error message is published.
    """

    name: str
    option: str
    providers: frozenset[str]
    models: tuple[str, ...]
    applies: Callable[[_Fields], bool]
    why: str
    source: str
    unless: tuple[str, ...] = ()

    def covers(self, model: str) -> bool:
        """Whether ``model`` (normalised: lower case, no ``models/`` prefix) is one of
        this rule's families."""
        family = _family(model, self.models + self.unless)
        return family is not None and family in self.models


def _other_than(option: str, default: float) -> Callable[[_Fields], bool]:
    # The provider's default value is accepted where its docs (or error) say so.
    def check(fields: _Fields) -> bool:
        value = fields.get(option)
        return value is not None and value != default

    return check


def _given(option: str) -> Callable[[_Fields], bool]:
    def check(fields: _Fields) -> bool:
        return fields.get(option) is not None

    return check


def _thinking(check: Callable[[_Fields], bool]) -> Callable[[_Fields], bool]:
    """``check``, only when the call asks for reasoning (Anthropic: thinking on)."""

    def both(fields: _Fields) -> bool:
        return fields.get("reasoning_effort") is not None and check(fields)

    return both


def _top_p_below_095(fields: _Fields) -> bool:
    value = fields.get("top_p")
    return value is not None and value < 0.95


def _forced_tool(fields: _Fields) -> bool:
    choice = fields.get("tool_choice")
    return choice is not None and choice not in ("auto", "none")


def _top_p_with_temperature(fields: _Fields) -> bool:
    return fields.get("top_p") is not None and fields.get("temperature") is not None


_OPENAI: Final = frozenset({"openai", "openai_responses", "azure"})
_OPENAI_CHAT: Final = frozenset({"openai", "azure"})
_CLAUDE: Final = frozenset({"anthropic", "bedrock"})
_GEMINI: Final = frozenset({"gemini", "google", "vertex"})

# OpenAI's reasoning models whose reasoning cannot be turned off (no effort "none"):
# sampling is the default's only. gpt-5.1 and later default to effort "none" and take
# temperature and top_p there, except their codex and pro models.
_OPENAI_ALWAYS_REASONING: Final = (
    "o1",
    "o1-mini",
    "o1-pro",
    "o3",
    "o3-mini",
    "o3-pro",
    "o3-deep-research",
    "o4-mini",
    "o4-mini-deep-research",
    "codex-mini-latest",
    "gpt-5",
    "gpt-5-mini",
    "gpt-5-nano",
    "gpt-5-pro",
    "gpt-5-codex",
    "gpt-5.1-codex",
    "gpt-5.2-codex",
    "gpt-5.2-pro",
)
_OPENAI_EFFORT_NONE: Final = ("gpt-5.1", "gpt-5.2", "gpt-5.4", "gpt-5.5")
_OPENAI_NOT_REASONING: Final = (
    "gpt-4o",
    "gpt-4o-mini",
    "gpt-4.1",
    "gpt-4.1-mini",
    "gpt-4.1-nano",
    "gpt-4-turbo",
    "gpt-3.5-turbo",
    "gpt-5-chat",
)
_OPENAI_REASONING_DOC: Final = "platform.openai.com/docs/guides/reasoning"
_OPENAI_GPT5_SAMPLING_DOC: Final = (
    "platform.openai.com/docs/guides/latest-model (GPT-5.2 parameter compatibility: "
    "temperature, top_p and logprobs only with reasoning effort none)"
)
_CLAUDE_THINKING: Final = (
    "claude-3-7-sonnet",
    "claude-sonnet-4",
    "claude-opus-4",
    "claude-haiku-4-5",
)
_CLAUDE_THINKING_DOC: Final = "docs.claude.com/en/docs/build-with-claude/extended-thinking"

OPTION_RULES: Final[tuple[OptionRule, ...]] = (
    # -- OpenAI ---------------------------------------------------------------------------
    OptionRule(
        "openai-reasoning-temperature",
        "temperature",
        _OPENAI,
        _OPENAI_ALWAYS_REASONING,
        _other_than("temperature", 1),
        "{model} is a reasoning model: OpenAI accepts only the default temperature (1) "
        f"({_OPENAI_REASONING_DOC})",
        f"{_OPENAI_REASONING_DOC}; the API's error \"Unsupported value: 'temperature' does not "
        'support 0 with this model. Only the default (1) value is supported."',
        unless=("gpt-5-chat", *_OPENAI_EFFORT_NONE),
    ),
    OptionRule(
        "openai-reasoning-top-p",
        "top_p",
        _OPENAI,
        _OPENAI_ALWAYS_REASONING,
        _other_than("top_p", 1),
        "{model} is a reasoning model: OpenAI accepts only the default top_p (1) "
        f"({_OPENAI_REASONING_DOC})",
        f"{_OPENAI_REASONING_DOC} (limitations: temperature, top_p ... not supported); "
        "learn.microsoft.com/azure/ai-foundry/openai/how-to/reasoning (not supported: "
        "temperature, top_p, ...)",
        unless=("gpt-5-chat", *_OPENAI_EFFORT_NONE),
    ),
    OptionRule(
        "openai-effort-temperature",
        "temperature",
        _OPENAI,
        _OPENAI_EFFORT_NONE,
        _thinking(_other_than("temperature", 1)),
        "{model} takes a temperature other than 1 only with reasoning effort none, and "
        "reasoning_effort is set (platform.openai.com/docs/guides/latest-model)",
        _OPENAI_GPT5_SAMPLING_DOC,
        unless=("gpt-5.1-codex", "gpt-5.2-codex", "gpt-5.2-pro"),
    ),
    OptionRule(
        "openai-effort-top-p",
        "top_p",
        _OPENAI,
        _OPENAI_EFFORT_NONE,
        _thinking(_other_than("top_p", 1)),
        "{model} takes a top_p other than 1 only with reasoning effort none, and "
        "reasoning_effort is set (platform.openai.com/docs/guides/latest-model)",
        _OPENAI_GPT5_SAMPLING_DOC,
        unless=("gpt-5.1-codex", "gpt-5.2-codex", "gpt-5.2-pro"),
    ),
    OptionRule(
        "openai-reasoning-stop",
        "stop",
        _OPENAI_CHAT,
        ("o3", "o4-mini"),
        _given("stop"),
        "{model} takes no stop sequences (platform.openai.com/docs/api-reference/chat/create: "
        '"Not supported with latest reasoning models o3 and o4-mini")',
        "platform.openai.com/docs/api-reference/chat/create#chat-create-stop",
        unless=("o3-mini",),
    ),
    OptionRule(
        "openai-gpt5-stop",
        "stop",
        _OPENAI_CHAT,
        ("gpt-5", "o1-mini"),
        _given("stop"),
        "{model} takes no stop sequences (OpenAI's own error: \"Unsupported parameter: 'stop' "
        'is not supported with this model.")',
        "the API's error as published: community.openai.com/t/1113029 (o1-mini); "
        'github.com/crewAIInc/crewAI commit 5ed8633 "GPT-5.x models reject the stop '
        "parameter\"; litellm's OpenAIGPT5Config lists stop as unsupported",
        unless=("gpt-5-chat",),
    ),
    OptionRule(
        "openai-no-reasoning",
        "reasoning_effort",
        _OPENAI,
        (*_OPENAI_NOT_REASONING, "o1-mini"),
        _given("reasoning_effort"),
        "{model} is not a model OpenAI lets you set reasoning effort on: the API answers "
        '"Unrecognized request argument supplied: reasoning_effort" '
        f"({_OPENAI_REASONING_DOC})",
        f"{_OPENAI_REASONING_DOC}; the API's errors as published: "
        "github.com/generative-computing/mellea/issues/270 (chat, gpt-4o), "
        'github.com/BoundaryML/baml/pull/2708 (Responses, gpt-4.1: "Unsupported parameter: '
        "'reasoning.effort' is not supported with this model.\"); "
        "community.openai.com/t/1110750/7 (o1-mini: no reasoning_effort)",
    ),
    # -- Anthropic (and Claude on Bedrock) --------------------------------------------------
    OptionRule(
        "claude-sampling-removed-temperature",
        "temperature",
        _CLAUDE,
        ("claude-opus-4-7", "claude-opus-4-8"),
        _other_than("temperature", 1),
        "{model} takes no temperature other than the default (1): Anthropic removed it "
        "(platform.claude.com/docs/en/about-claude/models/whats-new-claude-4-7)",
        "platform.claude.com/docs/en/about-claude/models/whats-new-claude-4-7"
        "#sampling-parameters-removed; the Bedrock model card for Opus 4.7 "
        "(docs.aws.amazon.com/bedrock/latest/userguide/model-card-anthropic-claude-opus-4-7.html);"
        ' Opus 4.8, probed: temperature 0 and 0.5 -> 400 "`temperature` is deprecated for this '
        'model", 1 -> 200 (github.com/mnfst/modelparams.dev/pull/238)',
    ),
    OptionRule(
        "claude-sampling-removed-top-p",
        "top_p",
        _CLAUDE,
        ("claude-opus-4-7", "claude-opus-4-8"),
        _given("top_p"),
        "{model} takes no top_p: Anthropic removed it "
        "(platform.claude.com/docs/en/about-claude/models/whats-new-claude-4-7)",
        "platform.claude.com/docs/en/about-claude/models/whats-new-claude-4-7"
        "#sampling-parameters-removed; Opus 4.8, probed: top_p 0.5, 0.97 and 1 -> 400 "
        "(github.com/mnfst/modelparams.dev/pull/238)",
    ),
    OptionRule(
        "claude-thinking-forced-tool",
        "reasoning_effort",
        _CLAUDE,
        _CLAUDE_THINKING,
        _thinking(_forced_tool),
        "{model}: extended thinking allows only tool_choice 'auto' or 'none', and tool_choice "
        f"forces a tool ({_CLAUDE_THINKING_DOC})",
        f"{_CLAUDE_THINKING_DOC} (extended thinking with tool use); the API's error "
        '"Thinking may not be enabled when tool_choice forces tool use."',
    ),
    OptionRule(
        "claude-thinking-temperature",
        "temperature",
        _CLAUDE,
        _CLAUDE_THINKING,
        _thinking(_other_than("temperature", 1)),
        "{model} with thinking (reasoning_effort) takes only temperature 1 "
        f"({_CLAUDE_THINKING_DOC})",
        f"{_CLAUDE_THINKING_DOC} (feature compatibility); the API's error \"`temperature` may "
        'only be set to 1 when thinking is enabled or in adaptive mode"',
    ),
    OptionRule(
        "claude-thinking-top-p",
        "top_p",
        _CLAUDE,
        _CLAUDE_THINKING,
        _thinking(_top_p_below_095),
        "{model} with thinking (reasoning_effort) takes top_p only from 0.95 to 1 "
        f"({_CLAUDE_THINKING_DOC})",
        f"{_CLAUDE_THINKING_DOC} (feature compatibility: top_p between 0.95 and 1)",
    ),
    OptionRule(
        "claude-one-sampler",
        "top_p",
        _CLAUDE,
        (
            "claude-opus-4-1",
            "claude-opus-4-5",
            "claude-opus-4-6",
            "claude-sonnet-4-5",
            "claude-sonnet-4-6",
            "claude-haiku-4-5",
        ),
        _top_p_with_temperature,
        "{model} takes temperature or top_p, not both "
        "(platform.claude.com/docs/en/about-claude/models/migrating-to-claude-4)",
        "platform.claude.com/docs/en/about-claude/models/migrating-to-claude-4 (Sonnet 4.5, "
        "Haiku 4.5); the API's error \"`temperature` and `top_p` cannot both be specified for "
        'this model. Please use only one." as published for Opus 4.1 '
        "(github.com/aws-samples/bedrock-chat/pull/979), Opus 4.5 "
        "(github.com/OpenHands/OpenHands/issues/11838), Opus 4.6 "
        "(github.com/OpenHands/OpenHands/pull/12874), Sonnet 4.6 "
        "(github.com/Vali-98/ChatterUI/issues/564)",
    ),
    OptionRule(
        "claude-no-thinking",
        "reasoning_effort",
        _CLAUDE,
        ("claude-3-5-sonnet", "claude-3-5-haiku"),
        _given("reasoning_effort"),
        "{model} has no extended thinking, which reasoning_effort turns on "
        f"({_CLAUDE_THINKING_DOC}: Claude 3.7 Sonnet and the Claude 4 models)",
        f"{_CLAUDE_THINKING_DOC} (supported models)",
    ),
    # -- Gemini and Vertex ------------------------------------------------------------------
    OptionRule(
        "gemini-no-thinking",
        "reasoning_effort",
        _GEMINI,
        ("gemini-2.0-flash", "gemini-1.5-pro", "gemini-1.5-flash"),
        _given("reasoning_effort"),
        "{model} has no thinking, which reasoning_effort sets "
        "(ai.google.dev/gemini-api/docs/thinking: the 2.5 models and later)",
        "ai.google.dev/gemini-api/docs/thinking; the API's errors as published: "
        '"thinking_config is not supported." '
        '(github.com/immersive-translate/immersive-translate/issues/2976), "Unable to '
        'submit request because thinking is not supported by this model." '
        "(github.com/googleapis/js-genai/issues/681)",
    ),
    # -- OpenAI-compatible presets ----------------------------------------------------------
    OptionRule(
        "deepseek-reasoner-temperature",
        "temperature",
        frozenset({"deepseek"}),
        ("deepseek-reasoner",),
        _given("temperature"),
        "{model} ignores temperature: DeepSeek accepts it and it has no effect "
        "(api-docs.deepseek.com/guides/reasoning_model)",
        "api-docs.deepseek.com/guides/reasoning_model (not supported: temperature, top_p, ... "
        '"will not trigger an error but will also not take effect")',
    ),
    OptionRule(
        "deepseek-reasoner-top-p",
        "top_p",
        frozenset({"deepseek"}),
        ("deepseek-reasoner",),
        _given("top_p"),
        "{model} ignores top_p: DeepSeek accepts it and it has no effect "
        "(api-docs.deepseek.com/guides/reasoning_model)",
        "api-docs.deepseek.com/guides/reasoning_model",
    ),
    OptionRule(
        "xai-reasoning-stop",
        "stop",
        frozenset({"xai"}),
        ("grok-3-mini", "grok-4"),
        _given("stop"),
        "{model} is a reasoning model: xAI refuses stop (docs.x.ai/docs/guides/reasoning)",
        'docs.x.ai/docs/guides/reasoning ("presencePenalty, frequencyPenalty and stop '
        'parameters are not supported by reasoning models")',
        unless=(
            "grok-4-fast-non-reasoning",
            "grok-4-1-fast-non-reasoning",
            "grok-4.20-non-reasoning",
        ),
    ),
    OptionRule(
        "xai-no-effort",
        "reasoning_effort",
        frozenset({"xai"}),
        ("grok-3", "grok-4"),
        _given("reasoning_effort"),
        "{model} takes no reasoning_effort: xAI answers an error "
        "(docs.x.ai/docs/guides/reasoning: only grok-3-mini takes it)",
        'docs.x.ai/docs/guides/reasoning ("reasoning_effort is not supported by grok-3, grok-4 '
        'and grok-4-fast-reasoning")',
        unless=("grok-3-mini", "grok-4.3", "grok-4.20-multi-agent"),
    ),
)


@functools.lru_cache(maxsize=1024)
def _rules_for(provider: str, model: str) -> tuple[OptionRule, ...]:
    # Every call with an option set asks; the answer for a name never changes.
    provider_name = provider.strip().lower()
    name = _rule_name(provider_name, model)
    return tuple(
        rule for rule in OPTION_RULES if provider_name in rule.providers and rule.covers(name)
    )


def _rule_name(provider: str, model: str) -> str:
    """The name the rules look up: Bedrock's profile ids and ``anthropic.`` prefix removed."""
    name = _normalise(model)
    if provider == "bedrock":
        name = _bedrock_model(name).removeprefix("anthropic.")
    return name


_BOOL_KEYS: Final = ("tools", "strict_schema", "json_mode", "preflight")
_INT_KEYS: Final = ("context_window", "max_output_tokens", "output_reservation")
_STR_KEYS: Final = ("tokenizer",)
#: The call options the known model rules never refuse for this model (a list of names).
_ALLOW_KEY: Final = "allow_options"
OVERRIDE_KEYS: Final = frozenset(_BOOL_KEYS + _INT_KEYS + _STR_KEYS + (_ALLOW_KEY,))


def _validated(
    overrides: Mapping[str, Any],
    where: str = "capability_matrix",
    *,
    booleans: str = "True or False",
) -> dict[str, Any]:
    """The overrides, type-checked; a bad one raises ValueError naming ``where`` and the key."""
    if not isinstance(overrides, Mapping):
        raise ValueError(f"{where} must be a mapping, not {type(overrides).__name__}")
    unknown = sorted(str(key) for key in overrides if key not in OVERRIDE_KEYS)
    if unknown:
        raise ValueError(
            f"{where} has unknown key(s) {', '.join(map(repr, unknown))}; "
            f"known keys: {', '.join(sorted(OVERRIDE_KEYS))}"
        )
    out: dict[str, Any] = {}
    for key, value in overrides.items():
        if key in _BOOL_KEYS:
            if not isinstance(value, bool):
                raise ValueError(f"{where}[{key!r}] must be {booleans}, not {value!r}")
        elif key in _INT_KEYS:
            minimum = 0 if key == "output_reservation" else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise ValueError(
                    f"{where}[{key!r}] must be a whole number >= {minimum}, not {value!r}"
                )
        elif key == _ALLOW_KEY:
            value = _allowed_options(value, f"{where}[{key!r}]")
        elif not isinstance(value, str) or value not in TOKENIZERS:
            raise ValueError(
                f"{where}['tokenizer'] must be one of "
                f"{', '.join(sorted(TOKENIZERS))}, not {value!r}"
            )
        out[key] = value
    return out


def _allowed_options(value: Any, where: str) -> tuple[str, ...]:
    from fluid_build.copilot.call.options import SAMPLING_FIELDS

    if isinstance(value, str) or not isinstance(value, list | tuple):
        raise ValueError(
            f"{where} must be a list of call options ({', '.join(SAMPLING_FIELDS)}), "
            f"not {value!r:.60}"
        )
    for name in value:
        if name not in SAMPLING_FIELDS:
            raise ValueError(
                f"{where} names {name!r:.40}, which is not a call option the model rules "
                f"refuse; known: {', '.join(SAMPLING_FIELDS)}"
            )
    return tuple(value)


#: The environment's equivalent of the ``capability_matrix`` argument.
CAPABILITY_MATRIX_ENV: Final = "FLUID_CAPABILITY_MATRIX"
_MATRIX_EXAMPLE: Final = '{"context_window": 32768, "tools": true}'
# A matrix is a handful of keys: 64 KiB and four levels are far more than one needs.
_MAX_MATRIX_BYTES: Final = 64 * 1024
_MAX_MATRIX_DEPTH: Final = 4


def _matrix_error(problem: str) -> ProviderError:
    where = CAPABILITY_MATRIX_ENV if problem.startswith("[") else f"{CAPABILITY_MATRIX_ENV} "
    return ProviderError(
        f"{where}{problem}; set it to inline JSON or the path of a JSON or "
        f"YAML file, e.g. {CAPABILITY_MATRIX_ENV}='{_MATRIX_EXAMPLE}' "
        "(docs/capability-warnings.md)",
        code="llm.not_configured",
        retryable=False,
        details={"variable": CAPABILITY_MATRIX_ENV, "example": _MATRIX_EXAMPLE},
    )


def _matrix_document(raw: str) -> Any:
    """The document ``FLUID_CAPABILITY_MATRIX`` holds: inline JSON, or a file's JSON or YAML."""
    import json

    import yaml

    from fluid_build._files import (
        TooDeepError,
        UnsafeFileError,
        load_json,
        load_yaml,
        read_regular,
    )

    text = raw.strip()
    try:
        if text.startswith(("{", "[")):
            if len(text) > _MAX_MATRIX_BYTES:
                raise _matrix_error(f"is longer than {_MAX_MATRIX_BYTES:,} characters")
            return load_json(text, name=CAPABILITY_MATRIX_ENV, max_depth=_MAX_MATRIX_DEPTH)
        path = os.path.expanduser(text)
        shown = repr(truncate(redact(text), 80))
        try:
            data = read_regular(path, limit=_MAX_MATRIX_BYTES, name=f"the file {shown}")
        except FileNotFoundError:
            raise _matrix_error(f"names the file {shown}, which does not exist") from None
        except ValueError:  # a NUL byte: no file has that name
            raise _matrix_error(f"names the file {shown}, which no file can be named") from None
        except OSError as exc:
            raise _matrix_error(
                f"names the file {shown}, which cannot be read ({exc.strerror})"
            ) from None
        content = data.decode("utf-8")
        load = load_json if path.lower().endswith(".json") else load_yaml
        return load(content, name=f"the file {shown}", max_depth=_MAX_MATRIX_DEPTH)
    except TooDeepError as exc:
        raise _matrix_error(f"{exc.reason}: a matrix needs three levels at most") from None
    except UnsafeFileError as exc:
        raise _matrix_error(f"names {exc.path}, which {exc.reason}") from None
    except UnicodeDecodeError:
        raise _matrix_error("names a file that is not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise _matrix_error(
            f"is not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})"
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise _matrix_error(f"names a file that is not valid YAML{where}") from None


def capability_matrix_from_env(
    env: Mapping[str, str] | None, provider: str, model: str
) -> dict[str, Any]:
    """The overrides ``FLUID_CAPABILITY_MATRIX`` sets for ``provider``/``model``; {} when unset.

    The value is inline JSON (it starts with ``{``) or the path of a JSON or YAML
    file (``.json`` is read as JSON, anything else as YAML), at most 64 KiB. It
    holds either the override keys themselves (:data:`OVERRIDE_KEYS`), for every
    model the process calls, or one object of them per model, keyed
    ``provider:model`` or ``model`` (``provider:model`` wins); a model it does not
    name gets none. Every entry is checked, used or not: anything wrong raises
    :class:`ProviderError` (``llm.not_configured``) naming the variable, the
    entry and a valid example.
    """
    raw = (os.environ if env is None else env).get(CAPABILITY_MATRIX_ENV)
    if raw is None or not raw.strip():
        return {}
    document = _matrix_document(raw)
    if not isinstance(document, Mapping):
        raise _matrix_error(f"must hold an object of overrides, not {type(document).__name__}")
    per_model = [str(key) for key, value in document.items() if isinstance(value, Mapping)]
    try:
        if not per_model:
            return _validated(document, CAPABILITY_MATRIX_ENV, booleans="true or false")
        flat = sorted(str(key) for key in document if str(key) not in per_model)
        if flat:
            raise ValueError(
                f"mixes override keys ({', '.join(flat)}) with per-model entries "
                f"({', '.join(per_model[:3])}): key every override by model, or none"
            )
        checked = {
            str(key).strip().lower(): _validated(
                value, f"{CAPABILITY_MATRIX_ENV}[{str(key)!r}]", booleans="true or false"
            )
            for key, value in document.items()
        }
    except ValueError as exc:
        problem = str(exc)
        if problem.startswith(CAPABILITY_MATRIX_ENV):
            problem = problem[len(CAPABILITY_MATRIX_ENV) :].lstrip()
        raise _matrix_error(problem) from None
    name = model.strip().lower()
    return dict(checked.get(f"{provider.strip().lower()}:{name}") or checked.get(name) or {})


def capabilities_for(
    provider: str, model: str, overrides: Mapping[str, Any] | None = None
) -> ModelCapabilities:
    """The capability row for ``provider``/``model``, with ``overrides`` applied.

    ``overrides`` is the caller's ``capability_matrix``: ``context_window``,
    ``max_output_tokens``, ``tools``, ``strict_schema``, ``json_mode`` and
    ``tokenizer`` replace the matrix's values; ``output_reservation`` and
    ``preflight`` belong to the pre-flight and are only validated here. A
    value of the wrong type, or an unknown key, raises ValueError. An empty
    ``provider`` searches every section by model name.
    """
    if not overrides:
        return _base_capabilities(provider, model)
    if isinstance(overrides, Mapping):
        # Types are part of the key: True == 1, but only one of them is a valid window.
        given = tuple((type(k), k, type(v), v) for k, v in overrides.items())
        try:
            return _overridden(provider, model, given)
        except TypeError:  # an unhashable value: checked (and refused) below
            pass
    return _with_overrides(provider, model, overrides)


@functools.lru_cache(maxsize=1024)
def _overridden(
    provider: str, model: str, given: tuple[tuple[type, Any, type, Any], ...]
) -> ModelCapabilities:
    # A client passes the same matrix on every call; ModelCapabilities is frozen.
    return _with_overrides(provider, model, {k: v for _, k, _, v in given})


def _with_overrides(provider: str, model: str, overrides: Mapping[str, Any]) -> ModelCapabilities:
    checked = _validated(overrides)
    caps = _base_capabilities(provider, model)
    applied: dict[str, Any] = {
        key: checked[key]
        for key in (
            "context_window",
            "max_output_tokens",
            "tools",
            "strict_schema",
            "json_mode",
            "tokenizer",
        )
        if key in checked
    }
    if not applied:
        return caps
    overridden = tuple(applied)
    if "context_window" in applied:
        # The caller's window replaces the provider's own input cap too.
        applied["max_input_tokens"] = None
    return replace(caps, **applied, overridden=overridden)


@functools.lru_cache(maxsize=1024)
def _base_capabilities(provider: str, model: str) -> ModelCapabilities:
    # Every call's pre-flight asks; the answer for a name never changes.
    provider_name = provider.strip().lower()
    found = _lookup(provider_name, _normalise(model))
    shown_model = model.strip()
    if found is None:
        caps = ModelCapabilities(
            provider=provider_name,
            model=shown_model,
            context_window=UNKNOWN_CONTEXT_WINDOW,
            max_output_tokens=UNKNOWN_MAX_OUTPUT,
            tools=False,
            strict_schema=False,
            json_mode=False,
            tokenizer="unknown",
            weaknesses=(),
            known=False,
        )
    else:
        section, row = found
        caps = ModelCapabilities(
            provider=provider_name or section,
            model=shown_model,
            context_window=row.context_window,
            max_output_tokens=row.max_output_tokens,
            tools=row.tools,
            strict_schema=row.strict_schema,
            json_mode=row.json_mode,
            tokenizer=row.tokenizer,
            weaknesses=row.weaknesses,
            known=True,
            max_input_tokens=row.max_input_tokens,
        )
    return caps


def models_with_larger_window(
    than: int, *, provider: str | None = None, limit: int = 5
) -> list[str]:
    """Models whose window exceeds ``than`` tokens, as ``"provider:model (window)"``.

    Nearest-larger first: the smallest window that fits is usually the
    cheapest and fastest model that can take the prompt. One model per
    provider and size is listed (the first of its family in the matrix).
    Where a provider caps input below the window (GPT-5), that cap is what
    counts and is shown, as ``"openai:gpt-5 (272,000 input)"``. ``provider``
    keeps one provider's models (any name the matrix knows, such as
    ``vertex`` for Gemini); without it the hosted providers are listed, and
    local Ollama models and the presets' (xai, deepseek, together) are left
    out. Retired and legacy models are never suggested.
    """
    if limit <= 0:
        return []
    if provider is None:
        own = _own_provider_only()
        sections = [name for name in _MATRIX if name not in own]
    else:
        section = _section(provider.strip().lower())
        sections = [section] if section else []
    found = sorted(
        (_input_room(row), section, order, row)
        for section in sections
        for order, row in enumerate(_MATRIX[section])
        if row.suggest and _input_room(row) > than
    )
    out: list[str] = []
    seen: set[tuple[str, int]] = set()
    for room, section, _, row in found:
        # One model per provider and size: the family's first row in the matrix.
        if (section, room) in seen:
            continue
        seen.add((section, room))
        suffix = " input" if row.max_input_tokens is not None else ""
        out.append(f"{section}:{row.model} ({room:,}{suffix})")
        if len(out) == limit:
            break
    return out


def _input_room(row: _Row) -> int:
    """The largest prompt the model takes: its input cap, else its window."""
    return row.max_input_tokens or row.context_window


def run_start_warnings(
    caps: ModelCapabilities,
    *,
    uses_tools: bool = False,
    wants_strict_schema: bool = False,
    prompt_tokens: int | None = None,
) -> list[str]:
    """Short operator-facing warnings for a degraded model/run combination.

    Each is one sentence saying what is wrong and what to do; the order is
    stable. An unknown model gets one warning that lists the defaults assumed
    (instead of separate tight-context, tools and schema warnings), unless its
    window was overridden: then it is judged on the values given.
    """
    label = caps.label
    out: list[str] = []
    # A model described by its real window is judged on what it was told, like a known one.
    if not caps.known and "context_window" not in caps.overridden:
        out.append(
            f"{label} is not in the capability matrix: assuming a window of "
            f"{caps.context_window:,} tokens, {caps.max_output_tokens:,} output tokens, "
            f"{_can(caps.tools)} tool calls and {_can(caps.strict_schema)} strict schema. "
            # The variable works for a Python caller too (the client reads it), so the
            # warning names no argument: the command line prints it as it is.
            "Set the model's real limits with FLUID_CAPABILITY_MATRIX="
            """'{"context_window": ..., "tools": ..., "strict_schema": ...}'."""
        )
    else:
        if caps.context_window < TIGHT_CONTEXT:
            # Compaction is the agent loop's (a run with tools): a plain call or a batch
            # has no conversation to compact, so it is not advised there.
            out.append(
                f"{label} has a tight window of {caps.context_window:,} tokens: long inputs "
                + (
                    "and agent loops overflow it. Use a larger-context model (--model), or "
                    "compact earlier (FLUID_AGENT_COMPACT_AFTER=4)."
                    if uses_tools
                    else "overflow it. Use a larger-context model (--model), or shorten them."
                )
            )
        if uses_tools and not caps.tools:
            out.append(
                f"{label} does not support tool calls, and this run uses tools. Pick a model "
                "with tool support (--model), or set "
                """FLUID_CAPABILITY_MATRIX='{"tools": true}' if yours has it."""
            )
        elif uses_tools and WEAK_TOOL_USE in caps.weaknesses:
            out.append(
                f"{label} has weak tool use: expect corrective retries of malformed tool "
                "calls. A larger model (qwen2.5, llama3.3, a hosted model) is more reliable."
            )
        if wants_strict_schema and not caps.strict_schema:
            out.append(
                f"{label} has no strict structured output: schema violations are caught "
                "after the fact and retried. Prefer a model with structured outputs (--model)."
            )
        elif wants_strict_schema and WEAK_NESTED_SCHEMAS in caps.weaknesses:
            out.append(
                f"{label} {WEAK_NESTED_SCHEMAS}: expect schema-correction retries. "
                "gemini-2.5-flash handles them better."
            )
    if prompt_tokens is not None and prompt_tokens > _PROMPT_SHARE_WARNING * caps.context_window:
        share = prompt_tokens / caps.context_window
        out.append(
            f"the prompt already uses {share:.0%} of {label}'s window ({prompt_tokens:,} of "
            f"{caps.context_window:,} tokens): little room is left for output and later turns. "
            "Compact the inputs or pick a larger-context model (--model)."
        )
    return out


def _can(flag: bool) -> str:
    return "with" if flag else "no"


def _env_flag(env: Mapping[str, str], name: str) -> bool:
    raw = env.get(name)
    flag = yes_no(raw)
    if flag is None:
        LOG.warning("%s=%r is not a yes/no value (1, 0, true, false); treating it as 0", name, raw)
    return bool(flag)


def emit_run_start_banner(
    warnings: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    stream: TextIO | None = None,
) -> None:
    """Show the run-start warnings once: a compact banner on ``stream`` plus an INFO log line each.

    ``FLUID_QUIET=1`` or ``FLUID_NONINTERACTIVE=1`` in ``env`` (default: the
    process environment) hides the banner; the count is still logged at INFO
    on ``fluid_build.capabilities``. No warnings, no output.
    """
    if not warnings:
        return
    env = os.environ if env is None else env
    count = len(warnings)
    noun = "warning" if count == 1 else "warnings"
    hidden_by = next(
        (name for name in ("FLUID_QUIET", "FLUID_NONINTERACTIVE") if _env_flag(env, name)), None
    )
    if hidden_by is not None:
        LOG.info(
            "%d capability %s for this run (banner hidden by %s=1; "
            "see docs/capability-warnings.md)",
            count,
            noun,
            hidden_by,
        )
        return
    out = sys.stderr if stream is None else stream
    lines = [f"fluid: {count} capability {noun} for this run (FLUID_QUIET=1 hides this):"]
    lines.extend(f"  ! {warning}" for warning in warnings)
    out.write("\n".join(lines) + "\n")
    out.flush()
    # The banner is the warning. A WARNING record would be printed a second time
    # wherever warnings are printed (the fluid command, Python's last-resort
    # handler), so the log gets each one at INFO.
    for warning in warnings:
        LOG.info("capability: %s", warning)


def option_rules(
    provider: str,
    model: str,
    fields: Mapping[str, Any],
    matrix: Mapping[str, Any] | None = None,
) -> dict[str, str]:
    """The call options of ``fields`` that ``provider:model`` refuses (option -> why).

    ``fields`` are a call's :class:`CallSpec` sampling fields (only those set). The
    rules are :data:`OPTION_RULES`, the model found like the matrix's rows (Azure
    deployments by their name: a deployment called ``o3-mini`` is covered, one
    called ``prod`` is not). ``matrix`` is the caller's ``capability_matrix``: its
    ``allow_options`` names options no rule refuses for this model (for a model
    the table gets wrong); a malformed one raises ValueError. The first rule that
    refuses an option gives its reason, and the later rules see the call without it.
    """
    allowed: tuple[str, ...] = ()
    if matrix and _ALLOW_KEY in matrix:
        allowed = _allowed_options(matrix[_ALLOW_KEY], f"capability_matrix[{_ALLOW_KEY!r}]")
    shown = model.strip()
    refused: dict[str, str] = {}
    sent = dict(fields)
    for rule in _rules_for(provider, model):
        # Each rule judges the call as it would be sent: an option an earlier rule refused
        # is gone (Claude's "temperature or top_p" keeps top_p when temperature is refused).
        if rule.option in sent and rule.option not in allowed and rule.applies(sent):
            refused[rule.option] = rule.why.format(model=shown)
            del sent[rule.option]
    return refused
