"""OpenAI strict-schema mode: make a JSON schema acceptable to ``strict: true``.

OpenAI's structured outputs (``response_format: {"type": "json_schema", "json_schema":
{"name", "strict": true, "schema"}}``) accept a subset of JSON Schema only, and answer
"400 Invalid schema for response_format" to anything else. :func:`harden_schema`
rewrites a schema (typically pydantic's ``model_json_schema()``) into that subset and
returns a :class:`StrictSchema` that maps data between the two shapes:

* every object gets ``additionalProperties: false`` and lists every property in
  ``required``; a property that was optional becomes nullable, and
  :meth:`StrictSchema.decode` drops the ``null`` again;
* a free-form value (``dict[str, Any]``, ``additionalProperties: true``, a bare ``{}``,
  a tuple, an ambiguous union) becomes a string holding JSON, which ``decode`` parses;
* keywords strict mode refuses are removed; constraints among them are kept as a note
  in the description, so the model still reads them (pydantic validates them after).

:func:`is_strict_compliant` lists what OpenAI would refuse in a schema, and
:func:`strict_schema_enabled` reads the ``FLUID_OPENAI_STRICT_SCHEMA`` flag.

Where each rule comes from:

[guide]  OpenAI, Structured Outputs, "Supported schemas":
         https://platform.openai.com/docs/guides/structured-outputs#supported-schemas
[sdk]    openai-python, ``src/openai/lib/_pydantic.py`` (``to_strict_json_schema``)
[pyai]   pydantic-ai, ``pydantic_ai/profiles/openai.py`` (``OpenAIJsonSchemaTransformer``)
[errors] the API's own 400 messages, as reported upstream: "$ref cannot have keywords
         {'description'}" (camel-ai/camel#3001, defog-ai/defog#244), "array schema missing
         items" (sigoden/aichat#1049), "'default' is not permitted"
"""

from __future__ import annotations

import copy
import json
import logging
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import unquote

from fluid_build._redact import redact, truncate
from fluid_build.copilot.agents.errors import SchemaValidationError

__all__ = [
    "STRICT_SCHEMA_ENV",
    "StrictSchema",
    "harden_schema",
    "is_strict_compliant",
    "strict_schema_enabled",
]

#: The environment variable that turns strict-schema mode on for OpenAI and Azure OpenAI.
STRICT_SCHEMA_ENV: Final = "FLUID_OPENAI_STRICT_SCHEMA"

LOG = logging.getLogger("fluid_build.config")

_TRUE: Final = frozenset({"1", "true", "yes", "on"})
_FALSE: Final = frozenset({"", "0", "false", "no", "off"})

# [guide] "Supported types": string, number, boolean, integer, object, array, enum,
# anyOf; null only inside a union (`"type": ["string", "null"]`, `{"type": "null"}`).
_TYPES: Final = frozenset({"string", "number", "integer", "boolean", "object", "array", "null"})
_PRIMITIVES: Final = frozenset({"string", "number", "integer", "boolean"})
# [guide] "Supported properties", per type. Everything else is refused, among them the
# composition keywords `allOf`, `not`, `dependentRequired`, `dependentSchemas`, `if`,
# `then`, `else` ("Some type-specific keywords are not yet supported"). `minLength` and
# `maxLength` are not in the supported list, and [pyai] strips them too.
_NUMBER_KEYWORDS: Final = (
    "multipleOf",
    "maximum",
    "exclusiveMaximum",
    "minimum",
    "exclusiveMinimum",
)
_TYPE_KEYWORDS: Final[Mapping[str, tuple[str, ...]]] = {
    "string": ("pattern", "format"),
    "number": _NUMBER_KEYWORDS,
    "integer": _NUMBER_KEYWORDS,
    "array": ("items", "minItems", "maxItems"),
    "object": ("properties", "required", "additionalProperties"),
    "boolean": (),
    "null": (),
}
# Keywords any node may carry. `title` and `description` are annotations the API
# accepts ([sdk] sends pydantic's titles unchanged); `const` values count toward the
# [guide]'s string-size limit, so `const` is supported.
_COMMON_KEYWORDS: Final = frozenset(
    {"type", "enum", "const", "anyOf", "$ref", "title", "description"}
)
_ANNOTATIONS: Final = ("title", "description")
# [guide] "format — Predefined formats for strings. Currently supported: ..."
_FORMATS: Final = frozenset(
    {"date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid"}
)
# [pyai] refuses patterns with look-around (`_regex_contains_lookaround`).
_LOOKAROUND: Final = ("(?=", "(?!", "(?<=", "(?<!")
# Dropped without a trace: annotations with no bearing on the data. `default` is refused
# outright ([errors] "'default' is not permitted"; [pyai] strips it in strict mode);
# `discriminator` and `nullable` are OpenAPI, `nullable` is turned into a null branch.
_DROPPED: Final = frozenset(
    [
        "default",
        "examples",
        "example",
        "$schema",
        "$id",
        "$anchor",
        "$comment",
        "$defs",
        "definitions",
        "deprecated",
        "readOnly",
        "writeOnly",
        "discriminator",
        "nullable",
        "contentMediaType",
        "contentEncoding",
        "contentSchema",
        "xml",
        "externalDocs",
    ]
)
# Constraints strict mode cannot carry: removed, and named in the description instead.
_NOTED: Final = frozenset(
    [
        "minLength",
        "maxLength",
        "pattern",
        "format",
        "uniqueItems",
        "minProperties",
        "maxProperties",
        "propertyNames",
        "contains",
        "minContains",
        "maxContains",
        "unevaluatedProperties",
        "unevaluatedItems",
        "dependentRequired",
        "dependentSchemas",
        "dependencies",
        "not",
        "if",
        "then",
        "else",
    ]
)
# [guide] "Objects have limitations on nesting depth and size": "up to 5000 object
# properties total, with up to 10 levels of nesting" (the first release said 100 and 5).
# The guide does not say whether an array is a level; counting it fails closed.
_MAX_PROPERTIES: Final = 5000
_MAX_DEPTH: Final = 10
# [guide] "Limitations on total string size": property names, definition names, enum
# values and const values together "cannot exceed 120,000 characters".
_MAX_STRING_CHARS: Final = 120_000
# [guide] "Limitations on enum size": "up to 1000 enum values across all enum
# properties"; one string enum with more than 250 values holds at most 15,000 characters.
_MAX_ENUM_VALUES: Final = 1000
_LARGE_ENUM: Final = 250
_MAX_LARGE_ENUM_CHARS: Final = 15_000
# [sdk] `ResponseFormatJSONSchema.name`: "Must be a-z, A-Z, 0-9, or contain underscores
# and dashes, with a maximum length of 64."
_NAME_UNSAFE: Final = re.compile(r"[^A-Za-z0-9_-]+")
_MAX_NAME: Final = 64
_WRAP_KEY: Final = "value"
_MAX_WALK: Final = 200
_MAX_NOTE: Final = 80


# -- shapes: what a schema accepts, at its top level only ------------------------------


@dataclass(frozen=True, slots=True)
class _Obj:
    """Objects whose keys lie between ``required`` and ``allowed`` (None: any keys)."""

    required: frozenset[str]
    allowed: frozenset[str] | None

    def overlaps(self, other: _Obj) -> bool:
        needed = self.required | other.required
        if self.allowed is None:
            return other.allowed is None or needed <= other.allowed
        if other.allowed is None:
            return needed <= self.allowed
        return needed <= (self.allowed & other.allowed)

    def accepts(self, keys: frozenset[str]) -> bool:
        return self.required <= keys and (self.allowed is None or keys <= self.allowed)


@dataclass(frozen=True, slots=True)
class _Shape:
    """What a schema accepts: whole JSON kinds, objects by their keys, single values."""

    kinds: frozenset[str] = frozenset()
    objects: tuple[_Obj, ...] = ()
    literals: frozenset[str] = frozenset()  # canonical JSON of enum and const values

    def __or__(self, other: _Shape) -> _Shape:
        objects = self.objects + tuple(o for o in other.objects if o not in self.objects)
        return _Shape(self.kinds | other.kinds, objects, self.literals | other.literals)

    def overlaps(self, other: _Shape) -> bool:
        """Whether some value is accepted by both."""
        if self.kinds & other.kinds:
            return True
        if any(a.overlaps(b) for a in self.objects for b in other.objects):
            return True
        mine = any(other.accepts(json.loads(v)) for v in self.literals)
        return mine or any(self.accepts(json.loads(v)) for v in other.literals)

    def accepts(self, value: Any) -> bool:
        if isinstance(value, Mapping):
            keys = frozenset(str(k) for k in value)
            if any(o.accepts(keys) for o in self.objects):
                return True
        elif _value_kinds(value) & self.kinds:
            return True
        return bool(self.literals) and _canon(value) in self.literals


_EMPTY: Final = _Shape()
_NULL: Final = _Shape(frozenset({"null"}))
_STRING: Final = _Shape(frozenset({"string"}))
_ANY: Final = _Shape(
    frozenset({"null", "boolean", "integer", "number", "string", "array"}),
    (_Obj(frozenset(), None),),
)


def _value_kinds(value: Any) -> frozenset[str]:
    if value is None:
        return frozenset({"null"})
    if isinstance(value, bool):
        return frozenset({"boolean"})
    if isinstance(value, int):
        return frozenset({"integer"})
    if isinstance(value, float):
        return frozenset({"number", "integer"}) if value.is_integer() else frozenset({"number"})
    if isinstance(value, str):
        return frozenset({"string"})
    if isinstance(value, list | tuple):
        return frozenset({"array"})
    return frozenset()


def _plain_json(value: Any) -> Any:
    """``value`` with whole floats as ints: JSON Schema holds ``1`` and ``1.0`` equal."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, Mapping):
        return {str(k): _plain_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain_json(v) for v in value]
    return value


def _canon(value: Any) -> str:
    try:
        return json.dumps(_plain_json(value), sort_keys=True)
    except (TypeError, ValueError):
        return f"<{type(value).__name__}>"  # not JSON: equal to no literal


def _values_shape(values: Iterable[Any]) -> _Shape:
    return _Shape(literals=frozenset(_canon(v) for v in values))


def _is_free_object(node: Mapping[str, Any]) -> bool:
    """An object whose keys are not all known: it cannot be strict, only JSON-encoded."""
    props = node.get("properties")
    extra = node.get("additionalProperties")
    if "patternProperties" in node or (extra is not None and extra is not False):
        return True
    if not isinstance(props, Mapping):
        return True
    return not props and extra is not False


def _type_shape(kind: str, node: Mapping[str, Any]) -> _Shape:
    if kind == "object":
        if _is_free_object(node):
            return _Shape(objects=(_Obj(frozenset(), None),))
        keys = frozenset(node["properties"])
        required = node.get("required")
        needed = frozenset(r for r in required if r in keys) if isinstance(required, list) else keys
        return _Shape(objects=(_Obj(needed & keys if required is not None else frozenset(), keys),))
    if kind == "number":
        return _Shape(frozenset({"number", "integer"}))
    if kind in _TYPES:
        return _Shape(frozenset({kind}))
    return _ANY


def _shape(node: Any, ref_shape: Callable[[str], _Shape]) -> _Shape:
    """What ``node`` accepts at its top level; ``$ref`` is resolved by ``ref_shape``."""
    if node is False:
        return _EMPTY
    if not isinstance(node, Mapping):
        return _ANY
    shape = _top_shape(node, ref_shape)
    if node.get("nullable") is True:
        shape = shape | _NULL
    return shape


def _top_shape(node: Mapping[str, Any], ref_shape: Callable[[str], _Shape]) -> _Shape:
    ref = node.get("$ref")
    if isinstance(ref, str):
        return ref_shape(ref)
    for key in ("anyOf", "oneOf"):
        branches = node.get(key)
        if isinstance(branches, list) and branches:
            shape = _EMPTY
            for branch in branches:
                shape = shape | _shape(branch, ref_shape)
            return shape
    entries = node.get("allOf")
    if isinstance(entries, list) and len(entries) == 1:
        return _shape({**_without(node, "allOf"), **_as_dict(entries[0])}, ref_shape)
    if "const" in node:
        return _values_shape([node["const"]])
    if isinstance(node.get("enum"), list):
        return _values_shape(node["enum"])
    kinds = node.get("type")
    if isinstance(kinds, str):
        return _type_shape(kinds, node)
    if isinstance(kinds, list):
        shape = _EMPTY
        for kind in kinds:
            shape = shape | (_type_shape(kind, node) if isinstance(kind, str) else _ANY)
        return shape
    implied = _implied_type(node)
    return _type_shape(implied, node) if implied else _ANY


def _implied_type(node: Mapping[str, Any]) -> str | None:
    if "properties" in node or "additionalProperties" in node or "patternProperties" in node:
        return "object"
    if "items" in node or "prefixItems" in node:
        return "array"
    return None


# -- codecs: how data moves between the original and the strict shape -----------------


@dataclass(frozen=True, slots=True)
class _Keep:
    """The data has the same shape on both sides."""


@dataclass(frozen=True, slots=True)
class _Json:
    """A free-form value, carried as a string of JSON."""


@dataclass(frozen=True, slots=True)
class _Field:
    name: str
    codec: _Codec
    optional: bool  # not in the original `required`: encode() adds null when missing
    drop_null: bool  # null was added by hardening: decode() drops it again


@dataclass(frozen=True, slots=True)
class _Object:
    fields: tuple[_Field, ...]


@dataclass(frozen=True, slots=True)
class _Array:
    items: _Codec


@dataclass(frozen=True, slots=True)
class _Branch:
    codec: _Codec
    strict: _Shape  # picks the branch in decode()
    original: _Shape  # the candidates in encode()
    schema: dict[str, Any]  # what encode() checks its result against


@dataclass(frozen=True, slots=True)
class _Union:
    branches: tuple[_Branch, ...]


@dataclass(frozen=True, slots=True)
class _Ref:
    name: str


@dataclass(frozen=True, slots=True)
class _Wrap:
    """A root that is not an object, carried as ``{"value": ...}``."""

    inner: _Codec


_Codec = _Keep | _Json | _Object | _Array | _Union | _Ref | _Wrap
_KEEP: Final = _Keep()
_JSON: Final = _Json()


@dataclass(frozen=True, slots=True)
class _Plan:
    root: _Codec
    defs: Mapping[str, _Codec]
    schemas: Mapping[str, dict[str, Any]] = field(default_factory=dict)  # strict, by name
    root_name: str = "root"


# -- the public value -------------------------------------------------------------------


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
    _plan: _Plan = field(default=_Plan(_KEEP, {}), repr=False, compare=False)

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


# -- decode / encode ------------------------------------------------------------------


def _loc(path: tuple[str | int, ...]) -> str:
    return ".".join(str(part) for part in path) or "<root>"


def _decode(
    codec: _Codec,
    value: Any,
    plan: _Plan,
    path: tuple[str | int, ...],
    errors: list[dict[str, str]],
) -> Any:
    if isinstance(codec, _Keep):
        return value
    if isinstance(codec, _Json):
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
    if isinstance(codec, _Object):
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
    if isinstance(codec, _Array):
        if not isinstance(value, list):
            return value
        return [_decode(codec.items, v, plan, (*path, i), errors) for i, v in enumerate(value)]
    if isinstance(codec, _Union):
        for branch in codec.branches:
            if branch.strict.accepts(value):
                return _decode(branch.codec, value, plan, path, errors)
        return value
    if isinstance(codec, _Ref):
        return _decode(plan.defs[codec.name], value, plan, path, errors)
    if isinstance(value, Mapping) and _WRAP_KEY in value:
        return _decode(codec.inner, value[_WRAP_KEY], plan, path, errors)
    return value


def _encode(codec: _Codec, value: Any, plan: _Plan) -> Any:
    if isinstance(codec, _Keep):
        return value
    if isinstance(codec, _Json):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(codec, _Object):
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
    if isinstance(codec, _Array):
        if not isinstance(value, list | tuple):
            return value
        return [_encode(codec.items, v, plan) for v in value]
    if isinstance(codec, _Union):
        candidates = [b for b in codec.branches if b.original.accepts(value)]
        for branch in candidates:
            out = _encode(branch.codec, value, plan)
            if _conforms(branch.schema, out, plan):
                return out
        return _encode(candidates[0].codec, value, plan) if candidates else value
    if isinstance(codec, _Ref):
        return _encode(plan.defs[codec.name], value, plan)
    return {_WRAP_KEY: _encode(codec.inner, value, plan)}


_KIND_CHECKS: Final[Mapping[str, Callable[[Any], bool]]] = {
    "null": lambda v: v is None,
    "boolean": lambda v: isinstance(v, bool),
    "integer": lambda v: "integer" in _value_kinds(v),
    "number": lambda v: _is_number(v),
    "string": lambda v: isinstance(v, str),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, Mapping),
}


def _conforms(node: Any, value: Any, plan: _Plan) -> bool:
    """Whether ``value`` fits a strict schema's structure (types, keys, enums; no bounds)."""
    if not isinstance(node, Mapping):
        return True
    ref = node.get("$ref")
    if isinstance(ref, str):
        name = plan.root_name if ref == "#" else _unescape(ref.removeprefix("#/$defs/"))
        target = plan.schemas.get(name)
        return target is None or _conforms(target, value, plan)
    branches = node.get("anyOf")
    if isinstance(branches, list) and not any(_conforms(b, value, plan) for b in branches):
        return False
    if "const" in node and _canon(value) != _canon(node["const"]):
        return False
    if isinstance(node.get("enum"), list) and _canon(value) not in map(_canon, node["enum"]):
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


def _paths(
    codec: _Codec,
    plan: _Plan,
    path: tuple[str, ...],
    seen: frozenset[str],
    encoded: dict[tuple[str, ...], None],
    nullable: dict[tuple[str, ...], None],
) -> None:
    if isinstance(codec, _Json):
        encoded[path] = None
    elif isinstance(codec, _Object):
        for spec in codec.fields:
            if spec.drop_null:
                nullable[(*path, spec.name)] = None
            _paths(spec.codec, plan, (*path, spec.name), seen, encoded, nullable)
    elif isinstance(codec, _Array):
        _paths(codec.items, plan, (*path, "[]"), seen, encoded, nullable)
    elif isinstance(codec, _Union):
        for branch in codec.branches:
            _paths(branch.codec, plan, path, seen, encoded, nullable)
    elif isinstance(codec, _Ref):
        if codec.name not in seen:
            _paths(plan.defs[codec.name], plan, path, seen | {codec.name}, encoded, nullable)
    elif isinstance(codec, _Wrap):
        _paths(codec.inner, plan, path, seen, encoded, nullable)


# -- hardening --------------------------------------------------------------------------


def _without(node: Mapping[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in node.items() if k not in keys}


def _as_dict(node: Any) -> dict[str, Any]:
    if node is True or not isinstance(node, Mapping):
        return {}
    return dict(node)


def _has_lookaround(pattern: str) -> bool:
    escaped = False
    for i, char in enumerate(pattern):
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif pattern.startswith(_LOOKAROUND, i):
            return True
    return False


def _note(key: str, value: Any) -> str:
    shown = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return f"{key}={truncate(shown, _MAX_NOTE)}"


def _describe(node: Mapping[str, Any], notes: list[str]) -> dict[str, Any]:
    """``title`` and ``description`` of ``node``, with ``notes`` appended to the latter."""
    out: dict[str, Any] = {k: node[k] for k in _ANNOTATIONS if isinstance(node.get(k), str)}
    if notes:
        joined = ", ".join(notes)
        base = out.get("description")
        out["description"] = f"{base} ({joined})" if base else f"Constraints: {joined}."
    return out


def _escape(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")


def _unescape(part: str) -> str:
    return part.replace("~1", "/").replace("~0", "~")


def _resolve(root: Any, pointer: str) -> Any:
    """The node at a local JSON pointer (``#``, ``#/$defs/X``), or None."""
    if pointer == "#":
        return root
    if not pointer.startswith("#/"):
        return None
    node = root
    for part in pointer[2:].split("/"):
        key = _unescape(unquote(part))
        if isinstance(node, Mapping) and key in node:
            node = node[key]
        elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
        else:
            return None
    return node


def _canonical(pointer: str) -> str:
    return "#" if pointer in ("#", "#/") else pointer


@dataclass(frozen=True, slots=True)
class _Built:
    schema: dict[str, Any]
    codec: _Codec
    strict: _Shape


class _Hardener:
    """One hardening run. Mutable, but private to :func:`harden_schema`."""

    def __init__(self, root: dict[str, Any]) -> None:
        self.root = root
        self.names: dict[str, str] = {}  # source pointer -> def name
        self.sources: dict[str, Any] = {}  # def name -> source node
        self.defs: dict[str, dict[str, Any]] = {}  # def name -> strict schema
        self.codecs: dict[str, _Codec] = {}
        self.busy: set[str] = set()
        # Defs being built whose walk has not yet passed a property or an array item: a
        # ref back to one of them would recurse without consuming any data.
        self.unguarded: set[str] = set()
        self.unravelling: set[str] = set()  # refs being inlined for their siblings
        self.depth = 0
        self.root_name = "root"

    # shapes ---------------------------------------------------------------------------

    def original_shape(self, node: Any, seen: frozenset[str] = frozenset()) -> _Shape:
        def ref_shape(ref: str) -> _Shape:
            pointer = _canonical(unquote(ref))
            target = _resolve(self.root, pointer)
            if pointer in seen or target is None:
                return _ANY
            return self.original_shape(target, seen | {pointer})

        return _shape(node, ref_shape)

    def strict_shape(self, node: Any, seen: frozenset[str] = frozenset()) -> _Shape:
        def ref_shape(ref: str) -> _Shape:
            name = self._name_of_strict_ref(ref)
            if name in seen:
                return _ANY
            if name in self.busy or name not in self.defs:
                # Not built yet: what the source accepts, or a string if it gets encoded.
                return self.original_shape(self.sources.get(name, True)) | _STRING
            return self.strict_shape(self.defs[name], seen | {name})

        return _shape(node, ref_shape)

    def _name_of_strict_ref(self, ref: str) -> str:
        if ref == "#":
            return self.root_name
        return _unescape(ref.removeprefix("#/$defs/"))

    def is_keep(self, codec: _Codec, seen: frozenset[str] = frozenset()) -> bool:
        if isinstance(codec, _Keep):
            return True
        if isinstance(codec, _Ref):
            if codec.name in seen:
                return True
            if codec.name in self.busy or codec.name not in self.codecs:
                return False
            return self.is_keep(self.codecs[codec.name], seen | {codec.name})
        return False

    # refs -------------------------------------------------------------------------------

    def target(self, ref: Any) -> str | None:
        """The def name for a local ``$ref``, hardening its target on first use."""
        if not isinstance(ref, str) or not ref.startswith("#"):
            return None
        pointer = _canonical(unquote(ref))
        if pointer in self.names:
            return self.names[pointer]
        node = _resolve(self.root, pointer)
        if node is None:
            return None
        name = self._fresh(pointer)
        self.names[pointer] = name
        self.sources[name] = node
        self.busy.add(name)
        self.unguarded.add(name)
        built = self.harden(node)
        self.busy.discard(name)
        self.unguarded.discard(name)
        self.defs[name] = built.schema
        self.codecs[name] = built.codec
        return name

    def _fresh(self, pointer: str) -> str:
        base = _unescape(pointer.rsplit("/", 1)[-1]) or "def"
        taken = set(self.names.values())
        name, n = base, 1
        while name in taken:
            n += 1
            name = f"{base}_{n}"
        return name

    def ref_string(self, name: str) -> str:
        return "#" if name == self.root_name else f"#/$defs/{_escape(name)}"

    def follow(self, node: Any) -> Any:
        """``node`` with any chain of bare ``$ref`` resolved (None on a cycle or a miss)."""
        seen: set[str] = set()
        while isinstance(node, Mapping) and isinstance(node.get("$ref"), str):
            pointer = _canonical(unquote(node["$ref"]))
            if pointer in seen:
                return None
            seen.add(pointer)
            target = _resolve(self.root, pointer)
            if target is None:
                return None
            node = {**_as_dict(target), **_without(node, "$ref")}
        return node

    # the walk ---------------------------------------------------------------------------

    def harden(self, node: Any) -> _Built:
        if not isinstance(node, Mapping):
            return self.encoded({})  # `true`, `false`: anything goes, as JSON
        if self.depth >= _MAX_WALK:
            return self.encoded(node)  # a $ref/allOf loop that never reaches data
        self.depth += 1
        try:
            built = self.harden_dict(node)
        finally:
            self.depth -= 1
        if node.get("nullable") is True and not built.strict.accepts(None):
            built = _Built(_add_null(built.schema), built.codec, built.strict | _NULL)
        return built

    def harden_data(self, node: Any) -> _Built:
        """Harden a property or an array item: refs below it consume data."""
        saved, self.unguarded = self.unguarded, set()
        try:
            return self.harden(node)
        finally:
            self.unguarded = saved

    def harden_dict(self, node: Mapping[str, Any]) -> _Built:
        if "$ref" in node:
            return self.ref(node)
        if "allOf" in node:
            return self.all_of(node)
        if "oneOf" in node:
            if "anyOf" in node:
                return self.encoded(node)
            # [pyai] "OpenAI does not support oneOf in strict mode": anyOf instead.
            node = {**_without(node, "oneOf"), "anyOf": node["oneOf"]}
        if "anyOf" in node:
            return self.any_of(node)
        kinds = node.get("type")
        if isinstance(kinds, list):
            return self.type_list(node, kinds)
        kind = kinds if isinstance(kinds, str) else _implied_type(node)
        if kind is None:
            if "enum" in node or "const" in node:
                return self.plain(node, None)
            return self.encoded(node)  # a bare `{}` or annotations only: anything goes
        if kind not in _TYPES:
            return self.encoded(node)
        if kind == "object":
            return self.object(node)
        if kind == "array":
            return self.array(node)
        return self.plain(node, kind)

    def encoded(self, node: Mapping[str, Any]) -> _Built:
        kind = node.get("type") if isinstance(node.get("type"), str) else _implied_type(node)
        what = {"object": "JSON object", "array": "JSON array"}.get(str(kind), "JSON value")
        hint = f"a {what}, JSON-encoded: write it as a string"
        base = node.get("description")
        text = (
            f"{base} ({hint})"
            if isinstance(base, str) and base
            else f"{hint[0].upper()}{hint[1:]}."
        )
        schema: dict[str, Any] = {"type": "string"}
        if isinstance(node.get("title"), str):
            schema["title"] = node["title"]
        schema["description"] = text
        return _Built(schema, _JSON, _STRING)

    def kept_keywords(
        self, node: Mapping[str, Any], kinds: Iterable[str]
    ) -> tuple[dict[str, Any], list[str]]:
        """The supported type keywords of ``node`` and notes for the refused constraints."""
        allowed = {k for kind in kinds for k in _TYPE_KEYWORDS.get(kind, ())}
        kept: dict[str, Any] = {}
        notes: list[str] = []
        for key, value in node.items():
            if key in allowed and key not in ("items", "properties", "required"):
                if _refused(key, value):
                    notes.append(_note(key, value))
                elif key != "additionalProperties":
                    kept[key] = value
            elif key in _NOTED:
                notes.append(_note(key, value))
        return kept, notes

    def plain(self, node: Mapping[str, Any], kind: str | None) -> _Built:
        kept, notes = self.kept_keywords(node, [kind] if kind else [])
        schema: dict[str, Any] = {"type": kind} if kind else {}
        schema.update(_describe(node, notes))
        if isinstance(node.get("enum"), list) and node["enum"]:
            schema["enum"] = node["enum"]
        if "const" in node:
            schema["const"] = node["const"]
        schema.update(kept)
        return _Built(schema, _KEEP, self.strict_shape(schema))

    def type_list(self, node: Mapping[str, Any], kinds: list[Any]) -> _Built:
        named = list(dict.fromkeys(kinds))
        if not named or not all(isinstance(k, str) and k in _TYPES for k in named):
            return self.encoded(node)
        others = [k for k in named if k != "null"]
        if len(named) == 1:
            return self.harden_dict({**node, "type": named[0]})
        if (
            len(others) == 1
            and others[0] in _PRIMITIVES
            and "enum" not in node
            and "const" not in node
        ):
            # [guide] `"type": ["string", "null"]` is the documented nullable form.
            built = self.plain({**node, "type": others[0]}, others[0])
            return _Built(_add_null(built.schema), built.codec, built.strict | _NULL)
        branches = []
        for kind in named:
            keep = set(_TYPE_KEYWORDS[kind]) | {"enum", "const"} | _NOTED
            branches.append({"type": kind, **{k: v for k, v in node.items() if k in keep}})
        return self.any_of({**_describe(node, []), "anyOf": branches})

    def object(self, node: Mapping[str, Any]) -> _Built:
        if _is_free_object(node):
            return self.encoded(node)
        props: Mapping[str, Any] = node["properties"]
        required = node.get("required")
        needed = set(required) if isinstance(required, list) else set()
        out: dict[str, Any] = {}
        fields: list[_Field] = []
        for name, sub in props.items():
            built = self.harden_data(sub)
            optional = name not in needed
            drop_null = optional and not built.strict.accepts(None)
            out[name] = _add_null(built.schema) if drop_null else built.schema
            fields.append(_Field(name, built.codec, optional, drop_null))
        _, notes = self.kept_keywords(node, ["object"])
        schema: dict[str, Any] = {"type": "object", **_describe(node, notes)}
        schema["properties"] = out
        schema["required"] = list(out)  # [guide] "All fields must be required"
        schema["additionalProperties"] = False  # [guide] "must always be set in objects"
        keep = all(self.is_keep(f.codec) and not f.optional for f in fields)
        codec: _Codec = _KEEP if keep else _Object(tuple(fields))
        keys = frozenset(out)
        return _Built(schema, codec, _Shape(objects=(_Obj(keys, keys),)))

    def array(self, node: Mapping[str, Any]) -> _Built:
        items = node.get("items", True)
        if "prefixItems" in node or isinstance(items, list):
            return self.encoded(node)  # tuples: not in the [guide]'s subset
        # [errors] "array schema missing items": an untyped item is encoded instead.
        built = self.harden_data(items)
        kept, notes = self.kept_keywords(node, ["array"])
        schema: dict[str, Any] = {"type": "array", **_describe(node, notes), "items": built.schema}
        schema.update(kept)
        codec: _Codec = _KEEP if self.is_keep(built.codec) else _Array(built.codec)
        return _Built(schema, codec, _Shape(frozenset({"array"})))

    def ref(self, node: Mapping[str, Any]) -> _Built:
        siblings = _without(node, "$ref")
        constraints = [k for k in siblings if k not in _ANNOTATIONS and k not in _DROPPED]
        if constraints:
            # [sdk] unravels a `$ref` with other keywords: the ref's target, then the node.
            pointer = _canonical(unquote(str(node["$ref"])))
            merged = self.follow(node)
            if merged is None or pointer in self.unravelling:
                return self.encoded(node)  # inlining it again would never end
            self.unravelling.add(pointer)
            try:
                return self.harden(merged)
            finally:
                self.unravelling.discard(pointer)
        name = self.target(node["$ref"])
        if name is None or name in self.unguarded:
            return self.encoded(node)  # remote, dangling, or a loop that holds no data
        schema: dict[str, Any] = {"$ref": self.ref_string(name)}
        strict = self.strict_shape(schema)
        described = _describe(node, [])
        if described:
            # [errors] "$ref cannot have keywords {'description'}": [pyai] moves the ref
            # into a one-branch anyOf, which may carry them.
            schema = {"anyOf": [schema], **described}
        return _Built(schema, _Ref(name), strict)

    def all_of(self, node: Mapping[str, Any]) -> _Built:
        entries = node["allOf"]
        rest = _without(node, "allOf")
        if not isinstance(entries, list) or not entries:
            return self.harden(rest)
        if len(entries) == 1:
            # [sdk] flattens a one-entry allOf into its parent.
            return self.harden({**rest, **_as_dict(entries[0])})
        merged = _merge_all_of(rest, [self.follow(e) for e in entries])
        return self.encoded(node) if merged is None else self.harden(merged)

    def any_of(self, node: Mapping[str, Any]) -> _Built:
        branches = node["anyOf"]
        extra = [k for k in node if k != "anyOf" and k not in _ANNOTATIONS and k not in _DROPPED]
        if not isinstance(branches, list) or not branches or extra:
            return self.encoded(node)
        built = [self.harden(b) for b in branches]
        originals = [self.original_shape(b) for b in branches]
        keeps = [self.is_keep(b.codec) for b in built]
        for i, one in enumerate(built):
            for j in range(i + 1, len(built)):
                if not (keeps[i] and keeps[j]) and one.strict.overlaps(built[j].strict):
                    # decode() could not tell these branches apart: carry it as JSON.
                    return self.encoded(node)
        described = _describe(node, [])
        if len(built) == 1 and not ("$ref" in built[0].schema and described):
            only = built[0]
            return _Built({**only.schema, **described}, only.codec, only.strict)
        schema = {"anyOf": [b.schema for b in built], **described}
        strict = _EMPTY
        for b in built:
            strict = strict | b.strict
        if all(keeps):
            return _Built(schema, _KEEP, strict)
        union = _Union(
            tuple(
                _Branch(b.codec, b.strict, o, copy.deepcopy(b.schema))
                for b, o in zip(built, originals, strict=True)
            )
        )
        return _Built(schema, union, strict)


def _refused(key: str, value: Any) -> bool:
    """A supported keyword whose value strict mode still refuses."""
    if key == "format":
        return value not in _FORMATS
    if key == "pattern":
        return not isinstance(value, str) or _has_lookaround(value)
    if key in _NUMBER_KEYWORDS:
        return not _is_number(value)  # draft-4's boolean exclusiveMaximum, for one
    if key in ("minItems", "maxItems"):
        return not _is_count(value)
    return False


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _add_null(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` that also accepts null, in the simplest form strict mode takes."""
    kind = schema.get("type")
    if kind in _PRIMITIVES and "enum" not in schema and "const" not in schema:
        return {**schema, "type": [kind, "null"]}
    if list(schema) == ["anyOf"] or ("anyOf" in schema and set(schema) <= {"anyOf", *_ANNOTATIONS}):
        return {**schema, "anyOf": [*schema["anyOf"], {"type": "null"}]}
    return {"anyOf": [schema, {"type": "null"}]}


def _merge_all_of(rest: dict[str, Any], entries: list[Any]) -> dict[str, Any] | None:
    """The entries of an ``allOf`` as one node, or None when they conflict."""
    merged = dict(rest)
    for entry in entries:
        if not isinstance(entry, Mapping):
            return None
        for key, value in entry.items():
            if key == "properties" and isinstance(value, Mapping):
                props = dict(merged.get("properties") or {})
                for name, sub in value.items():
                    if name in props and props[name] != sub:
                        return None
                    props[name] = sub
                merged["properties"] = props
            elif key == "required" and isinstance(value, list):
                merged["required"] = list(dict.fromkeys([*merged.get("required", []), *value]))
            elif key in _ANNOTATIONS or key in _DROPPED:
                merged.setdefault(key, value)
            elif key in merged and merged[key] != value:
                return None
            else:
                merged[key] = value
    return merged


def _refs_in(node: Any) -> Iterable[str]:
    if isinstance(node, Mapping):
        ref = node.get("$ref")
        if isinstance(ref, str):
            yield ref
        for value in node.values():
            yield from _refs_in(value)
    elif isinstance(node, list):
        for value in node:
            yield from _refs_in(value)


def _retarget_root(node: Any, ref: str) -> Any:
    if isinstance(node, Mapping):
        return {
            k: (ref if k == "$ref" and v == "#" else _retarget_root(v, ref))
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [_retarget_root(v, ref) for v in node]
    return node


def _schema_name(name: str | None, schema: Mapping[str, Any]) -> str:
    raw = name if name is not None else schema.get("title")
    cleaned = _NAME_UNSAFE.sub("_", raw if isinstance(raw, str) else "").strip("_")
    return cleaned[:_MAX_NAME] or "response"


def harden_schema(schema: Mapping[str, Any], *, name: str | None = None) -> StrictSchema:
    """A copy of ``schema`` that OpenAI accepts with ``strict: true``, and its codec.

    Pure: ``schema`` is deep-copied and never changed. ``name`` is the response format's
    name (default: the schema's title), cleaned to what the API accepts.
    """
    source = copy.deepcopy(dict(schema))
    run = _Hardener(source)
    run.names["#"] = run.root_name
    top: Any = source
    if isinstance(source.get("$ref"), str) and not [
        k for k in source if k != "$ref" and k not in _ANNOTATIONS and k not in _DROPPED
    ]:
        # pydantic's recursive models: `{"$ref": "#/$defs/Node", "$defs": {...}}`. The
        # target becomes the root, and refs to it become "#" ([guide] root recursion).
        target = run.follow({"$ref": source["$ref"]})
        if isinstance(target, Mapping):
            run.names[_canonical(unquote(source["$ref"]))] = run.root_name
            top = {**_describe(source, []), **target}
    run.sources[run.root_name] = top
    run.busy.add(run.root_name)
    built = run.harden(_without(top, "$defs", "definitions"))
    run.busy.discard(run.root_name)
    run.codecs[run.root_name] = built.codec

    out = built.schema
    root_codec: _Codec = built.codec
    if out.get("type") != "object" or "properties" not in out:
        # [guide] "Root objects must not be anyOf and must be an object": wrap it.
        root_ref = f"#/$defs/{_escape(run.root_name)}"
        inner: dict[str, Any] = out
        if "#" in set(_refs_in(out)) or any("#" in set(_refs_in(d)) for d in run.defs.values()):
            run.defs = {k: _retarget_root(v, root_ref) for k, v in run.defs.items()}
            run.defs[run.root_name] = _retarget_root(out, root_ref)
            inner = {"$ref": root_ref}
            root_codec = _Ref(run.root_name)
        out = {
            "type": "object",
            "properties": {_WRAP_KEY: inner},
            "required": [_WRAP_KEY],
            "additionalProperties": False,
        }
        root_codec = _Wrap(root_codec)

    used = _reachable(out, run.defs)
    if used:
        out = {**out, "$defs": {k: run.defs[k] for k in run.defs if k in used}}
    strict_defs = {**run.defs, run.root_name: run.defs.get(run.root_name, built.schema)}
    plan = _Plan(root_codec, dict(run.codecs), copy.deepcopy(strict_defs), run.root_name)
    encoded: dict[tuple[str, ...], None] = {}
    nullable: dict[tuple[str, ...], None] = {}
    _paths(root_codec, plan, (), frozenset({run.root_name}), encoded, nullable)
    return StrictSchema(
        schema=out,
        encoded_paths=tuple(encoded),
        nullable_paths=tuple(nullable),
        name=_schema_name(name, top),
        _plan=plan,
    )


def _reachable(root: Mapping[str, Any], defs: Mapping[str, Any]) -> set[str]:
    used: set[str] = set()
    todo = list(_refs_in(root))
    while todo:
        ref = todo.pop()
        if not ref.startswith("#/$defs/"):
            continue
        name = _unescape(ref.removeprefix("#/$defs/"))
        if name in defs and name not in used:
            used.add(name)
            todo.extend(_refs_in(defs[name]))
    return used


# -- the oracle -------------------------------------------------------------------------


@dataclass
class _Tally:
    properties: int = 0
    chars: int = 0
    enum_values: int = 0


def is_strict_compliant(schema: Mapping[str, Any]) -> list[str]:
    """What OpenAI's strict mode would refuse in ``schema``; empty when it is compliant.

    Each entry names a JSON pointer into ``schema`` and the rule it breaks.
    """
    if not isinstance(schema, Mapping):
        return ["#: the schema must be a JSON object"]
    problems: list[str] = []
    if "anyOf" in schema:
        problems.append("#: the root must not be anyOf ([guide] root objects)")
    if schema.get("type") != "object":
        problems.append('#: the root must have "type": "object" ([guide] root objects)')
    tally = _Tally()
    defs: dict[str, Any] = {}
    for key in ("$defs", "definitions"):
        block = schema.get(key)
        if block is None:
            continue
        if not isinstance(block, Mapping):
            problems.append(f"#/{key}: must be an object of schemas")
            continue
        for def_name, sub in block.items():
            defs[f"#/{key}/{_escape(def_name)}"] = sub
            tally.chars += len(str(def_name))
    _check(schema, "#", schema, problems, tally, root=True)
    for pointer, sub in defs.items():
        _check(sub, pointer, schema, problems, tally, root=False)
    if tally.properties > _MAX_PROPERTIES:
        problems.append(
            f"#: {tally.properties} object properties in total; the limit is {_MAX_PROPERTIES}"
        )
    depth = _depth(schema, schema, frozenset())
    if depth > _MAX_DEPTH:
        problems.append(f"#: {depth} levels of nesting; the limit is {_MAX_DEPTH}")
    if tally.chars > _MAX_STRING_CHARS:
        problems.append(
            f"#: {tally.chars} characters of property names, definition names, enum and "
            f"const values; the limit is {_MAX_STRING_CHARS}"
        )
    if tally.enum_values > _MAX_ENUM_VALUES:
        problems.append(
            f"#: {tally.enum_values} enum values in total; the limit is {_MAX_ENUM_VALUES}"
        )
    return problems


def _check(
    node: Any,
    loc: str,
    doc: Mapping[str, Any],
    problems: list[str],
    tally: _Tally,
    *,
    root: bool = False,
) -> None:
    if not isinstance(node, Mapping):
        problems.append(f"{loc}: a schema must be a JSON object, not {type(node).__name__}")
        return
    if "$ref" in node:
        _check_ref(node, loc, doc, problems)
        return
    kinds = _declared_types(node, loc, problems)
    if not kinds and not {"enum", "const", "anyOf"} & set(node):
        problems.append(f"{loc}: no type; give it a type, enum, const, anyOf or $ref")
    allowed = set(_COMMON_KEYWORDS) | {k for kind in kinds for k in _TYPE_KEYWORDS[kind]}
    if root:
        allowed |= {"$defs", "definitions"}
    for key in node:
        if key not in allowed:
            problems.append(f"{loc}: '{key}' is not supported here")
    _check_values(node, loc, problems, tally)
    if "object" in kinds:
        _check_object(node, loc, doc, problems, tally)
    if "array" in kinds:
        items = node.get("items")
        if isinstance(items, Mapping):
            _check(items, f"{loc}/items", doc, problems, tally)
        else:
            problems.append(f"{loc}: an array needs an 'items' schema ([errors] missing items)")
    if "anyOf" in node:
        branches = node["anyOf"]
        if not isinstance(branches, list) or not branches:
            problems.append(f"{loc}: anyOf must be a non-empty list of schemas")
        else:
            for i, branch in enumerate(branches):
                _check(branch, f"{loc}/anyOf/{i}", doc, problems, tally)


def _check_ref(
    node: Mapping[str, Any], loc: str, doc: Mapping[str, Any], problems: list[str]
) -> None:
    extra = sorted(k for k in node if k != "$ref")
    if extra:
        problems.append(f"{loc}: $ref cannot have other keywords {extra} ([errors])")
    ref = node["$ref"]
    if not isinstance(ref, str) or not ref.startswith("#"):
        problems.append(f"{loc}: only local refs ('#', '#/$defs/...') are supported")
    elif not isinstance(_resolve(doc, _canonical(unquote(ref))), Mapping):
        problems.append(f"{loc}: $ref {ref!r} does not resolve to a schema")


def _declared_types(node: Mapping[str, Any], loc: str, problems: list[str]) -> list[str]:
    kinds = node.get("type")
    if kinds is None:
        return []
    listed = kinds if isinstance(kinds, list) else [kinds]
    good = [k for k in listed if isinstance(k, str) and k in _TYPES]
    if not listed or len(good) != len(listed) or len(set(good)) != len(good):
        problems.append(f"{loc}: unsupported type {kinds!r}")
    return list(dict.fromkeys(good))


def _check_values(node: Mapping[str, Any], loc: str, problems: list[str], tally: _Tally) -> None:
    fmt = node.get("format")
    if fmt is not None and fmt not in _FORMATS:
        problems.append(f"{loc}: format {fmt!r} is not supported ([guide] string formats)")
    pattern = node.get("pattern")
    if pattern is not None and (not isinstance(pattern, str) or _has_lookaround(pattern)):
        problems.append(f"{loc}: pattern {pattern!r} is not supported (look-around, [pyai])")
    for key in _NUMBER_KEYWORDS:
        if key in node and not _is_number(node[key]):
            problems.append(f"{loc}: {key} must be a number")
    for key in ("minItems", "maxItems"):
        if key in node and not _is_count(node[key]):
            problems.append(f"{loc}: {key} must be a non-negative integer")
    if "enum" in node:
        values = node["enum"]
        if not isinstance(values, list) or not values:
            problems.append(f"{loc}: enum must be a non-empty list")
        else:
            tally.enum_values += len(values)
            chars = sum(len(v) for v in values if isinstance(v, str))
            tally.chars += chars
            strings = all(isinstance(v, str) for v in values)
            if strings and len(values) > _LARGE_ENUM and chars > _MAX_LARGE_ENUM_CHARS:
                problems.append(
                    f"{loc}: {len(values)} enum values hold {chars} characters; over "
                    f"{_LARGE_ENUM} values the limit is {_MAX_LARGE_ENUM_CHARS}"
                )
    if isinstance(node.get("const"), str):
        tally.chars += len(node["const"])


def _check_object(
    node: Mapping[str, Any],
    loc: str,
    doc: Mapping[str, Any],
    problems: list[str],
    tally: _Tally,
) -> None:
    props = node.get("properties")
    if node.get("additionalProperties") is not False:
        problems.append(f"{loc}: objects must set additionalProperties: false ([guide])")
    if not isinstance(props, Mapping):
        problems.append(f"{loc}: an object needs 'properties' ([guide], [pyai])")
        return
    required = node.get("required")
    if not isinstance(required, list) or sorted(map(str, required)) != sorted(props):
        missing = sorted(set(props) - set(required if isinstance(required, list) else []))
        problems.append(
            f"{loc}: 'required' must list every property exactly ([guide] all fields must "
            f"be required); missing {missing}"
        )
    tally.properties += len(props)
    for prop, sub in props.items():
        tally.chars += len(str(prop))
        _check(sub, f"{loc}/properties/{_escape(str(prop))}", doc, problems, tally)


def _depth(node: Any, doc: Mapping[str, Any], seen: frozenset[str]) -> int:
    """Levels of object and array nesting below ``node``, following refs once."""
    if not isinstance(node, Mapping):
        return 0
    ref = node.get("$ref")
    if isinstance(ref, str):
        pointer = _canonical(unquote(ref))
        if pointer in seen:
            return 0
        return _depth(_resolve(doc, pointer), doc, seen | {pointer})
    children: list[Any] = []
    props = node.get("properties")
    if isinstance(props, Mapping):
        children.extend(props.values())
    if isinstance(node.get("items"), Mapping):
        children.append(node["items"])
    if isinstance(node.get("anyOf"), list):
        inner = max((_depth(b, doc, seen) for b in node["anyOf"]), default=0)
    else:
        inner = 0
    kinds = node.get("type")
    listed = kinds if isinstance(kinds, list) else [kinds]
    level = 1 if ("object" in listed or "array" in listed) else 0
    below = max((_depth(c, doc, seen) for c in children), default=0)
    return max(level + below, inner)


# -- the flag ---------------------------------------------------------------------------


def strict_schema_enabled(env: Mapping[str, str] | None = None) -> bool:
    """Whether ``FLUID_OPENAI_STRICT_SCHEMA`` turns strict-schema mode on.

    ``1``/``true``/``yes``/``on`` (any case) turn it on; unset, empty, ``0``/``false``/
    ``no``/``off`` leave it off; anything else leaves it off with one warning.
    """
    source = os.environ if env is None else env
    raw = source.get(STRICT_SCHEMA_ENV)
    if raw is None:
        return False
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value not in _FALSE:
        LOG.warning(
            "%s=%s is not a boolean (use 1/true/yes/on or 0/false/no/off); strict schema "
            "mode stays off",
            STRICT_SCHEMA_ENV,
            repr(truncate(redact(raw), 60)),
        )
    return False
