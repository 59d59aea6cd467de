"""`fluid batch` from the console script, in a fresh HOME, against a model on loopback.

The model answers each prompt with the prompt itself (so the order of the
JSON lines can be checked) and fails the prompts a test names, the way a
provider does; one attempt per call, so no test waits.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fluid_build.cli.exit_codes import EXIT_CODES
from fluid_build.copilot.call.prices import price_call
from fluid_build.copilot.llm.types import Usage
from tests.docs_model import Request
from tests.loopback import Seen, base_url, http_server
from tests.test_cli_conventions import _AT_A_TERMINAL, _DEFAULT_SIGINT, FLUID
from tests.test_docs_commands import OPENAI_KEY, Place, new_place, run

PROMPTS = ["first prompt", "second prompt", "third prompt", "fourth prompt"]
#: What one echoed answer (5 tokens in, 3 out) costs from gpt-4o: 2.50 / 10.00 USD per million.
GPT_4O_ANSWER = price_call("openai", "gpt-4o", Usage(input_tokens=5, output_tokens=3)) or 0.0


def _prompt(request: Request) -> str:
    return str(request.body["messages"][-1]["content"])


def _echo(fail: set[str] | None = None, status: int = 500, message: str = "boom") -> Any:
    """Answer each prompt with itself; the prompts in ``fail`` get ``status``."""

    def script(request: Request) -> tuple[int, dict[str, Any]] | None:
        if not request.path.endswith("/chat/completions"):
            return None
        prompt = _prompt(request)
        if fail is not None and prompt in fail:
            kind = "server_error" if status >= 500 else "invalid_request_error"
            return status, {"error": {"message": message, "type": kind, "code": None}}
        return 200, {
            "id": "chatcmpl-batch",
            "object": "chat.completion",
            "model": "gpt-4o",
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {"role": "assistant", "content": f"echo: {prompt}"},
                }
            ],
            "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
        }

    return script


@pytest.fixture
def place(tmp_path: Path) -> Iterator[Place]:
    with new_place(tmp_path, openai=True, attempts=1) as found:
        (found.cwd / "prompts.txt").write_text("\n".join(PROMPTS) + "\n", encoding="utf-8")
        yield found


def _lines(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


def _no_key(done: subprocess.CompletedProcess[str]) -> None:
    output = done.stdout + done.stderr
    assert OPENAI_KEY not in output
    assert "Traceback" not in output


def test_every_prompt_answered_in_input_order(place: Place) -> None:
    place.model.script = _echo()
    done = run(place, "fluid batch prompts.txt --json --concurrency 3")
    assert done.returncode == 0, done.stdout + done.stderr
    *records, result = _lines(done.stdout)
    assert [r["index"] for r in records] == [0, 1, 2, 3]
    assert [r["text"] for r in records] == [f"echo: {p}" for p in PROMPTS]
    assert all(r["ok"] for r in records)
    summary = {"success": 4, "cost_usd": round(4 * GPT_4O_ANSWER, 9)}
    assert result == {"ok": True, "exit_code": 0, "summary": summary}
    assert len(place.model.requests) == 4
    assert "\x1b[" not in done.stderr  # no bar, no color in a pipe
    _no_key(done)


def test_some_failed_exits_with_the_first_failures_code(place: Place) -> None:
    place.model.script = _echo({"second prompt", "fourth prompt"})
    done = run(place, "fluid batch prompts.txt --json")
    assert done.returncode == EXIT_CODES["server"] == 14, done.stdout + done.stderr
    *records, result = _lines(done.stdout)
    assert [r["ok"] for r in records] == [True, False, True, False]
    error = records[1]["error"]
    assert error["class"] == "ProviderServerError"
    assert error["code"] == "llm.server_error"
    assert "boom" in error["message"]
    assert error["hint"]
    assert result["summary"] == {
        "success": 2,
        "llm.server_error": 2,
        "cost_usd": round(2 * GPT_4O_ANSWER, 9),
    }
    assert result["exit_code"] == 14
    _no_key(done)


def test_the_summary_table_and_the_out_file(place: Place) -> None:
    place.model.script = _echo({"third prompt"})
    done = run(place, "fluid batch prompts.txt --out results.jsonl")
    assert done.returncode == 14, done.stdout + done.stderr
    assert done.stdout == ""
    records = _lines((place.cwd / "results.jsonl").read_text(encoding="utf-8"))
    assert [r["line"] for r in records] == [1, 2, 3, 4]
    assert records[2]["error"]["code"] == "llm.server_error"
    assert "success" in done.stderr
    assert "llm.server_error  1" in done.stderr or "llm.server_error 1" in done.stderr
    assert "first failure: line 3 of prompts.txt (index 2 in the JSON lines):" in done.stderr
    assert "fluid: ProviderServerError [llm.server_error]" in done.stderr
    assert "hint:" in done.stderr


def test_each_answer_and_the_summary_carry_the_cost(place: Place) -> None:
    place.model.script = _echo({"third prompt"})
    done = run(place, "fluid batch prompts.txt --json")
    assert done.returncode == 14, done.stdout + done.stderr
    *records, result = _lines(done.stdout)
    assert [r.get("cost_usd", "absent") for r in records] == [GPT_4O_ANSWER] * 2 + [
        "absent",
        GPT_4O_ANSWER,
    ]
    assert result["summary"]["cost_usd"] == round(3 * GPT_4O_ANSWER, 9) == 0.0001275


def test_the_summary_table_ends_with_the_cost(place: Place) -> None:
    place.model.script = _echo()
    done = run(place, "fluid batch prompts.txt --out results.jsonl")
    assert done.returncode == 0, done.stdout + done.stderr
    # 4 answers of 5 tokens in, 3 out from gpt-4o: 4 x 0.0000425 USD.
    assert done.stderr.splitlines()[-1] == "cost: 0.00017 USD"
    assert "cost_usd" not in done.stderr  # the cost is not a row of the table of outcomes
    records = _lines((place.cwd / "results.jsonl").read_text(encoding="utf-8"))
    assert [r["cost_usd"] for r in records] == [GPT_4O_ANSWER] * 4


def _private(priced: frozenset[str] = frozenset()) -> Any:
    """Echo as a private model; the prompts in ``priced`` are answered as gpt-4o."""
    echo = _echo()

    def script(request: Request) -> tuple[int, dict[str, Any]] | None:
        answered = echo(request)
        if answered is not None:
            answered[1]["model"] = "gpt-4o" if _prompt(request) in priced else "acme-private-7b"
        return answered

    return script


def test_a_model_with_no_price_is_an_unknown_cost_not_zero(place: Place) -> None:
    place.model.script = _private()
    done = run(place, "fluid batch prompts.txt --model acme-private-7b --out results.jsonl")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stderr.splitlines()[-1] == (
        "cost: unknown (no price for openai:acme-private-7b; "
        "give one in FLUID_PRICES (docs/budgets.md))"
    )
    records = _lines((place.cwd / "results.jsonl").read_text(encoding="utf-8"))
    assert [r["cost_usd"] for r in records] == [None] * 4
    done = run(place, "fluid batch prompts.txt --model acme-private-7b --json")
    assert _lines(done.stdout)[-1]["summary"] == {"success": 4, "cost_usd": None}


def test_a_price_given_in_fluid_prices_is_used(place: Place) -> None:
    place.model.script = _private()
    # 1,000,000 USD per million tokens: 5 in + 3 out is 8 USD an answer.
    place.env["FLUID_PRICES"] = '{"acme-private-7b": {"input": 1000000, "output": 1000000}}'
    done = run(place, "fluid batch prompts.txt --model acme-private-7b --json")
    assert done.returncode == 0, done.stdout + done.stderr
    *records, result = _lines(done.stdout)
    assert [r["cost_usd"] for r in records] == [8.0] * 4
    assert result["summary"]["cost_usd"] == 32.0


def test_a_partly_priced_batch_says_how_many_answers_it_counts(place: Place) -> None:
    place.model.script = _private(frozenset({"first prompt", "third prompt"}))
    done = run(place, "fluid batch prompts.txt --model acme-private-7b --out results.jsonl")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stderr.splitlines()[-1] == (
        "cost: 0.000085 USD for 2 of 4 answers (no price for openai:acme-private-7b; "
        "give one in FLUID_PRICES (docs/budgets.md))"
    )


def test_no_answer_counts_no_cost(place: Place) -> None:
    place.model.script = _echo(set(PROMPTS), status=400, message="unknown parameter")
    done = run(place, "fluid batch prompts.txt --out results.jsonl")
    assert done.returncode != 0
    assert "cost: none counted (no prompt was answered)" in done.stderr.splitlines()


def test_fail_fast_sends_nothing_after_the_first_failure(place: Place) -> None:
    place.model.script = _echo({"first prompt"})
    done = run(place, "fluid batch prompts.txt --json --fail-fast --concurrency 1")
    assert done.returncode == 14, done.stdout + done.stderr
    *records, result = _lines(done.stdout)
    assert [r["error"]["code"] for r in records] == ["llm.server_error"] + ["llm.cancelled"] * 3
    assert result["summary"] == {"llm.cancelled": 3, "llm.server_error": 1, "cost_usd": None}
    assert len(place.model.requests) == 1


def test_prompts_from_stdin_skip_blank_lines(place: Place) -> None:
    place.model.script = _echo()
    done = run(place, "fluid batch - --json", stdin="one\n\n  \ntwo\n")
    assert done.returncode == 0, done.stdout + done.stderr
    *records, _ = _lines(done.stdout)
    assert [(r["index"], r["line"], r["text"]) for r in records] == [
        (0, 1, "echo: one"),
        (1, 4, "echo: two"),
    ]


@pytest.mark.parametrize(
    ("setup", "source", "says"),
    [
        ("", "missing.txt", "missing.txt cannot be read (No such file or directory)"),
        ("mkdir adir", "adir", "adir is a directory, not a regular file"),
        (": > empty.txt", "empty.txt", "empty.txt holds no prompt"),
        ("mkfifo fifo", "fifo", "fifo is a FIFO (named pipe), not a regular file"),
        ("printf '\\377\\n' > bin.txt", "bin.txt", "bin.txt is not UTF-8 text"),
    ],
)
def test_an_unusable_prompts_file_is_a_typed_error(
    place: Place, setup: str, source: str, says: str
) -> None:
    if setup:
        assert run(place, setup).returncode == 0
    done = run(place, f"fluid batch {source}")
    assert done.returncode == EXIT_CODES["prompts"] == 5, done.stdout + done.stderr
    assert f"fluid: PromptsFileError: {says}" in done.stderr
    assert "hint: " in done.stderr
    assert place.model.requests == []
    as_json = run(place, f"fluid batch {source} --json")
    assert json.loads(as_json.stdout)["exit_code"] == 5


def test_empty_stdin_is_a_typed_error(place: Place) -> None:
    done = run(place, "fluid batch -", stdin="")
    assert done.returncode == 5
    assert "fluid: PromptsFileError: standard input holds no prompt" in done.stderr


def test_a_key_the_provider_echoes_is_in_no_output(place: Place) -> None:
    place.model.script = _echo(set(PROMPTS), 401, f"Incorrect API key provided: {OPENAI_KEY}")
    done = run(place, "fluid batch prompts.txt --json")
    assert done.returncode == EXIT_CODES["auth"], done.stdout + done.stderr
    *records, _ = _lines(done.stdout)
    assert {r["error"]["class"] for r in records} == {"ProviderAuthError"}
    _no_key(done)
    done = run(place, "fluid batch prompts.txt --out out.jsonl")
    _no_key(done)
    assert OPENAI_KEY not in (place.cwd / "out.jsonl").read_text(encoding="utf-8")


def test_no_provider_configured_exits_10_before_any_request(place: Place) -> None:
    del place.env["OPENAI_API_KEY"]
    done = run(place, "fluid batch prompts.txt")
    assert done.returncode == EXIT_CODES["auth"]
    assert "fluid: ProviderAuthError [llm.auth]" in done.stderr
    assert place.model.requests == []


def test_ctrl_c_mid_batch_exits_130_at_once(place: Place) -> None:
    """The calls in flight are cancelled: the process does not wait for their answers."""
    arrived, release = threading.Event(), threading.Event()

    def stall(request: Request) -> None:
        arrived.set()
        release.wait(60)

    place.model.script = stall
    assert FLUID is not None
    proc = subprocess.Popen(
        [sys.executable, "-c", _DEFAULT_SIGINT, FLUID, "batch", "prompts.txt"],
        cwd=place.cwd,
        env=place.env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert arrived.wait(60), "the batch never sent a request"
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        release.set()
        proc.kill()
    assert proc.returncode == EXIT_CODES["interrupted"], stderr
    assert stderr.strip().splitlines()[-1] == "fluid: interrupted"
    assert "Traceback" not in stderr
    assert stdout == ""


def test_a_wait_too_short_to_show_prints_no_wait_line(place: Place) -> None:
    """A 429 asking for 20 ms (retry-after-ms): the retry waits for it, and the key's
    shared cooldown too, but neither prints `wait 0.0 s`."""
    answered = json.dumps(
        {
            "id": "chatcmpl-short",
            "object": "chat.completion",
            "model": "gpt-4o",
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"content": "ok"}}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
        }
    ).encode()
    throttled = b'{"error": {"message": "Rate limit reached", "type": "requests", "code": null}}'

    def reply(seen: Seen) -> tuple[int, dict[str, str], bytes]:
        if len(server.seen) == 1:
            return 429, {"retry-after-ms": "20", "content-type": "application/json"}, throttled
        return 200, {"content-type": "application/json"}, answered

    with http_server(reply) as server:
        place.env["OPENAI_BASE_URL"] = f"{base_url(server)}/v1"
        place.env["FLUID_LLM_MAX_ATTEMPTS"] = "2"
        done = run(place, "fluid batch - --json", stdin="one\n")
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(server.seen) == 2  # it did wait and retry
    assert "wait 0.0 s" not in done.stderr, done.stderr
    assert "0.0 s" not in done.stderr


@pytest.mark.parametrize(("wait", "shown"), [(0.004, ""), (0.049, ""), (1.5, "1.5")])
def test_a_cooldown_wait_line_is_printed_only_when_it_is_not_zero(wait: float, shown: str) -> None:
    """The key's shared cooldown nearly over: the few ms left are waited, not printed."""
    from io import StringIO

    from rich.console import Console

    from fluid_build.cli.forge import _wait_printer
    from fluid_build.copilot.call.envelope import RetryEvent

    seen = StringIO()
    hook = _wait_printer(Console(file=seen, width=200, color_system=None))
    hook(RetryEvent(wait, "cooldown", 1, None, "k", "openai", "gpt-4o"))
    expected = f"  wait {shown} s after [cooldown] (key cooling down)\n" if shown else ""
    assert seen.getvalue() == expected


_ANSI = re.compile(r"\x1b\[[0-9;?]*[@-~]|\x1b.")


def _ctrl_c_at_a_terminal(place: Place, *args: str) -> str:
    """Run ``fluid batch prompts.txt ARGS`` at a terminal (a pty), type Ctrl-C there once
    the first request arrived; what the terminal showed, escapes removed, \\r\\n as \\n."""
    arrived, release = threading.Event(), threading.Event()

    def stall(request: Request) -> None:
        arrived.set()
        release.wait(60)

    place.model.script = stall
    assert FLUID is not None
    proc = subprocess.Popen(
        [sys.executable, "-c", _AT_A_TERMINAL, FLUID, "batch", "prompts.txt", *args],
        cwd=place.cwd,
        env=place.env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdin is not None
    try:
        assert arrived.wait(60), "the batch never sent a request"
        proc.stdin.write(b"\x03")  # Ctrl-C, typed at that terminal
        proc.stdin.flush()
        shown, _ = proc.communicate(timeout=60)
    finally:
        release.set()
        proc.kill()
    assert proc.returncode == EXIT_CODES["interrupted"], shown
    return _ANSI.sub("", shown.decode("utf-8", "replace")).replace("\r\n", "\n")


def test_ctrl_c_under_the_bar_prints_no_blank_line(place: Place) -> None:
    """The bar's last line ends the line: `fluid: interrupted` comes right under it."""
    text = _ctrl_c_at_a_terminal(place)
    before = text[: text.index("fluid: interrupted")]
    assert "0/4" in before, text  # the bar was shown
    assert before.endswith("\n"), text
    assert not before.endswith("\n\n"), f"a blank line before the message: {text!r}"
    assert not before.replace("\r", "").endswith("\n\n"), text


def test_ctrl_c_after_an_echoed_ctrl_c_starts_a_fresh_line(place: Place) -> None:
    """Without a bar (--json), the terminal's echoed ^C ends the screen mid-line."""
    text = _ctrl_c_at_a_terminal(place, "--json")
    assert "\nfluid: interrupted" in text, repr(text)
    assert "^Cfluid" not in text, repr(text)
    assert "\n\nfluid: interrupted" not in text.replace("\r", ""), repr(text)


@pytest.mark.parametrize(
    ("before", "text", "after"),
    [
        (False, "enter your key: ", True),  # a prompt
        (True, "line\n", False),
        (True, "0/4  \n\x1b[?25h", False),  # a bar's last line, then the cursor shown again
        (True, "\r\x1b[2K", False),  # a live display erasing its line
        (False, "x\x1b[1A\x1b[2K", True),  # up a line, erased: the column is not known to move
        (True, "\x1b[G", False),
        (True, "", True),
        (False, "\x1b[0m", False),
    ],
)
def test_the_cursor_is_followed_through_what_is_written(
    before: bool, text: str, after: bool
) -> None:
    from fluid_build.cli._console import _mid_line_after

    assert _mid_line_after(text, before) is after


def test_the_first_failure_is_named_by_its_line_in_the_file(place: Place) -> None:
    """issue 35 item 15: blank lines are skipped, so a prompt's index (from 0) is not its
    line; the summary says the line, as an editor shows it, and the index beside it."""
    (place.cwd / "prompts.txt").write_text(
        "first prompt\n\nsecond prompt\n\nthird prompt\nfourth prompt\n", encoding="utf-8"
    )
    place.model.script = _echo({"fourth prompt"})
    done = run(place, "fluid batch prompts.txt --out results.jsonl")
    assert done.returncode == 14, done.stdout + done.stderr
    assert "first failure: line 6 of prompts.txt (index 3 in the JSON lines):" in done.stderr
    records = _lines((place.cwd / "results.jsonl").read_text(encoding="utf-8"))
    assert (records[3]["index"], records[3]["line"]) == (3, 6)
    piped = run(place, "fluid batch - --out results.jsonl", stdin="\n\nfourth prompt\n")
    assert "first failure: line 3 of standard input (index 0 in the JSON lines):" in piped.stderr


@pytest.mark.parametrize("flag", ["FLUID_QUIET", "FLUID_NONINTERACTIVE"])
def test_quiet_json_prints_no_pre_flight_warning(place: Place, flag: str) -> None:
    """issue 35 item 15: a model missing from the capability matrix is a run-start warning;
    FLUID_QUIET=1 hides it with --json too, where the pre-flight used to say it instead."""
    place.model.script = _private()
    place.env[flag] = "1"
    done = run(place, "fluid batch prompts.txt --model acme-private-7b --json")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "not in the capability matrix" not in done.stderr
    assert "warning:" not in done.stderr
    # Not quiet, --json still says it once (stdout stays JSON).
    del place.env[flag]
    loud = run(place, "fluid batch prompts.txt --model acme-private-7b --json")
    assert loud.stderr.count("not in the capability matrix") == 1
    _lines(loud.stdout)
