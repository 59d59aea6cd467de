"""Importing the client loads httpx and pydantic, not what only some calls or the CLI use.

Checked by module set in a fresh interpreter, never by time: a busy machine
moves timings, not ``sys.modules``.
"""

from __future__ import annotations

import json
import subprocess
import sys

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
    assert not added & set(LAZY), sorted(added & set(LAZY))
    assert {"pydantic", "fluid_build"} <= added
    assert "httpx" in with_httpx


def test_a_store_loads_sqlite_only_when_it_is_used() -> None:
    _, added = loaded_after(
        "from fluid_build.copilot.health.cooldown import cooldown_store_from_url\n"
        "import tempfile\n"
        "store = cooldown_store_from_url(tempfile.mkdtemp() + '/c.sqlite3')\n"
        "assert 'sqlite3' not in sys.modules\n"
        "store.remaining('k', 0.0)"
    )
    assert "sqlite3" in added
