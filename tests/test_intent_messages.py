"""What `fluid forge` says about an intent file it cannot use, from the console script.

An empty file or one that holds no mapping is named in an operator's words
(never a Python type such as ``NoneType``); malformed YAML gives the line, the
column and the parser's reason, bounded, without echoing what the file holds.
Every case exits 3 before any request and writes nothing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fluid_build.cli.exit_codes import EXIT_CODES
from fluid_build.cli.forge import EXAMPLE_CASSETTE
from fluid_build.forge.intent import IntentError, load_intent
from tests.test_cli_conventions import fluid

HIDDEN = "hunter2hunter2hunter2"  # not shaped like any provider key: redaction would miss it
KEY = "sk-proj-" + "A1b2C3d4E5f6" * 4


def _forge(tmp_path: Path, content: str) -> tuple[int, str]:
    home = tmp_path / "home"
    home.mkdir()
    intent = tmp_path / "intent.yaml"
    intent.write_text(content, encoding="utf-8")
    out = tmp_path / "out"
    # --replay: nothing could be sent even if the intent were read wrongly.
    done = fluid(
        home, "forge", str(intent), "--replay", str(EXAMPLE_CASSETTE), "--out", str(out), cwd=home
    )
    assert not out.exists(), "nothing is written for an intent that cannot be used"
    assert "Traceback" not in done.stderr
    return done.returncode, done.stdout + done.stderr


@pytest.mark.parametrize(
    ("content", "said"),
    [
        ("", "is empty"),
        ("\n\n   \n", "is empty"),
        ("# just a comment\n# and another\n", "is empty"),
        ("---\n", "is empty"),
        ("- a\n- b\n", "holds a list"),
        ("just some words\n", "holds plain text"),
        ("42\n", "holds a number"),
        ("true\n", "holds true or false"),
    ],
)
def test_an_intent_without_a_mapping_is_named_in_operator_words(
    tmp_path: Path, content: str, said: str
) -> None:
    code, output = _forge(tmp_path, content)
    assert code == EXIT_CODES["intent"], output
    assert said in output
    assert "data_product" in output  # what the file needs
    for python in ("NoneType", "not list", "not str", "not int", "not bool"):
        assert python not in output


@pytest.mark.parametrize(
    ("content", "where", "reason"),
    [
        (
            "data_product:\n  name: x\n  bad: a: b\n",
            "line 3, column 9",
            "mapping values are not allowed here",
        ),
        ('grain: "one row per order\n', "line 2, column 1", "found unexpected end of stream"),
        ("data_product: [1, 2", "line 1, column 20", "expected ',' or ']'"),
        ("dimensions:\n\t- customer\n", "line 2, column 1", "cannot start any token"),
        ("grain: one\nowner: a\x07b\n", "line 2, column 9", "special characters are not allowed"),
    ],
)
def test_malformed_yaml_gives_the_parsers_reason(
    tmp_path: Path, content: str, where: str, reason: str
) -> None:
    code, output = _forge(tmp_path, content)
    assert code == EXIT_CODES["intent"], output
    assert f"is not valid YAML at {where}" in output
    assert reason in output


@pytest.mark.parametrize("secret", [HIDDEN, KEY])
def test_the_parsers_reason_never_echoes_what_the_file_holds(tmp_path: Path, secret: str) -> None:
    # PyYAML quotes the alias it could not find: the file's own text.
    code, output = _forge(tmp_path, f"api_key: *{secret}\n")
    assert code == EXIT_CODES["intent"], output
    assert "found undefined alias" in output
    assert secret not in output
    assert secret[:12] not in output


def test_the_parsers_reason_is_bounded(tmp_path: Path) -> None:
    code, output = _forge(tmp_path, "a: *" + "x" * 50_000 + "\n")
    assert code == EXIT_CODES["intent"], output
    assert "found undefined alias" in output
    assert len(output) < 600


def test_load_intent_says_the_same_without_the_cli(tmp_path: Path) -> None:
    intent = tmp_path / "intent.yaml"
    intent.write_text("", encoding="utf-8")
    with pytest.raises(IntentError, match=r"intent\.yaml is empty"):
        load_intent(intent)
    intent.write_text("a: b: c\n", encoding="utf-8")
    with pytest.raises(IntentError, match=r"line 1, column 5: mapping values are not allowed here"):
        load_intent(intent)
