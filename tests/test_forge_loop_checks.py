"""The agent loop's ``check``: checks beyond the schema, fed back like a schema failure.

`fluid forge --agent-loop` passes its contract checks (``validate_output``)
here, so a contract that fails them gets corrective messages and more rounds.
Scripted answers through respx, sync and async.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import pydantic
import pytest
import respx

from fluid_build.copilot import LLMClient
from fluid_build.copilot.agents.errors import SchemaValidationError
from fluid_build.copilot.call.envelope import RetryEnvelope
from fluid_build.copilot.health.cooldown import MemoryCooldownStore
from fluid_build.copilot.loop.agent import AgentLoop, LoopSettings
from fluid_build.corpus.replay import VirtualClock
from fluid_build.forge.app import ForgeOutput, validate_output
from fluid_build.forge.intent import Intent

URL = "https://api.openai.com/v1/chat/completions"
KEY = "sk-proj-CHECKKEY0123456789abcdef"


class Table(pydantic.BaseModel):
    name: str
    rows: int


def answer(content: Any) -> httpx.Response:
    return httpx.Response(
        200,
        json={
            "model": "gpt-4o",
            "choices": [
                {
                    "message": {"role": "assistant", "content": json.dumps(content)},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5},
        },
    )


@pytest.fixture
def route() -> Iterator[respx.Route]:
    with respx.mock(assert_all_called=False) as router:
        yield router.post(URL)


def client() -> LLMClient:
    clock = VirtualClock()
    envelope = RetryEnvelope(
        cooldown=MemoryCooldownStore(),
        clock=clock,
        sleep=clock.sleep,
        asleep=clock.asleep,
        random=lambda: 0.0,
        hook=lambda e: None,
    )
    return LLMClient("openai", "gpt-4o", api_key=KEY, envelope=envelope, env={})


def needs_sales(output: Any) -> list[dict[str, str]]:
    assert isinstance(output, Table)
    if output.name == "sales":
        return []
    return [{"loc": "name", "msg": "must be 'sales'", "type": "value_error"}]


def loop(tmp_path: Path, **kwargs: Any) -> AgentLoop:
    return AgentLoop(
        client(),
        workspace=tmp_path,
        response_model=Table,
        settings=LoopSettings(),
        check=needs_sales,
        **kwargs,
    )


def last_message(route: respx.Route, call: int) -> str:
    body = json.loads(route.calls[call].request.content)
    return str(body["messages"][-1]["content"])


def test_a_failed_check_is_fed_back_and_corrected(route: respx.Route, tmp_path: Path) -> None:
    route.side_effect = [
        answer({"name": "orders", "rows": 1}),
        answer({"name": "sales", "rows": 2}),
    ]
    seen: list[SchemaValidationError] = []
    result = loop(tmp_path, on_correction=seen.append).run("count")
    assert result.output == Table(name="sales", rows=2)
    assert route.call_count == 2
    assert result.usage.corrections == 1
    feedback = last_message(route, 1)
    assert feedback == (
        "Your previous answer failed validation against `Table` with these errors:\n"
        "- name: must be 'sales' (value_error)\n"
        "Please correct your answer and reply with JSON that satisfies the schema."
    )
    assert [e.validation_errors for e in seen] == [
        [{"loc": "name", "msg": "must be 'sales'", "type": "value_error"}]
    ]


def test_the_check_runs_only_on_output_that_validates(route: respx.Route, tmp_path: Path) -> None:
    route.side_effect = [answer({"name": "sales"}), answer({"name": "sales", "rows": 2})]
    checked: list[Any] = []

    def check(output: Any) -> list[dict[str, str]]:
        checked.append(output)
        return []

    result = AgentLoop(
        client(), workspace=tmp_path, response_model=Table, settings=LoopSettings(), check=check
    ).run("count")
    assert checked == [Table(name="sales", rows=2)] == [result.output]
    assert "- rows: Field required (missing)" in last_message(route, 1)


@pytest.mark.parametrize("max_corrections", [0, 1, 2])
def test_max_corrections_bounds_the_answers(
    route: respx.Route, tmp_path: Path, max_corrections: int
) -> None:
    route.side_effect = [answer({"name": "orders", "rows": 1})] * 5
    agent = loop(tmp_path, max_corrections=max_corrections)
    with pytest.raises(SchemaValidationError) as caught:
        agent.run("count")
    assert route.call_count == max_corrections + 1
    assert f"gave up after {max_corrections + 1} attempts" in str(caught.value)
    assert caught.value.validation_errors[0]["loc"] == "name"
    assert agent.result.usage.corrections == max_corrections
    assert agent.result.finished is False


def test_a_negative_max_corrections_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="max_corrections"):
        loop(tmp_path, max_corrections=-1)


def test_the_feedback_never_carries_a_secret_or_the_check_exception(
    route: respx.Route, tmp_path: Path
) -> None:
    route.side_effect = [
        answer({"name": "orders", "rows": 1}),
        answer({"name": "sales", "rows": 1}),
    ]

    def leaky(output: Any) -> Sequence[Mapping[str, object]]:
        if output.name == "sales":
            return []
        return [{"loc": "name", "msg": f"not ok (key {KEY}, Bearer abc.def.ghi)", "type": "x"}]

    AgentLoop(
        client(), workspace=tmp_path, response_model=Table, settings=LoopSettings(), check=leaky
    ).run("count")
    feedback = last_message(route, 1)
    assert KEY not in feedback
    assert "abc.def.ghi" not in feedback
    assert "[REDACTED]" in feedback

    route.side_effect = [answer({"name": "orders", "rows": 1})]
    secret_path = str(tmp_path / "home" / "secret.txt")

    def broken(output: Any) -> list[dict[str, str]]:
        raise RuntimeError(f"cannot open {secret_path}")

    calls_before = route.call_count
    with pytest.raises(RuntimeError, match="cannot open"):
        AgentLoop(
            client(),
            workspace=tmp_path,
            response_model=Table,
            settings=LoopSettings(),
            check=broken,
        ).run("count")
    assert route.call_count == calls_before + 1  # ended there: nothing more was sent


@pytest.mark.anyio
async def test_arun_checks_too(route: respx.Route, tmp_path: Path) -> None:
    route.side_effect = [
        answer({"name": "orders", "rows": 1}),
        answer({"name": "sales", "rows": 3}),
    ]
    result = await loop(tmp_path).arun("count")
    assert result.output == Table(name="sales", rows=3)
    assert "- name: must be 'sales'" in last_message(route, 1)


def test_forge_contract_checks_fit_the_loop(route: respx.Route, tmp_path: Path) -> None:
    intent = Intent.model_validate(
        {
            "data_product": {
                "name": "sales_orders",
                "domain": "sales",
                "description": "Order lines for daily reporting.",
                "owner": "sales@example.com",
            },
            "grain": "one row per order line",
            "dimensions": ["customer"],
            "metrics": ["revenue"],
            "modeling_technique": "dimensional",
        }
    )
    contract = {
        "name": "sales_orders",
        "domain": "sales",
        "owner": "sales@example.com",
        "description": "d",
        "grain": "g",
        "schema": [{"name": "id", "type": "string"}],
    }
    escaping = {
        "contract": contract,
        "additional_files": [{"path": "../outside.sql", "content": "select 1"}],
        "rationale": "r",
    }
    route.side_effect = [answer(escaping), answer({"contract": contract, "rationale": "r"})]
    result = AgentLoop(
        client(),
        workspace=tmp_path,
        response_model=ForgeOutput,
        settings=LoopSettings(),
        check=lambda out: validate_output(out, intent),
        max_corrections=2,
    ).run("forge")
    assert isinstance(result.output, ForgeOutput)
    feedback = last_message(route, 1)
    assert "- additional_files.0.path: must stay inside the output directory" in feedback
    assert "../outside.sql" not in feedback
