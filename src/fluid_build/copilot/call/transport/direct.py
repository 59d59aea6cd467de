"""The direct path of a pool of ours: the JSON request built and sent without httpx's client layers.

:class:`DirectPool` is the part the sync and async pools share: the routing
to the transports it made (:class:`~fluid_build.copilot.call.transport.proxies.Routes`)
and ``fluid_json_request``, which builds the request httpx's
``build_request(..., json=)`` would, in a third of its time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import httpx

from fluid_build.copilot.call.encode import json_body
from fluid_build.copilot.call.seams import OwnPool, OwnRequest
from fluid_build.copilot.call.transport.config import URLS_KEPT
from fluid_build.copilot.call.transport.proxies import Routes, env_mounts
from fluid_build.copilot.call.wire import ACCEPT_ENCODING

if TYPE_CHECKING:
    from fluid_build.copilot.call.seams import FieldRequest


class DirectPool(OwnPool):
    """The call path's requests on a pool of ours, without the client layers it never uses.

    ``httpx.Client.send`` runs an auth flow, a redirect loop, the cookie jar
    (a ``urllib`` request per answer) and event hooks around the transport:
    about 60 us a call, more than all of fluid_build's own work
    (docs/benchmarks.md). A pool made here has no auth, hooks or cookies and
    follows no redirect, and it made its transports itself (the direct one and
    one per proxy of the environment), so its requests go straight to the one
    :class:`Routes` picks and are otherwise the same: the pool's default headers,
    the body httpx 0.28 would encode, the timeouts. Only httpx's public API is
    used. A pool a caller passes in (``http_client=``) keeps httpx's whole
    path, its auth, hooks and cookies with it (never its redirects).
    """

    headers: httpx.Headers
    _fluid_urls: dict[str, _Target]
    _fluid_defaults: dict[str, str]
    _fluid_route: Routes[Any]

    def _mounted(
        self, make: Callable[[httpx.Proxy | None], Any], trust_env: bool, transport: Any
    ) -> dict[str, Any]:
        """What httpx's client takes to route as :class:`Routes` does: the transports
        ``make`` makes (the direct one, one per proxy of the environment), no redirects.
        A ``transport`` given (a mock, say) carries everything, as in httpx."""
        mounts: dict[str, Any]
        if transport is not None:
            default, mounts = transport, {}
        else:
            default, mounts = env_mounts(make, trust_env)
        self._fluid_route = Routes(default, mounts)
        return {
            "transport": default,
            "mounts": mounts,
            "trust_env": trust_env,
            "follow_redirects": False,
        }

    def _direct_init(self) -> None:
        self._fluid_urls = {}
        self._fluid_defaults = {
            **{name.lower(): value for name, value in self.headers.items()},
            "accept-encoding": ACCEPT_ENCODING,
            "content-type": "application/json",
        }

    def fluid_json_request(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        payload: Any,
        timeout: float | Mapping[str, float],
    ) -> httpx.Request:
        """The request ``build_request(..., json=payload)`` would make, in a third of its time.

        The body is encoded by call/encode.py (as httpx 0.28 encodes ``json=``); only
        encodings the size limit can count as they inflate are accepted (call/wire.py).
        """
        target = self._fluid_urls.get(url)
        if target is None:
            if len(self._fluid_urls) >= URLS_KEPT:
                self._fluid_urls.clear()
            target = self._fluid_urls[url] = _Target(httpx.URL(url))
        merged = self._fluid_defaults.copy()
        for name, value in headers.items():
            merged[name.lower()] = value
        body = json_body(payload)  # the one encoder (call/encode.py)
        # The headers httpx would send, in its order (Host first, Content-Length last),
        # made once: ``content=`` would build them twice and encode the body again.
        fields = list(merged.items())
        if "host" not in merged and target.host is not None:
            fields.insert(0, target.host)
        if "content-length" not in merged and "transfer-encoding" not in merged:
            fields.append(("Content-Length", str(len(body))))
        timeouts = (  # a mapping: the phases' own, made for this request (call/phases.py)
            timeout
            if isinstance(timeout, dict)
            else {"connect": timeout, "read": timeout, "write": timeout, "pool": timeout}
            if isinstance(timeout, float | int)
            else dict(timeout)
        )
        return _JsonRequest(method.upper(), target, fields, body, {"timeout": timeouts})


class _Target:
    """A URL a direct pool sends to, parsed once: httpx's URL, its text as httpx encodes
    it (what is sent, and signed), and the ``Host`` field httpx would add."""

    __slots__ = ("host", "text", "url")

    def __init__(self, url: httpx.URL) -> None:
        self.url = url
        self.text = str(url)
        self.host = ("Host", url.netloc.decode("ascii")) if url.host else None


class _JsonRequest(OwnRequest, httpx.Request):
    """The request :meth:`DirectPool.fluid_json_request` makes: an ``httpx.Request`` in every
    way, whose ``headers`` are made from its header fields only when something asks.

    The aiohttp transport sends :attr:`fluid_fields` as they are (no ``Headers`` built,
    no ``multi_items()`` back) to :attr:`fluid_url` (the URL's text, made once a pool).
    Once ``headers`` has been read it may be changed, so from then on the fields are
    forgotten and ``headers`` is what is sent; setting ``url`` forgets the text. Only
    httpx's public attributes are set, and its body methods answer from the body kept.
    """

    fluid_fields: list[tuple[str, str]] | None
    fluid_url: str | None

    def __init__(
        self,
        method: str,
        target: _Target,
        fields: list[tuple[str, str]],
        body: bytes,
        extensions: dict[str, Any],
    ) -> None:
        # Not httpx's __init__: it would build the headers and the body's stream at once.
        # (No ``__dict__`` touched either: CPython then keeps the attributes in the object.)
        self.method = method
        self._fluid_target = target.url
        self.fluid_url = target.text
        self.extensions = extensions
        self.fluid_fields = fields
        self._fluid_headers: httpx.Headers | None = None
        self._fluid_body = body
        self._fluid_stream: httpx.SyncByteStream | httpx.AsyncByteStream | None = None

    @property
    def headers(self) -> httpx.Headers:
        made = self._fluid_headers
        if made is None:
            made = self._fluid_headers = httpx.Headers(self.fluid_fields)
            self.fluid_fields = None
        return made

    @headers.setter
    def headers(self, value: httpx.Headers | Mapping[str, str]) -> None:
        self._fluid_headers = value if isinstance(value, httpx.Headers) else httpx.Headers(value)
        self.fluid_fields = None

    @property
    def url(self) -> httpx.URL:
        return self._fluid_target

    @url.setter
    def url(self, value: httpx.URL) -> None:
        self._fluid_target = value
        self.fluid_url = None

    @property
    def stream(self) -> httpx.SyncByteStream | httpx.AsyncByteStream:
        made = self._fluid_stream
        if made is None:
            made = self._fluid_stream = httpx.ByteStream(self._fluid_body)
        return made

    @stream.setter
    def stream(self, value: httpx.SyncByteStream | httpx.AsyncByteStream) -> None:
        self._fluid_stream = value

    @property
    def content(self) -> bytes:
        return self._fluid_body

    def read(self) -> bytes:
        return self._fluid_body

    async def aread(self) -> bytes:
        return self._fluid_body


if TYPE_CHECKING:
    # Held to its seam (call/seams.py): renaming a member on either side fails mypy here.
    _REQUEST: type[FieldRequest] = _JsonRequest
