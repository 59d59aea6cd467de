"""How data moves between the original shape and the strict one: :class:`StrictSchema`.

Hardening carries some values differently (a free-form value as a string of JSON,
an optional field as nullable, a root that is not an object under ``"value"``);
each is recorded as a codec, and :meth:`StrictSchema.decode` undoes it on the
model's output, :meth:`StrictSchema.encode` applies it to original-shaped data.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from fluid_build.copilot.agents.errors import SchemaValidationError
from fluid_build.copilot.schema.nodes import unescape
from fluid_build.copilot.schema.shapes import Shape, canon, value_kinds
from fluid_build.copilot.schema.subset import is_number

__all__ = [
    "JSON",
    "KEEP",
    "WRAP_KEY",
    "Array",
    "Branch",
    "Codec",
    "Field",
    "Json",
    "Keep",
    "Object",
    "Plan",
    "Ref",
    "StrictSchema",
    "Union",
    "Wrap",
    "data_paths",
]

#: The property a root that is not an object is carried in.
WRAP_KEY: Final = "value"


@dataclass(frozen=True, slots=True)
class Keep:
    """The data has the same shape on both sides."""


@dataclass(frozen=True, slots=True)
class Json:
    """A free-form value, carried as a string of JSON."""


@dataclass(frozen=True, slots=True)
class Field:
    name: str
    codec: Codec
    optional: bool  # not in the original `required`: encode() adds null when missing
    drop_null: bool  # null was added by hardening: decode() drops it again


@dataclass(frozen=True, slots=True)
class Object:
    fields: tuple[Field, ...]


@dataclass(frozen=True, slots=True)
class Array:
    items: Codec


@dataclass(frozen=True, slots=True)
class Branch:
    codec: Codec
    strict: Shape  # picks the branch in decode()
    original: Shape  # the candidates in encode()
    schema: dict[str, Any]  # what encode() checks its result against


@dataclass(frozen=True, slots=True)
class Union:
    branches: tuple[Branch, ...]


@dataclass(frozen=True, slots=True)
class Ref:
    name: str


@dataclass(frozen=True, slots=True)
class Wrap:
    """A root that is not an object, carried as ``{"value": ...}``."""

    inner: Codec


Codec = Keep | Json | Object | Array | Union | Ref | Wrap
KEEP: Final = Keep()
JSON: Final = Json()


@dataclass(frozen=True, slots=True)
class Plan:
    root: Codec
    defs: Mapping[str, Codec]
    schemas: Mapping[str, dict[str, Any]] = field(default_factory=dict)  # strict, by name
    root_name: str = "root"


@dataclass(frozen=True)
class StrictSchema:
    """A schema hardened for OpenAI strict mode, and the way back to the original shape.

    ``encoded_paths`` and ``nullable_paths`` name data locations in the original shape:
    property names, ``"[]"`` for array items. Recursive schemas list each location up to
    the first repetition of a ``$ref``; :meth:`decode` and :meth:`encode` follow the
    recursion to any depth.
    """

    schema: dict[str, Any]
    encoded_paths: tuple[tuple[str, ...], ...]
    nullable_paths: tuple[tuple[str, ...], ...]
    name: str = "response"
    _plan: Plan = field(default=Plan(KEEP, {}), repr=False, compare=False)

    def response_format(self) -> dict[str, Any]:
        """The ``response_format`` value of a Chat Completions request."""
        return {
            "type": "json_schema",
            "json_schema": {"name": self.name, "strict": True, "schema": self.schema},
        }

    def decode(self, data: Any) -> Any:
        """Strict-shaped model output -> the original shape.

        JSON-encoded fields are parsed; a ``null`` that hardening added for an optional
        field is dropped. A field that does not hold valid JSON raises
        :class:`SchemaValidationError` listing every such field (``type="json_invalid"``).
        """
        errors: list[dict[str, str]] = []
        value = _decode(self._plan.root, data, self._plan, (), errors)
        if errors:
            shown = "; ".join(f"{e['loc']}: {e['msg']}" for e in errors[:3])
            more = f" (+{len(errors) - 3} more)" if len(errors) > 3 else ""
            raise SchemaValidationError(
                f"output for {self.name}: {len(errors)} JSON-encoded field(s) did not hold "
                f"valid JSON: {shown}{more}",
                schema_name=self.name,
                validation_errors=errors,
            )
        return value

    def encode(self, data: Any) -> Any:
        """Original-shaped data -> the strict shape (for examples, replays and tests).

        Free-form fields become JSON strings; a missing optional field becomes ``null``.
        """
        return _encode(self._plan.root, data, self._plan)


def _loc(path: tuple[str | int, ...]) -> str:
    return ".".join(str(part) for part in path) or "<root>"


def _decode(
    codec: Codec,
    value: Any,
    plan: Plan,
    path: tuple[str | int, ...],
    errors: list[dict[str, str]],
) -> Any:
    if isinstance(codec, Keep):
        return value
    if isinstance(codec, Json):
        if not isinstance(value, str):
            return value  # already decoded, or not strict output: leave it to validation
        try:
            return json.loads(value)
        except json.JSONDecodeError as exc:
            errors.append(
                {
                    "loc": _loc(path),
                    "msg": f"expected a string holding JSON ({exc.msg} at character {exc.pos})",
                    "type": "json_invalid",
                }
            )
            return value
    if isinstance(codec, Object):
        if not isinstance(value, Mapping):
            return value
        fields = {f.name: f for f in codec.fields}
        out: dict[str, Any] = {}
        for key, item in value.items():
            spec = fields.get(key)
            if spec is None:
                out[key] = item
            elif not (item is None and spec.drop_null):
                out[key] = _decode(spec.codec, item, plan, (*path, key), errors)
        return out
    if isinstance(codec, Array):
        if not isinstance(value, list):
            return value
        return [_decode(codec.items, v, plan, (*path, i), errors) for i, v in enumerate(value)]
    if isinstance(codec, Union):
        for branch in codec.branches:
            if branch.strict.accepts(value):
                return _decode(branch.codec, value, plan, path, errors)
        return value
    if isinstance(codec, Ref):
        return _decode(plan.defs[codec.name], value, plan, path, errors)
    if isinstance(value, Mapping) and WRAP_KEY in value:
        return _decode(codec.inner, value[WRAP_KEY], plan, path, errors)
    return value


def _encode(codec: Codec, value: Any, plan: Plan) -> Any:
    if isinstance(codec, Keep):
        return value
    if isinstance(codec, Json):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(codec, Object):
        if not isinstance(value, Mapping):
            return value
        out: dict[str, Any] = {}
        for spec in codec.fields:
            if spec.name in value:
                out[spec.name] = _encode(spec.codec, value[spec.name], plan)
            elif spec.optional:
                out[spec.name] = None
        out.update({k: v for k, v in value.items() if k not in out})
        return out
    if isinstance(codec, Array):
        if not isinstance(value, list | tuple):
            return value
        return [_encode(codec.items, v, plan) for v in value]
    if isinstance(codec, Union):
        candidates = [b for b in codec.branches if b.original.accepts(value)]
        for branch in candidates:
            out = _encode(branch.codec, value, plan)
            if _conforms(branch.schema, out, plan):
                return out
        return _encode(candidates[0].codec, value, plan) if candidates else value
    if isinstance(codec, Ref):
        return _encode(plan.defs[codec.name], value, plan)
    return {WRAP_KEY: _encode(codec.inner, value, plan)}


_KIND_CHECKS: Final[Mapping[str, Callable[[Any], bool]]] = {
    "null": lambda v: v is None,
    "boolean": lambda v: isinstance(v, bool),
    "integer": lambda v: "integer" in value_kinds(v),
    "number": lambda v: is_number(v),
    "string": lambda v: isinstance(v, str),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, Mapping),
}


def _conforms(node: Any, value: Any, plan: Plan) -> bool:
    """Whether ``value`` fits a strict schema's structure (types, keys, enums; no bounds)."""
    if not isinstance(node, Mapping):
        return True
    ref = node.get("$ref")
    if isinstance(ref, str):
        name = plan.root_name if ref == "#" else unescape(ref.removeprefix("#/$defs/"))
        target = plan.schemas.get(name)
        return target is None or _conforms(target, value, plan)
    branches = node.get("anyOf")
    if isinstance(branches, list) and not any(_conforms(b, value, plan) for b in branches):
        return False
    if "const" in node and canon(value) != canon(node["const"]):
        return False
    if isinstance(node.get("enum"), list) and canon(value) not in map(canon, node["enum"]):
        return False
    kinds = node.get("type")
    listed = kinds if isinstance(kinds, list) else [kinds] if kinds else []
    if listed and not any(_KIND_CHECKS.get(k, bool)(value) for k in listed):
        return False
    props = node.get("properties")
    if isinstance(value, Mapping) and isinstance(props, Mapping):
        return set(value) == set(props) and all(
            _conforms(props[k], v, plan) for k, v in value.items()
        )
    if isinstance(value, list) and isinstance(node.get("items"), Mapping):
        return all(_conforms(node["items"], v, plan) for v in value)
    return True


def data_paths(
    codec: Codec,
    plan: Plan,
    path: tuple[str, ...],
    seen: frozenset[str],
    encoded: dict[tuple[str, ...], None],
    nullable: dict[tuple[str, ...], None],
) -> None:
    if isinstance(codec, Json):
        encoded[path] = None
    elif isinstance(codec, Object):
        for spec in codec.fields:
            if spec.drop_null:
                nullable[(*path, spec.name)] = None
            data_paths(spec.codec, plan, (*path, spec.name), seen, encoded, nullable)
    elif isinstance(codec, Array):
        data_paths(codec.items, plan, (*path, "[]"), seen, encoded, nullable)
    elif isinstance(codec, Union):
        for branch in codec.branches:
            data_paths(branch.codec, plan, path, seen, encoded, nullable)
    elif isinstance(codec, Ref):
        if codec.name not in seen:
            data_paths(plan.defs[codec.name], plan, path, seen | {codec.name}, encoded, nullable)
    elif isinstance(codec, Wrap):
        data_paths(codec.inner, plan, path, seen, encoded, nullable)
