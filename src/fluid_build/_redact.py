"""Keep secrets out of everything an error shows: messages, reprs, details.

Two layers: patterns that match credentials of every common shape (bearer
tokens, provider key prefixes, ``key=value`` pairs, URL query keys), and the
exact values a caller knows are secret (the API key of the request being
classified), which catches keys of any shape a provider echoes back.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import Final

__all__ = ["REDACTED", "json_safe", "one_line", "redact", "truncate"]

REDACTED: Final = "[REDACTED]"

# A secret value never starts with the marker itself; this keeps redaction idempotent.
_NOT_MARKER = r"(?!\[REDACTED)"
_VALUE = _NOT_MARKER + r"[^\s\"'&,;{}<>\[\]()]+"

_PATTERNS: Final[tuple[tuple[re.Pattern[str], str], ...]] = (
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
            r"|access[-_]?token|auth[-_]?token|refresh[-_]?token|client[-_]?secret|secret[-_]?key"
            r"|password|passwd|secret|token)[\"']?\s*[:=]\s*[\"']?)" + _VALUE
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
    (re.compile(r"\bxox[abpors]-[A-Za-z0-9\-]{10,}"), REDACTED),  # Slack
    (re.compile(r"\beyJ[A-Za-z0-9_\-]{5,}\.[A-Za-z0-9_\-]{5,}\.[A-Za-z0-9_\-]*"), REDACTED),  # JWT
)

# Exact secrets shorter than this are not redacted by value: replacing "ab"
# everywhere would shred the message and protect nothing.
_MIN_SECRET_LEN: Final = 8


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """Return ``text`` with every credential-looking substring replaced."""
    for secret in sorted({s for s in secrets if len(s) >= _MIN_SECRET_LEN}, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


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


_SECRET_KEY = re.compile(
    r"(?i)^(?:authorization|proxy-authorization|cookie|set-cookie|x-api-key|api[-_]?key|apikey"
    r"|x-goog-api-key|subscription[-_]key|ocp-apim-subscription-key|password|passwd|secret"
    r"|client[-_]secret|access[-_]token|refresh[-_]token|token)$"
)


def _is_secret_key(key: str) -> bool:
    return bool(_SECRET_KEY.match(key))
