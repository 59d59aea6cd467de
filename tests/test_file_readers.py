"""The library's own file readers (cassettes, the cached tokenizer) never hang, recurse or balloon.

A FIFO, a device, a directory or an absurdly nested document in their place
is refused at once with a typed error, or, for the tokenizer cache, counted
around (the pre-flight degrades to its estimate and the call goes on).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from fluid_build.copilot.call import preflight
from fluid_build.corpus.cassette import CassetteError, load_cassette


def _deep(tmp_path: Path) -> Path:
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    return deep


@pytest.mark.parametrize("kind", ["fifo", "device", "directory", "deep", "huge"])
def test_a_cassette_that_is_not_a_cassette_is_refused_at_once(tmp_path: Path, kind: str) -> None:
    if kind == "fifo":
        path = tmp_path / "fifo.json"
        os.mkfifo(path)
    elif kind == "device":
        path = Path("/dev/zero")
    elif kind == "directory":
        path = tmp_path
    elif kind == "deep":
        path = _deep(tmp_path)
    else:
        path = tmp_path / "huge.json"
        with open(path, "wb") as handle:
            handle.truncate(4 * 2**30)  # sparse: no disk used
    with pytest.raises(CassetteError) as caught:
        load_cassette(path)
    assert str(path) in str(caught.value)


def test_a_fifo_in_the_tokenizer_cache_does_not_hang_the_pre_flight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    key = hashlib.sha1(preflight._O200K_URL.encode(), usedforsecurity=False).hexdigest()
    os.mkfifo(tmp_path / key)
    monkeypatch.setattr(preflight, "_ENCODINGS", {})
    tokens, how = preflight.count_tokens("hello world " * 50, model="gpt-4o", provider="openai")
    assert tokens > 0
    assert "o200k" not in how or "estimate" in how
