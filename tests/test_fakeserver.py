"""`python -m fluid_build.fakeserver`: the OpenAI-style echo server docs/batch.md starts."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator

import httpx
import pytest

from fluid_build import LLMClient
from fluid_build.fakeserver import HOST, MODEL, FakeServer


@pytest.fixture
def server() -> Iterator[FakeServer]:
    with FakeServer(0) as running:
        thread = threading.Thread(target=running.serve_forever, kwargs={"poll_interval": 0.05})
        thread.start()
        try:
            yield running
        finally:
            running.shutdown()
            thread.join(10)


def test_it_listens_on_loopback_only(server: FakeServer) -> None:
    assert server.server_address[0] == HOST == "127.0.0.1"
    assert server.base_url.startswith("http://127.0.0.1:")


def test_the_client_gets_each_prompt_echoed_with_usage(server: FakeServer) -> None:
    env = {"OPENAI_BASE_URL": server.base_url}
    with LLMClient("openai_compatible", MODEL, env=env) as client:
        done = client.complete("Name a colour.")
    assert done.text == "echo: Name a colour."
    assert (done.usage.input_tokens, done.usage.output_tokens) == (3, 4)


def test_models_name_the_window_and_other_routes_are_404(server: FakeServer) -> None:
    with httpx.Client(base_url=server.base_url) as http:
        models = http.get("/models").json()
        assert models["data"] == [{"id": "echo", "object": "model", "max_model_len": 32768}]
        assert http.get("/nowhere").status_code == 404
        assert http.post("/embeddings", json={}).status_code == 404
        streamed = http.post("/chat/completions", json={"model": "echo", "stream": True})
        assert streamed.status_code == 400
        assert "does not stream" in streamed.json()["error"]["message"]
        assert http.post("/chat/completions", content=b"{nope").status_code == 400


def test_fail_every_answers_every_nth_request_500() -> None:
    with FakeServer(0, fail_every=2) as running:
        thread = threading.Thread(target=running.serve_forever, kwargs={"poll_interval": 0.05})
        thread.start()
        try:
            with httpx.Client(base_url=running.base_url) as http:
                body = {"model": "echo", "messages": [{"role": "user", "content": "hi"}]}
                statuses = [http.post("/chat/completions", json=body).status_code for _ in "1234"]
        finally:
            running.shutdown()
            thread.join(10)
    assert statuses == [200, 500, 200, 500]


def test_a_bad_port_is_a_usage_error_not_a_traceback() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "fluid_build.fakeserver", "--port", "70000"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "--port is 0 to 65535" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_port_in_use_is_one_line_and_exit_1() -> None:
    with FakeServer(0) as taken:
        port = taken.server_address[1]
        done = subprocess.run(
            [sys.executable, "-m", "fluid_build.fakeserver", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.returncode == 1
    assert (
        done.stderr.strip()
        == f"fakeserver: cannot listen on 127.0.0.1:{port} (Address already in use)"
    )
