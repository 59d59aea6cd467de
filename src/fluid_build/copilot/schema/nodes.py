"""Reading schema nodes: local JSON pointers (``#``, ``#/$defs/X``) and trimmed copies."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote

__all__ = ["as_dict", "canonical", "escape", "resolve", "unescape", "without"]


def without(node: Mapping[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in node.items() if k not in keys}


def as_dict(node: Any) -> dict[str, Any]:
    if node is True or not isinstance(node, Mapping):
        return {}
    return dict(node)


def escape(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")


def unescape(part: str) -> str:
    return part.replace("~1", "/").replace("~0", "~")


def resolve(root: Any, pointer: str) -> Any:
    """The node at a local JSON pointer (``#``, ``#/$defs/X``), or None."""
    if pointer == "#":
        return root
    if not pointer.startswith("#/"):
        return None
    node = root
    for part in pointer[2:].split("/"):
        key = unescape(unquote(part))
        if isinstance(node, Mapping) and key in node:
            node = node[key]
        elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
        else:
            return None
    return node


def canonical(pointer: str) -> str:
    return "#" if pointer in ("#", "#/") else pointer
