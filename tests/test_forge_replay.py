"""Replay for forge: request bodies kept and compared, typed mismatches, atomic cassettes."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path
from typing import Any

import httpx
import pytest

from fluid_build.corpus.cassette import (
    CallRecipe,
    Cassette,
    Exchange,
    ExchangeRequest,
    ExchangeResponse,
    Expectation,
    dump_cassette,
    load_cassette,
    write_cassette,
)
from fluid_build.corpus.compare import (
    NOT_COMPARED,
    ReplayMismatch,
    body_difference,
    compared_body,
    shown_pair,
)
from fluid_build.corpus.record import Recorder
from fluid_build.corpus.replay import ReplayTransport
from fluid_build.errors import FluidError

URL = "https://api.openai.com/v1/chat/completions"
KEY = "sk-proj-REPLAYKEY0123456789abcdef"


def chat(*messages: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"model": "gpt-4o", "messages": list(messages), **extra}


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def exchange(body: dict[str, Any] | None = None, path: str = "/v1/chat/completions") -> Exchange:
    return Exchange(
        request=ExchangeRequest(method="POST", path=path, model="gpt-4o", body=body),
        response=ExchangeResponse(status=200, body={"ok": True}),
    )


def send(transport: ReplayTransport, body: dict[str, Any], url: str = URL) -> httpx.Response:
    with httpx.Client(transport=transport) as client:
        return client.post(url, json=body)


# -- the typed mismatch -----------------------------------------------------------------------


def test_a_mismatch_is_a_fluid_error_with_typed_fields_that_pickles() -> None:
    error = ReplayMismatch(
        "request 2: the request differs at body.messages[1].content: ...",
        index=2,
        field="body.messages[1].content",
        expected="a",
        got="b",
    )
    assert isinstance(error, FluidError)
    clone = pickle.loads(pickle.dumps(error))  # noqa: S301 - our own bytes
    assert (clone.index, clone.field, clone.expected, clone.got) == (
        2,
        "body.messages[1].content",
        "a",
        "b",
    )
    assert str(clone) == str(error)
    assert error.to_dict() == {
        "error": "ReplayMismatch",
        "code": "replay.mismatch",
        "message": str(error),
        "request": 2,
        "field": "body.messages[1].content",
        "expected": "a",
        "got": "b",
    }


def test_a_body_that_differs_names_the_request_the_field_and_both_values() -> None:
    recorded = chat({"role": "system", "content": "plan"}, user("Data product: sales_orders"))
    transport = ReplayTransport([exchange(recorded)])
    with pytest.raises(ReplayMismatch) as caught:
        send(transport, chat({"role": "system", "content": "plan"}, user("Data product: web")))
    error = caught.value
    assert (error.index, error.field) == (1, "body.messages[1].content")
    assert (error.expected, error.got) == ("Data product: sales_orders", "Data product: web")
    assert str(error) == (
        "request 1: the request differs at body.messages[1].content: the cassette expects "
        "'Data product: sales_orders', the client sent 'Data product: web'"
    )
    assert transport.first_mismatch is error
    assert transport.mismatches == [str(error)]


def test_the_same_conversation_replays_whatever_the_schemas_and_tools() -> None:
    # The call's settings (temperature, max_tokens ...) are compared: test_replay_settings.py.
    recorded = chat(user("hi"), response_format={"type": "json_schema", "v": 1}, tools=[1])
    transport = ReplayTransport([exchange(recorded)])
    response = send(transport, chat(user("hi"), response_format={"v": 2}, tools=[2]))
    assert response.json() == {"ok": True}
    assert transport.first_mismatch is None
    transport.finish()


@pytest.mark.parametrize(
    ("holder", "where"),
    [
        ({"role": "tool", "tool_call_id": "call_1", "content": "{{}}"}, "content"),
        (
            {"role": "user", "content": [{"type": "tool_result", "content": "{{}}"}]},
            "anthropic",
        ),
        (
            {"role": "user", "parts": [{"functionResponse": {"name": "t", "response": "{{}}"}}]},
            "gemini",
        ),
    ],
)
def test_tool_results_are_not_compared(holder: dict[str, Any], where: str) -> None:
    """OpenAI's role "tool", Anthropic's tool_result blocks, Gemini's functionResponse."""

    def with_result(text: str) -> dict[str, Any]:
        return json.loads(json.dumps(holder).replace('"{{}}"', json.dumps(text)))

    recorded = chat(user("go"), with_result('["a.sql"]'))
    assert NOT_COMPARED in json.dumps(compared_body(recorded))
    transport = ReplayTransport([exchange(recorded)])
    send(transport, chat(user("go"), with_result('["a.sql", "forge-out/contract.fluid.yaml"]')))
    assert transport.first_mismatch is None


def test_an_added_message_is_named_by_its_index() -> None:
    found = body_difference(
        {"messages": [user("a")]}, {"messages": [user("a"), user("fix it")]}, "body"
    )
    assert found == ("body.messages[1]", "<missing>", user("fix it"))
    assert body_difference({"system": "x"}, {}) == ("body.system", "x", "<missing>")
    assert body_difference({"a": [1, 2.0]}, {"a": [1, 2]}) == ("body.a[1]", 2.0, 2)
    assert body_difference({"a": True}, {"a": 1}) == ("body.a", True, 1)


def test_shown_values_are_redacted_and_cut_around_the_difference() -> None:
    head = "x" * 200
    expected, got = shown_pair(head + " grain A " + KEY, head + " grain B " + KEY)
    assert expected.startswith("…")
    assert got.startswith("…")
    assert "grain A" in expected
    assert "grain B" in got
    assert KEY not in expected + got
    assert len(expected) <= 100
    assert len(got) <= 100
    assert shown_pair({"b": 1}, [1]) == ('{"b": 1}', "[1]")


@pytest.mark.parametrize(
    ("cassette_path", "model", "field"),
    [("/v1/messages", "gpt-4o", "path"), ("/v1/chat/completions", "gpt-4.1", "model")],
)
def test_path_and_model_mismatches_are_typed_too(
    cassette_path: str, model: str, field: str
) -> None:
    transport = ReplayTransport([exchange(path=cassette_path)])
    with pytest.raises(ReplayMismatch) as caught:
        send(transport, {"model": model, "messages": []})
    assert (caught.value.index, caught.value.field) == (1, field)
    assert caught.value.expected
    assert caught.value.got


def test_an_extra_request_and_one_never_sent_are_mismatches() -> None:
    transport = ReplayTransport([exchange()])
    send(transport, chat(user("a")))
    with pytest.raises(ReplayMismatch) as caught:
        send(transport, chat(user("b")))
    assert (caught.value.index, caught.value.field) == (2, "request")
    assert caught.value.got == "POST /v1/chat/completions"
    with pytest.raises(ReplayMismatch) as again:
        transport.finish()  # the first mismatch, whatever came after
    assert again.value is caught.value

    short = ReplayTransport([exchange(), exchange()])
    send(short, chat(user("a")))
    with pytest.raises(ReplayMismatch) as stopped:
        short.finish()
    assert str(stopped.value) == (
        "request 2 (POST /v1/chat/completions) was never sent: the run ended after 1 "
        "request(s) and the cassette holds 2"
    )
    assert (stopped.value.index, stopped.value.field) == (2, "request")


# -- recording request bodies ----------------------------------------------------------------


def _answer(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, json={"echo": KEY})


def _record(**kwargs: Any) -> Recorder:
    recorder = Recorder(**kwargs)
    with recorder.client(httpx.MockTransport(_answer)) as client:
        client.post(
            URL,
            json=chat(user(f"my key is {KEY}"), api_key=KEY),
            headers={"authorization": f"Bearer {KEY}"},
        )
    return recorder


def test_request_bodies_are_kept_redacted_when_asked() -> None:
    kept = _record(request_bodies=True).exchanges[0].request.body
    assert kept is not None
    assert KEY not in json.dumps(kept)
    assert kept["messages"][0]["content"] == "my key is [REDACTED]"
    assert kept["api_key"] == "[REDACTED]"


@pytest.mark.parametrize("kwargs", [{}, {"request_bodies": True, "bodies": False}])
def test_request_bodies_are_not_kept_by_default_nor_without_bodies(kwargs: Any) -> None:
    assert _record(**kwargs).exchanges[0].request.body is None


def _cassette(exchanges: list[Exchange]) -> Cassette:
    return Cassette(
        version=1,
        name="t",
        provider="openai",
        model="gpt-4o",
        source="test",
        call=CallRecipe(messages=[user("x")]),
        exchanges=exchanges,
        expect=Expectation(outcome="success", attempts=len(exchanges)),
    )


def test_a_cassette_without_request_bodies_reads_and_writes_as_before(tmp_path: Path) -> None:
    text = dump_cassette(_cassette([exchange()]))
    assert '"body": null' not in text
    assert '"body"' in dump_cassette(_cassette([exchange(chat(user("x")))]))
    path = write_cassette(_cassette([exchange(chat(user("x")))]), tmp_path / "c.json")
    assert load_cassette(path).exchanges[0].request.body == chat(user("x"))


def test_writing_a_cassette_is_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "run.json"
    target.write_text("the old cassette")
    real_replace = os.replace

    def interrupted(src: str, dst: str) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_cassette(_cassette([exchange()]), target)
    assert target.read_text() == "the old cassette"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]
    monkeypatch.setattr(os, "replace", real_replace)
    write_cassette(_cassette([exchange()]), target)
    assert load_cassette(target).name == "t"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (ReplayMismatch("request 1 ...", index=1, field="model", expected="a", got="b"), 30),
        (ReplayMismatch("request 3 was never sent"), 30),
    ],
)
def test_a_mismatch_exits_30_as_the_docs_say(error: Exception, code: int) -> None:
    from fluid_build.cli.exit_codes import EXIT_CODES, exit_code_for

    assert exit_code_for(error) == EXIT_CODES["corpus_mismatch"] == code
