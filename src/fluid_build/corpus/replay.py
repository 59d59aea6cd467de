"""Replay: a cassette served offline to the real client, and the verdict.

Replaying runs the recipe through :class:`~fluid_build.copilot.client.LLMClient`,
the retry envelope and the agent loop exactly as a live call would, with the
network replaced by :class:`ReplayTransport` and the clock by
:class:`VirtualClock`, then judges what happened against ``expect``::

    cassette = load_cassette("corpus/openai-rate-limit-retry.json")
    result = run_cassette(cassette)        # ReplayResult(ok=..., mismatches=[...])
    client = replay_client(cassette)       # an LLMClient answering from the cassette

``CallRecipe``, ``DataProduct``, ``Plan``, ``load_cassette`` (from
:mod:`fluid_build.corpus.cassette`) and ``Recorder`` (from
:mod:`fluid_build.corpus.record`) are exported here too: docs/corpus.md showed
them imported from this module. See docs/corpus.md.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Final

import httpx

from fluid_build._redact import one_line, redact, redact_json, truncate
from fluid_build.corpus.cassette import (
    CallRecipe,
    Cassette,
    DataProduct,
    Exchange,
    ExchangeRequest,
    ExchangeResponse,
    Plan,
    is_dropped_header,
    load_cassette,
    summarize_request,
)
from fluid_build.corpus.compare import (
    NOT_SET,
    SHOWN_CHARS,
    ReplayMismatch,
    body_difference,
    compared_body,
    request_settings,
    settings_difference,
    shown_pair,
)
from fluid_build.corpus.record import Recorder
from fluid_build.corpus.run import Clock, recipe_client, run_recipe
from fluid_build.errors import FluidError

if TYPE_CHECKING:
    from fluid_build.copilot.client import LLMClient

__all__ = [
    "REPLAY_KEY",
    "CallRecipe",
    "DataProduct",
    "Plan",
    "Recorder",
    "ReplayBodyOmitted",
    "ReplayResult",
    "ReplayTransport",
    "VirtualClock",
    "load_cassette",
    "replay_client",
    "run_cassette",
]

#: The API key a replayed client sends; it reaches no provider.
REPLAY_KEY: Final = "replay-key"
#: Waits are compared with this tolerance, in seconds.
WAIT_TOLERANCE: Final = 1e-6


class ReplayBodyOmitted(FluidError):
    """A replayed call reached an answer whose body was not recorded (``bodies=False``).

    The replay stops there: what came before (requests, waits) was checked.
    """


def _served(record: ExchangeResponse, request: httpx.Request) -> httpx.Response:
    headers = httpx.Headers({k: v for k, v in record.headers.items() if not is_dropped_header(k)})
    if record.body is not None and record.body_text is None and record.body_base64 is None:
        headers.setdefault("content-type", "application/json")
    return httpx.Response(record.status, headers=headers, content=record.content(), request=request)


def _request_json(request: httpx.Request) -> Any:
    try:
        return json.loads(request.content) if request.content else None
    except (ValueError, RecursionError, httpx.RequestNotRead):
        return None


def _setting_text(value: Any) -> str:
    """A setting as an operator reads it: JSON (``0.0``, ``["END"]``), redacted, cut short."""
    return truncate(one_line(redact(json.dumps(value, ensure_ascii=False))), SHOWN_CHARS)


# -- the transport ------------------------------------------------------------------


class ReplayTransport(httpx.BaseTransport, httpx.AsyncBaseTransport):
    """Serves a cassette's exchanges in order, sync or async; refuses anything else.

    Each request must match the next exchange's method, path, (when the
    cassette names one) model, the call settings recorded (temperature, seed,
    answer length ...: :func:`settings_difference`, from the body when it is
    kept) and (when the cassette holds it) the conversation in its body
    (:func:`compared_body`); a mismatch or a request
    past the last exchange raises :class:`ReplayMismatch`, whose reason is kept
    in :attr:`mismatches` and the error itself in :attr:`errors`. :attr:`seen`
    holds every request received. An answer recorded without its body raises
    :class:`ReplayBodyOmitted`; :attr:`omitted_at` is the index of the first
    such exchange reached.
    """

    def __init__(self, exchanges: Sequence[Exchange]) -> None:
        self.exchanges = list(exchanges)
        self.seen: list[httpx.Request] = []
        self.mismatches: list[str] = []
        self.errors: list[ReplayMismatch] = []
        self.omitted_at: int | None = None
        self._lock = threading.Lock()

    @property
    def unused(self) -> int:
        """Exchanges no request has asked for yet."""
        return max(len(self.exchanges) - len(self.seen), 0)

    @property
    def first_mismatch(self) -> ReplayMismatch | None:
        """The first request that differed from the cassette, as the error raised for it."""
        with self._lock:
            return self.errors[0] if self.errors else None

    def finish(self) -> None:
        """Raise the first mismatch, or one naming the first exchange never requested.

        Call it when the run is over: a replay that stopped short of the
        cassette's end did not do what the recording did.
        """
        first = self.first_mismatch
        if first is not None:
            raise first
        if self.unused:
            index = len(self.seen)
            want = self.exchanges[index].request
            expected = f"{want.method.upper()} {want.path}"
            raise ReplayMismatch(
                f"request {index + 1} ({expected}) was never sent: the run ended after "
                f"{index} request(s) and the cassette holds {len(self.exchanges)}",
                index=index + 1,
                field="request",
                expected=expected,
                got="(none: the run ended)",
            )

    def _fail(
        self,
        reason: str,
        *,
        index: int,
        field: str,
        expected: str,
        got: str,
    ) -> ReplayMismatch:
        error = ReplayMismatch(reason, index=index, field=field, expected=expected, got=got)
        with self._lock:
            self.mismatches.append(reason)
            self.errors.append(error)
        return error

    def _check_settings(self, number: int, want: ExchangeRequest, sent: Any) -> None:
        """Refuse a request whose call settings (temperature, seed, answer length ...)
        are not the recorded ones; a cassette that kept neither them nor the body
        (recorded before they were kept) is not compared."""
        if want.settings is not None:
            recorded = want.settings
        elif want.body is not None:
            recorded = request_settings(want.body)
        else:
            return
        found = settings_difference(recorded, request_settings(sent))
        if found is None:
            return
        option, path, expected, got = found
        shown_expected, shown_got = (
            NOT_SET if value == NOT_SET else _setting_text(value) for value in (expected, got)
        )
        raise self._fail(
            f"request {number} differs: {option} (body.{path}): the cassette was recorded "
            f"with {shown_expected}, the client sent {shown_got}; replay with the options it "
            "was recorded with, or record it again",
            index=number,
            field=f"body.{path}",
            expected=shown_expected,
            got=shown_got,
        )

    def _serve(self, request: httpx.Request) -> httpx.Response:
        with self._lock:
            index = len(self.seen)
            self.seen.append(request)
        got = summarize_request(request)
        number = index + 1
        if index >= len(self.exchanges):
            raise self._fail(
                f"request {number} ({got.method} {got.path}) is extra: the cassette holds "
                f"{len(self.exchanges)} exchange(s)",
                index=number,
                field="request",
                expected=f"none (the cassette holds {len(self.exchanges)} exchange(s))",
                got=f"{got.method} {got.path}",
            )
        want = self.exchanges[index].request
        if (want.method.upper(), want.path) != (got.method, got.path):
            raise self._fail(
                f"request {number}: the cassette expects {want.method.upper()} {want.path}, "
                f"the client sent {got.method} {got.path}",
                index=number,
                field="method" if want.method.upper() != got.method else "path",
                expected=f"{want.method.upper()} {want.path}",
                got=f"{got.method} {got.path}",
            )
        if want.model is not None and want.model != got.model:
            raise self._fail(
                f"request {number}: the cassette expects model {want.model!r}, "
                f"the client sent {got.model!r}",
                index=number,
                field="model",
                expected=truncate(want.model, SHOWN_CHARS),
                got=truncate(redact(str(got.model)), SHOWN_CHARS),
            )
        sent = redact_json(_request_json(request))
        self._check_settings(number, want, sent)
        if want.body is not None:
            found = body_difference(compared_body(want.body), compared_body(sent))
            if found is not None:
                where, expected, actual = found
                shown_expected, shown_got = shown_pair(expected, actual)
                raise self._fail(
                    f"request {number}: the request differs at {where}: the cassette expects "
                    f"{shown_expected!r}, the client sent {shown_got!r}",
                    index=number,
                    field=where,
                    expected=shown_expected,
                    got=shown_got,
                )
        response = self.exchanges[index].response
        if response.omitted:
            if self.omitted_at is None:
                self.omitted_at = index
            raise ReplayBodyOmitted(
                f"request {index + 1}: the answer (HTTP {response.status}) was recorded without "
                "its body; replay checks the exchanges up to here"
            )
        return _served(response, request)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        request.read()
        return self._serve(request)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        await request.aread()
        return self._serve(request)


# -- the clock ----------------------------------------------------------------------


class VirtualClock:
    """Wall-clock seconds that move only when slept on; every wait is kept in :attr:`waits`."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.now = start
        self.waits: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.now += seconds

    async def asleep(self, seconds: float) -> None:
        self.sleep(seconds)

    def __repr__(self) -> str:
        return f"VirtualClock(now={self.now!r}, waits={self.waits!r})"


# -- replaying and judging ------------------------------------------------------------


def _replay_client(
    cassette: Cassette,
    clock: Clock,
    http: httpx.Client,
    ahttp: httpx.AsyncClient | None = None,
) -> LLMClient:
    return recipe_client(
        provider=cassette.provider,
        model=cassette.model,
        api_key=REPLAY_KEY,
        env=dict(cassette.call.env),
        strict_schema=cassette.call.strict_schema,
        capability_matrix=cassette.call.capability_matrix,
        clock=clock,
        http=http,
        ahttp=ahttp,
    )


def replay_client(cassette: Cassette, *, clock: VirtualClock | None = None) -> LLMClient:
    """An :class:`LLMClient` whose provider is the cassette: no network, no real sleeping.

    The key is :data:`REPLAY_KEY`, the environment is the recipe's, the retry
    envelope runs on ``clock`` (a fresh :class:`VirtualClock` by default) with
    an in-memory cooldown and no jitter.
    """
    transport = ReplayTransport(cassette.exchanges)
    return _replay_client(
        cassette,
        clock or VirtualClock(),
        httpx.Client(transport=transport),
        httpx.AsyncClient(transport=transport),
    )


def _describe(error: BaseException) -> str:
    code = getattr(error, "code", None)
    label = type(error).__name__ + (f" [{code}]" if isinstance(code, str) else "")
    # An AgentExecutionError's str() repeats the code and adds the operator's advice:
    # the label has the code, and what happened is its summary.
    text = getattr(error, "summary", None) if isinstance(code, str) else None
    return f"{label}: {truncate(one_line(redact(str(text or error))), 300)}"


def _missing_extra(error: BaseException | None) -> str | None:
    """The install line when ``error`` says the provider's optional extra is not installed
    (``pip install 'fluid-build[bedrock]'``), else None."""
    details = getattr(error, "details", None)
    if getattr(error, "code", None) != "llm.not_configured" or not isinstance(details, dict):
        return None
    install = details.get("install")
    return install if isinstance(install, str) and install else None


def _first_difference(expected: Any, actual: Any, where: str = "$") -> str | None:
    """Where two JSON values differ (floats within the tolerance), or None."""
    if isinstance(expected, bool) or isinstance(actual, bool):
        same = type(expected) is type(actual) and expected == actual
        return None if same else where
    if isinstance(expected, int | float) and isinstance(actual, int | float):
        return None if math.isclose(expected, actual, abs_tol=WAIT_TOLERANCE) else where
    if isinstance(expected, dict) and isinstance(actual, dict):
        for key in sorted(set(expected) | set(actual), key=str):
            if key not in expected or key not in actual:
                return f"{where}.{key}"
            found = _first_difference(expected[key], actual[key], f"{where}.{key}")
            if found:
                return found
        return None
    if isinstance(expected, list) and isinstance(actual, list):
        if len(expected) != len(actual):
            return f"{where} (length {len(expected)} vs {len(actual)})"
        for i, (a, b) in enumerate(zip(expected, actual, strict=True)):
            found = _first_difference(a, b, f"{where}[{i}]")
            if found:
                return found
        return None
    return None if expected == actual else where


def _short(value: Any) -> str:
    return truncate(json.dumps(value, ensure_ascii=False, default=str), 120)


def _fmt_waits(waits: Sequence[float]) -> str:
    return "[" + ", ".join(f"{w:g}" for w in waits) + "]"


@dataclass
class ReplayResult:
    """How one cassette replayed: ``ok`` when nothing differed from ``expect``."""

    name: str
    ok: bool
    mismatches: list[str]
    outcome: str
    attempts: int
    waits: list[float]
    error: str | None
    provider: str = ""
    path: str | None = None
    output: Any = field(default=None, repr=False)
    #: Why the cassette was not replayed (an optional extra not installed), or None.
    skipped: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _judge(
    cassette: Cassette,
    transport: ReplayTransport,
    clock: Clock,
    output: Any,
    error: BaseException | None,
) -> ReplayResult:
    if transport.omitted_at is not None:
        return _judge_flow(cassette, transport, clock)
    expect = cassette.expect
    problems = list(transport.mismatches)
    if expect.outcome == "success":
        if error is not None:
            problems.append(f"expected success, got {_describe(error)}")
        elif expect.output is not None:
            where = _first_difference(expect.output, output)
            if where is not None:
                problems.append(
                    f"output differs at {where}: expected {_short(expect.output)}, "
                    f"got {_short(output)}"
                )
    elif error is None:
        problems.append(f"expected {expect.error_class} [{expect.error_code}], got success")
    else:
        got_class = type(error).__name__
        got_code = getattr(error, "code", None)
        if got_class != expect.error_class:
            problems.append(f"expected error class {expect.error_class}, got {_describe(error)}")
        if expect.error_code is not None and got_code != expect.error_code:
            problems.append(f"expected error code {expect.error_code}, got {got_code}")
    attempts = len(transport.seen)
    if attempts != expect.attempts:
        problems.append(f"expected {expect.attempts} request(s), the client sent {attempts}")
    elif transport.unused and not transport.mismatches:
        problems.append(f"{transport.unused} exchange(s) at the end were never requested")
    waits = list(clock.waits)
    if len(waits) != len(expect.waits) or any(
        abs(a - b) > WAIT_TOLERANCE for a, b in zip(waits, expect.waits, strict=False)
    ):
        problems.append(
            f"expected waits {_fmt_waits(expect.waits)} s, the client waited {_fmt_waits(waits)} s"
        )
    return ReplayResult(
        name=cassette.name,
        ok=not problems,
        mismatches=problems,
        outcome="error" if error is not None else "success",
        attempts=attempts,
        waits=waits,
        error=_describe(error) if error is not None else None,
        provider=cassette.provider,
        output=output,
    )


def _judge_flow(cassette: Cassette, transport: ReplayTransport, clock: Clock) -> ReplayResult:
    """A replay that reached an answer recorded without its body: compare the flow up to it.

    The requests so far matched (or the mismatches say where not); the waits
    taken are the recorded ones, in order; when the omitted answer was the
    last exchange, the request count and every wait must match too. The
    outcome and the output cannot be compared: they came from the body.
    """
    expect = cassette.expect
    problems = list(transport.mismatches)
    attempts = len(transport.seen)
    waits = list(clock.waits)
    last = transport.omitted_at == len(cassette.exchanges) - 1
    wanted = list(expect.waits) if last else list(expect.waits[: len(waits)])
    if last and attempts != expect.attempts:
        problems.append(f"expected {expect.attempts} request(s), the client sent {attempts}")
    if len(waits) != len(wanted) or any(
        abs(a - b) > WAIT_TOLERANCE for a, b in zip(waits, wanted, strict=False)
    ):
        problems.append(
            f"expected waits {_fmt_waits(wanted)} s up to request {attempts}, "
            f"the client waited {_fmt_waits(waits)} s"
        )
    return ReplayResult(
        name=cassette.name,
        ok=not problems,
        mismatches=problems,
        outcome="flow-only",
        attempts=attempts,
        waits=waits,
        error=None,
        provider=cassette.provider,
    )


def run_cassette(cassette: Cassette) -> ReplayResult:
    """Replay ``cassette`` and compare with its ``expect``; never raises for a mismatch.

    Compared: the outcome, the error class and code (or the validated output),
    the requests sent, and the waits asked of the clock (within 1e-6 s). A
    cassette recorded without bodies replays up to its first answer without
    a body and compares the flow up to there (outcome ``flow-only``).
    """
    clock = VirtualClock()
    transport = ReplayTransport(cassette.exchanges)
    http = httpx.Client(transport=transport)
    output: Any = None
    error: BaseException | None = None
    try:
        client = _replay_client(cassette, clock, http)
        output = run_recipe(client, cassette.call, clock)
    except Exception as exc:  # noqa: BLE001 - every failure is an outcome to compare
        error = exc
    finally:
        http.close()
    install = _missing_extra(error)
    if (
        error is not None
        and install is not None
        and cassette.expect.error_code != "llm.not_configured"
    ):
        # Not a difference in the code: this machine cannot run the provider at all.
        return ReplayResult(
            name=cassette.name,
            ok=True,
            mismatches=[],
            outcome="skipped",
            attempts=len(transport.seen),
            waits=list(clock.waits),
            error=_describe(error),
            provider=cassette.provider,
            skipped=f"needs an extra that is not installed: {install}",
        )
    return _judge(cassette, transport, clock, output, error)
