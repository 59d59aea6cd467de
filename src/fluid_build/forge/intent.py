"""The intent file: what data product to forge, validated field by field."""

from __future__ import annotations

import datetime
import re
from pathlib import Path
from typing import Any, Final, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from fluid_build._files import MAX_DEPTH, TooDeepError, UnsafeFileError, load_yaml, read_regular
from fluid_build._redact import one_line, redact, truncate
from fluid_build.errors import FluidError

__all__ = [
    "MAX_INTENT_BYTES",
    "MAX_INTENT_DEPTH",
    "DataProduct",
    "Intent",
    "IntentError",
    "load_intent",
]

#: The largest intent file read; nothing past this is ever read.
MAX_INTENT_BYTES: Final = 1_000_000
#: The deepest YAML nesting an intent file may use.
MAX_INTENT_DEPTH: Final = MAX_DEPTH
#: A complete intent to start from, named when a file holds none.
EXAMPLE: Final = Path(__file__).resolve().parent / "examples" / "sales_orders.intent.yaml"
#: The most of the YAML parser's reason an error message carries.
_MAX_REASON: Final = 200
#: A quoted part of the parser's reason: the file's own text (an alias, a tag), or a token.
_QUOTED: Final = re.compile(r"'[^']*'|\"[^\"]*\"")
#: The parser's own token names (``'<stream end>'``), never the file's text.
_TOKEN: Final = re.compile(r"<[a-z ]+>")


class IntentError(FluidError):
    """The intent file could not be read or does not validate."""


class DataProduct(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)

    name: str = Field(pattern=r"^[a-z][a-z0-9_]{1,63}$", description="snake_case, 2-64 chars")
    domain: str = Field(min_length=2, max_length=64)
    description: str = Field(min_length=10, max_length=2000)
    owner: str = Field(min_length=2, max_length=200)


class Intent(BaseModel):
    """A forge intent: the data product, its grain, dimensions, metrics and modeling technique."""

    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)

    data_product: DataProduct
    grain: str = Field(min_length=3, max_length=500)
    dimensions: list[str] = Field(min_length=1, max_length=50)
    metrics: list[str] = Field(min_length=1, max_length=50)
    modeling_technique: Literal["dimensional", "data_vault", "one_big_table", "activity_schema"]

    def summary(self) -> str:
        product = self.data_product
        return (
            f"Data product: {product.name} (domain {product.domain}, owner {product.owner})\n"
            f"Description: {product.description}\n"
            f"Grain: {self.grain}\n"
            f"Dimensions: {', '.join(self.dimensions)}\n"
            f"Metrics: {', '.join(self.metrics)}\n"
            f"Modeling technique: {self.modeling_technique}"
        )


def _field_errors(error: ValidationError) -> list[str]:
    lines = []
    for entry in error.errors(include_url=False, include_input=False):
        where = ".".join(str(part) for part in entry.get("loc", ())) or "<root>"
        lines.append(f"{where}: {entry.get('msg', 'invalid')}")
    return lines


def _quoted(match: re.Match[str]) -> str:
    inside = match.group()[1:-1]
    # A character or two ('\\t', ':') says what to fix; a longer run is the file's text.
    if len(inside) <= 4 or _TOKEN.fullmatch(inside):
        return match.group()
    return "'…'"


def _unreadable(exc: yaml.reader.ReaderError, text: str) -> str:
    """A character YAML refuses (a control character): its line, column and code point."""
    at = min(max(exc.position, 0), len(text))
    line = text.count("\n", 0, at) + 1
    column = at - (text.rfind("\n", 0, at) + 1) + 1
    code = exc.character if isinstance(exc.character, int) else None
    what = f" (#x{code:02x})" if code is not None else ""
    return f" at line {line}, column {column}: {exc.reason}{what}"


def _yaml_reason(exc: yaml.YAMLError, text: str) -> str:
    """Where the parser stopped and why, in its words, without the file's text and bounded.

    ``str(exc)`` is never used: it quotes the offending line, which may hold a key.
    """
    if isinstance(exc, yaml.reader.ReaderError):
        return _unreadable(exc, text)
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    problem = getattr(exc, "problem", None)
    if not isinstance(problem, str) or not problem.strip():
        return where
    reason = problem
    context = getattr(exc, "context", None)
    if isinstance(context, str) and context.strip():
        started = getattr(exc, "context_mark", None)
        if started is not None and (mark is None or started.line != mark.line):
            context = f"{context} that started at line {started.line + 1}"
        reason = f"{reason} ({context})"
    reason = truncate(redact(_QUOTED.sub(_quoted, one_line(reason))), _MAX_REASON)
    return f"{where}: {reason}"


def _holds(data: object) -> str:
    """What a YAML document that is not a mapping holds, in an operator's words."""
    if isinstance(data, list):
        return "a list"
    if isinstance(data, bool):  # before int: a bool is an int
        return "true or false"
    if isinstance(data, int | float):
        return "a number"
    if isinstance(data, str):
        return "plain text"
    if isinstance(data, datetime.date):
        return "a date"
    if isinstance(data, bytes):
        return "binary data"
    return "a single value"


def load_intent(path: str | Path) -> Intent:
    """Read and validate an intent file; any problem is an :class:`IntentError` naming the field.

    The file must be a regular file (a directory, FIFO or device is refused at
    once, without reading it) of at most 1 MB; at most 1 MB + 1 byte is ever
    read. The YAML may nest at most :data:`MAX_INTENT_DEPTH` levels.
    """
    file = Path(path)
    try:
        raw = read_regular(file, limit=MAX_INTENT_BYTES, name=str(file))
    except UnsafeFileError as exc:
        raise IntentError(f"the intent file {exc}") from None
    except OSError as exc:
        raise IntentError(f"cannot read the intent file {file}: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise IntentError(f"the intent file {file} is not UTF-8 text") from None
    try:
        data: Any = load_yaml(text, name=str(file), max_depth=MAX_INTENT_DEPTH)
    except TooDeepError as exc:
        raise IntentError(f"the intent file {exc}") from None
    except yaml.YAMLError as exc:
        reason = _yaml_reason(exc, text)
        raise IntentError(f"the intent file {file} is not valid YAML{reason}") from None
    if data is None:  # nothing, blank lines, comments or a bare '---'
        raise IntentError(
            f"the intent file {file} is empty: write a mapping with a data_product block "
            f"(a complete example: {EXAMPLE})"
        )
    if not isinstance(data, dict):
        raise IntentError(
            f"the intent file {file} holds {_holds(data)}, but must be a mapping with a "
            f"data_product block (a complete example: {EXAMPLE})"
        )
    try:
        return Intent.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(truncate(redact(line), 200) for line in _field_errors(exc)[:10])
        raise IntentError(f"the intent file {file} is invalid: {problems}") from None
