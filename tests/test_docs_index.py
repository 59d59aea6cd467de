"""docs/README.md lists every page of docs/ (issue 35 item 17), and doctor.md's `--json`
example has the keys `fluid doctor --json` prints."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from tests.test_cli_conventions import FLUID, fresh_env

DOCS = Path(__file__).resolve().parents[1] / "docs"
INDEX = DOCS / "README.md"


def test_the_index_lists_every_page_once_with_a_line() -> None:
    text = INDEX.read_text(encoding="utf-8")
    rows = re.findall(r"^\| \[([a-z0-9-]+\.md)\]\(\1\) \| (.+) \|$", text, re.MULTILINE)
    listed = [page for page, _ in rows]
    pages = sorted(p.name for p in DOCS.glob("*.md") if p != INDEX)
    assert sorted(listed) == pages
    assert len(listed) == len(set(listed))
    assert all(len(line.split()) >= 5 for _, line in rows)


def test_every_link_of_the_index_resolves() -> None:
    for target in re.findall(r"\]\(([^)#]+)\)", INDEX.read_text(encoding="utf-8")):
        assert (DOCS / target).is_file(), target


def _example_keys() -> set[str]:
    text = (DOCS / "doctor.md").read_text(encoding="utf-8")
    block = text.split("## `--json`", 1)[1].split("```json", 1)[1].split("```", 1)[0]
    data = json.loads(block)
    assert isinstance(data, dict)
    return set(data)


def test_the_doctor_json_example_has_every_key_doctor_prints(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    env = fresh_env(home, FLUID_BUDGETS="team=25usd/day; ci=5usd")
    assert FLUID is not None
    done = subprocess.run(
        [FLUID, "doctor", "--json"],
        env=env,
        cwd=home,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    assert _example_keys() == set(printed)
    assert {"budgets", "prices"} <= _example_keys()
    assert [b["name"] for b in printed["budgets"]["budgets"]] == ["ci", "team"]
