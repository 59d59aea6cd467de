"""Gemini on Vertex AI: Gemini's wire format on a project's endpoint, with a Google access token.

The body and the answers are the Gemini adapter's; only where a request goes
(``{endpoint}/v1/projects/{project}/locations/{location}/publishers/google``)
and how it is authorized (``Authorization: Bearer``) differ. The token is an
explicit one (``api_key=``) or comes from Application Default Credentials
through google-auth (the optional extra ``fluid-build[vertex]``), refreshed
before it expires. google-auth loads only when this provider is used.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final

import httpx

from fluid_build._redact import install_log_redaction
from fluid_build.copilot.agents.errors import ProviderAuthError, ProviderError
from fluid_build.copilot.llm.base import ProviderConfig, Request
from fluid_build.copilot.llm.credentials import UNBOUNDED_WAIT, Lookup, Pending, wait
from fluid_build.copilot.llm.gemini import GeminiAdapter
from fluid_build.copilot.llm.types import CallSpec

__all__ = [
    "SCOPES",
    "VERTEX_INSTALL",
    "TokenSource",
    "VertexAdapter",
    "resolve_base_url",
    "vertex_endpoint",
]

VERTEX_INSTALL: Final = "pip install 'fluid-build[vertex]'"
SCOPES: Final = ("https://www.googleapis.com/auth/cloud-platform",)
DEFAULT_LOCATION: Final = "us-central1"
#: A token this close to its expiry is refreshed first: a request signed with it could
#: arrive after it expired.
REFRESH_MARGIN: Final = timedelta(minutes=5)
#: A token endpoint or metadata server gets this long, and may answer this much.
TOKEN_TIMEOUT: Final = 30.0
TOKEN_BODY_LIMIT: Final = 1 << 20
_LOGIN: Final = (
    "run `gcloud auth application-default login`, or set GOOGLE_APPLICATION_CREDENTIALS to a "
    "service-account key file, or pass an access token with api_key="
)


def _not_configured(
    message: str, variable: str | None = None, example: str | None = None
) -> ProviderError:
    details = {"variable": variable, "example": example} if variable else None
    return ProviderError(
        message, provider="vertex", code="llm.not_configured", retryable=False, details=details
    )


def _google_auth() -> Any:
    """google-auth, or the typed error naming the extra that brings it."""
    try:
        import google.auth
        import google.auth.exceptions
        import google.auth.transport
    except ImportError as exc:
        raise _not_configured(
            "provider vertex needs google-auth for Application Default Credentials: "
            f"run {VERTEX_INSTALL} (or pass an access token with api_key=)"
        ) from exc
    install_log_redaction()  # google-auth's loggers carry token exchanges
    return google.auth


def vertex_endpoint(location: str) -> str:
    """Google's endpoint for a location; ``global`` has no regional prefix."""
    if location == "global":
        return "https://aiplatform.googleapis.com"
    return f"https://{location}-aiplatform.googleapis.com"


def _name_ok(value: str) -> bool:
    return bool(value) and all(ch.isalnum() or ch in "-_." for ch in value)


def load_adc() -> tuple[Any, str | None]:
    """Application Default Credentials and their project (google-auth's search order)."""
    auth = _google_auth()
    if not adc_may_exist(os.environ):  # google-auth reads the process's own environment
        raise ProviderAuthError(
            f"vertex found no Google credentials: {_LOGIN}",
            provider="vertex",
            details={"variable": "GOOGLE_APPLICATION_CREDENTIALS", "example": "/path/key.json"},
        )
    try:
        credentials, project = auth.default(scopes=list(SCOPES))
    except auth.exceptions.DefaultCredentialsError as exc:
        raise ProviderAuthError(
            f"vertex found no Google credentials: {_LOGIN}",
            provider="vertex",
            details={"variable": "GOOGLE_APPLICATION_CREDENTIALS", "example": "/path/key.json"},
        ) from exc
    return credentials, project


#: Variables that say this process runs where Google's metadata server answers.
_ON_GOOGLE_CLOUD: Final = (
    "GCE_METADATA_HOST",
    "GCE_METADATA_IP",
    "K_SERVICE",
    "CLOUD_RUN_JOB",
    "FUNCTION_TARGET",
)


def adc_may_exist(env: Mapping[str, str]) -> bool:
    """Whether Application Default Credentials can be found without asking the network.

    google-auth's last resort is the metadata server (a ping to 169.254.169.254, seconds
    of waiting off Google Cloud): it is asked only where one can answer.
    """
    if env.get("GOOGLE_APPLICATION_CREDENTIALS") or any(env.get(v) for v in _ON_GOOGLE_CLOUD):
        return True
    config = env.get("CLOUDSDK_CONFIG") or os.path.join(
        env.get("HOME") or os.path.expanduser("~"), ".config", "gcloud"
    )
    if Path(config, "application_default_credentials.json").is_file():
        return True
    return _on_google_hardware()


def _on_google_hardware() -> bool:
    """A Compute Engine VM says so in its firmware (what google-auth checks too)."""
    try:
        product = Path("/sys/class/dmi/id/product_name").read_text("ascii", "replace")
    except OSError:
        return False
    return product.strip().startswith("Google")


def resolve_base_url(
    endpoint: str | None,
    api_key: str | None,
    env: Mapping[str, str],
    *,
    adc: Callable[[], tuple[Any, str | None]] = load_adc,
) -> str:
    """The URL models hang under: the endpoint (``base_url=`` or the location's), project,
    location. The project is GOOGLE_CLOUD_PROJECT, else the credentials' own project."""
    location = (env.get("GOOGLE_CLOUD_LOCATION") or "").strip() or DEFAULT_LOCATION
    if not _name_ok(location):
        raise _not_configured(
            f"GOOGLE_CLOUD_LOCATION={location[:40]!r} is not a location name: set it like "
            "GOOGLE_CLOUD_LOCATION=us-central1 (or global)",
            "GOOGLE_CLOUD_LOCATION",
            DEFAULT_LOCATION,
        )
    project = (env.get("GOOGLE_CLOUD_PROJECT") or "").strip() or None
    if project is None and api_key is None:
        project = adc()[1]
    if not project:
        raise _not_configured(
            "vertex needs a Google Cloud project: set GOOGLE_CLOUD_PROJECT, e.g. "
            "GOOGLE_CLOUD_PROJECT=my-project",
            "GOOGLE_CLOUD_PROJECT",
            "my-project",
        )
    if not _name_ok(project):
        raise _not_configured(
            f"GOOGLE_CLOUD_PROJECT={project[:40]!r} is not a project id: set it like "
            "GOOGLE_CLOUD_PROJECT=my-project",
            "GOOGLE_CLOUD_PROJECT",
            "my-project",
        )
    base = (endpoint or vertex_endpoint(location)).rstrip("/")
    return f"{base}/v1/projects/{project}/locations/{location}/publishers/google"


@functools.cache
def _transport() -> type:
    """google-auth's ``transport.Request`` over httpx: bounded in time and size, no redirect.

    Built on first use, so that this module imports without google-auth.
    """
    auth = _google_auth()

    class _Response(auth.transport.Response):  # type: ignore[misc,name-defined]
        def __init__(self, response: httpx.Response, data: bytes) -> None:
            self._status = response.status_code
            self._headers = dict(response.headers)
            self._data = data

        @property
        def status(self) -> int:
            return self._status

        @property
        def headers(self) -> dict[str, str]:
            return self._headers

        @property
        def data(self) -> bytes:
            return self._data

    class HttpxRequest(auth.transport.Request):  # type: ignore[misc,name-defined]
        def __call__(
            self,
            url: str,
            method: str = "GET",
            body: bytes | None = None,
            headers: Mapping[str, str] | None = None,
            timeout: float | None = None,
            **kwargs: Any,
        ) -> _Response:
            seconds = min(timeout or TOKEN_TIMEOUT, TOKEN_TIMEOUT)
            try:
                with (
                    httpx.Client(timeout=seconds, follow_redirects=False) as client,
                    client.stream(
                        method, url, content=body, headers=dict(headers or {})
                    ) as response,
                ):
                    data = bytearray()
                    for chunk in response.iter_bytes():
                        data += chunk
                        if len(data) > TOKEN_BODY_LIMIT:
                            raise auth.exceptions.TransportError(
                                f"the token endpoint's answer is over {TOKEN_BODY_LIMIT} bytes"
                            )
                    return _Response(response, bytes(data))
            except httpx.HTTPError as exc:
                raise auth.exceptions.TransportError(
                    f"{type(exc).__name__} reaching {httpx.URL(url).host}"
                ) from None

    return HttpxRequest


def _utcnow() -> datetime:
    # google-auth keeps expiry as a naive UTC datetime.
    return datetime.now(UTC).replace(tzinfo=None)


class TokenSource:
    """One client's Google access token: fetched once, reused while valid, refreshed before
    it expires (``REFRESH_MARGIN``).

    Loading the credentials (the ADC file, or the metadata server) and each refresh run as
    a lookup (:mod:`fluid_build.copilot.llm.credentials`): in a thread of their own, one at
    a time however many calls wait, each call waiting no longer than its deadline.
    """

    def __init__(
        self,
        credentials: Any | None = None,
        *,
        clock: Callable[[], datetime] = _utcnow,
        load: Callable[[], tuple[Any, str | None]] = load_adc,
    ) -> None:
        self._credentials = credentials
        self._clock = clock
        self._load = load
        self._lookup = Lookup("google-token")
        self.refreshes = 0

    def _stale(self, credentials: Any) -> bool:
        if not credentials.token:
            return True
        expiry = credentials.expiry
        return expiry is not None and expiry - REFRESH_MARGIN <= self._clock()

    def stale(self) -> bool:
        """Whether :meth:`token` would block on the network (a first fetch or a refresh)."""
        credentials = self._credentials
        return credentials is None or self._stale(credentials)

    def pending(self) -> Pending | None:
        """The lookup the next request needs first, or None while the token is valid."""
        return Pending("vertex's Google access token", self._start) if self.stale() else None

    def _start(self) -> Any:
        return self._lookup.start(self._fetch)

    def _fetch(self) -> str:
        # In the lookup's thread, one at a time: no lock needed around the credentials.
        if self._credentials is None:
            self._credentials = self._load()[0]
        credentials = self._credentials
        if self._stale(credentials):
            self._refresh(credentials)
        return str(credentials.token)

    def token(self) -> str:
        credentials = self._credentials
        if credentials is not None and not self._stale(credentials):
            # A valid token needs no lookup: an event loop must never wait on a refresh.
            return str(credentials.token)
        # Outside a call's step (``adapter.request()`` alone): the lookup, waited for here.
        done, token = wait(self._start(), UNBOUNDED_WAIT)
        if not done:
            raise ProviderError(
                f"vertex's Google access token was not fetched within {UNBOUNDED_WAIT:g} s; "
                "check the network or proxy, then retry",
                provider="vertex",
                code="llm.network_error",
                retryable=True,
            )
        return str(token)

    def _refresh(self, credentials: Any) -> None:
        auth = _google_auth()
        try:
            credentials.refresh(_transport()())
        except auth.exceptions.RefreshError as exc:
            raise ProviderAuthError(
                f"vertex could not refresh its Google access token ({_reason(exc)}): {_LOGIN}",
                provider="vertex",
            ) from None
        except auth.exceptions.TransportError as exc:
            raise ProviderError(
                f"vertex could not reach Google's token service ({_reason(exc)}); check the "
                "network or proxy, then retry",
                provider="vertex",
                code="llm.network_error",
                retryable=True,
            ) from None
        self.refreshes += 1


def _reason(exc: BaseException) -> str:
    """The first line of google-auth's reason, short; it never holds the token itself."""
    text = str(exc.args[0]) if exc.args else type(exc).__name__
    return text.splitlines()[0][:200] if text else type(exc).__name__


class VertexAdapter(GeminiAdapter):
    """``base_url`` is the project's models prefix (see :func:`resolve_base_url`)."""

    provider = "vertex"

    def __init__(self, config: ProviderConfig, tokens: TokenSource | None = None) -> None:
        super().__init__(config)
        self.tokens = tokens
        if tokens is None and not config.api_key:
            _google_auth()  # a missing extra says so when the client is made, not at the call
            self.tokens = TokenSource()

    def pending_refresh(self) -> Pending | None:
        """The token lookup the next request needs first, or None while the token is valid.

        The call runs it before :meth:`request`, off the event loop and within its
        deadline: a refresh is an HTTP exchange with Google's token endpoint.
        """
        tokens = self.tokens
        return tokens.pending() if tokens is not None else None

    def request(self, spec: CallSpec, *, stream: bool) -> Request:
        if not self.config.base_url:  # never Gemini's home: the token is for Vertex
            raise _not_configured(
                "vertex needs its project URL: make the client with provider='vertex'"
            )
        request = super().request(spec, stream=stream)
        request.headers.pop("x-goog-api-key", None)
        token = self.config.api_key if self.tokens is None else self.tokens.token()
        request.headers["authorization"] = f"Bearer {token}"
        return request
