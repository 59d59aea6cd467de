"""A real redis-server for the tests, on a free loopback port, in a temp dir."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def redis_binary() -> str | None:
    return shutil.which("redis-server")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _start(binary: str, port: int, workdir: Path) -> subprocess.Popen[bytes] | None:
    """redis-server on ``port``, answering PING; None if it exited (the port was taken)."""
    process = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(workdir),
            "--protected-mode",
            "yes",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 10
    while True:
        # Our process first: under pytest-xdist another worker's server may hold the port
        # (picked between our probe and redis binding it) and answer the PING below.
        if process.poll() is not None:
            return None
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2) as conn:
                conn.sendall(b"PING\r\n")
                if conn.recv(16).startswith(b"+PONG") and process.poll() is None:
                    return process
        except OSError:
            pass
        if time.monotonic() > deadline:
            _stop(process)
            raise RuntimeError(f"redis-server did not answer on port {port} within 10 s")
        time.sleep(0.02)  # noqa: real-sleep - waiting for a real server to start


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=5)


@contextmanager
def running_redis(workdir: Path) -> Iterator[str]:
    """Start redis-server on a free port (another if that one was taken); yield its URL; stop it."""
    binary = redis_binary()
    if binary is None:
        raise RuntimeError("redis-server is not installed")
    for _ in range(5):
        port = _free_port()
        process = _start(binary, port, workdir)
        if process is not None:
            break
    else:
        raise RuntimeError("redis-server could not bind a free loopback port in 5 tries")
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        _stop(process)
