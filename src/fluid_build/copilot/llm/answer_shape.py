"""The shape of a provider's answer: a small declarative vocabulary, and its check.

Each adapter declares the fields it reads (``Adapter.shape``, ``Adapter.chunk_shape``)
with these names; the call checks an answer against them only once reading it
failed, to say which field was not what the adapter expected
(call/decode.py). ``text_of`` reads a text field the same way everywhere.
"""

from __future__ import annotations

from typing import Any, Final

__all__ = ["COUNT", "NULL", "TEXT", "Shape", "first_wrong_field", "text_of"]

NULL: Final = type(None)
TEXT: Final = (str, NULL)
COUNT: Final = (int, NULL)

#: A declarative answer shape, checked only once reading an answer failed: a
#: dict of key -> shape (keys optional), ``[shape]`` for a list of items, a
#: type or tuple of types for a leaf (``type(None)`` allows null).
Shape = Any

_NAMES = {
    str: "a string",
    int: "a number",
    float: "a number",
    bool: "true/false",
    dict: "an object",
    list: "a list",
    type(None): "null",
}


def text_of(value: Any) -> str:
    """A text field of an answer: a string, or nothing; anything else is a shape error."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    raise TypeError("a text field is not a string")


def _describe(value: Any) -> str:
    return _NAMES.get(type(value), type(value).__name__)


def first_wrong_field(value: Any, shape: Shape, path: str = "") -> tuple[str, str, str] | None:
    """``(path, expected, got)`` of the first field of ``value`` that does not fit ``shape``."""
    where = path or "<root>"
    if isinstance(shape, dict):
        if not isinstance(value, dict):
            return where, "an object", _describe(value)
        for key, inner in shape.items():
            if key in value and not (value[key] is None and isinstance(inner, dict | list)):
                found = first_wrong_field(value[key], inner, f"{path}.{key}" if path else key)
                if found is not None:
                    return found
        return None
    if isinstance(shape, list):
        if not isinstance(value, list):
            return where, "a list", _describe(value)
        for i, item in enumerate(value[:1000]):
            found = first_wrong_field(item, shape[0], f"{path}.{i}" if path else str(i))
            if found is not None:
                return found
        return None
    types = shape if isinstance(shape, tuple) else (shape,)
    if isinstance(value, bool) and bool not in types:
        return where, " or ".join(dict.fromkeys(_NAMES[t] for t in types)), _describe(value)
    if not isinstance(value, types):
        return where, " or ".join(dict.fromkeys(_NAMES[t] for t in types)), _describe(value)
    return None
