"""What `fluid` tells an operator when a command fails: the class, the code, one line, a hint.

Every hint is a next step a shell can take: a flag of a real `fluid` command, an
environment variable the code really reads, a `fluid` command that exists, or
a wait until a clock time. None names a Python argument.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime
from functools import cache
from pathlib import Path

import click
import httpx
import pytest
import respx
from click.testing import CliRunner

from fluid_build.cli import _register, cli
from fluid_build.cli._messages import BUG_LINE, describe, render_error, report_error
from fluid_build.cli.exit_codes import EXIT_CODES
from fluid_build.cli.forge import EXAMPLE_INTENT
from fluid_build.copilot.agents.errors import (
    REASON_CODES,
    AgentExecutionError,
    ContextOverflowError,
    ProviderAuthError,
    ProviderError,
    ProviderServerError,
    RateLimitError,
)
from fluid_build.copilot.call.capabilities import (
    capabilities_for,
    capability_matrix_from_env,
    run_start_warnings,
)
from fluid_build.copilot.call.envelope import RetryPolicy
from fluid_build.copilot.call.preflight import check_context
from fluid_build.copilot.llm.settings import DEFAULT_TIMEOUT, PROVIDERS, resolve_provider_config
from fluid_build.errors import FluidError
from fluid_build.forge.app import OutputTreeError
from fluid_build.forge.intent import IntentError

_register()

SRC = Path(__file__).parents[1] / "src" / "fluid_build"
DOCS = Path(__file__).parents[1] / "docs"
# 2026-05-01 14:02:10 UTC: a wait of 62 s ends at 14:03:12.
NOW = datetime(2026, 5, 1, 14, 2, 10, tzinfo=UTC).timestamp()
KEY = "sk-proj-" + "A1b2C3d4E5f6G7h8I9j0" * 2

# -- what a hint may name -----------------------------------------------------------

ENV_VAR = re.compile(r"\b[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+\b")
# A Python keyword argument (`provider=`, `max_llm_calls=`) or a call (`Budget(`).
PYTHON_ARGUMENT = re.compile(r"(?<![A-Za-z0-9_-])[a-z][a-z0-9_]*=|\b[A-Za-z_][A-Za-z0-9_]*\(")
# A snake_case name outside quotes and backticks: an attribute or argument of the API.
SNAKE_NAME = re.compile(r"\b[a-z][a-z0-9]*_[a-z0-9_]+\b")
FLAG = re.compile(r"(?<![\w`-])--[a-z][a-z0-9-]*")
COMMAND = re.compile(r"`fluid ([^`]*)`")
QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"|`[^`]*`")
# What the variables the hints quote a default for are, in the code.
DEFAULTS = {
    "FLUID_LLM_MAX_ATTEMPTS": RetryPolicy().attempts,
    "FLUID_LLM_TIMEOUT_SECONDS": int(DEFAULT_TIMEOUT),
}


@cache
def read_variables() -> frozenset[str]:
    """Every quoted upper-case name in fluid_build's source and in httpx's (which reads
    SSL_CERT_FILE)."""
    roots = [SRC, Path(httpx.__file__).parent]
    found: set[str] = set()
    for root in roots:
        for path in root.rglob("*.py"):
            text = path.read_text(encoding="utf-8")
            found.update(re.findall(r"[\"']([A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+)[\"']", text))
    return frozenset(found)


def walk(command: click.Command) -> Iterator[click.Command]:
    yield command
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            yield from walk(sub)


def options(command: click.Command) -> set[str]:
    return {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)}


@cache
def every_flag() -> frozenset[str]:
    return frozenset(flag for command in walk(cli) for flag in options(command))


def check_command(words: str) -> None:
    """``fluid <words>`` names a real command, and each of its flags is one of that command's."""
    command: click.Command = cli
    for word in words.split():
        if word.startswith("-"):
            assert word in options(command), f"`fluid {words}`: no {word} on {command.name}"
        elif isinstance(command, click.Group):
            assert word in command.commands, f"`fluid {words}`: no command {word!r}"
            command = command.commands[word]
    assert not isinstance(command, click.Group), f"`fluid {words}` names a group"


def check_operator_text(text: str, *, foreign_flags: frozenset[str] = frozenset()) -> None:
    """One line that names only flags, variables and commands an operator can use."""
    assert text, "no hint"
    assert "\n" not in text
    assert text == text.strip()
    assert not PYTHON_ARGUMENT.search(text), text
    bare = QUOTED.sub("", text).replace("fluid_build", "")  # the package's own name
    assert not SNAKE_NAME.search(bare), f"a Python name in {text!r}"
    for forbidden in ("capability_matrix", "Budget", "max_output_tokens", "validation_errors"):
        assert forbidden not in text
    for name in ENV_VAR.findall(text):
        assert name in read_variables(), f"{name} is not read anywhere: {text!r}"
    for words in COMMAND.findall(text):
        check_command(words)
    for flag in FLAG.findall(text):
        assert flag in every_flag() or flag in foreign_flags, f"no fluid flag {flag}: {text!r}"
    for name, value in re.findall(r"\b([A-Z][A-Z0-9_]+) \(default (\d+)\)", text):
        assert DEFAULTS.get(name, int(value)) == int(value), f"{name}'s default is not {value}"


# -- every reason code --------------------------------------------------------------


@pytest.mark.parametrize("code", sorted(REASON_CODES))
def test_every_reason_code_has_an_operator_hint(code: str) -> None:
    row = REASON_CODES[code]
    check_operator_text(row.action)
    assert row.action.endswith(".")
    if row.waited is not None:
        assert row.waited.count("{wait}") == 1
        check_operator_text(row.waited.format(wait="until 14:03:12 UTC (62 s)"))
        check_operator_text(row.waited.format(wait="62 s"))


def test_no_hint_says_usually_nothing_after_the_envelope_gave_up() -> None:
    for code in ("llm.rate_limited", "llm.server_error", "llm.overloaded", "llm.timeout"):
        assert "Usually nothing" not in REASON_CODES[code].action
        assert "run again" in REASON_CODES[code].action.lower()


def test_the_checks_catch_what_they_are_for() -> None:
    for bad in (
        "Raise Budget(max_llm_calls=...).",
        "Pass provider= and model=.",
        "Override capability_matrix['tools'].",
        "Read validation_errors.",
        "Raise FLUID_NOT_A_VARIABLE.",
        "Run `fluid doctor --nope`.",
        "Run `fluid frobnicate`.",
        "Use --frobnicate.",
        "Raise FLUID_LLM_MAX_ATTEMPTS (default 7).",
        "two\nlines",
    ):
        with pytest.raises(AssertionError):
            check_operator_text(bad)


def test_the_docs_table_says_what_the_code_says() -> None:
    doc = (DOCS / "typed-errors.md").read_text(encoding="utf-8")
    rows = {
        match[0]: (match[1], match[2], match[3])
        for match in re.findall(r"^\| `([a-z_.]+)` \| (yes|no) \| (.+?) \| (.+?) \|$", doc, re.M)
    }
    for code, row in REASON_CODES.items():
        assert rows[code] == ("yes" if row.retryable else "no", row.meaning, row.action), code


# -- hints made for the error in hand ---------------------------------------------------


def test_a_rate_limit_hint_says_until_when_in_utc() -> None:
    error = RateLimitError("HTTP 429", provider="openai", retry_after=62)
    hint = error.hint(now=NOW)
    assert hint.startswith("Wait until 14:03:12 UTC (62 s) and run again; ")
    assert "FLUID_LLM_MAX_ATTEMPTS" in hint
    check_operator_text(hint)


@pytest.mark.parametrize(
    ("retry_after", "details", "until"),
    [
        (6.5, {}, "14:02:17 UTC (6.5 s)"),  # rounded up to the second
        (300, {}, "14:07:10 UTC (5 min)"),
        (300, {"retry_after_requested": 86_400}, "2026-05-02 14:02:10 UTC (24 h)"),
        (300, {"retry_after_requested": 5_400}, "15:32:10 UTC (90 min)"),
    ],
)
def test_a_wait_reads_as_a_clock_time_and_a_duration(
    retry_after: float, details: dict[str, object], until: str
) -> None:
    error = RateLimitError("x", retry_after=retry_after, details=details)
    assert error.hint(now=NOW).startswith(f"Wait until {until} and run again")


def test_a_wait_is_only_advised_where_waiting_helps() -> None:
    quota = RateLimitError("x", code="llm.quota_exhausted", retryable=False, retry_after=30)
    assert quota.hint(now=NOW) == quota.action == REASON_CODES["llm.quota_exhausted"].action
    no_wait = RateLimitError("x")
    assert no_wait.hint(now=NOW) == REASON_CODES["llm.rate_limited"].action
    now_ok = RateLimitError("x", retry_after=0)
    assert now_ok.hint(now=NOW) == REASON_CODES["llm.rate_limited"].action
    circuit = ProviderServerError("open", code="llm.circuit_open", retry_after=30)
    assert circuit.hint(now=NOW).startswith(
        "Wait until 14:02:40 UTC (30 s) for the breaker to half-open"
    )
    overloaded = ProviderServerError("busy", code="llm.overloaded", retry_after=10)
    assert overloaded.hint(now=NOW).startswith("Wait until 14:02:20 UTC (10 s) and run again")


def test_str_keeps_its_static_action_whatever_the_clock() -> None:
    error = RateLimitError("HTTP 429", retry_after=62)
    assert str(error) == (f"HTTP 429 (server asked to wait 62 s) [llm.rate_limited] {error.action}")
    assert error.summary == "HTTP 429 (server asked to wait 62 s)"


@pytest.mark.parametrize("provider", [*sorted(PROVIDERS), None])
def test_auth_hints_name_the_providers_own_variable(provider: str | None) -> None:
    hint = ProviderAuthError("bad key", provider=provider).hint(now=NOW)
    # A local server's own flag: the key must match the one it was started with.
    check_operator_text(hint, foreign_flags=frozenset({"--api-key"}))


def _overflow(provider: str, model: str, **matrix: object) -> ContextOverflowError:
    with pytest.raises(ContextOverflowError) as caught:
        check_context(
            provider=provider,
            model=model,
            system=None,
            messages=[{"role": "user", "content": "word " * 40_000}],
            capability_matrix=matrix or None,
        )
    return caught.value


def test_an_overflow_on_an_unknown_model_says_how_to_set_its_window() -> None:
    error = _overflow("openai_compatible", "my-local-model")
    assert """FLUID_CAPABILITY_MATRIX='{"context_window": <tokens>}'""" in error.hint()
    assert "8,192 tokens" in error.hint()
    check_operator_text(error.hint())
    assert "FLUID_CAPABILITY_MATRIX" in error.message
    assert "capability_matrix=" in error.message  # the Python name, with its variable


def test_an_overflow_on_a_known_model_offers_the_nearest_larger_one_as_flags() -> None:
    error = _overflow("ollama", "phi3")
    hint = error.hint()
    assert hint.startswith("Run again with a larger-window model (--provider ollama --model ")
    check_operator_text(hint)
    told = _overflow("openai_compatible", "my-local-model", context_window=9_000)
    assert "FLUID_CAPABILITY_MATRIX" not in told.hint()  # the window was given: it is real
    check_operator_text(told.hint())


def test_a_provider_reported_overflow_gets_the_tables_hint() -> None:
    error = ContextOverflowError("maximum context length", provider="openai")
    assert error.hint() == REASON_CODES["llm.context_overflow"].action


# -- the lines printed ----------------------------------------------------------------


def test_a_typed_error_prints_class_code_what_happened_and_a_hint() -> None:
    error = RateLimitError(
        "openai (gpt-4o) answered HTTP 429: Rate limit reached; gave up after 3 attempt(s)",
        provider="openai",
        retry_after=62,
    )
    assert render_error(error, now=NOW) == [
        "fluid: RateLimitError [llm.rate_limited]: openai (gpt-4o) answered HTTP 429: Rate "
        "limit reached; gave up after 3 attempt(s) (server asked to wait 62 s)",
        "hint: wait until 14:03:12 UTC (62 s) and run again; if it keeps happening, run fewer "
        "fluid processes at once on this key, or raise FLUID_LLM_MAX_ATTEMPTS (default 3) so "
        "the envelope retries longer.",
    ]


def test_a_variable_keeps_its_case_after_hint() -> None:
    error = AgentExecutionError("x", code="budget.rounds_exhausted")
    assert render_error(error)[1].startswith("hint: raise FLUID_AGENT_MAX_ROUNDS")
    assert describe(ProviderError("x", code="llm.unknown_error")).hint == (
        "this is likely a bug in fluid_build: report it with the command you ran and its "
        "--json output."
    )


def test_errors_that_are_not_typed_keep_their_line_and_get_a_hint_where_one_is_known(
    tmp_path: Path,
) -> None:
    intent = render_error(IntentError("the intent file x.yaml is not valid YAML at line 1"))
    assert intent == [
        "fluid: IntentError: the intent file x.yaml is not valid YAML at line 1",
        "hint: fix the file named above (or give another path) and run again.",
    ]
    tree = render_error(OutputTreeError(tmp_path, "models", "is a symbolic link"))
    assert tree[0].startswith("fluid: OutputTreeError: cannot write the output")
    assert tree[1].startswith("hint: remove the symbolic link named above, or choose another --out")
    assert render_error(RuntimeError("boom\nat line 2")) == [
        "fluid: RuntimeError: boom at line 2",
        BUG_LINE,
    ]


def test_a_replay_mismatch_shows_its_code_and_how_to_record_again() -> None:
    from fluid_build.corpus.compare import ReplayMismatch

    lines = render_error(ReplayMismatch("request 2: the request differs at model"))
    assert lines == [
        "fluid: ReplayMismatch [replay.mismatch]: request 2: the request differs at model",
        "hint: if the change is intended, record the run again (`fluid forge --record FILE`); "
        "otherwise replay the cassette with the intent, version and options (--temperature, "
        "--max-output-tokens, --seed) it was recorded with.",
    ]
    check_operator_text(lines[1].removeprefix("hint: "))


def test_an_error_that_offers_its_own_code_and_hint_is_shown_with_them() -> None:
    class Mismatch(FluidError):
        code = "replay.mismatch"

        def hint(self, *, now: float | None = None) -> str:
            return "Record the run again."

    message = describe(Mismatch("request 2 differs"))
    assert message.lines() == [
        "fluid: Mismatch [replay.mismatch]: request 2 differs",
        "hint: record the run again.",
        BUG_LINE,  # its exit code is still "internal" until it is mapped
    ]


def test_the_lines_are_redacted() -> None:
    typed = ProviderError(f"echoed {KEY}", secrets=[KEY])
    plain = RuntimeError(f"Authorization: Bearer {KEY}")
    for error in (typed, plain):
        lines = render_error(error, now=NOW)
        assert all(KEY not in line and "\n" not in line for line in lines)


def _report(exc: BaseException, *, as_json: bool) -> click.testing.Result:
    @click.command()
    def fail() -> None:
        raise SystemExit(report_error(exc, as_json=as_json))

    return CliRunner().invoke(fail, [])


def test_report_error_prints_the_lines_on_stderr() -> None:
    result = _report(RateLimitError("HTTP 429", retry_after=62), as_json=False)
    assert result.exit_code == EXIT_CODES["rate_limit"]
    assert result.stdout == ""
    first, hint = result.stderr.splitlines()
    assert first == "fluid: RateLimitError [llm.rate_limited]: HTTP 429 (server asked to wait 62 s)"
    assert re.fullmatch(r"hint: wait until [0-9:-]+ [0-9:]* ?UTC \(62 s\) and run again; .*", hint)


def test_the_json_carries_the_hint() -> None:
    result = _report(ProviderAuthError("no key", provider="anthropic"), as_json=True)
    payload = json.loads(result.stdout)
    assert payload["exit_code"] == EXIT_CODES["auth"]
    assert payload["error"]["code"] == "llm.auth"
    assert payload["error"]["hint"].startswith("check ANTHROPIC_API_KEY ")
    bug = json.loads(_report(RuntimeError("boom"), as_json=True).stdout)
    assert bug["error"] == {"error": "RuntimeError", "message": "boom", "hint": None}


def test_a_live_rate_limit_through_fluid_forge(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FLUID_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.setenv("FLUID_LLM_MAX_ATTEMPTS", "1")  # give up at once: nothing sleeps
    monkeypatch.setenv("FLUID_COOLDOWN_URL", "memory://")  # nor waits out the first run's 429
    intent = tmp_path / "intent.yaml"
    shutil.copy(EXAMPLE_INTENT, intent)
    body = {"error": {"message": "Rate limit reached", "type": "requests", "code": None}}
    with respx.mock(assert_all_called=True) as mock:
        mock.post("https://api.openai.com/v1/chat/completions").respond(
            429, json=body, headers={"retry-after": "62"}
        )
        result = CliRunner().invoke(cli, ["forge", str(intent), "--provider", "openai"])
        as_json = CliRunner().invoke(cli, ["forge", str(intent), "--json"])
    assert result.exit_code == EXIT_CODES["rate_limit"], result.output
    lines = result.stderr.splitlines()
    [headline] = [line for line in lines if line.startswith("fluid: RateLimitError")]
    assert headline.startswith("fluid: RateLimitError [llm.rate_limited]: openai (gpt-4o-mini)")
    assert "gave up after 1 attempt(s) (FLUID_LLM_MAX_ATTEMPTS sets how many)" in headline
    [hint] = [line for line in lines if line.startswith("hint: ")]
    assert re.match(r"hint: wait until \d\d:\d\d:\d\d UTC \(62 s\) and run again; ", hint)
    assert KEY not in result.output
    payload = json.loads(as_json.stdout.strip().splitlines()[-1])
    assert payload["error"]["hint"].startswith("wait until ")
    assert KEY not in as_json.output


# -- other messages: a Python name comes with its variable ------------------------------

# Each Python argument a message may name, and the variables that do the same.
EQUIVALENTS = {
    "provider=": ("FLUID_LLM_PROVIDER", "--provider"),
    "model=": ("FLUID_LLM_MODEL", "--model"),
    "api_key=": ("_API_KEY",),
    "base_url=": ("_BASE_URL", "AZURE_OPENAI_ENDPOINT", "OLLAMA_HOST"),
    "timeout=": ("FLUID_LLM_TIMEOUT_SECONDS",),
    "capability_matrix=": ("FLUID_CAPABILITY_MATRIX",),
}


def settings_errors() -> Iterator[ProviderError]:
    key = {"OPENAI_API_KEY": "k"}
    cases: list[tuple[tuple[object, ...], dict[str, object]]] = [
        ((), {"env": {}}),
        ((), {"env": {"OPENAI_API_KEY": "a", "ANTHROPIC_API_KEY": "b"}}),
        (("anthropic",), {"env": {}}),
        (("azure",), {"env": {"AZURE_OPENAI_API_KEY": "k"}}),
        (("azure",), {"env": {"AZURE_OPENAI_API_KEY": "k", "FLUID_LLM_MODEL": "d"}}),
        (("vllm",), {"env": {"FLUID_LLM_MODEL": "m"}}),
        (("openai",), {"base_url": "ftp://x", "env": key}),
        (("openai",), {"model": "bad\x01", "env": key}),
        (("nope",), {"env": {}}),
        (("openai",), {"timeout": -1.0, "env": key}),
        (("openai",), {"api_key": "two words", "env": {}}),
    ]
    for args, kwargs in cases:
        with pytest.raises(ProviderError) as caught:
            resolve_provider_config(*args, **kwargs)  # type: ignore[arg-type]
        yield caught.value
    remote = {"OLLAMA_HOST": "10.0.0.9:11434", "FLUID_OLLAMA_ALLOW_REMOTE": "maybe"}
    with pytest.raises(ProviderError) as caught:
        resolve_provider_config("ollama", env=remote)
    yield caught.value
    with pytest.raises(ProviderError) as caught:
        capability_matrix_from_env({"FLUID_CAPABILITY_MATRIX": '{"tools": "yes"}'}, "azure", "d")
    yield caught.value


@pytest.mark.parametrize("error", list(settings_errors()), ids=lambda e: e.message[:40])
def test_a_setting_that_cannot_be_used_gets_a_hint_naming_it(error: ProviderError) -> None:
    hint = error.hint(now=NOW)
    check_operator_text(hint)
    variable = error.details.get("variable")
    if error.code != "llm.auth" and isinstance(variable, str):
        assert hint.startswith(f"Set {variable} as the message says, e.g. {variable}=")


def test_a_json_example_is_quoted_for_the_shell() -> None:
    [*_, matrix] = settings_errors()
    assert matrix.hint() == (
        "Set FLUID_CAPABILITY_MATRIX as the message says, e.g. "
        """FLUID_CAPABILITY_MATRIX='{"context_window": 32768, "tools": true}', and run again; """
        "`fluid doctor` shows what is set."
    )


def warnings_and_messages() -> Iterator[str]:
    yield from (error.message for error in settings_errors())
    unknown = capabilities_for("azure", "prod-gpt4o")
    yield from run_start_warnings(unknown, uses_tools=True, wants_strict_schema=True)
    yield from run_start_warnings(
        capabilities_for("ollama", "gemma2"), uses_tools=True, wants_strict_schema=True
    )
    yield _overflow("openai_compatible", "my-local-model").message


@pytest.mark.parametrize("message", list(warnings_and_messages()))
def test_a_message_names_a_python_argument_only_with_its_equivalent(message: str) -> None:
    for argument in re.findall(r"(?<![A-Za-z0-9_-])([a-z][a-z0-9_]*=)", message):
        assert argument in EQUIVALENTS, f"{argument} has no equivalent: {message!r}"
        assert any(other in message for other in EQUIVALENTS[argument]), message
    for name in ENV_VAR.findall(message):
        assert name in read_variables(), name
    for words in COMMAND.findall(message):
        check_command(words)


# -- the command line names flags and variables, never a Python argument -----------------------

# What a first run can bring about before any request: (environment, arguments).
FIRST_RUNS = {
    "no-provider": ({}, ()),
    "several-keys": ({"OPENAI_API_KEY": "a", "ANTHROPIC_API_KEY": "b"}, ()),
    "no-key": ({}, ("--provider", "openai")),
    "unknown-provider": ({}, ("--provider", "nope")),
    "azure-no-endpoint": (
        {"AZURE_OPENAI_API_KEY": "k", "FLUID_LLM_MODEL": "d"},
        ("--provider", "azure"),
    ),
    "vllm-no-model": ({}, ("--provider", "vllm")),
    "vllm-no-url": ({"FLUID_LLM_MODEL": "m"}, ("--provider", "vllm")),
    "model-control-character": (
        {"OPENAI_API_KEY": "k"},
        ("--provider", "openai", "--model", "a\x01b"),
    ),
}


def _first_run(tmp_path: Path, extra: dict[str, str], args: tuple[str, ...]) -> str:
    from tests.test_cli_conventions import fluid, fresh_env

    home = tmp_path / "home"
    home.mkdir()
    intent = tmp_path / "intent.yaml"
    shutil.copy(EXAMPLE_INTENT, intent)
    done = fluid(home, "forge", str(intent), *args, env=fresh_env(home, **extra))
    assert done.returncode == EXIT_CODES["auth"], done.stdout + done.stderr
    assert done.stdout == ""
    return done.stderr


@pytest.mark.parametrize(("extra", "args"), FIRST_RUNS.values(), ids=FIRST_RUNS.keys())
def test_a_first_run_message_names_no_python_argument(
    tmp_path: Path, extra: dict[str, str], args: tuple[str, ...]
) -> None:
    stderr = _first_run(tmp_path, extra, args)
    headline, hint = stderr.splitlines()
    assert headline.startswith("fluid: Provider")
    assert not PYTHON_ARGUMENT.search(headline), headline
    assert "in Python" not in stderr
    check_operator_text(hint.removeprefix("hint: "))


def test_no_provider_names_the_variable_the_flag_and_setup(tmp_path: Path) -> None:
    headline, _ = _first_run(tmp_path, {}, ()).splitlines()
    assert "FLUID_LLM_PROVIDER" in headline
    assert "--provider" in headline
    assert "`fluid ai setup --provider <name>`" in headline
    assert "provider=" not in headline.replace("FLUID_LLM_PROVIDER=", "")


def test_a_python_caller_still_gets_the_argument_beside_the_variable() -> None:
    with pytest.raises(ProviderAuthError) as caught:
        resolve_provider_config(env={})
    assert "--provider (provider= in Python)" in caught.value.message
    assert "(provider= in Python)" not in describe(caught.value).headline
    with pytest.raises(ProviderAuthError) as no_key:
        resolve_provider_config("openai", env={})
    assert "OPENAI_API_KEY=<your key> (api_key= in Python)" in no_key.value.message
    shown = describe(no_key.value).headline
    assert "OPENAI_API_KEY=<your key>, or run `fluid ai setup --provider openai`" in shown


def test_the_unknown_model_warning_from_the_command_line_names_the_variable(
    tmp_path: Path,
) -> None:
    from tests.docs_model import model_server
    from tests.test_docs_commands import OPENAI_KEY, _environment

    home = tmp_path / "home"
    home.mkdir()
    (tmp_path / "prompts.txt").write_text("hello\n", encoding="utf-8")
    env = _environment(home)
    with model_server() as (base, _):
        env.update(OPENAI_API_KEY=OPENAI_KEY, OPENAI_BASE_URL=f"{base}/v1")
        done = subprocess.run(
            ["fluid", "batch", "prompts.txt", "--model", "my-odd-model"],  # noqa: S607
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert done.returncode == 0, done.stdout + done.stderr
    [warning] = [line for line in done.stderr.splitlines() if "capability matrix" in line]
    assert "FLUID_CAPABILITY_MATRIX=" in warning
    assert "capability_matrix" not in warning
    assert not PYTHON_ARGUMENT.search(QUOTED.sub("", warning)), warning


# -- a wait says whose it is, and the hint's time is the message's ------------------------------


def test_the_action_says_the_wait_the_server_named_not_a_minute() -> None:
    error = RateLimitError("HTTP 429", provider="openai", retry_after=2.0)
    assert error.action.startswith("Wait 2 s and run again; ")
    assert "Wait a minute" not in str(error)
    check_operator_text(error.action)
    capped = RateLimitError("x", retry_after=300, details={"retry_after_requested": 5_400})
    assert capped.action.startswith("Wait 90 min and run again; ")
    # No wait named: the table's advice.
    assert RateLimitError("x").action == REASON_CODES["llm.rate_limited"].action
    quota = RateLimitError("x", code="llm.quota_exhausted", retryable=False, retry_after=2.0)
    assert quota.action == REASON_CODES["llm.quota_exhausted"].action


def _open_breaker_refusal(now: float) -> ProviderServerError:
    from fluid_build.copilot.health.breaker import CircuitBreaker
    from fluid_build.copilot.health.cooldown import MemoryCooldownStore

    clock = [now]
    breaker = CircuitBreaker(
        MemoryCooldownStore(), threshold=1, cool_off=30, clock=lambda: clock[0]
    )
    breaker.record_failure("k", ProviderServerError("boom"))
    clock[0] += 0.6  # the next call comes a moment later: 29.4 s are left
    with pytest.raises(ProviderServerError) as caught:
        breaker.check("k", provider="openai", model="gpt-4o")
    return caught.value


def test_a_breaker_refusal_never_says_the_server_asked() -> None:
    error = _open_breaker_refusal(NOW)
    assert error.code == "llm.circuit_open"
    assert "server asked" not in error.summary
    assert "server asked" not in describe(error, now=NOW + 5).headline


def test_a_breaker_hint_reads_the_breakers_own_clock_time() -> None:
    error = _open_breaker_refusal(NOW)
    until = error.details["until"]
    assert isinstance(until, float)
    ends = datetime.fromtimestamp(math.ceil(until), UTC).strftime("%H:%M:%S")
    # Shown at once or a while later, the hint names the moment the breaker computed.
    for shown_at in (NOW + 0.6, NOW + 0.9, NOW + 7.0):
        hint = error.hint(now=shown_at)
        assert hint.startswith(f"Wait until {ends} UTC (29.4 s) for the breaker to half-open")
        check_operator_text(hint)
    assert error.action.startswith("Wait 29.4 s for the breaker to half-open")


@pytest.mark.parametrize(
    ("details", "words"),
    [
        ({"rate_limit_budget": True}, "its rate-limit budget resets"),
        ({"cooldown": True}, "is cooling down"),
    ],
)
def test_a_wait_fluid_set_itself_is_not_the_servers(details: dict[str, object], words: str) -> None:
    error = RateLimitError(f"openai key k: {words} in 12 s", retry_after=12, details=details)
    assert error.summary == f"openai key k: {words} in 12 s"
    served = RateLimitError("HTTP 429", retry_after=12, status_code=429)
    assert served.summary == "HTTP 429 (server asked to wait 12 s)"


def test_an_open_breaker_from_the_command_line(tmp_path: Path) -> None:
    from tests.test_cli_conventions import fluid, fresh_env

    home = tmp_path / "home"
    home.mkdir()
    (tmp_path / "prompts.txt").write_text("hello\n", encoding="utf-8")
    env = fresh_env(
        home,
        OPENAI_API_KEY=KEY,
        OPENAI_BASE_URL="http://127.0.0.1:9/v1",  # the discard port: nothing listens
        FLUID_BREAKER_THRESHOLD="1",
        FLUID_LLM_MAX_ATTEMPTS="1",
    )
    batch = ("batch", str(tmp_path / "prompts.txt"), "--model", "gpt-4o", "--json")
    first = fluid(home, *batch, env=env)
    assert first.returncode == EXIT_CODES["timeout"], first.stderr
    refused = fluid(home, *batch, env=env)
    assert refused.returncode == EXIT_CODES["server"], refused.stdout + refused.stderr
    [record, _] = [json.loads(line) for line in refused.stdout.splitlines()]
    assert record["error"]["code"] == "llm.circuit_open"
    assert "half-opens" in record["error"]["message"]
    assert "server asked" not in record["error"]["message"]
    assert "server asked" not in refused.stderr
    intent = tmp_path / "intent.yaml"
    shutil.copy(EXAMPLE_INTENT, intent)
    done = fluid(home, "forge", str(intent), "--model", "gpt-4o", "--json", env=env)
    assert done.returncode == EXIT_CODES["server"], done.stdout + done.stderr
    error = json.loads(done.stdout.strip().splitlines()[-1])["error"]
    assert error["code"] == "llm.circuit_open"
    assert "server asked" not in error["message"]
    ends = datetime.fromtimestamp(math.ceil(error["details"]["until"]), UTC)
    assert error["hint"].startswith(f"wait until {ends:%H:%M:%S} UTC (")
    assert KEY not in done.stdout + done.stderr


# -- an overflow's advice fits where it happened -------------------------------------------------


def test_compaction_is_advised_only_for_an_overflow_inside_an_agent_loop(tmp_path: Path) -> None:
    from fluid_build.copilot.loop.agent import AgentLoop, Budget, LoopSettings
    from tests.test_loop import ScriptedClient, count_rows

    plain = ContextOverflowError("maximum context length", provider="openai")
    assert "FLUID_AGENT_COMPACT_AFTER" not in plain.hint()
    assert "agent loop" not in plain.hint()
    check_operator_text(plain.hint())

    refused = ContextOverflowError("the prompt does not fit", prompt_tokens=9, context_window=8)
    client = ScriptedClient(refused, refused)  # still too long after compacting once
    agent = AgentLoop(
        client,  # type: ignore[arg-type]
        tools=[count_rows],
        workspace=tmp_path,
        settings=LoopSettings(),
        budget=Budget(max_llm_calls=3),
    )
    with pytest.raises(ContextOverflowError) as caught:
        agent.run("count")
    assert caught.value.details["agent_loop"] is True
    hint = caught.value.hint()
    assert "FLUID_AGENT_COMPACT_AFTER=4" in hint
    check_operator_text(hint)
    assert describe(caught.value).hint is not None
    assert "FLUID_AGENT_COMPACT_AFTER=4" in (describe(caught.value).hint or "")


def test_a_preflight_overflow_outside_a_loop_offers_the_model_not_compaction() -> None:
    hint = _overflow("ollama", "phi3").hint()
    assert hint.startswith("Run again with a larger-window model (--provider ollama --model ")
    assert "FLUID_AGENT_COMPACT_AFTER" not in hint
    looped = _overflow("ollama", "phi3").with_details(agent_loop=True).hint()
    assert "FLUID_AGENT_COMPACT_AFTER=4" in looped
    check_operator_text(looped)
