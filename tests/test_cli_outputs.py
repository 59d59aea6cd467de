"""`--out` of `fluid batch` and `fluid forge`: checked before any request, never replaced
when it is a stream, and no answer lost when the last write fails.

Run from the console script in a fresh HOME against a model on loopback, which
counts the requests it gets. The tests run as root, where a directory chmod-ed
0500 is still writable; what really refuses a write to root is used instead:
``/sys`` (sysfs: no file can be created there, EACCES), ``/proc`` (procfs:
ENOENT), a path under a regular file (ENOTDIR), a directory that does not
exist, and a directory replaced by a regular file while the run goes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fluid_build.cli._messages import BUG_LINE
from fluid_build.cli.exit_codes import EXIT_CODES
from tests.docs_model import Request
from tests.test_cli_batch import PROMPTS, _echo, _lines
from tests.test_docs_commands import OPENAI_KEY, Place, new_place, run

ECHOED = [f"echo: {prompt}" for prompt in PROMPTS]


@pytest.fixture
def place(tmp_path: Path) -> Iterator[Place]:
    with new_place(tmp_path, openai=True, attempts=1) as found:
        cwd, model = found.cwd, found.model
        (cwd / "prompts.txt").write_text("\n".join(PROMPTS) + "\n", encoding="utf-8")
        (cwd / "afile").write_text("a regular file\n", encoding="utf-8")
        model.script = _echo()
        yield found


def _clean(done: Any) -> None:
    output = done.stdout + done.stderr
    assert "Traceback" not in output
    assert BUG_LINE not in output
    assert OPENAI_KEY not in output


def _error_line(stderr: str) -> str:
    return next(line for line in stderr.splitlines() if line.startswith("fluid: "))


# -- fluid batch --out -------------------------------------------------------------------

UNWRITABLE_FILES = [
    ("/sys/results.jsonl", "no file can be created in /sys (Permission denied)"),
    ("/proc/results.jsonl", "no file can be created in /proc (No such file or directory)"),
    ("afile/results.jsonl", "afile is not a directory"),
    ("missing/results.jsonl", "missing does not exist"),
]


@pytest.mark.parametrize(("out", "says"), UNWRITABLE_FILES)
def test_batch_refuses_an_out_it_cannot_write_before_any_request(
    place: Place, out: str, says: str
) -> None:
    done = run(place, f"fluid batch prompts.txt --out {out}")
    assert done.returncode == EXIT_CODES["output"] == 4, done.stdout + done.stderr
    assert _error_line(done.stderr) == f"fluid: OutputPathError: {out} cannot be written: {says}"
    assert "hint: choose an --out you can write and run again; nothing was sent" in done.stderr
    _clean(done)
    as_json = run(place, f"fluid batch prompts.txt --out {out} --json")
    error = json.loads(as_json.stdout)
    assert error["exit_code"] == 4
    assert error["error"]["error"] == "OutputPathError"
    assert place.model.requests == []


def test_batch_streams_into_a_fifo_and_leaves_it_a_fifo(place: Place) -> None:
    fifo = place.cwd / "results.fifo"
    os.mkfifo(fifo)
    got: list[bytes] = []

    def reader() -> None:
        with open(fifo, "rb") as stream:  # waits for fluid to open it, as `cat fifo` does
            got.append(stream.read())

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    done = run(place, "fluid batch prompts.txt --out results.fifo")
    thread.join(30)
    assert done.returncode == 0, done.stdout + done.stderr
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode), "the FIFO was replaced"
    assert got, "the FIFO's reader got nothing"
    assert [r["text"] for r in _lines(got[0].decode("utf-8"))] == ECHOED
    _clean(done)


@pytest.mark.parametrize("out", ["/dev/stdout", "/dev/fd/1", "stdout-link"])
def test_batch_writes_into_standard_output_through_a_descriptor_path(
    place: Place, out: str
) -> None:
    """``stdout-link`` is a link to /proc/self/fd/1 in the working directory: the same
    path as /dev/stdout, and one a run that replaced it would leave a regular file."""
    (place.cwd / "stdout-link").symlink_to("/proc/self/fd/1")
    done = run(place, f"fluid batch prompts.txt --out {out} --json")
    assert done.returncode == 0, done.stdout + done.stderr
    *records, result = _lines(done.stdout)
    assert [r["text"] for r in records] == ECHOED
    assert result["out"] == out
    assert os.readlink(place.cwd / "stdout-link") == "/proc/self/fd/1"
    _clean(done)


def test_batch_into_dev_stdout_redirected_to_a_file_keeps_the_order(place: Place) -> None:
    """Standard output is a regular file: the lines and the summary share its offset."""
    done = run(place, "fluid batch prompts.txt --out /dev/stdout --json > seen.jsonl")
    assert done.returncode == 0, done.stderr
    *records, result = _lines((place.cwd / "seen.jsonl").read_text(encoding="utf-8"))
    assert [r["text"] for r in records] == ECHOED
    assert result["summary"]["success"] == 4


def test_batch_through_a_link_to_a_file_writes_the_file_and_keeps_the_link(
    place: Place,
) -> None:
    (place.cwd / "real.jsonl").write_text("old results\n", encoding="utf-8")
    (place.cwd / "link.jsonl").symlink_to("real.jsonl")
    done = run(place, "fluid batch prompts.txt --out link.jsonl")
    assert done.returncode == 0, done.stdout + done.stderr
    assert os.readlink(place.cwd / "link.jsonl") == "real.jsonl"
    records = _lines((place.cwd / "real.jsonl").read_text(encoding="utf-8"))
    assert [r["text"] for r in records] == ECHOED


def _saved_file(stderr: str) -> Path:
    line = _error_line(stderr)
    found = re.search(r"the 4 results were saved in (\S+\.jsonl)$", line)
    assert found, line
    return Path(found[1])


def test_results_are_kept_when_the_out_directory_goes_away_during_the_run(
    place: Place,
) -> None:
    """--out passes the check, then its directory is replaced by a regular file while the
    first request is answered: the final write fails for real (ENOTDIR, root included)."""
    (place.cwd / "res").mkdir()
    answer = _echo()
    swapped = threading.Lock()

    def swap_then_answer(request: Request) -> tuple[int, dict[str, Any]] | None:
        with swapped:
            if (place.cwd / "res").is_dir():
                shutil.rmtree(place.cwd / "res")
                (place.cwd / "res").write_text("now a file\n", encoding="utf-8")
        return answer(request)  # type: ignore[no-any-return]

    place.model.script = swap_then_answer
    done = run(place, "fluid batch prompts.txt --out res/results.jsonl")
    assert done.returncode == EXIT_CODES["output"], done.stdout + done.stderr
    line = _error_line(done.stderr)
    assert line.startswith(
        "fluid: OutputPathError: res/results.jsonl could not be written (Not a directory); "
    ), line
    saved = _saved_file(done.stderr)
    assert saved.parent == place.cwd
    assert stat.S_IMODE(saved.stat().st_mode) == 0o600
    assert [r["text"] for r in _lines(saved.read_text(encoding="utf-8"))] == ECHOED
    assert f"hint: take the results from {saved}" in done.stderr
    assert len(place.model.requests) == 4
    _clean(done)


def test_results_are_kept_when_the_fifo_reader_leaves(place: Place) -> None:
    """The FIFO's reader closes its end before the answers come: writing gets EPIPE."""
    fifo = place.cwd / "results.fifo"
    os.mkfifo(fifo)
    gone = threading.Event()

    def reader() -> None:
        fd = os.open(fifo, os.O_RDONLY)  # waits for fluid to open it
        os.close(fd)
        gone.set()

    answer = _echo()

    def after_the_reader_left(request: Request) -> tuple[int, dict[str, Any]] | None:
        gone.wait(30)
        return answer(request)  # type: ignore[no-any-return]

    place.model.script = after_the_reader_left
    threading.Thread(target=reader, daemon=True).start()
    done = run(place, "fluid batch prompts.txt --out results.fifo --json")
    assert done.returncode == EXIT_CODES["output"], done.stdout + done.stderr
    error = json.loads(done.stdout)["error"]
    assert error["error"] == "OutputPathError"
    assert "could not be written (Broken pipe)" in error["message"]
    saved = Path(error["saved_to"])
    assert [r["text"] for r in _lines(saved.read_text(encoding="utf-8"))] == ECHOED
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


# -- fluid forge --out -------------------------------------------------------------------

UNWRITABLE_DIRS = [
    ("/proc/nope", "cannot be created: no directory can be made in /proc"),
    ("/sys/nope", "cannot be created: no directory can be made in /sys"),
    ("afile/sub", "cannot be created: afile is not a directory"),
]


@pytest.mark.parametrize("live", [True, False], ids=["live", "offline"])
@pytest.mark.parametrize(("out", "says"), UNWRITABLE_DIRS)
def test_forge_refuses_an_out_it_cannot_write_before_any_model_call(
    place: Place, out: str, says: str, live: bool
) -> None:
    if live:
        place.intent()
        command = f"fluid forge my-intent.yaml --out {out}"
    else:  # no key: the offline default, replaying the bundled example
        del place.env["OPENAI_API_KEY"]
        command = f"fluid forge --out {out}"
    done = run(place, command)
    assert done.returncode == EXIT_CODES["output"] == 4, done.stdout + done.stderr
    assert _error_line(done.stderr).startswith(f"fluid: OutputPathError: {out} {says}")
    assert "hint: choose an --out in a directory you can write" in done.stderr
    assert "stage plan" not in done.stderr
    _clean(done)
    assert place.model.requests == []


def test_forge_refuses_an_out_that_is_a_symlink_before_any_model_call(place: Place) -> None:
    place.intent()
    (place.cwd / "real").mkdir()
    (place.cwd / "out-link").symlink_to("real")
    done = run(place, "fluid forge my-intent.yaml --out out-link")
    assert done.returncode == EXIT_CODES["output"], done.stdout + done.stderr
    assert "fluid: OutputTreeError: cannot write the output: out-link is a symbolic link" in (
        done.stderr
    )
    assert place.model.requests == []
    assert list((place.cwd / "real").iterdir()) == []


def test_forge_whose_out_goes_away_during_the_run_is_a_typed_error(place: Place) -> None:
    """``parent`` is replaced by a regular file while the model writes the contract: the
    write step cannot make ``parent/out`` (ENOTDIR), which is exit 4, not a bug."""
    place.intent()
    (place.cwd / "parent").mkdir()

    def swap(request: Request) -> None:
        schema = ((request.body.get("response_format") or {}).get("json_schema") or {}).get("name")
        if schema == "ForgeOutput" and (place.cwd / "parent").is_dir():
            (place.cwd / "parent").rmdir()
            (place.cwd / "parent").write_text("now a file\n", encoding="utf-8")

    place.model.script = swap
    done = run(place, "fluid forge my-intent.yaml --out parent/out")
    assert done.returncode == EXIT_CODES["output"], done.stdout + done.stderr
    assert _error_line(done.stderr).startswith(
        "fluid: OutputPathError: parent/out could not be written at the end of the run"
    )
    _clean(done)


@pytest.mark.parametrize("record", ["afile/run.json", "/proc/run.json", "/dev/stdout"])
def test_forge_refuses_a_record_file_it_cannot_write_before_any_model_call(
    place: Place, record: str
) -> None:
    place.intent()
    (place.cwd / "afile").write_text("a file, not a directory\n", encoding="utf-8")
    done = run(place, f"fluid forge my-intent.yaml --record {record}")
    assert done.returncode == EXIT_CODES["output"] == 4, done.stdout + done.stderr
    assert _error_line(done.stderr).startswith(f"fluid: OutputPathError: {record} ")
    assert "stage plan" not in done.stderr
    _clean(done)
    assert place.model.requests == []
    assert not (place.cwd / "forge-out").exists()
