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

Deciding is apart from doing: :func:`probe_urls` says what to ask and
:func:`window_from` reads one answer; :func:`learn_window` and
:func:`alearn_window` are the sync and async shells that send.
"""

from __future__ import annotations

import ipaddress
import json
import time
from collections.abc import Generator, Mapping
from typing import Any, Final
from urllib.parse import urlsplit

import httpx

__all__ = [
    "MAX_PROBE_BYTES",
    "PROBED_PROVIDERS",
    "PROBE_TIMEOUT",
    "alearn_window",
    "is_local_url",
    "learn_window",
    "probe_urls",
    "window_from",
]

#: Providers whose server is asked. Ollama is not: its OpenAI-compatible model
#: list carries no context size (see docs/llm-providers.md).
PROBED_PROVIDERS: Final = frozenset({"llamacpp", "vllm", "openai_compatible"})
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
    if provider not in PROBED_PROVIDERS or not base_url or not is_local_url(base_url):
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


def _headers(api_key: str | None, extra: Mapping[str, str]) -> dict[str, str]:
    # identity: a size limit on what arrives is then a limit on what is decoded.
    headers = {**extra, "accept": "application/json", "accept-encoding": "identity"}
    if api_key:
        headers["authorization"] = f"Bearer {api_key}"
    return headers


def _decoded(status: int, encoding: str | None, body: bytes) -> object:
    if status != 200 or encoding not in (None, "identity"):
        return None
    try:
        return json.loads(body)
    except (ValueError, RecursionError):  # not JSON, not UTF-8, or absurdly nested
        return None


def _budget(deadline_left: float | None) -> float:
    return PROBE_TIMEOUT if deadline_left is None else min(PROBE_TIMEOUT, deadline_left / 4)


# A wrong or missing key: the next URL would say the same.
_STOP: Final = frozenset({401, 403})

# What a shell sends back for one URL: status, content-encoding and the body,
# or None when there was no answer (or one too big or too slow to read).
Answer = tuple[int, str | None, bytes] | None


def _asking(urls: tuple[str, ...], model: str) -> Generator[str, Answer, int | None]:
    """Yields each URL to GET, is sent its answer, returns the size found (or None)."""
    for url in urls:
        answer = yield url
        if answer is None:
            continue
        status, encoding, body = answer
        if status in _STOP:
            return None
        found = window_from(url, _decoded(status, encoding, body), model)
        if found is not None:
            return found
    return None


def _get(client: httpx.Client, url: str, headers: dict[str, str], ends: float) -> Answer:
    try:
        timeout = ends - time.monotonic()
        with client.stream("GET", url, headers=headers, timeout=timeout) as response:
            status, encoding = response.status_code, response.headers.get("content-encoding")
            if status != 200 or encoding not in (None, "identity"):
                return status, encoding, b""  # only the status counts: the body is not read
            body = bytearray()
            for chunk in response.iter_bytes():
                body += chunk
                if len(body) > MAX_PROBE_BYTES or time.monotonic() > ends:
                    return None  # too big, or dripped: the read timeout is per chunk
            return status, encoding, bytes(body)
    except Exception:  # noqa: BLE001 - a probe that fails in any way only means "unknown"
        return None


async def _aget(
    client: httpx.AsyncClient, url: str, headers: dict[str, str], ends: float
) -> Answer:
    try:
        timeout = ends - time.monotonic()
        async with client.stream("GET", url, headers=headers, timeout=timeout) as response:
            status, encoding = response.status_code, response.headers.get("content-encoding")
            if status != 200 or encoding not in (None, "identity"):
                return status, encoding, b""  # only the status counts: the body is not read
            body = bytearray()
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > MAX_PROBE_BYTES or time.monotonic() > ends:
                    return None
            return status, encoding, bytes(body)
    except Exception:  # noqa: BLE001 - a probe that fails in any way only means "unknown"
        return None


def learn_window(
    client: httpx.Client,
    urls: tuple[str, ...],
    model: str,
    *,
    api_key: str | None = None,
    headers: Mapping[str, str] | None = None,
    deadline_left: float | None = None,
) -> int | None:
    """Ask ``urls`` in turn; the first context size found, or None. Never raises for I/O."""
    ends = time.monotonic() + _budget(deadline_left)
    sent = _headers(api_key, headers or {})
    plan = _asking(urls, model)
    try:
        url = next(plan)
        while ends - time.monotonic() > 0.01:
            url = plan.send(_get(client, url, sent, ends))
    except StopIteration as done:
        found: int | None = done.value
        return found
    return None


async def alearn_window(
    client: httpx.AsyncClient,
    urls: tuple[str, ...],
    model: str,
    *,
    api_key: str | None = None,
    headers: Mapping[str, str] | None = None,
    deadline_left: float | None = None,
) -> int | None:
    """The async twin of :func:`learn_window`."""
    ends = time.monotonic() + _budget(deadline_left)
    sent = _headers(api_key, headers or {})
    plan = _asking(urls, model)
    try:
        url = next(plan)
        while ends - time.monotonic() > 0.01:
            url = plan.send(await _aget(client, url, sent, ends))
    except StopIteration as done:
        found: int | None = done.value
        return found
    return None
