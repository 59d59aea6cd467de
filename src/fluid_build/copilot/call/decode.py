"""The last stage of a call: an answer (or a stream's chunks) read into a Completion.

A shape the adapter cannot read is ``llm.malformed_response`` naming the
first field that does not fit; an error carried in a 200 body or a stream
chunk is classified as the error it is; the text is validated against the
response model (``SchemaValidationError``, ``llm.parse_error`` for non-JSON).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from fluid_build._redact import one_line, redact, truncate
from fluid_build.copilot.agents.errors import (
    AgentExecutionError,
    ProviderError,
    SchemaValidationError,
)
from fluid_build.copilot.call.phases import Phase
from fluid_build.copilot.call.prepare import Prepared, response_schema
from fluid_build.copilot.call.prices import Prices, price_call
from fluid_build.copilot.call.wire import Deadline, StreamReader, decode_json
from fluid_build.copilot.llm.base import Adapter, Parsed, StreamState, first_wrong_field
from fluid_build.copilot.llm.types import CallSpec, Completion, StreamEvent

if TYPE_CHECKING:
    from fluid_build.copilot.schema.strict import StrictSchema

__all__ = ["Decoder", "request_id", "timed_out"]


def timed_out(
    exc: httpx.TimeoutException, deadline: Deadline, where: str, phase: Phase | None = None
) -> AgentExecutionError | None:
    """The deadline's error when it, not the attempt's own timeout, cut ``exc`` short; else
    the phase's (call/phases.py) whose limit did; else None (the attempt's own timeout)."""
    if deadline.left() > 0.05:
        if phase is not None:
            if isinstance(exc, httpx.ConnectTimeout):
                return phase.error(deadline.provider, deadline.model, connect=True)
            # Every read's wait is the phase's (or the deadline's, above): a read that timed
            # out is the phase's limit, whichever layer noticed it first.
            if not isinstance(exc, httpx.PoolTimeout | httpx.WriteTimeout):
                return phase.error(deadline.provider, deadline.model)
        return None
    if isinstance(exc, httpx.ConnectTimeout | httpx.PoolTimeout):
        where = "a connection"
    elif isinstance(exc, httpx.WriteTimeout):
        where = "the request to be sent"
    return deadline.passed(where)


_REQUEST_ID_HEADERS: Final = (b"x-request-id", b"request-id", b"apim-request-id")
#: What an adapter's reading of an answer raises on a shape it does not expect (pydantic's
#: ValidationError is a ValueError; OverflowError: a number such as 1e400 where a count
#: goes; RecursionError: nesting deeper than the reader goes): llm.malformed_response.
_MISREAD: Final = (
    AttributeError,
    KeyError,
    TypeError,
    ValueError,
    IndexError,
    ArithmeticError,
    RecursionError,
)


def _string(value: Any) -> str:
    return value if isinstance(value, str) else ""


_Read = TypeVar("_Read", Parsed, StreamState)


def _tidy(read: _Read) -> _Read:
    """``read`` (a Parsed, a StreamState) with a model name or finish reason that is not a
    string (``"model": 1``) dropped: an adapter passes them on as sent, and prices, budgets
    and the Completion take names."""
    if not isinstance(read.model, str):
        read.model = None
    if not isinstance(read.finish_reason, str):
        read.finish_reason = None
    return read


def _characters(state: StreamState) -> int:
    return sum(map(len, state.text))


def _snapshot(state: StreamState, reader: StreamReader) -> dict[str, int]:
    """How much of a stream had arrived, for an error's details."""
    return {
        "events_received": reader.events,
        "characters_received": _characters(state),
        "received_bytes": reader.reader.size,
    }


def _received(state: StreamState, events: int) -> str:
    """How much of a stream had arrived, as "3 events / 9 characters"."""
    characters = _characters(state)
    return (
        f"{events} event{'' if events == 1 else 's'} / "
        f"{characters} character{'' if characters == 1 else 's'}"
    )


def request_id(response: httpx.Response) -> str | None:
    """The provider's id of the request, for a support ticket.

    One pass over the raw headers: each ``Headers.get`` would scan them all.
    """
    found: dict[bytes, list[bytes]] = {}
    for name, value in response.headers.raw:
        lowered = name.lower()
        if lowered in _REQUEST_ID_HEADERS:
            found.setdefault(lowered, []).append(value)
    encoding = response.headers.encoding
    for name in _REQUEST_ID_HEADERS:
        joined = ", ".join(v.decode(encoding) for v in found.get(name, ()))
        if joined:
            return joined
    return None


class Decoder:
    """Reads one provider's answers for one model; the request's key never reaches an error."""

    __slots__ = ("adapter", "model", "prices", "provider", "secrets")

    def __init__(
        self,
        provider: str,
        model: str,
        adapter: Adapter,
        secrets: Sequence[str],
        prices: Prices | None = None,
    ):
        self.provider = provider
        self.model = model
        self.adapter = adapter
        self.secrets = tuple(secrets)
        # The user's prices (prices=, FLUID_PRICES); genai-prices' otherwise.
        self.prices = prices

    def answer(self, response: httpx.Response, prepared: Prepared) -> Parsed:
        """A whole answer's body, parsed by the adapter."""
        data = decode_json(
            response.content,
            provider=self.provider,
            model=self.model,
            status=response.status_code,
        )
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
        # A Responses API answer always carries "error": null: only a set error is one.
        if data.get("error") is not None and not data.get("choices") and not data.get("candidates"):
            from fluid_build.copilot.agents.error_classification import classify_response

            raise classify_response(response, provider=self.provider, model=self.model)
        try:
            return _tidy(self.adapter.parse(data, prepared.spec))
        except AgentExecutionError:
            raise
        except _MISREAD as exc:
            raise self.misshapen(data, self.adapter.shape, "answer", response.status_code) from exc

    def misshapen(
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

    def chunk(
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
            from fluid_build.copilot.agents.error_answers import request_secrets_of
            from fluid_build.copilot.agents.error_classification import (
                ErrorAnswer,
                classify_answer,
            )

            asked = response.request
            answer = ErrorAnswer.of_json(
                200,
                data,
                provider=self.provider,
                model=self.model,
                url=asked.url,
                secrets=request_secrets_of(asked),
            )
            error = classify_answer(answer)
            raise error.with_details(interrupted=True, **state.partial()) if started else error
        try:
            return self.adapter.parse_chunk(data, event, state, spec)
        except AgentExecutionError:
            raise
        except _MISREAD as exc:
            misshapen = self.misshapen(data, self.adapter.chunk_shape, "event", None)
            if started:
                misshapen = misshapen.with_details(interrupted=True, **state.partial())
            raise misshapen from exc
        finally:
            _tidy(state)

    def interrupted(
        self,
        exc: BaseException,
        state: StreamState,
        deadline: Deadline,
        reader: StreamReader,
        response: httpx.Response | None = None,
    ) -> AgentExecutionError:
        """The typed error of a stream cut off after the caller had events.

        A connection that failed is :meth:`cut` (it had answered); a timeout,
        the deadline or anything else keeps its own error, which says where
        the stream stopped too.
        """
        error: AgentExecutionError | None = None
        if isinstance(exc, httpx.TimeoutException):
            error = timed_out(exc, deadline, reader.reader.where, reader.reader.phase)
        if error is None:
            error = self.classified(exc)
        if error.code == "llm.network_error":
            return self.cut(state, reader, emitted=True, response=response, exc=exc, error=error)
        return error.with_details(
            note=f"the stream stopped after {_received(state, reader.events)}",
            **_snapshot(state, reader),
            interrupted=True,
            **state.partial(),
        )

    def cut(
        self,
        state: StreamState,
        reader: StreamReader,
        *,
        emitted: bool,
        response: httpx.Response | None = None,
        exc: BaseException | None = None,
        error: AgentExecutionError | None = None,
    ) -> ProviderError:
        """A stream that ended before its provider's end marker: ``llm.network_error``.

        The connection closed (``exc`` None) or failed (``exc``; ``error``, what
        it is classified as) after ``reader.events`` events. Retryable: the
        answer never finished. Once the caller had events (``emitted``) the
        error carries what had arrived, as :meth:`interrupted` does; before,
        the envelope retries it.
        """
        who = f"{self.provider} ({self.model})"
        end = self.adapter.stream_end
        details: dict[str, Any] = {}
        if exc is None:
            how = f"the connection closed before {end}"
        else:
            text = ""
            with contextlib.suppress(Exception):  # a hostile __str__
                text = str(exc)
            how = truncate(one_line(redact(text, self.secrets)), 300) or type(exc).__name__
            details.update((error or self.classified(exc)).details)  # the exception, the URL
        details.update(_snapshot(state, reader))
        if emitted:
            details.update(interrupted=True, **state.partial())
        before = "" if emitted else ", before any of it reached the caller"
        return ProviderError(
            f"the stream from {who} was cut after {_received(state, reader.events)}{before}: {how}",
            provider=self.provider,
            model=self.model,
            request_id=None if response is None else request_id(response),
            code="llm.network_error",
            retryable=True,
            details=details,
            secrets=self.secrets,
        )

    def closed(
        self,
        state: StreamState | None = None,
        reader: StreamReader | None = None,
    ) -> ProviderError:
        """``llm.client_closed``: the call's own client closed its pool while the call was in
        flight. Not the provider's doing: not retryable, and (no code of
        :data:`~fluid_build.copilot.agents.errors.BREAKER_CODES`) never counted against its
        breaker, cooldown or rate limit. A stream that had reached the caller keeps what
        arrived, as :meth:`interrupted` does."""
        details: dict[str, Any] = {}
        when = "in flight"
        if state is not None and reader is not None:
            details.update(_snapshot(state, reader), interrupted=True, **state.partial())
            when = f"after {_received(state, reader.events)} of its stream"
        return ProviderError(
            f"the call to {self.provider} ({self.model}) was ended {when} by its own client: "
            "close() or aclose() closed the client's connections; not the provider's doing, "
            "so it is neither retried nor counted against the provider",
            provider=self.provider,
            model=self.model,
            code="llm.client_closed",
            retryable=False,
            details=details,
        )

    def classified(self, exc: BaseException) -> AgentExecutionError:
        """``exc`` as its typed error (and redacted in place: it is chained to what is raised)."""
        from fluid_build.copilot.agents.error_classification import classify_provider_error

        return classify_provider_error(
            exc, provider=self.provider, model=self.model, secrets=self.secrets
        )

    def completion(
        self,
        parsed: Parsed,
        prepared: Prepared,
        attempts: int,
        request: str | None,
        *,
        answered_by: str | None = None,
        fallback_errors: list[dict[str, Any]] | None = None,
    ) -> Completion:
        """The call's result; the text validated unless this turn calls tools.

        ``answered_by`` and ``fallback_errors`` (a completed call's, not a
        stream's) go into the one constructor call.
        """
        value: Any = None
        # A turn that calls tools has no final answer to validate yet.
        if prepared.response_model is not None and prepared.validate and not parsed.tool_calls:
            value = self.validated(parsed.text, prepared.response_model, prepared.strict)
        return Completion(
            text=parsed.text,
            parsed=value,
            tool_calls=parsed.tool_calls,
            usage=parsed.usage,
            cost_usd=price_call(
                self.provider,
                self.model,
                parsed.usage,
                answered_model=parsed.model,
                overrides=self.prices,
            ),
            provider=self.provider,
            # An adapter passes these on as the provider sent them: what is not a string
            # (a finish reason as an enum number fluid does not know) is not kept.
            model=_string(parsed.model) or self.model,
            finish_reason=_string(parsed.finish_reason) or None,
            attempts=attempts,
            request_id=request,
            answered_by=answered_by,
            fallback_errors=fallback_errors or [],
            details=parsed.details,
        )

    def validate(self, text: str, response_model: type[BaseModel], strict_schema: bool) -> Any:
        """``text`` validated against ``response_model`` (strict-schema fields decoded first)."""
        strict = response_schema(response_model, True)[1] if strict_schema else None
        return self.validated(text, response_model, strict)

    def validated(self, text: str, model: type[BaseModel], strict: StrictSchema | None) -> Any:
        """``text`` parsed as JSON, decoded from the strict shape, validated into ``model``."""
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
                secrets=self.secrets,
            ) from None
        if strict is not None:
            data = strict.decode(data)
        try:
            return model.model_validate(data)
        except ValidationError as exc:
            raise SchemaValidationError.from_pydantic(
                exc, schema_name=model.__name__, raw_output=text, secrets=self.secrets
            ) from None
