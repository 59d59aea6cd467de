"""The oracle: what OpenAI's strict mode would refuse in a schema (:func:`is_strict_compliant`).

Tests check every schema :func:`~fluid_build.copilot.schema.harden.harden_schema`
makes against it; users can check their own. The rules and their sources are in
:mod:`fluid_build.copilot.schema.subset`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from fluid_build.copilot.schema.nodes import canonical, escape, resolve
from fluid_build.copilot.schema.subset import (
    COMMON_KEYWORDS,
    FORMATS,
    LARGE_ENUM,
    MAX_DEPTH,
    MAX_ENUM_VALUES,
    MAX_LARGE_ENUM_CHARS,
    MAX_PROPERTIES,
    MAX_STRING_CHARS,
    NUMBER_KEYWORDS,
    TYPE_KEYWORDS,
    TYPES,
    has_lookaround,
    is_count,
    is_number,
)

__all__ = ["is_strict_compliant"]


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
            defs[f"#/{key}/{escape(def_name)}"] = sub
            tally.chars += len(str(def_name))
    _check(schema, "#", schema, problems, tally, root=True)
    for pointer, sub in defs.items():
        _check(sub, pointer, schema, problems, tally, root=False)
    if tally.properties > MAX_PROPERTIES:
        problems.append(
            f"#: {tally.properties} object properties in total; the limit is {MAX_PROPERTIES}"
        )
    depth = _depth(schema, schema, frozenset())
    if depth > MAX_DEPTH:
        problems.append(f"#: {depth} levels of nesting; the limit is {MAX_DEPTH}")
    if tally.chars > MAX_STRING_CHARS:
        problems.append(
            f"#: {tally.chars} characters of property names, definition names, enum and "
            f"const values; the limit is {MAX_STRING_CHARS}"
        )
    if tally.enum_values > MAX_ENUM_VALUES:
        problems.append(
            f"#: {tally.enum_values} enum values in total; the limit is {MAX_ENUM_VALUES}"
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
    allowed = set(COMMON_KEYWORDS) | {k for kind in kinds for k in TYPE_KEYWORDS[kind]}
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
    for i, branch in enumerate(_listed(node, "anyOf", loc, problems, " of schemas")):
        _check(branch, f"{loc}/anyOf/{i}", doc, problems, tally)


def _listed(
    node: Mapping[str, Any], key: str, loc: str, problems: list[str], of: str = ""
) -> list[Any]:
    """``node[key]`` when it is a non-empty list; else nothing, and a problem when it is there."""
    if key not in node:
        return []
    values = node[key]
    if not isinstance(values, list) or not values:
        problems.append(f"{loc}: {key} must be a non-empty list{of}")
        return []
    return values


def _check_ref(
    node: Mapping[str, Any], loc: str, doc: Mapping[str, Any], problems: list[str]
) -> None:
    extra = sorted(k for k in node if k != "$ref")
    if extra:
        problems.append(f"{loc}: $ref cannot have other keywords {extra} ([errors])")
    ref = node["$ref"]
    if not isinstance(ref, str) or not ref.startswith("#"):
        problems.append(f"{loc}: only local refs ('#', '#/$defs/...') are supported")
    elif not isinstance(resolve(doc, canonical(unquote(ref))), Mapping):
        problems.append(f"{loc}: $ref {ref!r} does not resolve to a schema")


def _declared_types(node: Mapping[str, Any], loc: str, problems: list[str]) -> list[str]:
    kinds = node.get("type")
    if kinds is None:
        return []
    listed = kinds if isinstance(kinds, list) else [kinds]
    good = [k for k in listed if isinstance(k, str) and k in TYPES]
    if not listed or len(good) != len(listed) or len(set(good)) != len(good):
        problems.append(f"{loc}: unsupported type {kinds!r}")
    return list(dict.fromkeys(good))


def _check_values(node: Mapping[str, Any], loc: str, problems: list[str], tally: _Tally) -> None:
    fmt = node.get("format")
    if fmt is not None and fmt not in FORMATS:
        problems.append(f"{loc}: format {fmt!r} is not supported ([guide] string formats)")
    pattern = node.get("pattern")
    if pattern is not None and (not isinstance(pattern, str) or has_lookaround(pattern)):
        problems.append(f"{loc}: pattern {pattern!r} is not supported (look-around, [pyai])")
    for key in NUMBER_KEYWORDS:
        if key in node and not is_number(node[key]):
            problems.append(f"{loc}: {key} must be a number")
    for key in ("minItems", "maxItems"):
        if key in node and not is_count(node[key]):
            problems.append(f"{loc}: {key} must be a non-negative integer")
    values = _listed(node, "enum", loc, problems)
    if values:
        tally.enum_values += len(values)
        chars = sum(len(v) for v in values if isinstance(v, str))
        tally.chars += chars
        strings = all(isinstance(v, str) for v in values)
        if strings and len(values) > LARGE_ENUM and chars > MAX_LARGE_ENUM_CHARS:
            problems.append(
                f"{loc}: {len(values)} enum values hold {chars} characters; over "
                f"{LARGE_ENUM} values the limit is {MAX_LARGE_ENUM_CHARS}"
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
        _check(sub, f"{loc}/properties/{escape(str(prop))}", doc, problems, tally)


def _depth(node: Any, doc: Mapping[str, Any], seen: frozenset[str]) -> int:
    """Levels of object and array nesting below ``node``, following refs once."""
    if not isinstance(node, Mapping):
        return 0
    ref = node.get("$ref")
    if isinstance(ref, str):
        pointer = canonical(unquote(ref))
        if pointer in seen:
            return 0
        return _depth(resolve(doc, pointer), doc, seen | {pointer})
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
