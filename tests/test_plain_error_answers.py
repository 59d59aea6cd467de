"""Error answers are classified from plain data (issue 36 item 5).

``classify_answer(ErrorAnswer(...))`` is where every error answer is judged: an
HTTP response (``classify_response`` is a thin wrapper over it), a stream's
error event, a Bedrock exception frame. Nothing in src makes up an
``httpx.Response`` to reach the classifier.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from fluid_build.copilot.agents.error_answers import request_secrets_of
from fluid_build.copilot.agents.error_classification import (
    ErrorAnswer,
    classify_answer,
    classify_response,
)
from fluid_build.copilot.agents.errors import ProviderError
from tests.helpers import SECRET_KEY, request

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "fluid_build"
CASES: list[dict[str, Any]] = json.loads(
    (ROOT / "tests" / "data" / "provider_errors.json").read_text(encoding="utf-8")
)
NOW = 1_700_000_000.0


def _content(case: dict[str, Any]) -> bytes:
    if case.get("body_text") is not None:
        return str(case["body_text"]).encode()
    return b"" if case.get("body") is None else json.dumps(case["body"]).encode()


def _same(left: ProviderError, right: ProviderError) -> None:
    assert type(left) is type(right)
    assert str(left) == str(right)
    assert left.to_dict() == right.to_dict()


@pytest.mark.parametrize("provider", ["given", None])
@pytest.mark.parametrize("case", CASES, ids=lambda case: case["id"])
def test_plain_data_classifies_every_sourced_row_as_the_response_does(
    case: dict[str, Any], provider: str | None
) -> None:
    named = case["provider"] if provider else None
    asked = request()
    content = _content(case)
    response = httpx.Response(
        case["status"], content=content, headers=case["headers"], request=asked
    )
    answer = ErrorAnswer.of(
        case["status"],
        content,
        case["headers"],
        provider=named,
        url=asked.url,
        secrets=request_secrets_of(asked),
    )
    plain = classify_answer(answer, now=NOW)
    _same(plain, classify_response(response, provider=named, now=NOW))
    assert plain.code != "llm.unknown_error"
    assert SECRET_KEY not in json.dumps(plain.to_dict()) + str(plain) + repr(plain)


@pytest.mark.parametrize(
    "case", [case for case in CASES if case.get("body") is not None], ids=lambda case: case["id"]
)
def test_a_parsed_event_reads_as_the_same_json_answer(case: dict[str, Any]) -> None:
    """What a stream's error event or a Bedrock frame becomes (``of_json``) is judged
    and quoted exactly as the same JSON sent as an HTTP body."""
    url = "https://bedrock-runtime.amazonaws.com/converse-stream"
    headers = {k: v for k, v in case["headers"].items() if k.lower() != "content-type"}
    response = httpx.Response(
        case["status"], json=case["body"], headers=headers, request=httpx.Request("POST", url)
    )
    answer = ErrorAnswer.of_json(
        case["status"], case["body"], headers, provider=case["provider"], url=url
    )
    _same(
        classify_answer(answer, now=NOW),
        classify_response(response, provider=case["provider"], now=NOW),
    )


def test_the_secrets_an_answer_names_stay_out_of_the_error() -> None:
    # Not key-shaped: only the answer's secrets can take it out.
    secret = "correct-horse-battery-staple-4417"
    echoed = {"error": {"message": f"Incorrect API key provided: {secret}", "type": "x"}}
    answer = ErrorAnswer.of_json(400, echoed, provider="openai", secrets=(secret,))
    error = classify_answer(answer, now=NOW)
    assert error.code == "llm.auth"
    assert secret not in str(error) + repr(error) + json.dumps(error.to_dict())
    # Without the secret the message shows it: the redaction above is the answer's doing.
    bare = classify_answer(ErrorAnswer.of_json(400, echoed, provider="openai"), now=NOW)
    assert secret in json.dumps(bare.to_dict())


def test_a_url_names_the_provider_and_model_and_its_key_stays_out() -> None:
    url = "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.0-flash:generate?key=AIzaSyA1b2C3d4E5f6G7h8I9j0KlMnOpQrStUv"
    body = {"error": {"code": 500, "message": "Internal error encountered.", "status": "INTERNAL"}}
    error = classify_answer(ErrorAnswer.of_json(500, body, url=url), now=NOW)
    assert (error.provider, error.model) == ("gemini", "gemini-2.0-flash")
    assert "AIzaSy" not in json.dumps(error.to_dict())
    assert error.details["url"].endswith("/models/gemini-2.0-flash:generate")


def test_an_answer_the_classifier_cannot_read_is_a_typed_error_not_a_raise() -> None:
    answer = ErrorAnswer(400, b"{}", headers=None, provider="openai")  # type: ignore[arg-type]
    error = classify_answer(answer)
    assert (error.code, error.retryable) == ("llm.unknown_error", False)


# -- no made-up httpx.Response in src -------------------------------------------------

#: Where src may build an ``httpx.Response``, and why: each is a real answer in
#: transit (a transport's answer, the same answer around its read body, a recorded
#: one replayed) or a body-less stand-in kept for ``except httpx.HTTPStatusError``;
#: never an error posed as an answer to reach the classifier.
ALLOWED: dict[str, str] = {
    "copilot/call/transport": "httpcore's and aiohttp's answers in httpx's type",
    "copilot/call/wire.py": "the real answer around its bounded, already-read body",
    "copilot/call/drive.py": "a scrubbed, body-less stand-in of a chained HTTPStatusError",
    "corpus/replay.py": "a recorded answer, replayed as the transport's answer",
    "corpus/record.py": "the recorded answer handed on after its body was read",
}
#: The classification path: here an error is plain data, never an httpx.Response.
CLASSIFYING = ("copilot/agents/", "copilot/llm/", "copilot/call/decode.py", "copilot/call/core.py")


def _responses_built(path: Path) -> int:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    bare = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "httpx"
        for alias in node.names
        if alias.name == "Response"
    }
    count = 0
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if (
            isinstance(func, ast.Attribute)
            and func.attr == "Response"
            and isinstance(func.value, ast.Name)
            and func.value.id == "httpx"
        ) or (isinstance(func, ast.Name) and func.id in bare):
            count += 1
    return count


def test_src_builds_no_httpx_response_to_classify_an_error() -> None:
    built = {
        path.relative_to(SRC).as_posix(): n
        for path in sorted(SRC.rglob("*.py"))
        if (n := _responses_built(path))
    }
    assert built, "the scan finds the transports' answers; an empty scan is a broken scan"
    classifying = sorted(name for name in built if name.startswith(CLASSIFYING))
    assert classifying == [], "classify from ErrorAnswer, not from a made-up httpx.Response"
    unexplained = sorted(name for name in built if not name.startswith(tuple(ALLOWED)))
    assert unexplained == [], "say in ALLOWED why this module builds an httpx.Response"


def test_the_snippet_in_the_typed_errors_page_runs_as_shown(
    capsys: pytest.CaptureFixture[str],
) -> None:
    page = (ROOT / "docs" / "typed-errors.md").read_text(encoding="utf-8")
    section = page[page.index("**Where classification happens.**") :]
    snippet = section[section.index("```python\n") + len("```python\n") :]
    exec(compile(snippet[: snippet.index("```")], "typed-errors.md", "exec"), {})  # noqa: S102
    assert capsys.readouterr().out == "RateLimitError llm.rate_limited True\n"
