"""Every `fluid` command README.md and docs/ show runs, from the console script, as shown.

Each command is taken from the fenced code blocks of the pages (continuation
lines joined, the trailing comment dropped) and run by ``bash -c`` in a fresh
HOME, with no provider variable from the machine, against a model server on
loopback where it needs a provider. Its exit code and a line of its output
are checked. A command added to a page without a case here fails
:func:`test_every_command_the_docs_show_has_a_case`; a case whose command left
the docs fails it too. The synopsis at the top of docs/cli.md is checked
against each command's ``--help``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.docs_model import EXAMPLE_CASSETTE, Model, model_server

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SYNOPSIS_PAGE = ROOT / "docs" / "cli.md"
EXAMPLE_INTENT = EXAMPLE_CASSETTE.with_name("sales_orders.intent.yaml")
OPENAI_KEY = "sk-proj-DOCSCOMMANDS0123456789abcdef"
ANTHROPIC_KEY = "sk-ant-api03-DOCSCOMMANDS0123456789abcdef"
PROVIDER_VARIABLES = re.compile(
    r"^(OPENAI|AZURE_OPENAI|ANTHROPIC|GEMINI|GOOGLE|GROQ|MISTRAL|OPENROUTER|OLLAMA|FLUID)_"
)


# -- what the pages show ------------------------------------------------------------------


def _blocks(text: str) -> Iterator[tuple[int, int, list[str]]]:
    """``(block number, first line number, lines)`` of each fenced code block."""
    lines = text.splitlines()
    number, start, inside, body = 0, 0, False, []
    for i, line in enumerate(lines, 1):
        if line.lstrip().startswith("```"):
            if inside:
                yield number, start, body
                number += 1
                inside, body = False, []
            else:
                inside, start = True, i + 1
        elif inside:
            body.append(line)


def _commands(lines: list[str]) -> Iterator[tuple[int, str]]:
    """``(offset, command)`` of each `fluid` line: continuations joined, comment dropped."""
    joined: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for offset, line in enumerate(lines):
        if pending is not None:
            pending = (pending[0], pending[1] + " " + line.strip())
        else:
            pending = (offset, line.strip())
        if pending[1].endswith("\\"):
            pending = (pending[0], pending[1][:-1].rstrip())
            continue
        joined.append(pending)
        pending = None
    for offset, command in joined:
        command = re.sub(r"\s+#\s.*$", "", command).strip()
        if command.startswith("fluid ") or command == "fluid":
            yield offset, re.sub(r"\s+", " ", command)


def shown() -> dict[str, list[str]]:
    """Every runnable command the pages show, with where it is shown."""
    found: dict[str, list[str]] = {}
    for page in PAGES:
        for number, start, lines in _blocks(page.read_text(encoding="utf-8")):
            if page == SYNOPSIS_PAGE and number == 0:
                continue  # the synopsis: see test_the_synopsis_matches_the_commands
            for offset, command in _commands(lines):
                where = f"{page.relative_to(ROOT)}:{start + offset}"
                found.setdefault(command, []).append(where)
    return found


def synopsis() -> list[str]:
    _, _, lines = next(_blocks(SYNOPSIS_PAGE.read_text(encoding="utf-8")))
    return [command for _, command in _commands(lines)]


# -- how each runs ------------------------------------------------------------------------


@dataclass
class Place:
    """A fresh machine: a working directory, a HOME, the environment, a model on loopback."""

    cwd: Path
    home: Path
    base: str
    model: Model
    env: dict[str, str] = field(default_factory=dict)
    #: Run when the place is left: what a setup started (a server) is stopped.
    cleanups: list[Callable[[], None]] = field(default_factory=list)

    def openai(self) -> None:
        self.env["OPENAI_API_KEY"] = OPENAI_KEY
        self.env["OPENAI_BASE_URL"] = f"{self.base}/v1"

    def anthropic(self) -> None:
        self.env["ANTHROPIC_API_KEY"] = ANTHROPIC_KEY
        self.env["ANTHROPIC_BASE_URL"] = self.base

    def intent(self, name: str = "my-intent.yaml") -> None:
        shutil.copy(EXAMPLE_INTENT, self.cwd / name)

    def corpus(self, where: str = "corpus") -> None:
        shutil.copytree(ROOT / "corpus", self.cwd / where)

    def keyring(self) -> None:
        """An OS keyring, as a desktop has (a file under this HOME)."""
        self.env["PYTHON_KEYRING_BACKEND"] = "tests.file_keyring.FileKeyring"
        self.env["PYTHONPATH"] = str(ROOT)


@dataclass(frozen=True)
class Case:
    exit: int
    expect: str  # a piece of stdout + stderr
    setup: Callable[[Place], None] = lambda place: None
    stdin: str | None = None
    check: Callable[[Place], None] = lambda place: None


def _live_forge(place: Place) -> None:
    place.openai()
    place.intent()


def _forge_wrote(out: str) -> Callable[[Place], None]:
    def check(place: Place) -> None:
        assert (place.cwd / out / "contract.fluid.yaml").is_file()
        assert (place.cwd / out / ".fluid" / "forge-receipt.json").is_file()
        assert place.model.requests, "the forge never asked the model"

    return check


def _forge_limited(place: Place) -> None:
    """docs/cli.md's --max-output-tokens 4000: in every request the forge sent."""
    _forge_wrote("forge-out")(place)
    sent = [r.body.get("max_completion_tokens") for r in place.model.requests]
    assert sent == [4000] * len(sent)


def _offline_forge(place: Place) -> None:
    assert (place.cwd / "forge-out" / "contract.fluid.yaml").is_file()
    assert not place.model.requests, "the offline default asked a model"


def _recorded_forge(place: Place) -> None:
    cassette = place.cwd / "run.json"
    assert cassette.is_file()
    assert OPENAI_KEY not in cassette.read_text(encoding="utf-8")


def _forge_recording(place: Place) -> None:
    """`--replay run.json` after the page's `--record run.json`, with the key gone."""
    _live_forge(place)
    done = run(place, "fluid forge my-intent.yaml --record run.json")
    assert done.returncode == 0, done.stdout + done.stderr
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL"):
        del place.env[name]
    place.model.requests.clear()


def _prompts(place: Place) -> None:
    place.openai()
    (place.cwd / "prompts.txt").write_text("Name a colour.\nName a fruit.\n", encoding="utf-8")


def _batch_wrote(place: Place) -> None:
    lines = (place.cwd / "results.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(lines) == 2
    assert len(place.model.requests) == 2


def _batch_sampled(place: Place) -> None:
    _batch_wrote(place)
    sent = [(r.body.get("temperature"), r.body.get("seed")) for r in place.model.requests]
    assert sent == [(0.0, 42), (0.0, 42)]


def _fake_server(place: Place) -> None:
    """docs/batch.md: `python -m fluid_build.fakeserver &` started, OPENAI_BASE_URL at it."""
    import threading

    from fluid_build.fakeserver import FakeServer

    server = FakeServer(0)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()

    def stop() -> None:
        server.shutdown()
        thread.join(10)
        server.server_close()

    place.cleanups.append(stop)
    place.env["OPENAI_BASE_URL"] = server.base_url
    (place.cwd / "prompts.txt").write_text("Name a colour.\nName a fruit.\n", encoding="utf-8")


def _fake_server_echoed(place: Place) -> None:
    lines = (place.cwd / "results.jsonl").read_text(encoding="utf-8").splitlines()
    texts = [json.loads(line)["text"] for line in lines]
    assert texts == ["echo: Name a colour.", "echo: Name a fruit."]
    assert not place.model.requests, "the docs' model server was asked instead"


def _one_get(place: Place) -> None:
    assert [(r.method, r.path) for r in place.model.requests] == [("GET", "/v1/models")]


def _stored_setup(place: Place) -> None:
    """`fluid ai setup --check` after the key was stored as the page before it shows."""
    place.keyring()
    place.env["OPENAI_BASE_URL"] = f"{place.base}/v1"
    stored = subprocess.run(
        ["fluid", "ai", "setup", "--provider", "openai", "--model", "gpt-4o"],  # noqa: S607
        input=OPENAI_KEY + "\n",
        capture_output=True,
        text=True,
        cwd=place.cwd,
        env=place.env,
        timeout=60,
        check=False,
    )
    assert stored.returncode == 0, stored.stdout + stored.stderr


def _recorded(path: str) -> Callable[[Place], None]:
    def check(place: Place) -> None:
        cassette = place.cwd / path
        assert cassette.is_file()
        assert ANTHROPIC_KEY not in cassette.read_text(encoding="utf-8")

    return check


REPLAYED = "replayed as recorded"

CASES: dict[str, Case] = {
    # README.md, "A short tour" (after `export OPENAI_API_KEY=...`)
    "fluid forge my-intent.yaml --out out/": Case(
        0, "contract", _live_forge, check=_forge_wrote("out")
    ),
    "fluid forge my-intent.yaml --agent-loop": Case(
        0, "contract", _live_forge, check=_forge_wrote("forge-out")
    ),
    "fluid doctor": Case(0, "provider"),
    "fluid doctor --reset": Case(0, "cleared"),
    "fluid corpus replay corpus/": Case(0, REPLAYED, lambda p: p.corpus()),
    # docs/cli.md, `fluid forge`
    "fluid forge --agent-loop": Case(0, "fix  generate", check=_offline_forge),
    "fluid forge my-intent.yaml --record run.json": Case(
        0, "recorded run.json", _live_forge, check=_recorded_forge
    ),
    "fluid forge my-intent.yaml --replay run.json": Case(
        0, "contract", _forge_recording, check=_offline_forge
    ),
    "fluid forge my-intent.yaml --max-output-tokens 4000": Case(
        0, "contract", _live_forge, check=_forge_limited
    ),
    # docs/batch.md
    "fluid batch prompts.txt --out results.jsonl": Case(0, "success", _prompts, check=_batch_wrote),
    "fluid batch prompts.txt --json --concurrency 4": Case(0, '"summary"', _prompts),
    "fluid batch prompts.txt --temperature 0 --seed 42 --out results.jsonl": Case(
        0, "success", _prompts, check=_batch_sampled
    ),
    "fluid batch prompts.txt --provider openai_compatible --model echo --out results.jsonl": Case(
        0, "success", _fake_server, check=_fake_server_echoed
    ),
    # docs/ai-setup.md
    "fluid ai setup --provider openai --model gpt-4o": Case(
        0, "openai", lambda p: p.keyring(), stdin=OPENAI_KEY + "\n"
    ),
    "fluid ai setup --check": Case(0, "accepted", _stored_setup, check=_one_get),
    # docs/corpus.md
    "fluid corpus replay": Case(0, REPLAYED, lambda p: p.corpus()),
    "fluid corpus replay corpus/openai-*.json": Case(0, REPLAYED, lambda p: p.corpus()),
    "fluid corpus replay --json path/to/dir": Case(0, '"ok"', lambda p: p.corpus("path/to/dir")),
    "fluid corpus record --provider anthropic --out corpus/anthropic-live.json "
    "--response-model Plan "
    '"Plan a daily sales_orders data product."': Case(
        0,
        "",
        lambda p: (p.anthropic(), (p.cwd / "corpus").mkdir()),
        check=_recorded("corpus/anthropic-live.json"),
    ),
    "fluid corpus record --provider anthropic --model claude-sonnet-4-6 "
    "--out corpus/anthropic-live-success.json --response-model Plan "
    '"Plan a daily sales_orders data product: its name and the build steps."': Case(
        0,
        "",
        lambda p: (p.anthropic(), (p.cwd / "corpus").mkdir()),
        check=_recorded("corpus/anthropic-live-success.json"),
    ),
    # docs/doctor.md and docs/fallbacks-and-breakers.md
    "fluid doctor --reset --provider openai --model gpt-4o": Case(0, "cleared"),
    "fluid doctor --reset --endpoint http://127.0.0.1:8000/v1": Case(0, "cleared"),
}


def _environment(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not PROVIDER_VARIABLES.match(k)}
    for name in ("PYTHONPATH", "PYTHON_KEYRING_BACKEND", "NO_COLOR", "HTTPS_PROXY", "ALL_PROXY"):
        env.pop(name, None)
    scripts = sysconfig.get_path("scripts")
    env.update(
        HOME=str(home),
        XDG_CONFIG_HOME=str(home / ".config"),
        XDG_CACHE_HOME=str(home / ".cache"),
        XDG_DATA_HOME=str(home / ".local" / "share"),
        PATH=os.pathsep.join([scripts, env.get("PATH", "")]),
        NO_PROXY="127.0.0.1,localhost",
    )
    return env


@contextmanager
def new_place(
    tmp_path: Path, *, openai: bool = False, attempts: int | None = None
) -> Iterator[Place]:
    """A fresh HOME and working directory, a model on loopback; with ``openai``, a key for it.

    ``attempts`` sets FLUID_LLM_MAX_ATTEMPTS (1: no retry, so no test waits).
    """
    home = tmp_path / "home"
    cwd = tmp_path / "work"
    home.mkdir()
    cwd.mkdir()
    with model_server() as (base, model):
        found = Place(cwd, home, base, model, _environment(home))
        if openai:
            found.openai()
        if attempts is not None:
            found.env["FLUID_LLM_MAX_ATTEMPTS"] = str(attempts)
        try:
            yield found
        finally:
            for cleanup in found.cleanups:
                cleanup()


@pytest.fixture
def place(tmp_path: Path) -> Iterator[Place]:
    with new_place(tmp_path) as found:
        yield found


def run(place: Place, command: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", command],  # noqa: S607 - the shell, as a reader types the command
        input=stdin,
        capture_output=True,
        text=True,
        cwd=place.cwd,
        env=place.env,
        timeout=120,
        check=False,
    )


# -- the tests ----------------------------------------------------------------------------


def test_every_command_the_docs_show_has_a_case() -> None:
    pages = shown()
    assert len(pages) >= 10, "the pages show fewer commands than expected: is the parser broken?"
    missing = {command: where for command, where in pages.items() if command not in CASES}
    stale = sorted(set(CASES) - set(pages))
    assert not missing, f"commands shown without a case in {__name__}: {missing}"
    assert not stale, f"cases for commands no page shows any more: {stale}"


@pytest.mark.parametrize("command", sorted(CASES))
def test_a_command_the_docs_show_runs_as_shown(place: Place, command: str) -> None:
    case = CASES[command]
    case.setup(place)
    done = run(place, command, case.stdin)
    output = done.stdout + done.stderr
    where = ", ".join(shown().get(command, ["(no page)"]))
    assert done.returncode == case.exit, f"{command} ({where}) exited {done.returncode}:\n{output}"
    assert case.expect in output, f"{command} ({where}) did not say {case.expect!r}:\n{output}"
    assert "Traceback" not in output
    for key in (OPENAI_KEY, ANTHROPIC_KEY):
        assert key not in output
    case.check(place)


@pytest.mark.parametrize("line", synopsis())
def test_the_synopsis_matches_the_commands(place: Place, line: str) -> None:
    command: list[str] = []  # the leading sub-command words: ai setup, corpus record ...
    for word in line.split()[1:]:
        if not re.fullmatch(r"[a-z][a-z-]*", word):
            break
        command.append(word)
    if not command:  # `fluid --version`, `fluid -V`: options of the group itself
        done = run(place, line)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "fluid" in done.stdout
        return
    done = run(place, " ".join(["fluid", *command, "--help"]))
    assert done.returncode == 0, done.stdout + done.stderr
    for option in re.findall(r"--[a-z][a-z-]*", line):
        assert option in done.stdout, f"{line!r}: {option} is not an option of fluid {command}"


def test_the_quick_start_forge_is_offline_and_exact(place: Place) -> None:
    """README's first command ends in `fluid forge`: with no key, it forges offline."""
    done = run(place, "fluid forge")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (place.cwd / "forge-out" / "contract.fluid.yaml").is_file()
    assert place.model.requests == []


def test_the_interpreter_is_the_one_under_test() -> None:
    scripts = Path(sysconfig.get_path("scripts"))
    assert (scripts / "fluid").exists(), f"no console script in {scripts} ({sys.executable})"


# -- the other commands the pages show: what they name exists ------------------------------

_LONG_RUNNING = re.compile(r"^(?:[A-Z_]+=\S+ )*(nox|python3?|export|pip)\b")


def other_commands() -> dict[str, list[str]]:
    """Commands that are not `fluid`: nox sessions, test and benchmark runs, exports."""
    found: dict[str, list[str]] = {}
    for page in PAGES:
        for _, start, lines in _blocks(page.read_text(encoding="utf-8")):
            for offset, line in enumerate(lines):
                command = re.sub(r"\s+#\s.*$", "", line).strip()
                if _LONG_RUNNING.match(command) and " -m venv " not in command:
                    where = f"{page.relative_to(ROOT)}:{start + offset}"
                    found.setdefault(command, []).append(where)
    return found


def _source_text() -> str:
    return "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "src").rglob("*.py"))


def nox_sessions() -> set[str]:
    """The sessions noxfile.py defines, read from its syntax tree (importing it registers them)."""
    import ast

    names: set[str] = set()
    for node in ast.walk(ast.parse((ROOT / "noxfile.py").read_text(encoding="utf-8"))):
        if not isinstance(node, ast.FunctionDef):
            continue
        for decorator in node.decorator_list:
            call = decorator if isinstance(decorator, ast.Call) else None
            target = call.func if call is not None else decorator
            if isinstance(target, ast.Attribute) and target.attr == "session":
                given = [
                    k.value.value
                    for k in (call.keywords if call is not None else [])
                    if k.arg == "name" and isinstance(k.value, ast.Constant)
                ]
                names.add(str(given[0]) if given else node.name)
    return names


def test_every_nox_session_test_file_script_and_variable_the_pages_name_exists() -> None:
    """Sessions and suites that run for minutes are not run here; what they name must exist."""
    sessions = nox_sessions()
    source = _source_text()
    checked = 0
    for command, where in other_commands().items():
        words = command.split()
        for i, word in enumerate(words):
            if word == "-s" and words[0] == "nox":
                assert words[i + 1] in sessions, f"{where}: no nox session {words[i + 1]!r}"
            elif re.fullmatch(r"(tests|benchmarks|tools|corpus)/\S+\.py", word):
                assert (ROOT / word).is_file(), f"{where}: {word} does not exist"
        if words[0] == "export":
            for assignment in words[1:]:
                name = assignment.split("=", 1)[0]
                assert f'"{name}"' in source, f"{where}: nothing in src/ reads {name}"
        checked += 1
    assert checked >= 5


def test_a_test_selection_the_pages_show_selects_tests() -> None:
    """`-k chaos_calls` and friends: the selection the page gives is not empty."""
    for command, where in other_commands().items():
        if "pytest" not in command or " -k " not in command:
            continue
        selection = command.split(" -k ", 1)[1].split()[0]
        paths = [w for w in command.split() if w.startswith("tests/")]
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "--collect-only", "-q", *paths, "-k", selection],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, f"{where}: {command}\n{done.stdout}{done.stderr}"
