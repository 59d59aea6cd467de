"""Gemini on Vertex AI: Gemini's wire format on a project's endpoint, with a Google access token.

The body and the answers are the Gemini adapter's; only where a request goes
(``{endpoint}/v1/projects/{project}/locations/{location}/publishers/google``)
and how it is authorized (``Authorization: Bearer``) differ. The token is an
explicit one (``api_key=``) or comes from Application Default Credentials
through google-auth (the optional extra ``fluid-build[vertex]``), refreshed
before it expires. google-auth loads only when this provider is used.
"""

from __future__ import annotations

import configparser
import contextlib
import dataclasses
import functools
import os
import socket
import threading
import time
import warnings
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar, Final

import httpx

from fluid_build._files import UnsafeFileError, load_json, read_regular
from fluid_build._redact import install_log_redaction
from fluid_build._threads import signals_stay_with_main
from fluid_build.copilot.agents.errors import ProviderAuthError, ProviderError, python_aside
from fluid_build.copilot.llm.base import ProviderConfig, Request
from fluid_build.copilot.llm.credentials import UNBOUNDED_WAIT, Lookup, Pending, wait
from fluid_build.copilot.llm.gemini import SHARED_FINISH_REASONS, GeminiAdapter
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
    "service-account key file, or set FLUID_LLM_API_KEY to an access token "
    + python_aside("api_key")
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
            f"run {VERTEX_INSTALL} (or set FLUID_LLM_API_KEY to an access token "
            f"{python_aside('api_key')})"
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


#: The most of an Application Default Credentials file read (a service-account key is
#: about 2.3 KB), and its deepest nesting (google-auth's files nest 3 levels).
ADC_LIMIT: Final = 64 * 1024
ADC_DEPTH: Final = 16
_GCLOUD_FILE: Final = "application_default_credentials.json"


def _no_credentials() -> ProviderAuthError:
    return ProviderAuthError(
        f"vertex found no Google credentials: {_LOGIN}",
        provider="vertex",
        details={"variable": "GOOGLE_APPLICATION_CREDENTIALS", "example": "/path/key.json"},
    )


def _gcloud_config(env: Mapping[str, str]) -> str:
    return env.get("CLOUDSDK_CONFIG") or os.path.join(
        env.get("HOME") or os.path.expanduser("~"), ".config", "gcloud"
    )


def adc_file(env: Mapping[str, str]) -> tuple[str, str] | None:
    """The credentials file google-auth would read, and what named it: the one in
    GOOGLE_APPLICATION_CREDENTIALS, else gcloud's ``application_default_credentials.json``
    if anything is there. None: only the metadata server is left."""
    explicit = env.get("GOOGLE_APPLICATION_CREDENTIALS")
    if explicit:
        return explicit, "GOOGLE_APPLICATION_CREDENTIALS"
    path = os.path.join(_gcloud_config(env), _GCLOUD_FILE)
    return (path, "gcloud's application default login") if os.path.lexists(path) else None


def _adc_unusable(path: str, source: str, problem: str) -> ProviderError:
    return ProviderError(
        f"vertex cannot use the Google credentials file {path} (from {source}): it {problem}; "
        "set GOOGLE_APPLICATION_CREDENTIALS to a service-account key file (a JSON file), or "
        "run `gcloud auth application-default login`",
        provider="vertex",
        code="llm.not_configured",
        retryable=False,
        details={
            "variable": "GOOGLE_APPLICATION_CREDENTIALS",
            "example": "/path/key.json",
            "file": path,
        },
    )


def read_adc(path: str, source: str) -> dict[str, Any]:
    """The credentials file as JSON, read as fluid reads any user file: a regular file only
    (a FIFO, a directory, ``/dev/zero`` are refused unread), at most :data:`ADC_LIMIT`
    bytes, nested at most :data:`ADC_DEPTH` levels. Anything else is ``llm.not_configured``
    naming the file and GOOGLE_APPLICATION_CREDENTIALS."""
    try:
        data = read_regular(path, limit=ADC_LIMIT, name=path)
        info = load_json(data.decode("utf-8"), name=path, max_depth=ADC_DEPTH)
    except UnsafeFileError as exc:
        raise _adc_unusable(path, source, exc.reason) from None
    except FileNotFoundError:
        raise _adc_unusable(path, source, "does not exist") from None
    except OSError as exc:
        raise _adc_unusable(path, source, f"cannot be read ({exc.strerror or exc})") from None
    except ValueError:  # not UTF-8, not JSON
        raise _adc_unusable(path, source, "is not JSON") from None
    if not isinstance(info, dict):
        raise _adc_unusable(path, source, "is not a JSON object")
    return info


def _file_project(info: Mapping[str, Any]) -> str | None:
    for name in ("project_id", "quota_project_id"):
        value = info.get(name)
        if isinstance(value, str) and value.strip():
            return value.strip()
    return None


def load_adc() -> tuple[Any, str | None]:
    """Application Default Credentials and their project (google-auth's search order).

    A credentials file is read here, bounded (:func:`read_adc`), and handed to
    google-auth as a dict; only without one is google-auth's own search asked, which
    ends at the metadata server (on Google Cloud only: :func:`adc_may_exist`). Run as a
    call's credential lookup: it may wait on the network.
    """
    auth = _google_auth()
    found = adc_file(os.environ)  # google-auth reads the process's own environment
    if found is not None:
        path, source = found
        info = read_adc(path, source)
        try:
            # The dict form of google-auth's load_credentials_from_file, which default()
            # calls with this same warning silenced: the file is the operator's own
            # configuration, chosen as google-auth would choose it.
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                credentials, project = auth.load_credentials_from_dict(info, scopes=list(SCOPES))
        except auth.exceptions.DefaultCredentialsError as exc:
            problem = f"is not a credentials file google-auth can use ({_reason(exc)})"
            raise _adc_unusable(path, source, problem) from None
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            # A file of the right type with a field missing or malformed (a private key
            # that does not parse): google-auth's parsers say so with these.
            problem = f"is not a credentials file google-auth can use ({type(exc).__name__})"
            raise _adc_unusable(path, source, problem) from None
        return credentials, project or _file_project(info)
    if not adc_may_exist(os.environ):
        raise _no_credentials()
    try:
        credentials, project = auth.default(scopes=list(SCOPES))
    except auth.exceptions.DefaultCredentialsError as exc:
        raise _no_credentials() from exc
    return credentials, project


def _gcloud_project(env: Mapping[str, str]) -> str | None:
    """gcloud's own project (``gcloud config set project``): CLOUDSDK_CORE_PROJECT, else the
    active configuration's ``[core] project``, read from its file; None when unreadable."""
    project = (env.get("CLOUDSDK_CORE_PROJECT") or "").strip()
    if project:
        return project
    config = _gcloud_config(env)
    try:
        name = (env.get("CLOUDSDK_ACTIVE_CONFIG_NAME") or "").strip()
        if not name and os.path.lexists(os.path.join(config, "active_config")):
            name = read_regular(os.path.join(config, "active_config"), limit=1024).decode()
        name = name.strip() or "default"
        if not _name_ok(name):  # a configuration's name, never a path
            return None
        text = read_regular(
            os.path.join(config, "configurations", f"config_{name}"), limit=ADC_LIMIT
        ).decode("utf-8")
        parser = configparser.ConfigParser(interpolation=None)
        parser.read_string(text)
        value = parser.get("core", "project", fallback="")
    except (OSError, UnsafeFileError, ValueError, configparser.Error):
        return None
    return value.strip() or None


def adc_project(env: Mapping[str, str]) -> str | None:
    """The project the credentials name, found without the network: the credentials
    file's ``project_id`` (or ``quota_project_id``), else gcloud's configured project.

    The metadata server is never asked here (this runs when a client is made): on
    Google Cloud without a file, set GOOGLE_CLOUD_PROJECT. With no credentials
    anywhere, the auth error that says how to get some.
    """
    found = adc_file(env)
    project = _file_project(read_adc(*found)) if found is not None else None
    if project is None:
        project = _gcloud_project(env)
    if project is None and not adc_may_exist(env):
        raise _no_credentials()
    return project


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
    if os.path.lexists(os.path.join(_gcloud_config(env), _GCLOUD_FILE)):
        return True  # whatever it is: reading it says what is wrong with it
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
    adc: Callable[[], tuple[Any, str | None]] | None = None,
) -> str:
    """The URL models hang under: the endpoint (``base_url=`` or the location's), project,
    location. The project is GOOGLE_CLOUD_PROJECT, else the one the credentials file or
    gcloud's configuration names (:func:`adc_project`; ``adc`` replaces it): never the
    network, since this runs when a client is made."""
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
        # The files google-auth reads are the process's own, whatever ``env`` says.
        project = adc()[1] if adc is not None else adc_project(os.environ)
    if not project:
        raise _not_configured(
            "vertex needs a Google Cloud project: set GOOGLE_CLOUD_PROJECT, e.g. "
            "GOOGLE_CLOUD_PROJECT=my-project (fluid never asks the metadata server for it "
            "while a client is made)",
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
            # The exchange gets ``seconds`` as a whole, not each read: httpx's timeouts are
            # per read, so a server that drips its head or its body a byte at a time would
            # hold the lookup's thread for ever. When they are up, the connection's socket
            # is shut down (a blocked read then ends) and the body loop stops.
            cut = _Cutoff(seconds)
            try:
                with (
                    httpx.Client(timeout=seconds, follow_redirects=False) as client,
                    client.stream(
                        method,
                        url,
                        content=body,
                        headers=dict(headers or {}),
                        extensions={"trace": cut.trace},
                    ) as response,
                ):
                    data = bytearray()
                    for chunk in response.iter_bytes():
                        data += chunk
                        if len(data) > TOKEN_BODY_LIMIT:
                            raise auth.exceptions.TransportError(
                                f"the token endpoint's answer is over {TOKEN_BODY_LIMIT} bytes"
                            )
                        if cut.passed():
                            break
                    if not cut.passed():
                        return _Response(response, bytes(data))
            except httpx.HTTPError as exc:
                if not cut.passed():
                    raise auth.exceptions.TransportError(
                        f"{type(exc).__name__} reaching {httpx.URL(url).host}"
                    ) from None
            finally:
                cut.cancel()
            raise auth.exceptions.TransportError(
                f"the token endpoint at {httpx.URL(url).host} took over {seconds:g} s to answer"
            )

    return HttpxRequest


class _Cutoff:
    """A whole exchange's time limit: past it, the sockets it opened are shut down.

    The sockets come from httpx's public ``trace`` request extension (httpcore reports
    each connection it makes, and ``get_extra_info("socket")`` gives its socket).
    """

    def __init__(self, seconds: float) -> None:
        self.ends = time.monotonic() + seconds
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._fired = False
        self._timer = threading.Timer(seconds, self._fire)
        self._timer.daemon = True
        with signals_stay_with_main():
            self._timer.start()

    def trace(self, event: str, info: Mapping[str, Any]) -> None:
        if not event.endswith("connect_tcp.complete"):
            return
        stream = info.get("return_value")
        sock = stream.get_extra_info("socket") if stream is not None else None
        if isinstance(sock, socket.socket):
            with self._lock:
                self._sockets.append(sock)
                fired = self._fired
            if fired:
                _shut(sock)

    def _fire(self) -> None:
        with self._lock:
            self._fired = True
            sockets = list(self._sockets)
        for sock in sockets:
            _shut(sock)

    def passed(self) -> bool:
        return self._fired or time.monotonic() >= self.ends

    def cancel(self) -> None:
        self._timer.cancel()


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


def _utcnow() -> datetime:
    # google-auth keeps expiry as a naive UTC datetime.
    return datetime.now(UTC).replace(tzinfo=None)


class TokenSource:
    """One client's Google access token: fetched once, reused while valid, refreshed before
    it expires (``REFRESH_MARGIN``); a credential step (llm/credentials.py ``RequestAuth``)
    whose :meth:`auth` adds it to a built request as ``Authorization: Bearer``.

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

    def auth(self, request: httpx.Request) -> httpx.Request:
        """``request`` with the token, added last: after the body was encoded."""
        request.headers["authorization"] = f"Bearer {self.token()}"
        return request

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
        except auth.exceptions.GoogleAuthError as exc:
            raise ProviderAuthError(
                f"vertex could not get a Google access token ({_reason(exc)}): {_LOGIN}",
                provider="vertex",
            ) from None
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            # An answer that is no token (a 200 with an HTML page from a captive portal or
            # a proxy, JSON without access_token): google-auth's parsers fail with these.
            raise ProviderAuthError(
                "vertex's Google token service answered with something that is not an "
                f"access token ({type(exc).__name__}); check that nothing between fluid and "
                f"Google rewrites the answer (a proxy's login page), then retry: {_LOGIN}",
                provider="vertex",
            ) from None
        self.refreshes += 1


def _reason(exc: BaseException) -> str:
    """The first line of google-auth's reason, short; it never holds the token itself."""
    text = str(exc.args[0]) if exc.args else type(exc).__name__
    return text.splitlines()[0][:200] if text else type(exc).__name__


#: Vertex AI's own numbers for Candidate.FinishReason, PromptFeedback.BlockedReason and
#: HarmCategory (google/cloud/aiplatform/v1/content.proto, prediction_service.proto):
#: finish reasons from 6 on differ from the Gemini API's (6 is BLOCKLIST here, LANGUAGE
#: there), and so do harm categories (1 is HATE_SPEECH here, DEROGATORY there).
VERTEX_FINISH_REASONS: Final = {
    **SHARED_FINISH_REASONS,
    6: "BLOCKLIST",
    7: "PROHIBITED_CONTENT",
    8: "SPII",
    9: "MALFORMED_FUNCTION_CALL",
    10: "MODEL_ARMOR",
}
VERTEX_HARM_CATEGORIES: Final = {
    0: "HARM_CATEGORY_UNSPECIFIED",
    1: "HARM_CATEGORY_HATE_SPEECH",
    2: "HARM_CATEGORY_DANGEROUS_CONTENT",
    3: "HARM_CATEGORY_HARASSMENT",
    4: "HARM_CATEGORY_SEXUALLY_EXPLICIT",
    5: "HARM_CATEGORY_CIVIC_INTEGRITY",
}
VERTEX_BLOCK_REASONS: Final = {
    0: "BLOCKED_REASON_UNSPECIFIED",
    1: "SAFETY",
    2: "OTHER",
    3: "BLOCKLIST",
    4: "PROHIBITED_CONTENT",
}


class VertexAdapter(GeminiAdapter):
    """``base_url`` is the project's models prefix (see :func:`resolve_base_url`)."""

    provider = "vertex"
    #: Vertex lists models per project with a signed token: no list a key alone can read.
    models_path: ClassVar[str | None] = None
    finish_reasons: ClassVar[Mapping[int, str]] = VERTEX_FINISH_REASONS
    block_reasons: ClassVar[Mapping[int, str]] = VERTEX_BLOCK_REASONS
    harm_categories: ClassVar[Mapping[int, str]] = VERTEX_HARM_CATEGORIES
    #: An explicit access token (``api_key``) is a bearer token, not Gemini's API key.
    key_header: ClassVar[tuple[str, str]] = ("authorization", "Bearer {key}")

    def __init__(self, config: ProviderConfig, tokens: TokenSource | None = None) -> None:
        super().__init__(config)
        self.tokens = tokens
        if tokens is None and not config.api_key:
            _google_auth()  # a missing extra says so when the client is made, not at the call
            self.tokens = TokenSource()
        # The token reaches each request as its credential step: the call runs its lookup
        # (a refresh is an HTTP exchange with Google's token endpoint) first, off the event
        # loop and within its deadline, and adds it to the request once built.
        self.credential = self.tokens

    def request(self, spec: CallSpec, *, stream: bool) -> Request:
        if not self.config.base_url:  # never Gemini's home: the token is for Vertex
            raise _not_configured(
                "vertex needs its project URL: make the client with provider='vertex'"
            )
        request = super().request(spec, stream=stream)  # an explicit token: a plain header
        if self.tokens is None or any(k.lower() == "authorization" for k in spec.extra_headers):
            return request  # the caller's own authorization header is their word
        # The token step's, which replaces one in the client's own headers=.
        for name in [k for k in request.headers if k.lower() == "authorization"]:
            del request.headers[name]
        return dataclasses.replace(request, auth=self.tokens)
