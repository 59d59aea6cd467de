"""A raw TCP server on 127.0.0.1 that misbehaves on purpose, for real-socket tests."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

Handler = Callable[[socket.socket], None]


def read_request(conn: socket.socket) -> bytes:
    """Read one request, headers and body (by content-length), so that closing
    the socket later does not reset the connection over unread bytes."""
    conn.settimeout(2.0)
    data = b""
    try:
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return data
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value.strip() or 0)
        while len(body) < length:
            chunk = conn.recv(65536)
            if not chunk:
                break
            body += chunk
    except OSError:
        pass
    return data


def hold(conn: socket.socket) -> None:
    """Keep the connection open, reading, until the client hangs up."""
    conn.settimeout(5.0)
    with contextlib.suppress(OSError):
        while conn.recv(65536):
            pass


def silent(conn: socket.socket) -> None:
    """Read the request and never answer: the client's read timeout fires."""
    read_request(conn)
    hold(conn)


def reset(conn: socket.socket) -> None:
    """Read the request, then reset the connection (RST, not FIN)."""
    read_request(conn)
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def truncated(conn: socket.socket) -> None:
    """Promise 1,000 bytes of JSON, send 20, hang up."""
    read_request(conn)
    conn.sendall(
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n"
        b'{"choices": [{"mess'
    )


def respond(status: int, body: bytes, headers: dict[str, str] | None = None) -> Handler:
    def handler(conn: socket.socket) -> None:
        read_request(conn)
        lines = [f"HTTP/1.1 {status} X", f"content-length: {len(body)}", "connection: close"]
        lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
        conn.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)

    return handler


@contextmanager
def serve(handler: Handler) -> Iterator[str]:
    """Run ``handler`` for each connection; yield the base URL."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.05)
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn, contextlib.suppress(OSError):
                handler(conn)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(timeout=5)
        server.close()


def closed_port() -> int:
    """A loopback port with nothing listening on it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


# -- a scripted HTTP server ----------------------------------------------------

Reply = tuple[int, dict[str, str], bytes]


@dataclass
class Seen:
    """One request as the server saw it."""

    at: float  # time.time() on arrival
    path: str
    headers: dict[str, str]
    body: bytes = b""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _ScriptedServer

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length)
        seen = Seen(time.time(), self.path, {k.lower(): v for k, v in self.headers.items()}, body)
        with self.server.lock:
            self.server.seen.append(seen)
        status, headers, body = self.server.reply(seen)
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


class _ScriptedServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, reply: Callable[[Seen], Reply]) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.reply = reply
        self.seen: list[Seen] = []
        self.lock = threading.Lock()


@contextmanager
def http_server(reply: Callable[[Seen], Reply]) -> Iterator[_ScriptedServer]:
    """A real HTTP/1.1 server on 127.0.0.1 whose answers ``reply`` decides."""
    server = _ScriptedServer(reply)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.daemon = True
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def base_url(server: _ScriptedServer) -> str:
    host, port = server.server_address[:2]
    return f"http://{host!s}:{port}"


def sse_then(action: str, first: bytes) -> Handler:
    """Answer 200 text/event-stream, send ``first``, then "reset" (RST) or "stall"."""

    def handler(conn: socket.socket) -> None:
        read_request(conn)
        conn.sendall(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n" + f"{len(first):x}\r\n".encode() + first + b"\r\n"
        )
        if action == "reset":
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            return
        hold(conn)

    return handler
