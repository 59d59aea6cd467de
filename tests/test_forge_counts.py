"""`fluid forge` counts the requests it sent, with or without ``--agent-loop``.

The console script runs in a fresh HOME against a model on loopback that
answers one request with a 429 or a 500 (with ``retry-after-ms: 0``, so the
retry waits no time), then answers as a provider that behaves. The model calls
printed and the receipt's ``attempts`` must equal the requests the server got,
the retried one included, on both paths.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from fluid_build.cli.forge import EXAMPLE_INTENT
from fluid_build.copilot.agents.errors import ProviderServerError
from fluid_build.copilot.llm.types import Completion
from fluid_build.forge.app import StageRecord, _Counted
from tests.docs_model import Model, Request
from tests.test_cli_conventions import FLUID, fresh_env

OPENAI_KEY = "sk-test-Zq8mN4pL2vX9wR7tY5uK3"


@dataclass
class Script:
    """A provider that refuses the requests numbered in ``fail`` (1-based) once each."""

    status: int
    fail: set[int]
    model: Model = field(default_factory=Model)
    posts: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("content-length") or 0))
        body = json.loads(raw) if raw else {}
        script = self.server.script
        with script.lock:
            script.posts.append(body)
            number = len(script.posts)
        headers = {"content-type": "application/json"}
        if number in script.fail:
            status = script.status
            payload: dict[str, Any] = {"error": {"message": "try again", "type": "server_error"}}
            headers["retry-after-ms"] = "0"  # a retry that waits no time
        else:
            status, payload = script.model.answer(
                Request("POST", self.path, dict(self.headers.items()), body)
            )
        data = json.dumps(payload).encode()
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, script: Script) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.script = script


@contextmanager
def provider(script: Script) -> Iterator[str]:
    server = _Server(script)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.daemon = True
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def forge(tmp_path: Path, base_url: str, *flags: str) -> tuple[int, str, dict[str, Any]]:
    home = tmp_path / "home"
    home.mkdir()
    (home / "intent.yaml").write_bytes(EXAMPLE_INTENT.read_bytes())
    env = fresh_env(
        home,
        OPENAI_API_KEY=OPENAI_KEY,
        OPENAI_BASE_URL=base_url,
        NO_PROXY="127.0.0.1,localhost",
    )
    assert FLUID is not None
    done = subprocess.run(
        [FLUID, "forge", "intent.yaml", "--out", "out", *flags],
        env=env,
        cwd=home,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    text = done.stdout + done.stderr
    receipt_path = home / "out" / ".fluid" / "forge-receipt.json"
    receipt = json.loads(receipt_path.read_text()) if receipt_path.exists() else {}
    return done.returncode, text, receipt


def printed_calls(text: str) -> int:
    found = re.search(r"\((\d+) model calls?,", text)
    assert found, text
    return int(found.group(1))


@pytest.mark.parametrize("status", [429, 500])
@pytest.mark.parametrize("flags", [(), ("--agent-loop",)], ids=["plain", "agent-loop"])
@pytest.mark.parametrize("failing", [1, 2], ids=["plan-retried", "generate-retried"])
def test_model_calls_are_the_requests_the_server_received(
    tmp_path: Path, status: int, flags: tuple[str, ...], failing: int
) -> None:
    script = Script(status, {failing})
    with provider(script) as base_url:
        code, text, receipt = forge(tmp_path, base_url, *flags)

    assert code == 0, text
    sent = len(script.posts)
    assert sent == 3, "plan and generate, one of them sent twice"
    assert printed_calls(text) == sent
    assert receipt["attempts"] == sent
    assert sum(stage["llm_calls"] for stage in receipt["stages"]) == sent
    retried = receipt["stages"][failing - 1]
    assert retried["llm_calls"] == 2, receipt["stages"]


def test_both_paths_count_alike_without_a_retry(tmp_path: Path) -> None:
    counts = []
    for flags in ((), ("--agent-loop",)):
        place = tmp_path / ("loop" if flags else "plain")
        place.mkdir()
        script = Script(500, set())
        with provider(script) as base_url:
            code, text, receipt = forge(place, base_url, *flags)
        assert code == 0, text
        assert printed_calls(text) == receipt["attempts"] == len(script.posts)
        counts.append(receipt["attempts"])
    assert counts == [2, 2]


class _Answers:
    """A client whose calls answer after ``attempts`` requests, or fail after some."""

    model = "gpt-4o"

    def __init__(self, attempts: int, failed_after: int | None = None) -> None:
        self.attempts = attempts
        self.failed_after = failed_after

    def _answer(self) -> Completion:
        if self.failed_after is not None:
            raise ProviderServerError(
                "gave up", status_code=500, details={"attempts": self.failed_after}
            )
        return Completion(text="{}", provider="openai", model=self.model, attempts=self.attempts)

    def complete(self, messages: Any, **options: Any) -> Completion:
        return self._answer()

    async def acomplete(self, messages: Any, **options: Any) -> Completion:
        return self._answer()


def test_the_counter_counts_sync_and_async_calls_and_failed_ones() -> None:
    """The agent loop's async shell calls ``acomplete``: it counts the same way."""
    stage = StageRecord("generate")
    counted = _Counted(_Answers(2), stage)  # type: ignore[arg-type]
    counted.complete([{"role": "user", "content": "hi"}])
    asyncio.run(counted.acomplete([{"role": "user", "content": "hi"}]))
    assert stage.llm_calls == 4
    assert counted.model == "gpt-4o"  # everything else is the client's

    failing = _Counted(_Answers(1, failed_after=3), stage)  # type: ignore[arg-type]
    with pytest.raises(ProviderServerError):
        failing.complete([{"role": "user", "content": "hi"}])
    with pytest.raises(ProviderServerError):
        asyncio.run(failing.acomplete([{"role": "user", "content": "hi"}]))
    assert stage.llm_calls == 10
