"""Quality checks on a real small model: `nox -s realserver` only (REALSERVER_MODEL).

Not collected by a plain `python -m pytest` (the file name does not start with
``test_``): a random-weight model cannot pass them, and CI runs no skipped test.
The session gives this file by path, with the model it assembled.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import BaseModel

from fluid_build.copilot import LLMClient
from tests.llamacpp_server import LlamaServer, llamacpp_server

pytestmark = pytest.mark.realserver


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    model = os.environ.get("REALSERVER_MODEL")
    assert model, "run through `nox -s realserver`, which sets REALSERVER_MODEL"
    with llamacpp_server(Path(model), tmp_path_factory.mktemp("quality"), n_ctx=2048) as running:
        yield running


class Capital(BaseModel):
    country: str
    capital: str


def test_a_real_model_answers_in_words(server: LlamaServer) -> None:
    with LLMClient("llamacpp", "gemma", base_url=server.base_url, env={}) as client:
        done = client.complete("Name one colour of the sky. One word.", max_output_tokens=16)
    assert any(ch.isalpha() for ch in done.text)
    assert done.finish_reason in {"stop", "length"}


def test_a_real_model_fills_a_schema(server: LlamaServer) -> None:
    with LLMClient("llamacpp", "gemma", base_url=server.base_url, env={}) as client:
        done = client.complete(
            "What is the capital of France? Answer with the country and its capital.",
            response_model=Capital,
            max_output_tokens=64,
        )
    assert isinstance(done.parsed, Capital)
    assert "paris" in done.parsed.capital.lower()


def test_a_real_stream(server: LlamaServer) -> None:
    with LLMClient("llamacpp", "gemma", base_url=server.base_url, env={}) as client:
        events = list(client.stream("Count from one to five.", max_output_tokens=32))
    completion = events[-1].completion
    assert completion is not None
    assert completion.text == "".join(e.text or "" for e in events if e.type == "text")
    assert any(ch.isalpha() or ch.isdigit() for ch in completion.text)
