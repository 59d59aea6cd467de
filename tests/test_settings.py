"""Which provider, model, key and endpoint: arguments, then FLUID_* variables, then the rest."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import httpx
import pytest

from fluid_build.copilot import LLMClient
from fluid_build.copilot.agents.errors import ProviderAuthError, ProviderError
from fluid_build.copilot.call.envelope import RetryEnvelope, RetryPolicy
from fluid_build.copilot.llm.settings import (
    PROVIDERS,
    call_defaults_from_env,
    resolve_provider_config,
)


def test_the_single_provider_whose_key_is_set() -> None:
    config = resolve_provider_config(env={"ANTHROPIC_API_KEY": "sk-ant-x"})
    assert (config.provider, config.model, config.api_key) == (
        "anthropic",
        "claude-sonnet-4-6",
        "sk-ant-x",
    )
    assert config.timeout == 120.0


def test_fluid_variables_choose_and_override() -> None:
    env = {
        "OPENAI_API_KEY": "sk-openai",
        "ANTHROPIC_API_KEY": "sk-ant",
        "FLUID_LLM_PROVIDER": "OpenAI",
        "FLUID_LLM_MODEL": "gpt-4.1",
        "FLUID_LLM_API_KEY": "sk-override",
        "FLUID_LLM_TIMEOUT_SECONDS": "30",
    }
    config = resolve_provider_config(env=env)
    assert (config.provider, config.model, config.api_key, config.timeout) == (
        "openai",
        "gpt-4.1",
        "sk-override",
        30.0,
    )


def test_arguments_beat_the_environment() -> None:
    env = {"FLUID_LLM_PROVIDER": "openai", "FLUID_LLM_MODEL": "gpt-4.1", "FLUID_LLM_API_KEY": "a"}
    config = resolve_provider_config("gemini", "gemini-2.5-pro", "AIza-arg", env=env)
    assert (config.provider, config.model, config.api_key) == (
        "gemini",
        "gemini-2.5-pro",
        "AIza-arg",
    )


def test_gemini_takes_google_api_key_too() -> None:
    assert resolve_provider_config("gemini", env={"GOOGLE_API_KEY": "g"}).api_key == "g"


def test_a_missing_key_names_the_variable() -> None:
    with pytest.raises(ProviderAuthError) as caught:
        resolve_provider_config("anthropic", env={})
    assert "ANTHROPIC_API_KEY" in str(caught.value)
    assert "api_key=" in str(caught.value)
    with pytest.raises(ProviderAuthError) as caught:
        resolve_provider_config("gemini", env={"GEMINI_API_KEY": "   "})
    assert "GEMINI_API_KEY or GOOGLE_API_KEY" in str(caught.value)


def test_no_provider_at_all_is_an_auth_error_saying_what_to_set() -> None:
    with pytest.raises(ProviderAuthError) as caught:
        resolve_provider_config(env={})
    assert "OPENAI_API_KEY" in str(caught.value)


def test_several_keys_without_a_choice_is_not_configured() -> None:
    with pytest.raises(ProviderError) as caught:
        resolve_provider_config(env={"OPENAI_API_KEY": "a", "GEMINI_API_KEY": "b"})
    assert caught.value.code == "llm.not_configured"
    assert "OPENAI_API_KEY, GEMINI_API_KEY" in str(caught.value)
    assert "FLUID_LLM_PROVIDER" in str(caught.value)


def test_a_malformed_key_is_refused_without_echoing_it() -> None:
    with pytest.raises(ProviderAuthError) as caught:
        resolve_provider_config("openai", api_key="sk-abc\ndef-secret-part")
    assert "secret-part" not in str(caught.value)
    assert "malformed" in str(caught.value)


def test_unknown_provider_and_missing_models() -> None:
    with pytest.raises(ProviderError) as caught:
        resolve_provider_config("cohere", env={})
    assert caught.value.code == "llm.not_configured"
    assert "anthropic" in str(caught.value)
    with pytest.raises(ProviderError) as caught:
        resolve_provider_config(
            "azure",
            env={
                "AZURE_OPENAI_API_KEY": "k",
                "AZURE_OPENAI_ENDPOINT": "https://r.openai.azure.com",
            },
        )
    assert "deployment name" in str(caught.value)
    with pytest.raises(ProviderError) as caught:
        resolve_provider_config("azure", "dep", env={"AZURE_OPENAI_API_KEY": "k"})
    assert "AZURE_OPENAI_ENDPOINT" in str(caught.value)
    with pytest.raises(ProviderError) as caught:
        resolve_provider_config("vllm", "qwen", env={})
    assert "OPENAI_BASE_URL" in str(caught.value)


def test_azure_api_version() -> None:
    env = {
        "AZURE_OPENAI_API_KEY": "k",
        "AZURE_OPENAI_ENDPOINT": "https://r.openai.azure.com",
        "OPENAI_API_VERSION": "2025-01-01-preview",
    }
    assert resolve_provider_config("azure", "dep", env=env).api_version == "2025-01-01-preview"


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        (None, None),
        ("127.0.0.1:11434", "http://127.0.0.1:11434"),
        ("http://localhost:11434", "http://localhost:11434"),
        ("0.0.0.0:11434", "http://127.0.0.1:11434"),
        ("http://[::1]:11434", "http://[::1]:11434"),
    ],
)
def test_ollama_host(host: str | None, expected: str | None) -> None:
    env = {"OLLAMA_HOST": host} if host else {}
    config = resolve_provider_config("ollama", env=env)
    assert config.base_url == expected
    assert config.api_key is None
    assert config.model == "llama3.1"


def test_ollama_on_another_machine_needs_an_opt_in() -> None:
    with pytest.raises(ProviderError) as caught:
        resolve_provider_config("ollama", env={"OLLAMA_HOST": "gpu-box.lan:11434"})
    assert caught.value.code == "llm.bad_endpoint"
    assert "FLUID_OLLAMA_ALLOW_REMOTE=1" in str(caught.value)
    env = {"OLLAMA_HOST": "gpu-box.lan:11434", "FLUID_OLLAMA_ALLOW_REMOTE": "1"}
    assert resolve_provider_config("ollama", env=env).base_url == "http://gpu-box.lan:11434"


def test_bad_base_url() -> None:
    with pytest.raises(ProviderError) as caught:
        resolve_provider_config("openai", api_key="k", base_url="ftp://x")
    assert caught.value.code == "llm.bad_endpoint"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("0.5", 1.0), ("99999", 3600.0), ("soon", 120.0), ("nan", 120.0), ("45", 45.0)],
)
def test_timeout_is_clamped_and_never_crashes(
    raw: str, expected: float, caplog: pytest.LogCaptureFixture
) -> None:
    env = {"OPENAI_API_KEY": "k", "FLUID_LLM_TIMEOUT_SECONDS": raw}
    with caplog.at_level(logging.WARNING, logger="fluid_build.config"):
        assert resolve_provider_config(env=env).timeout == expected
    if raw != "45":
        assert "FLUID_LLM_TIMEOUT_SECONDS" in caplog.text


def test_config_repr_hides_the_key() -> None:
    config = resolve_provider_config("openai", api_key="sk-proj-hideme123456")
    assert "hideme" not in repr(config)


# -- bad configuration: a typed error naming the variable, with a valid example -----------

K = "sk-proj-SETTINGSKEY0123456789abcdef"


@pytest.mark.parametrize(
    ("env", "variable", "example"),
    [
        ({"OPENAI_BASE_URL": "http://["}, "OPENAI_BASE_URL", "https://api.openai.com/v1"),
        ({"OPENAI_BASE_URL": "sqlite://"}, "OPENAI_BASE_URL", "https://api.openai.com/v1"),
        ({"OPENAI_BASE_URL": "https://"}, "OPENAI_BASE_URL", "https://api.openai.com/v1"),
        ({"OPENAI_BASE_URL": "http://h:notaport/v1"}, "OPENAI_BASE_URL", "https://api.openai"),
        ({"OPENAI_BASE_URL": "http://h:99999/v1"}, "OPENAI_BASE_URL", "https://api.openai"),
        ({"OPENAI_BASE_URL": "http://h:0/v1"}, "OPENAI_BASE_URL", "https://api.openai"),
        ({"OPENAI_BASE_URL": "http://exa mple.com"}, "OPENAI_BASE_URL", "https://api.openai"),
        ({"OPENAI_BASE_URL": "http://h/\x00"}, "OPENAI_BASE_URL", "https://api.openai"),
        ({"OPENAI_BASE_URL": "http://h%00/"}, "OPENAI_BASE_URL", "https://api.openai"),
        ({"OPENAI_BASE_URL": "http://256.1.1.1/v1"}, "OPENAI_BASE_URL", "https://api.openai"),
        ({"OPENAI_BASE_URL": "gopher://x"}, "OPENAI_BASE_URL", "https://api.openai"),
        (
            {"FLUID_LLM_PROVIDER": "anthropic", "ANTHROPIC_BASE_URL": "http://[::1"},
            "ANTHROPIC_BASE_URL",
            "https://api.anthropic.com",
        ),
        (
            {"FLUID_LLM_PROVIDER": "gemini", "GEMINI_BASE_URL": "ftp://x"},
            "GEMINI_BASE_URL",
            "https://generativelanguage.googleapis.com/v1beta",
        ),
        ({"FLUID_LLM_PROVIDER": "ollama", "OLLAMA_HOST": "[::1"}, "OLLAMA_HOST", "127.0.0.1:11434"),
        ({"FLUID_LLM_PROVIDER": "ollama", "OLLAMA_HOST": ":notaport"}, "OLLAMA_HOST", "127.0.0"),
        (
            {"FLUID_LLM_PROVIDER": "azure", "FLUID_LLM_MODEL": "d", "AZURE_OPENAI_ENDPOINT": "x"},
            "AZURE_OPENAI_ENDPOINT",
            "https://my-resource.openai.azure.com",
        ),
        (
            {"FLUID_LLM_PROVIDER": "vllm", "FLUID_LLM_MODEL": "m", "OPENAI_BASE_URL": "h:8000"},
            "OPENAI_BASE_URL",
            "http://127.0.0.1:8000/v1",
        ),
        ({"FLUID_LLM_PROVIDER": "nope"}, "FLUID_LLM_PROVIDER", "openai"),
        ({"FLUID_LLM_PROVIDER": "open\x00ai"}, "FLUID_LLM_PROVIDER", "openai"),
        ({"FLUID_LLM_MODEL": "gpt-4o\x1b[31m"}, "FLUID_LLM_MODEL", "gpt-4o-mini"),
        ({"FLUID_LLM_MODEL": "gpt\n4o"}, "FLUID_LLM_MODEL", "gpt-4o-mini"),
        (
            {
                "FLUID_LLM_PROVIDER": "azure",
                "FLUID_LLM_MODEL": "d",
                "AZURE_OPENAI_ENDPOINT": "https://r.openai.azure.com",
                "AZURE_OPENAI_API_VERSION": "2024-10-21\n; x",
            },
            "AZURE_OPENAI_API_VERSION",
            "2024-10-21",
        ),
        ({"FLUID_LLM_PROVIDER": "groq"}, "FLUID_LLM_MODEL", "llama-3.3-70b-versatile"),
    ],
)
def test_a_bad_value_is_a_typed_error_naming_the_variable_with_an_example(
    env: dict[str, str], variable: str, example: str
) -> None:
    keys = dict.fromkeys(("OPENAI_API_KEY", "AZURE_OPENAI_API_KEY", "GROQ_API_KEY"), K)
    keys |= {"ANTHROPIC_API_KEY": K, "GEMINI_API_KEY": K}
    env = {"FLUID_LLM_PROVIDER": "openai", **keys, **env}
    with pytest.raises(ProviderError) as caught:
        resolve_provider_config(env=env)
    error = caught.value
    assert error.code in {"llm.bad_endpoint", "llm.not_configured"}
    assert variable in error.message
    assert f"{variable}={example}" in error.message
    assert error.details["variable"] == variable
    assert str(error.details["example"]).startswith(example)
    assert K not in str(error)


def test_a_bad_base_url_is_shown_without_its_credentials() -> None:
    env = {"OPENAI_API_KEY": K, "OPENAI_BASE_URL": "https://user:hunter2@h:notaport/v1?key=abc123"}
    with pytest.raises(ProviderError) as caught:
        resolve_provider_config(env=env)
    shown = str(caught.value) + repr(caught.value) + str(caught.value.to_dict())
    assert "hunter2" not in shown
    assert "abc123" not in shown
    assert "https://h:notaport/v1" in shown


def test_a_bad_base_url_argument_names_the_argument() -> None:
    with pytest.raises(ProviderError) as caught:
        resolve_provider_config("openai", api_key=K, base_url="http://[")
    assert "base_url" in caught.value.message
    assert "base_url='https://api.openai.com/v1'" in caught.value.message
    assert caught.value.details["variable"] is None


@pytest.mark.parametrize("variable", ["OPENAI_API_KEY", "FLUID_LLM_API_KEY"])
def test_a_malformed_key_names_where_it_came_from(variable: str) -> None:
    with pytest.raises(ProviderAuthError) as caught:
        resolve_provider_config("openai", env={variable: "sk-proj-abc\ndef-secret-part"})
    message = caught.value.message
    assert variable in message
    assert f"{variable}=<your key>" in message
    assert "secret-part" not in str(caught.value) + repr(caught.value)


def test_several_keys_and_no_endpoint_show_an_example() -> None:
    with pytest.raises(ProviderError) as caught:
        resolve_provider_config(env={"OPENAI_API_KEY": K, "GEMINI_API_KEY": K})
    assert "FLUID_LLM_PROVIDER=openai" in caught.value.message
    with pytest.raises(ProviderError) as caught:
        resolve_provider_config("vllm", model="m")
    assert "OPENAI_BASE_URL=http://127.0.0.1:8000/v1" in caught.value.message


@pytest.mark.parametrize(("value", "allowed"), [("1", True), ("YES", True), ("on", True)])
def test_the_ollama_opt_in_takes_any_yes(value: str, allowed: bool) -> None:
    env = {"OLLAMA_HOST": "gpu-box.lan:11434", "FLUID_OLLAMA_ALLOW_REMOTE": value}
    assert resolve_provider_config("ollama", env=env).base_url == "http://gpu-box.lan:11434"


def test_an_ollama_opt_in_that_is_not_a_yes_says_so() -> None:
    env = {"OLLAMA_HOST": "gpu-box.lan:11434", "FLUID_OLLAMA_ALLOW_REMOTE": "please"}
    with pytest.raises(ProviderError) as caught:
        resolve_provider_config("ollama", env=env)
    assert "'please', which is not 1, true, yes or on" in caught.value.message
    assert "OLLAMA_HOST=127.0.0.1:11434" in caught.value.message


@pytest.mark.parametrize("timeout", [-1.0, float("nan"), float("inf")])
def test_a_bad_timeout_argument_is_typed(timeout: float) -> None:
    with pytest.raises(ProviderError) as caught:
        resolve_provider_config("openai", api_key=K, timeout=timeout)
    assert caught.value.code == "llm.not_configured"
    assert "timeout=120" in caught.value.message


# -- local servers and their optional key ------------------------------------------------

LOCAL = {"OPENAI_BASE_URL": "http://127.0.0.1:8080/v1", "FLUID_LLM_MODEL": "local"}


def _sent_authorization(provider: str, env: dict[str, str]) -> list[str | None]:
    """The Authorization header of every request a real client sends for ``env``."""
    seen: list[str | None] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("authorization"))
        if request.url.path == "/props":
            return httpx.Response(404)
        ok = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}]}
        return httpx.Response(200, json=ok)

    envelope = RetryEnvelope(RetryPolicy(attempts=1), hook=lambda event: None)
    http = httpx.Client(transport=httpx.MockTransport(handle))
    with LLMClient(provider, env=env, envelope=envelope, http_client=http) as client:
        client.complete("hi")
    http.close()
    return seen


@pytest.mark.parametrize("provider", ["vllm", "llamacpp"])
def test_a_local_servers_key_is_read_from_openai_api_key_and_sent(provider: str) -> None:
    env = {**LOCAL, "OPENAI_API_KEY": "sk-local-server"}
    assert resolve_provider_config(provider, env=env).api_key == "sk-local-server"
    sent = _sent_authorization(provider, env)
    assert sent  # the probe's GETs (answered 404 here) and the completion
    assert set(sent) == {"Bearer sk-local-server"}


@pytest.mark.parametrize("provider", ["vllm", "llamacpp"])
def test_a_local_server_without_a_key_is_sent_none(provider: str) -> None:
    assert resolve_provider_config(provider, env=LOCAL).api_key is None  # never required
    assert set(_sent_authorization(provider, LOCAL)) == {None}


@pytest.mark.parametrize("provider", ["vllm", "llamacpp"])
def test_fluid_llm_api_key_wins_for_a_local_server_too(provider: str) -> None:
    env = {**LOCAL, "OPENAI_API_KEY": "sk-a", "FLUID_LLM_API_KEY": "sk-b"}
    assert resolve_provider_config(provider, env=env).api_key == "sk-b"


def test_the_providers_table_in_the_docs_matches_the_code() -> None:
    """docs/llm-providers.md names each provider's key variables, '(optional)' exactly
    where a key is not required, and 'none' where there is no key at all."""
    docs = Path(__file__).resolve().parents[1] / "docs" / "llm-providers.md"
    rows: dict[str, str] = {}
    for line in docs.read_text(encoding="utf-8").splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[0].startswith("`") and cells[0] != "`provider`":
            for name in re.findall(r"`([a-z_]+)`", cells[0]):
                rows[name] = cells[2]
    assert set(rows) == set(PROVIDERS)
    for name, info in PROVIDERS.items():
        column = rows[name]
        if not info.key_vars:
            assert column == "none", name
            continue
        for variable in info.key_vars:
            assert f"`{variable}`" in column, (name, variable)
        assert ("(optional" in column) is not info.key_required, name


# -- FLUID_LLM_TEMPERATURE and FLUID_LLM_MAX_OUTPUT_TOKENS (issue 34 item 5) ----------------


def test_call_defaults_from_the_environment() -> None:
    env = {"FLUID_LLM_TEMPERATURE": " 0.37 ", "FLUID_LLM_MAX_OUTPUT_TOKENS": "500"}
    found = call_defaults_from_env(env)
    assert found == {"temperature": 0.37, "max_output_tokens": 500}
    assert isinstance(found["temperature"], float)
    assert isinstance(found["max_output_tokens"], int)
    assert call_defaults_from_env({"FLUID_LLM_TEMPERATURE": "0"}) == {"temperature": 0.0}
    assert call_defaults_from_env({"FLUID_LLM_TEMPERATURE": "2"}) == {"temperature": 2.0}
    # Unset, empty or blank: nothing, the provider's own default applies.
    assert call_defaults_from_env({}) == {}
    assert (
        call_defaults_from_env({"FLUID_LLM_TEMPERATURE": " ", "FLUID_LLM_MAX_OUTPUT_TOKENS": ""})
        == {}
    )


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("FLUID_LLM_TEMPERATURE", "warm"),
        ("FLUID_LLM_TEMPERATURE", "nan"),
        ("FLUID_LLM_TEMPERATURE", "inf"),
        ("FLUID_LLM_TEMPERATURE", "-0.5"),
        ("FLUID_LLM_TEMPERATURE", "2.01"),
        ("FLUID_LLM_MAX_OUTPUT_TOKENS", "0"),
        ("FLUID_LLM_MAX_OUTPUT_TOKENS", "-100"),
        ("FLUID_LLM_MAX_OUTPUT_TOKENS", "1.5"),
        ("FLUID_LLM_MAX_OUTPUT_TOKENS", "lots"),
        ("FLUID_LLM_MAX_OUTPUT_TOKENS", "sk-proj-abcdefghijklmnopqrstuvwx"),
    ],
)
def test_a_bad_call_default_is_not_configured_naming_the_variable(name: str, value: str) -> None:
    with pytest.raises(ProviderError) as caught:
        call_defaults_from_env({name: value})
    error = caught.value
    assert error.code == "llm.not_configured"
    assert error.retryable is False
    assert error.details["variable"] == name
    assert name in error.message
    assert f"{name}={error.details['example']}" in error.message  # a valid value to copy
    assert "sk-proj-abcdefghijklmnopqrstuvwx" not in str(error)  # a pasted key is not echoed
