"""What a model server on this machine (or this network) says about its context size.

Pre-flight needs the model's window, and a local server knows it better than
any table: it is whatever the server was started with. A client whose
provider is ``llamacpp``, ``vllm`` or ``openai_compatible`` on a loopback or
private base URL asks once, before its first call:

============  ==================  =============================================
server        request             read
============  ==================  =============================================
llama.cpp     ``GET {root}/props``  ``default_generation_settings.n_ctx`` (one
                                  slot's context: what a request may fill)
llama.cpp     ``GET {base}/models`` ``data[].meta.n_ctx``, else ``n_ctx_train``
vLLM          ``GET {base}/models`` ``data[].max_model_len``
============  ==================  =============================================

``{base}`` is the base URL (``http://127.0.0.1:8080/v1``); ``{root}`` is the
same without a trailing ``/v1``. The first answer that names a size wins.
Each read is bounded: a short timeout inside the call's deadline, a body of
at most :data:`MAX_PROBE_BYTES` (uncompressed), and any failure (refused,
timed out, 401, 404, not JSON, no size) means "unknown", never an error.

This module only decides: :func:`probe_urls` says what to ask and
:func:`window_from` reads one answer. The asking (one plan, a sync and an
async shell) is :mod:`fluid_build.copilot.call.window`.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import urlsplit

from fluid_build.copilot.llm.registry import PROVIDERS

__all__ = [
    "MAX_PROBE_BYTES",
    "PROBE_TIMEOUT",
    "is_local_url",
    "probe_urls",
    "window_from",
]

#: Seconds for all of a client's probe requests together: at most this, and at most a
#: quarter of what is left of the call's deadline. A local server answers in milliseconds.
PROBE_TIMEOUT: Final = 1.0
#: The largest answer read; llama.cpp's /props carries the chat template (a few KiB).
MAX_PROBE_BYTES: Final = 256 * 1024
# A size outside this is not one (a garbled or hostile answer).
_MAX_WINDOW: Final = 100_000_000
# Host names that are never on the public internet.
_LOCAL_SUFFIXES: Final = (".localhost", ".local", ".internal", ".lan", ".home.arpa")


def is_local_url(url: str) -> bool:
    """Whether ``url`` names this machine or a private network.

    Loopback, private and link-local addresses, ``localhost``, names under a
    suffix that never resolves publicly (``.local``, ``.internal`` ...), and
    single-label names (``http://vllm:8000``, a compose service). Nothing is
    resolved: a public name is never taken for a local one.
    """
    try:
        host = (urlsplit(url).hostname or "").lower().rstrip(".")
    except ValueError:
        return False
    if not host:
        return False
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host == "localhost" or host.endswith(_LOCAL_SUFFIXES) or "." not in host
    return address.is_loopback or address.is_private or address.is_link_local


def probe_urls(provider: str, base_url: str | None) -> tuple[str, ...]:
    """The URLs to ask, in order; none when the provider is not a local server."""
    # Asked: the entries with ``probe_window``. Ollama is not: its OpenAI-compatible model
    # list carries no context size (see docs/llm-providers.md).
    entry = PROVIDERS.get(provider)
    if entry is None or not entry.probe_window or not base_url or not is_local_url(base_url):
        return ()
    base = base_url.split("?", 1)[0].split("#", 1)[0].rstrip("/")
    root = base.removesuffix("/v1")
    return (f"{root}/props", f"{base}/models")


def _size(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if 0 < value <= _MAX_WINDOW else None


def _models_entry(data: Mapping[str, Any], model: str) -> Mapping[str, Any] | None:
    entries = [e for e in data.get("data") or () if isinstance(e, Mapping)]
    for entry in entries:
        if entry.get("id") == model:
            return entry
    # llama.cpp serves one model under its file name, whatever the request calls it.
    return entries[0] if len(entries) == 1 else None


def window_from(url: str, data: object, model: str) -> int | None:
    """The context size in one decoded answer from ``url``, or None."""
    if not isinstance(data, Mapping):
        return None
    if url.endswith("/props"):
        settings = data.get("default_generation_settings")
        return _size(settings.get("n_ctx")) if isinstance(settings, Mapping) else None
    entry = _models_entry(data, model)
    if entry is None:
        return None
    found = _size(entry.get("max_model_len"))  # vLLM
    meta = entry.get("meta")
    if found is None and isinstance(meta, Mapping):  # llama.cpp
        found = _size(meta.get("n_ctx")) or _size(meta.get("n_ctx_train"))
    return found
