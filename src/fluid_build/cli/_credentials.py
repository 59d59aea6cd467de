"""Where bedrock's and vertex's credentials would come from, for ``fluid doctor``.

Only *where*: no secret, token or key is ever read into the report. Nothing
here asks the network: the AWS chain's steps that would (a credential
process, the container and instance roles) and Google's metadata server are
named as "not checked" instead of being tried, so doctor answers at once on a
laptop and never runs a command from ``~/.aws/config``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

__all__ = ["aws_credentials", "google_credentials"]

# A key file larger than this is not a key file: never read more.
_KEY_FILE_LIMIT = 1 << 20

# botocore's credential provider methods that read files or the environment only.
_OFFLINE_METHODS = frozenset(
    {
        "env",
        "sso",  # deferred: the SSO portal is asked at the first signing, not by load()
        "login",
        "shared-credentials-file",
        "config-file",
        "ec2-credentials-file",
        "boto-config",
    }
)
_CONTAINER_VARIABLES = (
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
)


def _set(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(name)
    return value.strip() if value and value.strip() else None


def _shown(value: str) -> str:
    """A value from the environment as the report may show it: redacted (a URL pasted into
    the wrong variable can hold a password), and cut short."""
    from fluid_build._redact import redact

    return redact(value)[:80]


def _aws_source(method: str, env: Mapping[str, str], profile: str) -> str:
    profile = _shown(profile)
    if method == "env":
        return "environment (AWS_ACCESS_KEY_ID)"
    if method == "shared-credentials-file":
        path = _shown(_set(env, "AWS_SHARED_CREDENTIALS_FILE") or "~/.aws/credentials")
        return f"shared credentials file {path}, profile {profile}"
    if method == "config-file":
        path = _shown(_set(env, "AWS_CONFIG_FILE") or "~/.aws/config")
        return f"config file {path}, profile {profile}"
    if method == "sso":
        return f"SSO profile {profile} (`aws sso login --profile {profile}` when it expires)"
    if method == "login":
        return f"`aws login` session, profile {profile}"
    if method == "assume-role":
        return f"assumed role of profile {profile}"
    if method == "assume-role-with-web-identity":
        return "web identity role (AWS_ROLE_ARN / AWS_WEB_IDENTITY_TOKEN_FILE or the profile)"
    return f"{method}, profile {profile}"


def aws_credentials(env: Mapping[str, str], api_key: str | None) -> dict[str, Any]:
    """Where a bedrock call's credentials would come from: ``{"source", "checked", "error"}``.

    ``api_key`` names the variable holding a bearer token (it wins, as in a run). botocore
    reads the process environment itself, exactly as the adapter's signer does.
    """
    if api_key is not None:
        return {"source": f"Bedrock API key ({api_key})", "checked": True, "error": None}
    try:
        import botocore.session
        from botocore.exceptions import BotoCoreError
    except ImportError:
        from fluid_build.copilot.llm.bedrock import PIP_LINE

        return {"source": None, "checked": False, "error": f"botocore is missing: {PIP_LINE}"}
    profile = _set(env, "AWS_PROFILE") or "default"
    try:
        # No builtin handlers (35 ms a session): they serve a client's requests, and the
        # providers asked here only read files and the environment.
        session = botocore.session.Session(
            profile=_set(env, "AWS_PROFILE"), include_builtin_handlers=False
        )
        resolver = session.get_component("credential_provider")
        for provider in resolver.providers:
            method = getattr(provider, "METHOD", "")
            if method in ("assume-role", "assume-role-with-web-identity"):
                # Not load(): it resolves the source credentials at once, which can ask the
                # instance metadata service or run a source profile's credential_process.
                assumed = _assumed_role(method, env, session.get_scoped_config(), profile)
                if assumed is not None:
                    return {"source": assumed, "checked": False, "error": None}
                continue
            if method == "custom-process":
                if session.get_scoped_config().get("credential_process"):
                    return {
                        "source": f"credential_process of profile {_shown(profile)} (not run "
                        "by doctor)",
                        "checked": False,
                        "error": None,
                    }
                continue
            if method == "container-role":
                named = [name for name in _CONTAINER_VARIABLES if _set(env, name)]
                if named:
                    return {
                        "source": f"container role ({named[0]}; not checked: it asks the network)",
                        "checked": False,
                        "error": None,
                    }
                continue
            if method not in _OFFLINE_METHODS:
                continue
            found = provider.load()
            if found is not None:
                return {
                    "source": _aws_source(str(found.method), env, profile),
                    "checked": True,
                    "error": None,
                }
    except BotoCoreError as exc:
        return {"source": None, "checked": True, "error": _aws_error(exc)}
    if (_set(env, "AWS_EC2_METADATA_DISABLED") or "").lower() == "true":
        return {"source": None, "checked": True, "error": "no AWS credentials were found"}
    # Found nowhere offline: only a run on an instance can tell, and doctor does not ask.
    return {
        "source": "instance role (not checked: only the instance metadata service can say)",
        "checked": False,
        "error": None,
        "fallback": True,
    }


def _assumed_role(
    method: str, env: Mapping[str, str], config: Mapping[str, Any], profile: str
) -> str | None:
    """The role botocore would assume, from the configuration alone (None: no such role)."""
    if method == "assume-role-with-web-identity":
        if _set(env, "AWS_ROLE_ARN") and _set(env, "AWS_WEB_IDENTITY_TOKEN_FILE"):
            return "web identity role (AWS_ROLE_ARN, AWS_WEB_IDENTITY_TOKEN_FILE; not checked)"
        if config.get("role_arn") and config.get("web_identity_token_file"):
            return f"web identity role of profile {_shown(profile)} (not checked)"
        return None
    if config.get("role_arn") and (config.get("source_profile") or config.get("credential_source")):
        return (
            f"assumed role of profile {_shown(profile)} (not checked: botocore assumes it at "
            "the first call)"
        )
    return None


def _aws_error(exc: BaseException) -> str:
    from fluid_build._redact import redact

    return redact(f"{type(exc).__name__}: {exc}")[:300]


def aws_region(env: Mapping[str, str], url: str | None) -> tuple[str | None, str | None]:
    """The signing region and where it came from, in the adapter's order."""
    for variable in ("AWS_REGION", "AWS_DEFAULT_REGION"):
        value = _set(env, variable)
        if value is not None:
            return _shown(value), variable
    from fluid_build.copilot.llm.bedrock import _profile_region, _region_of

    region = _profile_region(env)
    if region is not None:
        return region, f"profile {_shown(_set(env, 'AWS_PROFILE') or 'default')}"
    region = _region_of(url) if url else None
    return (region, "endpoint host name") if region else (None, None)


def aws_endpoint_source(env: Mapping[str, str]) -> str:
    for variable in ("AWS_ENDPOINT_URL_BEDROCK_RUNTIME", "AWS_ENDPOINT_URL"):
        if _set(env, variable):
            return variable
    return "the region's endpoint"


def _read_key_file(path: str) -> dict[str, Any]:
    """The JSON object in a credentials file, read as the Vertex adapter reads it (a regular
    file only, bounded in size and depth); raises ValueError saying why."""
    from fluid_build._files import UnsafeFileError, load_json, read_regular
    from fluid_build.copilot.llm.vertex import ADC_DEPTH

    file = os.path.expanduser(path)
    try:
        data = read_regular(file, limit=_KEY_FILE_LIMIT, name=path[:200])
        loaded = load_json(data.decode("utf-8"), name=path[:200], max_depth=ADC_DEPTH)
    except UnsafeFileError as exc:
        raise ValueError(str(exc)) from None
    except FileNotFoundError:
        raise ValueError(f"{path[:200]} is not a file") from None
    except ValueError:
        raise ValueError(f"{path} is not a JSON credentials file") from None
    if not isinstance(loaded, dict):
        raise ValueError(f"{path} is not a JSON credentials file")
    return loaded


def _describe(kind: object, data: Mapping[str, Any], path: str) -> str:
    if kind == "service_account":
        email = data.get("client_email")
        who = f", {email}" if isinstance(email, str) and email.isprintable() else ""
        return f"service-account key file {path}{who}"
    if kind == "authorized_user":
        return f"user credentials file {path}"
    if kind == "external_account":
        return f"workload identity federation file {path}"
    if kind == "impersonated_service_account":
        return f"impersonated service account file {path}"
    return f"credentials file {path} (type {str(kind)[:40]!r})"


def google_credentials(env: Mapping[str, str], api_key: str | None) -> dict[str, Any]:
    """Where a vertex call's token would come from, the project and location, and their sources.

    google-auth's order: an access token (``api_key=`` / FLUID_LLM_API_KEY), the file in
    GOOGLE_APPLICATION_CREDENTIALS, gcloud's application-default login, the metadata server
    (named, never asked: doctor does not wait on 169.254.169.254).
    """
    from fluid_build.copilot.llm.vertex import DEFAULT_LOCATION, adc_may_exist

    result: dict[str, Any] = {"source": None, "checked": True, "error": None}
    file_project: str | None = None
    if api_key is not None:
        result["source"] = f"access token ({api_key})"
    elif named := _set(env, "GOOGLE_APPLICATION_CREDENTIALS"):
        from fluid_build._redact import redact

        try:
            data = _read_key_file(named)
        except (OSError, ValueError) as exc:
            # The path as the error names it, redacted: a URL pasted there can hold a password.
            result["error"] = redact(f"GOOGLE_APPLICATION_CREDENTIALS: {exc}")[:300]
        else:
            result["source"] = _describe(data.get("type"), data, redact(named))
            project = data.get("project_id")
            file_project = project if isinstance(project, str) and project else None
    else:
        config = _set(env, "CLOUDSDK_CONFIG") or os.path.join(
            env.get("HOME") or os.path.expanduser("~"), ".config", "gcloud"
        )
        adc_file = os.path.join(config, "application_default_credentials.json")
        if os.path.isfile(adc_file):
            result["source"] = (
                "gcloud application-default login (`gcloud auth application-default login`)"
            )
        elif adc_may_exist(env):
            result.update(
                source="metadata server (not checked: doctor does not ask it)",
                checked=False,
                fallback=True,
            )
        else:
            result["error"] = (
                "no Google credentials: run `gcloud auth application-default login` or set "
                "GOOGLE_APPLICATION_CREDENTIALS to a service-account key file"
            )
    if api_key is None and not _google_auth_installed():
        from fluid_build.copilot.llm.vertex import VERTEX_INSTALL

        # Found or not, no token can be made from them without it.
        result["error"] = f"google-auth is missing: {VERTEX_INSTALL}"
    if project := _set(env, "GOOGLE_CLOUD_PROJECT"):
        result.update(project=_shown(project), project_source="GOOGLE_CLOUD_PROJECT")
    elif file_project is not None:
        result.update(project=file_project, project_source="the key file")
    else:
        result.update(project=None, project_source=None)
    location = _set(env, "GOOGLE_CLOUD_LOCATION")
    result["location"] = _shown(location) if location else DEFAULT_LOCATION
    result["location_source"] = "GOOGLE_CLOUD_LOCATION" if location else "default"
    return result


def _google_auth_installed() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("google.auth") is not None
    except ImportError:  # a "google" package that is not Google's, or a broken one
        return False
