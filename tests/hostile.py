"""The hostile loopback server of the transport conformance suite, and the suite's scenarios.

One call keeps the same promises whichever pool carries it (DESIGN.md, "The
transport contract"; issue 21). This module holds everything the suite
(tests/test_conformance.py) and its table (benchmarks/conformance_table.py)
share:

- :class:`HostileServer`: a raw HTTP/1.1 server on 127.0.0.1, a thread per
  connection, that hands each parsed request to a handler which may answer
  in any broken way (drip the head or the body, never answer, bombs, garbage
  status lines, resets, redirects, endless streams). Every request it read is
  recorded. Every handler gives up after :data:`HOLD` seconds at most, so a
  client that ignores its deadline fails the test in bounded time instead of
  hanging it; stopping the server closes every connection. Nothing it sends is
  held in memory whole: bombs are a few KiB to a few hundred KiB, and endless
  streams are written from a small block over and over.
- :func:`forward_proxy`: a handler that makes a :class:`HostileServer` a tiny
  HTTP proxy (absolute-form requests forwarded, ``CONNECT`` tunnelled),
  recording what it carried.
- :func:`tls_files`: a CA and a certificate for 127.0.0.1 signed by it, made
  at first use with ``cryptography`` (a temporary directory, removed at exit).
- :class:`Caller`: one :class:`LLMClient` on one of the :data:`TRANSPORTS`,
  with a retry policy whose sleeps are recorded, never slept, and no shared
  store; ``call()`` and ``stream()`` each make one call.
- :data:`SCENARIOS`: the scenario list, each with the outcome every transport
  must give; :func:`run` plays one on one transport and :func:`problems`
  says how the outcome differs from the contract (including
  :func:`secret_leaks`, the secret scan).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import ctypes
import datetime
import gc
import ipaddress
import json
import logging
import os
import resource
import select
import shutil
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import types
import warnings
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Final, cast
from urllib.parse import urlsplit

import httpx

from fluid_build.copilot import LLMClient
from fluid_build.copilot.agents.errors import AgentExecutionError
from fluid_build.copilot.call.envelope import RetryEnvelope, RetryPolicy
from fluid_build.copilot.call.transport import TRANSPORT_ENV

# -- the numbers ------------------------------------------------------------------------

#: The API key of every call: distinctive, so the secret scan cannot miss it.
KEY: Final = "sk-fluid-conformance-SECRET-0123456789"
#: What the secret scan looks for: the key, and its part no redaction may keep.
SECRETS: Final = (KEY, "conformance-SECRET-0123456789")
DEADLINE: Final = 2.0  # one call's deadline (seconds)
TIMEOUT: Final = 10.0  # the per-attempt timeout: larger than the deadline, never the bound
MARGIN: Final = 1.5  # the bound: every call ends by deadline + 1.5 s
RSS_LIMIT_MB: Final = 256.0
ATTEMPTS: Final = 3  # the policy's attempts: what a retryable failure costs in requests
#: The longest a hostile handler keeps a connection: past the bound, so a client
#: that ignores its deadline fails (late) instead of hanging the suite.
HOLD: Final = DEADLINE + MARGIN + 1.0
DRIP: Final = 0.5  # seconds between dripped bytes
BOMB_INFLATED: Final = 512 * 2**20  # what a bomb inflates to: twice the RSS bound
PROMPT: Final = "Say ok."
MODELS: Final = {"openai": "gpt-4o-mini", "anthropic": "claude-sonnet-4-6"}

#: The five transports every scenario runs on.
TRANSPORTS: Final = ("sync-direct", "async-httpx", "async-aiohttp", "caller-sync", "caller-async")
#: The async transports whose pools fluid makes, one per event loop.
FLUID_ASYNC_TRANSPORTS: Final = ("async-httpx", "async-aiohttp")
#: The pools fluid makes (sync and async): the ones ``LLMClient.close()`` closes.
FLUID_TRANSPORTS: Final = ("sync-direct", *FLUID_ASYNC_TRANSPORTS)
#: Every transport but a caller's own AsyncClient, which is bound to one loop.
THREAD_TRANSPORTS: Final = ("sync-direct", "async-httpx", "async-aiohttp", "caller-sync")
ASYNC_TRANSPORTS: Final = ("async-httpx", "async-aiohttp", "caller-async")
#: A caller's pools that follow redirects (httpx's ``follow_redirects=True``): redirect scenarios.
FOLLOWING: Final = ("caller-sync-follow", "caller-async-follow")

# -- answers --------------------------------------------------------------------------------


def completion(text: str = "ok") -> bytes:
    return json.dumps(
        {
            "id": "chatcmpl-conformance",
            "object": "chat.completion",
            "model": "gpt-4o-mini",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 9, "completion_tokens": 1, "total_tokens": 10},
        }
    ).encode()


ANSWER: Final = completion()
JSON: Final = (("content-type", "application/json"),)
SSE: Final = (("content-type", "text/event-stream"), ("cache-control", "no-cache"))


def sse_delta(text: str) -> bytes:
    chunk = {
        "id": "chatcmpl-conformance",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}],
    }
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


def head(
    status: int = 200,
    headers: Mapping[str, str] | tuple[tuple[str, str], ...] = (),
    reason: str = "X",
) -> bytes:
    """A status line and headers (a sequence of pairs may repeat a name)."""
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    lines = [f"HTTP/1.1 {status} {reason}"] + [f"{name}: {value}" for name, value in pairs]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


# -- the server ----------------------------------------------------------------------------


@dataclass
class Request:
    """One request as the server read it."""

    method: str
    target: str  # as sent: origin-form, absolute-form (to a proxy) or host:port (CONNECT)
    headers: list[tuple[str, str]]  # names lower-cased, in order, repeats kept
    body: bytes
    at: float  # time.monotonic() once read

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k == name), None)


class Conn:
    """One accepted connection, as a handler sees it."""

    def __init__(self, sock: socket.socket, server: HostileServer) -> None:
        self.sock = sock
        self.server = server
        self.until = time.monotonic() + server.hold

    @property
    def alive(self) -> bool:
        return not self.server.stopping.is_set() and time.monotonic() < self.until

    def send(self, data: bytes) -> bool:
        """Send ``data``; False once the client has gone (or the server stops)."""
        if not self.alive:
            return False
        try:
            self.sock.sendall(data)
        except OSError:
            return False
        return True

    def wait(self, seconds: float) -> bool:
        """Wait ``seconds`` (a server thread, never the test's); False when time is up."""
        left = self.until - time.monotonic()
        if left <= 0 or self.server.stopping.wait(min(seconds, left)):
            return False
        return self.alive

    def drip(self, data: bytes, every: float = DRIP) -> bool:
        """``data`` one byte every ``every`` seconds; False when the client or time is gone."""
        return all(self.wait(every) and self.send(data[i : i + 1]) for i in range(len(data)))

    def hold(self) -> None:
        """Read (and drop) whatever comes until the client hangs up or time is up."""
        with contextlib.suppress(OSError, ValueError):
            self.sock.settimeout(0.05)
            while self.alive:
                try:
                    if not self.sock.recv(65536):
                        return
                except TimeoutError:
                    continue

    def reset(self) -> None:
        """Make the coming close an RST, not a FIN."""
        with contextlib.suppress(OSError):
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


#: A handler answers one request; True keeps the connection for the next one.
Handler = Callable[[Conn, Request], bool]


def _read_request(rfile: Any) -> Request | None:
    """One request off a buffered socket file (content-length or chunked body); None at EOF."""
    line = rfile.readline(65537)
    while line in (b"\r\n", b"\n"):  # tolerated before a request line
        line = rfile.readline(65537)
    if not line:
        return None
    method, _, rest = line.decode("latin-1").strip().partition(" ")
    target = rest.rpartition(" ")[0] or rest
    headers: list[tuple[str, str]] = []
    while True:
        raw = rfile.readline(65537)
        if raw in (b"\r\n", b"\n", b""):
            break
        name, _, value = raw.decode("latin-1").partition(":")
        headers.append((name.strip().lower(), value.strip()))
    request = Request(method, target, headers, b"", 0.0)
    if "chunked" in (request.header("transfer-encoding") or "").lower():
        parts = []
        while True:
            size = int(rfile.readline(1024).split(b";")[0].strip() or b"0", 16)
            if size == 0:
                rfile.readline(1024)
                break
            parts.append(rfile.read(size))
            rfile.readline(1024)
        request.body = b"".join(parts)
    else:
        request.body = rfile.read(int(request.header("content-length") or 0))
    request.at = time.monotonic()
    return request


class HostileServer:
    """A raw HTTP/1.1 server on 127.0.0.1 whose ``handler`` answers however it likes.

    ``tls`` (a server-side :class:`ssl.SSLContext`) makes it HTTPS. Use
    :func:`serve`; ``requests`` holds every request read, in order.
    """

    def __init__(
        self, handler: Handler, *, tls: ssl.SSLContext | None = None, hold: float = HOLD
    ) -> None:
        self.handler = handler
        self.tls = tls
        self.hold = hold
        self.requests: list[Request] = []
        self.errors: list[BaseException] = []  # the handlers' own bugs
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._socks: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self._listener.settimeout(1.0)
        self.port: int = self._listener.getsockname()[1]
        self._acceptor = threading.Thread(target=self._accept, name="hostile-accept", daemon=True)

    def url_for(self, host: str = "127.0.0.1") -> str:
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}"

    @property
    def url(self) -> str:
        """The origin, e.g. ``http://127.0.0.1:41234``."""
        return self.url_for()

    def start(self) -> None:
        self._acceptor.start()

    def stop(self) -> None:
        self.stopping.set()
        with contextlib.suppress(OSError):  # wakes accept() at once
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
        self._acceptor.join(timeout=5)
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            socks = list(self._socks)
        for sock in socks:  # wakes every handler blocked on a read
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        for thread in list(self._threads):
            thread.join(timeout=2)

    def _accept(self) -> None:
        while not self.stopping.is_set():
            try:
                sock, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if self.stopping.is_set():  # stop()'s wake-up call, or too late
                sock.close()
                return
            thread = threading.Thread(
                target=self._connection, args=(sock,), name="hostile-conn", daemon=True
            )
            self._threads.append(thread)
            thread.start()

    def _connection(self, sock: socket.socket) -> None:
        with self._lock:
            self._socks.add(sock)
        try:
            sock.settimeout(self.hold + 1.0)
            if self.tls is not None:
                sock = self.tls.wrap_socket(sock, server_side=True)
                with self._lock:
                    self._socks.add(sock)
            conn = Conn(sock, self)
            rfile = sock.makefile("rb")
            while not self.stopping.is_set():
                request = _read_request(rfile)
                if request is None:
                    return
                with self._lock:
                    self.requests.append(request)
                keep = self.handler(conn, request)
                if not keep or (request.header("connection") or "").lower() == "close":
                    return
        except (OSError, ValueError, ssl.SSLError):
            pass  # the client went away, or refused our certificate
        except Exception as exc:  # a bug in a handler: the test asserts there is none
            self.errors.append(exc)
        finally:
            with contextlib.suppress(OSError):
                sock.close()
            with self._lock:
                self._socks.discard(sock)


@contextlib.contextmanager
def serve(handler: Handler, *, tls: bool = False, hold: float = HOLD) -> Iterator[HostileServer]:
    """A :class:`HostileServer` for the ``with`` block (HTTPS with :func:`tls_files`)."""
    server = HostileServer(handler, tls=server_tls_context() if tls else None, hold=hold)
    server.start()
    try:
        yield server
    finally:
        server.stop()


# -- handlers: one per way of misbehaving ---------------------------------------------------


def respond(
    status: int,
    body: bytes,
    headers: tuple[tuple[str, str], ...] = JSON,
) -> Handler:
    """A well-formed answer (keep-alive, content-length)."""

    def handler(conn: Conn, request: Request) -> bool:
        return conn.send(head(status, (*headers, ("content-length", str(len(body))))) + body)

    return handler


ok = respond(200, ANSWER)


def drip_body(conn: Conn, request: Request) -> bool:
    """The head at once, then the body one byte every 0.5 s (until :data:`HOLD`)."""
    body = ANSWER * 64
    if conn.send(head(200, (*JSON, ("content-length", str(len(body)))))):
        conn.drip(body)
    return False


def drip_head(conn: Conn, request: Request) -> bool:
    """The status line and headers one byte every 0.5 s: the head never completes in time."""
    conn.drip(head(200, (*JSON, ("content-length", str(len(ANSWER))))) + ANSWER)
    return False


def silent(conn: Conn, request: Request) -> bool:
    """Read the request, never answer."""
    conn.hold()
    return False


def endless_sse(conn: Conn, request: Request) -> bool:
    """A valid stream that sends a small delta every 0.05 s, forever."""
    if conn.send(head(200, (*SSE, ("connection", "close")))):
        while conn.send(sse_delta("a")) and conn.wait(0.05):
            pass
    return False


def endless_sse_line(conn: Conn, request: Request) -> bool:
    """One ``data:`` line that never ends, as fast as the client reads."""
    block = b"a" * 65536
    start = b'data: {"choices": [{"index": 0, "delta": {"content": "'
    if conn.send(head(200, (*SSE, ("connection", "close"))) + start):
        while conn.send(block):
            pass
    return False


def _gzip(data: bytes) -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    return packer.compress(data) + packer.flush()


@cache
def gzip_bomb(inflated: int = BOMB_INFLATED) -> bytes:
    """A gzip body of ``{"choices": "`` and ``inflated`` zero bytes (about 1 KiB per MiB).

    Made in milliseconds: a full flush resets the compressor, so the deflate
    block of one MiB of zeros is the same bytes every time and is repeated.
    """
    prefix = b'{"choices": "'
    block = b"\0" * 2**20
    packer = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    parts = [packer.compress(prefix) + packer.flush(zlib.Z_FULL_FLUSH)]
    one = packer.compress(block) + packer.flush(zlib.Z_FULL_FLUSH)
    blocks = inflated // len(block)
    parts.append(one * blocks)
    parts.append(packer.flush())
    crc = zlib.crc32(prefix)
    for _ in range(blocks):
        crc = zlib.crc32(block, crc)
    size = (len(prefix) + blocks * len(block)) & 0xFFFFFFFF
    gzip_head = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"
    return gzip_head + b"".join(parts) + struct.pack("<II", crc & 0xFFFFFFFF, size)


@cache
def stacked_bomb() -> bytes:
    """:func:`gzip_bomb` gzipped again: a few KiB for ``Content-Encoding: gzip, gzip``."""
    return _gzip(gzip_bomb())


def encoded(body: Callable[[], bytes], encodings: tuple[str, ...]) -> Handler:
    """A 200 JSON answer whose ``body()`` claims each of ``encodings`` (one header each)."""

    def handler(conn: Conn, request: Request) -> bool:
        data = body()
        headers = (*JSON, *(("content-encoding", e) for e in encodings))
        conn.send(head(200, (*headers, ("content-length", str(len(data))))) + data)
        return False

    return handler


def reset_mid_body(conn: Conn, request: Request) -> bool:
    """The head and half the body, then RST."""
    if conn.send(head(200, (*JSON, ("content-length", str(len(ANSWER))))) + ANSWER[:40]):
        conn.wait(0.05)  # let the client start on the body, so the RST cuts it
        conn.reset()
    return False


def bad_status_line(conn: Conn, request: Request) -> bool:
    conn.send(b"HTTP/1.1 abc\r\ncontent-length: 2\r\n\r\n{}")
    return False


def closed_mid_headers(conn: Conn, request: Request) -> bool:
    """A status line, the request's credential echoed back as a header, then FIN."""
    echoed = request.header("authorization") or request.header("x-api-key") or ""
    conn.send(f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nx-echo: {echoed}\r\n".encode())
    return False


long_header_line = respond(200, ANSWER, (*JSON, ("x-long", "a" * 10 * 1024)))


def redirect(location: str) -> Handler:
    return respond(307, b"", (("location", location),))


cookie_setter = respond(200, ANSWER, (*JSON, ("set-cookie", "s=1; Path=/")))


def stream_cut(chunked: bool) -> Handler:
    """Two deltas, then the connection closes: no finish reason, no ``[DONE]``."""

    def handler(conn: Conn, request: Request) -> bool:
        deltas = [sse_delta("Hello "), sse_delta("world")]
        if chunked:
            framing: tuple[tuple[str, str], ...] = (("transfer-encoding", "chunked"),)
            deltas = [f"{len(d):x}\r\n".encode() + d + b"\r\n" for d in deltas]
        else:
            framing = (("connection", "close"),)
        if conn.send(head(200, (*SSE, *framing))):
            for delta in deltas:
                if not (conn.send(delta) and conn.wait(0.02)):
                    break
        return False  # closed without the last chunk (chunked) or mid-stream (close-delimited)

    return handler


def slow_first_byte(conn: Conn, request: Request) -> bool:
    """A whole answer, but only after 1 s of silence."""
    if conn.wait(1.0):
        conn.send(head(200, (*JSON, ("content-length", str(len(ANSWER))))) + ANSWER)
    return False


def stall_mid_body(conn: Conn, request: Request) -> bool:
    """The head and half the body at once, then silence with the connection open."""
    if conn.send(head(200, (*JSON, ("content-length", str(len(ANSWER))))) + ANSWER[:40]):
        conn.hold()
    return False


def stall_before_events(conn: Conn, request: Request) -> bool:
    """A stream's head at once, then no event at all, the connection open."""
    if conn.send(head(200, (*SSE, ("connection", "close")))):
        conn.hold()
    return False


def stall_mid_stream(conn: Conn, request: Request) -> bool:
    """A stream's head and one delta, then silence with the connection open."""
    if conn.send(head(200, (*SSE, ("connection", "close"))) + sse_delta("Hel")):
        conn.hold()
    return False


def keepalive_thinking(conn: Conn, request: Request) -> bool:
    """A stream that "thinks" for 0.6 s, a keep-alive comment every 0.1 s, then answers."""
    if not conn.send(head(200, (*SSE, ("connection", "close")))):
        return False
    for _ in range(6):
        if not (conn.wait(0.1) and conn.send(b": keep-alive\n\n")):
            return False
    done = b'data: {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}\n\n'
    conn.send(sse_delta("ok") + done + b"data: [DONE]\n\n")
    return False


def thinking_stream(conn: Conn, request: Request) -> bool:
    """A stream's head at once, 0.5 s of silence (a model reasoning), then the answer."""
    if conn.send(head(200, (*SSE, ("connection", "close")))) and conn.wait(0.5):
        done = b'data: {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}\n\n'
        conn.send(sse_delta("ok") + done + b"data: [DONE]\n\n")
    return False


# -- a forward proxy ------------------------------------------------------------------------

_HOP: Final = {"connection", "keep-alive", "proxy-connection", "proxy-authorization", "te"}


def _pipe(a: socket.socket, b: socket.socket, conn: Conn) -> None:
    """Copy bytes both ways until either side closes or time is up."""
    peers = {a: b, b: a}
    with contextlib.suppress(OSError):
        while conn.alive:
            ready, _, _ = select.select(list(peers), [], [], 0.05)
            for sock in ready:
                data = sock.recv(65536)
                if not data:
                    return
                peers[sock].sendall(data)


def forward_proxy(conn: Conn, request: Request) -> bool:
    """An HTTP proxy: ``CONNECT host:port`` tunnels; an absolute-form request is forwarded."""
    if request.method == "CONNECT":
        host, _, port = request.target.rpartition(":")
        with socket.create_connection((host, int(port)), timeout=HOLD) as upstream:
            if conn.send(b"HTTP/1.1 200 Connection established\r\n\r\n"):
                _pipe(conn.sock, upstream, conn)
        return False
    url = urlsplit(request.target)
    if not url.scheme or not url.hostname:
        conn.send(head(400, (("content-length", "0"),)))
        return False
    path = (url.path or "/") + (f"?{url.query}" if url.query else "")
    lines = [f"{request.method} {path} HTTP/1.1"]
    lines += [f"{k}: {v}" for k, v in request.headers if k not in _HOP]
    lines.append("connection: close")
    with socket.create_connection((url.hostname, url.port or 80), timeout=HOLD) as upstream:
        upstream.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + request.body)
        upstream.settimeout(0.05)
        while conn.alive:
            try:
                data = upstream.recv(65536)
            except TimeoutError:
                continue
            if not data or not conn.send(data):
                break
    return False


# -- TLS ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TlsFiles:
    ca: Path  # the CA certificate (PEM): what SSL_CERT_FILE points at to trust the server
    cert: Path  # the server's certificate for 127.0.0.1 and localhost, signed by the CA
    key: Path


@cache
def tls_files() -> TlsFiles:
    """A throwaway CA and a server certificate signed by it (``cryptography``; no network)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    valid = (now - datetime.timedelta(hours=1), now + datetime.timedelta(days=1))
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fluid conformance CA")])
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(valid[0])
        .not_valid_after(valid[1])
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(ca_ski, critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(valid[0])
        .not_valid_after(valid[1])
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    folder = Path(tempfile.mkdtemp(prefix="fluid-conformance-tls-"))
    atexit.register(shutil.rmtree, folder, True)
    files = TlsFiles(folder / "ca.pem", folder / "server.pem", folder / "server.key")
    files.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    files.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    files.key.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return files


def server_tls_context() -> ssl.SSLContext:
    files = tls_files()
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(files.cert, files.key)
    return context


# -- the environment -------------------------------------------------------------------------

#: What httpx and aiohttp read from the environment: cleared around every scenario.
ENV_VARS: Final = (
    *(f"{base}_PROXY" for base in ("HTTP", "HTTPS", "ALL", "NO")),
    *(f"{base}_proxy" for base in ("http", "https", "all", "no")),
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
)


@contextlib.contextmanager
def environ(**values: str) -> Iterator[None]:
    """``os.environ`` with the proxy and certificate variables cleared, then ``values`` set."""
    saved = {name: os.environ.get(name) for name in (*ENV_VARS, *values)}
    for name in ENV_VARS:
        os.environ.pop(name, None)
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


# -- the transports ---------------------------------------------------------------------------

POLICY: Final = RetryPolicy(attempts=ATTEMPTS, backoff_base=0.05, backoff_cap=0.2, jitter=0.0)


class Caller:
    """One :class:`LLMClient` on one transport: ``call()`` and ``stream()`` make one call each.

    The retry envelope records its waits (``waits``) and never sleeps; there is
    no shared store, so no test sees another's cooldown or breaker. An async
    transport runs every call of a ``Caller`` on one event loop (an
    :class:`asyncio.Runner`), except :meth:`call_on_a_new_loop`.
    """

    def __init__(
        self,
        transport: str,
        origin: str,
        *,
        provider: str = "openai",
        deadline: float = DEADLINE,
        timeout: float = TIMEOUT,
        env: Mapping[str, str] | None = None,
        phases: Mapping[str, float] | None = None,
    ) -> None:
        self.transport = transport
        self.is_async = transport.startswith(("async-", "caller-async"))
        self.waits: list[float] = []
        self.events: list[Any] = []  # the stream events received by the last stream()
        self.close_errors: list[str] = []
        self._runner: asyncio.Runner | None = None
        self._own_sync: httpx.Client | None = None
        self._own_async: httpx.AsyncClient | None = None
        fluid_env = dict(env or {})
        pools: dict[str, Any] = {}
        follow = transport.endswith("-follow")
        if transport == "async-httpx":
            fluid_env[TRANSPORT_ENV] = "httpx"
        elif transport == "async-aiohttp":
            fluid_env[TRANSPORT_ENV] = "aiohttp"
        elif transport.startswith("caller-sync"):
            self._own_sync = pools["http_client"] = httpx.Client(follow_redirects=follow)
        elif transport.startswith("caller-async"):
            self._own_async = pools["async_http_client"] = httpx.AsyncClient(
                follow_redirects=follow
            )
        elif transport != "sync-direct":
            raise ValueError(f"no transport {transport!r}")

        async def asleep(seconds: float) -> None:
            self.waits.append(seconds)

        envelope = RetryEnvelope(POLICY, cooldown=None, sleep=self.waits.append, asleep=asleep)
        self.client = LLMClient(
            provider,
            MODELS[provider],
            api_key=KEY,
            base_url=origin if provider == "anthropic" else f"{origin}/v1",
            timeout=timeout,
            deadline=deadline,
            envelope=envelope,
            env=fluid_env,
            **pools,
            **(phases or {}),
        )

    def _loop(self) -> asyncio.Runner:
        if self._runner is None:
            self._runner = asyncio.Runner()
        return self._runner

    def call(self) -> Any:
        if self.is_async:
            return self._loop().run(self.client.acomplete(PROMPT))
        return self.client.complete(PROMPT)

    def stream(self) -> list[Any]:
        self.events = []
        if self.is_async:

            async def consume() -> None:
                async for event in self.client.astream(PROMPT):
                    self.events.append(event)

            self._loop().run(consume())
        else:
            for event in self.client.stream(PROMPT):
                self.events.append(event)
        return list(self.events)

    def call_on_a_new_loop(self) -> Any:
        """``asyncio.run(client.acomplete(...))``: a loop of its own, closed after."""
        return asyncio.run(self.client.acomplete(PROMPT))

    def close(self) -> None:
        """Close the client (and the caller's own pool); failures are recorded, not raised."""
        try:
            if self.is_async:
                self._loop().run(self.client.aclose())
                if self._own_async is not None:
                    self._loop().run(self._own_async.aclose())
            else:
                self.client.close()
                if self._own_sync is not None:
                    self._own_sync.close()
        except Exception as exc:
            self.close_errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            if self._runner is not None:
                with contextlib.suppress(Exception):
                    self._runner.close()


# -- measuring one call -------------------------------------------------------------------------

_PAGE: Final = resource.getpagesize()


def _rss() -> int:
    with open("/proc/self/statm", "rb") as statm:
        return int(statm.read().split()[1]) * _PAGE


class RssSampler:
    """The process's peak RSS growth (MB) while in the ``with`` block, sampled every 2 ms."""

    def __init__(self, every: float = 0.002) -> None:
        self.every = every
        self.baseline = 0
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="rss-sampler", daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(self.every):
            self.peak = max(self.peak, _rss())

    def __enter__(self) -> RssSampler:
        self.baseline = self.peak = _rss()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self.peak = max(self.peak, _rss())

    @property
    def growth_mb(self) -> float:
        return (self.peak - self.baseline) / 2**20


class LogCapture(logging.Handler):
    """Every record at DEBUG and above (root and ``fluid_build``), formatted with its traceback."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
        self.lines: list[str] = []
        self._levels: dict[str, int] = {}

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.lines.append(f"{self.format(record)} {record.args!r}")
        except Exception as exc:
            self.lines.append(f"unformattable record {record.msg!r}: {exc!r}")

    def __enter__(self) -> LogCapture:
        for name in ("", "fluid_build"):
            logger = logging.getLogger(name)
            self._levels[name] = logger.level
            logger.setLevel(logging.DEBUG)
        logging.getLogger().addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        logging.getLogger().removeHandler(self)
        for name, level in self._levels.items():
            logging.getLogger(name).setLevel(level)


@dataclass
class Outcome:
    """What one scenario did on one transport."""

    scenario: str
    transport: str
    code: str  # "ok", the typed error's code, or "untyped:<ExceptionClass>"
    retryable: bool | None
    requests: int  # requests the provider's server read
    elapsed: float
    rss_mb: float
    error: BaseException | None = None
    value: Any = None
    logs: list[str] = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)


@dataclass
class Measured:
    value: Any
    error: BaseException | None
    elapsed: float
    rss_mb: float
    logs: list[str]


def _give_memory_back() -> None:
    """Hand freed heap back to the OS, so that memory an earlier call freed (and glibc
    kept) does not hide this call's growth from the RSS sampler."""
    gc.collect()  # cheap inside run(): only what the scenario made is not frozen
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).malloc_trim(0)


def measure(fn: Callable[[], Any]) -> Measured:
    """Run ``fn`` once: its value or exception, seconds, RSS growth, and the logs it wrote."""
    _give_memory_back()
    with LogCapture() as logs, RssSampler() as rss:
        started = time.monotonic()
        try:
            value, error = fn(), None
        except Exception as exc:
            value, error = None, exc
        elapsed = time.monotonic() - started
    return Measured(value, error, elapsed, rss.growth_mb, logs.lines)


def outcome(
    scenario: str,
    transport: str,
    measured: Measured,
    requests: int,
    **notes: Any,
) -> Outcome:
    error = measured.error
    if error is None:
        code, retryable = "ok", None
    elif isinstance(error, AgentExecutionError):
        code, retryable = error.code, error.retryable
    else:
        code, retryable = f"untyped:{type(error).__name__}", None
    return Outcome(
        scenario,
        transport,
        code,
        retryable,
        requests,
        measured.elapsed,
        measured.rss_mb,
        error,
        measured.value,
        measured.logs,
        notes,
    )


# -- the secret scan ---------------------------------------------------------------------------

_OPAQUE: Final = (
    types.ModuleType,
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodType,
    types.FrameType,
    types.TracebackType,
    types.CodeType,
    types.GeneratorType,
    types.CoroutineType,
    type,
    asyncio.AbstractEventLoop,
    threading.Thread,
)


def _slots(obj: object) -> Iterator[tuple[str, Any]]:
    for klass in type(obj).__mro__:
        names = klass.__dict__.get("__slots__", ())
        for name in (names,) if isinstance(names, str) else names:
            if name in ("__dict__", "__weakref__"):
                continue
            try:
                yield name, getattr(obj, name)
            except Exception:  # noqa: S112 - an unset slot
                continue


def _children(obj: object) -> Iterator[tuple[str, Any]]:
    if isinstance(obj, BaseException):
        yield ".args", obj.args
        yield ".__cause__", obj.__cause__
        yield ".__context__", obj.__context__
        if isinstance(obj, BaseExceptionGroup):
            yield ".exceptions", obj.exceptions
        if isinstance(obj, AgentExecutionError):
            yield ".to_dict()", json.dumps(obj.to_dict(), default=repr)
    multi_items = getattr(obj, "multi_items", None)
    if isinstance(obj, Mapping) or callable(multi_items):
        items = multi_items() if callable(multi_items) else cast(Mapping[Any, Any], obj).items()
        for i, (key, value) in enumerate(items):
            if i >= 1000:
                break
            yield f"[{key!r}]", key
            yield f"[{key!r}]", value
    elif isinstance(obj, list | tuple | set | frozenset):
        for i, value in enumerate(obj):
            if i >= 1000:
                break
            yield f"[{i}]", value
    attributes = getattr(obj, "__dict__", None)
    if isinstance(attributes, dict):
        yield from ((f".{name}", value) for name, value in list(attributes.items()))
    yield from ((f".{name}", value) for name, value in _slots(obj))


def _text(value: object) -> str:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("latin-1")
    return value if isinstance(value, str) else ""


def secret_leaks(
    error: BaseException | None,
    logs: Sequence[str] = (),
    secrets: tuple[str, ...] = SECRETS,
    depth: int = 8,
) -> list[str]:
    """Where a secret shows: in ``str``/``repr`` of ``error`` or of anything chained to it
    (``__cause__``, ``__context__``, ``args`` and attributes, walked ``depth`` deep: an
    httpx exception's ``.request.headers``, aiohttp's ``request_info.headers``), in its
    ``to_dict()``, in its formatted traceback, or in ``logs``. Empty when none does."""
    found: list[str] = []

    def check(where: str, text: str) -> None:
        if any(secret in text for secret in secrets):
            found.append(where)

    for i, line in enumerate(logs):
        check(f"log record {i}: {line[:120]!r}", line)
    if error is None:
        return found
    check("traceback.format_exception(error)", "".join(traceback.format_exception(error)))
    seen: set[int] = set()
    todo: list[tuple[str, Any, int]] = [("error", error, 0)]
    while todo and len(seen) < 50_000:
        path, obj, level = todo.pop()
        if obj is None or isinstance(obj, bool | int | float | complex) or id(obj) in seen:
            continue
        seen.add(id(obj))
        text = _text(obj)
        if text or isinstance(obj, str | bytes | bytearray | memoryview):
            check(path, text)
            continue
        if isinstance(obj, _OPAQUE):
            continue
        for show in (repr, str) if isinstance(obj, BaseException) else (repr,):
            try:
                check(f"{show.__name__}({path})", show(obj)[:1_000_000])
            except Exception:  # noqa: S112 - a hostile __repr__ shows nothing
                continue
        if level >= depth:
            continue
        with contextlib.suppress(Exception):
            todo.extend((path + step, child, level + 1) for step, child in _children(obj))
    return found


# -- scenarios -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    """One way a server (or the caller) can behave, and the outcome every transport owes."""

    name: str
    code: str  # "ok" or the typed error's code
    retryable: bool | None  # None: success
    requests: int  # requests the provider's server reads
    play: Callable[[Scenario, str], Outcome]
    transports: tuple[str, ...] = TRANSPORTS
    #: The bound on the outcome's elapsed seconds (None: no bound, e.g. a subprocess).
    bound: float | None = DEADLINE + MARGIN
    #: Extra checks: what they find wrong with an outcome, as sentences.
    check: Callable[[Outcome], list[str]] | None = None
    about: str = ""


def one_call(
    handler: Handler,
    *,
    stream: bool = False,
    provider: str = "openai",
    tls: bool = False,
    env: Mapping[str, str] | None = None,
    phases: Mapping[str, float] | None = None,
) -> Callable[[Scenario, str], Outcome]:
    """A scenario that is one call (or stream) against one hostile server (``phases``: the
    client's ``connect_timeout``, ``first_token_timeout``, ``idle_timeout``)."""

    def play(scenario: Scenario, transport: str) -> Outcome:
        with environ(**(env or {})), serve(handler, tls=tls) as server:
            caller = Caller(transport, server.url, provider=provider, phases=phases)
            try:
                measured = measure(caller.stream if stream else caller.call)
            finally:
                caller.close()
            return outcome(
                scenario.name,
                transport,
                measured,
                len(server.requests),
                waits=caller.waits,
                events=caller.events,
                close_errors=caller.close_errors,
                server_errors=server.errors,
            )

    return play


def _redirected(provider: str) -> Callable[[Scenario, str], Outcome]:
    def play(scenario: Scenario, transport: str) -> Outcome:
        with environ(), serve(ok) as other:
            target = f"{other.url}/v1/chat/completions"
            with serve(redirect(target)) as server:
                caller = Caller(transport, server.url, provider=provider)
                try:
                    measured = measure(caller.call)
                finally:
                    caller.close()
                return outcome(
                    scenario.name,
                    transport,
                    measured,
                    len(server.requests),
                    origin=other.url,
                    other_requests=len(other.requests),
                    close_errors=caller.close_errors,
                )

    return play


def _redirect_checks(result: Outcome) -> list[str]:
    found = []
    if result.notes["other_requests"]:
        found.append(f"the Location's server received {result.notes['other_requests']} request(s)")
    if result.error is not None and result.notes["origin"] not in str(result.error):
        found.append(f"the message does not name {result.notes['origin']}: {result.error}")
    return found


def _cookie(scenario: Scenario, transport: str) -> Outcome:
    with environ(), serve(cookie_setter) as server:
        # "localhost": a cookie jar may refuse cookies for a bare IP address.
        caller = Caller(transport, server.url_for("localhost"))
        try:
            measured = measure(lambda: [caller.call(), caller.call()])
        finally:
            caller.close()
        cookies = [r.header("cookie") for r in server.requests]
        return outcome(
            scenario.name,
            transport,
            measured,
            len(server.requests),
            cookies=cookies,
            close_errors=caller.close_errors,
        )


def _cookie_checks(result: Outcome) -> list[str]:
    sent = [c for c in result.notes["cookies"] if c is not None]
    return [f"a request carried a Cookie header: {sent}"] if sent else []


def _proxied(*, no_proxy: bool = False, tls: bool = False) -> Callable[[Scenario, str], Outcome]:
    """A call with HTTP_PROXY and HTTPS_PROXY naming the loopback proxy (and NO_PROXY, or
    an HTTPS provider reached through ``CONNECT`` with SSL_CERT_FILE trusting its CA)."""

    def play(scenario: Scenario, transport: str) -> Outcome:
        with serve(ok, tls=tls) as provider, serve(forward_proxy) as proxy:
            env = {"HTTP_PROXY": proxy.url, "HTTPS_PROXY": proxy.url}
            if no_proxy:
                env["NO_PROXY"] = "127.0.0.1"
            if tls:
                env["SSL_CERT_FILE"] = str(tls_files().ca)
            with environ(**env):
                caller = Caller(transport, provider.url)
                try:
                    measured = measure(caller.call)
                finally:
                    caller.close()
            if no_proxy:
                wanted = []
            elif tls:
                wanted = [f"127.0.0.1:{provider.port}"]  # CONNECT's authority-form
            else:
                wanted = [f"{provider.url}/v1/chat/completions"]  # absolute-form
            return outcome(
                scenario.name,
                transport,
                measured,
                len(provider.requests),
                proxied=[f"{r.method} {r.target}" for r in proxy.requests],
                wanted=[f"{'CONNECT' if tls else 'POST'} {target}" for target in wanted],
                server_errors=proxy.errors,
                close_errors=caller.close_errors,
            )

    return play


def _proxy_checks(result: Outcome) -> list[str]:
    proxied, wanted = result.notes["proxied"], result.notes["wanted"]
    return [] if proxied == wanted else [f"the proxy carried {proxied}, not {wanted}"]


def _tls(trusted: bool) -> Callable[[Scenario, str], Outcome]:
    def play(scenario: Scenario, transport: str) -> Outcome:
        env = {"SSL_CERT_FILE": str(tls_files().ca)} if trusted else {}
        return one_call(ok, tls=True, env=env)(scenario, transport)

    return play


def _stream_cut_checks(result: Outcome) -> list[str]:
    found = []
    if any(getattr(e, "type", None) == "done" for e in result.notes.get("events", [])):
        found.append("the cut stream ended in a `done` event")
    details = getattr(result.error, "details", None)
    if result.error is not None and isinstance(details, dict):
        if details.get("interrupted") is not True:
            found.append(f"details lack interrupted=True: {details}")
        if details.get("partial_text") != "Hello world":
            found.append(f"details' partial_text is {details.get('partial_text')!r}")
        if "before an answer arrived" in str(result.error):
            found.append(f"the message denies the deltas that arrived: {result.error}")
    return found


def _refused(scenario: Scenario, transport: str) -> Outcome:
    with environ():
        caller = Caller(transport, f"http://127.0.0.1:{closed_port()}")
        try:
            measured = measure(caller.call)
        finally:
            caller.close()
    return outcome(
        scenario.name,
        transport,
        measured,
        0,
        waits=caller.waits,
        close_errors=caller.close_errors,
    )


def _all_attempts(result: Outcome) -> list[str]:
    attempts = getattr(result.error, "details", {}).get("attempts")
    return [] if attempts == ATTEMPTS else [f"details['attempts'] is {attempts}, not {ATTEMPTS}"]


def closed_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _second_loop(scenario: Scenario, transport: str) -> Outcome:
    with environ(), serve(ok) as server:
        caller = Caller(transport, server.url)
        try:
            measured = measure(lambda: [caller.call_on_a_new_loop(), caller.call_on_a_new_loop()])
        finally:
            caller.close()
        return outcome(
            scenario.name,
            transport,
            measured,
            len(server.requests),
            close_errors=caller.close_errors,
        )


def _threads(scenario: Scenario, transport: str) -> Outcome:
    with environ(), serve(ok) as server:
        caller = Caller(transport, server.url)
        barrier = threading.Barrier(4)
        results: list[Any] = [None] * 4

        def one(i: int) -> None:
            try:
                barrier.wait(5)
                if caller.is_async:
                    results[i] = asyncio.run(caller.client.acomplete(PROMPT))
                else:
                    results[i] = caller.client.complete(PROMPT)
            except Exception as exc:
                results[i] = exc

        def four() -> list[Any]:
            threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(4)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=DEADLINE + MARGIN + 5)
            failed = next((r for r in results if isinstance(r, BaseException)), None)
            if failed is not None:
                raise failed
            return results

        try:
            measured = measure(four)
        finally:
            caller.close()
        return outcome(
            scenario.name,
            transport,
            measured,
            len(server.requests),
            close_errors=caller.close_errors,
        )


def _closed_mid(stream: bool) -> Callable[[Scenario, str], Outcome]:
    """The client's own ``close()``, from another thread, while its call waits on a healthy
    server that is still thinking (``stream``: after the first delta reached the caller)."""

    def play(scenario: Scenario, transport: str) -> Outcome:
        go = threading.Event()  # the request arrived (a call), the first delta arrived (a stream)

        def thinking(conn: Conn, request: Request) -> bool:
            if stream:
                conn.send(head(200, (*SSE, ("connection", "close"))) + sse_delta("Hel"))
            else:
                go.set()
            conn.hold()
            return False

        with environ(), serve(thinking) as server:
            caller = Caller(transport, server.url)

            def close_when_told() -> None:
                if go.wait(HOLD):
                    caller.client.close()

            def stream_until_closed() -> list[Any]:
                caller.events = []
                if caller.is_async:

                    async def consume() -> None:
                        async for event in caller.client.astream(PROMPT):
                            caller.events.append(event)
                            go.set()

                    caller._loop().run(consume())
                else:
                    for event in caller.client.stream(PROMPT):
                        caller.events.append(event)
                        go.set()
                return caller.events

            closer = threading.Thread(target=close_when_told, daemon=True)
            closer.start()
            try:
                measured = measure(stream_until_closed if stream else caller.call)
            finally:
                go.set()
                closer.join(timeout=HOLD)
                caller.close()
            return outcome(
                scenario.name,
                transport,
                measured,
                len(server.requests),
                waits=caller.waits,
                events=caller.events,
                close_errors=caller.close_errors,
                server_errors=server.errors,
            )

    return play


def _closed_mid_checks(result: Outcome) -> list[str]:
    found = []
    if result.notes.get("waits"):
        found.append(f"a call its own client ended was retried: waits {result.notes['waits']}")
    details = getattr(result.error, "details", None) or {}
    kept = (details.get("interrupted"), details.get("partial_text"))
    if result.notes.get("events") and kept != (True, "Hel"):
        found.append(f"the closed stream lost what had arrived: {details}")
    return found


#: The subprocess of :func:`_closing`: a client used inside ``asyncio.run``, then closed one way.
CLOSING_SCRIPT: Final = """
import asyncio, sys
import httpx
from fluid_build.copilot import LLMClient
from fluid_build.copilot.call.envelope import RetryEnvelope

origin, transport, how, key = sys.argv[1:5]
env, pools = {}, {}
if transport == "async-httpx":
    env["FLUID_LLM_TRANSPORT"] = "httpx"
elif transport == "async-aiohttp":
    env["FLUID_LLM_TRANSPORT"] = "aiohttp"
else:
    pools["async_http_client"] = httpx.AsyncClient()
client = LLMClient(
    "openai", "gpt-4o-mini", api_key=key, base_url=origin + "/v1", deadline=10.0,
    envelope=RetryEnvelope(cooldown=None), env=env, **pools,
)

async def main():
    if how == "async-with":
        async with client:
            return (await client.acomplete("hi")).text
    return (await client.acomplete("hi")).text

if how == "by-hand":  # no asyncio.run: loops made and closed by hand, nothing shuts them down
    for _ in range(3):
        loop = asyncio.new_event_loop()
        text = loop.run_until_complete(main())
        loop.close()
    import gc
    gc.collect()  # what the closed loops left is reported now, not at exit
else:
    text = asyncio.run(main())
if how == "close":
    client.close()
print(text)
"""


def _closing(how: str) -> Callable[[Scenario, str], Outcome]:
    def play(scenario: Scenario, transport: str) -> Outcome:
        with environ(), serve(ok) as server:
            # ResourceWarnings shown: a pool of fluid's left to the collector prints one.
            # (The script never closes a caller's own AsyncClient: that one is the caller's.)
            shown = ["-W", "always::ResourceWarning"] if transport != "caller-async" else []
            command = [sys.executable, *shown, "-c", CLOSING_SCRIPT]
            command += [server.url, transport, how, KEY]

            def run_script() -> subprocess.CompletedProcess[str]:
                return subprocess.run(
                    command, capture_output=True, text=True, timeout=60, check=False
                )

            measured = measure(run_script)
            done = measured.value
            failed = isinstance(done, subprocess.CompletedProcess) and (
                done.returncode or done.stdout.strip() != "ok" or done.stderr
            )
            if failed:
                measured.error = RuntimeError(
                    f"exit {done.returncode}, stdout {done.stdout.strip()!r}, "
                    f"stderr {done.stderr.strip()[-800:]!r}"
                )
            result = outcome(scenario.name, transport, measured, len(server.requests))
            if isinstance(done, subprocess.CompletedProcess) and done.stderr:
                result.code = "stderr"
            return result

    return play


NETWORK: Final = "llm.network_error"
DEADLINE_CODE: Final = "llm.deadline_exceeded"
TOO_LARGE: Final = "llm.response_too_large"
MALFORMED: Final = "llm.malformed_response"


_BASE_SCENARIOS: Final[tuple[Scenario, ...]] = (
    Scenario("ok", "ok", None, 1, one_call(ok), about="a normal chat completion"),
    Scenario(
        "drip-body", DEADLINE_CODE, False, 1, one_call(drip_body), about="body 1 byte / 0.5 s"
    ),
    Scenario(
        "drip-head",
        DEADLINE_CODE,
        False,
        1,
        one_call(drip_head),
        about="status line and headers 1 byte / 0.5 s (finding 2)",
    ),
    Scenario("silent", DEADLINE_CODE, False, 1, one_call(silent), about="never answers"),
    Scenario(
        "endless-sse",
        DEADLINE_CODE,
        False,
        1,
        one_call(endless_sse, stream=True),
        about="a delta every 0.05 s forever",
    ),
    Scenario(
        "endless-sse-line",
        TOO_LARGE,
        False,
        1,
        one_call(endless_sse_line, stream=True),
        about="one data: line that never ends (the per-event limit)",
    ),
    Scenario(
        "gzip-bomb",
        TOO_LARGE,
        False,
        1,
        one_call(encoded(gzip_bomb, ("gzip",))),
        about="gzip, 512 MiB inflated",
    ),
    Scenario(
        "stacked-gzip-bomb",
        TOO_LARGE,
        False,
        1,
        one_call(encoded(stacked_bomb, ("gzip, gzip",))),
        about="Content-Encoding: gzip, gzip (finding 1)",
    ),
    Scenario(
        "stacked-gzip-bomb-twice",
        TOO_LARGE,
        False,
        1,
        one_call(encoded(stacked_bomb, ("gzip", "gzip"))),
        about="Content-Encoding: gzip given twice (finding 1)",
    ),
    Scenario(
        "gzip-identity-bomb",
        TOO_LARGE,
        False,
        1,
        one_call(encoded(gzip_bomb, ("gzip, identity",))),
        about="Content-Encoding: gzip, identity (finding 1)",
    ),
    Scenario(
        "unknown-encoding-br",
        MALFORMED,
        False,
        1,
        one_call(encoded(lambda: ANSWER, ("br",))),
        about="Content-Encoding: br over a plain JSON body: refused, never passed through",
    ),
    Scenario(
        "unknown-encoding-zstd",
        MALFORMED,
        False,
        1,
        one_call(encoded(lambda: ANSWER, ("zstd",))),
        about="Content-Encoding: zstd over a plain JSON body",
    ),
    Scenario(
        "malformed-json",
        MALFORMED,
        True,
        ATTEMPTS,
        one_call(respond(200, b'{"choices": [')),
        about="200 with a cut JSON body: retried per policy",
    ),
    Scenario(
        "refused",
        NETWORK,
        True,
        0,
        _refused,
        check=_all_attempts,
        about="nothing listening",
    ),
    Scenario(
        "reset-mid-body",
        NETWORK,
        True,
        ATTEMPTS,
        one_call(reset_mid_body),
        about="head and half the body, then RST",
    ),
    Scenario(
        "bad-status-line",
        NETWORK,
        True,
        ATTEMPTS,
        one_call(bad_status_line),
        about="HTTP/1.1 abc (finding 3)",
    ),
    Scenario(
        "closed-mid-headers",
        NETWORK,
        True,
        ATTEMPTS,
        one_call(closed_mid_headers),
        about="status line and the echoed key, then FIN (finding 3)",
    ),
    Scenario(
        "long-header-line",
        "ok",
        None,
        1,
        one_call(long_header_line),
        about="a 10 KiB header line (finding 3)",
    ),
    Scenario(
        "redirect-307",
        "llm.bad_endpoint",
        False,
        1,
        _redirected("openai"),
        transports=TRANSPORTS + FOLLOWING,
        check=_redirect_checks,
        about="307 to another origin: never followed (finding 6)",
    ),
    Scenario(
        "redirect-307-anthropic",
        "llm.bad_endpoint",
        False,
        1,
        _redirected("anthropic"),
        transports=TRANSPORTS + FOLLOWING,
        check=_redirect_checks,
        about="the same with x-api-key (finding 6)",
    ),
    Scenario(
        "cookie",
        "ok",
        None,
        2,
        _cookie,
        check=_cookie_checks,
        about="Set-Cookie on the first answer; the second request carries none (finding 6)",
    ),
    Scenario(
        "proxy",
        "ok",
        None,
        1,
        _proxied(),
        check=_proxy_checks,
        about="HTTP(S)_PROXY: the call goes through the proxy",
    ),
    Scenario(
        "proxy-no-proxy",
        "ok",
        None,
        1,
        _proxied(no_proxy=True),
        check=_proxy_checks,
        about="NO_PROXY=127.0.0.1: the call goes direct",
    ),
    Scenario(
        "proxy-connect-tls",
        "ok",
        None,
        1,
        _proxied(tls=True),
        check=_proxy_checks,
        about="HTTPS_PROXY and an https provider: a CONNECT tunnel, SSL_CERT_FILE trusted",
    ),
    Scenario(
        "tls-untrusted",
        "llm.tls_error",
        False,
        0,
        _tls(trusted=False),
        about="a self-signed server not trusted",
    ),
    Scenario(
        "tls-trusted",
        "ok",
        None,
        1,
        _tls(trusted=True),
        about="the same with SSL_CERT_FILE naming its CA",
    ),
    Scenario(
        "stream-cut",
        NETWORK,
        True,
        1,
        one_call(stream_cut(chunked=False), stream=True),
        check=_stream_cut_checks,
        about="two deltas, then FIN: no finish, no [DONE] (finding 5)",
    ),
    Scenario(
        "stream-cut-chunked",
        NETWORK,
        True,
        1,
        one_call(stream_cut(chunked=True), stream=True),
        check=_stream_cut_checks,
        about="the same over chunked encoding (finding 5)",
    ),
    Scenario(
        "second-event-loop",
        "ok",
        None,
        2,
        _second_loop,
        # A caller's own httpx.AsyncClient belongs to the loop it first ran in (httpx's
        # rule, docs/transports.md): fluid makes a pool per loop only of its own.
        transports=FLUID_ASYNC_TRANSPORTS,
        about="asyncio.run(client.acomplete()) twice on one client (finding 4)",
    ),
    *(
        Scenario(
            f"close-silently-{how}",
            "ok",
            None,
            1,
            _closing(how),
            transports=ASYNC_TRANSPORTS,
            bound=None,
            about=f"a subprocess: a client used in asyncio.run, then {what}; stderr empty",
        )
        for how, what in (
            ("close", "client.close()"),
            ("unclosed", "never closed"),
            ("async-with", "async with"),
        )
    ),
    Scenario(
        "close-silently-by-hand",
        "ok",
        None,
        3,
        _closing("by-hand"),
        # A caller's own AsyncClient is bound to its first loop: fluid's pools only.
        transports=FLUID_ASYNC_TRANSPORTS,
        bound=None,
        about="a subprocess: new_event_loop(), run_until_complete(acomplete()), loop.close(), "
        "three times, no asyncio.run; stderr empty with ResourceWarnings shown "
        "(issue 32 item 14)",
    ),
    Scenario(
        "closed-mid-call",
        "llm.client_closed",
        False,
        1,
        _closed_mid(stream=False),
        # LLMClient.close() closes fluid's own pools; a caller's pool is the caller's to close.
        transports=FLUID_TRANSPORTS,
        check=_closed_mid_checks,
        about="the client's close() from another thread while the server thinks: not the "
        "provider's failure, not retried (issue 32 item 13)",
    ),
    Scenario(
        "closed-mid-stream",
        "llm.client_closed",
        False,
        1,
        _closed_mid(stream=True),
        transports=FLUID_TRANSPORTS,
        check=_closed_mid_checks,
        about="the same after a stream's first delta: the delta is kept (issue 32 item 13)",
    ),
    Scenario(
        "threads",
        "ok",
        None,
        4,
        _threads,
        transports=THREAD_TRANSPORTS,
        about="4 threads, one client (async: asyncio.run in each)",
    ),
)

#: The phase limits of the phase scenarios (issue 33 item 2): tight, so that loopback
#: silence, the only real waiting, stays short.
PHASES: Final = {"connect_timeout": 0.2, "first_token_timeout": 0.2, "idle_timeout": 0.2}


def _phase_check(phase: str, said: bool) -> Callable[[Outcome], list[str]]:
    """The error names ``phase`` and whether any byte of the answer's body came (``said``)."""

    def check(result: Outcome) -> list[str]:
        details = getattr(result.error, "details", None) or {}
        found = []
        if details.get("phase") != phase:
            found.append(f"details['phase'] is {details.get('phase')!r}, not {phase!r}")
        received = details.get("bytes_received")
        if not isinstance(received, int) or (received > 0) != said:
            found.append(f"details['bytes_received'] is {received!r} (said anything: {said})")
        return found

    return check


def _full_backlog(scenario: Scenario, transport: str) -> Outcome:
    """A listener whose accept queue is full and never drained: the kernel drops the SYN,
    so the connection never opens (a host that is down, on loopback)."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    fillers: list[socket.socket] = []
    try:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        for _ in range(3):
            filler = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            filler.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                filler.connect(("127.0.0.1", port))
            fillers.append(filler)
        with environ():
            caller = Caller(transport, f"http://127.0.0.1:{port}", phases=PHASES)
            try:
                measured = measure(caller.call)
            finally:
                caller.close()
    finally:
        for filler in fillers:
            filler.close()
        listener.close()
    return outcome(scenario.name, transport, measured, 0, close_errors=caller.close_errors)


def _answered(result: Outcome) -> list[str]:
    events = result.notes.get("events") or []
    done = [e for e in events if getattr(e, "type", None) == "done"]
    return [] if done else [f"no done event: {events}"]


#: Each phase limit, on every transport (issue 33 item 2); 3 attempts of 0.2 s bound them.
PHASE_SCENARIOS: Final[tuple[Scenario, ...]] = (
    Scenario(
        "phase-connect",
        "llm.timeout",
        True,
        0,
        _full_backlog,
        check=_phase_check("connect", said=False),
        about="a full accept queue: the connection never opens; the connect limit ends it",
    ),
    Scenario(
        "phase-first-token-silent",
        "llm.timeout",
        True,
        ATTEMPTS,
        one_call(silent, phases=PHASES),
        check=_phase_check("first_token", said=False),
        about="accepts, reads the request, never answers: the first-token limit, not the deadline",
    ),
    Scenario(
        "phase-slow-first-byte",
        "llm.timeout",
        True,
        ATTEMPTS,
        one_call(slow_first_byte, phases=PHASES),
        check=_phase_check("first_token", said=False),
        about="the whole answer after 1 s of silence: past the 0.2 s first-token limit",
    ),
    Scenario(
        "phase-idle-mid-body",
        "llm.timeout",
        True,
        ATTEMPTS,
        one_call(stall_mid_body, phases=PHASES),
        check=_phase_check("idle", said=True),
        about="head and half the body, then silence: the idle limit",
    ),
    Scenario(
        "phase-stream-no-event",
        "llm.timeout",
        True,
        ATTEMPTS,
        one_call(stall_before_events, stream=True, phases=PHASES),
        check=_phase_check("first_token", said=False),
        about="a stream's head, then nothing: still the first token's wait",
    ),
    Scenario(
        "phase-idle-mid-stream",
        "llm.timeout",
        True,
        1,
        one_call(stall_mid_stream, stream=True, phases=PHASES),
        check=_phase_check("idle", said=True),
        about="a delta, then silence with the connection open: the idle limit (not retried: "
        "the caller has text)",
    ),
    Scenario(
        "phase-keepalive-thinking",
        "ok",
        None,
        1,
        one_call(
            keepalive_thinking,
            stream=True,
            phases={**PHASES, "first_token_timeout": 2.0, "idle_timeout": 0.4},
        ),
        check=_answered,
        about="0.6 s of keep-alives before the first delta: within the first-token limit, "
        "each gap within the idle limit",
    ),
    Scenario(
        "phase-stream-thinks",
        "ok",
        None,
        1,
        one_call(
            thinking_stream,
            stream=True,
            phases={**PHASES, "first_token_timeout": 2.0},
        ),
        check=_answered,
        about="a stream's head, 0.5 s of silence, then the answer: the first event is the "
        "first token's (2 s), not the idle limit's (0.2 s)",
    ),
)

SCENARIOS: Final = (*_BASE_SCENARIOS, *PHASE_SCENARIOS)

BY_NAME: Final = {scenario.name: scenario for scenario in SCENARIOS}


def cases() -> list[tuple[Scenario, str]]:
    """Every (scenario, transport) pair the suite runs."""
    return [(s, t) for s in SCENARIOS for t in s.transports]


def _collect() -> None:
    # Twice: an aiohttp session's finalizer lets its connector and transports go on the next.
    gc.collect()
    gc.collect()


def _release_frames(error: BaseException | None) -> None:
    """Clear the locals of the frames an error's chain went through (its tracebacks still
    format), so that pools they held are collected, and reported, with their scenario."""
    seen: set[int] = set()
    todo = [error]
    while todo:
        link = todo.pop()
        if link is None or id(link) in seen:
            continue
        seen.add(id(link))
        if link.__traceback__ is not None:
            with contextlib.suppress(RuntimeError):  # a frame still running keeps its locals
                traceback.clear_frames(link.__traceback__)
        todo += [link.__cause__, link.__context__]


def run(scenario: Scenario, transport: str) -> Outcome:
    """Play ``scenario`` on ``transport``; what it left unclosed is in ``notes["unclosed"]``.

    A socket, transport or session left open warns (ResourceWarning) when
    collected, or reports itself through ``sys.unraisablehook`` (aiohttp's
    "Unclosed client session"): both are recorded here, garbage collected at
    the end of the scenario, so the scenario that left them is the one told.
    """
    unclosed: list[str] = []
    gc.collect()  # what earlier code left is not this scenario's
    # Everything older is frozen: the collections below walk only what the scenario made.
    # A caller that froze the heap already (tests/test_conformance.py, once for its module)
    # keeps it frozen: a full collection of a worker's heap late in a run costs 0.3 s.
    nested = gc.get_freeze_count() > 0
    if not nested:
        gc.freeze()
    hook = sys.unraisablehook

    def unraisable(report: Any) -> None:
        unclosed.append(f"{report.exc_type.__name__}: {report.exc_value} ({report.object!r})")

    sys.unraisablehook = unraisable
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ResourceWarning)
            result = scenario.play(scenario, transport)
            _release_frames(result.error)
            _collect()
    finally:
        sys.unraisablehook = hook
        if not nested:
            gc.unfreeze()
    unclosed += [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    result.notes["unclosed"] = unclosed
    return result


def problems(scenario: Scenario, result: Outcome, logs: Sequence[str] = ()) -> list[str]:
    """How ``result`` breaks the contract for ``scenario``: sentences, empty when it keeps it."""
    found = []
    got = (result.code, result.retryable, result.requests)
    wanted = (scenario.code, scenario.retryable, scenario.requests)
    if got != wanted:
        error = result.error
        shown = f"{type(error).__name__}: {str(error)[:300]}" if error is not None else "none"
        found.append(f"(code, retryable, requests) is {got}, not {wanted}; the error: {shown}")
    if scenario.bound is not None and result.elapsed > scenario.bound:
        found.append(f"took {result.elapsed:.2f} s, over the {scenario.bound:g} s bound")
    if result.rss_mb >= RSS_LIMIT_MB:
        found.append(f"RSS grew {result.rss_mb:.0f} MB (bound {RSS_LIMIT_MB:g} MB)")
    leaks = secret_leaks(result.error, [*result.logs, *logs])
    if leaks:
        found.append(f"the key shows in {len(leaks)} place(s): {leaks[:6]}")
    if scenario.check is not None:
        found.extend(scenario.check(result))
    if result.notes.get("unclosed"):
        unclosed = result.notes["unclosed"]
        found.append(f"left {len(unclosed)} resource(s) unclosed: {unclosed[:3]}")
    if result.notes.get("close_errors"):
        found.append(f"closing the client failed: {result.notes['close_errors']}")
    if result.notes.get("server_errors"):
        found.append(f"the hostile server itself failed: {result.notes['server_errors']!r}")
    return found
