"""Names a package exports without importing their modules until first use (PEP 562)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_attributes"]


def lazy_attributes(module: str, homes: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` that imports ``homes[name]`` when ``name`` is first read.

    The value is then kept in the module's namespace, so that later reads are plain
    attribute reads; an unknown name is the usual :class:`AttributeError`.
    """

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home), name)
        vars(sys.modules[module])[name] = value
        return value

    return __getattr__
