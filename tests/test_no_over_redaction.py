"""Redaction never fires on fluid's own words: a message without a secret shows no [REDACTED].

Over-redaction garbles the advice an operator needs most (``(api_key= [REDACTED]
Python)`` on a first run). Every message fluid makes without a secret is walked
here: each reason code's meaning, action and wait template, the not-configured
messages of every provider, the capability warnings, and the lines ``fluid``
prints for every error class; then the first-run messages from the console
script itself. The rule that caused it is pinned next to the shapes it must
still catch.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

import fluid_build.cli.batch
import fluid_build.cli.exit_codes
import fluid_build.copilot.health.resilient
import fluid_build.corpus.cassette
import fluid_build.corpus.compare
import fluid_build.corpus.replay
import fluid_build.forge.app
import fluid_build.forge.intent
from fluid_build import _files
from fluid_build._redact import REDACTED, redact
from fluid_build.cli._messages import describe
from fluid_build.cli.forge import EXAMPLE_INTENT
from fluid_build.copilot.agents.errors import (
    REASON_CODES,
    AgentExecutionError,
    ContextOverflowError,
    ProviderAuthError,
    ProviderError,
)
from fluid_build.copilot.call.capabilities import (
    capabilities_for,
    capability_matrix_from_env,
    run_start_warnings,
)
from fluid_build.copilot.llm.settings import PROVIDERS, resolve_provider_config
from fluid_build.errors import FluidError
from tests.test_cli_conventions import fluid, fresh_env

# Importing the modules above defines every FluidError subclass the CLI can show.
_MODULES = (
    fluid_build.cli.batch,
    fluid_build.cli.exit_codes,
    fluid_build.copilot.health.resilient,
    fluid_build.corpus.cassette,
    fluid_build.corpus.compare,
    fluid_build.corpus.replay,
    fluid_build.forge.app,
    fluid_build.forge.intent,
    _files,
)
NOW = 1_777_644_130.0  # 2026-05-01 14:02:10 UTC


def assert_not_redacted(text: str) -> None:
    assert REDACTED not in text, text
    assert redact(text) == text, f"redact() changes fluid's own words: {text!r}"


# -- the rule ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "advice",
    [
        "or run `fluid ai setup --provider openai` (api_key= in Python)",
        "pass the key as api_key= or set OPENAI_API_KEY",
        "password= is not an argument",
    ],
)
def test_a_name_followed_by_words_is_not_a_credential(advice: str) -> None:
    assert redact(advice) == advice


@pytest.mark.parametrize(
    "text",
    [
        "api_key=k3y-9f8e7d6c5b4a3928",
        "api_key = k3y-9f8e7d6c5b4a3928",
        "api_key : k3y-9f8e7d6c5b4a3928",
        "api_key: k3y-9f8e7d6c5b4a3928",
        "api_key= 'k3y-9f8e7d6c5b4a3928'",
        'api_key= "k3y-9f8e7d6c5b4a3928"',
        "password = hunter2",
        "password=in",
        "token:in",
        '"x-api-key": "k3y-9f8e7d6c5b4a3928"',
    ],
)
def test_a_name_given_a_value_still_loses_it(text: str) -> None:
    shown = redact(text)
    assert REDACTED in shown
    assert "k3y-9f8e7d6c5b4a3928" not in shown
    assert "hunter2" not in shown


# -- every message fluid makes without a secret --------------------------------------------


def test_every_reason_code_reads_as_written() -> None:
    for row in REASON_CODES.values():
        for text in (row.meaning, row.action):
            assert_not_redacted(text)
        if row.waited is not None:
            assert_not_redacted(row.waited.format(wait="until 14:03:12 UTC (62 s)"))


def _settings_errors() -> Iterator[ProviderError]:
    """Every message of llm/settings.py that a configuration can bring about."""
    attempts: list[tuple[tuple[str, ...], dict[str, object]]] = [
        ((), {"env": {}}),
        ((), {"env": {"OPENAI_API_KEY": "a", "ANTHROPIC_API_KEY": "b"}}),
        ((), {"env": {"FLUID_LLM_PROVIDER": "nope"}}),
        (("nope",), {"env": {}}),
        (("openai",), {"model": "bad\x01", "env": {"OPENAI_API_KEY": "k"}}),
        (("openai",), {"base_url": "ftp://x", "env": {"OPENAI_API_KEY": "k"}}),
        (("openai",), {"env": {"OPENAI_API_KEY": "k", "OPENAI_BASE_URL": "http://["}}),
        (("openai",), {"timeout": -1.0, "env": {"OPENAI_API_KEY": "k"}}),
        (("openai",), {"api_key": "two words", "env": {}}),
        (("openai",), {"env": {"OPENAI_API_KEY": "two words"}}),
        (("ollama",), {"env": {"OLLAMA_HOST": "10.0.0.9", "FLUID_OLLAMA_ALLOW_REMOTE": "x"}}),
        (("azure",), {"env": {"AZURE_OPENAI_API_KEY": "k", "FLUID_LLM_MODEL": "d"}}),
        (
            ("azure",),
            {
                "env": {
                    "AZURE_OPENAI_API_KEY": "k",
                    "FLUID_LLM_MODEL": "d",
                    "AZURE_OPENAI_ENDPOINT": "https://r.openai.azure.com",
                    "AZURE_OPENAI_API_VERSION": "a b",
                }
            },
        ),
    ]
    # Each provider with nothing set: its missing key, model or endpoint.
    attempts.extend(((name,), {"env": {}}) for name in PROVIDERS)
    found = 0
    for args, kwargs in attempts:
        try:
            resolve_provider_config(*args, **kwargs)  # type: ignore[arg-type]
        except ProviderError as error:
            found += 1
            yield error
    assert found >= len(attempts) - 3  # ollama, vllm-less cases may resolve; most must fail
    try:
        capability_matrix_from_env({"FLUID_CAPABILITY_MATRIX": '{"tools": "yes"}'}, "azure", "d")
    except ProviderError as error:
        yield error


def _lines(error: BaseException) -> list[str]:
    return describe(error, now=NOW).lines()


def test_every_settings_message_and_its_lines_read_as_written() -> None:
    errors = list(_settings_errors())
    assert len(errors) > 15
    for error in errors:
        assert_not_redacted(error.message)
        assert_not_redacted(error.hint(now=NOW))
        for line in _lines(error):
            assert_not_redacted(line)


def test_every_capability_warning_reads_as_written() -> None:
    cases = [
        capabilities_for("azure", "prod-gpt4o"),
        capabilities_for("ollama", "gemma2"),
        capabilities_for("ollama", "phi3"),
        capabilities_for("gemini", "gemini-2.0-flash"),
        capabilities_for("openai", "gpt-4o"),
    ]
    warnings = [
        warning
        for caps in cases
        for warning in run_start_warnings(
            caps, uses_tools=True, wants_strict_schema=True, prompt_tokens=caps.context_window
        )
    ]
    assert len(warnings) >= 5
    for warning in warnings:
        assert_not_redacted(warning)


def _subclasses(root: type[BaseException]) -> Iterator[type[BaseException]]:
    for cls in root.__subclasses__():
        yield cls
        yield from _subclasses(cls)


def _built(cls: type[BaseException]) -> BaseException:
    """An instance of ``cls`` from plain words, whatever its constructor takes."""
    required = [
        p
        for p in list(inspect.signature(cls.__init__).parameters.values())[1:]
        if p.default is inspect.Parameter.empty
        and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    words = {"limit": 1024, "out_dir": Path("forge-out"), "index": 1}
    args = [words.get(p.name, f"the {p.name}") for p in required]
    return cls(*args)


def test_every_error_class_prints_its_lines_as_written() -> None:
    classes = sorted(set(_subclasses(FluidError)), key=lambda c: c.__qualname__)
    assert len(classes) >= 15
    for cls in classes:
        error = _built(cls)
        for line in _lines(error):
            assert_not_redacted(line)
        if isinstance(error, AgentExecutionError):
            for code in REASON_CODES:
                copy = type(error)("it failed", code=code, retry_after=62.0)
                for line in _lines(copy):
                    assert_not_redacted(line)


@pytest.mark.parametrize("provider", [*sorted(PROVIDERS), None])
def test_every_providers_key_advice_reads_as_written(provider: str | None) -> None:
    for line in _lines(ProviderAuthError("the key was refused", provider=provider)):
        assert_not_redacted(line)


def test_an_overflow_message_reads_as_written() -> None:
    error = ContextOverflowError(
        "the prompt needs 9,000 tokens",
        details={"source": "preflight", "window_source": "default"},
        context_window=8192,
    )
    for line in _lines(error):
        assert_not_redacted(line)


# -- the first run, from the console script ----------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "args"),
    [
        ({}, ()),
        ({}, ("--provider", "openai")),
        ({"FLUID_LLM_PROVIDER": "anthropic"}, ()),
        ({}, ("--provider", "openai", "--json")),
    ],
    ids=["no-provider", "openai-no-key", "anthropic-no-key", "json"],
)
def test_the_first_run_messages_show_no_redaction(
    tmp_path: Path, extra: dict[str, str], args: tuple[str, ...]
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    intent = tmp_path / "intent.yaml"
    intent.write_text(EXAMPLE_INTENT.read_text(encoding="utf-8"), encoding="utf-8")
    done = fluid(home, "forge", str(intent), *args, env=fresh_env(home, **extra))
    assert done.returncode == 10, done.stdout + done.stderr
    output = done.stdout + done.stderr
    assert REDACTED not in output
    assert "Traceback" not in output
    assert "fluid ai setup" in output
    assert "in Python" not in output  # the command line names flags and variables only
    if "--json" in args:
        payload = json.loads(done.stdout)
        assert REDACTED not in json.dumps(payload)
