"""What an error answer means: the rules, in order, each citing where its shape was learned.

:data:`RULES` is walked top to bottom and the first rule that applies decides
(:func:`decide`); the last rule applies to everything, so one always does.
The order is the contract, by group: a redirect; then what the body proves
cannot succeed as sent (context overflow, a rejected key, a spent quota, a
content refusal, a missing model), each group's body wordings before its
status, so that what the body says beats what the status says; then rate
limits, server trouble, timeouts, and any other answer as an invalid request.
Within a group every rule yields the same verdict, so a group's order only
says which rule gets the credit. :data:`SHOULD_RETRY` runs after the table: the
server's own ``x-should-retry`` has the last word on ``retryable``.

Wording is matched on the lower-cased text of the provider's fields (and of an
HTML or text body) as words: a phrase inside an identifier the provider echoes
back does not count. docs/typed-errors.md lists the rules in this order, and a
test keeps the two in step.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal

import httpx

from fluid_build.copilot.agents.error_answers import Evidence
from fluid_build.copilot.agents.errors import (
    ContextOverflowError,
    ProviderAuthError,
    ProviderError,
    ProviderServerError,
    ProviderTimeoutError,
    RateLimitError,
)

__all__ = [
    "RULES",
    "SHOULD_RETRY",
    "Override",
    "Rule",
    "Verdict",
    "aws_error",
    "decide",
]


# --------------------------------------------------------------------------
# What a rule yields
# --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Verdict:
    """The typed error a rule yields: its class, reason code and where its wait comes from.

    ``wait`` is ``"retry-after"`` for the ``Retry-After``/``retry-after-ms``
    header alone, ``"hint"`` for a 429's fallbacks too (body retry delay,
    message, reset headers). ``error_on_429`` replaces ``error`` when the
    judged status is 429.
    """

    code: str
    error: type[ProviderError]
    retryable: bool | None = None
    wait: Literal["none", "retry-after", "hint"] = "none"
    notes_wait_source: bool = False
    error_on_429: type[ProviderError] | None = None


REDIRECTED: Final = Verdict("llm.bad_endpoint", ProviderError)
OVERFLOW: Final = Verdict("llm.context_overflow", ContextOverflowError)
AUTH: Final = Verdict("llm.auth", ProviderAuthError)
QUOTA: Final = Verdict(
    "llm.quota_exhausted",
    ProviderError,
    retryable=False,
    wait="retry-after",
    error_on_429=RateLimitError,
)
FILTERED: Final = Verdict("llm.content_filtered", ProviderError, retryable=False)
MODEL_NOT_FOUND: Final = Verdict("llm.model_not_found", ProviderError, retryable=False)
ENDPOINT_NOT_FOUND: Final = Verdict("llm.endpoint_not_found", ProviderError, retryable=False)
RATE_LIMITED: Final = Verdict("llm.rate_limited", RateLimitError, wait="hint")
OVERLOADED_WAIT: Final = Verdict(
    "llm.overloaded", RateLimitError, wait="retry-after", notes_wait_source=True
)
SERVER_WAIT: Final = Verdict(
    "llm.server_error", RateLimitError, wait="retry-after", notes_wait_source=True
)
NO_RESOURCES: Final = Verdict("llm.insufficient_resources", ProviderServerError, retryable=False)
OVERLOADED: Final = Verdict("llm.overloaded", ProviderServerError)
SERVER_ERROR: Final = Verdict("llm.server_error", ProviderServerError)
TIMEOUT: Final = Verdict("llm.timeout", ProviderTimeoutError)
INVALID: Final = Verdict("llm.invalid_request", ProviderError, retryable=False)


# --------------------------------------------------------------------------
# A rule
# --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Rule:
    """One provider family's way of saying one thing, and what it becomes.

    It applies when every condition it sets holds: the judged status is one
    of ``statuses``, the words match ``wording``, they do not match ``unless``,
    and ``when`` is true. ``matches`` says the same in words, for the docs;
    ``source`` is where the shape was seen (a provider's docs, a public issue,
    a row of tests/data/provider_errors.json).
    """

    name: str
    matches: str
    yields: Verdict
    source: str
    statuses: frozenset[int] = frozenset()
    wording: re.Pattern[str] | None = None
    unless: re.Pattern[str] | None = None
    when: Callable[[Evidence], bool] | None = None

    def applies(self, evidence: Evidence) -> bool:
        """Whether this rule decides ``evidence``."""
        if self.statuses and evidence.judged not in self.statuses:
            return False
        if self.when is not None and not self.when(evidence):
            return False
        if self.unless is not None and self.unless.search(evidence.text):
            return False
        return self.wording is None or bool(self.wording.search(evidence.text))


@dataclass(frozen=True, slots=True)
class Override:
    """A header that has the last word on ``retryable``, except for verdicts in ``keeps``."""

    name: str
    matches: str
    header: str
    keeps: frozenset[str]
    source: str

    def says(self, headers: httpx.Headers) -> bool | None:
        """``True`` or ``False`` as the header says; None when absent, garbage or split."""
        said = {value.strip().lower() for value in headers.get_list(self.header)}
        if said == {"true"}:
            return True
        if said == {"false"}:
            return False
        return None


# --------------------------------------------------------------------------
# Wordings
# --------------------------------------------------------------------------


def _rx(*alternatives: str) -> re.Pattern[str]:
    """Phrases that count only where a word starts.

    "insufficient_quota" is a code, "x_insufficient_quota" a parameter name
    the provider echoes back. One look-behind before the alternation matches
    exactly what one per phrase would, several times faster.
    """
    return re.compile(
        "(?<![a-z0-9_])(?:" + "|".join(f"(?:{a})" for a in alternatives) + ")", re.IGNORECASE
    )


_OPENAI_OVERFLOW = _rx(
    r"context[_ ]length[_ ]exceeded",
    r"maximum context length",
    r"reduce the length of the messages",
)
_LLAMACPP_OVERFLOW = _rx(
    r"exceed_context_size",
    r"exceeds? (?:the )?(?:available |maximum |model'?s? )?context (?:length|window|size|limit)",
    r"larger than the max(?:imum)? context size",
)
_ANTHROPIC_OVERFLOW = _rx(
    r"prompt is too long",
    r"input is too long",
    r"input length and `?max_tokens`? exceed context limit",
)
_GOOGLE_OVERFLOW = _rx(
    r"input token count.{0,60}exceeds",
    r"input token count is \d+ but (?:the )?model only supports up to",
    r"exceeds the maximum number of tokens",
)
_VLLM_OVERFLOW = _rx(
    r"maximum model length",
    r"longer than the model'?s? (?:maximum )?context",
    r"too long to fit into the model",
    r"tokens? \+ `?max_new_tokens`? must be <=",
)
_CEREBRAS_OVERFLOW = _rx(
    r"current length is \d+ while limit is \d+",
    r"\d+ tokens? > \d+ (?:tokens? )?maximum",
)
_COHERE_OVERFLOW = _rx(
    r"too many tokens(?: in (?:the )?(?:prompt|input|request)|: total number of tokens)",
)
_GENERIC_OVERFLOW = _rx(
    r"(?:model'?s?|the) maximum context limit",
    r"context (?:length|window|size|limit) (?:(?:has been|was|is) )?exceeded",
)
_TOO_LARGE = _rx(r"request_too_large", r"request too large", r"request entity too large")
# OpenAI's string_above_max_length is an overflow only when the long string is the prompt:
# "messages", "messages[3].content", "input[0].content[0].text"; "tools[0].function.description"
# or "messages[1].tool_calls[0].id" too long is a malformed request.
# OpenAI words the code "string too long. Expected a string with maximum length N"; a relay
# that passes on only the message leaves that wording (litellm's table), and it means the same.
_LONG_STRING = _rx(
    r"string_above_max_length", r"string too long\. expected a string with maximum length"
)
_PROMPT_PARAM = re.compile(
    r"^(?:messages|input|prompt)(?:\[\d+\](?:\.content(?:\[\d+\](?:\.text)?)?)?)?$", re.IGNORECASE
)
_QUOTED_PARAM = re.compile(r"(?i)invalid '([^']{1,200})'")
# "Limit 10000, Requested 15000" without a "Used": one request bigger than the
# whole per-minute budget, which no amount of waiting fixes.
_TPM_TOO_LARGE = re.compile(r"(?i)limit:? (\d+), requested:? (\d+)")

_OPENAI_AUTH = _rx(
    r"invalid[_ ]api[_ ]key",
    r"incorrect api key",
    r"invalid_authentication",
    r"no api key provided",
    r"you didn'?t provide an api key",
    r"missing (?:an? )?(?:api[ _]key|authentication|bearer)",
)
_GOOGLE_AUTH = _rx(
    r"api key not valid",
    r"api_key_invalid",
    r"api key (?:is )?(?:missing|expired|revoked|invalid|disabled)",
    r"api_key_(?:expired|revoked|service_blocked)",
    r"\bunauthenticated\b",
    r"reported as leaked",
)
_ANTHROPIC_AUTH = _rx(r"invalid x-api-key", r"authentication_error")
_AZURE_AUTH = _rx(
    r"invalid (?:subscription key|authentication|bearer token|credentials)",
    r"access denied due to invalid subscription key",
)
_DISABLED_ACCOUNT = _rx(
    r"organization has been disabled",
    r"account (?:is |has been )?(?:disabled|deactivated|suspended)",
)

_OPENAI_QUOTA = _rx(
    r"insufficient[_ ]quota",
    r"exceeded your current quota",
    r"quota (?:has been )?exhausted",
    r"billing hard limit",
)
_ANTHROPIC_BILLING = _rx(r"billing_(?:error|hard_limit|not_active)", r"credit balance is too low")
_CREDITS = _rx(
    r"insufficient (?:credits|balance|funds)",
    r"out of credits",
    r"more credits",
    r"payment required",
    r"spend(?:ing)? limit",
)

# Azure's sentence also reaches us cut short and in title case ("... Triggering Azure OpenAI's
# Content Management"): the text is lower-cased, and "content management" counts only after
# "azure openai's", never alone ("Management API unavailable" is no refusal).
_AZURE_FILTER = _rx(
    r"responsibleaipolicyviolation",
    r"content management policy",
    r"filtered due to the prompt triggering",
    r"azure openai['\u2019]s content management",
)
_CONTENT_FILTER = _rx(r"content[_ ]filter")
_OPENAI_POLICY = _rx(
    r"content_policy_violation",
    r"safety system",
    r"flagged as potentially violating",
    r"violat(?:es|ed|ing) (?:our|the) (?:usage |content )?polic(?:y|ies)",
)

_OPENAI_NO_MODEL = _rx(r"model_not_found")
_AZURE_NO_DEPLOYMENT = _rx(r"deploymentnotfound", r"deployment for this resource does not exist")
_GOOGLE_NO_MODEL = _rx(r"is not found for api version")
_NAMED_MODEL_MISSING = _rx(
    r"\bmodel\b[^.\n]{0,120}?(?:not found|does not exist|is not supported for|not available)",
    r"not a valid model",
    r"unknown model",
    r"no such model",
)
_MODELISH = _rx(r"\bmodel", r"deployment")

_RATE_LIMIT = _rx(
    # A token ("rate limit", "rate-limited", "rate_limit_exceeded", "RateLimitError"),
    # never part of an identifier such as "_litellm_rate_limit_descriptors".
    r"(?<!-)rate[ _-]?limit(?:s|ed|ing)?(?:[ _-]?(?:exceeded|error|reached))?(?![a-z0-9_-])",
    r"too many requests",
    r"resource_exhausted",
)
# Specific phrasings only: a proxy page saying "the origin may be overloaded"
# is a gateway failure, not a provider telling us it is busy.
_ANTHROPIC_OVERLOADED = _rx(r"overloaded_error", r"^\s*overloaded\b")
_BUSY = _rx(
    r"server_is_overloaded",
    r"\b(?:model|server|servers|engine|service|system|api) (?:is |are )?(?:currently )?overloaded",
    r"over capacity",
)
# OpenAI's type model_error (500; Azure sends it as a 400): the model's own output broke,
# neither the request nor a content filter; asking again usually gets an answer.
_MODEL_BROKE = _rx(r"the model produced invalid content")
_RESOURCES = _rx(r"requires more system memory", r"out of memory", r"insufficient memory")

# AWS Bedrock: its error types (lower-cased, as the event stream spells them too) and the
# wordings a ValidationException uses for a prompt that does not fit.
_BEDROCK_OVERFLOW = _rx(r"too long", r"too many (?:input |total )?tokens")
_BEDROCK_NO_MODEL = _rx(r"the provided model identifier is invalid")
_AWS_AUTH_TYPES: Final = frozenset(
    {
        "accessdeniedexception",
        "unrecognizedclientexception",
        "expiredtokenexception",
        "invalidsignatureexception",
        "incompletesignatureexception",
        "missingauthenticationtokenexception",
    }
)
_AWS_SERVER_TYPES: Final = frozenset(
    {
        "serviceunavailableexception",
        "internalserverexception",
        "modelstreamerrorexception",
        "modelnotreadyexception",
    }
)


# --------------------------------------------------------------------------
# Conditions beyond status and wording
# --------------------------------------------------------------------------


def aws_error(evidence: Evidence) -> tuple[str, str]:
    """AWS's error type and message; ``("", "")`` for an answer that is not AWS's.

    AWS (Bedrock) names the error in the ``x-amzn-errortype`` header
    (``ValidationException:http://internal.amazon.com/coral/...``) or the body's
    ``__type`` (``com.amazon.coral.validate#ValidationException``): the type is
    what comes before the ``:`` and after the ``#``. The message is ``message``
    or ``Message``.
    """
    data = evidence.body.data if evidence.body.kind == "json" else None
    body: dict[str, object] = data if isinstance(data, dict) else {}
    kind = evidence.headers.get("x-amzn-errortype", "").split(":", 1)[0].strip()
    named = body.get("__type")
    if not kind and isinstance(named, str):
        kind = named.rsplit("#", 1)[-1].strip()
    message = body.get("message") or body.get("Message")
    return kind[:200], message if isinstance(message, str) else ""


def _aws_type(evidence: Evidence) -> str:
    return aws_error(evidence)[0].lower()


def _bedrock_too_long(evidence: Evidence) -> bool:
    kind, message = aws_error(evidence)
    return kind.lower() == "validationexception" and bool(_BEDROCK_OVERFLOW.search(message))


def _aws_credentials_refused(evidence: Evidence) -> bool:
    return _aws_type(evidence) in _AWS_AUTH_TYPES


def _aws_service_quota(evidence: Evidence) -> bool:
    return _aws_type(evidence) == "servicequotaexceededexception"


def _bedrock_no_model(evidence: Evidence) -> bool:
    """Bedrock's "The provided model identifier is invalid." (its type is often lost on
    the way), or ResourceNotFoundException."""
    kind, message = aws_error(evidence)
    return kind.lower() == "resourcenotfoundexception" or bool(
        _BEDROCK_NO_MODEL.search(evidence.text) or _BEDROCK_NO_MODEL.search(message)
    )


def _aws_throttled(evidence: Evidence) -> bool:
    return _aws_type(evidence) == "throttlingexception"


def _aws_server_trouble(evidence: Evidence) -> bool:
    return _aws_type(evidence) in _AWS_SERVER_TYPES


def _redirected(evidence: Evidence) -> bool:
    """A 3xx whose body names no error of its own."""
    fields = evidence.fields
    named = fields.body_status is not None or fields.type_status is not None
    return 300 <= evidence.status < 400 and not named and not fields.message


def _prompt_too_long(evidence: Evidence) -> bool:
    """OpenAI's ``string_above_max_length`` on the prompt, named by param or in the message."""
    quoted = _QUOTED_PARAM.search(evidence.fields.message)
    param = evidence.fields.param or (quoted.group(1) if quoted else "")
    return bool(_PROMPT_PARAM.match(param))


def _over_token_budget(evidence: Evidence) -> bool:
    """One request larger than the whole per-minute token limit (no "Used": nothing spent)."""
    match = _TPM_TOO_LARGE.search(evidence.text)
    return bool(match and "used" not in evidence.text and int(match.group(2)) > int(match.group(1)))


_NO_FREE_TIER = re.compile(r"\blimit: 0\b", re.IGNORECASE)


def _not_google_exhausted(evidence: Evidence) -> bool:
    """Google's RESOURCE_EXHAUSTED says "quota" for per-minute limits: its ids decide."""
    return not _google_exhausted(evidence)


def _google_quota_spent(evidence: Evidence) -> bool:
    """RESOURCE_EXHAUSTED on a per-day quota, or on a quota of 0 (no free tier)."""
    fields = evidence.fields
    if not _google_exhausted(evidence):
        return False
    ids = " ".join(fields.quota_ids).lower()
    return "perday" in ids or "per_day" in ids or bool(_NO_FREE_TIER.search(fields.message))


def _google_exhausted(evidence: Evidence) -> bool:
    """Google's status ``RESOURCE_EXHAUSTED``, however a relay cased it."""
    return evidence.fields.type.upper() == "RESOURCE_EXHAUSTED"


def _names_a_model(evidence: Evidence) -> bool:
    return bool(_MODELISH.search(evidence.fields.message))


def _relayed_429(evidence: Evidence) -> bool:
    """A 5xx whose body says 429 or RESOURCE_EXHAUSTED: a gateway relaying a rate limit."""
    return evidence.status >= 500 and evidence.judged == 429


def _below_500_not_overloaded(evidence: Evidence) -> bool:
    return evidence.judged < 500 and not _overloaded(evidence)


def _overloaded(evidence: Evidence) -> bool:
    """Anthropic's 529, or a provider saying in so many words that it is overloaded."""
    return (
        evidence.judged == 529
        or bool(_ANTHROPIC_OVERLOADED.search(evidence.text))
        or bool(_BUSY.search(evidence.text))
    )


def _server_trouble(evidence: Evidence) -> bool:
    return _overloaded(evidence) or evidence.judged >= 500


def _overloaded_with_wait(evidence: Evidence) -> bool:
    return _overloaded(evidence) and evidence.asked_wait() is not None


def _server_error_with_wait(evidence: Evidence) -> bool:
    return evidence.judged >= 500 and evidence.asked_wait() is not None


def _gateway_page(evidence: Evidence) -> bool:
    return evidence.body.kind == "html"


_4XX_5XX: Final = frozenset(range(400, 600))
_5XX: Final = frozenset(range(500, 600))
_ERRORS_JSON = "tests/data/provider_errors.json"


# --------------------------------------------------------------------------
# The table
# --------------------------------------------------------------------------

RULES: Final[tuple[Rule, ...]] = (
    Rule(
        "redirect",
        "a 3xx whose body names no error",
        REDIRECTED,
        "RFC 9110 §15.4 (https://www.rfc-editor.org/rfc/rfc9110#section-15.4): "
        "a wrong base URL answered with a redirect",
        when=_redirected,
    ),
    # -- the prompt does not fit ---------------------------------------------------
    Rule(
        "bedrock-validation-too-long",
        "AWS `ValidationException` saying 'too long' or 'too many tokens' (Bedrock)",
        OVERFLOW,
        "https://docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_Converse.html "
        "(ValidationException); issue aws-samples/assessment-generator#2 "
        f"({_ERRORS_JSON}: bedrock-400-input-too-long)",
        when=_bedrock_too_long,
    ),
    Rule(
        "openai-string-above-max-length",
        "`string_above_max_length` or 'string too long. Expected a string with maximum "
        "length N' whose param (or quoted name) is the prompt; any other string is an "
        "invalid request",
        OVERFLOW,
        "OpenAI's 400 invalid_request_error, code string_above_max_length, param naming the "
        "string: issues gptscript-ai/clio#41, VectorlyApp/bluebox#31 "
        f"({_ERRORS_JSON}: openai-400-string-above-max-length-messages-content, "
        "openai-400-string-too-long-wording-only)",
        wording=_LONG_STRING,
        when=_prompt_too_long,
    ),
    Rule(
        "openai-context-length-exceeded",
        "`context_length_exceeded`, 'maximum context length' (OpenAI, Azure, vLLM before 0.10.1)",
        OVERFLOW,
        "https://platform.openai.com/docs/guides/error-codes; issue chathub-dev/chathub#126 "
        f"({_ERRORS_JSON}: openai-400-context-length-exceeded)",
        wording=_OPENAI_OVERFLOW,
        unless=_LONG_STRING,
    ),
    Rule(
        "llamacpp-exceed-context-size",
        "`exceed_context_size_error`, 'exceeds the available context size' (llama.cpp server)",
        OVERFLOW,
        "PR ggml-org/llama.cpp#15780; issue oobabooga/textgen#7257 "
        f"({_ERRORS_JSON}: llamacpp-400-exceed-context-size)",
        wording=_LLAMACPP_OVERFLOW,
        unless=_LONG_STRING,
    ),
    Rule(
        "anthropic-prompt-too-long",
        "'prompt is too long', 'input length and max_tokens exceed context limit' (Anthropic)",
        OVERFLOW,
        "https://docs.anthropic.com/en/api/errors; issue earendil-works/pi#102 "
        f"({_ERRORS_JSON}: anthropic-400-prompt-too-long)",
        wording=_ANTHROPIC_OVERFLOW,
        unless=_LONG_STRING,
    ),
    Rule(
        "gemini-input-token-count",
        "'input token count ... exceeds the maximum number of tokens' (Gemini, Vertex)",
        OVERFLOW,
        "issue google-gemini/gemini-cli#4231 "
        f"({_ERRORS_JSON}: gemini-400-input-token-count-exceeds)",
        wording=_GOOGLE_OVERFLOW,
        unless=_LONG_STRING,
    ),
    Rule(
        "vllm-maximum-model-length",
        "'maximum model length', 'too long to fit into the model' (vLLM, TGI)",
        OVERFLOW,
        "issue opendatalab/MinerU#4868, vllm-project/vllm#12165 "
        f"({_ERRORS_JSON}: vllm-400-max-tokens-too-large)",
        wording=_VLLM_OVERFLOW,
        unless=_LONG_STRING,
    ),
    Rule(
        "cerebras-current-length",
        "'current length is N while limit is M' (Cerebras)",
        OVERFLOW,
        "litellm tests/test_litellm/litellm_core_utils/test_exception_mapping_utils.py "
        f"context_window_test_cases ({_ERRORS_JSON}: cerebras-400-current-length-while-limit)",
        wording=_CEREBRAS_OVERFLOW,
        unless=_LONG_STRING,
    ),
    Rule(
        "cohere-too-many-tokens",
        "'too many tokens: total number of tokens' (Cohere)",
        OVERFLOW,
        f"issue cohere-ai/sandbox-topically#4 ({_ERRORS_JSON}: cohere-400-too-many-tokens)",
        wording=_COHERE_OVERFLOW,
        unless=_LONG_STRING,
    ),
    Rule(
        "generic-context-limit",
        "'the model's maximum context limit', 'context window exceeded'",
        OVERFLOW,
        "litellm tests/test_litellm/litellm_core_utils/test_exception_mapping_utils.py "
        f"context_window_test_cases ({_ERRORS_JSON}: "
        "generic-400-exceeds-models-maximum-context-limit)",
        wording=_GENERIC_OVERFLOW,
        unless=_LONG_STRING,
    ),
    Rule(
        "tpm-request-too-large",
        "'Limit N, Requested M' with M > N and no 'Used': one request over a per-minute limit",
        OVERFLOW,
        f"issue DrShushen/climb#13 ({_ERRORS_JSON}: openai-429-request-too-large-tpm)",
        unless=_LONG_STRING,
        when=_over_token_budget,
    ),
    Rule(
        "request-too-large",
        "`request_too_large`, 'request too large', 'Request Entity Too Large' "
        "(Anthropic, Groq, nginx)",
        OVERFLOW,
        "https://docs.anthropic.com/en/api/errors (413 request_too_large); issue "
        f"bklieger-groq/NotebookLlama-Groq#1 ({_ERRORS_JSON}: groq-413-request-too-large-tpm)",
        wording=_TOO_LARGE,
        unless=_LONG_STRING,
    ),
    Rule(
        "http-413",
        "HTTP 413 Payload Too Large",
        OVERFLOW,
        "RFC 9110 §15.5.14 (https://www.rfc-editor.org/rfc/rfc9110#section-15.5.14); "
        f"nginx ngx_http_error_413_page ({_ERRORS_JSON}: proxy-413-nginx-entity-too-large)",
        statuses=frozenset({413}),
    ),
    # -- the key is rejected -------------------------------------------------------
    Rule(
        "aws-credentials-refused",
        "AWS `AccessDeniedException`, `UnrecognizedClientException`, `ExpiredTokenException`, "
        "`InvalidSignatureException` (Bedrock)",
        AUTH,
        "https://docs.aws.amazon.com/bedrock/latest/APIReference/CommonErrors.html; issues "
        f"Aider-AI/aider#1986, vercel/ai#4163 ({_ERRORS_JSON}: "
        "bedrock-403-unrecognized-client)",
        when=_aws_credentials_refused,
    ),
    Rule(
        "openai-invalid-api-key",
        "`invalid_api_key`, 'Incorrect API key', 'You didn't provide an API key' "
        "(OpenAI, llama.cpp)",
        AUTH,
        "https://platform.openai.com/docs/guides/error-codes; issue chatanywhere/GPT_API_free#62 "
        f"({_ERRORS_JSON}: openai-401-invalid-api-key)",
        wording=_OPENAI_AUTH,
    ),
    Rule(
        "gemini-api-key-invalid",
        "`API_KEY_INVALID`, 'API key not valid', UNAUTHENTICATED (Gemini, Vertex)",
        AUTH,
        f"issue continuedev/continue#10290 ({_ERRORS_JSON}: gemini-400-api-key-invalid)",
        wording=_GOOGLE_AUTH,
    ),
    Rule(
        "anthropic-authentication-error",
        "`authentication_error`, 'invalid x-api-key' (Anthropic)",
        AUTH,
        "https://docs.anthropic.com/en/api/errors; issue cline/cline#12 "
        f"({_ERRORS_JSON}: anthropic-401-invalid-x-api-key)",
        wording=_ANTHROPIC_AUTH,
    ),
    Rule(
        "azure-subscription-key",
        "'invalid subscription key' (Azure OpenAI)",
        AUTH,
        f"issue SciSharp/BotSharp#386 ({_ERRORS_JSON}: azure-401-invalid-subscription-key)",
        wording=_AZURE_AUTH,
    ),
    Rule(
        "disabled-organization",
        "'This organization has been disabled', a disabled or suspended account",
        AUTH,
        f"issue anthropics/claude-code#19028 ({_ERRORS_JSON}: anthropic-400-organization-disabled)",
        wording=_DISABLED_ACCOUNT,
    ),
    Rule(
        "http-401-403",
        "HTTP 401 or 403",
        AUTH,
        "RFC 9110 §15.5.2, §15.5.4; issue nalgeon/pokitoki#42 "
        f"({_ERRORS_JSON}: openai-403-unsupported-country)",
        statuses=frozenset({401, 403}),
    ),
    # -- the quota or the credits are spent ----------------------------------------
    Rule(
        "bedrock-service-quota",
        "AWS `ServiceQuotaExceededException` (Bedrock)",
        QUOTA,
        "https://docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_Converse.html "
        f"(ServiceQuotaExceededException) ({_ERRORS_JSON}: bedrock-400-service-quota-exceeded)",
        when=_aws_service_quota,
    ),
    Rule(
        "gemini-quota-per-day",
        "RESOURCE_EXHAUSTED with a per-day QuotaFailure id or 'limit: 0' (Gemini)",
        QUOTA,
        "https://ai.google.dev/gemini-api/docs/rate-limits; issue googleapis/python-genai#2044 "
        f"({_ERRORS_JSON}: gemini-429-per-day-quota)",
        when=_google_quota_spent,
    ),
    Rule(
        "openai-insufficient-quota",
        "`insufficient_quota`, 'You exceeded your current quota' (OpenAI)",
        QUOTA,
        "https://platform.openai.com/docs/guides/error-codes; issue ChatGPTNextWeb/NextChat#3123 "
        f"({_ERRORS_JSON}: openai-429-insufficient-quota)",
        wording=_OPENAI_QUOTA,
        when=_not_google_exhausted,
    ),
    Rule(
        "anthropic-credit-balance",
        "`billing_error`, 'Your credit balance is too low' (Anthropic)",
        QUOTA,
        "https://docs.anthropic.com/en/api/errors (402 billing_error); issue "
        f"anthropics/claude-code#66314 ({_ERRORS_JSON}: anthropic-400-credit-balance-too-low)",
        wording=_ANTHROPIC_BILLING,
        when=_not_google_exhausted,
    ),
    Rule(
        "openrouter-credits",
        "'Insufficient credits', 'requires more credits', a spend limit (OpenRouter)",
        QUOTA,
        "https://openrouter.ai/docs/api/errors (402); issue Gitlawb/openclaude#43 "
        f"({_ERRORS_JSON}: openrouter-402-insufficient-credits)",
        wording=_CREDITS,
        when=_not_google_exhausted,
    ),
    Rule(
        "http-402",
        "HTTP 402 Payment Required",
        QUOTA,
        "RFC 9110 §15.5.3; https://docs.anthropic.com/en/api/errors "
        f"({_ERRORS_JSON}: anthropic-402-billing-error)",
        statuses=frozenset({402}),
        when=_not_google_exhausted,
    ),
    # -- the content was refused ---------------------------------------------------
    Rule(
        "azure-content-filter",
        "`ResponsibleAIPolicyViolation`, 'content management policy', 'filtered due to the "
        "prompt triggering Azure OpenAI's Content Management', in any case (Azure OpenAI)",
        FILTERED,
        "https://learn.microsoft.com/en-us/azure/ai-services/openai/concepts/content-filter; "
        "issue microsoft/TinyTroupe#85; litellm test_exception_mapping_utils.py "
        "test_is_azure_content_policy_violation_error_case_insensitive "
        f"({_ERRORS_JSON}: azure-400-content-filter, azure-400-content-filter-title-case)",
        wording=_AZURE_FILTER,
    ),
    Rule(
        "content-filtering",
        "`content_filter`, 'blocked by content filtering policy' (Anthropic, Azure)",
        FILTERED,
        f"issue anthropics/claude-code#43487 ({_ERRORS_JSON}: "
        "anthropic-400-output-blocked-content-filtering)",
        wording=_CONTENT_FILTER,
    ),
    Rule(
        "openai-content-policy",
        "`content_policy_violation`, 'safety system', 'violates our usage policy' (OpenAI)",
        FILTERED,
        "issue songquanpeng/one-api#737, alan-turing-institute/t0-1#69 "
        f"({_ERRORS_JSON}: openai-400-content-policy-violation)",
        wording=_OPENAI_POLICY,
    ),
    # -- the model or the endpoint is not there ------------------------------------
    Rule(
        "bedrock-model-not-found",
        "'The provided model identifier is invalid', AWS `ResourceNotFoundException` (Bedrock)",
        MODEL_NOT_FOUND,
        "pydantic/pydantic-ai tests/models/cassettes/test_bedrock/test_bedrock_error.yaml "
        f"({_ERRORS_JSON}: bedrock-400-model-identifier-invalid)",
        when=_bedrock_no_model,
    ),
    Rule(
        "openai-model-not-found",
        "`model_not_found` (OpenAI, Ollama's /v1)",
        MODEL_NOT_FOUND,
        f"issue shobrook/wut#14 ({_ERRORS_JSON}: openai-404-model-not-found)",
        wording=_OPENAI_NO_MODEL,
    ),
    Rule(
        "azure-deployment-not-found",
        "`DeploymentNotFound` (Azure OpenAI)",
        MODEL_NOT_FOUND,
        f"issue chatboxai/chatbox#861 ({_ERRORS_JSON}: azure-404-deployment-not-found)",
        wording=_AZURE_NO_DEPLOYMENT,
    ),
    Rule(
        "gemini-model-not-found",
        "'is not found for API version' (Gemini)",
        MODEL_NOT_FOUND,
        f"issue swuecho/chat#597 ({_ERRORS_JSON}: gemini-404-model-not-found)",
        wording=_GOOGLE_NO_MODEL,
    ),
    Rule(
        "named-model-missing",
        "'model \"x\" not found', 'The model ... does not exist' (Ollama, vLLM, Groq, Anthropic)",
        MODEL_NOT_FOUND,
        "issue ollama/ollama#3876, continuedev/continue#11567 "
        f"({_ERRORS_JSON}: ollama-404-model-not-found-native)",
        wording=_NAMED_MODEL_MISSING,
    ),
    Rule(
        "http-404-naming-a-model",
        "HTTP 404 whose message names a model or deployment",
        MODEL_NOT_FOUND,
        "issue mattermost/mattermost-plugin-agents#257 "
        f"({_ERRORS_JSON}: anthropic-404-model-not-found)",
        statuses=frozenset({404}),
        when=_names_a_model,
    ),
    Rule(
        "http-404-405",
        "HTTP 404 or 405 otherwise: a wrong base URL or path",
        ENDPOINT_NOT_FOUND,
        "nginx ngx_http_error_404_page; issue openclaw/openclaw#10552 "
        f"({_ERRORS_JSON}: proxy-404-nginx-not-found)",
        statuses=frozenset({404, 405}),
    ),
    # -- slow down -----------------------------------------------------------------
    Rule(
        "aws-throttling",
        "AWS `ThrottlingException` (Bedrock)",
        RATE_LIMITED,
        "https://docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_Converse.html "
        "(ThrottlingException); pydantic/pydantic-ai tests/models/cassettes/test_bedrock/"
        f"test_bedrock_throttling_error.yaml ({_ERRORS_JSON}: bedrock-429-throttling)",
        when=_aws_throttled,
    ),
    Rule(
        "gateway-relayed-429",
        "a 5xx whose body says code 429 or RESOURCE_EXHAUSTED",
        RATE_LIMITED,
        "litellm tests/test_litellm/litellm_core_utils/test_exception_mapping_utils.py "
        f"gemini_body_code_429_test_cases ({_ERRORS_JSON}: gateway-500-upstream-code-429)",
        when=_relayed_429,
    ),
    Rule(
        "gemini-resource-exhausted",
        "RESOURCE_EXHAUSTED per minute, waiting RetryInfo.retryDelay (Gemini, Vertex)",
        RATE_LIMITED,
        "https://cloud.google.com/apis/design/errors (RetryInfo, QuotaFailure); issue "
        f"RooCodeInc/Roo-Code#3883 ({_ERRORS_JSON}: gemini-429-per-minute-retryinfo)",
        statuses=frozenset({429}),
        when=_google_exhausted,
    ),
    Rule(
        "http-429",
        "HTTP 429 Too Many Requests",
        RATE_LIMITED,
        "RFC 6585 §4; https://platform.openai.com/docs/guides/rate-limits; issue "
        f"FoundationAgents/MetaGPT#523 ({_ERRORS_JSON}: openai-429-rate-limit-tpm)",
        statuses=frozenset({429}),
    ),
    Rule(
        "rate-limit-wording",
        "a rate-limit phrase or error type under 500, unless the provider says it is overloaded",
        RATE_LIMITED,
        "litellm test_is_error_str_rate_limit_still_matches_standalone_token "
        "(tests/test_classification_sourced.py)",
        wording=_RATE_LIMIT,
        when=_below_500_not_overloaded,
    ),
    # -- the server is in trouble --------------------------------------------------
    Rule(
        "overloaded-with-retry-after",
        "overloaded (529 or in words) with Retry-After or retry-after-ms",
        OVERLOADED_WAIT,
        "issue anthropics/anthropic-sdk-typescript#616 with a Retry-After added "
        f"({_ERRORS_JSON}: anthropic-529-overloaded-retry-after)",
        when=_overloaded_with_wait,
    ),
    Rule(
        "5xx-with-retry-after",
        "a 5xx with Retry-After or retry-after-ms",
        SERVER_WAIT,
        "RFC 9110 §10.2.3 (Retry-After on 503); https://openrouter.ai/docs/api/errors "
        f"({_ERRORS_JSON}: openrouter-503-no-provider-retry-after)",
        when=_server_error_with_wait,
    ),
    Rule(
        "ollama-out-of-memory",
        "server trouble saying 'requires more system memory' or 'out of memory' (Ollama)",
        NO_RESOURCES,
        f"issue yuntianhe2014/Easy-RAG#9 ({_ERRORS_JSON}: ollama-500-out-of-memory)",
        wording=_RESOURCES,
        when=_server_trouble,
    ),
    Rule(
        "anthropic-overloaded",
        "HTTP 529, `overloaded_error` (Anthropic)",
        OVERLOADED,
        "https://docs.anthropic.com/en/api/errors (529 overloaded_error); issue "
        f"anthropics/anthropic-sdk-typescript#616 ({_ERRORS_JSON}: anthropic-529-overloaded)",
        wording=_ANTHROPIC_OVERLOADED,
    ),
    Rule(
        "http-529",
        "HTTP 529 without Anthropic's wording",
        OVERLOADED,
        "https://docs.anthropic.com/en/api/errors (529 overloaded_error)",
        statuses=frozenset({529}),
    ),
    Rule(
        "model-overloaded",
        "'The model is overloaded', 'server_is_overloaded', 'over capacity' (OpenAI, Gemini)",
        OVERLOADED,
        f"issue ikechan8370/chatgpt-plugin#125 ({_ERRORS_JSON}: openai-503-model-overloaded)",
        wording=_BUSY,
    ),
    Rule(
        "model-produced-invalid-content",
        "'The model produced invalid content' (OpenAI 500 `model_error`; Azure sends it as a "
        "400): the model's output broke, not the request, and no content filter spoke",
        SERVER_ERROR,
        "https://platform.openai.com/docs/guides/error-codes (500: retry after a brief wait); "
        "issues BerriAI/litellm#8020, microsoft/autogen#3487 (Azure '400 model_error') "
        f"({_ERRORS_JSON}: openai-500-model-produced-invalid-content, "
        "azure-400-model-produced-invalid-content)",
        wording=_MODEL_BROKE,
    ),
    Rule(
        "aws-server-trouble",
        "AWS `ServiceUnavailableException`, `InternalServerException`, "
        "`ModelStreamErrorException` (424), `ModelNotReadyException` (Bedrock)",
        SERVER_ERROR,
        "https://docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_ConverseStream.html "
        f"(Errors) ({_ERRORS_JSON}: bedrock-424-model-stream-error)",
        when=_aws_server_trouble,
    ),
    Rule(
        "gateway-html-page",
        "a 5xx HTML page from a proxy (nginx, Cloudflare 52x)",
        SERVER_ERROR,
        "nginx src/http/ngx_http_special_response.c; issue acheong08/ChatGPT#447 "
        f"({_ERRORS_JSON}: proxy-502-nginx-bad-gateway)",
        statuses=_5XX,
        when=_gateway_page,
    ),
    Rule(
        "http-5xx",
        "any other 5xx, and an error event of unknown type in a 200 stream",
        SERVER_ERROR,
        "RFC 9110 §15.6; https://docs.anthropic.com/en/api/errors (500 api_error) "
        f"({_ERRORS_JSON}: anthropic-500-api-error)",
        statuses=_5XX,
    ),
    # -- the rest ------------------------------------------------------------------
    Rule(
        "http-408",
        "HTTP 408 Request Timeout",
        TIMEOUT,
        f"https://openrouter.ai/docs/api/errors ({_ERRORS_JSON}: openrouter-408-request-timeout)",
        statuses=frozenset({408}),
    ),
    Rule(
        "invalid-request",
        "anything else: another 4xx",
        INVALID,
        "RFC 9110 §15.5.1; issue Gitlawb/openclaude#739 "
        f"({_ERRORS_JSON}: mistral-422-extra-forbidden)",
    ),
)

#: After the table: the server's own word on retrying, as OpenAI's and Anthropic's SDKs obey it.
SHOULD_RETRY: Final = Override(
    "x-should-retry",
    "`x-should-retry: true` or `false` sets `retryable`; `true` never revives "
    "an overflow, a rejected key, a spent quota or a content refusal",
    "x-should-retry",
    frozenset({"llm.context_overflow", "llm.auth", "llm.quota_exhausted", "llm.content_filtered"}),
    "openai/openai-python src/openai/_base_client.py (_should_retry); issues "
    "anthropics/anthropic-sdk-typescript#357, anthropics/claude-code#35491 "
    f"({_ERRORS_JSON}: anthropic-500-x-should-retry-false)",
)


def decide(evidence: Evidence) -> Rule:
    """The first rule of :data:`RULES` that applies to ``evidence``."""
    for rule in RULES:
        if rule.applies(evidence):
            return rule
    return RULES[-1]
