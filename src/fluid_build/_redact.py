"""Keep secrets out of everything fluid_build shows or keeps: errors, logs, cassettes.

Three layers:

- **by value**: the exact secrets a caller knows (the API key of the request),
  with their URL- and JSON-escaped forms, wherever they appear;
- **by name**: credential headers (:func:`is_credential_header`), key-like
  URL query parameters (:func:`is_credential_param`), URL userinfo, and JSON
  fields named like a credential (:func:`is_secret_field`), whatever their
  value looks like;
- **by pattern**: credentials of every common shape (bearer tokens, provider
  key prefixes, ``key=value`` pairs), for secrets nobody named.

:func:`redact` applies all three to text (URLs inside the text lose their
userinfo and key-like query values); :func:`redact_url`, :func:`redact_json`,
:func:`redact_exception_chain` and :class:`RedactingFilter` (installed at import on
fluid_build's, httpx's and the cloud libraries' loggers: botocore, google-auth,
urllib3) build on it.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any, Final
from urllib.parse import quote, quote_plus, unquote_plus

__all__ = [
    "ACCOUNT_HEADERS",
    "REDACTED",
    "REDACTED_LOGGERS",
    "REDACTED_PREFIXES",
    "RedactingFilter",
    "exception_chain",
    "install_log_redaction",
    "is_credential_header",
    "is_credential_param",
    "is_secret_field",
    "json_safe",
    "one_line",
    "redact",
    "redact_exception",
    "redact_exception_chain",
    "redact_json",
    "redact_url",
    "request_secrets",
    "truncate",
]

REDACTED: Final = "[REDACTED]"

# A secret value never starts with the marker itself; this keeps redaction idempotent.
_NOT_MARKER = r"(?!\[REDACTED)"
_VALUE = _NOT_MARKER + r"[^\s\"'&,;{}<>\[\]()]+"
# How a name is given its value: ``name=value``, ``name = value``, ``name: value``, or
# ``name= "value"``. Not ``name= word``: an ``=`` with a space after it and none before
# names an argument in prose ("(api_key= in Python)"), so the next word is not a value.
_ASSIGNED = r"(?:\s*:\s*|\s+=\s*|=(?:\s*(?=[\"']))?)"

# JSON fields named like a credential: the whole string value goes, spaces and all.
_FIELD_NAMES = (
    r"(?:proxy[-_]?)?authorization|(?:set[-_]?)?cookie|(?:x[-_]?)?(?:goog[-_]?)?api[-_]?key"
    r"|(?:ocp[-_]?apim[-_]?)?subscription[-_]?key|password|passwd|(?:client[-_]?)?secret"
    r"|(?:secret|private|access)[-_]?key|(?:access|refresh|id|auth|session|security)[-_]?token"
    r"|token|(?:aws[-_]?)?secret[-_]?access[-_]?key|aws[-_]?(?:session|security)[-_]?token"
)

_PATTERNS: Final[tuple[tuple[re.Pattern[str], str], ...]] = (
    # "password": "correct horse battery", and the same inside a JSON-encoded string.
    (
        re.compile(r'(?i)("(?:' + _FIELD_NAMES + r')"\s*:\s*")(?:[^"\\]|\\.)*(")'),
        r"\1" + REDACTED + r"\2",
    ),
    (
        re.compile(r'(?i)(\\"(?:' + _FIELD_NAMES + r')\\"\s*:\s*\\")(?:(?!\\").)*(\\")'),
        r"\1" + REDACTED + r"\2",
    ),
    # Authorization: Bearer/Basic/Token <credential>, also inside header dumps.
    (
        re.compile(
            r"(?i)(\b(?:proxy-)?authorization[\"']?\s*[:=]\s*[\"']?)"
            r"(?!(?:bearer|basic|token)\s+\[REDACTED)((?:bearer|basic|token)\s+)?" + _VALUE
        ),
        r"\1\2" + REDACTED,
    ),
    (
        re.compile(r"(?i)\b(bearer)\s+" + _NOT_MARKER + r"[A-Za-z0-9._~+/=\-]{8,}"),
        r"\1 " + REDACTED,
    ),
    (
        re.compile(r"(?i)\b(basic)\s+" + _NOT_MARKER + r"[A-Za-z0-9+/]{16,}={0,2}"),
        r"\1 " + REDACTED,
    ),
    # Named credentials: api_key=..., "x-api-key": "...", token: ...
    (
        re.compile(
            r"(?i)(\b(?:x-goog-api-key|x-api-key|api[-_]?key|apikey|subscription[-_]key"
            r"|(?:aws_)?secret[-_]?access[-_]?key|aws_(?:session|security)_token"
            r"|access[-_]?token|auth[-_]?token|refresh[-_]?token|client[-_]?secret|secret[-_]?key"
            r"|password|passwd|secret|token)[\"']?" + _ASSIGNED + r"[\"']?)" + _VALUE
        ),
        r"\1" + REDACTED,
    ),
    # Credentials in URLs: ?key=..., &access_token=..., user:password@host.
    (
        re.compile(
            r"(?i)([?&;](?:key|api[-_]?key|apikey|access_token|token|sig|signature|code)=)[^&#\s\"']+"
        ),
        r"\1" + REDACTED,
    ),
    (re.compile(r"(?i)(\b[a-z][a-z0-9+.\-]*://[^/\s:@]+:)[^@\s/]+@"), r"\1" + REDACTED + "@"),
    # Well-known key shapes, wherever they appear.
    (re.compile(r"\bsk-[A-Za-z0-9_\-*]{6,}"), REDACTED),  # OpenAI, Anthropic, OpenRouter, DeepSeek
    (re.compile(r"\bAIza[0-9A-Za-z_\-]{10,}"), REDACTED),  # Google
    (
        re.compile(
            r"\b(?:gsk|xai|hf|pplx|csk|nvapi|ghp|gho|ghu|ghs|ghr|glpat)[_-][A-Za-z0-9_\-]{10,}"
        ),
        REDACTED,
    ),
    (re.compile(r"\bgithub_pat_[A-Za-z0-9_]{20,}"), REDACTED),
    (re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"), REDACTED),  # AWS access key ids
    # SigV4's pieces, wherever an Authorization header or a presigned URL was echoed or logged
    # (botocore.auth writes "Signature:\n<hex>"): the signature, and the key id of the
    # credential scope (``Credential=<key id>/<date>/<region>/<service>/aws4_request``).
    (
        re.compile(
            r"(?i)\b((?:x-amz-)?signature[\"']?\s*[:=]\s*[\"']?)" + _NOT_MARKER + r"[0-9a-f]{32,}"
        ),
        r"\1" + REDACTED,
    ),
    (
        re.compile(
            r"(?i)\b((?:x-amz-)?credential\s*=\s*)" + _NOT_MARKER + r"[A-Za-z0-9_\-]+(?=/|%2F)"
        ),
        r"\1" + REDACTED,
    ),
    (re.compile(r"\bxox[abpors]-[A-Za-z0-9\-]{10,}"), REDACTED),  # Slack
    (re.compile(r"\beyJ[A-Za-z0-9_\-]{5,}\.[A-Za-z0-9_\-]{5,}\.[A-Za-z0-9_\-]*"), REDACTED),  # JWT
)

# Exact secrets shorter than this are not redacted by value: replacing "ab"
# everywhere would shred the message and protect nothing. Such values are
# still removed where they stand by name (a credential header, userinfo, a
# key-like query parameter, a JSON field named like a credential).
_MIN_SECRET_LEN: Final = 8


def _variants(secrets: Iterable[str]) -> list[str]:
    """Each secret as it may be written: raw, URL-encoded, JSON-escaped; longest first."""
    found: set[str] = set()
    for secret in secrets:
        if not isinstance(secret, str) or len(secret) < _MIN_SECRET_LEN:
            continue
        found.add(secret)
        found.add(quote(secret, safe=""))
        found.add(quote_plus(secret, safe=""))
        found.add(json.dumps(secret)[1:-1])
        found.add(json.dumps(secret, ensure_ascii=False)[1:-1])
    return sorted(found, key=len, reverse=True)


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """Return ``text`` with every credential-looking substring replaced.

    The ``secrets`` go by value (also URL- and JSON-escaped); every URL in the
    text loses its userinfo and the values of key-like query parameters; then
    the patterns run.
    """
    for secret in _variants(secrets):
        text = text.replace(secret, REDACTED)
    if "://" in text:
        text = _URL_IN_TEXT.sub(lambda m: _strip_url(m.group(0)), text)
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


# -- by name: headers, query parameters, JSON fields ------------------------------------------

#: Headers whose value is a credential, whatever it looks like (with
#: :func:`is_credential_header`'s suffix rule for the ones not listed).
CREDENTIAL_HEADERS: Final = frozenset(
    {
        "authorization",
        "proxy-authorization",
        "api-key",
        "x-api-key",
        "x-goog-api-key",
        "ocp-apim-subscription-key",
        "cookie",
        "set-cookie",
        "x-auth-token",
        "x-amz-security-token",
    }
)
#: Headers that name the account behind a call (OpenAI's organization and
#: project, Anthropic's organization id): not credentials, but nothing a
#: cassette shared in a repository should say.
ACCOUNT_HEADERS: Final = frozenset(
    {"openai-organization", "openai-project", "anthropic-organization-id"}
)
_CREDENTIAL_SUFFIXES: Final = (
    "apikey",
    "token",
    "secret",
    "password",
    "passwd",
    "credential",
    "credentials",
    "signature",
    "cookie",
    "authorization",
    "subscriptionkey",
    "accesskey",
    "privatekey",
    "secretkey",
    "sessionid",
)
_CREDENTIAL_PARAMS: Final = frozenset(
    {"key", "sig", "code", "auth", "pwd", "pass", "jwt", "session", "sid", "otp"}
)
_SECRET_FIELDS: Final = frozenset(
    {
        "authorization",
        "proxyauthorization",
        "cookie",
        "setcookie",
        "apikey",
        "xapikey",
        "xgoogapikey",
        "subscriptionkey",
        "ocpapimsubscriptionkey",
        "password",
        "passwd",
        "secret",
        "clientsecret",
        "secretkey",
        "privatekey",
        "accesskey",
        "accesstoken",
        "refreshtoken",
        "idtoken",
        "authtoken",
        "sessiontoken",
        "securitytoken",
        "secretaccesskey",
        "awssecretaccesskey",
        "awssessiontoken",
        "awssecuritytoken",
        "token",
    }
)


def _normal(name: str) -> str:
    return re.sub(r"[-_.\s]", "", unquote_plus(str(name))).lower()


def is_credential_header(name: str) -> bool:
    """Whether a header's value is a credential: Authorization, api-key, cookies, ``*-token`` ..."""
    low = str(name).strip().lower()
    return low in CREDENTIAL_HEADERS or _normal(low).endswith(_CREDENTIAL_SUFFIXES)


def is_credential_param(name: str) -> bool:
    """Whether a URL query parameter holds a credential: key, api_key, token, sig, password ..."""
    normal = _normal(name)
    return normal in _CREDENTIAL_PARAMS or normal.endswith((*_CREDENTIAL_SUFFIXES, "key"))


def is_secret_field(name: str) -> bool:
    """Whether a JSON field (or a details key) is named like a credential."""
    return _normal(name) in _SECRET_FIELDS


# -- URLs -----------------------------------------------------------------------------------

_URL_IN_TEXT: Final = re.compile(r"(?i)\b[a-z][a-z0-9+.\-]*://[^\s\"'<>`]+")
_PARAM: Final = re.compile(r"([?&;#])([^=&;#?]*)=([^&;#]*)")


def _strip_param(match: re.Match[str]) -> str:
    lead, name, value = match.groups()
    if value and value != REDACTED and is_credential_param(name):
        return f"{lead}{name}={REDACTED}"
    return match.group(0)


def _authority(url: str) -> tuple[int, int] | None:
    """Where ``url``'s authority (userinfo, host, port) starts and ends; None without ``://``."""
    scheme_end = url.find("://")
    if scheme_end < 0:
        return None
    start = scheme_end + 3
    end = len(url)
    for mark in "/?#":
        found = url.find(mark, start)
        if found != -1:
            end = min(end, found)
    return start, end


def _strip_url(url: str) -> str:
    """``url`` without userinfo, with key-like query (and fragment) values redacted."""
    head, rest = "", url
    span = _authority(url)
    if span is not None:
        start, end = span
        authority = url[start:end]
        head = url[:start] + authority[authority.rfind("@") + 1 :]
        rest = url[end:]
    if "=" in rest:
        rest = _PARAM.sub(_strip_param, rest)
    return head + rest


def redact_url(url: object, secrets: Iterable[str] = ()) -> str:
    """``url`` as text that is safe to show: no userinfo, no key-like query values, no secret.

    Takes a string or an ``httpx.URL``; a relative URL keeps its path and
    loses key-like query values. Never raises.
    """
    try:
        text = str(url)
    except Exception:  # noqa: BLE001 - a hostile __str__
        return REDACTED
    return redact(_strip_url(text), secrets)


def request_secrets(headers: Iterable[tuple[str, str]], url: object) -> list[str]:
    """The secrets a request carries: credential header values, URL userinfo, key-like params.

    Header values come whole and without their scheme (``Bearer``, ``Basic``);
    URL parts come raw and percent-decoded. Feed them to :func:`redact` to
    remove the request's own key wherever else it shows up.
    """
    found: list[str] = []
    for name, value in headers:
        if not is_credential_header(name) or not value:
            continue
        found.append(value)
        scheme, _, credential = value.strip().partition(" ")
        if credential and scheme.lower() in {"bearer", "basic", "token", "key", "apikey"}:
            found.append(credential.strip())
        elif credential and scheme.upper().startswith("AWS4-"):
            # SigV4: an error body may echo one piece alone (the signature, the key id).
            found.extend(_sigv4_parts(credential))
    text = str(url)
    span = _authority(text)
    if span is not None:
        authority = text[span[0] : span[1]]
        if "@" in authority:
            userinfo = authority[: authority.rfind("@")]
            for part in (userinfo, *userinfo.split(":", 1)):
                found.extend((part, unquote_plus(part)))
    for _, name, value in _PARAM.findall(text):
        if value and is_credential_param(name):
            found.extend((value, unquote_plus(value)))
    return [s for s in dict.fromkeys(found) if s and s != REDACTED]


def _sigv4_parts(credential: str) -> list[str]:
    """The key id and the signature of a SigV4 ``Authorization`` value."""
    parts: list[str] = []
    for item in credential.split(","):
        name, _, value = item.strip().partition("=")
        if name == "Credential":
            parts.append(value.split("/", 1)[0])
        elif name == "Signature":
            parts.append(value)
    return [part for part in parts if part]


# -- JSON values ----------------------------------------------------------------------------


def redact_json(value: Any, secrets: Iterable[str] = ()) -> Any:
    """A copy of a JSON value with every string redacted and credential-named fields replaced.

    Unlike :func:`json_safe`, nothing is cut: this is for values that must
    stay whole (a recorded answer, a recipe). Keys are redacted too.
    """
    return _redact_json(value, tuple(secrets), 0)


def _redact_json(value: Any, secrets: tuple[str, ...], depth: int) -> Any:
    if isinstance(value, str):
        return redact(value, secrets)
    if depth > 200:
        return REDACTED
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, item in value.items():
            clean_key = redact(str(key), secrets)
            secret = is_secret_field(clean_key) and item is not None and not isinstance(item, bool)
            out[clean_key] = REDACTED if secret else _redact_json(item, secrets, depth + 1)
        return out
    if isinstance(value, list | tuple):
        return [_redact_json(item, secrets, depth + 1) for item in value]
    return value


def one_line(text: str) -> str:
    """Collapse all whitespace runs (newlines included) to single spaces."""
    return " ".join(text.split())


def truncate(text: str, limit: int) -> str:
    """Cut ``text`` to ``limit`` characters, marking the cut."""
    if len(text) <= limit:
        return text
    return text[: max(limit - 1, 0)] + "…"


_MAX_DEPTH: Final = 8
_MAX_ITEMS: Final = 100
_MAX_STR: Final = 4000

JsonValue = None | bool | int | float | str | list["JsonValue"] | dict[str, "JsonValue"]


def json_safe(value: object, secrets: Iterable[str] = (), *, _depth: int = 0) -> JsonValue:
    """A redacted, bounded, JSON-serialisable copy of ``value``.

    Strings are redacted and truncated, containers are cut at 100 items and 8
    levels, non-finite floats become strings, anything else becomes its
    redacted ``repr``. Never raises for ordinary values.
    """
    secrets = tuple(secrets)
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, str):
        return truncate(redact(value, secrets), _MAX_STR)
    if isinstance(value, bytes | bytearray):
        return truncate(redact(bytes(value).decode("utf-8", "replace"), secrets), _MAX_STR)
    if _depth >= _MAX_DEPTH:
        return "…"
    if isinstance(value, Mapping):
        out: dict[str, JsonValue] = {}
        for i, (key, item) in enumerate(value.items()):
            if i >= _MAX_ITEMS:
                out["…"] = f"{len(value) - _MAX_ITEMS} more"
                break
            safe_key = truncate(redact(str(key), secrets), 200)
            if _is_secret_key(safe_key):
                out[safe_key] = REDACTED
            else:
                out[safe_key] = json_safe(item, secrets, _depth=_depth + 1)
        return out
    if isinstance(value, list | tuple | set | frozenset):
        items = list(value)
        safe = [json_safe(item, secrets, _depth=_depth + 1) for item in items[:_MAX_ITEMS]]
        if len(items) > _MAX_ITEMS:
            safe.append(f"… {len(items) - _MAX_ITEMS} more")
        return safe
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a hostile __repr__ must not break error reporting
        text = f"<unrepresentable {type(value).__name__}>"
    return truncate(redact(text, secrets), _MAX_STR)


def _is_secret_key(key: str) -> bool:
    return is_secret_field(key)


# -- exceptions -----------------------------------------------------------------------------

_MAX_CHAIN: Final = 50


def exception_chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and every exception reachable from it: ``__cause__``, ``__context__``, groups.

    Each once, at most 50; never raises.
    """
    seen: dict[int, BaseException] = {}
    todo: list[BaseException] = [exc]
    while todo and len(seen) < _MAX_CHAIN:
        current = todo.pop(0)
        if id(current) in seen:
            continue
        seen[id(current)] = current
        for link in (current.__cause__, current.__context__):
            if isinstance(link, BaseException):
                todo.append(link)
        members = getattr(current, "exceptions", None)
        if isinstance(current, BaseExceptionGroup) and isinstance(members, tuple):
            todo.extend(m for m in members if isinstance(m, BaseException))
    return list(seen.values())


def _redact_value(value: Any, secrets: tuple[str, ...], depth: int = 0) -> Any:
    """``value`` with secrets out: strings and bytes redacted, anything else by its repr."""
    if isinstance(value, str):
        return redact(value, secrets)
    if isinstance(value, bytes | bytearray):
        text = bytes(value).decode("utf-8", "replace")
        clean = redact(text, secrets)
        return value if clean == text else clean.encode("utf-8")
    if value is None or isinstance(value, bool | int | float | BaseException) or depth > 3:
        return value
    if isinstance(value, tuple | list):
        items = [_redact_value(v, secrets, depth + 1) for v in value]
        same = all(a is b for a, b in zip(items, value, strict=True))
        return value if same else type(value)(items)
    try:
        shown = repr(value)
    except Exception:  # noqa: BLE001 - a hostile __repr__: keep the object, it shows nothing
        return value
    clean = redact(shown, secrets)
    return value if clean == shown else clean


def redact_exception(exc: BaseException, secrets: Iterable[str] = ()) -> None:
    """Redact one exception in place: ``args``, notes, string attributes, OSError fields.

    What ``str()``, ``repr()`` and a formatted traceback show of it comes from
    these, so afterwards none of them carries a secret, a URL's userinfo or a
    key-like query value. Objects in ``args`` whose ``repr`` would leak are
    replaced by their redacted ``repr``. Never raises.
    """
    secrets = tuple(secrets)
    try:
        args = exc.args
        clean_args = tuple(_redact_value(arg, secrets) for arg in args)
        if any(a is not b for a, b in zip(clean_args, args, strict=True)):
            exc.args = clean_args
    except Exception:  # noqa: BLE001, S110 - an exception that refuses new args keeps its own
        pass
    attributes: dict[str, Any] = getattr(exc, "__dict__", {})
    for name, value in list(attributes.items()):
        if name == "__notes__" and isinstance(value, list):
            value[:] = [redact(n, secrets) if isinstance(n, str) else n for n in value]
        elif isinstance(value, str | bytes | bytearray):
            clean = _redact_value(value, secrets)
            if clean is not value:
                with _quietly():
                    setattr(exc, name, clean)
    if isinstance(exc, OSError):
        for name in ("strerror", "filename", "filename2"):
            value = getattr(exc, name, None)
            if isinstance(value, str):
                clean = redact(value, secrets)
                if clean != value:
                    with _quietly():
                        setattr(exc, name, clean)


def redact_exception_chain(
    exc: BaseException,
    secrets: Iterable[str] = (),
    *,
    skip: tuple[type[BaseException], ...] = (),
) -> list[BaseException]:
    """:func:`redact_exception` on ``exc`` and every exception chained to it; returns the chain.

    Exceptions of the ``skip`` types are walked through but left as they are
    (fluid_build's typed errors are redacted when they are built).
    """
    secrets = tuple(secrets)
    chain = exception_chain(exc)
    for link in chain:
        if not (skip and isinstance(link, skip)):
            redact_exception(link, secrets)
    return chain


class _quietly:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc_info: object) -> bool:
        return True  # a read-only attribute keeps its value


# -- logging -----------------------------------------------------------------------------------


class RedactingFilter(logging.Filter):
    """A logging filter that redacts each record: its message, its exception and its traceback.

    It never drops a record. The message is formatted once and replaced by
    its redacted text when that differs; an attached exception chain is
    redacted in place (:func:`redact_exception_chain`).
    """

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a broken format string is the handler's to report
            message = None
        if message is not None:
            clean = redact(message)
            if clean != message:
                record.msg, record.args = clean, None
        exc_info = record.exc_info
        if exc_info and isinstance(exc_info[1], BaseException):
            redact_exception_chain(exc_info[1])
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        for name in _STRUCTURED_EXTRAS:
            value = record.__dict__.get(name)
            if value is not None:
                record.__dict__[name] = redact_json(value)
        return True


#: The ``extra=`` fields third-party loggers fill with a request or an answer (google-auth
#: logs a token exchange's headers and body there): a structured formatter prints them.
_STRUCTURED_EXTRAS: Final = ("httpRequest", "httpResponse")


_FILTER: Final = RedactingFilter()

#: Loggers whose records are redacted: fluid_build's own; httpx's, which logs each
#: request's full URL at INFO ("HTTP Request: POST https://..."); and the third-party
#: loggers that see credentials: botocore's (``botocore.auth`` writes the canonical
#: request with ``x-amz-security-token`` and the signature at DEBUG), google-auth's and
#: urllib3's (both carry the token exchanges). A logger's filters do not apply to its
#: children, so each is named; naming one creates it, so the filter is there before the
#: library is imported.
REDACTED_LOGGERS: Final = (
    "fluid_build",
    "fluid_build.agent",
    "fluid_build.breaker",
    "fluid_build.budget",
    "fluid_build.capabilities",
    "fluid_build.client",
    "fluid_build.config",
    "fluid_build.cooldown",
    "fluid_build.corpus",
    "fluid_build.forge",
    "fluid_build.llm",
    "fluid_build.preflight",
    "fluid_build.retry",
    "fluid_build.tools",
    "httpx",
    "httpcore",
    "httpcore.connection",
    "httpcore.http11",
    "httpcore.http2",
    "httpcore.proxy",
    "httpcore.socks",
    "botocore",
    "botocore.auth",
    "botocore.awsrequest",
    "botocore.client",
    "botocore.configprovider",
    "botocore.credentials",
    "botocore.endpoint",
    "botocore.hooks",
    "botocore.httpsession",
    "botocore.parsers",
    "botocore.retryhandler",
    "botocore.session",
    "botocore.tokens",
    "botocore.utils",
    "google.auth",
    "google.auth._default",
    "google.auth._refresh_worker",
    "google.auth.compute_engine._metadata",
    "google.auth.compute_engine.credentials",
    "google.auth.external_account",
    "google.auth.external_account_authorized_user",
    "google.auth.impersonated_credentials",
    "google.auth.transport._http_client",
    "google.auth.transport.requests",
    "google.auth.transport.urllib3",
    "google.oauth2._client",
    "google.oauth2.credentials",
    "google.oauth2.service_account",
    "urllib3",
    "urllib3.connection",
    "urllib3.connectionpool",
    "urllib3.poolmanager",
    "urllib3.response",
    "urllib3.util.retry",
)
#: Every logger under these is redacted too, whatever its name (see
#: :func:`install_log_redaction`).
REDACTED_PREFIXES: Final = ("fluid_build", "botocore", "google.auth", "google.oauth2", "urllib3")


def install_log_redaction(*names: str) -> None:
    """Put :class:`RedactingFilter` on ``names``, :data:`REDACTED_LOGGERS` and every existing
    logger under :data:`REDACTED_PREFIXES`; idempotent. The cloud adapters call it again
    once botocore or google-auth is imported, for loggers this list does not name."""
    existing = [
        name
        for name in list(logging.Logger.manager.loggerDict)
        if any(name == prefix or name.startswith(prefix + ".") for prefix in REDACTED_PREFIXES)
    ]
    for name in (*REDACTED_LOGGERS, *existing, *names):
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)


install_log_redaction()
