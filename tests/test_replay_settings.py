"""Record and replay compare the call's settings (issue 34 item 6).

A cassette recorded with ``temperature=0`` does not replay a call made without it,
and the reverse: the temperature, top_p, stop, seed, answer length and reasoning
effort a request body carries are kept (from the body in a forge recording, as
``request.settings`` in every other) and compared, under each provider's own field,
with a message naming the option. Old cassettes, which kept neither, still replay.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import respx
from click.testing import CliRunner

from fluid_build.cli import corpus as corpus_cli
from fluid_build.cli.exit_codes import EXIT_CODES
from fluid_build.corpus.cassette import (
    CallRecipe,
    Cassette,
    CassetteError,
    Exchange,
    ExchangeRequest,
    ExchangeResponse,
    Expectation,
    dump_cassette,
    load_cassette,
)
from fluid_build.corpus.compare import ReplayMismatch, request_settings, settings_difference
from fluid_build.corpus.record import Recorder, record
from fluid_build.corpus.replay import ReplayTransport, VirtualClock, run_cassette
from fluid_build.forge.cassette import forge_recorder
from tests.helpers import SECRET_KEY

URL = "https://api.openai.com/v1/chat/completions"


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}], **extra}


def exchange(
    *, body: dict[str, Any] | None = None, settings: dict[str, Any] | None = None
) -> Exchange:
    return Exchange(
        request=ExchangeRequest(
            method="POST", path="/v1/chat/completions", model="gpt-4o", body=body, settings=settings
        ),
        response=ExchangeResponse(status=200, body={"ok": True}),
    )


def send(transport: ReplayTransport, body: dict[str, Any]) -> httpx.Response:
    with httpx.Client(transport=transport) as client:
        return client.post(URL, json=body)


# -- the transport: forge recordings (the body) and the others (settings) -------------------


def test_a_recording_with_temperature_does_not_replay_a_call_without_it() -> None:
    transport = ReplayTransport([exchange(body=chat(temperature=0.0))])
    with pytest.raises(ReplayMismatch) as caught:
        send(transport, chat())
    error = caught.value
    assert str(error) == (
        "request 1 differs: temperature (body.temperature): the cassette was recorded with "
        "0.0, the client sent <not set>; replay with the options it was recorded with, or "
        "record it again"
    )
    assert (error.index, error.field, error.expected, error.got) == (
        1,
        "body.temperature",
        "0.0",
        "<not set>",
    )
    assert transport.first_mismatch is error


def test_a_recording_without_temperature_does_not_replay_a_call_with_it() -> None:
    transport = ReplayTransport([exchange(settings={})])
    with pytest.raises(ReplayMismatch) as caught:
        send(transport, chat(temperature=0.37))
    assert caught.value.field == "body.temperature"
    assert (caught.value.expected, caught.value.got) == ("<not set>", "0.37")
    assert str(caught.value).startswith("request 1 differs: temperature (body.temperature)")


def test_another_value_is_named_with_both() -> None:
    transport = ReplayTransport([exchange(settings={"seed": 7, "max_completion_tokens": 500})])
    with pytest.raises(ReplayMismatch) as caught:
        send(transport, chat(seed=8, max_completion_tokens=500))
    assert str(caught.value).startswith(
        "request 1 differs: seed (body.seed): the cassette was recorded with 7, the client sent 8"
    )


@pytest.mark.parametrize(
    ("recorded", "sent", "option", "path"),
    [
        # Gemini and Vertex
        (
            {"generationConfig": {"temperature": 0.2, "responseMimeType": "application/json"}},
            {"generationConfig": {"responseMimeType": "application/json"}},
            "temperature",
            "generationConfig.temperature",
        ),
        # Bedrock Converse
        (
            {"inferenceConfig": {"maxTokens": 500}},
            {},
            "max_output_tokens",
            "inferenceConfig.maxTokens",
        ),
        # Ollama's native API
        ({"options": {"seed": 7}}, {"options": {"seed": 9}}, "seed", "options.seed"),
        # Anthropic
        ({"stop_sequences": ["END"]}, {"stop_sequences": ["STOP"]}, "stop", "stop_sequences"),
        # the Responses API
        (
            {"reasoning": {"effort": "low"}},
            {"reasoning": {"effort": "high"}},
            "reasoning_effort",
            "reasoning.effort",
        ),
        # Claude that thinks adaptively, on Anthropic and on Bedrock
        (
            {"thinking": {"type": "adaptive"}, "output_config": {"effort": "low"}},
            {"thinking": {"type": "adaptive"}, "output_config": {"effort": "high"}},
            "reasoning_effort",
            "output_config.effort",
        ),
        (
            {
                "additionalModelRequestFields": {
                    "thinking": {"type": "enabled", "budget_tokens": 1024}
                }
            },
            {"additionalModelRequestFields": {}},
            "reasoning_effort",
            "additionalModelRequestFields.thinking",
        ),
        # OpenAI-compatible servers that take max_tokens
        ({"max_tokens": 64}, {"max_tokens": 65}, "max_output_tokens", "max_tokens"),
        ({"top_p": 0.5}, {}, "top_p", "top_p"),
    ],
)
def test_each_providers_field_is_compared_and_named(
    recorded: dict[str, Any], sent: dict[str, Any], option: str, path: str
) -> None:
    transport = ReplayTransport([exchange(settings=request_settings(chat(**recorded)))])
    with pytest.raises(ReplayMismatch) as caught:
        send(transport, chat(**sent))
    assert caught.value.field == f"body.{path}"
    assert str(caught.value).startswith(f"request 1 differs: {option} (body.{path}):")


def test_the_same_settings_replay_and_a_whole_number_is_the_same_temperature() -> None:
    recorded = {"temperature": 0, "seed": 7, "stop": ["END"]}  # a hand-written cassette
    transport = ReplayTransport([exchange(settings=recorded)])
    response = send(transport, chat(temperature=0.0, seed=7, stop=["END"]))
    assert response.json() == {"ok": True}
    transport.finish()
    # A seed of 1 is not the flag True, though Python says 1 == True.
    assert settings_difference({"seed": 1}, {"seed": True}) == ("seed", "seed", 1, True)


def test_the_settings_are_compared_before_the_conversation() -> None:
    transport = ReplayTransport([exchange(body=chat(temperature=0.0))])
    other = chat(temperature=1.0)
    other["messages"] = [{"role": "user", "content": "bye"}]
    with pytest.raises(ReplayMismatch) as caught:
        send(transport, other)
    assert caught.value.field == "body.temperature"


def test_an_old_cassette_that_kept_no_settings_still_replays() -> None:
    """Recorded before settings were kept: neither ``settings`` nor a body to read them from."""
    transport = ReplayTransport([exchange()])
    assert send(transport, chat(temperature=0.37, max_completion_tokens=9)).json() == {"ok": True}
    transport.finish()


def test_an_old_forge_recording_compares_the_settings_in_its_body() -> None:
    """A forge recording made before settings were kept has its bodies: read from them."""
    transport = ReplayTransport([exchange(body=chat())])
    with pytest.raises(ReplayMismatch) as caught:
        send(transport, chat(max_completion_tokens=4000))
    assert str(caught.value).startswith(
        "request 1 differs: max_output_tokens (body.max_completion_tokens): the cassette was "
        "recorded with <not set>, the client sent 4000"
    )


# -- what a recording keeps -------------------------------------------------------------------


def _recorded(recorder: Recorder, body: dict[str, Any]) -> ExchangeRequest:
    upstream = httpx.MockTransport(lambda request: httpx.Response(200, json={"ok": True}))
    with recorder.client(upstream) as http:
        http.post(URL, json=body, headers={"authorization": f"Bearer {SECRET_KEY}"})
    return recorder.exchanges[-1].request


def test_a_recording_without_request_bodies_keeps_the_settings_sent() -> None:
    sent = chat(temperature=0.37, seed=7, stop=[f"END {SECRET_KEY}"], max_completion_tokens=9)
    kept = _recorded(Recorder(), sent)
    assert kept.body is None
    assert kept.settings == {
        "temperature": 0.37,
        "seed": 7,
        "stop": ["END [REDACTED]"],
        "max_completion_tokens": 9,
    }
    assert _recorded(Recorder(bodies=False), chat()).settings == {}  # none sent: {}


def test_a_forge_recording_keeps_them_in_the_body_only() -> None:
    kept = _recorded(forge_recorder(), chat(temperature=0.37))
    assert kept.body is not None
    assert kept.body["temperature"] == 0.37
    assert kept.settings is None


def _cassette(exchanges: list[Exchange], **recipe: Any) -> Cassette:
    return Cassette(
        version=1,
        name="settings",
        provider="openai",
        model="gpt-4o",
        source="test",
        call=CallRecipe(messages=[{"role": "user", "content": "hi"}], **recipe),
        exchanges=exchanges,
        expect=Expectation(outcome="success", output="ok", attempts=len(exchanges)),
    )


def test_the_format_writes_settings_and_the_recipes_options_only_when_set(tmp_path: Path) -> None:
    plain = json.loads(dump_cassette(_cassette([exchange()])))
    assert "settings" not in plain["exchanges"][0]["request"]
    assert not {"temperature", "top_p", "stop", "seed", "reasoning_effort"} & set(plain["call"])
    given = _cassette(
        [exchange(settings={"temperature": 0.37})],
        temperature=0.37,
        top_p=0.9,
        stop=["END"],
        seed=7,
        reasoning_effort="low",
    )
    path = tmp_path / "c.json"
    path.write_text(dump_cassette(given), encoding="utf-8")
    loaded = load_cassette(path)
    assert loaded.exchanges[0].request.settings == {"temperature": 0.37}
    assert loaded.call.options() == {
        "temperature": 0.37,
        "top_p": 0.9,
        "stop": ["END"],
        "seed": 7,
        "reasoning_effort": "low",
    }


@pytest.mark.parametrize(
    ("field", "value"),
    [("temperature", 2.5), ("temperature", "warm"), ("top_p", 1.5), ("seed", 2**63)],
)
def test_a_recipe_option_out_of_range_is_a_cassette_error(
    tmp_path: Path, field: str, value: Any
) -> None:
    data = json.loads(dump_cassette(_cassette([exchange()])))
    data["call"][field] = value
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(CassetteError, match=f"call.{field}"):
        load_cassette(path)


# -- the corpus, end to end: record, replay, and a replay that differs --------------------------


def _answer(request: httpx.Request) -> httpx.Response:
    return httpx.Response(
        200,
        json={
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "model": "gpt-4o-mini",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "ok"},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
        },
    )


@pytest.mark.parametrize(
    ("option", "value", "field"),
    [
        ("max_output_tokens", 37, "max_completion_tokens"),
        ("temperature", 0.37, "temperature"),
        ("seed", 7, "seed"),
    ],
)
def test_a_corpus_recording_replays_only_with_the_options_it_was_recorded_with(
    option: str, value: Any, field: str
) -> None:
    with respx.mock(assert_all_called=True) as router:
        route = router.post(URL).mock(side_effect=_answer)
        cassette = record(
            "hi",
            provider="openai",
            model="gpt-4o-mini",
            env={"OPENAI_API_KEY": SECRET_KEY},
            clock=VirtualClock(),
            **{option: value},
        )
    assert json.loads(route.calls[0].request.content)[field] == value
    assert getattr(cassette.call, option) == value
    assert cassette.exchanges[0].request.settings == {field: value}
    assert run_cassette(cassette).ok

    # The same answers, replayed by a call made without the option.
    without = cassette.model_copy(update={"call": cassette.call.model_copy(update={option: None})})
    result = run_cassette(without)
    assert not result.ok
    assert result.mismatches[0] == (
        f"request 1 differs: {option} (body.{field}): the cassette was recorded with "
        f"{json.dumps(value)}, the client sent <not set>; replay with the options it was "
        "recorded with, or record it again"
    )


def test_fluid_corpus_replay_names_the_setting_that_differs(tmp_path: Path) -> None:
    """A cassette whose recording sent a temperature, replayed by a recipe without it."""
    cassette = _cassette([exchange(settings={"temperature": 0.0})])
    path = tmp_path / "openai-temperature.json"
    path.write_text(dump_cassette(cassette), encoding="utf-8")
    result = CliRunner().invoke(corpus_cli.command, ["replay", "--json", str(path)])
    assert result.exit_code == EXIT_CODES["corpus_mismatch"], result.output
    (row,) = json.loads(result.output)["results"]
    assert row["mismatches"][0].startswith(
        "request 1 differs: temperature (body.temperature): the cassette was recorded with 0.0, "
        "the client sent <not set>"
    )


def test_fluid_corpus_record_takes_the_call_flags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET_KEY)
    monkeypatch.setenv("FLUID_LLM_MAX_ATTEMPTS", "1")
    out = tmp_path / "openai-short.json"
    with respx.mock(assert_all_called=True) as router:
        route = router.post(URL).mock(side_effect=_answer)
        result = CliRunner().invoke(
            corpus_cli.command,
            [
                "record",
                "--provider",
                "openai",
                "--out",
                str(out),
                "--max-output-tokens",
                "37",
                "hi",
            ],
        )
    assert result.exit_code == 0, result.output
    assert json.loads(route.calls[0].request.content)["max_completion_tokens"] == 37
    cassette = load_cassette(out)
    assert cassette.call.max_output_tokens == 37
    assert cassette.exchanges[0].request.settings == {"max_completion_tokens": 37}
    assert run_cassette(cassette).ok
    bad = CliRunner().invoke(
        corpus_cli.command,
        ["record", "--provider", "openai", "--out", str(out), "--temperature", "nan", "hi"],
    )
    assert bad.exit_code == 2
    assert "Invalid value for '--temperature'" in bad.output


def test_the_recipe_environment_keeps_the_call_defaults() -> None:
    with respx.mock(assert_all_called=True) as router:
        router.post(URL).mock(side_effect=_answer)
        cassette = record(
            "hi",
            provider="openai",
            model="gpt-4o-mini",
            env={
                "OPENAI_API_KEY": SECRET_KEY,
                "FLUID_LLM_TEMPERATURE": "0.37",
                "FLUID_LLM_MAX_OUTPUT_TOKENS": "500",
            },
            clock=VirtualClock(),
        )
    # A replay runs in the recipe's environment: it must send what the recording sent.
    assert cassette.call.env["FLUID_LLM_TEMPERATURE"] == "0.37"
    assert cassette.call.env["FLUID_LLM_MAX_OUTPUT_TOKENS"] == "500"
