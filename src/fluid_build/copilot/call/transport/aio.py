"""aiohttp's pool under httpx's types: :class:`AiohttpTransport`, the default async transport.

Several times httpx 0.28's calls per second at 1,000 in flight (see
docs/benchmarks.md "Async at 1,000 concurrent calls"), with the admission
gate before it and aiohttp's faults named as httpx names them.
"""

from __future__ import annotations

import inspect
import ssl
from collections.abc import AsyncIterator, Callable, Mapping
from typing import TYPE_CHECKING, Any, Final

import httpx

from fluid_build.copilot.call.seams import OwnBody, is_own_request
from fluid_build.copilot.call.transport.config import (
    HEAD_LIMIT,
    KEEPALIVE_EXPIRY,
    MAX_CONNECTIONS,
    URLS_KEPT,
)
from fluid_build.copilot.call.transport.faults import (
    AiohttpFaults,
    client_closed,
    map_aiohttp_exceptions,
)
from fluid_build.copilot.call.transport.gate import AdmissionGate, wait_in_line

if TYPE_CHECKING:
    from fluid_build.copilot.call.seams import DirectBody


#: Header fields in one head: aiohttp's own default is 128; h11 counts only bytes.
_MAX_HEADERS: Final = 1024


def _aiohttp_session(
    verify: ssl.SSLContext | str | bool, cert: Any, trust_env: bool, limits: httpx.Limits
) -> Callable[[], Any]:
    """What makes the aiohttp session of a pool, on first use inside the pool's loop: no
    cookie jar, heads as large as httpx reads, the certificates of the environment."""
    import aiohttp

    context = httpx.create_ssl_context(verify=verify, cert=cert, trust_env=trust_env)
    sizes: dict[str, Any] = {"max_line_size": HEAD_LIMIT, "max_field_size": HEAD_LIMIT}
    if "max_headers" in inspect.signature(aiohttp.ClientSession).parameters:
        sizes["max_headers"] = _MAX_HEADERS

    def session() -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(
            limit=limits.max_connections or 0,
            keepalive_timeout=limits.keepalive_expiry or KEEPALIVE_EXPIRY,
            ssl=context,
        )
        return aiohttp.ClientSession(
            connector=connector, cookie_jar=aiohttp.DummyCookieJar(), trust_env=False, **sizes
        )

    return session


class _AiohttpStream(OwnBody, httpx.AsyncByteStream):
    """An aiohttp response's body as it arrives, its faults as httpx names them; closing
    it gives the connection back to aiohttp's pool and the slot to the gate (once).

    A :class:`~fluid_build.copilot.call.seams.DirectBody`: call/wire.py reads it straight
    (no httpx iterator between), its faults already named."""

    __slots__ = ("_faults", "_gate", "_response")

    def __init__(self, response: Any, faults: AiohttpFaults, gate: AdmissionGate) -> None:
        self._response: Any = response
        self._faults = faults  # the request's boundary, made when it was sent
        self._gate: AdmissionGate | None = gate

    async def __aiter__(self) -> AsyncIterator[bytes]:
        with self._faults:
            async for chunk in self._response.content.iter_any():
                yield chunk

    async def fluid_read(self, take: Callable[[bytes], bytes], done: Callable[[], bool]) -> bytes:
        """The raw body, each chunk through ``take`` (call/wire.py's bound, which raises past
        the limit or the deadline) until the end or ``done()``: no iterator between, its
        faults named as :meth:`__aiter__` names them."""
        content = self._response.content
        parts: list[bytes] = []
        with self._faults:
            while chunk := await content.readany():
                parts.append(take(chunk))
                if done():
                    break
        return b"".join(parts)

    async def aclose(self) -> None:
        gate, self._gate = self._gate, None
        if gate is None:
            return
        try:  # read to the end: the connection is kept alive; else it is closed
            with self._faults:
                await self._response.__aexit__(None, None, None)
        finally:
            gate.release()


class AiohttpTransport(httpx.AsyncBaseTransport):
    """aiohttp's pool under httpx's types, with the admission gate before it.

    What httpx-aiohttp's transport does, without its per-call costs (a URL
    parsed twice, a timeout object and a header conversion each call, a
    generator per layer): the URL is handed over as httpx encoded it (so the
    path sent is the path signed, for SigV4), the request's timeouts are the
    socket waits, and aiohttp's faults are named as on every other transport.
    """

    def __init__(
        self,
        verify: ssl.SSLContext | str | bool,
        cert: Any,
        trust_env: bool,
        limits: httpx.Limits,
        proxy: httpx.Proxy | None,
    ) -> None:
        import aiohttp
        import yarl

        self._make = _aiohttp_session(verify, cert, trust_env, limits)
        self._session: aiohttp.ClientSession | None = None
        self._closed = False  # once closed, no new session: a late request is refused
        self._yarl = yarl.URL
        self._timeout = aiohttp.ClientTimeout
        self._timeouts: dict[tuple[float | None, ...], aiohttp.ClientTimeout] = {}
        self._urls: dict[str, yarl.URL] = {}
        self.gate = AdmissionGate(limits.max_connections or MAX_CONNECTIONS)
        self._proxy: dict[str, Any] = {}
        if proxy is not None:
            self._proxy = {
                "proxy": str(proxy.url),
                "proxy_auth": aiohttp.BasicAuth(*proxy.auth) if proxy.auth else None,
                "proxy_headers": dict(proxy.headers) if proxy.headers else None,
            }

    def _url(self, request: httpx.Request) -> Any:
        text = (request.fluid_url if is_own_request(request) else None) or str(request.url)
        found = self._urls.get(text)
        if found is None:
            if len(self._urls) >= URLS_KEPT:
                self._urls.clear()
            found = self._urls[text] = self._yarl(text, encoded=True)
        return found

    def _timeouts_of(self, timeouts: Mapping[str, float | None]) -> Any:
        key = (timeouts.get("connect"), timeouts.get("read"), timeouts.get("pool"))
        found = self._timeouts.get(key)
        if found is None:
            if len(self._timeouts) >= URLS_KEPT:
                self._timeouts.clear()
            found = self._timeouts[key] = self._timeout(
                sock_connect=key[0], sock_read=key[1], connect=key[2]
            )
        return found

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """The answer's head, its body left to stream; every answer and every fault of
        its own names ``request`` (so :meth:`PooledAsyncClient.fluid_send` need not)."""
        gate = self.gate
        if not gate.try_acquire():  # a free slot: no clock read on the fast path
            try:
                await wait_in_line(gate, request)
            except httpx.RequestError as exc:
                exc.request = request
                raise
        timeouts: dict[str, float | None] = request.extensions.get("timeout", {})
        faults = map_aiohttp_exceptions(request)
        try:
            with faults:
                session = self._session
                if session is None:
                    if self._closed:  # a call that waited for a slot while the client closed
                        raise client_closed()
                    session = self._session = self._make()
                try:
                    content: Any = request.content or None
                except httpx.RequestNotRead:  # a streamed body: aiohttp frames it
                    content = request.stream
                    request.headers.pop("transfer-encoding", None)
                fields = request.fluid_fields if is_own_request(request) else None  # unread
                response = await session.request(
                    request.method,
                    self._url(request),
                    headers=request.headers.multi_items() if fields is None else fields,
                    data=content,
                    allow_redirects=False,
                    auto_decompress=False,
                    compress=False,
                    timeout=self._timeouts_of(timeouts),
                    server_hostname=request.extensions.get("sni_hostname"),
                    **self._proxy,
                )
        except BaseException:
            gate.release()
            raise
        extensions = {"http_version": b"HTTP/1.1"}
        if response.reason:
            extensions["reason_phrase"] = response.reason.encode()
        return httpx.Response(
            status_code=response.status,
            headers=response.raw_headers,
            stream=_AiohttpStream(response, faults, gate),
            request=request,
            extensions=extensions,
        )

    async def aclose(self) -> None:
        self._closed = True
        session, self._session = self._session, None
        if session is not None:
            await session.close()


if TYPE_CHECKING:
    # Held to its seam (call/seams.py): renaming a member on either side fails mypy here.
    _BODY: type[DirectBody] = _AiohttpStream
