"""The strict-mode walker: :func:`harden_schema` makes a JSON schema fit ``strict: true``.

It rewrites a schema (typically pydantic's ``model_json_schema()``) into the subset
OpenAI accepts (:mod:`fluid_build.copilot.schema.subset`):

* every object gets ``additionalProperties: false`` and lists every property in
  ``required``; a property that was optional becomes nullable, and
  :meth:`StrictSchema.decode` drops the ``null`` again;
* a free-form value (``dict[str, Any]``, ``additionalProperties: true``, a bare ``{}``,
  a tuple, an ambiguous union) becomes a string holding JSON, which ``decode`` parses;
* keywords strict mode refuses are removed; constraints among them are kept as a note
  in the description, so the model still reads them (pydantic validates them after).

The sources cited in brackets ([guide], [sdk], [pyai], [errors]) are listed in
:mod:`fluid_build.copilot.schema.subset`.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import unquote

from fluid_build._redact import truncate
from fluid_build.copilot.schema.codec import (
    JSON,
    KEEP,
    WRAP_KEY,
    Array,
    Branch,
    Codec,
    Field,
    Keep,
    Object,
    Plan,
    Ref,
    StrictSchema,
    Union,
    Wrap,
    data_paths,
)
from fluid_build.copilot.schema.nodes import (
    as_dict,
    canonical,
    escape,
    resolve,
    unescape,
    without,
)
from fluid_build.copilot.schema.shapes import (
    ANY,
    EMPTY,
    NULL,
    STRING,
    Obj,
    Shape,
    implied_type,
    is_free_object,
    shape_of,
)
from fluid_build.copilot.schema.subset import (
    ANNOTATIONS,
    DROPPED,
    NOTED,
    PRIMITIVES,
    TYPE_KEYWORDS,
    TYPES,
    refused,
)

__all__ = ["harden_schema"]

# [sdk] `ResponseFormatJSONSchema.name`: "Must be a-z, A-Z, 0-9, or contain underscores
# and dashes, with a maximum length of 64."
_NAME_UNSAFE: Final = re.compile(r"[^A-Za-z0-9_-]+")
_MAX_NAME: Final = 64
_MAX_WALK: Final = 200
_MAX_NOTE: Final = 80


def _note(key: str, value: Any) -> str:
    shown = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return f"{key}={truncate(shown, _MAX_NOTE)}"


def _describe(node: Mapping[str, Any], notes: list[str]) -> dict[str, Any]:
    """``title`` and ``description`` of ``node``, with ``notes`` appended to the latter."""
    out: dict[str, Any] = {k: node[k] for k in ANNOTATIONS if isinstance(node.get(k), str)}
    if notes:
        joined = ", ".join(notes)
        base = out.get("description")
        out["description"] = f"{base} ({joined})" if base else f"Constraints: {joined}."
    return out


@dataclass(frozen=True, slots=True)
class _Built:
    schema: dict[str, Any]
    codec: Codec
    strict: Shape


class _Hardener:
    """One hardening run. Mutable, but private to :func:`harden_schema`."""

    def __init__(self, root: dict[str, Any]) -> None:
        self.root = root
        self.names: dict[str, str] = {}  # source pointer -> def name
        self.sources: dict[str, Any] = {}  # def name -> source node
        self.defs: dict[str, dict[str, Any]] = {}  # def name -> strict schema
        self.codecs: dict[str, Codec] = {}
        self.busy: set[str] = set()
        # Defs being built whose walk has not yet passed a property or an array item: a
        # ref back to one of them would recurse without consuming any data.
        self.unguarded: set[str] = set()
        self.unravelling: set[str] = set()  # refs being inlined for their siblings
        self.depth = 0
        self.root_name = "root"

    # shapes ---------------------------------------------------------------------------

    def original_shape(self, node: Any, seen: frozenset[str] = frozenset()) -> Shape:
        def ref_shape(ref: str) -> Shape:
            pointer = canonical(unquote(ref))
            target = resolve(self.root, pointer)
            if pointer in seen or target is None:
                return ANY
            return self.original_shape(target, seen | {pointer})

        return shape_of(node, ref_shape)

    def strict_shape(self, node: Any, seen: frozenset[str] = frozenset()) -> Shape:
        def ref_shape(ref: str) -> Shape:
            name = self._name_of_strict_ref(ref)
            if name in seen:
                return ANY
            if name in self.busy or name not in self.defs:
                # Not built yet: what the source accepts, or a string if it gets encoded.
                return self.original_shape(self.sources.get(name, True)) | STRING
            return self.strict_shape(self.defs[name], seen | {name})

        return shape_of(node, ref_shape)

    def _name_of_strict_ref(self, ref: str) -> str:
        if ref == "#":
            return self.root_name
        return unescape(ref.removeprefix("#/$defs/"))

    def is_keep(self, codec: Codec, seen: frozenset[str] = frozenset()) -> bool:
        if isinstance(codec, Keep):
            return True
        if isinstance(codec, Ref):
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
        pointer = canonical(unquote(ref))
        if pointer in self.names:
            return self.names[pointer]
        node = resolve(self.root, pointer)
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
        base = unescape(pointer.rsplit("/", 1)[-1]) or "def"
        taken = set(self.names.values())
        name, n = base, 1
        while name in taken:
            n += 1
            name = f"{base}_{n}"
        return name

    def ref_string(self, name: str) -> str:
        return "#" if name == self.root_name else f"#/$defs/{escape(name)}"

    def follow(self, node: Any) -> Any:
        """``node`` with any chain of bare ``$ref`` resolved (None on a cycle or a miss)."""
        seen: set[str] = set()
        while isinstance(node, Mapping) and isinstance(node.get("$ref"), str):
            pointer = canonical(unquote(node["$ref"]))
            if pointer in seen:
                return None
            seen.add(pointer)
            target = resolve(self.root, pointer)
            if target is None:
                return None
            node = {**as_dict(target), **without(node, "$ref")}
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
            built = _Built(_add_null(built.schema), built.codec, built.strict | NULL)
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
            node = {**without(node, "oneOf"), "anyOf": node["oneOf"]}
        if "anyOf" in node:
            return self.any_of(node)
        kinds = node.get("type")
        if isinstance(kinds, list):
            return self.type_list(node, kinds)
        kind = kinds if isinstance(kinds, str) else implied_type(node)
        if kind is None:
            if "enum" in node or "const" in node:
                return self.plain(node, None)
            return self.encoded(node)  # a bare `{}` or annotations only: anything goes
        if kind not in TYPES:
            return self.encoded(node)
        if kind == "object":
            return self.object(node)
        if kind == "array":
            return self.array(node)
        return self.plain(node, kind)

    def encoded(self, node: Mapping[str, Any]) -> _Built:
        kind = node.get("type") if isinstance(node.get("type"), str) else implied_type(node)
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
        return _Built(schema, JSON, STRING)

    def kept_keywords(
        self, node: Mapping[str, Any], kinds: Iterable[str]
    ) -> tuple[dict[str, Any], list[str]]:
        """The supported type keywords of ``node`` and notes for the refused constraints."""
        allowed = {k for kind in kinds for k in TYPE_KEYWORDS.get(kind, ())}
        kept: dict[str, Any] = {}
        notes: list[str] = []
        for key, value in node.items():
            if key in allowed and key not in ("items", "properties", "required"):
                if refused(key, value):
                    notes.append(_note(key, value))
                elif key != "additionalProperties":
                    kept[key] = value
            elif key in NOTED:
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
        return _Built(schema, KEEP, self.strict_shape(schema))

    def type_list(self, node: Mapping[str, Any], kinds: list[Any]) -> _Built:
        named = list(dict.fromkeys(kinds))
        if not named or not all(isinstance(k, str) and k in TYPES for k in named):
            return self.encoded(node)
        others = [k for k in named if k != "null"]
        if len(named) == 1:
            return self.harden_dict({**node, "type": named[0]})
        if (
            len(others) == 1
            and others[0] in PRIMITIVES
            and "enum" not in node
            and "const" not in node
        ):
            # [guide] `"type": ["string", "null"]` is the documented nullable form.
            built = self.plain({**node, "type": others[0]}, others[0])
            return _Built(_add_null(built.schema), built.codec, built.strict | NULL)
        branches = []
        for kind in named:
            keep = set(TYPE_KEYWORDS[kind]) | {"enum", "const"} | NOTED
            branches.append({"type": kind, **{k: v for k, v in node.items() if k in keep}})
        return self.any_of({**_describe(node, []), "anyOf": branches})

    def object(self, node: Mapping[str, Any]) -> _Built:
        if is_free_object(node):
            return self.encoded(node)
        props: Mapping[str, Any] = node["properties"]
        required = node.get("required")
        needed = set(required) if isinstance(required, list) else set()
        out: dict[str, Any] = {}
        fields: list[Field] = []
        for name, sub in props.items():
            built = self.harden_data(sub)
            optional = name not in needed
            drop_null = optional and not built.strict.accepts(None)
            out[name] = _add_null(built.schema) if drop_null else built.schema
            fields.append(Field(name, built.codec, optional, drop_null))
        _, notes = self.kept_keywords(node, ["object"])
        schema: dict[str, Any] = {"type": "object", **_describe(node, notes)}
        schema["properties"] = out
        schema["required"] = list(out)  # [guide] "All fields must be required"
        schema["additionalProperties"] = False  # [guide] "must always be set in objects"
        keep = all(self.is_keep(f.codec) and not f.optional for f in fields)
        codec: Codec = KEEP if keep else Object(tuple(fields))
        keys = frozenset(out)
        return _Built(schema, codec, Shape(objects=(Obj(keys, keys),)))

    def array(self, node: Mapping[str, Any]) -> _Built:
        items = node.get("items", True)
        if "prefixItems" in node or isinstance(items, list):
            return self.encoded(node)  # tuples: not in the [guide]'s subset
        # [errors] "array schema missing items": an untyped item is encoded instead.
        built = self.harden_data(items)
        kept, notes = self.kept_keywords(node, ["array"])
        schema: dict[str, Any] = {"type": "array", **_describe(node, notes), "items": built.schema}
        schema.update(kept)
        codec: Codec = KEEP if self.is_keep(built.codec) else Array(built.codec)
        return _Built(schema, codec, Shape(frozenset({"array"})))

    def ref(self, node: Mapping[str, Any]) -> _Built:
        siblings = without(node, "$ref")
        constraints = [k for k in siblings if k not in ANNOTATIONS and k not in DROPPED]
        if constraints:
            # [sdk] unravels a `$ref` with other keywords: the ref's target, then the node.
            pointer = canonical(unquote(str(node["$ref"])))
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
        return _Built(schema, Ref(name), strict)

    def all_of(self, node: Mapping[str, Any]) -> _Built:
        entries = node["allOf"]
        rest = without(node, "allOf")
        if not isinstance(entries, list) or not entries:
            return self.harden(rest)
        if len(entries) == 1:
            # [sdk] flattens a one-entry allOf into its parent.
            return self.harden({**rest, **as_dict(entries[0])})
        merged = _merge_all_of(rest, [self.follow(e) for e in entries])
        return self.encoded(node) if merged is None else self.harden(merged)

    def any_of(self, node: Mapping[str, Any]) -> _Built:
        branches = node["anyOf"]
        extra = [k for k in node if k != "anyOf" and k not in ANNOTATIONS and k not in DROPPED]
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
        strict = EMPTY
        for b in built:
            strict = strict | b.strict
        if all(keeps):
            return _Built(schema, KEEP, strict)
        union = Union(
            tuple(
                Branch(b.codec, b.strict, o, copy.deepcopy(b.schema))
                for b, o in zip(built, originals, strict=True)
            )
        )
        return _Built(schema, union, strict)


def _add_null(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` that also accepts null, in the simplest form strict mode takes."""
    kind = schema.get("type")
    if kind in PRIMITIVES and "enum" not in schema and "const" not in schema:
        return {**schema, "type": [kind, "null"]}
    if list(schema) == ["anyOf"] or ("anyOf" in schema and set(schema) <= {"anyOf", *ANNOTATIONS}):
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
            elif key in ANNOTATIONS or key in DROPPED:
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
        k for k in source if k != "$ref" and k not in ANNOTATIONS and k not in DROPPED
    ]:
        # pydantic's recursive models: `{"$ref": "#/$defs/Node", "$defs": {...}}`. The
        # target becomes the root, and refs to it become "#" ([guide] root recursion).
        target = run.follow({"$ref": source["$ref"]})
        if isinstance(target, Mapping):
            run.names[canonical(unquote(source["$ref"]))] = run.root_name
            top = {**_describe(source, []), **target}
    run.sources[run.root_name] = top
    run.busy.add(run.root_name)
    built = run.harden(without(top, "$defs", "definitions"))
    run.busy.discard(run.root_name)
    run.codecs[run.root_name] = built.codec

    out = built.schema
    root_codec: Codec = built.codec
    if out.get("type") != "object" or "properties" not in out:
        # [guide] "Root objects must not be anyOf and must be an object": wrap it.
        root_ref = f"#/$defs/{escape(run.root_name)}"
        inner: dict[str, Any] = out
        if "#" in set(_refs_in(out)) or any("#" in set(_refs_in(d)) for d in run.defs.values()):
            run.defs = {k: _retarget_root(v, root_ref) for k, v in run.defs.items()}
            run.defs[run.root_name] = _retarget_root(out, root_ref)
            inner = {"$ref": root_ref}
            root_codec = Ref(run.root_name)
        out = {
            "type": "object",
            "properties": {WRAP_KEY: inner},
            "required": [WRAP_KEY],
            "additionalProperties": False,
        }
        root_codec = Wrap(root_codec)

    used = _reachable(out, run.defs)
    if used:
        out = {**out, "$defs": {k: run.defs[k] for k in run.defs if k in used}}
    strict_defs = {**run.defs, run.root_name: run.defs.get(run.root_name, built.schema)}
    plan = Plan(root_codec, dict(run.codecs), copy.deepcopy(strict_defs), run.root_name)
    encoded: dict[tuple[str, ...], None] = {}
    nullable: dict[tuple[str, ...], None] = {}
    data_paths(root_codec, plan, (), frozenset({run.root_name}), encoded, nullable)
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
        name = unescape(ref.removeprefix("#/$defs/"))
        if name in defs and name not in used:
            used.add(name)
            todo.extend(_refs_in(defs[name]))
    return used
