"""One call, written once: the plan that both LLMClient shells run.

The stages in order, for one entry of a fallback chain: ask a local server
for its window (once) -> prepare and pre-flight (:mod:`.prepare`) -> the
retry envelope (:mod:`.envelope`) around each attempt: build the request,
send it, read the answer within the deadline and the size limit -> decode
and validate (:mod:`.decode`). Then the chain: an entry that fails in a way
another provider might not hands the call to the next (see
docs/fallbacks-and-breakers.md).

Every plan here is a generator of effects (:mod:`.drive`): it decides, and
the sync or async shell does the I/O it asks for.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TextIO, cast

import httpx

from fluid_build.copilot.agents.errors import (
    AgentExecutionError,
)
from fluid_build.copilot.call.decode import Decoder, request_id, timed_out
from fluid_build.copilot.call.drive import (
    END,
    Blocking,
    Close,
    Emit,
    Events,
    Exchange,
    Hold,
    Next,
    Plan,
    Pool,
    Pools,
    ReadBody,
    Send,
    Sleep,
    run,
)
from fluid_build.copilot.call.envelope import CallBounds, MoveOn, RetryEnvelope
from fluid_build.copilot.call.options import (
    CALL_OPTIONS,
    UNSET_FIELDS,
    CallOptions,
    check_tool_choice,
    sampling,
    unsupported,
)
from fluid_build.copilot.call.phases import PHASE_EXTENSION, PhaseLimits
from fluid_build.copilot.call.prepare import (
    Messages,
    Prepared,
    http_request,
    prepare,
    tool_spec,
)
from fluid_build.copilot.call.prices import MOST_TOKENS, Prices, price_call
from fluid_build.copilot.call.trace import AttemptTrace
from fluid_build.copilot.call.window import asking
from fluid_build.copilot.call.wire import Deadline, Limits, StreamReader
from fluid_build.copilot.health.cooldown import CooldownKey
from fluid_build.copilot.health.ratelimit import estimate_tokens
from fluid_build.copilot.llm.base import (
    SAMPLING_OPTIONS,
    Adapter,
    Parsed,
    ProviderConfig,
    StreamState,
)
from fluid_build.copilot.llm.credentials import Pending
from fluid_build.copilot.llm.local_server import probe_urls
from fluid_build.copilot.llm.types import CallSpec, Completion, StreamEvent

if TYPE_CHECKING:
    from fluid_build.copilot.call.spend import BudgetGuard, BudgetSpend

__all__ = ["CALL_OPTIONS", "CallOptions", "Entry", "Tally"]

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
        "llm.client_closed",
        "llm.unsupported_option",
    }
)


#: The providers whose API has OpenAI's strict-schema mode.
STRICT_SCHEMA_PROVIDERS = frozenset({"openai", "azure", "openai_responses"})


class Entry:
    """One provider:model of a call's fallback chain: its adapter, key, pools and state.

    ``key`` is who shares a cooldown and a breaker: never two endpoints, keys
    or models. The request's key (``secrets``) goes by value from every error.
    """

    def __init__(
        self,
        config: ProviderConfig,
        adapter: Adapter,
        envelope: RetryEnvelope,
        limits: Limits,
        capability_matrix: dict[str, Any],
        strict_schema: bool,
        pools: Pools,
        prices: Prices | None = None,
    ) -> None:
        self.config = config
        self.adapter = adapter
        self.envelope = envelope
        self.limits = limits
        self.capability_matrix = capability_matrix
        self.strict_schema = strict_schema
        self.pools = pools
        self.key = CooldownKey.for_call(
            config.provider, config.api_key, config.model, adapter.endpoint
        )
        # The key, and any credential a header of the entry's own carries (docs/transports.md).
        self.secrets: tuple[str, ...] = (config.api_key,) if config.api_key else ()
        if config.headers:
            from fluid_build._redact import is_credential_header

            self.secrets += tuple(
                value
                for name, value in config.headers.items()
                if value and is_credential_header(name)
            )
        #: Call options of this entry's own (a fallback's ``options``): they win over the call's.
        self.options: Mapping[str, Any] | None = None
        #: The label, set where ``provider:model`` alone would name two entries of a chain.
        self.name: str | None = None
        self.prices = prices
        self.decoder = Decoder(config.provider, config.model, adapter, self.secrets, prices)
        self.last_error: dict[str, Any] | None = None
        # A local server's own context size, asked once (see llm/local_server.py).
        self.probe_urls = probe_urls(config.provider, adapter.endpoint)
        self.window_asked = not self.probe_urls
        self.server_window: int | None = None
        self.window_lock = threading.Lock()
        #: The shared USD budget this entry's calls spend from (None: none); see call/spend.py.
        self.budget: BudgetGuard | None = None
        #: The limits of each attempt's phases (None: the deadline and timeout only); the
        #: client sets them (call/phases.py).
        self.phases: PhaseLimits | None = None
        #: The credential lookup an adapter needs before its next request, if any (Vertex's
        #: token, Bedrock's AWS credentials): asked each attempt, run by the shell in a
        #: thread of its own, within the call's deadline (llm/credentials.py).
        self.pending: Callable[[], Pending | None] | None = getattr(
            adapter, "pending_refresh", None
        )

    @classmethod
    def configured(
        cls,
        config: ProviderConfig,
        adapter: Adapter,
        envelope: RetryEnvelope,
        pools: Pools,
        *,
        env: Mapping[str, str] | None,
        capability_matrix: Mapping[str, Any] | None,
        strict_schema: bool | None,
        limits: Limits | None,
        prices: Prices | None = None,
    ) -> Entry:
        """An entry from a client's arguments; what they leave out comes from ``env``
        (``os.environ`` when None): FLUID_CAPABILITY_MATRIX's overrides for this model
        (the argument's win), FLUID_OPENAI_STRICT_SCHEMA (OpenAI and Azure only) and
        the size limits."""
        from fluid_build.copilot.call.capabilities import capability_matrix_from_env

        source = os.environ if env is None else env
        matrix = {
            **capability_matrix_from_env(source, config.provider, config.model),
            **dict(capability_matrix or {}),
        }
        if strict_schema is None:
            from fluid_build.copilot.schema.strict import strict_schema_enabled

            strict_schema = strict_schema_enabled(env)
        return cls(
            config,
            adapter,
            envelope,
            limits if limits is not None else Limits.from_env(source),
            matrix,
            strict_schema and adapter.provider in STRICT_SCHEMA_PROVIDERS,
            pools,
            prices,
        )

    @property
    def provider(self) -> str:
        return self.config.provider

    @property
    def model(self) -> str:
        return self.config.model

    @property
    def label(self) -> str:
        """``provider:model``; ``provider:model@endpoint`` where the chain has that pair twice."""
        return self.name or f"{self.provider}:{self.model}"

    def start_warnings(
        self,
        deadline: Deadline,
        *,
        uses_tools: bool,
        wants_strict_schema: bool,
        banner: bool,
        env: Mapping[str, str] | None,
        stream: TextIO | None,
    ) -> list[str]:
        """``LLMClient.run_start_warnings``: this entry's capability warnings for a run."""
        from fluid_build.copilot.call.capabilities import (
            capabilities_for,
            emit_run_start_banner,
            run_start_warnings,
        )
        from fluid_build.copilot.call.preflight import unknown_model_reported

        caps = capabilities_for(self.provider, self.model, self.capability_matrix)
        if not caps.known and self.probe_urls:
            # A local server says its own window: ask now (once per client, as the
            # first call would), so the warning judges the window the run will use.
            window = run(self.window(deadline, None))
            if window is not None:
                matrix = {**self.capability_matrix, "context_window": window}
                caps = capabilities_for(self.provider, self.model, matrix)
        warnings = run_start_warnings(
            caps, uses_tools=uses_tools, wants_strict_schema=wants_strict_schema
        )
        if banner:
            emit_run_start_banner(warnings, env=env, stream=stream)
            if not caps.known:
                unknown_model_reported(caps.provider, caps.model)
        return warnings

    def remember(self, error: AgentExecutionError) -> None:
        """Keep ``error`` as the sticky last error, unless it is the caller's own doing."""
        if error.code not in _CALLER_SIDE:
            self.last_error = {
                "error": type(error).__name__,
                "code": error.code,
                "message": error.message,
                "at": datetime.now(UTC).isoformat(timespec="seconds"),
            }

    def bounds(self, deadline: Deadline) -> CallBounds:
        """What the envelope needs to know about this entry and the call's deadline."""
        return {
            "key": self.key,
            "provider": self.provider,
            "model": self.model,
            "started": deadline.started,
            "deadline": deadline.seconds,
            "narrow": deadline.narrow,
            "secrets": self.secrets,
        }

    # -- the rate-limit budget ----------------------------------------------------------

    def reserved(
        self, request: httpx.Request, spec: CallSpec, deadline: Deadline
    ) -> Plan[tuple[int, bool]]:
        """Wait until the announced budget holds ``request``: (tokens reserved, waited or not)."""
        envelope = self.envelope
        if envelope.limiter is None:
            return 0, False
        tokens = estimate_tokens(request.content, spec.max_output_tokens)
        waited = False
        for wait in envelope.budget_waits(
            self.key, tokens, deadline.left, provider=self.provider, model=self.model
        ):
            waited = True
            yield Sleep(wait, envelope.sleep, envelope.asleep)
        return tokens, waited

    def observed(self, response: httpx.Response) -> None:
        """Keep the budget an answer announced (a 429's too)."""
        if self.envelope.limiter is not None:
            self.envelope.limiter.observe(self.key, response.headers, self.envelope.wall())

    def settled(self, tokens: int, parsed: Parsed) -> None:
        """Correct the reservation by the tokens the answer says it used (when it says)."""
        used = parsed.usage.input_tokens + parsed.usage.output_tokens
        # An absurd count is none: the reservation stands (the store keeps 64-bit integers).
        if self.envelope.limiter is not None and tokens and 0 < used <= 2 * MOST_TOKENS:
            self.envelope.limiter.settle(self.key, tokens, used, self.envelope.wall())

    # -- the window of a local server ------------------------------------------------

    def _wants_window(self, matrix: Mapping[str, Any] | None) -> bool:
        """Whether to ask the server now: once per entry, and only if no window is given."""
        if self.window_asked:
            return False
        given = {**self.capability_matrix, **(matrix or {})}
        if "context_window" in given or given.get("preflight") is False:
            return False
        # A server whose circuit is not closed is not asked: a half-open trial is one request.
        breaker = self.envelope.breaker
        if breaker is None:
            return True
        try:
            return breaker.state(str(self.key)).state == "closed"
        except Exception:  # noqa: BLE001 - a store that cannot say: ask later, never fail
            return False

    def window(self, deadline: Deadline, matrix: Mapping[str, Any] | None) -> Plan[int | None]:
        """The context size the local server reports (None: unknown); never raises."""
        if self._wants_window(matrix):
            # Threads wait for the one asking; the async shell's tasks may both ask.
            release = yield Hold(self.window_lock)
            try:
                if not self.window_asked:
                    self.server_window = yield from asking(
                        self.pools,
                        self.probe_urls,
                        self.model,
                        api_key=self.config.api_key,
                        headers=self.config.headers,
                        deadline_left=deadline.left(),
                    )
                    self.window_asked = True
            finally:
                release()
        return self.server_window

    # -- one call on this entry --------------------------------------------------------

    def ready(self, messages: Messages, options: CallOptions, deadline: Deadline) -> Plan[Prepared]:
        """The call prepared and pre-flighted, inside the deadline."""
        own = self.options.get("capability_matrix") if self.options else None
        window = yield from self.window(deadline, own or options.get("capability_matrix"))
        return self.prepared(messages, options, deadline, window)

    def prepared(
        self, messages: Messages, options: CallOptions, deadline: Deadline, window: int | None
    ) -> Prepared:
        """:meth:`ready` once the window is settled (asked, or nothing to ask): no plan."""
        if self.options:
            options = cast(CallOptions, {**options, **self.options})
        matrix = options.get("capability_matrix")
        fields = sampling(options)
        if "tool_choice" in fields:  # a bad value before what the provider takes
            check_tool_choice(
                fields["tool_choice"], {tool_spec(t).name for t in options.get("tools") or ()}
            )
        if fields:
            fields = unsupported(
                self.provider,
                self.model,
                fields,
                self.refusals(fields, matrix),
                drop=bool(options.get("drop_unsupported")),
            )
        prepared = prepare(
            self.provider,
            self.model,
            messages,
            system=options.get("system"),
            response_model=options.get("response_model"),
            tools=options.get("tools"),
            max_output_tokens=options.get("max_output_tokens"),
            capability_matrix={**self.capability_matrix, **matrix}
            if matrix
            else self.capability_matrix,
            strict_schema=self.strict_schema,
            validate=options.get("validate", True),
            server_window=window,
            count=self.budget is not None,
            sampling=fields,
        )
        if fields or prepared.spec.tool_choice is not None:
            prepared = self.whole(prepared, bool(options.get("drop_unsupported")))
        deadline.check("the pre-flight")
        return prepared

    def whole(self, prepared: Prepared, drop: bool) -> Prepared:
        """``prepared`` without what its provider cannot send beside the rest of the request
        (the adapter's ``refusals``: thinking beside a forced tool ...): refused, or dropped
        under ``drop_unsupported``."""
        spec = prepared.spec
        refused = self.adapter.refusals(spec)
        if not refused:
            return prepared
        unsupported(self.provider, self.model, dict.fromkeys(refused), refused, drop=drop)
        unset: dict[str, Any] = {name: UNSET_FIELDS.get(name) for name in refused}
        return dataclasses.replace(prepared, spec=dataclasses.replace(spec, **unset))

    def refusals(
        self, fields: Mapping[str, Any], matrix: Mapping[str, Any] | None
    ) -> dict[str, str]:
        """The options of ``fields`` this entry cannot send (option -> why): its provider
        has no field for them, or its model refuses them (capabilities' option rules)."""
        from fluid_build.copilot.call.capabilities import option_rules

        takes = self.adapter.supported_options(self.model)
        lacking = [name for name in fields if name in SAMPLING_OPTIONS and name not in takes]
        given = {**self.capability_matrix, **matrix} if matrix else self.capability_matrix
        # An adapter that refuses an option for this model (Gemini 2.0's reasoning_effort)
        # shows a model rule's reason where one explains it: the model and the source.
        explained = option_rules(self.provider, self.model, fields, given) if lacking else {}
        no_field = f"{self.provider} has no such field"
        refused = {name: explained.get(name, no_field) for name in lacking}
        # The model rules judge the call as it would be sent: without what is refused here.
        kept = {name: value for name, value in fields.items() if name not in refused}
        for name, why in option_rules(self.provider, self.model, kept, given).items():
            refused.setdefault(name, why)
        return refused

    def bounded(
        self, deadline: Deadline, prepared: Prepared
    ) -> tuple[CallBounds, BudgetSpend | None]:
        """:meth:`bounds`, with this call's spending when the client has a USD budget."""
        bounds = self.bounds(deadline)
        guard = self.budget
        if guard is None:
            return bounds, None
        # Each attempt reserves the prompt it sends and the most it may answer, priced at
        # this entry's own model (a fallback entry at its own); see docs/budgets.md.
        spend = guard.spend(
            self.provider,
            self.model,
            prepared.input_tokens or 0,
            prepared.most_output_tokens or 0,
            deadline.seconds,
        )
        bounds["spend"] = spend
        return bounds, spend

    def complete(
        self,
        messages: Messages,
        options: CallOptions,
        deadline: Deadline,
        fallback_errors: list[dict[str, Any]] | None,
        trace: AttemptTrace | None = None,
        tally: Tally | None = None,
        move_on: MoveOn | None = None,
    ) -> Plan[Completion]:
        """One answer from this entry, retried by the envelope, after the chain's failures.

        With a ``trace`` (telemetry on), each attempt runs in its own span and
        the envelope reports this call's waits to it. With a ``tally`` (an entry with
        another after it), each failed attempt is kept with what it cost. ``move_on``: a
        later entry can answer, and when to leave this one for it without retrying
        (envelope.py).
        """
        if self.window_asked:  # the common case, without a generator for the window
            prepared = self.prepared(messages, options, deadline, self.server_window)
        else:
            prepared = yield from self.ready(messages, options, deadline)
        pool = yield Pool(self.pools)
        attempt = _Attempt(self, prepared, pool, deadline)
        bounds, spend = self.bounded(deadline, prepared)
        if tally is not None:  # it settles the budget's holds itself, and keeps each failure
            tally.spend = spend
            bounds["spend"] = tally
        attempting: Callable[[], Plan[tuple[Parsed, httpx.Response]]] = attempt
        if trace is not None:
            attempting = trace.attempts(attempt, self.provider, self.model)
            bounds["hook"] = trace.waited
        if move_on is not None:
            bounds["move_on"] = move_on
        plan = self.envelope.plan(attempting, **bounds)
        del bounds  # the plan has its own: not held while the answer comes
        parsed, response = yield from plan
        return self.decoder.completion(
            parsed,
            prepared,
            attempt.count,
            request_id(response),
            answered_by=self.label,
            fallback_errors=fallback_errors,
        )

    def stream(
        self,
        messages: Messages,
        options: CallOptions,
        deadline: Deadline,
        fallback_errors: list[dict[str, Any]] | None = None,
        trace: AttemptTrace | None = None,
        tally: Tally | None = None,
        move_on: MoveOn | None = None,
    ) -> Plan[None]:
        """Emits text deltas and tool-call fragments as they arrive, then a ``done`` event.

        A failure before anything was emitted is retried by the envelope; a
        failure after raises the typed error with ``details["partial_text"]``
        and the tool calls that completed. A stream that ends without its
        provider's end marker (``state.done``: see each adapter's
        ``stream_end``) was cut: ``llm.network_error``, never ``done``. With a
        ``trace``, as in :meth:`complete`; the answering attempt's span lasts
        until the stream ends. The chain around it is :func:`streaming`; with a
        ``tally``, each failed attempt is kept with what it cost as in :meth:`complete`,
        the attempt cut after text among them.
        """
        prepared = yield from self.ready(messages, options, deadline)
        pool = yield Pool(self.pools)
        spec = prepared.spec
        attempts = 0
        decoder = self.decoder

        def opening() -> Plan[
            tuple[httpx.Response, Any, list[StreamEvent], StreamReader, StreamState]
        ]:
            try:
                return (yield from attempt())
            except Exception as exc:
                if pool.is_closed:  # its own client closed the pool under it: no provider failure
                    raise decoder.closed() from exc
                raise

        def attempt() -> Plan[
            tuple[httpx.Response, Any, list[StreamEvent], StreamReader, StreamState]
        ]:
            nonlocal attempts
            deadline.check("the next attempt")
            attempts += 1
            if self.pending is not None and (refresh := self.pending()) is not None:
                yield Blocking(refresh, deadline)
            opened = yield from exchange(may_resend=True)
            if opened is None:
                # The server refused a field the adapter adds by itself (stream_options):
                # asked again without it at once, as the same attempt. A second refusal,
                # or any other error answer, is raised and classified as it is.
                deadline.check("the request without the refused field")
                opened = yield from exchange(may_resend=False)
            assert opened is not None  # without may_resend, an exchange opens or raises
            return opened

        def exchange(
            may_resend: bool,
        ) -> Plan[tuple[httpx.Response, Any, list[StreamEvent], StreamReader, StreamState] | None]:
            state = StreamState()
            wire = self.adapter.request(spec, stream=True)
            timeout, phases = self.config.timeout, self.phases
            request = http_request(pool, wire, deadline, timeout, phases, stream=True)
            _, waited = yield from self.reserved(request, spec, deadline)
            if waited:  # its timeouts are cut to what the deadline leaves now
                deadline.check("the next attempt")
                request = http_request(pool, wire, deadline, timeout, phases, stream=True)
            phase = request.extensions.get(PHASE_EXTENSION)
            try:
                response: httpx.Response = yield Send(pool, request)
            except httpx.TimeoutException as exc:
                raise timed_out(exc, deadline, "the response headers", phase) or exc from exc
            self.observed(response)
            reader = StreamReader(response, deadline, self.limits)
            try:
                if response.is_error:
                    yield ReadBody(response, deadline, self.limits)  # raises, for classification
                chunks = yield Events(reader, self.adapter.stream_format, state)
                while (item := (yield Next(chunks))) is not END:
                    event, data = item
                    first = decoder.chunk(response, state, spec, event, data, started=False)
                    if first:
                        return response, chunks, first, reader, state
                if not state.done:  # nothing for the caller, and no end: retried
                    raise decoder.cut(state, reader, emitted=False, response=response)
                return response, chunks, [], reader, state
            except httpx.HTTPStatusError as exc:
                yield Close(response)
                if may_resend and self.adapter.refused_own_field(spec, exc.response):
                    LOG.info(
                        "%s refused a field fluid_build adds by itself (stream_options); "
                        "asking again without it: this client's streams from it carry no usage",
                        self.label,
                    )
                    return None
                raise
            except httpx.TimeoutException as exc:
                yield Close(response)
                raise timed_out(exc, deadline, reader.reader.where, phase) or exc from exc
            except (httpx.TransportError, OSError) as exc:
                yield Close(response)
                if response.is_error:
                    raise
                if state.done:  # the answer had said it was over: only the connection's end failed
                    return response, chunks, [], reader, state
                # The answer had begun (its head said 200): a cut stream, not a failed connection.
                raise decoder.cut(state, reader, emitted=False, response=response, exc=exc) from exc
            except BaseException:
                yield Close(response)
                raise

        bounds, spend = self.bounded(deadline, prepared)
        if tally is not None:  # as in complete(): it wraps the budget's spending
            tally.spend = spend
            bounds["spend"] = tally
        attempting = opening
        if trace is not None:
            attempting = trace.attempts(opening, self.provider, self.model, holds=True)
            bounds["hook"] = trace.waited
        if move_on is not None:  # a later entry can answer (the chain's): see envelope.py
            bounds["move_on"] = move_on
        response, chunks, first, reader, state = yield from self.envelope.plan(attempting, **bounds)
        failure: Exception | None = None
        try:
            try:
                for item in first:
                    yield Emit(item)
                try:
                    while (pair := (yield Next(chunks))) is not END:
                        event, data = pair
                        for item in decoder.chunk(response, state, spec, event, data, started=True):
                            yield Emit(item)
                except (httpx.HTTPError, OSError) as exc:
                    if pool.is_closed:  # its own client closed the pool under the stream
                        raise decoder.closed(state, reader) from exc
                    # After the end marker only the connection's end failed (a missing last chunk):
                    # the answer is whole.
                    if not state.done:
                        raise decoder.interrupted(exc, state, deadline, reader, response) from exc
                except AgentExecutionError as error:
                    if "interrupted" in error.details:
                        raise
                    raise error.with_details(interrupted=True, **state.partial()) from error
                except Exception as exc:
                    if pool.is_closed:
                        raise decoder.closed(state, reader) from exc
                    raise
                if not state.done:
                    if pool.is_closed:  # the body "ended" as its own client shut the socket
                        raise decoder.closed(state, reader)
                    raise decoder.cut(state, reader, emitted=True, response=response)
            finally:
                yield Close(response)
        except Exception as exc:
            failure = exc
            raise
        finally:
            cost = None
            if spend is not None:
                # Whole or broken, the stream settles what its usage said, else its whole hold.
                cost = spend.finish(state.usage, state.model)
            if tally is not None and failure is not None:
                # The answering attempt broke after text: a failed attempt too, sent, and
                # billed for what its usage said (unknown without a usage or a budget).
                if spend is None and state.usage.total_tokens:
                    cost = price_call(
                        self.provider,
                        self.model,
                        state.usage,
                        answered_model=state.model,
                        overrides=self.prices,
                    )
                tally.failures.append((failure, cost, True))
        completion = decoder.completion(
            state.parsed(),
            prepared,
            attempts,
            request_id(response),
            answered_by=self.label,
            fallback_errors=fallback_errors,
        )
        yield Emit(StreamEvent(type="done", completion=completion))


class _Attempt:
    """One attempt of :meth:`Entry.complete`, the envelope's unit of retry: send the
    request, read the answer, parse it. An object rather than a closure: each call in
    flight holds one object here, not a function and a cell for each name it uses."""

    __slots__ = ("count", "deadline", "entry", "pool", "prepared")

    def __init__(
        self,
        entry: Entry,
        prepared: Prepared,
        pool: httpx.Client | httpx.AsyncClient,
        deadline: Deadline,
    ) -> None:
        self.entry = entry
        self.prepared = prepared
        self.pool = pool
        self.deadline = deadline
        self.count = 0  # attempts made

    def __call__(self) -> Plan[tuple[Parsed, httpx.Response]]:
        entry, prepared, pool, deadline = self.entry, self.prepared, self.pool, self.deadline
        deadline.check("the next attempt")
        self.count += 1
        if entry.pending is not None and (refresh := entry.pending()) is not None:
            yield Blocking(refresh, deadline)
        spec = entry.adapter.request(prepared.spec, stream=False)
        request = http_request(pool, spec, deadline, entry.config.timeout, entry.phases)
        tokens, waited = 0, False
        if entry.envelope.limiter is not None:  # no generator without a limiter
            tokens, waited = yield from entry.reserved(request, prepared.spec, deadline)
        if waited:  # its timeouts are cut to what the deadline leaves now
            deadline.check("the next attempt")
            request = http_request(pool, spec, deadline, entry.config.timeout, entry.phases)
        del spec  # its payload is the request's body now: not held while the answer comes
        exchange = Exchange(pool, request, deadline, entry.limits)
        try:
            done: httpx.Response = yield exchange
        except Exception as exc:
            if pool.is_closed:  # its own client closed the pool under it: no provider failure
                raise entry.decoder.closed() from exc
            if isinstance(exc, httpx.TimeoutException):
                phase = request.extensions.get(PHASE_EXTENSION)
                raise timed_out(exc, deadline, exchange.where, phase) or exc from exc
            if isinstance(exc, httpx.HTTPStatusError):
                entry.observed(exc.response)
            raise
        entry.observed(done)
        try:
            parsed = entry.decoder.answer(done, prepared)
        except AgentExecutionError as error:
            if pool.is_closed:  # a body without a length "ended" as its own client closed it
                raise entry.decoder.closed() from error
            raise
        entry.settled(tokens, parsed)
        return parsed, done


#: What a stream's opening attempt gives: its answer, its events, what they yielded first,
#: its reader and what has arrived.
_Opened = tuple[httpx.Response, Any, list[StreamEvent], StreamReader, StreamState]


# -- the fallback chain ------------------------------------------------------------------


class Tally:
    """The failed attempts of one call on one entry that has another after it, each with
    what it cost, for the answer of a later entry (``Completion.fallback_errors``).

    The envelope's per-attempt :class:`~.envelope.Spend`: a USD budget's own spending
    (``spend``) reserves and settles inside it, and its settled amount is the attempt's
    cost. Without a budget, an attempt that sent nothing or got an error answer cost
    0.0, and one that may have been billed (a timeout after sending, a cut answer) an
    unknown amount (None).
    """

    __slots__ = ("failures", "spend")

    def __init__(self) -> None:
        self.spend: BudgetSpend | None = None
        #: (what the attempt raised, its cost in USD or None, whether a request went out)
        self.failures: list[tuple[BaseException, float | None, bool]] = []

    def reserve(self) -> Any:
        return None if self.spend is None else self.spend.reserve()

    def succeeded(self, hold: Any, result: object) -> None:
        if self.spend is not None:
            self.spend.succeeded(hold, result)

    def failed(self, hold: Any, exc: BaseException, *, sent: bool = True) -> None:
        from fluid_build.copilot.call.spend import nothing_billed

        cost = None if self.spend is None else self.spend.failed(hold, exc, sent=sent)
        if cost is None:  # unmetered: what the answer says about a bill
            cost = 0.0 if not sent or nothing_billed(exc) else None
        self.failures.append((exc, cost, sent))

    def records(self, entry: Entry, error: AgentExecutionError) -> list[dict[str, Any]]:
        """One record per failed attempt, and one for ``error`` (what ended the entry)
        when no attempt of its own raised it (a pre-flight, an open breaker, a budget's
        refusal: nothing sent, nothing spent)."""
        from fluid_build.copilot.agents.error_classification import classify_provider_error

        records: list[dict[str, Any]] = []
        for number, (exc, cost, sent) in enumerate(self.failures, 1):
            # Classified as the envelope did (a typed error is itself); only its kind is kept.
            typed = classify_provider_error(
                exc, provider=entry.provider, model=entry.model, secrets=entry.secrets
            )
            records.append(_record(entry, typed, number, sent, cost))
        last = records[-1] if records else None
        if last is None or (last["error"], last["code"]) != (type(error).__name__, error.code):
            records.append(_record(entry, error, None, False, 0.0))
        return records


def _record(
    entry: Entry, error: AgentExecutionError, attempt: int | None, sent: bool, cost: float | None
) -> dict[str, Any]:
    return {
        "entry": entry.label,
        "attempt": attempt,
        "error": type(error).__name__,
        "code": error.code,
        "sent": sent,
        "cost_usd": cost,
    }
