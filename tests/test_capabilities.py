"""The capability matrix, overrides, larger-window suggestions and the run-start banner."""

from __future__ import annotations

import io
import logging
import re
from pathlib import Path

import pytest

from fluid_build.copilot.call import capabilities, preflight
from fluid_build.copilot.call.capabilities import (
    TIGHT_CONTEXT,
    UNKNOWN_CONTEXT_WINDOW,
    UNKNOWN_MAX_OUTPUT,
    ModelCapabilities,
    capabilities_for,
    emit_run_start_banner,
    models_with_larger_window,
    run_start_warnings,
)

# -- lookups ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("provider", "model", "window", "tokenizer"),
    [
        ("openai", "gpt-4o", 128_000, "o200k_base"),
        ("openai", "gpt-4o-2024-08-06", 128_000, "o200k_base"),
        ("openai", "gpt-4o-mini-2024-07-18", 128_000, "o200k_base"),
        ("openai", "gpt-4.1", 1_047_576, "o200k_base"),
        ("openai", "gpt-4.1-mini-2025-04-14", 1_047_576, "o200k_base"),
        ("openai", "o1-mini-2024-09-12", 128_000, "o200k_base"),
        ("openai", "o3-mini", 200_000, "o200k_base"),
        ("openai", "o4-mini-2025-04-16", 200_000, "o200k_base"),
        ("openai", "gpt-5-mini-2025-08-07", 400_000, "o200k_base"),
        ("openai", "gpt-3.5-turbo-0125", 16_385, "cl100k_base"),
        ("anthropic", "claude-opus-4-7", 1_000_000, "claude-4.7"),
        ("anthropic", "claude-sonnet-4-6", 1_000_000, "claude"),
        ("anthropic", "claude-sonnet-4-6-20260101", 1_000_000, "claude"),
        ("anthropic", "claude-sonnet-4-5-20250929", 200_000, "claude"),
        ("anthropic", "claude-sonnet-4-20250514", 200_000, "claude"),
        ("anthropic", "claude-haiku-4-5", 200_000, "claude"),
        ("anthropic", "claude-3-7-sonnet-latest", 200_000, "claude"),
        ("anthropic", "claude-3-5-haiku-20241022", 200_000, "claude"),
        ("gemini", "gemini-2.5-pro", 1_048_576, "gemini"),
        ("gemini", "models/gemini-2.5-flash", 1_048_576, "gemini"),
        ("gemini", "gemini-2.5-flash-preview-05-20", 1_048_576, "gemini"),
        ("vertex", "gemini-2.0-flash-001", 1_048_576, "gemini"),
        ("gemini", "gemini-1.5-pro-002", 2_097_152, "gemini"),
        ("ollama", "llama3.1", 131_072, "llama"),
        ("ollama", "llama3.1:8b", 131_072, "llama"),
        ("ollama", "llama3.2:3b-instruct-q4_K_M", 131_072, "llama"),
        ("ollama", "qwen2.5:14b", 32_768, "llama"),
        ("ollama", "mistral:7b", 32_768, "llama"),
        ("ollama", "gemma2:9b", 8_192, "llama"),
        ("ollama", "phi3", 4_096, "llama"),
        ("ollama", "phi3:mini-128k-instruct", 131_072, "llama"),
        ("ollama", "deepseek-r1:14b", 131_072, "llama"),
        ("OpenAI", "  GPT-4o  ", 128_000, "o200k_base"),
    ],
)
def test_known_models_resolve_with_versions_and_tags(
    provider: str, model: str, window: int, tokenizer: str
) -> None:
    caps = capabilities_for(provider, model)
    assert caps.known
    assert caps.context_window == window
    assert caps.tokenizer == tokenizer
    assert caps.model == model.strip()
    assert caps.provider == provider.strip().lower()


def test_an_exact_name_beats_its_family_prefix() -> None:
    first_snapshot = capabilities_for("openai", "gpt-4o-2024-05-13")
    later_snapshot = capabilities_for("openai", "gpt-4o-2024-08-06")
    assert (first_snapshot.max_output_tokens, first_snapshot.strict_schema) == (4_096, False)
    assert (later_snapshot.max_output_tokens, later_snapshot.strict_schema) == (16_384, True)


def test_the_longest_prefix_wins_and_must_end_at_a_separator() -> None:
    assert capabilities_for("openai", "gpt-4o-mini-2024-07-18").max_output_tokens == 16_384
    assert capabilities_for("anthropic", "claude-opus-4-1-20250805").max_output_tokens == 32_000
    assert capabilities_for("anthropic", "claude-opus-4-20250514").strict_schema is False
    # "gpt-4.5-preview" is not gpt-4o, nor any other row.
    assert not capabilities_for("openai", "gpt-4.5-preview").known
    assert not capabilities_for("ollama", "llama3x").known


def test_capability_flags_follow_the_documented_matrix() -> None:
    gpt = capabilities_for("openai", "gpt-4.1")
    assert (gpt.tools, gpt.strict_schema, gpt.json_mode) == (True, True, True)
    o1_mini = capabilities_for("openai", "o1-mini")
    assert (o1_mini.tools, o1_mini.strict_schema) == (False, False)
    assert capabilities_for("anthropic", "claude-sonnet-4-6").strict_schema
    assert not capabilities_for("anthropic", "claude-3-5-sonnet-20241022").strict_schema
    assert capabilities_for("ollama", "llama3.1").tools
    assert capabilities_for("ollama", "llama3.1").weaknesses[0] == capabilities.WEAK_TOOL_USE
    assert not capabilities_for("ollama", "gemma2").tools
    assert (
        capabilities.WEAK_NESTED_SCHEMAS
        in capabilities_for("gemini", "gemini-1.5-flash").weaknesses
    )


def test_gpt5_caps_input_below_its_window() -> None:
    caps = capabilities_for("openai", "gpt-5")
    assert (caps.context_window, caps.max_output_tokens, caps.max_input_tokens) == (
        400_000,
        128_000,
        272_000,
    )


def test_no_provider_searches_every_section() -> None:
    assert capabilities_for("", "claude-opus-4-7").provider == "anthropic"
    assert capabilities_for("", "gpt-4o").provider == "openai"
    assert capabilities_for("", "qwen2.5:7b").provider == "ollama"


@pytest.mark.parametrize(
    ("provider", "model"),
    [
        ("azure", "gpt-4o"),  # a deployment name says nothing about the model behind it
        ("azure", "my-gpt4o-deployment"),
        ("openai_compatible", "gpt-4o"),
        ("vllm", "meta-llama/Llama-3.1-8B-Instruct"),
        ("openrouter", "openai/gpt-4o"),
        ("openai", "gpt-9-ultra"),
        ("somecloud", "claude-opus-4-7"),
        ("", "totally-new-model"),
    ],
)
def test_unknown_models_get_the_conservative_default(provider: str, model: str) -> None:
    caps = capabilities_for(provider, model)
    assert caps == ModelCapabilities(
        provider=provider,
        model=model,
        context_window=UNKNOWN_CONTEXT_WINDOW,
        max_output_tokens=UNKNOWN_MAX_OUTPUT,
        tools=False,
        strict_schema=False,
        json_mode=False,
        tokenizer="unknown",
        weaknesses=(),
        known=False,
    )
    [warning] = run_start_warnings(caps, uses_tools=True, wants_strict_schema=True)
    assert "not in the capability matrix" in warning
    assert "8,192 tokens" in warning
    # The variable serves a Python caller too: the warning names no argument (the
    # command line prints it as it is).
    assert "capability_matrix" not in warning
    assert "FLUID_CAPABILITY_MATRIX=" in warning


# -- overrides ----------------------------------------------------------------------


def test_overrides_replace_matrix_values() -> None:
    caps = capabilities_for(
        "azure",
        "prod-gpt4o",
        {
            "context_window": 128_000,
            "max_output_tokens": 16_384,
            "tools": True,
            "strict_schema": True,
            "json_mode": True,
            "tokenizer": "o200k_base",
        },
    )
    assert (caps.context_window, caps.max_output_tokens) == (128_000, 16_384)
    assert (caps.tools, caps.strict_schema, caps.json_mode) == (True, True, True)
    assert caps.tokenizer == "o200k_base"
    assert not caps.known  # still not in the matrix; the caller vouched for it


def test_a_window_override_replaces_the_providers_input_cap() -> None:
    caps = capabilities_for("openai", "gpt-5", {"context_window": 300_000})
    assert (caps.context_window, caps.max_input_tokens) == (300_000, None)
    assert capabilities_for("openai", "gpt-5", {"tools": False}).max_input_tokens == 272_000


def test_preflight_keys_are_validated_but_not_capabilities() -> None:
    plain = capabilities_for("ollama", "llama3.1")
    assert capabilities_for(
        "ollama", "llama3.1", {"output_reservation": 0, "preflight": False}
    ) == (plain)


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        ({"context_window": "128k"}, "'context_window'] must be a whole number >= 1"),
        ({"context_window": 0}, "must be a whole number >= 1"),
        ({"context_window": True}, "must be a whole number"),
        ({"context_window": 128_000.0}, "must be a whole number"),
        ({"max_output_tokens": -1}, "'max_output_tokens'] must be a whole number >= 1"),
        ({"output_reservation": -5}, "'output_reservation'] must be a whole number >= 0"),
        ({"tools": "yes"}, "'tools'] must be True or False"),
        ({"strict_schema": 1}, "'strict_schema'] must be True or False"),
        ({"preflight": None}, "'preflight'] must be True or False"),
        ({"tokenizer": "sentencepiece"}, "'tokenizer'] must be one of"),
        ({"tokenizer": ["claude"]}, "'tokenizer'] must be one of"),  # unhashable: no TypeError
        ({"context_windw": 128_000}, "unknown key(s) 'context_windw'"),
    ],
)
def test_a_bad_override_raises_value_error(overrides: dict[str, object], fragment: str) -> None:
    with pytest.raises(ValueError, match=re.escape(fragment)):
        capabilities_for("openai", "gpt-4o", overrides)


def test_a_non_mapping_override_raises_value_error() -> None:
    with pytest.raises(ValueError, match="must be a mapping"):
        capabilities_for("openai", "gpt-4o", [("context_window", 1)])  # type: ignore[arg-type]


# -- larger-window suggestions ------------------------------------------------------


def _window(entry: str) -> int:
    match = re.search(r"\(([\d,]+)( input)?\)$", entry)
    assert match, entry
    return int(match.group(1).replace(",", ""))


def test_suggestions_are_nearest_larger_first() -> None:
    found = models_with_larger_window(200_000)
    assert found == [
        "openai:gpt-5 (272,000 input)",
        "openai:gpt-5.4 (922,000 input)",
        "anthropic:claude-opus-4-7 (1,000,000)",
        "openai:gpt-4.1 (1,047,576)",
        "gemini:gemini-2.5-pro (1,048,576)",
    ]
    windows = [_window(entry) for entry in found]
    assert windows == sorted(windows)
    assert all(window > 200_000 for window in windows)


def test_suggestions_filter_by_provider_and_limit() -> None:
    assert models_with_larger_window(200_000, provider="anthropic") == [
        "anthropic:claude-opus-4-7 (1,000,000)"
    ]
    assert models_with_larger_window(100_000, provider="vertex", limit=1) == [
        "gemini:gemini-2.5-pro (1,048,576)"
    ]
    assert len(models_with_larger_window(0, limit=2)) == 2
    assert models_with_larger_window(0, limit=0) == []
    assert models_with_larger_window(100_000, provider="azure") == []


def test_local_models_are_suggested_only_to_local_runs() -> None:
    assert not any(entry.startswith("ollama:") for entry in models_with_larger_window(0, limit=50))
    local = models_with_larger_window(8_192, provider="ollama", limit=3)
    assert local == [
        "ollama:codellama (16,384)",
        "ollama:qwen2.5 (32,768)",
        "ollama:llama3.3 (131,072)",
    ]


def test_retired_models_are_never_suggested() -> None:
    assert models_with_larger_window(1_048_576) == []  # gemini-1.5-pro (2M) is retired
    everything = " ".join(models_with_larger_window(0, limit=100))
    for retired in ("gemini-1.5", "claude-3-", "o1-mini", "gpt-3.5", "gpt-4-turbo"):
        assert retired not in everything


# -- run-start warnings -------------------------------------------------------------


def test_a_capable_model_has_nothing_to_say() -> None:
    caps = capabilities_for("anthropic", "claude-sonnet-4-6")
    assert run_start_warnings(caps, uses_tools=True, wants_strict_schema=True) == []


@pytest.mark.parametrize("model", ["gemma2", "phi3", "llama3"])
def test_a_tight_window_is_flagged(model: str) -> None:
    caps = capabilities_for("ollama", model)
    assert caps.context_window < TIGHT_CONTEXT
    [warning] = run_start_warnings(caps)
    assert "tight window" in warning
    # No tools, no agent loop: compaction is no advice for a plain call or a batch.
    assert "FLUID_AGENT_COMPACT_AFTER" not in warning
    assert "shorten them" in warning
    looped = run_start_warnings(caps, uses_tools=True)
    assert "FLUID_AGENT_COMPACT_AFTER=4" in looped[0]


def test_tools_warnings_only_when_the_run_uses_tools() -> None:
    llama = capabilities_for("ollama", "llama3.1")
    assert run_start_warnings(llama) == []
    [weak] = run_start_warnings(llama, uses_tools=True)
    assert "weak tool use" in weak
    gemma = capabilities_for("ollama", "gemma2")
    assert any(
        "does not support tool calls" in w for w in run_start_warnings(gemma, uses_tools=True)
    )


def test_schema_warnings_only_when_the_run_wants_strict_output() -> None:
    old_claude = capabilities_for("anthropic", "claude-3-5-sonnet-20241022")
    assert run_start_warnings(old_claude) == []
    [no_strict] = run_start_warnings(old_claude, wants_strict_schema=True)
    assert "no strict structured output" in no_strict
    [nested] = run_start_warnings(
        capabilities_for("gemini", "gemini-1.5-flash"), wants_strict_schema=True
    )
    assert "large nested schemas" in nested
    assert "gemini-2.5-flash" in nested


def test_a_prompt_over_80_percent_of_the_window_is_flagged() -> None:
    caps = capabilities_for("openai", "gpt-4o")
    assert run_start_warnings(caps, prompt_tokens=102_400) == []  # exactly 80 %
    [warning] = run_start_warnings(caps, prompt_tokens=120_000)
    assert "94%" in warning
    assert "120,000 of 128,000 tokens" in warning


def test_warnings_come_in_a_stable_order() -> None:
    caps = capabilities_for("ollama", "gemma2")
    warnings = run_start_warnings(
        caps, uses_tools=True, wants_strict_schema=True, prompt_tokens=8_000
    )
    expected = ["tight window", "does not support tool calls", "already uses 98%"]
    assert len(warnings) == len(expected)
    for warning, fragment in zip(warnings, expected, strict=True):
        assert fragment in warning


# -- the banner ---------------------------------------------------------------------

WARNINGS = ["first thing is degraded", "second thing is degraded"]


def test_the_banner_prints_and_logs_each_warning(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="fluid_build.capabilities")
    stream = io.StringIO()
    emit_run_start_banner(WARNINGS, env={}, stream=stream)
    assert stream.getvalue() == (
        "fluid: 2 capability warnings for this run (FLUID_QUIET=1 hides this):\n"
        "  ! first thing is degraded\n"
        "  ! second thing is degraded\n"
    )
    records = [r for r in caplog.records if r.name == "fluid_build.capabilities"]
    # INFO: the banner is the warning; a WARNING record would be printed a second time.
    assert [(r.levelno, r.getMessage()) for r in records] == [
        (logging.INFO, "capability: first thing is degraded"),
        (logging.INFO, "capability: second thing is degraded"),
    ]


@pytest.mark.parametrize("variable", ["FLUID_QUIET", "FLUID_NONINTERACTIVE"])
@pytest.mark.parametrize("value", ["1", "true", "YES", " on "])
def test_quiet_or_noninteractive_hides_the_banner_but_logs_the_count(
    variable: str, value: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="fluid_build.capabilities")
    stream = io.StringIO()
    emit_run_start_banner(WARNINGS, env={variable: value}, stream=stream)
    assert stream.getvalue() == ""
    records = [r for r in caplog.records if r.name == "fluid_build.capabilities"]
    assert len(records) == 1
    assert records[0].levelno == logging.INFO
    assert records[0].getMessage().startswith("2 capability warnings for this run")
    assert f"{variable}=1" in records[0].getMessage()


def test_quiet_reads_the_process_environment_and_stderr_by_default(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    emit_run_start_banner(["one"])
    assert "fluid: 1 capability warning for this run" in capsys.readouterr().err
    monkeypatch.setenv("FLUID_QUIET", "1")
    emit_run_start_banner(["one"])
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("value", ["0", "false", "", "off"])
def test_a_false_flag_shows_the_banner(value: str) -> None:
    stream = io.StringIO()
    emit_run_start_banner(["one"], env={"FLUID_QUIET": value}, stream=stream)
    assert "! one" in stream.getvalue()


def test_a_garbage_flag_warns_and_shows_the_banner(caplog: pytest.LogCaptureFixture) -> None:
    stream = io.StringIO()
    emit_run_start_banner(["one"], env={"FLUID_QUIET": "maybe"}, stream=stream)
    assert "! one" in stream.getvalue()
    assert any(
        "FLUID_QUIET='maybe' is not a yes/no value" in r.getMessage() for r in caplog.records
    )


def test_no_warnings_no_banner(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="fluid_build.capabilities")
    stream = io.StringIO()
    emit_run_start_banner([], env={}, stream=stream)
    assert stream.getvalue() == ""
    assert caplog.records == []


def test_the_banner_works_end_to_end_for_a_degraded_run() -> None:
    caps = capabilities_for("ollama", "gemma2:9b")
    stream = io.StringIO()
    emit_run_start_banner(run_start_warnings(caps, uses_tools=True), env={}, stream=stream)
    lines = stream.getvalue().splitlines()
    assert lines[0] == "fluid: 2 capability warnings for this run (FLUID_QUIET=1 hides this):"
    assert lines[1].startswith("  ! ollama:gemma2:9b has a tight window of 8,192 tokens")


# -- the matrix itself and its documentation ----------------------------------------


def test_every_row_is_consistent() -> None:
    for section, rows in capabilities._MATRIX.items():
        names = [row.model for row in rows]
        assert len(names) == len(set(names)), section
        for row in rows:
            assert row.model == row.model.strip().lower()
            assert row.tokenizer in capabilities.TOKENIZERS
            assert 0 < row.max_output_tokens <= row.context_window
            assert row.max_input_tokens is None or row.max_input_tokens < row.context_window


def test_the_documented_matrix_is_the_matrix() -> None:
    doc = Path(__file__).parents[1] / "docs" / "capability-warnings.md"
    pattern = re.compile(r"^\| (\w+) \| `([^`]+)` \| ([\d,]+) \| ([\w, ]+) \|\s*([\d,]*)\s*\|")
    documented = set()
    for line in doc.read_text(encoding="utf-8").splitlines():
        match = pattern.match(line)
        if match:
            section, model, window, output, cap = match.groups()
            documented.add((section, model, window, output.strip(), cap))
    actual = {
        (
            section,
            row.model,
            f"{row.context_window:,}",
            "shares window" if section == "ollama" else f"{row.max_output_tokens:,}",
            f"{row.max_input_tokens:,}" if row.max_input_tokens else "",
        )
        for section, rows in capabilities._MATRIX.items()
        for row in rows
    }
    assert documented == actual


@pytest.mark.parametrize("module", [capabilities, preflight])
def test_the_public_surface_is_real(module: object) -> None:
    names = module.__all__  # type: ignore[attr-defined]
    assert len(names) == len(set(names))  # the order is ruff's (RUF022)
    assert all(hasattr(module, name) for name in names)


# -- FLUID_CAPABILITY_MATRIX ----------------------------------------------------------

MATRIX_ENV = "FLUID_CAPABILITY_MATRIX"


def from_env(value: str, provider: str = "azure", model: str = "prod-gpt4o") -> dict[str, object]:
    return capabilities.capability_matrix_from_env({MATRIX_ENV: value}, provider, model)


@pytest.mark.parametrize("value", ["", "   "])
def test_an_unset_or_blank_matrix_overrides_nothing(value: str) -> None:
    assert capabilities.capability_matrix_from_env({}, "azure", "x") == {}
    assert from_env(value) == {}
    assert from_env("{}") == {}


def test_inline_json_overrides_every_model() -> None:
    value = '{"context_window": 32768, "tools": true, "tokenizer": "o200k_base"}'
    expected = {"context_window": 32_768, "tools": True, "tokenizer": "o200k_base"}
    assert from_env(value) == expected
    assert from_env(value, "ollama", "llama3.1") == expected


def test_a_keyed_matrix_applies_per_model() -> None:
    value = (
        '{"azure:prod-gpt4o": {"context_window": 128000}, "llama3.1:8b": {"context_window": 8192},'
        ' "Prod-GPT4o": {"context_window": 1}}'
    )
    assert from_env(value) == {"context_window": 128_000}  # provider:model wins
    assert from_env(value, "openai_compatible", "prod-gpt4o") == {"context_window": 1}
    assert from_env(value, "ollama", "llama3.1:8b") == {"context_window": 8_192}
    assert from_env(value, "openai", "gpt-4o") == {}


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("matrix.json", '{"context_window": 65536, "strict_schema": false}'),
        ("matrix.yaml", "context_window: 65536\nstrict_schema: false\n"),
        ("matrix", "{context_window: 65536, strict_schema: no}"),
    ],
)
def test_a_matrix_file_is_read_as_json_or_yaml(tmp_path: Path, name: str, content: str) -> None:
    path = tmp_path / name
    path.write_text(content)
    assert from_env(f"  {path}  ") == {"context_window": 65_536, "strict_schema": False}


def test_a_matrix_path_expands_the_home_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "caps.yaml").write_text("azure:prod-gpt4o: {tools: true}\n")
    assert from_env("~/caps.yaml") == {"tools": True}


def _big(tmp_path: Path) -> str:
    path = tmp_path / "big.json"
    path.write_text('{"context_window": 1' + " " * 70_000 + "}")
    return str(path)


def _deep(tmp_path: Path) -> str:
    return '{"a": {"b": {"c": {"d": {"e": 1}}}}}'


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ('{"context_window": 32768,}', "is not valid JSON (Expecting property name"),
        ('{"context_window": "32k"}', "['context_window'] must be a whole number >= 1, not '32k'"),
        ('{"context_window": 32768.0}', "must be a whole number"),
        ('{"tools": "yes"}', "['tools'] must be true or false, not 'yes'"),
        ('{"tokenizer": "bpe"}', "['tokenizer'] must be one of"),
        ('{"context_windw": 32768}', "has unknown key(s) 'context_windw'; known keys:"),
        ('{"m": {"tools": 1}}', "['m']['tools'] must be true or false, not 1"),
        ('{"m": {"windw": 1}}', "['m'] has unknown key(s) 'windw'"),
        ('{"tools": true, "m": {"tools": true}}', "mixes override keys (tools) with per-model"),
        ("[1, 2]", "must hold an object of overrides, not list"),
        ("/no/such/matrix.json", "names the file '/no/such/matrix.json', which does not exist"),
        ("/dev/null", "names the file '/dev/null', which is a character device"),
        (_big, "is larger than 64 KiB"),
        (_deep, "nests deeper than 4 levels"),
        ("{" + " " * 70_000 + "}", "is longer than 65,536 characters"),
    ],
)
def test_a_bad_matrix_is_a_typed_error_naming_the_variable(
    tmp_path: Path, value: object, fragment: str
) -> None:
    from fluid_build.copilot.agents.errors import ProviderError

    text = value(tmp_path) if callable(value) else str(value)
    with pytest.raises(ProviderError) as caught:
        from_env(text)
    error = caught.value
    assert error.code == "llm.not_configured"
    assert not error.retryable
    assert fragment in error.message
    assert error.message.startswith(MATRIX_ENV)
    assert f"e.g. {MATRIX_ENV}='{{" in error.message
    assert error.details["variable"] == MATRIX_ENV
    assert error.details["example"] == '{"context_window": 32768, "tools": true}'


def test_a_matrix_file_that_is_a_directory_or_not_text_is_refused(tmp_path: Path) -> None:
    from fluid_build.copilot.agents.errors import ProviderError

    with pytest.raises(ProviderError, match="which is a directory, not a regular file"):
        from_env(str(tmp_path))
    binary = tmp_path / "m.yaml"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ProviderError, match="not UTF-8 text"):
        from_env(str(binary))
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("a: [1,\n")
    with pytest.raises(ProviderError, match="not valid YAML at line"):
        from_env(str(bad_yaml))


def test_a_matrix_error_never_shows_a_key() -> None:
    from fluid_build.copilot.agents.errors import ProviderError

    key = "sk-proj-" + "Z9y8X7w6V5u4T3s2R1q0" * 2
    with pytest.raises(ProviderError) as caught:
        from_env(f"/tmp/{key}/matrix.json")
    assert key not in str(caught.value)


def test_the_client_reads_the_matrix_and_its_argument_wins() -> None:
    from fluid_build.copilot.client import LLMClient

    env = {
        "AZURE_OPENAI_API_KEY": "k",
        "AZURE_OPENAI_ENDPOINT": "https://r.openai.azure.com",
        "FLUID_LLM_MODEL": "prod-gpt4o",
        MATRIX_ENV: '{"context_window": 128000, "tools": true, "strict_schema": true}',
    }
    with LLMClient("azure", env=env) as client:
        assert client.capabilities.context_window == 128_000
        assert client.capabilities.tools
        # Described by its real window: judged like a known model, so nothing to say.
        assert client.run_start_warnings(uses_tools=True, banner=False) == []
    with LLMClient("azure", env=env, capability_matrix={"tools": False}) as client:
        assert client.capability_matrix == {
            "context_window": 128_000,
            "tools": False,
            "strict_schema": True,
        }


def test_a_bad_matrix_stops_the_client_before_any_request() -> None:
    from fluid_build.copilot.agents.errors import ProviderError
    from fluid_build.copilot.client import LLMClient

    env = {"OPENAI_API_KEY": "k", MATRIX_ENV: '{"tools": "yes"}'}
    with pytest.raises(ProviderError) as caught:
        LLMClient("openai", env=env)
    assert caught.value.code == "llm.not_configured"


def test_the_preflight_uses_the_window_from_the_environment() -> None:
    from fluid_build.copilot.agents.errors import ContextOverflowError
    from fluid_build.copilot.client import LLMClient

    env = {"OPENAI_API_KEY": "k", "OPENAI_BASE_URL": "http://127.0.0.1:9/v1"}
    prompt = [{"role": "user", "content": "word " * 20_000}]
    with LLMClient("openai_compatible", "my-model", env=env) as client:
        with pytest.raises(ContextOverflowError) as caught:
            client._prepare(
                prompt,
                system=None,
                response_model=None,
                tools=None,
                max_output_tokens=None,
                capability_matrix=None,
            )
        assert caught.value.details["window_source"] == "default"
    told = {**env, MATRIX_ENV: '{"context_window": 200000}'}
    with LLMClient("openai_compatible", "my-model", env=told) as client:
        client._prepare(
            prompt,
            system=None,
            response_model=None,
            tools=None,
            max_output_tokens=None,
            capability_matrix=None,
        )


def test_an_overridden_window_replaces_the_unknown_model_warning() -> None:
    told = capabilities_for("azure", "prod", {"context_window": 8_192})
    assert told.overridden == ("context_window",)
    [tight] = run_start_warnings(told)
    assert "tight window of 8,192 tokens" in tight
    tools_only = capabilities_for("azure", "prod", {"tools": True})
    [unknown] = run_start_warnings(tools_only, uses_tools=True)
    assert "not in the capability matrix" in unknown
