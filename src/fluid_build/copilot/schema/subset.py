"""What OpenAI strict mode accepts: the supported subset of JSON Schema and its limits.

The walker (:mod:`.harden`) keeps a schema inside these rules, and the oracle
(:mod:`.check`) reports where a schema breaks them. Where each rule comes from:

[guide]  OpenAI, Structured Outputs, "Supported schemas":
         https://platform.openai.com/docs/guides/structured-outputs#supported-schemas
[sdk]    openai-python, ``src/openai/lib/_pydantic.py`` (``to_strict_json_schema``)
[pyai]   pydantic-ai, ``pydantic_ai/profiles/openai.py`` (``OpenAIJsonSchemaTransformer``)
[errors] the API's own 400 messages, as reported upstream: "$ref cannot have keywords
         {'description'}" (camel-ai/camel#3001, defog-ai/defog#244), "array schema missing
         items" (sigoden/aichat#1049), "'default' is not permitted"
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

__all__ = [
    "ANNOTATIONS",
    "COMMON_KEYWORDS",
    "DROPPED",
    "FORMATS",
    "LARGE_ENUM",
    "MAX_DEPTH",
    "MAX_ENUM_VALUES",
    "MAX_LARGE_ENUM_CHARS",
    "MAX_PROPERTIES",
    "MAX_STRING_CHARS",
    "NOTED",
    "NUMBER_KEYWORDS",
    "PRIMITIVES",
    "TYPES",
    "TYPE_KEYWORDS",
    "has_lookaround",
    "is_count",
    "is_number",
    "refused",
]

# [guide] "Supported types": string, number, boolean, integer, object, array, enum,
# anyOf; null only inside a union (`"type": ["string", "null"]`, `{"type": "null"}`).
TYPES: Final = frozenset({"string", "number", "integer", "boolean", "object", "array", "null"})
PRIMITIVES: Final = frozenset({"string", "number", "integer", "boolean"})
# [guide] "Supported properties", per type. Everything else is refused, among them the
# composition keywords `allOf`, `not`, `dependentRequired`, `dependentSchemas`, `if`,
# `then`, `else` ("Some type-specific keywords are not yet supported"). `minLength` and
# `maxLength` are not in the supported list, and [pyai] strips them too.
NUMBER_KEYWORDS: Final = (
    "multipleOf",
    "maximum",
    "exclusiveMaximum",
    "minimum",
    "exclusiveMinimum",
)
TYPE_KEYWORDS: Final[Mapping[str, tuple[str, ...]]] = {
    "string": ("pattern", "format"),
    "number": NUMBER_KEYWORDS,
    "integer": NUMBER_KEYWORDS,
    "array": ("items", "minItems", "maxItems"),
    "object": ("properties", "required", "additionalProperties"),
    "boolean": (),
    "null": (),
}
# Keywords any node may carry. `title` and `description` are annotations the API
# accepts ([sdk] sends pydantic's titles unchanged); `const` values count toward the
# [guide]'s string-size limit, so `const` is supported.
COMMON_KEYWORDS: Final = frozenset(
    {"type", "enum", "const", "anyOf", "$ref", "title", "description"}
)
ANNOTATIONS: Final = ("title", "description")
# [guide] "format — Predefined formats for strings. Currently supported: ..."
FORMATS: Final = frozenset(
    {"date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid"}
)
# [pyai] refuses patterns with look-around (`_regex_contains_lookaround`).
_LOOKAROUND: Final = ("(?=", "(?!", "(?<=", "(?<!")
# Dropped without a trace: annotations with no bearing on the data. `default` is refused
# outright ([errors] "'default' is not permitted"; [pyai] strips it in strict mode);
# `discriminator` and `nullable` are OpenAPI, `nullable` is turned into a null branch.
DROPPED: Final = frozenset(
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
NOTED: Final = frozenset(
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
MAX_PROPERTIES: Final = 5000
MAX_DEPTH: Final = 10
# [guide] "Limitations on total string size": property names, definition names, enum
# values and const values together "cannot exceed 120,000 characters".
MAX_STRING_CHARS: Final = 120_000
# [guide] "Limitations on enum size": "up to 1000 enum values across all enum
# properties"; one string enum with more than 250 values holds at most 15,000 characters.
MAX_ENUM_VALUES: Final = 1000
LARGE_ENUM: Final = 250
MAX_LARGE_ENUM_CHARS: Final = 15_000


def has_lookaround(pattern: str) -> bool:
    escaped = False
    for i, char in enumerate(pattern):
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif pattern.startswith(_LOOKAROUND, i):
            return True
    return False


def refused(key: str, value: Any) -> bool:
    """A supported keyword whose value strict mode still refuses."""
    if key == "format":
        return value not in FORMATS
    if key == "pattern":
        return not isinstance(value, str) or has_lookaround(value)
    if key in NUMBER_KEYWORDS:
        return not is_number(value)  # draft-4's boolean exclusiveMaximum, for one
    if key in ("minItems", "maxItems"):
        return not is_count(value)
    return False


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
