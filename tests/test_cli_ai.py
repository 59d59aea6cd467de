"""``fluid ai setup``: storing the provider, model and key; ``--check``; the library helpers."""

from __future__ import annotations

import errno
import json
import logging
import os
import select
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import keyring
import pytest
import respx
from click.testing import CliRunner
from keyring.backend import KeyringBackend
from keyring.backends import fail

from fluid_build.aiconfig import (
    apply_stored_config,
    config_path,
    load_ai_config,
    stored_api_key,
)
from fluid_build.cli import ai
from fluid_build.cli.exit_codes import EXIT_CODES
from fluid_build.copilot.health.cooldown import key_fingerprint
from fluid_build.copilot.llm.base import ProviderConfig
from fluid_build.copilot.llm.registry import PROVIDERS, load
from fluid_build.copilot.llm.types import CallSpec
from tests.test_cli_conventions import _AT_A_TERMINAL as AT_A_TERMINAL
from tests.test_cli_conventions import FLUID, fluid, fresh_env

OPENAI_KEY = "sk-test-Zq8mN4pL2vX9wR7tY5uK3"
ANTHROPIC_KEY = "sk-ant-api03-Hj6gF4dS2aQ9wE7rT5yU"


class MemoryKeyring(KeyringBackend):
    """A keyring that lives in a dict, for the length of one test."""

    priority = 1

    def __init__(self) -> None:
        super().__init__()
        self.passwords: dict[tuple[str, str], str] = {}

    def get_password(self, service: str, username: str) -> str | None:
        return self.passwords.get((service, username))

    def set_password(self, service: str, username: str, password: str) -> None:
        self.passwords[(service, username)] = password

    def delete_password(self, service: str, username: str) -> None:
        self.passwords.pop((service, username), None)


@pytest.fixture
def home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    path = tmp_path / "fluid-home"
    monkeypatch.setenv("FLUID_HOME", str(path))
    return path


@pytest.fixture
def memory_keyring() -> Iterator[MemoryKeyring]:
    previous = keyring.get_keyring()
    backend = MemoryKeyring()
    keyring.set_keyring(backend)
    try:
        yield backend
    finally:
        keyring.set_keyring(previous)


@pytest.fixture
def no_keyring() -> Iterator[None]:
    previous = keyring.get_keyring()
    keyring.set_keyring(fail.Keyring())
    try:
        yield
    finally:
        keyring.set_keyring(previous)


def run(*args: str, input: str | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(ai.command, list(args), input=input)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# -- storing --------------------------------------------------------------------


def test_setup_stores_provider_and_model_and_the_key_in_the_keyring(
    home: Path, memory_keyring: MemoryKeyring
) -> None:
    code, out, err = run(
        "setup", "--provider", "OpenAI", "--model", "gpt-4o", input=OPENAI_KEY + "\n"
    )

    assert code == 0, err
    assert "key stored in the OS keyring" in out
    assert key_fingerprint(OPENAI_KEY) in out
    assert OPENAI_KEY not in out + err
    assert OPENAI_KEY[:12] not in out + err
    assert memory_keyring.passwords == {("fluid_build", "openai"): OPENAI_KEY}
    path = home / "ai_config.json"
    assert mode(home) == 0o700
    assert mode(path) == 0o600
    assert OPENAI_KEY not in path.read_text()
    assert json.loads(path.read_text())["provider"] == "openai"
    config = load_ai_config()
    assert (config.provider, config.model, config.key_source) == ("openai", "gpt-4o", "keyring")
    assert OPENAI_KEY not in repr(config)
    assert stored_api_key("openai") == OPENAI_KEY
    assert not list(home.glob("*.tmp"))


def test_setup_keeps_the_model_for_the_same_provider_and_drops_it_for_another(
    home: Path, memory_keyring: MemoryKeyring
) -> None:
    run("setup", "--provider", "openai", "--model", "gpt-4o", input=OPENAI_KEY + "\n")
    run("setup", "--provider", "openai", "--no-key")
    assert load_ai_config().model == "gpt-4o"

    run("setup", "--provider", "anthropic", input=ANTHROPIC_KEY + "\n")
    config = load_ai_config()
    assert (config.provider, config.model) == ("anthropic", None)
    assert config.key_sources == {"anthropic": "keyring", "openai": "keyring"}
    assert stored_api_key("openai") == OPENAI_KEY  # the other provider's key stays


def test_setup_refuses_without_a_keyring_or_the_plaintext_opt_in(
    home: Path, no_keyring: None
) -> None:
    code, out, err = run("setup", "--provider", "openai", input=OPENAI_KEY + "\n")

    assert code == EXIT_CODES["auth"]
    assert "ProviderAuthError" in err
    assert "FLUID_ALLOW_PLAINTEXT_AI_SECRETS=1" in err
    assert "export OPENAI_API_KEY" in err
    assert OPENAI_KEY not in out + err
    assert not (home / "ai_config.json").exists()


def test_setup_stores_the_key_in_plaintext_only_with_the_opt_in(
    home: Path, no_keyring: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("FLUID_ALLOW_PLAINTEXT_AI_SECRETS", "1")

    code, out, err = run("setup", "--provider", "anthropic", input=ANTHROPIC_KEY + "\n")

    assert code == 0, err
    assert "(plaintext)" in out
    assert ANTHROPIC_KEY not in out + err
    path = home / "ai_config.json"
    assert mode(path) == 0o600
    assert json.loads(path.read_text())["keys"] == {"anthropic": ANTHROPIC_KEY}
    assert load_ai_config().key_source == "file"
    assert stored_api_key("anthropic") == ANTHROPIC_KEY

    # Without the opt-in, the file's key is not used (and says why).
    monkeypatch.delenv("FLUID_ALLOW_PLAINTEXT_AI_SECRETS")
    with caplog.at_level(logging.WARNING, logger="fluid_build.config"):
        assert stored_api_key("anthropic") is None
    assert "FLUID_ALLOW_PLAINTEXT_AI_SECRETS=1 is not set" in caplog.text
    assert ANTHROPIC_KEY not in caplog.text


def test_setup_moves_a_plaintext_key_to_the_keyring_when_one_appears(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLUID_ALLOW_PLAINTEXT_AI_SECRETS", "1")
    previous = keyring.get_keyring()
    keyring.set_keyring(fail.Keyring())
    try:
        run("setup", "--provider", "openai", input=OPENAI_KEY + "\n")
        backend = MemoryKeyring()
        keyring.set_keyring(backend)
        run("setup", "--provider", "openai", input=OPENAI_KEY + "\n")
    finally:
        keyring.set_keyring(previous)
    assert OPENAI_KEY not in (home / "ai_config.json").read_text()
    assert backend.passwords[("fluid_build", "openai")] == OPENAI_KEY


@pytest.mark.parametrize(
    ("typed", "why"),
    [
        ("sk-abc def-ghijklmnop", "whitespace or control characters"),
        ("sk-abc\x07defghijklmnop", "whitespace or control characters"),
        ("sk-abc", "only 6 characters"),
        ("sk-" + "x" * 2000, "longer than 1024"),
        ("sk-abc\u2014defghijklmnop", "non-ASCII"),
        ("", "no API key was entered"),
    ],
)
def test_setup_rejects_a_malformed_key_without_echoing_it(
    home: Path, memory_keyring: MemoryKeyring, typed: str, why: str
) -> None:
    code, out, err = run("setup", "--provider", "openai", input=typed + "\n")

    assert code == EXIT_CODES["auth"]
    assert why in err
    if typed:
        assert typed not in out + err
        assert typed[:6] not in out + err.replace("'sk-'", "")
    assert memory_keyring.passwords == {}
    assert not (home / "ai_config.json").exists()


@pytest.mark.parametrize(
    ("provider", "key", "warning"),
    [
        ("anthropic", "AIzaSyD-9tSrke72PouQMnMX-a7eZSW0jkFMBWY", "gemini keys, not anthropic's"),
        ("openai", ANTHROPIC_KEY, "anthropic keys, not openai's"),
        ("gemini", OPENAI_KEY, "gemini keys usually start with 'AIza'"),
        ("anthropic", OPENAI_KEY, "anthropic keys usually start with 'sk-ant-'"),
    ],
)
def test_a_key_with_another_providers_prefix_is_stored_with_a_warning(
    home: Path, memory_keyring: MemoryKeyring, provider: str, key: str, warning: str
) -> None:
    code, out, err = run("setup", "--provider", provider, input=key + "\n")

    assert code == 0
    assert "warning: " in err
    assert warning in err
    assert key not in out + err
    assert memory_keyring.passwords[("fluid_build", provider)] == key


def test_a_keyless_provider_is_stored_without_reading_a_key(home: Path, no_keyring: None) -> None:
    code, out, _ = run("setup", "--provider", "ollama", "--model", "qwen2.5")

    assert code == 0
    assert (load_ai_config().provider, load_ai_config().model) == ("ollama", "qwen2.5")
    assert "key stored" not in out


def test_no_key_stores_only_the_provider(home: Path, no_keyring: None) -> None:
    code, out, _ = run("setup", "--provider", "openai", "--no-key")

    assert code == 0
    assert load_ai_config().key_source is None
    assert "key stored" not in out


def test_an_unknown_provider_is_a_usage_error(home: Path) -> None:
    code, _, err = run("setup", "--provider", "nope", input=OPENAI_KEY + "\n")
    assert code == EXIT_CODES["usage"]
    assert "unknown provider 'nope'" in err
    code, _, err = run("setup")
    assert code == EXIT_CODES["usage"]
    assert "--provider is required" in err


def test_setup_json_output_parses_and_holds_no_key(
    home: Path, memory_keyring: MemoryKeyring, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env-value-wins-000000")
    code, out, _ = run(
        "setup", "--provider", "openai", "--model", "gpt-4o", "--json", input=OPENAI_KEY + "\n"
    )

    assert code == 0
    data = json.loads(out)
    assert data["ok"] is True
    assert data["provider"] == "openai"
    assert data["key_source"] == "keyring"
    assert data["key_fingerprint"] == key_fingerprint(OPENAI_KEY)
    assert data["overridden_by_env"] == ["OPENAI_API_KEY"]
    assert OPENAI_KEY not in out


def test_the_refusal_as_json(home: Path, no_keyring: None) -> None:
    code, out, _ = run("setup", "--provider", "openai", "--json", input=OPENAI_KEY + "\n")

    assert code == EXIT_CODES["auth"]
    data = json.loads(out)
    assert data["ok"] is False
    assert data["error"]["error"] == "ProviderAuthError"
    assert OPENAI_KEY not in out


# -- no keyring: refused before the key is asked for (the console script, a fresh HOME) ----

NO_KEYRING = "keyring.backends.fail.Keyring"


def _setup_at_a_terminal(home: Path, *args: str) -> tuple[int, str]:
    """``fluid ai setup ARGS`` at a terminal with no keyring; fails at once if it asks for a key."""
    assert FLUID is not None
    env = fresh_env(home, PYTHON_KEYRING_BACKEND=NO_KEYRING)
    proc = subprocess.Popen(
        [sys.executable, "-c", AT_A_TERMINAL, FLUID, "ai", "setup", *args],
        env=env,
        cwd=home,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    assert proc.stdout is not None
    seen = b""
    try:
        while b"(input hidden)" not in seen:
            ready, _, _ = select.select([proc.stdout], [], [], 60)
            assert ready, f"no answer within 60 s: {seen!r}"
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:
                break
            seen += chunk
        text = seen.decode("utf-8", "replace")
        assert "(input hidden)" not in text, f"asked for a key it cannot keep: {text}"
        return proc.wait(timeout=60), text
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def test_no_keyring_refuses_before_asking_for_the_key_at_a_terminal(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()

    code, text = _setup_at_a_terminal(home, "--provider", "openai", "--model", "gpt-4o")

    assert code == EXIT_CODES["auth"], text
    headline = [line for line in text.splitlines() if line.startswith("fluid:")]
    assert len(headline) == 1, text
    assert "no usable OS keyring" in headline[0]
    assert "nothing was asked for or stored" in headline[0]
    assert "export OPENAI_API_KEY" in headline[0]
    assert "--no-key" in headline[0]
    assert "FLUID_ALLOW_PLAINTEXT_AI_SECRETS=1" in headline[0]
    assert "Traceback" not in text
    assert not (home / ".config" / "fluid" / "ai_config.json").exists()


def test_no_keyring_refuses_before_reading_a_piped_key(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    env = fresh_env(home, PYTHON_KEYRING_BACKEND=NO_KEYRING)

    # Nothing piped: before the check, this asked for a key and said none was entered.
    empty = subprocess.run(
        [str(FLUID), "ai", "setup", "--provider", "openai"],
        env=env,
        cwd=home,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert empty.returncode == EXIT_CODES["auth"], empty.stderr
    assert "no usable OS keyring" in empty.stderr
    assert "no API key was entered" not in empty.stderr

    piped = fluid(home, "ai", "setup", "--provider", "anthropic", "--json", env=env)
    assert piped.returncode == EXIT_CODES["auth"]
    data = json.loads(piped.stdout)
    assert data["ok"] is False
    assert data["error"]["error"] == "ProviderAuthError"
    assert data["error"]["code"] == "llm.auth"
    assert "ANTHROPIC_API_KEY" in data["error"]["message"]
    assert not (home / ".config" / "fluid" / "ai_config.json").exists()


def test_no_keyring_hints_the_two_ways_out_not_the_same_command(tmp_path: Path) -> None:
    """issue 35 item 12: the hint under the refusal names the ways out the message explains;
    it used to say to re-run the very command that was refused. Each way out works."""
    home = tmp_path / "home"
    home.mkdir()
    env = fresh_env(home, PYTHON_KEYRING_BACKEND=NO_KEYRING)
    done = subprocess.run(
        [str(FLUID), "ai", "setup", "--provider", "xai"],
        env=env,
        cwd=home,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == EXIT_CODES["auth"], done.stderr
    hint = done.stderr.strip().splitlines()[-1]
    assert hint == (
        "hint: export XAI_API_KEY in your shell profile and run `fluid ai setup --provider xai "
        "--no-key`, or keep the key in a plaintext file: `FLUID_ALLOW_PLAINTEXT_AI_SECRETS=1 "
        "fluid ai setup --provider xai`."
    )
    assert "re-run" not in hint
    no_key = fluid(home, "ai", "setup", "--provider", "xai", "--no-key", env=env)
    assert no_key.returncode == 0, no_key.stderr
    advised = hint.rsplit("`", 2)[-2]  # the plaintext way, run as shown
    assert advised == "FLUID_ALLOW_PLAINTEXT_AI_SECRETS=1 fluid ai setup --provider xai"
    path = f"{Path(str(FLUID)).parent}{os.pathsep}{env.get('PATH', '')}"
    stored = subprocess.run(
        ["bash", "-c", advised],  # noqa: S607 - the shell, as the hint is typed
        env={**env, "PATH": path},
        cwd=home,
        input="xai-TESTKEY0123456789abcdef\n",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert stored.returncode == 0, stored.stderr
    assert "(plaintext)" in stored.stdout


def test_no_keyring_refuses_a_local_server_too_unless_no_key(tmp_path: Path) -> None:
    """Its key is optional, but one typed there could not be kept either: --no-key says none."""
    home = tmp_path / "home"
    home.mkdir()

    code, text = _setup_at_a_terminal(home, "--provider", "vllm", "--model", "qwen")
    assert code == EXIT_CODES["auth"], text
    assert "--no-key" in text

    env = fresh_env(home, PYTHON_KEYRING_BACKEND=NO_KEYRING)
    done = fluid(home, "ai", "setup", "--provider", "vllm", "--model", "qwen", "--no-key", env=env)
    assert done.returncode == 0, done.stderr
    stored = json.loads((home / ".config" / "fluid" / "ai_config.json").read_text())
    assert (stored["provider"], stored["model"]) == ("vllm", "qwen")


def test_no_keyring_with_the_plaintext_opt_in_still_asks_and_stores(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    env = fresh_env(home, PYTHON_KEYRING_BACKEND=NO_KEYRING, FLUID_ALLOW_PLAINTEXT_AI_SECRETS="1")
    done = subprocess.run(
        [str(FLUID), "ai", "setup", "--provider", "openai"],
        env=env,
        cwd=home,
        input=OPENAI_KEY + "\n",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "(plaintext)" in done.stdout
    stored = json.loads((home / ".config" / "fluid" / "ai_config.json").read_text())
    assert stored["keys"] == {"openai": OPENAI_KEY}


# -- a broken file never crashes ------------------------------------------------


def write_config(home: Path, text: str, file_mode: int = 0o600) -> Path:
    home.mkdir(mode=0o700, exist_ok=True)
    path = home / "ai_config.json"
    path.write_text(text)
    path.chmod(file_mode)
    return path


@pytest.mark.parametrize(
    ("text", "file_mode", "problem"),
    [
        ("{not json", 0o600, "is not valid JSON"),
        ('["a list"]', 0o600, "wrong type"),
        ('{"provider": 5, "model": ["x"]}', 0o600, "wrong type (model, provider)"),
        ('{"provider": "openai", "key_sources": {"openai": "usb"}}', 0o600, "wrong type"),
        ('{"version": 7, "provider": "openai"}', 0o600, "version 7"),
        ('{"provider": "openai"}', 0o666, "can be written by other users"),
        ("\xff\xfe", 0o600, "is not valid JSON"),
    ],
)
def test_a_broken_config_is_ignored_with_a_warning(
    home: Path,
    caplog: pytest.LogCaptureFixture,
    memory_keyring: MemoryKeyring,
    text: str,
    file_mode: int,
    problem: str,
) -> None:
    write_config(home, text, file_mode)

    with caplog.at_level(logging.WARNING, logger="fluid_build.config"):
        config = load_ai_config()
        env = apply_stored_config({"FLUID_HOME": str(home)})

    assert config.provider is None
    assert config.exists
    assert any(problem in p for p in config.problems)
    assert problem in caplog.text
    assert env == {"FLUID_HOME": str(home)}
    # setup rewrites it.
    code, _, err = run("setup", "--provider", "openai", input=OPENAI_KEY + "\n")
    assert code == 0, err
    assert load_ai_config().provider == "openai"


def test_an_unknown_stored_provider_is_ignored(
    home: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_config(home, '{"provider": "nosuch", "model": "m"}')
    with caplog.at_level(logging.WARNING, logger="fluid_build.config"):
        config = load_ai_config()
    assert (config.provider, config.model) == (None, None)
    assert "unknown provider 'nosuch'" in caplog.text


def test_a_readable_by_others_file_with_a_key_is_refused_loudly(
    home: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("FLUID_ALLOW_PLAINTEXT_AI_SECRETS", "1")
    document = {
        "version": 1,
        "provider": "openai",
        "model": "gpt-4o",
        "key_sources": {"openai": "file"},
        "keys": {"openai": OPENAI_KEY},
    }
    write_config(home, json.dumps(document), 0o640)

    with caplog.at_level(logging.WARNING, logger="fluid_build.config"):
        assert stored_api_key("openai") is None
        env = apply_stored_config(dict(os.environ))

    assert env["FLUID_LLM_PROVIDER"] == "openai"
    assert env["FLUID_LLM_MODEL"] == "gpt-4o"
    assert "OPENAI_API_KEY" not in env
    assert any(r.levelno == logging.ERROR and "NOT used" in r.getMessage() for r in caplog.records)
    assert OPENAI_KEY not in caplog.text
    assert load_ai_config().key_source is None


def test_a_world_readable_file_without_a_key_warns(
    home: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_config(home, '{"provider": "anthropic"}', 0o644)
    with caplog.at_level(logging.WARNING, logger="fluid_build.config"):
        assert load_ai_config().provider == "anthropic"
    assert "readable by every user" in caplog.text


def test_the_config_lives_where_xdg_says(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("FLUID_HOME", raising=False)
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    assert config_path() == tmp_path / ".config" / "fluid" / "ai_config.json"
    assert config_path({"XDG_CONFIG_HOME": "/etc/xdg-u"}) == Path("/etc/xdg-u/fluid/ai_config.json")
    # The XDG spec: a relative path is invalid and ignored.
    assert config_path({"XDG_CONFIG_HOME": "rel"}) == tmp_path / ".config/fluid/ai_config.json"
    both = {"FLUID_HOME": "/srv/fluid", "XDG_CONFIG_HOME": "/etc/xdg-u"}
    assert config_path(both) == Path("/srv/fluid/ai_config.json")


# -- the environment wins -------------------------------------------------------


@pytest.fixture
def stored_openai(home: Path, memory_keyring: MemoryKeyring) -> None:
    code, _, err = run(
        "setup", "--provider", "openai", "--model", "gpt-4o", input=OPENAI_KEY + "\n"
    )
    assert code == 0, err


@pytest.mark.usefixtures("stored_openai")
def test_apply_stored_config_fills_only_what_the_environment_lacks(home: Path) -> None:
    base = {"FLUID_HOME": str(home)}
    assert apply_stored_config(base) == {
        **base,
        "FLUID_LLM_PROVIDER": "openai",
        "FLUID_LLM_MODEL": "gpt-4o",
        "OPENAI_API_KEY": OPENAI_KEY,
    }
    env = {**base, "OPENAI_API_KEY": "sk-from-env", "FLUID_LLM_MODEL": "gpt-4.1"}
    before = dict(env)
    merged = apply_stored_config(env)
    assert merged["OPENAI_API_KEY"] == "sk-from-env"
    assert merged["FLUID_LLM_MODEL"] == "gpt-4.1"
    assert merged["FLUID_LLM_PROVIDER"] == "openai"
    assert env == before  # the argument is not changed
    assert "OPENAI_API_KEY" not in apply_stored_config({**base, "FLUID_LLM_API_KEY": "sk-any"})
    # Another provider named in the environment: the stored model and key are not its own.
    assert apply_stored_config({**base, "FLUID_LLM_PROVIDER": "anthropic"}) == {
        **base,
        "FLUID_LLM_PROVIDER": "anthropic",
    }


@pytest.mark.usefixtures("stored_openai")
def test_the_stored_config_resolves_like_the_environment(home: Path) -> None:
    from fluid_build.copilot.llm.settings import resolve_provider_config

    config = resolve_provider_config(env=apply_stored_config({"FLUID_HOME": str(home)}))
    assert (config.provider, config.model, config.api_key) == ("openai", "gpt-4o", OPENAI_KEY)


def test_apply_stored_config_without_a_file_changes_nothing(home: Path) -> None:
    assert apply_stored_config({"A": "b", "FLUID_HOME": str(home)}) == {
        "A": "b",
        "FLUID_HOME": str(home),
    }


# -- --check ------------------------------------------------------------------------


def test_check_success(monkeypatch: pytest.MonkeyPatch, home: Path) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", OPENAI_KEY)
    with respx.mock(assert_all_called=True) as mock:
        route = mock.get("https://api.openai.com/v1/models").respond(
            200, json={"object": "list", "data": [{"id": "gpt-4o"}, {"id": "gpt-4o-mini"}]}
        )
        code, out, err = run("setup", "--check")

    assert code == 0, err
    assert out.strip() == "openai: key accepted (2 models visible)"
    assert route.calls.last.request.headers["authorization"] == f"Bearer {OPENAI_KEY}"
    assert OPENAI_KEY not in out + err


@pytest.mark.usefixtures("stored_openai")
def test_check_uses_the_stored_key() -> None:
    with respx.mock(assert_all_called=True) as mock:
        route = mock.get("https://api.openai.com/v1/models").respond(200, json={"data": []})
        code, out, err = run("setup", "--check", "--json")

    assert code == 0, err
    assert json.loads(out) == {
        "ok": True,
        "provider": "openai",
        "model": "gpt-4o",
        "endpoint": "https://api.openai.com/v1/models",
        "key_accepted": True,
        "models_visible": 0,
    }
    assert route.calls.last.request.headers["authorization"] == f"Bearer {OPENAI_KEY}"


def test_check_with_a_rejected_key_exits_with_the_auth_code(
    monkeypatch: pytest.MonkeyPatch, home: Path
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", OPENAI_KEY)
    body = {
        "error": {
            "message": f"Incorrect API key provided: {OPENAI_KEY[:8]}****. ",
            "type": "invalid_request_error",
            "code": "invalid_api_key",
        }
    }
    with respx.mock(assert_all_called=True) as mock:
        mock.get("https://api.openai.com/v1/models").respond(401, json=body)
        code, out, err = run("setup", "--check")
        json_code, json_out, _ = run("setup", "--check", "--json")

    assert code == EXIT_CODES["auth"]
    assert "fluid: ProviderAuthError [llm.auth]:" in err
    assert "hint: check OPENAI_API_KEY" in err
    assert "[llm.auth]" in err
    assert OPENAI_KEY not in out + err
    assert json_code == EXIT_CODES["auth"]
    data = json.loads(json_out)
    assert data["ok"] is False
    assert data["error"]["error"] == "ProviderAuthError"
    assert data["error"]["code"] == "llm.auth"


def test_check_without_any_configuration_names_what_to_set(home: Path) -> None:
    code, _, err = run("setup", "--check")
    assert code == EXIT_CODES["auth"]
    assert "no LLM provider is configured" in err


def test_check_connection_failure_is_a_timeout_family_exit(
    monkeypatch: pytest.MonkeyPatch, home: Path
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", OPENAI_KEY)
    with respx.mock(assert_all_called=True) as mock:
        mock.get("https://api.openai.com/v1/models").mock(side_effect=httpx.ConnectError("no"))
        code, _, _ = run("setup", "--check")
    assert code == EXIT_CODES["timeout"]


@pytest.mark.parametrize(
    ("env", "args", "url", "headers", "payload", "expected"),
    [
        (
            {"ANTHROPIC_API_KEY": ANTHROPIC_KEY},
            ["--provider", "anthropic"],
            "https://api.anthropic.com/v1/models?limit=1000",
            {"x-api-key": ANTHROPIC_KEY, "anthropic-version": "2023-06-01"},
            {"data": [{"id": "claude-sonnet-4-6"}]},
            "anthropic: key accepted (1 models visible)",
        ),
        (
            {"GEMINI_API_KEY": "AIzaSyD-9tSrke72PouQMnMX-a7eZSW0jkFMBWY"},
            ["--provider", "gemini"],
            "https://generativelanguage.googleapis.com/v1beta/models?pageSize=1000",
            {"x-goog-api-key": "AIzaSyD-9tSrke72PouQMnMX-a7eZSW0jkFMBWY"},
            {"models": [{"name": "models/a"}, {"name": "models/b"}, {"name": "models/c"}]},
            "gemini: key accepted (3 models visible)",
        ),
        (
            {
                "AZURE_OPENAI_API_KEY": "0123456789abcdef0123456789abcdef",
                "AZURE_OPENAI_ENDPOINT": "https://res.openai.azure.com",
                "FLUID_LLM_MODEL": "my-deployment",
            },
            ["--provider", "azure"],
            "https://res.openai.azure.com/openai/models?api-version=2024-10-21",
            {"api-key": "0123456789abcdef0123456789abcdef"},
            {"data": [{"id": "gpt-4o"}]},
            "azure: key accepted (1 models visible)",
        ),
        (
            {},
            ["--provider", "ollama"],
            "http://127.0.0.1:11434/api/tags",
            {},
            {"models": [{"name": "llama3.1"}]},
            "ollama: server answered (1 models visible)",
        ),
        (
            # Ollama behind a proxy (or ollama.com) takes a bearer key: the list is asked
            # with the key the calls carry, so "key accepted" means it was sent.
            {"FLUID_LLM_API_KEY": "ollama-key-0123456789"},
            ["--provider", "ollama"],
            "http://127.0.0.1:11434/api/tags",
            {"authorization": "Bearer ollama-key-0123456789"},
            {"models": [{"name": "llama3.1"}]},
            "ollama: key accepted (1 models visible)",
        ),
        (
            {"OPENAI_BASE_URL": "http://127.0.0.1:8000/v1", "FLUID_LLM_MODEL": "local"},
            ["--provider", "vllm"],
            "http://127.0.0.1:8000/v1/models",
            {},
            {"data": [{"id": "local"}]},
            "vllm: server answered (1 models visible)",
        ),
    ],
)
def test_check_calls_each_providers_model_list(
    monkeypatch: pytest.MonkeyPatch,
    home: Path,
    env: dict[str, str],
    args: list[str],
    url: str,
    headers: dict[str, str],
    payload: dict[str, object],
    expected: str,
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with respx.mock(assert_all_called=True) as mock:
        route = mock.get(url).respond(200, json=payload)
        code, out, err = run("setup", "--check", *args)

    assert code == 0, err
    assert out.strip() == expected
    sent = route.calls.last.request
    assert str(sent.url) == url
    for name, value in headers.items():
        assert sent.headers[name] == value
    if not headers:
        assert "authorization" not in sent.headers


@pytest.mark.parametrize("name", sorted(PROVIDERS))
def test_the_model_list_is_asked_with_the_credentials_a_call_carries(name: str) -> None:
    """--check GETs each adapter's own list (``Adapter.models_request``) with the headers its
    calls carry: the key in the call's header, the API version, the configured headers; a
    cloud, which signs each call, has no such list and --check says so."""
    entry = PROVIDERS[name]
    config = ProviderConfig(
        name,
        "some-model",
        api_key="k-0123456789",
        base_url="https://models.example.test/v1",
        headers={"x-team": "blue"},
    )
    adapter = load(entry.adapter_class)(config)
    probe = adapter.models_request()
    if entry.cloud is not None:
        assert probe is None
        return
    assert probe is not None
    assert probe.url.startswith("https://models.example.test/v1/")
    spec = CallSpec(model="some-model", messages=[{"role": "user", "content": "hi"}])
    call = adapter.request(spec, stream=False)
    sent = {k.lower(): v for k, v in call.headers.items() if k.lower() != "content-type"}
    listed = {k.lower(): v for k, v in probe.headers.items()}
    assert listed == {**sent, "accept": "application/json"}
    assert any("k-0123456789" in value for value in sent.values())
    assert "k-0123456789" not in probe.url + json.dumps(probe.params)  # a header, never the URL


def test_check_with_an_unreadable_model_list_still_accepts_the_key(
    monkeypatch: pytest.MonkeyPatch, home: Path
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", OPENAI_KEY)
    with respx.mock() as mock:
        mock.get("https://api.openai.com/v1/models").respond(200, text="<html>ok</html>")
        code, out, _ = run("setup", "--check")
    assert code == 0
    assert out.strip() == "openai: key accepted (model list not readable)"


def test_the_config_file_is_never_world_readable_even_with_a_loose_umask(
    home: Path, memory_keyring: MemoryKeyring
) -> None:
    old = os.umask(0)
    try:
        code, _, err = run("setup", "--provider", "openai", input=OPENAI_KEY + "\n")
    finally:
        os.umask(old)
    assert code == 0, err
    assert mode(home) == 0o700
    assert mode(home / "ai_config.json") == 0o600


# -- where the configuration lives: $XDG_CONFIG_HOME/fluid, and the move of ~/.fluid ------
#
# Real `fluid` processes in a fresh HOME, each command run twice in a row.

OLD_CONFIG = (
    '{"version": 1, "provider": "anthropic", "model": "claude-x", '
    '"key_sources": {"anthropic": "keyring"}}\n'
)


def _fluid(home: Path, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    fluid = shutil.which("fluid", path=os.path.dirname(sys.executable)) or shutil.which("fluid")
    assert fluid is not None, "the fluid console script is not installed"
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(home),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "TIKTOKEN_CACHE_DIR": str(home / ".cache" / "tiktoken"),
        "PYTHON_KEYRING_BACKEND": "keyring.backends.fail.Keyring",
        **extra,
    }
    return subprocess.run(
        [fluid, *args], env=env, cwd=home, capture_output=True, text=True, timeout=120, check=False
    )


def _doctor(home: Path, **extra: str) -> dict[str, Any]:
    done = _fluid(home, "doctor", "--json", **extra)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""  # doctor gathers every warning into its report
    data: dict[str, Any] = json.loads(done.stdout)
    return data


def _old_config(home: Path, text: str = OLD_CONFIG) -> Path:
    (home / ".fluid").mkdir(parents=True, mode=0o700)
    return write_config(home / ".fluid", text)


def _moves(data: dict[str, Any]) -> list[str]:
    return [w for w in data["config_warnings"] if w.startswith("moved ")]


def test_an_old_config_moves_once_to_the_xdg_directory(tmp_path: Path) -> None:
    home = tmp_path / "home"
    old = _old_config(home)
    inode = old.stat().st_ino
    new = home / ".config" / "fluid" / "ai_config.json"

    first = _doctor(home)
    assert first["stored_config"]["path"] == str(new)
    assert first["stored_config"]["provider"] == "anthropic"
    assert first["stored_config"]["model"] == "claude-x"
    assert _moves(first) == [
        f"moved {old} to {new}, where fluid keeps its configuration now (XDG_CONFIG_HOME); "
        f"removed the empty {home / '.fluid'}"
    ]
    assert not (home / ".fluid").exists()
    assert new.stat().st_ino == inode  # the same file, renamed: nothing copied
    assert new.read_text() == OLD_CONFIG
    assert mode(new) == 0o600
    assert mode(new.parent) == 0o700
    assert mode(new.parent.parent) == 0o700  # ~/.config, made here, is private too (XDG)

    second = _doctor(home)
    assert _moves(second) == []
    assert second["config_warnings"] == []
    assert second["stored_config"]["provider"] == "anthropic"
    assert new.stat().st_ino == inode


def test_setup_after_an_upgrade_moves_the_old_config_then_updates_it(tmp_path: Path) -> None:
    home = tmp_path / "home"
    old = _old_config(home)
    new = home / ".config" / "fluid" / "ai_config.json"
    first = _fluid(home, "ai", "setup", "--provider", "gemini", "--no-key")
    assert first.returncode == 0, first.stderr
    assert f"gemini: provider stored in {new}" in first.stdout
    assert first.stderr.count(f"warning: moved {old} to {new}") == 1, first.stderr
    stored = json.loads(new.read_text())
    assert stored["provider"] == "gemini"
    assert stored["key_sources"] == {"anthropic": "keyring"}  # the old file's, kept
    second = _fluid(home, "ai", "setup", "--provider", "gemini", "--no-key")
    assert second.returncode == 0, second.stderr
    assert "moved" not in second.stderr
    assert mode(new) == 0o600


def test_a_new_config_is_never_overwritten_by_the_old_one(tmp_path: Path) -> None:
    home = tmp_path / "home"
    old = _old_config(home)
    (home / ".config").mkdir(mode=0o700)
    new = write_config(home / ".config" / "fluid", '{"version": 1, "provider": "openai"}\n')
    for _ in range(2):
        data = _doctor(home)
        assert data["stored_config"]["provider"] == "openai"
        assert data["config_warnings"] == [
            f"{old} is not used: {new} exists and wins. Remove the old file once you have "
            f"checked it (or set FLUID_HOME={old.parent} to use it instead)"
        ]
        assert data["paths"]["legacy_config_file"] == str(old)
    assert old.read_text() == OLD_CONFIG
    assert json.loads(new.read_text())["provider"] == "openai"


@pytest.mark.parametrize("linked", ["the directory", "the file"])
def test_nothing_is_moved_through_a_symbolic_link(tmp_path: Path, linked: str) -> None:
    home = tmp_path / "home"
    home.mkdir()
    elsewhere = tmp_path / "dotfiles"
    real = write_config(elsewhere, OLD_CONFIG)
    if linked == "the directory":
        (home / ".fluid").symlink_to(elsewhere)
    else:
        (home / ".fluid").mkdir(mode=0o700)
        (home / ".fluid" / "ai_config.json").symlink_to(real)
    for _ in range(2):
        data = _doctor(home)
        assert data["stored_config"]["exists"] is False
        [warning] = data["config_warnings"]
        assert "symbolic link" in warning
        assert "FLUID_HOME=" in warning  # what to do
    assert real.read_text() == OLD_CONFIG
    assert (home / ".fluid").is_symlink() or (home / ".fluid" / "ai_config.json").is_symlink()
    assert not (home / ".config" / "fluid" / "ai_config.json").exists()


def test_fluid_home_wins_and_nothing_moves(tmp_path: Path) -> None:
    home = tmp_path / "home"
    old = _old_config(home)
    data = _doctor(home, FLUID_HOME=str(tmp_path / "elsewhere"))
    assert data["stored_config"]["path"] == str(tmp_path / "elsewhere" / "ai_config.json")
    assert data["config_warnings"] == []
    assert data["paths"]["config_source"] == "FLUID_HOME"
    assert old.read_text() == OLD_CONFIG
    assert not (home / ".config").exists()


def test_only_fluids_own_file_leaves_a_shared_dot_fluid(tmp_path: Path) -> None:
    home = tmp_path / "home"
    old = _old_config(home)
    (home / ".fluid" / "soundfont.sf2").write_text("another program's file")
    data = _doctor(home, XDG_CONFIG_HOME=str(tmp_path / "xdg"))
    new = tmp_path / "xdg" / "fluid" / "ai_config.json"
    assert data["stored_config"]["path"] == str(new)
    assert data["paths"]["config_source"] == "XDG_CONFIG_HOME"
    assert _moves(data) == [
        f"moved {old} to {new}, where fluid keeps its configuration now (XDG_CONFIG_HOME)"
    ]
    assert sorted(p.name for p in (home / ".fluid").iterdir()) == ["soundfont.sf2"]


def test_a_fifo_in_place_of_the_old_file_is_left_with_a_warning(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".fluid").mkdir(parents=True)
    os.mkfifo(home / ".fluid" / "ai_config.json")
    data = _doctor(home)  # never blocks on the FIFO
    [warning] = data["config_warnings"]
    assert f"{home / '.fluid' / 'ai_config.json'} is a FIFO (named pipe), not a regular file" in (
        warning
    )
    assert stat.S_ISFIFO((home / ".fluid" / "ai_config.json").lstat().st_mode)


def test_first_runs_at_the_same_time_move_it_once(tmp_path: Path) -> None:
    home = tmp_path / "home"
    _old_config(home)
    fluid = shutil.which("fluid", path=os.path.dirname(sys.executable)) or shutil.which("fluid")
    assert fluid is not None
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(home),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "PYTHON_KEYRING_BACKEND": "keyring.backends.fail.Keyring",
    }
    procs = [
        subprocess.Popen(
            [fluid, "doctor", "--json"],
            env=env,
            cwd=home,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    reports = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        reports.append(json.loads(out))
    assert [r["stored_config"]["provider"] for r in reports] == ["anthropic"] * 4
    assert sum(len(_moves(r)) for r in reports) == 1
    assert not (home / ".fluid").exists()
    assert (home / ".config" / "fluid" / "ai_config.json").read_text() == OLD_CONFIG


@pytest.mark.parametrize("failure", [errno.EXDEV, errno.EPERM])
def test_without_a_hard_link_the_file_is_copied_into_place(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, failure: int
) -> None:
    """Another file system (EXDEV: a private copy, then linked in) or none at all (EPERM)."""
    home = tmp_path / "home"
    old = _old_config(home)
    old.chmod(0o640)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("FLUID_HOME", raising=False)
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    real_link = os.link
    links: list[str] = []

    def link(src: str, dst: str, **kwargs: Any) -> None:
        links.append(os.path.basename(src))
        if failure == errno.EPERM or os.path.basename(src) == "ai_config.json":
            raise OSError(failure, os.strerror(failure))
        real_link(src, dst, **kwargs)

    monkeypatch.setattr(os, "link", link)
    config = load_ai_config()
    new = home / ".config" / "fluid" / "ai_config.json"
    assert config.path == str(new)
    assert config.provider == "anthropic"
    assert new.read_text() == OLD_CONFIG
    assert mode(new) == 0o640  # the file's own mode moves with it; _load judges it as before
    assert not old.exists()
    assert sorted(p.name for p in new.parent.iterdir()) == ["ai_config.json"]  # no temp left
    assert len(links) == 2
