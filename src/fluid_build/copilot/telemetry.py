"""OpenTelemetry for LLM calls and streams: a span per call, a child span per attempt, metrics.

Optional (``pip install 'fluid-build[otel]'``) and off unless asked for:
``LLMClient(telemetry=True)``, a :class:`Telemetry` of your own, or
``FLUID_OTEL=1``. Until then opentelemetry is never imported and a call runs
exactly as without it.

Names follow OpenTelemetry's GenAI semantic conventions (the call span is
``chat {model}``, kind CLIENT, with ``gen_ai.*`` attributes; the metrics are
``gen_ai.client.operation.duration`` and ``gen_ai.client.token.usage``, and
for a stream ``gen_ai.client.operation.time_to_first_chunk``); what the
conventions do not name is under ``fluid.*``: each attempt's span, the
wait before it and its cause (``retry_after``, ``backoff``, ``cooldown``), the
reason code of a failure, a stream the caller stopped reading. Prompts and
answers are recorded only with ``capture_content=True`` or
``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true``, and then redacted
like every log line; error messages and URLs never are.
See docs/telemetry.md.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, TypeVar

from fluid_build._redact import one_line, redact, truncate
from fluid_build._version import __version__
from fluid_build.config import yes_no
from fluid_build.copilot.agents.errors import AgentExecutionError
from fluid_build.copilot.llm.registry import PROVIDERS
from fluid_build.errors import FluidError

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import Span, TracerProvider

    from fluid_build.copilot.call.core import CallOptions
    from fluid_build.copilot.call.drive import Effect, Plan
    from fluid_build.copilot.call.envelope import RetryEvent
    from fluid_build.copilot.call.prepare import Messages
    from fluid_build.copilot.llm.types import Completion

__all__ = ["CONTENT_ENV", "ENABLE_ENV", "CallTrace", "Telemetry", "telemetry_from"]

# The only thing logged is a warning about FLUID_OTEL: environment parsing.
LOG = logging.getLogger("fluid_build.config")

R = TypeVar("R")

#: Turns telemetry on for every client built from the environment.
ENABLE_ENV = "FLUID_OTEL"
#: OpenTelemetry's own opt-in for prompt and answer content in GenAI spans.
CONTENT_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"

OPERATION = "chat"
# The buckets the GenAI conventions advise for each histogram.
_DURATION_BUCKETS = [0.01 * 2**i for i in range(14)]
_TOKEN_BUCKETS = [4.0**i for i in range(14)]


def provider_name(provider: str) -> str:
    """``gen_ai.provider.name`` for one of fluid's providers: its entry's ``otel_name``.

    The conventions' well-known names (gen_ai.provider.name's list: openai,
    azure.ai.openai, anthropic, gcp.gemini, gcp.vertex_ai, aws.bedrock, x_ai, deepseek,
    groq, mistral_ai, ...); any other provider (together, fireworks, cerebras, ollama, the
    local servers) keeps fluid's own name, as the conventions ask for a system they do
    not list.
    """
    entry = PROVIDERS.get(provider)
    return entry.otel_name if entry is not None and entry.otel_name else provider


class Telemetry:
    """Where a client's spans and metrics go, and whether content is recorded.

    The global tracer and meter providers by default (whatever your
    OpenTelemetry setup installed); pass providers to send elsewhere, as the
    tests do with the SDK's in-memory exporter and reader.
    """

    def __init__(
        self,
        *,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
        capture_content: bool = False,
    ) -> None:
        try:
            from opentelemetry import metrics, trace
        except ImportError as exc:
            raise FluidError(
                "telemetry needs OpenTelemetry: pip install 'fluid-build[otel]'"
            ) from exc
        self.capture_content = capture_content
        self.tracer = trace.get_tracer("fluid_build", __version__, tracer_provider=tracer_provider)
        meter = metrics.get_meter("fluid_build", __version__, meter_provider=meter_provider)
        self.duration = meter.create_histogram(
            "gen_ai.client.operation.duration",
            unit="s",
            description="How long a call took, pre-flight, attempts and waits included",
            explicit_bucket_boundaries_advisory=_DURATION_BUCKETS,
        )
        self.tokens = meter.create_histogram(
            "gen_ai.client.token.usage",
            unit="{token}",
            description="Tokens one answer cost, by gen_ai.token.type (input or output)",
            explicit_bucket_boundaries_advisory=_TOKEN_BUCKETS,
        )
        self.first_chunk = meter.create_histogram(
            "gen_ai.client.operation.time_to_first_chunk",
            unit="s",
            description="How long a stream took to its first event, from the call's start",
            explicit_bucket_boundaries_advisory=_DURATION_BUCKETS,
        )

    def __repr__(self) -> str:
        return f"Telemetry(capture_content={self.capture_content})"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Telemetry | None:
        """A Telemetry if ``FLUID_OTEL`` is true; None (and a warning) without the extra."""
        env = os.environ if env is None else env
        raw = env.get(ENABLE_ENV, "")
        enabled = yes_no(raw)
        if not enabled:
            if enabled is None:
                LOG.warning(
                    "%s=%r is not 1 or 0; telemetry stays off (e.g. %s=1)",
                    ENABLE_ENV,
                    truncate(one_line(raw), 40),
                    ENABLE_ENV,
                )
            return None
        try:
            return cls(capture_content=bool(yes_no(env.get(CONTENT_ENV))))
        except FluidError as error:
            LOG.warning("%s is set but %s; calls are not traced", ENABLE_ENV, error)
            return None

    def call(
        self,
        provider: str,
        model: str,
        messages: Messages,
        options: CallOptions,
        *,
        endpoint: str | None = None,
        secrets: Sequence[str] = (),
        clock: Callable[[], float] = time.monotonic,
    ) -> CallTrace:
        """The trace of one call, to run its plan in (see :meth:`CallTrace.run`)."""
        return CallTrace(self, provider, model, messages, options, endpoint, secrets, clock)


def telemetry_from(
    setting: Telemetry | bool | None, env: Mapping[str, str] | None = None
) -> Telemetry | None:
    """A client's telemetry: the one given, a default one (True), none (False), or the env's."""
    if isinstance(setting, Telemetry):
        return setting
    if setting is None:
        return Telemetry.from_env(env)
    return Telemetry() if setting else None


#: Call options -> the GenAI semantic conventions' request attributes.
_REQUEST_OPTIONS: Final = (
    ("temperature", "gen_ai.request.temperature"),
    ("top_p", "gen_ai.request.top_p"),
    ("stop", "gen_ai.request.stop_sequences"),
    ("seed", "gen_ai.request.seed"),
)


class CallTrace:
    """The spans of one call: its span (:meth:`run`, a stream's :meth:`stream`), one per attempt.

    The call's plan sees it as a ``copilot.call.trace.AttemptTrace`` (its
    :meth:`attempts` and :meth:`waited`), so the call never imports this module.

    :meth:`waited` is the call's retry hook: each wait of the envelope is an
    event on the call span and is put on the next attempt's span.
    """

    def __init__(
        self,
        telemetry: Telemetry,
        provider: str,
        model: str,
        messages: Messages,
        options: CallOptions,
        endpoint: str | None,
        secrets: Sequence[str],
        clock: Callable[[], float],
    ) -> None:
        self.telemetry = telemetry
        self.provider = provider
        self.model = model
        self.messages = messages
        self.options = options
        self.endpoint = endpoint
        self.secrets = tuple(secrets)
        self.clock = clock
        self.span: Span | None = None
        # A stream's answering attempt: its span stays open while the rest of the stream is read.
        self.held: Span | None = None
        self.attempt_count = 0
        self.wait_seconds = 0.0
        self.wait_reason: str | None = None

    def _common(self) -> dict[str, Any]:
        return {
            "gen_ai.operation.name": OPERATION,
            "gen_ai.provider.name": provider_name(self.provider),
            "gen_ai.request.model": self.model,
        }

    def _request_attributes(self) -> dict[str, Any]:
        attributes = self._common()
        if attributes["gen_ai.provider.name"] != self.provider:
            # The conventions' name can be shared (openai and openai_responses): fluid's own
            # name tells them apart on the call span.
            attributes["fluid.provider"] = self.provider
        if self.options.get("max_output_tokens") is not None:
            attributes["gen_ai.request.max_tokens"] = self.options["max_output_tokens"]
        # The sampling options the caller set, as the GenAI conventions name them (what
        # was asked for: an option dropped under drop_unsupported is still shown).
        for option, name in _REQUEST_OPTIONS:
            value = self.options.get(option)
            if value is not None:
                attributes[name] = [value] if option == "stop" and isinstance(value, str) else value
        response_model = self.options.get("response_model")
        attributes["gen_ai.output.type"] = "json" if response_model is not None else "text"
        if self.endpoint:
            import httpx

            url = httpx.URL(self.endpoint)
            if url.host:
                attributes["server.address"] = url.host
                attributes["server.port"] = url.port or (443 if url.scheme == "https" else 80)
        if self.telemetry.capture_content:
            attributes["gen_ai.input.messages"] = self._redacted(_input_messages(self.messages))
            system = self.options.get("system")
            if system:
                attributes["gen_ai.system_instructions"] = self._redacted(
                    [{"type": "text", "content": system}]
                )
        return attributes

    def _redacted(self, value: Any) -> str:
        return redact(json.dumps(value, ensure_ascii=False, default=str), self.secrets)

    # -- the call ------------------------------------------------------------------

    def run(self, plan: Plan[Completion]) -> Plan[Completion]:
        """``plan`` inside the call span, which opens when the plan starts and ends with it."""
        from opentelemetry.trace import SpanKind

        self.span = self.telemetry.tracer.start_span(
            f"{OPERATION} {self.model}", kind=SpanKind.CLIENT, attributes=self._request_attributes()
        )
        started = self.clock()
        try:
            completion = yield from plan
        except BaseException as exc:
            self._call_failed(exc, started)
            raise
        self._answered(completion, max(self.clock() - started, 0.0))
        return completion

    def stream(self, plan: Plan[None]) -> Plan[None]:
        """A stream's ``plan`` inside the call span, which ends when the stream does.

        Answered: usage and finish reason from the ``done`` event. Stopped by
        the caller before it: ``fluid.stream.stopped_early``, no error. The
        plan is stepped by hand, not with ``yield from``: that would turn the
        caller's ``GeneratorExit`` into ``close()``, and the plan's cleanup
        yields an effect (closing the response).
        """
        from opentelemetry.trace import SpanKind

        from fluid_build.copilot.call.drive import Emit

        self.span = span = self.telemetry.tracer.start_span(
            f"{OPERATION} {self.model}", kind=SpanKind.CLIENT, attributes=self._request_attributes()
        )
        started = self.clock()
        first = True
        done: Completion | None = None
        send: Callable[[Any], Effect | Emit[Any]] = plan.send
        value: Any = None
        try:
            while True:
                try:
                    step = send(value)
                except StopIteration:
                    break
                if isinstance(step, Emit):
                    if first:
                        first = False
                        waited = max(self.clock() - started, 0.0)
                        span.set_attribute("gen_ai.response.time_to_first_chunk", waited)
                        self.telemetry.first_chunk.record(waited, self._common())
                    if step.item.type == "done":
                        done = step.item.completion
                    elif step.item.type == "restart":  # on_cut="restart": the text so far is void
                        span.add_event(
                            "fluid.stream.restart",
                            {
                                "fluid.error.code": step.item.code or "",
                                "fluid.restart.entry": step.item.entry or "",
                            },
                        )
                try:
                    value = yield step
                    send = plan.send
                except BaseException as exc:  # noqa: BLE001 - the plan decides, as in the shells
                    value, send = exc, plan.throw
        except GeneratorExit:
            if done is None:  # the caller stopped reading: not a failure
                span.set_attribute("fluid.stream.stopped_early", True)
                self._end()
                self.telemetry.duration.record(max(self.clock() - started, 0.0), self._common())
            else:
                self._answered(done, max(self.clock() - started, 0.0))
            raise
        except BaseException as exc:
            self._call_failed(exc, started)
            raise
        if done is None:  # typed so, but the plan's last event is always a done with one
            self._end()
        else:
            self._answered(done, max(self.clock() - started, 0.0))

    def _call_failed(self, exc: BaseException, started: float) -> None:
        span = self.span
        assert span is not None
        error_type, code, typed = self._typed(exc, self.provider, self.model)
        if self.held is not None:
            self._attempt_failed(self.held, error_type, code, typed)
        self._failed(span, error_type, code)
        self._end()
        metric = {**self._common(), "error.type": error_type}
        self.telemetry.duration.record(max(self.clock() - started, 0.0), metric)

    def _end(self) -> None:
        """End the call span (and a stream's held attempt span), with the attempts made."""
        span = self.span
        assert span is not None
        if self.held is not None:
            self.held.end()
            self.held = None
        span.set_attribute("fluid.attempts", self.attempt_count)
        span.end()

    def _answered(self, completion: Completion, seconds: float) -> None:
        span = self.span
        assert span is not None
        usage = completion.usage
        span.set_attributes(
            {
                "gen_ai.response.model": completion.model,
                "gen_ai.usage.input_tokens": usage.input_tokens,
                "gen_ai.usage.output_tokens": usage.output_tokens,
            }
        )
        if completion.finish_reason:
            span.set_attribute("gen_ai.response.finish_reasons", [completion.finish_reason])
        if completion.answered_by:
            span.set_attribute("fluid.answered_by", completion.answered_by)
        # USD (docs/budgets.md); left off when no price is known rather than a false 0.
        if completion.cost_usd is not None:
            span.set_attribute("fluid.cost_usd", completion.cost_usd)
        if self.telemetry.capture_content:
            output = [
                {
                    "role": "assistant",
                    "parts": [{"type": "text", "content": completion.text}],
                    "finish_reason": completion.finish_reason,
                }
            ]
            span.set_attribute("gen_ai.output.messages", self._redacted(output))
        self._end()
        metric = {**self._common(), "gen_ai.response.model": completion.model}
        self.telemetry.duration.record(seconds, metric)
        for kind, count in (("input", usage.input_tokens), ("output", usage.output_tokens)):
            self.telemetry.tokens.record(count, {**metric, "gen_ai.token.type": kind})

    # -- its attempts --------------------------------------------------------------

    def attempts(
        self, attempt: Callable[[], Plan[R]], provider: str, model: str, *, holds: bool = False
    ) -> Callable[[], Plan[R]]:
        """``attempt`` (the envelope's unit of retry) with a span around each run of it.

        ``holds``: a stream's attempt returns at its first event; the span of
        the one that does stays open until the stream ends (see :meth:`stream`).
        """
        return lambda: self._attempt(attempt, provider, model, holds)

    def _attempt(
        self, attempt: Callable[[], Plan[R]], provider: str, model: str, holds: bool
    ) -> Plan[R]:
        from opentelemetry.trace import set_span_in_context

        self.attempt_count += 1
        attributes: dict[str, Any] = {
            "fluid.attempt": self.attempt_count,
            "gen_ai.provider.name": provider_name(provider),
            "gen_ai.request.model": model,
            "fluid.wait.seconds": self.wait_seconds,
        }
        if self.wait_reason is not None:
            attributes["fluid.wait.reason"] = self.wait_reason
        self.wait_seconds, self.wait_reason = 0.0, None
        parent = None if self.span is None else set_span_in_context(self.span)
        span = self.telemetry.tracer.start_span("fluid.attempt", parent, attributes=attributes)
        try:
            result = yield from attempt()
        except BaseException as exc:
            self._attempt_failed(span, *self._typed(exc, provider, model))
            span.end()
            raise
        if holds:
            self.held = span
        else:
            span.end()
        return result

    def cut(self, error: BaseException) -> None:
        """The held attempt's stream was cut and the call starts again: end its span, failed."""
        held, self.held = self.held, None
        if held is not None:
            self._attempt_failed(held, *self._typed(error, self.provider, self.model))
            held.end()

    def _attempt_failed(
        self, span: Span, error_type: str, code: str | None, typed: AgentExecutionError | None
    ) -> None:
        self._failed(span, error_type, code)
        if typed is not None:
            status = getattr(typed, "status_code", None)
            if isinstance(status, int):
                span.set_attribute("http.response.status_code", status)
            if typed.retry_after is not None:
                span.set_attribute("fluid.error.retry_after", typed.retry_after)
            span.set_attribute("fluid.error.retryable", typed.retryable)

    def waited(self, event: RetryEvent) -> None:
        """The retry hook of this call: the wait goes on the call span and the next attempt."""
        self.wait_seconds += event.wait
        if self.wait_reason is None:
            self.wait_reason = event.reason  # the cause; a cooldown after it adds seconds only
        if self.span is not None:
            self.span.add_event(
                "fluid.wait",
                {
                    "fluid.wait.seconds": event.wait,
                    "fluid.wait.reason": event.reason,
                    "fluid.attempt": self.attempt_count,
                },
            )

    # -- errors --------------------------------------------------------------------

    def _typed(
        self, exc: BaseException, provider: str, model: str
    ) -> tuple[str, str | None, AgentExecutionError | None]:
        """``error.type``, the reason code, and the typed error a raw failure classifies as.

        The envelope classifies the same exception right after; classifying
        here too keeps the span independent of whether a retry follows.
        """
        if not isinstance(exc, Exception):  # cancelled, interrupted
            return type(exc).__name__, "llm.cancelled", None
        from fluid_build.copilot.agents.error_classification import classify_provider_error

        typed: FluidError = (
            exc
            if isinstance(exc, FluidError)
            else classify_provider_error(exc, provider=provider, model=model, secrets=self.secrets)
        )
        if isinstance(typed, AgentExecutionError):
            return type(typed).__name__, typed.code, typed
        return type(typed).__name__, None, None

    @staticmethod
    def _failed(span: Span, error_type: str, code: str | None) -> None:
        from opentelemetry.trace import Status, StatusCode

        span.set_attribute("error.type", error_type)
        if code is not None:
            span.set_attribute("fluid.error.code", code)
        # The code, never the message: a status description is shown everywhere.
        span.set_status(Status(StatusCode.ERROR, code or error_type))


def _input_messages(messages: Messages) -> list[dict[str, Any]]:
    """The prompt in the conventions' shape: ``[{"role", "parts": [{"type", "content"}]}]``."""
    if isinstance(messages, str):
        return [{"role": "user", "parts": [{"type": "text", "content": messages}]}]
    shaped = []
    for message in messages:
        content = message.get("content")
        part = (
            {"type": "text", "content": content}
            if isinstance(content, str)
            else {"type": "content", "content": content}
        )
        shaped.append({"role": message.get("role", "user"), "parts": [part]})
    return shaped
