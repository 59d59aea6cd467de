"""``fluid ai setup``: store the provider, model and key; ``--check`` tests them.

The key is read hidden (or as one line from a pipe), checked for shape, and
stored in the OS keyring, or in ``ai_config.json`` only with the plaintext
opt-in. It is never printed, not even in part: only its fingerprint.
Environment variables always win over what is stored (see docs/ai-setup.md).
"""

from __future__ import annotations

import json
import os
import sys
from typing import TYPE_CHECKING, Any, Final

import click

if TYPE_CHECKING:
    import httpx

__all__ = ["command"]

_MIN_KEY_LENGTH: Final = 8
_MAX_KEY_LENGTH: Final = 1024
# The cloud providers' options, as the variables they are stored for (aiconfig.CLOUD_SETTINGS).
_CLOUD_OPTIONS: Final = {
    "AWS_REGION": "--region",
    "GOOGLE_CLOUD_PROJECT": "--project",
    "GOOGLE_CLOUD_LOCATION": "--location",
}


@click.group(name="ai")
def command() -> None:
    """Configure the LLM provider fluid uses."""


@command.command(name="setup")
@click.option("--provider", "provider", metavar="NAME", help="openai, anthropic, gemini, ...")
@click.option("--model", metavar="MODEL", help="The model (Azure: the deployment name).")
@click.option(
    "--no-key", is_flag=True, help="Store only the provider and model; the key stays in the env."
)
@click.option("--check", is_flag=True, help="Test the key against the provider; store nothing.")
@click.option("--region", metavar="REGION", help="bedrock: the AWS region (e.g. us-east-1).")
@click.option("--project", metavar="ID", help="vertex: the Google Cloud project id.")
@click.option(
    "--location", metavar="LOCATION", help="vertex: the location (us-central1, global, ...)."
)
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
@click.pass_context
def setup(
    ctx: click.Context,
    provider: str | None,
    model: str | None,
    no_key: bool,
    check: bool,
    region: str | None,
    project: str | None,
    location: str | None,
    as_json: bool,
) -> None:
    """Store the provider, model and API key (in the OS keyring) that fluid uses.

    The key is read without echo, or as one line from standard input when it
    is not a terminal. Environment variables always win over what is stored.
    """
    from fluid_build.cli._messages import report_error

    given = {
        name: value
        for name, value in (
            ("AWS_REGION", region),
            ("GOOGLE_CLOUD_PROJECT", project),
            ("GOOGLE_CLOUD_LOCATION", location),
        )
        if value is not None
    }
    if check and given:
        raise click.UsageError("--region, --project and --location are stored, not checked")
    try:
        code = (
            _check(provider, model, as_json)
            if check
            else _setup(provider, model, no_key, as_json, given)
        )
    except click.ClickException:
        raise
    except Exception as exc:  # noqa: BLE001 - every failure leaves through the exit-code map
        code = report_error(exc, as_json=as_json)
    ctx.exit(code)


# -- storing ------------------------------------------------------------------------


def _provider_name(provider: str | None) -> str:
    from fluid_build.copilot.llm.settings import PROVIDERS

    known = ", ".join(sorted(PROVIDERS))
    if not provider:
        raise click.UsageError(f"--provider is required: one of {known}")
    name = provider.strip().lower()
    if name not in PROVIDERS:
        raise click.BadParameter(
            f"unknown provider {provider!r}: use one of {known}", param_hint="--provider"
        )
    return name


def _read_key(provider: str) -> str:
    stdin = sys.stdin
    if stdin.isatty():
        value: str = click.prompt(
            f"{provider} API key (input hidden)",
            hide_input=True,
            default="",
            show_default=False,
            err=True,
        )
        return value
    line: str = stdin.readline(_MAX_KEY_LENGTH + 2)
    return line


def _shape_problem(key: str) -> str | None:
    """Why ``key`` cannot be an API key, described without showing any of it."""
    if any(ch.isspace() for ch in key) or not key.isprintable():
        return "contains whitespace or control characters (a stray newline or tab when pasting?)"
    if not key.isascii():
        return "contains non-ASCII characters (a typographic quote or dash when pasting?)"
    if len(key) < _MIN_KEY_LENGTH:
        return f"is only {len(key)} characters long; API keys are longer"
    if len(key) > _MAX_KEY_LENGTH:
        return f"is longer than {_MAX_KEY_LENGTH} characters"
    return None


def _prefix_warning(provider: str, key: str) -> str | None:
    from fluid_build.copilot.llm.registry import PROVIDERS

    # Known key prefixes (each entry's key_prefix), to warn about a key pasted for the
    # wrong provider: the longest that matches names the owner.
    prefixes = {e.name: e.key_prefix for e in PROVIDERS.values() if e.key_prefix}
    owner = next(
        (
            name
            for name, prefix in sorted(prefixes.items(), key=lambda item: -len(item[1]))
            if key.startswith(prefix)
        ),
        None,
    )
    expected = prefixes.get(provider)
    # "sk-" alone is too common (proxies, DeepSeek) to name its owner.
    if owner is not None and owner not in {provider, "openai"}:
        return f"this key has the prefix of {owner} keys, not {provider}'s"
    if expected is not None and not key.startswith(expected):
        return f"{provider} keys usually start with {expected!r}; this one does not"
    return None


def _validated_key(provider: str, raw: str, *, required: bool) -> str | None:
    from fluid_build.copilot.agents.errors import ProviderAuthError

    key = raw.strip()
    if not key:
        if required:
            raise ProviderAuthError(
                f"no API key was entered for {provider}; nothing was stored. Run again and "
                "paste the key, or use --no-key to keep the key in the environment",
                provider=provider,
            )
        return None
    problem = _shape_problem(key)
    if problem is not None:
        raise ProviderAuthError(
            f"the {provider} API key that was entered {problem}; nothing was stored",
            provider=provider,
        )
    return key


def _cannot_keep(provider: str, why: str, *, asked: bool) -> Exception:
    """The refusal when a key cannot be kept safely: what happened and the two ways out."""
    from fluid_build.aiconfig import PLAINTEXT_OPT_IN_ENV, config_path
    from fluid_build.copilot.agents.errors import ProviderAuthError
    from fluid_build.copilot.llm.settings import PROVIDERS

    variable = PROVIDERS[provider].key_vars[0]
    done = "nothing was stored" if asked else "nothing was asked for or stored"
    # llm.auth: its hint names the provider's key variable, the first way out.
    return ProviderAuthError(
        f"cannot keep the {provider} key here: {why}, and {PLAINTEXT_OPT_IN_ENV} is not set; "
        f"{done}. Either export {variable} in your shell profile (environment variables "
        f"always win) and run `fluid ai setup --provider {provider} --no-key`, or set "
        f"{PLAINTEXT_OPT_IN_ENV}=1 to store it in plaintext in {config_path()} (mode 0600)",
        provider=provider,
        # The hint then names both ways out, not llm.auth's "re-run `fluid ai setup`".
        details={"variable": variable, "opt_in": PLAINTEXT_OPT_IN_ENV},
    )


def _check_storage(provider: str) -> None:
    """Refuse before the key is asked for when there is nowhere safe to keep it.

    A keyring that exists may still refuse the write (a locked keychain): that
    is only known by trying, after the key is read (see :func:`_store_key`).
    """
    from fluid_build.aiconfig import keyring_backend, plaintext_allowed

    if keyring_backend() is None and not plaintext_allowed():
        raise _cannot_keep(provider, "no usable OS keyring was found", asked=False)


def _store_key(provider: str, key: str) -> tuple[str, str | None]:
    """Put ``key`` where it belongs; ``(source, note)``. Raises when it cannot be stored."""
    from fluid_build.aiconfig import (
        KEYRING_SERVICE,
        PLAINTEXT_OPT_IN_ENV,
        keyring_backend,
        plaintext_allowed,
    )

    backend = keyring_backend()
    why = "no usable OS keyring was found"
    if backend is not None:
        try:
            backend.set_password(KEYRING_SERVICE, provider, key)
        except Exception as exc:  # noqa: BLE001 - any keyring failure: fall back or refuse
            why = f"the OS keyring refused it ({type(exc).__name__})"
        else:
            return "keyring", None
    if plaintext_allowed():
        return "file", f"{why}; stored in plaintext because {PLAINTEXT_OPT_IN_ENV}=1"
    raise _cannot_keep(provider, why, asked=True)


def _cloud_settings(
    name: str, given: dict[str, str], stored: dict[str, str]
) -> dict[str, str] | None:
    """The settings to store for ``name`` (None: a provider without any), checked like a
    usage error; those not given keep their stored value."""
    from fluid_build.aiconfig import CLOUD_SETTINGS, setting_problem

    allowed = CLOUD_SETTINGS.get(name, ())
    for variable, value in given.items():
        option = _CLOUD_OPTIONS[variable]
        if variable not in allowed:
            owner = next(p for p, names in CLOUD_SETTINGS.items() if variable in names)
            raise click.UsageError(f"{option} is for --provider {owner}, not {name}")
        problem = setting_problem(value.strip())
        if problem is not None:
            raise click.BadParameter(f"{value[:40]!r} {problem}", param_hint=option)
    if not allowed:
        return None
    return {**stored, **{variable: value.strip() for variable, value in given.items()}}


def _cloud_notes(name: str, settings: dict[str, str]) -> tuple[str | None, list[str]]:
    """Where the cloud provider's credentials come from (never stored by fluid), and what is
    still missing, each with its next step."""
    from fluid_build.cli._credentials import aws_credentials, google_credentials
    from fluid_build.copilot.llm.registry import PROVIDERS

    env = {**os.environ, **{k: v for k, v in settings.items() if not os.environ.get(k)}}
    missing: list[str] = []
    if PROVIDERS[name].cloud == "aws":
        holder = next(
            (v for v in ("FLUID_LLM_API_KEY", "AWS_BEARER_TOKEN_BEDROCK") if env.get(v)), None
        )
        found = aws_credentials(env, holder)
        from fluid_build.cli._credentials import aws_region

        if aws_region(env, env.get("AWS_ENDPOINT_URL_BEDROCK_RUNTIME"))[0] is None:
            missing.append("no AWS region: run again with --region us-east-1 (or set AWS_REGION)")
        if found["source"] is None and found["error"] and "pip install" in found["error"]:
            missing.append(found["error"])  # the extra is missing: nothing else can be checked
        elif found["source"] is None or found.get("fallback"):
            missing.append(
                "no AWS credentials found: run `aws configure` (access keys) or `aws sso login "
                "--profile NAME` and export AWS_PROFILE=NAME, or export a Bedrock API key in "
                "AWS_BEARER_TOKEN_BEDROCK; fluid never stores AWS credentials"
            )
    else:
        holder = "FLUID_LLM_API_KEY" if env.get("FLUID_LLM_API_KEY") else None
        found = google_credentials(env, holder)
        if found["project"] is None:
            missing.append(
                "no Google Cloud project: run again with --project my-project (or set "
                "GOOGLE_CLOUD_PROJECT)"
            )
        if found["error"] and "pip install" in found["error"]:
            missing.append(found["error"])  # the extra is missing: no token can be made
        elif found["source"] is None:
            missing.append(
                f"{found['error']}; fluid never stores Google credentials"
                if found["error"] and "GOOGLE_APPLICATION_CREDENTIALS" in found["error"]
                else "no Google credentials found: run `gcloud auth application-default login`, "
                "or set GOOGLE_APPLICATION_CREDENTIALS to a service-account key file; fluid "
                "never stores Google credentials"
            )
    source = found["source"] if not found.get("fallback") else None
    return source, missing


def _setup(
    provider: str | None,
    model: str | None,
    no_key: bool,
    as_json: bool,
    given: dict[str, str] | None = None,
) -> int:
    from fluid_build.aiconfig import load_ai_config, save_ai_config
    from fluid_build.copilot.health.keys import key_fingerprint
    from fluid_build.copilot.llm.settings import PROVIDERS

    name = _provider_name(provider)
    info = PROVIDERS[name]
    previous_settings = load_ai_config().settings.get(name, {})
    settings = _cloud_settings(name, given or {}, previous_settings)
    model = model.strip() if model and model.strip() else None
    previous = load_ai_config()
    if model is None and previous.provider == name:
        model = previous.model

    key: str | None = None
    warning: str | None = None
    if info.key_vars and not no_key:
        _check_storage(name)
        key = _validated_key(name, _read_key(name), required=info.key_required)
        warning = _prefix_warning(name, key) if key else None
    source: str | None = None
    note: str | None = None
    if key is not None:
        source, note = _store_key(name, key)
    saved = save_ai_config(
        name,
        model=model,
        key_source="file" if source == "file" else "keyring" if source else None,
        key=key if source == "file" else None,
        settings=settings,
    )
    overridden = [v for v in ("FLUID_LLM_API_KEY", *info.key_vars) if os.environ.get(v)]
    credentials, missing = (None, []) if settings is None else _cloud_notes(name, settings)
    overridden += [v for v in settings or {} if os.environ.get(v)]
    result: dict[str, Any] = {
        "ok": True,
        "provider": name,
        "model": model,
        "config_path": saved.path,
        "key_stored": source is not None,
        "key_source": source,
        "key_fingerprint": key_fingerprint(key) if key else None,
        "warnings": [w for w in (warning, note, *missing) if w],
        "overridden_by_env": overridden,
    }
    if settings is not None:
        result.update(settings=settings, credentials=credentials)
    if as_json:
        click.echo(json.dumps(result))
        return 0
    from rich.markup import escape

    from fluid_build.cli._console import make_console

    out, err = make_console(), make_console(stderr=True)
    shown_model = model or info.default_model or "none: set FLUID_LLM_MODEL or pass --model"
    out.print(escape(f"{name}: provider stored in {saved.path} (model: {shown_model})"))
    if key is not None:
        where = "the OS keyring" if source == "keyring" else f"{saved.path} (plaintext)"
        out.print(escape(f"{name}: key stored in {where} (fingerprint {key_fingerprint(key)})"))
    elif info.key_vars and not no_key:
        out.print(escape(f"{name}: no key stored (this provider does not need one)"))
    for variable, value in (settings or {}).items():
        out.print(escape(f"{name}: {value} stored for {variable} (used when it is not set)"))
    if credentials is not None:
        out.print(escape(f"{name}: credentials: {credentials} (never stored by fluid)"))
    for text in result["warnings"]:
        err.print(f"[yellow]warning:[/] {escape(text)}")
    if overridden:
        what = "stored setting" if all(v in (settings or {}) for v in overridden) else "stored key"
        err.print(
            f"[cyan]note:[/] {escape(', '.join(overridden))} is set in this environment and "
            f"wins over the {what}"
        )
    return 0


# -- checking -----------------------------------------------------------------------


def _models_visible(response: httpx.Response) -> int | None:
    try:
        data = response.json()
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    for field in ("data", "models"):  # OpenAI, Anthropic / Gemini, Ollama
        listed = data.get(field)
        if isinstance(listed, list):
            return len(listed)
    return None


def _check(provider: str | None, model: str | None, as_json: bool) -> int:
    import httpx

    from fluid_build.aiconfig import apply_stored_config
    from fluid_build.cli.doctor import public_url
    from fluid_build.copilot import LLMClient
    from fluid_build.copilot.agents.error_classification import classify_provider_error

    name = _provider_name(provider) if provider else None
    with LLMClient(provider=name, model=model, env=apply_stored_config(os.environ)) as client:
        config = client.config
        # The adapter's list of models, with the headers its calls carry (Adapter.models_path).
        probe = client.adapter.models_request()
        if probe is None:
            # A cloud's endpoint has no model list to GET with a key: an unsigned GET would
            # fail for the wrong reason. Say so rather than report a misleading verdict.
            raise click.UsageError(
                f"--check does not test {config.provider}'s cloud credentials: `fluid doctor` "
                "shows where they come from, and one prompt through `fluid batch` tests them"
            )
        url, headers, params = probe
        try:
            response = httpx.get(url, headers=headers, params=params, timeout=config.timeout)
            response.raise_for_status()
        except httpx.HTTPError as exc:
            raise classify_provider_error(
                exc, provider=config.provider, model=config.model
            ) from exc
    count = _models_visible(response)
    verdict = "key accepted" if config.api_key else "server answered"
    if as_json:
        click.echo(
            json.dumps(
                {
                    "ok": True,
                    "provider": config.provider,
                    "model": config.model,
                    "endpoint": public_url(url),
                    "key_accepted": bool(config.api_key),
                    "models_visible": count,
                }
            )
        )
        return 0
    from rich.markup import escape

    from fluid_build.cli._console import make_console

    seen = f"{count} models visible" if count is not None else "model list not readable"
    make_console().print(f"{escape(config.provider)}: [green]{verdict}[/] ({seen})")
    return 0
