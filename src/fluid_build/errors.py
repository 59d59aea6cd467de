"""The root of every fluid_build error.

Catch :class:`FluidError` to catch everything this package raises on purpose.
The agent layer's typed errors live in :mod:`fluid_build.copilot.agents.errors`.
"""

__all__ = ["FluidError"]


class FluidError(Exception):
    """Base class of every error fluid_build raises."""
