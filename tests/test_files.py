"""Every reader of user paths: FIFOs, devices, directories, huge and deeply nested files.

The readers are ``fluid_build._files`` itself, the intent loader (library and
``fluid forge``), and the workspace tools ``read_sample_schema`` and
``discover_workspace``. None may block, read without bound, or end in
``RecursionError``.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from fluid_build._files import (
    MAX_DEPTH,
    FileTooLargeError,
    NotRegularFileError,
    TooDeepError,
    load_json,
    load_yaml,
    open_regular,
    read_regular,
    read_text_head,
)
from fluid_build.cli import _register, cli
from fluid_build.cli.exit_codes import EXIT_CODES
from fluid_build.cli.forge import EXAMPLE_CASSETTE, EXAMPLE_INTENT
from fluid_build.copilot.llm.types import ToolCall
from fluid_build.copilot.loop.tools import ToolOutcome, ToolRegistry
from fluid_build.forge.intent import MAX_INTENT_BYTES, IntentError, load_intent
from fluid_build.forge.workspace_tools import workspace_tools

pytestmark = pytest.mark.skipif(os.name != "posix", reason="FIFOs, devices and sparse files")

_register()

HUGE = 4 << 30  # 4 GiB, sparse: no disk, no time
DEEP = 100_000


def finishes(fn: Callable[[], Any], seconds: float = 10.0) -> Any:
    """Run ``fn`` on a daemon thread and fail (instead of hanging the suite) if it blocks."""
    result: list[Any] = []
    error: list[BaseException] = []

    def target() -> None:
        try:
            result.append(fn())
        except BaseException as exc:
            error.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"{fn} blocked for more than {seconds} s"
    if error:
        raise error[0]
    return result[0]


def make_fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def make_huge(path: Path) -> Path:
    with open(path, "wb") as handle:
        handle.truncate(HUGE)
    return path


def make_char_device(path: Path) -> Path:
    """A character device node (/dev/zero's) inside a test directory; skips without the right."""
    zero = os.stat("/dev/zero")
    try:
        os.mknod(path, stat.S_IFCHR | 0o444, zero.st_rdev)
    except (PermissionError, OSError) as exc:
        pytest.skip(f"cannot create a device node here ({exc.strerror})")
    return path


@pytest.fixture
def unix_socket(tmp_path: Path) -> Iterator[Path]:
    path = Path("/tmp") / f"fluid-test-{os.getpid()}-{time.monotonic_ns()}.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    try:
        yield path
    finally:
        server.close()
        path.unlink(missing_ok=True)


# -- fluid_build._files ---------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "kind"),
    [
        (lambda p: make_fifo(p / "fifo"), "a FIFO (named pipe)"),
        (lambda p: p, "a directory"),
        (lambda p: Path("/dev/zero"), "a character device"),
        (lambda p: Path("/dev/urandom"), "a character device"),
    ],
    ids=["fifo", "directory", "dev-zero", "dev-urandom"],
)
def test_anything_but_a_regular_file_is_refused_at_once(
    tmp_path: Path, make: Callable[[Path], Path], kind: str
) -> None:
    path = make(tmp_path)
    with pytest.raises(NotRegularFileError) as caught:
        finishes(lambda: read_regular(path, limit=10, name="the file"))
    assert caught.value.kind == kind
    assert (
        str(caught.value)
        == f"the file is {kind}, not a regular file; give the path of a regular file"
    )


def test_a_socket_is_refused(unix_socket: Path) -> None:
    with pytest.raises(NotRegularFileError, match="is a socket"):
        finishes(lambda: read_regular(unix_socket, limit=10))


def test_a_fifo_swapped_in_after_the_check_does_not_block_the_open(tmp_path: Path) -> None:
    fifo = make_fifo(tmp_path / "fifo")
    real_stat = os.stat

    def stale_stat(path: Any, **kwargs: Any) -> os.stat_result:
        # What a stat made just before the swap saw: a regular file.
        return real_stat(__file__)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "stat", stale_stat)
        with pytest.raises(NotRegularFileError, match="FIFO"):
            finishes(lambda: open_regular(fifo))


def test_symlinks_are_refused_when_asked(tmp_path: Path) -> None:
    (tmp_path / "real.txt").write_text("x")
    (tmp_path / "link.txt").symlink_to(tmp_path / "real.txt")
    assert read_regular(tmp_path / "link.txt", limit=10) == b"x"
    with pytest.raises(NotRegularFileError, match="symbolic link"):
        read_regular(tmp_path / "link.txt", limit=10, follow_symlinks=False)


def test_size_limit_reads_one_byte_past_it_and_no_more(tmp_path: Path) -> None:
    path = tmp_path / "f.txt"
    path.write_bytes(b"x" * 10)
    assert read_regular(path, limit=10) == b"x" * 10
    with pytest.raises(FileTooLargeError) as caught:
        read_regular(path, limit=9, name="f.txt")
    assert caught.value.limit == 9
    assert "f.txt is larger than 9 bytes" in str(caught.value)


def test_a_huge_sparse_file_is_refused_quickly(tmp_path: Path) -> None:
    huge = make_huge(tmp_path / "huge.yaml")
    started = time.monotonic()
    with pytest.raises(FileTooLargeError, match=r"larger than 1 MiB \(1,048,576 bytes\)"):
        read_regular(huge, limit=1 << 20, name="huge.yaml")
    assert time.monotonic() - started < 2


def test_text_head_reads_at_most_four_bytes_a_character(tmp_path: Path) -> None:
    path = tmp_path / "t.txt"
    path.write_text("é" * 100 + "z", encoding="utf-8")
    fd = os.open(path, os.O_RDONLY)
    try:
        assert read_text_head(fd, 10) == "é" * 10
        assert os.lseek(fd, 0, os.SEEK_CUR) == 40
    finally:
        os.close(fd)


@pytest.mark.parametrize("depth", [MAX_DEPTH, MAX_DEPTH + 1, DEEP])
def test_json_nesting_is_limited(depth: int) -> None:
    text = "[" * depth + "]" * depth
    if depth <= MAX_DEPTH:
        assert load_json(text, name="x") is not None
        return
    with pytest.raises(TooDeepError, match=f"x nests deeper than {MAX_DEPTH} levels"):
        load_json(text, name="x")


def test_json_brackets_inside_strings_do_not_count() -> None:
    text = json.dumps({"a": "[" * 1000, "b": '\\"{{{{', "c": [[["]]]]]"]]]})
    assert load_json(text, name="x")["a"] == "[" * 1000
    with pytest.raises(json.JSONDecodeError):
        load_json('{"a": ', name="x")


@pytest.mark.parametrize(
    "text",
    [
        "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1),
        "[" * DEEP,  # not even closed: stopped long before the parser reaches the end
        "a:\n" + "".join(f"{'  ' * i}- k{i}:\n" for i in range(1, 80)) + "    x\n",
        "{a: " * DEEP,
    ],
    ids=["flow", "unclosed", "block", "mapping"],
)
def test_yaml_nesting_is_limited(text: str) -> None:
    with pytest.raises(TooDeepError, match=f"nests deeper than {MAX_DEPTH} levels"):
        finishes(lambda: load_yaml(text, name="x"))


def test_yaml_aliases_count_at_their_full_depth() -> None:
    lines = ["a0: &a0 " + "[" * 30 + "]" * 30]
    lines += [f"a{i}: &a{i} " + "[" * 30 + f"*a{i - 1}" + "]" * 30 for i in range(1, 4)]
    with pytest.raises(TooDeepError):
        load_yaml("\n".join(lines), name="x")
    with pytest.raises(TooDeepError, match="refers to itself"):
        load_yaml("a: &a [*a]", name="x")
    shared = load_yaml("a: &x [1, 2]\nb: *x\nc: {k: *x}", name="x")
    assert shared == {"a": [1, 2], "b": [1, 2], "c": {"k": [1, 2]}}
    assert load_yaml("[" * MAX_DEPTH + "]" * MAX_DEPTH, name="x") is not None


def test_yaml_errors_stay_yaml_errors() -> None:
    with pytest.raises(yaml.YAMLError):
        load_yaml("a: [1, 2", name="x")


# -- the intent loader ----------------------------------------------------------

_INTENT_CASES: dict[str, tuple[Callable[[Path], Path], str]] = {
    "fifo": (lambda p: make_fifo(p / "intent.yaml"), "is a FIFO (named pipe), not a regular file"),
    "dev-zero": (lambda p: Path("/dev/zero"), "is a character device, not a regular file"),
    "dev-urandom": (lambda p: Path("/dev/urandom"), "is a character device, not a regular file"),
    "directory": (lambda p: p, "is a directory, not a regular file"),
    "huge": (
        lambda p: make_huge(p / "intent.yaml"),
        f"is larger than 1 MB ({MAX_INTENT_BYTES:,} bytes)",
    ),
    "deep-yaml": (
        lambda p: write(p / "intent.yaml", "data_product: " + "[" * DEEP),
        f"nests deeper than {MAX_DEPTH} levels (at line 1)",
    ),
    "deep-json": (
        lambda p: write(p / "intent.json", "[" * DEEP + "]" * DEEP),
        f"nests deeper than {MAX_DEPTH} levels (at line 1)",
    ),
    "self-reference": (
        lambda p: write(p / "intent.yaml", "data_product: &d {owner: *d}\n"),
        "refers to itself through a YAML alias",
    ),
}


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.mark.parametrize("case", sorted(_INTENT_CASES))
def test_the_intent_loader_refuses_hostile_files(tmp_path: Path, case: str) -> None:
    make, fragment = _INTENT_CASES[case]
    path = make(tmp_path)
    with pytest.raises(IntentError) as caught:
        finishes(lambda: load_intent(path))
    message = str(caught.value)
    assert message.startswith(f"the intent file {path} ")
    assert fragment in message


@pytest.mark.parametrize("case", sorted(_INTENT_CASES))
def test_fluid_forge_exits_intent_invalid_on_hostile_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FLUID_HOME", str(tmp_path / "home"))
    (tmp_path / "in").mkdir()
    make, fragment = _INTENT_CASES[case]
    path = make(tmp_path / "in")
    argv = ["forge", str(path), "--replay", str(EXAMPLE_CASSETTE), "--json"]
    result = finishes(lambda: CliRunner().invoke(cli, argv))
    assert not (tmp_path / "forge-out").exists()
    if case == "directory":  # click refuses it first (dir_okay=False): a usage error
        assert result.exit_code == EXIT_CODES["usage"], result.output
        return
    assert result.exit_code == EXIT_CODES["intent"], result.output
    payload = json.loads(result.stdout.strip().splitlines()[-1])
    assert payload["error"]["error"] == "IntentError"
    assert fragment in payload["error"]["message"]
    assert "RecursionError" not in result.output


def test_a_good_intent_still_loads() -> None:
    assert load_intent(EXAMPLE_INTENT).data_product.name == "sales_orders"


# -- the workspace tools ----------------------------------------------------------


def run_tool(root: Path, name: str, **arguments: Any) -> ToolOutcome:
    with ToolRegistry(workspace_tools(), workspace=root) as registry:
        return finishes(lambda: registry.run(ToolCall(id="c", name=name, arguments=arguments)))


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    (root / "schema.sql").write_text("select 1")
    return root


@pytest.mark.parametrize(
    ("make", "exception"),
    [
        (lambda root: make_fifo(root / "pipe.sql"), "NotRegularFileError"),
        (lambda root: make_char_device(root / "zero.sql"), "NotRegularFileError"),
        (lambda root: (root / "folder.sql").mkdir() or root / "folder.sql", "NotRegularFileError"),
    ],
    ids=["fifo", "device", "directory"],
)
def test_read_sample_schema_refuses_what_is_not_a_regular_file(
    workspace: Path, make: Callable[[Path], Path], exception: str
) -> None:
    path = make(workspace)
    outcome = run_tool(workspace, "read_sample_schema", path=path.name)
    assert outcome.error is not None
    assert outcome.error.code == "tool.execution_error"
    assert outcome.error.details["exception"] == exception
    assert "not a regular file" in str(outcome.exception)
    assert str(outcome.exception).startswith(path.name)  # named relative to the workspace


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_read_sample_schema_never_reaches_a_device_through_a_link(
    workspace: Path, device: str
) -> None:
    (workspace / "dev.sql").symlink_to(device)
    outcome = run_tool(workspace, "read_sample_schema", path="dev.sql")
    assert outcome.error is not None
    assert outcome.error.code == "tool.workspace_violation"


def test_read_sample_schema_reads_the_head_of_a_huge_file(workspace: Path) -> None:
    make_huge(workspace / "huge.csv")
    started = time.monotonic()
    outcome = run_tool(workspace, "read_sample_schema", path="huge.csv", max_chars=1000)
    assert outcome.value == "\x00" * 1000
    assert time.monotonic() - started < 2


def test_read_sample_schema_returns_deep_text_as_text(workspace: Path) -> None:
    (workspace / "deep.json").write_text("[" * DEEP)
    outcome = run_tool(workspace, "read_sample_schema", path="deep.json", max_chars=50)
    assert outcome.value == "[" * 50


def test_read_sample_schema_caps_max_chars(workspace: Path) -> None:
    outcome = run_tool(workspace, "read_sample_schema", path="schema.sql", max_chars=10**12)
    assert outcome.error is not None
    assert outcome.error.code == "tool.invalid_input"


def test_discover_workspace_lists_regular_files_only(workspace: Path) -> None:
    make_fifo(workspace / "pipe.sql")
    make_huge(workspace / "huge.csv")
    (workspace / "sub").mkdir()
    (workspace / "sub" / "b.yaml").write_text("b: 1")
    (workspace / "sub" / "link.sql").symlink_to(workspace / "schema.sql")
    (workspace / "linked_dir").symlink_to(workspace / "sub")
    (workspace / ".git").mkdir()
    (workspace / ".git" / "config").write_text("x")
    outcome = run_tool(workspace, "discover_workspace")
    assert outcome.value == ["huge.csv", "schema.sql", "sub/b.yaml"]
    assert run_tool(workspace, "discover_workspace", directory="sub").value == ["b.yaml"]
    assert run_tool(workspace, "discover_workspace", max_entries=1).value == ["huge.csv"]


# -- memory stays bounded ---------------------------------------------------------

_RSS_SCRIPT = """
import json, resource, sys
from pathlib import Path
from fluid_build.copilot.loop.tools import ToolRegistry
from fluid_build.copilot.llm.types import ToolCall
from fluid_build.forge.intent import IntentError, load_intent
from fluid_build.forge.workspace_tools import workspace_tools

root = Path(sys.argv[1])
registry = ToolRegistry(workspace_tools(), workspace=root)

def read(name, chars):
    call = ToolCall(id="c", name="read_sample_schema", arguments={"path": name, "max_chars": chars})
    return registry.run(call)

def intent(name):
    try:
        load_intent(root / name)
    except IntentError as exc:
        return str(exc)

def peak_kib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

read("small.csv", 1000), intent("small.yaml")  # warm up: imports, threads, caches
before = peak_kib()
value = read("huge.csv", 1000).value
refusal = intent("huge.csv")
deep = intent("deep.yaml")
after = peak_kib()
print(json.dumps({
    "growth_kib": after - before, "chars": len(value), "refusal": refusal, "deep": deep,
}))
"""


def test_memory_stays_bounded_on_a_4_gib_file(tmp_path: Path) -> None:
    """Peak RSS growth of a fresh process reading a 4 GiB file (sparse) stays under 64 MB."""
    root = tmp_path / "ws"
    root.mkdir()
    make_huge(root / "huge.csv")
    (root / "small.csv").write_text("a,b\n1,2\n")
    (root / "small.yaml").write_text("- not an intent\n")
    (root / "deep.yaml").write_text("[" * (MAX_INTENT_BYTES - 1))
    done = subprocess.run(
        [sys.executable, "-c", _RSS_SCRIPT, str(root)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["chars"] == 1000
    assert "larger than 1 MB" in report["refusal"]
    assert "nests deeper than 64 levels" in report["deep"]
    assert report["growth_kib"] < 64 * 1024, report


# -- the stored configuration (ai_config.json) ------------------------------------------------

_CONFIG_FILES: dict[str, tuple[Callable[[Path], object], str]] = {
    "fifo": (make_fifo, "is not a regular file (it is a FIFO"),
    "directory": (lambda p: p.mkdir(), "is not a regular file (it is a directory"),
    "deep": (
        lambda p: p.write_text("[" * 10_000 + "]" * 10_000, encoding="utf-8"),  # under 64 KiB
        "is nested deeper than",
    ),
    "huge": (make_huge, "is larger than"),
}


@pytest.mark.parametrize("case", sorted(_CONFIG_FILES))
def test_a_hostile_stored_configuration_is_ignored_with_a_reason(tmp_path: Path, case: str) -> None:
    from fluid_build.aiconfig import load_ai_config

    make, problem = _CONFIG_FILES[case]
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    make(home / "ai_config.json")
    config = finishes(lambda: load_ai_config({"FLUID_HOME": str(home)}))
    assert config.provider is None
    assert any(problem in p for p in config.problems), config.problems


# -- writing to user paths ----------------------------------------------------------------


def test_an_output_error_pickles_with_where_the_data_went() -> None:
    import pickle

    from fluid_build._files import OutputPathError

    error = OutputPathError("out.jsonl", "could not be written (x)", "do y", saved_to="/tmp/s")
    again = pickle.loads(pickle.dumps(error))  # noqa: S301 - our own bytes
    assert (type(again), str(again), again.hint, again.saved_to) == (
        OutputPathError,
        "out.jsonl could not be written (x)",
        "do y",
        "/tmp/s",
    )
    assert again.to_dict()["saved_to"] == "/tmp/s"


def test_what_an_output_file_is_decides_how_it_is_written(tmp_path: Path) -> None:
    from fluid_build._files import OutputFile, check_output_file

    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "real").write_text("old")
    (tmp_path / "link").symlink_to("real")
    (tmp_path / "to-nothing").symlink_to("absent")
    assert check_output_file(tmp_path / "fifo") == OutputFile(str(tmp_path / "fifo"), True)
    assert check_output_file("/dev/null") == OutputFile("/dev/null", True)
    assert check_output_file(tmp_path / "new") == OutputFile(str(tmp_path / "new"), False)
    assert check_output_file(tmp_path / "link") == OutputFile(str(tmp_path / "real"), False)
    assert check_output_file(tmp_path / "to-nothing").path == str(tmp_path / "absent")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo", "link", "real", "to-nothing"]


@pytest.mark.parametrize(
    ("where", "says"),
    [
        ("adir", "is a directory"),
        ("asocket", "is a socket"),
        ("afile/x", "cannot be written: {tmp}/afile is not a directory"),
        ("gone/x", "cannot be written: {tmp}/gone does not exist"),
    ],
)
def test_an_output_file_that_cannot_be_written_is_refused(
    tmp_path: Path, where: str, says: str
) -> None:
    from fluid_build._files import OutputPathError, check_output_file

    (tmp_path / "adir").mkdir()
    (tmp_path / "afile").write_text("x")
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(tmp_path / "asocket"))
        with pytest.raises(OutputPathError) as caught:
            check_output_file(tmp_path / where, name=where)
    assert str(caught.value) == f"{where} {says.format(tmp=tmp_path)}"


def test_an_output_directory_is_checked_by_making_one(tmp_path: Path) -> None:
    from fluid_build._files import OutputPathError, check_output_dir

    check_output_dir(tmp_path / "a" / "b" / "c")  # creatable: fine, and nothing is made
    check_output_dir(tmp_path)
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "afile").write_text("x")
    with pytest.raises(OutputPathError, match="afile is not a directory"):
        check_output_dir(tmp_path / "afile" / "deeper" / "out")
    with pytest.raises(OutputPathError, match="is a regular file, not a directory"):
        check_output_dir(tmp_path / "afile")
    with pytest.raises(OutputPathError, match="no directory can be made in /proc"):
        check_output_dir("/proc/nope/out")


def test_a_stream_shares_standard_output_when_it_is_standard_output(tmp_path: Path) -> None:
    """In a child whose stdout is a file, /dev/stdout is written at stdout's own offset."""
    code = (
        "import sys; from fluid_build._files import OutputFile, open_output, write_all;"
        "print('before', flush=True);"
        "fd = open_output(OutputFile('/dev/stdout', True)); write_all(fd, b'lines\\n');"
        "print('after', flush=True)"
    )
    with open(tmp_path / "out.txt", "wb") as stdout:
        subprocess.run([sys.executable, "-c", code], stdout=stdout, check=True, timeout=60)
    assert (tmp_path / "out.txt").read_text() == "before\nlines\nafter\n"


def test_save_aside_keeps_the_bytes_in_a_private_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fluid_build._files import save_aside

    monkeypatch.chdir(tmp_path)
    saved = save_aside(b"kept\n", prefix="fluid-batch-", suffix=".jsonl")
    assert saved is not None
    assert Path(saved).parent == tmp_path
    assert Path(saved).read_bytes() == b"kept\n"
    assert stat.S_IMODE(os.stat(saved).st_mode) == 0o600
