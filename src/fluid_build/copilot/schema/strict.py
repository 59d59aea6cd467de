"""OpenAI strict-schema mode: make a JSON schema acceptable to ``strict: true``.

OpenAI's structured outputs (``response_format: {"type": "json_schema", "json_schema":
{"name", "strict": true, "schema"}}``) accept a subset of JSON Schema only, and answer
"400 Invalid schema for response_format" to anything else. This package does the
work in one module per role:

* :mod:`.subset`: the subset strict mode accepts and its limits, with their sources;
* :mod:`.harden`: :func:`harden_schema`, the walker that rewrites a schema (typically
  pydantic's ``model_json_schema()``) into that subset;
* :mod:`.codec`: :class:`StrictSchema`, the hardened schema and the way back: it decodes
  string-encoded fields and drops the nulls hardening added;
* :mod:`.check`: :func:`is_strict_compliant`, what OpenAI would refuse in a schema;
* :mod:`.shapes`, :mod:`.nodes`: what a schema accepts, and reading JSON pointers.

This module reads the ``FLUID_OPENAI_STRICT_SCHEMA`` flag (:func:`strict_schema_enabled`)
and re-exports ``StrictSchema``, ``harden_schema`` and ``is_strict_compliant`` from
their modules: docs/openai-strict-schema.md shows them imported from here. They load
when first asked for, so that a client reading the flag does not load the walker.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Final

from fluid_build._lazy import lazy_attributes
from fluid_build._redact import redact, truncate
from fluid_build.config import yes_no

if TYPE_CHECKING:
    from fluid_build.copilot.schema.check import is_strict_compliant
    from fluid_build.copilot.schema.codec import StrictSchema
    from fluid_build.copilot.schema.harden import harden_schema

__all__ = [
    "STRICT_SCHEMA_ENV",
    "StrictSchema",
    "harden_schema",
    "is_strict_compliant",
    "strict_schema_enabled",
]

#: The environment variable that turns strict-schema mode on for OpenAI and Azure OpenAI.
STRICT_SCHEMA_ENV: Final = "FLUID_OPENAI_STRICT_SCHEMA"

LOG = logging.getLogger("fluid_build.config")

#: The re-exported names load from their modules when first read.
__getattr__ = lazy_attributes(
    __name__,
    {
        "StrictSchema": "fluid_build.copilot.schema.codec",
        "harden_schema": "fluid_build.copilot.schema.harden",
        "is_strict_compliant": "fluid_build.copilot.schema.check",
    },
)


def strict_schema_enabled(env: Mapping[str, str] | None = None) -> bool:
    """Whether ``FLUID_OPENAI_STRICT_SCHEMA`` turns strict-schema mode on.

    ``1``/``true``/``yes``/``on`` (any case) turn it on; unset, empty, ``0``/``false``/
    ``no``/``off`` leave it off; anything else leaves it off with one warning.
    """
    source = os.environ if env is None else env
    raw = source.get(STRICT_SCHEMA_ENV)
    enabled = yes_no(raw)
    if enabled is None:
        LOG.warning(
            "%s=%s is not a boolean (use 1/true/yes/on or 0/false/no/off); strict schema "
            "mode stays off",
            STRICT_SCHEMA_ENV,
            repr(truncate(redact(str(raw)), 60)),
        )
    return bool(enabled)
