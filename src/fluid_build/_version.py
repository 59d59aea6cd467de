"""The distribution's version, in a module of its own so any layer can read it.

``fluid_build/__init__.py`` re-exports it; a module inside the package imports it
from here, never from the package, so no import runs back up to the top.
"""

from __future__ import annotations

from typing import Final

__all__ = ["__version__"]

__version__: Final = "0.1.0"
