"""fluid_build: boringly reliable calls to LLM providers."""

from fluid_build.errors import FluidError

__all__ = ["FluidError", "__version__"]

__version__ = "0.1.0"
