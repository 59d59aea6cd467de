"""LLMClient: one reliable structured call to any supported provider.

A facade: the call itself is one plan (:mod:`fluid_build.copilot.call.core`:
pre-flight -> the retry envelope -> the provider adapter over httpx ->
classification of any failure -> validation against ``response_model``),
which the sync methods run in the sync shell and the async methods in the
async shell (:mod:`fluid_build.copilot.call.drive`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, TextIO, TypeVar, cast, overload

import httpx
from typing_extensions import Unpack

if TYPE_CHECKING:
    from pydantic import BaseModel

    from fluid_build.copilot.batch import Batch, Progress
    from fluid_build.copilot.call.capabilities import ModelCapabilities
    from fluid_build.copilot.call.chain import OnCut, completing, streaming
    from fluid_build.copilot.call.core import CallOptions, Entry
    from fluid_build.copilot.call.drive import Plan, Pools, arun, astream, run, stream
    from fluid_build.copilot.call.envelope import MoveOn, RetryEnvelope
    from fluid_build.copilot.call.loops import LoopPools
    from fluid_build.copilot.call.phases import PhaseLimits
    from fluid_build.copilot.call.prepare import Messages, Prepared, prepare
    from fluid_build.copilot.call.prices import ModelPrice, parse_prices, prices_from_env
    from fluid_build.copilot.call.spend import BudgetGuard
    from fluid_build.copilot.call.wire import Deadline, Limits, deadline_from_env
    from fluid_build.copilot.health.cooldown import CooldownKey
    from fluid_build.copilot.llm.base import Adapter, ProviderConfig
    from fluid_build.copilot.llm.fallback import Fallback
    from fluid_build.copilot.llm.settings import PROVIDERS, resolve_provider_config
    from fluid_build.copilot.llm.types import Completion, StreamEvent
    from fluid_build.copilot.telemetry import CallTrace, Telemetry, telemetry_from

__all__ = ["LLMClient"]

#: Held while a client makes its sync pool (rarely: once per client).
_MAKING = threading.Lock()


def _on_cut(value: object, source: str) -> OnCut:
    """``value`` if it is one of ``on_cut``'s choices; else ``llm.not_configured``."""
    from fluid_build.copilot.agents.errors import ProviderError

    if value == "raise" or value == "restart":
        return value
    raise ProviderError(
        f"{source} takes 'raise' (the default: a cut stream raises its typed error) or "
        f"'restart' (it starts again from scratch, once), not {str(value)[:40]!r}",
        code="llm.not_configured",
        retryable=False,
        details={"argument": source, "choices": ["raise", "restart"]},
    )


T = TypeVar("T")

#: Each adapter's module and class; only the provider's own adapter is imported.
_ADAPTERS: dict[str, tuple[str, str]] = {
    "openai": ("openai", "OpenAIAdapter"),
    "azure": ("azure", "AzureOpenAIAdapter"),
    "anthropic": ("anthropic", "AnthropicAdapter"),
    "gemini": ("gemini", "GeminiAdapter"),
    "bedrock": ("bedrock", "BedrockAdapter"),
    "vertex": ("vertex", "VertexAdapter"),
    "ollama": ("ollama", "OllamaAdapter"),
    "openai_compatible": ("openai_compatible", "OpenAICompatibleAdapter"),
    "openai_responses": ("openai_responses", "OpenAIResponsesAdapter"),
}

#: ``batch.DEFAULT_CONCURRENCY`` (the same figure, kept here so that importing this
#: module does not import the batch module; a test checks that they agree).
DEFAULT_CONCURRENCY = 8

_loaded = False


def _load() -> None:
    """Bind the call path: it loads with the first client, not with this module.

    ``from fluid_build.copilot import LLMClient`` costs httpx and this module
    (see docs/benchmarks.md, cold import); pydantic, the envelope, the stores
    and the adapters load when the first client is made.
    """
    global _loaded
    if _loaded:
        return
    from fluid_build.copilot.call import chain, core, drive, envelope, prepare, prices, wire
    from fluid_build.copilot.llm import settings
    from fluid_build.copilot.telemetry import telemetry_from

    globals().update(
        Entry=core.Entry,
        completing=chain.completing,
        streaming=chain.streaming,
        Pools=drive.Pools,
        run=drive.run,
        arun=drive.arun,
        stream=drive.stream,
        astream=drive.astream,
        RetryEnvelope=envelope.RetryEnvelope,
        MoveOn=envelope.MoveOn,
        prepare=prepare.prepare,
        parse_prices=prices.parse_prices,
        prices_from_env=prices.prices_from_env,
        Deadline=wire.Deadline,
        Limits=wire.Limits,
        deadline_from_env=wire.deadline_from_env,
        PROVIDERS=settings.PROVIDERS,
        resolve_provider_config=settings.resolve_provider_config,
        telemetry_from=telemetry_from,
    )
    _loaded = True


def _adapter(name: str, config: ProviderConfig) -> Adapter:
    import importlib

    module, cls = _ADAPTERS[name]
    adapter: type[Adapter] = getattr(
        importlib.import_module(f"fluid_build.copilot.llm.{module}"), cls
    )
    return adapter(config)


class _Held(Generic[T]):
    """An attribute the client's :class:`~fluid_build.copilot.call.core.Entry` holds, read
    through (``writable``: and set through), so that the facade keeps no copy of its own."""

    def __init__(self, name: str | None = None, *, writable: bool = False) -> None:
        self.name = name
        self.writable = writable

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = self.name or name

    @overload
    def __get__(self, client: None, owner: type) -> _Held[T]: ...
    @overload
    def __get__(self, client: LLMClient, owner: type) -> T: ...
    def __get__(self, client: LLMClient | None, owner: type) -> _Held[T] | T:
        if client is None:
            return self
        value: T = getattr(client._entry, cast(str, self.name))
        return value

    def __set__(self, client: LLMClient, value: T) -> None:
        if not self.writable:
            raise AttributeError(f"LLMClient.{self.name} cannot be set")
        setattr(client._entry, cast(str, self.name), value)


class LLMClient:
    """A provider, a model and a key, with pooled connections and the retry envelope.

    ``LLMClient(provider=..., model=...)`` resolves whatever is not given from
    the environment (see docs/llm-providers.md); ``LLMClient.from_env()``
    also takes the retry policy and cooldown store from it. Pass
    ``http_client`` / ``async_http_client`` to share or mock transports.
    ``telemetry`` (True, a :class:`Telemetry`, or ``FLUID_OTEL=1`` when None)
    traces each call with OpenTelemetry (see docs/telemetry.md). ``prices``
    (USD per million tokens by model, over ``FLUID_PRICES``) prices models
    genai-prices does not know, or replaces its price (see docs/budgets.md).
    ``budget`` (or ``FLUID_BUDGET``) names the shared USD budget of
    ``FLUID_BUDGETS`` every attempt reserves from (docs/budgets.md).
    ``max_connections`` (or ``FLUID_LLM_MAX_CONNECTIONS``) caps each of the client's
    pools; by default a pool opens as many connections as there are calls in flight
    (docs/llm-providers.md, "Connection pools"). ``on_cut`` is what a stream cut after
    text reached the caller does: ``"raise"`` its typed error (the default) or
    ``"restart"`` from scratch, once (docs/fallbacks-and-breakers.md). ``connect_timeout``,
    ``first_token_timeout`` and ``idle_timeout`` (or ``FLUID_LLM_CONNECT_TIMEOUT_SECONDS``,
    ``..._FIRST_TOKEN_...``, ``..._IDLE_...``) limit each attempt's phases: connecting, the
    wait for the first token, the gaps between bytes of the answer (docs/limits.md, "Phases").
    With fallbacks, an entry that said nothing within a phase limit (``move_on_silence``)
    or asks for a Retry-After over ``move_on_retry_after`` seconds (or
    ``FLUID_LLM_MOVE_ON_RETRY_AFTER_SECONDS``, default 10) hands the call to the next entry
    at once (docs/retry-envelope.md, "Moving on to the next entry").
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
        fallbacks: Sequence[Fallback | Mapping[str, Any] | tuple[str, str] | str] | None = None,
        fallback_on_auth: bool = False,
        deadline: float | None = None,
        limits: Limits | None = None,
        telemetry: Telemetry | bool | None = None,
        prices: Mapping[str, Any] | None = None,
        budget: str | None = None,
        max_connections: int | None = None,
        headers: Mapping[str, str] | None = None,
        on_cut: OnCut = "raise",
        connect_timeout: float | None = None,
        first_token_timeout: float | None = None,
        idle_timeout: float | None = None,
        move_on_silence: bool = True,
        move_on_retry_after: float | None = None,
        options: CallOptions | None = None,
        drop_unsupported: bool | None = None,
    ) -> None:
        _load()
        source = os.environ if env is None else env
        #: Every call's options unless the call sets its own (docs/llm-providers.md,
        #: "Call options"): FLUID_LLM_TEMPERATURE / FLUID_LLM_MAX_OUTPUT_TOKENS, then
        #: ``options``; checked here, so a misspelt name or a bad value fails at construction.
        self.options: CallOptions = self._defaults(source, options, drop_unsupported)
        #: What a stream cut after text reached the caller does: "raise" or "restart".
        self.on_cut: OnCut = _on_cut(on_cut, "on_cut=")
        config = resolve_provider_config(
            provider, model, api_key, base_url, timeout=timeout, env=env
        )
        if headers is not None:
            from dataclasses import replace

            from fluid_build.copilot.llm.fallback import checked_headers

            config = replace(config, headers=checked_headers(headers, "headers="))
        info = PROVIDERS[config.provider]
        self.envelope = envelope if envelope is not None else RetryEnvelope.from_env(env)
        # One bound on each whole call: pre-flight, attempts, waits, every read.
        self.deadline: float = (
            deadline
            if deadline is not None
            else self.envelope.policy.deadline or deadline_from_env(source)
        )
        self._http = http_client
        self._owns_http = http_client is None
        self._ahttp = async_http_client  # the caller's own, used in whatever loop they use it
        self._apools: LoopPools | None = None  # ours: one pool per event loop
        self._env = env
        # Each pool's cap on connections; None: as many as the calls in flight.
        self.max_connections: int | None = None
        if max_connections is not None or source.get("FLUID_LLM_MAX_CONNECTIONS"):
            from fluid_build.copilot.call.transport import max_connections_choice

            self.max_connections = max_connections_choice(
                source, max_connections, provider=config.provider
            )
        # USD per million tokens by model (docs/budgets.md): the argument's win over FLUID_PRICES.
        self.prices: dict[str, ModelPrice] = {
            **prices_from_env(source),
            **parse_prices(prices),
        }
        guard: BudgetGuard | None = None
        if budget is not None or source.get("FLUID_BUDGET"):
            # A shared USD budget (FLUID_BUDGETS): each attempt reserves from it. It is the
            # client's (its chain's), never the envelope's: clients may share one envelope.
            from fluid_build.copilot.call.spend import BudgetGuard

            guard = BudgetGuard.from_env(
                budget, self.envelope.cooldown, source, prices=self.prices, wall=self.envelope.wall
            )
        self._entry = Entry.configured(
            config,
            _adapter(info.adapter, config),
            self.envelope,
            Pools(self._client, self._aclient),
            env=env,
            capability_matrix=capability_matrix,
            strict_schema=strict_schema,
            limits=limits,
            prices=self.prices,
        )
        # Each attempt's phase limits (docs/limits.md, "Phases"), and when the chain moves
        # on without retrying (docs/retry-envelope.md, "Moving on").
        from fluid_build.copilot.call.phases import PhaseLimits, move_on_retry_after_choice

        self._entry.phases = PhaseLimits.choose(
            source,
            self.config.timeout,
            timeout_set=timeout is not None or bool(source.get("FLUID_LLM_TIMEOUT_SECONDS")),
            connect=connect_timeout,
            first_token=first_token_timeout,
            idle=idle_timeout,
            provider=config.provider,
        )
        self.move_on_silence = bool(move_on_silence)
        self.move_on_retry_after: float = move_on_retry_after_choice(
            source, move_on_retry_after, provider=config.provider
        )
        self.fallback_on_auth = fallback_on_auth
        self.telemetry = telemetry_from(telemetry, source)
        self.fallbacks: list[LLMClient] = []
        if fallbacks or (fallbacks is None and source.get("FLUID_LLM_FALLBACKS")):
            self.fallbacks = self._fallback_clients(
                fallbacks,
                source,
                envelope=self.envelope,
                http_client=http_client,
                async_http_client=async_http_client,
                strict_schema=strict_schema,
                env=env,
                fallbacks=(),
                deadline=self.deadline,
                limits=self.limits,
                telemetry=False,  # the call's span covers the whole chain
                prices=self.prices,
                max_connections=self.max_connections,
            )
        if self.fallbacks:
            # Two servers of one model (two vLLM hosts): their endpoints tell them apart in
            # answered_by, fallback_errors, health() and the logs.
            labels = [entry.label for entry in self._entries()]
            for entry in self._entries():
                if labels.count(entry.label) > 1:
                    entry.name = f"{entry.label}@{entry.key.endpoint}"
        # The whole chain spends from the primary's budget, each entry at its own price.
        self.budget = guard
        for fallback in self.fallbacks:
            fallback.budget = guard

    @staticmethod
    def _fallback_clients(
        given: Sequence[Fallback | Mapping[str, Any] | tuple[str, str] | str] | None,
        source: Mapping[str, str],
        **shared: Any,
    ) -> list[LLMClient]:
        """A client per fallback entry, each with its own settings (docs/fallbacks-and-breakers.md).

        What an entry leaves out is resolved as for a client of its own: its provider's
        key and URL from the environment, never the primary's ``api_key=`` or
        ``base_url=``. The phase limits are passed on only when the entry sets them.
        """
        from fluid_build.copilot.agents.errors import AgentExecutionError
        from fluid_build.copilot.call.core import CALL_OPTIONS
        from fluid_build.copilot.llm.fallback import PHASE_FIELDS, fallback_entries

        clients: list[LLMClient] = []
        for entry in fallback_entries(given, source, option_names=CALL_OPTIONS):
            if entry.options:
                from fluid_build.copilot.call.options import sampling
                from fluid_build.copilot.llm.checks import not_configured

                try:  # a bad value fails here, not when the call reaches this entry
                    sampling(entry.options)
                except ValueError as bad:
                    raise not_configured(
                        f"the fallback entry {entry.label}'s options: {bad}", entry.provider
                    ).with_details(entry=entry.label) from None
            own: dict[str, Any] = {
                name: getattr(entry, name)
                for name in PHASE_FIELDS
                if getattr(entry, name) is not None
            }
            try:
                client = LLMClient(
                    entry.provider,
                    entry.model,
                    entry.api_key,
                    entry.base_url,
                    timeout=entry.timeout,
                    headers=entry.headers,
                    **own,
                    **shared,
                )
            except AgentExecutionError as error:
                # Its own message (a missing key names the variable, a bad URL base_url=),
                # and which entry of the chain it is.
                where = "FLUID_LLM_FALLBACKS" if given is None else "fallbacks="
                extra = (
                    {"entry": entry.label}
                    if given is None
                    else {
                        "entry": entry.label,
                        "argument": where,
                    }
                )
                raise error.with_details(
                    note=f"in the fallback entry {entry.label} of {where}", **extra
                ) from None
            client._entry.options = entry.options
            clients.append(client)
        return clients

    # -- what the entry holds (see _Held) ---------------------------------------------

    config: _Held[ProviderConfig] = _Held()
    adapter: _Held[Adapter] = _Held()
    limits: _Held[Limits] = _Held()
    strict_schema: _Held[bool] = _Held()
    #: The limits of each attempt's connect, first-token and idle phases (docs/limits.md).
    phases: _Held[PhaseLimits | None] = _Held()
    provider: _Held[str] = _Held()
    model: _Held[str] = _Held()
    label: _Held[str] = _Held()
    #: The key of this client's cooldown and breaker: provider, endpoint, key, model.
    health_key: _Held[CooldownKey] = _Held("key")
    #: This model's capability overrides (FLUID_CAPABILITY_MATRIX, then the argument).
    capability_matrix: _Held[dict[str, Any]] = _Held(writable=True)
    #: The shared USD budget this client's calls reserve from (None: none; docs/budgets.md).
    budget: _Held[BudgetGuard | None] = _Held(writable=True)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **kwargs: Any) -> LLMClient:
        """A client, its retry policy and its cooldown store, all from the environment."""
        _load()
        kwargs.setdefault("envelope", RetryEnvelope.from_env(env))
        return cls(env=env, **kwargs)

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
        return self._entry.start_warnings(
            self._deadline(),
            uses_tools=uses_tools,
            wants_strict_schema=self.strict_schema
            if wants_strict_schema is None
            else wants_strict_schema,
            banner=banner,
            env=self._env,
            stream=stream,
        )

    # -- lifecycle --------------------------------------------------------------

    def _client(self) -> httpx.Client:
        if self._http is None:
            with _MAKING:  # threads that start together share one pool, none left unclosed
                if self._http is None:
                    # The pools' module (and asyncio, for the async gate) loads with the first.
                    from fluid_build.copilot.call.transport import build_client

                    self._http = build_client(
                        self.config.timeout,
                        self.provider,
                        self._env,
                        max_connections=self.max_connections,
                    )
        return self._http

    def _aclient(self) -> httpx.AsyncClient:
        """The async pool for the running event loop: the caller's, else one of ours per
        loop (closed when that loop shuts down, as at the end of ``asyncio.run``)."""
        if self._ahttp is not None:
            return self._ahttp
        pools = self._apools
        if pools is None:
            from fluid_build.copilot.call.loops import LoopPools
            from fluid_build.copilot.call.transport import build_async_client

            def make() -> httpx.AsyncClient:
                return build_async_client(
                    self.config.timeout,
                    self.provider,
                    self._env,
                    max_connections=self.max_connections,
                )

            pools = self._apools = LoopPools(make)
        return pools.get()

    def close(self) -> None:
        """Close the connection pools this client (and its fallbacks) opened, from any
        thread or loop; a pool of a running loop closes there, as a task. Calls still in
        flight on them end at once with ``llm.client_closed`` (not retried, and never
        counted against the provider: docs/transports.md); a later call opens a new pool."""
        if self._owns_http and self._http is not None:
            self._http.close()
            self._http = None
        if self._apools is not None:
            self._apools.close()
        for fallback in self.fallbacks:
            fallback.close()

    async def aclose(self) -> None:
        """Close this loop's pool now (and every other, as :meth:`close` does)."""
        if self._apools is not None:
            await self._apools.aclose()
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

    # -- calls: one plan each, run by the sync or the async shell ------------------------

    @staticmethod
    def _defaults(
        source: Mapping[str, str], options: CallOptions | None, drop_unsupported: bool | None
    ) -> CallOptions:
        from fluid_build.copilot.call.core import CALL_OPTIONS
        from fluid_build.copilot.call.options import check_names, sampling
        from fluid_build.copilot.llm.settings import call_defaults_from_env

        given = dict(options or {})
        check_names(given, CALL_OPTIONS, "LLMClient(options=)")
        sampling(given)  # a bad value fails here, not on the first call
        given = {k: v for k, v in given.items() if v is not None}
        if drop_unsupported is not None:
            given["drop_unsupported"] = bool(drop_unsupported)
        return cast("CallOptions", {**call_defaults_from_env(source), **given})

    def _options(self, options: CallOptions, where: str) -> CallOptions:
        """The call's options over the client's (an option the call gives as None is not
        set: the client's applies); a name no call takes is a ``TypeError``."""
        from fluid_build.copilot.call.core import CALL_OPTIONS

        if not options.keys() <= CALL_OPTIONS:
            from fluid_build.copilot.call.options import check_names

            check_names(options, CALL_OPTIONS, f"LLMClient.{where}()")
        if self.options:
            given = {k: v for k, v in options.items() if v is not None}
            return cast("CallOptions", {**self.options, **given})
        return options

    def complete(self, messages: Messages, **options: Unpack[CallOptions]) -> Completion:
        """One call: a :class:`Completion`, or a typed error.

        ``options``: ``system``, ``response_model`` (the answer is validated into
        ``Completion.parsed``), ``tools``, ``max_output_tokens``,
        ``capability_matrix``, ``validate``. With fallbacks, an exhausted entry
        hands the call to the next one (see docs/fallbacks-and-breakers.md).

        The sampling and tool options (``temperature``, ``top_p``, ``stop``, ``seed``,
        ``tool_choice``, ``parallel_tool_calls``, ``reasoning_effort``, ``extra_body``,
        ``extra_headers``) go out under the provider's own fields; a name no call takes
        is a ``TypeError``, and one the provider or model cannot take is refused
        (``llm.unsupported_option``) before anything is sent, unless
        ``drop_unsupported=True`` (docs/llm-providers.md, "Call options").
        """
        return run(self._completing(messages, self._options(options, "complete")))

    async def acomplete(self, messages: Messages, **options: Unpack[CallOptions]) -> Completion:
        """:meth:`complete`, awaited."""
        return await arun(self._completing(messages, self._options(options, "acomplete")))

    def stream(
        self,
        messages: Messages,
        *,
        on_cut: OnCut | None = None,
        **options: Unpack[CallOptions],
    ) -> Iterator[StreamEvent]:
        """Text deltas and tool-call fragments as they arrive, then a ``done`` event.

        ``done`` comes only after the provider's end marker; a stream that stops
        short of it was cut. A failure (or cut) before anything was yielded is
        retried by the envelope, then walks the fallback chain as
        :meth:`complete` does. One after raises the typed error with
        ``details["partial_text"]`` and the tool calls that completed; with
        ``on_cut="restart"`` (here or on the client) the call starts again from
        scratch once, after a ``restart`` event (docs/fallbacks-and-breakers.md).
        """
        return stream(self._streaming(messages, self._options(options, "stream"), on_cut))

    def astream(
        self,
        messages: Messages,
        *,
        on_cut: OnCut | None = None,
        **options: Unpack[CallOptions],
    ) -> AsyncIterator[StreamEvent]:
        """:meth:`stream`, as an async iterator."""
        return astream(self._streaming(messages, self._options(options, "astream"), on_cut))

    def _streaming(
        self, messages: Messages, options: CallOptions, on_cut: OnCut | None = None
    ) -> Plan[None]:
        """A stream's plan; with telemetry, inside its call span (see docs/telemetry.md)."""
        cut = self.on_cut if on_cut is None else _on_cut(on_cut, "stream(on_cut=)")
        entries = self._entries()
        trace = self._trace(messages, options, entries)
        plan = streaming(
            entries,
            messages,
            options,
            self._deadline,
            fallback_on_auth=self.fallback_on_auth,
            on_cut=cut,
            trace=trace,
            move_on=self._move_on(),
        )
        return plan if trace is None else trace.stream(plan)

    def _trace(
        self, messages: Messages, options: CallOptions, entries: list[Entry]
    ) -> CallTrace | None:
        """The call's span, when telemetry is on; the request keys of ``entries`` are redacted."""
        if self.telemetry is None:
            return None
        return self.telemetry.call(
            self.provider,
            self.model,
            messages,
            options,
            endpoint=self.adapter.endpoint,
            secrets=[secret for entry in entries for secret in entry.secrets],
            clock=self.envelope.clock,
        )

    def map(
        self,
        prompts: Iterable[Messages],
        *,
        concurrency: int = DEFAULT_CONCURRENCY,
        fail_fast: bool = False,
        progress: Progress[Completion] | None = None,
        **options: Unpack[CallOptions],
    ) -> Batch[Completion]:
        """:meth:`complete` for every prompt, ``concurrency`` at a time: a :class:`Batch`.

        Each outcome, in input order, is a Completion or its typed error;
        ``Batch.summary()`` counts them by reason code (see docs/batch.md).
        """
        from fluid_build.copilot.batch import map_calls

        self._options(options, "map")  # a misspelt name fails once, not once per prompt
        return map_calls(
            self.complete,
            prompts,
            concurrency=concurrency,
            fail_fast=fail_fast,
            progress=progress,
            **options,
        )

    async def amap(
        self,
        prompts: Iterable[Messages],
        *,
        concurrency: int = DEFAULT_CONCURRENCY,
        fail_fast: bool = False,
        progress: Progress[Completion] | None = None,
        **options: Unpack[CallOptions],
    ) -> Batch[Completion]:
        """:meth:`map` with tasks; cancelling it cancels the calls in flight."""
        from fluid_build.copilot.batch import amap_calls

        self._options(options, "amap")
        return await amap_calls(
            self.acomplete,
            prompts,
            concurrency=concurrency,
            fail_fast=fail_fast,
            progress=progress,
            **options,
        )

    def validate(self, text: str, response_model: type[BaseModel]) -> Any:
        """Validate a model's text against ``response_model`` as :meth:`complete` does.

        Raises :class:`SchemaValidationError` (``llm.parse_error`` for text
        that is not JSON). Strict-schema fields are decoded first.
        """
        return self._entry.decoder.validate(text, response_model, self.strict_schema)

    def _completing(self, messages: Messages, options: CallOptions) -> Plan[Completion]:
        entries = self._entries()
        trace = self._trace(messages, options, entries)
        plan = completing(
            entries,
            messages,
            options,
            self._deadline(),
            fallback_on_auth=self.fallback_on_auth,
            trace=trace,
            move_on=self._move_on(),
        )
        return plan if trace is None else trace.run(plan)

    def _move_on(self) -> MoveOn:
        """When the chain leaves an entry without retrying it (docs/retry-envelope.md)."""
        return MoveOn(silence=self.move_on_silence, retry_after=self.move_on_retry_after)

    def _prepare(self, messages: Messages, **options: Any) -> Prepared:
        """The pre-flight and the prepared call, without asking a server for its window."""
        matrix = {**self.capability_matrix, **(options.pop("capability_matrix", None) or {})}
        return prepare(
            self.provider,
            self.model,
            messages,
            capability_matrix=matrix,
            strict_schema=self.strict_schema,
            **options,
        )

    def _deadline(self) -> Deadline:
        return Deadline(
            self.deadline, clock=self.envelope.clock, provider=self.provider, model=self.model
        )

    # -- health ------------------------------------------------------------------------

    def _entries(self) -> list[Entry]:
        return [self._entry, *(fallback._entry for fallback in self.fallbacks)]

    def health(self) -> list[dict[str, Any]]:
        """Per configured entry: breaker state, cooldown remaining, the last error (sticky)."""
        from fluid_build.copilot.health.report import entry_reports

        return entry_reports(
            [(entry.label, str(entry.key), entry.last_error) for entry in self._entries()],
            self.envelope.breaker,
            self.envelope.cooldown,
            self.envelope.policy.retry_after_cap,
            self.envelope.wall(),
        )

    def reset_health(self) -> None:
        """Clear the breaker and cooldown of every entry, for every process sharing the store.

        The Python twin of ``fluid doctor --reset --provider P --model M``; the
        sticky last errors are forgotten too.
        """
        for entry in self._entries():
            self.envelope.reset(entry.key)
        self.clear_last_error()

    def clear_last_error(self) -> None:
        """Forget the sticky last error of every entry."""
        for entry in self._entries():
            entry.last_error = None
