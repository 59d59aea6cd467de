"""Declaring a tool: ``@forge_tool`` turns a typed function into a :class:`Tool`.

The function's signature becomes a pydantic model: the JSON schema the model
is shown, and the validator every call's arguments pass through. Its
docstring gives the description and, from an ``Args:`` section, each
parameter's. Running a tool is :class:`~fluid_build.copilot.loop.tools.ToolRegistry`'s
business.
"""

from __future__ import annotations

import inspect
import math
import re
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Final, overload

from pydantic import BaseModel, ConfigDict, Field, create_model
from pydantic.fields import FieldInfo
from pydantic.json_schema import GenerateJsonSchema

from fluid_build.copilot.llm.types import ToolSpec

__all__ = ["Tool", "forge_tool"]

_NAME: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")
_SECTION: Final = re.compile(r"(Args|Arguments|Parameters|Params):")
_ENTRY: Final = re.compile(r"(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)")
_MODEL_CONFIG: Final = ConfigDict(extra="forbid", validate_default=True, hide_input_in_errors=True)


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """The first paragraph as one line, and the ``Args:`` entries by parameter name."""
    lines = inspect.cleandoc(doc).splitlines()
    summary: list[str] = []
    for line in lines:
        if not line.strip() or _SECTION.fullmatch(line.strip()):
            break
        summary.append(line.strip())
    params: dict[str, list[str]] = {}
    inside, indent, current = False, -1, ""
    for line in lines:
        stripped = line.strip()
        if not line[:1].isspace() and stripped:
            inside, indent, current = bool(_SECTION.fullmatch(stripped)), -1, ""
            continue
        if not inside or not stripped:
            continue
        level = len(line) - len(line.lstrip())
        indent = level if indent < 0 else indent
        entry = _ENTRY.fullmatch(stripped) if level == indent else None
        if entry:
            current = entry.group(1)
            params[current] = [entry.group(2)]
        elif current:
            params[current].append(stripped)
    described = {name: " ".join(" ".join(words).split()) for name, words in params.items()}
    return " ".join(summary), {name: text for name, text in described.items() if text}


def _has_description(annotation: object, default: object) -> bool:
    if isinstance(default, FieldInfo) and default.description:
        return True
    metadata = getattr(annotation, "__metadata__", ())
    return any(isinstance(m, FieldInfo) and m.description for m in metadata)


def _input_model(
    fn: Callable[..., Any], tool_name: str, docs: Mapping[str, str]
) -> type[BaseModel]:
    """A pydantic model of ``fn``'s keyword arguments.

    Fields are stored under neutral names (``p0``, ``p1`` ...) with the
    parameter name as alias, so parameters may be called ``schema``, ``json``
    or ``_private`` without clashing with ``BaseModel``.
    """
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except NameError as exc:
        raise TypeError(f"tool {tool_name}: cannot resolve its annotations ({exc})") from exc
    fields: dict[str, Any] = {}
    names: dict[str, str] = {}
    for index, param in enumerate(inspect.signature(fn).parameters.values()):
        if param.kind not in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY):
            raise TypeError(
                f"tool {tool_name}: parameter {param.name} must be passable by keyword "
                "(no *args, **kwargs or positional-only parameters)"
            )
        if param.name not in hints:
            raise TypeError(f"tool {tool_name}: parameter {param.name} needs a type annotation")
        annotation = hints[param.name]
        default = ... if param.default is param.empty else param.default
        described = _has_description(annotation, default)
        extra = Field(alias=param.name)
        if not described and param.name in docs:
            extra = Field(alias=param.name, description=docs[param.name])
        fields[f"p{index}"] = (Annotated[annotation, extra], default)
        names[f"p{index}"] = param.name
    model: type[BaseModel] = create_model(
        f"{tool_name}_arguments",
        __config__=_MODEL_CONFIG,
        **fields,
    )
    for key, info in model.model_fields.items():
        if info.alias != names[key]:
            raise TypeError(f"tool {tool_name}: parameter {names[key]} must not set an alias")
    return model


class _ToolJsonSchema(GenerateJsonSchema):
    """Schemas without the auto-generated titles: they only cost the model tokens."""

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False


def _json_schema(model: type[BaseModel]) -> dict[str, Any]:
    schema = model.model_json_schema(schema_generator=_ToolJsonSchema)
    schema.pop("title", None)
    return schema


@dataclass(frozen=True)
class Tool:
    """A callable the model may ask for, with its JSON schema and limits.

    Build one with :func:`forge_tool`. ``fn`` is the body; ``input_model``
    validates its arguments and produced ``parameters``.
    """

    name: str
    description: str
    parameters: dict[str, Any]
    read_only: bool
    timeout: float
    fn: Callable[..., Any] = field(repr=False, kw_only=True)
    input_model: type[BaseModel] = field(repr=False, kw_only=True)

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)

    def spec(self) -> ToolSpec:
        """What the model is shown: name, description, parameter schema."""
        return ToolSpec(self.name, self.description, self.parameters)


def _build_tool(
    fn: Callable[..., Any],
    *,
    name: str | None,
    description: str | None,
    read_only: bool,
    timeout: float,
) -> Tool:
    tool_name: str = name or str(getattr(fn, "__name__", ""))
    if not _NAME.fullmatch(tool_name):
        raise ValueError(
            f"tool name {tool_name!r} must be 1-64 letters, digits, '_' or '-' (pass name=)"
        )
    if isinstance(timeout, bool) or not math.isfinite(timeout) or timeout <= 0:
        raise ValueError(f"tool {tool_name}: timeout must be a positive number of seconds")
    summary, docs = _parse_docstring(inspect.getdoc(fn) or "")
    text = " ".join((description or summary).split())
    if not text:
        raise ValueError(f"tool {tool_name}: give it a docstring or description=")
    model = _input_model(fn, tool_name, docs)
    return Tool(
        name=tool_name,
        description=text,
        parameters=_json_schema(model),
        read_only=read_only,
        timeout=float(timeout),
        fn=fn,
        input_model=model,
    )


@overload
def forge_tool(
    fn: Callable[..., Any],
    *,
    name: str | None = None,
    description: str | None = None,
    read_only: bool = False,
    timeout: float = 30.0,
) -> Tool: ...


@overload
def forge_tool(
    fn: None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    read_only: bool = False,
    timeout: float = 30.0,
) -> Callable[[Callable[..., Any]], Tool]: ...


def forge_tool(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    read_only: bool = False,
    timeout: float = 30.0,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Turn a typed function (sync or async) into a :class:`Tool`.

    Usable bare (``@forge_tool``) or with arguments
    (``@forge_tool(read_only=True, timeout=5)``). The description is
    ``description=`` or the docstring's first paragraph; parameter
    descriptions come from ``Field(description=...)`` or the docstring's
    ``Args:`` section. Every parameter needs a type annotation.
    """

    def build(body: Callable[..., Any]) -> Tool:
        return _build_tool(
            body, name=name, description=description, read_only=read_only, timeout=timeout
        )

    return build if fn is None else build(fn)
