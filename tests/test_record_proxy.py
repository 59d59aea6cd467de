"""Recording goes through the proxy the environment names, as a call that is not recorded does.

The provider's host does not resolve; only the proxy on loopback can reach
"it", so a recording that connected directly would fail.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.docs_model import model_server
from tests.test_docs_commands import OPENAI_KEY, Place, _environment, run

UNREACHABLE = "http://api.openai.invalid/v1"


@pytest.fixture
def place(tmp_path: Path) -> Iterator[Place]:
    home, cwd = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    cwd.mkdir()
    with model_server() as (proxy, model):
        place = Place(cwd, home, proxy, model, _environment(home))
        place.env.pop("NO_PROXY", None)
        place.env.update(HTTP_PROXY=proxy, OPENAI_API_KEY=OPENAI_KEY, OPENAI_BASE_URL=UNREACHABLE)
        yield place


@pytest.mark.parametrize(
    "command",
    [
        'fluid corpus record --provider openai --model gpt-4o-mini --out rec.json "hi"',
        "fluid forge my-intent.yaml --record rec.json",
    ],
)
def test_a_recording_goes_through_the_environments_proxy(place: Place, command: str) -> None:
    place.intent()
    done = run(place, command)
    assert done.returncode == 0, done.stdout + done.stderr
    paths = [r.path for r in place.model.requests]
    assert paths, "nothing reached the proxy"
    assert all(p.startswith(UNREACHABLE) for p in paths), paths  # absolute URIs: a proxy
    cassette = json.loads((place.cwd / "rec.json").read_text(encoding="utf-8"))
    assert cassette["exchanges"]
    assert OPENAI_KEY not in json.dumps(cassette)
