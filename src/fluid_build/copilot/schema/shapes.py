"""What a schema accepts at its top level: JSON kinds, objects by their keys, single values.

The walker uses shapes to tell the branches of a union apart (two that overlap
cannot be decoded, so the union is carried as JSON), and decoding uses them to
pick the branch a value belongs to.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from fluid_build.copilot.schema.nodes import as_dict, without
from fluid_build.copilot.schema.subset import TYPES

__all__ = [
    "ANY",
    "EMPTY",
    "NULL",
    "STRING",
    "Obj",
    "Shape",
    "canon",
    "implied_type",
    "is_free_object",
    "shape_of",
    "value_kinds",
]


@dataclass(frozen=True, slots=True)
class Obj:
    """Objects whose keys lie between ``required`` and ``allowed`` (None: any keys)."""

    required: frozenset[str]
    allowed: frozenset[str] | None

    def overlaps(self, other: Obj) -> bool:
        needed = self.required | other.required
        if self.allowed is None:
            return other.allowed is None or needed <= other.allowed
        if other.allowed is None:
            return needed <= self.allowed
        return needed <= (self.allowed & other.allowed)

    def accepts(self, keys: frozenset[str]) -> bool:
        return self.required <= keys and (self.allowed is None or keys <= self.allowed)


@dataclass(frozen=True, slots=True)
class Shape:
    """What a schema accepts: whole JSON kinds, objects by their keys, single values."""

    kinds: frozenset[str] = frozenset()
    objects: tuple[Obj, ...] = ()
    literals: frozenset[str] = frozenset()  # canonical JSON of enum and const values

    def __or__(self, other: Shape) -> Shape:
        objects = self.objects + tuple(o for o in other.objects if o not in self.objects)
        return Shape(self.kinds | other.kinds, objects, self.literals | other.literals)

    def overlaps(self, other: Shape) -> bool:
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
        elif value_kinds(value) & self.kinds:
            return True
        return bool(self.literals) and canon(value) in self.literals


EMPTY: Final = Shape()
NULL: Final = Shape(frozenset({"null"}))
STRING: Final = Shape(frozenset({"string"}))
ANY: Final = Shape(
    frozenset({"null", "boolean", "integer", "number", "string", "array"}),
    (Obj(frozenset(), None),),
)


def value_kinds(value: Any) -> frozenset[str]:
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


def canon(value: Any) -> str:
    try:
        return json.dumps(_plain_json(value), sort_keys=True)
    except (TypeError, ValueError):
        return f"<{type(value).__name__}>"  # not JSON: equal to no literal


def _values_shape(values: Iterable[Any]) -> Shape:
    return Shape(literals=frozenset(canon(v) for v in values))


def is_free_object(node: Mapping[str, Any]) -> bool:
    """An object whose keys are not all known: it cannot be strict, only JSON-encoded."""
    props = node.get("properties")
    extra = node.get("additionalProperties")
    if "patternProperties" in node or (extra is not None and extra is not False):
        return True
    if not isinstance(props, Mapping):
        return True
    return not props and extra is not False


def _type_shape(kind: str, node: Mapping[str, Any]) -> Shape:
    if kind == "object":
        if is_free_object(node):
            return Shape(objects=(Obj(frozenset(), None),))
        keys = frozenset(node["properties"])
        required = node.get("required")
        needed = frozenset(r for r in required if r in keys) if isinstance(required, list) else keys
        return Shape(objects=(Obj(needed & keys if required is not None else frozenset(), keys),))
    if kind == "number":
        return Shape(frozenset({"number", "integer"}))
    if kind in TYPES:
        return Shape(frozenset({kind}))
    return ANY


def shape_of(node: Any, ref_shape: Callable[[str], Shape]) -> Shape:
    """What ``node`` accepts at its top level; ``$ref`` is resolved by ``ref_shape``."""
    if node is False:
        return EMPTY
    if not isinstance(node, Mapping):
        return ANY
    shape = _top_shape(node, ref_shape)
    if node.get("nullable") is True:
        shape = shape | NULL
    return shape


def _top_shape(node: Mapping[str, Any], ref_shape: Callable[[str], Shape]) -> Shape:
    ref = node.get("$ref")
    if isinstance(ref, str):
        return ref_shape(ref)
    for key in ("anyOf", "oneOf"):
        branches = node.get(key)
        if isinstance(branches, list) and branches:
            shape = EMPTY
            for branch in branches:
                shape = shape | shape_of(branch, ref_shape)
            return shape
    entries = node.get("allOf")
    if isinstance(entries, list) and len(entries) == 1:
        return shape_of({**without(node, "allOf"), **as_dict(entries[0])}, ref_shape)
    if "const" in node:
        return _values_shape([node["const"]])
    if isinstance(node.get("enum"), list):
        return _values_shape(node["enum"])
    kinds = node.get("type")
    if isinstance(kinds, str):
        return _type_shape(kinds, node)
    if isinstance(kinds, list):
        shape = EMPTY
        for kind in kinds:
            shape = shape | (_type_shape(kind, node) if isinstance(kind, str) else ANY)
        return shape
    implied = implied_type(node)
    return _type_shape(implied, node) if implied else ANY


def implied_type(node: Mapping[str, Any]) -> str | None:
    if "properties" in node or "additionalProperties" in node or "patternProperties" in node:
        return "object"
    if "items" in node or "prefixItems" in node:
        return "array"
    return None
