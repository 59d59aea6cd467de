"""The table of classification rules: named once, sourced, alive, and documented as it runs.

Every rule must decide at least one real payload: the rows of
tests/data/provider_errors.json, and the few status-only or wording-only
answers below, each taken from the test that already pins its outcome. A rule
that no payload reaches is dead and goes, or gets its payload.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from fluid_build.copilot.agents.classification_rules import RULES, SHOULD_RETRY, Rule, decide
from fluid_build.copilot.agents.error_answers import Evidence, read_body

ROOT = Path(__file__).resolve().parents[1]
NOW = 1_700_000_000.0
CASES: list[dict[str, Any]] = json.loads(
    (ROOT / "tests" / "data" / "provider_errors.json").read_text(encoding="utf-8")
)

#: Answers that reach a rule no row of provider_errors.json reaches first:
#: (status, body, headers, the test that pins what it becomes).
PINNED: list[tuple[int, Any, dict[str, str], str]] = [
    (
        301,
        None,
        {"location": "https://api.openai.com/v1/chat/completions"},
        "tests/test_classification.py::test_redirect_is_a_bad_endpoint",
    ),
    (402, None, {}, "tests/test_classification.py::test_status_classes (402)"),
    (413, None, {}, "tests/test_classification.py::test_status_classes (413)"),
    (529, None, {}, "tests/test_classification.py::test_status_classes (529)"),
    (
        400,
        {"error": {"message": "You hit a rate limit"}},
        {},
        "tests/test_classification_sourced.py::test_a_rate_limit_phrase_standing_alone_is_a_rate_limit",
    ),
]


def evidence(status: int, body: Any, body_text: str | None, headers: dict[str, str]) -> Evidence:
    if body_text is not None:
        content = body_text.encode()
    elif body is not None:
        content = json.dumps(body).encode()
    else:
        content = b""
    response = httpx.Response(status, content=content, headers=headers)
    return Evidence(status, response.headers, read_body(response), NOW)


def case_evidence(case: dict[str, Any]) -> Evidence:
    return evidence(case["status"], case.get("body"), case.get("body_text"), case["headers"])


def test_rule_names_are_unique() -> None:
    names = [rule.name for rule in RULES] + [SHOULD_RETRY.name]
    assert len(set(names)) == len(names), [n for n in names if names.count(n) > 1]


@pytest.mark.parametrize("rule", [*RULES, SHOULD_RETRY], ids=lambda rule: rule.name)
def test_every_rule_cites_a_source_and_says_what_it_matches(rule: Any) -> None:
    assert rule.source.strip()
    assert rule.matches.strip()


def test_the_last_rule_takes_whatever_no_other_rule_took() -> None:
    last = RULES[-1]
    assert (last.statuses, last.wording, last.unless, last.when) == (frozenset(), None, None, None)
    assert decide(evidence(418, None, "nope", {})) is last


@pytest.mark.parametrize("case", CASES, ids=[case["id"] for case in CASES])
def test_the_deciding_rule_yields_the_expected_code(case: dict[str, Any]) -> None:
    assert decide(case_evidence(case)).yields.code == case["expect"]["code"]


def test_every_rule_decides_at_least_one_payload() -> None:
    decided: dict[str, str] = {}
    for case in CASES:
        decided.setdefault(decide(case_evidence(case)).name, case["id"])
    for status, body, headers, pinned_by in PINNED:
        decided.setdefault(decide(evidence(status, body, None, headers)).name, pinned_by)
    dead = [rule.name for rule in RULES if rule.name not in decided]
    assert not dead, f"no payload reaches these rules: {dead}"


def test_x_should_retry_is_sent_by_some_payload() -> None:
    said = {SHOULD_RETRY.says(case_evidence(case).headers) for case in CASES}
    assert {True, False} <= said


_ROW = re.compile(
    r"^\| (\d+) \| `([^`]+)` \| (.+?) \| .+? \| `([a-z_.]+)` \| .+? \| (.+) \|$", re.MULTILINE
)


def _documented(rule: Rule) -> tuple[str, str, str, str]:
    return rule.name, rule.matches, rule.yields.code, rule.source


def test_the_docs_list_the_rules_in_their_order() -> None:
    doc = (ROOT / "docs" / "typed-errors.md").read_text(encoding="utf-8")
    rows = _ROW.findall(doc)
    assert [int(row[0]) for row in rows] == list(range(1, len(rows) + 1))
    assert [tuple(row[1:]) for row in rows] == [_documented(rule) for rule in RULES]
    assert f"the rule `{SHOULD_RETRY.name}`" in doc
