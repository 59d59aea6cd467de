"""`fluid corpus` from the console script: paths it cannot use, a server that is down, forge runs.

`corpus record --out` is checked before any request (a path through a file,
a directory nothing can be created in, a FIFO), a recording whose request got
no answer reports the network failure, and `corpus replay` refuses a `fluid
forge` cassette in one line naming the command that replays it. Each runs the
installed `fluid` in a fresh HOME against a model server on loopback.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from fluid_build.cli.exit_codes import EXIT_CODES
from fluid_build.cli.forge import EXAMPLE_AGENT_CASSETTE, EXAMPLE_CASSETTE
from tests.test_docs_commands import EXAMPLE_INTENT, OPENAI_KEY, Place, new_place, run

ROOT = Path(__file__).resolve().parents[1]
RECORD = "fluid corpus record --provider openai --model gpt-4o-mini"


@pytest.fixture
def place(tmp_path: Path) -> Iterator[Place]:
    with new_place(tmp_path, openai=True) as place:
        yield place


def _one_failure(stderr: str) -> str:
    """The headline of a failure reported as fluid reports one: no traceback, no bug line."""
    assert "Traceback" not in stderr, stderr
    assert "looks like a bug" not in stderr, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) <= 2, stderr
    assert lines[0].startswith("fluid: "), stderr
    if len(lines) == 2:
        assert lines[1].startswith("hint: "), stderr
    return lines[0]


# -- corpus record --out, before anything is sent --------------------------------------------


def test_record_out_below_a_file_is_refused_before_any_request(place: Place) -> None:
    (place.cwd / "afile").write_text("not a directory\n", encoding="utf-8")
    done = run(place, f"{RECORD} --out afile/x.json hi")
    assert done.returncode == EXIT_CODES["output"], done.stderr
    headline = _one_failure(done.stderr)
    assert "OutputPathError" in headline
    assert "afile is not a directory" in headline
    assert place.model.requests == []
    assert (place.cwd / "afile").read_text(encoding="utf-8") == "not a directory\n"


def test_record_out_where_nothing_can_be_created_is_refused_before_any_request(
    place: Place,
) -> None:
    done = run(place, f"{RECORD} --out /proc/x.json hi")
    assert done.returncode == EXIT_CODES["output"], done.stderr
    headline = _one_failure(done.stderr)
    assert "/proc/x.json" in headline
    assert "cannot be written" in headline
    assert place.model.requests == []


def test_record_out_on_a_fifo_is_refused_and_the_fifo_stays(place: Place) -> None:
    fifo = place.cwd / "pipe.json"
    os.mkfifo(fifo)
    done = run(place, f"{RECORD} --out pipe.json hi")  # refused before --force is asked for
    assert done.returncode == EXIT_CODES["output"], done.stderr
    headline = _one_failure(done.stderr)
    assert "pipe.json" in headline
    assert "FIFO" in headline
    assert place.model.requests == []
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_record_out_as_dev_stdout_is_refused_before_any_request(place: Place) -> None:
    done = run(place, f"{RECORD} --out /dev/stdout hi")
    assert done.returncode == EXIT_CODES["output"], done.stderr
    _one_failure(done.stderr)
    assert "/dev/stdout" in done.stderr
    assert done.stdout == ""
    assert place.model.requests == []


def test_record_out_through_a_link_keeps_the_link(place: Place) -> None:
    (place.cwd / "cassettes").mkdir()
    (place.cwd / "cassettes" / "real.json").write_text("{}", encoding="utf-8")
    (place.cwd / "link.json").symlink_to(place.cwd / "cassettes" / "real.json")
    done = run(place, f"{RECORD} --out link.json --force --response-model Plan hi")
    assert done.returncode == 0, done.stderr
    assert (place.cwd / "link.json").is_symlink()
    written = json.loads((place.cwd / "cassettes" / "real.json").read_text(encoding="utf-8"))
    assert written["version"] == 1


def test_record_out_in_a_new_directory_still_records(place: Place) -> None:
    done = run(place, f"{RECORD} --out new/dir/x.json --response-model Plan hi")
    assert done.returncode == 0, done.stderr
    assert json.loads((place.cwd / "new" / "dir" / "x.json").read_text())["version"] == 1
    assert len(place.model.requests) == 1


# -- corpus record with the server down ----------------------------------------------------------


def _closed_port() -> int:
    """A loopback port nothing listens on: a connection to it is refused at once."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_record_with_the_server_down_reports_the_network_failure(place: Place) -> None:
    place.env["OPENAI_BASE_URL"] = f"http://127.0.0.1:{_closed_port()}/v1"
    place.env["FLUID_LLM_MAX_ATTEMPTS"] = "1"  # no backoff sleeps in a test
    done = run(place, f"{RECORD} --out down.json hi")
    assert done.returncode == EXIT_CODES["timeout"], done.stderr
    headline = _one_failure(done.stderr)
    assert "[llm.network_error]" in headline
    assert "CassetteError" not in done.stderr
    assert OPENAI_KEY not in done.stdout + done.stderr
    assert not (place.cwd / "down.json").exists()


# -- corpus replay and the cassettes fluid forge writes -----------------------------------------


def _refused_as_a_forge_run(done: object, name: str) -> None:
    assert getattr(done, "returncode") == EXIT_CODES["intent"]  # noqa: B009 - CompletedProcess
    stdout, stderr = getattr(done, "stdout"), getattr(done, "stderr")  # noqa: B009
    headline = _one_failure(stderr)
    assert name in headline
    assert re.search(r"`fluid forge (--agent-loop )?--replay ", headline), headline
    assert "MISMATCH" not in stdout + stderr
    assert "did not replay" not in stdout + stderr


@pytest.mark.parametrize("bundled", [EXAMPLE_CASSETTE, EXAMPLE_AGENT_CASSETTE])
def test_replay_refuses_a_bundled_forge_cassette_naming_fluid_forge(
    place: Place, bundled: Path
) -> None:
    shutil.copy(bundled, place.cwd / bundled.name)
    done = run(place, f"fluid corpus replay {bundled.name}")
    _refused_as_a_forge_run(done, bundled.name)


def test_replay_refuses_what_fluid_forge_record_wrote_and_forge_replays_it(place: Place) -> None:
    shutil.copy(EXAMPLE_INTENT, place.cwd / "intent.yaml")
    recorded = run(place, "fluid forge intent.yaml --record run.json --out out1")
    assert recorded.returncode == 0, recorded.stderr
    sent = len(place.model.requests)
    done = run(place, "fluid corpus replay run.json")
    _refused_as_a_forge_run(done, "run.json")
    assert "fluid forge --replay run.json" in done.stderr
    replayed = run(place, "fluid forge intent.yaml --replay run.json --out out2")
    assert replayed.returncode == 0, replayed.stderr
    assert len(place.model.requests) == sent  # both replays stayed offline


def test_replay_refuses_a_forge_run_recorded_without_bodies(place: Place) -> None:
    """--no-bodies keeps no request body: the cassette still says it is a forge run."""
    shutil.copy(EXAMPLE_INTENT, place.cwd / "intent.yaml")
    recorded = run(place, "fluid forge intent.yaml --record flow.json --no-bodies --out out1")
    assert recorded.returncode == 0, recorded.stderr
    assert json.loads((place.cwd / "flow.json").read_text(encoding="utf-8"))["forge_run"] is True
    sent = len(place.model.requests)
    done = run(place, "fluid corpus replay flow.json")
    _refused_as_a_forge_run(done, "flow.json")
    assert len(place.model.requests) == sent


def test_replay_refuses_a_forge_run_in_a_directory_and_replays_nothing(place: Place) -> None:
    place.corpus("mixed")
    shutil.copy(EXAMPLE_CASSETTE, place.cwd / "mixed" / "zz-forge.json")
    done = run(place, "fluid corpus replay mixed")
    _refused_as_a_forge_run(done, "zz-forge.json")
    assert "replayed as recorded" not in done.stdout


def test_replay_json_refusal_of_a_forge_run(place: Place) -> None:
    shutil.copy(EXAMPLE_CASSETTE, place.cwd / "forge.json")
    done = run(place, "fluid corpus replay --json forge.json")
    assert done.returncode == EXIT_CODES["intent"], done.stderr
    payload = json.loads(done.stdout)
    assert payload["ok"] is False
    assert payload["exit_code"] == EXIT_CODES["intent"]
    assert payload["error"]["error"] == "CassetteError"
    assert "fluid forge --replay forge.json" in payload["error"]["message"]


def test_the_corpus_still_replays(place: Place) -> None:
    place.corpus()
    done = run(place, "fluid corpus replay corpus")
    assert done.returncode == 0, done.stdout + done.stderr


def _advised(stderr: str) -> str:
    """The command the refusal advises: the backquoted one after "replay it with"."""
    match = re.search(r"replay it with `(fluid forge [^`]+)`", stderr)
    assert match is not None, stderr
    return match.group(1)


def test_the_advice_for_the_bundled_examples_is_a_command_that_works(place: Place) -> None:
    """issue 35 item 7: the command `corpus replay` advises for the package's examples
    folder, run as advised (from the same folder, another than the example workspace),
    replays the run and exits 0, offline."""
    examples = EXAMPLE_CASSETTE.parent
    done = run(place, f"fluid corpus replay {examples}/")
    _refused_as_a_forge_run(done, EXAMPLE_AGENT_CASSETTE.name)
    advised = _advised(done.stderr)
    assert advised == f"fluid forge --agent-loop --replay {EXAMPLE_AGENT_CASSETTE}"
    sent = len(place.model.requests)
    replayed = run(place, advised)
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    assert (place.cwd / "forge-out" / "contract.fluid.yaml").is_file()
    assert len(place.model.requests) == sent
    # The plain one is advised without --agent-loop, and works as advised too.
    plain = run(place, f"fluid corpus replay {EXAMPLE_CASSETTE}")
    assert _advised(plain.stderr) == f"fluid forge --replay {EXAMPLE_CASSETTE}"
    again = run(place, _advised(plain.stderr) + " --out plain")
    assert again.returncode == 0, again.stdout + again.stderr


def test_the_advice_for_a_moved_agent_run_says_where_to_run_it(place: Place) -> None:
    shutil.copy(EXAMPLE_AGENT_CASSETTE, place.cwd / "agent.json")
    done = run(place, "fluid corpus replay agent.json")
    _refused_as_a_forge_run(done, "agent.json")
    assert _advised(done.stderr) == "fluid forge --agent-loop --replay agent.json"
    assert (
        "from the workspace it was recorded in (its model read sources/raw_order_lines.sql)"
        in done.stderr
    )
    workspace = place.cwd / "ws"
    shutil.copytree(EXAMPLE_CASSETTE.parent / "workspace", workspace)
    shutil.copy(place.cwd / "agent.json", workspace / "agent.json")
    place.cwd = workspace
    replayed = run(place, _advised(done.stderr))
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr


# -- a bare install: no optional extra (issue 35 item 16) ---------------------------------


def _without_botocore(place: Place) -> None:
    """The bedrock extra missing: a botocore that cannot be imported shadows the installed
    one (the pattern of tests/test_ai_setup_providers.py; no venv is built)."""
    hidden = place.home / "hidden"
    (hidden / "botocore").mkdir(parents=True)
    (hidden / "botocore" / "__init__.py").write_text("raise ImportError('no botocore here')\n")
    place.env["PYTHONPATH"] = str(hidden)


def test_a_bare_install_skips_the_bedrock_cassettes_naming_the_extra(place: Place) -> None:
    place.corpus()
    _without_botocore(place)
    bedrock = sorted(
        path.stem
        for path in (place.cwd / "corpus").glob("*.json")
        if json.loads(path.read_text(encoding="utf-8")).get("provider") == "bedrock"
    )
    total = len(list((place.cwd / "corpus").glob("*.json")))
    assert bedrock
    done = run(place, "fluid corpus replay corpus")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "MISMATCH" not in done.stdout
    assert f"{total - len(bedrock)} cassette(s) replayed as recorded" in done.stdout
    assert (
        f"{len(bedrock)} skipped (bedrock): needs an extra that is not installed: "
        "pip install 'fluid-build[bedrock]'; install it to replay them"
    ) in done.stdout
    as_json = run(place, "fluid corpus replay --json corpus")
    assert as_json.returncode == 0, as_json.stdout + as_json.stderr
    payload = json.loads(as_json.stdout)
    assert (payload["ok"], payload["mismatched"], payload["skipped"]) == (True, 0, len(bedrock))
    skipped = [r for r in payload["results"] if r["outcome"] == "skipped"]
    assert sorted(r["name"] for r in skipped) == bedrock
    for row in skipped:
        assert row["skipped"] == (
            "needs an extra that is not installed: pip install 'fluid-build[bedrock]'"
        )
        assert row["error"].count("llm.not_configured") == 1  # the code, said once
        assert "Set the variable" not in row["error"]


def test_the_missing_extra_message_says_its_code_once_and_the_pip_line(place: Place) -> None:
    _without_botocore(place)
    place.env["AWS_REGION"] = "us-east-1"
    shutil.copy(EXAMPLE_INTENT, place.cwd / "intent.yaml")
    done = run(place, "fluid forge intent.yaml --provider bedrock --model amazon.nova-lite-v1:0")
    assert done.returncode == EXIT_CODES["auth"], done.stdout + done.stderr
    headline = _one_failure(done.stderr)
    assert headline.count("llm.not_configured") == 1
    assert "pip install 'fluid-build[bedrock]'" in headline
    assert done.stderr.strip().splitlines()[-1] == (
        "hint: install the extra it needs, pip install 'fluid-build[bedrock]', and run again."
    )
