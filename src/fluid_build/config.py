"""Reading fluid_build's environment variables: typed, bounded, never crashing.

A value that does not parse (garbage, ``nan``, ``inf``, a number too large to
hold) logs one warning naming the variable, the range it takes and a valid
example, and falls back to the default; a value out of range is clamped,
with a warning. Empty or blank is the same as unset. The environment is read
only by the ``from_env`` factories, never at import.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Final, TypeVar

from fluid_build._redact import redact, truncate

__all__ = ["env_float", "env_int", "yes_no"]

LOG = logging.getLogger("fluid_build.config")

_N = TypeVar("_N", int, float)
# How a warning writes a number of each kind.
_FLOAT = "%g"
_INT = "%d"

_YES: Final = frozenset({"1", "true", "yes", "on"})
_NO: Final = frozenset({"", "0", "false", "no", "off"})


def _shown(raw: str) -> str:
    return repr(truncate(redact(raw), 60))


def _default(value: float | None) -> str:
    return "no limit" if value is None else f"{value:g}"


def _expected(name: str, minimum: float, maximum: float, default: float | None) -> str:
    example = default if default is not None else minimum
    return f" (expected {minimum:g} to {maximum:g}, e.g. {name}={example:g})"


def yes_no(raw: str | None) -> bool | None:
    """An environment value as a yes/no flag; None when it is neither (the caller warns).

    ``1``/``true``/``yes``/``on`` (any case, spaces around) are yes; unset (None),
    empty or blank, ``0``/``false``/``no``/``off`` are no.
    """
    if raw is None:
        return False
    value = raw.strip().lower()
    if value in _YES:
        return True
    if value in _NO:
        return False
    return None


def env_float(
    env: Mapping[str, str],
    name: str,
    default: float | None,
    *,
    minimum: float,
    maximum: float,
) -> float | None:
    """``env[name]`` as a finite float within ``[minimum, maximum]``, else ``default``."""
    raw = env.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        value = float(raw.strip())
    except ValueError:
        _rejected(name, raw, "not a number", _default(default), minimum, maximum, default)
        return default
    if not math.isfinite(value):
        _rejected(name, raw, "not a finite number", _default(default), minimum, maximum, default)
        return default
    return _clamped(name, raw, value, minimum, maximum, _FLOAT)


def env_int(
    env: Mapping[str, str],
    name: str,
    default: int,
    *,
    minimum: int,
    maximum: int,
) -> int:
    """``env[name]`` as an integer within ``[minimum, maximum]``, else ``default``."""
    raw = env.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        value = int(raw.strip())
    except ValueError:  # garbage, "1.5", or more digits than int() takes
        shown = _INT % default
        _rejected(name, raw, "not a whole number", shown, minimum, maximum, default)
        return default
    return _clamped(name, raw, value, minimum, maximum, _INT)


def _rejected(
    name: str,
    raw: str,
    problem: str,
    shown_default: str,
    minimum: float,
    maximum: float,
    default: float | None,
) -> None:
    """Warn that ``raw`` is not a value ``name`` takes and that ``shown_default`` stands."""
    LOG.warning(
        "%s=%s is %s; using %s%s",
        name,
        _shown(raw),
        problem,
        shown_default,
        _expected(name, minimum, maximum, default),
    )


def _clamped(name: str, raw: str, value: _N, minimum: _N, maximum: _N, shown: str) -> _N:
    """``value`` within ``[minimum, maximum]``; a value cut to fit is warned about.

    ``shown`` is how the warning writes a number: :data:`_FLOAT` or :data:`_INT`.
    """
    if value < minimum or value > maximum:
        clamped = min(max(value, minimum), maximum)
        LOG.warning(
            "%s=%s is outside %s..%s; using %s",
            name,
            _shown(raw),
            shown % minimum,
            shown % maximum,
            shown % clamped,
        )
        return clamped
    return value
