"""LLMClient: one reliable structured call to any supported provider.

Each call: pre-flight (refuse a prompt that cannot fit, before any I/O) ->
the retry envelope -> the provider adapter over httpx -> classification of
any failure -> validation of the output against ``response_model``.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final, TextIO, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from fluid_build._redact import one_line, redact, redact_url, truncate
from fluid_build.copilot.agents.error_classification import (
    classify_provider_error,
    classify_response,
)
from fluid_build.copilot.agents.errors import (
    AgentExecutionError,
    ContextOverflowError,
    ProviderAuthError,
    ProviderError,
    ProviderServerError,
    ProviderTimeoutError,
    RateLimitError,
    SchemaValidationError,
)
from fluid_build.copilot.call.envelope import RetryEnvelope
from fluid_build.copilot.call.window import alearn_window, learn_window
from fluid_build.copilot.call.wire import (
    Deadline,
    Limits,
    StreamReader,
    aread_body,
    deadline_from_env,
    decode_json,
    read_body,
)
from fluid_build.copilot.health.cooldown import CooldownKey
from fluid_build.copilot.llm.anthropic import AnthropicAdapter
from fluid_build.copilot.llm.azure import AzureOpenAIAdapter
from fluid_build.copilot.llm.base import (
    Adapter,
    Parsed,
    ProviderConfig,
    Request,
    StreamState,
    aiter_stream,
    first_wrong_field,
    iter_stream,
)
from fluid_build.copilot.llm.gemini import GeminiAdapter
from fluid_build.copilot.llm.local_server import probe_urls
from fluid_build.copilot.llm.ollama import OllamaAdapter
from fluid_build.copilot.llm.openai import OpenAIAdapter
from fluid_build.copilot.llm.openai_compatible import OpenAICompatibleAdapter
from fluid_build.copilot.llm.settings import PROVIDERS, resolve_provider_config
from fluid_build.copilot.llm.types import CallSpec, Completion, StreamEvent, ToolSpec

if TYPE_CHECKING:
    from fluid_build.copilot.call.capabilities import ModelCapabilities
    from fluid_build.copilot.schema.strict import StrictSchema

__all__ = ["LLMClient"]

LOG = logging.getLogger("fluid_build.client")

# Failures that say nothing about the provider's state: never kept as the
# sticky last error, so they cannot hide the real one.
_CALLER_SIDE = frozenset(
    {
        "llm.not_configured",
        "llm.model_not_found",
        "llm.bad_endpoint",
        "llm.cancelled",
        "llm.schema_violation",
        "llm.parse_error",
        "llm.context_overflow",
        "llm.circuit_open",
    }
)
# Non-retryable failures after which another provider may still answer.
_MOVE_ON = frozenset({"llm.circuit_open", "llm.quota_exhausted"})


def _actionability(error: AgentExecutionError) -> int:
    """Lower is more actionable: overflow, then rate limits, then server errors."""
    order = (ContextOverflowError, RateLimitError, ProviderServerError, ProviderTimeoutError)
    for rank, cls in enumerate(order):
        if isinstance(error, cls):
            return rank
    return len(order)


_FALLBACKS_ENV = "FLUID_LLM_FALLBACKS"
_FALLBACKS_EXAMPLE = "anthropic:claude-sonnet-4-6,gemini:gemini-2.5-flash"


def _fallback_specs(
    fallbacks: Sequence[tuple[str, str] | str] | None, env: Mapping[str, str] | None
) -> list[str]:
    """The ``provider:model`` fallbacks, each checked; a bad one names where it came from."""
    if fallbacks is None:
        raw = (os.environ if env is None else env).get(_FALLBACKS_ENV, "")
        items: list[str] = [part.strip() for part in raw.split(",") if part.strip()]
        source = _FALLBACKS_ENV
    else:
        items = [f"{f[0]}:{f[1]}" if isinstance(f, tuple) else str(f) for f in fallbacks]
        source = "fallbacks="
    for item in items:
        name = item.split(":", 1)[0].strip().lower()
        if ":" not in item or not name:
            problem = "is not provider:model"
        elif name not in PROVIDERS:
            problem = f"names an unknown provider (one of {', '.join(sorted(PROVIDERS))})"
        else:
            continue
        raise ProviderError(
            f"fallback {truncate(redact(item), 60)!r} in {source} {problem}; e.g. "
            f"{_FALLBACKS_ENV}={_FALLBACKS_EXAMPLE}",
            code="llm.not_configured",
            retryable=False,
            details={"variable": _FALLBACKS_ENV, "example": _FALLBACKS_EXAMPLE}
            if fallbacks is None
            else None,
        )
    return items


_Pool = TypeVar("_Pool", httpx.Client, httpx.AsyncClient)

#: What httpx reads from the environment when it makes a connection pool.
_TRANSPORT_VARS: Final = (
    "HTTPS_PROXY",
    "https_proxy",
    "HTTP_PROXY",
    "http_proxy",
    "ALL_PROXY",
    "all_proxy",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
)


def _pool(kind: Callable[..., _Pool], timeout: float, provider: str) -> _Pool:
    """A connection pool, or a typed error naming the proxy or certificate variable at fault.

    httpx reads ``HTTPS_PROXY``, ``ALL_PROXY``, ``SSL_CERT_FILE``... when the
    pool is made; an unusable value (an unknown proxy scheme, SOCKS without
    ``socksio``, a missing or empty certificate file) would otherwise escape as
    a bare ValueError, ImportError or OSError at the first call.
    """
    try:
        return kind(timeout=httpx.Timeout(timeout))
    except Exception as exc:  # noqa: BLE001 - whatever httpx or ssl raise, typed here
        found = [name for name in _TRANSPORT_VARS if os.environ.get(name)]
        shown = ", ".join(f"{name}={redact_url(os.environ[name])[:120]!r}" for name in found)
        reason = truncate(one_line(redact(str(exc))), 200)
        raise ProviderError(
            f"the HTTP connection pool cannot be made from this environment "
            f"({type(exc).__name__}: {reason}); "
            + (f"check {shown}" if shown else "check the proxy and certificate variables")
            + " (e.g. HTTPS_PROXY=http://proxy.internal:3128; SOCKS needs httpx[socks])",
            provider=provider,
            code="llm.not_configured",
            retryable=False,
            details={"variable": found[0] if found else None, "variables": found},
        ) from None


_ADAPTERS: dict[str, type[Adapter]] = {
    "openai": OpenAIAdapter,
    "azure": AzureOpenAIAdapter,
    "anthropic": AnthropicAdapter,
    "gemini": GeminiAdapter,
    "ollama": OllamaAdapter,
    "openai_compatible": OpenAICompatibleAdapter,
}

Messages = str | Sequence[Mapping[str, Any]]
Tools = Sequence[ToolSpec | Mapping[str, Any]] | None


def _messages(messages: Messages) -> list[dict[str, Any]]:
    if isinstance(messages, str):
        return [{"role": "user", "content": messages}]
    return [dict(m) for m in messages]


def _tool(tool: ToolSpec | Mapping[str, Any]) -> ToolSpec:
    if isinstance(tool, ToolSpec):
        return tool
    spec = tool.get("function") if tool.get("type") == "function" else tool
    if not isinstance(spec, Mapping) or not spec.get("name"):
        raise ValueError(f"a tool needs a name and a JSON-schema 'parameters': {tool!r:.200}")
    return ToolSpec(
        str(spec["name"]),
        str(spec.get("description") or ""),
        dict(spec.get("parameters") or {"type": "object", "properties": {}}),
    )


class _Prepared:
    """One call, ready to send: the spec, and how to read the answer back."""

    __slots__ = ("response_model", "spec", "strict", "validate")

    def __init__(
        self,
        spec: CallSpec,
        response_model: type[BaseModel] | None,
        strict: StrictSchema | None,
        validate: bool = True,
    ) -> None:
        self.spec = spec
        self.response_model = response_model
        self.strict = strict
        self.validate = validate


class LLMClient:
    """A provider, a model and a key, with pooled connections and the retry envelope.

    ``LLMClient(provider=..., model=...)`` resolves whatever is not given from
    the environment (see docs/llm-providers.md); ``LLMClient.from_env()``
    also takes the retry policy and cooldown store from it. Pass
    ``http_client`` / ``async_http_client`` to share or mock transports.
    """

    def __init__(
        self,
        provider: str | None = None,
        model: str | None = None,
        api_key: str | None = None,
        base_url: str | None = None,
        *,
        timeout: float | None = None,
        envelope: RetryEnvelope | None = None,
        http_client: httpx.Client | None = None,
        async_http_client: httpx.AsyncClient | None = None,
        capability_matrix: Mapping[str, Any] | None = None,
        strict_schema: bool | None = None,
        env: Mapping[str, str] | None = None,
        fallbacks: Sequence[tuple[str, str] | str] | None = None,
        fallback_on_auth: bool = False,
        deadline: float | None = None,
        limits: Limits | None = None,
    ) -> None:
        self.config: ProviderConfig = resolve_provider_config(
            provider, model, api_key, base_url, timeout=timeout, env=env
        )
        info = PROVIDERS[self.config.provider]
        self.adapter: Adapter = _ADAPTERS[info.adapter](self.config)
        self.envelope = envelope if envelope is not None else RetryEnvelope.from_env(env)
        source = os.environ if env is None else env
        # One bound on each whole call: pre-flight, attempts, waits, every read.
        self.deadline: float = (
            deadline
            if deadline is not None
            else self.envelope.policy.deadline or deadline_from_env(source)
        )
        self.limits = limits if limits is not None else Limits.from_env(source)
        from fluid_build.copilot.call.capabilities import capability_matrix_from_env

        # FLUID_CAPABILITY_MATRIX's overrides for this model; the argument's win.
        self.capability_matrix = {
            **capability_matrix_from_env(source, self.config.provider, self.config.model),
            **dict(capability_matrix or {}),
        }
        if strict_schema is None:
            from fluid_build.copilot.schema.strict import strict_schema_enabled

            strict_schema = strict_schema_enabled(env)
        self.strict_schema = bool(strict_schema) and info.adapter in {"openai", "azure"}
        self._http = http_client
        self._owns_http = http_client is None
        self._ahttp = async_http_client
        self._owns_ahttp = async_http_client is None
        # Who shares a cooldown and a breaker: never two endpoints, keys or models.
        self._key = CooldownKey.for_call(
            self.config.provider, self.config.api_key, self.config.model, self.adapter.endpoint
        )
        # The request's own key goes by value from every error it could reach.
        self._secrets: tuple[str, ...] = (self.config.api_key,) if self.config.api_key else ()
        self._env = env
        self._last_error: dict[str, Any] | None = None
        # A local server's own context size, asked once (see llm/local_server.py).
        self._probe_urls = probe_urls(self.config.provider, self.adapter.endpoint)
        self._window_asked = not self._probe_urls
        self._server_window: int | None = None
        self._window_lock = threading.Lock()
        self.fallback_on_auth = fallback_on_auth
        self.fallbacks: list[LLMClient] = []
        for spec in _fallback_specs(fallbacks, env):
            provider_name, _, model_name = spec.partition(":")
            self.fallbacks.append(
                LLMClient(
                    provider_name,
                    model_name or None,
                    envelope=self.envelope,
                    http_client=http_client,
                    async_http_client=async_http_client,
                    strict_schema=strict_schema,
                    env=env,
                    fallbacks=(),
                    deadline=self.deadline,
                    limits=self.limits,
                )
            )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **kwargs: Any) -> LLMClient:
        """A client, its retry policy and its cooldown store, all from the environment."""
        kwargs.setdefault("envelope", RetryEnvelope.from_env(env))
        return cls(env=env, **kwargs)

    @property
    def provider(self) -> str:
        return self.config.provider

    @property
    def model(self) -> str:
        return self.config.model

    def __repr__(self) -> str:
        return f"LLMClient(provider={self.provider!r}, model={self.model!r})"

    @property
    def capabilities(self) -> ModelCapabilities:
        from fluid_build.copilot.call.capabilities import capabilities_for

        return capabilities_for(self.provider, self.model, self.capability_matrix)

    def run_start_warnings(
        self,
        *,
        uses_tools: bool = False,
        wants_strict_schema: bool | None = None,
        banner: bool = True,
        stream: TextIO | None = None,
    ) -> list[str]:
        """The capability warnings for a run on this client; shown as a banner unless quiet.

        ``FLUID_QUIET=1`` / ``FLUID_NONINTERACTIVE=1`` hide the banner but the
        count is still logged (see docs/capability-warnings.md).
        """
        from fluid_build.copilot.call.capabilities import (
            capabilities_for,
            emit_run_start_banner,
            run_start_warnings,
        )
        from fluid_build.copilot.call.preflight import unknown_model_reported

        wants = self.strict_schema if wants_strict_schema is None else wants_strict_schema
        caps = self.capabilities
        if not caps.known and self._probe_urls:
            # A local server says its own window: ask now (once per client, as the
            # first call would), so the warning judges the window the run will use.
            window = self._learn_window(self._deadline(), None)
            if window is not None:
                matrix = {**self.capability_matrix, "context_window": window}
                caps = capabilities_for(self.provider, self.model, matrix)
        warnings = run_start_warnings(caps, uses_tools=uses_tools, wants_strict_schema=wants)
        if banner:
            emit_run_start_banner(warnings, env=self._env, stream=stream)
            if not caps.known:
                unknown_model_reported(caps.provider, caps.model)
        return warnings

    # -- lifecycle --------------------------------------------------------------

    def _client(self) -> httpx.Client:
        if self._http is None:
            self._http = _pool(httpx.Client, self.config.timeout, self.provider)
        return self._http

    def _aclient(self) -> httpx.AsyncClient:
        if self._ahttp is None:
            self._ahttp = _pool(httpx.AsyncClient, self.config.timeout, self.provider)
        return self._ahttp

    def close(self) -> None:
        """Close the connection pools this client (and its fallbacks) opened."""
        if self._owns_http and self._http is not None:
            self._http.close()
            self._http = None
        for fallback in self.fallbacks:
            fallback.close()

    async def aclose(self) -> None:
        if self._owns_ahttp and self._ahttp is not None:
            await self._ahttp.aclose()
            self._ahttp = None
        for fallback in self.fallbacks:
            await fallback.aclose()
        self.close()

    def __enter__(self) -> LLMClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> LLMClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- preparing a call ----------------------------------------------------------

    def _prepare(
        self,
        messages: Messages,
        *,
        system: str | None,
        response_model: type[BaseModel] | None,
        tools: Tools,
        max_output_tokens: int | None,
        capability_matrix: Mapping[str, Any] | None,
        validate: bool = True,
        server_window: int | None = None,
    ) -> _Prepared:
        from fluid_build.copilot.call.preflight import check_context

        neutral = _messages(messages)
        tool_specs = tuple(_tool(t) for t in tools or ())
        schema: dict[str, Any] | None = None
        strict: StrictSchema | None = None
        name = "response"
        if response_model is not None:
            schema = response_model.model_json_schema()
            name = response_model.__name__
            if self.strict_schema:
                from fluid_build.copilot.schema.strict import harden_schema

                strict = harden_schema(schema, name=name)
                schema = strict.schema
        # The response schema travels with the prompt, so it counts like a tool.
        counted = [t.as_dict() for t in tool_specs]
        if schema is not None:
            counted.append({"name": name, "description": "", "parameters": schema})
        matrix = {**self.capability_matrix, **(capability_matrix or {})}
        check_context(
            provider=self.provider,
            model=self.model,
            system=system,
            messages=neutral,
            tools=counted or None,
            capability_matrix=matrix or None,
            max_output_tokens=max_output_tokens,
            server_window=server_window,
        )
        spec = CallSpec(
            model=self.model,
            messages=neutral,
            system=system,
            tools=tool_specs,
            response_schema=schema,
            schema_name=name,
            strict=strict is not None,
            max_output_tokens=max_output_tokens,
        )
        return _Prepared(spec, response_model, strict, validate)

    def _wants_window(self, matrix: Mapping[str, Any] | None) -> bool:
        """Whether to ask the server now: once per client, and only if no window is given."""
        if self._window_asked:
            return False
        given = {**self.capability_matrix, **(matrix or {})}
        if "context_window" in given or given.get("preflight") is False:
            return False
        # A server whose circuit is not closed is not asked: a half-open trial is one request.
        breaker = self.envelope.breaker
        if breaker is None:
            return True
        try:
            return breaker.state(str(self._key)).state == "closed"
        except Exception:  # noqa: BLE001 - a store that cannot say: ask later, never fail
            return False

    def _learn_window(self, deadline: Deadline, matrix: Mapping[str, Any] | None) -> int | None:
        """The context size the local server reports (None: unknown); never raises."""
        if self._wants_window(matrix):
            with self._window_lock:
                if not self._window_asked:
                    self._server_window = learn_window(
                        self._client(),
                        self._probe_urls,
                        self.model,
                        api_key=self.config.api_key,
                        headers=self.config.headers,
                        deadline_left=deadline.left(),
                    )
                    self._window_asked = True
        return self._server_window

    async def _alearn_window(
        self, deadline: Deadline, matrix: Mapping[str, Any] | None
    ) -> int | None:
        # Two first calls at once may both ask: the same answer, twice.
        if self._wants_window(matrix):
            self._server_window = await alearn_window(
                self._aclient(),
                self._probe_urls,
                self.model,
                api_key=self.config.api_key,
                headers=self.config.headers,
                deadline_left=deadline.left(),
            )
            self._window_asked = True
        return self._server_window

    def _http_request(
        self, client: httpx.Client | httpx.AsyncClient, request: Request, deadline: Deadline
    ) -> httpx.Request:
        # Only encodings the size limit can count as they inflate.
        headers = {"accept-encoding": "gzip, deflate", **request.headers}
        return client.build_request(
            request.method,
            request.url,
            headers=headers,
            json=request.json,
            timeout=deadline.timeout(self.config.timeout),
        )

    def _deadline(self, started: float | None = None) -> Deadline:
        return Deadline(
            self.deadline,
            clock=self.envelope.clock,
            provider=self.provider,
            model=self.model,
            started=started,
        )

    def _timed_out(
        self, exc: httpx.TimeoutException, deadline: Deadline, where: str
    ) -> AgentExecutionError | None:
        """The deadline's error when it, not the attempt's own timeout, cut ``exc`` short."""
        if deadline.left() > 0.05:
            return None
        if isinstance(exc, httpx.ConnectTimeout | httpx.PoolTimeout):
            where = "a connection"
        elif isinstance(exc, httpx.WriteTimeout):
            where = "the request to be sent"
        return deadline.passed(where)

    def _parse(self, data: Any, prepared: _Prepared, response: httpx.Response) -> Parsed:
        if not isinstance(data, dict):
            raise ProviderError(
                f"{self.provider} answered HTTP {response.status_code} with JSON that is not an "
                "object",
                provider=self.provider,
                model=self.model,
                status_code=response.status_code,
                code="llm.malformed_response",
                retryable=True,
            )
        if "error" in data and not data.get("choices") and not data.get("candidates"):
            raise classify_response(response, provider=self.provider, model=self.model)
        try:
            return self.adapter.parse(data, prepared.spec)
        except AgentExecutionError:
            raise
        except (AttributeError, KeyError, TypeError, ValueError, IndexError) as exc:
            raise self._misshapen(data, self.adapter.shape, "answer", response.status_code) from exc

    def _misshapen(
        self, data: Any, shape: Any, what: str, status: int | None
    ) -> AgentExecutionError:
        """``llm.malformed_response`` naming the first field that does not fit (if one is found)."""
        wrong = first_wrong_field(data, shape)
        if wrong is None:
            found = f"an {what} in a shape fluid_build cannot read"
            details: dict[str, Any] = {}
        else:
            field, expected, got = wrong
            found = f"an {what} whose {field} should be {expected}, not {got}"
            details = {"field": field, "expected": expected, "got": got}
        return ProviderError(
            f"{self.provider} sent {found}",
            provider=self.provider,
            model=self.model,
            status_code=status,
            code="llm.malformed_response",
            retryable=True,
            details=details,
        )

    def _completion(
        self, parsed: Parsed, prepared: _Prepared, attempts: int, request_id: str | None
    ) -> Completion:
        value: Any = None
        # A turn that calls tools has no final answer to validate yet.
        if prepared.response_model is not None and prepared.validate and not parsed.tool_calls:
            value = self._validate(parsed.text, prepared)
        return Completion(
            text=parsed.text,
            parsed=value,
            tool_calls=parsed.tool_calls,
            usage=parsed.usage,
            provider=self.provider,
            model=parsed.model or self.model,
            finish_reason=parsed.finish_reason,
            attempts=attempts,
            request_id=request_id,
        )

    def validate(self, text: str, response_model: type[BaseModel]) -> Any:
        """Validate a model's text against ``response_model`` as :meth:`complete` does.

        Raises :class:`SchemaValidationError` (``llm.parse_error`` for text
        that is not JSON). Strict-schema fields are decoded first.
        """
        strict: StrictSchema | None = None
        if self.strict_schema:
            from fluid_build.copilot.schema.strict import harden_schema

            strict = harden_schema(response_model.model_json_schema(), name=response_model.__name__)
        return self._validate(text, _Prepared(CallSpec(self.model, ()), response_model, strict))

    def _validate(self, text: str, prepared: _Prepared) -> Any:
        model = prepared.response_model
        assert model is not None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SchemaValidationError(
                f"the model's output for {model.__name__} is not valid JSON ({exc.msg} at "
                f"character {exc.pos})",
                schema_name=model.__name__,
                validation_errors=[
                    {"loc": "<root>", "msg": "Invalid JSON", "type": "json_invalid"}
                ],
                raw_output=text,
                code="llm.parse_error",
                secrets=self._secrets,
            ) from None
        if prepared.strict is not None:
            data = prepared.strict.decode(data)
        try:
            return model.model_validate(data)
        except ValidationError as exc:
            raise SchemaValidationError.from_pydantic(
                exc, schema_name=model.__name__, raw_output=text, secrets=self._secrets
            ) from None

    @staticmethod
    def _request_id(response: httpx.Response) -> str | None:
        for name in ("x-request-id", "request-id", "apim-request-id"):
            value = response.headers.get(name)
            if value:
                return str(value)
        return None

    # -- one call ---------------------------------------------------------------------

    def complete(
        self,
        messages: Messages,
        *,
        system: str | None = None,
        response_model: type[BaseModel] | None = None,
        tools: Tools = None,
        max_output_tokens: int | None = None,
        capability_matrix: Mapping[str, Any] | None = None,
        validate: bool = True,
    ) -> Completion:
        """One call: a :class:`Completion`, or a typed error.

        With fallbacks, an exhausted entry hands the call to the next one
        (see docs/fallbacks-and-breakers.md).
        """
        kwargs: dict[str, Any] = {
            "system": system,
            "response_model": response_model,
            "tools": tools,
            "max_output_tokens": max_output_tokens,
            "capability_matrix": capability_matrix,
            "validate": validate,
        }
        deadline = self._deadline()
        history: list[tuple[LLMClient, AgentExecutionError]] = []
        for entry in self._entries():
            try:
                done = entry._complete_one(
                    messages, deadline=deadline.of(entry.provider, entry.model), **kwargs
                )
            except AgentExecutionError as error:
                self._next_or_raise(entry, error, history)
                continue
            return self._answered(entry, done, history)
        raise self._final_error(history)

    async def acomplete(
        self,
        messages: Messages,
        *,
        system: str | None = None,
        response_model: type[BaseModel] | None = None,
        tools: Tools = None,
        max_output_tokens: int | None = None,
        capability_matrix: Mapping[str, Any] | None = None,
        validate: bool = True,
    ) -> Completion:
        """The async twin of :meth:`complete`."""
        kwargs: dict[str, Any] = {
            "system": system,
            "response_model": response_model,
            "tools": tools,
            "max_output_tokens": max_output_tokens,
            "capability_matrix": capability_matrix,
            "validate": validate,
        }
        deadline = self._deadline()
        history: list[tuple[LLMClient, AgentExecutionError]] = []
        for entry in self._entries():
            try:
                done = await entry._acomplete_one(
                    messages, deadline=deadline.of(entry.provider, entry.model), **kwargs
                )
            except AgentExecutionError as error:
                self._next_or_raise(entry, error, history)
                continue
            return self._answered(entry, done, history)
        raise self._final_error(history)

    def _complete_one(
        self,
        messages: Messages,
        *,
        deadline: Deadline,
        system: str | None = None,
        response_model: type[BaseModel] | None = None,
        tools: Tools = None,
        max_output_tokens: int | None = None,
        capability_matrix: Mapping[str, Any] | None = None,
        validate: bool = True,
    ) -> Completion:
        prepared = self._prepare(
            messages,
            system=system,
            response_model=response_model,
            tools=tools,
            max_output_tokens=max_output_tokens,
            capability_matrix=capability_matrix,
            validate=validate,
            server_window=self._learn_window(deadline, capability_matrix),
        )
        deadline.check("the pre-flight")
        client = self._client()
        attempts = 0

        def send() -> tuple[Parsed, httpx.Response]:
            nonlocal attempts
            deadline.check("the next attempt")
            attempts += 1
            spec = self.adapter.request(prepared.spec, stream=False)
            request = self._http_request(client, spec, deadline)
            where = "the response headers"
            try:
                response = client.send(request, stream=True)
                try:
                    where = "the body"
                    done = read_body(response, deadline, self.limits)
                finally:
                    response.close()
            except httpx.TimeoutException as exc:
                raise self._timed_out(exc, deadline, where) or exc from exc
            return self._decode(done, prepared), done

        parsed, response = self.envelope.call(
            send,
            key=self._key,
            provider=self.provider,
            model=self.model,
            started=deadline.started,
            deadline=deadline.seconds,
            narrow=deadline.narrow,
            secrets=self._secrets,
        )
        return self._completion(parsed, prepared, attempts, self._request_id(response))

    async def _acomplete_one(
        self,
        messages: Messages,
        *,
        deadline: Deadline,
        system: str | None = None,
        response_model: type[BaseModel] | None = None,
        tools: Tools = None,
        max_output_tokens: int | None = None,
        capability_matrix: Mapping[str, Any] | None = None,
        validate: bool = True,
    ) -> Completion:
        prepared = self._prepare(
            messages,
            system=system,
            response_model=response_model,
            tools=tools,
            max_output_tokens=max_output_tokens,
            capability_matrix=capability_matrix,
            validate=validate,
            server_window=await self._alearn_window(deadline, capability_matrix),
        )
        deadline.check("the pre-flight")
        client = self._aclient()
        attempts = 0

        async def send() -> tuple[Parsed, httpx.Response]:
            nonlocal attempts
            deadline.check("the next attempt")
            attempts += 1
            spec = self.adapter.request(prepared.spec, stream=False)
            request = self._http_request(client, spec, deadline)
            where = "the response headers"
            try:
                response = await client.send(request, stream=True)
                try:
                    where = "the body"
                    done = await aread_body(response, deadline, self.limits)
                finally:
                    await response.aclose()
            except httpx.TimeoutException as exc:
                raise self._timed_out(exc, deadline, where) or exc from exc
            return self._decode(done, prepared), done

        parsed, response = await self.envelope.acall(
            send,
            key=self._key,
            provider=self.provider,
            model=self.model,
            started=deadline.started,
            deadline=deadline.seconds,
            narrow=deadline.narrow,
            secrets=self._secrets,
        )
        return self._completion(parsed, prepared, attempts, self._request_id(response))

    def _decode(self, response: httpx.Response, prepared: _Prepared) -> Parsed:
        data = decode_json(
            response.content,
            provider=self.provider,
            model=self.model,
            status=response.status_code,
        )
        return self._parse(data, prepared, response)

    # -- fallbacks and health ----------------------------------------------------------

    @property
    def label(self) -> str:
        return f"{self.provider}:{self.model}"

    def _entries(self) -> list[LLMClient]:
        return [self, *self.fallbacks]

    def _remember(self, error: AgentExecutionError) -> None:
        if error.code not in _CALLER_SIDE:
            self._last_error = {
                "error": type(error).__name__,
                "code": error.code,
                "message": error.message,
                "at": datetime.now(UTC).isoformat(timespec="seconds"),
            }

    def _next_or_raise(
        self,
        entry: LLMClient,
        error: AgentExecutionError,
        history: list[tuple[LLMClient, AgentExecutionError]],
    ) -> None:
        """Record a failed entry; raise unless the call should move to the next one."""
        entry._remember(error)
        history.append((entry, error))
        if not self.fallbacks:
            raise error
        if isinstance(error, ProviderAuthError):
            if self.fallback_on_auth:
                LOG.warning(
                    "%s rejected the key [%s]; moving to the next fallback (opted in)",
                    entry.label,
                    error.code,
                )
                return
            raise self._with_history(error, history)
        if isinstance(error, ContextOverflowError) or error.retryable or error.code in _MOVE_ON:
            LOG.warning("%s failed [%s]; moving to the next fallback", entry.label, error.code)
            return
        raise self._with_history(error, history)

    @staticmethod
    def _with_history(
        error: AgentExecutionError, history: list[tuple[LLMClient, AgentExecutionError]]
    ) -> AgentExecutionError:
        if len(history) < 2:
            return error
        attempts = [
            {"entry": entry.label, "error": type(e).__name__, "code": e.code, "message": e.message}
            for entry, e in history
        ]
        return error.with_details(fallback_attempts=attempts)

    def _final_error(
        self, history: list[tuple[LLMClient, AgentExecutionError]]
    ) -> AgentExecutionError:
        """Every entry failed: the most actionable error, listing them all."""
        best = min(history, key=lambda item: _actionability(item[1]))[1]
        final = self._with_history(best, history)
        if len(history) > 1:
            final = final.with_details(note=f"all {len(history)} fallback entries failed")
        return final

    def _answered(
        self,
        entry: LLMClient,
        done: Completion,
        history: list[tuple[LLMClient, AgentExecutionError]],
    ) -> Completion:
        done.answered_by = entry.label
        done.fallback_errors = [
            {"entry": e.label, "error": type(err).__name__, "code": err.code} for e, err in history
        ]
        return done

    @property
    def health_key(self) -> CooldownKey:
        """The key of this client's cooldown and breaker: provider, endpoint, key, model."""
        return self._key

    def health(self) -> list[dict[str, Any]]:
        """Per configured entry: breaker state, cooldown remaining, the last error (sticky)."""
        from fluid_build.copilot.call.envelope import COOLDOWN
        from fluid_build.copilot.health.cooldown import trusted

        now = self.envelope.wall()
        out: list[dict[str, Any]] = []
        for entry in self._entries():
            key = str(entry._key)
            report: dict[str, Any] = {
                "entry": entry.label,
                "key": key,
                "breaker": None,
                "failures": 0,
                "cooldown_remaining": 0.0,
                "last_error": entry._last_error,
            }
            breaker = self.envelope.breaker
            if breaker is not None:
                state = breaker.state(key)
                report.update(
                    breaker=state.state,
                    failures=state.failures,
                    opens_in=round(state.opens_for, 3),
                    since=state.since,
                    until=state.until,
                    reason=state.reason,
                    trial_owner=state.trial_owner,
                )
            store = self.envelope.cooldown
            if store is not None:
                cap = self.envelope.policy.retry_after_cap
                left = store.remaining(COOLDOWN + key, now)
                report["cooldown_remaining"] = round(
                    trusted(store, COOLDOWN + key, left, cap, now), 3
                )
            out.append(report)
        return out

    def reset_health(self) -> None:
        """Clear the breaker and cooldown of every entry, for every process sharing the store.

        The Python twin of ``fluid doctor --reset --provider P --model M``; the
        sticky last errors are forgotten too.
        """
        for entry in self._entries():
            self.envelope.reset(entry._key)
        self.clear_last_error()

    def clear_last_error(self) -> None:
        """Forget the sticky last error of every entry."""
        for entry in self._entries():
            entry._last_error = None

    # -- streaming ------------------------------------------------------------------------

    def _stream_error(self, response: httpx.Response, data: Any) -> AgentExecutionError:
        body = httpx.Response(
            200, json=data, request=response.request, headers={"content-type": "application/json"}
        )
        return classify_response(body, provider=self.provider, model=self.model)

    def _feed(
        self,
        response: httpx.Response,
        state: StreamState,
        spec: CallSpec,
        event: str,
        data: Any,
        *,
        started: bool,
    ) -> list[StreamEvent]:
        """One chunk of a stream: its events, or the typed error it carries.

        Once the caller has had events (``started``), the error carries what
        had arrived, and the envelope no longer retries it.
        """
        if self.adapter.is_error_chunk(data, event):
            error = self._stream_error(response, data)
            raise error.with_details(interrupted=True, **state.partial()) if started else error
        try:
            return self.adapter.parse_chunk(data, event, state, spec)
        except AgentExecutionError:
            raise
        except (AttributeError, KeyError, TypeError, ValueError, IndexError) as exc:
            error = self._misshapen(data, self.adapter.chunk_shape, "event", None)
            if started:
                error = error.with_details(interrupted=True, **state.partial())
            raise error from exc

    def _interrupted(
        self, exc: BaseException, state: StreamState, deadline: Deadline
    ) -> AgentExecutionError:
        error: AgentExecutionError | None = None
        if isinstance(exc, httpx.TimeoutException):
            error = self._timed_out(exc, deadline, "the rest of the stream")
        if error is None:
            error = classify_provider_error(
                exc, provider=self.provider, model=self.model, secrets=self._secrets
            )
        return error.with_details(interrupted=True, **state.partial())

    def stream(
        self,
        messages: Messages,
        *,
        system: str | None = None,
        response_model: type[BaseModel] | None = None,
        tools: Tools = None,
        max_output_tokens: int | None = None,
        capability_matrix: Mapping[str, Any] | None = None,
        validate: bool = True,
    ) -> Iterator[StreamEvent]:
        """Text deltas and tool-call fragments as they arrive, then a ``done`` event.

        A failure before anything was yielded is retried by the envelope; a
        failure after raises the typed error with ``details["partial_text"]``
        and the tool calls that completed.
        """
        deadline = self._deadline()
        prepared = self._prepare(
            messages,
            system=system,
            response_model=response_model,
            tools=tools,
            max_output_tokens=max_output_tokens,
            capability_matrix=capability_matrix,
            validate=validate,
            server_window=self._learn_window(deadline, capability_matrix),
        )
        deadline.check("the pre-flight")
        client = self._client()
        adapter, spec = self.adapter, prepared.spec
        attempts = 0

        def open_stream() -> tuple[
            httpx.Response, Iterator[tuple[str, Any]], list[StreamEvent], StreamState
        ]:
            nonlocal attempts
            deadline.check("the next attempt")
            attempts += 1
            state = StreamState()
            request = self._http_request(client, adapter.request(spec, stream=True), deadline)
            try:
                response = client.send(request, stream=True)
            except httpx.TimeoutException as exc:
                raise self._timed_out(exc, deadline, "the response headers") or exc from exc
            reader = StreamReader(response, deadline, self.limits)
            try:
                if response.is_error:
                    read_body(response, deadline, self.limits)  # raises, for classification
                chunks = reader.counted(iter_stream(adapter.stream_format, reader.lines()))
                for event, data in chunks:
                    first = self._feed(response, state, spec, event, data, started=False)
                    if first:
                        return response, chunks, first, state
                return response, iter(()), [], state
            except httpx.TimeoutException as exc:
                response.close()
                raise self._timed_out(exc, deadline, reader.reader.where) or exc from exc
            except BaseException:
                response.close()
                raise

        response, chunks, first, state = self.envelope.call(
            open_stream,
            key=self._key,
            provider=self.provider,
            model=self.model,
            started=deadline.started,
            deadline=deadline.seconds,
            narrow=deadline.narrow,
            secrets=self._secrets,
        )
        try:
            yield from first
            try:
                for event, data in chunks:
                    yield from self._feed(response, state, spec, event, data, started=True)
            except (httpx.HTTPError, OSError) as exc:
                raise self._interrupted(exc, state, deadline) from exc
            except AgentExecutionError as error:
                if "interrupted" in error.details:
                    raise
                raise error.with_details(interrupted=True, **state.partial()) from error
        finally:
            response.close()
        completion = self._completion(
            state.parsed(), prepared, attempts, self._request_id(response)
        )
        yield StreamEvent(type="done", completion=completion)

    async def astream(
        self,
        messages: Messages,
        *,
        system: str | None = None,
        response_model: type[BaseModel] | None = None,
        tools: Tools = None,
        max_output_tokens: int | None = None,
        capability_matrix: Mapping[str, Any] | None = None,
        validate: bool = True,
    ) -> AsyncIterator[StreamEvent]:
        """The async twin of :meth:`stream`."""
        deadline = self._deadline()
        prepared = self._prepare(
            messages,
            system=system,
            response_model=response_model,
            tools=tools,
            max_output_tokens=max_output_tokens,
            capability_matrix=capability_matrix,
            validate=validate,
            server_window=await self._alearn_window(deadline, capability_matrix),
        )
        deadline.check("the pre-flight")
        client = self._aclient()
        adapter, spec = self.adapter, prepared.spec
        attempts = 0

        async def open_stream() -> tuple[
            httpx.Response, AsyncIterator[tuple[str, Any]], list[StreamEvent], StreamState
        ]:
            nonlocal attempts
            deadline.check("the next attempt")
            attempts += 1
            state = StreamState()
            request = self._http_request(client, adapter.request(spec, stream=True), deadline)
            try:
                response = await client.send(request, stream=True)
            except httpx.TimeoutException as exc:
                raise self._timed_out(exc, deadline, "the response headers") or exc from exc
            reader = StreamReader(response, deadline, self.limits)
            try:
                if response.is_error:
                    await aread_body(response, deadline, self.limits)  # raises
                chunks = reader.acounted(aiter_stream(adapter.stream_format, reader.alines()))
                async for event, data in chunks:
                    first = self._feed(response, state, spec, event, data, started=False)
                    if first:
                        return response, chunks, first, state
                return response, _empty(), [], state
            except httpx.TimeoutException as exc:
                await response.aclose()
                raise self._timed_out(exc, deadline, reader.reader.where) or exc from exc
            except BaseException:
                await response.aclose()
                raise

        response, chunks, first, state = await self.envelope.acall(
            open_stream,
            key=self._key,
            provider=self.provider,
            model=self.model,
            started=deadline.started,
            deadline=deadline.seconds,
            narrow=deadline.narrow,
            secrets=self._secrets,
        )
        try:
            for item in first:
                yield item
            try:
                async for event, data in chunks:
                    for item in self._feed(response, state, spec, event, data, started=True):
                        yield item
            except (httpx.HTTPError, OSError) as exc:
                raise self._interrupted(exc, state, deadline) from exc
            except AgentExecutionError as error:
                if "interrupted" in error.details:
                    raise
                raise error.with_details(interrupted=True, **state.partial()) from error
        finally:
            await response.aclose()
        completion = self._completion(
            state.parsed(), prepared, attempts, self._request_id(response)
        )
        yield StreamEvent(type="done", completion=completion)


async def _empty() -> AsyncIterator[tuple[str, Any]]:
    return
    yield  # pragma: no cover - makes this an async generator
