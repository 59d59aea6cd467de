"""Hermetic tests: no provider keys from the developer's shell, no real network."""

from __future__ import annotations

import gc
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

# Deterministic by default, as every test here must be; HYPOTHESIS_PROFILE=explore
# searches 20,000 fresh examples per property (`nox -s fuzz`).
settings.register_profile("default", max_examples=300, derandomize=True, database=None)
settings.register_profile("explore", max_examples=20_000, derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


def cores() -> int:
    """The cores this process may run on (a container's limit, not the host's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on every platform
        return os.cpu_count() or 1


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: one worker more than the cores. A fifth of the suite's time is spent
    waiting (a dripping server, a deadline on a silent one, processes starting), and a
    third worker on two cores fills it: 4 min 50 s against 5 min 54 s for the whole suite
    on the 2-core machine it is developed on (docs/testing.md, "More workers than cores")."""
    return cores() + 1


_PROVIDER_ENV_PREFIXES = (
    "OPENAI_",
    "GROQ_",
    "MISTRAL_",
    "OPENROUTER_",
    "AZURE_OPENAI_",
    "ANTHROPIC_",
    "GEMINI_",
    "GOOGLE_API_KEY",
    "OLLAMA_",
    "FLUID_",
    # The presets and the clouds: a developer's real AWS or Google setup never reaches a test.
    "XAI_",
    "DEEPSEEK_",
    "TOGETHER_",
    "FIREWORKS_",
    "CEREBRAS_",
    "AWS_",
    "GOOGLE_",
    "GCLOUD_",
    "GCE_",
    "CLOUDSDK_",
    "K_SERVICE",
    "CLOUD_RUN_JOB",
    "FUNCTION_TARGET",
)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in list(os.environ):
        if name.startswith(_PROVIDER_ENV_PREFIXES):
            monkeypatch.delenv(name)
    # Anything that defaults to ~/.cache (the cooldown file) stays inside the test.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    # And ~ itself: the configuration (~/.config/fluid) and its one-time move from
    # ~/.fluid never touch the home of whoever runs the suite. Not created here.
    monkeypatch.setenv("HOME", str(tmp_path / "test-home"))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    # No test asks a cloud's metadata service unless it serves one on loopback itself.
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.fixture(autouse=True)
def _no_remote_network(monkeypatch: pytest.MonkeyPatch) -> None:
    real_connect = socket.socket.connect

    def guarded(self: socket.socket, address: object) -> object:
        host = address[0] if isinstance(address, tuple) else address
        remote = isinstance(host, str) and host not in {"127.0.0.1", "::1", "localhost"}
        if remote and self.family in (socket.AF_INET, socket.AF_INET6):
            raise AssertionError(f"test tried to reach the network: {address!r}")
        return real_connect(self, address)  # type: ignore[arg-type]

    monkeypatch.setattr(socket.socket, "connect", guarded)


@pytest.fixture(autouse=True, scope="module")
def _collect_leaks() -> Iterator[None]:
    # An unclosed socket or client warns when it is garbage collected; collect
    # at the end of each module, so the warning fails in the module that
    # leaked it, not at some later, unrelated test.
    yield
    gc.collect()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real redis-server for this test session (CI installs it; skipped only where absent)."""
    from tests.redis_server import redis_binary, running_redis

    if redis_binary() is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server); CI runs these")
    workdir: Path = tmp_path_factory.mktemp("redis")
    with running_redis(workdir) as url:
        yield url
