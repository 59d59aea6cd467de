"""`fluid batch` and `fluid forge` take --max-output-tokens, --temperature and --seed
(issue 34 item 5): a bad value is click's usage error, exit 2, before anything is
sent; a good one goes with every call the command makes.

The flags reach the request body sent to a model on loopback (``max_output_tokens``
is OpenAI's ``max_completion_tokens``), through the console script in a fresh HOME;
and they reach the options of each ``complete``/``acomplete`` call the command makes
(seen by a spy around the real client, in process).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from fluid_build.cli import _register, cli
from fluid_build.cli.exit_codes import EXIT_CODES
from fluid_build.cli.forge import EXAMPLE_CASSETTE
from fluid_build.copilot.client import LLMClient
from tests.test_docs_commands import OPENAI_KEY, Place, new_place, run

_register()

PROMPTS = "Name a colour.\nName a fruit.\nName a tree.\n"


@pytest.fixture
def place(tmp_path: Path) -> Iterator[Place]:
    with new_place(tmp_path, openai=True, attempts=1) as found:
        (found.cwd / "prompts.txt").write_text(PROMPTS, encoding="utf-8")
        found.intent()
        yield found


def _chat_bodies(place: Place) -> list[dict[str, Any]]:
    return [r.body for r in place.model.requests if r.path.endswith("/chat/completions")]


# -- bad values: click's usage error, nothing sent ---------------------------------------


@pytest.mark.parametrize("command", ["batch prompts.txt", "forge my-intent.yaml"])
@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [
        ("--temperature", "nan", "'nan' is not a number from 0 to 2"),
        ("--temperature", "inf", "'inf' is not a number from 0 to 2"),
        ("--temperature", "2.5", "'2.5' is not a number from 0 to 2"),
        ("--temperature", "-0.1", "'-0.1' is not a number from 0 to 2"),
        ("--temperature", "warm", "'warm' is not a number from 0 to 2"),
        ("--max-output-tokens", "0", "0 is not in the range x>=1"),
        ("--max-output-tokens", "-5", "-5 is not in the range x>=1"),
        ("--max-output-tokens", "1.5", "'1.5' is not a valid integer"),
        ("--seed", "1.5", "'1.5' is not a whole number"),
        ("--seed", str(2**63), f"'{2**63}' does not fit in 64 bits"),
    ],
)
def test_a_bad_value_is_a_usage_error_and_sends_nothing(
    place: Place, command: str, flag: str, value: str, says: str
) -> None:
    done = run(place, f"fluid {command} {flag} {value}")
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"Invalid value for '{flag}': {says}" in done.stderr
    assert "Traceback" not in done.stderr
    assert place.model.requests == []


# -- the body sent: every request ----------------------------------------------------------


def test_batch_max_output_tokens_is_in_every_request_body(place: Place) -> None:
    done = run(place, "fluid batch prompts.txt --json --max-output-tokens 37")
    assert done.returncode == 0, done.stdout + done.stderr
    bodies = _chat_bodies(place)
    assert len(bodies) == 3
    assert [b["max_completion_tokens"] for b in bodies] == [37, 37, 37]


def test_the_flag_wins_over_the_environment(place: Place) -> None:
    place.env["FLUID_LLM_MAX_OUTPUT_TOKENS"] = "900"
    done = run(place, "fluid batch prompts.txt --json --max-output-tokens 37")
    assert done.returncode == 0, done.stdout + done.stderr
    assert [b["max_completion_tokens"] for b in _chat_bodies(place)] == [37, 37, 37]


@pytest.mark.parametrize("loop", [False, True], ids=["stages", "agent-loop"])
def test_forge_max_output_tokens_is_in_every_request_body(place: Place, loop: bool) -> None:
    flags = " --agent-loop" if loop else ""
    done = run(place, f"fluid forge my-intent.yaml --max-output-tokens 4321{flags}")
    assert done.returncode == 0, done.stdout + done.stderr
    bodies = _chat_bodies(place)
    assert len(bodies) >= 2  # the plan, then the contract
    assert [b.get("max_completion_tokens") for b in bodies] == [4321] * len(bodies)
    assert OPENAI_KEY not in done.stdout + done.stderr


# -- the options of each call ----------------------------------------------------------------


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The options of every ``complete``/``acomplete`` call, the real call made after."""
    seen: list[dict[str, Any]] = []
    complete, acomplete = LLMClient.complete, LLMClient.acomplete

    def spy(self: LLMClient, messages: Any, **options: Any) -> Any:
        seen.append(options)
        return complete(self, messages, **options)

    async def aspy(self: LLMClient, messages: Any, **options: Any) -> Any:
        seen.append(options)
        return await acomplete(self, messages, **options)

    monkeypatch.setattr(LLMClient, "complete", spy)
    monkeypatch.setattr(LLMClient, "acomplete", aspy)
    return seen


def _invoke(place: Place, monkeypatch: pytest.MonkeyPatch, *args: str) -> Any:
    monkeypatch.chdir(place.cwd)
    for name, value in place.env.items():
        monkeypatch.setenv(name, value)
    return CliRunner().invoke(cli, list(args))


def test_batch_sends_temperature_and_seed_with_every_call(
    place: Place, monkeypatch: pytest.MonkeyPatch, calls: list[dict[str, Any]]
) -> None:
    _invoke(
        place,
        monkeypatch,
        "batch",
        "prompts.txt",
        "--json",
        "--temperature",
        "0.37",
        "--seed",
        "7",
        "--max-output-tokens",
        "37",
    )
    assert len(calls) == 3
    for options in calls:
        assert options["temperature"] == 0.37
        assert options["seed"] == 7
        assert options["max_output_tokens"] == 37


def test_batch_sends_only_the_options_a_flag_gave(
    place: Place, monkeypatch: pytest.MonkeyPatch, calls: list[dict[str, Any]]
) -> None:
    args = ("batch", "prompts.txt", "--json", "--max-output-tokens", "37")
    result = _invoke(place, monkeypatch, *args)
    assert result.exit_code == 0, result.output
    assert [o.get("max_output_tokens") for o in calls] == [37, 37, 37]
    # Absent, not None: a None would hide the client's defaults (FLUID_LLM_TEMPERATURE).
    assert all(not {"temperature", "seed"} & set(o) for o in calls)


def test_forge_sends_temperature_and_seed_with_its_first_call(
    place: Place, monkeypatch: pytest.MonkeyPatch, calls: list[dict[str, Any]]
) -> None:
    _invoke(
        place,
        monkeypatch,
        "forge",
        "my-intent.yaml",
        "--temperature",
        "0",
        "--seed",
        "-3",
    )
    assert calls, "forge made no call"
    first = calls[0]
    assert (first["temperature"], first["seed"]) == (0.0, -3)
    assert first["system"]  # the stage's own options are kept beside the run's


# -- fluid forge --replay compares them (issue 34 item 6) ------------------------------------


def test_replaying_the_bundled_run_with_another_answer_length_differs(place: Place) -> None:
    shutil.copy(EXAMPLE_CASSETTE, place.cwd / "recorded.json")
    done = run(place, "fluid forge my-intent.yaml --replay recorded.json --max-output-tokens 4000")
    assert done.returncode == EXIT_CODES["corpus_mismatch"] == 30, done.stdout + done.stderr
    assert (
        "fluid: ReplayMismatch [replay.mismatch]: request 1 differs: max_output_tokens "
        "(body.max_completion_tokens): the cassette was recorded with <not set>, the client "
        "sent 4000"
    ) in " ".join(done.stderr.split())
    assert not (place.cwd / "forge-out").exists()
    assert place.model.requests == []


def test_a_run_recorded_with_a_flag_replays_only_with_it(place: Place) -> None:
    done = run(place, "fluid forge my-intent.yaml --record run.json --max-output-tokens 3000")
    assert done.returncode == 0, done.stdout + done.stderr
    recorded = json.loads((place.cwd / "run.json").read_text(encoding="utf-8"))
    assert {e["request"]["body"]["max_completion_tokens"] for e in recorded["exchanges"]} == {3000}
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL"):
        del place.env[name]
    place.model.requests.clear()

    without = run(place, "fluid forge my-intent.yaml --replay run.json --out o1 --json")
    assert without.returncode == 30, without.stdout + without.stderr
    error = json.loads(without.stdout)["error"]
    assert (error["request"], error["field"]) == (1, "body.max_completion_tokens")
    assert (error["expected"], error["got"]) == ("3000", "<not set>")
    assert not (place.cwd / "o1").exists()

    again = run(
        place, "fluid forge my-intent.yaml --replay run.json --out o2 --max-output-tokens 3000"
    )
    assert again.returncode == 0, again.stdout + again.stderr
    assert (place.cwd / "o2" / "contract.fluid.yaml").is_file()
    assert place.model.requests == []
