"""The ``fluid`` console script."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from fluid_build import __version__

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``fluid`` command."""
    parser = argparse.ArgumentParser(
        prog="fluid",
        description="fluid_build: reliable LLM calls and the forge pipeline.",
        epilog="The forge, ai, corpus and doctor commands are not built yet.",
    )
    parser.add_argument("--version", action="version", version=f"fluid {__version__}")
    parser.parse_args(argv)
    parser.print_help(sys.stdout)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
