"""Each failure docs/cli.md lists ends `fluid forge` with the exit code the page gives.

Run from the console script in a fresh HOME against a model server on
loopback that fails the way a provider does (one attempt each: no waits).
Usage errors (2), intent and cassette errors (3), the output tree (4), the
prompts file of `fluid batch` (5), replay mismatches (30) and Ctrl-C (130)
have their own tests in test_cli_forge.py, test_cli_batch.py,
test_forge_live.py and test_cli_conventions.py;
:func:`test_every_documented_code_has_a_test` checks none is left out.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fluid_build.cli.exit_codes import EXIT_CODES
from tests.docs_model import Request, model_server
from tests.loopback import closed_port
from tests.test_docs_commands import EXAMPLE_INTENT, OPENAI_KEY, Place, _environment, run

ROOT = Path(__file__).resolve().parents[1]


def _error(status: int, message: str, kind: str, code: str | None) -> Any:
    def script(request: Request) -> tuple[int, dict[str, Any]]:
        return status, {"error": {"message": message, "type": kind, "param": None, "code": code}}

    return script


def _garbage(request: Request) -> tuple[int, dict[str, Any]]:
    return 200, {
        "id": "chatcmpl-x",
        "model": "gpt-4o-mini",
        "choices": [{"index": 0, "finish_reason": "stop", "message": {"content": "not json"}}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 2},
    }


def _always_a_tool(request: Request) -> tuple[int, dict[str, Any]] | None:
    if not request.body.get("tools"):
        return None  # the plan stage: answer it as a provider that behaves
    call = {"id": "call_1", "type": "function"}
    call["function"] = {"name": "discover_workspace", "arguments": "{}"}  # type: ignore[assignment]
    return 200, {
        "id": "chatcmpl-t",
        "model": "gpt-4o-mini",
        "choices": [
            {
                "index": 0,
                "finish_reason": "tool_calls",
                "message": {"role": "assistant", "content": None, "tool_calls": [call]},
            }
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 2},
    }


SCENARIOS: dict[str, tuple[int, Any, dict[str, str], str]] = {
    # name: (exit code, the server's script, extra environment, what the output names)
    "rejected key": (
        10,
        _error(
            401,
            "Incorrect API key provided: sk-proj-***",
            "invalid_request_error",
            "invalid_api_key",
        ),
        {},
        "ProviderAuthError",
    ),
    "rate limited": (
        11,
        _error(429, "Rate limit reached for requests", "requests", "rate_limit_exceeded"),
        {},
        "RateLimitError",
    ),
    "unreachable": (12, None, {"OPENAI_BASE_URL": "closed"}, "llm.network_error"),
    # A setting that cannot be used is configuration, as a missing key is: 10, not 15.
    "malformed endpoint": (10, None, {"OPENAI_BASE_URL": "http://["}, "llm.bad_endpoint"),
    "context overflow": (
        13,
        _error(
            400,
            "This model's maximum context length is 128000 tokens. However, your messages "
            "resulted in 130000 tokens. Please reduce the length of the messages.",
            "invalid_request_error",
            "context_length_exceeded",
        ),
        {},
        "ContextOverflowError",
    ),
    "server error": (
        14,
        _error(500, "The server had an error while processing your request.", "server_error", None),
        {},
        "ProviderServerError",
    ),
    "model not found": (
        15,
        _error(404, "The model `gpt-9` does not exist", "invalid_request_error", "model_not_found"),
        {},
        "llm.model_not_found",
    ),
    "output never valid": (20, _garbage, {}, "SchemaValidationError"),
    "budget spent": (
        22,
        _always_a_tool,
        {"FLUID_AGENT_MAX_ROUNDS": "2"},
        "budget.rounds_exhausted",
    ),
}


@pytest.fixture
def place(tmp_path: Path) -> Iterator[Place]:
    home, cwd = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    cwd.mkdir()
    with model_server() as (base, model):
        yield Place(cwd, home, base, model, _environment(home))


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_a_documented_failure_exits_with_its_code(place: Place, name: str) -> None:
    code, script, extra, says = SCENARIOS[name]
    place.model.script = script
    place.openai()
    place.env["FLUID_LLM_MAX_ATTEMPTS"] = "1"
    for variable, value in extra.items():
        place.env[variable] = f"http://127.0.0.1:{closed_port()}/v1" if value == "closed" else value
    shutil.copy(EXAMPLE_INTENT, place.cwd / "my-intent.yaml")
    flags = " --agent-loop" if name == "budget spent" else ""
    done = run(place, f"fluid forge my-intent.yaml{flags}")
    output = done.stdout + done.stderr
    assert done.returncode == code, f"{name}: exit {done.returncode}, not {code}:\n{output}"
    assert says in output, output
    assert "hint:" in output, output
    assert "Traceback" not in output
    assert OPENAI_KEY not in output
    assert not (place.cwd / "forge-out").exists(), "a failed run wrote files"
    as_json = run(place, f"fluid forge my-intent.yaml{flags} --json")
    assert as_json.returncode == code
    assert json.loads(as_json.stdout)["exit_code"] == code


def test_every_documented_code_has_a_test() -> None:
    page = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    table = page[page.index("## Exit codes") :]
    documented = {int(n) for n in re.findall(r"^\| (\d+) \|", table, re.MULTILINE)}
    assert documented == set(EXIT_CODES.values())
    here = {code for code, *_ in SCENARIOS.values()} | {EXIT_CODES["tool"]}
    elsewhere = {
        0: "test_docs_commands.py",
        1: "test_messages.py",  # the bug line for an exception that is not ours
        2: "test_forge_live.py",
        3: "test_cli_forge.py",
        4: "test_cli_forge.py",
        5: "test_cli_batch.py",
        30: "test_forge_live.py",
        130: "test_cli_conventions.py",
    }
    assert documented == here | set(elsewhere), sorted(documented - here - set(elsewhere))
    for code, module in elsewhere.items():
        text = (ROOT / "tests" / module).read_text(encoding="utf-8")
        name = next(k for k, v in EXIT_CODES.items() if v == code)
        said = (f'"{name}"', f"== {code}", f"exit {code}", f"exits_{code}")
        assert any(s in text for s in said), (code, module)


def test_a_tool_error_that_reaches_the_cli_exits_21() -> None:
    """In `fluid forge` a bad tool call is a correction the model sees; code that runs
    tools itself can raise it, and then the exit code is the documented one."""
    from fluid_build.cli.exit_codes import exit_code_for
    from fluid_build.copilot.agents.errors import ToolValidationError

    error = ToolValidationError(
        "unknown tool", code="tool.unknown_tool", tool_name="x", tool_args={}, reason="unknown"
    )
    assert exit_code_for(error) == EXIT_CODES["tool"] == 21
