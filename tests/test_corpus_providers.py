"""The cassette corpus covers the providers of issue 23 with real recorded answers.

openai_responses, bedrock (JSON and an AWS event-stream stream, a binary body
kept as ``body_base64``), vertex and the five OpenAI-compatible presets each
have cassettes in corpus/ whose answers were recorded from the provider
(pydantic-ai's cassettes and other cited recordings), and ``fluid corpus
replay corpus`` replays them offline, in a fresh HOME, with no AWS or Google
credentials anywhere.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from fluid_build.corpus.cassette import (
    Cassette,
    CassetteError,
    ExchangeResponse,
    dump_cassette,
    load_cassette,
)
from fluid_build.corpus.replay import ReplayTransport, replay_client, run_cassette
from tests.test_cli_conventions import fluid, fresh_env

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "corpus"

#: Every cassette of the issue-23 providers, by provider. Each answer is recorded.
RECORDED = {
    "openai_responses": {
        "openai_responses-success",
        "openai_responses-stream",
        "openai_responses-context-overflow",
    },
    "bedrock": {
        "bedrock-success",
        "bedrock-reasoning",
        "bedrock-stream",
        "bedrock-rate-limit-retry",
        "bedrock-server-error-retry",
        "bedrock-overloaded-retry",
        "bedrock-stream-error-retry",
        "bedrock-auth-failure",
        "bedrock-context-overflow",
        "bedrock-model-not-found",
    },
    "vertex": {
        "vertex-success",
        "vertex-stream",
        "vertex-rate-limit-retry",
        "vertex-auth-failure",
        "vertex-context-overflow",
    },
    "deepseek": {"deepseek-success"},
    "xai": {"xai-success"},
    "cerebras": {"cerebras-success", "cerebras-context-overflow"},
    "together": {"together-success", "together-tool-call"},
    # Only a stream of Fireworks was found recorded (Llama Stack's recording): no JSON answer.
    "fireworks": {"fireworks-stream"},
}
NAMES = sorted(name for names in RECORDED.values() for name in names)
#: The AWS event-stream prelude of Bedrock's first frame (messageStart): total length
#: 0xb5, headers length 0x52, as recorded.
PRELUDE = bytes.fromhex("000000b500000052")


def _load(name: str) -> Cassette:
    return load_cassette(CORPUS / f"{name}.json")


@pytest.mark.parametrize("name", NAMES)
def test_recorded_cassette_replays_and_says_where_it_was_recorded(name: str) -> None:
    cassette = _load(name)
    assert cassette.provider in RECORDED
    assert name in RECORDED[cassette.provider]
    assert cassette.source.startswith("recorded ")
    result = run_cassette(cassette)
    assert result.ok, result.mismatches


def test_every_provider_has_a_success_and_the_cloud_ones_a_stream() -> None:
    for provider, names in RECORDED.items():
        if provider == "fireworks":  # its one recorded answer is a stream
            assert _load("fireworks-stream").call.kind == "stream"
            continue
        assert f"{provider}-success" in names
    kinds = {name: _load(name).call.kind for name in NAMES}
    for provider in ("openai_responses", "bedrock", "vertex"):
        assert kinds[f"{provider}-stream"] == "stream"


def test_recorded_answers_are_read_as_the_provider_wrote_them() -> None:
    # Reasoning is never the answer's text: Bedrock's reasoningContent, DeepSeek's
    # reasoning_content; the output is the visible answer, byte for byte.
    reasoning = _load("bedrock-reasoning")
    body = reasoning.exchanges[0].response.body
    assert body["output"]["message"]["content"][0]["reasoningContent"]
    assert run_cassette(reasoning).output.startswith("Here are the key steps")
    deepseek = _load("deepseek-success")
    message = deepseek.exchanges[0].response.body["choices"][0]["message"]
    assert message["reasoning_content"]
    assert run_cassette(deepseek).output == message["content"]
    xai = run_cassette(_load("xai-success"))
    assert xai.output.endswith("and many others tailored")  # cut at max_tokens, as recorded


def test_together_and_fireworks_answers_are_read_as_recorded() -> None:
    # Replay compares the text only; the tool call, finish reason and usage are checked
    # here against the recorded bodies, through the same replayed client.
    tool = _load("together-tool-call")
    assert tool.call.kind == "complete"
    done = replay_client(tool).complete(tool.call.messages)
    assert done.text == ""
    assert [(c.id, c.name, c.arguments) for c in done.tool_calls] == [
        ("call_u7v0m4oa34v7vl7dmjbcy6c2", "get_weather", {"location": "SF"})
    ]
    assert done.finish_reason == "tool_calls"
    assert (done.usage.input_tokens, done.usage.output_tokens) == (420, 14)
    text = _load("together-success")
    done = replay_client(text).complete(text.call.messages)
    assert done.finish_reason == "eos"  # Together's own word, kept as sent
    assert done.text.startswith("San Francisco (SF) is generally cooler than Los Angeles")
    assert (done.usage.input_tokens, done.usage.output_tokens) == (313, 269)
    stream = _load("fireworks-stream")
    assert stream.exchanges[0].request.path == "/inference/v1/chat/completions"
    events = list(replay_client(stream).stream(stream.call.messages))
    deltas = [e.text for e in events if e.type == "text"]
    assert len(deltas) > 1  # the recorded chunks arrive one by one
    completion = events[-1].completion
    assert completion is not None
    assert completion.text == "".join(deltas) == 'The Latin name for the Sun is "Sol".'
    assert completion.finish_reason == "stop"
    # Usage rides in the last chunk, with the finish reason.
    assert (completion.usage.input_tokens, completion.usage.output_tokens) == (20, 11)


# -- binary bodies: the AWS event-stream framing ----------------------------------------


def test_bedrock_stream_is_kept_as_the_recorded_event_stream_bytes() -> None:
    cassette = _load("bedrock-stream")
    response = cassette.exchanges[0].response
    assert response.headers["content-type"] == "application/vnd.amazon.eventstream"
    assert response.body is None
    assert response.body_text is None
    raw = base64.b64decode(response.body_base64 or "")
    assert raw.startswith(PRELUDE)
    assert response.content() == raw
    # The transport serves exactly those bytes, with the recorded content type.
    transport = ReplayTransport(cassette.exchanges)
    path = cassette.exchanges[0].request.path
    with httpx.Client(transport=transport, base_url="https://bedrock.test") as http:
        served = http.post(path, json={})
    assert served.content == raw
    assert served.headers["content-type"] == "application/vnd.amazon.eventstream"
    # The frames decode to the recorded deltas, in order.
    output = run_cassette(cassette).output
    assert output.startswith("The capital of France is Paris. Paris is not only the capital city")


def _answer(**fields: Any) -> dict[str, Any]:
    return {"status": 200, "headers": {}, **fields}


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"body_base64": "not base64!"}, "body_base64 is not valid base64"),
        ({"body_base64": "AAAA", "body_text": "x"}, "not several"),
        ({"body_base64": "AAAA", "body": {"a": 1}}, "not several"),
    ],
)
def test_a_bad_binary_body_is_refused(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ExchangeResponse.model_validate(_answer(**fields))


def test_a_bad_binary_body_in_a_file_is_a_cassette_error(tmp_path: Path) -> None:
    data = json.loads((CORPUS / "bedrock-stream.json").read_text(encoding="utf-8"))
    data["exchanges"][0]["response"]["body_base64"] = "%%%"
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(CassetteError, match="body_base64"):
        load_cassette(path)


def test_body_base64_is_written_only_when_there_is_one() -> None:
    # Backward compatible: a cassette without bytes reads and writes as it always did.
    text = _load("openai-success")
    assert "body_base64" not in dump_cassette(text)
    binary = _load("bedrock-stream")
    dumped = json.loads(dump_cassette(binary))
    assert dumped["exchanges"][0]["response"]["body_base64"] == (
        binary.exchanges[0].response.body_base64
    )


# -- fluid corpus replay, offline and without credentials --------------------------------


def test_cli_replays_the_new_providers_without_any_cloud_credentials(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    # No AWS or Google credentials anywhere: the chains would find nothing, and the
    # metadata servers are unreachable. The cassettes reach Bedrock with a Bedrock API
    # key and Vertex with an access token (the replay's own key), so none is consulted.
    env = fresh_env(
        home,
        AWS_CONFIG_FILE=str(home / "no-aws-config"),
        AWS_SHARED_CREDENTIALS_FILE=str(home / "no-aws-credentials"),
        AWS_EC2_METADATA_DISABLED="true",
        GOOGLE_APPLICATION_CREDENTIALS=str(home / "no-key.json"),
        CLOUDSDK_CONFIG=str(home / "no-gcloud"),
        GCE_METADATA_HOST="127.0.0.1:9",
        NO_PROXY="*",
    )
    done = fluid(home, "corpus", "replay", "--json", str(CORPUS), env=env, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] is True
    assert report["cassettes"] == len(list(CORPUS.glob("*.json")))
    by_provider: dict[str, list[str]] = {}
    for result in report["results"]:
        assert result["ok"], result
        by_provider.setdefault(result["provider"], []).append(result["name"])
    for provider, names in RECORDED.items():
        # Besides its recorded cassettes, a provider may have constructed ones (issue 35's).
        assert names <= set(by_provider[provider])


def test_cli_replays_a_bedrock_stream_alone(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    done = fluid(home, "corpus", "replay", str(CORPUS / "bedrock-stream.json"), cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "bedrock-stream" in done.stdout
    assert "1 cassette(s) replayed as recorded" in done.stdout


def test_docs_list_every_recorded_cassette_and_count_the_corpus() -> None:
    docs = (ROOT / "docs" / "corpus.md").read_text(encoding="utf-8")
    readme = (CORPUS / "README.md").read_text(encoding="utf-8")
    for name in NAMES:
        assert f"| `{name}` |" in docs, f"docs/corpus.md's table of recorded cassettes lacks {name}"
    total = len(list(CORPUS.glob("*.json")))
    assert f"{total} cassettes" in docs
    assert f"{total} cassettes" in readme
    assert f"{len(NAMES)} holding answers" in docs
