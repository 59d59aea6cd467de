"""The cassette corpus: every shipped cassette replays as recorded, and a doctored one does not.

Offline and fast: replays run on ReplayTransport and a virtual clock; the
recording tests put respx where the provider would be.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import pickle
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest
import respx
from click.testing import CliRunner

from fluid_build._files import OutputPathError
from fluid_build._redact import redact
from fluid_build.cli import corpus as corpus_cli
from fluid_build.cli.exit_codes import EXIT_CODES
from fluid_build.copilot.agents.errors import ProviderError
from fluid_build.corpus.cassette import (
    CASSETTE_VERSION,
    Cassette,
    CassetteError,
    Exchange,
    ExchangeRequest,
    ExchangeResponse,
    dump_cassette,
    is_forge_run,
    load_cassette,
    resolve_response_model,
    write_cassette,
)
from fluid_build.corpus.compare import ReplayMismatch
from fluid_build.corpus.record import record
from fluid_build.corpus.replay import ReplayTransport, VirtualClock, replay_client, run_cassette
from fluid_build.errors import FluidError
from tests.helpers import SECRET_KEY

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "corpus"
CASSETTES = sorted(CORPUS.glob("*.json"))
MISMATCH = EXIT_CODES["corpus_mismatch"]

PROVIDERS = ("openai", "azure", "anthropic", "gemini", "ollama", "vllm")
SCENARIOS = (
    "success",
    "stream",
    "rate-limit-retry",
    "server-error-retry",
    "overloaded-retry",
    "auth-failure",
    "context-overflow",
    "schema-corrected",
)


def _load(name: str) -> Cassette:
    return load_cassette(CORPUS / f"{name}.json")


def _invoke(*args: str) -> Any:
    return CliRunner().invoke(corpus_cli.command, list(args))


# -- the shipped corpus -----------------------------------------------------------------


@pytest.mark.parametrize("path", CASSETTES, ids=[p.stem for p in CASSETTES])
def test_shipped_cassette_replays_as_recorded(path: Path) -> None:
    cassette = load_cassette(path)
    result = run_cassette(cassette)
    assert result.ok, result.mismatches
    assert result.attempts == cassette.expect.attempts
    assert result.waits == pytest.approx(cassette.expect.waits, abs=1e-6)
    assert path.stem == cassette.name


def test_corpus_covers_every_provider_and_scenario() -> None:
    names = {p.stem for p in CASSETTES}
    missing = {f"{p}-{s}" for p in PROVIDERS for s in SCENARIOS} - names
    assert not missing
    assert {"openai-strict-schema-on", "openai-strict-schema-off"} <= names
    kinds = {load_cassette(p).call.kind for p in CASSETTES}
    assert kinds == {"complete", "stream", "loop"}


@pytest.mark.parametrize("path", CASSETTES, ids=[p.stem for p in CASSETTES])
def test_shipped_cassette_is_sourced_and_holds_no_secret(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    cassette = load_cassette(path)
    assert cassette.source.startswith(("constructed from documented payloads", "recorded "))
    assert redact(text) == text
    for exchange in cassette.exchanges:
        assert not {"authorization", "api-key", "x-api-key", "set-cookie"} & set(
            exchange.response.headers
        )


def _make_cassettes(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # no __pycache__ in corpus/
    spec = importlib.util.spec_from_file_location("make_cassettes", CORPUS / "make_cassettes.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generator_reproduces_the_files_byte_for_byte(monkeypatch: pytest.MonkeyPatch) -> None:
    built = _make_cassettes(monkeypatch).build()
    assert {c.name for c in built} == {p.stem for p in CASSETTES}
    for cassette in built:
        assert dump_cassette(cassette) == (CORPUS / f"{cassette.name}.json").read_text(
            encoding="utf-8"
        ), f"{cassette.name}: rerun python corpus/make_cassettes.py"


def test_strict_schema_cassette_depends_on_strict_mode() -> None:
    strict = _load("openai-strict-schema-on")
    assert strict.call.strict_schema
    assert run_cassette(strict).ok
    off = strict.model_copy(
        update={"call": strict.call.model_copy(update={"strict_schema": False})}
    )
    result = run_cassette(off)
    assert not result.ok
    assert "SchemaValidationError" in result.mismatches[0]


# -- doctored cassettes: mismatches with a reason -------------------------------------------


def _doctor(cassette: Cassette, **expect: Any) -> Cassette:
    return cassette.model_copy(update={"expect": cassette.expect.model_copy(update=expect)})


def test_wrong_attempts_is_a_mismatch() -> None:
    result = run_cassette(_doctor(_load("openai-rate-limit-retry"), attempts=3))
    assert not result.ok
    assert result.mismatches == ["expected 3 request(s), the client sent 2"]


def test_wrong_error_class_is_a_mismatch() -> None:
    result = run_cassette(_doctor(_load("anthropic-auth-failure"), error_class="RateLimitError"))
    assert not result.ok
    assert len(result.mismatches) == 1
    assert result.mismatches[0].startswith(
        "expected error class RateLimitError, got ProviderAuthError [llm.auth]"
    )


def test_wrong_error_code_and_waits_are_mismatches() -> None:
    doctored = _doctor(_load("gemini-context-overflow"), error_code="llm.auth", waits=[1.0])
    result = run_cassette(doctored)
    assert result.mismatches == [
        "expected error code llm.auth, got llm.context_overflow",
        "expected waits [1] s, the client waited [] s",
    ]


def test_wrong_output_names_where() -> None:
    cassette = _load("ollama-success")
    output = dict(cassette.expect.output)
    output["steps"] = [*output["steps"][:2], "something else"]
    result = run_cassette(_doctor(cassette, output=output))
    assert not result.ok
    assert result.mismatches[0].startswith("output differs at $.steps[2]")


def test_expected_success_that_fails_is_a_mismatch() -> None:
    cassette = _load("openai-auth-failure")
    doctored = _doctor(cassette, outcome="success", error_class=None, error_code=None)
    result = run_cassette(doctored)
    assert result.mismatches[0].startswith("expected success, got ProviderAuthError [llm.auth]")


def test_an_extra_request_is_a_mismatch_never_a_silent_pass() -> None:
    cassette = _load("openai-rate-limit-retry")
    cut = cassette.model_copy(update={"exchanges": cassette.exchanges[:1]})
    result = run_cassette(cut)
    assert not result.ok
    assert result.mismatches[0] == (
        "request 2 (POST /v1/chat/completions) is extra: the cassette holds 1 exchange(s)"
    )
    assert result.outcome == "error"


def test_unused_exchanges_are_a_mismatch() -> None:
    cassette = _load("vllm-success")
    longer = cassette.model_copy(update={"exchanges": cassette.exchanges * 2})
    result = run_cassette(_doctor(longer, attempts=1))
    assert result.mismatches == ["1 exchange(s) at the end were never requested"]


def test_a_request_to_another_path_is_a_mismatch() -> None:
    cassette = _load("anthropic-success")
    exchange = cassette.exchanges[0]
    moved = exchange.model_copy(
        update={"request": exchange.request.model_copy(update={"path": "/v1/complete"})}
    )
    result = run_cassette(cassette.model_copy(update={"exchanges": [moved]}))
    assert result.mismatches[0] == (
        "request 1: the cassette expects POST /v1/complete, the client sent POST /v1/messages"
    )


def test_transport_checks_model_and_records_requests() -> None:
    summary = ExchangeRequest(method="POST", path="/v1/chat/completions", model="gpt-4o")
    transport = ReplayTransport(
        [Exchange(request=summary, response=ExchangeResponse(status=200, body={}))]
    )
    with httpx.Client(transport=transport) as client, pytest.raises(ReplayMismatch) as caught:
        client.post("https://api.openai.com/v1/chat/completions", json={"model": "gpt-4o-mini"})
    assert "expects model 'gpt-4o', the client sent 'gpt-4o-mini'" in str(caught.value)
    assert len(transport.seen) == 1
    assert transport.mismatches == [str(caught.value)]


@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_library_replay_that_differs_raises_the_mismatch_itself(asynchronous: bool) -> None:
    """Not a ProviderError wrapping it: a cassette that does not match is never retried,
    never counted against the provider, and says which request differs."""
    import asyncio

    from fluid_build.corpus.run import run_recipe

    cassette = _load("openai-success")
    client = replay_client(cassette)
    run_recipe(client, cassette.call, client.envelope.clock)  # the recorded call replays
    once_more = (
        (lambda: asyncio.run(client.acomplete("once more")))
        if asynchronous
        else (lambda: client.complete("once more"))
    )
    with pytest.raises(ReplayMismatch) as caught:  # one request more than the cassette holds
        once_more()
    assert "request 2" in str(caught.value)


# -- loading ----------------------------------------------------------------------------


def _write(tmp_path: Path, data: Any, name: str = "broken.json") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")
    return path


def _valid() -> dict[str, Any]:
    return json.loads((CORPUS / "openai-success.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: "{not json", "is not valid JSON (Expecting property name"),
        (lambda d: [1, 2], "must hold a JSON object"),
        (lambda d: {k: v for k, v in d.items() if k != "version"}, "has no 'version'"),
        (lambda d: {**d, "version": 2}, "cassette version 2 is not supported"),
        (lambda d: {**d, "call": {**d["call"], "kind": "batch"}}, "call.kind: Input should be"),
        (lambda d: {**d, "surprise": 1}, "surprise: Extra inputs are not permitted"),
        (
            lambda d: {**d, "call": {**d["call"], "response_model": "Nope"}},
            "unknown response model 'Nope'",
        ),
        (
            lambda d: {**d, "call": {**d["call"], "response_model": "os:system"}},
            "unknown response model 'os:system'",
        ),
        (
            lambda d: {**d, "expect": {"outcome": "error", "attempts": 1}},
            "an error outcome needs error_class",
        ),
    ],
    ids=[
        "not-json",
        "not-object",
        "no-version",
        "version-2",
        "bad-kind",
        "extra-field",
        "unknown-model",
        "non-fluid-import",
        "error-without-class",
    ],
)
def test_load_errors_are_typed_and_clear(tmp_path: Path, mutate: Any, message: str) -> None:
    path = _write(tmp_path, mutate(_valid()))
    with pytest.raises(CassetteError) as caught:
        load_cassette(path)
    text = str(caught.value)
    assert message in text
    assert text.startswith(str(path))
    assert "pydantic" not in text
    assert "Traceback" not in text
    assert isinstance(caught.value, FluidError)
    assert caught.value.__cause__ is None


def test_missing_file_is_a_cassette_error(tmp_path: Path) -> None:
    with pytest.raises(CassetteError, match="cannot be read"):
        load_cassette(tmp_path / "nowhere.json")


def test_cassette_error_pickles() -> None:
    error = CassetteError("is not valid JSON", path="x.json", hint="give another path.")
    again = pickle.loads(pickle.dumps(error))  # noqa: S301 - our own bytes
    assert str(again) == str(error)
    assert again.path == "x.json"
    assert again.hint == "give another path."


def test_forge_runs_are_told_from_corpus_cassettes() -> None:
    from fluid_build.cli.forge import EXAMPLE_AGENT_CASSETTE, EXAMPLE_CASSETTE

    assert is_forge_run(load_cassette(EXAMPLE_CASSETTE))
    assert is_forge_run(load_cassette(EXAMPLE_AGENT_CASSETTE))
    assert not any(is_forge_run(load_cassette(path)) for path in CASSETTES)


def test_response_model_by_import_path() -> None:
    model = resolve_response_model("fluid_build.corpus.replay:Plan")
    assert model.__name__ == "Plan"
    with pytest.raises(CassetteError, match="not a pydantic model"):
        resolve_response_model("fluid_build.corpus.replay:load_cassette")


# -- the CLI ----------------------------------------------------------------------------


def test_cli_replay_table_all_ok() -> None:
    result = _invoke(
        "replay", str(CORPUS / "openai-success.json"), str(CORPUS / "azure-stream.json")
    )
    assert result.exit_code == 0, result.output
    assert "openai-success" in result.stdout
    assert "azure-stream" in result.stdout
    assert "OK" in result.stdout
    assert "MISMATCH" not in result.stdout
    assert "2 cassette(s) replayed as recorded" in result.stdout


def test_cli_replay_defaults_to_the_corpus_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    result = _invoke("replay", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["ok"] is True
    assert report["cassettes"] == len(CASSETTES)


def test_cli_replay_exits_30_on_a_mismatch(tmp_path: Path) -> None:
    good = _load("openai-success")
    write_cassette(good, tmp_path / "openai-success.json")
    bad = _doctor(_load("openai-rate-limit-retry"), attempts=5)
    write_cassette(bad, tmp_path / "openai-rate-limit-retry.json")

    table = _invoke("replay", str(tmp_path))
    assert table.exit_code == MISMATCH == 30
    assert "MISMATCH" in table.stdout
    assert "OK" in table.stdout
    assert "expected 5 request(s), the client sent 2" in table.stdout
    assert "1 of 2 cassette(s) did not replay as recorded" in table.stdout

    as_json = _invoke("replay", "--json", str(tmp_path))
    assert as_json.exit_code == 30
    report = json.loads(as_json.stdout)
    assert report["ok"] is False
    assert report["exit_code"] == 30
    assert report["mismatched"] == 1
    by_name = {r["name"]: r for r in report["results"]}
    assert by_name["openai-success"]["ok"] is True
    doctored = by_name["openai-rate-limit-retry"]
    assert doctored["mismatches"] == ["expected 5 request(s), the client sent 2"]
    assert doctored["attempts"] == 2
    assert doctored["waits"] == [0.644]


def test_cli_replay_exits_30_on_an_unreadable_cassette(tmp_path: Path) -> None:
    _write(tmp_path, "{", name="broken.json")
    result = _invoke("replay", "--json", str(tmp_path))
    assert result.exit_code == 30
    (entry,) = json.loads(result.stdout)["results"]
    assert entry["outcome"] == "unreadable"
    assert entry["mismatches"][0].startswith("unreadable: ")


def test_cli_replay_without_cassettes_is_a_usage_error(tmp_path: Path) -> None:
    result = _invoke("replay", str(tmp_path))
    assert result.exit_code == EXIT_CODES["usage"]
    assert "no cassettes" in result.output


# -- replay_client: the API the forge command uses ---------------------------------------


def test_replay_client_answers_from_the_cassette_without_sleeping() -> None:
    cassette = _load("anthropic-rate-limit-retry")
    clock = VirtualClock()
    client = replay_client(cassette, clock=clock)
    plan = resolve_response_model("Plan")
    done = client.complete(cassette.call.messages, system=cassette.call.system, response_model=plan)
    assert done.parsed.model_dump() == cassette.expect.output
    assert done.attempts == 2
    assert clock.waits == [17.0]
    assert client.config.api_key == "replay-key"


def test_replay_transport_serves_async_clients() -> None:
    cassette = _load("gemini-success")
    client = replay_client(cassette)
    plan = resolve_response_model("Plan")

    async def call() -> Any:
        async with client:
            return await client.acomplete(cassette.call.messages, response_model=plan)

    done = asyncio.run(call())
    assert done.parsed.model_dump() == cassette.expect.output


# -- recording ----------------------------------------------------------------------------

OPENAI_URL = "https://api.openai.com/v1/chat/completions"
PLAN_JSON = {"name": "sales_orders", "steps": ["stage", "model"]}


def _openai_ok(content: Any) -> httpx.Response:
    return httpx.Response(
        200,
        headers={
            "x-request-id": "req_live_1",
            "set-cookie": "__cf_bm=abc123; path=/; HttpOnly",
            "openai-organization": "org-live",
        },
        json={
            "id": "chatcmpl-live",
            "object": "chat.completion",
            "created": 1,
            "model": "gpt-4o-mini-2024-07-18",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": json.dumps(content)},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        },
    )


def _assert_no_secret(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert SECRET_KEY not in text
    assert SECRET_KEY[-12:] not in text
    lowered = text.lower()
    for word in ("authorization", "bearer", "set-cookie", "__cf_bm", "x-goog-api-key", '"api-key"'):
        assert word not in lowered, word


def test_record_keeps_the_exchange_and_no_secret(tmp_path: Path) -> None:
    out = tmp_path / "openai-live.json"
    limited = httpx.Response(
        429,
        headers={"retry-after": "2", "x-echo-auth": f"Bearer {SECRET_KEY}"},
        json={
            "error": {
                "message": f"Rate limit reached for key {SECRET_KEY}. Please try again in 2s.",
                "type": "requests",
                "code": "rate_limit_exceeded",
            }
        },
    )
    with respx.mock(assert_all_called=True) as router:
        route = router.post(OPENAI_URL).mock(side_effect=[limited, _openai_ok(PLAN_JSON)])
        cassette = record(
            "Plan the sales data product.",
            provider="openai",
            model="gpt-4o-mini",
            out=out,
            response_model="Plan",
            env={"OPENAI_API_KEY": SECRET_KEY},
            clock=VirtualClock(),
        )
    assert route.call_count == 2
    assert route.calls[0].request.headers["authorization"] == f"Bearer {SECRET_KEY}"
    _assert_no_secret(out)
    assert cassette.expect.outcome == "success"
    assert cassette.expect.output == PLAN_JSON
    assert cassette.expect.attempts == 2
    assert cassette.expect.waits == [2.0]
    assert cassette.source.startswith("recorded ")
    first = cassette.exchanges[0]
    assert first.request == ExchangeRequest(
        method="POST", path="/v1/chat/completions", model="gpt-4o-mini", settings={}
    )
    assert "x-echo-auth" not in first.response.headers
    assert "[REDACTED]" in first.response.body["error"]["message"]
    assert "set-cookie" not in cassette.exchanges[1].response.headers
    # An account id is no credential, but a shared cassette does not say whose account it was.
    assert "openai-organization" not in cassette.exchanges[1].response.headers
    assert cassette.exchanges[1].response.headers["x-request-id"] == "req_live_1"
    # The recording replays as recorded.
    assert run_cassette(load_cassette(out)).ok


@pytest.mark.parametrize(
    ("provider", "env", "url", "header"),
    [
        (
            "gemini",
            {"GEMINI_API_KEY": SECRET_KEY},
            "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash:generateContent",
            "x-goog-api-key",
        ),
        (
            "azure",
            {
                "AZURE_OPENAI_API_KEY": SECRET_KEY,
                "AZURE_OPENAI_ENDPOINT": "https://live.openai.azure.com",
            },
            "https://live.openai.azure.com/openai/deployments/gpt-4o-mini/chat/completions",
            "api-key",
        ),
    ],
)
def test_record_an_auth_failure_for_other_key_headers(
    tmp_path: Path, provider: str, env: dict[str, str], url: str, header: str
) -> None:
    out = tmp_path / f"{provider}-auth.json"
    denied = httpx.Response(
        401,
        headers={"www-authenticate": f'Bearer realm="{SECRET_KEY}"'},
        json={"error": {"code": 401, "message": f"API key {SECRET_KEY} not valid."}},
    )
    with respx.mock(assert_all_called=True) as router:
        route = router.post(url__startswith=url).mock(return_value=denied)
        cassette = record(
            "Plan it.",
            provider=provider,
            model="gpt-4o-mini" if provider == "azure" else None,
            out=out,
            env=env,
            clock=VirtualClock(),
        )
    assert route.calls[0].request.headers[header] == SECRET_KEY
    _assert_no_secret(out)
    assert cassette.expect.outcome == "error"
    assert cassette.expect.error_class == "ProviderAuthError"
    assert cassette.expect.attempts == 1
    if provider == "azure":
        assert cassette.call.env["AZURE_OPENAI_ENDPOINT"] == "https://live.openai.azure.com"
    assert run_cassette(load_cassette(out)).ok


def test_a_call_that_got_no_answer_raises_its_network_failure(tmp_path: Path) -> None:
    out = tmp_path / "down.json"
    with respx.mock() as router:
        router.post(OPENAI_URL).mock(side_effect=httpx.ConnectError("refused"))
        with pytest.raises(ProviderError) as caught:
            record(
                "hi",
                provider="openai",
                out=out,
                env={"OPENAI_API_KEY": SECRET_KEY, "FLUID_LLM_MAX_ATTEMPTS": "1"},
                clock=VirtualClock(),
            )
    assert caught.value.code == "llm.network_error"
    assert not isinstance(caught.value, CassetteError)
    assert not out.exists()


def test_record_refuses_a_success_after_a_request_without_an_answer() -> None:
    with respx.mock() as router:
        router.post(OPENAI_URL).mock(
            side_effect=[httpx.ConnectError("refused"), _openai_ok(PLAN_JSON)]
        )
        with pytest.raises(CassetteError, match="got no answer"):
            record(
                "hi",
                provider="openai",
                env={"OPENAI_API_KEY": SECRET_KEY, "FLUID_LLM_MAX_ATTEMPTS": "2"},
                clock=VirtualClock(),
            )


@pytest.mark.parametrize(
    ("where", "message"),
    [
        ("afile/x.json", "afile is not a directory"),
        ("afile/deeper/x.json", "afile is not a directory"),
        ("fifo.json", "is a FIFO (named pipe), not a file"),
        ("link-to-fifo.json", "is a FIFO (named pipe), not a file"),
        ("adir", "is a directory"),
    ],
)
def test_record_checks_out_before_the_call(tmp_path: Path, where: str, message: str) -> None:
    (tmp_path / "afile").write_text("kept\n", encoding="utf-8")
    os.mkfifo(tmp_path / "fifo.json")
    (tmp_path / "link-to-fifo.json").symlink_to(tmp_path / "fifo.json")
    (tmp_path / "adir").mkdir()
    with respx.mock(assert_all_called=False) as router:
        route = router.post(OPENAI_URL).mock(return_value=_openai_ok(PLAN_JSON))
        with pytest.raises(OutputPathError, match=re.escape(message)) as caught:
            record(
                "hi",
                provider="openai",
                out=tmp_path / where,
                env={"OPENAI_API_KEY": SECRET_KEY},
                clock=VirtualClock(),
            )
    assert not route.called
    assert caught.value.path == str(tmp_path / where)
    assert (tmp_path / "afile").read_text(encoding="utf-8") == "kept\n"
    assert (tmp_path / "link-to-fifo.json").is_symlink()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["adir", "afile", "fifo.json", "link-to-fifo.json"]


def test_write_cassette_failure_is_a_cassette_error(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("", encoding="utf-8")
    with pytest.raises(CassetteError, match="afile is not a directory"):
        write_cassette(_load("openai-success"), tmp_path / "afile" / "x.json")


def test_cli_record_writes_a_cassette(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET_KEY)
    out = tmp_path / "openai-cli.json"
    with respx.mock(assert_all_called=True) as router:
        router.post(OPENAI_URL).mock(return_value=_openai_ok(PLAN_JSON))
        args = ["record", "--provider", "openai", "--model", "gpt-4o-mini"]
        result = _invoke(*args, "--out", str(out), "--response-model", "Plan", "Plan it.")
    assert result.exit_code == 0, result.output
    assert f"recorded {out}" in result.stdout
    _assert_no_secret(out)
    assert load_cassette(out).expect.output == PLAN_JSON
    again = _invoke(*args, "--out", str(out), "Plan it.")
    assert again.exit_code == EXIT_CODES["usage"]
    assert "--force" in again.output


def test_cli_record_without_a_key_says_what_to_set(tmp_path: Path) -> None:
    result = _invoke("record", "--provider", "anthropic", "--out", str(tmp_path / "a.json"), "hi")
    assert result.exit_code == EXIT_CODES["auth"]
    assert "ANTHROPIC_API_KEY" in result.stderr
    assert not (tmp_path / "a.json").exists()


def test_written_cassette_is_version_1_and_round_trips(tmp_path: Path) -> None:
    cassette = _load("ollama-stream")
    path = write_cassette(cassette, tmp_path / "copy.json")
    assert json.loads(path.read_text(encoding="utf-8"))["version"] == CASSETTE_VERSION == 1
    assert load_cassette(path) == cassette


def test_cli_table_shows_reasons_verbatim(tmp_path: Path) -> None:
    bad = _doctor(
        _load("openai-auth-failure"),
        error_class="RateLimitError",
        error_code="llm.rate_limited",
        waits=[1.5],
    )
    write_cassette(bad, tmp_path / "openai-auth-failure.json")
    result = _invoke("replay", str(tmp_path))
    assert result.exit_code == 30
    text = " ".join(result.stdout.split())
    assert "expected waits [1.5] s, the client waited [] s" in text
    assert "expected error code llm.rate_limited, got llm.auth" in text
    assert "[llm.auth]:" in result.stdout  # rich markup must not swallow it
