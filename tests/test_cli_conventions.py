"""What every `fluid` command does alike, from the console script in a fresh HOME.

Ctrl-C (a real SIGINT, mid-request, mid-wait and at the key prompt), the
version flags, shell completion, color (``--color``, ``FLUID_COLOR``,
``NO_COLOR``, ``FORCE_COLOR``, at a terminal and in a pipe), no hard wrapping
in a pipe, and each warning once per run.
"""

from __future__ import annotations

import logging
import os
import queue
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import click
import pytest

import fluid_build
from fluid_build.cli import EXIT_INTERRUPTED, main
from fluid_build.cli._console import color_mode, make_console, set_color_mode, warnings_once
from fluid_build.cli.forge import EXAMPLE_INTENT
from tests.loopback import hold, read_request, respond, serve

FLUID = shutil.which("fluid", path=os.path.dirname(sys.executable)) or shutil.which("fluid")
SGR = re.compile(r"\x1b\[[0-9;]*m")

# Run the console script with SIGINT at its default disposition, whatever the test
# runner's is (a background job inherits SIGINT ignored); exec keeps the same process.
_DEFAULT_SIGINT = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execv(sys.argv[1], sys.argv[1:])"
)
# A terminal for the console script: a pty, with its output copied to our stdout and
# our stdin to it (so b"\x03" written there is a Ctrl-C typed at that terminal).
_AT_A_TERMINAL = (
    "import os, pty, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "sys.exit(os.waitstatus_to_exitcode(pty.spawn(sys.argv[1:])))"
)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    path = tmp_path / "home"
    path.mkdir()
    return path


def fresh_env(home: Path, **extra: str) -> dict[str, str]:
    """A new user's environment: this HOME, no provider, color or width setting."""
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "LANG": "C.UTF-8",
        "TIKTOKEN_CACHE_DIR": str(home / ".cache" / "tiktoken"),
    }
    env.update(extra)
    return env


def fluid(
    home: Path, *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    assert FLUID is not None, "the fluid console script is not installed"
    return subprocess.run(
        [FLUID, *args],
        env=env if env is not None else fresh_env(home),
        cwd=cwd or home,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _reader(stream: IO[str]) -> queue.Queue[str | None]:
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        for line in stream:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return lines


def _until(lines: queue.Queue[str | None], pattern: str, seen: list[str]) -> None:
    """Collect lines into ``seen`` until one holds ``pattern`` (at most 60 s)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=0.1)
        except queue.Empty:
            continue
        if line is None:
            raise AssertionError(f"ended before {pattern!r}:\n{''.join(seen)}")
        seen.append(line)
        if pattern in line:
            return
    raise AssertionError(f"no {pattern!r} within 60 s:\n{''.join(seen)}")


def _rest(lines: queue.Queue[str | None], seen: list[str]) -> str:
    while (line := lines.get(timeout=30)) is not None:
        seen.append(line)
    return "".join(seen)


def _files_under(*roots: Path) -> list[Path]:
    return sorted(p for root in roots if root.exists() for p in root.rglob("*") if p.is_file())


def _start_forge(home: Path, url: str, out: Path) -> subprocess.Popen[str]:
    assert FLUID is not None
    intent = home / "intent.yaml"
    shutil.copy(EXAMPLE_INTENT, intent)
    env = fresh_env(
        home,
        FLUID_LLM_PROVIDER="openai_compatible",
        OPENAI_BASE_URL=f"{url}/v1",
        FLUID_LLM_MODEL="local-model",
        FLUID_QUIET="1",
    )
    return subprocess.Popen(
        [sys.executable, "-c", _DEFAULT_SIGINT, FLUID, "forge", str(intent), "--out", str(out)],
        cwd=home,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _assert_interrupted(proc: subprocess.Popen[str], stderr: str) -> None:
    assert proc.returncode == EXIT_INTERRUPTED, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert lines[-1] == "fluid: interrupted", stderr
    assert stderr.count("fluid: interrupted") == 1
    assert "Traceback" not in stderr
    assert "Aborted" not in stderr


# -- Ctrl-C ---------------------------------------------------------------------------


def test_ctrl_c_during_a_request_that_stalls_exits_130_with_one_line(home: Path) -> None:
    arrived = threading.Event()

    def stall(conn: socket.socket) -> None:
        request = read_request(conn)
        if not request.startswith(b"POST"):  # the local server's context probe: no answer
            conn.sendall(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
            return
        arrived.set()  # the plan's request: the run is under way
        hold(conn)

    out = home / "out"
    with serve(stall) as url:
        proc = _start_forge(home, url, out)
        assert proc.stderr is not None
        assert proc.stdout is not None
        lines = _reader(proc.stderr)
        assert arrived.wait(60), "the forge never sent its request"
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
        stderr = _rest(lines, [])
        assert proc.stdout.read() == ""
        proc.stdout.close()
        proc.stderr.close()
    _assert_interrupted(proc, stderr)
    assert "stage plan" in stderr  # it was mid-run, not at start-up
    assert _files_under(out) == []
    assert [p for p in _files_under(home) if p.name.endswith(".tmp")] == []


def test_ctrl_c_during_a_countdown_wait_ends_it_at_once(home: Path) -> None:
    body = b'{"error": {"message": "Rate limit reached", "type": "rate_limit_error"}}'
    answer = respond(429, body, {"retry-after": "30", "content-type": "application/json"})
    out = home / "out"
    with serve(answer) as url:
        proc = _start_forge(home, url, out)
        assert proc.stderr is not None
        assert proc.stdout is not None
        lines = _reader(proc.stderr)
        seen: list[str] = []
        _until(lines, "wait 30.0 s", seen)
        interrupted_at = time.monotonic()
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
        took = time.monotonic() - interrupted_at
        stderr = _rest(lines, seen)
        proc.stdout.close()
        proc.stderr.close()
    _assert_interrupted(proc, stderr)
    assert took < 15, f"the 30 s wait went on after Ctrl-C ({took:.1f} s)"
    assert _files_under(out) == []


def _at_a_terminal(
    home: Path, *args: str, env: dict[str, str], stdin: bytes = b""
) -> subprocess.CompletedProcess[bytes]:
    assert FLUID is not None
    return subprocess.run(
        [sys.executable, "-c", _AT_A_TERMINAL, FLUID, *args],
        input=stdin,
        env=env,
        cwd=home,
        capture_output=True,
        timeout=120,
        check=False,
    )


def test_ctrl_c_at_the_hidden_key_prompt_stores_nothing(home: Path) -> None:
    assert FLUID is not None
    # A keyring that could store the key: with none, setup refuses before it asks at all.
    env = fresh_env(
        home,
        PYTHON_KEYRING_BACKEND="tests.file_keyring.FileKeyring",
        PYTHONPATH=str(Path(__file__).resolve().parents[1]),
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", _AT_A_TERMINAL, FLUID, "ai", "setup", "--provider", "openai"],
        env=env,
        cwd=home,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdin is not None
    assert proc.stdout is not None
    seen = b""
    deadline = time.monotonic() + 60
    while b"(input hidden)" not in seen and time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.1)
        if not ready:
            continue
        chunk = os.read(proc.stdout.fileno(), 4096)
        if not chunk:
            break
        seen += chunk
    assert b"(input hidden)" in seen, seen
    proc.stdin.write(b"\x03")  # Ctrl-C, typed at that terminal
    proc.stdin.flush()
    rest, _ = proc.communicate(timeout=60)
    text = (seen + rest).decode("utf-8", "replace")
    assert proc.returncode == EXIT_INTERRUPTED, text
    assert "fluid: interrupted" in text
    assert "Traceback" not in text
    assert "Aborted" not in text
    assert _files_under(home / ".config") == []
    assert not (home / "test-keyring.json").exists()


@pytest.mark.parametrize("where", ["fsync", "replace"])
def test_ctrl_c_while_forge_writes_leaves_no_temporary_file(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    where: str,
) -> None:
    """Interrupted while staging the files (fsync) or renaming them in (replace)."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "home" / ".config"))
    real = getattr(os, where)
    calls = 0

    def interrupted_second_time(*args: object, **kwargs: object) -> object:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(os, where, interrupted_second_time)
    out = tmp_path / "out"
    assert main(["forge", "--out", str(out)]) == EXIT_INTERRUPTED
    assert calls >= 2
    assert capsys.readouterr().err.strip().endswith("fluid: interrupted")
    assert [p for p in _files_under(out) if p.name.endswith(".tmp")] == []


def test_interrupted_is_130_in_process_too(monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(fluid_build.cli.cli, "main", interrupted)
    assert main(["doctor"]) == EXIT_INTERRUPTED


# -- version, completion --------------------------------------------------------------


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_the_version_flags(home: Path, flag: str) -> None:
    done = fluid(home, flag)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"fluid {fluid_build.__version__}\n"


def test_bash_completion_completes_commands_options_and_values(home: Path) -> None:
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("bash is not installed")
    assert FLUID is not None
    script = fluid(home, "completion", "bash")
    assert script.returncode == 0, script.stderr
    assert "_FLUID_COMPLETE=bash_complete" in script.stdout

    def complete(*words: str) -> list[str]:
        program = (
            'eval "$(fluid completion bash)"; '
            f"COMP_WORDS=({' '.join(repr(w) for w in words)}); "
            f"COMP_CWORD={len(words) - 1}; _fluid_completion fluid; "
            'printf "%s\\n" "${COMPREPLY[@]}"'
        )
        env = fresh_env(home)
        env["PATH"] = os.pathsep.join([os.path.dirname(FLUID), env["PATH"]])
        done = subprocess.run(
            [bash, "-c", program], env=env, capture_output=True, text=True, timeout=60, check=False
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.split()

    assert complete("fluid", "do") == ["doctor"]
    assert complete("fluid", "--color", "") == ["auto", "always", "never"]
    assert "--provider" in complete("fluid", "ai", "setup", "--pro")
    assert complete("fluid", "completion", "") == ["bash", "zsh", "fish"]


@pytest.mark.parametrize(
    ("shell", "marker"),
    [("zsh", "#compdef fluid"), ("fish", "complete --no-files --command fluid")],
)
def test_zsh_and_fish_completion_scripts(home: Path, shell: str, marker: str) -> None:
    done = fluid(home, "completion", shell)
    assert done.returncode == 0, done.stderr
    assert marker in done.stdout
    assert f"_FLUID_COMPLETE={shell}_complete" in done.stdout
    program = shutil.which(shell)
    if program is not None:  # a syntax check where the shell is installed
        checked = subprocess.run(
            [program, "-n"], input=done.stdout, capture_output=True, text=True, timeout=60
        )
        assert checked.returncode == 0, checked.stderr
    # What the script asks the console script, answered as the shell would see it.
    env = fresh_env(home, _FLUID_COMPLETE=f"{shell}_complete", COMP_WORDS="fluid --co")
    env["COMP_CWORD"] = "--co" if shell == "fish" else "1"
    answered = fluid(home, env=env)
    assert answered.returncode == 0, answered.stderr
    assert "--color" in answered.stdout


def test_an_unknown_shell_is_a_usage_error(home: Path) -> None:
    done = fluid(home, "completion", "tcsh")
    assert done.returncode == 2
    assert "'tcsh' is not one of 'bash', 'zsh', 'fish'" in done.stderr


# -- color and width ------------------------------------------------------------------


LONG = "a-directory-name-long-enough-to-wrap-" * 5


@pytest.mark.parametrize(
    ("args", "extra", "colored"),
    [
        ((), {}, False),  # auto, in a pipe
        (("--color", "always"), {}, True),
        (("--color", "always"), {"NO_COLOR": "1"}, True),  # the flag beats NO_COLOR
        ((), {"FLUID_COLOR": "always"}, True),
        ((), {"FLUID_COLOR": "always", "NO_COLOR": "1"}, True),  # ours beats the general one
        ((), {"FORCE_COLOR": "1"}, True),
        ((), {"FORCE_COLOR": "1", "NO_COLOR": "1"}, False),
        (("--color", "never"), {"FORCE_COLOR": "1"}, False),
        (("--color", "never"), {"FLUID_COLOR": "always"}, False),
        ((), {"NO_COLOR": ""}, False),  # empty is unset (no-color.org)
    ],
)
def test_color_in_a_pipe(
    home: Path, args: tuple[str, ...], extra: dict[str, str], colored: bool
) -> None:
    done = fluid(home, *args, "doctor", env=fresh_env(home, **extra))
    assert done.returncode == 0, done.stderr
    assert bool(SGR.search(done.stdout)) is colored, done.stdout[:400]
    assert "\x1b[?" not in done.stdout  # never cursor or screen control in a pipe
    assert "LLM providers" in SGR.sub("", done.stdout)


@pytest.mark.parametrize(
    ("args", "extra", "colored"),
    [
        ((), {}, True),  # auto, at a terminal
        ((), {"NO_COLOR": "1"}, False),
        (("--color", "never"), {}, False),
        ((), {"FLUID_COLOR": "never"}, False),
        (("--color", "always"), {"NO_COLOR": "1"}, True),
    ],
)
def test_color_at_a_terminal(
    home: Path, args: tuple[str, ...], extra: dict[str, str], colored: bool
) -> None:
    env = fresh_env(home, TERM="xterm-256color", **extra)
    done = _at_a_terminal(home, *args, "doctor", env=env)
    text = done.stdout.decode("utf-8", "replace")
    assert done.returncode == 0, text
    assert "LLM providers" in text
    assert bool(SGR.search(text)) is colored, text[:400]


def test_a_bad_fluid_color_warns_once_and_colors_as_auto(home: Path) -> None:
    done = fluid(home, "doctor", env=fresh_env(home, FLUID_COLOR="sometimes"))
    assert done.returncode == 0
    assert not SGR.search(done.stdout)
    warning = "warning: FLUID_COLOR='sometimes' is not auto, always or never; ignoring it"
    assert done.stderr.count(warning) == 1, done.stderr


@pytest.mark.parametrize("columns", [None, "40"])
def test_piped_output_is_never_hard_wrapped(
    home: Path, tmp_path: Path, columns: str | None
) -> None:
    deep = tmp_path / LONG
    extra = {"FLUID_HOME": str(deep / "fluid")}
    if columns:
        extra["COLUMNS"] = columns  # honoured at a terminal only
    done = fluid(home, "doctor", env=fresh_env(home, **extra))
    assert done.returncode == 0, done.stderr
    whole = f"  config file: {deep / 'fluid' / 'ai_config.json'} (FLUID_HOME)"
    assert whole in done.stdout.splitlines(), done.stdout
    # The forge's messages on stderr too: each is one line, however long.
    out = deep / "out"
    forged = fluid(home, "forge", "--out", str(out), env=fresh_env(home, **extra))
    assert forged.returncode == 0, forged.stderr
    lines = forged.stderr.splitlines()
    notice = next(line for line in lines if "No API key found" in line)
    assert notice.endswith("to forge your own intent."), forged.stderr
    assert any(line.startswith("done: wrote") and f"to {out}/ (" in line for line in lines), lines
    assert f"  {out / 'contract.fluid.yaml'}" in lines, lines


def test_the_console_factory_follows_the_flag_then_the_environment() -> None:
    assert color_mode({}) == "auto"
    assert color_mode({"NO_COLOR": "1"}) == "never"
    assert color_mode({"FLUID_COLOR": " ALWAYS "}) == "always"
    with click.Context(click.Command("x")) as ctx:
        set_color_mode(ctx, "never")
        assert color_mode({"FLUID_COLOR": "always", "FORCE_COLOR": "1"}) == "never"
        console = make_console(env={})
        assert console.color_system is None
    piped = make_console(env={"FORCE_COLOR": "1", "TTY_COMPATIBLE": "1"})
    assert piped.is_terminal is False  # a pipe stays a pipe: no spinner, no 80 columns
    assert piped.color_system == "standard"
    assert piped.width > 10_000


# -- each warning once per run ----------------------------------------------------------


def test_a_warning_logged_many_times_in_a_run_prints_once(
    capsys: pytest.CaptureFixture[str],
) -> None:
    log = logging.getLogger("tests.conventions")
    with warnings_once():
        for _ in range(3):
            log.warning("FLUID_X=%r is odd", "y")
        log.error("a different one")
    assert capsys.readouterr().err == "warning: FLUID_X='y' is odd\nerror: a different one\n"
    with warnings_once():  # a new run says it again
        log.warning("FLUID_X=%r is odd", "y")
    assert capsys.readouterr().err == "warning: FLUID_X='y' is odd\n"


def test_ai_check_prints_each_configuration_warning_once(home: Path) -> None:
    models = respond(200, b'{"data": [{"id": "m"}]}', {"content-type": "application/json"})
    with serve(models) as url:
        env = fresh_env(
            home,
            FLUID_LLM_PROVIDER="openai_compatible",
            OPENAI_BASE_URL=f"{url}/v1",
            FLUID_LLM_MODEL="m",
            FLUID_LLM_TIMEOUT_SECONDS="soon",
            FLUID_LLM_MAX_ATTEMPTS="many",
            FLUID_COOLDOWN_URL="sqlite://",
        )
        done = fluid(home, "ai", "setup", "--check", env=env)
    assert done.returncode == 0, done.stderr
    assert "openai_compatible: server answered (1 models visible)" in done.stdout
    for variable in ("FLUID_LLM_TIMEOUT_SECONDS", "FLUID_LLM_MAX_ATTEMPTS", "FLUID_COOLDOWN_URL"):
        assert done.stderr.count(f"warning: {variable}=") == 1, done.stderr


def test_doctor_prints_each_environment_warning_once(home: Path) -> None:
    env = fresh_env(
        home,
        OPENAI_API_KEY="sk-conventions-0123456789abcdef",
        FLUID_LLM_TIMEOUT_SECONDS="soon",
        FLUID_COOLDOWN_URL="sqlite://",
        FLUID_BREAKER_THRESHOLD="lots",
    )
    done = fluid(home, "doctor", env=env)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    for variable in ("FLUID_LLM_TIMEOUT_SECONDS", "FLUID_COOLDOWN_URL", "FLUID_BREAKER_THRESHOLD"):
        assert done.stdout.count(f"config warning: {variable}=") == 1, done.stdout


@pytest.fixture(autouse=True)
def _no_leftover_handlers() -> Iterator[None]:
    before = list(logging.getLogger().handlers)
    yield
    assert logging.getLogger().handlers == before
