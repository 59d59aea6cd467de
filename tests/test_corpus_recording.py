"""Recording the providers of issue 23: Bedrock's binary streams and the cloud settings.

A Bedrock stream is AWS event-stream frames, binary with CRC32 checksums:
``fluid corpus record`` keeps it as ``body_base64``, every frame's payload and
string headers redacted and the frame written again with fresh checksums, so
the cassette replays. A recording of bedrock or vertex keeps what replay needs
to reach the same URL (the region; the project and location), never a key.
The provider is a mock transport: no network.
"""

from __future__ import annotations

import base64
import json
import struct
import zlib
from pathlib import Path

import httpx
import pytest
from botocore.eventstream import EventStreamBuffer

from fluid_build._redact import redact
from fluid_build.corpus.cassette import CassetteError, load_cassette
from fluid_build.corpus.record import record, sanitize_binary
from fluid_build.corpus.replay import VirtualClock, run_cassette
from tests.helpers import SECRET_KEY

EVENTSTREAM = {"content-type": "application/vnd.amazon.eventstream"}


def _header(name: str, value: str) -> bytes:
    raw = value.encode()
    return bytes([len(name)]) + name.encode() + b"\x07" + struct.pack(">H", len(raw)) + raw


def _frame(event: str, payload: dict[str, object]) -> bytes:
    """One AWS event-stream frame, written by hand (not by the code under test)."""
    headers = (
        _header(":event-type", event)
        + _header(":content-type", "application/json")
        + _header(":message-type", "event")
    )
    body = json.dumps(payload).encode()
    prelude = struct.pack(">II", 16 + len(headers) + len(body), len(headers))
    frame = prelude + struct.pack(">I", zlib.crc32(prelude)) + headers + body
    return frame + struct.pack(">I", zlib.crc32(frame))


def _stream(text_with_secret: str) -> bytes:
    return b"".join(
        [
            _frame("messageStart", {"role": "assistant"}),
            _frame("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "Paris"}}),
            _frame(
                "contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": text_with_secret}}
            ),
            _frame("contentBlockStop", {"contentBlockIndex": 0}),
            _frame("messageStop", {"stopReason": "end_turn"}),
            _frame(
                "metadata",
                {"usage": {"inputTokens": 7, "outputTokens": 3, "totalTokens": 10}},
            ),
        ]
    )


def _messages(raw: bytes) -> list[tuple[dict[str, object], bytes]]:
    buffer = EventStreamBuffer()  # checks every frame's checksums
    buffer.add_data(raw)
    return [(dict(message.headers), message.payload) for message in buffer]


def test_a_bedrock_stream_is_recorded_as_frames_without_the_key(tmp_path: Path) -> None:
    out = tmp_path / "bedrock-live-stream.json"
    seen: list[httpx.Request] = []

    def provider(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(
            200, headers=EVENTSTREAM, content=_stream(f" (your key {SECRET_KEY})")
        )

    cassette = record(
        "What is the capital of France?",
        provider="bedrock",
        model="amazon.nova-micro-v1:0",
        kind="stream",
        out=out,
        env={"AWS_BEARER_TOKEN_BEDROCK": SECRET_KEY, "AWS_REGION": "eu-west-1"},
        transport=httpx.MockTransport(provider),
        clock=VirtualClock(),
    )
    assert seen[0].headers["authorization"] == f"Bearer {SECRET_KEY}"
    assert seen[0].url.host == "bedrock-runtime.eu-west-1.amazonaws.com"
    text = out.read_text(encoding="utf-8")
    assert SECRET_KEY not in text
    assert redact(text) == text
    response = cassette.exchanges[0].response
    assert response.body_text is None
    raw = base64.b64decode(response.body_base64 or "")
    assert SECRET_KEY.encode() not in raw
    frames = _messages(raw)  # still valid frames: lengths and checksums rewritten
    assert [headers[":event-type"] for headers, _ in frames] == [
        "messageStart",
        "contentBlockDelta",
        "contentBlockDelta",
        "contentBlockStop",
        "messageStop",
        "metadata",
    ]
    assert "[REDACTED]" in json.loads(frames[2][1])["delta"]["text"]
    # What replay needs to reach the same endpoint; never the key.
    assert cassette.call.env["AWS_REGION"] == "eu-west-1"
    assert "AWS_BEARER_TOKEN_BEDROCK" not in cassette.call.env
    assert cassette.expect.output.startswith("Paris (your key ")
    replayed = run_cassette(load_cassette(out))
    assert replayed.ok, replayed.mismatches
    assert replayed.output == cassette.expect.output


def test_a_vertex_recording_keeps_its_project_and_location(tmp_path: Path) -> None:
    answer = {
        "candidates": [
            {"content": {"parts": [{"text": "Paris."}], "role": "model"}, "finishReason": "STOP"}
        ],
        "usageMetadata": {"promptTokenCount": 7, "candidatesTokenCount": 2},
        "modelVersion": "gemini-2.0-flash",
    }
    paths: list[str] = []

    def provider(request: httpx.Request) -> httpx.Response:
        paths.append(request.url.path)
        return httpx.Response(200, json=answer)

    out = tmp_path / "vertex-live.json"
    cassette = record(
        "What is the capital of France?",
        provider="vertex",
        model="gemini-2.0-flash",
        api_key=SECRET_KEY,  # an access token
        out=out,
        env={"GOOGLE_CLOUD_PROJECT": "acme-data", "GOOGLE_CLOUD_LOCATION": "europe-west4"},
        transport=httpx.MockTransport(provider),
        clock=VirtualClock(),
    )
    assert paths == [
        "/v1/projects/acme-data/locations/europe-west4/publishers/google/models/"
        "gemini-2.0-flash:generateContent"
    ]
    assert cassette.call.env["GOOGLE_CLOUD_PROJECT"] == "acme-data"
    assert cassette.call.env["GOOGLE_CLOUD_LOCATION"] == "europe-west4"
    assert SECRET_KEY not in out.read_text(encoding="utf-8")
    replayed = run_cassette(load_cassette(out))
    assert replayed.ok, replayed.mismatches


@pytest.mark.parametrize(
    "content",
    [
        b"\x00\x00\x00\x40\x00\x00\x00\x00",  # a frame cut short
        b"\x00\x00\x00\x05\x00\x00\x00\x09abcd" + b"\x00" * 8,  # a length that cannot be
        b"not an event stream at all, just text",
    ],
)
def test_bytes_that_are_not_frames_are_refused_not_kept(content: bytes) -> None:
    with pytest.raises(CassetteError, match="cannot be recorded"):
        sanitize_binary(200, EVENTSTREAM, content)


def test_binary_answers_follow_no_bodies_and_clean_frames_stay_byte_for_byte() -> None:
    raw = _frame("messageStart", {"role": "assistant"})
    ok = sanitize_binary(200, EVENTSTREAM, raw, bodies=False)
    assert ok.omitted
    assert ok.body_base64 is None
    kept = sanitize_binary(200, EVENTSTREAM, raw)
    assert base64.b64decode(kept.body_base64 or "") == raw  # nothing to redact: the same bytes
