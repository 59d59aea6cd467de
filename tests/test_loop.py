"""Whole agent loops against scripted provider answers (respx): feedback, scrubbing, budgets."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pydantic
import pytest
import respx

from fluid_build.copilot import LLMClient
from fluid_build.copilot.agents.errors import AgentExecutionError, ContextOverflowError
from fluid_build.copilot.call.envelope import RetryEnvelope
from fluid_build.copilot.health.cooldown import MemoryCooldownStore
from fluid_build.copilot.llm.types import Completion, ToolCall
from fluid_build.copilot.loop.agent import AgentLoop, Budget, LoopSettings
from fluid_build.copilot.loop.tools import WorkspacePath, forge_tool
from tests.fakes import FakeClock

URL = "https://api.openai.com/v1/chat/completions"
KEY = "sk-proj-LOOPKEY0123456789abcdef"


class Summary(pydantic.BaseModel):
    table: str
    rows: int


def tool_turn(*calls: tuple[str, dict[str, Any] | str], tokens: int = 10) -> httpx.Response:
    return httpx.Response(
        200,
        json={
            "model": "gpt-4o",
            "choices": [
                {
                    "message": {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": f"call_{i}",
                                "type": "function",
                                "function": {
                                    "name": name,
                                    "arguments": args
                                    if isinstance(args, str)
                                    else json.dumps(args),
                                },
                            }
                            for i, (name, args) in enumerate(calls)
                        ],
                    },
                    "finish_reason": "tool_calls",
                }
            ],
            "usage": {"prompt_tokens": tokens, "completion_tokens": tokens},
        },
    )


def answer(content: Any, tokens: int = 10) -> httpx.Response:
    text = content if isinstance(content, str) else json.dumps(content)
    return httpx.Response(
        200,
        json={
            "model": "gpt-4o",
            "choices": [
                {"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
            ],
            "usage": {"prompt_tokens": tokens, "completion_tokens": tokens},
        },
    )


@forge_tool(read_only=True)
def count_rows(table: str, limit: int = 1000) -> int:
    """Count the rows of a table (up to limit)."""
    return min({"sales": 42, "users": 7}.get(table, 0), limit)


@pytest.fixture
def mock() -> Iterator[respx.MockRouter]:
    with respx.mock(assert_all_called=False) as router:
        yield router


def client() -> LLMClient:
    clock = FakeClock()
    envelope = RetryEnvelope(
        cooldown=MemoryCooldownStore(),
        clock=clock,
        sleep=clock.sleep,
        asleep=clock.asleep,
        random=lambda: 0.0,
        hook=lambda e: None,
    )
    return LLMClient("openai", "gpt-4o", api_key=KEY, envelope=envelope, env={})


def bodies(route: respx.Route) -> list[dict[str, Any]]:
    return [json.loads(call.request.content) for call in route.calls]


def sent_bytes(route: respx.Route) -> bytes:
    return b"\n".join(call.request.content for call in route.calls)


def loop(tmp_path: Path, tools: list[Any], **kwargs: Any) -> AgentLoop:
    kwargs.setdefault("settings", LoopSettings())
    return AgentLoop(client(), tools=tools, workspace=tmp_path, **kwargs)


def test_a_wrong_tool_argument_is_corrected_on_the_next_turn(
    mock: respx.MockRouter, tmp_path: Path
) -> None:
    route = mock.post(URL)
    route.side_effect = [
        tool_turn(("count_rows", {"table": "sales", "limit": "lots"})),
        tool_turn(("count_rows", {"table": "sales", "limit": 100})),
        answer({"table": "sales", "rows": 42}),
    ]
    result = loop(tmp_path, [count_rows], response_model=Summary).run("How many sales rows?")
    assert result.output == Summary(table="sales", rows=42)
    assert result.usage.llm_calls == 3
    assert result.usage.tool_calls == 2
    second = bodies(route)[1]["messages"]
    failed = next(m for m in second if m["role"] == "tool")
    assert json.loads(failed["content"]) == {
        "error": "ToolValidationError",
        "message": "Tool 'count_rows' failed - see server logs",
    }
    guidance = second[-1]
    assert guidance["role"] == "user"
    assert guidance["content"].startswith(
        "Tool `count_rows` failed with error class `ToolValidationError`. Your tool arguments "
        "did not match the tool's input schema."
    )
    assert "Tools you can call next: count_rows." in guidance["content"]
    assert "lots" not in json.dumps(second[2:])  # the offending value is not echoed back
    third = bodies(route)[2]["messages"]
    assert [m for m in third if m["role"] == "tool"][-1]["content"] == "42"


def test_an_unknown_tool_lists_the_real_ones(mock: respx.MockRouter, tmp_path: Path) -> None:
    route = mock.post(URL)
    route.side_effect = [tool_turn(("drop_table", {"table": "sales"})), answer("done")]
    result = loop(tmp_path, [count_rows]).run("clean up")
    assert result.output == "done"
    guidance = bodies(route)[1]["messages"][-1]["content"]
    assert "`drop_table` failed with error class `ToolValidationError`" in guidance
    assert "That tool does not exist" in guidance
    assert "Tools you can call next: count_rows." in guidance


def test_a_path_outside_the_workspace_is_refused(mock: respx.MockRouter, tmp_path: Path) -> None:
    (tmp_path / "schema.json").write_text('{"columns": ["id"]}')

    @forge_tool(read_only=True)
    def read_sample_schema(path: WorkspacePath) -> str:
        """Read a schema file from the workspace."""
        return Path(path).read_text()

    route = mock.post(URL)
    route.side_effect = [
        tool_turn(("read_sample_schema", {"path": "../../etc/passwd"})),
        tool_turn(("read_sample_schema", {"path": "schema.json"})),
        answer("ok"),
    ]
    result = loop(tmp_path, [read_sample_schema]).run("read it")
    assert result.output == "ok"
    second = bodies(route)[1]["messages"]
    assert "outside the workspace" in second[-1]["content"]
    assert str(tmp_path) not in sent_bytes(route).decode()
    third = bodies(route)[2]["messages"]
    assert '{\\"columns\\"' in json.dumps(third[-1]) or "columns" in third[-1]["content"]


def test_a_schema_failure_is_corrected(mock: respx.MockRouter, tmp_path: Path) -> None:
    route = mock.post(URL)
    route.side_effect = [
        answer({"table": "sales"}),
        answer("not json"),
        answer({"table": "sales", "rows": 42}),
    ]
    result = loop(tmp_path, [], response_model=Summary).run("summarize")
    assert result.output == Summary(table="sales", rows=42)
    assert result.usage.corrections == 2
    feedback = bodies(route)[1]["messages"][-1]["content"]
    assert feedback.startswith("Your previous answer failed validation against `Summary`")
    assert "- rows: Field required (missing)" in feedback
    assert "json_invalid" in bodies(route)[2]["messages"][-1]["content"]


def test_a_tool_timeout_is_a_typed_refusal_not_a_hang(
    mock: respx.MockRouter, tmp_path: Path
) -> None:
    release = threading.Event()

    @forge_tool(timeout=0.05)
    def slow_export(table: str) -> str:
        """Export a table."""
        release.wait(5)
        return "exported"

    route = mock.post(URL)
    route.side_effect = [tool_turn(("slow_export", {"table": "sales"})), answer("gave up")]
    try:
        result = loop(tmp_path, [slow_export]).run("export")
    finally:
        release.set()
    assert result.output == "gave up"
    second = bodies(route)[1]["messages"]
    tool_message = next(m for m in second if m["role"] == "tool")
    assert json.loads(tool_message["content"])["error"] == "ToolTimeoutError"
    assert "did not finish within its time limit" in second[-1]["content"]


LEAKS = [
    "/home/alice/.ssh/id_rsa",
    "db-primary.internal.corp:5432",
    "hunter2-env-value-9f8e7d",
    "sk-proj-LEAKLEAKLEAK0123456789",
    "Traceback",
]


def test_tool_failures_never_leak_to_the_model(
    mock: respx.MockRouter,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FLUID_TEST_DB_PASSWORD", LEAKS[2])

    @forge_tool
    def connect(database: str) -> str:
        """Connect to a database."""
        raise ConnectionError(
            f"cannot open {LEAKS[0]} for {LEAKS[1]} with password {LEAKS[2]} key {LEAKS[3]}"
        )

    @forge_tool
    def explode(x: int) -> int:
        """Explode."""
        raise FileNotFoundError(2, "No such file", LEAKS[0])

    route = mock.post(URL)
    route.side_effect = [
        tool_turn(("connect", {"database": "sales"}), ("explode", {"x": 1})),
        answer("sorry"),
    ]
    with caplog.at_level(logging.WARNING, logger="fluid_build.agent"):
        result = loop(tmp_path, [connect, explode]).run("connect")
    assert result.output == "sorry"
    sent = sent_bytes(route).decode()
    for leak in LEAKS:
        assert leak not in sent
    messages = bodies(route)[1]["messages"]
    errors = [json.loads(m["content"]) for m in messages if m["role"] == "tool"]
    assert errors == [
        {"error": "ConnectionError", "message": "Tool 'connect' failed - see server logs"},
        {"error": "FileNotFoundError", "message": "Tool 'explode' failed - see server logs"},
    ]
    # The operator's log has the detail, with the key redacted.
    assert LEAKS[0] in caplog.text
    assert LEAKS[3] not in caplog.text
    assert "ConnectionError" in caplog.text


def test_tool_results_are_redacted_before_reaching_the_model(
    mock: respx.MockRouter, tmp_path: Path
) -> None:
    @forge_tool(read_only=True)
    def read_env_file() -> str:
        """Read the .env file."""
        return f"OPENAI_API_KEY={LEAKS[3]}\nDEBUG=1"

    route = mock.post(URL)
    route.side_effect = [tool_turn(("read_env_file", {})), answer("ok")]
    loop(tmp_path, [read_env_file]).run("read")
    assert LEAKS[3] not in sent_bytes(route).decode()


# -- limits and budgets ------------------------------------------------------------------


def forever(n: int = 30) -> list[httpx.Response]:
    return [tool_turn(("count_rows", {"table": "sales"}), tokens=100) for _ in range(n)]


@pytest.mark.parametrize(
    ("kwargs", "code", "llm_calls"),
    [
        ({"settings": LoopSettings(max_rounds=3)}, "budget.rounds_exhausted", 3),
        ({"budget": Budget(max_llm_calls=2)}, "budget.llm_calls_exhausted", 2),
        ({"budget": Budget(max_total_tokens=500)}, "budget.tokens_exhausted", 3),
        # The worst case of each call is reserved first: 100 output tokens at most.
        (
            {"budget": Budget(max_cost_usd=0.002), "max_output_tokens": 100},
            "budget.cost_exhausted",
            1,
        ),
        ({"budget": Budget(max_tool_calls=2)}, "budget.tool_calls_exhausted", 3),
    ],
)
def test_each_budget_stops_the_loop_and_keeps_the_work(
    mock: respx.MockRouter, tmp_path: Path, kwargs: dict[str, Any], code: str, llm_calls: int
) -> None:
    mock.post(URL).side_effect = forever()
    agent = loop(tmp_path, [count_rows], **kwargs)
    with pytest.raises(AgentExecutionError) as caught:
        agent.run("count forever")
    assert caught.value.code == code
    assert agent.result.usage.llm_calls == llm_calls
    assert len(agent.result.transcript) > 2
    assert caught.value.details["usage"]["llm_calls"] == llm_calls


def test_the_seconds_budget(mock: respx.MockRouter, tmp_path: Path) -> None:
    clock = FakeClock(0.0)

    @forge_tool(read_only=True)
    def slow_count(table: str) -> int:
        """Count slowly."""
        clock.now += 40
        return 1

    mock.post(URL).side_effect = [tool_turn(("slow_count", {"table": "t"})) for _ in range(5)]
    agent = loop(tmp_path, [slow_count], budget=Budget(max_seconds=100), clock=clock)
    with pytest.raises(AgentExecutionError) as caught:
        agent.run("count")
    assert caught.value.code == "budget.seconds_exhausted"
    assert agent.result.usage.llm_calls == 3


def test_at_most_eight_tool_calls_per_round(mock: respx.MockRouter, tmp_path: Path) -> None:
    route = mock.post(URL)
    route.side_effect = [tool_turn(*[("count_rows", {"table": "sales"})] * 10), answer("ok")]
    result = loop(tmp_path, [count_rows]).run("count")
    assert result.usage.tool_calls == 8
    messages = bodies(route)[1]["messages"]
    tool_messages = [m for m in messages if m["role"] == "tool"]
    assert len(tool_messages) == 10  # every call gets an answer
    assert [json.loads(m["content"]).get("error") for m in tool_messages[8:]] == [
        "TooManyToolCalls"
    ] * 2
    assert "at most 8 are honoured per round" in messages[-1]["content"]


# -- compaction ---------------------------------------------------------------------------


def long_tool_rounds(n: int) -> list[httpx.Response]:
    return [tool_turn(("count_rows", {"table": f"t{i}"})) for i in range(n)]


def test_truncate_compaction_keeps_task_tail_and_pairs(
    mock: respx.MockRouter, tmp_path: Path
) -> None:
    route = mock.post(URL)
    route.side_effect = [*long_tool_rounds(5), answer("done")]
    settings = LoopSettings(compact_after=3, compaction="truncate")
    result = loop(tmp_path, [count_rows], settings=settings).run("the task")
    assert result.usage.compactions >= 1
    last = bodies(route)[-1]["messages"]
    assert last[0] == {"role": "user", "content": "the task"}
    compacted = [m for m in last if m["role"] == "tool" and m["content"].startswith("[compacted")]
    assert compacted
    assert not any(m["content"].startswith("[compacted") for m in last[-4:] if m["role"] == "tool")
    ids = [c["id"] for m in last if m["role"] == "assistant" for c in m.get("tool_calls") or []]
    answered = [m["tool_call_id"] for m in last if m["role"] == "tool"]
    assert ids == answered


def test_summarize_compaction_and_its_fallback(mock: respx.MockRouter, tmp_path: Path) -> None:
    route = mock.post(URL)
    route.side_effect = [
        *long_tool_rounds(3),
        answer("Counted t0..t2; each has 0 rows."),  # the summary
        tool_turn(("count_rows", {"table": "t3"})),
        answer("done"),
    ]
    settings = LoopSettings(compact_after=3, compaction="summarize")
    result = loop(tmp_path, [count_rows], settings=settings).run("the task")
    assert result.output == "done"
    summary_request = bodies(route)[3]
    assert "tools" not in summary_request
    after = bodies(route)[4]["messages"]
    assert after[0]["content"] == "the task"
    assert after[1]["content"].startswith("[Summary of earlier work]\nCounted t0..t2")

    failing = route
    failing.reset()
    failing.side_effect = [
        *long_tool_rounds(3),
        *[httpx.Response(500, json={"error": {"message": "boom"}})] * 3,  # the summary fails
        answer("done"),
    ]
    result = loop(tmp_path, [count_rows], settings=settings).run("again")
    assert result.output == "done"
    last = bodies(failing)[-1]["messages"]
    assert any(m["role"] == "tool" and m["content"].startswith("[compacted") for m in last)


def test_hybrid_compaction(mock: respx.MockRouter, tmp_path: Path) -> None:
    route = mock.post(URL)
    route.side_effect = [*long_tool_rounds(3), answer("short summary"), answer("done")]
    settings = LoopSettings(compact_after=3, compaction="hybrid")
    assert loop(tmp_path, [count_rows], settings=settings).run("task").output == "done"
    assert "[compacted" in json.dumps(bodies(route)[3])  # the summary saw truncated results
    assert bodies(route)[4]["messages"][1]["content"].startswith("[Summary of earlier work]")


def test_settings_from_env(caplog: pytest.LogCaptureFixture) -> None:
    env = {
        "FLUID_AGENT_MAX_ROUNDS": "20",
        "FLUID_AGENT_COMPACT_AFTER": "4",
        "FLUID_COMPACTION_STRATEGY": "Hybrid",
    }
    assert LoopSettings.from_env(env) == LoopSettings(
        max_rounds=20, compact_after=4, compaction="hybrid"
    )
    with caplog.at_level(logging.WARNING, logger="fluid_build.config"):
        bad = LoopSettings.from_env(
            {"FLUID_AGENT_MAX_ROUNDS": "many", "FLUID_COMPACTION_STRATEGY": "shred"}
        )
    assert bad == LoopSettings()
    assert "FLUID_AGENT_MAX_ROUNDS" in caplog.text
    assert "FLUID_COMPACTION_STRATEGY" in caplog.text


def test_async_loop(mock: respx.MockRouter, tmp_path: Path) -> None:
    mock.post(URL).side_effect = [
        tool_turn(("count_rows", {"table": "users"})),
        answer({"table": "users", "rows": 7}),
    ]
    agent = loop(tmp_path, [count_rows], response_model=Summary)
    assert asyncio.run(agent.arun("users?")).output == Summary(table="users", rows=7)


# -- budgets are hard limits, compaction included ---------------------------------------


def scripted(route: respx.Route) -> None:
    """Tool turns for the loop's own calls, a short answer for each summary request."""

    def reply(request: httpx.Request) -> httpx.Response:
        if "tools" not in json.loads(request.content):
            return answer("summary so far")
        return tool_turn(("count_rows", {"table": "sales"}))

    route.side_effect = reply


def run_to_the_budget(agent: AgentLoop, mode: str) -> AgentExecutionError:
    def go() -> object:
        if mode == "run":
            return agent.run("count forever")
        return asyncio.run(agent.arun("count forever"))

    with pytest.raises(AgentExecutionError) as caught:
        go()
    return caught.value


@pytest.mark.parametrize("mode", ["run", "arun"])
@pytest.mark.parametrize("strategy", ["truncate", "summarize", "hybrid"])
@pytest.mark.parametrize("compact_after", [1, 2])
@pytest.mark.parametrize("max_llm_calls", [1, 2, 3, 5])
def test_max_llm_calls_bounds_the_requests_sent_whatever_the_compaction(
    mock: respx.MockRouter,
    tmp_path: Path,
    mode: str,
    strategy: str,
    compact_after: int,
    max_llm_calls: int,
) -> None:
    route = mock.post(URL)
    scripted(route)
    settings = LoopSettings(compact_after=compact_after, compaction=strategy, keep_last=1)
    budget = Budget(max_llm_calls=max_llm_calls)
    agent = loop(tmp_path, [count_rows], settings=settings, budget=budget)
    error = run_to_the_budget(agent, mode)
    assert error.code == "budget.llm_calls_exhausted"
    sent = len(route.calls)
    assert sent <= max_llm_calls
    assert agent.result.usage.llm_calls == sent
    # No call is wasted: the budget is spent to its last call, on rounds or summaries.
    assert sent == max_llm_calls


def test_the_issue_case_five_calls_with_summaries_make_five_requests(
    mock: respx.MockRouter, tmp_path: Path
) -> None:
    route = mock.post(URL)
    scripted(route)
    settings = LoopSettings(compact_after=2, compaction="summarize", keep_last=1)
    agent = loop(tmp_path, [count_rows], settings=settings, budget=Budget(max_llm_calls=5))
    run_to_the_budget(agent, "run")
    summaries = [b for b in bodies(route) if "tools" not in b]
    assert summaries  # a summary was made, and counted
    assert len(route.calls) == 5
    assert agent.result.usage.compactions >= 1


def test_a_summary_is_skipped_when_it_would_take_the_rounds_last_call(
    mock: respx.MockRouter, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    route = mock.post(URL)
    scripted(route)
    # Two rounds, then compaction is due with one call left: no summary, truncation.
    settings = LoopSettings(compact_after=2, compaction="summarize", keep_last=1)
    agent = loop(tmp_path, [count_rows], settings=settings, budget=Budget(max_llm_calls=3))
    with caplog.at_level(logging.INFO, logger="fluid_build.agent"):
        run_to_the_budget(agent, "run")
    assert len(route.calls) == 3
    assert all("tools" in body for body in bodies(route))  # every call was a round
    assert "no model call to spare for a summary" in caplog.text
    last = bodies(route)[-1]["messages"]
    assert any(m["role"] == "tool" and m["content"].startswith("[compacted") for m in last)


@pytest.mark.parametrize("mode", ["run", "arun"])
def test_a_summary_that_spends_the_token_budget_stops_the_round_call(
    mock: respx.MockRouter, tmp_path: Path, mode: str
) -> None:
    route = mock.post(URL)

    def reply(request: httpx.Request) -> httpx.Response:
        if "tools" not in json.loads(request.content):
            return answer("a long summary", tokens=1000)
        return tool_turn(("count_rows", {"table": "sales"}), tokens=10)

    route.side_effect = reply
    settings = LoopSettings(compact_after=2, compaction="hybrid", keep_last=1)
    agent = loop(tmp_path, [count_rows], settings=settings, budget=Budget(max_total_tokens=500))
    error = run_to_the_budget(agent, mode)
    assert error.code == "budget.tokens_exhausted"
    # Two rounds, the summary; the round after it is never sent.
    assert ["tools" in body for body in bodies(route)] == [True, True, False]


def test_a_summary_that_spends_the_time_budget_stops_the_round_call(
    mock: respx.MockRouter, tmp_path: Path
) -> None:
    clock = FakeClock(0.0)
    route = mock.post(URL)

    def reply(request: httpx.Request) -> httpx.Response:
        if "tools" not in json.loads(request.content):
            clock.now += 100  # a slow summary
            return answer("summary")
        return tool_turn(("count_rows", {"table": "sales"}))

    route.side_effect = reply
    settings = LoopSettings(compact_after=2, compaction="summarize", keep_last=1)
    agent = loop(
        tmp_path, [count_rows], settings=settings, budget=Budget(max_seconds=60), clock=clock
    )
    error = run_to_the_budget(agent, "run")
    assert error.code == "budget.seconds_exhausted"
    assert ["tools" in body for body in bodies(route)] == [True, True, False]


def test_a_failed_summary_still_counts_as_a_call(mock: respx.MockRouter, tmp_path: Path) -> None:
    route = mock.post(URL)

    def reply(request: httpx.Request) -> httpx.Response:
        if "tools" not in json.loads(request.content):
            return httpx.Response(500, json={"error": {"message": "boom"}})
        return tool_turn(("count_rows", {"table": "sales"}))

    route.side_effect = reply
    settings = LoopSettings(compact_after=2, compaction="summarize", keep_last=1)
    agent = loop(tmp_path, [count_rows], settings=settings, budget=Budget(max_llm_calls=4))
    run_to_the_budget(agent, "run")
    kinds = ["tools" in body for body in bodies(route)]
    # Two rounds, one summary call (three attempts inside the retry envelope), one round.
    assert kinds == [True, True, False, False, False, True]
    assert agent.result.usage.llm_calls == 4


class ScriptedClient:
    """Just what the loop uses of an LLMClient: answers (or errors) in order, and a count."""

    model = "gpt-4o"

    def __init__(self, *outcomes: Completion | Exception) -> None:
        self.outcomes = list(outcomes)
        self.sent = 0

    def complete(self, messages: Any, **kwargs: Any) -> Completion:
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        self.sent += 1
        return outcome

    async def acomplete(self, messages: Any, **kwargs: Any) -> Completion:
        return self.complete(messages, **kwargs)

    def validate(self, text: str, model: type[pydantic.BaseModel]) -> Any:
        return model.model_validate_json(text)


def test_a_call_the_preflight_refused_sent_nothing_and_does_not_count(tmp_path: Path) -> None:
    turn = Completion(
        provider="openai",
        model="gpt-4o",
        tool_calls=[ToolCall(id="c", name="count_rows", arguments={"table": "t"})],
    )
    refused = ContextOverflowError("the prompt does not fit", prompt_tokens=9, context_window=8)
    client = ScriptedClient(turn, refused, turn, turn)
    agent = AgentLoop(
        client,  # type: ignore[arg-type]
        tools=[count_rows],
        workspace=tmp_path,
        settings=LoopSettings(),
        budget=Budget(max_llm_calls=3),
    )
    with pytest.raises(AgentExecutionError) as caught:
        agent.run("count")
    assert caught.value.code == "budget.llm_calls_exhausted"
    assert client.sent == 3
    assert agent.result.usage.llm_calls == 3
    assert agent.result.usage.compactions == 1


def _answered_by(response: httpx.Response, model: str) -> httpx.Response:
    body = response.json()
    body["model"] = model
    return httpx.Response(200, json=body)


def test_the_loop_costs_what_its_answers_cost_from_genai_prices(
    mock: respx.MockRouter, tmp_path: Path
) -> None:
    from datetime import UTC, datetime

    from genai_prices import data_snapshot

    # A model no hand-written table knew: the answer names it, so it is what is priced.
    turns = [tool_turn(("count_rows", {"table": "sales"}), tokens=1_000), answer("ok", 1_000)]
    mock.post(URL).side_effect = [_answered_by(turn, "gpt-4.1-nano") for turn in turns]
    agent = loop(tmp_path, [count_rows])
    agent.run("count")
    _, info = data_snapshot.get_snapshot().find_provider_model("gpt-4.1-nano", None, "openai", None)
    listed = info.get_prices(datetime.now(tz=UTC))
    want = 2 * float(1_000 * listed.input_mtok + 1_000 * listed.output_mtok) / 1_000_000
    assert agent.result.usage.cost_usd == pytest.approx(want)


def test_loop_prices_override_in_either_shape(mock: respx.MockRouter, tmp_path: Path) -> None:
    for prices in ({"gpt-4o": (1.0, 3.0)}, {"openai:gpt-4o": {"input": 1.0, "output": 3.0}}):
        mock.post(URL).side_effect = [answer("ok", tokens=1_000_000)]
        agent = loop(tmp_path, [count_rows], prices=prices)
        agent.run("count")
        assert agent.result.usage.cost_usd == pytest.approx(4.0)
