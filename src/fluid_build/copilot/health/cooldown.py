"""Shared failure state: cooldown windows, breaker counts and trial leases, with a lifetime.

When a provider answers one call with Retry-After, every other call with the
same key (provider + endpoint + a fingerprint of the API key + model) waits
out that window before sending, instead of hammering the provider into longer
cool-downs. A window only ever grows: a second Retry-After extends it to the
later deadline, never shortens it. The circuit breaker keeps its failure
count and its half-open trial lease in the same store.

Every entry expires by itself: a window at its end, a counter ``ttl`` seconds
after its last increment, a lease at the expiry its owner gave it (so a
killed owner frees it). Nothing needs a human to clear it, and
:meth:`CooldownStore.clear` (``fluid doctor --reset``) clears it anyway.

Stores:

- :class:`MemoryCooldownStore`: one process.
- :class:`SqliteCooldownStore`: every process on the machine (the default).
- :class:`RedisCooldownStore`: every machine that reaches one Redis.

``FLUID_COOLDOWN_URL`` picks one (``memory://``, ``sqlite:///path``,
``redis://host:6379/0``, ``off``). A store that fails degrades to memory with
one warning; it never fails a call.

This module picks the store (:func:`cooldown_store_from_url`,
:func:`cooldown_store_from_env`); the parts live in one module each: the key
(:mod:`.keys`), the protocol and the memory store (:mod:`.store`), sqlite
(:mod:`.sqlite_store`), Redis (:mod:`.redis_store`), the wrapper that never fails
a call and deliberate resets (:mod:`.resilient`). Every name of ``__all__`` stays
importable from here: tests, docs and users import them from this module.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Final
from urllib.parse import unquote, urlsplit

from fluid_build.copilot.health.keys import (
    COOLDOWN,
    CooldownKey,
    key_fingerprint,
    normalize_endpoint,
)
from fluid_build.copilot.health.redis_store import RedisCooldownStore
from fluid_build.copilot.health.resilient import (
    ResilientCooldownStore,
    StoreResetError,
    reset_keys,
)
from fluid_build.copilot.health.sqlite_store import SqliteCooldownStore, default_cooldown_path
from fluid_build.copilot.health.store import (
    CooldownStore,
    MemoryCooldownStore,
    StandInCooldownStore,
    StoreEntry,
    trusted,
    without_password,
)

__all__ = [
    "COOLDOWN",
    "COOLDOWN_URL_ENV",
    "CooldownKey",
    "CooldownStore",
    "MemoryCooldownStore",
    "RedisCooldownStore",
    "ResilientCooldownStore",
    "SqliteCooldownStore",
    "StoreEntry",
    "StoreResetError",
    "cooldown_store_from_env",
    "cooldown_store_from_url",
    "default_cooldown_path",
    "key_fingerprint",
    "normalize_endpoint",
    "reset_keys",
    "trusted",
]

LOG = logging.getLogger("fluid_build.cooldown")

COOLDOWN_URL_ENV: Final = "FLUID_COOLDOWN_URL"


def cooldown_store_from_url(
    url: str | None, *, env: Mapping[str, str] | None = None
) -> CooldownStore | None:
    """The store a URL names, wrapped so that it never fails a call.

    ``None`` or ``""``: the sqlite file at :func:`default_cooldown_path`;
    ``memory://``; ``sqlite:///abs/path`` or a plain path; ``redis://`` or
    ``rediss://``; ``off`` / ``none``: no cooldown sharing at all. An
    unknown scheme logs a warning and uses the default.
    """
    text = (url or "").strip()
    if text.lower() in {"off", "none", "disabled", "0"}:
        return None
    if text.lower() in {"memory", "memory://", "mem://"}:
        return MemoryCooldownStore()
    try:
        scheme = urlsplit(text).scheme.lower() if "://" in text else ""
    except ValueError:  # "http://[" and friends
        scheme = "unparsable"
    primary: CooldownStore
    if scheme in {"redis", "rediss", "unix"}:
        try:
            primary = RedisCooldownStore(text)
        except Exception as exc:  # noqa: BLE001 - e.g. the redis package is missing
            hint = " (install fluid-build[redis])" if isinstance(exc, ImportError) else ""
            why = (
                f"{COOLDOWN_URL_ENV}={without_password(text)} cannot be used "
                f"({type(exc).__name__}: {without_password(str(exc))}){hint}"
            )
            LOG.warning(
                "%s; sharing cooldowns in this process only, and refusing calls under a "
                "budget (FLUID_BUDGET_FAIL_OPEN=1 lets them through unmetered)",
                why,
            )
            return StandInCooldownStore(why)
    elif scheme in {"sqlite", "file"}:
        path = unquote(text.split("://", 1)[1].split("?", 1)[0])
        if not path.strip():
            LOG.warning(
                "%s=%r names no file; using the sqlite file at %s",
                COOLDOWN_URL_ENV,
                text,
                default_cooldown_path(env),
            )
            path = str(default_cooldown_path(env))
        primary = SqliteCooldownStore(path)
    elif scheme == "" and text:
        try:
            where = Path(text).expanduser()
        except RuntimeError:  # "~someone/..." for a user this machine does not know
            where = default_cooldown_path(env)
            LOG.warning(
                "%s=%r names the home of an unknown user; using the sqlite file at %s",
                COOLDOWN_URL_ENV,
                text[:200],
                where,
            )
        primary = SqliteCooldownStore(where)
    else:
        if text:
            LOG.warning(
                "%s=%r has an unknown scheme; using the sqlite file at %s",
                COOLDOWN_URL_ENV,
                without_password(text),
                default_cooldown_path(env),
            )
        primary = SqliteCooldownStore(default_cooldown_path(env))
    return ResilientCooldownStore(primary)


def cooldown_store_from_env(env: Mapping[str, str] | None = None) -> CooldownStore | None:
    """The store ``FLUID_COOLDOWN_URL`` names (the sqlite file by default)."""
    env = os.environ if env is None else env
    return cooldown_store_from_url(env.get(COOLDOWN_URL_ENV), env=env)
