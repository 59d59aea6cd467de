"""Many calls at once (copilot/batch.py): order, an outcome per prompt, the bound, stopping."""

from __future__ import annotations

import asyncio
import io
import json
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import respx
from rich.console import Console

from fluid_build.cli.exit_codes import EXIT_CODES
from fluid_build.copilot import Completion, LLMClient
from fluid_build.copilot.agents.errors import AgentExecutionError, ProviderError, RateLimitError
from fluid_build.copilot.batch import Batch, Outcome, amap_calls, map_calls, progress_bar
from fluid_build.copilot.call.envelope import RetryEnvelope, RetryPolicy
from fluid_build.errors import FluidError
from tests.docs_model import Request
from tests.test_docs_commands import Place, new_place, run
from tests.test_messages import check_operator_text

KEY = "sk-proj-BATCHKEY0123456789abcdef"
URL = "https://api.openai.com/v1/chat/completions"
PROMPTS = ["p0", "p1 rate", "p2", "p3 bad", "p4", "p5 rate", "p6"]


def client() -> LLMClient:
    envelope = RetryEnvelope(RetryPolicy(attempts=1), hook=lambda event: None)
    return LLMClient("openai", "gpt-4o", api_key=KEY, envelope=envelope, env={})


def prompt_of(request: httpx.Request) -> str:
    return str(json.loads(request.content)["messages"][-1]["content"])


def answer(request: httpx.Request) -> httpx.Response:
    """A 429 for prompts saying ``rate``, a 400 for ``bad``, else the prompt echoed."""
    prompt = prompt_of(request)
    if "rate" in prompt:
        return httpx.Response(429, json={"error": {"message": "slow down"}})
    if "bad" in prompt:
        error = {"message": "unknown parameter", "type": "invalid_request_error"}
        return httpx.Response(400, json={"error": error})
    content = f"answer to {prompt}"
    return httpx.Response(200, json={"choices": [{"message": {"content": content}}]})


@pytest.fixture
def mock() -> Iterator[respx.MockRouter]:
    with respx.mock(assert_all_called=False) as router:
        yield router


def check_half_failed(batch: Batch[Completion]) -> None:
    assert [outcome.index for outcome in batch] == list(range(len(PROMPTS)))
    assert [outcome.ok for outcome in batch] == [True, False, True, False, True, False, True]
    assert batch[0].value is not None
    assert [o.value.text for o in batch if o.value is not None] == [
        f"answer to p{i}" for i in (0, 2, 4, 6)
    ]
    assert isinstance(batch[1].error, RateLimitError)
    assert batch[3].code == "llm.invalid_request"
    # The answers report no usage: priced, at 0 tokens (tests/test_batch_cost.py prices usage).
    assert batch.summary() == {
        "success": 4,
        "llm.rate_limited": 2,
        "llm.invalid_request": 1,
        "cost_usd": 0.0,
    }
    assert list(batch.summary()) == [
        "success",
        "llm.rate_limited",
        "llm.invalid_request",
        "cost_usd",
    ]
    assert [o.index for o in batch.failures()] == [1, 3, 5]
    assert not batch.ok
    with pytest.raises(RateLimitError):
        batch.values()
    assert repr(batch) == (
        "Batch(7 calls: success=4, llm.rate_limited=2, llm.invalid_request=1, cost_usd=0.0)"
    )


def test_map_keeps_input_order_and_an_outcome_per_prompt(mock: respx.MockRouter) -> None:
    mock.post(URL).mock(side_effect=answer)
    with client() as llm:
        check_half_failed(map_calls(llm.complete, PROMPTS, concurrency=3))


def test_amap_keeps_input_order_and_an_outcome_per_prompt(mock: respx.MockRouter) -> None:
    mock.post(URL).mock(side_effect=answer)

    async def go() -> Batch[Completion]:
        async with client() as llm:
            return await amap_calls(llm.acomplete, PROMPTS, concurrency=3)

    check_half_failed(asyncio.run(go()))


def test_shared_options_reach_every_call(mock: respx.MockRouter) -> None:
    route = mock.post(URL).mock(side_effect=answer)
    with client() as llm:
        batch = map_calls(
            llm.complete, ["a", [{"role": "user", "content": "b"}]], system="S", concurrency=2
        )
    assert batch.ok
    assert batch.values()[1].text == "answer to b"
    systems = sorted(
        json.loads(call.request.content)["messages"][0]["content"] for call in route.calls
    )
    assert systems == ["S", "S"]


def test_map_never_has_more_calls_in_flight_than_the_bound(mock: respx.MockRouter) -> None:
    in_flight = 0
    most = 0
    lock = threading.Lock()
    # Three calls must be in flight together for any to answer: the bound is reached,
    # and a fourth at once would be counted. (The timeout only guards a hang.)
    together = threading.Barrier(3, timeout=30)

    def slow(request: httpx.Request) -> httpx.Response:
        nonlocal in_flight, most
        with lock:
            in_flight += 1
            most = max(most, in_flight)
        together.wait()
        with lock:
            in_flight -= 1
        return answer(request)

    mock.post(URL).mock(side_effect=slow)
    with client() as llm:
        batch = map_calls(llm.complete, [f"q{i}" for i in range(9)], concurrency=3)
    assert batch.summary() == {"success": 9, "cost_usd": 0.0}
    assert most == 3


def test_amap_never_has_more_calls_in_flight_than_the_bound(mock: respx.MockRouter) -> None:
    in_flight = 0
    most = 0

    async def slow(request: httpx.Request) -> httpx.Response:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        for _ in range(5):  # let every other worker run as far as it can
            await asyncio.sleep(0)  # noqa: real-sleep - a yield to the loop, not a wait
        in_flight -= 1
        return answer(request)

    mock.post(URL).mock(side_effect=slow)

    async def go() -> Batch[Completion]:
        async with client() as llm:
            return await amap_calls(llm.acomplete, [f"q{i}" for i in range(10)], concurrency=4)

    assert asyncio.run(go()).summary() == {"success": 10, "cost_usd": 0.0}
    assert most == 4


def failing(prompt: str) -> str:
    if prompt == "fail":
        raise ProviderError("refused", code="llm.invalid_request")
    return prompt.upper()


def test_map_fail_fast_sends_nothing_new_after_the_first_failure() -> None:
    seen = threading.Event()
    started: list[str] = []

    def complete(prompt: str) -> str:
        started.append(prompt)
        if prompt != "fail":
            assert seen.wait(30)  # the batch has seen the failure (the timeout guards a hang)
        return failing(prompt)

    def progress(outcome: Outcome[str]) -> None:
        seen.set()

    batch = map_calls(
        complete, ["fail", "a", "b", "c"], concurrency=1, fail_fast=True, progress=progress
    )
    # "a" may have been taken before the failure was seen; "b" and "c" never are.
    assert started in (["fail"], ["fail", "a"])
    assert batch[0].code == "llm.invalid_request"
    for skipped in batch[2:]:
        assert skipped.code == "llm.cancelled"
        assert skipped.error is not None
        assert skipped.error.details == {"skipped": True, "first_failure": 0}
        assert "prompt 0 failed first" in str(skipped.error)
        assert "fail_fast" not in str(skipped.error)
    assert len(batch) == 4
    assert sum(n for code, n in batch.summary().items() if code != "cost_usd") == 4


def test_without_fail_fast_a_failure_stops_nothing() -> None:
    batch = map_calls(failing, ["a", "fail", "b", "fail", "c"], concurrency=2)
    assert batch.summary() == {"success": 3, "llm.invalid_request": 2, "cost_usd": None}
    assert [o.value for o in batch if o.ok] == ["A", "B", "C"]


def test_amap_fail_fast_sends_nothing_new_after_the_first_failure() -> None:
    started: list[str] = []

    async def acomplete(prompt: str) -> str:
        started.append(prompt)
        return failing(prompt)

    batch = asyncio.run(
        amap_calls(acomplete, ["a", "fail", "b", "c"], concurrency=1, fail_fast=True)
    )
    assert started == ["a", "fail"]
    assert batch.summary() == {
        "success": 1,
        "llm.cancelled": 2,
        "llm.invalid_request": 1,
        "cost_usd": None,
    }
    codes = ["success", "llm.invalid_request", "llm.cancelled", "llm.cancelled"]
    assert [o.code for o in batch] == codes


def test_ctrl_c_in_map_starts_no_new_call_and_is_raised() -> None:
    release = threading.Event()
    started: list[str] = []

    def complete(prompt: str) -> str:
        started.append(prompt)
        if prompt != "p0":
            assert release.wait(30)  # held until the test lets go (the timeout guards a hang)
        return prompt

    def interrupted(outcome: Outcome[str]) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        map_calls(complete, [f"p{i}" for i in range(6)], concurrency=1, progress=interrupted)
    release.set()
    for thread in threading.enumerate():
        if thread.name.startswith("fluid-map"):
            thread.join(30)
    # p1 may have been taken before the interrupt; nothing after it ever is.
    assert started in (["p0"], ["p0", "p1"])


def test_cancelling_amap_cancels_the_calls_in_flight_and_starts_no_other() -> None:
    started: list[str] = []
    cleaned: list[str] = []

    async def go() -> None:
        both_in_flight = asyncio.Event()
        never = asyncio.Event()

        async def acomplete(prompt: str) -> str:
            started.append(prompt)
            if len(started) == 2:
                both_in_flight.set()
            try:
                await never.wait()
            finally:
                cleaned.append(prompt)
            return prompt

        task = asyncio.ensure_future(amap_calls(acomplete, ["a", "b", "c", "d"], concurrency=2))
        await both_in_flight.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(go())
    assert started == ["a", "b"]
    assert sorted(cleaned) == ["a", "b"]


def test_a_bug_is_raised_not_kept_as_an_outcome() -> None:
    def broken(prompt: str) -> str:
        raise TypeError("a bug")

    with pytest.raises(TypeError, match="a bug"):
        map_calls(broken, ["a", "b"], concurrency=1)

    with pytest.raises(TypeError, match="a bug"):
        asyncio.run(amap_calls(_abroken, ["a", "b"], concurrency=2))


async def _abroken(prompt: str) -> str:
    raise TypeError("a bug")


def test_a_local_fluid_error_is_an_outcome_named_by_its_class() -> None:
    def local(prompt: str) -> str:
        raise FluidError("the cassette has no such exchange")

    batch = map_calls(local, ["a"])
    assert batch.summary() == {"FluidError": 1, "cost_usd": None}
    assert isinstance(batch[0].error, FluidError)


@pytest.mark.parametrize("concurrency", [0, -1, True, 1.5])
def test_a_bound_that_is_not_a_positive_integer_is_refused(concurrency: Any) -> None:
    with pytest.raises(ValueError, match="concurrency must be a positive integer"):
        map_calls(failing, ["a"], concurrency=concurrency)


def test_no_prompts_is_an_empty_batch() -> None:
    assert map_calls(failing, []) == Batch(())
    assert asyncio.run(amap_calls(_abroken, [])).summary() == {"cost_usd": None}


def test_the_progress_bar_counts_every_outcome_and_names_the_failures() -> None:
    out = io.StringIO()
    console = Console(file=out, width=100, force_terminal=False)
    prompts = ["a", "fail", "b", "fail"]
    with progress_bar(len(prompts), description="forge", console=console) as progress:
        batch = map_calls(failing, prompts, concurrency=2, progress=progress)
    assert batch.summary() == {"success": 2, "llm.invalid_request": 2, "cost_usd": None}
    shown = out.getvalue()
    assert "forge" in shown
    assert "4/4" in shown
    assert "llm.invalid_request 2" in shown


# -- what a skipped prompt and an overflow say, in Python and from the command line -------------


def test_a_skipped_prompt_says_which_failed_first_and_how_to_run_the_rest() -> None:
    batch = asyncio.run(
        amap_calls(_async(failing), ["a", "fail", "b"], concurrency=1, fail_fast=True)
    )
    error = batch[2].error
    assert isinstance(error, AgentExecutionError)
    assert error.code == "llm.cancelled"
    assert error.message == (
        "not sent: prompt 1 failed first, and the batch stops at its first failure (fail fast)"
    )
    hint = error.hint()
    assert hint.startswith("Nothing to fix in this prompt: prompt 1 failed first;")
    assert "without --fail-fast" in hint
    assert "Nothing to fix: run the command again" not in hint
    check_operator_text(hint)


async def _call_async(fn: Any, prompt: str) -> Any:
    return fn(prompt)


def _async(fn: Any) -> Any:
    return lambda prompt: _call_async(fn, prompt)


CONTEXT_LENGTH = {
    "error": {
        "message": "This model's maximum context length is 128000 tokens. However, your "
        "messages resulted in 130000 tokens. Please reduce the length of the messages.",
        "type": "invalid_request_error",
        "param": "messages",
        "code": "context_length_exceeded",
    }
}


@pytest.fixture
def place(tmp_path: Path) -> Iterator[Place]:
    with new_place(tmp_path, openai=True, attempts=1) as found:
        (found.cwd / "prompts.txt").write_text("first\nsecond\nthird\n", encoding="utf-8")
        yield found


def _records(done: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    *records, _ = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    return records


def test_fail_fast_results_name_the_flag_and_the_first_failure(place: Place) -> None:
    def script(request: Request) -> tuple[int, dict[str, Any]] | None:
        body = {"error": {"message": "boom", "type": "server_error", "code": None}}
        return (500, body) if request.path.endswith("/chat/completions") else None

    place.model.script = script
    done = run(place, "fluid batch prompts.txt --json --fail-fast --concurrency 1")
    assert done.returncode == EXIT_CODES["server"], done.stdout + done.stderr
    first, *skipped = _records(done)
    assert first["error"]["code"] == "llm.server_error"
    assert len(skipped) == 2
    for record in skipped:
        error = record["error"]
        assert error["code"] == "llm.cancelled"
        assert "fail_fast" not in json.dumps(error)
        assert "prompt 0 failed first" in error["message"]
        assert error["hint"].startswith("nothing to fix in this prompt: prompt 0 failed first;")
        assert "without --fail-fast" in error["hint"]
        check_operator_text(error["hint"])


def test_an_overflow_in_a_batch_names_no_agent_loop_setting(place: Place) -> None:
    def script(request: Request) -> tuple[int, dict[str, Any]] | None:
        return (400, CONTEXT_LENGTH) if request.path.endswith("/chat/completions") else None

    place.model.script = script
    done = run(place, "fluid batch prompts.txt --json --model gpt-4o")
    assert done.returncode == EXIT_CODES["context_overflow"], done.stdout + done.stderr
    records = _records(done)
    assert [r["error"]["code"] for r in records] == ["llm.context_overflow"] * 3
    for record in records:
        hint = record["error"]["hint"]
        assert "FLUID_AGENT_COMPACT_AFTER" not in hint
        assert "agent loop" not in hint
        assert "shorten the inputs" in hint.lower()
        assert "--model" in hint
    assert "FLUID_AGENT_COMPACT_AFTER" not in done.stderr
