"""The typed errors of the agent layer.

::

    FluidError                         fluid_build.errors: catch this to catch everything
    └── FluidGenerationError           a generation run failed
        └── AgentExecutionError        code, retryable, retry_after, details, to_dict()
            ├── ProviderError          provider, status_code, model, provider_error_type/code
            │   ├── RateLimitError         an error answer: 429, or a 5xx carrying Retry-After
            │   ├── ProviderTimeoutError   no answer in time: httpx timeouts, HTTP 408
            │   ├── ContextOverflowError   the prompt cannot fit the model; never retried
            │   ├── ProviderAuthError      401/403, or a body calling the key invalid
            │   └── ProviderServerError    5xx without Retry-After, Anthropic 529
            ├── SchemaValidationError  schema_name, validation_errors, raw_output
            └── ToolValidationError    tool_name, tool_args, reason

"No answer" failures (timeouts, refused or reset connections) have no
``status_code``; "error answer" failures carry the status, the provider's own
error type and code, and a bounded, redacted excerpt of the body.

Every error's ``code`` is a stable reason string from :data:`REASON_CODES`:
branch on it, never on the message. The table (``REASON_CODES``, ``ReasonCode``)
lives in :mod:`fluid_build.copilot.agents.reason_codes` and is exported here too,
as this module is the seed's contract. Messages, reprs and ``to_dict()`` are
redacted at construction, so an error can be logged, pickled or shown to an
operator without leaking a credential.
"""

from __future__ import annotations

import math
import re
import shlex
import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, ClassVar, Final, Self

from fluid_build._redact import JsonValue, json_safe, one_line, redact, truncate
from fluid_build.copilot.agents.reason_codes import REASON_CODES, ReasonCode
from fluid_build.copilot.llm.registry import PROVIDERS
from fluid_build.errors import FluidError

__all__ = [
    "BREAKER_CODES",
    "MAX_RETRY_AFTER",
    "REASON_CODES",
    "AgentExecutionError",
    "ContextOverflowError",
    "FluidError",
    "FluidGenerationError",
    "ProviderAuthError",
    "ProviderError",
    "ProviderServerError",
    "ProviderTimeoutError",
    "RateLimitError",
    "ReasonCode",
    "SchemaValidationError",
    "ToolValidationError",
    "python_aside",
    "until_text",
    "without_python_asides",
]

#: Codes that say something about the provider's health, and so count toward
#: its circuit breaker; auth, overflow, validation and rate limits never do.
BREAKER_CODES: Final = frozenset(
    {
        "llm.timeout",
        "llm.network_error",
        "llm.server_error",
        "llm.overloaded",
        "llm.malformed_response",
    }
)

#: The longest wait a server may ask for; longer requests are cut to this.
MAX_RETRY_AFTER: Final = 300.0

#: Details that mark a wait fluid set itself (the circuit breaker, the client's own
#: rate-limit budget, a cooldown another call's answer started, a USD budget's window),
#: which the message already states: no server asked this call to wait.
_OWN_WAITS: Final = ("breaker_key", "rate_limit_budget", "cooldown", "budget")
# A wait is shown as a duration up to a year; past that the number says nothing.
_LONGEST_SHOWN: Final = 366 * 86_400.0

_MAX_MESSAGE: Final = 600
_MAX_RAW_OUTPUT: Final = 64_000
_MAX_HEADER_VALUE: Final = 200
# Response headers worth keeping on an error: rate-limit state and request ids.
# Everything else (cookies above all) is dropped.
_KEPT_HEADER_PREFIXES: Final = (
    "retry-after",
    "x-ratelimit-",
    "ratelimit-",
    "anthropic-ratelimit-",
    "x-request-id",
    "request-id",
    "apim-request-id",
    "x-ms-region",
    "x-goog-request-id",
    "cf-ray",
    "content-type",
    "server",
    "openai-processing-ms",
)


# Codes of a setting that cannot be used; the error's details name the variable.
_SETTING_CODES: Final = frozenset({"llm.not_configured", "llm.bad_endpoint"})
_VARIABLE: Final = re.compile(r"[A-Z][A-Z0-9_]{1,63}")

#: How an operator tells fluid_build a model's real window (docs/capability-warnings.md).
_WINDOW_SETTING: Final = """FLUID_CAPABILITY_MATRIX='{"context_window": <tokens>}'"""
#: Added to an overflow's advice when it happened inside an agent loop (details["agent_loop"]):
#: the one place compacting earlier helps.
_COMPACT_EARLIER: Final = (
    " The agent loop compacts its conversation earlier with FLUID_AGENT_COMPACT_AFTER=4."
)


#: The one form a message names a Python argument in; ``fluid`` leaves it out.
_PYTHON_ASIDE: Final = re.compile(r" ?\([a-z][a-z0-9_]*= in Python\)")


def python_aside(argument: str) -> str:
    """``"(provider= in Python)"``: how a Python caller gives what the message names.

    A message names the variable (and the flag) first, then this; the ``fluid``
    command prints the message without it (:func:`without_python_asides`), so an
    operator is never told about an argument they cannot pass.
    """
    return f"({argument}= in Python)"


def without_python_asides(text: str) -> str:
    """``text`` as the ``fluid`` command shows it: every :func:`python_aside` left out."""
    return _PYTHON_ASIDE.sub("", text)


#: Bedrock has no key variable of its own: the AWS credential chain, or a Bedrock API key.
_AWS_CREDENTIALS: Final = (
    "Check the AWS credentials in the shell running fluid: AWS_PROFILE (run `aws sso login` "
    "for that profile when it uses SSO and the session expired), AWS_ACCESS_KEY_ID and "
    "AWS_SECRET_ACCESS_KEY (with AWS_SESSION_TOKEN for temporary ones), or a Bedrock API key "
    "in AWS_BEARER_TOKEN_BEDROCK."
)
#: The credentials were accepted but may not call the model.
_AWS_PERMISSION: Final = (
    "The AWS credentials were accepted but may not call this model: give the role or user "
    "the IAM permissions bedrock:InvokeModel and bedrock:InvokeModelWithResponseStream, and "
    "enable access to the model in the Bedrock console (Model access) of this region."
)


def _key_advice(provider: str | None, error_type: str | None = None) -> str | None:
    """The advice for a rejected key that names the provider's own variable, or None."""
    entry = PROVIDERS.get(provider or "")  # its key variable, or its cloud's credentials
    if entry is None:
        return None
    if entry.cloud == "aws":  # no key variable: the AWS credential chain, or a Bedrock key
        refused = (error_type or "").lower() == "accessdeniedexception"
        return _AWS_PERMISSION if refused else _AWS_CREDENTIALS
    if entry.server_label is not None:
        # The user's own server: the right key is whatever it was started with.
        return (
            f"Check {entry.key_vars[0]} (or FLUID_LLM_API_KEY) in the shell running fluid: it "
            f"must match the --api-key the {entry.server_label} server was started with."
        )
    if entry.cloud == "google":  # no key variable: Google credentials and IAM
        return _GOOGLE_CREDENTIALS
    if not entry.key_vars:
        return None
    variable = entry.key_vars[0]
    return (
        f"Check {variable} (or FLUID_LLM_API_KEY, which overrides it) in the shell running "
        f"fluid, or re-run `fluid ai setup --provider {provider}`."
    )


def _not_kept_advice(provider: str | None, details: Mapping[str, object]) -> str | None:
    """For a key `fluid ai setup` could not keep (no keyring, plaintext not allowed): the
    two ways out, neither of which is running the same command again."""
    variable, opt_in = details.get("variable"), details.get("opt_in")
    if not (isinstance(variable, str) and isinstance(opt_in, str) and provider):
        return None
    if not (_VARIABLE.fullmatch(variable) and _VARIABLE.fullmatch(opt_in)):
        return None
    return (
        f"Export {variable} in your shell profile and run `fluid ai setup --provider "
        f"{provider} --no-key`, or keep the key in a plaintext file: `{opt_in}=1 fluid ai "
        f"setup --provider {provider}`."
    )


#: Vertex AI takes a Google access token (ADC or api_key=), and the account needs IAM.
_GOOGLE_CREDENTIALS: Final = (
    "Check the Google credentials of the shell running fluid: run `gcloud auth "
    "application-default login` (or set GOOGLE_APPLICATION_CREDENTIALS to a service-account "
    "key file, or pass a fresh access token); the account needs the role "
    "roles/aiplatform.user on GOOGLE_CLOUD_PROJECT, where the Vertex AI API must be enabled "
    "(`gcloud services enable aiplatform.googleapis.com`)."
)


def _clean_retry_after(value: float | None) -> float | None:
    if value is None:
        return None
    try:
        seconds = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    if not math.isfinite(seconds) or seconds < 0:
        return None
    return min(seconds, MAX_RETRY_AFTER)


def _format_seconds(seconds: float) -> str:
    if seconds >= 1 and seconds == int(seconds):
        return f"{int(seconds)} s"
    return f"{seconds:.3g} s"


def _duration(seconds: float) -> str:
    """A wait as an operator reads it: ``6.5 s``, ``62 s``, ``5 min``, ``24 h``."""
    if not seconds < _LONGEST_SHOWN:  # NaN too
        return "more than a year"
    if seconds < 120:
        return _format_seconds(seconds)
    minutes = round(seconds / 60)
    if minutes < 120:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h" if not minutes else f"{hours} h {minutes} min"


def until_text(now: float, wait: float) -> str:
    """``"14:03:12 UTC (62 s)"``: when a wait of ``wait`` seconds from ``now`` (Unix time) ends.

    The time is rounded up to the second (a call made at the time shown is not
    early); another day is written with its date. A message and its hint that
    name the same wait both call this with the same two numbers, so they agree.
    Never raises: a wait past a year, or a clock out of range, shows the duration alone.
    """
    try:
        start = datetime.fromtimestamp(now, UTC)
        if not 0 <= wait < _LONGEST_SHOWN:
            raise OverflowError(wait)
        end = datetime.fromtimestamp(math.ceil(now + wait), UTC)
    except (OverflowError, OSError, ValueError):
        return f"in {_duration(wait)}"
    shown = f"{end:%H:%M:%S}" if end.date() == start.date() else f"{end:%Y-%m-%d %H:%M:%S}"
    return f"{shown} UTC ({_duration(wait)})"


def _finite(value: object) -> float | None:
    """``value`` as a finite float, or None (a bool, a string, a huge int, NaN)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _short(value: object, secrets: tuple[str, ...]) -> str | None:
    if value is None:
        return None
    return truncate(one_line(redact(str(value), secrets)), _MAX_HEADER_VALUE)


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _keep_headers(
    headers: Mapping[str, str] | Iterable[tuple[str, str]] | None, secrets: tuple[str, ...]
) -> dict[str, str]:
    if not headers:
        return {}
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    kept: dict[str, str] = {}
    for name, value in pairs:
        key = str(name).lower()
        if key.startswith(_KEPT_HEADER_PREFIXES) and len(kept) < 50:
            kept[key] = _short(value, secrets) or ""
    return kept


def _restore(cls: type[AgentExecutionError], state: dict[str, Any]) -> AgentExecutionError:
    error = cls.__new__(cls)
    error.__dict__.update(state)
    error.args = (state.get("message", ""),)
    return error


class FluidGenerationError(FluidError):
    """A generation run (a forge stage, an agent call) failed."""


class AgentExecutionError(FluidGenerationError):
    """A failure of the agent layer, with a stable reason ``code``.

    ``retryable`` says whether sending the same request again can succeed;
    ``retry_after`` is the wait the server asked for, in seconds (capped at
    300), or None; ``details`` is a JSON-safe dict for logs and receipts.
    """

    default_code: ClassVar[str] = "agent.execution_failed"
    default_retryable: ClassVar[bool] = False

    code: str
    message: str
    retryable: bool
    retry_after: float | None
    details: dict[str, JsonValue]

    def __init__(
        self,
        message: str = "",
        *,
        code: str | None = None,
        retryable: bool | None = None,
        retry_after: float | None = None,
        details: Mapping[str, object] | None = None,
        secrets: Iterable[str] = (),
    ) -> None:
        secrets = tuple(secrets)
        self.message = truncate(one_line(redact(str(message), secrets)), _MAX_MESSAGE)
        self.code = code or self.default_code
        self.retryable = self.default_retryable if retryable is None else bool(retryable)
        self.retry_after = _clean_retry_after(retry_after)
        safe = json_safe(dict(details or {}), secrets)
        self.details = safe if isinstance(safe, dict) else {}
        super().__init__(self.message)

    # -- presentation -------------------------------------------------------

    @property
    def counts_toward_breaker(self) -> bool:
        """Whether this failure counts toward the circuit breaker (transient provider trouble)."""
        return self.code in BREAKER_CODES

    @property
    def action(self) -> str:
        """What an operator should do about this error, in one line: flags, variables, commands.

        Where waiting helps and the wait is known, it says how long (``"Wait 2 s and
        run again; ..."``), never the table's general "a minute". A prompt a batch
        skipped after another failed (``details["skipped"]``) names that prompt.
        """
        skipped = self._skipped_advice()
        if skipped is not None:
            return skipped
        row = REASON_CODES.get(self.code) or REASON_CODES[self.default_code]
        wait = self._known_wait()
        if row.waited is not None and wait is not None:
            return row.waited.format(wait=_duration(wait))
        return row.action

    def _skipped_advice(self) -> str | None:
        """For a prompt a fail-fast batch never sent: which one failed, and how to run the rest."""
        first = self.details.get("first_failure")
        if self.code != "llm.cancelled" or self.details.get("skipped") is not True:
            return None
        if isinstance(first, bool) or not isinstance(first, int):
            return None
        return (
            f"Nothing to fix in this prompt: prompt {first} failed first; fix what its error "
            "says and run again, or run without --fail-fast so every prompt runs whatever "
            "the others do."
        )

    def _known_wait(self) -> float | None:
        """The wait to advise: ``retry_after``, or the longer one asked before the cap."""
        if not self.retry_after:
            return None
        requested = _finite(self.details.get("retry_after_requested"))
        return max(self.retry_after, requested or 0.0)

    @property
    def own_wait(self) -> bool:
        """Whether fluid set this wait itself, not a server's answer.

        True for a refusal by the circuit breaker, by the client's own rate-limit
        budget, or by a shared cooldown another call's answer started (see
        ``_OWN_WAITS``): no request was sent, so the wait is no news about the
        provider, and it is never shared as a new cooldown.
        """
        return any(self.details.get(name) not in (None, False) for name in _OWN_WAITS)

    def hint(self, *, now: float | None = None) -> str:
        """The operator's next step, one line: :attr:`action`, or a wait until a clock time.

        When the wait is known (``retry_after``, or the longer wait the server asked
        for before the cap) and waiting helps for this code, the hint says until when,
        in UTC: ``"Wait until 14:03:12 UTC (62 s) and run again; ..."``. ``now`` is
        the Unix time to count from (default: the current time); a wait that carries
        its own end (``details["until"]``, the circuit breaker's) is counted from the
        moment it was set, so the hint names the time its message names.
        """
        row = REASON_CODES.get(self.code)
        wait = self._known_wait()
        if row is None or row.waited is None or wait is None:
            return self.action
        until = _finite(self.details.get("until"))
        if until is not None and self.own_wait:
            start = until - wait
        else:
            start = time.time() if now is None else now
        return row.waited.format(wait=f"until {until_text(start, wait)}")

    @property
    def summary(self) -> str:
        """What happened, in one line: the message and the wait the server asked for.

        A wait fluid set itself (the breaker's, the client's own rate-limit budget, a
        shared cooldown) is stated by the message, never as the server's.
        """
        parts = [
            self.message or REASON_CODES.get(self.code, REASON_CODES[self.default_code]).meaning
        ]
        if self.retry_after is not None and not self.own_wait:
            requested = _finite(self.details.get("retry_after_requested"))
            if requested is not None and requested > self.retry_after:
                asked = (
                    _format_seconds(requested)
                    if requested < _LONGEST_SHOWN
                    else _duration(requested)
                )
                parts.append(
                    f"(server asked to wait {asked}; capped at {_format_seconds(self.retry_after)})"
                )
            else:
                parts.append(f"(server asked to wait {_format_seconds(self.retry_after)})")
        return " ".join(parts)

    def __str__(self) -> str:
        return f"{self.summary} [{self.code}] {self.action}"

    def _fields(self) -> dict[str, JsonValue]:
        """Class-specific public fields, in display order."""
        return {}

    def __repr__(self) -> str:
        shown: dict[str, object] = {"code": self.code, "message": self.message}
        shown.update({k: v for k, v in self._fields().items() if v is not None})
        shown["retryable"] = self.retryable
        if self.retry_after is not None:
            shown["retry_after"] = self.retry_after
        inner = ", ".join(f"{key}={value!r}" for key, value in shown.items())
        return f"{type(self).__name__}({inner})"

    def to_dict(self) -> dict[str, JsonValue]:
        """A JSON-safe description: class, code, message, flags, fields, details."""
        out: dict[str, JsonValue] = {
            "error": type(self).__name__,
            "code": self.code,
            "message": self.message,
            "retryable": self.retryable,
            "retry_after": self.retry_after,
        }
        out.update(self._fields())
        out["details"] = dict(self.details)
        return out

    # -- value semantics ----------------------------------------------------

    def __reduce__(self) -> tuple[Any, ...]:
        return (_restore, (type(self), dict(self.__dict__)))

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        assert isinstance(other, AgentExecutionError)
        return self.__dict__ == other.__dict__

    def __hash__(self) -> int:
        return hash((type(self), self.code, self.message))

    def with_details(self, *, note: str | None = None, **extra: object) -> Self:
        """A copy of this error with ``extra`` merged into ``details``.

        ``note``, when given, is appended to the message (one line, redacted).
        """
        state = dict(self.__dict__)
        safe = json_safe({**self.details, **extra})
        state["details"] = safe if isinstance(safe, dict) else {}
        if note:
            # The note says why a retry gave up: keep it whole, shorten the rest.
            clean = truncate(one_line(redact(note)), _MAX_MESSAGE // 2)
            head = truncate(self.message, _MAX_MESSAGE - len(clean) - 2)
            state["message"] = f"{head}; {clean}"
        clone = _restore(type(self), state)
        assert isinstance(clone, type(self))
        return clone


class ProviderError(AgentExecutionError):
    """The provider failed the call, or could not be reached.

    ``status_code`` is None for failures with no answer (timeouts, refused or
    reset connections). ``provider_error_type`` and ``provider_error_code``
    are what the provider's own body said (``rate_limit_error``,
    ``insufficient_quota``, ``RESOURCE_EXHAUSTED`` ...), when it said anything.
    ``headers`` keeps only rate-limit and request-id headers, lower-cased.
    """

    default_code: ClassVar[str] = "llm.provider_error"

    provider: str | None
    status_code: int | None
    model: str | None
    provider_error_type: str | None
    provider_error_code: str | None
    request_id: str | None
    headers: dict[str, str]

    def __init__(
        self,
        message: str = "",
        *,
        provider: str | None = None,
        status_code: int | None = None,
        model: str | None = None,
        provider_error_type: str | None = None,
        provider_error_code: str | None = None,
        request_id: str | None = None,
        headers: Mapping[str, str] | Iterable[tuple[str, str]] | None = None,
        code: str | None = None,
        retryable: bool | None = None,
        retry_after: float | None = None,
        details: Mapping[str, object] | None = None,
        secrets: Iterable[str] = (),
    ) -> None:
        secrets = tuple(secrets)
        super().__init__(
            message,
            code=code,
            retryable=retryable,
            retry_after=retry_after,
            details=details,
            secrets=secrets,
        )
        self.provider = _short(provider, secrets)
        self.status_code = _int_or_none(status_code)
        self.model = _short(model, secrets)
        self.provider_error_type = _short(provider_error_type, secrets)
        self.provider_error_code = _short(provider_error_code, secrets)
        self.request_id = _short(request_id, secrets)
        self.headers = _keep_headers(headers, secrets)

    @property
    def action(self) -> str:
        """The table's advice; for a setting that cannot be used, that variable and an example;
        for a provider whose optional extra is not installed, the line that installs it."""
        install = self.details.get("install")
        if self.code in _SETTING_CODES and isinstance(install, str) and install:
            return f"Install the extra it needs, {install}, and run again."
        variable = self.details.get("variable")
        example = self.details.get("example")
        if (
            self.code in _SETTING_CODES
            and isinstance(variable, str)
            and _VARIABLE.fullmatch(variable)
            and isinstance(example, str)
            and example
        ):
            return (
                f"Set {variable} as the message says, e.g. {variable}={shlex.quote(example)}, "
                "and run again; `fluid doctor` shows what is set."
            )
        return super().action

    def _fields(self) -> dict[str, JsonValue]:
        return {
            "provider": self.provider,
            "status_code": self.status_code,
            "model": self.model,
            "provider_error_type": self.provider_error_type,
            "provider_error_code": self.provider_error_code,
            "request_id": self.request_id,
        }

    def to_dict(self) -> dict[str, JsonValue]:
        out = super().to_dict()
        out["headers"] = dict(self.headers)
        return out


class RateLimitError(ProviderError):
    """HTTP 429, or a 5xx that carried Retry-After: wait, then retry.

    A 429 that means the quota or credits are gone has ``retryable=False``
    and code ``llm.quota_exhausted``: waiting seconds will not help.
    """

    default_code: ClassVar[str] = "llm.rate_limited"
    default_retryable: ClassVar[bool] = True


class ProviderTimeoutError(ProviderError):
    """No answer in time: an httpx timeout or HTTP 408. Retried with backoff."""

    default_code: ClassVar[str] = "llm.timeout"
    default_retryable: ClassVar[bool] = True


class ContextOverflowError(ProviderError):
    """The prompt cannot fit the model's context window. Never retried.

    ``prompt_tokens`` and ``context_window`` are filled when known (from the
    pre-flight count, or parsed from the provider's message).
    """

    default_code: ClassVar[str] = "llm.context_overflow"

    prompt_tokens: int | None
    context_window: int | None

    def __init__(
        self,
        message: str = "",
        *,
        prompt_tokens: int | None = None,
        context_window: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(message, **kwargs)
        self.prompt_tokens = _int_or_none(prompt_tokens)
        self.context_window = _int_or_none(context_window)

    @property
    def action(self) -> str:
        """The table's advice, made specific when the pre-flight knows more.

        A model fluid_build does not know gets the variable that sets its real
        window; otherwise the nearest larger-window model it suggested, as flags.
        Compacting earlier is advised only for an overflow inside an agent loop
        (``details["agent_loop"]``): a plain call or a batch has nothing to compact.
        """
        advice = self._window_advice()
        if self.code == "llm.context_overflow" and self.details.get("agent_loop") is True:
            advice += _COMPACT_EARLIER
        return advice

    def _window_advice(self) -> str:
        if self.code != "llm.context_overflow" or self.details.get("source") != "preflight":
            return super().action
        if self.details.get("window_source") == "default":
            return (
                "If the model's real window is larger than the assumed "
                f"{self.context_window or 0:,} tokens, set it with "
                f"{_WINDOW_SETTING} and run again; "
                "otherwise shorten the inputs or use a larger-window model (--model)."
            )
        larger = self.details.get("larger_models")
        if isinstance(larger, list) and larger and isinstance(larger[0], str):
            name = larger[0].split(" (", 1)[0]
            provider, _, model = name.partition(":")
            if provider and model:
                return (
                    f"Run again with a larger-window model (--provider {provider} --model "
                    f"{model}), or shorten the inputs."
                )
        return super().action

    def _fields(self) -> dict[str, JsonValue]:
        out = super()._fields()
        out["prompt_tokens"] = self.prompt_tokens
        out["context_window"] = self.context_window
        return out


class ProviderAuthError(ProviderError):
    """The key is missing, invalid, expired or not allowed. Never retried.

    The advice names the provider's own key variable; for a local vLLM or llama.cpp
    server, ``OPENAI_API_KEY`` and the server's ``--api-key``.
    """

    default_code: ClassVar[str] = "llm.auth"

    @property
    def action(self) -> str:
        if self.code != "llm.auth":
            return super().action
        kept = _not_kept_advice(self.provider, self.details)
        if kept is not None:
            return kept
        return _key_advice(self.provider, self.provider_error_type) or super().action


class ProviderServerError(ProviderError):
    """A 5xx without Retry-After, or Anthropic's 529 overloaded. Retried with backoff."""

    default_code: ClassVar[str] = "llm.server_error"
    default_retryable: ClassVar[bool] = True


class SchemaValidationError(AgentExecutionError):
    """The model's output failed the expected schema.

    ``validation_errors`` is a list of ``{"loc", "msg", "type"}`` dicts (field
    paths and what was expected, never the offending input); ``raw_output``
    is the model's text, redacted and capped at 64,000 characters: the
    ``secrets`` given (the request's own key) go by value, JSON fields named
    like a credential (``"password": "..."``) by name, URLs lose their
    userinfo and key-like query values, and known key shapes go by pattern.
    """

    default_code: ClassVar[str] = "llm.schema_violation"

    schema_name: str | None
    validation_errors: list[dict[str, JsonValue]]
    raw_output: str | None

    def __init__(
        self,
        message: str = "",
        *,
        schema_name: str | None = None,
        validation_errors: Sequence[Mapping[str, object]] = (),
        raw_output: str | None = None,
        secrets: Iterable[str] = (),
        **kwargs: Any,
    ) -> None:
        secrets = tuple(secrets)
        super().__init__(message, secrets=secrets, **kwargs)
        self.schema_name = _short(schema_name, secrets)
        self.validation_errors = [
            entry
            for entry in (json_safe(dict(e), secrets) for e in validation_errors[:100])
            if isinstance(entry, dict)
        ]
        self.raw_output = None
        if raw_output is not None:
            text = redact(str(raw_output), secrets)
            if len(text) > _MAX_RAW_OUTPUT:
                self.details["raw_output_chars"] = len(text)
                text = truncate(text, _MAX_RAW_OUTPUT)
            self.raw_output = text

    @classmethod
    def from_pydantic(
        cls,
        exc: Any,
        *,
        schema_name: str | None = None,
        raw_output: str | None = None,
        secrets: Iterable[str] = (),
    ) -> SchemaValidationError:
        """Build from a ``pydantic.ValidationError``, keeping locations and messages only.

        ``secrets`` (the request's API key) are removed from ``raw_output`` and
        the message by value, as at construction.
        """
        try:
            raw_errors = list(exc.errors(include_url=False, include_input=False))
        except Exception:  # noqa: BLE001 - not a pydantic error after all
            raw_errors = []
        errors = [
            {
                "loc": ".".join(str(part) for part in e.get("loc", ())) or "<root>",
                "msg": str(e.get("msg", "")),
                "type": str(e.get("type", "")),
            }
            for e in raw_errors
            if isinstance(e, Mapping)
        ]
        name = schema_name or getattr(exc, "title", None)
        summary = "; ".join(f"{e['loc']}: {e['msg']}" for e in errors[:3])
        more = f" (+{len(errors) - 3} more)" if len(errors) > 3 else ""
        return cls(
            f"output failed schema {name or '<unnamed>'} with {len(errors)} error(s): "
            f"{summary}{more}",
            schema_name=name,
            validation_errors=errors,
            raw_output=raw_output,
            secrets=secrets,
        )

    def _fields(self) -> dict[str, JsonValue]:
        return {
            "schema_name": self.schema_name,
            "validation_errors": [dict(e) for e in self.validation_errors],
            "raw_output": self.raw_output,
        }


class ToolValidationError(AgentExecutionError):
    """A tool call was refused before its body ran.

    Codes: ``tool.invalid_input`` (arguments vs. schema), ``tool.unknown_tool``,
    ``tool.workspace_violation``. ``tool_args`` and ``reason`` are redacted.
    """

    default_code: ClassVar[str] = "tool.invalid_input"

    tool_name: str | None
    tool_args: JsonValue
    reason: str

    def __init__(
        self,
        message: str = "",
        *,
        tool_name: str | None = None,
        tool_args: object = None,
        reason: str = "",
        secrets: Iterable[str] = (),
        **kwargs: Any,
    ) -> None:
        secrets = tuple(secrets)
        super().__init__(message or reason, secrets=secrets, **kwargs)
        self.tool_name = _short(tool_name, secrets)
        self.tool_args = json_safe(tool_args, secrets)
        self.reason = truncate(one_line(redact(str(reason), secrets)), _MAX_MESSAGE)

    def _fields(self) -> dict[str, JsonValue]:
        return {"tool_name": self.tool_name, "tool_args": self.tool_args, "reason": self.reason}
