"""`fluid batch` and `fluid forge` take --max-output-tokens, --temperature and --seed
(issue 34 item 5): a bad value is click's usage error, exit 2, before anything is
sent; a good one goes with every call the command makes.

The flags reach the request body sent to a model on loopback (``max_output_tokens``
is OpenAI's ``max_completion_tokens``), through the console script in a fresh HOME;
an unset flag is left out of the options of each ``complete``/``acomplete`` call
(seen by a spy around the real client, in process), so the client's defaults apply.
A run recorded with a flag replays only with it (issue 34 item 6).
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


def test_batch_sends_the_flags_in_every_request_body(place: Place) -> None:
    flags = "--max-output-tokens 37 --temperature 0.37 --seed 7"
    done = run(place, f"fluid batch prompts.txt --json {flags}")
    assert done.returncode == 0, done.stdout + done.stderr
    bodies = _chat_bodies(place)
    assert len(bodies) == 3
    for body in bodies:
        assert (body["max_completion_tokens"], body["temperature"], body["seed"]) == (37, 0.37, 7)


def test_batch_sends_none_of_them_without_the_flags(place: Place) -> None:
    done = run(place, "fluid batch prompts.txt --json --temperature 0")
    assert done.returncode == 0, done.stdout + done.stderr
    for body in _chat_bodies(place):
        assert body["temperature"] == 0.0  # zero is a value, not "unset"
        assert not {"max_completion_tokens", "seed", "top_p"} & set(body)


def test_the_flag_wins_over_the_environment(place: Place) -> None:
    place.env["FLUID_LLM_MAX_OUTPUT_TOKENS"] = "900"
    done = run(place, "fluid batch prompts.txt --json --max-output-tokens 37")
    assert done.returncode == 0, done.stdout + done.stderr
    assert [b["max_completion_tokens"] for b in _chat_bodies(place)] == [37, 37, 37]


@pytest.mark.parametrize("loop", [False, True], ids=["stages", "agent-loop"])
def test_forge_sends_the_flags_in_every_request_body(place: Place, loop: bool) -> None:
    flags = "--max-output-tokens 4321 --temperature 0.37 --seed -3" + (
        " --agent-loop" if loop else ""
    )
    done = run(place, f"fluid forge my-intent.yaml {flags}")
    assert done.returncode == 0, done.stdout + done.stderr
    bodies = _chat_bodies(place)
    assert len(bodies) >= 2  # the plan, then the contract
    sent = [(b.get("max_completion_tokens"), b.get("temperature"), b.get("seed")) for b in bodies]
    assert sent == [(4321, 0.37, -3)] * len(bodies)
    assert OPENAI_KEY not in done.stdout + done.stderr


def test_a_flag_the_provider_cannot_take_is_refused_before_sending(place: Place) -> None:
    place.anthropic()
    place.env["FLUID_LLM_PROVIDER"] = "anthropic"
    done = run(place, "fluid batch prompts.txt --json --seed 7")
    assert done.returncode == 15, done.stdout + done.stderr
    *records, summary = [json.loads(line) for line in done.stdout.splitlines()]
    assert {r["error"]["code"] for r in records} == {"llm.unsupported_option"}
    assert "seed" in records[0]["error"]["message"]
    assert summary["summary"]["llm.unsupported_option"] == 3
    assert place.model.requests == []


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


def test_batch_sends_only_the_options_a_flag_gave(
    place: Place, monkeypatch: pytest.MonkeyPatch, calls: list[dict[str, Any]]
) -> None:
    args = ("batch", "prompts.txt", "--json", "--max-output-tokens", "37")
    result = _invoke(place, monkeypatch, *args)
    assert result.exit_code == 0, result.output
    assert [o.get("max_output_tokens") for o in calls] == [37, 37, 37]
    # Absent, not None: a None would hide the client's defaults (FLUID_LLM_TEMPERATURE).
    assert all(not {"temperature", "seed"} & set(o) for o in calls)


def test_forge_leaves_an_unset_option_out_so_the_clients_default_applies(
    place: Place, monkeypatch: pytest.MonkeyPatch, calls: list[dict[str, Any]]
) -> None:
    """The agent loop asks with max_output_tokens=None when it has no limit of its own:
    sent as is, that None would hide FLUID_LLM_MAX_OUTPUT_TOKENS (the client's default)."""
    result = _invoke(place, monkeypatch, "forge", "my-intent.yaml", "--agent-loop")
    assert result.exit_code == 0, result.output
    assert len(calls) >= 2
    for options in calls:
        assert not {"max_output_tokens", "temperature", "seed"} & set(options), options
        assert None not in options.values(), options


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


@pytest.mark.parametrize(
    ("flag", "value", "field", "shown"),
    [
        ("--max-output-tokens", "3000", "max_completion_tokens", "3000"),
        ("--temperature", "0", "temperature", "0.0"),
        ("--seed", "7", "seed", "7"),
    ],
)
def test_a_run_recorded_with_a_flag_replays_only_with_it(
    place: Place, flag: str, value: str, field: str, shown: str
) -> None:
    done = run(place, f"fluid forge my-intent.yaml --record run.json {flag} {value}")
    assert done.returncode == 0, done.stdout + done.stderr
    recorded = json.loads((place.cwd / "run.json").read_text(encoding="utf-8"))
    assert {json.dumps(e["request"]["body"][field]) for e in recorded["exchanges"]} == {shown}
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL"):
        del place.env[name]
    place.model.requests.clear()

    without = run(place, "fluid forge my-intent.yaml --replay run.json --out o1 --json")
    assert without.returncode == 30, without.stdout + without.stderr
    error = json.loads(without.stdout)["error"]
    assert (error["request"], error["field"]) == (1, f"body.{field}")
    assert (error["expected"], error["got"]) == (shown, "<not set>")
    assert not (place.cwd / "o1").exists()

    again = run(place, f"fluid forge my-intent.yaml --replay run.json --out o2 {flag} {value}")
    assert again.returncode == 0, again.stdout + again.stderr
    assert (place.cwd / "o2" / "contract.fluid.yaml").is_file()
    assert place.model.requests == []


def test_a_run_recorded_without_a_flag_does_not_replay_with_it(place: Place) -> None:
    done = run(place, "fluid forge my-intent.yaml --record run.json")
    assert done.returncode == 0, done.stdout + done.stderr
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL"):
        del place.env[name]
    with_it = run(place, "fluid forge my-intent.yaml --replay run.json --temperature 0")
    assert with_it.returncode == 30, with_it.stdout + with_it.stderr
    assert (
        "request 1 differs: temperature (body.temperature): the cassette was recorded with "
        "<not set>, the client sent 0.0"
    ) in " ".join(with_it.stderr.split())
