"""Importing the client loads httpx and the client's module; the call path loads with a client.

The first client loads pydantic and the call path, but not what only some
calls or the CLI use; the classification tables load with the first failure.

Checked by module set in a fresh interpreter, never by time: a busy machine
moves timings, not ``sys.modules``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

# Loaded when used: tokenizing past the byte shortcut, the sqlite or Redis
# store, a YAML capability matrix, the CLI, a retry (tenacity), the first
# connection pool or wait (asyncio), telemetry when it is switched on (opentelemetry).
LAZY = (
    "tiktoken",
    "sqlite3",
    "_sqlite3",
    "redis",
    "yaml",
    "rich",
    "click",
    "tenacity",
    "asyncio",
    "opentelemetry",
)


def loaded_after(statement: str) -> tuple[set[str], set[str]]:
    """Top-level packages loaded by ``import httpx``, and those ``statement`` adds."""
    code = (
        "import json, sys\n"
        "import httpx\n"
        "base = {m.partition('.')[0] for m in sys.modules}\n"
        f"{statement}\n"
        "after = {m.partition('.')[0] for m in sys.modules}\n"
        "print(json.dumps([sorted(base), sorted(after - base)]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=120
    )
    assert done.returncode == 0, done.stderr
    base, added = json.loads(done.stdout)
    return set(base), set(added)


@pytest.mark.parametrize(
    "statement",
    ["from fluid_build.copilot import LLMClient", "from fluid_build import LLMClient"],
)
def test_the_client_import_loads_nothing_it_uses_only_later(statement: str) -> None:
    with_httpx, added = loaded_after(statement)
    # httpx 0.28 imports rich and click itself (its CLI) when they are installed.
    assert added <= {"fluid_build", "typing_extensions"}, sorted(added)
    assert "httpx" in with_httpx


ANSWER = (
    '{"id": "x", "model": "m", "choices": [{"index": 0, "finish_reason": "stop", '
    '"message": {"role": "assistant", "content": "hi"}}], '
    '"usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}'
)


def test_a_client_and_its_first_answer_load_the_call_path_but_not_the_failure_tables(
    tmp_path: Path,
) -> None:
    statement = (
        "from fluid_build.copilot import LLMClient\n"
        "answer = lambda request: httpx.Response(200, text=ANSWER)\n"
        "client = LLMClient('vllm', 'm', base_url='http://127.0.0.1:9/v1',\n"
        "    http_client=httpx.Client(transport=httpx.MockTransport(answer)),\n"
        "    capability_matrix={'context_window': 32768})\n"
        "assert client.complete('hi').text == 'hi'\n"
        "tables = ('error_classification', 'classification_rules', 'error_answers')\n"
        "loaded = [m for m in sys.modules if m.rpartition('.')[2] in tables]\n"
        "assert not loaded, loaded\n"
        "# the anthropic adapter is not this client's: it is not loaded either\n"
        "assert 'fluid_build.copilot.llm.anthropic' not in sys.modules\n"
        "# nor the strict-schema walker, which only a response_model needs\n"
        "walker = [m for m in sys.modules if m.rpartition('.')[2] in ('harden', 'codec')]\n"
        "assert not walker, walker\n"
    )
    _, added = loaded_after(
        f"ANSWER = {ANSWER!r}\nimport os\nos.environ['XDG_CACHE_HOME'] = {str(tmp_path)!r}\n"
        + statement
    )
    assert {"pydantic", "fluid_build"} <= added
    assert not added & {"tiktoken", "redis", "yaml", "tenacity", "opentelemetry"}


def test_the_client_default_concurrency_is_the_batch_one() -> None:
    from fluid_build.copilot import batch, client

    assert client.DEFAULT_CONCURRENCY == batch.DEFAULT_CONCURRENCY


def test_a_store_loads_sqlite_only_when_it_is_used() -> None:
    _, added = loaded_after(
        "from fluid_build.copilot.health.cooldown import cooldown_store_from_url\n"
        "import tempfile\n"
        "store = cooldown_store_from_url(tempfile.mkdtemp() + '/c.sqlite3')\n"
        "assert 'sqlite3' not in sys.modules\n"
        "store.remaining('k', 0.0)"
    )
    assert "sqlite3" in added
