"""A caller's own sync pool: the answer's head awaited on a daemon thread, given up at the deadline.

fluid cannot narrow the socket waits of a pool it did not build, so call/drive.py
waits for the head on a worker thread for no longer than the call's deadline
leaves (docs/transports.md, ``caller-sync``). A head given up on must hold neither
a worker (the next call would queue behind it and miss its own deadline) nor the
process's exit (a script, or ``fluid`` after Ctrl-C, would hang until the server
answered).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from fluid_build.copilot.call import drive
from fluid_build.copilot.call.drive import DEADLINE_EXTENSION
from fluid_build.copilot.call.wire import Deadline

URL = "http://127.0.0.1:9/v1/chat/completions"


def _request(deadline: Deadline) -> httpx.Request:
    return httpx.Request("POST", URL, extensions={DEADLINE_EXTENSION: deadline})


@pytest.fixture
def held() -> Iterator[tuple[httpx.Client, threading.Event]]:
    """A caller's pool whose answers come only once the test lets them."""
    release = threading.Event()

    def answer(request: httpx.Request) -> httpx.Response:
        release.wait(60)
        return httpx.Response(200, json={})

    with httpx.Client(transport=httpx.MockTransport(answer)) as pool:
        yield pool, release
        release.set()


def test_heads_given_up_on_leave_every_worker_to_the_next_call(
    held: tuple[httpx.Client, threading.Event],
) -> None:
    pool, _ = held
    late: list[BaseException] = []

    def give_up() -> None:
        # No time left: each head is waited for only the shells' moment of grace.
        with pytest.raises(httpx.ReadTimeout) as raised:
            drive.send(pool, _request(Deadline(0.0)))
        late.append(raised.value)

    # One more than the workers: with a worker each still held, the next call would queue.
    threads = [threading.Thread(target=give_up) for _ in range(drive._HEADS + 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(late) == drive._HEADS + 1

    with httpx.Client(transport=httpx.MockTransport(lambda r: httpx.Response(200))) as quick:
        started = time.monotonic()
        answer = drive.send(quick, _request(Deadline(20.0)))
        answer.close()
    assert answer.status_code == 200
    assert time.monotonic() - started < 10
    # Every thread still waiting for a head is a daemon: none holds the process's exit.
    waiting = [t for t in threading.enumerate() if t.name.startswith("fluid-head")]
    assert waiting
    assert all(t.daemon for t in waiting)


_PROGRAM = """
import signal
import httpx
from fluid_build.copilot.client import LLMClient

# Ctrl-C raises KeyboardInterrupt whatever the runner's SIGINT (a background job's is ignored).
signal.signal(signal.SIGINT, signal.default_int_handler)
# The caller's pool, left open at exit; Ctrl-C comes while the call waits for the head.
client = LLMClient.from_env(http_client=httpx.Client())
try:
    client.complete("hi")
except KeyboardInterrupt:
    print("interrupted", flush=True)
"""


def test_ctrl_c_mid_call_on_its_own_pool_lets_the_program_exit(tmp_path: Path) -> None:
    # A server that reads the request and never answers.
    with socket.create_server(("127.0.0.1", 0)) as silent:
        port = silent.getsockname()[1]
        env = {
            **os.environ,
            "FLUID_LLM_PROVIDER": "openai",
            "OPENAI_API_KEY": "sk-test-HEADS0123456789abcdefghij",
            "OPENAI_BASE_URL": f"http://127.0.0.1:{port}/v1",
            "FLUID_COOLDOWN_URL": "memory://",
            "HOME": str(tmp_path),
        }
        process = subprocess.Popen(
            [sys.executable, "-c", _PROGRAM],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            silent.settimeout(60)
            connection, _ = silent.accept()
            with connection:
                connection.settimeout(60)
                assert connection.recv(65536).startswith(b"POST /v1/chat/completions")
                process.send_signal(signal.SIGINT)
                # The call's timeouts are a minute and more: a worker joined at exit, still
                # waiting for the head, would hold the program that long.
                out, err = process.communicate(timeout=20)
        finally:
            if process.poll() is None:
                process.kill()
                process.communicate()
    assert process.returncode == 0, err
    assert out.strip() == "interrupted", out + err
