"""The cassette format: a recorded call on file, read, validated and written.

A cassette holds one call (the recipe), the HTTP exchanges it caused (a
request summary and the provider's answer) and what came of it (outcome,
typed error or validated output, requests sent, waits taken). This module
defines those pydantic models, reads them (:func:`load_cassette`: any
problem is a :class:`CassetteError`), writes them (:func:`dump_cassette`,
:func:`write_cassette`), and names the response models a recipe may ask
for (:func:`register_response_model`). Recording is in
:mod:`fluid_build.corpus.record`, replaying in :mod:`fluid_build.corpus.replay`;
see docs/corpus.md.
"""

from __future__ import annotations

import base64
import binascii
import importlib
import json
import math
import os
import stat
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final, Literal

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from fluid_build._redact import ACCOUNT_HEADERS, is_credential_header, redact, redact_url
from fluid_build.errors import FluidError

__all__ = [
    "CASSETTE_VERSION",
    "OMITTED",
    "RESPONSE_MODELS",
    "CallRecipe",
    "Cassette",
    "CassetteError",
    "DataProduct",
    "Exchange",
    "ExchangeRequest",
    "ExchangeResponse",
    "Expectation",
    "Plan",
    "check_writable",
    "dump_cassette",
    "is_dropped_header",
    "is_forge_run",
    "load_cassette",
    "register_response_model",
    "resolve_response_model",
    "summarize_request",
    "write_cassette",
]

#: The cassette format this module reads and writes.
CASSETTE_VERSION: Final = 1
#: What stands for the prompt in a cassette recorded without bodies.
OMITTED: Final = "[omitted: recorded without bodies]"

# Response headers a cassette never keeps, besides credentials and account ids:
# the framing of the original bytes (the body is stored decoded).
_FRAMING_HEADERS: Final = frozenset(
    {
        "content-length",
        "content-encoding",
        "transfer-encoding",
        "connection",
        "keep-alive",
    }
)


def is_dropped_header(name: str) -> bool:
    """Whether a cassette never keeps (nor serves) a response header of this name."""
    low = name.lower()
    return low in _FRAMING_HEADERS or low in ACCOUNT_HEADERS or is_credential_header(low)


# -- errors -------------------------------------------------------------------------


class CassetteError(FluidError):
    """A cassette that cannot be used: missing, not JSON, another version, invalid, a
    path it cannot be written to, or a ``fluid forge`` run given to ``fluid corpus replay``.

    ``hint`` is the next step when it is not "fix the file" (the CLI prints it).
    """

    def __init__(self, message: str, *, path: str | None = None, hint: str | None = None) -> None:
        super().__init__(f"{path}: {message}" if path else message)
        self.path = path
        self.hint = hint

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_cassette_error, (str(self), self.path, self.hint))


def _rebuild_cassette_error(
    message: str, path: str | None, hint: str | None = None
) -> CassetteError:
    error = CassetteError(message)
    error.path = path
    error.hint = hint
    return error


# -- response models cassettes may name ---------------------------------------------------


class Plan(BaseModel):
    """A data product plan: the response model of most shipped cassettes."""

    name: str
    steps: list[str]


class DataProduct(BaseModel):
    """A data product with a free-form ``properties`` field (JSON-encoded in strict mode)."""

    name: str
    owner: str | None = None
    tags: list[str] = Field(default_factory=list)
    properties: dict[str, Any] = Field(default_factory=dict)


#: Response models a cassette names by ``call.response_model``.
RESPONSE_MODELS: dict[str, type[BaseModel]] = {"DataProduct": DataProduct, "Plan": Plan}


def register_response_model(model: type[BaseModel], name: str | None = None) -> type[BaseModel]:
    """Make ``model`` available to cassettes as ``name`` (default: its class name)."""
    RESPONSE_MODELS[name or model.__name__] = model
    return model


def resolve_response_model(name: str) -> type[BaseModel]:
    """The model a cassette names: a registered name, or ``fluid_build.module:Class``."""
    known = RESPONSE_MODELS.get(name)
    if known is not None:
        return known
    module_name, _, attr = name.partition(":")
    if attr and (module_name == "fluid_build" or module_name.startswith("fluid_build.")):
        try:
            found = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise CassetteError(f"response model {name!r} cannot be imported: {exc}") from None
        if isinstance(found, type) and issubclass(found, BaseModel):
            return found
        raise CassetteError(f"response model {name!r} is not a pydantic model")
    choices = ", ".join(sorted(RESPONSE_MODELS))
    raise CassetteError(
        f"unknown response model {name!r}: use one of {choices}, or "
        "'fluid_build.<module>:<Class>' (only fluid_build modules are imported)"
    )


# -- the format ---------------------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ExchangeRequest(_Strict):
    """What was asked: never headers or keys; enough to check the order.

    ``body`` is the request's JSON body, redacted, kept only by recorders
    asked for it (``fluid forge --record``, with bodies); replay then compares
    the conversation in it (:data:`COMPARED_BODY_FIELDS`, tool results aside).

    ``settings`` are the call settings the body carried (temperature, seed,
    answer length ...: :data:`~fluid_build.corpus.compare.SETTING_FIELDS`, by
    their path in the body), kept by every recording that does not keep the
    body; replay compares them (from ``body`` when it is kept). ``{}``: none was
    sent. Absent: recorded before fluid kept them, and then not compared unless
    the body is kept.
    """

    method: str
    path: str
    model: str | None = None
    body: Any | None = None
    settings: dict[str, Any] | None = None


class ExchangeResponse(_Strict):
    """What the provider answered: status, kept headers, and a JSON body, raw text or bytes.

    ``body_base64`` holds a body that is not text (AWS event-stream frames, the
    binary framing of Bedrock's streams), base64-encoded. ``omitted`` marks an
    answer whose body was not recorded (``bodies=False``).
    """

    status: int = Field(ge=100, le=599)
    headers: dict[str, str] = Field(default_factory=dict)
    body: Any | None = None
    body_text: str | None = None
    body_base64: str | None = None
    omitted: bool = False

    @model_validator(mode="after")
    def _one_body(self) -> ExchangeResponse:
        given = [self.body is not None, self.body_text is not None, self.body_base64 is not None]
        if sum(given) > 1:
            raise ValueError(
                "give one of body (JSON), body_text (raw text) or body_base64 (bytes), not several"
            )
        if self.omitted and any(given):
            raise ValueError("an omitted body has neither body, body_text nor body_base64")
        if self.body_base64 is not None:
            try:
                base64.b64decode(self.body_base64, validate=True)
            except binascii.Error:
                raise ValueError("body_base64 is not valid base64") from None
        return self

    def content(self) -> bytes:
        """The body's bytes as the provider sent them (empty when there is none)."""
        if self.body_base64 is not None:
            return base64.b64decode(self.body_base64)
        if self.body_text is not None:
            return self.body_text.encode("utf-8")
        if self.body is not None:
            return json.dumps(self.body).encode("utf-8")
        return b""


class Exchange(_Strict):
    request: ExchangeRequest
    response: ExchangeResponse


class CallRecipe(_Strict):
    """The call to replay: what the caller passed to the client (or the agent loop)."""

    kind: Literal["complete", "stream", "loop"] = "complete"
    messages: list[dict[str, Any]] = Field(min_length=1)
    system: str | None = None
    response_model: str | None = None
    strict_schema: bool = False
    max_output_tokens: int | None = Field(default=None, ge=1)
    #: The sampling options the call set; absent (None) is not set, as in old cassettes.
    temperature: float | None = Field(default=None, ge=0, le=2, allow_inf_nan=False)
    top_p: float | None = Field(default=None, ge=0, le=1, allow_inf_nan=False)
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=-(2**63), lt=2**63)
    reasoning_effort: Literal["low", "medium", "high"] | None = None
    env: dict[str, str] = Field(default_factory=dict)
    capability_matrix: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _loop_task(self) -> CallRecipe:
        if self.kind == "loop":
            first = self.messages[0]
            if (
                len(self.messages) != 1
                or first.get("role") != "user"
                or not isinstance(first.get("content"), str)
            ):
                raise ValueError("a loop recipe takes one user message with text content")
        return self

    def options(self) -> dict[str, Any]:
        """The call options the recipe sets besides its messages, as ``complete()``
        takes them; one that is not set is left out."""
        given = {
            "max_output_tokens": self.max_output_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "stop": self.stop,
            "seed": self.seed,
            "reasoning_effort": self.reasoning_effort,
        }
        return {name: value for name, value in given.items() if value is not None}


class Expectation(_Strict):
    """What the call came to; replay must reproduce it."""

    outcome: Literal["success", "error"]
    error_class: str | None = None
    error_code: str | None = None
    output: Any | None = None
    attempts: int = Field(ge=0)
    waits: list[float] = Field(default_factory=list)

    @model_validator(mode="after")
    def _consistent(self) -> Expectation:
        if self.outcome == "error" and not self.error_class:
            raise ValueError("an error outcome needs error_class")
        if self.outcome == "success" and (self.error_class or self.error_code):
            raise ValueError("a success outcome has no error_class or error_code")
        if any(not math.isfinite(w) or w < 0 for w in self.waits):
            raise ValueError("waits are finite, non-negative seconds")
        return self


class Cassette(_Strict):
    version: int
    name: str = Field(min_length=1)
    description: str = ""
    provider: str
    model: str
    source: str = Field(min_length=1)
    call: CallRecipe
    exchanges: list[Exchange]
    expect: Expectation
    #: False: recorded without bodies (no prompt, no model output); replay checks the flow only.
    bodies: bool = True
    #: True: a whole ``fluid forge`` run (``fluid forge --record``), replayed only by
    #: ``fluid forge --replay``; False: one call, replayed by ``fluid corpus replay``.
    forge_run: bool = False

    @model_validator(mode="after")
    def _version(self) -> Cassette:
        if self.version != CASSETTE_VERSION:
            raise ValueError(_version_message(self.version))
        return self

    @model_validator(mode="after")
    def _bodies(self) -> Cassette:
        if not self.bodies and self.expect.output is not None:
            raise ValueError("a cassette recorded without bodies has no expected output")
        if self.bodies and any(e.response.omitted for e in self.exchanges):
            raise ValueError("an omitted body needs bodies: false")
        return self


def is_forge_run(cassette: Cassette) -> bool:
    """Whether ``cassette`` records a ``fluid forge`` run rather than one call.

    A forge recording says so (``forge_run: true``, written by ``fluid forge
    --record`` since it was added, with or without bodies); one made before keeps
    request bodies, which only forge recordings do. Its ``call`` is a summary of
    the intent, not what was sent, so only ``fluid forge --replay`` can replay it,
    through forge's stages.
    """
    return cassette.forge_run or any(
        exchange.request.body is not None for exchange in cassette.exchanges
    )


def _version_message(version: object) -> str:
    return (
        f"cassette version {version!r} is not supported: this fluid_build reads version "
        f"{CASSETTE_VERSION}"
    )


def _pydantic_problems(exc: ValidationError) -> str:
    shown = []
    for entry in exc.errors()[:5]:
        where = ".".join(str(part) for part in entry["loc"]) or "<root>"
        shown.append(f"{where}: {entry['msg']}")
    more = f" (+{exc.error_count() - 5} more)" if exc.error_count() > 5 else ""
    return "; ".join(shown) + more


#: The largest cassette file read (a recorded stream of a long answer fits easily).
MAX_CASSETTE_BYTES: Final = 64 * 1024 * 1024


def load_cassette(path: str | Path) -> Cassette:
    """Read and validate a cassette; any problem is a :class:`CassetteError` saying what."""
    from fluid_build._files import UnsafeFileError, load_json, read_regular

    where = str(path)
    try:
        # Bounded: never a FIFO, a device or a directory, never more than the limit.
        text = read_regular(path, limit=MAX_CASSETTE_BYTES, name=where).decode("utf-8")
    except UnsafeFileError as exc:
        raise CassetteError(f"{exc.reason}; {exc.advice}", path=where) from None
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise CassetteError(f"cannot be read ({reason})", path=where) from None
    except UnicodeDecodeError:
        raise CassetteError("is not UTF-8 text", path=where) from None
    try:
        data = load_json(text, name=where)
    except UnsafeFileError as exc:
        raise CassetteError(f"{exc.reason}; {exc.advice}", path=where) from None
    except json.JSONDecodeError as exc:
        raise CassetteError(
            f"is not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})", path=where
        ) from None
    if not isinstance(data, dict):
        raise CassetteError("must hold a JSON object", path=where)
    if "version" not in data:
        raise CassetteError(
            f"has no 'version' (this fluid_build reads version {CASSETTE_VERSION})", path=where
        )
    if data["version"] != CASSETTE_VERSION:
        raise CassetteError(_version_message(data["version"]), path=where)
    try:
        cassette = Cassette.model_validate(data)
    except ValidationError as exc:
        raise CassetteError(
            f"is not a valid cassette: {_pydantic_problems(exc)}", path=where
        ) from None
    if cassette.call.response_model is not None:
        try:
            resolve_response_model(cassette.call.response_model)
        except CassetteError as exc:
            raise CassetteError(str(exc), path=where) from None
    return cassette


#: The recipe's sampling options, newer than the format: written only when set.
_RECIPE_OPTIONS: Final = ("temperature", "top_p", "stop", "seed", "reasoning_effort")


def dump_cassette(cassette: Cassette) -> str:
    """The cassette as the JSON text this module writes (stable: same cassette, same bytes).

    ``bodies``, ``omitted`` and ``forge_run`` are written only when they say
    something (false, true, true), and the recipe's sampling options and a request's
    ``settings`` only when set, so a call recorded with bodies reads as it always did.
    """
    data = cassette.model_dump(mode="json")
    if data.get("bodies") is True:
        del data["bodies"]
    if data.get("forge_run") is False:
        del data["forge_run"]
    for name in _RECIPE_OPTIONS:  # written only when set, so older recipes read as before
        if data["call"].get(name) is None:
            del data["call"][name]
    for exchange in data["exchanges"]:
        if exchange["response"].get("omitted") is False:
            del exchange["response"]["omitted"]
        # Written only when there is one, so a text or JSON answer reads as it always did.
        if exchange["response"].get("body_base64") is None:
            del exchange["response"]["body_base64"]
        if exchange["request"].get("body") is None:
            del exchange["request"]["body"]
        if exchange["request"].get("settings") is None:
            del exchange["request"]["settings"]
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def _reason(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


_OUT_HINT: Final = "choose a path in a directory you can write, and run again"


def _nearest_directory(target: Path) -> Path:
    """The closest existing ancestor of ``target``: where the file, or its directories, go.

    Refuses one that is not a directory (``afile/x.json`` where ``afile`` is a file).
    """
    from fluid_build._files import OutputPathError

    where = str(target)
    parent = target.parent
    while True:
        try:
            # Followed: the directories leading to a cassette may be symbolic links.
            mode = os.stat(parent).st_mode
        except (FileNotFoundError, NotADirectoryError) as exc:
            if parent.parent == parent:
                raise OutputPathError(
                    where, f"cannot be written ({_reason(exc)})", _OUT_HINT
                ) from None
            parent = parent.parent
            continue
        except OSError as exc:
            raise OutputPathError(
                where, f"cannot be written: {parent} cannot be reached ({_reason(exc)})", _OUT_HINT
            ) from None
        if not stat.S_ISDIR(mode):
            raise OutputPathError(
                where, f"cannot be written: {parent} is not a directory", _OUT_HINT
            )
        return parent


def check_writable(path: str | Path) -> Path:
    """Refuse, before anything is recorded, a path a cassette cannot be written to.

    As every ``--out`` (:func:`fluid_build._files.check_output_file`): the file is
    created for real in its directory and removed (permission bits say nothing of
    ``/proc`` or a read-only mount, nor for root), a symbolic link to a file keeps
    the link and the file it points to is replaced. Unlike a stream output, a
    cassette is a file to replay: a FIFO, a device or ``/dev/stdout`` is refused,
    never replaced. Directories that do not exist yet are made when it is written,
    so the closest one that exists must take a new file. Returns the path to
    write; raises :class:`~fluid_build._files.OutputPathError` (``fluid`` exits 4).
    """
    from fluid_build._files import OutputPathError, check_output_file, file_kind

    target = Path(path)
    directory = _nearest_directory(target)
    if directory != target.parent:  # made when written: nothing there to check but this
        _probe(target, directory)
        return target
    checked = check_output_file(target, hint=_OUT_HINT)
    if checked.stream:
        try:
            mode = os.stat(target).st_mode
        except OSError:
            mode = 0
        # /dev/stdout may resolve to a regular file: it still names a descriptor.
        named = (
            f"is {file_kind(mode)}"
            if stat.S_ISFIFO(mode) or stat.S_ISCHR(mode)
            else "names an open descriptor"
        )
        raise OutputPathError(
            str(target),
            f"{named}, not a file: a cassette is written whole, to be replayed",
            "give the path of a regular file, new or to replace, and run again",
        )
    return Path(checked.path)


def _probe(target: Path, directory: Path) -> None:
    """Create and remove a file where the cassette's missing directories will be made."""
    from fluid_build._files import OutputPathError

    try:
        fd, probe = tempfile.mkstemp(dir=directory, prefix=".fluid-probe-", suffix=".tmp")
    except OSError as exc:
        raise OutputPathError(
            str(target),
            f"cannot be written: no file can be created in {directory} ({_reason(exc)})",
            _OUT_HINT,
        ) from None
    os.close(fd)
    os.unlink(probe)


def write_cassette(cassette: Cassette, path: str | Path) -> Path:
    """Write ``cassette`` to ``path`` atomically: a reader sees the old file or the whole new one.

    The text goes to a temporary file in the same directory (mode 0600), which
    is then renamed over ``path``; nothing is left behind if writing is
    interrupted. Through a symbolic link to a file, that file is replaced and the
    link stays. A path that cannot take it (see :func:`check_writable`), or a
    write that fails, is a :class:`CassetteError` naming the path: by then the
    run is over, and its callers report that the cassette was not written.
    """
    from fluid_build._files import OutputPathError, write_atomic

    try:
        target = check_writable(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(target, dump_cassette(cassette).encode("utf-8"))
    except OutputPathError as exc:
        raise CassetteError(exc.reason, path=exc.path) from None
    except OSError as exc:
        raise CassetteError(f"cannot be written ({_reason(exc)})", path=str(path)) from None
    return target


# -- what is kept of a request -------------------------------------------------------


def summarize_request(request: httpx.Request, *, secrets: Sequence[str] = ()) -> ExchangeRequest:
    """Method, URL path and the body's ``model``: all a cassette keeps of a request."""
    model: str | None = None
    try:
        data = json.loads(request.content) if request.content else None
    except (ValueError, httpx.RequestNotRead):
        data = None
    if isinstance(data, dict) and isinstance(data.get("model"), str):
        model = redact(data["model"], secrets)
    return ExchangeRequest(
        method=request.method.upper(), path=redact_url(request.url.path, secrets), model=model
    )
